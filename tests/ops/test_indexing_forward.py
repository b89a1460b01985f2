"""Forward values of the indexing family (op-reference §6-§8): `x[key]` lowered
to Subtensor / IndexingMultiAxisVec, `index_update` / `index_add` lowered to
SetSubtensor and the Set/Incr scatter forms, and one-hot indexing, each
against numpy indexing of the same data written in the test. Then the
build-time errors (type, op, user's line) and the run-time range checks.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import gradcompiler as gc
from gradcompiler.errors import DTypeError, GraphError, IndexOutOfRangeError, ShapeError
from gradcompiler.ops.indexing import (
    IndexingMultiAxisVec,
    IndexingSetMultiAxisVec,
    IndexItem,
    SetSubtensor,
    SliceItem,
    Subtensor,
    TensorItem,
)

COVERS = {"Subtensor", "SetSubtensor", "IndexingMultiAxisVec", "IndexingIncrMultiAxisVec",
          "IndexingSetMultiAxisVec", "IndexingOneHot", "IndexingSetOneHot"}

HERE = os.path.abspath(__file__)
SHAPE = (4, 5, 6)


@pytest.fixture
def graph():
    with gc.Graph("indexing_forward") as g:
        yield g
    gc.verify(g)


def _data(rng, dtype, shape=SHAPE):
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    return rng.integers(-50, 50, shape).astype(dtype)


def _op_of(t):
    return type(t.node.op).__name__


# -- getitem ------------------------------------------------------------------------

BASIC_KEYS = [
    np.s_[1],
    np.s_[-1],
    np.s_[1:3],
    np.s_[::-1],
    np.s_[::-2, 3:0:-2],
    np.s_[-3:-1, -1, ::3],
    np.s_[-10:10, 4:1:-1],          # bounds beyond the axis clamp as in Python
    np.s_[10:, :, -100:2],          # an empty slice
    np.s_[:, :, ::-4],
    np.s_[..., 2],
    np.s_[2, ...],
    np.s_[1, ..., -2],
    np.s_[None],
    np.s_[:, None, 1::2, None],
    np.s_[None, ..., None, 0],
    np.s_[...],
    np.s_[:],
    np.s_[3, 4, 5],
    (),
]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32", "int64"])
@pytest.mark.parametrize("key", BASIC_KEYS, ids=repr)
def test_basic_indexing_matches_numpy(key, dtype, graph, rng):
    values = _data(rng, dtype)
    x = gc.input("x", SHAPE, dtype)
    y = x[key]
    expected = values[key]
    got = gc.evaluate(y, x=values)
    assert y.shape == expected.shape == got.shape
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, expected)
    assert _op_of(y) in ("Subtensor", "AddAxis", "Placeholder")


MASK = np.array([[True, False, True, False, False],
                 [False, False, False, False, True],
                 [True, True, False, False, False],
                 [False, False, False, False, False]])

ADVANCED_KEYS = [
    np.s_[[0, 2]],
    np.s_[[3, 3, 0, 3]],                     # repeated indices
    np.s_[[-1, -4, 2]],                      # negative indices
    np.s_[:, [0, 1]],                        # -> (A, 2, C)
    np.s_[:, 0, [1, 2]],                     # consecutive -> (A, 2)
    np.s_[0, :, [1, 2]],                     # not consecutive -> (2, B)
    np.s_[[0, 1], :, [1, 2]],                # not consecutive -> front
    np.s_[:, [[0], [4]], [1, 2, 3]],         # broadcast (2,1)x(3,) in the middle
    np.s_[::-1, [4, 0], 1:5:2],
    np.s_[[1, 0], None, [[2], [3]]],         # None between two index arrays
    np.s_[None, [0, 1]],
    np.s_[..., [5, -6]],
    np.s_[[]],
    np.s_[:, []],
    np.s_[np.array([[1, 2], [0, 0]])],
    np.s_[np.array([1, 2], dtype=np.int32), 2],
    np.s_[np.array([1, 2], dtype=np.uint8)],
    np.s_[MASK],
    np.s_[MASK, 2],
    np.s_[:, MASK[0]],
    np.s_[MASK[:, :1].ravel(), ..., [0, 0]],
    np.s_[:, 0, ..., [1, 2]],                # an ellipsis standing for no axis still splits the block
    np.s_[:, [[0], [1]], ..., [1, 2, 3]],
]


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
@pytest.mark.parametrize("key", ADVANCED_KEYS, ids=repr)
def test_advanced_indexing_matches_numpy(key, dtype, graph, rng):
    values = _data(rng, dtype)
    x = gc.input("x", SHAPE, dtype)
    y = x[key]
    expected = values[key]
    got = gc.evaluate(y, x=values)
    assert y.shape == expected.shape == got.shape
    assert got.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(got, expected)
    assert _op_of(y) in ("IndexingMultiAxisVec", "Transpose")  # Transpose: only after an empty ellipsis


def test_numpy_placement_rule_shapes(graph):
    a, b, c = SHAPE
    x = gc.input("x", SHAPE)
    assert x[:, [0, 1]].shape == (a, 2, c)
    assert x[:, 0, [1, 2]].shape == (a, 2)
    assert x[0, :, [1, 2]].shape == (2, b)
    assert x[[0, 1], :, [[1], [2], [3]]].shape == (3, 2, b)
    assert x[:, :, [[1, 2]]].shape == (a, b, 1, 2)
    x4 = gc.input("x4", (2, 3, 4, 5))
    assert x4[:, [0, 1], :, [1, 2]].shape == (2, 2, 4)      # not consecutive: the block goes first
    assert x4[:, [0, 1], [1, 2]].shape == (2, 2, 5)         # consecutive: it stays at axis 1
    assert x4[1:, 0, 1:, [[1], [2]]].shape == (2, 1, 1, 3)  # an int counts as an index array


FOUR_D_KEYS = [np.s_[:, [0, 1, 2], :, [1, 2, 3]], np.s_[:, [0, 2], 1, 1:4], np.s_[1:, 0, ::-1, [[1], [4]]],
               np.s_[..., [0, 0], :, [3]], np.s_[None, :, [2, 1], None, 2:, [0, -1]]]


@pytest.mark.parametrize("key", FOUR_D_KEYS, ids=repr)
def test_placement_in_four_dims_matches_numpy(key, graph, rng):
    values = rng.standard_normal((2, 3, 4, 5))
    x = gc.input("x", values.shape, "float64")
    y = x[key]
    expected = values[key]
    assert y.shape == expected.shape
    np.testing.assert_array_equal(gc.evaluate(y, x=values), expected)


@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
def test_index_tensors_with_negatives_and_broadcasting(index_dtype, graph, rng):
    values = _data(rng, "float64")
    rows = np.array([[0], [-1], [2]], index_dtype)
    cols = np.array([5, -6, 0, 0], index_dtype)
    x = gc.input("x", SHAPE, "float64")
    r = gc.input("r", rows.shape, index_dtype)
    c = gc.input("c", cols.shape, index_dtype)
    outs = [x[r], x[r, :, c], x[1:, r, c], x[:, r[0]], x[-1, 1::2, c]]
    got = gc.evaluate(outs, x=values, r=rows, c=cols)
    expected = [values[rows], values[rows, :, cols], values[1:, rows, cols], values[:, rows[0]],
                values[-1, 1::2, cols]]
    for t, g, e in zip(outs, got, expected):
        assert t.shape == e.shape
        np.testing.assert_array_equal(g, e)


def test_zero_index_tensor_counts_as_advanced(graph, rng):
    values = _data(rng, "float64")
    x = gc.input("x", SHAPE, "float64")
    i = gc.input("i", (), "int64")
    y = x[:, i, [1, 2]]
    z = x[i, :, [1, 2]]
    got = gc.evaluate([y, z], x=values, i=np.array(-2))
    np.testing.assert_array_equal(got[0], values[:, -2, [1, 2]])
    np.testing.assert_array_equal(got[1], values[-2, :, [1, 2]])


@pytest.mark.parametrize("key", [np.s_[:, 1], np.s_[1:, ::-1], np.s_[:, [0, 2, 2]], np.s_[[], 1],
                                 np.s_[..., 1:], np.s_[None, :, 0]], ids=repr)
def test_size_zero_dims(key, graph):
    values = np.zeros((0, 3, 2), np.float32)
    x = gc.input("x", values.shape)
    y = x[key]
    expected = values[key]
    assert y.shape == expected.shape
    assert gc.evaluate(y, x=values).shape == expected.shape


def test_index_into_an_empty_axis_with_an_empty_tensor(graph):
    values = np.zeros((3, 0), np.float64)
    x = gc.input("x", values.shape, "float64")
    idx = gc.input("idx", (0,), "int32")
    y = x[:, idx]
    assert y.shape == (3, 0)
    assert gc.evaluate(y, x=values, idx=np.zeros(0, np.int32)).shape == (3, 0)


def test_equal_regions_give_equal_ops(graph):
    x = gc.input("x", SHAPE)
    assert x[1:3].node.op == x[1:3:1].node.op == x[-3:-1].node.op
    assert x[7:].node.op == x[5:2].node.op  # every empty slice is stored one way
    assert x[:, -1].node.op == Subtensor((IndexItem(1, 4),))
    assert x[::-2].node.op == Subtensor((SliceItem(0, 3, -2, 2),))


RANDOM_SHAPE = (2, 3, 4, 5)
random_keys = st.lists(
    st.one_of(
        st.integers(-5, 4),
        st.builds(slice, st.none() | st.integers(-7, 7), st.none() | st.integers(-7, 7),
                  st.none() | st.sampled_from([-3, -2, -1, 1, 2, 3])),
        st.lists(st.integers(-5, 4), min_size=1, max_size=3),  # empty lists: tested above, and see
        st.none(),                                              # test_out_of_range_int_is_a_shape_error
    ),
    max_size=4,
)


@given(entries=random_keys, ellipsis_at=st.integers(0, 5))
def test_random_keys_match_numpy(entries, ellipsis_at):
    """Any key numpy accepts gives numpy's values; any key numpy rejects is a ShapeError."""
    values = np.arange(np.prod(RANDOM_SHAPE), dtype=np.float64).reshape(RANDOM_SHAPE)
    entries = list(entries)
    if ellipsis_at < len(entries):
        entries.insert(ellipsis_at, Ellipsis)
    key = tuple(np.asarray(e, dtype=np.int64) if isinstance(e, list) else e for e in entries)
    with gc.Graph("random_key") as g:
        x = gc.input("x", values.shape, "float64")
        try:
            expected = values[key]
        except IndexError:  # out of range, too many indices, arrays that do not broadcast
            with pytest.raises(ShapeError):
                x[key]
            return
        y = x[key]
    gc.verify(g)
    got = gc.evaluate(y, x=values)
    assert y.shape == expected.shape
    np.testing.assert_array_equal(got, expected)


