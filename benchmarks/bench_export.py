"""Export throughput: ``run_export`` of a release (or its estimate) beside just reading the same arrays.

Usage::

    python benchmarks/bench_export.py [--units 1000000] [--spec pipelines/pl94.yaml] [--workers 2]
                                      [--estimate] [--repeat 1] [--workdir DIR] [--keep-data]

Plans the spec (serial), synthesises N unit histograms and releases them (``--workers`` local
worker processes; with ``--estimate`` also estimates the release and exports the estimate);
none of that is timed as the benchmark. Then, each in a fresh spawned process whose peak RSS is
sampled every 50 ms (:class:`benchmarks.bench_release.PeakRSS`) and whose CPU seconds (user +
system, every thread: pyarrow's writers) are counted:

* **read**: the reference: the same arrays the export reads, chunk by chunk in the store's own
  chunking (the answers or estimates, the unit ids; an estimate's cells and ``solve/converged``
  too), nothing else;
* **verify**: the store's and the plan's checksums recomputed alone (:func:`verify_release` /
  :func:`verify_estimate`: the root and every chunk; :func:`read_verified_plan`): what the export
  verifies, the plan first and the store chunk by chunk as it reads it;
* **export**: ``run_export(store, DIR)``, from the sealed store to the renamed directory (verify,
  stream every table to CSV and Parquet, the data dictionary, fsync, rename).

Printed: seconds, rows/s and units/s, CPU seconds, peak RSS of each, and the bytes written per
unit (CSV and Parquet apart). At PL94 every unit is 319 rows, so 1,000,000 units are 319M rows
(about 46 GB of CSV, 2.5 GB of Parquet): check the free disk first.
"""
from __future__ import annotations

import argparse
import io
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from benchmarks.common import MIB, load, measured  # noqa: E402
from distfit.estimate.job import run_estimate  # noqa: E402
from distfit.export.job import run_export  # noqa: E402
from distfit.plan.job import run_plan  # noqa: E402
from distfit.release.job import run_release  # noqa: E402
from distfit.runtime.placement import Placement  # noqa: E402
from distfit.spec.parse import load_spec  # noqa: E402
from distfit.stores.data import write_synthetic  # noqa: E402
from distfit.stores.estimate import read_estimate, verify_estimate  # noqa: E402
from distfit.stores.plan import read_verified_plan  # noqa: E402
from distfit.stores.release import read_release, verify_release  # noqa: E402


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def read_reference(path: str, estimate: bool) -> tuple[float, float]:
    """``(seconds, CPU seconds)`` of reading what the export reads, chunk by chunk."""
    cpu, start = _cpu(), time.perf_counter()
    store = read_estimate(path) if estimate else read_release(path)
    values = store.estimates if estimate else store.answers
    units, chunk = int(store.attrs["units"]), int(store.attrs["chunk_units"])
    total = 0.0
    for a in range(0, units, chunk):
        b = min(a + chunk, units)
        total += float(np.asarray(values[a:b]).sum())
        np.asarray(store.unit_ids[a:b])
        if estimate:
            np.asarray(store.cells[a:b])
            np.asarray(store.converged[a:b])
    return time.perf_counter() - start, _cpu() - cpu


def verify(path: str, estimate: bool) -> tuple[float, float]:
    """``(seconds, CPU seconds)`` of the export's verification of the store and its plan."""
    cpu, start = _cpu(), time.perf_counter()
    ok, _stored, recomputed = (verify_estimate if estimate else verify_release)(path)
    assert ok, recomputed
    read_verified_plan((read_estimate if estimate else read_release)(path).attrs["plan_path"])
    return time.perf_counter() - start, _cpu() - cpu


