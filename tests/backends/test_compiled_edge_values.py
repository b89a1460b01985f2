"""Edge values that once gave wrong answers or crashed compiled code while the
reference worked: PRODUCT gradients at zeros, MAX/MIN gradients at ties, matmuls
with an empty contracted or batch dim, an elementwise op on a 0-d gather with a
Tensor index, softmax over a zero-length axis, a scatter that adds an array to itself.

Each graph runs on the reference interpreter, the compiled CPU target and the
CUDA simulator (a GPU under make gpu-check), and every result is compared with
a numpy oracle written here. Shapes stay tiny: the simulator runs every GPU
thread as a Python thread.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

import gradcompiler as gc

TARGETS = ["reference", "cpu", "cuda"]


def run(outputs, feeds, target):
    """`outputs` evaluated on `target`, as host arrays."""
    if target == "reference":
        return gc.evaluate(outputs, feeds)
    if target == "cuda":
        from gradcompiler.backends.numba_cuda import require_cuda, simulator_active

        if not simulator_active(require_cuda()) and os.environ.get("GRADCOMPILER_GPU_CHECK") != "1":
            raise RuntimeError("the CUDA cases run on Numba's simulator: "
                               "set NUMBA_ENABLE_CUDASIM=1")
        return gc.compile(outputs, target="cuda")(to_host=True, **feeds)
    return gc.compile(outputs, target=target)(**feeds)


def assert_all_close(got, want, rtol=1e-12):
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        assert g.shape == w.shape and g.dtype == w.dtype, (k, g.shape, w.shape, g.dtype, w.dtype)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=0, err_msg=f"output {k}")


def sum_to(x, shape):
    """numpy: `x` summed over the dims broadcasting added to reach it from `shape`."""
    lead = x.ndim - len(shape)
    axes = tuple(range(lead)) + tuple(lead + i for i, d in enumerate(shape)
                                      if d == 1 and x.shape[lead + i] != 1)
    return x.sum(axis=axes, keepdims=True).reshape(shape)


# -- PRODUCT at zeros, MAX/MIN at ties -------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_product_gradient_at_zeros(target):
    # rows: no zero, one zero, two zeros; the full product holds three zeros
    xv = np.array([[1.5, 2.0, 3.0, 4.0], [0.0, 2.0, 3.0, 0.5], [0.0, 2.0, 0.0, 4.0]])
    with gc.Graph("prod_zeros"):
        x = gc.input("x", (3, 4), "float64")
        outs = [gc.grad(gc.prod(x, 1).sum(), x), gc.grad(gc.prod(x, 0).sum(), x)]
    others = [[np.prod(np.delete(row, j)) for j in range(4)] for row in xv]
    columns = [[np.prod(np.delete(xv[:, j], i)) for j in range(4)] for i in range(3)]
    assert_all_close(run(outs, {"x": xv}, target), [np.array(others), np.array(columns)])


@pytest.mark.parametrize("target", TARGETS)
def test_max_min_gradients_split_among_ties(target):
    xv = np.array([[1.0, 3.0, 3.0, 0.0], [2.0, 0.5, 0.5, 0.5], [1.0, np.nan, 1.0, 2.0]])
    with gc.Graph("ties"):
        x = gc.input("x", (3, 4), "float64")
        outs = [gc.grad(gc.max(x, 1).sum(), x), gc.grad(gc.min(x, 1).sum(), x)]
    want = []
    for extreme in (np.max, np.min):
        attains = xv == extreme(xv, axis=1, keepdims=True)  # all False in the NaN row
        want.append(attains / np.maximum(attains.sum(axis=1, keepdims=True), 1))
    assert_all_close(run(outs, {"x": xv}, target), want)


# -- matmul with an empty contracted or batch dim ---------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("a_shape, b_shape", [((5, 5, 0), (0, 5)), ((2, 3, 4), (4, 0)),
                                              ((2, 3, 0), (2, 0, 4)), ((0, 3, 4), (0, 4, 2))],
                         ids=str)
def test_matmul_with_an_empty_dim_and_its_gradients(a_shape, b_shape, target, rng):
    av, bv = rng.standard_normal(a_shape), rng.standard_normal(b_shape)
    with gc.Graph("empty_matmul"):
        a, b = gc.input("a", a_shape, "float64"), gc.input("b", b_shape, "float64")
        y = a @ b
        w = gc.input("w", y.shape, "float64")
        outs = [y + 1.0, *gc.grad((y * w).sum(), [a, b])]
    wv = rng.standard_normal(y.shape)
    want = [np.matmul(av, bv) + 1.0, sum_to(np.matmul(wv, np.swapaxes(bv, -1, -2)), a_shape),
            sum_to(np.matmul(np.swapaxes(av, -1, -2), wv), b_shape)]
    assert_all_close(run(outs, {"a": av, "b": bv, "w": wv}, target), want)


# -- an elementwise op on a 0-d gather with a Tensor index ------------------------------------

GATHER_CASES = {
    "negate": (lambda x, x2, t: -x[t], lambda xv, x2v, t: -xv[t]),
    "exp": (lambda x, x2, t: gc.exp(x[t]), lambda xv, x2v, t: np.exp(xv[t])),
    "scale": (lambda x, x2, t: x[t] * 2.0, lambda xv, x2v, t: xv[t] * 2.0),
    "negate_2d": (lambda x, x2, t: -x2[t, t], lambda xv, x2v, t: -x2v[t, t]),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", list(GATHER_CASES))
def test_elementwise_op_on_a_0d_gather_with_a_tensor_index(case, target):
    # the op runs as the gather's epilogue, a rank-0 loop that updates the gathered value in
    # place: the CPU kernel once stored a variable it never computed
    build, oracle = GATHER_CASES[case]
    xv, x2v = np.array([1.5, -2.0, 3.0]), np.arange(9.0).reshape(3, 3) - 4.0
    with gc.Graph("gather0d"):
        x, x2 = gc.input("x", (3,), "float64"), gc.input("x2", (3, 3), "float64")
        t = gc.input("t", (), "int64")
        out = build(x, x2, t)
    for tv in (0, 2):
        got = run([out], {"x": xv, "x2": x2v, "t": np.array(tv)}, target)
        assert_all_close(got, [np.asarray(oracle(xv, x2v, tv))], rtol=1e-15)


# -- softmax over a zero-length axis -------------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape, axis", [((3, 0), -1), ((0, 4), 0), ((0, 0, 2), 1)], ids=str)
def test_softmax_over_a_zero_length_axis_is_empty(shape, axis, target):
    # softmax and log_softmax over an empty axis, and their gradients; where the other axes
    # are empty too, a MAX over the empty axis (its result is empty) and its gradient
    with gc.Graph("empty_softmax"):
        x = gc.input("x", shape, "float64")
        s, ls = gc.softmax(x, axis), gc.log_softmax(x, axis)
        loss = (s * 2.0).sum() + ls.sum()
        outs = [s, ls]
        if 0 in shape[:axis % len(shape)]:
            m = gc.max(x, axis)
            outs.append(m)
            loss = loss + m.sum()
        outs.append(gc.grad(loss, x))
    want = [np.zeros(o.shape) for o in outs]
    assert all(0 in o.shape for o in outs)
    assert_all_close(run(outs, {"x": np.zeros(shape)}, target), want)


# -- a scatter whose values are its own data ------------------------------------------------------

@pytest.mark.parametrize("target", TARGETS)
def test_index_add_of_an_array_to_itself_at_permuted_positions(target):
    # the data operand dies in the scatter, but it is the values operand too: updating it in
    # place would add values already updated (a[1] += a[2] after a[2] += a[1])
    with gc.Graph("self_scatter"):
        x = gc.input("x", (3,), "float64")
        a = gc.exp(x)
        outs = [gc.index_add(a, gc.constant(np.array([0, 2, 1])), a)]
    x = np.array([0.1, -0.4, 0.7])
    a = np.exp(x)
    want = a.copy()
    np.add.at(want, [0, 2, 1], a)
    assert_all_close(run(outs, {"x": x}, target), [want])
