"""Indexing on Tensors: `x[key]`, `index_update`, `index_add` and one-hot indexing.

A numpy key is resolved here, once, into the static items the indexing ops
carry (see `ops/indexing.py`): `None` becomes an AddAxis on x, `...` becomes
full slices, slices are clamped as Python does, integers are wrapped and
range-checked, numpy integer arrays and lists become constants (checked and
wrapped now, since their values are known), and numpy bool masks become
integer arrays through `np.nonzero`. A key with only ints and slices lowers
to Subtensor; any array or integer Tensor makes it advanced
(IndexingMultiAxisVec), where, as in numpy, plain ints count as 0-d index
arrays for the placement of the index block.

Every mistake is a build-time error that names the op and the user's line:
a float index, too many indices, an integer out of range, a mask of the
wrong shape, or a bool Tensor mask (its result shape would depend on the
data, which a static graph cannot have). An out-of-range value in a
constant index array is an error even where numpy lets it pass because the
broadcast index block is empty (`x[[9], []]`): such a key is a mistake.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..errors import BuildError, DTypeError, ShapeError
from ..ir import call_site
from ..ops.common import normalize_axis
from ..ops.indexing import (
    INDEX_DTYPES,
    IndexingIncrMultiAxisVec,
    IndexingMultiAxisVec,
    IndexingOneHot,
    IndexingSetMultiAxisVec,
    IndexingSetOneHot,
    IndexItem,
    SetSubtensor,
    Subtensor,
    TensorItem,
    normalize_slice,
)
from ..ops.shape import AddAxis
from .shapes import broadcast_to, expand_dims, reshape, squeeze, transpose
from .tensor import Tensor, apply, constant, reports_user_line, to_operands

__all__ = ["indexing_one_hot", "indexing_set_one_hot", "index_update", "index_add"]


@dataclass(frozen=True)
class _OpNames:
    """How errors name the op a key lowers to (basic or advanced form)."""

    basic: str
    advanced: str


_GET = _OpNames("Subtensor", "IndexingMultiAxisVec")
_SET = _OpNames("SetSubtensor", "IndexingSetMultiAxisVec")
_ADD = _OpNames("SetSubtensor", "IndexingIncrMultiAxisVec")


@dataclass
class _Region:
    """A resolved key: the tensor indexed (after new axes), its items and index tensors.

    `block_first` marks the one case where numpy's placement differs from
    the op's: index arrays on consecutive axes but separated in the key by
    an ellipsis that stands for no axis (`x[:, 0, ..., [1, 2]]` on a 3-d x).
    numpy then calls them non-consecutive and puts the index block first,
    so the region is transposed into numpy's order.
    """

    x: Tensor
    items: tuple
    index_tensors: list[Tensor]
    block_first: bool = False

    @property
    def advanced(self) -> bool:
        return bool(self.index_tensors)

    def op_shape(self) -> tuple[int, ...]:
        """The shape of the op's result, found without adding a node."""
        if self.advanced:
            types = [t.type for t in self.index_tensors]
            return IndexingMultiAxisVec(self.items).infer(self.x.type, *types).shape
        return Subtensor(self.items).infer(self.x.type).shape

    def numpy_order(self) -> tuple[int, ...] | None:
        """The permutation from the op's result to numpy's, or None if they agree."""
        if not self.block_first:
            return None
        ndim = len(self.op_shape())
        first = next(item.axis for item in self.items if isinstance(item, TensorItem))
        block = ndim - (self.x.ndim - len(self.index_tensors))
        return (*range(first, first + block), *range(first), *range(first + block, ndim))

    @property
    def shape(self) -> tuple[int, ...]:
        """The region's shape in numpy's order."""
        shape, perm = self.op_shape(), self.numpy_order()
        return shape if perm is None else tuple(shape[p] for p in perm)

    def gather(self) -> Tensor:
        if not self.advanced:
            return apply(Subtensor(self.items), self.x) if self.items else self.x
        y = apply(IndexingMultiAxisVec(self.items), self.x, *self.index_tensors)
        perm = self.numpy_order()
        return y if perm is None else transpose(y, perm)

    def to_op_order(self, value: Tensor) -> Tensor:
        """A value laid out in numpy's order, laid out in the op's."""
        perm = self.numpy_order()
        return value if perm is None else transpose(value, tuple(np.argsort(perm)))


