"""The shape of the fusion plan: what becomes a kernel, what is never materialised.

These tests read the plan `fuse` leaves in `ctx.fusion` (no code is
generated), so they are fast; `tests/backends/test_cpu_differential.py`
checks that the same plans compute the right values.
"""

from __future__ import annotations

import numpy as np

import gradcompiler as gc
from gradcompiler.ops.linalg import MatrixMul
from gradcompiler.ops.shape import Broadcast, Transpose
from gradcompiler.passes.fuse import RECOMPUTE_LIMIT, REREAD_LIMIT, FusedLibrary, FusedLoop
from gradcompiler.passes.pipeline import optimize


def fused(outputs):
    """The optimised graph and its fusion plan (and memory plan) for Tensor `outputs`."""
    graph, ctx = optimize(outputs[0].graph, [t.id for t in outputs], debug=True)
    return graph, ctx


def loop_kernels(plan):
    """Every loop kernel of the plan, epilogues of library calls included."""
    loops = []
    for group in plan.groups:
        if isinstance(group, FusedLoop):
            loops.append(group)
        elif isinstance(group, FusedLibrary) and group.epilogue is not None:
            loops.append(group.epilogue)
    return loops


def materialised(plan) -> set[int]:
    return {n for g in plan.kernels() for n in g.outputs}


def layernorm_gelu_step(transposed: bool = False):
    """The layernorm_gelu workload's step; `transposed` reads x through a transpose (a view)."""
    with gc.Graph("layernorm_gelu"):
        x = gc.input("x", (32, 64)).T if transposed else gc.input("x", (64, 32))
        gamma, beta = gc.param("gamma", (32,)), gc.param("beta", (32,))
        r = gc.input("r", (64, 32))
        y = gc.gelu_tanh(gc.layer_norm(x, gamma, beta)) + x
        loss = gc.sum(y * r)
    return [loss, *gc.grad(loss, [x, gamma, beta])]


def bcast_reduce_step():
    with gc.Graph("bcast_reduce"):
        x = gc.input("x", (64, 48))
        b, w = gc.param("b", (48,)), gc.param("w", (48,))
        loss = gc.sum(gc.relu(x + b) * w)
    return [loss, *gc.grad(loss, [x, b, w])]


def test_layernorm_gelu_forward_and_backward_is_at_most_six_kernels_none_for_views():
    graph, ctx = fused(layernorm_gelu_step(transposed=True))
    plan = ctx.fusion
    assert 1 <= len(plan.kernels()) <= 6
    for group in plan.kernels():
        assert all(graph[n].op.kind != "view" for n in group.outputs), group.name
    views = [n for n in graph.nodes if graph[n].op.kind == "view"]
    assert views and not set(views) & materialised(plan)


def test_layernorm_statistics_and_gradients_share_one_pass_over_the_rows():
    """Mean, variance, output and both row sums of the backward are phases of one loop: four
    passes over each row (mean; variance; forward, gradient and both row sums of the
    normalisation's backward; dx), where autodiff through the statistics took five."""
    graph, ctx = fused(layernorm_gelu_step())
    (loop,) = loop_kernels(ctx.fusion)
    assert loop.domain == (64, 32)
    row_sums = [r for r in loop.roots if graph[r].op.kind == "reduction" and graph[r].type.shape[:1] == (64,)]
    assert len(row_sums) >= 4  # mean, variance, and the two row sums of the backward
    assert max(loop.phases) == 3 and list(loop.phases) == sorted(loop.phases)


def test_bcast_reduce_is_one_pass_and_never_materialises_the_broadcasts():
    graph, ctx = fused(bcast_reduce_step())
    plan = ctx.fusion
    assert len(plan.kernels()) <= 3
    big = [n for n in materialised(plan) if graph[n].type.shape == (64, 48)]
    assert big == [graph.outputs[1]]  # only dx, which is an output
    assert not any(isinstance(graph[n].op, Broadcast) for n in materialised(plan))
    (loop,) = loop_kernels(plan)
    assert set(loop.outputs) == set(graph.outputs)  # loss, dx, db and dw from one loop over x


def test_elementwise_chain_is_one_loop_and_sibling_reductions_share_it():
    with gc.Graph():
        x = gc.input("x", (16, 8))
        t = gc.exp(x * 2.0 + 1.0) - x
        outs = [gc.sum(t, axis=1), gc.max(t, axis=1), gc.sum(t, axis=0), t]
    graph, ctx = fused(outs)
    (loop,) = loop_kernels(ctx.fusion)
    assert set(loop.outputs) == set(graph.outputs) and loop.phases == (0, 0, 0, 0)


