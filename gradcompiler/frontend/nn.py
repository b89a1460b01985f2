"""Composites built only from primitive ops: softmax, log_softmax,
cross_entropy, nll_loss, layer_norm, gelu_tanh, mse, clip.

Being composites, they need no gradient rule of their own, and the fuser
sees their primitive pieces. layer_norm's normalisation and gelu_tanh carry
an exact backward of their own (a CustomGradient, gradcompiler/custom.py):
the closed forms, in fewer passes and less arithmetic than autodiff derives.
"""

from __future__ import annotations

import math as _pymath
from types import SimpleNamespace

import numpy as np

from ..errors import BuildError, ShapeError
from ..ir import call_site
from ..ops.common import normalize_axis
from ..ops.custom import CustomGradient
from ..ops.indexing import IndexingOneHot
from ..ops.source import Placeholder
from .math import cast, equal, exp, log, maximum, mean, minimum, reduce, stop_gradient, sum, tanh, where
from .normalisation import normalise
from .shapes import broadcast_to, reshape, squeeze
from .tensor import Tensor, apply, reports_user_line, to_operands

__all__ = ["softmax", "log_softmax", "cross_entropy", "nll_loss", "layer_norm", "gelu_tanh", "mse",
           "clip", "argmax"]


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


_REDUCTIONS = ("mean", "sum", "none")


def _class_axis_shape(weight: Tensor, ndim: int, axis: int) -> Tensor:
    """weight (C,) as (1, .., C, .., 1): broadcast along the class axis."""
    return reshape(weight, tuple(-1 if d == axis else 1 for d in range(ndim)))


def _labels_about(name: str, labels: Tensor, ignore_index: int | None) -> str:
    node = labels.node
    source = (f"feed {node.op.feed_name!r}" if isinstance(node.op, Placeholder)
              else f"tensor %{labels.id} ({node.op.label})")
    ignored = "" if ignore_index is None else f", ignore_index={ignore_index}"
    return f"{name} (labels from {source}{ignored}, at {call_site()})"


def _reduce_loss(per_sample: Tensor, reduction: str, denominator: Tensor | None) -> Tensor:
    """torch's reductions; `denominator` (the selected weights' sum) replaces the count."""
    if reduction == "none":
        return per_sample
    if reduction == "sum" or denominator is not None:
        total = sum(per_sample)
        return total if reduction == "sum" else total / denominator
    return mean(per_sample)


def _nll(name: str, log_probs: Tensor, target: Tensor, axis: int, weight, ignore_index,
         reduction: str, label_smoothing: float) -> Tensor:
    """torch.nn.functional.nll_loss, with cross_entropy's label smoothing and probability
    targets (a float `target` of log_probs' shape)."""
    if reduction not in _REDUCTIONS:
        raise BuildError(f"reduction={reduction!r}; expected one of {_REDUCTIONS}", op=name)
    if not 0.0 <= label_smoothing <= 1.0:
        raise BuildError(f"label_smoothing={label_smoothing!r} must lie in [0, 1]", op=name)
    axis = normalize_axis(SimpleNamespace(label=name), axis, log_probs.ndim)
    classes = log_probs.shape[axis]
    if weight is not None:
        weight = to_operands([log_probs, weight])[1]
        if weight.shape != (classes,):
            raise ShapeError(f"weight of shape {weight.shape} must be ({classes},), one per class",
                             op=name)
        weight = _class_axis_shape(weight, log_probs.ndim, axis)
    weighted = log_probs if weight is None else log_probs * weight
    if target.dtype.kind == "f":
        if target.shape != log_probs.shape:
            raise ShapeError(f"probability targets of shape {target.shape} must have the "
                             f"input's shape {log_probs.shape}", op=name)
        if label_smoothing:
            target = target * (1.0 - label_smoothing) + label_smoothing / classes
        return _reduce_loss(-sum(weighted * target, axis), reduction, None)
    about = _labels_about(name, target, ignore_index)
    keep = None
    if ignore_index is not None:
        ignored = equal(target, ignore_index)
        target = where(ignored, 0, target)
        keep = 1.0 - cast(ignored, log_probs.dtype)
    picked = _pick(log_probs, target, axis, about)
    if weight is not None:
        picked_weight = _pick(broadcast_to(weight, log_probs.shape), target, axis, about)
        keep = picked_weight if keep is None else picked_weight * keep
    denominator = None if keep is None or reduction != "mean" else sum(keep)
    loss = _reduce_loss(-(picked if keep is None else picked * keep), reduction, denominator)
    if not label_smoothing:
        return loss
    smooth = -sum(weighted, axis)
    if ignore_index is not None:
        smooth = smooth * (1.0 - cast(ignored, log_probs.dtype))
    smooth = _reduce_loss(smooth, reduction, denominator)
    return loss * (1.0 - label_smoothing) + smooth * (label_smoothing / classes)


def _pick(src: Tensor, labels: Tensor, axis: int, about: str) -> Tensor:
    return squeeze(apply(IndexingOneHot(axis, about), src, labels), axis)


