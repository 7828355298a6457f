"""``distfit audit`` (issue 12): every claim a plan states is recomputed, so editing one - and
re-sealing the checksum with the store's own rule, so that only the recomputation can catch it -
fails the audit naming the claim; editing one without re-sealing fails the checksum.

The plans: the issue's merged plan (sizes 2 x 3 x 4, all 2-way marginals, targets 1: one block),
the same spec under a zCDP budget, ``SMALL_SPEC`` (two blocks, the joint block dual), the same
streamed (no joint dual: refined target shares and the scale allocation), that under a budget,
and ``SMALL_SPEC`` unmerged (six blocks, all re-optimised by the joint block dual).
"""
from __future__ import annotations

import copy
import io
import shutil
import zipfile
from pathlib import Path

import re

import numpy as np
import pytest
import yaml
import zarr

import distfit.audit.labels
import distfit.audit.plan
import distfit.stores.plan
from distfit.audit.bounds import bound_targets
from distfit.audit.plan import audit_plan
from distfit.cli.main import main
from distfit.plan.job import run_plan
from distfit.mathematics.bounds import GLOBAL_BOUNDS, JOINT_BLOCK_DUAL, SCALE_ALLOCATION
from distfit.mathematics.bounds import certified_bound
from distfit.spec.parse import parse_spec
from distfit.stores.checksum import compute_checksum
from distfit.stores.plan import StoreError, checksum_covers_attrs, plan_claims, read_plan
from distfit.runtime.placement import Placement
from tests.packed_plans import marginals_spec, write_packed_plan
from tests.reference import SMALL_SPEC, orthonormal_row_basis

#: The issue's plan: all 2-way marginals of a 2 x 3 x 4 domain, targets 1; merged into one block.
MERGED_SPEC = {
    "name": "merged-234",
    "attributes": [{"name": "a", "size": 2}, {"name": "b", "size": 3}, {"name": "c", "size": 4}],
    "queries": [
        {"name": "ab", "attributes": {"a": "identity", "b": "identity"}, "target": 1},
        {"name": "ac", "attributes": {"a": "identity", "c": "identity"}, "target": 1},
        {"name": "bc", "attributes": {"b": "identity", "c": "identity"}, "target": 1},
    ],
}
BLOCK = "blocks/r-a.b.c"
# SMALL_SPEC with sex_edu's target 0.5: its refined shares are the ones kept (with target 2 the
# refinement round gains under 0.01% and the round-0 shares, the targets themselves, are kept)
REFINED_SPEC = dict(SMALL_SPEC, queries=[*SMALL_SPEC["queries"][:2], dict(SMALL_SPEC["queries"][2], target=0.5)])


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Plans written once; each test edits its own copy (``copy_of``)."""
    root = tmp_path_factory.mktemp("plans")
    specs = {
        "merged": (MERGED_SPEC, {}),
        "budget": (dict(MERGED_SPEC, name="merged-budget", privacy={"rho": 0.5}), {}),
        "joint": (SMALL_SPEC, {}),
        "refined": (dict(REFINED_SPEC, name="small-refined"), {"stream": True}),
        "refined-budget": (dict(REFINED_SPEC, name="small-refined-budget", privacy={"rho": 0.5}), {"stream": True}),
        "replaced": (dict(SMALL_SPEC, name="small-unmerged", blocks={"merge": False}), {}),
    }
    for name, (content, options) in specs.items():
        # closed_forms=False: these plans exercise solved (SM-II, merged, joint-dual) blocks; the
        # planner would otherwise pack their identity-marginal blocks in closed form (issue 10)
        run_plan(parse_spec(content), str(root / f"{name}.zarr"), placement=Placement(serial=True), log=io.StringIO(),
                 closed_forms=False, **options)
    return root


CERTIFIED = ("merged", "budget", "joint", "refined", "refined-budget")  # plans whose blocks have certificates
REPLAN = "re-plan with this version of distfit (distfit plan)"


@pytest.fixture
def copy_of(plans, tmp_path):
    def make(name: str):
        path = tmp_path / f"{name}.zarr"
        shutil.copytree(plans / f"{name}.zarr", path)
        return path
    return make


def edit(path, node: str = "", **changes) -> None:
    """Set attrs of ``node`` (``""``: the root); a dotted key edits inside a dict attr."""
    group = zarr.open_group(str(path), mode="r+")
    target = group if not node else group[node]
    attrs = dict(target.attrs)
    for key, value in changes.items():
        head, *rest = key.split("__")
        if rest:
            inner = copy.deepcopy(attrs[head])
            where = inner
            for part in rest[:-1]:
                where = where[part]
            where[rest[-1]] = value(where[rest[-1]]) if callable(value) else value
            attrs[head] = inner
        else:
            attrs[head] = value(attrs[head]) if callable(value) else value
    target.attrs.update(attrs)


def edit_array(path, name: str, change) -> None:
    arr = zarr.open_array(str(path / name), mode="r+")
    arr[...] = change(arr[...])


def reseal(path) -> str:
    """Recompute the checksum with the store's own rule and store it: the edit is then invisible
    to the checksum, and only the audit's recomputation can catch it."""
    group = zarr.open_group(str(path), mode="r+")
    attrs = dict(group.attrs)
    checksum = compute_checksum(group, attrs=plan_claims(attrs, group) if checksum_covers_attrs(attrs) else None)
    group.attrs["checksum"] = checksum
    return checksum


def assert_fails(path, *claims: str):
    report = audit_plan(str(path))
    text = "\n".join(report.failures)
    assert not report.ok, "the audit passed an edited plan"
    assert not any(f.startswith("checksum") for f in report.failures), text  # re-sealed: the checksum holds
    for claim in claims:
        assert claim in text, f"{claim!r} not named in:\n{text}"
    return report


