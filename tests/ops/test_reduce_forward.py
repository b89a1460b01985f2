"""Forward values of Reduce (every mode, axis forms, keepdims, empty dims) and
ReduceTo, against numpy expressions written here (op-reference §1.2, §3.1).
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import DTypeError, ShapeError
from gradcompiler.ops.reduce import REDUCE_MODES, Reduce

COVERS = {"Reduce", "ReduceTo"}

ORACLES = {
    "SUM": lambda x, axis, keep: np.sum(x, axis=axis, keepdims=keep),
    "MEAN": lambda x, axis, keep: np.mean(x, axis=axis, keepdims=keep),
    "MAX": lambda x, axis, keep: np.amax(x, axis=axis, keepdims=keep),
    "MIN": lambda x, axis, keep: np.amin(x, axis=axis, keepdims=keep),
    "PRODUCT": lambda x, axis, keep: np.prod(x, axis=axis, keepdims=keep),
    "SUM_SQR": lambda x, axis, keep: np.sum(x * x, axis=axis, keepdims=keep),
}
INT_MODES = ("SUM", "MAX", "MIN", "PRODUCT")
AXES = [0, 1, -1, (0, 2), (2, 0), (-1, -3), (0, 1, 2), None]


@pytest.fixture
def graph():
    with gc.Graph("reduce_forward") as g:
        yield g
    gc.verify(g)


def _reduce(mode, x, axis, keepdims):
    return gc.reduce(mode, x, axis, keepdims)


def test_every_mode_has_an_oracle():
    assert set(ORACLES) == set(REDUCE_MODES)


@pytest.mark.parametrize("keepdims", [False, True])
@pytest.mark.parametrize("axis", AXES, ids=str)
@pytest.mark.parametrize("mode", sorted(ORACLES))
def test_float_reduce_matches_numpy(mode, axis, keepdims, graph, rng):
    values = rng.uniform(0.5, 1.5, (2, 3, 4))
    x = gc.input("x", values.shape, "float64")
    y = _reduce(mode, x, axis, keepdims)
    expected = ORACLES[mode](values, axis, keepdims)
    got = gc.evaluate(y, x=values)
    assert y.shape == np.shape(expected) == got.shape
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, expected, rtol=1e-13)


@pytest.mark.parametrize("axis", [1, (0, 2), None], ids=str)
@pytest.mark.parametrize("mode", INT_MODES)
def test_int_reduce_is_exact_in_numpys_dtype(mode, axis, graph, rng):
    """int32 sums and products are int64, as numpy's; max and min keep int32."""
    values = rng.integers(-3, 4, (2, 3, 4)).astype(np.int32)
    x = gc.input("x", values.shape, "int32")
    y = _reduce(mode, x, axis, False)
    got = gc.evaluate(y, x=values)
    want = ORACLES[mode](values, axis, False)
    assert got.dtype == y.dtype == want.dtype == (np.int64 if mode in ("SUM", "PRODUCT") else np.int32)
    np.testing.assert_array_equal(got, want)


def test_float32_sum_and_mean(graph, rng):
    values = rng.standard_normal((3, 5)).astype(np.float32)
    x = gc.input("x", values.shape)
    got = gc.evaluate([x.sum(axis=1), x.mean(axis=0), x.max(), x.min(axis=-1, keepdims=True)], x=values)
    wide = values.astype(np.float64)
    expected = [wide.sum(1), wide.mean(0), wide.max(), wide.min(-1, keepdims=True)]
    for g, e in zip(got, expected):
        assert g.dtype == np.float32
        np.testing.assert_allclose(g, e, rtol=1e-6, atol=1e-6)


def test_method_forms(graph, rng):
    values = rng.uniform(0.5, 1.5, (2, 3))
    x = gc.input("x", values.shape, "float64")
    got = gc.evaluate([x.sum(), x.mean(1), x.max(0), x.min(), x.prod(axis=1), gc.sum_sqr(x, 0)], x=values)
    expected = [values.sum(), values.mean(1), values.max(0), values.min(), values.prod(1),
                (values ** 2).sum(0)]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-13)


@pytest.mark.filterwarnings("ignore:Mean of empty slice:RuntimeWarning")
def test_reduce_over_empty_axis(graph):
    x = gc.input("x", (0, 3), "float64")
    i = gc.input("i", (0, 3), "int32")
    empty = np.zeros((0, 3))
    total, prod, mean, total_all, keep_rows = gc.evaluate(
        [x.sum(axis=0), x.prod(axis=0), x.mean(axis=0), x.sum(), x.sum(axis=1)], x=empty)
    np.testing.assert_array_equal(total, np.zeros(3))
    np.testing.assert_array_equal(prod, np.ones(3))
    assert np.isnan(mean).all() and mean.shape == (3,)
    assert total_all.shape == () and total_all == 0.0
    assert keep_rows.shape == (0,)
    int_sum, int_prod = gc.evaluate([i.sum(axis=0), i.prod(axis=0)], i=np.zeros((0, 3), np.int32))
    assert int_sum.dtype == int_prod.dtype == np.int64
    np.testing.assert_array_equal(int_sum, np.zeros(3))
    np.testing.assert_array_equal(int_prod, np.ones(3))


