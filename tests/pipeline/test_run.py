"""`distfit run`: plan + audit + data + release into one run directory, with a manifest."""
from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
import zarr

from tests.clitools import assert_one_line_error, run
from distfit.audit.plan import audit_plan
import distfit.estimate.job as estimating
import distfit.pipeline.run as pipeline
from distfit.stores.data import read_histograms, write_synthetic
from distfit.stores.estimate import read_estimate, verify_estimate
from distfit.stores.release import read_release, verify_release
from distfit.pipeline.run import PACKAGES, data_seed, default_spec_path
from distfit.spec.parse import load_spec
from distfit.stores.plan import read_plan, verify_checksum
from distfit.runtime.placement import Placement
from tests.plan.test_levels import LEVELS_SPEC
from tests.reference import SMALL_SPEC

SPEC = SMALL_SPEC


@pytest.fixture()
def specs(tmp_path):
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump(dict(SPEC, queries=SPEC["queries"][:2])))
    return spec, other


def _run(capsys, spec, rundir, *flags):
    return run(capsys, "run", str(spec), "--out", str(rundir), "--units", "200", "--serial", *flags)


def _manifest(rundir) -> dict:
    return json.loads((Path(rundir) / "manifest.json").read_text())


def index_text(manifest) -> str:
    return Path(manifest["report"]["index"]).read_text()


def _check_outputs(rundir, spec_path) -> dict:
    rundir = Path(rundir)
    for name in ("plan.zarr", "data.zarr", "release.zarr", "manifest.json"):
        assert (rundir / name).exists(), name
    manifest = _manifest(rundir)
    plan = read_plan(rundir / "plan.zarr")
    assert verify_checksum(rundir / "plan.zarr")[0]
    ok, stored, _ = verify_release(rundir / "release.zarr")
    assert ok
    assert manifest["plan"]["checksum"] == plan.checksum
    assert manifest["release"]["checksum"] == stored
    assert read_release(rundir / "release.zarr").attrs["plan_checksum"] == plan.checksum
    spec = load_spec(spec_path)
    assert manifest["spec"]["hash"] == spec.spec_hash == plan.attrs["planner"]["spec_hash"]
    assert manifest["spec"]["path"] == str(Path(spec_path).resolve())
    assert manifest["privacy"]["account"] == plan.attrs["account"]
    assert manifest["privacy"]["alpha"] == plan.attrs["alpha"]
    assert set(manifest["versions"]) == set(PACKAGES)
    assert all(isinstance(v, str) for v in manifest["versions"].values())
    assert set(manifest["timings_seconds"]) >= {"plan", "audit", "data", "release", "total"}
    if manifest["stages"]["estimate"] != "skipped":  # the estimate of this release, sealed, as recorded
        estimate = read_estimate(rundir / "estimate.zarr")
        assert verify_estimate(rundir / "estimate.zarr")[0]
        assert estimate.attrs["release_checksum"] == manifest["release"]["checksum"]
        assert estimate.attrs["plan_checksum"] == plan.checksum
        assert np.asarray(estimate.estimates[...]).min() >= 0  # published estimates are never negative
        assert manifest["estimate"] == {"path": str((rundir / "estimate.zarr").resolve()), "checksum": estimate.checksum,
                                        "method": "projection", "integer": estimate.integer, "fit": estimate.attrs["fit"]}
        assert "estimate" in manifest["timings_seconds"]
        assert manifest["report"] is None or "Estimates: nonnegative" in index_text(manifest)
    else:
        assert manifest["estimate"] is None
    assert manifest["cluster"] == {"kind": "serial"}
    if manifest["stages"]["report"] == "skipped":  # --no-report: none drawn, none left from before
        assert manifest["report"] is None and "report" not in manifest["timings_seconds"]
        assert not (rundir / "report" / "index.html").exists()
        return manifest
    index = Path(manifest["report"]["index"])
    assert index.is_file() and "alpha" in index.read_text()
    # the plots are inline in the pages: each named figure is in its page; with the data (a run
    # always has it) the confidential validation page is next to index.html, and no other file is
    assert manifest["report"]["plots"] and all(f'<figure id="{p}">' in index.read_text() for p in manifest["report"]["plots"])
    validation = Path(manifest["report"]["validation"])
    assert validation == index.parent / "validation.html" and "CONFIDENTIAL" not in index.read_text()
    assert all(f'<figure id="{p}">' in validation.read_text() for p in manifest["report"]["validation_plots"])
    assert sorted(p.name for p in index.parent.iterdir()) == sorted([index.name, validation.name, ".distfit-report"])
    assert not list(rundir.glob(".manifest.json.*"))  # no temporary left behind
    return manifest


