"""Gradients of the indexing family (op-reference §6.3, §6.4, §7.4, §8) and of
Concat (whose rule slices `g` through `x[...]`): every (op, differentiable
input) pair against float64 finite differences (`gc.check_grads`), repeated
indices included, a second-order set that exercises the rules of the
backward ops, and the capture discipline: which forward values each rule's
backward nodes read.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.ops.indexing import IndexingMultiAxisVec, IndexingOneHot, IndexingSetOneHot
from gradcompiler.rules import ForwardNode, rule_of

from helpers import assert_grads, backward_nodes_of, captured_values

SHAPE = (4, 5, 6)
MASK = np.array([[True, False, True, False, False],
                 [False, False, False, False, True],
                 [True, True, False, False, False],
                 [False, False, False, False, True]])


def _check(build, wrt, order=1, **feeds):
    """check_grads of `build(**placeholders)` wrt the named feeds; the graph is verified."""
    with gc.Graph("indexing_grads") as graph:
        placeholders = {name: gc.input(name, np.shape(v), np.asarray(v).dtype) for name, v in feeds.items()}
        y = build(**placeholders)
    gc.verify(graph)
    report = gc.check_grads(y, [placeholders[n] for n in wrt], feeds, order=order)
    gc.verify(graph)
    for result in report.results:  # the function really depends on each input checked
        assert abs(result.numeric) > 1e-6, str(report)
    return report


@pytest.fixture
def x(rng):
    return rng.standard_normal(SHAPE)


# -- Subtensor / SetSubtensor --------------------------------------------------------------

@pytest.mark.parametrize("key", [np.s_[1:, ::2], np.s_[::-1, -1, 2:-1:2], np.s_[-1], np.s_[None, ..., 1:3],
                                 np.s_[1, 2, 3], np.s_[-10:10, 4:0:-3]], ids=repr)
def test_subtensor(key, x):
    _check(lambda x: x[key], ["x"], x=x)


@pytest.mark.parametrize("key", [np.s_[::-2, 1:4], np.s_[1], np.s_[..., 0], np.s_[2, 3, 4]], ids=repr)
def test_set_subtensor_data_and_value(key, x, rng):
    value = rng.standard_normal(x[key].shape)
    _check(lambda x, v: gc.index_update(x, key, v), ["x", "v"], x=x, v=value)


def test_set_subtensor_with_a_broadcast_value(x, rng):
    _check(lambda x, v: gc.index_update(x, np.s_[1:3, ::2], v), ["x", "v"], x=x, v=rng.standard_normal(6))


def test_index_add_on_a_basic_region(x, rng):
    value = rng.standard_normal((5,))
    _check(lambda x, v: gc.index_add(x, np.s_[1:, 2, ::-2], gc.reshape(v, (1, 5, 1))[0, :, 0][1:4]),
           ["x", "v"], x=x, v=value)


# -- IndexingMultiAxisVec and its scatter forms ------------------------------------------------

@pytest.mark.parametrize("key", [np.s_[[3, 3, 0, 3]], np.s_[:, [[0], [4]], [1, 2, 2]], np.s_[0, :, [1, 1]],
                                 np.s_[[-1, 2], ::-2, [0, 0]], np.s_[MASK], np.s_[..., [5, 5, 5]],
                                 np.s_[:, [[1], [1]], ..., [0, 2, 0]]], ids=repr)
def test_gather_with_constant_indices(key, x):
    _check(lambda x: x[key], ["x"], x=x)


@pytest.mark.parametrize("dtype", ["int32", "int64"])
def test_gather_with_index_tensors(dtype, x):
    rows = np.array([[0, -1], [3, 0], [0, 0]], dtype)
    cols = np.array([5, 5], dtype)
    _check(lambda x, r, c: x[r, 1:, c], ["x"], x=x, r=rows, c=cols)


@pytest.mark.parametrize("dynamic", [False, True], ids=["constant-index", "input-index"])
@pytest.mark.parametrize("update", [gc.index_add, gc.index_update], ids=["incr", "set"])
@pytest.mark.parametrize("rows", [np.array([[3, 1, 3], [3, 3, 0]]), np.array([[3, 1, 2], [0, -2, 1]])],
                         ids=["repeated", "distinct"])
def test_scatter_data_and_value(rows, update, dynamic, x, rng):
    cols = np.array([2, 2, -1])  # with rows: repeated positions in the first case only
    value = rng.standard_normal((2, 3, 5))
    if dynamic:
        _check(lambda x, v, r: update(x, (r, slice(None), cols), v), ["x", "v"], x=x, v=value, r=rows)
    else:
        _check(lambda x, v: update(x, (rows, slice(None), cols), v), ["x", "v"], x=x, v=value)


@pytest.mark.parametrize("update", [gc.index_add, gc.index_update], ids=["incr", "set"])
def test_scatter_in_numpy_order_after_an_empty_ellipsis(update, x, rng):
    value = rng.standard_normal((3, 2, 4))  # numpy puts the (3, 2) block first for this key
    _check(lambda x, v: update(x, (slice(None), [[0], [3], [2]], Ellipsis, [1, 5]), v), ["x", "v"], x=x, v=value)


# -- one-hot ---------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
def test_indexing_one_hot(axis, x, rng):
    index = rng.integers(0, SHAPE[axis], SHAPE[:axis % 3] + SHAPE[axis % 3 + 1:]).astype(np.int32)
    _check(lambda x, i: gc.indexing_one_hot(x, i, axis), ["x"], x=x, i=index)


@pytest.mark.parametrize("axis", [0, 2])
def test_indexing_set_one_hot_data_and_sub(axis, x, rng):
    index_shape = SHAPE[:axis] + SHAPE[axis + 1:]
    index = rng.integers(0, SHAPE[axis], index_shape).astype(np.int64)
    sub = rng.standard_normal(index_shape)
    _check(lambda x, i, s: gc.indexing_set_one_hot(x, i, s, axis), ["x", "s"], x=x, i=index, s=sub)


# -- Concat (its rule slices g with x[...]) ---------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat_every_input(axis, rng):
    shapes = [list(SHAPE) for _ in range(3)]
    for k, s in enumerate(shapes):
        s[axis] = k + 1
    feeds = {name: rng.standard_normal(s) for name, s in zip("abc", shapes)}
    _check(lambda a, b, c: gc.concat([a, b, c], axis), ["a", "b", "c"], **feeds)


# -- float32: every gradient keeps its input's dtype ---------------------------------------------

FLOAT32_CASES = {  # x (4, 5, 6), v (2, 6), i = [3, 3]
    "subtensor": (lambda x, v, i: x[1:, ::-2], ["x"]),
    "set_subtensor": (lambda x, v, i: gc.index_update(x, np.s_[0, 1:3], v), ["x", "v"]),
    "gather": (lambda x, v, i: x[i, :, [1, 1]], ["x"]),
    "incr": (lambda x, v, i: gc.index_add(x, (0, i), v), ["x", "v"]),
    "set": (lambda x, v, i: gc.index_update(x, (0, i), v), ["x", "v"]),
    "one_hot": (lambda x, v, i: gc.indexing_one_hot(x[:2, :, 0], i, axis=1), ["x"]),
    "set_one_hot": (lambda x, v, i: gc.indexing_set_one_hot(x[:2, :, 0], i, v[:, 0]), ["x", "v"]),
    "concat": (lambda x, v, i: gc.concat([x[0, :2], v], axis=0), ["x", "v"]),
}


@pytest.mark.parametrize("case", sorted(FLOAT32_CASES))
def test_float32_gradients_keep_their_dtype(case, rng):
    build, wrt = FLOAT32_CASES[case]
    feeds = {"x": rng.standard_normal(SHAPE).astype(np.float32),
             "v": rng.standard_normal((2, 6)).astype(np.float32),
             "i": np.array([3, 3], np.int32)}
    with gc.Graph("float32") as graph:
        placeholders = {n: gc.input(n, a.shape, a.dtype) for n, a in feeds.items()}
        y = build(**placeholders)
    needed = {graph[i].name for i in graph.ancestors([y.id]) if graph[i].role == "input"}
    assert_grads(y, [placeholders[n] for n in wrt], {k: v for k, v in feeds.items() if k in needed})
    gc.verify(graph)


# -- second order: the rules of the backward ops ----------------------------------------------

def test_second_order_through_subtensor(x):
    _check(lambda x: (x[1:, ::-2] ** 3).sum(), ["x"], order=2, x=x)


def test_second_order_through_gather_with_repeats(x):
    _check(lambda x: (x[[0, 0, 2], :, [1, 1, 1]] ** 3).sum(), ["x"], order=2, x=x)


def test_second_order_through_scatters(x, rng):
    value = rng.standard_normal((2, 5))
    rows = np.array([1, 1])
    for update in (gc.index_update, gc.index_add):
        _check(lambda x, v, r: (update(x[..., 0] ** 3, r, v ** 3) ** 2).sum(),  # noqa: B023 - run now
               ["x", "v"], order=2,
               x=x, v=value, r=rows)


def test_second_order_through_one_hot(rng):
    logits = rng.standard_normal((3, 5))
    labels = np.array([4, 0, 2], np.int32)
    _check(lambda z, lab: gc.cross_entropy(z, lab), ["z"], order=2, z=logits, lab=labels)
    sub = rng.standard_normal(3)
    _check(lambda z, lab, s: (gc.indexing_set_one_hot(z ** 3, lab, s ** 3) ** 2).sum(), ["z", "s"], order=2,
           z=logits, lab=labels, s=sub)


# -- captures and needs_grad -----------------------------------------------------------------

def _forward_reads(graph, forward_id):
    """Forward values read by the backward nodes that `forward_id`'s rule built."""
    return captured_values(graph, backward_nodes_of(graph, forward_id))


