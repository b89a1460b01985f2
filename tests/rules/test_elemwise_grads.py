"""Gradients of every differentiable (Elemwise mode, input) pair, Where and
Cast, against float64 finite differences (`gc.check_grads`), first order
with broadcasting variants and second order for a representative set that
includes the gradient-helper modes (op-reference §2.3, §2.4, §11).

Data stays away from kinks: no ties for MAX/MIN/COND_*, no zeros for
ABS/RELU/SWITCH_GT0, positive inputs for LOG/SQRT/RSQRT/POW's base.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import NotDifferentiableError
from gradcompiler.ops.elemwise import MODES

from helpers import assert_grads

# mode -> (domain of each input, indices of the inputs that get a gradient)
GRAD_CASES = {
    "ADD": (("any", "any"), (0, 1)),
    "SUB": (("any", "any"), (0, 1)),
    "MUL": (("any", "any"), (0, 1)),
    "TRUE_DIV": (("any", "pos"), (0, 1)),
    "NEGATE": (("any",), (0,)),
    "POW": (("pos", "any"), (0, 1)),
    "MAX": (("low", "high"), (0, 1)),
    "MIN": (("low", "high"), (0, 1)),
    "ABS": (("away0",), (0,)),
    "FUSE_MUL_ADD3": (("any", "any", "any"), (0, 1, 2)),
    "EXP": (("any",), (0,)),
    "LOG": (("pos",), (0,)),
    "LOG1P": (("gt-1",), (0,)),
    "EXPM1": (("any",), (0,)),
    "SQRT": (("pos",), (0,)),
    "RSQRT": (("pos",), (0,)),
    "SIN": (("any",), (0,)),
    "COS": (("any",), (0,)),
    "TANH": (("any",), (0,)),
    "SIGMOID": (("any",), (0,)),
    "ERF": (("any",), (0,)),
    "GELU": (("any",), (0,)),
    "SOFTPLUS": (("any",), (0,)),
    "RELU": (("away0",), (0,)),
    "SWITCH_GT0": (("away0", "any"), (1,)),
    "COND_LEQ_MOV": (("low", "high", "any"), (2,)),
    "COND_LT_MOV": (("low", "high", "any"), (2,)),
    "ABS_GRAD": (("away0", "any"), (1,)),
    "SIGMOID_GRAD": (("any", "any"), (0, 1)),
    "TANH_GRAD": (("any", "any"), (0, 1)),
    "GELU_GRAD": (("any", "any"), (0, 1)),
    "SOFTPLUS_GRAD": (("any", "any"), (0, 1)),
}
NO_GRAD_MODES = {"LT", "LEQ", "EQ"}
ZERO_GRAD_MODES = {"FLOOR", "CEIL", "TRUNC", "ROUND", "SIGN", "FLOOR_DIV"}
SHAPES = {
    1: [((2, 3),), ((),)],
    2: [((2, 3), (2, 3)), ((3, 1, 4), (5, 4)), ((5, 4), (3, 1, 4)), ((), (2, 3)), ((2, 3), ())],
    3: [((2, 3), (2, 3), (2, 3)), ((3, 1, 4), (5, 4), (4,)), ((4,), (3, 1, 4), (5, 1))],
}


@pytest.fixture
def graph():
    with gc.Graph("elemwise_grads") as g:
        yield g
    gc.verify(g)


def _data(rng, domain: str, shape) -> np.ndarray:
    if domain == "pos":
        values = rng.uniform(0.5, 2.0, shape)
    elif domain == "gt-1":
        values = rng.uniform(-0.5, 2.0, shape)
    elif domain == "away0":
        values = rng.uniform(0.2, 1.5, shape) * rng.choice([-1.0, 1.0], shape)
    elif domain == "small":  # a small grid, so comparisons see ties
        values = rng.integers(-2, 3, shape) / 2.0
    elif domain in ("low", "high"):  # low and high values never come within 0.5 of each other
        values = rng.integers(-3, 3, shape) + (0.25 if domain == "low" else 0.75)
    else:
        values = rng.standard_normal(shape)
    return np.asarray(values, dtype=np.float32)


def _inputs(rng, domains, shapes):
    feeds = {f"x{i}": _data(rng, d, s) for i, (d, s) in enumerate(zip(domains, shapes))}
    tensors = [gc.input(name, v.shape, "float32") for name, v in feeds.items()]
    return tensors, feeds


def test_every_mode_is_classified():
    assert set(GRAD_CASES) | NO_GRAD_MODES | ZERO_GRAD_MODES == set(MODES)


@pytest.mark.parametrize("mode", sorted(ZERO_GRAD_MODES))
def test_rounding_modes_have_zero_gradients_as_in_torch(mode, graph, rng):
    """torch: floor(x).sum().backward() gives zeros, not an error; so does gc.grad, compiled
    too, and a gradient that also flows through another path is that path's alone."""
    arity = MODES[mode].arity
    tensors, feeds = _inputs(rng, ("any", "away0")[:arity], [(2, 3), (3,)][:arity])
    out = gc.elemwise(mode, *tensors)
    grads = gc.grad(out.sum(), tensors)
    mixed = gc.grad((out * tensors[0]).sum(), tensors[0])
    want_mixed = gc.evaluate(out, feeds)
    for got in (gc.evaluate(grads + [mixed], feeds), gc.compile(grads + [mixed])(**feeds)):
        for g, t in zip(got, tensors):
            assert g.shape == t.shape and g.dtype == t.dtype
            np.testing.assert_array_equal(g, np.zeros(t.shape, np.float32))
        np.testing.assert_array_equal(got[-1], want_mixed)


