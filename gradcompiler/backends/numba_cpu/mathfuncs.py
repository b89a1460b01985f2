"""Scalar math functions for generated CPU kernels: `<name>_f32` and `<name>_f64`.

Why: Numba's `math.*` lowers to scalar libm calls (no SVML in the llvmlite
wheels), which stops a loop from vectorising and costs 17-45× on the
transcendental-heavy kernels. The `_f32` functions are branch-free
approximations built from float32 arithmetic, integer bit tricks and FMAs
(or, where float32 alone would lose accuracy, the float64 kernels of
`mathfuncs_core`), so a `prange` loop that calls them becomes SIMD code.
The `_f64` functions are the exact libm versions: float64 kernels are rare
and accuracy matters more there.

Contract (used by the code generator): every function is
`@njit(inline="always", cache=True)`, takes and returns scalars of its
dtype, and gets special values right: ±inf, NaN, overflow to inf, underflow
to 0 (gradually, through the subnormals), tiny inputs (tanh(x) = x,
expm1/log1p exact near 0), log(0) = −inf, log of a negative = NaN. Two-input
functions: `pow(a, b)`, and `gelu_grad(x, g)` / `softplus_grad(x, g)` with
the upstream gradient second. Divisions go through an IEEE intrinsic, so
the functions behave the same under either Numba error model, and the steps
whose rounding matters are immune to the caller's fast-math flags (so
`fastmath=True` leaves the accuracy table below unchanged but for ~0.3 ulp);
callers must not use the `nnan`/`ninf` flags, which would fold the NaN
selects away.

Accuracy of the float32 versions against float64 references (max ulp over
dense sweeps of the whole float32 range, measured by
tests/backends/test_mathfuncs_accuracy.py, which prints the table): exp,
log, sqrt, rsqrt, erf, gelu, pow, sin, cos <= 1 (the float64-core ones are
correctly rounded but for ~1e-4 of a ulp), gelu_grad <= 1 ulp of its larger
term (it cancels near x = -0.75); expm1, log1p, softplus
<= 2; sigmoid <= 3; softplus_grad <= 4; tanh <= 5 (Eigen's rational
approximation: the fast path of the benchmarks' tanh kernels).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from .mathfuncs_core import (
    divide,
    erfc_nonneg_f64v,
    exp_f64v,
    float32_from_bits,
    float_bits,
    fma,
    log_f64v,
    quarter_turns_f64v,
    sin_cos_reduced_f64v,
    strict_add,
    strict_mul,
    strict_sub,
)

_F = np.float32
_ZERO, _HALF, _ONE, _TWO = _F(0.0), _F(0.5), _F(1.0), _F(2.0)
_INF32 = _F(np.inf)
_NAN32 = _F(np.nan)
_INV_SQRT2 = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327
_TWO_OVER_SQRT_PI = 1.1283791670955126
_DENSITY_CLAMP = 40.0                  # 40·φ(40) ~ 1e-347: zero in float64
_HALF_F32_SUBNORMAL = 2.0 ** -150      # below this a float64 rounds to float32 0

# -- exp family (float32) ----------------------------------------------------------------------

_LOG2E_32 = _F(1.4426950408889634)
_LN2_HI_32 = _F(-0.693359375)          # −ln2 in two parts (Cody-Waite); 9 bits: k·hi is exact
_LN2_LO_32 = _F(2.12194440e-4)
_EXP_HI_32 = _F(89.0)                  # e^89 overflows float32: clamping keeps k <= 128
_EXP_LO_32 = _F(-104.0)                # e^-104 underflows to 0: clamping keeps k >= -150
# Cephes expf: e^r = 1 + r + r²·P(r) on |r| <= ln2/2, < 1 ulp
_EP0, _EP1, _EP2 = _F(1.9875691500e-4), _F(1.3981999507e-3), _F(8.3334519073e-3)
_EP3, _EP4, _EP5 = _F(4.1665795894e-2), _F(1.6666665459e-1), _F(5.0000001201e-1)


@njit(inline="always", cache=True)
def _exp_parts_f32(x):
    """(expm1(r), k) with clamp(x) = k·ln2 + r, |r| <= ln2/2; k a float32 in [-150, 128]."""
    xc = _EXP_HI_32 if x > _EXP_HI_32 else x
    xc = _EXP_LO_32 if xc < _EXP_LO_32 else xc
    k = np.floor(fma(xc, _LOG2E_32, _HALF))
    r = fma(k, _LN2_HI_32, xc)
    r = fma(k, _LN2_LO_32, r)
    p = fma(_EP0, r, _EP1)
    p = fma(p, r, _EP2)
    p = fma(p, r, _EP3)
    p = fma(p, r, _EP4)
    p = fma(p, r, _EP5)
    return fma(r * r, p, r), k


@njit(inline="always", cache=True)
def _pow2_halves_f32(k):
    """2^k1 and 2^k2 with k1 + k2 = k, each a normal float32, for integer k in [-150, 128].

    Scaling by the two halves in turn overflows to inf and underflows
    through the subnormals with a single rounding, where 2^k alone would
    not be representable.
    """
    ki = np.int32(k)
    k1 = ki >> 1
    k2 = ki - k1
    return float32_from_bits((k1 + 127) << 23), float32_from_bits((k2 + 127) << 23)


@njit(inline="always", cache=True)
def exp_f32(x):
    em1, k = _exp_parts_f32(x)
    s1, s2 = _pow2_halves_f32(k)
    # below the clamp the value is 0: scaled by 0, not underflowed through the subnormals, a
    # microcode assist on every vector holding one (the −inf of a causal mask: 6.6 cycles a
    # value against 2.6; a select of 0 after the product would let LLVM keep the product)
    s2 = _ZERO if x < _EXP_LO_32 else s2
    result = strict_mul(strict_mul(em1 + _ONE, s1), s2)   # one factor at a time: s1·s2 may overflow
    return result if x == x else x


@njit(inline="always", cache=True)
def expm1_f32(x):
    """2^k·(expm1(r) + 1) − 1, arranged so that no step cancels or overflows early."""
    em1, k = _exp_parts_f32(x)
    s1, s2 = _pow2_halves_f32(k)
    # k > 0: 1 − 2^-k is exact for k <= 24 and rounds to 1 from k = 25 on
    inverse = float32_from_bits((127 - np.int32(min(k, _F(25.0)))) << 23)
    above = strict_mul(strict_mul(strict_add(em1, _ONE - inverse), s1), s2)
    scale = s1 * s2
    below = fma(scale, em1, scale - _ONE)            # k < 0: no overflow possible
    result = above if k > _ZERO else below
    result = em1 if k == _ZERO else result           # exact for tiny x
    return result if x == x and x != _ZERO else x    # NaN, and the sign of ±0


# -- log family (float32) ----------------------------------------------------------------------

_SMALLEST_NORMAL_32 = _F(2.0 ** -126)
_TWO_POW_25 = _F(2.0 ** 25)
_SQRT_HALF_BITS_32 = 0x3F3504F3
# musl logf: log(1+f) = f − f²/2 + s·(f²/2 + R(s²)), s = f/(2+f), error < 1 ulp
_LG1, _LG2, _LG3, _LG4 = _F(0.66666662693), _F(0.40000972152), _F(0.28498786688), _F(0.24279078841)
_LN2_HI_POS_32 = _F(6.9313812256e-01)
_LN2_LO_POS_32 = _F(9.0580006145e-06)


@njit(inline="always", cache=True)
def log_f32(x):
    """musl's logf without branches. The np.int32 casts keep the integer work in
    32-bit lanes (Numba widens int32 arithmetic to int64, halving the vector width)."""
    subnormal = x < _SMALLEST_NORMAL_32
    xs = x * _TWO_POW_25 if subnormal else x
    bits = np.int32(float_bits(xs) + (0x3F800000 - _SQRT_HALF_BITS_32))
    k = np.int32((bits >> 23) - 0x7F - (25 if subnormal else 0))
    m = float32_from_bits((bits & 0x7FFFFF) + _SQRT_HALF_BITS_32)  # in [sqrt(2)/2, sqrt(2))
    f = m - _ONE
    s = divide(f, _TWO + f)
    z = s * s
    w = z * z
    r = z * fma(w, _LG3, _LG1) + w * fma(w, _LG4, _LG2)
    half_f2 = _HALF * f * f
    kf = _F(k)
    result = fma(kf, _LN2_HI_POS_32, fma(s, half_f2 + r, kf * _LN2_LO_POS_32) - half_f2 + f)
    result = -_INF32 if x == _ZERO else result
    result = _NAN32 if x < _ZERO else result
    return x if not x < _INF32 else result          # +inf and NaN pass through


@njit(inline="always", cache=True)
def log1p_f32(x):
    """log(u) corrected by the rounding error of u = 1 + x (Goldberg's trick)."""
    u = strict_add(_ONE, x)
    result = log_f32(u) + divide(strict_sub(x, strict_sub(u, _ONE)), u)
    result = x if u == _ONE else result              # tiny x: log1p(x) = x to within 1/2 ulp
    result = -_INF32 if u == _ZERO else result
    return x if x == _INF32 else result


# -- tanh, sigmoid, softplus (float32) ---------------------------------------------------------

# Eigen's rational tanh: x·P(x²)/Q(x²). Eigen clamps at 7.9053, where tanh is still
# 1 − 4 ulp; the rational stays within 4 ulp up to 9, where tanh rounds to ±1.
_TANH_CLAMP = _F(9.0)
_TANH_TINY = _F(0.0004)
_TA1, _TA3, _TA5 = _F(4.89352455891786e-03), _F(6.37261928875436e-04), _F(1.48572235717979e-05)
_TA7, _TA9 = _F(5.12229709037114e-08), _F(-8.60467152213735e-11)
_TA11, _TA13 = _F(2.00018790482477e-13), _F(-2.76076847742355e-16)
_TB0, _TB2 = _F(4.89352518554385e-03), _F(2.26843463243900e-03)
_TB4, _TB6 = _F(1.18534705686654e-04), _F(1.19825839466702e-06)


@njit(inline="always", cache=True)
def tanh_f32(x):
    xc = _TANH_CLAMP if x > _TANH_CLAMP else x
    xc = -_TANH_CLAMP if xc < -_TANH_CLAMP else xc
    x2 = xc * xc
    p = fma(x2, _TA13, _TA11)
    p = fma(x2, p, _TA9)
    p = fma(x2, p, _TA7)
    p = fma(x2, p, _TA5)
    p = fma(x2, p, _TA3)
    p = fma(x2, p, _TA1)
    q = fma(x2, _TB6, _TB4)
    q = fma(x2, q, _TB2)
    q = fma(x2, q, _TB0)
    result = divide(xc * p, q)
    return x if abs(x) < _TANH_TINY else result      # also passes NaN through


@njit(inline="always", cache=True)
def sigmoid_f32(x):
    """1/(1+e^-x) for x >= 0, e^x/(1+e^x) below: never overflows, exact tails."""
    e = exp_f32(-abs(x))
    return divide(_ONE if x >= _ZERO else e, _ONE + e)


@njit(inline="always", cache=True)
def softplus_f32(x):
    """log1p(e^-|x|) + max(x, 0) (op-reference §2.3)."""
    return log1p_f32(exp_f32(-abs(x))) + (x if x > _ZERO else _ZERO)


@njit(inline="always", cache=True)
def softplus_grad_f32(x, g):
    return g * sigmoid_f32(x)


# -- erf, gelu (float32 through float64 erfc) --------------------------------------------------

# erf(x) = x·Σ (-1)^n (2/√π) x^(2n)/(n!(2n+1)) for |x| < 1/2 (9 terms, < 3e-11 relative);
# 1 − erfc(|x|) above, where no cancellation is left.
_ERF_T = tuple(_TWO_OVER_SQRT_PI * (-1) ** n / (math.factorial(n) * (2 * n + 1)) for n in range(9))
_ERF_T0, _ERF_T1, _ERF_T2, _ERF_T3, _ERF_T4, _ERF_T5, _ERF_T6, _ERF_T7, _ERF_T8 = _ERF_T


@njit(inline="always", cache=True)
def _erf_f64v(x):
    z = x * x
    p = fma(_ERF_T8, z, _ERF_T7)
    p = fma(p, z, _ERF_T6)
    p = fma(p, z, _ERF_T5)
    p = fma(p, z, _ERF_T4)
    p = fma(p, z, _ERF_T3)
    p = fma(p, z, _ERF_T2)
    p = fma(p, z, _ERF_T1)
    p = fma(p, z, _ERF_T0)
    series = x * p
    tail = 1.0 - erfc_nonneg_f64v(abs(x))
    tail = -tail if x < 0.0 else tail
    return series if abs(x) < 0.5 else tail


@njit(inline="always", cache=True)
def _normal_cdf_f64v(x):
    """Φ(x) = erfc(−x/√2)/2, from the small side of erfc so that no tail cancels."""
    half_tail = 0.5 * erfc_nonneg_f64v(abs(x) * _INV_SQRT2)
    return half_tail if x < 0.0 else 1.0 - half_tail


@njit(inline="always", cache=True)
def erf_f32(x):
    return _F(_erf_f64v(np.float64(x)))


@njit(inline="always", cache=True)
def _density_term_f64v(x):
    """x·φ(x), exactly 0 from |x| = _DENSITY_CLAMP on, ±inf included (the limits). Exactly:
    exp_f64v clamps its argument, so the term computed there would be a tiny float64 rather
    than 0, and g = ±inf times it ±inf where the reference's g·0 is NaN."""
    xc = _DENSITY_CLAMP if x > _DENSITY_CLAMP else x
    xc = -_DENSITY_CLAMP if xc < -_DENSITY_CLAMP else xc
    term = xc * (_INV_SQRT_2PI * exp_f64v(-0.5 * xc * xc))
    return 0.0 if abs(x) >= _DENSITY_CLAMP else term  # NaN fails the test: NaN stays


@njit(inline="always", cache=True)
def gelu_f32(x):
    """x·Φ(x), the exact erf form; gelu(−inf) = −0, the limit."""
    xd = np.float64(x)
    return _F(xd * _normal_cdf_f64v(xd)) if x != -_INF32 else -_ZERO


@njit(inline="always", cache=True)
def gelu_grad_f32(x, g):
    """g·(Φ(x) + x·φ(x)), the factor 0 where it would underflow float32 (x below about −14),
    as in the reference, so g = ±inf gives g·0 = NaN there, not ±inf; elsewhere the product
    is taken in float64 and rounded once."""
    xd = np.float64(x)
    factor = _normal_cdf_f64v(xd) + _density_term_f64v(xd)
    factor = 0.0 if abs(factor) < _HALF_F32_SUBNORMAL else factor  # NaN fails the test: NaN stays
    return _F(np.float64(g) * factor)


# -- pow, sqrt, rsqrt (float32) ----------------------------------------------------------------

_TWO_POW_24 = 16777216.0


@njit(inline="always", cache=True)
def pow_f32(a, b):
    """a^b = e^(b·ln|a|) in float64 (no error amplification), with C's powf special cases."""
    ad, bd = np.float64(a), np.float64(b)
    magnitude = exp_f64v(bd * log_f64v(abs(ad)))
    finite_b = abs(bd) < np.inf
    fractional_b = np.floor(bd) != bd                # false for ±inf, true for NaN
    small_b = bd if abs(bd) < _TWO_POW_24 else 0.0   # larger floats are even integers
    odd_b = (np.int64(small_b) & 1) == 1
    negative_a = float_bits(a) < 0                   # includes −0
    result = -magnitude if negative_a and odd_b and not fractional_b else magnitude
    result = np.nan if ad < 0.0 and ad > -np.inf and finite_b and fractional_b else result
    result = 1.0 if ad == -1.0 and abs(bd) == np.inf else result
    result = 1.0 if bd == 0.0 or ad == 1.0 else result
    return _F(result)


@njit(inline="always", cache=True)
def sqrt_f32(x):
    return math.sqrt(x)                              # llvm.sqrt: one vector instruction


@njit(inline="always", cache=True)
def rsqrt_f32(x):
    """In float64, so that the two roundings of 1/sqrt(x) do not add up."""
    return _F(divide(1.0, math.sqrt(np.float64(x))))


# -- sin, cos (float32 through a float64 reduction) --------------------------------------------


@njit(inline="always", cache=True)
def sin_f32(x):
    r, quadrant = quarter_turns_f64v(x)
    s, c = sin_cos_reduced_f64v(r)
    value = s if (quadrant & 1) == 0 else c
    value = -value if (quadrant & 2) != 0 else value
    value = -value if float_bits(x) < 0 else value   # sin is odd, also at −0
    return _F(value) if abs(x) < _INF32 else x - x


@njit(inline="always", cache=True)
def cos_f32(x):
    r, quadrant = quarter_turns_f64v(x)
    s, c = sin_cos_reduced_f64v(r)
    value = c if (quadrant & 1) == 0 else s
    value = -value if ((quadrant + 1) & 2) != 0 else value
    return _F(value) if abs(x) < _INF32 else x - x


# -- float64: the exact libm versions ----------------------------------------------------------


@njit(inline="always", cache=True)
def exp_f64(x):
    return math.exp(x)


@njit(inline="always", cache=True)
def log_f64(x):
    return math.log(x)


@njit(inline="always", cache=True)
def log1p_f64(x):
    return math.log1p(x)


@njit(inline="always", cache=True)
def expm1_f64(x):
    return math.expm1(x)


@njit(inline="always", cache=True)
def tanh_f64(x):
    return math.tanh(x)


@njit(inline="always", cache=True)
def sigmoid_f64(x):
    e = math.exp(-abs(x))
    return divide(1.0 if x >= 0.0 else e, 1.0 + e)


@njit(inline="always", cache=True)
def erf_f64(x):
    return math.erf(x)


@njit(inline="always", cache=True)
def _normal_cdf_f64(x):
    return 0.5 * math.erfc(-x * _INV_SQRT2)


@njit(inline="always", cache=True)
def gelu_f64(x):
    return x * _normal_cdf_f64(x) if x != -math.inf else -0.0


@njit(inline="always", cache=True)
def gelu_grad_f64(x, g):
    xc = min(max(x, -_DENSITY_CLAMP), _DENSITY_CLAMP) if x == x else x
    return g * (_normal_cdf_f64(x) + xc * _INV_SQRT_2PI * math.exp(-0.5 * xc * xc))


@njit(inline="always", cache=True)
def softplus_f64(x):
    return math.log1p(math.exp(-abs(x))) + (x if x > 0.0 else 0.0)


@njit(inline="always", cache=True)
def softplus_grad_f64(x, g):
    return g * sigmoid_f64(x)


@njit(inline="always", cache=True)
def pow_f64(a, b):
    return math.pow(a, b)


@njit(inline="always", cache=True)
def sqrt_f64(x):
    return math.sqrt(x)


@njit(inline="always", cache=True)
def rsqrt_f64(x):
    return divide(1.0, math.sqrt(x))


@njit(inline="always", cache=True)
def sin_f64(x):
    return math.sin(x)


@njit(inline="always", cache=True)
def cos_f64(x):
    return math.cos(x)


# -- rounding (both dtypes) --------------------------------------------------------------------
# np.floor/ceil/trunc/rint lower to the LLVM rounding intrinsics (vectorisable, exact, and
# rint rounds half to even); math.floor would return an int64 in Numba, wrong past 2**63.


@njit(inline="always", cache=True)
def floor_f64(x):
    return np.floor(x)


@njit(inline="always", cache=True)
def ceil_f64(x):
    return np.ceil(x)


@njit(inline="always", cache=True)
def trunc_f64(x):
    return np.trunc(x)


@njit(inline="always", cache=True)
def round_f64(x):
    return np.rint(x)


floor_f32, ceil_f32, trunc_f32, round_f32 = floor_f64, ceil_f64, trunc_f64, round_f64


@njit(inline="always", cache=True)
def floor_div_f64(a, b):
    """numpy's floor_divide (npy_divmod): (a - fmod(a, b)) / b, corrected to the floor.

    Numba's own np.floor_divide is floor(a / b), which differs where a / b rounds up to an
    integer (1 // 0.1 is 9, not 10) and at ±inf (NaN in numpy).
    """
    if b == 0.0:
        return divide(a, b)
    mod = np.fmod(a, b)
    div = divide(a - mod, b)
    if mod != 0.0 and (b < 0.0) != (mod < 0.0):
        div -= 1.0
    if div == 0.0:
        return np.copysign(0.0, divide(a, b))
    floor_div = np.floor(div)
    return floor_div + 1.0 if div - floor_div > 0.5 else floor_div


@njit(inline="always", cache=True)
def floor_div_f32(a, b):
    """Through float64, where a - fmod(a, b) of two float32 values is exact: the same integer
    as numpy's float32 steps wherever float32 can hold it (quotients below 2**24)."""
    return _F(floor_div_f64(np.float64(a), np.float64(b)))
