"""Image warps: WarpPerspective, WarpAffine, the two backward ops of the
perspective warp (op-reference §9) and the forward-mode product along its
matrix, WarpPerspectiveTangentMat (docs/op-reference.md).

All five share one sampling model (§9.2): the matrix maps *output* pixel
coordinates to *source* coordinates (an inverse map, no half-pixel offset),
the four integer taps around the source point are mapped through the border
mode one by one, and the result is their bilinear blend. `_sample` computes
that model once, vectorised over every output pixel, and each op's
`reference` is a few lines on top of it. The references are the oracle of
the compiled backends, so they stay plain numpy: no per-pixel Python loop.

Layout: the maths is identical for NCHW and NHWC; the references work on
channels-last views and transpose at the edges.

Non-finite source coordinates (a zero denominator): in CONSTANT mode the
pixel is `border_val` with a zero gradient (as is any non-finite result,
§9.2); in the other modes, where MegEngine's behaviour is undefined, the
pixel is NaN and no gradient flows from it. Finite coordinates of any size
are exact: periodic border maps reduce the tap modulo their period before it
becomes an integer.

The backward ops take the source *shape* (BackwardData) or the source value
(BackwardMat) explicitly, so a backward graph reads exactly what its formula
needs. BackwardData is the exact adjoint of the forward for a fixed matrix
(scatter-add with `np.add.at`); BackwardMat follows §9.5 term by term and
skips every non-finite term, as MegEngine's kernel does. TangentMat sums
the very same terms (`_mat_terms`) over the matrix entries instead of over
the pixels, so it is BackwardMat's exact adjoint: the transpose that forward
mode and a gradient of BackwardMat need.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import numpy as np

from ..errors import GraphError, IndexOutOfRangeError
from ..ir import Op, TensorType
from .common import require_float, require_int, same_dtype

BORDER_MODES = ("replicate", "reflect", "reflect_101", "wrap", "constant")
FORMATS = ("NCHW", "NHWC")


# -- the sampling model (§9.2) ------------------------------------------------------------------

def border_index(p: np.ndarray, length: int, mode: str) -> tuple[np.ndarray, np.ndarray]:
    """Map integer-valued float taps `p` into [0, length): (index, valid).

    `valid` is False only for CONSTANT taps outside the image (they read
    border_val); their index is clamped so it can still be used to gather.
    """
    if mode in ("replicate", "constant"):
        clipped = np.clip(p, -1, length).astype(np.int64)
        inside = (clipped >= 0) & (clipped < length)
        valid = inside if mode == "constant" else np.ones(p.shape, bool)
        return np.clip(clipped, 0, length - 1), valid
    everywhere = np.ones(p.shape, bool)
    if length == 1:
        return np.zeros(p.shape, np.int64), everywhere
    if mode == "wrap":
        return np.mod(p, length).astype(np.int64), everywhere
    # reflections are periodic: reduce first, then fold the upper half back
    period = 2 * length if mode == "reflect" else 2 * length - 2
    q = np.mod(p, period).astype(np.int64)
    mirror = period - 1 - q if mode == "reflect" else period - q
    return np.where(q < length, q, mirror), everywhere


class _Tap(NamedTuple):
    row: np.ndarray     # (N, OH, OW) source row after the border map
    col: np.ndarray     # (N, OH, OW) source column after the border map
    weight: np.ndarray  # (N, OH, OW) bilinear weight
    valid: np.ndarray   # (N, OH, OW) False where the tap reads border_val (or the pixel is bad)


class _Sampling(NamedTuple):
    """Everything the references need about where each output pixel samples."""

    xs: np.ndarray      # (N, OH, OW) source column; 0 where `bad`
    ys: np.ndarray      # source row; 0 where `bad`
    den: np.ndarray     # the perspective denominator (1 for an affine matrix)
    alpha_x: np.ndarray
    alpha_y: np.ndarray
    bad: np.ndarray     # non-finite coordinates
    taps: tuple[_Tap, _Tap, _Tap, _Tap]  # order: (y0,x0), (y0,x0+1), (y0+1,x0), (y0+1,x0+1)


def _sample(mat: np.ndarray, in_hw: tuple[int, int], out_hw: tuple[int, int],
            mode: str) -> _Sampling:
    """Source coordinates, bilinear weights and border-mapped taps for every output pixel."""
    dtype = mat.dtype
    oh = np.arange(out_hw[0], dtype=dtype)[None, :, None]
    ow = np.arange(out_hw[1], dtype=dtype)[None, None, :]
    m = [mat[:, k // 3, k % 3][:, None, None] for k in range(9)]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        den = m[6] * ow + m[7] * oh + m[8]
        xs = (m[0] * ow + m[1] * oh + m[2]) / den
        ys = (m[3] * ow + m[4] * oh + m[5]) / den
    bad = ~(np.isfinite(xs) & np.isfinite(ys))
    xs, ys = np.where(bad, 0, xs).astype(dtype), np.where(bad, 0, ys).astype(dtype)
    x0, y0 = np.floor(xs), np.floor(ys)
    ax, ay = xs - x0, ys - y0
    cols = [border_index(x0 + k, in_hw[1], mode) for k in (0, 1)]
    rows = [border_index(y0 + k, in_hw[0], mode) for k in (0, 1)]
    wx, wy = (1 - ax, ax), (1 - ay, ay)
    taps = tuple(
        _Tap(rows[i][0], cols[j][0], wy[i] * wx[j], rows[i][1] & cols[j][1] & ~bad)
        for i in (0, 1) for j in (0, 1)
    )
    return _Sampling(xs, ys, den, ax, ay, bad, taps)


def _tap_values(src_hwc: np.ndarray, image: np.ndarray, tap: _Tap, border_val: float) -> np.ndarray:
    """(N, OH, OW, C) values the tap reads: the source pixel, or border_val where invalid."""
    gathered = src_hwc[image, tap.row, tap.col]
    return np.where(tap.valid[..., None], gathered, np.asarray(border_val, src_hwc.dtype))


def _channels_last(x: np.ndarray, fmt: str) -> np.ndarray:
    return x.transpose(0, 2, 3, 1) if fmt == "NCHW" else x


def _from_channels_last(x: np.ndarray, fmt: str) -> np.ndarray:
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2) if fmt == "NCHW" else x)


def _image_index(op: Op, mat_idx: np.ndarray | None, n: int, n_src: int) -> np.ndarray:
    """(N, 1, 1) source image of each matrix; checks mat_idx's values (a run-time error)."""
    if mat_idx is None:
        return np.arange(n)[:, None, None]
    if mat_idx.size and (mat_idx.min() < 0 or mat_idx.max() >= n_src):
        bad = mat_idx[(mat_idx < 0) | (mat_idx >= n_src)][0]
        raise IndexOutOfRangeError(
            f"{op.label}: mat_idx value {bad} is outside [0, {n_src}) (src batch {n_src})")
    return mat_idx.astype(np.int64)[:, None, None]


