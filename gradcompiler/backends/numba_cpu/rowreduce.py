"""Row reductions for generated kernels: `<mode>_row(buf, start, n, init)`.

Why they exist: a reduction accumulated in a register inside a kernel's
innermost loop is a chain of dependent operations, which LLVM vectorises
only for a sum or product it may reassociate. A kernel compiled without the
`reassoc` fast-math flag (a user's choice: the default has it) stores the
values of an innermost sum to a per-thread row buffer, in a loop that
vectorises, and reduces the row with `sum_row`, compiled with `reassoc` in
its own scope. Summation order then differs from a sequential sum by the
usual rounding, never by overflow: only additions are reassociated. A long
row is summed in blocks, as a register row is (`codegen` module docstring).
MAX and MIN rows always come here, whatever the flags: a select chain that
keeps a NaN stays scalar, so `max_row` and `min_row` halve the row in place
instead (`_halving_row`).

Offsets are cast to np.uint64 where they index, as in the generated code:
Numba wraps a signed index that might be negative with a select on every
access, which kept these loops scalar (2048 float32 values in L1: sum_row
2.4 cycles a value against 0.2 unsigned).
"""

from __future__ import annotations

import numpy as np
from numba import njit

_REASSOCIATE = {"reassoc", "contract"}
ROW_SPLIT = 1024
"""Block length of a long sum: each block is summed in the values' dtype (vectorised, each SIMD
lane adding a few tens of values), the blocks in float64 (`codegen` module docstring)."""


@njit(cache=True, nogil=True, fastmath=_REASSOCIATE)
def sum_row(buf, start, n, init):
    """Blocks of ROW_SPLIT values summed in the row's dtype, added to `init` (float64 for a
    float row: the accumulator the generated code passes in), as a register row sums."""
    acc = init
    for lo in range(0, n, ROW_SPLIT):
        part = buf[np.uint64(start + lo)]
        for t in range(lo + 1, min(lo + ROW_SPLIT, n)):
            part += buf[np.uint64(start + t)]
        acc += part
    return acc


@njit(cache=True, nogil=True, fastmath=_REASSOCIATE)
def product_row(buf, start, n, init):
    acc = init
    for lo in range(0, n, ROW_SPLIT):
        part = buf[np.uint64(start + lo)]
        for t in range(lo + 1, min(lo + ROW_SPLIT, n)):
            part *= buf[np.uint64(start + t)]
        acc *= part
    return acc


TREE_TAIL = 16
"""A max or min row is halved in place down to this many values, then scanned."""


@njit(inline="always", cache=True, nogil=True)
def _larger(a, b):
    """max(a, b) where a NaN in either wins (numpy's max): a NaN operand makes a + b NaN.
    Neither arm of the last select is a loaded value, so a halving pass stores it as it is:
    `b if b > a else a` stored over a became a masked store of b (vmaskmovps, microcoded)."""
    larger = a if a > b else b
    return larger if (a == a) & (b == b) else a + b


@njit(inline="always", cache=True, nogil=True)
def _smaller(a, b):
    smaller = a if a < b else b
    return smaller if (a == a) & (b == b) else a + b


@njit(inline="always", cache=True, nogil=True)
def _halving_row(buf, start, n, init, combine):
    """Reduce buf[start:start + n] and `init` with `combine`, halving the row in place:
    value i of each pass takes value i + ⌈m/2⌉, a loop of independent elements that
    LLVM vectorises, where a select chain along the row (a compare and a NaN test per value)
    stays scalar: 2048 float32 values in L1 took 1.3 cycles each scanned, 0.3 halved. The
    row is the kernel's scratch (`w<k>`, written for this reduction alone), so it may be
    overwritten."""
    m = n
    while m > TREE_TAIL:
        half = m // 2
        offset = np.uint64(start + m - half)
        for i in range(half):
            at = np.uint64(start + i)
            buf[at] = combine(buf[at], buf[offset + np.uint64(i)])
        m -= half
    acc = init
    for t in range(m):
        acc = combine(acc, buf[np.uint64(start + t)])
    return acc


@njit(cache=True, nogil=True)
def max_row(buf, start, n, init):
    """NaN wins, as in numpy (`_larger`)."""
    return _halving_row(buf, start, n, init, _larger)


@njit(cache=True, nogil=True)
def min_row(buf, start, n, init):
    return _halving_row(buf, start, n, init, _smaller)
