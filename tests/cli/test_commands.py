"""Tests for the pipeline commands' error mapping (distfit.cli.commands, distfit.cli.main); the
commands themselves are tested with their library stages (tests/test_pipeline.py, tests/plan, ...)."""
from __future__ import annotations

from distfit.cli import commands
from distfit.pipeline import RunFailure
from tests.clitools import assert_one_line_error, run


def test_run_failure_exits_1(tmp_path, capsys, monkeypatch):
    def failing_run(*args, **kwargs):
        raise RunFailure("plan.zarr: the plan fails audit (1 failures): alpha\nmismatch")

    monkeypatch.setattr(commands, "run_pipeline", failing_run)
    code, out, err = run(capsys, "run", "--out", str(tmp_path / "run"), "--serial")
    assert code == 1
    assert out == ""
    assert_one_line_error(err, "fails audit", "alpha mismatch")
