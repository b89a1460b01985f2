"""Forward values of WarpPerspectiveTangentMat, the derivative of a perspective warp along a
matrix tangent v, and of its compiled kernels.

Oracles: central finite differences of the float64 warp reference along v (the warp is
smooth where no sample coordinate is near an integer, so the difference is exact to
rounding), the adjoint identity ⟨BackwardMat(src, mat, g), v⟩ = ⟨g, TangentMat(src, mat, v)⟩
against the separately tested BackwardMat, and the numpy reference for the backends.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.ops.vision import (
    WarpPerspective,
    WarpPerspectiveBackwardMat,
    WarpPerspectiveTangentMat,
)

from oracle import assert_close

COVERS = {"WarpPerspectiveTangentMat"}

MODES = ("replicate", "reflect", "reflect_101", "wrap", "constant")
IN_HW, OUT_HW = (5, 6), (4, 7)


def image_shape(fmt, n, c, h, w):
    return (n, c, h, w) if fmt == "NCHW" else (n, h, w, c)


def smooth_matrices(rng, n, out_hw=OUT_HW, margin=0.02):
    """`n` perspective matrices sampling inside the image and up to ~2 pixels beyond it,
    redrawn until no sample coordinate lies within `margin` of an integer (a tap boundary)."""
    while True:
        mat = np.eye(3) + 0.12 * rng.standard_normal((n, 3, 3))
        mat[:, :2, 2] += rng.uniform(-1.5, 1.5, (n, 2))
        mat[:, 2, :2] = rng.uniform(-0.03, 0.03, (n, 2))
        mat[:, 2, 2] = rng.uniform(0.95, 1.05, n)
        oh, ow = np.meshgrid(np.arange(out_hw[0]), np.arange(out_hw[1]), indexing="ij")
        point = mat @ np.stack([ow.ravel(), oh.ravel(), np.ones(ow.size)])  # (n, 3, pixels)
        coords = point[:, :2] / point[:, 2:]
        if np.abs(coords - np.round(coords)).min() > margin:
            return mat


def case(rng, fmt, with_idx):
    n_mat = 3 if with_idx else 2
    src = rng.standard_normal(image_shape(fmt, 2, 3, *IN_HW))
    mat_idx = np.array([1, 0, 1], np.int32) if with_idx else None
    return src, smooth_matrices(rng, n_mat), mat_idx, rng.standard_normal((n_mat, 3, 3))


def with_idx_args(mat_idx):
    return () if mat_idx is None else (mat_idx,)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
@pytest.mark.parametrize("with_idx", [False, True])
def test_tangent_is_the_directional_derivative_of_the_warp(rng, mode, fmt, with_idx):
    src, mat, mat_idx, v = case(rng, fmt, with_idx)
    extra = with_idx_args(mat_idx)
    warp = WarpPerspective(OUT_HW, mode, 0.7, fmt)
    h = 1e-6
    numeric = (warp.reference(src, mat + h * v, *extra)
               - warp.reference(src, mat - h * v, *extra)) / (2 * h)
    got = WarpPerspectiveTangentMat(OUT_HW, mode, 0.7, fmt).reference(src, mat, *extra, v)
    assert got.shape == numeric.shape == image_shape(fmt, mat.shape[0], 3, *OUT_HW)
    assert np.abs(numeric).max() > 0.1  # the direction really moves the image
    assert_close(got, numeric, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_idx", [False, True])
def test_tangent_is_the_adjoint_of_backward_mat(rng, mode, with_idx):
    src, mat, mat_idx, v = case(rng, "NHWC", with_idx)
    extra = with_idx_args(mat_idx)
    g = rng.standard_normal(image_shape("NHWC", mat.shape[0], 3, *OUT_HW))
    tangent = WarpPerspectiveTangentMat(OUT_HW, mode, -0.4, "NHWC").reference(src, mat, *extra, v)
    back = WarpPerspectiveBackwardMat(mode, -0.4, "NHWC").reference(src, mat, *extra, g)
    forward, reverse = np.vdot(g, tangent), np.vdot(back, v)
    assert abs(forward - reverse) <= 1e-12 * np.abs(g * tangent).sum(), (forward, reverse)


def test_skipped_terms_match_backward_mat_where_a_denominator_vanishes(rng):
    """Output pixel (0, 0) of this matrix has den = 0: neither op takes a term from it, so
    the adjoint identity still holds exactly and the tangent there is 0 in every mode."""
    src = rng.standard_normal((1, 2, *IN_HW))
    mat = np.array([[[1.0, 0.1, 0.3], [0.05, 0.9, 0.2], [0.02, 0.01, 0.0]]])
    v, g = rng.standard_normal((1, 3, 3)), rng.standard_normal((1, 2, 3, 4))
    for mode in MODES:
        tangent = WarpPerspectiveTangentMat((3, 4), mode, 0.5).reference(src, mat, v)
        back = WarpPerspectiveBackwardMat(mode, 0.5).reference(src, mat, g)
        assert np.isfinite(tangent).all() and (tangent[0, :, 0, 0] == 0).all()
        assert abs(np.vdot(g, tangent) - np.vdot(back, v)) <= 1e-12 * np.abs(g * tangent).sum()


def _tangent_graph(src, mat, mat_idx, v, mode, fmt, dtype):
    feeds = dict(src=src.astype(dtype), mat=mat.astype(dtype), v=v.astype(dtype))
    with gc.Graph("tangent") as graph:
        s, m = gc.input("src", src.shape, dtype), gc.input("mat", mat.shape, dtype)
        t = gc.input("v", v.shape, dtype)
        extra = ()
        if mat_idx is not None:
            extra = (gc.input("idx", mat_idx.shape, "int32"),)
            feeds["idx"] = mat_idx
        out = gc.apply(WarpPerspectiveTangentMat(OUT_HW, mode, 0.3, fmt), s, m, *extra, t)
    gc.verify(graph)
    return out, feeds


@pytest.mark.parametrize("mode, fmt, with_idx", [
    ("replicate", "NCHW", False), ("reflect", "NHWC", True), ("reflect_101", "NCHW", True),
    ("wrap", "NHWC", False), ("constant", "NCHW", True),
])
def test_compiled_cpu_matches_the_reference(rng, mode, fmt, with_idx):
    src, mat, mat_idx, v = case(rng, fmt, with_idx)
    for dtype, rtol in (("float64", 1e-12), ("float32", 1e-5)):
        out, feeds = _tangent_graph(src, mat, mat_idx, v, mode, fmt, dtype)
        got = gc.compile(out, target="cpu")(**feeds)
        assert_close(got, gc.evaluate(out, feeds), rtol=rtol, label=f"{mode} {fmt} {dtype}")


def test_compiled_cpu_checks_mat_idx(rng):
    src, mat, mat_idx, v = case(rng, "NCHW", True)
    out, feeds = _tangent_graph(src, mat, mat_idx, v, "replicate", "NCHW", "float32")
    with pytest.raises(gc.IndexOutOfRangeError, match="TangentMat: mat_idx value 2 is out of"):
        gc.compile(out, target="cpu")(**{**feeds, "idx": np.array([0, 2, 1], np.int32)})
