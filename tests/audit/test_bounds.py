"""The audit's own certified bounds (``distfit.audit.bounds``) against the planner's
``distfit.solver.dual.certified_bound`` and ``distfit.plan.allocate``, dense nuclear norms and a
convex solver (cvxpy) for the allocation program, on the PL94 pipeline's plan and a small plan
whose bound is the joint block dual's."""
from __future__ import annotations

import io

import numpy as np
import pytest

from distfit.audit import bounds
from distfit.audit.plan import audit_plan
from distfit.plan.allocate import allocate_scales
from distfit.plan.job import run_plan
from distfit.runtime.placement import Placement
from distfit.mathematics.bounds import certified_bound
from distfit.spec.parse import load_spec, parse_spec
from distfit.stores.plan import read_plan
from tests.reference import SMALL_SPEC


@pytest.fixture(scope="module")
def pl94(tmp_path_factory):
    """The PL94 pipeline's plan (one SM-II block of 252 cells) and a small plan of two blocks
    whose bound is the joint block dual's."""
    root = tmp_path_factory.mktemp("pl94")
    run_plan(load_spec("pipelines/pl94.yaml"), str(root / "pl94.zarr"), placement=Placement(serial=True), log=io.StringIO())
    run_plan(parse_spec(SMALL_SPEC), str(root / "joint.zarr"), placement=Placement(serial=True), log=io.StringIO(),
             closed_forms=False)
    return root



def test_block_bounds_agree_with_the_planners_and_a_dense_nuclear_norm(pl94):
    plan = read_plan(pl94 / "pl94.zarr")
    (block,) = plan.iter_blocks()
    assert block.basis.shape[1] == 252
    t = bounds.bound_targets(block.variances, block.targets)
    mine = bounds.block_bound(block.basis, block.recon, block.variances, block.targets, block.cell_weights,
                              block.query_weights)
    dense = np.linalg.norm(np.sqrt(block.query_weights / t)[:, None] * (block.recon @ block.basis)
                           * np.sqrt(block.cell_weights), "nuc") ** 2
    planner = certified_bound(block.basis, block.recon / np.sqrt(t)[:, None], block.cell_weights, block.query_weights)
    assert dense * (1 - 3e-9) <= mine <= dense  # less its rounding margin (1.4e-9 of it here): still a proof
    assert mine == pytest.approx(planner, rel=1e-12)
    assert mine == pytest.approx(block.lower_bound, rel=1e-9) and mine <= plan.attrs["alpha"]


def test_the_pl94_plan_passes_with_the_planners_alpha(pl94):
    plan = read_plan(pl94 / "pl94.zarr")
    report = audit_plan(str(pl94 / "pl94.zarr"))
    assert report.ok, report.failures
    assert report.value == pytest.approx(plan.attrs["alpha"], rel=1e-12)
    (block,) = plan.iter_blocks()
    dense = (block.basis * np.linalg.solve(block.sigma, block.basis)).sum(axis=0)  # b_i^T Sigma^-1 b_i by a solve
    assert report.value == pytest.approx(float(dense.max()), rel=1e-10)


def test_the_joint_block_duals_certificate_proves_its_bound(pl94):
    """The joint bound at the stored point, by the audit and by a dense nuclear norm per block;
    it is a lower bound on the plan's own sum bound."""
    plan = read_plan(pl94 / "joint.zarr")
    planner = plan.attrs["planner"]
    chosen = planner["chosen_blocks_lower_bound"]
    assert chosen["method"] == "joint block dual" and len(plan.block_ids) == 2
    certificate = chosen["certificate"]
    weights = np.zeros(plan.target_runs.size)
    weights[certificate["queries"]] = certificate["weights"]
    targets = plan.queries_targets * planner["variance_scale"]
    mine, dense = [], 0.0
    for block in plan.iter_blocks():
        u, v = np.asarray(certificate["cell_weights"][block.block_id]), weights[block.query_index]
        scaled = block.recon / np.sqrt(targets[block.query_index])[:, None]
        mine.append((block.basis, scaled, u, v))
        dense += np.linalg.norm(np.sqrt(v)[:, None] * (scaled @ block.basis) * np.sqrt(u), "nuc")
    assert bounds.joint_bound(mine) == pytest.approx(chosen["value"], rel=1e-9)
    assert dense**2 * (1 - 3e-9) <= bounds.joint_bound(mine) <= dense**2
    assert chosen["value"] <= planner["alpha_sum_bound"]


def test_the_allocation_dual_at_the_planners_certificate_is_its_bound_and_below_the_optimum():
    """A random allocation program: the audit's dual objective at the planner's stored point is
    the planner's lower bound, and at most the optimum cvxpy finds (a bound); any other point of
    the simplex proves less."""
    cp = pytest.importorskip("cvxpy")
    rng = np.random.default_rng(3)
    blocks, queries = 5, 12
    alphas = rng.uniform(0.5, 3.0, blocks)
    reach = [np.sort(rng.choice(queries, size=rng.integers(3, 8), replace=False)) for _ in range(blocks)]
    shapes = [(q, rng.uniform(0.2, 2.0, q.size)) for q in reach]
    targets = rng.uniform(1.0, 4.0, queries)
    allocation = allocate_scales(alphas, shapes, targets, tolerance=1e-9)

    def evaluate(cert_queries, cert_weights):
        sums = [bounds.range_sums(cert_queries, cert_weights / targets[cert_queries], q, np.ones(q.size, np.int64)) @ v
                for q, v in shapes]
        return bounds.allocation_bound(alphas, np.asarray(sums))

    proved = evaluate(allocation.certificate_queries, allocation.certificate_weights)
    assert proved == pytest.approx(allocation.lower_bound, rel=1e-12)
    matrix = np.zeros((queries, blocks))
    for b, (q, v) in enumerate(shapes):
        matrix[q, b] = v / targets[q]
    s = cp.Variable(blocks, pos=True)
    problem = cp.Problem(cp.Minimize(cp.sum(cp.multiply(alphas, cp.inv_pos(s)))), [matrix @ s <= 1])
    problem.solve(solver=cp.CLARABEL)
    assert proved <= problem.value * (1 + 1e-7) and proved == pytest.approx(problem.value, rel=1e-6)
    uniform = np.full(allocation.certificate_queries.size, 1.0 / allocation.certificate_queries.size)
    assert evaluate(allocation.certificate_queries, uniform) < proved
