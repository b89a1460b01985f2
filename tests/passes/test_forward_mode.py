"""`gc.jvp` as compiled code: what it costs, that it runs on both targets, and what it refuses.

The values of every op's JVP are checked against finite differences in
tests/hardening/test_forward_mode_every_op.py; here the question is whether linearise-and-
transpose leaves backward-sized work in the compiled program (it must cost about one
forward pass on top of the primal values it needs) and whether it refuses what it cannot
transpose.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc

from helpers import mlp_step
from oracle import assert_close


def _mlp_feeds(step, rng, dtype="float32"):
    feeds = {p.name: (rng.standard_normal(p.shape) * 0.3).astype(dtype) for p in step.params}
    feeds["x"] = rng.standard_normal((8, 12)).astype(dtype)
    feeds["labels"] = rng.integers(0, 4, 8).astype("int32")
    return feeds


def _sensitivity(dtype="float32"):
    """The mlp's loss and its tangent along a direction of the input x (fed as `vx`)."""
    step = mlp_step(dtype=dtype)
    with step.graph:
        vx = gc.input("vx", (8, 12), dtype)
    x = gc.Tensor(step.graph, step.graph.feed_names["x"])
    return step, gc.jvp(step.loss, x, vx)


def test_compiled_jvp_costs_at_most_twice_the_forward():
    """A forward-mode product recomputes the primal values it needs and carries one tangent
    through the same ops: about two forward passes. Anything backward-sized left over by the
    transposition (the first sweep's weight gradients, say) would show in both counts."""
    step, tangent = _sensitivity()
    forward = gc.compile(step.loss)
    jvp = gc.compile(tangent)
    forward_flops = sum(k.flops for k in forward.kernels)
    jvp_flops = sum(k.flops for k in jvp.kernels)
    assert len(jvp.kernels) <= 2 * len(forward.kernels), (jvp.report(), forward.report())
    assert jvp_flops <= 2 * forward_flops, (jvp_flops, forward_flops)
    grads = gc.compile(step.outputs)  # the reverse-mode step, for scale: the JVP is cheaper
    assert jvp_flops < sum(k.flops for k in grads.kernels)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_compiled_jvp_equals_the_reference(target):
    step, tangent = _sensitivity("float64")
    rng = np.random.default_rng(5)
    feeds = {**_mlp_feeds(step, rng, "float64"), "vx": rng.standard_normal((8, 12))}
    expected = gc.evaluate(tangent, feeds)
    executable = gc.compile([step.loss, tangent], target=target)
    got = executable(**feeds, to_host=True) if target == "cuda" else executable(**feeds)
    assert_close(np.asarray(got[1]), expected, rtol=1e-10)
    h = 1e-6  # and the tangent is the loss's directional derivative
    plus = gc.evaluate(step.loss, {**feeds, "x": feeds["x"] + h * feeds["vx"]})
    minus = gc.evaluate(step.loss, {**feeds, "x": feeds["x"] - h * feeds["vx"]})
    assert_close(expected, (plus - minus) / (2 * h), rtol=1e-6, atol=1e-9)


def test_jvp_of_an_output_the_tangents_do_not_reach_is_zero():
    with gc.Graph("g"):
        a = gc.param("a", (3,), "float64")
        b = gc.param("b", (3,), "float64")
        ya, yb = gc.exp(a), gc.sin(b)
    ta, tb = gc.jvp([ya, yb], a, np.ones(3))
    got_a, got_b = gc.evaluate([ta, tb], {"a": np.arange(3.0), "b": np.arange(3.0)})
    assert_close(got_a, np.exp(np.arange(3.0)), rtol=1e-12)
    assert_close(got_b, np.zeros(3), rtol=0.0)


def test_jvp_checks_its_tangents():
    with gc.Graph("g"):
        x = gc.param("x", (3, 2), "float64")
        y = gc.tanh(x)
    with pytest.raises(gc.NotDifferentiableError, match="tangent .*3, 2"):
        gc.jvp(y, x, np.ones((2, 3)))
    with pytest.raises(gc.GraphError, match="1 wrt tensors but 2 tangents"):
        gc.jvp(y, [x], [np.ones((3, 2)), np.ones((3, 2))])


def test_jvp_refuses_a_custom_backward_that_is_not_linear_in_its_cotangent():
    """A clipped gradient is no linear map, so it has no transpose: the product would depend
    on the cotangent it was built with. The refusal names the composite."""

    @gc.custom_gradient
    def clipped(x):
        return x * 1.0, lambda g: [gc.minimum(gc.maximum(g, -0.5), 0.5)]

    @gc.custom_gradient
    def straight_through(x):
        return gc.round(x), lambda g: [g]

    with gc.Graph("g"):
        x = gc.param("x", (4,), "float64")
        y = clipped(x * 2.0)
        z = straight_through(x * 2.0)
    with pytest.raises(gc.NotDifferentiableError, match="custom_gradient 'clipped' is not linear"):
        gc.jvp(y, x, np.ones(4))
    tangent = gc.evaluate(gc.jvp(z, x, np.arange(4.0)), {"x": np.linspace(-1, 1, 4)})
    assert_close(tangent, 2.0 * np.arange(4.0), rtol=1e-12)  # the transpose of the identity backward
