"""Convolution and pooling on the GPU (docs/op-reference.md §13-§14).

Convolution is implicit in a matrix product, as on the CPU
(numba_cpu/library_conv.py): a chunk of images is unfolded (im2col) into a
column buffer (rows: channel × kernel tap, columns: output pixels) and the
grouped filters are multiplied into it through the matmul route of
library_linalg (`_BatchedProduct`: cuBLAS by way of CuPy where it reaches a
GPU, the 16×16 shared-memory tile kernel otherwise, cublas.py), with groups
as a batch dimension of the product. Why a product: the direct kernel below
has each thread walk its whole C/groups × KH × KW filter from global memory
with no reuse between threads; as a product, every filter value loaded into
a tile (or a cuBLAS register block) serves a whole tile of output pixels,
and cuBLAS brings tensor cores and split-K that no hand kernel here has.
The price is the unfolding, one pass writing KH·KW copies of the image.

* Forward: per chunk, im2col then `W[g] @ cols[n, g]` written straight into
  the output. 1×1 filters with stride 1 and no padding skip the unfolding:
  the image already is its column matrix, so the whole batch is one product.
* BackwardData: per chunk, `W[g]ᵀ @ dy[n, g]` into the column buffer, then
  col2im as a gather: a thread per input pixel sums the column entries that
  read it (the taps whose output pixel lies on the stride grid), so nothing
  is scattered and no atomics or zero-stuffed gradient are needed. 1×1
  filters with stride 1 and no padding multiply straight into dx.
* BackwardFilter: the chunk is unfolded channel-major, (rows, image, pixel),
  and dy is gathered to (O, image, pixel) (a chunk of one image reads dy as
  it is), so the sum over the chunk's images is the depth of one product per
  group, `dy[g] @ cols[g]ᵀ`; the first chunk writes the filter gradient,
  later ones a filter-sized buffer that is added in.

The buffers (columns, gathered dy, the partial filter gradient) are
allocated once per launcher, when it is built, and reused by every call;
a chunk holds as many images as keep them near `COLUMN_BYTES` (64 MB), so
the cost is bounded whatever the batch (one image's columns at least).

What stays direct (`conv_algorithm`, the one place the choice is made, by
shape): depthwise and other grouped convolutions with one input channel per
group. Each group's product would be an (O/groups × KH·KW) by (KH·KW ×
pixels) matrix, usually a single row: a degenerate product that reuses
nothing, behind an unfolding that copies the image KH·KW times, where the
direct kernel reads each input pixel KH·KW times from cache and writes the
result once. GRADCOMPILER_CUDA_CONV=direct (or =gemm) forces one route for
every shape, to measure the two against each other.

The direct kernels are grid-stride loops in which one thread owns one
element of the result and gathers what it needs (no atomics):

* Convolution: a thread per output pixel sums its C/groups × KH × KW taps.
* BackwardData: a thread per input pixel walks the taps that can read it
  and keeps those whose output pixel lies on the stride grid.
* BackwardFilter: a thread per filter element sums over the batch and the
  output pixels.

Pooling is direct as well: a thread per window; PoolingBackward a thread per
input pixel over the windows that hold it (MAX recomputes each window's
picked pixel, so the forward leaves no argmax behind).

Accumulation is in the input's float type (float32 for float16 in the
tiled products). A launcher's buffers are its own, so two launches of one
launcher must not run at once on different streams.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import cuda, from_dtype

from ...ir import TensorType
from ...ops.conv import Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter, Geometry
from ...ops.pool import POOL_MODES, Pooling, PoolingBackward
from . import library_linalg  # a module, not its names: library_linalg may be importing library
from .device import LaunchConfig, to_device, view
from .library import Launcher, cuda_library_kernel

COLUMN_BYTES = 64 << 20
MAX, AVERAGE, EXCLUDE_PADDING = (POOL_MODES.index(m) for m in
                                 ("MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"))


@cuda.jit(device=True)
def _unravel(i, d1, d2, d3):
    """(i0, i1, i2, i3) of flat index `i` into a C-order array of shape (·, d1, d2, d3)."""
    return i // (d3 * d2 * d1), (i // (d3 * d2)) % d1, (i // d3) % d2, i % d3


@cuda.jit(device=True)
def _reader(i, pad, k, dilation, stride, count):
    """Along one axis: the output position whose tap `k` reads input position `i`, or -1 when
    none does (off the stride grid, or outside the `count` outputs)."""
    t = i + pad - k * dilation
    if t < 0 or t % stride:
        return -1
    o = t // stride
    return o if o < count else -1


@cuda.jit(device=True)
def _padded(x, n, c, ih, iw, zero):
    """x[n, c, ih, iw], or `zero` in the padding. A padding tap is multiplied, not skipped:
    0·inf is NaN in the reference's zero-padded image, and so here."""
    if ih >= 0 and ih < x.shape[2] and iw >= 0 and iw < x.shape[3]:
        return x[n, c, ih, iw]
    return zero


