"""Sibling library calls (`Op.sibling_key`): a warp, its BackwardData and its BackwardMat sample
the same taps, so fusion makes them one step (`kernel.SiblingCalls`) where none depends on
another, which the CPU runs as one pass over the pixels and the CUDA target as each op's
launcher in turn. An affine warp joins through the homogeneous matrix its gradients read
(`passes/simplify/vision.py`).

The oracle is the reference interpreter on the unoptimised graph (float64 rtol 1e-10, float32
1e-5). The feeds put NaN in the image and in the upstream weights, and the matrices sample well
outside the image, so border taps, non-finite slopes and skipped terms all occur.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends.numba_cpu import library
from gradcompiler.kernel import LibraryStep, SiblingCalls
from gradcompiler.ops.shape import Concat
from gradcompiler.ops.vision import (
    WarpAffine,
    WarpPerspective,
    WarpPerspectiveBackwardData,
    WarpPerspectiveBackwardMat,
)

from cuda_support import cuda_for_tests
from oracle import assert_close

RTOL = {"float64": 1e-10, "float32": 1e-5}
SHAPE = (3, 2, 6, 7)  # NCHW


def warp_loss(dtype: str, mode: str, wrt: tuple[str, ...] = ("img", "mat"), squared: bool = False,
              shape: tuple[int, ...] = SHAPE):
    """loss = Σ warp_affine(img, mat) · r (or Σ warp² · r, whose upstream gradient reads the
    warp), and its gradients with respect to `wrt`."""
    with gc.Graph("warp"):
        img = gc.param("img", shape, dtype)
        mat = gc.param("mat", (shape[0], 2, 3), dtype)
        r = gc.input("r", shape, dtype)
        warped = gc.warp_affine(img, mat, shape[2:], border_mode=mode, border_val=0.4, format="NCHW")
        loss = ((warped * warped if squared else warped) * r).sum()
        grads = gc.grad(loss, [{"img": img, "mat": mat}[name] for name in wrt])
    return [loss, *grads]


def feeds(rng, dtype: str, shape: tuple[int, ...] = SHAPE) -> dict:
    img = rng.standard_normal(shape)
    img[1, 0, 2, 3] = np.nan
    mat = np.tile(np.eye(3)[:2], (shape[0], 1, 1)) + rng.normal(0, 0.2, (shape[0], 2, 3)) * [1, 1, 5]
    r = rng.standard_normal(shape)
    r[2, shape[1] - 1, 4, 5] = np.nan
    return {k: v.astype(dtype) for k, v in dict(img=img, mat=mat, r=r).items()}


def check(outputs, values: dict, dtype: str, target: str = "cpu"):
    step = gc.compile(outputs, target=target)
    got, want = step(**values), gc.evaluate(outputs, values)
    for k, (g, w) in enumerate(zip(got, want)):
        assert_close(g, w, rtol=RTOL[dtype], label=f"output {k}")
    return step


def library_steps(step) -> list[LibraryStep]:
    return [s for s in step.program.steps if isinstance(s, LibraryStep)]


def sibling_steps(step) -> list[LibraryStep]:
    return [s for s in library_steps(step) if isinstance(s.op, SiblingCalls)]


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's NaN arithmetic
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("mode", ["replicate", "constant", "wrap"])
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_warp_and_its_two_gradients_are_one_step(rng, monkeypatch, dtype, mode, parallel):
    if parallel:
        monkeypatch.setattr(library, "PARALLEL_MIN_WORK", 0)
    step = check(warp_loss(dtype, mode), feeds(rng, dtype), dtype)
    (joint,) = sibling_steps(step)
    assert {type(op) for op in joint.op.ops} == {WarpPerspective, WarpPerspectiveBackwardData,
                                                 WarpPerspectiveBackwardMat}
    assert len(joint.outputs) == 3 and len(set(joint.outputs)) == 3
    alone = [s for s in library_steps(step) if isinstance(s.op, (WarpAffine, WarpPerspective,
                                                                 WarpPerspectiveBackwardData,
                                                                 WarpPerspectiveBackwardMat))]
    assert not alone, "a warp call still ran on its own"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("channels", [1, 5, 9])
@pytest.mark.parametrize("mode", ["replicate", "constant"])
def test_the_joint_call_adds_any_number_of_channels(rng, monkeypatch, mode, channels):
    """The image gradient adds a pixel's channels in groups of four (`_scatter_row`): one
    channel and three of padding, a group and one, two groups and one."""
    monkeypatch.setattr(library, "PARALLEL_MIN_WORK", 0)
    shape = (3, channels, 6, 7)
    step = check(warp_loss("float64", mode, shape=shape), feeds(rng, "float64", shape), "float64")
    assert len(sibling_steps(step)) == 1


def test_the_joint_call_on_an_empty_batch(rng):
    """No matrices and no images: the joint call runs no pixel and the loss and both gradients
    are those of the reference (0 and empty arrays)."""
    shape = (0, 3, 6, 7)
    values = dict(img=np.zeros(shape), mat=np.zeros((0, 2, 3)), r=np.zeros(shape))
    step = check(warp_loss("float64", "replicate", shape=shape), values, "float64")
    assert len(sibling_steps(step)) == 1
    loss, d_img, d_mat = step(**values)
    assert loss == 0 and d_img.shape == shape and d_mat.shape == (0, 2, 3)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_a_warp_whose_gradient_reads_it_stays_apart_from_them(rng):
    """With loss = Σ warp² · r the upstream gradient is made from the warp's output: joining the
    gradients' step would be a cycle, so the warp runs first and its two gradients together."""
    step = check(warp_loss("float64", "replicate", squared=True), feeds(rng, "float64"), "float64")
    (joint,) = sibling_steps(step)
    assert {type(op) for op in joint.op.ops} == {WarpPerspectiveBackwardData, WarpPerspectiveBackwardMat}
    labels = [s.op.label for s in library_steps(step)]
    assert labels.index("WarpPerspective") < labels.index(joint.op.label)


