"""`gc.compile`: passes, lowering and code generation, and the `Executable` it returns.

    step = gc.compile(outputs, target="cpu")
    values = step(**feeds)            # fresh arrays (or step(feeds), as gc.evaluate takes them)
    step(out=[...], **feeds)          # written into the caller's arrays
    gc.compile([loss, w_new], donate={1: "w"})   # w_new written over the caller's array `w`
    print(step.report()); step.source(); step.to_dot("step.dot")

The pipeline (`gradcompiler.passes.pipeline.optimize`, ending with `fuse` and `memory`)
runs on a copy of the graph; `gradcompiler.passes.lower` turns the optimised graph and its
fusion plan into a Kernel IR program; the backend generates, caches and
compiles it. The Executable keeps every stage for inspection: `.graph`
(optimised), `.plan` (fusion), `.context` (pass stats, memory plan),
`.program` (Kernel IR), `.kernels` (one `KernelInfo` per step).

An Executable owns its buffers, so calls to one instance from several threads
are serialised by a lock of its own (`numba_cpu.runtime`, `numba_cuda.executable`):
each result is right, and threads that want to run at the same time compile
an executable each.

Donation (`donate={output index: feed name}`) is how a training step updates its
state in place: the memory plan writes that output over the feed's buffer where
no kernel still needs the old value (`gradcompiler.passes.donation`), and the caller's
feed array is the output. Where it cannot, the output is computed apart and
copied into the feed's array after the step, with the same result for the caller;
`donated_in_place` says which outputs were written in place. A donated feed must
be the caller's own writeable, C-contiguous array of the feed's dtype (on CUDA a
device array), since it is written.

An Executable pickles as what it was compiled from, the source graph, its
output ids and the options of `gc.compile`, and unpickling compiles it again:
buffers and generated code belong to one process, and a process on the same
machine finds every kernel in the on-disk cache, so it invokes no Numba
compiler. A custom gradient's backward (a Python callable, perhaps a lambda)
stays behind: `gc.grad` has already built it into ordinary nodes, and
`optimize` drops the composite's node before any pass, so compiling needs only
the nodes. This is how a step reaches another process (`gradcompiler.distributed`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gradcompiler.passes.lower import lower
from gradcompiler.passes.pipeline import FUSE, MEMORY, debug_from_env, optimize, run_pass

from .backends import require_target
from .dot import to_dot
from .errors import DTypeError, FeedError, GraphError, MemoryPlanError, NonFiniteError
from .feeds import validate_feeds
from .frontend.tensor import Tensor
from .heap import collector_paused
from .ir import Graph, Node, call_site
from .kernel import KernelStep, LibraryStep, Program
from .ops.conv import Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter
from .ops.custom import CustomGradient
from .ops.linalg import BatchedMatrixMul, MatrixMul
from .ops.source import Placeholder
from .reference import first_non_finite
from .report import format_report
from .units import format_bytes


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


def _step_label(graph: Graph, step) -> str:
    """Kernel name and the forward op each output comes from (for NonFiniteError)."""
    forward = [_forward_label(graph, graph[n]) for n in step.nodes]
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


def _memory_limit(target: str) -> int:
    """Bytes a step's buffers may take on `target`: the machine's physical memory (cpu) or
    the device's (cuda); 2**63 (what an index can address) where it cannot be read."""
    try:
        if target == "cuda":
            from numba import cuda

            return int(cuda.current_context().get_memory_info()[1])
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except Exception:  # noqa: BLE001 - no figure to read: only the addressable limit applies
        return 2**63


def _planned_bytes(program: Program, arena_sizes) -> int:
    """Bytes the executable allocates: the plan's arenas, and temps and constants outside them."""
    outside = [spec.nbytes for spec in program.buffers if spec.role == "const"
               or (spec.role == "temp" and (spec.storage is None or not arena_sizes))]
    return sum(arena_sizes or ()) + sum(outside)


