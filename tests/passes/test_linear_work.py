"""The passes do work linear in the graph: the residual MLP at four times the depth costs at
most about four times the cone walks and node visits (`PassContext.work`), counted, not timed.
"""

import pytest

import gradcompiler as gc
from gradcompiler.bench.scaling import build_residual_mlp
from gradcompiler.passes.pipeline import optimize


def _work(depth: int):
    loss, wrt = build_residual_mlp(depth)
    grads = gc.grad(loss, wrt)
    _, ctx = optimize(loss.graph, [loss.id, *(g.id for g in grads)])
    return len(loss.graph), ctx.work


@pytest.fixture(scope="module")
def shallow_and_deep():
    return _work(20), _work(80)


def test_the_deep_graph_is_four_times_the_shallow_one(shallow_and_deep):
    (small, _), (large, _) = shallow_and_deep
    assert 3.8 < large / small < 4.0


def test_cone_walks_grow_at_most_linearly(shallow_and_deep):
    (_, small), (_, large) = shallow_and_deep
    assert small.cone_evaluations > 100
    assert large.cone_evaluations / small.cone_evaluations <= 4.5


def test_nodes_visited_grow_at_most_linearly(shallow_and_deep):
    (nodes, small), (_, large) = shallow_and_deep
    assert small.nodes_visited > nodes  # every pass sweeps the graph at least once
    assert large.nodes_visited / small.nodes_visited <= 4.5
