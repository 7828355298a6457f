"""Scale allocation: one scale per block under every query's target (docs/design.md section 2)."""
from __future__ import annotations

import itertools

import cvxpy as cp
import numpy as np
import pytest

import distfit.plan.allocate
from distfit.plan.allocate import allocate_rows, allocate_scales
from distfit.plan.composition import stitched_profile
from tests.plan.blocks import plan_residual, two_way
from tests.reference import SYMMETRIC_REFERENCE_REL, cvx_two_way_marginal_alpha


@pytest.mark.parametrize("sizes, count", [((3,) * 5, 16), ((2,) * 7, 29), ((4,) * 4, 11)])
def test_two_way_marginals_reach_the_convex_optimum(sizes, count):
    """docs/design.md section 2: on all 2-way marginals (unit targets) the residual blocks with
    allocated scales reach the optimum over all Gaussian mechanisms, computed here by an
    independent convex program (``cvx_two_way_marginal_alpha``, tests/reference.py): no lower
    than it (up to its accuracy, 1e-7) and above it by at most the block solves' gap
    tolerance, 1e-4."""
    domain, groups = two_way(sizes)
    blocks, solutions, allocation, workload = plan_residual(domain, groups)
    assert len(blocks) == count
    optimum = cvx_two_way_marginal_alpha(sizes)
    assert optimum * (1 - SYMMETRIC_REFERENCE_REL) <= allocation.alpha_bound <= optimum * (1 + 1e-4)
    assert allocation.lower_bound <= allocation.alpha_bound * (1 + 1e-9)
    assert allocation.lower_bound <= optimum * (1 + SYMMETRIC_REFERENCE_REL)
    # Sequential composition evaluated cell by cell equals the sum bound (flat block profiles).
    profile = stitched_profile(domain, [(b.attributes, s.profile / k) for b, s, k in zip(blocks, solutions, allocation.scales)])
    assert profile.max() == pytest.approx(allocation.alpha_bound, rel=1e-6)
    variances = np.zeros(workload.targets.size)
    for block, solution, scale in zip(blocks, solutions, allocation.scales):
        np.add.at(variances, block.query_index, solution.variances * scale)
    assert np.all(variances <= workload.targets * (1 + 1e-9))


def test_allocation_matches_a_convex_solver():
    rng = np.random.default_rng(7)
    alphas = rng.uniform(0.2, 2.0, 5)
    targets = rng.uniform(1.0, 3.0, 12)
    block_queries = []
    for _ in alphas:
        index = np.sort(rng.choice(12, size=6, replace=False))
        block_queries.append((index, rng.uniform(0.1, 1.0, 6)))
    allocation = allocate_scales(alphas, block_queries, targets)
    variance = np.zeros((12, 5))
    for column, (index, values) in enumerate(block_queries):
        variance[index, column] = values
    scales = cp.Variable(5, pos=True)
    problem = cp.Problem(cp.Minimize(cp.sum(cp.multiply(alphas, cp.inv_pos(scales)))), [variance @ scales <= targets])
    problem.solve(solver=cp.CLARABEL)
    assert allocation.alpha_bound == pytest.approx(problem.value, rel=1e-5)
    assert np.all(variance @ allocation.scales <= targets * (1 + 1e-12))


def test_allocation_is_certified_and_matches_a_convex_solver_at_scale():
    # Residual-block shaped: every query reaches a few blocks, targets and variances spread over
    # orders of magnitude, many constraints inactive at the optimum.
    rng = np.random.default_rng(11)
    num_blocks, num_queries = 60, 900
    alphas = rng.lognormal(0.0, 1.0, num_blocks)
    targets = rng.lognormal(1.0, 0.7, num_queries)
    variance = np.zeros((num_queries, num_blocks))
    for query in range(num_queries):
        reached = rng.choice(num_blocks, size=rng.integers(1, 6), replace=False)
        variance[query, reached] = rng.lognormal(-1.0, 1.5, reached.size)
    block_queries = [(np.flatnonzero(variance[:, b]), variance[variance[:, b] > 0, b]) for b in range(num_blocks)]
    allocation = allocate_scales(alphas, block_queries, targets, tolerance=1e-8)
    assert allocation.lower_bound <= allocation.alpha_bound <= allocation.lower_bound * (1 + 1e-8)
    assert np.all(variance @ allocation.scales <= targets * (1 + 1e-12))
    assert np.max(variance @ allocation.scales / targets) == pytest.approx(1.0, abs=1e-12)
    assert allocation.alpha_bound == pytest.approx(float(np.sum(alphas / allocation.scales)), rel=1e-12)
    scales = cp.Variable(num_blocks, pos=True)
    problem = cp.Problem(cp.Minimize(cp.sum(cp.multiply(alphas, cp.inv_pos(scales)))), [variance @ scales <= targets])
    problem.solve(solver=cp.CLARABEL)
    assert allocation.alpha_bound == pytest.approx(problem.value, rel=1e-6)


