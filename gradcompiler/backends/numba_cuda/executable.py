"""Running a Kernel IR `Program` on the GPU: compiled kernels, library launchers,
device buffers from the memory plan, and the per-call driver.

    build(program, options) -> CudaBuild       (its `runner.run(feeds, to_host)` runs one step)

Every buffer lives on the device from the first kernel to the last: the
memory plan's shared storages are device arenas allocated once per
executable (a value is a typed view of its storage), constants are uploaded
once, feeds are uploaded once per call (numpy) or used in place (device
arrays, `__cuda_array_interface__`), and only what the caller asks for
comes back (`to_host=True`). Storages that hold a graph output are
allocated afresh per call, so the device arrays a call returns are never
overwritten by the next call; a donated output (`Program.in_place`) is
written over its feed, the caller's device array, which is the result.
`allocations` and `allocated_bytes` count what calls allocate on the device.
The other storages, scratch rows and partials are shared by every call, so
calls are serialised by a lock per executable (as on the CPU,
`numba_cpu.runtime`): a second host thread waits until the first call's
kernels are enqueued and its outputs made.

Each distinct `LoopKernel` is generated once per launch geometry
(`codegen`), written to the module cache shared with the CPU backend
(`numba_cpu.cache`, so Numba's `cache=True` finds the file again), and
compiled by Numba when first launched. Every launch site is pre-bound
(`launch.PreboundKernel`): Numba's dispatcher resolves its argument types
once, at the first call, and later calls launch the compiled kernel directly.

With GRADCOMPILER_CUDA_GRAPHS=1 (`CudaBuildOptions.cuda_graphs`) the runner
captures the step's launches into CUDA graphs after the first call and
replays them; every buffer then has a fixed address, feeds are copied into
the executable's own buffers, and outputs are copied out (`cuda_graphs`
says why and when, and what is not captured).
"""

from __future__ import annotations

import functools
import threading
import time
import warnings
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numba import cuda

from ...errors import FeedError, NonFiniteError
from ...feeds import validate_feeds
from ...ir import Node, TensorType
from ...kernel import KernelStep, LibraryStep, LoopKernel, Program
from ..numba_cpu import cache
from .codegen import CudaKernelSource, block_for, generate
from .cuda_graphs import GraphCapture, graph_capture, unavailable_reason
from .device import LaunchConfig, copy, default_config, device_address, flat, is_device_array, to_device, view
from .launch import PreboundKernel
from .library import cuda_library_kernel
from .library_reduce import PartialFold


@dataclass
class CompiledCudaKernel:
    """One distinct generated kernel: its module and dispatcher."""

    module: str
    source: CudaKernelSource
    function: Callable
    compile_seconds: float
    from_cache: bool = False


_COMPILED: dict[tuple[LoopKernel, int, bool], CompiledCudaKernel] = {}


def compile_kernel(kernel: LoopKernel, config: LaunchConfig) -> CompiledCudaKernel:
    """The kernel of `kernel` for `config`'s geometry, generated and loaded at most once."""
    block, shuffle = block_for(kernel, config.reduce_block), config.shuffle
    key = (kernel, block, shuffle)
    if key not in _COMPILED:
        start = time.perf_counter()
        source = generate(kernel, block, shuffle)
        module = cache.load_module(source.source)
        _COMPILED[key] = CompiledCudaKernel(module.__name__, source, module.kernel, time.perf_counter() - start)
    return _COMPILED[key]


@dataclass
class CudaBuildOptions:
    config: LaunchConfig | None = None
    debug: bool = False
    arena_sizes: Sequence[int] | None = None
    step_labels: Sequence[str] = ()
    cuda_graphs: bool | None = None  # None: GRADCOMPILER_CUDA_GRAPHS decides (`cuda_graphs`)


class _KernelLaunch:
    """A KernelStep bound to its buffers, scratch rows and partial folds, launched through a
    `PreboundKernel` (the dispatcher's type resolution once, not per call; `launch`)."""

    capturable = True  # no allocation, no host synchronisation (`cuda_graphs`)

    def __init__(self, step: KernelStep, compiled: CompiledCudaKernel, config: LaunchConfig,
                 prebind: bool | None = None):
        self.step, self.compiled = step, compiled
        source = compiled.source
        self.grid = source.grid(step.kernel, config.partial_blocks if source.partials else config.max_blocks)
        self.block = source.block
        self.kernel = PreboundKernel(compiled.function, self.grid, self.block, prebind)
        self.scratch = {k: cuda.device_array(self.grid * p.size, p.dtype)
                        for k, (b, p) in enumerate(zip(step.args, step.kernel.params)) if b is None}
        self.partials = [cuda.device_array(self.grid * s.kept, s.dtype) for s in source.partials]
        self.folds = [(PartialFold(s.mode, s.divisor, s.dtype, self.grid, s.kept, config), step.args[s.param])
                      for s in source.partials]

    def __call__(self, buffers: list[Any], stream: Any) -> None:
        args = [self.scratch[k] if b is None else buffers[b] for k, b in enumerate(self.step.args)]
        self.kernel(stream, *args, *self.partials)
        for (fold, out), partials in zip(self.folds, self.partials):
            fold(partials, buffers[out], stream)


