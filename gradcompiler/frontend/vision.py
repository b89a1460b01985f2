"""Image functions on Tensors: the warps (op-reference §9) and pixel shuffle (§4.4).

The defaults follow MegEngine's Python API (`format` keeps its name too):
`warp_affine` is NHWC and `warp_perspective` NCHW, both with the
"replicate" border. Border-mode names are accepted in any case; the ops
check them and every shape.
"""

from __future__ import annotations

from collections.abc import Sequence

from ..errors import ShapeError
from ..ir import call_site
from ..ops.shape import PixelShuffle, PixelShuffleBackward
from ..ops.vision import WarpAffine, WarpPerspective
from .tensor import Tensor, apply

__all__ = ["warp_affine", "warp_perspective", "pixel_shuffle", "pixel_unshuffle"]


def _warp_op(op_class, out_shape: Sequence[int], border_mode: str, border_val: float, fmt: str):
    """The op with its parameters in canonical form (the op itself checks their values)."""
    name = op_class.__name__
    try:
        out_shape = tuple(out_shape)
    except TypeError:
        raise ShapeError(f"out_shape must be two positive ints (OH, OW), got {out_shape!r}",
                         op=name, site=call_site()) from None
    try:
        border_val = float(border_val)
    except (TypeError, ValueError):
        raise ShapeError(f"border_val must be a number, got {border_val!r}",
                         op=name, site=call_site()) from None
    mode = border_mode.lower() if isinstance(border_mode, str) else border_mode
    return op_class(out_shape, mode, border_val, fmt)


def warp_affine(src: Tensor, mat: Tensor, out_shape: Sequence[int], border_mode: str = "replicate",
                border_val: float = 0.0, format: str = "NHWC") -> Tensor:  # noqa: A002
    """Warp each image of `src` by its (2, 3) matrix in `mat` (N, 2, 3), bilinear.

    `mat` maps output pixel (x=w, y=h) to the source point it samples: it
    is the inverse of the geometric transform seen on the image.
    """
    return apply(_warp_op(WarpAffine, out_shape, border_mode, border_val, format), src, mat)


def warp_perspective(src: Tensor, mat: Tensor, out_shape: Sequence[int],
                     mat_idx: Tensor | None = None, border_mode: str = "replicate",
                     border_val: float = 0.0, format: str = "NCHW") -> Tensor:  # noqa: A002
    """Warp images by (3, 3) matrices `mat` (N, 3, 3); `mat_idx` (N,) picks each one's source."""
    op = _warp_op(WarpPerspective, out_shape, border_mode, border_val, format)
    return apply(op, src, mat) if mat_idx is None else apply(op, src, mat, mat_idx)


def pixel_shuffle(x: Tensor, factor: int) -> Tensor:
    """(…, C·r², H, W) → (…, C, H·r, W·r), PyTorch's channel order."""
    return apply(PixelShuffle(factor), x)


def pixel_unshuffle(x: Tensor, factor: int) -> Tensor:
    """(…, C, H·r, W·r) → (…, C·r², H, W): the inverse of `pixel_shuffle`."""
    return apply(PixelShuffleBackward(factor), x)
