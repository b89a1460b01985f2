"""512-bit vectors for arithmetic-bound kernels (backends/numba_cpu/vector_width.py).

* The intrinsic gives its function LLVM's `"prefer-vector-width"="512"` and emits no code: a
  loop of tanh through it equals numpy's, and a twin without it has no such attribute.
* The generated kernels ask for it exactly where an element-level loop evaluates a
  transcendental: a layer norm with GELU and its gradients does (and equals the reference
  interpreter, float64 1e-10, float32 1e-5, a NaN row included); a bias-ReLU with column
  sums, and a layer norm whose only call (rsqrt) is once per row, do not.
"""

from __future__ import annotations

import numpy as np
import pytest
from numba import njit

import gradcompiler as gc
from gradcompiler.backends.numba_cpu.mathfuncs import tanh_f32
from gradcompiler.backends.numba_cpu.vector_width import prefer_wide_vectors
from tests.oracle import assert_close

ATTRIBUTE = '"prefer-vector-width"="512"'


@njit(cache=False, error_model="numpy")
def _tanh_wide(x, out):
    prefer_wide_vectors()
    for i in range(x.size):
        out[i] = tanh_f32(x[i])


@njit(cache=False, error_model="numpy")
def _tanh_default(x, out):
    for i in range(x.size):
        out[i] = tanh_f32(x[i])


def test_the_intrinsic_marks_its_function_and_changes_no_value(rng):
    x = (4 * rng.standard_normal(1000)).astype(np.float32)
    x[:3] = [np.nan, np.inf, -np.inf]
    wide, default = np.empty_like(x), np.empty_like(x)
    _tanh_wide(x, wide)
    _tanh_default(x, default)
    np.testing.assert_allclose(wide, np.tanh(x.astype(np.float64)), rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(wide, default)
    assert ATTRIBUTE in "".join(_tanh_wide.inspect_llvm().values())
    assert ATTRIBUTE not in "".join(_tanh_default.inspect_llvm().values())


def _chunk_sources(step) -> list[str]:
    """The text of each generated kernel's `chunk` function (up to the next decorator)."""
    return [part.split("@njit")[0] for part in step.source().split("def chunk(")[1:]]


@pytest.mark.filterwarnings("ignore:invalid value:RuntimeWarning")  # the reference's NaN row
@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_a_kernel_evaluating_tanh_per_element_asks_for_wide_vectors(rng, dtype):
    rows, width = 40, 300
    with gc.Graph("layer_norm_gelu"):
        x = gc.param("x", (rows, width), dtype)
        gamma, beta = gc.param("gamma", (width,), dtype), gc.param("beta", (width,), dtype)
        r = gc.input("r", (rows, width), dtype)
        loss = ((gc.gelu_tanh(gc.layer_norm(x, gamma, beta, axis=-1, eps=1e-5)) + x) * r).sum()
    outputs = [loss, *gc.grad(loss, [x, gamma, beta])]
    step = gc.compile(outputs)
    assert any("prefer_wide_vectors()" in chunk for chunk in _chunk_sources(step))
    feeds = dict(x=rng.standard_normal((rows, width)).astype(dtype),
                 gamma=(1 + 0.1 * rng.standard_normal(width)).astype(dtype),
                 beta=(0.1 * rng.standard_normal(width)).astype(dtype),
                 r=rng.standard_normal((rows, width)).astype(dtype))
    feeds["x"][7] = np.nan
    tolerance = {"float64": 1e-10, "float32": 1e-5}[dtype]
    for k, (got, want) in enumerate(zip(step(**feeds), gc.evaluate(outputs, feeds))):
        assert_close(got, want, rtol=tolerance, label=f"output {k}")


def test_memory_bound_kernels_keep_the_default_width():
    rows, width = 40, 300
    with gc.Graph("bias_relu_columns"):
        x = gc.param("x", (rows, width), "float32")
        b = gc.param("b", (width,), "float32")
        bias_relu = gc.relu(x + b).sum()
    with gc.Graph("layer_norm_alone"):
        y = gc.param("y", (rows, width), "float32")
        r = gc.input("r", (rows, width), "float32")
        norm = (gc.layer_norm(y, axis=-1, eps=1e-5) * r).sum()
    for loss, wrt, calls in ((bias_relu, [x, b], False), (norm, [y], True)):
        step = gc.compile([loss, *gc.grad(loss, wrt)])
        chunks = _chunk_sources(step)
        assert chunks and not any("prefer_wide_vectors" in chunk for chunk in chunks)
        assert ("rsqrt_f32(" in step.source()) == calls   # the layer norm's, once per row
