"""`fuse`: group the graph's nodes into kernels, the `FusionPlan` in `ctx.fusion`.

Memory traffic, not arithmetic, bounds most of a training step, so the plan
materialises as few values as it can and reads each buffer as few times as
it can.

What is materialised (the *roots*, each stored or reduced by one kernel):
graph outputs; reductions; outputs and operands of library ops (matmul,
gathers, scatters, warps, concat), but for a Fill that a scatter-add of rows
updates (below); and elementwise values that several roots share and that
are expensive to recompute (below). Everything else
is evaluated where it is used: an elementwise op in registers, a view
(reshape, broadcast, transpose, slice, add/remove axis, pixel shuffle) as an
index map of the loop that reads it. So a broadcast is never copied: every
loop that reads it reads the small buffer through a stride-0 index.

Recompute or materialise: an elementwise value used by two or more roots
(or a one-element value read by a loop over more points, which would
recompute it at each: an optimizer's bias correction) is recomputed in each
of them unless its cost (the weights of the ops that
would be recomputed: 1 for arithmetic, 4 for division and square roots, 8
for transcendentals) exceeds RECOMPUTE_LIMIT. Recomputing costs ALU work;
materialising costs a store and a load of the whole value, which for a
memory-bound step is the dearer of the two until a transcendental or two
is involved, or until the recompute reads more than REREAD_LIMIT buffers
of the value's size or larger again (smaller ones, a broadcast statistic,
are not counted): where the two roots run in separate passes, each such
buffer is read from memory again. A batch norm's gradient is such a pair, its
statistics reduced over the batch axis and the gradient made in a second
pass; in the cnn workload the upstream gradient of the stem's batch norm
sums the residual branches' gradients through three ReLU masks, six 8 MB
buffers that both passes read. Materialising it took the cnn step to
0.957-0.971 of its time (medians of 30 steps alternated in one process,
three times). The other workloads' plans are unchanged; gpt's step, timed
the same way, measured 0.975-0.993, which is that method's noise. A small
value recomputed with the shared one (a batch norm's 1/sqrt(var + eps) per
channel) counts for what it reads only where that is full-size too: counted
whole, it materialised two more of the cnn's values, whose removal left the
step at 0.982-0.998 of its time (60 kernels against 58, alternated).

The values are chosen latest first, each judged before the earlier values it
is made from are chosen; one whose recompute then reads within both limits
is recomputed after all (`_recompute_cheap_after_all`). In the cnn a batch
norm's dy·γ, and in gpt layer norms' x − mean and the products made from
it, were stored where each is one operation on another stored value: the
cnn's step now stores 14 full-size buffers instead of 16, gpt's 111 instead
of 131. Alternated in one process (seven rounds of 15-20 steps, the middle
round): the cnn in 0.992 of its time (0.987-0.998), gpt 0.983 (0.969-0.986;
0.992 with the new plan compiled first). In layernorm_gelu, one loop either
way, four values of a row are recomputed in a later phase instead of kept
in a row buffer for it; its time moved within the noise (medians of 200
steps in ten alternated processes, 3.35-5.15 ms either way).

How roots share loops (`FusedLoop`): roots are visited in topological
order; a root joins an earlier loop over the same iteration domain (the
shape it is computed over; a reduction's domain is its input's shape) when
that loop reads a buffer it reads too, or produces a value it needs, and
joining creates no cycle between kernels. A one-element buffer (a learning
rate, a step count) is no reason to join: it is one load per kernel either
way, and a loop that took every update sharing a learning rate streamed
dozens of arrays at once (an AdamW step's eighteen 256×256 updates ran 3.5×
slower in one loop than in one loop each). A loop runs in *phases*, one
after another for each index `i0` of the outermost axis. A root that needs
a value the same loop produced joins a later phase, if it reads that value
only in row `i0` (a row mean, a normalised row) and the value is not a
reduction over axis 0. So one loop can produce full-shape values, row
reductions and column reductions together (bcast_reduce's forward and
backward is one pass over x), and a layer norm's statistics, output and
gradients are one pass over memory.

An elementwise loop that reads a library output (matmul + bias + relu) in
place runs right after the library call, as its epilogue (`FusedLibrary`).
The call writes into the buffer of one of the loop's outputs, so that output
must be one the loop stores (a root only the loop itself reads lives in
registers) and cannot be one that must be written over a feed (donation: the
call would overwrite the feed before the loop reads it); else the loop runs on
its own.

Sibling calls: a library call whose op gives the `Op.sibling_key` of an
earlier call's op (a warp's BackwardMat after its BackwardData, or either
after the warp itself: the same taps) joins that call's group when that
creates no cycle and the group holds no call of its class, and they become
one step (`kernel.SiblingCalls`) that a backend may run as one pass. Such a
group takes no epilogue. On the CPU
the spatial_transformer's two warp gradients then took 1.65-1.68 ms against
1.04 + 1.11 ms as two calls, and its step 2.53 ms against 3.04 (medians of
100-200 steps, a 2-core Intel guest).

A forward value recomputed for the backward (`remat`) joins only a loop that
holds backward work: in a loop of the forward it would be computed, and
kept, in the forward again; and it is visited just before its first reader.

A scatter-add of whole rows onto a Fill (`scatters_rows_onto_fill`: the
gradient of a gather of rows, `zeros(table.shape)` with each looked-up row's
gradient added) does not make the Fill a buffer: the call fills its own
output (`kernel.FilledScatter`), so the CPU fills and updates it a block of
rows at a time, in cache, instead of writing all of it in one kernel and
coming back to each row from memory in the next.

Where the target's loops can (`row_scatter_loops`: the CPU's), the loop
that makes such a scatter's rows makes the scatter too (`attach_scatters`,
`FusedLoop.scatter`): it fills the output and adds each row as it makes it,
so the rows are never written and read back. The loop must be the rows'
only reader (they are no output), its domain their shape, and its axis 0 the
lookups (an index of one axis); a loop that is a gather's epilogue must read
the gathered rows through their positions (an absorbed gather, `lower`), so
the gather writes nothing either. The embedding's step is then one loop:
2.31 ms against 3.50 in `gradcompiler bench` (medians of 20 steps, one run
each; alternated in one process, blocks of 40 steps: 0.87-0.92 of its time),
because the 16.8 MB of gathered gradients are neither stored nor reloaded.

Every node belongs to exactly one group, as the memory pass requires: a
value recomputed by several loops is listed in the first of them, and each
loop's `computes` lists everything it evaluates.

Planning time is linear in the graph (deep graphs are the point: a 2,500-layer
network is 100,000 nodes). One topological order serves every step. The shared
values are chosen in one reverse sweep (`materialise_shared` says why that makes
the same choices as re-deriving every cone after each one). Each root's cone is
walked once; the loops it may join are looked up by the buffers it reads (a loop
sharing no read is never a candidate), and the cycle test runs on `KernelDag`,
which keeps a topological ranking so that a search stays between the two kernels
it relates. `ctx.work` counts the cone walks and visits, for the tests.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import networkx as nx

from gradcompiler.cones import ConeWalker, domain_index, domain_of, is_row_local, node_class
from gradcompiler.ir import Graph, Node
from gradcompiler.ops.elemwise import Elemwise
from gradcompiler.ops.indexing import IndexingIncrMultiAxisVec, IndexingMultiAxisVec, TensorItem
from gradcompiler.ops.source import Constant, Fill
from gradcompiler.view_maps import MultiIndex, is_contiguous_view

from .groups import FusionGroup, FusionPlan
from .kernel_dag import KernelDag
from .work import WorkCounter

if TYPE_CHECKING:
    from .pipeline import PassContext

RECOMPUTE_LIMIT = 8
"""Largest recompute cost (see the module docstring) of a shared value that is not materialised."""

REREAD_LIMIT = 2
"""Most full-size buffers a shared value's recompute may read before it is materialised
(see the module docstring)."""

_TRANSCENDENTAL = {"EXP", "LOG", "LOG1P", "EXPM1", "TANH", "SIGMOID", "ERF", "GELU", "GELU_GRAD",
                   "SOFTPLUS", "SOFTPLUS_GRAD", "POW", "SIN", "COS"}
_DIVISION_LIKE = {"TRUE_DIV", "SQRT", "RSQRT"}


@dataclass(frozen=True)
class FusedLoop(FusionGroup):
    """A loop kernel: `roots` (outputs and values used only inside) with their phases."""

    domain: tuple[int, ...] = ()
    roots: tuple[int, ...] = ()
    phases: tuple[int, ...] = ()
    computes: tuple[int, ...] = ()
    scatter: int | None = None  # a scatter-add of rows onto a Fill that the loop makes (module docstring)


@dataclass(frozen=True)
class FusedLibrary(FusionGroup):
    """A library call, optionally followed by a loop that updates its output in place, or a
    call and its `siblings`, made by one step (module docstring)."""

    call: int = -1
    epilogue: FusedLoop | None = None
    siblings: tuple[int, ...] = ()


def op_weight(node: Node) -> int:
    """What recomputing `node` once costs (views: nothing, they are index arithmetic)."""
    if node.op.kind in ("view", "source"):
        return 0
    if isinstance(node.op, Elemwise):
        if node.op.mode in _TRANSCENDENTAL:
            return 8
        if node.op.mode in _DIVISION_LIKE:
            return 4
    return 1


class _ConeReads(ConeWalker[None]):
    """Collects what a root's cone reads (and where) and which nodes it evaluates."""

    def __init__(self, graph: Graph, extents, materialised: set[int]):
        super().__init__(graph, extents, materialised.__contains__)
        self.reads: dict[int, set[MultiIndex]] = {}
        self.computes: set[int] = set()
        self.scalars: set[int] = set()

    def read(self, node, index):
        self.reads.setdefault(node.id, set()).add(index)

    def scalar(self, node):
        self.scalars.add(node.id)

    def compute(self, node, args):
        self.computes.add(node.id)

    def _evaluate(self, node, index):
        if node.op.kind == "view":
            self.computes.add(node.id)
        return super()._evaluate(node, index)


