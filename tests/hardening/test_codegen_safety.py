"""Code generation safety (issue 8, part 4).

Generated modules are Python source that is written to disk and executed.
No user string may reach them: identifiers come from the compiler's own
numbering (node and buffer indices), never from a node's name, and every
value the user supplies (constants, scalars, fill values) reaches a kernel
as an array argument, never pasted into the source as a literal.

The tests build graphs whose names (of inputs, params, constants, nodes and
the graph) hold quotes, newlines, backslashes, comment and format markers,
names of the generated code's own identifiers, and
`__import__(...)` payloads, then check the generated source (nothing of
theirs in it, every identifier of the compiler's form, no float literal
but the reductions' identities) and the behaviour (the right values, and
no payload ran).
"""

from __future__ import annotations

import ast
import builtins
import os
import re
from pathlib import Path

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import GraphError, ShapeError
from gradcompiler.ops.elemwise import Elemwise
from gradcompiler.ops.reduce import Reduce
from gradcompiler.ops.vision import WarpAffine

TARGETS = ["cpu", "cuda"]
MARKER = "gcPWNED7f3a"


def payloads(flag_file: Path) -> list[str]:
    """User strings that would run code, or break the source, if pasted into it."""
    system = f"__import__('os').system('touch {flag_file}')"
    return [
        f"x'); {system}; ('",
        f'x"); {system}; ("',
        f'"""\n{system}\n"""',
        f"a\n{system}\n#",
        f"__import__('builtins').__setattr__('{MARKER}', 1)",
        f"{MARKER}\\",
        f"{MARKER} {{}} %s %(x)s \\n \x00 λ",
        system,
    ]


# names the generated code uses itself, so a verbatim user name would shadow them
SHADOWING_NAMES = ["np", "kernel", "step", "make", "p0"]


def build_named_graph(names: list[str]):
    """x·w + c, summed, and its gradient, with every name a user can give taken from `names`."""
    with gc.Graph(names[0]) as graph:
        x = gc.input(names[1], (2, 3))
        w = gc.param(names[2], (3,))
        c = gc.constant(np.array([0.5, -1.5, 2.25], np.float32), name=names[3])
        y = gc.apply(Elemwise("MUL"), x, w, name=names[4]) + c
        loss = gc.tanh(y).sum()
        dw = gc.grad(loss, w)
    return graph, [loss, dw], (names[1], names[2])


def expected(x: np.ndarray, w: np.ndarray) -> tuple[float, np.ndarray]:
    t = np.tanh(x.astype(np.float64) * w + np.array([0.5, -1.5, 2.25]))
    return t.sum(), ((1 - t * t) * x).sum(axis=0)


def run(step, target, /, **feeds):
    return step(**feeds, to_host=True) if target == "cuda" else step(**feeds)


@pytest.fixture(scope="module", autouse=True)
def own_cache_dir(tmp_path_factory):
    """A cache directory of this module's own, so every file in it was generated here."""
    previous = os.environ.get("GRADCOMPILER_CACHE_DIR")
    os.environ["GRADCOMPILER_CACHE_DIR"] = str(tmp_path_factory.mktemp("codegen_cache"))
    yield
    if previous is None:
        del os.environ["GRADCOMPILER_CACHE_DIR"]
    else:
        os.environ["GRADCOMPILER_CACHE_DIR"] = previous


def cache_files() -> list[Path]:
    return sorted(Path(gc.cache_info()["directory"]).glob("*.py"))


def identifiers(source: str) -> set[str]:
    tree = ast.parse(source)
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            found.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            found.add(node.name)
        elif isinstance(node, ast.arg):
            found.add(node.arg)
        elif isinstance(node, ast.alias):
            found.add(node.asname or node.name.split(".")[0])
        elif isinstance(node, ast.Attribute):
            found.add(node.attr)
        elif isinstance(node, ast.keyword) and node.arg:
            found.add(node.arg)
    return found


GENERATED_IDENTIFIER = re.compile(r"^[a-z]{1,6}\d*$|^[A-Z]$|^[a-z]+(_[a-z0-9]+)*$")
"""A numbered local (`p3`, `v12`, `k0`), a one-letter table (`K`, `B`), or a library or
routine name in snake case (`sum_row`, `syncthreads`): never anything a user could name."""
CUDA_ATTRIBUTES = {"threadIdx", "blockIdx", "blockDim", "gridDim"}


def float_literals(source: str) -> set[float]:
    return {node.value for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Constant) and isinstance(node.value, float)}


@pytest.mark.parametrize("target", TARGETS)
def test_hostile_names_never_reach_the_source_and_run_nothing(target, tmp_path):
    flag_file = tmp_path / "payload_ran"
    names = payloads(flag_file)
    graph, outputs, (x_name, w_name) = build_named_graph(names)
    step = gc.compile(outputs, target=target)
    source = step.source()
    for name in names:
        for piece in name.split("\n"):
            if len(piece) > 3:
                assert piece not in source, piece
    assert MARKER not in source and "__import__" not in source and "system" not in source
    for path in cache_files():
        text = path.read_text()
        assert MARKER not in text and "__import__" not in text, path
    x = np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3)
    w = np.array([0.5, -2.0, 1.0], np.float32)
    loss, dw = run(step, target, **{x_name: x, w_name: w})
    want_loss, want_dw = expected(x, w)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-5, atol=1e-6)
    assert not flag_file.exists()
    assert not hasattr(builtins, MARKER)


