"""The projection's solver on PL94 units against a loop of ``scipy.optimize.nnls``.

Usage::

    python benchmarks/bench_projection.py [--units 10000] [--nnls-units 1000] [--repeat 3]
                                          [--chunk 4096] [--release-seconds 9.8]

Plans ``pipelines/pl94.yaml`` (serial ``run_plan``: one block, 252 cells, 252 x 252 basis,
319 queries) in a temporary directory, synthesises ``--units`` unit histograms
(:func:`distfit.data.synthetic.synthesize_chunk`), releases them with a fixed entropy
(:func:`distfit.release.noise.release_chunk`) and recovers the measurements (not timed). Then,
``--repeat`` times, under the BLAS thread rule (:func:`distfit.runtime.threads.blas_limit`: one thread
unless ``DISTFIT_BLAS_THREADS`` says otherwise), alternating:

* **distfit**: :func:`distfit.estimate.projection.project_nonnegative` on chunks of
  ``--chunk`` units (default 4096, the largest data chunk; batches of matrix problems inside).
  PL94's ``H`` is block diagonal over race plus rank 6 (:mod:`distfit.estimate.structure`), so
  this is the Woodbury path: compiled (numba) float64 active-set steps, one refinement, the
  KKT check;
* **dense**: the same function with the structure switched off (the general dense path:
  active-set steps on gathered free-cell systems, the method before the structure);
* **the loop**: per unit, ``scipy.optimize.nnls(G, C^-1 y)`` on the whitened system (G =
  C^-1 B), the textbook way, on the first ``--nnls-units`` units only (scaled to 10,000).

Times are CPU seconds (``time.process_time``: the machine may be shared, wall time is noisy)
per 10,000 units, best of the repeats, after one warm-up chunk (the structure is found once
per process and plan, and the compiled kernel loaded from numba's cache or compiled once per
process: both one-time costs are printed on their own). Printed as well: the ratios,
the largest differences between the solutions (all solve the same strictly convex problem:
PL94's basis determines every cell), steps, unconverged units, the mean free-set size, and the
CPU time of 1,000,000 units on 2 workers next to the release's (benchmarks/bench_release.py:
about 9.8 s wall on 2 workers on the reference machine, ``--release-seconds``).
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402
import scipy.optimize  # noqa: E402

from distfit.data.synthetic import synthesize_chunk  # noqa: E402
from distfit.estimate.measurements import measurement_model, recover_measurements  # noqa: E402
from distfit.estimate import projection  # noqa: E402
from distfit.estimate.projection import hessian_structure, normal_equations, project_nonnegative  # noqa: E402
from distfit.plan.job import run_plan  # noqa: E402
from distfit.release.noise import plan_domain, release_chunk  # noqa: E402
from distfit.spec.parse import load_spec  # noqa: E402
from distfit.stores.plan import read_plan  # noqa: E402
from distfit.runtime.threads import blas_limit  # noqa: E402
from distfit.runtime.placement import Placement

PER = 10_000


def _distfit(model, y, chunk):
    units = next(iter(y.values())).shape[0]
    xs, steps, unconverged = [], 0, 0
    for lo in range(0, units, chunk):
        result = project_nonnegative(model, {k: v[lo:lo + chunk] for k, v in y.items()})
        xs.append(result.x)
        steps = max(steps, result.iterations)
        unconverged += int((~result.converged).sum())
    return np.vstack(xs), steps, unconverged


def _loop(model, y, units):
    block = model.blocks[0]
    whitened = y[block.block_id][:units] @ block.whitener.T
    return np.array([scipy.optimize.nnls(block.whitened_basis, whitened[u])[0] for u in range(units)])


def _cpu(function, *args):
    start = time.process_time()
    result = function(*args)
    return time.process_time() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--units", type=int, default=PER)
    parser.add_argument("--nnls-units", type=int, default=1000)
    parser.add_argument("--chunk", type=int, default=4096)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--release-seconds", type=float, default=9.8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-projection-") as work:
        plan_path = str(Path(work) / "pl94.zarr")
        run_plan(load_spec(ROOT / "pipelines" / "pl94.yaml"), plan_path, placement=Placement(serial=True),
                 log=io.StringIO())
        plan = read_plan(plan_path)
        _start, counts = synthesize_chunk(plan_domain(plan), args.units, 1, 0, args.units)
        released = release_chunk(plan, counts, entropy=20240611, chunk_index=0)
        model = measurement_model(plan)
        y = recover_measurements(model, released.blocks)
    nnls_units = min(args.nnls_units, args.units)
    structured = projection.projection_structure  # the module's own, restored after the dense runs
    ours, dense, theirs = [], [], []
    with blas_limit():
        hessian, _g = normal_equations(model, {k: v[:1] for k, v in y.items()})
        found, structure = _cpu(hessian_structure, hessian, model.sizes)
        jit, _first = _cpu(_distfit, model, {k: v[:1] for k, v in y.items()}, 1)  # compile or cache load
        _distfit(model, {k: v[:args.chunk] for k, v in y.items()}, args.chunk)  # warm-up
        for _ in range(args.repeat):
            load = os.getloadavg()[0]
            seconds, (x, steps, unconverged) = _cpu(_distfit, model, y, args.chunk)
            ours.append(seconds * PER / args.units)
            projection.projection_structure = lambda model: None
            try:
                seconds, (x_dense, dense_steps, _u) = _cpu(_distfit, model, y, args.chunk)
            finally:
                projection.projection_structure = structured
            dense.append(seconds * PER / args.units)
            seconds, reference = _cpu(_loop, model, y, nnls_units)
            theirs.append(seconds * PER / nnls_units)
            print(f"load {load:.1f}: distfit {ours[-1]:.2f} s, dense {dense[-1]:.2f} s, nnls loop {theirs[-1]:.2f} s "
                  f"CPU per {PER:,} units", flush=True)
    print(f"PL94, {args.units:,} units (people per unit: mean {counts.sum(axis=1).mean():.0f}), "
          f"chunks of {args.chunk}, best of {args.repeat}, CPU seconds, one BLAS thread")
    if structure is not None:
        print(f"structure: groups of {structure.group_cells} cells x {structure.groups}, rank {structure.rank}, "
              f"{structure.types.max() + 1} block types; found once in {found:.2f} s; first call (numba "
              f"compile or cache load) {jit:.2f} s")
    print(f"{'':>12} {'s per 10k':>10} {'spread':>15} {'us per unit':>12}")
    for name, times in (("distfit", ours), ("dense", dense), ("nnls loop", theirs)):
        print(f"{name:>12} {min(times):>10.2f} {min(times):>7.2f}-{max(times):<7.2f} {min(times) / PER * 1e6:>12.1f}")
    print(f"ratio distfit / dense: {min(ours) / min(dense):.3f}; distfit / nnls loop: {min(ours) / min(theirs):.3f}")
    million = min(ours) / PER * 1_000_000 / 2
    print(f"1,000,000 units on 2 workers: projection {million:.1f} s CPU per worker "
          f"(dense {min(dense) / PER * 1_000_000 / 2:.1f} s) vs the release {args.release_seconds:.1f} s "
          f"(ratio {million / args.release_seconds:.2f})")
    print(f"largest |x_distfit - x_nnls| {np.abs(x[:nnls_units] - reference).max():.2e}, "
          f"|x_distfit - x_dense| {np.abs(x - x_dense).max():.2e}; steps (most in a chunk) {steps} "
          f"(dense {dense_steps}); unconverged {unconverged}; mean free cells {(x > 0).sum(axis=1).mean():.1f} "
          f"of {model.cells}")


if __name__ == "__main__":
    main()
