"""The cost of verifying inputs (issue 28): a release and an estimate with and without the
verification of the store they read (its root by the driver, each chunk by the task that
reads it, against the store's per-chunk digests).

Usage::

    python benchmarks/bench_verify.py [--units 1000000] [--workers 2] [--repeat 2] [--workdir DIR]
                                      [--part all|jobs|readers]

Plans ``pipelines/pl94.yaml`` (serial) and synthesises N unit histograms once (``write_synthetic``:
the data store is sealed as it is written). Then, ``--repeat`` times, alternating (the verified
run first, then the unverified one first, and so on), each in a fresh spawned process on its own
local cluster of W workers:

* **release, verified**: ``run_release(plan, data, out)`` as ``distfit release`` runs it: the
  data store's root checksum recomputed by the driver (``open_data(verify=True)``) before the
  release store is laid out, and each chunk of counts and ids checked against its digest by the
  task that reads it;
* **release, not verified**: the same with ``data_checksum=`` the data's stored checksum (what
  ``distfit run`` passes for data it has just written): no hash of the data;
* **estimate, verified / not verified**: ``run_estimate(plan, release, out)``; not verified is
  the same with ``release_checksum=`` the release's stored checksum: no hash of the release.

Printed per pair: wall seconds and CPU-seconds (the process and its reaped children: the
workers), the ratio verified / not verified of the bests, and the load average before each run;
and, apart, the CPU-seconds of hashing alone the chunks the tasks read (BLAKE3, as the stores
do, and SHA-256 for comparison), and the whole verification alone (wall, CPU: the root and every chunk, what
``verify_release`` does: what a reader that read a store whole did first) on a warm page cache. Stores are deleted
after each run.

**Readers** (``--part readers``; the release and its estimate, made once, kept in the workdir):
reading what the export reads and nothing else (``read release``, ``read estimate``: the figures
and the unit ids, chunk by chunk), ``distfit export`` of the release, of the estimate, and
``distfit report`` of both (``verified=True``: the plan not hashed, the same in every mode;
``--readers`` chooses among them), each in a fresh spawned process, in three modes of
opening the release and the estimate (the rest of the command unchanged):

* **unchecked**: ``read`` (no verification at all: the floor);
* **whole first**: ``read_verified`` (the root and every chunk hashed in a pass of its own, then
  the store read again unchecked: what export, report and the levels did before);
* **as read**: ``read_sealed`` (the root, then each chunk hashed as it is read, in the same read:
  what they do now).

Printed: wall and CPU-seconds of each (best of ``--repeat``, the modes alternated), the load
average before each run, and each mode's CPU over the unchecked one's.
"""
from __future__ import annotations

import argparse
import hashlib
import io
import multiprocessing
import os
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from distfit.estimate.job import run_estimate  # noqa: E402
from distfit.plan.job import run_plan  # noqa: E402
from distfit.release.job import run_release  # noqa: E402
from distfit.runtime.placement import Placement  # noqa: E402
from distfit.spec.parse import load_spec  # noqa: E402
import numpy as np  # noqa: E402

from distfit.stores.checksum import chunk_digest  # noqa: E402
from distfit.stores.data import open_data, write_synthetic  # noqa: E402
from distfit.stores.estimate import ESTIMATE  # noqa: E402
from distfit.stores.release import RELEASE, read_release, verify_release  # noqa: E402


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _job(kind: str, verified: bool, paths: dict, workers: int, queue) -> None:
    """One run in this (spawned) process: put (wall, cpu) on ``queue``."""
    placement = Placement(workers=workers)
    log = io.StringIO()
    start_wall, start_cpu = time.perf_counter(), _cpu()
    if kind == "release":
        checksum = None if verified else open_data(paths["data"]).attrs["checksum"]
        run_release(paths["plan"], paths["data"], paths["out"], placement=placement, log=log, data_checksum=checksum)
    else:
        checksum = None if verified else read_release(paths["release"]).checksum
        run_estimate(paths["plan"], paths["release"], paths["out"], placement=placement, log=log,
                     release_checksum=checksum)
    queue.put((time.perf_counter() - start_wall, _cpu() - start_cpu))


