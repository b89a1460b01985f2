"""gc.compile(..., target="cuda") on Numba's CUDA simulator (or a real GPU under make gpu-check).

Oracle: the reference interpreter (`gc.evaluate`), the numpy oracle of
every backend. Every op class appears in at least one compiled graph here
(`test_cases_cover_every_op` checks it), every benchmark workload runs at
its tiny size, and the device-side contract is checked: feeds from the
host or the device, outputs on the device unless `to_host=True`, no
transfer between kernels, outputs that survive the next call, run-time
errors before any kernel reads a bad index.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from collections.abc import Callable

import numpy as np
import pytest

import gradcompiler as gc

from cuda_support import cuda_for_tests

cuda = cuda_for_tests()

from gradcompiler.backends.numba_cuda.device import is_device_array  # noqa: E402
from gradcompiler.bench import workloads  # noqa: E402
from gradcompiler.ops import all_op_classes  # noqa: E402
from gradcompiler.ops.shape import FastpathCopy  # noqa: E402

from oracle import assert_close  # noqa: E402

RNG_SEED = 7


def assert_matches_reference(outputs, feeds, **compile_args):
    """Compile `outputs` for CUDA, run on `feeds`, compare with the reference interpreter:
    float32 to 1e-5 relative, with an absolute floor of 1e-5 × the largest finite magnitude
    (a reduction that cancels to near zero carries the rounding of its largest terms)."""
    step = gc.compile(outputs, target="cuda", **compile_args)
    got = step(to_host=True, **feeds)
    want = gc.evaluate(outputs, feeds)
    for k, (g, w) in enumerate(zip(got, want)):
        assert isinstance(g, np.ndarray), (k, g)
        assert_close(g, w, rtol=1e-5, label=f"output {k}")
    return step


# -- graphs covering every op ---------------------------------------------------------------------

def _elementwise(rng):
    with gc.Graph("elementwise"):
        pos, x = gc.input("pos", (3, 5)), gc.input("x", (3, 5))
        b, c = gc.input("b", (5,)), gc.input("c", (3, 1))
        i, j = gc.input("i", (3, 5), "int32"), gc.input("j", (5,), "int32")
        unary = [f(pos) for f in (gc.exp, gc.log, gc.log1p, gc.sqrt, gc.rsqrt)]
        unary += [f(x) for f in (gc.expm1, gc.sin, gc.cos, gc.tanh, gc.sigmoid, gc.erf, gc.gelu, gc.softplus,
                                 gc.relu, gc.negative, gc.abs)]
        binary = [gc.add(x, b), gc.subtract(x, c), gc.multiply(x, b), gc.divide(x, b), gc.maximum(x, c),
                  gc.minimum(x, b), gc.power(pos, b), gc.less(x, b), gc.less_equal(x, c), gc.equal(i, j),
                  gc.where(gc.less(x, c), x, b)]
        helpers = [gc.elemwise(mode, x, b) for mode in ("SWITCH_GT0", "ABS_GRAD", "SIGMOID_GRAD", "TANH_GRAD",
                                                         "GELU_GRAD", "SOFTPLUS_GRAD")]
        helpers += [gc.elemwise(mode, x, c, b) for mode in ("COND_LEQ_MOV", "COND_LT_MOV", "FUSE_MUL_ADD3")]
        integers = [i * j + i, gc.maximum(i, j), gc.cast(i, "float32") / b, gc.cast(x, "int32"),
                    gc.stop_gradient(x) * 2.0]
    feeds = dict(pos=rng.uniform(0.1, 2.0, (3, 5)).astype(np.float32),
                 x=rng.standard_normal((3, 5)).astype(np.float32) * 2, b=rng.standard_normal(5).astype(np.float32),
                 c=rng.standard_normal((3, 1)).astype(np.float32),
                 i=rng.integers(-100000, 100000, (3, 5)).astype(np.int32),
                 j=rng.integers(-100000, 100000, 5).astype(np.int32))
    feeds["j"][:2] = feeds["i"][0, :2]  # some equal pairs
    return unary + binary + helpers + integers, feeds


def _reductions(rng):
    with gc.Graph("reductions"):
        x, y = gc.input("x", (4, 6)), gc.input("y", (2, 3, 4))
        n = gc.input("n", (5, 3), "int32")
        outs = [x.sum(axis=1), x.mean(axis=0), gc.max(x), gc.min(x, axis=1, keepdims=True), gc.prod(x, axis=0),
                gc.sum_sqr(x, axis=1), y.sum(axis=(0, 2)), y.mean(axis=1, keepdims=True),
                gc.reduce_to(y, (3, 1)), n.sum(axis=0), gc.max(n, axis=1)]
        # sibling reductions keeping different inner axes of one input: no thread split suits both
        outs += [y.sum(axis=2), y.sum(axis=1), gc.prod(y, axis=2), gc.max(y, axis=1), y.mean(axis=2)]
        # a layer norm: row statistics, then a normalised row, then column sums, in one loop
        mu = x.mean(axis=1, keepdims=True)
        var = ((x - mu) * (x - mu)).mean(axis=1, keepdims=True)
        z = (x - mu) * gc.rsqrt(var + 1e-5)
        outs += [z, z.sum(axis=0), (z * z).sum()]
    feeds = dict(x=rng.uniform(0.5, 1.5, (4, 6)).astype(np.float32),
                 y=rng.standard_normal((2, 3, 4)).astype(np.float32),
                 n=rng.integers(-50, 50, (5, 3)).astype(np.int32))
    return outs, feeds


def _shapes(rng):
    with gc.Graph("shapes"):
        x, z = gc.input("x", (2, 3, 4)), gc.input("z", (2, 8, 3, 2))
        k = gc.constant(np.arange(12, dtype=np.float32).reshape(3, 4))
        outs = [gc.reshape(x, (6, 4)) + 1.0, gc.broadcast_to(x[:, :1, :], (2, 3, 4)) * x,
                gc.expand_dims(x, 1) * 2.0, gc.squeeze(x[:, :1], 1) - 1.0, gc.transpose(x, (2, 0, 1)) + k[0, 0],
                gc.swapaxes(x, 0, 2) * gc.full((), 3.0), gc.concat([x, x * 2.0, x[:, :1]], axis=1),
                gc.apply(FastpathCopy(), x), x[1:, ::2] + k[::2], x[::-1, 2] + gc.zeros((4,)),
                gc.pixel_shuffle(z, 2) * 1.5, gc.pixel_unshuffle(gc.pixel_shuffle(z, 2) + 1.0, 2), x + k]
    return outs, dict(x=rng.standard_normal((2, 3, 4)).astype(np.float32),
                      z=rng.standard_normal((2, 8, 3, 2)).astype(np.float32))


def _indexing(rng):
    with gc.Graph("indexing"):
        x, v, w = gc.input("x", (5, 3)), gc.input("v", (6, 3)), gc.input("w", (2, 2))
        idx, lab = gc.input("idx", (6,), "int64"), gc.input("lab", (5,), "int32")
        y = gc.input("y", (2, 4, 3))
        repeated = np.array([1, 3, 1], np.int32)
        outs = [x[idx], y[:, repeated], gc.index_add(x, idx, v), gc.index_update(x, idx, v),
                gc.index_update(x, (slice(1, 3), slice(0, 2)), w), gc.indexing_one_hot(x, lab, axis=1),
                gc.indexing_set_one_hot(x, lab, x.sum(axis=1, keepdims=True), axis=1),
                gc.index_add(y, (slice(None), repeated), 1.0)]
    return outs, dict(x=rng.standard_normal((5, 3)).astype(np.float32),
                      v=rng.standard_normal((6, 3)).astype(np.float32),
                      w=rng.standard_normal((2, 2)).astype(np.float32),
                      idx=np.array([4, 0, 4, -1, 2, 4], np.int64), lab=np.array([2, 0, 1, 2, 1], np.int32),
                      y=rng.standard_normal((2, 4, 3)).astype(np.float32))


def _matmul(rng):
    with gc.Graph("matmul"):
        a, b = gc.param("a", (3, 4)), gc.param("b", (4, 5))
        p, q, r = gc.param("p", (2, 3, 4)), gc.param("q", (2, 4, 5)), gc.param("r", (3, 4, 2))
        s = gc.param("s", (2, 1, 3, 4))
        outs = [a @ b, gc.transpose(b, (1, 0)) @ gc.transpose(a, (1, 0)), p @ b, p @ q, s @ r]
        loss = sum(((o * o).sum() for o in outs), gc.full((), 0.0))
        grads = gc.grad(loss, [a, b, p, q, r, s])
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in
             dict(a=(3, 4), b=(4, 5), p=(2, 3, 4), q=(2, 4, 5), r=(3, 4, 2), s=(2, 1, 3, 4)).items()}
    return [loss, *grads, *outs], feeds


def _warp_case(mode: str, fmt: str) -> Callable:
    def build(rng):
        src_shape = (2, 2, 5, 6) if fmt == "NCHW" else (2, 5, 6, 2)
        with gc.Graph(f"warp_{mode}"):
            src, mat = gc.param("src", src_shape), gc.param("mat", (2, 3, 3))
            aff, r = gc.param("aff", (2, 2, 3)), gc.input("r", (2, 2, 4, 5) if fmt == "NCHW" else (2, 4, 5, 2))
            persp = gc.warp_perspective(src, mat, (4, 5), border_mode=mode, border_val=0.3, format=fmt)
            affine = gc.warp_affine(src, aff, (4, 5), border_mode=mode, border_val=0.3, format=fmt)
            loss = (persp * r).sum() + (affine * affine).sum()
            grads = gc.grad(loss, [src, mat, aff])
        mats = np.array([[[1.1, 0.1, -0.7], [0.05, 0.9, 0.6], [0.01, -0.02, 1.0]]] * 2, np.float32)
        mats[1] += 0.05 * rng.standard_normal((3, 3)).astype(np.float32)
        feeds = dict(src=rng.standard_normal(src_shape).astype(np.float32), mat=mats,
                     aff=np.ascontiguousarray(mats[:, :2] + np.float32(0.3)),
                     r=rng.standard_normal(r.shape).astype(np.float32))
        return [loss, persp, affine, *grads], feeds
    return build


def _warp_jvp(rng):
    """Forward mode along both warps' matrices: the transposed BackwardMat is TangentMat."""
    with gc.Graph("warp_jvp"):
        src, idx = gc.input("src", (2, 5, 6, 2)), gc.input("idx", (3,), "int32")
        mat, aff = gc.param("mat", (3, 3, 3)), gc.param("aff", (2, 2, 3))
        persp = gc.warp_perspective(src, mat, (4, 3), idx, "reflect", 0.3, "NHWC")
        affine = gc.warp_affine(src, aff, (3, 5), "constant", -0.2)
        directions = [rng.standard_normal(s).astype(np.float32) for s in ((3, 3, 3), (2, 2, 3))]
        tangents = gc.jvp([gc.tanh(persp), affine], [mat, aff], directions)
    mats = np.array([[[1.1, 0.1, -0.7], [0.05, 0.9, 0.6], [0.01, -0.02, 1.0]]] * 3, np.float32)
    mats[1:] += 0.05 * rng.standard_normal((2, 3, 3)).astype(np.float32)
    feeds = dict(src=rng.standard_normal((2, 5, 6, 2)).astype(np.float32), mat=mats,
                 idx=np.array([1, 0, 1], np.int32), aff=np.ascontiguousarray(mats[:2, :2] + 0.3))
    return [*tangents, persp], feeds


