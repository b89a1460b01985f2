"""Sibling library calls (`Op.sibling_key`): a warp's BackwardData and BackwardMat read the same
taps of the same upstream gradient, so fusion makes them one step (`kernel.SiblingCalls`), which
the CPU runs as one pass over the pixels and the CUDA target as its two launchers in turn.

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
from gradcompiler.ops.vision import WarpPerspectiveBackwardData, WarpPerspectiveBackwardMat

from cuda_support import cuda_for_tests
from oracle import assert_close

RTOL = {"float64": 1e-10, "float32": 1e-5}
SHAPE = (3, 2, 6, 7)  # NCHW


def warp_loss(dtype: str, mode: str, wrt: tuple[str, ...] = ("img", "mat")):
    """loss = Σ warp_affine(img, mat) · r, and its gradients with respect to `wrt`."""
    with gc.Graph("warp"):
        img = gc.param("img", SHAPE, dtype)
        mat = gc.param("mat", (SHAPE[0], 2, 3), dtype)
        r = gc.input("r", SHAPE, dtype)
        loss = (gc.warp_affine(img, mat, SHAPE[2:], border_mode=mode, border_val=0.4,
                                format="NCHW") * r).sum()
        grads = gc.grad(loss, [{"img": img, "mat": mat}[name] for name in wrt])
    return [loss, *grads]


def feeds(rng, dtype: str) -> dict:
    img = rng.standard_normal(SHAPE)
    img[1, 0, 2, 3] = np.nan
    mat = np.tile(np.eye(3)[:2], (SHAPE[0], 1, 1)) + rng.normal(0, 0.2, (SHAPE[0], 2, 3)) * [1, 1, 5]
    r = rng.standard_normal(SHAPE)
    r[2, 1, 4, 5] = np.nan
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
def test_a_warps_two_gradients_are_one_step(rng, monkeypatch, dtype, mode, parallel):
    if parallel:
        monkeypatch.setattr(library, "PARALLEL_MIN_WORK", 0)
    step = check(warp_loss(dtype, mode), feeds(rng, dtype), dtype)
    (joint,) = sibling_steps(step)
    assert {type(op) for op in joint.op.ops} == {WarpPerspectiveBackwardData, WarpPerspectiveBackwardMat}
    assert len(joint.outputs) == 2 and len(set(joint.outputs)) == 2
    alone = [s for s in library_steps(step)
             if isinstance(s.op, (WarpPerspectiveBackwardData, WarpPerspectiveBackwardMat))]
    assert not alone, "a gradient was still made by a call of its own"


@pytest.mark.parametrize("wrt", [("img",), ("mat",)])
def test_one_gradient_alone_stays_a_plain_call(rng, wrt):
    step = check(warp_loss("float64", "reflect", wrt), feeds(rng, "float64"), "float64")
    assert not sibling_steps(step)


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
