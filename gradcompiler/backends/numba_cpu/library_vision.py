"""Bilinear image warps: WarpPerspective, WarpAffine, the two backward ops of the
perspective warp and its tangent along the matrix (op-reference §9), for NCHW and NHWC
and all five border modes.

One sampling model serves all five (§9.2, `_sample`): the source point of
each output pixel is computed in the matrix's dtype with the reference's
operation order, so both pick the same taps; the weights and sums are
float64. Images are read and written as flat C-order buffers with explicit
(n, c, h, w) element strides, so both layouts share one compiled loop per
dtype, and the border mode is a run-time integer. `_border` is inlined
into `_sample`, which stays a call: inlining both saves another ~20% of
run time but triples the compile time (measured: 4.1 / 3.3 / 2.7 ms for the
(32,3,64,64) forward with neither / `_border` / both inlined, 5 / 7 / 15 s
to compile the three loops).

* Forward: parallel over output rows.
* BackwardData (scatter-add into the source gradient): parallel over
  *source* images; each owns its image and walks the matrices that read
  it (all of them with mat_idx, else one), so no two threads ever write
  the same pixel and sums are deterministic.
* BackwardMat: parallel over matrices, float64 sums of the §9.5 terms,
  skipping every non-finite term as MegEngine's kernel does.
* TangentMat (BackwardMat's transpose, for forward mode): parallel over
  output rows; each pixel sums the same terms over the nine matrix entries
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

from ...ops.vision import (
    WarpAffine,
    WarpPerspective,
    WarpPerspectiveBackwardData,
    WarpPerspectiveBackwardMat,
    WarpPerspectiveTangentMat,
    split_backward_inputs,
)
from .library import LibraryKernel, ParallelLoop, index_error, library_kernel

_MODE_CODES = {"replicate": 0, "reflect": 1, "reflect_101": 2, "wrap": 3, "constant": 4}
_REPLICATE, _REFLECT, _REFLECT_101, _WRAP, _CONSTANT = range(5)


# -- the sampling model ------------------------------------------------------------------------


@njit(inline="always", cache=True, error_model="numpy")
def _border(p, length, mode):
    """(index, valid) of the integer-valued float tap `p` on an axis of `length` (§9.2 table)."""
    if mode == _REPLICATE or mode == _CONSTANT:
        valid = mode == _REPLICATE or (p >= 0 and p < length)
        clamped = min(max(p, 0), length - 1)
        return np.int64(clamped), valid
    if length == 1:
        return np.int64(0), True
    if mode == _WRAP:
        return np.int64(np.float64(p) % length), True   # exact: p is an integral float
    period = 2 * length if mode == _REFLECT else 2 * length - 2
    q = np.int64(np.float64(p) % period)
    if q < length:
        return q, True
    return (period - 1 - q if mode == _REFLECT else period - q), True


@njit(cache=True, error_model="numpy")
def _sample(m, fx, fy, one, in_h, in_w, mode):
    """Where output pixel (fy, fx) samples under the matrix `m` (9 entries).

    Coordinates, floors and the +1 of the second tap are computed in the
    matrix's dtype (`one` is 1 in that dtype), in the reference's order, so
    both pick the same taps even for huge coordinates. Returns
    (finite, xs, ys, den, ax, ay, r0, r1, c0, c1, ok00, ok01, ok10, ok11):
    border-mapped tap rows and columns, and whether each tap reads the image
    (False: it reads border_val, or the coordinates are not finite).
    """
    den = m[6] * fx + m[7] * fy + m[8]
    xs = (m[0] * fx + m[1] * fy + m[2]) / den
    ys = (m[3] * fx + m[4] * fy + m[5]) / den
    finite = math.isfinite(xs) and math.isfinite(ys)
    xs = xs if finite else fx - fx
    ys = ys if finite else fx - fx
    x0, y0 = np.floor(xs), np.floor(ys)
    c0, in_c0 = _border(x0, in_w, mode)
    c1, in_c1 = _border(x0 + one, in_w, mode)
    r0, in_r0 = _border(y0, in_h, mode)
    r1, in_r1 = _border(y0 + one, in_h, mode)
    ok00, ok01 = in_r0 and in_c0 and finite, in_r0 and in_c1 and finite
    ok10, ok11 = in_r1 and in_c0 and finite, in_r1 and in_c1 and finite
    return (finite, np.float64(xs), np.float64(ys), np.float64(den), np.float64(xs - x0),
            np.float64(ys - y0), r0, r1, c0, c1, ok00, ok01, ok10, ok11)


# -- loops (flat buffers; strides are (n, c, h, w) element strides) ----------------------------
# Buffer offsets are cast to np.uint64 where they index: they are never negative, and a
# signed index costs a wraparound select on every access.


@ParallelLoop
def _forward_loop(source, mats, images, coords, target, mode, border_val):
    src, (sn, sc, sh, sw), channels, in_h, in_w = source
    out, (on, oc, oh_stride, ow_stride), _, out_h, out_w = target
    fill = border_val if mode == _CONSTANT else np.nan
    for row in prange(mats.shape[0] * out_h):
        n = np.int64(row) // out_h         # (the prange index is unsigned: keep integer division)
        oh = np.int64(row) - n * out_h
        m = mats[n]
        base = images[n] * sn
        for ow in range(out_w):
            finite, _, _, _, ax, ay, r0, r1, c0, c1, ok00, ok01, ok10, ok11 = _sample(
                m, coords[ow], coords[oh], coords[1], in_h, in_w, mode)
            w00, w01 = (1 - ax) * (1 - ay), ax * (1 - ay)
            w10, w11 = (1 - ax) * ay, ax * ay
            p00, p01 = base + r0 * sh + c0 * sw, base + r0 * sh + c1 * sw
            p10, p11 = base + r1 * sh + c0 * sw, base + r1 * sh + c1 * sw
            target = n * on + oh * oh_stride + ow * ow_stride
            for c in range(channels):
                if not finite:
                    out[np.uint64(target + c * oc)] = fill
                    continue
                k = c * sc
                value = (w00 * (src[np.uint64(p00 + k)] if ok00 else border_val)
                         + w01 * (src[np.uint64(p01 + k)] if ok01 else border_val)
                         + w10 * (src[np.uint64(p10 + k)] if ok10 else border_val)
                         + w11 * (src[np.uint64(p11 + k)] if ok11 else border_val))
                if mode == _CONSTANT and not math.isfinite(value):
                    value = border_val
                out[np.uint64(target + c * oc)] = value


@ParallelLoop
def _backward_data_loop(gradient, mats, order, starts, coords, upstream, mode):
    """gradient[image] += Σ over the matrices reading `image` (order[starts[i]:starts[i+1]])."""
    grad, (sn, sc, sh, sw), channels, in_h, in_w = gradient
    g, (gn, gc, gh, gw), _, out_h, out_w = upstream
    for image in prange(starts.size - 1):
        base = image * sn
        for slot in range(starts[image], starts[image + 1]):
            n = order[slot]
            m = mats[n]
            for oh in range(out_h):
                for ow in range(out_w):
                    finite, _, _, _, ax, ay, r0, r1, c0, c1, ok00, ok01, ok10, ok11 = _sample(
                        m, coords[ow], coords[oh], coords[1], in_h, in_w, mode)
                    if not finite:
                        continue
                    w00, w01 = (1 - ax) * (1 - ay), ax * (1 - ay)
                    w10, w11 = (1 - ax) * ay, ax * ay
                    source = n * gn + oh * gh + ow * gw
                    for c in range(channels):
                        value = np.float64(g[np.uint64(source + c * gc)])
                        k = base + c * sc
                        if ok00:
                            grad[np.uint64(k + r0 * sh + c0 * sw)] += w00 * value
                        if ok01:
                            grad[np.uint64(k + r0 * sh + c1 * sw)] += w01 * value
                        if ok10:
                            grad[np.uint64(k + r1 * sh + c0 * sw)] += w10 * value
                        if ok11:
                            grad[np.uint64(k + r1 * sh + c1 * sw)] += w11 * value


@njit(inline="always", cache=True, error_model="numpy")
def _coordinate_partials(fx, fy, xs, ys, den):
    """(∂xs/∂m, ∂ys/∂m): the nine partials of the source point wrt the matrix (§9.5)."""
    d_xs = (fx / den, fy / den, 1 / den, 0.0, 0.0, 0.0, -fx * xs / den, -fy * xs / den, -xs / den)
    d_ys = (0.0, 0.0, 0.0, fx / den, fy / den, 1 / den, -fx * ys / den, -fy * ys / den, -ys / den)
    return d_xs, d_ys


@njit(inline="always", cache=True, error_model="numpy")
def _slopes(src, k, p00, p01, p10, p11, ok00, ok01, ok10, ok11, border_val, ax, ay):
    """(∂out/∂xs, ∂out/∂ys) of one channel (offset `k`) at a pixel with these taps, float64."""
    v00 = np.float64(src[np.uint64(p00 + k)]) if ok00 else border_val
    v01 = np.float64(src[np.uint64(p01 + k)]) if ok01 else border_val
    v10 = np.float64(src[np.uint64(p10 + k)]) if ok10 else border_val
    v11 = np.float64(src[np.uint64(p11 + k)]) if ok11 else border_val
    return (1 - ay) * (v01 - v00) + ay * (v11 - v10), (1 - ax) * (v10 - v00) + ax * (v11 - v01)


@njit(cache=True, error_model="numpy")
def _add_finite_terms(total, g_dx, g_dy, fx, fy, xs, ys, den):
    """total[j] += g_dx·∂xs/∂m_j + g_dy·∂ys/∂m_j for each j whose term is finite."""
    d_xs, d_ys = _coordinate_partials(fx, fy, xs, ys, den)
    for j in range(9):
        term = g_dx * d_xs[j] + g_dy * d_ys[j]
        if math.isfinite(term):
            total[j] += term


@ParallelLoop
def _backward_mat_loop(source, mats, images, coords, upstream, mode, border_val, out):
    """out[n] = Σ g·(∂out/∂xs·∂xs/∂m + ∂out/∂ys·∂ys/∂m), skipping non-finite terms.

    Where every term of a pixel is finite (the usual case) its channels are
    summed first and the nine partials applied once; otherwise the pixel
    takes the term-by-term path.
    """
    src, (sn, sc, sh, sw), channels, in_h, in_w = source
    g, (gn, gc, gh, gw), _, out_h, out_w = upstream
    for n in prange(mats.shape[0]):
        m = mats[n]
        base = images[n] * sn
        total = np.zeros(9)
        for oh in range(out_h):
            for ow in range(out_w):
                finite, xs, ys, den, ax, ay, r0, r1, c0, c1, ok00, ok01, ok10, ok11 = _sample(
                    m, coords[ow], coords[oh], coords[1], in_h, in_w, mode)
                if not finite:
                    continue
                fx, fy = np.float64(coords[ow]), np.float64(coords[oh])
                inv = 1 / den
                p00, p01 = base + r0 * sh + c0 * sw, base + r0 * sh + c1 * sw
                p10, p11 = base + r1 * sh + c0 * sw, base + r1 * sh + c1 * sw
                sum_dx = sum_dy = 0.0
                for c in range(channels):
                    d_x, d_y = _slopes(src, c * sc, p00, p01, p10, p11, ok00, ok01, ok10, ok11,
                                       border_val, ax, ay)
                    value = np.float64(g[np.uint64(n * gn + c * gc + oh * gh + ow * gw)])
                    g_dx = value * d_x  # g · ∂out/∂xs
                    g_dy = value * d_y  # g · ∂out/∂ys
                    partials_bound = inv * (fx + fy + 1) * (1 + abs(xs) + abs(ys))
                    if math.isfinite(g_dx + g_dy + partials_bound):   # NaN or inf anywhere
                        sum_dx += g_dx
                        sum_dy += g_dy
                    else:
                        _add_finite_terms(total, g_dx, g_dy, fx, fy, xs, ys, den)
                a, b = sum_dx * inv, sum_dy * inv
                c_ = -(sum_dx * xs + sum_dy * ys) * inv
                total[0] += a * fx
                total[1] += a * fy
                total[2] += a
                total[3] += b * fx
                total[4] += b * fy
                total[5] += b
                total[6] += c_ * fx
                total[7] += c_ * fy
                total[8] += c_
        for j in range(9):
            out[n, j] = total[j]


@ParallelLoop
def _tangent_mat_loop(source, mats, images, coords, tangents, mode, border_val, target):
    """out = Σ_j v_j·(∂out/∂xs·∂xs/∂m_j + ∂out/∂ys·∂ys/∂m_j) per pixel and channel, skipping
    the non-finite terms as BackwardMat does (it is that loop's transpose); 0 where the
    coordinates are not finite. Parallel over output rows."""
    src, (sn, sc, sh, sw), channels, in_h, in_w = source
    out, (on, oc, oh_stride, ow_stride), _, out_h, out_w = target
    for row in prange(mats.shape[0] * out_h):
        n = np.int64(row) // out_h         # (the prange index is unsigned: keep integer division)
        oh = np.int64(row) - n * out_h
        m = mats[n]
        v = tangents[n]
        base = images[n] * sn
        fy = np.float64(coords[oh])
        for ow in range(out_w):
            finite, xs, ys, den, ax, ay, r0, r1, c0, c1, ok00, ok01, ok10, ok11 = _sample(
                m, coords[ow], coords[oh], coords[1], in_h, in_w, mode)
            fx = np.float64(coords[ow])
            d_xs, d_ys = _coordinate_partials(fx, fy, xs, ys, den)
            p00, p01 = base + r0 * sh + c0 * sw, base + r0 * sh + c1 * sw
            p10, p11 = base + r1 * sh + c0 * sw, base + r1 * sh + c1 * sw
            pixel = n * on + oh * oh_stride + ow * ow_stride
            for c in range(channels):
                total = 0.0
                if finite:
                    d_x, d_y = _slopes(src, c * sc, p00, p01, p10, p11, ok00, ok01, ok10, ok11,
                                       border_val, ax, ay)
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


@library_kernel.register
def _warp_backward_data(op: WarpPerspectiveBackwardData) -> LibraryKernel:
    def warp_backward_data(*inputs, out):
        mat, mat_idx, g = split_backward_inputs(inputs, with_src=False)
        images = _images(op, mat_idx, mat.shape[0], out.shape[0])
        order = np.argsort(images, kind="stable")             # matrices grouped by source image
        starts = np.searchsorted(images[order], np.arange(out.shape[0] + 1))
        out.fill(0)
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
