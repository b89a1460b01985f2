"""`gc.compile`: passes, lowering and code generation, and the `Executable` it returns.

    step = gc.compile(outputs, target="cpu")
    values = step(**feeds)            # fresh arrays (or step(feeds), as gc.evaluate takes them)
    step(out=[...], **feeds)          # written into the caller's arrays
    print(step.report()); step.source(); step.to_dot("step.dot")

The pipeline (`gradcompiler.passes.pipeline.optimize`, ending with `fuse` and `memory`)
runs on a copy of the graph; `gradcompiler.passes.lower` turns the optimised graph and its
fusion plan into a Kernel IR program; the backend generates, caches and
compiles it. The Executable keeps every stage for inspection: `.graph`
(optimised), `.plan` (fusion), `.context` (pass stats, memory plan),
`.program` (Kernel IR), `.kernels` (one `KernelInfo` per step).

An Executable owns its buffers, so one instance must not be called from two
threads at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from gradcompiler.passes.lower import lower
from gradcompiler.passes.pipeline import FUSE, MEMORY, debug_from_env, optimize, run_pass

from .backends import require_target
from .dot import to_dot
from .errors import DTypeError, FeedError, GraphError, NonFiniteError
from .feeds import validate_feeds
from .frontend.tensor import Tensor
from .ir import Graph, Node, call_site
from .kernel import KernelStep, LibraryStep, Program
from .ops.conv import Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter
from .ops.linalg import BatchedMatrixMul, MatrixMul
from .ops.source import Placeholder
from .reference import first_non_finite
from .report import format_report


@dataclass
class KernelInfo:
    """One step of the program, as the report shows it."""

    name: str
    kind: str  # loop | library
    space: tuple[int, ...]  # iteration domain (loop) or output shape (library)
    ops: list[str]  # the fused ops, in order
    bytes_moved: int
    flops: int
    module: str = ""  # generated module of a loop kernel (shared by equal kernels)
    parallel: bool = False
    compile_seconds: float = 0.0
    from_cache: bool = False


def _describe(node: Node) -> str:
    name = f" '{node.name}'" if node.name else ""
    return f"%{node.id}{name} {node.op.label} at {node.site}"


def _forward_label(graph: Graph, node: Node) -> str:
    """The user's op behind `node`: itself, or for a backward node the forward op it differentiates."""
    origin = graph[node.origin] if node.origin is not None and node.origin in graph else None
    return _describe(origin) + " (backward)" if origin is not None and node.role == "backward" else _describe(node)


def _step_nodes(step) -> tuple[int, ...]:
    return step.nodes if isinstance(step, KernelStep) else (step.node,)


def _step_label(graph: Graph, step) -> str:
    """Kernel name and the forward op each output comes from (for NonFiniteError)."""
    forward = [_forward_label(graph, graph[n]) for n in _step_nodes(step)]
    return f"kernel {step.name}, computing {'; '.join(dict.fromkeys(forward[-3:]))}"


def _check_dtypes(graph: Graph, target: str) -> None:
    """Numba has no float16 arithmetic on the CPU: refuse it here, naming the user's op,
    rather than fail inside Numba's type inference."""
    if target != "cpu":
        return
    half = next((n for n in graph.nodes.values() if n.type.dtype == np.float16), None)
    if half is not None:
        raise DTypeError(f"the cpu target cannot compute float16 ({_describe(half)}); cast to float32, "
                         "or compile for target='cuda'", op=half.op.label, site=half.site)


def _library_flops(graph: Graph, step: LibraryStep) -> int:
    op, out = step.op, graph[step.node].type
    if isinstance(op, (MatrixMul, BatchedMatrixMul)):
        a = graph[graph[step.node].inputs[0]].type
        k = a.shape[-2] if op.transpose_a else a.shape[-1]
        return 2 * out.size * k
    if isinstance(op, (Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter)):
        inputs = [graph[i].type for i in graph[step.node].inputs]
        g = op.geometry_of(*inputs)  # each of the three is one multiply-add per filter tap
        return 2 * g.n * g.o * g.out[0] * g.out[1] * g.c_per_group * g.kernel[0] * g.kernel[1]
    return 0


def _kernel_infos(graph: Graph, program: Program, compiled) -> list[KernelInfo]:
    infos, compiled_at = [], iter(compiled)
    for step in program.steps:
        if isinstance(step, KernelStep):
            c = next(compiled_at)
            infos.append(KernelInfo(step.name, "loop", step.kernel.domain,
                                    [graph[n].op.label for n in step.nodes], step.kernel.bytes_moved(),
                                    step.kernel.flops(), c.module, c.source.parallel, c.compile_seconds,
                                    c.from_cache))
        else:
            buffers = [program.buffers[b] for b in (*step.inputs, step.output)]
            infos.append(KernelInfo(step.name, "library", graph[step.node].type.shape, [step.op.label],
                                    sum(b.nbytes for b in buffers), _library_flops(graph, step)))
    return infos


