"""Compiled CPU results equal the reference interpreter, for every op family,
the benchmark workloads and random graphs.

The oracle is `gc.evaluate`, the numpy interpreter over the unoptimised
graph: it shares no code with fusion, lowering or code generation.
Tolerances: float64 rtol 1e-10, float32 rtol 1e-5 (against the largest
finite magnitude of each output, so values that cancel to near zero are judged
on the scale of their output). Shapes stay tiny; tests share kernel
structures where they can, since each distinct kernel is compiled once.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import gradcompiler as gc
from gradcompiler.backends import numba_cpu
from gradcompiler.bench import workloads
from gradcompiler.ops.elemwise import MODES

from oracle import assert_close

RTOL = {np.dtype(np.float64): 1e-10, np.dtype(np.float32): 1e-5}


def assert_matches_reference(outputs, feeds, **compile_options):
    step = gc.compile(outputs, **compile_options)
    got = step(**feeds)
    want = gc.evaluate(outputs, feeds)
    if not isinstance(outputs, (list, tuple)):
        got, want = [got], [want]
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, rtol=RTOL.get(w.dtype, 0.0), label=f"output {k}")
    return step


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("name", workloads.NAMES)
def test_benchmark_workloads(name, dtype):
    work = workloads.build(name, "tiny", dtype)
    assert_matches_reference(work.outputs, workloads.feeds_for(work))


@pytest.mark.parametrize("name", ["bcast_reduce", "layernorm_gelu", "attention", "pixel_shuffle"])
def test_parallel_kernels(name, monkeypatch):
    """Chunked prange loops: per-thread partials, row buffers, combination after the loop."""
    monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_POINTS", 0)
    work = workloads.build(name, "tiny", "float64")
    step = assert_matches_reference(work.outputs, workloads.feeds_for(work))
    assert any(k.parallel for k in step.kernels if k.kind == "loop")


@pytest.mark.parametrize("name", ["bcast_reduce", "layernorm_gelu"])
def test_without_reassociation_rows_reduce_through_row_buffers(name, monkeypatch):
    """A fastmath set without `reassoc`: innermost reductions go through per-thread row buffers."""
    monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_POINTS", 0)
    work = workloads.build(name, "tiny", "float64")
    step = assert_matches_reference(work.outputs, workloads.feeds_for(work), fastmath={"contract"})
    assert "sum_row(" in step.source() and "'reassoc'" not in step.source().split("# ---- driver")[0]


def _mode_inputs(rng, dtype):
    shape = (3, 5)
    general = rng.standard_normal(shape).astype(dtype)
    positive = (rng.random(shape) + 0.2).astype(dtype)
    return shape, dict(a=general, b=rng.standard_normal(shape[1:]).astype(dtype),
                       c=rng.standard_normal((3, 1)).astype(dtype), p=positive)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_float_elemwise_mode(dtype, rng):
    shape, feeds = _mode_inputs(rng, dtype)
    with gc.Graph():
        a, b, c = gc.input("a", shape, dtype), gc.input("b", shape[1:], dtype), gc.input("c", (3, 1), dtype)
        p = gc.input("p", shape, dtype)
        outs = []
        for mode, spec in MODES.items():
            if mode in ("LOG", "SQRT", "RSQRT", "LOG1P"):
                args = [p]
            elif mode == "POW":
                args = [p, a]
            else:
                args = [a, b, c][: spec.arity]
            outs.append(gc.elemwise(mode, *args))
        outs.append(gc.where(a < b, a, c))
        outs.append(gc.cast(a * 3.0, "int32"))
        outs.append(gc.cast(a < c, dtype))
    assert_matches_reference(outs, feeds)


def test_integer_elemwise_modes(rng):
    with gc.Graph():
        a, b = gc.input("a", (4, 6), "int32"), gc.input("b", (6,), "int32")
        c = gc.input("c", (4, 1), "int32")
        outs = [gc.elemwise(mode, *[a, b, c][: spec.arity])
                for mode, spec in MODES.items() if not spec.float_only]
        outs += [gc.sum(a * b, axis=0), gc.max(a - c, axis=1), gc.min(a, axis=0, keepdims=True), gc.prod(c)]
    feeds = dict(a=rng.integers(-9, 9, (4, 6)).astype(np.int32), b=rng.integers(-9, 9, 6).astype(np.int32),
                 c=rng.integers(-9, 9, (4, 1)).astype(np.int32))
    assert_matches_reference(outs, feeds)


_AXIS_SETS = (None, 0, 1, 2, (0, 1), (1, 2), (0, 2))
_MODE_AXES = [(mode, axes) for mode in ("MEAN", "MAX", "MIN", "PRODUCT", "SUM_SQR") for axes in (None, 1, (0, 2))]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_every_reduction_mode_and_axis_set(dtype, rng):
    """Every axis set with SUM (register, row buffer, read-modify-write, partials), every mode on three."""
    with gc.Graph():
        x = gc.input("x", (4, 5, 6), dtype)
        outs = [gc.sum(x, axis) for axis in _AXIS_SETS]
        outs += [gc.reduce(mode, x * 1.0, axes) for mode, axes in _MODE_AXES]
        outs += [gc.sum(x, (0, 2), keepdims=True), gc.max(x, 1, keepdims=True)]
        outs += [gc.reduce_to(x, shape) for shape in ((5, 1), (6,), (4, 1, 6), (), (1, 5, 6))]
    feeds = dict(x=(1.0 + 0.1 * rng.standard_normal((4, 5, 6))).astype(dtype))
    assert_matches_reference(outs, feeds)


def test_views_as_outputs_and_as_index_maps(rng):
    with gc.Graph():
        x = gc.input("x", (4, 6, 8), "float64")
        y = gc.input("y", (2, 8, 3, 4), "float64")
        outs = [
            x[1:, ::2, ::-3] * 2.0,
            gc.transpose(x, (2, 0, 1)) + 1.0,
            gc.reshape(x, (24, 8))[3:10],
            x[2, :, 5],
            gc.broadcast_to(gc.expand_dims(x[:, 0, 0], (1, 2)), (4, 6, 8)),
            gc.squeeze(x[:, :1, :], 1),
            gc.reshape(x, (8, 24)),  # an alias of x's buffer
            x,
            gc.pixel_shuffle(y, 2),
            gc.pixel_unshuffle(gc.pixel_shuffle(y, 2) * 3.0, 2),
            gc.transpose(gc.reshape(gc.transpose(x, (1, 0, 2)), (6, 32)), (1, 0)),
        ]
    feeds = dict(x=rng.standard_normal((4, 6, 8)), y=rng.standard_normal((2, 8, 3, 4)))
    assert_matches_reference(outs, feeds)


def test_library_ops_with_gradients(rng):
    """Matmul flags and regimes, batched matmul, gathers, scatters, concat, one-hot, through autodiff."""
    with gc.Graph():
        a, b = gc.param("a", (5, 4), "float64"), gc.param("b", (3, 4), "float64")
        batch = gc.param("batch", (2, 5, 4), "float64")
        idx = gc.input("idx", (6,), "int32")
        labels = gc.input("labels", (5,), "int32")
        stacked = gc.concat([a, b * 2.0], axis=0)
        picked = gc.tanh(stacked[idx]) @ gc.transpose(b, (1, 0))
        batched = gc.matmul(batch, gc.transpose(a, (1, 0)))
        onehot = gc.indexing_one_hot(a, labels, axis=1)
        loss = gc.sum(picked * picked) + gc.sum(batched) + gc.sum(onehot * onehot) + gc.sum(stacked[:, [0, 2]])
        grads = gc.grad(loss, [a, b, batch])
    feeds = dict(a=rng.standard_normal((5, 4)), b=rng.standard_normal((3, 4)), batch=rng.standard_normal((2, 5, 4)),
                 idx=np.array([7, 0, 3, 3, 1, 6], np.int32), labels=np.array([0, 3, 1, 1, 2], np.int32))
    assert_matches_reference([loss, *grads], feeds)


def test_softmax_and_norm_along_each_axis(rng):
    """Row statistics fuse into phases; statistics along axis 0 need partials across threads."""
    with gc.Graph():
        x = gc.input("x", (6, 5, 4), "float64")
        outs = [gc.softmax(x, axis=2), gc.softmax(x, axis=0), gc.layer_norm(x, axis=1),
                gc.log_softmax(x * 2.0, axis=1)]
        loss = sum(gc.sum(o * o) for o in outs)
        (dx,) = gc.grad(loss, [x])
    assert_matches_reference([*outs, loss, dx], dict(x=rng.standard_normal((6, 5, 4))))


def test_scalars_constants_fills_and_empty_tensors(rng):
    with gc.Graph():
        s = gc.input("s", (), "float64")
        x = gc.input("x", (3, 4), "float64")
        e = gc.input("e", (0, 4), "float64")
        k = gc.constant(np.arange(12.0).reshape(3, 4))
        outs = [gc.exp(s) * 3.0, x * s + k, gc.zeros((2, 3), "float64"),
                gc.full((4,), 2.5, "float64") * gc.sum(x, axis=0),
                gc.sum(e, axis=0), gc.sum(e * 2.0), gc.mean(x * k), k]
    feeds = dict(s=np.array(0.5), x=rng.standard_normal((3, 4)), e=np.zeros((0, 4)))
    assert_matches_reference(outs, feeds)


# -- random graphs ------------------------------------------------------------------------------

_SHAPES = [(3, 4), (4,), (3, 1), (), (1, 4)]
_UNARY = ["NEGATE", "ABS", "TANH", "SIGMOID", "RELU", "EXP", "SIN"]
_BINARY = ["ADD", "SUB", "MUL", "MAX", "MIN"]


def _broadcastable(a: tuple, b: tuple) -> bool:
    try:
        np.broadcast_shapes(a, b)
    except ValueError:
        return False
    return True


@st.composite
def random_graphs(draw):
    """A random DAG of elementwise, reduction and view ops, plus the gradient of a sum of it."""
    with gc.Graph("random"):
        inputs = [gc.input(f"x{k}", shape, "float64") for k, shape in enumerate(draw(st.lists(
            st.sampled_from(_SHAPES), min_size=2, max_size=3)))]
        pool = list(inputs)
        for _ in range(draw(st.integers(3, 9))):
            kind = draw(st.sampled_from(["unary", "binary", "binary", "reduce", "view"]))
            x = draw(st.sampled_from(pool))
            if kind == "unary":
                value = gc.elemwise(draw(st.sampled_from(_UNARY)), gc.tanh(x) if draw(st.booleans()) else x)
            elif kind == "binary":
                other = draw(st.sampled_from([t for t in pool if _broadcastable(t.shape, x.shape)]))
                value = gc.elemwise(draw(st.sampled_from(_BINARY)), x, other)
            elif kind == "reduce" and x.ndim:
                axis = draw(st.integers(0, x.ndim - 1))
                value = gc.reduce(draw(st.sampled_from(["SUM", "MAX", "MEAN"])), x, axis,
                                  keepdims=draw(st.booleans()))
            elif kind == "view" and x.ndim == 2:
                value = draw(st.sampled_from([gc.transpose(x, (1, 0)), gc.reshape(x, (-1,)),
                                              gc.broadcast_to(x, (2, *x.shape)), x[::-1]]))
            else:
                value = gc.expand_dims(x, 0) * 0.5
            pool.append(value)
        outputs = draw(st.lists(st.sampled_from(pool[len(inputs):]), min_size=1, max_size=3, unique_by=id))
        loss = sum(gc.sum(o * o) for o in outputs)
        grads = gc.grad(loss, inputs, disconnected="zero")
    return outputs + [loss, *grads], [t.shape for t in inputs]


@settings(max_examples=12, derandomize=True, deadline=None)
@given(random_graphs())
def test_random_graphs_match_the_reference(case):
    outputs, shapes = case
    rng = np.random.default_rng(7)
    feeds = {f"x{k}": rng.standard_normal(shape) for k, shape in enumerate(shapes)}
    assert_matches_reference(outputs, feeds)


def test_transcendentals_keep_special_values_under_the_default_flags():
    """Kernels are compiled with `reassoc`; the float32 approximations must still get overflow,
    underflow, signed zeros, inf and NaN right. Oracle: float64 numpy/scipy, rounded to float32."""
    from scipy import special

    special_values = [-np.inf, -110.0, -104.0, -103.9, -88.0, -20.0, -1e-30, -0.0, 0.0, 1e-40, 1e-7, 0.5,
                      9.0, 88.72, 88.73, 100.0, 3e38, np.inf, np.nan]
    x = np.concatenate([special_values, np.linspace(-30.0, 30.0, 241)]).astype(np.float32)
    with gc.Graph():
        t = gc.input("x", x.shape)
        positive = gc.abs(t)
        outs = [gc.elemwise(mode, t) for mode in ("EXP", "EXPM1", "TANH", "SIGMOID", "SOFTPLUS", "ERF", "GELU")]
        outs += [gc.elemwise(mode, positive) for mode in ("LOG", "LOG1P", "SQRT", "RSQRT")]
        outs += [gc.sin(t * 0.01), gc.cos(t * 0.01)]
    got = gc.compile(outs)(x=x)
    d, a, small = x.astype(np.float64), np.abs(x).astype(np.float64), (x * np.float32(0.01)).astype(np.float64)
    with np.errstate(all="ignore"):
        want = [np.exp(d), np.expm1(d), np.tanh(d), special.expit(d), np.logaddexp(0.0, d), special.erf(d),
                d * 0.5 * special.erfc(-d / np.sqrt(2.0)), np.log(a), np.log1p(a), np.sqrt(a), 1 / np.sqrt(a),
                np.sin(small), np.cos(small)]
        want = [w.astype(np.float32) for w in want]
    want[6][0] = -0.0  # gelu(-inf): mathfuncs returns the limit, -0; the formula's -inf·0 is NaN
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, rtol=4e-6, scaled_atol=0.0, atol=1e-37, label=f"output {k}")


def test_long_vectors_reduce_in_blocks(rng):
    """A long rank-1 loop with a sum is generated as blocks of 1024 points, with the same values."""
    n = 1 << 15
    with gc.Graph():
        x = gc.input("x", (n,), "float64")
        z = gc.input("z", (128, 256), "float64")
        d = x[::-1] - gc.reshape(z, (-1,))
        outs = [gc.mean(d * d), gc.max(d), d * 3.0, gc.sum(gc.exp(x * 0.01))]
    step = assert_matches_reference(outs, dict(x=rng.standard_normal(n), z=rng.standard_normal((128, 256))))
    assert "for j0 in range(lo, hi, 1024):" in step.source()
