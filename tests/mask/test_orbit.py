"""Setting B's exact account for one column (distfit.mask.orbit): the special function against
mpmath, the quadrature against a finer rule, the delta against Monte Carlo estimates of the
release's privacy loss (densities by scipy, statistics from simulated data), the worst case
against other neighbouring data sets, and the sigma against setting A's."""
from __future__ import annotations

import math

import mpmath
import numpy as np
import pytest
from scipy import integrate, stats

from distfit.mask import orbit
from distfit.mask.account import gaussian_sigma
from distfit.mask.orbit import (
    block_delta,
    gaussian_hockey_stick,
    hockey_stick,
    log_hyp0f1,
    masked_delta,
    masked_sigma,
    neighbour_moves,
)


@pytest.mark.parametrize("a,z", [(0.5, 0.0), (0.5, 3.0), (1.5, 0.01), (4.0, 250.0), (199.5, 4000.0),
                                 (32767.5, 1.6e6), (32767.5, 40.0), (5e5, 3e7)])
def test_log_hyp0f1_matches_mpmath(a, z):
    with mpmath.workdps(40):
        reference = float(mpmath.log(mpmath.hyp0f1(a, z)))
    assert log_hyp0f1(a, np.array([z]))[0] == pytest.approx(reference, rel=1e-13, abs=1e-13)


def test_the_gaussian_curve_holds_for_negative_epsilon():
    """H_s(N(0,1) || N(mu,1)) = int (phi(y) - e^s phi(y - mu))_+ dy for s of both signs (by
    adaptive quadrature, split where the integrand's sign changes, y = mu/2 - s/mu)."""
    for mu in (0.3, 2.0):
        for s in (-3.0, -0.4, 0.0, 0.7):
            edge = mu / 2 - s / mu
            direct, _ = integrate.quad(lambda y: (math.exp(-y * y / 2) - math.exp(s - (y - mu) ** 2 / 2)) / math.sqrt(2 * math.pi),
                                       -40, edge, epsabs=1e-14, epsrel=1e-12, limit=200)
            assert gaussian_hockey_stick(mu, np.array([s]))[0] == pytest.approx(direct, rel=1e-9)


@pytest.mark.parametrize("rows,sigma", [(1_000_000, 0.12), (1000, 0.7), (2, 3.0)])
def test_the_quadrature_agrees_with_a_rule_ten_times_finer(monkeypatch, rows, sigma):
    coarse = block_delta(1.0, sigma, rows)
    monkeypatch.setattr(orbit, "PANEL", orbit.PANEL / 10)
    monkeypatch.setattr(orbit, "NODES", 30)
    assert coarse == pytest.approx(block_delta(1.0, sigma, rows), rel=1e-8)