def test_written_plans_pass(plans):
    """Every plan the planner writes passes: every bound evaluated at its stored certificate
    (the joint block dual's and the scale allocation's included), every label as derived."""
    methods = set()
    for name in CERTIFIED + ("replaced",):
        report = audit_plan(str(plans / f"{name}.zarr"))
        assert report.ok, report.failures
        plan = read_plan(plans / f"{name}.zarr")
        assert report.checksum == plan.checksum
        methods.add(plan.attrs["planner"]["chosen_blocks_lower_bound"]["method"])
    assert methods == {JOINT_BLOCK_DUAL, SCALE_ALLOCATION}


def test_the_test_plans_are_the_cases_the_audit_must_get_right(plans):
    """The block bounds of the refined plans speak about split target shares at allocation
    scales (and a budget's factor): the audit's ``t`` must follow all of them."""
    for name in ("refined", "refined-budget"):
        plan = read_plan(plans / f"{name}.zarr")
        planner = plan.attrs["planner"]
        assert planner["rounds"] >= 2 and planner["chosen_blocks_lower_bound"]["method"] == SCALE_ALLOCATION
        blocks = list(plan.iter_blocks())
        assert len(blocks) == 2
        for block in blocks:
            assert block.lower_bound > 0 and np.isfinite(block.cell_weights).all()
            assert np.any(block.targets < 0.9 * plan.queries_targets[block.query_index])  # shares, not targets
    assert read_plan(plans / "refined-budget.zarr").attrs["planner"]["variance_scale"] > 1.5
    replaced = read_plan(plans / "replaced.zarr")
    assert len(replaced.block_ids) == 6
    for block in replaced.iter_blocks():  # the joint block dual's covariances: no certificate of their own
        assert block.solver["stage"] == "block-dual" and block.lower_bound == 0.0
        assert np.isnan(block.cell_weights).all() and np.isnan(block.query_weights).all()


@pytest.mark.parametrize("name", CERTIFIED)
def test_every_block_bound_is_its_certificates_value(plans, name):
    """An independent evaluation: the nuclear norm of the m_b x d_b matrix
    ``diag(sqrt(v / t)) L B diag(sqrt(u))`` by a full SVD, squared, is each block's stored bound."""
    for block in read_plan(plans / f"{name}.zarr").iter_blocks():
        u, v = block.cell_weights, block.query_weights
        assert u.sum() == pytest.approx(1, abs=1e-12) and v.sum() == pytest.approx(1, abs=1e-12)
        assert u.min() >= 0 and v.min() >= 0
        t = bound_targets(block.variances, block.targets)
        matrix = np.sqrt(v / t)[:, None] * (block.recon @ block.basis) * np.sqrt(u)
        assert np.linalg.norm(matrix, "nuc") ** 2 == pytest.approx(block.lower_bound, rel=1e-8)
        assert certified_bound(block.basis, block.recon / np.sqrt(t)[:, None], u, v) == pytest.approx(
            block.lower_bound, rel=1e-11)


def test_a_budget_scales_the_bound_and_keeps_the_certificate(plans):
    merged, budget = (read_plan(plans / f"{name}.zarr").block("r-a.b.c") for name in ("merged", "budget"))
    k = read_plan(plans / "budget.zarr").attrs["planner"]["variance_scale"]
    assert budget.lower_bound == pytest.approx(merged.lower_bound / k, rel=1e-14)
    np.testing.assert_array_equal(budget.cell_weights, merged.cell_weights)
    np.testing.assert_array_equal(budget.query_weights, merged.query_weights)


# ---------------------------------------------------------------------------- one test per claim

def _scaled_rows(factor):
    return lambda rows: [dict(r, epsilon=r["epsilon"] * factor) for r in rows]


ROOT_EDITS = {
    # the edit: every epsilon of the account divided by 10
    "account epsilons / 10": (dict(account__epsilon_delta=_scaled_rows(0.1)), "account.epsilon_delta"),
    "account RDP curve x 10": (dict(account__rdp=_scaled_rows(10.0)), "account.rdp"),
    "account alpha": (dict(account__alpha=lambda a: a * 1.5), "account.alpha"),
    "account rho": (dict(account__rho=lambda r: r / 2), "account.rho"),
    "alpha": (dict(alpha=lambda a: a * 0.9), "alpha: stored"),
    "rho": (dict(rho=lambda r: r * 0.9), "rho: stored"),
    "alpha_exact": (dict(alpha_exact=False), "alpha_exact: stored False"),
    "variance scale x 10": (dict(planner__variance_scale=10.0), "planner.variance_scale"),
    "alpha sum bound": (dict(planner__alpha_sum_bound=lambda a: a * 2), "planner.alpha_sum_bound"),
    "spec hash": (dict(planner__spec_hash="0" * 64), "planner.spec_hash"),
    "schema": (dict(schema={"attributes": ["a", "b", "c"], "sizes": [2, 3, 5]}), "schema: stored"),
    "spec": (dict(spec__queries=lambda q: q + [{"name": "x", "attributes": {"zz": "identity"}, "target": 1}]),
             "spec: the stored spec is not a valid spec"),
    # a bound on plans with the chosen blocks, raised past what the allocation certifies
    "chosen-blocks bound": (dict(planner__chosen_blocks_lower_bound__value=lambda v: v * 1.0001),
                            "planner.chosen_blocks_lower_bound"),
    "chosen-blocks bound method": (dict(planner__chosen_blocks_lower_bound__method="guesswork"),
                                   "planner.chosen_blocks_lower_bound: unknown method"),
    # the figure stated as a global bound: above the optimum 2.0395807, not certifiable
    "global bound": (dict(planner__global_lower_bound__value=2.0396907021850232), "planner.global_lower_bound"),
}


