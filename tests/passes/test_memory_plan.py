"""The memory plan: grouping, liveness, buffer reuse, peaks and captures.

Expected byte counts are derived by hand in each test from the shapes.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.bench import workloads
from gradcompiler.errors import GraphError
from gradcompiler.passes.groups import FusionGroup, FusionPlan
from gradcompiler.passes.memory import plan_memory, singleton_plan, unfused_peak_bytes
from gradcompiler.passes.pipeline import UNFUSED_PIPELINE, optimize
from gradcompiler.view_maps import is_contiguous_view

from helpers import captured_values, mlp_step

F64 = 8


def planned(outputs, plan=None):
    graph = outputs[0].graph.copy()
    graph.outputs = [t.id for t in outputs]
    return graph, plan_memory(graph, plan)


def test_singleton_plan_kinds_follow_op_kinds():
    with gc.Graph() as g:
        x = gc.input("x", (3, 4), "float64")
        w = gc.param("w", (4, 2), "float64")
        e = gc.exp(x)
        r = e.reshape(12)
        s = gc.sum(r)
        m = e @ w
        f = gc.zeros((3, 2), "float64")
    kinds = {grp.nodes[0]: grp.kind for grp in singleton_plan(g).groups}
    assert kinds == {x.id: "source", w.id: "source", e.id: "loop", r.id: "alias", s.id: "reduce",
                     m.id: "library", f.id: "source"}
    order = [grp.nodes[0] for grp in singleton_plan(g).groups]
    assert order.index(e.id) < order.index(r.id) < order.index(s.id)


def test_an_elementwise_chain_runs_in_one_buffer():
    with gc.Graph():
        x = gc.input("x", (64,), "float64")
        a = gc.exp(x)
        b = gc.tanh(a)
        c = b * 2.0
    graph, plan = planned([c])
    # op by op: a and b, then b and c, are live together; in place, one buffer holds each in turn
    assert plan.unfused_peak_bytes == 2 * 64 * F64
    assert plan.peak_bytes == 64 * F64
    assert plan.in_place == 2
    assert plan.buffers[a.id] == plan.buffers[b.id] == plan.buffers[c.id]
    assert unfused_peak_bytes(graph) == plan.unfused_peak_bytes


def test_a_freed_buffer_is_reused_by_a_later_value():
    with gc.Graph():
        x = gc.input("x", (64,), "float64")
        a = gc.exp(x)
        r = gc.sum(a)  # a dies here; a reduction cannot write over its input
        e = x * r  # reuses a's buffer
        out = gc.tanh(e)  # in place over e
    graph, plan = planned([out])
    assert plan.buffers[a.id] == plan.buffers[e.id] == plan.buffers[out.id] != plan.buffers[r.id]
    assert sorted(plan.buffer_sizes) == [F64, 64 * F64]
    # planned, the worst step is the sum (a and r live); op by op it is tanh (e and out live)
    assert plan.peak_bytes == 64 * F64 + F64
    assert plan.unfused_peak_bytes == 2 * 64 * F64


def test_views_alias_their_source_and_extend_its_life():
    with gc.Graph():
        x = gc.input("x", (3, 4), "float64")
        a = gc.exp(x)
        v = a.reshape(12)
        t = gc.exp(x) * 3.0  # runs between the view and its reader
        s = gc.sum(v)
    graph, plan = planned([s, t])
    step = {grp.nodes[0]: i for i, grp in enumerate(plan.order)}
    assert plan.buffers[v.id] == plan.buffers[a.id]
    assert v.id not in plan.lifetimes  # an alias is no value of its own
    assert plan.lifetimes[a.id] == (step[a.id], step[s.id])


def test_a_transposed_view_is_never_overwritten_in_place():
    with gc.Graph():
        x = gc.input("x", (3, 3), "float64")
        a = gc.exp(x)
        b = gc.tanh(a.T)  # same shape, other element order
    graph, plan = planned([b])
    assert plan.buffers[b.id] != plan.buffers[a.id]
    assert plan.in_place == 0


def test_a_scatter_updates_its_dying_data_in_place():
    with gc.Graph():
        x = gc.input("x", (4, 3), "float64")
        i = gc.input("i", (4,), "int32")
        a = gc.exp(x)
        s = gc.indexing_set_one_hot(a, i, gc.zeros((4, 1), "float64"), axis=1)
    graph, plan = planned([s])
    assert plan.buffers[s.id] == plan.buffers[a.id]
    assert plan.peak_bytes == 12 * F64 and plan.unfused_peak_bytes == 2 * 12 * F64


def test_a_scatter_that_reads_its_data_as_its_values_too_is_not_in_place():
    with gc.Graph():
        x = gc.input("x", (3,), "float64")
        a = gc.exp(x)
        s = gc.index_add(a, gc.constant(np.array([0, 2, 1])), a)
    graph, plan = planned([s])
    assert plan.buffers[s.id] != plan.buffers[a.id]
    assert plan.in_place == 0


def test_outputs_get_their_own_buffers():
    with gc.Graph():
        x = gc.input("x", (64,), "float64")
        a = gc.exp(x)
        r = gc.sum(a)
        small = gc.exp(r)  # an output: must not pin a's freed 512-byte buffer to the end
    graph, plan = planned([small])
    assert plan.buffer_sizes[plan.buffers[small.id]] == F64


def test_captures_follow_the_groups():
    with gc.Graph() as g:
        x = gc.input("x", (4,), "float64")
        t = gc.tanh(x)
        loss = gc.sum(t)
    (dx,) = gc.grad(loss, [x])
    opt, ctx = optimize(g, [loss.id, dx.id], passes=UNFUSED_PIPELINE, debug=True)
    (dx_id,) = [o for o in opt.outputs if o != loss.id]
    assert opt[dx_id].op.label == "Elemwise TANH_GRAD" and opt[dx_id].inputs[0] == t.id
    assert ctx.memory.captures == [(t.id, (4,), np.dtype("float64"), 4 * F64)]

    # fused with the backward kernel that reads it, tanh is no longer kept for the backward
    (seed,) = [i for i in opt[dx_id].inputs if i != t.id]
    fused = FusionPlan([
        FusionGroup("k0", "source", (x.id,), (x.id,), ()),
        FusionGroup("k1", "source", (seed,), (seed,), ()),
        FusionGroup("k2_loop", "loop", (t.id, dx_id), (t.id, dx_id), (x.id, seed)),
        FusionGroup("k3_reduce", "reduce", (loss.id,), (loss.id,), (t.id,)),
    ])
    plan = plan_memory(opt, fused)
    assert plan.captures == []
    assert plan.lifetimes[t.id] == (2, 3)


def test_a_plan_must_cover_the_graph():
    with gc.Graph() as g:
        x = gc.input("x", (4,), "float64")
        y = gc.exp(x)
    g.outputs = [y.id]
    with pytest.raises(GraphError, match="missing"):
        plan_memory(g, FusionPlan([FusionGroup("k0", "source", (x.id,), (x.id,), ())]))


@pytest.fixture
def unfused_mlp():
    """x (8,12) → relu → relu → 4 classes, cross-entropy, gradients of every parameter,
    optimised op by op (no fusion)."""
    step = mlp_step()
    opt, ctx = optimize(step.graph, [t.id for t in step.outputs], passes=UNFUSED_PIPELINE, debug=True)
    return opt, ctx, step.hidden


def test_mlp_captures_are_the_activations_the_softmax_and_one_vector(unfused_mlp):
    opt, ctx, (h1, h2) = unfused_mlp
    captures = {c[0]: c for c in ctx.memory.captures}
    assert {h1.id, h2.id} <= set(captures)
    assert captures[h1.id][1:] == ((8, 16), np.dtype("float64"), 8 * 16 * F64)
    rest = [c for i, c in captures.items() if i not in (h1.id, h2.id)]
    assert [c[1] for c in rest if c[1] == (8, 4)] == [(8, 4)]
    vectors = [c for c in rest if c[1] != (8, 4)]
    assert len(vectors) <= 1 and all(np.prod(c[1]) == 8 for c in vectors)
    assert all(opt[c[0]].role == "forward" for c in ctx.memory.captures)


def _read_through_views(graph, inputs) -> set[int]:
    """`inputs` and the values they alias: a reshape-like view reads its root's buffer."""
    read, stack = set(), list(inputs)
    while stack:
        n = stack.pop()
        read.add(n)
        if is_contiguous_view(graph[n].op):
            stack.append(graph[n].inputs[0])
    return read