def _backward_ops(graph, forward_id):
    return sorted(type(graph[i].op).__name__ for i in backward_nodes_of(graph, forward_id))


def test_subtensor_backward_reads_no_forward_value():
    with gc.Graph("capture") as graph:
        x = gc.tanh(gc.input("x", (5, 6)))
        y = x[1:, ::2]
        gc.grad((y * y).sum(), [x])
    gc.verify(graph)
    assert _forward_reads(graph, y.id) == set()
    assert "SetSubtensor" in _backward_ops(graph, y.id)


@pytest.mark.parametrize("forward_index", [False, True], ids=["input-index", "computed-index"])
def test_gather_backward_reads_only_the_index_tensors(forward_index):
    with gc.Graph("capture") as graph:
        x = gc.tanh(gc.input("x", (5, 6)))
        idx = gc.input("idx", (4,), "int32")
        if forward_index:
            idx = idx + 1
        y = x[:, idx]
        gc.grad((y * y).sum(), [x])
    gc.verify(graph)
    assert _forward_reads(graph, y.id) == ({idx.id} if forward_index else set())
    read = {i for b in backward_nodes_of(graph, y.id) for i in graph[b].inputs}
    assert idx.id in read and x.id not in read and y.id not in read
    assert "IndexingIncrMultiAxisVec" in _backward_ops(graph, y.id)


