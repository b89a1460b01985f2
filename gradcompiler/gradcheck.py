"""`check_grads`: symbolic gradients against float64 finite differences.

The graph is first re-typed to float64 (`as_float64`): every float32
placeholder, constant, fill and cast becomes float64 and every other node is
re-inferred, so a user's float32 model is checked in float64 without being
rebuilt. Then, for each `wrt` separately, a random direction `v` and random
output cotangents `u` give

    analytic = <vjp(u)_wrt, v>      numeric = (f(w + εv) − f(w − εv)) / 2ε,
    f(w) = Σ_i <u_i, outputs_i(w)>

both through the reference interpreter. `order=2` runs the same check on
the gradient itself (f = <grad, r> for a random r), which exercises the
rules of the backward ops.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from gradcompiler.passes.autodiff import differentiate, seed_cotangent

from .errors import GraphError
from .frontend.tensor import Tensor, constant
from .ir import ConstValue, Graph
from .ops.custom import CustomGradient
from .ops.elemwise import Cast
from .ops.source import Constant, Fill, Placeholder
from .reference import run_graph


def _widen(dtype: np.dtype) -> np.dtype:
    return np.dtype(np.float64) if np.dtype(dtype).kind == "f" else np.dtype(dtype)


def _widen_op(op):
    if isinstance(op, (Placeholder, Fill, Cast)):
        return replace(op, dtype=_widen(op.dtype))
    if isinstance(op, Constant):
        return Constant(ConstValue(op.value.array.astype(_widen(op.value.array.dtype))))
    return op


def as_float64(graph: Graph) -> tuple[Graph, dict[int, int]]:
    """A float64 copy of `graph` and the map from old node ids to new ones."""
    wide = Graph(graph.name + "_f64")
    mapping: dict[int, int] = {}
    for node_id in graph.topo_order():
        node = graph[node_id]
        new = wide.add(_widen_op(node.op), [mapping[i] for i in node.inputs],
                       role=node.role, name=node.name, site=node.site)
        mapping[node_id] = new.id
        if isinstance(node.op, Placeholder):
            wide.feed_names[node.op.feed_name] = new.id
    return wide, mapping


@dataclass
class GradCheckResult:
    name: str
    analytic: float
    numeric: float

    @property
    def error(self) -> float:
        scale = max(abs(self.analytic), abs(self.numeric), 1e-8)
        return abs(self.analytic - self.numeric) / scale


@dataclass
class GradCheckReport:
    order: int
    results: list[GradCheckResult]
    rtol: float

    @property
    def worst(self) -> GradCheckResult:
        return max(self.results, key=lambda r: r.error)

    @property
    def ok(self) -> bool:
        return all(r.error <= self.rtol for r in self.results)

    def __str__(self) -> str:
        lines = [f"gradient check, order {self.order}, rtol {self.rtol:g}:"]
        for r in self.results:
            flag = "ok" if r.error <= self.rtol else "MISMATCH"
            lines.append(f"  {r.name:>16}: analytic {r.analytic:+.12e}  numeric {r.numeric:+.12e}  "
                         f"rel.err {r.error:.2e}  {flag}")
        w = self.worst
        lines.append(f"  worst: {w.name} (rel.err {w.error:.2e})")
        return "\n".join(lines)


def _directional_check(graph, f_id, wrt_ids, feeds, eps, rng) -> list[GradCheckResult]:
    grads = differentiate(graph, [f_id], wrt_ids, [seed_cotangent(graph, f_id)])
    # evaluated with f: the gradient of a linear f reads no feed, and run_graph rejects unused ones
    analytic_grads = run_graph(graph, [*grads, f_id], feeds)[:-1]
    results = []
    for w, g in zip(wrt_ids, analytic_grads):
        name = graph[w].op.feed_name
        v = rng.standard_normal(graph[w].type.shape)
        base = feeds[name]
        step = eps * max(1.0, float(np.abs(base).max(initial=0.0)))
        plus = run_graph(graph, [f_id], {**feeds, name: base + step * v})[0]
        minus = run_graph(graph, [f_id], {**feeds, name: base - step * v})[0]
        numeric = float((plus - minus) / (2 * step))
        results.append(GradCheckResult(name, float(np.sum(g * v)), numeric))
    return results


def _random_dot(graph: Graph, ids: Sequence[int], rng) -> int:
    """Node id of Σ_i <r_i, node_i> with random constants r_i."""
    with graph:
        total = None
        for i in ids:
            t = Tensor(graph, i)
            r = constant(rng.standard_normal(t.shape), t.dtype)
            term = (t * r).sum()
            total = term if total is None else total + term
    return total.id


def check_grads(outputs, wrt, feeds: Mapping[str, Any], order: int = 1, eps: float = 1e-6,
                rtol: float = 1e-6, seed: int = 0, raise_on_failure: bool = True,
                custom_gradients: str = "refuse") -> GradCheckReport:
    """Compare symbolic gradients of `outputs` wrt the placeholders `wrt` with finite differences.

    A gradient that passes through a `gc.custom_gradient` is the user's own and may differ
    from the true one on purpose (a straight-through estimator), so by default such a check
    is refused with a GraphError naming the composites; `custom_gradients="check"` compares
    it like any other. A composite declared `exact` (`gc.batch_norm`'s) is always compared.
    """
    if custom_gradients not in ("refuse", "check"):
        raise ValueError("custom_gradients must be 'refuse' or 'check'")
    outs = [outputs] if isinstance(outputs, Tensor) else list(outputs)
    wrts = [wrt] if isinstance(wrt, Tensor) else list(wrt)
    for w in wrts:
        if not isinstance(w.node.op, Placeholder):
            raise GraphError(f"check_grads perturbs feeds: {w} must be an input or param")
    if custom_gradients == "refuse":
        _refuse_custom_gradients(outs, wrts)
    wide, mapping = as_float64(outs[0].graph)
    wide_feeds = {k: np.asarray(v).astype(_widen(np.asarray(v).dtype)) for k, v in feeds.items()}
    rng = np.random.default_rng(seed)
    out_ids = [mapping[o.id] for o in outs]
    wrt_ids = [mapping[w.id] for w in wrts]
    f_id = _random_dot(wide, out_ids, rng)
    if order == 2:
        first = differentiate(wide, [f_id], wrt_ids, [seed_cotangent(wide, f_id)])
        f_id = _random_dot(wide, first, rng)
    elif order != 1:
        raise ValueError("order must be 1 or 2")
    report = GradCheckReport(order, _directional_check(wide, f_id, wrt_ids, wide_feeds, eps, rng), rtol)
    if raise_on_failure and not report.ok:
        raise AssertionError(str(report))
    return report


def _refuse_custom_gradients(outs: list[Tensor], wrts: list[Tensor]) -> None:
    graph = outs[0].graph
    between = graph.ancestors([o.id for o in outs]) & graph.descendants([w.id for w in wrts])
    custom = [graph[n] for n in sorted(between) if isinstance(graph[n].op, CustomGradient) and not graph[n].op.exact]
    if custom:
        named = ", ".join(f"'{n.op.label_name}' (built at {n.site})" for n in custom)
        raise GraphError(
            f"check_grads: the gradient passes through custom_gradient {named}, whose backward is "
            "the user's own and need not equal finite differences; pass custom_gradients='check' "
            "to compare it anyway")
