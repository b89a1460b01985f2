"""Inner axes that every access walks as one are merged into one loop (gradcompiler/axis_coalescing.py).

The rule, on hand-built kernels: adjacent axes k, k + 1 (k ≥ 1) merge where every load's
coefficient of k is that of k + 1 times k + 1's extent (any coefficient on an axis of extent 1),
no digit reads either, and every reduction reduces both or neither; axes 0 and 1 only in a
kernel of several phases whose reductions keep both, its row scratch then one index of axis 1.

The values, on graphs compiled for the CPU against the reference interpreter (float64 1e-10,
float32 1e-5), with a NaN and an empty batch: a batch norm and its gradient, per-channel sums
and biases (H and W merge, the channel stays), and the accesses that must keep their axes
apart: a transposed operand, a bias broadcast along W alone, a slice along W, a sum over W
alone, and a pixel shuffle (digits).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.axis_coalescing import coalesce_axes
from gradcompiler.index_expr import Axis, Digit, Index
from gradcompiler.kernel import BufferParam, Compute, Instr, Load, LoopKernel, Phase, Reduction, Store
from gradcompiler.ops.elemwise import Elemwise
from tests.oracle import assert_close

F32 = np.dtype(np.float32)


def _index(*terms, const=0) -> Index:
    """Σ coeff·i_k from (k, coeff) pairs."""
    return Index.of({Axis(k): c for k, c in terms}, const)


def _kernel(domain, indices, reduce_axes=None) -> LoopKernel:
    """Loads of `indices` added together, stored over the domain (or reduced over `reduce_axes`)."""
    params = [BufferParam("in", F32, 10**6) for _ in indices] + [BufferParam("out", F32, 10**6)]
    instrs = [Instr(k, Load(k, index), F32) for k, index in enumerate(indices)]
    total = len(indices)
    instrs.append(Instr(total, Compute(Elemwise("ADD"), tuple(range(total))), F32))
    if reduce_axes is None:
        phase = Phase(tuple(instrs), stores=(Store(total, total),))
    else:
        phase = Phase(tuple(instrs), reductions=(Reduction(total, total, "SUM", tuple(reduce_axes)),))
    return LoopKernel(tuple(domain), tuple(params), (phase,))


def _loads(kernel: LoopKernel) -> list[Index]:
    return [i.expr.index for p in kernel.phases for i in p.instrs if isinstance(i.expr, Load)]


def test_axes_walked_as_one_merge_into_one():
    contiguous = _index((0, 60), (1, 20), (2, 5), (3, 1))
    per_channel = _index((1, 1))                       # broadcast over axes 2 and 3
    assert coalesce_axes(_kernel((2, 3, 4, 5), [contiguous])).domain == (2, 60)   # axis 0 stays apart
    merged = coalesce_axes(_kernel((2, 3, 4, 5), [contiguous, per_channel]))
    assert merged.domain == (2, 3, 20)                 # the channel's loads keep it apart
    assert _loads(merged) == [_index((0, 60), (1, 20), (2, 1)), _index((1, 1))]
    # an offset (a slice along H) keeps the walk; a transposed operand does not
    shifted = _index((0, 60), (1, 20), (2, 5), (3, 1), const=7)
    assert coalesce_axes(_kernel((2, 3, 4, 5), [shifted])).domain == (2, 60)
    transposed = _index((0, 60), (1, 20), (2, 1), (3, 4))
    assert coalesce_axes(_kernel((2, 3, 4, 5), [contiguous, transposed])).domain == (2, 3, 4, 5)


def test_reductions_keep_apart_the_axes_they_split():
    x = _index((0, 60), (1, 20), (2, 5), (3, 1))
    batch_norm_sums = coalesce_axes(_kernel((2, 3, 4, 5), [x], reduce_axes=(0, 2, 3)))
    assert batch_norm_sums.domain == (2, 3, 20)
    assert batch_norm_sums.phases[0].reductions[0].axes == (0, 2)
    last_axis_sums = coalesce_axes(_kernel((2, 3, 4, 5), [x], reduce_axes=(3,)))
    assert last_axis_sums.domain == (2, 12, 5)
    assert last_axis_sums.phases[0].reductions[0].axes == (2,)


def test_an_axis_of_extent_one_takes_any_coefficient_and_digits_stay():
    assert coalesce_axes(_kernel((2, 3, 1, 5), [_index((0, 99), (1, 17), (2, 1000), (3, 3))])).domain == (2, 3, 5)
    # an empty inner axis: the loops never run, left as they are (no extent to divide by)
    assert coalesce_axes(_kernel((2, 4, 0), [_index((1, 1))])).domain == (2, 4, 0)
    digit = Index.of({Digit(_index((3, 1)), 2, None): 1}, 0)
    kernel = coalesce_axes(_kernel((2, 3, 4, 5), [_index((0, 60), (1, 20), (2, 5)) + digit]))
    assert kernel.domain == (2, 12, 5)
    assert kernel.phases[0].instrs[0].expr.index == _index((0, 60), (1, 5)) + Index.of(
        {Digit(_index((2, 1)), 2, None): 1}, 0)


def _row_kernel(domain, x, reduce_axes) -> LoopKernel:
    """Two phases: x's MAX over `reduce_axes` into a row buffer, then x minus it, stored."""
    kept = [k for k in range(1, len(domain)) if k not in reduce_axes]
    row = _index(*((k, math.prod(domain[j] for j in kept if j > k)) for k in kept))
    params = (BufferParam("in", F32, 10**6), BufferParam("row", F32, math.prod(domain[k] for k in kept)),
              BufferParam("out", F32, 10**6))
    first = Phase((Instr(0, Load(0, x), F32),), reductions=(Reduction(1, 0, "MAX", tuple(reduce_axes)),))
    second = Phase((Instr(1, Load(0, x), F32), Instr(2, Load(1, row), F32),
                    Instr(3, Compute(Elemwise("SUB"), (1, 2)), F32)), stores=(Store(2, 3),))
    return LoopKernel(tuple(domain), params, (first, second))


