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

`updates` adds state that is not trained: each named input (batch norm's running
statistics) is fed from the state and its new value donated back to it.

On target "cuda" `init` puts the state on the device and it stays there; a
step copies only the batch up and the loss down. On the CPU its arrays start on
a pair of cache lines, as the runtime's own do (`buffers.empty`): the
update reads and writes every one of them, 512-bit vectors at a time.

`update_step(param types, optimizer)` compiles the update alone, fed the
gradients by name: the half of a step that runs after gradients computed
elsewhere are combined (data-parallel training sums every shard's before one
update, `gradcompiler.distributed`). A TrainStep or UpdateStep pickles as its
executable (`gradcompiler.compile`: the graph and the options travel, the
receiving process compiles) and the optimizer; a state is plain arrays.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .api import grad
from .backends.numba_cpu import buffers
from .compile import compile as compile_step
from .errors import FeedError, GraphError
from .frontend.sources import input as feed
from .frontend.sources import param
from .frontend.tensor import Tensor
from .ir import Graph, TensorType, call_site
from .optim import SCALAR_DTYPE, Optimizer, UpdateInputs

STEP = "step"
LR = "lr"


def _slot_key(param: str, slot: str) -> str:
    return f"{param}.{slot}"


def _grad_key(param: str) -> str:
    """The feed of a parameter's gradient in an update step."""
    return f"{param}.grad"


class _OptimizerStep:
    """What a training step and an update step share: the state (parameters, optimizer slots,
    step count) they own and update in place, and the learning rate as a feed. Both pickle as
    their executable (which compiles again where it is unpickled) and their description."""

    def __init__(self, executable, optimizer: Optimizer, params: Sequence[str],
                 types: Mapping[str, Any], target: str, buffers: Sequence[str] = ()):
        self.executable = executable
        self.optimizer = optimizer
        self.target = target
        self.state_names = list(types)
        self.types = dict(types)
        self.param_names = list(params)
        self.buffer_names = list(buffers)  # updated inputs (train_step's `updates`)
        self._lr_value: float | None = None
        self._lr = np.zeros((), SCALAR_DTYPE)
        if target == "cuda":
            from numba import cuda

            self._lr = cuda.to_device(self._lr)

    def __reduce__(self):
        return type(self), (self.executable, self.optimizer, self.param_names, self.types,
                            self.target, self.buffer_names)

    def init(self, values: Mapping[str, Any]) -> dict[str, Any]:
        """A fresh state: a copy of each parameter's and updated input's initial value (`values`
        by name), zeros for every optimizer slot, and the step count 0."""
        given = [*self.param_names, *self.buffer_names]
        missing = sorted(set(given) - set(values))
        if missing:
            raise FeedError(f"train_step.init: no initial value for {missing}")
        state = {}
        for name, t in self.types.items():
            if name in given and np.shape(values[name]) != t.shape:
                raise FeedError(f"train_step.init: '{name}' has shape {np.shape(values[name])}, "
                                f"expected {t.shape}")
            state[name] = buffers.empty(t.size, t.dtype, label=f"state '{name}'").reshape(t.shape)
            state[name][...] = values[name] if name in given else 0
        if self.target == "cuda":
            from numba import cuda

            state = {name: cuda.to_device(value) for name, value in state.items()}
        return state

    def _run(self, state: dict[str, Any], lr: float | None, feeds: Mapping[str, Any]):
        """The executable's outputs on `feeds` and the state; every state array updated."""
        missing = sorted(set(self.state_names) - set(state))
        if missing:
            raise FeedError(f"train_step: the state lacks {missing}; make it with step.init(values)")
        self._set_lr(self.optimizer.lr if lr is None else float(lr))
        return self.executable({**feeds, **{name: state[name] for name in self.state_names},
                                LR: self._lr})

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


class TrainStep(_OptimizerStep):
    """A compiled training step (module docstring). `executable` is the `gc.compile` result,
    with its report, DOT dump and memory plan; `state_names` the keys of a state."""

    def __call__(self, state: dict[str, Any], lr: float | None = None, **data: Any) -> float:
        """One step on the batch `data`; every array of `state` is updated in place; the loss
        (computed with the parameters before the update)."""
        clash = sorted(set(data) & set(self.state_names) | ({LR} & set(data)))
        if clash:
            raise FeedError(f"train_step: {clash} are state (or lr= for the learning rate), "
                            "not data of the batch")
        loss = self._run(state, lr, data)[0]
        return float(loss.copy_to_host() if self.target == "cuda" else loss)


class UpdateStep(_OptimizerStep):
    """The optimizer's update alone (`update_step`): the second half of a training step, for
    callers that compute the gradients elsewhere, as data-parallel training sums every
    shard's gradients before one update."""

    def __call__(self, state: dict[str, Any], grads: Mapping[str, Any],
                 lr: float | None = None) -> None:
        """Update every array of `state` in place with `grads` (by parameter name)."""
        missing = sorted(set(self.param_names) - set(grads))
        if missing:
            raise FeedError(f"update_step: no gradient for parameter(s) {missing}")
        self._run(state, lr, {_grad_key(name): grads[name] for name in self.param_names})


