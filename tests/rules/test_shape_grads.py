"""Gradients of the shape ops (Reshape, Broadcast, AddAxis, RemoveAxis,
Transpose, Concat, FastpathCopy, PixelShuffle, PixelShuffleBackward) against
float64 finite differences, and the seed's RemoveAxis defect staying fixed
(op-reference §4.3).
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.ops.shape import (
    AddAxis,
    FastpathCopy,
    PixelShuffle,
    PixelShuffleBackward,
    RemoveAxis,
)

from helpers import assert_grads


@pytest.fixture
def graph():
    with gc.Graph("shape_grads") as g:
        yield g
    gc.verify(g)


def _input(rng, shape, name="x"):
    return gc.input(name, shape), {name: rng.standard_normal(shape).astype(np.float32)}


def _check(y, x, feeds):
    """First order, and second order of y·y (the shape ops are linear)."""
    assert_grads(y, [x], feeds)
    gc.check_grads(y * y, [x], feeds, order=2)


@pytest.mark.parametrize("target", [(4, 6), (-1,), (2, 12), (1, 24, 1)], ids=str)
def test_reshape(target, graph, rng):
    x, feeds = _input(rng, (2, 3, 4))
    _check(gc.reshape(x, target), x, feeds)


@pytest.mark.parametrize("shape, target", [((3, 1), (2, 3, 4)), ((4,), (3, 4)), ((), (2, 3)),
                                           ((1, 1), (1, 5)), ((2, 1, 3), (2, 4, 3))], ids=str)
def test_broadcast(shape, target, graph, rng):
    x, feeds = _input(rng, shape)
    _check(gc.broadcast_to(x, target), x, feeds)


@pytest.mark.parametrize("axis", [0, -1, (0, 2), (1, 3)], ids=str)
def test_add_axis(axis, graph, rng):
    x, feeds = _input(rng, (2, 3))
    _check(gc.expand_dims(x, axis), x, feeds)


@pytest.mark.parametrize("axes, shape, positions", [
    ((2, 0), (1, 2, 3, 1), (0, 3)), ((0, 0), (1, 1, 2, 3), (0, 1)), ((2, 0, 1), (1, 1, 2, 3, 1), (0, 1, 4)),
], ids=str)
def test_add_axis_in_list_order(axes, shape, positions, graph, rng):
    # the op inserts one position after another (op-reference §4.2), in any order
    x, feeds = _input(rng, (2, 3))
    y = gc.apply(AddAxis(axes), x)
    assert y.shape == shape and y.node.op.inserted_positions(2) == positions
    _check(y, x, feeds)


@pytest.mark.parametrize("shape, axis", [((1, 5, 1, 7), (0, 2)), ((1, 5, 1, 7), None), ((3, 1, 1), (1, 2)),
                                         ((2, 1, 3, 1), (3, 1)), ((1,), 0)], ids=str)
def test_remove_axis(shape, axis, graph, rng):
    x, feeds = _input(rng, shape)
    _check(gc.squeeze(x, axis), x, feeds)


def test_remove_axis_in_list_order(graph, rng):
    # each index refers to the tensor as it is at that step (op-reference §4.3)
    x, feeds = _input(rng, (1, 5, 1, 7))
    y = gc.apply(RemoveAxis((2, 0)), x)
    assert y.shape == (5, 7) and y.node.op.original_positions(4) == (0, 2)
    _check(y, x, feeds)


def test_seed_remove_axis_defect_stays_fixed(graph, rng):
    # squeezing axes 0 and 2 of (1, 5, 1, 7) passes r = [0, 1]; the seed's rule re-inserted
    # at r and built a (1, 1, 5, 7) gradient
    x, feeds = _input(rng, (1, 5, 1, 7))
    y = gc.squeeze(x, (0, 2))
    assert y.node.op == RemoveAxis((0, 1)) and y.shape == (5, 7)
    u = gc.input("u", (5, 7))
    dx = gc.vjp(y, x, u)
    assert dx.shape == (1, 5, 1, 7)
    uv = rng.standard_normal((5, 7)).astype(np.float32)
    np.testing.assert_array_equal(gc.evaluate(dx, u=uv), uv.reshape(1, 5, 1, 7))
    _check(y, x, feeds)


@pytest.mark.parametrize("perm", [(2, 0, 1), (1, 0, 2), None], ids=str)
def test_transpose(perm, graph, rng):
    x, feeds = _input(rng, (2, 3, 4))
    _check(gc.transpose(x, perm), x, feeds)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis, graph, rng):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for s, extra in zip(shapes, (1, 2, 3)):
        s[axis] = extra
    xs = [gc.input(f"x{i}", s) for i, s in enumerate(shapes)]
    feeds = {f"x{i}": rng.standard_normal(s).astype(np.float32) for i, s in enumerate(shapes)}
    y = gc.concat(xs, axis)
    assert_grads(y, xs, feeds)
    gc.check_grads(y * y, xs, feeds, order=2)


def test_concat_of_one_input_used_twice(graph, rng):
    x, feeds = _input(rng, (2, 3))
    y = gc.concat([x, x * 2.0], 0)
    assert_grads(y, [x], feeds)
    dx = gc.grad(y.sum(), x)
    np.testing.assert_array_equal(gc.evaluate(dx, feeds), np.full((2, 3), 3.0, np.float32))


def test_fastpath_copy(graph, rng):
    x, feeds = _input(rng, (2, 3))
    _check(gc.apply(FastpathCopy(), x), x, feeds)


@pytest.mark.parametrize("shape", [(1, 8, 2, 3), (2, 4, 1, 2), (4, 3, 2)], ids=str)
def test_pixel_shuffle_pair(shape, graph, rng):
    x, feeds = _input(rng, shape)
    _check(gc.apply(PixelShuffle(2), x), x, feeds)
    *lead, c, h, w = shape
    z, z_feeds = _input(rng, (*lead, c // 4, h * 2, w * 2), "z")
    _check(gc.apply(PixelShuffleBackward(2), z), z, z_feeds)
