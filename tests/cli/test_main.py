"""Tests for the ``distfit`` command line's entry point (distfit.cli.main): --version, usage
errors, ``python -m distfit.cli``."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import distfit
from tests.clitools import assert_one_line_error, run

PREFIX16_ALPHA = 2.9053  # DESIGN.md section 1 reference value


def test_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.strip() == f"distfit {distfit.__version__}"


def test_usage_errors_are_one_line(capsys):
    for argv in (["solve"], ["solve", "prefix:8", "--bogus"], ["solve", "prefix:8", "--basis", "nope"], []):
        code, _, err = run(capsys, *argv)
        assert code == 2, argv
        assert_one_line_error(err)


def test_module_entry_point_subprocess(tmp_path):
    out_json = tmp_path / "plan.json"
    env = dict(os.environ)
    root = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    ok = subprocess.run([sys.executable, "-m", "distfit.cli", "solve", "prefix:16", "--json", str(out_json)],
                        capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(out_json.read_text())["alpha"] == pytest.approx(PREFIX16_ALPHA, rel=2e-3)
    assert "alpha" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "distfit.cli", "solve", "census2030"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2
    assert_one_line_error(bad.stderr, "unknown workload")
