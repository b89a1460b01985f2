"""The runtime of a compiled step: buffers, feeds, out=, errors, debug mode, the API around it."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends.numba_cpu.buffers import ALIGN
from gradcompiler.backends.numba_cpu.runtime import output_homes
from gradcompiler.errors import BackendUnavailableError, FeedError, IndexOutOfRangeError, NonFiniteError
from gradcompiler.kernel import KernelStep

from oracle import assert_close


def bias_outputs():
    """loss = Σ relu(x + b)·w and its gradients wrt x, b, w."""
    with gc.Graph("bias"):
        x = gc.input("x", (6, 5), "float64")
        b, w = gc.param("b", (5,), "float64"), gc.param("w", (5,), "float64")
        loss = gc.sum(gc.relu(x + b) * w)
    return [loss, *gc.grad(loss, [x, b, w])]


def numpy_bias_step(x, b, w):
    t = x + b
    r = np.where(t > 0, t, 0.0)
    dx = np.where(t > 0, w, 0.0)
    return [np.sum(r * w), dx, dx.sum(0), r.sum(0)]


@pytest.fixture(scope="module")
def bias_step():
    """The bias step compiled, and a numpy version of it."""
    return gc.compile(bias_outputs()), numpy_bias_step


def _feeds(rng):
    return dict(x=rng.standard_normal((6, 5)), b=rng.standard_normal(5), w=rng.standard_normal(5))


def test_values_match_numpy_and_buffers_are_reused(bias_step, rng):
    step, numpy_step = bias_step
    feeds = _feeds(rng)
    arrays_before = [id(a) for a in step._runner.arrays]
    first = step(**feeds)
    second = step(**feeds)
    for a, b, want in zip(first, second, numpy_step(**feeds)):
        np.testing.assert_allclose(a, want, rtol=1e-12, atol=1e-12)
        np.testing.assert_array_equal(a, b)
    assert [id(a) for a in step._runner.arrays] == arrays_before
    other = _feeds(np.random.default_rng(99))
    for a, want in zip(step(**other), numpy_step(**other)):
        np.testing.assert_allclose(a, want, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(first[1], numpy_step(**feeds)[1])  # results are copies, not views


@pytest.mark.parametrize("passes", ["unfused", "cse only"])
def test_a_pass_list_without_fuse_is_fused_after_its_own_passes(passes, rng):
    from gradcompiler.passes.pipeline import CSE, UNFUSED_PIPELINE

    chosen = UNFUSED_PIPELINE if passes == "unfused" else [CSE]
    step = gc.compile(bias_outputs(), passes=chosen)
    names = [s.name for s in step.context.stats]
    assert names[:len(chosen)] == [p.name for p in chosen] and names[-2:] == ["fuse", "memory"]
    assert step.memory.order == step.plan.groups
    feeds = _feeds(rng)
    for got, expected in zip(step(**feeds), numpy_bias_step(**feeds)):
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


def test_outputs_are_written_in_place_and_reused_once_the_caller_lets_go(bias_step, rng):
    """No copy out of internal buffers: a dropped result's memory serves the next call."""
    step, numpy_step = bias_step
    feeds = _feeds(rng)
    address = step(**feeds)[1].__array_interface__["data"][0]
    again = step(**feeds)[1]
    assert again.__array_interface__["data"][0] == address
    later = step(**_feeds(np.random.default_rng(5)))[1]
    assert not np.shares_memory(again, later)
    np.testing.assert_allclose(again, numpy_step(**feeds)[1], rtol=1e-12)


def test_repeated_calls_do_not_grow_memory(bias_step, rng):
    step, _ = bias_step
    feeds = _feeds(rng)
    step(**feeds)
    tracemalloc.start()
    for _ in range(3):
        step(**feeds)
    base, _ = tracemalloc.get_traced_memory()
    for _ in range(50):
        step(**feeds)
    grown, _ = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert grown - base < 20_000


