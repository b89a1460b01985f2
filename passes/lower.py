"""Lowering: the fused graph and its `FusionPlan` become a Kernel IR `Program`.

    lower(graph, plan, memory) -> Program

Every materialised value gets a flat buffer (`BufferSpec`): feeds,
constants, group outputs (placed in the memory plan's shared storage when
there is one; a donated output in its feed's buffer) and aliases
(reshape-like views sharing their root's buffer). Each group becomes steps, in plan order: a `FusedLoop` one
`KernelStep`; a `FusedLibrary` a `LibraryStep`, then its epilogue kernel,
which updates the call's output in place (the call writes straight into the
epilogue's output buffer).

A loop is emitted phase by phase with a `ConeWalker` whose visits produce
SSA variables: a buffer read is a `Load` through the index map the walk
carried down, an elementwise op a `Compute`, a Fill or one-element constant
a load of a one-element constant buffer (constants are never pasted into
code). A root the same phase computed is its variable; a row reduction of
an earlier phase is a `RowValue` (a register); any other value of an
earlier phase is read back from its output buffer, or, when nothing
outside the loop needs it, from a per-thread `row` scratch buffer.
Parameters are numbered in order of first use, so equal structures lower
to equal kernels whatever their node ids.

A scatter-add of rows onto a Fill (`fuse.scatters_rows_onto_fill`) becomes
a `FilledScatter` step that reads the value and the index alone: the Fill
has no buffer, and the call fills its output itself. A loop that makes the
scatter (`FusedLoop.scatter`) lowers it as its `RowScatter`: the rows' value
is neither stored nor given a buffer, the scatter's output is an `out`
parameter, the Fill's value a one-element input, and the lookups' positions
come from a `RowPositions` step, the gather's where the loop absorbed a
gather of the same index and table shape.

A call with siblings (`FusedLibrary.siblings`) becomes one `LibraryStep`
whose op is a `SiblingCalls`: it reads the union of the calls' inputs and
writes one buffer per call.

Absorbed gathers (`absorb_gathers`, the CPU target): a gather of whole rows,
`table[idx]`, whose values only its epilogue reads, is not copied. The call
becomes a `RowPositions` step, which checks and wraps the index as the
gather would and writes where each row starts; the epilogue reads the rows
from the table through those positions (`Load.offset`). The gathered values
are then never written and read back: the embedding step ran in 0.90 of the
time (3.6-3.7 ms against 4.0-4.1, four of five alternated pairs of processes,
one even). The CUDA target keeps the call: its gather has no positions step.
"""

from __future__ import annotations

import math

import numpy as np

from gradcompiler.cones import ConeWalker, node_class, reduced_axes
from gradcompiler.index_expr import Index, ravel
from gradcompiler.ir import Graph, Node
from gradcompiler.kernel import (
    BufferParam,
    BufferSpec,
    Compute,
    FilledScatter,
    Instr,
    KernelStep,
    LibraryStep,
    Load,
    LoopKernel,
    Phase,
    Program,
    Reduction,
    RowPositions,
    RowScatter,
    RowValue,
    SiblingCalls,
    Store,
)
from gradcompiler.ops.elemwise import Cast, Elemwise, StopGradient
from gradcompiler.ops.reduce import Reduce
from gradcompiler.ops.shape import FastpathCopy
from gradcompiler.ops.source import Constant, Fill, Placeholder

from .fuse import FusedLibrary, FusedLoop, cone_buffers, gathers_whole_rows, scatters_rows_onto_fill
from .groups import FusionPlan
from .memory import MemoryPlan

_IDENTITY_OPS = (StopGradient, FastpathCopy)
_REDUCE_MODES = {"SUM": "SUM", "MEAN": "SUM", "SUM_SQR": "SUM", "PRODUCT": "PRODUCT", "MAX": "MAX", "MIN": "MIN"}


