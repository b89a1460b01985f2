"""Debug mode (issue 8, part 2): `gc.compile(..., debug=True)` or GRADCOMPILER_DEBUG=1.

* `verify()` runs after every pass, so a pass that breaks the graph is named
  at the pass that broke it, not somewhere downstream;
* after every kernel the outputs are checked for NaN and Inf, and the error
  names the first kernel that produced one and the forward node (the user's
  op and line) whose value, or whose gradient, first went non-finite.
"""

from __future__ import annotations

import inspect
import os

import numpy as np
import pytest

import gradcompiler as gc
import gradcompiler.passes.pipeline as pipeline
from gradcompiler.errors import GraphError, NonFiniteError
from gradcompiler.ops.elemwise import Elemwise

HERE = os.path.abspath(__file__)
TARGETS = ["cpu", "cuda"]


def line_of(marker: str) -> int:
    """The line of this file that holds `marker` (the user's line an error must name)."""
    lines = inspect.getsource(inspect.getmodule(line_of)).splitlines()
    return next(i for i, text in enumerate(lines, 1) if marker in text and "line_of" not in text)


def run(step, target: str, **feeds):
    return step(**feeds, to_host=True) if target == "cuda" else step(**feeds)


def build_log_chain():
    """A fused elementwise chain whose first op, LOG, makes NaN from a negative input;
    the NaN then flows through a matmul and a loss into every later kernel."""
    with gc.Graph("log_chain"):
        x = gc.param("x", (2, 3))
        w = gc.param("w", (3, 2))
        a = gc.log(x)  # marker: log
        b = gc.tanh(a * 2.0 + 1.0) * 3.0
        loss = ((b @ w) ** 2).sum()
        dx, dw = gc.grad(loss, [x, w])
    return [loss, dx, dw]


X_NEGATIVE = np.array([[1, 2, 3], [4, -5, 6]], np.float32)
X_POSITIVE = np.abs(X_NEGATIVE)
W = np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2)


@pytest.fixture(scope="module")
def log_chain_steps():
    outputs = build_log_chain()
    return {(target, debug): gc.compile(outputs, target=target, debug=debug)
            for target in TARGETS for debug in (False, True)}


# -- verify after every pass ------------------------------------------------------------------

@pytest.fixture
def verify_calls(monkeypatch):
    calls = []
    real = pipeline.verify

    def counting(graph):
        calls.append(len(graph))
        return real(graph)

    monkeypatch.setattr(pipeline, "verify", counting)
    return calls


@pytest.mark.parametrize("how", ["argument", "environment", "off"])
def test_verify_runs_after_every_pass(how, verify_calls, monkeypatch):
    if how == "environment":
        monkeypatch.setenv("GRADCOMPILER_DEBUG", "1")
    else:
        monkeypatch.delenv("GRADCOMPILER_DEBUG", raising=False)
    step = gc.compile(build_log_chain(), debug=how == "argument")
    passes_run = len(step.context.stats)
    assert passes_run >= 6  # prune, simplify, cse, fold, simplify, fuse, memory
    assert len(verify_calls) == (0 if how == "off" else passes_run)


def retype_first_add(graph, ctx):
    """A broken rewrite: an ADD becomes an LT, whose (bool) result no longer fits its node."""
    for node in graph.nodes.values():
        if isinstance(node.op, Elemwise) and node.op.mode == "ADD":
            graph.replace_inputs(node.id, node.inputs, op=Elemwise("LT"))
            return {"retyped": 1}
    return {}


def rewire_into_a_cycle(graph, ctx):
    """A broken rewrite: the first TANH reads a value computed from its own output."""
    tanh = next(n for n in graph.nodes.values() if n.op == Elemwise("TANH"))
    consumer = next(c for c in graph.consumers(tanh.id) if graph[c].type == tanh.type)
    graph.replace_inputs(tanh.id, (consumer,))
    return {"rewired": 1}


