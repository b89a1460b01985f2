"""Matrix products: MatrixMul and BatchedMatrixMul (op-reference §5).

MatrixMul has three shape regimes: plain 2-D; A with rank > 2 flattened into
rows against a 2-D B; and both operands of equal rank >= 3 flattened to 2-D
(used by gradients to reduce a batch of rows into a weight gradient).
BatchedMatrixMul broadcasts the batch dims of both operands (numpy rules), a
superset of MegEngine's (recommended by op-reference §5.2).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ..ir import Op, TensorType
from .common import broadcast_shapes, require_float, same_dtype


def _swap(x: np.ndarray, flag: bool) -> np.ndarray:
    return np.swapaxes(x, -1, -2) if flag else x


@dataclass(frozen=True)
class MatrixMul(Op):
    transpose_a: bool = False
    transpose_b: bool = False

    kind = "library"
    arity = 2

    def regime(self, a: TensorType, b: TensorType) -> int:
        if a.ndim == 2 and b.ndim == 2:
            return 1
        if a.ndim > 2 and b.ndim == 2 and not self.transpose_a:
            return 2
        if a.ndim == b.ndim >= 3:
            return 3
        raise self.shape_error(
            f"cannot multiply shapes {a.shape} and {b.shape} "
            f"(transpose_a={self.transpose_a}); use BatchedMatrixMul for batched operands"
        )

    @staticmethod
    def flat(shape: tuple[int, ...]) -> tuple[int, int]:
        return math.prod(shape[:-1]), shape[-1]

    def matrix_shapes(self, a: TensorType, b: TensorType) -> tuple[tuple[int, int], tuple[int, int]]:
        """The 2-D operand shapes after flattening, before the flags."""
        regime = self.regime(a, b)
        a2 = a.shape if regime == 1 else self.flat(a.shape)
        b2 = b.shape if regime != 3 else self.flat(b.shape)
        return a2, b2

    def infer(self, a: TensorType, b: TensorType) -> TensorType:
        dtype = same_dtype(self, a, b)
        require_float(self, a)
        regime = self.regime(a, b)
        (ar, ac), (br, bc) = self.matrix_shapes(a, b)
        m, k = (ac, ar) if self.transpose_a else (ar, ac)
        k2, n = (bc, br) if self.transpose_b else (br, bc)
        if k != k2:
            raise self.shape_error(
                f"inner dims differ: {a.shape} @ {b.shape} (transpose_a={self.transpose_a}, "
                f"transpose_b={self.transpose_b}) contracts {k} with {k2}"
            )
        if regime == 2:
            return TensorType((*a.shape[:-1], n), dtype)
        return TensorType((m, n), dtype)

    def reference(self, a, b):
        regime = self.regime(TensorType(a.shape, a.dtype), TensorType(b.shape, b.dtype))
        a2 = a if regime == 1 else a.reshape(self.flat(a.shape))
        b2 = b if regime != 3 else b.reshape(self.flat(b.shape))
        out = _swap(a2, self.transpose_a) @ _swap(b2, self.transpose_b)
        if regime == 2:
            out = out.reshape(*a.shape[:-1], out.shape[-1])
        return out


@dataclass(frozen=True)
class BatchedMatrixMul(Op):
    transpose_a: bool = False
    transpose_b: bool = False

    kind = "library"
    arity = 2

    def batch_shape(self, a: TensorType, b: TensorType) -> tuple[int, ...]:
        return broadcast_shapes(self, a.shape[:-2], b.shape[:-2])

    def infer(self, a: TensorType, b: TensorType) -> TensorType:
        dtype = same_dtype(self, a, b)
        require_float(self, a)
        if a.ndim < 2 or b.ndim < 2:
            raise self.shape_error(f"operands need rank >= 2, got {a.shape} and {b.shape}")
        m, k = a.shape[-2:][::-1] if self.transpose_a else a.shape[-2:]
        k2, n = b.shape[-2:][::-1] if self.transpose_b else b.shape[-2:]
        if k != k2:
            raise self.shape_error(
                f"inner dims differ: {a.shape} @ {b.shape} (transpose_a={self.transpose_a}, "
                f"transpose_b={self.transpose_b}) contracts {k} with {k2}"
            )
        return TensorType((*self.batch_shape(a, b), m, n), dtype)

    def reference(self, a, b):
        return np.matmul(_swap(a, self.transpose_a), _swap(b, self.transpose_b))
