"""CPU library kernels (backends/numba_cpu/library*.py) against the numpy reference.

Oracle: each op's `reference` (the numpy interpreter every backend is
checked against), plus plain numpy written here where it is short: `@`
for the products, `np.add.at` for scatter-add with repeated indices, a
shifted copy for an integer-translation warp. Shapes are tiny and dtypes
few, so Numba compiles each loop once or twice. float32 results must agree
to rtol 1e-5, float64 to rtol 1e-10. A bad index must raise
IndexOutOfRangeError in this process, before anything is written.

Tiny shapes run the serial compilation of each loop; the tests marked with
the `parallel_loops` fixture force the parallel one (the race-free scatter
partitions included).
"""

from __future__ import annotations

import time

import numpy as np
import pytest

from gradcompiler.backends.numba_cpu import gemm, library, library_vision
from gradcompiler.backends.numba_cpu.library import library_kernel, run_library_op
from gradcompiler.errors import IndexOutOfRangeError
from gradcompiler.kernel import SiblingCalls
from gradcompiler.ops.indexing import (
    IndexingIncrMultiAxisVec,
    IndexingMultiAxisVec,
    IndexingOneHot,
    IndexingSetMultiAxisVec,
    IndexingSetOneHot,
    IndexItem,
    SetSubtensor,
    SliceItem,
    Subtensor,
    TensorItem,
)
from gradcompiler.ops.linalg import BatchedMatrixMul, MatrixMul
from gradcompiler.ops.shape import Concat
from gradcompiler.ops.vision import (
    WarpAffine,
    WarpPerspective,
    WarpPerspectiveBackwardData,
    WarpPerspectiveBackwardMat,
    WarpPerspectiveTangentMat,
)

from oracle import assert_close

RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-10}



def assert_matches(op, *inputs, atol=0.0):
    got = run_library_op(op, *inputs)
    want = op.reference(*inputs)
    assert got.shape == want.shape and got.dtype == want.dtype
    np.testing.assert_allclose(got, want, rtol=RTOL[got.dtype] if got.dtype.kind == "f" else 0,
                               atol=atol, equal_nan=True, err_msg=op.describe())
    return got


def randn(rng, shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


# -- matrix products ---------------------------------------------------------------------------

@pytest.fixture
def own_products(monkeypatch):
    """Record the products that ran through gemm.Multiplier (their batch counts)."""
    calls = []
    original = gemm.Multiplier.__call__

    def recording(self, a, b, out):
        calls.append(a.shape[0])
        return original(self, a, b, out)

    monkeypatch.setattr(gemm.Multiplier, "__call__", recording)
    return calls


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("transpose_b", [False, True])
def test_matrix_mul_2d_all_flags(own_products, rng, dtype, transpose_a, transpose_b):
    a, b = randn(rng, (3, 5), dtype), randn(rng, (5, 4), dtype)
    a_in = np.ascontiguousarray(a.T) if transpose_a else a
    b_in = np.ascontiguousarray(b.T) if transpose_b else b
    got = assert_matches(MatrixMul(transpose_a, transpose_b), a_in, b_in)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=RTOL[np.dtype(dtype)] * 10)
    assert own_products == [1]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("transpose_a", [False, True])
@pytest.mark.parametrize("n", [400, 200, 40])
def test_matrix_mul_split_among_threads(own_products, rng, dtype, transpose_a, n):
    """A product large enough to run parallel, split by columns (400) or by rows (200: more rows
    than columns; 40: too few columns for a panel per thread), with edge tiles and a NaN,
    against float64 numpy."""
    a, b = randn(rng, (300, 70), dtype), randn(rng, (70, n), dtype)
    a[17, 3] = np.nan
    got = run_library_op(MatrixMul(transpose_a, False), np.ascontiguousarray(a.T) if transpose_a else a, b)
    want = (a.astype(np.float64) @ b).astype(dtype)
    assert np.isnan(got[17]).all() and np.isfinite(np.delete(got, 17, axis=0)).all()
    assert_close(got, want, rtol=RTOL[np.dtype(dtype)])
    assert own_products == [1]


def test_matrix_mul_of_float16_goes_to_numpy(own_products, rng):
    a, b = (rng.integers(-9, 9, shape).astype(np.float16) for shape in ((4, 6), (6, 3)))
    got = run_library_op(MatrixMul(), a, b)
    assert got.dtype == np.float16
    np.testing.assert_array_equal(got, a @ b)
    assert own_products == []


