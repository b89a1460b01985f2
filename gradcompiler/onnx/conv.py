"""Convolution, pooling and batch norm between ONNX and gradcompiler, both directions.

Import: ONNX writes padding as (begin, end) per axis, or as an auto_pad rule, where the
ops take one symmetric amount (and pooling at most half the kernel, as torch does). The
static shapes make every auto_pad rule a number at import time; the symmetric part goes
to the op and the rest is an explicit pad in front of it (zeros for a convolution, -inf
for a max, and for an average that excludes the padding, the mean of a padded mask
divides the mean of the padded input, so the count stays that of the image pixels).
A transposed convolution's padding crops its output, so the asymmetric rest is a slice
after it. Only 2-d (NCHW) convolution and pooling exist, without pooling dilations:
anything else is refused naming the attribute or the rank.

Export: Convolution is Conv and ConvolutionBackwardData is ConvTranspose. The filter
gradient is a convolution too, with the roles of the batch and the channels swapped
(x as (C, N, H, W) images, dy as (O, N, OH, OW) filters, stride and dilation exchanged),
cropped to the kernel. An average pooling's gradient spreads dy / count back over each
window: a ConvTranspose with a kernel of ones. A max pooling's sends dy to each window's
first maximum: MaxPool's Indices output says where (first in row-major order on ties,
as here), and ScatterElements with reduction add puts it there.
"""

from __future__ import annotations

import math

import numpy as np

import gradcompiler as gc

from ..ops.conv import window_extent
from ..ops.pool import divisors
from . import compose

_SAME = ("SAME_UPPER", "SAME_LOWER")


# -- import ------------------------------------------------------------------------------
def _ints(c, name: str, default: list[int]) -> tuple[int, ...]:
    value = c.attr(name, default)
    if len(value) != len(default):
        raise c.refuse(name, value, f"{len(default)} values, one per spatial axis")
    return tuple(int(v) for v in value)


def _require_2d(c, x) -> None:
    if x.ndim != 4:
        raise c.error(f"{x.ndim - 2}-d input {x.shape}; 2-d (N, C, H, W) is supported")


def _pads(c, spatial, extents, strides) -> list[tuple[int, int]]:
    """(begin, end) padding per spatial axis, from pads or from the auto_pad rule."""
    auto = c.attr("auto_pad", "NOTSET")
    rank = len(spatial)
    if auto == "NOTSET":
        pads = _ints(c, "pads", [0] * 2 * rank)
        if min(pads) < 0:
            raise c.refuse("pads", list(pads), "amounts >= 0")
        return list(zip(pads[:rank], pads[rank:]))
    if auto == "VALID":
        return [(0, 0)] * rank
    if auto not in _SAME:
        raise c.refuse("auto_pad", auto, "NOTSET, VALID, SAME_UPPER, SAME_LOWER")
    pads = []
    for n, e, s in zip(spatial, extents, strides):
        total = max((math.ceil(n / s) - 1) * s + e - n, 0)
        small, big = total // 2, total - total // 2
        pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
    return pads


def _pad_explicitly(c, x, extra: list[tuple[int, int]], fill: float):
    """x padded along its spatial axes by `extra` (begin, end) amounts of `fill`."""
    value = gc.constant(np.array(fill, x.dtype))
    for axis, (before, after) in enumerate(extra, start=2):
        x = compose.pad_axis(c, x, axis, before, after, "constant", value)
    return x


def _split(pads, limits) -> tuple[tuple[int, int], list[tuple[int, int]]]:
    """The symmetric padding the op takes (at most `limits` per axis) and the explicit rest."""
    symmetric = tuple(max(min(b, a, limit), 0) for (b, a), limit in zip(pads, limits))
    return symmetric, [(b - m, a - m) for (b, a), m in zip(pads, symmetric)]


def conv(c):
    x, w, bias = c.x(0), c.x(1), c.opt(2)
    _require_2d(c, x)
    strides, dilations = _ints(c, "strides", [1, 1]), _ints(c, "dilations", [1, 1])
    kernel = _ints(c, "kernel_shape", list(w.shape[2:]))
    if kernel != w.shape[2:]:
        raise c.error(f"kernel_shape {list(kernel)} is not the filter's {w.shape[2:]}")
    pads = _pads(c, x.shape[2:], [window_extent(k, d) for k, d in zip(kernel, dilations)],
                 strides)
    padding, extra = _split(pads, (math.inf, math.inf))
    return [gc.conv2d(_pad_explicitly(c, x, extra, 0.0), w, bias, stride=strides,
                      padding=padding, dilation=dilations, groups=int(c.attr("group", 1)))]


