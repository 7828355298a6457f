"""The hierarchy's passes in the levels' shared basis beside the general path (issue 29).

Usage::

    python benchmarks/bench_shared_basis.py [--units 100000] [--general-units 3000] [--cells 252]

The US-shaped geography (:func:`distfit.data.us_geography.us_geography` under one nation: six
levels, as ``pipelines/us_pl94.yaml``), every level measured with one ``J`` up to a scale (the
total, the cells and random 0/1 queries: rank ``cells``; PL94's levels all have the same plan)
and random ``h``. Pure numpy, no stores, BLAS on one thread (as the estimate runs). Printed, for
``--general-units`` blocks: the whole-tree passes (:func:`distfit.estimate.hierarchy.upward_pass`,
:func:`~distfit.estimate.hierarchy.downward_pass`, ``split="total"``) and the query variances,
in the shared basis (:mod:`distfit.estimate.shared_basis`) and by the general path (``basis=None``,
the reference): CPU-seconds, peak traced MiB (``tracemalloc``) and the largest difference of the
estimates and variances; then the shared basis alone at ``--units`` blocks.
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
from distfit.runtime.threads import blas_limit  # noqa: E402


def problem(blocks: int, cells: int, seed: int = 1):
    """``(js, hs, parents, workload)`` of the US-shaped tree of ``blocks`` blocks."""
    geography = us_geography(5, blocks, seed=29)
    levels = list(geography.levels)
    sizes = [1] + [len(geography.ids[name]) for name in levels]
    parents = [None, np.zeros(sizes[1], dtype=np.int64)] + [np.asarray(geography.parents[name], dtype=np.int64)
                                                             for name in levels[1:]]
    rng = np.random.default_rng(seed)
    w = np.vstack([np.ones((1, cells)), np.eye(cells), rng.integers(0, 2, (cells // 4, cells))])
    j = w.T @ w
    js = [j * (1.0 + 0.5 * level) for level in range(len(sizes))]
    return js, [rng.standard_normal((n, cells)) for n in sizes], parents, w


def passes(js, hs, parents, workload, basis):
    """Both passes and every level's query variances: ``(result, variances, CPU-s, peak MiB)``."""
    tracemalloc.start()
    cpu = time.process_time()
    result = downward_pass(upward_pass(js, hs, parents, basis=basis), split="total", outside=False)
    variances = [rows[classes] for rows, classes in (result.variances(level, workload) for level in range(len(hs)))]
    seconds = time.process_time() - cpu
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return result, variances, seconds, peak / 2**20


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, default=100_000)
    parser.add_argument("--general-units", type=int, default=3_000)
    parser.add_argument("--cells", type=int, default=252)
    args = parser.parse_args()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"load {load}; {args.cells} cells")
    with blas_limit():
        js, hs, parents, workload = problem(args.general_units, args.cells)
        units = sum(h.shape[0] for h in hs)
        shared, shared_var, s_cpu, s_peak = passes(js, hs, parents, workload, "auto")
        general, general_var, g_cpu, g_peak = passes(js, hs, parents, workload, None)
        assert shared.basis is not None and general.basis is None
        dx = max(float(np.abs(a - b).max() / max(1.0, np.abs(b).max())) for a, b in zip(shared.x, general.x))
        dv = max(float(np.abs(a - b).max() / max(1.0, np.abs(b).max())) for a, b in zip(shared_var, general_var))
        print(f"{args.general_units:,} blocks ({units:,} units): shared basis {s_cpu:.2f} CPU-s, peak {s_peak:,.0f} MiB; "
              f"general {g_cpu:.2f} CPU-s, peak {g_peak:,.0f} MiB; ratio {s_cpu / g_cpu:.4f} CPU, "
              f"{s_peak / g_peak:.3f} memory; largest relative difference: estimates {dx:.1e}, variances {dv:.1e}")
        del shared, general, shared_var, general_var
        js, hs, parents, workload = problem(args.units, args.cells)
        units = sum(h.shape[0] for h in hs)
        _, _, s_cpu, s_peak = passes(js, hs, parents, workload, "auto")
        inputs = sum(h.nbytes for h in hs) / 2**20
        print(f"{args.units:,} blocks ({units:,} units): shared basis {s_cpu:.2f} CPU-s "
              f"({1e6 * s_cpu / units:.1f} us a unit), peak {s_peak:,.0f} MiB beside {inputs:,.0f} MiB of h; "
              f"load {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
