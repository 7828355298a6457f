"""``distfit audit``: recompute every claim a stored plan states, from its arrays and its spec.

The auditor trusts nothing the planner computed. It recomputes, by its own code path (an
eigendecomposition of sigma where the planner used Cholesky factors and the dual's geometric
mean), from the stored arrays (``sigma``, ``basis``, ``recon``, ``query_index``, ``targets``)
and the stored spec (:func:`distfit.spec.parse.parse_spec` of the ``spec`` attr), and fails
naming the claim when a stored one differs by more than a relative :data:`TOLERANCE`:

* **checksum**: the stored checksum against the store (:func:`distfit.stores.plan.verify_checksum`:
  for a plan of format version 2 it covers the arrays and every attr that states a claim;
  the report keeps the recomputed one, so a caller that acts on the audited plan, e.g.
  :func:`distfit.release.job.run_release`, can check cheaply that the plan it reads is the one
  audited). A version-1 plan (written before issue 12: its checksum covers the arrays only)
  passes with a warning: every claim below is still recomputed, but what cannot be (below) is
  covered by nothing.
* **spec**: the stored spec parses, its hash is ``planner.spec_hash``, its schema is the plan's
  ``schema``, and ``queries/targets`` are its targets.
* **blocks**: ``attributes`` name schema attributes in schema order whose marginal has the
  block's cells; sigma is symmetric positive definite; the stored ``profile``
  (``b_i^T Sigma^-1 b_i``), ``variances`` (``diag(L Sigma L^T)``) and ``alpha`` (the profile's
  max); the target shares (``targets``): each in (0, its query's target], and a query's shares
  add up to at least its target (round 0 gives every block the whole target, later rounds and
  the joint block dual split it).
* **queries**: ``queries/variances`` is the sum of the block rows; every query has a row;
  ``planner.variance_scale`` is the largest variance/target ``k`` (recomputed); accuracy first
  (no budget in the spec): ``k <= 1``, every target met; under a budget: alpha is at most the
  budget's alpha.
* **privacy account**: ``alpha_exact`` is :func:`distfit.plan.composition.alpha_is_exact`: a
  domain of at most :data:`distfit.plan.composition.EXACT_DOMAIN_LIMIT` cells, or (a claim the
  audit accepts above that limit, never requires) every block's recomputed profile flat to
  :data:`TOLERANCE` (closed-form blocks), when the summed profile is flat and its maximum is the
  sum of the block alphas; ``alpha`` is the cell-by-cell maximum of the summed block profiles
  on a small domain, else the sum of the block alphas;
  ``planner.alpha_sum_bound`` is that sum; ``rho = alpha / 2``; ``account`` (alpha, rho, the
  exact (epsilon, delta) table and the RDP curve) is :func:`distfit.mathematics.privacy.privacy_account`
  of alpha, row by row.
* **lower bounds**, evaluated at their stored certificates, never searched for (a lower bound is
  a proof only given the dual point that reaches it; re-maximising the dual from another start
  stalled short of stored bounds): every block stores the weights of the dual point that proves
  its ``lower_bound`` (``cell_weights`` u, ``query_weights`` v; :mod:`distfit.stores.plan`).
  Each must be a distribution (finite, >= 0, adding up to 1 within :data:`WEIGHT_TOLERANCE`),
  and ``lower_bound`` must equal, to a relative :data:`BOUND_TOLERANCE` (1e-9),
  ``|| diag(sqrt(v / t)) recon basis diag(sqrt(u)) ||_*^2``
  (:func:`distfit.mathematics.bounds.certified_bound`, one k x k SVD per block) at the block's target
  shares scaled to its recomputed variances, ``t = targets * max(variances / targets)``
  (:func:`block_bound_targets`: what the solver certified, scaled as the block was by the
  allocation and any budget; the two agree to about 1e-12). A block with NaN weights (one the
  joint block dual re-optimised: no certificate of its own) may claim no bound.
  ``planner.global_lower_bound``, stated only for a one-block plan, is that block's certified
  bound. ``planner.chosen_blocks_lower_bound`` by its method: the scale allocation's is
  re-solved (:func:`distfit.plan.allocate.allocate_scales` over the stored blocks, to a relative
  :data:`ALLOCATION_TOLERANCE`, tighter than the planner's, so the stored value must lie below
  it) when the program is small (at most :data:`ALLOCATION_AUDIT_WORK` flops per Newton step,
  ``sum_S m_b + blocks^3``; on Adult's 470 blocks it took 7.6 s), else a warning; the joint
  block dual's certificate is not stored, and maximising that dual again would be a search,
  so it gets a warning ("not re-certified"). A plan written before the certificates were kept
  (no ``cell_weights``/``query_weights``) passes with a warning that its block bounds (and a
  global bound riding on one) are not re-certified; a version-1 plan's
  ``allocation_lower_bound``, which does not say what it bounds, is never audited (a warning).

Not recomputed (covered by the version-2 checksum only, so a plan that passes vouches for them
only as the planner's record): the solver statistics and gaps of each block, the planner's
decisions and rounds, ``composition`` (the audit always composes the blocks sequentially, the
worst case), and the provenance the checksum leaves out (``created``, versions, seconds). The
audit vouches for the privacy claim, the variances and the certified bounds of the stored plan,
not for how it was found.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from distfit.mathematics.domain import Domain
from distfit.mathematics.packing import PackedBlocks, QueryRuns, block_cells, residual_basis
from distfit.plan.allocate import allocate_scales
from distfit.plan.composition import EXACT_DOMAIN_LIMIT, alpha_is_exact, stitched_profile
from distfit.plan.planner import JOINT_BLOCK_DUAL, SCALE_ALLOCATION
from distfit.mathematics.privacy import privacy_account
from distfit.mathematics.bounds import certified_bound
from distfit.spec.model import PipelineSpec
from distfit.spec.parse import parse_spec
from distfit.stores.plan import BlockRecord, Plan, checksum_covers_attrs, read_plan, verify_checksum
from distfit.runtime.threads import blas_limit

TOLERANCE = 1e-8
BOUND_TOLERANCE = 1e-9  # a block's lower_bound equals the bound its stored certificate proves, to this (relative)
WEIGHT_TOLERANCE = 1e-9  # a certificate's weights add up to 1 within this
ALLOCATION_TOLERANCE = 1e-9  # relative gap to which the audit solves the allocation program
ALLOCATION_AUDIT_WORK = 1e7  # the allocation program is re-solved up to this many flops per Newton step
ROW_SLAB = 1 << 22  # a pack's implied rows are expanded this many at a time (memory: a few arrays of this length)


@dataclass(frozen=True)
class AuditReport:
    """What the audit checked and what failed; ``ok`` is True when nothing failed.

    ``warnings`` name what the audit could not vouch for without failing the plan: a
    version-1 checksum that does not cover the attrs, bounds it did not re-certify."""

    path: str
    checks: int
    failures: tuple[str, ...]
    alpha: float
    checksum: str  # what the plan hashes to (== its stored checksum when ``ok``)
    warnings: tuple[str, ...] = field(default=())

    @property
    def ok(self) -> bool:
        return not self.failures


class _Checks:
    """Counts checks and collects failures (each names the claim) and warnings."""

    def __init__(self) -> None:
        self.count = 0
        self.failures: list[str] = []
        self.warnings: list[str] = []

    def __call__(self, condition: bool, message: str | Callable[[], str]) -> bool:
        self.count += 1
        if not condition:
            self.failures.append(message() if callable(message) else message)
        return bool(condition)


def _profile_by_eigendecomposition(sigma: np.ndarray, basis: np.ndarray) -> np.ndarray:
    eigenvalues, eigenvectors = np.linalg.eigh(sigma)
    if eigenvalues.min() <= 0:
        raise np.linalg.LinAlgError(f"sigma is not positive definite (smallest eigenvalue {eigenvalues.min():.3g})")
    projected = (eigenvectors.T @ basis) / np.sqrt(eigenvalues)[:, None]
    return np.einsum("ij,ij->j", projected, projected)


def _row_variances(recon: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """``diag(L Sigma L^T)`` through one matrix product (BLAS; a three-operand einsum is not)."""
    return np.einsum("ij,ij->i", recon @ sigma, recon)


def _close(stored, recomputed) -> bool:
    try:
        stored = np.asarray(stored, dtype=float)
    except (TypeError, ValueError):
        return False
    recomputed = np.asarray(recomputed, dtype=float)
    return stored.shape == recomputed.shape and bool(np.allclose(stored, recomputed, rtol=TOLERANCE, atol=0.0))


def _differing_queries(stored: QueryRuns, recomputed: np.ndarray) -> np.ndarray:
    """The queries whose ``recomputed`` value is not close to the ``stored`` one (as ``_close``:
    ``np.isclose(stored, recomputed)``, relative :data:`TOLERANCE`), a stored vector read as runs
    (:class:`distfit.mathematics.packing.QueryRuns`) so it is never expanded. The recomputed values close to
    a run's value form an interval (``|s - r| <= TOLERANCE |r|`` for r of one sign), so a run's
    least and greatest recomputed values decide it; only failing runs are compared query by query."""
    starts = stored.offsets[:-1]
    if not starts.size:
        return np.zeros(0, dtype=np.int64)
    low, high = np.minimum.reduceat(recomputed, starts), np.maximum.reduceat(recomputed, starts)
    bad = np.flatnonzero(~(np.isclose(stored.values, low, rtol=TOLERANCE, atol=0.0)
                           & np.isclose(stored.values, high, rtol=TOLERANCE, atol=0.0)))
    lengths = stored.lengths[bad]
    queries = np.arange(int(lengths.sum())) + np.repeat(starts[bad] - (np.cumsum(lengths) - lengths), lengths)
    wrong = ~np.isclose(np.repeat(stored.values[bad], lengths), recomputed[queries], rtol=TOLERANCE, atol=0.0)
    return queries[wrong]


def _at_most(value: float, bound: float, tolerance: float = TOLERANCE) -> bool:
    """``value <= bound`` up to the relative ``tolerance``."""
    return bool(value <= bound * (1.0 + tolerance))


def _is_flat(profile: np.ndarray) -> bool:
    """A profile constant over its cells to the relative :data:`TOLERANCE`."""
    return bool(np.ptp(profile) <= TOLERANCE * np.max(profile)) if profile.size else True


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


# --------------------------------------------------------------------------------------------
# lower bounds: evaluated at their stored certificates


def block_bound_targets(variances: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The variances a block's lower bound speaks about: its target shares scaled to its
    variances, ``t = targets * max(variances / targets)``.

    A solve certifies its bound at the shares it was solved for, and its plan meets them up to
    ``1 + 1e-12`` (``solve._scaled_to_targets``); every later scaling by s (allocation scale,
    budget factor: :mod:`distfit.mathematics.scaling`) multiplies the variances by s and divides the bound
    by s, leaving the weights. So the bound at t equals the stored one to about 1e-12."""
    return float(np.max(variances / targets)) * targets


