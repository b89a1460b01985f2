"""Fixtures the CPU backend's kernel tests share."""

from __future__ import annotations

import pytest

from gradcompiler.backends.numba_cpu import library


@pytest.fixture
def parallel_loops(monkeypatch):
    """Run the parallel compilation of every loop, and split work into spans, whatever the size."""
    monkeypatch.setattr(library, "PARALLEL_MIN_WORK", 0)
