"""Scaling a block's noise by a factor k: the one place that says what it does to a plan.

docs/design.md section 1 (Problem 2) and section 2 (allocation): a block whose noise covariance is
multiplied by ``k > 0`` (``Sigma -> k Sigma``) has every variance ``diag(L Sigma L^T)`` multiplied
by ``k`` and its privacy profile ``p_i = b_i^T Sigma^-1 b_i`` divided by ``k``, and with it every
privacy cost derived from the profile: ``alpha = max_i p_i``, its certified lower bound, sums of
block alphas (the dual weights that certify a bound do not change: at scale k they prove the
bound divided by k, for variances k times the targets). The allocation's scale ``s_S`` of a
block, a privacy-first plan's common factor ``k = alpha / alpha_budget`` and a level's share of
a run's budget are all this one operation.

The arithmetic is fixed (``x * k`` for the noise side, ``x / k`` for the privacy side), so
every stage that scales gets the same floats: a plan scaled in memory and one scaled block by
block in its store have the same bytes and checksum (``x / k`` and ``x * (1 / k)`` differ in
the last bit).
"""
from __future__ import annotations

from typing import NamedTuple, TypeVar

import numpy as np

Value = TypeVar("Value", float, np.ndarray)


class ScaledBlock(NamedTuple):
    """A block's scaled quantities (field names as in ``stores.plan.BlockRecord``)."""

    sigma: np.ndarray
    variances: np.ndarray
    profile: np.ndarray
    alpha: float
    lower_bound: float


def scaled_noise(value: Value, k: float) -> Value:
    """A noise quantity (covariance ``Sigma``, variances, a variance-to-target scale) at scale k: ``value * k``."""
    return value * k


def scaled_cost(value: Value, k: float) -> Value:
    """A privacy quantity (profile, alpha, a bound on alpha) at noise scale k: ``value / k``."""
    return value / k


def scale_block(k: float, sigma: np.ndarray, variances: np.ndarray, profile: np.ndarray, alpha: float,
                lower_bound: float) -> ScaledBlock:
    """A block's covariance scaled by ``k`` (module docstring): ``sigma * k``, ``variances * k``,
    ``profile / k``, ``alpha / k``, ``lower_bound / k``."""
    return ScaledBlock(
        sigma=scaled_noise(sigma, k),
        variances=scaled_noise(variances, k),
        profile=scaled_cost(profile, k),
        alpha=scaled_cost(alpha, k),
        lower_bound=scaled_cost(lower_bound, k),
    )
