"""Graph sources (placeholders, constants, zeros/full) and the build-time
contract of the frontend: roles, names, feeds, weak scalars, and clear
errors that point at the user's own line.
"""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import FeedError, GraphError, ShapeError
from gradcompiler.ops.source import Constant, Fill, Placeholder

COVERS = {"Placeholder", "Constant", "Fill"}
HERE = os.path.abspath(__file__)


def next_line() -> int:
    """The line after the caller's: where the statement under test sits."""
    return inspect.currentframe().f_back.f_lineno + 1


@pytest.fixture
def graph():
    with gc.Graph("frontend_build") as g:
        yield g
    gc.verify(g)


def test_placeholders_roles_names_and_types(graph):
    x = gc.input("x", (2, 3))
    w = gc.param("w", 4, "float64")
    lab = gc.input("lab", (2,), "int32")
    assert x.node.role == "input" and w.node.role == "param"
    assert x.name == "x" and x.shape == (2, 3) and x.dtype == np.float32
    assert w.shape == (4,) and w.dtype == np.float64
    assert lab.dtype == np.int32
    assert graph.feed_names == {"x": x.id, "w": w.id, "lab": lab.id}
    assert [n.id for n in graph.feeds()] == [x.id, w.id, lab.id]
    assert isinstance(x.node.op, Placeholder) and x.node.op.feed_name == "x"


def test_placeholders_of_equal_type_are_distinct_ops(graph):
    a, b = gc.input("a", (2,)), gc.input("b", (2,))
    assert a.node.op != b.node.op


def test_evaluate_returns_the_feeds(graph, rng):
    values = rng.standard_normal((2, 3)).astype(np.float32)
    x = gc.input("x", (2, 3))
    got = gc.evaluate(x, x=values)
    np.testing.assert_array_equal(got, values)
    assert gc.evaluate([x], {"x": values})[0].dtype == np.float32


def test_constants_hold_a_copy(graph):
    source = np.array([[1.0, 2.0], [3.0, 4.0]])
    c = gc.constant(source)
    source[0, 0] = 99.0
    s = gc.constant(3, "int32")
    f = gc.constant([1.5, 2.5], "float32", name="f")
    assert c.node.role == "const" and isinstance(c.node.op, Constant)
    assert c.dtype == np.float64 and s.shape == () and s.dtype == np.int32 and f.name == "f"
    got_c, got_s, got_f = gc.evaluate([c, s, f])
    np.testing.assert_array_equal(got_c, [[1.0, 2.0], [3.0, 4.0]])
    assert got_s == 3 and got_s.dtype == np.int32
    np.testing.assert_array_equal(got_f, np.array([1.5, 2.5], np.float32))


def test_zeros_and_full(graph):
    z = gc.zeros((2, 3))
    f = gc.full(4, 2.5, "float64")
    i = gc.full((2,), 7, "int32")
    e = gc.zeros((0, 2))
    for t in (z, f, i, e):
        assert t.node.role == "const" and isinstance(t.node.op, Fill)
    got_z, got_f, got_i, got_e = gc.evaluate([z, f, i, e])
    np.testing.assert_array_equal(got_z, np.zeros((2, 3), np.float32))
    assert got_z.dtype == np.float32
    np.testing.assert_array_equal(got_f, np.full(4, 2.5))
    np.testing.assert_array_equal(got_i, np.array([7, 7], np.int32))
    assert got_e.shape == (0, 2)


def test_array_and_list_operands_become_constants(graph, rng):
    values = rng.standard_normal((2, 3))
    x = gc.input("x", (2, 3), "float64")
    w = np.arange(3.0)
    y = x * w
    z = x + [1.0, 2.0, 3.0]
    kinds = {type(graph[i].op) for i in y.node.inputs}
    assert kinds == {Placeholder, Constant}
    got_y, got_z = gc.evaluate([y, z], x=values)
    np.testing.assert_array_equal(got_y, values * w)
    np.testing.assert_array_equal(got_z, values + [1.0, 2.0, 3.0])


def test_nodes_record_name_and_call_site(graph):
    x = gc.input("x", (2,))
    line = next_line()
    y = gc.exp(x)
    z = gc.elemwise("EXP", x, name="named")
    assert y.node.site == f"{HERE}:{line}"
    assert z.name == "named" and z.node.role == "forward"


def test_duplicate_feed_names(graph):
    gc.input("x", (2,))
    with pytest.raises(GraphError, match="'x' is already used") as info:
        line = next_line()
        gc.param("x", (3,))
    assert f"{HERE}:{line}" in str(info.value)


@pytest.mark.parametrize("name", ["", None, 3])
def test_bad_feed_names(name, graph):
    with pytest.raises(GraphError, match="non-empty string"):
        gc.input(name, (2,))


