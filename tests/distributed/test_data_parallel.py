"""DataParallel on a local Ray instance of 2 CPUs against one process running gc.train_step
on the whole batch: the same losses and state after 10 steps (float64 to 1e-12, float32 to
1e-5) with uneven shards; a replica whose state is corrupted is caught by the checksum; a
killed worker stops training with an error naming it and the step; bad input is refused."""

from __future__ import annotations

import time

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.distributed import DataParallel
from gradcompiler.errors import ReplicaDivergedError, ShardError, WorkerLostError

from oracle import assert_close

STEPS = 10


def build(batch: int, dtype: str):
    """A two-layer classifier whose first layer gets half its gradient through a custom
    gradient (a lambda: the step travels to the workers without it). Linear in g, as a
    backward must be for shards to add up: a clipped one sees each shard's 1/b scale."""
    @gc.custom_gradient
    def halved(h):
        return h * 1.0, lambda g: [g * 0.5]

    with gc.Graph("dp") as graph:
        x, y = gc.input("x", (batch, 5), dtype), gc.input("y", (batch,), "int32")
        w1, b1 = gc.param("w1", (5, 4), dtype), gc.param("b1", (4,), dtype)
        w2 = gc.param("w2", (4, 3), dtype)
        h = halved(gc.tanh(x @ w1 + b1))
        loss = gc.cross_entropy(h @ w2, y)
    return graph, loss, [w1, b1, w2]


def initial(dtype: str) -> dict:
    rng = np.random.default_rng(7)
    return {"w1": rng.standard_normal((5, 4)).astype(dtype), "b1": np.zeros(4, dtype),
            "w2": rng.standard_normal((4, 3)).astype(dtype)}


def batches(batch: int, dtype: str) -> list[dict]:
    rng = np.random.default_rng(11)
    return [{"x": rng.standard_normal((batch, 5)).astype(dtype),
             "y": rng.integers(0, 3, batch).astype(np.int32)} for _ in range(STEPS)]


def single_process(loss, params, optimizer, dtype: str, data, lrs):
    step = gc.train_step(loss, params, optimizer)
    state = step.init(initial(dtype))
    return [step(state, lr=lr, **b) for lr, b in zip(lrs, data)], state


def check_equal(dp, state, loss, params, optimizer, dtype, batch, rtol):
    data, lrs = batches(batch, dtype), [None, None, 0.02, 0.02, *[None] * (STEPS - 4)]
    got = [dp(state, lr=lr, **b) for lr, b in zip(lrs, data)]
    want, want_state = single_process(loss, params, optimizer, dtype, data, lrs)
    assert_close(np.array(got), np.array(want), rtol=rtol, label="losses")
    for name in want_state:
        assert_close(state[name], want_state[name], rtol=rtol, label=name)


@pytest.fixture(scope="module")
def trainer64(ray_local):
    """3 workers on a batch of 10: shards of 4, 3 and 3 samples; Adam; checked every 5 steps."""
    _graph, loss, params = build(10, "float64")
    dp = DataParallel(loss, params, gc.optim.Adam(0.05), workers=3,
                                     check_every=5)
    yield dp, loss, params
    dp.shutdown()


def test_float64_three_uneven_shards_match_one_process(trainer64):
    dp, loss, params = trainer64
    assert dp.sizes == [4, 3, 3]
    state = dp.init(initial("float64"))
    check_equal(dp, state, loss, params, gc.optim.Adam(0.05), "float64", 10, rtol=1e-12)
    assert dp.steps_done == STEPS and set(dp.timings) == {"gradients", "allreduce"}


def test_a_corrupted_replica_is_caught_by_the_checksum(trainer64, ray_local):
    dp, _loss, _params = trainer64
    state = dp.init(initial("float64"))
    data = batches(10, "float64")
    for b in data[:4]:
        dp(state, **b)
    bad = dict(state.arrays())
    bad["w2"] = bad["w2"].copy()
    bad["w2"][1, 2] += 1e-9
    ray_local.get(dp.workers[2].load.remote(bad))
    with pytest.raises(ReplicaDivergedError, match=r"by step 5: the state of worker\(s\) \[2\]"):
        dp(state, **data[4])


def test_bad_batches_and_worker_counts_are_refused(trainer64):
    dp, loss, params = trainer64
    state = dp.init(initial("float64"))
    b = batches(10, "float64")[0]
    with pytest.raises(gc.FeedError, match=r"'x' has shape \(8, 5\), expected \(10, 5\)"):
        dp(state, x=b["x"][:8], y=b["y"])
    with pytest.raises(gc.FeedError, match="latest init"):
        dp({}, **b)
    with pytest.raises(ShardError, match="workers=11 is more than the batch of 10"):
        DataParallel(loss, params, gc.optim.SGD(0.1), workers=11)


@pytest.fixture(scope="module")
def trainer32(ray_local):
    """2 workers on a batch of 7: shards of 4 and 3; SGD with momentum; float32."""
    _graph, loss, params = build(7, "float32")
    optimizer = gc.optim.SGD(0.1, momentum=0.9, weight_decay=0.01)
    dp = DataParallel(loss, params, optimizer, workers=2, check_every=3)
    yield dp, loss, params, optimizer
    dp.shutdown()


def test_float32_two_uneven_shards_match_one_process(trainer32):
    dp, loss, params, optimizer = trainer32
    assert dp.sizes == [4, 3]
    check_equal(dp, dp.init(initial("float32")), loss, params, optimizer, "float32", 7,
                rtol=1e-5)


def wait_until_dead(ray, actor, seconds: float = 60.0) -> None:
    """Return once the driver knows `actor` is dead. Ray tells it asynchronously: a step
    submitted before then queues ring tasks for the dead worker whose arguments are still
    resolving, and failing those when the news comes trips a reference-counting check in
    Ray 2.60's core worker that aborts the driver, pytest with it (a CI run of 2026-12-02:
    `submitted_task_ref_count > 0` in reference_counter.cc, the double release that
    ray-project/ray#55134 describes for ray.cancel). Tasks for an actor known dead fail when
    submitted, before their arguments resolve."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            ray.get(actor.checksum.remote(), timeout=seconds)
        except ray.exceptions.RayActorError:
            return
        time.sleep(0.05)
    raise AssertionError(f"the killed worker still answers after {seconds} s")


def test_a_killed_worker_stops_training_naming_it_and_the_step(trainer32, ray_local):
    dp, *_ = trainer32
    state = dp.init(initial("float32"))
    data = batches(7, "float32")
    dp(state, **data[0])
    dp(state, **data[1])
    ray_local.kill(dp.workers[1])
    wait_until_dead(ray_local, dp.workers[1])
    with pytest.raises(WorkerLostError, match=r"worker 1 of 2 died during step 3"):
        dp(state, **data[2])
    with pytest.raises(WorkerLostError, match=r"worker 1 of 2 died during step 3"):
        dp(state, **data[3])
