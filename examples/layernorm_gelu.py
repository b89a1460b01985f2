"""A pre-norm feed-forward block (layer_norm → matmul → gelu_tanh → matmul,
plus the residual) learns to imitate a fixed teacher block.

    y = x + gelu_tanh(layer_norm(x)·γ + β) W1) W2

layer_norm and gelu_tanh are composites of primitive ops, so their
gradients come from the rule table of those primitives; the compiled SGD
training step (`gc.train_step`) returns the loss and updates γ, β, W1 and W2
in place.

    python examples/layernorm_gelu.py
"""

from __future__ import annotations

import math

import numpy as np
from distill import distill

import gradcompiler as gc

NAMES = ("gamma", "beta", "w1", "w2")


def build_block_step(rows: int, dim: int, hidden: int):
    with gc.Graph("layernorm_gelu_block"):
        x = gc.input("x", (rows, dim))
        target = gc.input("target", (rows, dim))
        gamma, beta = gc.param("gamma", (dim,)), gc.param("beta", (dim,))
        w1, w2 = gc.param("w1", (dim, hidden)), gc.param("w2", (hidden, dim))
        h = gc.layer_norm(x, gamma, beta, axis=-1, eps=1e-5)
        y = x + gc.gelu_tanh(h @ w1) @ w2
        loss = gc.mse(y, target)
    return loss, [gamma, beta, w1, w2]


def block_numpy(x: np.ndarray, gamma, beta, w1, w2) -> np.ndarray:
    """The teacher's forward pass, in numpy."""
    centred = x - x.mean(axis=-1, keepdims=True)
    h = centred / np.sqrt((centred * centred).mean(axis=-1, keepdims=True) + 1e-5) * gamma + beta
    u = h @ w1
    return x + 0.5 * u * (1 + np.tanh(math.sqrt(2 / math.pi) * (u + 0.044715 * (u * u * u)))) @ w2


def init(rng: np.random.Generator, dim: int, hidden: int, scale: float) -> dict:
    return dict(gamma=(1 + scale * rng.standard_normal(dim)).astype(np.float32),
                beta=(scale * rng.standard_normal(dim)).astype(np.float32),
                w1=(rng.standard_normal((dim, hidden)) / math.sqrt(dim)).astype(np.float32),
                w2=(scale * rng.standard_normal((hidden, dim)) / math.sqrt(hidden)).astype(np.float32))


def main(steps: int = 300, rows: int = 256, dim: int = 32, hidden: int = 64, lr: float = 0.5,
         seed: int = 0, verbose: bool = True) -> dict:
    """Train the student block; return its loss history."""
    rng = np.random.default_rng(seed)
    loss, params = build_block_step(rows, dim, hidden)
    teacher = init(rng, dim, hidden, scale=1.0)
    student = init(rng, dim, hidden, scale=0.1)
    return distill(loss, params, student, lambda: rng.standard_normal((rows, dim)).astype(np.float32),
                   lambda x: block_numpy(x, **teacher), steps, lr, verbose)


if __name__ == "__main__":
    main()
