"""Tests for ``distfit.solve`` (docs/design.md sections 1-2): Problem 1 and Problem 2 on one block.

Optimal privacy costs are checked against published values (the paper's Table 2, the 2x2
closed form) and against independent convex programs solved by cvxpy (``tests/reference.py``:
the SDP of Problem 1, and its symmetry reduction for docs/design.md's 2-way marginal workloads),
which share no code with the library.
"""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

import distfit
from distfit.mathematics import privacy, workload as wl
from distfit.mathematics.bounds import certified_bound
from distfit.solver.linalg import dominant_rows
from distfit.solver import solve as solve_module
from distfit.solver.convergence import ConvergenceError
from distfit.solver.solve import BlockSolution, WarmStart, solve
from distfit.plan.job import planned_decomposition
from distfit.spec.parse import load_spec

from tests.alignment import unaligned
from tests.reference import (
    SYMMETRIC_REFERENCE_REL,
    cvx_optimal_alpha,
    cvx_symmetric_marginal_alpha,
    cvx_two_way_marginal_alpha,
    prefix_matrix,
    two_way_marginal_matrix,
)

ROOT = Path(__file__).resolve().parents[2]


# --------------------------------------------------------------------------------------------
# Small workloads shared by several tests (all small enough for the SDP reference)
# --------------------------------------------------------------------------------------------

def _random_pm1(d, m, seed):
    return wl.random_workload(d, m, seed=seed)


def _rank_deficient(seed):
    """10 x 8 workload of rank 4: products of random integer factors."""
    rng = np.random.default_rng(seed)
    return rng.integers(-2, 3, size=(10, 4)).astype(float) @ rng.integers(0, 2, size=(4, 8)).astype(float)


def _small_marginals():
    domain = wl.Domain(("a", "b", "c"), (2, 3, 2))
    return np.vstack([
        wl.marginal_queries(domain, ("a", "b")),
        wl.marginal_queries(domain, ("c",)),
        wl.marginal_queries(domain, ()),  # the total
    ])


def _cases():
    """(id, W, targets) for the convex-solver agreement test."""
    cases = []
    for seed in (0, 1, 2):
        w = wl.random_range_workload(8, 11, seed=seed, targets="random")
        cases.append((f"ranges-d8-seed{seed}", w.matrix, w.targets))
    w = wl.random_range_workload(10, 6, seed=7, targets="random")  # m < d: rank-deficient
    cases.append(("ranges-d10-m6", w.matrix, w.targets))
    for seed in (3, 4):
        w = _random_pm1(7, 9, seed)
        cases.append((f"pm1-seed{seed}", w.matrix, np.random.default_rng(seed).uniform(1, 10, 9)))
    cases.append(("pm1-wide", _random_pm1(9, 5, 5).matrix, np.ones(5)))
    cases.append(("rank4-seed11", _rank_deficient(11), np.random.default_rng(11).uniform(1, 10, 10)))
    W = _small_marginals()
    cases.append(("marginals-2x3x2", W, np.linspace(1.0, 3.0, W.shape[0])))
    w = wl.all_two_way_marginals((2, 3, 2))
    cases.append(("two-way-2x3x2", w.matrix, w.targets))
    return cases


CASES = _cases()
CASE_IDS = [c[0] for c in CASES]


def _assert_cholesky(sigma):
    assert np.allclose(sigma, sigma.T, rtol=0, atol=1e-12 * np.abs(sigma).max())
    np.linalg.cholesky(sigma)  # raises LinAlgError unless positive definite


# --------------------------------------------------------------------------------------------
# Published values
# --------------------------------------------------------------------------------------------

TABLE2 = {2: 1.3333, 4: 1.7586, 8: 2.2816, 16: 2.9053, 64: 4.458}


@pytest.mark.parametrize("basis", ["prefix", "identity", "auto"])
@pytest.mark.parametrize("d", sorted(TABLE2))
def test_prefix_table2(d, basis):
    """Paper Table 2: the prefix workload with unit targets."""
    solution = solve(prefix_matrix(d), np.ones(d), basis=basis)
    assert solution.alpha == pytest.approx(TABLE2[d], rel=2e-3)
    assert solution.lower_bound <= solution.alpha
    assert solution.basis_kind == basis
    assert not solution.basis_reduced