@gc.custom_gradient
def _silu(x):
    """x·sigmoid(x) with its backward written by hand, residuals x and sigmoid(x)."""
    s = gc.sigmoid(x)
    return x * s, lambda g, x, s: [g * (s + x * s * (1.0 - s))], (x, s)


def _custom_gradient(rng):
    with gc.Graph("custom_gradient"):
        x, r = gc.param("x", (3, 5)), gc.input("r", (3, 5))
        loss = (_silu(x * 1.5) * r).sum()
        grad_x, = gc.grad(loss, [x])
    feeds = dict(x=rng.standard_normal((3, 5)).astype(np.float32),
                 r=rng.standard_normal((3, 5)).astype(np.float32))
    return [loss, grad_x], feeds


def _cnn(rng):
    """Every convolution and pooling op, forward and backward, in one small training step."""
    with gc.Graph("cnn"):
        x = gc.input("x", (2, 2, 5, 5))
        w1, w2 = gc.param("w1", (3, 2, 3, 3)), gc.param("w2", (4, 1, 2, 2))
        w3, b2 = gc.param("w3", (4, 2, 2, 2)), gc.param("b2", (4,))
        gamma, beta = gc.param("gamma", (3,)), gc.param("beta", (3,))
        h = gc.relu(gc.batch_norm(gc.conv2d(x, w1, padding=1, dilation=(1, 2)), gamma, beta))
        h = gc.max_pool2d(h[:, :, :, 1:], 2, 1, ceil_mode=True)[:, :2]
        h = gc.conv2d(h, w2, b2, stride=2, padding=1, groups=2)
        h = gc.avg_pool2d(h, 2, 1, 1, count_include_pad=False)
        out = gc.conv_transpose2d(h, w3, stride=2, output_padding=1, groups=2)
        loss = (out * out).mean()
        grads = gc.grad(loss, [x, w1, w2, w3, b2, gamma, beta])
    feeds = {name: rng.standard_normal(shape).astype(np.float32) for name, shape in
             {"x": (2, 2, 5, 5), "w1": (3, 2, 3, 3), "w2": (4, 1, 2, 2), "w3": (4, 2, 2, 2),
              "b2": (4,), "gamma": (3,), "beta": (3,)}.items()}
    return [loss, *grads, out], feeds


