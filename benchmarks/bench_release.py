"""Release throughput: ``run_release`` on W local worker processes against the minimal loop.

Usage::

    python benchmarks/bench_release.py [--units 100000 1000000] [--workers 2] [--repeat 3]
                                       [--workdir DIR] [--keep-data]

Plans ``pipelines/pl94.yaml`` once (``run_plan``, serial: one block, 252 cells, 319 queries)
into the workdir and, for each N, synthesises N unit histograms (``write_synthetic``; timed
apart, not part of the comparison; kept with ``--keep-data --workdir DIR`` for the next
session). Then, ``--repeat`` times, alternating:

* **distfit**: ``run_release(plan, data, out, placement=Placement(workers=W))``, counted from the
  data store to the sealed release: its own local cluster's start-up, the audit, the data
  checks, the store layout, the chunk tasks, the seal (checksum and fsync) and the cluster's
  shutdown;
* **the loop**: the minimal single-process numpy loop doing the same arithmetic (the
  reference of issue 16): per 10,000 units, read the counts ``x`` from the data store,
  ``z = xi chol(Sigma)^T`` with ``xi`` from ``default_rng`` per chunk, answers
  ``(x B^T + z) L^T``, written to a Zarr v3 array (units x m, uncompressed, 10,000-unit
  chunks). Nothing else: no validation, no unit ids, no query sums (one block covering every
  attribute: the block's rows are the queries), no checksum, no fsync; one BLAS thread (the
  loop on one core, as each of distfit's tasks runs; before session 15 numpy's default, a thread
  a core, whose spinning doubled its CPU-seconds). Its Cholesky factor is computed once.

Printed per N: the best and the spread (min-max) of each, units/s at the best, the ratio
distfit / loop of the bests (and the range of the per-pair ratios), the CPU-seconds (user +
system) of each run's process and its reaped workers and their ratio (issue 31's measure: it
holds on a shared machine where wall times do not), peak memory (sampled RSS,
every 50 ms: the driver, the largest worker process, and the loop), bytes written per unit
(the files of each store), and the load average (``os.getloadavg``) before each run. Each run
is a fresh spawned process, so its peak RSS is its own. With
two or more N, the fixed and per-unit costs of distfit's best times (a line through the two
largest N) extrapolate to 8M units (the US census blocks). Stores are deleted after each run.
"""
from __future__ import annotations

import argparse
import io
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import scipy.linalg  # noqa: E402
import zarr  # noqa: E402
from threadpoolctl import threadpool_limits  # noqa: E402

from benchmarks.common import MIB, cpu_seconds, load, measured, parse_options, planned_workdir, spread, store_bytes, synthesised  # noqa: E402
from distfit.release.job import run_release  # noqa: E402
from distfit.stores.data import read_histograms  # noqa: E402
from distfit.stores.plan import read_plan  # noqa: E402
from distfit.runtime.placement import Placement  # noqa: E402

LOOP_CHUNK = 10_000
EXTRAPOLATE_TO = 8_000_000


def minimal_loop(plan_path: str, data_path: str, out: str, seed: int) -> float:
    """The reference loop (module docstring); returns seconds (plan read to last write)."""
    start = time.perf_counter()
    plan = read_plan(plan_path)
    (block_id,) = plan.block_ids
    block = plan.block(block_id)
    if len(block.attributes) != len(plan.attrs["schema"]["attributes"]):
        raise SystemExit("the minimal loop needs one block on every attribute (PL94)")
    basis_t, recon_t = block.basis.T, block.recon.T
    chol_t = scipy.linalg.cholesky(block.sigma, lower=True).T
    data = read_histograms(data_path)
    units = data.units
    root = zarr.open_group(store=out, mode="w-", zarr_format=3)
    answers = root.create_array("answers", shape=(units, recon_t.shape[1]), dtype=np.float64,
                                chunks=(LOOP_CHUNK, recon_t.shape[1]), compressors=None)
    for chunk, lo in enumerate(range(0, units, LOOP_CHUNK)):
        hi = min(lo + LOOP_CHUNK, units)
        x = np.asarray(data.counts[lo:hi], dtype=np.float64)
        rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0, chunk)))
        z = rng.standard_normal((hi - lo, chol_t.shape[0])) @ chol_t
        answers[lo:hi] = (x @ basis_t + z) @ recon_t
    return time.perf_counter() - start


def _distfit(plan_path: str, data_path: str, out: str, workers: int) -> tuple[float, float]:
    cpu = cpu_seconds()
    seconds = run_release(plan_path, data_path, out, placement=Placement(workers=workers), log=io.StringIO()).seconds
    return seconds, cpu_seconds() - cpu


