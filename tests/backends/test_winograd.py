"""Winograd F(2×2, 3×3) convolutions on the CPU (backends/numba_cpu/library_winograd.py) and
the stride-1 data gradient as a transposed convolution (library_conv), against the numpy
reference interpreter: float64 to 1e-10, float32 to 1e-5 of the output's scale.

Each test also pins the route the kernel took (the kernel's plans), so a change to when
Winograd applies cannot turn these into tests of im2col.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends.numba_cpu import library_winograd
from gradcompiler.backends.numba_cpu.library import library_kernel
from gradcompiler.ir import TensorType
from gradcompiler.ops.conv import Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter

from oracle import assert_close

RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-10}
MIN = library_winograd.MIN_CHANNELS

WINOGRAD_CASES = {  # x shape, output channels, padding
    "same_even": ((3, MIN, 6, 8), MIN, (1, 1)),
    "same_odd": ((1, MIN, 7, 5), MIN + 3, (1, 1)),          # a half tile on both axes
    "valid": ((2, MIN + 2, 5, 6), MIN, (0, 0)),             # no padding: 3×4 outputs
    "wide_padding": ((2, MIN, 3, 4), MIN, (3, 2)),          # whole tiles in the padding
    "one_pixel_out": ((1, MIN, 3, 3), MIN, (0, 0)),
    "uneven_padding": ((3, MIN, 9, 4), MIN + 1, (2, 0)),
}


def ops(case):
    x_shape, outputs, padding = WINOGRAD_CASES[case]
    forward = Convolution(padding=padding)
    w_shape = (outputs, x_shape[1], 3, 3)
    y_shape = forward.infer(TensorType(x_shape, "float64"), TensorType(w_shape, "float64")).shape
    return (forward, ConvolutionBackwardData(padding=padding, image=x_shape[2:]),
            ConvolutionBackwardFilter(padding=padding, kernel=(3, 3)), x_shape, w_shape, y_shape)


def run(op, *inputs):
    """The op's kernel applied once, and the kernel (its plans say which route it took)."""
    kernel = library_kernel(op)
    out_type = op.infer(*(TensorType(x.shape, x.dtype) for x in inputs))
    out = np.empty(out_type.shape, out_type.dtype)
    kernel(*inputs, out=out)
    assert_close(out, op.reference(*inputs), rtol=RTOL[out.dtype], label=op.describe())
    return kernel


def by_winograd(kernel) -> bool:
    """Whether the last call was served by Winograd alone (im2col's plan never built)."""
    return kernel.tiles is not None and kernel.columns is None



@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", list(WINOGRAD_CASES))
def test_winograd_equals_the_reference(case, dtype, rng):
    forward, data, filt, x_shape, w_shape, y_shape = ops(case)
    x, w = rng.standard_normal(x_shape).astype(dtype), rng.standard_normal(w_shape).astype(dtype)
    dy = rng.standard_normal(y_shape).astype(dtype)
    assert by_winograd(run(forward, x, w))
    assert by_winograd(run(filt, x, dy))
    data_kernel = run(data, w, dy)
    if w_shape[0] <= w_shape[1] and max(forward.padding) <= 2:  # a transposed convolution,
        assert by_winograd(data_kernel.as_forward)                 # itself by Winograd


def test_empty_batch(rng):
    """No images: empty outputs and a zero filter gradient (every span empty)."""
    forward, data, filt, x_shape, w_shape, y_shape = ops("same_even")
    x, w, dy = (rng.standard_normal(s) for s in ((0, *x_shape[1:]), w_shape, (0, *y_shape[1:])))
    for op, inputs in ((forward, (x, w)), (filt, (x, dy)), (data, (w, dy))):
        assert run(op, *inputs).tiles is not None or op is data


@pytest.mark.parametrize("case", ["same_odd", "uneven_padding"])
def test_winograd_over_threads_one_image_a_chunk(case, rng, monkeypatch, parallel_loops):
    """A batch of 5 in spans over two threads, a chunk of one image each time, called twice: the
    second call reuses buffers the first left filled with NaN (what the spare tiles read
    must be this call's pixels or zeros: the filter gradient multiplies each spare tile by
    a zero gradient, and 0 · NaN is NaN)."""
    monkeypatch.setattr(library_winograd, "CHUNK_BYTES", 1)
    forward, data, filt, x_shape, w_shape, y_shape = ops(case)
    x_shape, y_shape = (5, *x_shape[1:]), (5, *y_shape[1:])
    x, w, dy = (rng.standard_normal(s) for s in (x_shape, w_shape, y_shape))
    forward_kernel, filter_kernel = library_kernel(forward), library_kernel(filt)
    for scale in (1.0, -3.0):
        for op, kernel, inputs in ((forward, forward_kernel, (scale * x, w)),
                                   (filt, filter_kernel, (scale * x, dy))):
            out = np.empty(op.infer(*(TensorType(a.shape, a.dtype) for a in inputs)).shape)
            kernel(*inputs, out=out)
            assert_close(out, op.reference(*inputs), rtol=1e-10, label=op.describe())
            assert kernel.tiles.threads == 2 and kernel.tiles.chunk == 1 and by_winograd(kernel)
            for buffers in kernel.tiles.buffers:
                for buffer in buffers:
                    buffer.fill(np.nan)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's inf - inf, 0 * inf