CASES: dict[str, Callable] = {
    "custom_gradient": _custom_gradient, "warp_jvp": _warp_jvp,
    "elementwise": _elementwise, "reductions": _reductions, "shapes": _shapes, "indexing": _indexing,
    "matmul": _matmul, "warp_replicate": _warp_case("replicate", "NCHW"),
    "warp_constant_nhwc": _warp_case("constant", "NHWC"), "warp_reflect": _warp_case("reflect", "NCHW"),
    "warp_reflect_101": _warp_case("reflect_101", "NCHW"), "warp_wrap_nhwc": _warp_case("wrap", "NHWC"),
    "cnn": _cnn,
}


@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # int32 wraps, as numpy's does
@pytest.mark.parametrize("case", list(CASES))
def test_graph_matches_reference(case):
    outputs, feeds = CASES[case](np.random.default_rng(RNG_SEED))
    assert_matches_reference(outputs, feeds)


def test_cases_cover_every_op():
    covered = set()
    for build in CASES.values():
        outputs, _ = build(np.random.default_rng(RNG_SEED))
        graph = outputs[0].graph
        covered |= {type(node.op).__name__ for node in graph.nodes.values()}
    missing = {c.__name__ for c in all_op_classes()} - covered
    assert not missing, f"no CUDA graph test runs {sorted(missing)}"