def _ensure_planned(graph: Graph, ctx) -> None:
    """Run fuse and memory if the chosen passes left no plan, or a memory plan of another grouping.

    Code is generated from fusion groups only, so a `passes=` list without fuse
    is still fused (after its own passes), and its memory plan made again.
    """
    if ctx.fusion is None:
        run_pass(FUSE, graph, ctx)
    if ctx.memory is None or ctx.memory.order != ctx.fusion.groups:
        run_pass(MEMORY, graph, ctx)


class Executable:
    """A compiled step: call it with feeds by name (module docstring)."""

    def __init__(self, graph: Graph, source_graph: Graph, context, program: Program, build_result,
                 single: bool, timings: dict[str, float]):
        self.graph = graph
        self.context = context
        self.plan = context.fusion
        self.memory = context.memory
        self.program = program
        self.kernels = _kernel_infos(graph, program, build_result.step_kernels)
        self.timings = timings
        self._build = build_result
        self._runner = build_result.runner
        self._single = single
        self._placeholders = [n for n in graph.nodes.values() if isinstance(n.op, Placeholder)]
        self._feed_names = set(source_graph.feed_names)

    def __call__(self, feeds: Mapping[str, Any] | None = None, /, *,
                 out: Sequence[np.ndarray] | np.ndarray | None = None, **named: Any):
        """Run one step on `feeds` (a dict, as `gc.evaluate` takes it, and/or keywords)."""
        feeds = _merged_feeds(feeds, named)
        arrays = validate_feeds(self._placeholders, feeds, ignorable=self._feed_names)
        targets = None if out is None else self._checked_out(out, arrays)
        try:
            results = self._runner.run(arrays, targets)
        except NonFiniteError as err:
            raise self._located(err, arrays) from None
        return results[0] if self._single else results

    def _checked_out(self, out, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        targets = [out] if isinstance(out, np.ndarray) else list(out)
        types = [self.program.buffers[b] for b in self.program.outputs]
        if len(targets) != len(types):
            raise FeedError(f"out= has {len(targets)} array(s), this step has {len(types)} output(s)")
        for k, (target, want) in enumerate(zip(targets, types)):
            if not isinstance(target, np.ndarray) or target.shape != tuple(want.shape) or target.dtype != want.dtype:
                got = f"{target.dtype.name}{list(target.shape)}" if isinstance(target, np.ndarray) else type(target).__name__
                raise FeedError(f"out[{k}] is {got}, expected {np.dtype(want.dtype).name}{list(want.shape)}")
            if not target.flags.writeable:
                raise FeedError(f"out[{k}] is read-only")
            for name, feed in feeds.items():
                if np.may_share_memory(target, feed):
                    raise FeedError(f"out[{k}] overlaps the feed '{name}'; results cannot be written over inputs")
        return targets

    def _located(self, err: NonFiniteError, feeds: dict[str, np.ndarray]) -> NonFiniteError:
        """`err` (debug mode) naming the op where the reference sees the first NaN or Inf born:
        a fused kernel's output alone cannot tell which of its ops made it."""
        rank = {n: i for i, n in enumerate(self.graph.topo_order())}
        order = [n for step in self.program.steps for n in sorted(_step_nodes(step), key=rank.__getitem__)]
        node = first_non_finite(self.graph, order, {k: v for k, v in feeds.items() if k in self.graph.feed_names})
        if node is None:
            return err
        return NonFiniteError(f"{err}; the first non-finite value comes from {_forward_label(self.graph, node)}")

    def source(self) -> str:
        """Every generated module of this executable: the distinct kernels, then the driver."""
        return self._build.sources()

    def to_dot(self, path: str | Path | None = None, stage: str = "optimised") -> str:
        """The DOT text of this step's graph at `stage`; with `path`, also written (or rendered
        by its suffix). `gradcompiler.dot.to_dot` says what each stage draws."""
        return to_dot(self, path, stage=stage)

    def report(self) -> str:
        """What the compiler did: passes, kernels, captures, memory, compile times, cache
        (`gradcompiler.report.format_report`)."""
        return format_report(self)


class DeviceExecutable(Executable):
    """A step compiled for `target="cuda"`: its buffers stay on the GPU between calls.

    Feeds may be numpy arrays (copied to the device once) or device arrays
    (Numba's, or any object with `__cuda_array_interface__`; used without a
    copy). Outputs are device arrays, or numpy arrays with `to_host=True`.
    """

    def __call__(self, feeds: Mapping[str, Any] | None = None, /, *, to_host: bool = False,
                 **named: Any):
        from .backends.numba_cuda.executable import device_feeds

        feeds = _merged_feeds(feeds, named)
        on_device = device_feeds(self._placeholders, feeds, ignorable=self._feed_names)
        try:
            results = self._runner.run(on_device, to_host=to_host)
        except NonFiniteError as err:
            raise self._located(err, {k: v.copy_to_host() for k, v in on_device.items()}) from None
        return results[0] if self._single else results


def _merged_feeds(feeds: Mapping[str, Any] | None, named: Mapping[str, Any]) -> dict[str, Any]:
    """A step's feeds given as a dict, as keywords, or both (as `gc.evaluate` takes them)."""
    if feeds is not None and not isinstance(feeds, Mapping):
        raise FeedError(f"feeds must be a dict of name -> array, got a {type(feeds).__name__}; "
                        "an output array goes in out=")
    return {**(feeds or {}), **named}


def cache_info() -> dict:
    """Counters of the kernel cache in this process (module and Numba hits, compiles) and its directory."""
    from .backends.numba_cpu.cache import cache_info as info

    return info()


def clear_cache() -> None:
    """Delete the on-disk kernel cache (`GRADCOMPILER_CACHE_DIR`) and reset its counters."""
    from .backends.numba_cpu.cache import clear_cache as clear

    clear()


def compile(outputs, target: str = "cpu", passes=None, extra_passes=(), debug: bool = False,
            fastmath: bool | Sequence[str] = False) -> Executable:  # noqa: A001 - the natural name
    """Compile Tensor `outputs` (one, or a list) into an Executable for `target`.

    `passes` replaces the default pipeline (`gradcompiler.passes.pipeline.DEFAULT_PIPELINE`;
    a list without fuse is fused and memory-planned after its own passes, as
    code is generated from fusion groups only), `extra_passes` run before
    fuse; `debug=True` verifies the graph after every pass and
    checks every kernel's outputs for NaN/Inf (NonFiniteError naming the
    kernel and the forward op). `fastmath`: False (default: fused
    multiply-add and reassociation, which change rounding but not special
    values), True (every LLVM fast-math flag but nnan/ninf), or a set of
    LLVM flag names.
    """
    require_target(target)
    debug = debug or debug_from_env()
    single = isinstance(outputs, Tensor)
    tensors = [outputs] if single else list(outputs)
    if not tensors or not all(isinstance(t, Tensor) for t in tensors):
        raise GraphError("compile: outputs must be a Tensor or a non-empty list of Tensors", site=call_site())
    graphs = {id(t.graph): t.graph for t in tensors}
    if len(graphs) != 1:
        raise GraphError("compile: all outputs must come from one graph", site=call_site())
    source_graph = tensors[0].graph
    keyword = "to_host" if target == "cuda" else "out"  # the executable's own call keyword
    if keyword in source_graph.feed_names:
        raise GraphError(f"compile: an input is named '{keyword}', which is the keyword of the compiled "
                         f"step's own call ({keyword}=...); rename that input", site=call_site())
    timings = {}
    start = time.perf_counter()
    graph, ctx = optimize(source_graph, [t.id for t in tensors], passes=passes,
                          extra_passes=extra_passes, debug=debug)
    _ensure_planned(graph, ctx)
    _check_dtypes(graph, target)
    timings["passes"] = time.perf_counter() - start
    start = time.perf_counter()
    program = lower(graph, ctx.fusion, ctx.memory)
    timings["lowering"] = time.perf_counter() - start
    start = time.perf_counter()
    labels = [_step_label(graph, step) for step in program.steps]
    if target == "cuda":
        from .backends.numba_cuda.executable import CudaBuildOptions, build as build_cuda

        result = build_cuda(program, CudaBuildOptions(debug=debug, step_labels=labels,
                                                      arena_sizes=ctx.memory.buffer_sizes if ctx.memory else None))
        timings["codegen+numba"] = time.perf_counter() - start
        return DeviceExecutable(graph, source_graph, ctx, program, result, single, timings)
    from .backends import numba_cpu  # imports Numba: only when compiling

    options = numba_cpu.BuildOptions(fastmath=numba_cpu.fastmath_flags(fastmath), debug=debug,
                                     parallel_min_points=numba_cpu.PARALLEL_MIN_POINTS,
                                     arena_sizes=ctx.memory.buffer_sizes if ctx.memory else None,
                                     step_labels=labels)
    result = numba_cpu.build(program, options)
    timings["codegen+numba"] = time.perf_counter() - start
    return Executable(graph, source_graph, ctx, program, result, single, timings)