def test_a_kernel_of_phases_merges_axes_0_and_1_into_smaller_rows():
    x = _index((0, 12), (1, 4), (2, 1))
    merged = coalesce_axes(_row_kernel((2, 3, 4), x, reduce_axes=(2,)))
    assert merged.domain == (6, 4)
    assert merged.params[1].size == 1                          # a row of one index of axis 1
    assert _loads(merged) == [_index((0, 4), (1, 1)), _index((0, 4), (1, 1)), Index.lit(0)]
    # a reduction over axis 1 keeps the rows whole; so does a load broadcast along axis 0
    assert coalesce_axes(_row_kernel((2, 3, 4), x, reduce_axes=(1, 2))).domain == (2, 12)
    broadcast = _index((1, 4), (2, 1))
    assert coalesce_axes(_row_kernel((2, 3, 4), broadcast, reduce_axes=(2,))).domain == (2, 3, 4)
    # one phase has no row that a later phase re-reads: axis 0 stays apart
    assert coalesce_axes(_kernel((2, 3, 4), [x], reduce_axes=(2,))).domain == (2, 3, 4)


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("batch", [3, 0])
def test_a_softmax_and_its_gradient_over_merged_rows_equal_the_reference(rng, dtype, batch):
    shape = (batch, 5, 40)
    with gc.Graph("softmax_rows"):
        x, r = gc.param("x", shape, dtype), gc.input("r", shape, dtype)
        probabilities = gc.softmax(x * 0.5, axis=-1)
        outputs = [probabilities, *gc.grad((probabilities * r).sum(), [x])]   # no sum over rows
    feeds = _feeds(rng, {"x": shape, "r": shape}, dtype)
    if batch:
        feeds["x"][1, 2, 3] = np.nan
    source = _check(outputs, feeds, dtype)
    assert f"c * {batch * 5} // nchunks" in source       # the loop over rows takes batch × 5 of them


