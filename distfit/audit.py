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
* **privacy account**: ``alpha_exact`` is the domain rule (at most
  :data:`distfit.plan.composition.EXACT_DOMAIN_LIMIT` cells); ``alpha`` is the cell-by-cell
  maximum of the summed block profiles when exact, else the sum of the block alphas;
  ``planner.alpha_sum_bound`` is that sum; ``rho = alpha / 2``; ``account`` (alpha, rho, the
  exact (epsilon, delta) table and the RDP curve) is :func:`distfit.privacy.privacy_account`
  of alpha, row by row.
* **lower bounds**, re-certified by running the dual again (a lower bound is a proof only if
  some dual point reaches it; the stored dual weights are not kept), to a relative
  :data:`BOUND_TOLERANCE` (a maximisation started elsewhere than the solver's stalls up to
  ~1e-7 short of it; :func:`certify_block_bound`): a block's ``lower_bound`` must be reached by
  :func:`distfit.solver.dual.maximize_dual` on the block's problem at its target shares scaled
  to its variances (``targets * max(variances / targets)``: what the solver certified, scaled
  as the block was); ``planner.global_lower_bound``, stated only for a one-block plan, likewise
  on that block (its shares are the targets); ``planner.chosen_blocks_lower_bound`` by its
  method: the scale allocation's program (:func:`distfit.plan.allocate.allocate_scales`, to a
  relative 1e-9) over the stored blocks, or the joint block dual
  (:func:`distfit.solver.dual.maximize_block_dual`: the planner's run replayed - its inputs,
  block order and evaluation cap - then, if short, a longer one). Block bounds are re-certified
  smallest block first while the estimated work (:data:`RECERTIFY_EVALUATIONS` evaluations of
  ``k^2 (k + d_b + m_b)`` flops) stays within :data:`RECERTIFY_WORK` (by that estimate Adult's
  470 blocks, 1.1e9 flops per evaluation of all of them, fit; not measured), the joint bound
  when one evaluation is within the planner's own limit;
  the audit warns about any bound it did not re-certify (and about a version-1 plan's
  ``allocation_lower_bound``, which does not say what it bounds: never re-certified).

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

from distfit.domain import Domain
from distfit.plan.allocate import allocate_scales
from distfit.plan.composition import EXACT_DOMAIN_LIMIT, stitched_profile
from distfit.plan.planner import (
    CO_OPTIMIZE_WORK, JOINT_BLOCK_DUAL, SCALE_ALLOCATION, block_work, decompose_lazily, joint_dual_evaluations,
)
from distfit.privacy import privacy_account
from distfit.solver.dual import maximize_block_dual, maximize_dual
from distfit.solver.linalg import dominant_rows
from distfit.spec.model import PipelineSpec
from distfit.spec.parse import parse_spec
from distfit.stores.plan import BlockRecord, Plan, checksum_covers_attrs, read_plan, verify_checksum
from distfit.threads import blas_limit

TOLERANCE = 1e-8
BOUND_TOLERANCE = 1e-6  # a stored lower bound passes within this of the audit's own certificate
RECERTIFY_WORK = 5e10  # estimated flops the audit spends re-certifying block lower bounds
RECERTIFY_EVALUATIONS = 30  # dual evaluations a block's re-certification is assumed to take (for the budget)
DUAL_ITERATIONS = 400  # L-BFGS iterations per maximisation (the solver's default)
WARM_SHARPNESS = 2e5  # soft-max sharpness of the warm start when the solver recorded none (SM-II's last)
ALLOCATION_TOLERANCE = 1e-9  # relative gap to which the audit solves the allocation program


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


def _close(stored, recomputed) -> bool:
    try:
        stored = np.asarray(stored, dtype=float)
    except (TypeError, ValueError):
        return False
    recomputed = np.asarray(recomputed, dtype=float)
    return stored.shape == recomputed.shape and bool(np.allclose(stored, recomputed, rtol=TOLERANCE, atol=0.0))


