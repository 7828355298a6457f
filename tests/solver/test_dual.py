"""Tests for the dual certificate (distfit.solver.dual, docs/design.md section 1).

For weights u (cells) and v (queries) on the simplex,
``f(u, v) = || diag(sqrt(v / c)) W diag(sqrt(u)) ||_*^2 <= alpha*``; the recovered plan
``Sigma_uv = G^-1 # A`` solves ``Sigma G Sigma = A``. The nuclear norm is recomputed here
directly from W (numpy SVD, no basis), and alpha* comes from the independent SDP in
``tests/reference.py``.
"""
from __future__ import annotations

import numpy as np
import pytest

from distfit.mathematics import privacy, workload as wl
from distfit.solver.basis import represent
from distfit.mathematics.bounds import certified_bound
from distfit.solver.dual import DualPoint, evaluate_dual, maximize_dual, plan_cost

from tests.reference import orthonormal_row_basis


def _cases():
    cases = []
    for seed in (0, 1):
        w = wl.random_range_workload(7, 10, seed=seed, targets="random")
        cases.append((f"ranges-seed{seed}", w.matrix, w.targets))
    w = wl.random_workload(6, 9, seed=2)
    cases.append(("pm1", w.matrix, np.random.default_rng(2).uniform(1, 10, 9)))
    rng = np.random.default_rng(3)
    W = rng.integers(-1, 3, size=(9, 3)).astype(float) @ rng.integers(0, 2, size=(3, 7)).astype(float)
    W = W[np.any(W != 0, axis=1)]
    cases.append(("rank3", W, rng.uniform(1, 10, W.shape[0])))
    w = wl.all_two_way_marginals((2, 2, 3))
    cases.append(("two-way-2x2x3", w.matrix, np.linspace(1, 4, w.num_queries)))
    return cases


CASES = _cases()
IDS = [c[0] for c in CASES]


def _scaled(W, targets, kind="svd"):
    """(B, L_c) with W = L B, L_c = diag(c^-1/2) L."""
    if kind == "svd":
        basis = orthonormal_row_basis(W)
        recon = W @ basis.T
    else:
        rep = represent(W, kind)
        basis, recon = rep.basis, rep.recon
    return basis, recon / np.sqrt(np.asarray(targets, dtype=float))[:, None]


def _nuclear_bound(W, targets, u, v):
    """f(u, v) straight from the definition, unnormalised weights."""
    M = np.sqrt(v / targets)[:, None] * W * np.sqrt(u)[None, :]
    return np.linalg.svd(M, compute_uv=False).sum() ** 2


def _random_simplex(rng, n, spread=1.0):
    w = rng.random(n) ** spread + 1e-3
    return w / w.sum()


def _random_weights(W, targets, rng, trials, step):
    """In each basis (svd, identity, auto), ``trials`` random dual points: ``(basis,
    scaled_recon, u, v)`` with u (cells) and v (queries) on the simplex, more skewed each trial
    (``spread = 1 + step * trial``)."""
    for kind in ("svd", "identity", "auto"):
        basis, scaled_recon = _scaled(W, targets, kind)
        for trial in range(trials):
            u = _random_simplex(rng, W.shape[1], spread=1 + step * trial)
            v = _random_simplex(rng, W.shape[0], spread=1 + step * trial)
            yield basis, scaled_recon, u, v


def _dual_at_random_weights(W, targets, seed):
    """The dual in the svd basis at one random point (u, v) drawn from ``default_rng(seed)``:
    ``(basis, scaled_recon, u, v, evaluate_dual's DualPoint)``."""
    basis, scaled_recon = _scaled(W, targets)
    rng = np.random.default_rng(seed)
    u, v = _random_simplex(rng, W.shape[1]), _random_simplex(rng, W.shape[0])
    return basis, scaled_recon, u, v, evaluate_dual(basis, scaled_recon, u, v)


