"""The CPU driver runs its steps in parts of DRIVER_PART_STEPS: split finely, the mlp step
still computes what the reference interpreter does, and every part is called once, in order."""

import re

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends.numba_cpu import runtime
from gradcompiler.bench import workloads
from gradcompiler.reference import run_graph


@pytest.mark.parametrize("part_steps", [1, 3, 10_000])
def test_a_driver_in_parts_computes_the_step(monkeypatch, part_steps):
    monkeypatch.setattr(runtime, "DRIVER_PART_STEPS", part_steps)
    w = workloads.build("mlp", "tiny")
    step = gc.compile(w.outputs, debug=True)  # debug: every output also checked by name
    source = step._build.runner.source
    steps = len(step.program.steps)
    parts = -(-steps // part_steps)
    assert len(re.findall(r"^def make_p\d+\(", source, re.MULTILINE)) == parts
    assert re.findall(r"^        (p\d+)\(", source, re.MULTILINE) == [f"p{c}" for c in range(parts)]
    feeds = workloads.feeds_for(w)
    expected = run_graph(w.graph, [t.id for t in w.outputs], feeds)
    for _ in range(2):  # the second call reuses the arrays the first handed out
        for got, want in zip(step(**feeds), expected, strict=True):
            np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
