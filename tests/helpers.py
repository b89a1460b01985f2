"""Helpers for tests that inspect graphs built by the differentiation pass, and the
small mlp training step several test files compile, draw or plan."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import gradcompiler as gc
from gradcompiler.frontend.tensor import Tensor
from gradcompiler.ir import Graph
from gradcompiler.ops.elemwise import Elemwise
from gradcompiler.rules import registry


def captured_values(graph: Graph, backward_ids=None) -> set[int]:
    """Forward values (non-backward nodes, sources excluded) that backward nodes read.

    `backward_ids` restricts the readers (default: every backward node).
    """
    readers = backward_ids if backward_ids is not None else [
        n.id for n in graph.nodes.values() if n.role == "backward"]
    captured = set()
    for r in readers:
        for i in graph[r].inputs:
            node = graph[i]
            if node.role == "forward":
                captured.add(i)
    return captured


def backward_nodes_of(graph: Graph, forward_id: int) -> list[int]:
    """Backward nodes built by the rule of `forward_id`."""
    return [n.id for n in graph.nodes.values() if n.role == "backward" and n.origin == forward_id]


def assert_grads(out, wrt, feeds, order: int = 1) -> None:
    """`gc.check_grads` (float64 finite differences), plus the same gradient built into
    the user's own graph, where it must type-check and keep each input's type and dtype
    (check_grads differentiates a float64 copy, so it cannot see float32 dtype slips)."""
    gc.check_grads(out, wrt, feeds, order=order)
    grads = gc.grad(out.sum(), wrt)
    for g, w, value in zip(grads, wrt, gc.evaluate(grads, feeds)):
        assert g.type == w.type and value.shape == w.shape and value.dtype == w.dtype


def break_elemwise_rule(monkeypatch, mode: str, factor: float) -> None:
    """Register, for this test only, an Elemwise rule whose gradients for `mode` are `factor`
    times the right ones: the mutation that every gradient oracle must be shown to catch."""
    generic = registry.rule_of(Elemwise, generic=True)

    def wrong(node, g, needs_grad):
        grads = generic(node, g, needs_grad)
        if grads is None or node.op.mode != mode:
            return grads
        return [None if d is None else d * factor for d in grads]

    monkeypatch.setitem(registry._GENERIC, Elemwise, wrong)


@dataclass
class MlpStep:
    graph: Graph
    loss: Tensor
    params: list[Tensor]  # w1, b1, w2, b2, w3, b3
    grads: list[Tensor]  # of the loss, one per parameter
    hidden: tuple[Tensor, Tensor]  # the two activations

    @property
    def outputs(self) -> list[Tensor]:
        return [self.loss, *self.grads]


def mlp_step(widths: tuple[int, int, int, int] = (12, 16, 16, 4), first: Callable = gc.relu,
             dtype: str = "float64", batch: int = 8) -> MlpStep:
    """Graph 'mlp': x (batch, widths[0]) → first(x@w1 + b1) → relu(·@w2 + b2) → ·@w3 + b3,
    cross-entropy with int labels (input 'labels'), gradients wrt all six parameters."""
    with gc.Graph("mlp") as g:
        x = gc.input("x", (batch, widths[0]), dtype)
        labels = gc.input("labels", (batch,), "int32")
        params = []
        for k, (n_in, n_out) in enumerate(zip(widths, widths[1:]), start=1):
            params += [gc.param(f"w{k}", (n_in, n_out), dtype), gc.param(f"b{k}", (n_out,), dtype)]
        w1, b1, w2, b2, w3, b3 = params
        h1 = first(x @ w1 + b1)
        h2 = gc.relu(h1 @ w2 + b2)
        loss = gc.cross_entropy(h2 @ w3 + b3, labels)
    return MlpStep(g, loss, params, gc.grad(loss, params), (h1, h2))
