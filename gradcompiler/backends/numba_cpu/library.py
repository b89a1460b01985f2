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
input's memory (an in-place update planned by the memory pass, perhaps as
another view: `copy_unless_in_place`); it must not alias any other input.
The kernel is built once per op and keeps per-call Python work to a few
attribute reads; the heavy loops are module-level
`@njit(cache=True)` functions, so Numba's on-disk cache covers them.

Index inputs are validated before any memory is touched: a bad index raises
`IndexOutOfRangeError` naming the op, the value and the axis size (Numba
does not bounds-check, so an unchecked index would be a segfault).

Kernels that call BLAS on pieces of a batch (the convolutions) split the
batch into contiguous spans (`split_spans`), one per thread or a few,
which the threads take as they come free, calling BLAS single-threaded
(`in_spans`, `single_threaded_blas`). Threaded BLAS inside many short
products is what made these slow: on a shared 2-core machine OpenBLAS's
threads wait for each other inside every GEMM (a 32×288×65536
filter gradient took 20× the CPU time of the one-thread call; a batch of
16 256×64×256 attention products, one GEMM each, spiked from 1.3 ms to
over 100 ms), while threads that own whole batch items never wait for each
other until the kernel ends. Matrix products, batched or not, have a kernel
of their own (`gemm`, `library_linalg`), which runs on our threads.

Loops are written once with `prange` and compiled twice (`ParallelLoop`):
starting a parallel loop costs 1.5-86 µs depending on the threading layer
and whether the threads still spin from the last loop (measured: spinning
1.5-1.7, asleep 6-9 on one machine and 77-86 on another, workqueue 35-50)
against 0.2 µs for a serial call, so work below `PARALLEL_MIN_WORK`
elements runs serially.

`run_library_op(op, *inputs)` is the one-shot form (allocates the output);
tests and the reference-style driver use it.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import types
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, wait
from typing import Any

import numba
import numpy as np
from numba import njit

from ...errors import IndexOutOfRangeError
from ...ir import Op, TensorType
from ...kernel import SiblingCalls
from . import buffers

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


# -- threads and BLAS -------------------------------------------------------------------------

class _SingleThreadedBlas:
    """A context in which numpy's BLAS runs on one thread (threadpoolctl), re-entrant across
    threads: the first to enter saves the thread count, the last to leave restores it, so two
    executables running at once cannot leave BLAS at one thread."""

    def __init__(self):
        self.lock = threading.Lock()
        self.depth = 0
        self.saved = None
        self.libraries = None

    def _blas(self):
        if self.libraries is None:
            from threadpoolctl import ThreadpoolController

            self.libraries = ThreadpoolController().select(user_api="blas").lib_controllers
        return self.libraries

    def __enter__(self):
        with self.lock:
            if self.depth == 0:
                self.saved = [lib.num_threads for lib in self._blas()]
                for lib in self.libraries:
                    lib.set_num_threads(1)
            self.depth += 1

    def __exit__(self, *exc):
        with self.lock:
            self.depth -= 1
            if self.depth == 0:
                for lib, threads in zip(self.libraries, self.saved):
                    lib.set_num_threads(threads)


single_threaded_blas = _SingleThreadedBlas()
_workers: ThreadPoolExecutor | None = None


def _forget_workers() -> None:
    """A forked child has none of the parent's threads: a pool inherited from it would queue
    work that no thread ever takes, so the child starts a pool of its own."""
    global _workers
    _workers = None


os.register_at_fork(after_in_child=_forget_workers)


