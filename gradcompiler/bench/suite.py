"""The benchmark suite: the compiled step of each workload against its peers.

Public entry points (used by `gradcompiler bench` in `cli.py` and by
`python -m gradcompiler.bench`):

    run_suite(workloads=None, target="cpu", quick=False, *, steps=None, warmup=None,
              peers=None, first_call=True, log=print) -> dict

        workloads   names from `workloads.NAMES` (default: all seven)
        target      "cpu" or "cuda", passed to `gc.compile`
        quick       tiny sizes, few steps, small machine probes: a smoke run
        steps       timed steps per measurement (default 20; 5 in quick mode)
        warmup      untimed steps first (default 3; 2 in quick mode)
        peers       names from `peers.PEER_NAMES` (default: all; missing ones are skipped)
        first_call  also measure cold and warm first-call latency in subprocesses
        log         called with one line per measurement; None for silence

      returns the result document (plain JSON data) described in `report.py`,
      which writes it as JSON, a Markdown table and a PNG chart:

    report.write_json(result, path); report.write_markdown(result, path);
    report.write_plot(result, path); report.markdown_table(result) -> str

    add_arguments(parser)      the bench options, for a CLI subcommand
    run_from_args(namespace)   run_suite + the writers the options ask for; exit status

A workload that fails to build, compile or run is recorded with its error
and the suite goes on; so is a peer. Every peer is checked against
`numpy_manual` run in float64 (the hand-written step, and the benchmark's
own oracle), and so is the compiled step: a fast wrong answer is reported
as wrong. The float64 run is the reference because float32 rounding is not
the same in any two contenders: against the float32 numpy step, an accurate
compiled step would inherit numpy's own rounding error.

A workload with an optimizer (`gpt`) is a whole training step: it compiles
with `gc.train_step`, the timed call is `step(state, **data)` (forward,
backward and the update of `state` in place), and what is checked is the
loss and the state after the first step, against the numpy step followed by
torch.optim.AdamW's documented update (`manual.AdamWTraining`). Such a
workload is also compiled and timed at each memory budget of BUDGETS: the
planned peak and the step time per budget, and a budget no plan meets
reported as unmet with the smallest peak the planner reached.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numba
import numpy as np

import gradcompiler as gc

from ..backends import require_target
from ..units import format_bytes
from . import machine, report, scaling
from . import peers as peer_registry
from . import workloads as workload_registry
from .first_call import materialise
from .workloads import Workload

SCHEMA = "gradcompiler-bench/1"
FULL_STEPS, FULL_WARMUP = 20, 3
QUICK_STEPS, QUICK_WARMUP = 5, 2
# Every contender's float32 outputs are compared with the numpy step run in float64 (once per
# workload), relative to each output's largest magnitude: float32 losses sum millions of terms.
TOLERANCE = 1e-3
# Per workload, where float32 rounding alone goes further, with the reason:
# cnn: batch norm's gradient, count·dy − Σdy − x̂·Σ(dy·x̂), cancels sums of 16,384 to 65,536
# float32 terms per channel; their rounding leaves each channel's dz a bias of one sign, which the
# filter gradient's sum over the batch adds up coherently. numpy's float32 step (float32
# accumulators over the non-contiguous axes) lands 2.6e-2 from float64 on down_w at full size
# (the compiled step 2.4e-6); a gradient wrong by a term, a factor or a sign is off by O(1).
# gpt: AdamW's first step moves each weight by lr·g/(|g| + eps) (plus the decay), whose slope at
# g = 0 is lr/eps = 1e5: a weight whose float64 gradient is near zero moves by a fraction of lr
# that the float32 gradient's rounding decides. Seen on down2 (weights of scale 0.144):
# g = -3.67e-9 in float64, -2.61e-9 in float32, so the update is off by 6e-5 = 4.2e-4 of the
# weights' scale on the CPU; float32 numpy 3.2e-4, torch on CUDA 4.5e-4, the compiled step on
# CUDA 1.0e-3 (cuBLAS sums in another order). 5e-3 admits gradient rounding up to ~7e-9 there; a
# gradient wrong by a term, a factor or a sign still shows at O(1) in the exp_avg slots (0.1·g).
TOLERANCES = {"cnn": 5e-2, "gpt": 5e-3}
FIRST_CALL_TIMEOUT_S = 1800
BUDGETS = (1.0, 0.5, 0.25)  # memory budgets of a training-step workload, fractions of the default peak

Log = Callable[[str], None] | None


def compile_step(work: Workload, target: str, memory_budget: float | None = None) -> Callable[..., Any]:
    """The compiled step of a workload: loss and gradients in one executable, or, for a
    workload with an optimizer, the whole training step (`gc.train_step`)."""
    from gradcompiler.compile import compile as compile_graph

    if work.optimizer is not None:
        return gc.train_step(work.loss, list(work.wrt), work.optimizer, target=target,
                             memory_budget=memory_budget)
    return compile_graph(work.outputs, target=target, memory_budget=memory_budget)


def time_calls(run: Callable[[], Any], steps: int, warmup: int) -> dict[str, float]:
    """Median, min and max seconds of `steps` calls of `run` after `warmup` untimed ones."""
    return time_alternated([run], steps, warmup)[0]


def time_alternated(runs: Sequence[Callable[[], Any]], steps: int, warmup: int) -> list[dict[str, float]]:
    """`time_calls` of each of `runs`, their calls taken in turn (one of each per round):
    this machine's speed drifts by a fifth and more within a minute, and contenders timed
    one after the other would be compared across that drift, turns within it."""
    for _ in range(warmup):
        for run in runs:
            run()
    times: list[list[float]] = [[] for _ in runs]
    for _ in range(steps):
        for run, taken in zip(runs, times):
            start = time.perf_counter()
            run()
            taken.append(time.perf_counter() - start)
    return [dict(median_s=statistics.median(t), min_s=min(t), max_s=max(t), steps=steps, warmup=warmup)
            for t in times]


def _failure(err: BaseException) -> dict[str, Any]:
    last = traceback.extract_tb(err.__traceback__)[-1:] if err.__traceback__ else []
    where = f" ({last[0].filename}:{last[0].lineno})" if last else ""
    return dict(status="failed", error=f"{type(err).__name__}: {err}{where}")


def tolerance(name: str) -> float:
    """The largest relative error from the float64 numpy step that counts as correct."""
    return TOLERANCES.get(name, TOLERANCE)


def checked(name: str, outputs: list[np.ndarray], oracle: list[np.ndarray]) -> dict[str, Any]:
    """The error of a contender's outputs against `oracle` (`float64_oracle`) and its verdict."""
    error = peer_registry.max_relative_error(outputs, oracle)
    return dict(max_rel_error_vs_numpy=error, tolerance=tolerance(name),
                correct=bool(error <= tolerance(name)))


