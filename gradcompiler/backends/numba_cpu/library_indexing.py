"""Gathers and scatters whose indices arrive at run time: advanced indexing
(IndexingMultiAxisVec and its Incr/Set forms, op-reference §7) and one-hot
indexing (IndexingOneHot, IndexingSetOneHot, §8).

Advanced indexing is reduced, once per input shape, to a canonical form
that one small set of loops covers whatever the rank and the items:

* the data is read as a flat C-order buffer; the slice items become a base
  offset and scaled strides (they stay views, nothing is copied);
* the index tensors, broadcast together and flattened, give one flat
  position `pos[p]` per index tuple (wrapped once, range-checked: a bad
  value raises before anything is read or written);
* the axes that are not indexed split into the ones before the index block
  and the ones after it in the output (numpy's placement rule), each a
  list of offsets, so the output (and the value of Incr/Set) is a
  C-contiguous (pre, P, post) array.

Rows of a table (one run per index tuple, no other kept axis: the
embedding's table[idx] and its gradient) take a path of their own inside
the same loops, without the general form's bookkeeping, which cost the
embedding gather and scatter 1.3-1.7x (the comment above `_copy_run`).

Scatter-add is race-free without atomics: each thread owns a range of
destination positions and walks the whole index list, updating only the
rows it owns. Equal destinations have equal `pos` (the indexed and the
kept axes are disjoint), so they land in one thread, which visits them in
increasing `p`: duplicates accumulate in the value's row-major order, the
order np.add.at uses, so results are bitwise those of the reference. Set
uses the same partition, so the last write in row-major order wins (§7.3).

A scatter-add of rows onto a Fill (`kernel.FilledScatter`, a gather's
gradient whose rows no loop makes) fills its output itself, a block of
`row_blocks.FILL_BLOCK_BYTES` of rows at a time: each thread owns a range of
blocks, buckets the lookups that land in it by block (`row_blocks`: a
counting sort that keeps increasing p, so the order of duplicates, and the
result, are those above), then fills each block and adds
its rows while the block is in cache, asking for the value's rows
GATHER_AHEAD lookups ahead (they are scattered over the whole value). Against
filling the whole table in a loop kernel of its own and then coming back for
each looked-up row, the embedding step took 0.941-1.004 of its time, 0.975
in the middle of nine runs (medians of 240 steps, the two plans alternated in
one process; a 2-core AMD EPYC, whose timings drifted by a fifth between
runs); the prefetch took the call from 2.0 to 1.7 ms in a per-call profile.
Blocks of 64 KB to 512 KB ran alike; 1 MB and more, slower. A zero fill
written as a constant (a memset) gained nothing.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numba import njit, prange

from ...errors import IndexOutOfRangeError
from ...kernel import FilledScatter, RowPositions
from ...ops.indexing import (
    IndexingIncrMultiAxisVec,
    IndexingMultiAxisVec,
    IndexingOneHot,
    IndexingSetMultiAxisVec,
    IndexingSetOneHot,
    SliceItem,
    TensorItem,
    one_hot_range_message,
)
from . import buffers
from .library import (
    LibraryKernel,
    ParallelLoop,
    copy_unless_in_place,
    index_error,
    library_kernel,
    partition_count,
)
from .prefetch import CACHE_LINE, GATHER_AHEAD, prefetch_read
from .row_blocks import block_rows, bucket_lookups, fill_block, owned_blocks

# -- loops -------------------------------------------------------------------------------------

@ParallelLoop
def _flat_positions(indices, sizes, strides, base, pos):
    """pos[p] = base + Σ_j wrap(indices[j, p])·strides[j]; returns how many are out of range."""
    bad = 0
    for p in prange(indices.shape[1]):
        offset = base
        for j in range(indices.shape[0]):
            v = np.int64(indices[j, p])
            v = v + sizes[j] if v < 0 else v
            if v < 0 or v >= sizes[j]:
                bad += 1
            offset += v * strides[j]
        pos[p] = offset
    return bad


# Offsets are unsigned (np.uint64) where an array is indexed: Numba wraps a
# signed index that might be negative with a select on every access, which
# made these copies 5x slower (12 ms against 2 ms for the embedding gather).
# A negative stride still works: the unsigned sums wrap modulo 2^64.
#
# Rows of a table (one run per index, no other kept axis: the embedding's
# table[idx] and its gradient) take a loop of their own inside each kernel:
# the general loop's bookkeeping (the pre-block counter, the loop over
# post offsets) made the embedding gather and scatter 1.3-1.7x slower. The
# stride-1 run is spelled out for LLVM to vectorise (`_copy_run`, `_add_run`).


@njit(inline="always", cache=True, error_model="numpy")
def _copy_run(out, target, data, source, run, step):
    """out[target + b] = data[source + b·step] for b < run."""
    if step == 1:
        for b in range(np.uint64(run)):
            out[target + b] = data[source + b]
    else:
        for b in range(np.uint64(run)):
            out[target + b] = data[source + b * step]


@njit(inline="always", cache=True, error_model="numpy")
def _add_run(out, target, step, value, source, run, accumulate):
    """out[target + b·step] (+)= value[source + b] for b < run."""
    if accumulate and step == 1:
        for b in range(np.uint64(run)):
            out[target + b] += value[source + b]
    elif accumulate:
        for b in range(np.uint64(run)):
            out[target + b * step] += value[source + b]
    else:
        for b in range(np.uint64(run)):
            out[target + b * step] = value[source + b]


@ParallelLoop
def _gather(data, pos, pre_offsets, post_offsets, run, run_stride, parts, out):
    """out[a, p, o, b] = data[pos[p] + pre_offsets[a] + post_offsets[o] + b·run_stride].

    `out` is flat. The (a, p) rows are split into one contiguous block per
    part; the innermost kept axis is a run, copied by a plain strided loop.
    Rows of a table are asked for GATHER_AHEAD indices ahead (`prefetch`).
    """
    n_pos, n_outer = pos.size, post_offsets.size
    rows, row = pre_offsets.size * n_pos, n_outer * run
    step = np.uint64(run_stride)
    block = (rows + parts - 1) // parts
    table_rows = pre_offsets.size == 1 and n_outer == 1
    line = max(CACHE_LINE // data.itemsize, 1)
    for part in prange(parts):
        first, last = part * block, min((part + 1) * block, rows)
        if table_rows:
            offset = pre_offsets[0] + post_offsets[0]
            ahead_until = last - GATHER_AHEAD if step == 1 else first  # contiguous rows only
            for p in range(first, last):
                if p < ahead_until:
                    ahead = np.uint64(pos[p + GATHER_AHEAD] + offset)
                    for b in range(0, run, line):
                        prefetch_read(data, ahead + np.uint64(b))
                _copy_run(out, np.uint64(p * run), data, np.uint64(pos[p] + offset), run, step)
            continue
        a, p = first // max(n_pos, 1), first % max(n_pos, 1)
        for ap in range(first, last):
            start = pos[p] + pre_offsets[a]
            for o in range(n_outer):
                _copy_run(out, np.uint64(ap * row + o * run), data, np.uint64(start + post_offsets[o]), run, step)
            p += 1
            if p == n_pos:
                p, a = 0, a + 1


@ParallelLoop
def _scatter(out, value, pos, pre_offsets, post_offsets, run, run_stride, parts, accumulate):
    """out[pos[p] + pre_offsets[a] + post_offsets[o] + b·run_stride] (+)= value[a, p, o, b].

    Race-free: part t (one per thread) owns the destinations with pos in
    [t·chunk, (t+1)·chunk) and skips the others.
    """
    n_pos, n_outer = pos.size, post_offsets.size
    row = n_outer * run
    step = np.uint64(run_stride)
    chunk = (out.size + parts - 1) // parts
    table_rows = pre_offsets.size == 1 and n_outer == 1
    for part in prange(parts):
        low, high = part * chunk, (part + 1) * chunk
        if table_rows:
            offset = pre_offsets[0] + post_offsets[0]
            for p in range(n_pos):
                if low <= pos[p] < high:
                    _add_run(out, np.uint64(pos[p] + offset), step, value, np.uint64(p * run), run, accumulate)
            continue
        for p in range(n_pos):
            if pos[p] < low or pos[p] >= high:
                continue
            for a in range(pre_offsets.size):
                start = pos[p] + pre_offsets[a]
                for o in range(n_outer):
                    _add_run(out, np.uint64(start + post_offsets[o]), step, value,
                             np.uint64((a * n_pos + p) * row + o * run), run, accumulate)


@ParallelLoop
def _scatter_rows_onto_fill(out, value, pos, row, fill, block_rows, parts):
    """out[:] = fill, then out[pos[p] + b] += value[p·row + b] for b < row, p in order.

    Part t (one per thread) owns a contiguous range of blocks of `block_rows` rows; it
    buckets its lookups by block, in increasing p, then fills each block and adds them
    (`row_blocks`).
    """
    n_blocks = (out.size // row + block_rows - 1) // block_rows
    span = block_rows * row
    line = max(CACHE_LINE // value.itemsize, 1)
    for part in prange(parts):
        blocks, low, high = owned_blocks(part, parts, n_blocks, span, out.size)
        if blocks <= 0:
            continue
        starts = np.empty(blocks + 3, np.int64)
        order = np.empty(pos.size, np.int64)
        bucket_lookups(pos, low, high, span, blocks, starts, order)
        for b in range(blocks):
            fill_block(out, low, high, span, b, fill)
            for k in range(starts[b], starts[b + 1]):
                if k + GATHER_AHEAD < starts[blocks]:
                    ahead = np.uint64(order[k + GATHER_AHEAD] * row)
                    for c in range(0, row, line):
                        prefetch_read(value, ahead + np.uint64(c))
                p = order[k]
                _add_run(out, np.uint64(pos[p]), np.uint64(1), value, np.uint64(p * row), row, True)


# -- advanced indexing: the canonical form -----------------------------------------------------


def _offsets(lengths: Sequence[int], strides: Sequence[int]) -> np.ndarray:
    """Flat offsets of every element of a strided block, in C order."""
    offsets = np.zeros(1, np.int64)
    for length, stride in zip(lengths, strides):
        offsets = (offsets[:, None] + np.arange(length, dtype=np.int64) * stride).ravel()
    return offsets


@dataclass(frozen=True)
class _Plan:
    """Where the elements of an advanced-indexing region sit in a C-order data buffer."""

    base: int                   # offset of the region's first element (slice starts)
    sizes: np.ndarray           # (m,) size of each indexed axis
    strides: np.ndarray         # (m,) element stride of each indexed axis
    axes: tuple[int, ...]       # the indexed axes
    block: tuple[int, ...]      # broadcast shape of the index tensors
    pre_offsets: np.ndarray     # offsets of the kept axes before the index block
    post_offsets: np.ndarray    # offsets of the kept axes after it, but the last
    run: int                    # length of the last kept axis after the block (1 if none)
    run_stride: int             # its element stride


def _plan(items: tuple, shape: tuple[int, ...], index_shapes: Sequence[tuple[int, ...]]) -> _Plan:
    strides = [math.prod(shape[d + 1:]) for d in range(len(shape))]
    lengths, steps, base = list(shape), [1] * len(shape), 0
    for item in items:
        if isinstance(item, SliceItem):
            lengths[item.axis], steps[item.axis] = item.length, item.step
            base += item.start * strides[item.axis] if item.length else 0
    axes = tuple(item.axis for item in items if isinstance(item, TensorItem))
    kept = [d for d in range(len(shape)) if d not in axes]
    consecutive = axes == tuple(range(axes[0], axes[0] + len(axes)))
    split = axes[0] if consecutive else 0           # kept axes before the block (numpy's rule)
    pre, post = kept[:split], kept[split:]
    run, run_stride = (lengths[post[-1]], strides[post[-1]] * steps[post[-1]]) if post else (1, 1)

    def block_offsets(dims: list[int]) -> np.ndarray:
        return _offsets([lengths[d] for d in dims], [strides[d] * steps[d] for d in dims])

    return _Plan(base=base, sizes=np.array([shape[a] for a in axes], np.int64),
                 strides=np.array([strides[a] for a in axes], np.int64), axes=axes,
                 block=np.broadcast_shapes(*index_shapes), pre_offsets=block_offsets(pre),
                 post_offsets=block_offsets(post[:-1]), run=run, run_stride=run_stride)


class _AdvancedRegion:
    """Plans per input shape (static in a compiled graph, so computed once) and the
    index check; the three ops differ only in the loop they run."""

    def __init__(self, op):
        self.op = op
        self.plans: dict[tuple, _Plan] = {}

    def positions(self, shape: tuple[int, ...], indices: Sequence[np.ndarray],
                  pos: np.ndarray | None = None) -> tuple[_Plan, np.ndarray]:
        """The plan of `shape` and the flat position of every index tuple (into `pos` when
        given), every index checked first."""
        key = (shape, *(i.shape for i in indices))
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = _plan(self.op.items, shape, [i.shape for i in indices])
        if len(indices) == 1:
            stacked = np.ascontiguousarray(indices[0]).reshape(1, -1)
        else:
            stacked = np.stack([np.broadcast_to(i, plan.block).ravel() for i in indices])
        pos = buffers.empty(stacked.shape[1], np.int64, label="gather positions") if pos is None else pos
        if _flat_positions(stacked.size, stacked, plan.sizes, plan.strides, plan.base, pos):
            self.raise_first_bad(plan, indices)
        return plan, pos

    def raise_first_bad(self, plan: _Plan, indices: Sequence[np.ndarray]) -> None:
        for axis, size, index in zip(plan.axes, plan.sizes, indices):
            values = np.asarray(index, np.int64).ravel()
            bad = (values < -size) | (values >= size)
            if bad.any():
                raise index_error(self.op, int(values[bad][0]), axis, int(size))


def _flat(x: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(x).reshape(-1)


@library_kernel.register
def _indexing_multi_axis_vec(op: IndexingMultiAxisVec) -> LibraryKernel:
    region = _AdvancedRegion(op)

    def gather(x: np.ndarray, *indices: np.ndarray, out: np.ndarray) -> None:
        plan, pos = region.positions(x.shape, indices)
        _gather(out.size, _flat(x), pos, plan.pre_offsets, plan.post_offsets, plan.run, plan.run_stride,
                partition_count(out.size), out.reshape(-1))

    return gather


@library_kernel.register
def _row_positions(op: RowPositions) -> LibraryKernel:
    """Where each row an index of whole rows picks starts (`kernel.RowPositions`): the
    gather's (or scatter's) own index check and positions, written into `out`."""
    region = _AdvancedRegion(op.indexing)

    def positions(index: np.ndarray, *, out: np.ndarray) -> None:
        region.positions(op.shape, (index,), out.reshape(-1))

    return positions


def _scatter_kernel(op, accumulate: bool) -> LibraryKernel:
    region = _AdvancedRegion(op)

    def scatter(data: np.ndarray, value: np.ndarray, *indices: np.ndarray, out: np.ndarray) -> None:
        plan, pos = region.positions(data.shape, indices)     # checks before any write
        copy_unless_in_place(data, out)
        _scatter(value.size, out.reshape(-1), _flat(value), pos, plan.pre_offsets, plan.post_offsets,
                 plan.run, plan.run_stride, partition_count(value.size), accumulate)

    return scatter


@library_kernel.register
def _indexing_incr_multi_axis_vec(op: IndexingIncrMultiAxisVec) -> LibraryKernel:
    return _scatter_kernel(op, accumulate=True)


@library_kernel.register
def _filled_scatter(op: FilledScatter) -> LibraryKernel:
    """`full(shape, c)` with rows added (module docstring): the value is (idx..., row...)."""
    region = _AdvancedRegion(op.scatter)
    shape = op.fill.shape
    row = math.prod(shape[1:])

    def filled_scatter(value: np.ndarray, index: np.ndarray, *, out: np.ndarray) -> None:
        _, pos = region.positions(shape, (index,))     # checks before any write
        if row == 0:
            return
        _scatter_rows_onto_fill(out.size, out.reshape(-1), _flat(value), pos, row, out.dtype.type(op.fill.value),
                                block_rows(row, out.itemsize), partition_count(out.size))

    return filled_scatter


@library_kernel.register
def _indexing_set_multi_axis_vec(op: IndexingSetMultiAxisVec) -> LibraryKernel:
    return _scatter_kernel(op, accumulate=False)


# -- one-hot indexing --------------------------------------------------------------------------


@ParallelLoop
def _count_outside(index, n):
    bad = 0
    for i in prange(index.shape[0]):
        for j in range(index.shape[1]):
            if index[i, j] < 0 or index[i, j] >= n:
                bad += 1
    return bad


@ParallelLoop
def _one_hot_gather(src, index, out):
    """out[i, j] = src[i, index[i, j], j] (src viewed as (before, axis, after))."""
    for i in prange(src.shape[0]):
        for j in range(src.shape[2]):
            out[i, j] = src[i, np.uint64(index[i, j]), j]   # checked, so unsigned: no wraparound


@ParallelLoop
def _one_hot_scatter(out, index, sub):
    """out[i, index[i, j], j] = sub[i, j]: one write per (i, j), so no conflicts."""
    for i in prange(out.shape[0]):
        for j in range(out.shape[2]):
            out[i, np.uint64(index[i, j]), j] = sub[i, j]


def _one_hot_views(shape: tuple[int, ...], axis: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(before, axis, after) and (before, after): the shapes the one-hot loops see."""
    before = math.prod(shape[:axis])
    after = math.prod(shape[axis + 1:])
    return (before, shape[axis], after), (before, after)


