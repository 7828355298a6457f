"""What every check of ``distfit audit`` shares: the check counter, the tolerances and
comparisons, the audit's own profile and variance formulas, the closed-key and label checks,
and what every audit returns (:class:`AuditReport`: a plan's, ``distfit.audit.plan``, and a
mask store's, ``distfit.audit.mask``).

The profile is computed by an eigendecomposition of sigma (the planner: Cholesky factors),
``p_i = || Lambda^-1/2 Q^T b_i ||^2`` for ``Sigma = Q Lambda Q^T`` (docs/privacy.md); the
variances are ``diag(L Sigma L^T)``.
"""
from __future__ import annotations

import reprlib
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from distfit.audit import labels

@dataclass(frozen=True)
class AuditReport:
    """What the audit of the store at ``path`` checked (``checks``) and what failed
    (``failures``; ``ok`` when none); the store's headline privacy claim as the audit
    recomputed it, by name (``claim``: a plan's ``"alpha"``, a mask store's ``"sigma"``; NaN
    when the store is too broken to recompute it) and ``value``; ``checksum``: what the
    store hashes to (its stored checksum when ``ok``)."""

    path: str
    checks: int
    failures: tuple[str, ...]
    claim: str
    value: float
    checksum: str

    @property
    def ok(self) -> bool:
        return not self.failures


TOLERANCE = 1e-8  # relative: a recomputed number and the stored one agree to this
BOUND_TOLERANCE = 1e-9  # a stored bound equals the bound its stored certificate proves, to this (relative)
REPLAN = "re-plan with this version of distfit (distfit plan) to get a plan whose claims can be re-certified"


class Checks:
    """Counts checks and collects failures (each names the claim)."""

    def __init__(self) -> None:
        self.count = 0
        self.failures: list[str] = []

    def __call__(self, condition: bool, message: str | Callable[[], str]) -> bool:
        self.count += 1
        if not condition:
            self.failures.append(message() if callable(message) else message)
        return bool(condition)


def profile_by_eigendecomposition(sigma: np.ndarray, basis: np.ndarray) -> np.ndarray:
    eigenvalues, eigenvectors = np.linalg.eigh(sigma)
    if eigenvalues.min() <= 0:
        raise np.linalg.LinAlgError(f"sigma is not positive definite (smallest eigenvalue {eigenvalues.min():.3g})")
    projected = (eigenvectors.T @ basis) / np.sqrt(eigenvalues)[:, None]
    return np.einsum("ij,ij->j", projected, projected)


def inverse_tolerance(sigma: np.ndarray) -> float:
    """How closely (relative) a number computed through ``Sigma^-1`` (a block's profile
    ``b_i^T Sigma^-1 b_i``) can be recomputed: :data:`TOLERANCE`, plus ``eps * cond(Sigma)``, the
    relative forward error of a solve with ``Sigma`` in float64 (Higham, "Accuracy and Stability
    of Numerical Algorithms", 2nd ed., section 7.1). On a well-conditioned sigma that adds
    nothing that matters; on an ill-conditioned one (a prefix block whose targets are 3,000
    apart: condition 1.3e9) the planner's and the audit's profiles differ by 2e-8 with some
    BLAS builds, and the check allows 3e-7 there (docs/audit.md, "What the audit checks")."""
    eigenvalues = np.linalg.eigvalsh(sigma)
    if eigenvalues.size == 0 or eigenvalues.min() <= 0:
        return TOLERANCE
    return TOLERANCE + float(np.finfo(np.float64).eps * eigenvalues.max() / eigenvalues.min())


def row_variances(recon: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """``diag(L Sigma L^T)`` through one matrix product (BLAS; a three-operand einsum is not)."""
    return np.einsum("ij,ij->i", recon @ sigma, recon)


def variance_disagreement(stored: np.ndarray, recomputed: np.ndarray) -> float:
    """The largest relative difference ``|s_j - r_j| / r_j`` between a block's stored variances
    and the audit's recomputed ones (0 when their shapes differ: that has failed elsewhere)."""
    if stored.shape != recomputed.shape or not recomputed.size:
        return 0.0
    with np.errstate(divide="ignore", invalid="ignore"):
        relative = np.abs(stored - recomputed) / recomputed
    return float(np.max(relative)) if np.all(np.isfinite(relative)) else 0.0


def bound_tolerance(disagreement: float) -> float:
    """How closely (relative) the audit can pin a bound evaluated at targets scaled by a
    variance scale ``s = max_j v_j / t_j``: :data:`BOUND_TOLERANCE`, plus twice the relative
    ``disagreement`` of the variances it is evaluated at (:func:`variance_disagreement`; the
    largest over the blocks for a sum over them): ``s`` moves by at most that, and a bound is
    ``N^2 ~ 1 / s``.

    The variances themselves are checked to :data:`TOLERANCE`; a bound evaluated at them can be
    pinned no closer than they are. On a well-conditioned sigma the planner's and the audit's
    variances agree to about 1e-15 and the tolerance stays :data:`BOUND_TOLERANCE`; on an
    ill-conditioned one (a prefix block whose targets are 3,000 apart: sigma's condition number
    1e9) they differ by 1e-8, and so may the bounds (docs/audit.md, "What the audit checks").
    """
    return BOUND_TOLERANCE + 2.0 * disagreement


def close(stored, recomputed, tolerance: float = TOLERANCE) -> bool:
    if isinstance(stored, bool) or stored is None:
        return False
    try:
        stored = np.asarray(stored, dtype=float)
    except (TypeError, ValueError):
        return False
    recomputed = np.asarray(recomputed, dtype=float)
    return stored.shape == recomputed.shape and bool(np.allclose(stored, recomputed, rtol=tolerance, atol=0.0))


def at_most(value: float, bound: float, tolerance: float = TOLERANCE) -> bool:
    """``value <= bound`` up to the relative ``tolerance``."""
    return bool(value <= bound * (1.0 + tolerance))


def first_true(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def closed_keys(check: Checks, name: str, value: Any, known: frozenset) -> bool:
    """``value`` is a dict whose keys are all in the closed list ``known``."""
    # the message formed only on a failure: a passing value can be megabytes (the planner's record)
    if not check(isinstance(value, dict), lambda: f"{name}: expected a dict, got {reprlib.repr(value)}"):
        return False
    extra = labels.unknown(value, known)
    return check(not extra, f"{name}: unknown keys {extra} (a plan states only {sorted(known)})")


def label(check: Checks, name: str, stored: Any, derived: str) -> None:
    """A text label must be the one the audit derives."""
    check(stored == derived, f"{name}: stored {stored!r}, but the plan's arrays and spec give {derived!r}")
