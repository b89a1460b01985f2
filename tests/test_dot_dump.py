"""DOT dumps: they parse back, keep every edge of the graph, split forward
from backward, keep arbitrary user names intact, and write a `.dot` file
with a clear message where Graphviz is not installed."""

from __future__ import annotations

import re
import shutil
import warnings

import pydot
import pytest

import gradcompiler as gc
from gradcompiler import dot as dot_module
from gradcompiler.dot import GraphvizMissingWarning
from gradcompiler.units import format_bytes

from helpers import mlp_step

STRANGE_NAMES = ['a"b{c}\n', "a\"b{c}\\n", "end\\", '"q"', "<b>html</b>", "x -> y; }"]


def build_mlp():
    step = mlp_step((12, 6, 5, 3), first=gc.tanh, dtype="float32")
    return step.graph, step.loss, step.params, step.grads


def parse(text: str) -> pydot.Dot:
    graphs = pydot.graph_from_dot_data(text)
    assert graphs is not None and len(graphs) == 1, "the DOT text does not parse back"
    return graphs[0]


def unquote(value: str) -> str:
    """A DOT quoted label back to its text (`\\"`, `\\\\`, `\\n` escapes)."""
    assert value.startswith('"') and value.endswith('"'), value
    return re.sub(r"\\(.)", lambda m: "\n" if m.group(1) == "n" else m.group(1), value[1:-1],
                  flags=re.DOTALL)


def graph_nodes(container) -> dict[int, pydot.Node]:
    """Node id → DOT node, in `container` and every cluster nested in it."""
    found = {int(n.get_name()[1:]): n for n in container.get_nodes()
             if re.fullmatch(r"n\d+", n.get_name())}
    for sub in container.get_subgraphs():
        found.update(graph_nodes(sub))
    return found


def node_ids(container) -> set[int]:
    return set(graph_nodes(container))


def label_of(container, node_id: int) -> str:
    return unquote(graph_nodes(container)[node_id].get("label"))


def clusters(parsed: pydot.Dot) -> dict[str, pydot.Subgraph]:
    return {s.get_name(): s for s in parsed.get_subgraphs()}


def edges(parsed: pydot.Dot) -> list[tuple[int, int]]:
    return sorted((int(e.get_source()[1:]), int(e.get_destination()[1:])) for e in parsed.get_edges())


def expected_edges(graph: gc.Graph, ids: set[int]) -> list[tuple[int, int]]:
    return sorted((i, n) for n in ids for i in graph[n].inputs if i in ids)


def test_backward_stage_has_forward_and_backward_clusters_and_every_edge():
    g, loss, params, grads = build_mlp()
    parsed = parse(gc.to_dot([loss, *grads], stage="backward"))
    parts = clusters(parsed)
    assert set(parts) == {"cluster_forward", "cluster_backward"}
    forward, backward = node_ids(parts["cluster_forward"]), node_ids(parts["cluster_backward"])
    drawn = g.ancestors([loss.id, *(t.id for t in grads)])
    assert forward | backward == drawn and not forward & backward
    assert {p.id for p in params} | {loss.id} <= forward
    assert {t.id for t in grads} <= backward
    assert all(g[i].role != "backward" for i in forward)
    assert {i for i in drawn if g[i].role == "backward"} <= backward
    assert edges(parsed) == expected_edges(g, drawn)


def test_forward_stage_draws_only_forward_nodes():
    g, loss, _, grads = build_mlp()
    parsed = parse(gc.to_dot([loss, *grads], stage="forward"))
    assert set(clusters(parsed)) == {"cluster_forward"}
    drawn = node_ids(clusters(parsed)["cluster_forward"])
    assert drawn == g.ancestors([loss.id])
    assert edges(parsed) == expected_edges(g, drawn)


def test_node_label_names_op_parameters_shape_dtype_and_user_name():
    g, _, params, _ = build_mlp()
    parsed = parse(gc.to_dot(g, stage="forward"))
    w1 = params[0]
    label = label_of(parsed, w1.id)
    assert "'w1'" in label and "param" in label and "float32[12, 6]" in label
    matmul = next(n for n in g.nodes.values() if n.op.name == "MatrixMul" and w1.id in n.inputs)
    label = label_of(parsed, matmul.id)
    assert label.splitlines()[1:] == ["MatrixMul(transpose_a=False, transpose_b=False)", "float32[8, 6]"]


def test_default_stage_follows_what_the_graph_holds():
    with gc.Graph("plain") as g:
        gc.exp(gc.input("x", (2,)))
    assert '"plain (forward)"' in gc.to_dot(g)
    g = build_mlp()[0]
    assert '"mlp (backward)"' in gc.to_dot(g)


@pytest.mark.parametrize("name", STRANGE_NAMES)
def test_any_user_name_yields_valid_dot_that_keeps_the_name(name):
    with gc.Graph("names") as g:
        x = gc.input(name, (2, 3))
        out = gc.exp(x) * 2.0
    text = gc.to_dot(out)
    parsed = parse(text)
    label = label_of(parsed, x.id)
    assert label == f"%{x.id} '{name}'\nPlaceholder (input)\nfloat32[2, 3]"
    assert edges(parsed) == expected_edges(g, g.ancestors([out.id]))


