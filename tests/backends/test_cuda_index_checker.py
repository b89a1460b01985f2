"""The CUDA index check (`device.IndexChecker`) keeps its device buffers from call to call:
a gather and its scatter-add gradient on device indices allocate nothing for the check after
the first call, a bad value still raises before any kernel reads it, and the calls after it
give the reference's values again (the reused buffers carry nothing over)."""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends.numba_cuda import device
from gradcompiler.errors import IndexOutOfRangeError

from cuda_support import cuda_for_tests
from oracle import assert_close


def _embedding_step():
    with gc.Graph("embedding rows"):
        table = gc.param("table", (6, 3), "float32")
        ids = gc.input("ids", (5,), "int64")
        loss = (gc.tanh(table[ids]) * 2.0).sum()
        grad = gc.grad(loss, [table])[0]
    return [loss, grad], gc.compile([loss, grad], target="cuda")


def test_the_index_check_allocates_once_and_every_call_is_checked_afresh(monkeypatch):
    cuda = cuda_for_tests()
    outputs, step = _embedding_step()
    rng = np.random.default_rng(2)
    table = rng.standard_normal((6, 3)).astype(np.float32)
    allocations = []
    real = device.cuda.device_array

    def counted(*args, **kwargs):
        allocations.append(args)
        return real(*args, **kwargs)

    for call, ids in enumerate(([0, 5, 5, -1, 2], [1, 1, 1, 1, 1], [4, 3, 2, 1, 0])):
        ids = np.array(ids, np.int64)
        feeds = dict(table=table, ids=ids)
        on_device = {"table": cuda.to_device(table), "ids": cuda.to_device(ids)}
        if call == 1:  # the checker's buffers exist: count what a call allocates for the check
            monkeypatch.setattr(device.cuda, "device_array", counted)
        before = step._runner.allocations  # the executable's own: the outputs' storage per call
        for got, want in zip(step(to_host=True, **on_device), gc.evaluate(outputs, feeds)):
            assert_close(got, want, rtol=1e-5, label=f"call {call}")
        if call:
            assert len(allocations) == step._runner.allocations - before, allocations
            allocations.clear()
    with pytest.raises(IndexOutOfRangeError, match=r"index value 6 .*axis 0 of size 6"):
        step(to_host=True, table=cuda.to_device(table), ids=cuda.to_device(np.array([0, 1, 6, 2, 3])))
    ids = np.array([2, 2, 0, 1, -6], np.int64)  # after the error: the same buffers, fresh values
    got = step(to_host=True, table=cuda.to_device(table), ids=cuda.to_device(ids))
    for g, w in zip(got, gc.evaluate(outputs, dict(table=table, ids=ids))):
        assert_close(g, w, rtol=1e-5, label="after the error")
