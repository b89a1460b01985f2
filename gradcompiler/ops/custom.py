"""CustomGradient: where a user's composite with a backward of its own ends.

`gc.custom_gradient` (gradcompiler/custom.py) builds the composite's forward
nodes as usual, then one CustomGradient node whose inputs are the composite's
Tensor arguments, its residuals (the forward values its backward reads, as the
seed's CustomGradMaker makes captures explicit) and, last, its forward value.
The node is the identity on that last input. Its gradient rule calls the
user's backward instead of letting the differentiation pass walk into the
composite, so the composite's own nodes get no gradient through it.

The arguments and residuals are inputs so that the dependence is in the graph
(reverse-mode order, requires-grad analysis) and so that a copy of the graph
(check_grads' float64 copy renumbers every node) hands the backward the copy's
values, not the original's. Once differentiation is done the node has no
meaning: `optimize` replaces it by its forward value before any pass runs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from ..errors import GraphError
from ..ir import Op, TensorType


@dataclass(frozen=True)
class CustomGradient(Op):
    """Identity on its last input; gradient: `backward(g, *residuals)` (one per argument)."""

    backward: Callable
    label_name: str
    arguments: int
    residuals: int
    exact: bool = False  # the backward is the composite's true derivative (check_grads checks it)

    kind = "elementwise"
    arity = None

    @property
    def label(self) -> str:
        return f"CustomGradient {self.label_name}"

    def params(self) -> dict:
        return {"name": self.label_name, "arguments": self.arguments, "residuals": self.residuals,
                "exact": self.exact}

    def infer(self, *inputs: TensorType) -> TensorType:
        if len(inputs) != self.arguments + self.residuals + 1:
            raise GraphError(f"takes {self.arguments} arguments, {self.residuals} residuals and the "
                             f"forward value, got {len(inputs)} inputs", op=self.label)
        return inputs[-1]

    def reference(self, *arrays: np.ndarray) -> np.ndarray:
        return arrays[-1].copy()
