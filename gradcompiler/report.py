"""The text of `step.report()`: what the compiler did to a graph, in words.

    format_report(executable) -> str

Sections, each read from what the executable exposes (nothing is measured
again here): the passes (`gradcompiler.passes.pipeline.format_stats`: nodes before and
after, rewrites by kind, bytes saved), the kernels (`executable.kernels`:
name, iteration space, fused ops, bytes moved, FLOPs, how it was compiled
and its generated module, as `step.source()` names it),
the captures (`memory.captures`: the forward values kept alive for the
backward, with their sizes), the memory plan (peak against the unfused
op-by-op peak), what a memory budget made `remat` keep and recompute, and the
compile (seconds per stage, cache hits, and the
kernel cache's counters for the whole process, read when the report is made).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from gradcompiler.passes.pipeline import format_stats

from .units import format_bytes, format_count

SECTIONS = ("passes", "kernels", "captures", "memory", "remat", "compile")


def format_table(header: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    """Columns padded to their widest cell; the last column is left ragged."""
    widths = [max(len(str(r[c])) for r in [header, *rows]) for c in range(len(header) - 1)]
    return [indent + "  ".join([*(str(cell).ljust(w) for cell, w in zip(row, widths)), str(row[-1])]).rstrip()
            for row in [header, *rows]]


def fused_ops(ops: Sequence[str]) -> str:
    """`[ADD, TANH, ADD]` → `ADD ×2, TANH`: each op once, in first-seen order."""
    counts = Counter(ops)
    return ", ".join(op if counts[op] == 1 else f"{op} ×{counts[op]}" for op in dict.fromkeys(ops))


def _section(title: str, lines: list[str]) -> list[str]:
    return ["", f"== {title} ==", *lines]


def _passes(executable: Any) -> list[str]:
    return ["  " + line for line in format_stats(executable.context).splitlines()]


def _kernels(executable: Any) -> list[str]:
    kernels = executable.kernels
    loops = [k for k in kernels if k.kind == "loop"]
    distinct = {k.module for k in loops}
    rows = []
    for k in kernels:
        if k.kind == "loop":
            built = ("cache" if k.from_cache else f"{k.compile_seconds:.2f} s") + \
                (", parallel" if k.parallel else ", serial")
        else:
            built = "library"
        rows.append([k.name, k.kind, "×".join(map(str, k.space)) or "scalar",
                     format_bytes(k.bytes_moved), format_count(k.flops), built, k.module, fused_ops(k.ops)])
    rows.append(["total", "", "", format_bytes(sum(k.bytes_moved for k in kernels)),
                 format_count(sum(k.flops for k in kernels)), "", "", ""])
    summary = (f"  {len(kernels)} steps: {len(loops)} fused loops ({len(distinct)} distinct kernels), "
               f"{len(kernels) - len(loops)} library calls")
    header = ["name", "kind", "iteration space", "bytes moved", "FLOPs", "built", "module", "fused ops"]
    return [summary, *format_table(header, rows)]


def _captures(executable: Any) -> list[str]:
    memory, graph = executable.context.memory, executable.graph
    lines = [(f"  {len(memory.captures)} forward values kept for the backward, "
              f"{format_bytes(memory.capture_bytes)} in all")]
    rows = []
    for node_id, shape, dtype, nbytes in memory.captures:
        node = graph[node_id]
        rows.append([f"%{node_id}", repr(node.name) if node.name else "", node.op.label,
                     f"{np.dtype(dtype).name}{list(shape)}", format_bytes(nbytes)])
    if rows:
        lines += format_table(["value", "name", "op", "type", "size"], rows)
    return lines


def _memory(executable: Any) -> list[str]:
    memory = executable.context.memory
    peak, unfused = memory.peak_bytes, memory.unfused_peak_bytes
    change = f"{100 * (unfused - peak) / unfused:.0f}% less" if unfused else "no values"
    graph = executable.graph
    returned = sum(graph[n].type.nbytes for n in set(graph.outputs) if n in memory.lifetimes)
    return [
        f"  peak {format_bytes(peak)}, unfused op-by-op peak {format_bytes(unfused)} ({change})",
        f"  returned values {format_bytes(returned)}: every plan holds them at its end, so no peak is below",
        (f"  arena {format_bytes(memory.arena_bytes)}: {len(memory.buffer_sizes)} buffers for "
         f"{len(memory.lifetimes)} materialised values, {memory.in_place} written in place"),
    ]


def _remat(executable: Any) -> list[str]:
    """What the memory budget made `remat` keep and recompute (`passes/remat.py`)."""
    remat, graph = executable.context.remat, executable.graph
    if remat is None:
        return ["  no memory budget: every value the backward reads is kept"]
    lines = [(f"  budget {format_bytes(remat.budget_bytes)}: "
              f"planned peak {format_bytes(remat.peak)} "
              f"(default plan {format_bytes(remat.default_peak)}); {len(remat.recomputed)} values "
              f"recomputed in {remat.segments} segment(s), "
              f"{format_bytes(remat.bytes_saved)} no longer kept, "
              f"{format_count(remat.extra_flops)} extra FLOPs")]

    def named(ids: list[int]) -> str:
        text = (f"%{v} {graph[v].op.label}" if v in graph else f"%{v}" for v in ids)
        return ", ".join(text) or "none"

    return lines + [f"  kept: {named(remat.kept)}", f"  recomputed: {named(remat.recomputed)}"]


def _compile(executable: Any) -> list[str]:
    from .backends.numba_cpu.cpu_profile import PROFILE
    from .compile import DeviceExecutable, cache_info  # compile.py imports this module

    timings = executable.timings
    stages = ", ".join(f"{stage} {seconds:.3f} s" for stage, seconds in timings.items())
    distinct = {k.module: k for k in executable.kernels if k.kind == "loop"}.values()
    hits = sum(k.from_cache for k in distinct)
    compiled = [k for k in distinct if not k.from_cache]
    return [
        f"  {stages} (total {sum(timings.values()):.3f} s)",
        (f"  cache: {hits} of {len(distinct)} distinct kernels loaded from the on-disk cache, "
         f"{len(compiled)} compiled by Numba ({sum(k.compile_seconds for k in compiled):.2f} s)"),
        "  cache counters of this process: " + ", ".join(f"{k}={v}" for k, v in cache_info().items()),
        "  target: " + ("cuda" if isinstance(executable, DeviceExecutable) else f"cpu, profile {PROFILE.describe()}"),
    ]


def format_report(executable: Any) -> str:
    """The whole report of a compiled step: one titled section per entry of SECTIONS."""
    graph, stats = executable.graph, executable.context.stats
    before = stats[0].nodes_before if stats else len(graph)
    lines = [(f"compiled step of graph '{graph.name}': {before} nodes before the passes, "
              f"{len(graph)} after, {len(graph.outputs)} outputs")]
    for title, section in zip(SECTIONS, (_passes, _kernels, _captures, _memory, _remat, _compile)):
        lines += _section(title, section(executable))
    return "\n".join(lines)
