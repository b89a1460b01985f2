"""Rewrites of shape ops: composed reshapes, cancelling axis ops, no-op views,
and reductions of broadcasts.

Reshape, AddAxis and RemoveAxis all keep the row-major element order, so a
chain of them is one Reshape, and a chain that ends at its start shape is
the identity. A reduction of a broadcast adds up copies of one value, which
is that value times the number of copies.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from gradcompiler.ir import Graph, Node
from gradcompiler.ops.elemwise import Elemwise
from gradcompiler.ops.reduce import Reduce, ReduceTo
from gradcompiler.ops.shape import AddAxis, Broadcast, RemoveAxis, Reshape, Transpose

from .registry import add_constant, add_like, rewrite

if TYPE_CHECKING:
    from ..pipeline import PassContext

RESHAPE_LIKE = (Reshape, AddAxis, RemoveAxis)


@rewrite(Reshape, AddAxis, RemoveAxis, Broadcast, ReduceTo)
def same_shape_view(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    """A reshape, broadcast or reduce-to whose output shape is its input's is the identity."""
    x = node.inputs[0]
    return x if graph[x].type.shape == node.type.shape else None


@rewrite(Transpose)
def identity_transpose(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    return node.inputs[0] if node.op.perm == tuple(range(len(node.op.perm))) else None


@rewrite(Reshape)
def reshape_of_reshape(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    """Reshape of a chain of Reshape|AddAxis|RemoveAxis of x → Reshape(x) (or x itself)."""
    x = node.inputs[0]
    while isinstance(graph[x].op, RESHAPE_LIKE):
        x = graph[x].inputs[0]
    if x == node.inputs[0]:
        return None
    if graph[x].type.shape == node.type.shape:
        return x
    return add_like(graph, node, Reshape(node.type.shape), (x,))


@rewrite(AddAxis, RemoveAxis)
def axis_round_trip(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    """AddAxis(RemoveAxis(x)) or RemoveAxis(AddAxis(x)) that restores x's shape → x."""
    inner = graph[node.inputs[0]]
    undoes = RemoveAxis if isinstance(node.op, AddAxis) else AddAxis
    if isinstance(inner.op, undoes) and graph[inner.inputs[0]].type.shape == node.type.shape:
        return inner.inputs[0]
    return None


@rewrite(Broadcast)
def broadcast_of_broadcast(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    inner = graph[node.inputs[0]]
    if not isinstance(inner.op, Broadcast):
        return None
    return add_like(graph, node, Broadcast(node.type.shape), (inner.inputs[0],))


def _times(graph: Graph, node: Node, x: int, count: int) -> int | None:
    """`x · count` in x's dtype, or None if `count` does not survive the cast.

    Integer counts wrap like the sum they replace does (both are modular).
    """
    if count == 1:
        return x
    dtype = graph[x].type.dtype
    scale = np.array(count).astype(dtype)
    if dtype.kind not in "iu" and scale != count:
        return None
    return add_like(graph, node, Elemwise("MUL"), (x, add_constant(graph, node, scale)))


def _reshaped(graph: Graph, node: Node, x: int) -> int:
    if graph[x].type.shape == node.type.shape:
        return x
    return add_like(graph, node, Reshape(node.type.shape), (x,))


@rewrite(ReduceTo)
def reduce_to_of_broadcast(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    """ReduceTo(Broadcast(v, S), shape(v)) → v · (numel(S) / numel(v))."""
    inner = graph[node.inputs[0]]
    if not isinstance(inner.op, Broadcast):
        return None
    v = inner.inputs[0]
    vt = graph[v].type
    if vt.shape != node.type.shape or vt.size == 0 or inner.type.size == 0:
        return None
    return _times(graph, node, v, inner.type.size // vt.size)


@rewrite(Reduce)
def reduce_of_broadcast(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    """A SUM over exactly the broadcast axes of Broadcast(v) → v · count (MEAN, MAX, MIN → v).

    Applies when every reduced axis has size 1 in v and every kept axis is
    one v already had, so the result is v reshaped (and scaled for SUM).
    """
    inner = graph[node.inputs[0]]
    if not isinstance(inner.op, Broadcast) or node.op.mode not in ("SUM", "MEAN", "MAX", "MIN"):
        return None
    v = inner.inputs[0]
    target, vt = inner.type.shape, graph[v].type
    padded = (1,) * (len(target) - vt.ndim) + vt.shape
    axes = node.op.reduced_axes(len(target))
    count = math.prod([target[a] for a in axes])
    if count == 0 or any(padded[a] != 1 for a in axes) or vt.dtype != node.type.dtype:
        return None  # (a sum of integers is int64: v · count would keep v's narrower dtype)
    if any(padded[a] != target[a] for a in range(len(target)) if a not in axes):
        return None
    if node.op.mode == "SUM":
        return _times(graph, node, _reshaped(graph, node, v), count)
    return _reshaped(graph, node, v)
