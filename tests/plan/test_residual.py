"""Residual blocks, exact cuts and scale allocation (DESIGN.md section 2)."""
from __future__ import annotations

import itertools

import cvxpy as cp
import numpy as np
import pytest

import distfit
from tests.reference import mixed_marginal_workload
from distfit.plan.residual import (
    allocate_scales,
    connected_blocks,
    difference_matrix,
    ResidualWorkload,
    merge_blocks,
    residual_blocks,
    stitched_profile,
)
from distfit.domain import Domain
from distfit.workload import kron_queries, prefix_queries, workload_from_groups


def _two_way(sizes):
    domain = Domain(tuple(f"a{i}" for i in range(len(sizes))), tuple(sizes))
    groups = [
        (f"{a},{b}", {a: np.eye(domain.size_of(a)), b: np.eye(domain.size_of(b))}, 1.0)
        for a, b in itertools.combinations(domain.names, 2)
    ]
    return domain, groups


def _marginalise(domain, attributes):
    """Full-domain -> marginal map (cells of the marginal x d)."""
    return kron_queries(domain, {a: np.eye(domain.size_of(a)) for a in attributes})


def _plan(domain, groups):
    blocks = residual_blocks(domain, groups)
    solutions = [distfit.solve(b.workload, b.targets, basis=b.basis) for b in blocks]
    workload = workload_from_groups(domain, groups)
    allocation = allocate_scales(
        [s.alpha for s in solutions], [(b.query_index, s.variances) for b, s in zip(blocks, solutions)], workload.targets
    )
    return blocks, solutions, allocation, workload


def test_difference_matrix_splits_identity():
    for n in (2, 3, 7):
        difference = difference_matrix(n)
        assert difference.shape == (n - 1, n)
        np.testing.assert_allclose(np.ones((n, n)) / n + np.linalg.pinv(difference) @ difference, np.eye(n), atol=1e-12)


def test_residual_rows_reassemble_the_workload_exactly():
    domain = Domain(("age", "sex", "edu"), (5, 2, 3))
    rng = np.random.default_rng(3)
    groups = [
        ("age", {"age": prefix_queries(5)}, rng.uniform(1, 4, 5)),
        ("age,sex", {"age": prefix_queries(5), "sex": np.eye(2)}, 2.0),
        ("sex,edu", {"sex": np.eye(2), "edu": rng.normal(size=(4, 3))}, 1.5),
        ("total", {}, 3.0),
    ]
    workload = workload_from_groups(domain, groups)
    rebuilt = np.zeros_like(workload.matrix)
    for block in residual_blocks(domain, groups):
        full_rows = block.recon @ block.basis @ _marginalise(domain, block.attributes)
        np.add.at(rebuilt, block.query_index, full_rows)
        np.testing.assert_array_equal(block.targets, workload.targets[block.query_index])
    np.testing.assert_allclose(rebuilt, workload.matrix, atol=1e-10)


def test_residual_bases_are_orthogonal_across_blocks():
    domain, groups = _two_way((3, 2, 4))
    blocks = residual_blocks(domain, groups)
    lifted = [b.basis @ _marginalise(domain, b.attributes) for b in blocks]
    for first, second in itertools.combinations(lifted, 2):
        np.testing.assert_allclose(first @ second.T, 0.0, atol=1e-10)


@pytest.mark.parametrize(
    "sizes, expected, count",
    [((3,) * 5, 4.9253, 16), ((2,) * 7, 5.4338, 29), ((4,) * 4, 3.8835, 11)],
)
def test_two_way_marginals_match_design_figures(sizes, expected, count):
    domain, groups = _two_way(sizes)
    blocks, solutions, allocation, workload = _plan(domain, groups)
    assert len(blocks) == count
    assert allocation.alpha_bound == pytest.approx(expected, rel=1e-3)
    assert allocation.lower_bound <= allocation.alpha_bound * (1 + 1e-9)
    # Sequential composition evaluated cell by cell equals the sum bound (flat block profiles).
    profile = stitched_profile(domain, [(b.attributes, s.profile / k) for b, s, k in zip(blocks, solutions, allocation.scales)])
    assert profile.max() == pytest.approx(allocation.alpha_bound, rel=1e-6)
    variances = np.zeros(workload.targets.size)
    for block, solution, scale in zip(blocks, solutions, allocation.scales):
        np.add.at(variances, block.query_index, solution.variances * scale)
    assert np.all(variances <= workload.targets * (1 + 1e-9))


def test_stitched_profile_equals_the_whole_mechanism():
    """Profile of the block-diagonal mechanism built directly over the full domain."""
    domain = Domain(("a", "b", "c"), (3, 2, 2))
    rng = np.random.default_rng(0)
    groups = [("a,b", {"a": prefix_queries(3), "b": np.eye(2)}, rng.uniform(1, 3, 6)), ("c", {"c": np.eye(2)}, 1.0)]
    blocks, solutions, allocation, _ = _plan(domain, groups)
    lifted = [b.basis @ _marginalise(domain, b.attributes) for b in blocks]
    whole_basis = np.vstack(lifted)
    sizes = [b.basis.shape[0] for b in blocks]
    whole_sigma = np.zeros((sum(sizes), sum(sizes)))
    offset = 0
    for size, solution, scale in zip(sizes, solutions, allocation.scales):
        whole_sigma[offset : offset + size, offset : offset + size] = solution.sigma * scale
        offset += size
    direct = distfit.privacy_profile(whole_sigma, whole_basis)
    stitched = stitched_profile(domain, [(b.attributes, s.profile / k) for b, s, k in zip(blocks, solutions, allocation.scales)])
    np.testing.assert_allclose(stitched, direct, rtol=1e-8)


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


