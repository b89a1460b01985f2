"""Loads and stores that tell LLVM which memory they cannot share, so a loop of gathers vectorises.

    load_source(array, index)           # array[index], from memory no store_result writes
    load_result(array, index)           # array[index], from memory store_result may write
    store_result(array, index, value)   # array[index] = value (cast to the array's dtype)
    add_scaled_group(sums, at, weight, row, at_row)
        # sums[at:at + GROUP] += weight * row[at_row:at_row + GROUP], float64, one vector
        # operation: sums a result, row a source

`index` is an integer for a 1-D array, else a tuple of one integer per axis,
never negative (no wraparound, no bounds check: the loops that use these
compute their indices).

Why they exist. LLVM vectorises a loop only when it can show that no store
of one iteration writes what a load of another reads. For accesses whose
address is affine in the loop counter it checks that at run time, but a
gather (`src[offsets[ow] + k]`, a bilinear tap) has a data-dependent
address: no run-time check can bound it, the vectoriser reports "cannot
identify array bounds", and the loop stays scalar. Numba has no `restrict`,
and marking every argument of a function `noalias` is not an option it
offers. LLVM's scoped alias metadata (LangRef: "!alias.scope and !noalias
Metadata") says exactly what the loop knows: its memory is of two kinds,
*sources* it only reads and *results* it writes, and the two never overlap.
A source load carries `!alias.scope !sources, !noalias !results`; a result
load or store carries the reverse. LLVM then treats every source access as
independent of every result access, and result accesses among themselves as
it always does (they may alias, and are checked or ordered).

The vectoriser puts any two accesses that may alias in one set, and does so
transitively, so *every* load of a loop meant to vectorise must be tagged: a
single untagged load (of `offsets`, say) may alias both a gather and a
store, and joins them into one set that needs the impossible check.

The contract, which each caller keeps: within one compiled function (after
inlining), memory read by `load_source` is never written by
`store_result`. Untagged loads and stores (plain indexing) stay ordered
against everything, so a buffer filled by plain stores in one loop may be
read by `load_source` in the next. Breaking the contract lets LLVM reorder
a store past a load of the same element: wrong values, silently. Hence the
narrow use: the warp loops (`library_vision`), whose sources (the image,
g, the row's taps) and results (the output row, the row's sums) are
distinct buffers, the memory plan never letting a library call write in
place; and a generated loop that adds its rows into a scatter's output
(`codegen`, `kernel.RowScatter`), whose inputs are sources and that output
the result: the memory plan never lets a group holding a scatter write over
its inputs, and a caller's `out=` array may not overlap a feed.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

_DOMAIN = "gradcompiler.alias_scopes"


def _scope_lists(module: ir.Module) -> tuple[ir.MDValue, ir.MDValue]:
    """(sources, results): the one-scope lists of the two scopes, in `module`. Metadata with
    equal contents is one node once modules are linked, so every function's tags agree."""
    domain = module.add_metadata([ir.MetaDataString(module, _DOMAIN)])
    sources = module.add_metadata([ir.MetaDataString(module, _DOMAIN + ".sources"), domain])
    results = module.add_metadata([ir.MetaDataString(module, _DOMAIN + ".results"), domain])
    return module.add_metadata([sources]), module.add_metadata([results])


def _element_type(array, index):
    """The array's dtype if `array[index]` is an element these take, else None (no match)."""
    if not (isinstance(array, types.Array) and isinstance(array.dtype, (types.Float, types.Integer))):
        return None
    indices = (index,) if isinstance(index, types.Integer) else getattr(index, "types", ())
    if len(indices) != array.ndim or not all(isinstance(i, types.Integer) for i in indices):
        return None
    return array.dtype


def _element_pointer(context, builder, array_type, index_type, array, index):
    """The address of array[index] (indices cast to intp: a uint64 index is not negative)."""
    if isinstance(index_type, types.Integer):
        indices = [context.cast(builder, index, index_type, types.intp)]
    else:
        indices = [context.cast(builder, builder.extract_value(index, i), t, types.intp)
                   for i, t in enumerate(index_type.types)]
    ary = context.make_array(array_type)(context, builder, array)
    return cgutils.get_item_pointer(context, builder, array_type, ary, indices, wraparound=False)


