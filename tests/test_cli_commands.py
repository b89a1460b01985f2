"""The `gradcompiler` command line, and the compile progress hook it shows."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pydot
import pytest

import gradcompiler as gc
from gradcompiler import cli
from gradcompiler import dot as dot_module
from gradcompiler.progress import MIN_KERNELS_FOR_BAR, compile_progress

BUILD_FILE = textwrap.dedent("""
    import gradcompiler as gc

    def build():
        with gc.Graph("tiny") as g:
            x = gc.input("x", (4, 3))
            w = gc.param("w", (3, 2))
            loss = gc.tanh(x @ w).sum()
        return [loss, gc.grad(loss, w)]

    def only_forward():
        with gc.Graph("fwd") as g:
            return gc.exp(gc.input("x", (2,)))
""")


@pytest.fixture
def build_file(tmp_path):
    path = tmp_path / "model.py"
    path.write_text(BUILD_FILE, encoding="utf-8")
    return path


def parse(text: str) -> pydot.Dot:
    graphs = pydot.graph_from_dot_data(text)
    assert graphs is not None and len(graphs) == 1
    return graphs[0]


def test_dot_command_writes_a_dot_file_with_both_stages(build_file, tmp_path, capsys):
    out = tmp_path / "model.dot"
    assert cli.main(["dot", str(build_file), "--stage", "backward", "-o", str(out)]) == 0
    parsed = parse(out.read_text(encoding="utf-8"))
    assert {s.get_name() for s in parsed.get_subgraphs()} == {"cluster_forward", "cluster_backward"}
    # tanh(x @ w).sum() and its gradient wrt w: x, w, matmul, tanh, sum in the forward.
    forward = parsed.get_subgraph("cluster_forward")[0]
    assert len(forward.get_nodes()) == 5
    assert str(out) in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's `dot` program (a system package, "
                    "not pip's) is not on PATH; .ci/run installs it, so CI runs this test")
def test_dot_command_renders_svg_with_graphviz(build_file, tmp_path):
    """The rendering path itself (.ci/run installs Graphviz so it runs in CI): an SVG that
    draws the graph's ops, and no .dot left beside it."""
    out = tmp_path / "model.svg"
    assert cli.main(["dot", str(build_file), "--stage", "backward", "-o", str(out)]) == 0
    svg = out.read_text(encoding="utf-8")
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg
    assert "MatrixMul" in svg and "Elemwise TANH" in svg
    assert not (tmp_path / "model.dot").exists()


def test_dot_command_forward_stage_and_another_function_to_stdout(build_file, capsys):
    assert cli.main(["dot", str(build_file), "--function", "only_forward", "--stage", "forward"]) == 0
    parsed = parse(capsys.readouterr().out)
    forward = parsed.get_subgraph("cluster_forward")[0]
    labels = sorted(n.get("label") for n in forward.get_nodes())
    assert labels == ['"%0 \'x\'\\nPlaceholder (input)\\nfloat32[2]"', '"%1\\nElemwise EXP\\nfloat32[2]"']


def test_dot_command_without_graphviz_says_how_to_install_and_writes_dot(build_file, tmp_path,
                                                                         capsys, monkeypatch):
    monkeypatch.setattr(dot_module.shutil, "which", lambda program: None)
    out = tmp_path / "model.svg"
    assert cli.main(["dot", str(build_file), "-o", str(out)]) == 1
    assert "install graphviz" in capsys.readouterr().err.lower()
    assert not out.exists()
    parse((tmp_path / "model.dot").read_text(encoding="utf-8"))


def test_dot_command_reports_a_missing_file_or_function(build_file, tmp_path, capsys):
    assert cli.main(["dot", str(tmp_path / "absent.py")]) == 2
    assert "no such file" in capsys.readouterr().err
    assert cli.main(["dot", str(build_file), "--function", "nothing_here"]) == 2
    assert "defines no function nothing_here()" in capsys.readouterr().err


def test_dot_command_reports_a_build_error_without_a_traceback(tmp_path, capsys):
    path = tmp_path / "broken.py"
    path.write_text(textwrap.dedent("""
        import gradcompiler as gc
        def build():
            with gc.Graph("bad"):
                return gc.input("a", (2, 3)) @ gc.input("b", (4, 5))
    """), encoding="utf-8")
    assert cli.main(["dot", str(path)]) == 1
    err = capsys.readouterr().err
    assert "MatrixMul" in err and "broken.py" in err and "Traceback" not in err


