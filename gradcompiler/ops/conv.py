"""2-D convolution: Convolution and its two backward ops (docs/op-reference.md §13).

MegEngine's names with torch.nn.functional's semantics: NCHW activations,
OIHW filters of shape (O, C / groups, KH, KW), symmetric zero padding,
dilation, and groups (groups = C = O is a depthwise convolution). Every
field is an (h, w) pair; the frontend turns torch's int-or-pair arguments
into pairs.

The three ops are the three faces of one bilinear form

    <Convolution(x, w), dy> = <x, BackwardData(w, dy)> = <w, BackwardFilter(x, dy)>

so each one's gradients are the other two (rules/conv.py), and the set is
closed under differentiation: grad of grad needs no new op.
BackwardData takes the image size as a parameter because several image
sizes give the same output size when stride > 1 (conv_transpose2d's
output_padding picks one); BackwardFilter takes the kernel size, so
neither reads a value its formula does not need.

The references are plain numpy: one einsum per kernel tap over a padded,
grouped view. They are the oracle of both backends, so they share nothing
with the kernels (im2col, col2im) but the geometry.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..ir import Op, TensorType
from .common import require_float, same_dtype

Pair = tuple[int, int]


def _is_pair(value: object, minimum: int) -> bool:
    return (isinstance(value, tuple) and len(value) == 2
            and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) and v >= minimum
                    for v in value))


def check_pairs(op: Op, **pairs: tuple[object, int]) -> None:
    """Each field a pair of ints at least its minimum: `name=(value, minimum)`."""
    for name, (value, minimum) in pairs.items():
        if not _is_pair(value, minimum):
            raise op.shape_error(f"{name} must be two ints >= {minimum}, got {value!r}")


def window_extent(kernel: int, dilation: int) -> int:
    """How many input pixels a dilated kernel spans along one axis."""
    return dilation * (kernel - 1) + 1


class Geometry(NamedTuple):
    """The static sizes of one convolution, shared by the three ops and every kernel."""

    n: int
    c: int            # input channels
    o: int            # output channels
    groups: int
    image: Pair       # (H, W)
    kernel: Pair      # (KH, KW)
    out: Pair         # (OH, OW)
    stride: Pair
    padding: Pair
    dilation: Pair

    @property
    def c_per_group(self) -> int:
        return self.c // self.groups

    @property
    def o_per_group(self) -> int:
        return self.o // self.groups

    @property
    def x_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.c, *self.image)

    @property
    def w_shape(self) -> tuple[int, int, int, int]:
        return (self.o, self.c_per_group, *self.kernel)

    @property
    def y_shape(self) -> tuple[int, int, int, int]:
        return (self.n, self.o, *self.out)


@dataclass(frozen=True)
class _ConvParams:
    """The fields and checks the three ops share. A mixin rather than an Op subclass,
    so it is not listed as an op."""

    stride: Pair = (1, 1)
    padding: Pair = (0, 0)
    dilation: Pair = (1, 1)
    groups: int = 1

    kind = "library"
    arity = 2

    def check_params(self) -> None:
        check_pairs(self, stride=(self.stride, 1), padding=(self.padding, 0),
                    dilation=(self.dilation, 1))
        if (not isinstance(self.groups, (int, np.integer)) or isinstance(self.groups, bool)
                or self.groups < 1):
            raise self.shape_error(f"groups must be an int >= 1, got {self.groups!r}")

    def check_4d(self, t: TensorType, what: str, layout: str) -> None:
        require_float(self, t, what)
        if t.ndim != 4:
            raise self.shape_error(f"{what} must be 4-D ({layout}), got shape {t.shape}")

    def output_size(self, image: Pair, kernel: Pair, x_shape: tuple) -> Pair:
        """(OH, OW), or an error when the dilated kernel does not fit the padded image."""
        out = []
        for axis in range(2):
            padded = image[axis] + 2 * self.padding[axis]
            extent = window_extent(kernel[axis], self.dilation[axis])
            if extent > padded:
                raise self.shape_error(
                    f"kernel {kernel} (dilation {self.dilation}, spanning {extent} pixels) is "
                    f"larger than the padded image: input {x_shape} with padding {self.padding}")
            out.append((padded - extent) // self.stride[axis] + 1)
        return out[0], out[1]

    def geometry(self, x_shape: tuple, w_shape: tuple) -> Geometry:
        """The geometry of convolving images of `x_shape` with filters of `w_shape`."""
        n, c, h, w = x_shape
        o, c_group, kh, kw = w_shape
        groups = self.groups
        if c % groups or o % groups:
            raise self.shape_error(
                f"groups={groups} must divide the input channels ({c}, input {x_shape}) and "
                f"the output channels ({o}, filter {w_shape})")
        if c_group != c // groups:
            raise self.shape_error(
                f"filter {w_shape} has {c_group} input channels per group but the input "
                f"{x_shape} has {c} channels in {groups} group(s) ({c // groups} per group)")
        if min(kh, kw) < 1 or min(h, w) < 1:
            raise self.shape_error(f"empty image or kernel: input {x_shape}, filter {w_shape}")
        out = self.output_size((h, w), (kh, kw), x_shape)
        return Geometry(n, c, o, groups, (h, w), (kh, kw), out, self.stride, self.padding,
                        self.dilation)


def _padded(x: np.ndarray, g: Geometry) -> np.ndarray:
    (ph, pw) = g.padding
    return np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))


def _grouped_taps(padded: np.ndarray, g: Geometry):
    """Yield (kh, kw, view): view[n, group, c, oh, ow] is the pixel of the padded input that
    tap (kh, kw) of output pixel (oh, ow) reads, for channel c of the group (a view, so
    adding into it scatters)."""
    (sh, sw), (dh, dw) = g.stride, g.dilation
    grouped = padded.reshape(g.n, g.groups, g.c_per_group, *padded.shape[2:])
    for kh in range(g.kernel[0]):
        for kw in range(g.kernel[1]):
            rows = slice(kh * dh, kh * dh + sh * (g.out[0] - 1) + 1, sh)
            cols = slice(kw * dw, kw * dw + sw * (g.out[1] - 1) + 1, sw)
            yield kh, kw, grouped[..., rows, cols]


def _grouped_filter(w: np.ndarray, g: Geometry) -> np.ndarray:
    return w.reshape(g.groups, g.o_per_group, g.c_per_group, *g.kernel)


def _grouped_output(dy: np.ndarray, g: Geometry) -> np.ndarray:
    return dy.reshape(g.n, g.groups, g.o_per_group, *g.out)


def conv_reference(x: np.ndarray, w: np.ndarray, g: Geometry) -> np.ndarray:
    wg = _grouped_filter(w, g)
    y = np.zeros((g.n, g.groups, g.o_per_group, *g.out), np.result_type(x, w))
    for kh, kw, tap in _grouped_taps(_padded(x, g), g):
        y += np.einsum("ngchw,goc->ngohw", tap, wg[..., kh, kw])
    return y.reshape(g.y_shape)


def backward_data_reference(w: np.ndarray, dy: np.ndarray, g: Geometry) -> np.ndarray:
    """The adjoint of conv_reference in x: each tap's contribution added back where it read."""
    (ph, pw) = g.padding
    padded = _padded(np.zeros(g.x_shape, dy.dtype), g)
    wg, dyg = _grouped_filter(w, g), _grouped_output(dy, g)
    for kh, kw, tap in _grouped_taps(padded, g):
        tap += np.einsum("ngohw,goc->ngchw", dyg, wg[..., kh, kw])  # a view of `padded`
    return padded[:, :, ph:ph + g.image[0], pw:pw + g.image[1]].copy()


