"""CUDA source for one `LoopKernel` of the Kernel IR (the CPU backend's input too).

    generate(kernel, block, shuffle) -> CudaKernelSource

One `@cuda.jit` function `kernel(p0, ..., q0, ...)` per distinct kernel:
`p<k>` are the kernel's parameters (flat device arrays; a `row` parameter
gets a scratch array of one row per block), `q<r>` the per-block partials
of reduction r when it runs over axis 0. Three layouts, chosen from the
kernel's structure:

* **flat** (one phase, no reduction or only reductions over the whole
  domain): a grid-stride loop over the flattened iteration space, each
  thread unravelling its flat index; neighbouring threads touch
  neighbouring elements. Whole-domain reductions accumulate per thread,
  combine in a shared-memory tree per block, and leave one partial per
  block.
* **rows** (everything else): one block per index of axis 0 (grid-stride
  over rows), phases one after another with a barrier between them, so a
  later phase reads what an earlier one produced for the same row (row
  scalars from shared memory, row buffers and outputs from memory). In a
  phase the threads stride over the *parallel* inner axes and each walks
  the *serial* ones, chosen so that every reduction with kept inner axes
  has exactly its reduced inner axes serial: each output element is then
  owned by one thread, with no atomics, and the same thread owns it in
  every row, so a reduction over axis 0 with kept axes (a column sum)
  accumulates straight into its block's partial row. Reductions to one
  value per row use a shared-memory tree (finished by warp shuffles on a
  GPU). When two reductions of one phase keep different inner axes, no
  split suits both: that phase walks each row with one thread, which
  read-modify-writes every target (rare, and never racy).
* **scalar** (a 0-d domain): one thread.

Partials of reductions over axis 0 are folded by
`library_reduce.PartialFold` after the kernel (the two-stage reduction).
A rows kernel gets `block_for` threads per block: fewer than the limit
when its rows are short. Scalar expressions are the CPU backend's
(`scalar_ops`), so both targets compute the same formulas; their
transcendental calls (`exp_f32`, ...) resolve to `cuda_math`.
Identifiers are sanitised (`p3`, `v17`, `i1`); numbers in the source are
`repr` of ints and floats computed here, typed by `scalar_ops.literal`;
constants of the graph arrive as parameters.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ...cones import domain_index
from ...index_expr import Index, ravel
from ...kernel import Compute, Load, LoopKernel, Reduction, RowValue
from ..numba_cpu.scalar_ops import literal, numba_type_name, reduction_identity, scalar_expr
from .device import SHUFFLE_DTYPES

_COMBINE = {
    "SUM": "{a} + {b}",
    "PRODUCT": "{a} * {b}",
    "MAX": "{a} if {a} >= {b} or {a} != {a} else {b}",  # NaN wins, as in numpy's max
    "MIN": "{a} if {a} <= {b} or {a} != {a} else {b}",
}
_MATH_MODULE = Path(__file__).with_name("cuda_math.py")


@dataclass(frozen=True)
class PartialSpec:
    """Per-block partials of a reduction over axis 0: `kept` values per block, folded into `param`."""

    reduction: int
    param: int
    mode: str
    divisor: int | None
    dtype: np.dtype
    kept: int


@dataclass(frozen=True)
class CudaKernelSource:
    source: str
    layout: str  # flat | rows | scalar
    block: int  # threads per block
    partials: tuple[PartialSpec, ...]

    @property
    def parallel(self) -> bool:
        """Always: a GPU kernel runs across threads (the report's column)."""
        return True

    def grid(self, kernel: LoopKernel, max_blocks: int) -> int:
        """Blocks to launch: at most `max_blocks`, no more than there is work for."""
        if self.layout == "scalar":
            return 1
        work = kernel.domain[0] if self.layout == "rows" else -(-kernel.size // self.block)
        return max(1, min(max_blocks, work))


@dataclass
class _Plan:
    """How reduction `index` is computed (see the module docstring)."""

    index: int
    red: Reduction
    dtype: np.dtype
    phase: int
    kept: tuple[int, ...]  # kept domain axes
    way: str  # tree (one value per row or per domain) | owned (one thread per element) | rmw (one thread per row)

    @property
    def crosses(self) -> bool:
        return self.red.crosses_rows()


class _Writer:
    def __init__(self, kernel: LoopKernel, block: int, shuffle: bool):
        self.kernel, self.block, self.shuffle = kernel, block, shuffle
        self.rank = len(kernel.domain)
        self.names = [f"i{k}" for k in range(self.rank)]
        self.lines: list[str] = []
        self.calls: set[str] = set()
        self.dtype = {i.var: i.dtype for phase in kernel.phases for i in phase.instrs}
        self.layout = layout_of(kernel)
        inner = tuple(range(1, self.rank))
        self.serial: list[tuple[int, ...]] = []
        self.plans: list[_Plan] = []
        for p, phase in enumerate(kernel.phases):
            # the reduced inner axes of each reduction that keeps an inner axis: they must be serial
            needs = {tuple(k for k in inner if k in red.axes) for red in phase.reductions
                     if self.layout == "rows" and any(k not in red.axes for k in inner)}
            serial = next(iter(needs)) if len(needs) == 1 else (inner if needs else ())
            for red in phase.reductions:
                kept = tuple(k for k in range(self.rank) if k not in red.axes)
                if self.layout != "rows" or kept in ((), (0,)):
                    way = "tree"
                else:
                    way = "owned" if len(needs) == 1 else "rmw"
                self.plans.append(_Plan(len(self.plans), red, self.dtype[red.var], p, kept, way))
            self.serial.append(serial)

    # -- small pieces -------------------------------------------------------------------------------
    def emit(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def _at(self, param: int, flat: Index) -> str:
        """Element `flat` of parameter `param` (a row parameter: within this block's row)."""
        spec = self.kernel.params[param]
        offset = flat.render(self.names)
        return f"p{param}[slot * {spec.size} + {offset}]" if spec.role == "row" else f"p{param}[{offset}]"

    def _kept_flat(self, axes: tuple[int, ...]) -> Index:
        index = domain_index(self.kernel.domain)
        return ravel([index[k] for k in axes], [self.kernel.domain[k] for k in axes])

    def _target(self, plan: _Plan) -> str:
        """Where reduction `plan` stores its value (a crossing one: its block's partial row)."""
        if plan.crosses:
            inner = tuple(k for k in plan.kept if k != 0)
            return f"q{plan.index}[slot * {self._size(inner)} + {self._kept_flat(inner).render(self.names)}]"
        spec = self.kernel.params[plan.red.param]
        axes = tuple(k for k in plan.kept if k != 0) if spec.role == "row" else plan.kept
        return self._at(plan.red.param, self._kept_flat(axes))

    def _size(self, axes) -> int:
        return math.prod([self.kernel.domain[k] for k in axes])

    def _finalised(self, plan: _Plan, value: str) -> str:
        return value if plan.red.divisor is None else f"{value} / {literal(plan.red.divisor, plan.dtype)}"

    def _combine(self, plan: _Plan, a: str, b: str) -> str:
        return _COMBINE[plan.red.mode].format(a=a, b=b)

    def _unravel(self, depth: int, flat: str, axes: tuple[int, ...]) -> None:
        """Loop indices of `axes` from the row-major position `flat` over them."""
        stride = self._size(axes)
        for k in axes:
            stride //= max(self.kernel.domain[k], 1)  # an empty axis: the loop around this never runs
            if self.kernel.domain[k] == 1:
                self.emit(depth, f"i{k} = 0")
                continue
            text = f"{flat} // {stride}" if stride > 1 else flat
            self.emit(depth, f"i{k} = ({text}) % {self.kernel.domain[k]}" if k != axes[0] else f"i{k} = {text}")

    def _instrs(self, depth: int, phase: int) -> None:
        for instr in self.kernel.phases[phase].instrs:
            expr = instr.expr
            if isinstance(expr, Load):
                # lowering absorbs gathers (indirect loads) for the CPU target alone
                assert expr.offset is None, "an indirect load reached the CUDA code generator"
                text = self._at(expr.param, expr.index)
            elif isinstance(expr, RowValue):
                text = f"r{expr.reduction}"
            else:
                assert isinstance(expr, Compute)
                built = scalar_expr(expr.op, [f"v{a}" for a in expr.args], instr.dtype,
                                    [self.dtype[a] for a in expr.args])
                self.calls.update(built.calls)
                text = built.text
            self.emit(depth, f"v{instr.var} = {text}")

    def _stores(self, depth: int, phase: int) -> None:
        index = domain_index(self.kernel.domain)
        for store in self.kernel.phases[phase].stores:
            spec = self.kernel.params[store.param]
            flat = ravel(index[1:], self.kernel.domain[1:]) if spec.role == "row" else ravel(index, self.kernel.domain)
            self.emit(depth, f"{self._at(store.param, flat)} = v{store.var}")

    def _tree(self, depth: int, plans: list[_Plan], register: str) -> None:
        """Combine every thread's `<register><r>` across the block; the result in s<r>[0]."""
        for plan in plans:
            self.emit(depth, f"s{plan.index}[t] = {register}{plan.index}")
        self.emit(depth, "cuda.syncthreads()")
        self.emit(depth, f"step = {self.block // 2}")
        self.emit(depth, f"while step > {16 if self.shuffle else 0}:")
        self.emit(depth + 1, "if t < step:")
        for plan in plans:
            s = f"s{plan.index}"
            self.emit(depth + 2, f"{s}[t] = {self._combine(plan, f'{s}[t]', f'{s}[t + step]')}")
        self.emit(depth + 1, "cuda.syncthreads()")
        self.emit(depth + 1, "step //= 2")
        if self.shuffle:
            self.emit(depth, "if t < 32:")
            for plan in plans:
                self.emit(depth + 1, f"w{plan.index} = s{plan.index}[t]")
            self.emit(depth + 1, "lane = 16")
            self.emit(depth + 1, "while lane > 0:")
            for plan in plans:
                # The shuffle is a statement of its own: inside MAX's or MIN's conditional
                # expression only some lanes would reach it, and a full-mask shuffle that not
                # every lane of the warp reaches never completes (seen on an H200).
                w, o = f"w{plan.index}", f"o{plan.index}"
                self.emit(depth + 2, f"{o} = cuda.shfl_down_sync(0xFFFFFFFF, {w}, lane)")
                self.emit(depth + 2, f"{w} = {self._combine(plan, w, o)}")
            self.emit(depth + 2, "lane //= 2")
            self.emit(depth + 1, "if t == 0:")
            for plan in plans:
                self.emit(depth + 2, f"s{plan.index}[0] = w{plan.index}")
            self.emit(depth, "cuda.syncthreads()")

    # -- layouts ------------------------------------------------------------------------------------
    def _scalar(self) -> None:
        self.emit(1, "if cuda.grid(1) == 0:")
        for p in range(len(self.kernel.phases)):
            self._instrs(2, p)
            self._stores(2, p)
            for plan in (pl for pl in self.plans if pl.phase == p):
                self.emit(2, f"r{plan.index} = {self._finalised(plan, f'v{plan.red.var}')}")
                if plan.red.param is not None:
                    self.emit(2, f"p{plan.red.param}[0] = r{plan.index}")

    def _flat(self) -> None:
        for plan in self.plans:
            self.emit(1, f"c{plan.index} = {reduction_identity(plan.red.mode, plan.dtype)}")
        self.emit(1, f"for e in range(cuda.grid(1), {self.kernel.size}, cuda.gridsize(1)):")
        self._unravel(2, "e", tuple(range(self.rank)))
        self._instrs(2, 0)
        self._stores(2, 0)
        for plan in self.plans:
            self.emit(2, f"c{plan.index} = {self._combine(plan, f'c{plan.index}', f'v{plan.red.var}')}")
        self._block_partials(1)

    def _block_partials(self, depth: int) -> None:
        """Whole-domain reductions: each block's tree result is its partial."""
        whole = [plan for plan in self.plans if plan.way == "tree" and plan.crosses]
        if whole:
            self._tree(depth, whole, "c")
            self.emit(depth, "if t == 0:")
            for plan in whole:
                self.emit(depth + 1, f"q{plan.index}[slot] = s{plan.index}[0]")

    def _rows(self) -> None:
        for plan in self.plans:
            if plan.crosses and plan.way == "tree":
                self.emit(1, f"c{plan.index} = {reduction_identity(plan.red.mode, plan.dtype)}")
            elif plan.crosses:
                size = self._size(tuple(k for k in plan.kept if k != 0))
                self.emit(1, f"for e in range(t, {size}, {self.block}):")
                self.emit(2, f"q{plan.index}[slot * {size} + e] = {reduction_identity(plan.red.mode, plan.dtype)}")
        self.emit(1, "cuda.syncthreads()")
        self.emit(1, f"for i0 in range(cuda.blockIdx.x, {self.kernel.domain[0]}, cuda.gridDim.x):")
        for p in range(len(self.kernel.phases)):
            self._phase(2, p)
            self.emit(2, "cuda.syncthreads()")
        self._block_partials(1)

    def _phase(self, depth: int, p: int) -> None:
        mine = [plan for plan in self.plans if plan.phase == p]
        serial = self.serial[p]
        parallel = tuple(k for k in range(1, self.rank) if k not in serial)
        rmw = [plan for plan in mine if plan.way == "rmw" and not plan.crosses]
        for plan in rmw:  # row i0's slice of the target starts at the identity
            self._row_slice(depth, plan, "{t} = " + reduction_identity(plan.red.mode, plan.dtype))
        if rmw:
            self.emit(depth, "cuda.syncthreads()")
        for plan in mine:
            if plan.way == "tree" and not plan.crosses:
                self.emit(depth, f"a{plan.index} = {reduction_identity(plan.red.mode, plan.dtype)}")
        self.emit(depth, f"for par in range(t, {self._size(parallel)}, {self.block}):")
        self._unravel(depth + 1, "par", parallel)
        owned = [plan for plan in mine if plan.way == "owned"]
        for plan in owned:
            self.emit(depth + 1, f"a{plan.index} = {reduction_identity(plan.red.mode, plan.dtype)}")
        body = depth + 1
        if serial:
            self.emit(body, f"for ser in range({self._size(serial)}):")
            body += 1
            self._unravel(body, "ser", serial)
        self._instrs(body, p)
        self._stores(body, p)
        for plan in mine:
            value = f"v{plan.red.var}"
            if plan.way == "rmw":
                target = self._target(plan)
                self.emit(body, f"{target} = {self._combine(plan, target, value)}")
            else:
                register = "c" if plan.crosses and plan.way == "tree" else "a"
                self.emit(body, f"{register}{plan.index} = {self._combine(plan, f'{register}{plan.index}', value)}")
        for plan in owned:
            target = self._target(plan)
            value = self._combine(plan, target, f"a{plan.index}") if plan.crosses else self._finalised(
                plan, f"a{plan.index}")
            self.emit(depth + 1, f"{target} = {value}")
        rows = [plan for plan in mine if plan.way == "tree" and not plan.crosses]
        if rows:
            self._tree(depth, rows, "a")
            for plan in rows:
                self.emit(depth, f"r{plan.index} = {self._finalised(plan, f's{plan.index}[0]')}")
            for plan in rows:
                if plan.red.param is not None:
                    self.emit(depth, "if t == 0:")
                    self.emit(depth + 1, f"{self._target(plan)} = r{plan.index}")
        divided = [plan for plan in rmw if plan.red.divisor is not None]
        if divided:
            self.emit(depth, "cuda.syncthreads()")
            for plan in divided:
                self._row_slice(depth, plan, "{t} = " + self._finalised(plan, "{t}"))

    def _row_slice(self, depth: int, plan: _Plan, body: str) -> None:
        """`body` for each element of row i0's slice of a non-crossing reduction's target."""
        spec = self.kernel.params[plan.red.param]
        inner = tuple(k for k in plan.kept if k != 0)
        size = self._size(inner)
        base = f"slot * {spec.size}" if spec.role == "row" else f"i0 * {size}"
        self.emit(depth, f"for e in range(t, {size}, {self.block}):")
        self.emit(depth + 1, body.format(t=f"p{plan.red.param}[{base} + e]"))

    # -- the module ---------------------------------------------------------------------------------
    def source(self) -> CudaKernelSource:
        body_start = len(self.lines)
        self.emit(1, "t = cuda.threadIdx.x")
        self.emit(1, "slot = cuda.blockIdx.x")
        for plan in self.plans:
            if plan.way == "tree" and self.layout != "scalar":
                self.emit(1, f"s{plan.index} = cuda.shared.array({self.block}, {numba_type_name(plan.dtype)})")
        getattr(self, f"_{self.layout}")()
        body = self.lines[body_start:]
        partials = tuple(PartialSpec(plan.index, plan.red.param, plan.red.mode, plan.red.divisor, plan.dtype,
                                     self._size(tuple(k for k in plan.kept if k != 0)))
                         for plan in self.plans if plan.crosses and self.layout != "scalar")
        params = [f"p{k}" for k in range(len(self.kernel.params))] + [f"q{s.reduction}" for s in partials]
        header = ["import numpy as np", "from numba import cuda"]
        if self.calls:
            digest = hashlib.sha256(_MATH_MODULE.read_bytes()).hexdigest()[:16]
            header += [f"from gradcompiler.backends.numba_cuda.cuda_math import {', '.join(sorted(self.calls))}",
                       f"# cuda_math {digest}"]
        text = "\n".join(header + ["", "", "@cuda.jit(cache=True)", f"def kernel({', '.join(params)}):"] + body)
        return CudaKernelSource(text + "\n", self.layout, self.block, partials)


def layout_of(kernel: LoopKernel) -> str:
    """flat, rows or scalar (module docstring)."""
    rank = len(kernel.domain)
    if rank == 0:
        return "scalar"
    whole = set(range(rank))
    has_rows = any(p.role == "row" for p in kernel.params)
    if len(kernel.phases) == 1 and not has_rows and all(set(r.axes) == whole for r in kernel.reductions()):
        return "flat"
    return "rows"


def block_for(kernel: LoopKernel, limit: int) -> int:
    """Threads per block: `limit`, or, for rows with little inner work, the power of two that
    covers a row (at least a warp), so more blocks fit on each multiprocessor."""
    if layout_of(kernel) != "rows":
        return limit
    inner = math.prod(kernel.domain[1:])
    return min(limit, max(32, 1 << max(inner - 1, 0).bit_length()))


def generate(kernel: LoopKernel, block: int, shuffle: bool) -> CudaKernelSource:
    """The module source of `kernel` with `block` threads per block (module docstring).

    Warp shuffles finish the trees only where every reduced dtype can be shuffled and a block
    holds at least one warp. A loop that makes a scatter (`RowScatter`) is the CPU's alone:
    the CUDA target plans without them (`fuse.attach_scatters`).
    """
    if kernel.scatter is not None:
        raise ValueError("the CUDA code generator takes no loop that makes a scatter (RowScatter): "
                         "plan with row_scatter_loops=False")
    dtypes = {i.dtype for phase in kernel.phases for r in phase.reductions for i in phase.instrs if i.var == r.var}
    return _Writer(kernel, block, shuffle and block >= 32 and dtypes <= set(SHUFFLE_DTYPES)).source()
