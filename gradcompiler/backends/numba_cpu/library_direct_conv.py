"""Direct convolutions on the CPU: the forward, the filter gradient and the strided data gradient
of a convolution with one group, no dilation and enough channels (docs/op-reference.md §13),
as sums of products on the `gemm` micro-tile.

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
apart, rows `pitch` = ⌈(W + 2·pad_w) / stride_w⌉ apart. Output pixel (oh, ow) at tap (kh, kw)
reads its phase's plane at oh·pitch + ow + (kh div stride_h)·pitch + kw div stride_w: for a
fixed tap, a run of one output row is a contiguous run of the buffer.

* Forward: out[o, p] = Σ_taps Σ_c w[o, c, tap] · image[c, p + offset(tap)], a sum of products
  over the taps (`gemm.micro_tile_sum`): a tile of MR output channels by NR pixels keeps its
  sums in registers across every channel and tap, and reads the filter in place (MR values a
  step, one per output channel) and the image in place (a vector of pixels a step).
  Where OW is a multiple of a vector's lanes, a tile is a column of one vector's lanes down
  WIDE_VECTORS output rows (`gemm.micro_tile_sum_wide`: 8 × 3 vectors with AVX-512), the rows
  left in tiles of VECTORS rows: each vector of a tile is a run of one output row, and the
  tile stores straight into the output (32 → 32 channels on 32 × 32 pixels, 64 images,
  float32, two threads: 4.52-4.84 ms against 4.77-4.94 with a tile of two vectors along one
  row, timed in turn in one process). Where the rows do not split so (one row) but OW is a
  multiple of NR, tiles of two vectors along each row. Elsewhere the pixels are numbered
  oh·pitch + ow, tiles of NR consecutive numbers straddle rows and compute `pitch` − OW
  spare outputs per row (reading the padding and the next row's first pixels), and the sums
  are copied into the output without them. 32 → 32 channels on 32 × 32 pixels, 64 images,
  float32: 5.46-5.64 ms through the sums, 5.22-5.35 in place on tiles of two vectors along
  a row (one thread: 11.1 against 9.95 ms).
* Filter gradient: for each tap, dwᵀ[tap][c, o] = Σ_(oh, ow) image[c, oh·pitch + ow +
  offset(tap)] · dy[o, oh, ow], a term of OW steps per output row: a tile of MR input
  channels by NR output channels (the image read in place, MR channels a step), added into
  the thread's sums across its images. dy is transposed per image into rows of NR output
  channels (`gemm.transpose_square`), in squares read where dy lies when its channels and
  pixels are whole vectors (32 → 32 channels at 32 × 32, 64 images, float32, two threads:
  4.98-5.08 ms against 5.08-5.27 through a copy padded with zeros, timed in turn), else
  through that copy. Only real outputs are summed, so any value, NaN and infinities
  included, meets the products the reference has.
* Data gradient at stride > 1 (`PhasedDataGradient`): phase (a, b) of the image, its pixels
  (stride_h·i + a, stride_w·j + b), receives only the taps congruent to it, each reading dy
  shifted by a constant, so the phase is a stride-1 correlation of dy with a sub-filter: the
  forward's tile over dy padded (a row per input channel, depth O), into a buffer of phases
  interleaved into dx. It replaces col2im's product into columns and scatter: 64 images,
  32 → 64 channels, 32 × 32 at stride 2, float32, two threads, medians of four runs, each
  timing both in one process: col2im 5.8-7.7 ms, phases 3.7-4.4. The interleave writes a
  row's two phases in one loop, which LLVM vectorises (one thread: 0.55 ms for the batch;
  a loop per phase, or a branch after the loop for an odd row's last pixel, 2.0 ms).

The batch goes to the threads in spans of images (`library.thread_spans`), each thread with
buffers of its own.

The forward asks for the next image while it computes the current one (`_prefetch_share`):
each tile asks for its share of the next image's lines of x, to copy into the padded buffer,
and, where the tiles store into the output, of its output lines, for ownership. The copy
otherwise meets x in memory one page at a time (the prefetchers stop at each 4 KB page), and
the tiles' stores each wait for their line. 32 → 32 channels on 32 × 32 pixels, 64 images,
float32, two threads, inputs rotated through 67 MB so that each call finds them in memory, as
in a step: the forward in 0.94 of the time, its transposed data gradient in 0.92, the stride-2
forward in 0.95 (alternated in one process); the cnn step in 0.955-0.989 of its time, the
medians of three runs of nine alternated rounds. The filter gradient asks for the next
image's lines of x and dy the same way: once the padded copy was fast (`_pad_image`), the cnn
step took 1.013 of its time without that (1.005-1.022, seven alternated rounds). The strided
data gradient gained 0-2% from it, and asks for nothing.
"""

