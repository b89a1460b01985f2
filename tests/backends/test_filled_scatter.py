"""A scatter-add of rows onto a Fill (the gradient of a gather of rows) is one `FilledScatter`
step that fills its own output (`fuse.scatters_rows_onto_fill`, `kernel.FilledScatter`): the
Fill gets no buffer and no kernel. On the CPU the call fills and updates a block of rows at a
time, each thread the lookups of its own blocks, bucketed in increasing order.

Oracles: np.add.at onto np.full (bitwise: duplicates accumulate in the value's row-major
order, as the reference does), and the reference interpreter on the unoptimised graph
(float64 rtol 1e-10, float32 1e-5). Cases: repeated and negative indices, rows of several
axes, empty batches, NaN values, a fill other than zero, blocks of one and two rows over an
odd number of rows, more threads than blocks, a bad index (raised before anything is
written).
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends.numba_cpu import row_blocks
from gradcompiler.backends.numba_cpu.library import library_kernel
from gradcompiler.errors import IndexOutOfRangeError
from gradcompiler.kernel import FilledScatter, KernelStep, LibraryStep
from gradcompiler.ops.indexing import IndexingIncrMultiAxisVec, TensorItem
from gradcompiler.ops.source import Fill

from cuda_support import cuda_for_tests
from oracle import assert_close

RTOL = {"float64": 1e-10, "float32": 1e-5}
ROWS = IndexingIncrMultiAxisVec((TensorItem(0),))


def filled_scatter(shape, dtype, fill, value, idx):
    """The CPU library call on an output holding garbage (7s), which it must overwrite."""
    out = np.full(shape, 7.0, dtype)
    library_kernel(FilledScatter(ROWS, Fill(shape, np.dtype(dtype), fill)))(value, idx, out=out)
    return out


def add_at(shape, dtype, fill, value, idx):
    expected = np.full(shape, fill, dtype)
    np.add.at(expected, idx, value)
    return expected


@pytest.fixture(params=[1, 2, 1 << 18], ids=["block_of_1_row", "block_of_2_rows", "default_block"])
def block_rows(request, monkeypatch):
    """Blocks of one or two rows (of 4 float64s: 32 bytes a row), or the default size."""
    if request.param < 1 << 18:
        monkeypatch.setattr(row_blocks, "FILL_BLOCK_BYTES", 32 * request.param)
    return request.param


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("fill", [0.0, 1.5])
def test_rows_with_repeats_equal_add_at_bitwise(request, rng, block_rows, parallel, fill):
    if parallel:
        request.getfixturevalue("parallel_loops")
    idx = rng.integers(-13, 13, 600)                    # 13 rows: odd, so the last block is short
    idx[:4] = (3, 3, -10, 12)                           # row 3 three times, once negative
    value = rng.standard_normal((600, 4))
    got = filled_scatter((13, 4), np.float64, fill, value, idx)
    np.testing.assert_array_equal(got, add_at((13, 4), np.float64, fill, value, idx))


def test_more_threads_than_blocks(parallel_loops, rng, monkeypatch):
    monkeypatch.setattr(row_blocks, "FILL_BLOCK_BYTES", 1 << 20)   # one block for all 3 rows
    value = rng.standard_normal((50, 4)).astype(np.float32)
    idx = rng.integers(0, 3, 50)
    got = filled_scatter((3, 4), np.float32, 0.0, value, idx)
    np.testing.assert_array_equal(got, add_at((3, 4), np.float32, 0.0, value, idx))


def test_rows_of_several_axes_and_an_index_of_several_axes(parallel_loops, rng, block_rows):
    idx = rng.integers(0, 5, (3, 7))
    value = rng.standard_normal((3, 7, 2, 2))
    got = filled_scatter((5, 2, 2), np.float64, 0.0, value, idx)
    np.testing.assert_array_equal(got, add_at((5, 2, 2), np.float64, 0.0, value, idx))


def test_nan_values_poison_only_their_rows(parallel_loops, rng):
    idx = rng.integers(0, 9, 200)
    idx[5] = 4
    value = rng.standard_normal((200, 4)).astype(np.float32)
    value[5, 1] = np.nan
    got = filled_scatter((9, 4), np.float32, 0.0, value, idx)
    assert np.isnan(got[4, 1]) and np.isfinite(np.delete(got, 4, axis=0)).all()
    np.testing.assert_array_equal(got, add_at((9, 4), np.float32, 0.0, value, idx))


@pytest.mark.parametrize("shape,lookups", [((6, 4), 0), ((6, 0), 5), ((0, 4), 0)])
def test_empty_batches_rows_and_tables_fill(rng, shape, lookups):
    value = np.ones((lookups, *shape[1:]))
    idx = rng.integers(0, max(shape[0], 1), lookups)
    got = filled_scatter(shape, np.float64, 2.0, value, idx)
    np.testing.assert_array_equal(got, np.full(shape, 2.0))


@pytest.mark.parametrize("bad", [9, -10])
def test_a_bad_index_raises_before_anything_is_written(bad):
    out = np.full((9, 4), 7.0)
    call = library_kernel(FilledScatter(ROWS, Fill((9, 4), np.dtype(np.float64), 0.0)))
    with pytest.raises(IndexOutOfRangeError, match=rf"IndexingIncrMultiAxisVec: index value {bad} is out "
                                                  r"of range for axis 0 of size 9"):
        call(np.ones((3, 4)), np.array([0, bad, 1]), out=out)
    assert (out == 7.0).all()


# -- compiled graphs ---------------------------------------------------------------------------

def two_embeddings(dtype: str):
    """Two tables of one shape: CSE gives their gradients one zero Fill, and a third output is
    a Fill of that shape too (zeros + 1, folded), which a kernel writes."""
    with gc.Graph("two_embeddings"):
        a, b = gc.param("a", (9, 4), dtype), gc.param("b", (9, 4), dtype)
        i, j = gc.input("i", (30,), "int64"), gc.input("j", (20,), "int64")
        loss = (gc.tanh(a[i]) * 2.0).sum() + (b[j] * b[j]).sum()
        return [loss, *gc.grad(loss, [a, b]), gc.zeros((9, 4), dtype) + 1.0]


def feeds(rng, dtype: str) -> dict:
    return dict(a=rng.standard_normal((9, 4)).astype(dtype), b=rng.standard_normal((9, 4)).astype(dtype),
                i=rng.integers(-9, 9, 30), j=np.repeat(np.arange(4), 5))


def filled_steps(step) -> list[LibraryStep]:
    return [s for s in step.program.steps if isinstance(s, LibraryStep) and isinstance(s.op, FilledScatter)]


def scatter_loops(step) -> list[KernelStep]:
    """The loops that make the rows of a filled scatter and add them (`kernel.RowScatter`)."""
    return [s for s in step.program.steps if isinstance(s, KernelStep) and s.kernel.scatter is not None]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_each_gradient_is_one_step_and_no_kernel_fills_a_table(rng, dtype):
    """a's gradient is made by the loop that makes its rows (`tanh(a[i])`'s derivative); b's
    rows are b[j] itself, a library gather's output, so a `FilledScatter` call adds them."""
    outputs = two_embeddings(dtype)
    step = gc.compile(outputs)
    values = feeds(rng, dtype)
    for k, (got, want) in enumerate(zip(step(**values), gc.evaluate(outputs, values))):
        assert_close(got, want, rtol=RTOL[dtype], label=f"output {k}")
    calls, loops = filled_steps(step), scatter_loops(step)
    assert len(calls) == 1 and len(loops) == 1
    zeros = {step.graph[s.nodes[0]].inputs[0] for s in calls} | {step.graph[s.nodes[-1]].inputs[0] for s in loops}
    assert len(zeros) == 1 and step.graph[next(iter(zeros))].op.value == 0.0
    kernels = {n for s in step.program.steps if isinstance(s, KernelStep) for n in s.nodes}
    assert not zeros & kernels, "a kernel still writes the zeros that only the scatters read"
    assert not any(spec.node in zeros and spec.size > 1 for spec in step.program.buffers)


def test_the_cuda_target_fills_then_adds(rng):
    cuda_for_tests()
    outputs = two_embeddings("float32")
    step = gc.compile(outputs, target="cuda")
    values = feeds(rng, "float32")
    assert len(filled_steps(step)) == 2
    for got, want in zip(step(**values, to_host=True), gc.evaluate(outputs, values)):
        assert_close(got, want, rtol=RTOL["float32"])