def _is_array_key(entry: Any) -> bool:
    return isinstance(entry, (Tensor, list)) or (isinstance(entry, np.ndarray) and entry.ndim > 0)


def _is_int(entry: Any) -> bool:
    if isinstance(entry, (bool, np.bool_)):
        return False
    return isinstance(entry, (int, np.integer)) or (
        isinstance(entry, np.ndarray) and entry.ndim == 0 and entry.dtype.kind in "iu")


class _KeyResolver:
    """Turns one numpy key into a `_Region`; every error names `label` and the user's line."""

    def __init__(self, x: Tensor, key: Any, names: _OpNames, allow_new_axes: bool) -> None:
        self.x = x
        self.entries = key if isinstance(key, tuple) else (key,)
        self.label = names.advanced if any(_is_array_key(e) for e in self.entries) else names.basic
        self.allow_new_axes = allow_new_axes
        self.site = call_site()

    def error(self, cls: type[BuildError], message: str) -> BuildError:
        return cls(message, op=self.label, site=self.site)

    # -- pass 1: what each entry is -------------------------------------------------
    def classify(self, entry: Any) -> tuple[str, Any]:
        if entry is None:
            if not self.allow_new_axes:
                raise self.error(ShapeError, "None (a new axis) is not allowed in an update key")
            return "new", None
        if entry is Ellipsis:
            return "ellipsis", None
        if _is_int(entry):
            return "int", int(entry)
        if isinstance(entry, slice):
            return "slice", self.checked_slice(entry)
        if isinstance(entry, Tensor):
            return "tensor", self.checked_tensor(entry)
        if isinstance(entry, (list, np.ndarray)) and not isinstance(entry, (bool, np.bool_)):
            return self.classify_array(entry)
        if isinstance(entry, (float, np.floating)):
            raise self.error(DTypeError, f"index {entry!r} is a float; indices must be ints, slices, None, ..., "
                                         "integer or bool arrays, or integer Tensors")
        raise self.error(DTypeError, f"cannot index with {entry!r} of type {type(entry).__name__}")

    def checked_slice(self, entry: slice) -> slice:
        bounds = []
        for name in ("start", "stop", "step"):
            value = getattr(entry, name)
            if value is not None and not _is_int(value):
                raise self.error(DTypeError, f"slice {name} {value!r} must be a static int or None "
                                             f"(in {entry}); slices with Tensor or float bounds are not supported")
            bounds.append(None if value is None else operator.index(value))
        if bounds[2] == 0:
            raise self.error(ShapeError, f"slice step cannot be zero (in {entry})")
        return slice(*bounds)

    def checked_tensor(self, entry: Tensor) -> Tensor:
        if entry.dtype == np.bool_:
            raise self.error(ShapeError, f"a bool Tensor mask {entry.shape} would give a result whose shape depends "
                                         "on the data, which a static graph cannot have; use a numpy bool array "
                                         "(known at build time) or gc.where")
        if entry.dtype not in INDEX_DTYPES:
            raise self.error(DTypeError, f"index Tensor has dtype {entry.dtype.name}; index Tensors must be int32 "
                                         "or int64 (cast with .astype('int32'))")
        return entry

    def classify_array(self, entry) -> tuple[str, np.ndarray]:
        if isinstance(entry, list) and any(isinstance(e, Tensor) for e in entry):
            raise self.error(DTypeError, "a list of Tensors cannot be an index; build one integer Tensor "
                                         "(gc.concat) and index with it")
        array = np.asarray(entry)
        if isinstance(entry, list) and array.size == 0:
            array = array.astype(np.int64)  # numpy reads `x[[]]` as an empty integer index
        if array.dtype == np.bool_:
            if array.ndim == 0:
                raise self.error(DTypeError, "a 0-d bool index is not supported; use None to add an axis")
            return "mask", array
        if array.dtype.kind not in "iu":
            raise self.error(DTypeError, f"index array has dtype {array.dtype}; index arrays must hold integers "
                                         "or bools")
        return "array", array

    # -- pass 2: one entry per axis ------------------------------------------------
    def per_axis(self) -> tuple[list[tuple[str, Any]], list[int], bool]:
        """Entries laid over the axes of x with its new axes inserted, where those new axes go,
        and whether an ellipsis standing for no axis separates advanced entries (see `_Region`).
        """
        classified = [self.classify(e) for e in self.entries]
        kinds = [kind for kind, _ in classified]
        if kinds.count("ellipsis") > 1:
            raise self.error(ShapeError, "an index can only have a single ellipsis ('...')")
        consumed = sum(v.ndim if k == "mask" else k not in ("new", "ellipsis") for k, v in classified)
        shape = self.x.shape
        if consumed > len(shape):
            raise self.error(ShapeError, f"too many indices: {consumed} given for a tensor of shape {shape} "
                                         f"(rank {len(shape)})")
        arrays = ("array", "mask", "tensor")
        has_arrays = any(k in arrays for k in kinds)
        advanced_at = [i for i, k in enumerate(kinds) if k in arrays or (k == "int" and has_arrays)]
        split = consumed == len(shape) and "ellipsis" in kinds and bool(advanced_at) and (
            advanced_at[0] < kinds.index("ellipsis") < advanced_at[-1])
        axes: list[tuple[str, Any]] = []
        new_axes: list[int] = []
        source_axis = 0
        for kind, value in classified:
            if kind == "new":
                new_axes.append(len(axes))
                axes.append(("full", None))
            elif kind == "ellipsis":
                fill = len(shape) - consumed
                axes += [("full", None)] * fill
                source_axis += fill
            elif kind == "mask":
                covered = shape[source_axis:source_axis + value.ndim]
                if value.shape != covered:
                    raise self.error(ShapeError, f"bool mask of shape {value.shape} does not match the dims "
                                                 f"{covered} it covers in a tensor of shape {shape}")
                axes += [("array", a) for a in np.nonzero(value)]
                source_axis += value.ndim
            else:
                axes.append((kind, value))
                source_axis += 1
        axes += [("full", None)] * (len(shape) - source_axis)
        return axes, new_axes, split

    def resolve(self) -> _Region:
        """Check every entry against the shape first, then build the nodes (AddAxis, constants)."""
        axes, new_axes, split = self.per_axis()
        shape = list(self.x.shape)
        for position in new_axes:
            shape.insert(position, 1)
        shape = tuple(shape)
        advanced = any(kind in ("array", "tensor") for kind, _ in axes)
        items, indices = [], []
        for axis, (kind, value) in enumerate(axes):
            if kind == "slice":
                item = normalize_slice(axis, value, shape[axis])
                if not item.is_full(shape[axis]):
                    items.append(item)
            elif kind == "int" and not advanced:
                items.append(IndexItem(axis, self.wrapped(np.asarray(value), axis, shape).item()))
            elif kind in ("int", "array", "tensor"):
                indices.append(value if kind == "tensor" else self.index_array(np.asarray(value), axis, shape))
                items.append(TensorItem(axis))
        x = apply(AddAxis(tuple(new_axes)), self.x) if new_axes else self.x
        index_tensors = [i if isinstance(i, Tensor) else constant(i, graph=x.graph) for i in indices]
        indexed = [item.axis for item in items if isinstance(item, TensorItem)]
        consecutive = indexed == list(range(indexed[0], indexed[0] + len(indexed))) if indexed else False
        return _Region(x, tuple(items), index_tensors, block_first=split and consecutive)

    def wrapped(self, index: np.ndarray, axis: int, shape: tuple[int, ...]) -> np.ndarray:
        """Negative values wrapped once; anything still outside [0, shape[axis]) is an error.

        `shape` is that of the tensor indexed, new axes (None) included.
        """
        size = shape[axis]
        index = index.astype(np.int64)
        wrapped = np.where(index < 0, index + size, index)
        bad = (wrapped < 0) | (wrapped >= size)
        if bad.any():
            value = index[bad].ravel()[0]
            raise self.error(ShapeError, f"index {value} is out of range for axis {axis} of size {size} "
                                         f"(indexed shape {shape})")
        return wrapped

    def index_array(self, index: np.ndarray, axis: int, shape: tuple[int, ...]) -> np.ndarray:
        """A constant index array, wrapped and checked, as int32 or int64 (the index dtypes)."""
        dtype = index.dtype if index.dtype in INDEX_DTYPES else np.dtype(np.int64)
        return self.wrapped(index, axis, shape).astype(dtype)


