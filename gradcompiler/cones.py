"""The cone of a fused value: everything a kernel evaluates to produce it.

A fused kernel computes a few *roots* (values stored to memory, or reduced)
over an iteration domain. Each root is an expression over the values the
kernel does not compute itself (buffers: feeds, constants, outputs of other
kernels), through elementwise ops evaluated in registers and view ops
turned into index maps. `ConeWalker` walks that expression from a root down
to its buffers, carrying the multi-index at which each value is needed as
`Index` expressions of the loop indices. Subclasses decide what a visit
produces: the fuser collects which buffers are read where (to decide what
may share a loop), the lowering emits Kernel IR instructions.

The classification of nodes lives here too, so that the fuser and the
lowering agree on it:

* `buffer_source`: a feed or a constant of more than one element;
* `scalar_source`: a Fill or a one-element constant, read as one value;
* `inline`: an elementwise or view op the walker evaluates in place;
* `reduction`: Reduce and ReduceTo, always a root;
* `library`: everything else (matmul, gathers, scatters, warps, concat).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

from .index_expr import Index
from .ir import Graph, Node
from .ops.reduce import Reduce, ReduceTo, reduce_to_axes
from .ops.source import Constant, Fill, Placeholder
from .view_maps import MultiIndex, broadcast_index, is_view, view_index

T = TypeVar("T")


def node_class(node: Node) -> str:
    """One of buffer_source, scalar_source, inline, reduction, library (module docstring)."""
    op = node.op
    if isinstance(op, Fill) or (isinstance(op, Constant) and node.type.size == 1):
        return "scalar_source"
    if isinstance(op, (Placeholder, Constant)):
        return "buffer_source"
    if isinstance(op, (Reduce, ReduceTo)):
        return "reduction"
    if op.kind == "elementwise" or (op.kind == "view" and is_view(op)):
        return "inline"
    return "library"


def reduced_axes(graph: Graph, node: Node) -> tuple[int, ...]:
    """The input axes a Reduce or ReduceTo node sums (or maxes, ...) over."""
    x = graph[node.inputs[0]].type
    if isinstance(node.op, ReduceTo):
        return reduce_to_axes(x.shape, node.type.shape)
    return node.op.reduced_axes(x.ndim)


def domain_of(graph: Graph, node: Node) -> tuple[int, ...]:
    """The iteration domain of a root: a reduction's input shape, else its own shape."""
    if node_class(node) == "reduction":
        return graph[node.inputs[0]].type.shape
    return node.type.shape


def domain_index(extents: tuple[int, ...]) -> MultiIndex:
    """The loop indices themselves; an axis of extent 1 is the constant 0."""
    return tuple(Index.lit(0) if e == 1 else Index.axis(k) for k, e in enumerate(extents))


def is_row_local(graph: Graph, node: Node, index: MultiIndex, extents: tuple[int, ...]) -> bool:
    """Whether reading `node` at `index` touches only row `i0` of a domain-shaped root.

    A value produced inside a kernel can be read by a later phase of the
    same kernel only for the same `i0`: its row is finished then, the other
    rows are not (another thread owns them). A reduction over axis 0 is
    never finished before the kernel ends.
    """
    if node_class(node) == "reduction" and 0 in reduced_axes(graph, node):
        return False
    if not extents:
        return False
    if extents[0] == 1:
        return True
    return index[0] == Index.axis(0)


class ConeWalker(Generic[T]):
    """Walks the cone of roots over one domain; subclasses implement the visits.

    `is_buffer(node_id)` says which values are read from memory rather than
    evaluated. Visits are memoised per (node, multi-index), so a value used
    twice at the same place is evaluated once; `reset()` forgets them (a new
    loop nest, where earlier variables are out of scope).
    """

    def __init__(self, graph: Graph, extents: tuple[int, ...], is_buffer: Callable[[int], bool]):
        self.graph = graph
        self.extents = tuple(extents)
        self.is_buffer = is_buffer
        self.memo: dict[tuple[int, MultiIndex], T] = {}

    def reset(self) -> None:
        self.memo = {}

    # -- hooks ---------------------------------------------------------------------------
    def read(self, node: Node, index: MultiIndex) -> T:
        """A value read from a buffer at `index` (a multi-index into node's shape)."""
        raise NotImplementedError

    def scalar(self, node: Node) -> T:
        """A one-value source (Fill, one-element constant)."""
        raise NotImplementedError

    def compute(self, node: Node, args: list[T]) -> T:
        """An elementwise op applied to its evaluated inputs."""
        raise NotImplementedError

    # -- walking ---------------------------------------------------------------------------
    def value(self, node_id: int, index: MultiIndex) -> T:
        """Node `node_id` at `index`: read if it is a buffer, else evaluated."""
        key = (node_id, index)
        if key not in self.memo:
            node = self.graph[node_id]
            self.memo[key] = self.read(node, index) if self.is_buffer(node_id) else self._evaluate(node, index)
        return self.memo[key]

    def define(self, node_id: int) -> T:
        """The value of root `node_id` at the domain index (never read from its own buffer).

        For a reduction this is the value being reduced, at the domain index.
        """
        node = self.graph[node_id]
        index = domain_index(self.extents)
        if node_class(node) == "reduction":
            return self.value(node.inputs[0], index)
        key = (node_id, index)
        if key not in self.memo:
            self.memo[key] = self._evaluate(node, index)
        return self.memo[key]

    def _evaluate(self, node: Node, index: MultiIndex) -> T:
        cls = node_class(node)
        if cls == "scalar_source":
            return self.scalar(node)
        if cls != "inline":
            raise ValueError(f"%{node.id} ({node.op.label}) must be a buffer of this kernel")
        if node.op.kind == "view":
            source = self.graph[node.inputs[0]]
            inner = view_index(node.op, index, source.type.shape, self.extents)
            return self.value(source.id, inner)
        args = [self.value(i, broadcast_index(index, self.graph[i].type.shape)) for i in node.inputs]
        return self.compute(node, args)
