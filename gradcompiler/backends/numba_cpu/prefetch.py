"""Software prefetches for the loops whose next accesses the hardware cannot guess.

    prefetch_read(array, index)    # the cache line holding array[index], to be read
    prefetch_write(array, index)   # ... to be written (fetched for ownership)

Why they exist. The hardware prefetchers follow a stream of addresses only
within a 4 KB page, and only while the stream's own misses keep coming, so
two access patterns of ours leave the core waiting on memory:

* Random rows of a table (the embedding gather): no stream to follow. The
  gather asks for the row a few indices ahead (`library_indexing`).
* A row visited by several passes (a layer norm's mean, variance, then the
  heavy pass of its forward and backward): the first, light pass over the
  next row misses on every line, because no prefetcher ran ahead into a page
  that the heavy pass never touched, and the last pass's stores wait for
  their lines' ownership. The generated code asks for the next row's lines
  during the current row's heaviest pass (`codegen` module docstring).

A prefetch is a hint: it never faults, so an address past the end of the
array (the last row asking for the one after it) is harmless, and it
changes no value. Each is one `llvm.prefetch` into the L1 data cache
(locality 3); `index` counts elements of the array, as an index does.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic

CACHE_LINE = 64
"""Bytes a prefetch brings in: one per this many bytes covers a run."""

GATHER_AHEAD = 8
"""Indices ahead whose table row a gather asks for while reading the current one (the library
gather, and a loop reading a gather it absorbed): the rows are random, so no hardware
prefetcher finds them; 4 to 16 ahead gathered the embedding's 65,536 rows of 256 bytes in
0.6-0.8 of the time (blocks of 40 calls in turn, one process), and the fused tanh loop over
them in 0.57 (1.42 ms against 2.51 with none)."""


def emit_prefetch(builder: ir.IRBuilder, address: ir.Value, write: int) -> None:
    """The `llvm.prefetch` of the line at `address` into the L1 data cache, for an intrinsic that
    emits its own IR (the matrix products' micro-tile). The address is cast to a byte pointer:
    a module declares the intrinsic once, so a function that asks for lines of two dtypes (a
    float table and its int indices) would otherwise call it with a second pointer type."""
    i32 = ir.IntType(32)
    address = builder.bitcast(address, ir.IntType(8).as_pointer())
    hint = ir.FunctionType(ir.VoidType(), [address.type, i32, i32, i32])
    call = cgutils.get_or_insert_function(builder.module, hint, "llvm.prefetch.p0")
    builder.call(call, [address, i32(write), i32(3), i32(1)])   # rw, locality, data cache


def _prefetch(write: int):
    def typer(typingctx, array, index):
        if not (isinstance(array, types.Array) and isinstance(index, types.Integer)):
            return None

        def codegen(context, builder, signature, args):
            data = context.make_array(signature.args[0])(context, builder, args[0]).data
            emit_prefetch(builder, builder.gep(data, [args[1]]), write)
            return context.get_dummy_value()

        return types.none(array, index), codegen

    return typer


prefetch_read = intrinsic(_prefetch(0))
prefetch_read.__doc__ = "Bring the line holding array[index] into the L1 cache, to be read."
prefetch_write = intrinsic(_prefetch(1))
prefetch_write.__doc__ = "Bring the line holding array[index] into the L1 cache, owned, to be written."