def _at_most(value: float, bound: float, tolerance: float = TOLERANCE) -> bool:
    """``value <= bound`` up to the relative ``tolerance``."""
    return bool(value <= bound * (1.0 + tolerance))


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


# --------------------------------------------------------------------------------------------
# re-certifying lower bounds


def certify_block_bound(block: BlockRecord, goal: float) -> float:
    """The largest dual bound the audit reaches (stopping once it reaches ``goal``) on the
    block's Problem 1 at its target shares scaled to its variances, ``t = s * targets`` with
    ``s = max(variances / targets)``: ``f(u, v) = ||diag(sqrt(v / t)) L B diag(sqrt(u))||_*^2``
    (:mod:`distfit.solver.dual`), a proven lower bound on the alpha of every covariance whose
    variances are at most ``t``.

    L-BFGS stalls short of the optimum on some blocks, at a point that depends on where it
    starts (and on rounding: BLAS threads), and the solver's bound may come from a warm start
    the store does not hold (SM-II's weights). So: a cold start (the solver's first stage); if
    short, a warm start from the soft-max weights of the stored plan, balanced (max profile =
    max ratio) at the sharpness the solver recorded (its SM-II weights are those of a nearby
    plan); then a restart from the best point so far. On the plans of the test suite the cold
    start alone fell up to 1.1e-7 (relative) short and the three together reached every stored
    bound; the audit accepts a bound within :data:`BOUND_TOLERANCE` of what it reaches."""
    ratios = block.variances / block.targets
    targets = float(ratios.max()) * block.targets
    scaled = block.recon / np.sqrt(targets)[:, None]
    rows = dominant_rows(scaled)
    constraints = scaled[rows]

    def maximize(cells=None, queries=None):
        return maximize_dual(block.basis, constraints, cells, queries, max_iterations=DUAL_ITERATIONS,
                             target_gap=TOLERANCE, known_alpha=goal)[0]

    best = maximize()
    if _at_most(goal, best.bound):
        return best.bound
    sharpness = float(block.solver.get("final_t") or 0.0) or WARM_SHARPNESS
    alpha = float(block.profile.max())
    warm = maximize(np.exp(sharpness * (block.profile / math.sqrt(alpha) - math.sqrt(alpha))),
                    np.exp(sharpness * math.sqrt(alpha) * (block.variances[rows] / targets[rows] - 1.0)))
    best = max(best, warm, key=lambda point: point.bound)
    if _at_most(goal, best.bound):
        return best.bound
    return max(best.bound, maximize(best.cell_weights, best.query_weights).bound)


def _recertify_blocks(check: _Checks, plan: Plan, claims: dict[str, float], work: dict[str, float],
                      global_bound: float | None) -> None:
    """Re-certify each claimed block bound (``claims``: block id -> stored lower bound), smallest
    block first (``work``: flops of one dual evaluation) while the estimated work fits
    :data:`RECERTIFY_WORK`; the global bound of a one-block plan rides on its block."""
    spent = 0.0
    skipped = []
    for block_id in sorted(claims, key=lambda b: (work[b], b)):
        cost = work[block_id] * RECERTIFY_EVALUATIONS
        if spent + cost > RECERTIFY_WORK:
            skipped.append(block_id)
            continue
        spent += cost
        block = plan.block(block_id)
        goal = claims[block_id]
        if global_bound is not None:
            goal = max(goal, global_bound)
        reached = certify_block_bound(block, goal)
        name = f"blocks/{block_id}/lower_bound"
        check(_at_most(block.lower_bound, reached, BOUND_TOLERANCE) or block.lower_bound <= 0,
              f"{name}: stored {block.lower_bound!r}, but the dual reaches only {reached!r} on the block's problem "
              "(the bound is not certified)")
        if global_bound is not None:
            check(_at_most(global_bound, reached, BOUND_TOLERANCE),
                  f"planner.global_lower_bound: stored {global_bound!r}, but the dual reaches only {reached!r} on the "
                  "plan's one block (the bound is not certified)")
    if skipped:
        check.warnings.append(
            f"lower bounds: {len(skipped)} of {len(claims)} block bounds not re-certified (over the audit's work budget "
            f"of {RECERTIFY_WORK:.3g} flops; first: {skipped[0]}); they are the planner's claims"
            + ("; so is planner.global_lower_bound" if global_bound is not None else ""))


