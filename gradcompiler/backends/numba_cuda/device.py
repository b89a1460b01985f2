"""Device-side plumbing shared by the CUDA library kernels and the generated
kernels: launch geometry (`LaunchConfig`), moving arrays to the device,
flat views, fills, and host/device validation of index values.

Launch geometry is a parameter everywhere, never a constant in a kernel
body, because the same kernels run on a real GPU (hundreds of threads per
block) and on Numba's simulator, which runs every GPU thread as a Python
thread and needs tiny blocks and grids to finish in test time. Kernels
take the geometry as closure constants (shared-memory sizes must be
compile-time constants), so each kernel factory is cached per config.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from numba import cuda

from ...errors import FeedError, IndexOutOfRangeError
from . import simulator_active


@dataclass(frozen=True)
class LaunchConfig:
    """Block sizes and grid caps of every kernel this backend launches.

    * `block`: threads per block of the 1-D grid-stride kernels;
    * `max_blocks`: the most blocks a grid-stride kernel is launched with
      (the loop covers the rest);
    * `reduce_block`: threads per block of a tree reduction (a power of two);
    * `tile`: edge of the square shared-memory tiles of matmul
      (`tile`² threads per block);
    * `column_chunks`: the most partial rows of a two-stage reduction;
    * `partial_blocks`: the most blocks of a generated kernel whose reductions leave one
      partial per block (enough to fill an H200: 132 multiprocessors × 8 blocks of 256
      threads; more would only add partials to fold);
    * `warp_shuffle`: finish tree reductions with warp shuffles when a
      block holds a whole warp (None or True; the simulator has none, so
      it never does there).
    """

    block: int = 256
    max_blocks: int = 4096
    reduce_block: int = 256
    tile: int = 16
    column_chunks: int = 64
    partial_blocks: int = 1024
    warp_shuffle: bool | None = None

    def __post_init__(self) -> None:
        for name in ("block", "max_blocks", "reduce_block", "tile", "column_chunks", "partial_blocks"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"LaunchConfig.{name} must be a positive int, got {value!r}")
        if self.reduce_block & (self.reduce_block - 1):
            raise ValueError(f"LaunchConfig.reduce_block must be a power of two, got {self.reduce_block}")
        if self.block > 1024 or self.reduce_block > 1024 or self.tile * self.tile > 1024:
            raise ValueError(f"{self} asks for more than 1024 threads per block")

    @property
    def shuffle(self) -> bool:
        """Whether tree reductions end in warp shuffles (never on the simulator)."""
        if simulator_active(cuda):
            return False
        return self.reduce_block >= 32 and self.warp_shuffle is not False

    def grid(self, work: int, block: int | None = None) -> int:
        """Blocks of a 1-D grid-stride launch over `work` items."""
        block = block or self.block
        return max(1, min(self.max_blocks, math.ceil(work / block)))


SHUFFLE_DTYPES = tuple(np.dtype(t) for t in (np.int32, np.int64, np.uint32, np.uint64, np.float32, np.float64))
"""What `cuda.shfl_down_sync` moves; reductions of other dtypes end their tree in shared memory."""

SIMULATOR_CONFIG = LaunchConfig(block=16, max_blocks=4, reduce_block=8, tile=4, column_chunks=4, partial_blocks=4)
"""Tiny blocks and grids: the simulator runs each GPU thread as a Python thread."""


def default_config() -> LaunchConfig:
    return SIMULATOR_CONFIG if simulator_active(cuda) else LaunchConfig()


# -- arrays ---------------------------------------------------------------------------------------

def is_device_array(obj: Any) -> bool:
    """A Numba device array (real or simulated) or any object exporting `__cuda_array_interface__`."""
    return bool(getattr(obj, "__cuda_ndarray__", False)) or hasattr(obj, "__cuda_array_interface__")


def to_device(value: Any, stream: Any = 0, what: str = "array") -> Any:
    """`value` on the device: device arrays as they are (no copy), anything else copied once.

    Kernels index flat views, so a device array must be C-contiguous.
    """
    if getattr(value, "__cuda_ndarray__", False):
        device = value
    elif hasattr(value, "__cuda_array_interface__"):
        device = cuda.as_cuda_array(value)
    else:
        array = np.asarray(value)
        if not array.flags.c_contiguous:
            array = np.ascontiguousarray(array)
        return cuda.to_device(array, stream=stream)
    if device.size > 1 and not device.is_c_contiguous():
        raise FeedError(f"{what} is a non-contiguous device array (strides {device.strides}); "
                        "pass a C-contiguous one")
    return device


def device_address(array: Any) -> int:
    """Where `array`'s data starts: its device pointer (`__cuda_array_interface__`), or on
    Numba's simulator, whose device arrays are host memory, its host pointer."""
    interface = getattr(array, "__cuda_array_interface__", None)
    if interface is None:
        interface = array.__array_interface__
    return int(interface["data"][0] or 0)


