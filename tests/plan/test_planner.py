"""The planner: decompose, solve, allocate, stitch (docs/design.md section 2)."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import distfit
from tests.reference import SYMMETRIC_REFERENCE_REL, cvx_two_way_marginal_alpha, mixed_marginal_workload
from distfit.plan.planner import JOINT_DUAL_MIN_EVALUATIONS, joint_dual_evaluations, plan_groups
from distfit.plan.residual import group_targets, residual_blocks
from distfit.solver.basis import represent
from distfit.solver.dual import maximize_block_dual
from distfit.mathematics.domain import Domain
from distfit.mathematics.workload import prefix_queries, workload_from_groups




def test_two_way_marginals_plan_reaches_the_convex_optimum():
    """docs/design.md section 2: five 3-valued attributes, all 2-way marginals, unit targets: the
    plan's alpha is the optimum of an independent convex program on the same workload
    (``cvx_two_way_marginal_alpha``), to within its accuracy (1e-7) below and the block solves'
    gap tolerance (1e-4) above."""
    domain = Domain(tuple(f"a{i}" for i in range(5)), (3,) * 5)
    groups = [(f"{a},{b}", {a: np.eye(3), b: np.eye(3)}, 1.0) for a, b in itertools.combinations(domain.names, 2)]
    plan = plan_groups(domain, groups, max_cells=0, refine_rounds=0)
    assert plan.num_blocks == 16 and len(plan.closed) == 16  # every block closed-form
    optimum = cvx_two_way_marginal_alpha((3,) * 5)
    assert optimum * (1 - SYMMETRIC_REFERENCE_REL) <= plan.alpha <= optimum * (1 + 1e-4)
    assert plan.alpha_exact
    assert np.all(plan.variances <= plan.targets * (1 + 1e-9))


@pytest.mark.parametrize("max_cells", [0, 16])
def test_plan_meets_targets_and_refinement_never_hurts(max_cells):
    domain, groups = mixed_marginal_workload()
    single = plan_groups(domain, groups, max_cells=max_cells, refine_rounds=0)
    refined = plan_groups(domain, groups, max_cells=max_cells, refine_rounds=2)
    for plan in (single, refined):
        assert np.all(plan.variances <= plan.targets * (1 + 1e-9))
        assert plan.alpha <= plan.alpha_sum_bound * (1 + 1e-9)
        # the stitched profile's max can never beat the sum bound's dual certificate
        assert plan.allocation_lower_bound <= plan.alpha_sum_bound * (1 + 1e-9)
    assert refined.alpha_sum_bound <= single.alpha_sum_bound * (1 + 1e-6)


def test_no_merge_limit_gives_the_global_solve():
    domain, groups = mixed_marginal_workload()
    workload = workload_from_groups(domain, groups)
    whole = distfit.solve(workload.matrix, workload.targets)
    plan = plan_groups(domain, groups, max_cells=10**9, refine_rounds=0)
    assert len(plan.blocks) == 1
    assert plan.alpha == pytest.approx(whole.alpha, rel=1e-3)
    # query variances of the plan agree with the stitched block rows
    np.testing.assert_allclose(plan.variances, plan.blocks[0].variances, rtol=1e-12)


def _block_diagonal_sdp(bases, recons, query_indices, targets):
    """min sum_S max_i b_i^T X_S b_i  s.t.  sum_S l^T X_S^-1 l <= c_j  (X_S = Sigma_S^-1), by cvxpy."""
    import cvxpy as cp

    constraints, objective_terms, shares = [], [], {}
    for s, (basis, recon, index) in enumerate(zip(bases, recons, query_indices)):
        k = basis.shape[0]
        inverse = cp.Variable((k, k), PSD=True)
        level = cp.Variable()
        objective_terms.append(level)
        constraints += [cp.quad_form(basis[:, i], inverse) <= level for i in range(basis.shape[1])]
        for row, query in enumerate(index):
            share = cp.Variable()
            column = recon[row][:, None]
            constraints.append(cp.bmat([[cp.reshape(share, (1, 1), order="C"), column.T], [column, inverse]]) >> 0)
            shares.setdefault(int(query), []).append(share)
    constraints += [cp.sum(cp.hstack(v)) <= targets[q] for q, v in shares.items()]
    problem = cp.Problem(cp.Minimize(cp.sum(cp.hstack(objective_terms))), constraints)
    problem.solve(solver=cp.CLARABEL)
    return problem.value


def _joint_dual_problem():
    """The joint block dual's input for two groups on a 3 x 3 domain (a by prefix; a by
    identity x b by prefix; random targets in [1, 3)): ``(targets, blocks, representations,
    bases, recons scaled by the targets, query indices)`` of its residual blocks."""
    domain = Domain(("a", "b"), (3, 3))
    rng = np.random.default_rng(2)
    groups = [
        ("a", {"a": prefix_queries(3)}, rng.uniform(1, 3, 3)),
        ("ab", {"a": np.eye(3), "b": prefix_queries(3)}, rng.uniform(1, 3, 9)),
    ]
    targets = group_targets(domain, groups)
    blocks = residual_blocks(domain, groups)
    reps = [represent(b.workload, b.basis) for b in blocks]
    recons = [r.recon / np.sqrt(targets[b.query_index])[:, None] for r, b in zip(reps, blocks)]
    return targets, blocks, reps, [r.basis for r in reps], recons, [b.query_index for b in blocks]


def test_joint_block_dual_matches_a_convex_solver():
    targets, blocks, reps, bases, recons, indices = _joint_dual_problem()
    joint = maximize_block_dual(bases, recons, indices, targets.size, target_gap=1e-6)
    reference = _block_diagonal_sdp(bases, [r.recon for r in reps], indices, targets)
    assert joint.lower_bound <= reference * (1 + 1e-5)
    assert joint.alpha_sum_bound == pytest.approx(reference, rel=1e-3)
    # the plan it returns meets every target
    variances = np.zeros(targets.size)
    for rep, block, sigma in zip(reps, blocks, joint.sigmas):
        np.add.at(variances, block.query_index, np.einsum("ij,jk,ik->i", rep.recon, sigma, rep.recon))
    assert np.all(variances <= targets * (1 + 1e-9))


def test_joint_block_dual_stops_at_its_evaluation_budget():
    targets, _, _, bases, recons, indices = _joint_dual_problem()
    capped = maximize_block_dual(bases, recons, indices, targets.size, target_gap=1e-9, max_evaluations=3)
    assert capped.evaluations == 3
    assert capped.sigmas is not None and capped.lower_bound <= capped.alpha_sum_bound
    # small plans keep the whole iteration budget; big ones get budget / work evaluations
    assert joint_dual_evaluations(1e7) > 500
    assert joint_dual_evaluations(1.1e9) == 27
    assert joint_dual_evaluations(1e12) == JOINT_DUAL_MIN_EVALUATIONS


def test_symmetric_blocks_take_the_closed_form():
    """A block fed by one identity marginal with one target is symmetric: the uniform dual
    weights are optimal, so its first dual evaluation certifies it and Sigma_S is proportional to
    B_S B_S^T (the closed form of docs/design.md section 2). Lower-order blocks collect rows from
    marginals of different sizes (different kappa) and are not symmetric."""
    from distfit.plan.planner import BlockTask, solve_block

    domain = Domain(tuple(f"a{i}" for i in range(4)), (3, 4, 2, 3))
    groups = [(f"{a},{b}", {a: np.eye(domain.size_of(a)), b: np.eye(domain.size_of(b))}, 1.0)
              for a, b in itertools.combinations(domain.names, 2)]
    symmetric = [block for block in residual_blocks(domain, groups) if len(block.attributes) == 2]
    assert len(symmetric) == 6
    for block in symmetric:
        solution = solve_block(BlockTask(0, block, block.targets))
        assert solution.stats.dual_evaluations == 1
        assert solution.gap <= 1e-9
        reference = solution.basis @ solution.basis.T
        scale = np.trace(solution.sigma) / np.trace(reference)
        np.testing.assert_allclose(solution.sigma, scale * reference, rtol=1e-6, atol=1e-9 * scale)


def test_blocks_are_solved_largest_first():
    """Longest-processing-time order: the executor gets the most work first; results are still
    assigned by index, so the plan is the one a block-order loop gives."""
    from distfit.plan.planner import block_work, plan_blocks, serial_executor, solve_order
    from tests.reference import mixed_marginal_workload

    domain, groups = mixed_marginal_workload()
    blocks = residual_blocks(domain, groups)
    order = solve_order(blocks)
    work = [block_work([blocks[i]]) for i in order]
    assert sorted(order) == list(range(len(blocks))) and work == sorted(work, reverse=True)
    assert order != list(range(len(blocks)))  # the residual order is smallest first
    seen = []

    def recording(tasks):
        for task in tasks:
            seen.append(task.index)
            yield task.index, serial_executor([task]).__next__()[1]

    targets = group_targets(domain, groups)
    planned = plan_blocks(domain, blocks, targets, recording, refine_rounds=0)
    in_order = plan_blocks(domain, blocks, targets, serial_executor, refine_rounds=0)
    assert seen == order
    assert planned.alpha == in_order.alpha
    np.testing.assert_array_equal(planned.variances, in_order.variances)