def test_end_to_end_and_rerun_reuses_everything(capsys, specs, tmp_path):
    spec, _ = specs
    rundir = tmp_path / "run"
    code, out, err = _run(capsys, spec, rundir)
    assert code == 0, err
    for name in ("plan.zarr", "data.zarr", "release.zarr", "manifest.json"):
        assert str(rundir / name) in out
    first = _check_outputs(rundir, spec)
    assert first["stages"] == {"plan": "done", "audit": "passed", "data": "synthesised", "release": "done",
                               "estimate": "done", "report": "done"}
    data = read_histograms(rundir / "data.zarr")
    assert data.units == 200 and data.attrs["seed"] == data_seed(first["spec"]["hash"])
    assert data.attrs["spec_hash"] == first["spec"]["hash"]
    sealed = read_release(rundir / "release.zarr").attrs["sealed"]
    answers = np.asarray(zarr.open_group(str(rundir / "release.zarr"), mode="r")["queries/answers"][...])

    code, out, err = _run(capsys, spec, rundir)
    assert code == 0, err
    second = _check_outputs(rundir, spec)
    assert second["stages"] == {"plan": "reused", "audit": "passed", "data": "reused", "release": "reused",
                                "estimate": "reused", "report": "done"}
    assert second["estimate"] == first["estimate"]
    assert second["plan"]["checksum"] == first["plan"]["checksum"]
    assert second["release"]["checksum"] == first["release"]["checksum"]
    assert second["data"]["created"] == first["data"]["created"]
    assert read_release(rundir / "release.zarr").attrs["sealed"] == sealed  # not redrawn
    again = np.asarray(zarr.open_group(str(rundir / "release.zarr"), mode="r")["queries/answers"][...])
    np.testing.assert_array_equal(again, answers)
    assert "no new noise drawn" in err

    # a rerun without --units reuses the data too; --no-report draws none and removes the earlier
    # run's (the rerun above drew it from the same stores); a different --units is refused
    code, out, err = run(capsys, "run", str(spec), "--out", str(rundir), "--serial", "--no-report")
    assert code == 0, err
    assert _manifest(rundir)["stages"]["data"] == "reused" and "report         skipped (--no-report)" in out
    assert _check_outputs(rundir, spec)["stages"]["report"] == "skipped" and not (rundir / "report").exists()
    code, _, err = run(capsys, "run", str(spec), "--out", str(rundir), "--serial", "--units", "300")
    assert code == 2
    assert_one_line_error(err, "200 units")


