"""Estimate against release: ``run_estimate`` and ``run_release`` of the same units, side by side.

Usage::

    python benchmarks/bench_estimate.py [--units 20000] [--workers 2] [--repeat 1] [--integer]
                                        [--spec pipelines/pl94.yaml] [--workdir DIR] [--keep-data]

The documented full figure is ``--units 1000000`` (issue 11: PL94, 1,000,000 units, estimate
time <= release time, memory flat); the default is smaller for a quick run. Plans the spec once
(``run_plan``, serial) into the workdir and, for each N, synthesises N unit histograms
(``write_synthetic``; timed apart). Then, ``--repeat`` times:

* **release**: ``run_release(plan, data, release, placement=Placement(workers=W))``, from the
  data store to the sealed release (its own local cluster's start-up and shutdown, the audit,
  the chunk tasks, the seal);
* **estimate**: ``run_estimate(plan, release, estimate, placement=Placement(workers=W))`` of
  that release, from the sealed release to the sealed estimate (its own local cluster, the plan check, one task per
  release chunk: recover the measurements, project every unit onto x >= 0, W x; the seal).

Each run is a fresh spawned process whose peak RSS (driver, and the largest worker process) is
sampled every 50 ms (:class:`benchmarks.common.PeakRSS`). Printed per N: both times,
units/s, the ratio estimate / release (goal <= 1), peak RSS of each, bytes written per unit,
the estimate's fit (iterations, unconverged units), the load average before each run, and the
CPU seconds each run used (the driver and its worker processes, user + system: on a shared,
loaded machine the wall times mostly measure the other load, the CPU seconds much less).

Then where a chunk's time goes (:func:`pieces`, the last N's release, in this process, one BLAS
thread, CPU time per unit, best of 3): read the block answers
(:func:`distfit.estimate.job.chunk_answers`, as a chunk task does), project them
(:func:`distfit.estimate.projection.project_nonnegative` with ``answers=True``: the linear term
in one product from the answers, as ``distfit estimate`` does), ``W x``
(:func:`distfit.estimate.measurements.published_estimates`), and what that compute alone costs
N units on the workers; the rest of the estimate's time is the cluster's start, writing,
fsyncing and hashing the store, and the seal.
"""
from __future__ import annotations

import argparse
import io
import resource
import shutil
import sys
import time
from pathlib import Path


ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.common import MIB, load, measured, parse_options, planned_workdir, spread, store_bytes, synthesised  # noqa: E402
from distfit.estimate.job import chunk_answers, run_estimate  # noqa: E402
from distfit.estimate.measurements import (  # noqa: E402
    measurement_model,
    published_estimates,
    workload_kind,
)
from distfit.estimate.projection import project_nonnegative  # noqa: E402
from distfit.release.job import run_release  # noqa: E402
from distfit.stores.estimate import read_estimate  # noqa: E402
from distfit.stores.plan import read_plan  # noqa: E402
from distfit.stores.release import read_release  # noqa: E402
from distfit.runtime.threads import blas_limit  # noqa: E402
from distfit.runtime.placement import Placement


