"""Arithmetic identities: x·1, x+0, x−0, −(−x), x·0 (where exact), elementwise
ops of uniform constants, and the identity ops StopGradient and FastpathCopy.

Each rewrite is exact in IEEE arithmetic except two, stated here:
* `x + 0 → x` turns a −0.0 sum (+0.0) back into x's −0.0; the two compare
  equal and only sign-sensitive functions (1/x, copysign) could tell them apart.
* `x · 0 → 0` is wrong for a float x that is inf or NaN, so for floats it
  runs only when the caller sets `PassContext.assume_finite`; for integers it
  is exact and always on.
StopGradient only matters to the differentiation pass, which has run;
FastpathCopy's fresh buffer is the memory plan's business, not the graph's.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradcompiler.ir import Graph, Node, Op
from gradcompiler.ops.elemwise import Elemwise, StopGradient
from gradcompiler.ops.shape import Broadcast, FastpathCopy

from ..constant_fold import fill_value
from .registry import add_fill, add_like, is_uniform, rewrite

if TYPE_CHECKING:
    from ..pipeline import PassContext


def _as_output(graph: Graph, node: Node, x: int) -> int:
    """x, broadcast to `node`'s shape when the dropped operand was what widened it."""
    if graph[x].type.shape == node.type.shape:
        return x
    return add_like(graph, node, Broadcast(node.type.shape), (x,))


def _other_operand_if(graph: Graph, node: Node, mode: str, value: float, slots=(0, 1)) -> int | None:
    """For `a <mode> b` with one operand in `slots` uniformly `value`: the other operand."""
    if node.op.mode != mode:
        return None
    for slot in slots:
        if is_uniform(graph, node.inputs[slot], value):
            return node.inputs[1 - slot]
    return None


@rewrite(Elemwise)
def mul_by_one(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    x = _other_operand_if(graph, node, "MUL", 1)
    return None if x is None else _as_output(graph, node, x)


@rewrite(Elemwise)
def add_zero(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    """x + 0, 0 + x and x − 0 → x."""
    x = _other_operand_if(graph, node, "ADD", 0)
    if x is None:
        x = _other_operand_if(graph, node, "SUB", 0, slots=(1,))
    return None if x is None else _as_output(graph, node, x)


@rewrite(Elemwise)
def mul_by_zero(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    """x · 0 → 0 for integers always, for floats only under `assume_finite`."""
    if node.type.dtype.kind == "f" and not ctx.assume_finite:
        return None
    if _other_operand_if(graph, node, "MUL", 0) is None:
        return None
    return add_fill(graph, node, 0.0)


@rewrite(Elemwise)
def double_negation(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    if node.op.mode != "NEGATE":
        return None
    inner = graph[node.inputs[0]]
    if isinstance(inner.op, Elemwise) and inner.op.mode == "NEGATE":
        return inner.inputs[0]
    return None


@rewrite(Op)
def uniform_to_fill(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    """An elementwise op or view of uniform constants is a Fill (see `constant_fold`).

    Rewrites often leave such nodes behind after folding has run; a Fill
    costs nothing, so simplify folds them as it goes.
    """
    value = fill_value(graph, node)
    return None if value is None else add_fill(graph, node, value)


@rewrite(StopGradient, FastpathCopy)
def identity_op(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    return node.inputs[0]