def _is_distribution(weights: np.ndarray) -> str:
    """Why ``weights`` is not a distribution (empty when it is): finite, >= 0, summing to 1."""
    if not np.all(np.isfinite(weights)):
        return f"{int((~np.isfinite(weights)).sum())} entries are not finite"
    if np.any(weights < 0):
        return f"{int((weights < 0).sum())} entries are negative (first: {weights[weights < 0][0]!r})"
    if abs(float(weights.sum()) - 1.0) > WEIGHT_TOLERANCE:
        return f"they add up to {float(weights.sum())!r}, not 1"
    return ""


def _check_block_bound(check: _Checks, block: BlockRecord, variances: np.ndarray) -> float | None:
    """Check a block's ``lower_bound`` against its stored certificate (module docstring);
    returns the bound the certificate proves, None when it proves none (no certificate of its
    own, NaN weights: then the block may claim none) or the weights are not a distribution."""
    name = f"blocks/{block.block_id}"
    weights = {"cell_weights": block.cell_weights, "query_weights": block.query_weights}
    if all(np.isnan(w).all() for w in weights.values()):
        check(not block.lower_bound > 0,
              f"{name}/lower_bound: stored {block.lower_bound!r}, but the block has no certificate of its own "
              "(its cell_weights and query_weights are NaN)")
        return None
    valid = True
    for array, w in weights.items():
        problem = _is_distribution(w)
        valid &= check(not problem, f"{name}/{array}: not a distribution of weights ({problem})")
    if not valid or not np.all(block.targets > 0):  # bad target shares are failed above
        return None
    t = block_bound_targets(variances, block.targets)
    bound = certified_bound(block.basis, block.recon / np.sqrt(t)[:, None], block.cell_weights, block.query_weights)
    check(abs(block.lower_bound - bound) <= BOUND_TOLERANCE * bound,
          f"{name}/lower_bound: stored {block.lower_bound!r}, but its certificate (cell_weights, query_weights) "
          f"proves {bound!r} on the block's problem")
    return bound


