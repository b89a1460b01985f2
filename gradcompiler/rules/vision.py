"""Image-warp rules (seed: warp_affine_grad_rule; op-reference §9).

* WarpAffine (the seed's rule, §9.6): the affine matrix is made homogeneous
  by appending a [0, 0, 1] row, broadcast to the batch (the seed's
  unbroadcast (1, 1, 3) row works only for N = 1), and the perspective
  backward ops do the work; rows 0:2 of the matrix gradient are kept. Unlike
  the seed, each gradient is built only when its input needs one, so a
  gradient wrt src alone never captures src. `homogeneous` builds that
  matrix; simplify makes the differentiated forward a WarpPerspective of it,
  so the warp and its gradients can share one pass (`passes/simplify/vision.py`).
* WarpPerspective (MegEngine's generic rule, §9.3): BackwardData for src
  (reads mat and mat_idx), BackwardMat for mat (reads src, mat, mat_idx).
* WarpPerspectiveBackwardData is linear in g and the adjoint of the forward
  for a fixed matrix, so its gradient wrt g is the forward warp with
  border_val 0 (§9.4).
* WarpPerspectiveBackwardMat is linear in g, and WarpPerspectiveTangentMat
  (the warp's directional derivative along a matrix tangent v) is its exact
  adjoint, so each one's gradient wrt its last input is the other applied to
  the cotangent, with the same border mode and border_val (border_val is
  part of the image being differentiated here, not a constant term). These
  two rules are what gives forward mode (`gc.jvp`, which transposes the
  backward) a path along a warp's matrix.
* The gradients of these three wrt src or mat would be second derivatives of
  the sampling wrt the matrix; they are not implemented, and asking for one
  raises NotDifferentiableError.
"""

from __future__ import annotations

import numpy as np

from ..errors import NotDifferentiableError
from ..frontend.shapes import broadcast_to, concat
from ..frontend.tensor import Tensor, apply, constant
from ..ops.vision import (
    WarpAffine,
    WarpPerspective,
    WarpPerspectiveBackwardData,
    WarpPerspectiveBackwardMat,
    WarpPerspectiveTangentMat,
)
from .registry import grad_rule


def _border(op) -> dict:
    return dict(border_mode=op.border_mode, border_val=op.border_val, format=op.format)


def _not_differentiable(node, what: str) -> NotDifferentiableError:
    return NotDifferentiableError(
        f"the gradient {what} of {node.op.describe()} is not implemented "
        "(a second derivative of the sampling)",
        op=node.op.label, site=node.node.site)


def _warp_grads(node, g, needs_grad, src, mat, mat_idx):
    """[dsrc or None, dmat or None] of a perspective warp of src by (N, 3, 3) `mat`."""
    src_type = node.input_types[0]
    extra = () if mat_idx is None else (mat_idx,)
    dsrc = dmat = None
    if needs_grad[0]:
        backward_data = WarpPerspectiveBackwardData(src_type.shape, **_border(node.op))
        dsrc = apply(backward_data, mat, *extra, g)
    if needs_grad[1]:
        dmat = apply(WarpPerspectiveBackwardMat(**_border(node.op)), src, mat, *extra, g)
    return [dsrc, dmat]


def homogeneous(mat: Tensor) -> Tensor:
    """The (N, 2, 3) affine matrices `mat` as (N, 3, 3) perspective ones: the row [0, 0, 1]
    appended (§9.6). The simplify rewrite `affine_warp_reads_homogeneous_matrix` builds the
    same nodes, so that common subexpressions make the two one value."""
    row = constant(np.array([[[0, 0, 1]]]), mat.dtype, graph=mat.graph)
    return concat([mat, broadcast_to(row, (mat.shape[0], 1, 3))], axis=1)


@grad_rule(WarpAffine)
def warp_affine_rule(node, g, needs_grad):
    src, mat = node.inputs
    dsrc, dmat3 = _warp_grads(node, g, needs_grad, src, homogeneous(mat), None)
    return [dsrc, dmat3[:, 0:2, :] if dmat3 is not None else None]


@grad_rule(WarpPerspective, generic=True)
def warp_perspective_rule(node, g, needs_grad):
    src, mat, *mat_idx = node.inputs
    grads = _warp_grads(node, g, needs_grad, src, mat, mat_idx[0] if mat_idx else None)
    return grads + [None] * len(mat_idx)


@grad_rule(WarpPerspectiveBackwardData)
def warp_backward_data_rule(node, g, needs_grad):
    """d g = WarpPerspective(h, mat, [mat_idx]) with border_val 0: the adjoint of the adjoint."""
    if needs_grad[0]:
        raise _not_differentiable(node, "wrt mat")
    mat, *rest = node.inputs
    out_hw = node.op.upstream_grid(node.input_types[-1])
    forward = WarpPerspective(out_hw, node.op.border_mode, 0.0, node.op.format)
    grads = [None] * len(node.inputs)
    if needs_grad[-1]:
        grads[-1] = apply(forward, g, mat, *rest[:-1])
    return grads


def _refuse_src_and_mat(node, needs_grad) -> None:
    for slot, what in ((0, "wrt src"), (1, "wrt mat")):
        if needs_grad[slot]:
            raise _not_differentiable(node, what)


@grad_rule(WarpPerspectiveBackwardMat)
def warp_backward_mat_rule(node, h, needs_grad):
    """d g = TangentMat(src, mat, [mat_idx], h): the adjoint of a map linear in g."""
    _refuse_src_and_mat(node, needs_grad)
    src, mat, *rest = node.inputs
    tangent = WarpPerspectiveTangentMat(node.op.upstream_grid(node.input_types[-1]), **_border(node.op))
    grads = [None] * len(node.inputs)
    if needs_grad[-1]:
        grads[-1] = apply(tangent, src, mat, *rest[:-1], h)
    return grads


@grad_rule(WarpPerspectiveTangentMat)
def warp_tangent_mat_rule(node, h, needs_grad):
    """d v = BackwardMat(src, mat, [mat_idx], h): the adjoint of a map linear in v."""
    _refuse_src_and_mat(node, needs_grad)
    src, mat, *rest = node.inputs
    grads = [None] * len(node.inputs)
    if needs_grad[-1]:
        grads[-1] = apply(WarpPerspectiveBackwardMat(**_border(node.op)), src, mat, *rest[:-1], h)
    return grads
