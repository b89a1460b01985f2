"""Rematerialisation under a memory budget (passes/remat.py): the same values at every
budget, a planned peak within it, the min-cut's choice on a chain of matmul+cos pairs, and
a clear error below the smallest reachable peak."""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.passes.pipeline import optimize
from oracle import assert_close

BATCH, WIDTH, BLOCKS = 32, 8, 3


def residual_mlp():
    """x → BLOCKS residual blocks h + W₂·tanh(W₁·h) → a squared-error loss."""
    with gc.Graph("residual_mlp") as graph:
        x = gc.input("x", (BATCH, WIDTH), "float64")
        target = gc.input("target", (BATCH, WIDTH), "float64")
        params, h = [], x
        for k in range(BLOCKS):
            w1 = gc.param(f"w1_{k}", (WIDTH, WIDTH), "float64")
            w2 = gc.param(f"w2_{k}", (WIDTH, WIDTH), "float64")
            params += [w1, w2]
            h = h + gc.tanh(h @ w1) @ w2
        loss = ((h - target) ** 2).mean()
    return graph, loss, params


def run_steps(step, rng_seed=4, steps=3):
    rng = np.random.default_rng(rng_seed)
    names = [n for n in step.state_names if "." not in n and n != "step"]
    state = step.init({n: rng.standard_normal((WIDTH, WIDTH)) * 0.3 for n in names})
    losses = [step(state, x=rng.standard_normal((BATCH, WIDTH)),
                   target=rng.standard_normal((BATCH, WIDTH))) for _ in range(steps)]
    return losses, state


def test_residual_mlp_at_the_full_budget_equals_no_budget_and_a_smaller_one_names_the_peak():
    """At 1.0 nothing is recomputed and the step is the unbudgeted one. Below it: every value
    the residual blocks keep needs a matmul to recompute, and recomputing each value once
    (module docstring of remat) does not lower this step's peak, so a tighter budget is the
    error that names the smallest peak found."""
    _, loss, params = residual_mlp()
    plain = gc.train_step(loss, params, gc.optim.Adam(0.01))
    full = gc.train_step(loss, params, gc.optim.Adam(0.01), memory_budget=1.0)
    remat = full.executable.context.remat
    assert remat.recomputed == [] and remat.peak == remat.default_peak
    assert full.executable.memory.peak_bytes == plain.executable.memory.peak_bytes
    want_losses, want_state = run_steps(plain)
    losses, state = run_steps(full)
    assert_close(np.array(losses), np.array(want_losses), rtol=1e-12)
    for name in want_state:
        assert_close(state[name], want_state[name], rtol=1e-12, label=name)
    with pytest.raises(gc.MemoryBudgetError, match=f"reaches, .* \\({remat.default_peak} bytes\\)"):
        gc.train_step(loss, params, gc.optim.Adam(0.01), memory_budget=0.8)


def chain(pairs: int):
    with gc.Graph("matmul_cos_chain") as graph:
        x = gc.input("x", (64, 8), "float64")
        ws = [gc.param(f"w{i}", (8, 8), "float64") for i in range(pairs)]
        h, products = x, []
        for w in ws:
            products.append(h @ w)
            h = gc.cos(products[-1])
        loss = h.sum()
    return graph, loss, ws, products


def test_chain_of_matmul_cos_pairs_recomputes_the_cos_and_keeps_the_matmuls():
    """The backward reads every product m (for sin) and every cos c (for the next dW): the
    min-cut keeps the m's and recomputes each c = cos(m). Keeping all 8 products bounds the
    peak at 9/16 of the default here, so 0.7 is met by that choice alone; at 0.6 one matmul
    must be recomputed too, the cheapest per byte; 0.5 is below any plan."""
    _, loss, ws, products = chain(8)
    outputs = [loss, *gc.grad(loss, ws)]
    _, ctx = optimize(loss.graph, [t.id for t in outputs], memory_budget=0.7)
    graph, remat = loss.graph, ctx.remat
    assert remat.peak <= 0.7 * remat.default_peak
    assert sorted(remat.kept) == sorted(p.id for p in products)
    assert len(remat.recomputed) == 7 and {graph[v].op.label for v in remat.recomputed} == {
        "Elemwise COS"}
    assert remat.bytes_saved == 7 * 64 * 8 * 8
    assert remat.extra_flops == 7 * 64 * 8 * 8  # one cos per element of each (fuser weights)
    _, tighter = optimize(loss.graph, [t.id for t in outputs], memory_budget=0.6)
    labels = [graph[v].op.label for v in tighter.remat.recomputed]
    assert labels.count("Elemwise COS") == 7 and labels.count("MatrixMul") >= 1
    with pytest.raises(gc.MemoryBudgetError,
                       match=r"below the smallest peak .* reaches, 34\.0 KiB"):
        optimize(loss.graph, [t.id for t in outputs], memory_budget=0.5)


def test_chain_compiled_under_a_budget_equals_the_reference_and_reports_its_choice():
    _, loss, ws, _ = chain(3)
    grads = gc.grad(loss, ws)
    step = gc.compile([loss, *grads], memory_budget=0.8)
    rng = np.random.default_rng(9)
    feeds = {"x": rng.standard_normal((64, 8)), **{f"w{i}": rng.standard_normal((8, 8)) * 0.4
                                                    for i in range(3)}}
    for got, want in zip(step(**feeds), gc.evaluate([loss, *grads], **feeds)):
        assert_close(np.asarray(got), np.asarray(want), rtol=1e-12)
    report = step.report()
    assert "== remat ==" in report and "recomputed" in report
    assert "recomputed" in step.to_dot()


def test_a_budget_that_is_neither_bytes_nor_a_fraction_is_refused():
    _, loss, ws, _ = chain(2)
    with pytest.raises(ValueError, match="fraction must lie in"):
        optimize(loss.graph, [loss.id, *(g.id for g in gc.grad(loss, ws))], memory_budget=1.5)
