"""Register-blocked matrix products of our own, for the shapes BLAS serves worst.

    Multiplier()(a3, b3, out3)   # out3[i] = a3[i] @ b3[i], float32 or float64, any strides

Why it exists. A batched product of small matrices (attention's 16 products
of 256×64 by 64×256, and their gradients) ran at 110-150 GFLOP/s per
thread through OpenBLAS's SkylakeX kernel, against about 190 for a large
square product on the same core: it packs both operands of every item into
buffers of its own and blocks them as it would a large matrix. The product
written here ran those items at 160 GFLOP/s on one thread (one core of an
AVX-512 Xeon guest); in the attention step a batched product takes
0.59-0.70 ms on two threads against 0.73-0.81 ms before, when each thread
called single-threaded OpenBLAS on its items (per-call profiles).
It takes large 2-D products too, at 0.86-1.00 of OpenBLAS's time alone on gpt's and
the mlp's shapes (two threads of a Zen 5 guest, 470-550 GFLOP/s float32, operands in cache),
and one pool of threads serves every kernel of a step (`library_linalg`).

How (the BLIS design, in Numba):

* The micro-kernel (`_micro_tile`, an intrinsic emitting LLVM IR) keeps an
  MR × NR tile of C in registers: NR is two vectors, and with AVX-512 (32
  registers of 64 bytes) MR = 8 rows by 32 float32 or 16 float64 columns,
  sixteen accumulators. Each step of k loads two vectors of B, broadcasts
  eight values of A, and issues sixteen fused multiply-adds; the tile is
  stored (or added to C) once at the end. Without AVX-512 the vectors are
  32 bytes and MR is 6 (twelve accumulators of AVX2's sixteen registers).
* A row-major A is read where it lies, the tile's eight rows at stride lda:
  packing it would cost a pass over A, as much as the product reads of it
  when B has few columns (attention's 256×256 by 256×64). Unless its rows
  lie a multiple of 4 KB apart (`L1_ALIASING`): then the tiles of the first
  panel gather what they read into micro-panels, as below. A transposed A
  (its rows adjacent, as Pᵀ in Pᵀ·dO) is packed into micro-panels (MR values
  per step of k) by the tiles of the first panel of B, which load each
  step's values as one vector and store it as they go; they copy the next
  micro-panel too, the other half of the same cache lines. The other panels
  read the packed copy. In place, each step of k would move a whole row of
  the view: at a power-of-two row that walk maps onto a few L1 sets, and
  every panel fetched A again (16 items of 256×64ᵀ by 64×256: 691-711 µs
  in place, 544-563 packed, two threads, alternated in one process).
* B is packed per block of KC rows into panels of NR columns, k-major, so
  each step of k reads one contiguous line pair; a panel (KC × NR, 32 KB for
  float32) stays in L1 while the tile walks down every row of A. Packing
  also removes B's stride, which at a power of two (a 1 KB row) would map
  every row of the panel onto a handful of L1 sets. A transposed B (Kᵀ in
  Q·Kᵀ) is packed in L × L squares transposed in registers
  (`transpose_square`, L a vector's lanes) rather than value by value:
  Q·Kᵀ over 16 items went from 636-654 µs to 548-575.
* Rows of A are taken MC at a time (their KC columns stay in L2 while
  every panel of B passes). Edges: the last rows of A are packed into a
  zero-padded micro-panel, the last columns of B are zero-padded in their
  panel, and the tile of an edge goes through a scratch tile from which the
  valid part is copied. K = 0 gives zeros.
* Threads: a batch of at least one item per thread splits by items; a
  smaller batch splits each product by columns or by rows, whichever makes
  the threads repeat the smaller operand. Split by columns, each thread
  packs only its own panels of B but reads (or packs) all of A; split by
  rows, each reads its own rows of A but packs all of B. So a product with
  more rows than columns (gpt's 1024 × 1024ᵀ by 1024 × 256 weight gradient:
  2.41-2.48 ms by rows against 2.77-2.81 by columns, in its step), or too
  few columns to share, splits by rows.

NaN and infinities propagate as in any sum of products: the padding is
zeros in rows and columns whose results are discarded.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, prange, types
from numba.core import cgutils
from numba.extending import intrinsic

from . import buffers, library
from .cpu_profile import PROFILE
from .prefetch import CACHE_LINE, emit_prefetch, prefetch_read

VECTOR_BYTES = PROFILE.vector_bytes
"""Bytes of the vectors the micro-tile is written in: the widest LLVM emits for the CPU profile."""

MR = PROFILE.mr
"""Rows of the register tile: MR × VECTORS accumulators, with room left for B's vectors."""

