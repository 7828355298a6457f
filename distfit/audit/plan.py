"""``distfit audit``: recompute every claim a stored plan states, from its arrays and its spec.

The auditor trusts nothing the planner computed, and runs none of the planner's code: it imports
neither ``distfit.plan``, ``distfit.solver``, ``distfit.mathematics.privacy`` nor
``distfit.mathematics.scaling``. Everything it compares a claim with is computed here and in the
audit's own modules, from the formulas of docs/privacy.md, by other numerical routes than the
planner's: the profile by an eigendecomposition of sigma (the planner: Cholesky factors), the
stitched profile by mixed-radix gathers (:mod:`distfit.audit.composition`; the planner:
broadcasting), the account by ``log_ndtr`` and bisection (:mod:`distfit.audit.privacy`; the
planner: ``erfcx`` and Brent's method), nuclear norms by SVDs (:mod:`distfit.audit.bounds`; the
planner: Householder QR). It reads the store (:mod:`distfit.stores.plan`), parses the stored spec
(:mod:`distfit.spec`) and takes the layout of packed blocks from
:mod:`distfit.mathematics.packing`. Every claim is recomputed and compared (a relative
:data:`TOLERANCE`, bounds :data:`BOUND_TOLERANCE`), or is a label or a record checked against
the closed lists of :mod:`distfit.audit.labels`; a failure names the claim. There are no
warnings: a claim the audit cannot re-certify fails, saying so and how to get a plan that can
be (docs/audit.md, "What the audit trusts").

* **checksum**: the stored checksum against the store (:func:`distfit.stores.plan.verify_checksum`
  of the plan as read: its store opened and its root attrs parsed once, the hashed claims
  shared with the key check;
  the report keeps the recomputed one, so a caller that acts on the audited plan, e.g.
  :func:`distfit.release.job.run_release`, can check cheaply that the plan it reads is the one
  audited). A plan of format version 1 (before issue 12: its checksum covers the arrays only,
  its blocks keep no certificates) fails: its claims cannot be re-certified; re-plan it.
* **keys and labels**: the root attrs, ``planner``, ``account``, both bounds, every block's and
  pack's attrs (:func:`distfit.stores.plan.plan_claims`: every attr the plan states) hold only
  the keys of :mod:`distfit.audit.labels`; ``composition`` is the audit's composition
  (:data:`distfit.audit.labels.COMPOSITION`), each bound's ``bounds`` and ``method`` texts are
  the ones its method and the plan's blocks give; each block's ``solver`` record is one the
  planner writes (closed-form, or the solve's counts and a known stage) and its ``gap`` is
  ``alpha / lower_bound - 1``; a closed-form block's sigma is a multiple of ``B B^T``. The
  planner's ``decisions`` (its log, a list of text), ``rounds`` (a count) and provenance
  (``created``, versions, seconds) say how the plan was found, not what it is: checked for their
  type only, and covered by the checksum.
* **spec**: the stored spec parses, its hash is ``planner.spec_hash``, its schema is the plan's
  ``schema``, and ``queries/targets`` are its targets.
* **blocks**: ``attributes`` name schema attributes in schema order whose marginal has the
  block's cells; sigma is symmetric positive definite; the stored ``profile``
  (``b_i^T Sigma^-1 b_i``), ``variances`` (``diag(L Sigma L^T)``) and ``alpha`` (the profile's
  max); the target shares (``targets``): each in (0, its query's target], and a query's shares
  add up to at least its target.
* **queries**: ``queries/variances`` is the sum of the block rows; every query has a row;
  ``planner.variance_scale`` is the largest variance/target ``k`` (recomputed); accuracy first
  (no budget in the spec): ``k <= 1``, every target met; under a budget: alpha is at most the
  budget's alpha (:func:`distfit.audit.privacy.budget_alpha` for an (epsilon, delta) budget).
* **privacy account**: ``alpha_exact`` is true exactly when the domain has at most
  :data:`distfit.audit.composition.EXACT_DOMAIN_LIMIT` cells, or (a claim the audit accepts above
  that limit, never requires) every block's recomputed profile is flat to :data:`TOLERANCE`;
  ``alpha`` is the cell-by-cell maximum of the summed block profiles on a small domain, else the
  sum of the block alphas; ``planner.alpha_sum_bound`` is that sum; ``rho = alpha / 2``;
  ``account`` (alpha, rho, the exact (epsilon, delta) table at its closed list of deltas and the
  RDP curve at its closed list of orders) is :func:`distfit.audit.privacy.account` of alpha;
  each to :data:`TOLERANCE` widened to the largest block's ``inverse_tolerance`` (alpha is
  recomputed from profiles through sigma's inverse; docs/audit.md).
* **lower bounds**, evaluated at their stored certificates, never searched for
  (:mod:`distfit.audit.bounds`): every block's ``lower_bound`` at its ``cell_weights`` u and
  ``query_weights`` v (each a distribution), which must prove it to a relative
  :data:`BOUND_TOLERANCE` at the block's target shares scaled to its variances, widened by what
  the plan's stored and the audit's recomputed variances differ by (an ill-conditioned sigma's)
  (:func:`distfit.audit.checks.bound_tolerance`: nothing on the shipped plans); a block with NaN
  weights (the joint block dual's: no certificate of its own) claims no bound. A block bound
  without stored weights (a plan written before blocks kept them) fails: it cannot be
  re-certified. ``planner.global_lower_bound`` is its block's certified bound on a one-block
  plan, else null. ``planner.chosen_blocks_lower_bound`` must store its ``certificate``: the
  scale allocation's dual point (constraint ``queries`` and their ``weights`` omega), at which
  ``(sum_S sqrt(alpha_S g_S))^2`` with ``g_S = sum_j omega_j v_jS / (k c_j)`` is evaluated over
  every block (packed ones by their segments), or the joint block dual's (also each block's
  ``cell_weights``), at which ``(sum_S sqrt(|v_S|) N_S)^2`` is, at the targets times the
  variance scale; the stored value must equal it to :data:`BOUND_TOLERANCE`, widened alike. Without a
  certificate (a plan written before they were kept) the bound fails, as does a joint block dual
  bound on a plan with packed blocks (its certificate covers the solved blocks only).

The audit vouches for the privacy claim, the variances and the certified bounds of the stored
plan, not for how it was found.
"""
from __future__ import annotations

