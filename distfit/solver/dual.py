"""The dual certificate of Problem 1: a proven lower bound on the optimal privacy cost.

docs/design.md section 1. For any weights ``u`` on the d cells and ``v`` on the m queries (each
on the simplex),

    alpha* >= f(u, v) = || diag(sqrt(v / c)) W diag(sqrt(u)) ||_*^2            (nuclear norm)

with equality at the best (u, v): Problem 1 is convex and strictly feasible, so strong duality
holds. In a basis (W = L B, targets folded into ``L_c = diag(c^-1/2) L``) write

    A = B diag(u) B^T,    G = L_c^T diag(v) L_c,    N(u, v) = sqrt(f(u, v)).

The inner minimisation over Sigma is solved in closed form by the matrix geometric mean
``Sigma_uv = G^-1 # A`` (the unique SPD solution of ``Sigma G Sigma = A``): with ``G = R^T R``
and ``X = R A R^T``, ``Sigma_uv = R^-1 X^1/2 R^-T`` and ``N = tr X^1/2 = tr(Sigma^-1 A) = tr(G Sigma)``.
The gradient of N needs no extra work: ``dN/du_i = p_i(Sigma_uv) / 2`` (the privacy profile of
the recovered covariance) and ``dN/dv_j = h_j(Sigma_uv) / 2`` (its variance-to-target ratios).
So every dual evaluation also yields a primal plan; scaled to meet the targets it costs
``max_i p_i * max_j h_j >= N^2``, and the two meet exactly at the saddle point.

The bound is maximised with L-BFGS over square-root parameters of (u, v) (``maximize_dual``;
the design notes record that plain exponentiated-gradient ascent stalls far short of the
optimum, and softmax parameters converge an order of magnitude slower than square roots).
The bound a solve reports is ``certified_bound`` (:mod:`distfit.mathematics.bounds`) at the best weights found (a k x k SVD that
keeps every singular value); the weights are its certificate, kept with the plan, so anyone can
evaluate the bound again instead of searching for it (``distfit audit``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import scipy.linalg
import scipy.optimize

from distfit.solver.linalg import factored_quadratic_forms, weighted_gram
from distfit.mathematics.privacy import privacy_profile


#: ``maximize_dual(stall_window=...)``: the bound has stalled once it rises by less than this
#: fraction of the target gap over the window.
STALL_FRACTION = 0.05


@dataclass(frozen=True)
class DualPoint:
    """One evaluation of the dual at weights (u, v) and the primal it recovers.

    ``bound`` = N^2 is a valid lower bound on alpha* (rounding errors of the eigenvalues are
    subtracted first); ``nuclear_norm`` is the smooth N the optimiser follows; ``sigma`` is the
    recovered covariance
    (scale-free: ``sigma / h.max()`` meets every target and then costs ``p.max() * h.max()``).
    """

    cell_weights: np.ndarray
    query_weights: np.ndarray
    bound: float
    nuclear_norm: float
    sigma: np.ndarray
    profile: np.ndarray
    ratios: np.ndarray

    @property
    def primal_alpha(self) -> float:
        """Privacy cost of the recovered plan after scaling to the targets."""
        return float(self.profile.max() * self.ratios.max())


def _symmetrize(matrix: np.ndarray) -> np.ndarray:
    return 0.5 * (matrix + matrix.T)


def evaluate_dual(
    basis: np.ndarray,
    scaled_recon: np.ndarray,
    cell_weights: np.ndarray,
    query_weights: np.ndarray,
) -> DualPoint:
    """Evaluate f(u, v) and recover ``Sigma_uv = G^-1 # A`` (see the module docstring).

    ``basis`` is B (k, d); ``scaled_recon`` is ``L_c = diag(c^-1/2) L`` (m, k). Weights must be
    non-negative; they are normalised here. Raises ``numpy.linalg.LinAlgError`` when G is
    singular (the query weights do not span the basis).
    """
    u = np.asarray(cell_weights, dtype=float)
    v = np.asarray(query_weights, dtype=float)
    u = u / u.sum()
    v = v / v.sum()
    gram_cells = _symmetrize((basis * u) @ basis.T)
    gram_queries = weighted_gram(scaled_recon, v)
    upper = scipy.linalg.cholesky(gram_queries, lower=False)  # G = R^T R
    inner = _symmetrize(upper @ gram_cells @ upper.T)  # X = R A R^T
    eigenvalues, eigenvectors = scipy.linalg.eigh(inner)
    top = eigenvalues.max()
    # The bound must stay a proof: computed eigenvalues are off by at most about k eps |X|, so
    # take square roots of eigenvalues lowered by a generous multiple of that before summing.
    # Zero eigenvalues (cells with zero weight) would otherwise each add sqrt(eps |X|).
    rounding = 8.0 * eigenvalues.size * np.finfo(float).eps * top
    certified = float(np.sqrt(np.maximum(eigenvalues - rounding, 0.0)).sum())
    # A is only PSD when u vanishes on a spanning set of cells; the recovered plan needs a floor.
    root = np.sqrt(np.maximum(eigenvalues, top * 1e-15))
    nuclear = float(root.sum())
    # Sigma = R^-1 Z diag(sqrt(lam)) Z^T R^-T ;  Sigma^-1 = R^T Z diag(lam^-1/2) Z^T R
    half = scipy.linalg.solve_triangular(upper, eigenvectors, lower=False) * np.sqrt(root)
    sigma = _symmetrize(half @ half.T)
    whitened_cells = (eigenvectors.T @ (upper @ basis)) / np.sqrt(root)[:, None]
    profile = np.einsum("ij,ij->j", whitened_cells, whitened_cells)
    ratios = factored_quadratic_forms(scaled_recon, half)
    return DualPoint(u, v, certified**2, nuclear, sigma, profile, ratios)


def plan_cost(basis: np.ndarray, scaled_recon: np.ndarray, sigma: np.ndarray) -> float:
    """Privacy cost of ``sigma`` once scaled to meet every target: ``max_i p_i * max_j h_j``."""
    ratios = np.einsum("ij,ij->i", scaled_recon @ sigma, scaled_recon)
    return float(privacy_profile(sigma, basis).max() * ratios.max())


def _root_weights(weights: np.ndarray, uniform_share: float = 1e-6) -> np.ndarray:
    """Square-root parameters of a warm start; a whiff of the uniform weights keeps every
    parameter away from 0 (a zero parameter has zero gradient and would stay there)."""
    weights = np.asarray(weights, dtype=float)
    weights = weights / weights.sum()
    return np.sqrt((1.0 - uniform_share) * weights + uniform_share / weights.size)


#: Shares of the uniform weights mixed into a warm start, tried in turn until the dual can be
#: evaluated there. A warm start's query weights can leave G = L_c^T diag(v) L_c singular in
#: floating point when the targets within a block are thousands apart (the age pyramid's
#: prefixes at targets 1 and 3,000: eigenvalues -6e-13 against 6.7e3 at the 1e-6 share), and
#: L-BFGS cannot leave a start where the objective is infinite. The last share is the
#: uniform start itself.
START_UNIFORM_SHARES = (1e-6, 1e-3, 1e-1, 1.0)


def _evaluable_start(
    basis: np.ndarray,
    scaled_recon: np.ndarray,
    cell_weights: np.ndarray | None,
    query_weights: np.ndarray | None,
) -> np.ndarray:
    """The first start in :data:`START_UNIFORM_SHARES` at which the dual can be evaluated (the
    uniform one if none can; ``maximize_dual`` then reports that the dual cannot be evaluated)."""
    d = basis.shape[1]
    m = scaled_recon.shape[0]
    for share in START_UNIFORM_SHARES:
        x0 = np.concatenate([
            np.full(d, 1.0) if cell_weights is None else _root_weights(cell_weights, share) * np.sqrt(d),
            np.full(m, 1.0) if query_weights is None else _root_weights(query_weights, share) * np.sqrt(m),
        ])
        if cell_weights is None and query_weights is None:
            return x0
        try:
            with np.errstate(all="ignore"):
                evaluate_dual(basis, scaled_recon, x0[:d] ** 2, x0[d:] ** 2)
        except (np.linalg.LinAlgError, ValueError, ZeroDivisionError):
            continue
        return x0
    return x0


def maximize_dual(
    basis: np.ndarray,
    scaled_recon: np.ndarray,
    cell_weights: np.ndarray | None = None,
    query_weights: np.ndarray | None = None,
    max_iterations: int = 200,
    target_gap: float = 1e-4,
    known_alpha: float = np.inf,
    stall_window: int = 0,
) -> tuple[DualPoint, DualPoint, int]:
    """Maximise ``log f(u, v)`` with L-BFGS over square-root parameters ``u = x^2 / |x|^2``.

    Returns ``(best_bound_point, best_primal_point, evaluations)``: the evaluation with the
    largest lower bound and the one whose recovered plan has the smallest privacy cost (they
    usually coincide near the optimum). Stops early once the recovered plan, or a plan already
    known to cost ``known_alpha``, is within ``target_gap`` (relative) of the best bound.

    ``stall_window`` > 0 also stops once the best bound has risen by less than
    ``STALL_FRACTION * target_gap`` (relative) over the last ``stall_window`` evaluations.
    On residual blocks of prefix workloads the bound converges within 30-100 evaluations
    (to ~1e-5) while the plan recovered from it stays 5-60% above the optimum for hundreds
    more (Adult: 111-450 evaluations per large block before this stop): from there SM-II
    finds the plan far faster, aiming at the bound found so far.

    With ``g = grad_u log f = p / N`` and ``<u, p> = N``, the gradient in x is
    ``2 x (p / N - 1) / |x|^2`` (and likewise for v with h). The square-root parametrisation
    reaches the zero weights of inactive cells and queries at finite x; the softmax
    parametrisation suggested in docs/design.md needs them at -inf and crawls there. Measured on the
    age pyramid: 19 evaluations to a 1e-4 gap against 274 with softmax parameters.
    """
    d = basis.shape[1]
    m = scaled_recon.shape[0]
    x0 = _evaluable_start(basis, scaled_recon, cell_weights, query_weights)
    best: dict[str, DualPoint | None] = {"bound": None, "primal": None}
    evaluations = 0
    history: list[float] = []  # best bound after each evaluation (for stall_window)

    class _Converged(Exception):
        pass

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        nonlocal evaluations
        cell_part, query_part = x[:d], x[d:]
        cell_norm, query_norm = cell_part @ cell_part, query_part @ query_part
        try:
            point = evaluate_dual(basis, scaled_recon, cell_part**2, query_part**2)
        except (np.linalg.LinAlgError, ValueError, ZeroDivisionError):
            return np.inf, np.zeros_like(x)
        evaluations += 1
        if best["bound"] is None or point.bound > best["bound"].bound:
            best["bound"] = point
        if best["primal"] is None or point.primal_alpha < best["primal"].primal_alpha:
            best["primal"] = point
        if min(best["primal"].primal_alpha, known_alpha) <= best["bound"].bound * (1.0 + target_gap):
            raise _Converged
        if stall_window:
            history.append(best["bound"].bound)
            if len(history) > stall_window and history[-1] <= history[-1 - stall_window] * (1.0 + STALL_FRACTION * target_gap):
                raise _Converged  # the bound has stalled: leave the plan to SM-II
        norm = point.nuclear_norm
        gradient = np.concatenate([
            2.0 * cell_part * (point.profile / norm - 1.0) / cell_norm,
            2.0 * query_part * (point.ratios / norm - 1.0) / query_norm,
        ])
        return -2.0 * np.log(norm), -gradient

    with np.errstate(all="ignore"):
        try:
            scipy.optimize.minimize(
                objective,
                x0,
                jac=True,
                method="L-BFGS-B",
                options={"maxiter": max_iterations, "maxcor": 30, "ftol": 1e-15, "gtol": 1e-14},
            )
        except _Converged:
            pass
    if best["bound"] is None:
        raise np.linalg.LinAlgError("the dual could not be evaluated: the queries do not span the basis")
    return best["bound"], best["primal"], evaluations


@dataclass(frozen=True)
class BlockDualResult:
    """Best block-diagonal plan found by ``maximize_block_dual`` and its certificate.

    ``sigmas`` meet every target (each query's variance summed over its blocks <= c_j);
    ``alpha_sum_bound = sum_S max_i p_S,i``; ``lower_bound`` no block-diagonal plan of these
    blocks can beat under the sum bound; ``evaluations`` dual evaluations were made.
    """

    sigmas: tuple[np.ndarray, ...]
    alpha_sum_bound: float
    lower_bound: float
    evaluations: int
    #: The dual point of ``lower_bound``: each block's cell weights (on its simplex) and the one
    #: query weight vector v (on the simplex over the ``num_queries`` queries).
    cell_weights: tuple[np.ndarray, ...] = ()
    query_weights: np.ndarray | None = None


def maximize_block_dual(
    bases: Sequence[np.ndarray],
    scaled_recons: Sequence[np.ndarray],
    query_indices: Sequence[np.ndarray],
    num_queries: int,
    max_iterations: int = 500,
    target_gap: float = 1e-4,
    max_evaluations: int | None = None,
) -> BlockDualResult:
    """Jointly optimal noise for blocks that see the same people (sequential composition).

    Stops when the gap is within ``target_gap``, after ``max_iterations`` L-BFGS iterations,
    or after ``max_evaluations`` dual evaluations (each one eigendecomposition per block; the
    planner caps them by total work, ``plan.JOINT_DUAL_BUDGET``); the best plan and bound seen
    so far are returned.

    Primal: minimise ``sum_S max_i p_S,i(Sigma_S)`` subject to ``sum_S h_S,j(Sigma_S) <= 1`` for
    every query j (h_S,j: query j's variance from block S over its target). Its dual, for cell
    weights u_S on each block's simplex and one query weight vector v, is
    ``f = (sum_S N_S(u_S, v_S))^2`` with N_S the block's nuclear norm (``evaluate_dual``) at the
    unnormalised query weights of its rows: ``N_S(u, v) = sqrt(|v_S|) N_S(u, v_S / |v_S|)``. The
    recovered plan is ``Sigma_S = G_S^-1 # A_S`` for every block (one common scale), scaled so the
    tightest query meets its target. Unlike solving each block alone and then scaling, this
    also chooses how each query's target is shared among its blocks. Gradients: dN_S/du_S =
    p_S / 2 and dN_S/dv_j = (sum of query j's row ratios in S) / 2 at the recovered plan.
    """
    sizes = [basis.shape[1] for basis in bases]
    offsets = np.concatenate([[0], np.cumsum(sizes)])
    best: dict[str, object] = {"lower": 0.0, "upper": np.inf, "sigmas": None, "cells": (), "queries": None}
    evaluations = 0

    class _Converged(Exception):
        pass

    def objective(x: np.ndarray) -> tuple[float, np.ndarray]:
        nonlocal evaluations
        query_part = x[offsets[-1]:]
        query_norm = query_part @ query_part
        query_weights = query_part**2 / query_norm
        total_norm = 0.0
        certified = 0.0
        ratio_sums = np.zeros(num_queries)
        cell_gradient = np.zeros(offsets[-1])
        profiles_max = 0.0
        sigmas = []
        points = []
        for s, (basis, recon, index) in enumerate(zip(bases, scaled_recons, query_indices)):
            cell_part = x[offsets[s] : offsets[s + 1]]
            weights = query_weights[index]
            mass = weights.sum()
            try:
                point = evaluate_dual(basis, recon, cell_part**2, weights)
            except (np.linalg.LinAlgError, ValueError, ZeroDivisionError):
                return np.inf, np.zeros_like(x)
            root = np.sqrt(mass)
            norm = root * point.nuclear_norm
            profile = point.profile * root
            ratios = point.ratios / root
            total_norm += norm
            certified += root * np.sqrt(point.bound)
            np.add.at(ratio_sums, index, ratios)
            cell_gradient[offsets[s] : offsets[s + 1]] = cell_part / (cell_part @ cell_part) * (profile - norm)
            profiles_max += profile.max()
            sigmas.append(point.sigma / root)
            points.append(point)
        evaluations += 1
        if certified**2 > best["lower"]:
            best["lower"], best["queries"] = certified**2, query_weights
            best["cells"] = tuple(point.cell_weights for point in points)
        upper = profiles_max * ratio_sums.max()
        if upper < best["upper"]:
            scale = 1.0 / (ratio_sums.max() * (1.0 + 1e-12))
            best["upper"], best["sigmas"] = upper, tuple(sigma * scale for sigma in sigmas)
        if best["upper"] <= best["lower"] * (1.0 + target_gap):
            raise _Converged
        if max_evaluations is not None and evaluations >= max_evaluations:
            raise _Converged  # out of budget: keep the best plan and bound so far
        query_gradient = 2.0 * query_part / query_norm * (ratio_sums / 2.0 - total_norm / 2.0)
        gradient = 2.0 / total_norm * np.concatenate([cell_gradient, query_gradient])
        return -2.0 * np.log(total_norm), -gradient

    x0 = np.ones(offsets[-1] + num_queries)
    with np.errstate(all="ignore"):
        try:
            scipy.optimize.minimize(
                objective, x0, jac=True, method="L-BFGS-B",
                options={"maxiter": max_iterations, "maxcor": 30, "ftol": 1e-15, "gtol": 1e-14},
            )
        except _Converged:
            pass
    if best["sigmas"] is None:
        raise np.linalg.LinAlgError("the block dual could not be evaluated: some block's queries do not span its basis")
    return BlockDualResult(best["sigmas"], float(best["upper"]), float(best["lower"]), evaluations,
                           best["cells"], best["queries"])
