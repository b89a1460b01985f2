"""Convolutional-network functions with torch.nn.functional's signatures:
conv2d, conv_transpose2d, max_pool2d, avg_pool2d, adaptive_avg_pool2d and
batch_norm (docs/op-reference.md §13-§15).

Arguments are ints or (h, w) pairs, as in torch; the ops check the values.
batch_norm is a composite of reductions and elementwise ops rather than an
op: the fuser then sees its pieces (the mean and the variance share one
pass, the normalisation fuses into the consumer). In training mode its
normalisation x̂ = (x − μ)·r has the standard backward of its own, two
reductions in one pass and one elementwise pass (frontend/normalisation.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import ShapeError
from ..ops.conv import Convolution, ConvolutionBackwardData, window_extent
from ..ops.pool import Pooling
from .math import matmul, mean, rsqrt, stop_gradient
from .normalisation import normalise
from .shapes import reshape, swapaxes
from .tensor import Tensor, apply, constant, reports_user_line

__all__ = ["adaptive_avg_pool2d", "avg_pool2d", "batch_norm", "conv2d", "conv_transpose2d",
           "max_pool2d"]


def _pair(value: Any) -> Any:
    """torch's int-or-pair argument as a pair (anything else is left for the op to refuse)."""
    if isinstance(value, (int, np.integer)) and not isinstance(value, bool):
        return (int(value), int(value))
    if isinstance(value, (list, tuple)):
        return tuple(value)
    return value


def _channel_vector(v: Tensor, channels: int, ndim: int, what: str, op: str) -> Tensor:
    """A per-channel (C,) tensor shaped to broadcast along axis 1 of an ndim-D activation."""
    if v.shape != (channels,):
        raise ShapeError(f"{what} of shape {v.shape} must be ({channels},), one per channel",
                         op=op)
    return reshape(v, (1, channels) + (1,) * (ndim - 2))


@reports_user_line
def conv2d(x: Tensor, w: Tensor, bias: Tensor | None = None, stride=1, padding=0, dilation=1,
           groups: int = 1) -> Tensor:
    """Cross-correlation of NCHW images with OIHW filters (O, C/groups, KH, KW), plus bias (O,)."""
    op = Convolution(_pair(stride), _pair(padding), _pair(dilation), groups)
    y = apply(op, x, w)
    return y if bias is None else y + _channel_vector(bias, y.shape[1], 4, "bias", "conv2d")


@reports_user_line
def conv_transpose2d(x: Tensor, w: Tensor, bias: Tensor | None = None, stride=1, padding=0,
                     output_padding=0, dilation=1, groups: int = 1) -> Tensor:
    """The adjoint of conv2d: filters (C_in, C_out/groups, KH, KW), output size
    (H − 1)·stride − 2·padding + dilation·(KH − 1) + output_padding + 1."""
    stride, padding, dilation = _pair(stride), _pair(padding), _pair(dilation)
    output_padding = _pair(output_padding)
    if x.ndim != 4 or w.ndim != 4:
        raise ShapeError(f"input {x.shape} and filter {w.shape} must be 4-D (NCHW, IOHW)",
                         op="conv_transpose2d")
    if x.shape[1] != w.shape[0]:
        raise ShapeError(f"input {x.shape} has {x.shape[1]} channels but the filter {w.shape} "
                         f"takes {w.shape[0]}", op="conv_transpose2d")
    image = []
    for axis in range(2):
        extra = output_padding[axis]
        if not 0 <= extra < stride[axis]:  # torch also allows < dilation (rows nothing reaches)
            raise ShapeError(f"output_padding {output_padding} must be smaller than the stride "
                             f"{stride}", op="conv_transpose2d")
        size = ((x.shape[2 + axis] - 1) * stride[axis] - 2 * padding[axis]
                + window_extent(w.shape[2 + axis], dilation[axis]) + extra)
        image.append(size)
    op = ConvolutionBackwardData(stride, padding, dilation, groups, tuple(image))
    y = apply(op, w, x)
    return y if bias is None else y + _channel_vector(bias, y.shape[1], 4, "bias",
                                                      "conv_transpose2d")


@reports_user_line
def max_pool2d(x: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False) -> Tensor:
    """The maximum of each window (the gradient goes to each window's first maximum)."""
    kernel = _pair(kernel_size)
    op = Pooling("MAX", kernel, kernel if stride is None else _pair(stride), _pair(padding),
                 ceil_mode)
    return apply(op, x)