class _LibraryLaunch:
    def __init__(self, step: LibraryStep, program: Program, config: LaunchConfig):
        self.step = step
        self.shapes = [program.buffers[b].shape for b in step.inputs]
        self.out_shapes = [program.buffers[b].shape for b in step.outputs]
        types = [TensorType(program.buffers[b].shape, program.buffers[b].dtype) for b in step.inputs]
        self.launch = cuda_library_kernel(step.op, types, config)
        self.capturable = bool(getattr(self.launch, "capturable", False))  # `cuda_graphs`

    def __call__(self, buffers: list[Any], stream: Any) -> None:
        inputs = [view(buffers[b], shape) for b, shape in zip(self.step.inputs, self.shapes)]
        outs = tuple(view(buffers[b], shape) for b, shape in zip(self.step.outputs, self.out_shapes))
        self.launch(*inputs, out=outs[0] if len(outs) == 1 else outs, stream=stream)


class CudaRunner:
    """Device buffers of one executable and the loop over its steps."""

    def __init__(self, program: Program, launches: list, options: CudaBuildOptions, config: LaunchConfig,
                 capture: GraphCapture | None = None):
        self.program, self.launches, self.config = program, launches, config
        self.debug, self.step_labels = options.debug, list(options.step_labels)
        buffers = program.buffers
        self.outputs = {self._root(b) for b in program.outputs}
        self.arena_sizes = list(options.arena_sizes or ())
        self.per_call_storage = sorted({buffers[b].storage for b in self.outputs
                                        if self._in_arena(b)})
        arenas = {s: cuda.device_array(max(size, 1), np.uint8) for s, size in enumerate(self.arena_sizes)
                  if s not in self.per_call_storage}
        self.allocations = self.allocated_bytes = 0
        self.fixed: list[Any] = [None] * len(buffers)  # None: a feed, an alias, or allocated per call
        for b, spec in enumerate(buffers):
            if spec.role == "const":
                self.fixed[b] = cuda.to_device(np.ascontiguousarray(spec.value, dtype=spec.dtype).reshape(-1))
            elif spec.role == "temp" and self._in_arena(b):
                if spec.storage in arenas:
                    self.fixed[b] = arenas[spec.storage][: spec.nbytes].view(spec.dtype)
            elif spec.role == "temp" and b not in self.outputs:
                self.fixed[b] = cuda.device_array(spec.size, spec.dtype)
        self.lock = threading.Lock()  # one call at a time (module docstring)
        self._plan_graphs(capture, options)

    def _plan_graphs(self, capture: GraphCapture | None, options: CudaBuildOptions) -> None:
        """Which launches are captured into CUDA graphs, if any (`cuda_graphs`)."""
        self.segments: list[tuple[bool, list]] = []  # maximal runs of (capturable?, launches)
        for launch in self.launches:
            capturable = bool(getattr(launch, "capturable", False))
            if self.segments and self.segments[-1][0] == capturable:
                self.segments[-1][1].append(launch)
            else:
                self.segments.append((capturable, [launch]))
        captured = sum(len(part) for capturable, part in self.segments if capturable)
        if options.debug:
            capture, self.graph_status = None, "off (debug mode checks after every launch)"
        elif capture is None:
            self.graph_status = unavailable_reason(options.cuda_graphs)
        elif not captured:
            capture, self.graph_status = None, "off (no launch of this step can be captured)"
        else:
            graphs = sum(1 for capturable, _ in self.segments if capturable)
            self.graph_status = (f"on: {captured} of {len(self.launches)} launches in {graphs} graph(s), "
                                 "captured after the first call")
        self.capture = capture
        program = self.program
        donated = {program.buffers[program.outputs[k]].feed_name for k in program.in_place}
        written = {self._root(b) for step in program.steps
                   for b in step.outputs}
        self.written_feeds = tuple(b for b, spec in enumerate(program.buffers)
                                    if spec.role == "feed" and (b in written or spec.feed_name in donated))
        self.captures = 0  # graphs captured (once, plus once per change of a written feed's array)
        self._owned: list[Any] | None = None  # every buffer, fixed for the graphs' sake
        self._warm = False  # whether a first call ran eagerly on the fixed buffers
        self._graphs: list[Any] | None = None  # one per segment: a graph, or None (run eagerly)
        self._graph_key: tuple | None = None  # the written feeds' addresses the graphs hold

    def _in_arena(self, b: int) -> bool:
        return self.program.buffers[b].storage is not None and bool(self.arena_sizes)

    def _root(self, b: int) -> int:
        spec = self.program.buffers[b]
        return spec.alias_of if spec.alias_of is not None else b

    def _allocate(self, shape: Any, dtype: Any, stream: Any = 0) -> Any:
        array = cuda.device_array(shape, dtype, stream=stream)
        self.allocations += 1
        self.allocated_bytes += array.nbytes
        return array

    def _buffers(self, feeds: Mapping[str, Any]) -> list[Any]:
        """This call's flat device array of every buffer."""
        buffers = list(self.fixed)
        storages = {s: self._allocate(max(self.arena_sizes[s], 1), np.uint8)
                    for s in self.per_call_storage}
        for b, spec in enumerate(self.program.buffers):
            if spec.role == "feed":
                buffers[b] = flat(feeds[spec.feed_name])
            elif spec.role == "temp" and buffers[b] is None:
                buffers[b] = (storages[spec.storage][: spec.nbytes].view(spec.dtype) if self._in_arena(b)
                              else self._allocate(spec.size, spec.dtype))
        for b, spec in enumerate(self.program.buffers):
            if spec.role == "alias":
                buffers[b] = buffers[spec.alias_of]
        return buffers

    def run(self, feeds: Mapping[str, Any], to_host: bool = False, stream: Any = 0) -> list[Any]:
        """Run every step on device `feeds` (by name); the outputs, shaped, on the device or
        the host.

        Holds `lock` throughout: the steps write the executable's own buffers."""
        with self.lock:
            return self._run(feeds, to_host, stream)

    def _run(self, feeds: Mapping[str, Any], to_host: bool, stream: Any) -> list[Any]:
        if self.capture is not None:
            return self._run_graphs(feeds, to_host, stream)
        buffers = self._buffers(feeds)
        for s, launch in enumerate(self.launches):
            launch(buffers, stream)
            if self.debug:
                self._check(launch, buffers, s)
        return self._results(buffers, feeds, to_host, stream, owned=False)

    def _results(self, buffers: list[Any], feeds: Mapping[str, Any], to_host: bool, stream: Any,
                 owned: bool) -> list[Any]:
        """The outputs, shaped; with `owned` (graphs: every buffer is the executable's for
        good), each copied out of its buffer, so the next call cannot overwrite it."""
        results = []
        for k, b in enumerate(self.program.outputs):
            spec = self.program.buffers[b]
            if k in self.program.in_place:
                value = feeds[spec.feed_name]
                results.append(value.copy_to_host() if to_host else value)
                continue
            value = view(buffers[b], spec.shape)
            if not to_host and (owned or self.program.buffers[self._root(b)].role in ("const", "feed")):
                value = self._fresh_copy(value, stream)  # never hand out our constant or the caller's feed
            results.append(value.copy_to_host() if to_host else value)
        return results

    # -- CUDA graphs (`cuda_graphs`) ---------------------------------------------------------------

    def _run_graphs(self, feeds: Mapping[str, Any], to_host: bool, stream: Any) -> list[Any]:
        buffers = self._graph_buffers(feeds, stream)
        key = tuple(device_address(buffers[b]) for b in self.written_feeds)
        ran = False
        if not self._warm:  # compiles, loads and pre-binds every launch: never inside a capture
            self._launch_all(self.launches, buffers, stream)
            self._warm = ran = True
        if key != self._graph_key:
            self._capture_graphs(buffers, key)
        if not ran:
            if self._graphs is None:  # the capture failed: eagerly, on the same buffers
                self._launch_all(self.launches, buffers, stream)
            else:
                for graph, (_, part) in zip(self._graphs, self.segments):
                    if graph is not None:
                        self.capture.launch(graph, stream)
                    else:
                        self._launch_all(part, buffers, stream)
        results = self._results(buffers, feeds, to_host, stream, owned=True)
        if self._graphs is None:
            self.capture = None  # later calls: the eager path
        return results

    @staticmethod
    def _launch_all(part: list, buffers: list[Any], stream: Any) -> None:
        for launch in part:
            launch(buffers, stream)

    def _graph_buffers(self, feeds: Mapping[str, Any], stream: Any) -> list[Any]:
        """Every buffer at its fixed address: the executable's own, allocated at the first call
        (the outputs' storages and a buffer per feed that no step writes, into which this call's
        feed is copied), and the caller's arrays of the feeds the step writes in place."""
        program = self.program
        if self._owned is None:
            owned = list(self.fixed)
            storages = {s: self._allocate(max(self.arena_sizes[s], 1), np.uint8) for s in self.per_call_storage}
            for b, spec in enumerate(program.buffers):
                if spec.role == "feed" and b not in self.written_feeds:
                    owned[b] = self._allocate(spec.size, spec.dtype)
                elif spec.role == "temp" and owned[b] is None:
                    owned[b] = (storages[spec.storage][: spec.nbytes].view(spec.dtype) if self._in_arena(b)
                                else self._allocate(spec.size, spec.dtype))
            self._owned = owned
        buffers = list(self._owned)
        for b, spec in enumerate(program.buffers):
            if spec.role != "feed":
                continue
            if b in self.written_feeds:
                buffers[b] = flat(feeds[spec.feed_name])
            elif spec.size:
                buffers[b].copy_to_device(flat(feeds[spec.feed_name]), stream=stream)
        for b, spec in enumerate(program.buffers):
            if spec.role == "alias":
                buffers[b] = buffers[spec.alias_of]
        return buffers

    def _capture_graphs(self, buffers: list[Any], key: tuple) -> None:
        """One graph per capturable segment, over `buffers`; on failure, none (and a warning)."""
        graphs = []
        try:
            for capturable, part in self.segments:
                graphs.append(self.capture.capture(functools.partial(self._launch_all, part, buffers))
                              if capturable else None)
        except Exception as err:  # noqa: BLE001 - any refusal of the capture: run eagerly, say why
            self._graphs, self._graph_key = None, None
            self.graph_status = f"off (the capture failed: {type(err).__name__}: {err})"
            warnings.warn(f"GRADCOMPILER_CUDA_GRAPHS: this step runs without CUDA graphs, {self.graph_status}",
                          RuntimeWarning, stacklevel=5)
            return
        self._graphs, self._graph_key = graphs, key
        self.captures += 1

    def _fresh_copy(self, value: Any, stream: Any) -> Any:
        fresh = self._allocate(value.shape, value.dtype, stream)
        copy(value, fresh, self.config, stream)
        return fresh

    def _check(self, launch, buffers: list[Any], s: int) -> None:
        step = launch.step
        for b in step.outputs:
            host = buffers[b].copy_to_host()
            if host.dtype.kind == "f" and not np.isfinite(host).all():
                bad = int(np.count_nonzero(~np.isfinite(host)))
                raise NonFiniteError(f"{bad} non-finite value(s) after {self.step_labels[s]}")