def checked_params(loss: Tensor, params) -> list[Tensor]:
    """`params` (one gc.param Tensor or several) checked as the trainable floats of `loss`'s
    graph; a list."""
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
               memory_budget: float | int | None = None,
               updates: Mapping[str, Tensor] | None = None, **compile_options: Any) -> TrainStep:
    """Compile the training step of the scalar `loss` over `params` (gc.param Tensors) with
    `optimizer` (`gc.optim`) for `target`; `memory_budget` (bytes, or a fraction of the
    default plan's peak) and `compile_options` go to `gc.compile`.

    `updates` maps the name of an input of the graph to its new value, a Tensor of the same
    type: state that is not trained but changes each step, as batch norm's running
    statistics. Such an input joins the state (`init` takes its first value) and is
    updated in place as the parameters are."""
    params = checked_params(loss, params)
    if not isinstance(optimizer, Optimizer):
        raise GraphError(f"train_step: optimizer must be a gc.optim optimizer, got "
                         f"{type(optimizer).__name__}", site=call_site())
    updated = _checked_updates(loss, updates, [p.node.name for p in params])
    graph = loss.graph.copy()
    loss = Tensor(graph, loss.id)
    params = [Tensor(graph, p.id) for p in params]
    names = [p.node.name for p in params]
    taken = sorted(set(_state_feeds(names, optimizer)) & set(graph.feed_names))
    if taken:
        raise GraphError(f"train_step: the feed name(s) {taken} are the training state's; rename "
                         "those inputs", site=call_site())
    buffers = {name: Tensor(graph, value.id) for name, value in updated.items()}
    grads = grad(loss, params)
    executable, types = _compiled_update(graph, dict(zip(names, params)), dict(zip(names, grads)),
                                         optimizer, [loss], buffers, target=target,
                                         memory_budget=memory_budget, **compile_options)
    return TrainStep(executable, optimizer, names, types, target, buffers=list(buffers))


def _checked_updates(loss: Tensor, updates: Mapping[str, Tensor] | None,
                     params: Sequence[str]) -> dict[str, Tensor]:
    """`updates` checked: each key names an input of `loss`'s graph that is not a parameter,
    each value is a Tensor of that graph with the input's shape and dtype."""
    if updates is None:
        return {}
    if not isinstance(updates, Mapping):
        raise GraphError(f"train_step: updates must map input names to Tensors, got "
                         f"{type(updates).__name__}", site=call_site())
    graph = loss.graph
    for name, value in updates.items():
        nid = graph.feed_names.get(name)
        if nid is None or name in params:
            kind = "a parameter" if name in params else "no input of the graph"
            raise GraphError(f"train_step: updates[{name!r}]: {name!r} is {kind}; updates name "
                             "the inputs whose new values the step writes back", site=call_site())
        if not isinstance(value, Tensor) or value.graph is not graph:
            raise GraphError(f"train_step: updates[{name!r}] must be a Tensor of the loss's graph",
                             site=call_site())
        want = graph[nid].type
        if (value.shape, value.dtype) != (want.shape, want.dtype):
            raise GraphError(f"train_step: updates[{name!r}] is {value.dtype}{list(value.shape)}, but "
                             f"input {name!r} is {want.dtype}{list(want.shape)}", site=call_site())
    return dict(updates)


def _state_feeds(names: Sequence[str], optimizer: Optimizer) -> list[str]:
    """The feeds an update adds for parameters `names`: lr, the step count, every slot."""
    return [STEP, LR, *(_slot_key(n, s) for n in names for s in optimizer.slot_names)]


def _compiled_update(graph, params: Mapping[str, Tensor], grads: Mapping[str, Tensor],
                     optimizer: Optimizer, outputs: list[Tensor], buffers: Mapping[str, Tensor] | None = None,
                     **compile_options: Any):
    """Compile `outputs` and `optimizer`'s update of `params` from `grads` (nodes of `graph`),
    and the new values of the inputs `buffers` names, each new value donated to the feed it
    replaces; (executable, state types by name)."""
    names = list(params)
    with graph, graph.building("backward"):
        lr, count = feed(LR, (), SCALAR_DTYPE), feed(STEP, (), SCALAR_DTYPE)
        slots = {n: {s: feed(_slot_key(n, s), p.shape, p.dtype) for s in optimizer.slot_names}
                 for n, p in params.items()}
        step_number = count + 1.0
        new = optimizer.update(dict(params), dict(grads), UpdateInputs(lr, step_number, slots))
    outputs, donate = list(outputs), {}
    for name in names:
        for key, value in [(name, new[name]["param"]),
                           *((_slot_key(name, s), new[name][s]) for s in optimizer.slot_names),
                           *([(STEP, step_number)] if name == names[-1] else [])]:
            donate[len(outputs)] = key
            outputs.append(value)
    for key, value in (buffers or {}).items():
        donate[len(outputs)] = key
        outputs.append(value)
    executable = compile_step(outputs, donate=donate, **compile_options)
    types = {key: graph[graph.feed_names[key]].type for key in donate.values()}
    return executable, types


def update_step(params: Mapping[str, TensorType], optimizer: Optimizer, target: str = "cpu",
                **compile_options: Any) -> UpdateStep:
    """Compile `optimizer`'s update alone for parameters of the given types (by name): a
    state as `gc.train_step`'s, updated in place from gradients passed by name."""
    if not isinstance(optimizer, Optimizer):
        raise GraphError(f"update_step: optimizer must be a gc.optim optimizer, got "
                         f"{type(optimizer).__name__}", site=call_site())
    if not params:
        raise GraphError("update_step: no parameters to update", site=call_site())
    with Graph("update") as graph:
        tensors = {name: param(name, t.shape, t.dtype) for name, t in params.items()}
        grads = {name: feed(_grad_key(name), t.shape, t.dtype) for name, t in params.items()}
    executable, types = _compiled_update(graph, tensors, grads, optimizer, [], target=target,
                                         **compile_options)
    return UpdateStep(executable, optimizer, list(params), types, target)
