"""Helpers shared by the op families: broadcasting, axis normalisation, dtype
checks, and the fresh-copy identity behaviour two ops share.

Each helper takes the op so that the error it raises names it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from ..errors import DTypeError, ShapeError
from ..ir import Op, TensorType


def broadcast_shapes(op: Op, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """numpy broadcasting of `shapes`, or a ShapeError naming `op` and every shape."""
    ndim = max((len(s) for s in shapes), default=0)
    padded = [(1,) * (ndim - len(s)) + tuple(s) for s in shapes]
    result = []
    for dims in zip(*padded):
        sizes = {d for d in dims if d != 1}
        if len(sizes) > 1:
            listed = " and ".join(str(tuple(s)) for s in shapes)
            raise ShapeError(f"shapes {listed} do not broadcast", op=op.label)
        result.append(sizes.pop() if sizes else 1)
    return tuple(result)


def normalize_axis(op: Op, axis: int, ndim: int) -> int:
    """`axis` in [-ndim, ndim) mapped to [0, ndim), else a ShapeError."""
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise ShapeError(f"axis must be an int, got {axis!r}", op=op.label)
    if not -ndim <= axis < ndim:
        raise ShapeError(f"axis {axis} is out of range for a tensor of rank {ndim}", op=op.label)
    return int(axis) % ndim if ndim else 0


def normalize_axes(op: Op, axes: Sequence[int], ndim: int) -> tuple[int, ...]:
    normalized = tuple(normalize_axis(op, a, ndim) for a in axes)
    if len(set(normalized)) != len(normalized):
        raise ShapeError(f"repeated axis in {tuple(axes)}", op=op.label)
    return normalized


def same_dtype(op: Op, *types: TensorType) -> np.dtype:
    """The common dtype of `types`; differing dtypes are an error (cast explicitly)."""
    dtypes = {t.dtype for t in types}
    if len(dtypes) > 1:
        names = ", ".join(t.dtype.name for t in types)
        raise DTypeError(f"input dtypes {names} differ; cast explicitly with .astype()", op=op.label)
    return types[0].dtype


def checked_dtype(op: Op | str, dtype) -> np.dtype:
    """`dtype` as a numpy dtype the compiler can run (bool, an integer or a float), or a
    DTypeError: an object, string or complex tensor would only fail later, inside generated code."""
    label = op if isinstance(op, str) else op.label
    try:
        result = np.dtype(dtype)
    except (TypeError, ValueError):
        raise DTypeError(f"{dtype!r} is not a dtype", op=label) from None
    if result.kind not in "biuf":
        raise DTypeError(f"dtype {result} is not supported; use bool, an integer or a float dtype", op=label)
    return result


def require_float(op: Op, t: TensorType, what: str = "input") -> None:
    if t.dtype.kind != "f":
        raise DTypeError(f"{what} must be a float tensor, got {t.dtype.name}", op=op.label)


def require_int(op: Op, t: TensorType, what: str = "index") -> None:
    if t.dtype.kind not in "iu":
        raise DTypeError(f"{what} must be an integer tensor, got {t.dtype.name}", op=op.label)


def check_shape_tuple(op: Op, shape: Sequence[int], what: str = "shape") -> tuple[int, ...]:
    """`shape` as a tuple of non-negative ints. Floats and bools are refused, not truncated."""
    try:
        items = tuple(shape)
    except TypeError:
        items = (shape,)
    if not all(isinstance(d, (int, np.integer)) and not isinstance(d, (bool, np.bool_)) for d in items):
        raise ShapeError(f"{what} must be a tuple of ints, got {shape!r}", op=op.label)
    dims = tuple(int(d) for d in items)
    if any(d < 0 for d in dims):
        raise ShapeError(f"{what} {dims} has a negative size", op=op.label)
    return dims


class FreshCopyIdentity:
    """Mixin for identity ops whose output is a new buffer equal to the input.

    StopGradient and FastpathCopy compute the same value and differ only in
    what later passes do with them (differentiation vs. memory planning), so
    their shape rule and reference live here once. It is a mixin rather than
    an Op subclass so that `all_op_classes()` does not list it as an op:
    list it before `Op` in the bases, e.g. `class StopGradient(FreshCopyIdentity, Op)`.
    """

    kind: ClassVar[str] = "elementwise"
    arity: ClassVar[int | None] = 1

    def infer(self, x: TensorType) -> TensorType:
        return x

    def reference(self, x: np.ndarray) -> np.ndarray:
        return x.copy()