def cone_of(graph: Graph, root: int, materialised: set[int],
            work: WorkCounter | None = None) -> _ConeReads:
    """What the loop computing `root` reads and evaluates; counted in `work` when given."""
    walker = _ConeReads(graph, domain_of(graph, graph[root]), materialised)
    walker.define(root)
    walker.computes.add(root)
    if work is not None:
        work.cone_evaluations += 1
        work.nodes_visited += len(walker.memo)
    return walker


def is_alias(graph: Graph, node_id: int, materialised: set[int]) -> bool:
    """A materialised reshape-like view of a materialised value shares its buffer."""
    node = graph[node_id]
    return is_contiguous_view(node.op) and node.inputs[0] in materialised


def gathers_whole_rows(node: Node) -> bool:
    """`table[idx]`: advanced indexing of axis 0 by one index tensor, nothing else (§7.2), so
    each index picks a contiguous row and the gather is a row position plus an offset in it."""
    return (isinstance(node.op, IndexingMultiAxisVec) and node.op.items == (TensorItem(0),)
            and len(node.inputs) == 2)


def scatters_rows_onto_fill(graph: Graph, node: Node) -> bool:
    """Whether `node` is `out = full(shape, c); out[idx] += value` with whole rows: a
    scatter-add of axis 0 by one index tensor whose data is a Fill (module docstring)."""
    return (isinstance(node.op, IndexingIncrMultiAxisVec) and node.op.items == (TensorItem(0),)
            and len(node.inputs) == 3 and isinstance(graph[node.inputs[0]].op, Fill))