def in_spans(work, spans: list[tuple[int, int]], threads: int | None = None) -> list:
    """`work(part, first, stop)` for each span on `threads` threads (default: one per span),
    BLAS single-threaded; the results in span order.

    The calling thread and `threads - 1` workers each take the next span not yet taken until
    none is left, so a thread the OS deschedules (a shared machine) holds up only the span it
    has, not a fixed share of the batch. `part` (< threads) names the thread, for buffers of
    its own. An exception stops the other threads taking spans and is raised here once every
    thread has stopped (none is left writing into the caller's buffers)."""
    global _workers
    threads = len(spans) if threads is None else max(1, min(threads, len(spans)))
    results: list = [None] * len(spans)
    taken = itertools.count()       # next() on it is atomic: each span goes to one thread
    failed: list[BaseException] = []

    def take(part: int) -> None:
        try:
            while not failed and (k := next(taken)) < len(spans):
                results[k] = work(part, *spans[k])
        except BaseException as error:
            failed.append(error)

    with single_threaded_blas:
        if threads > 1 and _workers is None:  # as many workers as Numba could ever be asked to use
            _workers = ThreadPoolExecutor(numba.config.NUMBA_NUM_THREADS, thread_name_prefix="gradcompiler-blas")
        futures = [_workers.submit(take, part) for part in range(1, threads)]
        take(0)
        wait(futures)
    if failed:
        raise failed[0]
    return results


SPANS_PER_THREAD = 4
"""Spans of a batch per thread (`thread_spans`): the finer, the better a thread's stall on a
shared machine is absorbed by the others (measured on the cnn step's convolutions: 251 → 237 ms
median against one span a thread); each span costs a Python-level call or two (microseconds)."""


def thread_spans(count: int, work: int) -> tuple[list[tuple[int, int]], int]:
    """(spans, threads) for `in_spans` over a batch of `count` items doing `work` elements in
    all: up to SPANS_PER_THREAD spans per thread where the work runs parallel and the batch
    has an item per thread, else the whole batch as one span on one thread."""
    threads = partition_count(work)
    if count < threads or threads == 1:
        return split_spans(count, 1), 1
    return split_spans(count, threads * SPANS_PER_THREAD), threads


def split_spans(count: int, parts: int) -> list[tuple[int, int]]:
    """[first, stop) of `parts` contiguous spans of `count` items, sizes differing by at most
    one (at least one span, and none empty unless `count` is 0)."""
    parts = max(1, min(count, parts))
    bounds = [count * p // parts for p in range(parts + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


@functools.singledispatch
def library_kernel(op: Op) -> LibraryKernel:
    """The destination-passing kernel of `op`: `kernel(*inputs, out=out) -> None`."""
    raise NotImplementedError(f"the CPU backend has no library kernel for {op.describe()}")


JointMaker = Callable[[SiblingCalls], "LibraryKernel | None"]
_JOINT_KERNELS: dict[frozenset[type], JointMaker] = {}


def joint_kernel(*op_classes: type) -> Callable[[JointMaker], JointMaker]:
    """Register a maker of the one-pass kernel of a `SiblingCalls` of these op classes (in
    any order); it is called `kernel(*inputs, out=(one output per op, in op order))`. A maker
    may decline (None) calls its kernel cannot join, such as ones reading different values
    where the sibling key leaves that open."""
    def register(maker: JointMaker) -> JointMaker:
        _JOINT_KERNELS[frozenset(op_classes)] = maker
        return maker
    return register


@library_kernel.register
def _sibling_calls(op: SiblingCalls) -> LibraryKernel:
    """The joint kernel of the calls where one is registered (`joint_kernel`) and takes them,
    else each op's own kernel in turn."""
    maker = _JOINT_KERNELS.get(frozenset(type(o) for o in op.ops))
    joint = maker(op) if maker is not None else None
    if joint is not None:
        return joint
    kernels = [library_kernel(o) for o in op.ops]

    def sibling_calls(*inputs, out):
        for k, kernel in enumerate(kernels):
            kernel(*op.part(k, inputs), out=out[k])

    return sibling_calls


def run_library_op(op: Op, *inputs: np.ndarray) -> np.ndarray:
    """Run `op` once on numpy `inputs` and return a fresh output array."""
    out_type = op.infer(*(TensorType(x.shape, x.dtype) for x in inputs))
    out = buffers.empty(out_type.shape, out_type.dtype, label=f"output of {type(op).__name__}")
    library_kernel(op)(*inputs, out=out)
    return out


def copy_unless_in_place(data: np.ndarray, out: np.ndarray) -> None:
    """Start an update of a copy of `data` in `out`: copy unless `out` is `data`'s memory (an
    in-place update; the driver may hand the two as different views of one buffer). `out`
    aliases `data` wholly or not at all, so a bounds overlap says which."""
    if not np.may_share_memory(out, data):
        np.copyto(out, data)


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