import math
from typing import Any, TextIO

import numpy as np

from distfit.audit import labels
from distfit.mathematics import bounds as bound_labels
from distfit.audit.bounds import block_bound, not_a_distribution
from distfit.audit.checks import (
    AuditReport,
    BOUND_TOLERANCE,
    REPLAN,
    TOLERANCE,
    Checks,
    at_most,
    bound_tolerance,
    close,
    closed_keys,
    first_true,
    inverse_tolerance,
    label,
    profile_by_eigendecomposition,
    row_variances,
    variance_disagreement,
)
from distfit.audit.chosen import check_chosen_bound, read_certificate
from distfit.audit.composition import EXACT_DOMAIN_LIMIT, is_flat, stitched_maximum
from distfit.audit.packs import audit_pack
from distfit.audit.query_steps import QueryRows, merged_steps, spec_target_runs
from distfit.audit.privacy import account, budget_alpha
from distfit.mathematics.domain import Domain
from distfit.spec.model import PipelineSpec, collector_paused
from distfit.spec.parse import parse_spec
from distfit.stores.plan import BlockRecord, Plan, read_plan, verify_checksum
from distfit.runtime.progress import LONG_STAGE_SECONDS, Progress
from distfit.runtime.threads import blas_limit


# --------------------------------------------------------------------------------------------
# lower bounds of blocks: evaluated at their stored certificates