VECTORS = 2
"""Vectors across the tile's columns: NR = VECTORS × lanes."""

WIDE_VECTORS = PROFILE.wide_vectors
"""Vectors across the wide summed tile (`micro_tile_sum_wide`): with 32 registers, MR × 3 = 24
accumulators, three vectors of B and a broadcast take 28, and each step of k issues 24
multiply-adds for 11 loads instead of 16 for 10 (a direct convolution's forward tiles three
output rows). 16 registers hold no more than MR × VECTORS."""

KC = 256
"""Rows of B per packed block: a panel of KC × NR is at most 32 KB, within L1."""

B_AHEAD = 8
"""Rows ahead of the one being packed whose lines `_pack_panels` asks for (`prefetch`): a row-major
B is read a row at a time, a short run (a thread's share of the row: 1 KB in the mlp) and then a
jump to the next row, too short a stream for the hardware prefetchers to run ahead of. With B
not in cache, as it is in a step where the weights were last touched a whole step before, the
mlp's 256 × 784 by 784 × 512 product took 0.70-0.88 of its time, gpt's 256 × 1024 by
1024 × 256 weight gradients 0.85-0.87 (cold caches, alternated in one process; with every
operand in cache 0.96-1.03 over nine shapes). Whole steps, alternated in one process: gpt
0.955-0.963 of its time, the mlp 0.966-0.971. 4 and 16 rows ahead: no better."""


MC = 512 // MR * MR
"""Rows of A per block: with KC columns, about 512 KB of float32, within L2. A whole number of
micro-panels: the scratch that packs a block's last, partial micro-panel holds MC rows."""

A_AHEAD = 16
"""Steps of k ahead whose values of a transposed A the tiles that pack it ask for (`prefetch`):
each step of k is a row of the view away (4 KB for gpt's 1024 × 1024), beyond the 4 KB page
that bounds the hardware prefetchers, so without the hint each step waits on memory when A was
written by an earlier kernel. In gpt's step its 1024 × 1024ᵀ by 1024 × 256 weight gradient took
2.74 ms against 3.08-3.19 with none (8, 32 and 64 steps ahead: no better)."""

L1_ALIASING = 4096
"""Bytes between addresses that share an L1 set (64 sets of 64-byte lines, as in the 32 KB
8-way and 48 KB 12-way L1 caches of x86 cores): a row-major A whose rows lie a multiple of
this apart puts a tile's MR rows in one set, beside the lines of B's panel. Such an A is
packed by the tiles of the first panel (`_micro_tile_gathering`), and the others read the
copy: in gpt's step, 1024 × 1024 by 1024 × 256 products took 1.98-2.23 ms against 2.13-2.37,
and 1024 × 2048 by 2048 × 256 3.87-3.91 against 4.55-4.66. At other strides the copy did not
pay (1024 × 256 by 256 × 256: 569 against 526-533 µs)."""