def _homogeneous(mat: np.ndarray) -> np.ndarray:
    """(N, 2, 3) affine matrices as (N, 3, 3) with the row [0, 0, 1]."""
    row = np.broadcast_to(np.array([0, 0, 1], mat.dtype), (mat.shape[0], 1, 3))
    return np.concatenate([mat, row], axis=1)


def warp_forward(op: Op, src: np.ndarray, mat: np.ndarray, mat_idx: np.ndarray | None,
                 out_hw: tuple[int, int]) -> np.ndarray:
    """§9.2-§9.3: the warped images, in `op.format`."""
    src_hwc = _channels_last(src, op.format)
    image = _image_index(op, mat_idx, mat.shape[0], src.shape[0])
    s = _sample(mat, src_hwc.shape[1:3], out_hw, op.border_mode)
    with np.errstate(invalid="ignore"):  # 0 · inf taps: CONSTANT replaces them below
        out = sum(t.weight[..., None] * _tap_values(src_hwc, image, t, op.border_val)
                  for t in s.taps)
    fill = op.border_val if op.border_mode == "constant" else np.nan
    out = np.where(s.bad[..., None], fill, out)
    if op.border_mode == "constant":
        out = np.where(np.isfinite(out), out, op.border_val)
    return _from_channels_last(out.astype(src.dtype), op.format)


