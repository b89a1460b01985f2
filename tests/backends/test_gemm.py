"""The register-blocked products of backends/numba_cpu/gemm.py, against float64 numpy.

* Every edge: rows and columns not multiples of the tile (MR × NR: 8 × 32 float32 with AVX-512),
  K = 0 (zeros), K over a packed block (KC: the tile accumulates into C), rows over a block
  of A (MC), one row, one column, empty batches and matrices.
* Every layout: transposed views of A and of B (A packed by the tiles that read it, B
  packed by squares transposed in registers, and their remainders), a batch broadcast with
  stride 0, a non-contiguous slice, rows of A at the L1-aliasing stride (gathered by the tiles
  of the first panel), a row-major B packed by vector copies from a column offset, and a B of
  strided columns packed value by value.
* Every split among threads: by items, within items by columns and by rows (three parts,
  forced), each equal to the serial result.
* NaN and infinities propagate to their rows and columns, and the zero padding of an
  edge tile brings none into the result.
* The scratch of a shape is allocated once: a second call allocates nothing.
* The tiles of the AVX2 and x86-64 profiles, in child processes whose Numba targets them, with
  every buffer fenced by guard bytes.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import numpy as np
import pytest

from gradcompiler.backends.numba_cpu import gemm, library
from gradcompiler.backends.numba_cpu.cpu_profile import PROFILE_NAMES
from tests.oracle import assert_close

RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-12}


def _operands(rng, count, m, k, n, dtype, transpose_a=False, transpose_b=False):
    a = rng.standard_normal((count, k, m) if transpose_a else (count, m, k)).astype(dtype)
    b = rng.standard_normal((count, n, k) if transpose_b else (count, k, n)).astype(dtype)
    return (a.transpose(0, 2, 1) if transpose_a else a), (b.transpose(0, 2, 1) if transpose_b else b)


def _check(multiply, a, b):
    out = np.full((a.shape[0], a.shape[1], b.shape[2]), np.nan, a.dtype)
    multiply(a, b, out)
    want = np.matmul(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)
    assert_close(out, want, rtol=RTOL[a.dtype])
    return out


SHAPES = [(1, 1, 1, 1), (2, 7, 3, 5), (3, 8, 16, 32), (1, 17, 300, 33), (2, 9, 0, 5), (1, 520, 4, 20),
          (0, 4, 4, 4), (2, 0, 4, 3), (2, 6, 5, 0)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("transpose_a,transpose_b", [(False, False), (False, True), (True, False), (True, True)])
def test_products_of_every_edge_and_layout_equal_numpy(rng, dtype, transpose_a, transpose_b):
    multiply = gemm.Multiplier()
    for count, m, k, n in SHAPES:
        _check(multiply, *_operands(rng, count, m, k, n, dtype, transpose_a, transpose_b))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_broadcast_and_sliced_operands(rng, dtype):
    multiply = gemm.Multiplier()
    a = rng.standard_normal((5, 10, 12)).astype(dtype)[:, 1:9, ::2]          # strided rows and columns
    b = np.broadcast_to(rng.standard_normal((6, 40)).astype(dtype), (5, 6, 40))  # stride 0 batch
    _check(multiply, a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_row_major_b_packed_by_vectors_and_strided_b_value_by_value(rng, dtype):
    """A B whose columns are adjacent is packed a panel's row at a time by vector copies, from
    wherever its rows start (a column offset); a B whose columns are apart (every other one) is
    packed value by value. Both over two whole panels and a partial one, and two blocks of k."""
    width = gemm.panel_width(dtype)
    k, n = gemm.KC + 5, 2 * width + 7
    a = rng.standard_normal((2, 9, k)).astype(dtype)
    wide = rng.standard_normal((2, k, 2 * n + 3)).astype(dtype)
    for b in [wide[:, :, 3:n + 3], wide[:, :, 1:2 * n + 1:2]]:
        _check(gemm.Multiplier(), a, b)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_transposed_operands_through_every_packing_path(rng, dtype):
    """A transposed A of an odd count of whole micro-panels (copied in pairs, then one alone,
    then a zero-padded tail) and a transposed B whose columns and rows of k leave remainders
    around its L × L squares, over two blocks of k."""
    lanes = gemm.VECTOR_BYTES // np.dtype(dtype).itemsize
    m, k, n = 5 * gemm.MR + 3, gemm.KC + lanes + 3, 2 * gemm.panel_width(dtype) + lanes + 5
    for transpose_a, transpose_b in [(True, False), (False, True), (True, True)]:
        _check(gemm.Multiplier(), *_operands(rng, 2, m, k, n, dtype, transpose_a, transpose_b))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("panels", [1, 3])
def test_a_row_major_a_at_the_l1_aliasing_stride(rng, dtype, panels):
    """Rows of A a multiple of L1_ALIASING apart (a slice of a wider matrix): with more than one
    panel of B the tiles of the first gather A into micro-panels that the others read; over two
    blocks of k, with edge tiles in rows and columns, and a NaN that reaches only its row."""
    width = gemm.panel_width(dtype)
    m, k, n = 3 * gemm.MR + 5, gemm.KC + 9, (panels - 1) * width + 7
    wide = rng.standard_normal((2, m, gemm.L1_ALIASING // np.dtype(dtype).itemsize)).astype(dtype)
    a = wide[:, :, :k]
    a[1, 4, gemm.KC + 3] = np.nan
    out = _check(gemm.Multiplier(), a, rng.standard_normal((2, k, n)).astype(dtype))
    assert np.isnan(out[1, 4]).all() and np.isfinite(np.delete(out[1], 4, axis=0)).all()


@pytest.fixture
def three_parts(monkeypatch):
    """Every product planned for three threads, whatever its size."""
    monkeypatch.setattr(library, "partition_count", lambda work: 3)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("count,m,k,n", [(7, 9, 5, 11),      # by items, a share of 2 or 3 each
                                         (2, 20, 7, 200),    # within items, by columns
                                         (1, 29, 6, 40),     # within items, by rows (too few columns)
                                         (1, 5, 3, 7),       # fewer tiles than parts
                                         (6, 40, 16, 70),    # by items, on Numba's threads
                                         (1, 40, 16, 400),   # by columns, on Numba's threads
                                         (1, 300, 16, 200)])  # by rows (more rows than columns), threads
@pytest.mark.parametrize("transpose_b", [False, True])
def test_every_split_among_threads_equals_numpy(three_parts, rng, dtype, count, m, k, n, transpose_b):
    """The small products run the loops serially (below PARALLEL_MIN_WORK), the last three in
    parallel. Within an item the split is by columns only where there are two panels per part
    and no more rows than columns. A row-major B is packed a row at a time across a part's
    whole panels (from its first column, n0), a transposed one by squares."""
    multiply = gemm.Multiplier()
    _check(multiply, *_operands(rng, count, m, k, n, dtype, transpose_b=transpose_b))
    ((_, by_items, by_columns, _),) = multiply.plans.values()
    columns = n >= 2 * 3 * gemm.panel_width(dtype) and n >= m
    assert (by_items, by_columns) == ((True, False) if count > 2 else (False, columns))


def test_a_long_product_accumulates_over_blocks_of_k_and_rows(rng):
    """K over KC and M over MC, with an edge in each."""
    _check(gemm.Multiplier(), *_operands(rng, 1, gemm.MC + 13, gemm.KC * 2 + 7, 45, np.float32, transpose_a=True))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
def test_nan_and_infinities_reach_only_their_rows_and_columns(rng):
    a, b = _operands(rng, 2, 11, 6, 37, np.float32)   # edge tiles in both directions
    a[0, 10, 2] = np.nan
    b[1, 4, 36] = np.inf
    out = _check(gemm.Multiplier(), a, b)
    assert np.isnan(out[0, 10]).all() and np.isfinite(np.delete(out[0], 10, axis=0)).all()
    assert not np.isfinite(out[1, :, 36]).any() and np.isfinite(out[1, :, :36]).all()


def test_scratch_is_allocated_once_per_shape(rng, monkeypatch):
    multiply = gemm.Multiplier()
    a, b = _operands(rng, 3, 9, 5, 40, np.float32)
    _check(multiply, a, b)
    allocations = []
    monkeypatch.setattr(gemm.buffers, "empty", lambda *args, **kwargs: allocations.append(args))
    _check(multiply, a, b)
    assert allocations == [] and len(multiply.plans) == 1


PROFILE_CHILD = """
import numpy as np
import gradcompiler as gc
from gradcompiler.backends.numba_cpu import buffers, gemm
from gradcompiler.backends.numba_cpu.cpu_profile import PROFILE
assert buffers.checking() and (gemm.VECTOR_BYTES, gemm.MR) == (PROFILE.vector_bytes, PROFILE.mr)
rng = np.random.default_rng(3)
worst = 0.0