def test_out_arrays_are_written_in_place(bias_step, rng):
    step, numpy_step = bias_step
    feeds = _feeds(rng)
    out = [np.empty(()), np.empty((6, 5)), np.empty(5), np.empty(5)]
    result = step(out=out, **feeds)
    assert all(r is o for r, o in zip(result, out))
    for o, want in zip(out, numpy_step(**feeds)):
        np.testing.assert_allclose(o, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(FeedError, match=r"out\[1\]"):
        step(out=[np.empty(()), np.empty((5, 6)), np.empty(5), np.empty(5)], **feeds)
    with pytest.raises(FeedError, match="4 output"):
        step(out=out[:2], **feeds)
    with pytest.raises(FeedError, match="overlaps the feed 'x'"):
        step(out=[out[0], feeds["x"], out[2], out[3]], **feeds)
    strided = np.empty((6, 10))[:, ::2]  # not contiguous: written through a copy
    step(out=[out[0], strided, out[2], out[3]], **feeds)
    np.testing.assert_allclose(strided, numpy_step(**feeds)[1], rtol=1e-12)


def test_feeds_are_validated(bias_step, rng):
    step, numpy_step = bias_step
    feeds = _feeds(rng)
    with pytest.raises(FeedError, match="missing"):
        step(x=feeds["x"], b=feeds["b"])
    with pytest.raises(FeedError, match="unexpected"):
        step(**feeds, extra=np.zeros(3))
    with pytest.raises(FeedError, match="shape"):
        step(**{**feeds, "x": np.zeros((5, 6))})
    with pytest.raises(FeedError, match="dtype"):
        step(**{**feeds, "b": feeds["b"].astype(np.float32)})
    wide = np.asfortranarray(rng.standard_normal((6, 10)))[:, ::2]  # neither C nor F contiguous
    assert not wide.flags.c_contiguous
    for got, want in zip(step(**{**feeds, "x": wide}), numpy_step(wide, feeds["b"], feeds["w"])):
        np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_single_output_is_returned_as_an_array(rng):
    with gc.Graph():
        x = gc.input("x", (3, 4), "float64")
        y = gc.tanh(x) * 2.0
    step = gc.compile(y)
    x_value = rng.standard_normal((3, 4))
    result = step(x=x_value)
    assert isinstance(result, np.ndarray)
    np.testing.assert_allclose(result, np.tanh(x_value) * 2.0, rtol=1e-12)


def test_an_index_out_of_range_raises_and_the_step_stays_usable():
    with gc.Graph():
        logits = gc.input("logits", (4, 3), "float64")
        labels = gc.input("labels", (4,), "int32")
        loss = gc.cross_entropy(logits, labels)
        (dlogits,) = gc.grad(loss, [logits])
    step = gc.compile([loss, dlogits])
    z = np.arange(12.0).reshape(4, 3) / 10
    with pytest.raises(IndexOutOfRangeError):
        step(logits=z, labels=np.array([0, 1, 3, 2], np.int32))
    with pytest.raises(IndexOutOfRangeError):
        step(logits=z, labels=np.array([0, -1, 2, 2], np.int32))
    value, grad = step(logits=z, labels=np.array([0, 1, 2, 2], np.int32))
    p = np.exp(z - z.max(1, keepdims=True))
    p /= p.sum(1, keepdims=True)
    np.testing.assert_allclose(value, -np.mean(np.log(p[np.arange(4), [0, 1, 2, 2]])), rtol=1e-12)
    expected = p.copy()
    expected[np.arange(4), [0, 1, 2, 2]] -= 1
    np.testing.assert_allclose(grad, expected / 4, rtol=1e-12, atol=1e-15)


def test_debug_mode_names_the_kernel_and_forward_op_of_a_non_finite_value(rng):
    with gc.Graph():
        x = gc.input("x", (3,), "float64")
        y = gc.log(x, ) * 2.0
    step = gc.compile(y, debug=True)
    np.testing.assert_allclose(step(x=np.array([1.0, 2.0, 3.0])), 2 * np.log([1.0, 2.0, 3.0]))
    with pytest.raises(NonFiniteError, match=r"kernel k\d+_loop.*Elemwise (LOG|MUL).*test_cpu_runtime.py"):
        step(x=np.array([1.0, -2.0, 3.0]))
    quiet = gc.compile(y)
    assert np.isnan(quiet(x=np.array([1.0, -2.0, 3.0]))[1])


def test_an_unknown_target_is_refused_clearly():
    with gc.Graph():
        x = gc.input("x", (3,))
    with pytest.raises(BackendUnavailableError, match="unknown target"):
        gc.compile(x * 2.0, target="tpu")


def test_source_and_report_describe_the_step(bias_step):
    step, _ = bias_step
    source = step.source()
    assert "@njit(parallel=" in source and "cache=True" in source and "def make(" in source
    report = step.report()
    for part in ("== passes ==", "fuse", "== memory ==", "== kernels ==", "== captures ==",
                 "== compile ==", "cache counters"):
        assert part in report
    loops = [k for k in step.kernels if k.kind == "loop"]
    assert loops and all(k.bytes_moved > 0 and k.flops > 0 and k.ops for k in loops)
    assert step.plan is step.context.fusion and step.graph is not None and step.program.steps


def test_user_names_never_reach_generated_source(rng):
    hostile = "x'); import os; os.system('echo pwned') #"
    with gc.Graph("g\"; raise SystemExit #"):
        x = gc.input(hostile, (2, 3), "float64")
        y = gc.constant(np.full((2, 3), 0.123456789), "float64", name="c'; evil")
        out = gc.exp(x) * y
    step = gc.compile(out)
    source = step.source()
    assert "pwned" not in source and "evil" not in source and "SystemExit" not in source
    assert "0.123456789" not in source  # constants are arguments, not literals
    value = rng.standard_normal((2, 3))
    np.testing.assert_allclose(step(**{hostile: value}), np.exp(value) * 0.123456789, rtol=1e-12)


def test_fastmath_option_sets_the_flags():
    with gc.Graph():
        x = gc.input("x", (4,), "float64")
        y = gc.sum(x * x)
    default = gc.compile(y).source()
    fast = gc.compile(y, fastmath=True).source()
    assert "fastmath={'contract', 'reassoc'}" in default
    assert "'reassoc'" in fast and "'nnan'" not in fast and "'ninf'" not in fast
    assert gc.compile(y, fastmath=True)(x=np.arange(4.0)) == 14.0


def _embedding_step(lookups: int, dtype: str):
    """Σ tanh(table[idx])·r and its gradient wrt the table: a scatter-add into a zero fill."""
    with gc.Graph("embedding"):
        table = gc.param("table", (7, 3), dtype)
        idx = gc.input("idx", (lookups,), "int64")
        r = gc.input("r", (lookups, 3), dtype)
        loss = (gc.tanh(table[idx]) * r).sum()
    return [loss, *gc.grad(loss, [table])]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("lookups", [9, 0])
def test_a_scatter_add_into_a_zero_fill_writes_the_output_array(rng, dtype, lookups):
    """The scatter-add fills its own output (the loop that makes its rows does:
    `kernel.RowScatter`), and that output is the caller's array: no buffer for the zeros, no
    internal buffer for the gradient, no copy; with repeated and negative indices, a NaN row,
    no lookups at all, and an out= array holding garbage."""
    outputs = _embedding_step(lookups, dtype)
    step = gc.compile(outputs)
    (loop,) = [s for s in step.program.steps if isinstance(s, KernelStep) and s.kernel.scatter is not None]
    assert loop.args[loop.kernel.scatter.out] == step.program.outputs[1]
    scatter = step.graph[loop.nodes[-1]]
    fill, value = scatter.inputs[:2]   # the fill is one element, loaded; the value never stored
    assert not any(spec.node == fill and spec.size > 1 or spec.node == value for spec in step.program.buffers)
    assert not output_homes(step.program)
    table = rng.standard_normal((7, 3)).astype(dtype)
    table[4] = np.nan
    feeds = dict(table=table, idx=np.array([4, 0, -3, 0, 6, 4, 1, -7, 0][:lookups], np.int64),
                 r=rng.standard_normal((lookups, 3)).astype(dtype))
    want = gc.evaluate(outputs, feeds)
    rtol = {"float64": 1e-10, "float32": 1e-5}[dtype]
    for got in (step(**feeds), step(**feeds, out=[np.empty((), dtype), np.full((7, 3), np.nan, dtype)])):
        for k, (g, w) in enumerate(zip(got, want)):
            assert_close(g, w, rtol=rtol, label=f"output {k}")


_WAITS = {"OMP_WAIT_POLICY": "PASSIVE", "GOMP_SPINCOUNT": "10000", "OPENBLAS_THREAD_TIMEOUT": "20"}


@pytest.mark.parametrize("user_values", [{}, {"OMP_WAIT_POLICY": "ACTIVE", "GOMP_SPINCOUNT": "0",
                                              "OPENBLAS_THREAD_TIMEOUT": "7"}])
def test_import_sets_how_idle_threads_wait_unless_the_user_did(user_values):
    """Importing gradcompiler sets the waits its thread pools need between kernels (OpenMP's
    brief spin, then sleep; OpenBLAS's spin cut to 2^20 cycles: numba_cpu module docstring),
    before numpy loads OpenBLAS, and leaves a value the user exported alone."""
    env = {k: v for k, v in os.environ.items() if k not in _WAITS}
    code = ("import sys, os; assert 'numpy' not in sys.modules; import gradcompiler; "
            f"print(*(os.environ[name] for name in {list(_WAITS)}))")
    done = subprocess.run([sys.executable, "-c", code], env={**env, **user_values}, capture_output=True,
                          text=True, check=True)
    assert done.stdout.split() == list({**_WAITS, **user_values}.values())


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_allocated_arrays_start_on_a_pair_of_cache_lines(rng, dtype):
    """Each thread's region of a scratch array (row buffers, column partials) is written on
    every row; aligned, a region of 2^k elements shares no cache line with the next thread's.
    The outputs the step allocates are aligned too, so no 512-bit store straddles two lines
    (buffers.empty). The kernel over them, parallel, equals the reference interpreter."""
    rows, width = 512, 1024
    with gc.Graph("layer_norm_columns"):
        x = gc.param("x", (rows, width), dtype)
        gamma, beta = gc.param("gamma", (width,), dtype), gc.param("beta", (width,), dtype)
        r = gc.input("r", (rows, width), dtype)
        loss = (gc.layer_norm(x, gamma, beta, axis=-1, eps=1e-5) * r).sum()
    outputs = [loss, *gc.grad(loss, [x, gamma, beta])]
    step = gc.compile(outputs)
    scratch = step._runner.scratch
    assert scratch, "a row-reducing kernel with column sums has per-thread scratch"
    assert all(a.ctypes.data % ALIGN == 0 and a.flags.c_contiguous for a in scratch)
    feeds = dict(x=rng.standard_normal((rows, width)).astype(dtype),
                 gamma=(1 + 0.1 * rng.standard_normal(width)).astype(dtype),
                 beta=(0.1 * rng.standard_normal(width)).astype(dtype),
                 r=rng.standard_normal((rows, width)).astype(dtype))
    want = gc.evaluate(outputs, feeds)
    got_all = step(**feeds)
    assert [a.ctypes.data % ALIGN for a in got_all[1:]] == [0, 0, 0]
    for k, (got, expected) in enumerate(zip(got_all, want)):
        assert_close(got, expected, rtol={"float64": 1e-10, "float32": 1e-5}[dtype], label=f"output {k}")
