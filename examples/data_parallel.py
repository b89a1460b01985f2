"""Train the mlp example on 2 local Ray workers, and check it against one process.

    python examples/data_parallel.py                  # train, print both loss histories
    python examples/data_parallel.py --bench          # samples/s and all-reduce time, 1 and 2
                                                      # workers, and the projection table of
                                                      # docs/scaling.md from the measured figures

The single-process script becomes data-parallel by one line: `gc.train_step(loss, params,
opt)` becomes `DataParallel(loss, params, opt, workers=2)`; `init` and the calls stay.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

import gradcompiler as gc
from gradcompiler.distributed import DataParallel

sys.path.insert(0, str(Path(__file__).resolve().parent))
from mlp_training import build_mlp, class_centres, init_params, make_batch


def _model(batch, features, hidden, classes):
    _, loss, params = build_mlp(batch, features, hidden, classes)
    return loss, params


def _worker_options(workers: int) -> dict:
    """One share of the machine's cores per worker, so that N workers' Numba threads do not
    outnumber the cores."""
    threads = max(1, (os.cpu_count() or 1) // workers)
    return {"runtime_env": {"env_vars": {"NUMBA_NUM_THREADS": str(threads)}}}


def main(steps: int = 30, batch: int = 256, features: int = 784, hidden: int = 512,
         classes: int = 10, lr: float = 0.1, workers: int = 2, seed: int = 0,
         verbose: bool = True) -> dict:
    """Train with SGD in one process and on `workers` Ray workers from the same start on the
    same batches; both loss histories and their largest relative difference."""
    rng = np.random.default_rng(seed)
    loss, params = _model(batch, features, hidden, classes)
    values = init_params(rng, features, hidden, classes)
    centres = class_centres(rng, classes, features)
    data = [dict(zip(("x", "labels"), make_batch(rng, centres, batch))) for _ in range(steps)]

    step = gc.train_step(loss, params, gc.optim.SGD(lr))
    state = step.init(values)
    single = [step(state, **b) for b in data]

    dp = DataParallel(loss, params, gc.optim.SGD(lr), workers=workers,
                      worker_options=_worker_options(workers))
    replicated = dp.init(values)
    parallel = [dp(replicated, **b) for b in data]
    dp.shutdown()
    worst = float(np.max(np.abs(np.subtract(parallel, single)) / np.abs(single)))
    if verbose:
        for i in range(0, steps, max(1, steps // 10)):
            print(f"step {i:4d}  loss {single[i]:.6f} (1 process)  {parallel[i]:.6f} "
                  f"({workers} workers)")
        print(f"largest relative difference of the losses: {worst:.1e}")
    return {"single": single, "parallel": parallel, "worst_relative_difference": worst}


def bench(worker_counts=(1, 2), steps: int = 20, batch: int = 256, features: int = 784,
          hidden: int = 512, classes: int = 10) -> list[dict]:
    """Samples/s and the time from the last shard's gradients to the last replica's update
    (the all-reduce and the update) per step, for each worker count."""
    rng = np.random.default_rng(0)
    loss, params = _model(batch, features, hidden, classes)
    values = init_params(rng, features, hidden, classes)
    centres = class_centres(rng, classes, features)
    data = [dict(zip(("x", "labels"), make_batch(rng, centres, batch))) for _ in range(4)]
    rows = []
    for workers in worker_counts:
        dp = DataParallel(loss, params, gc.optim.SGD(0.01), workers=workers, check_every=0,
                          worker_options=_worker_options(workers))
        state = dp.init(values)
        for b in data[:2]:  # warm-up: first calls touch every buffer
            dp(state, **b)
        gradients = allreduce = 0.0
        start = time.perf_counter()
        for i in range(steps):
            dp(state, **data[i % len(data)])
            gradients += dp.timings["gradients"]
            allreduce += dp.timings["allreduce"]
        elapsed = time.perf_counter() - start
        dp.shutdown()
        rows.append({"workers": workers, "samples_per_s": batch * steps / elapsed,
                     "step_ms": 1e3 * elapsed / steps, "gradients_ms": 1e3 * gradients / steps,
                     "allreduce_ms": 1e3 * allreduce / steps,
                     "gradient_bytes": dp.gradient_bytes, "batch": batch})
    return rows


def projection(compute_s: float, gradient_bytes: int, batch: int,
               worker_counts=(8, 64, 512), gbits=(10, 100, 400),
               latency_s: float = 20e-6) -> list[dict]:
    """Throughput of N workers of `batch` samples each (weak scaling): each step computes for
    `compute_s`, then ring-all-reduces the gradients, 2(N−1)/N · bytes per worker at the link's
    bandwidth plus 2(N−1) messages of `latency_s`, with no overlap."""
    rows = []
    for n in worker_counts:
        for gb in gbits:
            ring = 2 * (n - 1) / n * gradient_bytes / (gb * 1e9 / 8) + 2 * (n - 1) * latency_s
            rows.append({"workers": n, "gbits": gb, "allreduce_ms": 1e3 * ring,
                             "samples_per_s": n * batch / (compute_s + ring),
                             "efficiency": compute_s / (compute_s + ring)})
    return rows


def _run_bench(worker_counts) -> None:
    rows = bench(worker_counts)
    print("| workers | samples/s | step ms | gradients ms | all-reduce + update ms |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for r in rows:
        print(f"| {r['workers']} | {r['samples_per_s']:.0f} | {r['step_ms']:.1f} | "
              f"{r['gradients_ms']:.1f} | {r['allreduce_ms']:.1f} |")
    one = rows[0]
    print(f"\ngradient bytes per step: {one['gradient_bytes']} "
          f"(ring traffic per worker: 2(N-1)/N of it)")
    print(f"projection from 1 worker's {one['gradients_ms']:.1f} ms of gradients per "
          f"{one['batch']}-sample step:\n")
    print("| workers | link Gb/s | all-reduce ms | samples/s | efficiency |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for p in projection(one["gradients_ms"] / 1e3, one["gradient_bytes"], one["batch"]):
        print(f"| {p['workers']} | {p['gbits']} | {p['allreduce_ms']:.2f} | "
              f"{p['samples_per_s']:.0f} | {p['efficiency']:.0%} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bench", action="store_true")
    parser.add_argument("--workers", default="1,2", help="worker counts to bench, e.g. 1,2")
    args = parser.parse_args()
    import ray

    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    try:
        if args.bench:
            _run_bench([int(n) for n in args.workers.split(",")])
        else:
            main()
    finally:
        ray.shutdown()
