"""A gather of whole rows read only by the loop after it is absorbed into that loop (`lower`):
a `RowPositions` call checks the index and writes each row's position, and the loop reads the
rows from the table through them (indirect loads), so the gathered values are never written.

The oracle is the reference interpreter on the unoptimised graph (float64 rtol 1e-10, float32
1e-5). The index feeds repeat rows, wrap negative values, leave a batch empty and put NaN in
the table; a bad index still fails before anything is read, with the gather's own message.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends import numba_cpu
from gradcompiler.errors import IndexOutOfRangeError
from gradcompiler.kernel import KernelStep, LibraryStep, Load, RowPositions
from gradcompiler.ops.indexing import IndexingMultiAxisVec

from cuda_support import cuda_for_tests
from oracle import assert_close

RTOL = {"float64": 1e-10, "float32": 1e-5}


def embedding(rows: int, lookups: tuple[int, ...], row_shape: tuple[int, ...], dtype: str):
    """loss = Σ tanh(table[idx]) · r, and its gradient with respect to the table."""
    with gc.Graph("embedding"):
        table = gc.param("table", (rows, *row_shape), dtype)
        idx = gc.input("idx", lookups, "int64")
        r = gc.input("r", (*lookups, *row_shape), dtype)
        loss = (gc.tanh(table[idx]) * r).sum()
        (dtable,) = gc.grad(loss, [table])
    return [loss, dtable]


def feeds(rng, rows: int, lookups: tuple[int, ...], row_shape: tuple[int, ...], dtype: str) -> dict:
    idx = rng.integers(-rows, rows, lookups).astype(np.int64)  # negative values wrap
    if idx.size > 2:
        idx.flat[:3] = (1, 1, 1 - rows)                          # one row three times, once negative
    return dict(table=rng.standard_normal((rows, *row_shape)).astype(dtype), idx=idx,
                r=rng.standard_normal((*lookups, *row_shape)).astype(dtype))


def check(outputs, values: dict, dtype: str):
    step = gc.compile(outputs)
    got, want = step(**values), gc.evaluate(outputs, values)
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, rtol=RTOL[dtype], label=f"output {k}")
    return step


def absorbed(step) -> tuple[list[LibraryStep], list[KernelStep]]:
    """The program's row-position calls, and its loops that read through a position."""
    calls = [s for s in step.program.steps if isinstance(s, LibraryStep) and isinstance(s.op, RowPositions)]
    loops = [s for s in step.program.steps if isinstance(s, KernelStep)
             if any(isinstance(i.expr, Load) and i.expr.offset is not None
                    for p in s.kernel.phases for i in p.instrs)]
    return calls, loops


@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_the_loop_reads_the_rows_through_their_positions(rng, monkeypatch, dtype, parallel):
    if parallel:
        monkeypatch.setattr(numba_cpu, "PARALLEL_MIN_POINTS", 0)
    outputs = embedding(9, (40,), (16,), dtype)
    step = check(outputs, feeds(rng, 9, (40,), (16,), dtype), dtype)
    calls, loops = absorbed(step)
    assert len(calls) == 1 and len(loops) == 1
    gathers = [s for s in step.program.steps if isinstance(s, LibraryStep) and isinstance(s.op, IndexingMultiAxisVec)]
    assert not gathers, "the rows were still copied by a gather"
    assert "prefetch_read(" in step.source(), "the loop does not ask for the rows ahead"


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_an_index_of_several_axes_and_rows_of_several_axes(rng, dtype):
    """Positions at the index's axes (a batch of sequences), the row at the table's trailing ones."""
    outputs = embedding(7, (3, 5), (2, 4), dtype)
    step = check(outputs, feeds(rng, 7, (3, 5), (2, 4), dtype), dtype)
    assert [len(found) for found in absorbed(step)] == [1, 1]


def test_an_empty_batch(rng):
    outputs = embedding(6, (0,), (8,), "float64")
    step = check(outputs, feeds(rng, 6, (0,), (8,), "float64"), "float64")
    loss, dtable = step(**feeds(rng, 6, (0,), (8,), "float64"))
    assert loss == 0 and not dtable.any()


def test_nan_in_the_table_reaches_only_the_rows_that_read_it(rng):
    values = feeds(rng, 9, (40,), (16,), "float64")
    values["table"][4, 3] = np.nan
    values["idx"][5] = 4
    step = check(embedding(9, (40,), (16,), "float64"), values, "float64")
    loss, dtable = step(**values)
    assert np.isnan(loss) and np.isnan(dtable[4, 3]) and np.isfinite(np.delete(dtable, 4, axis=0)).all()


@pytest.mark.parametrize("bad", [9, -10])
def test_an_index_out_of_range_fails_with_the_gathers_message(rng, bad):
    step = gc.compile(embedding(9, (40,), (16,), "float32"))
    values = feeds(rng, 9, (40,), (16,), "float32")
    values["idx"][17] = bad
    with pytest.raises(IndexOutOfRangeError, match=rf"IndexingMultiAxisVec: index value {bad} is out of "
                                                  r"range for axis 0 of size 9"):
        step(**values)


def test_a_gather_read_elsewhere_too_is_still_copied(rng):
    """The gathered rows are an output of their own: they must exist, so the gather stays."""
    with gc.Graph("kept"):
        table = gc.param("table", (9, 16), "float64")
        idx = gc.input("idx", (40,), "int64")
        rows = table[idx]
        outputs = [rows, gc.tanh(rows).sum()]
    step = check(outputs, {k: v for k, v in feeds(rng, 9, (40,), (16,), "float64").items() if k != "r"},
                 "float64")
    assert absorbed(step) == ([], [])


def test_the_cuda_target_keeps_the_library_gather(rng):
    """Only the CPU code generator reads through positions; the CUDA target's gather is a call."""
    cuda_for_tests()
    outputs = embedding(9, (40,), (16,), "float32")
    values = feeds(rng, 9, (40,), (16,), "float32")
    step = gc.compile(outputs, target="cuda")
    assert not any(isinstance(s.op, RowPositions) for s in step.program.steps if isinstance(s, LibraryStep))
    for g, w in zip(step(**values, to_host=True), gc.evaluate(outputs, values)):
        assert_close(g, w, rtol=RTOL["float32"])