FIRST_ORDER = [(mode, shapes) for mode in sorted(GRAD_CASES) for shapes in SHAPES[len(GRAD_CASES[mode][0])]]


@pytest.mark.parametrize("mode, shapes", FIRST_ORDER, ids=[f"{m}-{s}" for m, s in FIRST_ORDER])
def test_first_order(mode, shapes, graph, rng):
    domains, differentiable = GRAD_CASES[mode]
    tensors, feeds = _inputs(rng, domains, shapes)
    out = gc.elemwise(mode, *tensors)
    assert_grads(out, [tensors[i] for i in differentiable], feeds)


@pytest.mark.parametrize("mode", sorted(m for m, (_, d) in GRAD_CASES.items() if len(d) < len(GRAD_CASES[m][0])))
def test_non_differentiable_inputs_get_no_gradient(mode, graph, rng):
    domains, differentiable = GRAD_CASES[mode]
    tensors, feeds = _inputs(rng, domains, [(2, 3)] * len(domains))
    loss = gc.elemwise(mode, *tensors).sum()
    for i, t in enumerate(tensors):
        if i in differentiable:
            continue
        with pytest.raises(NotDifferentiableError, match="does not reach"):
            gc.grad(loss, t)
        zero = gc.grad(loss, t, disconnected="zero")
        np.testing.assert_array_equal(gc.evaluate(zero, feeds), np.zeros((2, 3), np.float32))


@pytest.mark.parametrize("mode", sorted(NO_GRAD_MODES))
def test_comparisons_pass_no_gradient(mode, graph, rng):
    (a, b), feeds = _inputs(rng, ("small", "small"), [(2, 3), (2, 3)])
    flags = gc.elemwise(mode, a, b)
    loss = (flags.astype("float32") * a).sum()
    # only the product's direct path reaches a; the comparison contributes nothing
    da = gc.grad(loss, a)
    got_da, got_flags = gc.evaluate([da, flags], feeds)
    np.testing.assert_array_equal(got_da, got_flags.astype(np.float32))
    with pytest.raises(NotDifferentiableError, match="does not reach"):
        gc.grad(loss, b)


SECOND_ORDER_DIRECT = ["MUL", "TRUE_DIV", "POW", "EXP", "LOG", "LOG1P", "EXPM1", "SQRT", "RSQRT", "SIN",
                       "COS", "TANH", "SIGMOID", "ERF", "GELU", "SOFTPLUS", "SIGMOID_GRAD", "TANH_GRAD",
                       "GELU_GRAD", "SOFTPLUS_GRAD"]


@pytest.mark.parametrize("mode", SECOND_ORDER_DIRECT)
def test_second_order(mode, graph, rng):
    domains, differentiable = GRAD_CASES[mode]
    tensors, feeds = _inputs(rng, domains, SHAPES[len(domains)][1 if len(domains) > 1 else 0])
    gc.check_grads(gc.elemwise(mode, *tensors), [tensors[i] for i in differentiable], feeds, order=2)


def test_second_order_fuse_mul_add3(graph, rng):
    (a, b, c), feeds = _inputs(rng, ("any",) * 3, SHAPES[3][1])
    gc.check_grads(gc.elemwise("FUSE_MUL_ADD3", a, b, c) * c, [a, b, c], feeds, order=2)


# Piecewise-linear modes have no curvature of their own: multiplying by an input
# makes the second derivative non-zero and sends it through their helper modes
# (SWITCH_GT0, ABS_GRAD, COND_LEQ_MOV, COND_LT_MOV) a second time.
SECOND_ORDER_COMPOSITES = {  # name -> (input domains, build, inputs that get a gradient)
    "relu": (("away0",), lambda x: gc.relu(x) * x, (0,)),
    "abs": (("away0",), lambda x: abs(x) * x, (0,)),
    "max": (("low", "high"), lambda a, b: gc.maximum(a, b) * a * b, (0, 1)),
    "min": (("low", "high"), lambda a, b: gc.minimum(a, b) * a * b, (0, 1)),
    "add_sub_negate": (("any", "any"), lambda a, b: (a + b) * (a - b) * -b, (0, 1)),
    "switch_gt0": (("away0", "any"), lambda a, b: gc.elemwise("SWITCH_GT0", a, b * b), (1,)),
    "abs_grad": (("away0", "any"), lambda a, b: gc.elemwise("ABS_GRAD", a, b * b), (1,)),
    "cond_leq_mov": (("low", "high", "any"),
                     lambda a, b, c: gc.elemwise("COND_LEQ_MOV", a, b, c * c), (2,)),
    "cond_lt_mov": (("low", "high", "any"),
                    lambda a, b, c: gc.elemwise("COND_LT_MOV", a, b, c * c), (2,)),
}


