"""`DataParallel`: `gc.train_step` on N Ray workers, each on a shard of the global batch.

    dp = DataParallel(loss, params, gc.optim.AdamW(1e-3), workers=4)   # was gc.train_step(...)
    state = dp.init(values)
    for x, y in batches:
        loss_value = dp(state, x=x, y=y)        # x, y: the global batch, split along axis 0

The step is split in two halves, because the gradients of every shard must be
summed between them:

1. gradients: on the driver, the loss's forward graph is re-specialised to each
   shard's size (`shard.specialise`; at most two sizes, as the last shards of
   an uneven batch are one sample shorter), differentiated and compiled
   (`gc.compile([loss, *grads])`), which checks it once, where errors reach the
   user, and fills the kernel cache;
2. update: `gc.training.update_step`, the optimizer's update alone, fed the
   summed gradients; the parameters and slots are its donated state.

Each worker is a Ray actor (`Replica`) given both compiled halves; they travel
pickled as their graph and compile options and compile again in the worker,
where the on-disk kernel cache of the same machine leaves Numba nothing to
compile (a custom gradient's callable is not shipped: its backward is already
nodes of the graph). The state is built once by the driver and broadcast as one
object of Ray's store; afterwards only shards, gradient chunks and losses move.

A step: the driver splits the batch into shards (`numpy.array_split` sizes);
worker k computes its shard's mean loss L_k and gradients G_k and scales them
by b_k / B; a ring all-reduce (`allreduce`) sums the scaled gradients, so each
worker holds Σ_k (b_k / B)·G_k, the gradient of the mean loss over the whole
batch; each worker applies the same update to the same state, and the driver
returns Σ_k (b_k / B)·L_k. The loss must therefore be a mean over the samples
(gc.mean, cross_entropy's default): a sum, or a division by a Python number
that stands for the batch size, cannot be told from the graph. For the same
reason a custom gradient's backward must be linear in its incoming gradient
(as a VJP is): one that clips it sees each shard's gradient at the 1/b_k scale
of the shard's mean, not 1/B, and clips other values than one process would.

A worker applies its update inside the ring's last round, which depends on
every other worker's chunks: if one worker dies, no survivor applies that
step. The trainer then raises WorkerLostError naming the worker and the step,
and refuses later steps. It does not restart the worker: a death after the
last chunk left it but before its own update would leave survivors a step
ahead, so a restart needs a per-step checkpoint, a copy of the state every step;
training resumes from a saved state through a new DataParallel instead.
Ray 2.60 itself can abort the driver when a worker dies while ring tasks for it
wait on their arguments (a reference-counting check in its core worker,
ray-project/ray#55134); a death between steps is told as WorkerLostError.

Every `check_every` steps the workers hash their state (parameters, slots,
step count) and the driver compares the digests: the ring makes replicas
bitwise equal, so any difference is a fault (ReplicaDivergedError names the
replicas).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from .. import training
from ..api import grad
from ..compile import compile as compile_step
from ..errors import BackendUnavailableError, FeedError, ReplicaDivergedError, WorkerLostError
from ..frontend.tensor import Tensor
from ..optim import Optimizer
from .allreduce import RingMember, ring_allreduce
from .shard import batch_size, data_feeds, shard_sizes, specialise, split_batch


def require_ray():
    """The `ray` module, or an error that says how to install it."""
    try:
        import ray
    except ImportError:
        raise BackendUnavailableError(
            "data-parallel training runs on Ray, which is not installed here: "
            "pip install 'gradcompiler[distributed]'") from None
    return ray


class Replica(RingMember):
    """A worker's side: its shard's gradient step, the update step, and a replica of the
    state. Run as a Ray actor; its methods are the driver's protocol."""

    def __init__(self, rank: int, members: int, gradients, update, weight: float):
        super().__init__(rank, members)
        self.gradients, self.update, self.weight = gradients, update, weight
        self.params = update.param_names
        self.state: dict[str, np.ndarray] = {}
        self._lr: float | None = None
        self._layout = [(name, update.types[name].shape, update.types[name].dtype)
                        for name in self.params]

    def load(self, state: Mapping[str, np.ndarray]) -> None:
        """Own copies of `state` (the broadcast's arrays are the store's, read-only)."""
        self.state = {name: np.array(value, order="C") for name, value in state.items()}

    def fetch(self, names=None) -> dict[str, np.ndarray]:
        return {name: self.state[name] for name in names or self.state}

    def checksum(self) -> str:
        digest = hashlib.blake2b(digest_size=16)
        for name in sorted(self.state):
            digest.update(name.encode())
            digest.update(np.ascontiguousarray(self.state[name]).tobytes())
        return digest.hexdigest()

    def compute(self, shard: Mapping[str, np.ndarray], lr: float | None):
        """This shard's mean loss and gradients, scaled by its share of the batch; (loss,
        the ring's first chunk). A ring of one applies the update at once."""
        loss, *grads = self.gradients({**shard, **{p: self.state[p] for p in self.params}})
        dtype = np.result_type(*(dtype for _, _, dtype in self._layout))
        vector = np.concatenate([np.asarray(g, dtype).ravel() for g in grads]) * self.weight
        self._lr = lr
        first = self.ring_begin(vector)
        if self.members == 1:
            self._apply()
        return float(loss) * self.weight, first

    def ring_receive(self, round_: int, chunk: np.ndarray) -> np.ndarray | None:
        outgoing = super().ring_receive(round_, chunk)
        if outgoing is None:
            self._apply()
        return outgoing

    def _apply(self) -> None:
        grads, offset = {}, 0
        for name, shape, dtype in self._layout:
            size = int(np.prod(shape))
            grads[name] = self.reduced[offset:offset + size].reshape(shape).astype(dtype)
            offset += size
        self.update(self.state, grads, self._lr)


