"""Direct convolutions on the CPU (backends/numba_cpu/library_direct_conv.py: the forward, the
filter gradient and the strided data gradient by phases) and the stride-1 data gradient as a
transposed convolution (library_conv), against the numpy
reference interpreter: float64 to 1e-10, float32 to 1e-5 of the output's scale.

Each test also pins the route the kernel took (the kernel's plans, and for the forward
whether its tiles stored in place), so a change to when the direct kernels apply cannot turn
these into tests of im2col, or of one of the forward's two ways only.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import replace

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.backends.numba_cpu import library_direct_conv
from gradcompiler.backends.numba_cpu.cpu_profile import PROFILE
from gradcompiler.backends.numba_cpu.library import library_kernel
from gradcompiler.ir import TensorType
from gradcompiler.ops.conv import Convolution, ConvolutionBackwardData, ConvolutionBackwardFilter

from oracle import assert_close

RTOL = {np.dtype(np.float32): 1e-5, np.dtype(np.float64): 1e-10}
MIN = 16
"""The cases' channels: at or above every bound of the direct kernels (`MIN_FILTER_OUTPUTS`,
`MIN_DATA_INPUTS`, `MIN_FILTER_INPUTS`), two tiles of rows, partial tiles above it."""

CASES = {  # x shape, output channels, padding, filter size, stride
    "same_even": ((3, MIN, 6, 8), MIN, (1, 1), (3, 3), (1, 1)),
    "same_odd": ((1, MIN, 7, 5), MIN + 3, (1, 1), (3, 3), (1, 1)),      # a partial tile of channels
    "valid": ((2, MIN + 2, 5, 6), MIN, (0, 0), (3, 3), (1, 1)),         # no padding: 3×4 outputs
    "wide_padding": ((2, MIN, 3, 4), MIN, (3, 2), (3, 3), (1, 1)),      # outputs in the padding only
    "one_pixel_out": ((1, MIN, 3, 3), MIN, (0, 0), (3, 3), (1, 1)),
    "uneven_padding": ((3, MIN, 9, 4), MIN + 1, (2, 0), (3, 3), (1, 1)),
    "five_by_three": ((2, MIN + 4, 7, 9), MIN + 8, (2, 1), (5, 3), (1, 1)),
    "two_by_two": ((2, MIN, 6, 6), 2 * MIN + 8, (0, 1), (2, 2), (1, 1)),  # more than one panel of outputs
    "stride_two": ((2, MIN, 9, 8), 2 * MIN, (1, 1), (3, 3), (2, 2)),     # four phases
    "stride_two_three": ((3, MIN, 10, 11), MIN + 1, (1, 0), (3, 3), (2, 3)),
    "strided_one_by_one": ((2, MIN, 9, 8), MIN, (0, 0), (1, 1), (3, 1)),
    "strided_five_by_four": ((1, MIN + 1, 12, 13), MIN + 4, (2, 1), (5, 4), (2, 2)),
    # even padding at stride 2: a row's even pixels go to column phase 0 (odd padding: phase 1)
    "stride_two_even_padding": ((2, MIN, 9, 11), MIN, (0, 2), (3, 3), (2, 2)),
    # outputs whose width is a multiple of a vector's lanes: tiles of a vector's columns down
    # three rows (float32: 16 lanes; float64: 8), two for the rows left (5 rows: 3 + 2)
    "rows_of_tiles": ((2, MIN, 5, 32), MIN, (1, 1), (3, 3), (1, 1)),
    "rows_of_vectors": ((3, MIN, 4, 16), 2 * MIN, (1, 1), (3, 3), (1, 1)),
    "strided_rows": ((2, MIN, 8, 32), MIN, (1, 1), (3, 3), (2, 2)),        # outputs 4 × 16
    "odd_rows_of_vectors": ((2, MIN, 6, 16), MIN, (1, 1), (3, 3), (2, 1)),  # 3 rows: one wide tile
    # 7 rows: a wide tile of 3 rows and two of 2; float64, 24 channels of dy are whole vectors
    # (transposed where they lie) but not whole tiles (the last tile's columns past them unused)
    "wide_rows": ((2, MIN, 7, 16), MIN + 8, (1, 1), (3, 3), (1, 1)),
    "one_row_of_tiles": ((2, MIN, 1, 32), MIN, (1, 1), (3, 3), (1, 1)),  # tiles of two vectors along it
}

ROWS_IN_PLACE_AVX512 = {"rows_of_tiles", "rows_of_vectors", "strided_rows", "odd_rows_of_vectors", "wide_rows",
                        "one_row_of_tiles"}
IN_PLACE_AVX512 = {np.dtype(np.float32): ROWS_IN_PLACE_AVX512,
                   np.dtype(np.float64): ROWS_IN_PLACE_AVX512 | {"same_even", "strided_one_by_one"}}
"""The cases whose forward stores its tiles in place with AVX-512's tiles (8 rows, 16 float32 lanes),
as `in_place` derives them for that profile."""


def in_place(case: str, dtype, profile=PROFILE) -> bool:
    """Whether the forward stores its tiles into the output in place on `profile` (the others go
    through sums): its output channels fill whole tiles of MR rows, and either each output row
    is whole vectors and the rows split into groups of three (wide tiles, where the CPU has the
    registers for them) and two, or each output row is whole tiles of two vectors."""
    outputs, (out_h, out_w) = CASES[case][1], ops(case)[-1][2:]
    lanes, wide = profile.lanes(dtype), profile.wide_vectors
    rows_split = any((out_h - w * wide) % 2 == 0 for w in range(out_h // wide + 1))
    return outputs % profile.mr == 0 and ((out_w % lanes == 0 and rows_split) or out_w % (2 * lanes) == 0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_the_in_place_rule_gives_the_avx512_cases(dtype):
    """`in_place` evaluated for AVX-512's figures names the cases measured on such a CPU."""
    avx512 = replace(PROFILE, vector_bytes=64, arch="x86_64")
    assert {case for case in CASES if in_place(case, dtype, avx512)} == IN_PLACE_AVX512[np.dtype(dtype)]


