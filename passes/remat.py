"""`remat`: recompute forward values in the backward instead of keeping them, to fit a budget.

    ctx.memory_budget = 0.5        # a fraction of the default plan's peak, or bytes
    run(graph, ctx)                # before fuse; its choices in ctx.remat

A training step keeps every forward value the backward reads (its captures)
alive from the forward to the backward, which is what makes a step's peak.
Recomputing a value from other kept values in the backward frees its memory
for that stretch, at the price of computing it twice. Which values to keep is
the question PyTorch's min-cut partitioner answers
(torch/_functorch/partitioners.py); the search here adds the segments of
checkpointing (Chen et al. 2016, `jax.checkpoint` per block), without which a
residual net gains nothing: its stream h makes every value recomputable from
the input by a chain of adds, and that chain, recomputed once for the whole
backward, is alive at its start. Each candidate below is rewritten on a copy
and measured with the real fusion and memory plans, not an estimate.

1. **Segments.** The forward's topological order is cut into S stretches of
   about equal bytes, each cut placed, within its window, where the fewest
   bytes cross it (the residual stream between two blocks); one pass over
   the order. The *boundaries*, values a later stretch reads, are kept, so a
   stretch is recomputed from its own inputs; the last stretch's values are
   kept too (its backward starts as the forward ends). S runs over 1, 2, 3,
   4, 6, 8, ... up to 2·√n, O(log n) counts.
2. **Min-cut.** Per S, a flow network over the forward nodes: each node is split
   into an in- and an out-vertex joined by an edge whose capacity is the
   node's bytes; data edges have infinite capacity; the source feeds every
   feed, constant, boundary and library call (a matmul is not recomputed at
   this stage), and every forward value a backward node reads drains into the
   sink. A minimum cut (networkx's max-flow) is then the set of values of
   least total bytes from which everything the backward reads can be
   recomputed: keep a matmul's output and recompute the cheap cos after it,
   instead of keeping both. Feeds and graph outputs cost nothing to keep
   (the caller holds them, or the plan holds them to the end). The first S
   whose plan meets the budget is taken.
3. **Knapsack over recompute cost.** Else, per S, the plan keeping only the
   boundaries (every stretch recomputed whole) gives its lowest peak; the S
   of the lowest is taken, and from its min-cut the kept values are given up
   greedily by recompute FLOPs per byte freed, cheapest first, library calls
   (matmuls) only when every cheaper value is already recomputed; the batch
   doubles each round, so O(log n) more plans are made.
4. **Rewrite.** Each value given up is cloned (with its chain back to kept
   values and feeds) as backward nodes, once per backward segment that reads
   it (a backward node's segment is that of the forward node whose rule made
   it), and those readers read their segment's clone. The fuser runs each
   clone just before its first reader and fuses it into the backward kernels
   that use it, so a segment's recomputed values live only through that
   segment's backward.

A budget that even recomputing everything cannot meet is a
`MemoryBudgetError` that names the smallest peak found. With no budget, or a
default plan already within it, the pass changes nothing.
"""

from __future__ import annotations

import bisect
import itertools
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import networkx as nx

from gradcompiler.errors import MemoryBudgetError
from gradcompiler.ir import Graph, Node
from gradcompiler.units import format_bytes

from .fuse import op_weight, plan_fusion
from .memory import plan_memory

if TYPE_CHECKING:
    from .pipeline import PassContext


@dataclass
class RematPlan:
    """What the pass chose: the budget in bytes, the default and the final planned peak,
    the forward values the backward keeps and those it recomputes (original node ids),
    the clones built for them (clone id → original), bytes no longer kept and the FLOPs
    the clones add."""

    budget_bytes: int
    default_peak: int
    peak: int
    kept: list[int] = field(default_factory=list)
    recomputed: list[int] = field(default_factory=list)
    clones: dict[int, int] = field(default_factory=dict)
    segments: int = 1
    bytes_saved: int = 0
    extra_flops: int = 0