from __future__ import annotations

from itertools import accumulate

import numpy as np
from numba import njit

from ...ops.conv import Geometry
from . import buffers, gemm  # its names are read when first used: gemm imports library, which imports this
from .library import in_spans, thread_spans
from .prefetch import CACHE_LINE, prefetch_read, prefetch_write

MIN_FILTER_OUTPUTS = 8
"""Output channels below which the filter gradient takes im2col: they are its tile's columns
(NR, 32 float32 with AVX-512), the columns past O zero. 64 images of 32 × 32, 3×3 with padding
1, float32, two threads of a Zen 5 guest (direct against im2col): 16 → 8 channels 1.50 against
3.09 ms, 8 → 8 at stride 2 0.39 against 0.85; 16 → 4 1.44 against 1.15, 16 → 1 1.45 against
0.96 (at stride 2, 16 → 4 still 0.53 against 1.38). 16 channels had been the bound of every
direct kernel, measured on an Intel guest before gemm packed a row-major B by vector copies."""

MIN_DATA_INPUTS = 8
"""Input channels below which the data gradient at stride > 1 takes im2col rather than the
phases (`PhasedDataGradient`, whose tile's rows they are). 64 images of 32 × 32, 3×3 at
stride 2, float32, two threads (phases against im2col): 8 → 8 channels 0.22 against 0.52 ms,
4 → 16 0.36 against 0.36, 1 → 16 0.29 against 0.26."""

MIN_FILTER_INPUTS = 4
"""Input channels below which the filter gradient takes im2col: its tile multiplies MR rows of
input channels (8 with AVX-512), the rows past C zero. 64 images of 32 × 32, 3×3 with padding
1, float32, two threads of a Zen 5 guest (direct against im2col, once gemm packed a row-major
B by vector copies): 2 → 32 channels 0.85 against 0.50 ms, 3 → 32 (the cnn workload's stem)
0.88-0.90 against 0.68-0.75, 4 → 32 0.89 against 1.34, 8 → 64 1.77 against 3.22."""


def _layout_applies(g: Geometry) -> bool:
    """Whether the direct kernels take the geometry at all (a 1×1 filter at stride 1 needs no
    layout: library_conv multiplies the images as they are)."""
    return g.dilation == (1, 1) and g.groups == 1 and (g.kernel, g.stride) != ((1, 1), (1, 1))


def forward_applies(g: Geometry) -> bool:
    """Whether the forward of a convolution of geometry `g` takes the direct kernel: wherever
    the layout applies, at any count of output channels (its tile's rows, MR, the rows past O
    zero). Same machine and sizes as `MIN_FILTER_OUTPUTS`, direct against im2col: 16 → 8
    channels 0.49 against 2.56 ms, 16 → 4 0.52 against 1.13, 16 → 1 0.52 against 0.92, 3 → 8
    0.22 against 0.38, 16 → 4 at stride 2 0.33 against 1.34."""
    return _layout_applies(g)


def filter_applies(g: Geometry) -> bool:
    """Whether its filter gradient does."""
    return _layout_applies(g) and g.o >= MIN_FILTER_OUTPUTS and g.c >= MIN_FILTER_INPUTS


def data_applies(g: Geometry) -> bool:
    """Whether its data gradient takes the direct kernel by phases (`PhasedDataGradient`), at
    stride > 1; at stride 1 library_conv takes it as a transposed convolution, whose forward
    may itself be direct."""
    return _layout_applies(g) and g.stride != (1, 1) and g.c >= MIN_DATA_INPUTS