def mandatory_roots(graph: Graph, outputs: list[int]) -> set[int]:
    """Values that must live in memory whatever the cost (module docstring)."""
    materialised: set[int] = set()

    def need(i: int) -> None:
        if i in materialised:
            return
        materialised.add(i)
        if is_contiguous_view(graph[i].op):
            need(graph[i].inputs[0])

    for node in graph.nodes.values():
        cls = node_class(node)
        if cls in ("buffer_source", "reduction"):
            materialised.add(node.id)
        elif cls == "library":
            materialised.add(node.id)
            for i in node.inputs[1:] if scatters_rows_onto_fill(graph, node) else node.inputs:
                need(i)
    for o in outputs:
        need(o)
    return materialised


def _cone_inputs(graph: Graph, node: Node) -> tuple[int, ...]:
    """The inputs a cone walk visits from `node` (`ConeWalker`): a view reads its source,
    an elementwise op or a reduction (as a root) its operands, a source nothing."""
    cls = node_class(node)
    if cls == "reduction" or (cls == "inline" and node.op.kind == "view"):
        return node.inputs[:1]
    return node.inputs if cls == "inline" else ()


def cone_buffers(graph: Graph, root: int, is_buffer) -> set[int]:
    """The buffers `cone_of(root)` reads (its `reads`), found without carrying indices:
    for a caller that needs which values a loop reads, not where."""
    found, seen, stack = set(), {root}, list(_cone_inputs(graph, graph[root]))
    while stack:
        n = stack.pop()
        if n in seen:
            continue
        seen.add(n)
        if is_buffer(n):
            found.add(n)
        else:
            stack.extend(_cone_inputs(graph, graph[n]))
    return found


