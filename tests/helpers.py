"""Helpers for tests that inspect graphs built by the differentiation pass."""

from __future__ import annotations

import gradcompiler as gc
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


def assert_grads(out, wrt, feeds, order: int = 1) -> None:
    """`gc.check_grads` (float64 finite differences), plus the same gradient built into
    the user's own graph, where it must type-check and keep each input's type and dtype
    (check_grads differentiates a float64 copy, so it cannot see float32 dtype slips)."""
    gc.check_grads(out, wrt, feeds, order=order)
    grads = gc.grad(out.sum(), wrt)
    for g, w, value in zip(grads, wrt, gc.evaluate(grads, feeds)):
        assert g.type == w.type and value.shape == w.shape and value.dtype == w.dtype