def budget_bytes(budget: float | int, default_peak: int) -> int:
    """`budget` in bytes: a float in (0, 1] is a fraction of the default plan's peak, an int
    a number of bytes."""
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise ValueError(f"memory_budget must be bytes (an int) or a fraction in (0, 1], "
                         f"got {budget!r}")
    if isinstance(budget, float):
        if not 0.0 < budget <= 1.0:
            raise ValueError(f"memory_budget {budget!r} as a fraction must lie in (0, 1]; "
                             "give bytes as an int")
        return int(budget * default_peak)
    if budget <= 0:
        raise ValueError(f"memory_budget must be positive, got {budget!r}")
    return int(budget)


def node_flops(graph: Graph, node: Node) -> int:
    """What computing `node` once costs, in the fuser's weights (a matmul: 2·m·n·k)."""
    if node.op.kind == "library" and len(node.inputs) == 2:
        a = graph[node.inputs[0]].type
        inner = a.shape[-2] if getattr(node.op, "transpose_a", False) else a.shape[-1]
        return 2 * node.type.size * inner
    if node.op.kind == "reduction":
        return graph[node.inputs[0]].type.size
    return node.type.size * op_weight(node)


def _is_source(node: Node) -> bool:
    return node.op.kind == "source" or node.role in ("input", "param", "const")


def _forward(node: Node) -> bool:
    return node.role == "forward" and not _is_source(node)


def read_by_backward(graph: Graph) -> set[int]:
    """Forward values some backward node reads: what the backward must keep or recompute."""
    return {i for n in graph.nodes.values() if n.role == "backward" for i in n.inputs
            if _forward(graph[i])}


def min_cut_kept(graph: Graph, needed: set[int], free: set[int] = frozenset()) -> set[int]:
    """The forward values of least bytes to keep so that all of `needed` can be recomputed
    from them and from the `free` values (a segmentation's boundaries, kept anyway) (module
    docstring, step 2)."""
    region = graph.ancestors(needed)
    free = set(graph.outputs) | set(free)
    flow = nx.DiGraph()
    for v in region:
        node = graph[v]
        costless = _is_source(node) or v in free
        flow.add_edge(("in", v), ("out", v), capacity=0 if costless else node.type.nbytes)
        if costless or node.op.kind in ("library", "gather", "scatter"):
            flow.add_edge("source", ("in", v))  # computed in the forward, never recomputed
        for i in node.inputs:
            flow.add_edge(("out", i), ("in", v))  # no capacity: infinite
        if v in needed:
            flow.add_edge(("out", v), "sink")
    _, (reachable, _) = nx.minimum_cut(flow, "source", "sink")
    return {v for v in region if ("in", v) in reachable and ("out", v) not in reachable
            and not _is_source(graph[v])}


@dataclass
class Segmentation:
    """The forward cut into `count` stretches of its topological order: `segment_of` maps
    every forward value to its stretch, `boundaries` are the values a later stretch reads
    (kept, so that each stretch is recomputed from its own inputs only)."""

    count: int
    segment_of: dict[int, int]
    boundaries: set[int]


def segment(graph: Graph, order: list[int], count: int) -> Segmentation:
    """Cut the forward values `order` (topological) into `count` stretches of about equal
    bytes, each cut at the position in its window that the fewest bytes cross (module
    docstring, step 1). Linear in the graph."""
    position = {v: p for p, v in enumerate(order)}
    outputs = set(graph.outputs)
    crossing = [0] * (len(order) + 1)  # crossing[q]: bytes made before q and read at q or later
    for p, v in enumerate(order):
        last = max((position[u] for u in graph.nx.successors(v) if u in position), default=p)
        if last > p and v not in outputs:
            crossing[p + 1] += graph[v].type.nbytes
            crossing[last + 1] -= graph[v].type.nbytes
    crossing = list(itertools.accumulate(crossing))
    before = [0, *itertools.accumulate(graph[v].type.nbytes for v in order)]
    total = max(before[-1], 1)
    best: dict[int, tuple[int, float, int]] = {}
    for q in range(1, len(order)):
        j = round(before[q] * count / total)
        if 0 < j < count:
            key = (crossing[q], abs(before[q] * count / total - j), q)
            best[j] = min(best.get(j, key), key)
    cuts = sorted({q for _, _, q in best.values()})
    segment_of = {v: bisect.bisect_right(cuts, p) for p, v in enumerate(order)}
    boundaries = {v for v in order if v not in outputs and any(
        segment_of.get(u, -1) > segment_of[v] for u in graph.nx.successors(v))}
    return Segmentation(len(cuts) + 1, segment_of, boundaries)


