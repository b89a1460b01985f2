"""A loop that alone feeds a scatter-add of rows onto a Fill makes that scatter itself on the CPU
(`fuse.attach_scatters`, `kernel.RowScatter`): each thread fills its blocks of the output and
adds the rows of the lookups that land there as it makes them, so the rows are never stored.

Oracles: the reference interpreter on the unoptimised graph (float64 rtol 1e-10, float32 1e-5),
and np.add.at onto np.full, bitwise, where the rows are exact (2·r): duplicates must accumulate
in increasing lookup order, whatever the blocks and threads. Cases: repeated and negative
indices, a NaN row of the table, a fill other than zero, rows of several axes, rows made over
several phases beside a column sum, blocks of one and two rows, more threads than blocks, empty batches, rows and
tables, a bad index (raised by the scatter's own check, before anything is written), and the
loops that must leave the scatter to its library call.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends import numba_cpu
from gradcompiler.backends.numba_cpu import row_blocks
from gradcompiler.errors import IndexOutOfRangeError
from gradcompiler.kernel import FilledScatter, KernelStep, LibraryStep

from oracle import assert_close

RTOL = {"float64": 1e-10, "float32": 1e-5}


@pytest.fixture(params=[False, True], ids=["one_thread", "threads"])
def threads(request, monkeypatch):
    """Loops compiled serial, or parallel whatever their size."""
    if request.param:
        monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_POINTS", 0)
    return request.param


def scatter_loops(step) -> list[KernelStep]:
    return [s for s in step.program.steps if isinstance(s, KernelStep) and s.kernel.scatter is not None]


def library_scatters(step) -> list[LibraryStep]:
    return [s for s in step.program.steps if isinstance(s, LibraryStep) and isinstance(s.op, FilledScatter)]


def check(outputs, values: dict, dtype: str):
    step = gc.compile(outputs)
    want = gc.evaluate(outputs, values)
    for _ in range(2):                      # the second call runs on the buffers of the first
        for k, (g, w) in enumerate(zip(step(**values), want)):
            assert_close(g, w, rtol=RTOL[dtype], label=f"output {k}")
    return step


def embedding(rows: int, lookups: int, width: int, dtype: str):
    with gc.Graph("embedding"):
        table = gc.param("table", (rows, width), dtype)
        idx = gc.input("idx", (lookups,), "int64")
        r = gc.input("r", (lookups, width), dtype)
        loss = (gc.tanh(table[idx]) * r).sum()
        return [loss, *gc.grad(loss, [table])]


def lookups_of(rng, rows: int, lookups: int) -> np.ndarray:
    idx = rng.integers(-rows, rows, lookups).astype(np.int64)   # negative values wrap
    idx[:4] = (3, 3, 3 - rows, 0)[:lookups]                      # row 3 three times, once negative
    return idx


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_embedding_gradient_is_made_by_the_loop(rng, threads, dtype):
    outputs = embedding(11, 300, 16, dtype)
    table = rng.standard_normal((11, 16)).astype(dtype)
    table[5, 2] = np.nan
    values = dict(table=table, idx=lookups_of(rng, 11, 300), r=rng.standard_normal((300, 16)).astype(dtype))
    step = check(outputs, values, dtype)
    (loop,) = scatter_loops(step)
    assert not library_scatters(step)
    scatter = step.graph[loop.nodes[-1]]
    assert not any(spec.node == scatter.inputs[1] for spec in step.program.buffers), "the rows were stored"
    grad = step(**values)[1]
    assert np.isnan(grad[5, 2]) and np.isfinite(np.delete(grad, 5, axis=0)).all()


def test_rows_of_several_axes(rng, threads):
    """A table of (7, 2, 3): each lookup's row is six elements over two inner axes."""
    with gc.Graph("embedding"):
        table = gc.param("table", (7, 2, 3), "float32")
        idx = gc.input("idx", (40,), "int64")
        r = gc.input("r", (40, 2, 3), "float32")
        loss = (gc.tanh(table[idx]) * r).sum()
        outputs = [loss, *gc.grad(loss, [table])]
    values = dict(table=rng.standard_normal((7, 2, 3)).astype(np.float32), idx=lookups_of(rng, 7, 40),
                  r=rng.standard_normal((40, 2, 3)).astype(np.float32))
    assert len(scatter_loops(check(outputs, values, "float32"))) == 1


