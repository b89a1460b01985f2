"""Divisions by a value fixed along the innermost loop multiply by its reciprocal (codegen).

* A row-wise division equals numpy's x / d within the rounding of x · (1/d) (1.5 units in
  the last place) for every divisor whose reciprocal is a normal number, and exactly for the
  others (zero, ±subnormal, above 2^126, ±inf, NaN), which keep the division: no overflow
  that x / d would not give.
* The source takes the reciprocal once per row, and the element loop multiplies.
* A softmax and its gradient (the attention step's kernel) equals the reference interpreter.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from tests.oracle import assert_close


def _divisors(dtype) -> np.ndarray:
    info = np.finfo(dtype)
    specials = [0.0, -0.0, info.smallest_subnormal * 3, -info.smallest_subnormal, info.max / 2, -info.max,
                np.inf, -np.inf, np.nan]
    ordinary = [3.0, -7.25, 1e-3, 1e30 if dtype == np.float32 else 1e300, info.tiny * 8]
    return np.array(ordinary + specials, dtype), len(ordinary)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy's own x / 0 and inf / inf
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_division_by_a_row_value_matches_numpy_and_keeps_every_special_divisor(rng, dtype):
    d, ordinary = _divisors(dtype)
    rows, width = len(d), 37
    with gc.Graph("row_division"):
        x = gc.input("x", (rows, width), np.dtype(dtype).name)
        dv = gc.input("d", (rows, 1), np.dtype(dtype).name)
        y = x / dv
    step = gc.compile([y])
    source = step.source()
    assert "rcp" in source and " / " in source.split("rcpok")[-1]
    xs = (rng.standard_normal((rows, width)) * 10).astype(dtype)
    xs[:, :6] = [0.0, np.inf, -np.inf, np.nan, np.finfo(dtype).max, np.finfo(dtype).smallest_subnormal]
    (got,) = step(x=xs, d=d[:, None])
    want = xs / d[:, None]
    np.testing.assert_array_equal(got[ordinary:], want[ordinary:])
    ulps = 1.5 * np.finfo(dtype).eps
    assert_close(got[:ordinary], want[:ordinary], rtol=ulps, scaled_atol=0.0)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_softmax_and_its_gradient_equal_the_reference(rng, dtype):
    batch, rows, width = 3, 17, 40
    with gc.Graph("softmax_grad"):
        s = gc.param("s", (batch, rows, width), dtype)
        r = gc.input("r", (batch, rows, width), dtype)
        loss = (gc.softmax(s / 8.0, axis=-1) * r).sum()
    outputs = [loss, *gc.grad(loss, [s])]
    step = gc.compile(outputs)
    assert "rcp" in step.source()
    feeds = dict(s=(4 * rng.standard_normal((batch, rows, width))).astype(dtype),
                 r=rng.standard_normal((batch, rows, width)).astype(dtype))
    feeds["s"][1, 3] = np.nan
    tolerance = {"float64": 1e-10, "float32": 1e-5}[dtype]
    for k, (got, want) in enumerate(zip(step(**feeds), gc.evaluate(outputs, feeds))):
        assert_close(got, want, rtol=tolerance, label=f"output {k}")
