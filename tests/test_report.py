"""Tests for ``distfit report`` (distfit.report): plots, self-contained HTML, refusals."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.clitools import assert_one_line_error, run
from distfit.stores.data import write_synthetic
from distfit.release.job import run_release
from distfit.report import MARKER
from distfit.stores.plan import read_plan

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, small_plan):
    root = tmp_path_factory.mktemp("report-inputs")
    data = root / "data.zarr"
    write_synthetic(small_plan.spec, 30, data, seed=1, chunk_units=10)
    release = root / "release.zarr"
    run_release(small_plan.plan, str(data), str(release), seed=5, serial=True, fsync=False)
    return {"plan": small_plan.plan, "release": str(release), "root": root, "data": str(data), "spec": small_plan.spec}


def _check_report(out: Path) -> str:
    page = (out / "index.html").read_text(encoding="utf-8")
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs
    linked = set(re.findall(r'src="([^"]+)"', page))
    assert linked == set(pngs)  # every PNG is referenced and every reference exists
    for name in pngs:
        data = (out / name).read_bytes()
        assert data[:8] == PNG_MAGIC and len(data) > 2000, name
    # self-contained: no scripts, no external URLs
    assert "<script" not in page.lower() and "http://" not in page and "https://" not in page
    assert (out / MARKER).is_file()
    return page


def test_report_with_release(inputs, tmp_path, capsys):
    out = tmp_path / "report"
    code, stdout, err = run(capsys, "report", inputs["plan"], inputs["release"], "--out", str(out))
    assert code == 0, err
    page = _check_report(out)
    pngs = {p.name for p in out.glob("*.png")}
    assert {"privacy_curve.png", "block_alpha.png", "variance_ratio.png", "answers_0.png"} <= pngs
    plan = read_plan(inputs["plan"])
    assert f"{plan.attrs['alpha']:.6g}" in page
    assert "Privacy account" in page and "(epsilon, delta)" in page
    for row in plan.attrs["account"]["epsilon_delta"]:
        assert f"<td class=\"\">{row['delta']:.6g}</td>" in page
        assert f"{row['epsilon']:.6g}" in page
    for decision in plan.attrs["planner"]["decisions"]:
        assert decision.split(":")[0] in page
    assert "certificate gap" in page and "NOT PRIVATE" in page
    # small domain (36 cells): the baselines are computed and shown
    assert "matrix_mechanism" in page and "gaussian" in page
    assert "baselines" in stdout
    # nothing but the report is left next to it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]


def test_report_without_release_and_overwrite(inputs, tmp_path, capsys):
    out = tmp_path / "report"
    code, _, err = run(capsys, "report", inputs["plan"], "--out", str(out))
    assert code == 0, err
    page = _check_report(out)
    assert not list(out.glob("answers_*.png")) and "Release: noisy answers" not in page
    # a previous report (marker file) is replaced; an empty directory is accepted
    code, _, err = run(capsys, "report", inputs["plan"], inputs["release"], "--out", str(out))
    assert code == 0, err
    assert list(out.glob("answers_*.png"))
    empty = tmp_path / "empty"
    empty.mkdir()
    code, _, err = run(capsys, "report", inputs["plan"], "--out", str(empty))
    assert code == 0, err
    _check_report(empty)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "report"]


def test_report_bad_inputs(inputs, tmp_path, capsys):
    code, _, err = run(capsys, "report", str(tmp_path / "missing.zarr"), "--out", str(tmp_path / "r"))
    assert code == 2
    assert_one_line_error(err, "no such plan store")
    notplan = tmp_path / "notplan"
    notplan.mkdir()
    (notplan / "x.txt").write_text("x")
    code, _, err = run(capsys, "report", str(notplan), "--out", str(tmp_path / "r"))
    assert code == 2
    assert_one_line_error(err, "not a Zarr v3 group")
    # a plan given where the release belongs
    code, _, err = run(capsys, "report", inputs["plan"], inputs["plan"], "--out", str(tmp_path / "r"))
    assert code == 2
    assert_one_line_error(err, "not 'release'")
    assert not (tmp_path / "r").exists()


def test_report_refuses_foreign_directory(inputs, tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    code, _, err = run(capsys, "report", inputs["plan"], "--out", str(out))
    assert code == 2
    assert_one_line_error(err, "not a distfit report")
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"]
    afile = tmp_path / "file.html"
    afile.write_text("x")
    code, _, err = run(capsys, "report", inputs["plan"], "--out", str(afile))
    assert code == 2
    assert_one_line_error(err, "not a directory")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file.html", "mine"]


def test_true_answers_are_the_workload_times_the_counts(inputs):
    """The calibration's truth (block marginals through B and L, summed per query) equals the
    dense workload matrix times the full-domain counts: an independent path."""
    import numpy as np

    from distfit.stores.data import open_data
    from distfit.release.noise import query_answers, true_block_answers

    plan = read_plan(inputs["plan"])
    data = open_data(inputs["data"])
    rows = [(plan.block(b).query_index, true_block_answers(plan.block(b), data.block_counts(plan.block(b).attributes, 0, 30)))
            for b in plan.block_ids]
    workload = inputs["spec"].workload()
    counts = np.asarray(data.counts[:30], dtype=float)
    np.testing.assert_allclose(query_answers(rows, workload.matrix.shape[0]), counts @ workload.matrix.T,
                               rtol=1e-9, atol=1e-8)


def test_calibration_section(inputs, tmp_path, capsys):
    """30 units x 30 queries of a seeded release: the standardised errors are N(0, 1), so about
    95% lie within 1.96 sd (the binomial sd of the share over 900 answers is 0.7%; the noise is
    correlated within a unit, so the bounds are wide)."""
    out = tmp_path / "report"
    code, stdout, err = run(capsys, "report", inputs["plan"], inputs["release"], "--out", str(out),
                            "--data", inputs["data"])
    assert code == 0, err
    page = _check_report(out)
    assert (out / "calibration.png").is_file() and "CONFIDENTIAL" in page
    share = float(re.search(r"calibration +([0-9.]+)% of (\d+) answers", stdout).group(1)) / 100
    assert 0.90 <= share <= 0.99, stdout
    code, _, err = run(capsys, "report", inputs["plan"], "--out", str(tmp_path / "r2"), "--data", inputs["data"])
    assert code == 2 and "give the release too" in err


def test_the_planner_bounds_are_named_for_what_they_bound(inputs, tmp_path, capsys):
    """Issue 12: the planner's bound holds for plans with the chosen blocks only, and the page
    says so; the global bound is stated beside it ("not known" for this two-block plan)."""
    out = tmp_path / "report"
    code, _, err = run(capsys, "report", inputs["plan"], "--out", str(out))
    assert code == 0, err
    page = (out / "index.html").read_text(encoding="utf-8")
    bound = read_plan(inputs["plan"]).attrs["planner"]["chosen_blocks_lower_bound"]
    assert "plans with the chosen blocks only" in page and f"{bound['value']:.6g}" in page
    assert bound["method"] in page and "block-diagonal plan with the chosen blocks" in page
    assert "global: every plan of this form" in page and "not known: the plan has 2 blocks" in page
    assert "allocation_lower_bound" not in page
