"""Tests for SM-II, the soft-max Newton-CG optimiser (distfit.solver.smii, docs/design.md section 1).

The optimum is checked against the independent SDP of ``tests/reference.py``; the plan's cost
(scaled to the targets) is recomputed here with numpy; the Hessian-vector product against
finite differences of the gradient, and the gradient against finite differences of F_t.
"""
from __future__ import annotations

import numpy as np
import pytest

from distfit.mathematics import workload as wl
from distfit.solver.basis import represent
from distfit.solver.dual import plan_cost
from distfit.solver.smii import (
    ACTIVE_WEIGHT,
    SmiiResult, objective_gradient, hessian_operator, newton_direction, SoftmaxState, whitened_gradient, whitened_hessian_operator, balance, smii_optimize,
)
from distfit.solver.solve import solve


def _cases():
    cases = []
    for seed in (0, 1):
        w = wl.random_range_workload(8, 10, seed=seed, targets="random")
        cases.append((f"ranges-seed{seed}", w.matrix, w.targets, "identity"))
    w = wl.random_workload(6, 9, seed=2)
    cases.append(("pm1", w.matrix, np.random.default_rng(2).uniform(1, 10, 9), "identity"))
    w = wl.all_two_way_marginals((2, 3, 2))  # rank-deficient: start from I in the reduced basis
    cases.append(("two-way-2x3x2", w.matrix, w.targets, "identity"))
    w = wl.random_range_workload(9, 6, seed=4, targets="random")  # m < d: reduced
    cases.append(("ranges-wide", w.matrix, w.targets, "auto"))
    return cases


CASES = _cases()
IDS = [c[0] for c in CASES]


def _problem(W, targets, kind):
    rep = represent(W, kind)
    return rep.basis, rep.recon / np.sqrt(np.asarray(targets, dtype=float))[:, None]


def _cost(basis, scaled_recon, sigma):
    """max_i b_i^T Sigma^-1 b_i * max_j l_j^T Sigma l_j, straight from the definition."""
    profile = np.einsum("ij,ij->j", basis, np.linalg.solve(sigma, basis))
    ratios = np.einsum("ij,jk,ik->i", scaled_recon, sigma, scaled_recon)
    return profile.max() * ratios.max()


@pytest.mark.parametrize("name,W,targets,kind", CASES, ids=IDS)
def test_smii_from_identity_reaches_optimum(name, W, targets, kind, cvx_alphas):
    alpha_star = cvx_alphas[name]
    basis, scaled_recon = _problem(W, targets, kind)
    k = basis.shape[0]
    result = smii_optimize(basis, scaled_recon, np.eye(k))
    assert isinstance(result, SmiiResult)
    assert result.converged
    assert result.newton_iterations > 0 and result.cg_iterations >= result.newton_iterations
    np.linalg.cholesky(result.sigma)
    cost = plan_cost(basis, scaled_recon, result.sigma)
    assert cost == pytest.approx(_cost(basis, scaled_recon, result.sigma), rel=1e-9)
    assert cost >= alpha_star * (1.0 - 1e-6)
    assert cost == pytest.approx(alpha_star, rel=5e-3)
    # soft-max weights are probability vectors (they warm-start the dual)
    for weights, size in ((result.cell_weights, W.shape[1]), (result.query_weights, W.shape[0])):
        assert weights.shape == (size,)
        assert np.all(weights >= 0) and weights.sum() == pytest.approx(1.0)
    # near the optimum of F_t, max p and max h are (nearly) balanced
    profile = np.einsum("ij,ij->j", basis, np.linalg.solve(result.sigma, basis))
    ratios = np.einsum("ij,jk,ik->i", scaled_recon, result.sigma, scaled_recon)
    assert profile.max() / ratios.max() == pytest.approx(1.0, rel=1e-2)