@pytest.mark.parametrize("block", [1, 2], ids=["blocks_of_1_row", "blocks_of_2_rows"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_duplicates_add_in_lookup_order_bitwise(rng, threads, monkeypatch, block, dtype):
    rows = 13 + block                                            # an odd number: the last block is short
    monkeypatch.setattr(row_blocks, "FILL_BLOCK_BYTES", 4 * np.dtype(dtype).itemsize * block)
    with gc.Graph("index_add"):
        idx = gc.input("idx", (500,), "int64")
        r = gc.input("r", (500, 4), dtype)
        out = gc.index_add(gc.full((rows, 4), 1.5, dtype), idx, r * 2.0)
    step = gc.compile(out)
    assert len(scatter_loops(step)) == 1
    idx = lookups_of(rng, rows, 500)
    r = rng.standard_normal((500, 4)).astype(dtype)
    want = np.full((rows, 4), 1.5, dtype)
    np.add.at(want, idx, r * 2)
    np.testing.assert_array_equal(step(idx=idx, r=r), want)


def test_more_threads_than_blocks(rng, threads):
    """Three rows are one block of the default size: one thread owns it, the other none."""
    with gc.Graph("index_add"):
        idx = gc.input("idx", (50,), "int64")
        r = gc.input("r", (50, 4), "float32")
        out = gc.index_add(gc.zeros((3, 4), "float32"), idx, r * 2.0)
    idx, r = rng.integers(0, 3, 50), rng.standard_normal((50, 4)).astype(np.float32)
    want = np.zeros((3, 4), np.float32)
    np.add.at(want, idx, r * 2)
    np.testing.assert_array_equal(gc.compile(out)(idx=idx, r=r), want)


def test_rows_made_over_phases_beside_a_column_sum(rng, threads):
    """softmax(table[idx] + w): its gradient's rows need each row's sums first (phases), and
    w's gradient sums the same rows over the lookups (a column sum in the same loop)."""
    with gc.Graph("softmax_rows"):
        table = gc.param("table", (9, 24), "float64")
        w = gc.param("w", (24,), "float64")
        idx = gc.input("idx", (70,), "int64")
        r = gc.input("r", (70, 24), "float64")
        loss = (gc.softmax(table[idx] + w, axis=1) * r).sum()
        outputs = [loss, *gc.grad(loss, [table, w])]
    values = dict(table=rng.standard_normal((9, 24)), w=rng.standard_normal(24),
                  idx=lookups_of(rng, 9, 70), r=rng.standard_normal((70, 24)))
    step = check(outputs, values, "float64")
    (loop,) = scatter_loops(step)
    assert len(loop.kernel.phases) > 1


@pytest.mark.parametrize("shape,lookups", [((6, 4), 0), ((6, 0), 5), ((0, 4), 0)])
def test_empty_batches_rows_and_tables_fill(rng, shape, lookups):
    with gc.Graph("index_add"):
        idx = gc.input("idx", (lookups,), "int64")
        r = gc.input("r", (lookups, *shape[1:]), "float64")
        out = gc.index_add(gc.full(shape, 2.0, "float64"), idx, r * 2.0)
    got = gc.compile(out)(idx=rng.integers(0, max(shape[0], 1), lookups), r=np.ones((lookups, *shape[1:])))
    np.testing.assert_array_equal(got, np.full(shape, 2.0))


@pytest.mark.parametrize("bad", [9, -10])
def test_a_bad_index_raises_before_anything_is_written(bad):
    with gc.Graph("index_add"):
        idx = gc.input("idx", (3,), "int64")
        r = gc.input("r", (3, 4), "float64")
        out = gc.index_add(gc.zeros((9, 4), "float64"), idx, r * 2.0)
    step = gc.compile(out)
    assert len(scatter_loops(step)) == 1
    garbage = np.full((9, 4), 7.0)
    with pytest.raises(IndexOutOfRangeError, match=rf"IndexingIncrMultiAxisVec: index value {bad} is out "
                                                  r"of range for axis 0 of size 9"):
        step(idx=np.array([0, bad, 1]), r=np.ones((3, 4)), out=garbage)
    assert (garbage == 7.0).all()


def test_rows_read_elsewhere_or_looked_up_by_a_matrix_are_left_to_the_library_call(rng):
    """The rows are an output too (so they are stored anyway), or the index has two axes (so
    the loop's axis 0 is not the lookups): the scatter stays a `FilledScatter` call."""
    with gc.Graph("left_alone"):
        i = gc.input("i", (40,), "int64")
        j = gc.input("j", (5, 8), "int64")
        r = gc.input("r", (40, 4), "float32")
        s = gc.input("s", (5, 8, 4), "float32")
        rows = r * 2.0
        outputs = [rows, gc.index_add(gc.zeros((6, 4), "float32"), i, rows),
                   gc.index_add(gc.zeros((6, 4), "float32"), j, s * 2.0)]
    values = dict(i=rng.integers(-6, 6, 40), j=rng.integers(0, 6, (5, 8)),
                  r=rng.standard_normal((40, 4)).astype(np.float32),
                  s=rng.standard_normal((5, 8, 4)).astype(np.float32))
    step = check(outputs, values, "float32")
    assert not scatter_loops(step) and len(library_scatters(step)) == 2


def test_the_cuda_generator_refuses_a_loop_that_makes_a_scatter(rng):
    """The CUDA target plans without such loops (`test_filled_scatter` runs its embeddings);
    handed one anyway, its code generator says so instead of dropping the scatter."""
    from gradcompiler.backends.numba_cuda import codegen as cuda_codegen

    (loop,) = scatter_loops(gc.compile(embedding(5, 12, 4, "float32")))
    with pytest.raises(ValueError, match="makes a scatter"):
        cuda_codegen.generate(loop.kernel, 32, False)
