"""Image-warp rules (seed: warp_affine_grad_rule; op-reference §9).

* WarpAffine (the seed's rule, §9.6): the affine matrix is made homogeneous
  by appending a [0, 0, 1] row, broadcast to the batch (the seed's
  unbroadcast (1, 1, 3) row works only for N = 1), and the perspective
  backward ops do the work; rows 0:2 of the matrix gradient are kept. Unlike
  the seed, each gradient is built only when its input needs one, so a
  gradient wrt src alone never captures src.
* WarpPerspective (MegEngine's generic rule, §9.3): BackwardData for src
  (reads mat and mat_idx), BackwardMat for mat (reads src, mat, mat_idx).
* WarpPerspectiveBackwardData is linear in g and the adjoint of the forward
  for a fixed matrix, so its gradient wrt g is the forward warp with
  border_val 0 (§9.4). Its gradient wrt mat, and any gradient of
  WarpPerspectiveBackwardMat, is not implemented: asking for one raises
  NotDifferentiableError.
"""

from __future__ import annotations

import numpy as np

from ..errors import NotDifferentiableError
from ..frontend.shapes import broadcast_to, concat
from ..frontend.tensor import apply, constant
from ..ops.vision import (
    WarpAffine,
    WarpPerspective,
    WarpPerspectiveBackwardData,
    WarpPerspectiveBackwardMat,
)
from .registry import grad_rule


def _border(op) -> dict:
    return dict(border_mode=op.border_mode, border_val=op.border_val, format=op.format)


def _not_differentiable(node, what: str) -> NotDifferentiableError:
    return NotDifferentiableError(
        f"the gradient {what} of {node.op.describe()} is not implemented (no grad of a warp grad)",
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


@grad_rule(WarpAffine)
def warp_affine_rule(node, g, needs_grad):
    src, mat = node.inputs
    mat_type = node.input_types[1]
    row = constant(np.array([[[0, 0, 1]]]), mat_type.dtype)
    mat3 = concat([mat, broadcast_to(row, (mat_type.shape[0], 1, 3))], axis=1)
    dsrc, dmat3 = _warp_grads(node, g, needs_grad, src, mat3, None)
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
    g_type = node.input_types[-1]
    out_hw = g_type.shape[2:] if node.op.format == "NCHW" else g_type.shape[1:3]
    forward = WarpPerspective(tuple(out_hw), node.op.border_mode, 0.0, node.op.format)
    grads = [None] * len(node.inputs)
    if needs_grad[-1]:
        grads[-1] = apply(forward, g, mat, *rest[:-1])
    return grads


@grad_rule(WarpPerspectiveBackwardMat)
def warp_backward_mat_rule(node, g, needs_grad):
    raise _not_differentiable(node, "of any input")
