"""float32 column sums accumulate COLUMN_BLOCK rows at a time in float32 block partials, then
in float64 (`codegen` module docstring): the compiled values equal the reference interpreter,
which sums in float64, whatever the block boundaries and with NaN and ±inf in the rows.

Shapes: rows that leave a partial last block, a serial kernel and a parallel one whose two
chunks start mid-block, a rank-3 domain summed over axis 0 alone and over axes (0, 2) (a row
register added into the block partials), a mean, and column sums fused with a row sum of the
same values (layernorm's gamma and beta gradients). float64 keeps its float64 partials. A
rank-2 kernel whose every reduction is over axis 0 takes ROW_GROUP rows per pass, the rows of
a block beyond a multiple of it one at a time.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends.numba_cpu.codegen import COLUMN_BLOCK, ROW_GROUP

BLOCKED_LOOP = f"for j0 in range(lo, hi, {COLUMN_BLOCK}):"
SHAPES = [(4 * COLUMN_BLOCK + 6, 9, 1), (300, 3, 5), (8200, 33, 1)]  # the last one runs parallel


def _feed(shape, dtype) -> np.ndarray:
    x = np.random.default_rng(11).standard_normal(shape).astype(dtype)
    x[-2, 0, 0] = np.nan                       # in the partial last block
    x[COLUMN_BLOCK + 3, 1, 0] = np.inf         # a middle block
    x[2, 2, -1], x[-1, 2, -1] = np.inf, -np.inf  # inf - inf across blocks: NaN
    x[5, -1, 0] = -np.inf
    return x


def _graph(shape, dtype):
    with gc.Graph("column_sums"):
        x = gc.input("x", shape, dtype)
        y = x * x + 1.0
        outputs = [gc.sum(x, axis=0), gc.mean(x, axis=0), gc.sum(x, axis=(0, 2)),
                   gc.sum(y, axis=0), gc.sum(y * x, axis=0), gc.sum(y, axis=(1, 2))]
    return outputs


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's inf - inf
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_blocked_column_sums_equal_the_reference(shape):
    outputs = _graph(shape, "float32")
    x = _feed(shape, np.float32)
    step = gc.compile(outputs)
    assert BLOCKED_LOOP in step.source()
    got, want = step(x=x), gc.evaluate(outputs, {"x": x})
    for g, w in zip(got, want):
        assert g.dtype == np.float32
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.sqrt(shape[0]))
    # and the reference itself against a float64 sum written here, where every value is finite
    columns = x.astype(np.float64).sum(axis=0)
    finite = np.isfinite(columns)
    np.testing.assert_allclose(got[0][finite], columns[finite], rtol=1e-5, atol=1e-4)


def test_float64_column_sums_keep_float64_partials():
    shape = SHAPES[0]
    outputs = _graph(shape, "float64")
    x = _feed(shape, np.float64)
    step = gc.compile(outputs)
    assert BLOCKED_LOOP not in step.source()
    with np.errstate(invalid="ignore"):
        want = gc.evaluate(outputs, {"x": x})
    for g, w in zip(step(x=x), want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


GROUPED_LOOP = f"for i0 in range(j0, grouped0, {ROW_GROUP}):"


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's inf - inf
@pytest.mark.parametrize("rows", [4 * COLUMN_BLOCK + 6, 4 * COLUMN_BLOCK + ROW_GROUP - 1, 8203])
def test_column_sums_in_row_groups_equal_the_reference(rows):
    """Rows that leave a block of fewer than ROW_GROUP rows, or a remainder after the groups
    (8203 runs parallel: each chunk starts and ends mid-block), with NaN and ±inf placed in a
    grouped row and in a remainder row: column sums, a mean, a column sum of products, the
    whole sum and an elementwise output, against the reference and a float64 sum."""
    with gc.Graph("grouped_column_sums"):
        x = gc.input("x", (rows, 33))
        b = gc.input("b", (33,))
        y = gc.relu(x + b)
        outputs = [gc.sum(x, axis=0), gc.mean(x, axis=0), gc.sum(y * x, axis=0), gc.sum(y), y * 2.0]
    feeds = {"x": _feed((rows, 33, 1), np.float32)[:, :, 0],
             "b": np.random.default_rng(5).standard_normal(33).astype(np.float32)}
    step = gc.compile(outputs)
    assert GROUPED_LOOP in step.source()
    got, want = step(**feeds), gc.evaluate(outputs, feeds)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(w))
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5 * np.sqrt(rows))
    columns = feeds["x"].astype(np.float64).sum(axis=0)
    finite = np.isfinite(columns)
    np.testing.assert_allclose(got[0][finite], columns[finite], rtol=1e-5, atol=1e-4)
