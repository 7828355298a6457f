"""The audit's own computations (issue 28, point 3) against references independent of it and of
each other: the planner's code (``distfit.mathematics.privacy``, ``distfit.plan.composition``,
``distfit.solver.dual``, ``distfit.plan.allocate``), Google's dp-accounting, numerical
quadrature of the Gaussian densities, dense nuclear norms and brute-force loops over cells, a
convex solver (cvxpy) for the allocation program, and real plans of the PL94 pipeline."""
from __future__ import annotations

import io
import itertools
import math

import numpy as np
import pytest
import scipy.integrate

from distfit.audit import bounds, composition, privacy
from distfit.audit.plan import audit_plan
from distfit.mathematics import privacy as planner_privacy
from distfit.mathematics.domain import Domain
from distfit.plan.allocate import allocate_scales
from distfit.plan.composition import stitched_profile
from distfit.plan.job import run_plan
from distfit.runtime.placement import Placement
from distfit.solver.dual import certified_bound
from distfit.spec.parse import load_spec, parse_spec
from distfit.stores.plan import read_plan
from tests.reference import SMALL_SPEC

plm = pytest.importorskip("dp_accounting.pld.privacy_loss_mechanism")

ALPHAS = [1e-6, 1e-3, 0.05, 0.5, 1.0, 2.0396915828449145, 7.5, 50.0, 1e3, 1e5]


@pytest.fixture(scope="module")
def pl94(tmp_path_factory):
    """The PL94 pipeline's plan (one SM-II block of 252 cells) and a small plan of two blocks
    whose bound is the joint block dual's."""
    root = tmp_path_factory.mktemp("pl94")
    run_plan(load_spec("pipelines/pl94.yaml"), str(root / "pl94.zarr"), placement=Placement(serial=True), log=io.StringIO())
    run_plan(parse_spec(SMALL_SPEC), str(root / "joint.zarr"), placement=Placement(serial=True), log=io.StringIO(),
             closed_forms=False)
    return root


# --------------------------------------------------------------------------------------------
# the account


@pytest.mark.parametrize("alpha", ALPHAS)
def test_the_account_agrees_with_the_planners(alpha):
    mine = privacy.account(alpha)
    theirs = planner_privacy.privacy_account(alpha)
    assert mine.rho == theirs.rho == alpha / 2
    assert [d for d, _ in mine.epsilon_delta] == [d for d, _ in theirs.epsilon_delta] == list(privacy.DELTAS)
    np.testing.assert_allclose([e for _, e in mine.epsilon_delta], [e for _, e in theirs.epsilon_delta], rtol=1e-10)
    assert mine.rdp == theirs.rdp


def _dp_accounting_delta(alpha: float, epsilon: float) -> float:
    """dp-accounting's hockey-stick divergence of the Gaussian mechanism: sensitivity 1, std 1/sqrt(alpha)."""
    mechanism = plm.GaussianPrivacyLoss(standard_deviation=1.0 / math.sqrt(alpha), sensitivity=1.0)
    return float(mechanism.get_delta_for_epsilon(epsilon))


@pytest.mark.parametrize("alpha", [1e-3, 0.5, 2.0396915828449145, 50.0, 1e3])
def test_the_accounts_epsilons_meet_their_deltas_in_dp_accounting(alpha):
    """At the audit's epsilon dp-accounting's delta is the table's delta; a hair below that
    epsilon it is above it (the smallest epsilon)."""
    for delta, epsilon in privacy.account(alpha).epsilon_delta:
        assert epsilon > 0
        assert _dp_accounting_delta(alpha, epsilon) == pytest.approx(delta, rel=1e-6)
        assert _dp_accounting_delta(alpha, epsilon * (1 - 1e-6)) > delta


