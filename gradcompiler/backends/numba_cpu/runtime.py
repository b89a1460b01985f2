"""Running a compiled program: buffers allocated once, and one generated driver.

Per call, the only Python that runs is a generated function (`driver`)
that calls every kernel and library routine in order with its buffers
bound as local variables: no dictionary lookup, no loop over steps, no
allocation. Buffers are allocated once per executable: values that share
a buffer in the memory plan share one arena (as views of it); an alias is
the same flat array as the value it views; constants are copied in once;
per-thread scratch (partials, row buffers) belongs to each kernel step.
Every array allocated here (arenas, buffers, scratch, outputs) comes from
`buffers.empty`: it starts on a pair of cache lines, and in the bounds check
it is fenced by guard bytes that the driver checks after every step. Feeds
are the caller's arrays, reshaped flat (no copy) for the kernels.

Outputs are written straight into the arrays handed to the caller, never
copied out of internal buffers: the driver takes one flat array per output
buffer (`o0, o1, ...`) besides the feeds. Per call that array is the
caller's own (`out=`, when it is C-contiguous), else the array handed out
by the previous call if the caller has let go of it (its reference count
says so, so a loop of `step(**feeds)` allocates nothing), else a new one.
A value the memory plan placed in an output's storage before the output
(same dtype and size; `output_homes`) is written into that array too: the
zero fill that a scatter-add then updates in place (the embedding's dense
gradient) would otherwise sit in an internal buffer and be copied over.
An output held in memory only through a feed, a constant or another
output is copied instead, except a donated one (`Program.in_place`): it was
written over its feed's buffer, and the caller's feed array is the result.

`allocations` and `allocated_bytes` count the arrays a call allocates (new
output arrays, copies): a loop whose outputs are all reused or donated adds
nothing to them, which tests read instead of timing.

Calls are serialised by a lock per Runner: the buffers, scratch rows and
the arrays handed out last call are the executable's own, so two threads
running the driver at once would write into each other's intermediates.
A lock (rather than a buffer set per thread) keeps memory at one plan's
worth, costs well under a microsecond per call, and lets kernels that are
parallel use every core for one call at a time. Threads that want to run
concurrently compile one executable each.

The driver's source names only sanitised locals (`k3`, `b17`, `g2`); with
`debug=True` it also calls `check(array, k)` after each step, in the bounds
check `guard(k)`, and the description of step k (kernel name, forward op,
user's line) comes from a list, never from the source.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from ...errors import NonFiniteError, OutOfBoundsWriteError
from ...kernel import BufferSpec, KernelStep, LibraryStep, Program
from . import buffers
from .cache import load_module


@dataclass
class BoundKernel:
    """A compiled kernel and how many chunks (threads) it splits axis 0 into."""

    function: Callable
    scratch: tuple[tuple[np.dtype, int], ...]
    nchunks: int


_LARGEST_ITEM = 16
"""Bytes of the largest item a buffer holds (complex128): an arena's size and a buffer's start in
it are multiples of it, so every view is aligned for its dtype."""


def allocate(program: Program, arena_sizes: Sequence[int] | None,
             blocks: list[buffers.Block] | None = None) -> list[np.ndarray | None]:
    """Flat arrays for every non-feed buffer (None for feeds), in buffer order.

    In the bounds check (`buffers.checking()`) a buffer of an arena ends where its arena ends,
    so a write past it reaches the arena's guard bytes rather than the next value's bytes."""
    flush_right = buffers.checking()
    step = _LARGEST_ITEM if flush_right else 1
    arenas = [buffers.empty(-(-size // step) * step, np.uint8, blocks, f"arena {k}")
              for k, size in enumerate(arena_sizes or ())]
    arrays: list[np.ndarray | None] = []
    for b, spec in enumerate(program.buffers):
        if spec.role == "feed":
            arrays.append(None)
        elif spec.role == "const":
            arrays.append(np.array(spec.value, dtype=spec.dtype).reshape(-1))
        elif spec.role == "alias":
            arrays.append(arrays[spec.alias_of])
        elif spec.storage is not None and arena_sizes is not None:
            arena = arenas[spec.storage]
            start = (arena.size - spec.nbytes) // _LARGEST_ITEM * _LARGEST_ITEM if flush_right else 0
            arrays.append(arena[start:start + spec.nbytes].view(spec.dtype))
        else:
            label = f"buffer {b} ({spec.dtype} {tuple(spec.shape)})"
            arrays.append(buffers.empty(spec.size, spec.dtype, blocks, label))
    return arrays


def _root(program: Program, b: int) -> int:
    spec = program.buffers[b]
    return spec.alias_of if spec.alias_of is not None else b


def feed_buffers(program: Program) -> list[int]:
    return [b for b, spec in enumerate(program.buffers) if spec.role == "feed"]


def output_roots(program: Program) -> list[int]:
    """Buffers written straight into the caller's arrays: temp buffers holding an output.

    One per buffer, in first-output order; an output whose buffer is a feed or
    a constant is copied out instead.
    """
    roots = dict.fromkeys(_root(program, b) for b in program.outputs)
    return [r for r in roots if program.buffers[r].role == "temp"]


def output_homes(program: Program) -> dict[int, int]:
    """Temp buffers written into an output root's array: those sharing its storage, dtype and size.

    Buffers of one storage hold values whose lives do not overlap (or hand over in place),
    and an output lives to the end, so each of them is dead before the output is written: in
    the output's array it sits where the arena would have held it."""
    home_of = {(spec.storage, np.dtype(spec.dtype), spec.size): r for r in output_roots(program)
               if (spec := program.buffers[r]).storage is not None}
    return {b: r for b, spec in enumerate(program.buffers) if spec.role == "temp" and spec.storage is not None
            and (r := home_of.get((spec.storage, np.dtype(spec.dtype), spec.size), b)) != b}


