"""2-D pooling: Pooling and PoolingBackward (docs/op-reference.md §14).

MegEngine's names and modes (MAX, AVERAGE, AVERAGE_COUNT_EXCLUDE_PADDING)
with torch.nn.functional's geometry: NCHW, symmetric padding of at most
half the kernel, and ceil_mode, whose last window may hang over the padded
image but never starts inside the right padding. A window's AVERAGE
divisor counts the padding it covers but not what lies beyond it (torch's
count_include_pad); AVERAGE_COUNT_EXCLUDE_PADDING counts image pixels only.

MAX picks, in each window, the tap torch's max_pool2d picks: over the
window's pixels inside the image, in row-major order, the first maximum,
except that a NaN is taken wherever it comes (so a window holding a NaN
yields NaN, at its last NaN); the padding is never picked (it counts as
-inf, and a window whose pixels are all -inf yields its first pixel's
-inf). The gradient goes to the picked tap. Its backward and its double
backward both need "the value at x's picked tap", so MAX Pooling takes an
optional second input `values`: with it, each window yields
values[argmax of x over the window] (without it, values is x). That one
op is the adjoint of MAX PoolingBackward in its gradient input, which
closes the family under differentiation (rules/conv.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from ..errors import GraphError
from ..ir import Op, TensorType
from .common import require_float, same_dtype
from .conv import Pair, check_pairs

POOL_MODES = ("MAX", "AVERAGE", "AVERAGE_COUNT_EXCLUDE_PADDING")


def pooled_size(size: int, kernel: int, stride: int, padding: int, ceil_mode: bool) -> int:
    """torch's pooling_output_shape along one axis."""
    out = (size + 2 * padding - kernel + (stride - 1 if ceil_mode else 0)) // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1  # the last window would start inside the right padding
    return out


def divisors(op: _PoolParams, image: Pair, out: Pair) -> np.ndarray:
    """(OH, OW) AVERAGE divisor of each window (float64)."""
    counts = []
    for axis in range(2):
        start = np.arange(out[axis]) * op.stride[axis] - op.padding[axis]
        end = np.minimum(start + op.kernel[axis], image[axis] + op.padding[axis])
        if op.mode == "AVERAGE_COUNT_EXCLUDE_PADDING":
            start, end = np.maximum(start, 0), np.minimum(end, image[axis])
        counts.append((end - start).astype(np.float64))
    return counts[0][:, None] * counts[1][None, :]


@dataclass(frozen=True)
class _PoolParams:
    """Fields and checks Pooling and PoolingBackward share (a mixin, not an op)."""

    mode: str = "MAX"
    kernel: Pair = (1, 1)
    stride: Pair = (1, 1)
    padding: Pair = (0, 0)
    ceil_mode: bool = False

    kind: ClassVar[str] = "library"

    @property
    def label(self) -> str:
        return f"{type(self).__name__} {self.mode}"

    def check_params(self) -> None:
        if self.mode not in POOL_MODES:
            raise self.shape_error(f"unknown mode {self.mode!r}; expected one of {POOL_MODES}")
        check_pairs(self, kernel=(self.kernel, 1), stride=(self.stride, 1),
                    padding=(self.padding, 0))
        if any(2 * p > k for p, k in zip(self.padding, self.kernel)):
            raise self.shape_error(
                f"padding {self.padding} must be at most half the kernel {self.kernel}")
        if not isinstance(self.ceil_mode, bool):
            raise self.shape_error(f"ceil_mode must be a bool, got {self.ceil_mode!r}")

    def check_image(self, t: TensorType, what: str) -> None:
        require_float(self, t, what)
        if t.ndim != 4:
            raise self.shape_error(f"{what} must be 4-D (N, C, H, W), got shape {t.shape}")

    def output_size(self, shape: tuple) -> Pair:
        out = []
        for axis in range(2):
            size = shape[2 + axis] + 2 * self.padding[axis]
            if self.kernel[axis] > size:
                raise self.shape_error(
                    f"kernel {self.kernel} is larger than the padded image: input {shape} "
                    f"with padding {self.padding}")
            out.append(pooled_size(shape[2 + axis], self.kernel[axis], self.stride[axis],
                                   self.padding[axis], self.ceil_mode))
        return out[0], out[1]

    # -- the reference's window walk ------------------------------------------------------------
    def padded(self, x: np.ndarray, out: Pair, fill: float) -> np.ndarray:
        """`x` padded with `fill` far enough that every tap of every window exists."""
        pads = [(0, 0), (0, 0)]
        for axis in range(2):
            right = (out[axis] - 1) * self.stride[axis] + self.kernel[axis]
            right -= x.shape[2 + axis] + self.padding[axis]
            pads.append((self.padding[axis], max(right, 0)))
        return np.pad(x, pads, constant_values=fill)

    def taps(self, out: Pair):
        """Yield (tap number, rows, cols): padded[:, :, rows, cols][n, c, oh, ow] is tap
        (kh, kw) of window (oh, ow), tap numbers in row-major window order."""
        (kh_n, kw_n), (sh, sw) = self.kernel, self.stride
        for kh in range(kh_n):
            for kw in range(kw_n):
                rows = slice(kh, kh + sh * (out[0] - 1) + 1, sh)
                cols = slice(kw, kw + sw * (out[1] - 1) + 1, sw)
                yield kh * kw_n + kw, rows, cols

    def max_taps(self, x: np.ndarray, out: Pair) -> np.ndarray:
        """(N, C, OH, OW) number of the tap MAX picks in each window (module docstring): starting
        from the window's first pixel inside the image, each later pixel that is greater, or
        NaN, takes its place; padding never does."""
        padded = self.padded(x, out, -np.inf)
        inside = self.padded(np.ones((1, 1, *x.shape[2:]), bool), out, False)
        best = np.full((*x.shape[:2], *out), -np.inf, x.dtype)
        where = np.full(best.shape, -1, np.int64)
        for t, rows, cols in self.taps(out):
            tap, image = padded[:, :, rows, cols], inside[:, :, rows, cols]
            where = np.where((where < 0) & image, t, where)
            taken = image & ((tap > best) | np.isnan(tap))
            best = np.where(taken, tap, best)
            where = np.where(taken, t, where)
        return where


