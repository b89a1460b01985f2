"""MAX and MIN reductions propagate NaN on every target, as numpy's max and min do.

The reference interpreter reduces with `np.max`/`np.min`; the compiled kernels
combine in loops, where a plain `v if v > acc else acc` silently drops a NaN
(a comparison with NaN is false). Oracle: the reference on the same feeds,
with NaN at the first, a middle and the last position of a reduced slice, a
slice of NaN only, and ±inf beside finite values (inf is not NaN: it must
win or lose as usual). Every reduction layout: innermost rows, a row in the
middle of the domain, a leading axis (per-thread partials), the whole array,
two axes, and a row reduction fused with the values it reduces.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc

SHAPE = (6, 40)


def _feed() -> np.ndarray:
    x = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)
    x[1, 0] = np.nan            # first of its row
    x[2, 17] = np.nan           # middle
    x[3, -1] = np.nan           # last
    x[4, :] = np.nan            # all of it
    x[5, 3], x[5, 9] = np.inf, -np.inf
    x[0, 5] = np.inf
    return x


def _graph(mode: str):
    reduce = gc.max if mode == "MAX" else gc.min
    with gc.Graph(f"nan_{mode.lower()}"):
        x = gc.input("x", SHAPE)
        y = gc.input("y", (2, 3, 40))
        outputs = [
            reduce(x, axis=1),                       # innermost rows
            reduce(x, axis=0),                       # leading axis: partials per thread
            reduce(x),                               # everything
            reduce(x * 2.0 + 1.0, axis=1),           # fused with its producer
            reduce(y, axis=1),                       # a middle axis
            reduce(y, axis=(0, 2)),                  # two axes
            gc.exp(x - reduce(x, axis=1, keepdims=True)),  # a softmax's first half
        ]
    return outputs


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # inf - inf on the simulator
@pytest.mark.parametrize("target", ["cpu", "cuda"])
@pytest.mark.parametrize("mode", ["MAX", "MIN"])
def test_nan_wins_and_inf_compares_as_usual(target, mode):
    outputs = _graph(mode)
    x = _feed()
    feeds = dict(x=x, y=x.reshape(2, 3, 40))
    want = gc.evaluate(outputs, feeds)
    step = gc.compile(outputs, target=target)
    got = step(**feeds, to_host=True) if target == "cuda" else step(**feeds)
    for k, (g, w) in enumerate(zip(got, want)):
        assert np.isnan(w).any(), f"output {k}: the oracle has no NaN, the test checks nothing"
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w), err_msg=f"output {k}: NaN positions")
        np.testing.assert_allclose(g, w, rtol=1e-6, equal_nan=True, err_msg=f"output {k}")


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")
@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
def test_row_helpers_halve_to_numpys_max_and_min(dtype):
    """`max_row` and `min_row` reduce a row by halving it in place (rowreduce): every length
    around the halving's boundaries (odd lengths leave a middle value standing) and long
    rows, with NaN and ±inf at the first, middle and last positions, against numpy; an
    empty row gives the initial value."""
    from gradcompiler.backends.numba_cpu.rowreduce import max_row, min_row

    rng = np.random.default_rng(11)
    floating = np.dtype(dtype).kind == "f"
    low, high = (-np.inf, np.inf) if floating else (np.iinfo(dtype).min, np.iinfo(dtype).max)
    for n in [*range(0, 70), 1000, 2049]:
        rows = [rng.integers(-1000, 1000, n).astype(dtype)]
        if floating and n:
            for position in {0, n // 2, n - 1}:
                for special in (np.nan, np.inf, -np.inf):
                    row = rows[0].copy()
                    row[position] = special
                    rows.append(row)
        for row in rows:
            padded = np.concatenate([np.full(3, 7, dtype), row])  # the row starts at an offset
            for helper, reduce, init in ((max_row, np.max, low), (min_row, np.min, high)):
                want = reduce(row, initial=init) if n else init
                got = helper(padded.copy(), 3, n, np.dtype(dtype).type(init))
                np.testing.assert_array_equal(got, want, err_msg=f"{helper.__name__} of {row!r}")
