"""A scatter into zeros, then added to another value, becomes one update of that value.

Gradients of indexing are scatters into zeros (`dx = SetSubtensor(zeros, g)`),
and a value read in several places sums them with other gradients. Adding
the scattered zeros costs a full-size tensor and a full-size add; updating
the other addend in its region costs only the region:

* IndexingIncrMultiAxisVec(zeros, v, idx…) + o → IndexingIncrMultiAxisVec(o, v, idx…)
* SetSubtensor(zeros, v) + o → SetSubtensor(o, Subtensor(o) + v)
  (a basic region never hits one element twice, so setting into zeros is
  adding into zeros, and there is no Incr form of SetSubtensor)
* IndexingSetOneHot(zeros, idx, s) + o → IndexingSetOneHot(o, idx, IndexingOneHot(o, idx) + s)
  (one element per position, so again set equals add)

The scatter must have no other reader (else its work would be done twice)
and `o` must already have the sum's shape. Only the order of the additions
changes, so results agree up to rounding.

Softmax cross-entropy's gradient also sums the one-hot scatter back along
its axis: ReduceTo(IndexingSetOneHot(zeros, idx, s), shape(s)) is s, since
each row holds s once and zeros elsewhere.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradcompiler.ir import Graph, Node
from gradcompiler.ops.elemwise import Elemwise
from gradcompiler.ops.indexing import (
    IndexingIncrMultiAxisVec,
    IndexingOneHot,
    IndexingSetOneHot,
    SetSubtensor,
    Subtensor,
)
from gradcompiler.ops.reduce import ReduceTo

from .registry import add_like, is_uniform, rewrite, single_use

if TYPE_CHECKING:
    from ..pipeline import PassContext

_DATA_SLOT = {IndexingIncrMultiAxisVec: 0, SetSubtensor: 0, IndexingSetOneHot: 0}


def _scatter_into_zeros_plus(graph: Graph, node: Node, op_class: type) -> tuple[Node, int] | None:
    """For `scatter(zeros, …) + other` (either order): the scatter node and `other`."""
    if node.op.mode != "ADD":
        return None
    for slot in (0, 1):
        scatter, other = graph[node.inputs[slot]], node.inputs[1 - slot]
        if (isinstance(scatter.op, op_class) and single_use(graph, scatter.id)
                and is_uniform(graph, scatter.inputs[_DATA_SLOT[op_class]], 0)
                and graph[other].type == node.type):
            return scatter, other
    return None


@rewrite(Elemwise)
def incr_into_zeros_plus(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    found = _scatter_into_zeros_plus(graph, node, IndexingIncrMultiAxisVec)
    if found is None:
        return None
    scatter, other = found
    return add_like(graph, node, scatter.op, (other, *scatter.inputs[1:]))


@rewrite(Elemwise)
def set_subtensor_into_zeros_plus(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    found = _scatter_into_zeros_plus(graph, node, SetSubtensor)
    if found is None:
        return None
    scatter, other = found
    value = scatter.inputs[1]
    region = add_like(graph, node, Subtensor(scatter.op.items), (other,))
    added = add_like(graph, node, Elemwise("ADD"), (region, value))
    return add_like(graph, node, scatter.op, (other, added))


@rewrite(Elemwise)
def set_one_hot_into_zeros_plus(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    found = _scatter_into_zeros_plus(graph, node, IndexingSetOneHot)
    if found is None:
        return None
    scatter, other = found
    _, index, sub = scatter.inputs
    picked = add_like(graph, node, IndexingOneHot(scatter.op.axis), (other, index))
    added = add_like(graph, node, Elemwise("ADD"), (picked, sub))
    return add_like(graph, node, scatter.op, (other, index, added))


@rewrite(ReduceTo)
def reduce_to_of_one_hot(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    scatter = graph[node.inputs[0]]
    if not isinstance(scatter.op, IndexingSetOneHot) or not is_uniform(graph, scatter.inputs[0], 0):
        return None
    sub = scatter.inputs[2]
    return sub if graph[sub].type.shape == node.type.shape else None
