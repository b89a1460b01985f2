"""The optimisation pipeline: an ordered list of named passes run on a copy of a graph.

    optimize(graph, outputs) -> (optimised copy, PassContext)

A pass is a `Pass(name, run)`, where `run(graph, ctx) -> dict[str, int]`
mutates `graph` in place and returns what it rewrote, by kind
("double_negation": 2, ...). The framework, not the pass, measures the rest
of its `PassStats` (node counts, seconds, bytes saved), so a pass holds only
its own logic. `bytes_saved` defaults to the drop in the bytes of every
non-source node's output (what the graph computes); a pass that saves
memory in another way (the memory plan) reports its own figure under the
reserved key `BYTES_SAVED`. A plain function is accepted wherever a `Pass`
is, named by its `name` attribute or `__name__`.

Results that later stages read (the fusion plan, the memory plan) live in the
`PassContext`; the graph itself stays a plain `Graph`. With `debug=True` (or
the environment variable GRADCOMPILER_DEBUG=1) `gradcompiler.ir.verify` runs
after every pass, so a broken rewrite is caught at the pass that broke it.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from gradcompiler.errors import GraphError
from gradcompiler.ir import Graph, verify
from gradcompiler.ops.custom import CustomGradient
from gradcompiler.units import format_bytes

from . import constant_fold, cse, fuse, memory, prune, remat, simplify
from .groups import FusionPlan
from .memory import MemoryPlan
from .remat import RematPlan
from .work import WorkCounter

BYTES_SAVED = "bytes_saved"
"""Reserved key of a pass's result: its own bytes-saved figure, not a rewrite count."""


@dataclass
class PassStats:
    """What one pass did: node counts, rewrites by kind, bytes saved, seconds."""

    name: str
    nodes_before: int
    nodes_after: int
    rewrites: dict[str, int]
    bytes_saved: int
    seconds: float


@dataclass
class PassContext:
    """State shared along the pipeline and handed back to the caller.

    `assume_finite` lets `simplify` fold float `x * 0` to 0, which is wrong
    for inf and NaN, so it is off unless the caller vouches for its data.
    `fold_limit` is the largest constant (in elements) `constant_fold` builds.
    `donations` maps an output's index to the feed whose buffer it should be written
    into (`donation.py`); fuse and memory plan for it. `memory_budget` (bytes, or a
    fraction of the default plan's peak) makes `remat` recompute forward values to meet
    it; its choices land in `remat`. `row_scatter_loops`: whether the target's loops can make
    a scatter-add of rows they feed (`fuse.attach_scatters`; the CPU's can, CUDA's cannot).
    """

    debug: bool = False
    stats: list[PassStats] = field(default_factory=list)
    fusion: FusionPlan | None = None
    memory: MemoryPlan | None = None
    assume_finite: bool = False
    fold_limit: int = constant_fold.DEFAULT_LIMIT
    donations: dict[int, str] = field(default_factory=dict)
    memory_budget: float | int | None = None
    remat: RematPlan | None = None
    row_scatter_loops: bool = True

    def donated_outputs(self, graph: Graph) -> set[int]:
        """The output nodes asked to live in a feed's buffer."""
        return {graph.outputs[k] for k in self.donations}
    work: WorkCounter = field(default_factory=WorkCounter)


PassFunction = Callable[[Graph, PassContext], dict[str, int]]


@dataclass(frozen=True)
class Pass:
    """A named graph transform (see the module docstring for the contract of `run`)."""

    name: str
    run: PassFunction

    def __call__(self, graph: Graph, ctx: PassContext) -> dict[str, int]:
        return self.run(graph, ctx)


def as_pass(p: Pass | PassFunction) -> Pass:
    if isinstance(p, Pass):
        return p
    return Pass(getattr(p, "name", None) or p.__name__, p)


PRUNE = Pass("prune", prune.run)
SIMPLIFY = Pass("simplify", simplify.run)
CSE = Pass("cse", cse.run)
CONSTANT_FOLD = Pass("constant_fold", constant_fold.run)
FUSE = Pass("fuse", fuse.run)
MEMORY = Pass("memory", memory.run)
REMAT = Pass("remat", remat.run)

DEFAULT_PIPELINE: list[Pass] = [PRUNE, SIMPLIFY, CSE, CONSTANT_FOLD, SIMPLIFY, FUSE, MEMORY]
"""The passes `optimize` (and so `gc.compile`) runs by default, in order. FUSE and MEMORY
plan rather than rewrite, so they come last: the memory plan follows the fusion groups.
With a memory budget, REMAT runs just before the first of them (it measures those plans)."""

UNFUSED_PIPELINE: list[Pass] = [p for p in DEFAULT_PIPELINE if p is not FUSE]
"""The default without FUSE: MEMORY then plans the op-by-op program (`memory.singleton_plan`),
the baseline fusion is measured against."""

_PLANNING_PASSES = (FUSE.name, MEMORY.name)
"""Passes whose plans describe the graph as it stands: the graph must not change after them."""




