"""Price of blocks: alpha planned as blocks against one global SM-II solve of the same workload.

Usage::

    python benchmarks/bench_price_of_blocks.py [--specs pipelines/pl94.yaml ...] [--limits 0 64 400 4096]

For every shipped pipeline small enough for one global solve it prints, for each merge limit
(``blocks.max_cells``; 0 = no merging, pure residual blocks), the number of blocks, the planned
alpha (exact, cell by cell), the global alpha and its certified lower bound, and the ratio
alpha(blocks) / alpha(global) (goal of the planning issue: within 2%). Seconds are the serial
planning time (no Dask), next to the global solve's.
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from distfit import solve  # noqa: E402
from distfit.plan.planner import plan_groups  # noqa: E402
from distfit.spec.parse import load_spec  # noqa: E402

DEFAULT_SPECS = ["pipelines/pl94.yaml", "pipelines/age_pyramid.yaml", "pipelines/mix.yaml"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--specs", nargs="+", default=DEFAULT_SPECS)
    parser.add_argument("--limits", nargs="+", type=int, default=[0, 64, 400, 4096])
    parser.add_argument("--refine-rounds", type=int, default=1)
    args = parser.parse_args(argv)
    print(f"{'spec':<14} {'max_cells':>9} {'blocks':>6} {'alpha blocks':>12} {'alpha global':>12} "
          f"{'global LB':>10} {'ratio':>7} {'plan s':>7} {'global s':>8}")
    for path in args.specs:
        spec = load_spec(str(ROOT / path) if not Path(path).is_absolute() else path)
        workload = spec.workload()
        start = time.perf_counter()
        whole = solve(workload.matrix, workload.targets)
        global_seconds = time.perf_counter() - start
        for limit in args.limits:
            start = time.perf_counter()
            plan = plan_groups(spec.domain, spec.group_triples(), max_cells=limit, refine_rounds=args.refine_rounds)
            seconds = time.perf_counter() - start
            print(f"{spec.name:<14} {limit:>9} {len(plan.blocks):>6} {plan.alpha:>12.5f} {whole.alpha:>12.5f} "
                  f"{whole.lower_bound:>10.5f} {plan.alpha / whole.alpha:>7.4f} {seconds:>7.1f} {global_seconds:>8.1f}",
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
