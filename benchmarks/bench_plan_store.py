"""Plan stores at scale (issue 10): a packed plan against the same blocks one group each.

Usage::

    python benchmarks/bench_plan_store.py [--blocks 5000 100000] [--groups-limit 5000] [--workdir DIR]

For each N, the closed-form residual plan of all 2-way marginals of A attributes of sizes
2, 3, 2, 3, ... (``1 + A + A (A - 1) / 2`` blocks, the smallest A reaching N;
``tests/packed_plans.py``, the blocks built once, not timed) is written

* **packed**: ``PlanWriter.write_packed`` (one pack: ten arrays) and ``finish``;
* **groups**: the same blocks materialised (``distfit.mathematics.packing.block_arrays``) and written one
  group per block (``PlanWriter.write_blocks``: nine arrays each), the layout before packs;
  only when N <= ``--groups-limit`` (at 100,000 blocks it would take tens of minutes; then the
  line says so and its figures are left out rather than extrapolated);

both with fsync (as ``distfit plan`` writes). Printed side by side: write seconds, files, bytes,
``read_plan`` seconds, seconds to read every block (``iter_blocks``: the packed ones
materialised), ``audit_plan`` seconds (packed: the vectorised pack audit; groups: one block at a
time), and the ratio groups / packed of each. Both plans must pass the audit with the same alpha.
"""
from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/packed_plans.py

from distfit.audit.plan import audit_plan  # noqa: E402
from distfit.mathematics.packing import block_arrays  # noqa: E402
from distfit.plan.residual import block_id_for  # noqa: E402
from distfit.mathematics.privacy import privacy_account  # noqa: E402
from distfit.spec.parse import parse_spec  # noqa: E402
from distfit.stores.plan import BlockRecord, read_plan  # noqa: E402
from distfit.stores.plan_writer import PlanWriter  # noqa: E402
from tests.packed_plans import attributes_for, marginals_spec, packed_plan_parts  # noqa: E402


def tree_size(path: Path) -> tuple[int, int]:
    files = size = 0
    for root, _, names in os.walk(path):
        for name in names:
            files += 1
            size += os.path.getsize(os.path.join(root, name))
    return files, size


def write(path: Path, spec, pack, targets, variances, packed: bool) -> float:
    domain = spec.domain
    names, sizes = list(domain.names), list(domain.sizes)
    alpha = float(pack.alpha.sum())  # flat profiles: the stitched maximum is the sum (not exact: big domains)
    exact = domain.size <= 5_000_000
    started = time.perf_counter()
    with PlanWriter(path) as writer:
        if packed:
            writer.write_packed(pack)
        else:
            def records():
                for b in range(len(pack)):
                    own = tuple(names[i] for i in pack.attributes[b] if i >= 0)
                    yield BlockRecord(block_id=block_id_for(own), attributes=own, alpha=pack.alpha[b],
                                      lower_bound=pack.lower_bound[b], solver=pack.solver,
                                      **block_arrays(pack, sizes, b))
            writer.write_blocks(records())
        writer.finish(spec=spec.to_dict(), schema=domain.schema(), queries_targets=targets,
                      queries_variances=variances, alpha=alpha, alpha_exact=exact, rho=alpha / 2,
                      composition="sequential",
                      extra_attrs={"account": privacy_account(alpha).to_dict(),
                                   "planner": {"spec_hash": spec.spec_hash, "alpha_sum_bound": alpha,
                                               "variance_scale": float(np.max(variances / targets))}})
    return time.perf_counter() - started


def measure(path: Path, spec, pack, targets, variances, packed: bool) -> dict:
    out = {"write s": write(path, spec, pack, targets, variances, packed)}
    out["files"], out["MB"] = tree_size(path)
    out["MB"] /= 1e6
    started = time.perf_counter()
    plan = read_plan(path)
    out["read_plan s"] = time.perf_counter() - started
    started = time.perf_counter()
    for _ in plan.iter_blocks():
        pass
    out["every block s"] = time.perf_counter() - started
    started = time.perf_counter()
    report = audit_plan(str(path))
    out["audit s"] = time.perf_counter() - started
    assert report.ok, report.failures[:3]
    out["alpha"] = report.value
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[5000, 100000])
    parser.add_argument("--groups-limit", type=int, default=5000)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="bench-plan-store-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print(f"load average {os.getloadavg()[0]:.2f}, cores {os.cpu_count()}")
    for n in args.blocks:
        a = attributes_for(n)
        started = time.perf_counter()
        spec_dict = marginals_spec([2 + i % 2 for i in range(a)], 2, name=f"store-{a}")
        spec = parse_spec(spec_dict)
        pack, targets, variances = packed_plan_parts(spec_dict)
        print(f"\n{len(pack):,} blocks ({a} attributes, all 2-way, {targets.size:,} queries, "
              f"{pack.segments:,} segments); built in {time.perf_counter() - started:.1f} s (not timed below)")
        rows = {"packed": measure(workdir / "packed.zarr", spec, pack, targets, variances, True)}
        if n <= args.groups_limit:
            rows["groups"] = measure(workdir / "groups.zarr", spec, pack, targets, variances, False)
            assert abs(rows["groups"]["alpha"] - rows["packed"]["alpha"]) <= 1e-9 * rows["packed"]["alpha"]
        keys = ["write s", "files", "MB", "read_plan s", "every block s", "audit s"]
        print(f"{'':16}" + "".join(f"{k:>15}" for k in keys))
        for name, row in rows.items():
            print(f"{name:16}" + "".join(f"{row[k]:>15,.3f}" if isinstance(row[k], float) else f"{row[k]:>15,}"
                                         for k in keys))
        if "groups" in rows:
            print(f"{'groups / packed':16}" + "".join(f"{rows['groups'][k] / rows['packed'][k]:>15,.1f}" for k in keys))
        else:
            print(f"{'groups':16}not run (N > --groups-limit {args.groups_limit})")
        print(f"alpha {rows['packed']['alpha']:.6f} (audited)")
        for name in ("packed.zarr", "groups.zarr"):
            shutil.rmtree(workdir / name, ignore_errors=True)
    if not args.workdir:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