_LANES = {types.float32: VECTOR_BYTES // 4, types.float64: VECTOR_BYTES // 8}

OWN_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
"""The dtypes these products serve (others go to numpy)."""


def panel_width(dtype: np.dtype) -> int:
    """NR, the columns of a tile (and of a packed panel of B) for `dtype`."""
    return VECTORS * (VECTOR_BYTES // np.dtype(dtype).itemsize)


def _element_pointer(context, builder, array_type, array, offset):
    """A pointer to element `offset` of a Numba array, counted from its data pointer."""
    return builder.gep(context.make_array(array_type)(context, builder, array).data, [offset])


def _tile_codegen(lanes, copies, adjacent=True, summed=False, vectors=VECTORS):
    """The LLVM IR of `_micro_tile` (copies 0) or of `_micro_tile_copying` (1: the tile's own
    micro-panel) and `_micro_tile_copying_pair` (2: the next one's too), whose A has its rows
    adjacent, or of `_micro_tile_gathering` (copies 1, rows apart); with `summed`, of
    `micro_tile_sum` (a sum of products over offset pairs, B's rows at a stride) with `vectors`
    vectors across its columns."""

    def codegen(context, builder, signature, args):
        i64, i32 = ir.IntType(64), ir.IntType(32)
        if summed:
            (a_, a_off, a_rs, a_ks, a_terms, p_, p_off, b_ks, b_vs, b_terms, c_, c_off, c_rs, c_vs, depth_,
             accumulate_) = args
            c_position = 10
        else:
            (a_, a_off, a_rs, a_ks, p_, p_off, c_, c_off, c_rs, depth_, accumulate_) = args[:11]
            b_ks, c_position = ir.Constant(i64, vectors * lanes), 6
            b_vs = c_vs = ir.Constant(i64, lanes)
        scalar = context.get_data_type(signature.args[0].dtype)
        vector = ir.VectorType(scalar, lanes)
        fma = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vector, [vector] * 3), f"llvm.fma.v{lanes}{scalar.intrinsic_name}")

        def base(position, value, offset):
            return _element_pointer(context, builder, signature.args[position], value, offset)

        def const(n):
            return ir.Constant(i64, n)

        def loop_head(name, starts):
            """A new block, branched to from the current one: its counter (from 0) and the phis of
            the tile's MR × vectors sums (from `starts`)."""
            came_from, block = builder.block, builder.function.append_basic_block(name)
            builder.branch(block)
            builder.position_at_end(block)
            counter = builder.phi(i64)
            counter.add_incoming(const(0), came_from)
            grid = [[builder.phi(vector) for _ in range(vectors)] for _ in range(MR)]
            for row, values in zip(grid, starts):
                for acc, value in zip(row, values):
                    acc.add_incoming(value, came_from)
            return block, counter, grid

        a_start, panel_start, c_start = base(0, a_, a_off), base(4 + summed, p_, p_off), base(c_position, c_, c_off)
        start_values = [[ir.Constant(vector, [0.0] * lanes)] * vectors for _ in range(MR)]
        if summed:  # an outer loop over the terms: each moves A and B to its own offsets
            term_loop, term, sums = loop_head("tile_term", start_values)

            def offset(position, array, index):
                return builder.load(base(position, array, index))

            a_start = builder.gep(a_start, [offset(4, a_terms, term)])
            panel_start = builder.gep(panel_start, [offset(9, b_terms, term)])
            start_values = sums
        loop, k, tile = loop_head("tile_k", start_values)
        done = builder.function.append_basic_block("tile_done")
        b_row = builder.gep(panel_start, [builder.mul(k, b_ks)])
        b = [builder.load(builder.bitcast(builder.gep(b_row, [builder.mul(const(v), b_vs)]), vector.as_pointer()),
                          align=4) for v in range(vectors)]
        a_k = builder.mul(k, a_ks)
        column_type = ir.VectorType(scalar, MR)
        if copies and adjacent:  # the step's MR values of A (and the next micro-panel's): one vector
            # this walk of A moves a whole row of the view per step: no hardware prefetcher follows it
            emit_prefetch(builder, builder.gep(a_start, [builder.add(a_k, builder.mul(const(A_AHEAD), a_ks))]), 0)
            run_type = ir.VectorType(scalar, copies * MR)
            run = builder.load(builder.bitcast(builder.gep(a_start, [a_k]), run_type.as_pointer()), align=4)
            columns = [builder.shuffle_vector(run, ir.Constant(run_type, ir.Undefined), ir.Constant(
                ir.VectorType(i32, MR), list(range(panel * MR, panel * MR + MR)))) for panel in range(copies)]
            broadcasts = [builder.shuffle_vector(run, ir.Constant(run_type, ir.Undefined),
                                                 ir.Constant(ir.VectorType(i32, lanes), [r] * lanes))
                          for r in range(MR)]
        else:  # MR values at a stride of a_row_step, each loaded and splat (and gathered, to copy)
            undef = ir.Constant(vector, ir.Undefined)
            splat = ir.Constant(ir.VectorType(i32, lanes), [0] * lanes)
            rows = [builder.gep(a_start, [builder.add(builder.mul(const(r), a_rs), a_k)]) for r in range(MR)]
            values = [builder.load(row, align=4) for row in rows]
            columns = []
            if copies:
                column = ir.Constant(column_type, ir.Undefined)
                for r, value in enumerate(values):
                    column = builder.insert_element(column, value, ir.Constant(i32, r))
                columns.append(column)
            broadcasts = [builder.shuffle_vector(builder.insert_element(
                undef, value, ir.Constant(i32, 0)), undef, splat) for value in values]
        copy_start = base(11, args[11], args[12]) if copies else None
        for panel, column in enumerate(columns):  # the step's column of each copied micro-panel
            copy_at = builder.gep(copy_start, [builder.add(builder.mul(k, const(MR)),
                                                           builder.mul(depth_, const(panel * MR)))])
            builder.store(column, builder.bitcast(copy_at, column_type.as_pointer()), align=4)
        updated = [[builder.call(fma, [broadcasts[r], b[v], tile[r][v]]) for v in range(vectors)] for r in range(MR)]
        k_next = builder.add(k, const(1))
        k.add_incoming(k_next, builder.block)
        for r in range(MR):
            for v in range(vectors):
                tile[r][v].add_incoming(updated[r][v], builder.block)
        if summed:
            term_done = builder.function.append_basic_block("tile_term_done")
            builder.cbranch(builder.icmp_signed("<", k_next, depth_), loop, term_done)
            builder.position_at_end(term_done)
            term_next = builder.add(term, const(1))
            term.add_incoming(term_next, term_done)
            for r in range(MR):
                for v in range(vectors):
                    sums[r][v].add_incoming(updated[r][v], term_done)
            terms = context.make_array(signature.args[4])(context, builder, a_terms).nitems
            builder.cbranch(builder.icmp_signed("<", term_next, terms), term_loop, done)
        else:
            builder.cbranch(builder.icmp_signed("<", k_next, depth_), loop, done)

        builder.position_at_end(done)
        for r in range(MR):
            c_row = builder.gep(c_start, [builder.mul(const(r), c_rs)])
            for v in range(vectors):
                where = builder.bitcast(builder.gep(c_row, [builder.mul(const(v), c_vs)]), vector.as_pointer())
                total = builder.fadd(builder.load(where, align=4), updated[r][v])
                builder.store(builder.select(accumulate_, total, updated[r][v]), where, align=4)
        return context.get_dummy_value()

    return codegen