def _mat_terms(op: Op, src: np.ndarray, mat: np.ndarray, mat_idx: np.ndarray | None,
               out_hw: tuple[int, int], weights):
    """For k = 0..8, the (N, OH, OW, C) terms w_k · (∂out/∂xs · ∂xs/∂m_k + ∂out/∂ys · ∂ys/∂m_k)
    of §9.5, with every non-finite term (and every pixel with bad coordinates) zeroed.

    `weights[k]` broadcasts against (N, OH, OW, C): g for BackwardMat (the same for every
    k), v's entry k for TangentMat. Both ops sum these same terms, one over the pixels and
    the other over k, which is what makes them each other's exact adjoint.
    """
    src_hwc = _channels_last(src, op.format)
    image = _image_index(op, mat_idx, mat.shape[0], src.shape[0])
    s = _sample(mat, src_hwc.shape[1:3], out_hw, op.border_mode)
    v00, v01, v10, v11 = (_tap_values(src_hwc, image, t, op.border_val) for t in s.taps)
    ax, ay = s.alpha_x[..., None], s.alpha_y[..., None]
    d_out_dx = (1 - ay) * (v01 - v00) + ay * (v11 - v10)
    d_out_dy = (1 - ax) * (v10 - v00) + ax * (v11 - v01)
    oh = np.arange(out_hw[0], dtype=mat.dtype)[None, :, None]
    ow = np.arange(out_hw[1], dtype=mat.dtype)[None, None, :]
    zero = np.zeros_like(s.xs)
    with np.errstate(over="ignore"):
        d_xs = [ow, oh, 1, zero, zero, zero, -ow * s.xs, -oh * s.xs, -s.xs]  # ∂xs/∂m · den
        d_ys = [zero, zero, zero, ow, oh, 1, -ow * s.ys, -oh * s.ys, -s.ys]  # ∂ys/∂m · den
    for k in range(9):
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            w_dx, w_dy = weights[k] * d_out_dx, weights[k] * d_out_dy
            term = w_dx * (d_xs[k] / s.den)[..., None] + w_dy * (d_ys[k] / s.den)[..., None]
        yield np.where(np.isfinite(term) & ~s.bad[..., None], term, 0)


# -- op parameter checks ------------------------------------------------------------------------

def _image_dims(fmt: str, shape: tuple[int, ...]) -> tuple[int, int, int, int]:
    """(N, C, H, W) of a 4-D shape in `fmt`."""
    if fmt == "NCHW":
        return shape[0], shape[1], shape[2], shape[3]
    return shape[0], shape[3], shape[1], shape[2]


def _image_shape(fmt: str, n: int, c: int, h: int, w: int) -> tuple[int, int, int, int]:
    return (n, c, h, w) if fmt == "NCHW" else (n, h, w, c)


