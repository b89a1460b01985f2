"""Train a small CNN on scikit-learn's handwritten digits and report held-out accuracy.

The data: the 1,797 real 8×8 grey-level digit images that ship inside
scikit-learn (`sklearn.datasets.load_digits`; `pip install -e '.[examples]'`),
80% for training, a held-out 20% for testing. The model:

    conv3×3(1→16) + batch norm + ReLU → max-pool 2×2
    conv3×3(16→32) + batch norm + ReLU → adaptive average pool to 2×2 → linear(128→10)

Two compiled executables: the training step returns the loss, every gradient
and the batch norms' updated running statistics; the evaluation graph runs
batch norm in inference mode on those statistics. Adam updates the weights
in numpy.

    python examples/cnn_digits.py
"""

from __future__ import annotations

import math
import time

import numpy as np

import gradcompiler as gc

SHAPES = {"c1_w": (16, 1, 3, 3), "c1_gamma": (16,), "c1_beta": (16,),
          "c2_w": (32, 16, 3, 3), "c2_gamma": (32,), "c2_beta": (32,),
          "fc_w": (128, 10), "fc_b": (10,)}
RUNNING = {"c1_mean": 16, "c1_var": 16, "c2_mean": 32, "c2_var": 32}


def build(batch: int, training: bool):
    """The network on a batch of (batch, 1, 8, 8) images: (loss or logits, params, extras).

    Training: extras are the updated running statistics; evaluation: the logits."""
    with gc.Graph("cnn_digits_train" if training else "cnn_digits_eval"):
        x = gc.input("x", (batch, 1, 8, 8))
        p = {name: gc.param(name, shape) for name, shape in SHAPES.items()}
        running = {name: gc.input(name, (size,)) for name, size in RUNNING.items()}
        updates = []

        def conv_bn_relu(h, layer):
            z = gc.conv2d(h, p[f"{layer}_w"], padding=1)
            stats = (running[f"{layer}_mean"], running[f"{layer}_var"])
            out = gc.batch_norm(z, p[f"{layer}_gamma"], p[f"{layer}_beta"], *stats,
                                training=training)
            if training:
                out, mean, var = out
                updates.extend([mean, var])
            return gc.relu(out)

        h = gc.max_pool2d(conv_bn_relu(x, "c1"), 2)
        h = gc.adaptive_avg_pool2d(conv_bn_relu(h, "c2"), 2)
        logits = h.reshape(batch, 128) @ p["fc_w"] + p["fc_b"]
        if not training:
            return gc.compile(logits, target="cpu")
        labels = gc.input("labels", (batch,), "int32")
        loss = gc.cross_entropy(logits, labels)
        grads = gc.grad(loss, list(p.values()))
        return gc.compile([loss, *grads, *updates], target="cpu")


def load(seed: int) -> tuple[np.ndarray, ...]:
    """(train x, train labels, test x, test labels): a shuffled 80/20 split, pixels in [0, 1]."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    x = (digits.images / 16.0).astype(np.float32)[:, None]
    labels = digits.target.astype(np.int32)
    order = np.random.default_rng(seed).permutation(len(x))
    cut = int(0.8 * len(x))
    train, test = order[:cut], order[cut:]
    return x[train], labels[train], x[test], labels[test]


def init(rng: np.random.Generator) -> dict[str, np.ndarray]:
    weights = {}
    for name, shape in SHAPES.items():
        if name.endswith("_w"):
            fan_in = math.prod(shape[1:]) if len(shape) == 4 else shape[0]
            weights[name] = (rng.standard_normal(shape) * math.sqrt(2 / fan_in)).astype(np.float32)
        else:
            weights[name] = np.full(shape, 1.0 if name.endswith("gamma") else 0.0, np.float32)
    return weights


class Adam:
    def __init__(self, weights: dict[str, np.ndarray], lr: float):
        self.lr, self.t = lr, 0
        self.m = {k: np.zeros_like(v) for k, v in weights.items()}
        self.v = {k: np.zeros_like(v) for k, v in weights.items()}

    def update(self, weights: dict[str, np.ndarray], grads: dict[str, np.ndarray]) -> None:
        self.t += 1
        scale = self.lr * math.sqrt(1 - 0.999 ** self.t) / (1 - 0.9 ** self.t)
        for k, g in grads.items():
            self.m[k] = 0.9 * self.m[k] + 0.1 * g
            self.v[k] = 0.999 * self.v[k] + 0.001 * g * g
            weights[k] -= scale * self.m[k] / (np.sqrt(self.v[k]) + 1e-8)


def main(epochs: int = 6, batch: int = 32, lr: float = 0.01, seed: int = 0,
         verbose: bool = True) -> dict:
    """Train; return the per-step losses, the test accuracy and the seconds taken."""
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    x_train, y_train, x_test, y_test = load(seed)
    train_step, evaluate = build(batch, training=True), build(len(x_test), training=False)
    weights = init(rng)
    running = {k: np.full(n, 1.0 if k.endswith("var") else 0.0, np.float32)
               for k, n in RUNNING.items()}
    adam = Adam(weights, lr)
    losses = []
    for epoch in range(epochs):
        order = rng.permutation(len(x_train))
        for first in range(0, len(order) - batch + 1, batch):
            rows = order[first:first + batch]
            loss, *rest = train_step(x=x_train[rows], labels=y_train[rows], **weights, **running)
            adam.update(weights, dict(zip(SHAPES, rest[:len(SHAPES)])))
            running = dict(zip(RUNNING, rest[len(SHAPES):]))
            losses.append(float(loss))
        if verbose:
            print(f"epoch {epoch + 1:2d}: mean loss {np.mean(losses[-len(order) // batch:]):.4f}")
    logits = evaluate(x=x_test, **weights, **running)
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    seconds = time.perf_counter() - start
    if verbose:
        print(f"test accuracy {accuracy:.2%} on {len(y_test)} held-out digits "
              f"({seconds:.1f} s, compile included)")
    return {"losses": losses, "accuracy": accuracy, "seconds": seconds}


if __name__ == "__main__":
    main()
