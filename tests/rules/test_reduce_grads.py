"""Gradients of every Reduce mode (axis forms, keepdims, full reductions) and
ReduceTo against float64 finite differences (op-reference §3.2, §3.3, §1.2).

The data is tie-free (distinct magnitudes) and has no zeros, so MAX/MIN pick
one element and PRODUCT's g·y/x is defined.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers import assert_grads

import gradcompiler as gc
from gradcompiler.errors import NotDifferentiableError
from gradcompiler.ops.reduce import REDUCE_MODES

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


def test_max_min_ties_give_every_tied_element_the_gradient(graph):
    # op-reference §3.3: every tied element gets the full g (not split)
    x = gc.input("x", (2, 3), "float64")
    xv = np.array([[1.0, 3.0, 3.0], [2.0, 0.5, 0.5]])
    dmax, dmin = gc.evaluate([gc.grad(x.max(axis=1).sum(), x), gc.grad(x.min(axis=1).sum(), x)], x=xv)
    np.testing.assert_array_equal(dmax, [[0, 1, 1], [1, 0, 0]])
    np.testing.assert_array_equal(dmin, [[1, 0, 0], [0, 1, 1]])


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
