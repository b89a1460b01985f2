"""Building blocks of the vectorisable math functions in `mathfuncs.py`.

Why this exists: the llvmlite wheels carry no SVML, so every `math.exp`
inside a Numba loop is a scalar libm call and the loop does not vectorise.
The functions here are written so that LLVM's loop vectoriser can turn a
loop calling them into SIMD code: no branches (selects only), no libm calls,
no loops, no exceptions. They hold:

* LLVM intrinsics Numba does not expose: reinterpreting a float's bits as an
  integer and back (exponent tricks for 2^k and frexp), a fused
  multiply-add (one rounding; the machine has FMA, so it is one instruction),
  a plain IEEE division (Numba's `/` checks for zero under the default
  error model, which raises and stops vectorisation), and add/sub/mul that
  the caller's fast-math flags cannot reassociate (`strict_*`), for the few
  steps whose rounding the algorithms rely on.
* float64 kernels for the float32 functions whose float32-only versions
  would lose accuracy: `exp_f64v`, `log_f64v`, `erfc_nonneg_f64v` and the
  sin/cos argument reduction. A float32 input is exact in float64 (even a
  float32 subnormal is a normal float64), so these need no subnormal
  handling, and their ~1e-11 relative accuracy makes the float32 result
  almost always correctly rounded.

Every function is `inline="always"`: Numba inlines it into the caller's IR,
so the caller's loop sees straight-line code. Callers must not compile with
fastmath's `nnan`/`ninf` flags: the special-value selects compare with NaN.
"""

from __future__ import annotations

import math

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.extending import intrinsic

# -- LLVM intrinsics ---------------------------------------------------------------------------


@intrinsic
def float_bits(typingctx, x):
    """The bits of a float32 as int32, of a float64 as int64 (a bitcast, no conversion)."""
    if x == types.float32:
        int_type, llvm_type = types.int32, ir.IntType(32)
    elif x == types.float64:
        int_type, llvm_type = types.int64, ir.IntType(64)
    else:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], llvm_type)

    return int_type(x), codegen


def _from_bits(float_type, int_type, llvm_type):
    def typer(typingctx, bits):
        if not isinstance(bits, types.Integer):
            return None

        def codegen(context, builder, signature, args):
            value = context.cast(builder, args[0], bits, int_type)
            return builder.bitcast(value, llvm_type)

        return float_type(bits), codegen

    return typer


float32_from_bits = intrinsic(_from_bits(types.float32, types.int32, ir.FloatType()))
float32_from_bits.__doc__ = "The float32 whose bits are the low 32 bits of an integer."
float64_from_bits = intrinsic(_from_bits(types.float64, types.int64, ir.DoubleType()))
float64_from_bits.__doc__ = "The float64 whose bits are the given 64-bit integer."


@intrinsic
def divide(typingctx, a, b):
    """IEEE a/b (x/0 = ±inf or NaN) whatever the caller's error model.

    Numba's `/` raises ZeroDivisionError under the default "python" error
    model, and the check is a branch that stops vectorisation.
    """
    if not (isinstance(a, types.Float) and a == b):
        return None

    def codegen(context, builder, signature, args):
        return builder.fdiv(*args)

    return a(a, b), codegen


def _strict(opname: str):
    """An IEEE float binary operation that the caller's fast-math flags leave alone.

    Numba's fast-math pass adds the caller's flags only to instructions that
    have none, so these carry `arcp`, which means nothing for add, sub and
    mul: the result keeps its IEEE rounding, and no reassociation can fold
    a rounding-error correction away (under `fastmath=True`, `(1 + x) − 1`
    becomes x and 2^k split in two factors is multiplied out first).
    """

    def typer(typingctx, a, b):
        if not (isinstance(a, types.Float) and a == b):
            return None

        def codegen(context, builder, signature, args):
            instruction = getattr(builder, opname)(*args)
            instruction.flags.append("arcp")
            return instruction

        return a(a, b), codegen

    return typer


strict_add = intrinsic(_strict("fadd"))
strict_sub = intrinsic(_strict("fsub"))
strict_mul = intrinsic(_strict("fmul"))


