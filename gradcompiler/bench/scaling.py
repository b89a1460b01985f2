"""`gradcompiler bench --scaling`: how compile time grows with the graph.

    run_scaling(max_depth=2560, max_blocks=48, min_depth=10, min_blocks=2, log=print) -> dict
    write_json(result, path); write_plot(result, path)

Two families of graphs, each built at doubling sizes:

* `residual_mlp`: `depth` layers of h = h + tanh(layer_norm(h @ W + b)) (width 16, batch 4),
  a cross-entropy at the end, gradients with respect to every W and b; depths 10 → 2,560;
* `gpt_stack`: `blocks` transformer blocks (single-head causal-free attention and a GELU
  MLP, each behind a layer norm and a residual), 2 → 48 blocks.

Every size is compiled for the CPU in this process after untimed compiles of the two
smallest sizes (the first layer and the inner ones), so the kernel cache is warm: kernels
are keyed by structure, and a deeper graph of the same layers adds no new kernel. Each
point records the node count after autodiff and the seconds of each stage: build, grad,
every pass (summed by name), lowering, code generation and Numba (the kernels'
load-or-compile time). The fitted exponent is the
least-squares slope of log(warm compile seconds: the compile less the Numba time of kernels
it met for the first time, a cost per distinct kernel, not per node) against log(nodes)
over the points of at least
FIT_MIN_NODES nodes (all points when fewer than two are that large, as in a quick run);
`fit_cpu` is the same on the process's CPU seconds (less the same Numba time), which other
programs on a shared machine disturb less than the wall clock.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import gradcompiler as gc

RESIDUAL_WIDTH, RESIDUAL_BATCH = 16, 4
GPT_SEQ, GPT_WIDTH, GPT_HIDDEN = 8, 16, 32
FIT_MIN_NODES = 1000


def build_residual_mlp(depth: int, width: int = RESIDUAL_WIDTH, batch: int = RESIDUAL_BATCH):
    """`depth` layers of h = h + tanh(layer_norm(h @ W + b)), then a cross-entropy.

    Returns the loss and the parameters (every W and b) the gradients are taken against.
    """
    with gc.Graph(f"residual_mlp_{depth}"):
        h = gc.input("x", (batch, width))
        labels = gc.input("labels", (batch,), "int32")
        wrt = []
        for layer in range(depth):
            w = gc.param(f"w{layer}", (width, width))
            b = gc.param(f"b{layer}", (width,))
            h = h + gc.tanh(gc.layer_norm(h @ w + b))
            wrt += [w, b]
        loss = gc.cross_entropy(h, labels)
    return loss, wrt


def build_gpt_stack(blocks: int, seq: int = GPT_SEQ, width: int = GPT_WIDTH,
                    hidden: int = GPT_HIDDEN):
    """`blocks` pre-norm transformer blocks on a (seq, width) sequence, then (y · r).sum()."""
    with gc.Graph(f"gpt_stack_{blocks}"):
        x = gc.input("x", (seq, width))
        r = gc.input("r", (seq, width))
        wrt = []
        for k in range(blocks):
            wq, wk, wv, wo = (gc.param(f"{name}{k}", (width, width)) for name in "qkvo")
            w1, w2 = gc.param(f"up{k}", (width, hidden)), gc.param(f"down{k}", (hidden, width))
            h = gc.layer_norm(x)
            scores = gc.matmul(h @ wq, h @ wk, transpose_b=True) / math.sqrt(width)
            x = x + (gc.softmax(scores, axis=-1) @ (h @ wv)) @ wo
            x = x + gc.gelu_tanh(gc.layer_norm(x) @ w1) @ w2
            wrt += [wq, wk, wv, wo, w1, w2]
        loss = (gc.layer_norm(x) * r).sum()
    return loss, wrt


FAMILIES: dict[str, tuple[Callable, str]] = {
    "residual_mlp": (build_residual_mlp, "depth"),
    "gpt_stack": (build_gpt_stack, "blocks"),
}
"""Family -> (builder, what its size counts)."""


def doubling(start: int, stop: int) -> list[int]:
    """start, 2·start, 4·start, ... up to `stop` (at least `start` itself)."""
    sizes = [start]
    while sizes[-1] * 2 <= stop:
        sizes.append(sizes[-1] * 2)
    return sizes


def measure(builder: Callable, size: int, compiled_modules: set[str]) -> dict[str, Any]:
    """One point: node count and per-stage seconds of building, differentiating, compiling.

    `compiled_modules` holds the kernel modules already counted; a kernel new to it adds
    its load-or-compile time to "numba" (and its name to the set).
    """
    start = time.perf_counter()
    loss, wrt = builder(size)
    built = time.perf_counter()
    grads = gc.grad(loss, wrt)
    differentiated, cpu_start = time.perf_counter(), time.process_time()
    step = gc.compile([loss, *grads])
    compiled, cpu_seconds = time.perf_counter(), time.process_time() - cpu_start
    passes: dict[str, float] = {}
    for s in step.context.stats:
        passes[s.name] = passes.get(s.name, 0.0) + s.seconds
    fresh = {k.module: k.compile_seconds for k in step._build.distinct
             if k.module not in compiled_modules}
    compiled_modules.update(fresh)
    numba_seconds = sum(fresh.values())
    return {
        "size": size, "nodes": len(loss.graph), "kernels": len(step.kernels),
        "new_kernels": len(fresh),
        "seconds": {"build": built - start, "grad": differentiated - built, "passes": passes,
                    "lowering": step.timings["lowering"],
                    "codegen": step.timings["codegen+numba"] - numba_seconds,
                    "numba": numba_seconds},
        "compile_s": compiled - differentiated,
        "compile_cpu_s": cpu_seconds - numba_seconds,
        "warm_compile_s": compiled - differentiated - numba_seconds,
        "work": {"cone_evaluations": step.context.work.cone_evaluations,
                 "nodes_visited": step.context.work.nodes_visited},
    }


def fitted_exponent(points: list[dict[str, Any]], min_nodes: int = FIT_MIN_NODES,
                    key: str = "warm_compile_s") -> dict:
    """The least-squares slope of log(point[key]) on log(nodes), and the points it used."""
    used = [p for p in points if p["nodes"] >= min_nodes]
    if len(used) < 2:
        used = points
    if len(used) < 2:
        return {"exponent": None, "nodes": [p["nodes"] for p in used]}
    xs = [math.log(p["nodes"]) for p in used]
    ys = [math.log(p[key]) for p in used]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = (sum((x - mx) * (y - my) for x, y in zip(xs, ys))
             / sum((x - mx) ** 2 for x in xs))
    return {"exponent": slope, "nodes": [p["nodes"] for p in used]}


def run_scaling(max_depth: int = 2560, max_blocks: int = 48, min_depth: int = 10,
                min_blocks: int = 2, log: Callable[[str], None] | None = print) -> dict[str, Any]:
    """Measure both families at doubling sizes from the smallest to the largest given
    (module docstring; a family whose largest is below its smallest is skipped); the
    result document."""
    limits = {"residual_mlp": (min_depth, max_depth), "gpt_stack": (min_blocks, max_blocks)}
    result: dict[str, Any] = {"fit_min_nodes": FIT_MIN_NODES, "families": {}}
    compiled_modules: set[str] = set()
    for family, (builder, unit) in FAMILIES.items():
        smallest, largest = limits[family]
        if largest < smallest:
            continue
        sizes = doubling(smallest, largest)
        for size in sizes[:2]:  # the first and the inner layers' kernels: a warm cache
            measure(builder, size, compiled_modules)
        points = []
        for size in sizes:
            point = measure(builder, size, compiled_modules)
            points.append(point)
            if log:
                per_node = point["compile_s"] / point["nodes"] * 1e6
                log(f"{family} {unit} {size}: {point['nodes']} nodes, grad "
                    f"{point['seconds']['grad']:.2f} s, compile {point['compile_s']:.2f} s "
                    f"({per_node:.0f} µs/node, {point['new_kernels']} new kernels)")
        result["families"][family] = {
            "unit": unit, "points": points, "fit": fitted_exponent(points),
            "fit_cpu": fitted_exponent(points, key="compile_cpu_s")}
    return result


def write_json(result: dict[str, Any], path: str | Path) -> None:
    Path(path).write_text(json.dumps(result, indent=1) + "\n")


def write_plot(result: dict[str, Any], path: str | Path) -> None:
    """Compile seconds against nodes, log-log, one line per family with its exponent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for family, data in result["families"].items():
        exponent = data["fit"]["exponent"]
        label = family if exponent is None else f"{family} (exponent {exponent:.2f})"
        ax.plot([p["nodes"] for p in data["points"]],
                [p["warm_compile_s"] for p in data["points"]],
                marker="o", label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("nodes after autodiff")
    ax.set_ylabel("compile seconds, warm kernels (wall clock)")
    ax.set_title("gradcompiler compile time against graph size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def report_lines(result: dict[str, Any]) -> list[str]:
    """A table per family: size, nodes, grad seconds, warm compile seconds (wall and CPU), µs
    per node; the exponents."""
    lines = []
    for family, data in result["families"].items():
        header = (f"{data['unit']:>8} {'nodes':>8} {'grad s':>8} {'compile s':>10}"
                  f" {'cpu s':>8} {'µs/node':>8}")
        lines += [family, header]
        for p in data["points"]:
            lines.append(f"{p['size']:>8} {p['nodes']:>8} {p['seconds']['grad']:>8.2f} "
                         f"{p['warm_compile_s']:>10.2f} {p['compile_cpu_s']:>8.2f} "
                         f"{p['warm_compile_s'] / p['nodes'] * 1e6:>8.0f}")
        for name, fit in (("wall", data["fit"]), ("cpu", data["fit_cpu"])):
            exponent = fit["exponent"]
            lines.append(f"fitted exponent ({name}): "
                         + ("n/a" if exponent is None else f"{exponent:.3f}"))
    return lines
