"""Indexing rules (seed: subtensor, indexingMultiAxisVec, indexing one-hot;
generic: SetSubtensor, IndexingIncrMultiAxisVec, IndexingSetMultiAxisVec;
op-reference §6-§8).

Every gradient here moves `g` through the same region the forward op
touched, so a rule reads at most the index tensors: never x, never the
output. Index inputs never get a gradient, and each gradient is built only
when its input needs one.
"""

from __future__ import annotations

import numpy as np

from ..frontend.math import equal, where
from ..frontend.sources import zeros
from ..frontend.tensor import Tensor, apply, constant
from ..ir import TensorType
from ..ops.indexing import (
    IndexingIncrMultiAxisVec,
    IndexingMultiAxisVec,
    IndexingOneHot,
    IndexingSetMultiAxisVec,
    IndexingSetOneHot,
    SetSubtensor,
    Subtensor,
    scatter_positions,
)
from ..ops.source import Constant
from .registry import ForwardNode, grad_rule


def _zeros_like(t: TensorType) -> Tensor:
    return zeros(t.shape, t.dtype)


@grad_rule(Subtensor)
def subtensor_rule(node, g, needs_grad):
    """dx = SetSubtensor(zeros(shape(x)), g): reads no forward value (§6.3)."""
    return [apply(SetSubtensor(node.op.items), _zeros_like(node.input_types[0]), g) if needs_grad[0] else None]


@grad_rule(SetSubtensor, generic=True)
def set_subtensor_rule(node, g, needs_grad):
    """d data = g with the region zeroed; d value = g's region (§6.4)."""
    items = node.op.items
    d_data = apply(SetSubtensor(items), g, _zeros_like(node.input_types[1])) if needs_grad[0] else None
    d_value = apply(Subtensor(items), g) if needs_grad[1] else None
    return [d_data, d_value]


@grad_rule(IndexingMultiAxisVec)
def indexing_multi_axis_vec_rule(node, g, needs_grad):
    """dx = scatter-add of g into zeros(shape(x)); duplicates accumulate. Reads the index tensors (§7.4)."""
    indices = node.inputs[1:]
    dx = None
    if needs_grad[0]:
        dx = apply(IndexingIncrMultiAxisVec(node.op.items), _zeros_like(node.input_types[0]), g, *indices)
    return [dx] + [None] * len(indices)


@grad_rule(IndexingIncrMultiAxisVec, generic=True)
def indexing_incr_multi_axis_vec_rule(node, g, needs_grad):
    """d data = g; d value = g gathered from the region (§7.4)."""
    indices = node.inputs[2:]
    d_value = apply(IndexingMultiAxisVec(node.op.items), g, *indices) if needs_grad[1] else None
    return [g if needs_grad[0] else None, d_value] + [None] * len(indices)


@grad_rule(IndexingSetMultiAxisVec, generic=True)
def indexing_set_multi_axis_vec_rule(node, g, needs_grad):
    """d data = g with the written positions zeroed; d value = g gathered from the region (§7.4).

    With repeated positions only the last writer's value reaches the output,
    so the others get zero (op-reference §7.4 gives them g, which is exact
    only without duplicates); see `_landing_mask`.
    """
    items, value_type = node.op.items, node.input_types[1]
    indices = node.inputs[2:]
    d_data = d_value = None
    if needs_grad[0]:
        d_data = apply(IndexingSetMultiAxisVec(items), g, _zeros_like(value_type), *indices)
    if needs_grad[1]:
        d_value = apply(IndexingMultiAxisVec(items), g, *indices)
        if _may_repeat_positions(node):
            d_value = where(_landing_mask(node), d_value, 0.0)
    return [d_data, d_value] + [None] * len(indices)


def _may_repeat_positions(node: ForwardNode) -> bool:
    """False when every index tensor is a constant that writes each position once."""
    index_nodes = [node.graph[i] for i in node.node.inputs[2:]]
    if not all(isinstance(n.op, Constant) for n in index_nodes):
        return True
    positions = scatter_positions(node.op, node.input_types[0].shape, [n.op.value.array for n in index_nodes])
    return np.unique(positions).size != positions.size


def _landing_mask(node: ForwardNode) -> Tensor:
    """True at each value element whose write survives (the last one, in row-major order).

    Scatter the value elements' own ordinal numbers with the same op and
    read them back: an element sees its own number exactly when it won.
    """
    items, data_type, value_type = node.op.items, node.input_types[0], node.input_types[1]
    indices = node.inputs[2:]
    ordinals = constant(np.arange(value_type.size, dtype=np.int64).reshape(value_type.shape), graph=node.graph)
    board = apply(IndexingSetMultiAxisVec(items), zeros(data_type.shape, np.int64), ordinals, *indices)
    return equal(apply(IndexingMultiAxisVec(items), board, *indices), ordinals)


@grad_rule(IndexingOneHot)
def indexing_one_hot_rule(node, g, needs_grad):
    """dsrc = IndexingSetOneHot(zeros(shape(src)), index, g); reads the index only (§8.1)."""
    if not needs_grad[0]:
        return [None, None]
    index = node.inputs[1]
    return [apply(IndexingSetOneHot(node.op.axis), _zeros_like(node.input_types[0]), index, g), None]


@grad_rule(IndexingSetOneHot)
def indexing_set_one_hot_rule(node, g, needs_grad):
    """d data = g with the selected positions zeroed; d sub = g at those positions (§8.2).

    Unlike the seed, each gradient is built only when its input needs one.
    """
    axis, index = node.op.axis, node.inputs[1]
    d_data = apply(IndexingSetOneHot(axis), g, index, _zeros_like(node.input_types[2])) if needs_grad[0] else None
    d_sub = apply(IndexingOneHot(axis), g, index) if needs_grad[2] else None
    return [d_data, None, d_sub]
