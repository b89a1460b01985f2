"""float32 sums and means over long axes are as accurate at every length: within 1e-6
relative of a float64 sum of the same values, on the reference interpreter and compiled CPU.

A long sum is blocked (each block of `codegen.ROW_SPLIT` points summed in float32 in a loop
that vectorises, the blocks added in float64), whatever the length: the lengths here are
odd, prime-ish and one off a power of two, where blocking used to need the length to divide
by the row length. Values: 0.1 everywhere (every addition rounds the same way, the worst
case of a sequential sum) and uniform [0, 1).
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends.numba_cpu.codegen import ROW_CHAIN_MIN, row_block
from gradcompiler.backends.numba_cpu.rowreduce import ROW_SPLIT

LENGTHS = [2**24 - 1, 2**24 + 1, 10**7 + 3]
RTOL = 1e-6


def _values(shape) -> list[np.ndarray]:
    uniform = np.random.default_rng(5).random(shape, dtype=np.float32)
    return [np.full(shape, 0.1, np.float32), uniform]


def _assert_close(got, values: np.ndarray, axis, mean: bool) -> None:
    want = values.astype(np.float64).sum(axis=axis)
    if mean:
        want = want / (values.size / np.size(want))
    assert np.asarray(got).dtype == np.float32
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=RTOL, atol=0)


@pytest.mark.parametrize("n", LENGTHS)
def test_sum_and_mean_of_a_long_vector(n):
    with gc.Graph("long_sum"):
        x = gc.input("x", (n,))
        outputs = [gc.sum(x), gc.mean(x)]
    step = gc.compile(outputs)
    for values in _values(n):
        for got in (step(x=values), gc.evaluate(outputs, {"x": values})):
            _assert_close(got[0], values, None, mean=False)
            _assert_close(got[1], values, None, mean=True)


@pytest.mark.parametrize("shape, axis", [((2, 2**23 + 1), 1), ((4099, 4097), None), ((4099, 4097), 0)])
def test_long_axes_inside_two_dimensional_reductions(shape, axis):
    """A long innermost row, and many rows added up (whole array and column sums)."""
    with gc.Graph("long_sum_2d"):
        x = gc.input("x", shape)
        outputs = [gc.sum(x, axis=axis), gc.mean(x, axis=axis)]
    step = gc.compile(outputs)
    for values in _values(shape):
        for got in (step(x=values), gc.evaluate(outputs, {"x": values})):
            _assert_close(got[0], values, axis, mean=False)
            _assert_close(got[1], values, axis, mean=True)


@pytest.mark.parametrize("width", [4 * ROW_CHAIN_MIN, 1000, ROW_SPLIT])
def test_a_light_row_sum_is_split_into_independent_chains(width):
    """The row sums of light loops (a mean, a variance) are ROW_CHAINS blocks, each its own
    chain of vector additions, added in float64; a heavy loop's row sum stays one chain. All
    close to float64 numpy's, on widths whose ROW_CHAINS-th leaves a partial vector (1000)."""
    with gc.Graph("row_chains"):
        x = gc.input("x", (3, width))
        centred = x - gc.mean(x, axis=1, keepdims=True)
        variance = gc.mean(centred * centred, axis=1, keepdims=True)
        z = centred * gc.rsqrt(variance + 1.0)
        heavy = gc.tanh(gc.exp(z) * gc.sin(z) + gc.cos(z) * z)
        outputs = [variance, gc.sum(heavy, axis=1)]
    step = gc.compile(outputs)
    source = step.source()
    assert source.count(f"for j1 in range(0, {width}, {row_block(width)}):") == 2  # the mean, the variance
    for values in _values((3, width)):
        wide = values.astype(np.float64)
        centred = wide - wide.mean(axis=1, keepdims=True)
        variance = (centred * centred).mean(axis=1, keepdims=True)
        z = centred / np.sqrt(variance + 1.0)
        heavy = np.tanh(np.exp(z) * np.sin(z) + np.cos(z) * z)
        # A constant row is centred on 0 exactly in float64; compiled, its float32 mean sums in
        # another order and can round to a neighbouring float, an ulp of the values u. The
        # variance is then u², and each of the row's `width` heavy terms moves by about 2u (the
        # function's slope at 0).
        ulp = 2 * np.finfo(np.float32).eps * np.abs(wide).max()
        for got in (step(x=values), gc.evaluate(outputs, {"x": values})):
            np.testing.assert_allclose(got[0], variance, rtol=1e-5, atol=ulp ** 2)
            np.testing.assert_allclose(got[1], heavy.sum(axis=1), rtol=1e-5, atol=max(1e-5, 2 * width * ulp))