def _check_memory(graph: Graph, program: Program, arena_sizes, target: str,
                  limit: int | None = None) -> None:
    """Refuse, before anything is allocated, a step whose buffers cannot exist, naming the
    largest value (its op, the user's line, shape and bytes): numpy's own MemoryError for a
    plan of terabytes names nothing the user wrote, and a shape of 2**40 × 2**40 elements
    overflows every int64 size and index."""
    limit = _memory_limit(target) if limit is None else limit
    total = _planned_bytes(program, arena_sizes)
    if total <= limit:
        return
    raise _memory_error(graph, program, f"needs {format_bytes(total)} ({total} bytes), more than "
                        f"the {format_bytes(limit)} of memory of target '{target}'")


def _memory_error(graph: Graph, program: Program, what: str) -> MemoryPlanError:
    spec = max((b for b in program.buffers if b.role in ("temp", "const") and b.node is not None),
               key=lambda b: b.nbytes)
    node = graph[spec.node]
    return MemoryPlanError(f"the compiled step {what}; its largest value is "
                           f"{_forward_label(graph, node)}: shape {tuple(spec.shape)} "
                           f"{np.dtype(spec.dtype).name}, {format_bytes(spec.nbytes)} "
                           f"({spec.nbytes} bytes)", op=node.op.label, site=node.site)


def _library_flops(graph: Graph, step: LibraryStep) -> int:
    op, node = step.op, graph[step.nodes[0]]
    out = node.type
    if isinstance(op, (MatrixMul, BatchedMatrixMul)):
        a = graph[node.inputs[0]].type
        k = a.shape[-2] if op.transpose_a else a.shape[-1]
        return 2 * out.size * k
    if isinstance(op, (Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter)):
        inputs = [graph[i].type for i in node.inputs]
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
            buffers = [program.buffers[b] for b in (*step.inputs, *step.outputs)]
            infos.append(KernelInfo(step.name, "library", graph[step.nodes[0]].type.shape, [step.op.label],
                                    sum(b.nbytes for b in buffers), _library_flops(graph, step)))
    return infos


PROFILE_THRESHOLD_S = 3.0
"""With GRADCOMPILER_PROFILE_PASSES=1, a compile slower than this names its slowest pass."""


def profile_note(ctx, timings: dict[str, float]) -> str:
    """One line saying where a compile's time went: the total, the slowest pass, the stages."""
    total = sum(timings.values())
    seconds: dict[str, float] = {}
    for s in ctx.stats:
        seconds[s.name] = seconds.get(s.name, 0.0) + s.seconds
    slowest = max(seconds, key=seconds.__getitem__)
    stages = ", ".join(f"{name} {t:.2f} s" for name, t in timings.items())
    return (f"gradcompiler: compile took {total:.2f} s; slowest pass: {slowest} "
            f"({seconds[slowest]:.2f} s, work {ctx.work.total()}); {stages}")


def _maybe_profile(ctx, timings: dict[str, float]) -> None:
    """Print `profile_note` to stderr when GRADCOMPILER_PROFILE_PASSES is set and the compile
    took over PROFILE_THRESHOLD_S, so that a user can see where a slow compile spends it."""
    if os.environ.get("GRADCOMPILER_PROFILE_PASSES", "") in ("", "0"):
        return
    if sum(timings.values()) > PROFILE_THRESHOLD_S:
        print(profile_note(ctx, timings), file=sys.stderr)


def _ensure_planned(graph: Graph, ctx) -> None:
    """Run fuse and memory if the chosen passes left no plan, or a memory plan of another grouping.

    Code is generated from fusion groups only, so a `passes=` list without fuse
    is still fused (after its own passes), and its memory plan made again.
    """
    if ctx.fusion is None:
        run_pass(FUSE, graph, ctx)
    if ctx.memory is None or ctx.memory.order != ctx.fusion.groups:
        run_pass(MEMORY, graph, ctx)


