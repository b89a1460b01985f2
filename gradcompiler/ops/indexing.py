"""Indexing ops (op-reference §6-§8): basic indexing (Subtensor, SetSubtensor),
advanced indexing (IndexingMultiAxisVec and its Incr/Set scatter forms) and
one-hot indexing (IndexingOneHot, IndexingSetOneHot).

Every index that is known when the graph is built lives in the op as a
static, normalised *item*, one per indexed axis, in increasing axis order
(an axis that is not mentioned is taken whole):

* `SliceItem(axis, start, step, length)`: elements `start + k·step` for
  `0 <= k < length`. The frontend has already applied Python's clamping
  (op-reference §12.2 recommends it over MegEngine's error), so a backend
  reads a slice as a plain affine index map. An empty slice is stored as
  `(0, 1, 0)`, so equal regions give equal (CSE-able) ops.
* `IndexItem(axis, index)`: a static integer, already wrapped into range;
  it removes the axis (Subtensor only).
* `TensorItem(axis)`: the next index-tensor input indexes this axis
  (advanced indexing only). Index tensors are int32/int64 of any shape and
  are broadcast together; their values are only known at run time, so they
  are wrapped and range-checked then (`IndexOutOfRangeError`).

MegEngine passes slice bounds as scalar inputs (§6.1); our shapes are
static, so holding them in the op costs nothing and keeps every gradient op
self-describing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np

from ..errors import DTypeError, GraphError, IndexOutOfRangeError
from ..ir import Op, TensorType
from .common import broadcast_shapes, require_int

INDEX_DTYPES = (np.dtype(np.int32), np.dtype(np.int64))


@dataclass(frozen=True)
class SliceItem:
    """Elements `start + k·step`, `0 <= k < length`, of `axis` (the axis is kept)."""

    axis: int
    start: int
    step: int
    length: int

    def __repr__(self) -> str:
        return f"ax{self.axis}[{self.start}::{self.step} x{self.length}]"

    def as_slice(self) -> slice:
        stop = self.start + self.length * self.step
        return slice(self.start, stop if stop >= 0 else None, self.step)

    def is_full(self, size: int) -> bool:
        return self.start == 0 and self.step == 1 and self.length == size


@dataclass(frozen=True)
class IndexItem:
    """A static integer index into `axis`, already in `[0, size)`; removes the axis."""

    axis: int
    index: int

    def __repr__(self) -> str:
        return f"ax{self.axis}[{self.index}]"


@dataclass(frozen=True)
class TensorItem:
    """`axis` is indexed by the next index-tensor input (advanced indexing)."""

    axis: int

    def __repr__(self) -> str:
        return f"ax{self.axis}[tensor]"



def normalize_slice(axis: int, key: slice, size: int) -> SliceItem:
    """Python's slice semantics on an axis of `size` (bounds clamped), as a SliceItem.

    The caller has checked that the bounds are ints and the step is not zero.
    """
    positions = range(*key.indices(size))
    if not positions:
        return SliceItem(axis, 0, 1, 0)
    return SliceItem(axis, positions.start, positions.step, len(positions))


def _check_items(op: Op, x: TensorType, allowed: tuple[type, ...]) -> None:
    """Items must be of the allowed kinds, on distinct axes in increasing order, and in range."""
    previous = -1
    for item in op.items:
        if not isinstance(item, allowed):
            raise GraphError(f"item {item!r} is not allowed here", op=op.label)
        if not previous < item.axis < x.ndim:
            raise op.shape_error(
                f"items {op.items} must name distinct axes of the {x.ndim}-d input {x.shape} in increasing order")
        previous = item.axis
        size = x.shape[item.axis]
        if isinstance(item, IndexItem) and not 0 <= item.index < size:
            raise op.shape_error(f"index {item.index} is out of range for axis {item.axis} of size {size} "
                                 f"(input shape {x.shape})")
        if isinstance(item, SliceItem):
            last = item.start + (item.length - 1) * item.step
            if item.step == 0 or item.length < 0 or (
                    item.length and not (0 <= item.start < size and 0 <= last < size)):
                raise op.shape_error(f"slice {item!r} does not fit axis {item.axis} of size {size} "
                                     f"(input shape {x.shape})")


def _sliced_shape(op: Op, x: TensorType) -> list[int]:
    """x's shape with every SliceItem applied (axes kept, numbering unchanged)."""
    shape = list(x.shape)
    for item in op.items:
        if isinstance(item, SliceItem):
            shape[item.axis] = item.length
    return shape


def _basic_index(op: Op, ndim: int) -> tuple:
    """The numpy key of a Subtensor region."""
    key: list = [slice(None)] * ndim
    for item in op.items:
        key[item.axis] = item.as_slice() if isinstance(item, SliceItem) else item.index
    return tuple(key)