@pytest.mark.parametrize("name,W,targets", CASES, ids=IDS)
def test_weak_duality_random_weights(name, W, targets, cvx_alphas):
    alpha_star = cvx_alphas[name]
    for basis, scaled_recon, u, v in _random_weights(W, targets, np.random.default_rng(17), trials=6, step=2):
        point = evaluate_dual(basis, scaled_recon, u, v)
        assert isinstance(point, DualPoint)
        # the bound is the nuclear norm formula, whatever the basis
        assert point.bound == pytest.approx(_nuclear_bound(W, targets, u, v), rel=1e-9)
        assert point.bound <= alpha_star * (1.0 + 1e-6)
        # the recovered plan is feasible after scaling: it cannot beat the optimum
        assert point.primal_alpha >= alpha_star * (1.0 - 1e-6)
        assert point.primal_alpha >= point.bound * (1.0 - 1e-12)


@pytest.mark.parametrize("name,W,targets", CASES, ids=IDS)
def test_weights_are_normalised(name, W, targets):
    basis, scaled_recon, u, v, point = _dual_at_random_weights(W, targets, seed=5)
    scaled = evaluate_dual(basis, scaled_recon, 7.0 * u, 0.01 * v)
    assert scaled.bound == pytest.approx(point.bound, rel=1e-12)
    np.testing.assert_allclose(scaled.cell_weights, u, rtol=1e-12)
    np.testing.assert_allclose(scaled.query_weights, v, rtol=1e-12)


@pytest.mark.parametrize("name,W,targets", CASES, ids=IDS)
def test_recovered_plan_solves_riccati_and_traces(name, W, targets):
    """Sigma G Sigma = A, N = tr(Sigma^-1 A) = tr(G Sigma), and the reported profile/ratios."""
    basis, scaled_recon = _scaled(W, targets)
    rng = np.random.default_rng(23)
    for _ in range(3):
        u, v = _random_simplex(rng, W.shape[1]), _random_simplex(rng, W.shape[0])
        point = evaluate_dual(basis, scaled_recon, u, v)
        sigma = point.sigma
        A = basis @ np.diag(u) @ basis.T
        G = scaled_recon.T @ np.diag(v) @ scaled_recon
        np.testing.assert_allclose(sigma, sigma.T, atol=1e-12 * np.abs(sigma).max())
        assert np.linalg.eigvalsh(sigma).min() > 0
        np.testing.assert_allclose(sigma @ G @ sigma, A, atol=1e-9 * np.abs(A).max())
        N = np.sqrt(point.bound)
        assert np.trace(np.linalg.solve(sigma, A)) == pytest.approx(N, rel=1e-9)
        assert np.trace(G @ sigma) == pytest.approx(N, rel=1e-9)
        np.testing.assert_allclose(point.profile, privacy.privacy_profile(sigma, basis), rtol=1e-8)
        np.testing.assert_allclose(point.ratios, np.einsum("ij,jk,ik->i", scaled_recon, sigma, scaled_recon),
                                   rtol=1e-8)
        # Euler's identity for the degree-1/2 homogeneous N: <u, p> = <v, h> = N
        assert u @ point.profile == pytest.approx(N, rel=1e-9)
        assert v @ point.ratios == pytest.approx(N, rel=1e-9)
        assert point.primal_alpha == pytest.approx(plan_cost(basis, scaled_recon, sigma), rel=1e-9)


@pytest.mark.parametrize("name,W,targets", CASES, ids=IDS)
def test_gradient_identities(name, W, targets):
    """dN/du_i = p_i / 2 and dN/dv_j = h_j / 2 against central differences of the nuclear norm."""
    basis, scaled_recon, u, v, point = _dual_at_random_weights(W, targets, seed=31)

    def N(uu, vv):
        return np.sqrt(_nuclear_bound(W, targets, uu, vv))

    h = 1e-6
    du = np.array([(N(u + h * e, v) - N(u - h * e, v)) / (2 * h) for e in np.eye(u.size)])
    dv = np.array([(N(u, v + h * e) - N(u, v - h * e)) / (2 * h) for e in np.eye(v.size)])
    # cells no query touches have zero derivative and zero profile
    np.testing.assert_allclose(du, point.profile / 2, rtol=1e-5, atol=1e-7 * point.profile.max())
    np.testing.assert_allclose(dv, point.ratios / 2, rtol=1e-5, atol=1e-7 * point.ratios.max())