def materialise_shared(graph: Graph, materialised: set[int], order: list[int],
                       work: WorkCounter) -> None:
    """Add every shared elementwise value whose recompute cost exceeds RECOMPUTE_LIMIT.

    The rule: materialise, one at a time and the latest in topological order first, a
    value that is in the cones of two or more loop roots and costs more than the limit to
    recompute, until no such value is left. Materialising `m` changes only the cones that
    contained `m` and the costs of values computed from `m`, all of them later than `m`;
    nothing about a value later than `m` that was not chosen changes. So one sweep in
    reverse topological order makes the same choices, each value decided once:

    * cost: what recomputing a value costs (inputs counted per use, as the cone
      evaluates them), from the mandatory roots only (nothing earlier than the value is
      chosen before it), in one forward sweep, saturated above the limit;
    * users: the loop roots whose cone holds the value, found from its consumers, all
      decided by then. Only "two or more" matters, so at most two are kept per value; a
      one-element value in the cone of a loop over more points counts as two, since that
      loop would recompute it at each point.

    A value judged dear from the cones of its inputs may read within the limits once they
    are chosen too; a last sweep, in topological order, recomputes it after all
    (`_recompute_cheap_after_all`).
    """
    cost, reads = _recompute_costs(graph, materialised, order)
    users: dict[int, frozenset[int]] = {}
    wide: set[int] = set()  # in the cone of a loop root over more than one point
    chosen: set[int] = set()
    for n in reversed(order):
        node = graph[n]
        if n not in materialised:
            roots = users.pop(n, frozenset())
            shared = len(roots) >= 2 or (n in wide and node.type.size == 1)
            if shared and node.op.kind == "elementwise" and _dear(n, cost, reads):
                materialised.add(n)
                chosen.add(n)
        if n in materialised:
            roots = frozenset((n,)) if node_class(node) in ("inline", "reduction") else frozenset()
            spreads = bool(roots) and math.prod(domain_of(graph, node)) > 1
        else:
            spreads = n in wide
        for i in _cone_inputs(graph, node):
            if roots and i not in materialised:
                known = users.get(i, frozenset())
                users[i] = known if len(known) >= 2 else frozenset(list(known | roots)[:2])
                if spreads:
                    wide.add(i)
    _recompute_cheap_after_all(graph, materialised, chosen, order)
    work.nodes_visited += 3 * len(order)


def _recompute_costs(graph: Graph, materialised: set[int], order: list[int],
                     decide=None) -> tuple[dict[int, int], dict[int, frozenset[int]]]:
    """Each node's recompute cost (saturated above RECOMPUTE_LIMIT) and full-size reads
    (`_full_size_reads`), given what is materialised: one sweep in topological order.
    `decide(n, cost, reads)`, called once each node's are known, may change whether it is
    materialised before the later nodes are costed."""
    cost: dict[int, int] = {}
    reads: dict[int, frozenset[int]] = {}
    for n in order:
        node = graph[n]
        total = op_weight(node) + sum(cost[i] for i in node.inputs if i not in materialised)
        cost[n] = min(total, RECOMPUTE_LIMIT + 1)
        reads[n] = _full_size_reads(graph, node, materialised, reads)
        if decide is not None:
            decide(n, cost, reads)
    return cost, reads


def _dear(n: int, cost: dict[int, int], reads: dict[int, frozenset[int]]) -> bool:
    """Whether recomputing `n` costs more than materialising it (module docstring)."""
    return cost[n] > RECOMPUTE_LIMIT or len(reads[n]) > REREAD_LIMIT


def _recompute_cheap_after_all(graph: Graph, materialised: set[int], chosen: set[int],
                               order: list[int]) -> None:
    """Recompute a value `materialise_shared` chose whose recompute, from what is materialised
    in the end, is within both limits after all: it was judged before the earlier values it
    is made from were chosen (the sweep goes latest first). A batch norm's gradient times
    gamma, dy·γ, reads dy's own cone (three ReLU masks and two gradients in the cnn) when it
    is judged, and only dy, materialised next, in the end: stored, it cost a store of the
    whole value that the second pass over it does not need.

    One sweep in topological order, with the costs of the values decided so far. A value is
    recomputed only if every value its recompute evaluates is cheap too (`cheap`): those
    become shared by its readers, and none of them may be one the rule would materialise."""
    cheap: dict[int, bool] = {}

    def decide(n: int, cost: dict[int, int], reads: dict[int, frozenset[int]]) -> None:
        cheap[n] = not _dear(n, cost, reads) and all(cheap[i] for i in graph[n].inputs if i not in materialised)
        if n in chosen and cheap[n]:
            materialised.discard(n)

    _recompute_costs(graph, materialised, order, decide)


