"""Indexing rules (seed: subtensor, indexingMultiAxisVec, indexing one-hot; op-reference §6-§8)."""

from __future__ import annotations

from ..frontend.sources import zeros
from ..frontend.tensor import apply
from ..ops.indexing import IndexingOneHot, IndexingSetOneHot
from .registry import grad_rule


@grad_rule(IndexingOneHot)
def indexing_one_hot_rule(node, g, needs_grad):
    """dsrc = IndexingSetOneHot(zeros(shape(src)), index, g); reads the index only."""
    if not needs_grad[0]:
        return [None, None]
    src_type = node.input_types[0]
    index = node.inputs[1]
    return [apply(IndexingSetOneHot(node.op.axis), zeros(src_type.shape, src_type.dtype), index, g), None]
