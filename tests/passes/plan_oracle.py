"""The fusion plans the rewrite for linear compile time must leave unchanged.

`current_plans()` plans every benchmark workload (both sizes) and the residual MLP at a
few depths, and describes each plan by its kernels: name, kind and fused op labels.
Run as a script, it writes them to `plans_fixture.json`; the fixture was captured from
the planner before the fuse pass was made incremental, so it is the old code's answer.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gradcompiler as gc
from gradcompiler.bench import workloads
from gradcompiler.bench.scaling import build_residual_mlp
from passes.pipeline import optimize

FIXTURE = Path(__file__).with_name("plans_fixture.json")
RESIDUAL_DEPTHS = (1, 3, 8)


def plan_of(graph: gc.Graph, outputs: list[int]) -> list[list]:
    """[name, kind, op labels] of each kernel of the plan, in execution order."""
    optimised, ctx = optimize(graph, outputs)
    return [[g.name, g.kind, [optimised[n].op.label for n in g.nodes]]
            for g in ctx.fusion.kernels()]


def current_plans() -> dict[str, list[list]]:
    plans = {}
    for name in workloads.NAMES:
        for size in workloads.SIZES:
            w = workloads.build(name, size)
            plans[f"{name}/{size}"] = plan_of(w.graph, [t.id for t in w.outputs])
    for depth in RESIDUAL_DEPTHS:
        loss, wrt = build_residual_mlp(depth)
        grads = gc.grad(loss, wrt)
        plans[f"residual_mlp/{depth}"] = plan_of(loss.graph, [loss.id] + [g.id for g in grads])
    return plans


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(current_plans(), indent=1) + "\n")
    sys.stdout.write(f"wrote {FIXTURE}\n")
