"""Messages a user can act on (issue 12, item 10): each names the argument, the value and,
at build time, the user's own line, where bare TypeErrors or misleading feed errors came
before; and the calls that were refused for no reason (a step fed a dict positionally, hvp
with numpy vectors) now give the answer.
"""

from __future__ import annotations

import inspect
import sys

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import DTypeError, FeedError, GraphError, IndexOutOfRangeError, ShapeError


def _here() -> str:
    """`file:line` of the caller's next line, as a build error reports it."""
    return f"{__file__}:{sys._getframe(1).f_lineno + 1}"


@pytest.mark.parametrize("axis", [1.0, "1", True, (0, 1.0)])
def test_reduce_axis_of_the_wrong_type_is_named(axis):
    with gc.Graph():
        x = gc.input("x", (2, 3))
        with pytest.raises(ShapeError) as caught:
            line = _here()
            x.sum(axis=axis)
    assert f"Reduce SUM: axis must be an int, a tuple of ints or None, got {axis!r}" \
        in str(caught.value)
    assert str(caught.value).endswith(line)


@pytest.mark.parametrize("dtype, scalar", [("int8", 1000), ("int8", -129), ("uint8", -1),
                                           ("int32", 2**31)])
def test_integer_scalar_out_of_the_dtype_range_is_named(dtype, scalar):
    info = np.iinfo(dtype)
    with gc.Graph():
        t = gc.input("t", (3,), dtype)
        with pytest.raises(DTypeError) as caught:
            line = _here()
            t * scalar
        fits = gc.evaluate(t * int(info.max), t=np.ones(3, dtype))
    message = str(caught.value)
    assert f"scalar {scalar} does not fit {dtype} (range [{info.min}, {info.max}])" in message
    assert message.endswith(line)
    np.testing.assert_array_equal(fits, np.full(3, info.max, dtype))


@pytest.mark.parametrize("wrt", [np.ones(3), [np.ones(3)], 3.0])
def test_grad_with_respect_to_a_non_tensor_is_named(wrt):
    with gc.Graph():
        x = gc.input("x", (3,))
        loss = (x * x).sum()
        with pytest.raises(GraphError) as caught:
            line = _here()
            gc.grad(loss, wrt)
    assert "wrt must be a Tensor or a list of Tensors" in str(caught.value)
    assert str(caught.value).endswith(line)


def test_hvp_takes_numpy_vectors():
    """Hessian of Σ x³ is diag(6x): the product with v is 6·x·v, by array or by Tensor."""
    xv, vv = np.array([1.0, -2.0, 0.5]), np.array([0.3, 1.0, -2.0])
    with gc.Graph():
        x = gc.input("x", (3,), "float64")
        loss = (x * x * x).sum()
        by_array = gc.hvp(loss, x, vv)
        by_list = gc.hvp(loss, [x], [vv])
        with pytest.raises(gc.NotDifferentiableError,
                           match=r"vector float64\[2\] does not match wrt tensor float64\[3\]"):
            gc.hvp(loss, x, np.ones(2))
    for got in gc.evaluate([by_array, by_list[0]], x=xv):
        np.testing.assert_allclose(got, 6 * xv * vv, rtol=1e-12)


def test_compiled_step_takes_a_positional_feed_dict_as_evaluate_does():
    with gc.Graph():
        x = gc.input("x", (2,))
        y = gc.input("y", (2,))
        out = x * y + 1.0
    xv, yv = np.array([1.0, 2.0], np.float32), np.array([3.0, -1.0], np.float32)
    step = gc.compile(out)
    want = xv * yv + 1
    np.testing.assert_array_equal(step({"x": xv, "y": yv}), want)
    np.testing.assert_array_equal(step({"x": xv}, y=yv), want)
    np.testing.assert_array_equal(gc.evaluate(out, {"x": xv, "y": yv}), want)
    with pytest.raises(FeedError, match="feeds must be a dict.*got a list; an output array goes"):
        step([xv, yv])


