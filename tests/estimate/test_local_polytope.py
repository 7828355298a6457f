"""The local polytope in the published queries' metric (distfit.estimate.local_polytope, issue 26)
against an independent convex program (cvxpy/Clarabel over the clique tables themselves), and its
guarantee checked by Monte Carlo: on the published queries the estimate's squared error is never
above the raw release's."""
from __future__ import annotations

import itertools

import cvxpy as cp
import numpy as np
import pytest

from distfit.estimate import graphical, local_polytope
from distfit.estimate.measurements import recover_measurements
from tests.estimate.test_graphical import one_unit, plan_model


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    """4 attributes of 3 values, all 2-way marginals (6 cliques of 9 cells), query variance 25: a
    residual plan whose noise makes sparse units' raw answers negative."""
    return plan_model(tmp_path_factory, "local_four", [(f"c{i}", 3) for i in range(4)], (2,), target=25.0)


def answers_of(model, y):
    """The raw release's published answers: sum by query_index of L_b y_b."""
    out = np.zeros(model.num_queries)
    for b in model.blocks:
        np.add.at(out, b.query_index, b.recon @ y[b.block_id])
    return out


def truth_answers(model, x):
    out = np.zeros(model.num_queries)
    for b in model.blocks:
        np.add.at(out, b.query_index, b.query_rows @ model.marginal(x[None], b)[0])
    return out


def reference(model, y):
    """min ||W(mu) - a||^2 over nonnegative clique tables mu that agree on shared attributes
    (Clarabel), ``W(mu)`` the published queries read off the tables (each block's rows on its
    marginal of a clique containing it), ``a`` the raw answers: the published queries' estimate."""
    size = dict(zip(model.attributes, model.sizes))
    cliques = sorted({b.attributes for b in model.blocks if len(b.attributes) == 2})
    tau = {c: cp.Variable([size[a] for a in c], nonneg=True) for c in cliques}
    cons = []
    for c, d in itertools.combinations(cliques, 2):
        for a in set(c) & set(d):
            cons.append(cp.sum(tau[c], axis=1 - c.index(a)) == cp.sum(tau[d], axis=1 - d.index(a)))
    first = cliques[0]
    pieces = []
    for b in model.blocks:
        c = next(c for c in cliques if set(b.attributes) <= set(c))
        t = tau[c]
        if len(b.attributes) == 2:
            marg = cp.vec(t, order="C")
        elif len(b.attributes) == 1:
            marg = cp.sum(t, axis=1 - c.index(b.attributes[0]))
        else:
            marg = cp.reshape(cp.sum(tau[first]), (1,), order="C")
        pieces.append((b, marg))
    estimates = []
    for j in range(model.num_queries):
        terms = [b.query_rows[r] @ marg for b, marg in pieces for r in np.flatnonzero(b.query_index == j)]
        estimates.append(sum(terms))
    problem = cp.Problem(cp.Minimize(cp.sum_squares(cp.hstack(estimates) - answers_of(model, y))), cons)
    problem.solve(solver=cp.CLARABEL)
    return np.array([float(e.value) for e in estimates]), {c: tau[c].value for c in cliques}


def chunk_of(model, units):
    return {b.block_id: np.stack([y[b.block_id] for y in units]) for b in model.blocks}


def test_the_projection_matches_clarabel_over_the_clique_tables(four):
    """ADMM run to a tight rule (no cell below -1e-7 noise sd, objective still to 1e-12) gives
    Clarabel's clique tables to 1e-4 of the total, and at the default
    rule (the product's) its published-query estimates to 1e-3 of the total (measured 4e-9 here; the raw answers are 0.16 of the
    total away from them)."""
    x, y = one_unit(four, 60, seed=3)
    problem = graphical.graphical_problem(four, method="local")
    assert problem.method == "local" and problem.local is not None
    expected, tables = reference(four, y)
    white = np.concatenate([b.whitener @ y[b.block_id] for b in four.blocks])[:, None]
    u, _, converged = local_polytope.solve(problem.local, white, iterations=20000, negativity=1e-7, tolerance=1e-12)
    assert converged.all()
    flat = local_polytope.tables(problem.local, u)[:, 0]
    for i, c in enumerate(problem.local.cliques):
        got = flat[problem.local.clique_start[i]:problem.local.clique_start[i + 1]]
        np.testing.assert_allclose(got, tables[c].reshape(-1), atol=1e-4 * 60)
    est = graphical.estimate_graphical(problem, y)
    assert min(t.min() for t in est.marginals.values()) >= 0
    np.testing.assert_allclose(est.estimates, expected, atol=1e-3 * 60)
    assert (truth_answers(four, x) >= 0).all()


