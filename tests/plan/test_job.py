"""`distfit plan` and `distfit audit` end to end (spec -> cluster -> plan store -> audit)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml
import zarr

from distfit.audit.plan import audit_plan
from distfit.cli.main import main
from distfit.plan import job as plan_job
from distfit.plan.job import level_profiles, run_plan, scale_plan_to_budget
from distfit.mathematics.privacy import alpha_for_budget
from distfit.spec.parse import parse_spec
from distfit.stores.plan import read_plan
from distfit.runtime.placement import Placement
from tests.packed_plans import marginals_spec
from tests.reference import SMALL_SPEC

PIPELINES = Path(__file__).resolve().parents[2] / "pipelines"


def _write_spec(tmp_path, content):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(content))
    return str(path)


def test_plan_then_audit_on_a_local_cluster(tmp_path, capsys):
    out = str(tmp_path / "plan.zarr")
    assert main(["plan", _write_spec(tmp_path, SMALL_SPEC), "--out", out, "--workers", "2"]) == 0
    plan = read_plan(out)
    assert plan.attrs["distfit_format"] == "plan"
    assert np.all(plan.queries_variances <= plan.queries_targets * (1 + 1e-9))
    assert plan.attrs["alpha_exact"] is True
    assert main(["audit", out]) == 0
    assert "audit passed" in capsys.readouterr().out


def test_pl94_plan_audits_and_matches_the_global_solve(tmp_path):
    from distfit import solve
    from distfit.mathematics.workload import pl94_workload

    out = str(tmp_path / "pl94.zarr")
    assert main(["plan", str(PIPELINES / "pl94.yaml"), "--out", out, "--serial"]) == 0
    assert main(["audit", out]) == 0
    workload = pl94_workload()
    assert read_plan(out).attrs["alpha"] == pytest.approx(solve(workload.matrix, workload.targets).alpha, rel=1e-3)


def test_targets_thousands_apart_in_one_block_plan_and_audit(tmp_path):
    """The age pyramid with its prefixes at target 10^3.5 beside the policy counts at 1: one
    residual block whose targets are 3,162 apart. A warm start's query weights left G singular
    there (the plan failed: "the dual could not be evaluated"); the start now takes more of the
    uniform weights (``START_UNIFORM_SHARES``), and the audit pins the bounds to what the
    ill-conditioned sigma's variances allow. The plan must audit and match one global solve."""
    from distfit import solve
    from distfit.mathematics.workload import age_pyramid_workload

    text = (PIPELINES / "age_pyramid.yaml").read_text()
    spec = tmp_path / "wide_targets.yaml"
    spec.write_text(text.replace("10,", "3162.2776601683795,").replace("10]", "3162.2776601683795]"))
    out = str(tmp_path / "plan.zarr")
    assert main(["plan", str(spec), "--out", out, "--serial"]) == 0
    assert main(["audit", out]) == 0
    workload = age_pyramid_workload(1.0, 10**3.5)
    plan = read_plan(out)
    assert np.array_equal(plan.queries_targets, workload.targets)
    assert plan.attrs["alpha"] == pytest.approx(solve(workload.matrix, workload.targets).alpha, rel=1e-3)


def test_audit_catches_a_tampered_sigma(tmp_path, capsys):
    out = str(tmp_path / "plan.zarr")
    assert main(["plan", _write_spec(tmp_path, SMALL_SPEC), "--out", out, "--serial"]) == 0
    block_id = read_plan(out).block_ids[0]
    sigma = zarr.open_array(f"{out}/blocks/{block_id}/sigma", mode="r+")
    sigma[0, 0] = sigma[0, 0] * 0.5  # less noise than the plan claims
    assert main(["audit", out]) == 1
    text = capsys.readouterr().out
    assert "checksum" in text and "mismatch" in text


def test_budget_spec_spends_exactly_the_budget(tmp_path):
    content = dict(SMALL_SPEC, privacy={"epsilon": 1.0, "delta": 1e-6})
    out = str(tmp_path / "plan.zarr")
    assert main(["plan", _write_spec(tmp_path, content), "--out", out, "--serial"]) == 0
    assert read_plan(out).attrs["alpha"] == pytest.approx(alpha_for_budget(1.0, 1e-6), rel=1e-9)
    assert main(["audit", out]) == 0