@pytest.mark.parametrize("g", [0.25, 1.0, 3.7])
def test_two_by_two_closed_form(g):
    """W = [[1,1],[1,0]], c = (g, g): alpha = 4 / (3 g); in the basis B = W, Sigma = g [[1,.5],[.5,1]]."""
    W = np.array([[1.0, 1.0], [1.0, 0.0]])
    solution = solve(W, [g, g], gap_tolerance=1e-10)
    assert solution.alpha == pytest.approx(4.0 / (3.0 * g), rel=1e-6)

    in_w = solve(W, [g, g], basis=W, gap_tolerance=1e-10)
    assert in_w.basis_kind == "custom"
    np.testing.assert_allclose(in_w.basis, W)
    np.testing.assert_allclose(in_w.recon, np.eye(2), atol=1e-12)
    np.testing.assert_allclose(in_w.sigma, g * np.array([[1.0, 0.5], [0.5, 1.0]]), rtol=1e-6, atol=1e-6 * g)
    assert in_w.alpha == pytest.approx(4.0 / (3.0 * g), rel=1e-6)
    # both queries are tight at the optimum
    np.testing.assert_allclose(in_w.variances, [g, g], rtol=1e-6)


# --------------------------------------------------------------------------------------------
# Agreement with the independent SDP; certificate validity
# --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name,W,targets", CASES, ids=CASE_IDS)
def test_matches_convex_solver(name, W, targets, cvx_alphas):
    reference = cvx_alphas[name]
    solution = solve(W, targets)
    assert solution.alpha == pytest.approx(reference, rel=1e-3)
    # the certificate is a valid lower bound (weak duality) ...
    assert solution.lower_bound <= reference * (1.0 + 1e-6)
    # ... and the plan is feasible, so it cannot beat the optimum
    assert solution.alpha >= reference * (1.0 - 1e-6)


# --------------------------------------------------------------------------------------------
# Properties of every solution
# --------------------------------------------------------------------------------------------

def _check_solution(solution: BlockSolution, W, targets, scale=1.0):
    W = np.asarray(W, dtype=float)
    targets = np.broadcast_to(np.asarray(targets, dtype=float), (W.shape[0],))
    assert isinstance(solution, BlockSolution)
    # every target met (the solver divides by the largest ratio and 1e-12 more)
    assert np.all(solution.variances <= scale * targets * (1.0 + 1e-12)), (solution.variances / targets).max()
    _assert_cholesky(solution.sigma)
    assert solution.alpha == solution.profile.max()
    np.testing.assert_allclose(solution.profile, privacy.privacy_profile(solution.sigma, solution.basis),
                               rtol=1e-9, atol=1e-12 * solution.alpha)
    recon, sigma = solution.recon, solution.sigma
    np.testing.assert_allclose(solution.variances, np.diag(recon @ sigma @ recon.T), rtol=1e-9)
    np.testing.assert_allclose(solution.recon @ solution.basis, W, atol=1e-9 * np.abs(W).max())
    k = solution.basis.shape[0]
    assert np.linalg.matrix_rank(solution.basis) == k == np.linalg.matrix_rank(W)
    assert sigma.shape == (k, k) and recon.shape == (W.shape[0], k)
    assert 0.0 <= solution.gap <= 1e-3
    assert solution.lower_bound > 0
    assert solution.rho == pytest.approx(solution.alpha / 2)
    _check_certificate(solution, W, targets)


def _check_certificate(solution: BlockSolution, W, targets):
    """The returned weights are the certificate of ``lower_bound`` at the solve's targets
    (whatever the budget): distributions over the cells and the query rows, whose bound
    (``certified_bound``) is ``lower_bound`` bit for bit, and which the definition - the
    nuclear norm of ``diag(sqrt(v / c)) W diag(sqrt(u))`` by a full SVD of W itself, no basis -
    confirms to 1e-9."""
    u, v = solution.cell_weights, solution.query_weights
    assert u.shape == (W.shape[1],) and v.shape == (W.shape[0],)
    assert u.min() >= 0 and v.min() >= 0
    assert u.sum() == pytest.approx(1, abs=1e-12) and v.sum() == pytest.approx(1, abs=1e-12)
    scaled = solution.recon / np.sqrt(targets)[:, None]
    assert certified_bound(solution.basis, scaled, u, v) == solution.lower_bound
    assert np.all(v[np.setdiff1d(np.arange(v.size), dominant_rows(scaled))] == 0)  # rows implied by others
    definition = np.linalg.norm(np.sqrt(v / targets)[:, None] * W * np.sqrt(u), "nuc") ** 2
    assert solution.lower_bound <= definition * (1 + 1e-12)  # the certified value is never above it
    assert solution.lower_bound == pytest.approx(definition, rel=1e-9)


@pytest.mark.parametrize("name,W,targets", CASES, ids=CASE_IDS)
def test_solution_properties(name, W, targets):
    solution = solve(W, targets)
    _check_solution(solution, W, targets)
    assert solution.variance_scale == 1.0
    assert solution.budget is None


