"""Independent test-only references for the solver and estimate tests (no code from ``distfit`` is used).

``cvx_optimal_alpha`` solves Problem 1 (docs/design.md section 1) as a semidefinite program with
cvxpy, in the variable ``X = Sigma^-1``:

    minimise t   subject to   b_i^T X b_i <= t          (privacy profile, one per cell)
                              [[c_j, l_j^T], [l_j, X]] >> 0   (Schur: l_j^T X^-1 l_j <= c_j)
                              X >> 0

with B an orthonormal row basis of W from numpy's SVD and L = W B^T. The problem is convex, so
its optimum is the optimal privacy cost alpha* that ``distfit.solve`` must reach.

That SDP takes minutes beyond ~20 basis rows (Clarabel, 2 cores), so the 2-way marginal
workloads of docs/design.md section 2 are checked against ``cvx_symmetric_marginal_alpha``: the same
Problem 1 reduced by the workload's symmetry to one variable per residual space (exact, see
there; the tests confirm it equals the SDP on small workloads).
"""
from __future__ import annotations

import functools
import itertools

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


def _sorted_rows(matrix: np.ndarray) -> np.ndarray:
    return matrix[np.lexsort(matrix.T[::-1])]


def _value_permutations(sizes: tuple[int, ...]):
    """Cell permutations (cells in C order, attribute 0 slowest) that generate the group of
    permutations of each attribute's values: per attribute, the swap of values 0 and 1 and the
    cycle of all its values (together they generate the symmetric group on the values)."""
    cells = np.arange(int(np.prod(sizes))).reshape(sizes)
    for axis, n in enumerate(sizes):
        if n < 2:
            continue
        for values in (np.r_[1, 0, 2:n], np.roll(np.arange(n), 1)):
            yield np.take(cells, values, axis=axis).ravel()


@functools.lru_cache(maxsize=None)
def _residual_projectors(sizes: tuple[int, ...]) -> tuple[tuple[tuple[int, ...], np.ndarray], ...]:
    """``(S, P_S)`` for every subset S of the attributes: the orthogonal projector on the
    residual space of S, ``P_S = kron_a (I - J/n_a if a in S else J/n_a)`` (J all ones)."""
    out = []
    for size in range(len(sizes) + 1):
        for subset in itertools.combinations(range(len(sizes)), size):
            projector = np.ones((1, 1))
            for a, n in enumerate(sizes):
                mean = np.full((n, n), 1.0 / n)
                projector = np.kron(projector, np.eye(n) - mean if a in subset else mean)
            out.append((subset, projector))
    return tuple(out)


def cvx_symmetric_marginal_alpha(W, targets, sizes) -> float:
    """The optimal privacy cost of Problem 1 for a workload that is symmetric under permuting each
    attribute's values (e.g. marginals with one target per marginal), by a convex program in
    one variable per residual space instead of the SDP of :func:`cvx_optimal_alpha`.

    Symmetry reduction (e.g. Gatermann and Parrilo, "Symmetry groups, semidefinite programs, and
    sums of squares", J. Pure Appl. Algebra 192, 2004): Problem 1 is convex in ``X = Sigma^-1``
    and, when a permutation Q of the cells maps the set of pairs (w_j, c_j) onto itself,
    ``Q X Q^T`` is feasible with a permuted profile, so the same objective; the average of an
    optimal X over the group is then feasible (the constraints are convex) and optimal (the
    max of the profile is convex). The matrices that commute with every permutation of every
    attribute's values are spanned by kron products of I and J, i.e. ``X = sum_S lambda_S P_S``
    with P_S the residual projectors. On the row space of W (the P_S with ``P_S W^T != 0``) the
    profile is ``sum_S lambda_S diag(P_S)`` and query j's variance ``sum_S ||P_S w_j||^2 /
    lambda_S``, so the optimum is

        minimise t   subject to   sum_S lambda_S diag(P_S)_i <= t   (every cell i)
                                  sum_S ||P_S w_j||^2 / lambda_S <= c_j   (every query j),  lambda > 0.

    Both premises are checked here, not assumed: the set of (w_j, c_j) is invariant under the
    generators of each attribute's value permutations, and the kept residual spaces add up to
    exactly the rank of W. No code from ``distfit`` is used.
    """
    import cvxpy as cp

    sizes = tuple(int(n) for n in sizes)
    W = np.asarray(W, dtype=float)
    c = np.broadcast_to(np.asarray(targets, dtype=float), (W.shape[0],))
    if W.shape[1] != int(np.prod(sizes)):
        raise ValueError(f"W has {W.shape[1]} columns, the sizes {sizes} {int(np.prod(sizes))} cells")
    pairs = _sorted_rows(np.column_stack([W, c]))
    for permutation in _value_permutations(sizes):
        if not np.array_equal(_sorted_rows(np.column_stack([W[:, permutation], c])), pairs):
            raise ValueError("the workload and its targets are not invariant under permuting attribute values")
    diagonals, norms, dimension = [], [], 0
    for _, projector in _residual_projectors(sizes):
        projected = W @ projector
        if np.abs(projected).max() > 1e-9 * max(1.0, np.abs(W).max()):
            diagonals.append(np.diag(projector))
            norms.append(np.einsum("ij,ij->i", projected, projected))
            dimension += int(round(np.trace(projector)))
    rank = np.linalg.matrix_rank(W)
    if dimension != rank:
        raise ValueError(f"the residual spaces W touches have dimension {dimension}, W has rank {rank}")
    lam = cp.Variable(len(norms), pos=True)
    t = cp.Variable()
    problem = cp.Problem(cp.Minimize(t), [np.column_stack(diagonals) @ lam <= t,
                                           np.column_stack(norms) @ cp.inv_pos(lam) <= c])
    # a duality gap of 1e-10 (Clarabel's default, 1e-8, left the value 3e-7 above the optimum on
    # seven binary attributes); feasibility at the default 1e-8: tighter ends "inaccurate"
    value = problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10)
    if problem.status != "optimal":
        raise RuntimeError(f"cvx_symmetric_marginal_alpha: solver status {problem.status}")
    return float(value)