def recompute(graph: Graph, kept: set[int], segment_of: Mapping[int, int] = {}) -> dict[int, int]:
    """Clone every forward value the backward reads and `kept` lacks (with its chain back to
    kept values, feeds and graph outputs) as backward nodes, once for each backward segment
    that reads it (a backward node belongs to the segment of the forward node whose rule
    built it); rewire the backward to the clones. Returns clone id → original id."""
    available = kept | set(graph.outputs)
    position = {v: p for p, v in enumerate(graph.topo_order())}
    readers = [n for n in graph.nodes.values() if n.role == "backward"
               and any(_forward(graph[i]) and i not in available for i in n.inputs)]

    def segment_key(reader: Node, value: int) -> int:
        return segment_of.get(reader.origin, segment_of.get(value, 0))

    wanted: dict[int, set[int]] = {}
    for n in readers:
        for i in n.inputs:
            if _forward(graph[i]) and i not in available:
                wanted.setdefault(segment_key(n, i), set()).add(i)
    clone_of: dict[tuple[int, int], int] = {}
    for key, values in sorted(wanted.items()):
        closure, stack = set(), list(values)
        while stack:
            v = stack.pop()
            if v not in closure:
                closure.add(v)
                stack.extend(i for i in graph[v].inputs
                             if _forward(graph[i]) and i not in available)
        for v in sorted(closure, key=position.__getitem__):
            node = graph[v]
            with graph.building("backward", origin=v if node.origin is None else node.origin,
                                site=node.site):
                copy = graph.add(node.op, [clone_of.get((key, i), i) for i in node.inputs])
            clone_of[key, v] = copy.id
    for n in readers:
        key = {i: segment_key(n, i) for i in n.inputs}
        graph.replace_inputs(n.id, tuple(clone_of.get((key[i], i), i) for i in n.inputs))
    return {c: v for (_, v), c in clone_of.items()}


def planned_peak(graph: Graph, ctx: PassContext, clones: Iterable[int] = ()) -> int:
    """The peak of the fusion and memory plans `graph` would get (made on a copy)."""
    work = graph.copy()
    plan = plan_fusion(work, ctx.work, ctx.donated_outputs(work), set(clones), ctx.row_scatter_loops)
    wanted = {work.outputs[k]: work.feed_names[name] for k, name in ctx.donations.items()
              if name in work.feed_names}
    return plan_memory(work, plan, wanted).peak_bytes


@dataclass
class _Trial:
    """One kept set under one segmentation, rewritten and measured."""

    segments: Segmentation
    kept: set[int]
    peak: int
    graph: Graph
    clones: dict[int, int]
    flops: int


def _trial(graph: Graph, ctx: PassContext, segments: Segmentation, kept: set[int]) -> _Trial:
    work = graph.copy()
    clones = recompute(work, kept, segments.segment_of)
    return _Trial(segments, kept, planned_peak(work, ctx, clones), work, clones,
                  sum(node_flops(work, work[c]) for c in clones))


def _give_up_order(graph: Graph, kept: set[int]) -> list[int]:
    """Kept values, cheapest to recompute per byte first, library calls last."""
    def key(v: int):
        node = graph[v]
        return (node.op.kind in ("library", "gather", "scatter"),
                node_flops(graph, node) / max(node.type.nbytes, 1), v)
    return sorted((v for v in kept if v not in graph.outputs), key=key)