@pytest.mark.parametrize("name,W,targets", CASES, ids=IDS)
def test_maximize_dual_reaches_optimum(name, W, targets, cvx_alphas):
    alpha_star = cvx_alphas[name]
    basis, scaled_recon = _scaled(W, targets)
    bound_point, primal_point, evaluations = maximize_dual(basis, scaled_recon, max_iterations=400, target_gap=1e-5)
    assert evaluations >= 1
    assert bound_point.bound <= alpha_star * (1.0 + 1e-6)
    assert bound_point.bound == pytest.approx(alpha_star, rel=1e-3)
    assert primal_point.primal_alpha >= alpha_star * (1.0 - 1e-6)
    assert primal_point.primal_alpha >= bound_point.bound
    # No closeness is asserted for the recovered plan: where the optimal u vanishes on some cells
    # Sigma_uv is not unique and the plan can stay a few percent above the optimum (0.6% on
    # ranges-seed0, 3% with a slightly different L-BFGS path); solve() polishes it with SM-II.
    # the returned bound is reproducible from its own weights
    again = evaluate_dual(basis, scaled_recon, bound_point.cell_weights, bound_point.query_weights)
    assert again.bound == pytest.approx(bound_point.bound, rel=1e-12)
    assert _nuclear_bound(W, targets, bound_point.cell_weights, bound_point.query_weights) == pytest.approx(
        bound_point.bound, rel=1e-6)


def test_maximize_dual_warm_start_and_known_alpha():
    name, W, targets = CASES[0]
    basis, scaled_recon = _scaled(W, targets)
    cold_bound, cold_primal, cold_evals = maximize_dual(basis, scaled_recon, target_gap=1e-6)
    warm_bound, _, warm_evals = maximize_dual(
        basis, scaled_recon, cold_bound.cell_weights, cold_bound.query_weights, target_gap=1e-6)
    assert warm_bound.bound >= cold_bound.bound * (1 - 1e-6)
    assert warm_evals <= cold_evals
    # a plan already known to be optimal stops the ascent as soon as the bound is close
    _, _, stopped = maximize_dual(basis, scaled_recon, target_gap=1e-2, known_alpha=cold_primal.primal_alpha)
    assert stopped <= cold_evals


def test_evaluate_dual_singular_query_gram():
    """Query weights that do not span the basis make G singular: LinAlgError."""
    W = np.eye(3)
    with pytest.raises(np.linalg.LinAlgError):
        evaluate_dual(W, W, np.ones(3), np.array([1.0, 0.0, 0.0]))


def test_bound_equals_definition_when_cell_weights_vanish():
    """W = I_40, c = 1, u = e_0, v uniform: f(u, v) = 1/40 exactly."""
    d = 40
    W = np.eye(d)
    u = np.zeros(d)
    u[0] = 1.0
    v = np.full(d, 1.0 / d)
    assert _nuclear_bound(W, np.ones(d), u, v) == pytest.approx(1.0 / d, rel=1e-14)
    point = evaluate_dual(W, W, u, v)
    assert point.bound <= 1.0 / d
    assert point.bound == pytest.approx(1.0 / d, rel=1e-9)


def test_bound_never_exceeds_the_optimum():
    """W = I_50, c = (1, 100, ..., 100): alpha* = 1 (query 0 reads cell 0 alone, so p_0 >= 1 / Sigma_00
    >= 1, and Sigma = diag(c) attains it). No dual point may certify more than 1."""
    d = 50
    W = np.eye(d)
    targets = np.full(d, 100.0)
    targets[0] = 1.0
    u = np.zeros(d)
    u[0] = 1.0
    v = np.full(d, 1e-12)
    v[0] = 1.0 - (d - 1) * 1e-12
    assert _nuclear_bound(W, targets, u, v) <= 1.0
    point = evaluate_dual(W, W / np.sqrt(targets)[:, None], u, v)
    assert point.bound <= 1.0 + 1e-9  # library: 1 + 3.1e-6


