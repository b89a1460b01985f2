"""Composites built only from primitive ops: softmax, log_softmax,
cross_entropy, layer_norm, gelu_tanh, mse.

Being composites, they need no gradient rule of their own, and the fuser
sees their primitive pieces.
"""

from __future__ import annotations

import math as _pymath

from .indexing import indexing_one_hot
from .math import exp, log, mean, reduce, rsqrt, stop_gradient, sum, tanh
from .tensor import Tensor

__all__ = ["softmax", "log_softmax", "cross_entropy", "layer_norm", "gelu_tanh", "mse"]


def _shift(x: Tensor, axis: int) -> Tensor:
    """x minus its (gradient-free) max along axis: the stable exponent. Along a
    zero-length axis there is no max and nothing to shift: the result is empty."""
    if -x.ndim <= axis < x.ndim and x.shape[axis] == 0:
        return x
    return x - stop_gradient(reduce("MAX", x, axis, keepdims=True))


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    e = exp(_shift(x, axis))
    return e / sum(e, axis, keepdims=True)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    shifted = _shift(x, axis)
    return shifted - log(sum(exp(shifted), axis, keepdims=True))


def cross_entropy(logits: Tensor, labels: Tensor, axis: int = -1) -> Tensor:
    """Mean softmax cross-entropy of integer `labels`, picked by one-hot indexing."""
    picked = indexing_one_hot(log_softmax(logits, axis), labels, axis)
    return -mean(picked)


def layer_norm(x: Tensor, gamma: Tensor | None = None, beta: Tensor | None = None,
               axis: int = -1, eps: float = 1e-5) -> Tensor:
    mu = mean(x, axis, keepdims=True)
    centred = x - mu
    var = mean(centred * centred, axis, keepdims=True)
    y = centred * rsqrt(var + eps)
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


def gelu_tanh(x: Tensor) -> Tensor:
    """0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³)))."""
    inner = _pymath.sqrt(2.0 / _pymath.pi) * (x + 0.044715 * (x * x * x))
    return 0.5 * x * (1.0 + tanh(inner))


def mse(a: Tensor, b: Tensor) -> Tensor:
    d = a - b
    return mean(d * d)