def getitem(x: Tensor, key: Any) -> Tensor:
    """`x[key]` with numpy semantics (what `Tensor.__getitem__` calls)."""
    return _KeyResolver(x, key, _GET, allow_new_axes=True).resolve().gather()


def _fit_value(region: _Region, value: Any, label: str) -> Tensor:
    """`value` in x's dtype (if a scalar), broadcast to the region's shape as numpy assignment does."""
    try:
        target = region.shape
    except BuildError as err:
        raise (err if err.site else err.at(call_site())) from None
    value = to_operands([region.x, value])[1]
    while value.ndim > len(target) and value.shape[0] == 1:  # numpy drops leading 1s of a value
        value = reshape(value, value.shape[1:])
    padded = (1,) * (len(target) - value.ndim) + value.shape
    if value.ndim > len(target) or any(v not in (1, t) for v, t in zip(padded, target)):
        raise ShapeError(f"value of shape {value.shape} does not broadcast to the indexed region's shape {target}",
                         op=label, site=call_site())
    return broadcast_to(value, target)


def index_update(x: Tensor, key: Any, value: Any) -> Tensor:
    """A copy of x with `x[key] = value` (numpy assignment; value broadcast to the region).

    With repeated advanced indices the last value element, in row-major
    order, wins.
    """
    resolver = _KeyResolver(x, key, _SET, allow_new_axes=False)
    region = resolver.resolve()
    value = _fit_value(region, value, resolver.label)
    if region.advanced:
        return apply(IndexingSetMultiAxisVec(region.items), x, region.to_op_order(value), *region.index_tensors)
    return apply(SetSubtensor(region.items), x, value)


