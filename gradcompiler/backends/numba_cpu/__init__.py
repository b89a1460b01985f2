"""The Numba CPU backend: a Kernel IR `Program` becomes compiled kernels and a driver.

    build(program, options) -> CpuBuild

Each distinct `LoopKernel` is generated once (`codegen`), written to the
module cache (`cache`) and compiled eagerly for its one signature (flat,
C-contiguous arrays; inputs read-only, which also accepts writable
arrays); compilation is then switched off for that dispatcher, so a call
can never trigger a surprise compile. Library steps call the routines of
`library`. `runtime` allocates buffers and generates the driver.

Small kernels run serially: below PARALLEL_MIN_POINTS domain points (about
a megabyte of float32, a few tens of microseconds of work), waking threads
costs more than it saves (and a serial kernel compiles faster).

Threads spin briefly between kernels, then sleep (`OMP_WAIT_POLICY=PASSIVE`
with `GOMP_SPINCOUNT=10000`, about 100-200 µs here, unless the environment
says otherwise; `gradcompiler/__init__.py` sets both on import, before Numba
can start its OpenMP pool). A step is a run of short parallel loops: waking a
sleeping thread took 77-86 µs on this 2-core Intel guest, against 1.7 µs for
one still spinning, and the gpt step has about 210 of them. Spinning for
ever (OpenMP's active policy) takes the cores from everything else that runs
between loops; on a busy 2-core machine it made the mlp step 25× slower. The
brief spin was once slower for gpt (1.08 and 1.17 of the time), while its 2-D
products ran on OpenBLAS's threads, whose cores the spinning threads held; every
float product now runs on our threads (`library_linalg`), and the spin took
the workloads from 148-149 to 130-136 ms (gpt), 4.3-4.8 to 3.7-3.9
(attention), 1.16-1.18 to 0.95-0.96 (pixel_shuffle) and 2.31-2.32 to
1.86-2.09 (spatial_transformer), the others within their noise (medians of
alternated processes, 2026-12-03). 100,000 turns were no better, and slower
for cnn, whose convolutions run on threads of their own (`in_spans`).
OpenBLAS's threads spin too, for 2^28 cycles after each threaded product by
default: a parallel loop right after a GEMM then shares a core with a
spinning thread (a 130 µs loop took 530 µs, 360 µs without the spin).
gradcompiler no longer runs threaded BLAS products in a step, but numpy may,
between steps: the spin is cut to 2^20 cycles (`OPENBLAS_THREAD_TIMEOUT=20`,
also set on import, for OpenBLAS to read when numpy loads it).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numba
import numpy as np
from numba import types

from ...kernel import KernelStep, LibraryStep, LoopKernel, Program
from ...progress import compile_progress
from . import cache
from .codegen import KernelSource, generate
from .runtime import BoundKernel, Runner

PARALLEL_MIN_POINTS = 1 << 18
"""Smallest iteration domain (points) a kernel is parallelised over."""

CONSERVATIVE_FASTMATH = frozenset({"contract", "reassoc"})
"""Default flags: fused multiply-add and reassociation, the two that change rounding but not
the special values (no nnan/ninf/nsz/arcp/afn). Reassociation is what lets LLVM vectorise a
sum, the heart of every reduction kernel; it changes the order of additions (so results
differ from a sequential sum by rounding), and could overflow only an intermediate sum
already within a factor of the count of the float range. `mathfuncs` under these flags
agrees with its strict build to 1 ulp with the same finite/non-finite results (tested)."""

FAST_FASTMATH = frozenset({"contract", "reassoc", "arcp", "nsz", "afn"})
"""`fastmath=True`: every LLVM fast-math flag except nnan and ninf (mathfuncs selects on NaN)."""


def fastmath_flags(fastmath: bool | Sequence[str]) -> frozenset[str]:
    """The LLVM flags of a `compile(..., fastmath=...)` argument."""
    if fastmath is True:
        return FAST_FASTMATH
    if fastmath is False or fastmath is None:
        return CONSERVATIVE_FASTMATH
    return frozenset(fastmath)


@dataclass
class CompiledKernel:
    """One distinct kernel: its module, dispatcher and how it was obtained."""

    module: str
    source: KernelSource
    function: Callable
    compile_seconds: float
    from_cache: bool


@dataclass
class BuildOptions:
    fastmath: frozenset[str] = CONSERVATIVE_FASTMATH
    debug: bool = False
    parallel_min_points: int = PARALLEL_MIN_POINTS
    arena_sizes: Sequence[int] | None = None
    step_labels: Sequence[str] = ()


@dataclass
class CpuBuild:
    runner: Runner
    step_kernels: list[CompiledKernel]  # one per KernelStep, in program order
    distinct: list[CompiledKernel] = field(default_factory=list)

    def sources(self) -> str:
        parts = [f"# ---- {k.module}\n{k.source.source}" for k in self.distinct]
        parts.append(f"# ---- driver\n{self.runner.source}")
        return "\n".join(parts)


_COMPILED: dict[tuple[LoopKernel, bool, frozenset], CompiledKernel] = {}


def _array_type(dtype: np.dtype, readonly: bool):
    return types.Array(numba.from_dtype(np.dtype(dtype)), 1, "C", readonly=readonly)


def _signature(kernel: LoopKernel, source: KernelSource) -> tuple:
    params = [_array_type(p.dtype, p.role == "in") for p in kernel.params]
    scratch = [_array_type(dtype, False) for dtype, _ in source.scratch]
    return tuple(params + scratch + [types.intp])


def compile_kernel(kernel: LoopKernel, parallel: bool, fastmath: frozenset[str]) -> CompiledKernel:
    """The compiled kernel of `kernel`, compiling (or loading from Numba's cache) at most once."""
    key = (kernel, parallel, fastmath)
    if key in _COMPILED:
        return _COMPILED[key]
    source = generate(kernel, parallel, fastmath)
    start = time.perf_counter()
    module = cache.load_module(source.source)
    dispatcher = module.kernel
    signature = _signature(kernel, source)
    if not dispatcher.signatures:
        with cache.numba_entry(dispatcher, module.__name__):
            dispatcher.compile(signature)
        cache.record_compile(dispatcher, signature)
        dispatcher.disable_compile()
    from_cache = bool(dispatcher.stats.cache_hits.get(signature))
    compiled = CompiledKernel(module.__name__, source, dispatcher, time.perf_counter() - start, from_cache)
    _COMPILED[key] = compiled
    return compiled


def library_call(op) -> Callable:
    """The routine of a library op: `call(*inputs, out=out)` on shaped arrays."""
    from .library import library_kernel

    return library_kernel(op)


def _parallel(step: KernelStep, options: BuildOptions) -> bool:
    return step.kernel.size >= options.parallel_min_points and len(step.kernel.domain) > 0


def build(program: Program, options: BuildOptions) -> CpuBuild:
    """Compile every kernel of `program` and set up its runtime.

    Numba takes seconds per new kernel, so the kernels this process has not
    built yet are counted on a progress bar (`gradcompiler.progress`: shown
    on a terminal only, when there are more than a few).
    """
    threads = numba.get_num_threads()
    pending = {(step.kernel, _parallel(step, options), options.fastmath) for step in program.steps
               if isinstance(step, KernelStep)}.difference(_COMPILED)
    bound, step_kernels, library = [], [], {}
    with compile_progress(len(pending)) as tick:
        for s, step in enumerate(program.steps):
            if isinstance(step, KernelStep):
                parallel = _parallel(step, options)
                key = (step.kernel, parallel, options.fastmath)
                compiled = compile_kernel(*key)
                if key in pending:
                    pending.discard(key)
                    tick(step.name)
                step_kernels.append(compiled)
                bound.append(BoundKernel(compiled.function, compiled.source.scratch,
                                         threads if parallel else 1))
            else:
                assert isinstance(step, LibraryStep)
                library[s] = library_call(step.op)
    runner = Runner(program, bound, library, options.arena_sizes, options.step_labels, options.debug)
    distinct = list({id(k): k for k in step_kernels}.values())
    return CpuBuild(runner, step_kernels, distinct)
