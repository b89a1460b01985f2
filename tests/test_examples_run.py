"""Every example runs at small sizes and does what it claims: losses fall,
the recovered matrix and weights match the known truth, the demo's
compiled step agrees with the reference interpreter.

The examples compile with `gc.compile(..., target="cpu")`, so this also
runs each through the whole pipeline and Numba.
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

import gradcompiler as gc

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture(scope="module", autouse=True)
def examples_on_path():
    sys.path.insert(0, str(EXAMPLES))
    yield
    sys.path.remove(str(EXAMPLES))


def _example(name: str):
    return importlib.import_module(name)


def _fell(losses: list[float], factor: float) -> bool:
    """The mean of the last few losses is below `factor` times the mean of the first few."""
    k = max(1, len(losses) // 10)
    return np.mean(losses[-k:]) < factor * np.mean(losses[:k])


def test_demo(tmp_path):
    result = _example("demo").main(steps=8, batch=32, features=24, hidden=16, classes=4, lr=0.3,
                                   dot_path=str(tmp_path / "mlp_step.dot"), verbose=False)
    assert result["reference_error"] < 1e-4
    assert result["losses"][-1] < result["losses"][0]
    assert isinstance(result["report"], str) and result["report"].strip()
    assert (tmp_path / "mlp_step.dot").read_text().lstrip().startswith(("digraph", "strict digraph"))


def test_mlp_training():
    result = _example("mlp_training").main(steps=60, batch=64, features=32, hidden=32, classes=4,
                                           lr=0.2, verbose=False)
    assert _fell(result["losses"], 0.6)
    assert result["accuracy_after"] > max(0.6, result["accuracy_before"] + 0.3)


def test_attention_block():
    result = _example("attention_block").main(steps=200, batch=8, seq=8, dim=8, verbose=False)
    assert _fell(result["losses"], 0.2)


def test_layernorm_gelu():
    result = _example("layernorm_gelu").main(steps=150, rows=64, dim=8, hidden=16, verbose=False)
    assert _fell(result["losses"], 0.1)


def test_embedding_lookup():
    result = _example("embedding_lookup").main(steps=40, vocab=50, lookups=256, dim=4, verbose=False)
    assert result["repeated_ids"] > 0
    assert _fell(result["losses"], 1e-3)
    assert result["frequent_row_error"] < 1e-3


def test_spatial_transformer_recovers_the_matrix():
    example = _example("spatial_transformer")
    result = example.main(steps=150, batch=4, channels=1, size=16, verbose=False)
    truth, found = result["true_matrix"], result["recovered_matrix"]
    # the truth is 1.05 × a 6° rotation about the centre (7.5, 7.5), then a shift of (1.5, -1)
    linear = truth[:, :2].astype(np.float64)
    np.testing.assert_allclose(linear @ linear.T, 1.05**2 * np.eye(2), atol=1e-6)
    assert np.degrees(np.arctan2(linear[1, 0], linear[0, 0])) == pytest.approx(6.0, abs=1e-4)
    np.testing.assert_allclose(truth @ np.array([7.5, 7.5, 1.0]), [9.0, 6.5], atol=1e-5)
    start_error = np.abs(truth - np.array([[1, 0, 0], [0, 1, 0]])).max()
    assert start_error > 1.0  # the shift alone is 2 px: there was something to recover
    np.testing.assert_allclose(found[:, :2], truth[:, :2], atol=0.01)
    np.testing.assert_allclose(found[:, 2], truth[:, 2], atol=0.05)
    assert _fell(result["losses"], 1e-3)


def test_super_resolution_learns_the_inverse_mixing():
    result = _example("super_resolution").main(steps=150, batch=2, height=4, width=4, channels=2,
                                               verbose=False)
    assert _fell(result["losses"], 1e-3)
    assert result["weight_error"] < 0.01


def test_custom_gradients_give_what_their_backward_defines():
    example = _example("custom_gradients")
    x, _, grads = example.build(rows=3, columns=4, bound=0.5)
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((3, 4)), "r": rng.standard_normal((3, 4)) * 2}
    z = 3.0 * feeds["x"]
    softmax = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
    # straight through ×4 then /4: r; clipped 3r; d lse(3x) = 3·softmax(3x)
    expected = [feeds["r"], np.clip(3.0 * feeds["r"], -0.5, 0.5), 3.0 * softmax]
    for got in (gc.evaluate(grads, feeds), gc.compile(grads)(**feeds)):
        for g, e in zip(got, expected):
            np.testing.assert_allclose(g, e, rtol=1e-12, atol=1e-15)
    assert example.main(verbose=False)["check"].ok


def test_cnn_digits():
    """One epoch on scikit-learn's digits (the `examples` extra): the loss falls and the
    held-out accuracy is far above chance."""
    result = _example("cnn_digits").main(epochs=1, verbose=False)
    assert _fell(result["losses"], 0.5)
    assert result["accuracy"] > 0.5


def test_onnx_finetune(tmp_path):
    losses = _example("onnx_finetune").main(steps=30, out=str(tmp_path))
    assert _fell(losses, 0.5)
    dot = (tmp_path / "backward.dot").read_text()
    assert dot.startswith("digraph") and "backward" in dot
