"""The packs of a plan (closed-form residual blocks of identity marginals, stored many at once:
:class:`distfit.mathematics.packing.PackedBlocks`), audited in bulk: every claim of their blocks
recomputed by numpy over all blocks and segments at once (docs/audit.md).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distfit.audit import labels
from distfit.mathematics import bounds as bound_labels
from distfit.audit.bounds import certified_norm
from distfit.audit.checks import BOUND_TOLERANCE, TOLERANCE, Checks, profile_by_eigendecomposition, row_variances
from distfit.audit.chosen import Certificate
from distfit.audit.composition import EXACT_DOMAIN_LIMIT, is_flat
from distfit.mathematics.domain import Domain
from distfit.audit.query_steps import QueryRows, range_minima
from distfit.mathematics.packing import PackedBlocks, QueryRuns, block_cells, residual_basis
from distfit.stores.plan import Plan

@dataclass
class PackResult:
    """What a pack adds to the plan's sums: its alphas' sum, its blocks' profiles, its bounds."""

    alpha_sum: float
    profiles: list  # (positions, profile) per block, when the domain is small enough for exact alpha
    proved: dict  # block id -> certified bound (a one-block plan only)
    flat: bool  # every block's recomputed profile is flat (to TOLERANCE)


def signature_forms(signatures: np.ndarray) -> dict[str, np.ndarray]:
    """Per attribute-size signature (rows of sizes, 0-padded): from the materialised basis B
    and G = B B^T (sigma / scale), by eigendecomposition (:func:`profile_by_eigendecomposition`)
    and the pseudo-inverse R = B^+ = B^T G^-1 (the rows ``kappa R[x|S]`` a segment implies): the profile at
    scale 1 (``profiles``) and its largest value, the smallest and largest row variance ``diag(R G R^T)`` at kappa 1, and the
    certificate's bound at unit kappa and target (u, v uniform), ``N(u, v)^2`` (:func:`distfit.audit.bounds.certified_norm`)."""
    out: dict = {key: np.empty(len(signatures)) for key in ("profile", "variance_min", "variance_max", "bound")}
    out["profiles"] = []
    for i, row in enumerate(signatures):
        basis = residual_basis(tuple(int(n) for n in row if n > 0))
        gram = basis @ basis.T
        profile = profile_by_eigendecomposition(gram, basis)
        recon = np.linalg.solve(gram, basis).T  # B^+ = B^T (B B^T)^-1: B has full row rank
        unit_variances = row_variances(recon, gram)
        d = basis.shape[1]
        out["profile"][i] = profile.max()
        out["profiles"].append(profile)
        out["variance_min"][i], out["variance_max"][i] = unit_variances.min(), unit_variances.max()
        out["bound"][i] = certified_norm(basis, recon, np.full(d, 1.0 / d), np.full(d, 1.0 / d)) ** 2
    return out