def _check_global_bound(check: _Checks, plan: Plan, value: Any, proved: dict[str, float | None],
                        unkept: set[str], uncertified: list[str]) -> None:
    """``planner.global_lower_bound``: stated only for a one-block plan, and then its block's
    certified bound (that block's shares are the queries' targets)."""
    name = "planner.global_lower_bound"
    if not check(len(plan.block_ids) == 1 and isinstance(value, (int, float)) and not isinstance(value, bool),
                 f"{name}: {value!r} is stated for a plan of {len(plan.block_ids)} blocks; a global bound is "
                 "certified only for a one-block plan (its block's dual certificate)"):
        return
    block_id = plan.block_ids[0]
    if block_id in unkept:  # a plan written before certificates were kept
        if block_id not in uncertified:  # else the warning about its blocks names this bound too
            check.warnings.append(f"{name}: not re-certified: the plan's one block stores no certificate (a plan "
                                  "written before blocks kept them); it is the planner's claim")
        return
    bound = proved.get(block_id)
    if check(bound is not None, f"{name}: stored {value!r}, but the plan's one block proves no bound (no valid "
                                "certificate)"):
        check(abs(float(value) - bound) <= BOUND_TOLERANCE * bound,
              f"{name}: stored {value!r}, but the certificate of the plan's one block proves {bound!r}")


