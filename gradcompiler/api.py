"""The public entry points that run passes: `grad`, `vjp`, `hvp`, `jvp`, `jacobian`,
`hessian` (and, in `compile.py`, `compile`). They translate Tensors to node ids and back;
the work is done by `gradcompiler.passes.autodiff` and `gradcompiler.passes.forward`.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from gradcompiler.passes.autodiff import differentiate, seed_cotangent
from gradcompiler.passes.forward import jvp as forward_mode

from .errors import GraphError, NotDifferentiableError
from .frontend.shapes import concat
from .frontend.sources import zeros
from .frontend.tensor import Tensor, constant
from .heap import collector_paused
from .ir import call_site


def _as_list(x, what: str = "wrt") -> tuple[list[Tensor], bool]:
    """`x` as a list of Tensors and whether it was a single one; anything else is named."""
    single = isinstance(x, Tensor)
    items = [x] if single else list(x) if isinstance(x, (list, tuple)) else None
    bad = next((v for v in items if not isinstance(v, Tensor)), None) if items else None
    if items is None or bad is not None:
        kind = type(x if items is None else bad).__name__
        raise GraphError(f"{what} must be a Tensor or a list of Tensors of the graph, got a value of type {kind}; "
                         "a value to differentiate by is a gc.input or gc.param, fed at run time",
                         site=call_site())
    return items, single


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
    vecs = _vectors_for(wrts, vectors, single)
    _check_matching(wrts, vecs, "wrt tensor", "vector")
    grads = grad(loss, wrts)
    dot = None
    for g, v in zip(grads, vecs):
        term = (g * v).sum()
        dot = term if dot is None else dot + term
    result = grad(dot, wrts, disconnected="zero")
    return result[0] if single else result


def _vectors_for(wrts: list[Tensor], given, single: bool) -> list:
    """One vector per wrt tensor (a tangent, a Hessian-vector direction): Tensors and None as
    given, arrays as constants in the graph and dtype of the tensor each pairs with."""
    vecs = [given] if single and not isinstance(given, (list, tuple)) else list(given)
    if len(vecs) != len(wrts):
        return vecs  # _check_matching names the mismatch
    return [v if v is None or isinstance(v, Tensor) else constant(np.asarray(v), w.dtype, w.graph)
            for v, w in zip(vecs, wrts)]


def jvp(outputs, wrt, tangents):
    """Jacobian-vector product: the tangent of each output along `tangents` (one per `wrt`,
    of its shape and dtype; a Tensor or an array; None for no tangent), built as graph nodes
    by linearising and transposing reverse mode (`gradcompiler.passes.forward`)."""
    outs, single = _as_list(outputs, "outputs")
    wrts, single_wrt = _as_list(wrt)
    tans = _vectors_for(wrts, tangents, single_wrt)
    _check_matching(wrts, tans, "wrt tensor", "tangent")
    graph = _same_graph(outs + wrts + [v for v in tans if v is not None])
    ids = forward_mode(graph, [o.id for o in outs], [w.id for w in wrts],
                       [v.id if v is not None else None for v in tans])
    result = [Tensor(graph, i) for i in ids]
    return result[0] if single else result


def jacobian(output: Tensor, wrt, mode: str = "auto"):
    """The dense Jacobian d output / d wrt, of shape output.shape + w.shape for each `wrt`.

    Reverse mode builds one VJP per output element, forward mode one JVP per input
    element; "auto" takes the one that needs fewer (output.size against the total size of
    `wrt`). Each product is a copy of the differentiated graph, so this is for small
    functions; a product with a vector (vjp, jvp, hvp) is what scales.
    """
    if mode not in ("auto", "reverse", "forward"):
        raise ValueError("jacobian: mode must be 'auto', 'reverse' or 'forward'")
    if not isinstance(output, Tensor):
        raise TypeError(f"jacobian: output must be a Tensor, not {type(output).__name__}")
    wrts, single = _as_list(wrt)
    if mode == "auto":
        mode = "reverse" if output.size <= sum(w.size for w in wrts) else "forward"
    blocks = _jacobian_rows(output, wrts) if mode == "reverse" else _jacobian_columns(output, wrts)
    return blocks[0] if single else blocks


def _basis(k: int, like: Tensor) -> Tensor:
    """The k-th one-hot tensor of `like`'s shape and dtype, as a constant."""
    value = np.zeros(like.size, dtype=like.dtype)
    value[k] = 1
    return constant(value.reshape(like.shape), like.dtype, like.graph)


def _jacobian_rows(output: Tensor, wrts: list[Tensor]) -> list[Tensor]:
    rows: list[list[Tensor]] = [[] for _ in wrts]
    for k in range(output.size):
        grads = vjp(output, wrts, _basis(k, output), disconnected="zero")
        for w_rows, g, w in zip(rows, grads, wrts):
            w_rows.append(g.reshape(1, w.size))
    return [_stack(w_rows, output.size, w.size, output, 0).reshape(output.shape + w.shape)
            for w_rows, w in zip(rows, wrts)]


def _jacobian_columns(output: Tensor, wrts: list[Tensor]) -> list[Tensor]:
    blocks = []
    for w in wrts:
        columns = [jvp(output, w, _basis(j, w)).reshape(output.size, 1) for j in range(w.size)]
        blocks.append(_stack(columns, output.size, w.size, output, 1).reshape(output.shape + w.shape))
    return blocks


def _stack(parts: list[Tensor], rows: int, columns: int, like: Tensor, axis: int) -> Tensor:
    if not parts:  # an empty output or wrt: an empty block
        with like.graph:
            return zeros((rows, columns), like.dtype)
    return parts[0] if len(parts) == 1 else concat(parts, axis)


def hessian(loss: Tensor, wrt):
    """The dense Hessian of a scalar `loss`: forward mode over the reverse-mode gradient.
    One wrt Tensor: a Tensor of shape w.shape + w.shape; a list: H[a][b] blocks."""
    wrts, single = _as_list(wrt)
    grads = grad(loss, wrts, disconnected="zero")
    blocks = [[jacobian(g, w, mode="forward") for w in wrts] for g in grads]
    return blocks[0][0] if single else blocks