@pytest.mark.parametrize("case", sorted(ROOT_EDITS))
def test_an_edited_root_claim_fails_the_audit_naming_it(copy_of, case):
    changes, claim = ROOT_EDITS[case]
    path = copy_of("merged")
    edit(path, **changes)
    reseal(path)
    assert_fails(path, claim)


BLOCK_EDITS = {
    "alpha": (dict(alpha=lambda a: a * 0.9), f"{BLOCK}: alpha"),
    "lower bound above alpha": (dict(lower_bound=lambda b: b * 1.01), f"{BLOCK}/lower_bound"),
    "attributes": (dict(attributes=["c", "b", "a"]), f"{BLOCK}: attributes"),
}


@pytest.mark.parametrize("case", sorted(BLOCK_EDITS))
def test_an_edited_block_claim_fails_the_audit_naming_it(copy_of, case):
    changes, claim = BLOCK_EDITS[case]
    path = copy_of("merged")
    edit(path, BLOCK, **changes)
    reseal(path)
    assert_fails(path, claim)


def test_a_block_bound_between_the_optimum_and_alpha_is_not_certified(copy_of):
    """Below the block's alpha, so only the certificate can tell that it is not proven: the
    optimum is about 2.03958, alpha 2.03969."""
    path = copy_of("merged")
    block = read_plan(path).block("r-a.b.c")
    claimed = (block.lower_bound + block.alpha) / 2
    edit(path, BLOCK, lower_bound=claimed)
    reseal(path)
    report = assert_fails(path, f"{BLOCK}/lower_bound: stored {claimed!r}, but its certificate (cell_weights, "
                                "query_weights) proves 2.03958070111", f"{BLOCK}/solver.gap: stored")
    assert len(report.failures) == 2  # the gap no longer alpha / lower_bound - 1; the global bound is the certificate's still


@pytest.mark.parametrize("factor", [1 + 1e-8, 1 - 1e-8])
@pytest.mark.parametrize("name", CERTIFIED)
def test_a_block_bound_off_its_certificate_by_1e_8_fails(copy_of, plans, name, factor):
    """Each block's bound must be its certificate's value to 1e-9 (relative), through the
    allocation's scales, split shares and a budget's factor: 1e-8 off either way fails (below
    is still a true bound, but not the one the stored weights prove)."""
    path = copy_of(name)
    block_id = read_plan(path).block_ids[-1]
    edit(path, f"blocks/{block_id}", lower_bound=lambda b: b * factor)
    reseal(path)
    report = assert_fails(path, f"blocks/{block_id}/lower_bound: stored", f"blocks/{block_id}/solver.gap: stored")
    assert len(report.failures) == 2


def test_an_edited_weight_fails_naming_the_bound_it_no_longer_proves(copy_of):
    """Half of one cell's weight moved to another: still a distribution, but another dual point
    (the stored one is the optimum here: uniform over the 24 cells), which proves less."""
    path = copy_of("merged")

    def move(u):
        u = u.copy()
        u[0], u[1] = u[0] + u[1] / 2, u[1] / 2
        return u
    edit_array(path, f"{BLOCK}/cell_weights", move)
    reseal(path)
    assert_fails(path, f"{BLOCK}/lower_bound: stored", "but its certificate (cell_weights, query_weights) proves",
                 "planner.global_lower_bound: stored")  # the global bound rides on the block's certificate


WEIGHT_EDITS = {
    "cell weights x 2": ("cell_weights", lambda u: u * 2, "they add up to "),
    "a negative query weight": ("query_weights", lambda v: np.where(v == v.max(), -v, v), "1 entries are negative"),
    "a NaN cell weight": ("cell_weights", lambda u: np.where(np.arange(u.size) == 0, np.nan, u),
                          "1 entries are not finite"),
}


@pytest.mark.parametrize("case", sorted(WEIGHT_EDITS))
def test_weights_that_are_not_a_distribution_fail(copy_of, case):
    array, change, why = WEIGHT_EDITS[case]
    path = copy_of("refined")
    edit_array(path, f"blocks/r-sex.edu/{array}", change)
    reseal(path)
    report = assert_fails(path, f"blocks/r-sex.edu/{array}: not a distribution of weights ({why}")
    assert len(report.failures) == 1  # no bound is evaluated at weights that are not a distribution
    if case == "cell weights x 2":  # the sum it names is the edited one (2 up to rounding)
        total = float(re.search(r"they add up to ([0-9.e+-]+),", report.failures[0]).group(1))
        assert total == pytest.approx(2.0, rel=1e-12)


def test_a_block_without_a_certificate_may_claim_no_bound(copy_of):
    """A block the joint block dual re-optimised (NaN weights) claiming a bound fails."""
    path = copy_of("replaced")
    block_id = read_plan(path).block_ids[0]
    edit(path, f"blocks/{block_id}", lower_bound=0.5)  # true (alpha is above 1), but nothing proves it
    reseal(path)
    assert_fails(path, f"blocks/{block_id}/lower_bound: stored 0.5, but the block has no certificate of its own")