def _quadrature_delta(alpha: float, epsilon: float) -> float:
    """``delta(eps) = int max(0, phi(x) - e^eps phi(x - mu)) dx`` (the hockey-stick divergence of
    N(0, 1) and N(mu, 1)), integrated numerically: the integrand is positive left of
    ``x* = mu / 2 - eps / mu``. No normal CDF is used."""
    mu = math.sqrt(alpha)
    split = mu / 2 - epsilon / mu

    def integrand(x: float) -> float:
        # phi(x) - e^eps phi(x - mu) = phi(x) (1 - exp(eps + mu x - mu^2 / 2))
        return math.exp(-x * x / 2) / math.sqrt(2 * math.pi) * -math.expm1(min(epsilon + mu * x - mu * mu / 2, 0.0))

    # the integrand decays like a Gaussian left of the split: nothing is left 40 units further
    value, error = scipy.integrate.quad(integrand, split - 40.0, split, epsabs=0.0, epsrel=1e-12, limit=500,
                                        points=[split - 1.0, split - 0.1])
    assert error <= 1e-9 * value
    return value


@pytest.mark.parametrize("alpha, epsilon", [(0.05, 0.3), (1.0, 1.0), (2.0396915828449145, 6.650304392601562),
                                            (7.5, 3.0), (50.0, 20.0), (1.0, 9.0)])
def test_delta_agrees_with_quadrature_of_the_densities(alpha, epsilon):
    assert math.exp(float(privacy.log_delta(alpha, epsilon))) == pytest.approx(_quadrature_delta(alpha, epsilon), rel=1e-8)


@pytest.mark.parametrize("epsilon, delta", [(0.1, 1e-10), (1.0, 1e-6), (5.0, 1e-5), (20.0, 1e-9)])
def test_the_budget_alpha_agrees_with_the_planners_and_dp_accounting(epsilon, delta):
    alpha = privacy.budget_alpha(epsilon, delta)
    assert alpha == pytest.approx(planner_privacy.alpha_for_budget(epsilon, delta), rel=1e-10)
    assert _dp_accounting_delta(alpha, epsilon) == pytest.approx(delta, rel=1e-6)
    assert _dp_accounting_delta(alpha * (1 + 1e-5), epsilon) > delta  # the largest such alpha


# --------------------------------------------------------------------------------------------
# sequential composition


def _brute_force_maximum(sizes, blocks) -> float:
    """``max_x sum_S p_S(x_S)`` by a Python loop over every full-domain cell."""
    best = -np.inf
    for cell in itertools.product(*(range(n) for n in sizes)):
        total = 0.0
        for positions, profile in blocks:
            index = 0
            for p in positions:  # row-major over the block's attributes in schema order
                index = index * sizes[p] + cell[p]
            total += profile[index]
        best = max(best, total)
    return best


def test_the_stitched_maximum_agrees_with_a_loop_over_cells_and_the_planners_profile(monkeypatch):
    rng = np.random.default_rng(7)
    sizes = (3, 2, 4, 5)
    names = tuple(f"a{i}" for i in range(len(sizes)))
    blocks = []
    for positions in [(), (0,), (1, 3), (0, 2, 3), (1, 3), (2,)]:  # (1, 3) twice: summed first
        blocks.append((positions, rng.uniform(0.1, 2.0, int(np.prod([sizes[p] for p in positions])))))
    monkeypatch.setattr(composition, "SLAB_CELLS", 7)  # several slabs, the last one short
    mine = composition.stitched_maximum(sizes, blocks)
    assert mine == pytest.approx(_brute_force_maximum(sizes, blocks), rel=1e-14)
    domain = Domain(names, sizes)
    theirs = stitched_profile(domain, [(tuple(names[p] for p in positions), profile) for positions, profile in blocks])
    assert mine == pytest.approx(float(theirs.max()), rel=1e-14)


# --------------------------------------------------------------------------------------------
# certified bounds


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
    assert report.alpha == pytest.approx(plan.attrs["alpha"], rel=1e-12)
    (block,) = plan.iter_blocks()
    dense = (block.basis * np.linalg.solve(block.sigma, block.basis)).sum(axis=0)  # b_i^T Sigma^-1 b_i by a solve
    assert report.alpha == pytest.approx(float(dense.max()), rel=1e-10)


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
