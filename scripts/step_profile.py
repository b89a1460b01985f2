"""Where one compiled step's time goes, per call: the host's wall time against
the device's (CUDA events around the same call), and the host functions that
take it (cProfile, by own time).

    python scripts/step_profile.py --target cuda --workload mlp --workload attention
    python scripts/step_profile.py --target cuda --trace --workload mlp

On a GPU a step whose host time far exceeds its device time is bound by
launch and dispatch overhead, not by its kernels: that is what this shows.
On the CPU the two columns are the same clock.

`--trace` runs the step twice launch by launch instead, waiting for the GPU
after each, and prints every launch's label and seconds: the first call's
figures include Numba's compilation of each kernel, the second's are run
times alone. A launch that never returns leaves its label as the last line,
and a Python stack is printed every 20 s while one call is in progress.
"""

from __future__ import annotations

import argparse
import cProfile
import faulthandler
import io
import pstats
import statistics
import sys
import time

from gradcompiler.bench import suite
from gradcompiler.bench import workloads as workload_registry


def device_seconds(run, target: str) -> float:
    """One call's device time (CUDA events), or its wall time on the CPU."""
    if target != "cuda":
        start = time.perf_counter()
        run()
        return time.perf_counter() - start
    from numba import cuda

    begin, end = cuda.event(), cuda.event()
    begin.record()
    run()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end) / 1e3


def profile(name: str, target: str, calls: int, top: int, size: str = "full") -> str:
    work = workload_registry.build(name, size)
    feeds = workload_registry.feeds_for(work)
    step = suite.compile_step(work, target)
    run = suite.step_runner(work, step, feeds, target)
    for _ in range(3):
        run()
    wall = suite.time_calls(run, calls, 0)["median_s"]
    device = statistics.median(device_seconds(run, target) for _ in range(calls))
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(calls):
        run()
    profiler.disable()
    text = io.StringIO()
    pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(top)
    return (f"== {name} on {target}: median wall {wall * 1e3:.3f} ms per call, "
            f"device (events) {device * 1e3:.3f} ms\n{launch_paths(step)}{text.getvalue()}")


def launch_paths(step) -> str:
    """How the CUDA runner launches (pre-bound kernels, CUDA graphs); nothing on the CPU."""
    runner = getattr(getattr(step, "executable", step), "_runner", None)
    if not hasattr(runner, "graph_status"):
        return ""
    kernels = [launch.kernel for launch in runner.launches if hasattr(launch, "kernel")]
    bound = sum(kernel.bound is not None for kernel in kernels)
    return (f"   launches: {len(runner.launches)}, generated kernels pre-bound: {bound} of {len(kernels)}; "
            f"CUDA graphs {runner.graph_status}, captured {runner.captures} time(s)\n")


def trace(name: str, target: str, size: str = "full") -> None:
    """Each launch of two calls, one at a time, with the seconds it took (module docstring)."""
    start = time.perf_counter()
    work = workload_registry.build(name, size)
    feeds = workload_registry.feeds_for(work)
    step = suite.compile_step(work, target)
    print(f"== {name}: compiled in {time.perf_counter() - start:.2f} s", flush=True)
    if target != "cuda":
        return
    from numba import cuda

    from gradcompiler.backends.numba_cuda.executable import device_feeds

    runner = step._runner
    on_device = device_feeds(step._placeholders, feeds)
    for call in ("first (with compilation)", "second"):
        buffers = runner._buffers(on_device)
        for s, launch in enumerate(runner.launches):
            print(f"  {call} {s:3d} {runner.step_labels[s]} ...", end="", flush=True)
            began = time.perf_counter()
            launch(buffers, 0)
            cuda.synchronize()
            print(f" {time.perf_counter() - began:.4f} s", flush=True)
    print(f"== {name}: traced", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--workload", action="append", choices=workload_registry.NAMES)
    parser.add_argument("--calls", type=int, default=50)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--trace", action="store_true", help="time each launch of two calls")
    parser.add_argument("--size", choices=workload_registry.SIZES, default="full",
                        help="the workloads' size (tiny: a smoke run, not a measurement)")
    args = parser.parse_args()
    faulthandler.dump_traceback_later(20, repeat=True, file=sys.stderr)
    for name in args.workload or workload_registry.NAMES:
        if args.trace:
            trace(name, args.target, args.size)
        else:
            print(profile(name, args.target, args.calls, args.top, args.size), flush=True)


if __name__ == "__main__":
    main()