def backward_filter_reference(x: np.ndarray, dy: np.ndarray, g: Geometry) -> np.ndarray:
    dyg = _grouped_output(dy, g)
    dw = np.zeros((g.groups, g.o_per_group, g.c_per_group, *g.kernel), dy.dtype)
    for kh, kw, tap in _grouped_taps(_padded(x, g), g):
        dw[..., kh, kw] = np.einsum("ngchw,ngohw->goc", tap, dyg)
    return dw.reshape(g.w_shape)


@dataclass(frozen=True)
class Convolution(_ConvParams, Op):
    """Inputs (x (N, C, H, W), w (O, C/groups, KH, KW)) → y (N, O, OH, OW) (§13.1)."""

    def geometry_of(self, x: TensorType, w: TensorType) -> Geometry:
        self.check_params()
        self.check_4d(x, "input", "N, C, H, W")
        self.check_4d(w, "filter", "O, C/groups, KH, KW")
        same_dtype(self, x, w)
        return self.geometry(x.shape, w.shape)

    def infer(self, x: TensorType, w: TensorType) -> TensorType:
        return TensorType(self.geometry_of(x, w).y_shape, x.dtype)

    def reference(self, x, w):
        g = self.geometry(x.shape, w.shape)
        return conv_reference(x, w, g).astype(x.dtype)


