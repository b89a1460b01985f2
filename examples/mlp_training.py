"""Train the benchmark's MLP classifier with plain SGD on synthetic data.

The data: a mixture of Gaussian clusters, one per class, a fresh batch every
step. `gc.train_step` compiles the forward, the backward and the SGD update
into one executable that updates the parameters in place and returns the loss.

    python examples/mlp_training.py
"""

from __future__ import annotations

import math

import numpy as np

import gradcompiler as gc


def build_mlp(batch: int, features: int, hidden: int, classes: int):
    """(graph, loss, params) of relu(x@W1+b1) → relu(·@W2+b2) → ·@W3+b3 and cross-entropy."""
    with gc.Graph("mlp") as graph:
        x = gc.input("x", (batch, features))
        labels = gc.input("labels", (batch,), "int32")
        w1, b1 = gc.param("w1", (features, hidden)), gc.param("b1", (hidden,))
        w2, b2 = gc.param("w2", (hidden, hidden)), gc.param("b2", (hidden,))
        w3, b3 = gc.param("w3", (hidden, classes)), gc.param("b3", (classes,))
        h1 = gc.relu(x @ w1 + b1)
        h2 = gc.relu(h1 @ w2 + b2)
        loss = gc.cross_entropy(h2 @ w3 + b3, labels)
    return graph, loss, [w1, b1, w2, b2, w3, b3]


def init_params(rng: np.random.Generator, features: int, hidden: int, classes: int) -> dict:
    """He-style initial weights, zero biases, float32."""
    shapes = dict(w1=(features, hidden), b1=(hidden,), w2=(hidden, hidden), b2=(hidden,),
                  w3=(hidden, classes), b3=(classes,))
    return {name: (rng.standard_normal(shape) * math.sqrt(2 / shape[0])).astype(np.float32)
            if len(shape) == 2 else np.zeros(shape, np.float32) for name, shape in shapes.items()}


def make_batch(rng: np.random.Generator, centres: np.ndarray, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """(x, labels): each input is its class centre plus unit Gaussian noise."""
    labels = rng.integers(0, len(centres), batch).astype(np.int32)
    x = centres[labels] + rng.standard_normal((batch, centres.shape[1]))
    return x.astype(np.float32), labels


def class_centres(rng: np.random.Generator, classes: int, features: int) -> np.ndarray:
    """Centres far enough apart (in all `features` dimensions together) to be told apart."""
    return rng.standard_normal((classes, features)) * np.sqrt(2.0) / features**0.25


def main(steps: int = 100, batch: int = 256, features: int = 784, hidden: int = 512,
         classes: int = 10, lr: float = 0.1, seed: int = 0, verbose: bool = True) -> dict:
    """Train; return the loss history and the accuracy on a fresh batch before and after."""
    rng = np.random.default_rng(seed)
    _, loss, params = build_mlp(batch, features, hidden, classes)
    step = gc.train_step(loss, params, gc.optim.SGD(lr), target="cpu")
    weights = step.init(init_params(rng, features, hidden, classes))  # updated in place by each step
    centres = class_centres(rng, classes, features)

    def accuracy() -> float:
        x, labels = make_batch(rng, centres, batch)
        z = np.maximum(x @ weights["w1"] + weights["b1"], 0)
        z = np.maximum(z @ weights["w2"] + weights["b2"], 0)
        guess = np.argmax(z @ weights["w3"] + weights["b3"], axis=1)
        return float(np.mean(guess == labels))

    before = accuracy()
    history = []
    for i in range(steps):
        x, labels = make_batch(rng, centres, batch)
        history.append(step(weights, x=x, labels=labels))
        if verbose and (i % max(1, steps // 10) == 0 or i == steps - 1):
            print(f"step {i:4d}  loss {history[-1]:.4f}")
    after = accuracy()
    if verbose:
        print(f"accuracy on fresh data: {before:.1%} before, {after:.1%} after")
    return dict(losses=history, accuracy_before=before, accuracy_after=after)


if __name__ == "__main__":
    main()
