"""Graph sources: `input`, `param`, `zeros`, `full`, `constant`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import GraphError
from ..ir import call_site, current_graph
from ..ops.common import checked_dtype
from ..ops.source import Fill, Placeholder
from .tensor import Tensor, constant, reports_user_line  # noqa: F401 - re-exported

__all__ = ["input", "param", "zeros", "full", "constant"]


def _placeholder(role: str, name: str, shape, dtype) -> Tensor:
    graph = current_graph()
    if not isinstance(name, str) or not name:
        raise GraphError(f"{role} name must be a non-empty string, got {name!r}", site=call_site())
    if name in graph.feed_names:
        raise GraphError(f"the name '{name}' is already used by another feed of graph '{graph.name}'", site=call_site())
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    node = graph.add(Placeholder(name, shape, checked_dtype("Placeholder", dtype)), role=role, name=name)
    graph.feed_names[name] = node.id
    return Tensor(graph, node.id)


@reports_user_line
def input(name: str, shape, dtype: Any = "float32") -> Tensor:  # noqa: A001 - the natural name
    """A value fed at every call (data, labels)."""
    return _placeholder("input", name, shape, dtype)


@reports_user_line
def param(name: str, shape, dtype: Any = "float32") -> Tensor:
    """A trainable value fed at every call (weights); gradients are usually taken wrt these."""
    return _placeholder("param", name, shape, dtype)


@reports_user_line
def full(shape, value: float, dtype: Any = "float32") -> Tensor:
    graph = current_graph()
    shape = (shape,) if isinstance(shape, (int, np.integer)) else tuple(shape)
    fill = Fill(shape, checked_dtype("Fill", dtype), float(value))
    return Tensor(graph, graph.add(fill, role="const").id)


def zeros(shape, dtype: Any = "float32") -> Tensor:
    return full(shape, 0.0, dtype)
