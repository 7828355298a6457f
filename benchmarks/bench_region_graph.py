"""The region graph's damped sweep of convex belief propagation (distfit.estimate.region_graph):
the compiled pass against the numpy formula it replaced, on the same graphs, in the same run.

Usage::

    python benchmarks/bench_region_graph.py [--units 1 8]

Graphs: 4 attributes of 3 values, all 3-way cliques (the test suite's, 174 cells); 8 of 5, all
3-way (7,740 cells); 14 of 6, all 2-way (3,360 cells, Adult's width). Each line gives CPU
milliseconds per sweep of the compiled pass and of the reference (numpy gathers, scipy sparse
scatter-adds built once, ``reduceat``: ``tests/estimate/test_region_graph.numpy_sweeper``), their
ratio, and the largest difference of the beliefs after the same sweeps (relative to the total).
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # tests/estimate/test_region_graph.py

from benchmarks.common import load  # noqa: E402
from distfit.estimate import region_graph as rg  # noqa: E402
from tests.estimate.test_region_graph import numpy_sweeper  # noqa: E402

GRAPHS = ((4, 3, 3), (8, 5, 3), (14, 6, 2))  # attributes, values each, clique order
TOTAL = 1000.0


def per_sweep(sweep, theta: np.ndarray, graph: rg.RegionGraph, total: np.ndarray, repeats: int) -> tuple[float, np.ndarray]:
    """CPU-seconds per sweep of ``repeats`` sweeps from cold messages, and the last beliefs."""
    up, down = rg.zero_messages(graph, theta.shape[1])
    mu = sweep(theta, up, down, total)[0]  # a first call outside the clock (loads the kernel)
    up, down = rg.zero_messages(graph, theta.shape[1])
    start = time.process_time()
    for _ in range(repeats):
        mu, up, down = sweep(theta, up, down, total)
    return (time.process_time() - start) / repeats, mu


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--units", type=int, nargs="+", default=[1, 8], help="units propagated together")
    args = parser.parse_args(argv)
    print(f"load average {load()}")
    for attributes, values, order in GRAPHS:
        names = [f"a{i}" for i in range(attributes)]
        graph = rg.region_graph(list(itertools.combinations(names, order)), names, (values,) * attributes)
        reference = numpy_sweeper(graph)
        for units in args.units:
            theta = np.random.default_rng(0).normal(size=(graph.cells, units))
            total = np.full(units, TOTAL)
            repeats = max(20, int(4e5 / (graph.cells * units)))
            compiled, mu = per_sweep(lambda *a: rg.sweep(graph, *a), theta, graph, total, repeats)
            numpy_time, mu_ref = per_sweep(reference, theta, graph, total, repeats)
            print(f"{attributes} x {values} values, {order}-way: cells {graph.cells:,} messages {graph.messages:,} "
                  f"units {units}: compiled {1e3 * compiled:.3f} CPU-ms a sweep, numpy {1e3 * numpy_time:.3f}, "
                  f"ratio {compiled / numpy_time:.2f}; beliefs differ by {np.abs(mu - mu_ref).max() / TOTAL:.1e} "
                  f"of the total after {repeats} sweeps")
    return 0


if __name__ == "__main__":
    sys.exit(main())
