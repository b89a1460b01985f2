"""Elemwise rules: the seed's ADD rule, which declines every other mode, and
the generic rule of op-reference §2.3 for all modes; Where, Cast, and the
non-differentiable sources.

The generic rule computes each needed input's partial at the output shape
and reduces it to the input's shape. `_PARTIALS[mode][k](x, y, g)` is the
partial for input k: `x` holds the forward input handles and `y` the output
handle, so a partial captures exactly the forward values its formula names
(EXP, RELU, SIGMOID, TANH and RSQRT read `y`). Entries listed in
`_NEGATE_AFTER` return the positive term; it is reduced first and negated
after (same value, less work on the small side).
"""

from __future__ import annotations

import math

from ..frontend.math import cos, elemwise, exp, log, reduce_to, sigmoid, sin, sqrt, where
from ..frontend.sources import zeros
from ..frontend.tensor import apply
from ..ops.elemwise import Cast, Elemwise, StopGradient, Where
from ..ops.source import Constant, Fill, Placeholder
from .registry import grad_rule, non_differentiable

non_differentiable(Placeholder, Constant, Fill, StopGradient)

_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


def _normal_pdf(a):
    return exp(a * a * -0.5) * _INV_SQRT_2PI


def _zero_partial(x, y, g):
    """Zeros of the output's shape (reduced to the input's by the caller)."""
    return zeros(g.shape, g.dtype)


_PARTIALS = {
    "ADD": (lambda x, y, g: g, lambda x, y, g: g),
    "SUB": (lambda x, y, g: g, lambda x, y, g: g),
    "MUL": (lambda x, y, g: g * x[1], lambda x, y, g: g * x[0]),
    "TRUE_DIV": (lambda x, y, g: g / x[1], lambda x, y, g: (g * x[0]) / (x[1] * x[1])),
    "NEGATE": (lambda x, y, g: -g,),
    "EXP": (lambda x, y, g: g * y,),
    "LOG": (lambda x, y, g: g / x[0],),
    "LOG1P": (lambda x, y, g: g / (x[0] + 1),),
    "EXPM1": (lambda x, y, g: g * exp(x[0]),),
    "RELU": (lambda x, y, g: elemwise("SWITCH_GT0", y, g),),
    "SIGMOID": (lambda x, y, g: elemwise("SIGMOID_GRAD", y, g),),
    "TANH": (lambda x, y, g: elemwise("TANH_GRAD", y, g),),
    "POW": (
        lambda x, y, g: g * x[1] * elemwise("POW", x[0], x[1] - 1),
        lambda x, y, g: y * log(x[0]) * g,
    ),
    "MAX": (
        lambda x, y, g: elemwise("COND_LEQ_MOV", x[1], x[0], g),
        lambda x, y, g: elemwise("COND_LT_MOV", x[0], x[1], g),
    ),
    "MIN": (
        lambda x, y, g: elemwise("COND_LEQ_MOV", x[0], x[1], g),
        lambda x, y, g: elemwise("COND_LT_MOV", x[1], x[0], g),
    ),
    "ABS": (lambda x, y, g: elemwise("ABS_GRAD", x[0], g),),
    "SQRT": (lambda x, y, g: g / sqrt(x[0]) * 0.5,),
    "RSQRT": (lambda x, y, g: g * (y * y * y) * -0.5,),
    "SIN": (lambda x, y, g: cos(x[0]) * g,),
    "COS": (lambda x, y, g: sin(x[0]) * g,),
    "ERF": (lambda x, y, g: g * exp(-(x[0] * x[0])) * _TWO_OVER_SQRT_PI,),
    "GELU": (lambda x, y, g: elemwise("GELU_GRAD", x[0], g),),
    "SOFTPLUS": (lambda x, y, g: elemwise("SOFTPLUS_GRAD", x[0], g),),
    "SWITCH_GT0": (None, lambda x, y, g: elemwise("SWITCH_GT0", x[0], g)),
    "FUSE_MUL_ADD3": (lambda x, y, g: g * x[1], lambda x, y, g: g * x[0], lambda x, y, g: g),
    # piecewise constant: a zero gradient, as torch gives (at the jumps too), not a disconnection
    "FLOOR": (_zero_partial,),
    "CEIL": (_zero_partial,),
    "TRUNC": (_zero_partial,),
    "ROUND": (_zero_partial,),
    "SIGN": (_zero_partial,),
    "FLOOR_DIV": (_zero_partial, _zero_partial),
    "LT": (None, None),
    "LEQ": (None, None),
    "EQ": (None, None),
    "COND_LEQ_MOV": (None, None, lambda x, y, g: elemwise("COND_LEQ_MOV", x[0], x[1], g)),
    "COND_LT_MOV": (None, None, lambda x, y, g: elemwise("COND_LT_MOV", x[0], x[1], g)),
    # gradient helpers, differentiated again for second order (op-reference §2.4)
    "ABS_GRAD": (None, lambda x, y, g: elemwise("ABS_GRAD", x[0], g)),
    "SIGMOID_GRAD": (
        lambda x, y, g: (1 - 2 * x[0]) * x[1] * g,
        lambda x, y, g: elemwise("SIGMOID_GRAD", x[0], g),
    ),
    "TANH_GRAD": (
        lambda x, y, g: x[0] * x[1] * g * -2,
        lambda x, y, g: elemwise("TANH_GRAD", x[0], g),
    ),
    "GELU_GRAD": (
        lambda x, y, g: x[1] * g * _normal_pdf(x[0]) * (2 - x[0] * x[0]),
        lambda x, y, g: elemwise("GELU_GRAD", x[0], g),
    ),
    "SOFTPLUS_GRAD": (
        lambda x, y, g: elemwise("SIGMOID_GRAD", sigmoid(x[0]), x[1] * g),
        lambda x, y, g: elemwise("SOFTPLUS_GRAD", x[0], g),
    ),
}

_NEGATE_AFTER = {("SUB", 1), ("TRUE_DIV", 1), ("COS", 0)}


@grad_rule(Elemwise)
def elemwise_add(node, g, needs_grad):
    """The seed's rule: ADD only, via reduce_to; every other mode declines."""
    if node.op.mode != "ADD":
        return None
    return [reduce_to(g, t.shape) if needed else None for needed, t in zip(needs_grad, node.input_types)]


@grad_rule(Elemwise, generic=True)
def elemwise_generic(node, g, needs_grad):
    mode = node.op.mode
    x, y = node.inputs, node.output
    grads = []
    for k, (needed, partial, t) in enumerate(zip(needs_grad, _PARTIALS[mode], node.input_types)):
        if not needed or partial is None:
            grads.append(None)
            continue
        grad = reduce_to(partial(x, y, g), t.shape)
        grads.append(-grad if (mode, k) in _NEGATE_AFTER else grad)
    return grads


@grad_rule(Where)
def where_rule(node, g, needs_grad):
    """dx = mask ? g : 0, dy = mask ? 0 : g; reads the mask only (op-reference §11)."""
    mask = node.inputs[0]
    _, x_type, y_type = node.input_types
    return [
        None,
        reduce_to(where(mask, g, 0), x_type.shape) if needs_grad[1] else None,
        reduce_to(where(mask, 0, g), y_type.shape) if needs_grad[2] else None,
    ]


@grad_rule(Cast)
def cast_rule(node, g, needs_grad):
    source = node.input_types[0]
    if not needs_grad[0] or source.dtype.kind != "f":
        return [None]
    return [apply(Cast(source.dtype), g)]
