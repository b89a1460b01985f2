"""Train a small CNN on scikit-learn's handwritten digits and report held-out accuracy.

The data: the 1,797 real 8×8 grey-level digit images that ship inside
scikit-learn (`sklearn.datasets.load_digits`; `pip install -e '.[examples]'`),
80% for training, a held-out 20% for testing. The model:

    conv3×3(1→16) + batch norm + ReLU → max-pool 2×2
    conv3×3(16→32) + batch norm + ReLU → adaptive average pool to 2×2 → linear(128→10)

Two compiled executables: the training step (`gc.train_step`: forward,
backward and Adam's update in one program) updates the weights, Adam's
moments and the batch norms' running statistics in place; the evaluation
graph runs batch norm in inference mode on those statistics.

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


def build(batch: int, training: bool, lr: float = 0.01):
    """The network on a batch of (batch, 1, 8, 8) images: the training step (Adam at `lr`,
    the running statistics updated as state) or the evaluation's compiled logits."""
    with gc.Graph("cnn_digits_train" if training else "cnn_digits_eval"):
        x = gc.input("x", (batch, 1, 8, 8))
        p = {name: gc.param(name, shape) for name, shape in SHAPES.items()}
        running = {name: gc.input(name, (size,)) for name, size in RUNNING.items()}
        updates = {}

        def conv_bn_relu(h, layer):
            z = gc.conv2d(h, p[f"{layer}_w"], padding=1)
            stats = (running[f"{layer}_mean"], running[f"{layer}_var"])
            out = gc.batch_norm(z, p[f"{layer}_gamma"], p[f"{layer}_beta"], *stats,
                                training=training)
            if training:
                out, updates[f"{layer}_mean"], updates[f"{layer}_var"] = out
            return gc.relu(out)

        h = gc.max_pool2d(conv_bn_relu(x, "c1"), 2)
        h = gc.adaptive_avg_pool2d(conv_bn_relu(h, "c2"), 2)
        logits = h.reshape(batch, 128) @ p["fc_w"] + p["fc_b"]
        if not training:
            return gc.compile(logits, target="cpu")
        labels = gc.input("labels", (batch,), "int32")
        loss = gc.cross_entropy(logits, labels)
        return gc.train_step(loss, list(p.values()), gc.optim.Adam(lr), updates=updates)


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


def main(epochs: int = 6, batch: int = 32, lr: float = 0.01, seed: int = 0,
         verbose: bool = True) -> dict:
    """Train; return the per-step losses, the test accuracy and the seconds taken."""
    start = time.perf_counter()
    rng = np.random.default_rng(seed)
    x_train, y_train, x_test, y_test = load(seed)
    train_step, evaluate = build(batch, training=True, lr=lr), build(len(x_test), training=False)
    running = {k: np.full(n, 1.0 if k.endswith("var") else 0.0, np.float32)
               for k, n in RUNNING.items()}
    state = train_step.init({**init(rng), **running})
    losses = []
    for epoch in range(epochs):
        order = rng.permutation(len(x_train))
        for first in range(0, len(order) - batch + 1, batch):
            rows = order[first:first + batch]
            losses.append(train_step(state, x=x_train[rows], labels=y_train[rows]))
        if verbose:
            print(f"epoch {epoch + 1:2d}: mean loss {np.mean(losses[-len(order) // batch:]):.4f}")
    logits = evaluate(x=x_test, **{k: state[k] for k in (*SHAPES, *RUNNING)})
    accuracy = float(np.mean(np.argmax(logits, axis=1) == y_test))
    seconds = time.perf_counter() - start
    if verbose:
        print(f"test accuracy {accuracy:.2%} on {len(y_test)} held-out digits "
              f"({seconds:.1f} s, compile included)")
    return {"losses": losses, "accuracy": accuracy, "seconds": seconds}


if __name__ == "__main__":
    main()
