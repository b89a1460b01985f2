"""The Kernel IR: what a backend generates code from.

A compiled step is a `Program`: flat buffers and an ordered list of steps.
A step is either a `LoopKernel` run on some buffers (`KernelStep`) or a
named library call (`LibraryStep`: matmul, gathers, scatters, warps, ...).
The IR is target-neutral: the CPU backend writes Numba `prange` loops from
it, the CUDA backend writes grid-stride kernels from the same objects.

A `LoopKernel` is one fused loop nest:

* `domain`: the iteration space, a shape; loop index `i_k` runs over axis k.
* `params`: its buffers (`BufferParam`: role, dtype, size). Every buffer
  is flat and contiguous. `in` buffers are read through an `Index`
  expression of the loop indices (broadcasting, view remaps); `out`
  buffers are stored or reduced into; `row` buffers are per-thread scratch
  rows holding a value that a later phase reads back (one row of it: the
  index excludes axis 0), so it never goes to main memory.
* `phases`: one or more passes over the inner axes, run one after another
  for each index of axis 0. A phase holds an SSA list of instructions
  (`Load`, direct or indirect, `Compute`, `RowValue`) and what it produces: `Store`s of full
  domain values and `Reduction`s over a subset of the domain axes. A later
  phase may read what an earlier phase produced for the same `i0` (a row
  mean, then the variance around it, then the normalised row): that is how
  a whole layer norm, forward and backward, is one pass over memory.
  Reductions over axis 0 (column sums, the loss) are combined across
  threads after the loop and cannot be read by a later phase.
* `scatter`: optionally, a `RowScatter`: the rows of one value are added
  into a filled scatter's output at the lookups' positions instead of
  being stored, and axis 0 may be visited in any order that keeps equal
  positions in increasing i0.

A `LoopKernel` holds no node id, no name and no buffer identity: it is pure
structure (ops, dtypes, shapes, index maps). Two layers that do the same
thing lower to equal kernels, and the backends compile each distinct kernel
once; `KernelStep` binds a kernel to the program's buffers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from .index_expr import Index
from .ir import Op

REDUCTION_MODES = ("SUM", "PRODUCT", "MAX", "MIN")


PARAM_ROLES = ("in", "out", "row")


@dataclass(frozen=True)
class BufferParam:
    """A flat, contiguous array parameter of a kernel (`row`: the size of one row)."""

    role: str
    dtype: np.dtype
    size: int


@dataclass(frozen=True)
class Load:
    """Read parameter `param` at flat offset `index` (within the row for a `row` param),
    plus, for an indirect read, the value of the earlier integer variable `offset`.

    An indirect read is how a loop reads a gather it absorbed (`lower`): `offset` is a row's
    flat position, loaded from the positions the gather's index check wrote, and `index`
    walks the row. The offset is a variable rather than an atom of `index` because its
    value is only known at run time: the index algebra cannot simplify around it, and a
    backend computes it once per row (at its variable's loop level) instead of per point.
    """

    param: int
    index: Index
    offset: int | None = None


@dataclass(frozen=True)
class Compute:
    """Apply an elementwise op (Elemwise, Where, Cast) to earlier variables."""

    op: Op
    args: tuple[int, ...]


@dataclass(frozen=True)
class RowValue:
    """The value, for the current `i0`, of reduction `reduction` of an earlier phase.

    Only for reductions over every axis but 0 (one scalar per row).
    """

    reduction: int


@dataclass(frozen=True)
class Instr:
    var: int
    expr: Load | Compute | RowValue
    dtype: np.dtype


@dataclass(frozen=True)
class Store:
    """Store `var` at every domain point into parameter `param` (`out`: whole domain, `row`: the row)."""

    param: int
    var: int


@dataclass(frozen=True)
class Reduction:
    """Combine `var` over domain `axes` into parameter `param` (kept axes, row-major).

    `mode` is one of REDUCTION_MODES; `divisor`, when set, divides the result
    (MEAN is a SUM with a divisor). `param` is None for a row reduction only
    later phases read (it lives in a register).
    """

    param: int | None
    var: int
    mode: str
    axes: tuple[int, ...]
    divisor: int | None = None

    def crosses_rows(self) -> bool:
        """Whether the reduction runs over axis 0 (so threads must combine partials)."""
        return 0 in self.axes


@dataclass(frozen=True)
class Phase:
    instrs: tuple[Instr, ...]
    stores: tuple[Store, ...] = ()
    reductions: tuple[Reduction, ...] = ()


@dataclass(frozen=True)
class RowScatter:
    """Where a loop puts the rows of one of its values instead of storing them: added into the
    rows of a filled scatter's output (`fuse`: the loop feeds a scatter-add of rows onto a
    Fill, and nothing else reads the value).

    `out` (role out) is filled with `fill` (a one-element input), then row i0 of variable
    `var` of phase `phase` is added at flat offset `positions[i0]` (an int64 input, one row
    position per index of axis 0: `RowPositions`). A backend visits axis 0 in any order that
    keeps equal positions in increasing i0 (the order np.add.at uses): the CPU walks the
    output a block of rows at a time and, within a block, its lookups in increasing i0.
    """

    out: int
    fill: int
    positions: int
    phase: int
    var: int


@dataclass(frozen=True)
class LoopKernel:
    domain: tuple[int, ...]
    params: tuple[BufferParam, ...]
    phases: tuple[Phase, ...]
    scatter: RowScatter | None = None

    @property
    def size(self) -> int:
        return math.prod(self.domain)

    def reductions(self) -> list[Reduction]:
        return [r for phase in self.phases for r in phase.reductions]

    def flops(self) -> int:
        """Scalar operations per run: one per Compute and per reduction step, per domain point."""
        per_point = sum(
            sum(isinstance(i.expr, Compute) for i in p.instrs) + len(p.reductions) for p in self.phases
        )
        return per_point * self.size

    def bytes_moved(self) -> int:
        """Bytes read and written once each (the memory traffic floor of this kernel)."""
        return sum(b.size * b.dtype.itemsize for b in self.params if b.role != "row")


# -- programs --------------------------------------------------------------------------


@dataclass
class BufferSpec:
    """One flat buffer of a program.

    `role`: feed (a placeholder, provided per call), const (a constant,
    provided once), temp (written by a step), alias (a view of `alias_of`).
    """

    shape: tuple[int, ...]
    dtype: np.dtype
    role: str
    node: int | None = None  # the graph node whose value it holds
    feed_name: str | None = None
    value: np.ndarray | None = field(default=None, repr=False)
    alias_of: int | None = None
    storage: int | None = None  # the memory plan's buffer, shared with values whose lives do not overlap

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize


@dataclass
class KernelStep:
    """Run `kernel` with `args[k]` the program buffer of parameter k (None for `row` scratch)."""

    name: str
    kernel: LoopKernel
    args: tuple[int | None, ...]
    nodes: tuple[int, ...]  # the graph nodes it evaluates (fused ops), for reports

    @property
    def outputs(self) -> tuple[int, ...]:
        return tuple(b for b, p in zip(self.args, self.kernel.params) if p.role == "out")


@dataclass(frozen=True)
class RowPositions:
    """The op of a `LibraryStep` that writes where each row of `shape` an index picks starts.

    For `table[idx]` (advanced indexing of axis 0 alone, op-reference §7.2) whose values
    only a loop reads, lowering can drop the copy of the rows: this step checks and wraps
    the index as the gather would (its error names the gather), and writes position
    p = wrap(idx[p])·(row size), which the loop adds to its offset within the row
    (`Load.offset`). A loop that adds its rows into a scatter's output (`RowScatter`) finds
    them the same way, `indexing` being then the scatter. The step reads the index alone:
    `shape` is the table's (a scatter onto a Fill has no table buffer). Not a graph op:
    only lowering makes one.
    """

    indexing: Op
    shape: tuple[int, ...]

    @property
    def label(self) -> str:
        return self.indexing.label

    def describe(self) -> str:
        return f"RowPositions({self.indexing.describe()}, {self.shape})"


@dataclass(frozen=True)
class FilledScatter:
    """The op of a `LibraryStep` that adds rows into a tensor of one repeated value.

    `out = full(shape, c); out[idx] += value` with whole rows (a scatter-add of axis 0 by one
    index, op-reference §7.3, onto a Fill): the gradient of every gather of rows, an
    embedding's. The step reads the value and the index alone, and the Fill never gets a
    buffer of its own (`fuse.scatters_rows_onto_fill`), so a backend may fill and update the
    destination a block at a time while the block is in cache, rather than fill all of it and
    come back for each row. Not a graph op: only lowering makes one, for the scatter
    `scatter` onto the Fill `fill`.
    """

    scatter: Op
    fill: Op

    @property
    def label(self) -> str:
        return self.scatter.label

    def describe(self) -> str:
        return f"FilledScatter({self.scatter.describe()}, {self.fill.describe()})"


@dataclass(frozen=True)
class SiblingCalls:
    """The op of a `LibraryStep` that makes the values of several library calls at once.

    Calls whose ops give one `Op.sibling_key` read the same values the same way (a warp's
    two gradients walk the same taps of the same upstream gradient), so fusion puts them in
    one group. A backend with a joint kernel for them makes every output in one pass (the
    CPU's warp gradients); any other runs each op's own kernel in turn. `arguments[k]` are
    op k's inputs, as positions in the step's inputs. Not a graph op: only fusion makes one.
    """

    ops: tuple[Op, ...]
    arguments: tuple[tuple[int, ...], ...]

    @property
    def label(self) -> str:
        return " + ".join(op.label for op in self.ops)

    def describe(self) -> str:
        return f"SiblingCalls({', '.join(op.describe() for op in self.ops)})"

    def part(self, k: int, values: tuple):
        """Op k's inputs among the step's `values`."""
        return tuple(values[a] for a in self.arguments[k])


@dataclass
class LibraryStep:
    """Call the library kernel of `op` on buffers `inputs`, writing buffers `outputs`: one, or
    one per op of a `SiblingCalls`; `nodes` are the graph nodes whose values they hold.

    The kernel is called `kernel(*inputs, out=out)`, with `out` the one output buffer, or
    the tuple of them for `SiblingCalls`."""

    name: str
    op: Op | RowPositions | SiblingCalls | FilledScatter
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]
    nodes: tuple[int, ...]


Step = KernelStep | LibraryStep


@dataclass
class Program:
    buffers: list[BufferSpec]
    steps: list[Step]
    outputs: list[int]  # buffer of each requested output
    in_place: frozenset[int] = frozenset()  # outputs written over the feed buffer they update

    def kernels(self) -> list[LoopKernel]:
        """Distinct loop kernels, in first-use order."""
        seen: dict[LoopKernel, None] = {}
        for step in self.steps:
            if isinstance(step, KernelStep):
                seen.setdefault(step.kernel, None)
        return list(seen)
