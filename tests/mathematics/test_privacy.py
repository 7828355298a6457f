"""Tests for the privacy accounting in distfit.mathematics.privacy (docs/design.md section 1).

Exact (epsilon, delta) values are checked against Google's dp-accounting, an independent
implementation of the analytic Gaussian mechanism (Balle & Wang 2018).
"""
from __future__ import annotations

import json
import math

import mpmath
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_mechanism as plm

from distfit.mathematics.privacy import (
    DEFAULT_DELTAS,
    DEFAULT_RDP_ORDERS,
    Budget,
    PrivacyAccount,
    alpha_for_budget,
    alpha_from_rho,
    delta_for_epsilon,
    epsilon_for_delta,
    privacy_account,
    rdp_epsilon,
    rdp_to_dp_epsilon,
    zcdp_rho,
)

ALPHAS = [0.01, 0.05, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0, 25.0, 50.0]
EPSILONS = [0.01, 0.05, 0.1, 0.3, 0.5, 1.0, 2.0, 3.0, 5.0, 8.0, 10.0, 15.0, 20.0]
DELTAS = [1e-12, 1e-10, 1e-8, 1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 0.05, 0.1]


def reference_delta(alpha: float, epsilons) -> np.ndarray:
    """dp-accounting's exact hockey-stick divergence: sensitivity 1, std 1/sqrt(alpha)."""
    mech = plm.GaussianPrivacyLoss(standard_deviation=1.0 / math.sqrt(alpha), sensitivity=1.0)
    return np.asarray(mech.get_delta_for_epsilon(list(epsilons)), dtype=float)


# --- delta_for_epsilon ------------------------------------------------------------------------

@pytest.mark.parametrize("alpha", ALPHAS)
def test_delta_matches_dp_accounting(alpha):
    ours = delta_for_epsilon(alpha, np.array(EPSILONS))
    ref = reference_delta(alpha, EPSILONS)
    assert ours.shape == ref.shape
    for eps, o, r in zip(EPSILONS, ours, ref):
        if r < 1e-3:  # tiny deltas: relative agreement
            assert o == pytest.approx(r, rel=1e-6, abs=1e-300), (alpha, eps)
        else:
            assert abs(o - r) <= 1e-9, (alpha, eps)


@pytest.mark.parametrize("alpha", [0.01, 0.5, 2.0, 50.0])
def test_delta_scalar_and_broadcast(alpha):
    scalar = delta_for_epsilon(alpha, 1.0)
    assert isinstance(scalar, float)
    grid = delta_for_epsilon(np.array([[alpha], [2 * alpha]]), np.array([0.5, 1.0, 2.0]))
    assert grid.shape == (2, 3)
    assert grid[0, 1] == scalar


def test_delta_closed_form_at_zero_and_edges():
    # delta(0) = Phi(D/2) - Phi(-D/2) = erf(D / (2 sqrt 2))
    for alpha in ALPHAS:
        d = math.sqrt(alpha)
        assert delta_for_epsilon(alpha, 0.0) == pytest.approx(math.erf(d / (2 * math.sqrt(2))),
                                                              rel=1e-13)
    assert delta_for_epsilon(0.0, 1.0) == 0.0
    # underflow gives 0, never NaN
    assert delta_for_epsilon(0.01, 1000.0) == 0.0


def test_delta_high_precision_tail():
    """Tiny deltas, where the two Balle-Wang terms nearly cancel, against mpmath at 50 digits."""
    with mpmath.workdps(50):
        for alpha, eps in [(0.01, 0.8), (0.01, 1.5), (0.1, 3.0), (1.0, 8.0), (2.0, 12.0),
                           (5.0, 20.0), (0.5, 6.0), (50.0, 80.0), (200.0, 300.0),
                           (0.0001, 0.06)]:
            dd = mpmath.sqrt(mpmath.mpf(alpha))
            e = mpmath.mpf(eps)
            ref = mpmath.ncdf(dd / 2 - e / dd) - mpmath.exp(e) * mpmath.ncdf(-dd / 2 - e / dd)
            ours = delta_for_epsilon(alpha, eps)
            assert float(ref) < 1e-11
            assert ours == pytest.approx(float(ref), rel=1e-12), (alpha, eps)


@pytest.mark.parametrize("alpha", [0.01, 1.0, 50.0])
def test_delta_monotone(alpha):
    eps = np.linspace(0.0, 20.0, 401)
    d = delta_for_epsilon(alpha, eps)
    live = d > 1e-300
    assert np.all(np.diff(d[live]) < 0)  # decreasing in epsilon
    alphas = np.geomspace(0.01, 50.0, 200)
    d2 = delta_for_epsilon(alphas, 1.0)
    assert np.all(np.diff(d2[d2 > 1e-300]) > 0)  # increasing in alpha


