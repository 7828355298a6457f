"""Lower bounds evaluated at their stored dual points, by the audit's own code (docs/audit.md,
"Lower bounds"; the formulas are those of docs/privacy.md, "Certified lower bounds").

A lower bound of a convex program is proved by its dual objective at a dual point: the audit
evaluates that objective once at the point the plan stores, it never searches for one.

* **a block's bound** (the paper's dual of Problem 1, docs/solver.md): for distributions u on the
  block's cells and v on its query rows, every covariance whose variances are at most ``t`` has
  ``alpha >= N(u, v)^2`` with ``N = || diag(sqrt(v / t)) L B diag(sqrt(u)) ||_*`` (nuclear norm).
  The planner computes N by two Householder QRs and a k x k SVD; here by an SVD of each side,
  ``P = diag(sqrt(v)) L_t = U_1 S_1 V_1^T`` and ``B diag(sqrt(u)) = U_2 S_2 V_2^T``, so that N
  is the sum of the singular values of the small ``S_1 V_1^T U_2 S_2``. Both subtract the same
  rounding margin before squaring, ``8 r n eps |P|_F |B diag(sqrt(u))|_F`` (r singular values,
  n the largest dimension), which keeps the value a proof (:func:`certified_norm`).
* **the joint block dual** (blocks that see the same people, docs/planning.md): for a
  distribution v over all queries and one u_S per block, every block-diagonal plan of these
  blocks meeting the targets c has ``sum_S alpha_S >= (sum_S N_S)^2`` with
  ``N_S = || diag(sqrt(v_S / c_S)) L_S B_S diag(sqrt(u_S)) ||_*`` at the unnormalised weights
  v_S of block S's rows, i.e. ``sqrt(|v_S|) N_S(u_S, v_S / |v_S|)`` (:func:`joint_bound`).
* **the scale allocation** (``min sum_S a_S / s_S`` s.t. ``sum_S s_S v_jS <= c_j``, docs/planning.md):
  its Lagrange dual, with the size of the multipliers optimised out, is
  ``(sum_S sqrt(a_S g_S))^2`` with ``g_S = sum_j omega_j v_jS / c_j`` for any distribution omega
  over the queries (:func:`allocation_bound`; Boyd & Vandenberghe, *Convex Optimization*, 5.2).
"""
from __future__ import annotations

import numpy as np

WEIGHT_TOLERANCE = 1e-9  # a certificate's weights add up to 1 within this


def not_a_distribution(weights: np.ndarray) -> str:
    """Why ``weights`` is not a distribution (empty when it is): finite, >= 0, summing to 1."""
    weights = np.asarray(weights, dtype=float)
    if not np.all(np.isfinite(weights)):
        return f"{int((~np.isfinite(weights)).sum())} entries are not finite"
    if np.any(weights < 0):
        return f"{int((weights < 0).sum())} entries are negative (first: {weights[weights < 0][0]!r})"
    if abs(float(weights.sum()) - 1.0) > WEIGHT_TOLERANCE:
        return f"they add up to {float(weights.sum())!r}, not 1"
    return ""


def certified_norm(basis: np.ndarray, scaled_recon: np.ndarray, cell_weights: np.ndarray,
                   query_weights: np.ndarray) -> float:
    """``N(u, v) = || diag(sqrt(v)) L_t B diag(sqrt(u)) ||_*`` at the weights normalised to
    distributions, less the rounding margin (module docstring); ``scaled_recon`` is ``L_t``."""
    u = np.asarray(cell_weights, dtype=float)
    v = np.asarray(query_weights, dtype=float)
    u, v = u / u.sum(), v / v.sum()
    cells, rows = np.flatnonzero(u > 0), np.flatnonzero(v > 0)  # zero weights add nothing
    left = np.sqrt(v[rows])[:, None] * scaled_recon[rows]  # (m', k)
    right = basis[:, cells] * np.sqrt(u[cells])  # (k, d')
    if not (left.size and right.size):
        return 0.0
    _, left_values, left_rows = np.linalg.svd(left, full_matrices=False)
    right_columns, right_values, _ = np.linalg.svd(right, full_matrices=False)
    core = (left_values[:, None] * left_rows) @ (right_columns * right_values)
    singular = np.linalg.svd(core, compute_uv=False)
    size = max(left.shape[0], right.shape[1], basis.shape[0])
    margin = 8.0 * singular.size * size * np.finfo(float).eps * np.linalg.norm(left) * np.linalg.norm(right)
    return float(max(singular.sum() - margin, 0.0))


def bound_targets(variances: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """The variances a block's bound speaks about: its target shares scaled to its variances,
    ``t = targets * max(variances / targets)`` (a solve certifies its bound at the shares it
    was solved for, which its plan meets with equality at the tightest row; every later scaling
    by s multiplies the variances by s and divides the bound by s, leaving the weights)."""
    return float(np.max(variances / targets)) * targets


def block_bound(basis: np.ndarray, recon: np.ndarray, variances: np.ndarray, targets: np.ndarray,
                cell_weights: np.ndarray, query_weights: np.ndarray) -> float:
    """The bound a block's certificate (u, v) proves: ``N(u, v)^2`` at ``t`` (:func:`bound_targets`)."""
    t = bound_targets(variances, targets)
    return certified_norm(basis, recon / np.sqrt(t)[:, None], cell_weights, query_weights) ** 2


def joint_bound(blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]]) -> float:
    """``(sum_S sqrt(|v_S|) N_S(u_S, v_S / |v_S|))^2`` over ``(basis, L_c, u_S, v_S)`` per block,
    ``L_c`` the block's recon over the square roots of its rows' targets (module docstring)."""
    total = 0.0
    for basis, scaled_recon, cells, rows in blocks:
        mass = float(np.sum(rows))
        if mass > 0:
            total += np.sqrt(mass) * certified_norm(basis, scaled_recon, cells, rows)
    return float(total) ** 2


def range_sums(queries: np.ndarray, values: np.ndarray, first: np.ndarray, count: np.ndarray) -> np.ndarray:
    """Per range ``[first, first + count)`` of queries, the sum of ``values`` at the sorted
    ``queries`` that fall in it (a weight vector stored sparsely, summed over query ranges)."""
    cumulative = np.concatenate([[0.0], np.cumsum(values)])
    return cumulative[np.searchsorted(queries, first + count)] - cumulative[np.searchsorted(queries, first)]


def allocation_bound(alphas: np.ndarray, weighted_variances: np.ndarray) -> float:
    """``(sum_S sqrt(a_S g_S))^2``: the allocation's dual at the point whose per-block sums
    ``g_S = sum_j omega_j v_jS / c_j`` are ``weighted_variances`` (module docstring)."""
    return float(np.sum(np.sqrt(np.asarray(alphas) * np.asarray(weighted_variances)))) ** 2
