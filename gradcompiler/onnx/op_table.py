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

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

import gradcompiler as gc

from . import compose, conv


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
    # convolution, pooling, batch norm (2-d; the padding rules in conv.py)
    "Conv": Row(conv.conv, ("auto_pad", "dilations", "group", "kernel_shape", "pads", "strides")),
    "ConvTranspose": Row(conv.conv_transpose, ("auto_pad", "dilations", "group", "kernel_shape",
                                               "output_padding", "output_shape", "pads", "strides")),
    "MaxPool": Row(conv.max_pool, ("auto_pad", "ceil_mode", "dilations", "kernel_shape", "pads",
                                   "storage_order", "strides")),
    "AveragePool": Row(conv.avg_pool, ("auto_pad", "ceil_mode", "count_include_pad", "dilations",
                                       "kernel_shape", "pads", "strides")),
    "GlobalAveragePool": Row(conv.global_avg_pool),
    "BatchNormalization": Row(conv.batch_norm, ("epsilon", "momentum", "training_mode")),
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


# -- the export direction: gc ops written as ONNX nodes of the table above ----------------
# Each rule takes the gc node's op, its input value names, its output type and an Emitter
# (`node(op_type, inputs, **attrs)` returns the new value's name, `const(array)` a
# constant's); it uses only ONNX op types of TABLE, which a test checks, and a round-trip
# test imports each exported graph back and compares values.

_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


def _same(onnx_type: str):
    return lambda op, ins, out, e: e.node(onnx_type, ins)


def _zero(e, out):
    return e.const(np.zeros((), out.dtype))


def _normal_cdf(e, a, dtype):
    erf = e.node("Erf", [e.node("Mul", [a, e.const(np.array(_SQRT_HALF, dtype))])])
    half = e.const(np.array(0.5, dtype))
    return e.node("Mul", [half, e.node("Add", [e.const(np.array(1.0, dtype)), erf])])


def _gelu_grad(op, ins, out, e):
    a, g = ins
    dtype = out.dtype
    density = e.node("Mul", [e.const(np.array(_INV_SQRT_2PI, dtype)), e.node("Exp", [e.node(
        "Mul", [e.const(np.array(-0.5, dtype)), e.node("Mul", [a, a])])])])
    slope = e.node("Add", [_normal_cdf(e, a, dtype), e.node("Mul", [a, density])])
    return e.node("Mul", [g, slope])


def _one_minus(e, x, dtype):
    return e.node("Sub", [e.const(np.array(1.0, dtype)), x])


ELEMWISE_EXPORTS: dict[str, Callable] = {
    "ADD": _same("Add"), "SUB": _same("Sub"), "MUL": _same("Mul"), "TRUE_DIV": _same("Div"),
    "NEGATE": _same("Neg"), "POW": _same("Pow"), "MAX": _same("Max"), "MIN": _same("Min"),
    "ABS": _same("Abs"), "EXP": _same("Exp"), "LOG": _same("Log"), "SQRT": _same("Sqrt"),
    "SIN": _same("Sin"), "COS": _same("Cos"), "TANH": _same("Tanh"), "ERF": _same("Erf"),
    "SIGMOID": _same("Sigmoid"), "RELU": _same("Relu"), "SOFTPLUS": _same("Softplus"),
    "GELU": _same("Gelu"), "LT": _same("Less"), "LEQ": _same("LessOrEqual"),
    "EQ": _same("Equal"),
    "RSQRT": lambda op, ins, out, e: e.node("Reciprocal", [e.node("Sqrt", ins)]),
    "EXPM1": lambda op, ins, out, e: e.node("Sub", [e.node("Exp", ins),
                                                     e.const(np.array(1, out.dtype))]),
    "FUSE_MUL_ADD3": lambda op, ins, out, e: e.node("Add", [e.node("Mul", ins[:2]), ins[2]]),
    "SWITCH_GT0": lambda op, ins, out, e: e.node("Where", [e.node(
        "Less", [e.const(np.zeros((), np.dtype(e.dtype_of(ins[0])))), ins[0]]), ins[1],
        _zero(e, out)]),
    "COND_LEQ_MOV": lambda op, ins, out, e: e.node("Where", [e.node("LessOrEqual", ins[:2]),
                                                             ins[2], _zero(e, out)]),
    "COND_LT_MOV": lambda op, ins, out, e: e.node("Where", [e.node("Less", ins[:2]), ins[2],
                                                            _zero(e, out)]),
    "ABS_GRAD": lambda op, ins, out, e: e.node("Where", [e.node(
        "Less", [_zero(e, out), ins[0]]), ins[1], e.node("Neg", [ins[1]])]),
    "SIGMOID_GRAD": lambda op, ins, out, e: e.node("Mul", [e.node(
        "Mul", [ins[0], _one_minus(e, ins[0], out.dtype)]), ins[1]]),
    "TANH_GRAD": lambda op, ins, out, e: e.node("Mul", [_one_minus(
        e, e.node("Mul", [ins[0], ins[0]]), out.dtype), ins[1]]),
    "GELU_GRAD": _gelu_grad,
    "SOFTPLUS_GRAD": lambda op, ins, out, e: e.node("Mul", [ins[1], e.node("Sigmoid",
                                                                            [ins[0]])]),
}

_REDUCE_EXPORTS = {"SUM": "ReduceSum", "MEAN": "ReduceMean", "MAX": "ReduceMax",
                   "MIN": "ReduceMin", "PRODUCT": "ReduceProd", "SUM_SQR": "ReduceSumSquare"}


