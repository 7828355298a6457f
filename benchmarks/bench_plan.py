"""Planning scale-out: the same blocks solved in a plain loop, on 1 and on 2 Dask worker processes;
and (``--memory``) the driver's memory, in-memory plan against streamed plan.

Usage::

    python benchmarks/bench_plan.py [--spec pipelines/marginals.yaml] [--attributes N] [--max-size S]
    python benchmarks/bench_plan.py --memory [--attributes-list 8 12 16 20] [--max-size S]
                                    [--workers 2] [--before-root DIR] [--no-tracemalloc]

The spec is cut down to its first N attributes of size <= S (and the query groups among them)
so that a run fits a few minutes on a 2-core machine; the full 30-attribute
``marginals.yaml`` has 466 residual blocks, several of which take a minute each. For each
setting it prints blocks, seconds, blocks per second and the driver's peak memory, and the
ratios the planning issue asks for: loop / (1 worker) (Dask overhead: goal within 10%) and
(1 worker) / (2 workers) (goal >= 1.7x). Only the block solves are timed (decomposition and
allocation are the same code in every setting); cluster start-up, including importing the
solver in each worker, is reported separately.

``--memory``: for each N of ``--attributes-list``, the same cut-down spec is planned end to end
(``plan.job.run_plan``: decomposition, block solves on a ``--workers`` local cluster, refinement,
allocation, plan store written and moved into place) in a fresh process per mode: ``memory``
(``stream=False``: every block's solution held in the driver, joint block dual when the plan is
small enough), ``streamed`` (``stream=True``: results written to the staging store as they
complete) and, with ``--before-root DIR`` (an unpacked older tree, e.g. ``git archive HEAD``),
``before`` (that tree's ``run_plan``). Per run it prints the driver's peak RSS (sampled every
20 ms with psutil; with a local cluster the scheduler lives in the driver process, so its copy
of the submitted tasks counts) and ``ru_maxrss``, and the tracemalloc peaks of the
decomposition and of everything after it (solves, allocation, store); tracemalloc slows the
driver a little (``--no-tracemalloc`` to skip it). Also blocks, queries, seconds and alpha.
"""
from __future__ import annotations

import argparse
import io
import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if "--root" in sys.argv:  # a --memory child importing another tree's distfit (--before-root)
    sys.path.insert(0, sys.argv[sys.argv.index("--root") + 1])
else:
    sys.path.insert(0, str(ROOT))

from distfit.plan.residual import residual_blocks  # noqa: E402
from distfit.plan.planner import BlockTask, decompose, serial_executor, solve_order  # noqa: E402
from distfit.plan.cluster_executor import DaskExecutor  # noqa: E402
from distfit.runtime.cluster import dask_client  # noqa: E402
from distfit.spec.parse import load_spec, parse_spec  # noqa: E402


def _subset(spec_path: str, attributes: int, max_size: int):
    spec = load_spec(spec_path)
    content = spec.to_dict()
    kept = [a for a in content["attributes"] if len(a.get("values", [])) <= max_size][:attributes]
    names = {a["name"] for a in kept}
    content["attributes"] = kept
    content["queries"] = [q for q in content["queries"] if set(q["attributes"]) <= names]
    content["name"] = f"{content['name']}-first-{len(kept)}"
    return parse_spec(content)


def _warm_up() -> None:
    import distfit.plan.planner  # noqa: F401


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _run(executor, tasks) -> float:
    start = time.perf_counter()
    for _ in executor(tasks):
        pass
    return time.perf_counter() - start


class _PeakRSS:
    """Peak RSS of this process, sampled every ``interval`` seconds in a background thread."""

    def __init__(self, interval: float = 0.02) -> None:
        import psutil

        self.process = psutil.Process()
        self.peak = self.process.memory_info().rss
        self.interval = interval
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.process.memory_info().rss)
        return self.peak