def _recertify_chosen_blocks_bound(check: _Checks, plan: Plan, bound: Any, targets: np.ndarray, scale: float,
                                   shapes: list[tuple[float, np.ndarray, np.ndarray]], spec: PipelineSpec | None) -> None:
    """``planner.chosen_blocks_lower_bound``: re-certified by the method it names (module docstring)."""
    name = "planner.chosen_blocks_lower_bound"
    if not isinstance(bound, dict) or not isinstance(bound.get("value"), (int, float)) or isinstance(bound.get("value"), bool):
        check(False, f"{name}: expected {{value, method, bounds}}, got {bound!r}")
        return
    value, method = float(bound["value"]), bound.get("method")
    if method == SCALE_ALLOCATION:
        # The program over the stored block shapes (its optimum does not depend on how the
        # shapes were scaled), for the targets the plan meets: k * c.
        allocation = allocate_scales([a for a, _, _ in shapes], [(qi, v) for _, qi, v in shapes],
                                     scale * targets, tolerance=ALLOCATION_TOLERANCE)
        reached = allocation.lower_bound
    elif method == JOINT_BLOCK_DUAL:
        order = {block_id: i for i, block_id in enumerate(_planner_order(spec))}
        records = sorted(plan.iter_blocks(), key=lambda r: (order.get(r.block_id, len(order)), r.block_id))
        work = block_work(records)
        if work > CO_OPTIMIZE_WORK:
            check.warnings.append(f"{name}: not re-certified (the joint block dual's work, {work:.3g} flops per "
                                  f"evaluation, is over {CO_OPTIMIZE_WORK:.3g}); it is the planner's claim")
            return
        # The planner's run again: its inputs (the blocks in decomposition order, accuracy-first
        # targets c; the stored bound was then divided by the variance scale k) and evaluation
        # cap. Replays need not end where the planner's did (rounding, memory layout), so if
        # this one falls short, a longer run to a tight gap.
        bases = [r.basis for r in records]
        recons = [r.recon / np.sqrt(targets[r.query_index])[:, None] for r in records]
        indices = [r.query_index for r in records]
        cap = joint_dual_evaluations(work)
        reached = maximize_block_dual(bases, recons, indices, targets.size, max_evaluations=cap).lower_bound / scale
        if not _at_most(value, reached):
            longer = maximize_block_dual(bases, recons, indices, targets.size, target_gap=TOLERANCE,
                                         max_evaluations=4 * cap)
            reached = max(reached, longer.lower_bound / scale)
    else:
        check(False, f"{name}: unknown method {method!r} (expected {SCALE_ALLOCATION!r} or {JOINT_BLOCK_DUAL!r})")
        return
    check(_at_most(value, reached, BOUND_TOLERANCE),
          f"{name}: stored {value!r}, but the {method} reaches only {reached!r} (the bound is not certified)")


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


def _planner_order(spec: PipelineSpec | None) -> list[str]:
    """The block ids in the order the planner had them (its decomposition of the spec: attribute
    sets only, no arrays); empty without a spec."""
    if spec is None:
        return []
    max_cells = spec.blocks.max_cells if spec.blocks.merge else 0
    return [layout.block_id for layout in decompose_lazily(spec.domain, spec.group_triples(), max_cells).layouts]