# --- epsilon_for_delta ------------------------------------------------------------------------

@pytest.mark.parametrize("alpha", ALPHAS)
def test_epsilon_for_delta_inverts_dp_accounting(alpha):
    for delta in DELTAS:
        eps = epsilon_for_delta(alpha, delta)
        assert eps >= 0.0
        if eps == 0.0:
            # delta(0) already within budget
            assert reference_delta(alpha, [0.0])[0] <= delta * (1 + 1e-6)
            continue
        # dp-accounting's independent delta at our epsilon hits the target
        assert reference_delta(alpha, [eps])[0] == pytest.approx(delta, rel=1e-6)
        # our own round trip, conservatively on the right side
        back = delta_for_epsilon(alpha, eps)
        assert back <= delta
        assert back == pytest.approx(delta, rel=1e-9)
        # it is the smallest such epsilon
        assert delta_for_epsilon(alpha, eps * (1 - 1e-7)) > delta


def test_epsilon_for_delta_zero_cases():
    assert epsilon_for_delta(0.0, 1e-6) == 0.0
    alpha = 0.01  # delta(0) = erf(0.05 / sqrt 2) ~ 0.0399
    assert epsilon_for_delta(alpha, 0.05) == 0.0
    assert epsilon_for_delta(alpha, 0.03) > 0.0


def test_epsilon_for_delta_known_value():
    # Balle & Wang: eps = 1, delta = 1e-5 needs sigma ~ 3.73 for sensitivity 1
    mech = plm.GaussianPrivacyLoss.from_privacy_guarantee(
        plm.common.DifferentialPrivacyParameters(1.0, 1e-5), sensitivity=1.0)
    alpha = 1.0 / mech.standard_deviation ** 2
    assert epsilon_for_delta(alpha, 1e-5) == pytest.approx(1.0, rel=1e-5)


@pytest.mark.parametrize("alpha", [0.01, 1.0, 50.0])
def test_epsilon_for_delta_monotone(alpha):
    deltas = np.geomspace(1e-12, 0.1, 40)
    eps = np.array([epsilon_for_delta(alpha, d) for d in deltas])
    pos = eps > 0
    assert np.all(np.diff(eps[pos]) < 0)  # decreasing in delta
    alphas = [alpha * f for f in (0.5, 1.0, 2.0)]
    e = [epsilon_for_delta(a, 1e-6) for a in alphas]
    assert e[0] < e[1] < e[2]  # increasing in alpha


# --- alpha_for_budget -------------------------------------------------------------------------

@pytest.mark.parametrize("epsilon", [0.01, 0.1, 0.5, 1.0, 3.0, 10.0, 20.0])
def test_alpha_for_budget_round_trip(epsilon):
    for delta in DELTAS:
        alpha = alpha_for_budget(epsilon, delta)
        assert alpha > 0
        back = delta_for_epsilon(alpha, epsilon)
        assert back <= delta
        assert back == pytest.approx(delta, rel=1e-9)
        # and epsilon_for_delta inverts it
        assert epsilon_for_delta(alpha, delta) == pytest.approx(epsilon, rel=1e-9)
        # it is the largest such alpha
        assert delta_for_epsilon(alpha * (1 + 1e-7), epsilon) > delta


@pytest.mark.parametrize("epsilon,delta", [(0.1, 1e-5), (1.0, 1e-5), (1.0, 1e-10), (5.0, 1e-8)])
def test_alpha_for_budget_matches_dp_accounting_calibration(epsilon, delta):
    mech = plm.GaussianPrivacyLoss.from_privacy_guarantee(
        plm.common.DifferentialPrivacyParameters(epsilon, delta), sensitivity=1.0)
    # dp-accounting's binary search stops at a relative tolerance ~1e-7 in sigma
    assert alpha_for_budget(epsilon, delta) == pytest.approx(1.0 / mech.standard_deviation ** 2,
                                                             rel=1e-5)


def test_alpha_for_budget_monotone():
    eps = [0.1, 0.5, 1.0, 2.0, 5.0]
    a = [alpha_for_budget(e, 1e-6) for e in eps]
    assert all(x < y for x, y in zip(a, a[1:]))
    deltas = [1e-12, 1e-9, 1e-6, 1e-3]
    b = [alpha_for_budget(1.0, d) for d in deltas]
    assert all(x < y for x, y in zip(b, b[1:]))


# --- closed forms -----------------------------------------------------------------------------

def test_rho_closed_forms():
    assert zcdp_rho(2.0) == 1.0
    assert alpha_from_rho(0.5) == 1.0
    assert isinstance(zcdp_rho(3.0), float)
    a = np.array([0.0, 0.1, 4.0])
    np.testing.assert_array_equal(zcdp_rho(a), a / 2)
    np.testing.assert_array_equal(alpha_from_rho(zcdp_rho(a)), a)


