"""The training loop the teacher–student examples share: the student's
parameters follow plain SGD until its outputs match a fixed teacher's.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

import gradcompiler as gc


def distill(loss: gc.Tensor, params: list[gc.Tensor], student: dict[str, np.ndarray],
            batch: Callable[[], np.ndarray], teacher: Callable[[np.ndarray], np.ndarray],
            steps: int, lr: float, verbose: bool) -> dict:
    """Compile the SGD training step of `loss` (of inputs x and target) over `params`, start
    it from the `student` values and run `steps` steps on fresh batches labelled by
    `teacher`; return the loss history and the trained values."""
    step = gc.train_step(loss, params, gc.optim.SGD(lr), target="cpu")
    state = step.init(student)
    history = []
    for i in range(steps):
        x = batch()
        history.append(step(state, x=x, target=teacher(x).astype(np.float32)))
        if verbose and (i % max(1, steps // 10) == 0 or i == steps - 1):
            print(f"step {i:4d}  mse {history[-1]:.5f}")
    return dict(losses=history, params={p.name: state[p.name] for p in params})