def is_row_scalar(graph: Graph, node: Node) -> bool:
    """A reduction over every axis but axis 0: one value per row, kept in a register."""
    if node_class(node) != "reduction":
        return False
    ndim = graph[node.inputs[0]].type.ndim
    return ndim >= 2 and reduced_axes(graph, node) == tuple(range(1, ndim))


class _LoopEmitter(ConeWalker[int]):
    """Emits one FusedLoop as a LoopKernel whose parameters are bound to the program's buffers."""

    def __init__(self, graph: Graph, loop: FusedLoop, program: _ProgramBuilder):
        roots = set(loop.roots)
        external = {i for i in loop.inputs if node_class(graph[i]) != "scalar_source"
                    or program.is_materialised(i)}
        super().__init__(graph, loop.domain, lambda n: n in roots or n in external)
        self.loop = loop
        self.program = program
        self.phase_of = dict(zip(loop.roots, loop.phases))
        self.params: list[BufferParam] = []
        self.args: list[int | None] = []
        self.param_of: dict[tuple, int] = {}
        self.instrs: list[Instr] = []
        self.next_var = 0
        self.root_var: dict[int, int] = {}
        self.reduction_index: dict[int, int] = {}
        self.reductions = 0
        self.phase = 0
        self.read_later = self._read_by_later_phases(external)

    def _read_by_later_phases(self, external: set[int]) -> set[int]:
        materialised = set(self.loop.roots) | external
        later = set()
        for root in self.loop.roots:
            for d in cone_buffers(self.graph, root, materialised.__contains__):
                if d in self.phase_of and self.phase_of[d] < self.phase_of[root]:
                    later.add(d)
        return later

    # -- parameters -----------------------------------------------------------------------
    def _param(self, key: tuple, role: str, dtype: np.dtype, size: int, buffer: int | None) -> int:
        if key not in self.param_of:
            shared = self._param_of_buffer(role, np.dtype(dtype), int(size), buffer)
            if shared is not None:
                # an output updating its input in place: one parameter, read and written,
                # so LLVM sees one pointer; two parameters holding the same array fail the
                # vectoriser's run-time overlap check and the loop runs scalar (4x slower)
                self.param_of[key] = shared
                if role == "out":  # bound to the output's buffer: the step writes that one
                    self.params[shared] = BufferParam("out", np.dtype(dtype), int(size))
                    self.args[shared] = buffer
            else:
                self.param_of[key] = len(self.params)
                self.params.append(BufferParam(role, np.dtype(dtype), int(size)))
                self.args.append(buffer)
        return self.param_of[key]

    def _param_of_buffer(self, role: str, dtype: np.dtype, size: int, buffer: int | None) -> int | None:
        """The in/out parameter already bound to `buffer`'s memory with the same type, if any."""
        if buffer is None or role not in ("in", "out"):
            return None
        memory = self.program.memory_of(buffer)
        for index, (param, arg) in enumerate(zip(self.params, self.args)):
            if (arg is not None and param.role in ("in", "out") and param.dtype == dtype and param.size == size
                    and self.program.memory_of(arg) == memory):
                return index
        return None

    def _node_param(self, node: Node, role: str) -> int:
        if role == "row":
            size = math.prod(node.type.shape[1:])
            return self._param(("row", node.id), "row", node.type.dtype, size, None)
        return self._param((role, node.id), role, node.type.dtype, node.type.size, self.program.buffer(node.id))

    # -- emission ---------------------------------------------------------------------------
    def _emit(self, expr, dtype) -> int:
        var = self.next_var
        self.next_var += 1
        self.instrs.append(Instr(var, expr, np.dtype(dtype)))
        return var

    def read(self, node, index):
        d = node.id
        if d in self.program.row_positions:
            return self._read_gathered_row(node, index)
        if d in self.phase_of:
            if self.phase_of[d] == self.phase:
                return self.root_var[d]
            if d in self.reduction_index and is_row_scalar(self.graph, node):
                return self._emit(RowValue(self.reduction_index[d]), node.type.dtype)
            if d in self.loop.outputs:
                return self._emit(Load(self._node_param(node, "out"), ravel(index, node.type.shape)), node.type.dtype)
            row = ravel(index[1:], node.type.shape[1:])
            return self._emit(Load(self._node_param(node, "row"), row), node.type.dtype)
        return self._emit(Load(self._node_param(node, "in"), ravel(index, node.type.shape)), node.type.dtype)

    def _read_gathered_row(self, node: Node, index) -> int:
        """`table[idx]` at `index`, read from the table through the row's position (an absorbed
        gather, `_ProgramBuilder.add_library`): the position at the index's leading axes
        (idx's), then the row at its trailing ones."""
        table, idx = (self.graph[i] for i in node.inputs)
        lead = idx.type.ndim
        positions = self._param(("positions", node.id), "in", np.dtype(np.int64), idx.type.size,
                                self.program.row_positions[node.id])
        offset = self._emit(Load(positions, ravel(index[:lead], idx.type.shape)), np.int64)
        row = ravel(index[lead:], table.type.shape[1:])
        return self._emit(Load(self._node_param(table, "in"), row, offset), node.type.dtype)

    def scalar(self, node):
        buffer = self.program.scalar_buffer(node)
        param = self._param(("value", node.id), "in", node.type.dtype, 1, buffer)
        return self._emit(Load(param, Index.lit(0)), node.type.dtype)

    def compute(self, node, args):
        if isinstance(node.op, _IDENTITY_OPS):
            return args[0]
        return self._emit(Compute(node.op, tuple(args)), node.type.dtype)

    def kernel(self) -> tuple[LoopKernel, tuple[int | None, ...]]:
        phases, scatter = [], None
        for phase in range(max(self.loop.phases, default=0) + 1):
            self.phase, self.instrs = phase, []
            self.reset()
            stores, reductions = [], []
            for root in self.loop.roots:
                if self.phase_of[root] != phase:
                    continue
                node = self.graph[root]
                var = self.root_var[root] = self.define(root)
                if node_class(node) == "reduction":
                    reductions.append(self._reduction(node, var))
                    continue
                if root in self.loop.outputs:
                    stores.append(Store(self._node_param(node, "out"), var))
                if self.loop.scatter is not None and root == self.graph[self.loop.scatter].inputs[1]:
                    scatter = self._row_scatter(phase, var)
                if root in self.read_later and root not in self.loop.outputs:
                    stores.append(Store(self._node_param(node, "row"), var))
            phases.append(Phase(tuple(self.instrs), tuple(stores), tuple(reductions)))
        return LoopKernel(tuple(self.loop.domain), tuple(self.params), tuple(phases), scatter), tuple(self.args)

    def _row_scatter(self, phase: int, var: int) -> RowScatter:
        """The scatter the loop feeds (`FusedLoop.scatter`), made as `var` is: the rows are added
        into the scatter's output, which the loop fills (module docstring)."""
        call = self.graph[self.loop.scatter]
        fill, _, index = (self.graph[i] for i in call.inputs)
        positions = self.program.row_positions_of(call, index.id, fill.type.shape, self.loop.name)
        return RowScatter(out=self._node_param(call, "out"),
                          fill=self._param(("value", fill.id), "in", fill.type.dtype, 1,
                                           self.program.scalar_buffer(fill)),
                          positions=self._param(("positions", call.id), "in", np.dtype(np.int64),
                                                index.type.size, positions),
                          phase=phase, var=var)

    def _reduction(self, node: Node, var: int) -> Reduction:
        mode = node.op.mode if isinstance(node.op, Reduce) else "SUM"
        axes = reduced_axes(self.graph, node)
        if mode == "SUM_SQR":
            var = self._emit(Compute(Elemwise("MUL"), (var, var)), node.type.dtype)
        if self.graph[node.inputs[0]].type.dtype != node.type.dtype:  # an integer sum: in 64 bits
            var = self._emit(Compute(Cast(node.type.dtype), (var,)), node.type.dtype)
        divisor = math.prod([self.loop.domain[a] for a in axes]) if mode == "MEAN" else None
        if node.id in self.loop.outputs:
            param = self._node_param(node, "out")
        elif is_row_scalar(self.graph, node):
            param = None
        else:
            param = self._node_param(node, "row")
        self.reduction_index[node.id] = self.reductions
        self.reductions += 1
        return Reduction(param, var, _REDUCE_MODES[mode], axes, divisor)


