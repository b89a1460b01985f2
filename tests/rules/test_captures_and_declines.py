"""What each rule reads of the forward pass (op-reference §10, the summary
table), and the decline path: the seed's Elemwise and Reduce rules return
None for what they do not handle and the generic rule takes over.

Forward values are built from non-placeholder nodes (A = tanh(a), ...), so a
backward node reading one is a visible capture: `captured_values` counts
reads of `forward` nodes, restricted here to the backward nodes built by the
rule of the node under test.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.ops.elemwise import Elemwise
from gradcompiler.ops.reduce import Reduce
from gradcompiler.ops.shape import FastpathCopy, PixelShuffle
from gradcompiler.rules import ForwardNode
from gradcompiler.rules.registry import rule_of

from helpers import backward_nodes_of, captured_values


@pytest.fixture
def graph():
    with gc.Graph("captures") as g:
        yield g
    gc.verify(g)


def forward_value(name, shape, dtype="float64"):
    """tanh of a placeholder: a forward node whose reads count as captures."""
    return gc.tanh(gc.input(name, shape, dtype))


def rule_captures(y, wrt, builds_nodes: bool = True) -> set[int]:
    """Forward values read by the backward nodes that y's rule builds when differentiating
    sum(y) with respect to `wrt` (placeholders upstream of y)."""
    gc.grad(y.sum(), wrt)
    graph = y.graph
    built = backward_nodes_of(graph, y.id)
    assert bool(built) == builds_nodes, f"the rule built {len(built)} nodes"
    return captured_values(graph, built)


def placeholder_of(t):
    return gc.Tensor(t.graph, t.node.inputs[0])


# -- matrix products: each operand's gradient reads only the other operand ----------

@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matrix_mul_reads_only_the_other_operand(ta, tb, graph):
    A = forward_value("a", (4, 3) if ta else (3, 4))
    B = forward_value("b", (5, 4) if tb else (4, 5))
    y = gc.matmul(A, B, transpose_a=ta, transpose_b=tb)
    assert rule_captures(y, [placeholder_of(A)]) == {B.id}


@pytest.mark.parametrize("ta, tb", [(False, False), (True, True)])
def test_matrix_mul_weight_gradient_reads_only_a(ta, tb, graph):
    A = forward_value("a", (4, 3) if ta else (3, 4))
    B = forward_value("b", (5, 4) if tb else (4, 5))
    y = gc.matmul(A, B, transpose_a=ta, transpose_b=tb)
    assert rule_captures(y, [placeholder_of(B)]) == {A.id}


def test_matrix_mul_both_gradients_read_both_operands_never_the_output(graph):
    A, B = forward_value("a", (3, 4)), forward_value("b", (4, 5))
    y = A @ B
    captured = rule_captures(y, [placeholder_of(A), placeholder_of(B)])
    assert captured == {A.id, B.id} and y.id not in captured


def test_rows_regime_reads_only_the_other_operand(graph):
    A, B = forward_value("a", (2, 3, 4)), forward_value("b", (4, 5))
    y = A @ B
    assert rule_captures(y, [placeholder_of(A)]) == {B.id}


def test_batched_matrix_mul_reads_only_the_other_operand(graph):
    A, B = forward_value("a", (2, 3, 4)), forward_value("b", (1, 4, 5))
    y = A @ B
    assert rule_captures(y, [placeholder_of(A)]) == {B.id}


def test_batched_matrix_mul_weight_gradient_reads_only_a(graph):
    A, B = forward_value("a", (2, 3, 4)), forward_value("b", (1, 4, 5))
    y = A @ B
    assert rule_captures(y, [placeholder_of(B)]) == {A.id}


# -- ops that read nothing ------------------------------------------------------------

READ_NOTHING = {  # name -> (shape of A, y(A, B), whether B needs a gradient too); B is (4,) or (3, 4)
    "add": ((3, 1), lambda A, B: A + B, True),
    "sub": ((3, 1), lambda A, B: A - B, True),
    "negate": ((3, 4), lambda A, B: -A, False),
    "sum_axis": ((3, 4), lambda A, B: gc.sum(A, axis=1), False),
    "sum_axes_keepdims": ((3, 4), lambda A, B: gc.sum(A, axis=(0, 1), keepdims=True), False),
    "mean": ((3, 4), lambda A, B: gc.mean(A, axis=0), False),
    "reshape": ((3, 4), lambda A, B: gc.reshape(A, (12,)), False),
    "broadcast": ((3, 1), lambda A, B: gc.broadcast_to(A, (2, 3, 4)), False),
    "add_axis": ((3, 4), lambda A, B: gc.expand_dims(A, (0, 2)), False),
    "remove_axis": ((1, 4), lambda A, B: gc.squeeze(A, 0), False),
    "transpose": ((3, 4), lambda A, B: gc.transpose(A), False),
    "fastpath_copy": ((3, 4), lambda A, B: gc.apply(FastpathCopy(), A), False),
    "pixel_shuffle": ((1, 4, 2, 2), lambda A, B: gc.apply(PixelShuffle(2), A), False),
    "concat": ((3, 4), lambda A, B: gc.concat([A, B], 0), True),
    "reduce_to": ((3, 4), lambda A, B: gc.reduce_to(A, (1, 4)), False),
}


@pytest.mark.parametrize("name", sorted(READ_NOTHING))
def test_rule_reads_no_forward_value(name, graph):
    shape, build, b_needs_grad = READ_NOTHING[name]
    A = forward_value("a", shape)
    B = forward_value("b", (3, 4) if name == "concat" else (4,))
    y = build(A, B)
    wrt = [placeholder_of(A)] + ([placeholder_of(B)] if b_needs_grad else [])
    # FastpathCopy's gradient is g itself: no node at all
    assert rule_captures(y, wrt, builds_nodes=name != "fastpath_copy") == set()


# -- ops that read their output, their input, or a mask ---------------------------------

@pytest.mark.parametrize("fn", [gc.exp, gc.tanh, gc.sigmoid, gc.relu, gc.rsqrt], ids=lambda f: f.__name__)
def test_rule_reads_its_output_only(fn, graph):
    A = gc.exp(gc.input("a", (3, 4), "float64"))  # positive, for rsqrt
    y = fn(A)
    assert rule_captures(y, [placeholder_of(A)]) == {y.id}


@pytest.mark.parametrize("fn", [gc.log, gc.sqrt, gc.sin, gc.cos, gc.abs, gc.gelu, gc.softplus, gc.erf,
                                gc.log1p, gc.expm1], ids=lambda f: f.__name__)
def test_rule_reads_its_input_only(fn, graph):
    A = gc.exp(gc.input("a", (3, 4), "float64"))
    y = fn(A)
    assert rule_captures(y, [placeholder_of(A)]) == {A.id}


def test_mul_reads_the_other_input(graph):
    A, B = forward_value("a", (3, 4)), forward_value("b", (4,))
    y = A * B
    assert rule_captures(y, [placeholder_of(A)]) == {B.id}


def test_pow_wrt_exponent_reads_output_and_base(graph):
    A, B = gc.exp(gc.input("a", (3, 4), "float64")), forward_value("b", (4,))
    y = gc.power(A, B)
    assert rule_captures(y, [placeholder_of(B)]) == {y.id, A.id}


def test_where_reads_the_mask_only(graph):
    A, B = forward_value("a", (3, 4)), forward_value("b", (3, 4))
    mask = A < B
    y = gc.where(mask, A, B)
    assert rule_captures(y, [placeholder_of(A), placeholder_of(B)]) == {mask.id}


@pytest.mark.parametrize("mode, reads", [("MAX", {"x", "y"}), ("MIN", {"x", "y"}),
                                         ("PRODUCT", {"x"}),
                                         ("SUM_SQR", {"x"}), ("MEAN", set()), ("SUM", set())])
def test_reduce_reads(mode, reads, graph):
    A = forward_value("a", (3, 4))
    y = gc.reduce(mode, A, 1)
    ids = {"x": A.id, "y": y.id}
    assert rule_captures(y, [placeholder_of(A)]) == {ids[r] for r in reads}


# -- the decline path -------------------------------------------------------------------

def _forward_node(t) -> ForwardNode:
    return ForwardNode(t.graph, t.node)


def test_seed_elemwise_rule_declines_mul_and_the_generic_rule_is_right(graph, rng):
    a, b = gc.input("a", (3, 1), "float64"), gc.input("b", (4,), "float64")
    A, B = gc.tanh(a), gc.tanh(b)
    y = A * B
    g = gc.input("g", (3, 4), "float64")
    size = len(graph)
    assert rule_of(Elemwise)(_forward_node(y), g, (True, True)) is None
    assert len(graph) == size, "a declining rule builds nothing"
    da, db = rule_of(Elemwise, generic=True)(_forward_node(y), g, (True, True))
    av, bv, gv = rng.standard_normal((3, 1)), rng.standard_normal(4), rng.standard_normal((3, 4))
    got_da, got_db = gc.evaluate([da, db], a=av, b=bv, g=gv)
    np.testing.assert_allclose(got_da, (gv * np.tanh(bv)).sum(1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(got_db, (gv * np.tanh(av)).sum(0), rtol=1e-12)
    gc.check_grads(y, [a, b], {"a": av, "b": bv})


def test_seed_elemwise_rule_handles_add(graph, rng):
    a, b = gc.input("a", (3, 1), "float64"), gc.input("b", (4,), "float64")
    y = gc.tanh(a) + gc.tanh(b)
    g = gc.input("g", (3, 4), "float64")
    da, db = rule_of(Elemwise)(_forward_node(y), g, (True, True))
    gv = rng.standard_normal((3, 4))
    got_da, got_db = gc.evaluate([da, db], g=gv)
    np.testing.assert_allclose(got_da, gv.sum(1, keepdims=True), rtol=1e-12)
    np.testing.assert_allclose(got_db, gv.sum(0), rtol=1e-12)
    only_b = rule_of(Elemwise)(_forward_node(y), g, (False, True))
    assert only_b[0] is None and only_b[1] is not None


DECLINED_REDUCTIONS = {
    "mean_axis": (lambda x: gc.mean(x, axis=1), lambda xv, gv: np.broadcast_to(gv[:, None] / 4, xv.shape)),
    "max_axis": (lambda x: gc.max(x, axis=1), lambda xv, gv: (xv == xv.max(1, keepdims=True)) * gv[:, None]),
    "sum_all": (lambda x: gc.sum(x), lambda xv, gv: np.broadcast_to(gv, xv.shape)),
}


@pytest.mark.parametrize("name", sorted(DECLINED_REDUCTIONS))
def test_seed_reduce_rule_declines_and_the_generic_rule_is_right(name, graph, rng):
    build, oracle = DECLINED_REDUCTIONS[name]
    x = gc.input("x", (3, 4), "float64")
    y = build(gc.tanh(x))
    assert isinstance(y.node.op, Reduce)
    g = gc.input("g", y.shape, "float64")
    size = len(graph)
    assert rule_of(Reduce)(_forward_node(y), g, (True,)) is None
    assert len(graph) == size
    (dx,) = rule_of(Reduce, generic=True)(_forward_node(y), g, (True,))
    xv = rng.permutation(12).reshape(3, 4) / 6.0 - 1.0  # tie-free
    gv = rng.standard_normal(y.shape)
    got = gc.evaluate(dx, {"x": xv, "g": gv})
    np.testing.assert_allclose(got, oracle(np.tanh(xv), gv), rtol=1e-12)
    gc.check_grads(y, [x], {"x": xv})


def test_seed_reduce_rule_handles_sum_over_axes(graph, rng):
    x = gc.input("x", (2, 3, 4), "float64")
    y = gc.sum(gc.tanh(x), axis=(0, 2))
    g = gc.input("g", (3,), "float64")
    (dx,) = rule_of(Reduce)(_forward_node(y), g, (True,))
    gv = rng.standard_normal(3)
    np.testing.assert_allclose(gc.evaluate(dx, g=gv), np.broadcast_to(gv[None, :, None], (2, 3, 4)))
    gc.check_grads(y, [x], {"x": rng.standard_normal((2, 3, 4))})
