"""Residual blocks, merging under max_cells and exact cuts (docs/design.md section 2)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import distfit
from distfit.mathematics.domain import Domain
from distfit.plan.allocate import allocate_scales
from distfit.plan.residual import (
    ResidualWorkload,
    connected_blocks,
    difference_matrix,
    merge_blocks,
    LOW_ORDER_SHARED,
    merge_layout,
    residual_blocks,
)
from distfit.mathematics.workload import prefix_queries, workload_from_groups
from tests.plan.blocks import marginaliser, two_way
from tests.reference import mixed_marginal_workload


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
        full_rows = block.recon @ block.basis @ marginaliser(domain, block.attributes)
        np.add.at(rebuilt, block.query_index, full_rows)
        np.testing.assert_array_equal(block.targets, workload.targets[block.query_index])
    np.testing.assert_allclose(rebuilt, workload.matrix, atol=1e-10)


def test_residual_bases_are_orthogonal_across_blocks():
    domain, groups = two_way((3, 2, 4))
    blocks = residual_blocks(domain, groups)
    lifted = [b.basis @ marginaliser(domain, b.attributes) for b in blocks]
    for first, second in itertools.combinations(lifted, 2):
        np.testing.assert_allclose(first @ second.T, 0.0, atol=1e-10)


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
        np.add.at(rebuilt, block.query_index, block.recon @ block.basis @ marginaliser(domain, block.attributes))
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


def test_a_total_many_cliques_share_joins_the_smallest_clique_not_the_largest():
    """The total's block has a row for every query: shared by more than LOW_ORDER_SHARED
    cliques, it joins the smallest clique that holds it, so the largest clique's block holds its
    own residual block only; with few cliques it joins the largest, as every other block does."""
    names = tuple("abcdefg")
    domain = Domain(names, (10, 10, 2, 3, 2, 3, 2))
    cliques = list(itertools.combinations(names, 2))  # 21 > LOW_ORDER_SHARED cliques hold the total
    assert len(cliques) > LOW_ORDER_SHARED
    blocks = [()] + [(a,) for a in names] + cliques

    def holding(layout, member):
        return next(attributes for attributes, members in layout if member in members)

    many = merge_layout(domain, blocks, cliques, max_cells=100)
    assert dict(many)[("a", "b")] == (("a",), ("b",), ("a", "b"))  # 6 cliques hold "a": the largest
    assert "a" not in holding(many, ()) and "b" not in holding(many, ())
    assert sorted(m for _, members in many for m in members) == sorted(blocks)  # each block once
    few = merge_layout(domain, blocks[:3] + [("a", "b"), ("a", "c")], [("a", "b"), ("a", "c")], max_cells=100)
    assert holding(few, ()) == ("a", "b")


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


def test_subsets_of_identity_groups_enumerated_in_bulk_match_the_row_test():
    """``ResidualWorkload`` enumerates the subsets of identity-marginal groups with one target
    by numpy, the others by the per-row test: both give what the per-row test gives everywhere
    (subsets in (size, positions) order, each subset's groups in order, their query rows), with
    a size-1 attribute, a clique written out of schema order, a prefix and per-query targets."""
    domain = Domain(("a", "b", "one", "c"), (3, 4, 1, 2))
    groups = [
        ("ab", {"b": np.eye(4), "a": np.eye(3)}, 1.0),  # out of schema order
        ("a-one-c", {"a": np.eye(3), "one": np.eye(1), "c": np.eye(2)}, 2.0),
        ("b-prefix", {"b": prefix_queries(4)}, 1.0),
        ("bc", {"b": np.eye(4), "c": np.eye(2)}, np.arange(1.0, 9.0)),  # per-query targets
        ("total", {}, 3.0),
    ]
    workload = ResidualWorkload(domain, groups)
    blocks = residual_blocks(domain, groups)
    assert list(workload.subsets) == [block.attributes for block in blocks]
    sizes = dict(zip(domain.names, domain.sizes))
    expected = sorted({s for _, per, _ in groups for r in range(len(per) + 1)
                       for s in itertools.combinations([a for a in domain.names if a in per and sizes[a] > 1], r)},
                      key=lambda s: (len(s), [domain.index(a) for a in s]))
    assert list(workload.subsets) == expected
    for subset, block in zip(workload.subsets, blocks):
        np.testing.assert_array_equal(workload.query_index(subset), block.query_index)
        members = [g for g, (_, per, _) in enumerate(groups) if set(subset) <= set(per)]
        assert workload.groups_of(subset) == members
        assert workload.closed_form(subset) == all(g in (0, 1, 4) for g in members)
    np.testing.assert_array_equal(workload.closed_form_mask(), [workload.closed_form(s) for s in workload.subsets])


def test_workload_targets_are_the_groups_targets_in_order():
    domain = Domain(("a", "b"), (3, 2))
    groups = [("a", {"a": np.eye(3)}, 2.0), ("ab", {"a": prefix_queries(3), "b": np.eye(2)}, np.arange(1.0, 7.0)),
              ("b", {"b": np.eye(2)}, np.array([1.5, 1.5])), ("total", {}, 4.0)]
    np.testing.assert_array_equal(ResidualWorkload(domain, groups).targets(),
                                  np.concatenate([[2.0] * 3, np.arange(1.0, 7.0), [1.5, 1.5], [4.0]]))