def _check_chosen_blocks_bound(check: _Checks, bound: Any, targets: np.ndarray, scale: float,
                               shapes: list[tuple[float, np.ndarray, np.ndarray]]) -> None:
    """``planner.chosen_blocks_lower_bound``: re-solved when it is the scale allocation's and its
    program is small; otherwise named in a warning (module docstring)."""
    name = "planner.chosen_blocks_lower_bound"
    if not isinstance(bound, dict) or not isinstance(bound.get("value"), (int, float)) or isinstance(bound.get("value"), bool):
        check(False, f"{name}: expected {{value, method, bounds}}, got {bound!r}")
        return
    value, method = float(bound["value"]), bound.get("method")
    if method not in (SCALE_ALLOCATION, JOINT_BLOCK_DUAL):
        check(False, f"{name}: unknown method {method!r} (expected {SCALE_ALLOCATION!r} or {JOINT_BLOCK_DUAL!r})")
        return
    work = sum(q.size for _, q, _ in shapes) + float(len(shapes)) ** 3
    if method == JOINT_BLOCK_DUAL or work > ALLOCATION_AUDIT_WORK:
        why = ("its certificate (the joint dual's weights) is not stored, and maximising that dual again is a "
               "search, not a check" if method == JOINT_BLOCK_DUAL else
               f"the allocation program of {len(shapes)} blocks is over the audit's limit ({work:.3g} > "
               f"{ALLOCATION_AUDIT_WORK:.3g} flops per Newton step)")
        check.warnings.append(f"{name}: not re-certified ({why}); it is the planner's claim")
        return
    # The program over the stored block shapes (its optimum does not depend on how the shapes
    # were scaled), for the targets the plan meets: k * c. Deterministic, and solved tighter
    # than the planner did (1e-6), so the planner's certified value lies below this one's.
    allocation = allocate_scales([a for a, _, _ in shapes], [(qi, v) for _, qi, v in shapes], scale * targets,
                                 tolerance=ALLOCATION_TOLERANCE)
    check(_at_most(value, allocation.lower_bound, TOLERANCE),
          f"{name}: stored {value!r}, but the {method} reaches only {allocation.lower_bound!r} (the bound is not "
          "certified)")


# --------------------------------------------------------------------------------------------
# packs: the same checks, vectorised over blocks and segments


@dataclass
class _Sums:
    """Per-query sums over every block row: variances, target shares, whether answered."""

    variances: np.ndarray
    shares: np.ndarray
    answered: np.ndarray


@dataclass
class _PackResult:
    alpha_sum: float
    profiles: list  # (attributes, profile) per block, when the domain is small enough for exact alpha
    shapes: list  # (alpha, query_index, variances) per block, the allocation program's (placeholders if big)
    proved: dict  # block id -> certified bound (a one-block plan only)
    flat: bool  # every block's recomputed profile is flat (to TOLERANCE)


def _signature_forms(signatures: np.ndarray) -> dict[str, np.ndarray]:
    """Per attribute-size signature (rows of sizes, 0-padded): from the materialised basis B
    and G = B B^T (sigma / scale), by eigendecomposition (:func:`_profile_by_eigendecomposition`)
    and the pseudo-inverse R = B^+ = B^T G^-1 (the rows ``kappa R[x|S]`` a segment implies): the profile at
    scale 1 (``profiles``) and its largest value, the smallest and largest row variance ``diag(R G R^T)`` at kappa 1, and the
    certificate's bound at unit kappa and target (u, v uniform), ``certified_bound(B, R)``."""
    out: dict = {key: np.empty(len(signatures)) for key in ("profile", "variance_min", "variance_max", "bound")}
    out["profiles"] = []
    for i, row in enumerate(signatures):
        basis = residual_basis(tuple(int(n) for n in row if n > 0))
        gram = basis @ basis.T
        profile = _profile_by_eigendecomposition(gram, basis)
        recon = np.linalg.solve(gram, basis).T  # B^+ = B^T (B B^T)^-1: B has full row rank
        row_variances = _row_variances(recon, gram)
        d = basis.shape[1]
        out["profile"][i] = profile.max()
        out["profiles"].append(profile)
        out["variance_min"][i], out["variance_max"][i] = row_variances.min(), row_variances.max()
        out["bound"][i] = certified_bound(basis, recon, np.full(d, 1.0 / d), np.full(d, 1.0 / d))
    return out


