"""Scalar math device functions for generated CUDA kernels: `<name>_f32` and `<name>_f64`.

Generated kernels spell transcendental modes exactly as the CPU backend's
(`scalar_ops.scalar_expr` writes `exp_f32(v3)`); this module gives those
names CUDA meanings. On a GPU the primitives are `math.*`, which Numba
lowers to libdevice (`expf`, `log1pf`, ...: fast, correctly special-cased
float32 code, so no approximations of our own are needed here). Under the
simulator, device functions run as Python, where `math.log(0)` raises and
`math.exp(1000)` overflows with an exception; there the primitives are
numpy's ufuncs, which give the same inf/NaN a GPU gives and keep float32
arithmetic in float32.

Composite modes follow the numpy reference's formulas (stable sigmoid and
softplus, exact-erf GELU) with constants typed in the function's dtype, so
float32 stays float32.
"""

from __future__ import annotations

import math

import numpy as np
from numba import cuda

from . import simulator_active

if simulator_active(cuda):
    _exp, _log, _log1p, _expm1, _sqrt = np.exp, np.log, np.log1p, np.expm1, np.sqrt
    _sin, _cos, _tanh, _pow = np.sin, np.cos, np.tanh, np.power
    _floor, _ceil, _trunc, _fmod, _copysign = np.floor, np.ceil, np.trunc, np.fmod, np.copysign
    _rint = dict.fromkeys((np.float32, np.float64), np.rint)
else:
    from numba.cuda import libdevice

    _exp, _log, _log1p, _expm1, _sqrt = math.exp, math.log, math.log1p, math.expm1, math.sqrt
    _sin, _cos, _tanh, _pow = math.sin, math.cos, math.tanh, math.pow
    # CUDA types these float -> float (floorf, ...), unlike the CPU target's int64 results
    _floor, _ceil, _trunc = math.floor, math.ceil, math.trunc
    _fmod, _copysign = math.fmod, math.copysign
    _rint = {np.float32: libdevice.rintf, np.float64: libdevice.rint}  # half to even
_erf = math.erf


def _functions(dtype: type) -> dict:
    """The device functions of one float dtype, keyed by mode name (lower case)."""
    zero, half, one = dtype(0), dtype(0.5), dtype(1)
    inv_sqrt2, inv_sqrt_2pi = dtype(0.7071067811865476), dtype(0.3989422804014327)
    clamp = dtype(40.0)  # 40·φ(40) ~ 1e-347 and 40·Φ(−40) ~ 1e-349: zero in every float

    @cuda.jit(device=True)
    def exp(x):
        return _exp(x)

    @cuda.jit(device=True)
    def log(x):
        return _log(x)

    @cuda.jit(device=True)
    def log1p(x):
        return _log1p(x)

    @cuda.jit(device=True)
    def expm1(x):
        return _expm1(x)

    @cuda.jit(device=True)
    def sqrt(x):
        return _sqrt(x)

    @cuda.jit(device=True)
    def rsqrt(x):
        return one / _sqrt(x)

    @cuda.jit(device=True)
    def sin(x):
        return _sin(x)

    @cuda.jit(device=True)
    def cos(x):
        return _cos(x)

    @cuda.jit(device=True)
    def tanh(x):
        return _tanh(x)

    @cuda.jit(device=True)
    def pow(a, b):  # noqa: A001 - the mode's name
        return _pow(a, b)

    @cuda.jit(device=True)
    def erf(x):
        return dtype(_erf(x))

    @cuda.jit(device=True)
    def sigmoid(x):
        """1 / (1 + e^-x) without overflow: e^-|x| <= 1 on both branches."""
        e = _exp(-abs(x))
        return one / (one + e) if x >= zero else e / (one + e)

    @cuda.jit(device=True)
    def softplus(x):
        return _log1p(_exp(-abs(x))) + (x if x > zero else zero)

    @cuda.jit(device=True)
    def normal_cdf(x):
        return half * (one + dtype(_erf(x * inv_sqrt2)))

    @cuda.jit(device=True)
    def gelu(x):
        return -zero if x < -clamp else x * normal_cdf(x)  # the limit at -inf, not -inf·0 (NaN stays)

    @cuda.jit(device=True)
    def gelu_grad(x, g):
        xc = min(max(x, -clamp), clamp)  # x·φ(x) → 0 at ±inf; below every float past ±40
        return g * (normal_cdf(x) + xc * (_exp(-half * xc * xc) * inv_sqrt_2pi))

    @cuda.jit(device=True)
    def softplus_grad(x, g):
        return g * sigmoid(x)

    rint = _rint[dtype]

    @cuda.jit(device=True)
    def floor(x):
        return _floor(x)

    @cuda.jit(device=True)
    def ceil(x):
        return _ceil(x)

    @cuda.jit(device=True)
    def trunc(x):
        return _trunc(x)

    @cuda.jit(device=True)
    def round(x):  # noqa: A001 - the mode's name
        return rint(x)

    @cuda.jit(device=True)
    def floor_div(a, b):
        """numpy's floor_divide (npy_divmod), as the CPU's `mathfuncs.floor_div_f64`."""
        if b == zero:
            return a / b
        mod = _fmod(a, b)
        div = (a - mod) / b
        if mod != zero and (b < zero) != (mod < zero):
            div -= one
        if div == zero:
            return _copysign(zero, a / b)
        result = _floor(div)
        return result + one if div - result > half else result

    return dict(exp=exp, log=log, log1p=log1p, expm1=expm1, sqrt=sqrt, rsqrt=rsqrt, sin=sin, cos=cos,
                tanh=tanh, pow=pow, erf=erf, sigmoid=sigmoid, softplus=softplus, gelu=gelu,
                gelu_grad=gelu_grad, softplus_grad=softplus_grad, floor=floor, ceil=ceil,
                trunc=trunc, round=round, floor_div=floor_div)


def _export() -> list[str]:
    names = []
    for suffix, dtype in (("f32", np.float32), ("f64", np.float64)):
        for mode, function in _functions(dtype).items():
            globals()[f"{mode}_{suffix}"] = function
            names.append(f"{mode}_{suffix}")
    return names


__all__ = _export()
