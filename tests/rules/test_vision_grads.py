"""Gradients of the warp family against float64 finite differences (`gc.check_grads`),
what the rules capture, the rules of the backward ops (second order), and the gradients that
are not implemented.

The warps are piecewise bilinear in the sample coordinates, so every matrix
here keeps its sample points away from integer coordinates (`assert_smooth`):
there the map is smooth and finite differences are exact to rounding.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.ops.vision import (
    WarpPerspective,
    WarpPerspectiveBackwardData,
    WarpPerspectiveBackwardMat,
    WarpPerspectiveTangentMat,
)

from helpers import backward_nodes_of, captured_values

MODES = ("replicate", "reflect", "reflect_101", "wrap", "constant")
F64 = "float64"

# affine and perspective matrices with fractional entries; together they sample inside
# a 5 x 6 image and up to two pixels beyond each of its edges, for a 4 x 7 output
AFFINE = np.array([
    [[0.9497, 0.1592, 0.4147], [-0.0619, 1.0134, 0.572]],
    [[1.0504, -0.1705, -1.3922], [0.0462, 0.9353, -0.7116]],
    [[-0.8361, 0.1534, 5.2902], [0.1507, -0.8593, 4.3453]],
    [[0.5027, 0.3548, 1.86], [-0.3051, 0.6465, 2.4527]],
])

PERSPECTIVE = np.array([
    [[0.932, 0.0985, 0.415], [-0.0609, 1.0834, 0.6051], [-0.0176, 0.007, 1.0187]],
    [[1.1209, -0.1605, -1.3883], [0.0378, 0.9421, -0.6911], [0.0146, -0.0132, 1.0304]],
    [[-0.757, 0.1214, 5.3247], [0.1351, -0.9203, 4.281], [0.0189, 0.0234, 1.0375]],
])


def sample_points(mat3, out_hw):
    """(xs, ys) of every output pixel of every matrix, in numpy (§9.2)."""
    oh, ow = np.meshgrid(np.arange(out_hw[0]), np.arange(out_hw[1]), indexing="ij")
    num_x = mat3[:, 0, 0, None, None] * ow + mat3[:, 0, 1, None, None] * oh + mat3[:, 0, 2, None, None]
    num_y = mat3[:, 1, 0, None, None] * ow + mat3[:, 1, 1, None, None] * oh + mat3[:, 1, 2, None, None]
    den = mat3[:, 2, 0, None, None] * ow + mat3[:, 2, 1, None, None] * oh + mat3[:, 2, 2, None, None]
    return num_x / den, num_y / den


def assert_smooth(mat3, out_hw, margin=0.01):
    """The test's premise: no sample coordinate lies within `margin` of an integer."""
    for coord in sample_points(mat3, out_hw):
        distance = np.abs(coord - np.round(coord))
        assert distance.min() > margin, f"a sample point lies {distance.min():.4f} from an integer"


def homogeneous(mat2):
    return np.concatenate([mat2, np.tile([[[0.0, 0.0, 1.0]]], (mat2.shape[0], 1, 1))], axis=1)


def image_shape(fmt, n, c, h, w):
    return (n, c, h, w) if fmt == "NCHW" else (n, h, w, c)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_warp_affine_grads_every_border_mode(rng, mode, fmt):
    mat = AFFINE[:2]
    assert_smooth(homogeneous(mat), (4, 7))
    shape = image_shape(fmt, 2, 3, 5, 6)
    with gc.Graph("affine_grads") as g:
        src, m = gc.input("src", shape, F64), gc.input("mat", mat.shape, F64)
        y = gc.warp_affine(src, m, (4, 7), border_mode=mode, border_val=0.7, format=fmt)
    gc.check_grads(y, [src, m], dict(src=rng.standard_normal(shape), mat=mat), rtol=1e-6)
    gc.verify(g)


@pytest.mark.parametrize("mode", ["replicate", "constant"])
def test_warp_affine_grads_batch_of_four_different_matrices(rng, mode):
    assert_smooth(homogeneous(AFFINE), (4, 7))
    with gc.Graph("affine_batch") as g:
        src, m = gc.input("src", (4, 5, 6, 2), "float32"), gc.input("mat", (4, 2, 3), "float32")
        y = gc.warp_affine(src, m, (4, 7), border_mode=mode, border_val=-0.4)
        loss = (gc.tanh(y) * y).sum()
        dsrc, dmat = gc.grad(loss, [src, m])
    gc.verify(g)
    assert dsrc.shape == (4, 5, 6, 2) and dmat.shape == (4, 2, 3)
    feeds = dict(src=rng.standard_normal((4, 5, 6, 2)).astype(np.float32), mat=AFFINE.astype(np.float32))
    gc.check_grads(loss, [src, m], feeds, rtol=1e-6)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
