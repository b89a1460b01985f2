"""Forward mode on every op: `gc.jvp` against float64 central differences, and the
adjoint identity ⟨u, J·v⟩ = ⟨Jᵀ·u, v⟩ against reverse mode.

The cases are the fuzz recipes' random graphs, a few per recipe and derandomized;
`test_fuzz_random_graphs.test_the_recipes_reach_every_op` shows that those recipes build
every op class (and, through their gradients, every backward op), and each case draws
which of its params, hence which op inputs, are differentiated. The graphs are widened to
float64 first (`check_grads` does the same), so the comparison measures the rules, not
float32 rounding.
"""

from __future__ import annotations

import zlib

import numpy as np
import pytest
from hypothesis import given, settings

import gradcompiler as gc
from gradcompiler.frontend.tensor import Tensor
from gradcompiler.gradcheck import as_float64

from graph_strategies import RECIPES, FuzzCase, fuzz_cases
from helpers import break_elemwise_rule

EXAMPLES_PER_RECIPE = 4


def _widened(case):
    wide, mapping = as_float64(case.graph)
    feeds = {k: np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else np.asarray(v)
             for k, v in case.feeds.items()}
    outputs = [Tensor(wide, mapping[o.id]) for o in case.outputs]
    wrt = [Tensor(wide, mapping[w.id]) for w in case.wrt]
    return outputs, wrt, feeds


def _directional_difference(outputs, wrt, feeds, tangents, eps=1e-6):
    """(f(w + h·v) − f(w − h·v)) / 2h for every output, h scaled to the params' size."""
    scale = max([1.0] + [float(np.abs(feeds[w.name]).max(initial=0.0)) for w in wrt])
    h = eps * scale
    plus = {**feeds, **{w.name: feeds[w.name] + h * v for w, v in zip(wrt, tangents)}}
    minus = {**feeds, **{w.name: feeds[w.name] - h * v for w, v in zip(wrt, tangents)}}
    return [(p - m) / (2 * h) for p, m in zip(gc.evaluate(outputs, plus), gc.evaluate(outputs, minus))]


def check_forward_mode(case) -> bool:
    """Check the case; False when none of its params has a forward direction to check."""
    outputs, wrt, feeds = _widened(case)
    if not wrt:
        return False
    rng = np.random.default_rng(zlib.crc32(repr(case).encode()))
    tangents = [rng.standard_normal(w.shape) for w in wrt]
    jvps = gc.jvp(outputs, wrt, tangents)
    analytic = gc.evaluate(jvps, feeds)
    numeric = _directional_difference(outputs, wrt, feeds, tangents)
    values = gc.evaluate(outputs, feeds)
    for out, a, n, value in zip(outputs, analytic, numeric, values):
        assert a.shape == n.shape == out.shape
        # a central difference carries about |f|·1e-10 of round-off: the floor follows it
        floor = 1e-7 * max(1.0, float(np.abs(value).max(initial=0.0)), float(np.abs(n).max(initial=0.0)))
        bad = np.abs(a - n) > 1e-5 * np.abs(n) + floor
        assert not bad.any(), (f"jvp of %{out.id} {out.node.op.label}: analytic {a[bad][:4]} "
                               f"numeric {n[bad][:4]}\n{case!r}")
    cotangents = [rng.standard_normal(o.shape) for o in outputs]
    transposed = gc.vjp(outputs, wrt, [gc.constant(u, "float64", outputs[0].graph) for u in cotangents],
                        disconnected="zero")
    transposed = gc.evaluate(transposed if isinstance(transposed, list) else [transposed], feeds)
    forward = sum(float(np.sum(u * a)) for u, a in zip(cotangents, analytic))
    reverse = sum(float(np.sum(g * v)) for g, v in zip(transposed, tangents))
    magnitude = sum(float(np.sum(np.abs(u * a))) for u, a in zip(cotangents, analytic)) + 1e-300
    assert abs(forward - reverse) <= 1e-9 * magnitude, (forward, reverse, case)
    return True


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_jvp_of_every_op_matches_finite_differences_and_the_vjp(recipe):
    checked = []

    @settings(max_examples=EXAMPLES_PER_RECIPE, derandomize=True, database=None)
    @given(fuzz_cases(max_steps=3, recipes=(recipe,)))
    def check(case):
        checked.append(check_forward_mode(case))

    check()
    assert any(checked), f"no {recipe} case had a direction to check"


@settings(max_examples=30, derandomize=True, database=None)
@given(fuzz_cases(max_steps=6))
def test_jvp_of_mixed_graphs(case):
    check_forward_mode(case)


@pytest.mark.parametrize("border", ["replicate", "constant", "wrap"])
@pytest.mark.parametrize("kind", ["affine", "perspective"])
def test_jvp_along_a_warp_matrix(border, kind):
    """The direction the fuzz recipes reach only when they draw the matrix, pinned: along the
    matrix alone and together with the image (mat_idx for the perspective warp). The
    matrices sample off integer coordinates, where the warp is smooth."""
    rng = np.random.default_rng(5)
    mat = np.array([[[0.93, 0.11, 0.41], [-0.06, 1.08, 0.37], [0.012, -0.009, 1.03]],
                    [[1.07, -0.13, -0.62], [0.04, 0.91, 0.29], [-0.015, 0.011, 0.98]]])
    with gc.Graph("warp_jvp") as graph:
        src = gc.param("src", (2, 5, 6, 2), "float64")
        if kind == "affine":
            m = gc.param("mat", (2, 2, 3), "float64")
            out = gc.warp_affine(src, m, (4, 3), border, 0.4)
            feeds = dict(mat=mat[:, :2])
        else:
            m, idx = gc.param("mat", (3, 3, 3), "float64"), gc.input("idx", (3,), "int32")
            out = gc.warp_perspective(src, m, (4, 3), idx, border, 0.4, "NHWC")
            feeds = dict(mat=np.concatenate([mat, mat[:1] + 0.02]),
                         idx=np.array([1, 0, 1], np.int32))
    feeds["src"] = rng.standard_normal((2, 5, 6, 2))
    for wrt in ([m], [src, m]):
        assert check_forward_mode(FuzzCase(graph, [out * out], wrt, feeds, ["warp"]))


def _tanh_case() -> FuzzCase:
    with gc.Graph("tanh") as graph:
        x = gc.param("x", (2, 3), "float64")
        y = gc.tanh(x * 0.7)
    feeds = {"x": np.random.default_rng(3).standard_normal((2, 3))}
    return FuzzCase(graph, [y], [x], feeds, ["unary"])


def test_a_wrong_rule_fails_the_forward_mode_check(monkeypatch):
    """The transposed VJP inherits a rule's error, which only finite differences can see (the
    adjoint identity holds for any rule): a TANH rule 1% off must fail the check."""
    assert check_forward_mode(_tanh_case())
    break_elemwise_rule(monkeypatch, "TANH", 1.01)
    with pytest.raises(AssertionError, match="jvp of"):
        check_forward_mode(_tanh_case())
