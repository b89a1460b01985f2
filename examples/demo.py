"""The tour (`make demo`): the benchmark MLP, from graph to trained weights.

1. build the forward graph of benchmarks.md's MLP (256×784 inputs, two
   hidden layers of 512, 10 classes, mean softmax cross-entropy);
2. differentiate it with `gc.grad` (the rule table builds the backward);
3. compile loss and gradients into one CPU executable (passes + Numba);
4. run it, and check it against the numpy reference interpreter;
5. train a few SGD steps on synthetic data and watch the loss go down;
6. dump the optimised graph to DOT and print what the compiler did.

    python examples/demo.py [--steps N] [--dot mlp_step.dot]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mlp_training import build_mlp_step, class_centres, init_params, make_batch, sgd_step

import gradcompiler as gc


def main(steps: int = 20, batch: int = 256, features: int = 784, hidden: int = 512,
         classes: int = 10, lr: float = 0.1, dot_path: str | None = "mlp_step.dot",
         verbose: bool = True) -> dict:
    """Run the tour; return the losses, the reference check's error and the report text."""
    say = print if verbose else (lambda *args: None)
    rng = np.random.default_rng(0)

    start = time.perf_counter()
    graph, loss, params, grads = build_mlp_step(batch, features, hidden, classes)
    say(f"1-2. built and differentiated '{graph.name}': {len(graph)} nodes "
        f"({time.perf_counter() - start:.2f} s)")

    start = time.perf_counter()
    step = gc.compile([loss, *grads], target="cpu")
    say(f"3.   compiled for the CPU ({time.perf_counter() - start:.2f} s)")

    weights = init_params(rng, features, hidden, classes)
    centres = class_centres(rng, classes, features)
    x, labels = make_batch(rng, centres, batch)
    feeds = dict(x=x, labels=labels, **weights)
    compiled = step(**feeds)
    reference = gc.evaluate([loss, *grads], feeds)
    error = max(float(np.max(np.abs(c - r)) / (np.max(np.abs(r)) + 1e-30))
                for c, r in zip(compiled, reference))
    say(f"4.   loss {float(compiled[0]):.4f}; compiled vs reference interpreter: "
        f"largest relative difference {error:.2e}")

    losses = []
    for _ in range(steps):
        losses.append(sgd_step(step, weights, *make_batch(rng, centres, batch), lr))
    say(f"5.   {steps} SGD steps: loss {losses[0]:.4f} → {losses[-1]:.4f}")

    if dot_path:
        gc.to_dot(step, dot_path)
        say(f"6.   optimised graph written to {dot_path}")
    report = step.report()
    say(report)
    return dict(losses=losses, reference_error=error, report=report)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="SGD steps (default 20)")
    parser.add_argument("--dot", default="mlp_step.dot", help="where to write the DOT dump")
    args = parser.parse_args()
    main(steps=args.steps, dot_path=args.dot)
