"""Gradients of convolution, pooling and batch norm against float64 finite differences
(`gc.check_grads`, first and second order), and what their rules build and capture.

MAX pooling is piecewise linear: its inputs here are distinct values spaced far
wider than the finite-difference step, so no window changes its maximum.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.kernel import KernelStep
from gradcompiler.ops.conv import (
    Convolution,
    ConvolutionBackwardData,
    ConvolutionBackwardFilter,
)
from gradcompiler.ops.pool import Pooling, PoolingBackward

from helpers import assert_grads, backward_nodes_of, captured_values

F64 = "float64"
ORDERS = (1, 2)

CONV_CASES = {  # x shape, w shape, stride, padding, dilation, groups
    "stride2_pad1": ((2, 2, 5, 6), (3, 2, 3, 3), (2, 2), (1, 1), (1, 1), 1),
    "dilation2": ((1, 2, 6, 5), (2, 2, 2, 3), (1, 1), (1, 2), (2, 2), 1),
    "groups2": ((2, 4, 4, 4), (4, 2, 3, 2), (1, 2), (1, 0), (1, 1), 2),
    "depthwise": ((1, 3, 4, 5), (3, 1, 3, 3), (1, 1), (1, 1), (1, 1), 3),
    "pointwise": ((3, 3, 3, 2), (2, 3, 1, 1), (1, 1), (0, 0), (1, 1), 1),
}


def spaced(rng, shape):
    """Distinct values 0.1 apart in random order: MAX pooling's ties and switches stay away."""
    return rng.permutation(np.arange(np.prod(shape)) * 0.1 - 1.0).reshape(shape)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv2d_gradients_wrt_x_w_and_bias(case, order, rng):
    x_shape, w_shape, stride, padding, dilation, groups = CONV_CASES[case]
    with gc.Graph("conv_grad"):
        x, w = gc.param("x", x_shape, F64), gc.param("w", w_shape, F64)
        b = gc.param("b", (w_shape[0],), F64)
        y = gc.conv2d(x, w, b, stride, padding, dilation, groups)
        feeds = {"x": rng.standard_normal(x_shape), "w": rng.standard_normal(w_shape),
                 "b": rng.standard_normal(w_shape[0])}
        # y * y: second order then reaches the backward ops' own rules in every input
        assert_grads(y * y, [x, w, b], feeds, order=order)


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("case", ["stride2_pad1", "groups2"])
def test_backward_op_gradients_wrt_both_inputs(case, order, rng):
    x_shape, w_shape, stride, padding, dilation, groups = CONV_CASES[case]
    params = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    y_shape = Convolution(**params).infer(gc.TensorType(x_shape, F64),
                                          gc.TensorType(w_shape, F64)).shape
    with gc.Graph("conv_backward_grads"):
        x, w = gc.param("x", x_shape, F64), gc.param("w", w_shape, F64)
        dy = gc.param("dy", y_shape, F64)
        data = gc.apply(ConvolutionBackwardData(**params, image=x_shape[2:]), w, dy)
        filt = gc.apply(ConvolutionBackwardFilter(**params, kernel=w_shape[2:]), x, dy)
        feeds = {"x": rng.standard_normal(x_shape), "w": rng.standard_normal(w_shape),
                 "dy": rng.standard_normal(y_shape)}
        assert_grads(data * data, [w, dy], feeds, order=order)
        assert_grads(filt * filt, [x, dy], feeds, order=order)


@pytest.mark.parametrize("order", ORDERS)
def test_conv_transpose2d_gradients(order, rng):
    with gc.Graph("conv_transpose_grad"):
        x, w = gc.param("x", (2, 4, 3, 3), F64), gc.param("w", (4, 3, 2, 3), F64)
        y = gc.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1, groups=2)
        feeds = {"x": rng.standard_normal((2, 4, 3, 3)), "w": rng.standard_normal((4, 3, 2, 3))}
        assert_grads(y * y, [x, w], feeds, order=order)


POOL_CASES = {  # kernel, stride, padding, ceil_mode
    "3x3_s2_p1": ((3, 3), (2, 2), (1, 1), False),
    "overlap_ceil": ((2, 3), (1, 2), (1, 1), True),
}


@pytest.mark.parametrize("order", ORDERS)
@pytest.mark.parametrize("mode", ["MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"])
@pytest.mark.parametrize("case", list(POOL_CASES))
def test_pooling_and_pooling_backward_gradients(case, mode, order, rng):
    kernel, stride, padding, ceil_mode = POOL_CASES[case]
    shape = (2, 2, 5, 6)
    op = Pooling(mode, kernel, stride, padding, ceil_mode)
    out_shape = op.infer(gc.TensorType(shape, F64)).shape
    with gc.Graph("pool_grad"):
        x, dy = gc.param("x", shape, F64), gc.param("dy", out_shape, F64)
        feeds = {"x": spaced(rng, shape), "dy": rng.standard_normal(out_shape)}
        y = gc.apply(op, x)
        assert_grads(y * y, [x], feeds, order=order)
        backward = PoolingBackward(mode, kernel, stride, padding, ceil_mode, shape[2:])
        dx = gc.apply(backward, x, dy) if mode == "MAX" else gc.apply(backward, dy)
        assert_grads(dx * dx, [dy], feeds, order=order)