@given(entries=random_keys, ellipsis_at=st.integers(0, 5))
def test_random_keys_index_add_matches_add_at(entries, ellipsis_at):
    values = np.arange(np.prod(RANDOM_SHAPE), dtype=np.float64).reshape(RANDOM_SHAPE)
    entries = [e for e in entries if e is not None]
    if ellipsis_at < len(entries):
        entries.insert(ellipsis_at, Ellipsis)
    key = tuple(np.asarray(e, dtype=np.int64) if isinstance(e, list) else e for e in entries)
    try:
        region = values[key]
    except IndexError:
        return
    update = np.arange(region.size, dtype=np.float64).reshape(region.shape) * 1000.0
    expected = values.copy()
    np.add.at(expected, key, update)
    with gc.Graph("random_add") as g:
        x = gc.input("x", values.shape, "float64")
        v = gc.input("v", region.shape, "float64")
        y = gc.index_add(x, key, v)
    gc.verify(g)
    np.testing.assert_array_equal(gc.evaluate(y, x=values, v=update), expected)


# -- index_update / index_add --------------------------------------------------------------

UPDATE_KEYS = [np.s_[1], np.s_[::-2, 1:4], np.s_[..., -1], np.s_[:, [0, 3], 1:3], np.s_[[2, 0], :, [1, 5]],
               np.s_[MASK], np.s_[...], np.s_[:, [[0], [3]], ..., [1, 5, 2]]]