def _batch_norm_step(shape, dtype):
    with gc.Graph("batch_norm"):
        x = gc.param("x", shape, dtype)
        gamma, beta = gc.param("gamma", (shape[1],), dtype), gc.param("beta", (shape[1],), dtype)
        r = gc.input("r", shape, dtype)
        loss = (gc.relu(gc.batch_norm(x, gamma, beta)) * r).sum()
    return [loss, *gc.grad(loss, [x, gamma, beta])]


def _feeds(rng, graph_inputs: dict, dtype) -> dict:
    return {name: rng.standard_normal(shape).astype(dtype) for name, shape in graph_inputs.items()}


def _check(outputs, feeds, dtype):
    step = gc.compile(outputs)
    with np.errstate(invalid="ignore", divide="ignore"):
        want = gc.evaluate(outputs, feeds)
    rtol = {"float64": 1e-10, "float32": 1e-5}[dtype]
    for k, (g, w) in enumerate(zip(step(**feeds), want)):
        assert_close(g, w, rtol=rtol, label=f"output {k}")
    return step.source()


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_batch_norm_over_merged_axes_equals_the_reference(rng, dtype):
    shape = (4, 3, 6, 10)
    feeds = _feeds(rng, {"x": shape, "gamma": shape[1:2], "beta": shape[1:2], "r": shape}, dtype)
    feeds["x"][1, 2, 3, 4] = np.nan
    source = _check(_batch_norm_step(shape, dtype), feeds, dtype)
    assert "range(0, 60)" in source and "range(0, 10)" not in source


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("batch", [5, 0])
def test_per_channel_sums_and_biases_over_merged_axes_equal_the_reference(rng, dtype, batch):
    shape = (batch, 3, 6, 10)
    with gc.Graph("channels"):
        x, r, b = gc.input("x", shape, dtype), gc.input("r", shape, dtype), gc.input("b", (3,), dtype)
        outputs = [(x * r).sum(axis=(0, 2, 3)), gc.tanh(x) + gc.reshape(b, (3, 1, 1))]
    source = _check(outputs, _feeds(rng, {"x": shape, "r": shape, "b": (3,)}, dtype), dtype)
    assert "range(0, 60)" in source


def _apart_graphs(dtype):
    """Graphs whose accesses keep H and W apart, each with its feeds' shapes."""
    shape = (3, 2, 5, 7)
    with gc.Graph("transposed"):
        x, y = gc.input("x", shape, dtype), gc.input("y", (3, 2, 7, 5), dtype)
        yield [(x + gc.transpose(y, (0, 1, 3, 2))).sum(axis=1)], {"x": shape, "y": (3, 2, 7, 5)}
    with gc.Graph("bias_along_w"):
        x, b = gc.input("x", shape, dtype), gc.input("b", (7,), dtype)
        yield [gc.tanh(x + b)], {"x": shape, "b": (7,)}
    with gc.Graph("slice_along_w"):
        x = gc.input("x", (3, 2, 5, 9), dtype)
        yield [x[:, :, :, 1:8] * 2.0], {"x": (3, 2, 5, 9)}
    with gc.Graph("sum_along_w"):
        x = gc.input("x", shape, dtype)
        yield [(x * x).sum(axis=3)], {"x": shape}
    with gc.Graph("pixel_shuffle"):
        x = gc.input("x", (2, 8, 3, 5), dtype)
        yield [gc.pixel_shuffle(x, 2) * 3.0], {"x": (2, 8, 3, 5)}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_accesses_that_keep_axes_apart_equal_the_reference(rng, dtype):
    for outputs, shapes in _apart_graphs(dtype):
        feeds = _feeds(rng, shapes, dtype)
        feeds["x"].flat[3] = np.nan
        _check(outputs, feeds, dtype)