def _checked_one_hot_index(op, index: np.ndarray, n: int, plane: tuple[int, int]) -> np.ndarray:
    """index as a (before, after) array, every value in [0, n) (one-hot indexing never wraps)."""
    index2 = np.ascontiguousarray(index).reshape(plane)
    if _count_outside(index2.size, index2, n):
        bad = index2[(index2 < 0) | (index2 >= n)][0]
        raise IndexOutOfRangeError(one_hot_range_message(op, int(bad), n))
    return index2


@library_kernel.register
def _indexing_one_hot(op: IndexingOneHot) -> LibraryKernel:
    def one_hot(src: np.ndarray, index: np.ndarray, *, out: np.ndarray) -> None:
        cube, plane = _one_hot_views(src.shape, op.axis)
        index2 = _checked_one_hot_index(op, index, cube[1], plane)
        _one_hot_gather(index2.size, np.ascontiguousarray(src).reshape(cube), index2, out.reshape(plane))

    return one_hot


@library_kernel.register
def _indexing_set_one_hot(op: IndexingSetOneHot) -> LibraryKernel:
    def set_one_hot(data: np.ndarray, index: np.ndarray, sub: np.ndarray, *,
                    out: np.ndarray) -> None:
        cube, plane = _one_hot_views(data.shape, op.axis)
        index2 = _checked_one_hot_index(op, index, cube[1], plane)
        copy_unless_in_place(data, out)
        _one_hot_scatter(index2.size, out.reshape(cube), index2, np.ascontiguousarray(sub).reshape(plane))

    return set_one_hot
