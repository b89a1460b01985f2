"""Adjacent inner axes of a loop kernel that every access walks as one, merged into one axis.

    coalesce_axes(kernel) -> LoopKernel

Why: a kernel's domain is the shape of the values it computes, so a
convolution layer's batch norm runs over (N, C, H, W) = (64, 32, 32, 32),
its innermost loop 32 points long. Each such loop is two SIMD vectors and
a horizontal reduction of every row register it sums, then the loop over H
starts again. Axes H and W are walked as one by every load (W's stride 1,
H's 32) and reduced together, so they can be one axis of 1,024 points: the
innermost loop is then long enough to vectorise well, and its registers are
reduced once per channel instead of once per 32 points.

Axes k and k + 1 (k ≥ 1) merge where
* every load's index, rewritten over the merged axis (`index_expr.substitute`),
  reads it without a digit (a `//` or `%`): its coefficient of k is that of
  k + 1 times k + 1's extent (an axis of extent 1 takes any coefficient: its
  index is always 0);
* every reduction reduces both or neither.
Stores and row scratch are indexed by the domain in C order, which merging
two adjacent axes leaves as it was; so are a reduction's kept axes. Axis 0
is never merged: it is the axis threads split, and the one whose index a
later phase's row values belong to. The merged kernel computes the same
values at the same flat offsets, in the same order along each reduction.
"""

from __future__ import annotations

import dataclasses

from .index_expr import Digit, Index, floordiv, mod, substitute
from .kernel import Load, LoopKernel, Phase


def _digits_read(index: Index, k: int) -> bool:
    return any(isinstance(atom, Digit) and k in atom.expr.axes() for atom, _ in index.terms)


def _merge(kernel: LoopKernel, k: int) -> LoopKernel | None:
    """`kernel` with axes k and k + 1 merged, or None where they cannot be (module docstring).

    Each load's index is rewritten over the merged domain, old axis k as (m // n) and k + 1 as
    (m % n) of the merged index m (n: k + 1's extent). Where the two walk as one the digits
    recombine into m itself (`Index.of`); a digit of m left over means they do not (the merged
    kernel would still be right, but its innermost loop would divide and take remainders)."""
    extents = kernel.domain
    if any((k in r.axes) != (k + 1 in r.axes) for r in kernel.reductions()):
        return None
    domain = extents[:k] + (extents[k] * extents[k + 1],) + extents[k + 2:]
    merged, inner = Index.axis(k), extents[k + 1]
    mapping = {k: floordiv(merged, inner, domain), k + 1: mod(merged, inner, domain)}
    mapping.update({j: Index.axis(j - 1) for j in range(k + 2, len(extents))})
    phases = []
    for phase in kernel.phases:
        instrs = []
        for instr in phase.instrs:
            if isinstance(instr.expr, Load):
                index = substitute(instr.expr.index, mapping, domain)
                if _digits_read(index, k):
                    return None
                instr = dataclasses.replace(instr, expr=dataclasses.replace(instr.expr, index=index))
            instrs.append(instr)
        reductions = tuple(dataclasses.replace(r, axes=tuple(sorted({a - 1 if a > k else a for a in r.axes})))
                           for r in phase.reductions)
        phases.append(Phase(tuple(instrs), phase.stores, reductions))
    return LoopKernel(domain, kernel.params, tuple(phases))


def coalesce_axes(kernel: LoopKernel) -> LoopKernel:
    """`kernel` with every mergeable pair of adjacent inner axes merged (module docstring); one
    with an empty inner axis, whose loops never run, as it is (there is no extent to divide by).

    One pass from the innermost pair outwards: a merge at k leaves the axes before k as they
    were, and a pair (k + 1, k + 2) that did not merge cannot merge as (merged k, k + 2)
    either: a reduction splits it the same way, and the merged axis carries k + 1's load
    coefficients (an axis k + 1 of extent 1 fails on a reduction alone)."""
    if 0 in kernel.domain[1:]:
        return kernel
    for k in range(len(kernel.domain) - 2, 0, -1):
        kernel = _merge(kernel, k) or kernel
    return kernel
