"""The one table between ONNX and gradcompiler: each ONNX op type, the frontend calls that
build it, the attributes it accepts, and, for the gc ops it is the image of, how they are
written back (the export direction). The importer and the exporter read only this table,
so an op imports as what it exports from, and a test round-trips every export row.

A builder takes the importer's `NodeContext` and returns the node's outputs, as Tensors,
or as numpy arrays for values known at import time (Shape, Size). Any attribute outside
a row's list is refused by the importer; a value of a listed attribute that a builder
does not implement is refused by the builder, naming it: nothing is approximated.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

import gradcompiler as gc
from . import compose


@dataclass(frozen=True)
class Row:
    build: Callable
    attrs: tuple[str, ...] = ()
    foldable: bool = True  # evaluated at import time when every input is known


def _unary(fn: Callable) -> Row:
    return Row(lambda c: [fn(c.x(0))])


def _binary(fn: Callable) -> Row:
    return Row(lambda c: [fn(c.x(0), c.x(1))])


def _variadic(fn: Callable) -> Row:
    def build(c):
        tensors = c.inputs()
        result = tensors[0]
        for t in tensors[1:]:
            result = fn(result, t)
        return [result]
    return Row(build)


def _div(c):
    a, b = c.x(0), c.x(1)
    if a.dtype.kind == "f":
        return [a / b]
    if a.dtype.itemsize > 4:
        raise c.error(f"integer division of {a.dtype.name} is not supported (exact only up to "
                      "32-bit integers, through float64)")
    quotient = gc.div(gc.cast(a, np.float64), gc.cast(b, np.float64), rounding_mode="trunc")
    return [gc.cast(quotient, a.dtype)]


def _pow(c):
    base, exponent = c.x(0), c.x(1)
    if base.dtype.kind != "f":
        raise c.error(f"Pow of an {base.dtype.name} base is not supported (float bases only)")
    return [gc.power(base, gc.cast(exponent, base.dtype))]


def _leaky_relu(c):
    x = c.x(0)
    return [gc.where(gc.less(x, 0), x * c.attr("alpha", 0.01), x)]


def _elu(c):
    x = c.x(0)
    return [gc.where(gc.less(x, 0), gc.expm1(x) * c.attr("alpha", 1.0), x)]


def _gelu(c):
    approximate = c.attr("approximate", "none")
    if approximate not in ("none", "tanh"):
        raise c.refuse("approximate", approximate, "none, tanh")
    return [(gc.gelu if approximate == "none" else gc.gelu_tanh)(c.x(0))]


def _clip(c):
    x, lo, hi = c.x(0), c.opt(1), c.opt(2)
    return [x if lo is None and hi is None else gc.clip(x, lo, hi)]


def _mean(c):
    tensors = c.inputs()
    total = tensors[0]
    for t in tensors[1:]:
        total = total + t
    return [total / len(tensors)]


def _cast_to(c, x, dtype):
    if c.attr("saturate", 1) != 1 and dtype.kind != "f":
        raise c.refuse("saturate", c.attr("saturate"), "1 (it applies to float8 types)")
    if c.attr("round_mode", "up") != "up":
        raise c.refuse("round_mode", c.attr("round_mode"), "up (it applies to float8 types)")
    return [gc.cast(x, dtype)]


def _cast(c):
    from .dtypes import numpy_dtype

    return _cast_to(c, c.x(0), numpy_dtype(c.attr("to"), f"{c.label}: its target type"))


def _dropout(c):
    training = c.const(2, "training_mode")
    if training is not None and bool(np.asarray(training)):
        raise c.error("training_mode=True (random masks) is not supported; inference only")
    x = c.x(0)
    return [x, np.ones(x.shape, dtype=bool)]


def _gemm(c):
    a, b, bias = c.x(0), c.x(1), c.opt(2)
    y = gc.matmul(a, b, transpose_a=bool(c.attr("transA", 0)),
                  transpose_b=bool(c.attr("transB", 0)))
    alpha, beta = c.attr("alpha", 1.0), c.attr("beta", 1.0)
    y = y if alpha == 1.0 else y * alpha
    if bias is None:
        return [y]
    return [y + (bias if beta == 1.0 else bias * beta)]


def _softmax(fn):
    return Row(lambda c: [fn(c.x(0), int(c.attr("axis", -1)))], ("axis",))


def _reshape(c):
    x = c.x(0)
    shape = [int(d) for d in c.const(1, "shape")]
    if not c.attr("allowzero", 0):
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    return [gc.reshape(x, tuple(shape))]


def _flatten(c):
    x = c.x(0)
    axis = int(c.attr("axis", 1))
    axis = axis + x.ndim if axis < 0 else axis
    return [gc.reshape(x, (int(np.prod(x.shape[:axis])), int(np.prod(x.shape[axis:]))))]


def _transpose(c):
    perm = c.attr("perm")
    return [gc.transpose(c.x(0), None if perm is None else tuple(perm))]


def _squeeze(c):
    axes = c.const(1, "axes")
    return [gc.squeeze(c.x(0), None if axes is None else tuple(int(a) for a in axes))]


def _unsqueeze(c):
    return [gc.expand_dims(c.x(0), tuple(int(a) for a in c.const(1, "axes")))]


def _expand(c):
    x = c.x(0)
    shape = tuple(int(d) for d in c.const(1, "shape"))
    return [gc.broadcast_to(x, np.broadcast_shapes(x.shape, shape))]


def _shape(c):
    shape = np.array(c.x(0).shape, dtype=np.int64)
    start, end = c.attr("start", 0), c.attr("end")
    return [shape[start:end]]


def _not_before_known(what: str):
    """Ops whose outputs only exist for inputs known at import time (their shape is the
    inputs' value): folded when they are known; built, they name the dynamic input."""
    def build(c):
        for i in range(c.n_inputs):
            c.const(i, what)
    return build


TABLE: dict[str, Row] = {
    # elementwise arithmetic and functions
    "Add": _binary(gc.add),
    "Sub": _binary(gc.subtract),
    "Mul": _binary(gc.multiply),
    "Div": Row(_div),
    "Pow": Row(_pow),
    "Neg": _unary(gc.negative),
    "Abs": _unary(gc.abs),
    "Sqrt": _unary(gc.sqrt),
    "Reciprocal": _unary(lambda x: 1.0 / x),
    "Exp": _unary(gc.exp),
    "Log": _unary(gc.log),
    "Tanh": _unary(gc.tanh),
    "Sigmoid": _unary(gc.sigmoid),
    "Relu": _unary(gc.relu),
    "LeakyRelu": Row(_leaky_relu, ("alpha",)),
    "Elu": Row(_elu, ("alpha",)),
    "Gelu": Row(_gelu, ("approximate",)),
    "Erf": _unary(gc.erf),
    "Softplus": _unary(gc.softplus),
    "Sin": _unary(gc.sin),
    "Cos": _unary(gc.cos),
    "Clip": Row(_clip),
    "Min": _variadic(gc.minimum),
    "Max": _variadic(gc.maximum),
    "Sum": _variadic(gc.add),
    "Mean": Row(_mean),
    "Where": Row(lambda c: [gc.where(c.x(0), c.x(1), c.x(2))]),
    # comparisons and logic
    "Equal": _binary(gc.equal),
    "Less": _binary(gc.less),
    "LessOrEqual": _binary(gc.less_equal),
    "Greater": _binary(lambda a, b: gc.less(b, a)),
    "GreaterOrEqual": _binary(lambda a, b: gc.less_equal(b, a)),
    "Not": _unary(lambda x: gc.equal(x, False)),
    # types and identities
    "Cast": Row(_cast, ("to", "saturate", "round_mode")),
    "CastLike": Row(lambda c: _cast_to(c, c.x(0), c.x(1).dtype), ("saturate", "round_mode")),
    "Identity": _unary(lambda x: x),
    "Dropout": Row(_dropout, ("seed",)),
    # products
    "MatMul": _binary(gc.matmul),
    "Gemm": Row(_gemm, ("alpha", "beta", "transA", "transB")),
    "Einsum": Row(compose.einsum, ("equation",)),
    # normalisation and losses
    "Softmax": _softmax(gc.softmax),
    "LogSoftmax": _softmax(gc.log_softmax),
    "LayerNormalization": Row(compose.layer_normalization, ("axis", "epsilon", "stash_type")),
    "SoftmaxCrossEntropyLoss": Row(compose.softmax_cross_entropy,
                                   ("ignore_index", "reduction")),
    "NegativeLogLikelihoodLoss": Row(compose.negative_log_likelihood,
                                     ("ignore_index", "reduction")),
    # reductions
    **{name: Row(compose.reduction(fn, empty), ("axes", "keepdims", "noop_with_empty_axes"))
       for name, (fn, empty) in {
           "ReduceSum": (gc.sum, compose.ZERO),
           "ReduceMean": (gc.mean, compose.NAN),
           "ReduceMax": (compose.bool_safe("MAX"), compose.LOWEST),
           "ReduceMin": (compose.bool_safe("MIN"), compose.HIGHEST),
           "ReduceProd": (gc.prod, compose.ONE),
           "ReduceSumSquare": (gc.sum_sqr, compose.ZERO),
           "ReduceL2": (lambda x, axes, keep: gc.sqrt(gc.sum_sqr(x, axes, keep)), compose.ZERO),
           "ReduceLogSumExp": (compose.log_sum_exp, compose.LOWEST),
       }.items()},
    "ArgMax": Row(compose.argmax, ("axis", "keepdims", "select_last_index")),
    # shapes
    "Reshape": Row(_reshape, ("allowzero",)),
    "Flatten": Row(_flatten, ("axis",)),
    "Transpose": Row(_transpose, ("perm",)),
    "Squeeze": Row(_squeeze),
    "Unsqueeze": Row(_unsqueeze),
    "Expand": Row(_expand),
    "Tile": Row(compose.tile),
    "Concat": Row(lambda c: [gc.concat(c.inputs(), int(c.attr("axis")))], ("axis",)),
    "Split": Row(compose.split, ("axis", "num_outputs")),
    "Slice": Row(compose.slice_),
    "Pad": Row(compose.pad, ("mode",)),
    "DepthToSpace": Row(compose.depth_to_space, ("blocksize", "mode")),
    "SpaceToDepth": Row(compose.space_to_depth, ("blocksize", "mode")),
    "Trilu": Row(compose.trilu, ("upper",)),
    # indexing
    "Gather": Row(compose.gather, ("axis",)),
    "GatherElements": Row(compose.gather_elements, ("axis",)),
    "ScatterElements": Row(compose.scatter_elements, ("axis", "reduction")),
    "OneHot": Row(compose.one_hot, ("axis",)),
    # values known at import time
    "Shape": Row(_shape, ("start", "end")),
    "Size": Row(lambda c: [np.array(c.x(0).size, dtype=np.int64)]),
    "ConstantOfShape": Row(_not_before_known("the shape"), ("value",)),
    "Range": Row(_not_before_known("start, limit and delta")),
    "Constant": Row(_not_before_known("the value"),
                    ("value", "value_float", "value_floats", "value_int", "value_ints")),
}


def _gradient(c):
    """ai.onnx.preview.training's Gradient: d y / d xs through gc.grad (the xs are the
    node's inputs, y any value of the graph)."""
    if c.attr("zs"):
        raise c.refuse("zs", c.attr("zs"), "none: every x is differentiated")
    xs = [c.importer.tensor(name, c) for name in c.attr("xs")]
    return gc.grad(c.importer.tensor(c.attr("y"), c), xs)


TRAINING_DOMAIN = "ai.onnx.preview.training"
TABLES: dict[str, dict[str, Row]] = {
    "": TABLE,
    "ai.onnx": TABLE,
    TRAINING_DOMAIN: {"Gradient": Row(_gradient, ("xs", "y", "zs"), foldable=False)},
}


def supported_ops() -> list[str]:
    """The ONNX op types the importer builds, sorted (other domains' with their domain)."""
    others = [f"{domain}.{op}" for domain, table in TABLES.items() if table is not TABLE
              for op in table]
    return sorted(TABLE) + others