def _cpu() -> float:
    """User + system CPU seconds of this process and of its waited-for descendants (the local
    cluster's worker processes, once it has shut them down)."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def release(plan_path: str, data_path: str, out: str, workers: int) -> tuple[float, float]:
    """``(seconds, CPU seconds)`` of a release (run in a fresh process by ``measured``)."""
    cpu = _cpu()
    seconds = run_release(plan_path, data_path, out, placement=Placement(workers=workers), log=io.StringIO()).seconds
    return seconds, _cpu() - cpu


def estimate(plan_path: str, release_path: str, out: str, workers: int, integer: bool) -> tuple[float, float]:
    """``(seconds, CPU seconds)`` of an estimate (run in a fresh process by ``measured``)."""
    cpu = _cpu()
    seconds = run_estimate(plan_path, release_path, out, placement=Placement(workers=workers), integer=integer,
                           log=io.StringIO()).seconds
    return seconds, _cpu() - cpu


def pieces(plan_path: str, release_path: str, repeat: int = 3) -> dict[str, float]:
    """CPU microseconds per unit of each stage of one chunk (the release's first), best of
    ``repeat``, one BLAS thread (module docstring); ``units``: the chunk's."""
    release, plan = read_release(release_path), read_plan(plan_path)
    n = min(int(release.attrs["chunk_units"]), int(release.attrs["units"]))
    out: dict[str, float] = {"units": n}
    with blas_limit():
        model = measurement_model(plan)
        kind = workload_kind(model)

        def read():
            return chunk_answers(release, model, 0, n)

        stages = [("read", lambda _: read()), ("project", lambda a: project_nonnegative(model, a, answers=True).x),
                  ("W x", lambda x: published_estimates(model, x, kind))]
        value = None
        for name, stage in stages:
            best = float("inf")
            for _ in range(repeat + (name == "project")):  # one more: the compiled kernel loads once
                start = time.process_time()
                result = stage(value)
                best = min(best, time.process_time() - start)
            out[name], value = best / n * 1e6, result
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--integer", action="store_true", help="integer estimates")
    args = parse_options(parser, argv, units=[20_000], repeat=1)
    rows = []
    with planned_workdir(args, "bench-estimate-") as workdir:
        plan_path = workdir.plan_path
        for n in args.units:
            rel, est = str(workdir.path / f"release-{n}.zarr"), str(workdir.path / f"estimate-{n}.zarr")
            data_path = synthesised(args, workdir.path, n)
            runs = []
            for rep in range(args.repeat):
                for p in (rel, est):
                    shutil.rmtree(p, ignore_errors=True)
                before_r = load()
                (r_seconds, r_cpu), mem_r = measured(release, plan_path, data_path, rel, args.workers)
                before_e = load()
                (e_seconds, e_cpu), mem_e = measured(estimate, plan_path, rel, est, args.workers, args.integer)
                fit = read_estimate(est).attrs["fit"]
                if rep == args.repeat - 1 and n == args.units[-1]:
                    cpu = pieces(plan_path, rel)
                runs.append(dict(release=r_seconds, estimate=e_seconds, r_cpu=r_cpu, e_cpu=e_cpu,
                                 r_drv=mem_r.driver / MIB,
                                 r_wrk=mem_r.worker / MIB, e_drv=mem_e.driver / MIB, e_wrk=mem_e.worker / MIB,
                                 r_bytes=store_bytes(rel) / n, e_bytes=store_bytes(est) / n, fit=fit))
                print(f"N={n} run {rep + 1}/{args.repeat}: release {r_seconds:.2f} s (load {before_r}), estimate "
                      f"{e_seconds:.2f} s (load {before_e}), ratio {e_seconds / r_seconds:.2f}; CPU s release "
                      f"{r_cpu:.1f}, estimate {e_cpu:.1f}, ratio {e_cpu / r_cpu:.2f}; peak RSS release "
                      f"driver {mem_r.driver / MIB:.0f} / worker {mem_r.worker / MIB:.0f} MiB, estimate driver "
                      f"{mem_e.driver / MIB:.0f} / worker {mem_e.worker / MIB:.0f} MiB; fit {fit}", flush=True)
            for p in (rel, est):
                shutil.rmtree(p, ignore_errors=True)
            if not args.keep_data:
                shutil.rmtree(data_path)
            rows.append((n, runs))

    print()
    print(f"best (min-max) of {args.repeat} run(s) each; both on {args.workers} worker processes"
          f"{', integer estimates' if args.integer else ''}")
    print(f"{'units':>9} {'release s':>17} {'units/s':>8} {'estimate s':>17} {'units/s':>8} {'ratio':>5} "
          f"{'rel drv/wrk MiB':>15} {'est drv/wrk MiB':>15} {'rel B/unit':>10} {'est B/unit':>10}")
    for n, runs in rows:
        r = [x["release"] for x in runs]
        e = [x["estimate"] for x in runs]
        print(f"{n:>9} {spread(r, '.2f'):>17} {n / min(r):>8.0f} {spread(e, '.2f'):>17} {n / min(e):>8.0f} "
              f"{min(e) / min(r):>5.2f} "
              f"{max(x['r_drv'] for x in runs):>7.0f}/{max(x['r_wrk'] for x in runs):<7.0f} "
              f"{max(x['e_drv'] for x in runs):>7.0f}/{max(x['e_wrk'] for x in runs):<7.0f} "
              f"{runs[0]['r_bytes']:>10.0f} {runs[0]['e_bytes']:>10.0f}")
    for n, runs in rows:
        r, e = min(x["r_cpu"] for x in runs), min(x["e_cpu"] for x in runs)
        print(f"{n:>9} CPU seconds (driver and workers, user + system): release {r:.1f}, estimate {e:.1f}, "
              f"ratio {e / r:.2f}")
    print("ratio = best estimate / best release (goal <= 1 at 1M PL94 units); MiB = sampled peak RSS (driver / "
          "largest worker); B/unit = bytes of the store's files per unit; CPU seconds: what both cost on a busy "
          "machine, where wall times mostly measure the other load")
    n, runs = rows[-1]
    compute = sum(v for k, v in cpu.items() if k != "units")
    print(f"where a chunk's time goes (CPU us/unit, one chunk of {cpu['units']} units, one thread): "
          + ", ".join(f"{k} {v:.1f}" for k, v in cpu.items() if k != "units")
          + f"; sum {compute:.1f} us = {n * compute / 1e6 / args.workers:.2f} s of the estimate's "
          f"{min(x['estimate'] for x in runs):.2f} s on {args.workers} workers (the rest: cluster start, "
          "writing, fsync and hashing, seal)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
