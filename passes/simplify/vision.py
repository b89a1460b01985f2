"""An affine warp that is differentiated reads the homogeneous matrix its gradients read.

The WarpAffine rule makes the (N, 2, 3) matrix homogeneous (`rules.vision.homogeneous`) and
differentiates through the perspective backward ops. The forward warp read the affine matrix,
a different node, so the forward and its gradients had different `Op.sibling_key`s. Rewritten
as WarpPerspective of the same homogeneous matrix (the same value: §9.6 defines the affine
warp so), all three share the key, and fusion can make them one step that computes each
pixel's taps once (the CPU's joint warp kernel). Only where the gradient rule's matrix is there
to share (a Concat reading the affine matrix first): a warp that is not differentiated keeps
its op and gains no concat.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from gradcompiler.frontend.tensor import Tensor
from gradcompiler.ir import Graph, Node
from gradcompiler.ops.shape import Concat
from gradcompiler.ops.vision import WarpAffine, WarpPerspective
from gradcompiler.rules.vision import homogeneous

from .registry import rewrite

if TYPE_CHECKING:
    from ..pipeline import PassContext


@rewrite(WarpAffine)
def affine_warp_reads_homogeneous_matrix(graph: Graph, node: Node, ctx: PassContext) -> int | None:
    src, mat = node.inputs
    if not any(isinstance(graph[c].op, Concat) and graph[c].inputs[0] == mat for c in graph.consumers(mat)):
        return None
    op = node.op
    with graph.building(node.role, origin=node.origin, site=node.site):
        perspective = WarpPerspective(op.out_shape, op.border_mode, op.border_val, op.format)
        return graph.add(perspective, (src, homogeneous(Tensor(graph, mat)).id)).id
