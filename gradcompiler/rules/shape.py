"""Rules of the shape-only ops (seed: reshape, broadcast, addAxis, removeAxis,
pixelShuffle, fastpathcopy; generic: Transpose, Concat, PixelShuffleBackward,
ReduceTo). None of them reads a forward value: shapes are static.
"""

from __future__ import annotations

import numpy as np

from ..frontend.math import reduce_to
from ..frontend.shapes import broadcast_to, reshape, transpose
from ..frontend.tensor import apply
from ..ops.reduce import ReduceTo
from ..ops.shape import (
    AddAxis,
    Broadcast,
    Concat,
    FastpathCopy,
    PixelShuffle,
    PixelShuffleBackward,
    RemoveAxis,
    Reshape,
    Transpose,
)
from .registry import grad_rule


def _only_first(needs_grad, make):
    return [make() if needs_grad[0] else None] + [None] * (len(needs_grad) - 1)


@grad_rule(Reshape)
def reshape_rule(node, g, needs_grad):
    return _only_first(needs_grad, lambda: reshape(g, node.input_types[0].shape))


@grad_rule(Broadcast)
def broadcast_rule(node, g, needs_grad):
    return _only_first(needs_grad, lambda: reduce_to(g, node.input_types[0].shape))


@grad_rule(ReduceTo)
def reduce_to_rule(node, g, needs_grad):
    return _only_first(needs_grad, lambda: broadcast_to(g, node.input_types[0].shape))


@grad_rule(AddAxis)
def add_axis_rule(node, g, needs_grad):
    # remove the new axes at their output positions (the list may be in any order, op-reference
    # §4.2); removing the highest position first keeps the lower ones valid (exact)
    positions = node.op.inserted_positions(node.input_types[0].ndim)
    return _only_first(needs_grad, lambda: apply(RemoveAxis(tuple(sorted(positions, reverse=True))), g))


@grad_rule(RemoveAxis)
def remove_axis_rule(node, g, needs_grad):
    # op-reference §4.3: re-insert at the *original* positions (the seed's sort is wrong
    # when the removed axes are not contiguous)
    positions = node.op.original_positions(node.input_types[0].ndim)
    return _only_first(needs_grad, lambda: apply(AddAxis(positions), g))


@grad_rule(Transpose)
def transpose_rule(node, g, needs_grad):
    return _only_first(needs_grad, lambda: transpose(g, tuple(np.argsort(node.op.perm))))


@grad_rule(FastpathCopy)
def fastpath_copy_rule(node, g, needs_grad):
    return _only_first(needs_grad, lambda: g)


@grad_rule(PixelShuffle)
def pixel_shuffle_rule(node, g, needs_grad):
    return _only_first(needs_grad, lambda: apply(PixelShuffleBackward(node.op.factor), g))


@grad_rule(PixelShuffleBackward)
def pixel_shuffle_backward_rule(node, g, needs_grad):
    return _only_first(needs_grad, lambda: apply(PixelShuffle(node.op.factor), g))


@grad_rule(Concat)
def concat_rule(node, g, needs_grad):
    """Split g along the axis at the input sizes (op-reference §1.5)."""
    axis = node.op.axis
    grads, offset = [], 0
    for needed, t in zip(needs_grad, node.input_types):
        size = t.shape[axis]
        index = (slice(None),) * axis + (slice(offset, offset + size),)
        grads.append(g[index] if needed else None)
        offset += size
    return grads
