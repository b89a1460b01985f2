"""Numba source for one `LoopKernel`.

    generate(kernel, parallel, fastmath) -> KernelSource

One `@njit(parallel=..., cache=True)` function `kernel(p0, p1, ..., nchunks)`
per distinct kernel; `p<k>` are the kernel's parameters (flat arrays), then
the per-thread scratch arrays this file asks for (`KernelSource.scratch`),
then the number of chunks.

Loop structure (what makes it fast):

* The kernel's inner axes that every access walks as one are merged first
  (`axis_coalescing`): a batch norm over (N, C, H, W) loops over H·W
  points, not H rows of W, and reduces its registers once per channel (the
  cnn step ran in 0.85-0.86 of the time, alternated in one process).
* `for c in prange(nchunks)` splits axis 0 into one contiguous chunk per
  thread; inside, `for i0 in range(lo, hi)` and, per phase, the loops over
  the inner axes, the innermost over the contiguous last axis.
* Every instruction is emitted at the outermost loop level its indices
  allow (loads of a bias row hoist out of the inner loop; constants out of
  the kernel loop altogether), so the innermost body is just the work.
* Reductions never race and never stop vectorisation:
  - over the innermost axis: first in a register per row (LLVM vectorises
    the accumulation: kernels are compiled with `reassoc`); a row longer
    than ROW_SPLIT, and a long rank-1 domain, is summed in blocks of
    ROW_SPLIT points (the last one shorter), each block in a register of
    the value's dtype, the blocks added in a wide accumulator, so every
    length sums as accurately as every other;
  - a row of ROW_CHAINS·ROW_CHAIN_MIN points or more summed in a light
    loop (a mean's, a variance's: at most ROW_CHAIN_WORK instructions a
    point) is blocked the same way, in ROW_CHAINS blocks: LLVM unrolls a
    loop of known length whole, and its vector additions were one chain
    of 64 dependent operations for a row of 1,024 float32, each waiting
    for the one before (the reduction's interleaving is gone once
    unrolled). Blocks are independent chains. layernorm_gelu's kernel,
    on rows in cache, took 0.87 of the time (2.65 against 3.0 cycles a
    point, two threads); its step 0.97 (2.90 against 2.99 ms, ten rounds
    alternated), where its rows mostly wait on memory. A heavy loop keeps
    its one chain: it is bound by its arithmetic, and blocking
    layernorm_gelu's prefetching pass too made its kernel slower in six
    of eight alternated rounds;
  - then, or over outer axes only, in a register opened before the
    outermost reduced loop that has only reduced loops inside it, else by
    a read-modify-write of the target (a column sum adds a whole row into
    a per-thread row of partials);
  - a float SUM or PRODUCT accumulates rows, blocks and per-thread partials
    in float64 (`_wide`): a float32 chain of thousands of additions of like
    values rounds the same way each time (the sum of 10^7 values of 0.1
    was off by 1e-3), a float64 one does not, and one wide addition per
    row or block costs nothing beside the block's vectorised loop; the
    result is rounded to the value's dtype once, where it is stored;
  - without `reassoc` (a `fastmath` set that leaves it out), a reduction
    over the innermost axis stores its values to a per-thread row buffer
    in the loop, and `rowreduce.<mode>_row` (compiled with `reassoc` in its
    own scope) reduces the row after it;
  - over axis 0 (column sums, the loss): each thread accumulates into its
    own partials (`q<r>`, nchunks × kept size), combined after the prange;
  - a float32 column sum read-modify-writes a float32 row of block partials
    (`e<r>`) for COLUMN_BLOCK rows at a time, added into its float64 `q<r>`
    after each block: float64 in the innermost loop made LLVM convert every
    value (`vcvtps2pd`) and pick four lanes instead of eight, and a row
    of float64 partials is twice the cache footprint (layernorm_gelu's
    fused loop took 24.6 ms against 16.2 ms blocked). A block of 16 rows is
    a float32 chain no longer than each SIMD lane of a blocked row sum.
  - where a rank-2 kernel's every reduction is a SUM over axis 0 (bias
    gradients beside their elementwise work, bcast_reduce), a block takes
    ROW_GROUP rows per pass of the innermost loop, their values added
    before the one read-modify-write of the partials: the bcast_reduce
    step ran in 0.87 of the time (alternated in one process; x and dx move
    as before, the partials' loads and stores are what it saves).
* A rank-2 kernel of several phases visits each row several times, in
  L1; the first visit of the next row's input misses on every line (the
  hardware prefetchers stay within a 4 KB page and stop with their
  stream's misses) and so do the last pass's stores. The heaviest phase's
  innermost loop therefore runs in blocks of PREFETCH_BLOCK points, each
  asking for its part of the next row of every full-domain input and
  output (`prefetch`), which the current row's arithmetic then hides.
* A loop that reads table rows through their positions (an absorbed gather,
  `lower`) loads each row's position once per row, at the outer level, and
  asks for the row GATHER_AHEAD rows ahead: the rows are random, so no
  prefetcher finds them (the embedding's fused loop took 1.42 ms with, 2.51
  without).
* A loop that adds its rows into a scatter's output (`kernel.RowScatter`)
  visits axis 0 by the output's blocks (`row_blocks`): each chunk owns a
  range of blocks and buckets the lookups that land there (per-thread
  `starts` and `order`), then fills each block and makes and adds its
  lookups' rows in increasing i0, asking for every row they read
  GATHER_AHEAD lookups ahead, the inputs read at i0 as well: in that order
  they are random rows too (without asking for those, the embedding's loop
  took 3.2-3.3 ms against 2.4-2.5). Its reductions over axis 0 keep
  per-chunk partials, not COLUMN_BLOCK blocks of rows. Its loads of inputs
  and its updates of the output carry alias scopes (`alias_scopes`: the
  output is never an input's memory), so LLVM checks no overlap for each
  row, and keeps more of the row's work in registers: the embedding's
  loop took 0.79-0.82 of its time (ten rounds alternated in one process).
* A kernel whose innermost loop evaluates a transcendental (`mathfuncs`)
  is arithmetic-bound, and its `chunk` asks LLVM for 512-bit vectors
  where the CPU has them (`vector_width`; layernorm_gelu's kernel 5.9 ->
  4.8 ms on two threads); the rest keep LLVM's 256-bit default, which
  memory-bound loops prefer.
* A division of the innermost loop by a value fixed along it (a softmax's
  row sum, a scale) multiplies by its reciprocal, taken once where the
  divisor is (`rcp<n>`): a vector division costs some twenty times a
  product, and the attention step's softmax kernel, six divisions an
  element, took 0.93 ms with them and 0.69 ms without. The quotient may
  differ from x / d in its last bit. A divisor whose reciprocal is not a
  normal number (zero, subnormal, above 2^126, infinite, NaN) keeps the
  division (`rcpok<n>`, fixed along the loop, which LLVM takes out of it
  by writing the loop twice), so the result is never an overflow that
  x / d would not give.
* Every array index is unsigned (`_at`), sparing Numba's negative-index
  wraparound, which LLVM cannot remove and which stops vectorisation.
* Selects are conditional expressions, literals are typed, float32 stays
  float32 (`scalar_ops`). No array is allocated inside a kernel.

Identifiers are sanitised (`p3`, `v17`, `i1`); numbers in the source are
`repr` of ints and floats computed here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ...axis_coalescing import coalesce_axes
from ...cones import domain_index
from ...index_expr import Index, ravel
from ...kernel import Compute, Load, LoopKernel, Reduction, RowValue
from ...ops.elemwise import Elemwise
from .cpu_profile import PROFILE
from .prefetch import CACHE_LINE, GATHER_AHEAD
from .row_blocks import block_rows
from .rowreduce import ROW_SPLIT
from .scalar_ops import literal, numba_type_name, reduction_identity, scalar_expr

COLUMN_BLOCK = 16
"""Rows of a float32 column sum accumulated in float32 before their float64 partials (module
docstring). Each block costs one zeroing and one addition of a row of partials, an eighth of
its rows' own work when full; a domain of fewer than four blocks of rows is left unblocked."""

