"""The CUDA backend: `numba.cuda.jit` kernels generated from the Kernel IR,
plus library kernels (matmul, scatter-add, gathers, warps, reductions).

Importing this package does not import `numba.cuda`: Numba decides between
a real GPU and its CUDA simulator (`NUMBA_ENABLE_CUDASIM=1`) when
`numba.cuda` is first imported, and a missing GPU must surface as a clear
`BackendUnavailableError` from `require_cuda`, not as an import failure of
the whole library. Every module of this package that launches kernels
imports `numba.cuda` itself and is only imported after `require_cuda`.
"""

from __future__ import annotations

import os
from types import ModuleType

from ...errors import BackendUnavailableError

SIMULATOR_HINT = "set NUMBA_ENABLE_CUDASIM=1 before numba.cuda is first imported to run on Numba's CUDA simulator"


def require_cuda() -> ModuleType:
    """`numba.cuda`, once it is known to run kernels here (a GPU or the simulator).

    Raises BackendUnavailableError saying why not: numba-cuda is not
    installed, or there is no usable CUDA driver/device and the simulator
    is off (or was switched on too late).
    """
    try:
        from numba import cuda
    except ImportError as err:
        raise BackendUnavailableError(
            f"target='cuda' needs numba-cuda, which is not importable here ({err}); "
            "install it with `pip install 'gradcompiler[cuda]'`") from err
    if simulator_active(cuda):
        return cuda
    if not cuda.is_available():
        reason = " ".join(str(cuda.cuda_error() or "no CUDA device found").split())
        hint = SIMULATOR_HINT
        if os.environ.get("NUMBA_ENABLE_CUDASIM", "0") not in ("", "0"):
            hint = ("NUMBA_ENABLE_CUDASIM is set, but numba.cuda had been imported before it was; "
                    "set it at the start of the process")
        raise BackendUnavailableError(f"target='cuda' cannot run here: no usable CUDA driver or GPU "
                                      f"({reason}); {hint}")
    return cuda


def simulator_active(cuda: ModuleType | None = None) -> bool:
    """True if the imported `numba.cuda` is the simulator (what was imported, not the env var)."""
    if cuda is None:
        from numba import cuda
    return cuda.to_device.__module__.startswith("numba.cuda.simulator")
