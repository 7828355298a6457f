"""The privacy account of a plan, recomputed from its privacy cost alpha by the audit's own code.

Written from the formulas of docs/privacy.md ("The account, as the audit recomputes it"), not
from the planner's :mod:`distfit.mathematics.privacy`, and by another numerical route, so that a
bug in one is caught by the other:

* **zCDP** (Bun & Steinke 2016, Proposition 1.6): ``rho = alpha / 2``.
* **Renyi DP** (Mironov 2017, Proposition 7): ``eps(a) = a alpha / 2`` at order ``a``.
* **exact (epsilon, delta)** of the Gaussian mechanism with ``mu = sqrt(alpha)`` (Balle & Wang
  2018, Theorem 8): ``delta(eps) = Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)``. Here
  ``log delta`` is ``log Phi(a) + log(1 - exp(eps + log Phi(b) - log Phi(a)))`` with
  ``scipy.special.log_ndtr`` (the planner: scaled complementary error functions ``erfcx``), the
  last logarithm by the two-branch ``log1mexp`` (Maechler 2012: ``log(-expm1(x))`` for
  ``x > -log 2``, else ``log1p(-exp(x))``). The epsilon at a delta is the smallest epsilon whose
  delta is at most it, found by bisection to the last bit, all deltas at once (the planner:
  Brent's method on one delta at a time); the alpha an (epsilon, delta) budget allows is the
  largest ``mu^2`` whose delta at epsilon is at most delta, by bisection on ``mu``.

The account must hold exactly the rows :data:`DELTAS` and :data:`RDP_ORDERS` (docs/privacy.md).
"""
from __future__ import annotations

import math
from typing import Callable
from dataclasses import dataclass

import numpy as np
import scipy.special

#: The deltas of the account's exact (epsilon, delta) table (docs/privacy.md).
DELTAS: tuple[float, ...] = (1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10)
#: The orders of the account's RDP curve (docs/privacy.md).
RDP_ORDERS: tuple[float, ...] = (
    1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0,
    48.0, 64.0, 128.0, 256.0,
)
BISECTION_STEPS = 2200  # enough to reach the last bit of any double from a bracket [0, 2^k]


@dataclass(frozen=True)
class Account:
    """What a plan of privacy cost ``alpha`` must state as its ``account``."""

    alpha: float
    rho: float
    epsilon_delta: tuple[tuple[float, float], ...]  # (delta, epsilon) at DELTAS
    rdp: tuple[tuple[float, float], ...]  # (order, epsilon) at RDP_ORDERS


def _log1mexp(x: np.ndarray) -> np.ndarray:
    """``log(1 - exp(x))`` for ``x < 0``, accurate on both sides of ``-log 2`` (Maechler 2012)."""
    x = np.asarray(x, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(x > -math.log(2.0), np.log(-np.expm1(x)), np.log1p(-np.exp(x)))


def log_delta(alpha: float | np.ndarray, epsilon: float | np.ndarray) -> np.ndarray:
    """``log delta(eps)`` of the Gaussian mechanism with ``mu = sqrt(alpha) > 0`` (module
    docstring; Balle & Wang 2018, Theorem 8). ``-inf`` where delta is 0 to double precision."""
    mu = np.sqrt(np.asarray(alpha, dtype=float))
    epsilon = np.asarray(epsilon, dtype=float)
    first = scipy.special.log_ndtr(mu / 2.0 - epsilon / mu)
    second = epsilon + scipy.special.log_ndtr(-mu / 2.0 - epsilon / mu)
    with np.errstate(invalid="ignore"):
        out = first + _log1mexp(np.minimum(second - first, 0.0))
    return np.where(second >= first, -np.inf, out)


def _bisect(below: Callable[[np.ndarray], np.ndarray], low: np.ndarray, high: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Shrink every ``[low, high]`` (``below(low)`` true, ``below(high)`` false, ``below``
    monotone) to neighbouring doubles; vectorised over the brackets."""
    low, high = low.astype(float).copy(), high.astype(float).copy()
    for _ in range(BISECTION_STEPS):
        middle = low + (high - low) / 2.0
        open_ = (middle > low) & (middle < high)
        if not open_.any():
            break
        yes = below(middle)
        low = np.where(open_ & yes, middle, low)
        high = np.where(open_ & ~yes, middle, high)
    return low, high


def epsilons(alpha: float, deltas: tuple[float, ...] = DELTAS) -> np.ndarray:
    """The exact epsilon at each delta: the smallest ``eps >= 0`` with ``delta(eps) <= delta``
    (0 when ``delta(0) = 2 Phi(mu/2) - 1`` is already at most delta), to the last bit."""
    targets = np.log(np.asarray(deltas, dtype=float))
    if alpha == 0.0:
        return np.zeros(targets.size)
    zero = log_delta(alpha, np.zeros(targets.size)) <= targets
    high = np.ones(targets.size)
    while np.any(log_delta(alpha, high) > targets):  # delta(eps) decreases to 0: double until under
        high = np.where(log_delta(alpha, high) > targets, 2.0 * high, high)
    _, high = _bisect(lambda eps: log_delta(alpha, eps) > targets, np.zeros(targets.size), high)
    return np.where(zero, 0.0, high)


def budget_alpha(epsilon: float, delta: float) -> float:
    """The largest ``alpha = mu^2`` with ``delta_mu(epsilon) <= delta`` (delta grows with mu)."""
    target = math.log(delta)
    high = np.array([1.0])
    while log_delta(high**2, epsilon)[0] <= target:
        high *= 2.0
    low = high / 2.0
    while log_delta(low**2, epsilon)[0] > target:
        low /= 2.0
    low, _ = _bisect(lambda mu: log_delta(mu**2, epsilon) <= target, low, high)
    return float(low[0] ** 2)


def account(alpha: float) -> Account:
    """The account of privacy cost ``alpha`` (module docstring)."""
    alpha = float(alpha)
    table = epsilons(alpha)
    return Account(alpha=alpha, rho=alpha / 2.0,
                   epsilon_delta=tuple(zip(DELTAS, table.tolist())),
                   rdp=tuple((order, order * alpha / 2.0) for order in RDP_ORDERS))
