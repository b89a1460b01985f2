"""CustomGradient's forward: the identity on its last input (the composite's value), whatever
the arguments and residuals before it; its type is that value's."""

from __future__ import annotations

import numpy as np

import gradcompiler as gc
from gradcompiler.ir import TensorType
from gradcompiler.ops.custom import CustomGradient

from oracle import assert_close

COVERS = {"CustomGradient"}


def _backward(g, residual):
    return [g * residual, None]


def test_forward_is_the_composites_value():
    op = CustomGradient(_backward, "scaled", arguments=2, residuals=1)
    a, b, r, value = (np.arange(6.0).reshape(2, 3) + k for k in range(4))
    assert_close(op.reference(a, b, r, value), value, rtol=0.0)
    types = [TensorType((2, 3), np.dtype("float32"))] * 3 + [TensorType((4,), np.dtype("float64"))]
    assert op.infer(*types) == types[-1]


def test_evaluated_and_compiled_like_its_value():
    @gc.custom_gradient
    def doubled(x):
        return x * 2.0, lambda g: [g * 2.0]

    with gc.Graph("g"):
        x = gc.param("x", (2, 3), "float64")
        y = doubled(x) + 1.0
    value = np.arange(6.0).reshape(2, 3)
    assert_close(gc.evaluate(y, {"x": value}), value * 2.0 + 1.0, rtol=0.0)
    assert_close(gc.compile(y)(x=value), value * 2.0 + 1.0, rtol=0.0)
