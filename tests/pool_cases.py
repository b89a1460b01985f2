"""MAX pooling of windows holding NaN or ±inf, and torch's rule for them written as a plain loop.

torch's max_pool2d scans each window's pixels inside the image in row-major order, starting
from -inf at the first of them, and takes a pixel where `value > best or isnan(value)`: a
window holding a NaN yields NaN (its last NaN takes the gradient), the padding is never taken,
and a window of -inf yields -inf at its first pixel. Every target is held to this loop.
"""

from __future__ import annotations

import math

import numpy as np

KERNEL, STRIDE, PADDING = (3, 3), (2, 2), (1, 1)
"""Windows whose first taps are padding (the first row and column of windows)."""


def non_finite_images(rng) -> dict[str, np.ndarray]:
    """(1, 2, 5, 6) images, each case a kind of non-finite window."""
    finite = rng.standard_normal((1, 2, 5, 6))
    cases = {"all_nan": np.full_like(finite, np.nan), "all_minus_inf": np.full_like(finite, -np.inf)}
    scattered = finite.copy()
    scattered[0, 0, 1, 1] = scattered[0, 1, 3, 4] = scattered[0, 1, 4, 0] = np.nan
    cases["nan_among_finite"] = scattered
    two = finite.copy()
    two[0, 0, 0, 0] = two[0, 0, 1, 1] = np.nan   # one window, two NaNs: the last takes the gradient
    two[0, 1, 2, 2] = np.inf
    two[0, 1, 2, 3] = np.nan                      # +inf then NaN: NaN
    cases["two_nans_and_inf"] = two
    corner = finite.copy()
    corner[0, :, :2, :2] = -np.inf                # the first window's image pixels, behind its padding
    corner[0, 1, 3:, 4:] = np.inf
    cases["padding_first_minus_inf"] = corner
    return cases


def max_pool_loop(x: np.ndarray, dy: np.ndarray | None = None) -> np.ndarray:
    """MAX pooling of x by KERNEL, STRIDE, PADDING (no ceil mode) by torch's rule; with `dy`, the
    gradient wrt x of Σ dy·pool(x)."""
    (kh, kw), (sh, sw), (ph, pw) = KERNEL, STRIDE, PADDING
    n_, c_, h, w = x.shape
    oh_n, ow_n = (h + 2 * ph - kh) // sh + 1, (w + 2 * pw - kw) // sw + 1
    y, dx = np.zeros((n_, c_, oh_n, ow_n)), np.zeros(x.shape)
    for n in range(n_):
        for c in range(c_):
            for oh in range(oh_n):
                for ow in range(ow_n):
                    cells = [(i, j) for i in range(oh * sh - ph, oh * sh - ph + kh)
                             for j in range(ow * sw - pw, ow * sw - pw + kw) if 0 <= i < h and 0 <= j < w]
                    best, where = -math.inf, cells[0]
                    for i, j in cells:
                        if x[n, c, i, j] > best or math.isnan(x[n, c, i, j]):
                            best, where = x[n, c, i, j], (i, j)
                    y[n, c, oh, ow] = best
                    if dy is not None:
                        dx[n, c, where[0], where[1]] += dy[n, c, oh, ow]
    return y if dy is None else dx
