"""Scale allocation: one scale per block so that every query meets its target (docs/design.md section 2).

Targets couple the blocks: each block is solved once with its queries' own targets (its shape:
``alpha_S`` and the variance ``v_jS`` it gives query j), then ``allocate_scales`` picks one scale
``s_S`` per block by the convex program
``minimise sum_S alpha_S / s_S  subject to  sum_S s_S v_jS <= c_j`` for every query j
(a block at scale s has covariance ``s Sigma_S``: ``distfit.mathematics.scaling``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import scipy.linalg
import scipy.sparse
import scipy.sparse.linalg

from distfit.mathematics.packing import QueryRuns

BARRIER_MAX_CENTRES = 40  # t grows 20x per centre: far beyond what float64 can use
BARRIER_MAX_NEWTON = 100  # per centre; ~10-30 are typical
DENSE_SCHUR_LIMIT = 500  # non-leaf blocks up to which the Schur complement is factorised densely (measured: CG 4x faster at 1,001)
CG_TOLERANCE = 1e-10  # relative residual of an iterative Newton step
CG_MAX_ITERATIONS = 400  # then the dense factorisation after all


@dataclass(frozen=True)
class ScaleAllocation:
    """Scales ``s_S`` of the blocks and the certified optimum of the allocation program."""

    scales: np.ndarray
    alpha_bound: float  # sum_S alpha_S / s_S of the returned (feasible) scales
    lower_bound: float  # dual value: no feasible allocation does better
    #: The dual point that proves ``lower_bound`` (its certificate, kept with the plan so that
    #: ``distfit audit`` evaluates the bound instead of solving the program again): the queries
    #: of the constraint rows (sorted; a run of queries sharing one constraint is its first) and
    #: their weights omega on the simplex, ``lower_bound = (sum_S sqrt(a_S (V_n^T omega)_S))^2``.
    certificate_queries: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    certificate_weights: np.ndarray = field(default_factory=lambda: np.zeros(0))


def allocate_scales(
    block_alphas: Sequence[float],
    block_queries: Sequence[tuple[np.ndarray, np.ndarray]],
    targets: np.ndarray,
    tolerance: float = 1e-6,
) -> ScaleAllocation:
    """Solve ``min sum_S a_S / s_S  s.t.  sum_S s_S v_jS <= c_j`` (docs/design.md section 2).

    ``block_queries[S] = (query_index, variances)``: the variance each query row gets from
    block S at scale 1. With the constraints normalised (``V_n = diag(1/c) V``, rows of queries
    no block reaches dropped) this is solved by the primal log-barrier method (Boyd &
    Vandenberghe, *Convex Optimization*, section 11.3) over the block scales:
    minimise ``phi_t(s) = t sum_S a_S / s_S - sum_j log(1 - (V_n s)_j)`` by damped Newton
    steps (gradient ``-t a / s^2 + V_n^T (1 / (1 - r))``, Hessian
    ``t diag(2 a / s^3) + V_n^T diag(1 / (1 - r)^2) V_n``, blocks x blocks: a few hundred
    Cholesky factorisations of that size in all), then ``t <- 20 t``.

    Every centre gives a certificate. The Lagrange dual of the program is
    ``max_{lambda >= 0} 2 sum_S sqrt(a_S g_S) - sum_j lambda_j`` with ``g = V_n^T lambda``;
    optimising out the overall size of lambda leaves ``(sum_S sqrt(a_S g_S(omega)))^2`` for
    ``omega = lambda / sum(lambda)``, a lower bound on every feasible allocation for every
    ``omega`` in the simplex. The barrier's centre supplies ``lambda_j = 1 / (t (1 - r_j))``,
    and its ``s``, scaled so that the tightest constraint holds with equality, is feasible.
    Stops once that feasible allocation is within ``tolerance`` (relative) of the best lower
    bound. (The allocation was an L-BFGS ascent on the dual over the ~10^4 - 10^5 query
    weights; on the Adult plan, 470 blocks and 42,301 queries, that took 21 s quiet and minutes
    on a loaded driver; the barrier takes about 3 s and ends with a slightly better allocation.)
    """
    alphas = np.asarray(block_alphas, dtype=float)
    if len(block_queries) != alphas.size:
        raise ValueError(f"block_queries: {len(block_queries)} entries for {alphas.size} block alphas")
    rows = np.concatenate([np.asarray(query_index, dtype=np.int64) for query_index, _ in block_queries])
    cols = np.concatenate([np.full(len(query_index), column) for column, (query_index, _) in enumerate(block_queries)])
    values = np.concatenate([np.asarray(variances, dtype=float) for _, variances in block_queries])
    return allocate_rows(alphas, rows, cols, values, targets, tolerance)


def allocate_rows(block_alphas: np.ndarray, rows: np.ndarray, cols: np.ndarray, values: np.ndarray,
                  targets: np.ndarray | QueryRuns, tolerance: float = 1e-6) -> ScaleAllocation:
    """``allocate_scales`` with the variances as sparse triples: query ``rows[r]`` gets variance
    ``values[r]`` from block ``cols[r]`` at scale 1 (a query's entries in one block add up)."""
    alphas = np.asarray(block_alphas, dtype=float)
    # Only the queries some block reaches are constraints: numbered in order, they are the
    # matrix's rows, and only their targets are read (``targets`` may be runs, QueryRuns: at 100
    # attributes, every marginal up to 3-way, 162M queries, 1.3M rows of closed-form blocks).
    queries, rows = np.unique(np.asarray(rows, dtype=np.int64), return_inverse=True)
    if not isinstance(targets, QueryRuns):
        targets = np.asarray(targets, dtype=float)
    targets = np.asarray(targets[queries], dtype=float)
    rows = rows.reshape(-1)
    cols = np.asarray(cols, dtype=np.int64)
    values = np.asarray(values, dtype=float)
    if np.any(alphas <= 0) or not np.all(np.isfinite(alphas)):
        raise ValueError("block_alphas: every block alpha must be finite and > 0")
    if np.any(values < 0) or not np.all(np.isfinite(values)):
        raise ValueError("block_queries: variances must be finite and >= 0")
    if np.any(targets[rows] <= 0):
        raise ValueError("targets: every target of a query a block reaches must be > 0")
    variance_matrix = scipy.sparse.csr_matrix((values / targets[rows], (rows, cols)), shape=(targets.size, alphas.size))
    variance_matrix.eliminate_zeros()
    constrained = np.flatnonzero(np.diff(variance_matrix.indptr) > 0)
    normalised = variance_matrix[constrained]
    transposed = normalised.T.tocsr()
    idle = np.flatnonzero(np.diff(transposed.indptr) == 0)
    if idle.size:
        raise ValueError(f"block_queries: block {int(idle[0])} gives no query any variance, so its scale is unbounded")
    num_constraints = normalised.shape[0]
    leaves = _LeafElimination(normalised)

    def barrier_change(scales: np.ndarray, step: np.ndarray, slack: np.ndarray, growth: np.ndarray, length: float) -> float:
        """``phi_t(s + length step) - phi_t(s)``, term by term: at large t the values themselves
        are ~1e11, so their difference would cancel away the decrease being tested."""
        moved = scales + length * step
        shrink = length * growth / slack
        if np.any(moved <= 0) or np.any(shrink >= 1):
            return np.inf
        return -weight * float(np.sum(alphas * length * step / (scales * moved))) - float(np.sum(np.log1p(-shrink)))

    # Start from the dual's uniform weights (s = sqrt(a / g)), well inside the constraints.
    scales = np.sqrt(alphas / (transposed @ np.full(num_constraints, 1.0 / num_constraints)))
    scales *= 0.5 / (normalised @ scales).max()
    weight = num_constraints / float(np.sum(alphas / scales))
    lower, upper, best, certificate = 0.0, np.inf, scales, np.zeros(0)
    for _ in range(BARRIER_MAX_CENTRES):
        for _ in range(BARRIER_MAX_NEWTON):
            slack = 1.0 - normalised @ scales
            gradient = -weight * alphas / scales**2 + transposed @ (1.0 / slack)
            step = -leaves.solve(2.0 * weight * alphas / scales**3, 1.0 / slack**2, gradient)
            decrement = float(-gradient @ step)  # squared Newton decrement
            if not decrement > 1e-9:
                break
            # Longest step that stays strictly inside, then backtrack (Armijo).
            growth = normalised @ step
            length = min(1.0, 0.99 * _largest_step(slack, growth), 0.99 * _largest_step(scales, -step))
            while barrier_change(scales, step, slack, growth, length) > -0.25 * length * decrement and length > 1e-14:
                length *= 0.5
            if length <= 1e-14:
                break  # no progress at machine precision: this centre is as good as it gets
            scales = scales + length * step
        omega = 1.0 / (1.0 - normalised @ scales)  # proportional to the centre's lambda
        omega = omega / omega.sum()
        bound = float(np.sum(np.sqrt(alphas * (transposed @ omega)))) ** 2
        if bound > lower:
            lower, certificate = bound, omega
        feasible = scales / (normalised @ scales).max()
        value = float(np.sum(alphas / feasible))
        if value < upper:
            upper, best = value, feasible
        if upper <= lower * (1.0 + tolerance):
            break
        weight *= 20.0
    return ScaleAllocation(scales=best, alpha_bound=upper, lower_bound=lower,
                           certificate_queries=queries[constrained], certificate_weights=certificate)


class _LeafElimination:
    """Newton systems ``(diag(h) + V^T diag(w) V) x = g`` of the allocation, with the *leaf*
    blocks eliminated first (the issue's "eliminate them first").

    A leaf is a block with a nonzero in one constraint row only, at most one leaf per row (the
    block of a marginal's own clique: no other marginal reaches it). The leaves' part of the
    system is diagonal, ``h_j + V_rj^2 w_r``, and eliminating them leaves the other blocks'
    system with the row weights changed: ``S = diag(h_C) + V_C^T diag(w - (V_rj w_r)^2 /
    (h_j + V_rj^2 w_r)) V_C`` (the Schur complement; a dense Cholesky of the non-leaf blocks
    only). All 2-way marginals of N attributes: N + 1 non-leaf blocks of N(N + 1)/2 + N + 1.

    Above ``DENSE_SCHUR_LIMIT`` non-leaf blocks (all marginals up to 3-way of 100 attributes:
    5,051, a 2.6 s Cholesky per Newton step) the Schur system is solved by conjugate gradients
    with a Jacobi preconditioner, each product ``S x`` through the sparse ``V_C`` (~4% of S is
    nonzero), falling back to the dense factorisation when it has not converged to
    ``CG_TOLERANCE`` in ``CG_MAX_ITERATIONS``. An inexact Newton step costs no certificate: the
    lower bound holds at every weight vector and the upper bound is a feasible allocation."""

    def __init__(self, normalised: scipy.sparse.csr_matrix) -> None:
        columns = normalised.tocsc()
        counts = np.diff(columns.indptr)
        single = np.flatnonzero(counts == 1)
        rows = columns.indices[columns.indptr[single]]
        _, first = np.unique(rows, return_index=True)  # one leaf per row
        self.leaf = single[first]
        self.leaf_row = rows[first]
        self.leaf_value = columns.data[columns.indptr[self.leaf]]
        mask = np.ones(normalised.shape[1], dtype=bool)
        mask[self.leaf] = False
        self.rest = np.flatnonzero(mask)
        self.rest_matrix = columns[:, self.rest].tocsr()
        self.rest_transposed = self.rest_matrix.T.tocsr()

    def solve(self, diagonal: np.ndarray, row_weights: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        leaf_weight = self.leaf_value * row_weights[self.leaf_row]  # V_rj w_r
        leaf_diagonal = diagonal[self.leaf] + self.leaf_value * leaf_weight
        weights = row_weights.copy()
        weights[self.leaf_row] -= leaf_weight**2 / leaf_diagonal
        carried = np.zeros(row_weights.size)
        carried[self.leaf_row] = leaf_weight * rhs[self.leaf] / leaf_diagonal
        out = np.empty_like(rhs)
        if self.rest.size:
            reduced = rhs[self.rest] - self.rest_transposed @ carried
            out[self.rest] = self._schur_solve(diagonal[self.rest], weights, reduced)
        coupled = (self.rest_matrix @ out[self.rest])[self.leaf_row] if self.rest.size else 0.0
        out[self.leaf] = (rhs[self.leaf] - leaf_weight * coupled) / leaf_diagonal
        return out


    def _schur_solve(self, diagonal: np.ndarray, weights: np.ndarray, rhs: np.ndarray) -> np.ndarray:
        """``(diag(diagonal) + V_C^T diag(weights) V_C) x = rhs`` (class docstring)."""
        if self.rest.size > DENSE_SCHUR_LIMIT:
            matrix, transposed = self.rest_matrix, self.rest_transposed
            operator = scipy.sparse.linalg.LinearOperator(
                (self.rest.size, self.rest.size), dtype=float,
                matvec=lambda x: diagonal * x + transposed @ (weights * (matrix @ x)))
            jacobi = 1.0 / (diagonal + transposed.power(2) @ weights)
            preconditioner = scipy.sparse.linalg.LinearOperator(
                (self.rest.size, self.rest.size), dtype=float, matvec=lambda x: jacobi * x)
            solution, info = scipy.sparse.linalg.cg(operator, rhs, rtol=CG_TOLERANCE, atol=0.0,
                                                    maxiter=CG_MAX_ITERATIONS, M=preconditioner)
            if info == 0:
                return solution
        # V_C^T diag(w) as CSR (the same products as ``multiply(weights)``, which returns COO:
        # its conversion took a third of the product's time, ~2 s of Adult's plan on the driver)
        scaled = self.rest_transposed.copy()
        scaled.data *= weights[scaled.indices]
        schur = (scaled @ self.rest_matrix).toarray()
        schur[np.diag_indices_from(schur)] += diagonal
        try:
            return scipy.linalg.cho_solve(scipy.linalg.cho_factor(schur), rhs)
        except np.linalg.LinAlgError:
            return np.linalg.lstsq(schur, rhs, rcond=None)[0]


def _largest_step(room: np.ndarray, use: np.ndarray) -> float:
    """Largest ``h`` with ``room - h * use > 0`` where ``use > 0`` (inf if nothing limits it)."""
    limited = use > 0
    return float(np.min(room[limited] / use[limited])) if limited.any() else np.inf

