"""Closed-form residual blocks of identity marginals (distfit/plan/closed_form.py)."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

import distfit
from distfit.mathematics.domain import Domain
from distfit.mathematics.packing import block_arrays
from distfit.plan import decomposition
from distfit.plan.planner import plan_groups
from distfit.plan.residual import ResidualWorkload
from distfit.mathematics.bounds import certified_bound
from distfit.spec.parse import load_spec

ROOT = Path(__file__).resolve().parents[2]


def _marginals(sizes, order, targets=None):
    domain = Domain(tuple(f"a{i}" for i in range(len(sizes))), tuple(sizes))
    cliques = list(itertools.combinations(domain.names, order))
    targets = [1.0] * len(cliques) if targets is None else targets
    groups = [(".".join(c), {a: np.eye(domain.size_of(a)) for a in c}, float(t)) for c, t in zip(cliques, targets)]
    return domain, groups


def residual_program(sizes, cliques, targets) -> float:
    """ResidualPlanner's selection program (Xiao et al., NeurIPS 2023), written from the sizes
    alone: block S at noise level x_S costs ``c_S / x_S`` (``c_S = prod_{i in S} (1 - 1/n_i)``)
    and gives each cell query of marginal A the variance ``(d_S / d_A)^2 c_S x_S``;
    minimise ``sum_S c_S / x_S`` subject to every marginal's variance at most its target."""
    import cvxpy as cp

    subsets = sorted({s for c in cliques for r in range(len(c) + 1) for s in itertools.combinations(c, r)})
    index = {s: i for i, s in enumerate(subsets)}
    cost = np.array([np.prod([1 - 1 / sizes[a] for a in s]) for s in subsets])
    rows, cols, vals = [], [], []
    for j, clique in enumerate(cliques):
        d_a = np.prod([sizes[a] for a in clique])
        for r in range(len(clique) + 1):
            for s in itertools.combinations(clique, r):
                rows.append(j)
                cols.append(index[s])
                vals.append((np.prod([sizes[a] for a in s]) / d_a) ** 2 * cost[index[s]])
    import scipy.sparse

    matrix = scipy.sparse.csr_matrix((vals, (rows, cols)), shape=(len(cliques), len(subsets)))
    x = cp.Variable(len(subsets), pos=True)
    problem = cp.Problem(cp.Minimize(cost @ cp.inv_pos(x)), [matrix @ x <= np.asarray(targets, dtype=float)])
    problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-10, tol_gap_rel=1e-10)
    return float(problem.value)


@pytest.mark.parametrize("sizes, order, targets", [
    ((3, 4, 2), 2, [1.0, 2.0, 0.5]),
    ((2, 3, 3, 2), 3, [1.0, 1.5, 2.0, 3.0]),
    ((4, 3), 1, [2.0, 1.0]),
])
def test_closed_form_blocks_equal_the_smii_solution(sizes, order, targets):
    """Every residual block solved by ``distfit.solve`` (dual + SM-II, certified) has the closed
    form's sigma, alpha and row variances (to 1e-6), and the closed form's certificate (uniform
    cell weights, uniform weights on the binding segment's rows) proves its alpha."""
    domain, groups = _marginals(sizes, order, targets)
    workload = ResidualWorkload(domain, groups)
    subsets = [s for s in workload.subsets if workload.closed_form(s)]
    assert subsets == list(workload.subsets)
    closed = workload.closed_form_blocks(subsets)
    pack = closed.pack(np.ones(len(closed)))
    for b, subset in enumerate(subsets):
        spec = workload.residual_block(subset)
        arrays = block_arrays(pack, domain.sizes, b)
        np.testing.assert_array_equal(arrays["query_index"], spec.query_index)
        np.testing.assert_allclose(arrays["recon"], spec.recon, rtol=1e-12, atol=1e-12)
        solution = distfit.solve(spec.workload, spec.targets, basis=spec.basis, gap_tolerance=1e-9, max_gap=1e-6)
        assert closed.alpha[b] == pytest.approx(solution.alpha, rel=1e-6)
        np.testing.assert_allclose(arrays["sigma"], solution.sigma, rtol=1e-6, atol=1e-9 * np.abs(solution.sigma).max())
        np.testing.assert_allclose(arrays["variances"], solution.variances, rtol=1e-6)
        assert np.max(arrays["variances"] / spec.targets) == pytest.approx(1.0, rel=1e-12)
        np.testing.assert_allclose(arrays["profile"], solution.profile, rtol=1e-6)
        bound = certified_bound(spec.basis, spec.recon / np.sqrt(spec.targets)[:, None], arrays["cell_weights"],
                                arrays["query_weights"])
        assert bound == pytest.approx(closed.alpha[b], rel=1e-9)