@intrinsic
def _micro_tile(typingctx, a, a_offset, a_row_step, a_k_step, panel, panel_offset, c, c_offset, c_row_step,
                depth, accumulate):
    """C[r, j] (+)= Σₖ A[r, k]·B[k, j] for an MR × NR tile, over `depth` ≥ 1 steps of k.

    A[r, k] is a[a_offset + r·a_row_step + k·a_k_step]; B[k, j] is panel[panel_offset + k·NR + j];
    C[r, j] is c[c_offset + r·c_row_step + j] (element offsets from each array's data pointer).
    With `accumulate` the tile is added to C, else it replaces it."""
    sig = types.none(a, a_offset, a_row_step, a_k_step, panel, panel_offset, c, c_offset, c_row_step,
                     depth, accumulate)
    return sig, _tile_codegen(_LANES[a.dtype], copies=0)


def _summed_tile(vectors):
    """`micro_tile_sum`, or with WIDE_VECTORS `micro_tile_sum_wide`: an MR × (vectors · lanes) tile.

    C[r, j] (+)= Σₜ Σₖ A[r, a_terms[t] + k·a_k_step]·B[b_terms[t] + k·b_k_step, j]: a sum of
    len(a_terms) ≥ 1 products of `depth` ≥ 1 steps each, kept in registers.

    A[r, i] is a[a_offset + r·a_row_step + i]; B[i, j] is b[b_offset + i + v·b_vector_step + l] and
    C[r, j] is c[c_offset + r·c_row_step + v·c_vector_step + l] for column j = v·lanes + l, lane l
    of the tile's vector v (element offsets from each array's data pointer): with vector steps of
    one vector's lanes, each row of B and of C is NR contiguous values, as in `_micro_tile`.
    The terms of a direct convolution are its taps (`library_direct_conv`): each shifts the
    image (B) and picks the tap's column of the filter (A); its vector steps can put the tile's
    vectors on output rows of their own."""

    @intrinsic
    def tile(typingctx, a, a_offset, a_row_step, a_k_step, a_terms, b, b_offset, b_k_step, b_vector_step, b_terms,
             c, c_offset, c_row_step, c_vector_step, depth, accumulate):
        sig = types.none(a, a_offset, a_row_step, a_k_step, a_terms, b, b_offset, b_k_step, b_vector_step, b_terms,
                         c, c_offset, c_row_step, c_vector_step, depth, accumulate)
        return sig, _tile_codegen(_LANES[a.dtype], copies=0, summed=True, vectors=vectors)

    return tile