def test_cuda_step_takes_a_positional_feed_dict():
    from gradcompiler.backends.numba_cuda import require_cuda

    require_cuda()
    with gc.Graph():
        x = gc.input("x", (2,))
        out = x * 2.0
    got = gc.compile(out, target="cuda")({"x": np.array([1.0, 3.0], np.float32)}, to_host=True)
    np.testing.assert_array_equal(got, [2.0, 6.0])


def test_a_feed_of_none_is_named_with_what_it_needs():
    with gc.Graph():
        x = gc.input("x", (2, 3))
        out = x.sum()
    step = gc.compile(out)
    for run in (lambda: gc.evaluate(out, x=None), lambda: step(x=None)):
        with pytest.raises(FeedError, match=r"^feed 'x' is None; it needs an array of shape "
                                            r"\(2, 3\) and dtype float32$"):
            run()


def test_numpy_ufuncs_on_a_tensor_build_the_matching_nodes():
    xv = np.array([0.5, -1.0, 2.0])
    with gc.Graph():
        x = gc.input("x", (3,), "float64")
        built = [np.exp(x), np.log(np.abs(x)), np.tanh(x), np.sqrt(np.abs(x)), np.add(x, 1.0),
                 np.ones(3) * x, np.maximum(x, 0.0), np.ones(3) > x, np.floor(x), np.rint(x)]
        refused = r"numpy's arctan\.__call__.*symbolic Tensor"
        with pytest.raises(DTypeError, match=refused) as caught:
            line = _here()
            np.arctan(x)
        with pytest.raises(DTypeError, match=r"numpy's add\.__call__ with out cannot run"):
            np.add(x, 1.0, out=np.ones(3))
    want = [np.exp(xv), np.log(np.abs(xv)), np.tanh(xv), np.sqrt(np.abs(xv)), xv + 1.0, xv,
            np.maximum(xv, 0.0), 1.0 > xv, np.floor(xv), np.rint(xv)]
    for got, w in zip(gc.evaluate(built, x=xv), want):
        np.testing.assert_allclose(got, w, rtol=1e-15)
    assert str(caught.value).endswith(line)


def test_numpy_functions_on_a_tensor_build_the_matching_gc_calls():
    xv = np.arange(6.0).reshape(2, 3) - 2.5
    cv = np.array([[1.0, -2.0, 0.5], [3.0, 0.25, -1.0]])
    with gc.Graph():
        x = gc.input("x", (2, 3), "float64")
        pairs = [  # numpy's function on the Tensor, the explicit gc call, numpy on arrays
            (np.sum(x), gc.sum(x), np.sum(xv)),
            (np.sum(x, axis=0, keepdims=True), gc.sum(x, 0, True), np.sum(xv, 0, keepdims=True)),
            (np.mean(x, 1), gc.mean(x, 1), np.mean(xv, 1)),
            (np.max(x, axis=1), gc.max(x, 1), np.max(xv, axis=1)),
            (np.amin(x), gc.min(x), np.amin(xv)),
            (np.prod(x, axis=0), gc.prod(x, 0), np.prod(xv, axis=0)),
            (np.reshape(x, (3, 2)), gc.reshape(x, (3, 2)), np.reshape(xv, (3, 2))),
            (np.transpose(x, axes=(1, 0)), gc.transpose(x, (1, 0)), np.transpose(xv)),
            (np.concatenate([x, cv], axis=1), gc.concat([x, cv], 1),
             np.concatenate([xv, cv], axis=1)),
            (np.dot(x, cv.T), gc.matmul(x, cv.T), np.dot(xv, cv.T)),
            (np.matmul(cv.T, x), gc.matmul(cv.T, x), np.matmul(cv.T, xv)),
            (np.where(x > 0, x, cv), gc.where(x > 0, x, cv), np.where(xv > 0, xv, cv)),
            (np.clip(x, -1.0, 1.5), gc.clip(x, -1.0, 1.5), np.clip(xv, -1.0, 1.5)),
            (np.clip(x, a_min=None, a_max=0.0), gc.clip(x, hi=0.0), np.clip(xv, None, 0.0)),
            (np.squeeze(np.expand_dims(x, 0), 0), x, xv),
            (np.swapaxes(np.broadcast_to(x, (4, 2, 3)), 0, 2),
             gc.swapaxes(gc.broadcast_to(x, (4, 2, 3)), 0, 2),
             np.swapaxes(np.broadcast_to(xv, (4, 2, 3)), 0, 2)),
        ]
    via_numpy = gc.evaluate([p[0] for p in pairs], x=xv)
    via_gc = gc.evaluate([p[1] for p in pairs], x=xv)
    for k, (got, explicit, (_, _, want)) in enumerate(zip(via_numpy, via_gc, pairs)):
        np.testing.assert_array_equal(got, explicit, err_msg=f"pair {k}")
        np.testing.assert_allclose(got, want, rtol=1e-15, atol=1e-15, err_msg=f"pair {k}")
        assert got.shape == np.shape(want), k