@reports_user_line
def avg_pool2d(x: Tensor, kernel_size, stride=None, padding=0, ceil_mode: bool = False,
               count_include_pad: bool = True) -> Tensor:
    """The mean of each window; count_include_pad=False divides by the image pixels only."""
    kernel = _pair(kernel_size)
    mode = "AVERAGE" if count_include_pad else "AVERAGE_COUNT_EXCLUDE_PADDING"
    op = Pooling(mode, kernel, kernel if stride is None else _pair(stride), _pair(padding),
                 ceil_mode)
    return apply(op, x)


def _adaptive_matrix(size: int, out: int, dtype: np.dtype) -> np.ndarray:
    """(out, size): row i averages torch's adaptive window
    [⌊i·size/out⌋, ⌈(i+1)·size/out⌉)."""
    matrix = np.zeros((out, size), dtype)
    for i in range(out):
        start, end = (i * size) // out, -((-(i + 1) * size) // out)
        matrix[i, start:end] = 1.0 / (end - start)
    return matrix


@reports_user_line
def adaptive_avg_pool2d(x: Tensor, output_size) -> Tensor:
    """torch's adaptive average pooling to (OH, OW): a mean over (H, W) for (1, 1), one
    Pooling when the image divides evenly, else products with constant averaging matrices."""
    out = _pair(output_size)
    if x.ndim != 4:
        raise ShapeError(f"input must be 4-D (N, C, H, W), got shape {x.shape}",
                         op="adaptive_avg_pool2d")
    if not (isinstance(out, tuple) and len(out) == 2
            and all(isinstance(d, int) and d >= 1 for d in out)):
        raise ShapeError(f"output_size must be a positive int or pair, got {output_size!r}",
                         op="adaptive_avg_pool2d")
    h, w = x.shape[2:]
    if out == (1, 1):
        return mean(x, (2, 3), keepdims=True)
    if h % out[0] == 0 and w % out[1] == 0:
        kernel = (h // out[0], w // out[1])
        return apply(Pooling("AVERAGE", kernel, kernel), x)
    rows = constant(_adaptive_matrix(h, out[0], x.dtype).T)  # (H, OH)
    cols = constant(_adaptive_matrix(w, out[1], x.dtype).T)  # (W, OW)
    pooled_w = matmul(x, cols)                                # (N, C, H, OW)
    return swapaxes(matmul(swapaxes(pooled_w, 2, 3), rows), 2, 3)


@reports_user_line
def batch_norm(x: Tensor, gamma: Tensor | None = None, beta: Tensor | None = None,
               running_mean: Tensor | None = None, running_var: Tensor | None = None,
               training: bool = True, momentum: float = 0.1, eps: float = 1e-5):
    """torch.nn.functional.batch_norm over axis 1 of an (N, C, ...) input.

    training=True normalises with the batch's mean and biased variance; given running
    statistics it returns (y, new_running_mean, new_running_var), updated as torch does:
    (1 − momentum)·running + momentum·batch, with the *unbiased* batch variance, and no
    gradient through them. training=False normalises with the running statistics.
    """
    name = "batch_norm"
    if x.ndim < 2:
        raise ShapeError(f"input must be (N, C, ...), got shape {x.shape}", op=name)
    channels = x.shape[1]
    if (running_mean is None) != (running_var is None):
        raise ShapeError("pass both running_mean and running_var, or neither", op=name)
    axes = (0,) + tuple(range(2, x.ndim))
    count = x.size // max(channels, 1)
    if training:
        if count < 2:
            raise ShapeError(f"training needs more than one value per channel, input {x.shape}",
                             op=name)
        y, mu, var, _ = normalise(x, axes, eps, name)
    else:
        if running_mean is None:
            raise ShapeError("training=False needs running_mean and running_var", op=name)
        mu = _channel_vector(running_mean, channels, x.ndim, "running_mean", name)
        var = _channel_vector(running_var, channels, x.ndim, "running_var", name)
        y = (x - mu) * rsqrt(var + eps)
    if gamma is not None:
        y = y * _channel_vector(gamma, channels, x.ndim, "gamma", name)
    if beta is not None:
        y = y + _channel_vector(beta, channels, x.ndim, "beta", name)
    if not training or running_mean is None:
        return y
    _channel_vector(running_mean, channels, x.ndim, "running_mean", name)
    _channel_vector(running_var, channels, x.ndim, "running_var", name)
    batch_mean = reshape(stop_gradient(mu), (channels,))
    unbiased = reshape(stop_gradient(var), (channels,)) * (count / (count - 1))
    new_mean = running_mean * (1.0 - momentum) + batch_mean * momentum
    new_var = running_var * (1.0 - momentum) + unbiased * momentum
    return y, new_mean, new_var