def test_one_hot_backward_reads_only_the_index():
    with gc.Graph("capture") as graph:
        s = gc.tanh(gc.input("s", (3, 5)))
        lab = gc.input("lab", (3,), "int32") + 1
        y = gc.indexing_one_hot(s, lab, keepdims=True)
        gc.grad((y * y).sum(), [s])
    gc.verify(graph)
    assert _forward_reads(graph, y.id) == {lab.id}


@pytest.mark.parametrize("wrt", ["d", "s"])
def test_set_one_hot_builds_only_the_needed_gradient(wrt):
    with gc.Graph("needs_grad") as graph:
        feeds = {"d": gc.input("d", (3, 5)), "s": gc.input("s", (3,))}
        y = gc.indexing_set_one_hot(feeds["d"], gc.input("i", (3,), "int32"), feeds["s"])
        gc.grad((y * y).sum(), [feeds[wrt]])
    gc.verify(graph)
    ops = _backward_ops(graph, y.id)
    assert ("IndexingSetOneHot" in ops) == (wrt == "d")
    assert ("IndexingOneHot" in ops) == (wrt == "s")


@pytest.mark.parametrize("rows, masked", [([0, 2, 1], False), ([0, 2, 0], True), (None, True)],
                         ids=["constant-distinct", "constant-repeated", "input"])
def test_set_value_gradient_masks_overwritten_writes_only_when_they_can_exist(rows, masked):
    with gc.Graph("set_mask") as graph:
        d = gc.input("d", (3, 2))
        v = gc.param("v", (3, 2))
        index = gc.input("i", (3,), "int32") if rows is None else rows
        y = gc.index_update(d, index, v)
        gc.grad((y * y).sum(), [v])
    gc.verify(graph)
    ops = _backward_ops(graph, y.id)
    assert ("Where" in ops) == masked
    assert "IndexingSetMultiAxisVec" not in ops or masked  # no data gradient: d is not differentiated


def test_rules_give_index_inputs_no_gradient():
    with gc.Graph("rule") as graph:
        x = gc.input("x", (4, 3))
        idx = gc.input("idx", (2,), "int32")
        g = gc.input("g", (2, 3))
        y = x[idx]
        lab = gc.input("lab", (4,), "int32")
        z = gc.apply(IndexingOneHot(1), x, lab)
        gz = gc.input("gz", (4, 1))
        w = gc.apply(IndexingSetOneHot(1), x, lab, gz)
        gw = gc.input("gw", (4, 3))
        with graph.building("backward"):
            gather_grads = rule_of(IndexingMultiAxisVec)(ForwardNode(graph, y.node), g, (True, True))
            one_hot_grads = rule_of(IndexingOneHot)(ForwardNode(graph, z.node), gz, (True, True))
            set_grads = rule_of(IndexingSetOneHot)(ForwardNode(graph, w.node), gw, (True, True, True))
    gc.verify(graph)
    assert gather_grads[0].shape == (4, 3) and gather_grads[1] is None
    assert one_hot_grads[0].shape == (4, 3) and one_hot_grads[1] is None
    assert set_grads[0].shape == (4, 3) and set_grads[1] is None and set_grads[2].shape == (4, 1)
