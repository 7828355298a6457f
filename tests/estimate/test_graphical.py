"""The graphical-model estimate (distfit.estimate.graphical, issue 15) against independent convex
programs (cvxpy/Clarabel): the exact model against the projection with the same total, the
region graph against the saturated local polytope; consistency of the cliques; the refusal."""
from __future__ import annotations

import io
import itertools

import cvxpy as cp
import mbi  # noqa: F401 - the graphical extra is part of the test extra: its absence fails here
import numpy as np
import pytest

from distfit.estimate import graphical
from distfit.estimate.measurements import measurement_model, recover_measurements
from distfit.release.job import run_release
from distfit.stores.data import write_synthetic
from distfit.stores.estimate import read_estimate, verify_estimate
from distfit.stores.plan import read_plan
from distfit.stores.release import read_release
from distfit.runtime.placement import Placement
from tests.clitools import assert_one_line_error, run
from tests.reference import shared_disagreement
from tests.storetools import planned


#: Mirror descent steps enough for the region graph to stop by its tolerance on the small units
#: below (the first unit's own estimate stopped after 10,550).
STOPPED_BY_TOLERANCE = 20_000


def plan_model(tmp_path_factory, name, attributes, orders, target=1.0):
    """The measurement model of a real residual plan: every k-way identity marginal, k in orders,
    each query's variance target ``target``."""
    spec = {"name": name, "attributes": [{"name": a, "size": n} for a, n in attributes],
            "queries": [{"name": f"m{k}", "marginals": {"order": k}, "target": target} for k in orders]}
    return measurement_model(read_plan(planned(tmp_path_factory.mktemp(name), spec).plan))


def one_unit(model, total, seed, concentration=0.2):
    """A sparse unit (nonnegativity binds) released through the plan's blocks, recovered."""
    rng = np.random.default_rng(seed)
    x = rng.multinomial(total, rng.dirichlet(np.full(model.cells, concentration))).astype(float)[None, :]
    answers = {}
    for b in model.blocks:
        z = rng.multivariate_normal(np.zeros(b.rows), b.sigma)
        answers[b.block_id] = (model.marginal(x, b) @ b.basis.T + z) @ b.recon.T
    return x[0], {k: v[0] for k, v in recover_measurements(model, answers).items()}



@pytest.fixture(scope="module")
def five(tmp_path_factory):
    """5 attributes of 4 values (1,024 cells), all 2-way and 3-way marginals: both methods run."""
    return plan_model(tmp_path_factory, "five", [(f"a{i}", 4) for i in range(5)], (2, 3))


def test_exact_model_equals_the_projection_with_the_same_total(five):
    """Exact inference (the junction tree is the whole 1,024-cell domain) gives the marginals of
    the projection argmin_{x >= 0, 1^T x = N} sum_b ||C_b^-1 (y_b - B_b M_b x)||^2 (Clarabel), to
    1e-3 of the total (measured 1e-4: mirror descent's tail where cells are zero)."""
    _, y = one_unit(five, 300, seed=1)
    problem = graphical.graphical_problem(five, method="exact")
    assert problem.method == "exact" and problem.junction_cells == five.cells
    est = graphical.estimate_graphical(problem, y)
    g = np.vstack([b.whitened_basis @ five.marginal(np.eye(five.cells), b).T for b in five.blocks])
    yw = np.concatenate([b.whitener @ y[b.block_id] for b in five.blocks])
    xv = cp.Variable(five.cells, nonneg=True)
    ref = cp.Problem(cp.Minimize(cp.sum_squares(g @ xv - yw)), [cp.sum(xv) == est.total])
    ref.solve(solver=cp.CLARABEL)
    x = np.maximum(xv.value, 0.0)
    assert est.objective >= ref.value - 1e-6 * ref.value  # nothing beats the optimum
    assert est.objective <= 1.01 * ref.value
    for clique, table in est.marginals.items():
        block = next(b for b in five.blocks if b.attributes == clique)
        assert table.min() >= 0
        np.testing.assert_allclose(table.reshape(-1), five.marginal(x[None], block)[0], atol=1e-3 * est.total)
    reference = np.zeros(five.num_queries)
    for b in five.blocks:
        np.add.at(reference, b.query_index, b.query_rows @ five.marginal(x[None], b)[0])
    np.testing.assert_allclose(est.estimates, reference, atol=1e-3 * est.total)
    assert shared_disagreement(est.marginals) <= 1e-6 * est.total


