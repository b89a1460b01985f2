"""scripts/step_profile.py: the per-call profile and the per-launch trace of a compiled step.

Run at the tiny size, on the CPU and on the CUDA simulator (make test sets
NUMBA_ENABLE_CUDASIM=1), the way `make gpu-check` runs it on a GPU. The
oracle is the step itself: the trace must list every launch of the
executable, in order, for both calls, and the profile must name the
generated driver among the functions that took the time.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "step_profile.py"


@pytest.fixture(scope="module")
def step_profile():
    spec = importlib.util.spec_from_file_location("step_profile", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_profile_reports_wall_and_device_time_and_the_hot_functions(step_profile):
    # every function's own time is near zero at this size, so their order is arbitrary: list
    # enough rows for the driver to be among them whatever the order
    text = step_profile.profile("bcast_reduce", "cpu", calls=3, top=50, size="tiny")
    wall, device = map(float, re.search(r"median wall ([\d.]+) ms per call, device \(events\) ([\d.]+) ms",
                                        text).groups())
    assert wall > 0 and device > 0
    assert "function calls" in text and "step" in text  # cProfile's table, the generated driver in it


def test_trace_lists_every_launch_of_both_calls_in_order(step_profile, capsys):
    from numba import cuda

    if not cuda.is_available():  # only outside `make test`, which sets NUMBA_ENABLE_CUDASIM=1
        pytest.skip("no GPU and NUMBA_ENABLE_CUDASIM is not set")
    step_profile.trace("embedding", "cuda", size="tiny")
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("== embedding: compiled in") and lines[-1] == "== embedding: traced"
    launches = [re.match(r"\s+(first|second)\D+(\d+) (.*) \.\.\. ([\d.]+) s$", line) for line in lines[1:-1]]
    assert all(launches), lines
    first = [m.group(3) for m in launches if m.group(1) == "first"]
    second = [m.group(3) for m in launches if m.group(1) == "second"]
    assert first == second and len(first) >= 3
    assert [int(m.group(2)) for m in launches] == list(range(len(first))) * 2
