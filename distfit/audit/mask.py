"""``distfit audit MASK.zarr``: recompute the privacy account a mask store states, by code of its own.

The account (docs/privacy.md, "Masked pseudo-data") is recomputed from the store's budget, its
data columns and its block sizes, without :mod:`distfit.mask` (the audit may not import it):

* **setting A**: ``sigma_gaussian = 2 sqrt(p) / sqrt(alpha)`` with ``alpha`` the largest an
  (epsilon, delta) budget allows (:func:`distfit.audit.privacy.budget_alpha`: ``log_ndtr`` and
  bisection; the mask: ``erfcx`` and Brent's method).
* **setting B, one column**: the exact delta of the worst pair of neighbouring blocks,
  ``max`` over the block sizes ``b`` and both orders of ``H_eps(N(0,1) x chi'^2_k(l_P) ||
  N(mu,1) x chi'^2_k(l_Q))``, ``{l_P, l_Q} = {0, D}``, ``mu = 2 / (sigma sqrt b)``,
  ``D = 4 (b - 1) / (b sigma^2)``, ``k = b - 1``. The mask sums the series of ``0F1`` and
  integrates on fixed Gauss-Legendre panels; here the density ratio of ``chi'^2_k(l)`` to
  ``chi^2_k`` is the mean of ``exp(sqrt(l z) theta_1)`` over the uniform direction ``theta`` of
  the sphere ``S^(k-1)`` (its first coordinate ``cos phi`` has density proportional to
  ``sin^(k-2) phi`` on [0, pi]; ``cosh`` for ``k = 1``), an integral over ``phi`` by
  Gauss-Legendre on a window around its peak, and the expectation over the chi variable is
  adaptive (``scipy.integrate.quad``). The Gaussian factor is
  :func:`distfit.audit.privacy.log_delta` at real epsilon.

A claim is compared with its recomputation to :data:`distfit.audit.checks.TOLERANCE` (setting A)
or :data:`MASKED_TOLERANCE` (setting B: two quadratures agree to about 1e-9); the achieved delta
must be at most the budget and, for one column, within :data:`MASKED_TOLERANCE` of it (sigma is
the least: a larger one would waste accuracy, a smaller one break the budget).
"""
from __future__ import annotations

import math

import numpy as np
import scipy.integrate
import scipy.special

from distfit.audit.checks import TOLERANCE, AuditReport, Checks, at_most, close
from distfit.audit.privacy import budget_alpha, log_delta
from distfit.stores.mask import Masked, read_mask, verify_mask

__all__ = ["audit_mask", "log_chi_ratio", "masked_delta"]

#: Setting B's recomputed delta and the stored one agree to this (relative).
MASKED_TOLERANCE = 1e-6
#: The keys of a mask store's ``account`` (docs/privacy.md).
ACCOUNT_KEYS = frozenset({"epsilon", "delta", "p", "sensitivity", "sigma_gaussian", "sigma_masked", "sigma",
                          "delta_achieved", "block_rows", "calibration", "masking_gain", "neighbours",
                          "mechanism"})
_ANGLE_NODES, _ANGLE_WEIGHTS = np.polynomial.legendre.leggauss(160)


def _log_sphere_mean(k: int, c: float) -> float:
    """``log E exp(c theta_1)`` for ``theta`` uniform on ``S^(k-1)``, ``c >= 0`` (module docstring)."""
    if c == 0.0:
        return 0.0
    if k == 1:
        return c + math.log1p(math.exp(-2.0 * c)) - math.log(2.0)
    m = k - 2
    if m == 0:
        peak = 0.0
        width = 1.0 / math.sqrt(c)
    else:
        cosine = 2.0 * c / (m + math.sqrt(m * m + 4.0 * c * c))  # c sin^2 = m cos at the peak
        peak = math.acos(cosine)
        width = 1.0 / math.sqrt(c * cosine + m / math.sin(peak) ** 2)
    lo, hi = max(0.0, peak - 30.0 * width), min(math.pi, peak + 30.0 * width)
    phi = (hi + lo) / 2.0 + (hi - lo) / 2.0 * _ANGLE_NODES
    log_f = c * np.cos(phi) + (m * np.log(np.sin(phi)) if m else 0.0)
    top = float(log_f.max())
    integral = top + math.log((hi - lo) / 2.0 * float(np.sum(_ANGLE_WEIGHTS * np.exp(log_f - top))))
    # log int_0^pi sin^m = log(sqrt(pi) Gamma((m+1)/2) / Gamma(m/2 + 1)); poch: no cancellation at large m
    normaliser = 0.5 * math.log(math.pi) - math.log(scipy.special.poch((m + 1) / 2.0, 0.5))
    return integral - normaliser


def log_chi_ratio(k: int, lam: float, z: float) -> float:
    """``log`` of the density of ``chi'^2_k(lam)`` over that of ``chi^2_k`` at ``z``:
    ``-lam / 2 + log E exp(sqrt(lam z) theta_1)``."""
    return -lam / 2.0 + _log_sphere_mean(k, math.sqrt(lam * z))


