"""Tests for distfit.solver.baselines (GM, HM and CA of the SM-II paper's section 7)."""
from __future__ import annotations

import math

import cvxpy as cp
import numpy as np
import pytest

from distfit.solver.baselines import (
    BaselineResult,
    compare_baselines,
    gaussian_mechanism,
    hierarchical_matrix,
    hierarchical_mechanism,
    optimal_matrix_mechanism,
    strategy_mechanism,
)
from distfit.mathematics.privacy import privacy_cost, privacy_profile

# prefix workload (c = 1) optimal privacy costs, docs/design.md section 1 / paper table 2
PREFIX_ALPHA = {2: 4.0 / 3.0, 4: 1.7586, 8: 2.2816, 16: 2.9053, 64: 4.458}


def prefix(d: int) -> np.ndarray:
    return np.tril(np.ones((d, d)))


def random_ranges(rng: np.random.Generator, d: int, m: int) -> np.ndarray:
    a, b = rng.integers(0, d, m), rng.integers(0, d, m)
    lo, hi = np.minimum(a, b), np.maximum(a, b)
    cells = np.arange(d)
    return ((cells >= lo[:, None]) & (cells <= hi[:, None])).astype(float)


def generic_variances(W: np.ndarray, A: np.ndarray, alpha: float) -> np.ndarray:
    """Reference formula: s^2 diag(W (A^T A)^+ W^T), s^2 = max col norm^2 / alpha."""
    s2 = np.max(np.sum(A * A, axis=0)) / alpha
    return s2 * np.diag(W @ np.linalg.pinv(A.T @ A) @ W.T)


# ---------------------------------------------------------------------------- closed forms
def test_gaussian_identity_closed_form():
    c = np.array([0.5, 1.0, 2.0, 4.0, 0.25])
    alpha = 1.7
    res = gaussian_mechanism(np.eye(5), c, alpha)
    assert isinstance(res, BaselineResult)
    assert res.name == "gaussian" and res.alpha == alpha and res.strategy_shape == (5, 5)
    np.testing.assert_allclose(res.variances, np.full(5, 1 / alpha), rtol=1e-14)
    assert res.max_ratio == pytest.approx(np.max(1 / alpha / c), rel=1e-14)
    with pytest.raises(ValueError):
        res.variances[0] = 0.0  # results are read-only


def test_gaussian_plain_vs_least_squares():
    # duplicated query: least squares averages the two noisy copies
    W = np.array([[1.0, 1.0], [1.0, 1.0], [1.0, 0.0]])
    alpha = 2.0
    plain = gaussian_mechanism(W, np.ones(3), alpha, least_squares=False)
    ls = gaussian_mechanism(W, np.ones(3), alpha)
    s2 = 3.0 / alpha  # column 1 has squared norm 3
    np.testing.assert_allclose(plain.variances, s2)
    np.testing.assert_allclose(ls.variances, s2 * np.diag(W @ np.linalg.pinv(W)), rtol=1e-12)
    assert np.all(ls.variances <= plain.variances + 1e-12)


def test_matrix_mechanism_2x2_theorem1():
    """Paper section 5.1.1, Theorem 1: sum-squared optimum at privacy cost beta^2 = alpha."""
    W = np.array([[1.0, 1.0], [1.0, 0.0]])
    alpha = 4.0 / 3.0
    res = optimal_matrix_mechanism(W, [1.0, 1.0], alpha)
    a = (1 + 1 / math.sqrt(5)) / alpha
    dd = (0.5 + 0.3 * math.sqrt(5)) / alpha
    np.testing.assert_allclose(res.variances, [a, dd], atol=1e-6)
    assert res.max_ratio == pytest.approx((1 + 1 / math.sqrt(5)) * 3 / 4, abs=1e-4)
    assert res.max_ratio == pytest.approx(1.0854, abs=1e-4)
    assert res.total_variance == pytest.approx((1.5 + math.sqrt(5) / 2) / alpha, rel=1e-6)
    # the theorem's covariance (answers W x + N(0, Sigma)) indeed costs alpha
    sigma = np.array([[a, (1 + 1 / math.sqrt(5)) / (2 * alpha)],
                      [(1 + 1 / math.sqrt(5)) / (2 * alpha), dd]])
    np.testing.assert_allclose(sigma * alpha, [[1.45, 0.72], [0.72, 1.17]], atol=6e-3)
    assert privacy_cost(sigma, W) == pytest.approx(alpha, rel=1e-9)
    # SM-II (max-variance optimum) would give 1.0: the total-error optimum is 1.085x worse
    assert res.max_ratio > 1.08


