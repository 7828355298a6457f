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
sigma (the paper's Lemma 2.4). For one data column (``p = 1``) the account is setting B's exact
one (:mod:`distfit.mask.orbit`, docs/privacy.md "Setting B for one column"): the release
``A [x + c, 1]`` depends on the data only through its 2 x 2 Gram matrix (the appended constant
column included), whose law is a Gaussian times a noncentral chi-square; sigma is the least for
which the worst pair of neighbouring blocks, over the release's block sizes, meets (epsilon,
delta), and never more than setting A's. For ``p > 1`` no bound of setting B is derived: sigma
is setting A's and ``sigma_masked`` is None.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass

from distfit.mask.orbit import masked_sigma
from distfit.mathematics.privacy import alpha_for_budget, delta_for_epsilon

__all__ = ["MaskAccount", "check_budget", "gaussian_sigma", "l2_sensitivity", "mask_account"]

NEIGHBOURS = "replace-one: data sets of the same n rows that differ in one row (n public)"
MECHANISM = ("Y = A [X + C, 1]: X scaled to [-1, 1] with public bounds, C iid N(0, sigma^2), "
             "A block-diagonal with Haar orthogonal blocks (paper 003, setting B)")
CALIBRATION_A = ("setting A: the analytic Gaussian mechanism (Balle and Wang 2018) with L2 sensitivity "
                 "2 sqrt(p); the mask is post-processing")
CALIBRATION_B = ("setting B, p = 1: the exact hockey-stick divergence of the released Gram matrix (a Gaussian "
                 "times a noncentral chi-square), worst pair of neighbouring blocks over the block sizes "
                 "(docs/privacy.md); at most setting A's sigma")
GAIN_CLAIMED = "claimed for p = 1: sigma is setting B's exact calibration (docs/privacy.md)"
GAIN_NOT_CLAIMED = "not claimed for p > 1: sigma is setting A's (docs/privacy.md)"


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
    sensitivity, the sigma of setting A and of setting B (None: not claimed, ``p > 1``), the
    sigma used (the smaller), the delta that sigma achieves at epsilon (recomputed: <= delta),
    and the distinct block sizes the account covers."""

    epsilon: float
    delta: float
    p: int
    sensitivity: float
    sigma_gaussian: float
    sigma_masked: float | None
    sigma: float
    delta_achieved: float
    block_rows: tuple[int, ...]
    calibration: str
    masking_gain: str
    neighbours: str = NEIGHBOURS
    mechanism: str = MECHANISM

    def to_dict(self) -> dict:
        return asdict(self)


def check_budget(epsilon: float, delta: float) -> None:
    """ValueError naming ``--epsilon`` (not finite and > 0) or ``--delta`` (not in (0, 1))."""
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float)) or not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"--epsilon must be finite and > 0, got {epsilon!r}")
    if isinstance(delta, bool) or not isinstance(delta, (int, float)) or not 0 < delta < 1:
        raise ValueError(f"--delta must be in (0, 1), got {delta!r}")


def mask_account(epsilon: float, delta: float, p: int, sizes: Sequence[int]) -> MaskAccount:
    """The account of a masked release of ``p`` data columns in blocks of ``sizes`` rows under
    (``epsilon``, ``delta``) (module docstring); ValueError from :func:`check_budget`."""
    check_budget(epsilon, delta)
    sensitivity = l2_sensitivity(p)
    sigma_a = gaussian_sigma(epsilon, delta, p)
    distinct = tuple(sorted({int(b) for b in sizes}))
    if p == 1:
        sigma_b, achieved = masked_sigma(epsilon, delta, distinct, sigma_a)  # sigma_b <= sigma_a
        sigma = min(sigma_a, sigma_b)
        calibration, gain = CALIBRATION_B, GAIN_CLAIMED
    else:
        sigma_b, sigma = None, sigma_a
        achieved = delta_for_epsilon((sensitivity / sigma) ** 2, epsilon)
        calibration, gain = CALIBRATION_A, GAIN_NOT_CLAIMED
    return MaskAccount(epsilon=float(epsilon), delta=float(delta), p=int(p), sensitivity=sensitivity,
                       sigma_gaussian=sigma_a, sigma_masked=sigma_b, sigma=sigma, delta_achieved=float(achieved),
                       block_rows=distinct, calibration=calibration, masking_gain=gain)
