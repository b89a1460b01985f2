"""Custom gradients: three composites whose backward is written by hand (`gc.custom_gradient`).

1. straight-through rounding (quantisation-aware training): round forward, identity backward;
2. gradient clipping inside the graph: identity forward, the backward clips g to [-c, c];
3. a stable log-sum-exp whose backward reads its own output (a residual): g·exp(x - y).

Each is differentiated, compiled for the CPU and checked against the gradient its backward
defines, written here in numpy; the last is also the true gradient, which check_grads
confirms once told to compare a custom gradient (it refuses by default).

    python examples/custom_gradients.py
"""

from __future__ import annotations

import numpy as np

import gradcompiler as gc


@gc.custom_gradient
def ste_round(x):
    """round(x), with the gradient of the identity: quantise the forward, train through it."""
    return gc.round(x), lambda g: [g]


@gc.custom_gradient
def clip_gradient(x, bound: float):
    """x unchanged; the gradient that reaches x is clipped to [-bound, bound]."""
    return x, lambda g: [gc.minimum(gc.maximum(g, -bound), bound)]


@gc.custom_gradient
def logsumexp(x):
    """log Σ exp(x) over the last axis, shifted by its max; backward g·softmax(x) = g·exp(x - y)."""
    shift = gc.stop_gradient(x.max(axis=-1, keepdims=True))
    y = gc.log(gc.exp(x - shift).sum(axis=-1, keepdims=True)) + shift
    return y, lambda g, x, y: [g * gc.exp(x - y)], (x, y)


def build(rows: int = 4, columns: int = 6, bound: float = 0.5):
    """A graph using all three; returns the param x, the three outputs and their gradients."""
    with gc.Graph("custom_gradients"):
        x = gc.param("x", (rows, columns), "float64")
        r = gc.input("r", (rows, columns), "float64")
        quantised = ste_round(x * 4.0) / 4.0
        clipped = clip_gradient(x, bound)
        lse = logsumexp(x * 3.0)
    grads = [gc.grad((quantised * r).sum(), x), gc.grad((clipped * r * 3.0).sum(), x),
             gc.grad(lse.sum(), x)]
    return x, [quantised, clipped, lse], grads


def defined_gradients(x: np.ndarray, r: np.ndarray, bound: float = 0.5) -> list[np.ndarray]:
    """What the three backward functions define, in numpy: r (the identity's, through the
    ·4 and /4), clip(3r, ±bound), and 3·softmax(3x)."""
    z = 3.0 * x
    softmax = np.exp(z - z.max(axis=-1, keepdims=True))
    softmax /= softmax.sum(axis=-1, keepdims=True)
    return [r, np.clip(3.0 * r, -bound, bound), 3.0 * softmax]


def main(verbose: bool = True) -> dict:
    rng = np.random.default_rng(0)
    x, outputs, grads = build()
    feeds = {"x": rng.standard_normal((4, 6)), "r": rng.standard_normal((4, 6))}
    expected = defined_gradients(feeds["x"], feeds["r"])
    reference = gc.evaluate(grads, feeds)
    compiled = gc.compile(grads, target="cpu")(**feeds)
    errors = {name: max(float(np.abs(got - want).max()) for got in (ref, comp))
              for name, want, ref, comp in zip(("ste_round", "clip_gradient", "logsumexp"),
                                               expected, reference, compiled)}
    report = gc.check_grads(outputs[2], x, feeds, custom_gradients="check")
    if verbose:
        for name, error in errors.items():
            print(f"{name:>14}: reference and compiled gradients within {error:.1e} of its backward")
        print(f"logsumexp's hand-written backward against finite differences:\n{report}")
    return {"errors": errors, "check": report}


if __name__ == "__main__":
    main()