def _audit_pack(check: _Checks, plan: Plan, p: int, pack: PackedBlocks, domain: Domain, targets: np.ndarray,
                sums: _Sums, small: bool) -> _PackResult | None:
    """Every claim of a pack's blocks (module docstring), recomputed by numpy over all its blocks
    and segments at once: per attribute-size signature one eigendecomposition and one SVD
    (:func:`_signature_forms`), then per block and per segment only scalars, and the implied rows
    expanded :data:`ROW_SLAB` at a time into the per-query sums. None when the pack cannot be
    audited further (a failure was recorded)."""
    name = f"packs/{plan.pack_ids[p]}"
    ids = plan.packed_block_ids(p)
    sizes = np.asarray(domain.sizes, dtype=np.int64)
    m = targets.size
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
        forms = _signature_forms(signatures)
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

    # The implied rows, a slab of segments at a time in order of their first query (so a slab's
    # queries span a narrow range and its sums are accumulated there, not over all m queries):
    # per-query sums and each segment's smallest query target.
    share = pack.segment_target
    smallest_target = np.empty(pack.segments)
    by_query = np.argsort(pack.segment_query, kind="stable")
    ends = np.cumsum(clique_cells[by_query])
    start = 0
    while start < pack.segments:
        stop = max(start + 1, int(np.searchsorted(ends, (ends[start - 1] if start else 0) + ROW_SLAB, side="right")))
        segments = by_query[start:min(stop, pack.segments)]
        rows = clique_cells[segments]
        first_row = np.cumsum(rows) - rows
        query = np.repeat(pack.segment_query[segments] - first_row, rows) + np.arange(int(rows.sum()))
        low_query = int(query.min())
        local = query - low_query
        span = slice(low_query, int(query.max()) + 1)
        sums.variances[span] += np.bincount(local, np.repeat(high[segments], rows))
        sums.shares[span] += np.bincount(local, np.repeat(share[segments], rows))
        sums.answered[query] = True
        smallest_target[segments] = np.minimum.reduceat(targets[query], first_row)
        start = stop
    bad = np.flatnonzero(~((share > 0) & (share <= smallest_target * (1.0 + TOLERANCE))))
    check(bad.size == 0, lambda: (f"{name}/segment_target: {bad.size} segments' target shares are not in (0, their "
                                  f"queries' target] (first: segment {bad[0]} of {ids[owner[bad[0]]]}: share "
                                  f"{float(share[bad[0]])!r}, target {float(smallest_target[bad[0]])!r})"))

    # Lower bounds at their certificates: u uniform on the cells, v uniform on the certificate
    # segment's rows, at t = shares * max(variance / share) over the block (block_bound_targets).
    ratio = np.maximum.reduceat(high / share, pack.segment_offsets[:-1]) if pack.segments else np.zeros(0)
    has = np.flatnonzero(pack.certificate >= 0)
    cert = pack.certificate[has]
    bound = np.zeros(len(pack))
    bound[has] = kappa[cert] ** 2 / (share[cert] * ratio[has]) * forms["bound"][which[has]]
    off = has[np.abs(pack.lower_bound[has] - bound[has]) > BOUND_TOLERANCE * bound[has]]
    check(off.size == 0, lambda: (f"{name}/lower_bound: {off.size} blocks' bounds are not what their certificates "
                                  f"prove (first: {ids[off[0]]}: stored {float(pack.lower_bound[off[0]])!r}, its certificate "
                                  f"proves {float(bound[off[0]])!r})"))
    over = np.flatnonzero(pack.lower_bound > alpha * (1.0 + TOLERANCE))
    check(over.size == 0, lambda: (f"{name}/lower_bound: {over.size} blocks' bounds exceed their alpha (first: "
                                   f"{ids[over[0]]})"))

    names = domain.names
    exact = domain.size <= EXACT_DOMAIN_LIMIT
    profiles, shapes = [], []
    if exact or small:
        for b in range(len(pack)):
            attributes = tuple(names[i] for i in own[b] if i >= 0)
            if exact:
                profiles.append((attributes, forms["profiles"][which[b]] / scale[b]))
            if small:
                segments = slice(pack.segment_offsets[b], pack.segment_offsets[b + 1])
                rows = clique_cells[segments]
                query = np.concatenate([q + np.arange(r) for q, r in zip(pack.segment_query[segments], rows)])
                shapes.append((float(alpha[b]), query, np.repeat(high[segments], rows)))
    else:
        none, no_variance = np.zeros(0, np.int64), np.zeros(0)  # over the limit (a warning): shared placeholders
        shapes = [(a, none, no_variance) for a in alpha.tolist()]
    proved = {ids[0]: float(bound[0]) if pack.certificate[0] >= 0 else None} if len(plan.block_ids) == 1 else {}
    flat = all(_is_flat(profile) for profile in forms["profiles"])
    return _PackResult(float(alpha.sum()), profiles, shapes, proved, flat)