ROW_GROUP = 4
"""Rows per pass of a column-sum block's innermost loop, where every reduction allows it (module
docstring); the rows of a block beyond a multiple of it take a pass each."""

ROW_CHAINS = 4
"""Blocks a register row sum of ROW_CHAINS·ROW_CHAIN_MIN to ROW_SPLIT points is split into, in a
light loop (module docstring): independent chains of vector additions, one each."""

ROW_CHAIN_MIN = 128
"""Points of each block of a split row sum, at least (module docstring)."""

_VECTOR_LANES = PROFILE.lanes(np.float32)  # a block of a split row is whole vectors of the CPU profile

ROW_CHAIN_WORK = 8
"""Instructions per point of a light loop, at most: one whose row sum's chain of dependent vector
additions is what bounds it (module docstring)."""

PREFETCH_BLOCK = 128
"""Points of a row's heaviest pass between its prefetches of the next row (module docstring): the
layernorm_gelu kernel ran in 0.78-0.81 of the time with blocks of 128, 0.85-0.90 with 64 or 256
(float32 rows of 1,024; alternated in one process). Rows shorter than a block are not prefetched."""

_COMBINE = {
    "SUM": "{a} + {b}",
    "PRODUCT": "{a} * {b}",
    # NaN wins, as in numpy's max: a NaN value enters (b != b), and a NaN accumulator stays
    # (no comparison with it is true)
    "MAX": "{b} if {b} > {a} or {b} != {b} else {a}",
    "MIN": "{b} if {b} < {a} or {b} != {b} else {a}",
}
_ROW_HELPER = {"SUM": "sum_row", "PRODUCT": "product_row", "MAX": "max_row", "MIN": "min_row"}


@dataclass(frozen=True)
class KernelSource:
    """Generated module text; `scratch` lists (dtype, size per chunk) of the extra arrays."""

    source: str
    scratch: tuple[tuple[np.dtype, int], ...]
    parallel: bool


def _at(array: str, flat: str) -> str:
    """`array[flat]` with an unsigned index: every index here is non-negative by construction,
    and an unsigned one spares Numba's negative-index wraparound, which would stop
    LLVM from vectorising the loop."""
    return f"{array}[np.uint64({flat})]"


def _wide(mode: str, dtype: np.dtype) -> np.dtype:
    """The dtype rows, blocks and partials of a reduction accumulate in (module docstring)."""
    return np.dtype(np.float64) if mode in ("SUM", "PRODUCT") and dtype.kind == "f" else dtype


