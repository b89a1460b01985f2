"""Elementwise ops: `Elemwise(mode)`, `Where` and `Cast`.

Every mode of op-reference.md §2 is one row of `MODES`: its arity, its numpy
reference (written from the definitions there, e.g. MAX is `a > b ? a : b`,
so NaN handling follows the definition rather than `np.maximum`), whether it
needs float inputs, and which inputs are conditions (compared, not carried
into the result). Inputs that carry values must share one dtype: a static
compiler should not guess promotions, so mixing float32 and float64 is an
error that asks for an explicit cast. Python scalars are weakly typed and
take the tensor's dtype in the frontend.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
from scipy import special

from ..errors import DTypeError, ShapeError
from ..ir import Op, TensorType
from .common import FreshCopyIdentity, broadcast_shapes, checked_dtype, require_float, same_dtype

_SQRT_HALF = 0.7071067811865476
_INV_SQRT_2PI = 0.3989422804014327


def _normal_cdf(a):
    return 0.5 * (1.0 + special.erf(a * _SQRT_HALF))


def _normal_pdf(a):
    return np.exp(-0.5 * a * a) * _INV_SQRT_2PI


def _gelu(a):
    """a·Φ(a); at −inf the limit −0, not −inf·0 = NaN."""
    return np.where(a == -np.inf, -np.zeros_like(a), a * _normal_cdf(a))


def _gelu_grad(a, g):
    """g·(Φ(a) + a·φ(a)), with a·φ(a) → 0 at ±inf (its limit, not inf·0 = NaN)."""
    density = np.where(np.isinf(a), np.zeros_like(a), a * _normal_pdf(a))
    return g * (_normal_cdf(a) + density)


def _stable_sigmoid(a):
    return special.expit(a)


@dataclass(frozen=True)
class ModeSpec:
    arity: int
    fn: Callable[..., np.ndarray]
    float_only: bool = True
    conditions: tuple[int, ...] = ()  # inputs that are compared, not carried
    boolean: bool = False  # result is bool


def _zero(a):
    return np.zeros((), dtype=a.dtype)


MODES: dict[str, ModeSpec] = {
    # arithmetic
    "ADD": ModeSpec(2, np.add, float_only=False),
    "SUB": ModeSpec(2, np.subtract, float_only=False),
    "MUL": ModeSpec(2, np.multiply, float_only=False),
    "TRUE_DIV": ModeSpec(2, np.true_divide),
    "NEGATE": ModeSpec(1, np.negative, float_only=False),
    "POW": ModeSpec(2, np.power),
    "MAX": ModeSpec(2, lambda a, b: np.where(a > b, a, b), float_only=False),
    "MIN": ModeSpec(2, lambda a, b: np.where(a < b, a, b), float_only=False),
    "ABS": ModeSpec(1, np.abs, float_only=False),
    "FUSE_MUL_ADD3": ModeSpec(3, lambda a, b, c: a * b + c, float_only=False),
    # rounding (zero gradient, as torch); ROUND is half to even, FLOOR_DIV numpy's floor_divide
    "FLOOR": ModeSpec(1, np.floor),
    "CEIL": ModeSpec(1, np.ceil),
    "TRUNC": ModeSpec(1, np.trunc),
    "ROUND": ModeSpec(1, np.rint),
    "SIGN": ModeSpec(1, np.sign, float_only=False),
    "FLOOR_DIV": ModeSpec(2, np.floor_divide),
    # transcendental
    "EXP": ModeSpec(1, np.exp),
    "LOG": ModeSpec(1, np.log),
    "LOG1P": ModeSpec(1, np.log1p),
    "EXPM1": ModeSpec(1, np.expm1),
    "SQRT": ModeSpec(1, np.sqrt),
    "RSQRT": ModeSpec(1, lambda a: 1 / np.sqrt(a)),
    "SIN": ModeSpec(1, np.sin),
    "COS": ModeSpec(1, np.cos),
    "TANH": ModeSpec(1, np.tanh),
    "SIGMOID": ModeSpec(1, _stable_sigmoid),
    "ERF": ModeSpec(1, special.erf),
    "GELU": ModeSpec(1, _gelu),
    "SOFTPLUS": ModeSpec(1, lambda a: np.log1p(np.exp(-np.abs(a))) + np.where(a > 0, a, _zero(a))),
    "RELU": ModeSpec(1, lambda a: np.where(a <= 0, _zero(a), a), float_only=False),
    # comparisons
    "LT": ModeSpec(2, np.less, float_only=False, boolean=True),
    "LEQ": ModeSpec(2, np.less_equal, float_only=False, boolean=True),
    "EQ": ModeSpec(2, np.equal, float_only=False, boolean=True),
    # selects and gradient helpers (op-reference §2.4)
    "SWITCH_GT0": ModeSpec(2, lambda a, b: np.where(a > 0, b, _zero(b)), float_only=False, conditions=(0,)),
    "COND_LEQ_MOV": ModeSpec(3, lambda a, b, c: np.where(a <= b, c, _zero(c)), float_only=False, conditions=(0, 1)),
    "COND_LT_MOV": ModeSpec(3, lambda a, b, c: np.where(a < b, c, _zero(c)), float_only=False, conditions=(0, 1)),
    "ABS_GRAD": ModeSpec(2, lambda a, b: np.where(a > 0, b, -b)),
    "SIGMOID_GRAD": ModeSpec(2, lambda a, b: a * (1 - a) * b),
    "TANH_GRAD": ModeSpec(2, lambda a, b: (1 - a * a) * b),
    "GELU_GRAD": ModeSpec(2, _gelu_grad),
    "SOFTPLUS_GRAD": ModeSpec(2, lambda a, b: b * _stable_sigmoid(a)),
}


@dataclass(frozen=True)
class Elemwise(Op):
    """`out[i] = f(a[bcast(i)], b[bcast(i)], ...)` for one mode of `MODES`."""

    mode: str

    kind = "elementwise"

    @property
    def label(self) -> str:
        return f"Elemwise {self.mode}"

    @property
    def spec(self) -> ModeSpec:
        return MODES[self.mode]

    def infer(self, *inputs: TensorType) -> TensorType:
        if self.mode not in MODES:
            raise ShapeError(f"unknown mode {self.mode!r}; known: {', '.join(MODES)}", op="Elemwise")
        spec = self.spec
        if len(inputs) != spec.arity:
            raise ShapeError(f"takes {spec.arity} inputs, got {len(inputs)}", op=self.label)
        shape = broadcast_shapes(self, *(t.shape for t in inputs))
        conditions = [inputs[i] for i in spec.conditions]
        values = [t for i, t in enumerate(inputs) if i not in spec.conditions]
        if conditions:
            same_dtype(self, *conditions)
        dtype = same_dtype(self, *values)
        if dtype == np.bool_ and not spec.boolean:
            raise DTypeError("bool tensors are not accepted here; cast them first", op=self.label)
        if spec.float_only:
            for t in values:
                require_float(self, t)
        return TensorType(shape, np.dtype(np.bool_) if spec.boolean else dtype)

    def reference(self, *arrays: np.ndarray) -> np.ndarray:
        dtype = np.bool_ if self.spec.boolean else arrays[-1].dtype
        with np.errstate(all="ignore"):
            return np.asarray(self.spec.fn(*arrays)).astype(dtype, copy=False)


@dataclass(frozen=True)
class Where(Op):
    """`mask ? x : y` with numpy broadcasting (op-reference §11)."""

    kind = "elementwise"
    arity = 3

    def infer(self, mask: TensorType, x: TensorType, y: TensorType) -> TensorType:
        if mask.dtype != np.bool_:
            raise DTypeError(f"mask must be bool, got {mask.dtype.name}", op=self.label)
        dtype = same_dtype(self, x, y)
        return TensorType(broadcast_shapes(self, mask.shape, x.shape, y.shape), dtype)

    def reference(self, mask, x, y):
        return np.where(mask, x, y).astype(x.dtype, copy=False)


@dataclass(frozen=True)
class Cast(Op):
    """Convert to `dtype` (numpy `astype`)."""

    dtype: np.dtype

    kind = "elementwise"
    arity = 1

    def infer(self, x: TensorType) -> TensorType:
        return TensorType(x.shape, checked_dtype(self, self.dtype))

    def reference(self, x):
        return x.astype(self.dtype)


@dataclass(frozen=True)
class StopGradient(FreshCopyIdentity, Op):
    """Identity whose input gets no gradient (the max shift of a stable softmax)."""