def _block_order(epsilon: float, mu: float, lam_p: float, lam_q: float, k: int) -> float:
    """``H_epsilon(N(0,1) x chi'^2_k(lam_p) || N(mu,1) x chi'^2_k(lam_q))``, over ``r = sqrt z``."""
    const = -(k / 2.0) * math.log(2.0) - math.lgamma(k / 2.0)

    def integrand(r: float) -> float:
        z = r * r
        ratio_p = log_chi_ratio(k, lam_p, z)
        log_density = math.log(2.0 * r) + (k / 2.0 - 1.0) * math.log(z) - z / 2.0 + const + ratio_p
        loss = ratio_p - log_chi_ratio(k, lam_q, z)
        return math.exp(log_density + float(log_delta(mu * mu, epsilon - loss)))

    centre = math.sqrt(k + lam_p)
    lo, hi = max(0.0, centre - 15.0), centre + 15.0
    value, _ = scipy.integrate.quad(integrand, lo, hi, epsabs=0.0, epsrel=1e-11, limit=400)
    return value


def masked_delta(epsilon: float, sigma: float, sizes: list[int]) -> float:
    """Setting B's delta at ``epsilon`` of one column released with noise ``sigma`` in blocks of
    ``sizes`` rows (module docstring)."""
    worst = 0.0
    for b in sorted(set(sizes)):
        mu, d, k = 2.0 / (sigma * math.sqrt(b)), 4.0 * (b - 1) / (b * sigma * sigma), b - 1
        worst = max(worst, _block_order(epsilon, mu, 0.0, d, k), _block_order(epsilon, mu, d, 0.0, k))
    return worst


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _check_account(check: Checks, store: Masked) -> float:
    account = store.attrs.get("account")
    if not check(isinstance(account, dict) and set(account) == ACCOUNT_KEYS,
                 lambda: f"account: expected the keys {sorted(ACCOUNT_KEYS)}, got {account!r}"):
        return float("nan")
    epsilon, delta, sigma = account["epsilon"], account["delta"], account["sigma"]
    if not check(_number(epsilon) and epsilon > 0 and _number(delta) and 0 < delta < 1 and _number(sigma) and sigma > 0,
                 f"account: epsilon {epsilon!r}, delta {delta!r}, sigma {sigma!r} are not a budget and a noise"):
        return float("nan")
    p = len(store.columns) - 1
    sensitivity = 2.0 * math.sqrt(p)
    check(account["p"] == p, f"account.p: stored {account['p']!r}, but the store has {p} data columns")
    check(close(account["sensitivity"], sensitivity), f"account.sensitivity: stored {account['sensitivity']!r}, recomputed {sensitivity!r}")
    sigma_a = sensitivity / math.sqrt(budget_alpha(epsilon, delta))
    check(close(account["sigma_gaussian"], sigma_a),
          f"account.sigma_gaussian: stored {account['sigma_gaussian']!r}, recomputed {sigma_a!r} (setting A)")
    check(store.attrs.get("sigma") == sigma, f"sigma: stored {store.attrs.get('sigma')!r}, the account's {sigma!r}")
    sizes = [int(b) for b in store.block_rows]
    check(sum(sizes) == store.rows and min(sizes) > p, f"blocks/rows: {sizes[:5]}... do not cover {store.rows} rows in blocks of more than {p}")
    check(account["block_rows"] == sorted(set(sizes)),
          f"account.block_rows: stored {account['block_rows']!r}, the store's blocks have {sorted(set(sizes))}")
    if p == 1:
        masked = account["sigma_masked"]
        if not check(_number(masked) and 0 < masked <= sigma_a * (1 + TOLERANCE),
                     f"account.sigma_masked: {masked!r} is not a noise at most setting A's {sigma_a!r}"):
            return float(sigma)
        check(sigma == min(account["sigma_gaussian"], masked), f"account.sigma: {sigma!r} is not the smaller of both settings'")
        achieved = masked_delta(epsilon, sigma, sizes)
        check(close(account["delta_achieved"], achieved, MASKED_TOLERANCE),
              f"account.delta_achieved: stored {account['delta_achieved']!r}, recomputed {achieved!r} (setting B)")
        check(at_most(achieved, delta, MASKED_TOLERANCE),
              f"setting B: sigma {sigma!r} gives delta {achieved!r} at epsilon {epsilon!r}, over the budget's {delta!r}")
        check(achieved >= delta * (1 - 10 * MASKED_TOLERANCE),
              f"setting B: sigma {sigma!r} gives delta {achieved!r}, well under the budget's {delta!r}: not the least sigma")
    else:
        check(account["sigma_masked"] is None, f"account.sigma_masked: {account['sigma_masked']!r}, but setting B is "
                                               f"claimed for one column only (the store has {p})")
        check(close(sigma, sigma_a), f"account.sigma: stored {sigma!r}, setting A's is {sigma_a!r}")
        achieved = math.exp(float(log_delta((sensitivity / sigma) ** 2, epsilon)))
        check(close(account["delta_achieved"], achieved), f"account.delta_achieved: stored {account['delta_achieved']!r}, recomputed {achieved!r}")
        check(at_most(achieved, delta), f"setting A: sigma {sigma!r} gives delta {achieved!r}, over the budget's {delta!r}")
    return float(sigma)


def audit_mask(path: str) -> AuditReport:
    """Audit the mask store at ``path`` (module docstring): its checksum and its account.
    Raises :class:`distfit.stores.mask.MaskError` if it is not a readable, sealed mask store."""
    store = read_mask(path)
    check = Checks()
    ok, stored, recomputed = verify_mask(path)
    check(ok, f"checksum: stored {stored}, but the store hashes to {recomputed}")
    sigma = _check_account(check, store)
    return AuditReport(str(path), check.count, tuple(check.failures), "sigma", sigma, recomputed)
