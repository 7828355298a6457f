"""The account of a masked release (distfit.mask.account) against Google's dp-accounting, an
independent implementation of the analytic Gaussian mechanism (setting A)."""
from __future__ import annotations

import math

import pytest
from dp_accounting.pld import privacy_loss_mechanism as plm

from distfit.mask.account import check_budget, gaussian_sigma, l2_sensitivity, mask_account


@pytest.mark.parametrize("epsilon,delta,p", [(1.0, 1e-6, 1), (0.5, 1e-5, 3), (2.0, 1e-8, 10), (0.1, 1e-3, 20)])
def test_setting_a_sigma_meets_delta_exactly_per_dp_accounting(epsilon, delta, p):
    sigma = gaussian_sigma(epsilon, delta, p)
    assert l2_sensitivity(p) == 2 * math.sqrt(p)
    reference = plm.GaussianPrivacyLoss(standard_deviation=sigma, sensitivity=2 * math.sqrt(p))
    assert reference.get_delta_for_epsilon(epsilon) == pytest.approx(delta, rel=1e-6)
    # a hair less noise breaks the budget: the calibration is the least sigma
    smaller = plm.GaussianPrivacyLoss(standard_deviation=sigma * (1 - 1e-4), sensitivity=2 * math.sqrt(p))
    assert smaller.get_delta_for_epsilon(epsilon) > delta
    calibrated = plm.GaussianPrivacyLoss.from_privacy_guarantee(
        plm.common.DifferentialPrivacyParameters(epsilon, delta), sensitivity=2 * math.sqrt(p))
    assert sigma == pytest.approx(calibrated.standard_deviation, rel=1e-5)


def test_the_account_states_what_it_claims():
    account = mask_account(1.0, 1e-6, 4, [100, 100, 98])
    assert account.sigma == account.sigma_gaussian and account.sigma_masked is None
    assert account.delta_achieved <= 1e-6 and account.delta_achieved == pytest.approx(1e-6, rel=1e-9)
    assert account.sensitivity == 4.0 and account.block_rows == (98, 100)
    assert "replace-one" in account.neighbours and "not claimed" in account.masking_gain
    assert mask_account(1.0, 1e-6, 16, [100]).sigma == pytest.approx(2 * account.sigma)  # sigma grows as sqrt(p)


def test_one_column_uses_setting_b_below_setting_a():
    """p = 1: the least sigma of setting B for the smallest block (distfit.mask.orbit), far below
    setting A's at a thousand rows per block, and the delta it achieves is the budget's."""
    account = mask_account(1.0, 1e-6, 1, [1000, 1000, 999])
    assert account.sigma == account.sigma_masked < account.sigma_gaussian / 10
    assert account.delta_achieved <= 1e-6 and account.delta_achieved == pytest.approx(1e-6, rel=1e-6)
    assert "claimed for p = 1" in account.masking_gain and "setting B" in account.calibration
    assert account.to_dict()["block_rows"] == (999, 1000)


@pytest.mark.parametrize("epsilon,delta,message", [(0.0, 1e-6, "--epsilon"), (-1.0, 1e-6, "--epsilon"),
                                                   (float("nan"), 1e-6, "--epsilon"), (1.0, 0.0, "--delta"),
                                                   (1.0, 1.0, "--delta"), (1.0, 2.0, "--delta")])
def test_out_of_range_budgets_are_refused(epsilon, delta, message):
    with pytest.raises(ValueError, match=message):
        mask_account(epsilon, delta, 2, [10])
    with pytest.raises(ValueError, match=message):
        check_budget(epsilon, delta)
