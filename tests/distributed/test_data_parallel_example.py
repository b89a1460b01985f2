"""examples/data_parallel.py, shortened: the mlp trained on 2 Ray workers gives the losses of
one process (float32: to 1e-5), and the projection of docs/scaling.md follows its formula."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def example():
    sys.path.insert(0, str(EXAMPLES))
    yield importlib.import_module("data_parallel")
    sys.path.remove(str(EXAMPLES))


def test_two_workers_print_the_single_process_losses(example, ray_local, capsys):
    result = example.main(steps=4, batch=15, features=8, hidden=8, classes=3, lr=0.3)
    np.testing.assert_allclose(result["parallel"], result["single"], rtol=1e-5)
    assert result["worst_relative_difference"] <= 1e-5
    assert "(2 workers)" in capsys.readouterr().out


def test_the_projection_is_the_ring_formula(example):
    rows = example.projection(0.01, 4_000_000, 256, worker_counts=(8,), gbits=(100,),
                              latency_s=0.0)
    ring = 2 * 7 / 8 * 4_000_000 / (100e9 / 8)
    assert rows[0]["allreduce_ms"] == pytest.approx(1e3 * ring)
    assert rows[0]["samples_per_s"] == pytest.approx(8 * 256 / (0.01 + ring))