def segment_counts(needed: int) -> list[int]:
    """The segment counts tried: 1, then about √2 apart (2, 3, 4, 6, 8, 12, ...) up to
    2·√(values the backward reads), O(log n) of them: √n segments of √n values each is what
    checkpointing a chain needs (Chen et al. 2016), and each count is a full plan to make."""
    counts, k = [1], 0
    while (count := (2, 3)[k % 2] << (k // 2)) <= max(2, math.isqrt(4 * needed)):
        counts.append(count)
        k += 1
    return counts


def _kept_anyway(segments: Segmentation, needed: set[int]) -> set[int]:
    """The boundaries, and with two or more segments the needed values of the last one: its
    backward starts as the forward ends, so a recompute would only repeat the forward."""
    if segments.count == 1:
        return set(segments.boundaries)
    last = segments.count - 1
    return segments.boundaries | {v for v in needed if segments.segment_of[v] == last}


def _search(graph: Graph, ctx: PassContext, target: int, needed: set[int]) -> tuple[_Trial, int]:
    """The chosen trial (module docstring, steps 1–3) and the smallest peak seen."""
    order = [v for v in graph.topo_order() if _forward(graph[v])]
    cuts, trials = [], []
    for count in segment_counts(len(needed)):
        cuts.append(segment(graph, order, count))
        kept = min_cut_kept(graph, needed, cuts[-1].boundaries) | _kept_anyway(cuts[-1], needed)
        trials.append(_trial(graph, ctx, cuts[-1], kept))
        if trials[-1].peak <= target:
            return trials[-1], min(t.peak for t in trials)
    lowest = [_trial(graph, ctx, s, _kept_anyway(s, needed)) for s in cuts]
    best = min(range(len(cuts)), key=lambda k: lowest[k].peak)
    smallest = min(lowest[best].peak, *(t.peak for t in trials))
    if lowest[best].peak > target:
        return min(trials + lowest, key=lambda t: t.peak), smallest
    trial, segments = trials[best], cuts[best]
    kept = set(trial.kept)
    order = _give_up_order(graph, kept - _kept_anyway(segments, needed))
    batch = 1
    while trial.peak > target:
        kept -= set(order[:batch])
        order, batch = order[batch:], batch * 2
        trial = _trial(graph, ctx, segments, kept)
    return trial, smallest


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    """The pass (module docstring): a no-op without `ctx.memory_budget`."""
    if ctx.memory_budget is None:
        return {}
    default = planned_peak(graph, ctx)
    target = budget_bytes(ctx.memory_budget, default)
    needed = read_by_backward(graph)
    if default <= target or not needed:
        ctx.remat = RematPlan(target, default, default, kept=sorted(needed))
        if default > target:
            raise MemoryBudgetError(_too_small(target, default, graph), default)
        return {}
    trial, smallest = _search(graph, ctx, target, needed)
    if trial.peak > target:
        raise MemoryBudgetError(_too_small(target, smallest, graph), smallest)
    graph.adopt(trial.graph)
    recomputed = sorted(set(trial.clones.values()) & needed)
    ctx.remat = RematPlan(
        target, default, trial.peak, kept=sorted(needed - set(recomputed)),
        recomputed=recomputed, clones=trial.clones, segments=trial.segments.count,
        bytes_saved=sum(graph[v].type.nbytes for v in recomputed), extra_flops=trial.flops)
    return {"recomputed": len(recomputed), "clones": len(trial.clones),
            "segments": trial.segments.count}


def _too_small(target: int, smallest: int, graph: Graph) -> str:
    return (f"memory_budget of {format_bytes(target)} ({target} bytes) is below the smallest "
            f"peak any plan of graph '{graph.name}' reaches, {format_bytes(smallest)} "
            f"({smallest} bytes), even with every forward value recomputed in the backward")



run.name = "remat"  # the name the pipeline reports this pass under
