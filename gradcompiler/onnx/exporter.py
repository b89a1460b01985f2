"""`to_onnx`: a graph — typically a training step, the loss and its gradients, forward and
backward nodes alike — written as an ONNX model through the export rules of `op_table.py`.

Feeds (inputs and params) become the model's inputs under their feed names, constants
become Constant nodes, and each requested Tensor becomes an output. A graph with an op
that has no export rule is refused naming the first such node, before anything is
written.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import OnnxError
from ..frontend.tensor import Tensor
from ..ir import Graph, Node
from ..ops.source import Constant, Fill, Placeholder
from .dtypes import onnx_elem_type
from .importer import require_onnx
from .op_table import EXPORTS, export_key

EXPORT_OPSET = 20  # Gelu's first opset


class Emitter:
    """Collects ONNX nodes and constants; names every value it makes uniquely."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.nodes: list = []
        self.types: dict[str, tuple[tuple[int, ...], np.dtype]] = {}
        self.prefix = "v"  # longer until no feed name starts with it: fresh names never clash
        while any(name.startswith(self.prefix) for name in graph.feed_names):
            self.prefix += "_"
        self.count = 0

    def fresh(self) -> str:
        self.count += 1
        return f"{self.prefix}_{self.count}"

    def node(self, op_type: str, inputs: Sequence[str], **attrs: Any) -> str:
        return self.multi(op_type, inputs, 1, **attrs)[0]

    def multi(self, op_type: str, inputs: Sequence[str], count: int, **attrs: Any) -> list[str]:
        """A node with `count` outputs (MaxPool's values and Indices); their names."""
        from onnx import helper

        outs = [self.fresh() for _ in range(count)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, **attrs))
        return outs

    def const(self, array: np.ndarray) -> str:
        """A Constant node, not an initializer: the importer makes float initializers
        trainable params, and a constant is not one."""
        from onnx import numpy_helper

        array = np.asarray(array)
        name = self.node("Constant", [], value=numpy_helper.from_array(array))
        self.types[name] = (array.shape, array.dtype)
        return name

    def shape_of(self, name: str) -> tuple[int, ...]:
        return self.types[name][0]

    def dtype_of(self, name: str) -> np.dtype:
        return self.types[name][1]

    @staticmethod
    def elem_type(dtype) -> int:
        return onnx_elem_type(dtype)


def _outputs_of(source) -> tuple[Graph, list[int]]:
    from ..compile import Executable

    if isinstance(source, Executable):
        return source.graph, list(source.graph.outputs)
    tensors = [source] if isinstance(source, Tensor) else list(source)
    if not tensors or not all(isinstance(t, Tensor) for t in tensors):
        raise OnnxError("to_onnx takes a Tensor, a list of Tensors or a compiled Executable")
    if len({id(t.graph) for t in tensors}) != 1:
        raise OnnxError("to_onnx: all Tensors must come from one graph")
    return tensors[0].graph, [t.id for t in tensors]


def _describe(node: Node) -> str:
    name = f" '{node.name}'" if node.name else ""
    return f"%{node.id}{name} {node.op.label} at {node.site}"


def to_onnx(source, path: str | os.PathLike | None = None, names: Sequence[str] | None = None):
    """Write `source` (a Tensor, a list of Tensors, or an Executable) as an ONNX model.

    `names` names the outputs (default output_0, output_1, ...). Returns the ModelProto,
    and saves it to `path` when one is given.
    """
    onnx = require_onnx()
    from onnx import helper

    graph, outputs = _outputs_of(source)
    names = list(names) if names is not None else [f"output_{k}" for k in range(len(outputs))]
    if len(names) != len(outputs):
        raise OnnxError(f"to_onnx: {len(names)} names for {len(outputs)} outputs")
    order = graph.topo_order(graph.ancestors(outputs))
    missing = next((graph[i] for i in order if not isinstance(graph[i].op, (
        Placeholder, Constant, Fill)) and export_key(graph[i].op) not in EXPORTS), None)
    if missing is not None:
        raise OnnxError(f"to_onnx: {_describe(missing)} has no ONNX equivalent in the op "
                        f"table ({export_key(missing.op)})")
    emitter = Emitter(graph)
    values: dict[int, str] = {}
    inputs = []
    for node_id in order:
        node = graph[node_id]
        if isinstance(node.op, Placeholder):
            values[node_id] = node.op.feed_name
            emitter.types[node.op.feed_name] = (node.type.shape, node.type.dtype)
            inputs.append(helper.make_tensor_value_info(
                node.op.feed_name, onnx_elem_type(node.type.dtype), list(node.type.shape)))
            continue
        if isinstance(node.op, (Constant, Fill)):
            values[node_id] = emitter.const(node.op.reference())
            continue
        ins = [values[i] for i in node.inputs]
        try:
            values[node_id] = EXPORTS[export_key(node.op)](node.op, ins, node.type, emitter)
        except OnnxError as err:  # a rule refusing one configuration of its op
            raise OnnxError(f"to_onnx: {_describe(node)}: {err}") from None
        emitter.types[values[node_id]] = (node.type.shape, node.type.dtype)
    outs = []
    for name, node_id in zip(names, outputs):
        emitter.nodes.append(helper.make_node("Identity", [values[node_id]], [name]))
        node_type = graph[node_id].type
        outs.append(helper.make_tensor_value_info(name, onnx_elem_type(node_type.dtype),
                                                  list(node_type.shape)))
    model = helper.make_model(
        helper.make_graph(emitter.nodes, graph.name, inputs, outs),
        opset_imports=[helper.make_opsetid("", EXPORT_OPSET)], producer_name="gradcompiler")
    onnx.checker.check_model(model)
    if path is not None:
        onnx.save(model, path)
    return model
