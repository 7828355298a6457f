"""Tests for the ``distfit`` command line's entry point (distfit.cli.main, distfit.cli.__main__):
--version, usage errors, ``python -m distfit.cli``, flags and spec ranges refused before any work,
Ctrl-C at any moment."""
from __future__ import annotations

import argparse
import errno
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import distfit
from distfit.cli import main as cli
from distfit.pipeline.run import RUN_NAMES
from distfit.stores.plan import read_plan
from tests.clitools import assert_one_line_error, interruptible, run

PREFIX16_ALPHA = 2.9053  # docs/design.md section 1 reference value


def test_version(capsys):
    code, out, _ = run(capsys, "--version")
    assert code == 0
    assert out.strip() == f"distfit {distfit.__version__}"


def test_every_argument_of_every_command_has_help_text():
    """Issue 30, point 6: ``distfit COMMAND --help`` explains every argument (positional and
    option) of every command."""
    parser = cli.build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    assert {"plan", "release", "estimate", "report", "run", "export", "mask"} <= set(commands.choices)
    bare = [(name, action.option_strings or action.dest) for name, sub in commands.choices.items()
            for action in sub._actions if not isinstance(action, argparse._HelpAction) and not (action.help or "").strip()]
    assert bare == []


def test_help_of_distfit_and_of_every_command_prints(capsys):
    """``distfit --help`` and ``distfit COMMAND --help`` print and exit 0 (a help text with a
    bare ``%`` once broke the top-level help: argparse formats help texts with ``%``)."""
    parser = cli.build_parser()
    (commands,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    for argv in (["--help"], *([name, "--help"] for name in commands.choices)):
        code, out, err = run(capsys, *argv)
        assert code == 0 and out.startswith("usage: distfit") and err == "", (argv, err)


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


#: Packages a command imports only when it does what needs them (issue 31, point 1): numbers,
#: a cluster, a store.
NUMERIC = ("numpy", "scipy")
CLUSTER = ("dask", "distributed")
STORES = ("zarr",)


def imported_packages(argv: list[str]) -> tuple[int, set[str]]:
    """Exit code and the top-level packages ``python -X importtime -m distfit.cli ARGV``
    imported (its import-time records on stderr name every module, as it is imported)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "distfit.cli", *argv],
                          capture_output=True, text=True, env=env, timeout=300)
    records = re.findall(r"^import time:\s*\d+ \|\s*\d+ \|\s*(\S+)", done.stderr, flags=re.MULTILINE)
    return done.returncode, {name.split(".")[0] for name in records}


@pytest.mark.parametrize("argv, never", [
    (["--version"], NUMERIC + CLUSTER + STORES),
    (["--help"], NUMERIC + CLUSTER + STORES),
    (["plan", "--help"], NUMERIC + CLUSTER + STORES),
    (["solve", "prefix:8"], CLUSTER + STORES),
    (["audit", "PLAN"], CLUSTER),
    (["plan", "SPEC", "--out", "OUT", "--serial"], CLUSTER),
    (["release", "PLAN", "--data", "DATA", "--out", "OUT", "--seed", "7", "--serial"], CLUSTER),
], ids=["version", "help", "plan-help", "solve", "audit", "plan-serial", "release-serial"])
def test_a_command_imports_only_what_it_uses(small_plan, small_data, tmp_path, argv, never):
    """``--help`` and ``--version`` answer without numpy, scipy, Dask or zarr (start-up well under
    a second; ``benchmarks/bench_startup.py`` times it); ``solve`` opens no store and starts no
    cluster; ``audit`` reads a store and starts no cluster; a serial ``plan`` and ``release``
    write their store without importing Dask (the jobs reach it only through the runtime's
    boundary, ``distfit.runtime.placement``). Checked on the module list ``python -X
    importtime`` prints, not by timing."""
    out = tmp_path / "out.zarr"
    paths = {"PLAN": small_plan.plan, "SPEC": str(small_plan.spec_path), "DATA": small_data, "OUT": str(out)}
    code, packages = imported_packages([paths.get(word, word) for word in argv])
    assert code == 0
    assert "distfit" in packages  # the records were read
    assert sorted(packages & set(never)) == []
    assert ("OUT" in argv) == out.is_dir()  # the store was written


def test_estimate_imports_neither_the_microdata_readers_nor_the_graphical_extra(small_plan, tmp_path):
    """``distfit estimate`` (of a missing release: refused once its handler is imported) imports
    the estimate stage but not pandas or pyarrow (dask.dataframe starts pyarrow's memory pool,
    which reserves 1 GiB of address space: ``distfit.cli.estimating``), nor jax or mbi."""
    code, packages = imported_packages(["estimate", small_plan.plan, str(tmp_path / "none.zarr"), "--out",
                                        str(tmp_path / "e.zarr"), "--serial"])
    assert code == 2
    assert "numba" in packages  # the estimate stage (distfit.estimate.query_sums) was imported
    assert sorted(packages & {"pandas", "pyarrow", "jax", "mbi"}) == []


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
    seen["run"] = (main(["run", {str(tmp_path / "missing.yaml")!r}, "--out", {str(tmp_path / "r")!r}, "--serial"]),
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
    assert code == 2 and "distfit.pipeline.run" in imported  # the missing spec is refused after the import


def test_a_draft_plan_says_so_and_passes_its_audit(small_plan, tmp_path, capsys):
    """``distfit plan --gap-tolerance 0.5``: the summary's ``draft`` line states the gap, the
    plan's decision log says its blocks were solved to it, every block that states a gap of its
    own (the joint block dual's do not) is within it, and ``distfit audit`` passes the plan."""
    out = tmp_path / "draft.zarr"
    assert cli.main(["plan", str(small_plan.spec_path), "--out", str(out), "--serial", "--gap-tolerance", "0.5"]) == 0
    printed = capsys.readouterr().out
    assert "draft" in printed and "within 1 + 0.5 times the least privacy cost" in printed
    plan = read_plan(out)
    assert any("blocks solved to a 5e-01 gap" in line for line in plan.attrs["planner"]["decisions"])
    assert all(b.solver["gap"] <= 0.5 for b in plan.iter_blocks() if b.solver.get("gap") is not None)
    assert cli.main(["audit", str(out)]) == 0


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


# ------------------------------------------------------------------ flags checked when parsed


@pytest.mark.parametrize("argv, flag, problem", [
    (["plan", "s.yaml", "--out", "OUT", "--refine-rounds", "-3"], "--refine-rounds", "must be an integer >= 0, got -3"),
    (["plan", "s.yaml", "--out", "OUT", "--refine-rounds", "2.5"], "--refine-rounds", "expected an integer >= 0"),
    (["plan", "s.yaml", "--out", "OUT", "--workers", "0"], "--workers", "must be >= 1, got 0"),
    (["plan", "s.yaml", "--out", "OUT", "--gap-tolerance", "2"], "--gap-tolerance", "must be in [1e-06, 1], got 2"),
    (["plan", "s.yaml", "--out", "OUT", "--gap-tolerance", "0"], "--gap-tolerance", "must be in [1e-06, 1], got 0"),
    (["plan", "s.yaml", "--out", "OUT", "--serial", "--cluster", "tcp://127.0.0.1:1"], "--serial",
     "excludes --cluster"),
    (["run", "--out", "OUT", "--workers", "-1"], "--workers", "must be >= 1, got -1"),
    (["run", "--out", "OUT", "--units", "0"], "--units", "must be an integer >= 1, got 0"),
    (["synth", "s.yaml", "--out", "OUT", "--units", "-5"], "--units", "must be an integer >= 1, got -5"),
    (["synth", "s.yaml", "--out", "OUT", "--units", "5", "--chunk-units", "0"], "--chunk-units", ">= 1, got 0"),
    (["synth", "s.yaml", "--out", "OUT", "--units", "5", "--seed", "-1"], "--seed", ">= 0, got -1"),
    (["release", "p.zarr", "--data", "d.zarr", "--out", "OUT", "--seed", "-2"], "--seed", ">= 0, got -2"),
    (["mask", "p.csv", "--columns", "a", "--bounds", "a=0:1", "--epsilon", "1", "--delta", "1e-6", "--out", "OUT",
      "--seed", "-3"], "--seed", ">= 0, got -3"),
    (["tabulate", "s.yaml", "--data", "p.csv", "--out", "OUT", "--chunk-units", "-1"], "--chunk-units", ">= 1"),
    (["solve", "prefix:8", "--gap-tolerance", "0"], "--gap-tolerance", "must be finite and > 0, got 0"),
    (["solve", "prefix:8", "--gap-tolerance", "nan"], "--gap-tolerance", "must be finite and > 0, got nan"),
    (["solve", "prefix:8", "--rho", "1e308"], "--rho", "must be in [1e-08, 1e+08], got 1e308"),
    (["solve", "prefix:8", "--alpha", "0"], "--alpha", "must be in [1e-08, 1e+08], got 0"),
    (["solve", "prefix:8", "--epsilon", "1e300", "--delta", "1e-6"], "--epsilon", "must be in [0.0001, 10000]"),
    (["solve", "prefix:8", "--epsilon", "1", "--delta", "0.9"], "--delta", "must be in [1e-100, 0.5], got 0.9"),
])
def test_numeric_flags_are_checked_when_parsed(tmp_path, capsys, argv, flag, problem):
    """Each flag with a domain is refused before anything is read or written: exit 2, one line
    naming the flag, nothing at --out (the inputs need not exist)."""
    out = tmp_path / "out"
    inputs = {"s.yaml", "p.zarr", "d.zarr", "p.csv"}
    code, _, err = run(capsys, *[str(out) if a == "OUT" else str(tmp_path / a) if a in inputs else a for a in argv])
    assert code == 2
    assert_one_line_error(err, flag, problem)
    assert not out.exists()


def test_nonnegative_is_refused_for_a_single_level_spec(tmp_path, capsys):
    """``distfit run --nonnegative`` publishes a multi-level run's nonnegative tables; a
    single-level spec's estimate is nonnegative already: exit 2, one line naming the flag,
    nothing at --out."""
    spec = tmp_path / "one.yaml"
    spec.write_text("name: one\nattributes: [{name: a, size: 3}]\nqueries:\n  - name: q\n"
                    "    attributes: {a: identity}\n    target: 1\n")
    out = tmp_path / "out"
    code, _, err = run(capsys, "run", str(spec), "--out", str(out), "--nonnegative", "--serial")
    assert code == 2
    assert_one_line_error(err, "--nonnegative", "a single-level run's estimates are nonnegative already")
    assert not out.exists()


# ------------------------------------------------------------------ bad spec numbers and names, before any work


BAD_SPECS = [  # (what, spec text, field, problem)
    ("rho 1e308", "privacy: {rho: 1.0e308}", "privacy.rho", "must be in [1e-08, 1e+08], got 1e+308"),
    ("huge target", "TARGET=1e300", "queries[0].target", "must be in [1e-06, 1e+12], got 1e+300"),
    ("tiny target", "TARGET=1e-308", "queries[0].target", "must be in [1e-06, 1e+12], got 1e-308"),
    ("epsilon", "privacy: {epsilon: 1.0e9, delta: 1.0e-6}", "privacy.epsilon", "must be in [0.0001, 10000]"),
    ("delta", "privacy: {epsilon: 1, delta: 0.9}", "privacy.delta", "must be in [1e-100, 0.5], got 0.9"),
    ("long attribute name", "ATTRIBUTE=" + "a" * 300, "attributes[0].name", "300 characters"),
    ("long group name", "GROUP=" + "g" * 65, "queries[0].name", "65 characters"),
    ("huge unused attribute", "attributes: [{name: x, size: 3}, {name: big, size: 1000000000}]",
     "attributes[1].size", "must be at most 1048576"),
    ("max_cells", "blocks: {max_cells: 1000000000}", "blocks.max_cells", "must be at most 1048576"),
]


def _bad_spec(tmp_path: Path, change: str) -> Path:
    attribute, group, target, extra = "x", "g", "1", ""
    if change.startswith("ATTRIBUTE="):
        attribute = change.split("=", 1)[1]
    elif change.startswith("GROUP="):
        group = change.split("=", 1)[1]
    elif change.startswith("TARGET="):
        target = change.split("=", 1)[1]
    else:
        extra = change
    attributes = f"attributes: [{{name: {attribute}, size: 3}}]"
    if extra.startswith("attributes:"):
        attributes, extra = extra, ""
    path = tmp_path / "bad.yaml"
    path.write_text(f"name: bad\n{attributes}\nqueries:\n  - name: {group}\n    attributes: {{{attribute}: identity}}\n"
                    f"    target: {target}\n{extra}\n")
    return path


@pytest.mark.parametrize("command", ["plan", "run"])
@pytest.mark.parametrize("what, change, field, problem", BAD_SPECS, ids=[case[0] for case in BAD_SPECS])
def test_a_spec_out_of_range_is_one_line_naming_the_field_and_nothing_is_written(
        tmp_path, capsys, command, what, change, field, problem):
    out = tmp_path / "out"
    code, _, err = run(capsys, command, str(_bad_spec(tmp_path, change)), "--out", str(out), "--serial")
    assert code == 2
    assert_one_line_error(err, f"distfit: error: {field}: ", problem)
    assert not out.exists()


# ------------------------------------------------------------------ Ctrl-C: one line, exit 130, at any moment

_IMPORT_TIME = re.compile(r"import time:\s*(?:self \[us\] \| cumulative \| imported package|\d+ \|\s*\d+ \|[ \t]*\S+)")


def _interrupt_at(tmp_path: Path, argv: list, marker: str, occurrence: int = 1) -> tuple[int, list[str], str]:
    """Run ``python -X importtime -m distfit.cli ARGV`` in a session of its own, wait until its
    stderr shows ``marker`` (a regular expression; the ``occurrence``-th line matching it: import
    times mark the start-up, the command's own lines the later stages), then send SIGINT to the
    whole process group, as a terminal does. Returns the exit code, the stderr lines that came
    after the marker (import-time records removed: every process of the group writes them) and
    the whole stderr."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2]) + os.pathsep + env.get("PYTHONPATH", "")
    process = subprocess.Popen([sys.executable, "-X", "importtime", "-m", "distfit.cli", *map(str, argv)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env,
                               cwd=tmp_path, start_new_session=True, preexec_fn=interruptible)
    seen, before = 0, []
    try:
        for line in process.stderr:
            before.append(line)
            seen += bool(re.search(marker, line))
            if seen == occurrence:
                os.killpg(process.pid, signal.SIGINT)
                break
        assert seen == occurrence, f"never saw {marker!r} x{occurrence}: {''.join(before)[-3000:]}"
        rest = process.stderr.read()
        process.wait(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    after = [line.strip() for line in _IMPORT_TIME.sub("", rest).splitlines() if line.strip()]
    return process.returncode, after, "".join(before) + rest


def _assert_interrupted(code: int, after: list[str], everything: str, hint: str) -> str:
    """Exit 130, no traceback nor warning anywhere, and the command's one interrupt line last: the
    only line after the interrupt (a progress line already on its way when the signal came may
    precede it, never follow it)."""
    assert code == 130, everything[-3000:]
    said = _IMPORT_TIME.sub("", everything)  # import-time records name modules, not what happened
    for noise in ("Traceback", "KeyboardInterrupt", "Warning", "Exception"):
        assert noise not in said, [line for line in said.splitlines() if noise in line][:20] or said[-3000:]
    interrupts = [line for line in after if line.startswith("distfit: error:")]
    assert len(interrupts) == 1 and after[-1] == interrupts[0], after
    assert interrupts[0].startswith(f"distfit: error: interrupted{hint}"), interrupts[0]
    assert all(line.startswith(("distfit: ", "plan: ", "release: ")) for line in after), after
    return interrupts[0]


@pytest.mark.parametrize("marker, occurrence, hint", [
    (r"\|\s+numpy$", 1, "; nothing was written"),  # importing the command's handler (numpy first)
    (r"\|\s+distfit\.pipeline\.run$", 1, "; nothing was written"),  # the run's modules loaded: the spec, the cluster
    (r"\|\s+distributed\.worker$", 2, "; nothing was written"),  # a worker process of the local cluster starting
], ids=["imports", "spec-load", "cluster-start"])
def test_ctrl_c_during_start_up_is_one_line_and_exit_130(tmp_path, marker, occurrence, hint):
    rundir = tmp_path / "run"
    code, after, everything = _interrupt_at(tmp_path, ["run", "--out", rundir, "--units", 200, "--workers", 2],
                                            marker, occurrence)
    _assert_interrupted(code, after, everything, hint)
    assert not rundir.exists() or not [p for p in rundir.iterdir() if not p.name.endswith(".lock")]


def test_ctrl_c_once_stores_are_finished_says_what_is_kept(tmp_path):
    """Interrupted in its release stage (the driver connects to the cluster for each stage), a
    run says it keeps what RUNDIR holds, by name."""
    rundir = tmp_path / "run"
    code, after, everything = _interrupt_at(tmp_path, ["run", "--out", rundir, "--units", 20000, "--workers", 2],
                                            r"^distfit: connected to", 2)
    line = _assert_interrupted(code, after, everything, "; what was finished is kept in")
    kept = [name for name in RUN_NAMES if (rundir / name).exists()]
    assert {"plan.zarr", "data.zarr"} <= set(kept)
    assert f" ({', '.join(kept)}); run the same command again" in line