micro_tile_sum = _summed_tile(VECTORS)
micro_tile_sum_wide = _summed_tile(WIDE_VECTORS)


def _copying_tile(copies, adjacent=True):
    """`_micro_tile` that also writes what it reads of A, packed: the tile's micro-panel, and with
    copies 2 the next micro-panel's too, to copy[copy_offset + p·depth·MR + k·MR + r] for p <
    copies. The reads of A are then the packing, overlapped with the tile's multiply-adds.

    With `adjacent`, A's MR rows are adjacent (a_row_step 1: a transposed view): each step of k
    reads them as one vector, and a pair of micro-panels is the two halves of the same cache
    lines, so every line of A is fetched once. Otherwise (`_micro_tile_gathering`) the step's MR
    values are loaded one by one, as `_micro_tile` loads them, and gathered into one vector."""

    @intrinsic
    def tile(typingctx, a, a_offset, a_row_step, a_k_step, panel, panel_offset, c, c_offset, c_row_step, depth,
             accumulate, copy, copy_offset):
        sig = types.none(a, a_offset, a_row_step, a_k_step, panel, panel_offset, c, c_offset, c_row_step,
                         depth, accumulate, copy, copy_offset)
        return sig, _tile_codegen(_LANES[a.dtype], copies, adjacent)

    return tile


_micro_tile_copying = _copying_tile(1)
_micro_tile_copying_pair = _copying_tile(2)
_micro_tile_gathering = _copying_tile(1, adjacent=False)