@pytest.mark.parametrize("with_idx", [False, True])
def test_warp_perspective_grads(rng, mode, fmt, with_idx):
    mat = PERSPECTIVE if with_idx else PERSPECTIVE[:2]
    assert_smooth(mat, (4, 7))
    shape = image_shape(fmt, 2, 3, 5, 6)
    feeds = dict(src=rng.standard_normal(shape), mat=mat)
    with gc.Graph("perspective_grads") as g:
        src, m = gc.input("src", shape, F64), gc.input("mat", mat.shape, F64)
        idx = None
        if with_idx:
            idx = gc.input("idx", (3,), "int32")
            feeds["idx"] = np.array([1, 0, 1], np.int32)
        y = gc.warp_perspective(src, m, (4, 7), mat_idx=idx, border_mode=mode, border_val=0.3, format=fmt)
    gc.check_grads(y, [src, m], feeds, rtol=1e-6)
    gc.verify(g)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_idx", [False, True])
def test_backward_data_grad_wrt_g(rng, mode, with_idx):
    mat = PERSPECTIVE if with_idx else PERSPECTIVE[:2]
    n = mat.shape[0]
    feeds = dict(mat=mat, g=rng.standard_normal((n, 4, 7, 3)))
    with gc.Graph("backward_data_grad") as graph:
        m, g = gc.input("mat", mat.shape, F64), gc.input("g", (n, 4, 7, 3), F64)
        extra = ()
        if with_idx:
            extra = (gc.input("idx", (3,), "int32"),)
            feeds["idx"] = np.array([1, 1, 0], np.int32)
        back = gc.apply(WarpPerspectiveBackwardData((2, 5, 6, 3), mode, 0.9, "NHWC"), m, *extra, g)
    gc.check_grads(back, [g], feeds, rtol=1e-6)
    gc.verify(graph)


@pytest.mark.parametrize("mode", MODES)
def test_second_order_wrt_src_goes_through_the_backward_data_rule(rng, mode):
    assert_smooth(homogeneous(AFFINE[:2]), (4, 7))
    with gc.Graph("second_order") as g:
        src, m = gc.input("src", (2, 3, 5, 6), F64), gc.input("mat", (2, 2, 3), F64)
        y = gc.warp_affine(src, m, (4, 7), border_mode=mode, border_val=0.5, format="NCHW")
        loss = (y * y * y).sum()
    feeds = dict(src=rng.standard_normal((2, 3, 5, 6)), mat=AFFINE[:2])
    gc.check_grads(loss, [src], feeds, order=2, rtol=1e-6)
    gc.verify(g)


# -- what the WarpAffine rule builds and reads -------------------------------------------------

def _affine_graph():
    g = gc.Graph("captures")
    with g:
        x, w = gc.input("x", (2, 5, 6, 3)), gc.param("w", (2, 2, 3))
        src, mat = x * 2.0, w * 1.5  # forward values, so their capture is visible
        y = gc.warp_affine(src, mat, (4, 7))
    return g, x, w, src, mat, y


@pytest.mark.parametrize("wrt, reads, builds", [
    ("x", {"mat"}, {"WarpPerspectiveBackwardData"}),
    ("w", {"src", "mat"}, {"WarpPerspectiveBackwardMat"}),
])
def test_warp_affine_rule_builds_and_captures_only_what_is_needed(wrt, reads, builds):
    g, x, w, src, mat, y = _affine_graph()
    gc.grad(y.sum(), [x if wrt == "x" else w])
    gc.verify(g)
    nodes = backward_nodes_of(g, y.id)
    names = {g[i].op.name for i in nodes}
    assert names & {"WarpPerspectiveBackwardData", "WarpPerspectiveBackwardMat"} == builds
    assert captured_values(g, nodes) == {dict(src=src, mat=mat)[k].id for k in reads}


# -- gradients that are not implemented --------------------------------------------------------

