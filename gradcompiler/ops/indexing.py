"""Indexing ops (op-reference §6-§8)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import IndexOutOfRangeError
from ..ir import Op, TensorType
from .common import require_int


def _one_hot_check(op: Op, src: TensorType, index: TensorType) -> None:
    require_int(op, index)
    if src.ndim < 2 or not 0 <= op.axis < src.ndim:
        raise op.shape_error(f"needs rank >= 2 and a normalised axis; got shape {src.shape}, axis {op.axis}")
    expected = src.shape[: op.axis] + src.shape[op.axis + 1:]
    if index.shape != expected:
        raise op.shape_error(f"index shape {index.shape} must be {expected} (src {src.shape} without axis {op.axis})")


def _check_one_hot_range(op: Op, index: np.ndarray, n: int) -> None:
    if index.size and (index.min() < 0 or index.max() >= n):
        bad = index[(index < 0) | (index >= n)].ravel()[0]
        raise IndexOutOfRangeError(f"{op.label}: index value {bad} is outside [0, {n}) along axis {op.axis}")


@dataclass(frozen=True)
class IndexingOneHot(Op):
    """Gather one element per position along `axis`; output keeps the axis with size 1 (§8.1)."""

    axis: int

    kind = "gather"
    arity = 2

    def infer(self, src: TensorType, index: TensorType) -> TensorType:
        _one_hot_check(self, src, index)
        shape = list(src.shape)
        shape[self.axis] = 1
        return TensorType(tuple(shape), src.dtype)

    def reference(self, src, index):
        _check_one_hot_range(self, index, src.shape[self.axis])
        return np.take_along_axis(src, np.expand_dims(index, self.axis).astype(np.intp), self.axis)


@dataclass(frozen=True)
class IndexingSetOneHot(Op):
    """`out = copy(data); out[..., index[...], ...] = sub[..., 0, ...]` along `axis` (§8.2)."""

    axis: int

    kind = "scatter"
    arity = 3

    def infer(self, data: TensorType, index: TensorType, sub: TensorType) -> TensorType:
        _one_hot_check(self, data, index)
        expected = list(data.shape)
        expected[self.axis] = 1
        if sub.shape != tuple(expected):
            raise self.shape_error(f"sub shape {sub.shape} must be {tuple(expected)} (data {data.shape}, axis {self.axis})")
        if sub.dtype != data.dtype:
            raise self.shape_error(f"sub dtype {sub.dtype.name} differs from data dtype {data.dtype.name}")
        return data

    def reference(self, data, index, sub):
        _check_one_hot_range(self, index, data.shape[self.axis])
        out = data.copy()
        np.put_along_axis(out, np.expand_dims(index, self.axis).astype(np.intp), sub, self.axis)
        return out
