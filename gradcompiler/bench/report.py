"""Writers for the suite's result document: JSON, a Markdown table, a PNG chart.

The result document (`suite.run_suite`'s return value, written as is by
`write_json`). Times are seconds per step; "peer" is one of numpy_manual,
torch_eager, torch_compile, jax_jit.

    schema        "gradcompiler-bench/1"
    created       UTC time the run started (ISO 8601)
    target        "cpu" or "cuda": where the compiled step ran
    quick         true for a smoke run (tiny sizes, few steps): not a measurement
    size          "full" (benchmarks.md sizes) or "tiny"
    steps, warmup timed steps per median, untimed steps before them
    environment   python, numpy, numba, gradcompiler versions; platform, machine,
                  cpu_count, target; on cuda also gpu and compute_capability
    machine       measured as the run starts: bandwidth_gb_s (STREAM-triad-style
                  parallel Numba loop, 1e9 B/s), sgemm_gflop_s (numpy float32 matmul),
                  stream_elements, gemm_n, threads (Numba threads), source (what
                  measured them: on cuda a Numba CUDA triad and cuBLAS through CuPy
                  or PyTorch)
    peers         {peer: {available, note}}: which peers ran; note says why one is skipped
    workloads     one entry per workload:
      name, size, dims        the workload and its dimensions
      bound                   "gemm" (matmul-bound) or "memory"
      flops                   matmul FLOP per step (forward + backward); 0 if memory-bound
      min_bytes               bytes a step must move: each feed read once, each output written once
      limits                  the machine's figures the step is held against: bandwidth_gb_s and
                              sgemm_gflop_s, each the higher of those measured just before and
                              just after the compiled step was timed (`suite.adjacent_limits`),
                              and both measurements (before, after)
      floor_s                 flops at the SGEMM rate, or min_bytes at the bandwidth, of `limits`
      compiled                the gc.compile step (gc.train_step for a workload with an
                              optimizer): status ("ok" | "failed"), and when ok
                              median_s, min_s, max_s, steps, warmup,
                              max_rel_error_vs_numpy (max |Δ| / max |numpy| over the
                              loss and each gradient, or for a training step the loss
                              and every state array after one step, numpy run in
                              float64), tolerance (1e-3; suite.TOLERANCES names the
                              exceptions and why), correct (error <= tolerance);
                              when failed, error
      memory_budgets          only for a training step: {budget: planned_peak_bytes,
                              default_peak_bytes, peak_fraction, recomputed (values),
                              segments and the fields of compiled}, or status "unmet"
                              with smallest_peak_bytes and the planner's note
      peers                   {peer: the same fields as compiled, plus device, or
                              status "skipped" with a note}
      ratio                   {peer: peer median / compiled median}; > 1 means the
                              compiled step is faster (only peers that ran)
      achieved                unit ("GB/s" or "GFLOP/s"), rate (min_bytes or flops per
                              median step), limit (the figure of `limits`), fraction = rate/limit
      first_call              status; cold_s (empty kernel cache, fresh process) and warm_s
                              (cache filled by the cold process): build + grad + passes +
                              compile + first run, feed drawing excluded; cold and warm
                              hold the parts (build_s, compile_s, first_run_s)

`ratio` and `achieved` are absent when the compiled step failed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from ..units import format_bytes
from .machine import LIMITS
from .peers import PEER_NAMES

PEER_TITLES = {"numpy_manual": "numpy", "torch_eager": "torch eager",
               "torch_compile": "torch.compile", "jax_jit": "jax.jit"}


def write_json(result: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2, allow_nan=True) + "\n")


def _ms(seconds: float) -> str:
    """A duration in the unit that reads best: µs below 0.1 ms, s from 1 s."""
    if seconds < 1e-4:
        return f"{seconds * 1e6:.3g} µs"
    return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _cell(measured: dict[str, Any], ratio: float | None = None) -> str:
    status = measured.get("status")
    if status == "skipped":
        return "—"
    if status != "ok":
        return "failed"
    text = _ms(measured["median_s"])
    if not measured["correct"]:
        text += " WRONG"
    return text if ratio is None else f"{text} (×{ratio:.2f})"


def _first_call_cell(first: dict[str, Any]) -> str:
    if first.get("status") != "ok":
        return "—" if first.get("status") == "skipped" else "failed"
    return f"{first['cold_s']:.2f} s / {first['warm_s']:.2f} s"


def _budget_cell(measured: dict[str, Any]) -> str:
    if measured["status"] == "unmet":
        return f"not met, smallest peak {format_bytes(measured['smallest_peak_bytes'])}"
    if "planned_peak_bytes" not in measured:
        return "failed"
    return (f"{format_bytes(measured['planned_peak_bytes'])} ({measured['peak_fraction']:.2f}), "
            + _cell(measured))


def _shown_peers(result: dict[str, Any]) -> list[str]:
    return [p for p in PEER_NAMES if p in result["peers"]]


def _limit_ranges(workloads: list[dict[str, Any]]) -> str:
    """The spread of the workloads' own limits: "46-85 GB/s, 440-480 GFLOP/s"."""
    parts = []
    for key, unit in zip(LIMITS, ("GB/s", "GFLOP/s")):
        values = [w["limits"][key] for w in workloads if math.isfinite(w["limits"][key])]
        if values:
            low, high = min(values), max(values)
            parts.append(f"{low:.0f} {unit}" if round(low) == round(high) else f"{low:.0f}-{high:.0f} {unit}")
    return ", ".join(parts) or "none measured"