# --------------------------------------------------------------------------------------------
# the audit


def _stored_spec(check: _Checks, attrs: dict) -> PipelineSpec | None:
    """The stored spec, validated; None (a failure) when it does not parse."""
    try:
        spec = parse_spec(attrs.get("spec"))
    except (ValueError, TypeError) as error:  # SpecError is a ValueError
        check(False, f"spec: the stored spec is not a valid spec ({error})")
        return None
    if not check(not spec.multilevel, "spec: the stored spec has levels; a plan holds one level's spec"):
        return None
    check(spec.domain.schema() == attrs.get("schema"),
          lambda: f"schema: stored {attrs.get('schema')!r}, but the spec's is {spec.domain.schema()!r}")
    planner = attrs.get("planner") or {}
    if "spec_hash" in planner:
        check(planner["spec_hash"] == spec.spec_hash,
              f"planner.spec_hash: stored {planner['spec_hash']!r}, but the stored spec hashes to {spec.spec_hash!r}")
    return spec


def _check_account(check: _Checks, stored: Any, alpha: float) -> None:
    """``account`` against :func:`distfit.mathematics.privacy.privacy_account` of the recomputed alpha, row by row."""
    expected = privacy_account(alpha).to_dict()
    if not check(isinstance(stored, dict), f"account: expected the privacy account, got {stored!r}"):
        return
    for key in ("alpha", "rho"):
        check(_close(stored.get(key), expected[key]),
              f"account.{key}: stored {stored.get(key)!r}, but alpha {alpha!r} gives {expected[key]!r}")
    for key, x in (("epsilon_delta", "delta"), ("rdp", "order")):
        rows = stored.get(key)
        want = expected[key]
        if not check(isinstance(rows, list) and len(rows) == len(want)
                     and all(isinstance(r, dict) and _close(r.get(x), w[x]) for r, w in zip(rows, want)),
                     f"account.{key}: expected rows at {x} {[w[x] for w in want]}, got {rows!r}"):
            continue
        wrong = [(r, w) for r, w in zip(rows, want) if not _close(r.get("epsilon"), w["epsilon"])]
        check(not wrong, lambda: (
            f"account.{key}: {len(wrong)} epsilons differ from alpha {alpha!r}'s (first: at {x} {wrong[0][1][x]:g} "
            f"stored {wrong[0][0].get('epsilon')!r}, recomputed {wrong[0][1]['epsilon']!r})"))


def audit_plan(path: str) -> AuditReport:
    """Audit the plan store at ``path`` (module docstring). Raises StoreError if it is unreadable."""
    plan = read_plan(path)
    with blas_limit():  # small dense factorisations: threads only slow them down (distfit.runtime.threads)
        return _audit(plan, str(path))