@pytest.mark.parametrize("target", TARGETS)
def test_names_of_the_generated_codes_own_identifiers_are_harmless(target):
    graph, outputs, (x_name, w_name) = build_named_graph(SHADOWING_NAMES)
    step = gc.compile(outputs, target=target)
    x = np.arange(6, dtype=np.float32).reshape(2, 3) / 6
    w = np.array([1.0, 0.0, -1.0], np.float32)
    loss, dw = run(step, target, **{x_name: x, w_name: w})
    want_loss, want_dw = expected(x, w)
    np.testing.assert_allclose(loss, want_loss, rtol=1e-5)
    np.testing.assert_allclose(dw, want_dw, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
def test_every_identifier_is_of_the_compilers_own_form(target):
    user_names = ["user_graph", "user_input", "user_weight", "user_const", "user_node"]
    graph, outputs, _ = build_named_graph(user_names)
    source = gc.compile(outputs, target=target).source()
    found = identifiers(source)
    assert not found & set(user_names)
    odd = {name for name in found - CUDA_ATTRIBUTES if not GENERATED_IDENTIFIER.match(name)}
    assert not odd, sorted(odd)


@pytest.mark.parametrize("target", TARGETS)
def test_user_values_are_arguments_not_literals(target):
    """Distinctive constants, weak scalars, fills and non-finite values all come in as arrays."""
    distinct = [1234.5678, 7.125, 0.3125, -99.75, 2.5e-7]
    with gc.Graph("values"):
        x = gc.input("x", (2, 3))
        y = gc.where(x < 0.3125, x * 1234.5678 + 7.125, np.inf)
        z = gc.maximum(y - gc.full((2, 3), -99.75), np.float32(2.5e-7))
        z = z + gc.constant([np.nan, 0.0, 1.0], "float32")
        total = gc.minimum(z, np.float32(-np.inf) + x).sum()
    step = gc.compile([y, z, total], target=target)
    source = step.source()
    literals = float_literals(source)
    assert not literals & set(distinct), literals
    assert literals <= {0.0, 1.0, -1.0}, literals
    for text in ("1234.5678", "7.125", "nan", "inf"):
        assert text not in source.lower().replace("isinf", "").replace("isnan", "")
    xv = np.array([[0.0, 0.5, -1.0], [0.3, 2.0, 0.25]], np.float32)
    got_y, got_z, got_total = run(step, target, x=xv)
    x64 = xv.astype(np.float64)
    want_y = np.where(x64 < 0.3125, x64 * 1234.5678 + 7.125, np.inf)
    want_z = np.maximum(want_y + 99.75, 2.5e-7) + np.array([np.nan, 0.0, 1.0])
    np.testing.assert_allclose(got_y, want_y, rtol=1e-6)
    np.testing.assert_allclose(got_z, want_z, rtol=1e-6)
    lower = -np.inf + x64
    want_total = np.where(want_z < lower, want_z, lower).sum()  # MIN is a < b ? a : b
    np.testing.assert_array_equal(got_total, want_total)


@pytest.mark.parametrize("make", [
    lambda x, m: gc.warp_affine(x, m, (2, 2), border_mode="constant'); __import__('os')#"),
    lambda x, m: gc.warp_affine(x, m, (2, 2), format="NHWC\n__import__('os')"),
    lambda x, m: gc.apply(WarpAffine((2, 2), "wrap", 0.0, "NCHW'"), x, m),
    lambda x, m: gc.elemwise("EXP'); __import__('os')#", x),
    lambda x, m: gc.apply(Reduce("SUM\n__import__('os')", None, False), x),
], ids=["border_mode", "format", "op-field", "elemwise-mode", "reduce-mode"])
def test_string_parameters_are_checked_against_their_known_values(make):
    """Op parameters that are strings never reach generated code unchecked: anything but a
    known value is refused when the node is built."""
    with gc.Graph("params"):
        x = gc.input("x", (1, 3, 3, 1))
        m = gc.input("m", (1, 2, 3))
        with pytest.raises(ShapeError, match=r"unknown|expected one of"):
            make(x, m)


@pytest.mark.parametrize("target, keyword", [("cpu", "out"), ("cuda", "to_host")])
def test_an_input_named_like_the_steps_own_keyword_is_refused(target, keyword):
    """`step(out=...)` names the output arrays; an input called `out` could never be fed."""
    with gc.Graph("keyword"):
        x = gc.input(keyword, (2,))
        y = x * 2.0
    assert gc.evaluate(y, {keyword: np.ones(2, np.float32)}).tolist() == [2.0, 2.0]
    with pytest.raises(GraphError, match=f"named '{keyword}'.*rename"):
        gc.compile(y, target=target)


def test_cache_file_names_are_hashes(tmp_path):
    _, outputs, _ = build_named_graph(payloads(tmp_path / "payload_ran"))
    gc.compile(outputs)
    assert cache_files()
    for path in cache_files():
        assert re.fullmatch(r"gck_[0-9a-f]{32}\.py", path.name), path.name
        assert path.resolve().parent == Path(gc.cache_info()["directory"]).resolve()