def test_bad_inputs_exit_2_and_leave_no_plan(tmp_path, capsys):
    out = tmp_path / "plan.zarr"
    bad = dict(SMALL_SPEC, queries=[{"name": "x", "attributes": {"agee": "identity"}, "target": 1}])
    assert main(["plan", _write_spec(tmp_path, bad), "--out", str(out), "--serial"]) == 2
    assert "agee" in capsys.readouterr().err
    malformed = tmp_path / "broken.yaml"
    malformed.write_text("name: [unclosed\n")
    assert main(["plan", str(malformed), "--out", str(out), "--serial"]) == 2
    assert main(["plan", _write_spec(tmp_path, SMALL_SPEC), "--out", str(out), "--cluster", "tcp://127.0.0.1:1"]) == 2
    assert not out.exists() and not list(tmp_path.glob("plan.zarr*"))
    # a plan already at --out is refused without --overwrite and left intact
    assert main(["plan", _write_spec(tmp_path, SMALL_SPEC), "--out", str(out), "--serial"]) == 0
    checksum = read_plan(str(out)).checksum
    assert main(["plan", _write_spec(tmp_path, SMALL_SPEC), "--out", str(out), "--serial"]) == 2
    assert "already holds a plan" in capsys.readouterr().err
    assert read_plan(str(out)).checksum == checksum
    assert main(["audit", str(tmp_path / "missing.zarr")]) == 2


def test_plan_store_attrs_are_strict_json(tmp_path):
    """Every zarr.json of a plan parses as strict JSON (no NaN or Infinity)."""
    import json

    out = tmp_path / "plan.zarr"
    assert main(["plan", _write_spec(tmp_path, SMALL_SPEC), "--out", str(out), "--serial"]) == 0

    def refuse(constant):
        raise ValueError(f"non-JSON constant {constant}")

    for path in out.rglob("zarr.json"):
        json.loads(path.read_text(), parse_constant=refuse)


def test_round_progress_restarts_its_clock_every_round():
    import io

    from distfit.plan.job import RoundProgress

    out = io.StringIO()
    meter = RoundProgress("plan", out)
    meter(0, 2)
    first = meter.meter
    meter(2, 2)
    meter(0, 2)  # the next refinement round starts
    assert meter.meter is not first and meter.round == 1
    meter(2, 2)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("plan: 2/2 blocks") and lines[1].startswith("plan round 1: 2/2 blocks")


def _prefix_and_marginals_spec() -> dict:
    spec = marginals_spec([3, 4, 2, 3], 2, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0], name="scaled-layout")
    spec["attributes"] += [{"name": "age", "size": 5, "ordinal": True}, {"name": "edu", "size": 3, "ordinal": True}]
    spec["queries"] += [{"name": "age", "attributes": {"age": "prefix"}, "target": 1},
                        {"name": "age_edu", "attributes": {"age": "prefix", "edu": "prefix"}, "target": 2}]
    return dict(spec, blocks={"merge": False})


def _block_groups(path: Path) -> list[str]:
    blocks = path / "blocks"
    return sorted(p.name for p in blocks.iterdir() if p.is_dir()) if blocks.is_dir() else []


@pytest.mark.parametrize("layout", ["closed-form pack", "solved pack"])
def test_scaling_a_stored_plan_keeps_its_packs(tmp_path, monkeypatch, layout):
    """A closed-form pack is scaled as a pack (its closed forms at scale * k) and solved blocks go
    into a solved pack where write_plan would pack them: not one store group per block (a
    level's share of a 500,000-block plan would be 500,000 groups); the scaled plan equals the
    plan run_plan makes for the budget and passes the audit."""
    monkeypatch.setattr(plan_job, "SOLVED_PACK_MIN_BLOCKS", 2)  # this small plan packs its solved blocks
    accuracy = marginals_spec([3, 4, 2, 3], 2, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0], name="scaled-layout") \
        if layout == "closed-form pack" else _prefix_and_marginals_spec()
    budget = dict(accuracy, privacy={"alpha": 0.75})
    run_plan(parse_spec(accuracy), str(tmp_path / "a.zarr"), placement=Placement(serial=True))
    run_plan(parse_spec(budget), str(tmp_path / "b.zarr"), placement=Placement(serial=True))
    scale_plan_to_budget(str(tmp_path / "a.zarr"), str(tmp_path / "s.zarr"), parse_spec(budget), 0.75)
    source, direct, scaled = (read_plan(tmp_path / name) for name in ("a.zarr", "b.zarr", "s.zarr"))
    assert len(source.packs()) == len(scaled.packs()) == len(direct.packs())
    assert (len(source.packs()) > 0) == (layout == "closed-form pack")
    assert (tmp_path / "s.zarr" / "solved").is_dir() == (tmp_path / "a.zarr" / "solved").is_dir() \
        == (layout == "solved pack")
    assert _block_groups(tmp_path / "s.zarr") == _block_groups(tmp_path / "b.zarr") == []
    assert scaled.block_ids == direct.block_ids and scaled.explicit_block_ids == direct.explicit_block_ids
    for block_id in direct.block_ids:
        a, b = scaled.block(block_id), direct.block(block_id)
        for name in ("sigma", "variances", "profile"):
            np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-9, atol=1e-12)
        assert a.alpha == pytest.approx(b.alpha, rel=1e-9) and a.lower_bound == pytest.approx(b.lower_bound, rel=1e-9)
    assert scaled.attrs["alpha"] == pytest.approx(0.75, rel=1e-12)
    report = audit_plan(str(tmp_path / "s.zarr"))
    assert report.ok, report.failures


