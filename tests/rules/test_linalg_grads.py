"""Gradients of MatrixMul (every transpose combination, all three regimes) and
BatchedMatrixMul (batch broadcasting both ways, every flag) against float64
finite differences (op-reference §5).
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.ops.linalg import BatchedMatrixMul, MatrixMul

from helpers import assert_grads

FLAGS = [(False, False), (False, True), (True, False), (True, True)]


@pytest.fixture
def graph():
    with gc.Graph("linalg_grads") as g:
        yield g
    gc.verify(g)


def _stored(shape, flag):
    return (*shape[:-2], shape[-1], shape[-2]) if flag else shape


def _operands(rng, a_shape, b_shape):
    feeds = {"a": rng.standard_normal(a_shape).astype(np.float32),
             "b": rng.standard_normal(b_shape).astype(np.float32)}
    return gc.input("a", a_shape), gc.input("b", b_shape), feeds


def _check(y, a, b, feeds):
    assert_grads(y, [a, b], feeds)
    gc.check_grads(y, [a, b], feeds, order=2)  # the cross terms d²/dA dB


@pytest.mark.parametrize("ta, tb", FLAGS)
def test_matrix_mul_2d(ta, tb, graph, rng):
    a, b, feeds = _operands(rng, _stored((3, 4), ta), _stored((4, 5), tb))
    y = gc.matmul(a, b, transpose_a=ta, transpose_b=tb)
    assert y.node.op == MatrixMul(ta, tb)
    _check(y, a, b, feeds)


@pytest.mark.parametrize("tb", [False, True])
def test_matrix_mul_rows_regime(tb, graph, rng):
    a, b, feeds = _operands(rng, (2, 3, 4), _stored((4, 5), tb))
    y = gc.matmul(a, b, transpose_b=tb)
    assert isinstance(y.node.op, MatrixMul) and y.shape == (2, 3, 5)
    _check(y, a, b, feeds)


def test_rows_regime_weight_gradient_uses_the_flattened_regime(graph, rng):
    # dB of A (2,3,4) @ B (4,5) is A_flatᵀ g_flat: a MatrixMul of two 3-D operands (regime 3)
    a, b, feeds = _operands(rng, (2, 3, 4), (4, 5))
    y = a @ b
    db = gc.grad(y.sum(), b)
    backward = [graph[i] for i in graph.ancestors([db.id]) if graph[i].role == "backward"]
    regime3 = [n for n in backward if isinstance(n.op, MatrixMul) and len(n.type.shape) == 2
               and all(graph[i].type.ndim == 3 for i in n.inputs)]
    assert regime3
    av = feeds["a"].astype(np.float64)
    np.testing.assert_allclose(gc.evaluate(db, a=feeds["a"]), av.reshape(6, 4).T @ np.ones((6, 5)), rtol=1e-5)


@pytest.mark.parametrize("ta, tb", FLAGS)
def test_matrix_mul_both_flattened_regime(ta, tb, graph, rng):
    a_shape = (2, 3, 5) if ta else (2, 3, 4)
    b_shape = {(False, False): (2, 2, 7), (False, True): (3, 1, 4),
               (True, False): (3, 2, 7), (True, True): (7, 1, 6)}[(ta, tb)]
    a, b, feeds = _operands(rng, a_shape, b_shape)
    _check(gc.apply(MatrixMul(ta, tb), a, b), a, b, feeds)


@pytest.mark.parametrize("ta, tb", FLAGS)
@pytest.mark.parametrize("a_batch, b_batch", [
    ((2,), ()), ((), (2,)), ((2, 1), (3,)), ((1, 3), (2, 1)), ((2,), (2,)), ((3,), (1,)),
], ids=str)
def test_batched_matrix_mul(a_batch, b_batch, ta, tb, graph, rng):
    a, b, feeds = _operands(rng, _stored((*a_batch, 3, 4), ta), _stored((*b_batch, 4, 2), tb))
    y = gc.apply(BatchedMatrixMul(ta, tb), a, b)
    _check(y, a, b, feeds)


@pytest.mark.parametrize("a_shape, b_shape", [
    ((4,), (4, 5)), ((3, 4), (4,)), ((4,), (4,)), ((4,), (2, 4, 5)), ((2, 3, 4), (4,)),
], ids=str)
def test_matmul_with_one_d_operands(a_shape, b_shape, graph, rng):
    a, b, feeds = _operands(rng, a_shape, b_shape)
    _check(a @ b, a, b, feeds)


def test_matmul_gradients_by_hand(graph, rng):
    a = gc.input("a", (3, 4), "float64")
    b = gc.input("b", (4, 5), "float64")
    u = gc.input("u", (3, 5), "float64")
    da, db = gc.vjp(a @ b, [a, b], u)
    av, bv, uv = rng.standard_normal((3, 4)), rng.standard_normal((4, 5)), rng.standard_normal((3, 5))
    got_da, got_db = gc.evaluate([da, db], a=av, b=bv, u=uv)
    np.testing.assert_allclose(got_da, uv @ bv.T, rtol=1e-12)
    np.testing.assert_allclose(got_db, av.T @ uv, rtol=1e-12)


def test_mlp_layer_second_order(graph, rng):
    x = gc.input("x", (3, 4))
    w = gc.param("w", (4, 5))
    feeds = {"x": rng.standard_normal((3, 4)).astype(np.float32),
             "w": rng.standard_normal((4, 5)).astype(np.float32)}
    loss = gc.tanh(x @ w).sum()
    gc.check_grads(loss, [w, x], feeds, order=2)