@dataclass
class CudaBuild:
    runner: CudaRunner
    step_kernels: list[CompiledCudaKernel]  # one per KernelStep, in program order
    distinct: list[CompiledCudaKernel] = field(default_factory=list)

    def sources(self) -> str:
        return "\n".join(f"# ---- {k.module}\n{k.source.source}" for k in self.distinct)


def build(program: Program, options: CudaBuildOptions) -> CudaBuild:
    """Generate and load every kernel of `program`, bind library launchers, allocate buffers."""
    config = options.config or default_config()
    launches, step_kernels = [], []
    for step in program.steps:
        if isinstance(step, KernelStep):
            compiled = compile_kernel(step.kernel, config)
            step_kernels.append(compiled)
            launches.append(_KernelLaunch(step, compiled, config, prebind=False if options.debug else None))
        else:
            launches.append(_LibraryLaunch(step, program, config))
    distinct = list({id(k): k for k in step_kernels}.values())
    capture = None if options.debug else graph_capture(options.cuda_graphs)
    return CudaBuild(CudaRunner(program, launches, options, config, capture), step_kernels, distinct)


def device_feeds(placeholders: Sequence[Node], feeds: Mapping[str, Any],
                 ignorable: Collection[str] = ()) -> dict[str, Any]:
    """Feeds checked like `validate_feeds` and put on the device: numpy arrays copied once,
    device arrays (Numba's, or any `__cuda_array_interface__`) used in place."""
    expected = {n.op.feed_name: n for n in placeholders}
    on_device = {name for name, value in feeds.items() if is_device_array(value)}
    missing = sorted(set(expected) - set(feeds))
    if missing:
        raise FeedError(f"missing feed(s) {missing}; this program needs {sorted(expected)}")
    host = validate_feeds([n for name, n in expected.items() if name not in on_device],
                          {k: v for k, v in feeds.items() if k not in on_device}, ignorable=set(ignorable) | on_device)
    result = {name: to_device(array) for name, array in host.items()}
    for name in on_device:
        if name not in expected:
            if name in ignorable:
                continue
            raise FeedError(f"unexpected feed(s) {[name]}; this program takes {sorted(expected)}")
        value = to_device(feeds[name], what=f"feed '{name}'")
        want = expected[name].type
        if np.dtype(value.dtype) != want.dtype:
            raise FeedError(f"feed '{name}' has dtype {np.dtype(value.dtype).name}, expected {want.dtype.name}")
        if tuple(value.shape) != want.shape:
            raise FeedError(f"feed '{name}' has shape {tuple(value.shape)}, expected {want.shape}")
        result[name] = value
    return result