def _full_size_reads(graph: Graph, node: Node, materialised: set[int],
                     reads: dict[int, frozenset[int]]) -> frozenset[int]:
    """The buffers of node's size or larger that recomputing it reads, at most
    REREAD_LIMIT + 1 of them (enough to decide): its materialised inputs, and what its
    other inputs' recomputations read. Smaller buffers (a broadcast statistic, or the
    variance a small 1/sqrt(var + eps) reads) are left out: re-reading them costs little."""
    size = node.type.size
    found: set[int] = set()
    for i in node.inputs:
        candidates = (i,) if i in materialised else reads.get(i, frozenset())
        found.update(b for b in candidates if graph[b].type.size >= size)
        if len(found) > REREAD_LIMIT:
            return frozenset(list(found)[:REREAD_LIMIT + 1])
    return frozenset(found)


@dataclass
class _Group:
    kind: str  # source, loop, library, alias
    domain: tuple[int, ...] = ()
    roots: list[int] = field(default_factory=list)
    phase: dict[int, int] = field(default_factory=dict)
    reads: dict[int, set[MultiIndex]] = field(default_factory=dict)  # external values read, where
    computes: set[int] = field(default_factory=set)
    scalars: set[int] = field(default_factory=set)
    epilogue: _Group | None = None
    backward: bool = False  # holds backward work that is not a recomputed forward value
    scatter: int | None = None  # the scatter-add of rows onto a Fill it makes (`attach_scatters`)


