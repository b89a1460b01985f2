"""What the CUDA test files share: the guard that they run on Numba's simulator, or on a
GPU under `make gpu-check` (GRADCOMPILER_GPU_CHECK=1), never by accident on a GPU with
the simulator's tiny launch configurations; and a numpy stand-in for the cuBLAS route."""

from __future__ import annotations

import os

import numpy as np

from gradcompiler.backends.numba_cuda import require_cuda, simulator_active


def cuda_for_tests():
    """numba.cuda, after checking it is the simulator or a `make gpu-check` run (a missing GPU
    and simulator raises BackendUnavailableError, loudly)."""
    cuda = require_cuda()
    if not simulator_active(cuda) and os.environ.get("GRADCOMPILER_GPU_CHECK") != "1":
        raise RuntimeError("the CUDA tests run on Numba's simulator: set NUMBA_ENABLE_CUDASIM=1 before "
                           "numba.cuda is imported (make test does), or run them on a GPU with make gpu-check")
    return cuda


def on_gpu_check(cuda) -> bool:
    """Whether this is `make gpu-check` on a real device (the real cuBLAS route, real graphs)."""
    return not simulator_active(cuda) and os.environ.get("GRADCOMPILER_GPU_CHECK") == "1"


def host_matmul_route(calls: list):
    """A matmul route computing on host copies with numpy in place of cuBLAS, recording each
    call's (a shape, b shape, out shape, transpose_a, transpose_b) in `calls`."""
    def route(a, b, out, transpose_a, transpose_b, stream=0):
        calls.append((tuple(a.shape), tuple(b.shape), tuple(out.shape), transpose_a, transpose_b))
        left, right = a.copy_to_host(), b.copy_to_host()
        left = left.swapaxes(-1, -2) if transpose_a else left
        right = right.swapaxes(-1, -2) if transpose_b else right
        out.copy_to_device(np.ascontiguousarray(np.matmul(left, right), dtype=out.dtype))
    return route
