"""SM-II settings tried on a plan's kept round, each block beside the default (issue 31, point 2).

Usage::

    python benchmarks/bench_kept_round.py [--spec pipelines/marginals.yaml] [--tasks DIR]
        [--min-seconds 0.4] [--growth G] [--initial-sharpness S] [--final-sharpness F] [--max-cg N]
        [--full-space]

The kept round (the blocks solved to the plan's block gap, warm-started from the last shaping
round) is where marginals.yaml's plan spends most of its CPU. The first run plans ``--spec``
serially in this process and keeps the kept round's block tasks that took at least
``--min-seconds`` (pickled into ``--tasks``, default ``/tmp/distfit-kept-round-<spec name>``);
later runs reuse them. Each task is then solved twice in turn, with the default SM-II settings
(the reference) and with the ones given, so load changes reach both alike, each with one BLAS
thread as on the planner's workers. Printed: CPU-seconds
of each (``time.process_time``) and their ratio, Newton and CG steps, the sum of the block
alphas (the plan's alpha is a weighted sum of them: a change here is its direction), the
largest change of one block's alpha, and how many blocks got the same sigma bit for bit.
``--full-space``: the settings' solves treat the block as a shaping solve does
(``solver.solve.CERTIFYING_GAP``: Newton directions in the full space, the polishing dual
ascent without its stall stop), as every solve did before session 26.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import os
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import distfit.plan.planner as planner  # noqa: E402
import distfit.solver.smii as smii  # noqa: E402
import distfit.solver.solve as solve_module  # noqa: E402
from distfit.cli.main import main as distfit_main  # noqa: E402
from distfit.plan.rounds import BLOCK_GAP  # noqa: E402

SETTINGS = ("growth", "initial_sharpness", "final_sharpness", "max_cg")


def capture(spec: str, directory: Path, min_seconds: float) -> None:
    """Plan ``spec`` serially here and pickle the kept round's tasks of ``min_seconds`` or more."""
    directory.mkdir(parents=True, exist_ok=True)
    solve_block = planner.solve_block

    def kept(task):
        start = time.process_time()
        solution = solve_block(task)
        seconds = time.process_time() - start
        if task.gap_tolerance == BLOCK_GAP and seconds >= min_seconds:
            with open(directory / f"{task.spec.block_id}.pkl", "wb") as handle:
                pickle.dump(task, handle)
        return solution

    planner.solve_block = kept  # the serial executor looks it up at each call
    try:
        with tempfile.TemporaryDirectory(prefix="kept-round-") as tmp, contextlib.redirect_stdout(io.StringIO()), \
                contextlib.redirect_stderr(io.StringIO()):  # the plan's summary and progress
            if distfit_main(["plan", spec, "--out", str(Path(tmp) / "plan.zarr"), "--serial"]) != 0:
                raise SystemExit("distfit plan failed")
    finally:
        planner.solve_block = solve_block


def timed_solve(task, settings: dict, full_space: bool = False):
    """The block's solve with SM-II's keyword defaults replaced by ``settings`` (and, with
    ``full_space``, as a shaping solve, ``--full-space``); (solution, CPU-s)."""
    optimize, certifying_gap = smii.smii_optimize, solve_module.CERTIFYING_GAP

    def with_settings(*args, **kwargs):
        return optimize(*args, **{**kwargs, **settings})

    smii.smii_optimize = with_settings
    solve_module.CERTIFYING_GAP = 0.0 if full_space else certifying_gap
    try:
        start = time.process_time()
        solution = planner.solve_block(task)
        return solution, time.process_time() - start
    finally:
        smii.smii_optimize, solve_module.CERTIFYING_GAP = optimize, certifying_gap


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "pipelines" / "marginals.yaml"))
    parser.add_argument("--tasks", default=None, help="where the kept round's tasks are kept between runs")
    parser.add_argument("--min-seconds", type=float, default=0.4)
    parser.add_argument("--growth", type=float)
    parser.add_argument("--initial-sharpness", type=float)
    parser.add_argument("--final-sharpness", type=float)
    parser.add_argument("--max-cg", type=int)
    parser.add_argument("--full-space", action="store_true", help="solve as a shaping solve does (module docstring)")
    args = parser.parse_args(argv)
    settings = {name: getattr(args, name) for name in SETTINGS if getattr(args, name) is not None}
    spec = str(Path(args.spec).resolve())
    directory = Path(args.tasks or Path(tempfile.gettempdir()) / f"distfit-kept-round-{Path(spec).stem}")
    if not any(directory.glob("*.pkl")):
        print(f"capturing the kept round of {spec} into {directory} (a serial plan)", flush=True)
        capture(spec, directory, args.min_seconds)
    tasks = []
    for path in sorted(directory.glob("*.pkl")):
        with open(path, "rb") as handle:
            tasks.append(pickle.load(handle))
    totals = {"reference": np.zeros(3), "settings": np.zeros(3)}
    alphas = {"reference": [], "settings": []}
    same_sigma = 0
    for task in tasks:
        solutions = {}
        for name, given, full_space in (("reference", {}, False), ("settings", settings, args.full_space)):
            solution, seconds = timed_solve(task, given, full_space)  # one BLAS thread: planner.solve_block's rule
            totals[name] += (seconds, solution.stats.newton_iterations, solution.stats.cg_iterations)
            alphas[name].append(solution.alpha)
            solutions[name] = solution
        same_sigma += bool(np.array_equal(solutions["reference"].sigma, solutions["settings"].sigma))
    reference, changed = np.array(alphas["reference"]), np.array(alphas["settings"])
    relative = changed / reference - 1.0
    parts = ([str(settings)] if settings else []) + (["in the full space"] if args.full_space else [])
    described = " ".join(parts) or "the defaults"
    print(f"{len(tasks)} kept-round blocks of {Path(spec).name}; settings {described} "
          f"(load average {os.getloadavg()[0]:.2f})")
    for name in ("reference", "settings"):
        seconds, newton, cg = totals[name]
        print(f"  {name:9s}  {seconds:7.1f} CPU-s  Newton {int(newton):6d}  CG {int(cg):7d}  alpha sum {sum(alphas[name]):.9f}")
    print(f"  settings / reference: CPU {totals['settings'][0] / totals['reference'][0]:.3f}, "
          f"alpha sum {changed.sum() / reference.sum() - 1.0:+.2e} (blocks {relative.min():+.2e} to {relative.max():+.2e}), "
          f"same sigma on {same_sigma} of {len(tasks)} blocks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