# --------------------------------------------------------------------------------------------
# certified_bound: the bound at stored weights (what a solve reports and the audit re-evaluates)


@pytest.mark.parametrize("name,W,targets", CASES, ids=IDS)
def test_certified_bound_is_the_definition(name, W, targets, cvx_alphas):
    """At random weights (some exactly zero, as a certificate's are on rows implied by others),
    in any basis: the nuclear norm of ``diag(sqrt(v / c)) W diag(sqrt(u))`` by a full SVD of W,
    to 1e-11, never above it by more than rounding, and never above the optimum."""
    rng = np.random.default_rng(23)
    for basis, scaled_recon, u, v in _random_weights(W, targets, rng, trials=4, step=3):
        u[rng.random(u.size) < 0.3] = 0.0
        v[rng.random(v.size) < 0.3] = 0.0
        if not u.any() or not v.any():
            continue
        exact = _nuclear_bound(W, targets, u / u.sum(), v / v.sum())
        bound = certified_bound(basis, scaled_recon, u, v)  # normalises, as evaluate_dual does
        assert bound == pytest.approx(exact, rel=1e-11)
        assert bound <= exact * (1 + 1e-14)
        assert bound <= cvx_alphas[name] * (1.0 + 1e-6)


def test_certified_bound_keeps_small_singular_values():
    """W = I_40, c = 1: f(u, v) = (sum_i sqrt(u_i v_i))^2 exactly. Thirty cells with
    ``u_i v_i = 1e-17`` add 1.9e-7 (relative) to f; their eigenvalues of ``X`` (1e-17) sit below
    ``evaluate_dual``'s rounding allowance, so it drops them; the SVD of the k x k reduction
    resolves them."""
    d = 40
    u = np.full(d, 10**-8.5)
    u[:10] = 0.1
    v = u.copy()
    exact = float(np.sum(np.sqrt(u * v / (u.sum() * v.sum())))) ** 2
    bound = certified_bound(np.eye(d), np.eye(d), u, v)
    assert bound == pytest.approx(exact, rel=1e-11) and bound <= exact
    assert evaluate_dual(np.eye(d), np.eye(d), u, v).bound < exact * (1 - 1e-7)


@pytest.mark.parametrize("cells, queries", [
    ([-0.1, 0.6, 0.5], [0.5, 0.5]), ([np.nan, 0.5, 0.5], [0.5, 0.5]), ([0.0, 0.0, 0.0], [0.5, 0.5]),
    ([0.2, 0.3, 0.5], [np.inf, 1.0]),
])
def test_certified_bound_refuses_weights_that_are_no_distribution(cells, queries):
    with pytest.raises(ValueError, match="weights must be finite, >= 0 and not all zero"):
        certified_bound(np.eye(3), np.ones((2, 3)), np.array(cells), np.array(queries))


@pytest.mark.parametrize("name,W,targets", CASES[:4], ids=IDS[:4])
def test_stall_window_stops_early_with_a_valid_bound(name, W, targets, cvx_alphas):
    """A stalled bound ends the ascent: never more evaluations than without the window, and the
    bound is still a proof (below the optimum) and close to it (the stall rule only stops once
    the bound moves by less than a fraction of the target gap)."""
    alpha_star = cvx_alphas[name]
    basis, scaled_recon = _scaled(W, targets)
    full_bound, _, full = maximize_dual(basis, scaled_recon, max_iterations=400, target_gap=1e-4)
    bound, _, stalled = maximize_dual(basis, scaled_recon, max_iterations=400, target_gap=1e-4, stall_window=10)
    assert stalled <= full
    assert bound.bound <= alpha_star * (1.0 + 1e-6)
    assert bound.bound == pytest.approx(full_bound.bound, rel=1e-2)
