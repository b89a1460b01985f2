"""Code-generating backends, chosen by `compile(..., target=...)`.

A backend turns a Kernel IR `Program` into something that runs. `cpu` is
the Numba CPU backend (`numba_cpu`). The CUDA backend plugs in here when
its code generator is complete; until then `target="cuda"` is refused with
a `BackendUnavailableError` that says so.
"""

from __future__ import annotations

from ..errors import BackendUnavailableError

TARGETS = ("cpu", "cuda")


def require_target(target: str) -> None:
    """Raise BackendUnavailableError unless `target` can be compiled for here."""
    if target == "cpu":
        return
    if target == "cuda":
        raise BackendUnavailableError(
            "target='cuda': the CUDA code generator is not available yet (its library kernels are); "
            "compile with target='cpu'")
    raise BackendUnavailableError(f"unknown target {target!r}; known targets: {', '.join(TARGETS)}")
