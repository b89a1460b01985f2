"""Running a compiled program: buffers allocated once, and one generated driver.

Per call, the only Python that runs is a generated function (`driver`)
that calls every kernel and library routine in order with its buffers
bound as local variables: no dictionary lookup, no loop over steps, no
allocation. Buffers are allocated once per executable: values that share
a buffer in the memory plan share one arena (as views of it); an alias is
the same flat array as the value it views; constants are copied in once;
per-thread scratch (partials, row buffers) belongs to each kernel step.
Feeds are the caller's arrays, reshaped flat (no copy) for the kernels.

The driver's source names only sanitised locals (`k3`, `b17`, `g2`); with
`debug=True` it also calls `check(array, k)` after each step, and the
description of step k (kernel name, forward op, user's line) comes from a
list, never from the source.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from ...errors import NonFiniteError
from ...kernel import BufferSpec, KernelStep, LibraryStep, Program
from .cache import load_module


@dataclass
class BoundKernel:
    """A compiled kernel and how many chunks (threads) it splits axis 0 into."""

    function: Callable
    scratch: tuple[tuple[np.dtype, int], ...]
    nchunks: int


def allocate(program: Program, arena_sizes: Sequence[int] | None) -> list[np.ndarray | None]:
    """Flat arrays for every non-feed buffer (None for feeds), in buffer order."""
    arenas = [np.empty(size, dtype=np.uint8) for size in (arena_sizes or ())]
    arrays: list[np.ndarray | None] = []
    for spec in program.buffers:
        if spec.role == "feed":
            arrays.append(None)
        elif spec.role == "const":
            arrays.append(np.array(spec.value, dtype=spec.dtype).reshape(-1))
        elif spec.role == "alias":
            arrays.append(arrays[spec.alias_of])
        elif spec.storage is not None and arena_sizes is not None:
            arrays.append(arenas[spec.storage][: spec.nbytes].view(spec.dtype))
        else:
            arrays.append(np.empty(spec.size, dtype=spec.dtype))
    return arrays


def _root(program: Program, b: int) -> int:
    spec = program.buffers[b]
    return spec.alias_of if spec.alias_of is not None else b


def feed_buffers(program: Program) -> list[int]:
    return [b for b, spec in enumerate(program.buffers) if spec.role == "feed"]


def driver_source(program: Program, kernels: Sequence[BoundKernel], debug: bool) -> str:
    """The driver module: `make(K, L, B, V, S, check)` returns `step(*feeds)`."""
    feeds = feed_buffers(program)
    feed_arg = {b: f"f{k}" for k, b in enumerate(feeds)}
    lines = ["def make(K, L, B, V, S, check):"]
    body = ["    def step(" + ", ".join(feed_arg[b] for b in feeds) + "):"]

    def flat(b: int) -> str:
        root = _root(program, b)
        return f"g{feeds.index(root)}" if root in feed_arg else f"b{root}"

    def shaped(b: int) -> str:
        root = _root(program, b)
        if root in feed_arg:
            spec = program.buffers[b]
            return feed_arg[root] if b == root else f"{feed_arg[root]}.reshape({tuple(spec.shape)!r})"
        return f"x{b}"

    used_flat, used_shaped = set(), set()
    for k, b in enumerate(feeds):
        body.append(f"        g{k} = f{k}.reshape(-1)")
    kernel_at = iter(range(len(kernels)))
    scratch_at = 0
    for s, step in enumerate(program.steps):
        if isinstance(step, KernelStep):
            k = next(kernel_at)
            bound = kernels[k]
            args = []
            for b in step.args:
                if b is None:
                    args.append(f"s{scratch_at}")
                    scratch_at += 1
                else:
                    args.append(flat(b))
                    used_flat.add(_root(program, b))
            for _ in bound.scratch:
                args.append(f"s{scratch_at}")
                scratch_at += 1
            lines.append(f"    k{k} = K[{k}]")
            body.append(f"        k{k}({', '.join(args + [str(bound.nchunks)])})")
            outputs = step.outputs
        else:
            assert isinstance(step, LibraryStep)
            names = [shaped(b) for b in step.inputs] + [f"out={shaped(step.output)}"]
            used_shaped.update(b for b in (*step.inputs, step.output) if _root(program, b) not in feed_arg)
            lines.append(f"    l{s} = L[{s}]")
            body.append(f"        l{s}({', '.join(names)})")
            outputs = (step.output,)
        if debug:
            for b in outputs:
                body.append(f"        check({flat(b)}, {s})")
                used_flat.add(_root(program, b))
    for b in sorted(used_flat):
        if b not in feed_arg:
            lines.append(f"    b{b} = B[{b}]")
    for b in sorted(used_shaped):
        lines.append(f"    x{b} = V[{b}]")
    for k in range(scratch_at):
        lines.append(f"    s{k} = S[{k}]")
    body.append("        return None")
    return "\n".join(lines + body + ["    return step", ""])


class Runner:
    """Calls a program's driver with validated feeds and exposes its buffers."""

    def __init__(self, program: Program, kernels: Sequence[BoundKernel], library: dict[int, Callable],
                 arena_sizes: Sequence[int] | None, step_labels: Sequence[str], debug: bool):
        self.program = program
        self.arrays = allocate(program, arena_sizes)
        self.views = [None if a is None else a.reshape(spec.shape)
                      for a, spec in zip(self.arrays, program.buffers)]
        self.scratch = []
        kernel_at = iter(kernels)
        for step in program.steps:
            if isinstance(step, KernelStep):
                bound = next(kernel_at)
                for b, param in zip(step.args, step.kernel.params):
                    if b is None:
                        self.scratch.append(np.empty(param.size * bound.nchunks, dtype=param.dtype))
                for dtype, size in bound.scratch:
                    self.scratch.append(np.empty(size * bound.nchunks, dtype=dtype))
        self.source = driver_source(program, kernels, debug)
        self.step_labels = list(step_labels)
        module = load_module(self.source)
        library_list = [library.get(s) for s in range(len(program.steps))]
        self.driver = module.make([k.function for k in kernels], library_list, self.arrays, self.views,
                                  self.scratch, self._check)
        self.feeds = feed_buffers(program)

    def _check(self, array: np.ndarray, step: int) -> None:
        if array.dtype.kind == "f" and not np.isfinite(array).all():
            bad = int(np.count_nonzero(~np.isfinite(array)))
            raise NonFiniteError(f"{bad} non-finite value(s) after {self.step_labels[step]}")

    def run(self, feeds: dict[str, np.ndarray]) -> None:
        self.driver(*(feeds[self.program.buffers[b].feed_name] for b in self.feeds))

    def output(self, b: int, feeds: dict[str, np.ndarray]) -> np.ndarray:
        """The current value of buffer `b`, shaped (a view: copy it before handing it out)."""
        spec: BufferSpec = self.program.buffers[b]
        root = _root(self.program, b)
        if self.program.buffers[root].role == "feed":
            return feeds[self.program.buffers[root].feed_name].reshape(spec.shape)
        return self.arrays[root].reshape(spec.shape)
