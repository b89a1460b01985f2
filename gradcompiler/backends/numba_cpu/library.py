"""Library kernels of the CPU backend: the ops the Kernel IR names as calls.

`library_kernel(op)` dispatches on the op's class (`functools.singledispatch`,
PyTensor's style: one module per op family registers its ops) and returns a
kernel in destination-passing style:

    kernel = library_kernel(op)
    kernel(*inputs, out=buffer)      # writes the op's value into `buffer`, returns None

`inputs` are numpy arrays in the op's input order (any strides); `out` is a
preallocated C-contiguous array of the op's output type. For the ops that
update a copy of their first input (SetSubtensor, IndexingSetOneHot,
IndexingIncrMultiAxisVec, IndexingSetMultiAxisVec) `out` may be that very
input (an in-place update planned by the memory pass); it must not alias
any other input. The kernel is built once per op and keeps per-call Python
work to a few attribute reads; the heavy loops are module-level
`@njit(cache=True)` functions, so Numba's on-disk cache covers them.

Index inputs are validated before any memory is touched: a bad index raises
`IndexOutOfRangeError` naming the op, the value and the axis size (Numba
does not bounds-check, so an unchecked index would be a segfault).

Loops are written once with `prange` and compiled twice (`ParallelLoop`):
waking the thread pool costs 1.5-50 µs depending on the threading layer
and OMP's wait policy (measured here: active 1.5, passive 6-9, workqueue
35-50) against 0.2 µs for a serial call, so work below
`PARALLEL_MIN_WORK` elements runs serially.

`run_library_op(op, *inputs)` is the one-shot form (allocates the output);
tests and the reference-style driver use it.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

import numba
import numpy as np
from numba import njit

from ...errors import IndexOutOfRangeError
from ...ir import Op, TensorType

LibraryKernel = Callable[..., None]
PARALLEL_MIN_WORK = 1 << 15


class ParallelLoop:
    """A `prange` loop compiled serial and parallel; `loop(work, *args)` picks by `work`.

    Numba's cache keys an entry by the function's qualified name and
    signature, not by its flags, so the serial compilation is of a copy
    with its own name (else the two would overwrite each other's cache).
    """

    def __init__(self, function: Callable):
        options = dict(cache=True, nogil=True, error_model="numpy")
        serial = types.FunctionType(function.__code__, function.__globals__, function.__name__ + "_serial",
                                    function.__defaults__, function.__closure__)
        serial.__qualname__ = function.__qualname__ + "_serial"
        serial.__doc__ = function.__doc__
        self.serial = njit(**options)(serial)
        self.parallel = njit(parallel=True, **options)(function)
        self.__doc__ = function.__doc__

    def __call__(self, work: int, *args: Any) -> Any:
        return (self.parallel if work >= PARALLEL_MIN_WORK else self.serial)(*args)


def partition_count(work: int) -> int:
    """Pieces for a loop that partitions its work itself: one per thread if it runs parallel."""
    return numba.get_num_threads() if work >= PARALLEL_MIN_WORK else 1


@functools.singledispatch
def library_kernel(op: Op) -> LibraryKernel:
    """The destination-passing kernel of `op`: `kernel(*inputs, out=out) -> None`."""
    raise NotImplementedError(f"the CPU backend has no library kernel for {op.describe()}")


def run_library_op(op: Op, *inputs: np.ndarray) -> np.ndarray:
    """Run `op` once on numpy `inputs` and return a fresh output array."""
    out_type = op.infer(*(TensorType(x.shape, x.dtype) for x in inputs))
    out = np.empty(out_type.shape, out_type.dtype)
    library_kernel(op)(*inputs, out=out)
    return out


def index_error(op: Op, value: int, axis: int, size: int,
                what: str = "index") -> IndexOutOfRangeError:
    """The error for an index `value` outside an axis of `size` (after any wrapping)."""
    return IndexOutOfRangeError(
        f"{op.label}: {what} value {value} is out of range for axis {axis} of size {size}")


from . import (  # noqa: E402,F401
    library_conv,
    library_indexing,
    library_linalg,
    library_regions,
    library_vision,
)
