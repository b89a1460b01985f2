"""The CUDA target's matrix products through a BLAS route (cuBLAS by way of CuPy on a GPU).

On Numba's simulator there is no cuBLAS, so a stand-in route (numpy on host copies) takes
its place: what is tested is the plumbing every product goes through on its way to
cuBLAS (which views of the operands and the output, which transpose flags, batch
broadcasting left to the BLAS, the output written in place), against the reference
interpreter, for every MatrixMul regime, a broadcast BatchedMatrixMul and their
gradients. Under `make gpu-check` (a real GPU, CuPy installed) the last test runs the real
cuBLAS route the same way.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends.numba_cuda import require_cuda, simulator_active

from cuda_support import host_matmul_route, on_gpu_check
from oracle import assert_close

cuda = require_cuda()
from gradcompiler.backends.numba_cuda import cublas, library_linalg  # noqa: E402


def _products(rng):
    """Every MatrixMul regime (2-D with each transpose pair, 3-D @ 2-D), a broadcast batched
    product, and the gradients of all of them (transposed products of their own)."""
    with gc.Graph("products"):
        a, b = gc.param("a", (3, 4)), gc.param("b", (4, 5))
        at, bt = gc.param("at", (4, 3)), gc.param("bt", (5, 4))
        x3 = gc.param("x3", (2, 3, 4))
        p, q = gc.param("p", (2, 1, 3, 4)), gc.param("q", (1, 2, 4, 2))
        outs = [a @ b, gc.matmul(at, b, transpose_a=True), gc.matmul(a, bt, transpose_b=True),
                gc.matmul(at, bt, True, True), x3 @ b, p @ q]
        loss = sum((o * o).sum() for o in outs)
        grads = gc.grad(loss, [a, b, at, bt, x3, p, q])
    names = ["a", "b", "at", "bt", "x3", "p", "q"]
    shapes = [(3, 4), (4, 5), (4, 3), (5, 4), (2, 3, 4), (2, 1, 3, 4), (1, 2, 4, 2)]
    feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(names, shapes)}
    return [*outs, *grads], feeds


def test_products_through_a_blas_route_equal_the_reference(monkeypatch):
    calls = []
    monkeypatch.setattr(library_linalg, "matmul_route", lambda: host_matmul_route(calls))
    outputs, feeds = _products(np.random.default_rng(8))
    step = gc.compile(outputs, target="cuda")
    for got, want in zip(step(to_host=True, **feeds), gc.evaluate(outputs, feeds)):
        assert_close(got, want, rtol=1e-5, scaled_atol=1e-6)
    assert ((2, 1, 3, 4), (1, 2, 4, 2), (2, 2, 3, 2), False, False) in calls  # broadcast batch
    assert ((6, 4), (4, 5), (6, 5), False, False) in calls  # 3-D @ 2-D: rows flattened
    assert {c[3:] for c in calls} == {(False, False), (True, False), (False, True), (True, True)}


def test_the_tiled_kernel_runs_where_no_cublas_can(monkeypatch):
    cublas.matmul_route.cache_clear()
    try:
        if simulator_active(cuda):
            assert cublas.matmul_route() is None  # the simulator has no cuBLAS
        monkeypatch.setenv("GRADCOMPILER_CUDA_MATMUL", "tiled")
        cublas.matmul_route.cache_clear()
        assert cublas.matmul_route() is None
    finally:
        cublas.matmul_route.cache_clear()


@pytest.mark.skipif(not on_gpu_check(cuda),
                    reason="the real cuBLAS route needs a GPU and CuPy: make gpu-check runs it")
def test_products_through_cublas_equal_the_reference():
    assert cublas.matmul_route() is not None, "make gpu-check needs CuPy (the cuda extra)"
    outputs, feeds = _products(np.random.default_rng(9))
    step = gc.compile(outputs, target="cuda")
    for got, want in zip(step(to_host=True, **feeds), gc.evaluate(outputs, feeds)):
        assert_close(got, want, rtol=1e-5, scaled_atol=1e-6)
