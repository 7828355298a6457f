"""Margins of error and coefficients of variation: the terms users state accuracy in, as variances.

distfit's targets are variances of the noisy answers; agencies publish a 90% margin of error
(the American Community Survey prints ``MOE = 1.645 * SE`` beside every figure) or a
coefficient of variation (``CV = SE / value``). For Gaussian noise of variance ``v`` (every
released answer, docs/design.md section 1):

* ``moe90 = MOE90_Z * sqrt(v)``, so a target "within +-M at 90%" is ``v = (M / MOE90_Z)**2``;
* a CV of ``C`` at a count of ``N`` is ``SE = C * N``, so ``v = (C * N)**2``.

``MOE90_Z`` is the ACS's 1.645 (z_0.95 = 1.6448536..., rounded as the ACS rounds it), used by the
spec's target forms ``{moe: M}`` and ``{cv: C, at: N}`` (docs/spec.md, "Targets from margins of
error") and by ``distfit export``'s ``moe90`` column alike.
"""
from __future__ import annotations

#: The multiplier of the 90% margin of error (the ACS's 1.645).
MOE90_Z = 1.645


def variance_of_moe(moe: float) -> float:
    """The variance whose 90% margin of error is ``moe``: ``(moe / MOE90_Z)**2``."""
    return (float(moe) / MOE90_Z) ** 2


def variance_of_cv(cv: float, at: float) -> float:
    """The variance of a count ``at`` whose coefficient of variation is ``cv``: ``(cv * at)**2``."""
    return (float(cv) * float(at)) ** 2


__all__ = ["MOE90_Z", "variance_of_cv", "variance_of_moe"]
