"""The whole pipeline changes no value: random graphs (with their gradients) and
an MLP training step give the same reference-interpreter outputs before and
after `optimize`, with `verify` run after every pass."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

import gradcompiler as gc
from gradcompiler.ops.linalg import BatchedMatrixMul, MatrixMul
from gradcompiler.ops.shape import Transpose
from gradcompiler.ops.source import Placeholder
from gradcompiler.passes.pipeline import optimize
from gradcompiler.reference import run_graph

from helpers import mlp_step

INPUTS = {"x": (3, 4), "v": (4,), "c": (3, 1), "m": (4, 3)}


def run(graph, outputs, feeds):
    """Reference values of `outputs`, fed only the placeholders they still need."""
    needed = {graph[i].op.feed_name for i in graph.ancestors(outputs) if isinstance(graph[i].op, Placeholder)}
    return run_graph(graph, outputs, {k: v for k, v in feeds.items() if k in needed})


def assert_same_outputs(graph, outputs, feeds):
    opt, ctx = optimize(graph, outputs, debug=True)
    before = run(graph, outputs, feeds)
    after = run(opt, opt.outputs, feeds)
    assert len(after) == len(before)
    for b, a in zip(before, after):
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12, equal_nan=True)
    return opt, ctx


# -- random graphs ------------------------------------------------------------------------------


def _broadcastable(a, b) -> bool:
    return all(p == q or p == 1 or q == 1 for p, q in zip(a.shape[::-1], b.shape[::-1]))


def _pick(data, pool, where=lambda t: True):
    choices = [t for t in pool if where(t)]
    return data.draw(st.sampled_from(choices)) if choices else None


def _unary(data, pool):
    t = _pick(data, pool)
    fn = data.draw(st.sampled_from([gc.tanh, gc.sin, gc.relu, gc.sigmoid, lambda a: -a, lambda a: gc.exp(gc.tanh(a))]))
    return fn(t)


def _binary(data, pool):
    a = _pick(data, pool)
    b = _pick(data, pool, lambda t: _broadcastable(a, t))
    fn = data.draw(st.sampled_from([gc.add, gc.subtract, gc.multiply, gc.maximum]))
    return fn(a, b)


def _identities(data, pool):
    """Patterns the rewrites target: x·1, x+0, −(−x), stop_gradient, view round trips."""
    t = _pick(data, pool)
    kind = data.draw(st.sampled_from(["mul1", "add0", "negneg", "stop", "reshape2", "axes", "bcast"]))
    if kind == "mul1":
        return t * 1.0
    if kind == "add0":
        return 0.0 + t
    if kind == "negneg":
        return -(-t)
    if kind == "stop":
        return gc.stop_gradient(t)
    if kind == "reshape2":
        return t.reshape(-1).reshape(t.shape)
    if kind == "axes":
        return gc.squeeze(gc.expand_dims(t, 0), 0)
    return gc.reduce_to(gc.broadcast_to(t, (2, *t.shape)), t.shape)


def _reduction(data, pool):
    t = _pick(data, pool, lambda t: t.ndim >= 1)
    if t is None:
        return None
    axis = data.draw(st.integers(0, t.ndim - 1))
    mode = data.draw(st.sampled_from(["SUM", "MEAN", "MAX"]))
    return gc.reduce(mode, t, axis, keepdims=data.draw(st.booleans()))


def _broadcast_sum(data, pool):
    t = _pick(data, pool)
    return gc.sum(gc.broadcast_to(t, (3, *t.shape)), 0)


def _matmul(data, pool):
    a = _pick(data, pool, lambda t: t.ndim == 2)
    if a is None:
        return None
    transpose = data.draw(st.booleans())
    k = a.shape[0] if transpose else a.shape[1]
    b = _pick(data, pool, lambda t: t.ndim == 2 and k in t.shape)
    if b is None:
        return None
    lhs = a.T if transpose else a
    return lhs @ (b if b.shape[0] == k else b.T)


def _duplicate(data, pool):
    """The same expression built twice, for CSE."""
    t = _pick(data, pool)
    return gc.tanh(t * 2.0) + gc.tanh(t * 2.0)


def _constant_expr(data, pool):
    """An expression of constants only, for folding, added to a value."""
    t = _pick(data, pool)
    seed = data.draw(st.integers(0, 2**16))
    k = np.random.default_rng(seed).standard_normal(t.shape)
    return t + gc.exp(gc.constant(k) * 0.5) - 1.0


BUILDERS = [_unary, _binary, _identities, _reduction, _broadcast_sum, _matmul, _duplicate, _constant_expr]


@given(st.data())
def test_random_graphs_keep_their_values(data):
    with gc.Graph() as g:
        pool = [gc.input(name, shape, "float64") for name, shape in INPUTS.items()]
        for _ in range(data.draw(st.integers(2, 10), label="steps")):
            built = data.draw(st.sampled_from(BUILDERS))(data, pool)
            if built is not None:
                pool.append(built)
        made = pool[len(INPUTS):] or pool
        outputs = [made[-1]] + data.draw(st.lists(st.sampled_from(made), max_size=2))
    if data.draw(st.booleans(), label="with gradients"):
        loss = sum((gc.sum(o * o) for o in outputs[1:]), gc.sum(outputs[0]))
        leaves = [t for t in pool[:len(INPUTS)] if t.id in g.ancestors([loss.id])]
        outputs = [loss, *gc.grad(loss, leaves, disconnected="zero")]
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="feeds"))
    feeds = {name: rng.standard_normal(shape) for name, shape in INPUTS.items()}
    assert_same_outputs(g, [t.id for t in outputs], feeds)


# -- the MLP training step ----------------------------------------------------------------------


def test_mlp_step_keeps_its_values_and_folds_transposes(rng):
    step = mlp_step()
    g, outputs = step.graph, step.outputs
    feeds = {n.op.feed_name: rng.standard_normal(n.type.shape) for n in g.feeds() if n.type.dtype.kind == "f"}
    feeds["labels"] = rng.integers(0, 4, size=8).astype(np.int32)
    opt, ctx = assert_same_outputs(g, [t.id for t in outputs], feeds)
    for node in opt.nodes.values():
        if isinstance(node.op, (MatrixMul, BatchedMatrixMul)):
            assert not any(isinstance(opt[i].op, Transpose) for i in node.inputs), str(node)
    assert len(opt) < len(g)
    # and the step computes what numpy says it should: the loss at least
    w1, b1, w2, b2, w3, b3 = (feeds[k] for k in ("w1", "b1", "w2", "b2", "w3", "b3"))
    h = np.maximum(np.maximum(feeds["x"] @ w1 + b1, 0) @ w2 + b2, 0)
    logits = h @ w3 + b3
    shifted = logits - logits.max(1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    expected_loss = -log_p[np.arange(8), feeds["labels"]].mean()
    np.testing.assert_allclose(run(opt, opt.outputs[:1], feeds)[0], expected_loss, rtol=1e-12)


def test_transposes_written_by_hand_fold_away_in_the_pipeline(rng):
    with gc.Graph() as g:
        x = gc.input("x", (8, 12), "float64")
        w = gc.param("w", (16, 12), "float64")  # stored transposed, as some checkpoints are
        loss = gc.sum(gc.tanh(x @ w.T))
    (dw,) = gc.grad(loss, [w])
    feeds = {"x": rng.standard_normal((8, 12)), "w": rng.standard_normal((16, 12))}
    opt, _ = assert_same_outputs(g, [loss.id, dw.id], feeds)
    assert not [n for n in opt.nodes.values() if isinstance(n.op, Transpose)]
