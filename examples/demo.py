"""The tour (`make demo`): the benchmark MLP, from graph to trained weights.

1. build the forward graph of benchmarks.md's MLP (256×784 inputs, two
   hidden layers of 512, 10 classes, mean softmax cross-entropy);
2. compile its training step with `gc.train_step`: the differentiation pass
   (the rule table builds the backward), the SGD update, the optimisation
   passes and Numba, one CPU executable that updates the parameters in place;
3. run one step and check it against the numpy reference interpreter: the
   loss, and each parameter against θ − lr·∂loss/∂θ from the reference's
   gradients;
4. train a few more steps on synthetic data and watch the loss go down;
5. dump the optimised graph to DOT and print what the compiler did.

    python examples/demo.py [--steps N] [--dot mlp_step.dot]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mlp_training import build_mlp, class_centres, init_params, make_batch

import gradcompiler as gc


def main(steps: int = 20, batch: int = 256, features: int = 784, hidden: int = 512,
         classes: int = 10, lr: float = 0.1, dot_path: str | None = "mlp_step.dot",
         verbose: bool = True) -> dict:
    """Run the tour; return the losses, the reference check's error and the report text."""
    say = print if verbose else (lambda *args: None)
    rng = np.random.default_rng(0)

    start = time.perf_counter()
    graph, loss, params = build_mlp(batch, features, hidden, classes)
    say(f"1.   built '{graph.name}': {len(graph)} nodes ({time.perf_counter() - start:.2f} s)")

    start = time.perf_counter()
    step = gc.train_step(loss, params, gc.optim.SGD(lr), target="cpu")
    say(f"2.   compiled the training step for the CPU ({time.perf_counter() - start:.2f} s)")

    initial = init_params(rng, features, hidden, classes)
    state = step.init(initial)
    centres = class_centres(rng, classes, features)
    x, labels = make_batch(rng, centres, batch)
    first_loss = step(state, x=x, labels=labels)
    want_loss, *grads = gc.evaluate([loss, *gc.grad(loss, params)], x=x, labels=labels, **initial)
    error = abs(first_loss - float(want_loss)) / abs(float(want_loss))
    for p, g in zip(params, grads):
        want = initial[p.name] - lr * g
        error = max(error, float(np.max(np.abs(state[p.name] - want)) / np.max(np.abs(want))))
    say(f"3.   loss {first_loss:.4f}; loss and updated parameters vs the reference interpreter: "
        f"largest relative difference {error:.2e}")

    losses = [first_loss]
    for _ in range(steps - 1):
        x, labels = make_batch(rng, centres, batch)
        losses.append(step(state, x=x, labels=labels))
    say(f"4.   {steps} SGD steps: loss {losses[0]:.4f} → {losses[-1]:.4f}")

    if dot_path:
        step.to_dot(dot_path)
        say(f"5.   optimised graph written to {dot_path}")
    report = step.report()
    say(report)
    return dict(losses=losses, reference_error=error, report=report)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20, help="SGD steps (default 20)")
    parser.add_argument("--dot", default="mlp_step.dot", help="where to write the DOT dump")
    args = parser.parse_args()
    main(steps=args.steps, dot_path=args.dot)