@intrinsic
def transpose_square(typingctx, source, source_offset, source_step, target, target_offset, target_step):
    """target[t·target_step + j] = source[j·source_step + t] for an L × L square, L a vector's lanes.

    Loads L vectors of `source` (its contiguous runs), transposes them in registers, stores L
    vectors of `target`. Offsets and steps count elements from each array's data pointer. The
    transpose swaps the off-diagonal halves of every 2h × 2h block for h = L/2, L/4, ..., 1:
    log2(L) rounds of L shuffles, against L² scalar moves."""
    lanes = _LANES[source.dtype]
    sig = types.none(source, source_offset, source_step, target, target_offset, target_step)

    def codegen(context, builder, signature, args):
        (source_, s_off, s_step, target_, t_off, t_step) = args
        i64, i32 = ir.IntType(64), ir.IntType(32)
        vector = ir.VectorType(context.get_data_type(signature.args[0].dtype), lanes)

        def start(position, value, offset):
            return _element_pointer(context, builder, signature.args[position], value, offset)

        def at(pointer, step, index):
            where = builder.gep(pointer, [builder.mul(ir.Constant(i64, index), step)])
            return builder.bitcast(where, vector.as_pointer())

        source_start, target_start = start(0, source_, s_off), start(3, target_, t_off)
        rows = [builder.load(at(source_start, s_step, t), align=4) for t in range(lanes)]
        half = lanes // 2
        while half:
            for r in range(lanes):
                if r & half:
                    continue
                upper, lower = rows[r], rows[r + half]
                # lane j of the pair: j < lanes is `upper`'s, j ≥ lanes is `lower`'s lane j - lanes
                keep = [j if j & half == 0 else lanes + j - half for j in range(lanes)]
                swap = [j + half if j & half == 0 else lanes + j for j in range(lanes)]
                rows[r] = builder.shuffle_vector(upper, lower, ir.Constant(ir.VectorType(i32, lanes), keep))
                rows[r + half] = builder.shuffle_vector(upper, lower, ir.Constant(ir.VectorType(i32, lanes), swap))
            half //= 2
        for t in range(lanes):
            builder.store(rows[t], at(target_start, t_step, t), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def _copy_panel_row(typingctx, source, source_offset, target, target_offset):
    """target[target_offset + j] = source[source_offset + j] for j < NR (a panel's row): VECTORS
    vector loads and stores. Offsets count elements from each array's data pointer.

    Written as a loop over a 2-D view of any strides, the copy is a scalar load and store per
    value (Numba cannot know the columns are adjacent): a row-major 512 × 512 float32 B packed at
    7.5 GB/s, a fifth of a 256 × 512 by 512 × 512 product's time on two threads."""
    lanes = _LANES[source.dtype]
    sig = types.none(source, source_offset, target, target_offset)

    def codegen(context, builder, signature, args):
        (source_, s_off, target_, t_off) = args
        vector = ir.VectorType(context.get_data_type(signature.args[0].dtype), lanes)
        source_start = _element_pointer(context, builder, signature.args[0], source_, s_off)
        target_start = _element_pointer(context, builder, signature.args[2], target_, t_off)
        for v in range(VECTORS):
            offset = [ir.Constant(ir.IntType(64), v * lanes)]
            value = builder.load(builder.bitcast(builder.gep(source_start, offset), vector.as_pointer()), align=4)
            builder.store(value, builder.bitcast(builder.gep(target_start, offset), vector.as_pointer()), align=4)
        return context.get_dummy_value()

    return sig, codegen


@intrinsic
def vector_lanes(typingctx, array):
    """L, a vector's lanes for the array's dtype, as a constant of the compiled code (a loop over a
    tile's NR = VECTORS·L columns then has a known trip count, and LLVM vectorises it whole)."""
    lanes = _LANES[array.dtype]

    def codegen(context, builder, signature, args):
        return ir.Constant(ir.IntType(64), lanes)

    return types.intp(array), codegen


_OPTIONS = dict(cache=True, nogil=True, error_model="numpy")


@njit(**_OPTIONS)
def _pack_panels(b, k0, kc, n0, n1, packed):
    """B[k0:k0+kc, n0:n1] into panels of NR columns, k-major, the last zero-padded.

    A row-major B is read a row at a time across every whole panel, so the reads run along
    B's rows. Panel by panel, each step of k would jump a row of B (4-8 KB in gpt), a new
    page each step, where the hardware prefetchers stop: with B written by an earlier kernel
    (not in cache, as in a step), every step waited on memory. In gpt's step the products took
    62 ms against 86 (per-call profiles); a 1024 × 256 by 256 × 1024 product with cold caches
    1.34 ms against 1.71, a 256 × 1024 by 1024 × 2048 one 3.56 against 7.1. The lines of the
    row B_AHEAD rows on are asked for as each row is read.
    A B whose columns are contiguous (a transposed view, such as Kᵀ in Q·Kᵀ) is read in
    L × L squares transposed in registers; what the squares leave, column by column, as is the
    last, partial panel of a row-major B."""
    lanes = vector_lanes(b)
    width = VECTORS * lanes
    item = b.itemsize
    columns_contiguous = b.strides[1] > b.strides[0]
    squares = kc // lanes * lanes if columns_contiguous and b.strides[0] == item else 0
    whole = 0 if columns_contiguous else (n1 - n0) // width
    row_step, column_step = b.strides[0] // item, b.strides[1] // item
    for kk in range(kc):
        ahead = (k0 + kk + B_AHEAD) * row_step + n0 * column_step
        for x in range(0, whole * width, CACHE_LINE // item):
            prefetch_read(b, ahead + x * column_step)
        for q in range(whole):
            start, first = q * kc * width + kk * width, n0 + q * width
            if column_step == 1:
                _copy_panel_row(b, (k0 + kk) * row_step + first, packed, start)
            else:
                for j in range(width):
                    packed[start + j] = b[k0 + kk, first + j]
    for q in range(whole, (n1 - n0 + width - 1) // width):
        first = n0 + q * width
        start = q * kc * width
        cols = min(width, n1 - first)
        for j in range(width):
            if j >= cols:
                for kk in range(kc):
                    packed[start + kk * width + j] = 0.0
            else:  # after the squares, where the column lies in a whole one
                for kk in range(squares if j // lanes * lanes + lanes <= cols else 0, kc):
                    packed[start + kk * width + j] = b[k0 + kk, first + j]
        for j in range(0, cols // lanes * lanes, lanes):
            for kk in range(0, squares, lanes):
                transpose_square(b, (k0 + kk) + (first + j) * (b.strides[1] // item), b.strides[1] // item,
                                  packed, start + kk * width + j, width)


@njit(**_OPTIONS)
def _pack_rows(a, i0, i1, k0, kc, packed):
    """A[i0:i1, k0:k0+kc] into micro-panels of MR rows, k-major (MR values per step of k),
    the last zero-padded."""
    for p in range((i1 - i0 + MR - 1) // MR):
        first = i0 + p * MR
        start = p * MR * kc
        rows = min(MR, i1 - first)
        for kk in range(kc):
            for r in range(MR):
                packed[start + kk * MR + r] = a[first + r, k0 + kk] if r < rows else 0.0


@njit(**_OPTIONS)
def _product(a, b, c, m0, m1, n0, n1, packed, packed_rows, tile):
    """c[m0:m1, n0:n1] = a[m0:m1] @ b[:, n0:n1]; `packed` holds KC × (n1 - n0) rounded up to
    panels, `packed_rows` MC × KC and `tile` MR × NR elements (the caller's scratch).

    A row-major A is read where it lies, unless its rows are a multiple of L1_ALIASING apart
    and B has more than one panel: then the tiles of the first panel gather it into
    `packed_rows` (`_micro_tile_gathering`). A transposed A (its MR rows adjacent) is packed
    there by the tiles of the first panel of B, which read each step's MR values as one vector
    and store it as they go (`_micro_tile_copying`). Either way the tiles of the other panels
    read the packed copy. Read in place by every panel, a transposed A moves a whole row of the
    view per step of k, and at a power-of-two row that walk maps onto a few L1 sets: each
    panel would fetch A again from L2. A last partial micro-panel is packed first, with zero
    padding, whatever the layout."""
    k = a.shape[1]
    width = VECTORS * vector_lanes(a)
    if k == 0:
        c[m0:m1, n0:n1] = 0.0
        return
    item = a.itemsize
    a_rs, a_ks, c_rs = a.strides[0] // item, a.strides[1] // item, c.strides[0] // item
    copied = a_rs == 1
    gathered = not copied and a_rs * item % L1_ALIASING == 0 and n1 - n0 > width
    for k0 in range(0, k, KC):
        kc = min(KC, k - k0)
        _pack_panels(b, k0, kc, n0, n1, packed)
        accumulate = k0 > 0
        for i0 in range(m0, m1, MC):
            i1 = min(m1, i0 + MC)
            packed_from = i0 + (i1 - i0) // MR * MR
            if packed_from < i1:
                _pack_rows(a, packed_from, i1, k0, kc, packed_rows[(packed_from - i0) * kc:])
            for q in range((n1 - n0 + width - 1) // width):
                j0 = n0 + q * width
                cols = min(width, n1 - j0)
                panel = q * kc * width
                for i in range(i0, i1, MR):
                    whole = i < packed_from and cols == width
                    target, at, step = (c, i * c_rs + j0, c_rs) if whole else (tile, 0, width)
                    add = accumulate and whole
                    a_at, rows_at = i * a_rs + k0 * a_ks, (i - i0) * kc
                    packed_already = (copied and (q > 0 or (i - i0) // MR % 2)) or (gathered and q > 0)
                    if i >= packed_from or packed_already:
                        _micro_tile(packed_rows, rows_at, 1, MR, packed, panel, target, at, step, kc, add)
                    elif copied and i + 2 * MR <= packed_from:
                        _micro_tile_copying_pair(a, a_at, a_rs, a_ks, packed, panel, target, at, step, kc, add,
                                                 packed_rows, rows_at)
                    elif copied:
                        _micro_tile_copying(a, a_at, a_rs, a_ks, packed, panel, target, at, step, kc, add,
                                            packed_rows, rows_at)
                    elif gathered:
                        _micro_tile_gathering(a, a_at, a_rs, a_ks, packed, panel, target, at, step, kc, add,
                                              packed_rows, rows_at)
                    else:
                        _micro_tile(a, a_at, a_rs, a_ks, packed, panel, target, at, step, kc, add)
                    if not whole:
                        _store_edge(tile, c, i, min(MR, i1 - i), j0, cols, accumulate)


@njit(**_OPTIONS)
def _store_edge(tile, c, i, rows, j0, cols, accumulate):
    """The valid `rows` × `cols` of an edge tile into C at (i, j0), added or replacing."""
    for r in range(rows):
        for j in range(cols):
            c[i + r, j0 + j] = c[i + r, j0 + j] + tile[r, j] if accumulate else tile[r, j]


def _by_items(a, b, c, packed, packed_rows, tile):
    """Each thread multiplies a contiguous share of the batch's items."""
    parts, count = packed.shape[0], a.shape[0]
    for part in prange(parts):
        for item in range(count * part // parts, count * (part + 1) // parts):
            _product(a[item], b[item], c[item], 0, a.shape[1], 0, b.shape[2], packed[part], packed_rows[part],
                     tile[part])


def _within_items(a, b, c, by_columns, packed, packed_rows, tile):
    """Each item's product split among the threads: by columns (whole panels) or by rows
    (whole tiles)."""
    parts, m, n = packed.shape[0], a.shape[1], b.shape[2]
    width = VECTORS * vector_lanes(a)
    for item in range(a.shape[0]):
        for part in prange(parts):
            if by_columns:
                panels = (n + width - 1) // width
                m0, m1 = 0, m
                n0, n1 = min(n, panels * part // parts * width), min(n, panels * (part + 1) // parts * width)
            else:
                tiles = (m + MR - 1) // MR
                m0, m1 = min(m, tiles * part // parts * MR), min(m, tiles * (part + 1) // parts * MR)
                n0, n1 = 0, n
            if m0 < m1 and n0 < n1:
                _product(a[item], b[item], c[item], m0, m1, n0, n1, packed[part], packed_rows[part], tile[part])


_by_items_loop = library.ParallelLoop(_by_items)
_within_items_loop = library.ParallelLoop(_within_items)


class Multiplier:
    """`multiplier(a, b, out)`: out[i] = a[i] @ b[i] over (count, m, k) and (count, k, n) views
    of one float dtype (any strides; `out` C-contiguous), keeping the packing scratch of each
    shape it has seen for the next call."""

    def __init__(self):
        self.plans: dict[tuple, tuple] = {}

    def _plan(self, count: int, m: int, k: int, n: int, dtype: np.dtype) -> tuple:
        work = count * m * n * max(k, 1)
        parts = library.partition_count(work)
        by_items = parts == 1 or count >= parts
        width = panel_width(dtype)
        by_columns = not by_items and n >= max(2 * parts * width, m)
        panels = -(-n // width)
        panels_per_part = -(-panels // parts) if by_columns else panels
        depth = min(KC, max(k, 1))
        rows = max(MR, min(MC, -(-m // MR) * MR))  # a block's rows of A, whole micro-panels (MC is)
        shape = f"{count} × {m} × {k} × {n} {np.dtype(dtype)} product"
        packed = buffers.empty(parts * depth * panels_per_part * width, dtype, label=f"packed B of a {shape}")
        packed_rows = buffers.empty(parts * rows * depth, dtype, label=f"packed A of a {shape}")
        tile = buffers.empty(parts * MR * width, dtype, label=f"edge tile of a {shape}")
        scratch = (packed.reshape(parts, -1), packed_rows.reshape(parts, -1), tile.reshape(parts, MR, width))
        return work, by_items, by_columns, scratch

    def __call__(self, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
        count, m, k = a.shape
        key = (out.shape, k, out.dtype)
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = self._plan(count, m, k, out.shape[2], out.dtype)
        work, by_items, by_columns, scratch = plan
        if by_items:
            _by_items_loop(work, a, b, out, *scratch)
        else:
            _within_items_loop(work, a, b, out, by_columns, *scratch)
