"""The differentiation pass and its API (`gc.grad`, `gc.vjp`, `gc.hvp`):
nothing unrequested is built, contributions of several consumers are summed,
disconnected and non-differentiable requests fail clearly, backward nodes are
tagged, and second order (Hessian-vector products) matches finite differences.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import GraphError, NotDifferentiableError
from gradcompiler.ops.linalg import MatrixMul
from gradcompiler.passes.autodiff import differentiate


@pytest.fixture
def graph():
    with gc.Graph("autodiff") as g:
        yield g
    gc.verify(g)


HIDDEN, CLASSES = 512, 10


def three_layer_mlp():
    """loss, [W1, b1, W2, b2, W3, b3] of a tanh mlp with a cross-entropy head."""
    x = gc.input("x", (2, 6))
    labels = gc.input("labels", (2,), "int32")
    params = [gc.param("W1", (6, HIDDEN)), gc.param("b1", (HIDDEN,)),
              gc.param("W2", (HIDDEN, HIDDEN)), gc.param("b2", (HIDDEN,)),
              gc.param("W3", (HIDDEN, CLASSES)), gc.param("b3", (CLASSES,))]
    w1, b1, w2, b2, w3, b3 = params
    h = gc.tanh(x @ w1 + b1)
    h = gc.tanh(h @ w2 + b2)
    return gc.cross_entropy(h @ w3 + b3, labels), params


def _backward_ids(graph) -> list[int]:
    return [n.id for n in graph.nodes.values() if n.role == "backward"]


def test_unrequested_gradients_are_never_built(rng):
    with gc.Graph("only_w1") as g:
        loss, params = three_layer_mlp()
        dw1 = gc.grad(loss, params[0])
    gc.verify(g)
    backward = _backward_ids(g)
    # every backward node feeds dW1: nothing is built only for another parameter's gradient
    assert set(backward) <= g.ancestors([dw1.id])
    other_param_shapes = {(HIDDEN, HIDDEN), (HIDDEN, CLASSES), (HIDDEN,), (CLASSES,)}
    matmuls = [g[i] for i in backward if isinstance(g[i].op, MatrixMul)]
    assert matmuls and all(n.type.shape not in other_param_shapes for n in matmuls)
    assert not [i for i in backward if g[i].type.shape == (HIDDEN, CLASSES)]

    with gc.Graph("all") as g_all:
        loss_all, params_all = three_layer_mlp()
        grads = gc.grad(loss_all, params_all)
    gc.verify(g_all)
    assert len(_backward_ids(g_all)) > len(backward)
    weight_grads = [g_all[i] for i in _backward_ids(g_all)
                    if isinstance(g_all[i].op, MatrixMul) and g_all[i].type.shape == (HIDDEN, CLASSES)]
    assert weight_grads, "the full gradient does build dW3"
    assert [t.shape for t in grads] == [p.shape for p in params_all]


def test_stop_gradient_cuts_the_requires_grad_analysis(graph):
    # x - stop_gradient(max(x)) (a stable softmax's shift): no gradient is built for the
    # shift only to be dropped at the StopGradient
    x = gc.input("x", (2, 5))
    shifted = x - gc.stop_gradient(x.max(axis=1, keepdims=True))
    dx = gc.grad(gc.exp(shifted).sum(), x)
    assert set(_backward_ids(graph)) <= graph.ancestors([dx.id])
    xv = np.arange(10, dtype=np.float32).reshape(2, 5) / 10
    shift = xv.max(1, keepdims=True)
    np.testing.assert_allclose(gc.evaluate(dx, x=xv), np.exp(xv - shift), rtol=1e-6)


def test_unrequested_gradient_value_is_still_right(rng):
    with gc.Graph("small") as g:
        x = gc.input("x", (3, 4))
        w1, w2 = gc.param("w1", (4, 5)), gc.param("w2", (5, 2))
        loss = (gc.tanh(x @ w1) @ w2).sum()
        gc.grad(loss, w1)
    gc.verify(g)
    feeds = {k: rng.standard_normal(s).astype(np.float32) for k, s in
             [("x", (3, 4)), ("w1", (4, 5)), ("w2", (5, 2))]}
    gc.check_grads(loss, [w1], feeds)


def test_contributions_of_several_consumers_are_summed(graph, rng):
    x = gc.input("x", (3,), "float64")
    h = gc.tanh(x)
    loss = (x * x + gc.sin(x) + h * h + h).sum()
    dx = gc.grad(loss, x)
    xv = rng.standard_normal(3)
    t = np.tanh(xv)
    expected = 2 * xv + np.cos(xv) + (2 * t + 1) * (1 - t * t)
    np.testing.assert_allclose(gc.evaluate(dx, x=xv), expected, rtol=1e-12)


def test_gradient_with_respect_to_an_intermediate(graph, rng):
    x = gc.input("x", (3,), "float64")
    h = gc.tanh(x)
    dh = gc.grad((h * h).sum(), h)
    xv = rng.standard_normal(3)
    np.testing.assert_allclose(gc.evaluate(dh, x=xv), 2 * np.tanh(xv), rtol=1e-12)


def test_disconnected_wrt(graph, rng):
    a = gc.input("a", (3,), "float64")
    b = gc.param("b", (2, 2), "float32")
    loss = (a * a).sum()
    with pytest.raises(NotDifferentiableError, match=r"\(b\) does not reach"):
        gc.grad(loss, b)
    with pytest.raises(NotDifferentiableError, match="does not reach"):
        gc.grad(loss, [a, b])
    da, db = gc.grad(loss, [a, b], disconnected="zero")
    assert db.type == b.type
    av = rng.standard_normal(3)
    np.testing.assert_allclose(gc.evaluate(da, a=av), 2 * av)
    np.testing.assert_array_equal(gc.evaluate(db), np.zeros((2, 2), np.float32))
    with pytest.raises(ValueError, match="disconnected"):
        differentiate(graph, [loss.id], [a.id], [None], disconnected="ignore")


def test_grad_of_a_non_scalar_needs_cotangents(graph):
    x = gc.input("x", (3, 4))
    with pytest.raises(NotDifferentiableError, match=r"scalar loss.*\(3, 4\).*vjp"):
        gc.grad(gc.tanh(x), x)


def test_grad_with_respect_to_an_int_input(graph):
    x = gc.input("x", (3,))
    i = gc.input("i", (3,), "int32")
    loss = (x * i.astype("float32")).sum()
    with pytest.raises(NotDifferentiableError, match="int32.*only float"):
        gc.grad(loss, i)


def test_grad_with_tensors_of_another_graph(graph):
    x = gc.input("x", (3,))
    with gc.Graph("other") as other:
        y = gc.input("y", (3,))
    with pytest.raises(GraphError, match="one graph"):
        gc.grad((x * x).sum(), y)
    gc.verify(other)


def test_vjp_with_cotangents(graph, rng):
    a = gc.input("a", (3, 4), "float64")
    b = gc.input("b", (4, 5), "float64")
    u1, u2 = gc.input("u1", (3, 5), "float64"), gc.input("u2", (3, 4), "float64")
    y1, y2 = a @ b, gc.tanh(a)
    da = gc.vjp([y1, y2], a, [u1, u2])
    da_first_only = gc.vjp([y1, y2], a, [u1, None])
    values = {k: rng.standard_normal(s) for k, s in [("a", (3, 4)), ("b", (4, 5)), ("u1", (3, 5)), ("u2", (3, 4))]}
    got, got_first = gc.evaluate([da, da_first_only], values)
    t = np.tanh(values["a"])
    np.testing.assert_allclose(got, values["u1"] @ values["b"].T + values["u2"] * (1 - t * t), rtol=1e-12)
    np.testing.assert_allclose(got_first, values["u1"] @ values["b"].T, rtol=1e-12)


def test_vjp_rejects_mismatched_cotangents(graph):
    a = gc.input("a", (3, 4))
    y = gc.tanh(a)
    with pytest.raises(NotDifferentiableError, match="does not match"):
        gc.vjp(y, a, gc.input("u", (4, 3)))
    with pytest.raises(NotDifferentiableError, match="does not match"):
        gc.vjp(y, a, gc.input("u64", (3, 4), "float64"))
    with pytest.raises(GraphError, match="1 outputs but 2 cotangents"):
        gc.vjp(y, a, [gc.input("u1", (3, 4)), gc.input("u2", (3, 4))])


def test_backward_nodes_are_tagged(graph):
    x = gc.input("x", (3, 4))
    w = gc.param("w", (4, 2))
    loss = gc.tanh(x @ w).sum()
    forward = set(graph.nodes)
    gc.grad(loss, [w, x])
    new = [graph[i] for i in graph.nodes if i not in forward]
    computed = [n for n in new if n.inputs]
    assert computed and all(n.role == "backward" for n in computed)
    # sources built on the way (the cotangent 1, constants) are constants, tagged with their origin too
    assert all(n.role == "const" for n in new if not n.inputs)
    assert all(n.origin is not None and n.origin in forward for n in new)
    assert all(graph[i].role != "backward" for i in forward)
    origins = {graph[n.origin].op.label for n in new}
    assert {"MatrixMul", "Elemwise TANH", "Reduce SUM"} <= origins


def test_gradient_of_a_gradient(graph, rng):
    x = gc.input("x", (3,), "float64")
    dx = gc.grad((x * x * x).sum(), x)
    ddx = gc.grad(dx.sum(), x)
    xv = rng.standard_normal(3)
    got_dx, got_ddx = gc.evaluate([dx, ddx], x=xv)
    np.testing.assert_allclose(got_dx, 3 * xv ** 2, rtol=1e-12)
    np.testing.assert_allclose(got_ddx, 6 * xv, rtol=1e-12)


def test_hessian_vector_product_of_a_small_mlp(graph, rng):
    x = gc.input("x", (4, 3), "float64")
    labels = gc.input("labels", (4,), "int32")
    w1, b1, w2 = gc.param("w1", (3, 5), "float64"), gc.param("b1", (5,), "float64"), gc.param("w2", (5, 3), "float64")
    v1, vb, v2 = gc.input("v1", (3, 5), "float64"), gc.input("vb", (5,), "float64"), gc.input("v2", (5, 3), "float64")
    loss = gc.cross_entropy(gc.tanh(x @ w1 + b1) @ w2, labels)
    params, vectors = [w1, b1, w2], [v1, vb, v2]
    grads = gc.grad(loss, params)
    hv = gc.hvp(loss, params, vectors)

    feeds = {"x": rng.standard_normal((4, 3)), "labels": np.array([0, 2, 1, 2], np.int32),
             "w1": rng.standard_normal((3, 5)), "b1": rng.standard_normal(5), "w2": rng.standard_normal((5, 3))}
    directions = {"v1": rng.standard_normal((3, 5)), "vb": rng.standard_normal(5), "v2": rng.standard_normal((5, 3))}
    got = gc.evaluate(hv, {**feeds, **directions})

    eps = 1e-5
    moved = {"w1": "v1", "b1": "vb", "w2": "v2"}
    plus = gc.evaluate(grads, {**feeds, **{p: feeds[p] + eps * directions[v] for p, v in moved.items()}})
    minus = gc.evaluate(grads, {**feeds, **{p: feeds[p] - eps * directions[v] for p, v in moved.items()}})
    for g_hv, g_plus, g_minus in zip(got, plus, minus):
        numeric = (g_plus - g_minus) / (2 * eps)
        np.testing.assert_allclose(g_hv, numeric, rtol=1e-6, atol=1e-9)
    gc.check_grads(loss, params, feeds, order=2)


def test_hvp_of_a_single_tensor_is_a_tensor(graph, rng):
    """f = Σ w·exp(w): f' = (1 + w)·exp(w), f'' = (2 + w)·exp(w), so H·v = (2 + w)·exp(w)·v."""
    w, v = gc.param("w", (4,), "float64"), gc.input("v", (4,), "float64")
    hv = gc.hvp((w * gc.exp(w)).sum(), w, v)
    assert isinstance(hv, gc.Tensor) and hv.shape == (4,)
    wv, vv = rng.standard_normal(4), rng.standard_normal(4)
    np.testing.assert_allclose(gc.evaluate(hv, w=wv, v=vv), (2 + wv) * np.exp(wv) * vv, rtol=1e-14)


def test_hvp_vectors_must_match_the_parameters(graph):
    w, b = gc.param("w", (3, 5), "float64"), gc.param("b", (5,), "float64")
    loss = (gc.tanh(w) * b).sum()
    with pytest.raises(NotDifferentiableError, match=r"vector float64\[5\] does not match"):
        gc.hvp(loss, w, gc.input("v", (5,), "float64"))  # would broadcast: a different product
    with pytest.raises(NotDifferentiableError, match="float32"):
        gc.hvp(loss, w, gc.input("v32", (3, 5), "float32"))
    with pytest.raises(GraphError, match="2 wrt tensors but 1 vectors"):
        gc.hvp(loss, [w, b], [gc.input("vw", (3, 5), "float64")])