@dataclass(frozen=True)
class _Recipe:
    """What an Executable is compiled from: how it pickles (module docstring)."""

    graph: Graph
    outputs: tuple[int, ...]
    single: bool
    options: dict[str, Any]

    def compile(self) -> Executable:
        tensors = [Tensor(self.graph, i) for i in self.outputs]
        return compile(tensors[0] if self.single else tensors, **self.options)


def _backward_left_behind(*_args):
    raise GraphError("this graph was unpickled from a compiled step, whose custom gradients' "
                     "backward functions stay behind; differentiate the original graph")


def _portable(graph: Graph) -> Graph:
    """A copy of `graph` to pickle: each custom gradient's callable that pickle cannot name (a
    lambda, a closure) replaced by a module-level stand-in, so that plain `pickle` takes the
    graph even where the backward is a lambda. A module-level backward (batch_norm's) stays."""
    clone = graph.copy()
    for node in graph.nodes.values():
        if isinstance(node.op, CustomGradient) and not _named_function(node.op.backward):
            op = dataclasses.replace(node.op, backward=_backward_left_behind)
            clone.nodes[node.id] = dataclasses.replace(node, op=op)
    return clone


def _named_function(function) -> bool:
    """Whether pickle stores `function` by reference: its module's attribute of its name is it."""
    module = sys.modules.get(getattr(function, "__module__", None) or "")
    found = module
    for part in getattr(function, "__qualname__", "<").split("."):
        found = getattr(found, part, None)
    return module is not None and found is function


def _compiled(recipe: _Recipe) -> Executable:
    return recipe.compile()