def local_polytope(model, y, total, regions):
    """The APPGM problem solved by Clarabel: min sum_b ||G_b M_b tau - C_b^-1 y_b||^2 over the
    local polytope of ``regions`` (nonnegative tables of sum ``total``, parents marginalise onto
    children). By the paper's invariance result this is what convex GBP converges to."""
    size = dict(zip(model.attributes, model.sizes))
    tau = {r: cp.Variable([size[a] for a in r], nonneg=True) for r in regions}
    cons = [cp.sum(tau[r]) == total for r in regions]
    for r, s in itertools.permutations(regions, 2):
        if set(s) < set(r):
            axes = tuple(i for i, a in enumerate(r) if a not in s)
            marg = tau[r]
            for axis in sorted(axes, reverse=True):
                marg = cp.sum(marg, axis=axis)
            cons.append(marg == tau[s])
    terms = []
    for b in model.blocks:
        if b.attributes:
            r = min((r for r in regions if set(b.attributes) <= set(r)), key=len)
            axes = tuple(i for i, a in enumerate(r) if a not in b.attributes)
            marg = tau[r]
            for axis in sorted(axes, reverse=True):
                marg = cp.sum(marg, axis=axis)
            terms.append(cp.sum_squares(b.whitened_basis @ cp.vec(marg, order="C") - b.whitener @ y[b.block_id]))
    problem = cp.Problem(cp.Minimize(sum(terms)), cons)
    problem.solve(solver=cp.CLARABEL)
    return {r: tau[r].value for r in regions}, problem.value


def test_region_graph_solves_the_saturated_local_polytope(tmp_path_factory):
    """4 attributes of 3 values, all 3-way marginals: APPGM's pseudo-marginals equal Clarabel's
    on the saturated region graph (triples, pairs, singletons) to 2e-3 of the total (measured
    5.9e-4: the messages lag the potentials by a few sweeps, a small bias that the final sweeps
    do not undo), and agree with each other on shared attributes to 1e-6 of the total."""
    model = plan_model(tmp_path_factory, "four", [(f"b{i}", 3) for i in range(4)], (3,))
    _, y = one_unit(model, 200, seed=2)
    problem = graphical.graphical_problem(model, method="region-graph")
    est = graphical.estimate_graphical(problem, y)
    assert est.method == "region-graph"
    names = model.attributes
    regions = [c for k in (1, 2, 3) for c in itertools.combinations(names, k)]
    ref, optimum = local_polytope(model, y, est.total, regions)
    # measured: 0.6% above the optimum after the final sweeps (the lag bias, module docstring)
    assert optimum - 1e-6 * optimum <= est.objective <= 1.02 * optimum
    for clique, table in est.marginals.items():
        assert table.min() >= 0
        np.testing.assert_allclose(table, ref[clique], atol=2e-3 * est.total)
    assert shared_disagreement(est.marginals) <= 1e-6 * est.total
    assert est.inconsistency <= 1e-6


@pytest.fixture(scope="module")
def four(tmp_path_factory):
    """4 attributes of 3 values, all 3-way marginals: a saturated region graph with a cycle."""
    return plan_model(tmp_path_factory, "four_agree", [(f"b{i}", 3) for i in range(4)], (3,))


