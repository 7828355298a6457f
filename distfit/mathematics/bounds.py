"""The dual certificate's lower bound, evaluated at stored weights (no search).

The dual of Problem 1 (docs/solver.md, "How the solver works", step 2; paper 000, the dual of the
fitness-for-use program): for weights ``u`` on a block's cells and ``v`` on its query rows,
each on the simplex, every covariance meeting the targets has privacy cost at least
``f(u, v) = || diag(sqrt(v)) L_t B diag(sqrt(u)) ||_*^2``. The solver maximises this bound
(:mod:`distfit.solver.dual`); the planner's packing and the stored plan evaluate it at given
weights, so the function lives here, below both.
"""
from __future__ import annotations

import numpy as np

#: How a plan's chosen-blocks lower bound was certified (the planner's ``lower_bound_method``,
#: stored as the bound's ``method``): the scale allocation's dual bounds the chosen block
#: covariances rescaled, one factor per block; the joint block dual bounds any covariances of the
#: chosen blocks (block-diagonal plans of these blocks).
SCALE_ALLOCATION = "scale allocation"
JOINT_BLOCK_DUAL = "joint block dual"
#: What each bound bounds, in words: the ``bounds`` text a plan stores beside the value (written by
#: the plan job, checked word for word by the audit, which derives the method from the certificate).
CHOSEN_BLOCKS_BOUNDS = {
    SCALE_ALLOCATION: (
        "the sum bound sum_S alpha_S of every plan with the chosen blocks whose covariances are the "
        "chosen ones rescaled, one factor per block, that meets every target times the variance scale; "
        "not a bound on plans with other blocks or other covariances"),
    JOINT_BLOCK_DUAL: (
        "the sum bound sum_S alpha_S of every block-diagonal plan with the chosen blocks (any covariance "
        "per block) that meets every target times the variance scale; not a bound on plans with other "
        "blocks or with noise correlated across blocks"),
}
GLOBAL_BOUNDS = ("the privacy cost alpha of every Gaussian mechanism L (B x + z) that answers the workload "
                 "with every variance at most its target times the variance scale")


def certified_bound(
    basis: np.ndarray,
    scaled_recon: np.ndarray,
    cell_weights: np.ndarray,
    query_weights: np.ndarray,
) -> float:
    """The dual bound at stored weights: ``f(u, v) = ||diag(sqrt(v)) L_t B diag(sqrt(u))||_*^2``.

    The dual of Problem 1 (docs/solver.md; paper 000): for ``u >= 0`` on the block's d cells
    and ``v >= 0`` on its m query rows, each summing to 1, and ``L_t = diag(t^-1/2) L``
    (``scaled_recon``), every covariance whose variances ``diag(L Sigma L^T)`` are at most
    ``t`` has ``alpha = max_i b_i^T Sigma^-1 b_i >= f(u, v)``. This is the value a solve
    reports as its ``lower_bound`` and the one ``distfit audit`` re-evaluates from the plan's
    ``cell_weights`` / ``query_weights``: an evaluation, not a search.

    The k x k reduction: with ``P = diag(sqrt(v)) L_t = Q_1 R_1`` and
    ``(B diag(sqrt(u)))^T = Q_2 R_2`` (rows and cells of zero weight dropped first: they add
    nothing), ``P B diag(sqrt(u)) = Q_1 R_1 R_2^T Q_2^T`` has the singular values of the k x k
    ``R_1 R_2^T``. Householder QR, the product and the SVD are backward stable: the computed
    singular values are exact for ``P B diag(sqrt(u)) + E`` with ``|E|_2`` about
    ``n eps |R_1| |R_2|`` (n the largest dimension), and a nuclear norm moves by at most
    ``k |E|_2`` (k singular values). ``8 k n eps |R_1|_F |R_2|_F`` (Frobenius norms bound the
    spectral ones) is subtracted before squaring, so the value stays a proof; it costs at most
    1.4e-9 of the bound on pl94's and Adult's blocks (1e-12 on the test suite's small ones),
    far below a solve's gap tolerance. Unlike ``evaluate_dual``
    (eigenvalues of the Gram matrix ``X``, whose square roots lose half the digits of the
    small ones) no singular value is lost. Weights are normalised here, as there.
    Raises ValueError on weights that are negative, not finite or all zero.
    """
    u = np.asarray(cell_weights, dtype=float)
    v = np.asarray(query_weights, dtype=float)
    for name, weights in (("cell_weights", u), ("query_weights", v)):
        if not (np.all(np.isfinite(weights)) and np.all(weights >= 0) and weights.sum() > 0):
            raise ValueError(f"{name}: weights must be finite, >= 0 and not all zero")
    u = u / u.sum()
    v = v / v.sum()
    cells = np.flatnonzero(u > 0)
    rows = np.flatnonzero(v > 0)
    left = scaled_recon[rows] * np.sqrt(v[rows])[:, None]  # P: (m', k)
    right = basis[:, cells] * np.sqrt(u[cells])  # B diag(sqrt(u)): (k, d')
    upper_left = np.linalg.qr(left, mode="r")  # (min(m', k), k)
    upper_right = np.linalg.qr(right.T, mode="r")  # (min(d', k), k)
    singular = np.linalg.svd(upper_left @ upper_right.T, compute_uv=False)
    if singular.size == 0:
        return 0.0
    size = max(left.shape[0], right.shape[1], basis.shape[0])
    scale = np.linalg.norm(upper_left) * np.linalg.norm(upper_right)
    rounding = 8.0 * singular.size * size * np.finfo(float).eps * scale
    return float(max(singular.sum() - rounding, 0.0) ** 2)
