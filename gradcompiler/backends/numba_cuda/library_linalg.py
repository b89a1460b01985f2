"""Matrix products on the GPU: MatrixMul (all three regimes of op-reference
§5.1) and BatchedMatrixMul (§5.2, numpy batch broadcasting), through one
tiled shared-memory kernel, or through cuBLAS where CuPy reaches a GPU (cublas.py).

Every product is reduced to a batch of 2-D products `out[z] = op(A[ia[z]]) @
op(B[ib[z]])` over 3-D views: the MatrixMul regimes are reshapes of
contiguous operands (free), and batch broadcasting is a table mapping each
output batch to the batch of each operand (a broadcast operand repeats an
index), so no operand is ever copied or expanded. The transpose flags only
change which element a thread loads into the shared tile: a transposed
operand is read along its rows, so loads stay coalesced either way.
Accumulation is float32 for float16/float32 inputs (float64 for float64).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from numba import cuda, from_dtype

from ...ir import TensorType
from ...ops.linalg import BatchedMatrixMul, MatrixMul
from .cublas import matmul_route
from .device import LaunchConfig, device_constant, to_device, view
from .library import Launcher, cuda_library_kernel

_MAX_GRID_YZ = 65535


@functools.cache
def _matmul_kernel(dtype: np.dtype, tile: int):
    acc_type = from_dtype(np.float64 if dtype == np.float64 else np.float32)

    @cuda.jit
    def matmul(a, b, out, trans_a, trans_b, a_batch, b_batch):
        """out[z] = op(a[a_batch[z]]) @ op(b[b_batch[z]]); one tile×tile output tile per block."""
        tile_a = cuda.shared.array((tile, tile), acc_type)  # [row in tile, k in tile]
        tile_b = cuda.shared.array((tile, tile), acc_type)  # [k in tile, column in tile]
        tx = cuda.threadIdx.x
        ty = cuda.threadIdx.y
        m = out.shape[1]
        n = out.shape[2]
        depth = a.shape[1] if trans_a else a.shape[2]
        col0 = cuda.blockIdx.x * tile
        for z in range(cuda.blockIdx.z, out.shape[0], cuda.gridDim.z):
            za = a_batch[z]
            zb = b_batch[z]
            for row0 in range(cuda.blockIdx.y * tile, m, cuda.gridDim.y * tile):
                acc = acc_type(0)
                for k0 in range(0, depth, tile):
                    # A tile: element (row0 + r, k0 + c); a transposed A is read along its rows
                    r, c = (tx, ty) if trans_a else (ty, tx)
                    if row0 + r < m and k0 + c < depth:
                        tile_a[r, c] = a[za, k0 + c, row0 + r] if trans_a else a[za, row0 + r, k0 + c]
                    else:
                        tile_a[r, c] = 0
                    # B tile: element (k0 + r, col0 + c)
                    r, c = (tx, ty) if trans_b else (ty, tx)
                    if k0 + r < depth and col0 + c < n:
                        tile_b[r, c] = b[zb, col0 + c, k0 + r] if trans_b else b[zb, k0 + r, col0 + c]
                    else:
                        tile_b[r, c] = 0
                    cuda.syncthreads()
                    for kk in range(tile):
                        acc += tile_a[ty, kk] * tile_b[kk, tx]
                    cuda.syncthreads()
                if row0 + ty < m and col0 + tx < n:
                    out[z, row0 + ty, col0 + tx] = acc

    return matmul


class _BatchedProduct:
    """A launcher for `out[z] = op(A[ia[z]]) @ op(B[ib[z]])` over fixed 3-D views, or, where
    cuBLAS is reachable (`cublas.matmul_route`), one cuBLAS call over `blas_shapes`: views of
    the operands and the output whose batch dims broadcast as numpy's matmul does."""

    def __init__(self, a_shape: tuple[int, int, int], b_shape: tuple[int, int, int],
                 out_shape: tuple[int, int, int], a_batch: np.ndarray, b_batch: np.ndarray,
                 transpose_a: bool, transpose_b: bool, dtype: np.dtype, config: LaunchConfig,
                 blas_shapes: tuple[tuple[int, ...], ...]):
        self.a_shape, self.b_shape, self.out_shape = a_shape, b_shape, out_shape
        self.flags = (bool(transpose_a), bool(transpose_b))
        self.blas = matmul_route() if np.dtype(dtype) in (np.float32, np.float64) else None
        self.blas_shapes = blas_shapes
        self.a_batch, self.b_batch = device_constant(a_batch), device_constant(b_batch)
        self.kernel = _matmul_kernel(np.dtype(dtype), config.tile)
        batches, m, n = out_shape
        t = config.tile
        self.grid = (max(1, math.ceil(n / t)), max(1, min(_MAX_GRID_YZ, math.ceil(m / t))),
                     max(1, min(_MAX_GRID_YZ, batches)))
        self.block = (t, t)

    @property
    def capturable(self) -> bool:
        """Whether a CUDA graph may hold this product (`cuda_graphs`): the tiled kernel
        allocates nothing per call; cuBLAS through CuPy may take temporaries from CuPy's pool."""
        return self.blas is None or bool(getattr(self.blas, "capturable", False))

    def __call__(self, a: Any, b: Any, *, out: Any, stream: Any = 0) -> None:
        if not out.size:
            return
        if self.blas is not None:
            a_nd, b_nd, out_nd = self.blas_shapes
            self.blas(view(to_device(a, stream), a_nd), view(to_device(b, stream), b_nd),
                      view(out, out_nd), *self.flags, stream)
            return
        a3 = view(to_device(a, stream), self.a_shape)
        b3 = view(to_device(b, stream), self.b_shape)
        self.kernel[self.grid, self.block, stream](a3, b3, view(out, self.out_shape), *self.flags,
                                                   self.a_batch, self.b_batch)


def _batch_table(batch: tuple[int, ...], target: tuple[int, ...]) -> np.ndarray:
    """For each batch index of `target` (row-major), the batch index of an operand with `batch`
    dims, numpy-broadcast against it."""
    own = np.arange(math.prod(batch), dtype=np.int64).reshape(batch)
    return np.broadcast_to(own, target).reshape(-1)


@cuda_library_kernel.register
def _matrix_mul(op: MatrixMul, input_types: Sequence[TensorType], config: LaunchConfig) -> Launcher:
    a, b = input_types
    out = op.infer(a, b)
    a2, b2 = op.matrix_shapes(a, b)
    m = math.prod(out.shape[:-1])  # regime 2 flattens A's leading dims into rows
    zero = np.zeros(1, np.int64)
    return _BatchedProduct((1, *a2), (1, *b2), (1, m, out.shape[-1]), zero, zero, op.transpose_a,
                           op.transpose_b, out.dtype, config,
                           blas_shapes=(a2, b2, (m, out.shape[-1])))


@cuda_library_kernel.register
def _batched_matrix_mul(op: BatchedMatrixMul, input_types: Sequence[TensorType],
                        config: LaunchConfig) -> Launcher:
    a, b = input_types
    out = op.infer(a, b)
    batch = out.shape[:-2]
    count = math.prod(batch)

    def flattened(t: TensorType) -> tuple[int, int, int]:
        return (math.prod(t.shape[:-2]), *t.shape[-2:])

    return _BatchedProduct(flattened(a), flattened(b), (count, *out.shape[-2:]),
                           _batch_table(a.shape[:-2], batch), _batch_table(b.shape[:-2], batch),
                           op.transpose_a, op.transpose_b, out.dtype, config,
                           blas_shapes=(a.shape, b.shape, out.shape))