class Executable:
    """A compiled step: call it with feeds by name (module docstring)."""

    recipe: _Recipe

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
        self.donate = dict(context.donations)
        self.donated_in_place = frozenset(program.in_place)

    def __reduce__(self):
        recipe = dataclasses.replace(self.recipe, graph=_portable(self.recipe.graph))
        return _compiled, (recipe,)

    @property
    def allocations(self) -> tuple[int, int]:
        """(arrays, bytes) the calls so far have allocated: the buffers allocated once, when
        the step was built, are not counted."""
        return self._runner.allocations, self._runner.allocated_bytes

    def __call__(self, feeds: Mapping[str, Any] | None = None, /, *,
                 out: Sequence[np.ndarray] | np.ndarray | None = None, **named: Any):
        """Run one step on `feeds` (a dict, as `gc.evaluate` takes it, and/or keywords)."""
        feeds = _merged_feeds(feeds, named)
        arrays = validate_feeds(self._placeholders, feeds, ignorable=self._feed_names)
        self._check_donated(feeds, arrays)
        targets = None if out is None else self._checked_out(out, arrays)
        try:
            results = self._runner.run(arrays, targets)
        except NonFiniteError as err:
            raise self._located(err, arrays) from None
        return self._finish(results, feeds)

    def _check_donated(self, feeds: Mapping[str, Any], arrays: Mapping[str, Any]) -> None:
        """A donated feed is written: it must be the caller's array, used without a copy."""
        for name in self.donate.values():
            given = feeds.get(name)
            if not isinstance(given, np.ndarray) or arrays.get(name, given) is not given \
                    or not given.flags.writeable:
                raise FeedError(f"feed '{name}' is updated in place by this step, so it must be a "
                                "writeable, C-contiguous numpy array of its exact dtype and shape")

    def _finish(self, results: list, feeds: Mapping[str, Any]):
        """Donated outputs that could not be planned in place, copied into their feeds."""
        for k, name in self.donate.items():
            if k not in self.donated_in_place:
                self._copy_into(feeds[name], results[k])
                results[k] = feeds[name]
        return results[0] if self._single else results

    @staticmethod
    def _copy_into(target, value) -> None:
        np.copyto(target, value)

    def _checked_out(self, out, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        targets = [out] if isinstance(out, np.ndarray) else list(out)
        types = [self.program.buffers[b] for b in self.program.outputs]
        if len(targets) != len(types):
            raise FeedError(f"out= has {len(targets)} array(s), this step has {len(types)} output(s)")
        for k, (target, want) in enumerate(zip(targets, types)):
            if not isinstance(target, np.ndarray) or target.shape != tuple(want.shape) or target.dtype != want.dtype:
                got = (f"{target.dtype.name}{list(target.shape)}" if isinstance(target, np.ndarray)
                       else type(target).__name__)
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
        order = [n for step in self.program.steps for n in sorted(step.nodes, key=rank.__getitem__)]
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
        self._check_donated(feeds, on_device)
        try:
            results = self._runner.run(on_device, to_host=to_host)
        except NonFiniteError as err:
            raise self._located(err, {k: v.copy_to_host() for k, v in on_device.items()}) from None
        if to_host:
            return results[0] if self._single else results
        return self._finish(results, feeds)

    def _check_donated(self, feeds: Mapping[str, Any], arrays: Mapping[str, Any]) -> None:
        from .backends.numba_cuda.device import is_device_array

        for name in self.donate.values():
            if name in feeds and not is_device_array(feeds[name]):
                raise FeedError(f"feed '{name}' is updated in place by this step, so on the cuda "
                                "target it must be a device array (cuda.to_device(...))")

    def _copy_into(self, target, value) -> None:
        from .backends.numba_cuda.device import copy

        copy(value, target, self._runner.config)


def _merged_feeds(feeds: Mapping[str, Any] | None, named: Mapping[str, Any]) -> dict[str, Any]:
    """A step's feeds given as a dict, as keywords, or both (as `gc.evaluate` takes them)."""
    if feeds is not None and not isinstance(feeds, Mapping):
        raise FeedError(f"feeds must be a dict of name -> array, got a {type(feeds).__name__}; "
                        "an output array goes in out=")
    return {**(feeds or {}), **named}


def _allocating(graph: Graph, program: Program, build):
    """`build()`, with a MemoryError of its allocations (memory the check could not foresee:
    other processes, limits of the process) told as `_memory_error`."""
    try:
        return build()
    except MemoryError as err:
        raise _memory_error(graph, program, f"cannot be allocated ({err})") from None


def _checked_donations(graph: Graph, outputs: Sequence[Tensor],
                       donate: Mapping[int, str]) -> dict[int, str]:
    """`donate` checked: each output index exists, each feed is a feed of the graph of that
    output's type, and no feed takes two outputs."""
    if len(set(donate.values())) != len(donate):
        raise GraphError("compile: donate= gives one feed to two outputs", site=call_site())
    for k, name in donate.items():
        if not isinstance(k, int) or not 0 <= k < len(outputs):
            raise GraphError(f"compile: donate= names output {k!r}, but there are "
                             f"{len(outputs)} outputs", site=call_site())
        if name not in graph.feed_names:
            raise GraphError(f"compile: donate= names '{name}', which is not a feed of graph "
                             f"'{graph.name}'", site=call_site())
        feed = graph[graph.feed_names[name]]
        if feed.type != outputs[k].type:
            raise GraphError(f"compile: output {k} is {outputs[k].type} but the feed '{name}' it "
                             f"is donated to is {feed.type}", site=call_site())
    return dict(donate)


def cache_info() -> dict:
    """Counters of the kernel cache in this process (module and Numba hits, compiles), its
    directory, and what that holds (module and compiled-kernel files, all files, bytes)."""
    from .backends.numba_cpu.cache import cache_info as info

    return info()


def clear_cache() -> None:
    """Delete the on-disk kernel cache (`GRADCOMPILER_CACHE_DIR`) and reset its counters."""
    from .backends.numba_cpu.cache import clear_cache as clear

    clear()


def compile(outputs, target: str = "cpu", passes=None, extra_passes=(), debug: bool = False,
            fastmath: bool | Sequence[str] = False,
            donate: Mapping[int, str] | None = None,
            memory_budget: float | int | None = None,
            ) -> Executable:  # noqa: A001 - the natural name
    """Compile Tensor `outputs` (one, or a list) into an Executable for `target`.

    `passes` replaces the default pipeline (`gradcompiler.passes.pipeline.DEFAULT_PIPELINE`;
    a list without fuse is fused and memory-planned after its own passes, as
    code is generated from fusion groups only), `extra_passes` run before
    fuse; `debug=True` verifies the graph after every pass and
    checks every kernel's outputs for NaN/Inf (NonFiniteError naming the
    kernel and the forward op). `fastmath`: False (default: fused
    multiply-add and reassociation, which change rounding but not special
    values), True (every LLVM fast-math flag but nnan/ninf), or a set of
    LLVM flag names. `donate` maps an output's index to the name of a feed of its type
    that the output replaces: it is written over the caller's array (module docstring).
    `memory_budget` (bytes as an int, or a fraction in (0, 1] of the default plan's peak)
    makes the `remat` pass recompute forward values in the backward until the planned
    peak fits (`gradcompiler.passes.remat`); `MemoryBudgetError` if no plan does.
    """
    with collector_paused():  # why: gradcompiler/heap.py
        return _compile(outputs, target, passes, extra_passes, debug, fastmath, donate,
                        memory_budget)


def _compile(outputs, target: str, passes, extra_passes, debug: bool,
             fastmath: bool | Sequence[str], donate: Mapping[int, str] | None,
             memory_budget: float | int | None) -> Executable:
    require_target(target)
    options = {"target": target, "passes": passes, "extra_passes": extra_passes, "debug": debug,
               "fastmath": fastmath, "donate": donate, "memory_budget": memory_budget}
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
    donations = _checked_donations(source_graph, tensors, donate or {})
    timings = {}
    start = time.perf_counter()
    graph, ctx = optimize(source_graph, [t.id for t in tensors], passes=passes,
                          extra_passes=extra_passes, debug=debug, donations=donations,
                          memory_budget=memory_budget, row_scatter_loops=target == "cpu")
    _ensure_planned(graph, ctx)
    _check_dtypes(graph, target)
    timings["passes"] = time.perf_counter() - start
    start = time.perf_counter()
    program = lower(graph, ctx.fusion, ctx.memory, absorb_gathers=target == "cpu")
    timings["lowering"] = time.perf_counter() - start
    arena_sizes = ctx.memory.buffer_sizes if ctx.memory else None
    _check_memory(graph, program, arena_sizes, target)
    start = time.perf_counter()
    labels = [_step_label(graph, step) for step in program.steps]
    if target == "cuda":
        from .backends.numba_cuda.executable import CudaBuildOptions
        from .backends.numba_cuda.executable import build as build_cuda

        result = _allocating(graph, program, lambda: build_cuda(
            program, CudaBuildOptions(debug=debug, step_labels=labels, arena_sizes=arena_sizes)))
        timings["codegen+numba"] = time.perf_counter() - start
        _maybe_profile(ctx, timings)
        executable = DeviceExecutable(graph, source_graph, ctx, program, result, single, timings)
    else:
        from .backends import numba_cpu  # imports Numba: only when compiling

        build_options = numba_cpu.BuildOptions(fastmath=numba_cpu.fastmath_flags(fastmath),
                                             debug=debug,
                                             parallel_min_points=numba_cpu.PARALLEL_MIN_POINTS,
                                             arena_sizes=arena_sizes, step_labels=labels)
        result = _allocating(graph, program, lambda: numba_cpu.build(program, build_options))
        timings["codegen+numba"] = time.perf_counter() - start
        _maybe_profile(ctx, timings)
        executable = Executable(graph, source_graph, ctx, program, result, single, timings)
    executable.recipe = _Recipe(source_graph, tuple(t.id for t in tensors), single, options)
    return executable
