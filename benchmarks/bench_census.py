"""Census scale (issue 29, point 6): ``pipelines/us_pl94.yaml`` (PL94 tables at nation, state,
county, tract, block group and block) on the US-shaped synthetic geography of N blocks, released
and estimated level by level, extrapolated to the 8.13M blocks of the 2020 Census.

```
python benchmarks/bench_census.py [--units 100000 [--units 1000000]] [--workers 2] [--workdir DIR] [--no-estimate]
python benchmarks/bench_census.py --geography-only 8132968     # write and read back the 8M geography file
python benchmarks/bench_census.py --estimate-again DIR/us-N      # the estimate alone, again, on a run's releases
```

For each N: ``distfit synth`` (:func:`distfit.data.level_synth.write_level_data`: the geography,
every level's data summed up from the blocks), ``read_geography`` of the CSV it wrote, then
``distfit run`` in this process on a local cluster of ``--workers`` (``run_levels``: plan, audit,
release per level, then the estimate of every level together). Printed per
level: units, release wall and CPU-seconds (the process tree's user + system, ``psutil``: the
driver, the scheduler and the workers; the release includes the level's data read) and per
unit; then the estimate's wall and CPU-seconds and its ratio to the release of the same units
(the reference measured in the same run; goal <= 1), the peak RSS of any worker process and of
the driver (goal for a worker: <= 2 GiB).

The estimate is ``run_levels``' (``distfit.estimate.levels.estimate_levels``): in the driver
below ``CLUSTER_UNITS`` units over the levels, as subtree tasks on the run's cluster from there
(issue 29 point 5). ``--estimate-max-units N`` skips it above N blocks (an estimate that holds
every level in one process runs out of memory near 1M units).

Extrapolation to 8M blocks (:func:`distfit.data.us_geography.us_level_counts` of 8,132,968):
each level's release CPU per unit, at the largest size, times its units at full size (the
release is linear in units); the estimate's CPU at the largest estimated size times (full units
/ units) ** e, e measured between the two largest estimated sizes but at least 1 (small sizes
are dominated by fixed costs; the issue measured 1.15 - 1.39 for today's estimate), and its
driver memory on a line through the two largest estimated sizes (in proportion to units
from one size). Goal: the whole 8M run (release + estimate, every level) <= 20 minutes on 2 cores,
i.e. <= 2,400 CPU-seconds with both cores busy. Plans and reports do not depend on N and are
printed apart. Timings depend on the load: the load average is printed with each size.
"""
from __future__ import annotations

import argparse
import functools
import io
import math
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.common import PeakRSS, tree_cpu  # noqa: E402
from distfit.data.geography import nested_geography, read_geography, write_geography  # noqa: E402
from distfit.data.level_synth import geography_arrays, unit_levels, write_level_data  # noqa: E402
from distfit.data.us_geography import FULL_COUNTS, us_geography, us_level_counts  # noqa: E402
from distfit.estimate.levels import ESTIMATE_NAME, estimate_levels  # noqa: E402
from distfit.estimate.subtree_job import PIECES_NAME  # noqa: E402
from distfit.pipeline import run as run_module  # noqa: E402
from distfit.runtime.placement import Placement  # noqa: E402
from distfit.spec.parse import load_spec  # noqa: E402

SPEC = ROOT / "pipelines" / "us_pl94.yaml"
GOAL_SECONDS, CORES, GIB = 20 * 60.0, 2, 2.0**30
#: No limit by default: the whole-tree estimate of before issue 29 point 5 held ~0.35 GiB per 1,000
#: units of us_pl94 in the driver (1.9 GiB at 3,242 units, 4.4 GiB at 10,502); pass a limit to
#: measure such an estimate without exhausting a shared machine.
ESTIMATE_MAX_UNITS = 10**9


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


class Stages:
    """Wall and CPU-seconds of each call of the wrapped stages, by level (the run_pipeline being run)."""

    def __init__(self) -> None:
        self.level: str | None = None
        self.rows: dict[tuple[str, str | None], list[float]] = {}

    def wrap(self, name: str, function):
        @functools.wraps(function)
        def timed(*args, **kwargs):
            wall, cpu = time.perf_counter(), tree_cpu()
            try:
                return function(*args, **kwargs)
            finally:
                row = self.rows.setdefault((name, self.level), [0.0, 0.0])
                row[0] += time.perf_counter() - wall
                row[1] += tree_cpu() - cpu
        return timed

    def levelled(self, function):
        @functools.wraps(function)
        def run(spec, out, **kwargs):
            self.level = Path(os.fspath(out)).name
            try:
                return function(spec, out, **kwargs)
            finally:
                self.level = None
        return run