def test_smii_start_scale_does_not_matter():
    name, W, targets, kind = CASES[0]
    basis, scaled_recon = _problem(W, targets, kind)
    k = basis.shape[0]
    one = smii_optimize(basis, scaled_recon, np.eye(k))
    other = smii_optimize(basis, scaled_recon, 37.0 * np.eye(k))
    # balance() maps both starts to the same Sigma up to round-off; from there the runs may take
    # a different number of Newton steps per stage, so they agree to the continuation's final
    # accuracy (soft-max overshoot log(d m) / final_sharpness ~ 5e-5 relative), not bitwise.
    assert plan_cost(basis, scaled_recon, other.sigma) == pytest.approx(plan_cost(basis, scaled_recon, one.sigma),
                                                                        rel=2e-5)
    assert np.linalg.norm(balance(37.0 * np.eye(k), basis, scaled_recon) - balance(np.eye(k), basis, scaled_recon)) \
        <= 1e-12 * np.linalg.norm(balance(np.eye(k), basis, scaled_recon))


def test_balance_equalises_max_profile_and_max_ratio():
    name, W, targets, kind = CASES[1]
    basis, scaled_recon = _problem(W, targets, kind)
    k = basis.shape[0]
    rng = np.random.default_rng(0)
    M = rng.standard_normal((k, k))
    sigma = 3.0 * (M @ M.T + k * np.eye(k))
    balanced = balance(sigma, basis, scaled_recon)
    profile = np.einsum("ij,ij->j", basis, np.linalg.solve(balanced, basis))
    ratios = np.einsum("ij,jk,ik->i", scaled_recon, balanced, scaled_recon)
    assert profile.max() == pytest.approx(ratios.max(), rel=1e-10)
    # scaling does not change the cost once scaled to the targets
    assert _cost(basis, scaled_recon, balanced) == pytest.approx(_cost(basis, scaled_recon, sigma), rel=1e-10)


@pytest.mark.parametrize("name,W,targets,kind", CASES[:3], ids=IDS[:3])
def test_published_settings_decrease_cost(name, W, targets, kind, cvx_alphas):
    """The paper's algorithm (no preconditioner, fixed 5 CG steps, t from 1) improves on its start."""
    basis, scaled_recon = _problem(W, targets, kind)
    k = basis.shape[0]
    start_cost = _cost(basis, scaled_recon, np.eye(k))
    result = smii_optimize(basis, scaled_recon, np.eye(k), preconditioned=False, forcing=False, max_cg=5,
                           initial_sharpness=1.0, growth=4.0, max_newton=150)
    assert result.newton_iterations > 0
    assert result.cg_iterations <= 5 * result.newton_iterations + 5 * 20  # fixed 5 steps per direction
    cost = _cost(basis, scaled_recon, result.sigma)
    assert cost < start_cost
    assert cost >= cvx_alphas[name] * (1.0 - 1e-6)


@pytest.mark.parametrize("name,W,targets,kind", CASES, ids=IDS)
def test_solve_with_smii_method(name, W, targets, kind, cvx_alphas):
    solution = solve(W, targets, method="smii")
    assert solution.stats.newton_iterations > 0
    assert solution.stats.cg_iterations > 0
    assert solution.stats.final_t > 0
    assert solution.stats.stage in ("smii", "dual")
    assert 0.0 <= solution.gap <= 1e-3
    assert solution.alpha <= solution.lower_bound * (1.0 + solution.gap) * (1 + 1e-12)
    assert solution.alpha == pytest.approx(cvx_alphas[name], rel=1e-3)
    assert np.all(solution.variances <= solution.targets * (1 + 1e-12))
    # the polish never makes the plan worse than the dual stage alone
    assert solution.alpha <= solve(W, targets, method="dual", max_gap=1.0).alpha * (1.0 + 1e-12)


# --------------------------------------------------------------------------------------------
# Derivatives of F_t
# --------------------------------------------------------------------------------------------

def _random_spd(k, rng):
    M = rng.standard_normal((k, k))
    return M @ M.T / k + 0.5 * np.eye(k)