@pytest.mark.parametrize("operand", ["x", "w", "dy"])
def test_non_finite_inputs_take_the_direct_sum(operand, rng):
    """Winograd's transforms would make inf − inf = NaN of an inf the direct sum keeps: with a
    NaN or ±inf in an input the kernels fall back to im2col and give the reference's NaN
    and ±inf, position for position."""
    forward, data, filt, x_shape, w_shape, y_shape = ops("same_even")
    values = {"x": rng.standard_normal(x_shape), "w": rng.standard_normal(w_shape),
              "dy": rng.standard_normal(y_shape)}
    flat = values[operand].reshape(-1)
    flat[[3, 40, 41]] = [np.inf, -np.inf, np.nan]
    x, w, dy = values["x"], values["w"], values["dy"]
    kernels = []
    if operand != "dy":
        kernels.append(run(forward, x, w))
    if operand != "w":
        kernels.append(run(filt, x, dy))
    for kernel in kernels:
        assert kernel.tiles is not None and kernel.columns is not None  # tried, then fell back


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("value", [np.inf, np.nan])
@pytest.mark.parametrize("column", [0, 3, 4])
def test_a_non_finite_pixel_anywhere_in_a_row_is_seen(column, value, rng):
    """The plane split reads each row as pixel pairs and an odd width's last pixel alone
    (width 5: pairs (0, 1), (2, 3), then 4): a non-finite pixel in either path makes the
    forward and the filter gradient fall back, with the reference's NaN and inf."""
    forward, data, filt, x_shape, w_shape, y_shape = ops("same_odd")
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    x[0, MIN - 1, 6, column] = value  # the last channel's last row
    for kernel in (run(forward, x, w), run(filt, x, rng.standard_normal(y_shape))):
        assert kernel.tiles is not None and kernel.columns is not None


def test_few_channels_and_other_geometries_take_im2col(rng):
    """Winograd only where it pays and applies: 3×3, stride 1, no dilation, one group, at
    least MIN_CHANNELS channels in and out."""
    x = rng.standard_normal((2, MIN, 6, 6))
    for op, w in ((Convolution(padding=(1, 1)), rng.standard_normal((MIN - 1, MIN, 3, 3))),
                  (Convolution(stride=(2, 2)), rng.standard_normal((MIN, MIN, 3, 3))),
                  (Convolution(dilation=(2, 2), padding=(2, 2)), rng.standard_normal((MIN, MIN, 3, 3))),
                  (Convolution(groups=2), rng.standard_normal((MIN, MIN // 2, 3, 3))),
                  (Convolution(), rng.standard_normal((MIN, MIN, 3, 2)))):
        kernel = run(op, x, w)
        assert kernel.tiles is None and kernel.columns is not None, op


@pytest.mark.parametrize("kernel_size, padding", [((3, 3), (1, 1)), ((2, 3), (1, 2)), ((1, 1), (0, 0)),
                                                 ((2, 2), (2, 1))])
def test_stride_one_data_gradient_as_a_transposed_convolution(kernel_size, padding, rng):
    """At stride 1 the data gradient convolves dy with the flipped, transposed filter (padded
    by dilation·(kernel − 1) − padding), groups and dilation included; where that padding
    would be negative, or dy has more channels than the images, it multiplies into columns
    and folds them back."""
    for groups, dilation, channels, outputs in ((1, (1, 1), 4, 3), (2, (2, 1), 4, 6), (1, (1, 1), 2, 5)):
        params = {"padding": padding, "dilation": dilation, "groups": groups}
        x_shape, w_shape = (2, channels, 7, 8), (outputs, channels // groups, *kernel_size)
        y_shape = Convolution(**params).infer(TensorType(x_shape, "float64"),
                                              TensorType(w_shape, "float64")).shape
        kernel = run(ConvolutionBackwardData(**params, image=x_shape[2:]),
                     rng.standard_normal(w_shape), rng.standard_normal(y_shape))
        fits = all(d * (k - 1) >= p for d, k, p in zip(dilation, kernel_size, padding))
        assert (kernel.as_forward is not None) == (fits and outputs <= channels), params


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_compiled_residual_block_equals_the_reference(dtype, rng, monkeypatch):
    """A residual block of two 3×3 convolutions wide enough for Winograd, with every gradient
    (the data gradient through the transposed convolution): compiled for the CPU, equal to
    the reference interpreter, and served by Winograd (its calls counted)."""
    served = []
    for method in ("forward", "backward_filter"):
        original = getattr(library_winograd.Winograd, method)

        def counted(self, *args, _original=original, _method=method):
            served.append(_method)
            return _original(self, *args)

        monkeypatch.setattr(library_winograd.Winograd, method, counted)
    with gc.Graph("winograd_block"):
        x = gc.param("x", (2, MIN, 6, 7), dtype)
        w1, w2 = gc.param("w1", (MIN, MIN, 3, 3), dtype), gc.param("w2", (MIN, MIN, 3, 3), dtype)
        h = gc.relu(gc.conv2d(x, w1, padding=1))
        y = gc.conv2d(h, w2, padding=1) + x
        loss = (y * y).mean()
        params = [x, w1, w2]
        outputs = [loss, *gc.grad(loss, params)]
    feeds = {p.name: rng.standard_normal(p.shape).astype(dtype) for p in params}
    got = gc.compile(outputs, target="cpu")(**feeds)
    for g, want, name in zip(got, gc.evaluate(outputs, feeds), ["loss", *feeds]):
        assert_close(g, want, rtol=RTOL[np.dtype(dtype)], label=name)
    # two forwards, two filter gradients, two data gradients as transposed forwards
    assert sorted(served) == ["backward_filter"] * 2 + ["forward"] * 4