@pytest.mark.parametrize("wrt", [("img",), ("mat",)])
def test_one_gradient_joins_the_warp(rng, wrt):
    """The matrix's gradient joins the warp in the joint kernel; the image's alone has no
    joint kernel with it, and the two calls run in turn (the values are each op's own)."""
    step = check(warp_loss("float64", "reflect", wrt), feeds(rng, "float64"), "float64")
    (joint,) = sibling_steps(step)
    gradient = WarpPerspectiveBackwardData if wrt == ("img",) else WarpPerspectiveBackwardMat
    assert {type(op) for op in joint.op.ops} == {WarpPerspective, gradient}


def test_an_affine_warp_keeps_its_op_unless_differentiated():
    """The rewrite to WarpPerspective serves only the sharing of its gradients' matrix: a warp
    that is not differentiated stays WarpAffine, and no Concat is added."""
    with gc.Graph("forward"):
        img = gc.input("img", SHAPE, "float32")
        mat = gc.input("mat", (SHAPE[0], 2, 3), "float32")
        out = gc.warp_affine(img, mat, SHAPE[2:], format="NCHW")
    step = gc.compile([out])
    assert [type(s.op) for s in library_steps(step)] == [WarpAffine]
    assert not any(isinstance(step.graph[i].op, Concat) for i in step.graph.topo_order())


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_siblings_that_depend_on_each_other_stay_apart(rng):
    """BackwardMat reading a source made from BackwardData's output cannot run with it: joining
    would be a cycle, so the two stay two calls, in order."""
    n, c, h, w = SHAPE
    with gc.Graph("dependent"):
        mat = gc.input("mat", (n, 3, 3), "float64")
        g = gc.input("g", SHAPE, "float64")
        d_src = gc.apply(WarpPerspectiveBackwardData(SHAPE, "replicate", 0.0, "NCHW"), mat, g)
        d_mat = gc.apply(WarpPerspectiveBackwardMat("replicate", 0.0, "NCHW"), gc.tanh(d_src), mat, g)
    spread = np.array([[1, 1, 4], [1, 1, 4], [0.01, 0.01, 0]])
    values = dict(mat=np.eye(3) + rng.normal(0, 0.1, (n, 3, 3)) * spread, g=rng.standard_normal(SHAPE))
    step = check([d_src, d_mat], values, "float64")
    assert not sibling_steps(step)
    labels = [s.op.label for s in library_steps(step)]
    assert labels.index("WarpPerspectiveBackwardData") < labels.index("WarpPerspectiveBackwardMat")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_the_cuda_target_runs_the_two_launchers_in_turn(rng):
    cuda_for_tests()
    step = check(warp_loss("float32", "replicate"), feeds(rng, "float32"), "float32", target="cuda")
    assert len(sibling_steps(step)) == 1