def float64_oracle(work: Workload, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The numpy step of `work` (for a training step: the loss and the state after one step)
    on float64 copies of the float feeds: the reference every float32 contender, the numpy
    step itself included, is measured against."""
    wide = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in feeds.items()}
    numpy_step = peer_registry.available_peers(["numpy_manual"])[0].prepare(work, wide, "cpu")
    return [np.asarray(v) for v in numpy_step.to_numpy(numpy_step.run())]


def step_runner(work: Workload, step: Callable[..., Any], feeds: dict, target: str) -> Callable[[], Any]:
    """One call of a compiled step, as the timer sees it.

    On CUDA the feeds are copied to the device once, outside the timing, and
    each call waits for the GPU to finish: a step is the device work, not the
    transfers (the torch and jax peers are timed the same way).
    """
    if work.optimizer is not None:
        return _train_runner(work, step, feeds, target)
    if target != "cuda":
        return lambda: step(**feeds)
    from numba import cuda

    on_device = {name: cuda.to_device(value) for name, value in feeds.items()}

    def run():
        outputs = step(**on_device)
        cuda.synchronize()
        return outputs

    return run


def _train_runner(work: Workload, step, feeds: dict, target: str) -> Callable[[], list]:
    """`step(state, **data)` on a state made from the feeds' initial parameters (on CUDA the
    state and the batch live on the device; the loss's copy home waits for the step); the
    loss and the state's arrays, in `work.state_names` order, as the check reads them."""
    state = step.init({t.name: feeds[t.name] for t in work.wrt})
    data = {k: v for k, v in feeds.items() if k not in state}
    if target == "cuda":
        from numba import cuda

        data = {k: cuda.to_device(v) for k, v in data.items()}
    names = work.state_names

    def run():
        loss = step(state, **data)
        return [np.asarray(loss), *(state[n] for n in names)]

    return run


def _checked_runner(work: Workload, step, feeds: dict, oracle: list[np.ndarray],
                    target: str) -> tuple[Callable[[], Any], dict[str, Any]]:
    """The step's runner, and its first call checked against the oracle."""
    run = step_runner(work, step, feeds, target)
    return run, checked(work.name, materialise(run()), oracle)


def _run_and_check(work: Workload, step, feeds: dict, oracle: list[np.ndarray], target: str,
                   steps: int, warmup: int) -> dict[str, Any]:
    """The first call checked against the oracle, then the timing."""
    run, verdict = _checked_runner(work, step, feeds, oracle, target)
    return dict(status="ok", **time_calls(run, steps, warmup), **verdict)


def measure_compiled(work: Workload, feeds: dict, oracle: list[np.ndarray], target: str,
                     steps: int, warmup: int) -> dict[str, Any]:
    try:
        return _run_and_check(work, compile_step(work, target), feeds, oracle, target, steps, warmup)
    except Exception as err:  # noqa: BLE001 - recorded in the report, the suite goes on
        return _failure(err)


def measure_budgets(work: Workload, feeds: dict, oracle: list[np.ndarray], target: str,
                    steps: int, warmup: int) -> dict[str, dict[str, Any]]:
    """Per memory budget of BUDGETS: the planned peak (bytes, and its fraction of the
    default plan's) and the checked step, the budgets' steps timed in turn
    (`time_alternated`: their ratio is the figure that matters); "unmet" with the smallest
    peak any plan reached where the planner cannot meet the budget."""
    measured, runs = {}, {}
    for budget in BUDGETS:
        try:
            step = compile_step(work, target, memory_budget=budget)
        except gc.MemoryBudgetError as err:
            measured[str(budget)] = dict(status="unmet", smallest_peak_bytes=err.smallest_peak,
                                         note=str(err))
            continue
        except Exception as err:  # noqa: BLE001
            measured[str(budget)] = _failure(err)
            continue
        remat = step.executable.context.remat
        peak = step.executable.memory.peak_bytes
        entry = dict(planned_peak_bytes=peak, default_peak_bytes=remat.default_peak,
                     peak_fraction=peak / remat.default_peak, recomputed=len(remat.recomputed),
                     segments=remat.segments)
        try:
            runs[str(budget)], verdict = _checked_runner(work, step, feeds, oracle, target)
            entry = {"status": "ok", **verdict, **entry}
        except Exception as err:  # noqa: BLE001
            entry = {**_failure(err), **entry}
        measured[str(budget)] = entry
    try:
        timings = time_alternated(list(runs.values()), steps, warmup)
    except Exception as err:  # noqa: BLE001 - recorded for every budget timed, the suite goes on
        timings = [_failure(err)] * len(runs)
    for budget, timing in zip(runs, timings):
        measured[budget].update(timing)
    return measured


def measure_peer(peer: peer_registry.Peer, work: Workload, feeds: dict, oracle: list[np.ndarray],
                 target: str, steps: int, warmup: int) -> dict[str, Any]:
    if not peer.available:
        return dict(status="skipped", note=peer.note)
    if work.optimizer is not None and not peer.trains:
        return dict(status="skipped", note=f"{peer.name} has no training step (an optimizer "
                                            "inside it); it runs the gradient-only workloads")
    try:
        prepared = peer.prepare(work, feeds, target)
        verdict = checked(work.name, prepared.to_numpy(prepared.run()), oracle)
        timing = time_calls(prepared.run, steps, warmup)
    except Exception as err:  # noqa: BLE001
        return _failure(err)
    return dict(status="ok", device=prepared.device, **timing, **verdict)


def _first_call_process(name: str, target: str, size: str, cache_dir: str) -> dict[str, float]:
    env = dict(os.environ, GRADCOMPILER_CACHE_DIR=cache_dir,
               NUMBA_CACHE_DIR=os.path.join(cache_dir, "numba"))
    root = str(Path(gc.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    done = subprocess.run(
        [sys.executable, "-m", "gradcompiler.bench.first_call", name, "--target", target,
         "--size", size], env=env, capture_output=True, text=True, timeout=FIRST_CALL_TIMEOUT_S)
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise RuntimeError(f"first-call process exited with {done.returncode}: {tail[0]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_first_call(name: str, target: str, size: str) -> dict[str, Any]:
    """Cold (empty kernel cache) and warm (cache filled by the cold process) first calls."""
    with tempfile.TemporaryDirectory(prefix="gradcompiler-bench-cache-") as cache_dir:
        try:
            cold = _first_call_process(name, target, size, cache_dir)
            warm = _first_call_process(name, target, size, cache_dir)
        except Exception as err:  # noqa: BLE001
            return _failure(err)
    return dict(status="ok", cold_s=cold["seconds"], warm_s=warm["seconds"], cold=cold, warm=warm)


def achieved(work: Workload, median_s: float, limits: dict[str, float]) -> dict[str, Any]:
    """The step's rate against the machine limit that bounds it."""
    if work.bound == "gemm":
        rate, limit, unit = work.flops / median_s / 1e9, limits["sgemm_gflop_s"], "GFLOP/s"
    else:
        rate, limit, unit = work.min_bytes / median_s / 1e9, limits["bandwidth_gb_s"], "GB/s"
    return dict(unit=unit, rate=rate, limit=limit, fraction=rate / limit)


def floor_seconds(work: Workload, limits: dict[str, float]) -> float:
    """The fastest a step could be: its FLOP at the SGEMM rate, or its bytes at the bandwidth."""
    if work.bound == "gemm":
        return work.flops / (limits["sgemm_gflop_s"] * 1e9)
    return work.min_bytes / (limits["bandwidth_gb_s"] * 1e9)


def _environment(target: str) -> dict[str, Any]:
    found = dict(python=platform.python_version(), numpy=np.__version__, numba=numba.__version__,
                 gradcompiler=gc.__version__, platform=platform.platform(),
                 machine=platform.machine(), cpu_count=os.cpu_count(), target=target)
    if target == "cuda":
        from numba import cuda

        device = cuda.get_current_device()
        name = getattr(device, "name", "Numba's CUDA simulator")
        found.update(gpu=name.decode() if isinstance(name, bytes) else str(name),
                     compute_capability=".".join(map(str, device.compute_capability)))
    return found


def _log(log: Log, line: str) -> None:
    if log is not None:
        log(line)


_oracles: dict[tuple[str, str], list[np.ndarray]] = {}


def _prepare(name: str, size: str):
    """The workload, its feeds, and the float64 outputs every contender is checked against
    (computed once per workload and size: the compiled step and the peers share them)."""
    work = workload_registry.build(name, size)
    feeds = workload_registry.feeds_for(work)
    if (name, size) not in _oracles:
        _oracles[name, size] = float64_oracle(work, feeds)
    return work, feeds, _oracles[name, size]


def adjacent_limits(before: machine.MachineLimits, after: machine.MachineLimits) -> dict[str, Any]:
    """The limits a step's time is held against: the higher of each figure measured just before
    and just after the step was timed, with both measurements.

    Why not the figures of the run's start: a machine's limits move between minutes. On this
    project's 2-core guest the triad read 44-50 GB/s in some minutes and 80-86 GB/s in others,
    flipping within the minute, and memory-bound steps followed it (bcast_reduce 3.0-3.3 ms
    against 2.5-2.6); a figure measured minutes before a step can belong to the other state.
    The higher of the two adjacent figures never flatters the step. A figure not measured
    (NaN: no SGEMM on a GPU without CuPy or PyTorch) stays NaN only if neither was."""
    measured = {k: [v for v in (getattr(before, k), getattr(after, k)) if math.isfinite(v)]
                for k in machine.LIMITS}
    return dict({k: max(values, default=float("nan")) for k, values in measured.items()},
                before={k: getattr(before, k) for k in machine.LIMITS},
                after={k: getattr(after, k) for k in machine.LIMITS})


def measure_workload(name: str, target: str, size: str, steps: int, warmup: int,
                     quick: bool, log: Log) -> dict[str, Any]:
    """The compiled step of one workload, and the machine's limits around it (`adjacent_limits`):
    the entry of the result document, without peers yet."""
    work, feeds, oracle = _prepare(name, size)
    before = machine.measure(quick=quick, target=target)
    compiled = measure_compiled(work, feeds, oracle, target, steps, warmup)
    limits = adjacent_limits(before, machine.measure(quick=quick, target=target))
    entry: dict[str, Any] = dict(
        name=name, size=size, dims=work.dims, bound=work.bound, flops=work.flops,
        min_bytes=work.min_bytes, limits=limits, floor_s=floor_seconds(work, limits), peers={},
        compiled=compiled)
    _log(log, f"{name}: gradcompiler {_brief(entry['compiled'])}")
    if entry["compiled"]["status"] == "ok":
        entry["achieved"] = achieved(work, entry["compiled"]["median_s"], limits)
    if work.optimizer is not None:
        entry["memory_budgets"] = measure_budgets(work, feeds, oracle, target, steps, warmup)
        for budget, measured in entry["memory_budgets"].items():
            _log(log, f"{name}: memory budget {budget} {_brief_budget(measured)}")
    return entry


def measure_peers(entry: dict[str, Any], target: str, peers: list[peer_registry.Peer],
                  steps: int, warmup: int, first_call: bool, log: Log) -> None:
    """Add the peers' timings, the ratios and the first-call latency to `entry`."""
    name, size = entry["name"], entry["size"]
    work, feeds, oracle = _prepare(name, size)
    for peer in peers:
        entry["peers"][peer.name] = measure_peer(peer, work, feeds, oracle, target, steps, warmup)
        _log(log, f"{name}: {peer.name} {_brief(entry['peers'][peer.name])}")
    compiled = entry["compiled"]
    if compiled["status"] == "ok":
        entry["ratio"] = {p: r["median_s"] / compiled["median_s"]
                          for p, r in entry["peers"].items() if r["status"] == "ok"}
    entry["first_call"] = (measure_first_call(name, target, size) if first_call
                           else dict(status="skipped", note="not requested"))
    if first_call:
        _log(log, f"{name}: first call {_brief_first_call(entry['first_call'])}")


def _brief(measured: dict[str, Any]) -> str:
    if measured["status"] != "ok":
        return f"{measured['status']}: {measured.get('error') or measured.get('note')}"
    flag = "" if measured["correct"] else f"  WRONG (rel. error {measured['max_rel_error_vs_numpy']:.2e})"
    return (f"{measured['median_s'] * 1e3:.3f} ms/step (min {measured['min_s'] * 1e3:.3f}, "
            f"max {measured['max_s'] * 1e3:.3f}){flag}")


def _brief_budget(measured: dict[str, Any]) -> str:
    if measured["status"] == "unmet":
        return f"unmet: the smallest peak is {format_bytes(measured['smallest_peak_bytes'])}"
    if "planned_peak_bytes" not in measured:
        return _brief(measured)
    return (f"planned peak {format_bytes(measured['planned_peak_bytes'])} "
            f"({measured['peak_fraction']:.2f} of the default), {_brief(measured)}")


def _brief_first_call(measured: dict[str, Any]) -> str:
    if measured["status"] != "ok":
        return f"{measured['status']}: {measured.get('error')}"
    return f"cold {measured['cold_s']:.2f} s, warm {measured['warm_s']:.2f} s"


def run_suite(workloads: Sequence[str] | None = None, target: str = "cpu", quick: bool = False, *,
              steps: int | None = None, warmup: int | None = None,
              peers: Sequence[str] | None = None, first_call: bool = True,
              log: Log = print) -> dict[str, Any]:
    """Measure each workload's compiled step and its peers; return the result document."""
    names = list(workloads or workload_registry.NAMES)
    unknown = [n for n in names if n not in workload_registry.NAMES]
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; expected some of {list(workload_registry.NAMES)}")
    if target not in ("cpu", "cuda"):
        raise ValueError(f"unknown target {target!r}; expected 'cpu' or 'cuda'")
    require_target(target)  # no GPU: say so before the machine is measured on it
    steps = steps or (QUICK_STEPS if quick else FULL_STEPS)
    warmup = warmup if warmup is not None else (QUICK_WARMUP if quick else FULL_WARMUP)
    size = "tiny" if quick else "full"
    peer_list = peer_registry.available_peers(peers if peers is not None else peer_registry.PEER_NAMES)
    limits = machine.measure(quick=quick, target=target).as_dict()
    _log(log, f"machine: {limits['bandwidth_gb_s']:.1f} GB/s, {limits['sgemm_gflop_s']:.1f} GFLOP/s SGEMM")
    # Every compiled step is timed before any peer runs, so no peer's thread pool
    # (PyTorch's OpenMP, XLA's) is alive while ours are timed. Peers then run in turn.
    entries = [measure_workload(n, target, size, steps, warmup, quick, log) for n in names]
    for entry in entries:
        measure_peers(entry, target, peer_list, steps, warmup, first_call, log)
    return dict(
        schema=SCHEMA, created=datetime.now(UTC).isoformat(timespec="seconds"),
        target=target, quick=quick, size=size, steps=steps, warmup=warmup,
        environment=_environment(target), machine=limits,
        peers={p.name: dict(available=p.available, note=p.note) for p in peer_list},
        workloads=entries)


# -- command line ----------------------------------------------------------------------------------

def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of `gradcompiler bench`."""
    parser.add_argument("--target", choices=("cpu", "cuda"), default="cpu",
                        help="where the compiled step runs (default: cpu)")
    parser.add_argument("--workload", action="append", choices=workload_registry.NAMES,
                        metavar="NAME", help="run only this workload (repeatable; default: all "
                        f"of {', '.join(workload_registry.NAMES)})")
    parser.add_argument("--peer", action="append", choices=peer_registry.PEER_NAMES, metavar="PEER",
                        help="measure only this peer (repeatable; default: all installed)")
    parser.add_argument("--json", metavar="FILE", help="write the full results as JSON")
    parser.add_argument("--markdown", metavar="FILE", help="write the results table as Markdown")
    parser.add_argument("--plot", metavar="FILE", help="write a bar chart (PNG)")
    parser.add_argument("--quick", action="store_true",
                        help="tiny sizes and few steps: a smoke run, not a measurement")
    parser.add_argument("--no-first-call", dest="first_call", action="store_false",
                        help="skip the cold/warm first-call subprocesses")
    parser.add_argument("--scaling", action="store_true",
                        help="instead of the workloads: compile time against graph size "
                             "(residual MLP and GPT-like stack at doubling sizes; --json, --plot)")
    parser.add_argument("--max-depth", type=int, default=2560, metavar="N",
                        help="--scaling: the deepest residual MLP "
                             "(default 2560; with --quick: depths 2 and 4)")
    parser.add_argument("--max-blocks", type=int, default=48, metavar="N",
                        help="--scaling: the most GPT-like blocks (default 48; 2 with --quick)")


def run_from_args(args: argparse.Namespace) -> int:
    """Run the suite as the options say, print the table, write the files; the exit status."""
    if args.scaling:
        return _run_scaling(args)
    result = run_suite(args.workload, target=args.target, quick=args.quick, peers=args.peer,
                       first_call=args.first_call)
    print(report.markdown_table(result))
    for path, write in ((args.json, report.write_json), (args.markdown, report.write_markdown),
                        (args.plot, report.write_plot)):
        if path:
            write(result, path)
            print(f"wrote {path}")
    failed = [w["name"] for w in result["workloads"]
              if w["compiled"]["status"] != "ok" or not w["compiled"]["correct"]]
    if failed:
        print(f"failed or wrong: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def _run_scaling(args: argparse.Namespace) -> int:
    """`--scaling`: measure, print the tables, write the JSON and the chart asked for."""
    if args.quick:  # residual MLPs of depth 2 and 4, one GPT-like block pair at most
        result = scaling.run_scaling(min(args.max_depth, 4), min(args.max_blocks, 2), min_depth=2)
    else:
        result = scaling.run_scaling(args.max_depth, args.max_blocks)
    print("\n".join(scaling.report_lines(result)))
    for path, write in ((args.json, scaling.write_json), (args.plot, scaling.write_plot)):
        if path:
            write(result, path)
            print(f"wrote {path}")
    return 0