@pytest.mark.parametrize("name,W,targets", CASES[:1] + CASES[3:4] + CASES[-3:], ids=CASE_IDS[:1] + CASE_IDS[3:4] + CASE_IDS[-3:])
def test_profile_invariant_under_change_of_basis(name, W, targets):
    """B' = T B, Sigma' = T Sigma T^T, L' = L T^-1 is the same mechanism: same profile, same variances."""
    solution = solve(W, targets)
    k = solution.basis.shape[0]
    rng = np.random.default_rng(42)
    T = rng.standard_normal((k, k)) + 3.0 * np.eye(k)
    assert abs(np.linalg.det(T)) > 1e-3
    basis2 = T @ solution.basis
    sigma2 = T @ solution.sigma @ T.T
    recon2 = solution.recon @ np.linalg.inv(T)
    np.testing.assert_allclose(privacy.privacy_profile(sigma2, basis2), solution.profile,
                               rtol=1e-6, atol=1e-9 * solution.alpha)
    np.testing.assert_allclose(np.diag(recon2 @ sigma2 @ recon2.T), solution.variances, rtol=1e-6)
    np.testing.assert_allclose(recon2 @ basis2, W, atol=1e-8 * np.abs(W).max())


def _custom_basis(W, seed):
    """A random invertible mix of an orthonormal row basis of W (so it spans W's rows exactly)."""
    from tests.reference import orthonormal_row_basis

    row_basis = orthonormal_row_basis(W)
    k = row_basis.shape[0]
    T = np.random.default_rng(seed).standard_normal((k, k)) + 2.0 * np.eye(k)
    return T @ row_basis


@pytest.mark.parametrize("name,W,targets", CASES[:1] + CASES[3:4] + CASES[-3:], ids=CASE_IDS[:1] + CASE_IDS[3:4] + CASE_IDS[-3:])
def test_alpha_does_not_depend_on_basis(name, W, targets):
    solutions = {kind: solve(W, targets, basis=kind) for kind in ("auto", "identity", "prefix")}
    solutions["custom"] = solve(W, targets, basis=_custom_basis(W, 5))
    for kind, solution in solutions.items():
        _check_solution(solution, W, targets)
        assert solution.basis_kind == kind
    # every plan costs at least every proven lower bound, and they agree within the gaps
    best_bound = max(s.lower_bound for s in solutions.values())
    for solution in solutions.values():
        assert solution.alpha >= best_bound * (1.0 - 1e-12)
        assert solution.alpha <= best_bound * (1.0 + solution.gap) * (1.0 + 1e-12)
    alphas = [s.alpha for s in solutions.values()]
    assert max(alphas) / min(alphas) - 1.0 <= max(s.gap for s in solutions.values()) + 1e-12


def test_custom_square_basis_of_full_rank_workload():
    """A random invertible d x d basis for a full-column-rank workload is used as given."""
    w = wl.random_range_workload(8, 11, seed=0, targets="random")
    assert np.linalg.matrix_rank(w.matrix) == 8
    T = np.random.default_rng(9).standard_normal((8, 8)) + 2.0 * np.eye(8)
    solution = solve(w.matrix, w.targets, basis=T)
    _check_solution(solution, w.matrix, w.targets)
    assert not solution.basis_reduced
    np.testing.assert_array_equal(solution.basis, T)
    assert solution.alpha == pytest.approx(solve(w.matrix, w.targets).alpha, rel=2e-3)


# --------------------------------------------------------------------------------------------
# Rank-deficient (marginal) workloads and untouched cells
# --------------------------------------------------------------------------------------------

def test_two_way_marginals_are_reduced():
    w = wl.all_two_way_marginals((2, 3, 2))
    rank = np.linalg.matrix_rank(w.matrix)
    assert rank < w.num_cells
    for kind in ("identity", "prefix", "auto"):
        solution = solve(w.matrix, w.targets, basis=kind)
        assert solution.basis.shape == (rank, w.num_cells)
        assert solution.basis_reduced is (kind != "auto")
        _check_solution(solution, w.matrix, w.targets)


@pytest.mark.parametrize("sizes", [(3,) * 5, (2,) * 7, (4,) * 4], ids=["five-3", "seven-2", "four-4"])
def test_two_way_marginals_reach_the_convex_optimum(sizes):
    """docs/design.md section 2: all 2-way marginals, unit targets. The optimum comes from an
    independent convex program on the same workload (``cvx_two_way_marginal_alpha``: Problem 1
    reduced by the workload's symmetry, ``tests/reference.py``). The solve's certified interval
    [lower_bound, alpha] must hold it, up to the reference's own accuracy
    (``SYMMETRIC_REFERENCE_REL``, 1e-7), and alpha may exceed it by at most the solve's default
    gap tolerance, 1e-4 (the "within 0.01%" of the README)."""
    w = wl.all_two_way_marginals(sizes)
    np.testing.assert_array_equal(w.matrix, two_way_marginal_matrix(sizes))  # the reference's workload
    optimum = cvx_two_way_marginal_alpha(sizes)
    solution = solve(w.matrix, w.targets)
    assert solution.lower_bound <= optimum * (1 + SYMMETRIC_REFERENCE_REL)
    assert optimum * (1 - SYMMETRIC_REFERENCE_REL) <= solution.alpha <= optimum * (1 + 1e-4)
    assert solution.basis.shape[0] == np.linalg.matrix_rank(w.matrix) < w.num_cells
    assert np.all(solution.variances <= w.targets)


