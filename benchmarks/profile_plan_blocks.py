"""Where a plan's solver time goes, round by round: ``distfit plan SPEC --serial`` in this
process with every block solve timed (``planner.solve_block``, CPU-seconds by
``time.process_time``), summed per round (its certified gap) with the Newton, CG and dual
evaluation counts, and the costliest blocks of each round (issue 31, point 2).

Usage::

    python benchmarks/profile_plan_blocks.py [--spec pipelines/marginals.yaml] [--top 3] [--reference-root DIR]

With ``--reference-root`` the same profile runs again in a fresh process on that tree's distfit
(an unpacked older tree), after this tree's. One core; the CPU-seconds are what to compare.
"""
from __future__ import annotations

import argparse
import collections
import contextlib
import io
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def profile(spec: str, top: int) -> None:
    """Plan ``spec`` serially in this process and print the per-round table."""
    import distfit.plan.planner as planner
    from distfit.cli.main import main
    from distfit.stores.plan import read_plan

    records = []
    solve_block = planner.solve_block

    def timed(task):
        start = time.process_time()
        solution = solve_block(task)
        stats = solution.stats
        records.append((task.gap_tolerance, task.spec.block_id, task.spec.basis.shape[0], task.spec.recon.shape[0],
                        time.process_time() - start, stats.newton_iterations, stats.cg_iterations,
                        stats.dual_evaluations))
        return solution

    planner.solve_block = timed  # the serial executor looks it up at each call
    with tempfile.TemporaryDirectory(prefix="profile-plan-") as tmp:
        out = str(Path(tmp) / "plan.zarr")
        start = time.process_time()
        with contextlib.redirect_stdout(io.StringIO()):  # the plan's summary: only the table is printed
            failed = main(["plan", spec, "--out", out, "--serial"]) != 0
        if failed:
            raise SystemExit("distfit plan failed")
        process = time.process_time() - start
        alpha = read_plan(out).attrs["alpha"]
    rounds = collections.defaultdict(list)
    for record in records:
        rounds[record[0]].append(record)
    print(f"distfit {Path(planner.__file__).parents[2]}: alpha {alpha:.6f}, the process {process:.1f} CPU-s, "
          f"block solves {sum(r[4] for r in records):.1f} CPU-s ({os.getloadavg()[0]:.2f} load)")
    for gap, blocks in sorted(rounds.items(), key=lambda item: -item[0]):
        print(f"  gap {gap:g}: {len(blocks)} blocks, {sum(b[4] for b in blocks):.1f} CPU-s, Newton "
              f"{sum(b[5] for b in blocks)}, CG {sum(b[6] for b in blocks)}, dual {sum(b[7] for b in blocks)}")
        for block in sorted(blocks, key=lambda b: -b[4])[:top]:
            print(f"    {block[1]:44s} k {block[2]:4d} queries {block[3]:6d} {block[4]:6.2f} CPU-s "
                  f"Newton {block[5]:4d} CG {block[6]:5d} dual {block[7]:4d}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "pipelines" / "marginals.yaml"))
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--reference-root", default=None)
    parser.add_argument("--here", action="store_true", help=argparse.SUPPRESS)  # the profiled process itself
    args = parser.parse_args(argv)
    spec = str(Path(args.spec).resolve())
    if args.here:
        profile(spec, args.top)
        return 0
    # each profile in a fresh process run in its tree's root (python puts the script's directory,
    # and -m the working directory, ahead of PYTHONPATH)
    for root in [ROOT] + ([Path(args.reference_root).resolve()] if args.reference_root else []):
        subprocess.run([sys.executable, str(Path(__file__).resolve()), "--here", "--spec", spec, "--top", str(args.top)],
                       env=dict(os.environ, PYTHONPATH=str(root)), cwd=root, check=True,
                       stderr=subprocess.DEVNULL)
    return 0


if __name__ == "__main__":
    sys.exit(main())