def test_allocation_refuses_a_block_without_variance():
    with pytest.raises(ValueError, match="block 1 gives no query any variance"):
        allocate_scales([1.0, 2.0], [(np.array([0]), np.array([1.0])), (np.array([0]), np.array([0.0]))], np.ones(1))
    with pytest.raises(ValueError, match="block_alphas"):
        allocate_scales([0.0], [(np.array([0]), np.array([1.0]))], np.ones(1))


def test_connected_blocks_cut_loses_nothing():
    rng = np.random.default_rng(1)
    first = (rng.random((6, 5)) < 0.5).astype(float) + np.eye(6, 5)
    second = np.tril(np.ones((4, 4)))
    matrix = np.zeros((10, 11))
    matrix[:6, :5] = first
    matrix[6:, 6:10] = second  # cell 5 and cell 10 are untouched
    targets = rng.uniform(1, 3, 10)
    components = connected_blocks(matrix)
    assert len(components) == 2
    whole = distfit.solve(matrix, targets)
    parts = [distfit.solve(matrix[np.ix_(q, c)], targets[q]) for q, c in components]
    assert max(p.alpha for p in parts) == pytest.approx(whole.alpha, rel=1e-3)
    assert {tuple(c) for _, c in components} == {tuple(range(5)), tuple(range(6, 10))}


def test_bad_groups_are_refused():
    domain = Domain(("a", "b"), (2, 3))
    with pytest.raises(ValueError, match="unknown attribute 'z'"):
        residual_blocks(domain, [("g", {"z": np.eye(2)}, 1.0)])
    with pytest.raises(ValueError, match="targets"):
        residual_blocks(domain, [("g", {"a": np.eye(2)}, -1.0)])
    with pytest.raises(ValueError, match="columns"):
        residual_blocks(domain, [("g", {"b": np.eye(2)}, 1.0)])




def test_merged_blocks_reassemble_the_workload_and_cost_less():
    domain, groups = mixed_marginal_workload()
    workload = workload_from_groups(domain, groups)
    residual = residual_blocks(domain, groups)
    merged = merge_blocks(domain, residual, [tuple(g[1]) for g in groups], max_cells=16)
    assert sorted(b.block_id for b in merged) == ["r-age.sex", "r-sex.edu"]
    rebuilt = np.zeros_like(workload.matrix)
    for block in merged:
        np.add.at(rebuilt, block.query_index, block.recon @ block.basis @ _marginalise(domain, block.attributes))
        np.testing.assert_array_equal(block.targets, workload.targets[block.query_index])
    np.testing.assert_allclose(rebuilt, workload.matrix, atol=1e-10)

    def planned_alpha(blocks):
        solutions = [distfit.solve(b.workload, b.targets, basis=b.basis) for b in blocks]
        return allocate_scales(
            [s.alpha for s in solutions], [(b.query_index, s.variances) for b, s in zip(blocks, solutions)], workload.targets
        ).alpha_bound

    # Merging lets one block correlate the noise of its residual parts.
    assert planned_alpha(merged) < 0.9 * planned_alpha(residual)


def test_merging_without_limit_is_the_global_solve():
    domain, groups = mixed_marginal_workload()
    workload = workload_from_groups(domain, groups)
    merged = merge_blocks(domain, residual_blocks(domain, groups), [tuple(g[1]) for g in groups], max_cells=10**9)
    assert [b.block_id for b in merged] == ["r-age.sex.edu"]
    block = merged[0]
    planned = distfit.solve(block.workload, block.targets, basis=block.basis)
    whole = distfit.solve(workload.matrix, workload.targets)
    assert planned.alpha == pytest.approx(whole.alpha, rel=1e-3)


def test_no_limit_means_no_merge():
    domain, groups = mixed_marginal_workload()
    residual = residual_blocks(domain, groups)
    assert [b.block_id for b in merge_blocks(domain, residual, [tuple(g[1]) for g in groups], 0)] == [b.block_id for b in residual]


@pytest.mark.parametrize("max_cells", [0, 16, 10**9])
def test_layouts_describe_the_blocks_they_build(max_cells):
    # The layout (attribute sets and row counts, no arrays) must give exactly the blocks that
    # residual_blocks + merge_blocks build, with the sizes the planner reads from it.
    domain, groups = mixed_marginal_workload()
    workload = ResidualWorkload(domain, groups)
    cliques = [tuple(g[1]) for g in groups]
    expected = merge_blocks(domain, residual_blocks(domain, groups), cliques, max_cells)
    layouts = workload.layout(cliques, max_cells)
    assert [layout.block_id for layout in layouts] == [block.block_id for block in expected]
    for layout, block in zip(layouts, expected):
        built = workload.build(layout)
        assert built.attributes == block.attributes == layout.attributes
        assert (layout.rows, layout.cells, layout.queries) == (block.basis.shape[0], block.basis.shape[1], block.recon.shape[0])
        for name in ("basis", "recon", "query_index", "targets"):
            np.testing.assert_array_equal(getattr(built, name), getattr(block, name))
    for subset in workload.subsets:
        np.testing.assert_array_equal(workload.query_index(subset), workload.residual_block(subset).query_index)