def computed_bytes(graph: Graph) -> int:
    """Bytes of every value the graph computes (every non-source node's output)."""
    return sum(n.type.nbytes for n in graph.nodes.values() if n.op.kind != "source")


def debug_from_env() -> bool:
    return os.environ.get("GRADCOMPILER_DEBUG", "") not in ("", "0")


def _with_extras(passes: list[Pass], extras: list[Pass]) -> list[Pass]:
    """`passes` with `extras` inserted before the first planning pass (appended if there is
    none), so that an extra pass that rewrites the graph never leaves a stale plan."""
    at = next((k for k, p in enumerate(passes) if p.name in _PLANNING_PASSES), len(passes))
    return passes[:at] + extras + passes[at:]


def run_pass(p: Pass, graph: Graph, ctx: PassContext) -> PassStats:
    """Run one pass, measure it, append its stats to `ctx`, verify in debug mode."""
    nodes_before, bytes_before = len(graph), computed_bytes(graph)
    start = time.perf_counter()
    result = dict(p.run(graph, ctx) or {})
    seconds = time.perf_counter() - start
    bytes_saved = result.pop(BYTES_SAVED, bytes_before - computed_bytes(graph))
    stats = PassStats(p.name, nodes_before, len(graph), {k: v for k, v in result.items() if v},
                      int(bytes_saved), seconds)
    ctx.stats.append(stats)
    if ctx.debug:
        try:
            verify(graph)
        except GraphError as err:
            raise GraphError(f"after pass '{p.name}': {err}") from err
    return stats


def optimize(
    graph: Graph,
    outputs: Sequence[int],
    passes: Iterable[Pass | PassFunction] | None = None,
    extra_passes: Iterable[Pass | PassFunction] = (),
    debug: bool = False,
    assume_finite: bool = False,
    donations: dict[int, str] | None = None,
    memory_budget: float | int | None = None,
    row_scatter_loops: bool = True,
) -> tuple[Graph, PassContext]:
    """Run the pipeline on a copy of `graph` whose outputs are `outputs`.

    `passes` replaces DEFAULT_PIPELINE; `extra_passes` are inserted before
    the first planning pass (fuse, or memory). The input graph is never modified. The copy's
    `outputs` may be renumbered by rewrites (an output replaced by an
    equivalent node), in order, one per requested output. `donations`: output index →
    the name of the feed whose buffer that output should take; `memory_budget` for
    `remat`; `row_scatter_loops` for `fuse` (`PassContext`).
    """
    for o in outputs:
        if o not in graph:
            raise GraphError(f"output %{o} is not a node of graph '{graph.name}'")
    work = graph.copy()
    work.outputs = [int(o) for o in outputs]
    inline_custom_gradients(work)
    ctx = PassContext(debug=debug or debug_from_env(), assume_finite=assume_finite,
                      donations=dict(donations or {}), memory_budget=memory_budget,
                      row_scatter_loops=row_scatter_loops)
    chosen = [as_pass(p) for p in (DEFAULT_PIPELINE if passes is None else passes)]
    chosen = _with_extras(chosen, [as_pass(p) for p in extra_passes])
    if memory_budget is not None and REMAT not in chosen:
        chosen = _with_extras(chosen, [REMAT])  # after the extras: it measures the final graph
    for p in chosen:
        run_pass(p, work, ctx)
    return work, ctx


def inline_custom_gradients(graph: Graph) -> None:
    """Replace every CustomGradient node by its forward value. The node only tells the
    differentiation pass, which has run, where a user's backward applies; removed before any
    pass, it costs no pipeline (a user's own included) anything to know of it."""
    for node in [n for n in graph.nodes.values() if isinstance(n.op, CustomGradient)]:
        graph.replace_uses(node.id, node.inputs[-1])
        graph.remove([node.id])


def format_stats(ctx: PassContext) -> str:
    """One line per pass run: nodes before → after, rewrites by kind, bytes saved, time.

    Ends with a summary of the memory plan when one was made.
    """
    width = max((len(s.name) for s in ctx.stats), default=0)
    lines = []
    for s in ctx.stats:
        rewrites = ", ".join(f"{k} ×{v}" for k, v in sorted(s.rewrites.items())) or "no change"
        lines.append(f"{s.name:<{width}}  {s.nodes_before:>4} → {s.nodes_after:<4} nodes  {rewrites}; "
                     f"saved {format_bytes(s.bytes_saved)}  ({s.seconds * 1e3:.1f} ms)")
    if ctx.memory is not None:
        plan = ctx.memory
        lines.append(
            f"memory plan: peak {format_bytes(plan.peak_bytes)} "
            f"(unfused op-by-op {format_bytes(plan.unfused_peak_bytes)}), "
            f"{len(plan.buffer_sizes)} buffers for {len(plan.buffers)} values, "
            f"{len(plan.captures)} captures ({format_bytes(plan.capture_bytes)})")
    return "\n".join(lines)
