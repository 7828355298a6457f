"""Releasing a packed plan (issue 10): the pack in bulk against the same blocks one at a time.

Usage::

    python benchmarks/bench_packed_release.py [--blocks 5000 100000] [--units 64] [--per-block-limit 5000]

For each N, the closed-form residual plan of all 2-way marginals of A attributes of sizes
2, 3, 2, 3, ... (``1 + A + A (A - 1) / 2`` blocks, the smallest A reaching N;
``tests/packed_plans.py``; plan written once, not timed) and ``--units`` units of 30 random
people each, tabulated in memory on every marginal (the data store's reading is left out: it is
the same for both paths, one zarr read per stored marginal per chunk). One chunk is released by
:func:`distfit.release.noise.release_chunk`:

* **packed**: the plan's pack as :func:`distfit.release.noise.load_blocks` /
  ``prepare_blocks`` give it (one ``PreparedPack``; preparing timed apart): one noise draw per
  pack, every block's ``B x + z`` and query rows by groups of equal shapes
  (:mod:`distfit.release.packed`);
* **per block**: the same blocks materialised (``plan.block``: basis, recon, sigma) and prepared
  (``prepare_block``: Cholesky factors), released one at a time with a stream each, as a plan
  of explicit blocks is. Above ``--per-block-limit`` blocks, a random sample of that many
  blocks is released and the line says so; its per-block time times N is printed as a
  projection, marked as such.

Printed side by side: seconds to prepare, seconds per chunk, and the ratio per block / packed.
Both paths' query answers are checked to be calibrated (noiseless answers = the marginals).
"""
from __future__ import annotations

import argparse
import itertools
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/packed_plans.py

from distfit.release.noise import load_blocks, marginal_counts, prepare_block, prepare_blocks, release_chunk  # noqa: E402
from distfit.release.tasks import PlanView  # noqa: E402
from distfit.mathematics.domain import Domain  # noqa: E402
from distfit.stores.plan import read_plan  # noqa: E402
from tests.packed_plans import attributes_for, marginals_spec, write_packed_plan  # noqa: E402


def tabulate(sizes: list[int], units: int, people: int, seed: int) -> dict[frozenset, np.ndarray]:
    """Every 2-way marginal of ``units`` units of ``people`` random people (units x cells)."""
    rng = np.random.default_rng(seed)
    values = rng.integers(0, sizes, size=(units * people, len(sizes)))
    unit = np.repeat(np.arange(units), people)
    out = {}
    for i, j in itertools.combinations(range(len(sizes)), 2):
        cells = sizes[i] * sizes[j]
        key = unit * cells + values[:, i] * sizes[j] + values[:, j]
        out[frozenset((f"x{i}", f"x{j}"))] = np.bincount(key, minlength=units * cells).reshape(units, cells)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, nargs="+", default=[5000, 100000])
    parser.add_argument("--units", type=int, default=64)
    parser.add_argument("--per-block-limit", type=int, default=5000)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    work = Path(args.workdir or tempfile.mkdtemp(prefix="bench-packed-release-"))
    print(f"{'blocks':>8} {'queries':>9} {'K':>9} | {'packed prep s':>13} {'packed chunk s':>14} | "
          f"{'per-block prep s':>16} {'per-block chunk s':>17} | {'ratio':>7}  note")
    try:
        for n in args.blocks:
            a = attributes_for(n)
            sizes = [2 + i % 2 for i in range(a)]
            spec = marginals_spec(sizes, 2, name=f"bench-{n}")
            path = work / f"plan-{n}.zarr"
            shutil.rmtree(path, ignore_errors=True)
            write_packed_plan(path, spec)
            plan = read_plan(path)
            domain = Domain.from_schema(plan.attrs["schema"])
            counts = tabulate(sizes, args.units, 30, seed=n)
            source = {}  # a block's marginal from a stored 2-way marginal holding it

            def read(attributes: tuple[str, ...]) -> np.ndarray:
                key = frozenset(attributes)
                if key in counts:
                    return counts[key]
                if key not in source:
                    other = "x1" if "x0" in key else "x0"
                    source[key] = frozenset(key | {other}) if len(key) == 1 else frozenset(("x0", "x1"))
                names = sorted(source[key], key=domain.index)
                return marginal_counts(counts[source[key]], Domain(tuple(names), tuple(domain.size_of(x) for x in names)),
                                       attributes)

            t = time.perf_counter()
            packed_blocks = prepare_blocks(load_blocks(plan))
            packed_prep = time.perf_counter() - t
            t = time.perf_counter()
            packed = release_chunk(plan, read, 20240611, 0, domain, blocks=packed_blocks)
            packed_chunk = time.perf_counter() - t
            del packed_blocks

            ids = list(plan.block_ids)
            note = ""
            if len(ids) > args.per_block_limit:
                rng = np.random.default_rng(0)
                ids = sorted(rng.choice(ids, args.per_block_limit, replace=False).tolist())
                note = f"per block: a sample of {len(ids):,} blocks, times projected x{len(plan.block_ids) / len(ids):.1f}"
            t = time.perf_counter()
            one_by_one = {b: prepare_block(plan.block(b)) for b in ids}
            block_prep = time.perf_counter() - t
            view = PlanView(attrs={"schema": dict(plan.attrs["schema"])}, block_ids=tuple(ids),
                            queries_targets=plan.queries_targets)
            t = time.perf_counter()
            per_block = release_chunk(view, read, 20240611, 0, domain, blocks=one_by_one)
            block_chunk = time.perf_counter() - t
            scale = len(plan.block_ids) / len(ids)
            z = (packed.queries - np.concatenate([counts[frozenset((f"x{i}", f"x{j}"))] for i, j in
                                                  itertools.combinations(range(a), 2)], axis=1)) \
                / np.sqrt(plan.queries_variances)
            assert abs(z.mean()) < 0.25 and abs(z.std() - 1) < 0.05, (z.mean(), z.std())  # rows of a unit share noise
            assert np.isfinite(per_block.queries).all()
            width = sum(m.shape[1] for m in packed.measurements.values())
            ratio = block_chunk * scale / packed_chunk
            print(f"{len(plan.block_ids):>8,} {plan.queries_targets.size:>9,} {width:>9,} | {packed_prep:>13.2f} "
                  f"{packed_chunk:>14.2f} | {block_prep * scale:>16.2f} {block_chunk * scale:>17.2f} | "
                  f"{ratio:>6.1f}x  {note or 'measured'}; z sd {z.std():.3f}", flush=True)
            del one_by_one, per_block, packed
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
