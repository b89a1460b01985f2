"""Lowering of a loop that the memory plan runs in place: the output and the input it overwrites
are one kernel parameter, read and written, whether they share a buffer (a donation) or the
plan's storage (an input dying in the loop).

Two parameters holding one array fail LLVM's run-time overlap check, and the loop then runs
its scalar version (the batch norm backward's loop took twice as long); one parameter is one
pointer, whose load and store of the same element vectorise. Oracle: numpy.
"""

from __future__ import annotations

import numpy as np

import gradcompiler as gc
from gradcompiler.kernel import KernelStep, LibraryStep

from oracle import assert_close


def _storage(program, buffer):
    spec = program.buffers[buffer]
    return program.buffers[spec.alias_of if spec.alias_of is not None else buffer].storage


def _centred_tanh(h):
    return gc.tanh(h - h.sum(axis=0, keepdims=True))  # a column sum: a loop of its own, then this


def test_a_loop_over_its_dying_input_has_one_parameter_for_both(rng):
    with gc.Graph("in_place"):
        x, w = gc.input("x", (16, 8), "float32"), gc.param("w", (8, 6), "float32")
        h = x @ w  # the product's buffer dies in the last loop, which overwrites it
        out = _centred_tanh(h)
    step = gc.compile([out])
    (product,) = (s for s in step.program.steps if isinstance(s, LibraryStep))
    last = step.program.steps[-1]
    assert [p.role for p in last.kernel.params] == ["out", "in"]  # h updated; the column sums
    assert _storage(step.program, last.args[0]) == _storage(step.program, product.outputs[0]) is not None
    feeds = {"x": rng.standard_normal((16, 8)).astype("float32"),
             "w": rng.standard_normal((8, 6)).astype("float32")}
    h = feeds["x"].astype("float64") @ feeds["w"]
    assert_close(step(**feeds)[0], np.tanh(h - h.sum(axis=0, keepdims=True)).astype(np.float32),
                 rtol=1e-5, atol=1e-6)


def test_a_loop_whose_input_lives_on_keeps_it_a_parameter_of_its_own(rng):
    with gc.Graph("not_in_place"):
        x, w = gc.input("x", (16, 8), "float32"), gc.param("w", (8, 6), "float32")
        h = x @ w
        out, kept = _centred_tanh(h), h  # h is an output too: the loop cannot overwrite it
    step = gc.compile([out, kept])
    last = next(s for s in step.program.steps if isinstance(s, KernelStep) and out.id in s.nodes)
    assert sorted(p.role for p in last.kernel.params) == ["in", "in", "out"]
    feeds = {"x": rng.standard_normal((16, 8)).astype("float32"),
             "w": rng.standard_normal((8, 6)).astype("float32")}
    h = feeds["x"].astype("float64") @ feeds["w"]
    got_out, got_h = step(**feeds)
    assert_close(got_out, np.tanh(h - h.sum(axis=0, keepdims=True)).astype(np.float32), rtol=1e-5, atol=1e-6)
    assert_close(got_h, h.astype(np.float32), rtol=1e-5, atol=1e-6)
