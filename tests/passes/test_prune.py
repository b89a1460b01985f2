"""`prune` keeps exactly the ancestors of the outputs."""

from __future__ import annotations

import numpy as np

import gradcompiler as gc
from gradcompiler.passes.pipeline import PRUNE, optimize
from gradcompiler.reference import run_graph


def test_prune_drops_what_no_output_needs(rng):
    with gc.Graph() as g:
        x = gc.input("x", (3, 4), "float64")
        unused_input = gc.input("unused", (2,), "float64")
        w = gc.param("w", (4, 2), "float64")
        kept = gc.tanh(x @ w)
        side = gc.exp(x) * 2.0  # computed, never asked for
        _ = unused_input + 1.0
    opt, ctx = optimize(g, [kept.id], passes=[PRUNE], debug=True)
    assert set(opt.nodes) == {x.id, w.id, kept.id, kept.node.inputs[0]}
    assert side.id not in opt and unused_input.id not in opt
    assert set(opt.feed_names) == {"x", "w"}
    (stats,) = ctx.stats
    assert stats.rewrites == {"dropped": len(g) - 4}
    assert (stats.nodes_before, stats.nodes_after) == (len(g), 4)
    xv, wv = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))
    np.testing.assert_allclose(run_graph(opt, opt.outputs, {"x": xv, "w": wv})[0], np.tanh(xv @ wv))


def test_prune_keeps_everything_when_all_is_needed():
    with gc.Graph() as g:
        x = gc.input("x", (3,), "float64")
        y = gc.exp(x)
        z = y * x
    opt, ctx = optimize(g, [y.id, z.id], passes=[PRUNE], debug=True)
    assert set(opt.nodes) == set(g.nodes)
    assert ctx.stats[0].rewrites == {}


def test_prune_drops_unrequested_gradients():
    with gc.Graph() as g:
        x = gc.input("x", (3, 4), "float64")
        w = gc.param("w", (4, 2), "float64")
        b = gc.param("b", (2,), "float64")
        loss = gc.sum(gc.tanh(x @ w + b))
    dw, db = gc.grad(loss, [w, b])
    opt, _ = optimize(g, [dw.id], passes=[PRUNE], debug=True)
    assert db.id not in opt and b.id in opt  # b is still needed: the forward reads it
    assert opt.ancestors([dw.id]) == set(opt.nodes)
