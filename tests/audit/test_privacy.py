"""The audit's own account (``distfit.audit.privacy``, issue 28 point 3) against references
independent of it and of each other: the planner's ``distfit.mathematics.privacy``, Google's
dp-accounting, and numerical quadrature of the Gaussian densities (no normal CDF)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.integrate

from distfit.audit import privacy
from distfit.mathematics import privacy as planner_privacy

plm = pytest.importorskip("dp_accounting.pld.privacy_loss_mechanism")

ALPHAS = [1e-6, 1e-3, 0.05, 0.5, 1.0, 2.0396915828449145, 7.5, 50.0, 1e3, 1e5]



@pytest.mark.parametrize("alpha", ALPHAS)
def test_the_account_agrees_with_the_planners(alpha):
    mine = privacy.account(alpha)
    theirs = planner_privacy.privacy_account(alpha)
    assert mine.rho == theirs.rho == alpha / 2
    assert [d for d, _ in mine.epsilon_delta] == [d for d, _ in theirs.epsilon_delta] == list(privacy.DELTAS)
    np.testing.assert_allclose([e for _, e in mine.epsilon_delta], [e for _, e in theirs.epsilon_delta], rtol=1e-10)
    assert mine.rdp == theirs.rdp


def _dp_accounting_delta(alpha: float, epsilon: float) -> float:
    """dp-accounting's hockey-stick divergence of the Gaussian mechanism: sensitivity 1, std 1/sqrt(alpha)."""
    mechanism = plm.GaussianPrivacyLoss(standard_deviation=1.0 / math.sqrt(alpha), sensitivity=1.0)
    return float(mechanism.get_delta_for_epsilon(epsilon))


@pytest.mark.parametrize("alpha", [1e-3, 0.5, 2.0396915828449145, 50.0, 1e3])
def test_the_accounts_epsilons_meet_their_deltas_in_dp_accounting(alpha):
    """At the audit's epsilon dp-accounting's delta is the table's delta; a hair below that
    epsilon it is above it (the smallest epsilon)."""
    for delta, epsilon in privacy.account(alpha).epsilon_delta:
        assert epsilon > 0
        assert _dp_accounting_delta(alpha, epsilon) == pytest.approx(delta, rel=1e-6)
        assert _dp_accounting_delta(alpha, epsilon * (1 - 1e-6)) > delta


def _quadrature_delta(alpha: float, epsilon: float) -> float:
    """``delta(eps) = int max(0, phi(x) - e^eps phi(x - mu)) dx`` (the hockey-stick divergence of
    N(0, 1) and N(mu, 1)), integrated numerically: the integrand is positive left of
    ``x* = mu / 2 - eps / mu``. No normal CDF is used."""
    mu = math.sqrt(alpha)
    split = mu / 2 - epsilon / mu

    def integrand(x: float) -> float:
        # phi(x) - e^eps phi(x - mu) = phi(x) (1 - exp(eps + mu x - mu^2 / 2))
        return math.exp(-x * x / 2) / math.sqrt(2 * math.pi) * -math.expm1(min(epsilon + mu * x - mu * mu / 2, 0.0))

    # the integrand decays like a Gaussian left of the split: nothing is left 40 units further
    value, error = scipy.integrate.quad(integrand, split - 40.0, split, epsabs=0.0, epsrel=1e-12, limit=500,
                                        points=[split - 1.0, split - 0.1])
    assert error <= 1e-9 * value
    return value


@pytest.mark.parametrize("alpha, epsilon", [(0.05, 0.3), (1.0, 1.0), (2.0396915828449145, 6.650304392601562),
                                            (7.5, 3.0), (50.0, 20.0), (1.0, 9.0)])
def test_delta_agrees_with_quadrature_of_the_densities(alpha, epsilon):
    assert math.exp(float(privacy.log_delta(alpha, epsilon))) == pytest.approx(_quadrature_delta(alpha, epsilon), rel=1e-8)


@pytest.mark.parametrize("epsilon, delta", [(0.1, 1e-10), (1.0, 1e-6), (5.0, 1e-5), (20.0, 1e-9)])
def test_the_budget_alpha_agrees_with_the_planners_and_dp_accounting(epsilon, delta):
    alpha = privacy.budget_alpha(epsilon, delta)
    assert alpha == pytest.approx(planner_privacy.alpha_for_budget(epsilon, delta), rel=1e-10)
    assert _dp_accounting_delta(alpha, epsilon) == pytest.approx(delta, rel=1e-6)
    assert _dp_accounting_delta(alpha * (1 + 1e-5), epsilon) > delta  # the largest such alpha
