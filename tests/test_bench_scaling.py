"""`gradcompiler bench --scaling --quick`: the residual MLP at depths 2 and 4, written as JSON
whose numbers add up (node counts grow with depth, the exponent is the slope of the points)
and as a chart."""

import json
import math

import pytest

from gradcompiler.bench.scaling import doubling, fitted_exponent
from gradcompiler.cli import main


@pytest.fixture(scope="module")
def scaling_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("scaling")
    status = main(["bench", "--scaling", "--quick", "--max-blocks", "0",
                   "--json", str(out / "s.json"), "--plot", str(out / "s.png")])
    return status, json.loads((out / "s.json").read_text()), out / "s.png"


def test_the_quick_run_measures_depths_two_and_four(scaling_run):
    status, result, _ = scaling_run
    assert status == 0
    assert list(result["families"]) == ["residual_mlp"]
    points = result["families"]["residual_mlp"]["points"]
    assert [p["size"] for p in points] == [2, 4]
    small, large = points
    assert large["nodes"] - small["nodes"] == 2 * 29  # 29 nodes per layer after autodiff
    assert large["kernels"] > small["kernels"]
    for p in points:
        assert p["new_kernels"] == 0  # warm: the untimed runs compiled every kernel
        stages = p["seconds"]
        assert set(stages) == {"build", "grad", "passes", "lowering", "codegen", "numba"}
        assert {"prune", "simplify", "cse", "fuse", "memory"} <= set(stages["passes"])
        assert p["compile_s"] >= sum(stages["passes"].values()) + stages["lowering"]
        assert p["warm_compile_s"] == pytest.approx(p["compile_s"] - stages["numba"])
        assert p["work"]["cone_evaluations"] > 0


def test_the_exponent_is_the_slope_of_the_points(scaling_run):
    _, result, _ = scaling_run
    family = result["families"]["residual_mlp"]
    (a, b) = family["points"]
    slope = (math.log(b["warm_compile_s"] / a["warm_compile_s"])
             / math.log(b["nodes"] / a["nodes"]))
    assert family["fit"]["exponent"] == pytest.approx(slope)
    assert family["fit"]["nodes"] == [a["nodes"], b["nodes"]]  # too few above the minimum
    cpu = math.log(b["compile_cpu_s"] / a["compile_cpu_s"]) / math.log(b["nodes"] / a["nodes"])
    assert family["fit_cpu"]["exponent"] == pytest.approx(cpu)


def test_the_chart_is_a_png(scaling_run):
    png = scaling_run[2].read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_fit_uses_only_large_graphs_when_there_are_two():
    points = [{"nodes": n, "warm_compile_s": s}
              for n, s in ((100, 5.0), (1000, 1.0), (4000, 2.0))]
    fit = fitted_exponent(points, min_nodes=1000)
    assert fit["nodes"] == [1000, 4000]
    assert fit["exponent"] == pytest.approx(0.5)


def test_sizes_double_up_to_the_largest():
    assert doubling(10, 2560) == [10, 20, 40, 80, 160, 320, 640, 1280, 2560]
    assert doubling(2, 48) == [2, 4, 8, 16, 32]
