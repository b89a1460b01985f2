"""`prune`: drop every node that the graph's outputs do not need.

Autodiff builds backward nodes for every active path and the user may have
built values they never ask for; none of that should be compiled. A dropped
placeholder is no longer a feed of the optimised graph.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradcompiler.ir import Graph

if TYPE_CHECKING:
    from .pipeline import PassContext


def unneeded(graph: Graph) -> set[int]:
    """Nodes that no output of `graph` depends on."""
    return set(graph.nodes) - graph.ancestors(graph.outputs)


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    dropped = unneeded(graph)
    graph.remove(dropped)
    return {"dropped": len(dropped)}
