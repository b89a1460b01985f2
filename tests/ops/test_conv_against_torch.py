"""The convolution family against torch.nn.functional, where torch is installed (`make
bench-peers`): values and the gradients of every input, float64, on shapes that exercise
stride, padding, dilation, groups, depthwise filters, ceil mode and the pad-exclusive mean.
The nested-loop oracles of test_conv_forward.py are the tests that always run; this is the
same semantics checked against the library whose conventions the frontend copies."""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc

from oracle import assert_close

torch = pytest.importorskip("torch", reason="torch.nn.functional is an optional peer (make bench-peers)")
F = torch.nn.functional

RNG = np.random.default_rng(31)

CASES = {
    "conv_stride_pad": (lambda x, w: gc.conv2d(x, w, stride=2, padding=1),
                        lambda x, w: F.conv2d(x, w, stride=2, padding=1), (2, 4, 7, 6), (6, 4, 3, 3)),
    "conv_dilated_groups": (lambda x, w: gc.conv2d(x, w, padding=(1, 2), dilation=2, groups=2),
                            lambda x, w: F.conv2d(x, w, padding=(1, 2), dilation=2, groups=2),
                            (1, 4, 8, 9), (6, 2, 3, 2)),
    "conv_depthwise": (lambda x, w: gc.conv2d(x, w, padding=1, groups=3),
                       lambda x, w: F.conv2d(x, w, padding=1, groups=3), (3, 3, 5, 5), (3, 1, 3, 3)),
    "conv_transpose": (lambda x, w: gc.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1,
                                                        groups=2),
                       lambda x, w: F.conv_transpose2d(x, w, stride=2, padding=1, output_padding=1,
                                                       groups=2),
                       (2, 4, 4, 5), (4, 3, 3, 3)),
}
POOLS = {
    "max_ceil": (lambda x: gc.max_pool2d(x, 3, 2, 1, ceil_mode=True),
                 lambda x: F.max_pool2d(x, 3, 2, 1, ceil_mode=True)),
    "avg_exclude_pad": (lambda x: gc.avg_pool2d(x, (2, 3), 2, 1, count_include_pad=False),
                        lambda x: F.avg_pool2d(x, (2, 3), 2, 1, count_include_pad=False)),
    "adaptive": (lambda x: gc.adaptive_avg_pool2d(x, (3, 2)), lambda x: F.adaptive_avg_pool2d(x, (3, 2))),
}


def _ours(build, arrays: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The value and the gradient of <value, r> wrt every input, through the reference."""
    with gc.Graph("against_torch"):
        inputs = [gc.param(name, a.shape, "float64") for name, a in arrays.items()]
        out = build(*inputs)
        r = gc.constant(RNG.standard_normal(out.shape), "float64")
        grads = gc.grad((out * r).sum(), inputs)
    values = gc.evaluate([out, r, *grads], arrays)
    return values


def _theirs(build, arrays: dict[str, np.ndarray], r: np.ndarray) -> list[np.ndarray]:
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays.values()]
    out = build(*tensors)
    (out * torch.tensor(r)).sum().backward()
    return [out.detach().numpy(), *(t.grad.numpy() for t in tensors)]


@pytest.mark.parametrize("case", sorted(CASES))
def test_convolutions_match_torch(case):
    ours, theirs, x_shape, w_shape = CASES[case]
    arrays = {"x": RNG.standard_normal(x_shape), "w": RNG.standard_normal(w_shape)}
    out, r, *grads = _ours(ours, arrays)
    want = _theirs(theirs, arrays, r)
    for got, expected in zip([out, *grads], want):
        assert_close(got, expected, rtol=1e-12)


@pytest.mark.parametrize("case", sorted(POOLS))
def test_pooling_matches_torch(case):
    ours, theirs = POOLS[case]
    arrays = {"x": RNG.standard_normal((2, 3, 7, 8))}
    out, r, grad = _ours(ours, arrays)
    want_out, want_grad = _theirs(theirs, arrays, r)
    assert_close(out, want_out, rtol=1e-12)
    assert_close(grad, want_grad, rtol=1e-12)


def test_batch_norm_in_training_mode_matches_torch_with_running_statistics():
    x = RNG.standard_normal((4, 3, 5, 5))
    gamma, beta = RNG.standard_normal(3), RNG.standard_normal(3)
    mean, var = RNG.standard_normal(3), RNG.uniform(0.5, 2.0, 3)
    with gc.Graph("bn"):
        tx, tg, tb = (gc.param(n, a.shape, "float64") for n, a in (("x", x), ("g", gamma), ("b", beta)))
        rm, rv = gc.constant(mean, "float64"), gc.constant(var, "float64")
        y, new_mean, new_var = gc.batch_norm(tx, tg, tb, rm, rv, training=True, momentum=0.3)
        r = gc.constant(RNG.standard_normal(x.shape), "float64")
        grads = gc.grad((y * r).sum(), [tx, tg, tb])
    got = gc.evaluate([y, new_mean, new_var, r, *grads], {"x": x, "g": gamma, "b": beta})
    torch_mean, torch_var = torch.tensor(mean), torch.tensor(var)
    inputs = [torch.tensor(a, requires_grad=True) for a in (x, gamma, beta)]
    out = F.batch_norm(inputs[0], torch_mean, torch_var, inputs[1], inputs[2], training=True, momentum=0.3)
    (out * torch.tensor(got[3])).sum().backward()
    assert_close(got[0], out.detach().numpy(), rtol=1e-12)
    assert_close(got[1], torch_mean.numpy(), rtol=1e-12)  # torch updates them in place
    assert_close(got[2], torch_var.numpy(), rtol=1e-12)
    for ours, t in zip(got[4:], inputs):
        assert_close(ours, t.grad.numpy(), rtol=1e-10)