class _Planner:
    """Builds the groups root by root, keeping the kernel dependency graph acyclic."""

    def __init__(self, graph: Graph, materialised: set[int], work: WorkCounter,
                 recomputed: set[int] = frozenset()):
        self.graph = graph
        self.materialised = materialised
        self.work = work
        self.recomputed = recomputed
        self.groups: list[_Group] = []
        self.producer: dict[int, int] = {}  # materialised node -> group index
        self.loop_readers: dict[int, set[int]] = {}  # value -> the loop groups that read it
        self.siblings: dict[Hashable, int] = {}  # sibling key -> the library group a call may join
        self.dag = KernelDag(work)

    def _new(self, group: _Group, deps) -> int:
        index = len(self.groups)
        self.groups.append(group)
        self.dag.add_node(index)
        for d in deps:
            if d in self.producer and self.producer[d] != index:
                self.dag.add_edge(self.producer[d], index)
        for r in group.roots:
            self.producer[r] = index
        return index

    def add(self, node_id: int) -> None:
        node = self.graph[node_id]
        cls = node_class(node)
        if node_id not in self.materialised:
            if cls == "scalar_source":
                self._new(_Group("source", roots=[node_id]), ())
            return
        if cls == "buffer_source" or isinstance(node.op, Constant):
            self._new(_Group("source", roots=[node_id]), ())
        elif cls == "library":
            self._add_call(node)
        elif is_alias(self.graph, node_id, self.materialised):
            self._new(_Group("alias", roots=[node_id], reads={node.inputs[0]: set()}, computes={node_id}),
                      node.inputs)
        else:
            self._add_root(node_id)

    def _add_call(self, node: Node) -> None:
        """A library call: its own group, or that of an earlier sibling (module docstring)."""
        key = node.op.sibling_key(node.inputs, tuple(self.graph[i].type for i in node.inputs))
        index = self.siblings.pop(key, None) if key is not None else None
        if index is not None and self._joins(index, node):
            group = self.groups[index]
            group.roots.append(node.id)
            group.computes.add(node.id)
            for i in node.inputs:
                group.reads.setdefault(i, set())
                if i in self.producer:
                    self.dag.add_edge(self.producer[i], index)
            self.producer[node.id] = index
            self.siblings[key] = index    # a third call of the same taps may join too
            return
        index = self._new(_Group("library", roots=[node.id], reads={i: set() for i in node.inputs},
                                 computes={node.id}), node.inputs)
        if key is not None:
            self.siblings[key] = index

    def _joins(self, index: int, node: Node) -> bool:
        """Whether call `node` may join the library group `index` of its sibling: an op of
        another class, and no input that the group makes or that depends on it."""
        group = self.groups[index]
        if any(type(self.graph[r].op) is type(node.op) for r in group.roots):
            return False
        producers = {self.producer[i] for i in node.inputs if i in self.producer}
        return index not in producers and not self.dag.reaches_any(index, producers)

    def _worth_sharing(self, value: int) -> bool:
        """Whether two loops reading `value` gain by being one: not for one element (module
        docstring); such a value indexes no loop (`loop_readers`), so the loops of every
        update that reads one learning rate are never all candidates of the next."""
        return self.graph[value].type.size > 1

    def _candidates(self, cone: _ConeReads, domain: tuple[int, ...]) -> list[int]:
        """The loops over `domain` that produce or read a value the cone reads, by index: only
        these can share a read with it (`_fit`), so no other group needs looking at."""
        found = set()
        for d in cone.reads:
            if self._worth_sharing(d):
                found |= self.loop_readers.get(d, set())
            if d in self.producer:
                found.add(self.producer[d])
        self.work.nodes_visited += len(found)
        return sorted(i for i in found if self.groups[i].kind == "loop"
                      and self.groups[i].domain == domain)

    def _add_root(self, root: int) -> None:
        cone = cone_of(self.graph, root, self.materialised, self.work)
        domain = domain_of(self.graph, self.graph[root])
        best = None
        late = root in self.recomputed  # must not join a loop that runs in the forward
        for index in self._candidates(cone, domain):
            if late and not self.groups[index].backward:
                continue
            fit = self._fit(index, self.groups[index], cone)
            if fit is not None and (best is None or fit[1] > best[2]):
                best = (index, fit[0], fit[1])
        if best is None:
            index = self._new(_Group("loop", domain=domain), ())
            phase = 0
        else:
            index, phase, _ = best
        group = self.groups[index]
        group.roots.append(root)
        group.phase[root] = phase
        group.backward |= self.graph[root].role == "backward" and not late
        group.computes |= cone.computes
        group.scalars |= cone.scalars
        for s in cone.scalars:
            if self.producer.get(s, index) != index:
                self.dag.add_edge(self.producer[s], index)
        for d, where in cone.reads.items():
            if d in group.phase:
                continue
            group.reads.setdefault(d, set()).update(where)
            if self._worth_sharing(d):
                self.loop_readers.setdefault(d, set()).add(index)
            if self.producer.get(d, index) != index:
                self.dag.add_edge(self.producer[d], index)
        self.producer[root] = index

    def _fit(self, index: int, group: _Group, cone: _ConeReads) -> tuple[int, int] | None:
        """(phase, shared reads) if the root may join `group`, else None.

        Cheap test first (does it share anything?), the cycle test last.
        """
        shared = sum(1 for d in cone.reads if d in group.phase or (d in group.reads and self._worth_sharing(d)))
        if not shared:
            return None
        phase = 0
        identity = domain_index(group.domain)
        producers = set()
        for d, where in cone.reads.items():
            if d not in group.phase:
                producers.add(self.producer.get(d, index))
                continue
            node = self.graph[d]
            for at in where:
                if not is_row_local(self.graph, node, at, group.domain):
                    return None
                same_phase = node_class(node) != "reduction" and at == identity
                phase = max(phase, group.phase[d] + (0 if same_phase else 1))
        producers.discard(index)
        if self.dag.reaches_any(index, producers):
            return None
        return phase, shared

    # -- epilogues ---------------------------------------------------------------------------
    def attach_epilogues(self, outputs: set[int], needed_outside: set[int],
                         donated: set[int]) -> None:
        """Merge each loop that can update a library output in place into that library group.

        `needed_outside` are the values read outside the loop that computes them: only
        those become a loop's outputs, so only those have a buffer the call can write;
        `donated` outputs live in a feed's buffer, which the call must not write.
        """
        targets = needed_outside - donated
        readers = self._readers()
        for index, group in enumerate(self.groups):
            if group.kind != "loop" or any(group.phase.values()):
                continue
            for d in group.reads:
                lib = self.producer.get(d)
                if (lib is None or self.groups[lib].kind != "library" or self.groups[lib].epilogue
                        or len(self.groups[lib].roots) > 1):
                    continue
                if d in outputs or readers.get(d) != {index} or not self._in_place_target(
                        group, d, targets):
                    continue
                if not self.dag.merge(lib, index):
                    continue
                self.groups[lib].epilogue = group
                group.kind = "epilogue"
                break

    def _in_place_target(self, group: _Group, value: int, targets: set[int]) -> bool:
        """Whether `group` reads `value` only in place and stores an elementwise output of its
        type that may take the library call's result (one of `targets`)."""
        identity = domain_index(group.domain)
        if group.reads[value] != {identity}:
            return False
        t = self.graph[value].type
        return any(node_class(self.graph[r]) != "reduction" and self.graph[r].type == t
                   and r in targets for r in group.roots)

    # -- scatters made by the loop that feeds them ---------------------------------------------
    def _readers(self) -> dict[int, set[int]]:
        """Value -> the kernels that read it: group indices, a library call's epilogue counted
        as its call's group."""
        readers: dict[int, set[int]] = {}
        for index, group in enumerate(self.groups):
            if group.kind in ("epilogue", "merged"):
                continue
            for member in (group, group.epilogue) if group.epilogue else (group,):
                for d in member.reads:
                    readers.setdefault(d, set()).add(index)
        return readers

    def attach_scatters(self, outputs: set[int]) -> set[int]:
        """Let each loop that alone feeds a scatter-add of rows onto a Fill make that scatter
        (module docstring, `_scatter_maker`); returns the rows' values, which no other kernel
        reads now."""
        host = {id(g.epilogue): i for i, g in enumerate(self.groups) if g.epilogue is not None}
        readers, made = self._readers(), set()
        for index, group in enumerate(self.groups):
            node = self._scatter_maker(index, group, host, readers, outputs)
            if node is None or not self.dag.merge(node, index):
                continue
            fill, value, lookups = self.graph[group.roots[0]].inputs
            loop = self.groups[self.producer[value]]
            loop.scatter = group.roots[0]
            loop.reads.setdefault(lookups, set())
            loop.scalars.add(fill)
            self.producer[loop.scatter] = node
            group.kind = "merged"
            made.add(value)
        return made

    def _scatter_maker(self, index: int, group: _Group, host: dict[int, int], readers: dict[int, set[int]],
                       outputs: set[int]) -> int | None:
        """The kernel whose loop may make group `index`'s scatter, or None: the group is a lone
        scatter-add of rows onto a Fill; its rows are a loop's root that nothing else reads
        and no output is; that loop's domain is their shape, with axis 0 the lookups (an index
        of one axis); and a loop that is a gather's epilogue reads the gathered rows through
        their positions (a gather of whole rows, absorbed by `lower`), so its call writes
        nothing the loop would have to wait for."""
        if group.kind != "library" or group.epilogue or len(group.roots) > 1:
            return None
        call = self.graph[group.roots[0]]
        if not scatters_rows_onto_fill(self.graph, call):
            return None
        _, value, lookups = call.inputs
        loop = self.groups[self.producer.get(value, index)]
        if (loop.kind not in ("loop", "epilogue") or loop.scatter is not None or value in outputs
                or readers.get(value) != {index}):
            return None
        if self.graph[lookups].type.ndim != 1 or len(loop.domain) < 2 or loop.domain != self.graph[value].type.shape:
            return None
        node = host.get(id(loop), self.producer[value])
        if loop.kind == "epilogue" and not gathers_whole_rows(self.graph[self.groups[node].roots[0]]):
            return None
        return node

    def execution_order(self) -> list[int]:
        return self.dag.topological_order()


