"""Helpers for tests that inspect graphs built by the differentiation pass."""

from __future__ import annotations

from gradcompiler.ir import Graph


def captured_values(graph: Graph, backward_ids=None) -> set[int]:
    """Forward values (non-backward nodes, sources excluded) that backward nodes read.

    `backward_ids` restricts the readers (default: every backward node).
    """
    readers = backward_ids if backward_ids is not None else [
        n.id for n in graph.nodes.values() if n.role == "backward"]
    captured = set()
    for r in readers:
        for i in graph[r].inputs:
            node = graph[i]
            if node.role == "forward":
                captured.add(i)
    return captured


def backward_nodes_of(graph: Graph, forward_id: int) -> list[int]:
    """Backward nodes built by the rule of `forward_id`."""
    return [n.id for n in graph.nodes.values() if n.role == "backward" and n.origin == forward_id]