@pytest.mark.parametrize("mode", ["MAX", "MIN", "SUM_SQR"])
def test_empty_reduction_without_identity_is_a_build_error(mode, graph):
    x = gc.input("x", (0, 3), "float64")
    with pytest.raises(ShapeError, match=f"Reduce {mode}.*empty.*\\(0, 3\\)"):
        gc.reduce(mode, x, 0)
    with pytest.raises(ShapeError):
        gc.reduce(mode, x)
    # reducing the non-empty axis is fine and gives an empty result
    assert gc.reduce(mode, x, 1).shape == (0,)


@pytest.mark.parametrize("mode", ["MAX", "MIN", "SUM_SQR"])
def test_empty_reduction_with_an_empty_result_is_empty(mode, graph):
    # no output element asks for a value of no elements, so there is nothing to refuse
    x = gc.input("x", (0, 0, 2), "float64")
    outs = [gc.reduce(mode, x, 1), gc.reduce(mode, x, 0, keepdims=True)]
    assert [o.shape for o in outs] == [(0, 2), (1, 0, 2)]
    got = gc.evaluate(outs, x=np.zeros((0, 0, 2)))
    assert [(g.shape, g.dtype) for g in got] == [((0, 2), np.float64), ((1, 0, 2), np.float64)]
    # the result (2,) would hold values of no elements: an error naming the op and the shape
    with pytest.raises(ShapeError, match=f"Reduce {mode}.*empty axis 0 of shape \\(0, 0, 2\\)"):
        gc.reduce(mode, x, (0, 1))


def test_reduce_errors(graph):
    x = gc.input("x", (2, 3))
    with pytest.raises(ShapeError, match="axis 2 is out of range"):
        x.sum(axis=2)
    with pytest.raises(ShapeError, match="axis -3 is out of range"):
        x.max(axis=-3)
    with pytest.raises(ShapeError, match="repeated axis"):
        x.sum(axis=(1, -1))
    with pytest.raises(DTypeError, match="Reduce MEAN.*int32"):
        gc.input("i", (2,), "int32").mean()
    with pytest.raises(DTypeError, match="Reduce MAX.*bool"):
        gc.input("m", (2,), "bool").max()
    with pytest.raises(ShapeError, match="unknown mode"):
        gc.reduce("MEDIAN", x)


def test_op_requires_normalised_axes(graph):
    x = gc.input("x", (2, 3))
    for axes in [(1, 0), (-1,), (2,), (0, 0)]:
        with pytest.raises(ShapeError, match="must be sorted, unique"):
            gc.apply(Reduce("SUM", axes), x)


# ReduceTo: target shape -> the axes summed (written out by hand, keepdims, then reshaped)
REDUCE_TO_CASES = [
    ((2, 3, 4), (3, 1), lambda v: v.sum(axis=(0, 2)).reshape(3, 1)),
    ((2, 3, 4), (4,), lambda v: v.sum(axis=(0, 1))),
    ((2, 3, 4), (1, 3, 4), lambda v: v.sum(axis=0, keepdims=True)),
    ((2, 3, 4), (2, 1, 1), lambda v: v.sum(axis=(1, 2)).reshape(2, 1, 1)),
    ((2, 3, 4), (), lambda v: v.sum()),
    ((2, 3, 4), (1,), lambda v: v.sum().reshape(1)),
    ((3, 1), (3, 1), lambda v: v),
]


@pytest.mark.parametrize("shape, target, oracle", REDUCE_TO_CASES, ids=lambda c: "oracle" if callable(c) else str(c))
def test_reduce_to_sums_broadcast_dims(shape, target, oracle, graph, rng):
    values = rng.standard_normal(shape)
    x = gc.input("x", shape, "float64")
    y = gc.reduce_to(x, target)
    got = gc.evaluate(y, x=values)
    assert y.shape == target == got.shape
    np.testing.assert_allclose(got, oracle(values), rtol=1e-13)


def test_reduce_to_op_on_ints(graph):
    values = np.arange(6, dtype=np.int32).reshape(2, 3)
    x = gc.input("x", (2, 3), "int32")
    got = gc.evaluate(gc.apply(gc.ops.reduce.ReduceTo((1, 3)), x), x=values)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [[3, 5, 7]])


@pytest.mark.parametrize("target, message", [
    ((4,), "cannot reduce shape"), ((2, 2, 3), "cannot reduce shape"), ((3, 2), "cannot reduce shape"),
    ((1, 2, 3, 4), "cannot reduce shape"), ((1.0, 3), "must be a tuple of ints"),
], ids=str)
def test_reduce_to_impossible_target_is_a_shape_error(target, message, graph):
    x = gc.input("x", (2, 3))
    with pytest.raises(ShapeError, match=f"ReduceTo.*{message}"):
        gc.reduce_to(x, target)