def _owned(planner: _Planner, order: list[int], nodes: list[int]) -> dict[int, list[int]]:
    """Group index -> the nodes it lists: its roots, and what it is first to compute."""
    owner: dict[int, int] = {}
    for index in order:
        group = planner.groups[index]
        members = list(group.roots) + ([] if group.epilogue is None else group.epilogue.roots)
        members += [g.scatter for g in (group, group.epilogue) if g is not None and g.scatter is not None]
        for r in members:
            owner.setdefault(r, index)
    for index in order:
        group = planner.groups[index]
        computes = group.computes | (group.epilogue.computes if group.epilogue else set())
        for n in computes:
            owner.setdefault(n, index)
    owned: dict[int, list[int]] = {}
    for n in nodes:
        owned.setdefault(owner[n], []).append(n)
    return owned


def _visit_order(graph: Graph, recomputed: set[int]) -> list[int]:
    """The topological order groups are made (and so run) in: by node id. With recomputed
    values (remat's clones) a node comes as soon as the earliest node that needs it, and a
    clone no sooner: just before its first reader (computed early, it would be kept as long
    as before). Without that pull, a node made late (a scalar of the loss's gradient) that
    an early backward node reads would hold the backward back behind every node of a lower
    id, the clones of later backward segments included, which would then all be alive."""
    if not recomputed:
        return graph.topo_order()
    urgency: dict[int, float] = {}
    for v in reversed(graph.topo_order()):
        own = float("inf") if v in recomputed else float(v)
        urgency[v] = min([own, *(urgency[u] for u in graph.nx.successors(v))])
    return list(nx.lexicographical_topological_sort(graph.nx, key=lambda v: (urgency[v], v)))