@reports_user_line
def nll_loss(log_probs: Tensor, target: Tensor, axis: int = -1, *, weight=None,
             ignore_index: int | None = None, reduction: str = "mean") -> Tensor:
    """torch.nn.functional.nll_loss of `log_probs` with classes along `axis` (torch: dim 1).

    `target` holds class indices (an int tensor without the class axis); `weight` (C,)
    scales each class, and a weighted mean divides by the sum of the picked weights; labels
    equal to `ignore_index` count nowhere, not in the mean's denominator either. Unlike
    torch, ignore_index is off by default (torch: -100): any label outside [0, C) is then an
    error naming the labels, never a silently skipped sample.
    """
    return _nll("nll_loss", log_probs, target, axis, weight, ignore_index, reduction, 0.0)


@reports_user_line
def cross_entropy(logits: Tensor, labels: Tensor, axis: int = -1, *, weight=None,
                  ignore_index: int | None = None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Tensor:
    """torch.nn.functional.cross_entropy: nll_loss of log_softmax(logits, axis).

    `labels` are class indices as in `nll_loss`, or probabilities (a float tensor of the
    logits' shape; ignore_index does not apply, the mean divides by the sample count).
    `label_smoothing` ε mixes in the uniform distribution: (1 − ε)·nll + ε/C·Σ_c −w_c·log p_c,
    reduced like the nll term (so a weighted mean shares its denominator), as torch does.
    """
    return _nll("cross_entropy", log_softmax(logits, axis), labels, axis, weight, ignore_index,
                reduction, label_smoothing)


@reports_user_line
def layer_norm(x: Tensor, gamma: Tensor | None = None, beta: Tensor | None = None,
               axis: int = -1, eps: float = 1e-5) -> Tensor:
    """(x − mean)/√(var + eps) along `axis`, then ·gamma + beta; the normalisation has the
    standard backward of its own (frontend/normalisation.py)."""
    axis = normalize_axis(SimpleNamespace(label="layer_norm"), axis, x.ndim)
    y = normalise(x, (axis,), eps, "layer_norm").value
    if gamma is not None:
        y = y * gamma
    if beta is not None:
        y = y + beta
    return y


# gelu_tanh's constants: √(2/π), and √(2/π)·0.044715 (the cubic term's)
_GELU_C = _pymath.sqrt(2.0 / _pymath.pi)
_GELU_CA = _GELU_C * 0.044715


def gelu_tanh(x: Tensor) -> Tensor:
    """0.5·x·(1 + tanh(√(2/π)·(x + 0.044715·x³))), with its derivative as a backward of its own.

    Autodiff through the composite differentiates x³ as a product of three factors and the
    outer product twice: 10 multiplies and fused multiply-adds an element in a fused loop,
    where the closed form ½(1 + t) + ½x·(1 − t²)·√(2/π)·(1 + 3·0.044715·x²) takes 6, t the
    forward's tanh (a residual, as autodiff's tanh gradient reads it too). layernorm_gelu's fused loop, with this and
    layer_norm's own backward, issues 28 multiplies and fused multiply-adds an element in its
    main pass where it issued 31 (LLVM's output, 512-bit vectors).
    """
    with x.graph.scope("gelu_tanh"):
        square = x * x
        t = tanh(x * (_GELU_C + _GELU_CA * square))
        half = 0.5 * x
        op = CustomGradient(_gelu_tanh_backward, "gelu_tanh", arguments=1, residuals=2, exact=True)
        return apply(op, x, x, t, half + half * t)


def _gelu_tanh_backward(g: Tensor, x: Tensor, t: Tensor) -> list[Tensor]:
    """g·(½(1 + t) + ½x·(1 − t²)·(c + 3·c·a·x²)). A module-level function, so a pickled graph
    keeps it."""
    slope = _GELU_C + (3.0 * _GELU_CA) * (x * x)
    return [g * ((0.5 + 0.5 * t) + (0.5 * x) * (1.0 - t * t) * slope)]


def mse(a: Tensor, b: Tensor) -> Tensor:
    d = a - b
    return mean(d * d)


def clip(x: Tensor, lo=None, hi=None) -> Tensor:
    """numpy's clip (torch's clamp): max(x, lo), then min(., hi); either bound may be None.
    The gradient follows gc.maximum's and gc.minimum's at the bounds."""
    if lo is None and hi is None:
        raise BuildError("clip needs lo, hi or both", op="clip")
    x = x if lo is None else maximum(x, lo)
    return x if hi is None else minimum(x, hi)


@reports_user_line
def argmax(x: Tensor, axis: int = -1, keepdims: bool = False, last: bool = False) -> Tensor:
    """The int64 position of the maximum along `axis`: the first one (numpy's argmax), or
    the last with `last=True`. Built from a max, a comparison and a min of positions, so
    it needs no op of its own; it has no gradient (its value is an index)."""
    axis = normalize_axis(SimpleNamespace(label="argmax"), axis, x.ndim)
    n = x.shape[axis]
    if n == 0:
        raise ShapeError(f"argmax along the empty axis {axis} of shape {x.shape}", op="argmax")
    hit = equal(x, stop_gradient(reduce("MAX", x, axis, keepdims=True)))
    positions = to_operands([x, np.arange(n, dtype=np.int64).reshape(
        [n if d == axis else 1 for d in range(x.ndim)])])[1]
    if last:
        return reduce("MAX", where(hit, positions, -1), axis, keepdims)
    return reduce("MIN", where(hit, positions, n), axis, keepdims)