def test_allocation_with_leaf_blocks_matches_a_convex_solver():
    """Residual-shaped programs (allocate.allocate_rows): 2-way cliques of 12 attributes, each
    constraint row reaching its clique's own block (a leaf, eliminated first), the two 1-way
    blocks and the total; one extra leaf shares a row with another (only one is eliminated),
    random alphas and variances. Same optimum as cvxpy + Clarabel."""
    rng = np.random.default_rng(5)
    pairs = list(itertools.combinations(range(12), 2))
    num_blocks = 1 + 12 + len(pairs) + 1
    rows, cols = [], []
    for r, (a, b) in enumerate(pairs):
        for block in (0, 1 + a, 1 + b, 13 + r):
            rows.append(r)
            cols.append(block)
    rows.append(0)
    cols.append(num_blocks - 1)  # a second single-row block on row 0
    values = rng.lognormal(-1.0, 1.0, len(rows))
    alphas = rng.lognormal(0.0, 1.0, num_blocks)
    targets = rng.uniform(1.0, 4.0, len(pairs))
    allocation = allocate_rows(alphas, np.array(rows), np.array(cols), values, targets, tolerance=1e-9)
    variance = np.zeros((len(pairs), num_blocks))
    np.add.at(variance, (rows, cols), values)
    scales = cp.Variable(num_blocks, pos=True)
    problem = cp.Problem(cp.Minimize(cp.sum(cp.multiply(alphas, cp.inv_pos(scales)))), [variance @ scales <= targets])
    problem.solve(solver=cp.CLARABEL)
    assert allocation.alpha_bound == pytest.approx(problem.value, rel=1e-6)
    assert allocation.lower_bound <= allocation.alpha_bound <= allocation.lower_bound * (1 + 1e-9)
    assert np.all(variance @ allocation.scales <= targets * (1 + 1e-12))


@pytest.mark.parametrize("limit", [10**9, 0])
def test_iterative_and_dense_schur_solves_reach_the_same_certified_optimum(monkeypatch, limit):
    """All marginals up to 3-way of 9 attributes (3-way leaves eliminated, 46 non-leaf blocks):
    the Newton steps by conjugate gradients (``DENSE_SCHUR_LIMIT`` 0) and by the dense
    Cholesky (a limit above the size) both end at cvxpy + Clarabel's optimum, certified."""
    monkeypatch.setattr(distfit.plan.allocate, "DENSE_SCHUR_LIMIT", limit)
    rng = np.random.default_rng(11)
    cliques = [c for k in (1, 2, 3) for c in itertools.combinations(range(9), k)]
    subsets = sorted({s for c in cliques for r in range(len(c) + 1) for s in itertools.combinations(c, r)})
    index = {s: i for i, s in enumerate(subsets)}
    rows, cols = zip(*[(r, index[s]) for r, c in enumerate(cliques) for k in range(len(c) + 1)
                       for s in itertools.combinations(c, k)])
    values = rng.lognormal(-1.0, 1.0, len(rows))
    alphas = rng.lognormal(0.0, 1.0, len(subsets))
    targets = rng.uniform(1.0, 4.0, len(cliques))
    allocation = allocate_rows(alphas, np.array(rows), np.array(cols), values, targets, tolerance=1e-9)
    variance = np.zeros((len(cliques), len(subsets)))
    np.add.at(variance, (rows, cols), values)
    scales = cp.Variable(len(subsets), pos=True)
    problem = cp.Problem(cp.Minimize(cp.sum(cp.multiply(alphas, cp.inv_pos(scales)))), [variance @ scales <= targets])
    problem.solve(solver=cp.CLARABEL)
    assert allocation.alpha_bound == pytest.approx(problem.value, rel=1e-6)
    assert allocation.lower_bound <= allocation.alpha_bound <= allocation.lower_bound * (1 + 1e-9)
    assert np.all(variance @ allocation.scales <= targets * (1 + 1e-12))


def test_allocation_refuses_a_block_without_variance():
    with pytest.raises(ValueError, match="block 1 gives no query any variance"):
        allocate_scales([1.0, 2.0], [(np.array([0]), np.array([1.0])), (np.array([0]), np.array([0.0]))], np.ones(1))
    with pytest.raises(ValueError, match="block_alphas"):
        allocate_scales([0.0], [(np.array([0]), np.array([1.0]))], np.ones(1))