def test_never_worse_than_the_raw_release_on_the_published_queries(four):
    """Monte Carlo, 40 noise draws of one sparse unit (nonnegativity binds), at the product's
    default stopping rule: the estimate's squared error on the published queries is at most the
    raw release's in every draw (the projection's guarantee, module docstring; slack 1e-3 of the
    raw error for ADMM's tolerance), and its mean absolute error over the draws is below raw's."""
    rng = np.random.default_rng(11)
    x = rng.multinomial(80, rng.dirichlet(np.full(four.cells, 0.2))).astype(float)
    truth = truth_answers(four, x)
    units, raw = [], []
    for _ in range(40):
        answers = {}
        for b in four.blocks:
            z = rng.multivariate_normal(np.zeros(b.rows), b.sigma)
            answers[b.block_id] = ((four.marginal(x[None], b) @ b.basis.T + z) @ b.recon.T)
        units.append({k: v[0] for k, v in recover_measurements(four, answers).items()})
        raw.append(answers_of(four, units[-1]))
    raw = np.array(raw)
    problem = graphical.graphical_problem(four, method="local")
    chunk = graphical.estimate_units(problem, chunk_of(four, units))
    assert chunk.converged.all()
    raw_error = ((raw - truth) ** 2).sum(axis=1)
    est_error = ((chunk.estimates - truth) ** 2).sum(axis=1)
    assert (est_error <= raw_error * (1 + 1e-3)).all()
    assert np.abs(chunk.estimates - truth).mean() < np.abs(raw - truth).mean()
    assert (raw < 0).any()  # the draws do have negative raw answers for the estimate to fix


def test_a_unit_does_not_depend_on_its_chunk_and_progress_is_reported(four):
    """A unit estimated alone and beside another gives the same estimates (fixed rho, frozen
    once converged); progress(iterations, at most) rises by CHECK_EVERY to the chunk's count."""
    units = [one_unit(four, total, seed)[1] for total, seed in ((40, 5), (300, 6))]
    problem = graphical.graphical_problem(four, method="local")
    calls = []
    chunk = graphical.estimate_units(problem, chunk_of(four, units), progress=lambda d, t: calls.append((d, t)))
    alone = graphical.estimate_units(problem, chunk_of(four, units[:1]))
    np.testing.assert_allclose(chunk.estimates[0], alone.estimates[0], rtol=0, atol=1e-9)
    assert [d for d, _ in calls] == list(range(local_polytope.CHECK_EVERY, chunk.iterations + 1,
                                               local_polytope.CHECK_EVERY))
    assert all(t == local_polytope.ITERATIONS for _, t in calls)


def test_local_is_the_default_of_a_residual_plan_and_residual_plans_are_recognised(four):
    """Auto takes 'local' for a residual plan (tests/estimate/test_wide.py runs it on Adult with
    mbi and jax unimportable); a plan is residual when every clique is spanned exactly by the
    blocks within it; a local polytope over the memory limit is refused in one line."""
    assert graphical.graphical_problem(four).method == "local"
    assert graphical.graphical_problem(four, method="local").method == "local"
    with pytest.raises(graphical.ModelTooLarge) as info:
        graphical.graphical_problem(four, method="local", memory_limit=1 << 10)
    assert "\n" not in str(info.value) and "the local model's largest clique (c0, c1) has 9 cells" in str(info.value)
    assert local_polytope.is_residual(four, [("c0", "c1")])
    assert not local_polytope.is_residual(four, [("c0", "c1", "c2")])  # no 3-way block: 19 rows for 27 cells


def test_the_metric_gram_and_factor_equal_their_dense_definitions(four):
    """``Q^T Q`` (summed from dense query groups), ``A^T`` (kept beside ``A``) and the Schur
    solve equal their definitions built densely here: ``Q`` row by row from each block's
    ``L_b C_b`` added into its queries, ``H = Q^T Q + rho A^T A``, ``H^-1 r`` by numpy's solve."""
    problem = graphical.graphical_problem(four, method="local").local
    offsets = problem.offsets
    q = np.zeros((four.num_queries, offsets[-1]))
    for b, block in enumerate(four.blocks):
        np.add.at(q[:, offsets[b]:offsets[b + 1]], block.query_index, block.recon @ np.linalg.inv(block.whitener))
    a = problem.constraint.toarray()
    np.testing.assert_allclose(problem.metric.toarray(), q.T @ q, rtol=0, atol=1e-12 * np.abs(q.T @ q).max())
    np.testing.assert_array_equal(problem.constraint_transpose.toarray(), a.T)
    np.testing.assert_allclose(problem.rho, local_polytope.RHO_SCALE * np.trace(q.T @ q) / np.trace(a.T @ a), rtol=1e-13)
    h = q.T @ q + problem.rho * a.T @ a
    r = np.random.default_rng(4).standard_normal((offsets[-1], 3))
    np.testing.assert_allclose(problem.factor.solve(r), np.linalg.solve(h, r), rtol=0, atol=1e-9 * np.abs(np.linalg.solve(h, r)).max())
