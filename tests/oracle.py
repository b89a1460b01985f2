"""The suite's one comparison of computed arrays against an oracle.

A tolerance scaled by the expected output's largest magnitude is the right
floor for values that cancel to near zero, but taken over an output that
holds ±inf it becomes infinite, and then any finite value passes. So the
special values are compared exactly first (the same NaN positions, the same
infinities with the same signs), and the scale is the largest *finite*
magnitude. A failure names the worst element: where, expected, got, and the
tolerance it was held to.
"""

from __future__ import annotations

import numpy as np


def finite_scale(want: np.ndarray) -> float:
    """The largest finite magnitude of `want` (0 when there is none)."""
    want = np.asarray(want)
    return float(np.abs(want[np.isfinite(want)]).max(initial=0.0))


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(k) for k in np.unravel_index(flat, shape))


def _same_positions(got, want, name, where, label):
    """Fail unless `where` (isnan, isposinf, isneginf) marks the same elements of both."""
    mismatch = np.flatnonzero(where(got) != where(want))
    if mismatch.size:
        i = _index(mismatch[0], want.shape)
        raise AssertionError(f"{label}{name} differ at {mismatch.size} of {want.size} elements; "
                             f"first at {i}: expected {want[i].item()!r}, got {got[i].item()!r}")


def assert_close(got, want, *, rtol: float, scaled_atol: float | None = None, atol: float = 0.0,
                 tolerance: np.ndarray | None = None, label: str = "") -> None:
    """`got` matches `want`: equal shapes and dtypes, integers and booleans exactly, NaN and
    ±inf at the same positions, and each finite element within

        rtol·|want| + scaled_atol·max|finite want| + atol (+ `tolerance`, per element or one figure)

    `scaled_atol` defaults to `rtol`: values that cancel to near zero carry the rounding of the
    output's largest terms. `tolerance` adds a bound a caller derived itself (the
    float32 fuzz adds the float32 reference's own distance from a float64 run)."""
    got, want = np.asarray(got), np.asarray(want)
    label = f"{label}: " if label else ""
    if got.shape != want.shape or got.dtype != want.dtype:
        raise AssertionError(f"{label}expected {want.dtype}{want.shape}, got {got.dtype}{got.shape}")
    if want.dtype.kind != "f":
        np.testing.assert_array_equal(got, want, err_msg=label)
        return
    for name, where in (("NaN positions", np.isnan), ("+inf positions", np.isposinf),
                        ("-inf positions", np.isneginf)):
        _same_positions(got, want, name, where, label)
    finite = np.isfinite(want)
    scaled_atol = rtol if scaled_atol is None else scaled_atol
    bound = rtol * np.abs(want) + scaled_atol * finite_scale(want) + atol
    if tolerance is not None:
        bound = bound + np.asarray(tolerance)
    with np.errstate(invalid="ignore"):
        error = np.where(finite, np.abs(got.astype(np.float64) - want), 0.0)
        failing = finite & ~(error <= bound)  # a NaN bound fails too
    if failing.any():
        i = _index(np.argmax(np.where(failing, np.nan_to_num(error - bound, nan=np.inf), -np.inf)),
                   want.shape)
        count = int(np.count_nonzero(failing))
        raise AssertionError(
            f"{label}{count} of {want.size} elements out of tolerance; worst at {i}: "
            f"expected {want[i].item()!r}, got {got[i].item()!r}, "
            f"|error| {error[i]:.3e} > {bound[i]:.3e} "
            f"(rtol {rtol:g}, scaled_atol {scaled_atol:g}, atol {atol:g})")