def test_loops_sharing_only_a_one_element_read_stay_apart():
    """Two updates that read the same learning rate and nothing else in common are two loops
    (one load of the rate each costs nothing; one loop streaming every update's arrays was
    3.5x slower for an AdamW step), and an update whose gradient is a matmul's output becomes
    that call's epilogue; updates sharing a whole array still share its loop."""
    with gc.Graph():
        lr = gc.input("lr", ())
        x, w = gc.input("x", (8, 6)), gc.param("w", (6, 5))
        p1, g1 = gc.param("p1", (16, 8)), gc.input("g1", (16, 8))
        p2, g2 = gc.param("p2", (16, 8)), gc.input("g2", (16, 8))
        apart = [p1 - lr * g1, p2 - lr * g2]
        shared = [p1 - lr * g1 * g2, p2 + lr * g1]
        epilogue = w - lr * (x.T @ (x @ w))
    graph, ctx = fused([*apart, *shared, epilogue])
    loops_of = {}
    for k, loop in enumerate(loop_kernels(ctx.fusion)):
        for out in loop.outputs:
            loops_of[out] = k
    first, second, third, fourth, last = graph.outputs
    assert loops_of[first] != loops_of[second]
    assert loops_of[third] == loops_of[fourth]
    (call,) = [g for g in ctx.fusion.groups if isinstance(g, FusedLibrary) and g.outputs == (last,)]
    assert call.epilogue is not None


def test_matmul_bias_relu_is_a_library_call_with_an_in_place_epilogue():
    with gc.Graph():
        x, w, b = gc.input("x", (8, 6)), gc.param("w", (6, 5)), gc.param("b", (5,))
        h = gc.relu(x @ w + b)
    graph, ctx = fused([h])
    (group,) = [g for g in ctx.fusion.groups if isinstance(g, FusedLibrary)]
    assert isinstance(graph[group.call].op, MatrixMul)
    assert group.epilogue is not None and group.outputs == (graph.outputs[0],)
    assert group.call not in materialised(ctx.fusion)


def test_mlp_transposes_are_all_folded_into_matmul_flags():
    with gc.Graph("mlp"):
        x, y = gc.input("x", (8, 12)), gc.input("y", (8,), "int32")
        w1, b1 = gc.param("w1", (12, 16)), gc.param("b1", (16,))
        w2, b2 = gc.param("w2", (16, 5)), gc.param("b2", (5,))
        loss = gc.cross_entropy(gc.relu(x @ w1 + b1) @ w2 + b2, y)
    outs = [loss, *gc.grad(loss, [w1, b1, w2, b2])]
    graph, ctx = fused(outs)
    assert not any(isinstance(n.op, Transpose) for n in graph.nodes.values())
    flags = {(n.op.transpose_a, n.op.transpose_b) for n in graph.nodes.values() if isinstance(n.op, MatrixMul)}
    assert (True, False) in flags and (False, True) in flags


def test_cheap_shared_values_are_recomputed_and_expensive_ones_materialised():
    """A value two kernels need is recomputed by both unless it costs more than the limit."""
    def plan_for(make_shared):
        with gc.Graph():
            x = gc.input("x", (6, 4))
            t = make_shared(x)
            outs = [gc.sum(t, axis=0), gc.reshape(t, (4, 6)) * gc.input("z", (4, 6))]
        graph, ctx = fused(outs)
        return graph, ctx.fusion, t.id

    graph, plan, t = plan_for(lambda x: x * 2.0 + 1.0)
    assert t not in materialised(plan)
    assert sum(t in g.computes for g in loop_kernels(plan)) == 2

    graph, plan, t = plan_for(lambda x: gc.tanh(gc.exp(x)) * 2.0)
    assert RECOMPUTE_LIMIT < 17
    assert t in materialised(plan)


def _statistics_and_normalised(make_shared, dtype="float32"):
    """A batch-norm-like pair: the column sums of a shared value t, then t minus them, a
    second pass (a reduction over axis 0 cannot share its loop with its readers)."""
    with gc.Graph():
        x, y, z = (gc.input(name, (6, 4), dtype) for name in "xyz")
        row = gc.input("row", (4,), dtype)
        t = make_shared(x, y, z, row)
        outputs = [t - gc.sum(t, axis=0, keepdims=True)]
    graph, ctx = fused(outputs)
    return outputs, ctx.fusion, t.id


