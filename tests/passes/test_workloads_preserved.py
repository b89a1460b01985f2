"""The optimisation pipeline preserves the semantics of every benchmark graph:
the reference interpreter gives the same loss and gradients before and after
it (float64, tiny sizes), with `verify` after every pass.
"""

import numpy as np
import pytest

from gradcompiler.bench import workloads
from gradcompiler.passes.pipeline import optimize
from gradcompiler.reference import run_graph


@pytest.mark.parametrize("name", workloads.NAMES)
def test_pipeline_preserves_every_benchmark_graph(name):
    workload = workloads.build(name, "tiny", dtype="float64")
    outputs = [t.id for t in workload.outputs]
    feeds = workloads.feeds_for(workload)
    before = run_graph(workload.graph, outputs, feeds)

    optimised, ctx = optimize(workload.graph, outputs, debug=True)
    after = run_graph(optimised, optimised.outputs, feeds)

    assert len(optimised) < len(workload.graph.ancestors(outputs))
    for b, a in zip(before, after, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)