@pytest.mark.parametrize("dtype", ["float64", "int32"])
@pytest.mark.parametrize("key", UPDATE_KEYS, ids=repr)
def test_index_update_and_add_without_repeats_match_numpy(key, dtype, graph, rng):
    values = _data(rng, dtype)
    region_shape = values[key].shape
    update = _data(rng, dtype, region_shape)
    x = gc.input("x", SHAPE, dtype)
    v = gc.input("v", region_shape, dtype)
    set_y, add_y = gc.index_update(x, key, v), gc.index_add(x, key, v)
    got_set, got_add = gc.evaluate([set_y, add_y], x=values, v=update)
    expected_set, expected_add = values.copy(), values.copy()
    expected_set[key] = update
    expected_add[key] += update
    np.testing.assert_array_equal(got_set, expected_set)
    np.testing.assert_array_equal(got_add, expected_add)
    assert got_set.dtype == got_add.dtype == np.dtype(dtype)


def test_update_value_is_broadcast_to_the_region(graph, rng):
    values = _data(rng, "float64")
    row = rng.standard_normal(6)
    x = gc.input("x", SHAPE, "float64")
    r = gc.input("r", (6,), "float64")
    outs = [gc.index_update(x, np.s_[1:3], r), gc.index_update(x, np.s_[:, [0, 0, 4]], 2.5),
            gc.index_add(x, np.s_[0, [1, 1]], r), gc.index_update(x, np.s_[1], gc.reshape(r, (1, 1, 6)))]
    got = gc.evaluate(outs, x=values, r=row)
    e0, e1, e2, e3 = values.copy(), values.copy(), values.copy(), values.copy()
    e0[1:3] = row
    e1[:, [0, 4]] = 2.5
    e2[0, 1] += row
    e2[0, 1] += row
    e3[1] = row
    for g, e in zip(got, [e0, e1, e2, e3]):
        np.testing.assert_array_equal(g, e)


