"""The Adult pipeline end to end (issue 31, point 3): ``distfit run pipelines/adult.yaml --data
pipelines/data/adult.csv --out DIR``, in this process, with every stage's wall time and
CPU-seconds (this process and its children: the local cluster's scheduler, nannies and
workers), and a reference measured in the same run.

```
python benchmarks/bench_adult_run.py [--out DIR] [--workers 2] [--profile DIR] [--no-estimate]
```

Stages are timed by wrapping the functions ``distfit.pipeline.run`` calls (the tabulation, the
plan, the audit, the release, the estimate, the report); the CPU of a stage is the process
tree's user + system CPU-seconds at its end minus at its start (``psutil``; the cluster's
processes live for the whole run, so none of their time is lost with an exited child).

Reference, in the same run: the plan's bare block solves of the kept (last) round, the sum of
the ``solver["seconds"]`` every block records (each solve's wall time on its worker, one BLAS
thread; under load that is more than its CPU): the part of the plan stage no change outside the
solver can remove. The goal (issue 31): the whole run <= 90 s wall on 2 cores.

``--profile DIR``: the driver process under cProfile, one ``.prof`` per stage in DIR (the
workers' solves are not in it: they are the reference above).

Timings depend on the load: the load average is printed before and after each stage.
"""
from __future__ import annotations

import argparse
import cProfile
import functools
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import tree_cpu  # noqa: E402

GOAL_SECONDS = 90.0


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Stages:
    def __init__(self, profile_dir: str | None) -> None:
        self.rows: list[tuple[str, float, float, str, str]] = []
        self.profile_dir = profile_dir
        self.depth = 0

    def wrap(self, name: str, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            if self.depth:  # a stage inside a stage (the release's own audit): counted in the outer one
                return function(*args, **kwargs)
            self.depth += 1
            before, wall, cpu = load(), time.perf_counter(), tree_cpu()
            profiler = cProfile.Profile() if self.profile_dir else None
            try:
                if profiler:
                    profiler.enable()
                return function(*args, **kwargs)
            finally:
                if profiler:
                    profiler.disable()
                    profiler.dump_stats(os.path.join(self.profile_dir, f"{name}.prof"))
                self.depth -= 1
                self.rows.append((name, time.perf_counter() - wall, tree_cpu() - cpu, before, load()))
                print(f"[bench] {name}: {self.rows[-1][1]:.1f} s wall, {self.rows[-1][2]:.1f} CPU-s "
                      f"(load {before} -> {load()})", file=sys.stderr, flush=True)
        return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", help="run directory (default: a fresh temporary one, removed after)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--profile", help="write the driver's cProfile of each stage here")
    parser.add_argument("--no-estimate", action="store_true")
    args = parser.parse_args()

    print(f"load average {load()} (before imports)", flush=True)
    wall0, cpu0 = time.perf_counter(), tree_cpu()
    from distfit.pipeline import run as run_module
    from distfit.pipeline.stage_cluster import StageCluster
    from distfit.runtime.placement import Placement
    from distfit.stores.plan import read_plan
    imported = time.perf_counter() - wall0

    stages = Stages(args.profile)
    if args.profile:
        os.makedirs(args.profile, exist_ok=True)
    for attribute, name in (("planned_decomposition", "decompose"), ("ensure_tabulated", "data"),
                            ("run_plan", "plan"), ("audit_plan", "audit"), ("run_release", "release"),
                            ("estimate_in_run", "estimate"), ("write_report", "report")):
        setattr(run_module, attribute, stages.wrap(name, getattr(run_module, attribute)))
    original_local = StageCluster.placement

    def placement(self):
        if self.given.local and not self.started:
            return stages.wrap("cluster start", original_local)(self)
        return original_local(self)
    StageCluster.placement = placement

    temporary = args.out is None
    out = Path(args.out or tempfile.mkdtemp(prefix="bench-adult-run-")) / "adult"
    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    result = run_module.run_pipeline(str(ROOT / "pipelines" / "adult.yaml"), out,
                                     data=str(ROOT / "pipelines" / "data" / "adult.csv"),
                                     placement=Placement(workers=args.workers), estimate=not args.no_estimate)
    total_wall, total_cpu = time.perf_counter() - start, tree_cpu() - cpu0
    plan = read_plan(result.plan)
    solves = sum(float(record.solver.get("seconds", 0.0)) for record in plan.iter_blocks())
    if temporary:
        shutil.rmtree(out.parent, ignore_errors=True)

    print(f"\nAdult end to end, {args.workers} workers (imports {imported:.1f} s before the run)")
    print(f"{'stage':14s} {'wall s':>8s} {'CPU-s':>8s}  load average before -> after")
    for name, wall, cpu, before, after in stages.rows:
        print(f"{name:14s} {wall:8.1f} {cpu:8.1f}  {before} -> {after}")
    accounted = sum(row[1] for row in stages.rows)
    print(f"{'(between)':14s} {total_wall - accounted:8.1f}")
    print(f"{'run total':14s} {total_wall:8.1f} {total_cpu:8.1f}  (load {load()})")
    plan_row = next(row for row in stages.rows if row[0] == "plan")
    print(f"reference: the kept round's bare block solves {solves:.1f} s (solver seconds, summed over the "
          f"{args.workers} workers); the plan stage {plan_row[1]:.1f} s wall, {plan_row[2]:.1f} CPU-s")
    print(f"plan alpha {plan.attrs['alpha']:.9g}, checksum {plan.checksum}")
    print(f"run wall {total_wall:.1f} s against the goal of {GOAL_SECONDS:.0f} s: "
          f"{'met' if total_wall <= GOAL_SECONDS else 'NOT met'}")


if __name__ == "__main__":
    main()
