"""cross_entropy and nll_loss with torch's options: weight=, ignore_index=, label_smoothing=,
probability targets and reduction="none" | "sum" | "mean".

The oracle is torch itself (torch.nn.functional.cross_entropy and nll_loss, float64). Each
case runs on the reference and compiled CPU code; float64 finite differences check the
gradient.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import gradcompiler as gc
from gradcompiler.errors import BuildError, ShapeError

N, C = 5, 4


def _log_softmax(z):
    shifted = z - z.max(axis=1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))


def torch_cross_entropy(logits, target, weight=None, ignore_index=None, reduction="mean",
                        label_smoothing=0.0, log_probs=None):
    """torch's cross_entropy (or, given log_probs, nll_loss), float64, classes on axis 1;
    ignore_index None: no class ignored (torch's -100 matches no label here)."""
    options = dict(weight=None if weight is None else torch.from_numpy(weight), reduction=reduction,
                   ignore_index=-100 if ignore_index is None else ignore_index)
    if log_probs is not None:
        return F.nll_loss(torch.from_numpy(log_probs), torch.from_numpy(target), **options).numpy()
    return F.cross_entropy(torch.from_numpy(logits), torch.from_numpy(target), label_smoothing=label_smoothing,
                           **options).numpy()


@pytest.fixture
def data(rng):
    logits = rng.standard_normal((N, C))
    labels = np.array([2, 0, 3, 3, 1], np.int64)
    probs = rng.uniform(0.1, 1.0, (N, C))
    weight = rng.uniform(0.5, 2.0, C)
    return dict(z=logits, labels=labels, probs=probs / probs.sum(axis=1, keepdims=True), w=weight)


def _graph(loss_fn, labels_dtype, labels_shape):
    with gc.Graph():
        z = gc.input("z", (N, C), "float64")
        labels = gc.input("labels", labels_shape, labels_dtype)
        w = gc.input("w", (C,), "float64")
        loss = loss_fn(z, labels, w)
    return z, loss


def _check(loss_fn, want, feeds, labels_dtype="int64", labels_shape=(N,)):
    z, loss = _graph(loss_fn, labels_dtype, labels_shape)
    for got in (gc.evaluate(loss, feeds), gc.compile(loss)(**feeds)):
        assert got.shape == np.shape(want)
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-14)
    gc.check_grads(loss, [z], feeds)


OPTIONS = list(itertools.product(("mean", "sum", "none"), (False, True), (None, 3), (0.0, 0.2)))


@pytest.mark.parametrize("reduction, weighted, ignore_index, smoothing", OPTIONS)
def test_cross_entropy_with_class_indices_matches_torch(data, reduction, weighted, ignore_index,
                                                        smoothing):
    """ignore_index=3 drops two of the five samples, from the mean's denominator too."""
    kwargs = dict(reduction=reduction, ignore_index=ignore_index, label_smoothing=smoothing)
    want = torch_cross_entropy(data["z"], data["labels"], data["w"] if weighted else None, **kwargs)
    _check(lambda z, lab, w: gc.cross_entropy(z, lab, weight=w if weighted else None, **kwargs),
           want, dict(z=data["z"], labels=data["labels"], w=data["w"]))


PROBABILITY_OPTIONS = list(itertools.product(("mean", "sum", "none"), (False, True), (0.0, 0.3)))


@pytest.mark.parametrize("reduction, weighted, smoothing", PROBABILITY_OPTIONS)
def test_cross_entropy_with_probability_targets_matches_torch(data, reduction, weighted, smoothing):
    want = torch_cross_entropy(data["z"], data["probs"], data["w"] if weighted else None,
                               reduction=reduction, label_smoothing=smoothing)
    _check(lambda z, p, w: gc.cross_entropy(z, p, weight=w if weighted else None,
                                            reduction=reduction, label_smoothing=smoothing),
           want, dict(z=data["z"], labels=data["probs"], w=data["w"]), "float64", (N, C))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_nll_loss_with_weight_and_ignore_index_matches_torch(data, reduction):
    log_probs = _log_softmax(data["z"])
    labels = np.array([1, -100, 0, 2, -100], np.int64)
    want = torch_cross_entropy(None, labels, data["w"], -100, reduction, log_probs=log_probs)
    _check(lambda z, lab, w: gc.nll_loss(z, lab, weight=w, ignore_index=-100, reduction=reduction),
           want, dict(z=log_probs, labels=labels, w=data["w"]))


def test_classes_along_axis_one_of_a_rank_3_input(rng):
    """torch's (N, C, d) layout: classes on axis 1, one label per (n, d)."""
    logits = rng.standard_normal((2, C, 3))
    labels = rng.integers(0, C, (2, 3))
    with gc.Graph():
        z = gc.input("z", logits.shape, "float64")
        lab = gc.input("labels", labels.shape, "int64")
        loss = gc.cross_entropy(z, lab, axis=1, reduction="none")
    flat = np.moveaxis(logits, 1, -1).reshape(-1, C)
    want = torch_cross_entropy(flat, labels.reshape(-1), reduction="none").reshape(2, 3)
    np.testing.assert_allclose(gc.evaluate(loss, z=logits, labels=labels), want, rtol=1e-12)


def test_bad_options_name_the_loss_and_the_value():
    with gc.Graph():
        z, lab = gc.input("z", (N, C)), gc.input("labels", (N,), "int32")
        with pytest.raises(BuildError, match=r"cross_entropy: reduction='avg'"):
            gc.cross_entropy(z, lab, reduction="avg")
        with pytest.raises(BuildError, match=r"cross_entropy: label_smoothing=1.5"):
            gc.cross_entropy(z, lab, label_smoothing=1.5)
        with pytest.raises(ShapeError, match=r"nll_loss: weight of shape \(3,\) must be \(4,\)"):
            gc.nll_loss(z, lab, weight=np.ones(3, np.float32))
        with pytest.raises(ShapeError, match=r"probability targets of shape \(5, 3\)"):
            gc.cross_entropy(z, gc.input("p", (N, 3)))
