"""Indexing on Tensors."""

from __future__ import annotations

from ..ops.common import normalize_axis
from ..ops.indexing import IndexingOneHot
from .shapes import squeeze
from .tensor import Tensor, apply

__all__ = ["indexing_one_hot"]


def indexing_one_hot(src: Tensor, index: Tensor, axis: int = -1, keepdims: bool = False) -> Tensor:
    """`src[..., index[...], ...]` along `axis`: one element per position (take_along_axis)."""
    axis = normalize_axis(IndexingOneHot(axis), axis, src.ndim)
    out = apply(IndexingOneHot(axis), src, index)
    return out if keepdims else squeeze(out, axis)


def getitem(x: Tensor, key):
    raise NotImplementedError("indexing is being built")
