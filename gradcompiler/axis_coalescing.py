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
two adjacent axes leaves as it was; so are a reduction's kept axes. The
merged kernel computes the same values at the same flat offsets, in the
same order along each reduction.

Axis 0 is the axis threads split, and the one whose index a later phase's
row values belong to: a kernel of several phases re-reads, for each index
of axis 0, what its earlier phases made of that row. Axes 0 and 1 merge
(`_merge_rows`) where that makes the row smaller and nothing else changes:
a kernel of several phases whose reductions all keep both axes, whose loads
walk them as one and read no gathered rows. Its row scratch then holds one
index of axis 1 instead of all of them (the row of a `row` buffer drops
axis 1). Attention's softmax over (16, 256, 256) scores, forward and
backward in one kernel of four phases, visited each item's 256 KB of
scores, exponentials and gradients once per phase, from L2; merged, each
phase visits a 1 KB row, in L1, and the attention step took 0.97 of its
time (medians of 200 steps alternated in one process, three times, equal
to one unit in the last place; the gpt step unchanged).
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
    kernel would still be right, but its innermost loop would divide and take remainders).
    With k = 0 a `row` buffer's index, which has no axis 0, drops axis 1 instead, and its row
    shrinks by axis 1's extent (`_merge_rows` checks that every reduction keeps axis 1, so
    every row holds it, outermost)."""
    extents = kernel.domain
    if any((k in r.axes) != (k + 1 in r.axes) for r in kernel.reductions()):
        return None
    domain = extents[:k] + (extents[k] * extents[k + 1],) + extents[k + 2:]
    merged, inner = Index.axis(k), extents[k + 1]
    mapping = {k: floordiv(merged, inner, domain), k + 1: mod(merged, inner, domain)}
    mapping.update({j: Index.axis(j - 1) for j in range(k + 2, len(extents))})
    row_mapping, params = mapping, kernel.params
    if k == 0:   # a row buffer's index has no axis 0: it drops axis 1 (`_merge_rows`)
        row_mapping = {**mapping, 1: Index.lit(0)}
        params = tuple(dataclasses.replace(p, size=p.size // inner) if p.role == "row" else p for p in params)
    phases = []
    for phase in kernel.phases:
        instrs = []
        for instr in phase.instrs:
            if isinstance(instr.expr, Load):
                row = params[instr.expr.param].role == "row"
                index = substitute(instr.expr.index, row_mapping if row else mapping, domain)
                if _digits_read(index, k):
                    return None
                instr = dataclasses.replace(instr, expr=dataclasses.replace(instr.expr, index=index))
            instrs.append(instr)
        reductions = tuple(dataclasses.replace(r, axes=tuple(sorted({a - 1 if a > k else a for a in r.axes})))
                           for r in phase.reductions)
        phases.append(Phase(tuple(instrs), phase.stores, reductions))
    return LoopKernel(domain, params, tuple(phases), kernel.scatter)


def _merge_rows(kernel: LoopKernel) -> LoopKernel | None:
    """`kernel` with axes 0 and 1 merged, where a smaller row is what that changes (module
    docstring): several phases, every reduction keeping both axes, no gathered rows, no rows
    added into a scatter's output (`kernel.RowScatter`: axis 0 is its lookups)."""
    if len(kernel.domain) < 3 or len(kernel.phases) < 2 or kernel.scatter is not None:
        return None
    if any(0 in r.axes or 1 in r.axes for r in kernel.reductions()):
        return None
    loads = [i.expr for p in kernel.phases for i in p.instrs if isinstance(i.expr, Load)]
    if any(load.offset is not None for load in loads):
        return None
    if any(kernel.params[load.param].role == "row" and 0 in load.index.axes() for load in loads):
        return None
    return _merge(kernel, 0)


def coalesce_axes(kernel: LoopKernel) -> LoopKernel:
    """`kernel` with every mergeable pair of adjacent inner axes merged, then axes 0 and 1 where
    `_merge_rows` allows (module docstring); one with an empty inner axis, whose loops never
    run, as it is (there is no extent to divide by).

    One pass from the innermost pair outwards: a merge at k leaves the axes before k as they
    were, and a pair (k + 1, k + 2) that did not merge cannot merge as (merged k, k + 2)
    either: a reduction splits it the same way, and the merged axis carries k + 1's load
    coefficients (an axis k + 1 of extent 1 fails on a reduction alone)."""
    if 0 in kernel.domain[1:]:
        return kernel
    for k in range(len(kernel.domain) - 2, 0, -1):
        kernel = _merge(kernel, k) or kernel
    return _merge_rows(kernel) or kernel