def stream_pointer(stream: Any) -> int:
    """The driver's handle of a Numba stream (or 0) as an int: numba-cuda 0.30's
    `Stream.handle` is a `CUstream` (`int()` reads it), older ones' a ctypes pointer."""
    handle = getattr(stream, "handle", stream)
    value = getattr(handle, "value", handle)
    return int(value or 0)


def flat(array: Any) -> Any:
    """A 1-D view of a contiguous device array (a 0-d array becomes shape (1,))."""
    return array if array.ndim == 1 else array.reshape(array.size if array.ndim else 1)


def view(array: Any, shape: Sequence[int]) -> Any:
    """`array` (contiguous) seen with `shape`, same element count, no copy."""
    shape = tuple(int(d) for d in shape)
    return array if tuple(array.shape) == shape else array.reshape(shape)


def host_copy(array: Any) -> np.ndarray:
    """`array` on the host (a device array is copied back; a host one is returned as is)."""
    return array.copy_to_host() if is_device_array(array) else np.asarray(array)


def device_constant(values: Sequence[int] | np.ndarray, dtype: Any = np.int64, stream: Any = 0) -> Any:
    """Small metadata (shapes, strides, index tables) as a device array: constants go in as arrays."""
    array = np.ascontiguousarray(np.asarray(values, dtype=dtype).reshape(-1))
    return cuda.to_device(array if array.size else np.zeros(1, dtype), stream=stream)


@cuda.jit
def _fill_kernel(out, value):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = value


@cuda.jit
def _copy_kernel(src, out):
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        out[i] = src[i]


def fill(array: Any, value: Any, config: LaunchConfig, stream: Any = 0) -> None:
    """Set every element of a contiguous device array to `value`."""
    if array.size:
        target = flat(array)
        _fill_kernel[config.grid(array.size), config.block, stream](target, array.dtype.type(value))


def copy(src: Any, out: Any, config: LaunchConfig, stream: Any = 0) -> None:
    """Copy device array `src` into `out` (same size), device to device."""
    if src is not out and out.size:
        _copy_kernel[config.grid(out.size), config.block, stream](flat(src), flat(out))


# -- index values ---------------------------------------------------------------------------------

@cuda.jit(device=True)
def offset_of(i, shape, strides):
    """Offset of row-major position `i` of `shape` in an array with element `strides`."""
    rest = i
    offset = 0
    for d in range(shape.shape[0] - 1, -1, -1):
        offset += (rest % shape[d]) * strides[d]
        rest //= shape[d]
    return offset


@cuda.jit
def _gather_index_kernel(index, out, out_shape, index_strides, size, wrap, bad):
    """out[i] = index at the broadcast position of i, wrapped; bad[0] counts values out of range."""
    for i in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
        value = index[offset_of(i, out_shape, index_strides)]
        if wrap and value < 0:
            value += size
        if value < 0 or value >= size:
            cuda.atomic.add(bad, 0, 1)
            value = 0
        out[i] = value


