"""Reductions on the GPU: Reduce (every mode, any axes; op-reference §3) and
ReduceTo (§1.2), in one of two shapes chosen from the layout.

* **Row** reduction, when the reduced elements of one output are (at the
  innermost end) contiguous: one block per output row; its threads stride
  over the row, so neighbouring threads read neighbouring elements, and
  combine their partial results in a shared-memory tree (finished with warp
  shuffles on a real GPU, `LaunchConfig.shuffle`). When there are too few
  rows to fill the grid (a full reduction has one), each row is split over
  several blocks and a second stage combines the partials.
* **Column** (two-stage) reduction, when the innermost axis is kept, as in
  a reduction over the leading axis: neighbouring threads own neighbouring
  outputs, so reads stay coalesced; stage one gives each thread a chunk of
  the reduced rows and writes (chunks, outputs) partials, stage two folds
  the chunks.

Every kernel reads the input through (shape, strides) tables of the kept
and the reduced axes, so any set of axes works without a transpose.
Accumulation is in the result's dtype, as the reference does it (an integer sum in int64); MEAN
divides once, at the end.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import cuda, from_dtype

from ...index_expr import strides as row_major
from ...ir import TensorType
from ...ops.reduce import Reduce, ReduceTo, reduce_to_axes
from .device import SHUFFLE_DTYPES, LaunchConfig, device_constant, flat, offset_of, to_device
from .launch import PreboundKernel
from .library import Launcher, cuda_library_kernel


@cuda.jit(device=True)
def _add(a, b):
    return a + b


@cuda.jit(device=True)
def _multiply(a, b):
    return a * b


@cuda.jit(device=True)
def _maximum(a, b):
    """max that propagates NaN, as numpy's does."""
    return a if a >= b or a != a else b


@cuda.jit(device=True)
def _minimum(a, b):
    return a if a <= b or a != a else b


_COMBINE = {"SUM": _add, "MEAN": _add, "SUM_SQR": _add, "PRODUCT": _multiply, "MAX": _maximum, "MIN": _minimum}


def identity(mode: str, dtype: np.dtype) -> Any:
    """The value every accumulator starts from."""
    if mode == "PRODUCT":
        return dtype.type(1)
    if mode in ("MAX", "MIN"):
        sign = -1 if mode == "MAX" else 1
        if dtype.kind == "f":
            return dtype.type(sign * np.inf)
        info = np.iinfo(dtype)
        return dtype.type(info.min if mode == "MAX" else info.max)
    return dtype.type(0)


