"""Transposes folded into the flags of MatrixMul and BatchedMatrixMul.

A matrix library multiplies a transposed operand for free, so a Transpose
that only swaps an operand's last two axes becomes the operand's flag and
the kernel reads the untransposed buffer. MatrixMul flattens operands of
rank > 2, so there the operand must be 2-D; BatchedMatrixMul keeps its
batch axes, which the transpose must leave in place.

A transpose of a product folds the other way, (AB)ᵀ = BᵀAᵀ: the product is
computed transposed by swapping the operands and flipping both flags. The
product must have no other reader, or it would be computed twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradcompiler.errors import BuildError
from gradcompiler.ir import Graph, Node
from gradcompiler.ops.linalg import BatchedMatrixMul, MatrixMul
from gradcompiler.ops.shape import Transpose

from .registry import add_like, rewrite, single_use

if TYPE_CHECKING:
    from ..pipeline import PassContext


def _swaps_last_two(perm: tuple[int, ...]) -> bool:
    n = len(perm)
    return n >= 2 and perm == (*range(n - 2), n - 1, n - 2)


@rewrite(MatrixMul, BatchedMatrixMul)
def transpose_into_matmul(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    operands = list(node.inputs)
    flags = [node.op.transpose_a, node.op.transpose_b]
    for slot, operand in enumerate(operands):
        inner = graph[operand]
        if not isinstance(inner.op, Transpose) or not _swaps_last_two(inner.op.perm):
            continue
        if isinstance(node.op, MatrixMul) and inner.type.ndim != 2:
            continue
        operands[slot] = inner.inputs[0]
        flags[slot] = not flags[slot]
    if operands == list(node.inputs):
        return None
    op = type(node.op)(*flags)
    try:
        folded = op.infer(*(graph[i].type for i in operands))
    except BuildError:  # MatrixMul cannot transpose a flattened operand
        return None
    return add_like(graph, node, op, tuple(operands)) if folded == node.type else None


@rewrite(Transpose)
def transpose_of_matmul(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    product = graph[node.inputs[0]]
    if not isinstance(product.op, (MatrixMul, BatchedMatrixMul)) or not _swaps_last_two(node.op.perm):
        return None
    a, b = product.inputs
    if not single_use(graph, product.id) or (isinstance(product.op, MatrixMul) and graph[a].type.ndim != 2):
        return None
    op = type(product.op)(not product.op.transpose_b, not product.op.transpose_a)
    try:
        swapped = op.infer(graph[b].type, graph[a].type)
    except BuildError:
        return None
    return add_like(graph, node, op, (b, a)) if swapped == node.type else None