@pytest.mark.parametrize("method", ["exact", "region-graph"])
def test_cliques_agree_to_1e_minus_6_of_the_total_on_sparse_units(four, five, method):
    """Every method, one unit at a time and a chunk at once: the marginals of any two cliques
    agree on their shared attributes to 1e-6 of the total (independent pairwise check), also on
    sparse units (Dirichlet 0.05: over half the cells empty, the region graph's messages converge slowly
    there and the final I-projection closes the gap; last session one such unit agreed to only
    2e-6), and the reported inconsistency says the same."""
    cases = [(four, [(30, 11), (300, 12)])]
    if method == "exact":
        cases.append((five, [(40, 14)]))
    for model, units in cases:
        problem = graphical.graphical_problem(model, method=method)
        ys = [one_unit(model, total, seed, concentration=0.05)[1] for total, seed in units]
        sparse = [one_unit(model, total, seed, concentration=0.05)[0] for total, seed in units]
        assert all((x == 0).mean() > 0.5 for x in sparse)
        for y in ys:
            est = graphical.estimate_graphical(problem, y)
            assert shared_disagreement(est.marginals) <= 1e-6 * est.total
            assert est.inconsistency <= 1e-6 and min(t.min() for t in est.marginals.values()) >= 0
        chunk = graphical.estimate_units(problem, {b.block_id: np.stack([y[b.block_id] for y in ys]) for b in model.blocks})
        assert (chunk.inconsistency <= 1e-6).all()
        sizes = [int(np.prod([model.sizes[model.attributes.index(a)] for a in c])) for c in problem.cliques]
        for u in range(len(ys)):
            parts = np.split(chunk.marginals[u], np.cumsum(sizes)[:-1])
            tables = {c: t.reshape([model.sizes[model.attributes.index(a)] for a in c]) for c, t in zip(problem.cliques, parts)}
            assert shared_disagreement(tables) <= 1e-6 * parts[0].sum()


def test_region_graph_starts_at_the_raw_answers(four):
    """The warm start puts ``log`` of each region's raw table on every region (cliques and
    intersections): on a dense unit whose raw clique tables are all above the clamp (1/2),
    convex GBP's fixed point is the raw tables themselves, so with no mirror descent step the
    estimates are the raw answers: the queries of any x that fits the measurements exactly
    (least squares), to 1e-6 of the total. (Potentials on the cliques alone, the earlier start,
    were off by percents of the total.)"""
    rng = np.random.default_rng(21)
    x = rng.multinomial(20_000, np.full(four.cells, 1.0 / four.cells)).astype(float)[None, :]
    answers = {b.block_id: (four.marginal(x, b) @ b.basis.T + rng.multivariate_normal(np.zeros(b.rows), b.sigma)[None]) @ b.recon.T
               for b in four.blocks}
    y = {k: v[0] for k, v in recover_measurements(four, answers).items()}
    stacked = np.vstack([b.basis @ four.marginal(np.eye(four.cells), b).T for b in four.blocks])
    fitted = np.linalg.lstsq(stacked, np.concatenate([y[b.block_id] for b in four.blocks]), rcond=None)[0][None]
    assert min(four.marginal(fitted, b).min() for b in four.blocks) > 0.5  # no clique cell clamped
    raw = np.zeros(four.num_queries)
    for b in four.blocks:
        np.add.at(raw, b.query_index, b.query_rows @ four.marginal(fitted, b)[0])
    est = graphical.estimate_graphical(graphical.graphical_problem(four, method="region-graph"), y, iterations=0)
    assert est.iterations == 0
    np.testing.assert_allclose(est.estimates, raw, atol=1e-6 * est.total)


def test_method_rule_and_refusal(five):
    """Auto picks the local polytope for a residual plan, and exact inference for its small
    junction tree when the local polytope would exceed the memory limit; a model over the limit
    is refused with one line naming its largest clique and the memory it needs."""
    local = graphical.graphical_problem(five, method="auto")
    assert local.method == "local" and local.junction_cells is None
    exact = graphical.graphical_problem(five, memory_limit=local.memory_bytes - 1)
    assert exact.method == "exact" and exact.memory_bytes < local.memory_bytes
    with pytest.raises(graphical.ModelTooLarge) as info:
        graphical.graphical_problem(five, memory_limit=1 << 16)
    message = str(info.value)
    assert "\n" not in message
    assert "largest clique (a0, a1, a2, a3, a4) has 1,024 cells" in message
    assert "GiB" in message
    with pytest.raises(ValueError, match="method"):
        graphical.graphical_problem(five, method="junction")


