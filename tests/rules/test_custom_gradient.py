"""`gc.custom_gradient`: the user's backward replaces the composite's, and composes with
second order, compilation on both targets, fusion, check_grads and the DOT dump.

Oracles: the gradients each backward defines, written in numpy; float64 finite
differences where the custom gradient is also the true one (log-sum-exp).
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.ops.custom import CustomGradient

from oracle import assert_close


@gc.custom_gradient
def ste_round(x):
    return gc.round(x), lambda g: [g]


@gc.custom_gradient
def logsumexp(x):
    shift = gc.stop_gradient(x.max(axis=-1, keepdims=True))
    y = gc.log(gc.exp(x - shift).sum(axis=-1, keepdims=True)) + shift
    return y, lambda g, x, y: [g * gc.exp(x - y)], (x, y)


@gc.custom_gradient
def scaled_product(a, b, scale: float):
    """Two Tensor arguments and a static one; the backward gives b no gradient."""
    return a * b * scale, lambda g, b: [g * b * scale, None], (b,)


def _softmax(z):
    e = np.exp(z - z.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


X = np.random.default_rng(11).standard_normal((3, 5))


def _lse_graph(dtype="float64"):
    with gc.Graph("lse"):
        x = gc.param("x", (3, 5), dtype)
        y = logsumexp(x * 2.0)
        loss = (y * y).sum()
    return x, y, loss


def test_the_users_backward_replaces_the_composites():
    with gc.Graph("ste"):
        x = gc.param("x", (3, 5), "float64")
        r = gc.input("r", (3, 5), "float64")
        loss = (ste_round(x * 3.0) * r).sum()
    gx, = gc.grad(loss, [x])
    r_value = np.random.default_rng(1).standard_normal((3, 5))
    # round's own gradient is zero; the straight-through one is the identity's: 3·r
    assert_close(gc.evaluate(gx, {"x": X, "r": r_value}), 3.0 * r_value, rtol=1e-15)


def test_static_arguments_and_a_gradient_left_out():
    with gc.Graph("g"):
        a = gc.param("a", (4,), "float64")
        b = gc.param("b", (4,), "float64")
        y = scaled_product(a, b, 0.5)
    ga, gb = gc.grad(y.sum(), [a, b], disconnected="zero")
    values = {"a": np.arange(4.0), "b": np.arange(4.0) + 1}
    got_a, got_b = gc.evaluate([ga, gb], values)
    assert_close(got_a, 0.5 * values["b"], rtol=1e-15)
    assert_close(got_b, np.zeros(4), rtol=0.0)  # None: no gradient flows to b


@pytest.mark.parametrize("target", ["reference", "cpu", "cuda"])
def test_a_hand_written_backward_compiles_and_fuses(target):
    x, y, loss = _lse_graph()
    gx, = gc.grad(loss, [x])
    y_value = np.log(np.exp(2 * X).sum(-1, keepdims=True))
    expected = 2.0 * 2.0 * y_value * _softmax(2 * X)  # d(y²)/dx through the backward g·exp(x−y)
    if target == "reference":
        got = gc.evaluate(gx, {"x": X})
    else:
        step = gc.compile(gx, target=target)
        assert not any(isinstance(n.op, CustomGradient) for n in step.graph.nodes.values())
        got = np.asarray(step(x=X, to_host=True) if target == "cuda" else step(x=X))
    assert_close(got, expected, rtol=1e-12)


def test_second_order_through_a_hand_written_backward():
    x, y, loss = _lse_graph()
    gc.check_grads(loss, x, {"x": X}, order=2, custom_gradients="check")
    vector = np.random.default_rng(2).standard_normal((3, 5))
    hv = gc.evaluate(gc.hvp(loss, x, vector), {"x": X})
    g = lambda v: gc.evaluate(gc.grad(loss, x), {"x": v})  # noqa: E731
    assert_close(hv, (g(X + 1e-6 * vector) - g(X - 1e-6 * vector)) / 2e-6, rtol=1e-6, atol=1e-8)


def test_check_grads_refuses_a_custom_gradient_unless_told():
    with gc.Graph("ste"):
        x = gc.param("x", (3, 5), "float64")
        loss = (ste_round(x * 3.0) * x).sum()
    with pytest.raises(gc.GraphError, match=r"custom_gradient 'ste_round' \(built at .*test_custom_gradient"):
        gc.check_grads(loss, x, {"x": X})
    # told to compare, it finds the difference the straight-through estimator makes on purpose
    with pytest.raises(AssertionError, match="gradient check"):
        gc.check_grads(loss, x, {"x": X}, custom_gradients="check")


def test_check_grads_compares_a_backward_declared_exact():
    """exact=True says the backward is the true derivative: check_grads compares it unasked,
    and so still catches one that is not (here the straight-through estimator)."""
    exact_logsumexp = gc.custom_gradient(exact=True)(logsumexp.__wrapped__)
    exact_ste = gc.custom_gradient(exact=True)(ste_round.__wrapped__)
    with gc.Graph("exact"):
        x = gc.param("x", (3, 5), "float64")
        good = (exact_logsumexp(x) * gc.sin(x)).sum()
        bad = (exact_ste(x * 3.0) * x).sum()
    gc.check_grads(good, x, {"x": X})
    with pytest.raises(AssertionError, match="gradient check"):
        gc.check_grads(bad, x, {"x": X})


def test_a_backward_that_captures_instead_of_naming_residuals_is_refused_on_a_copy():
    """check_grads differentiates a float64 copy: a Tensor the closure captured belongs to the
    original graph, and the message says to return it as a residual."""

    @gc.custom_gradient
    def captures(x):
        y = gc.exp(x)
        return y, lambda g: [g * y]

    with gc.Graph("g"):
        x = gc.param("x", (3,), "float32")
        loss = captures(x).sum()
    gc.grad(loss, x)  # on its own graph the closure's Tensor is fine
    with pytest.raises(gc.NotDifferentiableError, match="returned as a residual"):
        gc.check_grads(loss, x, {"x": np.ones(3, "float32")}, custom_gradients="check")


def test_bad_custom_gradients_are_named():
    @gc.custom_gradient
    def no_backward(x):
        return gc.exp(x)

    @gc.custom_gradient
    def two_grads(x):
        return gc.exp(x), lambda g: [g, g]

    @gc.custom_gradient
    def wrong_shape(x):
        return x.sum(), lambda g: [g]

    with gc.Graph("g"):
        x = gc.param("x", (3,), "float64")
        with pytest.raises(gc.GraphError, match="'no_backward': the forward must return"):
            no_backward(x)
        with pytest.raises(gc.GraphError, match="at least one Tensor"):
            ste_round(1.5)
        bad_count, bad_shape = two_grads(x).sum(), wrong_shape(x)
    with pytest.raises(gc.NotDifferentiableError, match="two_grads.*2 gradients for 1"):
        gc.grad(bad_count, x)
    with pytest.raises(gc.NotDifferentiableError, match=r"wrong_shape.*gradient 0 .*\[\].*\[3\]"):
        gc.grad(bad_shape, x)


def test_the_dot_dump_draws_each_composite_as_a_labelled_cluster():
    pytest.importorskip("pydot", reason="DOT dumps need the viz extra")
    x, y, loss = _lse_graph()
    gc.grad(loss, [x])
    text = gc.to_dot(loss.graph, stage="backward")
    assert 'label="custom_gradient logsumexp"' in text
    assert 'label="custom_gradient logsumexp (backward)"' in text
