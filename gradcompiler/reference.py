"""The numpy reference interpreter: the oracle of every backend test.

It walks the needed nodes in topological order and calls each op's
`reference`. It is meant to be read in a minute, not to be fast. Debug mode
also asks it where a NaN or Inf is born (`first_non_finite`): a compiled
kernel fuses many ops, so its bad output alone cannot say which op it was.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from .errors import GradCompilerError
from .feeds import validate_feeds
from .ir import Graph, Node
from .ops.source import Placeholder


def run_graph(graph: Graph, outputs: Sequence[int], feeds: Mapping[str, Any]) -> list[np.ndarray]:
    """Values of node ids `outputs` given `feeds` (by placeholder name)."""
    needed = graph.ancestors(outputs)
    placeholders = [graph[i] for i in sorted(needed) if isinstance(graph[i].op, Placeholder)]
    arrays = validate_feeds(placeholders, feeds, ignorable=graph.feed_names)
    values: dict[int, np.ndarray] = {}
    for node_id in graph.topo_order(needed):
        node = graph[node_id]
        if isinstance(node.op, Placeholder):
            values[node_id] = arrays[node.op.feed_name]
        else:
            values[node_id] = np.asarray(node.op.reference(*(values[i] for i in node.inputs)))
    return [values[o] for o in outputs]


def first_non_finite(graph: Graph, candidates: Sequence[int], feeds: Mapping[str, Any]) -> Node | None:
    """The first of `candidates` (node ids, in the order they run) whose value is NaN or Inf
    while every input's value is finite; None if there is none or the graph cannot be run."""
    order = list(dict.fromkeys(candidates))
    try:
        values = dict(zip(order, run_graph(graph, order, feeds)))
        inputs = {i for c in order for i in graph[c].inputs}
        values.update(zip(inputs, run_graph(graph, sorted(inputs), feeds)))
    except GradCompilerError:
        return None

    def finite(node_id: int) -> bool:
        value = values[node_id]
        return value.dtype.kind != "f" or bool(np.isfinite(value).all())

    for c in order:
        if not finite(c) and all(finite(i) for i in graph[c].inputs):
            return graph[c]
    return None


def evaluate(outputs, feeds: Mapping[str, Any] | None = None, **kwargs: Any):
    """Evaluate Tensor `outputs` (one, or a list) with the reference interpreter."""
    from .frontend.tensor import Tensor

    feeds = {**(feeds or {}), **kwargs}
    single = isinstance(outputs, Tensor)
    tensors = [outputs] if single else list(outputs)
    graph = tensors[0].graph
    values = run_graph(graph, [t.id for t in tensors], feeds)
    return values[0] if single else values