def test_mlp_plan_never_shares_a_buffer_between_live_values(unfused_mlp):
    opt, ctx, _ = unfused_mlp
    plan = ctx.memory
    by_buffer: dict[int, list[int]] = {}
    for n in plan.lifetimes:
        by_buffer.setdefault(plan.buffers[n], []).append(n)
    group_inputs = {n: grp.inputs for grp in plan.order for n in grp.outputs}
    for tenants in by_buffer.values():
        tenants.sort(key=lambda n: plan.lifetimes[n][0])
        for before, after in zip(tenants, tenants[1:]):
            end, start = plan.lifetimes[before][1], plan.lifetimes[after][0]
            assert end <= start
            if end == start:  # handed over in place: the writer reads the value it overwrites
                assert before in _read_through_views(opt, group_inputs[after])
            assert plan.buffer_sizes[plan.buffers[after]] >= opt[after].type.nbytes
    assert plan.peak_bytes <= plan.unfused_peak_bytes
    assert plan.peak_bytes <= plan.arena_bytes



def test_no_in_place_update_when_another_input_views_the_buffer_transposed():
    with gc.Graph():
        x = gc.input("x", (3, 3), "float64")
        a = gc.exp(x)
        b = a + a.T  # writing b[i, j] over a[i, j] would change a.T[j, i] before it is read
    graph, plan = planned([b])
    assert plan.buffers[b.id] != plan.buffers[a.id]
    assert plan.in_place == 0


