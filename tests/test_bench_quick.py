"""The suite end to end in quick mode: `run_suite` on bcast_reduce writes a
JSON document with every documented field, numbers finite and positive, and
the Markdown and PNG writers produce their files."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest

from gradcompiler.bench import report, suite

TIMING_KEYS = {"median_s", "min_s", "max_s", "steps", "warmup", "max_rel_error_vs_numpy", "tolerance",
               "correct"}


def _positive(value) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value) and value > 0


@pytest.fixture(scope="module")
def quick_result(tmp_path_factory):
    cache = tmp_path_factory.mktemp("kernel-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("GRADCOMPILER_CACHE_DIR", str(cache))
        result = suite.run_suite(["bcast_reduce"], target="cpu", quick=True, log=None)
    path = tmp_path_factory.mktemp("bench") / "bench.json"
    report.write_json(result, path)
    return json.loads(path.read_text())


def test_document_has_every_top_level_field(quick_result):
    assert set(quick_result) == {"schema", "created", "target", "quick", "size", "steps", "warmup",
                                 "environment", "machine", "peers", "workloads"}
    assert quick_result["schema"] == suite.SCHEMA
    assert quick_result["target"] == "cpu" and quick_result["quick"] is True
    assert quick_result["size"] == "tiny"
    assert quick_result["steps"] == suite.QUICK_STEPS and quick_result["warmup"] == suite.QUICK_WARMUP
    machine = quick_result["machine"]
    for key in ("bandwidth_gb_s", "sgemm_gflop_s", "stream_elements", "gemm_n", "threads"):
        assert _positive(machine[key]), key
    assert quick_result["peers"]["numpy_manual"] == {"available": True, "note": ""}
    for name, peer in quick_result["peers"].items():
        assert peer["available"] or peer["note"], name


def test_workload_entry_is_complete_and_correct(quick_result):
    (entry,) = quick_result["workloads"]
    assert entry["name"] == "bcast_reduce" and entry["bound"] == "memory"
    assert entry["dims"] == {"rows": 5, "cols": 7}
    # feeds x, b, w read once; loss, dx, db, dw written once
    assert entry["min_bytes"] == 4 * (5 * 7 + 7 + 7) + 4 * (1 + 5 * 7 + 7 + 7)
    assert entry["flops"] == 0
    assert _positive(entry["floor_s"])
    compiled = entry["compiled"]
    assert compiled["status"] == "ok", compiled.get("error")
    assert TIMING_KEYS <= set(compiled)
    for key in ("median_s", "min_s", "max_s"):
        assert _positive(compiled[key]), key
    assert compiled["min_s"] <= compiled["median_s"] <= compiled["max_s"]
    assert compiled["correct"] is True
    assert 0 <= compiled["max_rel_error_vs_numpy"] <= suite.TOLERANCE
    numpy_peer = entry["peers"]["numpy_manual"]
    # the reference is the numpy step in float64: its float32 run differs by rounding alone
    assert numpy_peer["status"] == "ok" and 0 < numpy_peer["max_rel_error_vs_numpy"] < 1e-5
    assert numpy_peer["correct"] is True and numpy_peer["tolerance"] == suite.TOLERANCE
    assert set(entry["ratio"]) == {p for p, m in entry["peers"].items() if m["status"] == "ok"}
    for peer, ratio in entry["ratio"].items():
        assert ratio == pytest.approx(entry["peers"][peer]["median_s"] / compiled["median_s"])
    for name, measured in entry["peers"].items():
        if not quick_result["peers"][name]["available"]:
            assert measured["status"] == "skipped" and measured["note"]
    reach = entry["achieved"]
    assert reach["unit"] == "GB/s"
    assert reach["rate"] == pytest.approx(entry["min_bytes"] / compiled["median_s"] / 1e9)
    assert reach["fraction"] == pytest.approx(reach["rate"] / entry["limits"]["bandwidth_gb_s"])


def test_limits_are_the_higher_of_those_measured_around_the_step(quick_result):
    """Each workload is held against the machine's figures of its own minute: the higher of
    the two measured just before and just after its step was timed, both kept; the floor
    and the fraction use them."""
    (entry,) = quick_result["workloads"]
    limits = entry["limits"]
    for key in ("bandwidth_gb_s", "sgemm_gflop_s"):
        around = (limits["before"][key], limits["after"][key])
        assert all(_positive(v) for v in around), key
        assert limits[key] == max(around), key
    assert entry["floor_s"] == pytest.approx(entry["min_bytes"] / (limits["bandwidth_gb_s"] * 1e9))
    assert entry["achieved"]["limit"] == limits["bandwidth_gb_s"]


def test_adjacent_limits_take_each_figure_from_the_higher_measurement():
    """A figure can be higher before the step and the other after it: each is taken alone."""
    from gradcompiler.bench.machine import MachineLimits

    before = MachineLimits(85.0, 400.0, 1, 1, 2)
    after = MachineLimits(46.0, 470.0, 1, 1, 2)
    limits = suite.adjacent_limits(before, after)
    assert (limits["bandwidth_gb_s"], limits["sgemm_gflop_s"]) == (85.0, 470.0)
    assert limits["before"] == {"bandwidth_gb_s": 85.0, "sgemm_gflop_s": 400.0}
    assert limits["after"] == {"bandwidth_gb_s": 46.0, "sgemm_gflop_s": 470.0}
    unmeasured = suite.adjacent_limits(MachineLimits(50.0, math.nan, 1, 1, 2), MachineLimits(47.0, 480.0, 1, 1, 2))
    assert unmeasured["sgemm_gflop_s"] == 480.0
    neither = suite.adjacent_limits(MachineLimits(50.0, math.nan, 1, 1, 2), MachineLimits(47.0, math.nan, 1, 1, 2))
    assert math.isnan(neither["sgemm_gflop_s"]) and neither["bandwidth_gb_s"] == 50.0


def test_first_call_cold_and_warm(quick_result):
    first = quick_result["workloads"][0]["first_call"]
    assert first["status"] == "ok", first.get("error")
    assert _positive(first["cold_s"]) and _positive(first["warm_s"])
    for run in (first["cold"], first["warm"]):
        assert set(run) == {"seconds", "build_s", "compile_s", "first_run_s"}
        assert all(_positive(v) for v in run.values())


def test_markdown_and_plot(quick_result, tmp_path):
    md, png = tmp_path / "bench.md", tmp_path / "bench.png"
    report.write_markdown(quick_result, md)
    report.write_plot(quick_result, png)
    text = md.read_text()
    header, rule, row = text.splitlines()[:3]
    assert "gradcompiler" in header and "numpy" in header
    assert row.startswith("| bcast_reduce |") and row.count("|") == header.count("|")
    assert "Quick run" in text
    limits = quick_result["workloads"][0]["limits"]
    assert f"{limits['bandwidth_gb_s']:.0f} GB/s" in text.split("Each floor and fraction")[1]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_timer_counts_every_step():
    calls = []
    timing = suite.time_calls(lambda: calls.append(1), steps=7, warmup=3)
    assert len(calls) == 10 and timing["steps"] == 7 and timing["warmup"] == 3
    assert timing["min_s"] <= timing["median_s"] <= timing["max_s"]


def test_alternated_timer_takes_the_contenders_in_turn():
    """Contenders compared by a ratio (the memory budgets' steps) are timed one call of
    each per round, so that the machine's drift falls on both alike."""
    calls = []
    timings = suite.time_alternated([lambda: calls.append("a"), lambda: calls.append("b")],
                                    steps=4, warmup=2)
    assert calls == ["a", "b"] * 6
    assert [t["steps"] for t in timings] == [4, 4] and [t["warmup"] for t in timings] == [2, 2]


def test_a_budget_step_failing_while_timed_is_recorded_and_the_suite_goes_on(monkeypatch):
    """The budgets' steps are timed together: an error in that timing is each one's failure,
    next to its planned peak, not an exception out of the suite."""
    remat = SimpleNamespace(default_peak=100, recomputed=[1], segments=2)
    step = SimpleNamespace(executable=SimpleNamespace(context=SimpleNamespace(remat=remat),
                                                      memory=SimpleNamespace(peak_bytes=40)))
    monkeypatch.setattr(suite, "compile_step", lambda *args, **kwargs: step)

    def run():
        raise RuntimeError("worker lost")

    monkeypatch.setattr(suite, "_checked_runner", lambda *args: (run, {"correct": True}))
    measured = suite.measure_budgets(SimpleNamespace(name="gpt"), {}, [], "cpu", steps=2, warmup=0)
    assert list(measured) == [str(b) for b in suite.BUDGETS]
    for entry in measured.values():
        assert entry["status"] == "failed" and "worker lost" in entry["error"]
        assert entry["planned_peak_bytes"] == 40 and entry["peak_fraction"] == 0.4


def test_unknown_names_are_rejected():
    with pytest.raises(ValueError, match="unknown workload"):
        suite.run_suite(["nope"], quick=True, log=None)
    with pytest.raises(ValueError, match="unknown target"):
        suite.run_suite(["bcast_reduce"], target="tpu", quick=True, log=None)
    with pytest.raises(ValueError, match="unknown peer"):
        suite.run_suite(["bcast_reduce"], quick=True, peers=["matlab"], log=None)


def test_a_wrong_step_is_reported_as_wrong(monkeypatch):
    """The oracle check bites: a step that returns the numpy outputs scaled is flagged."""
    from gradcompiler.bench import manual

    def wrong(work, target):
        return lambda **feeds: [np.asarray(v) * 1.01 for v in manual.STEPS[work.name](feeds)]

    monkeypatch.setattr(suite, "compile_step", wrong)
    result = suite.run_suite(["bcast_reduce"], quick=True, peers=["numpy_manual"], first_call=False,
                             log=None)
    compiled = result["workloads"][0]["compiled"]
    assert compiled["status"] == "ok" and compiled["correct"] is False
    assert compiled["max_rel_error_vs_numpy"] == pytest.approx(0.01, rel=1e-3)
    assert "WRONG" in report.markdown_table(result)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_a_non_finite_output_is_reported_as_wrong(monkeypatch, bad):
    """A NaN or an infinity anywhere in a step's outputs fails the verdict, however small the
    other errors (max() alone would drop a NaN error as 0)."""
    from gradcompiler.bench import manual

    def poisoned(work, target):
        def step(**feeds):
            outputs = [np.array(v, dtype=np.float64) for v in manual.STEPS[work.name](feeds)]
            outputs[-1].reshape(-1)[-1] = bad
            return outputs
        return step

    monkeypatch.setattr(suite, "compile_step", poisoned)
    result = suite.run_suite(["bcast_reduce"], quick=True, peers=["numpy_manual"], first_call=False,
                             log=None)
    compiled = result["workloads"][0]["compiled"]
    assert compiled["correct"] is False and math.isinf(compiled["max_rel_error_vs_numpy"])
    assert "WRONG" in report.markdown_table(result)


def test_missing_frameworks_are_skipped_with_a_note(monkeypatch):
    from gradcompiler.bench import peers

    monkeypatch.setattr(peers, "_installed", lambda module: False)
    listed = {p.name: p for p in peers.available_peers()}
    assert listed["numpy_manual"].available
    for name in ("torch_eager", "torch_compile", "jax_jit"):
        assert not listed[name].available and "not installed" in listed[name].note
    entry = suite.measure_peer(listed["jax_jit"], None, {}, [], "cpu", 1, 0)
    assert entry == {"status": "skipped", "note": listed["jax_jit"].note}


def test_cuda_target_runs_and_matches_numpy(monkeypatch, tmp_path):
    """The CUDA path of the suite (device feeds, synchronised timing) on the GPU or Numba's simulator."""
    from numba import cuda

    if not cuda.is_available():  # only outside `make test`, which sets NUMBA_ENABLE_CUDASIM=1
        pytest.skip("no GPU and NUMBA_ENABLE_CUDASIM is not set")
    monkeypatch.setenv("GRADCOMPILER_CACHE_DIR", str(tmp_path))
    result = suite.run_suite(["bcast_reduce"], target="cuda", quick=True, steps=2, warmup=1,
                             peers=["numpy_manual"], first_call=False, log=None)
    compiled = result["workloads"][0]["compiled"]
    assert compiled["status"] == "ok", compiled.get("error")
    assert compiled["correct"] is True and _positive(compiled["median_s"])
    # the limits are the GPU's (a CUDA triad), not the host's
    assert result["machine"]["source"].startswith("cuda: numba triad kernel")
    assert "gpu" in result["environment"] and result["environment"]["compute_capability"]


def test_cnn_workload_runs_in_the_quick_suite_and_matches_numpy(tmp_path, monkeypatch):
    """The cnn workload (issue 14) at its tiny size: compiled, timed and checked against the
    hand-written im2col numpy step."""
    monkeypatch.setenv("GRADCOMPILER_CACHE_DIR", str(tmp_path))
    result = suite.run_suite(["cnn"], target="cpu", quick=True, peers=["numpy_manual"],
                             first_call=False, log=None)
    entry = result["workloads"][0]
    assert entry["name"] == "cnn" and entry["bound"] == "gemm" and _positive(entry["flops"])
    compiled = entry["compiled"]
    assert compiled["status"] == "ok", compiled.get("error")
    assert compiled["correct"] is True and _positive(compiled["median_s"])
    assert entry["peers"]["numpy_manual"]["correct"] is True


def _tiny_cnn():
    from gradcompiler.bench import workloads

    work = workloads.build("cnn", "tiny")
    feeds = workloads.feeds_for(work)
    return work, feeds, suite.float64_oracle(work, feeds)


def test_cnn_check_passes_float32_steps_and_flags_wrong_gradients(monkeypatch):
    """The check's reference is the numpy step in float64: the compiled float32 step and the
    numpy float32 step are both within cnn's tolerance of it, while a batch-norm gradient
    without its x̂·Σ(dy·x̂) term, a gradient 10% too large and one of the wrong sign are
    flagged."""
    from gradcompiler.bench import manual

    work, feeds, oracle = _tiny_cnn()
    assert all(o.dtype == np.float64 for o in oracle)
    assert suite.tolerance("cnn") == suite.TOLERANCES["cnn"] > suite.TOLERANCE
    compiled = [np.asarray(v) for v in suite.compile_step(work, "cpu")(**feeds)]
    own = suite.checked("cnn", compiled, oracle)
    assert own["correct"] is True
    assert suite.checked("cnn", manual.cnn(feeds), oracle)["correct"] is True
    wrt = [t.name for t in work.wrt]
    for index, factor in ((wrt.index("res1a_gamma"), 1.1), (wrt.index("down_w"), -1.0)):
        wrong = list(compiled)
        wrong[1 + index] = wrong[1 + index] * factor
        verdict = suite.checked("cnn", wrong, oracle)
        # |f·g − w| ≥ |f − 1|·|w| − |f|·|g − w| where |w| is largest: the factor's error, less
        # what float32 rounding already left (exactly 0.1 is not a bound: 0.0999998 was seen)
        least = abs(factor - 1) - abs(factor) * own["max_rel_error_vs_numpy"]
        assert verdict["correct"] is False and verdict["max_rel_error_vs_numpy"] >= least >= 0.09

    def without_projection(dy, xhat, rstd, gamma):
        count = dy.size // dy.shape[1]
        dbeta, dgamma = dy.sum(axis=(0, 2, 3)), (dy * xhat).sum(axis=(0, 2, 3))
        dz = (gamma[None, :, None, None] * rstd / count) * (count * dy - dbeta[None, :, None, None])
        return dz, dgamma, dbeta

    monkeypatch.setattr(manual, "_bn_backward", without_projection)
    verdict = suite.checked("cnn", manual.cnn(feeds), oracle)
    assert verdict["correct"] is False and verdict["max_rel_error_vs_numpy"] > 0.1


def test_gpt_check_admits_adams_ill_conditioned_first_step_and_flags_wrong_gradients():
    """gpt's tolerance is wider than the default for the weights AdamW's first step moves by
    lr·g/(|g| + eps) with g near zero (suite.TOLERANCES), and no wider than wrong gradients
    need: the exp_avg slots hold 0.1·g, so a gradient 10% too large or of the wrong sign is
    flagged at O(1)."""
    from gradcompiler.bench import workloads

    work = workloads.build("gpt", "tiny")
    feeds = workloads.feeds_for(work)
    oracle = suite.float64_oracle(work, feeds)
    compiled = suite.step_runner(work, suite.compile_step(work, "cpu"), feeds, "cpu")()
    own = suite.checked("gpt", compiled, oracle)
    assert own["correct"] is True and suite.TOLERANCE < suite.tolerance("gpt") <= 1e-2
    slot = 1 + work.state_names.index("down0.exp_avg")
    for factor in (1.1, -1.0):
        wrong = list(compiled)
        wrong[slot] = wrong[slot] * factor
        verdict = suite.checked("gpt", wrong, oracle)
        assert verdict["correct"] is False and verdict["max_rel_error_vs_numpy"] >= 0.09


def test_gpt_training_step_in_the_quick_suite_with_its_memory_budgets(tmp_path, monkeypatch):
    """The gpt workload (issue 15) at its tiny size: one gc.train_step, its loss and state
    after a step checked against the numpy step plus AdamW, and an entry per memory budget:
    1.0 is the default plan, a budget met has a planned peak within it and the same results,
    one no plan meets is reported with the smallest peak (above the budget), and the suite
    goes on to the peers; jax, without a training step, is skipped with a note."""
    monkeypatch.setenv("GRADCOMPILER_CACHE_DIR", str(tmp_path))
    result = suite.run_suite(["gpt"], target="cpu", quick=True, peers=["numpy_manual", "jax_jit"],
                             first_call=False, log=None)
    entry = result["workloads"][0]
    assert entry["name"] == "gpt" and entry["bound"] == "gemm" and _positive(entry["flops"])
    compiled = entry["compiled"]
    assert compiled["status"] == "ok", compiled.get("error")
    assert compiled["correct"] is True and _positive(compiled["median_s"])
    assert 0.0 < entry["peers"]["numpy_manual"]["max_rel_error_vs_numpy"] <= suite.tolerance("gpt")
    assert entry["peers"]["jax_jit"]["status"] == "skipped" and entry["peers"]["jax_jit"]["note"]
    budgets = entry["memory_budgets"]
    assert list(budgets) == [str(b) for b in suite.BUDGETS]
    default = budgets["1.0"]
    assert default["status"] == "ok" and default["peak_fraction"] == 1.0 and default["recomputed"] == 0
    for budget, measured in budgets.items():
        if measured["status"] == "unmet":
            assert measured["smallest_peak_bytes"] > float(budget) * default["default_peak_bytes"]
            assert str(measured["smallest_peak_bytes"]) in measured["note"]
        else:
            assert measured["status"] == "ok" and measured["correct"] is True, measured
            assert measured["default_peak_bytes"] == default["planned_peak_bytes"]
            assert measured["planned_peak_bytes"] <= float(budget) * measured["default_peak_bytes"]
    assert "gpt at memory budgets" in report.markdown_table(result)
