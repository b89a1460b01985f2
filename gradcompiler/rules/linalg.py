"""MatrixMul and BatchedMatrixMul rules (seed: matrix_mul_grad_rule,
batched_matrix_mul_grad_rule; op-reference §5).

dA reads only B and dB reads only A (never the output): each operand is
captured only when the other one needs a gradient. The flags follow the
seed's table: dA uses (tB, T) on (B, g) if tA else (F, ¬tB) on (g, B); dB
uses (T, tA) on (g, A) if tB else (¬tA, F) on (A, g).
"""

from __future__ import annotations

from ..frontend.math import reduce_to
from ..frontend.shapes import reshape
from ..frontend.tensor import apply
from ..ops.linalg import BatchedMatrixMul, MatrixMul
from .registry import grad_rule


def _flag_table(op_class, t_a: bool, t_b: bool, a, b, g, needs_grad):
    """The seed's four-case table, for either matmul op class."""
    grad_a = grad_b = None
    if needs_grad[0]:
        grad_a = apply(op_class(t_b, True), b, g) if t_a else apply(op_class(False, not t_b), g, b)
    if needs_grad[1]:
        grad_b = apply(op_class(True, t_a), g, a) if t_b else apply(op_class(not t_a, False), a, g)
    return grad_a, grad_b


@grad_rule(MatrixMul)
def matrix_mul(node, g, needs_grad):
    op = node.op
    a_type, b_type = node.input_types
    a, b = node.inputs
    if op.regime(a_type, b_type) == 3:
        # both operands were flattened: differentiate the flat product, then unflatten
        a2_shape, b2_shape = op.matrix_shapes(a_type, b_type)
        grads = _flag_table(MatrixMul, op.transpose_a, op.transpose_b,
                            reshape(a, a2_shape) if needs_grad[1] else None,
                            reshape(b, b2_shape) if needs_grad[0] else None, g, needs_grad)
        return [reshape(d, t.shape) if d is not None else None for d, t in zip(grads, (a_type, b_type))]
    return list(_flag_table(MatrixMul, op.transpose_a, op.transpose_b, a, b, g, needs_grad))


@grad_rule(BatchedMatrixMul)
def batched_matrix_mul(node, g, needs_grad):
    op = node.op
    a, b = node.inputs
    grads = _flag_table(BatchedMatrixMul, op.transpose_a, op.transpose_b, a, b, g, needs_grad)
    return [reduce_to(d, t.shape) if d is not None else None for d, t in zip(grads, node.input_types)]
