"""What a run's report costs (``write_report``, distfit/report/): this tree beside a reference tree.

Usage::

    python benchmarks/bench_report.py RUNDIR --reference TREE [--repeat 3]

``RUNDIR`` is a ``distfit run`` directory (its ``plan.zarr``, ``release.zarr``, ``data.zarr`` and
``estimate.zarr``: every figure of both pages is drawn); ``TREE`` another checkout of distfit
(e.g. ``git worktree add /tmp/ref main``) whose report is the reference. Each measurement is a
fresh ``python`` process started from the tree's root with that root first on ``sys.path`` (so
each tree measures its own code), runs interleaved (this tree, reference, this tree, ...) so
that load drifts hit both alike. A process writes the report twice, as ``distfit run`` does
(``verified=True``), into a temporary directory: the first call (pyplot imported, fonts and
tickers set up: what one ``distfit run`` pays) and the second (warm). Printed per tree and call:
the best and median CPU-seconds (``time.process_time``, every thread) and wall, the median
CPU-seconds inside the figures (the page's ``plot_*`` calls: building, laying out and drawing
each to SVG), and this tree's medians over the reference's (the ratios); the load average
before and after. The rest of a report (reading the stores, the baselines' small solves, the
HTML) is the same code in both trees; its CPU is noisier under load (BLAS threads).
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import child_json, load  # noqa: E402

#: Run in the child, from the tree's root: two reports of RUNDIR, each timed, with the CPU spent
#: in the figures (every ``plot_*`` function the page calls: building, laying out and drawing
#: each figure to SVG) summed.
CHILD = r"""
import json, sys, tempfile, time
from pathlib import Path
import distfit.report.page as page

run = Path(sys.argv[1])
inside = [0.0]

def timing(plot):
    def timed(*args, **kwargs):
        start = time.process_time()
        try:
            return plot(*args, **kwargs)
        finally:
            inside[0] += time.process_time() - start
    return timed

for name in [name for name in vars(page) if name.startswith("plot_")]:
    setattr(page, name, timing(getattr(page, name)))
calls = []
with tempfile.TemporaryDirectory(prefix="bench-report-") as tmp:
    for call in range(2):
        inside[0] = 0.0
        cpu, wall = time.process_time(), time.perf_counter()
        page.write_report(run / "plan.zarr", Path(tmp) / f"report{call}", run / "release.zarr", run / "data.zarr",
                          run / "estimate.zarr", verified=True)
        calls.append({"cpu": time.process_time() - cpu, "wall": time.perf_counter() - wall, "figures": inside[0]})
print(json.dumps(calls))
"""


def measure(tree: Path, run: Path) -> list[dict]:
    """The two calls' figures of one fresh process in ``tree``."""
    return child_json(tree, CHILD, [str(run)], "the report")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("rundir", type=Path, help="a distfit run directory with every store")
    parser.add_argument("--reference", type=Path, required=True, help="the reference tree's root")
    parser.add_argument("--repeat", type=int, default=3, help="processes per tree (default 3)")
    args = parser.parse_args()
    run = args.rundir.resolve()
    trees = {"this tree": ROOT, "reference": args.reference.resolve()}
    print(f"report of {run}; this tree {ROOT}, reference {trees['reference']}; load before {load()}", flush=True)
    samples: dict[str, list[list[dict]]] = {name: [] for name in trees}
    for _ in range(args.repeat):
        for name, tree in trees.items():
            samples[name].append(measure(tree, run))
    print(f"{'tree':10s} {'call':6s} {'CPU-s best':>10s} {'median':>7s} {'wall best':>9s} {'median':>7s} "
          f"{'figures CPU-s':>13s} {'CPU ratio':>9s} {'figures ratio':>13s}")
    for call, label in enumerate(("first", "second")):
        medians = {name: statistics.median(s[call]["cpu"] for s in runs) for name, runs in samples.items()}
        figures = {name: statistics.median(s[call]["figures"] for s in runs) for name, runs in samples.items()}
        for name, runs in samples.items():
            cpus, walls = [s[call]["cpu"] for s in runs], [s[call]["wall"] for s in runs]
            print(f"{name:10s} {label:6s} {min(cpus):10.2f} {medians[name]:7.2f} {min(walls):9.2f} "
                  f"{statistics.median(walls):7.2f} {figures[name]:13.2f} {medians[name] / medians['reference']:8.2f}x "
                  f"{figures[name] / figures['reference']:12.2f}x")
    print(f"load after {load()}")


if __name__ == "__main__":
    main()