ROWS = np.array([[3, 1, 3], [3, 3, 0]])
COLS = np.array([2, 2, -1])


def _repeated_index_block(update_op, dtype, rng):
    """`update_op(x, (rows, :, cols), v)` with repeated positions, evaluated: (x, v, result)."""
    values = _data(rng, dtype)
    update = _data(rng, dtype, (2, 3, 5))
    x = gc.input("x", SHAPE, dtype)
    v = gc.input("v", update.shape, dtype)
    r = gc.input("r", ROWS.shape, "int64")
    y = update_op(x, (r, slice(None), COLS), v)
    return values, update, gc.evaluate(y, x=values, v=update, r=ROWS)


@pytest.mark.parametrize("dtype", ["float64", "int64"])
def test_index_add_accumulates_repeats_like_add_at(dtype, graph, rng):
    values, update, got = _repeated_index_block(gc.index_add, dtype, rng)
    expected = values.copy()
    np.add.at(expected, (ROWS, slice(None), COLS), update)
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_index_update_with_repeats_last_write_in_row_major_order_wins(dtype, graph, rng):
    values, update, got = _repeated_index_block(gc.index_update, dtype, rng)
    expected = values.copy()
    for i, j in np.ndindex(ROWS.shape):  # row-major walk over the index block
        expected[ROWS[i, j], :, COLS[j]] = update[i, j]
    np.testing.assert_array_equal(got, expected)


def test_set_op_direct_with_repeats(graph):
    data = np.zeros((3, 2))
    value = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    d = gc.input("d", data.shape, "float64")
    v = gc.input("v", value.shape, "float64")
    i = gc.input("i", (3,), "int32")
    y = gc.apply(IndexingSetMultiAxisVec((TensorItem(0),)), d, v, i)
    got = gc.evaluate(y, d=data, v=value, i=np.array([2, 0, -1], np.int32))
    np.testing.assert_array_equal(got, [[3.0, 4.0], [0.0, 0.0], [5.0, 6.0]])


# -- one-hot -------------------------------------------------------------------------------

def test_indexing_one_hot_matches_fancy_indexing(graph, rng):
    src = rng.standard_normal((3, 4, 2))
    index = np.array([[0, 3], [2, 2], [1, 0]], np.int32)
    s = gc.input("s", src.shape, "float64")
    i = gc.input("i", index.shape, "int32")
    y = gc.indexing_one_hot(s, i, axis=1)
    k = gc.indexing_one_hot(s, i, axis=-2, keepdims=True)
    got, got_keep = gc.evaluate([y, k], s=src, i=index)
    a, c = np.ix_(np.arange(3), np.arange(2))
    np.testing.assert_array_equal(got, src[a, index, c])
    np.testing.assert_array_equal(got_keep, src[a, index, c][:, None, :])


def test_indexing_set_one_hot_matches_fancy_assignment(graph, rng):
    data = rng.standard_normal((3, 5))
    index = np.array([4, 0, 2], np.int64)
    sub = rng.standard_normal(3)
    d = gc.input("d", data.shape, "float64")
    i = gc.input("i", index.shape, "int64")
    s = gc.input("s", sub.shape, "float64")
    y = gc.indexing_set_one_hot(d, i, s)
    y_keep = gc.indexing_set_one_hot(d, i, gc.expand_dims(s, 1), axis=1)
    got, got_keep = gc.evaluate([y, y_keep], d=data, i=index, s=sub)
    expected = data.copy()
    expected[np.arange(3), index] = sub
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got_keep, expected)