def index_add(x: Tensor, key: Any, value: Any) -> Tensor:
    """A copy of x with `value` added at `x[key]`; repeated indices accumulate (np.add.at)."""
    resolver = _KeyResolver(x, key, _ADD, allow_new_axes=False)
    region = resolver.resolve()
    value = _fit_value(region, value, resolver.label)
    if region.advanced:
        return apply(IndexingIncrMultiAxisVec(region.items), x, region.to_op_order(value), *region.index_tensors)
    if not region.items:
        return x + value
    # a basic region never repeats a position, so add-then-set is exact
    return apply(SetSubtensor(region.items), x, region.gather() + value)


@reports_user_line
def indexing_one_hot(src: Tensor, index: Tensor, axis: int = -1, keepdims: bool = False) -> Tensor:
    """`src[..., index[...], ...]` along `axis`: one element per position (take_along_axis)."""
    axis = normalize_axis(IndexingOneHot(axis), axis, src.ndim)
    out = apply(IndexingOneHot(axis), src, index)
    return out if keepdims else squeeze(out, axis)


@reports_user_line
def indexing_set_one_hot(data: Tensor, index: Tensor, sub: Any, axis: int = -1) -> Tensor:
    """A copy of data with one element per position along `axis` replaced by `sub` (put_along_axis).

    `sub` has data's shape with `axis` of size 1, or without `axis`.
    """
    axis = normalize_axis(IndexingSetOneHot(axis), axis, data.ndim)
    sub = to_operands([data, sub])[1]
    if sub.ndim == data.ndim - 1:
        sub = expand_dims(sub, axis)
    return apply(IndexingSetOneHot(axis), data, index, sub)
