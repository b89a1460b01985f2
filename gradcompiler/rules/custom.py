"""The rule of CustomGradient: the user's backward (see gradcompiler/ops/custom.py).

The backward is called with the output's gradient and the residuals, as
Tensors of the graph being differentiated (a copy's, under check_grads), and
returns one gradient per argument: a Tensor of that argument's shape and dtype,
or None where no gradient flows. The residuals and the forward value get
none, so differentiation never walks into the composite through this node.
"""

from __future__ import annotations

from ..errors import GraphError, NotDifferentiableError
from ..frontend.tensor import Tensor
from ..ops.custom import CustomGradient
from .registry import ForwardNode, grad_rule

_RESIDUAL_HINT = ("build the gradients from the gradient and the residuals the backward is given: "
                  "a Tensor it uses from the forward's scope must be returned as a residual, "
                  "since a copy of the graph (check_grads makes one) renumbers every node")


@grad_rule(CustomGradient)
def custom_gradient(node: ForwardNode, grad: Tensor, needs_grad):
    op: CustomGradient = node.op
    inputs = node.inputs
    arguments = inputs[:op.arguments]
    residuals = inputs[op.arguments:op.arguments + op.residuals]
    try:
        result = op.backward(grad, *residuals)
    except GraphError as err:  # typically a captured Tensor of the original graph met a copy's
        raise NotDifferentiableError(
            f"the backward failed: {err.message}; {_RESIDUAL_HINT}", op=op.label,
            site=err.site or node.node.site) from None
    grads = [result] if isinstance(result, Tensor) or result is None else list(result)
    if len(grads) != op.arguments:
        raise NotDifferentiableError(
            f"the backward returned {len(grads)} gradients for {op.arguments} Tensor arguments",
            op=op.label, site=node.node.site)
    for k, (g, x) in enumerate(zip(grads, arguments)):
        if g is None:
            continue
        if not isinstance(g, Tensor) or g.graph is not node.graph:
            raise NotDifferentiableError(
                f"gradient {k} of the backward is a {type(g).__name__} of another graph or no "
                f"Tensor; {_RESIDUAL_HINT}",
                op=op.label, site=node.node.site)
        if g.type != x.type:
            raise NotDifferentiableError(
                f"gradient {k} of the backward is {g.type}, argument {k} is {x.type}",
                op=op.label, site=node.node.site)
    kept = [g if needed else None for g, needed in zip(grads, needs_grad)]
    return kept + [None] * (op.residuals + 1)
