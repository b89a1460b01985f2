"""Scalar Python/Numba expressions for the elementwise ops of a kernel.

`scalar_expr(op, args, dtype, arg_dtypes)` returns the source of one
elementwise op applied to variables `args` (sanitised names) producing
`dtype`, plus the `mathfuncs` functions it calls. It dispatches on the op
class (`Elemwise` then on its mode through `_MODES`, `Where`, `Cast`), so a
new op is one registered function.

Rules the expressions follow so that loops vectorise and float32 stays
float32: selects are conditional expressions (`a if c else b`, which LLVM
turns into a `select`, never a branch); every literal is typed
(`np.float32(0.5)`, built with `repr` of a number computed here, never of
user data); integer results are wrapped back to their dtype (`np.int32(a +
b)`), since Numba widens int32 arithmetic to int64 and numpy wraps;
transcendentals call the `<name>_f32`/`<name>_f64` functions of
`mathfuncs` (branch-free float32 approximations, exact float64 libm).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import singledispatch

import numpy as np

from ...ir import Op
from ...ops.elemwise import Cast, Elemwise, Where

MATH_MODES = {"EXP", "LOG", "LOG1P", "EXPM1", "SQRT", "RSQRT", "SIN", "COS", "TANH", "SIGMOID", "ERF",
              "GELU", "SOFTPLUS", "POW", "GELU_GRAD", "SOFTPLUS_GRAD",
              "FLOOR", "CEIL", "TRUNC", "ROUND", "FLOOR_DIV"}


def numba_type_name(dtype: np.dtype) -> str:
    """The numpy scalar constructor of `dtype` as generated code spells it."""
    return "np.bool_" if dtype == np.bool_ else f"np.{np.dtype(dtype).name}"


def literal(value: float | int, dtype: np.dtype) -> str:
    """A typed literal: `np.float32(0.5)`; the number is `repr` of a Python int or float."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return repr(bool(value))
    if dtype.kind == "f":
        number = float(value)
        text = repr(number) if np.isfinite(number) else ("np.inf" if number > 0 else "-np.inf")
        return f"{numba_type_name(dtype)}({text})"
    return f"{numba_type_name(dtype)}({int(value)!r})"


def reduction_identity(mode: str, dtype: np.dtype) -> str:
    """The typed literal a `mode` reduction starts from (0, 1, or the dtype's extreme).

    The CPU and CUDA code generators both seed accumulators with it, so the
    two backends cannot disagree on a reduction's starting value.
    """
    dtype = np.dtype(dtype)
    if mode == "SUM":
        return literal(0, dtype)
    if mode == "PRODUCT":
        return literal(1, dtype)
    if dtype.kind == "f":
        return literal(-np.inf if mode == "MAX" else np.inf, dtype)
    info = np.iinfo(dtype)
    return literal(info.min if mode == "MAX" else info.max, dtype)


def math_suffix(dtype: np.dtype) -> str:
    return {np.dtype(np.float32): "f32", np.dtype(np.float64): "f64"}[np.dtype(dtype)]


class Expr:
    """The source of one scalar expression and the math functions it calls."""

    def __init__(self, text: str, calls: Sequence[str] = ()):
        self.text = text
        self.calls = tuple(calls)


@singledispatch
def scalar_expr(op: Op, args: Sequence[str], dtype: np.dtype, arg_dtypes: Sequence[np.dtype]) -> Expr:
    raise NotImplementedError(f"the CPU backend has no scalar form of {op.label}")


@scalar_expr.register
def _(op: Where, args, dtype, arg_dtypes):
    mask, x, y = args
    return Expr(f"{x} if {mask} else {y}")


@scalar_expr.register
def _(op: Cast, args, dtype, arg_dtypes):
    (x,) = args
    if np.dtype(dtype) == np.bool_:
        return Expr(f"{x} != 0")
    return Expr(f"{numba_type_name(dtype)}({x})")


@scalar_expr.register
def _(op: Elemwise, args, dtype, arg_dtypes):
    dtype = np.dtype(dtype)
    if op.mode in MATH_MODES:
        name = f"{op.mode.lower()}_{math_suffix(dtype)}"
        return Expr(f"{name}({', '.join(args)})", (name,))
    zero, one = literal(0, dtype), literal(1, dtype)
    text = _MODES[op.mode](list(args), zero, one)
    if dtype.kind in "iu":
        text = f"{numba_type_name(dtype)}({text})"
    return Expr(text)


_Mode = Callable[[list, str, str], str]

_MODES: dict[str, _Mode] = {
    "ADD": lambda a, z, o: f"{a[0]} + {a[1]}",
    "SUB": lambda a, z, o: f"{a[0]} - {a[1]}",
    "MUL": lambda a, z, o: f"{a[0]} * {a[1]}",
    "TRUE_DIV": lambda a, z, o: f"{a[0]} / {a[1]}",
    "NEGATE": lambda a, z, o: f"-{a[0]}",
    "MAX": lambda a, z, o: f"{a[0]} if {a[0]} > {a[1]} else {a[1]}",
    "MIN": lambda a, z, o: f"{a[0]} if {a[0]} < {a[1]} else {a[1]}",
    "ABS": lambda a, z, o: f"abs({a[0]})",
    "FUSE_MUL_ADD3": lambda a, z, o: f"{a[0]} * {a[1]} + {a[2]}",
    "RELU": lambda a, z, o: f"{z} if {a[0]} <= {z} else {a[0]}",
    # a - a: 0 for ±0 (numpy's sign(-0.0) is +0.0) and NaN for NaN
    "SIGN": lambda a, z, o: f"{o} if {a[0]} > {z} else (-{o} if {a[0]} < {z} else {a[0]} - {a[0]})",
    "LT": lambda a, z, o: f"{a[0]} < {a[1]}",
    "LEQ": lambda a, z, o: f"{a[0]} <= {a[1]}",
    "EQ": lambda a, z, o: f"{a[0]} == {a[1]}",
    "SWITCH_GT0": lambda a, z, o: f"{a[1]} if {a[0]} > 0 else {z}",
    "COND_LEQ_MOV": lambda a, z, o: f"{a[2]} if {a[0]} <= {a[1]} else {z}",
    "COND_LT_MOV": lambda a, z, o: f"{a[2]} if {a[0]} < {a[1]} else {z}",
    "ABS_GRAD": lambda a, z, o: f"{a[1]} if {a[0]} > 0 else -{a[1]}",
    "SIGMOID_GRAD": lambda a, z, o: f"{a[0]} * ({o} - {a[0]}) * {a[1]}",
    "TANH_GRAD": lambda a, z, o: f"({o} - {a[0]} * {a[0]}) * {a[1]}",
}
