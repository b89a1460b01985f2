"""Image warps on the GPU (op-reference §9): WarpPerspective and WarpAffine
forward, WarpPerspectiveBackwardData (the adjoint, scattered with atomics),
WarpPerspectiveBackwardMat (per-block partial sums, then one pass over
the partials) and its transpose WarpPerspectiveTangentMat (one thread per
output pixel summing the nine matrix terms, as the forward does).

One thread owns one output pixel (n, oh, ow) and loops over the channels,
so the sampling (source point, bilinear weights, four border-mapped taps)
is computed once per pixel, as the reference's `_sample` does once per
pixel for all channels. The arithmetic mirrors the reference step by step
in the input's float type (float32 stays float32: integer coordinates are
cast first), so results agree to rounding. Taps stay floats until the
border map has brought them into range, so coordinates far outside the
image never overflow an integer. An affine matrix is read as its first two
rows with a denominator of 1, the reference's [0, 0, 1] third row.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import cuda, from_dtype

from ...ir import Op, TensorType
from ...ops.vision import (
    BORDER_MODES,
    WarpAffine,
    WarpPerspective,
    WarpPerspectiveBackwardData,
    WarpPerspectiveBackwardMat,
    WarpPerspectiveTangentMat,
    split_backward_inputs,
)
from ...ops.vision import _image_dims as image_dims
from .device import IndexChecker, IndexSpec, LaunchConfig, device_constant, fill, to_device
from .library import Launcher, cuda_library_kernel

REPLICATE, REFLECT, REFLECT_101, WRAP, CONSTANT = (BORDER_MODES.index(m) for m in
                                                   ("replicate", "reflect", "reflect_101", "wrap", "constant"))


@cuda.jit(device=True)
def border_index(p, length, mode):
    """(index, valid) of the integer-valued float tap `p` on an axis of `length` (§9.2's table)."""
    if mode == REPLICATE or mode == CONSTANT:
        i = int(min(max(p, -1.0), float(length)))
        valid = mode == REPLICATE or (i >= 0 and i < length)
        return min(max(i, 0), length - 1), valid
    if length == 1:
        return 0, True
    period = length if mode == WRAP else (2 * length if mode == REFLECT else 2 * length - 2)
    q = math.fmod(p, float(period))  # exact for integer-valued floats
    if q < 0:
        q += period
    i = int(q)
    if mode == WRAP or i < length:
        return i, True
    return (period - 1 - i if mode == REFLECT else period - i), True


@functools.cache
def _kernels(dtype: np.dtype, nhwc: bool, block: int):
    """Forward, BackwardData, BackwardMat (stage one) and TangentMat kernels for images of
    `dtype` in one format."""
    real = from_dtype(dtype)
    exact_integers = real(2.0 ** (np.finfo(dtype).nmant + 1))  # above this every float is an integer

    @cuda.jit(device=True)
    def at(n, c, h, w):
        return (n, h, w, c) if nhwc else (n, c, h, w)

    @cuda.jit(device=True)
    def dims(image):
        """(N, C, H, W) of a 4-D image array in this format."""
        s = image.shape
        return (s[0], s[3], s[1], s[2]) if nhwc else (s[0], s[1], s[2], s[3])

    @cuda.jit(device=True)
    def source_point(mat, n, oh, ow, perspective):
        """(xs, ys, den, bad): where output pixel (oh, ow) samples, in the reference's arithmetic."""
        fw = real(ow)
        fh = real(oh)
        den = mat[n, 2, 0] * fw + mat[n, 2, 1] * fh + mat[n, 2, 2] if perspective else real(1)
        xs = (mat[n, 0, 0] * fw + mat[n, 0, 1] * fh + mat[n, 0, 2]) / den
        ys = (mat[n, 1, 0] * fw + mat[n, 1, 1] * fh + mat[n, 1, 2]) / den
        if math.isfinite(xs) and math.isfinite(ys):
            return xs, ys, den, False
        return real(0), real(0), den, True

    @cuda.jit(device=True)
    def floor(v):
        return v if abs(v) >= exact_integers else real(math.floor(v))

    @cuda.jit(device=True)
    def taps(xs, ys, in_h, in_w, mode):
        """αx, αy and the border-mapped rows (r0, r1), columns (c0, c1) with their validity."""
        x0 = floor(xs)
        y0 = floor(ys)
        c0, c0_ok = border_index(x0, in_w, mode)
        c1, c1_ok = border_index(x0 + real(1), in_w, mode)
        r0, r0_ok = border_index(y0, in_h, mode)
        r1, r1_ok = border_index(y0 + real(1), in_h, mode)
        return xs - x0, ys - y0, r0, r1, c0, c1, r0_ok, r1_ok, c0_ok, c1_ok

    @cuda.jit(device=True)
    def tap_value(src, img, ch, r, c, valid, border_val):
        return src[at(img, ch, r, c)] if valid else border_val

    @cuda.jit(device=True)
    def slopes(src, img, ch, r0, r1, c0, c1, r0_ok, r1_ok, c0_ok, c1_ok, border_val, ax, ay):
        """(∂out/∂xs, ∂out/∂ys) of channel `ch` at a pixel with these taps (§9.5)."""
        one = real(1)
        v00 = tap_value(src, img, ch, r0, c0, r0_ok and c0_ok, border_val)
        v01 = tap_value(src, img, ch, r0, c1, r0_ok and c1_ok, border_val)
        v10 = tap_value(src, img, ch, r1, c0, r1_ok and c0_ok, border_val)
        v11 = tap_value(src, img, ch, r1, c1, r1_ok and c1_ok, border_val)
        d_x = (one - ay) * (v01 - v00) + ay * (v11 - v10)
        return d_x, (one - ax) * (v10 - v00) + ax * (v11 - v01)

    @cuda.jit(device=True)
    def coordinate_partials(d_xs, d_ys, oh, ow, xs, ys, den):
        """∂xs/∂m and ∂ys/∂m (§9.5) into the local arrays, divided as the reference divides."""
        fw = real(ow)
        fh = real(oh)
        one = real(1)
        zero = real(0)
        d_xs[0], d_xs[1], d_xs[2] = fw / den, fh / den, one / den
        d_xs[3], d_xs[4], d_xs[5] = zero / den, zero / den, zero / den
        d_xs[6], d_xs[7], d_xs[8] = (-fw * xs) / den, (-fh * xs) / den, (-xs) / den
        d_ys[0], d_ys[1], d_ys[2] = zero / den, zero / den, zero / den
        d_ys[3], d_ys[4], d_ys[5] = fw / den, fh / den, one / den
        d_ys[6], d_ys[7], d_ys[8] = (-fw * ys) / den, (-fh * ys) / den, (-ys) / den

    @cuda.jit
    def forward(src, mat, image, out, perspective, mode, border_val):
        n_out, channels, out_h, out_w = dims(out)
        _, _, in_h, in_w = dims(src)
        one = real(1)
        for pixel in range(cuda.grid(1), n_out * out_h * out_w, cuda.gridsize(1)):
            n = pixel // (out_h * out_w)
            oh = pixel // out_w % out_h
            ow = pixel % out_w
            xs, ys, den, bad = source_point(mat, n, oh, ow, perspective)
            ax, ay, r0, r1, c0, c1, r0_ok, r1_ok, c0_ok, c1_ok = taps(xs, ys, in_h, in_w, mode)
            img = image[n]
            for ch in range(channels):
                value = ((one - ay) * (one - ax)) * tap_value(src, img, ch, r0, c0, r0_ok and c0_ok, border_val)
                value += ((one - ay) * ax) * tap_value(src, img, ch, r0, c1, r0_ok and c1_ok, border_val)
                value += (ay * (one - ax)) * tap_value(src, img, ch, r1, c0, r1_ok and c0_ok, border_val)
                value += (ay * ax) * tap_value(src, img, ch, r1, c1, r1_ok and c1_ok, border_val)
                if bad:
                    value = border_val if mode == CONSTANT else real(math.nan)
                elif mode == CONSTANT and not math.isfinite(value):
                    value = border_val
                out[at(n, ch, oh, ow)] = value

    @cuda.jit
    def backward_data(mat, image, g, grad, perspective, mode):
        n_out, channels, out_h, out_w = dims(g)
        _, _, in_h, in_w = dims(grad)
        one = real(1)
        for pixel in range(cuda.grid(1), n_out * out_h * out_w, cuda.gridsize(1)):
            n = pixel // (out_h * out_w)
            oh = pixel // out_w % out_h
            ow = pixel % out_w
            xs, ys, den, bad = source_point(mat, n, oh, ow, perspective)
            if bad:
                continue
            ax, ay, r0, r1, c0, c1, r0_ok, r1_ok, c0_ok, c1_ok = taps(xs, ys, in_h, in_w, mode)
            img = image[n]
            for ch in range(channels):
                upstream = g[at(n, ch, oh, ow)]
                if r0_ok and c0_ok:
                    cuda.atomic.add(grad, at(img, ch, r0, c0), ((one - ay) * (one - ax)) * upstream)
                if r0_ok and c1_ok:
                    cuda.atomic.add(grad, at(img, ch, r0, c1), ((one - ay) * ax) * upstream)
                if r1_ok and c0_ok:
                    cuda.atomic.add(grad, at(img, ch, r1, c0), (ay * (one - ax)) * upstream)
                if r1_ok and c1_ok:
                    cuda.atomic.add(grad, at(img, ch, r1, c1), (ay * ax) * upstream)

    @cuda.jit
    def backward_mat_partials(src, mat, image, g, partials, mode, border_val):
        """partials[n, b, k] = Σ over block b's pixels of image n of the §9.5 terms of m_k."""
        terms = cuda.shared.array((9, block), real)
        acc = cuda.local.array(9, real)
        d_xs = cuda.local.array(9, real)
        d_ys = cuda.local.array(9, real)
        t = cuda.threadIdx.x
        n_out, channels, out_h, out_w = dims(g)
        _, _, in_h, in_w = dims(src)
        for n in range(cuda.blockIdx.y, n_out, cuda.gridDim.y):
            for k in range(9):
                acc[k] = 0
            img = image[n]
            for pixel in range(cuda.blockIdx.x * block + t, out_h * out_w, cuda.gridDim.x * block):
                oh = pixel // out_w
                ow = pixel % out_w
                xs, ys, den, bad = source_point(mat, n, oh, ow, True)
                if bad:
                    continue
                ax, ay, r0, r1, c0, c1, r0_ok, r1_ok, c0_ok, c1_ok = taps(xs, ys, in_h, in_w, mode)
                coordinate_partials(d_xs, d_ys, oh, ow, xs, ys, den)
                for ch in range(channels):
                    d_x, d_y = slopes(src, img, ch, r0, r1, c0, c1, r0_ok, r1_ok, c0_ok, c1_ok,
                                      border_val, ax, ay)
                    upstream = g[at(n, ch, oh, ow)]
                    g_dx = upstream * d_x
                    g_dy = upstream * d_y
                    for k in range(9):
                        term = g_dx * d_xs[k] + g_dy * d_ys[k]
                        if math.isfinite(term):
                            acc[k] += term
            for k in range(9):
                terms[k, t] = acc[k]
            cuda.syncthreads()
            step = block // 2
            while step > 0:
                if t < step:
                    for k in range(9):
                        terms[k, t] += terms[k, t + step]
                cuda.syncthreads()
                step //= 2
            if t == 0:
                for k in range(9):
                    partials[n, cuda.blockIdx.x, k] = terms[k, 0]
            cuda.syncthreads()

    @cuda.jit
    def tangent_mat(src, mat, image, v, out, mode, border_val):
        """out = Σ_k v_k·(∂out/∂xs·∂xs/∂m_k + ∂out/∂ys·∂ys/∂m_k), one thread per output pixel,
        with backward_mat_partials' terms and skips (it is that kernel's transpose)."""
        d_xs = cuda.local.array(9, real)
        d_ys = cuda.local.array(9, real)
        n_out, channels, out_h, out_w = dims(out)
        _, _, in_h, in_w = dims(src)
        for pixel in range(cuda.grid(1), n_out * out_h * out_w, cuda.gridsize(1)):
            n = pixel // (out_h * out_w)
            oh = pixel // out_w % out_h
            ow = pixel % out_w
            xs, ys, den, bad = source_point(mat, n, oh, ow, True)
            if bad:
                for ch in range(channels):
                    out[at(n, ch, oh, ow)] = real(0)
                continue
            ax, ay, r0, r1, c0, c1, r0_ok, r1_ok, c0_ok, c1_ok = taps(xs, ys, in_h, in_w, mode)
            coordinate_partials(d_xs, d_ys, oh, ow, xs, ys, den)
            img = image[n]
            for ch in range(channels):
                d_x, d_y = slopes(src, img, ch, r0, r1, c0, c1, r0_ok, r1_ok, c0_ok, c1_ok,
                                  border_val, ax, ay)
                total = real(0)
                for k in range(9):
                    weight = v[n, k // 3, k % 3]
                    term = weight * d_x * d_xs[k] + weight * d_y * d_ys[k]
                    if math.isfinite(term):
                        total += term
                out[at(n, ch, oh, ow)] = total

    return forward, backward_data, backward_mat_partials, tangent_mat


@cuda.jit
def _sum_partials_kernel(partials, out):
    """out[n, k // 3, k % 3] = Σ_b partials[n, b, k]."""
    for task in range(cuda.grid(1), partials.shape[0] * 9, cuda.gridsize(1)):
        n = task // 9
        k = task % 9
        total = partials[n, 0, k]
        for b in range(1, partials.shape[1]):
            total += partials[n, b, k]
        out[n, k // 3, k % 3] = total


class _Warp:
    """Shared launch state: kernels, the source image of every matrix, the border parameters."""

    def __init__(self, op: Op, dtype: np.dtype, n_mat: int, n_src: int, config: LaunchConfig):
        self.config = config
        self.mode, self.border_val = BORDER_MODES.index(op.border_mode), dtype.type(op.border_val)
        self.kernels = _kernels(np.dtype(dtype), op.format == "NHWC", config.reduce_block)
        self.identity = device_constant(np.arange(n_mat))
        self.n_mat = n_mat
        self.check = IndexChecker([IndexSpec(n_src, False, lambda v: f"{op.label}: mat_idx value {v} is outside "
                                                                     f"[0, {n_src}) (src batch {n_src})")],
                                  (n_mat,), config)

    def images(self, mat_idx: Any, stream: Any) -> Any:
        """The source image of each matrix (mat_idx, checked), as an int64 device array."""
        if mat_idx is None:
            return self.identity
        return self.check([mat_idx], stream)[0]

    def pixel_grid(self, pixels: int, stream: Any) -> tuple:
        return self.config.grid(pixels), self.config.block, stream


class _Forward(_Warp):
    def __init__(self, op: WarpPerspective | WarpAffine, src: TensorType, mat: TensorType, config: LaunchConfig):
        super().__init__(op, src.dtype, mat.shape[0], src.shape[0], config)
        self.perspective = isinstance(op, WarpPerspective)
        self.pixels = mat.shape[0] * op.out_shape[0] * op.out_shape[1]

    def __call__(self, src: Any, mat: Any, mat_idx: Any = None, *, out: Any, stream: Any = 0) -> None:
        image = self.images(mat_idx, stream)
        self.kernels[0][self.pixel_grid(self.pixels, stream)](
            to_device(src, stream), to_device(mat, stream), image, out, self.perspective, self.mode,
            self.border_val)


class _BackwardData(_Warp):
    def __init__(self, op: WarpPerspectiveBackwardData, mat: TensorType, g: TensorType, config: LaunchConfig):
        super().__init__(op, g.dtype, mat.shape[0], op.src_shape[0], config)
        n, _, out_h, out_w = image_dims(op.format, g.shape)
        self.pixels = n * out_h * out_w

    def __call__(self, *inputs: Any, out: Any, stream: Any = 0) -> None:
        mat, mat_idx, g = split_backward_inputs(inputs, with_src=False)
        image = self.images(mat_idx, stream)
        fill(out, 0, self.config, stream)
        if self.pixels:
            self.kernels[1][self.pixel_grid(self.pixels, stream)](
                to_device(mat, stream), image, to_device(g, stream), out, True, self.mode)


class _BackwardMat(_Warp):
    def __init__(self, op: WarpPerspectiveBackwardMat, src: TensorType, mat: TensorType, g: TensorType,
                 config: LaunchConfig):
        super().__init__(op, g.dtype, mat.shape[0], src.shape[0], config)
        _, _, out_h, out_w = image_dims(op.format, g.shape)
        per_image = max(1, min(config.max_blocks, math.ceil(out_h * out_w / config.reduce_block)))
        self.grid = (per_image, max(1, min(65535, mat.shape[0])))
        self.partials_shape = (mat.shape[0], per_image, 9)

    def __call__(self, *inputs: Any, out: Any, stream: Any = 0) -> None:
        src, mat, mat_idx, g = split_backward_inputs(inputs, with_src=True)
        image = self.images(mat_idx, stream)
        if not self.n_mat:
            return
        partials = cuda.device_array(self.partials_shape, out.dtype, stream=stream)
        self.kernels[2][self.grid, self.config.reduce_block, stream](
            to_device(src, stream), to_device(mat, stream), image, to_device(g, stream), partials, self.mode,
            self.border_val)
        _sum_partials_kernel[self.config.grid(self.n_mat * 9), self.config.block, stream](partials, out)


class _TangentMat(_Warp):
    def __init__(self, op: WarpPerspectiveTangentMat, src: TensorType, mat: TensorType,
                 config: LaunchConfig):
        super().__init__(op, src.dtype, mat.shape[0], src.shape[0], config)
        self.pixels = mat.shape[0] * op.out_shape[0] * op.out_shape[1]

    def __call__(self, *inputs: Any, out: Any, stream: Any = 0) -> None:
        src, mat, mat_idx, v = split_backward_inputs(inputs, with_src=True)
        image = self.images(mat_idx, stream)
        if self.pixels:
            self.kernels[3][self.pixel_grid(self.pixels, stream)](
                to_device(src, stream), to_device(mat, stream), image, to_device(v, stream), out,
                self.mode, self.border_val)


@cuda_library_kernel.register(WarpPerspective)
@cuda_library_kernel.register(WarpAffine)
def _warp_forward(op: Op, input_types: Sequence[TensorType], config: LaunchConfig) -> Launcher:
    return _Forward(op, input_types[0], input_types[1], config)


@cuda_library_kernel.register
def _warp_backward_data(op: WarpPerspectiveBackwardData, input_types: Sequence[TensorType],
                        config: LaunchConfig) -> Launcher:
    return _BackwardData(op, input_types[0], input_types[-1], config)


@cuda_library_kernel.register
def _warp_backward_mat(op: WarpPerspectiveBackwardMat, input_types: Sequence[TensorType],
                       config: LaunchConfig) -> Launcher:
    return _BackwardMat(op, input_types[0], input_types[1], input_types[-1], config)


@cuda_library_kernel.register
def _warp_tangent_mat(op: WarpPerspectiveTangentMat, input_types: Sequence[TensorType],
                      config: LaunchConfig) -> Launcher:
    return _TangentMat(op, input_types[0], input_types[1], config)
