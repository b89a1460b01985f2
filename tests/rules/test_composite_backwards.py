"""layer_norm's and gelu_tanh's own backwards (exact custom gradients, op-reference §21):
against float64 finite differences (first and second order), against autodiff through the
composites written out op by op, compiled against the reference, and the passes they save.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.kernel import KernelStep

from helpers import assert_grads

F64 = "float64"
ORDERS = (1, 2)


def _layer_norm_by_its_statistics(x, gamma, beta, axis=-1, eps=1e-5):
    """layer_norm written out, so that autodiff goes through its mean and variance."""
    centred = x - gc.mean(x, axis, keepdims=True)
    normalised = centred * gc.rsqrt(gc.mean(centred * centred, axis, keepdims=True) + eps)
    return normalised * gamma + beta


def _gelu_tanh_by_its_formula(x):
    """gelu_tanh as torch writes it, differentiated by autodiff through every product."""
    return 0.5 * x * (1.0 + gc.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_layer_norm_gradients(order, axis, rng):
    shape = (3, 4, 5)
    param_shape = tuple(n if k == axis % 3 else 1 for k, n in enumerate(shape))
    with gc.Graph("ln_grad"):
        x = gc.param("x", shape, F64)
        gamma, beta = gc.param("gamma", param_shape, F64), gc.param("beta", param_shape, F64)
        y = gc.layer_norm(x, gamma, beta, axis=axis)
        feeds = {"x": rng.standard_normal(shape), "gamma": rng.standard_normal(param_shape),
                 "beta": rng.standard_normal(param_shape)}
        assert_grads(gc.tanh(y) * y, [x, gamma, beta], feeds, order=order)


@pytest.mark.parametrize("order", ORDERS)
def test_gelu_tanh_gradients(order, rng):
    with gc.Graph("gelu_grad"):
        x = gc.param("x", (4, 6), F64)
        values = np.concatenate([rng.standard_normal(20) * 3.0, [0.0, 1e-3, -6.0, 9.5]])
        assert_grads(gc.gelu_tanh(x) * x, [x], {"x": values.reshape(4, 6)}, order=order)


@pytest.mark.parametrize("dtype, tol", [("float64", 1e-10), ("float32", 1e-5)])
def test_gelu_tanh_and_its_gradient_equal_torchs_formula_far_out(dtype, tol):
    """Where t rounds to ±1 (|x| ≥ 9) and near 0, compiled and reference, against the closed
    form in float64 numpy: the forward and the derivative."""
    x = np.array([-30.0, -9.5, -4.0, -1.0, -1e-4, 0.0, 1e-4, 0.5, 3.0, 9.5, 30.0], dtype)
    c, a = math.sqrt(2.0 / math.pi), 0.044715
    wide = x.astype(np.float64)
    t = np.tanh(c * (wide + a * wide ** 3))
    forward = 0.5 * wide * (1 + t)
    slope = 0.5 * (1 + t) + 0.5 * wide * (1 - t * t) * c * (1 + 3 * a * wide * wide)
    with gc.Graph("gelu_far"):
        xs = gc.param("x", x.shape, dtype)
        y = gc.gelu_tanh(xs)
        outputs = [y, *gc.grad(y.sum(), [xs])]
    for got in (gc.evaluate(outputs, {"x": x}), gc.compile(outputs)(x=x)):
        np.testing.assert_allclose(got[0], forward, rtol=tol, atol=tol)
        np.testing.assert_allclose(got[1], slope, rtol=tol, atol=tol)


def _passes_and_results(build, shape, feeds):
    with gc.Graph("ln_passes"):
        x, t = gc.param("x", shape, F64), gc.input("t", shape, F64)
        gamma, beta = gc.param("gamma", shape[-1:], F64), gc.param("beta", shape[-1:], F64)
        loss = (build(x, gamma, beta) * t).sum()
        step = gc.compile([loss, *gc.grad(loss, [x, gamma, beta])])
    assert sum(isinstance(s, KernelStep) for s in step.program.steps) == 1  # one fused loop
    return step.source().count("for i1 in range("), step(**feeds)


@pytest.mark.parametrize("shape", [(6, 5), (40, 33)])
def test_layer_norm_gelu_backward_equals_autodiff_in_one_pass_fewer(shape, rng):
    """The fused step of gelu_tanh(layer_norm(x)) with the composites' own backwards gives what
    autodiff through them gives, in four passes over each row where that takes five."""
    feeds = {"x": rng.standard_normal(shape), "t": rng.standard_normal(shape),
             "gamma": rng.standard_normal(shape[-1]), "beta": rng.standard_normal(shape[-1])}
    own = _passes_and_results(lambda x, g, b: gc.gelu_tanh(gc.layer_norm(x, g, b)), shape, feeds)
    autodiff = _passes_and_results(
        lambda x, g, b: _gelu_tanh_by_its_formula(_layer_norm_by_its_statistics(x, g, b)),
        shape, feeds)
    for got, want in zip(own[1], autodiff[1]):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    assert (own[0], autodiff[0]) == (4, 5)