def _pass(kind: str, paths: dict, queue) -> None:
    start_wall, start_cpu = time.perf_counter(), _cpu()
    if kind == "release":
        data = open_data(paths["data"], verify=True)
        for _start, _counts in data.iter_chunks():  # every chunk checked as read
            pass
        data.check_unit_ids()
    else:
        assert verify_release(paths["release"])[0]
    queue.put((time.perf_counter() - start_wall, _cpu() - start_cpu))


def _hashing(kind: str, paths: dict, queue) -> None:
    """CPU-seconds of hashing alone the chunks a job's tasks read and check (the data's counts
    and ids; the release's query answers and ids), each chunk read first (not timed), by BLAKE3
    (``chunk_digest``, what the stores use) and by SHA-256 over the same header and bytes."""
    if kind == "release":
        store = open_data(paths["data"])
        arrays = {"counts": store.counts, "unit_ids": store.unit_ids}
        step = store.chunk_units
    else:
        store = read_release(paths["release"])
        arrays = {"queries/answers": store.answers, "unit_ids": store.unit_ids}
        step = int(store.attrs["chunk_units"])
    spent = {"blake3": 0.0, "sha256": 0.0}
    for name, arr in arrays.items():
        for start in range(0, int(arr.shape[0]), step):
            values = np.ascontiguousarray(arr[start:start + step])
            began = time.process_time()
            chunk_digest(name, start, values)
            spent["blake3"] += time.process_time() - began
            began = time.process_time()
            hashlib.sha256(f"{name}\n{start}\n".encode()).update(memoryview(values).cast("B"))
            spent["sha256"] += time.process_time() - began
    queue.put((spent["blake3"], spent["sha256"]))


#: How the readers' modes open a release or an estimate (module docstring, "Readers").
READER_MODES = ("unchecked", "whole first", "as read")


def _reader(command: str, mode: str, paths: dict, queue) -> None:
    """One reader run in this (spawned) process, the release and the estimate opened the
    ``mode``'s way: put (wall, cpu) on ``queue``."""
    from distfit.export import job as export_job
    from distfit.export.job import run_export
    from distfit.report import page
    from distfit.report.page import write_report
    for kind, store in (("release", RELEASE), ("estimate", ESTIMATE)):
        opener = {"unchecked": store.read, "whole first": store.read_verified, "as read": store.read_sealed}[mode]
        for module in (export_job, page):  # the commands' one way of opening each kind
            setattr(module, f"read_sealed_{kind}", opener)
    start_wall, start_cpu = time.perf_counter(), _cpu()
    if command.startswith("read "):  # what the export reads, chunk by chunk, and nothing else
        kind = command.split()[1]
        store = getattr(export_job, f"read_sealed_{kind}")(paths[kind])
        values = store.answers if kind == "release" else store.estimates
        units, chunk = int(store.attrs["units"]), int(store.attrs["chunk_units"])
        for a in range(0, units, chunk):
            np.asarray(values[a:a + chunk])
            np.asarray(store.unit_ids[a:a + chunk])
    elif command == "report":
        write_report(paths["plan"], paths["out"], paths["release"], estimate_path=paths["estimate"], verified=True)
    else:
        run_export(paths[command.split()[1]], paths["out"], fsync=False)
    queue.put((time.perf_counter() - start_wall, _cpu() - start_cpu))


def _readers(paths: dict, repeat: int, commands: list[str]) -> None:
    for command in commands:
        runs: dict[str, list[tuple[float, float]]] = {mode: [] for mode in READER_MODES}
        for r in range(repeat):
            for mode in (READER_MODES if r % 2 == 0 else READER_MODES[::-1]):
                load = os.getloadavg()[0]
                wall, cpu = _spawned(_reader, command, mode, paths)
                shutil.rmtree(paths["out"], ignore_errors=True)
                runs[mode].append((wall, cpu))
                print(f"  {command:16s} {mode:12s} wall {wall:7.2f} s  CPU {cpu:7.2f} s  (load {load:.1f})")
        best = {mode: (min(w for w, _ in r), min(c for _, c in r)) for mode, r in runs.items()}
        floor = best["unchecked"][1]
        print(f"{command}: best CPU-s " + ", ".join(
            f"{mode} {cpu:.2f} ({cpu / floor - 1:+.1%})" for mode, (_wall, cpu) in best.items())
              + "; best wall s " + ", ".join(f"{mode} {wall:.2f}" for mode, (wall, _cpu) in best.items()))


