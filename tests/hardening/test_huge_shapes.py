"""Shapes whose element count overflows int64 keep exact sizes, and a step whose buffers
cannot exist is refused at compile time with an error naming the value, its shape and bytes.

Sizes are Python ints (`math.prod`): `np.prod(..., dtype=np.int64)` of (2**40, 2**40) is 0.
"""

from __future__ import annotations

import importlib

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import MemoryPlanError

compile_module = importlib.import_module("gradcompiler.compile")  # the module, not gc.compile


def test_sizes_beyond_int64_are_exact():
    with gc.Graph("huge"):
        a = gc.input("a", (2**40, 2**40))
        assert a.size == 2**80 and type(a.size) is int
        assert a.reshape(-1).shape == (2**80,)
        assert a.reshape(2**20, -1).shape == (2**20, 2**60)
        assert (a * 2.0).sum(axis=1).shape == (2**40,)
        assert a.type.nbytes == 4 * 2**80


def _huge_step():
    with gc.Graph("huge_step"):
        b = gc.input("b", (2**31, 2**31))
        y = gc.exp(b) * 2.0  # the line the error names
    return y


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_a_step_too_big_for_any_memory_is_refused_at_compile(target):
    if target == "cuda":
        from gradcompiler.backends.numba_cuda import require_cuda

        require_cuda()
    y = _huge_step()
    with pytest.raises(MemoryPlanError) as info:
        gc.compile(y, target=target)
    message = str(info.value)
    assert "Elemwise" in message and "test_huge_shapes.py" in message
    assert f"shape ({2**31}, {2**31}) float32" in message and f"({4 * 2**62} bytes)" in message
    assert f"of target '{target}'" in message


def test_a_plan_over_the_machines_memory_names_its_largest_value():
    """The limit is the machine's memory: a plan of 3 MiB against a limit of 1 MiB."""
    with gc.Graph("over"):
        x = gc.input("x", (512, 512), "float64")
        y = gc.tanh(x) @ x
    step = gc.compile(y)  # fits the machine
    np.testing.assert_allclose(step(x=np.eye(512)), gc.evaluate(y, x=np.eye(512)))
    with pytest.raises(MemoryPlanError, match=r"more than the 1\.0 MiB of memory of target 'cpu'.*"
                                              r"shape \(512, 512\) float64, 2\.0 MiB \(2097152 bytes\)"):
        compile_module._check_memory(step.graph, step.program, step.memory.buffer_sizes, "cpu",
                                     limit=1 << 20)


def test_an_allocation_that_fails_is_told_as_the_plan_error(monkeypatch):
    """Memory the check cannot foresee (other processes, the process's limits): numpy's
    MemoryError becomes the error that names the value."""
    monkeypatch.setattr(compile_module, "_memory_limit", lambda target: 2**80)
    with gc.Graph("unforeseen"):
        b = gc.input("b", (2**30, 2**30))
        y = gc.exp(b) * 2.0
    with pytest.raises(MemoryPlanError, match=r"cannot be allocated.*shape \(1073741824, 1073741824\)"):
        gc.compile(y)