def test_rdp_closed_form():
    orders = np.array(DEFAULT_RDP_ORDERS)
    np.testing.assert_allclose(rdp_epsilon(3.0, orders), orders * 1.5, rtol=0, atol=0)
    assert rdp_epsilon(2.0, 2.0) == 2.0
    assert rdp_epsilon(0.5, 1.0) == 0.25  # order 1: KL divergence alpha / 2


@pytest.mark.parametrize("alpha", [0.01, 0.1, 1.0, 5.0, 50.0])
def test_rdp_conversion_is_an_upper_bound(alpha):
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    grid_orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(11, 64)) + [128, 256, 512]
    for delta in [1e-10, 1e-8, 1e-6, 1e-5, 1e-3]:
        conv = rdp_to_dp_epsilon(alpha, delta)
        exact = epsilon_for_delta(alpha, delta)
        assert conv >= exact
        # classic bound rho + 2 sqrt(rho log(1/delta)) is weaker
        rho = alpha / 2
        assert conv <= rho + 2 * math.sqrt(rho * math.log(1 / delta)) + 1e-12
        # optimising over all real orders beats dp-accounting's order grid
        ref, _ = compute_epsilon(grid_orders, [o * alpha / 2 for o in grid_orders], delta)
        assert conv <= ref + 1e-12
        assert conv == pytest.approx(ref, rel=2e-2)


def test_rdp_conversion_kl_shortcut():
    # sqrt(1 - exp(-alpha/2)) <= delta  =>  (0, delta)-DP
    assert rdp_to_dp_epsilon(1e-6, 0.01) == 0.0
    assert rdp_to_dp_epsilon(0.0, 1e-6) == 0.0


# --- the account ------------------------------------------------------------------------------

def test_privacy_account():
    acc = privacy_account(2.0)
    assert isinstance(acc, PrivacyAccount)
    assert acc.alpha == 2.0 and acc.rho == 1.0
    assert [d for d, _ in acc.epsilon_delta] == list(DEFAULT_DELTAS)
    for d, e in acc.epsilon_delta:
        assert e == epsilon_for_delta(2.0, d)
    eps = [e for _, e in acc.epsilon_delta]
    assert all(x < y for x, y in zip(eps, eps[1:]))  # smaller delta costs more epsilon
    assert [o for o, _ in acc.rdp] == list(DEFAULT_RDP_ORDERS)
    assert all(e == o for o, e in acc.rdp)
    data = json.loads(json.dumps(acc.to_dict()))
    assert data["alpha"] == 2.0 and data["rho"] == 1.0
    assert data["epsilon_delta"][0] == {"delta": 1e-5, "epsilon": eps[0]}
    assert PrivacyAccount.from_dict(data) == acc
    assert acc.epsilon(1e-5) == eps[0]
    with pytest.raises(AttributeError):
        acc.alpha = 3.0  # frozen


def test_privacy_account_custom_deltas():
    acc = privacy_account(0.5, deltas=[1e-3, 1e-12])
    assert [d for d, _ in acc.epsilon_delta] == [1e-3, 1e-12]
    with pytest.raises(ValueError, match="^deltas"):
        privacy_account(0.5, deltas=[1e-3, 2.0])


# --- input validation -------------------------------------------------------------------------

