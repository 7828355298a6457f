"""Tests for the ``distfit`` command line's entry point (distfit.cli.main): --version, usage
errors, ``python -m distfit.cli``."""
from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import distfit
from distfit.cli import main as cli
from tests.clitools import assert_one_line_error, run

PREFIX16_ALPHA = 2.9053  # docs/design.md section 1 reference value


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


#: what planning and auditing never need (distfit.cli.main's docstring: the dispatch table)
HEAVY = ("dask.dataframe", "pandas", "pyarrow", "matplotlib", "numba", "jax", "distfit.pipeline.run",
         "distfit.cli.commands")


def test_plan_and_audit_import_none_of_the_other_commands_dependencies(small_plan, tmp_path):
    """``distfit plan --help``, a (serial) ``distfit plan`` and ``distfit audit`` run in a fresh
    interpreter without importing dask.dataframe, pandas, pyarrow, matplotlib, numba, jax or the
    pipeline; ``distfit run`` then imports its module."""
    script = f"""
import contextlib, io, json, sys
from distfit.cli.main import main
heavy = {HEAVY!r}
seen = {{}}
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    seen["help"] = (main(["plan", "--help"]), [m for m in heavy if m in sys.modules])
    seen["plan"] = (main(["plan", {str(small_plan.spec_path)!r}, "--out", {str(tmp_path / "p.zarr")!r}, "--serial"]),
                    [m for m in heavy if m in sys.modules])
    seen["audit"] = (main(["audit", {str(tmp_path / "p.zarr")!r}]), [m for m in heavy if m in sys.modules])
    seen["run"] = (main(["run", "--out", {str(tmp_path / "p.zarr")!r}, "--units", "0"]),
                   [m for m in heavy if m in sys.modules])
print(json.dumps(seen))
"""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["help"] == [0, []]
    assert seen["plan"] == [0, []]
    assert seen["audit"] == [0, []]
    code, imported = seen["run"]
    assert code == 2 and "distfit.pipeline.run" in imported  # --units 0 is refused after the import


def test_every_command_has_its_handler():
    """Each subcommand of the parser names a handler in ``HANDLERS`` that resolves to a function."""
    parser = cli.build_parser()
    commands = next(action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    assert set(commands.choices) == set(cli.HANDLERS)
    for command in cli.HANDLERS:
        handler = cli.command_handler(command)
        assert callable(handler) and handler.__name__ == f"cmd_{command}"


def _fail_third_chunk(error):
    """A ``write_chunk`` that writes two chunks, then fails the way a full disk or a denied
    directory does."""
    from distfit.release import tasks as release_job  # where a chunk task calls write_chunk

    original = release_job.write_chunk
    calls = []

    def write_chunk(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 3:
            raise error
        return original(*args, **kwargs)

    return release_job, write_chunk, calls


@pytest.mark.parametrize("error", [
    OSError(errno.ENOSPC, "No space left on device", "answers/c/2/0"),
    PermissionError(errno.EACCES, "Permission denied", "answers/c/2/0"),
], ids=["disk-full", "no-permission"])
def test_os_errors_end_in_one_line_and_the_release_resumes(small_plan, tmp_path, capsys, monkeypatch, error):
    """Disk full or no permission in the middle of a release: one line naming the file and the
    problem, exit 1, no traceback; the chunks written are kept and --resume finishes the release."""
    from distfit.stores.data import write_synthetic
    from distfit.stores.release import read_release, verify_release

    data = tmp_path / "data.zarr"
    write_synthetic(small_plan.spec, 30, data, seed=1, chunk_units=5)
    out = tmp_path / "r.zarr"
    release_job, failing, calls = _fail_third_chunk(error)
    monkeypatch.setattr(release_job, "write_chunk", failing)
    code, out_text, err = run(capsys, "release", small_plan.plan, "--data", str(data), "--out", str(out),
                              "--serial", "--seed", "9")
    assert len(calls) == 3, "the failure was never injected"
    assert code == 1
    # one error line after the progress meter's, and no traceback
    assert "Traceback" not in err and err.strip().splitlines()[-1] == f"distfit: error: answers/c/2/0: {error.strerror}"
    assert all(line.startswith("release: ") for line in err.strip().splitlines()[:-1]), err
    monkeypatch.undo()
    code, _, err = run(capsys, "release", small_plan.plan, "--data", str(data), "--out", str(out),
                       "--serial", "--seed", "9", "--resume")
    assert code == 0, err
    assert verify_release(out)[0] and read_release(out).attrs["complete"] is True
