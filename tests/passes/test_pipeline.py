"""The pass framework: `optimize`, pass lists, stats, debug verification, `format_stats`."""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import GraphError
from gradcompiler.ops.elemwise import Elemwise
from gradcompiler.passes.pipeline import (
    CSE,
    DEFAULT_PIPELINE,
    PRUNE,
    SIMPLIFY,
    UNFUSED_PIPELINE,
    Pass,
    PassContext,
    format_stats,
    optimize,
)
from gradcompiler.reference import run_graph


@pytest.fixture
def small():
    """exp(x)·1 twice (a CSE and a simplify target) plus an unused branch (a prune target)."""
    with gc.Graph() as g:
        x = gc.input("x", (4, 8), "float64")
        a = gc.exp(x) * 1.0
        b = gc.exp(x) * 1.0
        _unused = gc.tanh(x)
        y = gc.sum(a + b, 1)
    return g, x, y


def test_default_pipeline_order():
    assert [p.name for p in DEFAULT_PIPELINE] == ["prune", "simplify", "cse", "constant_fold", "simplify", "fuse",
                                                  "memory"]
    assert [p.name for p in UNFUSED_PIPELINE] == ["prune", "simplify", "cse", "constant_fold", "simplify", "memory"]


@pytest.mark.parametrize("pipeline", [DEFAULT_PIPELINE, UNFUSED_PIPELINE], ids=["fused", "unfused"])
def test_optimize_works_on_a_copy(small, rng, pipeline):
    g, x, y = small
    before = {i: n for i, n in g.nodes.items()}
    opt, ctx = optimize(g, [y.id], passes=pipeline, debug=True)
    assert g.nodes == before and g.outputs == []
    assert opt is not g and len(opt) < len(g)
    assert [s.name for s in ctx.stats] == [p.name for p in pipeline]
    assert ctx.memory is not None and (ctx.fusion is None) == (pipeline is UNFUSED_PIPELINE)
    if ctx.fusion is not None:
        assert ctx.memory.order == ctx.fusion.groups
    xv = rng.standard_normal((4, 8))
    np.testing.assert_allclose(run_graph(opt, opt.outputs, {"x": xv})[0], (2 * np.exp(xv)).sum(1))


def test_stats_count_nodes_rewrites_and_bytes(small):
    g, x, y = small
    opt, ctx = optimize(g, [y.id], debug=True)
    prune, simplify, cse = ctx.stats[:3]
    assert (prune.nodes_before, prune.nodes_after) == (len(g), len(g) - 1)
    assert prune.rewrites == {"dropped": 1}
    assert prune.bytes_saved == 4 * 8 * 8  # the tanh's output
    assert simplify.rewrites == {"mul_by_one": 2}
    assert cse.rewrites == {"merged": 1}
    assert cse.bytes_saved == 4 * 8 * 8  # the second exp
    assert all(s.nodes_after == t.nodes_before for s, t in zip(ctx.stats, ctx.stats[1:]))
    assert ctx.stats[-1].bytes_saved == ctx.memory.unfused_peak_bytes - ctx.memory.peak_bytes


def test_format_stats_has_a_line_per_pass(small):
    g, x, y = small
    _, ctx = optimize(g, [y.id], passes=UNFUSED_PIPELINE)
    lines = format_stats(ctx).splitlines()
    assert lines[0].startswith("prune") and "dropped ×1" in lines[0] and f"{len(g)} → {len(g) - 1}" in lines[0]
    assert lines[1].startswith("simplify") and "mul_by_one ×2" in lines[1]
    assert lines[2].startswith("cse") and "merged ×1" in lines[2] and "saved 256 B" in lines[2]
    assert lines[3].startswith("constant_fold") and "no change" in lines[3]
    assert lines[5].startswith("memory")
    assert lines[6].startswith("memory plan: peak")
    assert len(lines) == 7


def test_passes_replace_and_extra_passes_go_before_the_planning_passes(small):
    g, x, y = small
    seen = []

    def spy(graph, ctx):
        seen.append([s.name for s in ctx.stats])
        return {}

    _, ctx = optimize(g, [y.id], passes=[PRUNE, CSE])
    assert [s.name for s in ctx.stats] == ["prune", "cse"]
    _, ctx = optimize(g, [y.id], passes=UNFUSED_PIPELINE, extra_passes=[spy])
    assert [s.name for s in ctx.stats] == ["prune", "simplify", "cse", "constant_fold", "simplify", "spy", "memory"]
    assert seen == [["prune", "simplify", "cse", "constant_fold", "simplify"]]
    _, ctx = optimize(g, [y.id], extra_passes=[spy])  # the default: before fuse, which plans for memory
    assert [s.name for s in ctx.stats][-3:] == ["spy", "fuse", "memory"]
    _, ctx = optimize(g, [y.id], passes=[PRUNE], extra_passes=[Pass("named", spy)])
    assert [s.name for s in ctx.stats] == ["prune", "named"]


def _corrupting(graph, ctx):
    """Swaps an exp for a comparison: the stored type (float) no longer re-infers (bool)."""
    node = next(n for n in graph.nodes.values() if n.op == Elemwise("EXP"))
    graph.replace_inputs(node.id, (node.inputs[0], node.inputs[0]), op=Elemwise("LT"))
    return {"corrupted": 1}


def test_debug_verifies_after_every_pass(small, monkeypatch):
    g, x, y = small
    monkeypatch.delenv("GRADCOMPILER_DEBUG", raising=False)
    optimize(g, [y.id], passes=[Pass("corrupt", _corrupting)])  # not checked without debug
    with pytest.raises(GraphError, match="after pass 'corrupt'"):
        optimize(g, [y.id], passes=[SIMPLIFY, Pass("corrupt", _corrupting), CSE], debug=True)
    monkeypatch.setenv("GRADCOMPILER_DEBUG", "1")
    with pytest.raises(GraphError, match="after pass 'corrupt'"):
        optimize(g, [y.id], passes=[Pass("corrupt", _corrupting)])


def test_outputs_must_exist(small):
    g, x, y = small
    with pytest.raises(GraphError, match="%999"):
        optimize(g, [999])


def test_assume_finite_reaches_the_passes():
    with gc.Graph() as g:
        x = gc.input("x", (3,), "float64")
        y = x * 0.0 + 1.0
    opt, ctx = optimize(g, [y.id], assume_finite=True, debug=True)
    assert ctx.assume_finite and x.id not in opt
    np.testing.assert_array_equal(run_graph(opt, opt.outputs, {})[0], np.ones(3))
    assert PassContext().assume_finite is False
