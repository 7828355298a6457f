"""A multi-level run's estimate on the cluster (subtrees as tasks) beside the same estimate in the driver.

Usage::

    python benchmarks/bench_subtrees.py [--spec pipelines/census.yaml] [--units 20000] [--run DIR]
                                        [--workers 2] [--cut LEVEL] [--forest-rows N] [--integer]

Reads the levels of a multi-level run (``--run DIR``: the RUNDIR of ``distfit run SPEC --out DIR
--units N --no-estimate``; else one is run into a temporary directory, without its estimate),
then estimates every level from its plan and sealed release twice, each in a fresh spawned
process on a fresh copy of the levels (:func:`benchmarks.common.measured`):

* ``driver``: :func:`distfit.estimate.levels.estimate_levels` in the process (the whole-tree
  passes, every level's arrays in the driver);
* ``cluster``: the same with ``placement=Placement(workers=W)`` and the cut (``--cut``, an index;
  default :func:`distfit.estimate.subtrees.choose_cut`), forests of ``--forest-rows`` rows
  (:mod:`distfit.estimate.subtree_job`): its own local cluster started and stopped inside the timing.

(``--integer``: both with integer tables, issue 29 point 4: the cluster's forests continue the
driver's integer top-down from their roots' tables) and, as the cluster's fixed cost, a local
cluster of W workers started and stopped with nothing
run on it (``start``). Printed per way: wall seconds, CPU-seconds (the process and its reaped worker processes, user +
system), the peak RSS of the driver and of the largest worker (sampled every 50 ms), and the
ratios cluster / driver; then the largest difference between the two estimates (query
estimates and variances, relative to the largest value of each level; ``--integer``: how many
integer cells and query estimates differ, 0 expected: the same integers bit for bit) and the
load average.
"""
from __future__ import annotations

import argparse
import io
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import MIB, cpu_seconds, load, measured  # noqa: E402
from distfit.estimate.levels import estimate_levels  # noqa: E402
from distfit.pipeline.run import run_levels  # noqa: E402
from distfit.runtime.placement import Placement, placement_client  # noqa: E402
from distfit.spec.parse import load_spec  # noqa: E402
from distfit.stores.estimate import read_estimate  # noqa: E402


def _copy(levels: Path, to: Path) -> Path:
    """The levels' plans and releases, without their estimates, data or reports."""
    shutil.copytree(levels, to, ignore=lambda _d, names: [n for n in names if n in (
        "estimate.zarr", "estimate.subtrees", "data.zarr", "report")])
    return to


def _estimate(spec_path: str, levels: str, workers: int, cut: int | None, forest_rows: int, integer: bool = False
              ) -> tuple[float, float, dict[str, str]]:
    """One estimate of every level (the child process): ``(wall, CPU-seconds, {level: path})``."""
    spec = load_spec(spec_path)
    dirs = {level.name: Path(levels) / level.name for level in spec.levels}
    cpu, start = cpu_seconds(), time.perf_counter()
    placement = None if workers == 0 else Placement(workers=workers)
    out = estimate_levels(spec, dirs, log=io.StringIO(), placement=placement, cut=cut, forest_rows=forest_rows,
                          cluster_units=0, integer=integer)
    return time.perf_counter() - start, cpu_seconds() - cpu, {name: e.path for name, e in out.items()}


def _cluster_only(workers: int) -> tuple[float, float, dict[str, str]]:
    """A local cluster of ``workers`` started and stopped, nothing run on it (the child process):
    what the cluster's estimate pays before its first task."""
    cpu, start = cpu_seconds(), time.perf_counter()
    with placement_client(Placement(workers=workers), io.StringIO()):
        pass
    return time.perf_counter() - start, cpu_seconds() - cpu, {}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--spec", default=str(ROOT / "pipelines" / "census.yaml"))
    parser.add_argument("--units", type=int, default=20_000)
    parser.add_argument("--run", help="an existing multi-level RUNDIR (its levels' plans and releases)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cut", type=int, default=None, help="the level to cut at (an index; default: chosen)")
    parser.add_argument("--forest-rows", type=int, default=100_000)
    parser.add_argument("--integer", action="store_true", help="integer tables (distfit run --integer)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-subtrees-") as tmp:
        work = Path(tmp)
        run = Path(args.run) if args.run else work / "run"
        if not args.run:
            print(f"running {args.spec} at {args.units} units (no estimate) ...", flush=True)
            run_levels(args.spec, run, units=args.units, placement=Placement(workers=args.workers), estimate=False,
                       fsync=False, log=io.StringIO())
        rows, paths = {}, {}
        for way, workers in (("driver", 0), ("cluster", args.workers)):
            levels = _copy(run / "levels", work / way)
            before = load()
            (wall, cpu, paths[way]), memory = measured(_estimate, args.spec, str(levels), workers, args.cut,
                                                       args.forest_rows, args.integer)
            rows[way] = (wall, cpu, memory.driver / MIB, memory.worker / MIB, before)
        before = load()
        (wall, cpu, _), memory = measured(_cluster_only, args.workers)
        rows["start"] = (wall, cpu, memory.driver / MIB, memory.worker / MIB, before)
        print(f"{'':>8} {'wall s':>8} {'CPU s':>8} {'driver MiB':>11} {'worker MiB':>11}  load before")
        for way, (wall, cpu, driver, worker, before) in rows.items():
            print(f"{way:>8} {wall:8.2f} {cpu:8.2f} {driver:11.0f} {worker:11.0f}  {before}")
        (dw, dc, dd, _, _), (cw, cc, cd, ck, _) = rows["driver"], rows["cluster"]
        sw, sc = rows["start"][:2]
        print(f"cluster / driver: wall {cw / dw:.2f}, CPU {cc / dc:.2f}, driver peak RSS {cd / dd:.2f}; "
              f"largest worker {ck:.0f} MiB; without the cluster's start and stop (the row start): wall "
              f"{(cw - sw) / dw:.2f}, CPU {(cc - sc) / dc:.2f}")
        for name in paths["driver"]:
            a, b = read_estimate(paths["driver"][name]), read_estimate(paths["cluster"][name])
            if args.integer:
                cells, queries = (int(np.sum(np.asarray(x) != np.asarray(y)))  # the tables: Estimate.cells
                                  for x, y in ((a.cells[:], b.cells[:]), (a.estimates[...], b.estimates[...])))
                print(f"  {name}: {int(a.attrs['units'])} units, cluster != driver: {cells} integer cells, "
                      f"{queries} query estimates (of {np.asarray(a.estimates[...]).size})")
                continue
            diffs = []
            for array in ("queries/estimates", "queries/variances"):
                x, y = np.asarray(a.array(array)[...]), np.asarray(b.array(array)[...])
                diffs.append(np.abs(x - y).max(initial=0.0) / max(1.0, np.abs(x).max(initial=0.0)))
            print(f"  {name}: {int(a.attrs['units'])} units, cluster - driver: estimates {diffs[0]:.1e}, "
                  f"variances {diffs[1]:.1e} (relative to the level's largest)")
        print(f"load average now {load()}")


if __name__ == "__main__":
    main()