def _random_point(W, targets, kind, t, seed):
    """A case's scaled problem at a random point: ``(basis, scaled_recon, sigma, state, rng)``,
    ``sigma`` a random SPD matrix drawn from ``default_rng(seed)``, ``state`` F_t there, ``rng``
    left to draw the directions of the checks."""
    basis, scaled_recon = _problem(W, targets, kind)
    rng = np.random.default_rng(seed)
    sigma = _random_spd(basis.shape[0], rng)
    return basis, scaled_recon, sigma, SoftmaxState(sigma, basis, scaled_recon, t, t), rng


#: The derivative checks run on the first case and the two reduced ones (rank-deficient, wide).
derivative_cases = pytest.mark.parametrize("name,W,targets,kind", CASES[:1] + CASES[3:], ids=IDS[:1] + IDS[3:])


def _random_symmetric(k, rng):
    S = rng.standard_normal((k, k))
    return 0.5 * (S + S.T)


@derivative_cases
@pytest.mark.parametrize("t", [0.7, 6.0])
def test_gradient_matches_finite_differences(name, W, targets, kind, t):
    basis, scaled_recon, sigma, state, rng = _random_point(W, targets, kind, t, seed=1)
    k = basis.shape[0]
    gradient = objective_gradient(state, basis, scaled_recon)
    np.testing.assert_allclose(gradient, gradient.T, atol=1e-14 * np.abs(gradient).max())
    h = 1e-6
    for _ in range(3):
        S = _random_symmetric(k, rng)
        plus = SoftmaxState(sigma + h * S, basis, scaled_recon, t, t).value
        minus = SoftmaxState(sigma - h * S, basis, scaled_recon, t, t).value
        assert np.vdot(gradient, S) == pytest.approx((plus - minus) / (2 * h), rel=1e-6, abs=1e-9)


@derivative_cases
@pytest.mark.parametrize("t", [0.7, 6.0])
def test_hessian_vector_product_matches_finite_differences(name, W, targets, kind, t):
    basis, scaled_recon, sigma, state, rng = _random_point(W, targets, kind, t, seed=2)
    k = basis.shape[0]
    hessian = hessian_operator(state, basis, scaled_recon, t)
    h = 1e-5
    for _ in range(3):
        S = _random_symmetric(k, rng)
        product = hessian(S)
        np.testing.assert_allclose(product, product.T, atol=1e-13 * np.abs(product).max())
        plus = objective_gradient(SoftmaxState(sigma + h * S, basis, scaled_recon, t, t), basis, scaled_recon)
        minus = objective_gradient(SoftmaxState(sigma - h * S, basis, scaled_recon, t, t), basis, scaled_recon)
        finite = (plus - minus) / (2 * h)
        np.testing.assert_allclose(product, finite, rtol=1e-5, atol=1e-6 * np.abs(finite).max())
        # F_t is convex (the paper's Theorem 2): the Hessian is positive semidefinite
        assert np.vdot(S, product) >= -1e-10 * np.abs(product).max()


@derivative_cases
def test_single_precision_hessian_products_are_float32_rounding_of_the_exact_ones(name, W, targets, kind):
    # Newton-CG runs its products in float32 while its forcing term is loose: they must be the
    # float64 products up to float32 rounding (and exactly symmetric), not another operator.
    basis, scaled_recon, _, state, rng = _random_point(W, targets, kind, 4.0, seed=6)
    k = basis.shape[0]
    exact, _ = whitened_hessian_operator(state, scaled_recon, 4.0)
    single, _ = whitened_hessian_operator(state, scaled_recon, 4.0, single=True)
    for _ in range(3):
        S = _random_symmetric(k, rng)
        product = single(S)
        assert product.dtype == np.float64
        np.testing.assert_array_equal(product, product.T)
        np.testing.assert_allclose(product, exact(S), rtol=0, atol=1e-5 * np.abs(exact(S)).max())
        assert not np.array_equal(product, exact(S))  # the float32 path really ran