def test_bad_measurements_are_refused_naming_the_block(five):
    _, y = one_unit(five, 50, seed=3)
    problem = graphical.graphical_problem(five)
    first = five.blocks[0].block_id
    with pytest.raises(ValueError, match=f"no measurement for block '{first}'"):
        graphical.estimate_graphical(problem, {k: v for k, v in y.items() if k != first})
    with pytest.raises(ValueError, match=f"measurements\\['{first}'\\]"):
        graphical.estimate_graphical(problem, {**y, first: np.append(y[first], 1.0)})


def test_use_graphical_above_the_projection_limit(five):
    assert not graphical.use_graphical(five)
    assert graphical.PROJECTION_MAX_CELLS < 6 * 5 * 5 * 7 * 5 * 8 * 6 * 5 * 2 * 3 * 3 * 6 * 6 * 2  # Adult


def test_units_of_a_chunk_are_estimated_together(tmp_path_factory):
    """estimate_units propagates several units at once on the region graph: each unit's
    estimates match its own estimate_graphical (both solve the same convex problem) to 5e-3 of
    its total, marginals are laid out clique by clique, and they are nonnegative. Both are run
    until they stop by their tolerance (``ITERATIONS`` is too few on sparse units: with jax
    0.10.2, numpy 2.4 and optax 0.2.8 a unit of 200 people drawn with seed 4 was 2.4e-3 of its
    total and 3.6 % apart in objective after 3,000 steps, and needed 10,550 steps to stop). The
    units, 200 and 50 people over 81 cells (seeds 6 and 5: objectives 4.5 and 26.8, so
    nonnegativity binds), stop by the tolerance in 2,800 and 1,700 steps."""
    model = plan_model(tmp_path_factory, "four_units", [(f"b{i}", 3) for i in range(4)], (3,))
    units = [one_unit(model, total, seed)[1] for total, seed in ((200, 6), (50, 5))]
    problem = graphical.graphical_problem(model, method="region-graph")
    chunk = graphical.estimate_units(problem, {b.block_id: np.stack([u[b.block_id] for u in units]) for b in model.blocks},
                                     iterations=STOPPED_BY_TOLERANCE)
    # each unit alone, once: these estimates also give the layout's size (a third estimate, only
    # for that size, was a sixth of the test's time)
    alones = [graphical.estimate_graphical(problem, y, iterations=STOPPED_BY_TOLERANCE) for y in units]
    assert chunk.estimates.shape == (2, model.num_queries)
    assert chunk.marginals.shape == (2, sum(t.size for t in alones[0].marginals.values()))
    assert chunk.marginals.min() >= 0 and chunk.converged.tolist() == [True, True]
    for u, alone in enumerate(alones):
        assert alone.iterations < STOPPED_BY_TOLERANCE
        np.testing.assert_allclose(chunk.estimates[u], alone.estimates, atol=5e-3 * alone.total)
        np.testing.assert_allclose(chunk.marginals[u, :27], alone.marginals[problem.cliques[0]].reshape(-1), atol=5e-3 * alone.total)
        assert abs(chunk.objective[u] - alone.objective) <= 5e-3 * alone.objective


def test_region_graph_reports_progress_every_batch_of_steps(tmp_path_factory):
    """estimate_units calls progress(steps, at most) after every CHECK_EVERY mirror descent steps
    of the region graph: steps rise by CHECK_EVERY, the bound is the iteration cap, and the last
    call is the chunk's own step count."""
    model = plan_model(tmp_path_factory, "four_progress", [(f"b{i}", 3) for i in range(4)], (3,))
    _, y = one_unit(model, 80, seed=6)
    problem = graphical.graphical_problem(model, method="region-graph")
    calls = []
    chunk = graphical.estimate_units(problem, {b: v[None] for b, v in y.items()}, iterations=400,
                                     progress=lambda done, total: calls.append((done, total)))
    assert calls and all(total == 400 for _, total in calls)
    assert [done for done, _ in calls] == list(range(graphical.CHECK_EVERY, calls[-1][0] + 1, graphical.CHECK_EVERY))
    assert calls[-1][0] == chunk.iterations <= 400


