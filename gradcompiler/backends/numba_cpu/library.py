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

`run_library_op(op, *inputs)` is the one-shot form (allocates the output);
tests and the reference-style driver use it.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from ...errors import IndexOutOfRangeError
from ...ir import Op, TensorType

LibraryKernel = Callable[..., None]


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


from . import library_indexing, library_linalg, library_regions, library_vision  # noqa: E402,F401
