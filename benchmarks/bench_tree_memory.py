"""The multi-level estimate's memory (issue 29 point 6): what the hierarchy's passes hold, per step.

Usage::

    python benchmarks/bench_tree_memory.py [--units 10000] [--cells 128] [--seed 1] [--skip-whole]

The US-shaped geography of ``--units`` blocks (:func:`distfit.data.us_geography.us_geography`,
under one nation: six levels, as ``pipelines/us_pl94.yaml``), each level measured by a random
``J_l`` of ``--cells`` cells (rank ``cells / 2`` above the blocks, full at the blocks, as a plan
that measures part of the table above the finest level) and random ``h``. Pure numpy, no
stores: the passes' arrays traced with ``tracemalloc`` (numpy reports its buffers to it).

Printed: for the whole-tree passes (:func:`distfit.estimate.hierarchy.upward_pass` then
:func:`~distfit.estimate.hierarchy.downward_pass`, what ``estimate_levels`` runs in the driver)
and for the cluster's driver (the forests' summaries merged and :func:`~distfit.estimate.subtrees.top_estimate`
at the cut :func:`~distfit.estimate.subtrees.choose_cut` picks for these cells) and its largest
forest (:func:`~distfit.estimate.subtrees.forest_upward` and
:func:`~distfit.estimate.subtrees.forest_downward`): the peak traced MiB, what the result holds
per field (MiB), the CPU-seconds, and the reference: the peak in ``cells x cells`` float64
matrices per unit above the leaves (the units whose classes the passes hold; the bound
:data:`distfit.estimate.subtrees.MATRICES_PER_UNIT` assumes).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from distfit.data.us_geography import us_geography  # noqa: E402
from distfit.estimate.hierarchy import downward_pass, upward_pass  # noqa: E402
from distfit.estimate.subtrees import (  # noqa: E402
    FOREST_MATRIX_BYTES,
    choose_cut,
    descendant_spans,
    forest_downward,
    forest_upward,
    group_roots,
    local_parents,
    matrix_units,
    merge_summaries,
    top_estimate,
)

MIB = 1 << 20


def _held(obj) -> str:
    """MiB held per array field of a result (fields over 1 MiB)."""
    out = []
    for name, value in vars(obj).items():
        if isinstance(value, (list, tuple)):
            size = sum(a.nbytes for a in value if isinstance(a, np.ndarray)) / MIB
            if size > 1:
                out.append(f"{name} {size:.0f}")
    return ", ".join(out)


def _line(what: str, peak: int, cpu: float, inner: int, cells: int, held: str) -> None:
    per = peak / max(inner * 8 * cells * cells, 1)
    print(f"{what}: peak {peak / MIB:,.0f} MiB, {cpu:.1f} CPU-s, {inner:,} units above the leaves: "
          f"{per:.1f} matrices per unit; holds {held}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=10_000)
    parser.add_argument("--cells", type=int, default=128)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--skip-whole", action="store_true", help="only the cluster's driver and largest forest")
    args = parser.parse_args()
    d = args.cells
    geo = us_geography(5, args.units, args.seed)
    parents = [None, None] + [geo.parents[n] for n in geo.levels[1:]]
    units = [1] + [int(geo.ids[n].size) for n in geo.levels]
    rng = np.random.default_rng(args.seed)
    js, hs = [], []
    for level, n in enumerate(units):
        w = rng.standard_normal((d + 5 if level == len(units) - 1 else d // 2, d))
        js.append(w.T @ w)
        hs.append(rng.standard_normal((n, d)))
    cut = choose_cut(units, cells=d)
    print(f"{args.units:,} blocks, levels {units}, {d} cells; cut at level {cut} "
          f"(by units alone: {choose_cut(units)}); load {os.getloadavg()[0]:.1f}")
    tracemalloc.start()
    if not args.skip_whole:
        tracemalloc.reset_peak()
        cpu = time.process_time()
        state = upward_pass(js, hs, parents)
        _line("whole tree, upward", tracemalloc.get_traced_memory()[1], time.process_time() - cpu, sum(units[:-1]),
              d, _held(state))
        result = downward_pass(state, split="total")
        _line("whole tree, both passes", tracemalloc.get_traced_memory()[1], time.process_time() - cpu,
              sum(units[:-1]), d, _held(result))
        del state, result

    counts = [np.bincount(parents[level + 1], minlength=units[level]) for level in range(cut, len(units) - 1)]
    spans = descendant_spans(counts)
    groups = group_roots(spans, 50_000, matrix_units(d, FOREST_MATRIX_BYTES))
    summaries, largest = [], (0, 0.0, 0, "")
    for first, stop in groups:
        rows = [slice(int(s[first]), int(s[stop])) for s in spans]
        ups = [None] + [local_parents(parents[cut + k][rows[k]], rows[k - 1].start) for k in range(1, len(rows))]
        tracemalloc.reset_peak()
        cpu = time.process_time()
        state, summary = forest_upward(js[cut:], [h[r] for h, r in zip(hs[cut:], rows)], ups)
        summaries.append(summary)
        peak, inner = tracemalloc.get_traced_memory()[1], sum(r.stop - r.start for r in rows[:-1])
        if peak > largest[0]:
            largest = (peak, time.process_time() - cpu, inner, _held(state))
        del state
    _line(f"largest of {len(groups)} forests, upward", *largest[:3], d, largest[3])
    tracemalloc.reset_peak()
    cpu = time.process_time()
    top = top_estimate(js[:cut], hs[:cut], parents[:cut + 1], merge_summaries(summaries), split="total")
    _line("cluster's driver: the top, both passes", tracemalloc.get_traced_memory()[1], time.process_time() - cpu,
          sum(units[:cut + 1]), d, _held(top))
    first, stop = groups[0]
    rows = [slice(int(s[first]), int(s[stop])) for s in spans]
    ups = [None] + [local_parents(parents[cut + k][rows[k]], rows[k - 1].start) for k in range(1, len(rows))]
    tracemalloc.reset_peak()
    cpu = time.process_time()
    state, _ = forest_upward(js[cut:], [h[r] for h, r in zip(hs[cut:], rows)], ups)
    below = forest_downward(state, top.top(cut, slice(first, stop)), split="total")
    _line("first forest, up and down", tracemalloc.get_traced_memory()[1], time.process_time() - cpu,
          sum(r.stop - r.start for r in rows[:-1]), d, _held(below))


if __name__ == "__main__":
    main()
