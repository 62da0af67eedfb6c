"""The scaled comparison the suite's floating-point checks use (tests/numerics.py)."""

import numpy as np
import pytest

from tests.numerics import FP32_EPS, assert_close_scaled


def test_bound_is_relative_to_the_rows_largest_value():
    desired = np.array([[33.5, 0.149], [1e-3, 2e-3]])
    # 2.9e-5 on 0.149 is 2e-4 of that element but 9e-7 of its row's 33.5: within 64 fp32 epsilons of the row
    assert_close_scaled(desired + [[0, 2.9e-5], [0, 0]], desired, 64 * FP32_EPS)
    with pytest.raises(AssertionError, match=r"1 of 4 elements .* worst at \(1, 1\)"):  # row 1's scale is 2e-3
        assert_close_scaled(desired + [[0, 0], [0, 2.9e-5]], desired, 64 * FP32_EPS)
    assert_close_scaled(desired + [[0, 0], [0, 2.9e-5]], desired, 64 * FP32_EPS, axis=None)  # one scale: 33.5


def test_nan_shape_and_zero_scale_are_errors():
    with pytest.raises(AssertionError, match="non-finite"):
        assert_close_scaled([1.0, np.nan], [1.0, 2.0], 1e-3)
    with pytest.raises(AssertionError, match="shapes differ"):
        assert_close_scaled([1.0, 2.0], [[1.0, 2.0]], 1e-3)
    with pytest.raises(AssertionError, match="1 of 2"):
        assert_close_scaled([0.0, 1e-30], [0.0, 0.0], 1e-3)  # an all-zero row must match exactly
    assert_close_scaled([np.inf, 1.0], [np.inf, 1.0], 0.0)
