"""The projection (distfit.estimate.projection) against cvxpy/Clarabel, and its guarantees:
never worse than the release in the noise metric (draw by draw), consistent estimates."""
from __future__ import annotations

import pickle
import types

import cvxpy as cp
import numpy as np
import pytest

import distfit
from distfit.mathematics.domain import Domain
from distfit.estimate import projection
from distfit.estimate.measurements import (
    measurement_model,
    model_from_blocks,
    recover_measurements,
    whitened_measurements,
    workload_estimates,
)
from distfit.estimate.projection import (
    InformationOperator,
    minimise_quadratic,
    normal_equations,
    project_nonnegative,
    quadratic_objective,
)
from distfit.release.noise import block_marginal, release_chunk
from tests.estimate.test_structure import structured_blocks


def random_blocks(rng, domain, cliques, full_rank=True):
    """Random blocks over ``cliques``: basis k x d_b (k = d_b when ``full_rank``, else fewer
    rows: the blocks then leave some directions of the domain unmeasured), a tall recon of full
    column rank, a random SPD sigma; query indices partly shared between blocks."""
    blocks, start = [], 0
    for i, clique in enumerate(cliques):
        d = int(np.prod([domain.size_of(a) for a in clique]))
        k = d if full_rank else int(rng.integers(1, d + 1))
        basis = rng.standard_normal((k, d))
        m = k + int(rng.integers(0, 3))
        recon = rng.standard_normal((m, k))
        a = rng.standard_normal((k, k))
        sigma = a @ a.T + 0.3 * np.eye(k)
        index = np.arange(start, start + m)
        if i:
            index[0] = 0  # query 0 has rows in several blocks
        start = index.max() + 1
        blocks.append(types.SimpleNamespace(block_id=f"b{i}", attributes=clique, basis=basis, recon=recon,
                                            sigma=sigma, query_index=index))
    return blocks


def simulate(rng, model, x):
    """Released answers a_b = L_b (B_b M_b x + z_b) and the noise-free measurements B_b M_b x."""
    answers, truth = {}, {}
    for block in model.blocks:
        clean = model.marginal(x, block) @ block.basis.T
        z = rng.multivariate_normal(np.zeros(block.rows), block.sigma, size=x.shape[0])
        answers[block.block_id] = (clean + z) @ block.recon.T
        truth[block.block_id] = clean
    return answers, truth


def cvx_projection(model, y, unit):
    """The projection of one unit solved by Clarabel: (objective, x)."""
    xv = cp.Variable(model.cells, nonneg=True)
    terms = []
    for block in model.blocks:
        marginaliser = model.marginal(np.eye(model.cells), block).T  # d_b x cells
        residual = y[block.block_id][unit] - block.basis @ marginaliser @ xv
        precision = np.linalg.inv(block.sigma)
        terms.append(cp.quad_form(residual, (precision + precision.T) / 2))
    problem = cp.Problem(cp.Minimize(sum(terms)))
    problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    return problem.value, xv.value


def measured_rows(model, x):
    """B_b M_b x of every block, side by side (units x sum k_b)."""
    return np.hstack([model.marginal(x, b) @ b.basis.T for b in model.blocks])


