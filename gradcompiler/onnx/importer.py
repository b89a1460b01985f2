"""`from_onnx`: an ONNX model as a Graph, built with the frontend calls a user writes.

The importer walks the model's nodes in order and asks the op table for each one's
builder. Values known at import time (integer initializers, `Constant` nodes, `Shape` of
a static tensor and everything computed from those only: the Shape → Gather → Unsqueeze
→ Concat → Reshape arithmetic PyTorch's exporter writes) are folded here, by ONNX's own
reference evaluator, node by node, so a reshape receives its target shape as numbers;
only nodes of the table are folded, so the supported list means the same either way.
Float initializers become trainable params named as in the model; other initializers
are constants. Every refusal names the node or the input it is about.

ONNX names are user strings: they end up as feed names and node names, which generated
code never pastes into its source (feeds are passed by position, see the CPU runtime).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..errors import BuildError, OnnxError, OnnxValueRequired, UnsupportedOnnxOp
from ..frontend.sources import input as gc_input
from ..frontend.sources import param as gc_param
from ..frontend.tensor import Tensor, constant
from ..ir import Graph
from .dtypes import numpy_dtype
from .op_table import TABLES, supported_ops

MIN_OPSET = 13
_DEFAULT_DOMAINS = ("", "ai.onnx")


def require_onnx():
    """The onnx module, or an error that says which extra installs it."""
    try:
        import onnx
    except ImportError:
        raise OnnxError("the onnx package is not installed; install the extra with "
                        "`pip install 'gradcompiler[onnx]'`") from None
    return onnx


def load_model(model: Any):
    """A ModelProto from a path, bytes or a ModelProto; a file that is not ONNX is an error
    naming it (protobuf parses many byte strings without complaint, so the result is
    checked too)."""
    onnx = require_onnx()
    from google.protobuf.message import DecodeError

    if isinstance(model, onnx.ModelProto):
        proto, what = model, "the model"
    else:
        if isinstance(model, (str, os.PathLike)):
            what = f"file {os.fspath(model)!r}"
            try:
                with open(model, "rb") as f:
                    data = f.read()
            except OSError as err:
                raise OnnxError(f"cannot read {what}: {err.strerror}") from None
        elif isinstance(model, (bytes, bytearray, memoryview)):
            data, what = bytes(model), f"the {len(model)} bytes given"
        else:
            raise OnnxError(f"from_onnx takes a path, bytes or an onnx.ModelProto, not a "
                            f"{type(model).__name__}")
        proto = onnx.ModelProto()
        try:
            proto.ParseFromString(data)
        except DecodeError:
            raise OnnxError(f"{what} is not an ONNX model (truncated or another format)") from None
    if not proto.HasField("graph") or not proto.opset_import:
        raise OnnxError(f"{what} is not an ONNX model: it has no graph or no opset")
    try:
        onnx.checker.check_model(proto)
    except onnx.checker.ValidationError as err:
        first = str(err).strip().splitlines()[0]
        raise OnnxError(f"{what} is not a valid ONNX model: {first}") from None
    return proto


def model_opset(proto) -> int:
    versions = [o.version for o in proto.opset_import if o.domain in _DEFAULT_DOMAINS]
    if not versions:
        raise OnnxError("the model imports no version of the default ONNX domain")
    if versions[0] < MIN_OPSET:
        raise OnnxError(f"the model uses opset {versions[0]}; opsets {MIN_OPSET} and later are "
                        "supported (onnx.version_converter can convert it)")
    return versions[0]


@dataclass
class ImportedModel:
    """What `from_onnx` returns: the graph and its named parts.

    `inputs` are the graph inputs that are not initializers, `params` the float
    initializers as trainable params, `initializers` every initializer's value (so
    `{n: m.initializers[n] for n in m.params}` feeds the params), `outputs` the model's
    outputs in its order.
    """

    graph: Graph
    inputs: dict[str, Tensor]
    params: dict[str, Tensor]
    initializers: dict[str, np.ndarray]
    outputs: list[Tensor]
    opset: int
    output_names: list[str] = field(default_factory=list)

    def param_feeds(self) -> dict[str, np.ndarray]:
        """The params' values from the model, ready to merge into a step's feeds."""
        return {name: self.initializers[name] for name in self.params}


class NodeContext:
    """One ONNX node as its builder sees it: inputs as Tensors or as values known at import
    time, attributes by name, and errors that name the node."""

    def __init__(self, importer: _Importer, node) -> None:
        from onnx import helper

        self.importer = importer
        self.node = node
        self.opset = importer.opset
        self.attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}

    @property
    def label(self) -> str:
        name = self.node.name or (self.node.output[0] if self.node.output else "")
        return f"{self.node.op_type} node {name!r} (opset {self.opset})"

    def error(self, message: str) -> OnnxError:
        return OnnxError(f"{self.label}: {message}")

    def attr(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name, default)
        if isinstance(value, list):
            return [v.decode() if isinstance(v, bytes) else v for v in value]
        return value.decode() if isinstance(value, bytes) else value

    def refuse(self, name: str, value: Any, supported: str) -> OnnxError:
        return self.error(f"attribute {name}={value!r} is not supported ({supported})")

    def has(self, i: int) -> bool:
        return i < len(self.node.input) and self.node.input[i] != ""

    @property
    def n_inputs(self) -> int:
        return len(self.node.input)

    def wants(self, k: int) -> bool:
        """Whether output k is asked for."""
        return k < len(self.node.output) and self.node.output[k] != ""

    def x(self, i: int) -> Tensor:
        if not self.has(i):
            raise self.error(f"input {i} is required")
        return self.importer.tensor(self.node.input[i], self)

    def opt(self, i: int) -> Tensor | None:
        return self.x(i) if self.has(i) else None

    def inputs(self) -> list[Tensor]:
        return [self.x(i) for i in range(self.n_inputs) if self.has(i)]

    def const(self, i: int, what: str) -> np.ndarray | None:
        """Input i's value, which must be known at import time (None if it is absent)."""
        if not self.has(i):
            return None
        name = self.node.input[i]
        if name in self.importer.input_names and name not in self.importer.known:
            raise OnnxValueRequired(
                f"{self.label}: input {i} ({what}) is the graph input {name!r}, whose value sets "
                f"a shape; give it at import time with values={{{name!r}: ...}}", name)
        if name not in self.importer.known:
            raise self.error(f"input {i} ({what}, {name!r}) must be known at import time; it is "
                             "computed from data, which would make the shapes dynamic")
        return self.importer.known[name]


