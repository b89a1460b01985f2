"""Forward mode as the transpose of reverse mode (linearise and transpose).

    jvp(graph, outputs, wrt, tangents) -> ids of J·v, one per output

The vector-Jacobian product u ↦ Jᵀu that the reverse pass builds is linear in
the cotangent u. So the pass builds it once with a stand-in cotangent per
output (a zero Fill, a source no feed names), and differentiates ⟨Jᵀu, v⟩
with respect to those stand-ins: the result is J·v, made of ordinary nodes of
the same graph, by the same rule table. Every rule's backward is linear in
its cotangent, so the second sweep transposes it and no node of the result
reads a stand-in: the passes prune the first sweep's nodes, and what is
compiled is the forward values the tangents need plus one linear sweep in
the forward direction, which is what forward mode costs. (PyTensor's
`pushforward` takes the same road; JAX transposes its linearised JVPs the
other way round.) No JVP rule per op is needed, so every op, and every
gradient op, has one.

A backward that is not linear in its cotangent, such as a user's custom
gradient that clips, would make J·v read a stand-in; that is checked and
refused, naming the composite, rather than evaluated at u = 0. The method
needs every backward op to have a gradient wrt its cotangent input; each has
one (a warp's matrix goes through WarpPerspectiveBackwardMat, whose transpose
is WarpPerspectiveTangentMat), and a rule that raised NotDifferentiableError
here would be reported with its own message.
"""

from __future__ import annotations

from collections.abc import Sequence

from gradcompiler.errors import NotDifferentiableError
from gradcompiler.frontend.sources import zeros
from gradcompiler.frontend.tensor import Tensor
from gradcompiler.ir import Graph
from gradcompiler.ops.custom import CustomGradient
from gradcompiler.ops.source import Fill

from .autodiff import differentiate, seed_cotangent


def jvp(graph: Graph, outputs: Sequence[int], wrt: Sequence[int],
        tangents: Sequence[int | None]) -> list[int]:
    """Node ids of J·tangents for each of `outputs` (zeros where none depends on `wrt`)."""
    stand_ins = []
    for o in outputs:
        t = graph[o].type
        with graph.building("backward", origin=o):
            stand_ins.append(graph.add(Fill(t.shape, t.dtype, 0.0), role="const").id)
    transposed = differentiate(graph, outputs, wrt, stand_ins, disconnected="zero")
    pairing = None
    for g, v in zip(transposed, tangents):
        if v is None:
            continue
        term = (Tensor(graph, g) * Tensor(graph, v)).sum()
        pairing = term if pairing is None else pairing + term
    if pairing is None:  # every tangent None: J·0
        with graph, graph.building("backward"):
            return [zeros(graph[o].type.shape, graph[o].type.dtype).id for o in outputs]
    seed = seed_cotangent(graph, pairing.id)
    try:
        result = differentiate(graph, [pairing.id], stand_ins, [seed], disconnected="zero")
    except NotDifferentiableError as err:
        raise NotDifferentiableError(
            f"jvp transposes the backward, and one of its ops has no gradient wrt its "
            f"cotangent: {err.message}", op=err.op, site=err.site) from None
    _check_linear(graph, result, set(stand_ins))
    return result


def _check_linear(graph: Graph, result: list[int], stand_ins: set[int]) -> None:
    reads = graph.ancestors(result)
    if not reads & stand_ins:
        return
    origins = {graph[n].origin for n in reads} - {None}
    composites = sorted({graph[o].op.label_name for o in origins
                         if o in graph and isinstance(graph[o].op, CustomGradient)})
    culprit = (f"the backward of custom_gradient {', '.join(repr(c) for c in composites)} is not "
               "linear in its cotangent (a clipped or rescaled gradient)") if composites else \
        "a gradient rule is not linear in its cotangent"
    raise NotDifferentiableError(f"jvp: {culprit}, so its transpose is no forward-mode product; "
                                 "differentiate that composite without custom_gradient for jvp")