@intrinsic
def fma(typingctx, a, b, c):
    """a·b + c with one rounding (`llvm.fma`); all three of one float type."""
    if not (isinstance(a, types.Float) and a == b == c):
        return None

    def codegen(context, builder, signature, args):
        return builder.fma(*args)

    return a(a, b, c), codegen


# -- float64 exp and log -----------------------------------------------------------------------

_LOG2E = 1.4426950408889634
_LN2_HI = 6.93147180369123816490e-01   # 32 significant bits: k·LN2_HI is exact for |k| < 2^21
_LN2_LO = 1.90821492927058770002e-10
_EXP_ARG_MAX = 709.0                   # e^709 is finite and 2^1023 is the largest single scale
_EXP_ARG_MIN = -708.0                  # below every float32 result: rounds to 0 when narrowed
# 1/n! for n = 9 .. 2: Taylor series of e^r on |r| <= ln2/2, truncation error < 8e-12
_EXP_C9, _EXP_C8, _EXP_C7, _EXP_C6, _EXP_C5, _EXP_C4, _EXP_C3, _EXP_C2 = (
    1.0 / math.factorial(n) for n in range(9, 1, -1))


@njit(inline="always", cache=True)
def exp_f64v(t):
    """e^t in float64 for the float32 functions, ~1e-11 relative; t clamped to [-708, 709].

    Results beyond float32's range come out as large or tiny float64s that
    narrow to inf or 0. NaN propagates.
    """
    tc = _EXP_ARG_MAX if t > _EXP_ARG_MAX else t
    tc = _EXP_ARG_MIN if tc < _EXP_ARG_MIN else tc
    kf = np.floor(fma(tc, _LOG2E, 0.5))
    r = fma(kf, -_LN2_HI, tc)
    r = fma(kf, -_LN2_LO, r)
    p = fma(_EXP_C9, r, _EXP_C8)
    p = fma(p, r, _EXP_C7)
    p = fma(p, r, _EXP_C6)
    p = fma(p, r, _EXP_C5)
    p = fma(p, r, _EXP_C4)
    p = fma(p, r, _EXP_C3)
    p = fma(p, r, _EXP_C2)
    p = fma(p, r * r, r) + 1.0
    scale = float64_from_bits((np.int64(kf) + 1023) << 52)
    result = p * scale
    return result if t == t else t


_SQRT_HALF_BITS = 0x3FE6A09E667F3BCD   # bits of sqrt(2)/2
_ONE_BITS = 0x3FF0000000000000
_MANTISSA_MASK = 0x000FFFFFFFFFFFFF
_INF = math.inf
# 2/(2n+1) for n = 6 .. 1: log(m) = 2·atanh(s) = 2s + Σ 2/(2n+1)·s^(2n+1), |s| <= 0.1716,
# truncation error < 2e-12 relative
_LG6, _LG5, _LG4, _LG3, _LG2, _LG1 = (2.0 / (2 * n + 1) for n in range(6, 0, -1))


@njit(inline="always", cache=True)
def log_f64v(a):
    """ln(a) in float64, ~2e-12 relative, for a >= 0 that is normal, 0, inf or NaN.

    Every float32 is such a float64 (its subnormals are normal here), which
    is all the float32 functions pass in. ln(0) = -inf, ln(inf) = inf.
    """
    bits = float_bits(a) + (_ONE_BITS - _SQRT_HALF_BITS)
    k = (bits >> 52) - 1023
    m = float64_from_bits((bits & _MANTISSA_MASK) + _SQRT_HALF_BITS)  # in [sqrt(2)/2, sqrt(2))
    f = m - 1.0
    s = divide(f, 2.0 + f)
    z = s * s
    p = fma(_LG6, z, _LG5)
    p = fma(p, z, _LG4)
    p = fma(p, z, _LG3)
    p = fma(p, z, _LG2)
    p = fma(p, z, _LG1)
    log_m = fma(s * z, p, 2.0 * s)
    result = fma(float(k), _LN2_HI, fma(float(k), _LN2_LO, log_m))
    result = -_INF if a == 0.0 else result
    result = a if a == _INF else result
    return a if a != a else result


# -- float64 erfc ------------------------------------------------------------------------------