def test_dot_path_writes_the_text(tmp_path):
    g = build_mlp()[0]
    target = tmp_path / "mlp.dot"
    text = gc.to_dot(g, target, stage="backward")
    assert target.read_text(encoding="utf-8") == text


def test_rendering_without_graphviz_warns_how_to_install_and_writes_dot_beside(tmp_path, monkeypatch):
    monkeypatch.setattr(dot_module.shutil, "which", lambda program: None)
    g = build_mlp()[0]
    target = tmp_path / "mlp.svg"
    with pytest.warns(GraphvizMissingWarning, match="apt-get install graphviz") as caught:
        text = gc.to_dot(g, target)
    assert not target.exists()
    beside = tmp_path / "mlp.dot"
    assert beside.read_text(encoding="utf-8") == text
    assert str(beside) in str(caught[0].message)
    parse(beside.read_text(encoding="utf-8"))


# Rendering needs Graphviz's `dot` program, a system package pip cannot install; the
# no-Graphviz path (warning + .dot written beside) is tested everywhere above.
@pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's `dot` program (a system package, "
                    "not pip's) is not on PATH; .ci/run installs it, so CI runs this test")
def test_rendering_with_graphviz_accepts_strange_names(tmp_path):
    with gc.Graph("names"):
        outs = [gc.exp(gc.input(name, (2,))) for name in STRANGE_NAMES]
    target = tmp_path / "names.svg"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gc.to_dot(outs, target)
    assert "<svg" in target.read_text(encoding="utf-8")


def test_bad_requests_are_clear_errors(tmp_path):
    g = build_mlp()[0]
    with pytest.raises(ValueError, match="unknown stage 'fused'"):
        gc.to_dot(g, stage="fused")
    with pytest.raises(ValueError, match="needs a compiled executable"):
        gc.to_dot(g, stage="optimised")
    with pytest.raises(ValueError, match=r"\.svg"):
        gc.to_dot(g, tmp_path / "mlp.txt")
    with pytest.raises(TypeError, match="to_dot takes"):
        gc.to_dot(42)


@pytest.fixture(scope="module")
def compiled_mlp():
    _, loss, _, grads = build_mlp()
    return gc.compile([loss, *grads], target="cpu")


def nested_clusters(parsed: pydot.Dot) -> dict[str, pydot.Subgraph]:
    """Fusion-group clusters (inside the forward and backward clusters), by their label."""
    return {unquote(sub.get("label")).split(" (")[0]: sub
            for side in parsed.get_subgraphs() for sub in side.get_subgraphs()}


def test_optimised_stage_has_one_cluster_per_fusion_group(compiled_mlp):
    parsed = parse(gc.to_dot(compiled_mlp, stage="optimised"))
    assert set(clusters(parsed)) == {"cluster_forward", "cluster_backward"}
    groups = nested_clusters(parsed)
    kernels = compiled_mlp.plan.kernels()
    assert set(groups) == {k.name for k in kernels}
    for kernel in kernels:
        assert node_ids(groups[kernel.name]) == set(kernel.nodes)
        for i in kernel.nodes:  # values kept in registers are dashed, materialised ones are not
            dashed = "dashed" in (graph_nodes(groups[kernel.name])[i].get("style") or "")
            assert dashed == (i not in kernel.outputs)
    graph = compiled_mlp.graph
    drawn = graph.ancestors(graph.outputs)
    assert node_ids(parsed) == drawn
    assert edges(parsed) == expected_edges(graph, drawn)


def test_optimised_stage_highlights_captures_with_their_sizes(compiled_mlp):
    graph, memory = compiled_mlp.graph, compiled_mlp.context.memory
    parsed = parse(gc.to_dot(compiled_mlp))
    highlighted = {(int(e.get_source()[1:]), int(e.get_destination()[1:])): unquote(e.get("label"))
                   for e in parsed.get_edges() if e.get("color") == "red"}
    captured = {node_id for node_id, *_ in memory.captures}
    assert captured, "the mlp keeps its tanh and relu outputs for the backward"
    expected = {(i, n.id) for n in graph.nodes.values() for i in n.inputs
                if i in captured and dot_module.side(n) == "backward"}
    assert set(highlighted) == expected
    for (source, _), label in highlighted.items():
        size = graph[source].type.size * graph[source].type.dtype.itemsize
        assert label == f"capture {format_bytes(size)}"


def test_forward_and_backward_stages_of_an_executable_draw_its_optimised_graph(compiled_mlp):
    parsed = parse(gc.to_dot(compiled_mlp, stage="forward"))
    assert set(clusters(parsed)) == {"cluster_forward"}
    assert all(dot_module.side(compiled_mlp.graph[i]) == "forward" for i in node_ids(parsed))


def test_step_to_dot_writes_the_optimised_graph_and_takes_a_stage(compiled_mlp, tmp_path):
    target = tmp_path / "step.dot"
    text = compiled_mlp.to_dot(str(target))
    assert target.read_text(encoding="utf-8") == text
    assert text == gc.to_dot(compiled_mlp, stage="optimised")
    assert set(nested_clusters(parse(text))) == {k.name for k in compiled_mlp.plan.kernels()}
    forward = parse(compiled_mlp.to_dot(stage="forward"))
    assert set(clusters(forward)) == {"cluster_forward"}
    with pytest.raises(ValueError, match="unknown stage 'fused'"):
        compiled_mlp.to_dot(stage="fused")
