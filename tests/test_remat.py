"""Rematerialisation under a memory budget (passes/remat.py): the same values at every
budget, a planned peak within it, the choices on a chain of matmul+cos pairs (min-cut, then
segments), segmented recomputation on a residual net and on the gpt workload's training
step, and a clear error below the smallest reachable peak."""

from __future__ import annotations

import re

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.bench import workloads
from gradcompiler.passes.pipeline import optimize

from oracle import assert_close

BATCH, WIDTH, BLOCKS = 16, 8, 8


def residual_mlp():
    """x → BLOCKS residual blocks h + tanh(layer_norm(h·W + b)) → a squared-error loss."""
    with gc.Graph("residual_mlp") as graph:
        x = gc.input("x", (BATCH, WIDTH), "float64")
        target = gc.input("target", (BATCH, WIDTH), "float64")
        params, h = [], x
        for k in range(BLOCKS):
            w = gc.param(f"w{k}", (WIDTH, WIDTH), "float64")
            b = gc.param(f"b{k}", (WIDTH,), "float64")
            params += [w, b]
            h = h + gc.tanh(gc.layer_norm(h @ w + b))
        loss = ((h - target) ** 2).mean()
    return graph, loss, params


def run_steps(step, rng_seed=4, steps=3):
    rng = np.random.default_rng(rng_seed)
    shapes = {"w": (WIDTH, WIDTH), "b": (WIDTH,)}
    names = [n for n in step.state_names if "." not in n and n != "step"]
    state = step.init({n: rng.standard_normal(shapes[n[0]]) * 0.3 for n in names})
    losses = [step(state, x=rng.standard_normal((BATCH, WIDTH)),
                   target=rng.standard_normal((BATCH, WIDTH))) for _ in range(steps)]
    return losses, state


def assert_same_training(got, want):
    """Two (losses, state) runs agree to float64 rounding."""
    (losses, state), (want_losses, want_state) = got, want
    assert_close(np.array(losses), np.array(want_losses), rtol=1e-12)
    for name in want_state:
        assert_close(state[name], want_state[name], rtol=1e-12, label=name)


def test_residual_mlp_trains_the_same_at_every_budget_within_its_planned_peak():
    """Every value the residual blocks keep needs a matmul to recompute, and the residual
    stream makes every h recomputable from x by a chain of adds: recomputed once for all of
    the backward, that chain is alive at its start and no budget below 1.0 is met. Cut into
    segments whose boundaries (the h between blocks) are kept, each block is recomputed
    just before its own backward, so 0.5 is met. 0.25 is below any plan of this small net
    (the gradients in flight and the boundaries stay): the error names the smallest peak,
    and that peak, as bytes, is a budget that compiles."""
    _, loss, params = residual_mlp()
    plain = gc.train_step(loss, params, gc.optim.Adam(0.01))
    want_losses, want_state = run_steps(plain)
    full = gc.train_step(loss, params, gc.optim.Adam(0.01), memory_budget=1.0)
    remat = full.executable.context.remat
    assert remat.recomputed == [] and remat.peak == remat.default_peak
    assert full.executable.memory.peak_bytes == plain.executable.memory.peak_bytes
    assert_same_training(run_steps(full), (want_losses, want_state))
    half = gc.train_step(loss, params, gc.optim.Adam(0.01), memory_budget=0.5)
    remat = half.executable.context.remat
    assert remat.segments > 1 and remat.recomputed
    assert half.executable.memory.peak_bytes == remat.peak <= 0.5 * remat.default_peak
    assert_same_training(run_steps(half), (want_losses, want_state))
    with pytest.raises(gc.MemoryBudgetError, match=r"reaches, .* \((\d+) bytes\)") as error:
        gc.train_step(loss, params, gc.optim.Adam(0.01), memory_budget=0.25)
    smallest = int(re.search(r"reaches, .* \((\d+) bytes\)", str(error.value)).group(1))
    assert 0.25 * remat.default_peak < smallest <= remat.peak
    tightest = gc.train_step(loss, params, gc.optim.Adam(0.01), memory_budget=smallest)
    assert tightest.executable.memory.peak_bytes <= smallest
    assert_same_training(run_steps(tightest), (want_losses, want_state))


