"""Tests for the pipeline commands' error mapping (distfit.cli.commands, distfit.cli.main); the
commands themselves are tested with their library stages (tests/pipeline/test_run.py, tests/plan, ...)."""
from __future__ import annotations

import shutil

import pytest
import zarr

from distfit.cli import commands, estimating
from distfit.release.job import run_release
from distfit.stores.data import write_synthetic
from distfit.stores.plan import read_plan
from distfit.pipeline.run import RunFailure
from distfit.runtime.placement import Placement
from tests.clitools import assert_one_line_error, run


def test_run_failure_exits_1(tmp_path, capsys, monkeypatch):
    def failing_run(*args, **kwargs):
        raise RunFailure("plan.zarr: the plan fails audit (1 failures): alpha\nmismatch")

    monkeypatch.setattr(commands, "run_pipeline", failing_run)
    code, out, err = run(capsys, "run", "--out", str(tmp_path / "run"), "--serial")
    assert code == 1
    assert out == ""
    assert_one_line_error(err, "fails audit", "alpha mismatch")


def test_release_refuses_a_tampered_plan_before_starting_a_cluster(small_plan, tmp_path, capsys):
    """A plan whose arrays no longer match its checksum is refused by the audit before any
    cluster starts (no "local cluster" line), exit 2, nothing written at --out."""
    plan = tmp_path / "plan.zarr"
    shutil.copytree(small_plan.plan, plan)
    block = read_plan(plan).block_ids[0]
    sigma = zarr.open_array(str(plan / f"blocks/{block}/sigma"), mode="r+")
    sigma[0, 0] = sigma[0, 0] * 0.5
    data = tmp_path / "data.zarr"
    write_synthetic(small_plan.spec, 20, data, seed=1, chunk_units=5)
    code, _, err = run(capsys, "release", str(plan), "--data", str(data), "--out", str(tmp_path / "r.zarr"),
                       "--workers", "1")
    assert code == 2
    assert_one_line_error(err, "fails audit", "checksum")
    assert not (tmp_path / "r.zarr").exists()


def test_seeded_resume_says_where_its_noise_comes_from(small_plan, tmp_path, capsys):
    """A resumed test-seed release draws its missing chunks from the seed, and says so (not
    "fresh entropy")."""
    data = tmp_path / "data.zarr"
    write_synthetic(small_plan.spec, 20, data, seed=1, chunk_units=5)
    out = tmp_path / "r.zarr"

    def stop_after_two(chunk):
        if chunk == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_release(small_plan.plan, data, out, seed=4, placement=Placement(serial=True), after_chunk=stop_after_two,
                    fsync=False)
    code, _, err = run(capsys, "release", small_plan.plan, "--data", str(data), "--out", str(out), "--serial",
                       "--seed", "4", "--resume")
    assert code == 0, err
    assert "to draw from the test seed" in err and "fresh entropy" not in err


@pytest.mark.parametrize("flags, fragment", [
    (["--serial", "--workers", "2"], "--serial excludes"),
    (["--workers", "0"], "--workers must be >= 1"),
    (["--resume", "--overwrite"], "exclude each other"),
])
def test_estimate_flag_errors_exit_2_before_any_work(tmp_path, capsys, flags, fragment):
    out = tmp_path / "e.zarr"
    code, _, err = run(capsys, "estimate", str(tmp_path / "plan.zarr"), str(tmp_path / "release.zarr"),
                       "--out", str(out), *flags)
    assert code == 2
    assert_one_line_error(err, fragment)
    assert not out.exists()


def test_estimate_of_a_missing_release_or_ctrl_c(small_plan, tmp_path, capsys, monkeypatch):
    """A missing release is one line, exit 2; Ctrl-C says what was kept and how to resume (130)."""
    code, _, err = run(capsys, "estimate", small_plan.plan, str(tmp_path / "none.zarr"), "--out",
                       str(tmp_path / "e.zarr"), "--serial")
    assert code == 2
    assert_one_line_error(err, "no such release store")

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(estimating, "run_estimate", interrupted)
    code, _, err = run(capsys, "estimate", small_plan.plan, str(tmp_path / "r.zarr"), "--out",
                       str(tmp_path / "e.zarr"), "--serial")
    assert code == 130
    assert_one_line_error(err, "interrupted; nothing was written")  # no store at --out: nothing kept
    (tmp_path / "e.zarr").mkdir()  # an estimate begun: its chunks are kept
    code, _, err = run(capsys, "estimate", small_plan.plan, str(tmp_path / "r.zarr"), "--out",
                       str(tmp_path / "e.zarr"), "--serial")
    assert code == 130
    assert_one_line_error(err, "interrupted; the chunks estimated so far are kept in", "--resume")