# erfc(z) = t·exp(P(t) − z²) with t = 1/(1 + z/2), for z >= 0. P is the degree-14
# least-squares fit, on 400 Chebyshev nodes of t in (0, 1], of log(erfcx(z)) − log(t)
# (scipy.special.erfcx), converted to monomial form. Measured relative error of the
# float64 evaluation, z in [0, 30]: 3.1e-10 (about 0.005 float32 ulp).
(_ERFC_C0, _ERFC_C1, _ERFC_C2, _ERFC_C3, _ERFC_C4, _ERFC_C5, _ERFC_C6, _ERFC_C7, _ERFC_C8, _ERFC_C9,
 _ERFC_C10, _ERFC_C11, _ERFC_C12, _ERFC_C13, _ERFC_C14) = (
    -1.2655121237987208, 1.0000001455550833, 0.37498880666661233, 0.08367277009335229,
    -0.09131571662136392, -0.09266241446704504, -0.40599886513560246, 1.3364794379268048,
    -3.6190134964885647, 7.549806960946245, -9.899898239094078, 8.020687164691722,
    -3.9593494902877104, 1.1011736715216014, -0.13305861137404779,
)


@njit(inline="always", cache=True)
def erfc_nonneg_f64v(z):
    """erfc(z) for z >= 0 (inf and NaN allowed), float64, relative error ~3e-10."""
    t = divide(1.0, fma(0.5, z, 1.0))
    p = fma(_ERFC_C14, t, _ERFC_C13)
    p = fma(p, t, _ERFC_C12)
    p = fma(p, t, _ERFC_C11)
    p = fma(p, t, _ERFC_C10)
    p = fma(p, t, _ERFC_C9)
    p = fma(p, t, _ERFC_C8)
    p = fma(p, t, _ERFC_C7)
    p = fma(p, t, _ERFC_C6)
    p = fma(p, t, _ERFC_C5)
    p = fma(p, t, _ERFC_C4)
    p = fma(p, t, _ERFC_C3)
    p = fma(p, t, _ERFC_C2)
    p = fma(p, t, _ERFC_C1)
    p = fma(p, t, _ERFC_C0)
    return t * exp_f64v(p - z * z)


# -- sin/cos argument reduction ----------------------------------------------------------------