def test_a_plan_written_before_certificates_fails_saying_how_to_get_one_that_passes(copy_of):
    """Without the weight arrays (a plan written before they were kept) the block's bound cannot
    be re-certified: it fails, and so does the global bound riding on it."""
    path = copy_of("merged")
    for array in ("cell_weights", "query_weights"):
        shutil.rmtree(path / BLOCK / array)
    reseal(path)
    report = assert_fails(path, f"{BLOCK}/lower_bound: cannot be re-certified: the plan stores no certificate",
                          "planner.global_lower_bound: 2.0395", "planner.global_lower_bound.method")
    assert REPLAN in report.failures[0]


def test_blocks_without_certificates_fail_once_naming_how_many(copy_of):
    """Every block of a plan written before certificates were kept lacks them alike: one line
    says so and how to get a plan that can be re-certified, not one line per block."""
    path = copy_of("refined")
    blocks = read_plan(path).explicit_block_ids
    assert len(blocks) == 2
    for block in blocks:
        for array in ("cell_weights", "query_weights"):
            shutil.rmtree(path / "blocks" / block / array)
    reseal(path)
    report = assert_fails(path, f"blocks/{blocks[0]}/lower_bound: cannot be re-certified: the plan stores no "
                                "certificate (cell_weights, query_weights) for it and 1 other block (")
    assert [f for f in report.failures if "re-certified" in f or REPLAN in f] == [report.failures[0]], report.failures


ARRAY_EDITS = {
    "query targets x 10": ("queries/targets", lambda t: t * 10, "queries/targets: 26 differ from the stored spec"),
    "block target shares x 10": (f"{BLOCK}/targets", lambda t: t * 10, f"{BLOCK}/targets: 26 target shares"),
    "block target shares / 10": (f"{BLOCK}/targets", lambda t: t / 10, "blocks/*/targets: the target shares of 26"),
    "query variances": ("queries/variances", lambda v: v / 2, "queries/variances: differ from the sum"),
}


@pytest.mark.parametrize("case", sorted(ARRAY_EDITS))
def test_an_edited_array_claim_fails_the_audit_naming_it(copy_of, case):
    name, change, claim = ARRAY_EDITS[case]
    path = copy_of("merged")
    edit_array(path, name, change)
    reseal(path)
    assert_fails(path, claim)


def test_targets_inflated_everywhere_consistently_still_fail(copy_of):
    """Spec, spec hash, query targets and block shares all x 10: the plan no longer meets its
    targets with equality, so the stated variance scale (1) is not the plan's (0.1)."""
    path = copy_of("merged")
    spec = read_plan(path).attrs["spec"]
    spec["queries"] = [dict(q, target=q["target"] * 10) for q in spec["queries"]]
    edit(path, spec=spec, planner__spec_hash=parse_spec(spec).spec_hash)
    edit_array(path, "queries/targets", lambda t: t * 10)
    edit_array(path, f"{BLOCK}/targets", lambda t: t * 10)
    reseal(path)
    assert_fails(path, "planner.variance_scale: stored 1.0, but the largest variance/target is 0.1")


def test_a_budget_plan_over_its_spec_budget_fails(copy_of):
    path = copy_of("budget")
    spec = read_plan(path).attrs["spec"]
    spec["privacy"] = {"mode": "budget", "rho": 0.25}  # the plan spends rho 0.5
    edit(path, spec=spec, planner__spec_hash=parse_spec(spec).spec_hash)
    reseal(path)
    assert_fails(path, "alpha: 1.0", "exceeds the spec's budget (alpha 0.5)")


def test_a_budget_plan_variance_scale_is_recomputed(copy_of):
    path = copy_of("budget")
    scale = read_plan(path).attrs["planner"]["variance_scale"]
    assert scale == pytest.approx(2.0396916, rel=1e-6)  # alpha 2.0397 brought down to the budget's 1
    edit(path, planner__variance_scale=scale / 10)  # it would promise ten times more accuracy
    reseal(path)
    assert_fails(path, "planner.variance_scale", "queries/variances: 26 queries exceed")


def test_the_allocation_bound_of_a_refined_plan_is_resolved(copy_of):
    path = copy_of("refined-budget")
    bound = read_plan(path).attrs["planner"]["chosen_blocks_lower_bound"]
    assert bound["method"] == SCALE_ALLOCATION
    edit(path, planner__chosen_blocks_lower_bound__value=bound["value"] * (1 + 1e-6))
    reseal(path)
    assert_fails(path, "planner.chosen_blocks_lower_bound: stored", "but its certificate (the scale allocation's "
                                                                    "dual point) proves")


@pytest.mark.parametrize("name", ["joint", "replaced"])
def test_the_joint_block_dual_bound_is_evaluated_at_its_certificate(copy_of, name):
    """Its certificate (each block's cell weights, one query weight vector) is stored: raised by
    1e-8, the bound is no longer what that point proves."""
    path = copy_of(name)
    bound = read_plan(path).attrs["planner"]["chosen_blocks_lower_bound"]
    assert bound["method"] == JOINT_BLOCK_DUAL and "block-diagonal plan with the chosen blocks" in bound["bounds"]
    edit(path, planner__chosen_blocks_lower_bound__value=bound["value"] * (1 + 1e-8))
    reseal(path)
    assert_fails(path, "planner.chosen_blocks_lower_bound: stored", "(the joint block dual's dual point) proves")


def test_a_global_bound_on_a_plan_of_several_blocks_fails(copy_of):
    path = copy_of("joint")
    plan = read_plan(path)
    assert plan.attrs["planner"]["global_lower_bound"]["value"] is None
    assert len(plan.block_ids) == 2
    edit(path, planner__global_lower_bound__value=0.1)  # true, but nothing certifies it
    reseal(path)
    assert_fails(path, "planner.global_lower_bound: 0.1 is stated, but no certificate proves a bound on every plan "
                       "(not known: the plan has 2 blocks")


