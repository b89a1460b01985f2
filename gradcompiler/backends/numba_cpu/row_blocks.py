"""Filling a table's gradient a block of rows at a time, with each block's lookups bucketed.

    block_rows(row, itemsize) -> rows per block
    owned_blocks(part, parts, blocks, span, size) -> (count, low, high)
    bucket_lookups(pos, low, high, span, blocks, starts, order)
    fill_block(out, low, high, span, b, fill)

Why: the gradient of a gather of rows is `zeros(table.shape)` with each
looked-up row's gradient added. Filling the whole table first and then
coming back for each looked-up row reads every touched line from memory a
second time. Instead a thread owns a range of blocks of FILL_BLOCK_BYTES of
rows, buckets the lookups that land in its blocks by block, then fills each
block and adds its lookups while the block is in cache. Two places do that:
the library call of a `kernel.FilledScatter` (`library_indexing`), whose
rows arrive as a value, and a loop that makes the rows itself and adds them
as it goes (`kernel.RowScatter`, `codegen`), so that they are never written
and read back.

The bucketing is a counting sort that keeps increasing p within a block, so
duplicates accumulate in the value's row-major order, the order np.add.at
uses: results are bitwise those of the reference when the rows are. It
needs no array beyond `starts` and `order` (which the caller owns: a
generated kernel allocates nothing): `starts` counts, then holds each
block's first place in `order`, then (as each lookup is placed) its last.
Each thread scans every lookup, so the scans test no lookup with a branch
(`bucket_lookups`): on the embedding's 65,536 random lookups, two threads
bucketing their halves of the table took 0.36 ms with a branch per lookup and
scan, and 0.13 ms without.
"""

from __future__ import annotations

import numpy as np
from numba import njit

FILL_BLOCK_BYTES = 256 * 1024
"""Bytes of destination rows filled and updated at a time: well inside a core's L2, so a
block's rows are in cache while its lookups update them. Blocks of 64 KB to 512 KB ran alike
on the embedding's gradient; 1 MB and more, slower."""


def block_rows(row: int, itemsize: int) -> int:
    """Rows of `row` elements of `itemsize` bytes in one block (at least one)."""
    return max(FILL_BLOCK_BYTES // max(row * itemsize, 1), 1)


@njit(inline="always", cache=True, error_model="numpy")
def owned_blocks(part, parts, blocks, span, size):
    """(count, low, high): how many of `blocks` blocks of `span` elements, over an output of
    `size`, part `part` of `parts` owns, and the elements [low, high) they cover."""
    first = part * blocks // parts
    count = (part + 1) * blocks // parts - first
    return count, first * span, min((first + count) * span, size)


@njit(inline="always", cache=True, error_model="numpy", boundscheck=False)
def fill_block(out, low, high, span, b, fill):
    """out = fill over block b of those from `low` (the last one ends at `high`)."""
    for z in range(np.uint64(low + b * span), np.uint64(min(low + (b + 1) * span, high))):
        out[z] = fill


@njit(inline="always", cache=True, error_model="numpy", boundscheck=False)
def bucket_lookups(pos, low, high, span, blocks, starts, order):
    """Bucket every lookup p by the block of `span` elements from `low` that pos[p] falls in,
    each block's in increasing p: afterwards the lookups of block b < `blocks` are
    order[starts[b]:starts[b + 1]]. Lookups outside [low, high) go to a block of their own
    after the others, so no lookup is tested with a branch, which would be mispredicted on
    random indices (one pass over the lookups each way). `starts` holds at least
    blocks + 3 entries and `order` pos.size."""
    for b in range(blocks + 3):
        starts[b] = 0
    for p in range(pos.size):
        starts[_block_of(pos[p], low, high, span, blocks) + 2] += 1
    for b in range(2, blocks + 3):
        starts[b] += starts[b - 1]          # starts[b + 1]: where block b's lookups begin
    for p in range(pos.size):
        b = _block_of(pos[p], low, high, span, blocks) + 1
        order[starts[b]] = p
        starts[b] += 1                      # ... and, once all are placed, where they end


@njit(inline="always", cache=True, error_model="numpy")
def _block_of(position, low, high, span, blocks):
    """The block `position` falls in, or `blocks` when it is outside [low, high)."""
    return (position - low) // span if low <= position < high else blocks