@pytest.mark.parametrize("sizes, targets", [((2,) * 4, [1.0] * 6), ((2, 3, 2), [1.0, 2.0, 3.0])],
                         ids=["four-2", "2x3x2-per-marginal-targets"])
def test_symmetric_marginal_reference_equals_the_sdp(sizes, targets):
    """The symmetry-reduced program behind the 2-way figures is exact: it equals the unreduced
    SDP (``cvx_optimal_alpha``, Clarabel at its default 1e-8 gap, hence rel 1e-6) on workloads
    small enough for the SDP (well under a second each), with unequal attribute sizes and one
    target per marginal; and it refuses a workload whose targets break the symmetry."""
    W = two_way_marginal_matrix(sizes)
    per_marginal = [sizes[a] * sizes[b] for a in range(len(sizes)) for b in range(a + 1, len(sizes))]
    c = np.repeat(targets, per_marginal)
    assert cvx_symmetric_marginal_alpha(W, c, sizes) == pytest.approx(cvx_optimal_alpha(W, c), rel=1e-6)
    with pytest.raises(ValueError, match="not invariant"):
        cvx_symmetric_marginal_alpha(W, np.arange(1.0, W.shape[0] + 1), sizes)


def _untouched_workload(seed=0):
    rng = np.random.default_rng(seed)
    W = rng.standard_normal((5, 8))
    W[:, [1, 4]] = 0.0
    return W


@pytest.mark.parametrize("kind", ["auto", "identity", "prefix"])
def test_untouched_cells_cost_nothing(kind):
    W = _untouched_workload()
    solution = solve(W, 1.0, basis=kind)
    _check_solution(solution, W, np.ones(5))
    assert np.all(solution.profile[[1, 4]] <= 1e-20 * solution.alpha)
    assert np.all(solution.profile[[0, 2, 3, 5, 6, 7]] > 1e-3 * solution.alpha)
    # zero columns at the end of the domain (the paper's layout) come out exactly zero
    W2 = np.array([[1.0, 1, 0, 0, 0], [0, 1, 1, 0, 0], [1, 1, 1, 0, 0]])
    tail = solve(W2, 1.0, basis=kind)
    assert np.all(tail.profile[3:] <= 1e-20 * tail.alpha)


@pytest.mark.parametrize("kind", ["auto", "identity", "prefix"])
def test_untouched_cells_profile_exactly_zero(kind):
    W = _untouched_workload()
    solution = solve(W, 1.0, basis=kind)
    assert np.all(solution.basis[:, [1, 4]] == 0.0)
    assert np.all(solution.profile[[1, 4]] == 0.0)


def test_lower_bound_is_valid_when_many_cells_are_slack():
    """W = I_150, c = (1, 100, ..., 100): alpha* = 1 exactly (query 0 reads cell 0 alone, so
    p_0 >= 1 / Sigma_00 >= 1, and Sigma = diag(c) attains it)."""
    d = 150
    targets = np.full(d, 100.0)
    targets[0] = 1.0
    solution = solve(np.eye(d), targets)
    assert solution.alpha == pytest.approx(1.0, rel=1e-9)
    assert solution.lower_bound <= 1.0 * (1.0 + 1e-9)
    assert solution.gap >= 0.0


# --------------------------------------------------------------------------------------------
# Problem 2: budgets
# --------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def budget_case():
    w = wl.random_range_workload(8, 11, seed=1, targets="random")
    return w.matrix, w.targets, solve(w.matrix, w.targets)


@pytest.mark.parametrize("rho", [0.1, 0.5, 3.0])
def test_budget_rho(budget_case, rho):
    W, targets, problem1 = budget_case
    solution = solve(W, targets, budget={"rho": rho})
    assert solution.alpha == pytest.approx(2 * rho, rel=1e-12)
    assert solution.rho == pytest.approx(rho, rel=1e-12)
    assert solution.variance_scale == pytest.approx(problem1.alpha / (2 * rho), rel=1e-12)
    np.testing.assert_allclose(solution.variances, solution.variance_scale * problem1.variances, rtol=1e-12)
    np.testing.assert_allclose(solution.profile, problem1.profile / solution.variance_scale, rtol=1e-12)
    assert solution.lower_bound == problem1.lower_bound and solution.gap == problem1.gap
    # the certificate speaks about Problem 1 at the targets, not at the scaled variances
    np.testing.assert_array_equal(solution.cell_weights, problem1.cell_weights)
    np.testing.assert_array_equal(solution.query_weights, problem1.query_weights)
    assert solution.budget == privacy.Budget(rho=rho)
    _check_solution(solution, W, targets, scale=solution.variance_scale)


