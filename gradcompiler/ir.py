"""The graph IR: `TensorType`, `Op`, `Node`, `Graph` and `verify`.

This module owns the data every later stage reads and nothing else: it knows
no concrete op, no rule, no pass and no backend.

* `TensorType` is a static shape and a numpy dtype. Every shape is known when
  a node is built, so shape and dtype mistakes surface at build time.
* `Op` is the base of frozen, hashable dataclasses (one class per op kind,
  parameters as fields). Hashability is what lets CSE and the structural
  kernel cache key on ops. Each op states its `kind` for fusion and
  implements `infer` (output type, or a clear error) and `reference` (numpy).
* `Node` is immutable: id, op, input ids, output type, role, optional user
  name, the user's call site, and for backward nodes the forward node whose
  rule built them (`origin`).
* `Graph` keeps nodes in a dict and their edges in a `networkx.MultiDiGraph`
  (edge key = input slot), which gives topological order, ancestors and
  descendants for free. Graph mutation used by passes (`replace_uses`,
  `remove`) keeps the two in step.

Call sites are the first stack frame outside this library, so an error
raised deep inside a composite (say `layer_norm`) still points at the user's
own line.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import heapq
import math
import os
import sys
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import networkx as nx
import numpy as np

from .errors import BuildError, GraphError, ShapeError

ROLES = ("input", "param", "const", "forward", "backward")

_LIBRARY_DIRS = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "passes") + os.sep,
)


def call_site() -> str:
    """`file:line` of the innermost stack frame outside this library."""
    frame = sys._getframe(1)
    while frame is not None:
        filename = os.path.abspath(frame.f_code.co_filename)
        if not filename.startswith(_LIBRARY_DIRS) and "contextlib" not in filename:
            return f"{filename}:{frame.f_lineno}"
        frame = frame.f_back
    return "<unknown>"


@dataclass(frozen=True)
class TensorType:
    """A static shape and a dtype: all the IR knows about a value."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(int(d) for d in self.shape))
        object.__setattr__(self, "dtype", np.dtype(self.dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @functools.cached_property
    def size(self) -> int:
        """Elements (kept once computed: the passes ask for every node's size, often)."""
        return math.prod(self.shape)

    @functools.cached_property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.name}{list(self.shape)}"


@dataclass(frozen=True)
class Op:
    """Base of every op. Subclasses are `@dataclass(frozen=True)`.

    `kind` is one of: source, elementwise, reduction, view, gather, scatter,
    library. `arity` is the number of inputs, or None for ops that check it
    themselves.
    """

    kind: ClassVar[str] = "elementwise"
    arity: ClassVar[int | None] = None

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def label(self) -> str:
        """How errors and dumps name this op (Elemwise adds its mode)."""
        return self.name

    def params(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def describe(self) -> str:
        inner = ", ".join(f"{k}={v}" for k, v in self.params().items())
        return f"{self.name}({inner})" if inner else self.name

    def infer(self, *inputs: TensorType) -> TensorType:
        raise NotImplementedError

    def reference(self, *arrays: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def sibling_key(self, inputs: tuple[int, ...], types: tuple[TensorType, ...]) -> Hashable | None:
        """For a library op: a key that a call of another op reading the same values the same
        way gives too (`inputs`: the call's input node ids, `types`: their types). Fusion
        makes such calls one step that a backend may run as one pass (`kernel.SiblingCalls`).
        None, the default: the call has no sibling."""
        return None

    def shape_error(self, message: str) -> ShapeError:
        return ShapeError(message, op=self.label)

    def check_arity(self, inputs: tuple[TensorType, ...]) -> None:
        if self.arity is not None and len(inputs) != self.arity:
            raise GraphError(f"takes {self.arity} inputs, got {len(inputs)}", op=self.label)


@dataclass(frozen=True)
class Node:
    id: int
    op: Op
    inputs: tuple[int, ...]
    type: TensorType
    role: str
    name: str | None = None
    site: str = "<unknown>"
    origin: int | None = None

    def __str__(self) -> str:
        tag = f" '{self.name}'" if self.name else ""
        return f"%{self.id}{tag} = {self.op.describe()}{list(self.inputs)} : {self.type}"


def smallest_first_order(waiting: dict[int, int], successors: Callable[[int], Iterable[int]]) -> list[int]:
    """Kahn's algorithm taking the smallest ready id first, so the order is the same whatever
    the dicts' order. `waiting` (consumed) holds each node's count of unfinished predecessors;
    nodes on a cycle are left out of the result."""
    ready = [n for n, count in waiting.items() if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        n = heapq.heappop(ready)
        order.append(n)
        for s in successors(n):
            waiting[s] -= 1
            if waiting[s] == 0:
                heapq.heappush(ready, s)
    return order


_CURRENT: list[Graph] = []


def current_graph() -> Graph:
    if not _CURRENT:
        raise GraphError("no graph is open: build inside `with gc.Graph() as g:`", site=call_site())
    return _CURRENT[-1]


@dataclass
class _BuildContext:
    role: str
    origin: int | None
    site: str | None


class Graph:
    """A static dataflow graph of single-output nodes."""

    def __init__(self, name: str = "graph") -> None:
        self.name = name
        self.nodes: dict[int, Node] = {}
        self.nx = nx.MultiDiGraph()
        self.outputs = []
        self.feed_names: dict[str, int] = {}
        self.scopes: dict[int, str] = {}  # node id -> the labelled composite that built it
        self._next_id = 0
        self._context: list[_BuildContext] = [_BuildContext("forward", None, None)]
        self._order: list[int] | None = None  # topo_order() until the next mutation

    # -- context -------------------------------------------------------------
    def __enter__(self) -> Graph:
        _CURRENT.append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT.remove(self)

    @contextlib.contextmanager
    def building(self, role: str, origin: int | None = None, site: str | None = None):
        """Context in which new nodes get `role`, `origin` and `site` (autodiff uses it)."""
        self._context.append(_BuildContext(role, origin, site))
        try:
            yield
        finally:
            self._context.pop()

    def scope(self, label: str):
        """Context whose new nodes belong to the composite `label` (a custom gradient's
        forward): dumps draw them as one cluster. Nested scopes keep the innermost label."""
        graph = self

        class _Scope:
            def __enter__(self_inner):
                self_inner.start = graph._next_id

            def __exit__(self_inner, *exc):
                for node_id in range(self_inner.start, graph._next_id):
                    if node_id in graph.nodes:
                        graph.scopes.setdefault(node_id, label)

        return _Scope()

    # -- building --------------------------------------------------------------
    def add(
        self,
        op: Op,
        inputs: Iterable[int] = (),
        *,
        role: str | None = None,
        name: str | None = None,
        site: str | None = None,
    ) -> Node:
        inputs = tuple(int(i) for i in inputs)
        context = self._context[-1]
        site = site or context.site or call_site()
        for i in inputs:
            if i not in self.nodes:
                raise GraphError(f"input %{i} is not a node of graph '{self.name}'", op=op.label, site=site)
        types = tuple(self.nodes[i].type for i in inputs)
        try:
            op.check_arity(types)
            out_type = op.infer(*types)
        except BuildError as err:
            raise (err if err.site else err.at(site)) from None
        role = role or context.role
        if role not in ROLES:
            raise GraphError(f"unknown role {role!r}", op=op.label, site=site)
        node = Node(self._next_id, op, inputs, out_type, role, name, site, context.origin)
        self._next_id += 1
        self._insert(node)
        return node

    def _insert(self, node: Node) -> None:
        self._order = None
        self.nodes[node.id] = node
        self.nx.add_node(node.id)
        for slot, i in enumerate(node.inputs):
            self.nx.add_edge(i, node.id, key=slot)

    @property
    def outputs(self) -> list[int]:
        """The graph's outputs, in order. Assign a new list to change them (not in place):
        `is_output` answers from a set built on assignment."""
        return self._outputs

    @outputs.setter
    def outputs(self, ids: Iterable[int]) -> None:
        self._outputs = list(ids)
        self._output_ids = frozenset(self._outputs)

    def is_output(self, node_id: int) -> bool:
        return node_id in self._output_ids

    # -- queries ---------------------------------------------------------------
    def __getitem__(self, node_id: int) -> Node:
        return self.nodes[node_id]

    def __contains__(self, node_id: int) -> bool:
        return node_id in self.nodes

    def __len__(self) -> int:
        return len(self.nodes)

    def topo_order(self, ids: Iterable[int] | None = None) -> list[int]:
        """Deterministic topological order (ties broken by node id: the smallest ready node
        first). The order of the whole graph is kept until the graph changes, so passes that
        ask for it again do not sort again; the caller must not modify the list."""
        if ids is None and self._order is not None:
            return self._order
        members = set(self.nodes) if ids is None else set(ids)
        waiting = dict.fromkeys(members, 0)
        readers: dict[int, list[int]] = {n: [] for n in members}
        for n in members:
            for i in self.nodes[n].inputs:
                if i in members:
                    waiting[n] += 1
                    readers[i].append(n)
        order = smallest_first_order(waiting, readers.__getitem__)
        if len(order) < len(members):  # a pass rewired a node into its own ancestors
            cycle = [u for u, *_ in nx.find_cycle(self.nx.subgraph(members))]
            raise GraphError(f"graph '{self.name}' has a cycle through nodes {cycle}")
        if ids is None:
            self._order = order
        return order

    def _closure(self, ids: Iterable[int], step) -> set[int]:
        """The given nodes and every node reached from them by `step(node_id)`, in one walk."""
        result = set(ids)
        stack = list(result)
        while stack:
            for m in step(stack.pop()):
                if m not in result:
                    result.add(m)
                    stack.append(m)
        return result

    def ancestors(self, ids: Iterable[int]) -> set[int]:
        """The given nodes and every node they depend on."""
        return self._closure(ids, lambda n: self.nodes[n].inputs)

    def descendants(self, ids: Iterable[int]) -> set[int]:
        """The given nodes and every node that depends on them."""
        return self._closure(ids, lambda n: self.nx.succ[n])

    def consumers(self, node_id: int) -> list[int]:
        return sorted(set(self.nx.successors(node_id)))

    # -- mutation (passes) -------------------------------------------------------
    def replace_inputs(self, node_id: int, inputs: tuple[int, ...], op: Op | None = None) -> Node:
        """Rewire one node (optionally with a new op of the same output type)."""
        self._order = None
        old = self.nodes[node_id]
        new = dataclasses.replace(old, inputs=tuple(inputs), op=op or old.op)
        self.nx.remove_edges_from([(u, node_id, k) for u, _, k in self.nx.in_edges(node_id, keys=True)])
        self.nodes[node_id] = new
        for slot, i in enumerate(new.inputs):
            self.nx.add_edge(i, node_id, key=slot)
        return new

    def replace_uses(self, old: int, new: int) -> None:
        """Point every consumer (and output) of `old` at `new` instead."""
        if old == new:
            return
        for consumer in self.consumers(old):
            node = self.nodes[consumer]
            self.replace_inputs(consumer, tuple(new if i == old else i for i in node.inputs))
        if self.is_output(old):
            self.outputs = [new if o == old else o for o in self.outputs]

    def remove(self, ids: Iterable[int]) -> None:
        gone = set(ids)
        if not gone:
            return
        self._order = None
        feeds = False
        for i in gone:
            node = self.nodes.pop(i, None)
            feeds = feeds or (node is not None and node.role in ("input", "param"))
            if self.nx.has_node(i):
                self.nx.remove_node(i)
        if feeds:
            self.feed_names = {name: nid for name, nid in self.feed_names.items()
                               if nid not in gone}

    def copy(self, name: str | None = None) -> Graph:
        clone = Graph(name or self.name)
        clone.nodes = dict(self.nodes)
        # rebuilt from the inputs (edges carry no data): a third faster than networkx's copy
        clone.nx.add_nodes_from(self.nodes)
        clone.nx.add_edges_from((i, node.id, slot) for node in self.nodes.values()
                                for slot, i in enumerate(node.inputs))
        clone.outputs = list(self.outputs)
        clone.feed_names = dict(self.feed_names)
        clone.scopes = dict(self.scopes)
        clone._next_id = self._next_id
        return clone

    def adopt(self, other: Graph) -> None:
        """Become `other` (a rewritten copy: a pass that plans on copies keeps the one it
        chose), every cache included."""
        self.nodes, self.nx, self.outputs = other.nodes, other.nx, other.outputs
        self.feed_names, self.scopes, self._next_id = other.feed_names, other.scopes, other._next_id
        self._order = None

    def feeds(self) -> list[Node]:
        """Input and param nodes, in id order."""
        return [n for n in self.nodes.values() if n.role in ("input", "param")]

    def __str__(self) -> str:
        lines = [f"graph {self.name} ({len(self.nodes)} nodes)"]
        lines += [f"  {self.nodes[i]}" for i in self.topo_order()]
        if self.outputs:
            lines.append(f"  outputs: {self.outputs}")
        return "\n".join(lines)


def verify(graph: Graph) -> None:
    """Check every invariant of `graph`; raise GraphError on the first broken one.

    Acyclic; edges equal node inputs; every input exists; arity holds; every
    node's type re-infers equal; outputs exist.
    """
    if not nx.is_directed_acyclic_graph(graph.nx):
        cycle = nx.find_cycle(graph.nx)
        raise GraphError(f"graph '{graph.name}' has a cycle through nodes {[u for u, *_ in cycle]}")
    if set(graph.nx.nodes) != set(graph.nodes):
        raise GraphError(f"graph '{graph.name}': edge store and node store disagree")
    for node in graph.nodes.values():
        for i in node.inputs:
            if i not in graph.nodes:
                raise GraphError(f"node %{node.id} reads %{i}, which is not in the graph", op=node.op.label,
                                 site=node.site)
        edges = sorted((k, u) for u, _, k in graph.nx.in_edges(node.id, keys=True))
        if edges != list(enumerate(node.inputs)):
            raise GraphError(f"node %{node.id}: edges {edges} do not match inputs {node.inputs}", op=node.op.label)
        types = tuple(graph.nodes[i].type for i in node.inputs)
        node.op.check_arity(types)
        inferred = node.op.infer(*types)
        if inferred != node.type:
            raise GraphError(f"node %{node.id}: type {node.type} but inputs infer {inferred}",
                             op=node.op.label, site=node.site)
    for o in graph.outputs:
        if o not in graph.nodes:
            raise GraphError(f"output %{o} is not in graph '{graph.name}'")


@dataclass(frozen=True, eq=False)
class ConstValue:
    """An ndarray that hashes and compares by content, so ops holding it stay hashable."""

    array: np.ndarray = field(repr=False)

    def __post_init__(self) -> None:
        arr = np.array(self.array, order="C")  # not ascontiguousarray, which turns 0-d into (1,)
        arr.setflags(write=False)
        object.__setattr__(self, "array", arr)

    def __hash__(self) -> int:
        return hash((self.array.shape, self.array.dtype.str, self.array.tobytes()))

    def __eq__(self, other: object) -> bool:
        return (
            isinstance(other, ConstValue)
            and self.array.shape == other.array.shape
            and self.array.dtype == other.array.dtype
            and self.array.tobytes() == other.array.tobytes()
        )

    def __repr__(self) -> str:
        if self.array.size <= 4:
            return np.array2string(self.array, separator=",")
        return f"<{self.array.dtype.name}{list(self.array.shape)}>"