# -- benchmark workloads --------------------------------------------------------------------------

@pytest.mark.parametrize("name", workloads.NAMES)
def test_benchmark_workload_tiny(name, monkeypatch):
    if name == "cnn":  # the simulator's tiled products take minutes over the whole network;
        # test_graph_matches_reference[cnn] runs the GEMM route through an executable
        monkeypatch.setenv("GRADCOMPILER_CUDA_CONV", "direct")
    workload = workloads.build(name, "tiny")
    assert_matches_reference(workload.outputs, workloads.feeds_for(workload))


# -- the device contract --------------------------------------------------------------------------

@pytest.fixture(scope="module")
def layernorm():
    workload = workloads.build("layernorm_gelu", "tiny")
    return workload, gc.compile(workload.outputs, target="cuda"), workloads.feeds_for(workload)


def test_outputs_stay_on_device_and_come_home_on_request(layernorm):
    workload, step, feeds = layernorm
    on_device = step(**feeds)
    assert all(is_device_array(v) for v in on_device)
    on_host = step(to_host=True, **feeds)
    assert all(isinstance(v, np.ndarray) for v in on_host)
    for d, h in zip(on_device, on_host):
        np.testing.assert_array_equal(d.copy_to_host(), h)


def test_device_feeds_are_used_without_a_copy(layernorm, monkeypatch):
    workload, step, feeds = layernorm
    device = {k: cuda.to_device(v) for k, v in feeds.items()}
    uploads, downloads = [], []
    real_to_device = cuda.to_device
    monkeypatch.setattr(cuda, "to_device", lambda *a, **k: uploads.append(a) or real_to_device(*a, **k))
    array_type = type(device["x"])
    real_copy = array_type.copy_to_host
    monkeypatch.setattr(array_type, "copy_to_host",
                        lambda self, *a, **k: downloads.append(self) or real_copy(self, *a, **k))
    outputs = step(**device)
    assert not uploads and not downloads  # nothing crossed between host and device
    monkeypatch.undo()
    for got, want in zip(outputs, step(to_host=True, **feeds)):
        np.testing.assert_array_equal(got.copy_to_host(), want)


