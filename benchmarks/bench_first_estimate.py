"""The first estimate after install: with numba's cache empty, after the warm-up, warm; beside
the release of the same units (issue 31, goal 5: the first estimate after the set-up's warm-up
costs <= 2x the release).

Usage::

    python benchmarks/bench_first_estimate.py [--units 3000] [--workers 2] [--spec pipelines/pl94.yaml]
                                              [--workdir DIR] [--keep-data]

Plans the spec (serial, in this process) and synthesises ``--units`` units (both untimed), then
runs each of these as the command a user types, in a fresh process (``python -m distfit.cli``;
``--workers W``: a local cluster of W workers, default 2; ``--workers 0``: ``--serial``):

* **release**: ``distfit release`` of the units;
* **estimate, empty cache**: ``distfit estimate`` of that release with ``NUMBA_CACHE_DIR`` a new
  empty directory (the first estimate after install without the warm-up: every kernel compiled);
* **warm-up**: ``python -m distfit.estimate.warm`` into a second new directory (the set-up step,
  README);
* **estimate after the warm-up**: ``distfit estimate`` with that directory (the first estimate
  a user waits for after the set-up);
* **estimate, warm**: the same again.

Printed for each: wall seconds and CPU seconds (user + system of the process and its waited-for
children, the local cluster's workers included: on a shared machine the wall time mostly
measures the other load), the load average before it, and the figure: the first estimate after
the warm-up over the release, in CPU seconds and in wall seconds (goal <= 2).
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import load, parse_options, planned_workdir, synthesised  # noqa: E402


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def timed(command: list[str], cache: str | None) -> tuple[float, float, str]:
    """``(wall seconds, CPU seconds, load average before)`` of ``command`` run to completion in
    a fresh process (``NUMBA_CACHE_DIR=cache`` where given); a failure stops the benchmark."""
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if cache is not None:
        env["NUMBA_CACHE_DIR"] = cache
    before, cpu = load(), _children_cpu()
    start = time.perf_counter()
    done = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wall = time.perf_counter() - start
    if done.returncode:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr}")
    return wall, _children_cpu() - cpu, before


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    args = parse_options(parser, argv, units=[3000], repeat=1)
    where = ["--serial"] if args.workers == 0 else ["--workers", str(args.workers)]
    cli = [sys.executable, "-m", "distfit.cli"]
    with planned_workdir(args, "bench-first-estimate-") as work, tempfile.TemporaryDirectory() as caches:
        n = args.units[0]
        data = synthesised(args, work.path, n)
        release = str(work.path / f"release-{n}.zarr")
        rows = [("release", timed(cli + ["release", work.plan_path, "--data", data, "--out", release, "--seed", "1",
                                         "--overwrite"] + where, None))]
        empty, warmed = str(Path(caches) / "empty"), str(Path(caches) / "warmed")
        estimate = cli + ["estimate", work.plan_path, release, "--out", str(work.path / "estimate.zarr"),
                          "--overwrite"] + where
        rows.append(("estimate, empty cache", timed(estimate, empty)))
        rows.append(("warm-up (set-up step)", timed([sys.executable, "-m", "distfit.estimate.warm"], warmed)))
        rows.append(("estimate after warm-up", timed(estimate, warmed)))
        rows.append(("estimate, warm", timed(estimate, warmed)))
    print(f"{n:,} units of {Path(args.spec).name}, {' '.join(where)}; {os.cpu_count()} CPUs")
    print(f"{'':>24} {'wall s':>8} {'CPU s':>8}  load before")
    for name, (wall, cpu, before) in rows:
        print(f"{name:>24} {wall:>8.2f} {cpu:>8.2f}  {before}")
    (release_wall, release_cpu, _), (first_wall, first_cpu, _) = rows[0][1], rows[3][1]
    print(f"first estimate after the warm-up / release: {first_cpu / release_cpu:.2f} in CPU seconds, "
          f"{first_wall / release_wall:.2f} in wall seconds (goal <= 2); without the warm-up "
          f"{rows[1][1][1] / release_cpu:.2f} in CPU seconds")
    return 0


if __name__ == "__main__":
    sys.exit(main())