def conv_transpose(c):
    x, w, bias = c.x(0), c.x(1), c.opt(2)
    _require_2d(c, x)
    strides, dilations = _ints(c, "strides", [1, 1]), _ints(c, "dilations", [1, 1])
    extra_rows = _ints(c, "output_padding", [0, 0])
    kernel = _ints(c, "kernel_shape", list(w.shape[2:]))
    if kernel != w.shape[2:]:
        raise c.error(f"kernel_shape {list(kernel)} is not the filter's {w.shape[2:]}")
    full = [(n - 1) * s + window_extent(k, d) + p
            for n, s, k, d, p in zip(x.shape[2:], strides, kernel, dilations, extra_rows)]
    auto, target = c.attr("auto_pad", "NOTSET"), c.attr("output_shape")
    if target is not None or auto in _SAME:
        # ONNX's equations: the total padding from the output size, its odd unit at the
        # end for SAME_UPPER and at the beginning otherwise
        target = [n * s for n, s in zip(x.shape[2:], strides)] if target is None else target[-2:]
        # (negative where the output is larger than the kernels reach: rows of zeros)
        pads = []
        for f, t in zip(full, target):
            small, big = (f - t) // 2, (f - t) - (f - t) // 2
            pads.append((small, big) if auto == "SAME_UPPER" else (big, small))
    elif auto == "VALID":
        pads = [(0, 0), (0, 0)]
    elif auto == "NOTSET":
        pads = _pads(c, x.shape[2:], None, None)
    else:
        raise c.refuse("auto_pad", auto, "NOTSET, VALID, SAME_UPPER, SAME_LOWER")
    padding, crop = _split(pads, (math.inf, math.inf))
    y = gc.conv_transpose2d(x, w, None, stride=strides, padding=padding,
                            output_padding=extra_rows, dilation=dilations,
                            groups=int(c.attr("group", 1)))
    y = _pad_explicitly(c, y, [(-b, -a) for b, a in crop], 0.0)  # padding crops the output
    return [y if bias is None else y + gc.reshape(bias, (1, -1, 1, 1))]