@pytest.mark.parametrize("transpose_b", [False, True])
def test_matrix_mul_rows_regime(rng, transpose_b):
    a = randn(rng, (2, 3, 5))
    b = randn(rng, (4, 5) if transpose_b else (5, 4))
    got = assert_matches(MatrixMul(False, transpose_b), a, b)
    assert got.shape == (2, 3, 4)


def test_matrix_mul_flattened_regime(rng):
    """Regime 3 (a batch of rows reduced into a weight gradient): flat Aᵀ·G and G·Bᵀ."""
    a, g, b = randn(rng, (2, 3, 5)), randn(rng, (2, 3, 4)), randn(rng, (2, 7, 4))
    got = assert_matches(MatrixMul(True, False), a, g)
    np.testing.assert_allclose(got, a.reshape(6, 5).T @ g.reshape(6, 4), rtol=1e-5)
    got = assert_matches(MatrixMul(False, True), g, b)
    np.testing.assert_allclose(got, g.reshape(6, 4) @ b.reshape(14, 4).T, rtol=1e-5)


def test_matrix_mul_empty_contraction_gives_zeros():
    got = run_library_op(MatrixMul(), np.ones((3, 0), np.float32), np.ones((0, 2), np.float32))
    np.testing.assert_array_equal(got, np.zeros((3, 2), np.float32))


@pytest.mark.parametrize("a_shape,b_shape", [((0, 5), (5, 4)), ((3, 5), (5, 0)), ((2, 0, 5), (5, 4))])
def test_matrix_mul_with_no_rows_or_columns(a_shape, b_shape):
    a, b = np.ones(a_shape, np.float64), np.ones(b_shape, np.float64)
    assert assert_matches(MatrixMul(), a, b).size == 0


@pytest.mark.parametrize("flags", [(False, False), (True, True), (False, True)])
def test_batched_matrix_mul_broadcasts_batches(rng, flags):
    a = randn(rng, (2, 1, 3, 4) if not flags[0] else (2, 1, 4, 3), np.float64)
    b = randn(rng, (5, 4, 6) if not flags[1] else (5, 6, 4), np.float64)
    got = assert_matches(BatchedMatrixMul(*flags), a, b)
    assert got.shape == (2, 5, 3, 6)


