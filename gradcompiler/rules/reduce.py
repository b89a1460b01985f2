"""Reduce rules: the seed's SUM-with-axes rule (AddAxis + Broadcast), which
declines full reductions and other modes, and the generic rule of
op-reference §3.3 for every mode. Only float inputs get gradients.

Two deviations from §3.3, both because its formulas are wrong at points users
reach: PRODUCT's `g·y/x` is NaN where x = 0, so the partial is built as the
product of the other elements (exact at zeros, and to every order); MAX/MIN
give every tied element the whole `g`, so the gradient sums to a multiple of
`g`; here it is split evenly among the ties (as torch's `amax` and JAX do).
"""

from __future__ import annotations

import math

from ..frontend.math import cast, equal, maximum, reduce, where
from ..frontend.shapes import broadcast_to, concat, expand_dims, reshape, transpose
from ..frontend.sources import full
from ..ops.reduce import Reduce
from .registry import grad_rule


def _keepdims(t, node):
    """`t` (g or y) with the reduced axes re-inserted as size 1."""
    if node.op.keepdims:
        return t
    axes = node.op.reduced_axes(node.input_types[0].ndim)
    return expand_dims(t, axes) if axes else t


def _shifted(a, k, toward_end):
    """`a` moved k places along its last axis, toward the end or the start, the vacated
    places filled with 1 (the identity of a product)."""
    n = a.shape[-1]
    ones = full(a.shape[:-1] + (k,), 1.0, a.dtype)
    return concat([ones, a[..., :n - k]] if toward_end else [a[..., k:], ones], axis=-1)


def _exclusive_products(a, toward_end):
    """Exclusive cumulative products along the last axis (from the start if toward_end,
    else from the end): a shift by one, then log2(n) doubling steps of Hillis and Steele."""
    scan, k, n = _shifted(a, 1, toward_end), 1, a.shape[-1]
    while k < n:
        scan = scan * _shifted(scan, k, toward_end)
        k *= 2
    return scan


def _product_of_others(x, axes):
    """For each element, the product of the other elements of its reduced group.

    Built from products alone (no division, no test for zero), so it is exact where
    x holds zeros, and its own gradient, by the same rules, is exact too: second
    order through PRODUCT needs no special case. The reduced axes are moved last
    and flattened, so every axes / keepdims form shares the one scan.
    """
    kept = tuple(i for i in range(x.ndim) if i not in axes)
    perm = kept + tuple(axes)
    n = math.prod(x.shape[i] for i in axes)
    group = reshape(transpose(x, perm), tuple(x.shape[i] for i in kept) + (n,))
    others = _exclusive_products(group, True) * _exclusive_products(group, False)
    moved = reshape(others, tuple(x.shape[i] for i in perm))
    return transpose(moved, tuple(perm.index(i) for i in range(x.ndim)))


@grad_rule(Reduce)
def reduce_sum(node, g, needs_grad):
    """The seed's rule: SUM over given axes; declines full reductions and other modes."""
    if node.op.mode != "SUM" or node.op.axes is None:
        return None
    if not needs_grad[0]:
        return [None]
    return [broadcast_to(_keepdims(g, node), node.input_types[0].shape)]


@grad_rule(Reduce, generic=True)
def reduce_generic(node, g, needs_grad):
    x_type = node.input_types[0]
    if not needs_grad[0] or x_type.dtype.kind != "f":
        return [None]
    mode = node.op.mode
    gk = _keepdims(g, node)
    if mode == "SUM":
        return [broadcast_to(gk, x_type.shape)]
    if mode == "MEAN":
        return [broadcast_to(gk * (node.type.size / max(x_type.size, 1)), x_type.shape)]
    x = node.inputs[0]
    if mode == "SUM_SQR":
        return [x * gk * 2]
    if mode == "PRODUCT":
        axes = node.op.reduced_axes(x_type.ndim)
        if math.prod(x_type.shape[a] for a in axes) <= 1:
            return [broadcast_to(gk, x_type.shape)]  # each element's others: the empty product
        return [gk * _product_of_others(x, axes)]
    return [_split_among_ties(x, _keepdims(node.output, node), gk, node.op)]  # MAX, MIN


def _split_among_ties(x, yk, gk, op):
    """g·(x == y) / count(x == y): each group's gradient shared evenly by the elements
    that attain its extreme, so it sums to g (a subgradient). Where y is NaN no element
    equals it and the group passes no gradient; the count is floored at 1 so that case
    divides 0 by 1 rather than making an inf."""
    attains = equal(x, yk)
    count = reduce("SUM", cast(attains, x.dtype), op.axes, keepdims=True)
    return where(attains, gk, 0) / maximum(count, 1)