# -- build-time errors ---------------------------------------------------------------------

def _assert_build_error(cls, op_name, build):
    """`build` (a one-line lambda) raises `cls` naming the op and the lambda's own line."""
    with pytest.raises(cls) as info:
        build()
    message = str(info.value)
    assert op_name in message
    assert f"{HERE}:{build.__code__.co_firstlineno}" in message
    return message


def test_float_index_is_a_dtype_error(graph):
    x = gc.input("x", SHAPE)
    message = _assert_build_error(DTypeError, "Subtensor", lambda: x[1.5])
    assert "1.5" in message
    _assert_build_error(DTypeError, "Subtensor", lambda: x[:, 0.0:2])
    _assert_build_error(DTypeError, "IndexingMultiAxisVec", lambda: x[[0, 1], 2.0])
    _assert_build_error(DTypeError, "IndexingMultiAxisVec", lambda: x[np.array([0.0, 1.0])])


def test_float_or_narrow_int_index_tensor_is_a_dtype_error(graph):
    x = gc.input("x", SHAPE)
    f = gc.input("f", (2,), "float32")
    h = gc.input("h", (2,), "int16")
    _assert_build_error(DTypeError, "IndexingMultiAxisVec", lambda: x[f])
    _assert_build_error(DTypeError, "IndexingMultiAxisVec", lambda: x[:, h])


def test_too_many_indices_is_a_shape_error_naming_the_shape(graph):
    x = gc.input("x", SHAPE)
    message = _assert_build_error(ShapeError, "Subtensor", lambda: x[0, 0, 0, 0])
    assert str(SHAPE) in message
    _assert_build_error(ShapeError, "Subtensor", lambda: x[:, :, :, None, :])
    _assert_build_error(ShapeError, "IndexingMultiAxisVec", lambda: x[MASK, :, 1])
    s = gc.input("s", ())
    _assert_build_error(ShapeError, "Subtensor", lambda: s[0])
    _assert_build_error(ShapeError, "Subtensor", lambda: s[1:])
    v = gc.input("v", (3,))
    _assert_build_error(ShapeError, "Subtensor", lambda: v[:, ::2])


def test_out_of_range_int_is_a_shape_error(graph):
    x = gc.input("x", SHAPE)
    message = _assert_build_error(ShapeError, "Subtensor", lambda: x[:, 5])
    assert "5" in message and "size 5" in message
    _assert_build_error(ShapeError, "Subtensor", lambda: x[-5])
    _assert_build_error(ShapeError, "IndexingMultiAxisVec", lambda: x[[0, 4]])
    _assert_build_error(ShapeError, "IndexingMultiAxisVec", lambda: x[:, [-6]])
    _assert_build_error(ShapeError, "IndexingMultiAxisVec", lambda: x[6, [0]])
    before = len(graph)
    _assert_build_error(ShapeError, "IndexingMultiAxisVec", lambda: x[None, [0], 7])
    assert len(graph) == before  # a rejected key leaves no node behind
    # numpy skips the range check when the broadcast index block is empty; we do not
    _assert_build_error(ShapeError, "IndexingMultiAxisVec", lambda: x[[9], []])
    empty = gc.input("empty", (0, 3))
    _assert_build_error(ShapeError, "IndexingMultiAxisVec", lambda: empty[[0]])
    _assert_build_error(ShapeError, "Subtensor", lambda: empty[-1])


def test_bool_tensor_mask_says_the_shape_would_be_dynamic(graph):
    x = gc.input("x", SHAPE)
    mask = x > 0.0
    message = _assert_build_error(ShapeError, "IndexingMultiAxisVec", lambda: x[mask])
    assert "depends on the data" in message


def test_other_malformed_keys(graph):
    x = gc.input("x", SHAPE)
    _assert_build_error(ShapeError, "Subtensor", lambda: x[::0])
    _assert_build_error(ShapeError, "Subtensor", lambda: x[..., 0, ...])
    _assert_build_error(ShapeError, "IndexingMultiAxisVec", lambda: x[MASK[:3]])
    _assert_build_error(DTypeError, "Subtensor", lambda: x["a"])
    _assert_build_error(DTypeError, "Subtensor", lambda: x[True])
    _assert_build_error(DTypeError, "IndexingMultiAxisVec", lambda: x[[x, x]])
    i = gc.input("i", (), "int32")
    _assert_build_error(DTypeError, "Subtensor", lambda: x[i:3])