def test_estimate_stage_options_and_resume(capsys, specs, tmp_path, monkeypatch):
    """--integer replaces a real estimate (it is a function of the plan and release: nothing is
    lost), a partial estimate is resumed, --no-estimate skips the stage; the release is never
    redrawn."""
    spec, _ = specs
    rundir = tmp_path / "run"
    code, out, err = _run(capsys, spec, rundir, "--integer", "--no-report")
    assert code == 0, err
    assert "estimate.zarr  (done, integer)" in out and "report         skipped (--no-report)" in out
    first = _check_outputs(rundir, spec)
    assert first["estimate"]["integer"] is True and read_estimate(rundir / "estimate.zarr").cells.dtype == np.int64
    code, out, err = _run(capsys, spec, rundir, "--no-report")
    assert code == 0, err
    assert "of other inputs or options; replacing it" in err
    second = _check_outputs(rundir, spec)
    assert second["stages"]["estimate"] == "done" and second["estimate"]["integer"] is False
    assert second["release"]["checksum"] == first["release"]["checksum"]
    # a partial estimate (interrupted after its first chunk) is resumed by the next run
    real_run = estimating.run_estimate

    def interrupted(*args, **kwargs):
        def stop(chunk):
            raise Interrupted
        return real_run(*args, **dict(kwargs, after_chunk=stop))

    shutil.rmtree(rundir / "estimate.zarr")
    monkeypatch.setattr(estimating, "run_estimate", interrupted)
    with pytest.raises(Interrupted):
        pipeline.run_pipeline(str(spec), rundir, placement=Placement(serial=True), log=io.StringIO(), report=False)
    monkeypatch.setattr(estimating, "run_estimate", real_run)
    code, out, err = _run(capsys, spec, rundir, "--no-report")
    assert code == 0, err
    assert "resuming" in err and "estimate.zarr  (resumed, real)" in out
    assert _check_outputs(rundir, spec)["estimate"]["checksum"] == second["estimate"]["checksum"]
    code, out, err = _run(capsys, spec, rundir, "--no-estimate", "--no-report")
    assert code == 0, err
    assert _check_outputs(rundir, spec)["stages"]["estimate"] == "skipped" and "  estimate  " not in out