def error_over_bound(got, a, b):
    # |got - a@b| over the classical bound of a sum of k products, k·eps·(|a|@|b|), in float64
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    bound = a.shape[-1] * np.finfo(a.dtype).eps * (np.abs(a64) @ np.abs(b64)) + np.finfo(a.dtype).tiny
    return float(np.max(np.abs(got - a64 @ b64) / bound))

shapes = [(5 * gemm.MR + 3, gemm.KC + 11, None), (512, 256, 512), (512, 64, 512), (gemm.MC + 7, 40, 48)]
for dtype in (np.float32, np.float64):
    for m, k, n in shapes:
        n = n or 2 * gemm.panel_width(dtype) + 13
        for transpose_a, transpose_b in [(False, False), (True, False), (False, True), (True, True)]:
            a = rng.standard_normal((2, k, m) if transpose_a else (2, m, k)).astype(dtype)
            b = rng.standard_normal((2, n, k) if transpose_b else (2, k, n)).astype(dtype)
            a = a.transpose(0, 2, 1) if transpose_a else a
            b = b.transpose(0, 2, 1) if transpose_b else b
            out = buffers.empty((2, m, n), dtype, label="the product")
            out.fill(np.nan)
            multiply = gemm.Multiplier()   # alive until its scratch's guards are read
            multiply(a, b, out)
            broken = buffers.broken_guard([])
            assert broken is None, (m, k, n, dtype, transpose_a, transpose_b, broken)
            worst = max(worst, error_over_bound(out, a, b))
