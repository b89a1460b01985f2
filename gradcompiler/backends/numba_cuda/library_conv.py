"""Convolution and pooling on the GPU (docs/op-reference.md §13-§14).

Every kernel is a grid-stride loop in which one thread owns one element of
the result and gathers what it needs, so nothing is scattered and no
atomics are needed:

* Convolution: a thread per output pixel sums its C/groups × KH × KW taps.
* BackwardData: a thread per input pixel walks the taps that can read it
  and keeps those whose output pixel lies on the stride grid (no
  zero-stuffed gradient).
* BackwardFilter: a thread per filter element sums over the batch and the
  output pixels.
* Pooling: a thread per window; PoolingBackward a thread per input pixel
  over the windows that hold it (MAX recomputes each window's first
  maximum, so the forward leaves no argmax behind).

Accumulation is in the input's float type. These are the straightforward
kernels, correct first; a shared-memory tiled convolution would replace the
three convolution kernels without changing their launchers.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import cuda, from_dtype

from ...ir import TensorType
from ...ops.conv import Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter
from ...ops.pool import POOL_MODES, Pooling, PoolingBackward
from .device import LaunchConfig, to_device
from .library import Launcher, cuda_library_kernel

MAX, AVERAGE, EXCLUDE_PADDING = (POOL_MODES.index(m) for m in
                                 ("MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"))


@cuda.jit(device=True)
def _unravel(i, d1, d2, d3):
    """(i0, i1, i2, i3) of flat index `i` into a C-order array of shape (·, d1, d2, d3)."""
    return i // (d3 * d2 * d1), (i // (d3 * d2)) % d1, (i // d3) % d2, i % d3


@functools.cache
def _conv_kernels(dtype: np.dtype):
    real = from_dtype(dtype)

    @cuda.jit
    def forward(x, w, y, sh, sw, ph, pw, dh, dw, groups):
        _, o_, oh_, ow_ = y.shape
        c_group, kh_, kw_ = w.shape[1], w.shape[2], w.shape[3]
        height, width = x.shape[2], x.shape[3]
        o_group = o_ // groups
        start = cuda.grid(1)
        for i in range(start, y.size, cuda.gridsize(1)):
            n, o, oh, ow = _unravel(i, o_, oh_, ow_)
            c0 = (o // o_group) * c_group
            acc = real(0)
            for ci in range(c_group):
                for kh in range(kh_):
                    ih = oh * sh - ph + kh * dh
                    if ih < 0 or ih >= height:
                        continue
                    for kw in range(kw_):
                        iw = ow * sw - pw + kw * dw
                        if iw >= 0 and iw < width:
                            acc += x[n, c0 + ci, ih, iw] * w[o, ci, kh, kw]
            y[n, o, oh, ow] = acc

    @cuda.jit
    def backward_data(w, dy, dx, sh, sw, ph, pw, dh, dw, groups):
        _, c_, height, width = dx.shape
        c_group, kh_, kw_ = w.shape[1], w.shape[2], w.shape[3]
        oh_, ow_ = dy.shape[2], dy.shape[3]
        o_group = dy.shape[1] // groups
        start = cuda.grid(1)
        for i in range(start, dx.size, cuda.gridsize(1)):
            n, c, ih, iw = _unravel(i, c_, height, width)
            group, ci = c // c_group, c % c_group
            acc = real(0)
            for kh in range(kh_):
                th = ih + ph - kh * dh
                if th < 0 or th % sh:
                    continue
                oh = th // sh
                if oh >= oh_:
                    continue
                for kw in range(kw_):
                    tw = iw + pw - kw * dw
                    if tw < 0 or tw % sw:
                        continue
                    ow = tw // sw
                    if ow >= ow_:
                        continue
                    for o in range(group * o_group, (group + 1) * o_group):
                        acc += dy[n, o, oh, ow] * w[o, ci, kh, kw]
            dx[n, c, ih, iw] = acc

    @cuda.jit
    def backward_filter(x, dy, dw_out, sh, sw, ph, pw, dh, dw, groups):
        o_, c_group, kh_, kw_ = dw_out.shape
        n_, oh_, ow_ = dy.shape[0], dy.shape[2], dy.shape[3]
        height, width = x.shape[2], x.shape[3]
        o_group = o_ // groups
        start = cuda.grid(1)
        for i in range(start, dw_out.size, cuda.gridsize(1)):
            o, ci, kh, kw = _unravel(i, c_group, kh_, kw_)
            c = (o // o_group) * c_group + ci
            acc = real(0)
            for n in range(n_):
                for oh in range(oh_):
                    ih = oh * sh - ph + kh * dh
                    if ih < 0 or ih >= height:
                        continue
                    for ow in range(ow_):
                        iw = ow * sw - pw + kw * dw
                        if iw >= 0 and iw < width:
                            acc += dy[n, o, oh, ow] * x[n, c, ih, iw]
            dw_out[o, ci, kh, kw] = acc

    return forward, backward_data, backward_filter


class _GridLauncher:
    """One of this module's grid-stride kernels (two inputs, then the output, then the op's
    static arguments), one thread per output element. A kernel whose second input a case
    does not read (pooling without `values`, average pooling's backward) is given the first
    again."""

    def __init__(self, kernel, args: tuple, out_size: int, config: LaunchConfig):
        self.kernel, self.args = kernel, args
        self.grid, self.block = config.grid(out_size), config.block

    def __call__(self, *inputs: Any, out: Any, stream: Any = 0) -> None:
        if not out.size:
            return
        arrays = [to_device(a, stream) for a in inputs]
        arrays += arrays[:1] * (2 - len(arrays))
        self.kernel[self.grid, self.block, stream](*arrays, out, *self.args)


@cuda_library_kernel.register(Convolution)
@cuda_library_kernel.register(ConvolutionBackwardData)
@cuda_library_kernel.register(ConvolutionBackwardFilter)
def _convolution(op, input_types: Sequence[TensorType], config: LaunchConfig) -> Launcher:
    which = (Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter).index(type(op))
    out = op.infer(*input_types)
    kernel = _conv_kernels(np.dtype(out.dtype))[which]
    return _GridLauncher(kernel, (*op.stride, *op.padding, *op.dilation, op.groups), out.size, config)


# -- pooling --------------------------------------------------------------------------------------

@cuda.jit(device=True)
def _first_max(x, n, c, h0, h1, w0, w1):
    """(row, col) of the window's first maximum in row-major order (strict >)."""
    height, width = x.shape[2], x.shape[3]
    bi, bj = max(h0, 0), max(w0, 0)
    best = -np.inf
    for i in range(max(h0, 0), min(h1, height)):
        for j in range(max(w0, 0), min(w1, width)):
            if x[n, c, i, j] > best:
                best, bi, bj = x[n, c, i, j], i, j
    return bi, bj


@cuda.jit(device=True)
def _divisor(mode, h0, h1, w0, w1, height, width):
    if mode == EXCLUDE_PADDING:
        return (min(h1, height) - max(h0, 0)) * (min(w1, width) - max(w0, 0))
    return (h1 - h0) * (w1 - w0)


@functools.cache
def _pool_kernels(dtype: np.dtype):
    real = from_dtype(dtype)

    @cuda.jit
    def forward(x, values, y, mode, kh, kw, sh, sw, ph, pw):
        _, c_, oh_, ow_ = y.shape
        height, width = x.shape[2], x.shape[3]
        start = cuda.grid(1)
        for i in range(start, y.size, cuda.gridsize(1)):
            n, c, oh, ow = _unravel(i, c_, oh_, ow_)
            h0, w0 = oh * sh - ph, ow * sw - pw
            h1, w1 = min(h0 + kh, height + ph), min(w0 + kw, width + pw)
            if mode == MAX:
                bi, bj = _first_max(x, n, c, h0, h1, w0, w1)
                y[n, c, oh, ow] = values[n, c, bi, bj]
                continue
            acc = real(0)
            for r in range(max(h0, 0), min(h1, height)):
                for s in range(max(w0, 0), min(w1, width)):
                    acc += x[n, c, r, s]
            y[n, c, oh, ow] = acc / real(_divisor(mode, h0, h1, w0, w1, height, width))

    @cuda.jit
    def backward(x, dy, dx, mode, kh, kw, sh, sw, ph, pw):
        _, c_, height, width = dx.shape
        oh_, ow_ = dy.shape[2], dy.shape[3]
        start = cuda.grid(1)
        for i in range(start, dx.size, cuda.gridsize(1)):
            n, c, ih, iw = _unravel(i, c_, height, width)
            acc = real(0)
            # windows whose rows hold ih: oh·sh − ph ≤ ih < oh·sh − ph + kh
            for oh in range(max(0, (ih + ph - kh) // sh + 1), min(oh_, (ih + ph) // sh + 1)):
                h0 = oh * sh - ph
                h1 = min(h0 + kh, height + ph)
                for ow in range(max(0, (iw + pw - kw) // sw + 1), min(ow_, (iw + pw) // sw + 1)):
                    w0 = ow * sw - pw
                    w1 = min(w0 + kw, width + pw)
                    if mode == MAX:
                        bi, bj = _first_max(x, n, c, h0, h1, w0, w1)
                        if bi == ih and bj == iw:
                            acc += dy[n, c, oh, ow]
                    else:
                        acc += dy[n, c, oh, ow] / real(
                            _divisor(mode, h0, h1, w0, w1, height, width))
            dx[n, c, ih, iw] = acc

    return forward, backward


def _pool_launcher(op, backward: bool, input_types: Sequence[TensorType],
                   config: LaunchConfig) -> Launcher:
    out = op.infer(*input_types)
    kernel = _pool_kernels(np.dtype(out.dtype))[int(backward)]
    args = (POOL_MODES.index(op.mode), *op.kernel, *op.stride, *op.padding)
    return _GridLauncher(kernel, args, out.size, config)


@cuda_library_kernel.register
def _pooling(op: Pooling, input_types: Sequence[TensorType], config: LaunchConfig) -> Launcher:
    return _pool_launcher(op, False, input_types, config)


@cuda_library_kernel.register
def _pooling_backward(op: PoolingBackward, input_types: Sequence[TensorType],
                      config: LaunchConfig) -> Launcher:
    return _pool_launcher(op, True, input_types, config)