def test_scaling_a_stored_plan_to_a_budget_equals_planning_with_that_budget(tmp_path):
    """scale_plan_to_budget(accuracy plan, budget) gives the plan run_plan makes for the spec
    with that budget: same arrays, alpha, account; and it passes audit."""
    accuracy = dict(SMALL_SPEC, name="scaled")
    budget = dict(accuracy, privacy={"alpha": 0.75})
    run_plan(parse_spec(accuracy), str(tmp_path / "a.zarr"), placement=Placement(serial=True))
    run_plan(parse_spec(budget), str(tmp_path / "b.zarr"), placement=Placement(serial=True))
    scale_plan_to_budget(str(tmp_path / "a.zarr"), str(tmp_path / "s.zarr"), parse_spec(budget), 0.75)
    direct, scaled = read_plan(tmp_path / "b.zarr"), read_plan(tmp_path / "s.zarr")
    assert audit_plan(str(tmp_path / "s.zarr")).ok
    assert scaled.attrs["alpha"] == pytest.approx(0.75, rel=1e-12) == direct.attrs["alpha"]
    assert scaled.attrs["planner"]["spec_hash"] == direct.attrs["planner"]["spec_hash"]
    assert scaled.attrs["planner"]["variance_scale"] == pytest.approx(direct.attrs["planner"]["variance_scale"], rel=1e-9)
    np.testing.assert_allclose(scaled.queries_variances, direct.queries_variances, rtol=1e-9)
    assert scaled.block_ids == direct.block_ids
    for block_id in direct.block_ids:
        a, b = scaled.block(block_id), direct.block(block_id)
        for name in ("sigma", "variances", "profile", "basis", "recon"):
            np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=1e-9, atol=1e-12)
    # the profiles combine_levels reads: every block's attributes and stored profile
    profiles = level_profiles(scaled)
    assert [attributes for attributes, _ in profiles] == [tuple(scaled.block(b).attributes) for b in scaled.block_ids]
    for (_, profile), block_id in zip(profiles, scaled.block_ids):
        assert profile.tobytes() == np.asarray(scaled.block(block_id).profile, dtype=float).tobytes()


def test_batched_tasks_follow_the_order_and_reach_the_least_work():
    from distfit.plan.planner import BlockTask, batched, decompose, estimated_seconds, solve_order

    spec = parse_spec(SMALL_SPEC)
    blocks, _ = decompose(spec.domain, spec.group_triples(), 0)
    tasks = [BlockTask(i, blocks[i], blocks[i].targets) for i in solve_order(blocks)]
    floor = 2.5 * max(estimated_seconds(b) for b in blocks)
    batches = list(batched(iter(tasks), floor))
    assert [t.index for batch in batches for t in batch] == [t.index for t in tasks]  # order kept, nothing lost
    assert all(sum(estimated_seconds(t.spec) for t in batch) >= floor for batch in batches[:-1])
    assert len(batches) < len(tasks)
    assert [len(batch) for batch in batched(tasks, 0.0)] == [1] * len(tasks)  # 0: one task per block


def test_batching_gives_the_same_plan_store_as_one_task_per_block(tmp_path):
    from distfit.plan.cluster_executor import DaskExecutor
    from distfit.runtime.cluster import dask_client
    from distfit.plan.job import write_plan
    from distfit.plan.planner import decompose, plan_blocks

    spec = parse_spec(SMALL_SPEC)
    checksums = []
    with dask_client(None, workers=2) as client:
        for seconds in (0.0, 1e3):  # one task per block; every block in one task
            blocks, decisions = decompose(spec.domain, spec.group_triples(), 0)
            plan = plan_blocks(spec.domain, blocks, spec.targets, DaskExecutor(client, batch_seconds=seconds), 1, decisions)
            checksums.append(write_plan(spec, plan, str(tmp_path / f"plan-{seconds}.zarr")))
    assert checksums[0] == checksums[1]