for K in (256, 64):    # the transposed product that wrote past its packing buffer with AVX2
    with gc.Graph():
        a, b = gc.input("a", (K, 512)), gc.input("b", (K, 512))
        step = gc.compile(a.T @ b)
    A, B = (rng.standard_normal((K, 512)).astype(np.float32) for _ in range(2))
    for _ in range(3):
        out = step(a=A, b=B)
    worst = max(worst, error_over_bound(out, A.T, B))
with gc.Graph():       # tanh(x) @ x, float64: the suite's abort on such a CPU
    x = gc.input("x", (512, 512), "float64")
    step = gc.compile(gc.tanh(x) @ x)
X = rng.standard_normal((512, 512))
worst = max(worst, error_over_bound(step(x=X), np.tanh(X), X))
print(worst)
"""


@pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"),
                    reason=f"LLVM generates the AVX2 and x86-64 profiles' code only on an x86-64 host; this one is "
                           f"{platform.machine()}, whose own tiles the other tests of this file check")
@pytest.mark.parametrize("profile", ["avx2", "x86-64"])
def test_the_tile_of_each_cpu_profile_stays_in_its_buffers(profile):
    """The tiles of a CPU without AVX-512 (32-byte vectors and six rows: AVX2; 16-byte vectors
    without FMA: baseline x86-64), in a child process whose Numba targets that CPU (LLVM
    generates its code on any x86-64 host), with every buffer fenced by guard bytes
    (`GRADCOMPILER_CHECK_BOUNDS`): every layout and edge, rows past a block of A (MC), and the
    512-row transposed products that wrote past their packing buffer with AVX2, directly and
    compiled; each equal to float64 numpy."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_CPU_")}
    env.update(PROFILE_NAMES[profile], GRADCOMPILER_CHECK_BOUNDS="1")
    done = subprocess.run([sys.executable, "-c", PROFILE_CHILD], capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert float(done.stdout.split()[-1]) <= 1.0   # the worst error over its bound
