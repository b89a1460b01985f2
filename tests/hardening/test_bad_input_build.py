"""Bad input at build time (issue 8, part 1): every op refuses wrong shapes and dtypes
with a clear exception, and malformed graphs and gradient requests are refused too.

Each row of `BAD_BUILDS` is one mistake a user can make. The test checks the
exception's class (ShapeError, DTypeError or GraphError, all from
`gradcompiler.errors`), that the message names the op and the offending
shapes or dtypes, and that the error points at the user's own line: the
line of the row's lambda in this file, whatever depth of library code the
mistake was found in.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.errors import (
    BuildError,
    DTypeError,
    GraphError,
    NotDifferentiableError,
    ShapeError,
)
from gradcompiler.ops import all_op_classes
from gradcompiler.ops.conv import ConvolutionBackwardData, ConvolutionBackwardFilter
from gradcompiler.ops.custom import CustomGradient
from gradcompiler.ops.elemwise import StopGradient
from gradcompiler.ops.pool import Pooling, PoolingBackward
from gradcompiler.ops.shape import FastpathCopy
from gradcompiler.ops.vision import (
    WarpPerspectiveBackwardData,
    WarpPerspectiveBackwardMat,
    WarpPerspectiveTangentMat,
)

HERE = os.path.abspath(__file__)


@dataclass
class Bad:
    op: str  # how the message names the op (its label)
    error: type[BuildError]
    build: Callable[[SimpleNamespace], object]  # one line, so its line is the user's line
    fragments: tuple[str, ...]  # what the message must say (shapes, dtypes, values)

    def __str__(self) -> str:
        return f"{self.op}:{self.build.__code__.co_firstlineno}"


def make_tensors() -> SimpleNamespace:
    return SimpleNamespace(
        x=gc.input("x", (2, 3)), y=gc.input("y", (4, 5)), d=gc.input("d", (2, 3), "float64"),
        i=gc.input("i", (2, 3), "int32"), b=gc.input("b", (2, 3), "bool"),
        idx=gc.input("idx", (2,), "int32"), idx3=gc.input("idx3", (3,), "int32"),
        fidx=gc.input("fidx", (2,), "float32"), v=gc.input("v", (3,)),
        b3=gc.input("b3", (2, 2, 3)), c3=gc.input("c3", (3, 3, 4)),
        nhwc=gc.input("nhwc", (1, 4, 4, 2)), nchw=gc.input("nchw", (1, 2, 4, 4)),
        inhwc=gc.input("inhwc", (1, 4, 4, 2), "int32"),
        m23=gc.input("m23", (1, 2, 3)), m33=gc.input("m33", (1, 3, 3)),
        m32=gc.input("m32", (1, 3, 2)),
        m33x2=gc.input("m33x2", (2, 3, 3)), g=gc.input("g", (1, 3, 2, 2)),
        ps=gc.input("ps", (1, 6, 2, 2)), pu=gc.input("pu", (1, 1, 3, 3)),
        img=gc.input("img", (2, 4, 5, 5)), w33=gc.input("w33", (6, 4, 3, 3)),
        w3c=gc.input("w3c", (6, 3, 3, 3)), w88=gc.input("w88", (6, 4, 8, 8)),
        dimg=gc.input("dimg", (2, 4, 5, 5), "float64"), dy33=gc.input("dy33", (2, 6, 3, 3)),
    )


BAD_BUILDS = [
    # sources
    Bad("Placeholder", ShapeError, lambda t: gc.input("neg", (2, -1)), ("(2, -1)", "negative")),
    Bad("Placeholder", DTypeError, lambda t: gc.input("obj", (2,), object), ("object",)),
    Bad("Placeholder", DTypeError, lambda t: gc.param("cpx", (2,), "complex64"), ("complex64",)),
    Bad("Placeholder", DTypeError, lambda t: gc.input("typo", (2,), "flaot32"), ("flaot32",)),
    Bad("Constant", DTypeError, lambda t: gc.constant("text"), ("<U4",)),
    Bad("Constant", DTypeError, lambda t: t.x + np.array(["a", "b", "c"]), ("<U1",)),
    Bad("Fill", ShapeError, lambda t: gc.full((2, -3), 1.0), ("(2, -3)",)),
    Bad("Fill", DTypeError, lambda t: gc.zeros((2,), object), ("object",)),
    # elementwise
    Bad("Elemwise ADD", ShapeError, lambda t: t.x + t.y, ("(2, 3)", "(4, 5)")),
    Bad("Elemwise MUL", DTypeError, lambda t: t.x * t.d, ("float32", "float64")),
    Bad("Elemwise EXP", DTypeError, lambda t: gc.exp(t.i), ("int32",)),
    Bad("Elemwise ADD", DTypeError, lambda t: t.b + t.b, ("bool",)),
    Bad("Elemwise LT", ShapeError, lambda t: t.x < t.v.reshape(3, 1), ("(2, 3)", "(3, 1)")),
    Bad("Elemwise", ShapeError, lambda t: gc.elemwise("HYPOT", t.x, t.x), ("HYPOT",)),
    Bad("Elemwise FUSE_MUL_ADD3", ShapeError,
        lambda t: gc.elemwise("FUSE_MUL_ADD3", t.x, t.x), ("3",)),
    Bad("Elemwise COND_LEQ_MOV", DTypeError, lambda t: gc.elemwise("COND_LEQ_MOV", t.x, t.d, t.x),
        ("float32", "float64")),
    Bad("Elemwise ADD", DTypeError, lambda t: t.i + 0.5, ("0.5", "int32")),
    Bad("Where", DTypeError, lambda t: gc.where(t.x, t.x, t.x), ("bool", "float32")),
    Bad("Where", ShapeError, lambda t: gc.where(t.b, t.y, t.x), ("(2, 3)", "(4, 5)")),
    Bad("Where", DTypeError, lambda t: gc.where(t.b, t.x, t.d), ("float32", "float64")),
    Bad("Cast", DTypeError, lambda t: t.x.astype(object), ("object",)),
    Bad("Cast", DTypeError, lambda t: t.x.astype("complex128"), ("complex128",)),
    Bad("StopGradient", GraphError, lambda t: gc.apply(StopGradient(), t.x, t.x), ("1", "2")),
    # reductions
    Bad("Reduce SUM", ShapeError, lambda t: t.x.sum(axis=2), ("axis 2", "rank 2")),
    Bad("Reduce MAX", ShapeError, lambda t: t.x.max(axis=(1, -1)), ("repeated",)),
    Bad("Reduce MEAN", DTypeError, lambda t: t.i.mean(), ("int32",)),
    Bad("Reduce MAX", DTypeError, lambda t: t.b.max(), ("bool",)),
    Bad("Reduce MAX", ShapeError, lambda t: gc.zeros((0, 3)).max(axis=0), ("empty", "(0, 3)")),
    Bad("Reduce", ShapeError, lambda t: gc.reduce("MEDIAN", t.x), ("MEDIAN",)),
    Bad("ReduceTo", ShapeError, lambda t: gc.reduce_to(t.x, (4,)), ("(2, 3)", "(4,)")),
    # shape ops
    Bad("Reshape", ShapeError, lambda t: t.x.reshape(4, 2), ("(2, 3)", "(4, 2)")),
    Bad("Reshape", ShapeError, lambda t: t.x.reshape(-1, -1), ("-1",)),
    Bad("Broadcast", ShapeError, lambda t: gc.broadcast_to(t.x, (4, 3)), ("(2, 3)", "(4, 3)")),
    Bad("Broadcast", ShapeError, lambda t: gc.broadcast_to(t.x, (3,)), ("(2, 3)", "(3,)")),
    Bad("AddAxis", ShapeError, lambda t: gc.expand_dims(t.x, 5), ("5",)),
    Bad("RemoveAxis", ShapeError, lambda t: gc.squeeze(t.x, 0), ("size 2", "(2, 3)")),
    Bad("Transpose", ShapeError, lambda t: gc.transpose(t.x, (0, 0)), ("repeated",)),
    Bad("Transpose", ShapeError, lambda t: gc.transpose(t.x, (0, 1, 2)), ("axis 2", "rank 2")),
    Bad("Concat", ShapeError, lambda t: gc.concat([t.x, t.y]), ("(2, 3)", "(4, 5)")),
    Bad("Concat", DTypeError, lambda t: gc.concat([t.x, t.d], axis=1), ("float32", "float64")),
    Bad("FastpathCopy", GraphError, lambda t: gc.apply(FastpathCopy(), t.x, t.y), ("1", "2")),
    Bad("PixelShuffle", ShapeError, lambda t: gc.pixel_shuffle(t.ps, 2), ("(1, 6, 2, 2)", "4")),
    Bad("PixelShuffle", ShapeError, lambda t: gc.pixel_shuffle(t.x, 2), ("(2, 3)",)),
    Bad("PixelShuffle", ShapeError, lambda t: gc.pixel_shuffle(t.ps, 0), ("0",)),
    Bad("PixelShuffleBackward", ShapeError,
        lambda t: gc.pixel_unshuffle(t.pu, 2), ("(1, 1, 3, 3)",)),
    # basic indexing
    Bad("Subtensor", ShapeError, lambda t: t.x[2], ("index 2", "size 2")),
    Bad("Subtensor", ShapeError, lambda t: t.x[0, 0, 0], ("too many", "(2, 3)")),
    Bad("Subtensor", DTypeError, lambda t: t.x[1.5], ("1.5",)),
    Bad("SetSubtensor", ShapeError, lambda t: gc.index_update(t.x, 0, t.y), ("(4, 5)", "(3,)")),
    Bad("SetSubtensor", DTypeError,
        lambda t: gc.index_update(t.x, 0, t.d[0]), ("float64", "float32")),
    Bad("SetSubtensor", ShapeError,
        lambda t: gc.index_add(t.x, (slice(None), 5), 1.0), ("5", "size 3")),
    # advanced indexing
    Bad("IndexingMultiAxisVec", DTypeError, lambda t: t.x[t.fidx], ("float32",)),
    Bad("IndexingMultiAxisVec", ShapeError, lambda t: t.x[[0, 5]], ("5", "size 2")),
    Bad("IndexingMultiAxisVec", ShapeError, lambda t: t.x[t.idx, t.idx3], ("(2,)", "(3,)")),
    Bad("IndexingMultiAxisVec", ShapeError, lambda t: t.x[t.b], ("bool Tensor mask", "(2, 3)")),
    Bad("IndexingIncrMultiAxisVec", ShapeError,
        lambda t: gc.index_add(t.x, t.idx, t.y), ("(4, 5)", "(2, 3)")),
    Bad("IndexingSetMultiAxisVec", ShapeError, lambda t: gc.index_update(t.x, t.idx, t.v[:2]),
        ("(2,)", "(2, 3)")),
    Bad("IndexingSetMultiAxisVec", DTypeError,
        lambda t: gc.index_update(t.x, t.idx, t.d), ("float64",)),
    # one-hot indexing
    Bad("IndexingOneHot", ShapeError,
        lambda t: gc.indexing_one_hot(t.x, t.idx3, 1), ("(3,)", "(2,)")),
    Bad("IndexingOneHot", DTypeError, lambda t: gc.indexing_one_hot(t.x, t.fidx, 1), ("float32",)),
    Bad("IndexingOneHot", ShapeError, lambda t: gc.indexing_one_hot(t.v, t.idx, 0), ("(3,)",)),
    Bad("IndexingOneHot", ShapeError,
        lambda t: gc.indexing_one_hot(t.x, t.idx, 2), ("axis 2", "rank 2")),
    Bad("IndexingSetOneHot", ShapeError, lambda t: gc.indexing_set_one_hot(t.x, t.idx, t.y, 1),
        ("(4, 5)", "(2, 1)")),
    Bad("IndexingSetOneHot", DTypeError,
        lambda t: gc.indexing_set_one_hot(t.x, t.idx, t.d[:, :1], 1),
        ("float64", "float32")),
    # matrix products
    Bad("MatrixMul", ShapeError, lambda t: t.x @ t.y, ("(2, 3)", "(4, 5)", "3", "4")),
    Bad("MatrixMul", DTypeError, lambda t: t.i @ t.i.T, ("int32",)),
    Bad("MatrixMul", DTypeError, lambda t: t.x @ t.d.T, ("float32", "float64")),
    Bad("BatchedMatrixMul", ShapeError, lambda t: t.b3 @ t.c3, ("(2,)", "(3,)")),
    Bad("BatchedMatrixMul", ShapeError, lambda t: t.b3 @ t.b3, ("(2, 2, 3)", "3", "2")),
    # warps
    Bad("WarpAffine", ShapeError,
        lambda t: gc.warp_affine(t.nhwc, t.m33, (2, 2)), ("(1, 3, 3)", "(N, 2, 3)")),
    Bad("WarpAffine", ShapeError, lambda t: gc.warp_affine(t.x, t.m23, (2, 2)), ("(2, 3)", "4-D")),
    Bad("WarpAffine", DTypeError, lambda t: gc.warp_affine(t.inhwc, t.m23, (2, 2)), ("int32",)),
    Bad("WarpAffine", ShapeError,
        lambda t: gc.warp_affine(t.nhwc, t.m23, (2, 2), "mirror"), ("mirror",)),
    Bad("WarpAffine", ShapeError, lambda t: gc.warp_affine(t.nhwc, t.m23, (2, 0)), ("(2, 0)",)),
    Bad("WarpAffine", ShapeError,
        lambda t: gc.warp_affine(t.nhwc, t.m23, (2, 2), format="CHWN"), ("CHWN",)),
    Bad("WarpPerspective", ShapeError,
        lambda t: gc.warp_perspective(t.nchw, t.m32, (2, 2)), ("(1, 3, 2)",)),
    Bad("WarpPerspective", ShapeError,
        lambda t: gc.warp_perspective(t.nchw, t.m33x2, (2, 2)), ("2", "1")),
    Bad("WarpPerspective", DTypeError,
        lambda t: gc.warp_perspective(t.nchw, t.m33x2, (2, 2), t.fidx),
        ("mat_idx", "float32")),
    Bad("WarpPerspective", ShapeError,
        lambda t: gc.warp_perspective(t.nchw, t.m33x2, (2, 2), t.idx3),
        ("(3,)", "(2,)")),
    Bad("WarpPerspectiveBackwardData", ShapeError,
        lambda t: gc.apply(WarpPerspectiveBackwardData((1, 2, 4, 4)), t.m33, t.g),
        ("3 channels", "2")),
    Bad("WarpPerspectiveBackwardMat", ShapeError,
        lambda t: gc.apply(WarpPerspectiveBackwardMat(), t.nchw, t.m33, t.g),
        ("(1, 3, 2, 2)", "2 channels")),
    Bad("WarpPerspectiveTangentMat", ShapeError,
        lambda t: gc.apply(WarpPerspectiveTangentMat((2, 2)), t.nchw, t.m33, t.m23),
        ("v must have mat's shape (1, 3, 3)", "(1, 2, 3)")),
    Bad("WarpPerspectiveTangentMat", ShapeError,
        lambda t: gc.apply(WarpPerspectiveTangentMat((0, 2)), t.nchw, t.m33, t.m33), ("(0, 2)",)),
    Bad("CustomGradient identity", GraphError,
        lambda t: gc.apply(CustomGradient(_identity_backward, "identity", 1, 0), t.x),
        ("1 arguments, 0 residuals and the forward value", "got 1 inputs")),
    # convolution and pooling
    Bad("Convolution", ShapeError, lambda t: gc.conv2d(t.c3, t.w33), ("(3, 3, 4)", "4-D")),
    Bad("Convolution", ShapeError,
        lambda t: gc.conv2d(t.img, t.w3c), ("(6, 3, 3, 3)", "(2, 4, 5, 5)", "4 channels")),
    Bad("Convolution", ShapeError,
        lambda t: gc.conv2d(t.img, t.w33, groups=3), ("groups=3", "(2, 4, 5, 5)", "(6, 4, 3, 3)")),
    Bad("Convolution", ShapeError,
        lambda t: gc.conv2d(t.img, t.w88, padding=1), ("(8, 8)", "(2, 4, 5, 5)", "larger")),
    Bad("Convolution", ShapeError,
        lambda t: gc.conv2d(t.img, t.w33, stride=0), ("stride", "(0, 0)")),
    Bad("Convolution", DTypeError, lambda t: gc.conv2d(t.dimg, t.w33), ("float64", "float32")),
    Bad("ConvolutionBackwardData", ShapeError,
        lambda t: gc.apply(ConvolutionBackwardData(image=(6, 6)), t.w33, t.dy33),
        ("(6, 6)", "(4, 4)", "(3, 3)")),
    Bad("ConvolutionBackwardFilter", ShapeError,
        lambda t: gc.apply(ConvolutionBackwardFilter(kernel=(2, 2)), t.img, t.dy33),
        ("(2, 2)", "(4, 4)", "(3, 3)")),
    Bad("conv_transpose2d", ShapeError,
        lambda t: gc.conv_transpose2d(t.img, t.w33), ("(2, 4, 5, 5)", "(6, 4, 3, 3)", "6")),
    Bad("Pooling MAX", ShapeError, lambda t: gc.max_pool2d(t.c3, 2), ("(3, 3, 4)", "4-D")),
    Bad("Pooling AVERAGE", ShapeError,
        lambda t: gc.avg_pool2d(t.img, 3, padding=2), ("(2, 2)", "half", "(3, 3)")),
    Bad("Pooling MAX", ShapeError,
        lambda t: gc.max_pool2d(t.img, (8, 2)), ("(8, 2)", "(2, 4, 5, 5)", "larger")),
    Bad("PoolingBackward MAX", ShapeError,
        lambda t: gc.apply(PoolingBackward("MAX", (2, 2), (2, 2), image=(5, 5)), t.img, t.dy33),
        ("(2, 4, 5, 5)", "(2, 6, 5, 5)")),
    Bad("Pooling SUM", ShapeError, lambda t: gc.apply(Pooling("SUM"), t.img), ("SUM",)),
    Bad("batch_norm", ShapeError,
        lambda t: gc.batch_norm(t.img, t.v), ("(3,)", "(4,)")),
    Bad("adaptive_avg_pool2d", ShapeError,
        lambda t: gc.adaptive_avg_pool2d(t.img, 0), ("output_size", "0")),
]


def _identity_backward(g):
    return [g]


@pytest.fixture
def tensors():
    with gc.Graph("bad_build") as graph:
        yield make_tensors()
    gc.verify(graph)  # a refused node leaves no trace in the graph


@pytest.mark.parametrize("bad", BAD_BUILDS, ids=str)
def test_bad_build_is_a_clear_error_at_the_users_line(bad, tensors):
    with pytest.raises(bad.error) as info:
        bad.build(tensors)
    err = info.value
    message = str(err)
    assert err.op == bad.op or message.startswith(bad.op), message
    for fragment in bad.fragments:
        assert fragment in message, f"{fragment!r} missing from: {message}"
    assert err.site == f"{HERE}:{bad.build.__code__.co_firstlineno}", message
    assert message.endswith(f"at {err.site}")


def test_every_op_has_a_bad_build_case():
    """A new op must come with its build-time mistakes (Placeholder/Constant/Fill included)."""
    covered = {bad.op.split()[0] for bad in BAD_BUILDS}
    assert {c.__name__ for c in all_op_classes()} <= covered


# -- malformed graphs ----------------------------------------------------------------------------

def test_a_cycle_is_refused_by_verify_and_by_every_consumer_of_the_graph():
    """Graph.add cannot build a cycle (inputs must exist), but a pass can rewire one into it."""
    with gc.Graph("cyclic") as graph:
        x = gc.param("x", (3,))
        a = x * 2.0
        b = gc.sin(a)
        c = b + 1.0
        loss = c.sum()
    graph.replace_inputs(a.id, (x.id, c.id))  # a = x * c: a reads c, which reads b, which reads a
    with pytest.raises(GraphError, match=r"cycle through nodes") as info:
        gc.verify(graph)
    assert {a.id, b.id} <= {int(s) for s in str(info.value).split("[")[1].split("]")[0].split(",")}
    with pytest.raises(GraphError, match="cycle"):
        gc.compile(loss)
    with pytest.raises(GraphError, match="cycle"):
        gc.evaluate(loss, x=np.zeros(3, np.float32))
    with pytest.raises(GraphError, match="cycle"):
        gc.grad(loss, [x])


def test_nodes_of_another_graph_are_refused():
    with gc.Graph("first") as first:
        x = gc.input("x", (3,))
    with gc.Graph("second"):
        y = gc.input("y", (3,))
        with pytest.raises(GraphError, match="different graphs") as info:
            y + x  # noqa: B018
        assert info.value.site.startswith(HERE + ":")
        loss = (y * y).sum()
    with pytest.raises(GraphError, match="one graph"):
        gc.grad(loss, [x])
    with pytest.raises(GraphError, match="one graph"):
        gc.compile([loss, x])
    with pytest.raises(GraphError, match="not a node of graph 'first'"):
        first.add(StopGradient(), [y.id + 100])


def test_grad_of_a_non_scalar_needs_cotangents():
    with gc.Graph("vector_loss"):
        w = gc.param("w", (3,))
        out = gc.exp(w)
        with pytest.raises(NotDifferentiableError, match=r"scalar loss, got shape \(3,\)") as info:
            gc.grad(out, [w])
    assert info.value.site.startswith(HERE)
    assert "gc.vjp" in str(info.value)


def test_vjp_cotangent_must_match_the_output():
    with gc.Graph("vjp"):
        w = gc.param("w", (3,))
        out = gc.exp(w)
        wrong = gc.input("cot", (2,))
        with pytest.raises(NotDifferentiableError, match=r"float32\[2\].*float32\[3\]"):
            gc.vjp(out, [w], [wrong])


def test_grad_wrt_an_integer_input_is_refused():
    with gc.Graph("int_wrt"):
        x = gc.param("x", (2, 3))
        labels = gc.input("labels", (2,), "int32")
        loss = gc.cross_entropy(x, labels)
        with pytest.raises(NotDifferentiableError, match="labels.*int32.*only float") as info:
            gc.grad(loss, [x, labels])
    assert info.value.site.startswith(HERE)


def test_a_dtype_the_target_cannot_compute_is_refused_when_compiling():
    """float16 is a valid tensor dtype (the reference computes it), but Numba has no float16
    arithmetic on the CPU: compile names the op and its line instead of failing in Numba."""
    with gc.Graph("half"):
        x = gc.input("x", (3,), "float16")
        y = x * 2.0  # the first float16 op
    np.testing.assert_array_equal(gc.evaluate(y, x=np.ones(3, np.float16)), [2, 2, 2])
    with pytest.raises(DTypeError, match=r"cpu target cannot compute float16.*cast to float32") as info:
        gc.compile(y, target="cpu")
    assert info.value.site.startswith(HERE + ":")


def test_compile_refuses_what_it_cannot_build():
    """Each refusal is a GraphError at the caller's line, before any pass runs."""
    with gc.Graph("one"):
        x = gc.input("x", (3,))
        out = gc.input("out", (3,))  # the CPU step's own keyword
        host = gc.input("to_host", (3,))  # the CUDA step's own keyword
    with gc.Graph("other"):
        y = gc.exp(gc.input("y", (3,)))
    cases = [([], "cpu", "non-empty list of Tensors"), ([x, "x"], "cpu", "non-empty list"),
             ([gc.exp(x), y], "cpu", "all outputs must come from one graph"),
             (out * 2.0, "cpu", "an input is named 'out'"),
             (host * 2.0, "cuda", "an input is named 'to_host'")]
    for outputs, target, message in cases:
        with pytest.raises(GraphError, match=message) as info:
            gc.compile(outputs, target=target)
        assert info.value.site.startswith(HERE + ":"), message


def test_check_grads_refuses_a_non_feed_and_an_unknown_order(rng):
    with gc.Graph("check"):
        x = gc.param("x", (3,), "float64")
        y = gc.exp(x)
        feeds = {"x": rng.standard_normal(3)}
        with pytest.raises(GraphError, match="check_grads perturbs feeds"):
            gc.check_grads(y.sum(), [y], feeds)
        with pytest.raises(ValueError, match="order must be 1 or 2"):
            gc.check_grads(y, [x], feeds, order=3)
