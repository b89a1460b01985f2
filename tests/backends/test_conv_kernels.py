"""CPU kernels of convolution and pooling (backends/numba_cpu/library_conv.py) and compiled
CNN graphs, against the numpy reference interpreter.

float64 must agree to 1e-10, float32 to 1e-5 (relative to the output's scale). The column
buffer is shrunk in some tests so a batch runs in several chunks, and the `parallel_loops`
fixture forces the parallel compilation of every loop.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends.numba_cpu import library, library_conv
from gradcompiler.backends.numba_cpu.library import run_library_op
from gradcompiler.ir import TensorType
from gradcompiler.ops.conv import Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter
from gradcompiler.ops.pool import Pooling, PoolingBackward

from oracle import assert_close

RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-10}

CONV_CASES = {  # x shape, w shape, stride, padding, dilation, groups
    "stride2_pad1": ((3, 2, 6, 7), (4, 2, 3, 3), (2, 2), (1, 1), (1, 1), 1),
    "dilation2": ((1, 3, 7, 6), (2, 3, 3, 2), (1, 1), (1, 0), (2, 2), 1),
    "groups2": ((3, 4, 5, 5), (6, 2, 3, 3), (1, 2), (1, 1), (1, 1), 2),
    "depthwise": ((2, 3, 6, 5), (3, 1, 3, 3), (1, 1), (1, 1), (1, 1), 3),
    "pointwise": ((3, 4, 3, 5), (5, 4, 1, 1), (1, 1), (0, 0), (1, 1), 1),
    "pointwise_groups": ((2, 4, 3, 3), (6, 2, 1, 1), (1, 1), (0, 0), (1, 1), 2),
    "pointwise_stride2": ((1, 4, 5, 5), (2, 4, 1, 1), (2, 2), (0, 0), (1, 1), 1),
    # "same" width at stride 1: each tap is one shifted run of the flat image
    "same_3x3": ((2, 3, 5, 6), (4, 3, 3, 3), (1, 1), (1, 1), (1, 1), 1),
    "same_dilated": ((2, 2, 6, 5), (3, 2, 3, 3), (1, 1), (2, 2), (2, 2), 1),
    "same_1x5": ((1, 2, 4, 7), (2, 2, 1, 5), (1, 1), (0, 2), (1, 1), 1),
    "same_width_fewer_rows": ((1, 2, 6, 5), (2, 2, 3, 3), (1, 1), (0, 1), (1, 1), 1),
    # fewer output channels than input: the data gradient is a convolution of dy padded by 1
    "transposed_pad1": ((2, 2, 3, 4), (1, 2, 2, 2), (1, 1), (0, 0), (1, 1), 1),
}



@pytest.fixture
def small_chunks(monkeypatch):
    """A column buffer of one image: every batch runs chunk by chunk."""
    monkeypatch.setattr(library_conv, "COLUMN_BYTES", 1)


def assert_matches(op, *inputs):
    got = run_library_op(op, *inputs)
    assert_close(got, op.reference(*inputs), rtol=RTOL[got.dtype], label=op.describe())


def conv_ops(case):
    x_shape, w_shape, stride, padding, dilation, groups = CONV_CASES[case]
    params = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    forward = Convolution(**params)
    y_shape = forward.infer(TensorType(x_shape, "float64"), TensorType(w_shape, "float64")).shape
    return (forward, ConvolutionBackwardData(**params, image=x_shape[2:]),
            ConvolutionBackwardFilter(**params, kernel=w_shape[2:]), x_shape, w_shape, y_shape)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", list(CONV_CASES))
def test_convolution_kernels_equal_the_reference(case, dtype, rng):
    forward, data, filt, x_shape, w_shape, y_shape = conv_ops(case)
    x, w = rng.standard_normal(x_shape).astype(dtype), rng.standard_normal(w_shape).astype(dtype)
    dy = rng.standard_normal(y_shape).astype(dtype)
    assert_matches(forward, x, w)
    assert_matches(data, w, dy)
    assert_matches(filt, x, dy)


@pytest.mark.parametrize("case", ["stride2_pad1", "groups2", "same_3x3", "pointwise"])
def test_empty_batch_convolves_to_empty_images_and_a_zero_filter_gradient(case, rng):
    forward, data, filt, x_shape, w_shape, y_shape = conv_ops(case)
    x_shape, y_shape = (0, *x_shape[1:]), (0, *y_shape[1:])
    x, w, dy = (rng.standard_normal(s) for s in (x_shape, w_shape, y_shape))
    assert_matches(forward, x, w)
    assert_matches(data, w, dy)
    assert_matches(filt, x, dy)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's inf - inf, 0 * inf
@pytest.mark.parametrize("case", ["transposed_pad1", "dilation2", "depthwise", "stride2_pad1"])
def test_non_finite_filters_and_gradients_give_the_reference_nan_and_inf(case, rng):
    """The data gradient adds nothing where a tap falls into the padding; at stride 1 the
    kernel computes it as a convolution of the zero-padded dy, so an infinite tap must not
    multiply that padding (0·inf = NaN where the reference has a finite value)."""
    forward, data, filt, x_shape, w_shape, y_shape = conv_ops(case)
    x, w, dy = (rng.standard_normal(s).astype(np.float32) for s in (x_shape, w_shape, y_shape))
    w.reshape(-1)[::3] = np.inf
    assert_matches(data, w, dy)
    dy.reshape(-1)[1::4] = np.nan
    assert_matches(data, w, dy)
    w.reshape(-1)[::3] = 1.0
    x.reshape(-1)[::5] = -np.inf
    assert_matches(forward, x, w)
    assert_matches(filt, x, dy)


@pytest.mark.parametrize("case", ["stride2_pad1", "groups2"])
def test_convolution_in_chunks_and_in_parallel(case, rng, small_chunks, parallel_loops):
    forward, data, filt, x_shape, w_shape, y_shape = conv_ops(case)
    x, w, dy = (rng.standard_normal(s) for s in (x_shape, w_shape, y_shape))
    assert_matches(forward, x, w)
    assert_matches(data, w, dy)
    assert_matches(filt, x, dy)



WIDE_CASES = {  # padding, stride and dilation that leave whole rows and column runs outside
    "stride3_pad2": ((5, 3, 7, 8), (4, 3, 3, 3), (3, 3), (2, 2), (1, 1), 1),
    "dilation3_pad3": ((5, 2, 6, 9), (4, 2, 2, 3), (1, 2), (3, 3), (3, 2), 1),
    "groups_stride2": ((5, 4, 9, 6), (6, 2, 3, 1), (2, 1), (1, 0), (1, 1), 2),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", list(WIDE_CASES))
def test_convolution_over_threads_in_chunks_of_two(case, dtype, rng, monkeypatch,
                                                   parallel_loops):
    """A batch of 5 over the threads' spans (uneven), each span in chunks of two images and a
    remainder, so every image's columns come from a reused buffer of another image's."""
    x_shape, w_shape, stride, padding, dilation, groups = WIDE_CASES[case]
    params = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    forward = Convolution(**params)
    y_shape = forward.infer(TensorType(x_shape, dtype), TensorType(w_shape, dtype)).shape
    rows = x_shape[1] * w_shape[2] * w_shape[3]
    monkeypatch.setattr(library_conv, "COLUMN_BYTES", 2 * rows * y_shape[2] * y_shape[3]
                        * np.dtype(dtype).itemsize)
    x, w = rng.standard_normal(x_shape).astype(dtype), rng.standard_normal(w_shape).astype(dtype)
    dy = rng.standard_normal(y_shape).astype(dtype)
    for _ in range(2):  # the second call reuses the buffers the first one filled
        assert_matches(forward, x, w)
        assert_matches(ConvolutionBackwardData(**params, image=x_shape[2:]), w, dy)
        assert_matches(ConvolutionBackwardFilter(**params, kernel=w_shape[2:]), x, dy)


POOL_CASES = {  # x shape, kernel, stride, padding, ceil_mode
    "3x3_s2_p1": ((3, 2, 7, 6), (3, 3), (2, 2), (1, 1), False),
    "ceil_pad": ((2, 1, 6, 6), (3, 3), (2, 2), (1, 1), True),
    "non_square": ((1, 2, 4, 9), (2, 4), (1, 3), (1, 2), False),
}


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("mode", ["MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"])
@pytest.mark.parametrize("case", list(POOL_CASES))
def test_pooling_kernels_equal_the_reference(case, mode, dtype, rng):
    shape, kernel, stride, padding, ceil_mode = POOL_CASES[case]
    x = np.round(rng.standard_normal(shape) * 2).astype(dtype)  # ties: the first maximum wins
    op = Pooling(mode, kernel, stride, padding, ceil_mode)
    assert_matches(op, x)
    dy = rng.standard_normal(op.infer(TensorType(shape, dtype)).shape).astype(dtype)
    backward = PoolingBackward(mode, kernel, stride, padding, ceil_mode, shape[2:])
    assert_matches(backward, *((x, dy) if mode == "MAX" else (dy,)))
    if mode == "MAX":
        assert_matches(op, x, rng.standard_normal(shape).astype(dtype))


def test_pooling_in_parallel(rng, parallel_loops):
    x = rng.standard_normal((2, 3, 5, 5))
    assert_matches(Pooling("MAX", (3, 3), (2, 2), (1, 1)), x)
    assert_matches(PoolingBackward("AVERAGE", (3, 3), (2, 2), (1, 1), True, (5, 5)),
                   rng.standard_normal((2, 3, 3, 3)))


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_compiled_cnn_step_equals_the_reference(dtype, rng):
    """conv → BN → ReLU → max-pool → conv (stride 2, groups 2) → avg-pool → transposed
    conv, with every gradient: compiled for the CPU, equal to the reference interpreter."""
    with gc.Graph("cnn_cpu"):
        x = gc.input("x", (2, 2, 8, 8), dtype)
        w1, w2 = gc.param("w1", (4, 2, 3, 3), dtype), gc.param("w2", (4, 2, 3, 3), dtype)
        w3 = gc.param("w3", (4, 2, 2, 2), dtype)
        gamma, beta = gc.param("gamma", (4,), dtype), gc.param("beta", (4,), dtype)
        b1 = gc.param("b1", (4,), dtype)
        h = gc.relu(gc.batch_norm(gc.conv2d(x, w1, padding=1), gamma, beta))
        h = gc.max_pool2d(h, 2)
        h = gc.avg_pool2d(gc.conv2d(h, w2, b1, stride=2, padding=1, groups=2), 2, 1, 1,
                          count_include_pad=False)
        h = gc.conv_transpose2d(h, w3, stride=2)
        loss = (h * h).mean() + gc.adaptive_avg_pool2d(h, (2, 3)).sum()
        params = [x, w1, w2, w3, gamma, beta, b1]
        outputs = [loss, *gc.grad(loss, params)]
    feeds = {p.name: rng.standard_normal(p.shape).astype(dtype) for p in params}
    got = gc.compile(outputs, target="cpu")(**feeds)
    for g, want, p in zip(got, gc.evaluate(outputs, feeds), ["loss", *feeds]):
        assert_close(g, want, rtol=RTOL[np.dtype(dtype)], label=p)


def _forward_in_child(x, w, queue):
    library.PARALLEL_MIN_WORK = 0  # the child's spans go to its own worker threads
    queue.put(run_library_op(Convolution((1, 1), (1, 1)), x, w))


def test_convolution_over_threads_in_a_forked_child(rng, parallel_loops):
    """A child forked after the parent's worker threads started convolves over threads of
    its own (an inherited pool has no threads and would never run the child's spans)."""
    import multiprocessing

    x, w = rng.standard_normal((4, 2, 5, 5)), rng.standard_normal((3, 2, 3, 3))
    op = Convolution((1, 1), (1, 1))
    assert_matches(op, x, w)  # the parent's pool is running now
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_forward_in_child, args=(x, w, queue))
    child.start()
    got = queue.get(timeout=120)
    child.join(timeout=60)
    assert child.exitcode == 0
    assert_close(got, op.reference(x, w), rtol=RTOL[got.dtype], label="forked child")