@pytest.mark.parametrize("call, words", [
    (lambda x: np.sum(x, out=np.zeros(())),
     r"numpy's sum cannot run on a symbolic Tensor; gc\.sum\(x, axis=None, keepdims=False\) "
     r"does not take these arguments \(got an unexpected keyword argument 'out'\)"),
    (lambda x: np.sum(x, 0, np.float32),
     r"gc\.sum\(x, axis=None, keepdims=False\) takes numpy's first 2 arguments by position, "
     r"not 3"),
    (lambda x: np.stack([x, x]), r"numpy's stack .*; use gc\.concat of gc\.expand_dims"),
    (lambda x: np.dot(gc.broadcast_to(x, (2, 2, 3)), np.ones((3, 2))),
     r"numpy's dot .*above 2-d.*use gc\.matmul"),
    (lambda x: np.argsort(x), r"numpy's argsort .*build it from gc functions"),
])
def test_numpy_functions_a_tensor_cannot_take_are_refused_by_name(call, words):
    with gc.Graph():
        x = gc.input("x", (2, 3), "float64")
        with pytest.raises(DTypeError, match=words) as caught:
            call(x)
    assert str(caught.value).endswith(f"at {__file__}:{call.__code__.co_firstlineno}")  # the lambda


def _summed_cross_entropy(z, labels):
    """The user's loss helper: the message must name the cross_entropy line in here, not the
    line that called the helper."""
    scale = 2.0
    return scale * gc.cross_entropy(z, labels,
                                    reduction="sum")


@pytest.mark.parametrize("run", ["reference", "cpu"])
def test_cross_entropy_in_a_helper_names_the_line_of_its_call(run):
    with gc.Graph():
        z = gc.param("z", (3, 4))
        labels = gc.input("labels", (3,), "int32")
        loss = _summed_cross_entropy(z, labels)
    source, first = inspect.getsourcelines(_summed_cross_entropy)
    line = first + next(k for k, text in enumerate(source) if "gc.cross_entropy(" in text)
    step = gc.compile(loss) if run == "cpu" else (lambda **feeds: gc.evaluate(loss, feeds))
    z0 = np.zeros((3, 4), np.float32)
    with pytest.raises(IndexOutOfRangeError) as caught:
        step(z=z0, labels=np.array([0, 5, 1], np.int32))
    assert str(caught.value) == (f"cross_entropy (labels from feed 'labels', at {__file__}:{line}):"
                                 f" label 5 is outside the valid range [0, 4)")
    np.testing.assert_allclose(step(z=z0, labels=np.array([0, 3, 1], np.int32)),
                               2.0 * 3 * np.log(4.0), rtol=1e-6)