@dataclass(frozen=True)
class ConvolutionBackwardData(_ConvParams, Op):
    """Inputs (w, dy) → dx (N, C, *image): d out / d x of a convolution of images of size
    `image`; also the forward of a transposed convolution (§13.2)."""

    image: Pair = (1, 1)

    def geometry_of(self, w: TensorType, dy: TensorType) -> Geometry:
        self.check_params()
        check_pairs(self, image=(self.image, 1))
        self.check_4d(w, "filter", "O, C/groups, KH, KW")
        self.check_4d(dy, "output gradient", "N, O, OH, OW")
        same_dtype(self, w, dy)
        n, o = dy.shape[:2]
        if o != w.shape[0]:
            raise self.shape_error(
                f"output gradient {dy.shape} has {o} channels but the filter {w.shape} has "
                f"{w.shape[0]} output channels")
        g = self.geometry((n, w.shape[1] * self.groups, *self.image), w.shape)
        if g.out != dy.shape[2:]:
            raise self.shape_error(
                f"images of size {self.image} convolve to {g.out}, not to the output "
                f"gradient's {dy.shape[2:]} (filter {w.shape}, stride {self.stride}, "
                f"padding {self.padding}, dilation {self.dilation})")
        return g

    def infer(self, w: TensorType, dy: TensorType) -> TensorType:
        return TensorType(self.geometry_of(w, dy).x_shape, dy.dtype)

    def reference(self, w, dy):
        return backward_data_reference(w, dy, self.geometry_of(_type(w), _type(dy)))


@dataclass(frozen=True)
class ConvolutionBackwardFilter(_ConvParams, Op):
    """Inputs (x, dy) → dw (O, C/groups, *kernel): d out / d w (§13.3)."""

    kernel: Pair = (1, 1)

    def geometry_of(self, x: TensorType, dy: TensorType) -> Geometry:
        self.check_params()
        check_pairs(self, kernel=(self.kernel, 1))
        self.check_4d(x, "input", "N, C, H, W")
        self.check_4d(dy, "output gradient", "N, O, OH, OW")
        same_dtype(self, x, dy)
        if x.shape[0] != dy.shape[0]:
            raise self.shape_error(
                f"input {x.shape} and output gradient {dy.shape} have different batch sizes")
        # groups that do not divide C fail in `geometry`, before the per-group count matters
        g = self.geometry(x.shape, (dy.shape[1], x.shape[1] // self.groups, *self.kernel))
        if g.out != dy.shape[2:]:
            raise self.shape_error(
                f"input {x.shape} convolves to {g.out} with a {self.kernel} kernel, not to "
                f"the output gradient's {dy.shape[2:]}")
        return g

    def infer(self, x: TensorType, dy: TensorType) -> TensorType:
        return TensorType(self.geometry_of(x, dy).w_shape, dy.dtype)

    def reference(self, x, dy):
        return backward_filter_reference(x, dy, self.geometry_of(_type(x), _type(dy)))


def _type(array: np.ndarray) -> TensorType:
    return TensorType(array.shape, array.dtype)
