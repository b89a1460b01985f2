"""Winograd F(2×2, 3×3) convolutions on the CPU: the forward and the filter gradient of 3×3
convolutions at stride 1 (docs/op-reference.md §13; Lavin & Gray, "Fast Algorithms for
Convolutional Neural Networks", 2016).

Why: im2col + GEMM multiplies 9 filter taps into every output pixel; Winograd's
minimal filtering computes each 2×2 tile of outputs from a 4×4 patch of inputs with
16 products per (input, output) channel pair instead of 36, so the GEMMs do 2.25×
fewer FLOPs, and the transformed images are 16/4 = 4× the input where im2col's
columns are 9×. With B, G and A the F(2×2, 3×3) matrices (`_G` below; B and A are
written out in the loops, all ±1 and 0),

    y_tile[o] = Aᵀ [ Σ_c (G g[o, c] Gᵀ) ⊙ (Bᵀ d_tile[c] B) ] A

which is 16 independent GEMMs, one per position ξ of the 4×4 transform domain:
M[ξ] (O × T) = U[ξ] (O × C) · V[ξ] (C × T), over the T tiles of a chunk of images.
The filter gradient is the adjoint of the same form,

    dg[o, c] = Gᵀ [ Σ_tiles (Bᵀ d_tile[c] B) ⊙ (A dy_tile[o] Aᵀ) ] G

16 GEMMs dU[ξ] (O × C) = dM[ξ] (O × T) · V[ξ]ᵀ, summed over the chunks. The data
gradient at stride 1 is a convolution itself (library_conv), so it takes the forward.

A tile's patch starts `padding` pixels before its outputs and may reach past the
image, where it reads zeros: each of its four rows is copied into a zeroed, padded
line and split into even and odd columns, so every transform loop reads and writes
contiguous slices (LLVM vectorises them). Output tiles past an odd-sized output are
computed and not stored. The transforms are exact in the dtype but for rounding
(coefficients ±1, and ½ in G, applied to the small filter in float64).

The chunking and threading are library_conv's: contiguous spans of images, a few per
thread, BLAS single-threaded, each thread with buffers of its own sized near
`CHUNK_BYTES`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ...ops.conv import Geometry
from .library import in_spans, thread_spans

CHUNK_BYTES = 4 << 20
MIN_CHANNELS = 16     # below this the 16 GEMMs' inner dimension is too small to pay
_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])


def applies(g: Geometry) -> bool:
    """Whether a convolution of geometry `g` is one F(2×2, 3×3) computes (and faster)."""
    return (g.kernel == (3, 3) and g.stride == (1, 1) and g.dilation == (1, 1) and g.groups == 1
            and min(g.c, g.o) >= MIN_CHANNELS)


@njit(inline="always", cache=True, error_model="numpy")
def _split_plane(plane, quarters, pad_h, pad_w, line):
    """quarters[2·(row parity) + column parity][i·line + k] = the zero-padded plane's pixel
    (2i + row parity, 2k + column parity): the plane split into its four interleaved
    quarters, rows of `line` elements. Returns 0, or NaN when a pixel it copies is not
    finite.

    Each image row is read as pairs of adjacent pixels (2j, 2j + 1), which land at entry
    j + ⌊(s + pad_w)/2⌋ of quarter column parity (s + pad_w) mod 2: one loop with
    contiguous loads, which LLVM vectorises (loads and shuffles), and a check that is an
    integer OR rather than a float sum, which would have to keep its order. Column pairs
    past the quarters' `line` entries, and an odd width's last pixel, take the scalar
    tail. Taking each parity in its own loop, with stride-2 loads, took twice as long."""
    height, width = plane.shape
    rows = quarters.shape[1] // line
    quarters[:, :] = 0
    bad = False
    first, second = pad_w % 2, (pad_w + 1) % 2        # the quarters of pixels 2j and 2j + 1
    shift_first, shift_second = pad_w // 2, (pad_w + 1) // 2
    pairs = max(0, min(width // 2, line - shift_second))
    for ih in range(max(0, -pad_h), min(height, 2 * rows - pad_h)):
        r = ih + pad_h
        start = (r // 2) * line
        source = plane[ih]
        into_first = quarters[2 * (r % 2) + first, start + shift_first:]
        into_second = quarters[2 * (r % 2) + second, start + shift_second:]
        for j in range(pairs):
            p, q = source[2 * j], source[2 * j + 1]
            into_first[j] = p
            into_second[j] = q
            bad |= (p - p != 0) | (q - q != 0)
        for iw in range(2 * pairs, width):
            column = iw + pad_w
            if column // 2 < line:
                p = source[iw]
                quarters[2 * (r % 2) + column % 2, start + column // 2] = p
                bad |= p - p != 0
    return np.nan if bad else 0.0


@njit(cache=True, nogil=True, error_model="numpy")
def _input_tiles(x, v, first, pad_h, pad_w, tiles_h, line, quarters, rows):
    """v[4a + b, c, t] = (Bᵀ d B)[a, b] for the 4×4 patch d of tile t of channel c, over the
    images x[first:first + count]; zeros outside the image. Returns 0, or NaN when a pixel
    is not finite.

    Tile t = (image·tiles_h + i)·line + j: each row of tiles has `line` = tiles_w + 1
    entries, the last a spare whose value is never used, so that every loop below runs
    over one flat, unit-stride range (LLVM vectorises each, one output per loop: more
    would need more runtime alias checks than it makes), its indices the loop counter
    plus a constant (an index that might be negative would be wrapped, which stops the
    vectoriser). Tile (i, j)'s patch rows
    2i .. 2i + 3 are quarter rows i and i + 1 (entry f and f + line), its columns
    2j .. 2j + 3 entries f and f + 1 of the even and odd quarters."""
    count = v.shape[2] // (tiles_h * line)
    n = tiles_h * line
    check = 0.0
    for b in range(count):
        for c in range(x.shape[1]):
            check += _split_plane(x[first + b, c], quarters, pad_h, pad_w, line)
            for q in range(2):  # Bᵀ d down the rows: d0 - d2, d1 + d2, d2 - d1, d1 - d3
                d0, d1 = quarters[q], quarters[2 + q]
                d2, d3 = quarters[q, line:], quarters[2 + q, line:]  # slices: no index wraps
                r0, r1, r2, r3 = rows[q], rows[2 + q], rows[4 + q], rows[6 + q]
                for f in range(n + 1):
                    r0[f] = d0[f] - d2[f]
                for f in range(n + 1):
                    r1[f] = d1[f] + d2[f]
                for f in range(n + 1):
                    r2[f] = d2[f] - d1[f]
                for f in range(n + 1):
                    r3[f] = d1[f] - d3[f]
            base = b * n
            for a in range(4):  # · B along the columns e0, o0, e1, o1 = e[f], o[f], e[f+1], o[f+1]
                e, o = rows[2 * a], rows[2 * a + 1]
                v0 = v[4 * a, c, base:base + n]
                for f in range(n):
                    v0[f] = e[f] - e[f + 1]
                v1 = v[4 * a + 1, c, base:base + n]
                for f in range(n):
                    v1[f] = o[f] + e[f + 1]
                v2 = v[4 * a + 2, c, base:base + n]
                for f in range(n):
                    v2[f] = e[f + 1] - o[f]
                v3 = v[4 * a + 3, c, base:base + n]
                for f in range(n):
                    v3[f] = o[f] - o[f + 1]
    return check


@njit(cache=True, nogil=True, error_model="numpy")
def _output_tiles(m, y, first, tiles_h, line, rows, quarters):
    """y[first + image, o, 2i + r, 2j + s] = (Aᵀ m A)[r, s] for each tile t (numbered as in
    `_input_tiles`), m[4a + b, o, t]; the tiles' rows and columns past the output, and the
    spare tiles, are not stored."""
    n = tiles_h * line
    count = m.shape[2] // n
    outputs, out_h, out_w = y.shape[1], y.shape[2], y.shape[3]
    for b in range(count):
        base = b * n
        for o in range(outputs):
            for col in range(4):  # Aᵀ m down the rows: m0 + m1 + m2, m1 - m2 - m3
                m0, m1 = m[col, o, base:base + n], m[4 + col, o, base:base + n]
                m2, m3 = m[8 + col, o, base:base + n], m[12 + col, o, base:base + n]
                top, bottom = rows[col], rows[4 + col]
                for f in range(n):
                    top[f] = m0[f] + m1[f] + m2[f]
                for f in range(n):
                    bottom[f] = m1[f] - m2[f] - m3[f]
            for r in range(2):  # · A along the columns, into the output's four quarters
                t0, t1, t2, t3 = rows[4 * r], rows[4 * r + 1], rows[4 * r + 2], rows[4 * r + 3]
                even, odd = quarters[2 * r], quarters[2 * r + 1]
                for f in range(n):
                    even[f] = t0[f] + t1[f] + t2[f]
                for f in range(n):
                    odd[f] = t1[f] - t2[f] - t3[f]
            plane = y[first + b, o]
            for oh in range(out_h):
                dest = plane[oh]
                even, odd = quarters[2 * (oh % 2), (oh // 2) * line:], quarters[2 * (oh % 2) + 1, (oh // 2) * line:]
                for j in range(out_w // 2):
                    dest[2 * j] = even[j]
                    dest[2 * j + 1] = odd[j]
                if out_w % 2:
                    dest[out_w - 1] = even[out_w // 2]


@njit(cache=True, nogil=True, error_model="numpy")
def _gradient_tiles(dy, dm, first, tiles_h, line, quarters):
    """dm[4a + b, o, t] = (A e Aᵀ)[a, b] for the 2×2 tile e of dy[first + image, o] (zeros
    past the output and in the spare tiles): the adjoint of `_output_tiles`. Returns 0, or
    NaN when an element of dy is not finite."""
    n = tiles_h * line
    count = dm.shape[2] // n
    check = 0.0
    for b in range(count):
        base = b * n
        for o in range(dy.shape[1]):
            check += _split_plane(dy[first + b, o], quarters, 0, 0, line)
            p, q, r, s = quarters[0], quarters[1], quarters[2], quarters[3]  # e00 e01 e10 e11
            # e Aᵀ along the columns: (e0, e0 + e1, e0 - e1, -e1) per row; A down the rows:
            # (top, top + bottom, top - bottom, -bottom)
            for col in range(4):
                d0, d1 = dm[col, o, base:base + n], dm[4 + col, o, base:base + n]
                d2, d3 = dm[8 + col, o, base:base + n], dm[12 + col, o, base:base + n]
                if col == 0:
                    for f in range(n):
                        d0[f] = p[f]
                    for f in range(n):
                        d1[f] = p[f] + r[f]
                    for f in range(n):
                        d2[f] = p[f] - r[f]
                    for f in range(n):
                        d3[f] = -r[f]
                elif col == 1:
                    for f in range(n):
                        d0[f] = p[f] + q[f]
                    for f in range(n):
                        d1[f] = (p[f] + q[f]) + (r[f] + s[f])
                    for f in range(n):
                        d2[f] = (p[f] + q[f]) - (r[f] + s[f])
                    for f in range(n):
                        d3[f] = -(r[f] + s[f])
                elif col == 2:
                    for f in range(n):
                        d0[f] = p[f] - q[f]
                    for f in range(n):
                        d1[f] = (p[f] - q[f]) + (r[f] - s[f])
                    for f in range(n):
                        d2[f] = (p[f] - q[f]) - (r[f] - s[f])
                    for f in range(n):
                        d3[f] = -(r[f] - s[f])
                else:
                    for f in range(n):
                        d0[f] = -q[f]
                    for f in range(n):
                        d1[f] = -q[f] - s[f]
                    for f in range(n):
                        d2[f] = s[f] - q[f]
                    for f in range(n):
                        d3[f] = s[f]
    return check


class Winograd:
    """One convolution's tiling, its spans of images (a few per thread) and each thread's
    reused buffers: the transformed images V, the products M (or the transformed gradient
    dM), a plane's quarters and the transforms' rows.

    `forward` and `backward_filter` return False, their output unfinished, when an input
    holds a value that is not finite: the transforms' sums would turn an inf into the NaN
    of inf − inf where the direct sum keeps it, so the caller then takes im2col."""

    def __init__(self, g: Geometry, dtype: np.dtype):
        self.g, self.dtype = g, dtype
        self.tiles_h = -(-g.out[0] // 2)
        self.line = -(-g.out[1] // 2) + 1      # tiles per row, one of them spare
        self.tiles = self.tiles_h * self.line  # per image
        self.spans, self.threads = thread_spans(g.n, g.n * 16 * g.c * self.tiles)
        per_image = 16 * (g.c + g.o) * self.tiles * dtype.itemsize
        self.chunk = max(1, min(-(-g.n // len(self.spans)), CHUNK_BYTES // per_image))
        self.buffers = [self._buffers() for _ in range(self.threads)]

    def _buffers(self) -> tuple:
        return (np.empty(16 * self.g.c * self.chunk * self.tiles, self.dtype),
                np.empty(16 * self.g.o * self.chunk * self.tiles, self.dtype),
                np.empty((4, self.tiles + self.line + 1), self.dtype),
                np.empty((8, self.tiles + 1), self.dtype))

    def _chunks(self, part: int, first: int, stop: int):
        """(first image, V, M or dM, quarters, rows) for each chunk of the span [first, stop)."""
        v, m, quarters, rows = self.buffers[part]
        for start in range(first, stop, self.chunk):
            size = min(self.chunk, stop - start) * self.tiles
            yield (start, v[:16 * self.g.c * size].reshape(16, self.g.c, size),
                   m[:16 * self.g.o * size].reshape(16, self.g.o, size), quarters, rows)

    def _transform_input(self, x, start, v, quarters, rows) -> bool:
        """V of the chunk from `start`; whether its images are finite."""
        return _input_tiles(x, v, start, *self.g.padding, self.tiles_h, self.line, quarters, rows) == 0

    def forward(self, x: np.ndarray, w: np.ndarray, out: np.ndarray) -> bool:
        """out = the convolution of x and w, or False (x or w not finite)."""
        u = np.moveaxis(_G @ w @ _G.T, (2, 3), (0, 1)).reshape(16, self.g.o, self.g.c).astype(self.dtype)
        if not np.isfinite(u).all():
            return False

        def span(part, first, stop):
            for start, v, m, quarters, rows in self._chunks(part, first, stop):
                if not self._transform_input(x, start, v, quarters, rows):
                    return False
                np.matmul(u, v, out=m)
                _output_tiles(m, out, start, self.tiles_h, self.line, rows, quarters)
            return True

        return all(in_spans(span, self.spans, self.threads))

    def backward_filter(self, x: np.ndarray, dy: np.ndarray, out: np.ndarray) -> bool:
        """out = the filter gradient of the convolution of x, or False (x or dy not finite)."""
        def span(part, first, stop):
            """This span's Σ over tiles of dM · Vᵀ, (16, O, C), or None."""
            total = np.zeros((16, self.g.o, self.g.c), self.dtype)  # a span may be empty
            for start, v, dm, quarters, rows in self._chunks(part, first, stop):
                finite = self._transform_input(x, start, v, quarters, rows)
                if not (finite and _gradient_tiles(dy, dm, start, self.tiles_h, self.line, quarters) == 0):
                    return None
                total = total + np.matmul(dm, np.swapaxes(v, 1, 2))
            return total

        sums = in_spans(span, self.spans, self.threads)
        if any(part is None for part in sums):
            return False
        du = np.sum(sums, axis=0).reshape(4, 4, self.g.o, self.g.c)
        out[...] = _G.T @ np.moveaxis(du, (0, 1), (2, 3)) @ _G
        return True