@derivative_cases
def test_whitened_hessian_is_the_preconditioned_hessian(name, W, targets, kind):
    # H~[S~] = U H[U^T S~ U] U^T with Sigma = U^T U, so plain CG on H~ is preconditioned CG on H.
    t = 3.0
    basis, scaled_recon, sigma, state, rng = _random_point(W, targets, kind, t, seed=5)
    k = basis.shape[0]
    whitened, upper = whitened_hessian_operator(state, scaled_recon, t)
    np.testing.assert_allclose(upper.T @ upper, sigma, rtol=1e-12, atol=1e-12 * np.abs(sigma).max())
    hessian = hessian_operator(state, basis, scaled_recon, t)
    for _ in range(3):
        S = _random_symmetric(k, rng)
        expected = upper @ hessian(upper.T @ S @ upper) @ upper.T
        np.testing.assert_allclose(whitened(S), expected, rtol=1e-9, atol=1e-10 * np.abs(expected).max())
    # and the Newton step solves H s = -g to the forcing tolerance in the preconditioner's norm
    gradient = objective_gradient(state, basis, scaled_recon)
    # the whitened gradient is the gradient mapped by Sigma = U^T U
    np.testing.assert_allclose(whitened_gradient(state, scaled_recon), upper @ gradient @ upper.T,
                               rtol=1e-9, atol=1e-10 * np.abs(upper @ gradient @ upper.T).max())
    step, slope, _ = newton_direction(state, basis, scaled_recon, t, max_cg=200, use_forcing=False)
    assert slope == pytest.approx(np.vdot(gradient, step), rel=1e-9)
    residual = hessian(step) + gradient
    assert np.linalg.norm(upper @ residual @ upper.T) <= 1e-4 * np.linalg.norm(upper @ gradient @ upper.T)


def test_newton_direction_in_the_span_of_the_active_columns_solves_the_newton_system():
    # Near the optimum at a large t, fewer whitened cell and query columns are active than
    # Sigma has rows; newton_direction then runs CG in their span (smii.newton_direction). Every
    # term of the whitened gradient and Hessian is made of those columns, so the Newton system
    # lives in that span: the step must lie in it and solve the system there, and what the
    # gradient has outside it (its inactive cells and queries) must be negligible.
    name, W, targets, kind = CASES[0]
    basis, scaled_recon = _problem(W, targets, kind)
    k = basis.shape[0]
    sigma = smii_optimize(basis, scaled_recon, np.eye(k)).sigma
    level = SoftmaxState(sigma, basis, scaled_recon, 1.0, 1.0).profile.max()
    t = 1e3 / level
    state = SoftmaxState(sigma, basis, scaled_recon, t, t)
    cells = state.cell_weights > ACTIVE_WEIGHT * state.cell_weights.max()
    queries = state.query_weights > ACTIVE_WEIGHT * state.query_weights.max()
    columns = np.hstack([state.whitened_basis[:, cells],
                         np.triu(state.factor[0]) @ scaled_recon[queries].T])  # [Y~ | L~^T]
    assert columns.shape[1] < k  # the reduced path is the one under test
    span = np.linalg.qr(columns)[0]
    projector = span @ span.T
    whitened, upper = whitened_hessian_operator(state, scaled_recon, t)
    gradient = whitened_gradient(state, scaled_recon)
    projected = projector @ gradient @ projector
    assert np.linalg.norm(gradient - projected) <= 1e-6 * np.linalg.norm(gradient)
    step, slope, steps = newton_direction(state, basis, scaled_recon, t, max_cg=500, use_forcing=False, span=True)
    assert steps < 500
    whitened_step = np.linalg.solve(upper.T, np.linalg.solve(upper.T, step.T).T)  # U^-T s U^-1
    np.testing.assert_allclose(projector @ whitened_step @ projector, whitened_step, rtol=0,
                               atol=1e-10 * np.abs(whitened_step).max())
    assert np.linalg.norm(whitened(whitened_step) + projected) <= 1e-4 * np.linalg.norm(gradient)
    assert slope == pytest.approx(np.vdot(objective_gradient(state, basis, scaled_recon), step), rel=1e-9)
    assert slope < 0