@dataclass
class _ReductionPlan:
    """Where reduction `index` accumulates (see the module docstring)."""

    index: int
    red: Reduction
    dtype: np.dtype
    phase: int
    row: str | None  # innermost axis reduced first: in a "register" or a row "buffer"
    value_level: int  # level at which the (partial) value is available
    register_level: int | None  # loop level the register spans from, or None
    combine: bool  # the target is read-modified-written (needs an init)
    cross: bool  # reduces over axis 0 (per-thread partials)
    kept: tuple[int, ...]
    blocked: bool  # the innermost loop's chain is summed in blocks of ROW_SPLIT
    column_block: bool  # a float32 column sum, accumulated COLUMN_BLOCK rows at a time in e<r>

    @property
    def wide(self) -> np.dtype:
        return _wide(self.red.mode, self.dtype)

    @property
    def write_level(self) -> int:
        return self.register_level - 1 if self.register_level is not None else self.value_level


def row_block(length: int) -> int:
    """Points per block of a blocked chain along an innermost loop of `length` points: ROW_SPLIT
    for a long one, else a ROW_CHAINS-th of it, rounded up to whole vectors (module docstring)."""
    if length > ROW_SPLIT:
        return ROW_SPLIT
    return -(-length // (ROW_CHAINS * _VECTOR_LANES)) * _VECTOR_LANES


def _plan_reduction(index: int, red: Reduction, dtype, phase: int, domain: tuple[int, ...],
                    reassociate: bool, rows_in_order: bool, light: bool) -> _ReductionPlan:
    rank = len(domain)
    axes = set(red.axes)
    # MAX and MIN always reduce a row buffer: their helpers halve it in place, which
    # vectorises; a register chain that tests for NaN does not
    register_row = reassociate and red.mode in ("SUM", "PRODUCT")
    row = ("register" if register_row else "buffer") if rank >= 2 and rank - 1 in axes else None
    level = rank - 2 if row else rank - 1
    remaining = axes - {rank - 1} if row else axes
    start = level + 1
    while start - 1 >= 0 and start - 1 in remaining:
        start -= 1
    register = start if start <= level else None
    scope = register if register is not None else level + 1
    combine = any(a < scope for a in remaining)
    kept = tuple(k for k in range(rank) if k not in axes)
    # a chain along the innermost loop: a register row, or the register of a rank-1 domain
    chain = row == "register" or (rank == 1 and register == 0)
    split = row == "register" and light and domain[-1] >= ROW_CHAINS * ROW_CHAIN_MIN
    blocked = chain and _wide(red.mode, np.dtype(dtype)).kind == "f" and (domain[-1] > ROW_SPLIT or split)
    column_block = (0 in axes and combine and red.mode == "SUM" and np.dtype(dtype) == np.float32
                    and domain[0] >= 4 * COLUMN_BLOCK and rows_in_order)
    return _ReductionPlan(index, red, np.dtype(dtype), phase, row, level, register, combine,
                          0 in axes, kept, blocked, column_block)


class _Writer:
    def __init__(self, kernel: LoopKernel, parallel: bool, fastmath):
        self.kernel = kernel
        self.parallel = parallel
        self.fastmath = fastmath
        self.rank = len(kernel.domain)
        self.names = [f"i{k}" for k in range(self.rank)]
        self.rows = 1  # rows of axis 0 the loop body being written covers (`_row_copies`)
        self.suffix = ""  # of the variables of the row being written
        self.lines: list[str] = []
        self.calls: set[str] = set()
        self.element_calls = False  # a transcendental in the innermost loop (`vector_width`)
        self.helpers: set[str] = set()
        self.scratch: list[tuple[np.dtype, int]] = []
        self.scratch_names: list[str] = []
        self.level: dict[int, int] = {}
        self.dtype: dict[int, np.dtype] = {}
        self.plans: list[_ReductionPlan] = []
        for phase in kernel.phases:
            for instr in phase.instrs:
                self.level[instr.var] = self._instr_level(instr)
                self.dtype[instr.var] = instr.dtype
        for p, phase in enumerate(kernel.phases):
            light = self._innermost_work(phase) <= ROW_CHAIN_WORK
            for red in phase.reductions:
                dtype = next(i.dtype for i in phase.instrs if i.var == red.var)
                reassociate = "reassoc" in fastmath
                plan = _plan_reduction(len(self.plans), red, dtype, p, kernel.domain, reassociate,
                                       kernel.scatter is None, light)
                self.plans.append(plan)
                if plan.row == "buffer":
                    self._add_scratch(f"w{plan.index}", plan.dtype, kernel.domain[-1])
                if plan.cross:
                    self._add_scratch(f"q{plan.index}", plan.wide, self._kept_size(plan))
                if plan.column_block:
                    self._add_scratch(f"e{plan.index}", plan.dtype, self._kept_size(plan))
        self.blocks = self._blocks() if kernel.scatter is not None else None
        if self.blocks is not None:   # each chunk's blocks' lookups (`_scattered_rows`)
            self._add_scratch("starts", np.int64, self.blocks[1] + 3)
            self._add_scratch("order", np.int64, kernel.domain[0])
        self.prefetch_phase, self.prefetches = self._next_row_prefetches()
        self.rows_ahead = self._indirect_rows_ahead()
        self.reciprocals, self.by_reciprocal = self._invariant_divisors()

    def _invariant_divisors(self) -> tuple[set[int], set[int]]:
        """(divisors, divisions): the float divisions of the innermost loop whose divisor is fixed
        along it (a row's sum, a scalar), and those divisors (module docstring)."""
        divisors, divisions = set(), set()
        for phase in self.kernel.phases:
            for instr in phase.instrs:
                expr = instr.expr
                if (isinstance(expr, Compute) and isinstance(expr.op, Elemwise) and expr.op.mode == "TRUE_DIV"
                        and np.dtype(instr.dtype).kind == "f" and self._innermost(instr.var)
                        and not self._innermost(expr.args[1]) and self.dtype[expr.args[1]] == instr.dtype):
                    divisors.add(expr.args[1])
                    divisions.add(instr.var)
        return divisors, divisions

    # -- helpers --------------------------------------------------------------------------------
    def _innermost(self, var: int) -> bool:
        """Whether `var` is computed in the innermost loop (for each element of a row)."""
        return self.rank > 0 and self.level[var] == self.rank - 1

    def _innermost_work(self, phase) -> int:
        """Instructions `phase` evaluates for each element of a row (its innermost loop's)."""
        return sum(1 for i in phase.instrs if self._innermost(i.var))

    def _add_scratch(self, name: str, dtype, size: int) -> None:
        self.scratch.append((np.dtype(dtype), int(size)))
        self.scratch_names.append(name)

    def _kept_size(self, plan: _ReductionPlan) -> int:
        return math.prod([self.kernel.domain[k] for k in plan.kept])

    def _instr_level(self, instr) -> int:
        expr = instr.expr
        if isinstance(expr, Load):
            level = max(expr.index.axes(), default=-1)
            if expr.offset is not None:
                level = max(level, self.level[expr.offset])
            return max(level, 0) if self.kernel.params[expr.param].role != "in" else level
        if isinstance(expr, RowValue):
            return 0
        return max((self.level[a] for a in expr.args), default=-1)

    def _var(self, var: int) -> str:
        """The name of `var` in the row being written: a hoisted value is every row's."""
        return f"v{var}{self.suffix}" if self.level[var] >= 0 else f"v{var}"

    def _row_copies(self):
        """Write what follows once per row the body covers: row r reads row `i0 + r` and names
        its variables `v<n>_<r>`."""
        if self.rows == 1:
            yield
            return
        for r in range(self.rows):
            self.suffix, self.names[0] = f"_{r}", f"(i0 + {r})" if r else "i0"
            yield
        self.suffix, self.names[0] = "", "i0"

    def _rows_value(self, var: int) -> str:
        """The sum of `var` over the rows the body covers (one row: the variable)."""
        if self.rows == 1:
            return f"v{var}"
        return "(" + " + ".join(f"v{var}_{r}" for r in range(self.rows)) + ")"

    def _row_group(self) -> int:
        """ROW_GROUP where a column-sum block may take that many rows per pass: a rank-2 kernel of
        one phase whose reductions are all SUMs over axis 0 (a register or partials, never
        a row of its own), else 1."""
        grouped = (self.rank == 2 and len(self.kernel.phases) == 1
                   and any(p.column_block for p in self.plans)
                   and not any(p.role == "row" for p in self.kernel.params)
                   and all(p.cross and p.red.mode == "SUM" and p.row != "buffer" for p in self.plans))
        return ROW_GROUP if grouped else 1

    def _next_row_prefetches(self) -> tuple[int | None, tuple[tuple[str, int], ...]]:
        """The phase whose innermost loop prefetches the next row, and (intrinsic, param) for each
        full-domain input it asks for and each output it owns (module docstring); (None, ())
        where no phase does."""
        kernel = self.kernel
        if (self.rank != 2 or len(kernel.phases) < 2 or kernel.domain[1] < PREFETCH_BLOCK
                or kernel.scatter is not None):
            return None, ()
        reads = self._whole_domain_reads()
        writes = sorted({store.param for phase in kernel.phases for store in phase.stores
                         if kernel.params[store.param].role == "out"})
        if not reads and not writes:
            return None, ()
        work = [self._innermost_work(phase) for phase in kernel.phases]
        heaviest = max(range(len(work)), key=work.__getitem__)
        return heaviest, tuple([("prefetch_read", p) for p in reads] + [("prefetch_write", p) for p in writes])

    def _whole_domain_reads(self) -> list[int]:
        """The inputs read at every point of the domain, in its order (a row each per i0)."""
        kernel = self.kernel
        whole = ravel(domain_index(kernel.domain), kernel.domain)
        return sorted({i.expr.param for phase in kernel.phases for i in phase.instrs
                       if isinstance(i.expr, Load) and kernel.params[i.expr.param].role == "in"
                       and i.expr.index == whole})

    def _indirect_rows_ahead(self) -> dict[tuple[int, int], tuple[Load, set[tuple[int, int, int]]]]:
        """The rows the indirect loads (a gather absorbed by `lower`) read, to ask for
        GATHER_AHEAD rows ahead: per (phase, position variable), the position's load and the
        (table param, first offset, last offset) of each row read through it. Only positions
        loaded once per row (indexed by axis 0 alone) of rank-2 and wider domains, where a row
        is an inner loop's worth of work."""
        if self.rank < 2:
            return {}
        loads = {i.var: i.expr for phase in self.kernel.phases for i in phase.instrs if isinstance(i.expr, Load)}
        ahead: dict[tuple[int, int], tuple[Load, set[tuple[int, int, int]]]] = {}
        for p, phase in enumerate(self.kernel.phases):
            for instr in phase.instrs:
                position = loads.get(instr.expr.offset) if isinstance(instr.expr, Load) else None
                if position is None or position.offset is not None or position.index.axes() != {0}:
                    continue
                lo, hi = instr.expr.index.bounds(self.kernel.domain)
                ahead.setdefault((p, instr.expr.offset), (position, set()))[1].add((instr.expr.param, lo, hi))
        return ahead

    def _prefetch_rows_ahead(self, depth: int, p: int | None, ahead: str, guard: str | None) -> None:
        """Ask for phase `p`'s table rows (every phase's, for None) at row `ahead` of axis 0, if
        `guard` (`_indirect_rows_ahead`): the rows are random, so no hardware prefetcher finds
        them (`prefetch.GATHER_AHEAD`)."""
        names = list(self.names)
        names[0] = ahead
        for (phase, _), (position, rows) in self.rows_ahead.items():
            if p is not None and phase != p:
                continue
            if guard is not None:
                self.emit(depth, f"if {guard}:")
            inner = depth + (guard is not None)
            self.emit(inner, f"ahead = np.uint64({_at(f'p{position.param}', position.index.render(names))})")
            for param, lo, hi in sorted(rows):
                line = max(CACHE_LINE // self.kernel.params[param].dtype.itemsize, 1)
                for offset in range(lo, hi + 1, line):
                    self.emit(inner, f"prefetch_read(p{param}, ahead + np.uint64({offset}))")

    def _points_loop(self, depth: int, phase: int | None, lo: str, hi: str) -> int:
        """`for i<last> in range(lo, hi)`, in prefetching blocks if `phase` is the one that
        prefetches the next row (`_next_row_prefetches`); returns the depth of the body."""
        axis = self.rank - 1
        if self.prefetch_phase is None or phase != self.prefetch_phase:
            self.emit(depth, f"for i{axis} in range({lo}, {hi}):")
            return depth + 1
        width = self.kernel.domain[1]
        self.emit(depth, f"for k{axis} in range({lo}, {hi}, {PREFETCH_BLOCK}):")
        for intrinsic, param in self.prefetches:
            line = max(CACHE_LINE // self.kernel.params[param].dtype.itemsize, 1)
            for offset in range(0, PREFETCH_BLOCK, line):
                self.emit(depth + 1, f"{intrinsic}(p{param}, np.uint64(n0 * {width} + k{axis} + {offset}))")
        self.emit(depth + 1, f"for i{axis} in range(k{axis}, min(k{axis} + {PREFETCH_BLOCK}, {hi})):")
        return depth + 2

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("    " * depth + text)

    def _param_at(self, param: int, index: Index, offset: int | None = None) -> str:
        spec = self.kernel.params[param]
        flat = index.render(self.names)
        if offset is not None:
            flat = f"{self._var(offset)} + {flat}"
        if spec.role == "row":
            flat = f"c * {spec.size} + {flat}"
        if self.kernel.scatter is not None and spec.role == "in":
            return f"load_source(p{param}, np.uint64({flat}))"   # never what `store_result` writes
        return _at(f"p{param}", flat)

    def _instr(self, depth: int, instr) -> None:
        expr = instr.expr
        if isinstance(expr, Load):
            text = self._param_at(expr.param, expr.index, expr.offset)
        elif isinstance(expr, RowValue):
            text = f"r{expr.reduction}"
        else:
            assert isinstance(expr, Compute)
            args = [self._var(a) for a in expr.args]
            if instr.var in self.by_reciprocal:
                x, d = args
                text = f"{x} * rcp{d[1:]} if rcpok{d[1:]} else {x} / {d}"
            else:
                built = scalar_expr(expr.op, args, instr.dtype, [self.dtype[a] for a in expr.args])
                self.calls.update(built.calls)
                self.element_calls |= bool(built.calls) and self._innermost(instr.var)
                text = built.text
        self.emit(depth, f"{self._var(instr.var)} = {text}")
        if instr.var in self.reciprocals:
            d, info = self._var(instr.var), np.finfo(instr.dtype)
            self.emit(depth, f"rcp{d[1:]} = {literal(1, instr.dtype)} / {d}")
            self.emit(depth, f"rcpok{d[1:]} = {literal(info.tiny, instr.dtype)} <= abs(rcp{d[1:]}) <= "
                             f"{literal(info.max, instr.dtype)}")

    # -- reductions --------------------------------------------------------------------------------
    def _kept_flat(self, plan: _ReductionPlan, axes) -> str:
        index = domain_index(self.kernel.domain)
        return ravel([index[k] for k in axes], [self.kernel.domain[k] for k in axes]).render(self.names)

    def _target(self, plan: _ReductionPlan) -> str:
        if plan.cross:
            partials = f"e{plan.index}" if plan.column_block else f"q{plan.index}"
            return _at(partials, f"c * {self._kept_size(plan)} + {self._kept_flat(plan, plan.kept)}")
        spec = self.kernel.params[plan.red.param]
        if spec.role == "row":
            inner = tuple(k for k in plan.kept if k != 0)
            return _at(f"p{plan.red.param}", f"c * {spec.size} + {self._kept_flat(plan, inner)}")
        return _at(f"p{plan.red.param}", self._kept_flat(plan, plan.kept))

    def _finalised(self, plan: _ReductionPlan, value: str) -> str:
        """The reduced value in the reduction's dtype (divided, for a mean), from its wide one."""
        if plan.red.divisor is not None:
            value = f"{value} / {literal(plan.red.divisor, plan.wide)}"
        return value if plan.wide == plan.dtype else f"{numba_type_name(plan.dtype)}({value})"

    def _write(self, depth: int, plan: _ReductionPlan, value: str) -> None:
        """Put a (partial) reduced value where the reduction accumulates."""
        combine = _COMBINE[plan.red.mode]
        if plan.cross:
            target = self._target(plan)
            self.emit(depth, f"{target} = {combine.format(a=target, b=value) if plan.combine else value}")
            return
        if plan.combine:
            target = self._target(plan)
            self.emit(depth, f"{target} = {combine.format(a=target, b=value)}")
            return
        self.emit(depth, f"r{plan.index} = {self._finalised(plan, value)}")
        if plan.red.param is not None:
            self.emit(depth, f"{self._target(plan)} = r{plan.index}")

    def _update(self, depth: int, plan: _ReductionPlan, value: str) -> None:
        if plan.register_level is not None:
            register = f"u{plan.index}" if plan.blocked and self.rank == 1 else f"a{plan.index}"
            self.emit(depth, f"{register} = {_COMBINE[plan.red.mode].format(a=register, b=value)}")
        else:
            self._write(depth, plan, value)

    def _innermost_loop(self, depth: int, lo: str, hi: str, plans: list[_ReductionPlan],
                        body, phase: int | None = None) -> None:
        """`for i<last> in range(lo, hi)` around `body(depth)`; in blocks of ROW_SPLIT points if
        `plans` chain along it, each block summed in `u<r>` and added to the wide register;
        the points in prefetching blocks if `phase` prefetches the next row (`_points_loop`)."""
        axis = self.rank - 1
        if not plans:
            body(self._points_loop(depth, phase, lo, hi))
            return
        block = row_block(self.kernel.domain[-1])
        self.emit(depth, f"for j{axis} in range({lo}, {hi}, {block}):")
        for plan in plans:
            self.emit(depth + 1, f"u{plan.index} = {reduction_identity(plan.red.mode, plan.dtype)}")
        body(self._points_loop(depth + 1, phase, f"j{axis}", f"min(j{axis} + {block}, {hi})"))
        for plan in plans:
            register = f"s{plan.index}" if plan.row else f"a{plan.index}"
            combine = _COMBINE[plan.red.mode].format(a=register, b=f"u{plan.index}")
            self.emit(depth + 1, f"{register} = {combine}")

    def _row_slice_loop(self, depth: int, plan: _ReductionPlan, body: str) -> None:
        """`body` over the row-`i0` slice of a row-local target, as `{t}` = the element."""
        spec = self.kernel.params[plan.red.param]
        inner = tuple(k for k in plan.kept if k != 0)
        size = math.prod([self.kernel.domain[k] for k in inner])
        base = f"c * {spec.size}" if spec.role == "row" else f"i0 * {size}"
        element = _at(f"p{plan.red.param}", f"{base} + t{plan.index}")
        self.emit(depth, f"for t{plan.index} in range({size}):")
        self.emit(depth + 1, body.format(t=element))

    # -- loop nest ---------------------------------------------------------------------------------
    def _phase_level(self, depth: int, p: int, level: int) -> None:
        phase = self.kernel.phases[p]
        for _ in self._row_copies():
            if level == 0 and self.kernel.scatter is None:
                ahead = f"{self.names[0]} + {GATHER_AHEAD}"
                self._prefetch_rows_ahead(depth, p, ahead, f"{ahead} < hi")
            for instr in phase.instrs:
                if self.level[instr.var] == level:
                    self._instr(depth, instr)
        mine = [plan for plan in self.plans if plan.phase == p]
        if level == 0:
            for plan in mine:
                if plan.combine and not plan.cross:
                    self._row_slice_loop(depth, plan, "{t} = " + reduction_identity(plan.red.mode, plan.dtype))
        for plan in mine:
            if plan.register_level == level + 1:
                self.emit(depth, f"a{plan.index} = {reduction_identity(plan.red.mode, plan.wide)}")
        if level < self.rank - 1:
            inner = level + 1
            for plan in mine:
                if plan.row == "register" and plan.value_level == level:
                    dtype = plan.wide if plan.blocked else plan.dtype
                    self.emit(depth, f"s{plan.index} = {reduction_identity(plan.red.mode, dtype)}")
            if inner == self.rank - 1:
                blocked = [plan for plan in mine if plan.blocked]
                if p == self.prefetch_phase:
                    self.emit(depth, "n0 = i0 + 1 if i0 + 1 < hi else i0")
                self._innermost_loop(depth, "0", str(self.kernel.domain[inner]), blocked,
                                     lambda d: self._phase_level(d, p, inner), p)
            else:
                self.emit(depth, f"for i{inner} in range({self.kernel.domain[inner]}):")
                self._phase_level(depth + 1, p, inner)
            for plan in mine:
                if plan.row and plan.value_level == level:
                    if plan.row == "buffer":
                        w = self.kernel.domain[-1]
                        helper = _ROW_HELPER[plan.red.mode]
                        self.helpers.add(helper)
                        init = reduction_identity(plan.red.mode, plan.wide)
                        self.emit(depth, f"s{plan.index} = {helper}(w{plan.index}, c * {w}, {w}, {init})")
                    self._update(depth, plan, f"s{plan.index}")
            for plan in mine:
                if plan.register_level == level + 1:
                    self._write(depth, plan, f"a{plan.index}")
        else:
            for _ in self._row_copies():
                for store in phase.stores:
                    index = domain_index(self.kernel.domain)
                    spec = self.kernel.params[store.param]
                    flat = ravel(index[1:], self.kernel.domain[1:]) if spec.role == "row" else ravel(
                        index, self.kernel.domain)
                    self.emit(depth, f"{self._param_at(store.param, flat)} = {self._var(store.var)}")
                scatter = self.kernel.scatter
                if scatter is not None and scatter.phase == p:
                    inner = ravel(domain_index(self.kernel.domain)[1:], self.kernel.domain[1:]).render(self.names)
                    at = f"p{scatter.out}, np.uint64(row0 + {inner})"
                    self.emit(depth, f"store_result({at}, load_result({at}) + {self._var(scatter.var)})")
            for plan in mine:
                value = self._rows_value(plan.red.var)
                if plan.row == "buffer":
                    row = _at(f"w{plan.index}", f"c * {self.kernel.domain[-1]} + i{self.rank - 1}")
                    self.emit(depth, f"{row} = {value}")
                elif plan.row == "register":
                    register = f"u{plan.index}" if plan.blocked else f"s{plan.index}"
                    combine = _COMBINE[plan.red.mode].format(a=register, b=value)
                    self.emit(depth, f"{register} = {combine}")
                else:
                    self._update(depth, plan, value)
        if level == 0:
            for plan in mine:
                if plan.combine and not plan.cross and plan.red.divisor is not None:
                    self._row_slice_loop(depth, plan, "{t} = " + self._finalised(plan, "{t}"))

    def _hoisted(self, depth: int) -> None:
        """Instructions that depend on no loop index (constants, scalars): once per call."""
        for phase in self.kernel.phases:
            for instr in phase.instrs:
                if self.level[instr.var] == -1:
                    self._instr(depth, instr)

    def _chunk_body(self) -> None:
        """The body of `chunk(c, ...)`: rows [lo, hi) of axis 0, every phase, this chunk's partials.

        The guard tells LLVM that `c` and every index derived from it are
        non-negative, so it drops Numba's negative-index wraparound and the
        loops vectorise.
        """
        n0 = self.kernel.domain[0]
        self.emit(1, "if c < 0 or nchunks <= 0:")
        self.emit(2, "return None")
        self._hoisted(1)
        if self.kernel.scatter is None:
            self.emit(1, f"lo = c * {n0} // nchunks")
            self.emit(1, f"hi = (c + 1) * {n0} // nchunks")
        for plan in self.plans:
            if plan.cross and plan.combine:
                self._over_partials(1, plan, "{q} = " + reduction_identity(plan.red.mode, plan.wide))
            if plan.register_level == 0:
                self.emit(1, f"a{plan.index} = {reduction_identity(plan.red.mode, plan.wide)}")

        def phases(depth: int) -> None:
            for p in range(len(self.kernel.phases)):
                self._phase_level(depth, p, 0)

        columns = [plan for plan in self.plans if plan.column_block]
        if self.kernel.scatter is not None:
            self._scattered_rows(phases)
        elif self.rank == 1:
            blocked = [plan for plan in self.plans if plan.blocked]
            self._innermost_loop(1, "lo", "hi", blocked, phases)
        elif columns:
            self.emit(1, f"for j0 in range(lo, hi, {COLUMN_BLOCK}):")
            for plan in columns:
                self._over_partials(2, plan, "{e} = " + reduction_identity(plan.red.mode, plan.dtype))
            group = self._row_group()
            if group > 1:
                self.emit(2, f"stop0 = min(j0 + {COLUMN_BLOCK}, hi)")
                self.emit(2, f"grouped0 = stop0 - (stop0 - j0) % {group}")
                self.emit(2, f"for i0 in range(j0, grouped0, {group}):")
                self.rows = group
                phases(3)
                self.rows = 1
                self.emit(2, "for i0 in range(grouped0, stop0):")
            else:
                self.emit(2, f"for i0 in range(j0, min(j0 + {COLUMN_BLOCK}, hi)):")
            phases(3)
            for plan in columns:
                self._over_partials(2, plan, "{q} = {q} + {e}")
        else:
            self.emit(1, "for i0 in range(lo, hi):")
            phases(2)
        for plan in self.plans:
            if plan.register_level == 0:
                self._write(1, plan, f"a{plan.index}")
        self.emit(1, "return None")

    def _blocks(self) -> tuple[int, int]:
        """(rows per block, blocks) of a scatter's output (`row_blocks`)."""
        out = self.kernel.params[self.kernel.scatter.out]
        row = math.prod(self.kernel.domain[1:])
        rows = block_rows(row, out.dtype.itemsize)
        return rows, -(-(out.size // max(row, 1)) // rows)

    def _scattered_rows(self, phases) -> None:
        """The rows of axis 0 of a loop that adds them into a scatter's output (`kernel.RowScatter`):
        chunk c owns a range of the output's blocks (`row_blocks`); it buckets the lookups that
        land there, then fills each block and makes and adds its lookups' rows, in increasing
        i0, asking for the rows GATHER_AHEAD lookups ahead: their inputs, read in that order,
        are random rows too."""
        scatter, (rows, blocks) = self.kernel.scatter, self.blocks
        row = math.prod(self.kernel.domain[1:])
        span, size, n0 = rows * row, self.kernel.params[scatter.out].size, self.kernel.domain[0]
        self.emit(1, f"blocks, low, high = owned_blocks(c, nchunks, {blocks}, {span}, {size})")
        self.emit(1, f"mine = starts[c * {blocks + 3}:(c + 1) * {blocks + 3}]")
        self.emit(1, f"lookups = order[c * {n0}:(c + 1) * {n0}]")
        self.emit(1, f"bucket_lookups(p{scatter.positions}, low, high, {span}, blocks, mine, lookups)")
        self.emit(1, f"fill = {_at(f'p{scatter.fill}', '0')}")
        self.emit(1, "end = mine[blocks]")
        self.emit(1, "for b in range(blocks):")
        self.emit(2, f"fill_block(p{scatter.out}, low, high, {span}, b, fill)")
        self.emit(2, "for k in range(mine[b], mine[b + 1]):")
        self.emit(3, "i0 = lookups[k]")
        self.emit(3, f"row0 = load_source(p{scatter.positions}, np.uint64(i0))")
        self.emit(3, f"if k + {GATHER_AHEAD} < end:")
        self.emit(4, f"n0 = lookups[k + {GATHER_AHEAD}]")
        for param in self._whole_domain_reads():
            line = max(CACHE_LINE // self.kernel.params[param].dtype.itemsize, 1)
            for offset in range(0, row, line):
                self.emit(4, f"prefetch_read(p{param}, np.uint64(n0 * {row} + {offset}))")
        self._prefetch_rows_ahead(4, None, "n0", None)
        phases(3)

    def _over_partials(self, depth: int, plan: _ReductionPlan, body: str) -> None:
        """`body` over this chunk's per-thread partials of a column sum: `{q}` the element, and
        `{e}` its block partial (`column_block` only)."""
        size, r = self._kept_size(plan), plan.index
        flat = f"c * {size} + t{r}"
        self.emit(depth, f"for t{r} in range({size}):")
        self.emit(depth + 1, body.format(q=_at(f"q{r}", flat), e=_at(f"e{r}", flat)))

    def _combine_partials(self, plan: _ReductionPlan) -> None:
        size, r = self._kept_size(plan), plan.index
        combine = _COMBINE[plan.red.mode].format(a=f"b{r}", b=_at(f"q{r}", f"cc * {size} + t{r}"))
        self.emit(1, f"for t{r} in range({size}):")
        self.emit(2, f"b{r} = {_at(f'q{r}', f't{r}')}")
        self.emit(2, "for cc in range(1, nchunks):")
        self.emit(3, f"b{r} = {combine}")
        self.emit(2, f"{_at(f'p{plan.red.param}', f't{r}')} = {self._finalised(plan, f'b{r}')}")

    def _scalar_kernel(self) -> None:
        """A rank-0 domain: straight-line code, every instruction in order.

        Not only the hoisted ones: a load of a buffer the kernel writes (an epilogue
        updating a 0-d library output in place, `-x[t]`) sits at level 0, the body of a
        loop that a rank-0 domain does not have.
        """
        (phase,) = self.kernel.phases
        for instr in phase.instrs:
            self._instr(1, instr)
        for store in phase.stores:
            self.emit(1, f"{_at(f'p{store.param}', '0')} = v{store.var}")
        for red in phase.reductions:
            plan = self.plans[[pl.red for pl in self.plans].index(red)]
            self.emit(1, f"{_at(f'p{red.param}', '0')} = {self._finalised(plan, f'v{red.var}')}")

    def source(self) -> KernelSource:
        params = ", ".join([f"p{k}" for k in range(len(self.kernel.params))] + self.scratch_names + ["nchunks"])
        flags = "False" if not self.fastmath else repr(sorted(self.fastmath)).replace("[", "{").replace("]", "}")
        options = "cache=True, nogil=True, error_model='numpy', boundscheck=False, fastmath=" + flags
        functions: list[str] = []
        if self.rank == 0:
            self._scalar_kernel()
            self.emit(1, "return None")
        else:
            self._chunk_body()
            wide = ["    prefer_wide_vectors()"] if self.element_calls else []
            functions += [f"@njit(parallel=False, {options})", f"def chunk(c, {params}):", *wide, *self.lines, "", ""]
            self.lines = []
            loop = "prange" if self.parallel else "range"
            self.emit(1, f"for c in {loop}(nchunks):")
            self.emit(2, f"chunk(np.intp(c), {params})")
            for plan in self.plans:
                if plan.cross:
                    self._combine_partials(plan)
            self.emit(1, "return None")
        functions += [f"@njit(parallel={self.parallel}, {options})", f"def kernel({params}):", *self.lines]
        described = ", ".join(f"{p.role} {p.dtype.name}[{p.size}]" for p in self.kernel.params)
        header = [f"# parameters: {described}", "import numpy as np", "from numba import njit, prange"]
        if self.calls:
            header.append(f"from gradcompiler.backends.numba_cpu.mathfuncs import {', '.join(sorted(self.calls))}")
        if self.element_calls:
            header.append("from gradcompiler.backends.numba_cpu.vector_width import prefer_wide_vectors")
        if self.helpers:
            header.append(f"from gradcompiler.backends.numba_cpu.rowreduce import {', '.join(sorted(self.helpers))}")
        # the prefetching phase's loop is always written (a rank-2 phase has one)
        scatter = self.kernel.scatter is not None
        intrinsics = {intrinsic for intrinsic, _ in self.prefetches} | (
            {"prefetch_read"} if self.rows_ahead or scatter else set())
        if intrinsics:
            header.append(f"from gradcompiler.backends.numba_cpu.prefetch import {', '.join(sorted(intrinsics))}")
        if scatter:
            header.append("from gradcompiler.backends.numba_cpu.row_blocks import bucket_lookups, fill_block, "
                          "owned_blocks")
            header.append("from gradcompiler.backends.numba_cpu.alias_scopes import load_result, load_source, "
                          "store_result")
        text = "\n".join(header + ["", ""] + functions) + "\n"
        return KernelSource(text, tuple(self.scratch), self.parallel)


def generate(kernel: LoopKernel, parallel: bool, fastmath: frozenset[str] = frozenset()) -> KernelSource:
    """The module source of `kernel` (module docstring), its inner axes coalesced where every
    access walks them as one (`axis_coalescing`)."""
    return _Writer(coalesce_axes(kernel), parallel and len(kernel.domain) > 0, fastmath).source()