class _ProgramBuilder:
    def __init__(self, graph: Graph, plan: FusionPlan, memory: MemoryPlan | None, absorb_gathers: bool):
        self.graph = graph
        self.plan = plan
        self.memory = memory
        self.absorb_gathers = absorb_gathers
        self.row_positions: dict[int, int] = {}  # absorbed gather -> the buffer of its row positions
        self.positions_of: dict[tuple, int] = {}  # (index, table shape) -> a buffer of those positions
        self.buffers: list[BufferSpec] = []
        self.buffer_of: dict[int, int] = {}
        self.scalar_of: dict[int, int] = {}
        self.steps = []
        self.materialised = {n for g in plan.groups for n in g.outputs}

    def is_materialised(self, node_id: int) -> bool:
        return node_id in self.materialised

    def _add(self, spec: BufferSpec, node_id: int | None) -> int:
        self.buffers.append(spec)
        if node_id is not None:
            self.buffer_of[node_id] = len(self.buffers) - 1
        return len(self.buffers) - 1

    def buffer(self, node_id: int) -> int:
        """The program buffer holding node `node_id`'s value, made on first use."""
        if node_id not in self.buffer_of:
            node = self.graph[node_id]
            t = node.type
            if isinstance(node.op, Placeholder):
                spec = BufferSpec(t.shape, t.dtype, "feed", node_id, feed_name=node.op.feed_name)
            elif isinstance(node.op, Constant):
                spec = BufferSpec(t.shape, t.dtype, "const", node_id, value=node.op.value.array)
            elif self.memory is not None and node_id in self.memory.donated:
                self.buffer_of[node_id] = self.buffer(self.memory.donated[node_id])
                return self.buffer_of[node_id]
            else:
                storage = self.memory.buffers.get(node_id) if self.memory is not None else None
                spec = BufferSpec(t.shape, t.dtype, "temp", node_id, storage=storage)
            self._add(spec, node_id)
        return self.buffer_of[node_id]

    def memory_of(self, buffer: int) -> tuple[str, int]:
        """Where `buffer`'s elements live: its memory plan storage, else its own (or, for a
        view, its root's) buffer. Two buffers of one storage with one dtype and size are one
        array at run time (the arena's first bytes, or the output array the arena's place
        hands over to); within one kernel that is an output written over the input that dies
        there (`memory._in_place_safe`), or a view read beside its root."""
        spec = self.buffers[buffer]
        root = spec.alias_of if spec.alias_of is not None else buffer
        storage = self.buffers[root].storage
        return ("storage", storage) if storage is not None else ("buffer", root)

    def scalar_buffer(self, node: Node) -> int:
        """A one-element constant buffer holding a Fill's or a one-element constant's value."""
        if node.id not in self.scalar_of:
            if isinstance(node.op, Fill):
                value = np.full(1, node.op.value, dtype=node.type.dtype)
            else:
                value = node.op.value.array.reshape(1)
            self.scalar_of[node.id] = self._add(BufferSpec((1,), node.type.dtype, "const", node.id, value=value), None)
        return self.scalar_of[node.id]

    def add_loop(self, loop: FusedLoop) -> None:
        kernel, args = _LoopEmitter(self.graph, loop, self).kernel()
        made = (loop.scatter,) if loop.scatter is not None else ()
        self.steps.append(KernelStep(loop.name, kernel, args, tuple(loop.computes) + made))

    def add_library(self, group: FusedLibrary) -> None:
        if group.siblings:  # never with an epilogue (fuse)
            self.add_sibling_calls(group)
            return
        call = self.graph[group.call]
        epilogue = group.epilogue
        if epilogue is not None and self.absorb_gathers and gathers_whole_rows(call):
            self.add_absorbed_gather(group)
            return
        if epilogue is not None:
            donated = self.memory.donated if self.memory is not None else {}
            target = next(r for r in epilogue.outputs if r not in donated
                          and node_class(self.graph[r]) != "reduction"
                          and self.graph[r].type == call.type)
            self.buffer_of[call.id] = self.buffer(target)
        op, operands = call.op, call.inputs
        if scatters_rows_onto_fill(self.graph, call):
            op, operands = FilledScatter(call.op, self.graph[call.inputs[0]].op), call.inputs[1:]
        inputs = tuple(self.buffer(i) for i in operands)
        self.steps.append(LibraryStep(group.name, op, inputs, (self.buffer(call.id),), (call.id,)))
        if epilogue is not None:
            self.add_loop(epilogue)

    def add_sibling_calls(self, group: FusedLibrary) -> None:
        """A call and its siblings as one step: the union of their inputs, one output each."""
        calls = [self.graph[c] for c in (group.call, *group.siblings)]
        values = list(dict.fromkeys(i for call in calls for i in call.inputs))
        op = SiblingCalls(tuple(call.op for call in calls),
                          tuple(tuple(values.index(i) for i in call.inputs) for call in calls))
        self.steps.append(LibraryStep(group.name, op, tuple(self.buffer(i) for i in values),
                                      tuple(self.buffer(call.id) for call in calls),
                                      tuple(call.id for call in calls)))

    def row_positions_of(self, call: Node, index: int, shape: tuple[int, ...], name: str) -> int:
        """The buffer of the row positions `index` picks in a table of `shape`, for `call` (a
        gather or scatter of whole rows): a `RowPositions` step's, which checks the index as
        `call` would, made here unless an earlier step made the same positions."""
        key = (index, shape)
        if key not in self.positions_of:
            positions = self._add(BufferSpec(self.graph[index].type.shape, np.dtype(np.int64), "temp"), None)
            self.steps.append(LibraryStep(f"{name}_positions", RowPositions(call.op, shape),
                                          (self.buffer(index),), (positions,), (call.id,)))
            self.positions_of[key] = positions
        return self.positions_of[key]

    def add_absorbed_gather(self, group: FusedLibrary) -> None:
        """A gather of whole rows read by its epilogue alone: the call checks the index and
        writes each row's position, and the epilogue reads the rows from the table itself
        (module docstring), so the gathered values are never written and read back."""
        call = self.graph[group.call]
        table, idx = (self.graph[i] for i in call.inputs)
        self.row_positions[call.id] = self.row_positions_of(call, idx.id, table.type.shape, group.name)
        self.add_loop(group.epilogue)

    def add_alias(self, group) -> None:
        node = self.graph[group.outputs[0]]
        source = self.buffer(node.inputs[0])
        root = self.buffers[source].alias_of if self.buffers[source].alias_of is not None else source
        self._add(BufferSpec(node.type.shape, node.type.dtype, "alias", node.id, alias_of=root), node.id)

    def build(self) -> Program:
        for group in self.plan.groups:
            if isinstance(group, FusedLibrary):
                self.add_library(group)
            elif isinstance(group, FusedLoop):
                self.add_loop(group)
            elif group.kind == "alias":
                self.add_alias(group)
        donated = self.memory.donated if self.memory is not None else {}
        return Program(self.buffers, self.steps, [self.buffer(o) for o in self.graph.outputs],
                       frozenset(k for k, o in enumerate(self.graph.outputs) if o in donated))


def lower(graph: Graph, plan: FusionPlan, memory: MemoryPlan | None = None, *,
          absorb_gathers: bool = False) -> Program:
    """The Kernel IR program of `graph` executed as `plan` says (module docstring);
    `absorb_gathers` where the target reads rows through positions (`RowPositions`)."""
    return _ProgramBuilder(graph, plan, memory, absorb_gathers).build()
