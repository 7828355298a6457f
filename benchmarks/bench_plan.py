"""Planning scale-out: the same blocks solved in a plain loop, on 1 and on 2 Dask worker processes.

Usage::

    python benchmarks/bench_plan.py [--spec pipelines/marginals.yaml] [--attributes N] [--max-size S]

The spec is cut down to its first N attributes of size <= S (and the query groups among them)
so that a run fits a few minutes on a 2-core machine; the full 30-attribute
``marginals.yaml`` has 466 residual blocks, several of which take a minute each. For each
setting it prints blocks, seconds, blocks per second and the driver's peak memory, and the
ratios the planning issue asks for: loop / (1 worker) (Dask overhead: goal within 10%) and
(1 worker) / (2 workers) (goal >= 1.7x). Only the block solves are timed (decomposition and
allocation are the same code in every setting); cluster start-up, including importing the
solver in each worker, is reported separately.
"""
from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from distfit.blocks import residual_blocks  # noqa: E402
from distfit.plan import BlockTask, serial_executor  # noqa: E402
from distfit.runtime import DaskExecutor, dask_client  # noqa: E402
from distfit.spec import load_spec, parse_spec  # noqa: E402


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
    import distfit.plan  # noqa: F401


def _peak_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _run(executor, tasks) -> float:
    start = time.perf_counter()
    for _ in executor(tasks):
        pass
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "pipelines" / "marginals.yaml"))
    parser.add_argument("--attributes", type=int, default=12)
    parser.add_argument("--max-size", type=int, default=8)
    args = parser.parse_args(argv)

    spec = _subset(args.spec, args.attributes, args.max_size)
    blocks = residual_blocks(spec.domain, spec.group_triples())
    tasks = [BlockTask(i, block, block.targets) for i, block in enumerate(blocks)]
    print(f"spec {spec.name}: {len(spec.attributes)} attributes {list(spec.domain.sizes)}, "
          f"{len(spec.groups)} query groups, {spec.num_queries} queries, {len(blocks)} residual blocks")

    rows = []
    seconds = _run(serial_executor, tasks)
    rows.append(("loop (1 process)", seconds, 0.0))
    for workers in (1, 2):
        start = time.perf_counter()
        with dask_client(None, workers=workers, log=sys.stdout) as client:
            # Import the solver in every worker first: the loop's process has it imported too.
            client.run(_warm_up)
            startup = time.perf_counter() - start
            seconds = _run(DaskExecutor(client), tasks)
        rows.append((f"dask, {workers} worker{'s' if workers > 1 else ''}", seconds, startup))

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
