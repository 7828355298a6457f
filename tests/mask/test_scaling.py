"""Scaling to [-1, 1] with public bounds (distfit.mask.scaling)."""
from __future__ import annotations

import numpy as np
import pytest

from distfit.mask.scaling import INTERCEPT, check_columns, check_scaling, clip_counts, scale_rows, scaling_from_range


def test_bounds_map_to_minus_one_and_one_and_outside_values_are_clipped_and_counted():
    s = check_scaling(["a", "b"], {"a": (0, 10), "b": (-4, -2)})
    np.testing.assert_array_equal(s.centre, [5, -3])
    np.testing.assert_array_equal(s.scale, [5, 1])
    values = np.array([[0.0, -4.0], [10.0, -2.0], [5.0, -3.0], [12.0, -10.0], [-1.0, -2.5]])
    z = scale_rows(values, s.centre, s.scale)
    np.testing.assert_allclose(z, [[-1, -1], [1, 1], [0, 0], [1, -1], [-1, 0.5]])
    np.testing.assert_array_equal(clip_counts(values, s), [2, 1])
    np.testing.assert_allclose(s.centre + s.scale * z[:3], values[:3])  # centre + scale * z undoes it


@pytest.mark.parametrize("columns,bounds,message", [
    (["a", "b"], {"a": (0, 1)}, "no bounds for column 'b'"),
    (["a"], {"a": (1, 1)}, "a: LO must be < HI"),
    (["a"], {"a": (2, 1)}, "a: LO must be < HI"),
    (["a"], {"a": (0, float("inf"))}, "finite"),
    (["a"], {"a": (0, 1), "c": (0, 1)}, "'c' is not one of --columns"),
])
def test_bad_bounds_are_refused_naming_the_column(columns, bounds, message):
    with pytest.raises(ValueError, match=message):
        check_scaling(columns, bounds)


@pytest.mark.parametrize("columns,message", [([], "at least one"), (["a", "a"], "'a' is named twice"),
                                             ([INTERCEPT], "constant column"), ([" "], "empty")])
def test_bad_columns_are_refused(columns, message):
    with pytest.raises(ValueError, match=message):
        check_columns(columns)


def test_bounds_from_the_range_refuse_a_constant_column():
    s = scaling_from_range(["a"], np.array([1.0]), np.array([3.0]))
    assert s.bounds() == {"a": [1.0, 3.0]}
    with pytest.raises(ValueError, match="'a' is constant"):
        scaling_from_range(["a"], np.array([1.0]), np.array([1.0]))