NOT_A_GRAPH = textwrap.dedent("""
    import numpy as np
    import gradcompiler as gc

    def array():
        return np.zeros(3)

    def nothing():
        pass

    def mixed():
        with gc.Graph("mixed"):
            return [gc.input("x", (2,)), 3]
""")


@pytest.mark.parametrize("function, returned", [
    ("array", "array([0., 0., 0.]) (of type ndarray)"), ("nothing", "None"),
    ("mixed", "a list whose item 1 is 3 (of type int)")])
def test_dot_command_names_what_a_build_function_returned_instead_of_a_graph(
        tmp_path, capsys, function, returned):
    path = tmp_path / "not_a_graph.py"
    path.write_text(NOT_A_GRAPH, encoding="utf-8")
    for stage in ("backward", "optimised"):  # refused before anything is compiled
        assert cli.main(["dot", str(path), "--function", function, "--stage", stage]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"gradcompiler dot: {path}: {function}() returned {returned}; ")
        assert len(err.splitlines()) == 1


def test_unknown_command_and_stage_are_usage_errors(build_file, capsys):
    with pytest.raises(SystemExit) as exited:
        cli.main(["draw"])
    assert exited.value.code == 2
    with pytest.raises(SystemExit) as exited:
        cli.main(["dot", str(build_file), "--stage", "fused"])
    assert exited.value.code == 2
    assert "invalid choice: 'fused'" in capsys.readouterr().err


def test_dot_command_optimised_stage_compiles_and_draws_fusion_groups(build_file, tmp_path):
    out = tmp_path / "model.dot"
    assert cli.main(["dot", str(build_file), "--stage", "optimised", "-o", str(out)]) == 0
    parsed = parse(out.read_text(encoding="utf-8"))
    groups = [sub for side in parsed.get_subgraphs() for sub in side.get_subgraphs()]
    assert groups, "the compiled step has at least one kernel cluster"
    assert all(sub.get_name().startswith("cluster_k") for sub in groups)


def on_disk(directory) -> dict[str, int]:
    """The cache directory's files counted by walking it: modules at its top, Numba's
    compiled-kernel files, every file, and their sizes."""
    top = [n for n in os.listdir(directory) if os.path.isfile(os.path.join(directory, n))]
    every = [os.path.join(root, n) for root, _, names in os.walk(directory) for n in names]
    return {"module_files": sum(n.startswith("gck_") and n.endswith(".py") for n in top),
            "kernel_files": sum(p.endswith((".nbi", ".nbc")) for p in every),
            "files": len(every), "bytes": sum(os.path.getsize(p) for p in every)}


def cache_info_lines(capsys) -> dict[str, str]:
    assert cli.main(["cache", "info"]) == 0
    return dict(line.split(None, 1) for line in capsys.readouterr().out.splitlines())


def test_cache_info_shows_what_the_directory_holds_and_clear_empties_it(tmp_path, monkeypatch,
                                                                        capsys):
    monkeypatch.setenv("GRADCOMPILER_CACHE_DIR", str(tmp_path))
    with gc.Graph("cached"):
        out = gc.tanh(gc.input("x", (3, 2))) * 3.0
    step = gc.compile(out)
    disk = on_disk(tmp_path)
    assert disk["module_files"] >= 1 and disk["kernel_files"] >= 1 and disk["bytes"] > 0

    info = cache_info_lines(capsys)
    assert info["directory"] == str(tmp_path)
    assert {key: int(info[key].split()[0]) for key in disk} == disk
    assert "kernels_compiled" not in info  # this process's counters: zeros, not shown

    assert cli.main(["cache", "clear"]) == 0
    assert f"removed {disk['module_files']} cached modules" in capsys.readouterr().out
    info = cache_info_lines(capsys)
    assert {key: int(info[key].split()[0]) for key in disk} == on_disk(tmp_path)
    assert info["module_files"] == "0" and info["kernel_files"] == "0"
    x = np.arange(6, dtype=np.float32).reshape(3, 2)
    np.testing.assert_allclose(step(x=x), np.tanh(x) * 3.0, rtol=1e-5)  # still runs


