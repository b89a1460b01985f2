"""`cse`: merge nodes that compute the same op on the same inputs.

Ops are frozen, hashable dataclasses, so `(op, inputs)` is the key. Nodes
are visited in topological order, so by the time a node is keyed its inputs
are already canonical and a whole duplicated chain collapses in one sweep.
ADD, MUL and EQ are commutative in IEEE arithmetic, so their inputs are
keyed unordered (MAX and MIN are not: they are defined as `a > b ? a : b`,
which picks b when a is NaN). Placeholders are never merged: two feeds of
the same type are different values (their ops differ by feed name anyway).
The first node of a class survives, so a backward node that recomputes a
forward value is replaced by the forward one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradcompiler.ir import Graph, Node
from gradcompiler.ops.elemwise import Elemwise
from gradcompiler.ops.source import Placeholder

if TYPE_CHECKING:
    from .pipeline import PassContext

COMMUTATIVE_MODES = ("ADD", "MUL", "EQ")


def key(node: Node) -> tuple:
    """What two nodes must share to compute the same value."""
    inputs = node.inputs
    if isinstance(node.op, Elemwise) and node.op.mode in COMMUTATIVE_MODES:
        inputs = tuple(sorted(inputs))
    return (node.op, inputs)


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    canonical: dict[tuple, int] = {}
    merged = 0
    for node_id in graph.topo_order():
        node = graph[node_id]
        if isinstance(node.op, Placeholder):
            continue
        first = canonical.setdefault(key(node), node_id)
        if first != node_id:
            graph.replace_uses(node_id, first)
            graph.remove([node_id])
            merged += 1
    return {"merged": merged}
