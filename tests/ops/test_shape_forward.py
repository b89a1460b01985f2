"""Forward values of the shape ops: Reshape, Broadcast, AddAxis, RemoveAxis,
Transpose, Concat and FastpathCopy (op-reference §1, §4), against numpy.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import DTypeError, ShapeError
from gradcompiler.ops.shape import AddAxis, FastpathCopy, RemoveAxis, Reshape

COVERS = {"Reshape", "Broadcast", "AddAxis", "RemoveAxis", "Transpose", "Concat", "FastpathCopy"}


@pytest.fixture
def graph():
    with gc.Graph("shape_forward") as g:
        yield g
    gc.verify(g)


@pytest.fixture
def x234(rng):
    return rng.standard_normal((2, 3, 4)).astype(np.float32)


# -- Reshape ---------------------------------------------------------------------

@pytest.mark.parametrize("target", [(4, 6), (24,), (-1,), (2, -1, 2), (6, -1), (1, 2, 12, 1), (-1, 1, 4)],
                         ids=str)
def test_reshape_matches_numpy(target, graph, x234):
    x = gc.input("x", x234.shape)
    y = gc.reshape(x, target)
    expected = x234.reshape(target)
    assert y.shape == expected.shape
    np.testing.assert_array_equal(gc.evaluate(y, x=x234), expected)


def test_reshape_method_forms_and_flatten(graph, x234):
    x = gc.input("x", x234.shape)
    outs = [x.reshape(4, 6), x.reshape((3, -1)), x.reshape(-1), x.flatten()]
    got = gc.evaluate(outs, x=x234)
    for g, e in zip(got, [x234.reshape(4, 6), x234.reshape(3, -1), x234.ravel(), x234.ravel()]):
        np.testing.assert_array_equal(g, e)


def test_reshape_to_and_from_scalars_and_empty(graph):
    one = gc.input("one", (1, 1))
    empty = gc.input("empty", (0, 3))
    s = gc.reshape(one, ())
    back = gc.reshape(s, (1, 1, 1))
    e = gc.reshape(empty, (3, 0, 1))
    e2 = gc.reshape(empty, (-1, 6))
    got = gc.evaluate([s, back, e, e2], one=np.full((1, 1), 2.5, np.float32), empty=np.zeros((0, 3), np.float32))
    assert got[0].shape == () and got[0] == 2.5
    assert got[1].shape == (1, 1, 1)
    assert got[2].shape == (3, 0, 1) and got[3].shape == (0, 6)


def test_reshape_to_same_shape_builds_nothing(graph):
    x = gc.input("x", (2, 3))
    assert gc.reshape(x, (2, -1)) is x


@pytest.mark.parametrize("target, message", [
    ((-1, -1), "more than one -1"),
    ((5, 5), r"cannot reshape \(2, 3, 4\)"),
    ((5, -1), r"cannot reshape \(2, 3, 4\)"),
    ((0, -1), r"cannot reshape \(2, 3, 4\)"),
    ((4, -2, 3), "negative size"),
    ((2.0, 12), "must hold ints"),
], ids=str)
def test_reshape_errors(target, message, graph):
    x = gc.input("x", (2, 3, 4))
    with pytest.raises(ShapeError, match=f"Reshape.*{message}"):
        gc.reshape(x, target)


def test_reshape_op_checks_size(graph):
    x = gc.input("x", (2, 3))
    with pytest.raises(ShapeError, match=r"cannot reshape \(2, 3\) \(6 elements\) to \(7,\)"):
        gc.apply(Reshape((7,)), x)


# -- Broadcast ---------------------------------------------------------------------

@pytest.mark.parametrize("shape, target", [
    ((3, 1), (2, 3, 4)), ((4,), (3, 4)), ((), (2, 3)), ((1,), (5,)), ((2, 1, 3), (2, 4, 3)),
    ((3, 1), (3, 0)),
], ids=str)
def test_broadcast_to_matches_numpy(shape, target, graph, rng):
    values = rng.standard_normal(shape).astype(np.float32)
    x = gc.input("x", shape)
    y = gc.broadcast_to(x, target)
    assert y.shape == target
    np.testing.assert_array_equal(gc.evaluate(y, x=values), np.broadcast_to(values, target))


def test_broadcast_none_keeps_the_dim(graph, rng):
    values = rng.standard_normal((3, 1)).astype(np.float32)
    x = gc.input("x", (3, 1))
    y = gc.broadcast_to(x, (2, None, 4))
    z = x.broadcast_to((None, 5))
    assert y.shape == (2, 3, 4) and z.shape == (3, 5)
    got_y, got_z = gc.evaluate([y, z], x=values)
    np.testing.assert_array_equal(got_y, np.broadcast_to(values, (2, 3, 4)))
    np.testing.assert_array_equal(got_z, np.broadcast_to(values, (3, 5)))


@pytest.mark.parametrize("shape, target, message", [
    ((3,), (4,), r"cannot broadcast \(3,\) to \(4,\)"),
    ((2, 3), (3,), "lower-rank"),
    ((3, 1), (2, 4, 4), r"cannot broadcast \(3, 1\)"),
    ((3,), (-1, 3), "negative size"),
    ((3,), (2.7, 3), "must be a tuple of ints"),
], ids=str)
def test_broadcast_errors(shape, target, message, graph):
    x = gc.input("x", shape)
    with pytest.raises(ShapeError, match=f"Broadcast.*{message}"):
        gc.broadcast_to(x, target)


# -- AddAxis / RemoveAxis ------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3, (0, 2), (-1, 0), (1, 3), (0, 1, 2, 3)], ids=str)
def test_expand_dims_matches_numpy(axis, graph, rng):
    values = rng.standard_normal((2, 3)).astype(np.float32)
    x = gc.input("x", (2, 3))
    y = gc.expand_dims(x, axis)
    expected = np.expand_dims(values, axis)
    assert y.shape == expected.shape
    np.testing.assert_array_equal(gc.evaluate(y, x=values), expected)


def test_add_axis_op_inserts_one_after_another(graph):
    # list order, each position against the tensor as it is at that step (op-reference §4.2)
    x = gc.input("x", (2, 3))
    assert gc.apply(AddAxis((2, 0)), x).shape == (1, 2, 3, 1)
    assert gc.apply(AddAxis((0, 0)), x).shape == (1, 1, 2, 3)


@pytest.mark.parametrize("axis", [3, -4, (0, 0)], ids=str)
def test_expand_dims_errors(axis, graph):
    x = gc.input("x", (2, 3))
    with pytest.raises(ShapeError, match="AddAxis"):
        gc.expand_dims(x, axis)


@pytest.mark.parametrize("shape, axis", [
    ((1, 5, 1, 7), None), ((1, 5, 1, 7), 0), ((1, 5, 1, 7), (0, 2)), ((1, 5, 1, 7), (2, 0)),
    ((1, 5, 1, 7), -2), ((3, 1, 1), (1, 2)), ((1,), 0), ((1, 1), None), ((2, 3), None),
], ids=str)
def test_squeeze_matches_numpy(shape, axis, graph, rng):
    values = rng.standard_normal(shape).astype(np.float32)
    x = gc.input("x", shape)
    y = gc.squeeze(x, axis)
    expected = np.squeeze(values, axis)
    assert y.shape == expected.shape
    np.testing.assert_array_equal(gc.evaluate(y, x=values), expected)


def test_remove_axis_op_removes_one_after_another(graph, rng):
    values = rng.standard_normal((1, 5, 1, 7)).astype(np.float32)
    x = gc.input("x", (1, 5, 1, 7))
    y = gc.apply(RemoveAxis((2, 0)), x)
    np.testing.assert_array_equal(gc.evaluate(y, x=values), values[0, :, 0, :])
    with pytest.raises(ShapeError, match="cannot remove axis 2 of size 7"):
        gc.apply(RemoveAxis((0, 2)), x)  # after removing 0 the shape is (5, 1, 7)


def test_squeeze_passes_shifted_positions(graph):
    # the frontend sorts the positions p_i and passes r_i = p_i - i (op-reference §4.3)
    x = gc.input("x", (1, 5, 1, 7))
    y = gc.squeeze(x, (2, 0))
    assert y.node.op == RemoveAxis((0, 1))
    assert y.node.op.original_positions(4) == (0, 2)


@pytest.mark.parametrize("axis, message", [(1, "size 5"), (4, "out of range"), (-5, "out of range")],
                         ids=str)
def test_squeeze_errors(axis, message, graph):
    x = gc.input("x", (1, 5, 1, 7))
    with pytest.raises(ShapeError, match=f"RemoveAxis.*{message}"):
        gc.squeeze(x, axis)


# -- Transpose --------------------------------------------------------------------------

@pytest.mark.parametrize("perm", [(2, 0, 1), (1, 0, 2), (0, 2, 1), None, (-1, 0, 1)], ids=str)
def test_transpose_matches_numpy(perm, graph, x234):
    x = gc.input("x", x234.shape)
    y = gc.transpose(x, perm)
    expected = np.transpose(x234, perm)
    assert y.shape == expected.shape
    np.testing.assert_array_equal(gc.evaluate(y, x=x234), expected)


def test_transpose_methods_and_swapaxes(graph, x234):
    x = gc.input("x", x234.shape)
    outs = [x.T, x.transpose(1, 2, 0), x.transpose((2, 1, 0)), gc.swapaxes(x, 0, -1)]
    expected = [x234.T, x234.transpose(1, 2, 0), x234.transpose(2, 1, 0), np.swapaxes(x234, 0, -1)]
    for g, e in zip(gc.evaluate(outs, x=x234), expected):
        np.testing.assert_array_equal(g, e)


@pytest.mark.parametrize("perm", [(0, 1), (0, 1, 1), (0, 1, 3)], ids=str)
def test_transpose_errors(perm, graph):
    x = gc.input("x", (2, 3, 4))
    with pytest.raises(ShapeError, match="Transpose"):
        gc.transpose(x, perm)


# -- Concat ------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, 2, -1, -3])
def test_concat_matches_numpy(axis, graph, rng):
    shapes = [[2, 3, 4], [2, 3, 4], [2, 3, 4]]
    for s, extra in zip(shapes, (1, 2, 3)):
        s[axis] = extra
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    xs = [gc.input(f"x{i}", a.shape) for i, a in enumerate(arrays)]
    y = gc.concat(xs, axis)
    expected = np.concatenate(arrays, axis)
    assert y.shape == expected.shape
    np.testing.assert_array_equal(gc.evaluate(y, {f"x{i}": a for i, a in enumerate(arrays)}), expected)


def test_concat_single_empty_and_int(graph):
    a = np.arange(6, dtype=np.int32).reshape(2, 3)
    xa = gc.input("a", (2, 3), "int32")
    xe = gc.input("e", (0, 3), "int32")
    one, with_empty = gc.evaluate([gc.concat([xa]), gc.concat([xe, xa, xe])], a=a, e=np.zeros((0, 3), np.int32))
    np.testing.assert_array_equal(one, a)
    np.testing.assert_array_equal(with_empty, a)
    assert with_empty.dtype == np.int32


def test_concat_errors(graph):
    a, b = gc.input("a", (2, 3)), gc.input("b", (3, 4))
    with pytest.raises(ShapeError, match=r"Concat.*\(2, 3\), \(3, 4\)"):
        gc.concat([a, b], 0)
    with pytest.raises(ShapeError, match="Concat"):
        gc.concat([a, gc.input("c", (2,))], 0)  # no broadcasting
    with pytest.raises(DTypeError, match="Concat"):
        gc.concat([a, gc.input("d", (2, 3), "float64")], 0)
    with pytest.raises(ShapeError, match="axis 2 is out of range"):
        gc.concat([a, a], 2)
    with pytest.raises(ShapeError, match="0-d"):
        gc.concat([gc.input("s", ()), gc.input("t", ())])
    with pytest.raises(ShapeError, match="at least one"):
        gc.concat([])


# -- FastpathCopy --------------------------------------------------------------------------

def test_fastpath_copy_is_a_fresh_identity(graph, x234):
    x = gc.input("x", x234.shape)
    y = gc.apply(FastpathCopy(), x)
    assert y.id != x.id and y.type == x.type
    got = gc.evaluate(y, x=x234)
    np.testing.assert_array_equal(got, x234)
    assert not np.shares_memory(got, x234)
