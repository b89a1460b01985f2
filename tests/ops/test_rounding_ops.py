"""floor, ceil, trunc, round, sign and div(rounding_mode=...): values on the reference, the
compiled CPU code and the CUDA simulator, against Python's own scalar functions (math.floor,
the round-half-to-even of `round`, the `//` of floats), and torch's zero gradients.

The inputs hold the cases a rounding function gets wrong first: exact halves (ties), whole
numbers, ±0, values just below a half, ±inf and NaN, and quotients such as 1 / 0.1 that
round up to an integer in floating point (Python's `1.0 // 0.1` is 9.0).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import BuildError, DTypeError

VALUES = [2.5, -2.5, 0.5, -0.5, 1.5, -1.5, 3.0, -3.0, 0.3, -0.3, 0.49999997, -0.7, 1e20, -1e20,
          0.0, -0.0, math.inf, -math.inf, math.nan, 7.25]
NUMERATORS = [1.0, 7.0, -7.0, 7.0, -7.0, 2.5, 0.0, -0.0, 1.0, -1.0, 0.0, math.inf, 5.0, 1e10, 3.0]
DENOMINATORS = [0.1, 2.0, 2.0, -2.0, -2.0, 0.5, 3.0, 3.0, 0.0, 0.0, 0.0, 2.0, math.inf, 3.0, -0.25]


def _python(fn, *columns):
    """`fn` applied one Python float at a time; its nan/inf are what numpy's ufuncs give."""
    def scalar(*xs):
        if any(math.isnan(x) for x in xs):
            return math.nan
        try:
            return float(fn(*xs))
        except (OverflowError, ValueError):  # math.floor(inf): rounding keeps ±inf
            return xs[0]
        except ZeroDivisionError:  # numpy: a / 0 (±inf, or NaN for 0 / 0)
            a, b = xs
            return math.nan if a == 0 else math.copysign(math.inf, a) * math.copysign(1.0, b)
    return np.array([scalar(*xs) for xs in zip(*columns)])


def _floor_div(a, b):
    if b == 0:
        raise ZeroDivisionError  # numpy: a / 0
    return a // b  # Python: inf // 2.0 is NaN, as in numpy


def _signed(rounding):
    """`rounding` as IEEE defines it on floats: a zero result keeps the sign of its input
    (ceil(-0.3) is -0.0), which the Python ints math.floor and round return cannot hold."""
    def fn(x):
        value = rounding(x)
        return math.copysign(0.0, x) if value == 0 else value
    return fn


UNARY = {
    "floor": (gc.floor, _signed(math.floor)),
    "ceil": (gc.ceil, _signed(math.ceil)),
    "trunc": (gc.trunc, _signed(math.trunc)),
    "round": (gc.round, _signed(round)),  # Python's round(x) is half to even
    "sign": (gc.sign, lambda x: (x > 0) - (x < 0)),
}


def _oracles():
    """The expected outputs, float64, in the order `_build` returns them."""
    x = VALUES
    unary = [_python(oracle, x) for _, oracle in UNARY.values()]
    floor = _python(_floor_div, NUMERATORS, DENOMINATORS)
    trunc = _python(lambda a, b: _signed(math.trunc)(a / b), NUMERATORS, DENOMINATORS)
    return unary + [floor, trunc, floor]


def _build(dtype):
    with gc.Graph("rounding") as graph:
        x = gc.input("x", (len(VALUES),), dtype)
        a, b = gc.input("a", (len(NUMERATORS),), dtype), gc.input("b", (len(DENOMINATORS),), dtype)
        outs = [fn(x) for fn, _ in UNARY.values()]
        outs += [gc.div(a, b, rounding_mode="floor"), gc.div(a, b, rounding_mode="trunc"), a // b]
    feeds = dict(x=np.array(VALUES, dtype), a=np.array(NUMERATORS, dtype),
                 b=np.array(DENOMINATORS, dtype))
    return graph, outs, feeds


def _check(got, dtype):
    for k, (value, want) in enumerate(zip(got, _oracles())):
        assert value.dtype == np.dtype(dtype), k
        want = want.astype(dtype)
        np.testing.assert_array_equal(value, want, err_msg=f"output {k}")
        zero = want == 0
        assert list(np.signbit(value[zero])) == list(np.signbit(want[zero])), f"signed zero, {k}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_reference_rounds_like_python(dtype):
    _, outs, feeds = _build(dtype)
    _check(gc.evaluate(outs, feeds), dtype)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_compiled_cpu_rounds_like_python(dtype):
    _, outs, feeds = _build(dtype)
    _check(gc.compile(outs)(**feeds), dtype)


def test_cuda_rounds_like_python():
    """On the simulator under make test; on a device's libdevice under make gpu-check."""
    from gradcompiler.backends.numba_cuda import require_cuda

    require_cuda()
    _, outs, feeds = _build("float32")
    _check(gc.compile(outs, target="cuda")(to_host=True, **feeds), "float32")


def test_sign_of_integers_keeps_the_dtype():
    with gc.Graph():
        i = gc.input("i", (5,), "int32")
        out = gc.sign(i)
    feeds = {"i": np.array([-7, 0, 3, -1, 2**31 - 1], np.int32)}
    for got in (gc.evaluate(out, feeds), gc.compile(out)(**feeds)):
        assert got.dtype == np.int32 and list(got) == [-1, 0, 1, -1, 1]


def test_gradients_are_zero_as_in_torch():
    """Piecewise constant: their gradient is zero; alongside another path the gradient is
    that path's alone (float64 finite differences agree away from the jumps)."""
    with gc.Graph():
        x = gc.input("x", (4,), "float64")
        b = gc.input("b", (4,), "float64")
        y = (gc.floor(x) + gc.ceil(x) + gc.trunc(x) + gc.round(x) + gc.sign(x)) * x
        y = y + gc.div(x, b, rounding_mode="floor") + gc.div(x, b, rounding_mode="trunc")
        loss = y.sum()
        gx, gb = gc.grad(loss, [x, b])
    xv, bv = np.array([0.3, -1.2, 2.6, -3.4]), np.array([0.7, 1.3, -0.9, 2.2])  # off the jumps
    feeds = dict(x=xv, b=bv)
    rounded = np.floor(xv) + np.ceil(xv) + np.trunc(xv) + np.round(xv) + np.sign(xv)
    for got_x, got_b in (gc.evaluate([gx, gb], feeds), gc.compile([gx, gb])(**feeds)):
        np.testing.assert_array_equal(got_x, rounded)
        np.testing.assert_array_equal(got_b, np.zeros(4))
    gc.check_grads(y, [x], feeds)


def test_div_without_rounding_is_true_division_and_bad_modes_are_named():
    with gc.Graph():
        a, b = gc.input("a", (2,)), gc.input("b", (2,))
        out = gc.div(a, b)
        with pytest.raises(BuildError, match=r"div: rounding_mode='round'.*'trunc', 'floor'"):
            gc.div(a, b, rounding_mode="round")
        with pytest.raises(DTypeError, match="FLOOR"):
            gc.floor(gc.input("i", (2,), "int32"))
    got = gc.evaluate(out, a=np.array([1.0, 3.0], np.float32), b=np.array([4.0, -2.0], np.float32))
    np.testing.assert_array_equal(got, [0.25, -1.5])