def test_a_shared_value_whose_recompute_rereads_many_buffers_is_materialised():
    """Cheap arithmetic, but recomputing it in the second pass would read three full-size
    buffers again where materialising it costs one store and one load."""
    outputs, plan, t = _statistics_and_normalised(lambda x, y, z, row: (x + y) * z)
    assert REREAD_LIMIT == 2
    assert t in materialised(plan)
    assert sum(t in g.computes for g in loop_kernels(plan)) == 1
    rng = np.random.default_rng(3)
    feeds = {name: rng.standard_normal((6, 4)).astype(np.float32) for name in "xyz"}
    feeds["row"] = rng.standard_normal(4).astype(np.float32)
    shared = (feeds["x"] + feeds["y"]) * feeds["z"]
    want = shared - shared.sum(axis=0, keepdims=True)
    np.testing.assert_allclose(gc.compile(outputs)(**feeds)[0], want, rtol=1e-5, atol=1e-5)


def test_a_value_made_from_a_materialised_one_is_recomputed_after_all():
    """u = t·row is judged before t (latest first), when recomputing it would read t's three
    inputs; once t is materialised it reads t alone, so both passes recompute it (a batch
    norm's dy·γ, where dy sums gradients through ReLU masks)."""
    with gc.Graph():
        x, y, z = (gc.input(name, (6, 4)) for name in "xyz")
        row = gc.input("row", (4,))
        t = (x + y) * z
        u = t * row
        outputs = [u - gc.sum(u, axis=0, keepdims=True), t - gc.sum(t, axis=0, keepdims=True)]
    _, ctx = fused(outputs)
    assert t.id in materialised(ctx.fusion)
    assert u.id not in materialised(ctx.fusion)
    assert sum(u.id in g.computes for g in loop_kernels(ctx.fusion)) == 2
    rng = np.random.default_rng(4)
    feeds = {name: rng.standard_normal((6, 4)).astype(np.float32) for name in "xyz"}
    feeds["row"] = rng.standard_normal(4).astype(np.float32)
    shared = (feeds["x"] + feeds["y"]) * feeds["z"]
    scaled = shared * feeds["row"]
    got = gc.compile(outputs)(**feeds)
    np.testing.assert_allclose(got[0], scaled - scaled.sum(axis=0, keepdims=True), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got[1], shared - shared.sum(axis=0, keepdims=True), rtol=1e-5, atol=1e-5)


def test_a_shared_value_reading_few_full_size_buffers_is_recomputed():
    """Two full-size reads, or a third that is a broadcast row, read directly or through a
    small value recomputed with it: recomputing is cheaper."""
    for make_shared in (lambda x, y, z, row: x * y + 1.0, lambda x, y, z, row: (x + y) * row,
                        lambda x, y, z, row: (x + y) * (row * 2.0)):
        _, plan, t = _statistics_and_normalised(make_shared)
        assert t not in materialised(plan)
        assert sum(t in g.computes for g in loop_kernels(plan)) == 2


def test_every_node_is_in_exactly_one_group_and_groups_run_after_their_inputs():
    graph, ctx = fused(layernorm_gelu_step())
    members = [n for g in ctx.fusion.groups for n in g.nodes]
    assert sorted(members) == sorted(graph.nodes)
    done: set[int] = set()
    for group in ctx.fusion.groups:
        assert set(group.inputs) <= done, group.name
        done |= set(group.nodes)


def test_a_later_phase_reads_only_its_own_row():
    """x·(m·x) runs in the loop that sums m; x·(m·x)ᵀ needs other rows' sums, so it waits."""
    with gc.Graph():
        x = gc.input("x", (8, 8))
        m = gc.sum(x, axis=1, keepdims=True)
        same_row = x * (m * x)
        across = x * gc.transpose(m * x, (1, 0))
    graph, ctx = fused([same_row, across])
    loop_of = {r: loop for loop in loop_kernels(ctx.fusion) for r in loop.roots}
    assert loop_of[m.id] is loop_of[same_row.id]
    phases = dict(zip(loop_of[m.id].roots, loop_of[m.id].phases))
    assert phases[same_row.id] == phases[m.id] + 1
    assert loop_of[across.id] is not loop_of[m.id]


def test_plan_is_the_memory_plans_order():
    graph, ctx = fused(bcast_reduce_step())
    assert ctx.memory.order == ctx.fusion.groups
    assert ctx.memory.peak_bytes <= ctx.memory.unfused_peak_bytes
    assert np.all(np.asarray(ctx.memory.buffer_sizes) > 0)