# ---------------------------------------------------------------------------- matrix mechanism
def _cvxpy_total_error(W: np.ndarray) -> float:
    m, d = W.shape
    X = cp.Variable((d, d), symmetric=True)
    Y = cp.Variable((m, m), symmetric=True)
    block = cp.bmat([[Y, W], [W.T, X]])
    cons = [(block + block.T) / 2 >> 0, cp.diag(X) <= 1]
    prob = cp.Problem(cp.Minimize(cp.trace(Y)), cons)
    for solver in ("CLARABEL", "SCS"):
        if solver in cp.installed_solvers():
            prob.solve(solver=solver)
            break
    assert prob.status in ("optimal", "optimal_inaccurate")
    return float(prob.value)


@pytest.mark.parametrize("seed", range(4))
def test_matrix_mechanism_matches_cvxpy(seed):
    rng = np.random.default_rng(seed)
    d = int(rng.integers(3, 9))
    if seed % 2 == 0:
        W = rng.standard_normal((d + 2, d))
    else:
        W = np.vstack([random_ranges(rng, d, 2 * d), np.eye(d)[rng.permutation(d)[:2]]])
    assert np.linalg.matrix_rank(W) == d
    alpha = 1.3
    res = optimal_matrix_mechanism(W, np.ones(W.shape[0]), alpha)
    reference = _cvxpy_total_error(W)  # min tr(W X^-1 W^T), diag X <= 1  (s^2 = 1/alpha)
    assert res.total_variance * alpha == pytest.approx(reference, rel=5e-3)
    assert res.info["total_variance_lower_bound"] * alpha == pytest.approx(reference, rel=5e-3)


@pytest.mark.parametrize("seed", range(3))
def test_matrix_mechanism_primal_meets_dual(seed):
    rng = np.random.default_rng(100 + seed)
    d = 6 + 3 * seed
    W = random_ranges(rng, d, 2 * d)
    c = rng.uniform(1, 10, W.shape[0])
    res = optimal_matrix_mechanism(W, c, 2.0)
    bound = res.info["total_variance_lower_bound"]
    assert res.total_variance >= bound * (1 - 1e-9)  # weak duality
    assert res.total_variance <= bound * 1.01
    assert res.info["duality_gap"] < 1e-4
    assert res.max_ratio == pytest.approx(np.max(res.variances / c))


def test_matrix_mechanism_rank_deficient_and_zero_columns():
    # two 1-way marginals of a 3x4 table plus an unused cell: rank 6 < d = 13
    W = np.vstack([np.kron(np.eye(3), np.ones((1, 4))), np.kron(np.ones((1, 3)), np.eye(4))])
    W = np.hstack([W, np.zeros((W.shape[0], 1))])
    c = np.ones(W.shape[0])
    mm = optimal_matrix_mechanism(W, c, 1.0)
    gm = gaussian_mechanism(W, c, 1.0)
    hm = hierarchical_mechanism(W, c, 1.0)
    assert mm.strategy_shape[1] == 13 and mm.strategy_shape[0] <= 6
    assert mm.info["duality_gap"] < 1e-6
    # total-error optimal among all strategy mechanisms
    assert mm.total_variance <= gm.total_variance * (1 + 1e-9)
    assert mm.total_variance <= hm.total_variance * (1 + 1e-9)


# ---------------------------------------------------------------------------- hierarchical
def test_hierarchical_matrix_small_tree():
    expected = np.array([
        [1, 1, 1, 1],
        [1, 1, 0, 0],
        [0, 0, 1, 1],
        [1, 0, 0, 0],
        [0, 1, 0, 0],
        [0, 0, 1, 0],
        [0, 0, 0, 1],
    ], dtype=float)
    np.testing.assert_array_equal(hierarchical_matrix(4, 2), expected)
    # ragged tree: d = 5, b = 2 -> levels of 1, 2, 3, 5 nodes; every column in 4 nodes
    H = hierarchical_matrix(5, 2)
    assert H.shape == (11, 5)
    np.testing.assert_array_equal(H.sum(axis=0), np.full(5, 4.0))
    np.testing.assert_array_equal(H[0], np.ones(5))
    np.testing.assert_array_equal(H[1:3], [[1, 1, 1, 1, 0], [0, 0, 0, 0, 1]])
    np.testing.assert_array_equal(hierarchical_matrix(1, 3), [[1.0]])
    assert hierarchical_matrix(10, 16).shape == (11, 10)


def test_hierarchical_variances_match_generic_formula():
    W = prefix(4)
    alpha = PREFIX_ALPHA[4]
    H = hierarchical_matrix(4, 2)
    res = hierarchical_mechanism(W, np.ones(4), alpha, branching=2)
    assert res.strategy_shape == (7, 4) and res.info["branching"] == 2
    np.testing.assert_allclose(res.variances, generic_variances(W, H, alpha), rtol=1e-12)
    same = strategy_mechanism(W, np.ones(4), alpha, H, name="tree")
    np.testing.assert_allclose(same.variances, res.variances, rtol=1e-14)
    assert same.name == "tree"
    # the noise s^2 = 3 / alpha on the 7 tree nodes costs exactly alpha
    s2 = 3.0 / alpha
    assert privacy_cost(s2 * np.eye(7), H) == pytest.approx(alpha, rel=1e-12)
    np.testing.assert_allclose(privacy_profile(s2 * np.eye(7), H), alpha, rtol=1e-12)


