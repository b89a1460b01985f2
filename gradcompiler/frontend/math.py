"""numpy-style math on Tensors: elementwise functions, reductions, matmul, casts.

Each function lowers to one primitive op (or a couple, for `x ** 2` and
1-D matmul operands); composites live in `nn.py`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..errors import BuildError, ShapeError
from ..ops.common import checked_dtype, normalize_axes
from ..ops.elemwise import Cast, Elemwise, StopGradient, Where
from ..ops.linalg import BatchedMatrixMul, MatrixMul
from ..ops.reduce import Reduce, ReduceTo
from .tensor import Tensor, apply, reports_user_line, to_operands

__all__ = [
    "elemwise", "exp", "log", "log1p", "expm1", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid",
    "erf", "gelu", "softplus", "relu", "negative", "abs", "add", "subtract", "multiply", "divide",
    "maximum", "minimum", "less", "less_equal", "equal", "power", "where", "cast", "stop_gradient",
    "floor", "ceil", "trunc", "round", "sign", "div", "floor_divide",
    "reduce", "sum", "mean", "max", "min", "prod", "sum_sqr", "reduce_to", "matmul",
]


def elemwise(mode: str, *operands: Any, name: str | None = None) -> Tensor:
    return apply(Elemwise(mode), *operands, name=name)


def _unary(mode: str):
    def fn(x: Any) -> Tensor:
        return elemwise(mode, x)

    fn.__name__ = mode.lower()
    fn.__doc__ = f"Elementwise {mode} (op-reference §2)."
    return fn


exp = _unary("EXP")
log = _unary("LOG")
log1p = _unary("LOG1P")
expm1 = _unary("EXPM1")
sqrt = _unary("SQRT")
rsqrt = _unary("RSQRT")
sin = _unary("SIN")
cos = _unary("COS")
tanh = _unary("TANH")
sigmoid = _unary("SIGMOID")
erf = _unary("ERF")
gelu = _unary("GELU")
softplus = _unary("SOFTPLUS")
relu = _unary("RELU")
negative = _unary("NEGATE")
abs = _unary("ABS")  # noqa: A001 - numpy's name
floor = _unary("FLOOR")
ceil = _unary("CEIL")
trunc = _unary("TRUNC")
round = _unary("ROUND")  # noqa: A001 - numpy's and torch's name; half to even
sign = _unary("SIGN")


def add(a, b): return elemwise("ADD", a, b)
def subtract(a, b): return elemwise("SUB", a, b)
def multiply(a, b): return elemwise("MUL", a, b)
def divide(a, b): return elemwise("TRUE_DIV", a, b)
def floor_divide(a, b): return elemwise("FLOOR_DIV", a, b)
def maximum(a, b): return elemwise("MAX", a, b)
def minimum(a, b): return elemwise("MIN", a, b)
def less(a, b): return elemwise("LT", a, b)
def less_equal(a, b): return elemwise("LEQ", a, b)
def equal(a, b): return elemwise("EQ", a, b)


_ROUNDING_MODES = (None, "trunc", "floor")


@reports_user_line
def div(a: Any, b: Any, rounding_mode: str | None = None) -> Tensor:
    """torch.div: `a / b`, then rounded toward zero ("trunc": trunc(a / b)) or down ("floor":
    numpy's and Python's floor division, exact where a / b rounds up to an integer)."""
    if rounding_mode not in _ROUNDING_MODES:
        raise BuildError(f"rounding_mode={rounding_mode!r}; expected one of {_ROUNDING_MODES}",
                         op="div")
    if rounding_mode == "floor":
        return floor_divide(a, b)
    quotient = divide(a, b)
    return quotient if rounding_mode is None else trunc(quotient)


def power(a: Any, b: Any) -> Tensor:
    """`a ** b`; small integer exponents become products (exact and fast)."""
    if isinstance(a, Tensor) and isinstance(b, (int, float)) and not isinstance(b, bool):
        if b == 1:
            return a
        if b == 2:
            return a * a
        if b == 3:
            return a * a * a
        if b == 0.5:
            return sqrt(a)
    return elemwise("POW", a, b)


def where(mask: Tensor, x: Any, y: Any) -> Tensor:
    """`mask ? x : y` elementwise, with broadcasting; scalars take the other branch's dtype."""
    like = next((v for v in (x, y) if isinstance(v, Tensor)), None)
    if not isinstance(mask, Tensor) or like is None:
        raise TypeError("where: mask must be a bool Tensor and x or y a Tensor")
    _, x_t, y_t = to_operands([like, x, y])
    return apply(Where(), mask, x_t, y_t)


