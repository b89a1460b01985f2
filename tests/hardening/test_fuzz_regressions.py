"""Graphs the long fuzz (`make fuzz`) once broke, rebuilt by hand from hypothesis's listing.

Each is compiled for the CPU and the CUDA simulator and compared with the reference
interpreter on the same graph: the fuzz's own criterion, pinned so it cannot come back.
Nodes are built in the listing's order: node ids order the planner's choices.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.frontend.tensor import Tensor


def _shared_value_used_only_inside_an_epilogue() -> tuple[list[Tensor], dict[str, np.ndarray]]:
    """The `StopIteration` in lowering: a SetSubtensor's gradient is a library call whose
    epilogue loop has an elementwise root of the call's type that only the same loop reads
    (materialised because two reductions share it), so it has no buffer for the call to write
    into, and the planner took it for the in-place target anyway."""
    with gc.Graph("fuzz"):
        p0 = gc.param("p0", (), "float32")
        p1 = gc.param("p1", (2, 1, 3), "float32")
        p2 = gc.param("p2", (2, 3), "float32")
        i3 = gc.input("i3", (1,), "int32")
        chosen = gc.where((p0 + 0.37) < p2, p1, p0)  # (2, 2, 3)
        row = p0.reshape(1)
        normalised = gc.layer_norm(gc.concat([row, row * 0.5 + 1.0], 0))
        rooted = gc.sqrt(chosen * chosen + 0.5)
        picked = gc.indexing_one_hot(p0.reshape(1, 1), i3, 0)
        empty = (slice(0, 0), slice(1, None, -1), slice(2, None, -1))  # region of shape (0, 2, 3)
        updated = gc.index_add(chosen, empty, gc.broadcast_to(p1.mean(), (0, 2, 3)))
        offsets = gc.constant(np.linspace(-1.0, 1.0, 12).reshape(2, 2, 3).astype("float32"))
        last = gc.where((rooted + offsets) <= p2, updated, rooted)
    outputs = [normalised, picked, last]
    loss = sum((o.sum() for o in outputs[1:]), outputs[0].sum())
    rng = np.random.default_rng(23)
    feeds = {"p0": np.float32(0.3), "p1": rng.standard_normal((2, 1, 3)).astype("float32"),
             "p2": rng.standard_normal((2, 3)).astype("float32"), "i3": np.array([0], "int32")}
    return outputs + gc.grad(loss, [p0, p1]), feeds


@pytest.mark.parametrize("target", ["cpu", "cuda"])
def test_epilogue_whose_elementwise_root_stays_in_registers(target):
    outputs, feeds = _shared_value_used_only_inside_an_epilogue()
    expected = gc.evaluate(outputs, feeds)
    step = gc.compile(outputs, target=target)
    got = step(to_host=True, **feeds) if target == "cuda" else step(**feeds)
    for e, g in zip(expected, got):
        np.testing.assert_allclose(np.asarray(g), e, rtol=1e-5, atol=1e-6)
