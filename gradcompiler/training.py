"""`gc.train_step`: forward, backward and the optimizer's update compiled as one program.

    step = gc.train_step(loss, [w1, b1, w2, b2], gc.optim.AdamW(1e-3))
    state = step.init({"w1": w1_0, ...})        # parameters, optimizer slots, step count
    for x, y in batches:
        loss_value = step(state, x=x, y=y)        # updates every array of `state` in place
        loss_value = step(state, lr=1e-4, x=x, y=y)   # a schedule: lr is a feed

The step's graph is a copy of the loss's graph (the user's graph is left as it
was) to which `gc.grad` adds the gradients and the optimizer its update. Every
slot and the step count become feeds named `<param>.<slot>` and `step`, the
learning rate a feed `lr`, and every new value an output donated to the feed it
replaces (`gc.compile(donate=...)`), so the state's arrays are the executable's
own buffers: a call allocates nothing proportional to the parameters and copies
nothing; `state` holds the same arrays before and after.

On target "cuda" `init` puts the state on the device and it stays there; a
step copies only the batch up and the loss down.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from .api import grad
from .compile import compile as compile_step
from .errors import FeedError, GraphError
from .frontend.sources import input as feed
from .frontend.tensor import Tensor
from .ir import call_site
from .optim import SCALAR_DTYPE, Optimizer, UpdateInputs

STEP = "step"
LR = "lr"


def _slot_key(param: str, slot: str) -> str:
    return f"{param}.{slot}"


class TrainStep:
    """A compiled training step (module docstring). `executable` is the `gc.compile` result,
    with its report, DOT dump and memory plan; `state_names` the keys of a state."""

    def __init__(self, executable, optimizer: Optimizer, params: Sequence[str],
                 types: Mapping[str, Any], target: str):
        self.executable = executable
        self.optimizer = optimizer
        self.target = target
        self.state_names = list(types)
        self._types = dict(types)
        self._params = list(params)
        self._lr_value: float | None = None
        self._lr = np.zeros((), SCALAR_DTYPE)
        if target == "cuda":
            from numba import cuda

            self._lr = cuda.to_device(self._lr)

    def init(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """A fresh state: a copy of each parameter's initial value (`values` by name), zeros for
        every optimizer slot, and the step count 0."""
        missing = sorted(set(self._params) - set(values))
        if missing:
            raise FeedError(f"train_step.init: no initial value for parameter(s) {missing}")
        state = {}
        for name, t in self._types.items():
            if name not in self._params:
                state[name] = np.zeros(t.shape, t.dtype)
                continue
            value = np.asarray(values[name])
            if value.shape != t.shape:
                raise FeedError(f"train_step.init: '{name}' has shape {value.shape}, expected {t.shape}")
            state[name] = np.array(value, dtype=t.dtype, order="C")
        if self.target == "cuda":
            from numba import cuda

            state = {name: cuda.to_device(value) for name, value in state.items()}
        return state

    def __call__(self, state: dict[str, Any], lr: float | None = None, **data: Any) -> float:
        """One step on the batch `data`; every array of `state` is updated in place; the loss
        (computed with the parameters before the update)."""
        clash = sorted(set(data) & set(self.state_names) | ({LR} & set(data)))
        if clash:
            raise FeedError(f"train_step: {clash} are state (or lr= for the learning rate), "
                            "not data of the batch")
        missing = sorted(set(self.state_names) - set(state))
        if missing:
            raise FeedError(f"train_step: the state lacks {missing}; make it with step.init(values)")
        self._set_lr(self.optimizer.lr if lr is None else float(lr))
        feeds = {**data, **{name: state[name] for name in self.state_names}, LR: self._lr}
        loss = self.executable(feeds)[0]
        return float(loss.copy_to_host() if self.target == "cuda" else loss)

    def _set_lr(self, lr: float) -> None:
        """The lr feed's array, written only when the value changes (on the device: one copy)."""
        if lr == self._lr_value:
            return
        if self.target == "cuda":
            self._lr.copy_to_device(np.array(lr, SCALAR_DTYPE))
        else:
            self._lr[...] = lr
        self._lr_value = lr

    def report(self) -> str:
        return self.executable.report()

    def to_dot(self, path=None, stage: str = "optimised") -> str:
        return self.executable.to_dot(path, stage)


def _checked_params(loss: Tensor, params) -> list[Tensor]:
    if not isinstance(loss, Tensor):
        raise GraphError(f"train_step: loss must be a Tensor, got {type(loss).__name__}", site=call_site())
    params = [params] if isinstance(params, Tensor) else list(params)
    for p in params:
        if not isinstance(p, Tensor) or p.graph is not loss.graph or p.node.role != "param":
            raise GraphError("train_step: every parameter must be a gc.param of the loss's graph",
                             site=call_site())
        if p.dtype.kind != "f":
            raise GraphError(f"train_step: parameter '{p.node.name}' is {p.dtype}; only float "
                             "parameters are trained", site=call_site())
    if not params:
        raise GraphError("train_step: no parameters to train", site=call_site())
    return params


def train_step(loss: Tensor, params, optimizer: Optimizer, target: str = "cpu",
               memory_budget: float | int | None = None, **compile_options: Any) -> TrainStep:
    """Compile the training step of the scalar `loss` over `params` (gc.param Tensors) with
    `optimizer` (`gc.optim`) for `target`; `memory_budget` (bytes, or a fraction of the
    default plan's peak) and `compile_options` go to `gc.compile`."""
    params = _checked_params(loss, params)
    if not isinstance(optimizer, Optimizer):
        raise GraphError(f"train_step: optimizer must be a gc.optim optimizer, got "
                         f"{type(optimizer).__name__}", site=call_site())
    graph = loss.graph.copy()
    loss = Tensor(graph, loss.id)
    params = [Tensor(graph, p.id) for p in params]
    names = [p.node.name for p in params]
    taken = sorted({STEP, LR, *(_slot_key(n, s) for n in names for s in optimizer.slot_names)}
                   & set(graph.feed_names))
    if taken:
        raise GraphError(f"train_step: the feed name(s) {taken} are the training state's; rename "
                         "those inputs", site=call_site())
    grads = grad(loss, params)
    with graph, graph.building("backward"):
        lr, count = feed(LR, (), SCALAR_DTYPE), feed(STEP, (), SCALAR_DTYPE)
        slots = {n: {s: feed(_slot_key(n, s), p.shape, p.dtype) for s in optimizer.slot_names}
                 for n, p in zip(names, params)}
        step_number = count + 1.0
        new = optimizer.update(dict(zip(names, params)), dict(zip(names, grads)),
                               UpdateInputs(lr, step_number, slots))
    outputs, donate = [loss], {}
    for name in names:
        for key, value in [(name, new[name]["param"]),
                           *((_slot_key(name, s), new[name][s]) for s in optimizer.slot_names),
                           *([(STEP, step_number)] if name == names[-1] else [])]:
            donate[len(outputs)] = key
            outputs.append(value)
    executable = compile_step(outputs, target=target, donate=donate, memory_budget=memory_budget,
                              **compile_options)
    types = {key: graph[graph.feed_names[key]].type for key in donate.values()}
    return TrainStep(executable, optimizer, names, types, target)