def audit_pack(check: Checks, plan: Plan, p: int, pack: PackedBlocks, domain: Domain, targets: QueryRuns,
                rows: QueryRows, certificate: Certificate | None) -> PackResult | None:
    """Every claim of a pack's blocks (module docstring), recomputed by numpy over all its blocks
    and segments at once: per attribute-size signature one eigendecomposition and one SVD
    (:func:`signature_forms`), then per block and per segment only scalars; the implied rows go
    to ``rows`` as ranges of queries (never expanded). ``targets``: every query's, as runs. None
    when the pack cannot be audited further (a failure was recorded)."""
    name = f"packs/{plan.pack_ids[p]}"
    ids = plan.packed_block_ids(p)
    sizes = np.asarray(domain.sizes, dtype=np.int64)
    m = targets.size
    check(pack.solver == labels.CLOSED_FORM_SOLVER,
          f"{name}/solver: stored {pack.solver!r}, but a pack holds closed-form blocks ({labels.CLOSED_FORM_SOLVER!r})")
    own = pack.attributes
    own_sizes = np.where(own >= 0, sizes[np.maximum(own, 0)], 0)
    bad = np.flatnonzero(((own >= 0) & (own_sizes < 2)).any(axis=1))
    if not check(bad.size == 0, lambda: f"{name}: {bad.size} blocks hold an attribute of size 1 (first: {ids[bad[0]]})"):
        return None
    clique_cells = block_cells(sizes, pack.segment_clique)
    last = pack.segment_query + clique_cells - 1
    if not check(pack.segments == 0 or int(last.max()) < m,
                 f"{name}/segment_query: refers to query {int(last.max()) if pack.segments else 0}, but there are {m} "
                 "queries"):
        return None
    signatures, which = np.unique(own_sizes, axis=0, return_inverse=True)
    which = which.ravel()
    try:
        forms = signature_forms(signatures)
    except np.linalg.LinAlgError as error:
        check(False, f"{name}: a residual basis has a singular Gram matrix ({error})")
        return None
    scale = pack.scale
    alpha = forms["profile"][which] / scale
    wrong = np.flatnonzero(~np.isclose(pack.alpha, alpha, rtol=TOLERANCE, atol=0.0))
    check(wrong.size == 0, lambda: (f"{name}/alpha: {wrong.size} blocks' alphas differ from their profiles' max "
                                    f"(first: {ids[wrong[0]]}: stored {float(pack.alpha[wrong[0]])!r}, recomputed "
                                    f"{float(alpha[wrong[0]])!r})"))
    owner = pack.segment_block
    kappa = block_cells(sizes, own)[owner] / clique_cells
    low = scale[owner] * kappa**2 * forms["variance_min"][which[owner]]
    high = scale[owner] * kappa**2 * forms["variance_max"][which[owner]]
    wrong = np.flatnonzero(~(np.isclose(pack.segment_variance, low, rtol=TOLERANCE, atol=0.0)
                             & np.isclose(pack.segment_variance, high, rtol=TOLERANCE, atol=0.0)))
    check(wrong.size == 0, lambda: (f"{name}/segment_variance: {wrong.size} segments' variances differ from "
                                    f"diag(L Sigma L^T) (first: segment {wrong[0]} of {ids[owner[wrong[0]]]}: stored "
                                    f"{float(pack.segment_variance[wrong[0]])!r}, recomputed {float(high[wrong[0]])!r})"))

    # The implied rows: each segment gives every query of its marginal, the range
    # [segment_query, segment_query + cells), its row variance and share (summed per query with
    # the other blocks' rows by audit.query_steps); and its smallest query target.
    share = pack.segment_target
    rows.add_ranges(pack.segment_query, pack.segment_query + clique_cells, high, share)
    smallest_target = range_minima(targets, pack.segment_query, pack.segment_query + clique_cells)
    bad = np.flatnonzero(~((share > 0) & (share <= smallest_target * (1.0 + TOLERANCE))))
    check(bad.size == 0, lambda: (f"{name}/segment_target: {bad.size} segments' target shares are not in (0, their "
                                  f"queries' target] (first: segment {bad[0]} of {ids[owner[bad[0]]]}: share "
                                  f"{float(share[bad[0]])!r}, target {float(smallest_target[bad[0]])!r})"))

    # Lower bounds at their certificates: u uniform on the cells, v uniform on the certificate
    # segment's rows, at t = shares * max(variance / share) over the block (bounds.bound_targets).
    ratio = np.maximum.reduceat(high / share, pack.segment_offsets[:-1]) if pack.segments else np.zeros(0)
    has = np.flatnonzero(pack.certificate >= 0)
    cert = pack.certificate[has]
    bound = np.zeros(len(pack))
    bound[has] = kappa[cert] ** 2 / (share[cert] * ratio[has]) * forms["bound"][which[has]]
    off = has[np.abs(pack.lower_bound[has] - bound[has]) > BOUND_TOLERANCE * bound[has]]
    check(off.size == 0, lambda: (f"{name}/lower_bound: {off.size} blocks' bounds are not what their certificates "
                                  f"prove (first: {ids[off[0]]}: stored {float(pack.lower_bound[off[0]])!r}, its certificate "
                                  f"proves {float(bound[off[0]])!r})"))
    none = np.flatnonzero((pack.certificate < 0) & (pack.lower_bound > 0))
    check(none.size == 0, lambda: (f"{name}/lower_bound: {none.size} blocks state a bound without a certificate "
                                   f"segment (first: {ids[none[0]]})"))
    over = np.flatnonzero(pack.lower_bound > alpha * (1.0 + TOLERANCE))
    check(over.size == 0, lambda: (f"{name}/lower_bound: {over.size} blocks' bounds exceed their alpha (first: "
                                   f"{ids[over[0]]})"))

    if certificate is not None and certificate.method == bound_labels.SCALE_ALLOCATION:
        # g_S: the certificate's weights over each segment's queries (over their targets), times
        # the segment's row variance, summed over the block's segments
        per_segment = certificate.weights_over(pack.segment_query, clique_cells, per_target=True) * high
        certificate.alphas.extend(alpha.tolist())
        certificate.sums.extend(np.bincount(owner, per_segment, minlength=len(pack)).tolist())

    profiles = []
    if domain.size <= EXACT_DOMAIN_LIMIT:
        profiles = [(tuple(int(i) for i in own[b] if i >= 0), forms["profiles"][which[b]] / scale[b])
                    for b in range(len(pack))]
    proved = {ids[0]: float(bound[0]) if pack.certificate[0] >= 0 else None} if len(plan.block_ids) == 1 else {}
    flat = all(is_flat(profile, TOLERANCE) for profile in forms["profiles"])
    return PackResult(float(alpha.sum()), profiles, proved, flat)
