"""Frontend helpers no other test pins to an independent value: `gc.mse`, softmax along a
leading axis, and `2 ** t` (Tensor.__rpow__), each value and gradient against numpy formulas
written here."""

from __future__ import annotations

import numpy as np

import gradcompiler as gc


def test_mse_is_the_mean_squared_difference_and_its_gradient(rng):
    av, bv = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    with gc.Graph("mse"):
        a, b = gc.param("a", (3, 4), "float64"), gc.input("b", (3, 4), "float64")
        loss = gc.mse(a, b)
        da = gc.grad(loss, a)
    value, grad = gc.evaluate([loss, da], a=av, b=bv)
    assert value.shape == ()
    np.testing.assert_allclose(value, np.sum((av - bv) ** 2) / 12, rtol=1e-14)
    np.testing.assert_allclose(grad, 2 * (av - bv) / 12, rtol=1e-14)


def test_softmax_along_a_leading_axis(rng):
    xv = rng.standard_normal((3, 4, 2)) * 5
    with gc.Graph("softmax_axis0"):
        x = gc.param("x", (3, 4, 2), "float64")
        y = gc.softmax(x, axis=0)
        gc.check_grads(y, [x], {"x": xv})
    e = np.exp(xv - xv.max(axis=0))
    want = e / e.sum(axis=0)
    got = gc.evaluate(y, x=xv)
    np.testing.assert_allclose(got, want, rtol=1e-14)
    np.testing.assert_allclose(got.sum(axis=0), np.ones((4, 2)), rtol=1e-14)
    assert not np.allclose(got.sum(axis=-1), 1.0)  # normalised over axis 0, not the last one


def test_a_number_to_the_power_of_a_tensor(rng):
    xv = rng.uniform(-3, 3, 5)
    with gc.Graph("rpow"):
        x = gc.param("x", (5,), "float64")
        y = 2 ** x
        dx = gc.grad(y.sum(), x)
    value, grad = gc.evaluate([y, dx], x=xv)
    np.testing.assert_allclose(value, np.exp2(xv), rtol=1e-14)
    np.testing.assert_allclose(grad, np.log(2) * np.exp2(xv), rtol=1e-14)
