"""Every benchmark workload differentiates, and its gradients match the
hand-written numpy backward (`gradcompiler.bench.manual`).

Two oracles meet here: the reference interpreter running the graph that
`gc.grad` built through the rule table, and the backward derived by hand.
In float64 they must agree to rounding; a float32 run checks the benchmark
dtype itself with a float32 tolerance. The numpy steps are in turn checked
against float64 finite differences, so a shared mistake cannot pass.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.bench import manual, suite, workloads

from oracle import assert_close

NAMES = workloads.NAMES


def _compare(name: str, dtype: str, rtol: float, atol: float) -> None:
    work = workloads.build(name, "tiny", dtype)
    gc.verify(work.graph)
    feeds = workloads.feeds_for(work)
    got = gc.evaluate(work.outputs, feeds)
    want = manual.STEPS[name](feeds)
    assert len(got) == len(want) == 1 + len(work.wrt)
    labels = ["loss"] + [t.name for t in work.wrt]
    for label, g, w, t in zip(labels, got, want, work.outputs):
        assert g.shape == w.shape == t.shape, (name, label)
        assert g.dtype == np.dtype(dtype), (name, label, g.dtype)
        assert w.dtype == np.dtype(dtype), (name, label, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=f"{name}: {label}")


@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_numpy_manual_float64(name):
    _compare(name, "float64", rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", NAMES)
def test_gradients_match_numpy_manual_float32(name):
    _compare(name, "float32", rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", NAMES)
def test_numpy_manual_matches_finite_differences(name):
    """The hand-written backward is itself right: central differences of its loss."""
    work = workloads.build(name, "tiny", "float64")
    feeds = workloads.feeds_for(work)
    step = manual.STEPS[name]
    grads = step(feeds)[1:]
    rng = np.random.default_rng(7)
    eps = 1e-6
    for tensor, grad in zip(work.wrt, grads):
        for flat in rng.choice(grad.size, size=min(grad.size, 6), replace=False):
            where = np.unravel_index(flat, grad.shape)
            plus, minus = dict(feeds), dict(feeds)
            plus[tensor.name] = feeds[tensor.name].copy()
            minus[tensor.name] = feeds[tensor.name].copy()
            plus[tensor.name][where] += eps
            minus[tensor.name][where] -= eps
            numeric = (step(plus)[0] - step(minus)[0]) / (2 * eps)
            np.testing.assert_allclose(grad[where], numeric, rtol=1e-5, atol=1e-6,
                                       err_msg=f"{name}: d loss / d {tensor.name}{where}")


def test_embedding_feeds_repeat_indices():
    """The dense embedding gradient must accumulate repeats; the feeds must contain some."""
    work = workloads.build("embedding", "tiny")
    idx = workloads.feeds_for(work)["idx"]
    assert idx.dtype == np.int64
    assert len(np.unique(idx)) < len(idx)
    assert idx.min() >= 0 and idx.max() < work.dims["vocab"]


def test_feeds_are_float32_and_fixed():
    for name in NAMES:
        work = workloads.build(name, "tiny")
        a, b = workloads.feeds_for(work), workloads.feeds_for(work)
        assert set(a) == set(work.graph.feed_names)
        for key, value in a.items():
            np.testing.assert_array_equal(value, b[key])
            if value.dtype.kind == "f":
                assert value.dtype == np.float32, (name, key)


def test_full_size_shapes_follow_benchmarks_md():
    """The full sizes are the ones benchmarks.md fixes (checked on a few defining shapes)."""
    mlp = workloads.build("mlp")
    assert [t.shape for t in mlp.wrt] == [(784, 512), (512,), (512, 512), (512,), (512, 10), (10,)]
    assert mlp.graph[mlp.graph.feed_names["x"]].type.shape == (256, 784)
    forward = 2 * 256 * (784 * 512 + 512 * 512 + 512 * 10)
    weight_grads = forward
    input_grads = 2 * 256 * (512 * 512 + 512 * 10)  # layers 2 and 3 only: x needs no gradient
    assert mlp.bound == "gemm" and mlp.flops == forward + weight_grads + input_grads
    attention = workloads.build("attention")
    assert [t.shape for t in attention.wrt] == [(16, 256, 64)] * 3
    assert workloads.build("bcast_reduce").min_bytes == 2 * 4096 * 4096 * 4 + 4 * 4096 * 4 + 4


def test_gpt_train_step_matches_the_numpy_step_and_adamw_float64():
    """The gpt workload as the suite compiles it, one gc.train_step (forward, backward and
    AdamW in one executable), against the hand-written backward followed by torch.optim.AdamW's
    documented update in numpy: the loss, every parameter, both moment estimates and the
    step count after each of three steps, each from the state the last one left."""
    work = workloads.build("gpt", "tiny", "float64")
    feeds = workloads.feeds_for(work)
    run = suite.step_runner(work, suite.compile_step(work, "cpu"), feeds, "cpu")
    numpy_step = manual.AdamWTraining(work, feeds)
    for number in range(1, 4):
        got, want = run(), numpy_step.results(numpy_step())
        assert float(want[-1]) == number
        for label, g, w in zip(["loss", *work.state_names], got, want):
            assert_close(np.asarray(g), w, rtol=1e-10, label=f"step {number}: {label}")
    fresh = workloads.feeds_for(work)
    for name in ("wte", "head"):  # the parameters moved, the feeds they started from did not
        np.testing.assert_array_equal(feeds[name], fresh[name])
        assert np.abs(numpy_step.params[name] - fresh[name]).max() > 1e-4