def gpt_training(step, work, steps=3):
    """`steps` AdamW steps of the gpt workload from its initial parameters, a fresh batch of
    tokens each; (losses, state)."""
    feeds = workloads.feeds_for(work)
    state = step.init({t.name: feeds[t.name] for t in work.wrt})
    rng, shape = np.random.default_rng(5), feeds["tokens"].shape
    losses = [step(state, tokens=rng.integers(0, work.dims["vocab"], shape),
                   targets=rng.integers(0, work.dims["vocab"], shape)) for _ in range(steps)]
    return losses, state


def test_gpt_trains_the_same_at_every_budget_within_its_planned_peak():
    """The gpt workload's training step (2 blocks of width 8, a 16-token sequence, so the
    activations outweigh the parameters as at the full size), float64: budget 1.0 changes
    nothing; 0.5 is met by recomputing blocks (segments) within its planned peak; 0.25 is below
    any plan, the error names the smallest peak, and that peak as bytes compiles. Every
    budget trains as 1.0 does over three steps, loss and state to 1e-12."""
    work = workloads.build_gpt("tiny", "float64", seq=16)
    params = list(work.wrt)
    full = gc.train_step(work.loss, params, work.optimizer, memory_budget=1.0)
    remat = full.executable.context.remat
    assert remat.recomputed == [] and full.executable.memory.peak_bytes == remat.default_peak
    want = gpt_training(full, work)
    half = gc.train_step(work.loss, params, work.optimizer, memory_budget=0.5)
    remat = half.executable.context.remat
    assert remat.recomputed and remat.segments > 1
    assert half.executable.memory.peak_bytes == remat.peak <= 0.5 * remat.default_peak
    assert_same_training(gpt_training(half, work), want)
    with pytest.raises(gc.MemoryBudgetError, match="below the smallest peak") as error:
        gc.train_step(work.loss, params, work.optimizer, memory_budget=0.25)
    smallest = error.value.smallest_peak
    assert 0.25 * remat.default_peak < smallest <= remat.peak
    assert f"({smallest} bytes)" in str(error.value)
    tightest = gc.train_step(work.loss, params, work.optimizer, memory_budget=smallest)
    assert tightest.executable.memory.peak_bytes <= smallest
    assert_same_training(gpt_training(tightest, work), want)


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


def test_chain_of_matmul_cos_pairs_recomputes_the_cos_first_and_segments_below_that():
    """The backward reads every product m (for sin) and every cos c (for the next dW). At
    0.7 the min-cut alone fits: keep the m's, recompute each c = cos(m) (7 of them; the last
    c is read by nothing but the loss's gradient of ones). Keeping all 8 products costs
    about 8/16 of the default peak before any gradient is in flight, so 0.5 needs fewer of
    them kept: the forward is cut into segments whose boundary c's are kept and whose
    matmuls are recomputed from them just before their own backward, cos values still the
    first given up. The matmuls are given up only because nothing cheaper meets 0.5."""
    _, loss, ws, products = chain(8)
    outputs = [t.id for t in (loss, *gc.grad(loss, ws))]
    _, ctx = optimize(loss.graph, outputs, memory_budget=0.7)
    graph, remat = loss.graph, ctx.remat
    assert remat.peak <= 0.7 * remat.default_peak and remat.segments == 1
    assert sorted(remat.kept) == sorted(p.id for p in products)
    assert len(remat.recomputed) == 7 and {graph[v].op.label for v in remat.recomputed} == {
        "Elemwise COS"}
    assert remat.bytes_saved == 7 * 64 * 8 * 8
    assert remat.extra_flops == 7 * 64 * 8 * 8  # one cos per element of each (fuser weights)
    _, half = optimize(loss.graph, outputs, memory_budget=0.5)
    remat = half.remat
    assert remat.peak <= 0.5 * remat.default_peak and remat.segments > 1
    labels = [graph[v].op.label for v in remat.recomputed]
    assert "MatrixMul" in labels and "Elemwise COS" in labels
    with pytest.raises(gc.MemoryBudgetError, match=r"below the smallest peak .* reaches"):
        optimize(loss.graph, outputs, memory_budget=0.3)


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