def measure(units: int, workdir: Path, workers: int, estimate: bool) -> dict:
    spec = load_spec(SPEC)
    out = workdir / f"us-{units}"
    shutil.rmtree(out, ignore_errors=True)
    print(f"\n== {units:,} blocks (load {load()})", flush=True)
    wall, cpu = time.perf_counter(), tree_cpu()
    made = write_level_data(spec, units, out, seed=29, fsync=False)
    synth = (time.perf_counter() - wall, tree_cpu() - cpu)
    wall = time.perf_counter()
    geography = read_geography(made.geography, spec)
    read = time.perf_counter() - wall
    rows = sum(level.ids.size for level in geography.levels)
    del geography
    print(f"synth: {synth[0]:.1f} s wall, {synth[1]:.1f} CPU-s ({made.empty_share:.1%} of blocks empty, "
          f"{made.total_people:,} people); read_geography: {rows:,} rows in {read:.2f} s", flush=True)

    stages = Stages()
    saved = {name: getattr(run_module, name) for name in
             ("run_pipeline", "run_release", "run_plan", "audit_plan", "estimate_levels", "report_level")}
    run_module.run_pipeline = stages.levelled(saved["run_pipeline"])
    for name, label in (("run_release", "release"), ("run_plan", "plan"), ("audit_plan", "audit"),
                        ("estimate_levels", "estimate"), ("report_level", "report")):
        setattr(run_module, name, stages.wrap(label, saved[name]))
    wall = time.perf_counter()
    try:
        with PeakRSS(os.getpid(), interval=0.2) as peak:
            run_module.run_levels(spec, out, placement=Placement(workers=workers), estimate=estimate, fsync=False,
                                  log=io.StringIO())
    finally:
        total = time.perf_counter() - wall
        for name, function in saved.items():
            setattr(run_module, name, function)
    worker_peak = peak.worker
    release = {level: stages.rows.get(("release", level), [0.0, 0.0]) for level in made.units}
    estimated = stages.rows.get(("estimate", None), [0.0, 0.0])
    fixed = [sum(row[i] for (name, _), row in stages.rows.items() if name in ("plan", "audit", "report")) for i in (0, 1)]
    print(f"{'level':<12} {'units':>10} {'release s':>10} {'CPU-s':>8} {'CPU-ms/unit':>12}")
    for level, count in made.units.items():
        w, c = release[level]
        print(f"{level:<12} {count:>10,} {w:>10.1f} {c:>8.1f} {1000 * c / count:>12.3f}")
    rw, rc = sum(r[0] for r in release.values()), sum(r[1] for r in release.values())
    print(f"{'all':<12} {sum(made.units.values()):>10,} {rw:>10.1f} {rc:>8.1f}")
    if not estimate:
        print("estimate: skipped (--no-estimate, or more blocks than --estimate-max-units)")
    else:
        print(f"estimate (every level): {estimated[0]:.1f} s wall, {estimated[1]:.1f} CPU-s; "
              f"estimate / release: {estimated[0] / rw:.2f}x wall, {estimated[1] / rc:.2f}x CPU (goal <= 1)")
    print(f"plans + audits + reports (independent of N): {fixed[0]:.1f} s wall, {fixed[1]:.1f} CPU-s; "
          f"whole run {total:.1f} s wall")
    print(f"peak RSS: worker {worker_peak / GIB:.2f} GiB (goal <= 2), driver {peak.driver / GIB:.2f} GiB; "
          f"load {load()}", flush=True)
    return {"units": units, "levels": made.units, "release": release, "estimate": estimated, "fixed": fixed,
            "estimated": estimate, "driver_peak": peak.driver}