def plan_fusion(graph: Graph, work: WorkCounter | None = None, donated: set[int] = frozenset(),
                recomputed: set[int] = frozenset(), row_scatter_loops: bool = True) -> FusionPlan:
    """The fusion plan of `graph` for its `outputs` (module docstring); the work it does is
    added to `work`. `donated` outputs must be written by a loop, `recomputed` values
    (remat's clones) only in loops of backward work; `row_scatter_loops` where the target's
    loops can make the scatter they feed (`attach_scatters`). One topological order of the
    graph serves every step."""
    work = WorkCounter() if work is None else work
    outputs = list(graph.outputs)
    graph.remove(set(graph.nodes) - graph.ancestors(outputs))  # what prune keeps: nothing else is planned
    nodes = _visit_order(graph, set(recomputed))
    materialised = mandatory_roots(graph, outputs)
    materialise_shared(graph, materialised, nodes, work)
    planner = _Planner(graph, materialised, work, set(recomputed))
    for node_id in nodes:
        planner.add(node_id)
    needed_outside = set(outputs).union(*(group.reads for group in planner.groups))
    planner.attach_epilogues(set(outputs), needed_outside, set(donated))
    if row_scatter_loops:
        needed_outside -= planner.attach_scatters(set(outputs))
    order = planner.execution_order()
    owned = _owned(planner, order, nodes)
    position = {n: k for k, n in enumerate(nodes)}
    return FusionPlan([_finish(graph, planner.groups[i], f"k{step}", owned.get(i, []), needed_outside,
                               materialised, position) for step, i in enumerate(order)])


def _loop_group(graph: Graph, group: _Group, name: str, nodes, needed_outside: set[int],
                position: dict[int, int]) -> FusedLoop:
    roots = tuple(sorted(group.roots, key=position.__getitem__))
    pure = not any(group.phase.values()) and all(
        graph[n].op.kind == "elementwise" or node_class(graph[n]) == "scalar_source" for n in group.computes
    ) and all(graph[n].type.shape == group.domain for n in group.computes) and group.scatter is None
    kind = "loop" if pure else "reduce"
    label = "reduce" if any(node_class(graph[r]) == "reduction" for r in roots) else "loop"
    label = "scatter" if group.scatter is not None else label
    outputs = tuple(r for r in roots if r in needed_outside) + ((group.scatter,) if group.scatter is not None else ())
    inputs = tuple(sorted(set(group.reads) | group.scalars))
    return FusedLoop(f"{name}_{label}", kind, tuple(nodes), outputs, inputs, domain=group.domain, roots=roots,
                     phases=tuple(group.phase[r] for r in roots),
                     computes=tuple(sorted(group.computes, key=position.__getitem__)), scatter=group.scatter)


def _finish(graph: Graph, group: _Group, name: str, nodes: list[int], needed_outside: set[int],
            materialised: set[int], position: dict[int, int]) -> FusionGroup:
    """The FusionGroup of a planned group; a scalar source that is not materialised has no output."""
    if group.kind == "loop":
        return _loop_group(graph, group, name, nodes, needed_outside, position)
    if group.kind == "library":
        call, *siblings = group.roots
        epilogue = group.epilogue
        if epilogue is None:
            return FusedLibrary(f"{name}_library", "library", tuple(nodes), tuple(group.roots),
                                tuple(dict.fromkeys(i for r in group.roots for i in graph[r].inputs)),
                                call=call, siblings=tuple(siblings))
        loop = _loop_group(graph, epilogue, f"{name}_epilogue", (), needed_outside, position)
        inputs = tuple(sorted((set(graph[call].inputs) | set(loop.inputs)) - {call}))
        return FusedLibrary(f"{name}_library", "library", tuple(nodes), loop.outputs, inputs,
                            call=call, epilogue=loop)
    root = group.roots[0]
    outputs = (root,) if root in materialised else ()
    return FusionGroup(f"{name}_{group.kind}", group.kind, tuple(nodes), outputs, tuple(group.reads))


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    """The pass: plan fusion for `graph.outputs`, store it in `ctx.fusion`, count what it did."""
    clones = set(ctx.remat.clones) if ctx.remat else set()
    plan = plan_fusion(graph, ctx.work, ctx.donated_outputs(graph), clones, ctx.row_scatter_loops)
    ctx.fusion = plan
    kernels = plan.kernels()
    recomputed = sum(
        len(set(g.computes) - set(g.nodes)) for g in plan.groups if isinstance(g, FusedLoop))
    return {"kernels": len(kernels), "fused_nodes": sum(len(g.nodes) for g in kernels),
            "recomputed": recomputed,
            "epilogues": sum(1 for g in plan.groups if isinstance(g, FusedLibrary) and g.epilogue)}


run.name = "fuse"  # the name the pipeline reports this pass under