@functools.cache
def _kernels(mode: str, dtype: np.dtype, block: int, shuffle: bool):
    """(row kernel, column kernel) of `mode` on `dtype` with `block` threads per row block."""
    combine = _COMBINE[mode]
    shuffle = shuffle and dtype in SHUFFLE_DTYPES
    mean = mode == "MEAN"
    square = mode == "SUM_SQR"
    element = from_dtype(dtype)
    shared_levels = 16 if shuffle else 0  # the tree stops at one warp when shuffles finish it

    @cuda.jit
    def row(x, out, kept_shape, kept_strides, red_shape, red_strides, n_red, splits, start, divisor, first,
            last):
        """out[s·O + o] = the s-th of `splits` slices of output o's row, tree-combined in a block."""
        partial = cuda.shared.array(block, element)
        t = cuda.threadIdx.x
        n_out = out.shape[0] // splits
        for task in range(cuda.blockIdx.x, out.shape[0], cuda.gridDim.x):
            o = task % n_out
            base = offset_of(o, kept_shape, kept_strides)
            acc = start
            for r in range((task // n_out) * block + t, n_red, splits * block):
                v = x[base + offset_of(r, red_shape, red_strides)]
                acc = combine(acc, v * v if square and first else v)
            partial[t] = acc
            cuda.syncthreads()
            step = block // 2
            while step > shared_levels:
                if t < step:
                    partial[t] = combine(partial[t], partial[t + step])
                cuda.syncthreads()
                step //= 2
            if shuffle:  # a constant: Numba drops the branch when it is False
                if t < 32:
                    acc = partial[t]
                    lane = 16
                    while lane > 0:
                        shuffled = cuda.shfl_down_sync(0xFFFFFFFF, acc, lane)  # every lane, then combine
                        acc = combine(acc, shuffled)
                        lane //= 2
                    if t == 0:
                        partial[0] = acc
            if t == 0:
                out[task] = partial[0] / divisor if mean and last else partial[0]
            cuda.syncthreads()

    @cuda.jit
    def column(x, out, kept_shape, kept_strides, red_shape, red_strides, n_red, chunks, start, divisor, first,
               last):
        """out[c·O + o] = chunk c (rows c, c + chunks, ...) of output o, one thread each."""
        n_out = out.shape[0] // chunks
        for task in range(cuda.grid(1), out.shape[0], cuda.gridsize(1)):
            base = offset_of(task % n_out, kept_shape, kept_strides)
            acc = start
            for r in range(task // n_out, n_red, chunks):
                v = x[base + offset_of(r, red_shape, red_strides)]
                acc = combine(acc, v * v if square and first else v)
            out[task] = acc / divisor if mean and last else acc

    return row, column


class _Reduction:
    """A reduction of `x` over `axes` into `out`, planned once for fixed shapes. Capturable
    into a CUDA graph (`cuda_graphs`): it allocates nothing per call and never waits for the
    device."""

    capturable = True

    def __init__(self, mode: str, x: TensorType, axes: Sequence[int], config: LaunchConfig,
                 divisor: int | None = None, dtype: np.dtype | None = None):
        """`divisor`: what MEAN divides by, when not the count of reduced elements (a fold of
        partials divides by the count of the elements the partials summed). `dtype`: the
        accumulator's and the output's (default x's; an int32 SUM accumulates in int64, as
        numpy's does)."""
        self.config = config
        self.dtype = np.dtype(dtype or x.dtype)
        strides = row_major(x.shape)
        kept = [a for a in range(x.ndim) if a not in axes]
        self.n_out = math.prod([x.shape[a] for a in kept])
        self.n_red = math.prod([x.shape[a] for a in axes])
        self.kept = (device_constant([x.shape[a] for a in kept] or [1]),
                     device_constant([strides[a] for a in kept] or [0]))
        self.reduced = (device_constant([x.shape[a] for a in axes] or [1]),
                        device_constant([strides[a] for a in axes] or [0]))
        self.start = identity(mode, self.dtype)
        if divisor is None:  # an empty MEAN divides by zero, as numpy does (NaN)
            divisor = self.n_red if mode == "MEAN" else max(self.n_red, 1)
        self.divisor = self.dtype.type(divisor)
        self.row, self.column = _kernels(mode, self.dtype, config.reduce_block, config.shuffle)
        self.column_layout = bool(kept) and kept[-1] == x.ndim - 1 and self.n_red > 1
        self.parts = self._parts()
        # stage one's partials: allocated once, not per call (a cudaMalloc per launch)
        self.stage = cuda.device_array(self.parts * self.n_out, self.dtype) if self.parts > 1 else None
        if self.parts > 1:
            # stage two folds the (parts, outputs) partials along their leading axis
            self.partials = ((device_constant([self.n_out]), device_constant([1])),
                             (device_constant([self.parts]), device_constant([self.n_out])))
        self._launches()

    def _parts(self) -> int:
        """Chunks (column layout) or splits (row layout) of each output's reduced elements."""
        if self.column_layout:
            return max(1, min(self.config.column_chunks, self.n_red))
        rows_per_block = math.ceil(self.n_red / self.config.reduce_block)
        return max(1, min(rows_per_block, self.config.max_blocks // max(self.n_out, 1)))

    def _launches(self) -> None:
        """The stage and fold launches, pre-bound (`launch`): their grids and every argument's
        type are fixed here, so the dispatcher resolves them once."""
        config = self.config
        if self.column_layout:
            self.stage_launch = PreboundKernel(self.column, config.grid(self.parts * self.n_out), config.block)
        else:
            blocks = max(1, min(config.max_blocks, self.parts * self.n_out))
            self.stage_launch = PreboundKernel(self.row, blocks, config.reduce_block)
        self.fold_launch = PreboundKernel(self.column, config.grid(self.n_out), config.block)

    def __call__(self, x: Any, *, out: Any, stream: Any = 0) -> None:
        if not self.n_out:
            return
        x = flat(to_device(x, stream))
        target = flat(out)
        single = self.parts == 1
        stage_out = target if single else self.stage
        self.stage_launch(stream, x, stage_out, *self.kept, *self.reduced, self.n_red, self.parts, self.start,
                          self.divisor, True, single)
        if not single:
            kept, reduced = self.partials
            self.fold_launch(stream, stage_out, target, *kept, *reduced, self.parts, 1, self.start, self.divisor,
                             False, True)


class PartialFold:
    """Stage two of a reduction over axis 0 in a generated kernel: `out[k]` = the `mode`
    combination over blocks c of `partials[c * width + k]`, divided by `divisor` when given
    (the Kernel IR's MEAN).

    The (count, width) partials are reduced over their leading axis like any other reduction
    (`_Reduction`): a block tree per output when there is one output, chunked columns and a
    second fold otherwise. Never one thread per output walking every block's partial: that
    chain of dependent loads cost 2.5 ms per fold of 4096 partials on an H200, more than
    the kernels it finished.
    """

    def __init__(self, mode: str, divisor: int | None, dtype: np.dtype, count: int, width: int,
                 config: LaunchConfig):
        shape = (count,) if width == 1 else (count, width)
        self.reduction = _Reduction("MEAN" if divisor is not None else mode, TensorType(shape, np.dtype(dtype)),
                                    (0,), config, divisor)

    def __call__(self, partials: Any, out: Any, stream: Any = 0) -> None:
        self.reduction(partials, out=out, stream=stream)


@cuda_library_kernel.register
def _reduce(op: Reduce, input_types: Sequence[TensorType], config: LaunchConfig) -> Launcher:
    x = input_types[0]
    return _Reduction(op.mode, x, op.reduced_axes(x.ndim), config, dtype=op.infer(x).dtype)


@cuda_library_kernel.register
def _reduce_to(op: ReduceTo, input_types: Sequence[TensorType], config: LaunchConfig) -> Launcher:
    x = input_types[0]
    return _Reduction("SUM", x, reduce_to_axes(x.shape, op.shape), config)