DRIVER_PART_STEPS = 256
"""Steps per part of the driver (`driver_source`)."""


def driver_source(program: Program, kernels: Sequence[BoundKernel], debug: bool, guard: bool = False) -> str:
    """The driver module: `make(K, L, B, V, S, check, guard)` returns `step(*feeds, *outputs)`.

    The steps are split into parts of DRIVER_PART_STEPS, each a function made by its own
    `make_p<c>` that binds the kernels and buffers it uses as closure variables; `step`
    reshapes the feeds and calls the parts in order, passing each the feed and output
    arrays it names. One function closing over every kernel of a 10,000-step program
    would be correct too, but CPython compiles a closure over n variables in time
    quadratic in n: the parts keep both the compile and the call linear in the steps.
    """
    feeds = feed_buffers(program)
    feed_index = {b: k for k, b in enumerate(feeds)}
    feed_arg = {b: f"f{k}" for k, b in enumerate(feeds)}
    out_arg = {b: f"o{k}" for k, b in enumerate(output_roots(program))}
    homes = output_homes(program)

    def home(b: int) -> int:
        root = _root(program, b)
        return homes.get(root, root)
    top = ["def make(K, L, B, V, S, check, guard):"]
    body = ["    def step(" + ", ".join([feed_arg[b] for b in feeds] + list(out_arg.values())) + "):"]
    body += [f"        g{k} = f{k}.reshape(-1)" for k in range(len(feeds))]
    parts: list[str] = []
    passed: dict[str, None] = {}  # the step's arrays the current part names, in order

    def flat(b: int) -> str:
        root = home(b)
        name = out_arg.get(root) or (f"g{feed_index[root]}" if root in feed_arg else None)
        if name is None:
            return f"b{root}"
        passed[name] = None
        return name

    def shaped(b: int) -> str:
        root = home(b)
        spec = program.buffers[b]
        if root not in feed_arg and root not in out_arg:
            return f"x{b}"
        base = flat(b) if root in out_arg else feed_arg[root]
        passed[base] = None
        return base if root in feed_arg and b == root else f"{base}.reshape({tuple(spec.shape)!r})"

    kernel_at = iter(range(len(kernels)))
    scratch_at = 0
    steps = list(enumerate(program.steps))
    for c in range(0, len(steps), DRIVER_PART_STEPS):
        passed.clear()
        binds, calls, used_flat, used_shaped = [], [], set(), set()
        for s, step in steps[c:c + DRIVER_PART_STEPS]:
            if isinstance(step, KernelStep):
                k = next(kernel_at)
                bound = kernels[k]
                args = []
                for b in step.args:
                    if b is None:
                        args.append(f"s{scratch_at}")
                        binds.append(f"    s{scratch_at} = S[{scratch_at}]")
                        scratch_at += 1
                    else:
                        args.append(flat(b))
                        used_flat.add(home(b))
                for _ in bound.scratch:
                    args.append(f"s{scratch_at}")
                    binds.append(f"    s{scratch_at} = S[{scratch_at}]")
                    scratch_at += 1
                binds.append(f"    k{k} = K[{k}]")
                calls.append(f"        k{k}({', '.join(args + [str(bound.nchunks)])})")
                outputs = step.outputs
            else:
                assert isinstance(step, LibraryStep)
                outs = [shaped(b) for b in step.outputs]
                out = outs[0] if len(outs) == 1 else f"({', '.join(outs)})"
                names = [shaped(b) for b in step.inputs] + [f"out={out}"]
                used_shaped.update(b for b in (*step.inputs, *step.outputs)
                                   if home(b) not in feed_arg and home(b) not in out_arg)
                binds.append(f"    l{s} = L[{s}]")
                calls.append(f"        l{s}({', '.join(names)})")
                outputs = step.outputs
            if debug:
                for b in outputs:
                    calls.append(f"        check({flat(b)}, {s})")
                    used_flat.add(home(b))
            if guard:
                calls.append(f"        guard({s})")
        binds += [f"    b{b} = B[{b}]" for b in sorted(used_flat)
                  if b not in feed_arg and b not in out_arg]
        binds += [f"    x{b} = V[{b}]" for b in sorted(used_shaped)]
        part = c // DRIVER_PART_STEPS
        args = ", ".join(passed)
        parts += [f"def make_p{part}(K, L, B, V, S, check, guard):", *binds, f"    def p({args}):",
                  *calls, "        return None", "    return p", ""]
        top.append(f"    p{part} = make_p{part}(K, L, B, V, S, check, guard)")
        body.append(f"        p{part}({args})")
    body.append("        return None")
    return "\n".join(parts + top + body + ["    return step", ""])


