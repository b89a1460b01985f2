"""Forward values of Elemwise (every mode of op-reference §2.3/§2.4), Where,
Cast and StopGradient, against numpy expressions written here.

Float results are compared with a float64 oracle evaluated on the same
inputs; integer results must match exactly and keep the input dtype.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import BuildError, DTypeError, ShapeError
from gradcompiler.ops.elemwise import MODES

COVERS = {"Elemwise", "Where", "Cast", "StopGradient"}

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _phi(a):
    return 0.5 * (1.0 + _erf(a / math.sqrt(2.0)))


def _pdf(a):
    return np.exp(-0.5 * a * a) / math.sqrt(2.0 * math.pi)


def _sigmoid(a):
    return 1.0 / (1.0 + np.exp(-a))


# mode -> (numpy oracle, domain of each input, accepts integer inputs)
# domains: "any" normal data, "pos" positive, "gt-1" above -1, "small" values from a small
# grid (so comparisons and selects see ties), "quarters" multiples of 1/4 (rounding ties)
CASES = {
    "ADD": (lambda a, b: a + b, ("any", "any"), True),
    "SUB": (lambda a, b: a - b, ("any", "any"), True),
    "MUL": (lambda a, b: a * b, ("any", "any"), True),
    "TRUE_DIV": (lambda a, b: a / b, ("any", "pos"), False),
    "NEGATE": (lambda a: -a, ("any",), True),
    "POW": (lambda a, b: a ** b, ("pos", "any"), False),
    "MAX": (lambda a, b: np.maximum(a, b), ("small", "small"), True),
    "MIN": (lambda a, b: np.minimum(a, b), ("small", "small"), True),
    "ABS": (lambda a: np.abs(a), ("any",), True),
    "FUSE_MUL_ADD3": (lambda a, b, c: a * b + c, ("any", "any", "any"), True),
    "FLOOR": (np.vectorize(math.floor, otypes=[np.float64]), ("quarters",), False),
    "CEIL": (np.vectorize(math.ceil, otypes=[np.float64]), ("quarters",), False),
    "TRUNC": (np.vectorize(math.trunc, otypes=[np.float64]), ("quarters",), False),
    "ROUND": (np.vectorize(round, otypes=[np.float64]), ("quarters",), False),  # half to even
    "SIGN": (lambda a: (a > 0).astype(a.dtype) - (a < 0), ("small",), True),
    "FLOOR_DIV": (np.vectorize(lambda a, b: a // b, otypes=[np.float64]), ("quarters", "pos"),
                  False),
    "EXP": (np.exp, ("any",), False),
    "LOG": (np.log, ("pos",), False),
    "LOG1P": (lambda a: np.log(1.0 + a), ("gt-1",), False),
    "EXPM1": (lambda a: np.exp(a) - 1.0, ("any",), False),
    "SQRT": (np.sqrt, ("pos",), False),
    "RSQRT": (lambda a: 1.0 / np.sqrt(a), ("pos",), False),
    "SIN": (np.sin, ("any",), False),
    "COS": (np.cos, ("any",), False),
    "TANH": (np.tanh, ("any",), False),
    "SIGMOID": (_sigmoid, ("any",), False),
    "ERF": (_erf, ("any",), False),
    "GELU": (lambda a: a * _phi(a), ("any",), False),
    "SOFTPLUS": (lambda a: np.log(1.0 + np.exp(a)), ("any",), False),
    "RELU": (lambda a: np.maximum(a, 0), ("small",), True),
    "LT": (lambda a, b: a < b, ("small", "small"), True),
    "LEQ": (lambda a, b: a <= b, ("small", "small"), True),
    "EQ": (lambda a, b: a == b, ("small", "small"), True),
    "SWITCH_GT0": (lambda a, b: np.where(a > 0, b, 0), ("small", "any"), True),
    "COND_LEQ_MOV": (lambda a, b, c: np.where(a <= b, c, 0), ("small", "small", "any"), True),
    "COND_LT_MOV": (lambda a, b, c: np.where(a < b, c, 0), ("small", "small", "any"), True),
    "ABS_GRAD": (lambda a, b: np.where(a > 0, b, -b), ("small", "any"), False),
    "SIGMOID_GRAD": (lambda a, b: a * (1 - a) * b, ("any", "any"), False),
    "TANH_GRAD": (lambda a, b: (1 - a * a) * b, ("any", "any"), False),
    "GELU_GRAD": (lambda a, b: b * (_phi(a) + a * _pdf(a)), ("any", "any"), False),
    "SOFTPLUS_GRAD": (lambda a, b: b * _sigmoid(a), ("any", "any"), False),
}
BOOLEAN_MODES = {"LT", "LEQ", "EQ"}
INT_MODES = sorted(m for m, (_, _, ints) in CASES.items() if ints)
FLOAT_ONLY_MODES = sorted(m for m, (_, _, ints) in CASES.items() if not ints)
SHAPES = {1: [(2, 3)], 2: [(3, 1, 4), (5, 4)], 3: [(2, 1, 3), (4, 1), (3,)]}


@pytest.fixture
def graph():
    with gc.Graph("elemwise_forward") as g:
        yield g
    gc.verify(g)


def _data(rng, domain: str, shape, dtype) -> np.ndarray:
    dtype = np.dtype(dtype)
    if dtype.kind in "iu":
        low = 1 if domain == "pos" else -3
        return rng.integers(low, 4, size=shape).astype(dtype)
    if domain == "pos":
        values = rng.uniform(0.5, 2.0, shape)
    elif domain == "gt-1":
        values = rng.uniform(-0.7, 2.0, shape)
    elif domain == "small":
        values = rng.integers(-3, 4, size=shape) / 2.0
    elif domain == "quarters":
        values = rng.integers(-12, 13, size=shape) / 4.0
    else:
        values = rng.standard_normal(shape)
    return values.astype(dtype)


def _run_mode(mode, shapes, dtype, rng):
    oracle, domains, _ = CASES[mode]
    arrays = [_data(rng, d, s, dtype) for d, s in zip(domains, shapes)]
    with gc.Graph(mode) as g:
        tensors = [gc.input(f"x{i}", a.shape, a.dtype) for i, a in enumerate(arrays)]
        out = gc.elemwise(mode, *tensors)
    gc.verify(g)
    value = gc.evaluate(out, {f"x{i}": a for i, a in enumerate(arrays)})
    if np.dtype(dtype).kind == "f":
        expected = oracle(*(a.astype(np.float64) for a in arrays))
    else:
        expected = oracle(*arrays)
    return out, value, np.asarray(expected)


def _expected_dtype(mode, dtype):
    return np.dtype(np.bool_) if mode in BOOLEAN_MODES else np.dtype(dtype)


def test_every_mode_has_a_case():
    assert set(CASES) == set(MODES)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("mode", sorted(CASES))
def test_float_mode_matches_numpy_with_broadcasting(mode, dtype, rng):
    shapes = SHAPES[len(CASES[mode][1])]
    out, value, expected = _run_mode(mode, shapes, dtype, rng)
    assert out.shape == np.broadcast_shapes(*shapes) == value.shape
    assert value.dtype == _expected_dtype(mode, dtype)
    if mode in BOOLEAN_MODES:
        np.testing.assert_array_equal(value, expected)
    else:
        rtol = 2e-6 if dtype == "float32" else 1e-13
        np.testing.assert_allclose(value, expected, rtol=rtol, atol=rtol)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
@pytest.mark.parametrize("mode", INT_MODES)
def test_int_mode_is_exact_and_keeps_dtype(mode, dtype, rng):
    shapes = SHAPES[len(CASES[mode][1])]
    _, value, expected = _run_mode(mode, shapes, dtype, rng)
    assert value.dtype == _expected_dtype(mode, dtype)
    np.testing.assert_array_equal(value, expected.astype(value.dtype))


@pytest.mark.parametrize("mode", FLOAT_ONLY_MODES)
def test_float_only_mode_rejects_ints(mode, graph):
    arity = len(CASES[mode][1])
    tensors = [gc.input(f"i{k}", (2, 3), "int32") for k in range(arity)]
    with pytest.raises(DTypeError, match=f"Elemwise {mode}.*int32"):
        gc.elemwise(mode, *tensors)


def test_zero_d_and_empty_operands(graph):
    s = gc.input("s", (), "float32")
    e = gc.input("e", (0, 3), "float32")
    row = gc.input("row", (3,), "float32")
    scaled = s * row
    empty = gc.exp(e) + row
    sv, rv = np.float32(1.5), np.arange(3, dtype=np.float32)
    out_scaled, out_empty = gc.evaluate([scaled, empty], s=sv, e=np.zeros((0, 3), np.float32), row=rv)
    np.testing.assert_allclose(out_scaled, sv * rv)
    assert out_empty.shape == (0, 3) and out_empty.dtype == np.float32


def test_selects_with_integer_conditions_and_float_values(graph, rng):
    a = rng.integers(-2, 3, (4,)).astype(np.int32)
    b = rng.integers(-2, 3, (4,)).astype(np.int32)
    c = rng.standard_normal((3, 4)).astype(np.float32)
    ta, tb, tc = gc.input("a", (4,), "int32"), gc.input("b", (4,), "int32"), gc.input("c", (3, 4))
    outs = [gc.elemwise("SWITCH_GT0", ta, tc), gc.elemwise("COND_LEQ_MOV", ta, tb, tc),
            gc.elemwise("COND_LT_MOV", ta, tb, tc)]
    got = gc.evaluate(outs, a=a, b=b, c=c)
    np.testing.assert_array_equal(got[0], np.where(a > 0, c, 0))
    np.testing.assert_array_equal(got[1], np.where(a <= b, c, 0))
    np.testing.assert_array_equal(got[2], np.where(a < b, c, 0))
    assert all(v.dtype == np.float32 for v in got)


def test_operators_and_scalars(graph, rng):
    av = rng.uniform(0.5, 2.0, (2, 3))
    bv = rng.uniform(0.5, 2.0, (3,))
    a, b = gc.input("a", (2, 3), "float64"), gc.input("b", (3,), "float64")
    exprs = {
        "a+b": (a + b, av + bv), "a-b": (a - b, av - bv), "a*b": (a * b, av * bv),
        "a/b": (a / b, av / bv), "a**b": (a ** b, av ** bv), "-a": (-a, -av), "abs": (abs(-a), av),
        "2-a": (2 - a, 2 - av), "2/a": (2 / a, 2 / av), "a**2": (a ** 2, av ** 2),
        "a**3": (a ** 3, av ** 3), "a**0.5": (a ** 0.5, av ** 0.5), "a**1.7": (a ** 1.7, av ** 1.7),
        "a<b": (a < b, av < bv), "a<=b": (a <= b, av <= bv), "a>b": (a > b, av > bv),
        "a>=b": (a >= b, av >= bv), "a==b": (a == b, av == bv), "a==a+0": (a == a + 0, av == av + 0),
        "maximum": (gc.maximum(a, 1.0), np.maximum(av, 1.0)),
        "minimum": (gc.minimum(a, 1.0), np.minimum(av, 1.0)),
    }
    values = gc.evaluate([e for e, _ in exprs.values()], a=av, b=bv)
    for (name, (_, expected)), got in zip(exprs.items(), values):
        np.testing.assert_allclose(got, expected, rtol=1e-14, err_msg=name)


def test_scalar_operand_takes_tensor_dtype(graph):
    x = gc.input("x", (2,), "float32")
    i = gc.input("i", (2,), "int32")
    assert (x * 2).dtype == np.float32
    assert (i + 2).dtype == np.int32
    assert (i * 2.0).dtype == np.int32  # an integral float is exact
    with pytest.raises(DTypeError, match="2.5"):
        i + 2.5


def test_mixed_float_dtypes_are_an_error(graph):
    x = gc.input("x", (2,), "float32")
    y = gc.input("y", (2,), "float64")
    with pytest.raises(DTypeError, match="float32, float64"):
        x + y


def test_bool_values_are_rejected_by_arithmetic(graph):
    m = gc.input("m", (2,), "bool")
    with pytest.raises(DTypeError, match="bool"):
        m + m


def test_broadcast_mismatch_names_both_shapes(graph):
    x = gc.input("x", (3, 4))
    y = gc.input("y", (5, 4))
    with pytest.raises(ShapeError, match=r"Elemwise MUL.*\(3, 4\).*\(5, 4\)"):
        x * y


def test_wrong_arity_and_unknown_mode(graph):
    x = gc.input("x", (3,))
    with pytest.raises(BuildError, match="takes 2 inputs, got 1"):
        gc.elemwise("ADD", x)
    with pytest.raises(BuildError, match="unknown mode 'FROB'"):
        gc.elemwise("FROB", x)


def test_where_broadcasts_and_selects(graph, rng):
    mv = rng.standard_normal((3, 1)) > 0
    xv = rng.standard_normal((4,)).astype(np.float32)
    m, x = gc.input("m", (3, 1), "bool"), gc.input("x", (4,), "float32")
    both = gc.where(m, x, -x)
    scalar = gc.where(m, x, 0.5)
    got_both, got_scalar = gc.evaluate([both, scalar], m=mv, x=xv)
    assert got_both.shape == (3, 4) and got_both.dtype == np.float32
    np.testing.assert_array_equal(got_both, np.where(mv, xv, -xv))
    np.testing.assert_array_equal(got_scalar, np.where(mv, xv, np.float32(0.5)))


def test_where_errors(graph):
    x = gc.input("x", (3,))
    with pytest.raises(DTypeError, match="mask must be bool"):
        gc.where(x, x, x)
    m = gc.input("m", (3,), "bool")
    with pytest.raises(DTypeError):
        gc.where(m, x, gc.input("d", (3,), "float64"))
    with pytest.raises(ShapeError, match="Where"):
        gc.where(m, x, gc.input("y", (4,)))


@pytest.mark.parametrize("src, dst", [("float64", "float32"), ("float32", "float64"),
                                      ("float32", "int32"), ("int32", "float32"), ("int64", "int32")])
def test_cast_matches_astype(src, dst, graph):
    values = np.array([[-2.75, -0.5, 0.0], [0.5, 1.25, 7.0]]).astype(src)
    x = gc.input("x", values.shape, src)
    y = x.astype(dst)
    assert y.dtype == np.dtype(dst)
    got = gc.evaluate(y, x=values)
    assert got.dtype == np.dtype(dst)
    # truncation toward zero for float -> int, exact otherwise on these values
    expected = {"int32": np.trunc(values.astype(np.float64)).astype(np.int32)}.get(dst, values.astype(dst))
    np.testing.assert_array_equal(got, expected)


def test_cast_to_same_dtype_builds_nothing(graph):
    x = gc.input("x", (2,))
    assert gc.cast(x, "float32") is x


def test_stop_gradient_is_identity(graph, rng):
    values = rng.standard_normal((2, 3)).astype(np.float32)
    x = gc.input("x", (2, 3))
    y = gc.stop_gradient(x)
    assert y.id != x.id and y.type == x.type
    np.testing.assert_array_equal(gc.evaluate(y, x=values), values)
