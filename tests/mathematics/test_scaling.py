"""Scaling a block's noise by k (distfit.mathematics.scaling): the one arithmetic every stage uses."""
from __future__ import annotations

import numpy as np
import pytest

import distfit
from distfit.plan.planner import PlannedBlock
from distfit.plan.residual import residual_blocks
from distfit.mathematics.scaling import scale_block, scaled_cost, scaled_noise
from tests.plan.blocks import two_way


def test_noise_side_multiplies_and_privacy_side_divides_bit_for_bit():
    rng = np.random.default_rng(0)
    sigma, variances, profile = rng.random((3, 3)), rng.random(4), rng.random(5)
    k = 1.0 / 3.0  # x / k and x * (1 / k) differ in the last bit for some x: the rule fixes which
    scaled = scale_block(k, sigma, variances, profile, 2.5, 2.25)
    assert scaled.sigma.tobytes() == (sigma * k).tobytes()
    assert scaled.variances.tobytes() == (variances * k).tobytes()
    assert scaled.profile.tobytes() == (profile / k).tobytes()
    assert (scaled.alpha, scaled.lower_bound) == (2.5 / k, 2.25 / k)
    assert scaled_noise(variances, k).tobytes() == scaled.variances.tobytes()
    assert scaled_cost(profile, k).tobytes() == scaled.profile.tobytes()


def test_a_scaled_profile_has_the_scaled_alpha():
    """alpha = max(profile) scales exactly like the profile: max(p / k) == max(p) / k."""
    domain, groups = two_way((3, 2, 2))
    block = residual_blocks(domain, groups)[-1]
    solution = distfit.solve(block.workload, block.targets, basis=block.basis)
    for k in (0.3, 1.0 / 7.0, 4.1):
        scaled = scale_block(k, solution.sigma, solution.variances, solution.profile, solution.alpha, solution.lower_bound)
        assert float(scaled.profile.max()) == scaled.alpha
        planned = PlannedBlock(block, solution, k, block.targets)
        assert planned.sigma.tobytes() == scaled.sigma.tobytes()
        assert planned.variances.tobytes() == scaled.variances.tobytes()
        assert planned.profile.tobytes() == scaled.profile.tobytes()
        assert (planned.alpha, planned.lower_bound) == (scaled.alpha, scaled.lower_bound)


def test_a_scale_not_finite_and_positive_or_leaving_the_floats_is_refused():
    """A budget of rho = 1e308 made k = alpha / inf = 0 and a ZeroDivisionError traceback: k must
    be finite and > 0, and a finite value must not become inf or a nonzero one 0."""
    for k in (0.0, -1.0, np.inf, np.nan, np.array([1.0, 0.0])):
        with pytest.raises(ValueError, match="noise scale k must be finite and > 0"):
            scaled_cost(np.ones(2), k)
        with pytest.raises(ValueError, match="noise scale k must be finite and > 0"):
            scaled_noise(1.0, k)
    with pytest.raises(ValueError, match=r"leaves the floating-point range \(1e\+300 becomes inf\)"):
        scaled_noise(np.array([1.0, 1e300]), 1e10)
    with pytest.raises(ValueError, match=r"leaves the floating-point range \(1 becomes inf\)"):
        scaled_cost(1.0, 1e-320)
    with pytest.raises(ValueError, match=r"\(1e-300 becomes 0\)"):
        scaled_noise(np.array([1e-300]), 1e-30)
    assert scaled_cost(np.inf, 2.0) == np.inf  # an unknown (infinite) bound stays unknown
    assert scaled_noise(np.array([0.0, 2.0]), np.array([3.0, 0.5])).tolist() == [0.0, 1.0]