def attention_graph():
    """Q, K, V, R (2,8,4): S = Q@Kᵀ/2, P = softmax(S), O = P@V, loss = sum(O·R), gradients
    wrt Q, K, V: the graph and [loss, *grads]."""
    with gc.Graph() as g:
        q, k, v, r = (gc.input(name, (2, 8, 4), "float64") for name in "QKVR")
        p = gc.softmax(q @ gc.transpose(k, (0, 2, 1)) / 2.0, axis=-1)
        loss = gc.sum((p @ v) * r)
    return g, [loss, *gc.grad(loss, [q, k, v])]


def test_fusion_brings_the_attention_peak_below_the_unfused_peak():
    """The mlp's counterparts are the two tests below: below the op-by-op peak with a batch of
    1024, at the shared floor with the benchmark's 256."""
    g, outputs = attention_graph()
    opt, ctx = optimize(g, [t.id for t in outputs], debug=True)
    assert ctx.fusion is not None and ctx.memory.order == ctx.fusion.groups
    # Op by op, the softmax and its backward materialise every (2,8,8) intermediate; fused,
    # most of them live only in the registers of the kernel that reads them.
    assert ctx.memory.peak_bytes < ctx.memory.unfused_peak_bytes == unfused_peak_bytes(opt)


def test_mlp_at_the_benchmark_size_is_planned_at_its_floor():
    """The mlp step of benchmarks.md (256×784 → 512 → 512 → 10): the fused plan's peak is the
    floor of any plan that materialises the matmul operands: every returned value (loss and
    six gradients, live to the end) plus dZ1 (256, 512), the operand of dW1 = xᵀ·dZ1, the
    last product. The op-by-op program reaches the same floor, so neither can be below the
    other here; the oracle is that sum, computed from the shapes alone."""
    work = workloads.build("mlp", "full")
    opt, ctx = optimize(work.outputs[0].graph, [t.id for t in work.outputs], debug=True)
    d = workloads.DIMS["mlp"]["full"]
    f, h, c, batch = d["features"], d["hidden"], d["classes"], d["batch"]
    returned = 4 * (1 + f * h + h + h * h + h + h * c + c)
    floor = returned + 4 * batch * h
    assert ctx.memory.peak_bytes == floor == ctx.memory.unfused_peak_bytes


def test_mlp_with_a_larger_batch_is_planned_below_the_op_by_op_peak():
    """The benchmark's layers (784 → 512 → 512 → 10, float32) with a batch of 1024: the
    activations now outweigh the returned gradients, and the plan's peak is below the op-by-op
    one because fused kernels keep the bias-add, relu and softmax intermediates in registers
    (about 12% less). Same shapes, batch 256: both peaks sit at the floor (test above)."""
    step = mlp_step(widths=(784, 512, 512, 10), dtype="float32", batch=1024)
    opt, ctx = optimize(step.graph, [t.id for t in step.outputs], debug=True)
    memory = ctx.memory
    assert memory.peak_bytes < 0.9 * memory.unfused_peak_bytes
    assert memory.unfused_peak_bytes == unfused_peak_bytes(opt)


def test_fused_mlp_keeps_only_the_relu_outputs_across_kernels():
    step = mlp_step()
    h1, h2 = step.hidden
    opt, ctx = optimize(step.graph, [t.id for t in step.outputs], debug=True)
    # What the backward reads of the forward: the relu outputs, the softmax's exp (8,4) and
    # at most one batch-sized vector (its row sums) ...
    read = {i: opt[i].type.shape for i in captured_values(opt)}
    assert {h1.id, h2.id} <= set(read)
    rest = [shape for i, shape in read.items() if i not in (h1.id, h2.id)]
    assert [shape for shape in rest if shape == (8, 4)] == [(8, 4)]
    vectors = [shape for shape in rest if shape != (8, 4)]
    assert len(vectors) <= 1 and all(np.prod(shape) == 8 for shape in vectors)
    # ... and of those, fusion computes the softmax values in the kernel that differentiates
    # them, so only the relu outputs are kept alive from one kernel to another.
    assert ctx.memory.captures == [(h.id, (8, 16), np.dtype("float64"), 8 * 16 * F64) for h in (h1, h2)]
