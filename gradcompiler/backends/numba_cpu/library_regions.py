"""Copies of regions known when the graph is built: Concat, Subtensor, SetSubtensor
(op-reference §1.5, §6).

Every offset here is static (Subtensor's items are normalised and checked
when the node is built), so there is no index to validate at run time and
nothing for Numba to add: numpy's strided copy (`np.copyto`, a memcpy-speed
loop; a parallel copy measured within 10% of it, the memory bus being the
limit) writes straight into the destination. The numpy key of a region is
built once, when the kernel is made.
"""

from __future__ import annotations

import numpy as np

from ...ops.indexing import IndexItem, SetSubtensor, SliceItem, Subtensor
from ...ops.shape import Concat
from .library import LibraryKernel, copy_unless_in_place, library_kernel


def region_key(items: tuple[SliceItem | IndexItem, ...]) -> tuple:
    """The numpy basic-indexing key of `items` (axes not named are taken whole)."""
    key: list = [slice(None)] * (max((item.axis for item in items), default=-1) + 1)
    for item in items:
        key[item.axis] = item.as_slice() if isinstance(item, SliceItem) else item.index
    return tuple(key)


@library_kernel.register
def _concat(op: Concat) -> LibraryKernel:
    axis = op.axis

    def concat(*inputs: np.ndarray, out: np.ndarray) -> None:
        np.concatenate(inputs, axis=axis, out=out)

    return concat


@library_kernel.register
def _subtensor(op: Subtensor) -> LibraryKernel:
    key = region_key(op.items)

    def subtensor(x: np.ndarray, *, out: np.ndarray) -> None:
        np.copyto(out, x[key])

    return subtensor


@library_kernel.register
def _set_subtensor(op: SetSubtensor) -> LibraryKernel:
    key = region_key(op.items)

    def set_subtensor(data: np.ndarray, value: np.ndarray, *, out: np.ndarray) -> None:
        copy_unless_in_place(data, out)
        out[key] = value

    return set_subtensor