@pytest.mark.parametrize("eps,delta", [(1.0, 1e-6), (0.3, 1e-9), (4.0, 1e-5)])
def test_budget_epsilon_delta(budget_case, eps, delta):
    W, targets, problem1 = budget_case
    solution = solve(W, targets, budget=(eps, delta))
    budget_alpha = privacy.alpha_for_budget(eps, delta)
    assert solution.alpha == pytest.approx(budget_alpha, rel=1e-12)
    assert solution.variance_scale == pytest.approx(problem1.alpha / budget_alpha, rel=1e-12)
    np.testing.assert_allclose(solution.variances, solution.variance_scale * problem1.variances, rtol=1e-12)
    # the plan spends no more than the budget
    assert privacy.delta_for_epsilon(solution.alpha, eps) <= delta * (1 + 1e-9)
    same = solve(W, targets, budget={"epsilon": eps, "delta": delta})
    assert same.alpha == solution.alpha


def test_budget_alpha(budget_case):
    W, targets, problem1 = budget_case
    for a in (0.5 * problem1.alpha, 2.0 * problem1.alpha):
        solution = solve(W, targets, budget={"alpha": a})
        assert solution.alpha == pytest.approx(a, rel=1e-12)
        assert solution.variance_scale == pytest.approx(problem1.alpha / a, rel=1e-12)
        np.testing.assert_allclose(solution.variances, solution.variance_scale * problem1.variances, rtol=1e-12)
    generous = solve(W, targets, budget={"alpha": 2.0 * problem1.alpha})
    assert generous.variance_scale == pytest.approx(0.5, rel=1e-12)
    assert np.all(generous.variances <= targets)


# --------------------------------------------------------------------------------------------
# Bad input
# --------------------------------------------------------------------------------------------

W_OK = prefix_matrix(4)


@pytest.mark.parametrize("kwargs,match", [
    (dict(W=W_OK, targets=[1, 1, np.nan, 1]), r"^targets: "),
    (dict(W=W_OK, targets=[1, 1, np.inf, 1]), r"^targets: "),
    (dict(W=W_OK, targets=[1, 0, 1, 1]), r"^targets: "),
    (dict(W=W_OK, targets=[1, -2, 1, 1]), r"^targets: "),
    (dict(W=W_OK, targets=[1, 1, 1]), r"^targets: "),
    (dict(W=W_OK, targets=np.ones((4, 1))), r"^targets: "),
    (dict(W=np.where(W_OK == 1, np.nan, 0.0), targets=1.0), r"^W: "),
    (dict(W=np.where(W_OK == 1, np.inf, 0.0), targets=1.0), r"^W: "),
    (dict(W=np.ones(4), targets=1.0), r"^W: "),
    (dict(W=W_OK, targets=1.0, basis=np.eye(4)[:3]), r"^basis: "),
    (dict(W=W_OK, targets=1.0, basis="fourier"), r"^basis: "),
    (dict(W=W_OK, targets=1.0, basis=np.eye(5)), r"^basis: "),
    (dict(W=W_OK, targets=1.0, budget={"rho": 1.0, "alpha": 2.0}), r"^budget: given two ways"),
    (dict(W=W_OK, targets=1.0, budget=(0.0, 1e-6)), r"^budget\.epsilon must be > 0"),
    (dict(W=W_OK, targets=1.0, budget=(-1.0, 1e-6)), r"^budget\.epsilon must be > 0"),
    (dict(W=W_OK, targets=1.0, budget=(1.0, 0.0)), r"^budget\.delta must be in \(0, 1\)"),
    (dict(W=W_OK, targets=1.0, budget=(1.0, 1.0)), r"^budget\.delta must be in \(0, 1\)"),
    (dict(W=W_OK, targets=1.0, budget={"epsilon": 1.0, "delta": 1.5}), r"^budget\.delta must be in \(0, 1\)"),
    (dict(W=W_OK, targets=1.0, method="newton"), r"^method: unknown method"),
    (dict(W=np.zeros((3, 3)), targets=1.0), r"^W: every entry is zero"),
    (dict(W=[[1.0, 0.0], [0.0, 0.0]], targets=1.0), r"^W: row 1 is all zeros"),
    (dict(W=[["a", "b"]], targets=1.0), r"^W: not a numeric matrix"),
    (dict(W=W_OK, targets="many"), r"^targets: not numeric"),
    (dict(W=W_OK, targets=1.0, gap_tolerance=0.0), r"^gap_tolerance: "),
    (dict(W=W_OK, targets=1.0, max_gap=np.nan), r"^max_gap: "),
], ids=[
    "targets-nan", "targets-inf", "targets-zero", "targets-negative", "targets-length", "targets-2d",
    "W-nan", "W-inf", "W-1d", "basis-not-spanning", "basis-unknown-name", "basis-wrong-width",
    "budget-two-ways", "epsilon-zero", "epsilon-negative", "delta-zero", "delta-one", "delta-big",
    "method-unknown", "W-all-zero", "W-zero-row", "W-not-numeric", "targets-not-numeric",
    "gap-tolerance-zero", "max-gap-nan",
])
def test_bad_input_raises_value_error(kwargs, match):
    kwargs = dict(kwargs)
    with pytest.raises(ValueError, match=match):
        solve(kwargs.pop("W"), kwargs.pop("targets"), **kwargs)


