"""GELU and its gradient at ±inf and NaN agree on every target, and equal their limits.

GELU(a) = a·Φ(a) and GELU_GRAD(a, g) = g·(Φ(a) + a·φ(a)) written literally give
−inf·0 = NaN at a = −inf and inf·0 = NaN in a·φ(a) at ±inf, while the functions
have limits there: GELU(−inf) = −0, GELU(inf) = inf, Φ + a·φ → 0 at −inf and
1 at inf. Random-graph fuzzing with infinite feeds found the compiled CPU
code returning the limits and the reference and CUDA code returning NaN; all
three now return the limits. Oracle: those limits, by hand; NaN stays NaN.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc

# the last five: an infinite g times the factor's limit (0 at -inf and wherever Φ + a·φ
# underflows float32, 1 at inf): NaN for inf·0, found by the fuzz as gelu_grad(-inf, -inf) = inf
X = np.array([-np.inf, np.inf, np.nan, -60.0, 60.0, 0.5, -np.inf, -np.inf, np.inf, -20.0, 60.0],
             np.float32)
G = np.array([2.0, 3.0, 1.0, 1.0, 5.0, 1.0, -np.inf, np.inf, -np.inf, np.inf, np.inf], np.float32)
GELU = np.array([-0.0, np.inf, np.nan, -0.0, 60.0, 0.5 * 0.6914624612740131,
                 -0.0, -0.0, np.inf, -0.0, 60.0], np.float32)
GELU_GRAD = np.array([0.0, 3.0, np.nan, 0.0, 5.0, 0.6914624612740131 + 0.5 * 0.3520653267642995,
                      np.nan, np.nan, -np.inf, np.nan, np.inf], np.float32)


def _outputs():
    with gc.Graph("gelu_limits"):
        x, g = gc.input("x", X.shape), gc.input("g", G.shape)
        return [gc.gelu(x), gc.elemwise("GELU_GRAD", x, g)]


@pytest.mark.parametrize("target", ["reference", "cpu", "cuda"])
def test_gelu_and_its_gradient_take_their_limits(target):
    outputs, feeds = _outputs(), dict(x=X, g=G)
    if target == "reference":
        got = gc.evaluate(outputs, feeds)
    else:
        step = gc.compile(outputs, target=target)
        got = step(**feeds, to_host=True) if target == "cuda" else step(**feeds)
    np.testing.assert_allclose(got[0], GELU, rtol=1e-6, atol=1e-30, equal_nan=True)
    np.testing.assert_allclose(got[1], GELU_GRAD, rtol=1e-6, atol=1e-30, equal_nan=True)
    assert np.signbit(got[0][0]), "gelu(-inf) is -0, the limit from below"
