"""``distfit.solve``: one block's fitness-for-use plan with its privacy account and certificate.

Problem 1 (docs/design.md section 1, the paper's section 3): minimise the privacy cost
``alpha = max_i b_i^T Sigma^-1 b_i`` subject to ``diag(L Sigma L^T) <= c``. Problem 2: given a
budget alpha*, the smallest common variance scale k with variances ``<= k c``: solve Problem 1
and scale ``Sigma * (alpha / alpha*)``.

How a solve runs (each stage is in its own module):

1. ``basis.represent`` writes W = L B with B spanning W's row space (rank-deficient workloads
   are reduced; untouched cells get profile 0).
   Of rows along one direction only the longest is a constraint (``linalg.dominant_rows``:
   the same feasible set; a block holding the total has a row for every query of the
   workload, most of them along a few directions).
2. ``dual.maximize_dual`` maximises the dual bound with L-BFGS. Every dual evaluation
   recovers the plan ``Sigma_uv = G^-1 # A`` that minimises the Lagrangian, so this stage is
   both the warm start and the certificate; on most workloads it closes the gap by itself.
   The stage ends once its bound stalls (``DUAL_STALL_WINDOW``): on prefix workloads the bound
   converges in 30-100 evaluations while the recovered plan stays far above it for hundreds
   more, and SM-II finds the plan faster. A ``WarmStart`` (an earlier solve of the same block
   for other targets) starts the ascent from its weights (at most ``WARM_DUAL_ITERATIONS``
   iterations: the polishing stage certifies) and offers its plan to SM-II; should that path
   end above ``max_gap``, the block is solved again from the cold start.
3. If the certified gap is still above ``gap_tolerance``, ``smii.smii_optimize`` (the paper's
   soft-max Newton-CG with continuation in t) starts from the best recovered plan, and the
   dual is maximised again from SM-II's soft-max weights (they are the dual variables of the
   smoothed problem), tightening the bound, and restarted from its best weights
   (``DUAL_RESTARTS``) while the gap is still above ``max_gap``. A solve that certifies a gap
   below ``CERTIFYING_GAP`` runs SM-II's Newton directions in the span of its active cells
   and queries and stops the polishing ascent once its bound stalls.
4. The best plan is scaled by its largest variance ratio so that every target holds; its alpha
   and the best lower bound give the reported optimality gap.

The certificate is kept: ``BlockSolution.cell_weights`` (u, one per cell) and
``query_weights`` (v, one per query row; the rows ``dominant_rows`` left out get 0) are the
dual point of the largest bound found, and ``lower_bound`` is ``certified_bound`` at
them: for u >= 0, v >= 0 each summing to 1,
``alpha* >= || diag(sqrt(v / c)) L B diag(sqrt(u)) ||_*^2`` (nuclear norm; docs/design.md section
1) for every covariance whose variances are at most c (the solve's ``targets``). Anyone holding
(basis, recon, targets, u, v) re-evaluates the bound with one k x k SVD (``distfit audit``
does, on every block of a plan) instead of trusting, or searching for, it.

If the certified gap stays above ``max_gap`` the solve raises ``ConvergenceError`` saying how
far it got, rather than return a plan that may be far from optimal.

Memory: all matrices are dense. With d cells, m queries and rank k <= min(m, d), a solve holds
about ``8 * (2 m d + d^2 + 6 k d + 3 m k + 12 k^2)`` bytes (the SVD of W, B and Sigma^-1 B and
their temporaries, L, and the k x k covariance work arrays), i.e. it grows as O((m + d)^2).
A block over ``memory_limit_bytes`` (default: half the machine's memory) is refused with an
error that points to block decomposition (``distfit plan``, docs/design.md section 2).
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distfit.solver import dual, smii
from distfit.solver.basis import Representation, represent
from distfit.solver.convergence import ConvergenceError
from distfit.solver.linalg import dominant_rows
from distfit.mathematics.bounds import certified_bound
from distfit.mathematics.privacy import Budget, PrivacyAccount, privacy_account, privacy_profile
from distfit.mathematics.scaling import scaled_cost, scaled_noise
from distfit.runtime.threads import blas_limit
from distfit.mathematics.workload import aligned, validate_workload


SOLVE_METHODS = ("auto", "smii", "dual")
#: The first dual stage stops once its bound stalls for this many evaluations
#: (``dual.maximize_dual(stall_window=...)``); the plan is then SM-II's to find.
DUAL_STALL_WINDOW = 20
#: A warm-started solve's first dual stage runs at most this many L-BFGS iterations: its
#: start (the earlier solve's weights) is already near the new optimum's, SM-II starts from the
#: earlier plan anyway, and the polishing stage (from SM-II's weights) certifies the result.
#: Measured on Adult's second refinement round (86 blocks of k >= 100, one core): the first
#: dual stage 10.4 -> 5.7 CPU s, the same alphas; the whole plan: rounds 1 and 2 29 + 31 s ->
#: 25 + 30 s, alpha 1.2536 -> 1.2522.
WARM_DUAL_ITERATIONS = 5
#: Fresh starts of the dual ascent from its best weights while the gap is above ``max_gap``
#: after the polishing stage (the solve would otherwise fail): L-BFGS on this nonsmooth dual
#: (the nuclear norm, where singular values cross) can end on a failed line search short of the
#: gap, and a new start goes on from there.
DUAL_RESTARTS = 3
#: A solve that certifies a gap below this (a plan's kept blocks at ``plan.rounds.BLOCK_GAP``,
#: ``solve``'s default) runs SM-II's Newton directions in the span of the active columns with
#: deeper CG (``smii.newton_direction(span=True)``), and stops its polishing dual ascent once
#: the bound stalls (``DUAL_STALL_WINDOW``). Measured on marginals.yaml's 60 hardest kept blocks
#: (``benchmarks/bench_kept_round.py --full-space``: one process, alternating per block;
#: benchmarks/README.md "Session 26"): the full space takes 1.107x the CPU, the same sigmas from
#: the polish, block alphas' sum -7.9e-4 (of 33.488), the mean certified gap 2.04e-4 -> ~2.1e-4;
#: Adult's 36: 1.150x. Looser solves (a plan's shaping rounds, draft
#: plans) keep the full-space directions and the full polish: their plans only set the next
#: round's target shares and warm starts, and any change of their path moves every share (with
#: the span in every round, marginals.yaml's alpha moved from 120.66052 to 120.66107-120.66091).
CERTIFYING_GAP = 1e-3


@dataclass(frozen=True)
class SolverStats:
    """Where a solve spent its effort. ``stage`` names the stage that produced the plan."""

    dual_evaluations: int
    newton_iterations: int
    cg_iterations: int
    final_t: float
    seconds: float
    stage: str


@dataclass(frozen=True, eq=False)
class BlockSolution:
    """A block's plan: noise ``z ~ N(0, sigma)`` added to ``basis @ x``, answers ``recon @ (.)``.

    ``profile`` has one entry per cell (``b_i^T sigma^-1 b_i``), ``alpha = max(profile)``,
    ``variances = diag(recon sigma recon^T)`` (<= ``variance_scale * targets``),
    ``lower_bound`` a proven lower bound on the optimal alpha of Problem 1 and
    ``gap = alpha_problem1 / lower_bound - 1`` the certified relative optimality gap.
    With a budget, ``alpha`` is the budget's alpha and ``variance_scale`` = k >= 1 (or < 1 when
    the budget is generous); without one, ``variance_scale`` is 1.

    The certificate of ``lower_bound``: ``cell_weights`` u (d,) and ``query_weights`` v (m,),
    each on the simplex, with ``lower_bound = certified_bound(basis, recon / sqrt(targets),
    u, v)`` = ``|| diag(sqrt(v / targets)) recon basis diag(sqrt(u)) ||_*^2``: a bound on the
    alpha of every covariance whose variances are at most ``targets`` (Problem 1, whatever the
    budget). Scaling the plan by s (``distfit.mathematics.scaling``) divides the bound by s and multiplies
    the variances it speaks about by s; the weights stay. A block re-optimised by the planner's
    joint block dual has no certificate of its own: NaN weights and ``lower_bound`` 0.
    """

    sigma: np.ndarray
    basis: np.ndarray
    recon: np.ndarray
    targets: np.ndarray
    alpha: float
    profile: np.ndarray
    variances: np.ndarray
    lower_bound: float
    gap: float
    variance_scale: float
    basis_kind: str
    basis_reduced: bool
    stats: SolverStats
    cell_weights: np.ndarray
    query_weights: np.ndarray
    budget: Budget | None = field(default=None)

    @property
    def rho(self) -> float:
        """zCDP parameter ``rho = alpha / 2``."""
        return self.alpha / 2.0

    @property
    def iterations(self) -> int:
        """Newton iterations plus dual (L-BFGS) evaluations."""
        return self.stats.newton_iterations + self.stats.dual_evaluations

    @property
    def seconds(self) -> float:
        return self.stats.seconds

    @property
    def final_t(self) -> float:
        return self.stats.final_t

    def privacy_account(self, **kwargs: Any) -> PrivacyAccount:
        """rho, RDP and the exact (epsilon, delta) table of this plan (``privacy.privacy_account``)."""
        return privacy_account(self.alpha, **kwargs)


@dataclass(frozen=True, eq=False)
class WarmStart:
    """Where a solve of a block starts when the same block was solved before for other targets
    (the planner's refinement rounds: the same basis and query rows, new target shares).

    ``sigma`` is the earlier plan (any scale: SM-II balances it), ``cell_weights`` and
    ``query_weights`` its dual certificate (one weight per cell and per query row). The dual
    stage starts from those weights instead of uniform ones and SM-II from the cheaper of
    ``sigma`` and the dual's recovered plan at the new targets. A start changes the path, not
    the problem: the result is certified against the new targets as any cold solve is.

    ``representation``: the earlier solve's ``W = recon @ basis`` (its ``basis``, ``recon``,
    ``basis_kind``, ``basis_reduced``), which depends on the block's workload and basis only, not
    on the targets: a solve given it does not represent the block again (the SVD and least
    squares of ``solver.basis.represent``: 9% of a serial Adult plan's CPU when every round
    repeated it). The same arrays as a cold solve would compute, so the same plan bit for bit.
    None (the streamed plan's drafts keep no recon): represented again."""

    sigma: np.ndarray
    cell_weights: np.ndarray
    query_weights: np.ndarray
    representation: Representation | None = None

    @classmethod
    def of(cls, solution: BlockSolution) -> WarmStart | None:
        """The start a solution offers; ``None`` for a block without a certificate of its own
        (re-optimised by the joint block dual: NaN weights)."""
        u, v = np.asarray(solution.cell_weights, float), np.asarray(solution.query_weights, float)
        if not (np.all(np.isfinite(u)) and np.all(np.isfinite(v)) and u.sum() > 0 and v.sum() > 0):
            return None
        return cls(np.asarray(solution.sigma, float), u, v,
                   Representation(solution.basis, solution.recon, solution.basis_kind, solution.basis_reduced))

    def aligned(self) -> WarmStart:
        """The same start with every array aligned (``mathematics.workload.aligned``: a start
        unpickled on a worker may not be)."""
        given = self.representation
        return WarmStart(aligned(self.sigma), aligned(self.cell_weights), aligned(self.query_weights),
                         None if given is None else Representation(aligned(given.basis), aligned(given.recon),
                                                                   given.kind, given.reduced))


def default_memory_limit() -> int:
    """Half of the machine's physical memory, in bytes."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2)
    except (ValueError, OSError, AttributeError):
        return 8 << 30


def estimated_memory(num_queries: int, num_cells: int) -> int:
    """Bytes a dense solve of an m x d block needs (module docstring; rank taken as min(m, d))."""
    m, d = num_queries, num_cells
    k = min(m, d)
    return 8 * (2 * m * d + d * d + 6 * k * d + 3 * m * k + 12 * k * k)


def _scaled_to_targets(sigma: np.ndarray, scaled_recon: np.ndarray) -> np.ndarray:
    """Divide Sigma by its largest variance ratio (and 1e-12 more) so every target holds."""
    ratios = np.einsum("ij,ij->i", scaled_recon @ sigma, scaled_recon)
    return sigma / (ratios.max() * (1.0 + 1e-12))


def solve(
    W: Any,
    targets: Any,
    basis: str | np.ndarray = "auto",
    budget: Any = None,
    *,
    method: str = "auto",
    gap_tolerance: float = 1e-4,
    max_gap: float = 1e-3,
    dual_iterations: int = 400,
    time_limit: float = 600.0,
    memory_limit_bytes: int | None = None,
    warm_start: WarmStart | None = None,
) -> BlockSolution:
    """Solve Problem 1 (or Problem 2 with ``budget``) for workload ``W`` (m x d) and ``targets`` (m,).

    ``basis``: ``"auto"``, ``"identity"``, ``"prefix"`` or a (k, d) array (see ``distfit.solver.basis``;
    rank-deficient workloads are reduced to W's row space and cells no query touches contribute
    nothing to the profile). ``budget``: ``{"rho": r}``, ``{"alpha": a}``, ``(epsilon, delta)``
    or a ``privacy.Budget``. ``method``: ``"auto"`` runs SM-II only when the dual stage has not
    certified the gap, ``"smii"`` always polishes with SM-II (the plan is the better of the two),
    ``"dual"`` never runs it. The solve stops once the certified gap is <= ``gap_tolerance`` and
    raises ``ConvergenceError`` if it ends above ``max_gap``. ``warm_start``: an earlier
    solve of the same block (``WarmStart``; same basis and query rows, other targets). Stages
    and memory: module docstring.
    """
    start = time.perf_counter()
    workload, target_array = validate_workload(W, targets)
    # every array aligned, as validate_workload leaves W: the result is then a function of the
    # inputs' values, not of where a worker unpickled them (mathematics.workload.aligned)
    if isinstance(basis, np.ndarray):
        basis = aligned(basis)
    if warm_start is not None:
        warm_start = warm_start.aligned()
    parsed_budget = None if budget is None else Budget.parse(budget)
    if method not in SOLVE_METHODS:
        raise ValueError(f"method: unknown method {method!r}; use one of {', '.join(SOLVE_METHODS)}")
    for name, value in (("gap_tolerance", gap_tolerance), ("max_gap", max_gap)):
        if not (np.isfinite(value) and value > 0):
            raise ValueError(f"{name}: must be finite and > 0, got {value}")
    limit = default_memory_limit() if memory_limit_bytes is None else int(memory_limit_bytes)
    needed = estimated_memory(*workload.shape)
    if needed > limit:
        raise MemoryError(
            f"W: a {workload.shape[0]} x {workload.shape[1]} block needs about {needed / 2**30:.1f} GiB of dense "
            f"matrices, over the limit of {limit / 2**30:.1f} GiB; cut the workload into blocks "
            "(distfit plan, docs/design.md section 2) or raise memory_limit_bytes"
        )

    # OpenBLAS's threads make small factorisations far slower on shared 2-core machines (an SVD of
    # a 252 x 126 matrix: 3 s with 2 threads, 0.01 s with 1), and distfit parallelises over
    # blocks with processes instead; DISTFIT_BLAS_THREADS overrides.
    with blas_limit():
        representation = _given_representation(warm_start, workload.shape) or represent(workload, basis)
        try:
            return _solve_represented(
                representation, target_array, parsed_budget, method, gap_tolerance, max_gap, dual_iterations, time_limit,
                start, warm_start,
            )
        except ConvergenceError:
            if warm_start is None:
                raise
        # A start changes the path, not the problem: where a warm start's path ends above
        # max_gap (its capped first dual stage gave SM-II a weak bound to aim at), the block
        # is solved again from the cold start.
        return _solve_represented(
            representation, target_array, parsed_budget, method, gap_tolerance, max_gap, dual_iterations, time_limit, start,
        )


def _given_representation(warm_start: WarmStart | None, shape: tuple[int, int]) -> Representation | None:
    """The warm start's representation of the block (``WarmStart``), if it has one of a workload of this shape."""
    given = None if warm_start is None else warm_start.representation
    if given is None or given.recon.shape[0] != shape[0] or given.basis.shape[1] != shape[1]:
        return None
    return given


def _warm_weights(warm_start: WarmStart | None, rows: np.ndarray, num_cells: int, num_queries: int):
    """The warm start's dual weights on this solve's cells and constraint rows, or ``(None, None)``
    when there are none to use (no start, other sizes, or no weight left on the kept rows)."""
    if warm_start is None or warm_start.cell_weights.size != num_cells or warm_start.query_weights.size != num_queries:
        return None, None
    query_weights = warm_start.query_weights[rows]
    if not query_weights.sum() > 0:
        return None, None
    return warm_start.cell_weights, query_weights


def _solve_represented(
    representation, target_array, parsed_budget, method, gap_tolerance, max_gap, dual_iterations, time_limit, start,
    warm_start=None,
) -> BlockSolution:
    basis_matrix, recon = representation.basis, representation.recon
    scaled_recon = recon / np.sqrt(target_array)[:, None]
    # Only the constraints not implied by a longer parallel row (linalg.dominant_rows): the same
    # feasible set, often far fewer rows. The plan is scaled against every row at the end.
    rows = dominant_rows(scaled_recon)
    constraints = scaled_recon[rows]

    cell_start, query_start = _warm_weights(warm_start, rows, basis_matrix.shape[1], scaled_recon.shape[0])
    warm_alpha = np.inf
    if warm_start is not None and warm_start.sigma.shape == (basis_matrix.shape[0],) * 2:
        # the earlier plan rescaled to the new targets: if the bound reaches it, the solve is done
        try:
            warm_alpha = dual.plan_cost(basis_matrix, constraints, warm_start.sigma)
        except (np.linalg.LinAlgError, ValueError):
            warm_alpha = np.inf
        warm_alpha = warm_alpha if np.isfinite(warm_alpha) and warm_alpha > 0 else np.inf
    first_iterations = dual_iterations if cell_start is None else min(dual_iterations, WARM_DUAL_ITERATIONS)
    certificate, primal_point, evaluations = dual.maximize_dual(
        basis_matrix, constraints, cell_start, query_start, max_iterations=first_iterations, target_gap=gap_tolerance,
        known_alpha=warm_alpha, stall_window=DUAL_STALL_WINDOW,
    )
    lower_bound = certificate.bound
    best_sigma, best_alpha, stage = primal_point.sigma, primal_point.primal_alpha, "dual"
    if warm_alpha < best_alpha:
        best_sigma, best_alpha, stage = warm_start.sigma, warm_alpha, "warm start"
    newton = cg = 0
    final_t = 0.0
    run_smii = method == "smii" or (method == "auto" and best_alpha > lower_bound * (1.0 + gap_tolerance))
    certifying = gap_tolerance < CERTIFYING_GAP
    if run_smii:
        remaining = time_limit - (time.perf_counter() - start)
        run = smii.smii_optimize(
            basis_matrix,
            constraints,
            best_sigma,
            time_limit=max(remaining * 0.7, 1.0),
            target_cost=lower_bound * (1.0 + gap_tolerance) if method == "auto" else 0.0,
            span=certifying,
        )
        newton, cg, final_t = run.newton_iterations, run.cg_iterations, run.final_t
        smii_point = dual.plan_cost(basis_matrix, constraints, run.sigma)
        if smii_point < best_alpha:
            best_sigma, best_alpha, stage = run.sigma, smii_point, "smii"
        if best_alpha > lower_bound * (1.0 + gap_tolerance):
            polished_bound, polished_primal, more = dual.maximize_dual(
                basis_matrix,
                constraints,
                run.cell_weights,
                run.query_weights,
                max_iterations=dual_iterations,
                target_gap=gap_tolerance,
                known_alpha=best_alpha, stall_window=DUAL_STALL_WINDOW if certifying else 0,
            )  # a certifying solve's bound stalls between 1e-4 and max_gap on ~65 marginals.yaml
            # blocks (CERTIFYING_GAP); a shaping solve's weights are the next round's start
            evaluations += more
            if polished_bound.bound > lower_bound:
                certificate, lower_bound = polished_bound, polished_bound.bound
            if polished_primal.primal_alpha < best_alpha:
                best_sigma, best_alpha, stage = polished_primal.sigma, polished_primal.primal_alpha, "dual"
        for _ in range(DUAL_RESTARTS):
            if best_alpha <= lower_bound * (1.0 + max_gap):
                break  # within what the solve accepts: a restart would only cost time
            bound_point, primal_point, more = dual.maximize_dual(
                basis_matrix, constraints, certificate.cell_weights, certificate.query_weights,
                max_iterations=dual_iterations, target_gap=gap_tolerance, known_alpha=best_alpha)
            evaluations += more
            if primal_point.primal_alpha < best_alpha:
                best_sigma, best_alpha, stage = primal_point.sigma, primal_point.primal_alpha, "dual"
            if not bound_point.bound > lower_bound:
                break  # the ascent is stuck, not merely stopped
            certificate, lower_bound = bound_point, bound_point.bound

    # The certificate on every query row (the rows dominant_rows left out weigh 0), and the
    # bound it proves, evaluated the way an auditor re-evaluates it (certified_bound).
    query_weights = np.zeros(scaled_recon.shape[0])
    query_weights[rows] = certificate.query_weights
    cell_weights = certificate.cell_weights
    lower_bound = certified_bound(basis_matrix, scaled_recon, cell_weights, query_weights)
    sigma = _scaled_to_targets(best_sigma, scaled_recon)
    # Exactly symmetric: Newton steps and scalings leave round-off asymmetry (seen up to 1e-13
    # relative), which near-zero entries turn into audit mismatches; profile and variances are
    # computed from this very matrix.
    sigma = 0.5 * (sigma + sigma.T)
    profile = privacy_profile(sigma, basis_matrix)
    alpha = float(profile.max())
    gap = alpha / lower_bound - 1.0
    seconds = time.perf_counter() - start
    if gap > max_gap:
        raise ConvergenceError(
            f"solve did not converge: best plan alpha {alpha:.6g}, certified lower bound {lower_bound:.6g}, "
            f"gap {gap:.3%} > max_gap {max_gap:.3%} after {evaluations} dual evaluations, {newton} Newton "
            f"iterations ({cg} CG steps) in {seconds:.1f} s; raise time_limit/dual_iterations or max_gap"
        )
    variance_scale = 1.0
    if parsed_budget is not None:
        budget_alpha = parsed_budget.to_alpha()
        variance_scale = alpha / budget_alpha
        sigma = scaled_noise(sigma, variance_scale)
        profile = scaled_cost(profile, variance_scale)
        alpha = float(profile.max())
    variances = np.einsum("ij,ij->i", recon @ sigma, recon)
    stats = SolverStats(evaluations, newton, cg, final_t, time.perf_counter() - start, stage)
    return BlockSolution(
        sigma=sigma,
        basis=basis_matrix,
        recon=recon,
        targets=target_array,
        alpha=alpha,
        profile=profile,
        variances=variances,
        lower_bound=float(lower_bound),
        gap=float(gap),
        variance_scale=float(variance_scale),
        basis_kind=representation.kind,
        basis_reduced=representation.reduced,
        stats=stats,
        cell_weights=cell_weights,
        query_weights=query_weights,
        budget=parsed_budget,
    )
