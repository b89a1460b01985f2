"""Shape-only ops: Reshape, Broadcast, AddAxis, RemoveAxis, Transpose, Concat,
FastpathCopy, PixelShuffle, PixelShuffleBackward (op-reference §1, §4).

All but Concat are "view" ops: their output is an index remapping of one
input, which the fuser turns into index maps instead of copies. Shapes are
final in the op (the frontend resolves Reshape's -1 and Broadcast's None).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir import Op, TensorType
from .common import FreshCopyIdentity, check_shape_tuple, normalize_axis, same_dtype


@dataclass(frozen=True)
class Reshape(Op):
    shape: tuple[int, ...]

    kind = "view"
    arity = 1

    def infer(self, x: TensorType) -> TensorType:
        target = check_shape_tuple(self, self.shape)
        if math.prod(target) != x.size:
            raise self.shape_error(f"cannot reshape {x.shape} ({x.size} elements) to {target}")
        return TensorType(target, x.dtype)

    def reference(self, x):
        return x.reshape(self.shape)


@dataclass(frozen=True)
class Broadcast(Op):
    """numpy `broadcast_to` (op-reference §1.3)."""

    shape: tuple[int, ...]

    kind = "view"
    arity = 1

    def infer(self, x: TensorType) -> TensorType:
        target = check_shape_tuple(self, self.shape)
        if x.ndim > len(target):
            raise self.shape_error(f"cannot broadcast {x.shape} to the lower-rank shape {target}")
        padded = (1,) * (len(target) - x.ndim) + x.shape
        for d, t in zip(padded, target):
            if d != t and d != 1:
                raise self.shape_error(f"cannot broadcast {x.shape} to {target}")
        return TensorType(target, x.dtype)

    def reference(self, x):
        return np.broadcast_to(x, self.shape).copy()


@dataclass(frozen=True)
class AddAxis(Op):
    """Insert size-1 dims, one after another in list order (op-reference §4.2)."""

    axes: tuple[int, ...]

    kind = "view"
    arity = 1

    def infer(self, x: TensorType) -> TensorType:
        shape = list(x.shape)
        for p in self.axes:
            if not 0 <= p <= len(shape):
                raise self.shape_error(f"position {p} is out of range for a tensor of rank {len(shape)} ({x.shape})")
            shape.insert(p, 1)
        return TensorType(tuple(shape), x.dtype)

    def inserted_positions(self, ndim: int) -> tuple[int, ...]:
        """Where the new axes sit in the output: replay the insertions on `ndim` old axes."""
        is_new = [False] * ndim
        for p in self.axes:
            is_new.insert(p, True)
        return tuple(i for i, new in enumerate(is_new) if new)

    def reference(self, x):
        return x.reshape(self.infer(TensorType(x.shape, x.dtype)).shape)


@dataclass(frozen=True)
class RemoveAxis(Op):
    """Remove size-1 dims, one after another in list order (op-reference §4.3)."""

    axes: tuple[int, ...]

    kind = "view"
    arity = 1

    def infer(self, x: TensorType) -> TensorType:
        shape = list(x.shape)
        for p in self.axes:
            if not 0 <= p < len(shape):
                raise self.shape_error(f"axis {p} is out of range for a tensor of rank {len(shape)} ({x.shape})")
            if shape[p] != 1:
                raise self.shape_error(f"cannot remove axis {p} of size {shape[p]} (shape {x.shape})")
            del shape[p]
        return TensorType(tuple(shape), x.dtype)

    def original_positions(self, ndim: int) -> tuple[int, ...]:
        """Where the removed axes sat in the input: replay the removals on range(ndim)."""
        remaining = list(range(ndim))
        removed = []
        for p in self.axes:
            removed.append(remaining.pop(p))
        return tuple(sorted(removed))

    def reference(self, x):
        return x.reshape(self.infer(TensorType(x.shape, x.dtype)).shape)


@dataclass(frozen=True)
class Transpose(Op):
    perm: tuple[int, ...]

    kind = "view"
    arity = 1

    def infer(self, x: TensorType) -> TensorType:
        if sorted(self.perm) != list(range(x.ndim)):
            raise self.shape_error(f"perm {self.perm} is not a permutation of the {x.ndim} axes of {x.shape}")
        return TensorType(tuple(x.shape[p] for p in self.perm), x.dtype)

    def reference(self, x):
        return np.ascontiguousarray(np.transpose(x, self.perm))


@dataclass(frozen=True)
class Concat(Op):
    """Join tensors along `axis`; no broadcasting (op-reference §1.5)."""

    axis: int

    kind = "library"

    def infer(self, *inputs: TensorType) -> TensorType:
        if not inputs:
            raise self.shape_error("needs at least one input")
        first = inputs[0]
        if first.ndim == 0:
            raise self.shape_error("cannot concatenate 0-d tensors")
        axis = normalize_axis(self, self.axis, first.ndim)
        if axis != self.axis:
            raise self.shape_error(f"axis must be normalised, got {self.axis}")
        dtype = same_dtype(self, *inputs)
        for t in inputs[1:]:
            if t.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(t.shape, first.shape)) if i != axis):
                shapes = ", ".join(str(s.shape) for s in inputs)
                raise self.shape_error(f"shapes {shapes} differ outside axis {axis}")
        shape = list(first.shape)
        shape[axis] = sum(t.shape[axis] for t in inputs)
        return TensorType(tuple(shape), dtype)

    def reference(self, *arrays):
        return np.concatenate(arrays, axis=self.axis)


@dataclass(frozen=True)
class FastpathCopy(FreshCopyIdentity, Op):
    """Identity that yields a fresh value (op-reference §1.6)."""


def _check_factor(op: Op, factor: int) -> None:
    if not isinstance(factor, (int, np.integer)) or factor <= 0:
        raise op.shape_error(f"factor must be a positive int, got {factor!r}")


def _regroup_pixel_blocks(x: np.ndarray, split: tuple[int, ...], perm: tuple[int, ...],
                          out_chw: tuple[int, int, int]) -> np.ndarray:
    """Split (…, C, H, W) into `split` (after one flattened batch axis), permute by `perm`,
    and join into (…, *out_chw).

    PixelShuffle and its inverse are the same reshape-transpose-reshape with
    the block axes moved in opposite directions; only the split and the
    permutation differ, so both references go through here.
    """
    lead = x.shape[:-3]
    batch = math.prod(lead)
    y = x.reshape(batch, *split).transpose(perm)
    return np.ascontiguousarray(y).reshape(*lead, *out_chw)


@dataclass(frozen=True)
class PixelShuffle(Op):
    """(…, C·r², H, W) → (…, C, H·r, W·r), PyTorch's channel order (§4.4)."""

    factor: int

    kind = "view"
    arity = 1

    def infer(self, x: TensorType) -> TensorType:
        r = self.factor
        _check_factor(self, r)
        if x.ndim < 3 or x.shape[-3] % (r * r):
            raise self.shape_error(f"needs rank >= 3 with dim -3 divisible by {r * r}, got {x.shape}")
        *lead, c, h, w = x.shape
        return TensorType((*lead, c // (r * r), h * r, w * r), x.dtype)

    def reference(self, x):
        r = self.factor
        *_, c, h, w = x.shape
        return _regroup_pixel_blocks(x, (c // (r * r), r, r, h, w), (0, 1, 4, 2, 5, 3),
                                     (c // (r * r), h * r, w * r))


@dataclass(frozen=True)
class PixelShuffleBackward(Op):
    """The inverse of PixelShuffle (PyTorch's pixel_unshuffle)."""

    factor: int

    kind = "view"
    arity = 1

    def infer(self, x: TensorType) -> TensorType:
        r = self.factor
        _check_factor(self, r)
        if x.ndim < 3 or x.shape[-1] % r or x.shape[-2] % r:
            raise self.shape_error(f"needs rank >= 3 with H and W divisible by {r}, got {x.shape}")
        *lead, c, h, w = x.shape
        return TensorType((*lead, c * r * r, h // r, w // r), x.dtype)

    def reference(self, x):
        r = self.factor
        *_, c, h, w = x.shape
        return _regroup_pixel_blocks(x, (c, h // r, r, w // r, r), (0, 1, 3, 5, 2, 4),
                                     (c * r * r, h // r, w // r))
