"""The bounds check (backends/numba_cpu/buffers.py): guard bytes around every buffer an executable
and the library kernels own, checked after every step.

A kernel made to store one AVX-512 vector (64 bytes) past its output, or to write before it,
is caught with the step's name, its forward op and the user's line, whether the output is an
intermediate in an arena, an output array or the library's own scratch; an executable that
stays within its buffers runs as without the check, and equals numpy. Without the check, no
array is fenced or recorded.
"""

from __future__ import annotations

import ctypes
import inspect

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends import numba_cpu
from gradcompiler.backends.numba_cpu import buffers


def _spill(array: np.ndarray, before: bool = False) -> None:
    """Write 64 bytes just past the end of `array` (or just before its start), as a kernel whose
    last vector store is one too many would."""
    start = array.ctypes.data + (-64 if before else array.nbytes)
    (ctypes.c_uint8 * 64).from_address(start)[:] = bytes(range(64))


@pytest.fixture
def spilling_products(monkeypatch):
    """Every library routine built from now on writes past its output after computing it."""
    routine_of = numba_cpu.library_call

    def spilling(op):
        routine = routine_of(op)

        def call(*inputs, out):
            routine(*inputs, out=out)
            _spill(out)
        return call

    monkeypatch.setattr(numba_cpu, "library_call", spilling)


def _mlp():
    with gc.Graph():
        x, w = gc.input("x", (64, 48)), gc.input("w", (48, 40))
        line = inspect.currentframe().f_lineno + 1
        hidden = gc.tanh(x @ w)
        return gc.sum(hidden * hidden), line


def _feeds(rng):
    return {"x": rng.standard_normal((64, 48)).astype(np.float32),
            "w": rng.standard_normal((48, 40)).astype(np.float32)}


def test_a_store_past_an_intermediate_names_the_kernel_and_the_users_line(spilling_products, monkeypatch, rng):
    """The product's output lives in an arena, flush against its end in the check: the spill
    reaches the arena's guard bytes."""
    monkeypatch.setenv(buffers.CHECK_ENV, "1")
    loss, line = _mlp()
    step = gc.compile(loss)
    with pytest.raises(gc.OutOfBoundsWriteError) as caught:
        step(**_feeds(rng))
    message = str(caught.value)
    assert "MatrixMul" in message and f"test_bounds_check.py:{line}" in message, message
    assert "guard bytes after it" in message


def test_a_store_past_an_output_array_is_caught(spilling_products, rng):
    """`debug=True` turns the check on too; the product is the executable's output here."""
    with gc.Graph():
        x, w = gc.input("x", (64, 48)), gc.input("w", (48, 40))
        step = gc.compile(x @ w, debug=True)
    with pytest.raises(gc.OutOfBoundsWriteError, match="MatrixMul.*output 0"):
        step(**_feeds(rng))


def test_a_write_before_the_libraries_scratch_is_caught(monkeypatch):
    """Library scratch (here a product's packing buffer, kept across calls) is fenced on both sides."""
    monkeypatch.setenv(buffers.CHECK_ENV, "1")
    scratch = buffers.empty(1000, np.float32, label="a packing buffer")
    assert buffers.broken_guard([]) is None
    _spill(scratch, before=True)
    assert buffers.broken_guard([]) == ("a packing buffer (4000 bytes): its guard bytes before it were overwritten")
    buffers.LIBRARY_BLOCKS.clear()


def test_an_executable_within_its_buffers_runs_checked_and_equals_numpy(monkeypatch, rng):
    monkeypatch.setenv(buffers.CHECK_ENV, "1")
    loss, _ = _mlp()
    step = gc.compile(loss)
    assert step._runner.blocks   # its buffers are fenced
    feeds = _feeds(rng)
    for _ in range(3):
        value = step(**feeds)
    hidden = np.tanh(feeds["x"].astype(np.float64) @ feeds["w"])
    assert abs(float(value) - float(np.sum(hidden * hidden))) <= 1e-4 * float(np.sum(hidden * hidden))


def test_without_the_check_nothing_is_fenced(monkeypatch):
    monkeypatch.delenv(buffers.CHECK_ENV, raising=False)
    before = len(buffers.LIBRARY_BLOCKS)
    array = buffers.empty((3, 5), np.float64)
    assert array.shape == (3, 5) and array.ctypes.data % buffers.ALIGN == 0
    assert array.base.nbytes < 15 * 8 + 2 * buffers.GUARD and len(buffers.LIBRARY_BLOCKS) == before
