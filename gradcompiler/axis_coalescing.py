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
* every load's index has coefficient(k) = coefficient(k + 1) · extent(k + 1)
  (an axis of extent 1 takes any coefficient: its index is always 0), and
  no digit (a view remap's `//` or `%`) reads either axis;
* every reduction reduces both or neither.
Stores and row scratch are indexed by the domain in C order, which merging
two adjacent axes leaves as it was; so are a reduction's kept axes. Axis 0
is never merged: it is the axis threads split, and the one whose index a
later phase's row values belong to. The merged kernel computes the same
values at the same flat offsets, in the same order along each reduction.
"""

from __future__ import annotations

import dataclasses

from .index_expr import Axis, Digit, Index
from .kernel import Load, LoopKernel, Phase, Reduction


def _coefficient(index: Index, k: int) -> int:
    return sum(coeff for atom, coeff in index.terms if atom == Axis(k))


def _digits_read(index: Index, axes: set[int]) -> bool:
    return any(isinstance(atom, Digit) and atom.expr.axes() & axes for atom, _ in index.terms)


def _merged_coefficient(index: Index, k: int, extents: tuple[int, ...]) -> int | None:
    """The coefficient of the merged axis in `index`, or None where k and k + 1 do not walk as one."""
    if _digits_read(index, {k, k + 1}):
        return None
    outer, inner = _coefficient(index, k), _coefficient(index, k + 1)
    if extents[k] == 1:
        return inner
    if extents[k + 1] == 1:
        return outer
    return inner if outer == inner * extents[k + 1] else None


def _renumbered(index: Index, k: int, merged: int) -> Index:
    """`index` over the domain with axes k and k + 1 merged into axis k (coefficient `merged`)."""

    def axis_map(atom):
        if isinstance(atom, Axis):
            return Axis(atom.k - 1) if atom.k > k + 1 else atom
        return Digit(_renumbered(atom.expr, k, 0), atom.div, atom.mod)

    terms: dict = {}
    for atom, coeff in index.terms:
        if atom in (Axis(k), Axis(k + 1)):
            continue
        mapped = axis_map(atom)
        terms[mapped] = terms.get(mapped, 0) + coeff
    if merged:
        terms[Axis(k)] = terms.get(Axis(k), 0) + merged
    return Index.of(terms, index.const)


def _merge(kernel: LoopKernel, k: int) -> LoopKernel | None:
    """`kernel` with axes k and k + 1 merged, or None where they cannot be (module docstring)."""
    extents = kernel.domain
    loads = [i.expr for phase in kernel.phases for i in phase.instrs if isinstance(i.expr, Load)]
    merged = {}
    for load in loads:
        coefficient = _merged_coefficient(load.index, k, extents)
        if coefficient is None:
            return None
        merged[load.index] = coefficient
    if any((k in r.axes) != (k + 1 in r.axes) for r in kernel.reductions()):
        return None

    def reduction(r: Reduction) -> Reduction:
        axes = sorted({a - 1 if a > k else a for a in r.axes})
        return dataclasses.replace(r, axes=tuple(axes))

    def instr(i):
        if not isinstance(i.expr, Load):
            return i
        index = _renumbered(i.expr.index, k, merged[i.expr.index])
        return dataclasses.replace(i, expr=Load(i.expr.param, index))

    phases = tuple(Phase(tuple(instr(i) for i in p.instrs), p.stores, tuple(reduction(r) for r in p.reductions))
                   for p in kernel.phases)
    domain = extents[:k] + (extents[k] * extents[k + 1],) + extents[k + 2:]
    return LoopKernel(domain, kernel.params, phases)


def coalesce_axes(kernel: LoopKernel) -> LoopKernel:
    """`kernel` with every mergeable pair of adjacent inner axes merged (module docstring)."""
    k = len(kernel.domain) - 2
    while k >= 1:
        merged = _merge(kernel, k)
        if merged is not None:
            kernel = merged
            k = min(k, len(kernel.domain) - 2)
        else:
            k -= 1
    return kernel
