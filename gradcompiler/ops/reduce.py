"""Reductions: `Reduce(mode, axes, keepdims)` and `ReduceTo(shape)`.

`Reduce` takes a tuple of axes (sorted, non-negative) or None for "every
element" (op-reference §3.1's INT_MAX), where MegEngine's frontend emits one
Reduce per axis: a fusing compiler wants the whole reduction in one node.
`ReduceTo` is op-reference §1.2's `reduce_to` (Reduce with a target shape):
sum over the dims that broadcasting created, the inverse of `Broadcast`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..errors import DTypeError
from ..ir import Op, TensorType
from .common import check_shape_tuple, require_float

REDUCE_MODES = ("SUM", "MEAN", "MAX", "MIN", "PRODUCT", "SUM_SQR")


def reduce_dtype(mode: str, dtype: np.dtype) -> np.dtype:
    """The dtype of a `mode` reduction of `dtype`, numpy's: a sum or product of bools or of
    integers is int64 (uint64 for unsigned ones), as `np.sum` gives, where a sum in int32
    would wrap (4 × 2**30 → 0) without a word; every other reduction keeps the dtype."""
    dtype = np.dtype(dtype)
    if mode in ("SUM", "PRODUCT") and dtype.kind in "biu":
        return np.dtype(np.uint64 if dtype.kind == "u" else np.int64)
    return dtype


def accumulation_dtype(mode: str, dtype: np.dtype) -> np.dtype:
    """What the reference accumulates a `mode` reduction of `dtype` in: float64 for floats."""
    return np.dtype(np.float64) if np.dtype(dtype).kind == "f" else reduce_dtype(mode, dtype)


@dataclass(frozen=True)
class Reduce(Op):
    mode: str
    axes: tuple[int, ...] | None = None
    keepdims: bool = False

    kind = "reduction"
    arity = 1

    @property
    def label(self) -> str:
        return f"Reduce {self.mode}"

    def reduced_axes(self, ndim: int) -> tuple[int, ...]:
        return tuple(range(ndim)) if self.axes is None else self.axes

    def infer(self, x: TensorType) -> TensorType:
        if self.mode not in REDUCE_MODES:
            raise self.shape_error(f"unknown mode {self.mode!r}; known: {', '.join(REDUCE_MODES)}")
        if self.axes is not None:
            if tuple(sorted(set(self.axes))) != tuple(self.axes) or any(not 0 <= a < x.ndim for a in self.axes):
                raise self.shape_error(
                    f"axes {self.axes} must be sorted, unique and in [0, {x.ndim}) for shape {x.shape}")
        if self.mode in ("MEAN", "SUM_SQR"):
            require_float(self, x)
        if x.dtype == np.bool_ and self.mode not in ("SUM", "PRODUCT"):
            raise DTypeError(f"cannot {self.mode} a bool tensor of shape {x.shape}; cast it first",
                             op=self.label)
        axes = self.reduced_axes(x.ndim)
        if self.axes is None:
            shape = ()
        elif self.keepdims:
            shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
        else:
            shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
        # an extreme of no elements has no value (numpy raises too); an empty result
        # asks for none, so it is no error (softmax over an empty batch)
        empty_axes = [a for a in axes if x.shape[a] == 0]
        if self.mode in ("MAX", "MIN", "SUM_SQR") and empty_axes and math.prod(shape):
            raise self.shape_error(
                f"cannot reduce the empty axis {empty_axes[0]} of shape {x.shape}: the result "
                f"{shape} would hold {self.mode} of no elements")
        return TensorType(shape, reduce_dtype(self.mode, x.dtype))

    def reference(self, x: np.ndarray) -> np.ndarray:
        """numpy's reduction, accumulated in float64 for floats (numpy sums a float32 column
        in float32, row after row, 1e-5 off over a few thousand rows; the compiled kernels
        accumulate in float64 too), rounded once to the result's dtype."""
        axis = self.axes
        keep = self.keepdims and axis is not None
        acc = accumulation_dtype(self.mode, x.dtype)
        with np.errstate(all="ignore"):
            if self.mode == "SUM":
                out = np.sum(x, axis=axis, keepdims=keep, dtype=acc)
            elif self.mode == "MEAN":
                out = np.mean(x, axis=axis, keepdims=keep, dtype=acc)
            elif self.mode in ("MAX", "MIN") and x.size == 0:
                # only an empty result gets here (infer refuses the rest); numpy refuses any
                # zero-size max, empty result or not
                out = np.empty(self.infer(TensorType(x.shape, x.dtype)).shape, x.dtype)
            elif self.mode == "MAX":
                out = np.max(x, axis=axis, keepdims=keep)
            elif self.mode == "MIN":
                out = np.min(x, axis=axis, keepdims=keep)
            elif self.mode == "PRODUCT":
                out = np.prod(x, axis=axis, keepdims=keep, dtype=acc)
            else:
                out = np.sum(np.square(x, dtype=acc), axis=axis, keepdims=keep, dtype=acc)
        return np.asarray(out, dtype=reduce_dtype(self.mode, x.dtype))


def reduce_to_axes(x_shape: tuple[int, ...], target: tuple[int, ...]) -> tuple[int, ...] | None:
    """The axes of `x_shape` that `reduce_to(target)` sums over, or None if it cannot."""
    if len(target) > len(x_shape):
        return None
    padded = (1,) * (len(x_shape) - len(target)) + tuple(target)
    axes = []
    for i, (d, t) in enumerate(zip(x_shape, padded)):
        if d == t and not (i < len(x_shape) - len(target)):
            continue
        if t == 1:
            axes.append(i)
        elif d != t:
            return None
    return tuple(axes)


@dataclass(frozen=True)
class ReduceTo(Op):
    """Sum `x` down to `shape` (op-reference §1.2): the inverse of Broadcast."""

    shape: tuple[int, ...]

    kind = "reduction"
    arity = 1

    def infer(self, x: TensorType) -> TensorType:
        target = check_shape_tuple(self, self.shape)
        if reduce_to_axes(x.shape, target) is None:
            raise self.shape_error(f"cannot reduce shape {x.shape} to {target}")
        if x.dtype == np.bool_:
            raise DTypeError("cannot reduce a bool tensor; cast it first", op=self.label)
        return TensorType(target, x.dtype)

    def reference(self, x: np.ndarray) -> np.ndarray:
        axes = reduce_to_axes(x.shape, self.shape)
        out = np.sum(x, axis=axes, keepdims=True, dtype=x.dtype)
        return out.reshape(self.shape)