def _statistics(data: np.ndarray, sigma: float, draws: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """``(u, z)`` of the released Gram matrix of ``data`` (one block, one column) over draws of
    the noise: ``u = 1^T w / (sigma sqrt b)``, ``z = |w - mean(w)|^2 / sigma^2``, ``w = data + c``."""
    w = data[None, :] + sigma * rng.standard_normal((draws, data.size))
    return w.sum(axis=1) / (sigma * math.sqrt(data.size)), ((w - w.mean(axis=1, keepdims=True)) ** 2).sum(axis=1) / sigma**2


def _parameters(data: np.ndarray, sigma: float) -> tuple[float, float]:
    return data.sum() / (sigma * math.sqrt(data.size)), ((data - data.mean()) ** 2).sum() / sigma**2


def _log_density(u, z, m, lam, k):
    chi = stats.chi2.logpdf(z, k) if lam == 0 else stats.ncx2.logpdf(z, k, lam)
    return stats.norm.logpdf(u, m) + chi


def _monte_carlo_delta(epsilon, first, second, sigma, draws, rng, sample=None):
    """``E_P[(1 - e^(eps - L))_+]`` and its standard error, ``L`` the privacy loss of the released
    statistics between the data sets ``first`` (P) and ``second``, by scipy's densities."""
    k = first.size - 1
    m_p, lam_p = _parameters(first, sigma)
    m_q, lam_q = _parameters(second, sigma)
    u, z = sample(m_p, lam_p, k) if sample else _statistics(first, sigma, draws, rng)
    loss = _log_density(u, z, m_p, lam_p, k) - _log_density(u, z, m_q, lam_q, k)
    h = np.maximum(0.0, -np.expm1(epsilon - loss))
    return h.mean(), h.std() / math.sqrt(h.size)


def _corner(rows: int) -> tuple[np.ndarray, np.ndarray]:
    """All rows 1, and one of them replaced by -1: the pair that attains the worst case."""
    ones = np.ones(rows)
    other = ones.copy()
    other[0] = -1.0
    return ones, other


@pytest.mark.parametrize("rows,sigma,draws", [(8, 1.2, 100_000), (400, 0.6, 200_000)])
def test_the_delta_of_the_worst_pair_matches_monte_carlo(rows, sigma, draws):
    """Both orders of the worst pair: the data simulated (8 rows: the noisy column itself; 400 rows:
    the two statistics drawn from their laws), the privacy loss from scipy's densities."""
    rng = np.random.default_rng(rows)
    epsilon = 0.5
    ones, other = _corner(rows)
    mu, d = neighbour_moves(sigma, rows)
    assert _parameters(ones, sigma)[0] - _parameters(other, sigma)[0] == pytest.approx(mu)
    assert _parameters(other, sigma)[1] == pytest.approx(d) and _parameters(ones, sigma)[1] == 0.0

    def drawn(m, lam, k):
        z = rng.chisquare(k, draws) if lam == 0 else rng.noncentral_chisquare(k, lam, draws)
        return rng.normal(m, 1.0, draws), z

    sample = drawn if rows > 100 else None
    forward, forward_se = _monte_carlo_delta(epsilon, ones, other, sigma, draws, rng, sample)
    backward, backward_se = _monte_carlo_delta(epsilon, other, ones, sigma, draws, rng, sample)
    assert hockey_stick(epsilon, mu, 0.0, d, rows - 1) == pytest.approx(forward, abs=5 * forward_se)
    assert hockey_stick(epsilon, mu, d, 0.0, rows - 1) == pytest.approx(backward, abs=5 * backward_se)
    assert forward_se < 0.02 * forward and backward_se < 0.02 * backward  # the check has power
    assert block_delta(epsilon, sigma, rows) == max(hockey_stick(epsilon, mu, 0.0, d, rows - 1),
                                                    hockey_stick(epsilon, mu, d, 0.0, rows - 1))


def test_no_neighbouring_pair_is_worse_than_the_corner():
    """Random blocks (inside the cube and on its vertices), one row replaced at random: the exact
    delta of the pair (both orders) never exceeds block_delta, which the corner attains."""
    rng = np.random.default_rng(5)
    rows, sigma, epsilon = 6, 0.9, 0.3
    worst = block_delta(epsilon, sigma, rows)
    seen = []
    for trial in range(24):
        first = rng.uniform(-1, 1, rows) if trial % 2 else rng.choice([-1.0, 1.0], rows)
        second = first.copy()
        second[rng.integers(rows)] = rng.uniform(-1, 1) if trial % 3 else -np.sign(second[0])
        (m_p, lam_p), (m_q, lam_q) = _parameters(first, sigma), _parameters(second, sigma)
        for lp, lq in ((lam_p, lam_q), (lam_q, lam_p)):
            seen.append(hockey_stick(epsilon, abs(m_p - m_q), lp, lq, rows - 1))
    assert max(seen) <= worst * (1 + 1e-12) and max(seen) > 0
    ones, other = _corner(rows)
    (m_p, lam_p), (m_q, lam_q) = _parameters(ones, sigma), _parameters(other, sigma)
    attained = max(hockey_stick(epsilon, abs(m_p - m_q), lam_p, lam_q, rows - 1),
                   hockey_stick(epsilon, abs(m_p - m_q), lam_q, lam_p, rows - 1))
    assert attained == pytest.approx(worst, rel=1e-12)


@pytest.mark.parametrize("epsilon,delta", [(1.0, 1e-6), (0.1, 1e-3), (2.0, 1e-10)])
def test_setting_b_never_needs_more_noise_than_setting_a(epsilon, delta):
    """The mask is post-processing of setting A: at A's sigma, B's delta is within the budget,
    and B's least sigma is below A's, by more for larger blocks (paper 003, Table 1's trend), but
    never below A's / sqrt(b): the released column sum alone is a Gaussian mechanism with
    sensitivity 2 / sqrt(b) (docs/privacy.md)."""
    sigma_a = gaussian_sigma(epsilon, delta, 1)
    previous = sigma_a
    for rows in (2, 30, 3000):
        assert masked_delta(epsilon, sigma_a, [rows]) <= delta
        sigma_b, achieved = masked_sigma(epsilon, delta, [rows], sigma_a)
        assert achieved == masked_delta(epsilon, sigma_b, [rows])  # the delta of the sigma returned
        assert sigma_a / math.sqrt(rows) * (1 - 1e-9) <= sigma_b < previous  # the column sum alone caps the gain
        assert masked_delta(epsilon, sigma_b, [rows]) <= delta < masked_delta(epsilon, sigma_b * (1 - 1e-6), [rows])
        previous = sigma_b


def test_a_release_is_as_private_as_its_worst_block():
    assert masked_delta(1.0, 0.8, [500, 40, 500]) == max(block_delta(1.0, 0.8, 40), block_delta(1.0, 0.8, 500))
    assert block_delta(1.0, 0.8, 40) > block_delta(1.0, 0.8, 500)