def _tag(instruction, module: ir.Module, source: bool) -> None:
    sources, results = _scope_lists(module)
    instruction.set_metadata("alias.scope", sources if source else results)
    instruction.set_metadata("noalias", results if source else sources)


def _load(source: bool):
    def typer(typingctx, array, index):
        dtype = _element_type(array, index)
        if dtype is None:
            return None

        def codegen(context, builder, signature, args):
            load = builder.load(_element_pointer(context, builder, *signature.args, *args))
            _tag(load, builder.module, source)
            return load

        return dtype(array, index), codegen

    return typer


load_source = intrinsic(_load(source=True))
load_source.__doc__ = "array[index], from memory that no `store_result` of this function writes."
load_result = intrinsic(_load(source=False))
load_result.__doc__ = "array[index], from memory that `store_result` may write."


@intrinsic
def store_result(typingctx, array, index, value):
    """array[index] = value, cast to the array's dtype, into memory no `load_source` reads."""
    dtype = _element_type(array, index)
    if dtype is None or not isinstance(value, (types.Float, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        array_type, index_type, value_type = signature.args
        stored = context.cast(builder, args[2], value_type, array_type.dtype)
        store = builder.store(stored, _element_pointer(context, builder, array_type, index_type, *args[:2]))
        _tag(store, builder.module, source=False)
        return context.get_dummy_value()

    return types.none(array, index, value), codegen


GROUP = 4   # float64 lanes of `add_scaled_group`: one 256-bit register


@intrinsic
def add_scaled_group(typingctx, sums, at, weight, row, at_row):
    """sums[at:at + GROUP] += weight * row[at_row:at_row + GROUP]: one load, multiply, add
    and store of <GROUP x double>, so the lanes' values are those of GROUP scalar updates (a
    multiply, then an add). sums is a result, row a source (the module's contract); both are
    1-D float64 arrays and neither range is checked.

    Why an intrinsic: GROUP adjacent scalar updates are what LLVM's SLP vectoriser packs,
    and Numba turns that vectoriser off (numba#8705); a loop over the lanes is unrolled
    before the loop vectoriser sees it. A scatter that adds a pixel's channels into one
    element's channel group (`library_vision._scatter_row`) would stay GROUP scalar
    read-modify-writes."""
    if not all(isinstance(a, types.Array) and a.ndim == 1 and a.dtype == types.float64 for a in (sums, row)):
        return None
    if not (isinstance(at, types.Integer) and isinstance(at_row, types.Integer)
            and isinstance(weight, (types.Float, types.Integer))):
        return None

    def codegen(context, builder, signature, args):
        sums_type, at_type, weight_type, row_type, at_row_type = signature.args
        sums_array, at_value, weight_value, row_array, at_row_value = args
        group = ir.VectorType(ir.DoubleType(), GROUP)
        target = builder.bitcast(_element_pointer(context, builder, sums_type, at_type, sums_array, at_value),
                                 group.as_pointer())
        source = builder.bitcast(_element_pointer(context, builder, row_type, at_row_type, row_array, at_row_value),
                                 group.as_pointer())
        old = builder.load(target, align=8)
        _tag(old, builder.module, source=False)
        values = builder.load(source, align=8)
        _tag(values, builder.module, source=True)
        scalar = context.cast(builder, weight_value, weight_type, types.float64)
        lanes = builder.insert_element(ir.Constant(group, ir.Undefined), scalar, ir.Constant(ir.IntType(32), 0))
        splat = builder.shuffle_vector(lanes, ir.Constant(group, ir.Undefined),
                                       ir.Constant(ir.VectorType(ir.IntType(32), GROUP), [0] * GROUP))
        store = builder.store(builder.fadd(old, builder.fmul(splat, values)), target, align=8)
        _tag(store, builder.module, source=False)
        return context.get_dummy_value()

    return types.none(sums, at, weight, row, at_row), codegen