class _WarpChecks:
    """Checks shared by the warp ops. A mixin rather than an Op subclass, so it
    is not listed as an op; each op declares its own fields."""

    input_counts: ClassVar[tuple[int, ...]] = ()

    def check_arity(self, inputs: tuple[TensorType, ...]) -> None:
        if len(inputs) not in self.input_counts:
            counts = " or ".join(str(c) for c in self.input_counts)
            raise GraphError(f"takes {counts} inputs, got {len(inputs)}", op=self.label)

    def check_params(self) -> None:
        if self.border_mode not in BORDER_MODES:
            raise self.shape_error(
                f"unknown border mode {self.border_mode!r}; expected one of {BORDER_MODES}")
        if self.format not in FORMATS:
            raise self.shape_error(f"unknown format {self.format!r}; expected one of {FORMATS}")
        if isinstance(self.border_val, bool) or not isinstance(self.border_val, (int, float)):
            raise self.shape_error(f"border_val must be a number, got {self.border_val!r}")

    def taps_key(self, src_shape: tuple[int, ...], grid: tuple[int, ...], mat_and_idx: tuple[int, ...]) -> tuple:
        """`Op.sibling_key` of a perspective warp and its two backward ops: calls that sample
        the same taps (same matrix and mat_idx, border, source shape and output grid `grid`)
        can share one pass over the pixels, which computes each pixel's taps once. Not the
        upstream gradient or the source image: a backend's joint kernel checks that the calls
        read the same ones (a pair of BackwardData and BackwardMat usually does)."""
        return ("warp taps", self.border_mode, float(self.border_val), self.format,
                tuple(src_shape), tuple(grid), *mat_and_idx)

    def upstream_grid(self, g: TensorType) -> tuple[int, int]:
        """(OH, OW) of a backward op's upstream gradient `g`: the forward's output grid."""
        return _image_dims(self.format, g.shape)[2:]

    def check_image(self, t: TensorType, what: str) -> tuple[int, int, int, int]:
        """(N, C, H, W) of a float image input, with H and W positive."""
        require_float(self, t, what)
        if t.ndim != 4:
            raise self.shape_error(f"{what} must be 4-D ({self.format}), got shape {t.shape}")
        dims = _image_dims(self.format, t.shape)
        if dims[2] < 1 or dims[3] < 1:
            raise self.shape_error(f"{what} {t.shape} ({self.format}) has an empty image")
        return dims

    def check_mat(self, mat: TensorType, rows: int, n: int | None = None) -> int:
        if mat.ndim != 3 or mat.shape[1:] != (rows, 3):
            raise self.shape_error(f"mat must have shape (N, {rows}, 3), got {mat.shape}")
        if n is not None and mat.shape[0] != n:
            raise self.shape_error(
                f"mat has {mat.shape[0]} matrices but the images have batch {n} ({mat.shape})")
        return mat.shape[0]

    def check_mat_idx(self, mat_idx: TensorType | None, n_mat: int, n_src: int) -> None:
        if mat_idx is None:
            if n_mat != n_src:
                raise self.shape_error(
                    f"{n_mat} matrices for a source batch of {n_src}; "
                    "pass mat_idx to pick the source of each")
            return
        require_int(self, mat_idx, "mat_idx")
        if mat_idx.shape != (n_mat,):
            raise self.shape_error(
                f"mat_idx must have shape ({n_mat},) (one per matrix), got {mat_idx.shape}")


def _are_dims(shape: object, rank: int, minimum: int) -> bool:
    """`shape` is a tuple of `rank` ints, each at least `minimum`."""
    def is_dim(d: object) -> bool:
        return isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= minimum

    return isinstance(shape, tuple) and len(shape) == rank and all(is_dim(d) for d in shape)


def _check_out_shape(op: Op, out_shape: object) -> tuple[int, int]:
    if not _are_dims(out_shape, 2, 1):
        raise op.shape_error(f"out_shape must be two positive ints (OH, OW), got {out_shape!r}")
    return int(out_shape[0]), int(out_shape[1])


# -- the ops ------------------------------------------------------------------------------------

@dataclass(frozen=True)
class WarpPerspective(_WarpChecks, Op):
    """Inputs (src, mat (N,3,3)) or (src, mat, mat_idx (N,) int); output (N, C, OH, OW) (§9.3)."""

    out_shape: tuple[int, int]
    border_mode: str = "replicate"
    border_val: float = 0.0
    format: str = "NCHW"

    kind = "library"
    input_counts = (2, 3)

    def infer(self, src: TensorType, mat: TensorType,
              mat_idx: TensorType | None = None) -> TensorType:
        self.check_params()
        oh, ow = _check_out_shape(self, self.out_shape)
        n_src, c, _, _ = self.check_image(src, "src")
        dtype = same_dtype(self, src, mat)
        n = self.check_mat(mat, 3)
        self.check_mat_idx(mat_idx, n, n_src)
        return TensorType(_image_shape(self.format, n, c, oh, ow), dtype)

    def sibling_key(self, inputs, types):
        return self.taps_key(types[0].shape, self.out_shape, inputs[1:])

    def reference(self, src, mat, mat_idx=None):
        return warp_forward(self, src, mat, mat_idx, self.out_shape)


