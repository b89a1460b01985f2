"""The differentiation pass: reverse-mode autodiff through the rule table.

    differentiate(graph, outputs, wrt, cotangents, disconnected) -> grads

1. *Requires-grad analysis*: the float nodes that depend on `wrt` through
   differentiable ops, forward. A non-differentiable op (StopGradient) or an
   integer value cuts the dependency, so no rule builds a gradient that
   could only be dropped there.
2. *Reachability*: the ancestors of `outputs`, backward. Only nodes in both
   sets ("active") are differentiated, and a rule is told, per input,
   whether that input is active (`needs_grad`); a rule builds nothing for an
   input that is not. So a gradient that is not asked for is never built:
   no node, no capture.
3. A reverse topological sweep over the active nodes. Each node's incoming
   contributions (one per consumer) are summed, its rule is applied inside
   `graph.building("backward", origin=node)`, and each returned gradient is
   recorded as a contribution to that input.

Backward nodes are ordinary nodes of the same graph (role `backward`,
`origin` = the forward node whose rule built them), so a gradient of a
gradient is the same pass run again.
"""

from __future__ import annotations

from collections.abc import Sequence

from gradcompiler.errors import NotDifferentiableError, ShapeError
from gradcompiler.frontend.sources import full, zeros
from gradcompiler.frontend.tensor import Tensor
from gradcompiler.ir import Graph
from gradcompiler.rules import ForwardNode, apply_rule, is_non_differentiable


def _is_float(graph: Graph, node_id: int) -> bool:
    return graph[node_id].type.dtype.kind == "f"


def _requiring_grad(graph: Graph, wrt: Sequence[int]) -> set[int]:
    """`wrt` and the float nodes that read, through a differentiable op, a node in this set."""
    result = set(wrt)
    for node_id in graph.topo_order(graph.descendants(wrt)):
        node = graph[node_id]
        if (node_id not in result and _is_float(graph, node_id)
                and not is_non_differentiable(type(node.op))
                and any(i in result for i in node.inputs)):
            result.add(node_id)
    return result


def _sum(contributions: list[Tensor]) -> Tensor:
    total = contributions[0]
    for c in contributions[1:]:
        total = total + c
    return total


def differentiate(
    graph: Graph,
    outputs: Sequence[int],
    wrt: Sequence[int],
    cotangents: Sequence[int | None],
    disconnected: str = "error",
) -> list[int]:
    """Node ids of d(Σ outputs·cotangents)/d(wrt), built into `graph`."""
    if disconnected not in ("error", "zero"):
        raise ValueError("disconnected must be 'error' or 'zero'")
    for w in wrt:
        if not _is_float(graph, w):
            node = graph[w]
            raise NotDifferentiableError(
                f"cannot differentiate with respect to %{w} ({node.name or node.op.label}) of dtype "
                f"{node.type.dtype.name}: only float tensors have gradients", site=node.site)
    requires_grad = _requiring_grad(graph, wrt)
    active = requires_grad & graph.ancestors(outputs)
    contributions: dict[int, list[Tensor]] = {}
    for out, cot in zip(outputs, cotangents):
        if out in active and cot is not None:
            contributions.setdefault(out, []).append(Tensor(graph, cot))

    with graph:
        for node_id in reversed(graph.topo_order(active)):
            if node_id not in contributions:
                continue
            node = graph[node_id]
            if not node.inputs:
                continue
            with graph.building("backward", origin=node_id, site=node.site):
                g = _sum(contributions[node_id])
                needs_grad = tuple(i in active for i in node.inputs)
                if not any(needs_grad):
                    continue
                grads = apply_rule(ForwardNode(graph, node), g, needs_grad)
            _record(graph, node, grads, needs_grad, contributions)
        results = []
        for w in wrt:
            if w in contributions:
                with graph.building("backward", origin=w):
                    results.append(_sum(contributions[w]).id)
            elif disconnected == "zero":
                t = graph[w].type
                with graph.building("backward", origin=w):
                    results.append(zeros(t.shape, t.dtype).id)
            else:
                node = graph[w]
                raise NotDifferentiableError(
                    f"%{w} ({node.name or node.op.label}) does not reach the differentiated outputs; "
                    f"pass disconnected='zero' to get zeros", site=node.site)
        return results


def _record(graph, node, grads, needs_grad, contributions) -> None:
    if len(grads) != len(node.inputs):
        raise NotDifferentiableError(
            f"rule returned {len(grads)} gradients for {len(node.inputs)} inputs", op=node.op.label)
    for i, needed, grad in zip(node.inputs, needs_grad, grads):
        if grad is None or not needed:
            continue
        if grad.type.shape != graph[i].type.shape:
            raise ShapeError(
                f"rule built a gradient of shape {grad.shape} for an input of shape {graph[i].type.shape}",
                op=node.op.label, site=node.site)
        contributions.setdefault(i, []).append(grad)


def seed_cotangent(graph: Graph, output: int) -> int:
    """The cotangent 1 of a scalar loss."""
    t = graph[output].type
    with graph, graph.building("backward", origin=output):
        return full(t.shape, 1.0, t.dtype).id