def test_bench_command_runs_the_suite_and_writes_its_files(tmp_path, capsys):
    report, table = tmp_path / "bench.json", tmp_path / "bench.md"
    status = cli.main(["bench", "--quick", "--workload", "bcast_reduce", "--peer", "numpy_manual",
                       "--no-first-call", "--json", str(report), "--markdown", str(table)])
    assert status == 0
    result = json.loads(report.read_text(encoding="utf-8"))
    assert result["target"] == "cpu" and result["quick"] is True
    assert [w["name"] for w in result["workloads"]] == ["bcast_reduce"]
    assert result["workloads"][0]["compiled"]["correct"] is True
    assert "| bcast_reduce |" in table.read_text(encoding="utf-8")
    assert f"wrote {report}" in capsys.readouterr().out


def test_bench_command_without_a_gpu_says_so_in_one_line():
    """Numba's simulator off and no device visible: the one-line reason `compile` gives,
    before the machine is measured, rather than numba-cuda's driver traceback."""
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["CUDA_VISIBLE_DEVICES"] = ""  # no GPU, even on a machine that has one
    done = subprocess.run([sys.executable, "-m", "gradcompiler.cli", "bench", "--target", "cuda",
                           "--quick", "--workload", "bcast_reduce"], env=env, capture_output=True,
                          text=True, cwd=Path(gc.__file__).resolve().parents[1], timeout=300)
    assert done.returncode == 1
    assert done.stderr.startswith("gradcompiler bench: target='cuda' cannot run here: no usable "
                                  "CUDA driver or GPU ("), done.stderr
    assert len(done.stderr.splitlines()) == 1 and done.stdout == ""


def test_progress_bar_counts_every_kernel_when_there_are_many():
    stream = io.StringIO()
    total = MIN_KERNELS_FOR_BAR + 2
    with compile_progress(total, enabled=True, file=stream) as tick:
        for k in range(total):
            tick(f"k{k}_loop")
    shown = stream.getvalue()
    assert f"{total}/{total}" in shown and f"k{total - 1}_loop" in shown


def test_progress_bar_stays_silent_for_a_few_kernels(monkeypatch):
    monkeypatch.delenv("GRADCOMPILER_PROGRESS", raising=False)
    stream = io.StringIO()
    with compile_progress(MIN_KERNELS_FOR_BAR, file=stream) as tick:
        for k in range(MIN_KERNELS_FOR_BAR):
            tick(f"k{k}")
    assert stream.getvalue() == ""


def test_progress_bar_follows_the_environment_switch(monkeypatch):
    monkeypatch.setenv("GRADCOMPILER_PROGRESS", "1")
    stream = io.StringIO()
    with compile_progress(1, file=stream) as tick:
        tick("k0")
    assert "1/1" in stream.getvalue()
    monkeypatch.setenv("GRADCOMPILER_PROGRESS", "0")
    stream = io.StringIO()
    with compile_progress(50, file=stream) as tick:
        tick("k0")
    assert stream.getvalue() == ""


def _many_kernel_step():
    """Five outputs over five domains: five loop kernels, more than MIN_KERNELS_FOR_BAR."""
    with gc.Graph("bar"):
        return [gc.exp(gc.input("a", (5, 3))).sum(axis=0), gc.tanh(gc.input("b", (4,))),
                gc.sigmoid(gc.input("c", (2, 3, 2))).max(axis=2), gc.input("d", (7,)) * 3.0,
                gc.log1p(gc.input("e", (3, 3)))]


def test_the_cpu_backend_shows_the_bar_for_kernels_new_to_the_process(monkeypatch, capsys):
    from gradcompiler.backends import numba_cpu

    monkeypatch.setattr(numba_cpu, "_COMPILED", {})  # every kernel is new to this process
    monkeypatch.setenv("GRADCOMPILER_PROGRESS", "1")
    step = gc.compile(_many_kernel_step())
    new = len(step._build.distinct)
    assert new > MIN_KERNELS_FOR_BAR
    shown = capsys.readouterr().err
    assert f"{new}/{new}" in shown and "compiling kernels" in shown
    gc.compile(_many_kernel_step())  # every kernel built already: nothing to wait for
    assert capsys.readouterr().err == ""


def test_the_cpu_backend_bar_is_silent_off_a_terminal(monkeypatch, capsys):
    from gradcompiler.backends import numba_cpu

    monkeypatch.setattr(numba_cpu, "_COMPILED", {})
    monkeypatch.delenv("GRADCOMPILER_PROGRESS", raising=False)
    step = gc.compile(_many_kernel_step())
    assert len(step._build.distinct) > MIN_KERNELS_FOR_BAR
    assert capsys.readouterr().err == ""