def _batched_reference(op, a, b):
    """The op's reference in float64, cast to the operands' dtype."""
    return op.reference(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("flags", [(False, False), (False, True), (True, False), (True, True)])
@pytest.mark.parametrize("batch", [(7,), (2, 4), (0,), (3, 0)])
def test_batched_matrix_mul_runs_our_products(own_products, rng, dtype, flags, batch):
    """Single items (7), folded batch dims (2, 4), and empty batches, transposed or not."""
    op = BatchedMatrixMul(*flags)
    a = randn(rng, (*batch, *((4, 3) if flags[0] else (3, 4))), dtype)
    b = randn(rng, (*batch, *((5, 4) if flags[1] else (4, 5))), dtype)
    got = run_library_op(op, a, b)
    assert_close(got, _batched_reference(op, a, b), rtol=RTOL[np.dtype(dtype)])
    assert own_products == [int(np.prod(batch))]


@pytest.mark.parametrize("a_shape,b_shape,ours", [((6, 3, 4), (4, 5), True), ((2, 1, 3, 4), (3, 4, 5), False)])
def test_batched_matrix_mul_folds_broadcast_batches(own_products, rng, a_shape, b_shape, ours):
    """A 2-D operand folds into the batch (stride 0); a (2, 1) against a (3,) batch cannot be
    folded without a copy and goes to numpy."""
    op = BatchedMatrixMul()
    a, b = randn(rng, a_shape, np.float64), randn(rng, b_shape, np.float64)
    assert_close(run_library_op(op, a, b), _batched_reference(op, a, b), rtol=RTOL[np.dtype(np.float64)])
    assert bool(own_products) == ours


def test_batched_matrix_mul_of_float16_goes_to_numpy(own_products, rng):
    op = BatchedMatrixMul()
    a, b = randn(rng, (3, 4, 5), np.float16), randn(rng, (3, 5, 2), np.float16)
    np.testing.assert_array_equal(run_library_op(op, a, b), a @ b)
    assert own_products == []


def test_batched_matrix_mul_propagates_nan(own_products, rng):
    op = BatchedMatrixMul(False, True)
    a, b = randn(rng, (5, 3, 4)), randn(rng, (5, 6, 4))
    a[1, 2, 0] = np.nan
    b[4, :, 3] = np.nan
    got = run_library_op(op, a, b)
    assert np.isnan(got[1, 2]).all() and np.isnan(got[4]).all()
    assert_close(got, _batched_reference(op, a, b), rtol=RTOL[np.dtype(np.float32)])
    assert own_products == [5]


def test_in_spans_gives_each_span_to_one_thread_in_order():
    seen = []

    def work(part, first, stop):
        seen.append((part, first))
        return list(range(first, stop))

    spans = library.split_spans(10, 7)
    assert library.in_spans(work, spans, 3) == [list(range(a, b)) for a, b in spans]
    assert sorted(first for _, first in seen) == [a for a, _ in spans] and {p for p, _ in seen} <= {0, 1, 2}


def test_in_spans_raises_a_threads_error_after_every_thread_stopped():
    active, done = set(), []

    def work(part, first, stop):
        active.add(first)
        try:
            if first == 2:
                raise ValueError("span 2")
            time.sleep(0.002)
            done.append(first)
        finally:
            active.discard(first)

    with pytest.raises(ValueError, match="span 2"):
        library.in_spans(work, library.split_spans(40, 40), 2)
    assert not active and len(done) < 39   # nothing still running; the rest were not taken


def test_in_spans_restores_blas_threads():
    def threads():
        return [lib.num_threads for lib in library.single_threaded_blas._blas()]

    before = threads()
    inside = library.in_spans(lambda part, first, stop: max(threads()), library.split_spans(4, 4), 2)
    assert inside == [1] * 4
    assert threads() == before


# -- regions -----------------------------------------------------------------------------------

def test_concat(rng):
    parts = [randn(rng, (2, k, 3)) for k in (1, 4, 2)]
    got = assert_matches(Concat(1), *parts)
    np.testing.assert_array_equal(got[:, 1:5], parts[1])


def test_subtensor_and_set_subtensor(rng):
    x = randn(rng, (5, 6, 7))
    items = (SliceItem(0, 4, -2, 2), IndexItem(1, 3), SliceItem(2, 1, 3, 2))
    got = assert_matches(Subtensor(items), x)
    np.testing.assert_array_equal(got, x[4:0:-2, 3, 1:7:3])
    value = randn(rng, got.shape)
    out = assert_matches(SetSubtensor(items), x, value)
    np.testing.assert_array_equal(out[4:0:-2, 3, 1:7:3], value)


def test_set_subtensor_in_place(rng):
    """The memory plan may pass the data buffer as `out`."""
    data, value = randn(rng, (4, 3)), randn(rng, (2, 3))
    expected = data.copy()
    expected[1:3] = value
    library_kernel(SetSubtensor((SliceItem(0, 1, 1, 2),)))(data, value, out=data)
    np.testing.assert_array_equal(data, expected)


# -- advanced indexing -------------------------------------------------------------------------

ADVANCED_CASES = [
    # items, data shape, index tensors
    ((TensorItem(0),), (6, 3), [np.array([0, 5, -1, 2, 2, 0])]),
    ((SliceItem(0, 1, 1, 3), TensorItem(1), TensorItem(2)), (5, 6, 7), [np.array([[0], [5]]), np.array([1, 2, 6])]),
    ((TensorItem(0), TensorItem(2)), (4, 3, 5), [np.array([1, 2, 3]), np.array(-2, dtype=np.int32)]),
    ((TensorItem(1),), (3, 4, 2), [np.array([[3, 0], [1, 3]], dtype=np.int32)]),
    ((TensorItem(0), SliceItem(1, 5, -2, 3), TensorItem(2)), (3, 6, 4), [np.array([2, 0, 2]), np.array([1, 3, 1])]),
    # rows of a table (the loops' own path), with a reversed, offset run and with no lookups
    ((TensorItem(0), SliceItem(1, 3, -1, 3)), (5, 4), [np.array([[4, 0], [4, -1], [2, 4]])]),
    ((TensorItem(0),), (6, 3), [np.array([], np.int64)]),
]


@pytest.mark.parametrize("items,shape,indices", ADVANCED_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gather(rng, items, shape, indices, dtype):
    x = randn(rng, shape, dtype)
    got = assert_matches(IndexingMultiAxisVec(items), x, *indices)
    key = [slice(None)] * len(shape)
    for item, idx in zip((i for i in items if isinstance(i, TensorItem)), indices):
        key[item.axis] = idx
    for item in items:
        if isinstance(item, SliceItem):
            key[item.axis] = item.as_slice()
    np.testing.assert_array_equal(got, x[tuple(key)])


@pytest.mark.parametrize("items,shape,indices", ADVANCED_CASES)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_scatter_add_accumulates_repeats(rng, items, shape, indices, dtype):
    """Every case but the empty one has repeated positions; the result must equal np.add.at's."""
    data = randn(rng, shape, dtype)
    op = IndexingIncrMultiAxisVec(items)
    region = IndexingMultiAxisVec(items).reference(data, *indices)
    value = randn(rng, region.shape, dtype)
    got = assert_matches(op, data, value, *indices)
    grid = np.arange(data.size).reshape(shape)
    expected = data.copy().reshape(-1)
    np.add.at(expected, IndexingMultiAxisVec(items).reference(grid, *indices).ravel(), value.ravel())
    np.testing.assert_array_equal(got.reshape(-1), expected)


@pytest.mark.parametrize("items,shape,indices", ADVANCED_CASES)
def test_set_last_write_wins(rng, items, shape, indices):
    data = randn(rng, shape)
    value = randn(rng, IndexingMultiAxisVec(items).reference(data, *indices).shape)
    assert_matches(IndexingSetMultiAxisVec(items), data, value, *indices)


def test_embedding_scatter_in_place_with_many_repeats(rng):
    table = np.zeros((50, 8), np.float32)
    idx = rng.integers(0, 50, 3000)
    g = randn(rng, (3000, 8))
    library_kernel(IndexingIncrMultiAxisVec((TensorItem(0),)))(table, g, idx, out=table)
    expected = np.zeros((50, 8), np.float32)
    np.add.at(expected, idx, g)
    np.testing.assert_array_equal(table, expected)


@pytest.mark.parametrize("op", [IndexingMultiAxisVec((TensorItem(1),)), IndexingIncrMultiAxisVec((TensorItem(1),)),
                                IndexingSetMultiAxisVec((TensorItem(1),))])
@pytest.mark.parametrize("bad", [4, -5, 1000])
def test_advanced_index_out_of_range_raises_before_writing(op, bad):
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([0, bad, 1])
    inputs = (data,) if isinstance(op, IndexingMultiAxisVec) else (data, np.ones((3, 3), np.float32))
    out = np.full((3, 3) if isinstance(op, IndexingMultiAxisVec) else (3, 4), 7.0, np.float32)
    with pytest.raises(IndexOutOfRangeError, match=rf"{op.name}.*{bad}.*axis 1 of size 4"):
        library_kernel(op)(*inputs, idx, out=out)
    assert np.all(out == 7.0)


# -- one-hot indexing --------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2])
def test_one_hot_gather_and_set(rng, axis):
    src = randn(rng, (3, 4, 5))
    index_shape = src.shape[:axis] + src.shape[axis + 1:]
    index = rng.integers(0, src.shape[axis], index_shape).astype(np.int32)
    got = assert_matches(IndexingOneHot(axis), src, index)
    np.testing.assert_array_equal(got, np.take_along_axis(src, np.expand_dims(index, axis), axis))
    sub = randn(rng, got.shape)
    assert_matches(IndexingSetOneHot(axis), src, index, sub)


@pytest.mark.parametrize("bad", [-1, 5])
def test_one_hot_rejects_out_of_range_without_wrapping(bad):
    src = np.zeros((2, 5), np.float32)
    index = np.array([1, bad])
    with pytest.raises(IndexOutOfRangeError, match=rf"IndexingOneHot: index value {bad} is outside \[0, 5\)"):
        run_library_op(IndexingOneHot(1), src, index)
    out = np.full((2, 5), 3.0, np.float32)
    with pytest.raises(IndexOutOfRangeError, match="IndexingSetOneHot"):
        library_kernel(IndexingSetOneHot(1))(src, index, np.ones((2, 1), np.float32), out=out)
    assert np.all(out == 3.0)


# -- warps -------------------------------------------------------------------------------------

MODES = ("replicate", "reflect", "reflect_101", "wrap", "constant")


def _images(rng, fmt, n=2, c=3, h=6, w=7):
    nchw = randn(rng, (n, c, h, w))
    return nchw if fmt == "NCHW" else np.ascontiguousarray(nchw.transpose(0, 2, 3, 1))


def _matrices(rng, n):
    """Near-identity perspective matrices that push samples well outside a 6×7 image."""
    m = np.eye(3) + rng.normal(0, 0.15, (n, 3, 3)) * np.array([[1, 1, 4], [1, 1, 4], [0.02, 0.02, 0]])
    return m.astype(np.float32)


def assert_gradients_match(mode, border_val, fmt, src, mat, mat_idx, g, atol=(0.0, 0.0)):
    """The backward ops as one `SiblingCalls` (the joint one-pass kernel, `_gradients_loop`),
    alone and with the forward warp, in several orders: each gradient against its op's
    reference (`atol`: BackwardData's, BackwardMat's), the forward warp equal to the forward
    op's own kernel bit for bit (the joint kernel blends the same taps in the same order)."""
    forward = WarpPerspective(g.shape[2:] if fmt == "NCHW" else g.shape[1:3], mode, border_val, fmt)
    data = WarpPerspectiveBackwardData(src.shape, mode, border_val, fmt)
    mat_op = WarpPerspectiveBackwardMat(mode, border_val, fmt)
    values = (src, mat, *(() if mat_idx is None else (mat_idx,)), g)
    parts = {forward: tuple(range(len(values) - 1)), data: tuple(range(1, len(values))),
             mat_op: tuple(range(len(values)))}
    want = {forward: run_library_op(forward, *values[:-1]), data: data.reference(*values[1:]),
            mat_op: mat_op.reference(*values)}
    for ops in ((data, mat_op), (mat_op, data), (forward, data, mat_op), (mat_op, forward)):
        joint = SiblingCalls(ops, tuple(parts[o] for o in ops))
        got = tuple(np.full(want[o].shape, np.nan, want[o].dtype) for o in ops)
        library_kernel(joint)(*values, out=got)
        for o, array in zip(ops, got):
            if o is forward:
                np.testing.assert_array_equal(array, want[o], err_msg=f"the forward in {joint.describe()}")
            else:
                np.testing.assert_allclose(array, want[o], rtol=RTOL[array.dtype], atol=atol[o is mat_op],
                                           equal_nan=True, err_msg=f"{o.describe()} in {joint.describe()}")


def test_warp_calls_of_other_images_or_gradients_run_in_turn(rng):
    """The sibling key leaves the image and the upstream gradient open: calls that read other
    ones than BackwardMat does are not the joint kernel's, and each runs its own."""
    src, other_src = _images(rng, "NCHW"), _images(rng, "NCHW")
    mat = _matrices(rng, 2)
    g, other_g = randn(rng, (2, 3, 5, 8)), randn(rng, (2, 3, 5, 8))
    forward = WarpPerspective((5, 8), "constant", 0.5, "NCHW")
    data = WarpPerspectiveBackwardData(src.shape, "constant", 0.5, "NCHW")
    mat_op = WarpPerspectiveBackwardMat("constant", 0.5, "NCHW")
    values = (src, mat, g, other_src, other_g)
    joint = SiblingCalls((forward, data, mat_op), ((3, 1), (1, 4), (0, 1, 2)))
    got = (np.empty((2, 3, 5, 8), np.float32), np.empty(src.shape, np.float32), np.empty((2, 3, 3), np.float32))
    library_kernel(joint)(*values, out=got)
    np.testing.assert_array_equal(got[0], run_library_op(forward, other_src, mat))
    np.testing.assert_allclose(got[1], data.reference(mat, other_g), rtol=RTOL[np.dtype(np.float32)], atol=1e-5)
    np.testing.assert_allclose(got[2], mat_op.reference(src, mat, g), rtol=RTOL[np.dtype(np.float32)], atol=1e-4)


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", MODES)
def test_warp_perspective_forward_and_backwards(rng, mode, fmt):
    src = _images(rng, fmt)
    mat = _matrices(rng, 3)
    mat_idx = np.array([1, 0, 1], np.int32)
    out = assert_matches(WarpPerspective((5, 8), mode, 0.7, fmt), src, mat, mat_idx, atol=1e-6)
    g = randn(rng, out.shape)
    assert_matches(WarpPerspectiveBackwardData(src.shape, mode, 0.7, fmt), mat, mat_idx, g, atol=1e-5)
    assert_matches(WarpPerspectiveBackwardMat(mode, 0.7, fmt), src, mat, mat_idx, g, atol=1e-4)
    assert_gradients_match(mode, 0.7, fmt, src, mat, mat_idx, g, atol=(1e-5, 1e-4))
    # without mat_idx: one matrix per image
    assert_matches(WarpPerspective((5, 8), mode, 0.7, fmt), src, mat[:2], atol=1e-6)
    assert_matches(WarpPerspectiveBackwardData(src.shape, mode, 0.7, fmt), mat[:2], g[:2], atol=1e-5)
    assert_matches(WarpPerspectiveBackwardMat(mode, 0.7, fmt), src, mat[:2], g[:2], atol=1e-4)
    assert_gradients_match(mode, 0.7, fmt, src, mat[:2], None, g[:2], atol=(1e-5, 1e-4))


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
@pytest.mark.parametrize("mode", MODES)
def test_warp_affine(rng, mode, fmt):
    src = _images(rng, fmt)
    mat = _matrices(rng, 2)[:, :2, :].copy()
    assert_matches(WarpAffine((4, 9), mode, -0.5, fmt), src, mat, atol=1e-6)


def test_warp_affine_integer_shift_is_a_shifted_copy(rng):
    """mat = [[1,0,1],[0,1,2]] samples src[h+2, w+1] exactly (op-reference §9.6)."""
    src = _images(rng, "NCHW", h=8, w=9)
    mat = np.tile(np.array([[1, 0, 1], [0, 1, 2]], np.float32), (2, 1, 1))
    out = run_library_op(WarpAffine((6, 8), "constant", 0.0, "NCHW"), src, mat)
    np.testing.assert_array_equal(out, src[:, :, 2:8, 1:9])


def test_warp_non_finite_matrix_matches_reference(rng):
    """den = 0: border_val (CONSTANT) or NaN (other modes), and no gradient."""
    src = _images(rng, "NCHW")
    mat = np.tile(np.eye(3, dtype=np.float32), (2, 1, 1))
    mat[0, 2] = 0.0
    for mode in ("constant", "replicate"):
        out = assert_matches(WarpPerspective((3, 4), mode, 0.25, "NCHW"), src, mat)
        assert np.isnan(out[0]).all() if mode == "replicate" else (out[0] == 0.25).all()
        g = randn(rng, out.shape)
        assert_matches(WarpPerspectiveBackwardMat(mode, 0.25, "NCHW"), src, mat, g, atol=1e-4)
        assert_matches(WarpPerspectiveBackwardData(src.shape, mode, 0.25, "NCHW"), mat, g, atol=1e-5)
        assert_gradients_match(mode, 0.25, "NCHW", src, mat, None, g, atol=(1e-5, 1e-4))


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's inf - inf, 0 * inf
@pytest.mark.parametrize("mode", MODES)
def test_warps_of_non_finite_images_and_gradients_over_several_row_blocks(parallel_loops, rng, mode):
    """NaN and ±inf pixels in the image and the upstream gradient, repeated matrices and a
    non-finite one, in float64 to 1e-10; 3 × 11 output rows make two blocks of rows and a
    partial one (`ROWS_PER_BLOCK`), so every loop's block bounds are crossed."""
    assert 3 * 11 > 2 * library_vision.ROWS_PER_BLOCK
    src = randn(rng, (2, 3, 6, 7), np.float64)
    src.reshape(-1)[::9] = np.nan
    src.reshape(-1)[4::13] = np.inf
    src.reshape(-1)[5::17] = -np.inf
    mat = _matrices(rng, 3).astype(np.float64)
    mat[2, 2] = 0.0                       # den = 0 everywhere: a non-finite source point
    mat_idx = np.array([1, 1, 0], np.int32)
    out = assert_matches(WarpPerspective((11, 5), mode, 0.7, "NCHW"), src, mat, mat_idx)
    g = randn(rng, out.shape, np.float64)
    g.reshape(-1)[3::11] = np.nan
    assert_matches(WarpPerspectiveBackwardData(src.shape, mode, 0.7, "NCHW"), mat, mat_idx, g)
    assert_matches(WarpPerspectiveBackwardMat(mode, 0.7, "NCHW"), src, mat, mat_idx, g, atol=1e-10)
    assert_gradients_match(mode, 0.7, "NCHW", src, mat, mat_idx, g, atol=(0.0, 1e-10))
    v = randn(rng, mat.shape, np.float64)
    assert_matches(WarpPerspectiveTangentMat((11, 5), mode, 0.7, "NCHW"), src, mat, mat_idx, v, atol=1e-10)


def test_warp_float64_forward(rng):
    src = randn(rng, (1, 2, 5, 6), np.float64)
    mat = _matrices(rng, 1).astype(np.float64)
    assert_matches(WarpPerspective((4, 4), "reflect_101", 0.0, "NCHW"), src, mat)


def test_warp_mat_idx_out_of_range_raises(rng):
    src = _images(rng, "NCHW")
    mat = _matrices(rng, 2)
    with pytest.raises(IndexOutOfRangeError, match=r"WarpPerspective.*mat_idx value 2.*size 2"):
        run_library_op(WarpPerspective((3, 3), "replicate", 0.0, "NCHW"), src, mat, np.array([0, 2], np.int32))
    g = np.ones((2, 3, 3, 3), np.float32)
    with pytest.raises(IndexOutOfRangeError, match=r"mat_idx value -1"):
        run_library_op(WarpPerspectiveBackwardData(src.shape, "wrap", 0.0, "NCHW"), mat,
                       np.array([-1, 0], np.int32), g)


# -- the parallel compilations -----------------------------------------------------------------

@pytest.mark.parametrize("items,shape,indices", [ADVANCED_CASES[0], ADVANCED_CASES[4]])
def test_parallel_gather_and_scatters(parallel_loops, rng, items, shape, indices):
    data = randn(rng, shape)
    region = assert_matches(IndexingMultiAxisVec(items), data, *indices)
    value = randn(rng, region.shape)
    got = assert_matches(IndexingIncrMultiAxisVec(items), data, value, *indices)
    grid = np.arange(data.size).reshape(shape)
    expected = data.copy().reshape(-1)
    np.add.at(expected, IndexingMultiAxisVec(items).reference(grid, *indices).ravel(), value.ravel())
    np.testing.assert_array_equal(got.reshape(-1), expected)
    assert_matches(IndexingSetMultiAxisVec(items), data, value, *indices)


def test_parallel_embedding_scatter(parallel_loops, rng):
    """Both partitions see repeats of rows they own; sums must equal np.add.at's exactly."""
    idx = rng.integers(0, 40, 5000)
    g = randn(rng, (5000, 8))
    table = np.zeros((40, 8), np.float32)
    library_kernel(IndexingIncrMultiAxisVec((TensorItem(0),)))(table, g, idx, out=table)
    expected = np.zeros((40, 8), np.float32)
    np.add.at(expected, idx, g)
    np.testing.assert_array_equal(table, expected)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_parallel_table_rows_with_nan(parallel_loops, rng, dtype):
    """The table-rows loops: a NaN table row gathers as NaN and a NaN value poisons only the
    row it is added into, repeats and all; equal to the reference interpreter."""
    items = (TensorItem(0),)
    table = randn(rng, (30, 5), dtype)
    table[7] = np.nan
    idx = rng.integers(-30, 30, 400)
    idx[:3] = (7, 7, -23)
    value = randn(rng, (400, 5), dtype)
    value[10, 2] = np.nan
    gather, scatter = IndexingMultiAxisVec(items), IndexingIncrMultiAxisVec(items)
    assert_close(run_library_op(gather, table, idx), gather.reference(table, idx), rtol=RTOL[np.dtype(dtype)])
    got = run_library_op(scatter, table, value, idx)
    assert_close(got, scatter.reference(table, value, idx), rtol=RTOL[np.dtype(dtype)])
    assert np.isnan(got[idx[10] % 30, 2]) and np.isnan(got[7]).all()


def test_parallel_one_hot(parallel_loops, rng):
    src = randn(rng, (6, 5, 4))
    index = rng.integers(0, 5, (6, 4))
    got = assert_matches(IndexingOneHot(1), src, index)
    assert_matches(IndexingSetOneHot(1), src, index, randn(rng, got.shape))


def test_sibling_calls_without_a_joint_kernel_run_each_kernel_in_turn(rng):
    """A `SiblingCalls` of ops no joint kernel covers: each op's own kernel, on its inputs."""
    a, b = randn(rng, (3, 4)), randn(rng, (4, 2))
    joint = SiblingCalls((MatrixMul(), Concat(axis=0)), ((0, 1), (1, 1)))
    got = (np.full((3, 2), np.nan, np.float32), np.full((8, 2), np.nan, np.float32))
    library_kernel(joint)(a, b, out=got)
    np.testing.assert_allclose(got[0], a @ b, rtol=RTOL[got[0].dtype])
    np.testing.assert_array_equal(got[1], np.concatenate([b, b]))


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_warp_gradients_of_unread_images_and_of_no_matrices(parallel_loops, rng, fmt):
    """The joint kernel zeroes the gradient of an image no matrix reads (its owner thread
    does), and with no matrices at all the image gradient is zero and the matrix one empty."""
    src = _images(rng, fmt, n=4)
    mat = _matrices(rng, 2)
    g = randn(rng, (2, 3, 5, 8) if fmt == "NCHW" else (2, 5, 8, 3))
    assert_gradients_match("replicate", 0.0, fmt, src, mat, np.array([2, 2], np.int32), g, atol=(1e-5, 1e-4))
    assert_gradients_match("constant", 0.5, fmt, src, mat[:0], np.zeros(0, np.int32), g[:0])


@pytest.mark.parametrize("joint", [False, True])
def test_warp_image_gradient_is_summed_in_float64(rng, joint):
    """300 matrices reading one float32 image: each pixel of its gradient is the float64 sum of
    many terms, rounded once (`_scatter_row`), so it is the reference's sum of the same terms
    in float64 rounded to float32, where float32 sums were up to 1.3e-5 off. The matrices
    shift by halves of a pixel, so every weight (0, 1/4, 1/2, 1) and term is exact in both."""
    mat = np.tile(np.eye(3, dtype=np.float32), (300, 1, 1))
    mat[:, :2, 2] = rng.integers(-4, 5, (300, 2)) / 2
    g = randn(rng, (300, 2, 5, 8))
    mat_idx = np.zeros(300, np.int32)
    data = WarpPerspectiveBackwardData((1, 2, 6, 7), "replicate", 0.0, "NCHW")
    if joint:
        src = _images(rng, "NCHW", n=1, c=2)
        op = SiblingCalls((data, WarpPerspectiveBackwardMat("replicate", 0.0, "NCHW")), ((1, 2, 3), (0, 1, 2, 3)))
        got = (np.empty((1, 2, 6, 7), np.float32), np.empty((300, 3, 3), np.float32))
        library_kernel(op)(src, mat, mat_idx, g, out=got)
        got = got[0]
    else:
        got = run_library_op(data, mat, mat_idx, g)
    want = data.reference(mat, mat_idx, g.astype(np.float64))
    np.testing.assert_array_equal(got, want.astype(np.float32))


@pytest.mark.parametrize("fmt", ["NCHW", "NHWC"])
def test_parallel_warps(parallel_loops, rng, fmt):
    src = _images(rng, fmt)
    mat = _matrices(rng, 3)
    mat_idx = np.array([1, 1, 0], np.int32)
    out = assert_matches(WarpPerspective((5, 8), "reflect", 0.0, fmt), src, mat, mat_idx, atol=1e-6)
    g = randn(rng, out.shape)
    assert_matches(WarpPerspectiveBackwardData(src.shape, "reflect", 0.0, fmt), mat, mat_idx, g, atol=1e-5)
    assert_matches(WarpPerspectiveBackwardMat("reflect", 0.0, fmt), src, mat, mat_idx, g, atol=1e-4)
    assert_gradients_match("reflect", 0.0, fmt, src, mat, mat_idx, g, atol=(1e-5, 1e-4))
