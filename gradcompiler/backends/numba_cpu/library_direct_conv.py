"""Direct convolutions on the CPU: the forward and the filter gradient of a convolution with one
group, no dilation and enough channels (docs/op-reference.md §13), as sums of products on the
`gemm` micro-tile.

Why. im2col copies every pixel once per tap (9× the image for 3×3) before a GEMM, and
Winograd's F(2×2, 3×3), which this replaced, spent half its time transforming tiles and ran
its sixteen products with an inner dimension of only C. Read in place, a padded image
already holds every tap's column matrix: shifted by the tap's offset, it *is* the im2col of
that tap. Measured on two threads of an AVX-512 Xeon guest, a batch of 64, float32, 3×3 with
padding 1 (the forward; Winograd, then direct):

    16 → 16 channels, 32 × 32 pixels    3.44 ms → 1.72 ms
    32 → 32 channels, 32 × 32           8.1-8.2 ms → 5.8-6.1 ms
    64 → 64 channels, 16 × 16           7.6-7.9 ms → 5.4-5.6 ms
    128 → 128 channels, 8 × 8           10.3 ms → 9.0 ms

How. Each image is copied into a zero-padded buffer split into its stride_h × stride_w
phases (pixel (r, s) of the padded image goes to phase (r mod stride_h, s mod stride_w) at
(r div stride_h, s div stride_w); one phase at stride 1), channel planes `plane` elements
apart, rows `pitch` = ⌈(W + 2·pad_w) / stride_w⌉ apart. An output pixel (oh, ow) is numbered
p = oh·pitch + ow, so tap (kh, kw) of output pixel p reads its phase's plane at
p + (kh div stride_h)·pitch + kw div stride_w: for a fixed tap the pixels of one output row
and the next are one contiguous run. Numbering the outputs this way computes `pitch` − OW
spare outputs per row (they read the next row's first pixels); they are computed and not
stored.

* Forward: out[o, p] = Σ_taps Σ_c w[o, c, tap] · image[c, p + offset(tap)], a sum of products
  over the taps (`gemm.micro_tile_sum`): a tile of MR output channels by NR pixels keeps its
  sums in registers across every channel and tap, and reads the filter in place (MR values a
  step, one per output channel) and the image in place (NR contiguous pixels a step).
* Filter gradient: for each tap, dwᵀ[tap][c, o] = Σ_p image[c, p + offset(tap)] · dy[o, p]:
  a tile of MR input channels by NR output channels over every pixel of an image (the image
  read in place, MR channels a step), added into the thread's sums across its images. dy
  is transposed per image into rows of NR output channels (`gemm.transpose_square`), its
  spare pixels zero, so they add nothing (0 · x, with x finite: an image holding a NaN or an
  infinity makes the filter gradient return False, and the caller takes im2col, as 0 · inf
  at a spare pixel would be a NaN the direct sum does not have).

The batch goes to the threads in spans of images (`library.thread_spans`), each thread with
buffers of its own.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...ops.conv import Geometry
from . import gemm  # its names are read when first used: gemm imports library, which imports this
from .library import in_spans, thread_spans

MIN_CHANNELS = 16
"""Channels below which the tile's rows (the forward's output channels, the filter gradient's
input channels) are too few to pay: the stem of the cnn workload (3 → 32 channels, 64 images
of 32 × 32) took 1.21 ms direct against 1.60 by im2col forward, but 2.31 against 1.96 for its
filter gradient, whose tile would multiply 8 rows for its 3 channels."""


def _layout_applies(g: Geometry) -> bool:
    """Whether the direct kernels take the geometry at all (a 1×1 filter at stride 1 needs no
    layout: library_conv multiplies the images as they are)."""
    return g.dilation == (1, 1) and g.groups == 1 and (g.kernel, g.stride) != ((1, 1), (1, 1))


def forward_applies(g: Geometry) -> bool:
    """Whether the forward of a convolution of geometry `g` takes the direct kernel."""
    return _layout_applies(g) and g.o >= MIN_CHANNELS


def filter_applies(g: Geometry) -> bool:
    """Whether its filter gradient does."""
    return _layout_applies(g) and min(g.c, g.o) >= MIN_CHANNELS


@njit(cache=True, nogil=True, error_model="numpy")
def _pad_image(x, n, image, pad_h, pad_w, stride_h, stride_w, pitch, plane):
    """The zero-padded image x[n] split into its stride_h × stride_w phases: pixel (r, s) of the
    padded image is at image[((r mod stride_h)·stride_w + s mod stride_w)·channels + c)·plane
    + (r div stride_h)·pitch + s div stride_w], `channels` the buffer's (≥ x's); one phase at
    stride 1. Returns whether every pixel is finite (`p - p` is 0 only for a finite p: a
    comparison OR-ed in, which vectorises where a float sum would have to keep its order)."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    channels_up = image.size // (stride_h * stride_w * plane)
    bad = False
    for phase in range(stride_h * stride_w):
        a, b = phase // stride_w, phase % stride_w
        first = (pad_w - b + stride_w - 1) // stride_w                     # the phase's first and last
        stop = min(pitch, (pad_w + width - b + stride_w - 1) // stride_w)  # columns in the image
        for c in range(channels):
            target = image[(phase * channels_up + c) * plane:(phase * channels_up + c + 1) * plane]
            target[:] = 0
            for i in range(plane // pitch):
                ih = i * stride_h + a - pad_h
                if ih < 0 or ih >= height or stop <= first:
                    continue
                inner = target[i * pitch + first:i * pitch + stop]
                source = x[n, c, ih, first * stride_w + b - pad_w:]
                if stride_w == 1:  # contiguous: vectorised
                    for j in range(stop - first):
                        value = source[j]
                        inner[j] = value
                        bad |= value - value != 0
                else:
                    for j in range(stop - first):
                        value = source[j * stride_w]
                        inner[j] = value
                        bad |= value - value != 0
    return not bad


@njit(cache=True, nogil=True, error_model="numpy")
def _forward_images(x, w, y, first, stop, image, sums, a_terms, b_terms, pad_h, pad_w, stride_h, stride_w, pitch,
                    plane):
    """y[first:stop] = the convolution of x's images with the filter rows w (O rounded up to MR,
    C·taps), through `image` (the padded image) and `sums` (O rows of NR-rounded pixels)."""
    channels, outputs, out_h, out_w = x.shape[1], y.shape[1], y.shape[2], y.shape[3]
    rows, columns = w.shape[0], sums.size // w.shape[0]
    width = gemm.VECTORS * gemm.vector_lanes(sums)
    for n in range(first, stop):
        _pad_image(x, n, image, pad_h, pad_w, stride_h, stride_w, pitch, plane)
        for o0 in range(0, rows, gemm.MR):
            for p0 in range(0, columns, width):
                gemm.micro_tile_sum(w, o0 * w.shape[1], w.shape[1], a_terms.size, a_terms, image, p0, plane,
                                    b_terms, sums, o0 * columns + p0, columns, channels, False)
        for o in range(outputs):
            for oh in range(out_h):
                target, source = y[n, o, oh], sums[o * columns + oh * pitch:]
                for ow in range(out_w):
                    target[ow] = source[ow]


@njit(cache=True, nogil=True, error_model="numpy")
def _filter_gradient_images(x, dy, first, stop, image, spread, rows, sums, offsets, pad_h, pad_w, stride_h,
                            stride_w, pitch, plane):
    """sums[tap, c, o] += Σ over the images [first, stop) and their pixels p of
    image[c, p + offsets[tap]] · dy[n, o, p], through `spread` (dy at the image's pitch, a row
    per output channel) and `rows` (its transpose). Returns False, the sums unfinished, at an
    image that is not finite."""
    channels_up, outputs_up = sums.shape[1], sums.shape[2]
    outputs, out_h, out_w = dy.shape[1], dy.shape[2], dy.shape[3]
    pixels = out_h * pitch
    lanes = gemm.vector_lanes(sums)
    length = spread.shape[1]
    one_term = np.zeros(1, np.int64)  # a single product, at the offsets given
    for n in range(first, stop):
        if not _pad_image(x, n, image, pad_h, pad_w, stride_h, stride_w, pitch, plane):
            return False
        for o in range(outputs):
            line = spread[o]
            for oh in range(out_h):
                target, source = line[oh * pitch:(oh + 1) * pitch], dy[n, o, oh]
                for ow in range(out_w):
                    target[ow] = source[ow]
                target[out_w:] = 0
        for o0 in range(0, outputs_up, lanes):
            for p0 in range(0, length, lanes):
                gemm.transpose_square(spread, o0 * length + p0, length, rows, p0 * outputs_up + o0, outputs_up)
        for tap in range(offsets.size):
            for c0 in range(0, channels_up, gemm.MR):
                for o0 in range(0, outputs_up, gemm.VECTORS * lanes):
                    gemm.micro_tile_sum(image, c0 * plane + offsets[tap], plane, 1, one_term, rows, o0, outputs_up,
                                        one_term, sums, (tap * channels_up + c0) * outputs_up + o0, outputs_up,
                                        pixels, True)
    return True


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


class DirectConvolution:
    """One convolution's layout (the phases' pitch and planes, the taps' offsets), its spans of
    images and each thread's buffers, built when first asked for."""

    def __init__(self, g: Geometry, dtype: np.dtype):
        self.g, self.dtype = g, dtype
        (pad_h, pad_w), (kernel_h, kernel_w), (stride_h, stride_w) = g.padding, g.kernel, g.stride
        self.pitch = -(-(g.image[1] + 2 * pad_w) // stride_w)
        self.pixels = g.out[0] * self.pitch
        self.width = gemm.panel_width(dtype)
        self.columns = _round_up(self.pixels, self.width)
        self.phases = stride_h * stride_w
        taps = [(kh, kw) for kh in range(kernel_h) for kw in range(kernel_w)]
        shifts = [(kh // stride_h) * self.pitch + kw // stride_w for kh, kw in taps]
        self.plane = max(-(-(g.image[0] + 2 * pad_h) // stride_h) * self.pitch, self.columns + max(shifts) + 1)
        phases = [(kh % stride_h) * stride_w + kw % stride_w for kh, kw in taps]

        def offsets(channels: int) -> np.ndarray:
            """Each tap's offset into an image buffer of `channels` planes a phase."""
            return np.array([phase * channels * self.plane + shift for phase, shift in zip(phases, shifts)], np.int64)

        self.rows, self.channels_up = _round_up(g.o, gemm.MR), _round_up(g.c, gemm.MR)
        self.forward_offsets, self.filter_offsets = offsets(g.c), offsets(self.channels_up)
        self.taps = np.arange(len(taps), dtype=np.int64)
        self.spans, self.threads = thread_spans(g.n, g.n * g.o * g.c * self.pixels * len(taps))
        self.layout = (pad_h, pad_w, stride_h, stride_w, self.pitch, self.plane)
        self.filters = np.zeros((self.rows, g.c * len(taps)), dtype)  # rows past O stay zero
        self.forward_buffers: list | None = None
        self.filter_buffers: list | None = None

    def _images(self, channels: int) -> np.ndarray:
        """A buffer of the padded image's phases, `channels` planes each."""
        return np.zeros(self.phases * channels * self.plane, self.dtype)

    def forward(self, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
        """out = the convolution of x and w."""
        g = self.g
        if self.forward_buffers is None:
            self.forward_buffers = [(self._images(g.c), np.empty(self.rows * self.columns, self.dtype))
                                    for _ in range(self.threads)]
        self.filters[:g.o] = w.reshape(g.o, -1)

        def span(part, first, stop):
            image, sums = self.forward_buffers[part]
            _forward_images(x, self.filters, out, first, stop, image, sums, self.taps, self.forward_offsets,
                            *self.layout)

        in_spans(span, self.spans, self.threads)

    def backward_filter(self, x: np.ndarray, dy: np.ndarray, out: np.ndarray) -> bool:
        """out = the filter gradient of the convolution of x, or False (x not finite)."""
        g = self.g
        outputs = _round_up(g.o, self.width)
        length = _round_up(self.pixels, self.width // gemm.VECTORS)
        if self.filter_buffers is None:
            self.filter_buffers = [(self._images(self.channels_up), np.zeros((outputs, length), self.dtype),
                                    np.empty(length * outputs, self.dtype),
                                    np.empty((len(self.taps), self.channels_up, outputs), self.dtype))
                                   for _ in range(self.threads)]
        for *_, sums in self.filter_buffers:
            sums[...] = 0

        def span(part, first, stop):
            image, spread, rows, sums = self.filter_buffers[part]
            return _filter_gradient_images(x, dy, first, stop, image, spread, rows, sums, self.filter_offsets,
                                           *self.layout)

        if not all(in_spans(span, self.spans, self.threads)):
            return False
        total = np.sum([sums for *_, sums in self.filter_buffers], axis=0)[:, :g.c, :g.o]
        out[...] = np.moveaxis(total, 0, 2).transpose(1, 0, 2).reshape(g.w_shape)
        return True