@pytest.mark.parametrize("method", ["graphical-region-graph", "graphical"])
def test_distfit_estimate_through_a_graphical_model(tmp_path, capsys, monkeypatch, method):
    """`distfit estimate --method ...` end to end on a 4-attribute plan of all 3-way marginals
    (the graphical path forced below the cells threshold): a sealed store whose method names the
    inference, nonnegative clique marginals that agree on shared attributes, query estimates
    equal to the marginals' sums (the estimate_units of the recovered answers), no cells array;
    --integer is refused with one line and nothing written. Serial, the three chunks use the
    driver's graphical problem: it is built once."""
    spec = {"name": "wide", "attributes": [{"name": f"b{i}", "size": 3} for i in range(4)],
            "queries": [{"name": "m3", "marginals": {"order": 3}, "target": 1.0}]}
    loaded = planned(tmp_path, spec).spec
    write_synthetic(loaded, 5, tmp_path / "data.zarr", seed=3, chunk_units=2, fsync=False)
    run_release(tmp_path / "plan.zarr", tmp_path / "data.zarr", tmp_path / "release.zarr", seed=11,
                placement=Placement(serial=True), fsync=False, log=io.StringIO())
    args = [str(tmp_path / "plan.zarr"), str(tmp_path / "release.zarr")]
    code, _, err = run(capsys, "estimate", *args, "--out", str(tmp_path / "bad.zarr"), "--method", method,
                       "--integer", "--serial")
    assert code == 2 and not (tmp_path / "bad.zarr").exists()
    assert_one_line_error(err, "--integer", "graphical")
    built = []
    original = graphical.graphical_problem
    monkeypatch.setattr(graphical, "graphical_problem", lambda *a, **k: built.append(k) or original(*a, **k))
    code, out, err = run(capsys, "estimate", *args, "--out", str(tmp_path / "est.zarr"), "--method", method, "--serial")
    assert code == 0, err
    assert len(built) == 1, built
    monkeypatch.undo()
    expected = "graphical-region-graph" if method == "graphical-region-graph" else "graphical-local"
    assert expected in out
    assert verify_estimate(tmp_path / "est.zarr")[0]
    est = read_estimate(tmp_path / "est.zarr")
    assert est.method == expected and est.attrs["objective"].startswith("sum_b")
    assert "cells" not in est._group  # noqa: SLF001 - the layout: no data vector for a graphical model
    marginals = est.marginals
    assert len(marginals) == 4 and all(t.shape == (5, 3, 3, 3) for t in marginals.values())
    estimates = np.asarray(est.estimates[...])
    assert estimates.min() >= 0
    for u in range(5):
        unit = {c: t[u] for c, t in marginals.items()}
        assert min(t.min() for t in unit.values()) >= 0
        assert shared_disagreement(unit) <= 1e-6 * unit[next(iter(unit))].sum()
    model = measurement_model(read_plan(str(tmp_path / "plan.zarr")))
    release = read_release(tmp_path / "release.zarr")
    answers = {b.block_id: np.asarray(release.block_answers(b.block_id)[...]) for b in model.blocks}
    problem = graphical.graphical_problem(model, method=expected.removeprefix("graphical-"))
    reference = graphical.estimate_units(problem, recover_measurements(model, answers))
    # the chunks (2 units) restart their line searches and polish at other times than one 5-unit
    # batch: the same convex problem, solved to its tolerance (measured 6e-3 of the total)
    totals = np.asarray([t.sum() for t in next(iter(marginals.values()))])
    assert (np.abs(estimates - np.maximum(reference.estimates, 0.0)).max(axis=1) <= 1e-2 * totals).all()
