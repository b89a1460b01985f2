"""Gathers and scatters on the GPU (op-reference §6-§8) and Concat (§1.5).

Basic and advanced indexing share one description, the *region map*: for
element `o` of the indexed region (row-major), its flat offset in the data
is `base + Σ_d digit_d(o)·coeff[d] + Σ_j index_j[block(o)]·axis_stride[j]`,
where the digits are o's coordinates, static slices and integer indices
live in `coeff` and `base`, and the index tensors (advanced indexing) are
broadcast to the index block and read at `block(o)`. A gather reads data
at that offset; a scatter writes value element `o` there:

* IndexingIncrMultiAxisVec adds with atomics, so repeated positions
  accumulate (a `kernel.FilledScatter` fills its output, then adds alike);
* IndexingSetMultiAxisVec keeps the reference's last-write-wins order
  deterministic on a GPU: every value element first claims its position
  with an atomic max of its own number, then only the winner writes;
* SetSubtensor's region never repeats a position, so it stores directly.

One-hot indexing views the data as (pre, n, post) and the index as
(pre, post). Index values are checked before any kernel reads them
(`device.IndexChecker`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda

from ...errors import DTypeError
from ...index_expr import strides as row_major
from ...ir import Op, TensorType
from ...kernel import FilledScatter
from ...ops.indexing import (
    IndexingIncrMultiAxisVec,
    IndexingMultiAxisVec,
    IndexingOneHot,
    IndexingSetMultiAxisVec,
    IndexingSetOneHot,
    IndexItem,
    SetSubtensor,
    SliceItem,
    Subtensor,
    TensorItem,
    one_hot_range_message,
)
from ...ops.shape import Concat
from .device import IndexChecker, IndexSpec, LaunchConfig, copy, device_constant, fill, flat, to_device
from .library import Launcher, cuda_library_kernel

ATOMIC_ADD_DTYPES = tuple(np.dtype(t) for t in (np.float32, np.float64, np.int32, np.int64,
                                                 np.uint32, np.uint64))


# -- the region map -----------------------------------------------------------------------------

@cuda.jit(device=True)
def _locate(o, shape, coeff, block_coeff, base, packed, axis_strides):
    """Flat data offset of region element `o` (see the module docstring)."""
    rest = o
    offset = base
    block = 0
    for d in range(shape.shape[0] - 1, -1, -1):
        digit = rest % shape[d]
        rest //= shape[d]
        offset += digit * coeff[d]
        block += digit * block_coeff[d]
    for j in range(packed.shape[0]):
        offset += packed[j, block] * axis_strides[j]
    return offset


@cuda.jit
def _gather_kernel(data, out, shape, coeff, block_coeff, base, packed, axis_strides):
    for o in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[o] = data[_locate(o, shape, coeff, block_coeff, base, packed, axis_strides)]


@cuda.jit
def _scatter_add_kernel(value, out, shape, coeff, block_coeff, base, packed, axis_strides):
    for o in range(cuda.grid(1), value.shape[0], cuda.gridsize(1)):
        cuda.atomic.add(out, _locate(o, shape, coeff, block_coeff, base, packed, axis_strides), value[o])


@cuda.jit
def _scatter_store_kernel(value, out, shape, coeff, block_coeff, base, packed, axis_strides):
    for o in range(cuda.grid(1), value.shape[0], cuda.gridsize(1)):
        out[_locate(o, shape, coeff, block_coeff, base, packed, axis_strides)] = value[o]


@cuda.jit
def _claim_kernel(winner, count, shape, coeff, block_coeff, base, packed, axis_strides):
    for o in range(cuda.grid(1), count, cuda.gridsize(1)):
        cuda.atomic.max(winner, _locate(o, shape, coeff, block_coeff, base, packed, axis_strides), o)


@cuda.jit
def _store_winners_kernel(value, out, winner, shape, coeff, block_coeff, base, packed, axis_strides):
    for o in range(cuda.grid(1), value.shape[0], cuda.gridsize(1)):
        offset = _locate(o, shape, coeff, block_coeff, base, packed, axis_strides)
        if winner[offset] == o:
            out[offset] = value[o]


@dataclass
class _RegionMap:
    """Device metadata of a region map, and how to check its index tensors."""

    size: int
    shape: Any
    coeff: Any
    block_coeff: Any
    base: int
    axis_strides: Any
    check: IndexChecker

    def arguments(self, indices: Sequence[Any], stream: Any) -> tuple:
        packed = self.check(indices, stream)
        return self.shape, self.coeff, self.block_coeff, self.base, packed, self.axis_strides


def _region_map(op: Op, data: TensorType, index_types: Sequence[TensorType], config: LaunchConfig) -> _RegionMap:
    """The region map of `op.items` on `data` (basic items, or advanced with index tensors)."""
    strides = row_major(data.shape)
    base = 0
    kept: list[tuple[int, int]] = []  # (size, data coefficient) of each kept axis, in order
    tensor_axes: list[int] = []
    items = {item.axis: item for item in op.items}
    for axis, size in enumerate(data.shape):
        item = items.get(axis)
        if isinstance(item, SliceItem):
            base += item.start * strides[axis]
            kept.append((item.length, item.step * strides[axis]))
        elif isinstance(item, IndexItem):
            base += item.index * strides[axis]
        elif isinstance(item, TensorItem):
            tensor_axes.append(axis)
        else:
            kept.append((size, strides[axis]))
    block_shape = np.broadcast_shapes(*(t.shape for t in index_types)) if index_types else ()
    dims = [(size, c, 0) for size, c in kept]
    if tensor_axes:
        consecutive = tensor_axes == list(range(tensor_axes[0], tensor_axes[0] + len(tensor_axes)))
        at = tensor_axes[0] if consecutive else 0  # numpy's rule (§7.2)
        block = [(size, 0, s) for size, s in zip(block_shape, row_major(tuple(block_shape)))]
        dims = dims[:at] + block + dims[at:]

    def describe(axis: int):
        size = data.shape[axis]
        return lambda v: (f"{op.label}: index value {v} is out of range for axis {axis} of size {size} "
                          f"(data shape {data.shape})")

    shape = tuple(d[0] for d in dims)
    return _RegionMap(
        size=math.prod(shape), shape=device_constant(shape or (1,)),
        coeff=device_constant([d[1] for d in dims] or [0]),
        block_coeff=device_constant([d[2] for d in dims] or [0]), base=base,
        axis_strides=device_constant([strides[a] for a in tensor_axes] or [0]),
        check=IndexChecker([IndexSpec(data.shape[a], True, describe(a)) for a in tensor_axes],
                           tuple(block_shape), config))


# -- gathers --------------------------------------------------------------------------------------

class _Gather:
    def __init__(self, region: _RegionMap, config: LaunchConfig):
        self.region, self.config = region, config

    def __call__(self, data: Any, *indices: Any, out: Any, stream: Any = 0) -> None:
        if not out.size:
            return
        args = self.region.arguments(indices, stream)
        _gather_kernel[self.config.grid(out.size), self.config.block, stream](
            flat(to_device(data, stream)), flat(out), *args)


@cuda_library_kernel.register(Subtensor)
@cuda_library_kernel.register(IndexingMultiAxisVec)
def _gather(op: Op, input_types: Sequence[TensorType], config: LaunchConfig) -> Launcher:
    return _Gather(_region_map(op, input_types[0], input_types[1:], config), config)


# -- scatters -------------------------------------------------------------------------------------

class _Scatter:
    """out = copy(data), then the value is added or stored into the region."""

    def __init__(self, region: _RegionMap, mode: str, config: LaunchConfig):
        self.region, self.mode, self.config = region, mode, config
        self._winner: Any = None  # last_wins: the claim of each output position, allocated once

    def __call__(self, data: Any, value: Any, *indices: Any, out: Any, stream: Any = 0) -> None:
        args = self.region.arguments(indices, stream)  # checked before out is touched
        copy(to_device(data, stream), out, self.config, stream)
        self.write(value, args, out, stream)

    def write(self, value: Any, args: tuple, out: Any, stream: Any) -> None:
        """The value into the region of `out`, which holds the data already."""
        config = self.config
        if not self.region.size:
            return
        value, target = flat(to_device(value, stream)), flat(out)
        grid = (config.grid(self.region.size), config.block, stream)
        if self.mode == "add":
            _scatter_add_kernel[grid](value, target, *args)
        elif self.mode == "store":
            _scatter_store_kernel[grid](value, target, *args)
        else:
            if self._winner is None:
                self._winner = cuda.device_array(out.size, np.int64, stream=stream)
            winner = self._winner
            fill(winner, -1, config, stream)
            _claim_kernel[grid](winner, self.region.size, *args)
            _store_winners_kernel[grid](value, target, winner, *args)


@cuda_library_kernel.register
def _set_subtensor(op: SetSubtensor, input_types: Sequence[TensorType], config: LaunchConfig) -> Launcher:
    return _Scatter(_region_map(op, input_types[0], (), config), "store", config)


@cuda_library_kernel.register
def _incr_multi_axis(op: IndexingIncrMultiAxisVec, input_types: Sequence[TensorType],
                     config: LaunchConfig) -> Launcher:
    if input_types[0].dtype not in ATOMIC_ADD_DTYPES:
        raise DTypeError(f"the CUDA scatter-add needs atomic adds, which {input_types[0].dtype.name} "
                         f"lacks; cast to one of {[d.name for d in ATOMIC_ADD_DTYPES]}", op=op.label)
    return _Scatter(_region_map(op, input_types[0], input_types[2:], config), "add", config)


class _FilledScatter:
    """`kernel.FilledScatter`: out = full(shape, c), then the scatter-add's atomic adds."""

    def __init__(self, scatter: _Scatter, value: float):
        self.scatter, self.value = scatter, value

    def __call__(self, value: Any, index: Any, *, out: Any, stream: Any = 0) -> None:
        args = self.scatter.region.arguments((index,), stream)  # checked before out is touched
        fill(out, self.value, self.scatter.config, stream)
        self.scatter.write(value, args, out, stream)


