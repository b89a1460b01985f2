"""Software prefetches (backends/numba_cpu/prefetch.py) are hints: they change no value.

Two loops ask for memory ahead of use, and both must still equal an independent oracle:

* a gather of table rows asks for the row GATHER_AHEAD indices ahead (`library_indexing`):
  against numpy's fancy indexing, with repeated and negative indices, rows whose length is
  not a whole number of cache lines, fewer lookups than GATHER_AHEAD, and enough lookups to
  run parallel (each part stops asking at its own end);
* a rank-2 kernel of several phases asks for the next row in its heaviest phase, in blocks
  of PREFETCH_BLOCK points (`codegen` module docstring): a layer norm, GELU and their
  gradients, against the reference interpreter (float64 1e-10, float32 1e-5), with rows of
  exactly one block, a partial last block, a row longer than ROW_SPLIT (the register sum's
  blocks, each in prefetching blocks), a NaN row, one row (it asks for itself), no rows, and
  enough rows to run parallel. A row shorter than a block asks for nothing.

And a function may ask for lines of arrays of different dtypes.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

import gradcompiler as gc
from gradcompiler.backends.numba_cpu import cache
from gradcompiler.backends.numba_cpu.codegen import PREFETCH_BLOCK
from gradcompiler.backends.numba_cpu.library_indexing import GATHER_AHEAD
from gradcompiler.backends.numba_cpu.prefetch import prefetch_read, prefetch_write
from gradcompiler.backends.numba_cpu.rowreduce import ROW_SPLIT
from tests.oracle import assert_close

TOLERANCE = {"float64": 1e-10, "float32": 1e-5}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("vocab, width, lookups", [(50, 70, 40), (9, 3, GATHER_AHEAD - 3), (300, 64, 700)],
                         ids=["partial-lines", "fewer-than-ahead", "parallel"])
def test_a_prefetching_gather_of_table_rows_equals_numpy(rng, dtype, vocab, width, lookups):
    with gc.Graph("gather_rows"):
        table = gc.input("table", (vocab, width), dtype)
        idx = gc.input("idx", (lookups,), "int64")
        rows = table[idx]
    table_value = rng.standard_normal((vocab, width)).astype(dtype)
    table_value[vocab // 2] = np.nan
    idx_value = rng.integers(-vocab, vocab, lookups)
    idx_value[: min(lookups, 4)] = vocab // 2            # repeats, and the NaN row
    got = gc.compile(rows)(table=table_value, idx=idx_value)
    np.testing.assert_array_equal(got, table_value[idx_value])


def _layer_norm_gelu(rows: int, width: int, dtype: str):
    with gc.Graph("layer_norm_gelu"):
        x = gc.param("x", (rows, width), dtype)
        gamma, beta = gc.param("gamma", (width,), dtype), gc.param("beta", (width,), dtype)
        r = gc.input("r", (rows, width), dtype)
        y = gc.gelu_tanh(gc.layer_norm(x, gamma, beta, axis=-1, eps=1e-5)) + x
        loss = (y * r).sum()
    return [loss, *gc.grad(loss, [x, gamma, beta])]


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's NaN row
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("rows, width", [(5, PREFETCH_BLOCK), (4, PREFETCH_BLOCK + 72), (3, ROW_SPLIT + 200),
                                         (1, 200), (0, 200), (300, 1000)],
                         ids=["one-block", "partial-block", "beyond-row-split", "one-row", "no-rows",
                              "parallel"])
def test_a_kernel_prefetching_the_next_row_equals_the_reference(rng, dtype, rows, width):
    outputs = _layer_norm_gelu(rows, width, dtype)
    step = gc.compile(outputs)
    assert "prefetch_write(" in step.source() and "prefetch_read(" in step.source()
    feeds = dict(x=rng.standard_normal((rows, width)).astype(dtype),
                 gamma=(1 + 0.1 * rng.standard_normal(width)).astype(dtype),
                 beta=(0.1 * rng.standard_normal(width)).astype(dtype),
                 r=rng.standard_normal((rows, width)).astype(dtype))
    if rows > 2:
        feeds["x"][1, width // 3] = np.nan
    want = gc.evaluate(outputs, feeds)
    for k, (g, w) in enumerate(zip(step(**feeds), want)):
        assert_close(g, w, rtol=TOLERANCE[dtype], label=f"output {k}")


def test_a_row_shorter_than_a_block_asks_for_nothing():
    step = gc.compile(_layer_norm_gelu(6, PREFETCH_BLOCK - 1, "float32"))
    assert "prefetch" not in step.source()


def test_one_function_asks_for_lines_of_two_dtypes():
    """A module declares `llvm.prefetch` once, so the second dtype's pointer must fit it: the
    address is cast to a byte pointer (a float table and int indices failed to compile)."""
    @njit
    def ask_and_read(floats, ints):
        prefetch_read(floats, 0)
        prefetch_write(ints, 1)
        prefetch_read(ints, 0)
        return floats[0] + ints[1]

    assert ask_and_read(np.array([1.5, 2.0], np.float32), np.array([3, 4], np.int64)) == 5.5


def test_a_gather_absorbed_into_its_loop_with_int_positions_compiles(rng, monkeypatch, tmp_path):
    """The graph the fuzz found: rows of a float32 table gathered through int32 indices into the
    loop that reads them, which asks for the table's rows ahead; compiled into an empty kernel
    cache, so that nothing compiled before stands in for it. Oracle: the reference."""
    monkeypatch.setenv(cache.CACHE_ENV, str(tmp_path))
    with gc.Graph("one_hot_gather"):
        p0 = gc.param("p0", (), "float32")
        i1, i2 = gc.input("i1", (1,), "int32"), gc.input("i2", (2,), "int32")
        square = p0.reshape((1, 1))
        table = gc.indexing_set_one_hot(square, i1, square, axis=1)
        rows = table[i2]
        loss = (gc.sigmoid(rows) * rows).sum()
        outputs = [loss, *gc.grad(loss, [p0])]
    feeds = dict(p0=np.float32(0.5), i1=np.array([0], np.int32), i2=np.array([0, 0], np.int32))
    for got, want in zip(gc.compile(outputs)(**feeds), gc.evaluate(outputs, feeds)):
        assert_close(got, want, rtol=TOLERANCE["float32"])
