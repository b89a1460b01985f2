"""The CUDA convolutions as im2col + matrix product (backends/numba_cuda/library_conv.py) on
Numba's CUDA simulator, against each op's numpy reference, on every path: stride 2, padding,
dilation, groups, 1×1 (the image as its own column matrix), non-square, and depthwise (which
stays on the direct kernels).

Each case runs through the tiled shared-memory product (what the simulator runs: it has no
cuBLAS), a numpy stand-in for the cuBLAS route (as in test_cuda_matmul_route.py: the views,
transpose flags and broadcast batches a cuBLAS call would get), the direct kernels
(GRADCOMPILER_CUDA_CONV=direct), and under `make gpu-check` the real cuBLAS route. float64
agrees to 1e-10, float32 to 1e-5.
"""

from __future__ import annotations

import numpy as np
import pytest

from cuda_support import cuda_for_tests, host_matmul_route, on_gpu_check
from oracle import assert_close

cuda = cuda_for_tests()

from gradcompiler.backends.numba_cuda import cublas, library_conv, library_linalg  # noqa: E402
from gradcompiler.backends.numba_cuda.device import LaunchConfig  # noqa: E402
from gradcompiler.backends.numba_cuda.library import cuda_library_kernel  # noqa: E402
from gradcompiler.ir import TensorType  # noqa: E402
from gradcompiler.ops.conv import (  # noqa: E402
    Convolution,
    ConvolutionBackwardData,
    ConvolutionBackwardFilter,
)

# small blocks and few of them, so the grid-stride loops of the column kernels go round
CONFIG = LaunchConfig(block=16, max_blocks=3, reduce_block=4, tile=4, column_chunks=3)
RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-10}