def export(path: str, out: str) -> tuple[float, float, int, dict[str, int]]:
    """``(seconds, CPU seconds, rows, {suffix: bytes})`` of ``run_export``."""
    cpu, start = _cpu(), time.perf_counter()
    result = run_export(path, out)
    seconds, used = time.perf_counter() - start, _cpu() - cpu
    sizes: dict[str, int] = {}
    for f in Path(out).iterdir():
        sizes[f.suffix] = sizes.get(f.suffix, 0) + f.stat().st_size
    return seconds, used, result.rows, sizes


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=1_000_000)
    parser.add_argument("--spec", default=str(ROOT / "pipelines" / "pl94.yaml"))
    parser.add_argument("--workers", type=int, default=2, help="local workers of the release and estimate")
    parser.add_argument("--estimate", action="store_true", help="export the release's estimate instead")
    parser.add_argument("--repeat", type=int, default=1)
    parser.add_argument("--workdir", default=None, help="default: a new temporary directory (deleted)")
    parser.add_argument("--keep-data", action="store_true", help="keep (and reuse) the stores in --workdir")
    args = parser.parse_args(argv)
    if args.keep_data and args.workdir is None:
        parser.error("--keep-data needs --workdir")
    own = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-export-"))
    workdir.mkdir(parents=True, exist_ok=True)
    n = args.units
    plan, data = str(workdir / "plan.zarr"), str(workdir / f"data-{n}.zarr")
    release, estimate = str(workdir / f"release-{n}.zarr"), str(workdir / f"estimate-{n}.zarr")
    source = estimate if args.estimate else release
    try:
        if not (args.keep_data and Path(source).exists()):
            for path in (plan, data, release, estimate):
                shutil.rmtree(path, ignore_errors=True)
            start = time.perf_counter()
            run_plan(load_spec(args.spec), plan, placement=Placement(serial=True), log=io.StringIO())
            write_synthetic(args.spec, n, data, seed=n, fsync=False)
            placement = Placement(workers=args.workers)
            run_release(plan, data, release, placement=placement, seed=n, log=io.StringIO(), fsync=False)
            if args.estimate:
                run_estimate(plan, release, estimate, placement=placement, log=io.StringIO(), fsync=False)
            print(f"N={n}: plan, data, release{', estimate' if args.estimate else ''} made in "
                  f"{time.perf_counter() - start:.0f} s; workdir {workdir}", flush=True)
        for rep in range(args.repeat):
            out = str(workdir / "tables")
            shutil.rmtree(out, ignore_errors=True)
            before = load()
            (r_seconds, r_cpu), mem_r = measured(read_reference, source, args.estimate)
            (v_seconds, v_cpu), mem_v = measured(verify, source, args.estimate)
            (e_seconds, e_cpu, rows, sizes), mem_e = measured(export, source, out)
            shutil.rmtree(out, ignore_errors=True)
            kind = "estimate" if args.estimate else "release"
            print(f"\nN={n} {kind}, run {rep + 1}/{args.repeat} (load before {before}, {os.cpu_count()} CPUs): "
                  f"{rows:,} rows ({rows // n} per unit)")
            print(f"{'':>8} {'seconds':>8} {'CPU s':>7} {'units/s':>9} {'rows/s':>11} {'peak RSS MiB':>12}")
            for name, seconds, cpu, memory in (("read", r_seconds, r_cpu, mem_r), ("verify", v_seconds, v_cpu, mem_v),
                                               ("export", e_seconds, e_cpu, mem_e)):
                print(f"{name:>8} {seconds:>8.1f} {cpu:>7.1f} {n / seconds:>9,.0f} {rows / seconds:>11,.0f} "
                      f"{memory.driver / MIB:>12.0f}")
            print(f"export / read: {e_seconds / r_seconds:.1f}x the time, {e_cpu / r_cpu:.1f}x the CPU; written "
                  + ", ".join(f"{suffix} {sizes.get(suffix, 0) / n:,.0f} B/unit ({sizes.get(suffix, 0) / MIB / e_seconds:,.0f}"
                              " MiB/s)" for suffix in (".csv", ".parquet")), flush=True)
    finally:
        if own or not args.keep_data:
            for path in (release, estimate, data, plan):
                shutil.rmtree(path, ignore_errors=True)
        if own:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
