"""Matrix products through BLAS: MatrixMul and BatchedMatrixMul (op-reference §5).

`np.matmul(..., out=out)` calls BLAS directly into the destination, and a
transposed operand is passed as a transposed *view*: numpy hands BLAS the
"transposed" flag instead of copying. The regimes of MatrixMul only reshape
(views of contiguous buffers): regime 2 flattens A's leading dims into rows,
regime 3 flattens both operands; the output buffer is viewed with the
flattened shape, so the product lands in it without a copy. K = 0 gives
zeros, as numpy does.
"""

from __future__ import annotations

import math

import numpy as np

from ...ops.linalg import BatchedMatrixMul, MatrixMul
from .library import LibraryKernel, library_kernel


def _flat2d(x: np.ndarray) -> np.ndarray:
    """Leading dims folded into rows (a view when x is contiguous). The row count is
    spelled out: numpy cannot infer a -1 beside a zero-length last dim."""
    return x if x.ndim == 2 else x.reshape(math.prod(x.shape[:-1]), x.shape[-1])


@library_kernel.register
def _matrix_mul(op: MatrixMul) -> LibraryKernel:
    transpose_a, transpose_b = op.transpose_a, op.transpose_b

    def matrix_mul(a: np.ndarray, b: np.ndarray, *, out: np.ndarray) -> None:
        a2, b2 = _flat2d(a), _flat2d(b)
        if transpose_a:
            a2 = a2.T
        if transpose_b:
            b2 = b2.T
        np.matmul(a2, b2, out=out.reshape(a2.shape[0], b2.shape[1]))

    return matrix_mul


@library_kernel.register
def _batched_matrix_mul(op: BatchedMatrixMul) -> LibraryKernel:
    transpose_a, transpose_b = op.transpose_a, op.transpose_b

    def batched_matrix_mul(a: np.ndarray, b: np.ndarray, *, out: np.ndarray) -> None:
        if transpose_a:
            a = np.swapaxes(a, -1, -2)
        if transpose_b:
            b = np.swapaxes(b, -1, -2)
        np.matmul(a, b, out=out)

    return batched_matrix_mul
