"""CUDA kernels of convolution and pooling (backends/numba_cuda/library_conv.py) on Numba's
CUDA simulator, against each op's numpy reference (itself checked against nested loops in
tests/ops/test_conv_forward.py). One tiny block per launch, so every grid-stride loop goes
round several times.
"""

from __future__ import annotations

import numpy as np
import pytest

from cuda_support import cuda_for_tests
from oracle import assert_close
from pool_cases import KERNEL, PADDING, STRIDE, max_pool_loop, non_finite_images

cuda = cuda_for_tests()

from gradcompiler.backends.numba_cuda.device import LaunchConfig  # noqa: E402
from gradcompiler.backends.numba_cuda.library import run_library_op  # noqa: E402
from gradcompiler.ir import TensorType  # noqa: E402
from gradcompiler.ops.conv import (  # noqa: E402
    Convolution,
    ConvolutionBackwardData,
    ConvolutionBackwardFilter,
)
from gradcompiler.ops.pool import Pooling, PoolingBackward  # noqa: E402

GRID_STRIDE = LaunchConfig(block=8, max_blocks=2, reduce_block=4, tile=4, column_chunks=3)


def assert_matches(op, *inputs):
    got = run_library_op(op, *inputs, config=GRID_STRIDE)
    assert_close(got, op.reference(*inputs), rtol=1e-5, label=op.describe())


@pytest.mark.parametrize("stride,padding,dilation,groups", [
    ((2, 1), (1, 1), (1, 1), 1), ((1, 1), (1, 0), (2, 1), 2)])
def test_convolution_kernels(stride, padding, dilation, groups, rng):
    x = rng.standard_normal((2, 4, 5, 4)).astype(np.float32)
    w = rng.standard_normal((2, 4 // groups, 2, 3)).astype(np.float32)
    params = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    forward = Convolution(**params)
    assert_matches(forward, x, w)
    dy_shape = forward.infer(TensorType(x.shape, x.dtype), TensorType(w.shape, w.dtype)).shape
    dy = rng.standard_normal(dy_shape).astype(np.float32)
    assert_matches(ConvolutionBackwardData(**params, image=x.shape[2:]), w, dy)
    assert_matches(ConvolutionBackwardFilter(**params, kernel=w.shape[2:]), x, dy)


@pytest.mark.parametrize("mode", ["MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"])
def test_pooling_kernels(mode, rng):
    x = np.round(rng.standard_normal((1, 2, 5, 4)) * 2).astype(np.float32)
    op = Pooling(mode, (3, 2), (2, 1), (1, 1), True)
    assert_matches(op, x)
    dy = rng.standard_normal(op.infer(TensorType(x.shape, x.dtype)).shape).astype(np.float32)
    backward = PoolingBackward(mode, (3, 2), (2, 1), (1, 1), True, x.shape[2:])
    assert_matches(backward, *((x, dy) if mode == "MAX" else (dy,)))
    if mode == "MAX":
        assert_matches(op, x, rng.standard_normal(x.shape).astype(np.float32))


@pytest.mark.parametrize("case", ["all_nan", "all_minus_inf", "nan_among_finite", "two_nans_and_inf",
                                  "padding_first_minus_inf"])
def test_max_pooling_of_non_finite_windows_follows_torchs_rule(case, rng):
    """The CUDA kernels' picked pixel: NaN wherever it comes, never the padding (pool_cases)."""
    x = non_finite_images(rng)[case].astype(np.float32)
    forward = Pooling("MAX", KERNEL, STRIDE, PADDING)
    assert_close(run_library_op(forward, x, config=GRID_STRIDE), max_pool_loop(x).astype(np.float32), rtol=0,
                 label=case)
    dy = rng.standard_normal(max_pool_loop(x).shape).astype(np.float32)
    backward = PoolingBackward("MAX", KERNEL, STRIDE, PADDING, False, x.shape[2:])
    assert_close(run_library_op(backward, x, dy, config=GRID_STRIDE), max_pool_loop(x, dy).astype(np.float32),
                 rtol=1e-6, label=case)
