"""Matrix products, MatrixMul and BatchedMatrixMul, through our own kernel (`gemm`)
in float32 and float64, and numpy's matmul in every other dtype (op-reference §5).

Why our kernel even for large 2-D products: it is as fast as OpenBLAS alone (0.86-1.00 of
its time on gpt's and the mlp's shapes, float32, two threads, operands in cache), and it
keeps one pool of threads. OpenBLAS's threads stay awake after each
threaded product (OPENBLAS_THREAD_TIMEOUT, numba_cpu's docstring) and take a
core from the parallel loop that follows it, and our OpenMP threads could not
be let spin between loops while BLAS's needed the cores. With every product
on our threads neither happens: gpt's 113 elementwise and reduction kernels
took 25 ms of its step against 35, its batched products 13 against 16.5 (BLAS
took them while its threads were warm), and its 2-D products 106 against 91
(per-call profiles); the step 148-153 → 144-148 ms, and 130-136 once the
threads spin briefly between loops (`GOMP_SPINCOUNT`, set on import), against
140-143 with that spin and BLAS's products (medians of alternated processes).
Batches of small products are where OpenBLAS is weakest anyway (it packs both
operands of every item; gemm's docstring).

The operands are views: a transposed operand is a transposed view (gemm reads
any strides), MatrixMul's leading dims fold into rows (regime 2 flattens A,
regime 3 both operands), and the output buffer is viewed with the flattened
shape, so the product lands in it without a copy. A batched product's batch
dims fold into one; batches whose broadcast cannot be folded without a copy
take numpy's stacked matmul. K = 0 gives zeros, as numpy does.
"""

from __future__ import annotations

import math

import numpy as np

from ...ops.linalg import BatchedMatrixMul, MatrixMul
from . import gemm
from .library import LibraryKernel, library_kernel


def _flat2d(x: np.ndarray) -> np.ndarray:
    """Leading dims folded into rows (a view when x is contiguous). The row count is
    spelled out: numpy cannot infer a -1 beside a zero-length last dim."""
    return x if x.ndim == 2 else x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


def _ours(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> bool:
    """Whether gemm takes the product: float32 or float64 throughout."""
    return out.dtype in gemm.OWN_DTYPES and a.dtype == b.dtype == out.dtype


@library_kernel.register
def _matrix_mul(op: MatrixMul) -> LibraryKernel:
    transpose_a, transpose_b = op.transpose_a, op.transpose_b
    multiply = gemm.Multiplier()

    def matrix_mul(a: np.ndarray, b: np.ndarray, *, out: np.ndarray) -> None:
        a2, b2 = _flat2d(a), _flat2d(b)
        if transpose_a:
            a2 = a2.T
        if transpose_b:
            b2 = b2.T
        out2 = out.reshape(a2.shape[0], b2.shape[1])
        if _ours(a2, b2, out):
            multiply(a2[np.newaxis], b2[np.newaxis], out2[np.newaxis])
        else:
            np.matmul(a2, b2, out=out2)

    return matrix_mul


def _stacked(x: np.ndarray, batch: tuple[int, ...], count: int) -> np.ndarray | None:
    """`x` broadcast to `batch` and viewed as (count, rows, cols); None if that needs a copy."""
    try:
        return np.broadcast_to(x, batch + x.shape[-2:]).reshape(count, *x.shape[-2:], copy=False)
    except ValueError:
        return None


@library_kernel.register
def _batched_matrix_mul(op: BatchedMatrixMul) -> LibraryKernel:
    transpose_a, transpose_b = op.transpose_a, op.transpose_b
    multiply = gemm.Multiplier()

    def batched_matrix_mul(a: np.ndarray, b: np.ndarray, *, out: np.ndarray) -> None:
        if transpose_a:
            a = np.swapaxes(a, -1, -2)
        if transpose_b:
            b = np.swapaxes(b, -1, -2)
        if _ours(a, b, out):
            batch = out.shape[:-2]
            count = math.prod(batch)
            a3, b3 = _stacked(a, batch, count), _stacked(b, batch, count)
            if a3 is not None and b3 is not None:
                multiply(a3, b3, out.reshape(count, *out.shape[-2:]))
                return
        np.matmul(a, b, out=out)

    return batched_matrix_mul