def _memory_child(mode: str, spec_path: str, out: str, workers: int, trace: bool) -> None:
    """One planning run in this (fresh) process; prints one JSON line of measurements."""
    import tracemalloc

    import distfit.plan.job as planning

    phases = {}

    def entering_plan(function):
        def wrapper(*args, **kwargs):
            # everything before this (spec, decomposition, and for a streamed plan the spill of
            # the specs into the staging store) is the "decompose" phase
            if trace:
                current, peak = tracemalloc.get_traced_memory()
                phases["decompose_traced"], phases["plan_entry_traced"] = peak, current
                tracemalloc.reset_peak()
            return function(*args, **kwargs)
        return wrapper

    planning.plan_blocks = entering_plan(planning.plan_blocks)
    if hasattr(planning, "plan_streamed"):
        planning.plan_streamed = entering_plan(planning.plan_streamed)
    baseline = _PeakRSS().stop()
    sampler = _PeakRSS()
    if trace:
        tracemalloc.start()
    start = time.perf_counter()
    if mode == "before":  # an older tree's run_plan read the file and took workers=, and has no Placement
        spec, kwargs = spec_path, {"workers": workers}
    else:
        from distfit.runtime.placement import Placement  # this tree's (not --before-root's): imported here

        spec, kwargs = load_spec(spec_path), {"stream": mode == "streamed", "placement": Placement(workers=workers)}
    plan, _checksum = planning.run_plan(spec, out, log=io.StringIO(), **kwargs)
    seconds = time.perf_counter() - start
    if trace:
        phases["plan_traced"] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    print(json.dumps({
        "mode": mode, "blocks": len(plan.blocks), "queries": int(plan.targets.size), "alpha": plan.alpha,
        "seconds": seconds, "rss_baseline": baseline, "rss_peak": sampler.stop(),
        "ru_maxrss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, **phases,
    }))


