"""The training loop the teacher–student examples share: the student's
parameters follow plain SGD until its outputs match a fixed teacher's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np


def distill(step, student: dict[str, np.ndarray], names, batch: Callable[[], np.ndarray],
            teacher: Callable[[np.ndarray], np.ndarray], steps: int, lr: float,
            verbose: bool) -> dict:
    """Run `steps` SGD steps of the compiled `step` (loss, then one gradient per name in
    `names`) on fresh batches labelled by `teacher`; return the loss history."""
    history = []
    for i in range(steps):
        x = batch()
        loss_value, *grad_values = step(x=x, target=teacher(x).astype(np.float32), **student)
        for name, g in zip(names, grad_values):
            student[name] -= lr * g
        history.append(float(loss_value))
        if verbose and (i % max(1, steps // 10) == 0 or i == steps - 1):
            print(f"step {i:4d}  mse {history[-1]:.5f}")
    return dict(losses=history)
