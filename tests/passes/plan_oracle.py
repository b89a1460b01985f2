"""The fusion plans the rewrite for linear compile time must leave unchanged.

`current_plans()` plans every benchmark workload (both sizes), the residual MLP at a few
depths and the GPT-like stack at a few blocks, and describes each plan by its kernels:
name, kind and fused op labels.
Run as a script, it writes them to `plans_fixture.json`, which test_plan_unchanged holds
the planner to: a change detector reviewed by a person (its docstring), not an oracle. The
fixture was captured from the planner before the fuse pass was made incremental, with these
intended changes since, each explained in the commit that regenerated it: the
spatial_transformer's two warp gradients are one step (sibling calls, fuse's module
docstring); attention's loss is summed from V and its gradient instead of from the product
P·V, which is gone (simplify's `products`); the cnn's batch-norm gradients store their
upstream gradient instead of recomputing it in both passes, as does the GPT-like stack at
three blocks (fuse's REREAD_LIMIT); and layer_norm's and gelu_tanh's own backwards
(op-reference §21) fuse fewer ops into the same kernels of layernorm_gelu, gpt, the residual
MLP and the GPT-like stack.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import gradcompiler as gc
from gradcompiler.bench import workloads
from gradcompiler.bench.scaling import build_gpt_stack, build_residual_mlp
from gradcompiler.passes.pipeline import optimize

FIXTURE = Path(__file__).with_name("plans_fixture.json")
RESIDUAL_DEPTHS = (1, 3, 8)
GPT_BLOCKS = (1, 3)


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
    for family, builder, sizes in (("residual_mlp", build_residual_mlp, RESIDUAL_DEPTHS),
                                   ("gpt_stack", build_gpt_stack, GPT_BLOCKS)):
        for size in sizes:
            loss, wrt = builder(size)
            grads = gc.grad(loss, wrt)
            plans[f"{family}/{size}"] = plan_of(loss.graph, [loss.id] + [g.id for g in grads])
    return plans


if __name__ == "__main__":
    FIXTURE.write_text(json.dumps(current_plans(), indent=1) + "\n")
    sys.stdout.write(f"wrote {FIXTURE}\n")
