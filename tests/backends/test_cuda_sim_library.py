"""CUDA library kernels on Numba's CUDA simulator (or a real GPU under make gpu-check).

Oracles: plain numpy written here (matmul, reductions, gathers, np.add.at
for scatter-add, explicit loops for last-write-wins), the adjoint identity
of the warp backward-data op, and, for the warps' bilinear sampling, the
op's numpy reference (itself tested against per-pixel loops in
tests/ops/test_vision_forward.py). Shapes and blocks are tiny: the
simulator runs every GPU thread as a Python thread.
"""

from __future__ import annotations

import numpy as np
import pytest

from gradcompiler.errors import DTypeError, IndexOutOfRangeError

import oracle
from cuda_support import cuda_for_tests

cuda = cuda_for_tests()

from gradcompiler.backends.numba_cuda.device import LaunchConfig, default_config, is_device_array, to_device  # noqa: E402
from gradcompiler.backends.numba_cuda.library import cuda_library_kernel, run_library_op  # noqa: E402
from gradcompiler.backends.numba_cuda.library_reduce import PartialFold  # noqa: E402
from gradcompiler.ir import TensorType  # noqa: E402
from gradcompiler.ops.indexing import (  # noqa: E402
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
from gradcompiler.ops.linalg import BatchedMatrixMul, MatrixMul  # noqa: E402
from gradcompiler.ops.reduce import Reduce, ReduceTo  # noqa: E402
from gradcompiler.ops.shape import Concat  # noqa: E402
from gradcompiler.ops.vision import (  # noqa: E402
    BORDER_MODES,
    WarpAffine,
    WarpPerspective,
    WarpPerspectiveBackwardData,
    WarpPerspectiveBackwardMat,
    WarpPerspectiveTangentMat,
)

GRID_STRIDE = LaunchConfig(block=8, max_blocks=1, reduce_block=4, tile=2, column_chunks=3)
"""One block per launch: every grid-stride loop must go round more than once."""


def assert_close(got, want, rtol=1e-5):
    """float32 agreement to `rtol`, with an absolute floor at rtol × the largest finite
    magnitude (sums that cancel to near zero carry the rounding of their largest terms)."""
    oracle.assert_close(got, want, rtol=rtol)


@pytest.fixture
def f32(rng):
    return lambda *shape: rng.standard_normal(shape).astype(np.float32)


def _t(flag, x):
    return np.swapaxes(x, -1, -2) if flag else x


# -- matmul ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("ta, tb", [(False, False), (True, False), (False, True), (True, True)])
def test_matrix_mul_honours_transpose_flags(f32, ta, tb):
    a, b = f32(*((7, 5) if ta else (5, 7))), f32(*((6, 7) if tb else (7, 6)))
    assert_close(run_library_op(MatrixMul(ta, tb), a, b), _t(ta, a) @ _t(tb, b))


def test_matrix_mul_regime_2_flattens_rows_of_a(f32):
    a, b = f32(2, 3, 7), f32(6, 7)
    assert_close(run_library_op(MatrixMul(False, True), a, b), np.einsum("ijk,lk->ijl", a, b))


def test_matrix_mul_regime_3_contracts_batch_of_rows(f32):
    a, g = f32(2, 3, 5), f32(2, 3, 4)
    assert_close(run_library_op(MatrixMul(True, False), a, g), a.reshape(6, 5).T @ g.reshape(6, 4))


def test_matrix_mul_with_empty_inner_dim_is_zero(f32):
    out = run_library_op(MatrixMul(), f32(3, 0), f32(0, 4))
    assert out.shape == (3, 4) and not out.any()


@pytest.mark.parametrize("ta, tb", [(False, False), (True, True)])
def test_batched_matrix_mul_broadcasts_batches(f32, ta, tb):
    a = f32(2, 1, *((5, 3) if ta else (3, 5)))
    b = f32(3, *((4, 5) if tb else (5, 4)))
    assert_close(run_library_op(BatchedMatrixMul(ta, tb), a, b), np.matmul(_t(ta, a), _t(tb, b)))


def test_matmul_tiles_and_grid_stride_over_rows_and_batches(f32):
    a, b = f32(3, 9, 5), f32(3, 5, 7)
    out = run_library_op(BatchedMatrixMul(), a, b, config=GRID_STRIDE)
    assert_close(out, np.matmul(a, b))


# -- reductions -----------------------------------------------------------------------------------

NUMPY_REDUCE = {
    "SUM": lambda x, ax, k: x.sum(axis=ax, keepdims=k), "MEAN": lambda x, ax, k: x.mean(axis=ax, keepdims=k),
    "MAX": lambda x, ax, k: x.max(axis=ax, keepdims=k), "MIN": lambda x, ax, k: x.min(axis=ax, keepdims=k),
    "PRODUCT": lambda x, ax, k: x.prod(axis=ax, keepdims=k),
    "SUM_SQR": lambda x, ax, k: (x * x).sum(axis=ax, keepdims=k),
}
LAYOUTS = {  # shape, axes, keepdims: which kernel each one takes
    "row": ((3, 11), (1,), False), "leading_axis": ((11, 3), (0,), False), "full": ((5, 7), None, False),
    "mixed_keepdims": ((3, 4, 5), (0, 2), True), "middle": ((2, 9, 3), (1,), True),
}


@pytest.mark.parametrize("mode", list(NUMPY_REDUCE))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_reduce_every_mode_and_layout(rng, mode, layout):
    shape, axes, keep = LAYOUTS[layout]
    x = rng.uniform(0.5, 1.5, shape).astype(np.float32) * rng.choice([-1, 1], shape).astype(np.float32)
    want = np.asarray(NUMPY_REDUCE[mode](x, axes, keep), np.float32)
    assert_close(run_library_op(Reduce(mode, axes, keep), x), want)


@pytest.mark.parametrize("layout", ["row", "leading_axis", "full"])
def test_reduce_two_stage_with_one_block(rng, layout):
    shape, axes, keep = LAYOUTS[layout]
    x = rng.standard_normal(shape).astype(np.float32)
    assert_close(run_library_op(Reduce("SUM", axes, keep), x, config=GRID_STRIDE), x.sum(axis=axes, keepdims=keep))


def test_reduce_integers_and_max_propagates_nan(rng):
    x = rng.integers(-50, 50, (9, 4)).astype(np.int32)
    x[:4, 0] = 2**30  # the int32 sum would wrap: numpy's, and so ours, accumulates in int64
    got = run_library_op(Reduce("SUM", (0,)), x)
    assert got.dtype == np.int64 and (got == x.sum(axis=0)).all()
    assert (run_library_op(Reduce("MAX", (1,)), x) == x.max(axis=1)).all()
    y = np.ones((2, 5), np.float32)
    y[1, 3] = np.nan
    got = run_library_op(Reduce("MAX", (1,)), y)
    assert got[0] == 1 and np.isnan(got[1])


@pytest.mark.parametrize("mode, divisor", [("SUM", None), ("MAX", None), ("MIN", None), ("PRODUCT", None),
                                           ("SUM", 50)])
@pytest.mark.parametrize("count, width", [(37, 1), (37, 5), (3, 1), (1, 4)])
def test_partial_fold_combines_every_blocks_partial(rng, mode, divisor, count, width):
    """Stage two of a generated kernel's reduction over axis 0: partials (count, width) folded
    over their leading axis, divided by the kernel's own divisor for a MEAN (here 50: the
    count of elements the partials summed, not the count of partials)."""
    partials = rng.uniform(0.5, 1.5, (count, width)).astype(np.float32)
    want = NUMPY_REDUCE["MEAN" if divisor else mode](partials, 0, False)
    if divisor:
        want = partials.sum(axis=0) / np.float32(divisor)
    out = cuda.device_array(width, np.float32)
    PartialFold(mode, divisor, np.float32, count, width, default_config())(cuda.to_device(partials.reshape(-1)), out)
    assert_close(out.copy_to_host(), np.asarray(want, np.float32))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the simulator's 0/0 for MEAN
def test_reduce_over_empty_axis_gives_identities():
    x = np.zeros((3, 0), np.float32)
    assert (run_library_op(Reduce("SUM", (1,)), x) == 0).all()
    assert (run_library_op(Reduce("PRODUCT", (1,)), x) == 1).all()
    assert np.isnan(run_library_op(Reduce("MEAN", (1,)), x)).all()


def test_reduce_to_sums_broadcast_dims(f32):
    x = f32(3, 4, 5)
    assert_close(run_library_op(ReduceTo((4, 1)), x), x.sum(axis=(0, 2)).reshape(4, 1))


# -- gathers and scatters -------------------------------------------------------------------------

def test_multi_axis_gather_non_consecutive_axes_go_first(f32):
    x = f32(4, 3, 5)
    i, j = np.array([1, -1], np.int64), np.array([[0], [4]], np.int32)
    op = IndexingMultiAxisVec((TensorItem(0), SliceItem(1, 0, 2, 2), TensorItem(2)))
    assert_close(run_library_op(op, x, i, j), x[i, 0:4:2, j])


def test_multi_axis_gather_consecutive_axes_stay_in_place(f32):
    x = f32(2, 4, 3, 5)
    i, j = np.array([[3, 0, 1]], np.int32), np.array([2, 2, -3], np.int64)
    op = IndexingMultiAxisVec((TensorItem(1), TensorItem(2)))
    assert_close(run_library_op(op, x, i, j), x[:, i, j])


def test_gather_reads_device_indices_without_a_host_copy(f32):
    x = f32(6, 3)
    idx = cuda.to_device(np.array([5, 0, -2, 5], np.int64))
    assert to_device(idx) is idx and is_device_array(idx)
    out = run_library_op(IndexingMultiAxisVec((TensorItem(0),)), to_device(x), idx, to_host=False)
    assert is_device_array(out)
    assert_close(out.copy_to_host(), x[[5, 0, -2, 5]])


@pytest.mark.parametrize("on_device", [False, True])
def test_gather_index_out_of_range_is_an_error(f32, on_device):
    idx = np.array([0, 6, 1], np.int64)
    with pytest.raises(IndexOutOfRangeError, match=r"index value 6 .* axis 0 of size 6"):
        run_library_op(IndexingMultiAxisVec((TensorItem(0),)), f32(6, 3),
                       cuda.to_device(idx) if on_device else idx)


@pytest.mark.parametrize("config", [None, GRID_STRIDE], ids=["default", "one_block"])
def test_scatter_add_accumulates_repeated_indices(f32, config):
    data, value = f32(4, 3), f32(7, 3)
    idx = np.array([2, 0, 2, 2, -1, 0, 2], np.int64)
    want = data.copy()
    np.add.at(want, idx, value)
    assert_close(run_library_op(IndexingIncrMultiAxisVec((TensorItem(0),)), data, value, idx, config=config), want)


def test_scatter_add_on_the_middle_axis_with_device_inputs(f32):
    data, value = f32(2, 5, 3), f32(2, 6, 3)
    idx = np.array([4, 4, 1, 4, 0, 1], np.int32)
    want = data.copy()
    for k, i in enumerate(idx):
        want[:, i] += value[:, k]
    op = IndexingIncrMultiAxisVec((TensorItem(1),))
    got = run_library_op(op, to_device(data), to_device(value), to_device(idx))
    assert_close(got, want)


def test_scatter_add_refuses_dtypes_without_atomics():
    with pytest.raises(DTypeError, match="atomic"):
        cuda_library_kernel(IndexingIncrMultiAxisVec((TensorItem(0),)),
                            [TensorType((3,), np.int8), TensorType((2,), np.int8), TensorType((2,), np.int32)],
                            default_config())


def test_scatter_set_last_write_wins_in_row_major_order(f32):
    data, value = f32(5, 2), f32(6, 2)
    idx = np.array([3, 1, 3, 0, 1, 3], np.int64)
    want = data.copy()
    for k, i in enumerate(idx):
        want[i] = value[k]
    got = run_library_op(IndexingSetMultiAxisVec((TensorItem(0),)), data, value, idx, config=GRID_STRIDE)
    assert (got == want).all()


def test_scatter_with_bad_index_leaves_no_partial_result(f32):
    with pytest.raises(IndexOutOfRangeError, match="-6"):
        run_library_op(IndexingIncrMultiAxisVec((TensorItem(0),)), f32(5, 2), f32(2, 2),
                       np.array([1, -6], np.int64))


def test_subtensor_and_set_subtensor(f32):
    x, value = f32(4, 3, 2), f32(2, 2)
    items = (SliceItem(0, 3, -2, 2), IndexItem(1, 2))
    assert_close(run_library_op(Subtensor(items), x), x[3::-2, 2])
    want = x.copy()
    want[3::-2, 2] = value
    assert (run_library_op(SetSubtensor(items), x, value) == want).all()


def test_one_hot_gather_and_set(f32, rng):
    src = f32(3, 5, 4)
    index = rng.integers(0, 5, (3, 4)).astype(np.int32)
    pre, post = np.meshgrid(np.arange(3), np.arange(4), indexing="ij")
    assert_close(run_library_op(IndexingOneHot(1), src, index), src[pre, index, post][:, None, :])
    sub = f32(3, 1, 4)
    want = src.copy()
    want[pre, index, post] = sub[:, 0, :]
    assert (run_library_op(IndexingSetOneHot(1), src, index, sub) == want).all()


@pytest.mark.parametrize("bad", [5, -1])
def test_one_hot_does_not_wrap_negative_indices(f32, bad):
    index = np.array([[0, bad]], np.int32)
    with pytest.raises(IndexOutOfRangeError, match=rf"index value {bad} is outside \[0, 5\)"):
        run_library_op(IndexingOneHot(1), f32(1, 5, 2), index)


def test_concat_along_middle_axis(f32):
    parts = [f32(2, 3, 2), f32(2, 1, 2), f32(2, 0, 2), f32(2, 2, 2)]
    assert (run_library_op(Concat(1), *parts, config=GRID_STRIDE) == np.concatenate(parts, axis=1)).all()


# -- warps ----------------------------------------------------------------------------------------

@pytest.fixture
def warp_case(f32):
    """Two 5×6 images, two perspective matrices that sample partly outside the image."""
    src = f32(2, 2, 5, 6)
    mat = np.array([[[1.1, 0.1, -0.7], [0.05, 0.9, 0.6], [0.01, -0.02, 1.0]]] * 2, np.float32)
    mat[1] += 0.05 * f32(3, 3)
    return src, mat, f32(2, 2, 4, 5)


@pytest.mark.parametrize("mode", BORDER_MODES)
def test_warp_perspective_forward(warp_case, mode):
    src, mat, _ = warp_case
    op = WarpPerspective((4, 5), mode, 0.3)
    assert_close(run_library_op(op, src, mat), op.reference(src, mat))


@pytest.mark.parametrize("mode, fmt", [("replicate", "NCHW"), ("constant", "NHWC"), ("reflect", "NHWC")])
def test_warp_affine_forward(warp_case, mode, fmt):
    src, mat, _ = warp_case
    src = src.transpose(0, 2, 3, 1).copy() if fmt == "NHWC" else src
    op = WarpAffine((4, 5), mode, 0.3, fmt)
    affine = mat[:, :2].copy()
    assert_close(run_library_op(op, src, affine), op.reference(src, affine))


@pytest.mark.parametrize("mode", BORDER_MODES)
def test_warp_backward_data_matches_reference_and_is_the_adjoint(warp_case, mode):
    src, mat, g = warp_case
    op = WarpPerspectiveBackwardData(src.shape, mode, 0.0)
    got = run_library_op(op, mat, g)
    assert_close(got, op.reference(mat, g))
    forward = run_library_op(WarpPerspective((4, 5), mode, 0.0), src, mat)
    if mode != "constant":  # <W src, g> == <src, Wᵀ g>; CONSTANT adds border_val, here 0
        np.testing.assert_allclose(np.vdot(forward, g), np.vdot(src, got), rtol=1e-5)


@pytest.mark.parametrize("mode", BORDER_MODES)
def test_warp_backward_mat(warp_case, mode):
    src, mat, g = warp_case
    op = WarpPerspectiveBackwardMat(mode, 0.3)
    assert_close(run_library_op(op, src, mat, g), op.reference(src, mat, g))


def test_warp_backward_mat_partial_sums_over_several_blocks(warp_case):
    src, mat, g = warp_case
    op = WarpPerspectiveBackwardMat("reflect_101", 0.0)
    assert_close(run_library_op(op, src, mat, g, config=LaunchConfig(block=4, max_blocks=3, reduce_block=2)),
                 op.reference(src, mat, g))


@pytest.mark.parametrize("mode", BORDER_MODES)
def test_warp_tangent_mat_matches_reference_and_is_backward_mats_transpose(warp_case, f32, mode):
    src, mat, g = warp_case
    v = f32(2, 3, 3)
    op = WarpPerspectiveTangentMat((4, 5), mode, 0.3)
    got = run_library_op(op, src, mat, v, config=GRID_STRIDE)
    assert_close(got, op.reference(src, mat, v))
    back = run_library_op(WarpPerspectiveBackwardMat(mode, 0.3), src, mat, g)
    np.testing.assert_allclose(np.vdot(g, got), np.vdot(back, v), rtol=1e-4)


def test_warp_tangent_mat_nhwc_with_mat_idx(warp_case, f32):
    src, mat, _ = warp_case
    src = src.transpose(0, 2, 3, 1).copy()
    mat3, mat_idx = np.concatenate([mat, mat[:1] * 1.02]), np.array([1, 0, 1], np.int32)
    v = f32(3, 3, 3)
    op = WarpPerspectiveTangentMat((3, 7), "reflect", 0.0, "NHWC")
    assert_close(run_library_op(op, src, mat3, mat_idx, v), op.reference(src, mat3, mat_idx, v))
    with pytest.raises(IndexOutOfRangeError, match=r"mat_idx value 2 is outside \[0, 2\)"):
        run_library_op(op, src, mat3, np.array([0, 2, 1], np.int32), v)


def test_warp_mat_idx_picks_source_images_and_is_checked(warp_case):
    src, mat, g = warp_case
    mat_idx = np.array([1, 1], np.int32)
    op = WarpPerspective((4, 5), "wrap")
    assert_close(run_library_op(op, src, mat, mat_idx), op.reference(src, mat, mat_idx))
    back = WarpPerspectiveBackwardData(src.shape, "replicate")
    got = run_library_op(back, mat, mat_idx, g)
    assert not got[0].any()  # every matrix samples image 1
    assert_close(got, back.reference(mat, mat_idx, g))
    with pytest.raises(IndexOutOfRangeError, match=r"mat_idx value 2 is outside \[0, 2\)"):
        run_library_op(op, src, mat, np.array([0, 2], np.int32))


def test_warp_backward_data_nhwc(warp_case, f32):
    src, mat, _ = warp_case
    op = WarpPerspectiveBackwardData((2, 5, 6, 2), "reflect_101", 0.0, "NHWC")
    g = f32(2, 4, 5, 2)
    assert_close(run_library_op(op, mat, g), op.reference(mat, g))


# -- configuration --------------------------------------------------------------------------------

@pytest.mark.parametrize("field, value", [("block", 0), ("reduce_block", 6), ("tile", 64)])
def test_launch_config_rejects_bad_geometry(field, value):
    with pytest.raises(ValueError, match=field if field != "tile" else "1024"):
        LaunchConfig(**{field: value})