def _pool(c, x, pool, fill: float, mask_divides: bool = False):
    """An ONNX pooling node's geometry on `pool(x, kernel, stride, padding, ceil_mode)`.

    Padding the op cannot take (asymmetric, or over half the kernel) is made explicit with
    `fill`; then the op's ceil_mode may keep a last window ONNX drops (one that would start
    in the right padding, now part of the image), so the result is cropped to ONNX's size.
    """
    _require_2d(c, x)
    if _ints(c, "dilations", [1, 1]) != (1, 1):
        raise c.refuse("dilations", c.attr("dilations"), "1: pooling windows are contiguous")
    kernel = _ints(c, "kernel_shape", [0, 0])
    strides = _ints(c, "strides", [1, 1])
    ceil_mode = bool(c.attr("ceil_mode", 0))
    pads = _pads(c, x.shape[2:], kernel, strides)
    padding, extra = _split(pads, [k // 2 for k in kernel])
    if not any(b or a for b, a in extra):
        return pool(x, kernel, strides, padding, ceil_mode)
    out = []
    for n, k, s, (b, a) in zip(x.shape[2:], kernel, strides, pads):
        size = (n + b + a - k + (s - 1 if ceil_mode else 0)) // s + 1
        out.append(size - 1 if ceil_mode and (size - 1) * s >= n + b else size)
    y = pool(_pad_explicitly(c, x, extra, fill), kernel, strides, padding, ceil_mode)
    if mask_divides:
        ones = np.ones((1, 1, *x.shape[2:]), x.dtype)
        mask = _pad_explicitly(c, gc.constant(ones), extra, 0.0)
        y = y / pool(mask, kernel, strides, padding, ceil_mode)
    return y[:, :, :out[0], :out[1]]


def max_pool(c):
    if c.wants(1):
        raise c.error("the Indices output is not supported")
    if c.attr("storage_order", 0):
        raise c.refuse("storage_order", c.attr("storage_order"), "0")
    x = c.x(0)
    exact = x.dtype.kind in "iu" and x.dtype.itemsize <= 4  # float64 holds them exactly
    if x.dtype.kind != "f" and not exact:
        raise c.error(f"MaxPool of {x.dtype.name}: floats and integers up to 32 bits")
    y = _pool(c, gc.cast(x, np.float64) if exact else x,
              lambda v, k, s, p, ceil: gc.max_pool2d(v, k, s, p, ceil), -np.inf)
    return [gc.cast(y, x.dtype) if exact else y]


def avg_pool(c):
    include = bool(c.attr("count_include_pad", 0))

    def pool(v, k, s, p, ceil):
        return gc.avg_pool2d(v, k, s, p, ceil, count_include_pad=include)
    return [_pool(c, c.x(0), pool, 0.0, mask_divides=not include)]


def global_avg_pool(c):
    x = c.x(0)
    return [gc.mean(x, tuple(range(2, x.ndim)), keepdims=True)]


def batch_norm(c):
    """Inference normalises with the running statistics given. Training mode normalises
    with the batch's and also returns ONNX's running statistics, which differ from torch's
    (gc.batch_norm's): the momentum weighs the old value, and the variance is biased."""
    x, scale, bias, mean, var = (c.x(i) for i in range(5))
    eps = c.attr("epsilon", 1e-5)
    if not c.attr("training_mode", 0):
        return [gc.batch_norm(x, scale, bias, mean, var, training=False, eps=eps)]
    momentum = c.attr("momentum", 0.9)
    axes = (0, *range(2, x.ndim))
    batch_mean = gc.stop_gradient(gc.mean(x, axes, keepdims=True))
    centred = x - batch_mean
    batch_var = gc.mean(centred * centred, axes)
    y = gc.batch_norm(x, scale, bias, training=True, eps=eps)
    return [y, mean * momentum + gc.reshape(batch_mean, mean.shape) * (1 - momentum),
            var * momentum + gc.stop_gradient(batch_var) * (1 - momentum)]


# -- export ------------------------------------------------------------------------------
def _pads_attr(padding) -> list[int]:
    return [*padding, *padding]


def _conv_attrs(op) -> dict:
    return {"strides": list(op.stride), "pads": _pads_attr(op.padding),
            "dilations": list(op.dilation), "group": op.groups}


def export_convolution(op, ins, out, e):
    return e.node("Conv", ins, **_conv_attrs(op))


def export_backward_data(op, ins, out, e):
    w, dy = ins
    _, _, kh, kw = e.shape_of(w)
    oh, ow = e.shape_of(dy)[2:]
    natural = [(o - 1) * s - 2 * p + window_extent(k, d) for o, s, p, k, d in zip(
        (oh, ow), op.stride, op.padding, (kh, kw), op.dilation)]
    return e.node("ConvTranspose", [dy, w], **_conv_attrs(op),
                  output_padding=[i - n for i, n in zip(op.image, natural)])


def export_backward_filter(op, ins, out, e):
    x, dy = ins
    n, c, h, w = e.shape_of(x)
    _, o, oh, ow = e.shape_of(dy)
    g = op.groups
    images = _reshape(e, e.node("Transpose", [_reshape(e, x, (n, g, c // g, h, w))],
                                perm=[2, 1, 0, 3, 4]), (c // g, g * n, h, w))
    filters = _reshape(e, e.node("Transpose", [_reshape(e, dy, (n, g, o // g, oh, ow))],
                                 perm=[1, 2, 0, 3, 4]), (o, n, oh, ow))
    taps = e.node("Conv", [images, filters], strides=list(op.dilation),
                  dilations=list(op.stride), pads=_pads_attr(op.padding), group=g)
    kernel = e.node("Slice", [taps, *(e.const(np.array(v, np.int64))
                                      for v in ([0, 0], list(op.kernel), [2, 3]))])
    return e.node("Transpose", [kernel], perm=[1, 0, 2, 3])


def _reshape(e, x, shape):
    return e.node("Reshape", [x, e.const(np.array(shape, np.int64))])


def _pool_attrs(op) -> dict:
    return {"kernel_shape": list(op.kernel), "strides": list(op.stride),
            "pads": _pads_attr(op.padding), "ceil_mode": int(op.ceil_mode)}


def _no_values_input(op, ins) -> None:
    from ..errors import OnnxError

    if len(ins) > 1:
        raise OnnxError("max pooling of a second (values) input, which second-order "
                        "max-pooling gradients use, has no ONNX equivalent")


def export_pooling(op, ins, out, e):
    if op.mode == "MAX":
        _no_values_input(op, ins)
        return e.node("MaxPool", ins, **_pool_attrs(op))
    include = int(op.mode == "AVERAGE")
    return e.node("AveragePool", ins, **_pool_attrs(op), count_include_pad=include)


def export_pooling_backward(op, ins, out, e):
    n, c, h, w = out.shape
    dy = ins[-1]
    oh, ow = e.shape_of(dy)[2:]
    if op.mode == "MAX":
        _, indices = e.multi("MaxPool", [ins[0]], 2, **_pool_attrs(op))
        flat = [_reshape(e, v, (-1,)) for v in (indices, dy)]
        zeros = e.const(np.zeros(n * c * h * w, out.dtype))
        spread = e.node("ScatterElements", [zeros, *flat], axis=0, reduction="add")
        return _reshape(e, spread, out.shape)
    share = e.node("Mul", [dy, e.const((1.0 / divisors(op, op.image, (oh, ow))).astype(out.dtype))])
    pads, extra = [], []
    for size, o, s, k, p in zip(op.image, (oh, ow), op.stride, op.kernel, op.padding):
        end = (o - 1) * s + k - p - size  # past the image: rows a hanging window covers
        pads.append((p, max(end, 0)))
        extra.append(max(-end, 0))
    spread = e.node("ConvTranspose", [_reshape(e, share, (n * c, 1, oh, ow)),
                                      e.const(np.ones((1, 1, *op.kernel), out.dtype))],
                    strides=list(op.stride), pads=[pads[0][0], pads[1][0], pads[0][1], pads[1][1]],
                    output_padding=extra)
    return _reshape(e, spread, out.shape)

