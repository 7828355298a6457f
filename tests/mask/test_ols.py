"""The noise-corrected regression (distfit.mask.ols): unbiased over repeated releases of the same
data, with standard errors that match the spread of the estimates; the naive OLS is biased."""
from __future__ import annotations

import numpy as np
import pytest

from distfit.mask.haar import block_sizes, block_stream, mask_block
from distfit.mask.ols import corrected_ols
from distfit.mask.scaling import INTERCEPT, check_scaling, scale_rows

COLUMNS = ["y", "x1", "x2"]


@pytest.fixture(scope="module")
def draws():
    rng = np.random.default_rng(20240601)
    n = 3000
    x1 = rng.uniform(20, 60, n)
    x2 = rng.normal(5, 2, n)
    y = 3.0 + 0.5 * x1 - 2.0 * x2 + rng.normal(0, 3, n)
    data = np.column_stack([y, x1, x2])
    scaling = check_scaling(COLUMNS, {"y": (-20, 40), "x1": (0, 80), "x2": (-5, 15)})
    scaled = scale_rows(data, scaling.centre, scaling.scale)
    centre, scale = np.append(scaling.centre, 0.0), np.append(scaling.scale, 1.0)
    clipped = centre[:3] + scale[:3] * scaled  # the data as released (clipping included)
    truth = np.linalg.lstsq(np.column_stack([np.ones(n), clipped[:, 1:]]), clipped[:, 0], rcond=None)[0]
    sigma = 0.4
    sizes = block_sizes(n, 3, 1000)
    fits, naive = [], []
    for draw in range(400):
        gram = np.zeros((4, 4))
        start = 0
        for block, size in enumerate(sizes):
            y_b = mask_block(scaled[start:start + size], sigma, block_stream(draw, block))
            gram += y_b.T @ y_b
            start += size
        args = (gram, n, sigma, [*COLUMNS, INTERCEPT], centre, scale, "y", ["x1", "x2"])
        fits.append(corrected_ols(*args, constant=INTERCEPT))
        naive.append(corrected_ols(*args, constant=INTERCEPT, corrected=False).coefficients)
    return truth, fits, np.array(naive)


def test_the_corrected_coefficients_are_unbiased(draws):
    truth, fits, _naive = draws
    estimates = np.array([f.coefficients for f in fits])
    spread = estimates.std(axis=0, ddof=1) / np.sqrt(len(estimates))  # Monte Carlo standard error
    assert np.all(np.abs(estimates.mean(axis=0) - truth) < 4 * spread), (estimates.mean(axis=0), truth, spread)


def test_the_naive_coefficients_are_attenuated(draws):
    truth, fits, naive = draws
    spread = naive.std(axis=0, ddof=1) / np.sqrt(len(naive))
    assert np.all(np.abs(naive[:, 1:].mean(axis=0) - truth[1:]) > 10 * spread[1:])
    assert np.all(np.abs(naive[:, 1:].mean(axis=0)) < np.abs(truth[1:]))  # towards zero


def test_the_standard_errors_match_the_spread_of_the_estimates(draws):
    _truth, fits, _naive = draws
    estimates = np.array([f.coefficients for f in fits])
    reported = np.array([f.standard_errors for f in fits]).mean(axis=0)
    np.testing.assert_allclose(reported, estimates.std(axis=0, ddof=1), rtol=0.15)
    assert fits[0].names == (INTERCEPT, "x1", "x2")
    assert np.mean([f.error_variance for f in fits]) == pytest.approx(9.0, rel=0.15)  # the model's N(0, 3^2)


@pytest.mark.parametrize("y,x,message", [("y", ["z"], "no data column 'z'"), ("y", ["y"], "both the response"),
                                         ("y", ["x1", "x1"], "named twice"), ("y", [INTERCEPT], "no data column")])
def test_bad_regressions_are_refused(y, x, message):
    gram = np.eye(4) * 100
    with pytest.raises(ValueError, match=message):
        corrected_ols(gram, 100, 0.1, [*COLUMNS, INTERCEPT], np.zeros(4), np.ones(4), y, x, constant=INTERCEPT)