@dataclass(frozen=True)
class Subtensor(Op):
    """Basic indexing `x[items]`: slices keep their axis, integers remove it (§6.3)."""

    items: tuple[SliceItem | IndexItem, ...]

    kind = "view"
    arity = 1

    def infer(self, x: TensorType) -> TensorType:
        _check_items(self, x, (SliceItem, IndexItem))
        shape = _sliced_shape(self, x)
        removed = {item.axis for item in self.items if isinstance(item, IndexItem)}
        return TensorType(tuple(d for i, d in enumerate(shape) if i not in removed), x.dtype)

    def reference(self, x):
        return np.array(x[_basic_index(self, x.ndim)])


def _check_value(op: Op, data: TensorType, value: TensorType, region: TensorType) -> None:
    if value.dtype != data.dtype:
        raise DTypeError(f"value dtype {value.dtype.name} differs from data dtype {data.dtype.name}", op=op.label)
    if value.shape != region.shape:
        raise op.shape_error(f"value shape {value.shape} must equal the indexed region's shape {region.shape} "
                             f"(data {data.shape}); broadcast the value first")


@dataclass(frozen=True)
class SetSubtensor(Op):
    """`out = copy(data); out[items] = value`; value has exactly the region's shape (§6.4)."""

    items: tuple[SliceItem | IndexItem, ...]

    kind = "scatter"
    arity = 2

    def infer(self, data: TensorType, value: TensorType) -> TensorType:
        _check_value(self, data, value, Subtensor(self.items).infer(data))
        return data

    def reference(self, data, value):
        out = data.copy()
        out[_basic_index(self, data.ndim)] = value
        return out


# -- advanced indexing -------------------------------------------------------------


def _advanced_shape(op: Op, x: TensorType, indices: Sequence[TensorType]) -> tuple[int, ...]:
    """numpy's advanced-indexing result shape (§7.2).

    The broadcast index shape goes where the first indexed axis was when the
    indexed axes are consecutive, and at the front otherwise.
    """
    _check_items(op, x, (SliceItem, TensorItem))
    axes = [item.axis for item in op.items if isinstance(item, TensorItem)]
    if not axes:
        raise GraphError("needs at least one index tensor; use Subtensor for basic indexing", op=op.label)
    if len(indices) != len(axes):
        raise GraphError(f"items {op.items} take {len(axes)} index tensors, got {len(indices)}", op=op.label)
    for axis, t in zip(axes, indices):
        if t.dtype not in INDEX_DTYPES:
            raise DTypeError(f"index tensor for axis {axis} must be int32 or int64, got {t.dtype.name}", op=op.label)
    block = broadcast_shapes(op, *(t.shape for t in indices))
    shape = _sliced_shape(op, x)
    kept = [d for i, d in enumerate(shape) if i not in axes]
    consecutive = axes == list(range(axes[0], axes[0] + len(axes)))
    at = axes[0] if consecutive else 0
    return tuple(kept[:at]) + block + tuple(kept[at:])


def _advanced_index(op: Op, shape: tuple[int, ...], indices: Sequence[np.ndarray]) -> tuple:
    """The numpy key of an advanced region: negatives wrapped once, anything else out of range raises."""
    key: list = [slice(None)] * len(shape)
    tensors = iter(indices)
    for item in op.items:
        if isinstance(item, SliceItem):
            key[item.axis] = item.as_slice()
            continue
        index = np.asarray(next(tensors)).astype(np.int64)
        size = shape[item.axis]
        wrapped = np.where(index < 0, index + size, index)
        bad = (wrapped < 0) | (wrapped >= size)
        if bad.any():
            raise IndexOutOfRangeError(f"{op.label}: index value {index[bad].ravel()[0]} is out of range for "
                                       f"axis {item.axis} of size {size} (data shape {tuple(shape)})")
        key[item.axis] = wrapped
    return tuple(key)


def scatter_positions(op: Op, shape: tuple[int, ...], indices: Sequence[np.ndarray]) -> np.ndarray:
    """Flat position in the data of every element of the region, in the region's row-major order.

    Gathering from a grid of positions gives exactly where each value
    element lands, so scatter-add and last-write-wins share one definition.
    """
    grid = np.arange(math.prod(shape), dtype=np.int64).reshape(shape)
    return grid[_advanced_index(op, shape, indices)].ravel()


@dataclass(frozen=True)
class IndexingMultiAxisVec(Op):
    """Advanced indexing `x[items]` with index tensors, numpy semantics (§7.2)."""

    items: tuple[SliceItem | TensorItem, ...]

    kind = "gather"

    def infer(self, x: TensorType, *indices: TensorType) -> TensorType:
        return TensorType(_advanced_shape(self, x, indices), x.dtype)

    def reference(self, x, *indices):
        return np.array(x[_advanced_index(self, x.shape, indices)])


