"""Every array the CPU backend allocates: aligned, and fenced by guard bytes in the bounds check.

    empty(shape, dtype, blocks=None, label="")  # starting on an ALIGN boundary
    zeros(shape, dtype, blocks=None, label="")  # the same, zero-filled
    broken_guard(blocks) -> str | None          # a block whose guard bytes were written

Alignment. Each array starts on a pair of cache lines (ALIGN), the unit the adjacent-line
prefetcher fetches: threads that take consecutive regions of one scratch array then share no
line at a region's start, and a 512-bit vector load of an aligned array touches one line, not
two (docs/performance.md). An array is a view of the block allocated here, and numpy points
every view of it at that block (`.base`), which the runtime's reuse of handed-out outputs
reads (`runtime.Runner`).

The bounds check (`GRADCOMPILER_CHECK_BOUNDS=1`, or `gc.compile(..., debug=True)`): a kernel
that writes past its buffer can leave every value right while it corrupts the allocator's
bookkeeping, and the crash comes later, elsewhere. In this mode each array gets GUARD bytes
of a fixed pattern before and after it, and its block is recorded (a weak reference: the
record dies with the array) in `blocks`, the list of the executable that owns it, or in
`LIBRARY_BLOCKS` for the scratch the library kernels keep. The driver checks the guards of
the executable's blocks and the library's after every step, and the first broken one raises
`OutOfBoundsWriteError` naming the step (kernel, forward op, the user's line) and the array.
Writes that land more than GUARD bytes away, and reads out of bounds, are not seen.
"""

from __future__ import annotations

import os
import weakref
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from .prefetch import CACHE_LINE

ALIGN = 2 * CACHE_LINE
"""Where each array allocated here starts: a pair of lines (module docstring)."""

GUARD = 4096
"""Bytes of pattern before and after each array in the bounds check: a page. Any write that
starts past the end lands in them; one of up to a page (a micro-panel of KC float32 rows,
a vector too many) is caught before it reaches the allocator's own bytes, so the check
reports it rather than the allocator aborting on the next free."""

_PATTERN = np.frombuffer(bytes([0xA5, 0x5A, 0xC3, 0x3C]) * (GUARD // 4), np.uint8)

CHECK_ENV = "GRADCOMPILER_CHECK_BOUNDS"


def check_from_env() -> bool:
    """Whether `GRADCOMPILER_CHECK_BOUNDS` asks for the bounds check."""
    return os.environ.get(CHECK_ENV, "").strip().lower() in ("1", "true", "yes", "on")


@dataclass(frozen=True)
class Block:
    """One guarded allocation: its block, where the array starts in it and how long it is."""

    raw: weakref.ref
    start: int
    nbytes: int
    label: str

    def broken(self) -> str | None:
        """Which guard was written (before or after the array), or None if neither was."""
        raw = self.raw()
        if raw is None:
            return None
        end = self.start + self.nbytes
        if not np.array_equal(raw[self.start - GUARD:self.start], _PATTERN):
            return "before"
        if not np.array_equal(raw[end:end + GUARD], _PATTERN):
            return "after"
        return None


LIBRARY_BLOCKS: list[Block] = []
"""Guarded scratch of the library kernels (packing buffers, padded images), kept across calls."""

_guarding = 0  # executables building or running with the check on (`guarded`)


@contextmanager
def guarded(on: bool = True):
    """Within it (when `on`), every array allocated here is guarded: an executable built or run
    with the check on fences the library scratch it allocates lazily too."""
    global _guarding
    _guarding += on
    try:
        yield
    finally:
        _guarding -= on


def checking() -> bool:
    """Whether arrays allocated now get guard bytes."""
    return _guarding > 0 or check_from_env()


def empty(shape, dtype, blocks: list[Block] | None = None, label: str = "") -> np.ndarray:
    """np.empty(shape, dtype) (a size: flat), starting on an ALIGN boundary; guarded and
    recorded in `blocks` (default LIBRARY_BLOCKS) while `checking()`."""
    shape = (int(shape),) if np.ndim(shape) == 0 else tuple(int(n) for n in shape)
    dtype = np.dtype(dtype)
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    if not checking():
        raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
        start = -raw.ctypes.data % ALIGN
        return raw[start:start + nbytes].view(dtype).reshape(shape)
    raw = np.empty(GUARD + ALIGN + nbytes + GUARD, dtype=np.uint8)
    start = GUARD + (-(raw.ctypes.data + GUARD) % ALIGN)
    raw[start - GUARD:start] = _PATTERN
    raw[start + nbytes:start + nbytes + GUARD] = _PATTERN
    blocks = LIBRARY_BLOCKS if blocks is None else blocks
    blocks[:] = [b for b in blocks if b.raw() is not None]  # the records of arrays since freed go
    blocks.append(Block(weakref.ref(raw), start, nbytes, label or f"an array of {shape} {dtype}"))
    return raw[start:start + nbytes].view(dtype).reshape(shape)


def zeros(shape, dtype, blocks: list[Block] | None = None, label: str = "") -> np.ndarray:
    """np.zeros(shape, dtype) from `empty`."""
    array = empty(shape, dtype, blocks, label)
    array.fill(0)
    return array


def broken_guard(blocks: list[Block]) -> str | None:
    """A description of the first block of `blocks` or LIBRARY_BLOCKS whose guard bytes were
    written, or None."""
    for block in (*blocks, *LIBRARY_BLOCKS):
        side = block.broken()
        if side is not None:
            return f"{block.label} ({block.nbytes} bytes): its guard bytes {side} it were overwritten"
    return None