@pytest.mark.parametrize("order", ORDERS)
def test_max_pooling_with_values_routes_to_the_values(order, rng):
    with gc.Graph("pool_values_grad"):
        x, v = gc.param("x", (1, 2, 4, 4), F64), gc.param("v", (1, 2, 4, 4), F64)
        y = gc.apply(Pooling("MAX", (2, 2), (1, 1)), x, v)
        feeds = {"x": spaced(rng, (1, 2, 4, 4)), "v": rng.standard_normal((1, 2, 4, 4))}
        assert_grads(y * y, [v], feeds, order=order)
        with pytest.raises(gc.NotDifferentiableError, match="does not reach"):
            gc.grad(y.sum(), [x])  # the argmax is piecewise constant in x: no gradient flows


@pytest.mark.parametrize("order", ORDERS)
def test_batch_norm_gradients(order, rng):
    with gc.Graph("bn_grad"):
        x = gc.param("x", (3, 2, 2, 3), F64)
        gamma, beta = gc.param("gamma", (2,), F64), gc.param("beta", (2,), F64)
        y = gc.batch_norm(x, gamma, beta)
        feeds = {"x": rng.standard_normal((3, 2, 2, 3)), "gamma": rng.standard_normal(2),
                 "beta": rng.standard_normal(2)}
        assert_grads(y * y, [x, gamma, beta], feeds, order=order)


def _batch_norm_by_its_statistics(x, gamma, beta, eps=1e-5):
    """batch_norm written out, so that autodiff goes through its mean and variance."""
    axes = (0,) + tuple(range(2, x.ndim))
    channel = (1, x.shape[1]) + (1,) * (x.ndim - 2)
    centred = x - gc.mean(x, axes, keepdims=True)
    normalised = centred * gc.rsqrt(gc.mean(centred * centred, axes, keepdims=True) + eps)
    return normalised * gamma.reshape(channel) + beta.reshape(channel)


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5, 6)])
def test_batch_norm_backward_equals_autodiff_in_one_pass_fewer(shape, rng):
    """batch_norm's own backward (an exact custom gradient) gives what autodiff through its
    statistics gives, in two passes over the activations where that takes three."""
    feeds = {"x": rng.standard_normal(shape), "t": rng.standard_normal(shape),
             "gamma": rng.standard_normal(shape[1]), "beta": rng.standard_normal(shape[1])}
    results, passes = [], []
    for norm in (gc.batch_norm, _batch_norm_by_its_statistics):
        with gc.Graph("bn_passes"):
            x, t = gc.param("x", shape, F64), gc.input("t", shape, F64)
            gamma, beta = gc.param("gamma", (shape[1],), F64), gc.param("beta", (shape[1],), F64)
            loss = (gc.relu(norm(x, gamma, beta)) * t).sum()
            step = gc.compile([loss, *gc.grad(loss, [x, gamma, beta])])
        results.append(step(**feeds))
        passes.append(sum(isinstance(s, KernelStep) and s.kernel.size == np.prod(shape)
                          for s in step.program.steps))
    for got, want in zip(*results):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12)
    # forward: the mean, the variance, the loss; backward: 2 (its own) against 3 (autodiff)
    assert passes == [4, 5]


@pytest.mark.parametrize("order", ORDERS)
def test_conv_bn_relu_maxpool_stack(order, rng):
    with gc.Graph("cnn_stack"):
        x, w = gc.param("x", (2, 2, 6, 6), F64), gc.param("w", (3, 2, 3, 3), F64)
        gamma, beta = gc.param("gamma", (3,), F64), gc.param("beta", (3,), F64)
        h = gc.relu(gc.batch_norm(gc.conv2d(x, w, padding=1), gamma, beta))
        y = gc.max_pool2d(h, 2)
        feeds = {"x": rng.standard_normal((2, 2, 6, 6)), "w": rng.standard_normal((3, 2, 3, 3)),
                 "gamma": rng.standard_normal(3), "beta": 0.5 + rng.standard_normal(3)}
        assert_grads(y * y, [x, w, gamma, beta], feeds, order=order)


def test_each_conv_gradient_is_built_only_when_needed():
    with gc.Graph("conv_needs") as g:
        x, w = gc.input("x", (1, 2, 5, 5)), gc.param("w", (3, 2, 3, 3))
        y = gc.conv2d(x, w)
        (dw,) = gc.grad(y.sum(), [w])
    built = [type(g[i].op) for i in backward_nodes_of(g, y.id)]
    assert ConvolutionBackwardFilter in built and ConvolutionBackwardData not in built
    assert w.id not in captured_values(g) and x.id in {i for n in g.nodes.values()
                                                        if n.role == "backward"
                                                        for i in n.inputs}
    assert dw.shape == w.shape