@pytest.mark.parametrize("call,match", [
    (lambda: zcdp_rho(-1.0), "^alpha"),
    (lambda: zcdp_rho(float("nan")), "^alpha"),
    (lambda: alpha_from_rho(float("inf")), "^rho"),
    (lambda: rdp_epsilon(1.0, 0.5), "^order"),
    (lambda: rdp_epsilon(-1.0, 2.0), "^alpha"),
    (lambda: delta_for_epsilon(float("inf"), 1.0), "^alpha"),
    (lambda: delta_for_epsilon(np.array([1.0, -2.0]), 1.0), "^alpha"),
    (lambda: delta_for_epsilon(1.0, -0.1), "^epsilon"),
    (lambda: epsilon_for_delta(1.0, 0.0), "^delta"),
    (lambda: epsilon_for_delta(1.0, 1.0), "^delta"),
    (lambda: epsilon_for_delta(1.0, float("nan")), "^delta"),
    (lambda: epsilon_for_delta(-1.0, 1e-6), "^alpha"),
    (lambda: alpha_for_budget(0.0, 1e-6), "^epsilon"),
    (lambda: alpha_for_budget(-1.0, 1e-6), "^epsilon"),
    (lambda: alpha_for_budget(float("inf"), 1e-6), "^epsilon"),
    (lambda: alpha_for_budget(1.0, 1.5), "^delta"),
    (lambda: rdp_to_dp_epsilon(1.0, 0.0), "^delta"),
    (lambda: rdp_to_dp_epsilon(float("nan"), 1e-6), "^alpha"),
    (lambda: privacy_account(-1.0), "^alpha"),
])
def test_function_validation(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- Budget -----------------------------------------------------------------------------------

def test_budget_ways():
    assert Budget(rho=0.5).to_alpha() == 1.0
    assert Budget(alpha=2.5).to_alpha() == 2.5
    b = Budget(epsilon=1.0, delta=1e-6)
    assert b.to_alpha() == alpha_for_budget(1.0, 1e-6)
    assert b.kind == "epsilon_delta"
    assert Budget(rho=1).rho == 1.0 and isinstance(Budget(rho=1).rho, float)
    with pytest.raises(AttributeError):
        b.epsilon = 2.0  # frozen


@pytest.mark.parametrize("obj,expected", [
    ({"rho": 0.25}, Budget(rho=0.25)),
    ({"alpha": 3.0}, Budget(alpha=3.0)),
    ({"epsilon": 1.0, "delta": 1e-6}, Budget(epsilon=1.0, delta=1e-6)),
    ((1.0, 1e-6), Budget(epsilon=1.0, delta=1e-6)),
    ([2.0, 1e-9], Budget(epsilon=2.0, delta=1e-9)),
    (Budget(rho=1.0), Budget(rho=1.0)),
])
def test_budget_parse(obj, expected):
    assert Budget.parse(obj) == expected


@pytest.mark.parametrize("kwargs,match", [
    (dict(rho=1.0, epsilon=1.0, delta=1e-6),
     r"^budget: given two ways \(rho and epsilon/delta\); give exactly one"),
    (dict(rho=1.0, alpha=1.0), r"^budget: given two ways \(rho and alpha\)"),
    (dict(rho=1.0, epsilon=1.0, delta=1e-6, alpha=1.0), r"^budget: given three ways"),
    (dict(), r"^budget: no budget given"),
    (dict(epsilon=-1, delta=1e-6), r"^budget\.epsilon must be > 0, got -1$"),
    (dict(epsilon=0.0, delta=1e-6), r"^budget\.epsilon must be > 0"),
    (dict(epsilon=float("inf"), delta=1e-6), r"^budget\.epsilon must be finite"),
    (dict(epsilon=1.0, delta=1.5), r"^budget\.delta must be in \(0, 1\), got 1\.5$"),
    (dict(epsilon=1.0, delta=0.0), r"^budget\.delta must be in \(0, 1\)"),
    (dict(epsilon=1.0, delta=float("nan")), r"^budget\.delta must be in \(0, 1\)"),
    (dict(epsilon=1.0), r"^budget\.delta: epsilon given without delta"),
    (dict(delta=1e-6), r"^budget\.epsilon: delta given without epsilon"),
    (dict(rho=0.0), r"^budget\.rho must be finite and > 0"),
    (dict(rho=-2.0), r"^budget\.rho must be finite and > 0"),
    (dict(rho=float("inf")), r"^budget\.rho must be finite and > 0"),
    (dict(rho="1"), r"^budget\.rho must be a real number"),
    (dict(rho=True), r"^budget\.rho must be a real number"),
    (dict(alpha=-1.0), r"^budget\.alpha must be finite and > 0"),
    (dict(alpha=float("nan")), r"^budget\.alpha must be finite and > 0"),
    (dict(epsilon="x", delta=1e-6), r"^budget\.epsilon must be a real number"),
])
def test_budget_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Budget(**kwargs)


@pytest.mark.parametrize("obj,match", [
    (1.0, r"^budget: a bare number is ambiguous; pass \{'rho': x\}, \{'alpha': x\} "
          r"or \(epsilon, delta\)"),
    (3, r"^budget: a bare number is ambiguous"),
    (np.float64(0.5), r"^budget: a bare number is ambiguous"),
    ({"eps": 1.0, "delta": 1e-6}, r"^budget: unknown key 'eps'"),
    ({"rho": 1.0, "sigma": 2.0}, r"^budget: unknown key 'sigma'"),
    ((1.0, 1e-6, 3.0), r"^budget: a sequence must be \(epsilon, delta\)"),
    ((1.0, 2.0), r"^budget\.delta must be in \(0, 1\)"),
    ((-1.0, 1e-6), r"^budget\.epsilon must be > 0"),
    ({"epsilon": 1.0}, r"^budget\.delta: epsilon given without delta"),
    ({"rho": -1}, r"^budget\.rho must be finite and > 0"),
    ("rho=1", r"^budget: cannot read a budget from str"),
    (None, r"^budget: cannot read a budget"),
])
def test_budget_parse_errors(obj, match):
    with pytest.raises(ValueError, match=match):
        Budget.parse(obj)
