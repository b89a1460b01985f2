"""Random-graph fuzzing (issue 8, part 3).

Random well-typed graphs over every op (`graph_strategies.fuzz_cases`) are
differentiated and checked two ways:

* the reference gradients against float64 central differences
  (`gc.check_grads`), which needs no compiler and is cheap, so `make test`
  runs a few hundred graphs;
* the compiled forward values and gradients against the reference
  interpreter on the same graph (same dtype), which pays Numba's compile
  time per distinct kernel, so `make test` runs fewer.

`make fuzz` (HYPOTHESIS_PROFILE=fuzz) runs GRADCOMPILER_FUZZ_EXAMPLES
graphs through each, from a seed it prints (`make fuzz FUZZ_SEED=...` replays a
run; a failing case is also kept in hypothesis's example database under the
ignored `.hypothesis/`, and replayed first on the next run).
GRADCOMPILER_FUZZ_SECONDS bounds the run's time (CI runs a few minutes of fresh
graphs after the suite). Every test counts the graphs it checked, and the module
prints the totals at the end (`-s` shows them).
"""

from __future__ import annotations

import collections
import os
import time
import zlib
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given, settings

import gradcompiler as gc
from gradcompiler.gradcheck import as_float64
from gradcompiler.ops import all_op_classes
from gradcompiler.ops.elemwise import MODES
from gradcompiler.ops.source import Placeholder
from gradcompiler.reference import run_graph

from graph_strategies import DRAWN_MODES, RECIPES, fuzz_cases
from helpers import break_elemwise_rule
from oracle import assert_close