def _check_block_bound(check: Checks, block: BlockRecord, variances: np.ndarray,
                       tolerance: float, uncertified: list[str]) -> float | None:
    """Check a block's ``lower_bound`` against its stored certificate (module docstring);
    returns the bound the certificate proves, None when it proves none (no certificate of its
    own, NaN weights: then the block may claim none) or the weights are not a distribution.
    A bound stated without stored weights goes to ``uncertified`` (failed once for them all:
    :func:`_check_uncertified`)."""
    name = f"blocks/{block.block_id}"
    if block.cell_weights is None:
        if block.lower_bound > 0:
            uncertified.append(block.block_id)
        return None
    weights = {"cell_weights": block.cell_weights, "query_weights": block.query_weights}
    if all(np.isnan(w).all() for w in weights.values()):
        check(not block.lower_bound > 0,
              f"{name}/lower_bound: stored {block.lower_bound!r}, but the block has no certificate of its own "
              "(its cell_weights and query_weights are NaN)")
        return None
    valid = True
    for array, w in weights.items():
        problem = not_a_distribution(w)
        valid &= check(not problem, f"{name}/{array}: not a distribution of weights ({problem})")
    if not valid or not np.all(block.targets > 0):  # bad target shares are failed elsewhere
        return None
    bound = block_bound(block.basis, block.recon, variances, block.targets, block.cell_weights, block.query_weights)
    check(abs(block.lower_bound - bound) <= tolerance * bound,
          f"{name}/lower_bound: stored {block.lower_bound!r}, but its certificate (cell_weights, query_weights) "
          f"proves {bound!r} on the block's problem")
    return bound


def _check_uncertified(check: Checks, uncertified: list[str]) -> None:
    """One failure for every block bound stated without a certificate (a plan written before
    blocks kept them: every block alike), naming the first and how many."""
    more = len(uncertified) - 1
    others = f" and {more} other block{'s' if more > 1 else ''}" if more else ""
    check(not uncertified, lambda: (
        f"blocks/{uncertified[0]}/lower_bound: cannot be re-certified: the plan stores no certificate (cell_weights, "
        f"query_weights) for it{others} (a plan written before blocks kept them); {REPLAN}"))


def _check_solver(check: Checks, name: str, block: BlockRecord, alpha: float) -> None:
    """A solved block's ``solver`` record (:func:`distfit.audit.labels.solver_problem`), its gap
    recomputed as ``alpha / lower_bound - 1`` (to :data:`BOUND_TOLERANCE`: the solve's ratio,
    which every scaling leaves); a closed-form block's sigma a multiple of ``B B^T``."""
    solver = block.solver
    problem = labels.solver_problem(solver)
    if not check(not problem, f"{name}/solver: {problem}"):
        return
    if solver == labels.CLOSED_FORM_SOLVER:
        gram = block.basis @ block.basis.T
        factor = float(np.trace(block.sigma) / np.trace(gram))
        check(close(block.sigma, factor * gram), f"{name}/solver: closed form stated, but sigma is not a multiple "
                                                  "of B B^T")
        return
    joint = solver["stage"] == labels.JOINT_STAGE
    weightless = block.cell_weights is not None and np.isnan(block.cell_weights).all()
    check(joint == weightless, f"{name}/solver.stage: {solver['stage']!r}, but the block "
                               f"{'has no' if weightless else 'has a'} certificate of its own")
    if not joint and block.lower_bound > 0:  # the ratio of two numbers scaled alike: exact to rounding
        check(close(1.0 + solver["gap"], alpha / block.lower_bound, BOUND_TOLERANCE),
              f"{name}/solver.gap: stored {solver['gap']!r}, but alpha / lower_bound - 1 = "
              f"{alpha / block.lower_bound - 1.0!r}")
    elif not joint:
        check(False, f"{name}/solver.gap: stored {solver['gap']!r}, but the block proves no lower bound")


def _check_global_bound(check: Checks, plan: Plan, bound: Any, proved: dict[str, float | None],
                        tolerance: float) -> None:
    """``planner.global_lower_bound``: its keys, its ``method`` and ``bounds`` texts as the plan
    gives them, and its value: the one block's certified bound on a one-block plan whose block
    (explicit or packed) proves one of its own, else null; to ``tolerance`` (the one block's
    :func:`distfit.audit.checks.bound_tolerance`)."""
    name = "planner.global_lower_bound"
    if not closed_keys(check, name, bound, labels.GLOBAL_BOUND_KEYS):
        return
    blocks = len(plan.block_ids)
    certified = blocks == 1 and proved.get(plan.block_ids[0]) is not None
    label(check, f"{name}.method", bound.get("method"), labels.global_bound_method(blocks, certified))
    label(check, f"{name}.bounds", bound.get("bounds"), bound_labels.GLOBAL_BOUNDS)
    value = bound.get("value")
    if not certified:
        check(value is None, f"{name}: {value!r} is stated, but no certificate proves a bound on every plan "
                             f"({labels.global_bound_method(blocks, certified)})")
        return
    expected = proved[plan.block_ids[0]]
    check(labels.is_number(value) and abs(float(value) - expected) <= tolerance * expected,
          f"{name}: stored {value!r}, but the plan's one block's certificate proves {expected!r}")


