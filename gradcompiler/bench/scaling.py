"""Graphs of growing size, for measuring how compile time scales with the graph.

    build_residual_mlp(depth) -> (loss, wrt)
    build_gpt_stack(blocks) -> (loss, wrt)
"""

from __future__ import annotations

import gradcompiler as gc

RESIDUAL_WIDTH, RESIDUAL_BATCH, RESIDUAL_CLASSES = 16, 4, 16


def build_residual_mlp(depth: int, width: int = RESIDUAL_WIDTH, batch: int = RESIDUAL_BATCH):
    """`depth` layers of h = h + tanh(layer_norm(h @ W + b)), then a cross-entropy.

    Returns the loss and the parameters (every W and b) the gradients are taken against.
    """
    with gc.Graph(f"residual_mlp_{depth}"):
        h = gc.input("x", (batch, width))
        labels = gc.input("labels", (batch,), "int32")
        wrt = []
        for layer in range(depth):
            w = gc.param(f"w{layer}", (width, width))
            b = gc.param(f"b{layer}", (width,))
            h = h + gc.tanh(gc.layer_norm(h @ w + b))
            wrt += [w, b]
        loss = gc.cross_entropy(h, labels)
    return loss, wrt
