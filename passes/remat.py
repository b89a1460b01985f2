"""`remat`: recompute forward values in the backward instead of keeping them, to fit a budget.

    ctx.memory_budget = 0.5        # a fraction of the default plan's peak, or bytes
    run(graph, ctx)                # before fuse; its choices in ctx.remat

A training step keeps every forward value the backward reads (its captures)
alive from the forward to the backward, which is what makes a step's peak.
Recomputing a value from other kept values in the backward frees its memory
for that stretch, at the price of computing it twice. Which values to keep is
the question PyTorch's min-cut partitioner answers
(torch/_functorch/partitioners.py), and it is answered the same way here:

1. **Min-cut.** A flow network over the forward nodes: each node is split
   into an in- and an out-vertex joined by an edge whose capacity is the
   node's bytes; data edges have infinite capacity; the source feeds every
   feed, constant and library call (a matmul is not recomputed at this
   stage), and every forward value a backward node reads drains into the
   sink. A minimum cut (networkx's max-flow) is then the set of values of
   least total bytes from which everything the backward reads can be
   recomputed: keep a matmul's output and recompute the cheap cos after it,
   instead of keeping both. Feeds and graph outputs cost nothing to keep
   (the caller holds them, or the plan holds them to the end).
2. **Knapsack over recompute cost.** If the plan still peaks above the
   budget, kept values are given up greedily by recompute FLOPs per byte
   freed, cheapest first, and library calls (matmuls) only when every
   cheaper value is already recomputed; the batch doubles each round, so
   the fusion and memory plans are made O(log n) times. Each round is
   measured with the real fusion and memory plans, not an estimate.
3. **Rewrite.** Each value given up is cloned (with its chain back to kept
   values and feeds, each node once) as a backward node, and the backward
   nodes that read it read the clone; the fuser then fuses the clones into
   the backward kernels that use them.

A budget that even recomputing everything cannot meet is a
`MemoryBudgetError` that names the smallest peak found. With no budget, or a
default plan already within it, the pass changes nothing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterable

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


def min_cut_kept(graph: Graph, needed: set[int]) -> set[int]:
    """The forward values of least bytes to keep so that all of `needed` can be recomputed
    from them (module docstring, step 1)."""
    region = graph.ancestors(needed) | needed
    outputs = set(graph.outputs)
    flow = nx.DiGraph()
    for v in region:
        node = graph[v]
        free = _is_source(node) or v in outputs
        flow.add_edge(("in", v), ("out", v), capacity=0 if free else node.type.nbytes)
        if free or node.op.kind in ("library", "gather", "scatter"):
            flow.add_edge("source", ("in", v))  # computed in the forward, never recomputed
        for i in node.inputs:
            flow.add_edge(("out", i), ("in", v))  # no capacity: infinite
        if v in needed:
            flow.add_edge(("out", v), "sink")
    _, (reachable, _) = nx.minimum_cut(flow, "source", "sink")
    return {v for v in region if ("in", v) in reachable and ("out", v) not in reachable
            and not _is_source(graph[v])}


def recompute(graph: Graph, kept: set[int]) -> dict[int, int]:
    """Clone every forward value the backward reads and `kept` lacks (with its chain back to
    kept values, feeds and graph outputs) as backward nodes; rewire the backward to the
    clones. Returns clone id → original id."""
    available = kept | set(graph.outputs)
    wanted = {v for v in read_by_backward(graph) if v not in available}
    closure, stack = set(), list(wanted)
    while stack:
        v = stack.pop()
        if v in closure:
            continue
        closure.add(v)
        stack.extend(i for i in graph[v].inputs if _forward(graph[i]) and i not in available)
    clone_of: dict[int, int] = {}
    for v in graph.topo_order(closure):
        node = graph[v]
        with graph.building("backward", origin=node.origin if node.origin is not None else v,
                            site=node.site):
            copy = graph.add(node.op, [clone_of.get(i, i) for i in node.inputs])
        clone_of[v] = copy.id
    for n in [n for n in graph.nodes.values() if n.role == "backward" and n.id not in
              clone_of.values() and any(i in clone_of for i in n.inputs)]:
        graph.replace_inputs(n.id, tuple(clone_of.get(i, i) for i in n.inputs))
    return {c: v for v, c in clone_of.items()}


def planned_peak(graph: Graph, ctx: PassContext, clones: Iterable[int] = ()) -> int:
    """The peak of the fusion and memory plans `graph` would get (made on a copy)."""
    work = graph.copy()
    plan = plan_fusion(work, ctx.work, ctx.donated_outputs(work), set(clones))
    wanted = {work.outputs[k]: work.feed_names[name] for k, name in ctx.donations.items()
              if name in work.feed_names}
    return plan_memory(work, plan, wanted).peak_bytes


def _trial(graph: Graph, ctx: PassContext, kept: set[int]) -> tuple[int, Graph, dict[int, int]]:
    work = graph.copy()
    clones = recompute(work, kept)
    return planned_peak(work, ctx, clones), work, clones


def _give_up_order(graph: Graph, kept: set[int]) -> list[int]:
    """Kept values, cheapest to recompute per byte first, library calls last."""
    def key(v: int):
        node = graph[v]
        return (node.op.kind in ("library", "gather", "scatter"),
                node_flops(graph, node) / max(node.type.nbytes, 1), v)
    return sorted((v for v in kept if v not in graph.outputs), key=key)


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
            raise MemoryBudgetError(_too_small(target, default, graph))
        return {}
    kept = min_cut_kept(graph, needed)
    peak, work, clones = _trial(graph, ctx, kept)
    best = peak
    order = _give_up_order(graph, kept)
    batch = 1
    while peak > target and order:
        kept -= set(order[:batch])
        order, batch = order[batch:], batch * 2
        peak, work, clones = _trial(graph, ctx, kept)
        best = min(best, peak)
    if peak > target:
        raise MemoryBudgetError(_too_small(target, best, graph))
    _adopt(graph, work)
    recomputed = sorted(set(clones.values()) & needed)
    ctx.remat = RematPlan(
        target, default, peak, kept=sorted(needed - set(recomputed)), recomputed=recomputed,
        clones=clones, bytes_saved=sum(graph[v].type.nbytes for v in recomputed),
        extra_flops=sum(node_flops(graph, graph[c]) for c in clones))
    return {"recomputed": len(recomputed), "clones": len(clones)}


def _too_small(target: int, smallest: int, graph: Graph) -> str:
    return (f"memory_budget of {format_bytes(target)} ({target} bytes) is below the smallest "
            f"peak any plan of graph '{graph.name}' reaches, {format_bytes(smallest)} "
            f"({smallest} bytes), even with every forward value recomputed in the backward")


def _adopt(graph: Graph, work: Graph) -> None:
    """Make `graph` the rewritten copy (passes mutate the graph they are given)."""
    graph.nodes, graph.nx, graph.outputs = work.nodes, work.nx, work.outputs
    graph.feed_names, graph.scopes, graph._next_id = work.feed_names, work.scopes, work._next_id


run.name = "remat"  # the name the pipeline reports this pass under