def test_budget_two_ways_message():
    with pytest.raises(ValueError, match=r"budget: given two ways \(rho and alpha\)"):
        solve(W_OK, 1.0, budget={"rho": 1, "alpha": 2})


def test_block_too_large_for_memory_limit():
    with pytest.raises(MemoryError, match="blocks"):
        solve(W_OK, 1.0, memory_limit_bytes=1000)
    # the same block fits under a generous limit
    assert solve(W_OK, 1.0, memory_limit_bytes=1 << 30).alpha == pytest.approx(TABLE2[4], rel=2e-3)


def test_unconverged_solve_raises_convergence_error():
    w = wl.random_range_workload(12, 20, seed=1, targets="random")
    with pytest.raises(ConvergenceError) as info:
        solve(w.matrix, w.targets, method="dual", dual_iterations=1, max_gap=1e-9)
    message = str(info.value)
    assert "alpha" in message and "lower bound" in message and "gap" in message
    numbers = {}
    for key, pattern in (("alpha", r"alpha ([0-9.e+-]+)"), ("bound", r"lower bound ([0-9.e+-]+)"),
                         ("gap", r"gap ([0-9.e+-]+)%")):
        found = re.search(pattern, message)
        assert found, (key, message)
        numbers[key] = float(found.group(1))
    assert numbers["alpha"] > numbers["bound"] > 0
    assert numbers["gap"] / 100 == pytest.approx(numbers["alpha"] / numbers["bound"] - 1, rel=1e-3)
    assert issubclass(ConvergenceError, RuntimeError)
    assert distfit.ConvergenceError is ConvergenceError


def test_sigma_is_exactly_symmetric():
    """A residual block of three prefix attributes with per-query targets (the kind that once
    stored round-off asymmetry, failing audit): the returned sigma equals its transpose bit for
    bit."""
    from distfit.plan.planner import BlockTask, decompose, solve_block
    from distfit.spec.parse import parse_spec

    spec = parse_spec({"name": "sym", "attributes": [
        {"name": "a", "size": 6, "ordinal": True}, {"name": "b", "size": 7, "ordinal": True},
        {"name": "c", "size": 3, "ordinal": True}],
        "queries": [{"name": "abc", "attributes": {"a": "prefix", "b": "prefix", "c": "prefix"},
                     "target": {"base": 100, "width_power": 0.5, "jitter": 0.5}}],
        "blocks": {"merge": False}})
    blocks, _ = decompose(spec.domain, spec.group_triples(), 0)
    block = next(b for b in blocks if b.attributes == ("a", "b", "c"))
    solution = solve_block(BlockTask(0, block, block.targets))
    assert np.array_equal(solution.sigma, solution.sigma.T)


# --------------------------------------------------------------------------------------------
# Warm starts (the planner's refinement rounds: the same block, new target shares)
# --------------------------------------------------------------------------------------------

def _prefix_block(seed):
    """A 2-way block of prefixes on a 4 x 5 grid with per-query targets: the kind of block the
    planner re-solves with new shares (Adult's residual blocks are of this kind)."""
    rng = np.random.default_rng(seed)
    W = np.kron(prefix_matrix(4), prefix_matrix(5))
    return W, rng.uniform(1.0, 4.0, W.shape[0])


