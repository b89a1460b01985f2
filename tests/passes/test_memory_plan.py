"""The memory plan: grouping, liveness, buffer reuse, peaks and captures.

Expected byte counts are derived by hand in each test from the shapes.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import GraphError
from passes.groups import FusionGroup, FusionPlan
from passes.memory import plan_memory, singleton_plan, unfused_peak_bytes
from passes.pipeline import optimize

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
    opt, ctx = optimize(g, [loss.id, dx.id], debug=True)
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
def mlp_step():
    """x (8,12) → relu → relu → 4 classes, cross-entropy, gradients of every parameter, optimised."""
    with gc.Graph() as g:
        x = gc.input("x", (8, 12), "float64")
        labels = gc.input("labels", (8,), "int32")
        params = [gc.param("W1", (12, 16), "float64"), gc.param("b1", (16,), "float64"),
                  gc.param("W2", (16, 16), "float64"), gc.param("b2", (16,), "float64"),
                  gc.param("W3", (16, 4), "float64"), gc.param("b3", (4,), "float64")]
        w1, b1, w2, b2, w3, b3 = params
        h1 = gc.relu(x @ w1 + b1)
        h2 = gc.relu(h1 @ w2 + b2)
        loss = gc.cross_entropy(h2 @ w3 + b3, labels)
    grads = gc.grad(loss, params)
    opt, ctx = optimize(g, [loss.id, *(t.id for t in grads)], debug=True)
    return opt, ctx, (h1, h2)


def test_mlp_captures_are_the_activations_the_softmax_and_one_vector(mlp_step):
    opt, ctx, (h1, h2) = mlp_step
    captures = {c[0]: c for c in ctx.memory.captures}
    assert {h1.id, h2.id} <= set(captures)
    assert captures[h1.id][1:] == ((8, 16), np.dtype("float64"), 8 * 16 * F64)
    rest = [c for i, c in captures.items() if i not in (h1.id, h2.id)]
    assert [c[1] for c in rest if c[1] == (8, 4)] == [(8, 4)]
    vectors = [c for c in rest if c[1] != (8, 4)]
    assert len(vectors) <= 1 and all(np.prod(c[1]) == 8 for c in vectors)
    assert all(opt[c[0]].role == "forward" for c in ctx.memory.captures)


def test_mlp_plan_never_shares_a_buffer_between_live_values(mlp_step):
    opt, ctx, _ = mlp_step
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
                assert before in group_inputs[after]
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