@njit(cache=True, nogil=True, error_model="numpy")
def _pad_image(x, n, image, pad_h, pad_w, stride_h, stride_w, pitch, plane):
    """The zero-padded image x[n] (x C-contiguous) split into its stride_h × stride_w phases:
    pixel (r, s) of the padded image is at image[((r mod stride_h)·stride_w + s mod stride_w)
    ·channels + c)·plane + (r div stride_h)·pitch + s div stride_w], `channels` the buffer's
    (≥ x's); one phase at stride 1. Every element of x's planes is written: the pixels, and
    zeros around them (only the border, not the whole plane first).

    Indexed flat and unsigned: no index can be negative, so none is wrapped and the copies
    vectorise; at stride_w 2 one loop over a row's pixel pairs fills both of its column
    phases (`_split_row`); the per-line bounds are computed once per phase, not per line (an
    integer division each). 64 images of 32 channels at 32 × 32, one thread, called from a
    compiled loop with the strides as run-time values: 0.45-0.47 → 0.32-0.34 ms at stride 1,
    1.52-1.53 → 0.40-0.42 ms at stride 2, against line slices and a loop per phase (which read
    every other pixel, left scalar)."""
    if stride_w == 2:
        _pad_pairs(x, n, image, pad_h, pad_w, stride_h, pitch, plane)
        return
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    channels_up = image.size // (stride_h * stride_w * plane)
    lines = plane // pitch
    pixels = x.reshape(-1)
    for phase in range(stride_h * stride_w):
        a, b = phase // stride_w, phase % stride_w
        first, stop = _phase_columns(b, stride_w, pad_w, width, pitch)
        for c in range(channels):
            target = (phase * channels_up + c) * plane
            _zero(image, target + lines * pitch, target + plane)
            for i in range(lines):
                ih, line = i * stride_h + a - pad_h, target + i * pitch
                if ih < 0 or ih >= height:
                    _zero(image, line, line + pitch)
                    continue
                _zero_borders(image, line, first, stop, pitch)
                source = ((n * channels + c) * height + ih) * width + first * stride_w + b - pad_w
                if stride_w == 1:  # contiguous
                    for j in range(stop - first):
                        image[np.uint64(line + first + j)] = pixels[np.uint64(source + j)]
                else:
                    for j in range(stop - first):
                        image[np.uint64(line + first + j)] = pixels[np.uint64(source + j * stride_w)]


