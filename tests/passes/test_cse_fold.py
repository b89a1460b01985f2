"""`cse` merges duplicates; `constant_fold` evaluates what is known at compile time."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import IndexOutOfRangeError
from gradcompiler.frontend.tensor import apply
from gradcompiler.ops.indexing import IndexingOneHot
from gradcompiler.ops.source import Constant, Fill
from gradcompiler.passes.pipeline import CONSTANT_FOLD, CSE, optimize
from gradcompiler.reference import run_graph


def ops(graph) -> Counter:
    return Counter(n.op.label for n in graph.nodes.values() if n.op.kind != "source")


# -- cse --------------------------------------------------------------------------------------


def test_cse_merges_duplicate_chains_in_one_sweep(rng):
    with gc.Graph() as g:
        x = gc.input("x", (3, 4), "float64")
        a = gc.tanh(gc.exp(x) * 2.0)
        b = gc.tanh(gc.exp(x) * 2.0)
        y = a + b
    opt, ctx = optimize(g, [y.id], passes=[CSE], debug=True)
    assert ctx.stats[0].rewrites == {"merged": 4}  # exp, the constant 2, mul, tanh
    assert ops(opt) == Counter({"Elemwise EXP": 1, "Elemwise MUL": 1, "Elemwise TANH": 1, "Elemwise ADD": 1})
    assert opt[y.id].inputs == (a.id, a.id)
    xv = rng.standard_normal((3, 4))
    np.testing.assert_allclose(run_graph(opt, opt.outputs, {"x": xv})[0], 2 * np.tanh(np.exp(xv) * 2))


def test_cse_merges_commutative_operands_but_not_max():
    with gc.Graph() as g:
        x = gc.input("x", (4,), "float64")
        v = gc.input("v", (4,), "float64")
        outs = [x + v, v + x, x * v, v * x, gc.maximum(x, v), gc.maximum(v, x)]
    opt, ctx = optimize(g, [t.id for t in outs], passes=[CSE], debug=True)
    assert ctx.stats[0].rewrites == {"merged": 2}
    assert opt.outputs[1] == outs[0].id and opt.outputs[3] == outs[2].id
    xv, vv = np.array([1.0, np.nan, 3.0, -1.0]), np.array([np.nan, 2.0, 0.5, -1.0])
    got = run_graph(opt, opt.outputs, {"x": xv, "v": vv})
    # MAX is a > b ? a : b, so the NaN operand's side decides: not commutative
    np.testing.assert_array_equal(got[4], np.where(xv > vv, xv, vv))
    np.testing.assert_array_equal(got[5], np.where(vv > xv, vv, xv))
    np.testing.assert_array_equal(got[1], xv + vv)


def test_cse_never_merges_placeholders_but_merges_equal_constants():
    with gc.Graph() as g:
        a = gc.input("a", (3,), "float64")
        b = gc.input("b", (3,), "float64")
        y = (a * np.array([1.0, 2.0, 3.0])) + (b * np.array([1.0, 2.0, 3.0]))
    opt, ctx = optimize(g, [y.id], passes=[CSE], debug=True)
    assert ctx.stats[0].rewrites == {"merged": 1}
    assert a.id in opt and b.id in opt
    assert sum(isinstance(n.op, Constant) for n in opt.nodes.values()) == 1
    av, bv = np.ones(3), np.arange(3.0)
    np.testing.assert_array_equal(run_graph(opt, opt.outputs, {"a": av, "b": bv})[0], (av + bv) * [1, 2, 3])


def test_cse_keeps_the_forward_node_when_backward_recomputes_it():
    with gc.Graph() as g:
        x = gc.input("x", (3,), "float64")
        forward = gc.exp(x)
        with g.building("backward"):
            again = gc.exp(x)
            y = again * forward
    opt, _ = optimize(g, [forward.id, y.id], passes=[CSE], debug=True)
    assert again.id not in opt
    assert opt[y.id].inputs == (forward.id, forward.id)
    assert opt[forward.id].role == "forward"


# -- constant_fold ----------------------------------------------------------------------------


def test_constant_chains_fold_into_one_constant(rng):
    c = np.array([[1.0, -2.0], [0.5, 4.0]])
    with gc.Graph() as g:
        x = gc.input("x", (2, 2), "float64")
        k = gc.exp(gc.constant(c) * 3.0).T @ gc.constant(c)
        y = x + k
    opt, ctx = optimize(g, [y.id], passes=[CONSTANT_FOLD], debug=True)
    assert ctx.stats[0].rewrites == {"to_constant": 4}  # mul, exp, transpose, matmul
    assert ops(opt) == Counter({"Elemwise ADD": 1})
    (folded,) = [n for n in opt.nodes.values() if isinstance(n.op, Constant)]
    assert folded.role == "const"
    np.testing.assert_allclose(folded.op.value.array, np.exp(c * 3.0).T @ c)
    xv = rng.standard_normal((2, 2))
    np.testing.assert_allclose(run_graph(opt, opt.outputs, {"x": xv})[0], xv + np.exp(c * 3.0).T @ c)


def test_a_broadcast_scalar_stays_a_fill_however_big():
    with gc.Graph() as g:
        x = gc.input("x", (300, 400), "float64")
        big = gc.broadcast_to(gc.full((1, 400), 3.0, "float64") * 2.0, (300, 400))
        y = x * big
    opt, ctx = optimize(g, [y.id], passes=[CONSTANT_FOLD], debug=True)
    assert ctx.stats[0].rewrites == {"to_fill": 2}
    assert not [n for n in opt.nodes.values() if isinstance(n.op, Constant)]
    (fill,) = [n for n in opt.nodes.values() if isinstance(n.op, Fill)]
    assert (fill.op.value, fill.type.shape) == (6.0, (300, 400))


def test_results_larger_than_the_limit_are_not_folded():
    c = np.arange(5000.0)
    with gc.Graph() as g:
        x = gc.input("x", (5000,), "float64")
        y = x + gc.exp(gc.constant(c) / 5000.0)
    opt, ctx = optimize(g, [y.id], passes=[CONSTANT_FOLD], debug=True)
    assert ctx.stats[0].rewrites == {}
    assert ops(opt) == Counter({"Elemwise TRUE_DIV": 1, "Elemwise EXP": 1, "Elemwise ADD": 1})
    xv = np.ones(5000)
    np.testing.assert_allclose(run_graph(opt, opt.outputs, {"x": xv})[0], xv + np.exp(c / 5000.0))


def test_an_evaluation_error_is_left_for_run_time():
    with gc.Graph() as g:
        src = gc.constant(np.arange(6.0).reshape(2, 3))
        picked = apply(IndexingOneHot(1), src, gc.constant(np.array([0, 7], dtype=np.int32)))
        y = gc.input("x", (2, 1), "float64") + picked
    opt, ctx = optimize(g, [y.id], passes=[CONSTANT_FOLD], debug=True)
    assert ctx.stats[0].rewrites == {}
    with pytest.raises(IndexOutOfRangeError, match="7"):
        run_graph(opt, opt.outputs, {"x": np.zeros((2, 1))})


def test_fold_limit_comes_from_the_context():
    from gradcompiler.passes import constant_fold
    from gradcompiler.passes.pipeline import PassContext

    c = np.arange(20.0)
    with gc.Graph() as g:
        y = gc.input("x", (20,), "float64") + gc.constant(c) * 2.0
    small = g.copy()
    assert constant_fold.run(small, PassContext(fold_limit=10)) == {"to_fill": 0, "to_constant": 0}
    default = g.copy()
    assert constant_fold.run(default, PassContext()) == {"to_fill": 0, "to_constant": 1}
    (folded,) = [n for n in default.nodes.values() if isinstance(n.op, Constant) and n.id != y.id]
    np.testing.assert_array_equal(folded.op.value.array, c * 2.0)
