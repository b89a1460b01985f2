"""Integer sums and products accumulate in numpy's dtype: int64 for bool and signed integers,
uint64 for unsigned ones (int32 4 × 2**30 is 4294967296, not 0), on the reference interpreter,
compiled CPU and the CUDA simulator. Oracle: numpy's own `np.sum` / `np.prod` (default dtype).
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc


def _graph():
    """Every reduction layout: a whole vector, rows (innermost axis), columns (axis 0, per-thread
    partials), a middle axis, fused with an elementwise op, and bools counted."""
    with gc.Graph("int_reduce"):
        big = gc.input("big", (4,), "int32")
        small = gc.input("small", (3, 5, 6), "int8")
        wide = gc.input("wide", (4, 3), "uint32")
        mask = gc.input("mask", (3, 5), "bool")
        outputs = [gc.sum(big), gc.sum(small, axis=2), gc.sum(small, axis=0),
                   gc.sum(small, axis=1), gc.sum(small * small), gc.prod(small, axis=2),
                   gc.sum(wide, axis=0), gc.sum(wide), gc.sum(mask), gc.sum(mask, axis=1),
                   gc.max(small, axis=1)]
    return outputs


def _feeds():
    rng = np.random.default_rng(11)
    return dict(big=np.full(4, 2**30, np.int32),
                small=rng.integers(100, 128, (3, 5, 6)).astype(np.int8),
                wide=np.full((4, 3), 2**31 + 5, np.uint32),
                mask=rng.random((3, 5)) < 0.6)


def _numpy(feeds):
    big, small, wide, mask = feeds["big"], feeds["small"], feeds["wide"], feeds["mask"]
    return [np.sum(big), np.sum(small, axis=2), np.sum(small, axis=0), np.sum(small, axis=1),
            np.sum(small * small), np.prod(small, axis=2), np.sum(wide, axis=0), np.sum(wide),
            np.sum(mask), np.sum(mask, axis=1), np.max(small, axis=1)]


def _check(got, want):
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want)):
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape, (k, g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_array_equal(g, w, err_msg=f"output {k}")


def test_dtypes_follow_numpy_when_built():
    outputs = _graph()
    want = _numpy(_feeds())
    assert [t.dtype for t in outputs] == [w.dtype for w in want]
    assert outputs[0].dtype == outputs[8].dtype == np.int64 and outputs[6].dtype == np.uint64


@pytest.mark.parametrize("target", ["reference", "cpu", "cuda"])
def test_integer_sums_do_not_wrap(target):
    outputs, feeds = _graph(), _feeds()
    if target == "reference":
        got = gc.evaluate(outputs, feeds)
    elif target == "cpu":
        got = gc.compile(outputs)(**feeds)
    else:
        from gradcompiler.backends.numba_cuda import require_cuda

        require_cuda()
        got = gc.compile(outputs, target="cuda")(to_host=True, **feeds)
    assert int(got[0]) == 4 * 2**30
    _check(got, _numpy(feeds))
