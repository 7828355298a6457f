"""``distfit audit``: recompute a stored plan's privacy account and check every claim.

The auditor trusts nothing the planner computed. From the stored sigma, basis and recon of
every block it recomputes, by its own code path (an eigendecomposition of sigma, where the
planner used Cholesky factors and the dual's geometric mean):

* the block profile ``b_i^T Sigma^-1 b_i``, alpha and variances ``diag(L Sigma L^T)``;
* that sigma is symmetric positive definite;
* the per-query variances (sum over the blocks holding a row for the query) and that every one
  is within its target (times the variance scale k a privacy-first plan records);
* the stitched alpha: the cell-by-cell maximum of the summed block profiles when the plan says
  ``alpha_exact``, else the sum of block alphas; and ``rho = alpha / 2``;
* the checksum over all arrays (:func:`distfit.stores.plan.verify_checksum`; the report keeps
  the recomputed one, so a caller that acts on the audited plan, e.g.
  :func:`distfit.release.job.run_release`, can check cheaply that the plan it reads is the
  one audited, without hashing it again).

Any mismatch beyond a relative tolerance of 1e-8 fails the audit.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distfit.plan.composition import stitched_profile
from distfit.stores.plan import read_plan, verify_checksum
from distfit.domain import Domain

TOLERANCE = 1e-8


@dataclass(frozen=True)
class AuditReport:
    """What the audit checked and what failed; ``ok`` is True when nothing failed."""

    path: str
    checks: int
    failures: tuple[str, ...]
    alpha: float
    checksum: str  # what the plan's arrays hash to (== its stored checksum when ``ok``)

    @property
    def ok(self) -> bool:
        return not self.failures


def _profile_by_eigendecomposition(sigma: np.ndarray, basis: np.ndarray) -> np.ndarray:
    eigenvalues, eigenvectors = np.linalg.eigh(sigma)
    if eigenvalues.min() <= 0:
        raise np.linalg.LinAlgError(f"sigma is not positive definite (smallest eigenvalue {eigenvalues.min():.3g})")
    projected = (eigenvectors.T @ basis) / np.sqrt(eigenvalues)[:, None]
    return np.einsum("ij,ij->j", projected, projected)


def _close(stored, recomputed) -> bool:
    return bool(np.allclose(stored, recomputed, rtol=TOLERANCE, atol=0.0))


def audit_plan(path: str) -> AuditReport:
    """Audit the plan store at ``path`` (module docstring). Raises StoreError if it is unreadable."""
    plan = read_plan(path)
    failures: list[str] = []
    checks = 0

    def check(condition: bool, message: str) -> None:
        nonlocal checks
        checks += 1
        if not condition:
            failures.append(message)

    ok, stored_sum, recomputed_sum = verify_checksum(path)
    check(ok, f"checksum: stored {stored_sum} but the arrays hash to {recomputed_sum}")
    schema = plan.attrs["schema"]
    domain = Domain.from_schema(schema)
    variances = np.zeros_like(plan.queries_targets)
    block_profiles = []
    alpha_sum = 0.0
    for block in plan.iter_blocks():
        name = f"blocks/{block.block_id}"
        check(_close(block.sigma, block.sigma.T), f"{name}/sigma: not symmetric")
        try:
            profile = _profile_by_eigendecomposition(block.sigma, block.basis)
        except np.linalg.LinAlgError as error:
            check(False, f"{name}/sigma: {error}")
            continue
        block_variances = np.einsum("ij,jk,ik->i", block.recon, block.sigma, block.recon)
        check(_close(block.profile, profile), f"{name}/profile: stored values differ from b_i^T Sigma^-1 b_i")
        check(_close(block.variances, block_variances), f"{name}/variances: stored values differ from diag(L Sigma L^T)")
        check(_close(block.alpha, profile.max()), f"{name}: alpha {block.alpha} but the profile's max is {profile.max()}")
        np.add.at(variances, block.query_index, block_variances)
        block_profiles.append((tuple(block.attributes), profile))
        alpha_sum += float(profile.max())
    check(_close(plan.queries_variances, variances), "queries/variances: differ from the sum of the block rows")
    # A privacy-first plan promises variances k * c (k recorded by the planner).
    scale = float(plan.attrs.get("planner", {}).get("variance_scale", 1.0))
    over = np.flatnonzero(variances > scale * plan.queries_targets * (1.0 + TOLERANCE))
    check(over.size == 0, f"queries/variances: {over.size} queries exceed {scale:g} x their targets (first: query {over[:1].tolist()})")
    if plan.attrs.get("alpha_exact"):
        alpha = float(stitched_profile(domain, block_profiles).max())
    else:
        alpha = alpha_sum
    check(_close(plan.attrs["alpha"], alpha), f"alpha: stored {plan.attrs['alpha']} but the blocks give {alpha}")
    check(_close(plan.attrs["rho"], alpha / 2.0), f"rho: stored {plan.attrs['rho']} but alpha / 2 = {alpha / 2.0}")
    return AuditReport(str(path), checks, tuple(failures), alpha, recomputed_sum)
