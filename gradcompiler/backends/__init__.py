"""Code-generating backends, chosen by `compile(..., target=...)`.

A backend turns a Kernel IR `Program` into something that runs. `cpu` is
the Numba CPU backend (`numba_cpu`), `cuda` the Numba CUDA backend
(`numba_cuda`), refused with a `BackendUnavailableError` saying why where
there is no GPU and Numba's CUDA simulator is off.
"""

from __future__ import annotations

from ..errors import BackendUnavailableError

TARGETS = ("cpu", "cuda")


def require_target(target: str) -> None:
    """Raise BackendUnavailableError unless `target` can be compiled for here."""
    if target == "cpu":
        return
    if target == "cuda":
        from .numba_cuda import require_cuda  # numba-cuda installed, and a GPU or the simulator

        require_cuda()
        return
    raise BackendUnavailableError(f"unknown target {target!r}; known targets: {', '.join(TARGETS)}")