# --------------------------------------------------------------------------------------------
# the stored spec, the account and the keys


def _stored_spec(check: Checks, attrs: dict, planner: dict) -> PipelineSpec | None:
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
    if "spec_hash" in planner:
        check(planner["spec_hash"] == spec.spec_hash,
              f"planner.spec_hash: stored {planner['spec_hash']!r}, but the stored spec hashes to {spec.spec_hash!r}")
    return spec


def _budget_alpha(budget: Any) -> float:
    """The alpha a spec's budget allows, by the audit's own code: ``2 rho``, ``alpha``, or the
    exact (epsilon, delta) calibration (:func:`distfit.audit.privacy.budget_alpha`)."""
    if budget.rho is not None:
        return 2.0 * float(budget.rho)
    if budget.alpha is not None:
        return float(budget.alpha)
    return budget_alpha(float(budget.epsilon), float(budget.delta))


def _check_account(check: Checks, stored: Any, alpha: float, tolerance: float = TOLERANCE) -> None:
    """``account``: its closed keys and rows, each value :func:`distfit.audit.privacy.account` of the recomputed alpha
    (to ``tolerance``, relative: how closely that alpha is known; an epsilon moves with alpha at
    most in proportion: ``rho``, ``order * rho``, ``rho + 2 sqrt(rho log(1/delta))`` and the exact
    Gaussian's epsilon all have ``d log epsilon / d log alpha <= 1``)."""
    expected = account(alpha)
    if not closed_keys(check, "account", stored, labels.ACCOUNT_KEYS):
        return
    for key, value in (("alpha", expected.alpha), ("rho", expected.rho)):
        check(close(stored.get(key), value, tolerance),
              f"account.{key}: stored {stored.get(key)!r}, but alpha {alpha!r} gives {value!r}")
    for key, x, want in (("epsilon_delta", "delta", expected.epsilon_delta), ("rdp", "order", expected.rdp)):
        rows = stored.get(key)
        points = [w[0] for w in want]
        if not check(isinstance(rows, list) and len(rows) == len(want)
                     and all(isinstance(r, dict) and set(r) == {x, "epsilon"} and close(r[x], w[0])
                             for r, w in zip(rows, want)),
                     f"account.{key}: expected the rows {{{x}, epsilon}} at {x} {points}, got {rows!r}"):
            continue
        wrong = [(r, w) for r, w in zip(rows, want) if not close(r["epsilon"], w[1], tolerance)]
        check(not wrong, lambda: (
            f"account.{key}: {len(wrong)} epsilons differ from alpha {alpha!r}'s (first: at {x} {wrong[0][1][0]:g} "
            f"stored {wrong[0][0]['epsilon']!r}, recomputed {wrong[0][1][1]!r})"))


def _check_keys(check: Checks, plan: Plan, planner: dict) -> None:
    """Every attr the plan states has a known key (:mod:`distfit.audit.labels`); the records the
    audit does not recompute have their type; ``composition`` is the audit's."""
    attrs = plan.attrs
    check(not labels.unknown(attrs, labels.ROOT_KEYS),
          lambda: f"attrs: unknown keys {labels.unknown(attrs, labels.ROOT_KEYS)} (a plan states only "
                  f"{sorted(labels.ROOT_KEYS)})")
    label(check, "composition", attrs.get("composition"), labels.COMPOSITION)
    for key in ("created", "distfit_version"):
        check(isinstance(attrs.get(key), str), f"{key}: expected text, got {attrs.get(key)!r}")
    if closed_keys(check, "planner", attrs.get("planner"), labels.PLANNER_KEYS):
        decisions = planner.get("decisions", [])
        check(isinstance(decisions, list) and all(isinstance(d, str) for d in decisions),
              lambda: f"planner.decisions: expected a list of text (the planner's log), got {decisions!r}")
        rounds = planner.get("rounds", 1)
        check(isinstance(rounds, int) and not isinstance(rounds, bool) and rounds >= 1,
              f"planner.rounds: expected a count >= 1, got {rounds!r}")
        check(labels.is_number(planner.get("seconds", 0.0)) and planner.get("seconds", 0.0) >= 0,
              f"planner.seconds: expected a number >= 0, got {planner.get('seconds')!r}")
        check(isinstance(planner.get("distfit_version", ""), str),
              f"planner.distfit_version: expected text, got {planner.get('distfit_version')!r}")
    for node, stated in plan.claims.items():  # the claims the checksum hashed: read once
        known = (labels.PACK_ATTR_KEYS if node.startswith("packs/") else
                 labels.SOLVED_PACK_KEYS if node == "solved" else labels.BLOCK_ATTR_KEYS if node else None)
        if known is not None:
            check(not labels.unknown(stated, known), lambda: (
                f"{node}: unknown attrs {labels.unknown(stated, known)} (it states only {sorted(known)})"))