@cuda_library_kernel.register
def _filled_scatter(op: FilledScatter, input_types: Sequence[TensorType], config: LaunchConfig) -> Launcher:
    data = TensorType(op.fill.shape, op.fill.dtype)
    return _FilledScatter(_incr_multi_axis(op.scatter, (data, *input_types), config), op.fill.value)


@cuda_library_kernel.register
def _set_multi_axis(op: IndexingSetMultiAxisVec, input_types: Sequence[TensorType],
                    config: LaunchConfig) -> Launcher:
    return _Scatter(_region_map(op, input_types[0], input_types[2:], config), "last_wins", config)


# -- one-hot --------------------------------------------------------------------------------------

@cuda.jit
def _one_hot_gather_kernel(src, out, index, n, post):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = src[((i // post) * n + index[0, i]) * post + i % post]


@cuda.jit
def _one_hot_store_kernel(sub, out, index, n, post):
    for i in range(cuda.grid(1), sub.shape[0], cuda.gridsize(1)):
        out[((i // post) * n + index[0, i]) * post + i % post] = sub[i]


class _OneHot:
    """IndexingOneHot (gather) or IndexingSetOneHot (copy, then store) along `op.axis`."""

    def __init__(self, op: IndexingOneHot | IndexingSetOneHot, data: TensorType, config: LaunchConfig):
        n = data.shape[op.axis]
        self.n, self.post = n, math.prod(data.shape[op.axis + 1:])
        self.index_shape = data.shape[:op.axis] + data.shape[op.axis + 1:]
        self.check = IndexChecker([IndexSpec(n, False, lambda v: one_hot_range_message(op, v, n))],
                                  self.index_shape, config)
        self.config = config

    def checked(self, index: Any, stream: Any) -> Any:
        return self.check([index], stream)

    def grid(self, stream: Any) -> tuple:
        return self.config.grid(math.prod(self.index_shape)), self.config.block, stream


class _OneHotGather(_OneHot):
    def __call__(self, src: Any, index: Any, *, out: Any, stream: Any = 0) -> None:
        packed = self.checked(index, stream)
        if out.size:
            _one_hot_gather_kernel[self.grid(stream)](flat(to_device(src, stream)), flat(out), packed,
                                                      self.n, self.post)


class _OneHotSet(_OneHot):
    def __call__(self, data: Any, index: Any, sub: Any, *, out: Any, stream: Any = 0) -> None:
        packed = self.checked(index, stream)
        copy(to_device(data, stream), out, self.config, stream)
        if sub.size:
            _one_hot_store_kernel[self.grid(stream)](flat(to_device(sub, stream)), flat(out), packed,
                                                     self.n, self.post)


@cuda_library_kernel.register
def _indexing_one_hot(op: IndexingOneHot, input_types: Sequence[TensorType], config: LaunchConfig) -> Launcher:
    return _OneHotGather(op, input_types[0], config)


@cuda_library_kernel.register
def _indexing_set_one_hot(op: IndexingSetOneHot, input_types: Sequence[TensorType],
                          config: LaunchConfig) -> Launcher:
    return _OneHotSet(op, input_types[0], config)


# -- concat ---------------------------------------------------------------------------------------

@cuda.jit
def _copy_into_kernel(src, out, src_row, out_row, offset):
    """src seen as rows of `src_row` elements lands at `offset` in rows of `out_row` elements."""
    for i in range(cuda.grid(1), src.shape[0], cuda.gridsize(1)):
        out[(i // src_row) * out_row + offset + i % src_row] = src[i]


class _Concat:
    def __init__(self, op: Concat, input_types: Sequence[TensorType], config: LaunchConfig):
        post = math.prod(input_types[0].shape[op.axis + 1:])
        total = sum(t.shape[op.axis] for t in input_types)
        offsets = np.cumsum([0] + [t.shape[op.axis] for t in input_types])[:-1]
        self.parts = [(t.size, t.shape[op.axis] * post, int(at) * post)
                      for t, at in zip(input_types, offsets)]
        self.out_row, self.config = total * post, config

    def __call__(self, *inputs: Any, out: Any, stream: Any = 0) -> None:
        for x, (size, row, offset) in zip(inputs, self.parts):
            if size:
                _copy_into_kernel[self.config.grid(size), self.config.block, stream](
                    flat(to_device(x, stream)), flat(out), row, self.out_row, offset)


@cuda_library_kernel.register
def _concat(op: Concat, input_types: Sequence[TensorType], config: LaunchConfig) -> Launcher:
    return _Concat(op, input_types, config)

