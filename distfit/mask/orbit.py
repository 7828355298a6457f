"""Setting B's exact (epsilon, delta) for one column: what the mask leaves of a row (paper 003).

docs/privacy.md ("Masked pseudo-data", "Setting B for one column") proves every step; in brief,
for a block of ``b`` rows of one data column ``x`` in [-1, 1] (scaled), released as
``Y = A [x + c, 1]`` with ``A`` Haar on O(b) and ``c ~ N(0, sigma^2 I)``:

1. ``Y`` depends on ``x`` only through the Gram matrix ``G = Y^T Y`` (a kernel that does not
   involve ``x`` maps ``G`` to ``Y``, and ``G`` is a function of ``Y``), so the two have the
   same hockey-stick divergences. ``G`` is, one to one, the pair ``(u, z)``:
   ``u = 1^T w / (sigma sqrt b) ~ N(m, 1)`` and ``z = |w - mean(w)|^2 / sigma^2 ~ chi'^2_k(lam)``,
   independent, ``k = b - 1``, ``m = sqrt(b) mean(x) / sigma``, ``lam = sum (x_i - mean x)^2 / sigma^2``.
2. Replacing one row moves ``m`` by at most ``mu = 2 / (sigma sqrt b)`` and ``lam`` by at most
   ``D = 4 (b - 1) / (b sigma^2)``; the hockey-stick divergence grows with both moves and is
   largest when the smaller ``lam`` is 0 (noncentral chi-squares add: ``chi'^2_k(l + e) =
   chi'^2_k(e) * chi'^2_0(l)``, a kernel common to both laws). All rows 1 against one of them
   -1 attains it, so the block's exact privacy profile is

       delta_b(eps) = max(H_eps(N(0,1) x chi'^2_k(0) || N(mu,1) x chi'^2_k(D)),
                          H_eps(N(0,1) x chi'^2_k(D) || N(mu,1) x chi'^2_k(0))),

   ``H_eps(P || Q) = int (p - e^eps q)_+``; a release's is the largest over its block sizes.
3. Conditioning on the chi-square coordinate: ``H_eps = E_P[g_mu(eps - ell(z))]`` with ``ell =
   log dP_z / dQ_z`` and ``g_mu(s) = Phi(mu/2 - s/mu) - e^s Phi(-mu/2 - s/mu)``, the Gaussian
   mechanism's curve (Balle and Wang 2018, Theorem 8), valid for every real ``s``
   (:func:`gaussian_hockey_stick`: by ``delta_for_epsilon`` at ``|s|``, and for ``s < 0`` through
   ``H_s(P||Q) = 1 - e^s + e^s H_-s(Q||P)``, the pair being symmetric).

Numerics. The density ratio of ``chi'^2_k(lam)`` to ``chi^2_k`` is ``e^(-lam/2) 0F1(; k/2;
lam z / 4)``; :func:`log_hyp0f1` sums its series in log space over a window of terms around the
largest (the terms are log-concave in their index). The expectation is taken in ``r = sqrt z``
(``r`` is the norm of a Gaussian vector: 1-Lipschitz, so within ``SPAN`` of ``sqrt(k + lam)``
but for less than ``2 exp(-(SPAN - 1)^2 / 2)``) by Gauss-Legendre, ``NODES`` nodes per panel of
``PANEL`` (smooth integrand: the density of ``r`` is analytic). Against a rule with panels ten
times narrower and 30 nodes each the result agrees to about 1e-9 relative at a million rows per
block, 1e-14 at a thousand
(tests/mask/test_orbit.py); :func:`masked_sigma` aims at ``delta (1 - MARGIN)`` so that this
error cannot take the account over its budget.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import scipy.optimize
import scipy.special

from distfit.mathematics.privacy import delta_for_epsilon

__all__ = [
    "block_delta",
    "gaussian_hockey_stick",
    "hockey_stick",
    "log_hyp0f1",
    "masked_delta",
    "masked_sigma",
    "neighbour_moves",
]

PANEL = 0.5     # width of a Gauss-Legendre panel in r = sqrt(z)
NODES = 20      # nodes per panel
SPAN = 15.0     # r within sqrt(k + lam) +- SPAN
MARGIN = 1e-7   # masked_sigma calibrates to delta (1 - MARGIN): the quadrature's error is ~1e-9
TERMS_PER_BATCH = 1 << 22  # log_hyp0f1's working matrix stays under 32 MiB


def log_hyp0f1(a: float, z: np.ndarray) -> np.ndarray:
    """``log 0F1(; a; z) = log sum_j z^j / ((a)_j j!)`` for ``a > 0`` and ``z >= 0`` (array),
    the terms written ``(z / a)^j / (prod_{i<j} (1 + i / a) j!)``.

    The terms are log-concave in ``j`` (their ratio ``z / ((a + j)(j + 1))`` decreases), largest
    near ``j* = (-(a + 1) + sqrt((a - 1)^2 + 4 z)) / 2`` with a spread under ``sqrt(j* + 1)``;
    summed in log space over ``j* +- (10 sqrt(j* + 1) + 20)`` (the rest are below e^-50 of the
    largest, and fall geometrically)."""
    z = np.asarray(z, dtype=np.float64)
    out = np.zeros(z.shape)
    live = z > 0
    if not live.any():
        return out
    zl = z[live]
    peak = np.maximum(0.0, (-(a + 1.0) + np.sqrt((a - 1.0) ** 2 + 4.0 * zl)) / 2.0)
    half = int(math.ceil(10.0 * math.sqrt(float(peak.max()) + 1.0) + 20.0))
    start = np.maximum(0, np.floor(peak).astype(np.int64) - half)
    offsets = np.arange(2 * half + 1)
    top = int(start.max()) + 2 * half + 1
    index = np.arange(top, dtype=np.float64)
    # log((a)_j j!) - j log a, without the cancellation of gammaln(a + j) - gammaln(a) at large a
    rising = np.concatenate(([0.0], np.cumsum(np.log1p(index[:-1] / a))))
    denominator = rising + scipy.special.gammaln(index + 1.0)
    logs = np.log(zl) - math.log(a)
    result = np.empty(zl.shape)
    step = max(1, TERMS_PER_BATCH // offsets.size)
    for lo in range(0, zl.size, step):  # batches of nodes: memory, not speed
        j = start[lo:lo + step, None] + offsets[None, :]
        terms = j * logs[lo:lo + step, None] - denominator[j]
        largest = terms.max(axis=1)
        result[lo:lo + step] = largest + np.log(np.exp(terms - largest[:, None]).sum(axis=1))
    out[live] = result
    return out


def gaussian_hockey_stick(mu: float, s: np.ndarray) -> np.ndarray:
    """``H_s(N(0, 1) || N(mu, 1))`` for every real ``s`` (module docstring, step 3)."""
    s = np.asarray(s, dtype=np.float64)
    at_abs = np.asarray(delta_for_epsilon(mu * mu, np.abs(s)), dtype=np.float64)
    below = np.minimum(s, 0.0)
    return np.where(s >= 0, at_abs, -np.expm1(below) + np.exp(below) * at_abs)


def _chi_nodes(k: int, lam: float) -> tuple[np.ndarray, np.ndarray]:
    """Gauss-Legendre nodes and weights in ``r`` over ``chi'_k(lam)``'s bulk (module docstring)."""
    centre = math.sqrt(k + lam)
    lo, hi = max(0.0, centre - SPAN), centre + SPAN
    panels = int(math.ceil((hi - lo) / PANEL))
    edges = np.linspace(lo, hi, panels + 1)
    x, w = np.polynomial.legendre.leggauss(NODES)
    half = (edges[1:] - edges[:-1]) / 2.0
    mid = (edges[1:] + edges[:-1]) / 2.0
    return (mid[:, None] + half[:, None] * x).ravel(), (half[:, None] * w).ravel()


def hockey_stick(epsilon: float, mu: float, lam_p: float, lam_q: float, k: int) -> float:
    """``H_epsilon(N(0,1) x chi'^2_k(lam_p) || N(mu,1) x chi'^2_k(lam_q))`` (module docstring,
    step 3), ``mu > 0``, ``k >= 1``, any real ``epsilon``: the law of the released Gram matrix of
    a block of ``k + 1`` rows given one data set against that given a neighbour."""
    r, weights = _chi_nodes(k, lam_p)
    a = k / 2.0
    t = r * r
    series_p = log_hyp0f1(a, lam_p * t / 4.0)
    log_density = (math.log(2.0) + (k - 1) * np.log(r) - t / 2.0 - a * math.log(2.0)  # r > 0: inner nodes
                   - scipy.special.gammaln(a) - lam_p / 2.0 + series_p)
    ell = (lam_q - lam_p) / 2.0 + series_p - log_hyp0f1(a, lam_q * t / 4.0)
    return float(np.sum(weights * np.exp(log_density) * gaussian_hockey_stick(mu, epsilon - ell)))


def neighbour_moves(sigma: float, rows: int) -> tuple[float, float]:
    """``(mu, D)``: the largest move of the mean coordinate, ``2 / (sigma sqrt b)``, and of the
    noncentrality, ``4 (b - 1) / (b sigma^2)``, when one of the ``b = rows`` rows is replaced."""
    return 2.0 / (sigma * math.sqrt(rows)), 4.0 * (rows - 1) / (rows * sigma * sigma)


def block_delta(epsilon: float, sigma: float, rows: int) -> float:
    """The exact delta at ``epsilon`` of a masked block of ``rows >= 2`` rows of one column with
    noise ``sigma`` (module docstring, step 2): the larger of the two orders at the worst pair."""
    mu, d = neighbour_moves(sigma, rows)
    k = int(rows) - 1
    return max(hockey_stick(epsilon, mu, 0.0, d, k), hockey_stick(epsilon, mu, d, 0.0, k))


def masked_delta(epsilon: float, sigma: float, sizes: Sequence[int]) -> float:
    """The exact delta at ``epsilon`` of a masked release of one column in blocks of ``sizes``
    rows with noise ``sigma``: the largest :func:`block_delta` over the distinct sizes (a row is
    in one block; the others' laws do not change)."""
    return max(block_delta(epsilon, sigma, int(b)) for b in sorted({int(s) for s in sizes}))


def masked_sigma(epsilon: float, delta: float, sizes: Sequence[int], upper: float) -> tuple[float, float]:
    """``(sigma, delta_achieved)``: the least sigma (to about 1e-10 relative) for which the masked
    release of one column in blocks of ``sizes`` rows is (``epsilon``, ``delta``)-DP, found below
    ``upper`` (setting A's sigma, always enough: the mask is post-processing), and
    :func:`masked_delta` at that sigma (the last evaluation of the search, returned so that the
    account need not repeat it). :func:`masked_delta` decreases in sigma (both moves of
    :func:`neighbour_moves` shrink), so the root of ``log masked_delta = log (delta (1 -
    MARGIN))`` in ``log sigma`` is unique; Brent's method, then nudged up until the computed delta
    is within the aim."""
    aim = delta * (1.0 - MARGIN)
    target = math.log(aim)
    deltas: dict[float, float] = {}  # sigma -> masked_delta: the search's evaluations

    def delta_at(sigma: float) -> float:
        if sigma not in deltas:
            deltas[sigma] = masked_delta(epsilon, sigma, sizes)
        return deltas[sigma]

    def excess(log_sigma: float) -> float:
        value = delta_at(math.exp(log_sigma))
        return (math.log(value) if value > 0 else -1e300) - target

    if delta_at(upper) > aim:  # cannot happen in exact arithmetic; never claim more than setting A
        return float(upper), delta_at(upper)
    high = math.log(upper)
    low = high - math.log(2.0)
    for _ in range(200):
        if excess(low) > 0:
            break
        high, low = low, low - math.log(2.0)
    root = scipy.optimize.brentq(excess, low, high, xtol=1e-12, rtol=1e-12)
    sigma = math.exp(root)
    while delta_at(sigma) > aim:
        sigma *= 1.0 + 1e-10
    if sigma > upper:
        return float(upper), delta_at(upper)
    return float(sigma), delta_at(sigma)
