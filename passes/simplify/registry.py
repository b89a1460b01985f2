"""The table of local rewrites and the small helpers rewrites build with.

A rewrite is `rule(graph, node, ctx) -> int | None`: the id of a node that
computes the same value as `node` (an existing node, or one it just added),
or None when it does not apply. It never mutates existing nodes and adds
nothing when it returns None; the driver redirects the uses and deletes
what became dead. It is registered for the op classes of the nodes it
matches (`Op` itself: every node), and its function name is the name
counted in the pass stats.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from gradcompiler.ir import ConstValue, Graph, Node, Op
from gradcompiler.ops.source import Constant, Fill

from ..constant_fold import uniform_value

if TYPE_CHECKING:
    from ..pipeline import PassContext

Rewrite = Callable[[Graph, Node, "PassContext"], "int | None"]

REWRITES: dict[type[Op], list[Rewrite]] = {}


def rewrite(*op_classes: type[Op]) -> Callable[[Rewrite], Rewrite]:
    """Register the decorated rewrite for nodes whose op is one of `op_classes` (`Op`: any)."""

    def register(rule: Rewrite) -> Rewrite:
        for cls in op_classes:
            REWRITES.setdefault(cls, []).append(rule)
        return rule

    return register


def add_like(graph: Graph, node: Node, op: Op, inputs: tuple[int, ...]) -> int:
    """Add `op(inputs)` with the role, origin and call site of the node it replaces."""
    with graph.building(node.role, origin=node.origin, site=node.site):
        return graph.add(op, inputs).id


def add_constant(graph: Graph, node: Node, value: np.ndarray) -> int:
    """A `const` node holding `value`, attributed to the node it helps replace."""
    with graph.building("const", origin=node.origin, site=node.site):
        return graph.add(Constant(ConstValue(np.asarray(value)))).id


def add_fill(graph: Graph, node: Node, value: float) -> int:
    """A `const` Fill of `node`'s type with `value`."""
    with graph.building("const", origin=node.origin, site=node.site):
        return graph.add(Fill(node.type.shape, node.type.dtype, value)).id


def is_uniform(graph: Graph, node_id: int, value: float) -> bool:
    found = uniform_value(graph[node_id].op)
    return found is not None and found == value


def single_use(graph: Graph, node_id: int) -> bool:
    """Read by exactly one node (once) and not a graph output."""
    if graph.is_output(node_id):
        return False
    consumers = graph.consumers(node_id)
    return len(consumers) == 1 and graph[consumers[0]].inputs.count(node_id) == 1


def rewrites_for(op: Op) -> list[Rewrite]:
    """The rewrites to try on a node with `op`: those of its class, then those for every op."""
    return REWRITES.get(type(op), []) + REWRITES.get(Op, [])