FUZZ = os.environ.get("HYPOTHESIS_PROFILE") == "fuzz"
FUZZ_EXAMPLES = int(os.environ.get("GRADCOMPILER_FUZZ_EXAMPLES", "2000"))
REFERENCE_EXAMPLES = FUZZ_EXAMPLES if FUZZ else 250
PER_RECIPE_EXAMPLES = 6
COMPILED_EXAMPLES = {"cpu": FUZZ_EXAMPLES if FUZZ else 40, "cuda": FUZZ_EXAMPLES // 2 if FUZZ else 20}
"""Numba compiles every new CPU kernel (about half a second each), so the compiled share of
`make test` is kept small; the CUDA simulator compiles nothing but runs every GPU thread
as a Python thread."""
FLOAT32_EPS = float(np.finfo(np.float32).eps)
ROUNDING = 8
"""Compiled float32 values may sit this many times further from the float32 reference than the
reference's worst element sits from a float64 run of the same graph."""
ULPS = 64
"""...plus this many ulps of the value and of the output's largest finite magnitude. The CPU
backend's float32 exp, log, tanh... are its own polynomial approximations a few ulp from
numpy's, and the compiled kernels sum in another order and contract a·b + c into fused
multiply-adds; where a graph cancels (a·b + c·d of terms far larger than the result), that
moves a value by tens of its ulps even where the float32 reference happens to be exact: two
drawn cases measured 21 ulps (log1p of a squared, cancelling multiply-add) and 28 ulps (a
matmul of cancelling products). A gradient of 1e-5 beside values of order 1 that is zero or
10× wrong still fails."""
TOLERANCE = {"float32": (ULPS * FLOAT32_EPS, ULPS * FLOAT32_EPS), "float64": (1e-8, 1e-10)}
"""(rtol, atol relative to the output's largest finite magnitude)."""

CHECKED: collections.Counter = collections.Counter()
UNCHECKED: collections.Counter = collections.Counter()


class TimeBudget:
    """GRADCOMPILER_FUZZ_SECONDS (0: no limit) shared evenly by the tests that draw graphs.

    Hypothesis has no time limit of its own, so once a test has spent its share, the cases
    it still draws are counted as unchecked and not compiled (drawing one costs
    milliseconds); the summary line says how many.
    """

    DRAWING_TESTS = 6  # reference, per-recipe (all recipes together), compiled x2, non-finite x2

    def __init__(self, seconds: float):
        self.share = seconds / self.DRAWING_TESTS
        self.started: dict[str, float] = {}

    def spent(self, test: str) -> bool:
        if self.share <= 0:
            return False
        start = self.started.setdefault(test, time.monotonic())
        if time.monotonic() - start > self.share:
            UNCHECKED[test] += 1
            return True
        return False


BUDGET = TimeBudget(float(os.environ.get("GRADCOMPILER_FUZZ_SECONDS", "0")))

MIN_COMPILED = int(os.environ.get("GRADCOMPILER_FUZZ_MIN_COMPILED", "0"))
"""Graphs compiled for the CPU and checked below which the run fails (`make fuzz
FUZZ_MIN_COMPILED=N`): a time-bounded run on a slow machine must not pass having compiled
almost nothing."""


@pytest.fixture(scope="module", autouse=True)
def report_counts(request):
    yield
    total = sum(CHECKED.values())
    parts = ", ".join(f"{name} {count}" for name, count in sorted(CHECKED.items()))
    seed = request.config.getoption("hypothesis_seed", None)
    drawn = f"seed {seed}" if seed is not None else "no fixed seed"
    unchecked = sum(UNCHECKED.values())
    late = f"; {unchecked} drawn after the time budget, not checked" if unchecked else ""
    print(f"\nfuzz ({drawn}): {total} random graphs checked with no mismatch ({parts}){late}")
    compiled = CHECKED["compiled-cpu/reference"]
    assert compiled >= MIN_COMPILED, (f"only {compiled} random graphs were compiled for the CPU and checked, "
                                      f"fewer than GRADCOMPILER_FUZZ_MIN_COMPILED={MIN_COMPILED}")


def assert_close_to_finite_differences(report) -> None:
    """check_grads' relative test, with an absolute floor for tiny directional derivatives.

    A central difference of f with step 1e-6 carries a round-off error of
    about |f|·1e-10, so a derivative of 1e-12 next to ones of order 1 is
    compared against that floor instead of against itself.
    """
    scale = max([1.0] + [max(abs(r.analytic), abs(r.numeric)) for r in report.results])
    def tolerance(r):
        return 1e-6 * max(abs(r.analytic), abs(r.numeric)) + 1e-8 * scale

    bad = [r for r in report.results if abs(r.analytic - r.numeric) > tolerance(r)]
    assert not bad, str(report)


def check_against_finite_differences(case) -> None:
    # the recipes' custom gradients are the true ones: they are checked like any rule
    report = gc.check_grads(case.outputs, case.wrt, case.feeds, raise_on_failure=False,
                            custom_gradients="check")
    assert_close_to_finite_differences(report)


def test_the_criterion_catches_a_wrong_rule_on_small_derivatives(monkeypatch, rng):
    """The absolute floor must not swallow a wrong rule: EXP's gradient 1% off, on a graph
    whose derivatives are of order 1e-5, fails the criterion the right rule passes."""
    with gc.Graph("small_derivatives"):
        x = gc.param("x", (2, 3), "float64")
        case = SimpleNamespace(outputs=[gc.exp(x) * 1e-5], wrt=[x],
                               feeds={"x": rng.standard_normal((2, 3))})
        check_against_finite_differences(case)
        break_elemwise_rule(monkeypatch, "EXP", 1.01)
        with pytest.raises(AssertionError, match="gradient check, order 1"):
            check_against_finite_differences(case)


@settings(max_examples=REFERENCE_EXAMPLES)
@given(fuzz_cases(max_steps=8))
def test_reference_gradients_match_finite_differences(case):
    if BUDGET.spent("reference"):
        return
    check_against_finite_differences(case)
    CHECKED["reference/finite-differences"] += 1


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_each_recipe_against_finite_differences(recipe):
    """Every op family gets graphs of its own, whatever the mixed test happened to draw."""

    @settings(max_examples=PER_RECIPE_EXAMPLES)
    @given(fuzz_cases(max_steps=3, recipes=(recipe,)))
    def check(case):
        if BUDGET.spent("per-recipe"):
            return
        check_against_finite_differences(case)
        CHECKED["per-recipe/finite-differences"] += 1

    check()


def float64_distance(graph, outputs, feeds, expected) -> list[float | None]:
    """For each float output, ROUNDING × the largest distance from a float64 run of the same
    graph of the float32 reference (float32 outputs) or of a float64 run with a rounding's
    worth of error added to every value in its own dtype (`perturbed_runs`): how much rounding
    the graph amplifies in it. One figure per output, not per element: every element goes
    through the same arithmetic, and where it cancels (a·b + c·d of terms far larger than the
    result) another order of the same operations lands as far from the exact value as the
    reference's worst element does, even where the reference happened to land on it. The
    perturbed runs cover the cancellations the reference computes exactly: the gradient of a
    softmax's sum is s·(1 − Σs), zero for the reference, the rounding of Σs in another order;
    a filter gradient that sums a symmetric ramp is exactly 0 in the reference and 4 ulps of
    the ramp compiled. None for the other outputs."""
    wide, mapping = as_float64(graph)
    wide_feeds = {k: v.astype(np.float64) if v.dtype.kind == "f" else v for k, v in feeds.items()}
    wide_outputs = [mapping[t.id] for t in outputs]
    exact = run_graph(wide, wide_outputs, wide_feeds)
    half_ulp = {mapping[i]: float(np.finfo(node.type.dtype).eps) / 2
                for i, node in graph.nodes.items() if node.type.dtype.kind == "f"}
    rng = np.random.default_rng(zlib.crc32(repr(feeds).encode()))
    runs = perturbed_runs(wide, wide_outputs, wide_feeds, half_ulp, rng)
    distances = []
    for index, (want, wide_want) in enumerate(zip(expected, exact)):
        if want.dtype.kind != "f":
            distances.append(None)
            continue
        with np.errstate(invalid="ignore"):
            distance = np.zeros(want.shape)
            for run in runs:
                distance = np.fmax(distance, np.abs(run[index] - wide_want))
            if want.dtype == np.float32:
                distance = np.fmax(distance, np.abs(want - wide_want))
        distances.append(ROUNDING * float(np.where(np.isfinite(distance), distance, 0.0).max(initial=0.0)))
    return distances


def perturbed_runs(graph, outputs, feeds, half_ulp: dict[int, float], rng) -> list[list[np.ndarray]]:
    """Three `run_graph`s of a float64 graph in which the value of each node of `half_ulp`
    moves by that much relative error as it is computed (the rounding of the dtype the node
    has in the original graph): every value up, every value down, and each by a random
    fraction of it. A single random draw is no bound where the output cancels: the 18 errors
    of a sum that is exactly 0 cancel too, often enough to fail a CI run now and then (a
    filter gradient did), whereas moving every term the same way adds their errors.

    The move is computed so that it survives rounding: a float64 value moved by half its own
    ulp rounds back to itself, so it takes at least one ulp (`np.nextafter`)."""
    needed = graph.ancestors(outputs)
    runs = []
    for direction in (1.0, -1.0, None):
        values: dict[int, np.ndarray] = {}
        for node_id in graph.topo_order(needed):
            node = graph[node_id]
            if isinstance(node.op, Placeholder):
                values[node_id] = np.asarray(feeds[node.op.feed_name])
                continue
            value = np.asarray(node.op.reference(*(values[i] for i in node.inputs)))
            if node_id in half_ulp and value.dtype.kind == "f":
                fraction = rng.uniform(-1.0, 1.0, value.shape) if direction is None else direction
                value = moved(value, fraction * half_ulp[node_id])
            values[node_id] = value
        runs.append([values[o] for o in outputs])
    return runs


def moved(value: np.ndarray, relative: np.ndarray | float) -> np.ndarray:
    """`value` × (1 + `relative`), but never rounded back onto `value` where `relative` ≠ 0:
    a move below the value's own ulp takes the neighbouring float in its direction."""
    with np.errstate(invalid="ignore", over="ignore"):
        target = value * (1 + relative)
        toward = np.where(np.sign(value * relative) >= 0, np.inf, -np.inf)
        neighbour = np.nextafter(value, toward)
        stuck = (target == value) & (relative != 0) & (value != 0) & np.isfinite(value)
        return np.where(stuck, neighbour, target)


def assert_matches_reference(case, outputs, feeds, got) -> None:
    """Every output equals the reference interpreter's: integers exactly, special values at the
    same places, floats to TOLERANCE plus the rounding the graph amplifies (`float64_distance`)."""
    expected = gc.evaluate(outputs, feeds)
    distances = float64_distance(case.graph, outputs, feeds, expected)
    for tensor, want, value, distance in zip(outputs, expected, got, distances):
        rtol, atol = TOLERANCE.get(want.dtype.name, (0.0, 0.0))
        assert_close(np.asarray(value), want, rtol=rtol, scaled_atol=atol, tolerance=distance,
                     label=f"%{tensor.id} {tensor.node.op.label}")


def run_compiled(case, target: str) -> None:
    """Compile the case's outputs and the gradient of their sum; compare with the reference."""
    grads = gc.grad(sum(o.sum() for o in case.outputs), case.wrt)
    outputs = [*case.outputs, *grads]
    step = gc.compile(outputs, target=target)
    feeds_before = {name: value.copy() for name, value in case.feeds.items()}
    got = step(**case.feeds, to_host=True) if target == "cuda" else step(**case.feeds)
    for name, value in case.feeds.items():
        np.testing.assert_array_equal(value, feeds_before[name], err_msg=f"feed {name} was written")
    assert_matches_reference(case, outputs, case.feeds, got)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_compiled_values_and_gradients_match_the_reference(target):

    @settings(max_examples=COMPILED_EXAMPLES[target])
    @given(fuzz_cases(max_steps=8))
    def check(case):
        if BUDGET.spent(f"compiled-{target}"):
            return
        run_compiled(case, target)
        CHECKED[f"compiled-{target}/reference"] += 1

    check()


SPECIAL_VALUES = np.array([np.nan, np.inf, -np.inf, -0.0])
NON_FINITE_EXAMPLES = {"cpu": FUZZ_EXAMPLES // 2 if FUZZ else 30, "cuda": FUZZ_EXAMPLES // 4 if FUZZ else 10}


def with_special_values(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A copy of `feeds` with about one float element in five replaced by NaN, ±inf or −0
    (the positions and values drawn from the feeds' own contents, so a case is reproducible)."""
    result = {}
    for name, value in feeds.items():
        value = np.array(value, copy=True)
        if value.dtype.kind == "f" and value.size:
            rng = np.random.default_rng(zlib.crc32(name.encode() + value.tobytes()))
            flat = value.reshape(-1)
            chosen = rng.choice(flat.size, size=max(1, flat.size // 5), replace=False)
            flat[chosen] = rng.choice(SPECIAL_VALUES, size=chosen.size).astype(value.dtype)
        result[name] = value
    return result


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's inf - inf, 0 * inf, ...
@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_non_finite_feeds_give_the_reference_nan_and_inf(target):
    """Silent garbage hides in the non-finite cases: a compare-and-select that drops a NaN, an
    inf·0 in a formula whose limit is finite. Random graphs on feeds salted with NaN, ±inf
    and −0, forward values only, against the reference. Derandomized under make test (the
    same graphs every run); make fuzz draws new ones."""

    salted = collections.Counter()

    @settings(max_examples=NON_FINITE_EXAMPLES[target], derandomize=not FUZZ)
    @given(fuzz_cases(max_steps=6))
    def check(case):
        if BUDGET.spent(f"non-finite-{target}"):
            return
        feeds = with_special_values(case.feeds)
        want = gc.evaluate(case.outputs, feeds)
        salted["cases"] += 1
        salted["non-finite"] += any(not np.isfinite(w).all() for w in want)
        step = gc.compile(case.outputs, target=target)
        got = step(**feeds, to_host=True) if target == "cuda" else step(**feeds)
        assert_matches_reference(case, case.outputs, feeds, got if isinstance(got, list) else [got])
        CHECKED[f"non-finite-{target}/reference"] += 1

    check()
    # a share of a handful is chance, not a property of the generator: a time budget that
    # ends the run after a case or two says nothing (make test checks 10 and 30 cases)
    if salted["cases"] >= min(NON_FINITE_EXAMPLES.values()):
        assert salted["non-finite"] * 3 >= salted["cases"], f"too few cases reached a non-finite output: {salted}"


def test_the_recipes_reach_every_op():
    """The strategy really covers the IR: every op class appears in some case, in its
    gradient or in its JVP (forward mode transposes the backward, so it builds the
    transposes of the backward ops: WarpPerspectiveTangentMat), and the recipes draw every
    Elemwise mode (a new mode must join them). The examples are derandomized, so coverage
    is a fixed property of the strategy, not luck."""
    seen: set[str] = set()
    rng = np.random.default_rng(0)

    def record(case):
        gc.grad(sum(o.sum() for o in case.outputs), case.wrt)
        directions = [rng.standard_normal(w.shape).astype(w.dtype) for w in case.wrt]
        gc.jvp(case.outputs, case.wrt, directions)
        for node in case.graph.nodes.values():
            seen.add(type(node.op).__name__)

    for recipe in sorted(RECIPES):
        cases = fuzz_cases(max_steps=2, recipes=(recipe,))
        settings(max_examples=20, database=None, derandomize=True)(given(cases)(record))()
    missing = {c.__name__ for c in all_op_classes()} - seen
    assert not missing, f"no fuzz case builds {sorted(missing)}"
    assert DRAWN_MODES == set(MODES), sorted(set(MODES) ^ DRAWN_MODES)


def test_the_float32_bound_catches_a_small_gradient_that_is_zero_or_ten_times_wrong():
    """The bound the compiled float32 checks use (ULPS) leaves room for contraction and
    reassociation, not for a wrong rule: a gradient of 1e-5 beside values of order 1 that is
    zero or 10× too large fails it."""
    rtol, scaled_atol = TOLERANCE["float32"]
    want = np.array([1.0, -0.5, 1e-5], np.float32)
    assert_close(want * np.float32(1 + 2 * FLOAT32_EPS), want, rtol=rtol, scaled_atol=scaled_atol)
    for wrong in (0.0, 1e-4):
        with pytest.raises(AssertionError, match="out of tolerance"):
            assert_close(np.array([1.0, -0.5, wrong], np.float32), want, rtol=rtol, scaled_atol=scaled_atol)


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_the_rounding_bound_covers_an_output_the_reference_cancels_to_zero(target):
    """The case CI's fuzz drew (seed 221720617464937054525986735177907191092): a float64
    filter gradient that sums a symmetric ramp, exactly 0 in the reference at every element,
    −8.9e-16 compiled (4 ulps of its terms, summed in another order). A scale taken from the
    output itself is 0 there, and moving each value by half its own float64 ulp rounded back
    onto it, so the bound was 0; the perturbed runs bound it by the rounding of its terms,
    and a gradient 1e-12 off (still tiny beside them) fails."""
    with gc.Graph("cancelling") as graph:
        p = gc.param("p", (2, 1, 3, 3), "float64")
        w = gc.param("w", (2, 1, 2, 1), "float64")
        image = p + gc.constant(np.linspace(-1.0, 1.0, 18).reshape(2, 1, 3, 3))
        out = gc.conv2d(image, w, padding=1)
    feeds = {"p": np.zeros((2, 1, 3, 3)), "w": np.random.default_rng(5).standard_normal((2, 1, 2, 1))}
    case = SimpleNamespace(graph=graph, outputs=[out], wrt=[w], feeds=feeds)
    (filter_gradient,) = gc.grad(out.sum(), [w])
    (want,) = gc.evaluate([filter_gradient], feeds)
    assert not want.any()
    (bound,) = float64_distance(graph, [filter_gradient], feeds, [want])
    assert 1e-15 < bound < 1e-12
    run_compiled(case, target)
    with pytest.raises(AssertionError, match="out of tolerance"):
        assert_matches_reference(case, [filter_gradient], feeds, [want + 1e-12])
