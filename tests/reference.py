"""Independent test-only references for the solver tests (no code from ``distfit`` is used).

``cvx_optimal_alpha`` solves Problem 1 (DESIGN.md section 1) as a semidefinite program with
cvxpy, in the variable ``X = Sigma^-1``:

    minimise t   subject to   b_i^T X b_i <= t          (privacy profile, one per cell)
                              [[c_j, l_j^T], [l_j, X]] >> 0   (Schur: l_j^T X^-1 l_j <= c_j)
                              X >> 0

with B an orthonormal row basis of W from numpy's SVD and L = W B^T. The problem is convex, so
its optimum is the optimal privacy cost alpha* that ``distfit.solve`` must reach.
"""
from __future__ import annotations

import numpy as np


def orthonormal_row_basis(W: np.ndarray) -> np.ndarray:
    """Orthonormal rows spanning the row space of W (numerical rank from the singular values)."""
    W = np.asarray(W, dtype=float)
    _, singular, right = np.linalg.svd(W, full_matrices=False)
    tolerance = max(W.shape) * np.finfo(float).eps * singular[0]
    return right[: int((singular > tolerance).sum())]


def cvx_optimal_alpha(W, targets) -> float:
    """The optimal privacy cost of Problem 1 for workload W (m x d) and targets c (m,), by SDP."""
    import cvxpy as cp

    W = np.asarray(W, dtype=float)
    c = np.broadcast_to(np.asarray(targets, dtype=float), (W.shape[0],))
    B = orthonormal_row_basis(W)
    L = W @ B.T
    k = B.shape[0]
    X = cp.Variable((k, k), symmetric=True)
    t = cp.Variable()
    constraints = [X >> 0]
    # b_i^T X b_i for every column b_i of B, as one affine vector expression
    constraints.append(cp.sum(cp.multiply(B.T @ X, B.T), axis=1) <= t)
    for j in range(W.shape[0]):
        l_col = L[j].reshape(k, 1)
        block = cp.bmat([[np.array([[c[j]]]), l_col.T], [l_col, X]])
        constraints.append(block >> 0)
    problem = cp.Problem(cp.Minimize(t), constraints)
    installed = cp.installed_solvers()
    value = None
    if "CLARABEL" in installed:
        try:
            value = problem.solve(solver=cp.CLARABEL)
        except cp.error.SolverError:
            value = None
    if value is None or problem.status not in ("optimal", "optimal_inaccurate") or not np.isfinite(value):
        value = problem.solve(solver=cp.SCS, eps=1e-9, max_iters=200000)
    if problem.status not in ("optimal", "optimal_inaccurate"):
        raise RuntimeError(f"cvx_optimal_alpha: solver status {problem.status}")
    return float(value)


def prefix_matrix(d: int) -> np.ndarray:
    """Lower-triangular ones: the prefix workload (query j counts cells 0..j)."""
    return np.tril(np.ones((d, d)))


def mixed_marginal_workload():
    """A small marginal mix with prefix queries and per-query targets (age 8 x sex 2 x edu 4)."""
    import numpy as np

    from distfit.domain import Domain
    from distfit.workload import prefix_queries

    domain = Domain(("age", "sex", "edu"), (8, 2, 4))
    rng = np.random.default_rng(0)
    groups = [
        ("age", {"age": prefix_queries(8)}, rng.uniform(1, 4, 8)),
        ("age,sex", {"age": prefix_queries(8), "sex": np.eye(2)}, rng.uniform(1, 4, 16)),
        ("sex,edu", {"sex": np.eye(2), "edu": np.eye(4)}, 2.0),
        ("edu", {"edu": prefix_queries(4)}, 1.0),
    ]
    return domain, groups


#: A small three-attribute pipeline spec (36 cells, 24 queries, 2 blocks under max_cells 12),
#: shared by the planning, release, report and run tests. Copy before changing it.
SMALL_SPEC = {
    "name": "small",
    "attributes": [
        {"name": "age", "size": 6, "ordinal": True},
        {"name": "sex", "values": ["f", "m"]},
        {"name": "edu", "size": 3, "ordinal": True},
    ],
    "queries": [
        {"name": "age", "attributes": {"age": "prefix"}, "target": [1, 1.5, 2, 2, 3, 3]},
        {"name": "age_sex", "attributes": {"age": "identity", "sex": "identity"}, "target": 4},
        {"name": "sex_edu", "attributes": {"sex": "identity", "edu": "prefix"}, "target": 2},
    ],
    "blocks": {"max_cells": 12},
}