def _loop(plan_path: str, data_path: str, out: str, seed: int) -> tuple[float, float]:
    # one BLAS thread, as each of distfit's worker tasks has: with numpy's default (one thread
    # a core) the idle threads' spinning doubled the loop's CPU-seconds on 2 cores
    cpu = cpu_seconds()
    with threadpool_limits(limits=1, user_api="blas"):
        seconds = minimal_loop(plan_path, data_path, out, seed)
    return seconds, cpu_seconds() - cpu


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    args = parse_options(parser, argv, units=[100_000, 1_000_000], repeat=3)
    rows = []
    with planned_workdir(args, "bench-release-") as workdir:
        plan_path = workdir.plan_path
        for n in args.units:
            out, loop_out = str(workdir.path / f"release-{n}.zarr"), str(workdir.path / f"loop-{n}.zarr")
            for p in (out, loop_out):
                shutil.rmtree(p, ignore_errors=True)
            data_path = synthesised(args, workdir.path, n)
            runs = []
            for rep in range(args.repeat):
                before_d = load()
                (seconds, cpu), mem_d = measured(_distfit, plan_path, data_path, out, args.workers)
                out_bytes = store_bytes(out)
                shutil.rmtree(out)
                before_l = load()
                (loop, loop_cpu), mem_l = measured(_loop, plan_path, data_path, loop_out, 12345 + rep)
                loop_bytes = store_bytes(loop_out)
                shutil.rmtree(loop_out)
                runs.append(dict(distfit=seconds, loop=loop, cpu=cpu, loop_cpu=loop_cpu, drv=mem_d.driver / MIB, wrk=mem_d.worker / MIB,
                                 loop_mib=mem_l.driver / MIB, bytes=out_bytes / n, loop_bytes=loop_bytes / n))
                print(f"N={n} run {rep + 1}/{args.repeat}: distfit {seconds:.2f} s, {cpu:.2f} CPU-s (load {before_d}), "
                      f"loop {loop:.2f} s, {loop_cpu:.2f} CPU-s (load {before_l}), ratio {seconds / loop:.2f}, "
                      f"CPU ratio {cpu / loop_cpu:.2f}; peak RSS driver "
                      f"{mem_d.driver / MIB:.0f} MiB, worker {mem_d.worker / MIB:.0f} MiB, loop "
                      f"{mem_l.driver / MIB:.0f} MiB", flush=True)
            if not args.keep_data:
                shutil.rmtree(data_path)
            rows.append((n, runs))

    print()
    print(f"best (min-max) of {args.repeat} run(s) each, alternating; distfit on {args.workers} worker processes")
    print(f"{'units':>9} {'distfit s':>17} {'units/s':>8} {'loop s':>17} {'units/s':>8} {'ratio':>5} "
          f"{'(pairs)':>11} {'CPU-s':>7} {'loop CPU':>8} {'CPU ratio':>9} {'drv MiB':>7} {'wrk MiB':>7} {'loop MiB':>8} {'B/unit':>7} {'loop B/unit':>11}")
    for n, runs in rows:
        d = [r["distfit"] for r in runs]
        lp = [r["loop"] for r in runs]
        pairs = [r["distfit"] / r["loop"] for r in runs]
        c, lc = [r["cpu"] for r in runs], [r["loop_cpu"] for r in runs]
        print(f"{n:>9} {spread(d, '.2f'):>17} {n / min(d):>8.0f} {spread(lp, '.2f'):>17} {n / min(lp):>8.0f} "
              f"{min(d) / min(lp):>5.2f} {min(pairs):>5.2f}-{max(pairs):<5.2f} {min(c):>7.2f} {min(lc):>8.2f} "
              f"{min(c) / min(lc):>9.2f} {max(r['drv'] for r in runs):>7.0f} "
              f"{max(r['wrk'] for r in runs):>7.0f} {max(r['loop_mib'] for r in runs):>8.0f} "
              f"{runs[0]['bytes']:>7.0f} {runs[0]['loop_bytes']:>11.0f}")
    print("ratio = best distfit / best loop (goal <= 0.7 at 1M); (pairs) = range of distfit / loop within each run; "
          "CPU-s = user + system seconds of the process and its workers (best of the runs; goal: CPU ratio <= 1.2, "
          "issue 31); MiB = sampled peak RSS (driver, largest worker, loop); B/unit = bytes of the store's files per unit")
    if len(rows) >= 2:
        (n1, r1), (n2, r2) = rows[-2], rows[-1]
        t1, t2 = min(r["distfit"] for r in r1), min(r["distfit"] for r in r2)
        per_unit = (t2 - t1) / (n2 - n1)
        fixed = t2 - per_unit * n2
        print(f"distfit = {fixed:.2f} s + {per_unit * 1e6:.2f} s per 1M units (line through N={n1}, {n2}); "
              f"{EXTRAPOLATE_TO:,} units extrapolated: {fixed + per_unit * EXTRAPOLATE_TO:.0f} s (goal <= 90 s)")
        slopes = {}
        for key in ("cpu", "loop_cpu"):
            c1, c2 = min(r[key] for r in r1), min(r[key] for r in r2)
            slopes[key] = ((c2 - c1) / (n2 - n1), c2 - (c2 - c1) / (n2 - n1) * n2)
        (d_unit, d_fixed), (l_unit, l_fixed) = slopes["cpu"], slopes["loop_cpu"]
        print(f"CPU-s: distfit {d_fixed:.2f} + {d_unit * 1e6:.2f} per 1M units, loop {l_fixed:.2f} + "
              f"{l_unit * 1e6:.2f} per 1M units: CPU per unit {d_unit / l_unit:.2f}x the loop's (goal <= 1.2, issue 31)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
