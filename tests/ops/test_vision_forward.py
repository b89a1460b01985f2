"""Forward values of WarpAffine, WarpPerspective and WarpPerspectiveBackwardData,
and the build- and run-time errors of the warp family.

Oracles: hand computations from the border table of op-reference §9.2, and
a direct per-pixel bilinear loop written here in plain Python.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.ops.vision import (
    WarpAffine,
    WarpPerspective,
    WarpPerspectiveBackwardData,
    WarpPerspectiveBackwardMat,
)

COVERS = {"WarpAffine", "WarpPerspective", "WarpPerspectiveBackwardData", "WarpPerspectiveBackwardMat"}

MODES = ("replicate", "reflect", "reflect_101", "wrap", "constant")


# -- the independent oracle ---------------------------------------------------------------------

def border_map(p: int, length: int, mode: str) -> int | None:
    """The table of §9.2 for one integer tap; None for a CONSTANT tap outside the image."""
    if 0 <= p < length:
        return p
    if mode == "replicate":
        return min(max(p, 0), length - 1)
    if mode == "constant":
        return None
    if mode == "wrap":
        return p % length
    if length == 1:
        return 0
    while not 0 <= p < length:
        if mode == "reflect":
            p = -p - 1 if p < 0 else 2 * length - 1 - p
        else:
            p = -p if p < 0 else 2 * length - 2 - p
    return p


def warp_loop(src_nchw, mat3, out_hw, mode, border_val=0.0, mat_idx=None):
    """out[n, c, oh, ow] by a per-pixel loop over §9.2, in float64."""
    src_nchw = np.asarray(src_nchw, np.float64)
    n_mat = mat3.shape[0]
    _, channels, ih, iw = src_nchw.shape
    out = np.zeros((n_mat, channels, *out_hw))
    for n in range(n_mat):
        image = src_nchw[n if mat_idx is None else mat_idx[n]]
        m = [float(v) for v in mat3[n].ravel()]
        for oh in range(out_hw[0]):
            for ow in range(out_hw[1]):
                den = m[6] * ow + m[7] * oh + m[8]
                xs = (m[0] * ow + m[1] * oh + m[2]) / den
                ys = (m[3] * ow + m[4] * oh + m[5]) / den
                x0, y0 = math.floor(xs), math.floor(ys)
                ax, ay = xs - x0, ys - y0
                for c in range(channels):
                    total = 0.0
                    for dy, wy in ((0, 1 - ay), (1, ay)):
                        for dx, wx in ((0, 1 - ax), (1, ax)):
                            r, q = border_map(y0 + dy, ih, mode), border_map(x0 + dx, iw, mode)
                            value = border_val if r is None or q is None else image[c, r, q]
                            total += wy * wx * value
                    out[n, c, oh, ow] = total
    return out


def to_nhwc(x):
    return np.ascontiguousarray(x.transpose(0, 2, 3, 1))


def to_nchw(x):
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def homogeneous(mat2):
    return np.concatenate([mat2, np.tile([[[0.0, 0.0, 1.0]]], (mat2.shape[0], 1, 1))], axis=1)


def run_affine(src, mat, out_hw, mode="replicate", border_val=0.0, fmt="NHWC"):
    with gc.Graph("affine") as g:
        s = gc.input("src", src.shape, src.dtype)
        m = gc.input("mat", mat.shape, mat.dtype)
        y = gc.warp_affine(s, m, out_hw, border_mode=mode, border_val=border_val, format=fmt)
    gc.verify(g)
    return gc.evaluate(y, src=src, mat=mat)


def run_perspective(src, mat, out_hw, mode="replicate", border_val=0.0, fmt="NCHW", mat_idx=None):
    with gc.Graph("perspective") as g:
        s = gc.input("src", src.shape, src.dtype)
        m = gc.input("mat", mat.shape, mat.dtype)
        feeds = dict(src=src, mat=mat)
        idx = None
        if mat_idx is not None:
            idx = gc.input("idx", mat_idx.shape, mat_idx.dtype)
            feeds["idx"] = mat_idx
        y = gc.warp_perspective(s, m, out_hw, mat_idx=idx, border_mode=mode,
                                border_val=border_val, format=fmt)
    gc.verify(g)
    return gc.evaluate(y, feeds)


def random_perspective(rng, n, scale=0.15):
    mat = np.eye(3) + scale * rng.standard_normal((n, 3, 3))
    mat[:, 0, 2] += rng.uniform(-2, 2, n)
    mat[:, 1, 2] += rng.uniform(-2, 2, n)
    mat[:, 2, :2] = rng.uniform(-0.04, 0.04, (n, 2))
    mat[:, 2, 2] = rng.uniform(0.9, 1.1, n)
    return mat


# -- simple geometry ------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
def test_identity_leaves_the_image_unchanged(rng, mode):
    src = rng.standard_normal((2, 5, 6, 3))
    out = run_affine(src, np.tile(np.eye(2, 3), (2, 1, 1)), (5, 6), mode, border_val=9.0)
    np.testing.assert_array_equal(out, src)
    src_nchw = to_nchw(src)
    out = run_perspective(src_nchw, np.tile(np.eye(3), (2, 1, 1)), (5, 6), mode, border_val=9.0)
    np.testing.assert_array_equal(out, src_nchw)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_integer_translation_shifts_up_left(rng, dtype):
    src = rng.standard_normal((2, 3, 5, 6)).astype(dtype)
    mat = np.tile(np.array([[1.0, 0, 1], [0, 1, 1]], dtype), (2, 1, 1))
    out = run_affine(src, mat, (5, 6), fmt="NCHW")
    assert out.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(out[:, :, :4, :5], src[:, :, 1:, 1:])
    # replicate: the last row and column repeat the edge
    np.testing.assert_array_equal(out[:, :, 4, :5], src[:, :, 4, 1:])
    np.testing.assert_array_equal(out[:, :, :4, 5], src[:, :, 1:, 5])


# -- border modes by hand (§9.2 table) ---------------------------------------------------------

B = -7.0
# src = [[1, 2, 3], [4, 5, 6]]; out[h, w] reads the integer tap (row h - 1, column w - 2)
HAND = {
    # rows 0 0 [0 1] 1, columns 0 0 [0 1 2] 2 2
    "replicate": [[1, 1, 1, 2, 3, 3, 3], [1, 1, 1, 2, 3, 3, 3], [4, 4, 4, 5, 6, 6, 6], [4, 4, 4, 5, 6, 6, 6]],
    # rows 0 [0 1] 1, columns b a [a b c] c b
    "reflect": [[2, 1, 1, 2, 3, 3, 2], [2, 1, 1, 2, 3, 3, 2], [5, 4, 4, 5, 6, 6, 5], [5, 4, 4, 5, 6, 6, 5]],
    # rows 1 [0 1] 0, columns c b [a b c] b a
    "reflect_101": [[6, 5, 4, 5, 6, 5, 4], [3, 2, 1, 2, 3, 2, 1], [6, 5, 4, 5, 6, 5, 4], [3, 2, 1, 2, 3, 2, 1]],
    # rows 1 [0 1] 0, columns b c [a b c] a b
    "wrap": [[5, 6, 4, 5, 6, 4, 5], [2, 3, 1, 2, 3, 1, 2], [5, 6, 4, 5, 6, 4, 5], [2, 3, 1, 2, 3, 1, 2]],
    "constant": [[B] * 7, [B, B, 1, 2, 3, B, B], [B, B, 4, 5, 6, B, B], [B] * 7],
}

# sampling at (x = -0.5, y = 0): half of tap column -1, half of column 0 (= 1), in row 0
HALF_LEFT = {"replicate": 1.0, "reflect": 1.0, "reflect_101": 0.5 * 2 + 0.5 * 1,
             "wrap": 0.5 * 3 + 0.5 * 1, "constant": 0.5 * B + 0.5 * 1}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_border_modes_match_the_table(mode, fmt):
    image = np.array([[[[1.0, 2, 3], [4, 5, 6]]]])  # NCHW (1, 1, 2, 3)
    src = image if fmt == "NCHW" else to_nhwc(image)
    out = run_affine(src, np.array([[[1.0, 0, -2], [0, 1, -1]]]), (4, 7), mode, border_val=B, fmt=fmt)
    out = out if fmt == "NCHW" else to_nchw(out)
    np.testing.assert_array_equal(out[0, 0], np.array(HAND[mode]))
    half = run_affine(src, np.array([[[1.0, 0, -0.5], [0, 1, 0]]]), (1, 1), mode, border_val=B, fmt=fmt)
    assert half.ravel()[0] == pytest.approx(HALF_LEFT[mode], abs=1e-15)


@pytest.mark.parametrize("mode", MODES)
def test_size_one_image_and_far_away_taps_match_the_loop(rng, mode):
    for shape in [(1, 2, 1, 1), (1, 2, 1, 4), (1, 2, 3, 2)]:
        src = rng.standard_normal(shape)
        mat = np.array([[[1.1, 0.2, 37.3], [-0.1, 0.9, -55.6], [0, 0, 1]]])
        out = run_perspective(src, mat, (3, 4), mode, border_val=0.25)
        np.testing.assert_allclose(out, warp_loop(src, mat, (3, 4), mode, 0.25), rtol=1e-12, atol=1e-12)


# -- random matrices against the per-pixel loop -----------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_warp_affine_matches_the_loop(rng, mode, fmt, dtype):
    src = rng.standard_normal((2, 3, 5, 6))
    mat = np.eye(2, 3) + 0.3 * rng.standard_normal((2, 2, 3))
    mat[:, :, 2] += rng.uniform(-2, 2, (2, 2))
    expected = warp_loop(src, homogeneous(mat), (4, 7), mode, 0.5)
    feed = src if fmt == "NCHW" else to_nhwc(src)
    out = run_affine(feed.astype(dtype), mat.astype(dtype), (4, 7), mode, 0.5, fmt)
    out = out if fmt == "NCHW" else to_nchw(out)
    tol = 1e-12 if dtype == "float64" else 1e-4
    np.testing.assert_allclose(out, expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
@pytest.mark.parametrize("with_idx", [False, True])
def test_warp_perspective_matches_the_loop(rng, mode, fmt, with_idx):
    src = rng.standard_normal((2, 3, 5, 6))
    mat_idx = np.array([1, 0, 1], np.int32) if with_idx else None
    mat = random_perspective(rng, 3 if with_idx else 2)
    expected = warp_loop(src, mat, (4, 7), mode, -0.3, mat_idx)
    feed = src if fmt == "NCHW" else to_nhwc(src)
    out = run_perspective(feed, mat, (4, 7), mode, -0.3, fmt, mat_idx)
    out = out if fmt == "NCHW" else to_nchw(out)
    np.testing.assert_allclose(out, expected, rtol=1e-12, atol=1e-12)


def test_float32_perspective_matches_the_loop(rng):
    src = rng.standard_normal((2, 3, 5, 6)).astype(np.float32)
    mat = random_perspective(rng, 2).astype(np.float32)
    out = run_perspective(src, mat, (4, 7), "reflect_101")
    assert out.dtype == np.float32
    expected = warp_loop(src, mat.astype(np.float64), (4, 7), "reflect_101")
    np.testing.assert_allclose(out, expected, atol=1e-4)


# -- non-finite coordinates and values ---------------------------------------------------------

def test_zero_denominator_gives_border_val_in_constant_mode_and_nan_otherwise(rng):
    src = rng.standard_normal((1, 2, 3, 4))
    mat = np.array([[[1.0, 0, 0], [0, 1, 0], [0, 0, 0]]])  # den = 0 everywhere
    constant = run_perspective(src, mat, (2, 3), "constant", 0.75)
    np.testing.assert_array_equal(constant, np.full((1, 2, 2, 3), 0.75))
    assert np.isnan(run_perspective(src, mat, (2, 3), "replicate")).all()
    g = np.ones((1, 2, 2, 3))
    with gc.Graph("bad") as graph:
        s, m, gi = (gc.input(k, v.shape, v.dtype) for k, v in (("s", src), ("m", mat), ("g", g)))
        data = gc.apply(WarpPerspectiveBackwardData(src.shape, "constant", 0.75, "NCHW"), m, gi)
        dmat = gc.apply(WarpPerspectiveBackwardMat("constant", 0.75, "NCHW"), s, m, gi)
    gc.verify(graph)
    data_v, dmat_v = gc.evaluate([data, dmat], s=src, m=mat, g=g)
    np.testing.assert_array_equal(data_v, 0)
    np.testing.assert_array_equal(dmat_v, 0)


def test_constant_mode_replaces_a_non_finite_result(rng):
    src = rng.standard_normal((1, 1, 3, 4))
    src[0, 0, 1, 2] = np.inf
    eye = np.eye(3)[None]
    out = run_perspective(src, eye, (3, 4), "constant", border_val=-1.5)
    # every pixel with the inf among its four taps is non-finite (inf, or 0 * inf = NaN)
    expected = src.copy()
    expected[0, 0, 0:2, 1:3] = -1.5
    np.testing.assert_array_equal(out, expected)
    replicate = run_perspective(src, eye, (3, 4), "replicate")
    assert np.isinf(replicate[0, 0, 1, 2]) and np.isnan(replicate[0, 0, 0, 1])


# -- BackwardData is the adjoint of the forward ------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
@pytest.mark.parametrize("with_idx", [False, True])
@pytest.mark.parametrize("channels", [1, 3, 6])
def test_backward_data_is_the_adjoint(rng, mode, fmt, with_idx, channels):
    """<warp(x), y> = <x, BackwardData(y)>, and the compiled calls equal the reference's. The
    channel counts fill the image gradient's groups of four partly, almost, and one and a half
    times (`_scatter_row`)."""
    n_src, n_mat = 2, (3 if with_idx else 2)
    mat = random_perspective(rng, n_mat, scale=0.3)
    src_shape = (n_src, channels, 5, 6) if fmt == "NCHW" else (n_src, 5, 6, channels)
    out_shape = (n_mat, channels, 4, 7) if fmt == "NCHW" else (n_mat, 4, 7, channels)
    x, y = rng.standard_normal(src_shape), rng.standard_normal(out_shape)
    feeds = dict(x=x, y=y, mat=mat)
    with gc.Graph("adjoint") as g:
        xi, yi = gc.input("x", src_shape, "float64"), gc.input("y", out_shape, "float64")
        mi = gc.input("mat", mat.shape, "float64")
        extra = ()
        if with_idx:
            feeds["idx"] = np.array([1, 1, 0], np.int64)
            extra = (gc.input("idx", (3,), "int64"),)
        warped = gc.apply(WarpPerspective((4, 7), mode, 0.0, fmt), xi, mi, *extra)
        back = gc.apply(WarpPerspectiveBackwardData(src_shape, mode, 0.0, fmt), mi, *extra, yi)
    gc.verify(g)
    warped_v, back_v = gc.evaluate([warped, back], feeds)
    assert back_v.shape == src_shape
    assert np.sum(warped_v * y) == pytest.approx(np.sum(x * back_v), rel=1e-12)
    compiled_warped, compiled_back = gc.compile([warped, back])(**feeds)
    np.testing.assert_allclose(compiled_warped, warped_v, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(compiled_back, back_v, rtol=1e-12, atol=1e-12)


# -- BackwardMat is d out / d mat (§9.5) ----------------------------------------------------------

@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_backward_mat_matches_differences_of_the_loop(rng, mode, fmt):
    """gmat[n, i, j] = <g[n], d out[n] / d mat[n, i, j]>, the derivative taken by central
    differences of the per-pixel loop. The sample points stay 0.05 away from integer
    coordinates, where the piecewise-bilinear map is smooth; they reach past every edge."""
    src = rng.standard_normal((2, 2, 3, 4))
    mat_idx = np.array([1, 0, 1])
    mat = np.array([
        [[0.97, 0.097, 0.386], [-0.044, 1.026, 0.586], [0.003, -0.013, 1.001]],
        [[1.031, -0.162, -1.375], [0.073, 0.955, -0.653], [-0.006, 0.002, 1.009]],
        [[0.915, 0.138, 1.626], [-0.123, 0.99, 1.818], [0.022, 0.023, 1.003]],
    ])
    oh, ow = np.meshgrid(np.arange(4.0), np.arange(5.0), indexing="ij")
    for m in mat:
        den = m[2, 0] * ow + m[2, 1] * oh + m[2, 2]
        for row in (m[0], m[1]):
            coord = (row[0] * ow + row[1] * oh + row[2]) / den
            assert np.abs(coord - np.round(coord)).min() > 0.05
    g = rng.standard_normal((3, 2, 4, 5))
    expected = np.zeros((3, 3, 3))
    step = 1e-6
    for n in range(3):
        for i in range(3):
            for j in range(3):
                plus, minus = mat.copy(), mat.copy()
                plus[n, i, j] += step
                minus[n, i, j] -= step
                diff = (warp_loop(src, plus, (4, 5), mode, 0.4, mat_idx)
                        - warp_loop(src, minus, (4, 5), mode, 0.4, mat_idx))
                expected[n, i, j] = np.sum(g[n] * diff[n]) / (2 * step)
    src_f, g_f = (src, g) if fmt == "NCHW" else (to_nhwc(src), to_nhwc(g))
    with gc.Graph("backward_mat") as graph:
        s, m, gi = (gc.input(k, v.shape, v.dtype) for k, v in (("s", src_f), ("m", mat), ("g", g_f)))
        idx = gc.input("idx", (3,), "int64")
        dmat = gc.apply(WarpPerspectiveBackwardMat(mode, 0.4, fmt), s, m, idx, gi)
    gc.verify(graph)
    value = gc.evaluate(dmat, s=src_f, m=mat, g=g_f, idx=mat_idx)
    np.testing.assert_allclose(value, expected, rtol=1e-6, atol=1e-7)


# -- errors ------------------------------------------------------------------------------------

def test_bad_mat_idx_is_a_run_time_index_error(rng):
    src, mat = rng.standard_normal((2, 1, 3, 4)), np.tile(np.eye(3), (2, 1, 1))
    for bad in ([0, 2], [-1, 0]):
        with pytest.raises(gc.IndexOutOfRangeError, match="WarpPerspective.*mat_idx"):
            run_perspective(src, mat, (3, 4), mat_idx=np.array(bad, np.int32))
    g = np.ones((2, 1, 3, 4))
    with gc.Graph("bad_idx"):
        s, m, gi = (gc.input(k, v.shape, v.dtype) for k, v in (("s", src), ("m", mat), ("g", g)))
        idx = gc.input("idx", (2,), "int32")
        data = gc.apply(WarpPerspectiveBackwardData(src.shape, "replicate", 0.0, "NCHW"), m, idx, gi)
        dmat = gc.apply(WarpPerspectiveBackwardMat("replicate", 0.0, "NCHW"), s, m, idx, gi)
    feeds = dict(s=src, m=mat, g=g, idx=np.array([0, 5], np.int32))
    with pytest.raises(gc.IndexOutOfRangeError, match="WarpPerspectiveBackwardData: mat_idx value 5"):
        gc.evaluate(data, {k: v for k, v in feeds.items() if k != "s"})
    with pytest.raises(gc.IndexOutOfRangeError, match="WarpPerspectiveBackwardMat: mat_idx value 5"):
        gc.evaluate(dmat, feeds)


def _build_error(fn, **shapes):
    """The BuildError raised by `fn(**inputs)` in a fresh graph."""
    with gc.Graph("errors"):
        inputs = {k: gc.input(k, s, d) for k, (s, d) in shapes.items()}
        with pytest.raises(gc.errors.BuildError) as info:
            fn(**inputs)
    return info.value


F32 = "float32"
AFFINE_IN = dict(src=((2, 5, 6, 3), F32), mat=((2, 2, 3), F32))      # NHWC, the default
PERSPECTIVE_IN = dict(src=((2, 3, 5, 6), F32), mat=((2, 3, 3), F32))  # NCHW, the default


def affine(out_shape=(3, 3), **kwargs):
    return lambda src, mat: gc.warp_affine(src, mat, out_shape, **kwargs)


def perspective(out_shape=(3, 3), **kwargs):
    return lambda src, mat, idx=None: gc.warp_perspective(src, mat, out_shape, mat_idx=idx, **kwargs)


@pytest.mark.parametrize("fn, shapes, error, words", [
    (affine(), {**AFFINE_IN, "src": ((5, 6, 3), F32)}, gc.ShapeError, "4-D"),
    (affine(), {**AFFINE_IN, "mat": ((3, 2, 3), F32)}, gc.ShapeError, "3 matrices"),
    (affine(), {**AFFINE_IN, "mat": ((2, 3, 3), F32)}, gc.ShapeError, r"\(N, 2, 3\)"),
    (perspective(), {**PERSPECTIVE_IN, "mat": ((2, 2, 3), F32)}, gc.ShapeError, r"\(N, 3, 3\)"),
    (perspective(), {**PERSPECTIVE_IN, "mat": ((3, 3, 3), F32)}, gc.ShapeError, "pass mat_idx"),
    (perspective(), {**PERSPECTIVE_IN, "mat": ((3, 3, 3), F32), "idx": ((2,), "int32")},
     gc.ShapeError, "mat_idx must have shape"),
    (perspective(), {**PERSPECTIVE_IN, "mat": ((3, 3, 3), F32), "idx": ((3,), F32)},
     gc.DTypeError, "mat_idx must be an integer"),
    (perspective((0, 3)), PERSPECTIVE_IN, gc.ShapeError, "two positive ints"),
    (perspective((3,)), PERSPECTIVE_IN, gc.ShapeError, "two positive ints"),
    (perspective((2.5, 3)), PERSPECTIVE_IN, gc.ShapeError, "two positive ints"),
    (perspective(3), PERSPECTIVE_IN, gc.ShapeError, "two positive ints"),
    (affine(border_mode="mirror"), AFFINE_IN, gc.ShapeError, "unknown border mode 'mirror'"),
    (affine(format="NCWH"), AFFINE_IN, gc.ShapeError, "unknown format 'NCWH'"),
    (affine(border_val="zero"), AFFINE_IN, gc.ShapeError, "border_val"),
    (affine(), {**AFFINE_IN, "src": ((2, 5, 6, 3), "int32")}, gc.DTypeError, "float"),
    (affine(), {**AFFINE_IN, "mat": ((2, 2, 3), "float64")}, gc.DTypeError, "differ"),
    (affine(format="NCHW"), {**AFFINE_IN, "src": ((2, 3, 0, 6), F32)}, gc.ShapeError, "empty image"),
    (lambda src, mat: gc.apply(WarpAffine((3, 3)), src, mat, mat), AFFINE_IN,
     gc.GraphError, "takes 2 inputs, got 3"),
])
def test_build_time_errors_name_the_op_and_the_line(fn, shapes, error, words):
    err = _build_error(fn, **shapes)
    assert isinstance(err, error)
    assert err.op in ("WarpAffine", "WarpPerspective")
    assert err.site and __file__ in err.site
    assert re.search(words, str(err)), str(err)


def test_backward_op_shape_errors():
    with gc.Graph("backward_errors"):
        mat = gc.input("mat", (2, 3, 3), F32)
        g_ok = gc.input("g", (2, 3, 4, 5), F32)
        g_bad_c = gc.input("g_bad_c", (2, 2, 4, 5), F32)
        src = gc.input("src", (2, 3, 6, 6), F32)
        with pytest.raises(gc.ShapeError, match="2 channels"):
            gc.apply(WarpPerspectiveBackwardData((2, 3, 6, 6)), mat, g_bad_c)
        with pytest.raises(gc.ShapeError, match="four non-negative ints"):
            gc.apply(WarpPerspectiveBackwardData((2, 3, 6)), mat, g_ok)
        with pytest.raises(gc.ShapeError, match="2 images of 3 channels"):
            gc.apply(WarpPerspectiveBackwardMat(), src, mat, g_bad_c)
        with pytest.raises(gc.GraphError, match="takes 3 or 4 inputs"):
            gc.apply(WarpPerspectiveBackwardMat(), mat, g_ok)
        assert gc.apply(WarpPerspectiveBackwardData((2, 3, 6, 6)), mat, g_ok).shape == (2, 3, 6, 6)
        assert gc.apply(WarpPerspectiveBackwardMat(), src, mat, g_ok).shape == (2, 3, 3)


def test_border_mode_names_are_case_insensitive_in_the_frontend(rng):
    src = rng.standard_normal((1, 2, 3, 1))
    mat = np.array([[[1.0, 0, -1], [0, 1, 0]]])
    upper, lower = run_affine(src, mat, (2, 3), "WRAP"), run_affine(src, mat, (2, 3), "wrap")
    np.testing.assert_array_equal(upper, lower)
