"""CUDA graphs for the CUDA target: a step's launches captured once (CuPy's stream capture)
and replayed per call, so the host pays one graph launch where it paid one launch per kernel.

Opt-in: GRADCOMPILER_CUDA_GRAPHS=1, or `CudaBuildOptions(cuda_graphs=True)` (False turns it
off whatever the environment says). `graph_capture()` says whether it can be done here: a
`CupyGraphCapture` where CuPy imports and reaches a device; None where the option is off,
under Numba's CUDA simulator (which launches nothing it could capture), without CuPy, or
where CuPy finds no device. Then the runner runs every launch eagerly, as without the option.

What the runner (`executable.CudaRunner`) does with it:

- What is captured: each maximal run of consecutive capturable launches is one graph. A
  launch is capturable when a call of it allocates nothing and never waits for the device
  (`capturable = True` on the launch or its library launcher: generated kernels with their
  folds, library reductions, the tiled matmul). The others run eagerly between the graphs, on
  the same buffers: a device-side index check reads its count of bad values back to the
  host, and cuBLAS through CuPy may take temporaries from CuPy's memory pool, which a graph
  would go on addressing after they were returned. Debug mode (a check after every launch)
  captures nothing.
- Fixed addresses: a graph replays the device pointers it was captured with. Under graphs
  the executable owns every buffer for good, the outputs' storages included; each call's
  outputs are copied out of them (to the host with `to_host=True`, else into fresh device
  arrays, so an array a call returned is still never overwritten by the next call).
- Feeds. A feed the step updates in place (a donated parameter or optimizer slot of
  `gc.train_step`) is captured at the caller's own array, and each call compares addresses:
  the same arrays as at capture, the graph is replayed; others, the step is captured again
  (`captures` counts it). A training loop passes the same state arrays every step, so it
  captures once. Every other feed is copied, device to device on the caller's stream, into
  a buffer of the executable's before the replay: a batch is a new array every step, and
  copying it is one pass over its bytes on the device, never a capture. (Capturing at the
  caller's arrays and re-capturing whenever one changes would capture every step of a
  training loop; copying the donated state in and out would move every parameter twice a
  step.)
- When: the first call runs eagerly on the fixed buffers, which compiles and loads every
  kernel and pre-binds every launch (`launch`; neither may happen inside a capture), and
  then captures; later calls replay.
- Streams: captured on a non-blocking stream of CuPy's, which Numba's launches reach as
  `cuda.external_stream(ptr)`; replayed on the caller's stream after the feeds' copies on
  it, so the caller's order holds.
- A capture that fails (a launch the driver refuses to capture) is reported once as a
  RuntimeWarning; the executable goes on eagerly and `graph_status` says why.

`GraphCapture` is the interface the runner uses (`capture(record) -> graph`,
`launch(graph, stream)`), so a test can stand in for CUDA's capture on the simulator.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any, Protocol

from .device import stream_pointer

ENV = "GRADCOMPILER_CUDA_GRAPHS"


class GraphCapture(Protocol):
    def capture(self, record: Callable[[Any], None]) -> Any:
        """A graph of the work `record(stream)` enqueues on `stream`, which it does not run."""

    def launch(self, graph: Any, stream: Any) -> None:
        """Enqueue `graph` on `stream` (a Numba stream or 0)."""


class CupyGraphCapture:
    """Stream capture through CuPy (`Stream.begin_capture`/`end_capture` -> `cupy.cuda.Graph`)."""

    def __init__(self, cupy: Any):
        self.cupy = cupy
        self._streams: tuple[Any, Any] | None = None  # CuPy's capture stream and Numba's view of it

    def capture(self, record: Callable[[Any], None]) -> Any:
        from numba import cuda

        if self._streams is None:
            stream = self.cupy.cuda.Stream(non_blocking=True)
            self._streams = (stream, cuda.external_stream(stream.ptr))
        stream, numba_stream = self._streams
        with cuda.defer_cleanup():  # no cuMemFree of Numba's pending frees inside the capture
            stream.begin_capture()
            try:
                record(numba_stream)
            except BaseException:
                try:
                    stream.end_capture()
                except Exception:  # noqa: BLE001 - the capture was invalid already; report the first error
                    pass
                raise
            return stream.end_capture()

    def launch(self, graph: Any, stream: Any) -> None:
        graph.launch(self.cupy.cuda.ExternalStream(stream_pointer(stream)))


def requested(option: bool | None = None) -> bool:
    """Whether graphs are asked for: `option` when given, else GRADCOMPILER_CUDA_GRAPHS."""
    if option is not None:
        return bool(option)
    return os.environ.get(ENV, "") not in ("", "0")


def graph_capture(option: bool | None = None) -> GraphCapture | None:
    """The capture API where graphs are asked for and can be captured here, else None
    (module docstring)."""
    if not requested(option):
        return None
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "") not in ("", "0"):
        return None
    return _cupy_capture()


@functools.cache
def _cupy_capture() -> GraphCapture | None:
    try:
        import cupy

        cupy.cuda.runtime.getDeviceCount()
    except Exception:  # noqa: BLE001 - no CuPy, no driver, no device: launches run eagerly
        return None
    return CupyGraphCapture(cupy)


def unavailable_reason(option: bool | None = None) -> str:
    """Why `graph_capture(option)` is None, in words."""
    if not requested(option):
        return f"off ({ENV} unset)" if option is None else "off (cuda_graphs=False)"
    if os.environ.get("NUMBA_ENABLE_CUDASIM", "") not in ("", "0"):
        return "off (Numba's CUDA simulator cannot capture)"
    return "off (CuPy is not installed or finds no GPU)"
