"""Tagged loads and stores (backends/numba_cpu/alias_scopes.py): the same values as plain
indexing, and a loop of gathers through them vectorises.

* Values, against numpy's own indexing: 1-D and 2-D arrays, signed and unsigned indices, a
  tuple index per axis, a row view of a 2-D array, a store that casts (float64 into float32,
  an integer into float64), and a read-modify-write through load_result and store_result.
* Aliasing, where it is allowed: untagged stores into a buffer that a later loop reads with
  load_source (the warp loops' taps) are seen by it; a result updated in place through
  load_result and store_result across two passes keeps both passes' additions.
* What they are for: the optimised LLVM of a loop that gathers through load_source and
  stores through store_result holds a vector gather (`llvm.masked.gather`), which is what
  the bilinear warps rely on (`library_vision`).
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from gradcompiler.backends.numba_cpu.alias_scopes import load_result, load_source, store_result
from gradcompiler.backends.numba_cpu.cpu_profile import PROFILE


@njit
def _gather_scaled(src, index, out, scale):
    for i in range(out.size):
        store_result(out, i, load_source(src, np.uint64(load_source(index, i))) * scale)


@njit
def _row_of_matrix(matrix, row, out):
    for j in range(matrix.shape[1]):
        store_result(out, j, load_source(matrix, (row, np.uint64(j))))


@njit
def _two_passes(taps, src, sums):
    """sums[i] += src[taps[i]] twice, the taps written by plain stores between the passes."""
    for step in range(2):
        for i in range(taps.size):
            taps[i] = (i * 7 + step) % src.size        # untagged: ordered against everything
        for i in range(taps.size):
            store_result(sums, (0, i), load_result(sums, (0, i)) + load_source(src, load_source(taps, i)))


@pytest.mark.parametrize("dtype", ["float64", "float32", "int64"])
def test_a_gather_equals_numpy_fancy_indexing(rng, dtype):
    src = (rng.standard_normal(97) * 100).astype(dtype)
    index = rng.integers(0, src.size, 130)
    index[:5] = index[0]                                   # repeated indices
    out = np.full(index.size, np.nan)
    _gather_scaled(src, index, out, 3.0)
    np.testing.assert_array_equal(out, src[index].astype(np.float64) * 3.0)


def test_a_store_casts_to_the_arrays_dtype(rng):
    src = rng.standard_normal(40)
    out = np.zeros(40, np.float32)
    _gather_scaled(src, np.arange(40)[::-1].copy(), out, 1.0)
    np.testing.assert_array_equal(out, src[::-1].astype(np.float32))

    integers = np.arange(10)
    floats = np.zeros(10)
    _gather_scaled(integers, np.arange(10), floats, 2)
    np.testing.assert_array_equal(floats, np.arange(10) * 2.0)


def test_a_tuple_index_reads_that_element_of_a_2d_array(rng):
    matrix = rng.standard_normal((5, 7))
    for row in range(5):
        out = np.full(7, np.nan)
        _row_of_matrix(matrix, row, out)
        np.testing.assert_array_equal(out, matrix[row])


def test_plain_stores_between_loops_and_results_updated_in_place_are_kept(rng):
    src = rng.standard_normal(13)
    taps = np.zeros(50, np.int64)
    sums = np.zeros((2, 50))
    _two_passes(taps, src, sums)
    i = np.arange(50)
    np.testing.assert_array_equal(sums[0], src[(i * 7) % 13] + src[(i * 7 + 1) % 13])
    np.testing.assert_array_equal(sums[1], 0.0)


def test_a_loop_of_gathers_through_them_vectorises():
    """The loads and stores carry their scopes on every profile; the loop becomes vector gathers
    where the CPU profile has AVX-512. With AVX2 LLVM's cost model prices a gather above the
    scalar loads it replaces and keeps the loop scalar, whatever the aliasing."""
    src, index, out = np.ones(64, np.float32), np.arange(64), np.empty(64)
    _gather_scaled(src, index, out, 2.0)
    np.testing.assert_array_equal(out, 2.0)
    llvm = "".join(_gather_scaled.inspect_llvm().values())
    assert "!alias.scope" in llvm and "!noalias" in llvm
    assert ("llvm.masked.gather" in llvm) == (PROFILE.vector_bytes == 64)


def test_arrays_of_other_kinds_are_refused():
    @njit
    def boolean(flags):
        return load_source(flags, 0)

    with pytest.raises(Exception, match="load_source"):
        boolean(np.zeros(3, np.bool_))