def test_default_plan_of_30_attributes_reaches_the_residual_optimum():
    """Issue 10's regression: 30 attributes of 10 values, all 2-way marginals, targets 1. The
    default plan (merging on) keeps every block closed-form and reaches the optimum of the
    convex residual program (309.796), exactly labelled; merging used to end 5.6% above."""
    sizes = (10,) * 30
    domain, groups = _marginals(sizes, 2)
    plan = plan_groups(domain, groups, max_cells=4096)
    optimum = residual_program(dict(zip(domain.names, sizes)), [tuple(g[1]) for g in groups], [1.0] * len(groups))
    assert optimum == pytest.approx(309.796, abs=1e-3)
    assert plan.alpha == pytest.approx(optimum, rel=1e-4)
    assert plan.alpha >= optimum * (1 - 1e-6)
    assert plan.alpha_exact and plan.num_blocks == 466 and not plan.blocks
    assert np.all(plan.variances <= plan.targets * (1 + 1e-9))
    assert any("closed form: 466 blocks" in line for line in plan.decisions)


def test_per_marginal_targets_and_merge_never_above_unmerged():
    """Targets 1 + (i + j) mod 4 on 8 attributes of 2-5 values: the default plan equals the
    residual program's optimum and is never above the ``merge: false`` plan."""
    sizes = (2, 3, 4, 5, 2, 3, 4, 5)
    names = tuple(f"a{i}" for i in range(len(sizes)))
    targets = [1.0 + (i + j) % 4 for i, j in itertools.combinations(range(len(sizes)), 2)]
    domain, groups = _marginals(sizes, 2, targets)
    merged = plan_groups(domain, groups, max_cells=4096)
    unmerged = plan_groups(domain, groups, max_cells=0)
    optimum = residual_program(dict(zip(names, sizes)), [tuple(g[1]) for g in groups], targets)
    assert merged.alpha == pytest.approx(optimum, rel=1e-4)
    assert merged.alpha <= unmerged.alpha * (1 + 1e-9)
    assert np.all(merged.variances <= merged.targets * (1 + 1e-9))


def test_mixed_workload_keeps_smii_blocks_and_meets_targets(monkeypatch):
    """On a large plan (here: the small-plan rule switched off), a prefix group makes the blocks
    it reaches SM-II blocks; the identity-only ones stay closed-form; every target is met and
    alpha is at most the all-SM-II plan's (+ its gap)."""
    monkeypatch.setattr(decomposition, "SMALL_SOLVED_WORK", 0.0)
    domain = Domain(("a", "b", "c"), (4, 3, 2))
    prefix = np.tril(np.ones((4, 4)))
    groups = [("ab", {"a": prefix, "b": np.eye(3)}, 1.0), ("bc", {"b": np.eye(3), "c": np.eye(2)}, 2.0),
              ("c", {"c": np.eye(2)}, 0.5)]
    plan = plan_groups(domain, groups, max_cells=0)
    reference = plan_groups(domain, groups, max_cells=0, closed_forms=False)
    assert plan.closed is not None and len(plan.closed) >= 1 and plan.blocks
    assert np.all(plan.variances <= plan.targets * (1 + 1e-9))
    assert plan.alpha <= reference.alpha * (1 + 1e-3)


@pytest.mark.parametrize("max_cells", [0, 64])
def test_small_mixed_plan_solves_its_closed_form_blocks(monkeypatch, max_cells):
    """PL94 (pipelines/pl94.yaml): its ``detailed`` identity group shares the total and the
    race blocks with the race-list groups, so on this small plan the six identity blocks are
    solved and merged with the rest, not put in closed form: alpha equals the all-SM-II plan's
    and is no higher than the plan with those blocks in closed form (which at ``max_cells: 64``
    put the total with the race block: 3.15 against the global optimum 2.36)."""
    spec = load_spec(str(ROOT / "pipelines" / "pl94.yaml"))
    plan = plan_groups(spec.domain, spec.group_triples(), max_cells=max_cells)
    solved = plan_groups(spec.domain, spec.group_triples(), max_cells=max_cells, closed_forms=False)
    monkeypatch.setattr(decomposition, "SMALL_SOLVED_WORK", 0.0)
    mixed_closed = plan_groups(spec.domain, spec.group_triples(), max_cells=max_cells)
    assert plan.closed is None and mixed_closed.closed is not None
    assert plan.alpha == pytest.approx(solved.alpha, rel=1e-9)
    assert plan.alpha <= mixed_closed.alpha * (1 + 1e-6)
    assert np.all(plan.variances <= plan.targets * (1 + 1e-9))
    if max_cells == 64:
        whole = distfit.solve(spec.workload().matrix, spec.workload().targets)
        assert plan.alpha <= whole.alpha * 1.01  # the price of blocks: 2.37988 / 2.36339