@njit(inline="always", cache=True, error_model="numpy")
def _phase_columns(b, stride_w, pad_w, width, pitch):
    """[first, stop): the columns of column phase b that hold image pixels."""
    first = (pad_w - b + stride_w - 1) // stride_w
    return first, max(first, min(pitch, (pad_w + width - b + stride_w - 1) // stride_w))


@njit(cache=True, nogil=True, error_model="numpy")
def _pad_pairs(x, n, image, pad_h, pad_w, stride_h, pitch, plane):
    """`_pad_image` at stride_w 2: both column phases of a row at once (`_split_row`). A loop
    nest of its own: one nest for every stride, walking (row phase, channel, line) with each
    column phase's bounds read from a small array, took 0.55-0.58 ms at stride 1 and 0.74-0.80
    at stride 2 (the measurement of `_pad_image`), the bounds no longer constants of the inner
    loops."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    channels_up = image.size // (stride_h * 2 * plane)
    lines, odd_phase = plane // pitch, channels_up * plane  # from column phase 0 to 1
    pixels = x.reshape(-1)
    first0, stop0 = _phase_columns(0, 2, pad_w, width, pitch)
    first1, stop1 = _phase_columns(1, 2, pad_w, width, pitch)
    for a in range(stride_h):
        for c in range(channels):
            even = (a * 2 * channels_up + c) * plane
            odd = even + odd_phase
            _zero(image, even + lines * pitch, even + plane)
            _zero(image, odd + lines * pitch, odd + plane)
            for i in range(lines):
                ih = i * stride_h + a - pad_h
                even_line, odd_line = even + i * pitch, odd + i * pitch
                if ih < 0 or ih >= height:
                    _zero(image, even_line, even_line + pitch)
                    _zero(image, odd_line, odd_line + pitch)
                    continue
                _zero_borders(image, even_line, first0, stop0, pitch)
                _zero_borders(image, odd_line, first1, stop1, pitch)
                _split_row(pixels, ((n * channels + c) * height + ih) * width, width, image, even_line, odd_line,
                           pad_w)


@njit(inline="always", cache=True, error_model="numpy")
def _zero(flat, start, stop):
    """flat[start:stop] = 0, indexed unsigned (`_pad_image`)."""
    for p in range(start, stop):
        flat[np.uint64(p)] = 0


@njit(inline="always", cache=True, error_model="numpy")
def _zero_borders(flat, line, first, stop, pitch):
    """The columns of a padded line outside the image's, [0, first) and [stop, pitch)."""
    _zero(flat, line, line + first)
    _zero(flat, line + stop, line + pitch)


@njit(inline="always", cache=True, error_model="numpy")
def _split_row(pixels, row, width, image, even_line, odd_line, pad_w):
    """Image row pixels[row:row + width] into the lines of its two column phases at stride 2
    (their borders already zero): padded column s = iw + pad_w goes to phase s mod 2 at
    s div 2, so the pixel pair (2m, 2m + 1) goes to column m + const of each phase, and one
    loop stores both. An odd row's last pixel goes first: a branch after the loop kept it
    scalar (as in `_data_gradient_images`)."""
    evens = (even_line if pad_w % 2 == 0 else odd_line) + pad_w // 2         # where pixels 2m go,
    odds = (odd_line if pad_w % 2 == 0 else even_line) + (pad_w + 1) // 2    # and pixels 2m + 1
    for _ in range(width % 2):
        image[np.uint64(evens + width // 2)] = pixels[np.uint64(row + width - 1)]
    for m in range(width // 2):
        image[np.uint64(evens + m)] = pixels[np.uint64(row + 2 * m)]
        image[np.uint64(odds + m)] = pixels[np.uint64(row + 2 * m + 1)]


@njit(cache=True, nogil=True, error_model="numpy")
def _tile(tile, a, a_offset, a_row_step, a_k_step, a_terms, image, plane, b_terms, c, c_offset, c_row_step, depth):
    """One tile of a plan's (`_row_tiles`, `_summed_tiles`): its first pixel in the image at
    tile[0], its first output at c_offset + tile[1], the steps from one of its vectors to the
    next at tile[2] and tile[3], its vectors (VECTORS or WIDE_VECTORS) at tile[4]; a channel of
    the image a step of k."""
    if tile[4] == gemm.WIDE_VECTORS:
        gemm.micro_tile_sum_wide(a, a_offset, a_row_step, a_k_step, a_terms, image, tile[0], plane, tile[2], b_terms, c,
                                 c_offset + tile[1], c_row_step, tile[3], depth, False)
    else:
        gemm.micro_tile_sum(a, a_offset, a_row_step, a_k_step, a_terms, image, tile[0], plane, tile[2], b_terms, c,
                            c_offset + tile[1], c_row_step, tile[3], depth, False)


@njit(cache=True, nogil=True, error_model="numpy")
def _prefetch_share(flat, start, size, share, shares, write):
    """Ask for the lines of run `share` of `shares` equal runs of flat[start:start + size]
    (`prefetch`), to be written if `write`, else read: called once per tile of an image with
    the next image's range, it spreads that image's lines over the tiles (module docstring)."""
    step = CACHE_LINE // flat.itemsize
    run = -(-size // (step * shares)) * step
    first = start + share * run
    for i in range(first, min(first + run, start + size), step):
        if write:
            prefetch_write(flat, i)
        else:
            prefetch_read(flat, i)


@njit(cache=True, nogil=True, error_model="numpy")
def _forward_images(x, w, y, first, stop, image, target, in_place, tiles, a_terms, b_terms, pad_h, pad_w, stride_h,
                    stride_w, pitch, plane):
    """y[first:stop] = the convolution of x's images with the filter rows w (O rounded up to MR,
    C·taps), through `image` (the padded image), a tile at a time (`_tile`: its first output
    counted in `target`). `in_place`: target is y flat, each tile's outputs where they belong in y; else it is
    the sums (O rows of NR-rounded pixels at the image's pitch), copied into y per image."""
    outputs, out_h, out_w = y.shape[1], y.shape[2], y.shape[3]
    rows, depth = w.shape[0], x.shape[1]
    row_step = out_h * out_w if in_place else target.size // rows
    pixels, calls = x.reshape(-1), -(-rows // gemm.MR) * tiles.shape[0]
    image_size, out_size = x[0].size, outputs * out_h * out_w
    for n in range(first, stop):
        _pad_image(x, n, image, pad_h, pad_w, stride_h, stride_w, pitch, plane)
        base = n * outputs * row_step if in_place else 0
        for o0 in range(0, rows, gemm.MR):
            for t in range(tiles.shape[0]):
                if n + 1 < stop:  # the next image's share of lines: its pixels, and its outputs' lines
                    call = o0 // gemm.MR * tiles.shape[0] + t
                    _prefetch_share(pixels, (n + 1) * image_size, image_size, call, calls, False)
                    if in_place:
                        _prefetch_share(target, (n + 1) * out_size, out_size, call, calls, True)
                _tile(tiles[t], w, o0 * w.shape[1], w.shape[1], a_terms.size, a_terms, image, plane, b_terms, target,
                      base + o0 * row_step, row_step, depth)
        if not in_place:
            for o in range(outputs):
                for oh in range(out_h):
                    row, source = y[n, o, oh], target[o * row_step + oh * pitch:]
                    for ow in range(out_w):
                        row[ow] = source[ow]


@njit(cache=True, nogil=True, error_model="numpy")
def _transpose(source, start, channels, length, rows, row_length):
    """rows[p·row_length + o] = source[start + o·length + p] for o < channels and p < length,
    both multiples of a vector's lanes, in squares transposed in registers."""
    lanes = gemm.vector_lanes(rows)
    for o0 in range(0, channels, lanes):
        for p0 in range(0, length, lanes):
            gemm.transpose_square(source, start + o0 * length + p0, length, rows, p0 * row_length + o0, row_length)


@njit(cache=True, nogil=True, error_model="numpy")
def _filter_gradient_images(x, dy, first, stop, image, spread, rows, sums, offsets, row_starts, row_runs, pad_h,
                            pad_w, stride_h, stride_w, pitch, plane):
    """sums[tap, c, o] += Σ over the images [first, stop) and their pixels (oh, ow) of
    image[c, oh·pitch + ow + offsets[tap]] · dy[n, o, oh, ow], a term per output row: row oh
    starts at row_starts[oh] = oh·pitch in the image and at row_runs[oh] in `rows` (dy
    transposed, a row of output channels per pixel). Where `spread` has no rows, dy is
    C-contiguous in squares of whole vectors (its channels and pixels multiples of the lanes)
    and is transposed where it lies; else through `spread` (dy flat, a row per output channel,
    zero past its pixels and channels). The columns of `rows` past the channels feed only sums
    that are discarded."""
    channels_up, outputs_up = sums.shape[1], sums.shape[2]
    outputs, out_w = dy.shape[1], dy.shape[3]
    lanes = gemm.vector_lanes(sums)
    pixels = dy.shape[2] * out_w
    in_place = spread.shape[0] == 0
    x_flat, dy_flat, image_size, dy_size = x.reshape(-1), dy.reshape(-1), x[0].size, dy[0].size
    calls = offsets.size * (channels_up // gemm.MR) * -(-outputs_up // (gemm.VECTORS * lanes))
    for n in range(first, stop):
        _pad_image(x, n, image, pad_h, pad_w, stride_h, stride_w, pitch, plane)
        if in_place:
            _transpose(dy, n * outputs * pixels, outputs, pixels, rows, outputs_up)
        else:
            for o in range(outputs):
                line, values = spread[o], dy[n, o].reshape(-1)
                for p in range(pixels):
                    line[p] = values[p]
            _transpose(spread, 0, outputs_up, spread.shape[1], rows, outputs_up)
        call = 0  # the tile calls of this image, each asking for its share of the next image's lines
        for tap in range(offsets.size):
            for c0 in range(0, channels_up, gemm.MR):
                for o0 in range(0, outputs_up, gemm.VECTORS * lanes):
                    if n + 1 < stop:
                        _prefetch_share(x_flat, (n + 1) * image_size, image_size, call, calls, False)
                        _prefetch_share(dy_flat, (n + 1) * dy_size, dy_size, call, calls, False)
                    call += 1
                    gemm.micro_tile_sum(image, c0 * plane + offsets[tap], plane, 1, row_starts, rows, o0, outputs_up,
                                        lanes, row_runs, sums, (tap * channels_up + c0) * outputs_up + o0, outputs_up,
                                        lanes, out_w, True)


@njit(cache=True, nogil=True, error_model="numpy")
def _data_gradient_images(dy, filters, dx, first, stop, image, phases, tiles, tap_starts, a_terms, b_terms, pad_h,
                          pad_w, stride_h, stride_w, pitch, plane):
    """dx[first:stop] = the data gradient of dy's images, a phase at a time: phase (a, b) of dx
    (its pixels (stride_h·i + a, stride_w·j + b)) is Σ over its taps t = tap_starts[phase] ..
    of the filter's column a_terms[t] (`filters`: a row per input channel, O·taps columns)
    times dy shifted by b_terms[t] (dy padded in `image`, one phase), summed by the tiles
    into `phases` (rows of each phase's channel planes, at the image's pitch), then
    interleaved into dx. A phase without taps is zero."""
    channels, height, width = dx.shape[1], dx.shape[2], dx.shape[3]
    rows, depth = filters.shape[0], dy.shape[1]
    taps, count = filters.shape[1] // depth, stride_h * stride_w
    out_plane, pixels = phases.size // (count * rows), dx.reshape(-1)
    for phase in range(count):
        if tap_starts[phase] == tap_starts[phase + 1]:
            phases[phase * rows * out_plane:(phase + 1) * rows * out_plane] = 0
    for n in range(first, stop):
        _pad_image(dy, n, image, pad_h, pad_w, 1, 1, pitch, plane)
        for phase in range(count):
            t0, t1 = tap_starts[phase], tap_starts[phase + 1]
            for c0 in range(0, rows if t1 > t0 else 0, gemm.MR):
                for t in range(tiles.shape[0]):
                    _tile(tiles[t], filters, c0 * filters.shape[1], filters.shape[1], taps, a_terms[t0:t1], image,
                          plane, b_terms[t0:t1], phases, (phase * rows + c0) * out_plane, out_plane, depth)
        for c in range(channels):
            for h in range(height):
                row = ((n * channels + c) * height + h) * width
                start = ((h % stride_h) * stride_w * rows + c) * out_plane + (h // stride_h) * pitch
                if stride_w == 2:  # both phases of the row in one loop, which LLVM vectorises
                    odd = start + rows * out_plane
                    # an odd row's last pixel first: a branch after the loop kept it scalar (3.5× the time)
                    for _ in range(width % 2):
                        pixels[np.uint64(row + width - 1)] = phases[np.uint64(start + width // 2)]
                    for j in range(width // 2):
                        pixels[np.uint64(row + 2 * j)] = phases[np.uint64(start + j)]
                        pixels[np.uint64(row + 2 * j + 1)] = phases[np.uint64(odd + j)]
                    continue
                for b in range(stride_w):
                    source = start + b * rows * out_plane
                    for j in range((width - b + stride_w - 1) // stride_w):
                        pixels[np.uint64(row + j * stride_w + b)] = phases[np.uint64(source + j)]


def _round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _spans(g: Geometry) -> tuple:
    """The batch's spans of images and the threads that take them, for the products of any of
    the three (each multiplies every channel pair at every tap and output pixel)."""
    return thread_spans(g.n, g.n * g.o * g.c * g.out[0] * g.out[1] * g.kernel[0] * g.kernel[1])


def _row_groups(rows: int) -> list[tuple[int, int]] | None:
    """The output's rows in groups of WIDE_VECTORS, the rest in groups of VECTORS: (first row,
    rows) each; None where they do not split so (one row; or with AVX2, an odd count)."""
    for wide in range(rows // gemm.WIDE_VECTORS, -1, -1):
        rest = rows - wide * gemm.WIDE_VECTORS
        if rest % gemm.VECTORS == 0:
            sizes = [gemm.WIDE_VECTORS] * wide + [gemm.VECTORS] * (rest // gemm.VECTORS)
            return list(zip(accumulate(sizes, initial=0), sizes))
    return None


def _row_tiles(out_h: int, out_w: int, pitch: int, lanes: int, output_pitch: int) -> np.ndarray | None:
    """Tiles where each vector is a run of one output row, so that it stores in place: a column
    of a vector's lanes down a group of rows (`_row_groups`), a vector per row, where the
    output's width is a multiple of the lanes; else rows of whole tiles where it is a multiple
    of NR; None where neither fits. Each row of the tiles is (its first pixel in the image, its
    first output, the step from one vector to the next in each, its vectors), output row oh
    starting at oh·output_pitch."""
    groups = _row_groups(out_h)
    if out_w % lanes == 0 and groups is not None:
        tiles = [(oh * pitch + ow, oh * output_pitch + ow, pitch, output_pitch, vectors)
                 for oh, vectors in groups for ow in range(0, out_w, lanes)]
    elif out_w % (gemm.VECTORS * lanes) == 0:
        tiles = [(oh * pitch + ow, oh * output_pitch + ow, lanes, lanes, gemm.VECTORS)
                 for oh in range(out_h) for ow in range(0, out_w, gemm.VECTORS * lanes)]
    else:
        return None
    return np.array(tiles, np.int64).reshape(-1, 5)


def _summed_tiles(columns: int, lanes: int) -> np.ndarray:
    """Tiles of NR consecutive pixels numbered oh·pitch + ow over `columns`, straddling rows
    (each computes the spare pixels between one row and the next), outputs numbered alike."""
    return np.array([(p0, p0, lanes, lanes, gemm.VECTORS) for p0 in range(0, columns, gemm.VECTORS * lanes)],
                    np.int64).reshape(-1, 5)


class DirectConvolution:
    """One convolution's layout (the phases' pitch and planes, the taps' offsets, the forward's
    tiles), its spans of images and each thread's buffers, built when first asked for."""

    def __init__(self, g: Geometry, dtype: np.dtype):
        self.g, self.dtype = g, dtype
        (pad_h, pad_w), (kernel_h, kernel_w), (stride_h, stride_w) = g.padding, g.kernel, g.stride
        (out_h, out_w), width = g.out, gemm.panel_width(dtype)
        self.lanes = lanes = width // gemm.VECTORS
        self.pitch = -(-(g.image[1] + 2 * pad_w) // stride_w)
        self.columns = _round_up(out_h * self.pitch, width)
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
        self.summed_tiles = _summed_tiles(self.columns, lanes)
        self.row_tiles = self._row_tiles()
        self.row_starts = np.arange(out_h, dtype=np.int64) * self.pitch
        self.spans, self.threads = _spans(g)
        self.span_of = {first: k for k, (first, _) in enumerate(self.spans)}  # a span's number, by its start
        self.layout = (pad_h, pad_w, stride_h, stride_w, self.pitch, self.plane)
        # rows past O stay zero
        self.filters = buffers.zeros((self.rows, g.c * len(taps)), dtype, label="direct forward's filters")
        self.filter_outputs = _round_up(g.o, width)
        self.row_runs = np.arange(out_h, dtype=np.int64) * out_w * self.filter_outputs
        self.forward_images: list | None = None
        self.forward_sums: list | None = None
        self.filter_buffers: list | None = None
        self.filter_sums: np.ndarray | None = None

    def _row_tiles(self) -> np.ndarray | None:
        """The forward's tiles in place (`_row_tiles`, outputs at their place in y), or None where
        they do not fit or where O is not a multiple of MR (the tile would write past the
        image's channels)."""
        if self.g.o % gemm.MR:
            return None
        return _row_tiles(*self.g.out, self.pitch, self.lanes, self.g.out[1])

    def _images(self, channels: int) -> np.ndarray:
        """A buffer of the padded image's phases, `channels` planes each."""
        return buffers.zeros(self.phases * channels * self.plane, self.dtype, label="a padded image's phases")

    def forward(self, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> None:
        """out = the convolution of x and w: in place where the tiles are rows of the output and
        `out` is contiguous, else through a buffer of sums at the image's pitch."""
        g = self.g
        if self.forward_images is None:
            self.forward_images = [self._images(g.c) for _ in range(self.threads)]
        in_place = self.row_tiles is not None and out.flags.c_contiguous
        if not in_place and self.forward_sums is None:
            self.forward_sums = [buffers.empty(self.rows * self.columns, self.dtype, label="direct forward's sums")
                                 for _ in range(self.threads)]
        tiles = self.row_tiles if in_place else self.summed_tiles
        self.filters[:g.o] = w.reshape(g.o, -1)

        def span(part, first, stop):
            target = out.reshape(-1) if in_place else self.forward_sums[part]
            _forward_images(x, self.filters, out, first, stop, self.forward_images[part], target, in_place, tiles,
                            self.taps, self.forward_offsets, *self.layout)

        in_spans(span, self.spans, self.threads)

    def backward_filter(self, x: np.ndarray, dy: np.ndarray, out: np.ndarray) -> None:
        """out = the filter gradient of the convolution of x (x and dy C-contiguous). dy is
        transposed where it lies when its channels and pixels are whole vectors; else each
        thread spreads it into rows padded with zeros first. Each span of images sums into
        sums of its own, added in span order: threads take spans as they come free
        (`in_spans`), and sums per thread made the result's rounding depend on which took
        which (the cnn's stride-2 filter gradient differed by 1e-4 between calls)."""
        g, outputs = self.g, self.filter_outputs
        if self.filter_buffers is None:
            pixels = g.out[0] * g.out[1]
            length = _round_up(pixels, self.lanes)
            spread = 0 if pixels % self.lanes == 0 and g.o % self.lanes == 0 else outputs
            self.filter_buffers = [(self._images(self.channels_up),
                                    buffers.zeros((spread, length), self.dtype, label="filter gradient's rows of dy"),
                                    buffers.empty(length * outputs, self.dtype, label="filter gradient's dy"))
                                   for _ in range(self.threads)]
            self.filter_sums = buffers.empty((len(self.spans), len(self.taps), self.channels_up, outputs), self.dtype,
                                             label="filter gradient's sums")

        def span(part, first, stop):
            image, spread, rows = self.filter_buffers[part]
            sums = self.filter_sums[self.span_of[first]]
            sums[...] = 0
            _filter_gradient_images(x, dy, first, stop, image, spread, rows, sums, self.filter_offsets,
                                    self.row_starts, self.row_runs, *self.layout)

        in_spans(span, self.spans, self.threads)
        total = self.filter_sums.sum(axis=0)[:, :g.c, :g.o]
        out[...] = np.moveaxis(total, 0, 2).transpose(1, 0, 2).reshape(g.w_shape)


def _phase_taps(kernel: int, stride: int, padding: int) -> list[list[tuple[int, int]]]:
    """Along one axis, for each phase a of the image (its pixels stride·i + a), the taps k that
    reach it and the shift of dy they read: output pixel i + shift, where stride·(i + shift) −
    padding + k = stride·i + a."""
    return [[(k, (a + padding - k) // stride) for k in range(kernel) if (a + padding - k) % stride == 0]
            for a in range(stride)]


class PhasedDataGradient:
    """The data gradient of a strided convolution by the phases of the image: phase (a, b),
    the pixels (stride_h·i + a, stride_w·j + b), receives only the taps congruent to it, each
    reading dy shifted by a constant (`_phase_taps`), so each phase is a stride-1 correlation
    of dy with a sub-filter (3×3 at stride 2: 1×1, 1×2, 2×1 and 2×2). The taps sum on the tile
    as the forward's do (dy padded, a row of input channels of the transposed filter), into
    a buffer of phases that is then interleaved into dx: no products with the zeros that a
    dilated dy would hold, and no col2im.

    dy's padding is the largest backward shift, low side; the pitch holds every column a
    phase's row reads, so no read wraps into the next row. Reads of the padding multiply
    zeros, so the caller takes this only for a finite filter (as for the transposed
    convolution at stride 1)."""

    def __init__(self, g: Geometry, dtype: np.dtype):
        self.g, self.dtype = g, dtype
        width = gemm.panel_width(dtype)
        lanes = width // gemm.VECTORS
        rows_taps, columns_taps = (_phase_taps(k, s, p) for k, s, p in zip(g.kernel, g.stride, g.padding))
        shifts_h = [shift for taps in rows_taps for _, shift in taps] or [0]
        shifts_w = [shift for taps in columns_taps for _, shift in taps] or [0]
        pad_h, pad_w = max(0, -min(shifts_h)), max(0, -min(shifts_w))
        phase_h, phase_w = (-(-size // s) for size, s in zip(g.image, g.stride))
        self.pitch = phase_w + pad_w + max(0, max(shifts_w))
        terms = [[(kh * g.kernel[1] + kw, (sh + pad_h) * self.pitch + sw + pad_w)
                  for kh, sh in rows_taps[a] for kw, sw in columns_taps[b]]
                 for a in range(g.stride[0]) for b in range(g.stride[1])]
        self.tap_starts = np.cumsum([0] + [len(t) for t in terms]).astype(np.int64)
        self.a_terms, self.b_terms = (np.array([term[i] for t in terms for term in t], np.int64) for i in (0, 1))
        columns = _round_up(phase_h * self.pitch, width)
        lines = phase_h + pad_h + max(0, max(shifts_h))
        self.plane = max(lines * self.pitch, columns + int(self.b_terms.max(initial=0)) + 1)
        self.tiles = _row_tiles(phase_h, phase_w, self.pitch, lanes, self.pitch)
        if self.tiles is None:
            self.tiles = _summed_tiles(columns, lanes)
        self.rows = _round_up(g.c, gemm.MR)
        self.filters = buffers.zeros((self.rows, g.o * g.kernel[0] * g.kernel[1]), dtype,
                                     label="data gradient's filters")  # rows past C stay zero
        self.phases_size = g.stride[0] * g.stride[1] * self.rows * columns
        self.spans, self.threads = _spans(g)
        self.layout = (pad_h, pad_w, *g.stride, self.pitch, self.plane)
        self.buffers: list | None = None

    def backward_data(self, w: np.ndarray, dy: np.ndarray, out: np.ndarray) -> None:
        """out = the data gradient of a convolution with filter w, from the gradient dy."""
        g = self.g
        if self.buffers is None:
            self.buffers = [(buffers.zeros(g.o * self.plane, self.dtype, label="data gradient's dy"),
                             buffers.empty(self.phases_size, self.dtype, label="data gradient's phases"))
                            for _ in range(self.threads)]
        self.filters[:g.c] = w.transpose(1, 0, 2, 3).reshape(g.c, -1)
        # the interleave writes it flat
        dx = out if out.flags.c_contiguous else buffers.empty(out.shape, out.dtype, label="data gradient's dx")

        def span(part, first, stop):
            image, phases = self.buffers[part]
            _data_gradient_images(dy, self.filters, dx, first, stop, image, phases, self.tiles, self.tap_starts,
                                  self.a_terms, self.b_terms, *self.layout)

        in_spans(span, self.spans, self.threads)
        if dx is not out:
            out[...] = dx
