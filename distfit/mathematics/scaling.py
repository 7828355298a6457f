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
    """A noise quantity (covariance ``Sigma``, variances, a variance-to-target scale) at scale k: ``value * k``.
    ValueError when k is not finite and > 0 or the product leaves float64 (:func:`_checked`)."""
    _check_factor(k)
    with np.errstate(over="ignore", under="ignore"):
        return _checked(value, value * k, k)


def scaled_cost(value: Value, k: float) -> Value:
    """A privacy quantity (profile, alpha, a bound on alpha) at noise scale k: ``value / k``.
    ValueError when k is not finite and > 0 or the quotient leaves float64 (:func:`_checked`)."""
    _check_factor(k)
    with np.errstate(over="ignore", under="ignore"):
        return _checked(value, value / k, k)


def _check_factor(k: float) -> None:
    """A scale is a finite number > 0 (a budget of ``inf`` would give k = 0 and a division by it)."""
    factors = np.asarray(k, dtype=float)  # one scale, or one per block
    bad = ~(np.isfinite(factors) & (factors > 0))
    if np.any(bad):
        raise ValueError(f"noise scale k must be finite and > 0, got {float(factors[bad].flat[0])!r}: the plan's "
                         "privacy cost and its budget are out of proportion")


def _checked(value: Value, result: Value, k: float) -> Value:
    """``result`` unless scaling made a finite ``value`` infinite or a nonzero one 0 (float64
    overflow or underflow: the plan's privacy cost and the budget are too far apart to compute
    with; the spec's ranges, docs/spec.md "Ranges", keep a loaded spec far from that)."""
    lost = (np.isfinite(value) & ~np.isfinite(result)) | ((value != 0) & (result == 0))
    if np.any(lost):
        where = np.flatnonzero(np.ravel(lost))[0]
        value_, result_ = np.broadcast_arrays(value, result)
        raise ValueError(f"scaling by k leaves the floating-point range ({float(np.ravel(value_)[where]):g} "
                         f"becomes {float(np.ravel(result_)[where]):g})")
    return result


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
