"""First-call latency of one workload, measured in a process of its own.

    python -m gradcompiler.bench.first_call WORKLOAD --target cpu --size full

The first call of a step pays for everything before the first result: the
graph build, the differentiation pass, the optimisation passes, the Numba
compilation (unless the kernel cache already holds the kernels) and the first
run. Only a fresh process shows it honestly, since Numba and the kernel cache
keep state in memory, so the suite runs this module twice per workload with
`GRADCOMPILER_CACHE_DIR` (and Numba's cache) pointed at a new empty folder:
the first process is cold, the second warm.

Prints one JSON object: `seconds` (build to first result, drawing the random
feeds excluded), `build_s` (graph and gradients), `compile_s` (gc.compile)
and `first_run_s`.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from . import workloads


def materialise(outputs: Any) -> list[np.ndarray]:
    """The step's outputs as host numpy arrays: waits for device work to finish."""
    values = outputs if isinstance(outputs, (list, tuple)) else [outputs]
    return [v.copy_to_host() if hasattr(v, "copy_to_host") else np.asarray(v) for v in values]


def measure(name: str, target: str, size: str) -> dict[str, float]:
    from . import suite

    start = time.perf_counter()
    work = workloads.build(name, size)
    built = time.perf_counter()
    step = suite.compile_step(work, target)
    compiled = time.perf_counter()
    feeds = workloads.feeds_for(work)
    fed = time.perf_counter()
    materialise(suite.step_runner(work, step, feeds, target)())
    done = time.perf_counter()
    return dict(seconds=(compiled - start) + (done - fed), build_s=built - start,
                compile_s=compiled - built, first_run_s=done - fed)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gradcompiler.bench.first_call")
    parser.add_argument("workload", choices=workloads.NAMES)
    parser.add_argument("--target", default="cpu")
    parser.add_argument("--size", choices=workloads.SIZES, default="full")
    args = parser.parse_args(argv)
    print(json.dumps(measure(args.workload, args.target, args.size)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
