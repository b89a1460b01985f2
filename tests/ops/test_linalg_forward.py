"""Forward values of MatrixMul (three regimes, every transpose combination),
BatchedMatrixMul (batch broadcasting) and numpy matmul semantics of 1-D
operands (op-reference §5), against numpy.
"""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import DTypeError, ShapeError
from gradcompiler.ops.linalg import BatchedMatrixMul, MatrixMul

COVERS = {"MatrixMul", "BatchedMatrixMul"}
FLAGS = [(False, False), (False, True), (True, False), (True, True)]


@pytest.fixture
def graph():
    with gc.Graph("linalg_forward") as g:
        yield g
    gc.verify(g)


def _t(x, flag):
    return np.swapaxes(x, -1, -2) if flag else x


def _operand(rng, shape, flag):
    """Data of the operand whose (possibly transposed) matrix has `shape`'s last two dims."""
    stored = (*shape[:-2], shape[-1], shape[-2]) if flag else shape
    return rng.standard_normal(stored)


def _run(op, a_val, b_val):
    a = gc.input("a", a_val.shape, "float64")
    b = gc.input("b", b_val.shape, "float64")
    y = gc.apply(op, a, b)
    return y, gc.evaluate(y, a=a_val, b=b_val)


@pytest.mark.parametrize("ta, tb", FLAGS)
def test_matrix_mul_2d_every_transpose(ta, tb, graph, rng):
    a_val, b_val = _operand(rng, (3, 4), ta), _operand(rng, (4, 5), tb)
    a, b = gc.input("a", a_val.shape, "float64"), gc.input("b", b_val.shape, "float64")
    y = gc.matmul(a, b, transpose_a=ta, transpose_b=tb)
    assert y.node.op == MatrixMul(ta, tb) and y.shape == (3, 5)
    np.testing.assert_allclose(gc.evaluate(y, a=a_val, b=b_val), _t(a_val, ta) @ _t(b_val, tb), rtol=1e-13)


@pytest.mark.parametrize("tb", [False, True])
def test_matrix_mul_rows_regime(tb, graph, rng):
    # A (2, 3, 4) is flattened into rows against the 2-D B; the result keeps A's leading dims
    a_val = rng.standard_normal((2, 3, 4))
    b_val = _operand(rng, (4, 5), tb)
    a, b = gc.input("a", a_val.shape, "float64"), gc.input("b", b_val.shape, "float64")
    y = gc.matmul(a, b, transpose_b=tb)
    assert isinstance(y.node.op, MatrixMul) and y.shape == (2, 3, 5)
    np.testing.assert_allclose(gc.evaluate(y, a=a_val, b=b_val), a_val @ _t(b_val, tb), rtol=1e-13)


@pytest.mark.parametrize("ta, tb", FLAGS)
def test_matrix_mul_both_flattened_regime(ta, tb, graph, rng):
    # both operands of equal rank >= 3 are flattened to (prod(leading), last); flags act on those
    a_shape = (2, 3, 4) if not ta else (2, 3, 5)   # flat (6, 4), or (6, 5) whose transpose is (5, 6)
    b_shape = {(False, False): (2, 2, 7), (False, True): (3, 1, 4),
               (True, False): (3, 2, 7), (True, True): (7, 1, 6)}[(ta, tb)]
    a_val, b_val = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    a_flat = a_val.reshape(-1, a_shape[-1])
    b_flat = b_val.reshape(-1, b_shape[-1])
    expected = _t(a_flat, ta) @ _t(b_flat, tb)
    y, got = _run(MatrixMul(ta, tb), a_val, b_val)
    assert y.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-13)


@pytest.mark.parametrize("ta, tb", FLAGS)
@pytest.mark.parametrize("a_batch, b_batch", [
    ((2,), ()), ((), (2,)), ((2, 1), (3,)), ((1, 3), (2, 1)), ((2, 3), (2, 3)), ((4,), (1,)),
], ids=str)
def test_batched_matrix_mul_broadcasts_batches(a_batch, b_batch, ta, tb, graph, rng):
    a_val = _operand(rng, (*a_batch, 3, 4), ta)
    b_val = _operand(rng, (*b_batch, 4, 2), tb)
    y, got = _run(BatchedMatrixMul(ta, tb), a_val, b_val)
    expected = np.matmul(_t(a_val, ta), _t(b_val, tb))
    assert y.shape == expected.shape == (*np.broadcast_shapes(a_batch, b_batch), 3, 2)
    np.testing.assert_allclose(got, expected, rtol=1e-13)