class Runner:
    """Calls a program's driver with validated feeds and exposes its buffers."""

    def __init__(self, program: Program, kernels: Sequence[BoundKernel], library: dict[int, Callable],
                 arena_sizes: Sequence[int] | None, step_labels: Sequence[str], debug: bool):
        self.program = program
        self.guarded = debug or buffers.check_from_env()
        self.blocks: list[buffers.Block] = []  # this executable's guarded arrays (bounds check)
        with buffers.guarded(self.guarded):
            self._allocate(kernels, arena_sizes)
        self.source = driver_source(program, kernels, debug, self.guarded)
        self.step_labels = list(step_labels)
        module = load_module(self.source)
        library_list = [library.get(s) for s in range(len(program.steps))]
        self.driver = module.make([k.function for k in kernels], library_list, self.arrays, self.views,
                                  self.scratch, self._check, self._guard)
        self.feeds = feed_buffers(program)
        self.out_roots = output_roots(program)
        self.out_slot = {root: slot for slot, root in enumerate(self.out_roots)}
        self.first_output = {}
        for k, b in enumerate(program.outputs):
            self.first_output.setdefault(_root(program, b), k)
        self.owned: list[np.ndarray | None] = [None] * len(self.out_roots)  # our arrays handed out last call
        self.lock = threading.Lock()  # one call at a time (module docstring)
        self.allocations = 0
        self.allocated_bytes = 0

    def _allocate(self, kernels: Sequence[BoundKernel], arena_sizes: Sequence[int] | None) -> None:
        """The buffers, their shaped views and every kernel's scratch."""
        program = self.program
        self.arrays = allocate(program, arena_sizes, self.blocks)
        self.views = [None if a is None else a.reshape(spec.shape)
                      for a, spec in zip(self.arrays, program.buffers)]
        self.scratch = []
        kernel_at = iter(kernels)
        for step in program.steps:
            if isinstance(step, KernelStep):
                bound = next(kernel_at)
                for b, param in zip(step.args, step.kernel.params):
                    if b is None:
                        self.scratch.append(buffers.empty(param.size * bound.nchunks, param.dtype, self.blocks,
                                                          f"scratch of {step.name}"))
                for dtype, size in bound.scratch:
                    self.scratch.append(buffers.empty(size * bound.nchunks, dtype, self.blocks,
                                                      f"scratch of {step.name}"))

    def _allocated(self, array: np.ndarray) -> np.ndarray:
        self.allocations += 1
        self.allocated_bytes += array.nbytes
        return array

    def _check(self, array: np.ndarray, step: int) -> None:
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = int(np.count_nonzero(~np.isfinite(array)))
            raise NonFiniteError(f"{bad} non-finite value(s) after {self.step_labels[step]}")

    def _guard(self, step: int) -> None:
        broken = buffers.broken_guard(self.blocks)
        if broken is not None:
            raise OutOfBoundsWriteError(f"{self.step_labels[step]} wrote outside its buffers: {broken}")

    def run(self, feeds: dict[str, np.ndarray], out: Sequence[np.ndarray] | None = None) -> list[np.ndarray]:
        """Run the program; return the outputs, in `out`'s arrays if given (types already checked).

        Holds `lock` throughout: the driver writes the executable's own buffers."""
        with self.lock:
            if not self.guarded:
                return self._run(feeds, out)
            with buffers.guarded():  # the library scratch a call allocates is fenced too
                return self._run(feeds, out)

    def _run(self, feeds: dict[str, np.ndarray],
             out: Sequence[np.ndarray] | None) -> list[np.ndarray]:
        arrays, direct = self._output_arrays(out)
        self.driver(*(feeds[self.program.buffers[b].feed_name] for b in self.feeds), *arrays)
        results, handed = [], set()
        for k, b in enumerate(self.program.outputs):
            spec, root = self.program.buffers[b], _root(self.program, b)
            if k in self.program.in_place:
                results.append(feeds[spec.feed_name])
                continue
            value = self._current(root, spec, feeds, arrays)
            if out is not None:
                if not (root in direct and root not in handed):
                    np.copyto(out[k], value)
                value = out[k]
            elif root not in self.out_slot or root in handed:
                value = self._allocated(value.copy())
            handed.add(root)
            results.append(value)
        return results

    def _current(self, root: int, spec: BufferSpec, feeds, arrays) -> np.ndarray:
        """The value buffer `root` holds now, with the shape of `spec`."""
        if root in self.out_slot:
            return arrays[self.out_slot[root]].reshape(spec.shape)
        if self.program.buffers[root].role == "feed":
            return feeds[self.program.buffers[root].feed_name].reshape(spec.shape)
        return self.arrays[root].reshape(spec.shape)

    def _output_arrays(self, out: Sequence[np.ndarray] | None) -> tuple[list[np.ndarray], set[int]]:
        """A flat array for every output buffer this call writes, and the buffers that are `out`'s own."""
        arrays, direct = [], set()
        for slot, root in enumerate(self.out_roots):
            spec = self.program.buffers[root]
            target = out[self.first_output[root]] if out is not None else None
            if target is not None and target.flags.c_contiguous:
                arrays.append(target.reshape(-1))
                direct.add(root)
                continue
            previous, self.owned[slot] = self.owned[slot], None
            # every view of `previous`, the caller's included, references its block (`.base`,
            # buffers.empty); referenced by `previous` and getrefcount's argument only, the
            # caller let go of it
            if previous is None or sys.getrefcount(previous.base) > 2:
                previous = self._allocated(buffers.empty(spec.size, spec.dtype, self.blocks, f"output {slot}"))
            self.owned[slot] = previous
            arrays.append(previous)
        return arrays, direct
