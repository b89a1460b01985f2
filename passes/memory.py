"""`memory`: execution order, liveness, buffer reuse, peak bytes and captures.

The unit of execution is a fusion group (`groups.py`): the fuse pass's
plan when it ran, else `singleton_plan`, where every node that is neither a
source nor a view is its own kernel (the "unfused op-by-op" program). Only
group outputs are materialised. Views in "alias" groups need no kernel and
no buffer: they share the buffer of the value they view (its *root*).
Sources (feeds, constants, fills) live outside the plan and are not counted.
Every view counts as an alias (a strided read), which is an estimate for
views no stride can express (PixelShuffle): their reader remaps indices.

* Liveness: a root's buffer is live from the step of the group that writes
  it to the last step of a group that reads it (or any alias of it); graph
  outputs stay live to the end.
* Reuse, greedily in execution order: an output first takes the buffer of an
  input that dies in this very group when that is safe (`_in_place_safe`),
  else the smallest free buffer that fits without wasting more than half of
  it, else a new buffer. Graph outputs, live to the end, get buffers of
  their own exact size (or a dying input's, in place). A buffer freed by a
  group is free for the next group, never for its own outputs.
* `peak_bytes` is the most memory the plan occupies at any step: the sizes
  of the buffers holding a live value then. `arena_bytes` is the sum of all
  buffer sizes, what an executor that allocates every buffer up front
  holds. `unfused_peak_bytes` is the baseline of a plain op-by-op executor:
  one buffer per value of the singleton plan, each freed right after its
  last use, at the worst step. In-place updates bring `peak_bytes` below
  the baseline where they happen at the worst step (reuse can cost up to
  twice a value's size); fusion, by not materialising values, more so.
* Captures are the forward values the backward pass keeps alive: forward
  nodes (not feeds or constants) with a buffer of their own that a backward
  node reads from another group. A forward value fused into a backward
  kernel is recomputed there, so it is not a capture.
* Donation (`donation.py`): an output asked to live in a feed's buffer (an
  updated parameter over the parameter) is written there when that is safe,
  after every other reader of the feed; the groups are reordered for it. A
  donated output is no value of the plan: like a source, its memory is the
  caller's. `donated` lists the wishes granted.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from gradcompiler.errors import GraphError
from gradcompiler.ir import Graph

from .donation import schedule_donations
from .groups import FusionGroup, FusionPlan
from .simplify.views import RESHAPE_LIKE

if TYPE_CHECKING:
    from .pipeline import PassContext

GROUP_KIND_OF_OP_KIND = {
    "source": "source", "view": "alias", "elementwise": "loop", "reduction": "reduce",
    "library": "library", "gather": "library", "scatter": "library",
}

Capture = tuple[int, tuple[int, ...], np.dtype, int]


@dataclass
class MemoryPlan:
    """Where every materialised value lives and what that costs.

    `buffers` maps each materialised node, and each alias of one, to a buffer
    index; `buffer_sizes[i]` is buffer i's size in bytes. `lifetimes` maps
    each materialised node to its (first, last) step in `order`. `captures`
    lists (node id, shape, dtype, nbytes) in node order. `in_place` counts
    outputs written over a dying input. `donated` maps each output written over a feed's
    buffer to that feed.
    """

    order: list[FusionGroup]
    buffers: dict[int, int]
    buffer_sizes: list[int]
    lifetimes: dict[int, tuple[int, int]]
    peak_bytes: int
    arena_bytes: int
    unfused_peak_bytes: int
    captures: list[Capture] = field(default_factory=list)
    in_place: int = 0
    donated: dict[int, int] = field(default_factory=dict)

    @property
    def capture_bytes(self) -> int:
        return sum(c[3] for c in self.captures)


def singleton_plan(graph: Graph) -> FusionPlan:
    """Every node its own group, in topological order: the unfused program."""
    groups = []
    for step, node_id in enumerate(graph.topo_order()):
        node = graph[node_id]
        kind = GROUP_KIND_OF_OP_KIND[node.op.kind]
        groups.append(FusionGroup(f"k{step}_{kind}", kind, (node_id,), (node_id,),
                                  tuple(dict.fromkeys(node.inputs))))
    return FusionPlan(groups)


def _check_covers(graph: Graph, plan: FusionPlan) -> None:
    members = [n for g in plan.groups for n in g.nodes]
    if sorted(members) != sorted(graph.nodes):
        missing = sorted(set(graph.nodes) - set(members))
        extra = sorted(set(members) - set(graph.nodes))
        raise GraphError(f"fusion plan does not cover graph '{graph.name}' exactly once "
                         f"(missing {missing[:8]}, unknown {extra[:8]}, {len(members)} members)")


def buffer_roots(plan: FusionPlan) -> dict[int, int]:
    """Materialised node or alias → the materialised value whose memory it is.

    Sources are their own roots (they have memory, just not in the plan).
    """
    root: dict[int, int] = {}
    for group in plan.groups:
        if group.kind == "alias":
            if len(group.inputs) != 1:
                raise GraphError(f"alias group {group.name} views {len(group.inputs)} values, not one")
            for n in group.nodes:
                root[n] = root.get(group.inputs[0], group.inputs[0])
        else:
            for n in group.outputs:
                root[n] = n
    return root


def _lifetimes(graph: Graph, plan: FusionPlan, root: dict[int, int],
               donated: Mapping[int, int] = {}) -> dict[int, tuple[int, int]]:
    """(first, last) step of every materialised value (sources and donated outputs excluded)."""
    end = len(plan.groups)
    first = {n: step for step, g in enumerate(plan.groups) if g.kind not in ("source", "alias")
             for n in g.outputs if n not in donated}
    last = dict(first)
    for step, group in enumerate(plan.groups):
        if group.kind == "alias":
            continue
        for i in group.inputs:
            r = root.get(i, i)
            if r in last:
                last[r] = max(last[r], step)
    for o in graph.outputs:
        r = root.get(o, o)
        if r in last:
            last[r] = end
    return {n: (first[n], last[n]) for n in first}


def _peak_live_bytes(graph: Graph, lifetimes: dict[int, tuple[int, int]]) -> int:
    """Largest sum of live value sizes at any step, one buffer per value."""
    if not lifetimes:
        return 0
    steps = max(last for _, last in lifetimes.values()) + 1
    delta = [0] * (steps + 1)  # Python ints, exact beyond int64 (refused at compile, not wrapped)
    for n, (first, last) in lifetimes.items():
        delta[first] += graph[n].type.nbytes
        delta[last + 1] -= graph[n].type.nbytes
    return max(itertools.accumulate(delta))


def unfused_peak_bytes(graph: Graph) -> int:
    """Peak bytes of the op-by-op program: every value its own buffer, freed after its last use."""
    plan = singleton_plan(graph)
    return _peak_live_bytes(graph, _lifetimes(graph, plan, buffer_roots(plan)))


def _keeps_element_order(graph: Graph, node_id: int, root: int) -> bool:
    """True if `node_id` is `root` or a chain of reshapes of it (same row-major order)."""
    while node_id != root:
        node = graph[node_id]
        if not isinstance(node.op, RESHAPE_LIKE):
            return False
        node_id = node.inputs[0]
    return True


def _in_place_safe(graph: Graph, group: FusionGroup, value: int, out: int, root: dict[int, int]) -> bool:
    """May `out` overwrite the buffer of `value` (an input of `group` dying here)?

    Yes for a lone scatter's data operand (the op is "copy data, then write
    into the copy"), and in an elementwise loop whose members all have out's
    shape or one element (a scalar coefficient, read from no full-shape
    buffer): element i of every member then reads element i of a full-shape
    input, and nothing reads an element after it is written. Either way the
    input must have out's shape, itemsize and element order, and so must
    every other input that views the same buffer (a loop reading x + x.T
    cannot overwrite x); a scatter may read the buffer only as its data, once (its operands
    are counted with repeats: `index_add(a, i, a)` reads a as its values too, and updating
    a in place would add values already updated).
    """
    o, v = graph[out].type, graph[value].type
    if v.dtype.itemsize != o.dtype.itemsize:
        return False
    node = graph[out]
    if group.nodes == (out,) and node.op.kind == "scatter":
        operands = [i for i in node.inputs if root.get(i) == root[value]]
        return operands == [value] and node.inputs[0] == value and _keeps_element_order(graph, value, root[value])
    sharing = [i for i in group.inputs if root.get(i) == root[value]]
    return (group.kind in ("loop", "reduce")
            and all(graph[i].type.shape == o.shape and _keeps_element_order(graph, i, root[value]) for i in sharing)
            and all(graph[m].op.kind == "elementwise"
                    and (graph[m].type.shape == o.shape or graph[m].type.size == 1)
                    for m in group.nodes))


class _Allocator:
    """Buffers of a static plan, reused best-fit among those free.

    A free buffer is reused for a value of at least half its size, so a
    small value never pins a big buffer; otherwise, or when asked for a
    `fresh` one, a new buffer is made. The free buffers are kept sorted by
    (size, index), so the best fit is found by bisection, not by a scan.
    """

    def __init__(self) -> None:
        self.sizes: list[int] = []
        self.free: list[tuple[int, int]] = []  # (size, buffer), sorted

    def take(self, nbytes: int, fresh: bool = False) -> int:
        at = bisect.bisect_left(self.free, (nbytes, -1))
        if not fresh and at < len(self.free) and self.free[at][0] <= 2 * nbytes:
            return self.free.pop(at)[1]
        self.sizes.append(nbytes)
        return len(self.sizes) - 1

    def release(self, buf: int) -> None:
        bisect.insort(self.free, (self.sizes[buf], buf))


def _captures(graph: Graph, plan: FusionPlan, root: dict[int, int], materialised: set[int]) -> list[Capture]:
    group_of = plan.group_of()
    captured: set[int] = set()
    for node in graph.nodes.values():
        if node.role != "backward":
            continue
        for i in node.inputs:
            r = root.get(i)
            if r is None or group_of[i] is group_of[node.id] and group_of[i].kind != "alias":
                continue  # read inside its own kernel: recomputed, not kept
            if r in materialised and graph[r].role == "forward":
                captured.add(r)
    return [(r, graph[r].type.shape, graph[r].type.dtype, graph[r].type.nbytes) for r in sorted(captured)]


def _peak_occupied_bytes(sizes: list[int], buffer_of: dict[int, int],
                         lifetimes: dict[int, tuple[int, int]]) -> int:
    """Largest sum of sizes of the buffers that hold a live value at one step.

    Each buffer's occupied steps are the union of its values' lifetimes: merged per buffer,
    then swept as +size / -size events, so the cost is the number of values, not buffers
    times steps."""
    if not lifetimes:
        return 0
    spans: dict[int, list[tuple[int, int]]] = {}
    for n, span in lifetimes.items():
        spans.setdefault(buffer_of[n], []).append(span)
    events: dict[int, int] = {}

    def occupy(buf: int, first: int, last: int) -> None:
        events[first] = events.get(first, 0) + sizes[buf]
        events[last + 1] = events.get(last + 1, 0) - sizes[buf]

    for buf, intervals in spans.items():
        intervals.sort()
        start, end = intervals[0]
        for first, last in intervals[1:]:
            if first <= end + 1:
                end = max(end, last)
            else:
                occupy(buf, start, end)
                start, end = first, last
        occupy(buf, start, end)
    peak = live = 0
    for step in sorted(events):
        live += events[step]
        peak = max(peak, live)
    return peak


def plan_memory(graph: Graph, plan: FusionPlan | None = None,
                donations: Mapping[int, int] | None = None) -> MemoryPlan:
    """The memory plan of `graph` executed group by group in `plan`'s order (reordered only
    for the `donations` granted: output node → the feed node whose buffer it should take)."""
    plan = plan or singleton_plan(graph)
    _check_covers(graph, plan)
    root = buffer_roots(plan)
    groups, donated = schedule_donations(graph, plan, root, donations or {}, _in_place_safe)
    plan = FusionPlan(groups)
    for out, feed in donated.items():
        root[out] = feed
    lifetimes = _lifetimes(graph, plan, root, donated)
    dying: dict[int, list[int]] = {}
    for n, (_, last) in lifetimes.items():
        dying.setdefault(last, []).append(n)
    alloc, buffer_of, in_place = _Allocator(), {}, 0
    for step, group in enumerate(plan.groups):
        if group.kind in ("source", "alias"):
            continue
        inherited = set()
        for out in (o for o in group.outputs if o not in donated):
            nbytes = graph[out].type.nbytes
            donor = next((root[i] for i in group.inputs
                          if root.get(i) in lifetimes and lifetimes[root[i]][1] == step
                          and buffer_of[root[i]] not in inherited
                          and _in_place_safe(graph, group, i, out, root)), None)
            if donor is not None:
                buffer_of[out] = buffer_of[donor]
                inherited.add(buffer_of[out])
                in_place += 1
            else:
                buffer_of[out] = alloc.take(nbytes, fresh=lifetimes[out][1] == len(plan.groups))
        for n in dying.get(step, ()):
            if buffer_of[n] not in inherited:
                alloc.release(buffer_of[n])
    buffers = {n: buffer_of[r] for n, r in root.items() if r in buffer_of}
    return MemoryPlan(
        order=list(plan.groups), buffers=buffers, buffer_sizes=alloc.sizes, lifetimes=lifetimes,
        peak_bytes=_peak_occupied_bytes(alloc.sizes, buffer_of, lifetimes), arena_bytes=sum(alloc.sizes),
        unfused_peak_bytes=unfused_peak_bytes(graph),
        captures=_captures(graph, plan, root, set(lifetimes)), in_place=in_place, donated=donated)


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    """The pass: plan memory for the fusion plan (or op by op), honouring `ctx.donations`
    (output index → feed name); the plan's order becomes the fusion plan's."""
    wanted = {graph.outputs[k]: graph.feed_names[name] for k, name in ctx.donations.items()
              if name in graph.feed_names}
    plan = plan_memory(graph, ctx.fusion, wanted)
    ctx.memory = plan
    if ctx.fusion is not None:
        ctx.fusion = FusionPlan(plan.order)
    return {"buffers": len(plan.buffer_sizes), "values": len(plan.lifetimes), "in_place": plan.in_place,
            "donated": len(plan.donated),
            "bytes_saved": plan.unfused_peak_bytes - plan.peak_bytes}  # pipeline.BYTES_SAVED
