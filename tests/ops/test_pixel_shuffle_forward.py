"""gc.pixel_shuffle / gc.pixel_unshuffle (PixelShuffle, PixelShuffleBackward; op-reference
§4.4): values against explicit loops over the sub-pixel offsets, gradients by finite
differences.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc

COVERS = {"PixelShuffle", "PixelShuffleBackward"}


def shuffle_loop(x, r):
    """out[..., c, h*r + i, w*r + j] = in[..., c*r*r + i*r + j, h, w]."""
    *lead, crr, h, w = x.shape
    out = np.zeros((*lead, crr // (r * r), h * r, w * r), x.dtype)
    for c in range(crr // (r * r)):
        for i in range(r):
            for j in range(r):
                out[..., c, i::r, j::r] = x[..., c * r * r + i * r + j, :, :]
    return out


def unshuffle_loop(y, r):
    """The same map read the other way: x[..., c*r*r + i*r + j, h, w] = y[..., c, h*r + i, w*r + j]."""
    *lead, c_out, hr, wr = y.shape
    x = np.zeros((*lead, c_out * r * r, hr // r, wr // r), y.dtype)
    for c in range(c_out):
        for i in range(r):
            for j in range(r):
                x[..., c * r * r + i * r + j, :, :] = y[..., c, i::r, j::r]
    return x


SHAPES = [((8, 2, 3), 2), ((2, 8, 2, 3), 2), ((2, 1, 18, 2, 1), 3), ((1, 3, 2, 2), 1)]


@pytest.mark.parametrize("shape, r", SHAPES)
def test_pixel_shuffle_matches_the_loop(rng, shape, r):
    x = rng.standard_normal(shape)
    with gc.Graph("shuffle") as g:
        xi = gc.input("x", shape, "float64")
        y = gc.pixel_shuffle(xi, r)
    gc.verify(g)
    *lead, c, h, w = shape
    assert y.shape == (*lead, c // (r * r), h * r, w * r)
    np.testing.assert_array_equal(gc.evaluate(y, x=x), shuffle_loop(x, r))


def test_pixel_shuffle_channel_order_by_hand():
    # four channels of one pixel become a 2 x 2 block, row-major: i is the slower index
    x = np.arange(4.0).reshape(1, 4, 1, 1)
    with gc.Graph("by_hand"):
        y = gc.pixel_shuffle(gc.input("x", (1, 4, 1, 1), "float64"), 2)
    np.testing.assert_array_equal(gc.evaluate(y, x=x), [[[[0.0, 1.0], [2.0, 3.0]]]])


@pytest.mark.parametrize("shape, r", SHAPES)
def test_pixel_unshuffle_matches_the_loop_and_inverts_shuffle(rng, shape, r):
    *lead, c, h, w = shape
    out_shape = (*lead, c // (r * r), h * r, w * r)
    y = rng.standard_normal(out_shape)
    with gc.Graph("unshuffle") as g:
        yi = gc.input("y", out_shape, "float64")
        x = gc.pixel_unshuffle(yi, r)
        back = gc.pixel_shuffle(x, r)
    gc.verify(g)
    x_v, back_v = gc.evaluate([x, back], y=y)
    np.testing.assert_array_equal(x_v, unshuffle_loop(y, r))
    np.testing.assert_array_equal(back_v, y)


@pytest.mark.parametrize("shape, r", SHAPES[:3])
def test_pixel_shuffle_and_unshuffle_grads(rng, shape, r):
    with gc.Graph("shuffle_grads") as g:
        x = gc.input("x", shape, "float32")
        y = gc.pixel_shuffle(x, r)
        z = gc.pixel_unshuffle(gc.tanh(y) * y, r)
    gc.check_grads([y, z], [x], dict(x=rng.standard_normal(shape).astype(np.float32)), rtol=1e-6)
    gc.check_grads(z, [x], dict(x=rng.standard_normal(shape).astype(np.float32)), order=2, rtol=1e-6)
    gc.verify(g)


@pytest.mark.parametrize("fn, shape, factor, words", [
    (gc.pixel_shuffle, (2, 6, 3, 3), 2, "divisible by 4"),
    (gc.pixel_shuffle, (4, 3), 2, "rank >= 3"),
    (gc.pixel_shuffle, (2, 4, 3, 3), 0, "positive int"),
    (gc.pixel_unshuffle, (2, 1, 4, 5), 2, "divisible by 2"),
    (gc.pixel_unshuffle, (2, 1, 4, 4), 1.5, "positive int"),
])
def test_pixel_shuffle_shape_errors(fn, shape, factor, words):
    with gc.Graph("errors"):
        x = gc.input("x", shape)
        with pytest.raises(gc.ShapeError, match=words) as info:
            fn(x, factor)
    assert __file__ in info.value.site
