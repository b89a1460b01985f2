"""Without Ray: splitting a batch, the graph re-specialised to a shard (a reshape that keeps
the batch on axis 0 follows it; one that bakes it in is an error naming the node), a compiled
step and a training step through pickle (a custom gradient's backward with them when pickle can
name it), and the error where Ray is missing."""

from __future__ import annotations

import pickle
import sys

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.distributed.shard import (
    batch_size,
    data_feeds,
    shard_sizes,
    specialise,
    split_batch,
)
from gradcompiler.errors import BackendUnavailableError, ShardError

from oracle import assert_close

B = 6


def test_shards_are_dealt_as_array_split_deals_them():
    for batch, workers in [(10, 3), (7, 2), (8, 4), (5, 5)]:
        want = [len(part) for part in np.array_split(np.arange(batch), workers)]
        assert shard_sizes(batch, workers) == want
    with pytest.raises(ShardError, match=r"workers=4 is more than the batch of 3 samples"):
        shard_sizes(3, 4)
    with pytest.raises(ShardError, match=r"workers=0"):
        shard_sizes(3, 0)


def test_split_batch_checks_the_feeds():
    with gc.Graph("g"):
        x, y = gc.input("x", (5, 2)), gc.input("y", (5,), "int32")
    feeds = [x.node, y.node]
    xv, yv = np.arange(10.0).reshape(5, 2), np.arange(5, dtype=np.int32)
    shards = split_batch({"x": xv, "y": yv}, feeds, [3, 2])
    np.testing.assert_array_equal(shards[1]["x"], xv[3:])
    np.testing.assert_array_equal(shards[0]["y"], yv[:3])
    with pytest.raises(gc.FeedError, match=r"missing \['y'\]"):
        split_batch({"x": xv}, feeds, [3, 2])
    with pytest.raises(gc.FeedError, match=r"'x' has shape \(4, 2\), expected \(5, 2\)"):
        split_batch({"x": xv[:4], "y": yv}, feeds, [3, 2])


def test_feeds_that_disagree_on_axis_0_cannot_be_sharded():
    with gc.Graph("g"):
        x, mask = gc.input("x", (B, 3)), gc.input("mask", (3,))
        loss = (x * mask).mean()
    feeds = data_feeds(loss.graph, loss.graph.ancestors([loss.id]))
    with pytest.raises(ShardError, match=r"'x' has 6 samples, 'mask' 3"):
        batch_size(feeds)


def build_reshaping(batch_in_reshape: bool):
    """loss = mean((reshape(x) · w)²): the reshape keeps the batch on axis 0, or merges it."""
    with gc.Graph("reshaping") as graph:
        x = gc.input("x", (B, 4), "float64")
        w = gc.param("w", (2,), "float64")
        h = gc.reshape(x, (B * 2, 2) if batch_in_reshape else (B, 2, 2))
        loss = gc.mean((h * w) ** 2)
    return graph, loss, w


def test_a_reshape_that_keeps_the_batch_follows_the_shard(rng):
    graph, loss, w = build_reshaping(False)
    shard = specialise(graph, [loss.id, w.id], B, 4)
    assert shard[graph.feed_names["x"]].type.shape == (4, 4)
    gc.verify(shard)
    loss4, w4 = gc.Tensor(shard, loss.id), gc.Tensor(shard, w.id)
    xv, wv = rng.standard_normal((4, 4)), rng.standard_normal(2)
    got_loss, got_grad = gc.compile([loss4, *gc.grad(loss4, [w4])])(x=xv, w=wv)
    h = xv.reshape(4, 2, 2)
    assert_close(got_loss, np.mean((h * wv) ** 2), rtol=1e-12)
    assert_close(got_grad, np.sum(2 * (h * wv) * h, axis=(0, 1)) / h.size, rtol=1e-12)
    assert graph[graph.feed_names["x"]].type.shape == (B, 4), "the original graph is untouched"


def test_a_reshape_that_bakes_the_batch_in_names_the_node():
    graph, loss, w = build_reshaping(True)
    with pytest.raises(ShardError) as info:
        specialise(graph, [loss.id, w.id], B, 3)
    message = str(info.value)
    assert "Reshape" in message and "cannot follow the batch from 6 to a shard of 3" in message
    assert "cannot reshape (3, 4)" in message
    assert __file__ in message, "the error points at the user's line"


def test_a_compiled_step_pickles_as_its_graph_and_options(rng):
    _graph, loss, w = build_reshaping(False)
    step = gc.compile([loss, *gc.grad(loss, [w])], fastmath=True)
    copy = pickle.loads(pickle.dumps(step))
    assert copy is not step and copy.recipe.options["fastmath"] is True
    feeds = {"x": rng.standard_normal((B, 4)), "w": rng.standard_normal(2)}
    for got, want in zip(copy(**feeds), step(**feeds)):
        assert_close(got, want, rtol=0)


def test_a_train_step_with_a_lambda_custom_gradient_pickles(rng):
    @gc.custom_gradient
    def clipped(x):  # identity forward; the gradient clipped to [-0.1, 0.1]
        return x * 1.0, lambda g: [gc.clip(g, -0.1, 0.1)]

    with gc.Graph("clip"):
        x, y = gc.input("x", (B, 3), "float64"), gc.input("y", (B,), "float64")
        w = gc.param("w", (3,), "float64")
        loss = gc.mse(clipped(x @ w), y)
    step = gc.train_step(loss, [w], gc.optim.SGD(0.5, momentum=0.9))
    copy = pickle.loads(pickle.dumps(step))
    w0 = rng.standard_normal(3)
    states = step.init({"w": w0}), copy.init({"w": w0})
    for _ in range(3):
        feeds = {"x": rng.standard_normal((B, 3)), "y": rng.standard_normal(B)}
        assert step(states[0], **feeds) == copy(states[1], **feeds)
    np.testing.assert_array_equal(states[0]["w"], states[1]["w"])
    unpickled = copy.executable.recipe.graph
    custom = [n for n in unpickled.nodes.values() if n.op.name == "CustomGradient"]
    assert custom, "the composite's node travels"
    with pytest.raises(gc.GraphError, match="backward functions stay behind"):
        custom[0].op.backward(None)


def test_a_module_level_backward_travels_with_a_pickled_graph(rng):
    """batch_norm's backward is a module-level function: pickle names it, so the unpickled
    graph keeps it (and can still be differentiated), where a lambda's stays behind."""
    from gradcompiler.frontend.normalisation import _normalised_backward

    with gc.Graph("bn"):
        x, t = gc.param("x", (B, 3), "float64"), gc.input("t", (B, 3), "float64")
        loss = (gc.batch_norm(x) * t).sum()
    step = gc.compile([loss, *gc.grad(loss, [x])])
    copy = pickle.loads(pickle.dumps(step))
    custom = [n for n in copy.recipe.graph.nodes.values() if n.op.name == "CustomGradient"]
    assert [n.op.backward for n in custom] == [_normalised_backward]
    feeds = {"x": rng.standard_normal((B, 3)), "t": rng.standard_normal((B, 3))}
    for got, want in zip(copy(**feeds), step(**feeds)):
        assert_close(got, want, rtol=0)


def test_without_ray_a_data_parallel_trainer_says_how_to_install_it(monkeypatch):
    from gradcompiler.distributed import DataParallel

    _graph, loss, w = build_reshaping(False)
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(BackendUnavailableError, match=r"gradcompiler\[distributed\]"):
        DataParallel(loss, [w], gc.optim.SGD(0.1), workers=2)
