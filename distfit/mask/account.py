"""The privacy account of a masked release: neighbours, sensitivity and the noise's calibration.

Neighbours (stated, docs/privacy.md "Masked pseudo-data"): two data sets of the same ``n`` rows
that differ in one row (replace-one; ``n`` is public: it is the shape of the release). Scaled to
[-1, 1] with public bounds (:mod:`distfit.mask.scaling`), a row of ``p`` columns moves by at
most ``2 sqrt(p)`` in L2 norm (every entry by at most 2), and the constant column the release
appends does not move at all.

Setting A of paper 003 (docs/design.md, References): ``X + C`` with iid ``N(0, sigma^2)``
entries is the Gaussian mechanism with L2 sensitivity ``Delta_2 = 2 sqrt(p)``, and its exact
(epsilon, delta) curve is the analytic Gaussian mechanism's (Balle and Wang 2018, Theorem 8):

    delta(eps) = Phi(D/2 - eps/D) - e^eps Phi(-D/2 - eps/D),    D = Delta_2 / sigma.

``delta(eps)`` increases with ``D``, so the calibration is the one root ``D*`` of
``delta(eps; D) = delta`` and ``sigma = Delta_2 / D*``:
:func:`distfit.mathematics.privacy.alpha_for_budget` finds ``alpha = D*^2`` (the package's one
exact calibration, bracketed root finding on ``log delta``, rounded to the conservative side).

Setting B (the same noise, then masked): masking is post-processing of ``X + C`` (``A`` is
independent of the data), so the release is at least as private as setting A with the same
sigma (the paper's Lemma 2.4). The paper shows that masking can need far less noise when
``n >> p``; this release does not claim that gain yet (``sigma_masked`` is None): with the
constant column appended the released orbit statistic is the (p + 1) x (p + 1) Gram matrix,
not the single norm the one-column argument bounds (docs/privacy.md). The noise used is
setting A's sigma.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from distfit.mathematics.privacy import alpha_for_budget, delta_for_epsilon

__all__ = ["MaskAccount", "gaussian_sigma", "l2_sensitivity", "mask_account"]

NEIGHBOURS = "replace-one: data sets of the same n rows that differ in one row (n public)"
MECHANISM = ("Y = A [X + C, 1]: X scaled to [-1, 1] with public bounds, C iid N(0, sigma^2), "
             "A block-diagonal with Haar orthogonal blocks (paper 003, setting B)")
CALIBRATION = ("setting A: the analytic Gaussian mechanism (Balle and Wang 2018) with L2 sensitivity "
               "2 sqrt(p); the mask is post-processing")
MASKING_GAIN = "not claimed: sigma is setting A's (docs/privacy.md)"


def l2_sensitivity(p: int) -> float:
    """``2 sqrt(p)``: how far a row of ``[-1, 1]^p`` moves in L2 norm when it is replaced."""
    return 2.0 * math.sqrt(p)


def gaussian_sigma(epsilon: float, delta: float, p: int) -> float:
    """Setting A's sigma (module docstring): ``2 sqrt(p) / sqrt(alpha_for_budget(epsilon, delta))``,
    the least noise for which ``X + C`` is (epsilon, delta)-DP. ValueError for epsilon not
    finite and > 0, delta not in (0, 1)."""
    return l2_sensitivity(p) / math.sqrt(alpha_for_budget(epsilon, delta))


@dataclass(frozen=True)
class MaskAccount:
    """The account a mask store states (its ``account`` attr): the budget, the neighbours, the
    sensitivity, the sigma of setting A and of setting B (None: not claimed), the sigma used,
    and the delta that sigma achieves at epsilon (recomputed from the formula: <= delta)."""

    epsilon: float
    delta: float
    p: int
    sensitivity: float
    sigma_gaussian: float
    sigma_masked: float | None
    sigma: float
    delta_achieved: float
    neighbours: str = NEIGHBOURS
    mechanism: str = MECHANISM
    calibration: str = CALIBRATION
    masking_gain: str = MASKING_GAIN

    def to_dict(self) -> dict:
        return asdict(self)


def mask_account(epsilon: float, delta: float, p: int) -> MaskAccount:
    """The account of a masked release of ``p`` data columns under (``epsilon``, ``delta``);
    ValueError naming ``--epsilon`` (not finite and > 0) or ``--delta`` (not in (0, 1))."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"--epsilon must be finite and > 0, got {epsilon!r}")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise ValueError(f"--delta must be in (0, 1), got {delta!r}")
    sigma = gaussian_sigma(epsilon, delta, p)
    sensitivity = l2_sensitivity(p)
    achieved = delta_for_epsilon((sensitivity / sigma) ** 2, epsilon)
    return MaskAccount(epsilon=float(epsilon), delta=float(delta), p=int(p), sensitivity=sensitivity,
                       sigma_gaussian=sigma, sigma_masked=None, sigma=sigma, delta_achieved=float(achieved))