def ops(case):
    x_shape, outputs, padding, kernel, stride = CASES[case]
    forward = Convolution(padding=padding, stride=stride)
    w_shape = (outputs, x_shape[1], *kernel)
    y_shape = forward.infer(TensorType(x_shape, "float64"), TensorType(w_shape, "float64")).shape
    return (forward, ConvolutionBackwardData(padding=padding, stride=stride, image=x_shape[2:]),
            ConvolutionBackwardFilter(padding=padding, stride=stride, kernel=kernel), x_shape, w_shape, y_shape)


def run(op, *inputs):
    """The op's kernel applied once, and the kernel (its plans say which route it took)."""
    kernel = library_kernel(op)
    out_type = op.infer(*(TensorType(x.shape, x.dtype) for x in inputs))
    out = np.empty(out_type.shape, out_type.dtype)
    kernel(*inputs, out=out)
    assert_close(out, op.reference(*inputs), rtol=RTOL[out.dtype], label=op.describe())
    return kernel


def by_direct(kernel) -> bool:
    """Whether the last call was served by the direct kernel alone (im2col's plan never built)."""
    return kernel.direct_plan is not None and kernel.columns is None


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case", list(CASES))
def test_direct_equals_the_reference(case, dtype, rng):
    forward, data, filt, *shapes = ops(case)
    x, w, dy = (rng.standard_normal(shape).astype(dtype) for shape in shapes)
    forward_kernel = run(forward, x, w)
    assert by_direct(forward_kernel)
    stored_in_place = in_place(case, dtype)
    assert (forward_kernel.direct_plan.row_tiles is not None) == stored_in_place, case
    assert (forward_kernel.direct_plan.forward_sums is None) == stored_in_place, case
    assert by_direct(run(filt, x, dy))
    data_kernel = run(data, w, dy)
    transposed = forward.stride == (1, 1) and w.shape[0] <= w.shape[1] and all(
        k - 1 >= p for k, p in zip(w.shape[2:], forward.padding))
    assert (data_kernel.as_forward is not None) == transposed, case  # a transposed convolution,
    if transposed:
        assert by_direct(data_kernel.as_forward)                   # itself direct
    else:                                                          # or strided: by phases
        assert by_direct(data_kernel) == (forward.stride != (1, 1)), case


