"""A full sum of a matrix product against a tensor, read off a product the graph holds.

    sum(op(A)·op(B) ∘ R)  →  sum(A ∘ G),   G an existing node equal to R·op(B)ᵀ (or its
                                            transpose, matching A's layout)
                          →  sum(B ∘ G'),  G' an existing node equal to op(A)ᵀ·R (or its
                                            transpose, matching B's layout)

Why: `sum(f(x) ∘ r)` is how a vector-Jacobian product is asked for (a loss
whose cotangent is r), and when f ends in a product its gradients are exactly
R·op(B)ᵀ and op(A)ᵀ·R. Attention's loss, sum((P·V) ∘ r), computed P·V (a
batched product as costly as each of its gradients) only to be summed against
r, while the gradient of V, Pᵀ·r, was already there: by the trace identity
⟨XY, R⟩ = ⟨Y, XᵀR⟩ the loss is sum(V ∘ dV), an elementwise sum over V's
elements. Where both sides are found the smaller operand is read.

The rewrite applies only where it removes the product: the product and the
elementwise product are read once each. Operands must not broadcast (the
found node has the operand's very shape, and the weight the product's), and
a MatrixMul must be 2-D throughout (it flattens larger operands).

The gradient's product often reaches the form looked for only after the sum
was visited (its cotangent went through a multiply by ones, removed by a
rewrite of its own), so it is the pipeline's second simplify, after cse, that
finds it.

Values: the same sum of the same products, added in another order, so equal
up to rounding for finite values. The result is non-finite exactly when the
original's is (an inf or NaN anywhere in A, B or R reaches every term it
multiplies), though it may be NaN where the original was ±inf or the reverse.

Work: the search looks only through the readers of whichever operand of the
wanted product has fewer (the cotangent of a product is read by its gradients
and little else), and not at all past `MAX_READERS`, so a graph of many such
sums sharing one hub stays linear.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradcompiler.ir import Graph, Node
from gradcompiler.ops.elemwise import Elemwise
from gradcompiler.ops.linalg import BatchedMatrixMul, MatrixMul
from gradcompiler.ops.reduce import Reduce

from .registry import add_like, rewrite, single_use

if TYPE_CHECKING:
    from ..pipeline import PassContext

MAX_READERS = 16
"""Readers of a wanted product's operand beyond which the search does not look."""

Wanted = tuple[int, int, bool, bool]
"""A product as (first operand, second operand, transpose_a, transpose_b)."""


def _existing(graph: Graph, product: Node, wanted: Wanted, shape: tuple[int, ...]) -> int | None:
    """A node other than `product`, of its class, computing `wanted` with shape `shape`."""
    first, second, *flags = wanted
    hub = min((first, second), key=graph.nx.out_degree)
    if graph.nx.out_degree(hub) > MAX_READERS:
        return None
    for reader in graph.consumers(hub):
        found = graph[reader]
        if (reader != product.id and type(found.op) is type(product.op) and found.inputs == (first, second)
                and [found.op.transpose_a, found.op.transpose_b] == flags and found.type.shape == shape):
            return reader
    return None


def _read_off(graph: Graph, product: Node, weight: int) -> tuple[int, int] | None:
    """(operand, G) with sum(product ∘ weight) = sum(operand ∘ G) for an existing node G; of
    the two operands, the smaller one that has such a G."""
    a, b = product.inputs
    ta, tb = product.op.transpose_a, product.op.transpose_b
    # ⟨op(A)·op(B), R⟩ = ⟨op(A), R·op(B)ᵀ⟩ = ⟨op(B), op(A)ᵀ·R⟩; a transposed operand is
    # summed against the transpose of its factor: (R·op(B)ᵀ)ᵀ = op(B)·Rᵀ, (op(A)ᵀ·R)ᵀ = Rᵀ·op(A)
    sides = [(a, (b, weight, tb, True) if ta else (weight, b, False, not tb)),
             (b, (weight, a, True, ta) if tb else (a, weight, not ta, False))]
    found = [(operand, g) for operand, wanted in sides
             if (g := _existing(graph, product, wanted, graph[operand].type.shape)) is not None]
    return min(found, key=lambda pair: graph[pair[0]].type.size, default=None)


@rewrite(Reduce)
def sum_of_product_from_its_gradient(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    """sum(product ∘ weight) → sum(operand ∘ G) for a full SUM of a once-read product (module
    docstring); the product then has no reader left and the driver deletes it."""
    inner = graph[node.inputs[0]]
    if (node.op.mode != "SUM" or len(node.op.reduced_axes(inner.type.ndim)) != inner.type.ndim
            or not isinstance(inner.op, Elemwise) or inner.op.mode != "MUL" or not single_use(graph, inner.id)):
        return None
    for slot in (0, 1):
        product, weight = graph[inner.inputs[slot]], inner.inputs[1 - slot]
        if (not isinstance(product.op, (MatrixMul, BatchedMatrixMul)) or not single_use(graph, product.id)
                or graph[weight].type.shape != product.type.shape):
            continue
        if isinstance(product.op, MatrixMul) and any(graph[i].type.ndim != 2 for i in product.inputs):
            continue
        found = _read_off(graph, product, weight)
        if found is not None:
            terms = add_like(graph, inner, Elemwise("MUL"), found)
            return add_like(graph, node, node.op, (terms,))
    return None
