"""A self-attention block learns to imitate a fixed "teacher" block.

    Q = x Wq,  K = x Wk,  V = x Wv,  P = softmax(Q Kᵀ / √d),  out = P V

The student starts from small random projections and follows the gradient
of the mean squared error between its output and the teacher's, on fresh
random sequences each step. The compiled training step (`gc.train_step`
with SGD) returns the loss and updates the three projections in place; the
backward runs through both batched matmuls and the stable softmax.

    python examples/attention_block.py
"""

from __future__ import annotations

import math

import numpy as np
from distill import distill

import gradcompiler as gc

NAMES = ("wq", "wk", "wv")


def build_attention_step(batch: int, seq: int, dim: int):
    """(loss, projections) of mse(attention(x; Wq, Wk, Wv), target)."""
    with gc.Graph("attention_block"):
        x = gc.input("x", (batch, seq, dim))
        target = gc.input("target", (batch, seq, dim))
        wq, wk, wv = (gc.param(name, (dim, dim)) for name in NAMES)
        q, k, v = x @ wq, x @ wk, x @ wv
        scores = gc.matmul(q, gc.swapaxes(k, 1, 2)) / math.sqrt(dim)
        out = gc.matmul(gc.softmax(scores, axis=-1), v)
        loss = gc.mse(out, target)
    return loss, [wq, wk, wv]


def attention_numpy(x: np.ndarray, wq: np.ndarray, wk: np.ndarray, wv: np.ndarray) -> np.ndarray:
    """The teacher's forward pass, in numpy."""
    q, k, v = x @ wq, x @ wk, x @ wv
    s = q @ k.transpose(0, 2, 1) / math.sqrt(x.shape[-1])
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return (e / e.sum(axis=-1, keepdims=True)) @ v


def main(steps: int = 300, batch: int = 16, seq: int = 32, dim: int = 16, lr: float = 0.5,
         seed: int = 0, verbose: bool = True) -> dict:
    """Train the student; return its loss history."""
    rng = np.random.default_rng(seed)
    loss, projections = build_attention_step(batch, seq, dim)
    teacher = [(rng.standard_normal((dim, dim)) / math.sqrt(dim)).astype(np.float32) for _ in NAMES]
    student = {name: (0.1 * rng.standard_normal((dim, dim)) / math.sqrt(dim)).astype(np.float32)
               for name in NAMES}
    return distill(loss, projections, student, lambda: rng.standard_normal((batch, seq, dim)).astype(np.float32),
                   lambda x: attention_numpy(x, *teacher), steps, lr, verbose)


if __name__ == "__main__":
    main()