class _AdvancedScatterShape:
    """Shape rule of the two advanced-indexing scatters (inputs data, value, *indices).

    Incr and Set write into the same region and differ only in how they
    combine values, so their build-time check lives here once; a mixin, not an
    Op, so `all_op_classes()` does not list it. Subclasses declare `items`.
    """

    kind: ClassVar[str] = "scatter"

    def infer(self, data: TensorType, value: TensorType, *indices: TensorType) -> TensorType:
        _check_value(self, data, value, IndexingMultiAxisVec(self.items).infer(data, *indices))
        return data


@dataclass(frozen=True)
class IndexingIncrMultiAxisVec(_AdvancedScatterShape, Op):
    """`out = copy(data); out[region] += value`; duplicate positions accumulate (np.add.at) (§7.3)."""

    items: tuple[SliceItem | TensorItem, ...]

    def reference(self, data, value, *indices):
        out = data.copy()
        np.add.at(out.reshape(-1), scatter_positions(self, data.shape, indices), value.ravel())
        return out


@dataclass(frozen=True)
class IndexingSetMultiAxisVec(_AdvancedScatterShape, Op):
    """`out = copy(data); out[region] = value` (§7.3).

    Where several value elements land on one position, the last one in the
    value's row-major order wins (MegEngine's naive kernel order; §12.3).
    """

    items: tuple[SliceItem | TensorItem, ...]

    def reference(self, data, value, *indices):
        positions = scatter_positions(self, data.shape, indices)
        # np.unique returns first occurrences; on the reversed list those are the last writes
        _, first_in_reversed = np.unique(positions[::-1], return_index=True)
        winners = positions.size - 1 - first_in_reversed
        out = data.copy()
        out.reshape(-1)[positions[winners]] = value.reshape(-1)[winners]
        return out


# -- one-hot indexing ----------------------------------------------------------------


def _one_hot_check(op: Op, src: TensorType, index: TensorType) -> None:
    require_int(op, index)
    if src.ndim < 2 or not 0 <= op.axis < src.ndim:
        raise op.shape_error(f"needs rank >= 2 and a normalised axis; got shape {src.shape}, axis {op.axis}")
    expected = src.shape[: op.axis] + src.shape[op.axis + 1:]
    if index.shape != expected:
        raise op.shape_error(f"index shape {index.shape} must be {expected} (src {src.shape} without axis {op.axis})")


def one_hot_range_message(op: Op, value: int, n: int) -> str:
    """What an index `value` outside [0, n) is, in the words of whoever built the gather (a
    loss names its labels and the user's line); every backend raises this same text."""
    about = getattr(op, "about", None)
    if about:
        return f"{about}: label {value} is outside the valid range [0, {n})"
    return f"{op.label}: index value {value} is outside [0, {n}) along axis {op.axis}"


def _check_one_hot_range(op: Op, index: np.ndarray, n: int) -> None:
    """Values must lie in [0, n): one-hot indexing does not wrap negatives (§8.1)."""
    if index.size and (index.min() < 0 or index.max() >= n):
        bad = index[(index < 0) | (index >= n)].ravel()[0]
        raise IndexOutOfRangeError(one_hot_range_message(op, int(bad), n))


@dataclass(frozen=True)
class IndexingOneHot(Op):
    """Gather one element per position along `axis`; output keeps the axis with size 1 (§8.1).

    `about`, when set, names what the indices are for an out-of-range message (a loss's
    labels, their feed and the user's line); no part of the op's identity (equal ops compute
    the same thing).
    """

    axis: int
    about: str | None = field(default=None, compare=False)

    kind = "gather"
    arity = 2

    def infer(self, src: TensorType, index: TensorType) -> TensorType:
        _one_hot_check(self, src, index)
        shape = list(src.shape)
        shape[self.axis] = 1
        return TensorType(tuple(shape), src.dtype)

    def reference(self, src, index):
        _check_one_hot_range(self, index, src.shape[self.axis])
        return np.take_along_axis(src, np.expand_dims(index, self.axis).astype(np.intp), self.axis)


@dataclass(frozen=True)
class IndexingSetOneHot(Op):
    """`out = copy(data); out[..., index[...], ...] = sub[..., 0, ...]` along `axis` (§8.2)."""

    axis: int

    kind = "scatter"
    arity = 3

    def infer(self, data: TensorType, index: TensorType, sub: TensorType) -> TensorType:
        _one_hot_check(self, data, index)
        expected = list(data.shape)
        expected[self.axis] = 1
        if sub.shape != tuple(expected):
            raise self.shape_error(
                f"sub shape {sub.shape} must be {tuple(expected)} (data {data.shape}, axis {self.axis})")
        if sub.dtype != data.dtype:
            raise DTypeError(f"sub dtype {sub.dtype.name} differs from data dtype {data.dtype.name}", op=self.label)
        return data

    def reference(self, data, index, sub):
        _check_one_hot_range(self, index, data.shape[self.axis])
        out = data.copy()
        np.put_along_axis(out, np.expand_dims(index, self.axis).astype(np.intp), sub, self.axis)
        return out