def extrapolate(results: list[dict]) -> None:
    full = us_level_counts(5, FULL_COUNTS["block"])
    last = results[-1]
    names = list(last["levels"])
    full_units = {name: (1 if name == "nation" else full[name]) for name in names}
    release = sum(last["release"][name][1] / last["levels"][name] * full_units[name] for name in names)
    total_units = sum(full_units.values())
    print(f"\n== extrapolated to {FULL_COUNTS['block']:,} blocks ({total_units:,} units)")
    print(f"release, every level (from {last['units']:,} blocks): {release:,.0f} CPU-s")
    estimated = [r for r in results if r["estimated"]]
    if not estimated:
        return
    exponent, at = 1.0, estimated[-1]
    if len(estimated) > 1:
        a = estimated[-2]
        exponent = math.log(at["estimate"][1] / a["estimate"][1]) / math.log(sum(at["levels"].values()) /
                                                                              sum(a["levels"].values()))
    estimate = at["estimate"][1] * (total_units / sum(at["levels"].values())) ** max(exponent, 1.0)
    memory = at["driver_peak"] * total_units / sum(at["levels"].values())
    memory_rule = "in proportion to units"
    if len(estimated) > 1:  # a line through the two largest sizes: a fixed part and a part per unit
        a, units_a, units_at = estimated[-2], sum(estimated[-2]["levels"].values()), sum(at["levels"].values())
        slope = max((at["driver_peak"] - a["driver_peak"]) / (units_at - units_a), 0.0)
        memory = at["driver_peak"] + slope * (total_units - units_at)
        memory_rule = f"a line through {units_a:,} and {units_at:,} units"
    whole = release + estimate
    print(f"estimate (from {at['units']:,} blocks): {estimate:,.0f} CPU-s (exponent {max(exponent, 1.0):.2f}; "
          f"measured {exponent:.2f}{', taken as 1: fixed costs dominate small sizes' if exponent < 1 else ''}); "
          f"estimate / release {estimate / release:.2f}x (goal <= 1); driver memory ~{memory / GIB:,.1f} GiB "
          f"({memory_rule}; goal <= 2)")
    print(f"whole 8M run: {whole:,.0f} CPU-s = {whole / CORES / 60:.1f} min on {CORES} busy cores "
          f"(goal <= {GOAL_SECONDS / 60:.0f} min: {whole / CORES / GOAL_SECONDS:.2f}x the goal)")


def geography_only(units: int, workdir: Path) -> None:
    """The geography of ``units`` blocks written (``write_geography``) and read back
    (``read_geography``, point 4 of the brief: pyarrow's reader), with CPU-seconds and peak RSS."""
    spec = load_spec(SPEC)
    top, columns = unit_levels(spec)
    path = workdir / f"geography-{units}.csv"
    cpu = time.process_time()
    table = nested_geography(spec, *geography_arrays(us_geography(len(columns), units, seed=29), columns))
    made = time.process_time() - cpu
    write_geography(table, path, fsync=False)
    del table
    print(f"{units:,} blocks: geography made in {made:.1f} CPU-s, written ({path.stat().st_size / 2**20:,.0f} MiB); "
          f"load {load()}", flush=True)
    wall, cpu = time.perf_counter(), time.process_time()
    geography = read_geography(path, spec)
    rows = sum(level.ids.size for level in geography.levels)
    print(f"read_geography: {rows:,} rows in {time.perf_counter() - wall:.1f} s wall, {time.process_time() - cpu:.1f} "
          f"CPU-s; peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB; load {load()}")


def estimate_again(run: Path, workers: int) -> None:
    """The estimate alone on the releases of an earlier ``measure`` (``run``: its ``us-N``
    directory), its estimate stores removed first: ``estimate_levels`` on a local cluster of
    ``workers`` started for it (its start counted: about the same for every tree, so two trees
    compare, each run from its own root)."""
    spec = load_spec(SPEC)
    dirs = {level.name: run / "levels" / level.name for level in spec.levels}
    for path in dirs.values():
        shutil.rmtree(path / ESTIMATE_NAME, ignore_errors=True)
        shutil.rmtree(path / PIECES_NAME, ignore_errors=True)
    print(f"estimate of {run} again (load {load()})", flush=True)
    wall, cpu = time.perf_counter(), tree_cpu()
    estimate_levels(spec, dirs, placement=Placement(workers=workers), fsync=False, log=io.StringIO())
    print(f"estimate: {time.perf_counter() - wall:.1f} s wall, {tree_cpu() - cpu:.1f} CPU-s; load {load()}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--units", type=int, action="append", help="blocks (repeat for several sizes; default 100000)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--workdir", help="where the runs go (default: a temporary directory, removed after)")
    parser.add_argument("--no-estimate", action="store_true")
    parser.add_argument("--geography-only", type=int, metavar="N",
                        help="only write and read back the geography file of N blocks (read_geography's speed)")
    parser.add_argument("--estimate-again", metavar="RUN",
                        help="only the estimate again, on the releases of an earlier run's us-N directory")
    parser.add_argument("--estimate-max-units", type=int, default=ESTIMATE_MAX_UNITS,
                        help="estimate only up to this many blocks (default: no limit)")
    args = parser.parse_args()
    if args.estimate_again:
        estimate_again(Path(args.estimate_again), args.workers)
        return
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-census-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"load average {load()}; {os.cpu_count()} CPUs; spec {SPEC.name}", flush=True)
    try:
        if args.geography_only:
            geography_only(args.geography_only, workdir)
            return
        results = [measure(units, workdir, args.workers, not args.no_estimate and units <= args.estimate_max_units)
                   for units in args.units or [100_000]]
        extrapolate(results)
    finally:
        if args.workdir is None:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