def test_a_claim_edited_without_resealing_fails_the_checksum(copy_of, capsys):
    path = copy_of("merged")
    edit(path, account__epsilon_delta=_scaled_rows(0.1))
    report = audit_plan(str(path))
    assert report.failures[0].startswith("checksum: stored")
    assert any(f.startswith("account.epsilon_delta") for f in report.failures)
    assert main(["audit", str(path)]) == 1
    out = capsys.readouterr().out
    assert "audit FAILED" in out and "mismatch: checksum" in out and "mismatch: account.epsilon_delta" in out


# ---------------------------------------------------------------------------- labels and keys (issue 28)

OTHER_TEXT = "the privacy cost alpha of every mechanism whatsoever"
#: Labels and keys edited and re-sealed (plan, edits, the claim named): only the audit's own
#: derivation of each label, and its closed lists of keys, can catch them.
LABEL_EDITS = {
    "global bound's bounds text": ("merged", dict(planner__global_lower_bound__bounds=OTHER_TEXT),
                                   "planner.global_lower_bound.bounds: stored"),
    "global bound's method text": ("joint", dict(planner__global_lower_bound__method="the joint block dual"),
                                   "planner.global_lower_bound.method: stored"),
    "chosen bound said to bound every plan": ("refined", dict(planner__chosen_blocks_lower_bound__bounds=(
        "the privacy cost alpha of every Gaussian mechanism L (B x + z) that answers the workload with every variance "
        "at most its target times the variance scale")), "planner.chosen_blocks_lower_bound.bounds: stored"),
    "composition": ("merged", dict(composition="parallel across blocks and units"), "composition: stored"),
    "an invented account key": ("merged", dict(account__pure_epsilon=0.5), "account: unknown keys ['pure_epsilon']"),
    "an invented account row key": ("merged", dict(account__rdp=lambda rows: [dict(r, note="tight") for r in rows]),
                                    "account.rdp: expected the rows {order, epsilon}"),
    "an invented planner key": ("merged", dict(planner__optimal=True), "planner: unknown keys ['optimal']"),
    "an invented root key": ("merged", dict(epsilon=0.1), "attrs: unknown keys ['epsilon']"),
    "an invented bound key": ("joint", dict(planner__chosen_blocks_lower_bound__tight=True),
                              "planner.chosen_blocks_lower_bound: unknown keys ['tight']"),
    "decisions not a log": ("merged", dict(planner__decisions="certified optimal"), "planner.decisions"),
    "rounds not a count": ("refined", dict(planner__rounds=0), "planner.rounds"),
    # the joint block dual's bound at 100 x alpha: its certificate proves what it proves
    "chosen bound 100 x alpha": ("joint", dict(planner__chosen_blocks_lower_bound__value=lambda v: 100 * v),
                                 "planner.chosen_blocks_lower_bound: stored"),
}


@pytest.mark.parametrize("case", sorted(LABEL_EDITS))
def test_an_edited_label_or_an_invented_key_fails_naming_it(copy_of, case):
    name, changes, claim = LABEL_EDITS[case]
    path = copy_of(name)
    assert audit_plan(str(path)).ok
    edit(path, **changes)
    reseal(path)
    assert_fails(path, claim)


SOLVER_EDITS = {
    "gap": (lambda s: dict(s, gap=0.0), "solver.gap: stored 0.0, but alpha / lower_bound - 1 = "),
    "stage": (lambda s: dict(s, stage="exact"), "solver: unknown stage 'exact'"),
    "joint stage": (lambda s: dict(s, stage="block-dual", gap=None), "solver.stage: 'block-dual', but the block has a "
                                                                     "certificate of its own"),
    "invented key": (lambda s: dict(s, optimal=True), "solver: unknown keys ['optimal']"),
    "count": (lambda s: dict(s, dual_evaluations=-1), "solver: dual_evaluations is -1, not a count"),
}


@pytest.mark.parametrize("case", sorted(SOLVER_EDITS))
def test_an_edited_solver_record_fails_naming_it(copy_of, case):
    change, claim = SOLVER_EDITS[case]
    path = copy_of("merged")
    edit(path, BLOCK, solver=change)
    reseal(path)
    assert_fails(path, f"{BLOCK}/{claim}")


def test_an_invented_block_attr_fails(copy_of):
    path = copy_of("merged")
    edit(path, BLOCK, optimal=True)
    reseal(path)
    assert_fails(path, f"{BLOCK}: unknown attrs ['optimal']")


def _set_certificate(path, change) -> None:
    group = zarr.open_group(str(path), mode="r+")
    planner = copy.deepcopy(dict(group.attrs)["planner"])
    bound = planner["chosen_blocks_lower_bound"]
    certificate = change(bound.pop("certificate"))
    if certificate is not None:
        bound["certificate"] = certificate
    group.attrs["planner"] = planner


def _moved(weights):
    """Half of the first weight moved to the last: still a distribution, another dual point."""
    weights = list(weights)
    weights[0], weights[-1] = weights[0] / 2, weights[-1] + weights[0] / 2
    return weights


