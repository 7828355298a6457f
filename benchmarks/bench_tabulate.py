"""What tabulating Adult into a marginals store costs (``tabulate_microdata``): this tree beside a
reference tree.

Usage::

    python benchmarks/bench_tabulate.py --reference TREE [--repeat 3] [--no-fsync]
        [--spec pipelines/adult.yaml] [--data pipelines/data/adult.csv]

``TREE`` is another checkout of distfit (e.g. ``git worktree add /tmp/ref main``). Each
measurement is a fresh ``python`` process started from the tree's root with that root first on
``sys.path``, tabulating ``--data`` for ``--spec`` (Adult: 32,561 rows, one unit, 364 cliques:
364 marginals and 364 label arrays) in this process, one task at a time, as ``distfit run``
does for a one-partition source, into a temporary directory, fsynced as the command line does
(``--no-fsync``: as the tests do); runs interleaved (this tree, reference, ...) so that load
drifts hit both alike. Printed per tree: the best and median CPU-seconds of the call
(``time.process_time``: every thread, zarr's event loop included) and wall, the median CPU of
its phases (the source opened: ``dask.dataframe``'s import; the scan; the arrays laid out; the
merge that writes the counts; the seal: digests, checksum, fsync), this tree's medians over the
reference's, the checksum of the store each wrote (the same data must give the same checksum)
and the load average before and after.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import child_json, load  # noqa: E402

#: Run in the child, from the tree's root: one tabulation, timed whole and by phase (functions
#: every tree since session 21 has under these names; the seal is the rest of the call).
CHILD = r"""
import io, json, sys, tempfile, time
from pathlib import Path
import distfit.data.microdata as md

spec, data, fsync = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
phases = {}

def timing(name, function):
    def timed(*args, **kwargs):
        start = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            phases[name] = phases.get(name, 0.0) + time.process_time() - start
    return timed

for name, label in [("_open_source", "open"), ("_run_scans", "scan"), ("create_marginals", "layout"),
                    ("_merge_chunk", "merge")]:
    setattr(md, name, timing(label, getattr(md, name)))
with tempfile.TemporaryDirectory(prefix="bench-tabulate-") as tmp:
    cpu, wall = time.process_time(), time.perf_counter()
    out = md.tabulate_microdata(spec, data, Path(tmp) / "data.zarr", fsync=fsync, log=io.StringIO())
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    checksum = json.loads((out / "zarr.json").read_text())["attributes"]["checksum"]
phases["seal"] = cpu - sum(phases.values())
print(json.dumps({"cpu": cpu, "wall": wall, "phases": phases, "checksum": checksum}))
"""
PHASES = ("open", "scan", "layout", "merge", "seal")


def measure(tree: Path, spec: Path, data: Path, fsync: bool) -> dict:
    """One fresh process's tabulation in ``tree``."""
    return child_json(tree, CHILD, [str(spec), str(data), "1" if fsync else "0"], "the tabulation")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", type=Path, required=True, help="the reference tree's root")
    parser.add_argument("--repeat", type=int, default=3, help="processes per tree (default 3)")
    parser.add_argument("--no-fsync", action="store_true", help="tabulate without fsync (as the tests do)")
    parser.add_argument("--spec", type=Path, default=ROOT / "pipelines" / "adult.yaml")
    parser.add_argument("--data", type=Path, default=ROOT / "pipelines" / "data" / "adult.csv")
    args = parser.parse_args()
    trees = {"this tree": ROOT, "reference": args.reference.resolve()}
    print(f"tabulate {args.data} for {args.spec.name}, fsync {'off' if args.no_fsync else 'on'}; this tree {ROOT}, "
          f"reference {trees['reference']}; load before {load()}", flush=True)
    runs: dict[str, list[dict]] = {name: [] for name in trees}
    for _ in range(args.repeat):
        for name, tree in trees.items():
            runs[name].append(measure(tree, args.spec.resolve(), args.data.resolve(), not args.no_fsync))
    medians = {name: statistics.median(r["cpu"] for r in rs) for name, rs in runs.items()}
    print(f"{'tree':10s} {'CPU-s best':>10s} {'median':>7s} {'wall best':>9s} {'median':>7s} {'CPU ratio':>9s}  "
          + " ".join(f"{p:>6s}" for p in PHASES) + "  checksum")
    for name, rs in runs.items():
        cpus, walls = [r["cpu"] for r in rs], [r["wall"] for r in rs]
        phases = " ".join(f"{statistics.median(r['phases'].get(p, 0.0) for r in rs):6.2f}" for p in PHASES)
        checksums = sorted({r["checksum"][:19] for r in rs})
        print(f"{name:10s} {min(cpus):10.2f} {medians[name]:7.2f} {min(walls):9.2f} {statistics.median(walls):7.2f} "
              f"{medians[name] / medians['reference']:8.2f}x  {phases}  {','.join(checksums)}")
    print(f"load after {load()}")


if __name__ == "__main__":
    main()