@pytest.mark.parametrize("full_rank", [True, False], ids=["H-regular", "H-singular"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_equals_clarabel_on_small_random_cases(seed, full_rank):
    rng = np.random.default_rng(seed)
    domain = Domain(("a", "b", "c"), (3, 2, 4))
    model = model_from_blocks(domain, random_blocks(rng, domain, [("a", "b"), ("b", "c"), ("a",)], full_rank))
    x = rng.poisson(0.7, (4, domain.size)).astype(float)
    answers, _ = simulate(rng, model, x)
    y = recover_measurements(model, answers)
    result = project_nonnegative(model, y)
    assert result.converged.all() and (result.x >= 0).all()
    for unit in range(x.shape[0]):
        value, reference = cvx_projection(model, y, unit)
        assert result.objective[unit] == pytest.approx(value, rel=1e-6, abs=1e-9)
        ours = workload_estimates(model, result.x[unit:unit + 1])
        theirs = workload_estimates(model, reference[None, :])
        scale = max(1.0, np.abs(theirs).max())
        assert np.abs(ours - theirs).max() <= 1e-6 * scale
        rows_ours, rows_theirs = measured_rows(model, result.x[unit:unit + 1]), measured_rows(model, reference[None, :])
        assert np.abs(rows_ours - rows_theirs).max() <= 1e-6 * max(1.0, np.abs(rows_theirs).max())


def test_operator_path_matches_the_dense_one(monkeypatch):
    rng = np.random.default_rng(5)
    domain = Domain(("a", "b", "c"), (3, 2, 4))
    model = model_from_blocks(domain, random_blocks(rng, domain, [("a", "b"), ("b", "c"), ("a", "c")]))
    x = rng.poisson(1.0, (6, domain.size)).astype(float)
    y = recover_measurements(model, simulate(rng, model, x)[0])
    dense, g = normal_equations(model, y)
    operator = InformationOperator(model)
    v = rng.standard_normal((5, domain.size))
    assert np.allclose(operator(v), v @ dense, rtol=1e-12, atol=1e-10)
    assert np.linalg.eigvalsh(dense)[-1] <= operator.lipschitz <= 1.06 * np.linalg.eigvalsh(dense)[-1]
    expected = project_nonnegative(model, y)
    monkeypatch.setattr(projection, "DENSE_CELLS", 4)  # this domain (24 cells) now takes the operator path
    hessian, g2 = normal_equations(model, y)
    assert isinstance(hessian, InformationOperator) and np.allclose(g, g2)
    got = project_nonnegative(model, y)
    assert got.converged.all()
    assert np.allclose(got.objective, expected.objective, rtol=1e-6)
    assert np.allclose(workload_estimates(model, got.x), workload_estimates(model, expected.x), rtol=1e-6, atol=1e-6)


def test_minimise_quadratic_with_a_general_projection():
    """Projection onto {x : sum x = s} (an affine set, not the orthant): closed-form optimum."""
    rng = np.random.default_rng(3)
    d = 7
    a = rng.standard_normal((d, d))
    hessian = a @ a.T + 0.5 * np.eye(d)
    g = rng.standard_normal((4, d))
    total = 3.0

    def on_plane(v):
        return v - (v.sum(axis=1, keepdims=True) - total) / d

    result = minimise_quadratic(hessian, g, on_plane, np.zeros_like(g), tol=1e-12)
    assert result.converged.all()
    # KKT: H x - g = mu 1, 1^T x = total
    kkt = np.block([[hessian, -np.ones((d, 1))], [np.ones((1, d)), np.zeros((1, 1))]])
    for unit in range(g.shape[0]):
        solution = np.linalg.solve(kkt, np.append(g[unit], total))[:d]
        assert np.allclose(result.x[unit], solution, atol=1e-8)
    assert np.allclose(result.objective, quadratic_objective(hessian, g, result.x))
    coupled = minimise_quadratic(hessian, g, on_plane, np.zeros_like(g), tol=1e-12, coupled=True)
    assert coupled.converged.all() and np.allclose(coupled.x, result.x, atol=1e-8)


@pytest.fixture(scope="module")
def released(small_plan):
    """400 units of sparse true counts released through the small plan (each unit one draw)."""
    plan = distfit.read_plan(small_plan.plan)
    model = measurement_model(plan)
    rng = np.random.default_rng(11)
    x = rng.poisson(rng.choice([0.0, 0.3, 3.0], size=(400, model.cells))).astype(np.int64)
    chunk = release_chunk(plan, x, entropy=20240611, chunk_index=0)
    return plan, model, x, chunk


def test_projection_never_hurts_draw_by_draw(released):
    plan, model, x, chunk = released
    y = recover_measurements(model, chunk.blocks)
    result = project_nonnegative(model, y)
    assert result.converged.all() and (result.x >= 0).all()
    raw_error = np.zeros(x.shape[0])
    projected_error = np.zeros(x.shape[0])
    for block in model.blocks:
        truth = block_marginal(x, model.domain(), block.attributes) @ block.basis.T
        estimate = model.marginal(result.x, block) @ block.basis.T
        raw_error += np.sum(((y[block.block_id] - truth) @ block.whitener.T) ** 2, axis=1)
        projected_error += np.sum(((estimate - truth) @ block.whitener.T) ** 2, axis=1)
    assert x.shape[0] >= 200
    for unit in range(x.shape[0]):  # the guarantee holds for every draw, not on average
        assert projected_error[unit] <= raw_error[unit] * (1 + 1e-9) + 1e-9, unit
    true_answers = workload_estimates(model, x.astype(float))
    raw_mse = np.mean((chunk.queries - true_answers) ** 2)
    projected_mse = np.mean((workload_estimates(model, result.x) - true_answers) ** 2)
    assert projected_mse < raw_mse


def test_estimates_are_consistent_tables_of_one_nonnegative_x(released, small_plan):
    plan, model, x, chunk = released
    y = recover_measurements(model, chunk.blocks)
    result = project_nonnegative(model, y)
    estimates = workload_estimates(model, result.x)
    # the spec's queries in order: age prefix (6), age x sex (12), sex x edu prefix (6)
    age_prefix, age_sex, sex_edu = estimates[:, :6], estimates[:, 6:18], estimates[:, 18:24]
    age = age_sex.reshape(-1, 6, 2).sum(axis=2)
    assert np.allclose(age_prefix, np.cumsum(age, axis=1), atol=1e-8)
    sex_from_age = age_sex.reshape(-1, 6, 2).sum(axis=1)
    sex_from_edu = sex_edu.reshape(-1, 2, 3)[:, :, -1]  # the prefix's last row is the sex total
    assert np.allclose(sex_from_age, sex_from_edu, atol=1e-8)
    assert (estimates >= -1e-9).all()


def test_objective_is_the_noise_metric_distance(released):
    plan, model, x, chunk = released
    y = recover_measurements(model, chunk.blocks)
    result = project_nonnegative(model, {k: v[:20] for k, v in y.items()})
    direct = np.zeros(20)
    for block in model.blocks:
        residual = y[block.block_id][:20] - model.marginal(result.x, block) @ block.basis.T
        direct += np.einsum("ij,jk,ik->i", residual, np.linalg.inv(block.sigma), residual)
    assert np.allclose(result.objective, direct, rtol=1e-8, atol=1e-8)


def test_whitened_measurements_give_the_same_projection(released):
    """The estimate's path: the answers whitened in one product (``C^-1 R a``) and projected with
    ``whitened=True`` equal the measurements recovered, then whitened (``C^-1 (R a)``)."""
    plan, model, x, chunk = released
    y = recover_measurements(model, chunk.blocks)
    white = whitened_measurements(model, chunk.blocks)
    for block in model.blocks:
        np.testing.assert_allclose(white[block.block_id], y[block.block_id] @ block.whitener.T, rtol=1e-12,
                                   atol=1e-10)
    plain, fused = project_nonnegative(model, y), project_nonnegative(model, white, whitened=True)
    assert fused.converged.all()
    np.testing.assert_allclose(fused.x, plain.x, rtol=0, atol=1e-8)
    np.testing.assert_allclose(fused.objective, plain.objective, rtol=1e-8, atol=1e-8)


def test_measurements_of_the_wrong_shape_are_refused(released):
    plan, model, x, chunk = released
    y = recover_measurements(model, chunk.blocks)
    first = model.blocks[0].block_id
    with pytest.raises(ValueError, match=f"measurements\\['{first}'\\]"):
        project_nonnegative(model, dict(y, **{first: y[first][:, :-1]}))
    with pytest.raises(ValueError, match="no measurement"):
        project_nonnegative(model, {k: v for k, v in y.items() if k != first})


def test_structured_hessian_path_equals_clarabel_and_never_hurts(monkeypatch):
    """A PL94-like model (H block diagonal over one attribute plus low rank) takes the Woodbury
    path (distfit.estimate.structure); the result is Clarabel's and the dense path's."""
    rng = np.random.default_rng(8)
    domain, blocks = structured_blocks(rng)
    model = model_from_blocks(domain, blocks)
    x = rng.poisson(rng.choice([0.0, 0.4, 5.0], size=(60, domain.size))).astype(float)
    answers, truth = simulate(rng, model, x)
    y = recover_measurements(model, answers)
    assert projection.hessian_structure(normal_equations(model, y)[0], model.sizes) is not None
    result = project_nonnegative(model, y)
    assert result.converged.all() and (result.x >= 0).all()
    for unit in range(4):
        value, reference = cvx_projection(model, y, unit)
        assert result.objective[unit] == pytest.approx(value, rel=1e-6, abs=1e-9)
        rows_ours, rows_theirs = measured_rows(model, result.x[unit:unit + 1]), measured_rows(model, reference[None, :])
        assert np.abs(rows_ours - rows_theirs).max() <= 1e-6 * max(1.0, np.abs(rows_theirs).max())
    for unit in range(x.shape[0]):  # never worse than the measurements, draw by draw
        raw = projected = 0.0
        for block in model.blocks:
            estimate = model.marginal(result.x[unit:unit + 1], block) @ block.basis.T
            raw += np.sum(((y[block.block_id][unit] - truth[block.block_id][unit]) @ block.whitener.T) ** 2)
            projected += np.sum(((estimate[0] - truth[block.block_id][unit]) @ block.whitener.T) ** 2)
        assert projected <= raw * (1 + 1e-9) + 1e-9, unit
    monkeypatch.setattr(projection, "projection_structure", lambda model: None)  # the dense path
    dense = project_nonnegative(model, y)
    assert np.allclose(dense.x, result.x, rtol=1e-8, atol=1e-8)
    assert np.allclose(dense.objective, result.objective, rtol=1e-9, atol=1e-9)


def test_structured_path_in_batches_gives_the_same_projection(monkeypatch):
    """project_nonnegative computes g, the objective's constant and x batch by batch on the
    structured path: small batches give the same result as one."""
    rng = np.random.default_rng(9)
    domain, blocks = structured_blocks(rng)
    model = model_from_blocks(domain, blocks)
    x = rng.poisson(rng.choice([0.0, 0.4, 5.0], size=(23, domain.size))).astype(float)
    y = recover_measurements(model, simulate(rng, model, x)[0])
    whole = project_nonnegative(model, y)
    monkeypatch.setattr(projection, "STRUCTURE_BATCH", 5)
    batched = project_nonnegative(model, y)
    assert whole.converged.all() and batched.converged.all()
    assert np.allclose(batched.x, whole.x, rtol=1e-10, atol=1e-10)
    assert np.allclose(batched.objective, whole.objective, rtol=1e-10, atol=1e-10)


def test_answers_give_the_same_projection(released):
    """``answers=True`` (``g`` in one product from the released answers, as ``distfit estimate``
    projects) equals the recovered measurements' projection."""
    plan, model, x, chunk = released
    plain = project_nonnegative(model, recover_measurements(model, chunk.blocks))
    direct = project_nonnegative(model, chunk.blocks, answers=True)
    assert direct.converged.all()
    np.testing.assert_allclose(direct.x, plain.x, rtol=0, atol=1e-8)
    np.testing.assert_allclose(direct.objective, plain.objective, rtol=1e-8, atol=1e-8)
    first = model.blocks[0].block_id
    with pytest.raises(ValueError, match=f"measurements\\['{first}'\\]"):
        project_nonnegative(model, dict(chunk.blocks, **{first: chunk.blocks[first][:, :-1]}), answers=True)


def square_structured_model(rng):
    """One block measuring every cell (k = cells, as PL94's), ``H = B^T B`` block diagonal over
    ``c`` (4 x 4 blocks) plus rank 3, a tall recon: the structured path's objective then needs
    no constant (it is ``(x - H^-1 g)^T H (x - H^-1 g)``)."""
    domain = Domain(("a", "b", "c"), (2, 2, 9))
    detail = rng.standard_normal((4, 4))
    coupling = rng.standard_normal((domain.size, 3))
    information = np.kron(detail @ detail.T + 2 * np.eye(4), np.eye(9)) + coupling @ coupling.T
    basis = np.linalg.cholesky(information).T
    k = domain.size
    block = types.SimpleNamespace(block_id="b0", attributes=("a", "b", "c"), basis=basis,
                                  recon=rng.standard_normal((k + 4, k)) + 3 * np.eye(k + 4, k, -4),
                                  sigma=np.eye(k), query_index=np.arange(k + 4))
    return model_from_blocks(domain, [block])


def test_square_structured_objective_needs_no_constant(monkeypatch):
    """A square structured model: the objective from the solver alone (answers path, measurements
    path, and units left to the dense method after too few active-set steps) is the noise-metric
    distance, and agrees with Clarabel."""
    rng = np.random.default_rng(12)
    model = square_structured_model(rng)
    x = rng.poisson(rng.choice([0.0, 0.4, 5.0], size=(30, model.cells))).astype(float)
    answers, _truth = simulate(rng, model, x)
    y = recover_measurements(model, answers)
    assert projection.hessian_structure(normal_equations(model, y)[0], model.sizes) is not None
    block = model.blocks[0]
    results = [project_nonnegative(model, y), project_nonnegative(model, answers, answers=True)]
    monkeypatch.setattr(projection, "NEWTON_STEPS", 2)  # some units end on the dense path
    results.append(project_nonnegative(model, answers, answers=True))
    for result in results:
        assert result.converged.all()
        residual = y[block.block_id] - result.x @ block.basis.T
        direct = np.einsum("ij,jk,ik->i", residual, np.linalg.inv(block.sigma), residual)
        np.testing.assert_allclose(result.objective, direct, rtol=1e-8, atol=1e-8)
        np.testing.assert_allclose(result.x, results[0].x, rtol=0, atol=1e-8 * np.abs(results[0].x).max())
    value, _reference = cvx_projection(model, y, 0)
    assert results[0].objective[0] == pytest.approx(value, rel=1e-6, abs=1e-9)


def cell_query_model(rng):
    """PL94 in small: one square block measuring every cell (``H = B^T B`` block diagonal over
    ``c`` plus rank 3) whose queries are four marginal sums and then every cell (``recon``'s last
    rows ``B^-1``): the answers to the cell queries are the unconstrained estimate ``H^-1 g``."""
    domain = Domain(("a", "b", "c"), (2, 2, 9))
    detail = rng.standard_normal((4, 4))
    coupling = rng.standard_normal((domain.size, 3))
    information = np.kron(detail @ detail.T + 2 * np.eye(4), np.eye(9)) + coupling @ coupling.T
    basis = np.linalg.cholesky(information).T
    sums = np.zeros((4, domain.size))
    sums[0], sums[1, ::2], sums[2, :18], sums[3, 5::7] = 1.0, 1.0, 1.0, 1.0
    inverse = np.linalg.inv(basis)
    block = types.SimpleNamespace(block_id="b0", attributes=("a", "b", "c"), basis=basis,
                                  recon=np.vstack([sums @ inverse, inverse]), sigma=np.eye(domain.size),
                                  query_index=np.arange(4 + domain.size))
    return model_from_blocks(domain, [block])


def test_cell_query_answers_are_the_unconstrained_estimate(monkeypatch):
    """Where the cell queries' answers are ``H^-1 g`` (one square block, the workload holding
    every cell), the projection starts from them (no ``g`` product, no first solve) and gives
    the projection computed from ``g``, and Clarabel's; elsewhere they are not used."""
    rng = np.random.default_rng(21)
    model = cell_query_model(rng)
    hessian = projection._information(model)
    assert projection.unconstrained_answers(model, hessian) == slice(4, 4 + model.cells)
    other = square_structured_model(rng)
    assert projection.unconstrained_answers(other, projection._information(other)) is None
    x = rng.poisson(rng.choice([0.0, 0.4, 5.0], size=(40, model.cells))).astype(float)
    answers, _truth = simulate(rng, model, x)
    y = recover_measurements(model, answers)
    assert projection.hessian_structure(hessian, model.sizes) is not None
    direct = project_nonnegative(model, answers, answers=True)
    calls = []
    monkeypatch.setattr(projection, "_model_unconstrained_answers", lambda *args: calls.append(args) and None)
    through_g = project_nonnegative(model, answers, answers=True)
    assert calls and direct.converged.all() and through_g.converged.all()
    scale = np.abs(through_g.x).max()
    np.testing.assert_allclose(direct.x, through_g.x, rtol=0, atol=1e-9 * scale)
    np.testing.assert_allclose(direct.objective, through_g.objective, rtol=1e-8, atol=1e-9)
    value, reference = cvx_projection(model, y, 0)
    assert direct.objective[0] == pytest.approx(value, rel=1e-6, abs=1e-9)
    assert np.abs(direct.x[0] - reference).max() <= 1e-5 * max(1.0, np.abs(reference).max())
    # x into a given array (the query estimates' cell columns); a wrong one refused, naming it
    queries = np.full((40, 4 + model.cells), np.nan)
    into = project_nonnegative(model, answers, answers=True, out=queries[:, 4:])
    assert np.shares_memory(into.x, queries) and np.array_equal(into.x, through_g.x)  # the path patched above
    with pytest.raises(ValueError, match="out: float64 \\(40, 36\\)"):
        project_nonnegative(model, answers, answers=True, out=np.empty((40, 2 * model.cells))[:, ::2])  # strided rows
    with pytest.raises(ValueError, match="out: float32"):
        project_nonnegative(model, answers, answers=True, out=np.empty((40, model.cells), dtype=np.float32))


def test_a_prepared_model_arrives_ready(monkeypatch):
    """prepare_projection keeps H, its structure, the unconstrained columns and each block's
    answer_linear on the model: pickled (as it is sent to a worker) and projected, none of them
    is derived again, and the result is a fresh model's, bit for bit."""
    model, twin = cell_query_model(np.random.default_rng(22)), cell_query_model(np.random.default_rng(22))
    rng = np.random.default_rng(23)
    x = rng.poisson(rng.choice([0.0, 0.4, 5.0], size=(30, model.cells))).astype(float)
    answers, _truth = simulate(rng, model, x)
    fresh = project_nonnegative(twin, answers, answers=True)
    assert projection.prepare_projection(model) is model
    sent = pickle.loads(pickle.dumps(model))
    assert {"information (dense)", "structure (dense)", "unconstrained (dense)"} <= set(sent.derived)

    def derived_again(*_args):
        raise AssertionError("derived again after pickling")
    monkeypatch.setattr(projection, "hessian_structure", derived_again)
    monkeypatch.setattr(projection, "unconstrained_answers", derived_again)
    monkeypatch.setattr(projection, "_build_information", derived_again)
    monkeypatch.setattr(np.linalg, "cond", derived_again)  # answer_linear's
    got = project_nonnegative(sent, answers, answers=True)
    assert got.converged.all() and not sent.derived["information (dense)"].flags.writeable  # shared: read-only
    np.testing.assert_array_equal(got.x, fresh.x)
    np.testing.assert_array_equal(got.objective, fresh.objective)
