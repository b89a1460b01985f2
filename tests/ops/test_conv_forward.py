"""Forward values of the convolution and pooling ops and of the CNN composites
(conv2d, conv_transpose2d, max/avg/adaptive pooling, batch_norm).

Oracles: direct nested loops over every output (or input) element written
here in plain Python from torch.nn.functional's definitions, in float64.
"""

from __future__ import annotations

import numpy as np
import pytest

import gradcompiler as gc
from gradcompiler.ops.conv import ConvolutionBackwardData, ConvolutionBackwardFilter
from gradcompiler.ops.pool import Pooling, PoolingBackward

from oracle import assert_close
from pool_cases import KERNEL, PADDING, STRIDE, max_pool_loop, non_finite_images

COVERS = {"Convolution", "ConvolutionBackwardData", "ConvolutionBackwardFilter", "Pooling",
          "PoolingBackward"}


# -- the independent oracles --------------------------------------------------------------------

def out_size(size, k, s, p, d):
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def conv_taps(x_shape, w_shape, stride, padding, dilation, groups):
    """Every (n, o, oh, ow, c, kh, kw, ih, iw) term of the convolution sum that reads the image."""
    n_, _, h, w = x_shape
    o_, cg, kh_, kw_ = w_shape
    og = o_ // groups
    oh_ = out_size(h, kh_, stride[0], padding[0], dilation[0])
    ow_ = out_size(w, kw_, stride[1], padding[1], dilation[1])
    for n in range(n_):
        for o in range(o_):
            for oh in range(oh_):
                for ow in range(ow_):
                    for ci in range(cg):
                        c = (o // og) * cg + ci
                        for kh in range(kh_):
                            for kw in range(kw_):
                                ih = oh * stride[0] - padding[0] + kh * dilation[0]
                                iw = ow * stride[1] - padding[1] + kw * dilation[1]
                                if 0 <= ih < h and 0 <= iw < w:
                                    yield n, o, oh, ow, c, ci, kh, kw, ih, iw


def conv_loop(x, w, stride=(1, 1), padding=(0, 0), dilation=(1, 1), groups=1):
    y = np.zeros((x.shape[0], w.shape[0],
                  out_size(x.shape[2], w.shape[2], stride[0], padding[0], dilation[0]),
                  out_size(x.shape[3], w.shape[3], stride[1], padding[1], dilation[1])))
    for n, o, oh, ow, c, ci, kh, kw, ih, iw in conv_taps(x.shape, w.shape, stride, padding,
                                                         dilation, groups):
        y[n, o, oh, ow] += x[n, c, ih, iw] * w[o, ci, kh, kw]
    return y


def conv_data_loop(w, dy, x_shape, stride, padding, dilation, groups):
    dx = np.zeros(x_shape)
    for n, o, oh, ow, c, ci, kh, kw, ih, iw in conv_taps(x_shape, w.shape, stride, padding,
                                                         dilation, groups):
        dx[n, c, ih, iw] += dy[n, o, oh, ow] * w[o, ci, kh, kw]
    return dx


def conv_filter_loop(x, dy, w_shape, stride, padding, dilation, groups):
    dw = np.zeros(w_shape)
    for n, o, oh, ow, c, ci, kh, kw, ih, iw in conv_taps(x.shape, w_shape, stride, padding,
                                                         dilation, groups):
        dw[o, ci, kh, kw] += dy[n, o, oh, ow] * x[n, c, ih, iw]
    return dw


def pool_windows(h, w, kernel, stride, padding, ceil_mode):
    """torch's windows: (oh, ow, rows in the image, cols in the image, padded-window size)."""
    def axis(size, k, s, p):
        out = (size + 2 * p - k + (s - 1 if ceil_mode else 0)) // s + 1
        if ceil_mode and (out - 1) * s >= size + p:
            out -= 1
        spans = []
        for i in range(out):
            start = i * s - p
            end = min(start + k, size + p)
            spans.append((range(max(start, 0), min(end, size)), end - start))
        return spans

    for oh, (rows, size_h) in enumerate(axis(h, kernel[0], stride[0], padding[0])):
        for ow, (cols, size_w) in enumerate(axis(w, kernel[1], stride[1], padding[1])):
            yield oh, ow, rows, cols, size_h * size_w


def pool_loop(x, mode, kernel, stride, padding, ceil_mode=False, dy=None):
    """Pooling of x (dy None), or the gradient wrt x of Σ dy·pool(x)."""
    windows = list(pool_windows(*x.shape[2:], kernel, stride, padding, ceil_mode))
    oh_n = max(win[0] for win in windows) + 1
    ow_n = max(win[1] for win in windows) + 1
    y, dx = np.zeros((*x.shape[:2], oh_n, ow_n)), np.zeros(x.shape)
    for n in range(x.shape[0]):
        for c in range(x.shape[1]):
            for oh, ow, rows, cols, size in windows:
                cells = [(i, j) for i in rows for j in cols]
                if mode == "MAX":
                    best = cells[0]
                    for cell in cells:
                        if x[n, c, cell[0], cell[1]] > x[n, c, best[0], best[1]]:
                            best = cell
                    y[n, c, oh, ow] = x[n, c, best[0], best[1]]
                    if dy is not None:
                        dx[n, c, best[0], best[1]] += dy[n, c, oh, ow]
                    continue
                divisor = size if mode == "AVERAGE" else len(cells)
                y[n, c, oh, ow] = sum(x[n, c, i, j] for i, j in cells) / divisor
                if dy is not None:
                    for i, j in cells:
                        dx[n, c, i, j] += dy[n, c, oh, ow] / divisor
    return y if dy is None else dx


def run(build, feeds):
    with gc.Graph("conv_forward"):
        inputs = {k: gc.input(k, v.shape, v.dtype.name) for k, v in feeds.items()}
        out = build(**inputs)
        return gc.evaluate(out, feeds)


# -- convolution ----------------------------------------------------------------------------------

CONV_CASES = {  # x shape, w shape, stride, padding, dilation, groups
    "plain": ((1, 2, 5, 5), (3, 2, 3, 3), (1, 1), (0, 0), (1, 1), 1),
    "stride2_pad1": ((3, 2, 6, 7), (4, 2, 3, 3), (2, 2), (1, 1), (1, 1), 1),
    "dilation2": ((1, 3, 7, 6), (2, 3, 3, 2), (1, 1), (1, 0), (2, 2), 1),
    "groups2": ((3, 4, 5, 5), (6, 2, 3, 3), (1, 2), (1, 1), (1, 1), 2),
    "depthwise": ((2, 3, 6, 5), (3, 1, 3, 3), (1, 1), (1, 1), (1, 1), 3),
    "pointwise": ((3, 4, 3, 5), (5, 4, 1, 1), (1, 1), (0, 0), (1, 1), 1),
    "pointwise_stride2": ((1, 4, 5, 5), (2, 4, 1, 1), (2, 2), (0, 0), (1, 1), 1),
    "non_square": ((1, 2, 4, 9), (3, 2, 2, 4), (1, 3), (1, 2), (1, 2), 1),
    "kernel_fills_image": ((2, 1, 3, 4), (1, 1, 3, 4), (1, 1), (0, 0), (1, 1), 1),
}


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_conv2d_equals_nested_loops(case, rng):
    x_shape, w_shape, stride, padding, dilation, groups = CONV_CASES[case]
    feeds = {"x": rng.standard_normal(x_shape), "w": rng.standard_normal(w_shape),
             "b": rng.standard_normal(w_shape[0])}
    got = run(lambda x, w, b: gc.conv2d(x, w, b, stride, padding, dilation, groups), feeds)
    want = conv_loop(feeds["x"], feeds["w"], stride, padding, dilation, groups)
    assert_close(got, want + feeds["b"][None, :, None, None], rtol=1e-12)


def test_conv2d_takes_ints_as_pairs_and_float32(rng):
    feeds = {"x": rng.standard_normal((1, 2, 6, 6)).astype(np.float32),
             "w": rng.standard_normal((3, 2, 3, 3)).astype(np.float32)}
    got = run(lambda x, w: gc.conv2d(x, w, stride=2, padding=1, dilation=1), feeds)
    want = conv_loop(feeds["x"].astype(np.float64), feeds["w"].astype(np.float64), (2, 2), (1, 1))
    assert_close(got, want.astype(np.float32), rtol=1e-5)


@pytest.mark.parametrize("case", list(CONV_CASES))
def test_backward_ops_equal_nested_loops(case, rng):
    x_shape, w_shape, stride, padding, dilation, groups = CONV_CASES[case]
    x, w = rng.standard_normal(x_shape), rng.standard_normal(w_shape)
    y_shape = conv_loop(x, w, stride, padding, dilation, groups).shape
    dy = rng.standard_normal(y_shape)
    params = {"stride": stride, "padding": padding, "dilation": dilation, "groups": groups}
    got_data = run(lambda w, dy: gc.apply(ConvolutionBackwardData(
        **params, image=x_shape[2:]), w, dy), {"w": w, "dy": dy})
    assert_close(got_data, conv_data_loop(w, dy, x_shape, stride, padding, dilation, groups),
                 rtol=1e-12)
    got_filter = run(lambda x, dy: gc.apply(ConvolutionBackwardFilter(
        **params, kernel=w_shape[2:]), x, dy), {"x": x, "dy": dy})
    assert_close(got_filter, conv_filter_loop(x, dy, w_shape, stride, padding, dilation, groups),
                 rtol=1e-12)


@pytest.mark.parametrize("stride,padding,output_padding,dilation,groups", [
    ((1, 1), (0, 0), (0, 0), (1, 1), 1),
    ((2, 2), (1, 1), (1, 0), (1, 1), 1),
    ((2, 3), (0, 1), (1, 2), (1, 1), 2),
    ((2, 1), (1, 1), (1, 0), (2, 2), 1),
])
def test_conv_transpose2d_is_the_adjoint_loop(stride, padding, output_padding, dilation, groups,
                                              rng):
    x = rng.standard_normal((3, 4, 3, 4))
    w = rng.standard_normal((4, 3, 3, 2))  # (C_in, C_out / groups, KH, KW)
    b = rng.standard_normal(3 * groups)
    got = run(lambda x, w, b: gc.conv_transpose2d(x, w, b, stride, padding, output_padding,
                                                  dilation, groups), {"x": x, "w": w, "b": b})
    size = [(x.shape[2 + a] - 1) * stride[a] - 2 * padding[a] + dilation[a] * (w.shape[2 + a] - 1)
            + output_padding[a] + 1 for a in range(2)]
    # transposed convolution: scatter every input pixel through the filter, the adjoint of conv2d
    want = conv_data_loop(w, x, (3, 3 * groups, *size), stride, padding, dilation, groups)
    assert_close(got, want + b[None, :, None, None], rtol=1e-12)


# -- pooling --------------------------------------------------------------------------------------

POOL_CASES = {  # x shape, kernel, stride, padding, ceil_mode
    "2x2": ((1, 2, 4, 6), (2, 2), (2, 2), (0, 0), False),
    "3x3_s2_p1": ((3, 2, 7, 6), (3, 3), (2, 2), (1, 1), False),
    "overlap": ((2, 1, 5, 5), (3, 2), (1, 1), (1, 1), False),
    "ceil": ((1, 2, 5, 7), (2, 3), (2, 2), (0, 1), True),
    "ceil_pad": ((2, 1, 6, 6), (3, 3), (2, 2), (1, 1), True),
    "non_square": ((1, 1, 4, 9), (2, 4), (1, 3), (1, 2), False),
}


@pytest.mark.parametrize("mode", ["MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING"])
@pytest.mark.parametrize("case", list(POOL_CASES))
def test_pooling_and_its_backward_equal_nested_loops(mode, case, rng):
    shape, kernel, stride, padding, ceil_mode = POOL_CASES[case]
    x = rng.standard_normal(shape)
    if mode == "MAX":  # ties: the first maximum of the window in row-major order wins
        x = np.round(x)
        def build(x):
            return gc.max_pool2d(x, kernel, stride, padding, ceil_mode)
    else:
        include = mode == "AVERAGE"
        def build(x):
            return gc.avg_pool2d(x, kernel, stride, padding, ceil_mode, include)
    want = pool_loop(x, mode, kernel, stride, padding, ceil_mode)
    assert_close(run(build, {"x": x}), want, rtol=1e-12)
    dy = rng.standard_normal(want.shape)
    backward = PoolingBackward(mode, kernel, stride, padding, ceil_mode, shape[2:])
    inputs = {"x": x, "dy": dy} if mode == "MAX" else {"dy": dy}
    got = run(lambda **t: gc.apply(backward, *t.values()), inputs)
    assert_close(got, pool_loop(x, mode, kernel, stride, padding, ceil_mode, dy), rtol=1e-12)


@pytest.mark.parametrize("case", ["all_nan", "all_minus_inf", "nan_among_finite", "two_nans_and_inf",
                                  "padding_first_minus_inf"])
@pytest.mark.parametrize("where", ["reference", "cpu"])
def test_max_pooling_of_non_finite_windows_follows_torchs_rule(case, where, rng):
    """A window holding a NaN yields NaN and its last NaN takes the gradient; padding is never
    picked, so a window whose image pixels are all -inf yields -inf and routes the gradient to
    its first image pixel: the reference interpreter and the compiled CPU kernels against
    torch's rule written as a loop (pool_cases)."""
    x = non_finite_images(rng)[case]
    dy = rng.standard_normal(max_pool_loop(x).shape)
    backward = PoolingBackward("MAX", KERNEL, STRIDE, PADDING, False, x.shape[2:])
    with gc.Graph("max_pool"):
        xs, dys = gc.input("x", x.shape, "float64"), gc.input("dy", dy.shape, "float64")
        outputs = [gc.max_pool2d(xs, KERNEL, STRIDE, PADDING), gc.apply(backward, xs, dys)]
        if where == "reference":
            y, dx = gc.evaluate(outputs, {"x": x, "dy": dy})
        else:
            y, dx = gc.compile(outputs)(x=x, dy=dy)
    assert_close(y, max_pool_loop(x), rtol=0, label=case)
    assert_close(dx, max_pool_loop(x, dy), rtol=1e-15, label=case)


def test_max_pooling_with_values_reads_them_at_the_first_maximum(rng):
    x = np.array([[[[1.0, 3.0, 3.0], [0.0, 2.0, 3.0]]]])
    values = rng.standard_normal(x.shape)
    op = Pooling("MAX", (2, 2), (1, 1))
    got = run(lambda x, v: gc.apply(op, x, v), {"x": x, "v": values})
    # window 0 holds 1, 3, 0, 2: the 3 at (0, 1); window 1 holds 3, 3, 2, 3: the first, (0, 1)
    assert_close(got, values[:, :, 0:1, [1, 1]], rtol=0)


@pytest.mark.parametrize("shape,out", [((2, 3, 6, 4), (3, 2)), ((1, 2, 5, 7), (3, 4)),
                                       ((3, 2, 4, 5), 1), ((1, 1, 7, 3), (2, 3))])
def test_adaptive_avg_pool2d_uses_torchs_windows(shape, out, rng):
    x = rng.standard_normal(shape)
    oh, ow = (out, out) if isinstance(out, int) else out
    want = np.zeros((*shape[:2], oh, ow))
    for i in range(oh):
        rows = slice(i * shape[2] // oh, -(-(i + 1) * shape[2] // oh))
        for j in range(ow):
            cols = slice(j * shape[3] // ow, -(-(j + 1) * shape[3] // ow))
            want[:, :, i, j] = x[:, :, rows, cols].mean(axis=(2, 3))
    assert_close(run(lambda x: gc.adaptive_avg_pool2d(x, out), {"x": x}), want, rtol=1e-12)


# -- batch norm ----------------------------------------------------------------------------------

def batch_norm_loop(x, gamma, beta, eps):
    """Per channel: the batch mean and biased variance over (N, H, W), then the affine map."""
    y = np.empty_like(x)
    stats = []
    for c in range(x.shape[1]):
        values = x[:, c].ravel()
        mu = sum(values) / values.size
        var = sum((v - mu) ** 2 for v in values) / values.size
        y[:, c] = (x[:, c] - mu) / np.sqrt(var + eps) * gamma[c] + beta[c]
        stats.append((mu, var * values.size / (values.size - 1)))
    return y, np.array(stats)


@pytest.mark.parametrize("shape", [(3, 2, 4, 5), (1, 3, 2, 2), (6, 4)])
def test_batch_norm_training_normalises_and_updates_running_stats(shape, rng):
    c = shape[1]
    feeds = {"x": 2 + 3 * rng.standard_normal(shape), "g": rng.standard_normal(c),
             "b": rng.standard_normal(c), "rm": rng.standard_normal(c),
             "rv": 1 + rng.random(c)}
    got = run(lambda x, g, b, rm, rv: list(gc.batch_norm(x, g, b, rm, rv, momentum=0.3,
                                                          eps=1e-3)), feeds)
    y, stats = batch_norm_loop(feeds["x"], feeds["g"], feeds["b"], 1e-3)
    assert_close(got[0], y, rtol=1e-12)
    assert_close(got[1], 0.7 * feeds["rm"] + 0.3 * stats[:, 0], rtol=1e-12)
    assert_close(got[2], 0.7 * feeds["rv"] + 0.3 * stats[:, 1], rtol=1e-12)
    plain = run(lambda x, g, b: gc.batch_norm(x, g, b, eps=1e-3),
                {k: feeds[k] for k in ("x", "g", "b")})
    assert_close(plain, y, rtol=1e-12)


def test_batch_norm_inference_uses_the_running_stats(rng):
    feeds = {"x": rng.standard_normal((2, 3, 2, 2)), "g": rng.standard_normal(3),
             "b": rng.standard_normal(3), "rm": rng.standard_normal(3), "rv": 1 + rng.random(3)}
    got = run(lambda x, g, b, rm, rv: gc.batch_norm(x, g, b, rm, rv, training=False), feeds)
    shaped = {k: feeds[k][None, :, None, None] for k in ("g", "b", "rm", "rv")}
    want = (feeds["x"] - shaped["rm"]) / np.sqrt(shaped["rv"] + 1e-5) * shaped["g"] + shaped["b"]
    assert_close(got, want, rtol=1e-12)
