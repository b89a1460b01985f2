"""Matrix products: MatrixMul through BLAS, BatchedMatrixMul through our own
kernel (`gemm`) or BLAS (op-reference §5).

`np.matmul(..., out=out)` calls BLAS directly into the destination, and a
transposed operand is passed as a transposed *view*: numpy hands BLAS the
"transposed" flag instead of copying. The regimes of MatrixMul only reshape
(views of contiguous buffers): regime 2 flattens A's leading dims into rows,
regime 3 flattens both operands; the output buffer is viewed with the
flattened shape, so the product lands in it without a copy. K = 0 gives
zeros, as numpy does.

A float32 or float64 batched product, its batch dims folded into one (as
views), is multiplied by `gemm.Multiplier`: small products are where
OpenBLAS is weakest (packing both operands of every item), and where
threaded BLAS once waited on its own threads inside each short GEMM (on a
shared machine, 100 ms spikes of the attention step against 1.3 ms
products). Other dtypes, and batches whose broadcast cannot be folded
without a copy, take numpy's stacked matmul.

So does every batch while BLAS's own threads are warm (`library.threaded_blas`):
in a step where 2-D products run threaded too (gpt's projections around its
attention), OpenBLAS's threads are still awake from the last one and hold the
other core, so threads of ours would wait for it, where BLAS's own start at
once. Measured when the alternative was our threads each calling BLAS on
spans of the batch, the gpt step (medians of alternated processes): 196
against 218 ms with gradcompiler imported first, as `gradcompiler bench`
does (OpenBLAS's spin cut to 2^20 cycles; faster in 9 of 10 pairs), 185
against 201 ms with numpy imported first (the default 2^28-cycle spin;
faster in 5 of 6); against `gemm`, 140-148 ms with the rule and 147-154
without it. A step with no threaded 2-D product (the attention workload)
runs every batch through `gemm`.
"""

from __future__ import annotations

import math

import numpy as np

from ...ops.linalg import BatchedMatrixMul, MatrixMul
from . import gemm
from .library import LibraryKernel, library_kernel, threaded_blas


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
        threaded_blas.ran(a2.shape[0] * a2.shape[1] * b2.shape[1], out.dtype)

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
        if out.dtype in gemm.OWN_DTYPES and a.dtype == b.dtype == out.dtype and not threaded_blas.warm():
            batch = out.shape[:-2]
            count = math.prod(batch)
            a3, b3 = _stacked(a, batch, count), _stacked(b, batch, count)
            if a3 is not None and b3 is not None:
                multiply(a3, b3, out.reshape(count, *out.shape[-2:]))
                return
        np.matmul(a, b, out=out)
        threaded_blas.ran(out.size * a.shape[-1], out.dtype)

    return batched_matrix_mul
