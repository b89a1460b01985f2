"""Pre-bound kernel launches: the dispatcher's work done once per launch site, not per call.

`kernel[grid, block, stream](*args)` on a Numba CUDA dispatcher does, on every call: look up
(or build) the launch configuration, compute the Numba type of every argument, find the
compiled specialization for those types (compiling it the first time), and only then
marshal the arguments and launch. An executable launches the same kernels on buffers of
the same types call after call, so all but the marshalling and the launch is the same
answer each time. `PreboundKernel` launches through the dispatcher once, then keeps what
the dispatcher found:

- the configured launch (`dispatcher[grid, block, stream]`: normalised grid and block
  dimensions, the driver's stream object), rebuilt only when a call passes another stream;
- the compiled specialization (numba-cuda's `_Kernel`, from `dispatcher.overloads`, keyed
  by the argument types of the first call), whose `launch(args, griddim, blockdim, stream,
  sharedmem)` is what the dispatcher itself calls last.

Later calls go straight to that `launch`. The types cannot change between calls of one
launch site: every argument is a flat C-contiguous device array of a buffer's fixed dtype
(`device.to_device` refuses non-contiguous device feeds, `device.flat` makes them 1-D) or a
scalar fixed when the launcher was built. A caller that cannot promise that (the debug
mode, which exists to check things) passes `prebind=False` and keeps the dispatcher's path.
GRADCOMPILER_CUDA_PREBIND=0 does the same everywhere, to measure one path against the other.

Where binding would not be the same launch, it is not done and every call goes through the
dispatcher, as before: Numba's CUDA simulator (its `overloads` holds no compiled kernels, and
its configured launch is the kernel object itself, re-configured by every `[...]`, so it
must not be kept), a kernel numba-cuda marks launch-configuration sensitive (it may pick
another specialization per configuration), a configuration with pre-launch callbacks, or a
numba-cuda without these attributes. `bound` says which path a launch site took.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

_NO_STREAM = object()


def prebind_default() -> bool:
    """Whether launches are pre-bound unless told: yes, but for GRADCOMPILER_CUDA_PREBIND=0."""
    return os.environ.get("GRADCOMPILER_CUDA_PREBIND", "1") != "0"


def bound_overload(dispatcher: Any, configured: Any, args: tuple) -> Any | None:
    """The compiled specialization that `configured(*args)` just launched, where calling its
    `launch` directly is the same launch; None otherwise (module docstring)."""
    overloads = getattr(dispatcher, "overloads", None)
    typeof = getattr(dispatcher, "typeof_pyval", None)
    # numba-cuda's is an OrderedDict; the simulator's an always-empty dict of fakes, which
    # the lookup below finds nothing in
    if not isinstance(overloads, Mapping) or typeof is None:
        return None
    if getattr(dispatcher, "_launch_config_sensitive", False) or getattr(configured, "pre_launch_callbacks", None):
        return None
    if not all(hasattr(configured, a) for a in ("griddim", "blockdim", "stream", "sharedmem")):
        return None
    try:
        types = tuple(typeof(a) for a in args)
    except Exception:  # noqa: BLE001 - a type Numba cannot name here: keep the dispatcher's path
        return None
    kernel = overloads.get(types)
    if kernel is None or not callable(getattr(kernel, "launch", None)):
        return None
    if getattr(kernel, "launch_config_sensitive", False):
        return None
    return kernel


class PreboundKernel:
    """`dispatcher[grid, block, stream](*args)`, resolved on the first call and launched
    directly after it (module docstring). Call as `launch(stream, *args)`."""

    def __init__(self, dispatcher: Any, grid: Any, block: Any, prebind: bool | None = None):
        self.dispatcher, self.grid, self.block = dispatcher, grid, block
        self.prebind = prebind_default() if prebind is None else prebind
        self.bound: Any | None = None  # the compiled specialization, once resolved
        self.resolved = False  # whether resolution was tried (it is tried once)
        self._stream: Any = _NO_STREAM
        self._configured: Any = None

    def __call__(self, stream: Any, *args: Any) -> None:
        kernel = self.bound
        if kernel is not None:
            if stream is not self._stream:
                self._configured, self._stream = self.dispatcher[self.grid, self.block, stream], stream
            c = self._configured
            kernel.launch(args, c.griddim, c.blockdim, c.stream, c.sharedmem)
            return
        configured = self.dispatcher[self.grid, self.block, stream]
        configured(*args)  # compiles (or loads from the cache) on the first call
        if self.prebind and not self.resolved:
            self.resolved = True
            self.bound = bound_overload(self.dispatcher, configured, args)
            self._configured, self._stream = configured, stream