CERTIFICATE_EDITS = {
    "allocation weights moved": ("refined", lambda c: dict(c, weights=_moved(c["weights"])),
                                 "planner.chosen_blocks_lower_bound: stored"),
    "allocation weights x 2": ("refined", lambda c: dict(c, weights=[2 * w for w in c["weights"]]),
                               "planner.chosen_blocks_lower_bound.certificate.weights: not a distribution"),
    "allocation query moved": ("refined-budget", lambda c: dict(c, queries=[q + 1 for q in c["queries"]]),
                               "planner.chosen_blocks_lower_bound"),
    "joint cell weights moved": ("replaced", lambda c: dict(c, cell_weights={k: _moved(u) if len(u) > 1 else u
                                                                            for k, u in c["cell_weights"].items()}),
                                 "planner.chosen_blocks_lower_bound: stored"),
    "joint block left out": ("joint", lambda c: dict(c, cell_weights=dict(list(c["cell_weights"].items())[:1])),
                             "planner.chosen_blocks_lower_bound.certificate.cell_weights: expected the cell weights"),
    "certificate removed": ("refined", lambda c: None, "planner.chosen_blocks_lower_bound: cannot be re-certified: the "
                                                       "plan stores no certificate"),
}


@pytest.mark.parametrize("case", sorted(CERTIFICATE_EDITS))
def test_an_edited_or_missing_certificate_of_the_chosen_blocks_bound_fails(copy_of, case):
    """The bound is evaluated at the dual point stored with it: another point proves another
    value (or the edit breaks the point), and without one the bound cannot be re-certified."""
    name, change, claim = CERTIFICATE_EDITS[case]
    path = copy_of(name)
    _set_certificate(path, change)
    reseal(path)
    report = assert_fails(path, claim)
    if case == "certificate removed":
        assert REPLAN in report.failures[0]


def test_an_edited_pack_label_fails(packed, tmp_path):
    path = tmp_path / "plan.zarr"
    for attrs, claim in ((dict(solver={"method": "SM-II"}), "packs/p0/solver: stored"),
                         (dict(optimal=True), "packs/p0: unknown attrs ['optimal']")):
        shutil.rmtree(path, ignore_errors=True)
        shutil.copytree(packed / "packed.zarr", path)
        edit(path, "packs/p0", **attrs)
        reseal(path)
        assert_fails(path, claim)


# ---------------------------------------------------------------------------- the figure


def _optimal_alpha(W: np.ndarray, targets: np.ndarray) -> float:
    """Problem 1 as one semidefinite program (independent of distfit): with ``X = Sigma^-1`` in
    an orthonormal row basis B of W and ``L = W B^T``, minimise t subject to ``b_i^T X b_i <= t``
    and ``diag(Y) <= c`` with ``[[Y, L], [L^T, X]] >> 0`` (so ``Y >= L X^-1 L^T``, whose diagonal
    holds the variances)."""
    import cvxpy as cp

    B = orthonormal_row_basis(W)
    L = W @ B.T
    k, m = B.shape[0], W.shape[0]
    X = cp.Variable((k, k), symmetric=True)
    Y = cp.Variable((m, m), symmetric=True)
    t = cp.Variable()
    problem = cp.Problem(cp.Minimize(t), [
        cp.bmat([[Y, L], [L.T, X]]) >> 0, cp.diag(Y) <= targets, cp.sum(cp.multiply(B.T @ X, B.T), axis=1) <= t])
    problem.solve(solver=cp.CLARABEL)
    assert problem.status == "optimal"
    return float(problem.value)


def test_the_planner_bound_is_named_for_the_chosen_blocks(plans):
    """The issue's plan: the planner's bound (2.0396907) is above the optimum (2.0395807), so it
    bounds plans with the chosen blocks only; the store says so, and states the certified global
    bound beside it (the one block's own certificate), which the optimum respects."""
    plan = read_plan(plans / "merged.zarr")
    planner = plan.attrs["planner"]
    assert "allocation_lower_bound" not in planner
    chosen, whole = planner["chosen_blocks_lower_bound"], planner["global_lower_bound"]
    assert chosen["method"] == SCALE_ALLOCATION and "plan with the chosen blocks" in chosen["bounds"]
    assert "not a bound on plans with other blocks" in chosen["bounds"]
    assert chosen["value"] == pytest.approx(2.0396907, abs=5e-8)
    assert whole["value"] == pytest.approx(2.0395807, abs=5e-8) == plan.block("r-a.b.c").lower_bound
    assert "every Gaussian mechanism" in whole["bounds"] and "one block" in whole["method"]

    spec = parse_spec(MERGED_SPEC)
    workload = spec.workload()
    optimum = _optimal_alpha(workload.matrix, workload.targets)
    assert optimum == pytest.approx(2.0395807, abs=5e-8)
    assert chosen["value"] > optimum * (1 + 5e-5)  # not a bound on every plan
    assert whole["value"] <= optimum * (1 + 1e-7) <= plan.attrs["alpha"] * (1 + 1e-7)
    assert plan.attrs["alpha"] / whole["value"] - 1 < 1e-4  # the certified gap


def test_a_version_1_plan_fails_saying_it_cannot_be_re_certified(tmp_path, capsys):
    """A plan written before issue 12 (format version 1: its checksum covers the arrays only, its
    block keeps no certificate, its bound does not say what it bounds) fails, naming each claim it
    cannot re-certify and how to get a plan that can be; an edited claim is still named."""
    with zipfile.ZipFile(Path(__file__).parents[1] / "stores" / "plan_v1.zip") as archive:
        archive.extractall(tmp_path)
    path = tmp_path / "plan.zarr"
    assert main(["audit", str(path)]) == 1
    out = capsys.readouterr().out
    assert "audit FAILED" in out and "warning" not in out
    assert "mismatch: format_version: 1: cannot be re-certified" in out and REPLAN in out
    assert "mismatch: planner: unknown keys ['allocation_lower_bound']" in out
    assert "mismatch: blocks/r-a.b.c/lower_bound: cannot be re-certified" in out
    assert "mismatch: checksum" not in out  # its own rule still holds
    edit(path, account__epsilon_delta=_scaled_rows(0.1))
    assert reseal(path) == read_plan(path).checksum == "sha256:f00e2d65d9a11aaa3e910671bff0505b73c161558beece90cd2a8de763b36dab"
    assert_fails(path, "account.epsilon_delta: 6 epsilons differ")