def _check_account(check: _Checks, stored: Any, alpha: float) -> None:
    """``account`` against :func:`distfit.privacy.privacy_account` of the recomputed alpha, row by row."""
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
    with blas_limit():  # small dense factorisations: threads only slow them down (distfit.threads)
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
    targets = plan.queries_targets
    if spec is not None:
        spec_targets = spec.targets
        if check(targets.shape == spec_targets.shape,
                 f"queries/targets: {targets.size} targets, but the stored spec has {spec_targets.size} queries"):
            differ = ~np.isclose(targets, spec_targets, rtol=TOLERANCE, atol=0.0)
            check(not differ.any(), lambda: (
                f"queries/targets: {int(differ.sum())} differ from the stored spec's targets (first: query "
                f"{_first(differ)}: stored {targets[_first(differ)]!r}, spec {spec_targets[_first(differ)]!r})"))
            targets = spec_targets  # what the claims below are about: the spec's targets
    m = targets.size

    variances = np.zeros(m)
    answered = np.zeros(m, dtype=bool)
    shares = np.zeros(m)
    block_profiles = []
    shapes = []  # (alpha, query_index, variances) per block: the allocation program's input
    bound_claims: dict[str, float] = {}
    work: dict[str, float] = {}  # block id -> flops of one dual evaluation (planner.block_work)
    alpha_sum = 0.0
    profiles_complete = True
    for block in plan.iter_blocks():
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
        block_variances = np.einsum("ij,jk,ik->i", block.recon, block.sigma, block.recon)
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
        work[block.block_id] = block_work([block])
        if block.lower_bound > 0:
            if check(_at_most(block.lower_bound, block_alpha),
                     f"{name}/lower_bound: {block.lower_bound!r} exceeds the block's alpha {block_alpha!r}"):
                bound_claims[block.block_id] = block.lower_bound
        np.add.at(variances, block.query_index, block_variances)
        np.add.at(shares, block.query_index, block.targets)
        answered[block.query_index] = True
        block_profiles.append((tuple(attributes), profile))
        shapes.append((block_alpha, block.query_index, block_variances))
        alpha_sum += block_alpha

    check(_close(plan.queries_variances, variances), "queries/variances: differ from the sum of the block rows")
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

    exact = domain.size <= EXACT_DOMAIN_LIMIT
    check(attrs.get("alpha_exact") is exact,
          f"alpha_exact: stored {attrs.get('alpha_exact')!r}, but a domain of {domain.size} cells gives {exact} "
          f"(exact up to {EXACT_DOMAIN_LIMIT} cells)")
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

    # Lower bounds (module docstring): re-certified, or named in a warning.
    global_bound = (planner.get("global_lower_bound") or {}).get("value") if isinstance(
        planner.get("global_lower_bound"), dict) else None
    if global_bound is not None:
        if not check(len(plan.block_ids) == 1 and isinstance(global_bound, (int, float)),
                     f"planner.global_lower_bound: {global_bound!r} is stated for a plan of {len(plan.block_ids)} "
                     "blocks; a global bound is certified only for a one-block plan (its block's dual certificate)"):
            global_bound = None
        elif not bound_claims and plan.block_ids[0] in work:
            bound_claims[plan.block_ids[0]] = 0.0
    _recertify_blocks(check, plan, bound_claims, work, None if global_bound is None else float(global_bound))
    if "chosen_blocks_lower_bound" in planner and shapes and np.isfinite(scale) and scale > 0:
        _recertify_chosen_blocks_bound(check, plan, planner["chosen_blocks_lower_bound"], targets, scale, shapes, spec)
    if "allocation_lower_bound" in planner:
        check.warnings.append("planner.allocation_lower_bound: not audited (a version-1 plan's name for the bound "
                              "on plans with the chosen blocks only; it does not say how it was certified)")
    return AuditReport(path, check.count, tuple(check.failures), alpha, recomputed_sum, tuple(check.warnings))
