"""A multi-level run's estimate by this tree beside a reference tree's, on the same releases (issue 29, point 6).

Usage::

    python benchmarks/bench_estimate_reference.py --run RUNDIR --reference TREE [--spec pipelines/us_pl94.yaml]
                                                  [--workers 2] [--repeat 1] [--driver]

``RUNDIR``: a multi-level run whose levels hold their plans and sealed releases (``distfit run
SPEC --out RUNDIR --no-estimate``, or ``bench_census.py --workdir DIR --no-estimate``'s
``DIR/us-N``); ``TREE``: another checkout of distfit (e.g. ``git worktree add --detach ../ref
main``). For each tree (the reference first, then this one; ``--repeat`` times, alternating) the
levels' plans and releases are copied aside without their estimates and every level is
estimated by that tree's :func:`distfit.estimate.levels.estimate_levels` in a fresh Python
process started in the tree's root with the tree first on ``sys.path`` (so each measures its
own code), as ``distfit run`` would: on a local cluster of ``--workers`` workers from
``CLUSTER_UNITS`` units over the levels (``--driver``: in the process, no cluster). Printed per
run: wall seconds, CPU-seconds (the process and its reaped children: the cluster's scheduler and
workers, user + system), peak RSS of the estimating process and of its largest child, the load
average before; then this tree / the reference (best of the repeats), and the largest
difference between the two trees' stores, level by level: query estimates, query variances and
cells relative to the level's largest value, and the residuals (``solve/objective``) relative
to the level's largest.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import MIB, PeakRSS, load  # noqa: E402
from distfit.spec.parse import load_spec  # noqa: E402
from distfit.stores.estimate import read_estimate  # noqa: E402

#: Run in the tree's root by its own interpreter path: the estimate of every level, timed.
CHILD = """
import io, json, resource, sys, time
from pathlib import Path
sys.path.insert(0, {tree!r})
from distfit.estimate.levels import estimate_levels
from distfit.runtime.placement import Placement
from distfit.spec.parse import load_spec

def cpu():
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

spec = load_spec({spec!r})
dirs = {{level.name: Path({levels!r}) / level.name for level in spec.levels}}
start, used = time.perf_counter(), cpu()
placement = None if {workers} == 0 else Placement(workers={workers})
out = estimate_levels(spec, dirs, log=io.StringIO(), placement=placement)
print(json.dumps({{"wall": time.perf_counter() - start, "cpu": cpu() - used,
                  "paths": {{name: e.path for name, e in out.items()}}}}))
"""


def _copy(levels: Path, to: Path) -> Path:
    """The levels' plans and releases, without their estimates, data or reports."""
    shutil.copytree(levels, to, ignore=lambda _d, names: [n for n in names if n in (
        "estimate.zarr", "estimate.subtrees", "data.zarr", "report")])
    return to


def _estimate(tree: Path, spec: str, levels: Path, workers: int) -> tuple[dict, PeakRSS]:
    """One estimate of every level by ``tree``'s code in a fresh process: its report and memory."""
    code = CHILD.format(tree=str(tree), spec=spec, levels=str(levels), workers=workers)
    env = dict(os.environ, PYTHONPATH=str(tree))
    child = subprocess.Popen([sys.executable, "-c", code], cwd=tree, env=env, stdout=subprocess.PIPE, text=True)
    with PeakRSS(child.pid) as memory:
        out, _ = child.communicate()
    if child.returncode != 0:
        raise SystemExit(f"{tree}: the estimate failed (exit {child.returncode})")
    return json.loads(out.strip().splitlines()[-1]), memory


def _largest(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max(initial=0.0) / max(np.abs(a).max(initial=0.0), 1e-300))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--run", required=True, help="a multi-level RUNDIR (its levels' plans and releases)")
    parser.add_argument("--reference", required=True, help="another distfit checkout (its root)")
    parser.add_argument("--spec", default=str(ROOT / "pipelines" / "us_pl94.yaml"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--driver", action="store_true", help="estimate in the process (no cluster)")
    args = parser.parse_args(argv)
    spec = str(Path(args.spec).resolve())
    workers = 0 if args.driver else args.workers
    trees = {"reference": Path(args.reference).resolve(), "this": ROOT}
    names = [level.name for level in load_spec(spec).levels]
    print(f"load average {load()}; {os.cpu_count()} CPUs; run {args.run}; reference {trees['reference']}", flush=True)
    print(f"{'tree':>10} {'wall s':>8} {'CPU-s':>8} {'process MiB':>12} {'child MiB':>10}  load before")
    best: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-estimate-reference-") as tmp:
        paths: dict[str, dict[str, str]] = {}
        for attempt in range(args.repeat):
            for tree, root in trees.items():
                levels = Path(tmp) / f"{tree}-{attempt}"
                _copy(Path(args.run) / "levels", levels)
                before = load()
                report, memory = _estimate(root, spec, levels, workers)
                print(f"{tree:>10} {report['wall']:8.2f} {report['cpu']:8.2f} {memory.driver / MIB:12.0f} "
                      f"{memory.worker / MIB:10.0f}  {before}", flush=True)
                wall, cpu = best.get(tree, (float("inf"), float("inf")))
                best[tree] = (min(wall, report["wall"]), min(cpu, report["cpu"]))
                if attempt == 0:
                    paths[tree] = report["paths"]
                else:
                    shutil.rmtree(levels, ignore_errors=True)
        (rw, rc), (tw, tc) = best["reference"], best["this"]
        print(f"this / reference (best of {args.repeat}): wall {tw:.2f} / {rw:.2f} s = {tw / rw:.2f}, "
              f"CPU {tc:.2f} / {rc:.2f} s = {tc / rc:.2f}")
        print(f"{'level':>12} {'units':>9} {'queries':>9} {'variances':>10} {'cells':>9} {'residuals':>10}"
              f"  (largest |this - reference|, relative to the level's largest)")
        for name in names:
            a, b = read_estimate(paths["reference"][name]), read_estimate(paths["this"][name])
            diffs = []
            for array in ("queries/estimates", "queries/variances", "cells/estimates", "solve/objective"):
                x, y = (np.asarray(e.cells[:] if array == "cells/estimates" else e.array(array)[...])
                        for e in (a, b))  # the tables: cells/estimates or query columns (Estimate.cells)
                diffs.append(_largest(x, y))
            print(f"{name:>12} {int(a.attrs['units']):>9,} " + " ".join(f"{d:>9.1e}" for d in diffs))
    print(f"load average now {load()}")


if __name__ == "__main__":
    main()
