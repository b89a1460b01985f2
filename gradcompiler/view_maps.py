"""Index maps of the view ops: how a view reads its input.

A view op (Reshape, Broadcast, AddAxis, RemoveAxis, Transpose, Subtensor,
PixelShuffle, PixelShuffleBackward) copies nothing: element `out[idx]` *is* element
`in[view_index(op, idx)]`. The fuser never materialises a view; it threads
the consumer's index through `view_index` down to a buffer. Implicit
broadcasting of an elementwise op's inputs is the same map as `Broadcast`
(`broadcast_index`).

`view_index` dispatches on the op class (one registered function per view
op, as the backends dispatch on ops), so a new view op is one function here.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import singledispatch

from .index_expr import Index, digit, floordiv, mod, ravel, unravel
from .ir import Op
from .ops.indexing import IndexItem, SliceItem, Subtensor
from .ops.shape import AddAxis, Broadcast, PixelShuffle, PixelShuffleBackward, RemoveAxis, Reshape, Transpose

MultiIndex = tuple[Index, ...]


_ZERO = Index.lit(0)


def broadcast_index(index: MultiIndex, in_shape: Sequence[int]) -> MultiIndex:
    """Numpy broadcasting read: right-align, and size-1 dims read element 0.

    An operand of the output's own rank with no size-1 dim reads at `index` itself, the
    common case, returned without building a new index (every fused loop walks it)."""
    offset = len(index) - len(in_shape)
    if offset == 0 and 1 not in in_shape:
        return index
    return tuple(_ZERO if d == 1 else index[k + offset] for k, d in enumerate(in_shape))


@singledispatch
def view_index(op: Op, index: MultiIndex, in_shape: tuple[int, ...], extents: Sequence[int]) -> MultiIndex:
    """The input multi-index that output multi-index `index` of view `op` reads."""
    raise TypeError(f"{op.label} is not a view op")


def is_view(op: Op) -> bool:
    return view_index.dispatch(type(op)) is not view_index.dispatch(object)


@view_index.register
def _(op: Reshape, index, in_shape, extents):
    return unravel(ravel(index, op.shape), in_shape, extents)


@view_index.register
def _(op: Broadcast, index, in_shape, extents):
    return broadcast_index(index, in_shape)


@view_index.register
def _(op: AddAxis, index, in_shape, extents):
    layout: list[int | None] = list(range(len(in_shape)))
    for p in op.axes:
        layout.insert(p, None)
    source = {axis: pos for pos, axis in enumerate(layout) if axis is not None}
    return tuple(index[source[k]] for k in range(len(in_shape)))


@view_index.register
def _(op: RemoveAxis, index, in_shape, extents):
    remaining = list(range(len(in_shape)))
    for p in op.axes:
        remaining.pop(p)
    result = [Index.lit(0)] * len(in_shape)
    for pos, axis in enumerate(remaining):
        result[axis] = index[pos]
    return tuple(result)


@view_index.register
def _(op: Transpose, index, in_shape, extents):
    result = [Index.lit(0)] * len(in_shape)
    for pos, axis in enumerate(op.perm):
        result[axis] = index[pos]
    return tuple(result)


@view_index.register
def _(op: PixelShuffle, index, in_shape, extents):
    r = op.factor
    *lead, c, h, w = index
    channel = c * (r * r) + mod(h, r, extents) * r + mod(w, r, extents)
    return (*lead, channel, floordiv(h, r, extents), floordiv(w, r, extents))


@view_index.register
def _(op: PixelShuffleBackward, index, in_shape, extents):
    r = op.factor
    *lead, c, h, w = index
    row = h * r + digit(c, r, r, extents)
    col = w * r + mod(c, r, extents)
    return (*lead, floordiv(c, r * r, extents), row, col)


@view_index.register
def _(op: Subtensor, index, in_shape, extents):
    items = {item.axis: item for item in op.items}
    result, position = [], 0
    for axis in range(len(in_shape)):
        item = items.get(axis)
        if isinstance(item, IndexItem):
            result.append(Index.lit(item.index))
            continue
        k = index[position]
        position += 1
        result.append(k * item.step + item.start if isinstance(item, SliceItem) else k)
    return tuple(result)


def is_contiguous_view(op: Op) -> bool:
    """Views that keep row-major element order, so a buffer can be reused as is (an alias)."""
    return isinstance(op, (Reshape, AddAxis, RemoveAxis))