@pytest.mark.parametrize("name", sorted(SECOND_ORDER_COMPOSITES))
def test_second_order_through_helper_modes(name, graph, rng):
    domains, build, differentiable = SECOND_ORDER_COMPOSITES[name]
    tensors, feeds = _inputs(rng, domains, [(3, 1, 4), (5, 4), (4,)][:len(domains)])
    out = build(*tensors)
    wrt = [tensors[i] for i in differentiable]
    assert_grads(out, wrt, feeds)
    gc.check_grads(out, wrt, feeds, order=2)


def test_same_input_in_both_slots(graph, rng):
    (x,), feeds = _inputs(rng, ("pos",), [(2, 3)])
    outs = [x * x, x / x, gc.power(x, x), gc.maximum(x, x + 1.0)]
    for out in outs:
        assert_grads(out, [x], feeds)
    np.testing.assert_allclose(gc.evaluate(gc.grad((x * x).sum(), x), feeds), 2 * feeds["x0"], rtol=1e-6)


# -- Where ----------------------------------------------------------------------------

@pytest.mark.parametrize("shapes", [((3, 4), (3, 4), (3, 4)), ((3, 1), (4,), (3, 4)), ((4,), (2, 1, 4), ())],
                         ids=str)
def test_where(shapes, graph, rng):
    mask_shape, x_shape, y_shape = shapes
    mv = rng.standard_normal(mask_shape) > 0
    m = gc.input("m", mask_shape, "bool")
    (x, y), feeds = _inputs(rng, ("any", "any"), [x_shape, y_shape])
    feeds["m"] = mv
    out = gc.where(m, x, y)
    assert_grads(out, [x, y], feeds)
    gc.check_grads(gc.where(m, x * x, y * x), [x, y], feeds, order=2)


def test_where_gradient_is_the_masked_cotangent(graph, rng):
    mv = np.array([[True], [False], [True]])
    m = gc.input("m", (3, 1), "bool")
    x = gc.input("x", (4,), "float64")
    y = gc.input("y", (3, 4), "float64")
    u = gc.input("u", (3, 4), "float64")
    dx, dy = gc.vjp(gc.where(m, x, y), [x, y], u)
    uv = rng.standard_normal((3, 4))
    got_dx, got_dy = gc.evaluate([dx, dy], m=mv, u=uv)
    np.testing.assert_allclose(got_dx, (uv * mv).sum(0))
    np.testing.assert_allclose(got_dy, uv * ~mv)


def test_where_with_scalar_branch(graph, rng):
    m = gc.input("m", (2, 3), "bool")
    (x,), feeds = _inputs(rng, ("any",), [(2, 3)])
    feeds["m"] = rng.standard_normal((2, 3)) > 0
    assert_grads(gc.where(m, x, 0.0), [x], feeds)
    assert_grads(gc.where(m, 1.0, x), [x], feeds)


# -- Cast ----------------------------------------------------------------------------

def test_cast_round_trip(graph, rng):
    x = gc.input("x", (2, 3), "float64")
    y = gc.tanh(x.astype("float32")).astype("float64") * x
    feeds = {"x": rng.standard_normal((2, 3))}
    gc.check_grads(y, [x], feeds)
    gc.check_grads(y, [x], feeds, order=2)
    dx = gc.grad(y.sum(), x)
    assert dx.dtype == np.float64
    value = gc.evaluate(dx, feeds)
    xv = feeds["x"]
    t = np.tanh(xv)
    np.testing.assert_allclose(value, (1 - t * t) * xv + t, rtol=1e-6)  # float32 inside


def test_cast_through_int_passes_no_gradient(graph, rng):
    x = gc.input("x", (3,))
    y = x.astype("int32").astype("float32")
    with pytest.raises(NotDifferentiableError):
        gc.grad(y.sum(), x)


def test_stop_gradient_blocks(graph, rng):
    x = gc.input("x", (3,), "float64")
    y = gc.stop_gradient(x) * x
    dx = gc.grad(y.sum(), x)
    xv = rng.standard_normal(3)
    np.testing.assert_allclose(gc.evaluate(dx, x=xv), xv)
