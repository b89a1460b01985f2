"""Row reductions for generated kernels: `<mode>_row(buf, start, n, init)`.

Why they exist: a reduction accumulated in a register inside a kernel's
innermost loop is a chain of dependent float additions, which LLVM may not
reorder (and so cannot vectorise) without the `reassoc` fast-math flag, and
one such chain keeps the whole loop body scalar. Kernels are compiled
without `reassoc` (it would also let LLVM reorder the carefully ordered
scaling in `mathfuncs`), so a kernel stores the values of an innermost
reduction to a per-thread row buffer, in a loop that vectorises, and
reduces the row with these functions, compiled with `reassoc` in their own
scope. Summation order then differs from a sequential sum by the usual
rounding, never by overflow: only additions are reassociated. A long row
is summed in blocks, as a register row is (`codegen` module docstring).
"""

from __future__ import annotations

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
        part = buf[start + lo]
        for t in range(lo + 1, min(lo + ROW_SPLIT, n)):
            part += buf[start + t]
        acc += part
    return acc


@njit(cache=True, nogil=True, fastmath=_REASSOCIATE)
def product_row(buf, start, n, init):
    acc = init
    for lo in range(0, n, ROW_SPLIT):
        part = buf[start + lo]
        for t in range(lo + 1, min(lo + ROW_SPLIT, n)):
            part *= buf[start + t]
        acc *= part
    return acc


@njit(cache=True, nogil=True)
def max_row(buf, start, n, init):
    """NaN wins, as in numpy: `seen` keeps a NaN met on the way (two selects per element,
    which vectorise where one compare that also tests for NaN does not)."""
    acc = init
    seen = init
    for t in range(n):
        value = buf[start + t]
        acc = value if value > acc else acc
        seen = value if value != value else seen
    return seen if seen != seen else acc


@njit(cache=True, nogil=True)
def min_row(buf, start, n, init):
    acc = init
    seen = init
    for t in range(n):
        value = buf[start + t]
        acc = value if value < acc else acc
        seen = value if value != value else seen
    return seen if seen != seen else acc