def _reduce(op, ins, out, e):
    axes = [] if op.axes is None else [e.const(np.array(op.axes, np.int64))]
    keepdims = int(op.keepdims) if op.axes is not None else 0
    return e.node(_REDUCE_EXPORTS[op.mode], ins + axes, keepdims=keepdims)


def _reduce_to(op, ins, out, e):
    from ..ops.reduce import reduce_to_axes

    axes = reduce_to_axes(e.shape_of(ins[0]), tuple(op.shape))
    total = e.node("ReduceSum", [ins[0], e.const(np.array(axes, np.int64))], keepdims=1)
    return _reshape_to(e, total, out.shape)


def _reshape_to(e, x, shape):
    return e.node("Reshape", [x, e.const(np.array(shape, np.int64))])


def _swapped(e, x, flag):
    if not flag:
        return x
    rank = len(e.shape_of(x))
    return e.node("Transpose", [x], perm=[*range(rank - 2), rank - 1, rank - 2])


def _batched_matmul(op, ins, out, e):
    return e.node("MatMul", [_swapped(e, ins[0], op.transpose_a),
                             _swapped(e, ins[1], op.transpose_b)])


def _matrix_mul(op, ins, out, e):
    """MatrixMul's regimes (rows of an N-d A against a 2-D B; two N-d operands flattened to
    matrices, as weight gradients use) as reshapes around one 2-D MatMul."""
    from ..ir import TensorType

    types = [TensorType(e.shape_of(x), e.dtype_of(x)) for x in ins]
    flat = [x if e.shape_of(x) == shape else _reshape_to(e, x, shape)
            for x, shape in zip(ins, op.matrix_shapes(*types))]
    for x, shape in zip(flat, op.matrix_shapes(*types)):
        e.types[x] = (shape, types[0].dtype)
    product = e.node("MatMul", [_swapped(e, flat[0], op.transpose_a),
                                _swapped(e, flat[1], op.transpose_b)])
    return _reshape_to(e, product, out.shape)


_INT64_MIN = -(2 ** 63)


def _subtensor(op, ins, out, e):
    from ..ops.indexing import SliceItem

    starts, ends, axes, steps = [], [], [], []
    for item in op.items:
        if isinstance(item, SliceItem):
            end = item.start + item.length * item.step
            start, stop, step = item.start, end if end >= 0 else _INT64_MIN, item.step
        else:
            start, stop, step = item.index, item.index + 1, 1
        starts.append(start), ends.append(stop), axes.append(item.axis), steps.append(step)
    sliced = e.node("Slice", [ins[0], *(e.const(np.array(v, np.int64))
                                        for v in (starts, ends, axes, steps))])
    return _reshape_to(e, sliced, out.shape)


def _along_axis(onnx_type):
    """IndexingOneHot / IndexingSetOneHot: one index per position along op.axis, as
    GatherElements / ScatterElements with the index's axis restored."""
    def emit(op, ins, out, e):
        index_slot = 1
        axes = e.const(np.array([op.axis], np.int64))
        index = e.node("Unsqueeze", [ins[index_slot], axes])
        index = e.node("Cast", [index], to=7)  # INT64
        if onnx_type == "GatherElements":
            return e.node(onnx_type, [ins[0], index], axis=op.axis)
        return e.node(onnx_type, [ins[0], index, ins[2]], axis=op.axis)
    return emit


def export_key(op) -> str:
    """The name an op's export rule is filed under: its class, with its mode if it has one."""
    mode = getattr(op, "mode", None)
    return f"{type(op).__name__} {mode}" if mode is not None else type(op).__name__


EXPORTS: dict[str, Callable] = {
    **{f"Elemwise {mode}": rule for mode, rule in ELEMWISE_EXPORTS.items()},
    **{f"Reduce {mode}": _reduce for mode in _REDUCE_EXPORTS},
    "ReduceTo": _reduce_to,
    "Where": _same("Where"),
    "Cast": lambda op, ins, out, e: e.node("Cast", ins, to=e.elem_type(op.dtype)),
    "StopGradient": _same("Identity"),
    "CustomGradient": lambda op, ins, out, e: e.node("Identity", [ins[-1]]),  # its forward value
    "FastpathCopy": _same("Identity"),
    "Broadcast": lambda op, ins, out, e: e.node("Expand", [ins[0], e.const(
        np.array(op.shape, np.int64))]),
    "Reshape": lambda op, ins, out, e: _reshape_to(e, ins[0], out.shape),
    "AddAxis": lambda op, ins, out, e: _reshape_to(e, ins[0], out.shape),
    "RemoveAxis": lambda op, ins, out, e: _reshape_to(e, ins[0], out.shape),
    "Transpose": lambda op, ins, out, e: e.node("Transpose", ins, perm=list(op.perm)),
    "Concat": lambda op, ins, out, e: e.node("Concat", ins, axis=op.axis),
    "MatrixMul": _matrix_mul,
    "BatchedMatrixMul": _batched_matmul,
    "Subtensor": _subtensor,
    "IndexingOneHot": _along_axis("GatherElements"),
    "IndexingSetOneHot": _along_axis("ScatterElements"),
    "Convolution": conv.export_convolution,
    "ConvolutionBackwardData": conv.export_backward_data,
    "ConvolutionBackwardFilter": conv.export_backward_filter,
    **{f"{cls} {mode}": rule for cls, rule in (("Pooling", conv.export_pooling),
                                                ("PoolingBackward", conv.export_pooling_backward))
       for mode in ("MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING")},
}