def markdown_table(result: dict[str, Any]) -> str:
    """The results as a Markdown table, with the machine and skipped peers noted below it."""
    peers = _shown_peers(result)
    head = (["workload", "gradcompiler (min–max)"] + [PEER_TITLES[p] for p in peers]
            + ["floor", "achieved", "first call cold / warm"])
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for w in result["workloads"]:
        compiled = w["compiled"]
        own = _cell(compiled)
        if compiled["status"] == "ok":
            own += f" ({_ms(compiled['min_s'])}–{_ms(compiled['max_s'])})"
        ratios = w.get("ratio", {})
        cells = [_cell(w["peers"][p], ratios.get(p)) for p in peers]
        reach = w.get("achieved")
        reached = f"{reach['fraction']:.1%} of {reach['limit']:.0f} {reach['unit']}" if reach else "—"
        floor = _ms(w["floor_s"]) + (" (GEMM)" if w["bound"] == "gemm" else " (bytes)")
        lines.append("| " + " | ".join([w["name"], own, *cells, floor, reached,
                                          _first_call_cell(w["first_call"])]) + " |")
    m = result["machine"]
    notes = [
        "",
        f"Target {result['target']}, sizes {result['size']}, median of {result['steps']} steps "
        f"after {result['warmup']} warm-ups. Peer cells: median (peer ÷ gradcompiler; above 1 "
        f"means gradcompiler is faster).",
        f"Machine: {m['bandwidth_gb_s']:.1f} GB/s memory bandwidth, {m['sgemm_gflop_s']:.1f} "
        f"GFLOP/s SGEMM as the run started, {m['threads']} threads ({m.get('source', 'cpu')})"
        + (f"; GPU {result['environment']['gpu']}." if "gpu" in result["environment"] else ".")
        + " Each floor and fraction is of the higher of the figures measured just before and just"
        " after that step was timed: " + _limit_ranges(result["workloads"]) + ".",
    ]
    if result["quick"]:
        notes.append("Quick run: tiny sizes, a smoke test; these figures are not a measurement.")
    for name, peer in result["peers"].items():
        if not peer["available"]:
            notes.append(f"{PEER_TITLES.get(name, name)}: skipped, {peer['note']}.")
    for w in result["workloads"]:
        if "memory_budgets" in w:
            notes.append(f"{w['name']} at memory budgets (planned peak, step): "
                         + "; ".join(f"{b}: {_budget_cell(m)}" for b, m in w["memory_budgets"].items())
                         + ".")
    for w in result["workloads"]:
        for who, measured in [("gradcompiler", w["compiled"]), *w["peers"].items(),
                              ("first call", w["first_call"])]:
            if measured.get("status") == "failed":
                notes.append(f"{w['name']}, {PEER_TITLES.get(who, who)}: {measured['error']}")
    return "\n".join(lines + notes) + "\n"


def write_markdown(result: dict[str, Any], path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(markdown_table(result))


def write_plot(result: dict[str, Any], path: str | Path) -> None:
    """Grouped bars: ms/step of gradcompiler and each peer per workload (log scale), floor marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = [("gradcompiler", lambda w: w["compiled"])]
    series += [(PEER_TITLES[p], lambda w, p=p: w["peers"][p]) for p in _shown_peers(result)
               if result["peers"][p]["available"]]
    workloads = result["workloads"]
    width = 0.8 / len(series)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 * len(workloads) + 2), 4.5))
    for k, (label, pick) in enumerate(series):
        xs, heights = [], []
        for i, w in enumerate(workloads):
            measured = pick(w)
            if measured.get("status") == "ok":
                xs.append(i + (k - (len(series) - 1) / 2) * width)
                heights.append(measured["median_s"] * 1e3)
        ax.bar(xs, heights, width, label=label)
    for i, w in enumerate(workloads):
        floor = w["floor_s"] * 1e3
        if floor > 0 and math.isfinite(floor):
            ax.hlines(floor, i - 0.45, i + 0.45, colors="black", linestyles="dashed",
                      label="machine floor" if i == 0 else None)
    ax.set_xticks(range(len(workloads)), [w["name"] for w in workloads], rotation=20, ha="right")
    ax.set_yscale("log")
    ax.set_ylabel("ms per step (median, log scale)")
    title = f"gradcompiler benchmark, target {result['target']}, {result['size']} sizes"
    ax.set_title(title + (" (quick run)" if result["quick"] else ""))
    ax.legend(fontsize="small")
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