# --------------------------------------------------------------------------------------------
# packed plans (issue 10): every claim of a packed block recomputed in bulk, and caught when edited

#: 2-way marginals of 3 x 4 x 2 x 3 attributes, a target per marginal: block r-x0 has segments of
#: different targets, so its certificate picks one.
PACKED_SPEC = marginals_spec([3, 4, 2, 3], 2, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0], name="packed")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("packed")
    write_packed_plan(root / "packed.zarr", PACKED_SPEC)
    write_packed_plan(root / "groups.zarr", PACKED_SPEC, explicit=len(read_plan(root / "packed.zarr").block_ids))
    write_packed_plan(root / "mixed.zarr", PACKED_SPEC, explicit=4)
    return root


def test_a_packed_plan_passes_and_agrees_with_its_blocks_written_one_group_each(packed):
    reports = {name: audit_plan(str(packed / f"{name}.zarr")) for name in ("packed", "groups", "mixed")}
    for name, report in reports.items():
        assert report.ok, (name, report.failures)
    assert read_plan(packed / "packed.zarr").explicit_block_ids == ()
    assert read_plan(packed / "groups.zarr").pack_ids == ()
    alphas = [reports[name].value for name in ("packed", "groups", "mixed")]
    assert alphas == pytest.approx([alphas[0]] * 3, rel=1e-12)
    # every packed block's stated bound is what its materialised certificate proves (the one-group rule)
    plan = read_plan(packed / "packed.zarr")
    for block in plan.iter_blocks():
        t = bound_targets(block.variances, block.targets)
        proved = certified_bound(block.basis, block.recon / np.sqrt(t)[:, None], block.cell_weights,
                                 block.query_weights)
        assert block.lower_bound == pytest.approx(proved, rel=1e-9)



def test_the_global_bound_of_a_one_block_packed_plan_is_its_packed_certificate(tmp_path):
    """A plan whose one block is packed (the grand total at target 2) may state its global bound:
    the pack's certificate proves 1/2 (the total's closed form: variance t costs alpha 1/t); the
    audit checks it to the block's tolerance (it raised KeyError: the tolerance was looked up
    among the explicit blocks only), and an edit by 1e-6 fails naming it."""
    path = tmp_path / "total.zarr"
    write_packed_plan(path, {"name": "total", "attributes": [{"name": "x0", "size": 3}],
                             "queries": [{"name": "t", "total": True, "target": 2.0}]})
    assert read_plan(path).explicit_block_ids == () and len(read_plan(path).block_ids) == 1
    bound = {"method": distfit.audit.labels.global_bound_method(1, True), "bounds": GLOBAL_BOUNDS, "value": 0.5}
    edit(path, planner__global_lower_bound=bound)
    reseal(path)
    report = audit_plan(str(path))
    assert report.ok, report.failures
    edit(path, planner__global_lower_bound__value=0.5 * (1 + 1e-6))
    reseal(path)
    assert_fails(path, "planner.global_lower_bound: stored 0.5000005, but the plan's one block's certificate proves 0.49999999")

def _pack_block(path, block_id: str) -> int:
    plan = read_plan(path)
    return plan.packed_block_ids(0).index(block_id)


def _segments_of(path, block_id: str) -> np.ndarray:
    offsets = read_plan(path).packs()[0].segment_offsets
    b = _pack_block(path, block_id)
    return np.arange(offsets[b], offsets[b + 1])


def _bump(index_of, factor):
    def change(values):
        values = values.copy()
        values[index_of] = values[index_of] * factor
        return values
    return change


PACK_EDITS = {
    # edited array, which entries (a block id, "segment:<block id>" its segments, "query:<q>" the
    # segments of the marginal starting at query q), factor, the claims named
    "scale": ("scale", "r-x1.x2", 1 + 1e-6, ("packs/p0/alpha", "packs/p0/segment_variance", "packs/p0/lower_bound")),
    "alpha": ("alpha", "r-x0.x3", 1.01, ("packs/p0/alpha",)),
    "lower_bound": ("lower_bound", "r-x2", 1 + 1e-8, ("packs/p0/lower_bound",)),
    "variance": ("segment_variance", "segment:r-x0", 1.01, ("packs/p0/segment_variance",)),
    "share over target": ("segment_target", "segment:r-x3", 4.0, ("packs/p0/segment_target",)),
    "shares short": ("segment_target", "query:0", 0.2, ("blocks/*/targets: the target shares",)),
}


@pytest.mark.parametrize("case", sorted(PACK_EDITS))
def test_an_edit_inside_a_packed_block_fails_the_audit_naming_it(packed, tmp_path, case):
    array, entry, factor, claims = PACK_EDITS[case]
    path = tmp_path / "plan.zarr"
    shutil.copytree(packed / "packed.zarr", path)
    if entry.startswith("query:"):  # every block's segment of the marginal whose first query this is
        index = np.flatnonzero(read_plan(path).packs()[0].segment_query == int(entry.split(":")[1]))
    else:
        index = _segments_of(path, entry.split(":")[1]) if entry.startswith("segment:") else _pack_block(path, entry)
    edit_array(path, f"packs/p0/{array}", _bump(index, factor))
    reseal(path)
    assert_fails(path, *claims)