@dataclass(frozen=True)
class Pooling(_PoolParams, Op):
    """Input x (N, C, H, W), for MAX optionally (x, values) → (N, C, OH, OW) (§14.1)."""

    def check_arity(self, inputs: tuple[TensorType, ...]) -> None:
        counts = (1, 2) if self.mode == "MAX" else (1,)
        if len(inputs) not in counts:
            raise GraphError(f"takes {' or '.join(map(str, counts))} input(s), got {len(inputs)}",
                             op=self.label)

    def infer(self, x: TensorType, values: TensorType | None = None) -> TensorType:
        self.check_params()
        self.check_image(x, "input")
        if values is not None:
            same_dtype(self, x, values)
            if values.shape != x.shape:
                raise self.shape_error(
                    f"values {values.shape} must have the input's shape {x.shape}")
        return TensorType((*x.shape[:2], *self.output_size(x.shape)), x.dtype)

    def reference(self, x, values=None):
        out = self.output_size(x.shape)
        if self.mode == "MAX":
            where = self.max_taps(x, out)
            source = self.padded(x if values is None else values, out, 0.0)
            y = np.zeros((*x.shape[:2], *out), x.dtype)
            for t, rows, cols in self.taps(out):
                y = np.where(where == t, source[:, :, rows, cols], y)
            return y
        padded = self.padded(x.astype(np.float64), out, 0.0)
        total = sum(padded[:, :, rows, cols] for _, rows, cols in self.taps(out))
        return (total / divisors(self, x.shape[2:], out)).astype(x.dtype)


@dataclass(frozen=True)
class PoolingBackward(_PoolParams, Op):
    """d out / d x of Pooling over images of size `image`: MAX (x, dy), AVERAGE modes (dy,)
    → dx (N, C, *image) (§14.2)."""

    image: Pair = (1, 1)

    def check_arity(self, inputs: tuple[TensorType, ...]) -> None:
        count = 2 if self.mode == "MAX" else 1
        if len(inputs) != count:
            raise GraphError(f"takes {count} input(s) in mode {self.mode}, got {len(inputs)}",
                             op=self.label)

    def infer(self, *inputs: TensorType) -> TensorType:
        self.check_params()
        check_pairs(self, image=(self.image, 1))
        dy = inputs[-1]
        self.check_image(dy, "output gradient")
        shape = (*dy.shape[:2], *self.image)
        if self.mode == "MAX":
            x = inputs[0]
            same_dtype(self, x, dy)
            if x.shape != shape:
                raise self.shape_error(
                    f"input {x.shape} must be the images {shape} the gradient {dy.shape} "
                    "belongs to")
        out = self.output_size(shape)
        if out != dy.shape[2:]:
            raise self.shape_error(
                f"images {shape} pool to {out}, not to the gradient's {dy.shape[2:]}")
        return TensorType(shape, dy.dtype)

    def reference(self, *arrays):
        dy = arrays[-1]
        n, c, oh, ow = dy.shape
        shape = (n, c, *self.image)
        padded = self.padded(np.zeros(shape, np.float64), (oh, ow), 0.0)
        if self.mode == "MAX":
            where = self.max_taps(arrays[0], (oh, ow))
            for t, rows, cols in self.taps((oh, ow)):
                padded[:, :, rows, cols] += np.where(where == t, dy, 0)
        else:
            share = dy / divisors(self, self.image, (oh, ow))
            for _, rows, cols in self.taps((oh, ow)):
                padded[:, :, rows, cols] += share
        ph, pw = self.padding
        return padded[:, :, ph:ph + self.image[0], pw:pw + self.image[1]].astype(dy.dtype)