def _broadcast_strides(shape: tuple[int, ...], target: tuple[int, ...]) -> np.ndarray:
    """Element strides of a row-major `shape` read at a position of `target` (0 where broadcast)."""
    padded = (1,) * (len(target) - len(shape)) + tuple(shape)
    strides, step = [], 1
    for d in reversed(padded):
        strides.append(step if d != 1 else 0)
        step *= d
    return np.array(strides[::-1] or [0], dtype=np.int64)


@dataclass(frozen=True)
class IndexSpec:
    """How one index tensor is read: the axis size it indexes, whether negatives wrap, and
    how to name a bad value (`describe(value) -> message`)."""

    size: int
    wrap: bool
    describe: Any


class IndexChecker:
    """The index tensors of one launch site broadcast to `block_shape`, wrapped, range-checked,
    as one int64 device array of shape (len(specs), max(1, prod(block_shape))).

    Host arrays are checked on the host before anything is copied; device arrays are checked by
    a small kernel whose count of bad values is read back before the caller launches its own
    kernel. Either way a bad value raises IndexOutOfRangeError and no kernel reads it.

    The packed array, the bad-value counter and the broadcast metadata are allocated once (the
    strides at the first call, as they follow the index's shape) and written again by every
    later call: an allocation per call costs more than the check (about 0.15 ms each on the
    H200 machine of docs/gpu-notes.md, against a few microseconds for the check's kernel). A
    later call's writes are ordered after the earlier call's readers on the stream, as for the
    executable's other buffers.
    """

    def __init__(self, specs: Sequence[IndexSpec], block_shape: tuple[int, ...], config: LaunchConfig):
        self.specs, self.block_shape, self.config = tuple(specs), tuple(block_shape), config
        self.count = math.prod(self.block_shape)
        self._packed = cuda.device_array((len(self.specs), max(1, self.count)), np.int64)
        self._bad = cuda.device_array(1, np.int64)
        self._shape = device_constant(self.block_shape or (1,))
        self._strides: dict[tuple[int, ...], Any] = {}

    def _strides_for(self, shape: tuple[int, ...], stream: Any) -> Any:
        if shape not in self._strides:
            self._strides[shape] = device_constant(_broadcast_strides(shape, self.block_shape), stream=stream)
        return self._strides[shape]

    def __call__(self, indices: Sequence[Any], stream: Any = 0) -> Any:
        packed = self._packed
        if not indices or not self.count:
            return packed
        if not any(is_device_array(i) for i in indices):
            rows = [_checked_on_host(index, spec, self.block_shape) for index, spec in zip(indices, self.specs)]
            packed.copy_to_device(np.stack(rows), stream=stream)
            return packed
        fill(self._bad, 0, self.config, stream)
        for row, (index, spec) in enumerate(zip(indices, self.specs)):
            device = to_device(index, stream, "an index tensor")
            strides = self._strides_for(tuple(device.shape), stream)
            _gather_index_kernel[self.config.grid(self.count), self.config.block, stream](
                flat(device), packed[row], self._shape, strides, spec.size, spec.wrap, self._bad)
        if int(self._bad.copy_to_host(stream=stream)[0]):
            for index, spec in zip(indices, self.specs):  # the error path: find the value to name
                _checked_on_host(host_copy(index), spec, self.block_shape)
        return packed


def _checked_on_host(index: Any, spec: IndexSpec, block_shape: tuple[int, ...]) -> np.ndarray:
    raw = np.broadcast_to(np.asarray(index), block_shape).reshape(-1)
    values = raw.astype(np.int64)
    if spec.wrap:
        values = np.where(values < 0, values + spec.size, values)
    bad = (values < 0) | (values >= spec.size)
    if bad.any():
        raise IndexOutOfRangeError(spec.describe(int(raw[bad][0])))
    return values