@pytest.mark.parametrize("a_shape, b_shape", [
    ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 4, 5)), ((2, 3, 4), (1, 4, 5)),
], ids=str)
def test_matmul_dispatches_batched_like_numpy(a_shape, b_shape, graph, rng):
    a_val, b_val = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    a, b = gc.input("a", a_shape, "float64"), gc.input("b", b_shape, "float64")
    y = a @ b
    assert isinstance(y.node.op, BatchedMatrixMul)
    np.testing.assert_allclose(gc.evaluate(y, a=a_val, b=b_val), np.matmul(a_val, b_val), rtol=1e-13)


def test_matmul_transposed_batched_a_against_matrix(graph, rng):
    # a 3-D A with transpose_a cannot be flattened into rows: BatchedMatrixMul
    a_val, b_val = rng.standard_normal((2, 4, 3)), rng.standard_normal((4, 5))
    a, b = gc.input("a", a_val.shape, "float64"), gc.input("b", b_val.shape, "float64")
    y = gc.matmul(a, b, transpose_a=True)
    assert isinstance(y.node.op, BatchedMatrixMul)
    np.testing.assert_allclose(gc.evaluate(y, a=a_val, b=b_val), np.swapaxes(a_val, -1, -2) @ b_val,
                               rtol=1e-13)


@pytest.mark.parametrize("a_shape, b_shape", [
    ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((4,), (2, 4, 5)), ((2, 3, 4), (4,)), ((2, 3, 4), (2, 4, 5)),
], ids=str)
def test_matmul_one_d_operands_follow_numpy(a_shape, b_shape, graph, rng):
    a_val, b_val = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    a, b = gc.input("a", a_shape, "float64"), gc.input("b", b_shape, "float64")
    y = a @ b
    expected = np.matmul(a_val, b_val)
    assert y.shape == expected.shape
    np.testing.assert_allclose(gc.evaluate(y, a=a_val, b=b_val), expected, rtol=1e-13)


def test_matmul_with_constant_operands_and_float32(graph, rng):
    a_val = rng.standard_normal((3, 4)).astype(np.float32)
    w = rng.standard_normal((4, 2)).astype(np.float32)
    a = gc.input("a", (3, 4))
    y, z = a @ w, w.T @ a.T
    got_y, got_z = gc.evaluate([y, z], a=a_val)
    assert got_y.dtype == np.float32
    np.testing.assert_allclose(got_y, a_val.astype(np.float64) @ w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got_z, (a_val.astype(np.float64) @ w).T, rtol=1e-5, atol=1e-6)


def test_empty_contraction_gives_zeros(graph):
    a, b = gc.input("a", (3, 0), "float64"), gc.input("b", (0, 2), "float64")
    got = gc.evaluate(a @ b, a=np.zeros((3, 0)), b=np.zeros((0, 2)))
    np.testing.assert_array_equal(got, np.zeros((3, 2)))


def test_inner_dim_mismatch_names_op_shapes_and_line(graph):
    a, b = gc.input("a", (3, 4)), gc.input("b", (5, 6))
    with pytest.raises(ShapeError) as info:
        line = inspect.currentframe().f_lineno + 1
        a @ b
    message = str(info.value)
    assert "MatrixMul" in message and "(3, 4)" in message and "(5, 6)" in message
    assert f"{os.path.abspath(__file__)}:{line}" in message


@pytest.mark.parametrize("op, a_shape, b_shape, message", [
    (MatrixMul(), (3, 4), (3, 4), "contracts 4 with 3"),
    (MatrixMul(True, False), (2, 3, 4), (4, 5), "use BatchedMatrixMul"),
    (MatrixMul(), (3, 4), (2, 4, 5), "use BatchedMatrixMul"),
    (MatrixMul(), (2, 3, 4), (2, 5, 6), "contracts 4 with 10"),
    (BatchedMatrixMul(), (2, 3, 4), (3, 4, 5), r"\(2,\) and \(3,\) do not broadcast"),
    (BatchedMatrixMul(), (2, 3, 4), (2, 5, 6), "contracts 4 with 5"),
    (BatchedMatrixMul(), (4,), (2, 4, 5), "rank >= 2"),
], ids=str)
def test_matmul_shape_errors(op, a_shape, b_shape, message, graph):
    a, b = gc.input("a", a_shape), gc.input("b", b_shape)
    with pytest.raises(ShapeError, match=f"{op.label}.*{message}"):
        gc.apply(op, a, b)


def test_matmul_dtype_errors(graph):
    a, i = gc.input("a", (2, 2)), gc.input("i", (2, 2), "int32")
    with pytest.raises(DTypeError, match="MatrixMul.*int32"):
        i @ i
    with pytest.raises(DTypeError, match="MatrixMul.*float32, float64"):
        a @ gc.input("d", (2, 2), "float64")
    with pytest.raises(DTypeError, match="BatchedMatrixMul"):
        gc.apply(BatchedMatrixMul(), gc.input("bi", (2, 2, 2), "int32"), gc.input("bj", (2, 2, 2), "int32"))
