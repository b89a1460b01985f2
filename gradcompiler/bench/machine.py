"""The machine's limits, measured: memory bandwidth and SGEMM throughput.

A step time means little alone; against what the hardware can do at best it
says how far a kernel is from its floor. Two numbers cover the workloads:

* bandwidth: a STREAM-triad-style loop `a = b + s·c` over 2^26 float32 with a
  parallel Numba loop (three arrays of 256 MiB, far beyond any cache),
  counted as 3 × 4 bytes per element, best of a few repetitions;
* SGEMM: numpy's float32 2048³ matmul, 2·n³ FLOP, best of a few repetitions.

Quick mode shrinks both so that the suite's smoke test stays fast; those
figures are not meant to be quoted.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numba
import numpy as np

FULL_STREAM_ELEMENTS = 1 << 26
QUICK_STREAM_ELEMENTS = 1 << 20
FULL_GEMM_N = 2048
QUICK_GEMM_N = 256


@dataclass(frozen=True)
class MachineLimits:
    bandwidth_gb_s: float      # STREAM-triad-style, 1e9 bytes per second
    sgemm_gflop_s: float       # numpy float32 matmul, 1e9 FLOP per second
    stream_elements: int
    gemm_n: int
    threads: int               # Numba's thread count during the triad

    def as_dict(self) -> dict:
        return asdict(self)


@numba.njit(parallel=True, cache=False)
def _triad(a, b, c, scalar):
    for i in numba.prange(a.shape[0]):
        a[i] = b[i] + scalar * c[i]


def _best_of(fn, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def measure_bandwidth(elements: int = FULL_STREAM_ELEMENTS, repeats: int = 5) -> float:
    """GB/s of a parallel triad over `elements` float32 (3 arrays moved per element)."""
    b = np.full(elements, 1.0, np.float32)
    c = np.full(elements, 2.0, np.float32)
    a = np.empty_like(b)
    scalar = np.float32(3.0)
    _triad(a, b, c, scalar)  # compile and fault the pages in
    if not np.all(a[:: max(1, elements // 1024)] == 7.0):
        raise RuntimeError("the bandwidth triad computed a wrong result")
    seconds = _best_of(lambda: _triad(a, b, c, scalar), repeats)
    return 3 * 4 * elements / seconds / 1e9


def measure_sgemm(n: int = FULL_GEMM_N, repeats: int = 5) -> float:
    """GFLOP/s of numpy's float32 n×n×n matmul."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    out = np.empty((n, n), np.float32)
    np.matmul(a, b, out=out)
    seconds = _best_of(lambda: np.matmul(a, b, out=out), repeats)
    return 2.0 * n * n * n / seconds / 1e9


def measure(quick: bool = False) -> MachineLimits:
    elements = QUICK_STREAM_ELEMENTS if quick else FULL_STREAM_ELEMENTS
    n = QUICK_GEMM_N if quick else FULL_GEMM_N
    return MachineLimits(measure_bandwidth(elements), measure_sgemm(n), elements, n,
                         numba.get_num_threads())