def test_returned_outputs_survive_the_next_call(layernorm):
    workload, step, feeds = layernorm
    first = step(**feeds)
    kept = [v.copy_to_host() for v in first]
    step(**{**feeds, "x": feeds["x"] * 2})
    for value, snapshot in zip(first, kept):
        np.testing.assert_array_equal(value.copy_to_host(), snapshot)


def test_feed_errors_name_the_feed(layernorm):
    workload, step, feeds = layernorm
    with pytest.raises(gc.FeedError, match="'x' has shape"):
        step(**{**feeds, "x": cuda.to_device(feeds["x"][:2])})
    with pytest.raises(gc.FeedError, match="missing"):
        step(**{k: v for k, v in feeds.items() if k != "x"})


def test_bad_index_feed_raises_before_any_kernel_reads_it():
    with gc.Graph("gather"):
        x, idx = gc.input("x", (4, 2)), gc.input("idx", (3,), "int32")
        y = x[idx] * 2.0
    step = gc.compile(y, target="cuda")
    x_value = np.ones((4, 2), np.float32)
    got = step(to_host=True, x=x_value, idx=np.array([3, -4, 0], np.int32))
    np.testing.assert_array_equal(got, 2 * np.ones((3, 2)))
    with pytest.raises(gc.IndexOutOfRangeError, match="index value 4"):
        step(x=x_value, idx=np.array([0, 4, 1], np.int32))


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the simulator's log(-1)
def test_debug_mode_names_the_kernel_that_made_a_nan():
    with gc.Graph("nan"):
        x = gc.input("x", (3,))
        y = gc.log(x) + 1.0
    step = gc.compile(y, target="cuda", debug=True)
    with pytest.raises(gc.NonFiniteError, match="LOG"):
        step(x=np.array([1.0, -1.0, 2.0], np.float32))


def test_without_gpu_or_simulator_target_cuda_says_why():
    """In a fresh process with the simulator off: a GPU compiles; anything else says why not."""
    script = textwrap.dedent("""
        import sys
        import gradcompiler as gc
        with gc.Graph("g"):
            x = gc.input("x", (2,))
        sys.modules["numba.cuda"] = None  # as if numba-cuda were not installed
        try:
            gc.compile(x * 2.0, target="cuda")
        except gc.BackendUnavailableError as err:
            print("MISSING", err)
        del sys.modules["numba.cuda"]
        try:
            gc.compile(x * 2.0, target="cuda")
            print("COMPILED")
        except gc.BackendUnavailableError as err:
            print("REFUSED", err)
    """)
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "0"}
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 0, result.stderr
    missing, second = result.stdout.splitlines()
    assert missing.startswith("MISSING") and "needs numba-cuda" in missing and "gradcompiler[cuda]" in missing
    if second != "COMPILED":
        assert second.startswith("REFUSED") and "no usable CUDA driver or GPU" in second
        assert "NUMBA_ENABLE_CUDASIM=1" in second


def test_an_output_that_is_a_feed_or_constant_is_a_fresh_array():
    with gc.Graph("passthrough"):
        x = gc.input("x", (3,))
        k = gc.constant(np.array([1.0, 2.0, 3.0], np.float32))
    step = gc.compile([x, k, x * k], target="cuda")
    fed = cuda.to_device(np.array([4.0, 5.0, 6.0], np.float32))
    same, constant, product = step(x=fed)
    assert same is not fed and is_device_array(same) and is_device_array(constant)
    np.testing.assert_array_equal(same.copy_to_host(), [4, 5, 6])
    constant[0] = 100.0  # the caller's copy, not the executable's constant
    np.testing.assert_array_equal(step(to_host=True, x=fed)[2], [4, 10, 18])
    np.testing.assert_array_equal(product.copy_to_host(), [4, 10, 18])