class _Importer:
    def __init__(self, proto, shapes: Mapping[str, Any] | None,
                 values: Mapping[str, Any] | None) -> None:
        self.proto = proto
        self.opset = model_opset(proto)
        self.shapes = dict(shapes or {})
        self.values = dict(values or {})
        self.input_names = {info.name for info in proto.graph.input}
        self.graph = Graph(proto.graph.name or "onnx")
        self.tensors: dict[str, Tensor] = {}
        self.known: dict[str, np.ndarray] = {}

    def tensor(self, name: str, context: NodeContext | None = None) -> Tensor:
        """The value `name` as a Tensor of the graph (a known value becomes one constant)."""
        if name not in self.tensors:
            if name not in self.known:
                where = f"{context.label}: " if context else ""
                raise OnnxError(f"{where}value {name!r} is used before any node produces it")
            try:
                self.tensors[name] = constant(self.known[name], graph=self.graph)
            except BuildError as err:
                where = context.label if context else f"value {name!r}"
                raise OnnxError(f"{where}: {err.message}") from None
        return self.tensors[name]

    def run(self) -> ImportedModel:
        from onnx import numpy_helper

        graph = self.proto.graph
        initializers = {}
        params = {}
        with self.graph:
            for init in graph.initializer:
                dtype = numpy_dtype(init.data_type, f"initializer {init.name!r}")
                value = numpy_helper.to_array(init).astype(dtype, copy=False)
                initializers[init.name] = value
                if dtype.kind == "f":
                    params[init.name] = gc_param(init.name, value.shape, dtype)
                    self.tensors[init.name] = params[init.name]
                else:
                    self.known[init.name] = value
            inputs = {}
            for info in graph.input:
                if info.name in self.values:
                    self.known[info.name] = self.bound_value(info)
                elif info.name not in initializers:
                    inputs[info.name] = self.declare_input(info)
                    self.tensors[info.name] = inputs[info.name]
            for node in graph.node:
                self.add(node)
            outputs = [self.tensor(o.name) for o in graph.output]
        self.graph.outputs = [t.id for t in outputs]
        return ImportedModel(self.graph, inputs, params, initializers, outputs, self.opset,
                             [o.name for o in graph.output])

    def bound_value(self, info) -> np.ndarray:
        """The value given for input `info` in `values=`, in the input's dtype."""
        dtype = numpy_dtype(info.type.tensor_type.elem_type, f"input {info.name!r}")
        value = np.asarray(self.values[info.name])
        if value.dtype != dtype:
            raise OnnxError(f"values[{info.name!r}] has dtype {value.dtype}; the input is "
                            f"{dtype.name}")
        return value

    def declare_input(self, info) -> Tensor:
        about = f"input {info.name!r}"
        if not info.type.HasField("tensor_type"):
            raise OnnxError(f"{about} is not a tensor (sequences, maps and optionals are not "
                            "supported)")
        tensor_type = info.type.tensor_type
        dtype = numpy_dtype(tensor_type.elem_type, about)
        dims = list(tensor_type.shape.dim)
        given = self.shapes.get(info.name)
        if given is not None:
            given = tuple(int(d) for d in given)
            if len(given) != len(dims) or any(
                    d.HasField("dim_value") and d.dim_value != g for d, g in zip(dims, given)):
                model_dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param or "?"
                                   for d in dims)
                raise OnnxError(f"shapes[{info.name!r}] = {given} does not fit the model's "
                                f"shape {model_dims}")
            return gc_input(info.name, given, dtype)
        shape = []
        for axis, dim in enumerate(dims):
            if not dim.HasField("dim_value"):
                symbol = f" {dim.dim_param!r}" if dim.dim_param else ""
                raise OnnxError(f"{about}: dimension {axis}{symbol} is symbolic; give the "
                                f"input's shape with shapes={{{info.name!r}: (...)}}")
            shape.append(dim.dim_value)
        return gc_input(info.name, tuple(shape), dtype)

    def add(self, node) -> None:
        row = TABLES.get(node.domain, {}).get(node.op_type)
        context = NodeContext(self, node)
        if row is None:
            domain = f" of domain {node.domain!r}" if node.domain not in _DEFAULT_DOMAINS else ""
            raise UnsupportedOnnxOp(f"{context.label}: op {node.op_type}{domain} is not in the "
                                    f"op table; supported: {', '.join(supported_ops())}")
        unknown = sorted(set(context.attrs) - set(row.attrs))
        if unknown:
            raise context.error(f"attribute {unknown[0]} is not supported (supported: "
                                f"{', '.join(row.attrs) or 'none'})")
        present = [name for name in node.input if name]
        if all(name in self.known for name in present) and row.foldable:
            values = self.fold(node)
        else:
            try:
                values = row.build(context)
            except BuildError as err:
                raise OnnxError(f"{context.label}: {err.message}") from None
        for k, name in enumerate(node.output):
            if not name:
                continue
            if k >= len(values):
                raise context.error(f"output {k} ({name!r}) is not supported")
            if isinstance(values[k], Tensor):
                self.tensors[name] = values[k]
            else:
                self.known[name] = np.asarray(values[k])

    def fold(self, node) -> list[np.ndarray]:
        """The node evaluated on its known inputs by ONNX's reference evaluator."""
        from onnx.reference import ReferenceEvaluator

        feeds = {name: self.known[name] for name in node.input if name}
        evaluator = ReferenceEvaluator(node, opsets={"": self.opset})
        return [np.asarray(v) for v in evaluator.run(None, feeds)]


def from_onnx(model: Any, shapes: Mapping[str, Any] | None = None,
              values: Mapping[str, Any] | None = None) -> ImportedModel:
    """Import an ONNX model (a path, bytes or an onnx.ModelProto, opset 13 or later).

    `shapes` gives the sizes of inputs with symbolic dimensions, {input name: shape}.
    `values` fixes inputs to values known at import time, {input name: array}: the graph
    is specialised to them (an input that sets a shape, such as a Reshape's target, must
    be given here, since shapes are static), and they are no longer inputs.
    """
    return _Importer(load_model(model), shapes, values).run()