def test_a_moved_certificate_or_query_fails(packed, tmp_path):
    path = tmp_path / "plan.zarr"
    shutil.copytree(packed / "packed.zarr", path)
    segments = _segments_of(path, "r-x0")  # three marginals of targets 1, 2, 3: one binds
    b = _pack_block(path, "r-x0")
    certificate = int(read_plan(path).packs()[0].certificate[b])
    other = int(segments[segments != certificate][-1])
    edit_array(path, "packs/p0/certificate", lambda c: np.where(np.arange(c.size) == b, other, c))
    reseal(path)
    assert_fails(path, "packs/p0/lower_bound")

    shutil.rmtree(path)
    shutil.copytree(packed / "packed.zarr", path)
    first = int(_segments_of(path, "r-x2.x3")[0])
    edit_array(path, "packs/p0/segment_query", lambda q: np.where(np.arange(q.size) == first, q - 1, q))
    reseal(path)
    assert_fails(path, "queries/variances")


def test_a_packed_edit_without_resealing_fails_the_checksum_and_a_broken_pack_is_refused(packed, tmp_path):
    path = tmp_path / "plan.zarr"
    shutil.copytree(packed / "packed.zarr", path)
    edit(path, "packs/p0", solver={"method": "SM-II"})  # a claim only the checksum covers
    report = audit_plan(str(path))
    assert [f for f in report.failures if f.startswith("checksum")], report.failures
    shutil.rmtree(path)
    shutil.copytree(packed / "packed.zarr", path)
    edit_array(path, "packs/p0/segment_offsets", lambda o: o[::-1].copy())
    with pytest.raises(StoreError, match="packs/p0: segment_offsets"):
        audit_plan(str(path))


@pytest.mark.parametrize("array, change, claim", [
    ("variance_values", lambda v: v * np.where(np.arange(v.size) == 2, 1.01, 1.0), "queries/variances"),
    ("target_values", lambda v: v * np.where(np.arange(v.size) == 0, 1.5, 1.0), "queries/targets: 12 differ"),
    ("target_offsets", lambda o: o + (np.arange(o.size) == 1), "queries/targets: 1 differ from the stored spec's "
                                                               "targets (first: query 12: stored 1.0, spec 2.0)"),
])
def test_queries_stored_as_runs_pass_and_an_edited_run_fails(tmp_path, monkeypatch, array, change, claim):
    """Targets and variances stored as runs (format version 4) are compared run by run with the
    spec's targets and the sum of the block rows, never expanded; a run moved by one query fails."""
    monkeypatch.setattr(distfit.stores.plan, "RUN_LENGTH_MIN_QUERIES", 1)
    path = tmp_path / "plan.zarr"
    write_packed_plan(path, PACKED_SPEC)
    assert read_plan(path).attrs["format_version"] == 4
    report = audit_plan(str(path))
    assert report.ok, report.failures
    edit_array(path, f"queries/{array}", change)
    reseal(path)
    assert_fails(path, claim)


# --------------------------------------------------------------------------------------------
# large domains planned in closed form (issue 10): alpha exact above the cell-by-cell limit


def _shorthand_spec(name: str, sizes, order: int, extra=()) -> dict:
    return {"name": name, "attributes": [{"name": f"a{i}", "size": n, "ordinal": True} for i, n in enumerate(sizes)],
            "queries": [{"name": "m", "marginals": {"order": order}, "target": 1}, *extra]}


@pytest.mark.parametrize("sizes, order, reference", [
    ([10] * 30, 2, 309.796131),  # issue 10's table: the residual program's optimum
    ([10] * 8, 3, 38.972609),
])
def test_closed_form_plans_of_large_domains_pass_the_audit_with_alpha_exact(tmp_path, capsys, sizes, order, reference):
    """``distfit plan`` then ``distfit audit`` on all k-way marginals of a domain far over the
    cell-by-cell limit: every block is closed-form (flat profiles), so alpha is exact as the sum
    of the block alphas, the CLI says so, the packed bounds are what their certificates prove,
    and the audit passes."""
    spec_path, plan_path = tmp_path / "spec.yaml", tmp_path / "plan.zarr"
    spec_path.write_text(yaml.safe_dump(_shorthand_spec("big", sizes, order)))
    assert main(["plan", str(spec_path), "--out", str(plan_path), "--serial"]) == 0
    out = capsys.readouterr().out
    assert "[exact (closed-form blocks: flat profiles, so the sum over blocks)]" in out, out
    plan = read_plan(plan_path)
    assert plan.explicit_block_ids == () and plan.attrs["alpha_exact"] is True
    assert plan.attrs["alpha"] == pytest.approx(reference, rel=1e-6)
    report = audit_plan(str(plan_path))
    assert report.ok, report.failures
    assert report.value == pytest.approx(plan.attrs["alpha"], rel=1e-12)
    assert main(["audit", str(plan_path)]) == 0


def test_alpha_exact_claimed_over_a_non_flat_block_of_a_large_domain_fails(tmp_path):
    """A prefix query adds an SM-II block whose profile is not flat: the plan says "sum bound",
    and the same plan re-labelled exact fails the audit naming alpha_exact."""
    prefix = {"name": "p", "attributes": {"a0": "prefix"}, "target": 1}
    spec = _shorthand_spec("mixed-big", [10] * 8, 2, [prefix])
    path = tmp_path / "plan.zarr"
    run_plan(parse_spec(spec), str(path), placement=Placement(serial=True), log=io.StringIO())
    plan = read_plan(path)
    assert plan.explicit_block_ids and plan.attrs["alpha_exact"] is False
    assert audit_plan(str(path)).ok
    edit(path, alpha_exact=True)
    reseal(path)
    assert_fails(path, "alpha_exact")