def test_negative_placeholder_shape(graph):
    with pytest.raises(ShapeError, match="Placeholder.*negative"):
        gc.input("x", (2, -1))


@pytest.mark.parametrize("make", [lambda: gc.input("x", (2, 3.5)), lambda: gc.param("w", (True, 3)),
                                  lambda: gc.zeros((2, 2.5)), lambda: gc.full((2.0,), 1.0)],
                         ids=["input", "param", "zeros", "full"])
def test_non_integer_sizes_are_refused_not_truncated(make, graph):
    with pytest.raises(ShapeError, match="must be a tuple of ints"):
        make()


def test_numpy_integer_sizes_are_accepted(graph):
    assert gc.input("x", (np.int64(2), np.int32(3))).shape == (2, 3)
    assert gc.zeros(np.int64(4)).shape == (4,)


def test_building_without_an_open_graph():
    with pytest.raises(GraphError, match="no graph is open"):
        gc.input("x", (2,))


def test_operands_from_two_graphs():
    with gc.Graph("one") as g1:
        a = gc.input("a", (2,))
    with gc.Graph("two") as g2:
        b = gc.input("b", (2,))
        with pytest.raises(GraphError, match="different graphs") as info:
            line = next_line()
            a + b
        with pytest.raises(GraphError, match="different graphs"):
            gc.concat([a, b])
    assert f"{HERE}:{line}" in str(info.value)
    gc.verify(g1)
    gc.verify(g2)


def test_operands_of_a_closed_graph_still_build_there():
    with gc.Graph("closed") as g:
        a = gc.input("a", (2,), "float64")
    b = a * 2.0
    assert b.graph is g
    np.testing.assert_array_equal(gc.evaluate(b, a=np.array([1.0, 2.0])), [2.0, 4.0])
    gc.verify(g)


def test_symbolic_tensor_refuses_python_control_flow(graph):
    x = gc.input("x", (2,))
    with pytest.raises(TypeError, match="truth value"):
        bool(x)
    with pytest.raises(TypeError, match="iterated"):
        list(x)
    with pytest.raises(TypeError, match="!="):
        _ = x != 1.0
    with pytest.raises(TypeError, match="cannot use"):
        x + "a"
    assert len(x) == 2


def test_feed_errors(graph):
    x = gc.input("x", (2, 3))
    y = x * 2
    with pytest.raises(FeedError, match="missing feed"):
        gc.evaluate(y)
    with pytest.raises(FeedError, match="unexpected feed"):
        gc.evaluate(y, x=np.zeros((2, 3), np.float32), z=np.zeros(1))
    with pytest.raises(FeedError, match="dtype float64, expected float32"):
        gc.evaluate(y, x=np.zeros((2, 3)))
    with pytest.raises(FeedError, match=r"shape \(3, 2\), expected \(2, 3\)"):
        gc.evaluate(y, x=np.zeros((3, 2), np.float32))


def test_non_contiguous_feeds_are_read_correctly(graph, rng):
    values = rng.standard_normal((3, 2)).astype(np.float32)
    x = gc.input("x", (2, 3))
    np.testing.assert_array_equal(gc.evaluate(x + 0, x=values.T), values.T)


def test_zero_d_feeds_stay_zero_d(graph):
    s = gc.input("s", (), "float64")
    v = gc.input("v", (3,), "float64")
    fed, scaled = gc.evaluate([s, s * v], s=np.float64(2.0), v=np.arange(3.0))
    assert fed.shape == () and fed == 2.0
    assert scaled.shape == (3,)
    np.testing.assert_array_equal(gc.evaluate(-s, s=np.array(1.5)), -1.5)
    assert gc.evaluate(-s, s=np.array(1.5)).shape == ()


def _raises_at_line(fn_and_line):
    fn, line = fn_and_line
    with pytest.raises(ShapeError) as info:
        fn()
    assert f"{HERE}:{line}" in str(info.value), str(info.value)


def test_frontend_argument_errors_point_at_the_user_line(graph):
    x = gc.input("x", (2, 3))
    cases = []
    cases.append((lambda: gc.reshape(x, (-1, -1)), next_line() - 1))
    cases.append((lambda: x.sum(axis=5), next_line() - 1))
    cases.append((lambda: gc.expand_dims(x, 7), next_line() - 1))
    cases.append((lambda: gc.squeeze(x, 4), next_line() - 1))
    cases.append((lambda: gc.transpose(x, (0, 5)), next_line() - 1))
    cases.append((lambda: gc.swapaxes(x, 0, 3), next_line() - 1))
    cases.append((lambda: gc.concat([x, x], 3), next_line() - 1))
    cases.append((lambda: x.reshape(7), next_line() - 1))
    for case in cases:
        _raises_at_line(case)