def into_a_strided_output(op, inputs, shape):
    """The op's kernel applied once into a view of a larger buffer (not contiguous): checked
    against the reference, and the rest of the buffer untouched. Returns the kernel."""
    kernel = library_kernel(op)
    whole = np.full((shape[0], shape[1] + 1, *shape[2:]), 7.0)
    kernel(*inputs, out=whole[:, 1:])
    assert_close(whole[:, 1:], op.reference(*inputs), rtol=1e-10, label=op.describe())
    assert (whole[:, 0] == 7.0).all()
    return kernel


@pytest.mark.parametrize("case", ["rows_of_tiles", "rows_of_vectors"])
def test_forward_into_a_strided_output_goes_through_sums(case, rng):
    """An output that is not contiguous cannot take the tiles in place, even where its shape
    would (`in_place`): the forward computes the sums and copies them out, and writes nothing
    else."""
    forward, _, _, x_shape, w_shape, y_shape = ops(case)
    kernel = into_a_strided_output(forward, (rng.standard_normal(x_shape), rng.standard_normal(w_shape)), y_shape)
    assert (kernel.direct_plan.row_tiles is not None) == in_place(case, np.float64)
    assert kernel.direct_plan.forward_sums is not None


@pytest.mark.parametrize("case", ["stride_two", "stride_two_three"])
def test_strided_data_gradient_into_a_strided_output(case, rng):
    """The phases are interleaved into dx flat, so an output that is not contiguous gets a
    contiguous copy that is written into it once."""
    _, data, _, x_shape, w_shape, y_shape = ops(case)
    assert by_direct(into_a_strided_output(data, (rng.standard_normal(w_shape), rng.standard_normal(y_shape)),
                                           x_shape))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("case, route", [("rows_of_tiles", "in place"), ("same_odd", "spread")])
def test_filter_gradient_transposes_dy_in_place_or_through_rows(case, route, dtype, rng, monkeypatch):
    """dy whose channels and pixels are whole vectors (16 channels of 5 × 32 pixels) is transposed
    where it lies; other shapes (19 channels of 7 × 5) go through rows padded with zeros."""
    _, _, filt, x_shape, _, y_shape = ops(case)
    routes = []
    images = library_direct_conv._filter_gradient_images

    def recording(x, dy, first, stop, image, spread, *rest):
        routes.append("in place" if spread.shape[0] == 0 else "spread")
        images(x, dy, first, stop, image, spread, *rest)

    monkeypatch.setattr(library_direct_conv, "_filter_gradient_images", recording)
    x, dy = rng.standard_normal(x_shape).astype(dtype), rng.standard_normal(y_shape).astype(dtype)
    assert by_direct(run(filt, x, dy))
    assert set(routes) == {route}


def test_empty_batch(rng):
    """No images: empty outputs and a zero filter gradient (every span empty)."""
    forward, data, filt, x_shape, w_shape, y_shape = ops("same_even")
    x, w, dy = (rng.standard_normal(s) for s in ((0, *x_shape[1:]), w_shape, (0, *y_shape[1:])))
    for op, inputs in ((forward, (x, w)), (filt, (x, dy)), (data, (w, dy))):
        assert run(op, *inputs).direct_plan is not None or op is data


@pytest.mark.parametrize("size, padding, stride", [
    ((5, 7), (1, 1), (1, 1)), ((6, 6), (1, 1), (2, 2)), ((7, 5), (1, 2), (2, 2)), ((4, 4), (0, 0), (2, 2)),
    ((5, 9), (0, 3), (3, 2)), ((6, 7), (2, 1), (1, 3)), ((5, 5), (1, 0), (2, 1)), ((9, 8), (2, 2), (3, 3))])
