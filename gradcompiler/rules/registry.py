"""The gradient rule table: `@grad_rule(OpClass)` and `@non_differentiable`.

A rule is a short function

    rule(node: ForwardNode, grad: Tensor, needs_grad: tuple[bool, ...])
        -> list[Tensor | None] | None

modelled on the seed's `CustomGradMaker`. It returns one entry per input:
the gradient, or None when no gradient flows (never materialised zeros).
Returning None as a whole means the rule *declines*, as the seed's Elemwise
rule does for modes other than ADD; the op's generic rule
(`@grad_rule(Op, generic=True)`) then applies.

Captures are explicit: `node.inputs[i]` and `node.output` are Tensor handles
to forward values, and a rule captures exactly the ones it passes to the
ops it builds. Static facts (`node.op`, `node.input_types`, `node.type`)
cost nothing at run time and are free to read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..errors import NotDifferentiableError
from ..frontend.tensor import Tensor
from ..ir import Graph, Node, Op, TensorType


@dataclass(frozen=True)
class ForwardNode:
    """What a rule sees of the forward node it differentiates."""

    graph: Graph
    node: Node

    @property
    def op(self) -> Op:
        return self.node.op

    @property
    def inputs(self) -> list[Tensor]:
        """Handles to the forward inputs; using one in a backward op captures it."""
        return [Tensor(self.graph, i) for i in self.node.inputs]

    @property
    def output(self) -> Tensor:
        """Handle to the forward output; using it captures it (exp, tanh, relu do)."""
        return Tensor(self.graph, self.node.id)

    @property
    def input_types(self) -> list[TensorType]:
        return [self.graph[i].type for i in self.node.inputs]

    @property
    def type(self) -> TensorType:
        return self.node.type


GradRule = Callable[[ForwardNode, Tensor, tuple], list | None]

_RULES: dict[type[Op], GradRule] = {}
_GENERIC: dict[type[Op], GradRule] = {}
_NON_DIFFERENTIABLE: set[type[Op]] = set()


def grad_rule(op_class: type[Op], generic: bool = False):
    """Register `fn` as the rule (or, with generic=True, the fallback rule) of `op_class`."""

    def register(fn: GradRule) -> GradRule:
        table = _GENERIC if generic else _RULES
        if op_class in table:
            raise ValueError(f"{op_class.__name__} already has a {'generic ' if generic else ''}rule")
        table[op_class] = fn
        return fn

    return register


def non_differentiable(*op_classes: type[Op]) -> None:
    """Mark ops whose inputs never receive a gradient (sources, integer results)."""
    _NON_DIFFERENTIABLE.update(op_classes)


def is_non_differentiable(op_class: type[Op]) -> bool:
    return op_class in _NON_DIFFERENTIABLE


def has_rule(op_class: type[Op]) -> bool:
    return op_class in _RULES or op_class in _GENERIC


def rule_of(op_class: type[Op], generic: bool = False) -> GradRule | None:
    return (_GENERIC if generic else _RULES).get(op_class)


def apply_rule(fwd: ForwardNode, grad: Tensor, needs_grad: tuple[bool, ...]) -> list[Tensor | None]:
    """Run the op's rule, falling back to its generic rule when the first declines."""
    op_class = type(fwd.op)
    if op_class in _NON_DIFFERENTIABLE:
        return [None] * len(needs_grad)
    for table in (_RULES, _GENERIC):
        rule = table.get(op_class)
        if rule is not None:
            result = rule(fwd, grad, needs_grad)
            if result is not None:
                return list(result)
    raise NotDifferentiableError(
        f"no gradient rule for {fwd.op.describe()}", op=fwd.op.label, site=fwd.node.site
    )
