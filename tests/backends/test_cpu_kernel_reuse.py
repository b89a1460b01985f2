"""Kernels are keyed by structure: identical layers share one compiled kernel."""

from __future__ import annotations

import numpy as np

import gradcompiler as gc

from oracle import assert_close


def deep_mlp(depth: int, prefix: str = "", width: int = 8):
    """A `depth`-layer relu MLP with a cross-entropy loss, its gradients, and feeds."""
    rng = np.random.default_rng(depth)
    with gc.Graph(f"{prefix}mlp{depth}"):
        x = gc.input(f"{prefix}x", (16, width))
        labels = gc.input(f"{prefix}labels", (16,), "int32")
        h, params, feeds = x, [], {}
        for k in range(depth):
            w = gc.param(f"{prefix}w{k}", (width, width))
            b = gc.param(f"{prefix}b{k}", (width,))
            h = gc.relu(h @ w + b)
            params += [w, b]
        loss = gc.cross_entropy(h, labels)
        grads = gc.grad(loss, params)
    feeds = {f"{prefix}x": rng.standard_normal((16, width)).astype(np.float32),
             f"{prefix}labels": rng.integers(0, width, 16).astype(np.int32)}
    for p in params:
        feeds[p.name] = (rng.standard_normal(p.shape) / np.sqrt(width)).astype(np.float32)
    return [loss, *grads], feeds


def distinct_modules(step) -> set[str]:
    return {k.module for k in step.kernels if k.kind == "loop"}


def test_distinct_kernels_do_not_grow_with_depth():
    shallow_outputs, shallow_feeds = deep_mlp(5)
    deep_outputs, deep_feeds = deep_mlp(20)
    shallow, deep = gc.compile(shallow_outputs), gc.compile(deep_outputs)
    deep_loops = [k for k in deep.kernels if k.kind == "loop"]
    assert len(deep_loops) > len([k for k in shallow.kernels if k.kind == "loop"])
    assert len(distinct_modules(deep)) == len(distinct_modules(shallow)) == len(deep.program.kernels())
    assert distinct_modules(deep) == distinct_modules(shallow)
    for step, outputs, feeds in ((shallow, shallow_outputs, shallow_feeds), (deep, deep_outputs, deep_feeds)):
        for got, want in zip(step(**feeds), gc.evaluate(outputs, feeds)):
            assert_close(got, want, rtol=1e-5)


def test_names_and_node_ids_do_not_enter_kernel_keys():
    """The same network built twice, with other names and after other nodes, compiles to the same kernels."""
    outputs_a, _ = deep_mlp(3)
    with gc.Graph("padding"):
        for _ in range(7):
            gc.input(f"unused{_}", (2,))
    outputs_b, feeds_b = deep_mlp(3, prefix="other_")
    step_a, step_b = gc.compile(outputs_a), gc.compile(outputs_b)
    assert [s.kernel for s in step_a.program.steps if hasattr(s, "kernel")] == \
        [s.kernel for s in step_b.program.steps if hasattr(s, "kernel")]
    assert distinct_modules(step_a) == distinct_modules(step_b)
    for got, want in zip(step_b(**feeds_b), gc.evaluate(outputs_b, feeds_b)):
        assert_close(got, want, rtol=1e-5)


def test_a_different_shape_or_dtype_is_a_different_kernel():
    def kernels_of(shape, dtype):
        with gc.Graph():
            x = gc.input("x", shape, dtype)
            return gc.compile(gc.sum(gc.tanh(x), axis=1)).program.kernels()

    base = kernels_of((4, 6), "float32")
    assert base == kernels_of((4, 6), "float32")
    assert base != kernels_of((4, 7), "float32")
    assert base != kernels_of((4, 6), "float64")