@dataclass(frozen=True)
class WarpAffine(_WarpChecks, Op):
    """Inputs (src, mat (N,2,3)); §9.2 with the third row [0,0,1] (§9.6)."""

    out_shape: tuple[int, int]
    border_mode: str = "replicate"
    border_val: float = 0.0
    format: str = "NHWC"

    kind = "library"
    input_counts = (2,)

    def infer(self, src: TensorType, mat: TensorType) -> TensorType:
        self.check_params()
        oh, ow = _check_out_shape(self, self.out_shape)
        n, c, _, _ = self.check_image(src, "src")
        dtype = same_dtype(self, src, mat)
        self.check_mat(mat, 2, n)
        return TensorType(_image_shape(self.format, n, c, oh, ow), dtype)

    def reference(self, src, mat):
        return warp_forward(self, src, _homogeneous(mat), None, self.out_shape)


def split_backward_inputs(inputs: tuple, with_src: bool) -> tuple:
    """(src?, mat, mat_idx or None, g) from a backward (or tangent) op's 2-4 inputs.

    mat_idx is optional in the middle of the input list; the references and
    both backends' kernels unpack it here so they agree on the order.
    """
    lead = 2 if with_src else 1
    if len(inputs) == lead + 2:
        return inputs[: lead] + (inputs[lead], inputs[lead + 1])
    return inputs[: lead] + (None, inputs[lead])


@dataclass(frozen=True)
class WarpPerspectiveBackwardData(_WarpChecks, Op):
    """d out / d src: inputs (mat, [mat_idx], g) → gradient of shape `src_shape` (§9.4).

    The source's shape is a parameter, so the backward never reads the
    source's value; the output size comes from g.
    """

    src_shape: tuple[int, int, int, int]
    border_mode: str = "replicate"
    border_val: float = 0.0
    format: str = "NCHW"

    kind = "library"
    input_counts = (2, 3)

    def infer(self, *inputs: TensorType) -> TensorType:
        self.check_params()
        mat, mat_idx, g = split_backward_inputs(inputs, with_src=False)
        n, gc, _, _ = self.check_image(g, "g")
        if not _are_dims(self.src_shape, 4, 0):
            raise self.shape_error(
                f"src_shape must be a tuple of four non-negative ints, got {self.src_shape!r}")
        n_src, c, _, _ = self.check_image(TensorType(self.src_shape, g.dtype), "src_shape")
        dtype = same_dtype(self, g, mat)
        self.check_mat(mat, 3, n)
        self.check_mat_idx(mat_idx, n, n_src)
        if gc != c:
            raise self.shape_error(
                f"g {g.shape} has {gc} channels but src_shape {self.src_shape} has {c}")
        return TensorType(self.src_shape, dtype)

    def sibling_key(self, inputs, types):
        return self.taps_key(self.src_shape, self.upstream_grid(types[-1]), inputs[:-1])

    def reference(self, *arrays):
        mat, mat_idx, g = split_backward_inputs(arrays, with_src=False)
        g_hwc = _channels_last(g, self.format)
        n_src, c, ih, iw = _image_dims(self.format, self.src_shape)
        image = np.broadcast_to(_image_index(self, mat_idx, mat.shape[0], n_src), g_hwc.shape[:3])
        s = _sample(mat, (ih, iw), g_hwc.shape[1:3], self.border_mode)
        grad = np.zeros((n_src, ih, iw, c), g.dtype)
        for t in s.taps:
            keep = t.valid
            values = t.weight[keep][:, None] * g_hwc[keep]
            np.add.at(grad, (image[keep], t.row[keep], t.col[keep]), values)
        return _from_channels_last(grad, self.format)