def _memory_main(args) -> int:
    import yaml

    modes = ["memory", "streamed"] + (["before"] if args.before_root else [])
    mib = 2.0 ** 20
    print(f"driver memory, {args.workers} local workers; spec {args.spec}, attributes of size <= {args.max_size}")
    header = (f"{'N':>3} {'blocks':>6} {'queries':>7} {'mode':<9} {'seconds':>8} {'alpha':>10} {'RSS base':>9} "
              f"{'RSS peak':>9} {'maxrss':>7} {'tm decomp':>9} {'tm entry':>8} {'tm plan':>8}")
    print(header)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.attributes_list:
            spec = _subset(args.spec, n, args.max_size)
            spec_path = os.path.join(tmp, f"spec-{n}.yaml")
            with open(spec_path, "w") as handle:
                yaml.safe_dump(spec.to_dict(), handle)
            for mode in modes:
                root = args.before_root if mode == "before" else str(ROOT)
                env = dict(os.environ, PYTHONPATH=root)
                command = [sys.executable, str(Path(__file__).resolve()), "--memory-child", mode, spec_path,
                           os.path.join(tmp, f"plan-{n}-{mode}.zarr"), "--workers", str(args.workers), "--root", root]
                if args.no_tracemalloc:
                    command.append("--no-tracemalloc")
                result = subprocess.run(command, capture_output=True, text=True, env=env)
                if result.returncode != 0:
                    print(result.stderr[-3000:], file=sys.stderr)
                    return 1
                row = json.loads(result.stdout.strip().splitlines()[-1])
                rows.append((n, row))
                traced = [row.get(k) for k in ("decompose_traced", "plan_entry_traced", "plan_traced")]
                print(f"{n:>3} {row['blocks']:>6} {row['queries']:>7} {mode:<9} {row['seconds']:>8.1f} {row['alpha']:>10.6g} "
                      f"{row['rss_baseline'] / mib:>9.0f} {row['rss_peak'] / mib:>9.0f} {row['ru_maxrss'] / mib:>7.0f} "
                      + " ".join(f"{t / mib:>{w}.1f}" if t is not None else f"{'-':>{w}}" for t, w in zip(traced, (9, 8, 8))),
                      flush=True)
    print("MiB; RSS peak: sampled driver RSS during the run (RSS base: before it); maxrss: ru_maxrss of the process;")
    print("tm decomp: tracemalloc peak up to the block solves (spec, decomposition, cluster start-up; streamed: spilling the specs);")
    print("tm entry: traced memory when the solves start (memory: the block specs are held; streamed: spilled);")
    print("tm plan: tracemalloc peak from then to the finished plan store (solves, rounds, allocation, writing)")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "pipelines" / "marginals.yaml"))
    parser.add_argument("--attributes", type=int, default=12)
    parser.add_argument("--max-size", type=int, default=8)
    parser.add_argument("--full", action="store_true",
                        help="the whole spec, decomposed and merged as `distfit plan` does (no cut-down)")
    parser.add_argument("--memory", action="store_true", help="driver memory: in-memory against streamed plans")
    parser.add_argument("--attributes-list", type=int, nargs="+", default=[8, 12, 16, 20])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--before-root", default=None, help="also run the run_plan of this source tree")
    parser.add_argument("--no-tracemalloc", action="store_true")
    parser.add_argument("--memory-child", nargs=3, metavar=("MODE", "SPEC", "OUT"), help=argparse.SUPPRESS)
    parser.add_argument("--root", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.memory_child:
        _memory_child(*args.memory_child, args.workers, not args.no_tracemalloc)
        return 0
    if args.memory:
        return _memory_main(args)

    if args.full:
        # The whole spec, decomposed exactly as `distfit plan` does (residual blocks merged under
        # the spec's blocks.max_cells when blocks.merge is on).
        spec = load_spec(args.spec)
        blocks, decisions = decompose(spec.domain, spec.group_triples(),
                                      spec.blocks.max_cells if spec.blocks.merge else 0)
        kind = "blocks (" + "; ".join(decisions) + ")"
    else:
        spec = _subset(args.spec, args.attributes, args.max_size)
        blocks = residual_blocks(spec.domain, spec.group_triples())
        kind = "residual blocks"
    # in the planner's order: most work first (plan.solve_order)
    tasks = [BlockTask(i, blocks[i], blocks[i].targets) for i in solve_order(blocks)]
    print(f"spec {spec.name}: {len(spec.attributes)} attributes {list(spec.domain.sizes)}, "
          f"{len(spec.groups)} query groups, {spec.num_queries} queries, {len(blocks)} {kind}", flush=True)

    rows = []
    # The loop under the same BLAS thread rule as the workers (one thread; solve() sets it too).
    seconds = _run(serial_executor, tasks)
    rows.append(("loop (1 process)", seconds, 0.0))
    print(f"loop done: {seconds:.1f} s ({_load()})", flush=True)
    for workers in (1, 2):
        start = time.perf_counter()
        with dask_client(None, workers=workers, log=sys.stdout) as client:
            # Import the solver in every worker first: the loop's process has it imported too.
            client.run(_warm_up)
            startup = time.perf_counter() - start
            seconds = _run(DaskExecutor(client), tasks)
        rows.append((f"dask, {workers} worker{'s' if workers > 1 else ''}", seconds, startup))
        print(f"{workers} worker(s) done: {seconds:.1f} s ({_load()})", flush=True)

    print(f"{'setting':<20} {'blocks':>6} {'seconds':>9} {'blocks/s':>9} {'start-up s':>10}")
    for name, seconds, startup in rows:
        print(f"{name:<20} {len(blocks):>6} {seconds:>9.2f} {len(blocks) / seconds:>9.2f} {startup:>10.2f}")
    loop, one, two = (row[1] for row in rows)
    print(f"dask 1 worker / loop      = {one / loop:.3f}   (goal <= 1.10)")
    print(f"speed-up 2 workers vs 1   = {one / two:.3f}   (goal >= 1.7)")
    print(f"driver peak memory        = {_peak_mib():.0f} MiB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