def test_backward_data_wrt_mat_is_not_differentiable():
    with gc.Graph("nd_data"):
        m, g = gc.input("mat", (2, 3, 3), F64), gc.input("g", (2, 3, 4, 7), F64)
        back = gc.apply(WarpPerspectiveBackwardData((2, 3, 5, 6)), m, g)
        with pytest.raises(gc.NotDifferentiableError, match="WarpPerspectiveBackwardData") as info:
            gc.grad(back.sum(), [m])
    assert isinstance(info.value, NotImplementedError)


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("with_idx", [False, True])
def test_backward_mat_and_tangent_mat_grads_wrt_their_last_input(rng, mode, with_idx):
    """BackwardMat is linear in g and TangentMat in v; each one's rule builds the other."""
    mat = PERSPECTIVE if with_idx else PERSPECTIVE[:2]
    assert_smooth(mat, (4, 7))
    n = mat.shape[0]
    feeds = dict(src=rng.standard_normal((2, 5, 6, 3)), mat=mat,
                 g=rng.standard_normal((n, 4, 7, 3)), v=rng.standard_normal((n, 3, 3)))
    with gc.Graph("linear_parts") as graph:
        s, m = gc.input("src", (2, 5, 6, 3), F64), gc.input("mat", mat.shape, F64)
        g, v = gc.input("g", (n, 4, 7, 3), F64), gc.input("v", (n, 3, 3), F64)
        extra = ()
        if with_idx:
            extra = (gc.input("idx", (3,), "int32"),)
            feeds["idx"] = np.array([1, 1, 0], np.int32)
        back = gc.apply(WarpPerspectiveBackwardMat(mode, 0.9, "NHWC"), s, m, *extra, g)
        tangent = gc.apply(WarpPerspectiveTangentMat((4, 7), mode, 0.9, "NHWC"), s, m, *extra, v)
        gc.grad((back * back).sum() + (tangent * tangent).sum(), [g, v])
    built = {k: {graph[i].op.name for i in backward_nodes_of(graph, x.id)} - {"Elemwise"}
             for k, x in (("back", back), ("tangent", tangent))}  # (Elemwise: back · back)
    assert built == dict(back={"WarpPerspectiveTangentMat"}, tangent={"WarpPerspectiveBackwardMat"})
    gc.check_grads(back, [g], feeds, rtol=1e-6)
    gc.check_grads(tangent, [v], feeds, rtol=1e-6)
    gc.verify(graph)


@pytest.mark.parametrize("op", [WarpPerspectiveBackwardMat(), WarpPerspectiveTangentMat((4, 7))])
def test_backward_mat_and_tangent_mat_wrt_src_or_mat_are_not_differentiable(op):
    with gc.Graph("nd_mat"):
        s, m = gc.input("src", (2, 3, 5, 6), F64), gc.input("mat", (2, 3, 3), F64)
        last = gc.input("g", (2, 3, 4, 7), F64) if op.name.endswith("BackwardMat") else \
            gc.input("v", (2, 3, 3), F64)
        out = gc.apply(op, s, m, last)
        for wrt, what in ((s, "wrt src"), (m, "wrt mat")):
            with pytest.raises(gc.NotDifferentiableError, match=f"gradient {what} of {op.name}"):
                gc.grad(out.sum(), [wrt, last])


def test_second_order_wrt_mat_is_not_implemented():
    """A Hessian wrt the matrix needs BackwardMat's gradient wrt mat: still refused, named."""
    with gc.Graph("nd_second"):
        src, m = gc.input("src", (1, 5, 6, 1), F64), gc.input("mat", (1, 2, 3), F64)
        loss = (gc.warp_affine(src, m, (4, 7)) ** 2).sum()
        refused = "wrt mat of WarpPerspectiveBackwardMat"
        with pytest.raises(gc.NotDifferentiableError, match=refused):
            gc.check_grads(loss, [m], dict(src=np.ones((1, 5, 6, 1)), mat=AFFINE[:1]), order=2)


@pytest.mark.parametrize("mode", MODES)
def test_second_order_through_the_matrix_gradient_wrt_its_cotangent(rng, mode):
    """A penalty on a warp's matrix gradient, differentiated twice wrt the weights that form
    that gradient's cotangent: the second sweep runs the BackwardMat rule (→ TangentMat) and
    the TangentMat rule (→ BackwardMat)."""
    assert_smooth(PERSPECTIVE[:2], (4, 7))
    with gc.Graph("penalty") as graph:
        src, m = gc.input("src", (2, 3, 5, 6), F64), gc.input("mat", (2, 3, 3), F64)
        w = gc.param("w", (2, 3, 4, 7), F64)
        y = gc.warp_perspective(src, m, (4, 7), border_mode=mode, border_val=0.6)
        dmat, = gc.grad((y * gc.tanh(w)).sum(), [m])
        penalty = (dmat * dmat).sum()
    feeds = dict(src=rng.standard_normal((2, 3, 5, 6)), mat=PERSPECTIVE[:2],
                 w=rng.standard_normal((2, 3, 4, 7)))
    gc.check_grads(penalty, [w], feeds, order=2, rtol=1e-6)
    gc.verify(graph)


def test_forward_warp_rule_is_generic_and_gives_mat_idx_no_gradient():
    from gradcompiler.rules import rule_of

    assert rule_of(WarpPerspective) is None and rule_of(WarpPerspective, generic=True) is not None
    with gc.Graph("idx_grad") as g:
        src, m = gc.input("src", (2, 3, 5, 6), F64), gc.input("mat", (3, 3, 3), F64)
        idx = gc.input("idx", (3,), "int32")
        y = gc.warp_perspective(src, m, (4, 7), mat_idx=idx)
        with pytest.raises(gc.NotDifferentiableError, match="int32"):
            gc.grad(y.sum(), [idx])
        dsrc, dmat = gc.grad(y.sum(), [src, m])
    gc.verify(g)
    assert dsrc.shape == (2, 3, 5, 6) and dmat.shape == (3, 3, 3)