@pytest.mark.parametrize("broken, message", [
    (retype_first_add, r"after pass 'retype_first_add'.*Elemwise LT.*type float32\[2, 3\]"),
    (rewire_into_a_cycle, r"after pass 'rewire_into_a_cycle'.*cycle"),
])
def test_a_broken_pass_is_named_at_the_pass_that_broke_it(broken, message):
    with pytest.raises(GraphError, match=message):
        gc.compile(build_log_chain(), extra_passes=[broken], debug=True)


# -- NaN / Inf after every kernel ------------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_nan_names_the_first_kernel_and_the_forward_op(target, log_chain_steps):
    step = log_chain_steps[(target, True)]
    with pytest.raises(NonFiniteError) as info:
        run(step, target, x=X_NEGATIVE, w=W)
    message = str(info.value)
    first_kernel = next(k.name for k in step.kernels if "Elemwise LOG" in k.ops)
    assert f"after kernel {first_kernel}," in message, message
    assert f"Elemwise LOG at {HERE}:{line_of('marker: log')}" in message, message


@pytest.mark.parametrize("target", TARGETS)
def test_without_debug_the_nan_flows_out_as_in_the_reference(target, log_chain_steps):
    got = run(log_chain_steps[(target, False)], target, x=X_NEGATIVE, w=W)
    want = gc.evaluate(build_log_chain(), x=X_NEGATIVE, w=W)
    for g, r in zip(got, want):
        np.testing.assert_array_equal(np.isnan(g), np.isnan(r))
    assert np.isnan(got[0])


@pytest.mark.parametrize("target", TARGETS)
def test_debug_changes_no_finite_result(target, log_chain_steps):
    plain = run(log_chain_steps[(target, False)], target, x=X_POSITIVE, w=W)
    checked = run(log_chain_steps[(target, True)], target, x=X_POSITIVE, w=W)
    for p, c in zip(plain, checked):
        np.testing.assert_array_equal(p, c)
    loss = (((np.tanh(np.log(X_POSITIVE.astype(np.float64)) * 2 + 1) * 3) @ W) ** 2).sum()
    np.testing.assert_allclose(checked[0], loss, rtol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_an_infinite_gradient_names_the_forward_op_it_differentiates(target):
    """sqrt is finite at 0 but its gradient is not: the error names SQRT, as a backward value."""
    with gc.Graph("sqrt_at_zero"):
        x = gc.param("x", (3,))
        loss = (gc.sqrt(x) * 2.0).sum()  # marker: sqrt
        dx = gc.grad(loss, x)
    step = gc.compile([loss, dx], target=target, debug=True)
    np.testing.assert_allclose(run(step, target, x=np.array([1, 4, 9], np.float32))[1],
                               [1, 0.5, 1 / 3], rtol=1e-6)
    with pytest.raises(NonFiniteError) as info:
        run(step, target, x=np.array([1, 0, 9], np.float32))
    message = str(info.value)
    assert f"Elemwise SQRT at {HERE}:{line_of('marker: sqrt')} (backward)" in message, message


@pytest.mark.parametrize("target", TARGETS)
def test_overflow_to_inf_is_caught_in_a_library_kernel(target):
    """exp(100) is inf in float32; the matmul that reads it is where the check first sees it
    when exp is fused into the matmul's input, else the exp kernel: either way EXP is named."""
    with gc.Graph("overflow"):
        x = gc.param("x", (2, 2))
        y = gc.exp(x) @ x  # marker: exp
    step = gc.compile(y, target=target, debug=True)
    with pytest.raises(NonFiniteError) as info:
        run(step, target, x=np.array([[1, 100], [0, 1]], np.float32))
    assert f"Elemwise EXP at {HERE}:{line_of('marker: exp')}" in str(info.value), str(info.value)


def test_the_environment_variable_turns_on_the_kernel_check(monkeypatch):
    monkeypatch.setenv("GRADCOMPILER_DEBUG", "1")
    step = gc.compile(build_log_chain())
    with pytest.raises(NonFiniteError, match="Elemwise LOG"):
        step(x=X_NEGATIVE, w=W)
