"""The machine's limits, measured: memory bandwidth and SGEMM throughput.

A step time means little alone; against what the hardware can do at best it
says how far a kernel is from its floor. Two numbers cover the workloads:

* bandwidth: a STREAM-triad-style loop `a = b + s·c` over 2^26 float32 with a
  parallel Numba loop (three arrays of 256 MiB, far beyond any cache),
  counted as 3 × 4 bytes per element, best of a few repetitions;
* SGEMM: numpy's float32 2048³ matmul, 2·n³ FLOP, best of a few repetitions.

On target "cuda" the same two numbers are the GPU's: the triad as a Numba
CUDA kernel timed with CUDA events (device memory only), and SGEMM through
cuBLAS by way of CuPy or PyTorch where one is installed (none: the field is
NaN and floors come from bandwidth alone). `source` says which was used.

Quick mode shrinks both so that the suite's smoke test stays fast; those
figures are not meant to be quoted.
"""

from __future__ import annotations

import importlib.util
import os
import time
from dataclasses import asdict, dataclass

import numba
import numpy as np

FULL_STREAM_ELEMENTS = 1 << 26
QUICK_STREAM_ELEMENTS = 1 << 20
FULL_GEMM_N = 2048
QUICK_GEMM_N = 256
SIMULATOR_STREAM_ELEMENTS = 1 << 10   # the simulator's figures mean nothing; keep its probe short


LIMITS = ("bandwidth_gb_s", "sgemm_gflop_s")
"""The two figures a step is held against (`MachineLimits`' first two fields)."""


@dataclass(frozen=True)
class MachineLimits:
    bandwidth_gb_s: float      # STREAM-triad-style, 1e9 bytes per second
    sgemm_gflop_s: float       # numpy float32 matmul, 1e9 FLOP per second
    stream_elements: int
    gemm_n: int
    threads: int               # Numba's thread count during the triad (CPU)
    source: str = "cpu: numba triad, numpy matmul"

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


def measure_cuda_bandwidth(elements: int = FULL_STREAM_ELEMENTS, repeats: int = 5) -> float:
    """GB/s of the triad as a grid-stride Numba CUDA kernel, timed with CUDA events."""
    from numba import cuda

    from ..backends.numba_cuda.device import default_config
    from .cuda_triad import triad

    b = cuda.to_device(np.full(elements, 1.0, np.float32))
    c = cuda.to_device(np.full(elements, 2.0, np.float32))
    a = cuda.device_array(elements, np.float32)
    config = default_config()  # tiny grids on the simulator, where each thread is a Python thread
    blocks, threads = config.grid(elements), config.block
    triad[blocks, threads](a, b, c, np.float32(3.0))
    if not np.all(a.copy_to_host()[:: max(1, elements // 1024)] == 7.0):
        raise RuntimeError("the GPU bandwidth triad computed a wrong result")
    best = float("inf")
    for _ in range(repeats):
        begin, end = cuda.event(), cuda.event()
        begin.record()
        triad[blocks, threads](a, b, c, np.float32(3.0))
        end.record()
        end.synchronize()
        best = min(best, begin.elapsed_time(end) / 1e3)
    return 3 * 4 * elements / best / 1e9


def measure_cuda_sgemm(n: int = FULL_GEMM_N, repeats: int = 5) -> tuple[float, str]:
    """GFLOP/s of cuBLAS's float32 n×n×n matmul through CuPy or PyTorch (NaN without either, or
    without a GPU for them to reach)."""
    def timed(matmul, synchronize) -> float:
        def once():
            matmul()
            synchronize()

        once()  # cuBLAS handle and kernel selection
        return 2.0 * n * n * n / _best_of(once, repeats) / 1e9

    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    from ..backends.numba_cuda.cublas import matmul_route

    route = matmul_route()  # CuPy where it reaches a GPU: the executables' own cuBLAS route
    if route is not None:
        cupy = route.cupy
        da, db = cupy.asarray(a), cupy.asarray(b)
        out = cupy.empty_like(da)
        return timed(lambda: cupy.matmul(da, db, out=out), cupy.cuda.Device().synchronize), "cupy"
    if importlib.util.find_spec("torch") is not None:
        import torch

        if torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = False  # float32 as the compiled steps compute it
            da, db = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
            out = torch.empty_like(da)
            return timed(lambda: torch.matmul(da, db, out=out), torch.cuda.synchronize), "torch"
    return float("nan"), "none"


def measure(quick: bool = False, target: str = "cpu") -> MachineLimits:
    elements = QUICK_STREAM_ELEMENTS if quick else FULL_STREAM_ELEMENTS
    n = QUICK_GEMM_N if quick else FULL_GEMM_N
    if target == "cuda":
        from numba import cuda

        from ..backends.numba_cuda import simulator_active

        if simulator_active(cuda):
            elements, n = SIMULATOR_STREAM_ELEMENTS, QUICK_GEMM_N
        sgemm, library = measure_cuda_sgemm(n)
        return MachineLimits(measure_cuda_bandwidth(elements), sgemm, elements, n, numba.get_num_threads(),
                             "cuda: numba triad kernel, " + (f"cuBLAS matmul through {library}" if library != "none"
                                                             else "no SGEMM (neither CuPy nor PyTorch)"))
    from ..backends.numba_cpu.cpu_profile import PROFILE

    return MachineLimits(measure_bandwidth(elements), measure_sgemm(n), elements, n, numba.get_num_threads(),
                         f"cpu: numba triad, numpy matmul; {blas_setting()}; profile {PROFILE.describe()}")


def blas_setting() -> str:
    """Which BLAS kernel numpy's matmul (and so ours) runs, and the OpenBLAS variables that
    chose it: OPENBLAS_CORETYPE=Haswell, set on some machines for old OpenBLAS builds, halves
    SGEMM on a current one, so every figure says which setting it was measured with."""
    forced = {k: os.environ[k] for k in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE") if k in os.environ}
    setting = ", ".join(f"{k}={v}" for k, v in forced.items()) or "no OPENBLAS_* override"
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return f"BLAS kernel unknown (no threadpoolctl), {setting}"
    blas = [i for i in threadpool_info() if i.get("user_api") == "blas"]
    names = dict.fromkeys(f"{i.get('internal_api')} {i.get('architecture')}" for i in blas)
    kernels = ", ".join(names) or "no BLAS found"
    return f"{kernels}, {setting}"