# --------------------------------------------------------------------------------------------
# the audit


def audit_plan(path: str, *, log: TextIO | None = None) -> AuditReport:
    """Audit the plan store at ``path`` (module docstring). Raises StoreError if it is unreadable.
    ``log``: where the progress line over the plan's blocks goes (None: no progress line; Adult's
    470 blocks take 3-6 CPU-s)."""
    # The collector paused (distfit.spec.model.collector_paused): a plan's root attrs and its
    # parsed spec are millions of objects without cycles, which every collection walked again
    # (1.7 of 11 CPU-s at 166,751 blocks).
    with collector_paused():
        plan = read_plan(path)
        with blas_limit():  # small dense factorisations: threads only slow them down (distfit.runtime.threads)
            return _audit(plan, str(path),
                          Progress("audit", log, after=LONG_STAGE_SECONDS) if log is not None else None)


def _audit(plan: Plan, path: str, shown: Progress | None = None) -> AuditReport:
    check = Checks()
    attrs = plan.attrs
    planner = attrs.get("planner") if isinstance(attrs.get("planner"), dict) else {}

    ok, stored_sum, recomputed_sum = verify_checksum(plan)  # the plan as read: its store opened once
    version = attrs.get("format_version")
    check(ok, f"checksum: stored {stored_sum}, but the store hashes to {recomputed_sum}")
    check(version in labels.FORMAT_VERSIONS and not isinstance(version, bool),
          f"format_version: {version!r}: cannot be re-certified (a plan of format version 1 has a checksum that "
          f"covers its arrays, not its claims, and blocks without certificates); {REPLAN}")
    _check_keys(check, plan, planner)

    spec = _stored_spec(check, attrs, planner)
    try:
        domain = spec.domain if spec is not None else Domain.from_schema(attrs["schema"])
    except (KeyError, TypeError, ValueError) as error:
        check(False, f"schema: not a schema ({error})")
        return AuditReport(path, check.count, tuple(check.failures), "alpha", float("nan"), recomputed_sum)
    stored_targets = plan.target_runs
    targets = None  # every query's target, as runs (never a vector of the queries: audit.query_steps)
    if spec is not None:
        spec_targets = spec_target_runs(spec)
        if check(stored_targets.size == spec_targets.size,
                 f"queries/targets: {stored_targets.size} targets, but the stored spec has {spec_targets.size} queries"):
            target_steps = merged_steps(stored_targets, spec_targets)
            stored_on, spec_on = target_steps.of_runs(stored_targets), target_steps.of_runs(spec_targets)
            differ = ~np.isclose(stored_on, spec_on, rtol=TOLERANCE, atol=0.0)
            check(not differ.any(), lambda: (
                f"queries/targets: {target_steps.queries(differ)} differ from the stored spec's targets (first: query "
                f"{target_steps.first_query(differ)}: stored {float(stored_on[differ][0])!r}, "
                f"spec {float(spec_on[differ][0])!r})"))
            targets = spec_targets  # what the claims below are about: the spec's targets
    if targets is None:
        targets = stored_targets
    m = targets.size
    if not check(np.all(targets.values > 0), "queries/targets: every target must be > 0"):
        return AuditReport(path, check.count, tuple(check.failures), "alpha", float("nan"), recomputed_sum)

    chosen = planner.get("chosen_blocks_lower_bound")
    certificate = read_certificate(check, chosen, targets, plan.explicit_block_ids) if chosen is not None else None
    position = {name: i for i, name in enumerate(domain.names)}
    rows = QueryRows(m)  # every block row's query, variance and share (audit.query_steps)
    block_profiles = []  # (positions, profile) per block, for the stitched profile of a small domain
    proved: dict[str, float | None] = {}  # block id -> the bound its certificate proves
    uncertified: list[str] = []  # blocks stating a bound without a stored certificate
    disagreement = 0.0  # the largest relative difference of stored and recomputed variances (or eps * cond), over blocks
    through_inverses = TOLERANCE  # the largest block's inverse_tolerance: how closely alpha, a max or sum of profiles, recomputes
    alpha_sum = 0.0
    profiles_complete = True
    flat = True  # every block's recomputed profile is flat: alpha is exact at any domain size
    block_ids = plan.explicit_block_ids
    for done, block_id in enumerate(block_ids):
        if shown is not None and done:
            shown(done, len(block_ids))
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
        check(close(block.sigma, block.sigma.T), f"{name}/sigma: not symmetric")
        try:
            profile = profile_by_eigendecomposition(block.sigma, block.basis)
        except np.linalg.LinAlgError as error:
            check(False, f"{name}/sigma: {error}")
            profiles_complete = False
            continue
        block_variances = row_variances(block.recon, block.sigma)
        block_alpha = float(profile.max())
        through_inverse = inverse_tolerance(block.sigma)
        through_inverses = max(through_inverses, through_inverse)
        check(close(block.profile, profile, through_inverse),
              f"{name}/profile: stored values differ from b_i^T Sigma^-1 b_i")
        check(close(block.variances, block_variances), f"{name}/variances: stored values differ from diag(L Sigma L^T)")
        check(close(block.alpha, block_alpha, through_inverse), f"{name}: alpha {block.alpha} but the profile's max is {block_alpha}")
        query_targets = targets[block.query_index]
        bad = ~((block.targets > 0) & (block.targets <= query_targets * (1.0 + TOLERANCE)))
        check(not bad.any(), lambda: (
            f"{name}/targets: {int(bad.sum())} target shares are not in (0, their query's target] (first: query "
            f"{int(block.query_index[first_true(bad)])}: share {block.targets[first_true(bad)]!r}, target "
            f"{query_targets[first_true(bad)]!r})"))
        if block.lower_bound > 0:
            check(at_most(block.lower_bound, block_alpha),
                  f"{name}/lower_bound: {block.lower_bound!r} exceeds the block's alpha {block_alpha!r}")
        # a bound is evaluated at the variance scale, which the planner reached through sigma's
        # inverse: it cannot be pinned closer than the variances agree, nor than a solve with
        # sigma (eps * cond(sigma), nothing on a well-conditioned sigma)
        block_disagreement = max(variance_disagreement(block.variances, block_variances), through_inverse - TOLERANCE)
        disagreement = max(disagreement, block_disagreement)
        proved[block.block_id] = _check_block_bound(check, block, block_variances,
                                                    bound_tolerance(block_disagreement), uncertified)
        _check_solver(check, name, block, block.alpha)  # the stored alpha, checked above
        if certificate is not None and not certificate.add_block(block, targets, block_alpha, block_variances):
            check(False, f"planner.chosen_blocks_lower_bound.certificate.cell_weights.{block.block_id}: not the "
                         f"weights of the block's {block.basis.shape[1]} cells")
            certificate = None
        rows.add_block(block.query_index, block_variances, block.targets)
        block_profiles.append((tuple(position[a] for a in attributes if a in position), profile))
        flat = flat and is_flat(profile, TOLERANCE)
        alpha_sum += block_alpha
    if shown is not None and block_ids:
        shown(len(block_ids), len(block_ids))
    _check_uncertified(check, uncertified)

    for p, pack in enumerate(plan.packs()):
        result = audit_pack(check, plan, p, pack, domain, targets, rows, certificate)
        if result is None:
            profiles_complete = False
            continue
        flat = flat and result.flat
        alpha_sum += result.alpha_sum
        block_profiles.extend(result.profiles)
        proved.update(result.proved)

    stored_variances = plan.variance_runs
    sums = rows.steps(targets, *([stored_variances] if stored_variances.size == m else []))
    steps, variances, shares, answered = sums.steps, sums.variances, sums.shares, sums.answered
    step_targets = steps.of_runs(targets)
    check(stored_variances.size == m
          and np.isclose(steps.of_runs(stored_variances), variances, rtol=TOLERANCE, atol=0.0).all(),
          "queries/variances: differ from the sum of the block rows")
    check(answered.all(), lambda: f"queries: {steps.queries(~answered)} queries have no row in any block (first: "
                                  f"query {steps.first_query(~answered)})")
    short = answered & (shares < step_targets * (1.0 - TOLERANCE))
    check(not short.any(), lambda: (
        f"blocks/*/targets: the target shares of {steps.queries(short)} queries add up to less than their target "
        f"(first: query {steps.first_query(short)}: {shares[short][0]!r} < {step_targets[short][0]!r})"))

    # The variance scale k: the largest variance/target, what every variance is promised within.
    scale = float(np.max(variances / step_targets)) if m else 1.0
    if "variance_scale" in planner:
        check(close(planner["variance_scale"], scale),
              f"planner.variance_scale: stored {planner['variance_scale']!r}, but the largest variance/target is {scale!r}")
    budget = spec.privacy.budget if spec is not None else None
    promised = float(planner.get("variance_scale", 1.0)) if budget is not None or spec is None else 1.0
    over = variances > promised * step_targets * (1.0 + TOLERANCE)
    check(not over.any(), lambda: f"queries/variances: {steps.queries(over)} queries exceed {promised:g} x their "
                                  f"targets (first: query {[steps.first_query(over)]})")

    # Small domains are exact (evaluated cell by cell); above the limit alpha_exact may be
    # claimed only when every profile is flat (a flat plan labelled a bound understates nothing).
    exact = domain.size <= EXACT_DOMAIN_LIMIT
    stored_exact = attrs.get("alpha_exact")
    allowed = stored_exact is exact or (stored_exact is True and flat and profiles_complete)
    check(allowed, f"alpha_exact: stored {stored_exact!r}, but a domain of {domain.size} cells gives {exact} "
                   f"(exact up to {EXACT_DOMAIN_LIMIT} cells, or above with every block profile flat: "
                   f"{flat and profiles_complete})")
    alpha = stitched_maximum(domain.sizes, block_profiles) if exact and profiles_complete else alpha_sum
    # alpha is recomputed from the blocks' profiles, each through its sigma's inverse: it is
    # pinned as closely as the worst-conditioned block's profile (inverse_tolerance), and what
    # follows from it (rho, the sum bound, the account) as closely as alpha
    check(close(attrs.get("alpha"), alpha, through_inverses),
          f"alpha: stored {attrs.get('alpha')!r}, but the blocks give {alpha!r}")
    check(close(attrs.get("rho"), alpha / 2.0, through_inverses),
          f"rho: stored {attrs.get('rho')!r}, but alpha / 2 = {alpha / 2.0!r}")
    if "alpha_sum_bound" in planner:
        check(close(planner["alpha_sum_bound"], alpha_sum, through_inverses),
              f"planner.alpha_sum_bound: stored {planner['alpha_sum_bound']!r}, but the block alphas add up to {alpha_sum!r}")
    _check_account(check, attrs.get("account"), alpha, through_inverses)
    if budget is not None:
        allowed_alpha = _budget_alpha(budget)
        check(at_most(alpha, allowed_alpha), f"alpha: {alpha!r} exceeds the spec's budget (alpha {allowed_alpha!r})")

    # Lower bounds (module docstring): evaluated at their certificates.
    if "global_lower_bound" in planner:
        # on a one-block plan the largest disagreement over the blocks is its block's (0 when packed)
        _check_global_bound(check, plan, planner["global_lower_bound"], proved, bound_tolerance(disagreement))
    if chosen is not None and np.isfinite(scale) and scale > 0:
        check_chosen_bound(check, chosen, certificate, scale, bool(plan.pack_ids),
                           bound_tolerance(disagreement))
    return AuditReport(path, check.count, tuple(check.failures), "alpha", alpha, recomputed_sum)
