"""Convolution and pooling on the CPU (docs/op-reference.md §13-§14).

The forward and the filter gradient of a convolution with one group, no dilation and enough
channels take the direct kernels (library_direct_conv: the `gemm` micro-tile over shifted
views of the padded image); at stride 1 the data gradient of a finite filter is itself a
convolution (`_transposed_convolution`) and takes the forward's route, the direct kernel
included, and at stride > 1 it takes the direct kernel by phases (`PhasedDataGradient`). The
rest of this module is that fallback and every other geometry.

Convolution is im2col + BLAS: a chunk of images is unfolded into a column
buffer (rows: channel × kernel tap, columns: output pixels) that the kernel
keeps and reuses across calls, and `np.matmul(..., out=)` multiplies the
grouped filters into it, writing straight into the output buffer; groups
are a batch dimension of the product, so depthwise and grouped filters
take the same path. The chunk is sized so the column buffer stays near
`COLUMN_BYTES` (cache-friendly, and a fixed cost whatever the batch).

The batch is split into contiguous spans of images, a few per thread
(`library.thread_spans`), and each thread unfolds, multiplies and folds the
spans it takes with a column buffer of its own, calling BLAS
single-threaded (`library.in_spans`; why: the `library` docstring).

* 1×1 filters with stride 1 and no padding skip the unfolding: the image
  already is its column matrix.
* A "same" convolution (stride 1, the output as wide as the image: 3×3 with
  padding 1, the common case) reads each tap as the flat image shifted by a
  constant, so im2col copies one run per tap and col2im adds one, the few
  columns that wrap into the neighbouring row zeroed; other geometries go a
  row at a time, a contiguous copy at stride 1. Every copy is between slices,
  so no index can be negative and LLVM vectorises it (a negative index would
  be wrapped, which it cannot vectorise).
* BackwardData at stride > 1 multiplies the transposed filters into the column buffer
  and folds it back (col2im, per image plane, so each thread owns the
  pixels it adds into): every output pixel's contribution lands where its
  taps read, with no zero-stuffed dilated gradient for stride > 1.
* BackwardFilter unfolds the images again and multiplies the gradient by
  the transposed columns; each thread sums its span's per-image products,
  and the threads' sums are added at the end.

Pooling is a direct loop per (image, channel) plane with torch's window
geometry; MAX tracks the pixel torch picks (the first maximum in row-major
order, or the last NaN; ops/pool.py), reads the `values` input there (the
image itself without one), and its backward adds each window's gradient at
that position, race-free because a thread owns its plane.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numba import njit, prange

from ...ops.conv import Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter, Geometry
from ...ops.pool import POOL_MODES, Pooling, PoolingBackward
from . import buffers
from . import library_direct_conv as direct_conv  # names read when used: it imports gemm, which imports library
from .library import LibraryKernel, ParallelLoop, in_spans, library_kernel, thread_spans

COLUMN_BYTES = 8 << 20
_MAX, _AVERAGE, _EXCLUDE_PADDING = (POOL_MODES.index(m) for m in
                                    ("MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"))


# -- convolution loops ------------------------------------------------------------------------

@njit(inline="always", cache=True, error_model="numpy")
def _inside(count, stride, offset, size):
    """[lo, hi): the output positions o < count whose input o·stride + offset is in [0, size)."""
    lo = max(0, (stride - 1 - offset) // stride)
    hi = min(count, (size - 1 - offset) // stride + 1)
    return lo, max(lo, hi)


@njit(inline="always", cache=True, error_model="numpy")
def _shifted_run(row_shift, offset, out_h, width, size):
    """One tap of a "same" convolution (stride 1, output as wide as the image): column entry
    p = oh·W + ow reads image pixel p + shift, shift = row_shift·W + offset, a constant, so
    the tap is one contiguous run of the flat image (thousands of elements, where a row at a
    time is a run of W). (start, stop): the entries whose row is inside the image; (first,
    last): those whose pixel p + shift is, too. Inside [first, last) the entries of the
    columns ow < lo or ow ≥ hi pair with a pixel of the neighbouring row (`_zero_outside`)."""
    oh0, oh1 = _inside(out_h, 1, row_shift, size // width)
    shift = row_shift * width + offset
    start, stop = oh0 * width, oh1 * width
    return start, stop, max(start, -shift), min(stop, size - shift), shift


@njit(inline="always", cache=True, error_model="numpy")
def _zero_outside(line, start, stop, lo, hi, width):
    """Zero the column entries of `_shifted_run` whose pixel is outside the image."""
    line[:start] = 0
    line[stop:] = 0
    for row in range(start, stop, width):
        line[row:row + lo] = 0
        line[row + hi:row + width] = 0


@njit(cache=True, nogil=True, error_model="numpy")
def _im2col(x, cols, first, kernel_w, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, out_w):
    """cols[b, (c·KH + kh)·KW + kw, oh·OW + ow] = x[first + b, c, ih, iw], 0 in the padding."""
    count, rows, pixels = cols.shape
    height, width = x.shape[2], x.shape[3]
    taps = rows // x.shape[1]
    out_h = pixels // out_w
    same_width = stride_h == 1 and stride_w == 1 and out_w == width
    flat = x.reshape(-1)
    for b in range(count):
        for row in range(rows):
            c = row // taps
            kh = (row - c * taps) // kernel_w
            kw = row - c * taps - kh * kernel_w
            offset = kw * dil_w - pad_w
            lo, hi = _inside(out_w, stride_w, offset, width)
            image, line = x[first + b, c], cols[b, row]
            if same_width:
                plane = flat[((first + b) * x.shape[1] + c) * height * width:][:height * width]
                start, stop, run0, run1, shift = _shifted_run(kh * dil_h - pad_h, offset, out_h, width, plane.size)
                dest, source = line[run0:run1], plane[run0 + shift:run1 + shift]
                for p in range(run1 - run0):  # slices: no index can be negative, so this vectorises
                    dest[p] = source[p]
                _zero_outside(line, start, stop, lo, hi, width)
                continue
            for oh in range(out_h):
                ih = oh * stride_h - pad_h + kh * dil_h
                base = oh * out_w
                if ih < 0 or ih >= height:
                    line[base:base + out_w] = 0
                    continue
                line[base:base + lo] = 0
                source = image[ih]
                if stride_w == 1:  # contiguous on both sides: a loop LLVM vectorises
                    dest, source = line[base + lo:base + hi], source[lo + offset:hi + offset]
                    for j in range(hi - lo):
                        dest[j] = source[j]
                else:
                    for ow in range(lo, hi):  # unsigned: a pixel inside, never wrapped
                        line[base + ow] = source[np.uint64(ow * stride_w + offset)]
                line[base + hi:base + out_w] = 0


@njit(cache=True, nogil=True, error_model="numpy")
def _col2im(cols, dx, first, kernel_w, stride_h, stride_w, pad_h, pad_w, dil_h, dil_w, out_w):
    """dx[first + b, c] = Σ over the taps and output pixels that read each pixel of plane c."""
    count, rows, pixels = cols.shape
    channels, height, width = dx.shape[1], dx.shape[2], dx.shape[3]
    taps = rows // channels
    out_h = pixels // out_w
    same_width = stride_h == 1 and stride_w == 1 and out_w == width
    flat = dx.reshape(-1)
    for b in range(count):
        for c in range(channels):
            plane = dx[first + b, c]
            plane[:, :] = 0
            for t in range(taps):
                kh = t // kernel_w
                kw = t - kh * kernel_w
                offset = kw * dil_w - pad_w
                lo, hi = _inside(out_w, stride_w, offset, width)
                line = cols[b, c * taps + t]
                if same_width:  # the column buffer is ours: zero what falls outside, add one run
                    image = flat[((first + b) * channels + c) * height * width:][:height * width]
                    start, stop, run0, run1, shift = _shifted_run(kh * dil_h - pad_h, offset, out_h, width,
                                                                  image.size)
                    _zero_outside(line, start, stop, lo, hi, width)
                    dest, source = image[run0 + shift:run1 + shift], line[run0:run1]
                    for p in range(run1 - run0):
                        dest[p] += source[p]
                    continue
                for oh in range(out_h):
                    ih = oh * stride_h - pad_h + kh * dil_h
                    if ih < 0 or ih >= height:
                        continue
                    base = oh * out_w
                    dest = plane[ih]
                    if stride_w == 1:  # as in _im2col
                        dest, source = dest[lo + offset:hi + offset], line[base + lo:base + hi]
                        for j in range(hi - lo):
                            dest[j] += source[j]
                    else:
                        for ow in range(lo, hi):
                            dest[np.uint64(ow * stride_w + offset)] += line[base + ow]


class _Columns:
    """The geometry of one convolution, its spans of images (a few per thread) and each
    thread's reused column buffer."""

    def __init__(self, g: Geometry, dtype: np.dtype):
        self.g, self.dtype = g, dtype
        self.taps = g.kernel[0] * g.kernel[1]
        self.pixels = g.out[0] * g.out[1]
        self.rows = g.c * self.taps
        self.direct = g.kernel == (1, 1) and g.stride == (1, 1) and g.padding == (0, 0)
        self.spans, self.threads = thread_spans(g.n, g.n * self.rows * self.pixels)
        per_image = max(1, self.rows * self.pixels * dtype.itemsize)
        self.chunk = max(1, min(-(-g.n // len(self.spans)), COLUMN_BYTES // per_image))
        self.buffers = [] if self.direct else [
            buffers.empty((self.chunk, self.rows, self.pixels), dtype, label="im2col columns")
            for _ in range(self.threads)]
        self.args = (g.kernel[1], *g.stride, *g.padding, *g.dilation, g.out[1])

    def run(self, work) -> list:
        """`work(part, first, stop)` over the spans, taken by the threads (`part`: the thread's
        buffers) as they come free."""
        return in_spans(work, self.spans, self.threads)

    def chunks(self, part: int, first: int, stop: int):
        """(first image, buffer view) for each chunk of the span [first, stop)."""
        for start in range(first, stop, self.chunk):
            yield start, self.buffers[part][:min(self.chunk, stop - start)]

    def unfold(self, x: np.ndarray, first: int, cols: np.ndarray) -> np.ndarray:
        _im2col(x, cols, first, *self.args)
        return cols

    def fold(self, cols: np.ndarray, dx: np.ndarray, first: int) -> None:
        _col2im(cols, dx, first, *self.args)

    def grouped(self, cols: np.ndarray) -> np.ndarray:
        """(count, G, C/G · taps, pixels) view of a column chunk."""
        return cols.reshape(cols.shape[0], self.g.groups, -1, self.pixels)

    def grouped_images(self, a: np.ndarray, channels: int) -> np.ndarray:
        """(N, G, channels / G, pixels) view of a contiguous NCHW array (the pixel count spelled
        out: numpy cannot infer a -1 in an empty batch)."""
        return a.reshape(a.shape[0], self.g.groups, channels // self.g.groups, a.shape[2] * a.shape[3])

    def grouped_filter(self, w: np.ndarray) -> np.ndarray:
        """(G, O/G, C/G · taps) view of the filter."""
        return w.reshape(self.g.groups, self.g.o_per_group, -1)


class _ConvKernel:
    """A kernel that builds its plans on first use (the geometry needs the shapes): the
    `_Columns` of im2col + GEMM and, for the ops that have one and where it applies, a direct
    plan of its `kind` (`direct_for`: a `DirectConvolution`, or the strided data gradient's
    `PhasedDataGradient`), which the kernel tries first. Each is built only when
    asked for: the im2col buffers are not allocated while the direct kernels serve."""

    def __init__(self, op, direct: Callable[[Geometry], bool] | None = None, kind: type | None = None):
        self.op, self.direct = op, direct
        self.kind = kind or direct_conv.DirectConvolution
        self.columns: _Columns | None = None
        self.direct_plan = None

    def columns_for(self, g: Geometry, dtype: np.dtype) -> _Columns:
        self.columns = _plan(self.columns, _Columns, g, dtype)
        return self.columns

    def direct_for(self, g: Geometry, dtype: np.dtype):
        """The direct plan (of `kind`) for this geometry, or None where the direct kernel does not
        apply."""
        if self.direct is None or not self.direct(g):
            return None
        self.direct_plan = _plan(self.direct_plan, self.kind, g, dtype)
        return self.direct_plan


def _plan(plan, kind, g: Geometry, dtype: np.dtype):
    """`plan` if it was built for this geometry and dtype, else a new `kind(g, dtype)`."""
    if plan is None or (plan.g, plan.dtype) != (g, np.dtype(dtype)):
        plan = kind(g, np.dtype(dtype))
    return plan


class _Forward(_ConvKernel):
    def __call__(self, x, w, *, out):
        x, w = np.ascontiguousarray(x), np.ascontiguousarray(w)
        g = self.op.geometry(x.shape, w.shape)
        direct = self.direct_for(g, out.dtype)
        if direct is not None:
            direct.forward(x, w, out)
            return
        c = self.columns_for(g, out.dtype)
        filters = c.grouped_filter(w)
        grouped_out = c.grouped_images(out, c.g.o)

        def span(part, first, stop):
            if c.direct:
                images = c.grouped_images(x, c.g.c)[first:stop]
                np.matmul(filters, images, out=grouped_out[first:stop])
                return
            for start, cols in c.chunks(part, first, stop):
                cols = c.grouped(c.unfold(x, start, cols))
                np.matmul(filters, cols, out=grouped_out[start:start + cols.shape[0]])

        c.run(span)


class _BackwardData(_ConvKernel):
    def __init__(self, op):
        super().__init__(op, direct=direct_conv.data_applies, kind=direct_conv.PhasedDataGradient)
        self.as_forward: _Forward | None = None

    def __call__(self, w, dy, *, out):
        w, dy = np.ascontiguousarray(w), np.ascontiguousarray(dy)
        g = self.op.geometry(out.shape, w.shape)
        transposed = _transposed_convolution(g)
        finite = bool(np.isfinite(w).all())  # both direct routes multiply the filter by dy's padding
        if transposed is not None and finite:
            if self.as_forward is None or self.as_forward.op != transposed:
                self.as_forward = _Forward(transposed, direct=direct_conv.forward_applies)
            self.as_forward(dy, _flipped_transposed(w, g), out=out)
            return
        direct = self.direct_for(g, out.dtype) if finite else None
        if direct is not None:
            direct.backward_data(w, dy, out)
            return
        c = self.columns_for(g, out.dtype)
        filters_t = np.swapaxes(c.grouped_filter(w), 1, 2)
        grouped_dy = c.grouped_images(dy, g.o)

        def span(part, first, stop):
            if c.direct:
                np.matmul(filters_t, grouped_dy[first:stop],
                          out=c.grouped_images(out, g.c)[first:stop])
                return
            for start, cols in c.chunks(part, first, stop):
                np.matmul(filters_t, grouped_dy[start:start + cols.shape[0]], out=c.grouped(cols))
                c.fold(cols, out, start)

        c.run(span)


def _transposed_convolution(g: Geometry) -> Convolution | None:
    """At stride 1 the data gradient is itself a convolution: dy convolved with the filter
    flipped and transposed (`_flipped_transposed`), padded by dilation·(kernel − 1) −
    padding, which im2col + GEMM computes faster than the product into columns (its inner
    dimension only O / groups) and col2im's scatter. None at stride > 1, where that padding
    would be negative, or where the gradient has fewer channels than the images (unfolding
    it would make more columns than the product into columns does). The caller takes it only
    for a finite filter: the transposed convolution multiplies the filter by dy's zero padding,
    where the data gradient adds nothing, so an infinite tap would make 0·inf = NaN there."""
    if g.stride != (1, 1) or g.o > g.c:
        return None
    padding = tuple(int(d * (k - 1) - p) for d, k, p in zip(g.dilation, g.kernel, g.padding))
    if min(padding) < 0:
        return None
    return Convolution(padding=padding, dilation=g.dilation, groups=g.groups)


def _flipped_transposed(w: np.ndarray, g: Geometry) -> np.ndarray:
    """The filter of the transposed convolution: (C, O/G, KH, KW), each group's input and
    output channels swapped and its taps reversed."""
    grouped = w.reshape(g.groups, g.o_per_group, g.c_per_group, *g.kernel)[..., ::-1, ::-1]
    return np.ascontiguousarray(grouped.transpose(0, 2, 1, 3, 4)).reshape(g.c, g.o_per_group, *g.kernel)


class _BackwardFilter(_ConvKernel):
    def __call__(self, x, dy, *, out):
        x, dy = np.ascontiguousarray(x), np.ascontiguousarray(dy)
        g = self.op.geometry(x.shape, out.shape)
        direct = self.direct_for(g, out.dtype)
        if direct is not None:
            direct.backward_filter(x, dy, out)
            return
        c = self.columns_for(g, out.dtype)
        grouped_dy = c.grouped_images(dy, c.g.o)

        def span(part, first, stop):
            """This span's Σ over images of dy·colsᵀ, (G, O/G, C/G · taps)."""
            if c.direct:
                cols = np.swapaxes(c.grouped_images(x, c.g.c)[first:stop], 2, 3)
                return np.matmul(grouped_dy[first:stop], cols).sum(axis=0)
            total = np.zeros(c.grouped_filter(out).shape, out.dtype)  # a span may be empty
            for start, cols in c.chunks(part, first, stop):
                cols_t = np.swapaxes(c.grouped(c.unfold(x, start, cols)), 2, 3)
                total = total + np.matmul(grouped_dy[start:start + cols.shape[0]], cols_t).sum(axis=0)
            return total

        np.sum(c.run(span), axis=0, out=c.grouped_filter(out))


@library_kernel.register
def _convolution(op: Convolution) -> LibraryKernel:
    return _Forward(op, direct=direct_conv.forward_applies)


@library_kernel.register
def _convolution_backward_data(op: ConvolutionBackwardData) -> LibraryKernel:
    return _BackwardData(op)


@library_kernel.register
def _convolution_backward_filter(op: ConvolutionBackwardFilter) -> LibraryKernel:
    return _BackwardFilter(op, direct=direct_conv.filter_applies)


# -- pooling loops ------------------------------------------------------------------------------

@ParallelLoop
def _pool_loop(x, values, out, mode, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w):
    """out[n, c, oh, ow]: the window's MAX (read from `values`) or its mean."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    out_h, out_w = out.shape[2], out.shape[3]
    for plane in prange(x.shape[0] * channels):
        n = np.int64(plane) // channels
        c = np.int64(plane) - n * channels
        for oh in range(out_h):
            h0, h1 = _window(oh, stride_h, pad_h, kernel_h, height)
            for ow in range(out_w):
                w0, w1 = _window(ow, stride_w, pad_w, kernel_w, width)
                if mode == _MAX:
                    bi, bj = _max_tap(x[n, c], h0, h1, w0, w1)
                    out[n, c, oh, ow] = values[n, c, bi, bj]
                    continue
                total = 0.0
                for i in range(max(h0, 0), min(h1, height)):
                    for j in range(max(w0, 0), min(w1, width)):
                        total += x[n, c, i, j]
                out[n, c, oh, ow] = total / _divisor(mode, h0, h1, w0, w1, height, width)


@ParallelLoop
def _pool_backward_loop(x, dy, dx, mode, kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w):
    """dx[n, c]: each window's gradient added at its first maximum, or spread over it."""
    channels, height, width = dx.shape[1], dx.shape[2], dx.shape[3]
    out_h, out_w = dy.shape[2], dy.shape[3]
    for plane in prange(dx.shape[0] * channels):
        n = np.int64(plane) // channels
        c = np.int64(plane) - n * channels
        dx[n, c, :, :] = 0
        for oh in range(out_h):
            h0, h1 = _window(oh, stride_h, pad_h, kernel_h, height)
            for ow in range(out_w):
                w0, w1 = _window(ow, stride_w, pad_w, kernel_w, width)
                if mode == _MAX:
                    bi, bj = _max_tap(x[n, c], h0, h1, w0, w1)
                    dx[n, c, bi, bj] += dy[n, c, oh, ow]
                    continue
                share = dy[n, c, oh, ow] / _divisor(mode, h0, h1, w0, w1, height, width)
                for i in range(max(h0, 0), min(h1, height)):
                    for j in range(max(w0, 0), min(w1, width)):
                        dx[n, c, i, j] += share


@njit(inline="always", cache=True, error_model="numpy")
def _window(o, stride, pad, kernel, size):
    """[start, end) of output position o's window along one axis, in unpadded coordinates: it
    may begin before 0 and end past `size`, by at most the padding."""
    start = o * stride - pad
    return start, min(start + kernel, size + pad)


@njit(inline="always", cache=True, error_model="numpy")
def _max_tap(plane, h0, h1, w0, w1):
    """(row, col) of the pixel MAX picks in the window (ops/pool.py): its first maximum in
    row-major order, or its last NaN; its first pixel when nothing beats -inf."""
    height, width = plane.shape
    bi, bj = max(h0, 0), max(w0, 0)
    best = -np.inf
    for i in range(max(h0, 0), min(h1, height)):
        for j in range(max(w0, 0), min(w1, width)):
            if plane[i, j] > best or plane[i, j] != plane[i, j]:
                best, bi, bj = plane[i, j], i, j
    return bi, bj


@njit(inline="always", cache=True, error_model="numpy")
def _divisor(mode, h0, h1, w0, w1, height, width):
    """torch's AVERAGE divisor: the padded window's size, or its pixels inside the image."""
    if mode == _EXCLUDE_PADDING:
        return (min(h1, height) - max(h0, 0)) * (min(w1, width) - max(w0, 0))
    return (h1 - h0) * (w1 - w0)


def _pool_args(op) -> tuple:
    return (POOL_MODES.index(op.mode), *op.kernel, *op.stride, *op.padding)


@library_kernel.register
def _pooling(op: Pooling) -> LibraryKernel:
    args = _pool_args(op)

    def pooling(x, values=None, *, out):
        x = np.ascontiguousarray(x)
        values = x if values is None else np.ascontiguousarray(values)
        _pool_loop(out.size * op.kernel[0] * op.kernel[1], x, values, out, *args)

    return pooling


@library_kernel.register
def _pooling_backward(op: PoolingBackward) -> LibraryKernel:
    args = _pool_args(op)

    def pooling_backward(*inputs, out):
        dy = np.ascontiguousarray(inputs[-1])
        x = np.ascontiguousarray(inputs[0]) if op.mode == "MAX" else out  # AVERAGE reads no x
        _pool_backward_loop(dy.size * op.kernel[0] * op.kernel[1], x, dy, out, *args)

    return pooling_backward
