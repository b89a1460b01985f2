"""Convolution and pooling rules (docs/op-reference.md §13.4, §14.3).

The three convolution ops are the three faces of one bilinear form
<conv(x, w), dy>, so each op's gradient wrt one input is another face,
applied to the incoming gradient h and the op's other input:

    Convolution(x, w)            dx = BackwardData(w, h)      dw = BackwardFilter(x, h)
    BackwardData(w, dy)          dw = BackwardFilter(h, dy)   d dy = Convolution(h, w)
    BackwardFilter(x, dy)        dx = BackwardData(h, dy)     d dy = Convolution(x, h)

Each gradient is built only for an input that needs one, so it captures
only the other input of its own formula (a gradient wrt the filter alone
never reads w).

Pooling: AVERAGE is linear; its backward spreads h over the windows and
the backward's gradient pools h again. MAX routes h to each window's first
maximum (PoolingBackward(x, h)); the argmax is piecewise constant in x, so
x gets no gradient from a MAX backward or from the `values` form of MAX
Pooling, and the gradient wrt the routed input is the `values` form:
Pooling(x, h) reads h at x's maxima.
"""

from __future__ import annotations

from ..frontend.tensor import apply
from ..ops.conv import Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter
from ..ops.pool import Pooling, PoolingBackward
from .registry import grad_rule


def _conv_params(op) -> dict:
    return {"stride": op.stride, "padding": op.padding, "dilation": op.dilation,
            "groups": op.groups}


def _backward_data(node, w, dy, image):
    return apply(ConvolutionBackwardData(**_conv_params(node.op), image=tuple(image)), w, dy)


def _backward_filter(node, x, dy, kernel):
    return apply(ConvolutionBackwardFilter(**_conv_params(node.op), kernel=tuple(kernel)), x, dy)


@grad_rule(Convolution)
def convolution_rule(node, h, needs_grad):
    x, w = node.inputs
    x_type, w_type = node.input_types
    dx = _backward_data(node, w, h, x_type.shape[2:]) if needs_grad[0] else None
    dw = _backward_filter(node, x, h, w_type.shape[2:]) if needs_grad[1] else None
    return [dx, dw]


@grad_rule(ConvolutionBackwardData)
def convolution_backward_data_rule(node, h, needs_grad):
    w, dy = node.inputs
    dw = _backward_filter(node, h, dy, node.input_types[0].shape[2:]) if needs_grad[0] else None
    ddy = apply(Convolution(**_conv_params(node.op)), h, w) if needs_grad[1] else None
    return [dw, ddy]


@grad_rule(ConvolutionBackwardFilter)
def convolution_backward_filter_rule(node, h, needs_grad):
    x, dy = node.inputs
    dx = _backward_data(node, h, dy, node.input_types[0].shape[2:]) if needs_grad[0] else None
    ddy = apply(Convolution(**_conv_params(node.op)), x, h) if needs_grad[1] else None
    return [dx, ddy]


def _pool_params(op) -> dict:
    return {"mode": op.mode, "kernel": op.kernel, "stride": op.stride, "padding": op.padding,
            "ceil_mode": op.ceil_mode}


@grad_rule(Pooling)
def pooling_rule(node, h, needs_grad):
    x = node.inputs[0]
    backward = PoolingBackward(**_pool_params(node.op), image=node.input_types[0].shape[2:])
    if node.op.mode != "MAX":
        return [apply(backward, h) if needs_grad[0] else None]
    routed = apply(backward, x, h) if needs_grad[-1] else None
    return [routed] if len(node.inputs) == 1 else [None, routed]


@grad_rule(PoolingBackward)
def pooling_backward_rule(node, h, needs_grad):
    pool = Pooling(**_pool_params(node.op))
    if node.op.mode != "MAX":
        return [apply(pool, h) if needs_grad[0] else None]
    return [None, apply(pool, node.inputs[0], h) if needs_grad[1] else None]
