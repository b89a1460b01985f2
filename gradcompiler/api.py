"""The public entry points that run passes: `grad`, `vjp`, `hvp` (and, in
`compile.py`, `compile`). They translate Tensors to node ids and back; the
work is done by `passes.autodiff`.
"""

from __future__ import annotations

from typing import Sequence

from passes.autodiff import differentiate, seed_cotangent

from .errors import GraphError, NotDifferentiableError
from .frontend.tensor import Tensor
from .heap import collector_paused
from .ir import call_site


def _as_list(x) -> tuple[list[Tensor], bool]:
    single = isinstance(x, Tensor)
    return ([x] if single else list(x)), single


def _same_graph(tensors: Sequence[Tensor]):
    graphs = {id(t.graph): t.graph for t in tensors}
    if len(graphs) != 1:
        raise GraphError("all tensors must come from one graph", site=call_site())
    return next(iter(graphs.values()))


def _check_matching(targets: Sequence[Tensor], given: Sequence[Tensor | None],
                    target: str, what: str) -> None:
    """One `what` per `target`, each of the same shape and dtype (None: skipped). Broadcasting
    is not enough: a vector that merely broadcasts would give a silently different product."""
    if len(given) != len(targets):
        raise GraphError(f"{len(targets)} {target}s but {len(given)} {what}s", site=call_site())
    for t, v in zip(targets, given):
        if v is not None and (v.shape != t.shape or v.dtype != t.dtype):
            raise NotDifferentiableError(
                f"{what} {v.type} does not match {target} {t.type}", site=call_site())


def vjp(outputs, wrt, cotangents, disconnected: str = "error"):
    """Vector-Jacobian product: d(Σ_i <cotangents_i, outputs_i>) / d(wrt).

    `cotangents` must match `outputs` in shape and dtype (None for an output
    that gets no cotangent).
    """
    outs, _ = _as_list(outputs)
    wrts, single = _as_list(wrt)
    cots = [cotangents] if isinstance(cotangents, Tensor) or cotangents is None else list(cotangents)
    _check_matching(outs, cots, "output", "cotangent")
    graph = _same_graph(outs + wrts + [c for c in cots if c is not None])
    with collector_paused():  # why: gradcompiler/heap.py
        ids = differentiate(graph, [o.id for o in outs], [w.id for w in wrts],
                            [c.id if c is not None else None for c in cots], disconnected)
    grads = [Tensor(graph, i) for i in ids]
    return grads[0] if single else grads


def grad(loss: Tensor, wrt, disconnected: str = "error"):
    """Gradient of the scalar `loss` with respect to `wrt` (a Tensor or a list)."""
    if not isinstance(loss, Tensor):
        raise TypeError("grad: loss must be a Tensor")
    if loss.size != 1 or loss.ndim > 1:
        raise NotDifferentiableError(
            f"grad needs a scalar loss, got shape {loss.shape}; use gc.vjp(outputs, wrt, cotangents) "
            "or reduce the output first", site=call_site())
    cotangent = Tensor(loss.graph, seed_cotangent(loss.graph, loss.id))
    return vjp(loss, wrt, cotangent, disconnected)


def hvp(loss: Tensor, wrt, vectors):
    """Hessian-vector product: d(<grad(loss, wrt), vectors>) / d(wrt)."""
    wrts, single = _as_list(wrt)
    vecs, _ = _as_list(vectors)
    _check_matching(wrts, vecs, "wrt tensor", "vector")
    grads = grad(loss, wrts)
    dot = None
    for g, v in zip(grads, vecs):
        term = (g * v).sum()
        dot = term if dot is None else dot + term
    result = grad(dot, wrts, disconnected="zero")
    return result[0] if single else result