def _pi_fixed(bits: int) -> int:
    """floor(π·2^bits), by Machin's formula in exact integer arithmetic."""
    guard = bits + 32
    one = 1 << guard

    def arctan_inverse(n: int) -> int:  # atan(1/n)·2^guard
        total, term, k, sign = 0, one // n, 1, 1
        while term:
            total += sign * (term // k)
            term //= n * n
            k += 2
            sign = -sign
        return total

    return (16 * arctan_inverse(5) - 4 * arctan_inverse(239)) >> 32


_FIRST_HUGE_EXPONENT = 150             # |x| >= 2^23: the Cody-Waite products stop being exact
_PIECE_BITS = 26                       # m·piece is exact in float64 for m < 2^24


def _quarter_turn_table() -> tuple[np.ndarray, np.ndarray]:
    """For each float32 biased exponent E >= 150: (2^e·2/π) mod 4, e = E − 150.

    A float32 |x| >= 2^23 is an integer m < 2^24 times 2^e, so
    |x|·2/π ≡ m·((2^e·2/π) mod 4) (mod 4): the quadrant and the remainder
    come from a table by exponent (a Payne-Hanek reduction). The leading
    104 bits of each entry are stored as two float64s of 52 bits (each two
    26-bit pieces, split again at run time), so a lane needs two table loads
    instead of four. Other exponents get zeros.
    """
    precision = 480
    two_over_pi = (1 << (2 * precision + 1)) // _pi_fixed(precision)  # floor(2/π·2^precision)
    high, low = np.zeros(256), np.zeros(256)
    for biased in range(_FIRST_HUGE_EXPONENT, 255):
        numerator = (two_over_pi << (biased - 150)) % (4 << precision)
        shift = numerator.bit_length() - 4 * _PIECE_BITS
        window = numerator >> shift                      # the leading 104 bits
        high[biased] = math.ldexp(float(window >> 2 * _PIECE_BITS), shift + 2 * _PIECE_BITS - precision)
        low[biased] = math.ldexp(float(window & ((1 << 2 * _PIECE_BITS) - 1)), shift - precision)
    return high, low


_TURN_HIGH, _TURN_LOW = _quarter_turn_table()
_PI_OVER_2 = math.pi / 2
_TWO_OVER_PI = 2 / math.pi
_HIGH_PIECE_MASK = ~((1 << (52 - _PIECE_BITS + 1)) - 1)   # keeps the leading 26 significant bits


@njit(inline="always", cache=True)
def _split_pieces(d):
    """d (<= 52 significant bits) as two floats of <= 26 bits each, d = a + b exactly."""
    a = float64_from_bits(float_bits(d) & _HIGH_PIECE_MASK)
    return a, d - a


def _cody_waite_pieces(bits: int = 30, pieces: int = 4) -> tuple[float, ...]:
    """π/2 as `pieces` floats of `bits` bits each (the last holds the rest): k·piece is
    exact for k < 2^(53 − bits), which covers every |x| below 2^23."""
    rest = _pi_fixed(400)  # π/2 = rest / 2^401
    scale = 401
    parts = []
    for i in range(pieces):
        top = rest.bit_length()
        keep = rest if i == pieces - 1 else rest >> (top - bits) << (top - bits)
        parts.append(math.ldexp(float(keep >> max(top - 53, 0)), max(top - 53, 0) - scale))
        rest -= keep
    return tuple(parts)


_PIO2_1, _PIO2_2, _PIO2_3, _PIO2_4 = _cody_waite_pieces()


@njit(inline="always", cache=True)
def quarter_turns_f64v(x):
    """(r, n) with |x| = (4j + n)·π/2 + r, |r| <= ~π/4, for any finite float32 x.

    `r` is float64 with ~1e-16 relative error however large |x| is or however
    close to a multiple of π/2. Below 2^23 a four-piece Cody-Waite reduction
    does it; above, the table reduction (whose loads are gathers, slow on
    this CPU, so they are masked to the lanes that need them). inf and NaN
    give garbage: callers select NaN for them.
    """
    bits = float_bits(x) & 0x7FFFFFFF
    biased = bits >> 23
    huge = biased >= _FIRST_HUGE_EXPONENT
    m = np.float64((bits & 0x7FFFFF) | 0x800000)
    high0, high1 = _split_pieces(_TURN_HIGH[biased] if huge else 0.0)
    low0, low1 = _split_pieces(_TURN_LOW[biased] if huge else 0.0)
    q = m * high0
    q0 = q - 4.0 * np.floor(q * 0.25)            # exact: drops whole turns
    q1 = m * high1
    k_huge = np.floor(q0 + q1 + 0.5)
    r_huge = (((q0 - k_huge) + q1) + (m * low0 + m * low1)) * _PI_OVER_2
    ax = abs(np.float64(x))
    k = np.floor(fma(ax, _TWO_OVER_PI, 0.5))
    r = fma(k, -_PIO2_1, ax)
    r = fma(k, -_PIO2_2, r)
    r = fma(k, -_PIO2_3, r)
    r = fma(k, -_PIO2_4, r)
    r = r_huge if huge else r
    k = k_huge if huge else k
    return r, np.int64(k) & 3


# (-1)^n/(2n+1)! and (-1)^n/(2n)!: Taylor series on |r| <= π/4, truncation < 3e-14
_S1, _S2, _S3, _S4, _S5, _S6 = ((-1) ** n / math.factorial(2 * n + 1) for n in range(1, 7))
_C1, _C2, _C3, _C4, _C5, _C6, _C7 = ((-1) ** n / math.factorial(2 * n) for n in range(1, 8))


@njit(inline="always", cache=True)
def sin_cos_reduced_f64v(r):
    """(sin r, cos r) for |r| <= ~π/4, float64."""
    z = r * r
    s = fma(_S6, z, _S5)
    s = fma(s, z, _S4)
    s = fma(s, z, _S3)
    s = fma(s, z, _S2)
    s = fma(s, z, _S1)
    c = fma(_C7, z, _C6)
    c = fma(c, z, _C5)
    c = fma(c, z, _C4)
    c = fma(c, z, _C3)
    c = fma(c, z, _C2)
    c = fma(c, z, _C1)
    return fma(r * z, s, r), fma(z, c, 1.0)
