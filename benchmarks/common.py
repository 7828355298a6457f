"""What the store benchmarks share (``bench_release.py``, ``bench_estimate.py``,
``bench_export.py``): timing a run in a fresh process with its peak memory (:func:`measured`,
:class:`PeakRSS`), the size of a store on disk, the CPU-seconds of a process and its waited-for children
(:func:`cpu_seconds`), the load average, a best-and-spread figure, and
the set-up of a benchmark over synthetic units: its ``--workdir``/``--keep-data``/``--spec``
options (:func:`parse_options`), the spec planned once into the workdir
(:func:`planned_workdir`) and the data of N units synthesised there (:func:`synthesised`)."""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import multiprocessing
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from distfit.plan.job import run_plan
from distfit.runtime.placement import Placement
from distfit.spec.parse import load_spec
from distfit.stores.data import write_synthetic
from distfit.stores.plan import read_plan

ROOT = Path(__file__).resolve().parent.parent
MIB = 2.0**20


class PeakRSS:
    """Sample RSS of process ``pid`` and of its descendants until stopped (peak per process)."""

    def __init__(self, pid: int, interval: float = 0.05):
        self.pid = pid
        self.interval = interval
        self.driver = 0
        self.children: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        try:
            me = psutil.Process(self.pid)
        except psutil.Error:
            return
        while not self._stop.is_set():
            try:
                self.driver = max(self.driver, me.memory_info().rss)
                for child in me.children(recursive=True):
                    try:
                        rss = child.memory_info().rss
                    except psutil.Error:
                        continue
                    self.children[child.pid] = max(self.children.get(child.pid, 0), rss)
            except psutil.Error:
                pass
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakRSS":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    @property
    def worker(self) -> int:
        return max(self.children.values(), default=0)


def _child(connection, function, args) -> None:
    connection.send(function(*args))


def measured(function, *args) -> tuple[float, PeakRSS]:
    """``function(*args)`` (seconds) run in a fresh process (spawned, not a daemon: a release
    starts its own cluster; its RSS is its own, not what earlier runs left in this one),
    sampled by :class:`PeakRSS`."""
    context = multiprocessing.get_context("spawn")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(target=_child, args=(send, function, args))
    child.start()
    with PeakRSS(child.pid) as memory:
        seconds = receive.recv()
        child.join()
    if child.exitcode != 0:
        raise SystemExit(f"{function.__name__} failed (exit {child.exitcode})")
    return seconds, memory


def cpu_seconds() -> float:
    """User + system CPU seconds of this process and of its waited-for descendants (a local
    cluster's worker processes, once it has shut them down and reaped them)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def tree_cpu() -> float:
    """User + system CPU-seconds of this process and its live descendants (a local cluster's
    scheduler, nannies and workers) and of each live process's reaped children (a worker a
    nanny restarted, the nannies once the cluster is closed): psutil, while they run."""
    total = 0.0
    me = psutil.Process()
    for process in [me] + me.children(recursive=True):
        try:
            times = process.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def store_bytes(path: str) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def load() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def child_json(tree: Path, script: str, args: Sequence[str], what: str) -> Any:
    """Run ``script`` (python source) in a fresh process from ``tree``'s root with that root
    first on ``sys.path`` (two trees compared, each its own code), and return the JSON of the
    last line it prints; SystemExit naming ``what`` and the tail of its stderr if it fails."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(tree) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, "-c", script, *args], cwd=tree, env=env, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {what} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def spread(values: list[float], fmt: str) -> str:
    best = format(min(values), fmt)
    return best if len(values) == 1 else f"{best} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def parse_options(parser: argparse.ArgumentParser, argv: Sequence[str] | None, *, units: list[int],
                  repeat: int) -> argparse.Namespace:
    """``argv`` parsed by ``parser`` with the options of a benchmark over synthetic units added:
    ``--units N [N ...]`` (default ``units``), ``--workers W`` (local worker processes, default
    2), ``--repeat R`` (default ``repeat``), ``--workdir``, ``--keep-data`` and ``--spec``
    (default PL94); a usage error for ``--repeat`` below 1 and for ``--keep-data`` without
    ``--workdir``."""
    parser.add_argument("--units", type=int, nargs="+", default=units)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeat", type=int, default=repeat, help=f"runs of each per N (default {repeat})")
    parser.add_argument("--workdir", default=None, help="default: a new temporary directory (deleted)")
    parser.add_argument("--keep-data", action="store_true", help="keep (and reuse) the data stores in --workdir")
    parser.add_argument("--spec", default=str(ROOT / "pipelines" / "pl94.yaml"))
    args = parser.parse_args(argv)
    if args.repeat < 1:
        parser.error("--repeat must be >= 1")
    if args.keep_data and args.workdir is None:
        parser.error("--keep-data needs --workdir")
    return args


@dataclass(frozen=True)
class Workdir:
    """Where a benchmark writes: the directory ``path`` and the plan store ``plan_path`` in it."""

    path: Path
    plan_path: str


@contextlib.contextmanager
def planned_workdir(args: argparse.Namespace, prefix: str) -> Iterator[Workdir]:
    """The workdir (``--workdir``, or a new temporary directory named ``prefix...``, deleted on
    leaving) with ``--spec`` planned into ``plan.zarr`` (``run_plan``, serial), and one line
    saying so."""
    own = args.workdir is None
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix=prefix))
    workdir.mkdir(parents=True, exist_ok=True)
    plan_path = str(workdir / "plan.zarr")
    shutil.rmtree(plan_path, ignore_errors=True)
    start = time.perf_counter()
    run_plan(load_spec(args.spec), plan_path, placement=Placement(serial=True), log=io.StringIO())
    plan = read_plan(plan_path)
    shapes = [plan.block(b).recon.shape[0:1] + plan.block(b).basis.shape for b in plan.block_ids]
    print(f"plan {Path(args.spec).name}: {len(shapes)} block(s) (m_b, k, d_b) {shapes}, "
          f"{len(plan.queries_targets)} queries, planned in {time.perf_counter() - start:.1f} s; "
          f"{os.cpu_count()} CPUs; workdir {workdir}", flush=True)
    try:
        yield Workdir(workdir, plan_path)
    finally:
        if own:
            shutil.rmtree(workdir, ignore_errors=True)


def synthesised(args: argparse.Namespace, workdir: Path, n: int) -> str:
    """The data store of ``n`` synthetic units of ``--spec`` in ``workdir`` (seed ``n``): the
    one kept there with ``--keep-data``, else written now (timed apart, one line)."""
    data_path = str(workdir / f"data-{n}.zarr")
    if not (args.keep_data and Path(data_path).exists()):
        shutil.rmtree(data_path, ignore_errors=True)
        start = time.perf_counter()
        write_synthetic(args.spec, n, data_path, seed=n)
        print(f"N={n}: synthesised in {time.perf_counter() - start:.1f} s", flush=True)
    return data_path
