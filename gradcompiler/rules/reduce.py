"""Reduce rules: the seed's SUM-with-axes rule (AddAxis + Broadcast), which
declines full reductions and other modes, and the generic rule of
op-reference §3.3 for every mode. Only float inputs get gradients.
"""

from __future__ import annotations

from ..frontend.math import elemwise
from ..frontend.shapes import broadcast_to, expand_dims
from ..ops.reduce import Reduce
from .registry import grad_rule


def _keepdims(t, node):
    """`t` (g or y) with the reduced axes re-inserted as size 1."""
    if node.op.keepdims:
        return t
    axes = node.op.reduced_axes(node.input_types[0].ndim)
    return expand_dims(t, axes) if axes else t


@grad_rule(Reduce)
def reduce_sum(node, g, needs_grad):
    """The seed's rule: SUM over given axes; declines full reductions and other modes."""
    if node.op.mode != "SUM" or node.op.axes is None:
        return None
    if not needs_grad[0]:
        return [None]
    return [broadcast_to(_keepdims(g, node), node.input_types[0].shape)]


@grad_rule(Reduce, generic=True)
def reduce_generic(node, g, needs_grad):
    x_type = node.input_types[0]
    if not needs_grad[0] or x_type.dtype.kind != "f":
        return [None]
    mode = node.op.mode
    gk = _keepdims(g, node)
    if mode == "SUM":
        return [broadcast_to(gk, x_type.shape)]
    if mode == "MEAN":
        return [broadcast_to(gk * (node.type.size / max(x_type.size, 1)), x_type.shape)]
    x = node.inputs[0]
    if mode == "SUM_SQR":
        return [x * gk * 2]
    yk = _keepdims(node.output, node)
    if mode == "PRODUCT":
        return [gk * yk / x]
    if mode == "MAX":
        return [elemwise("COND_LEQ_MOV", yk, x, gk)]
    return [elemwise("COND_LEQ_MOV", x, yk, gk)]  # MIN
