"""`constant_fold`: evaluate, at compile time, nodes whose inputs are all known.

A node whose inputs are all Constant or Fill nodes is evaluated with its
op's `reference` and replaced:
* by a `Fill` when every input is uniform (a Fill, or a Constant whose
  elements are all equal) and the op is elementwise or a view (which only
  moves elements), since the result is then one repeated value whatever
  its size: a broadcast of a scalar stays a scalar and never becomes a big
  constant array;
* otherwise by a `Constant`, only when the result has at most `fold_limit`
  elements (DEFAULT_LIMIT) and every input at most INPUT_FACTOR times that,
  so folding neither bloats the program nor costs much compile time.
A node whose evaluation raises (a constant index out of range) is left
alone, so the error surfaces at run time as it would without the pass.
Nodes are visited in topological order, so a chain of foldable nodes folds
in one sweep.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from gradcompiler.ir import ConstValue, Graph, Node, Op
from gradcompiler.ops.source import Constant, Fill

if TYPE_CHECKING:
    from .pipeline import PassContext

DEFAULT_LIMIT = 4096
INPUT_FACTOR = 16


def uniform_value(op: Op) -> float | int | None:
    """The one value every element of a Fill or Constant holds, else None."""
    if isinstance(op, Fill):
        return op.value
    if isinstance(op, Constant):
        array = op.value.array
        if array.size and array.dtype != np.bool_ and np.all(array == array.flat[0]):
            return array.flat[0].item()
    return None


def fill_value(graph: Graph, node: Node) -> float | None:
    """The repeated value of `node` on uniform inputs, if a Fill can hold it."""
    dtype = node.type.dtype
    values = [uniform_value(graph[i].op) for i in node.inputs]
    if not values or None in values or node.op.kind not in ("elementwise", "view"):
        return None
    if node.op.kind == "view":
        value = np.array(values[0]).astype(dtype)
    else:
        scalars = [np.array(v).astype(graph[i].type.dtype) for v, i in zip(values, node.inputs)]
        try:
            value = np.asarray(node.op.reference(*scalars))
        except Exception:  # noqa: BLE001 - an op that cannot run on scalars is not folded
            return None
        if value.shape != () or value.dtype != dtype:
            return None
    as_float = float(value)
    if np.array(as_float).astype(dtype).tobytes() != value.tobytes():
        return None  # a Fill holds a Python float; this value would not survive it
    return as_float


def _folded(graph: Graph, node: Node, limit: int) -> tuple[str, Op] | None:
    """The source op that replaces `node`, and the kind of fold, or None."""
    ops = [graph[i].op for i in node.inputs]
    if node.op.kind == "source" or not all(isinstance(op, (Constant, Fill)) for op in ops):
        return None
    value = fill_value(graph, node)
    if value is not None:
        return "to_fill", Fill(node.type.shape, node.type.dtype, value)
    try:
        if node.type.size > limit or any(graph[i].type.size > INPUT_FACTOR * limit for i in node.inputs):
            return None
        result = np.asarray(node.op.reference(*(op.reference() for op in ops)))
    except Exception:  # noqa: BLE001 - any failure means "leave it to run time"
        return None
    if result.shape != node.type.shape or result.dtype != node.type.dtype:
        return None
    return "to_constant", Constant(ConstValue(result))


def run(graph: Graph, ctx: PassContext) -> dict[str, int]:
    counts = {"to_fill": 0, "to_constant": 0}
    for node_id in graph.topo_order():
        node = graph[node_id]
        folded = _folded(graph, node, ctx.fold_limit)
        if folded is None:
            continue
        kind, op = folded
        with graph.building("const", origin=node.origin, site=node.site):
            new = graph.add(op, name=node.name).id
        graph.replace_uses(node_id, new)
        graph.remove([node_id])
        graph.remove([i for i in set(node.inputs)
                      if not graph.consumers(i) and not graph.is_output(i)])
        counts[kind] += 1
    return counts