@functools.cache
def _conv_kernels(dtype: np.dtype):
    real = from_dtype(dtype)

    @cuda.jit
    def forward(x, w, y, sh, sw, ph, pw, dh, dw, groups):
        _, o_, oh_, ow_ = y.shape
        c_group, kh_, kw_ = w.shape[1], w.shape[2], w.shape[3]
        o_group = o_ // groups
        start = cuda.grid(1)
        for i in range(start, y.size, cuda.gridsize(1)):
            n, o, oh, ow = _unravel(i, o_, oh_, ow_)
            c0 = (o // o_group) * c_group
            acc = real(0)
            for ci in range(c_group):
                for kh in range(kh_):
                    ih = oh * sh - ph + kh * dh
                    for kw in range(kw_):
                        iw = ow * sw - pw + kw * dw
                        acc += _padded(x, n, c0 + ci, ih, iw, real(0)) * w[o, ci, kh, kw]
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
                oh = _reader(ih, ph, kh, dh, sh, oh_)
                if oh < 0:
                    continue
                for kw in range(kw_):
                    ow = _reader(iw, pw, kw, dw, sw, ow_)
                    if ow < 0:
                        continue
                    for o in range(group * o_group, (group + 1) * o_group):
                        acc += dy[n, o, oh, ow] * w[o, ci, kh, kw]
            dx[n, c, ih, iw] = acc

    @cuda.jit
    def backward_filter(x, dy, dw_out, sh, sw, ph, pw, dh, dw, groups):
        o_, c_group, kh_, kw_ = dw_out.shape
        n_, oh_, ow_ = dy.shape[0], dy.shape[2], dy.shape[3]
        o_group = o_ // groups
        start = cuda.grid(1)
        for i in range(start, dw_out.size, cuda.gridsize(1)):
            o, ci, kh, kw = _unravel(i, c_group, kh_, kw_)
            c = (o // o_group) * c_group + ci
            acc = real(0)
            for n in range(n_):
                for oh in range(oh_):
                    ih = oh * sh - ph + kh * dh
                    for ow in range(ow_):
                        iw = ow * sw - pw + kw * dw
                        acc += dy[n, o, oh, ow] * _padded(x, n, c, ih, iw, real(0))
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


# -- convolution as a matrix product ------------------------------------------------------------

@functools.cache
def _column_kernels(dtype: np.dtype):
    real = from_dtype(dtype)

    @cuda.jit
    def im2col(x, cols, first, image_major, kernel_w, sh, sw, ph, pw, dh, dw, out_w):
        """cols[b, row, p] (image-major) or cols[row, b, p] = x[first + b, c, ih, iw] for
        row = (c·KH + kh)·KW + kw and p = oh·OW + ow; 0 in the padding."""
        rows = cols.shape[1] if image_major else cols.shape[0]
        count = cols.shape[0] if image_major else cols.shape[1]
        pixels = cols.shape[2]
        taps = rows // x.shape[1]
        for i in range(cuda.grid(1), cols.size, cuda.gridsize(1)):
            p = i % pixels
            outer = i // pixels
            if image_major:
                b, row = outer // rows, outer % rows
            else:
                row, b = outer // count, outer % count
            c = row // taps
            kh = (row - c * taps) // kernel_w
            kw = row - c * taps - kh * kernel_w
            oh = p // out_w
            ih = oh * sh - ph + kh * dh
            iw = (p - oh * out_w) * sw - pw + kw * dw
            value = _padded(x, first + b, c, ih, iw, real(0))
            if image_major:
                cols[b, row, p] = value
            else:
                cols[row, b, p] = value

    @cuda.jit
    def col2im(cols, dx, first, kernel_h, kernel_w, sh, sw, ph, pw, dh, dw, out_w):
        """dx[first + b, c, ih, iw] = Σ cols[b, (c·KH + kh)·KW + kw, oh·OW + ow] over the taps
        that read (ih, iw): a gather, one thread per input pixel."""
        count, rows, pixels = cols.shape
        channels, height, width = dx.shape[1], dx.shape[2], dx.shape[3]
        taps = kernel_h * kernel_w
        out_h = pixels // out_w
        for i in range(cuda.grid(1), count * channels * height * width, cuda.gridsize(1)):
            b, c, ih, iw = _unravel(i, channels, height, width)
            acc = real(0)
            for kh in range(kernel_h):
                oh = _reader(ih, ph, kh, dh, sh, out_h)
                if oh < 0:
                    continue
                for kw in range(kernel_w):
                    ow = _reader(iw, pw, kw, dw, sw, out_w)
                    if ow >= 0:
                        acc += cols[b, c * taps + kh * kernel_w + kw, oh * out_w + ow]
            dx[first + b, c, ih, iw] = acc

    @cuda.jit
    def channel_major(src, out, first):
        """out[c, b, p] = src[first + b, c, p]."""
        count, pixels = out.shape[1], out.shape[2]
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            p = i % pixels
            b = (i // pixels) % count
            c = i // (pixels * count)
            out[c, b, p] = src[first + b, c, p]

    @cuda.jit
    def accumulate(out, part):
        for i in range(cuda.grid(1), out.size, cuda.gridsize(1)):
            out[i] += part[i]

    return im2col, col2im, channel_major, accumulate


def conv_algorithm(g: Geometry) -> str:
    """"gemm" (im2col + matrix product) or "direct" (a thread per result element) for a
    convolution of geometry `g`, forward and both gradients alike (module docstring)."""
    forced = os.environ.get("GRADCOMPILER_CUDA_CONV", "").lower()
    if forced in ("direct", "gemm"):
        return forced
    if g.groups > 1 and g.c_per_group == 1:  # depthwise: a degenerate product per channel
        return "direct"
    return "gemm"


class _Gemm:
    """What the three GEMM launchers share: the geometry's sizes, its chunks of images, their
    reused buffers (flat, so a shorter last chunk is a contiguous prefix) and the launch sizes
    of the column kernels."""

    def __init__(self, g: Geometry, dtype: np.dtype, config: LaunchConfig, *,
                 extra_per_image: int = 0):
        self.g, self.dtype, self.config = g, np.dtype(dtype), config
        self.taps = g.kernel[0] * g.kernel[1]
        self.pixels = g.out[0] * g.out[1]
        self.rows = g.c * self.taps
        self.depth = g.c_per_group * self.taps  # of one group's product
        self.pointwise = g.kernel == (1, 1) and g.stride == (1, 1) and g.padding == (0, 0)
        per_image = max(1, (self.rows * self.pixels + extra_per_image) * self.dtype.itemsize)
        self.chunk = max(1, min(g.n, COLUMN_BYTES // per_image))
        self.im2col, self.col2im, self.channel_major, self.accumulate = _column_kernels(self.dtype)
        self.args = (*g.stride, *g.padding, *g.dilation, g.out[1])

    def chunks(self) -> list[tuple[int, int]]:
        """(first image, image count) of each chunk of the batch."""
        return [(start, min(self.chunk, self.g.n - start)) for start in range(0, self.g.n, self.chunk)]

    def counts(self) -> set[int]:
        return {count for _, count in self.chunks()}

    def buffer(self, per_image: int, count: int | None = None):
        return cuda.device_array(max(1, per_image * (count or self.chunk)), self.dtype)

    def grid(self, size: int) -> tuple[int, int]:
        return self.config.grid(size), self.config.block

    def group_tables(self, count: int) -> tuple[np.ndarray, np.ndarray]:
        """Batch tables of `count` images × groups products reading the (G, ...) filter."""
        groups = self.g.groups
        return np.tile(np.arange(groups), count), np.arange(count * groups)


def _prefix(buffer, shape: tuple[int, ...]):
    return view(buffer[:math.prod(shape)], shape)


class _GemmImages:
    """What the forward and the data gradient share: a product per chunk of images of the
    grouped filters (transposed for the data gradient) and each image's columns or dy,
    groups a batch dimension broadcast against the images."""

    def __init__(self, g: Geometry, dtype: np.dtype, config: LaunchConfig, transpose_filters: bool):
        self.c = c = _Gemm(g, dtype, config)
        gr, og = g.groups, g.o_per_group
        self.cols = None if c.pointwise else c.buffer(c.rows * c.pixels)
        rows_in, rows_out = (og, c.depth) if transpose_filters else (c.depth, og)
        self.products = {count: library_linalg._BatchedProduct(
            (gr, og, c.depth), (count * gr, rows_in, c.pixels), (count * gr, rows_out, c.pixels),
            *c.group_tables(count), transpose_filters, False, dtype, config,
            blas_shapes=((gr, og, c.depth), (count, gr, rows_in, c.pixels), (count, gr, rows_out, c.pixels)))
            for count in ({g.n} if c.pointwise else c.counts())}

    def run(self, w: Any, images: Any, out: Any, stream: Any) -> None:
        """The filters `w` against `images` (x, or dy for the data gradient) into `out`: one
        product over the whole batch for a 1×1 filter, else `chunk` per chunk of images."""
        if not out.size:
            return
        c = self.c
        w, images = to_device(w, stream), to_device(images, stream)
        if c.pointwise:
            self.products[c.g.n](w, images, out=out, stream=stream)
            return
        for start, count in c.chunks():
            self.chunk(w, images, _prefix(self.cols, (count, c.rows, c.pixels)), out, start, count, stream)


class _GemmForward(_GemmImages):
    def __init__(self, g: Geometry, dtype: np.dtype, config: LaunchConfig):
        super().__init__(g, dtype, config, transpose_filters=False)

    def __call__(self, x: Any, w: Any, *, out: Any, stream: Any = 0) -> None:
        self.run(w, x, out, stream)

    def chunk(self, w: Any, x: Any, cols: Any, out: Any, start: int, count: int, stream: Any) -> None:
        c = self.c
        c.im2col[c.grid(cols.size) + (stream,)](x, cols, start, True, c.g.kernel[1], *c.args)
        self.products[count](w, cols, out=out[start:start + count], stream=stream)


class _GemmBackwardData(_GemmImages):
    def __init__(self, g: Geometry, dtype: np.dtype, config: LaunchConfig):
        super().__init__(g, dtype, config, transpose_filters=True)

    def __call__(self, w: Any, dy: Any, *, out: Any, stream: Any = 0) -> None:
        self.run(w, dy, out, stream)

    def chunk(self, w: Any, dy: Any, cols: Any, out: Any, start: int, count: int, stream: Any) -> None:
        c = self.c
        self.products[count](w, dy[start:start + count], out=cols, stream=stream)
        size = count * c.g.c * c.g.image[0] * c.g.image[1]
        c.col2im[c.grid(size) + (stream,)](cols, out, start, *c.g.kernel, *c.args)


class _GemmBackwardFilter:
    def __init__(self, g: Geometry, dtype: np.dtype, config: LaunchConfig):
        self.c = c = _Gemm(g, dtype, config, extra_per_image=g.o * g.out[0] * g.out[1])
        gr, og = g.groups, g.o_per_group
        self.cols = c.buffer(c.rows * c.pixels)
        self.dy = c.buffer(g.o * c.pixels) if c.chunk > 1 else None  # one image: dy as it is
        self.partial = c.buffer(g.o * c.depth, 1) if len(c.chunks()) > 1 else None
        self.products = {}
        for count in c.counts():
            depth = count * c.pixels  # the chunk's images and pixels: one product per group
            shapes = ((gr, og, depth), (gr, c.depth, depth), (gr, og, c.depth))
            table = np.arange(gr)
            self.products[count] = library_linalg._BatchedProduct(
                *shapes, table, table, False, True, dtype, config, blas_shapes=shapes)

    def __call__(self, x: Any, dy: Any, *, out: Any, stream: Any = 0) -> None:
        if not out.size:
            return
        c, g = self.c, self.c.g
        x, dy = to_device(x, stream), to_device(dy, stream)
        dy3 = view(dy, (g.n, g.o, c.pixels))
        for start, count in c.chunks():
            cols = _prefix(self.cols, (c.rows, count, c.pixels))
            c.im2col[c.grid(cols.size) + (stream,)](x, cols, start, False, g.kernel[1], *c.args)
            if count == 1:
                grads = dy3[start]
            else:
                grads = _prefix(self.dy, (g.o, count, c.pixels))
                c.channel_major[c.grid(grads.size) + (stream,)](dy3, grads, start)
            target = out if start == 0 else self.partial
            self.products[count](grads, cols, out=target, stream=stream)
            if start:
                c.accumulate[c.grid(out.size) + (stream,)](view(out, (out.size,)), self.partial)


@cuda_library_kernel.register(Convolution)
@cuda_library_kernel.register(ConvolutionBackwardData)
@cuda_library_kernel.register(ConvolutionBackwardFilter)
def _convolution(op, input_types: Sequence[TensorType], config: LaunchConfig) -> Launcher:
    which = (Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter).index(type(op))
    out = op.infer(*input_types)
    a, b = (t.shape for t in input_types)
    g = op.geometry(*((a, b), (out.shape, a), (a, out.shape))[which])
    if conv_algorithm(g) == "gemm":
        return (_GemmForward, _GemmBackwardData, _GemmBackwardFilter)[which](g, np.dtype(out.dtype), config)
    kernel = _conv_kernels(np.dtype(out.dtype))[which]
    return _GridLauncher(kernel, (*op.stride, *op.padding, *op.dilation, op.groups), out.size, config)


# -- pooling --------------------------------------------------------------------------------------

@cuda.jit(device=True)
def _max_tap(x, n, c, h0, h1, w0, w1):
    """(row, col) of the pixel MAX picks in the window (ops/pool.py): its first maximum in
    row-major order, or its last NaN."""
    height, width = x.shape[2], x.shape[3]
    bi, bj = max(h0, 0), max(w0, 0)
    best = -np.inf
    for i in range(max(h0, 0), min(h1, height)):
        for j in range(max(w0, 0), min(w1, width)):
            if x[n, c, i, j] > best or x[n, c, i, j] != x[n, c, i, j]:
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
                bi, bj = _max_tap(x, n, c, h0, h1, w0, w1)
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
                        bi, bj = _max_tap(x, n, c, h0, h1, w0, w1)
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