CASES = {  # x shape, w shape, stride, padding, dilation, groups
    "stride2": ((2, 3, 5, 5), (2, 3, 3, 3), (2, 2), (0, 0), (1, 1), 1),
    "padding1": ((2, 2, 5, 5), (2, 2, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    "dilation2": ((2, 2, 5, 5), (2, 2, 2, 2), (1, 1), (1, 1), (2, 2), 1),
    "groups2": ((2, 4, 5, 5), (2, 2, 3, 3), (1, 1), (1, 1), (1, 1), 2),
    "depthwise": ((2, 3, 5, 5), (6, 1, 3, 3), (1, 1), (1, 1), (1, 1), 3),
    "pointwise": ((2, 3, 5, 5), (2, 3, 1, 1), (1, 1), (0, 0), (1, 1), 1),
    "pointwise_groups2": ((2, 4, 5, 5), (4, 2, 1, 1), (1, 1), (0, 0), (1, 1), 2),
    "pointwise_stride2": ((2, 3, 5, 5), (2, 3, 1, 1), (2, 2), (0, 0), (1, 1), 1),
    "non_square": ((2, 2, 5, 4), (2, 2, 2, 3), (2, 1), (1, 0), (2, 1), 1),
}


@pytest.fixture(params=["tiled", "blas", "direct", "cublas"])
def route(request, monkeypatch):
    """The route's name and the products it sent to the BLAS stand-in (blas only)."""
    calls = []
    if request.param == "tiled":
        monkeypatch.setattr(library_linalg, "matmul_route", lambda: None)
    elif request.param == "blas":
        monkeypatch.setattr(library_linalg, "matmul_route", lambda: host_matmul_route(calls))
    elif request.param == "direct":
        monkeypatch.setenv("GRADCOMPILER_CUDA_CONV", "direct")
    elif not on_gpu_check(cuda):
        pytest.skip("the real cuBLAS route needs a GPU and CuPy: make gpu-check runs it")
    else:
        assert cublas.matmul_route() is not None, "make gpu-check needs CuPy (the cuda extra)"
    return request.param, calls


def conv_ops(case, dtype):
    x_shape, w_shape, stride, padding, dilation, groups = CASES[case]
    params = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    forward = Convolution(**params)
    y_shape = forward.infer(TensorType(x_shape, dtype), TensorType(w_shape, dtype)).shape
    return (forward, ConvolutionBackwardData(**params, image=x_shape[2:]),
            ConvolutionBackwardFilter(**params, kernel=w_shape[2:]), x_shape, w_shape, y_shape)


def run(op, *inputs, calls: int = 1):
    """`op` on `inputs` through one launcher, `calls` times (later calls reuse its buffers),
    checked against the reference each time; the launcher."""
    types = [TensorType(x.shape, x.dtype) for x in inputs]
    out_type = op.infer(*types)
    launch = cuda_library_kernel(op, types, CONFIG)
    want = op.reference(*inputs)
    for _ in range(calls):
        out = cuda.device_array(out_type.shape, out_type.dtype)
        launch(*inputs, out=out)
        assert_close(out.copy_to_host(), want, rtol=RTOL[want.dtype], label=op.describe())
    return launch


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_convolution_routes_equal_the_reference(case, dtype, route, rng):
    name, calls = route
    forward, data, filt, x_shape, w_shape, y_shape = conv_ops(case, dtype)
    x, w = rng.standard_normal(x_shape).astype(dtype), rng.standard_normal(w_shape).astype(dtype)
    dy = rng.standard_normal(y_shape).astype(dtype)
    launchers = [run(forward, x, w), run(data, w, dy), run(filt, x, dy)]
    gemm = name != "direct" and case != "depthwise"
    assert all(isinstance(launch, library_conv._GridLauncher) != gemm for launch in launchers)
    if name == "blas":
        assert len(calls) == (3 if gemm else 0)  # one image chunk: one product per op


@pytest.mark.parametrize("route", ["blas", "direct", "cublas"], indirect=True)
@pytest.mark.parametrize("case", ["padding1", "depthwise"])
def test_padding_taps_multiply_zero_by_an_infinite_filter_or_gradient(case, route, rng):
    """The reference pads the image with zeros, so a padding tap under an infinite filter
    entry (forward) or gradient (filter gradient) is 0·inf = NaN: the column buffer holds the
    zero and the product multiplies it, and the direct kernels multiply it too (the first ones
    skipped it and gave 0). The padding sites are im2col's and the direct kernels', whatever
    multiplies the columns, so the tiled product (minutes on the simulator) is left to
    test_convolution_routes_equal_the_reference."""
    forward, _, filt, x_shape, w_shape, y_shape = conv_ops(case, np.float32)
    x, w = rng.standard_normal(x_shape).astype(np.float32), rng.standard_normal(w_shape).astype(np.float32)
    dy = rng.standard_normal(y_shape).astype(np.float32)
    w[0, 0, 0, 0] = np.inf
    dy[0, 0, 0, 0] = -np.inf
    assert np.isnan(forward.reference(x, w)).any() and np.isnan(filt.reference(x, dy)).any()
    run(forward, x, w)
    run(filt, x, dy)


def test_the_products_a_blas_route_is_given(monkeypatch):
    """groups2: the groups are a batch dimension of each product, broadcast against the
    images for the forward and the data gradient; the filter gradient sums the images and
    pixels as the depth of one product per group."""
    calls = []
    monkeypatch.setattr(library_linalg, "matmul_route", lambda: host_matmul_route(calls))
    forward, data, filt, x_shape, w_shape, y_shape = conv_ops("groups2", np.float64)
    rng = np.random.default_rng(3)
    x, w, dy = (rng.standard_normal(s) for s in (x_shape, w_shape, y_shape))
    run(forward, x, w)
    run(data, w, dy)
    run(filt, x, dy)
    assert calls == [((2, 1, 18), (2, 2, 18, 25), (2, 2, 1, 25), False, False),
                     ((2, 1, 18), (2, 2, 1, 25), (2, 2, 18, 25), True, False),
                     ((2, 1, 50), (2, 18, 50), (2, 1, 18), False, True)]


@pytest.mark.parametrize("case,blas", [("padding1", True), ("groups2", True),
                                       ("pointwise_stride2", True), ("pointwise_stride2", False)])
def test_convolution_in_chunks_of_two_and_a_remainder(case, blas, rng, monkeypatch):
    """A batch of 3 in a chunk of two images and one of one, twice through each launcher:
    every chunk's columns come from a buffer that held another chunk's, the filter gradient
    adds the second chunk's product into the first's, and a one-image chunk reads dy as it
    is. The chunking is the same whichever route multiplies, so the tiled kernel (slow on the
    simulator) runs the cheapest case only."""
    if blas:
        monkeypatch.setattr(library_linalg, "matmul_route", lambda: host_matmul_route([]))
    dtype = np.float64
    forward, data, filt, x_shape, w_shape, y_shape = conv_ops(case, dtype)
    x_shape, y_shape = (3, *x_shape[1:]), (3, *y_shape[1:])
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    dy = rng.standard_normal(y_shape)
    rows, pixels = x_shape[1] * w_shape[2] * w_shape[3], y_shape[2] * y_shape[3]
    for op, inputs, per_image in ((forward, (x, w), rows * pixels), (data, (w, dy), rows * pixels),
                                  (filt, (x, dy), (rows + y_shape[1]) * pixels)):
        monkeypatch.setattr(library_conv, "COLUMN_BYTES", 2 * per_image * np.dtype(dtype).itemsize)
        launch = run(op, *inputs, calls=2)
        assert launch.c.chunks() == [(0, 2), (2, 1)]


def test_pointwise_convolution_is_one_product_over_the_batch(monkeypatch):
    """A 1×1 stride-1 unpadded forward and data gradient multiply the images themselves: no
    column buffer, one product however many chunks the columns would need."""
    monkeypatch.setattr(library_conv, "COLUMN_BYTES", 1)
    forward, data, _, x_shape, w_shape, y_shape = conv_ops("pointwise_groups2", np.float64)
    rng = np.random.default_rng(5)
    x, w, dy = (rng.standard_normal(s) for s in (x_shape, w_shape, y_shape))
    for launch in (run(forward, x, w), run(data, w, dy)):
        assert launch.cols is None and list(launch.products) == [2]


def test_the_algorithm_is_chosen_by_shape(monkeypatch):
    geometry = {case: conv_ops(case, np.float64)[0].geometry(*CASES[case][:2]) for case in CASES}
    assert {case for case, g in geometry.items()
            if library_conv.conv_algorithm(g) == "direct"} == {"depthwise"}
    for forced in ("direct", "gemm"):
        monkeypatch.setenv("GRADCOMPILER_CUDA_CONV", forced)
        assert {library_conv.conv_algorithm(g) for g in geometry.values()} == {forced}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_depthwise_convolution_forced_onto_the_product(dtype, rng, monkeypatch):
    """GRADCOMPILER_CUDA_CONV=gemm (for measuring): depthwise as a batch of one-channel
    products, through the BLAS stand-in."""
    monkeypatch.setenv("GRADCOMPILER_CUDA_CONV", "gemm")
    monkeypatch.setattr(library_linalg, "matmul_route", lambda: host_matmul_route([]))
    forward, data, filt, x_shape, w_shape, y_shape = conv_ops("depthwise", dtype)
    x, w = rng.standard_normal(x_shape).astype(dtype), rng.standard_normal(w_shape).astype(dtype)
    dy = rng.standard_normal(y_shape).astype(dtype)
    for launch in (run(forward, x, w), run(data, w, dy), run(filt, x, dy)):
        assert not isinstance(launch, library_conv._GridLauncher)