def test_a_rerun_checks_the_chunks_of_the_release_it_reuses(capsys, specs, tmp_path):
    """A run hands the estimate the checksum of a release it has just drawn (not hashed again);
    a release it reuses is another matter: its root is verified and each chunk as the estimate
    reads it, so a chunk changed on disk since the first run is refused in one line."""
    spec, _ = specs
    rundir = tmp_path / "run"
    code, _, err = _run(capsys, spec, rundir, "--no-report")
    assert code == 0, err
    # a chunk of a block's answers: what the estimate reads of a release
    target = next(p for p in sorted((rundir / "release.zarr" / "blocks").glob("*/answers/c/**/*")) if p.is_file())
    raw = bytearray(target.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    target.write_bytes(bytes(raw))
    shutil.rmtree(rundir / "estimate.zarr")
    code, _, err = _run(capsys, spec, rundir, "--no-report")
    assert code == 2, err
    assert "no new noise drawn" in err  # the release was reused, not redrawn
    assert_one_line_error(err.strip().splitlines()[-1], "release.zarr", "cannot be trusted")


class Interrupted(Exception):
    pass


def test_partial_release_is_resumed(capsys, specs, tmp_path, monkeypatch):
    spec, other = specs
    rundir = tmp_path / "run"
    rundir.mkdir()
    # data in several chunks (reused by the run: same spec, same seed)
    write_synthetic(load_spec(spec), 200, rundir / "data.zarr", seed=data_seed(load_spec(spec).spec_hash),
                    chunk_units=20)
    original = pipeline.run_release
    calls = []

    def interrupt(chunk):
        calls.append(chunk)
        if len(calls) == 3:
            raise Interrupted(f"stopped after chunk {chunk}")

    def patched(*args, **kwargs):
        kwargs["after_chunk"] = interrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(pipeline, "run_release", patched)
    with pytest.raises(Interrupted):
        _run(capsys, spec, rundir)
    capsys.readouterr()
    monkeypatch.setattr(pipeline, "run_release", original)
    assert not (rundir / "manifest.json").exists()
    attrs = zarr.open_group(str(rundir / "release.zarr"), mode="r").attrs
    assert attrs["complete"] is False
    done = np.asarray(zarr.open_group(str(rundir / "release.zarr"), mode="r")["chunks/done"][...])
    assert done.sum() == 3 and done.size == 10
    plan_checksum = read_plan(rundir / "plan.zarr").checksum

    # another spec is refused by the plan's spec hash (no manifest yet); nothing touched
    code, _, err = _run(capsys, other, rundir)
    assert code == 2
    assert_one_line_error(err, "another spec")
    assert not (rundir / "manifest.json").exists()
    assert read_plan(rundir / "plan.zarr").checksum == plan_checksum

    code, out, err = _run(capsys, spec, rundir)
    assert code == 0, err
    assert "resuming" in err
    manifest = _check_outputs(rundir, spec)
    assert manifest["stages"]["release"] == "resumed"
    assert manifest["stages"]["plan"] == "reused" and manifest["stages"]["data"] == "reused"
    assert manifest["plan"]["checksum"] == plan_checksum
    done = np.asarray(zarr.open_group(str(rundir / "release.zarr"), mode="r")["chunks/done"][...])
    assert done.all()


def test_another_spec_into_the_same_rundir_is_refused(capsys, specs, tmp_path):
    spec, other = specs
    rundir = tmp_path / "run"
    code, _, err = _run(capsys, spec, rundir)
    assert code == 0, err
    manifest_bytes = (rundir / "manifest.json").read_bytes()
    plan_checksum = read_plan(rundir / "plan.zarr").checksum
    release_checksum = read_release(rundir / "release.zarr").attrs["checksum"]
    listing = sorted(p.relative_to(rundir) for p in rundir.rglob("*"))

    code, out, err = _run(capsys, other, rundir)
    assert code == 2
    assert_one_line_error(err, "another spec", "use another --out")
    assert (rundir / "manifest.json").read_bytes() == manifest_bytes
    assert read_plan(rundir / "plan.zarr").checksum == plan_checksum
    assert verify_checksum(rundir / "plan.zarr")[0]
    assert read_release(rundir / "release.zarr").attrs["checksum"] == release_checksum
    assert sorted(p.relative_to(rundir) for p in rundir.rglob("*")) == listing


def test_a_foreign_non_empty_rundir_is_refused(capsys, specs, tmp_path):
    """One rule with ``distfit report --out``: a RUNDIR that holds files a run does not write is
    refused (exit 2, one line naming them) and left as it was."""
    spec, _ = specs
    rundir = tmp_path / "mine"
    rundir.mkdir()
    (rundir / "notes.txt").write_text("my notes")
    before = sorted(p.name for p in tmp_path.iterdir())
    code, _, err = _run(capsys, spec, rundir)
    assert code == 2
    assert_one_line_error(err, "not a distfit run directory", "notes.txt")
    assert sorted(p.name for p in rundir.iterdir()) == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no lock or staging left beside it


@pytest.mark.parametrize("content, fragment", [
    ("name: broken\nattributes: []\nqueries: []\n", "attributes"),
    ("name: [unclosed\n", "spec"),
    (None, "missing.yaml"),
])
def test_bad_spec_exits_2(capsys, tmp_path, content, fragment):
    spec = tmp_path / ("missing.yaml" if content is None else "bad.yaml")
    if content is not None:
        spec.write_text(content)
    rundir = tmp_path / "run"
    code, out, err = _run(capsys, spec, rundir)
    assert code == 2
    assert_one_line_error(err, fragment)
    assert not rundir.exists()


@pytest.mark.parametrize("flags, fragment", [
    (("--units", "0"), "--units"),
    (("--workers", "2"), "--serial"),
])
def test_bad_flags_exit_2(capsys, specs, tmp_path, flags, fragment):
    spec, _ = specs
    code, _, err = run(capsys, "run", str(spec), "--out", str(tmp_path / "run"), "--serial", *flags)
    assert code == 2
    assert_one_line_error(err, fragment)


def test_embedded_default_pipeline(capsys, tmp_path):
    assert Path(default_spec_path()).is_file()
    assert load_spec(default_spec_path()).spec_hash == load_spec(
        Path(__file__).parents[2] / "pipelines" / "pl94.yaml").spec_hash
    rundir = tmp_path / "default"
    code, out, err = run(capsys, "run", "--out", str(rundir), "--units", "200", "--serial")
    assert code == 0, err
    manifest = _check_outputs(rundir, default_spec_path())
    assert manifest["spec"]["name"] == "pl94"
    assert manifest["data"]["units"] == 200


def test_multilevel_run_end_to_end(tmp_path, capsys):
    """distfit run on a multi-level spec with a budget: synthetic people with a nested
    geography, one complete run per level (plan passes audit, release sealed), the combined
    account exactly at the budget; the levels' spec.yaml records what they ran; a rerun reuses
    everything; another spec is refused."""
    spec = dict(LEVELS_SPEC, privacy={"alpha": 3.0})
    spec["levels"] = [dict(level) for level in LEVELS_SPEC["levels"]]
    spec["levels"].insert(1, {"name": "state", "units": {"column": "state"}, "queries": [
        {"name": "sex", "attributes": {"sex": "identity"}, "target": 1}]})
    path = tmp_path / "census.yaml"
    path.write_text(yaml.safe_dump(spec))
    rundir = tmp_path / "run"
    # without the levels' reports (tests/estimate/test_levels.py reads them): three reports' figures
    code, out, err = run(capsys, "run", str(path), "--out", str(rundir), "--units", "23", "--serial", "--no-report")
    assert code == 0, err
    assert "privacy        alpha 3 (exact)" in out
    assert "estimate       best linear unbiased estimate (se, moe90): nation done, state done, county done" in out
    # a first run plans every level: nothing is "reused" (the budget's scaled plans are this run's)
    assert "reus" not in err and "reused" not in out, out + err
    assert err.count("scaled to the level's budget share") == 3
    manifest = json.loads((rundir / "manifest.json").read_text())
    assert list(manifest["levels"]) == ["nation", "state", "county"]
    assert manifest["privacy"]["alpha"] == pytest.approx(3.0, rel=1e-9) and manifest["privacy"]["alpha_exact"]
    people = pd.read_parquet(rundir / "people")
    assert people.groupby("county")["state"].nunique().max() == 1  # counties nest in states
    # every synthesised unit is listed in RUNDIR/geography.csv and released, with people or not
    geography = pd.read_csv(rundir / "geography.csv", dtype=str, keep_default_na=False)
    units = {"nation": 1, **geography.groupby("level").size().to_dict()}
    assert units == {"nation": 1, "state": 3, "county": 23}
    counties = geography[geography["level"] == "county"]
    assert set(people["county"]) <= set(counties["unit"])
    assert dict(zip(counties["unit"], counties["parent"])) == {**dict(zip(counties["unit"], counties["parent"])),
                                                               **dict(zip(people["county"], people["state"]))}
    alphas = 0.0
    for name, level in manifest["levels"].items():
        level_dir = rundir / "levels" / name
        assert audit_plan(str(level_dir / "plan.zarr")).ok
        plan = read_plan(level_dir / "plan.zarr")
        assert plan.checksum == level["plan_checksum"]
        alphas += plan.attrs["alpha"]
        # the level's spec.yaml records the spec its run used (with its share of the budget)
        recorded = load_spec(level_dir / "spec.yaml")
        assert recorded.spec_hash == plan.attrs["planner"]["spec_hash"] == _manifest(level_dir)["spec"]["hash"]
        assert _manifest(level_dir)["spec"]["path"] == str((level_dir / "spec.yaml").resolve())
        ok, _, _ = verify_release(level_dir / "release.zarr")
        release = read_release(level_dir / "release.zarr")
        assert ok and release.answers.shape[0] == units[name]
    # the exact combined alpha (max over cells of the summed profiles) is at most the sum bound
    assert alphas >= 3.0 * (1 - 1e-9) and manifest["privacy"]["alpha_sum_bound"] == pytest.approx(alphas)

    # the rerun reuses every level's stores
    code, out, err = run(capsys, "run", str(path), "--out", str(rundir), "--serial", "--no-report")
    assert code == 0 and "plan reused, release reused" in out, out + err
    assert "(se, moe90): nation reused, state reused, county reused" in out
    assert "index.html" not in out
    other = dict(spec, name="other")
    (tmp_path / "other.yaml").write_text(yaml.safe_dump(other))
    code, _, err = run(capsys, "run", str(tmp_path / "other.yaml"), "--out", str(rundir), "--serial")
    assert code == 2 and "holds the run of another spec" in err


def test_microdata_out_of_domain_is_refused_before_planning(capsys, specs, tmp_path):
    """A microdata value outside its attribute's domain is found before any block is solved: exit
    2, one line naming file, line, column and value, and no plan in the run directory. The same
    file with the value fixed then runs, tabulated once (before the plan, with every block's
    marginal)."""
    spec, _ = specs
    people = pd.DataFrame({"age": ["0", "5", "3", "2"], "sex": ["f", "m", "m", "f"], "edu": ["0", "1", "2", "1"]})
    bad = people.copy()
    bad.loc[2, "sex"] = "x"
    bad_csv = tmp_path / "bad.csv"
    bad.to_csv(bad_csv, index=False)
    rundir = tmp_path / "run"
    code, _, err = run(capsys, "run", str(spec), "--out", str(rundir), "--data", str(bad_csv), "--serial")
    assert code == 2
    assert_one_line_error(err, "bad.csv", "line 4", "'sex'", "'x'")
    assert not (rundir / "plan.zarr").exists()
    good_csv = tmp_path / "good.csv"
    people.to_csv(good_csv, index=False)
    rundir = tmp_path / "good"
    code, out, err = run(capsys, "run", str(spec), "--out", str(rundir), "--data", str(good_csv), "--serial",
                         "--no-report")
    assert code == 0, err
    assert _manifest(rundir)["stages"]["data"] == "tabulated"
    assert "reusing the data tabulated" not in err
    assert read_release(rundir / "release.zarr").answers.shape[0] == 1


def test_a_mask_section_masks_the_microdata_after_the_release(capsys, tmp_path):
    """A spec's ``mask`` section: refused without a CSV before anything is written; with one, the
    run writes RUNDIR/mask.zarr (one column: setting B's sigma), audits it, records it in the
    manifest, and a rerun reuses it."""
    spec_path = tmp_path / "spec.yaml"
    mask = {"columns": ["income"], "bounds": {"income": [0, 100]}, "epsilon": 1, "delta": 1e-6, "block_rows": 20}
    spec_path.write_text(yaml.safe_dump(dict(SPEC, mask=mask)))
    rundir = tmp_path / "run"
    code, _, err = run(capsys, "run", str(spec_path), "--out", str(rundir), "--units", "20", "--serial")
    assert code == 2 and not rundir.exists()
    assert_one_line_error(err, "mask:", "give --data a .csv or .csv.gz file (no --data)")
    rng = np.random.default_rng(4)
    people = pd.DataFrame({"age": rng.integers(0, 6, 45), "sex": rng.choice(["f", "m"], 45),
                           "edu": rng.integers(0, 3, 45), "income": rng.uniform(0, 120, 45).round(2)})
    csv = tmp_path / "people.csv"
    people.to_csv(csv, index=False)
    options = {"data": csv, "placement": Placement(serial=True), "log": io.StringIO(), "estimate": False,
               "report": False}
    result = pipeline.run_pipeline(spec_path, rundir, **options)
    manifest = _manifest(rundir)
    assert result.stages["mask"] == "done" and manifest["mask"]["path"] == str((rundir / "mask.zarr").resolve())
    account = manifest["mask"]["account"]
    assert account["block_rows"] == [15] and account["sigma"] == account["sigma_masked"] < account["sigma_gaussian"]
    assert manifest["mask"]["private"] is True and manifest["release"]["checksum"] == result.release_checksum
    # the rerun through the command line: its summary's mask row names the store, reused and audited
    # (without the report, which this test is not about and which costs seconds)
    code, out, err = run(capsys, "run", str(spec_path), "--out", str(rundir), "--data", str(csv), "--serial",
                         "--no-estimate", "--no-report")
    assert code == 0, err
    again = _manifest(rundir)
    assert again["stages"]["mask"] == "reused" and again["mask"]["checksum"] == manifest["mask"]["checksum"]
    row = next(line for line in out.splitlines() if line.split()[:1] == ["mask"])
    assert row.split() == ["mask", again["mask"]["path"], "(reused,", "audit", "passed,", "sigma",
                           f"{account['sigma']:.6g})"]
    moved = dict(mask, bounds={"income": [0, 200]})
    spec_path.write_text(yaml.safe_dump(dict(SPEC, mask=moved)))
    with pytest.raises(ValueError, match="holds the run of another spec"):  # the mask section is in the spec hash
        pipeline.run_pipeline(spec_path, rundir, **options)


def test_multilevel_run_on_microdata_publishes_every_unit_of_the_geography(tmp_path, capsys):
    """With --geography, every listed unit is released and estimated: a county nobody lives in
    (c2) and a state without counties (s3) included; the integer tables still add up. A unit
    with people that the file does not list is refused in one line before any level is released, and
    --geography on a spec without levels is a usage error."""
    spec = {"name": "geo", "attributes": [{"name": "sex", "values": ["f", "m"]}], "levels": [
        {"name": "nation", "queries": [{"name": "sex", "attributes": {"sex": "identity"}, "target": 1}]},
        {"name": "state", "units": {"column": "state"},
         "queries": [{"name": "sex", "attributes": {"sex": "identity"}, "target": 1}]},
        {"name": "county", "units": {"column": "county"},
         "queries": [{"name": "sex", "attributes": {"sex": "identity"}, "target": 1}]}]}
    (tmp_path / "geo.yaml").write_text(yaml.safe_dump(spec))
    geography = tmp_path / "geography.csv"
    geography.write_text("level,unit,parent\nstate,s1,\nstate,s2,\nstate,s3,\ncounty,c1,s1\ncounty,c2,s1\ncounty,c3,s2\n")
    people = tmp_path / "people.csv"
    pd.DataFrame([("s1", "c1", "f"), ("s1", "c1", "m"), ("s2", "c3", "m")] * 5,
                 columns=["state", "county", "sex"]).to_csv(people, index=False)
    rundir = tmp_path / "run"
    code, _, err = run(capsys, "run", str(tmp_path / "geo.yaml"), "--out", str(rundir), "--data", str(people),
                       "--geography", str(geography), "--serial", "--integer", "--no-report")  # reports: tests/estimate/test_levels
    assert code == 0, err
    cells = {}
    for name, ids in (("nation", [0]), ("state", ["s1", "s2", "s3"]), ("county", ["c1", "c2", "c3"])):
        release = read_release(rundir / "levels" / name / "release.zarr")
        assert list(release.unit_ids[...]) == ids
        cells[name] = np.asarray(read_estimate(rundir / "levels" / name / "estimate.zarr").cells[...])
    assert cells["county"].shape == (3, 2) and cells["county"].min() >= 0  # c2, where nobody lives, published
    assert np.array_equal(cells["state"][0], cells["county"][0] + cells["county"][1])  # s1 = c1 + c2
    assert np.array_equal(cells["state"][1], cells["county"][2])                       # s2 = c3
    assert np.array_equal(cells["nation"][0], cells["state"].sum(axis=0))
    manifest = json.loads((rundir / "manifest.json").read_text())
    assert manifest["geography"]["units"] == {"state": 3, "county": 3}

    geography.write_text("level,unit,parent\nstate,s1,\nstate,s2,\ncounty,c1,s1\n")
    code, _, err = run(capsys, "run", str(tmp_path / "geo.yaml"), "--out", str(tmp_path / "other"), "--data",
                       str(people), "--geography", str(geography), "--serial")
    assert code == 2 and "Traceback" not in err
    assert_one_line_error(err.strip().splitlines()[-1],  # after the notes of the levels before it, if any
                          "unit 'c3' of column 'county' has people but is not a unit of level 'county'")
    assert not list((tmp_path / "other").rglob("release.zarr"))  # every level's units checked before any release
    code, _, err = run(capsys, "run", "--out", str(tmp_path / "single"), "--geography", str(geography), "--serial")
    assert code == 2 and "--geography" in err