class ReplicatedState(Mapping):
    """The driver's handle on the replicas' state: keys as `gc.train_step`'s state; reading a
    key fetches it from replica 0 (all are equal)."""

    def __init__(self, trainer: DataParallel, generation: int):
        self._trainer, self.generation = trainer, generation

    def __getitem__(self, name: str) -> np.ndarray:
        if name not in self._trainer.state_names:
            raise KeyError(name)
        return self.arrays([name])[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._trainer.state_names)

    def __len__(self) -> int:
        return len(self._trainer.state_names)

    def arrays(self, names=None) -> dict[str, np.ndarray]:
        """Copies of the state's arrays (`names`, or all), from replica 0."""
        ray = require_ray()
        return self._trainer._guarded(lambda: ray.get(self._trainer.workers[0].fetch.remote(names)))


class DataParallel:
    """`gc.train_step(loss, params, optimizer, target)` on `workers` Ray actors (module
    docstring). `check_every`: steps between replica checksums (0: never); `worker_options`:
    Ray actor options (`num_cpus`, `runtime_env`, ...); `compile_options` go to `gc.compile`.
    Starts a local Ray instance if none is running."""

    def __init__(self, loss: Tensor, params, optimizer: Optimizer, workers: int = 2,
                 target: str = "cpu", check_every: int = 50,
                 worker_options: Mapping[str, Any] | None = None, **compile_options: Any):
        ray = require_ray()
        params = training.checked_params(loss, params)
        self.feeds = data_feeds(loss.graph, loss.graph.ancestors([loss.id]))
        self.batch = batch_size(self.feeds)
        self.sizes = shard_sizes(self.batch, workers)
        self.check_every = int(check_every)
        self.update = training.update_step({p.node.name: p.type for p in params}, optimizer,
                                           target)
        self.state_names = self.update.state_names
        self.gradient_bytes = sum(p.type.nbytes for p in params)
        steps = {size: self._gradient_step(loss, params, size, target, compile_options)
                 for size in sorted(set(self.sizes))}
        if not ray.is_initialized():
            ray.init()
        actor = ray.remote(Replica).options(**dict(worker_options or {}))
        self.workers = [actor.remote(k, workers, steps[size], self.update, size / self.batch)
                        for k, size in enumerate(self.sizes)]
        self.steps_done = 0
        self.timings: dict[str, float] = {}
        self._generation = 0
        self._lost: WorkerLostError | None = None

    def _gradient_step(self, loss: Tensor, params, size: int, target: str, options):
        """The compiled loss and gradients of a shard of `size` samples."""
        graph = specialise(loss.graph, [loss.id, *(p.id for p in params)], self.batch, size)
        shard_loss = Tensor(graph, loss.id)
        shard_params = [Tensor(graph, p.id) for p in params]
        return compile_step([shard_loss, *grad(shard_loss, shard_params)], target=target,
                            **options)

    def init(self, values: Mapping[str, Any]) -> ReplicatedState:
        """A fresh state, as `gc.train_step`'s `init` makes it, broadcast to every replica."""
        ray = require_ray()
        state = ray.put(self.update.init(values))
        self._guarded(lambda: ray.get([w.load.remote(state) for w in self.workers]))
        self._generation += 1
        self.steps_done = 0
        return ReplicatedState(self, self._generation)

    def __call__(self, state: ReplicatedState, lr: float | None = None, **data: Any) -> float:
        """One step on the global batch `data` (split along axis 0); every replica's state is
        updated; the mean loss over the batch, with the parameters before the update."""
        ray = require_ray()
        if not isinstance(state, ReplicatedState) or state._trainer is not self \
                or state.generation != self._generation:
            raise FeedError("data-parallel step: the state must be the one this trainer's "
                            "latest init(values) returned")
        shards = split_batch(data, self.feeds, self.sizes)
        lr = self.update.optimizer.lr if lr is None else float(lr)
        start = time.perf_counter()

        def step():
            started = [w.compute.options(num_returns=2).remote(shard, lr)
                       for w, shard in zip(self.workers, shards)]
            done = ring_allreduce(self.workers, [first for _, first in started],
                                  lambda w, r, chunk: w.ring_receive.remote(r, chunk))
            losses = ray.get([loss for loss, _ in started])
            reduced = time.perf_counter()
            ray.get(done)
            return losses, reduced

        losses, reduced = self._guarded(step, during=f"step {self.steps_done + 1}")
        self.steps_done += 1
        self.timings = {"gradients": reduced - start,
                        "allreduce": time.perf_counter() - reduced}
        if self.check_every and self.steps_done % self.check_every == 0:
            self.check()
        return float(sum(losses))

    def check(self) -> None:
        """Compare the replicas' state digests; ReplicaDivergedError if any differs."""
        ray = require_ray()
        digests = self._guarded(lambda: ray.get([w.checksum.remote() for w in self.workers]),
                                during=f"the replica check after step {self.steps_done}")
        odd = [k for k, d in enumerate(digests) if d != digests[0]]
        if odd:
            raise ReplicaDivergedError(
                f"data-parallel replicas diverged by step {self.steps_done}: the state of "
                f"worker(s) {odd} differs from worker 0's (checksums {digests})")

    def _guarded(self, call, during: str = "a call"):
        """`call()`, with the death of a worker told as WorkerLostError (and remembered: a
        trainer that lost a worker runs no further step)."""
        ray = require_ray()
        if self._lost is not None:
            raise self._lost
        try:
            return call()
        except ray.exceptions.RayActorError as err:
            dead = self._dead_workers()
            who = f"worker {dead[0]}" if len(dead) == 1 else f"workers {dead}"
            self._lost = WorkerLostError(
                f"data-parallel {who} of {len(self.workers)} died during {during} "
                f"({type(err).__name__}); this trainer runs no further step: build a new "
                "DataParallel and init it from saved parameters")
            raise self._lost from err

    def _dead_workers(self) -> list[int]:
        ray = require_ray()
        dead = []
        for k, worker in enumerate(self.workers):
            try:
                ray.get(worker.checksum.remote(), timeout=60)
            except ray.exceptions.RayActorError:
                dead.append(k)
        return dead

    def shutdown(self) -> None:
        """End the worker actors (the Ray instance stays)."""
        ray = require_ray()
        for worker in self.workers:
            ray.kill(worker)
        self.workers = []