@reports_user_line
def cast(x: Tensor, dtype: Any) -> Tensor:
    dtype = checked_dtype("Cast", dtype)
    return x if x.dtype == dtype else apply(Cast(dtype), x)


def stop_gradient(x: Tensor) -> Tensor:
    """`x` itself, but no gradient flows through it."""
    return apply(StopGradient(), x)


def _axes(op_mode: str, x: Tensor, axis) -> tuple[int, ...] | None:
    if axis is None:
        return None
    if isinstance(axis, (int, np.integer)) and not isinstance(axis, (bool, np.bool_)):
        axes = (axis,)
    elif isinstance(axis, (tuple, list)) and all(
            isinstance(a, (int, np.integer)) and not isinstance(a, (bool, np.bool_)) for a in axis):
        axes = tuple(axis)
    else:
        raise ShapeError(f"axis must be an int, a tuple of ints or None, got {axis!r}",
                         op=Reduce(op_mode).label)
    return tuple(sorted(normalize_axes(Reduce(op_mode), axes, x.ndim)))


@reports_user_line
def reduce(mode: str, x: Tensor, axis=None, keepdims: bool = False) -> Tensor:
    if axis is None and keepdims:
        axis = tuple(range(x.ndim))  # numpy keeps every reduced dim as size 1
    axes = _axes(mode, x, axis)
    if axes is not None and len(axes) == x.ndim and not keepdims:
        axes = None
    return apply(Reduce(mode, axes, bool(keepdims) and axes is not None), x)


def sum(x, axis=None, keepdims=False): return reduce("SUM", x, axis, keepdims)  # noqa: A001
def mean(x, axis=None, keepdims=False): return reduce("MEAN", x, axis, keepdims)
def max(x, axis=None, keepdims=False): return reduce("MAX", x, axis, keepdims)  # noqa: A001
def min(x, axis=None, keepdims=False): return reduce("MIN", x, axis, keepdims)  # noqa: A001
def prod(x, axis=None, keepdims=False): return reduce("PRODUCT", x, axis, keepdims)
def sum_sqr(x, axis=None, keepdims=False): return reduce("SUM_SQR", x, axis, keepdims)


def reduce_to(x: Tensor, shape) -> Tensor:
    """Sum `x` down to `shape`, undoing broadcasting (op-reference §1.2)."""
    shape = tuple(shape)
    return x if tuple(x.shape) == shape else apply(ReduceTo(shape), x)


def matmul(a: Any, b: Any, transpose_a: bool = False, transpose_b: bool = False) -> Tensor:
    """numpy `matmul` semantics; MatrixMul when B is a matrix, else BatchedMatrixMul."""
    from .shapes import expand_dims, squeeze

    a, b = to_operands([a, b])
    squeeze_axes = []
    if a.ndim == 1:
        a = expand_dims(a, 0)
        squeeze_axes.append(-2)
    if b.ndim == 1:
        b = expand_dims(b, 1)
        squeeze_axes.append(-1)
    if b.ndim <= 2 and (a.ndim <= 2 or not transpose_a):
        out = apply(MatrixMul(transpose_a, transpose_b), a, b)
    else:
        out = apply(BatchedMatrixMul(transpose_a, transpose_b), a, b)
    return squeeze(out, tuple(squeeze_axes)) if squeeze_axes else out