@dataclass(frozen=True)
class WarpPerspectiveBackwardMat(_WarpChecks, Op):
    """d out / d mat: inputs (src, mat, [mat_idx], g) → (N, 3, 3) (§9.5)."""

    border_mode: str = "replicate"
    border_val: float = 0.0
    format: str = "NCHW"

    kind = "library"
    input_counts = (3, 4)

    def infer(self, *inputs: TensorType) -> TensorType:
        self.check_params()
        src, mat, mat_idx, g = split_backward_inputs(inputs, with_src=True)
        n_src, c, _, _ = self.check_image(src, "src")
        dtype = same_dtype(self, src, mat, g)
        n = self.check_mat(mat, 3)
        self.check_mat_idx(mat_idx, n, n_src)
        gn, gc, _, _ = self.check_image(g, "g")
        if (gn, gc) != (n, c):
            raise self.shape_error(
                f"g {g.shape} must hold {n} images of {c} channels ({self.format})")
        return TensorType((n, 3, 3), dtype)

    def sibling_key(self, inputs, types):
        return self.taps_key(types[0].shape, self.upstream_grid(types[-1]), inputs[1:-1])

    def reference(self, *arrays):
        src, mat, mat_idx, g = split_backward_inputs(arrays, with_src=True)
        g_hwc = _channels_last(g, self.format)
        grad = np.empty((mat.shape[0], 9), mat.dtype)
        terms = _mat_terms(self, src, mat, mat_idx, g_hwc.shape[1:3], (g_hwc,) * 9)
        for k, term in enumerate(terms):
            grad[:, k] = term.sum(axis=(1, 2, 3))
        return grad.reshape(-1, 3, 3)


@dataclass(frozen=True)
class WarpPerspectiveTangentMat(_WarpChecks, Op):
    """d out / d mat along v: inputs (src, mat, [mat_idx], v (N,3,3)) → the warp's output shape.

    The directional derivative Σ_k ∂out/∂m_k · v_k of WarpPerspective(src, mat)
    per output pixel, with the terms of §9.5 and the same skipped non-finite
    terms, so it is the exact adjoint of WarpPerspectiveBackwardMat:
    ⟨BackwardMat(src, mat, g), v⟩ = ⟨g, TangentMat(src, mat, v)⟩. That is what
    makes forward mode (and a gradient of BackwardMat wrt g) reach a warp's
    matrix. `out_shape` is a parameter because nothing in the inputs has it.
    """

    out_shape: tuple[int, int]
    border_mode: str = "replicate"
    border_val: float = 0.0
    format: str = "NCHW"

    kind = "library"
    input_counts = (3, 4)

    def infer(self, *inputs: TensorType) -> TensorType:
        self.check_params()
        oh, ow = _check_out_shape(self, self.out_shape)
        src, mat, mat_idx, v = split_backward_inputs(inputs, with_src=True)
        n_src, c, _, _ = self.check_image(src, "src")
        dtype = same_dtype(self, src, mat, v)
        n = self.check_mat(mat, 3)
        self.check_mat_idx(mat_idx, n, n_src)
        if v.shape != mat.shape:
            raise self.shape_error(f"v must have mat's shape {mat.shape}, got {v.shape}")
        return TensorType(_image_shape(self.format, n, c, oh, ow), dtype)

    def reference(self, *arrays):
        src, mat, mat_idx, v = split_backward_inputs(arrays, with_src=True)
        weights = v.reshape(-1, 9).T[:, :, None, None, None]  # v's entry k per matrix
        terms = _mat_terms(self, src, mat, mat_idx, self.out_shape, weights)
        return _from_channels_last(sum(terms).astype(src.dtype), self.format)
