"""The shared comparison (tests/oracle.py) must be able to fail where a tolerance scaled by
max|expected| could not: an infinity in the expected output, or NaN where a number belongs."""

from __future__ import annotations

import numpy as np
import pytest

from oracle import assert_close, finite_scale


@pytest.mark.filterwarnings("ignore:One of rtol or atol is not valid")
def test_an_infinity_does_not_widen_the_tolerance():
    want = np.array([np.inf, -np.inf, 1.0, 2.0], np.float32)
    got = np.array([np.inf, -np.inf, 5.0, 2.0], np.float32)  # 5x wrong at [2]
    with pytest.raises(AssertionError, match=r"worst at \(2,\): expected 1.0, got 5.0"):
        assert_close(got, want, rtol=1e-5)
    # the old criterion, atol = rtol * max|want|, lets it through: what this module replaces
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.max(np.abs(want))))


@pytest.mark.parametrize("got, where", [
    ([1.0, 1.0, np.inf], r"NaN positions differ at 1 of 3 elements; first at \(0,\)"),
    ([np.nan, np.nan, np.inf], r"NaN positions differ .* \(1,\): expected 1.0, got nan"),
    ([np.nan, 1.0, -np.inf], r"\+inf positions differ at 1 of 3 elements; first at \(2,\)"),
    ([np.nan, 1.0, 3.0], r"\+inf positions differ .* expected inf, got 3.0"),
])
def test_special_values_must_sit_where_expected(got, where):
    want = np.array([np.nan, 1.0, np.inf])
    with pytest.raises(AssertionError, match=where):
        assert_close(np.array(got), want, rtol=1e-3)


def test_matching_special_values_and_rounding_pass():
    want = np.array([[np.nan, -np.inf, 3.0], [np.inf, -2.0, 1e-9]])
    got = want * (1 + 1e-7)
    assert_close(got, want, rtol=1e-6)
    assert finite_scale(want) == 3.0


def test_the_floor_follows_the_finite_scale():
    """Near-zero entries are judged on the output's largest finite magnitude, and only it."""
    want = np.array([1e-5, 1e-12, np.inf])
    assert_close(np.array([1e-5, 0.0, np.inf]), want, rtol=1e-6)  # 1e-12 below 1e-6 * 1e-5
    for wrong in (0.0, 1e-4):  # a gradient of 1e-5 that is zero, or 10x too large
        with pytest.raises(AssertionError, match=r"worst at \(0,\)"):
            assert_close(np.array([wrong, 1e-12, np.inf]), want, rtol=1e-3)


def test_dtype_shape_and_integers_are_exact():
    with pytest.raises(AssertionError, match="expected float64"):
        assert_close(np.zeros(3, np.float32), np.zeros(3), rtol=1e-3)
    with pytest.raises(AssertionError, match=r"expected float64\(3,\), got float64\(2,\)"):
        assert_close(np.zeros(2), np.zeros(3), rtol=1e-3)
    with pytest.raises(AssertionError, match="Mismatched elements: 1"):
        assert_close(np.array([1, 2]), np.array([1, 3]), rtol=1.0)


def test_a_per_element_tolerance_adds_to_the_bound():
    want = np.array([1.0, 1.0])
    got = np.array([1.01, 1.0])
    with pytest.raises(AssertionError, match="label x: 1 of 2"):
        assert_close(got, want, rtol=1e-6, label="label x")
    assert_close(got, want, rtol=1e-6, tolerance=np.array([0.02, 0.0]))
    with pytest.raises(AssertionError, match=r"worst at \(0,\)"):  # a NaN bound is no bound
        assert_close(got, want, rtol=1e-6, tolerance=np.array([np.nan, 0.0]))