def test_index_tensors_that_do_not_broadcast(graph):
    x = gc.input("x", SHAPE)
    _assert_build_error(ShapeError, "IndexingMultiAxisVec", lambda: x[[0, 1], [0, 1, 2]])


def test_update_errors(graph):
    x = gc.input("x", SHAPE)
    v = gc.input("v", (3,))
    w = gc.input("w", (6,), "float64")
    _assert_build_error(ShapeError, "SetSubtensor", lambda: gc.index_update(x, np.s_[0], v))
    _assert_build_error(ShapeError, "IndexingIncrMultiAxisVec", lambda: gc.index_add(x, np.s_[[0, 1]], v))
    _assert_build_error(DTypeError, "SetSubtensor", lambda: gc.index_update(x, np.s_[0, 0], w))
    _assert_build_error(ShapeError, "IndexingSetMultiAxisVec", lambda: gc.index_update(x, np.s_[None, [0]], 1.0))


def test_op_level_checks(graph):
    x = gc.input("x", SHAPE)
    i = gc.input("i", (2,), "int32")
    with pytest.raises(ShapeError, match="Subtensor"):
        gc.apply(Subtensor((IndexItem(1, 5),)), x)
    with pytest.raises(ShapeError, match="Subtensor"):
        gc.apply(Subtensor((SliceItem(0, 2, 1, 3),)), x)
    with pytest.raises(ShapeError, match="increasing order"):
        gc.apply(Subtensor((IndexItem(1, 0), IndexItem(0, 0))), x)
    with pytest.raises(ShapeError, match="SetSubtensor"):
        gc.apply(SetSubtensor((IndexItem(0, 0),)), x, x)
    with pytest.raises(GraphError, match="IndexingMultiAxisVec"):
        gc.apply(IndexingMultiAxisVec((TensorItem(0), TensorItem(1))), x, i)
    with pytest.raises(GraphError, match="IndexingMultiAxisVec"):
        gc.apply(IndexingMultiAxisVec((SliceItem(0, 0, 1, 2),)), x)


def test_one_hot_errors(graph):
    s = gc.input("s", (3, 4))
    i = gc.input("i", (3,), "int32")
    f = gc.input("f", (3,), "float32")
    _assert_build_error(DTypeError, "IndexingOneHot", lambda: gc.indexing_one_hot(s, f))
    _assert_build_error(ShapeError, "IndexingOneHot", lambda: gc.indexing_one_hot(s, i, axis=0))
    _assert_build_error(ShapeError, "IndexingSetOneHot", lambda: gc.indexing_set_one_hot(s, i, gc.zeros((3, 2))))
    _assert_build_error(DTypeError, "IndexingSetOneHot",
                        lambda: gc.indexing_set_one_hot(s, i, gc.zeros((3,), "float64")))


# -- run-time range checks -------------------------------------------------------------------

@pytest.mark.parametrize("bad", [5, -6, 17])
def test_out_of_range_index_tensor_raises_at_run_time(bad, graph, rng):
    values = _data(rng, "float32")
    x = gc.input("x", SHAPE)
    i = gc.input("i", (3,), "int32")
    v = gc.input("v", (4, 3, 6))
    cases = [(x[:, i], {}), (gc.index_add(x, np.s_[:, i], v), {"v": np.zeros((4, 3, 6), np.float32)}),
             (gc.index_update(x, np.s_[:, i], v), {"v": np.zeros((4, 3, 6), np.float32)})]
    for y, value_feed in cases:
        feeds = dict(x=values, i=np.array([0, bad, 1], np.int32), **value_feed)
        with pytest.raises(IndexOutOfRangeError) as info:
            gc.evaluate(y, feeds)
        message = str(info.value)
        assert type(y.node.op).__name__ in message
        assert str(bad) in message and "size 5" in message and "axis 1" in message


def test_one_hot_rejects_negative_indices_at_run_time(graph, rng):
    s = gc.input("s", (2, 3))
    i = gc.input("i", (2,), "int32")
    y = gc.indexing_one_hot(s, i)
    with pytest.raises(IndexOutOfRangeError, match="IndexingOneHot: index value -1"):
        gc.evaluate(y, s=np.zeros((2, 3), np.float32), i=np.array([0, -1], np.int32))