def test_padded_image_phases_against_a_loop_over_every_pixel(size, padding, stride, rng):
    """`_pad_image`, which every direct kernel reads, against a plain loop: padded pixel (r, s) of
    channel c at ((r mod stride_h)·stride_w + s mod stride_w)·channels + c)·plane + (r div stride_h)
    ·pitch + s div stride_w, zero in the padding and in each plane's spare elements; a buffer of
    more channels than the image's keeps its other planes untouched. Strides 1 to 3 per axis
    (stride_w 2: both column phases filled by one loop over pixel pairs), paddings 0 to 3, odd
    and even sizes."""
    (height, width), (pad_h, pad_w), (stride_h, stride_w) = size, padding, stride
    x = rng.standard_normal((3, 2, height, width)).astype(np.float32)
    pitch = -(-(width + 2 * pad_w) // stride_w) + 1
    lines = -(-(height + 2 * pad_h) // stride_h)
    plane, channels_up = lines * pitch + 5, 3
    image = np.full(stride_h * stride_w * channels_up * plane, np.nan, np.float32)
    library_direct_conv._pad_image(x, 1, image, pad_h, pad_w, stride_h, stride_w, pitch, plane)
    want = np.full_like(image, np.nan)
    for phase in range(stride_h * stride_w):
        for c in range(x.shape[1]):
            want[(phase * channels_up + c) * plane:(phase * channels_up + c + 1) * plane] = 0
    for r in range(height + 2 * pad_h):
        for s in range(width + 2 * pad_w):
            ih, iw = r - pad_h, s - pad_w
            for c in range(x.shape[1]):
                phase = (r % stride_h) * stride_w + s % stride_w
                inside = 0 <= ih < height and 0 <= iw < width
                want[(phase * channels_up + c) * plane + r // stride_h * pitch + s // stride_w] = (
                    x[1, c, ih, iw] if inside else 0)
    np.testing.assert_array_equal(image, want)


def buffers(plan) -> list:
    """Every buffer a direct plan holds for its threads."""
    if isinstance(plan, library_direct_conv.PhasedDataGradient):
        return [part for parts in plan.buffers for part in parts]
    return [*(plan.forward_images or ()), *(plan.forward_sums or ()),
            *(part for parts in plan.filter_buffers or () for part in parts),
            *(() if plan.filter_sums is None else (plan.filter_sums,))]


@pytest.mark.parametrize("case", ["same_odd", "uneven_padding", "stride_two_three", "strided_rows", "wide_rows"])
def test_direct_over_threads_reusing_buffers(case, rng, parallel_loops):
    """A batch of 5 in spans over two threads, called twice: the second call reuses buffers the
    first left filled with NaN (what the tiles read must be this call's pixels, or zeros that
    this call wrote: the padding around each image; a stale NaN in it would reach every
    output whose window covers it). The data gradient is direct at stride > 1 (by phases)."""
    forward, data, filt, x_shape, w_shape, y_shape = ops(case)
    x_shape, y_shape = (5, *x_shape[1:]), (5, *y_shape[1:])
    x, w, dy = (rng.standard_normal(s) for s in (x_shape, w_shape, y_shape))
    kernels = [library_kernel(op) for op in (forward, filt, data)]
    for scale in (1.0, -3.0):
        calls = ((scale * x, w), (scale * x, dy), (w, scale * dy))
        for op, kernel, inputs in zip((forward, filt, data), kernels, calls):
            out = np.empty(op.infer(*(TensorType(a.shape, a.dtype) for a in inputs)).shape)
            kernel(*inputs, out=out)
            assert_close(out, op.reference(*inputs), rtol=1e-10, label=op.describe())
            if op is data and forward.stride == (1, 1):
                continue
            plan = kernel.direct_plan
            assert plan.threads == 2 and by_direct(kernel)
            for buffer in buffers(plan):
                buffer.fill(np.nan)


def test_the_filter_gradient_does_not_depend_on_which_thread_takes_which_span(rng, parallel_loops,
                                                                             monkeypatch):
    """Threads take spans of images as they come free (`in_spans`). Each span sums into sums of
    its own, added in span order, so the result is bitwise the same when one thread takes
    every span (sums per thread rounded differently: 1e-4 apart in the cnn's stride-2 filter
    gradient, between two calls)."""
    _, _, filt, x_shape, _, y_shape = ops("rows_of_tiles")
    x = rng.standard_normal((12, *x_shape[1:])).astype(np.float32)
    dy = rng.standard_normal((12, *y_shape[1:])).astype(np.float32)
    kernel = run(filt, x, dy)
    assert kernel.direct_plan.threads == 2 and len(kernel.direct_plan.spans) > 2
    shared = np.empty(filt.infer(TensorType(x.shape, x.dtype), TensorType(dy.shape, dy.dtype)).shape, np.float32)
    kernel(x, dy, out=shared)

    def one_thread(work, spans, threads=None):
        return [work(0, *span) for span in spans]

    monkeypatch.setattr(library_direct_conv, "in_spans", one_thread)
    alone = np.empty_like(shared)
    kernel(x, dy, out=alone)
    np.testing.assert_array_equal(alone, shared)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the reference's inf - inf, 0 * inf
@pytest.mark.parametrize("operand", ["x", "w", "dy"])
@pytest.mark.parametrize("case", ["same_even", "rows_of_tiles", "strided_rows", "strided_five_by_four"])
def test_non_finite_inputs_give_the_reference_values(case, operand, rng):
    """A NaN or ±inf in an input gives the reference's NaN and ±inf, position for position, and
    the kernels stay direct: the forward's spare pixels (summed, at the image's pitch) are
    never stored, and the filter gradient sums over the output's own pixels only. The data
    gradient by phases multiplies dy's padding by the filter, so it is direct for a finite
    filter only (a non-finite one goes to col2im)."""
    forward, data, filt, x_shape, w_shape, y_shape = ops(case)
    values = {"x": rng.standard_normal(x_shape), "w": rng.standard_normal(w_shape),
              "dy": rng.standard_normal(y_shape)}
    flat = values[operand].reshape(-1)
    flat[[3, 40, 41]] = [np.inf, -np.inf, np.nan]
    x, w, dy = values["x"], values["w"], values["dy"]
    if operand != "dy":
        assert by_direct(run(forward, x, w))
    if operand != "w":
        assert by_direct(run(filt, x, dy))
    if operand != "x" and forward.stride != (1, 1):
        assert by_direct(run(data, w, dy)) == (operand == "dy")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
@pytest.mark.parametrize("case", ["same_odd", "stride_two_three", "rows_of_vectors"])
@pytest.mark.parametrize("value", [np.inf, np.nan])
@pytest.mark.parametrize("where", ["first", "last"])
def test_a_non_finite_pixel_at_either_end_of_a_row(case, where, value, rng):
    """The image is copied a row at a time, contiguously at stride 1 and a phase's columns at a
    time otherwise, between zeros written around it: a non-finite pixel at either end of a
    row reaches the outputs and filter taps the reference gives NaN or inf, and no other."""
    forward, data, filt, x_shape, w_shape, y_shape = ops(case)
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    x[0, x_shape[1] - 1, x_shape[2] - 1, 0 if where == "first" else x_shape[3] - 1] = value
    assert by_direct(run(forward, x, w))
    assert by_direct(run(filt, x, rng.standard_normal(y_shape)))
    dy = rng.standard_normal(y_shape)
    dy[0, y_shape[1] - 1, y_shape[2] - 1, 0 if where == "first" else y_shape[3] - 1] = value
    data_kernel = run(data, w, dy)
    assert by_direct(data_kernel) == (forward.stride != (1, 1))


def test_few_channels_and_other_geometries_take_im2col(rng):
    """The direct kernels only where they pay and apply: no dilation, one group, not a 1×1
    filter at stride 1; for the filter gradient at least MIN_FILTER_OUTPUTS output and
    MIN_FILTER_INPUTS input channels, for the data gradient at stride > 1 at least
    MIN_DATA_INPUTS input channels."""
    assert MIN >= max(library_direct_conv.MIN_FILTER_OUTPUTS, library_direct_conv.MIN_DATA_INPUTS,
                      library_direct_conv.MIN_FILTER_INPUTS)
    x = rng.standard_normal((2, MIN, 6, 6))
    for op, w in ((Convolution(dilation=(2, 2), padding=(2, 2)), rng.standard_normal((MIN, MIN, 3, 3))),
                  (Convolution(groups=2), rng.standard_normal((MIN, MIN // 2, 3, 3))),
                  (Convolution(), rng.standard_normal((MIN, MIN, 1, 1)))):
        kernel = run(op, x, w)
        assert kernel.direct_plan is None and kernel.columns is not None, op
    inputs = library_direct_conv.MIN_FILTER_INPUTS
    few = rng.standard_normal((2, inputs - 1, 6, 6))  # an RGB stem: a direct forward, im2col's filter gradient
    assert by_direct(run(Convolution(padding=(1, 1)), few, rng.standard_normal((MIN, inputs - 1, 3, 3))))
    kernel = run(ConvolutionBackwardFilter(padding=(1, 1), kernel=(3, 3)), few, rng.standard_normal((2, MIN, 6, 6)))
    assert kernel.direct_plan is None and kernel.columns is not None
    enough = rng.standard_normal((2, inputs, 6, 6))  # both direct
    assert by_direct(run(ConvolutionBackwardFilter(padding=(1, 1), kernel=(3, 3)), enough,
                         rng.standard_normal((2, MIN, 6, 6))))
    outputs = library_direct_conv.MIN_FILTER_OUTPUTS
    for o, direct in ((outputs - 1, False), (outputs, True)):
        kernel = run(ConvolutionBackwardFilter(padding=(1, 1), kernel=(3, 3)), x, rng.standard_normal((2, o, 6, 6)))
        assert by_direct(kernel) == direct and (kernel.columns is None) == direct, o
    data_inputs = library_direct_conv.MIN_DATA_INPUTS
    for c, direct in ((data_inputs - 1, False), (data_inputs, True)):
        data = ConvolutionBackwardData(padding=(1, 1), stride=(2, 2), image=(6, 6))
        kernel = run(data, rng.standard_normal((MIN, c, 3, 3)), rng.standard_normal((2, MIN, 3, 3)))
        assert by_direct(kernel) == direct and (kernel.columns is None) == direct, c


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("outputs, stride", [(1, (1, 1)), (3, (1, 1)), (5, (2, 2)), (7, (2, 1))])
def test_narrow_forwards_take_the_direct_kernel(outputs, stride, dtype, rng):
    """The forward takes the direct kernel at any count of output channels: fewer than a tile's
    rows (MR), the rows past O are padding, and only O rows reach y. Three input channels (an
    RGB image), odd sizes, both dtypes, against the reference."""
    x = rng.standard_normal((2, 3, 7, 9)).astype(dtype)
    w = rng.standard_normal((outputs, 3, 3, 3)).astype(dtype)
    assert by_direct(run(Convolution(padding=(1, 1), stride=stride), x, w))


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


def counted_calls(monkeypatch) -> list[str]:
    """The direct plans' calls, by method, as a compiled step makes them."""
    served = []
    for kind, method in ((library_direct_conv.DirectConvolution, "forward"),
                         (library_direct_conv.DirectConvolution, "backward_filter"),
                         (library_direct_conv.PhasedDataGradient, "backward_data")):
        original = getattr(kind, method)

        def counted(self, *args, _original=original, _method=method):
            served.append(_method)
            return _original(self, *args)

        monkeypatch.setattr(kind, method, counted)
    return served


LAYERS = {  # the second convolution's outputs and stride, whether x is added back, the direct calls
    # two forwards, two filter gradients, two data gradients as transposed forwards
    "residual_block": (MIN, 1, True, {"forward": 4, "backward_filter": 2}),
    # the stride-1 layer's data gradient as a transposed forward, the stride-2 one's by phases
    "strided_layer": (2 * MIN, 2, False, {"forward": 3, "backward_filter": 2, "backward_data": 1}),
}


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layer", list(LAYERS))
def test_compiled_layers_equal_the_reference(layer, dtype, rng, monkeypatch):
    """Two 3×3 convolutions wide enough for the direct kernels (a residual block, or a stride-2
    layer after a stride-1 one), with every gradient: compiled for the CPU, equal to the
    reference interpreter, and served by the direct kernels (their calls counted)."""
    outputs_2, stride, residual, calls = LAYERS[layer]
    served = counted_calls(monkeypatch)
    with gc.Graph(layer):
        x = gc.param("x", (2, MIN, 7, 8), dtype)
        w1, w2 = gc.param("w1", (MIN, MIN, 3, 3), dtype), gc.param("w2", (outputs_2, MIN, 3, 3), dtype)
        h = gc.relu(gc.conv2d(x, w1, padding=1))
        y = gc.conv2d(h, w2, stride=stride, padding=1)
        y = y + x if residual else y
        loss = (y * y).mean()
        params = [x, w1, w2]
        outputs = [loss, *gc.grad(loss, params)]
    feeds = {p.name: rng.standard_normal(p.shape).astype(dtype) for p in params}
    got = gc.compile(outputs, target="cpu")(**feeds)
    for g, want, name in zip(got, gc.evaluate(outputs, feeds), ["loss", *feeds]):
        assert_close(g, want, rtol=RTOL[np.dtype(dtype)], label=name)
    assert Counter(served) == calls
