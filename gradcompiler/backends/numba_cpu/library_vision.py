"""Bilinear image warps: WarpPerspective, WarpAffine, the two backward ops of the
perspective warp and its tangent along the matrix (op-reference §9), for NCHW and NHWC
and all five border modes.

One sampling model serves all five (§9.2, `_pixel_taps`): the source point
of each output pixel is computed in the matrix's dtype with the reference's
operation order, so both pick the same taps; the weights and sums are
float64. Images are read and written as flat C-order buffers with explicit
(n, c, h, w) element strides, so both layouts share one compiled loop per
dtype, and the border mode is a run-time integer.

Every loop works a row at a time: `_row_taps` fills three small arrays with
each pixel's tap offsets, weights and source point, and the channels then
read them. For the clamping modes (replicate, constant) that loop is
branch-free and LLVM vectorises it; the periodic modes call `_border` per
tap. Measured on the (32, 3, 64, 64) spatial_transformer warp against one
`_sample` call per pixel and channel loop: forward 1.8 against 2.9 ms,
BackwardData 1.7 against 3.0, BackwardMat 2.9 against 3.6 (medians,
interleaved), then 0.78-0.91x of that with its channels added into the
row's sums a row at a time. Inlining the row into each loop keeps the
vectorisation (the fresh scratch arrays cannot alias) and costs 7-12 s of
compile per loop (`_border` stays a call: inlining it too doubled that).

Only CONSTANT mode has border taps, so the forward and BackwardMat loops
run each channel's row through one of two inlined copies, with and without
the border check (`_tap_value`). With that and `_clamped` written without
`min` and `max`, the spatial_transformer step took 0.87-0.90x its time
before (medians of 60 steps each, alternated in one process, four times).

The per-channel loops that gather taps (a forward row, a row's slopes) read
and write through `alias_scopes`: the image, g and the row's taps are
sources, the output row and the row's sums results. Without that, LLVM
cannot bound a tap's address, so it cannot rule out that a store feeds a
later gather, and the loop stayed scalar; with it, the loop vectorises
with gathers. BackwardData's scatter stays a separate loop (two pixels
may add into one element), of vector updates of a pixel's channels. On the (32, 3, 64, 64)
spatial_transformer: forward 0.72 -> 0.60 ms, the gradients pair 1.75 ->
1.53 ms, the step 2.68 -> 2.32 ms (per-call medians of 200 steps).

* Forward: parallel over blocks of output rows.
* BackwardData (scatter-add into the source gradient): parallel over
  *source* images; each owns its image and walks the matrices that read
  it (all of them with mat_idx, else one), so no two threads ever write
  the same pixel and sums are deterministic. It sums the image in float64
  and converts it once: the spatial_transformer's gradients pair 1.31 ->
  1.11 ms (two threads, medians of 30 calls). The sums keep each pixel's
  channels side by side, so a tap adds four channels in one vector update
  (`_scatter_row`).
* BackwardMat: parallel over matrices, float64 sums of the §9.5 terms,
  skipping every non-finite term as MegEngine's kernel does.
* Both at once (a `SiblingCalls` of the two, which fusion makes when a step
  needs both gradients of a warp): BackwardData's loop, with BackwardMat's
  sums made from the same taps, each channel's row of g read for both while
  it is in L1 (`_add_matrix_row`); the values are the two loops' own. On the
  (32, 3, 64, 64) spatial_transformer: 1.65-1.68 ms against 1.04 + 1.11 ms
  for the two calls.
* The forward warp with them, or with BackwardMat alone (fusion joins it
  when the upstream gradient does not read the warp, as in a loss linear in
  it): the same loop blends each pixel's forward value from the taps that
  BackwardMat's slopes gather anyway (`_blend`, the forward loop's own
  order, so the values are equal bit for bit). The spatial_transformer step
  took 0.76 of its time with the forward apart (1.53-1.56 against
  2.02-2.06 ms, medians of 200 steps alternated in one process, three
  times). `_joint_warp` declines calls that read another image or upstream
  gradient than BackwardMat's (the sibling key leaves them open); the
  forward with BackwardData alone has no joint kernel (the slopes would be
  wasted) and runs as two calls.
* TangentMat (BackwardMat's transpose, for forward mode): parallel over
  blocks of output rows; each pixel sums the same terms over the nine matrix entries
  in float64, with the same skips. `_slopes` and `_coordinate_partials`
  are the per-pixel pieces both loops share.

Non-finite source coordinates (den = 0): in CONSTANT mode the pixel is
border_val with no gradient, in the other modes NaN with no gradient, as
the reference defines it. mat_idx values are checked before any loop runs.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from ...kernel import SiblingCalls
from ...ops.vision import (
    WarpAffine,
    WarpPerspective,
    WarpPerspectiveBackwardData,
    WarpPerspectiveBackwardMat,
    WarpPerspectiveTangentMat,
    split_backward_inputs,
)
from .alias_scopes import GROUP, add_scaled_group, load_result, load_source, store_result
from .library import LibraryKernel, ParallelLoop, index_error, joint_kernel, library_kernel

_MODE_CODES = {"replicate": 0, "reflect": 1, "reflect_101": 2, "wrap": 3, "constant": 4}
_REPLICATE, _REFLECT, _REFLECT_101, _WRAP, _CONSTANT = range(5)


# -- the sampling model ------------------------------------------------------------------------


@njit(inline="always", cache=True, error_model="numpy")
def _clamped(p, length, mode):
    """`_border` for the clamping modes (REPLICATE, CONSTANT): two selects, an int32
    conversion and no branch, so a loop of them vectorises. Not the builtins `min` and
    `max`: Numba calls them as functions that LLVM inlines only after its vectoriser has
    run, so the loop stayed scalar (a row's taps 22 → 8 ns a pixel without them). The
    bounds are in p's dtype (`p - p` is its 0: p is a finite floor), so a float32 matrix
    compares in float32, not float64 (7.7 → 6.8 ns)."""
    zero = p - p
    last = zero + np.float32(length - 1)
    clamped = zero if p < zero else (last if p > last else p)
    return np.int32(clamped), ((p >= zero) & (p <= last)) | (mode == _REPLICATE)


@njit(cache=True, error_model="numpy")
def _border(p, length, mode):
    """(index, valid) of the integer-valued float tap `p` on an axis of `length` (§9.2 table)."""
    if mode == _REPLICATE or mode == _CONSTANT:
        index, valid = _clamped(p, length, mode)
        return np.int64(index), valid
    if length == 1:
        return np.int64(0), True
    if mode == _WRAP:
        return np.int64(np.float64(p) % length), True   # exact: p is an integral float
    period = 2 * length if mode == _REFLECT else 2 * length - 2
    q = np.int64(np.float64(p) % period)
    if q < length:
        return q, True
    return (period - 1 - q if mode == _REFLECT else period - q), True


@njit(inline="always", cache=True, error_model="numpy")
def _row_buffers(width):
    """Scratch for `_row_taps`, per pixel of a row: the `offsets` and `weights` of its four
    taps (00, 01, 10, 11) and its `points` (xs, ys, den). An offset is −1 where the tap reads
    border_val (outside the image, so only in CONSTANT mode); the weights are NaN where the
    point is not finite (`_finite`), whose offsets are those of the point (0, 0), so every
    other mode reads every tap without a check. Three arrays, few enough for LLVM to
    vectorise the loop that fills them (a fourth, of flags, stopped it). Unpack the tuple
    where it is made and pass the arrays: Numba's parallel loops mishandle a tuple of arrays
    handed on whole."""
    return np.empty((4, width), np.int64), np.empty((4, width), np.float64), np.empty((3, width), np.float64)


@njit(inline="always", cache=True, error_model="numpy")
def _pixel_taps(m, fx, fy, one, in_h, in_w, mode, clamps, base, sh, sw, ow, offsets, weights, points):
    """Store pixel `ow`'s taps in the `_row_buffers`; `m`: the matrix's nine entries.

    The source point and the floors are computed in the matrix's dtype (`one` is 1 in it)
    in the reference's operation order, so both pick the same taps even for huge
    coordinates; weights are float64. `clamps` (a constant after inlining) takes
    `_clamped` for the clamping modes, which vectorises, and `_border` else.
    """
    den = m[6] * fx + m[7] * fy + m[8]
    xs = (m[0] * fx + m[1] * fy + m[2]) / den
    ys = (m[3] * fx + m[4] * fy + m[5]) / den
    finite = math.isfinite(xs) & math.isfinite(ys)
    xs = xs if finite else fx - fx
    ys = ys if finite else fx - fx
    x0, y0 = np.floor(xs), np.floor(ys)
    if clamps:
        c0, in_c0 = _clamped(x0, in_w, mode)
        c1, in_c1 = _clamped(x0 + one, in_w, mode)
        r0, in_r0 = _clamped(y0, in_h, mode)
        r1, in_r1 = _clamped(y0 + one, in_h, mode)
    else:
        c0, in_c0 = _border(x0, in_w, mode)
        c1, in_c1 = _border(x0 + one, in_w, mode)
        r0, in_r0 = _border(y0, in_h, mode)
        r1, in_r1 = _border(y0 + one, in_h, mode)
    ax = np.float64(xs - x0) if finite else np.nan
    ay = np.float64(ys - y0)
    weights[0, ow], weights[1, ow] = (1 - ax) * (1 - ay), ax * (1 - ay)
    weights[2, ow], weights[3, ow] = (1 - ax) * ay, ax * ay
    row0, row1 = base + np.int64(r0) * sh, base + np.int64(r1) * sh
    offsets[0, ow] = row0 + np.int64(c0) * sw if in_r0 & in_c0 else -1
    offsets[1, ow] = row0 + np.int64(c1) * sw if in_r0 & in_c1 else -1
    offsets[2, ow] = row1 + np.int64(c0) * sw if in_r1 & in_c0 else -1
    offsets[3, ow] = row1 + np.int64(c1) * sw if in_r1 & in_c1 else -1
    points[0, ow], points[1, ow], points[2, ow] = np.float64(xs), np.float64(ys), np.float64(den)


@njit(inline="always", cache=True, error_model="numpy")
def _row_taps(m, oh, coords, in_h, in_w, mode, base, sh, sw, offsets, weights, points):
    """`_pixel_taps` of every pixel of output row `oh`: the row's sampling, computed once and
    read by every channel (one loop per family of modes, so the clamping one vectorises; the
    matrix entries are read into a tuple first, which the loop cannot alias)."""
    entries = (m[0], m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8])
    fy, one, width = coords[oh], coords[1], offsets.shape[1]
    if mode == _REPLICATE or mode == _CONSTANT:
        for ow in range(width):
            _pixel_taps(entries, coords[ow], fy, one, in_h, in_w, mode, True, base, sh, sw, ow,
                        offsets, weights, points)
    else:
        for ow in range(width):
            _pixel_taps(entries, coords[ow], fy, one, in_h, in_w, mode, False, base, sh, sw, ow,
                        offsets, weights, points)


@njit(inline="always", cache=True, error_model="numpy")
def _finite(weights, ow):
    """Whether pixel ow's source point is finite (`_row_buffers`)."""
    return not math.isnan(weights[0, ow])


@njit(inline="always", cache=True, error_model="numpy")
def _tap_value(src, k, offsets, j, ow, border_val, constant):
    """Tap j of pixel ow in the channel at offset `k`: the image there, or border_val (read
    at offset k instead, a pixel of the image, so the load needs no branch). Only CONSTANT
    mode has border taps (`_row_buffers`): `constant` False, a literal where the loops
    specialise on it, leaves out the check."""
    offset = load_source(offsets, (j, ow))
    if not constant:
        return np.float64(load_source(src, np.uint64(offset + k)))
    value = np.float64(load_source(src, np.uint64((offset if offset > 0 else 0) + k)))
    return value if offset >= 0 else border_val


# -- loops (flat buffers; strides are (n, c, h, w) element strides) ----------------------------
# Buffer offsets are cast to np.uint64 where they index: they are never negative, and a
# signed index costs a wraparound select on every access. The row-parallel loops take
# blocks of ROWS_PER_BLOCK rows, so each allocates its scratch once per block.

ROWS_PER_BLOCK = 16


@njit(inline="always", cache=True, error_model="numpy")
def _block_rows(block, rows):
    """[first, stop) of the output rows (n · out_h + oh) in block `block` of `rows`, signed
    (the prange index is unsigned, and a row's n and oh are divisions of it)."""
    first = np.int64(block) * ROWS_PER_BLOCK
    return first, min(np.int64(rows), first + ROWS_PER_BLOCK)


@njit(inline="always", cache=True, error_model="numpy")
def _tap_values(src, k, offsets, ow, border_val, constant):
    """The four taps of pixel ow in the channel at offset `k` (`_tap_value`), float64."""
    return (_tap_value(src, k, offsets, 0, ow, border_val, constant),
            _tap_value(src, k, offsets, 1, ow, border_val, constant),
            _tap_value(src, k, offsets, 2, ow, border_val, constant),
            _tap_value(src, k, offsets, 3, ow, border_val, constant))


@njit(inline="always", cache=True, error_model="numpy")
def _blend(weights, ow, taps, border_val, constant):
    """Pixel ow's forward value from its four `taps`, in float64 and in one order wherever it
    is made (the forward loop, the joint one). A point that is not finite has NaN weights:
    NaN, or border_val in CONSTANT (`constant`: as `_tap_value`)."""
    value = load_source(weights, (0, ow)) * taps[0]
    value += load_source(weights, (1, ow)) * taps[1]
    value += load_source(weights, (2, ow)) * taps[2]
    value += load_source(weights, (3, ow)) * taps[3]
    if constant and not math.isfinite(value):
        value = border_val
    return value


@njit(inline="always", cache=True, error_model="numpy")
def _sample_row(src, k, offsets, weights, out, line, ow_stride, border_val, constant):
    """One channel of an output row (`_forward_loop`); `constant`: as `_tap_value`."""
    for ow in range(offsets.shape[1]):
        taps = _tap_values(src, k, offsets, ow, border_val, constant)
        store_result(out, np.uint64(line + ow * ow_stride), _blend(weights, ow, taps, border_val, constant))


@ParallelLoop
def _forward_loop(source, mats, images, coords, target, mode, border_val):
    src, (sn, sc, sh, sw), channels, in_h, in_w = source
    out, (on, oc, oh_stride, ow_stride), _, out_h, out_w = target
    rows = mats.shape[0] * out_h
    for block in prange((rows + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK):
        offsets, weights, points = _row_buffers(out_w)
        for row in range(*_block_rows(block, rows)):
            n, oh = row // out_h, row % out_h
            _row_taps(mats[n], oh, coords, in_h, in_w, mode, images[n] * sn, sh, sw,
                      offsets, weights, points)
            for c in range(channels):
                k, line = c * sc, n * on + c * oc + oh * oh_stride
                if mode == _CONSTANT:
                    _sample_row(src, k, offsets, weights, out, line, ow_stride, border_val, True)
                else:
                    _sample_row(src, k, offsets, weights, out, line, ow_stride, border_val, False)


@ParallelLoop
def _backward_data_loop(gradient, mats, order, starts, coords, upstream, mode):
    """gradient[image] = Σ over the matrices reading `image` (order[starts[i]:starts[i+1]]),
    summed by the thread that owns the image in float64 (`_scatter_row`; an image is sn
    contiguous elements in either layout)."""
    grad, (sn, sc, sh, sw), channels, in_h, in_w = gradient
    g, (gn, gc, gh, gw), _, out_h, out_w = upstream
    for image in prange(starts.size - 1):
        sums, row_g = _scatter_buffers(in_h, in_w, out_w, channels, True)
        offsets, weights, points = _row_buffers(out_w)
        for slot in range(starts[image], starts[image + 1]):
            n = order[slot]
            for oh in range(out_h):
                _row_taps(mats[n], oh, coords, in_h, in_w, mode, 0, sh, sw, offsets, weights, points)
                _scatter_row(sums, row_g, 0, sw, channels, offsets, weights, g, n * gn + oh * gh, gc, gw,
                             mode == _CONSTANT)
        _store_image(grad, image * sn, sums, channels, sc, sw)


@njit(inline="always", cache=True, error_model="numpy")
def _channel_pitch(channels):
    """Elements per pixel in BackwardData's float64 sums: the channels, padded to whole
    groups of `add_scaled_group`."""
    return (channels + GROUP - 1) // GROUP * GROUP


@njit(inline="always", cache=True, error_model="numpy")
def _scatter_buffers(in_h, in_w, out_w, channels, scatter):
    """(sums, row_g) for `_scatter_row`, zeroed (the padding channels stay 0); empty
    without `scatter`."""
    pitch = _channel_pitch(channels)
    return np.zeros(in_h * in_w * pitch if scatter else 0), np.zeros(out_w * pitch if scatter else 0)


@njit(inline="always", cache=True, error_model="numpy")
def _scatter_row(sums, row_g, base, sw, channels, offsets, weights, g, first, gc, gw, constant):
    """BackwardData's share of an output row (its g from `first`): each pixel's g into its
    four taps, in `sums`, the float64 gradient of the image whose taps start at `base`.

    `sums` is laid out pixel by pixel, each pixel's channels side by side, padded to whole
    groups (`_channel_pitch`), whatever the image's layout; `row_g` holds the row's g the
    same way. A tap then adds a group of channels in one vector operation
    (`add_scaled_group`) instead of a scalar read-modify-write per channel. A tap's pixel
    is its offset less `base`, divided by the pixel stride `sw` (1 in NCHW, so no division
    there). `_store_image` writes the sums into the image's own layout once.

    The left taps of every pixel go first, then the right taps: a pixel's right taps are
    usually the next pixel's left taps, and taking them one after the other made each
    addition wait for the store before it. Each element receives its additions in one
    fixed order (left taps in pixel order, then right taps), the same in every loop that
    scatters. Float64 sums, not the gradient's dtype: a float32 addition converts the
    element there and back. On the (32, 3, 64, 64) spatial_transformer, against a scalar
    update per channel and tap in pixel order, the joint gradients call took 1.03 ->
    0.79 ms with this and the matrix gradient's per-pixel sums (`_add_row_terms`);
    the groups alone 1.03 -> 0.90, the left taps first 0.83 -> 0.79 (medians of 100
    calls, two threads). `constant`: whether to check for border taps (CONSTANT mode,
    the only one with them). The first group is added outside the loop over groups, which
    for four channels or fewer then never runs: 0.94-0.96 of the call's time against the
    loop alone (medians of 100 calls, seven rounds alternated in one process, both orders)."""
    pitch = _channel_pitch(channels)
    width = offsets.shape[1]
    for c in range(channels):
        for ow in range(width):
            row_g[np.uint64(ow * pitch + c)] = g[np.uint64(first + c * gc + ow * gw)]
    for side in range(2):
        for ow in range(width):
            if not _finite(weights, ow):   # no gradient from it
                continue
            at_g = ow * pitch
            for j in (side, side + 2):
                offset = offsets[j, ow]
                if not constant or offset >= 0:     # not a border tap
                    tap = offset - base
                    if sw != 1:
                        tap = tap // sw
                    at, weight = tap * pitch, weights[j, ow]
                    add_scaled_group(sums, np.uint64(at), weight, row_g, np.uint64(at_g))
                    for group in range(GROUP, pitch, GROUP):   # none up to four channels
                        add_scaled_group(sums, np.uint64(at + group), weight, row_g, np.uint64(at_g + group))


@njit(inline="always", cache=True, error_model="numpy")
def _store_image(grad, first, sums, channels, sc, sw):
    """The image from `first` in `grad` (channel stride sc, pixel stride sw) = its float64
    `sums` (`_scatter_row`), converted to grad's dtype."""
    pitch = _channel_pitch(channels)
    pixels = sums.size // pitch
    for c in range(channels):
        for s in range(pixels):
            grad[np.uint64(first + c * sc + s * sw)] = sums[np.uint64(s * pitch + c)]


@njit(cache=True, error_model="numpy")
def _coordinate_partials(fx, fy, xs, ys, den):
    """(∂xs/∂m, ∂ys/∂m): the nine partials of the source point wrt the matrix (§9.5). A call,
    not inlined: inlined into the parallel TangentMat loop, its two tuples of nine confused
    Numba's array analysis (a "dimension mismatch" at compile time)."""
    d_xs = (fx / den, fy / den, 1 / den, 0.0, 0.0, 0.0, -fx * xs / den, -fy * xs / den, -xs / den)
    d_ys = (0.0, 0.0, 0.0, fx / den, fy / den, 1 / den, -fx * ys / den, -fy * ys / den, -ys / den)
    return d_xs, d_ys


@njit(inline="always", cache=True, error_model="numpy")
def _fractions(points, ow):
    """(ax, ay): pixel ow's source point's distance past its top-left tap."""
    xs, ys = load_source(points, (0, ow)), load_source(points, (1, ow))
    return xs - np.floor(xs), ys - np.floor(ys)


@njit(inline="always", cache=True, error_model="numpy")
def _slopes(src, k, offsets, ow, ax, ay, border_val, constant):
    """(∂out/∂xs, ∂out/∂ys) of one channel (offset `k`) at pixel ow, float64; `constant`: as
    `_tap_value`."""
    return _slopes_of(_tap_values(src, k, offsets, ow, border_val, constant), ax, ay)


@njit(inline="always", cache=True, error_model="numpy")
def _slopes_of(taps, ax, ay):
    """`_slopes` from the pixel's four taps."""
    v00, v01, v10, v11 = taps
    return (1 - ay) * (v01 - v00) + ay * (v11 - v10), (1 - ax) * (v10 - v00) + ax * (v11 - v01)


@njit(cache=True, error_model="numpy")
def _add_finite_terms(total, g_dx, g_dy, fx, fy, xs, ys, den):
    """total[j] += g_dx·∂xs/∂m_j + g_dy·∂ys/∂m_j for each j whose term is finite."""
    d_xs, d_ys = _coordinate_partials(fx, fy, xs, ys, den)
    for j in range(9):
        term = g_dx * d_xs[j] + g_dy * d_ys[j]
        if math.isfinite(term):
            total[j] += term


@njit(cache=True, error_model="numpy")
def _add_pixel_terms(total, sums, src, sc, channels, offsets, points, ow, g, pixel, gc, fx, fy,
                     border_val):
    """Pixel ow's channels one by one, as `_backward_mat_loop` takes a pixel with a non-finite
    term: the finite channels' sums into sums[0:2, ow], the others term by term into total
    (sums[3, ow] holds the pixel's bound of the partials)."""
    xs, ys, den = points[0, ow], points[1, ow], points[2, ow]
    partials_bound = sums[3, ow]
    ax, ay = _fractions(points, ow)
    sum_dx = sum_dy = 0.0
    for c in range(channels):
        d_x, d_y = _slopes(src, c * sc, offsets, ow, ax, ay, border_val, True)
        value = np.float64(g[np.uint64(pixel + c * gc)])
        g_dx = value * d_x  # g · ∂out/∂xs
        g_dy = value * d_y  # g · ∂out/∂ys
        if math.isfinite(g_dx + g_dy + partials_bound):   # NaN or inf anywhere
            sum_dx += g_dx
            sum_dy += g_dy
        else:
            _add_finite_terms(total, g_dx, g_dy, fx, fy, xs, ys, den)
    sums[0, ow], sums[1, ow] = sum_dx, sum_dy


@njit(inline="always", cache=True, error_model="numpy")
def _start_row_sums(sums, points, coords, fy):
    """Zero a row's `sums` and store each pixel's bound of the partials (`_backward_mat_loop`)."""
    for ow in range(sums.shape[1]):
        fx, xs, ys = np.float64(coords[ow]), points[0, ow], points[1, ow]
        sums[0, ow] = sums[1, ow] = sums[2, ow] = 0.0
        sums[3, ow] = 1 / points[2, ow] * (fx + fy + 1) * (1 + abs(xs) + abs(ys))


@njit(inline="always", cache=True, error_model="numpy")
def _add_row_terms(total, sums, src, sc, channels, offsets, weights, points, coords, fy, g, pixels, gw, gc,
                   border_val):
    """A row's terms into `total`, per pixel (`_backward_mat_loop`): the nine partials
    applied to its `sums`, the pixels whose check is not finite redone a channel at a time
    first; `pixels`: the row's first pixel in g. A pixel whose point is not finite adds 0.
    No loop here carries a sum from pixel to pixel, so the one that applies the partials
    vectorises, division included."""
    width = sums.shape[1]
    redo = False
    for ow in range(width):
        redo |= _finite(weights, ow) & (not math.isfinite(sums[2, ow]))
    if redo:
        for ow in range(width):
            if _finite(weights, ow) and not math.isfinite(sums[2, ow]):
                _add_pixel_terms(total[:, ow], sums, src, sc, channels, offsets, points, ow, g, pixels + ow * gw,
                                 gc, np.float64(coords[ow]), fy, border_val)
    for ow in range(width):
        xs, ys, inv = load_source(points, (0, ow)), load_source(points, (1, ow)), 1 / load_source(points, (2, ow))
        finite, fx = _finite(weights, ow), np.float64(load_source(coords, ow))
        d_x, d_y = load_result(sums, (0, ow)), load_result(sums, (1, ow))   # `_add_channel_slopes` stores them
        _add_partial(total, 0, ow, d_x * inv if finite else 0.0, fx, fy)
        _add_partial(total, 3, ow, d_y * inv if finite else 0.0, fx, fy)
        _add_partial(total, 6, ow, -(d_x * xs + d_y * ys) * inv if finite else 0.0, fx, fy)


@njit(inline="always", cache=True, error_model="numpy")
def _add_partial(total, j, ow, term, fx, fy):
    """Pixel ow's term (a, b or c of `_backward_mat_loop`) times (fx, fy, 1) into
    total[j:j + 3, ow]."""
    store_result(total, (j, ow), load_result(total, (j, ow)) + term * fx)
    store_result(total, (j + 1, ow), load_result(total, (j + 1, ow)) + term * fy)
    store_result(total, (j + 2, ow), load_result(total, (j + 2, ow)) + term)


@njit(inline="always", cache=True, error_model="numpy")
def _store_matrix_gradient(out, n, total):
    """out[n] = the per-pixel sums `total` added up, pixel by pixel; total is zeroed for the
    next matrix."""
    for j in range(9):
        value = 0.0
        for ow in range(total.shape[1]):
            value += total[j, ow]
        out[n, j] = value
        total[j, :] = 0.0


@ParallelLoop
def _backward_mat_loop(source, mats, images, coords, upstream, mode, border_val, out):
    """out[n] = Σ g·(∂out/∂xs·∂xs/∂m + ∂out/∂ys·∂ys/∂m), skipping non-finite terms.

    A row at a time: every channel adds its g·∂out/∂xs and g·∂out/∂ys into
    the row's `sums`, with a check sum of g·∂out/∂xs + g·∂out/∂ys + the
    bound of the partials, which is finite only if every channel's term is
    (a NaN or an infinity in any of them stays in the sum). Where the check
    is finite (the usual case) the nine partials are applied to the sums
    once; otherwise the pixel is redone a channel at a time
    (`_add_pixel_terms`), so the sums are the same either way. The partials
    are (a, b, c)·(fx, fy, 1) per pixel. They are summed per pixel (column)
    over the rows in `total` (9 × out_w), then over the columns once per
    matrix (`_store_matrix_gradient`): a row's loop then carries no sum from
    pixel to pixel and vectorises. Summing each row in registers (six
    chains of dependent additions, the division in the same scalar loop)
    took 1.07 of the time of the joint gradients call on the
    spatial_transformer (0.89 against 0.83 ms, the scatter in groups).
    """
    src, (sn, sc, sh, sw), channels, in_h, in_w = source
    g, (gn, gc, gh, gw), _, out_h, out_w = upstream
    for n in prange(mats.shape[0]):
        offsets, weights, points = _row_buffers(out_w)
        sums = np.empty((4, out_w))   # Σ g·∂out/∂xs, Σ g·∂out/∂ys, the check, the bound
        total = np.zeros((9, out_w))
        for oh in range(out_h):
            # no scatter: sums[0] stands in for the image gradient and its row, never written
            _add_matrix_row(total, sums, sums[0], sums[0], False, mats[n], oh, images[n] * sn, src, sc, sh, sw,
                            channels, in_h, in_w, g, n * gn, gc, gh, gw, coords, mode, border_val,
                            offsets, weights, points, False, sums[0], (0, 0, 0))
        _store_matrix_gradient(out, n, total)


@njit(inline="always", cache=True, error_model="numpy")
def _add_channel_slopes(sums, src, k, offsets, weights, points, g, line, gw, border_val, constant,
                        sample, forward, forward_line, ow_stride):
    """One channel of a row: its g·∂out/∂xs and g·∂out/∂ys into the row's `sums`, with the
    check sum (`_backward_mat_loop`): a loop of gathers that vectorises (`alias_scopes`).
    With `sample`, the forward row too, from the same taps (`_blend`), into `forward` from
    `forward_line`. `constant` and `sample`: literals where the loops call it."""
    for ow in range(offsets.shape[1]):
        ax, ay = _fractions(points, ow)
        taps = _tap_values(src, k, offsets, ow, border_val, constant)
        d_x, d_y = _slopes_of(taps, ax, ay)
        value = np.float64(load_source(g, np.uint64(line + ow * gw)))
        g_dx, g_dy = value * d_x, value * d_y
        store_result(sums, (0, ow), load_result(sums, (0, ow)) + g_dx)
        store_result(sums, (1, ow), load_result(sums, (1, ow)) + g_dy)
        store_result(sums, (2, ow), load_result(sums, (2, ow)) + (g_dx + g_dy + load_result(sums, (3, ow))))
        if sample:
            store_result(forward, np.uint64(forward_line + ow * ow_stride),
                         _blend(weights, ow, taps, border_val, constant))


@njit(inline="always", cache=True, error_model="numpy")
def _add_matrix_row(total, sums, image_grad, row_g, scatter, m, oh, base, src, sc, sh, sw, channels, in_h, in_w, g,
                    first, gc, gh, gw, coords, mode, border_val, offsets, weights, points,
                    sample, forward, forward_at):
    """Row oh of the matrix `m` (its image at `base`, its g from `first`) into BackwardMat's
    `total`; with `scatter` (a literal) into BackwardData's float64 `image_grad` too
    (`_scatter_row`), from the same taps, the row of g still in L1; with `sample` (a literal)
    the forward warp's row into `forward` too (`forward_at`: the row's first element, the
    channel and pixel strides), from the same gathers (`_add_channel_slopes`). One tuple for
    the three: CPython 3.11 passes a call of more than 30 positional arguments as *args, and
    Numba's inliner rejects that ("Calling a closure with *args")."""
    _row_taps(m, oh, coords, in_h, in_w, mode, base, sh, sw, offsets, weights, points)
    fy, row = np.float64(coords[oh]), first + oh * gh
    forward_row, oc, ow_stride = forward_at
    _start_row_sums(sums, points, coords, fy)
    for c in range(channels):
        k, line, forward_line = c * sc, row + c * gc, forward_row + c * oc
        if mode == _CONSTANT:
            _add_channel_slopes(sums, src, k, offsets, weights, points, g, line, gw, border_val, True,
                                sample, forward, forward_line, ow_stride)
        else:
            _add_channel_slopes(sums, src, k, offsets, weights, points, g, line, gw, border_val, False,
                                sample, forward, forward_line, ow_stride)
    if scatter:
        _scatter_row(image_grad, row_g, base, sw, channels, offsets, weights, g, row, gc, gw, mode == _CONSTANT)
    _add_row_terms(total, sums, src, sc, channels, offsets, weights, points, coords, fy, g, row, gw, gc,
                   border_val)


@ParallelLoop
def _gradients_loop(source, gradient, mats, order, starts, coords, upstream, mode, border_val, out, target,
                    scatter, sample):
    """BackwardMat into `out`, with `scatter` BackwardData into `gradient` and with `sample`
    the forward warp into `target`, in one pass: parallel over source images as
    `_backward_data_loop` (each thread owns an image and the matrices that read it, so it
    alone writes their rows of `out`, of `target` and of the image's gradient), each row's
    taps computed once and each channel's row of g read for both gradients while in L1, the
    forward row made from the gathers that the matrix gradient makes anyway
    (`_add_matrix_row`). The sums and their order are those of the ops' own loops, so the
    values are equal to theirs."""
    src, (sn, sc, sh, sw), channels, in_h, in_w = source
    grad, forward, (on, oc, oh_stride, ow_stride) = gradient[0], target[0], target[1]
    g, (gn, gc, gh, gw), _, out_h, out_w = upstream
    for image in prange(starts.size - 1):
        image_grad, row_g = _scatter_buffers(in_h, in_w, out_w, channels, scatter)
        offsets, weights, points = _row_buffers(out_w)
        sums = np.empty((4, out_w))
        total = np.zeros((9, out_w))
        for slot in range(starts[image], starts[image + 1]):
            n = order[slot]
            for oh in range(out_h):
                forward_row = n * on + oh * oh_stride
                if sample:   # a literal in each call, so the pixel loop has no branch on it
                    _add_matrix_row(total, sums, image_grad, row_g, scatter, mats[n], oh, image * sn, src, sc, sh, sw,
                                    channels, in_h, in_w, g, n * gn, gc, gh, gw, coords, mode, border_val,
                                    offsets, weights, points, True, forward, (forward_row, oc, ow_stride))
                else:
                    _add_matrix_row(total, sums, image_grad, row_g, scatter, mats[n], oh, image * sn, src, sc, sh, sw,
                                    channels, in_h, in_w, g, n * gn, gc, gh, gw, coords, mode, border_val,
                                    offsets, weights, points, False, forward, (forward_row, oc, ow_stride))
            _store_matrix_gradient(out, n, total)
        if scatter:
            _store_image(grad, image * sn, image_grad, channels, sc, sw)


@ParallelLoop
def _tangent_mat_loop(source, mats, images, coords, tangents, mode, border_val, target):
    """out = Σ_j v_j·(∂out/∂xs·∂xs/∂m_j + ∂out/∂ys·∂ys/∂m_j) per pixel and channel, skipping
    the non-finite terms as BackwardMat does (it is that loop's transpose); 0 where the
    coordinates are not finite. Parallel over blocks of output rows."""
    src, (sn, sc, sh, sw), channels, in_h, in_w = source
    out, (on, oc, oh_stride, ow_stride), _, out_h, out_w = target
    rows = mats.shape[0] * out_h
    for block in prange((rows + ROWS_PER_BLOCK - 1) // ROWS_PER_BLOCK):
        offsets, weights, points = _row_buffers(out_w)
        for row in range(*_block_rows(block, rows)):
            n, oh = row // out_h, row % out_h
            v = tangents[n]
            _row_taps(mats[n], oh, coords, in_h, in_w, mode, images[n] * sn, sh, sw,
                      offsets, weights, points)
            fy = np.float64(coords[oh])
            for ow in range(out_w):
                finite = _finite(weights, ow)
                fx = np.float64(coords[ow])
                d_xs, d_ys = _coordinate_partials(fx, fy, points[0, ow], points[1, ow], points[2, ow])
                ax, ay = _fractions(points, ow)
                pixel = n * on + oh * oh_stride + ow * ow_stride
                for c in range(channels):
                    total = 0.0
                    if finite:
                        d_x, d_y = _slopes(src, c * sc, offsets, ow, ax, ay, border_val, True)
                        for j in range(9):
                            weight = np.float64(v[j])
                            term = weight * d_x * d_xs[j] + weight * d_y * d_ys[j]
                            if math.isfinite(term):
                                total += term
                    out[np.uint64(pixel + c * oc)] = total


# -- the ops -----------------------------------------------------------------------------------


def _image(fmt: str, array: np.ndarray) -> tuple:
    """(flat C-order buffer, (n, c, h, w) element strides, C, H, W) of a 4-D image in `fmt`."""
    if fmt == "NCHW":
        _, c, h, w = array.shape
        strides = (c * h * w, h * w, w, 1)
    else:
        _, h, w, c = array.shape
        strides = (h * w * c, 1, w * c, c)
    return np.ascontiguousarray(array).reshape(-1), strides, c, h, w


def _rows(mat: np.ndarray) -> np.ndarray:
    """(N, 3, 3) matrices as (N, 9) rows."""
    return np.ascontiguousarray(mat).reshape(-1, 9)


def _homogeneous(mat: np.ndarray) -> np.ndarray:
    """(N, 2, 3) affine matrices as (N, 9) rows of 3×3 matrices ending [0, 0, 1]."""
    rows = np.zeros((mat.shape[0], 9), mat.dtype)
    rows[:, :6] = mat.reshape(-1, 6)
    rows[:, 8] = 1
    return rows


def _coords(image: tuple, dtype: np.dtype) -> np.ndarray:
    """0, 1, 2, ... over the output pixels' rows and columns, in the matrix dtype
    (coords[1] doubles as the typed 1 of the second tap)."""
    return np.arange(max(image[3], image[4], 2), dtype=dtype)


def _images(op, mat_idx: np.ndarray | None, n: int, n_src: int) -> np.ndarray:
    """Source image of each matrix; mat_idx values are checked here, before any loop."""
    if mat_idx is None:
        return np.arange(n, dtype=np.int64)
    images = np.asarray(mat_idx, np.int64)
    bad = (images < 0) | (images >= n_src)
    if bad.any():
        raise index_error(op, int(images[bad][0]), 0, n_src, what="mat_idx")
    return images


def _forward(op, src: np.ndarray, rows: np.ndarray, mat_idx: np.ndarray | None,
             out: np.ndarray) -> None:
    images = _images(op, mat_idx, rows.shape[0], src.shape[0])
    target = _image(op.format, out)
    _forward_loop(out.size, _image(op.format, src), rows, images, _coords(target, rows.dtype), target,
                  _MODE_CODES[op.border_mode], float(op.border_val))


@library_kernel.register
def _warp_perspective(op: WarpPerspective) -> LibraryKernel:
    def warp_perspective(src, mat, mat_idx=None, *, out):
        _forward(op, src, _rows(mat), mat_idx, out)

    return warp_perspective


@library_kernel.register
def _warp_affine(op: WarpAffine) -> LibraryKernel:
    def warp_affine(src, mat, *, out):
        _forward(op, src, _homogeneous(mat), None, out)

    return warp_affine


def _grouped_by_image(images: np.ndarray, n_src: int) -> tuple[np.ndarray, np.ndarray]:
    """(order, starts): the matrices grouped by source image, image i's in
    order[starts[i]:starts[i + 1]]."""
    order = np.argsort(images, kind="stable")
    return order, np.searchsorted(images[order], np.arange(n_src + 1))


@library_kernel.register
def _warp_backward_data(op: WarpPerspectiveBackwardData) -> LibraryKernel:
    def warp_backward_data(*inputs, out):
        mat, mat_idx, g = split_backward_inputs(inputs, with_src=False)
        images = _images(op, mat_idx, mat.shape[0], out.shape[0])
        order, starts = _grouped_by_image(images, out.shape[0])
        upstream = _image(op.format, g)
        _backward_data_loop(g.size, _image(op.format, out), _rows(mat), order, starts,
                            _coords(upstream, mat.dtype), upstream, _MODE_CODES[op.border_mode])

    return warp_backward_data


@library_kernel.register
def _warp_backward_mat(op: WarpPerspectiveBackwardMat) -> LibraryKernel:
    def warp_backward_mat(*inputs, out):
        src, mat, mat_idx, g = split_backward_inputs(inputs, with_src=True)
        images = _images(op, mat_idx, mat.shape[0], src.shape[0])
        upstream = _image(op.format, g)
        _backward_mat_loop(g.size, _image(op.format, src), _rows(mat), images, _coords(upstream, mat.dtype),
                           upstream, _MODE_CODES[op.border_mode], float(op.border_val),
                           out.reshape(-1, 9))

    return warp_backward_mat


@library_kernel.register
def _warp_tangent_mat(op: WarpPerspectiveTangentMat) -> LibraryKernel:
    def warp_tangent_mat(*inputs, out):
        src, mat, mat_idx, v = split_backward_inputs(inputs, with_src=True)
        images = _images(op, mat_idx, mat.shape[0], src.shape[0])
        target = _image(op.format, out)
        _tangent_mat_loop(out.size, _image(op.format, src), _rows(mat), images,
                          _coords(target, mat.dtype), _rows(v), _MODE_CODES[op.border_mode],
                          float(op.border_val), target)

    return warp_tangent_mat


def _joint_warp(op: SiblingCalls) -> LibraryKernel | None:
    """The calls of one warp's taps in one pass (`_gradients_loop`): BackwardMat, with
    BackwardData, the forward warp or both; out = one array per op, in op order. None (each
    op's own kernel in turn) unless every call reads the same image and upstream gradient as
    BackwardMat: the sibling key (`_WarpChecks.taps_key`) leaves those open."""
    at = {type(o): k for k, o in enumerate(op.ops)}
    mat_at = at[WarpPerspectiveBackwardMat]
    data_at, forward_at = at.get(WarpPerspectiveBackwardData), at.get(WarpPerspective)
    src_arg, *_, g_arg = op.arguments[mat_at]
    if data_at is not None and op.arguments[data_at][-1] != g_arg:
        return None
    if forward_at is not None and op.arguments[forward_at][0] != src_arg:
        return None
    mat_op = op.ops[mat_at]

    def warp_joint(*inputs, out):
        src, mat, mat_idx, g = split_backward_inputs(op.part(mat_at, inputs), with_src=True)
        images = _images(mat_op, mat_idx, mat.shape[0], src.shape[0])
        upstream = _image(mat_op.format, g)
        d_src = out[data_at] if data_at is not None else src[:0]
        target = _image(mat_op.format, out[forward_at] if forward_at is not None else g[:0])
        _gradients_loop(g.size, _image(mat_op.format, src), _image(mat_op.format, d_src), _rows(mat),
                        *_grouped_by_image(images, src.shape[0]), _coords(upstream, mat.dtype), upstream,
                        _MODE_CODES[mat_op.border_mode], float(mat_op.border_val),
                        out[mat_at].reshape(-1, 9), target, data_at is not None, forward_at is not None)

    return warp_joint


joint_kernel(WarpPerspectiveBackwardData, WarpPerspectiveBackwardMat)(_joint_warp)
joint_kernel(WarpPerspective, WarpPerspectiveBackwardMat)(_joint_warp)
joint_kernel(WarpPerspective, WarpPerspectiveBackwardData, WarpPerspectiveBackwardMat)(_joint_warp)
