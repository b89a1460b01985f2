"""Gradients of every Reduce mode (axis forms, keepdims, full reductions) and
ReduceTo against float64 finite differences (op-reference §3.2, §3.3, §1.2).

The data is tie-free (distinct magnitudes) and has no zeros, so MAX/MIN pick
one element; PRODUCT at zeros and MAX/MIN at ties have their own tests, with
numpy oracles written here.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import NotDifferentiableError
from gradcompiler.ops.reduce import REDUCE_MODES

from helpers import assert_grads

AXES = [0, -1, (0, 2), (-1, 0), (0, 1, 2), None]


@pytest.fixture
def graph():
    with gc.Graph("reduce_grads") as g:
        yield g
    gc.verify(g)


def tie_free(rng, shape) -> np.ndarray:
    """Distinct magnitudes in (0.5, 1.5], random signs: no ties, no zeros."""
    size = int(np.prod(shape))
    magnitudes = 0.5 + (rng.permutation(size) + 1.0) / size
    return (magnitudes * rng.choice([-1.0, 1.0], size)).reshape(shape).astype(np.float32)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("mode", REDUCE_MODES)
def test_first_order(mode, axis, keepdims, graph, rng):
    x = gc.input("x", (2, 3, 4))
    feeds = {"x": tie_free(rng, (2, 3, 4))}
    assert_grads(gc.reduce(mode, x, axis, keepdims), [x], feeds)


@pytest.mark.parametrize("mode", REDUCE_MODES)
def test_reduce_of_a_broadcast_operand(mode, graph, rng):
    # the reduced value feeds a broadcasting product, so g is not all-ones
    x = gc.input("x", (3, 4))
    w = gc.input("w", (4,))
    feeds = {"x": tie_free(rng, (3, 4)), "w": tie_free(rng, (4,))}
    assert_grads(gc.reduce(mode, x * w, 0) * w, [x, w], feeds)


@pytest.mark.parametrize("mode, axis", [("PRODUCT", None), ("PRODUCT", 1), ("SUM_SQR", (0, 2)),
                                        ("MEAN", 1), ("SUM", -1), ("MAX", 1), ("MIN", None)], ids=str)
def test_second_order(mode, axis, graph, rng):
    x = gc.input("x", (2, 3, 4))
    feeds = {"x": tie_free(rng, (2, 3, 4))}
    y = gc.reduce(mode, x, axis)
    # square the (possibly linear) reduction so the second derivative is not identically zero
    gc.check_grads(y * y, [x], feeds, order=2)


def test_full_reduction_gradients_by_hand(graph, rng):
    xv = tie_free(rng, (3, 4)).astype(np.float64)
    x = gc.input("x", (3, 4), "float64")
    grads = [gc.grad(gc.reduce(mode, x), x) for mode in REDUCE_MODES]
    got = dict(zip(REDUCE_MODES, gc.evaluate(grads, x=xv)))
    np.testing.assert_allclose(got["SUM"], np.ones((3, 4)))
    np.testing.assert_allclose(got["MEAN"], np.full((3, 4), 1 / 12))
    np.testing.assert_allclose(got["MAX"], xv == xv.max())
    np.testing.assert_allclose(got["MIN"], xv == xv.min())
    np.testing.assert_allclose(got["PRODUCT"], xv.prod() / xv, rtol=1e-12)
    np.testing.assert_allclose(got["SUM_SQR"], 2 * xv)


def test_max_min_ties_split_the_gradient_evenly(graph):
    x = gc.input("x", (2, 4), "float64")
    xv = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 0.5, 0.5, 0.5]])
    grads = [gc.grad(x.max(axis=1).sum(), x), gc.grad(x.min(axis=1).sum(), x)]
    dmax, dmin = gc.evaluate(grads, x=xv)
    np.testing.assert_array_equal(dmax, [[0, 0.5, 0.5, 0], [1, 0, 0, 0]])
    np.testing.assert_array_equal(dmin, [[0, 0, 0, 1], [0, 1 / 3, 1 / 3, 1 / 3]])


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("mode", ["MAX", "MIN"])
def test_max_min_ties_over_any_axes(mode, axis, keepdims, graph, rng):
    # values on a grid of 3, so most groups hold ties; the oracle shares g among them
    xv = rng.integers(0, 3, (2, 3, 4)).astype(np.float64)
    x = gc.input("x", (2, 3, 4), "float64")
    y = gc.reduce(mode, x, axis, keepdims)
    w = gc.input("w", y.shape, "float64")
    wv = tie_free(rng, w.shape).astype(np.float64)
    got = gc.evaluate(gc.grad((y * w).sum(), x), x=xv, w=wv)
    axes = None if axis is None else (axis if isinstance(axis, tuple) else (axis,))
    g = wv if keepdims or axes is None else np.expand_dims(wv, axes)
    attains = xv == (xv.max if mode == "MAX" else xv.min)(axis=axes, keepdims=True)
    np.testing.assert_allclose(got, g * attains / attains.sum(axis=axes, keepdims=True), rtol=1e-15)
    # each group's gradient sums to its g: a subgradient
    np.testing.assert_allclose(got.sum(axis=axes, keepdims=True), np.broadcast_to(g, attains.sum(
        axis=axes, keepdims=True).shape), rtol=1e-15)


@pytest.mark.parametrize("mode", ["MAX", "MIN"])
def test_max_min_of_a_nan_group_pass_no_gradient_and_make_no_inf(mode, graph):
    # numpy's max of a group with a NaN is NaN; no element equals it, so no element gets g,
    # while the NaN-free row keeps its split
    xv = np.array([[1.0, np.nan, 1.0], [2.0, 2.0, 0.0 if mode == "MAX" else 4.0]])
    x = gc.input("x", (2, 3), "float64")
    got = gc.evaluate(gc.grad(gc.reduce(mode, x, 1).sum(), x), x=xv)
    np.testing.assert_array_equal(got, [[0, 0, 0], [0.5, 0.5, 0]])


def test_sum_over_an_empty_axis_has_a_zero_gradient_of_the_input_shape(graph):
    x = gc.input("x", (0, 3), "float64")
    w = gc.input("w", (3,), "float64")
    loss = (x.sum(axis=0) * w).sum()
    dx, dw = gc.grad(loss, [x, w])
    got_dx, got_dw = gc.evaluate([dx, dw], x=np.zeros((0, 3)), w=np.ones(3))
    assert got_dx.shape == (0, 3)
    np.testing.assert_array_equal(got_dw, np.zeros(3))


def test_integer_reduction_passes_no_gradient(graph):
    x = gc.input("x", (2, 3))
    y = x.astype("int32").sum(axis=1).astype("float32")
    with pytest.raises(NotDifferentiableError):
        gc.grad(y.sum(), x)


@pytest.mark.parametrize("shape, target", [((2, 3, 4), (3, 1)), ((2, 3, 4), (4,)), ((2, 3, 4), ()),
                                           ((2, 3, 4), (1, 3, 4)), ((2, 3, 4), (2, 1, 1))], ids=str)
def test_reduce_to(shape, target, graph, rng):
    x = gc.input("x", shape)
    feeds = {"x": tie_free(rng, shape)}
    y = gc.reduce_to(x, target)
    assert_grads(y, [x], feeds)
    gc.check_grads(y * y, [x], feeds, order=2)


def product_of_others(xv, axis, keepdims):
    """numpy oracle for d prod(x, axis)/dx: each element's group product with that element
    replaced by 1, one element at a time."""
    out = np.empty_like(xv)
    for i in np.ndindex(xv.shape):
        ones_at_i = xv.copy()
        ones_at_i[i] = 1.0
        out[i] = np.broadcast_to(np.prod(ones_at_i, axis=axis, keepdims=True), xv.shape)[i]
    return out


def with_zeros(rng, shape):
    """Tie-free values with zeros planted: one group per reduction holds one zero, another two."""
    xv = tie_free(rng, shape).astype(np.float64)
    xv.flat[[0, 5, 7, 13]] = 0.0
    return xv


@pytest.mark.parametrize("values, want", [([0.0, 2.0, 3.0], [6.0, 0.0, 0.0]),
                                          ([0.0, 2.0, 0.0], [0.0, 0.0, 0.0]),
                                          (0.0, 1.0), ([0.0], [1.0])], ids=str)
def test_product_gradient_where_an_input_is_zero(values, want, graph):
    xv = np.array(values)
    x = gc.input("x", xv.shape, "float64")
    np.testing.assert_array_equal(gc.evaluate(gc.grad(gc.prod(x), x), x=xv), want)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
def test_product_gradient_with_zeros_is_the_product_of_the_others(axis, keepdims, graph, rng):
    xv = with_zeros(rng, (2, 3, 4))
    x = gc.input("x", (2, 3, 4), "float64")
    w = gc.input("w", gc.prod(x, axis, keepdims).shape, "float64")
    wv = tie_free(rng, w.shape).astype(np.float64)
    got = gc.evaluate(gc.grad((gc.prod(x, axis, keepdims) * w).sum(), x), x=xv, w=wv)
    axes = None if axis is None else (axis if isinstance(axis, tuple) else (axis,))
    g = wv if keepdims or axes is None else np.expand_dims(wv, axes)
    np.testing.assert_allclose(got, g * product_of_others(xv, axes, keepdims), rtol=1e-12)


@pytest.mark.parametrize("axis", [None, 1, (0, 2)], ids=str)
@pytest.mark.parametrize("zeros", [0, 1, 2])
def test_product_second_order_with_and_without_zeros(axis, zeros, graph, rng):
    xv = tie_free(rng, (2, 3, 4)).astype(np.float64)
    xv.flat[[0, 13][:zeros]] = 0.0  # flat 0 and 13 share the (0, 2) group and the full one
    x = gc.input("x", (2, 3, 4), "float64")
    w = gc.input("w", gc.prod(x, axis).shape, "float64")
    feeds = {"x": xv, "w": tie_free(rng, w.shape).astype(np.float64)}
    gc.check_grads((gc.prod(x, axis) * w).sum(), [x, w], feeds, order=2)