def _spawned(target, *args) -> tuple[float, float]:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=target, args=(*args, queue))
    process.start()
    result = queue.get()
    process.join()
    if process.exitcode != 0:
        raise SystemExit(f"{target.__name__}{args[:2]} failed with exit code {process.exitcode}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=1_000_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--part", choices=("all", "jobs", "readers"), default="all")
    parser.add_argument("--readers", default="read release,read estimate,export release,export estimate,report",
                        help="the readers' commands (comma-separated)")
    args = parser.parse_args()
    work = args.workdir or Path(tempfile.mkdtemp(prefix="bench-verify-"))
    work.mkdir(parents=True, exist_ok=True)
    spec = load_spec(ROOT / "pipelines" / "pl94.yaml")
    plan, data, release = work / "plan.zarr", work / f"data-{args.units}.zarr", work / "release.zarr"
    if not plan.exists():
        run_plan(spec, str(plan), placement=Placement(serial=True), log=io.StringIO())
    if not data.exists():
        started = time.perf_counter()
        write_synthetic(spec, args.units, data, seed=1, fsync=False)
        print(f"synth {args.units:,} units (sealed as written): {time.perf_counter() - started:.1f} s")
    paths = {"plan": str(plan), "data": str(data), "release": str(release), "out": str(work / "out.zarr")}
    if not release.exists():
        _spawned(_job, "release", True, dict(paths, out=str(release)), args.workers)
    print(f"PL94, {args.units:,} units, {args.workers} workers, best of {args.repeat}")
    if args.part in ("all", "readers"):
        estimate = work / "estimate.zarr"
        if not estimate.exists():
            _spawned(_job, "estimate", True, dict(paths, out=str(estimate)), args.workers)
        _readers(dict(paths, estimate=str(estimate), out=str(work / "readers-out")), args.repeat,
                 args.readers.split(","))
    for kind in (("release", "estimate") if args.part in ("all", "jobs") else ()):
        runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
        for repeat in range(args.repeat):
            # alternated (verified first, then not verified first): whatever the run before leaves
            # (the output's deletion, the page cache) falls on each side alike
            for verified in ((True, False) if repeat % 2 == 0 else (False, True)):
                load = os.getloadavg()[0]
                wall, cpu = _spawned(_job, kind, verified, paths, args.workers)
                shutil.rmtree(paths["out"], ignore_errors=True)
                runs[verified].append((wall, cpu))
                print(f"  {kind:8s} {'verified' if verified else 'not verified':12s} wall {wall:7.2f} s  "
                      f"CPU {cpu:7.2f} s  (load {load:.1f})")
        best = {v: (min(w for w, _ in r), min(c for _, c in r)) for v, r in runs.items()}
        alone = _spawned(_pass, kind, paths)
        hashing = _spawned(_hashing, kind, paths)
        print(f"{kind}: verified / not verified = {best[True][0] / best[False][0]:.3f} wall, "
              f"{best[True][1] / best[False][1]:.3f} CPU (bests {best[True][0]:.2f} / {best[False][0]:.2f} s, "
              f"{best[True][1]:.2f} / {best[False][1]:.2f} CPU-s); the whole verification alone {alone[0]:.2f} s, "
              f"{alone[1]:.2f} CPU-s; hashing the chunks the tasks read {hashing[0]:.2f} CPU-s by BLAKE3 "
              f"({hashing[0] / best[False][1]:.1%} of the unverified job's CPU), {hashing[1]:.2f} by SHA-256 "
              f"({hashing[1] / best[False][1]:.1%})")
    if args.workdir is None:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