def test_hierarchical_default_picks_best_branching():
    rng = np.random.default_rng(7)
    d = 40
    W = random_ranges(rng, d, 2 * d)
    c = rng.uniform(1, 10, 2 * d)
    best = hierarchical_mechanism(W, c, 3.0)
    each = [hierarchical_mechanism(W, c, 3.0, branching=b).max_ratio for b in range(2, 17)]
    assert best.max_ratio == pytest.approx(min(each), rel=1e-12)
    assert best.info["branching"] == 2 + int(np.argmin(each))


# ---------------------------------------------------------------------------- generic mechanism
def test_strategy_mechanism_rank_deficient():
    # W = two totals over disjoint halves (rank 2, d = 4); strategy measures the two halves
    W = np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]])
    A = np.array([[1.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 1.0]])
    res = strategy_mechanism(W, np.ones(3), 2.0, A)
    np.testing.assert_allclose(res.variances, [0.5, 0.5, 1.0], rtol=1e-12)
    # tall rank-deficient strategy (QR falls back to the truncated SVD)
    A2 = np.vstack([A, A, 2 * A])
    res2 = strategy_mechanism(W, np.ones(3), 2.0, A2)
    np.testing.assert_allclose(res2.variances, generic_variances(W, A2, 2.0), rtol=1e-10)
    with pytest.raises(ValueError, match="strategy"):
        strategy_mechanism(np.eye(4), np.ones(4), 2.0, A)


# ---------------------------------------------------------------------------- paper-style runs
def test_prefix_64_ordering_like_paper():
    d = 64
    W = prefix(d)
    res = compare_baselines(W, np.ones(d), PREFIX_ALPHA[d])
    assert set(res) == {"gaussian", "hierarchical", "matrix_mechanism"}
    gm, hm, mm = res["gaussian"], res["hierarchical"], res["matrix_mechanism"]
    # alpha is SM-II's optimum (to 4 digits): no linear Gaussian mechanism does better
    assert gm.max_ratio > 1 and hm.max_ratio > 1 and mm.max_ratio > 1 - 1e-3
    assert gm.max_ratio == pytest.approx(d / PREFIX_ALPHA[d], rel=1e-12)  # s^2 = 64 / alpha
    assert mm.max_ratio < hm.max_ratio < gm.max_ratio
    assert gm.max_ratio > 10 and 1.5 < hm.max_ratio < 5


@pytest.mark.parametrize("d", [2, 4, 8, 16])
def test_prefix_ratios_at_least_one(d):
    res = compare_baselines(prefix(d), np.ones(d), PREFIX_ALPHA[d])
    for r in res.values():
        assert r.max_ratio > 1 - 1e-3
        assert r.alpha == PREFIX_ALPHA[d]


# ---------------------------------------------------------------------------- validation
FUNCS = [
    gaussian_mechanism,
    hierarchical_mechanism,
    optimal_matrix_mechanism,
    compare_baselines,
    lambda W, c, a: strategy_mechanism(W, c, a, np.eye(3)),
]


@pytest.mark.parametrize("func", FUNCS)
@pytest.mark.parametrize("W, c, alpha, arg", [
    (np.array([[1.0, np.nan, 0.0]]), [1.0], 1.0, "W"),
    (np.array([[1.0, np.inf, 0.0]]), [1.0], 1.0, "W"),
    (np.ones(3), [1.0], 1.0, "W"),
    (np.eye(3), [1.0, 1.0], 1.0, "targets"),
    (np.eye(3), [1.0, 0.0, 1.0], 1.0, "targets"),
    (np.eye(3), [1.0, -2.0, 1.0], 1.0, "targets"),
    (np.eye(3), [1.0, np.nan, 1.0], 1.0, "targets"),
    (np.eye(3), np.ones(3), 0.0, "alpha"),
    (np.eye(3), np.ones(3), -1.0, "alpha"),
    (np.eye(3), np.ones(3), np.nan, "alpha"),
])
def test_bad_inputs(func, W, c, alpha, arg):
    with pytest.raises(ValueError, match=rf"^{arg}\b"):
        func(W, c, alpha)


def test_bad_strategy_and_branching():
    with pytest.raises(ValueError, match="strategy"):
        strategy_mechanism(np.eye(3), np.ones(3), 1.0, np.eye(4))
    with pytest.raises(ValueError, match="strategy"):
        strategy_mechanism(np.eye(3), np.ones(3), 1.0, np.full((3, 3), np.nan))
    with pytest.raises(ValueError, match="branching"):
        hierarchical_mechanism(np.eye(3), np.ones(3), 1.0, branching=1)
    with pytest.raises(ValueError, match="branching"):
        hierarchical_matrix(3, 1)
