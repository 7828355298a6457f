"""Tests for ``distfit solve`` (distfit.cli.solve, distfit.cli.workloads, distfit.cli.outputs):
its report, budgets, baselines, workloads and its errors."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import distfit
from distfit.cli import solve as solve_command
from tests.clitools import assert_one_line_error, run

PREFIX16_ALPHA = 2.9053  # docs/design.md section 1 reference value


def test_solve_prefix16_json_and_save(tmp_path, capsys):
    out_json, out_npz = tmp_path / "plan.json", tmp_path / "plan.npz"
    code, out, err = run(capsys, "solve", "prefix:16", "--json", str(out_json), "--save", str(out_npz))
    assert code == 0, err
    report = json.loads(out_json.read_text())
    assert report["alpha"] == pytest.approx(PREFIX16_ALPHA, rel=2e-3)
    assert report["rho"] == pytest.approx(report["alpha"] / 2)
    assert report["workload"] == {"name": "prefix:16", "source": "builtin", "queries": 16, "cells": 16, "rank": 16}
    assert report["lower_bound"] <= report["alpha"]
    assert 0 <= report["gap"] <= 1e-3
    assert report["max_variance_ratio"] <= 1.0 + 1e-9
    assert report["budget"] is None and report["baselines"] is None
    deltas = [row["delta"] for row in report["privacy_account"]["epsilon_delta"]]
    assert deltas == list(distfit.mathematics.privacy.DEFAULT_DELTAS)
    assert report["privacy_account"]["epsilon_delta"][0]["epsilon"] == pytest.approx(
        distfit.mathematics.privacy.epsilon_for_delta(report["alpha"], 1e-5))
    assert set(report["solver"]) == {"dual_evaluations", "newton_iterations", "cg_iterations", "final_t",
                                     "seconds", "stage"}
    # the text summary says the same things
    assert "16 queries x 16 cells, rank 16" in out
    assert f"alpha = {report['alpha']:.6g}" in out
    assert "lower bound" in out and "gap" in out and "epsilon" in out
    # --save: the plan's arrays, consistent with each other
    with np.load(out_npz) as saved:
        assert set(saved.files) == {"sigma", "basis", "recon", "targets", "profile", "variances"}
        recon, sigma = saved["recon"], saved["sigma"]
        np.testing.assert_allclose(np.einsum("ij,ij->i", recon @ sigma, recon), saved["variances"], rtol=1e-10)
        np.testing.assert_allclose(recon @ saved["basis"], np.tri(16), atol=1e-9)
        assert saved["profile"].max() == pytest.approx(report["alpha"], rel=1e-12)
    # nothing else (no temporary file) is left in the directory
    assert sorted(p.name for p in tmp_path.iterdir()) == ["plan.json", "plan.npz"]


@pytest.mark.parametrize("flags, expected_alpha", [
    (("--rho", "0.5"), 1.0),
    (("--alpha", "0.25"), 0.25),
    (("--epsilon", "1", "--delta", "1e-6"), None),
])
def test_solve_with_budget(tmp_path, capsys, flags, expected_alpha):
    out_json = tmp_path / "plan.json"
    code, out, err = run(capsys, "solve", "prefix:8", *flags, "--json", str(out_json))
    assert code == 0, err
    report = json.loads(out_json.read_text())
    if expected_alpha is None:  # (epsilon, delta): the account reproduces the budget's epsilon
        expected_alpha = distfit.mathematics.privacy.alpha_for_budget(1.0, 1e-6)
        eps = {row["delta"]: row["epsilon"] for row in report["privacy_account"]["epsilon_delta"]}
        assert eps[1e-6] == pytest.approx(1.0, rel=1e-9)
    assert report["alpha"] == pytest.approx(expected_alpha, rel=1e-9)
    assert report["rho"] == pytest.approx(report["alpha"] / 2, rel=1e-12)
    # variances are scaled by k = accuracy-first alpha / budget alpha
    k = report["alpha_accuracy_first"] / report["alpha"]
    assert report["variance_scale"] == pytest.approx(k, rel=1e-9)
    assert report["max_variance_ratio"] == pytest.approx(k, rel=1e-9)
    assert "budget" in out


def test_solve_baselines(tmp_path, capsys):
    out_json = tmp_path / "plan.json"
    code, out, err = run(capsys, "solve", "prefix:16", "--baselines", "--json", str(out_json))
    assert code == 0, err
    report = json.loads(out_json.read_text())
    assert set(report["baselines"]) == {"gaussian", "hierarchical", "matrix_mechanism"}
    for name, result in report["baselines"].items():
        assert result["alpha"] == pytest.approx(report["alpha"])
        # SM-II is optimal at this alpha: no strategy mechanism meets every target
        assert result["max_variance_ratio"] >= report["max_variance_ratio"] * (1 - 1e-6), name
        assert name in out


def test_solve_npz_workload_and_basis(tmp_path, capsys):
    path = tmp_path / "w.npz"
    np.savez(path, W=np.array([[1.0, 1.0], [1.0, 0.0]]), targets=np.array([2.0, 2.0]))
    out_json = tmp_path / "plan.json"
    code, _, err = run(capsys, "solve", str(path), "--basis", "identity", "--json", str(out_json))
    assert code == 0, err
    report = json.loads(out_json.read_text())
    assert report["workload"]["source"] == "npz"
    assert report["basis"]["kind"] == "identity"
    assert report["alpha"] == pytest.approx(4 / (3 * 2.0), rel=2e-3)  # docs/design.md: 4 / (3 g)


def _write_npz(path: Path, **arrays) -> Path:
    np.savez(path, **arrays)
    return path


@pytest.mark.parametrize("case", [
    "unknown-workload", "negative-targets", "rho-and-alpha", "epsilon-without-delta",
    "missing-array", "not-an-npz", "bad-prefix", "no-such-file",
])
def test_bad_input_exits_2_without_output(tmp_path, capsys, case):
    out_json, out_npz = tmp_path / "out.json", tmp_path / "out.npz"
    workload, flags, fragments = "prefix:8", [], []
    if case == "unknown-workload":
        workload, fragments = "census2030", ["unknown workload", "census2030"]
    elif case == "negative-targets":
        workload = str(_write_npz(tmp_path / "neg.npz", W=np.eye(3), targets=np.array([1.0, -1.0, 1.0])))
        fragments = ["targets", "> 0"]
    elif case == "rho-and-alpha":
        flags, fragments = ["--rho", "1", "--alpha", "2"], ["--rho", "--alpha", "conflicting"]
    elif case == "epsilon-without-delta":
        flags, fragments = ["--epsilon", "1"], ["--epsilon", "--delta"]
    elif case == "missing-array":
        workload = str(_write_npz(tmp_path / "w.npz", W=np.eye(3)))
        fragments = ["missing array targets"]
    elif case == "not-an-npz":
        bad = tmp_path / "bad.npz"
        bad.write_text("W,targets\n1,1\n")
        workload, fragments = str(bad), ["not a .npz archive"]
    elif case == "bad-prefix":
        workload, fragments = "prefix:x", ["prefix:x", "integer"]
    elif case == "no-such-file":
        workload, fragments = str(tmp_path / "absent.npz"), ["no such file"]
    before = sorted(p.name for p in tmp_path.iterdir())
    code, out, err = run(capsys, "solve", workload, *flags, "--json", str(out_json), "--save", str(out_npz))
    assert code == 2
    assert out == ""
    assert_one_line_error(err, *fragments)
    assert not out_json.exists() and not out_npz.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def test_too_large_block_is_refused(capsys):
    code, _, err = run(capsys, "solve", "prefix:2000000")
    assert code == 2
    assert_one_line_error(err, "GiB", "blocks")


def test_convergence_error_exits_1(tmp_path, capsys, monkeypatch):
    def failing_solve(*args, **kwargs):
        raise distfit.ConvergenceError("solve did not converge: gap 5% > max_gap 0.1%")

    monkeypatch.setattr(solve_command, "solve", failing_solve)
    out_json = tmp_path / "out.json"
    code, _, err = run(capsys, "solve", "prefix:8", "--json", str(out_json))
    assert code == 1
    assert_one_line_error(err, "did not converge")
    assert not out_json.exists()


def test_failed_write_leaves_no_file(tmp_path, capsys, monkeypatch):
    def failing_savez(handle, **arrays):
        handle.write(b"partial")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(solve_command.np, "savez", failing_savez)
    out_json, out_npz = tmp_path / "out.json", tmp_path / "out.npz"
    code, _, err = run(capsys, "solve", "prefix:8", "--json", str(out_json), "--save", str(out_npz))
    assert code == 1
    assert_one_line_error(err, "--save", "No space left")
    # neither the npz nor the JSON staged before it, nor any temporary file
    assert list(tmp_path.iterdir()) == []