def two_way_marginal_matrix(sizes) -> np.ndarray:
    """All 2-way marginals of attributes with these sizes (pairs in order, cells in C order,
    attribute 0 slowest): one 0/1 row per cell of each pair's marginal. Built here, without
    ``distfit``, to be compared with ``distfit.mathematics.workload.all_two_way_marginals``."""
    sizes = tuple(int(n) for n in sizes)
    rows = []
    for a, b in itertools.combinations(range(len(sizes)), 2):
        for u in range(sizes[a]):
            for v in range(sizes[b]):
                member = np.zeros(sizes, dtype=bool)
                index = [slice(None)] * len(sizes)
                index[a], index[b] = u, v
                member[tuple(index)] = True
                rows.append(member.ravel().astype(float))
    return np.array(rows)


@functools.lru_cache(maxsize=None)
def cvx_two_way_marginal_alpha(sizes: tuple[int, ...]) -> float:
    """:func:`cvx_symmetric_marginal_alpha` of all 2-way marginals (:func:`two_way_marginal_matrix`)
    with target 1, computed once per session (several test modules compare against it)."""
    return cvx_symmetric_marginal_alpha(two_way_marginal_matrix(sizes), 1.0, sizes)


#: How close cvx_symmetric_marginal_alpha's value is to the optimum, relative: solved to a
#: duality gap of 1e-10 with a feasibility tolerance of 1e-8, so 1e-7 leaves a margin of 10.
#: (Measured: within 1e-9 of distfit.solve's certified interval [lower_bound, alpha] on the
#: three 2-way workloads of docs/design.md section 2.)
SYMMETRIC_REFERENCE_REL = 1e-7


def prefix_matrix(d: int) -> np.ndarray:
    """Lower-triangular ones: the prefix workload (query j counts cells 0..j)."""
    return np.tril(np.ones((d, d)))


def mixed_marginal_workload():
    """A small marginal mix with prefix queries and per-query targets (age 8 x sex 2 x edu 4)."""
    import numpy as np

    from distfit.mathematics.domain import Domain
    from distfit.mathematics.workload import prefix_queries

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


#: The small data of the ``small_data`` fixture (tests/conftest.py): units, and units per chunk
#: (7 chunks, the last one short).
SMALL_UNITS, SMALL_CHUNK = 50, 8


def shared_disagreement(marginals) -> float:
    """The largest gap of two cliques' tables (``{clique: table}``, axes in clique order) on their
    shared attributes: 0 for the marginals of one distribution."""
    worst = 0.0
    for (r, a), (s, b) in itertools.combinations(marginals.items(), 2):
        shared = [x for x in r if x in s]
        if shared:
            ra = a.sum(axis=tuple(i for i, x in enumerate(r) if x not in shared))
            sb = b.sum(axis=tuple(i for i, x in enumerate(s) if x not in shared))
            worst = max(worst, float(np.abs(ra - sb).max()))
    return worst