@pytest.mark.parametrize("seed", [0, 1])
def test_warm_start_reaches_the_cold_certified_optimum(seed):
    W, first = _prefix_block(seed)
    shares = first * np.random.default_rng(seed + 10).uniform(0.3, 1.0, first.size)  # the next round's shares
    earlier = solve(W, first)
    cold = solve(W, shares)
    warm = solve(W, shares, warm_start=WarmStart.of(earlier))
    for solution in (cold, warm):
        assert solution.gap <= 1e-4
        assert np.all(solution.variances <= shares * (1 + 1e-9))
        # the certificate is the one an auditor recomputes, at the new targets
        scaled = solution.recon / np.sqrt(shares)[:, None]
        assert certified_bound(solution.basis, scaled, solution.cell_weights, solution.query_weights) == pytest.approx(
            solution.lower_bound, rel=1e-12)
    # both are certified optima of the same problem: each plan is above the other's bound
    assert warm.alpha >= cold.lower_bound and cold.alpha >= warm.lower_bound
    assert warm.alpha == pytest.approx(cold.alpha, rel=2e-4)


def test_warm_start_from_the_same_targets_needs_no_smii():
    W, targets = _prefix_block(2)
    earlier = solve(W, targets)
    again = solve(W, targets, warm_start=WarmStart.of(earlier))
    assert again.gap <= 1e-4
    assert again.stats.newton_iterations == 0
    assert again.stats.dual_evaluations <= max(3, earlier.stats.dual_evaluations // 4)
    assert again.alpha == pytest.approx(earlier.alpha, rel=1e-4)


def test_warm_start_of_a_block_without_certificate_is_none():
    W, targets = _prefix_block(3)
    solution = solve(W, targets)
    uncertified = dataclasses.replace(solution, cell_weights=np.full(solution.cell_weights.shape, np.nan))
    assert WarmStart.of(uncertified) is None
    assert WarmStart.of(solution) is not None
    # a start of another block's size is ignored, not an error
    other = WarmStart(np.eye(2), np.ones(3), np.ones(4))
    assert solve(W, targets, warm_start=other).gap <= 1e-4


def test_a_warm_start_reuses_the_representation_bit_for_bit(monkeypatch):
    """A round's warm start carries the block's representation (it depends on W and the basis,
    not on the targets): the solve does not represent the block again and returns the plan the
    solve that recomputes it returns, bit for bit."""
    W, first = _prefix_block(6)
    shares = first * np.random.default_rng(16).uniform(0.3, 1.0, first.size)
    start = WarmStart.of(solve(W, first, basis="prefix"))
    recomputed = solve(W, shares, basis="prefix", warm_start=dataclasses.replace(start, representation=None))
    real, calls = solve_module.represent, []
    monkeypatch.setattr(solve_module, "represent", lambda *args: calls.append(args) or real(*args))
    reused = solve(W, shares, basis="prefix", warm_start=start)
    assert calls == []
    for name in ("sigma", "basis", "recon", "variances", "profile", "cell_weights", "query_weights"):
        np.testing.assert_array_equal(getattr(reused, name), getattr(recomputed, name), err_msg=name)
    assert (reused.alpha, reused.lower_bound) == (recomputed.alpha, recomputed.lower_bound)
    # a representation of another block's shape is not used
    solve(W[:, :-1], shares, basis="prefix", warm_start=start)
    assert len(calls) == 1


def test_a_dual_ascent_that_stops_short_is_restarted(monkeypatch):
    """L-BFGS on the nonsmooth dual can end short of the gap (a failed line search): with the
    polishing stage cut to 2 iterations from uniform weights (from SM-II's own weights two
    iterations already certify the gap with numpy 2.4 and scipy 1.17), the restarts from the best weights still certify the
    1e-4 gap the solve requires (max_gap), and the bound they prove is the one an auditor
    recomputes."""
    W, first = _prefix_block(4)
    shares = first * np.random.default_rng(14).uniform(0.3, 1.0, first.size)
    earlier = solve(W, first)
    real = solve_module.dual.maximize_dual
    calls = []

    def short_polish(*args, **kwargs):
        calls.append(kwargs.get("stall_window", 0))
        if len(calls) == 2:  # the polishing stage (the first call after SM-II): from uniform weights, cut short
            args = args[:2] + (None, None) + args[4:]
            kwargs["max_iterations"] = 2
        return real(*args, **kwargs)

    monkeypatch.setattr(solve_module.dual, "maximize_dual", short_polish)
    warm = solve(W, shares, warm_start=WarmStart.of(earlier), max_gap=1e-4)
    # first stage and polish (a certifying solve's, CERTIFYING_GAP) with their stall stops, then
    # restarts without one
    assert len(calls) >= 3 and calls[0] > 0 and calls[1] == solve_module.DUAL_STALL_WINDOW and not any(calls[2:])
    assert warm.gap <= 1e-4
    scaled = warm.recon / np.sqrt(shares)[:, None]
    assert certified_bound(warm.basis, scaled, warm.cell_weights, warm.query_weights) == pytest.approx(
        warm.lower_bound, rel=1e-12)


def test_a_warm_start_that_cannot_certify_falls_back_to_the_cold_solve(monkeypatch):
    """Every dual ascent of the warm path (from the warm start's, SM-II's, the restarts'
    weights) is made to fail at once, giving the bound at uniform weights: the path ends above
    max_gap, and the solve is the cold one, bit for bit."""
    W, first = _prefix_block(5)
    shares = first * np.random.default_rng(15).uniform(0.3, 1.0, first.size)
    earlier = solve(W, first)
    cold = solve(W, shares)
    real = solve_module.dual.maximize_dual
    warm_calls = []

    def weak_from_weights(basis, recon, cell_weights=None, query_weights=None, **kwargs):
        if cell_weights is None or "cold" in warm_calls:  # the cold path: as it is
            warm_calls.append("cold")
            return real(basis, recon, cell_weights, query_weights, **kwargs)
        warm_calls.append("warm")
        return real(basis, recon, None, None, **{**kwargs, "max_iterations": 0})

    monkeypatch.setattr(solve_module.dual, "maximize_dual", weak_from_weights)
    warm = solve(W, shares, warm_start=WarmStart.of(earlier), max_gap=1e-4)
    assert warm_calls[0] == "warm" and "cold" in warm_calls  # the warm path ran, then the cold one
    assert warm.alpha == cold.alpha and np.array_equal(warm.sigma, cold.sigma)
    assert warm.gap <= 1e-4


def test_a_solve_is_the_same_bits_from_unaligned_inputs():
    """numpy sums an unaligned array along another loop, with other rounding; ``solve`` aligns
    what it is given (``mathematics.workload.aligned``), so a block solved on a worker from an
    unpickled message equals the same solve in the driver bit for bit, warm start included.
    Before, Adult's plan on 2 workers changed its checksum run to run; its block r-age.workclass
    (1,450 queries, 20 basis rows) is one whose solve moved."""
    block = next(b for b in planned_decomposition(load_spec(ROOT / "pipelines" / "adult.yaml")).specs()
                 if b.block_id == "r-age.workclass")
    W, targets, basis = block.workload, block.targets, block.basis
    cold = solve(W, targets, basis=basis)
    again = solve(unaligned(W), unaligned(targets), basis=unaligned(basis))
    for name in ("sigma", "profile", "variances", "cell_weights", "query_weights"):
        assert getattr(again, name).tobytes() == getattr(cold, name).tobytes(), name
    start = WarmStart.of(cold)
    shifted = targets * np.linspace(0.8, 1.2, targets.size)
    warm = solve(W, shifted, basis=basis, warm_start=start)
    moved = WarmStart(unaligned(start.sigma), unaligned(start.cell_weights), unaligned(start.query_weights),
                      dataclasses.replace(start.representation, basis=unaligned(start.representation.basis),
                                          recon=unaligned(start.representation.recon)))
    warm_again = solve(unaligned(W), shifted, basis=unaligned(basis), warm_start=moved)
    assert warm_again.sigma.tobytes() == warm.sigma.tobytes() and warm_again.alpha == warm.alpha


@pytest.mark.parametrize("gap,certifying", [(1e-4, True), (1e-2, False)])
def test_only_certifying_solves_take_the_span_newton_and_the_polish_stall(monkeypatch, gap, certifying):
    """A solve to a gap below CERTIFYING_GAP (a plan's kept blocks) runs SM-II in the active
    span and stops its polishing ascent once the bound stalls; a looser one (a shaping round's)
    keeps the full-space directions and the full polish, so the shares it sets do not move."""
    W, targets = _prefix_block(3)
    real_optimize, real_dual = solve_module.smii.smii_optimize, solve_module.dual.maximize_dual
    spans, stalls = [], []

    def optimize(*args, **kwargs):
        spans.append(kwargs["span"])
        return real_optimize(*args, **kwargs)

    def ascent(*args, **kwargs):
        stalls.append(kwargs.get("stall_window", 0))
        if len(stalls) == 1:  # the first stage cut short, so that SM-II's plan needs the polish
            kwargs["max_iterations"] = 2
        return real_dual(*args, **kwargs)

    monkeypatch.setattr(solve_module.smii, "smii_optimize", optimize)
    monkeypatch.setattr(solve_module.dual, "maximize_dual", ascent)
    solution = solve(W, targets, method="smii", gap_tolerance=gap, max_gap=max(10 * gap, 1e-3))
    assert spans == [certifying]
    assert len(stalls) >= 2  # the first stage and the polish ran
    assert (stalls[1] == solve_module.DUAL_STALL_WINDOW) is certifying and (stalls[1] == 0) is not certifying
    assert solution.gap <= max(10 * gap, 1e-3)
