"""The default plan of ``pipelines/marginals.yaml`` as a user runs it (issue 31, point 2): wall
seconds, CPU-seconds (the command and every process it started: the local cluster's workers) and
alpha, beside a reference in the same run.

Usage::

    python benchmarks/bench_marginals_plan.py [--spec pipelines/marginals.yaml] [--workers 2]
                                              [--reference-root DIR] [--reference-alpha A]

Each plan is ``python -m distfit.cli plan SPEC --out TMP --overwrite`` in a fresh process (its
imports, decomposition, cluster start, rounds, store and shutdown included), this tree's
distfit, and with ``--reference-root DIR`` (an unpacked older tree, e.g. ``git archive
REF | tar -x -C DIR``) the same command on that tree's distfit, one after the other. The
reference alpha is that run's, else ``--reference-alpha`` (default: 121.979616, the plan at
43bf2b9, benchmarks/README.md). Goals: wall <= 60 s on 2 cores, alpha <= the reference's.
The machine is shared: compare CPU-seconds, and the load average printed before and after.
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

import numpy as np

from distfit.stores.plan import read_plan

ROOT = Path(__file__).resolve().parents[1]
GOAL_SECONDS = 60.0
#: alpha of ``distfit plan pipelines/marginals.yaml`` at 43bf2b9 (benchmarks/README.md, issue 31 point 2)
REFERENCE_ALPHA = 121.979616


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def plan_once(root: Path, spec: str, workers: int, out: Path) -> tuple[float, float, float]:
    """(wall s, CPU-s of the command and its children, alpha) of one ``distfit plan`` on ``root``'s distfit."""
    env = dict(os.environ, PYTHONPATH=str(root))
    # run in root: ``python -m`` and ``-c`` put the working directory first on sys.path, ahead of
    # PYTHONPATH, so run from another tree they imported that tree's distfit, not root's (the
    # session-14 figures compared this tree with itself)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "distfit.cli", "plan", spec, "--out", str(out), "--overwrite",
                           "--workers", str(workers)], env=env, capture_output=True, text=True, cwd=root)
    wall = time.perf_counter() - wall
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{root}: distfit plan failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    imported, alpha = subprocess.run(
        [sys.executable, "-c", "import sys, distfit; from distfit.stores.plan import read_plan; "
         "print(distfit.__file__); print(repr(read_plan(sys.argv[1]).attrs['alpha']))", str(out)],
        env=env, capture_output=True, text=True, check=True, cwd=root).stdout.split()
    if not Path(imported).resolve().is_relative_to(Path(root).resolve()):
        raise SystemExit(f"{root}: the plan's process imported {imported}, not this tree's distfit")
    return wall, cpu, float(alpha)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "pipelines" / "marginals.yaml"))
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--reference-root", default=None, help="also plan with this source tree's distfit")
    parser.add_argument("--reference-alpha", type=float, default=REFERENCE_ALPHA)
    args = parser.parse_args(argv)
    args.spec = str(Path(args.spec).resolve())  # the plans run in their trees' roots
    runs = [("this tree", ROOT)] + ([("reference", Path(args.reference_root))] if args.reference_root else [])
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench-marginals-plan-") as tmp:
        stores = [Path(tmp) / f"{n}.zarr" for n in range(len(runs))]
        for (name, root), store in zip(runs, stores):
            print(f"{name}: planning {args.spec} on {args.workers} workers ({load()})", flush=True)
            results[name] = plan_once(root, args.spec, args.workers, store)
            wall, cpu, alpha = results[name]
            print(f"{name:10s} wall {wall:7.1f} s  CPU {cpu:7.1f} s  alpha {alpha:.9f}  ({load()})", flush=True)
        report(results, args.reference_alpha, stores)
    return 0


def report(results: dict, reference_alpha: float, stores: list[Path]) -> None:
    """The summary lines: the goal, alpha against the reference's, the ratios, how far apart the plans are."""
    reference_alpha = results["reference"][2] if "reference" in results else reference_alpha
    wall, cpu, alpha = results["this tree"]
    print(f"wall {wall:.1f} s against the goal of {GOAL_SECONDS:.0f} s: {'met' if wall <= GOAL_SECONDS else 'NOT met'}")
    print(f"alpha {alpha:.6f} against the reference's {reference_alpha:.6f} ({alpha / reference_alpha - 1:+.2e}): "
          f"{'not worse' if alpha <= reference_alpha * (1 + 1e-6) else 'WORSE'}")
    if "reference" in results:
        print(f"this tree / reference: wall {wall / results['reference'][0]:.3f}, CPU {cpu / results['reference'][1]:.3f}")
        print(f"the plans' per-query variances, largest relative difference: {variances_apart(*stores):.3g}")


def variances_apart(ours: Path, reference: Path) -> float:
    """The largest ``|v - v_ref| / v_ref`` over the queries of the two stored plans (read by this
    tree's reader: the store format is the same): 0 for the same plan, ~1e-16 for a pure-speed change."""
    a, b = read_plan(str(ours)).queries_variances, read_plan(str(reference)).queries_variances
    return float(np.max(np.abs(a - b) / b))


if __name__ == "__main__":
    sys.exit(main())