def _audit(plan: Plan, path: str) -> AuditReport:
    check = _Checks()
    attrs = plan.attrs
    planner = attrs.get("planner") if isinstance(attrs.get("planner"), dict) else {}

    ok, stored_sum, recomputed_sum = verify_checksum(path)
    covered = checksum_covers_attrs(attrs)
    check(ok, f"checksum: stored {stored_sum}, but the {'arrays and claims' if covered else 'arrays'} hash to "
              f"{recomputed_sum}")
    if not covered:
        check.warnings.append(
            f"checksum: a plan of format version {attrs.get('format_version')!r}: its checksum covers the arrays, "
            "not the attrs; every claim the audit recomputes was checked, the rest (solver statistics, the "
            "planner's decisions and allocation_lower_bound) is covered by nothing")

    spec = _stored_spec(check, attrs)
    try:
        domain = spec.domain if spec is not None else Domain.from_schema(attrs["schema"])
    except (KeyError, TypeError, ValueError) as error:
        check(False, f"schema: not a schema ({error})")
        return AuditReport(path, check.count, tuple(check.failures), float("nan"), recomputed_sum,
                           tuple(check.warnings))
    stored_targets = plan.target_runs
    targets = None
    if spec is not None:
        spec_targets = spec.targets
        if check(stored_targets.size == spec_targets.size,
                 f"queries/targets: {stored_targets.size} targets, but the stored spec has {spec_targets.size} queries"):
            differ = _differing_queries(stored_targets, spec_targets)
            check(not differ.size, lambda: (
                f"queries/targets: {differ.size} differ from the stored spec's targets (first: query "
                f"{int(differ[0])}: stored {float(stored_targets[differ[:1]][0])!r}, "
                f"spec {float(spec_targets[differ[0]])!r})"))
            targets = spec_targets  # what the claims below are about: the spec's targets
    if targets is None:
        targets = stored_targets.expand()
    m = targets.size

    variances = np.zeros(m)
    answered = np.zeros(m, dtype=bool)
    shares = np.zeros(m)
    block_profiles = []
    shapes = []  # (alpha, query_index, variances) per block: the allocation program's input
    proved: dict[str, float | None] = {}  # block id -> the bound its certificate proves
    unkept: set[str] = set()  # blocks without certificate arrays (a plan written before they were kept)
    uncertified: list[str] = []  # those of them that claim a bound
    alpha_sum = 0.0
    profiles_complete = True
    flat = True  # every block's recomputed profile is flat: alpha_is_exact at any domain size
    for block_id in plan.explicit_block_ids:
        block = plan.block(block_id)
        name = f"blocks/{block.block_id}"
        attributes = list(block.attributes)
        ordered = [a for a in domain.names if a in attributes]
        cells = math.prod(domain.size_of(a) for a in ordered)
        if not check(ordered == attributes and block.basis.shape[1] == cells, (
                f"{name}: attributes {attributes} are not schema attributes in schema order with "
                f"{block.basis.shape[1]} cells (schema: {list(domain.names)})")):
            profiles_complete = False
        if not check(block.query_index.size == 0 or int(block.query_index.max()) < m,
                     f"{name}/query_index: refers to query {int(block.query_index.max()) if block.query_index.size else 0}, "
                     f"but there are {m} queries"):
            profiles_complete = False
            continue
        check(_close(block.sigma, block.sigma.T), f"{name}/sigma: not symmetric")
        try:
            profile = _profile_by_eigendecomposition(block.sigma, block.basis)
        except np.linalg.LinAlgError as error:
            check(False, f"{name}/sigma: {error}")
            profiles_complete = False
            continue
        block_variances = _row_variances(block.recon, block.sigma)
        block_alpha = float(profile.max())
        check(_close(block.profile, profile), f"{name}/profile: stored values differ from b_i^T Sigma^-1 b_i")
        check(_close(block.variances, block_variances), f"{name}/variances: stored values differ from diag(L Sigma L^T)")
        check(_close(block.alpha, block_alpha), f"{name}: alpha {block.alpha} but the profile's max is {block_alpha}")
        query_targets = targets[block.query_index]
        bad = ~((block.targets > 0) & (block.targets <= query_targets * (1.0 + TOLERANCE)))
        check(not bad.any(), lambda: (
            f"{name}/targets: {int(bad.sum())} target shares are not in (0, their query's target] (first: query "
            f"{int(block.query_index[_first(bad)])}: share {block.targets[_first(bad)]!r}, target "
            f"{query_targets[_first(bad)]!r})"))
        if block.lower_bound > 0:
            check(_at_most(block.lower_bound, block_alpha),
                  f"{name}/lower_bound: {block.lower_bound!r} exceeds the block's alpha {block_alpha!r}")
        if block.cell_weights is None:
            unkept.add(block.block_id)
            if block.lower_bound > 0:
                uncertified.append(block.block_id)
        else:
            proved[block.block_id] = _check_block_bound(check, block, block_variances)
        np.add.at(variances, block.query_index, block_variances)
        np.add.at(shares, block.query_index, block.targets)
        answered[block.query_index] = True
        block_profiles.append((tuple(attributes), profile))
        flat = flat and _is_flat(profile)
        shapes.append((block_alpha, block.query_index, block_variances))
        alpha_sum += block_alpha

    sums = _Sums(variances, shares, answered)
    small = float(len(plan.block_ids)) ** 3 <= ALLOCATION_AUDIT_WORK  # else the allocation is not re-solved
    for p, pack in enumerate(plan.packs()):
        result = _audit_pack(check, plan, p, pack, domain, targets, sums, small)
        if result is None:
            profiles_complete = False
            continue
        flat = flat and result.flat
        alpha_sum += result.alpha_sum
        block_profiles.extend(result.profiles)
        shapes.extend(result.shapes)
        proved.update(result.proved)

    stored_variances = plan.variance_runs
    check(stored_variances.size == m and not _differing_queries(stored_variances, variances).size,
          "queries/variances: differ from the sum of the block rows")
    check(answered.all(), lambda: f"queries: {int((~answered).sum())} queries have no row in any block (first: "
                                  f"query {_first(~answered)})")
    short = answered & (shares < targets * (1.0 - TOLERANCE))
    check(not short.any(), lambda: (
        f"blocks/*/targets: the target shares of {int(short.sum())} queries add up to less than their target (first: "
        f"query {_first(short)}: {shares[_first(short)]!r} < {targets[_first(short)]!r})"))

    # The variance scale k: the largest variance/target, what every variance is promised within.
    scale = float(np.max(variances / targets)) if m else 1.0
    if "variance_scale" in planner:
        check(_close(planner["variance_scale"], scale),
              f"planner.variance_scale: stored {planner['variance_scale']!r}, but the largest variance/target is {scale!r}")
    budget = spec.privacy.budget if spec is not None else None
    promised = float(planner.get("variance_scale", 1.0)) if budget is not None or spec is None else 1.0
    over = np.flatnonzero(variances > promised * targets * (1.0 + TOLERANCE))
    check(over.size == 0, f"queries/variances: {over.size} queries exceed {promised:g} x their targets "
                          f"(first: query {over[:1].tolist()})")

    # Small domains are exact (evaluated cell by cell); above the limit alpha_exact may be
    # claimed only when every profile is flat (the planner claims it for closed-form-only plans;
    # a flat plan labelled a bound understates nothing).
    exact = domain.size <= EXACT_DOMAIN_LIMIT
    stored_exact = attrs.get("alpha_exact")
    allowed = (stored_exact is exact or (stored_exact is True and alpha_is_exact(domain.size, flat and profiles_complete)))
    check(allowed, f"alpha_exact: stored {stored_exact!r}, but a domain of {domain.size} cells gives {exact} "
                   f"(exact up to {EXACT_DOMAIN_LIMIT} cells, or above with every block profile flat: "
                   f"{flat and profiles_complete})")
    alpha = float(stitched_profile(domain, block_profiles).max()) if exact and profiles_complete else alpha_sum
    check(_close(attrs.get("alpha"), alpha), f"alpha: stored {attrs.get('alpha')!r}, but the blocks give {alpha!r}")
    check(_close(attrs.get("rho"), alpha / 2.0), f"rho: stored {attrs.get('rho')!r}, but alpha / 2 = {alpha / 2.0!r}")
    if "alpha_sum_bound" in planner:
        check(_close(planner["alpha_sum_bound"], alpha_sum),
              f"planner.alpha_sum_bound: stored {planner['alpha_sum_bound']!r}, but the block alphas add up to {alpha_sum!r}")
    _check_account(check, attrs.get("account"), alpha)
    if budget is not None:
        allowed = budget.to_alpha()
        check(_at_most(alpha, allowed), f"alpha: {alpha!r} exceeds the spec's budget (alpha {allowed!r})")

    # Lower bounds (module docstring): evaluated at their certificates, or named in a warning.
    global_bound = (planner.get("global_lower_bound") or {}).get("value") if isinstance(
        planner.get("global_lower_bound"), dict) else None
    if global_bound is not None:
        _check_global_bound(check, plan, global_bound, proved, unkept, uncertified)
    if uncertified:
        check.warnings.append(
            f"lower bounds: {len(uncertified)} of {len(plan.block_ids)} block bounds not re-certified (first: "
            f"{uncertified[0]}): the plan was written before blocks kept their dual certificates (cell_weights, "
            "query_weights); they are the planner's claims"
            + ("; so is planner.global_lower_bound" if global_bound is not None else ""))
    if "chosen_blocks_lower_bound" in planner and shapes and np.isfinite(scale) and scale > 0:
        _check_chosen_blocks_bound(check, planner["chosen_blocks_lower_bound"], targets, scale, shapes)
    if "allocation_lower_bound" in planner:
        check.warnings.append("planner.allocation_lower_bound: not audited (a version-1 plan's name for the bound "
                              "on plans with the chosen blocks only; it does not say how it was certified)")
    return AuditReport(path, check.count, tuple(check.failures), alpha, recomputed_sum, tuple(check.warnings))
