"""Shape functions on Tensors: reshape, broadcast_to, expand_dims, squeeze,
transpose, concat. They resolve numpy conveniences (-1, None, negative axes)
into the explicit parameters the ops carry.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ..errors import ShapeError
from ..ops.common import normalize_axes, normalize_axis
from ..ops.shape import AddAxis, Broadcast, Concat, RemoveAxis, Reshape, Transpose
from .tensor import Tensor, apply, reports_user_line, to_operands

__all__ = ["reshape", "broadcast_to", "expand_dims", "squeeze", "transpose", "swapaxes", "concat"]


def _as_shape(shape) -> tuple:
    return (shape,) if isinstance(shape, (int, np.integer)) or shape is None else tuple(shape)


@reports_user_line
def reshape(x: Tensor, shape) -> Tensor:
    """numpy reshape with at most one -1."""
    shape = _as_shape(shape)
    op = Reshape(shape)
    if any(not isinstance(d, (int, np.integer)) for d in shape):
        raise ShapeError(f"target shape {shape} must hold ints", op=op.label)
    if sum(d == -1 for d in shape) > 1:
        raise ShapeError(f"target shape {shape} has more than one -1", op=op.label)
    if any(d < -1 for d in shape):
        raise ShapeError(f"target shape {shape} has a negative size", op=op.label)
    if -1 in shape:
        known = math.prod([d for d in shape if d != -1])
        if known == 0 or x.size % known:
            raise ShapeError(f"cannot reshape {x.shape} ({x.size} elements) to {shape}", op=op.label)
        shape = tuple(x.size // known if d == -1 else int(d) for d in shape)
    shape = tuple(int(d) for d in shape)
    return x if shape == x.shape else apply(Reshape(shape), x)


def broadcast_to(x: Tensor, shape) -> Tensor:
    """numpy broadcast_to; `None` keeps x's dim (right-aligned)."""
    shape = _as_shape(shape)
    offset = len(shape) - x.ndim
    resolved = tuple(
        (x.shape[i - offset] if 0 <= i - offset < x.ndim else 1) if d is None else d
        for i, d in enumerate(shape)
    )
    return x if resolved == x.shape else apply(Broadcast(resolved), x)


@reports_user_line
def expand_dims(x: Tensor, axis) -> Tensor:
    """Insert size-1 dims at `axis` (numpy semantics: positions in the output)."""
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    positions = sorted(normalize_axes(AddAxis(axes), axes, x.ndim + len(axes)))
    return apply(AddAxis(tuple(positions)), x)


@reports_user_line
def squeeze(x: Tensor, axis=None) -> Tensor:
    """Remove size-1 dims (all of them if axis is None)."""
    if axis is None:
        positions = [i for i, d in enumerate(x.shape) if d == 1]
    else:
        axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
        positions = sorted(normalize_axes(RemoveAxis(axes), axes, x.ndim))
    if not positions:
        return x
    return apply(RemoveAxis(tuple(p - i for i, p in enumerate(positions))), x)


@reports_user_line
def transpose(x: Tensor, perm: Sequence[int] | None = None) -> Tensor:
    perm = tuple(range(x.ndim))[::-1] if perm is None else tuple(normalize_axes(Transpose(tuple(perm)), perm, x.ndim))
    return x if perm == tuple(range(x.ndim)) else apply(Transpose(perm), x)


@reports_user_line
def swapaxes(x: Tensor, a: int, b: int) -> Tensor:
    perm = list(range(x.ndim))
    a, b = normalize_axis(Transpose(()), a, x.ndim), normalize_axis(Transpose(()), b, x.ndim)
    perm[a], perm[b] = perm[b], perm[a]
    return transpose(x, perm)


@reports_user_line
def concat(tensors: Sequence, axis: int = 0) -> Tensor:
    tensors = to_operands(list(tensors))
    if not tensors:
        raise ShapeError("needs at least one tensor", op="Concat")
    axis = normalize_axis(Concat(axis), axis, tensors[0].ndim) if tensors[0].ndim else axis
    return apply(Concat(axis), *tensors)
