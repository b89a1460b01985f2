"""cuBLAS for the CUDA target's matrix products, by way of CuPy.

The tiled shared-memory kernel of `library_linalg` reaches a small fraction of
what cuBLAS does on a large GPU (no tensor cores, no register blocking). CuPy
(the `cuda` extra) calls cuBLAS on Numba's device memory without a copy: both
speak `__cuda_array_interface__`. `matmul_route()` says which path the
executable's products take:

- a `CublasMatmul` where CuPy imports and reaches a device;
- None under Numba's CUDA simulator (no GPU: the tiled kernel is what the
  simulator can run), without CuPy, where CuPy finds no device, or with
  GRADCOMPILER_CUDA_MATMUL=tiled (to measure the tiled kernel against cuBLAS).

Precision: float32 products run in full float32 unless TF32 is asked for
(GRADCOMPILER_ALLOW_TF32=1, torch's `allow_tf32`), which CuPy reads as
CUPY_TF32 when it is first imported. A route is a callable
`route(a, b, out, transpose_a, transpose_b, stream)` on device arrays whose
shapes numpy's matmul broadcasting accepts, so a test can stand in for cuBLAS.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from .device import stream_pointer

MatmulRoute = Callable[[Any, Any, Any, bool, bool, Any], None]


class CublasMatmul:
    """`out = op(a) @ op(b)` through cupy.matmul (cuBLAS), on the caller's stream."""

    def __init__(self, cupy: Any):
        self.cupy = cupy

    def __call__(self, a: Any, b: Any, out: Any, transpose_a: bool, transpose_b: bool,
                 stream: Any = 0) -> None:
        cp = self.cupy
        with cp.cuda.ExternalStream(stream_pointer(stream)):
            left, right = cp.asarray(a), cp.asarray(b)
            if transpose_a:
                left = left.swapaxes(-1, -2)
            if transpose_b:
                right = right.swapaxes(-1, -2)
            cp.matmul(left, right, out=cp.asarray(out))


@functools.cache
def matmul_route() -> MatmulRoute | None:
    """The cuBLAS route, or None where the tiled kernel must run (module docstring)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "") not in ("", "0"):
        return None
    if os.environ.get("GRADCOMPILER_CUDA_MATMUL", "").lower() == "tiled":
        return None
    if os.environ.get("GRADCOMPILER_ALLOW_TF32", "") not in ("", "0"):
        os.environ.setdefault("CUPY_TF32", "1")
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: the tiled kernel runs
        return None
    return CublasMatmul(cupy)
