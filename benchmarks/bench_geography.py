"""Top-down estimates of a multi-level run: negative answers and errors before and after, per level.

Usage::

    python benchmarks/bench_geography.py [--spec pipelines/census.yaml] [--units 1000] [--out DIR]
                                         [--integer] [--workers N | --serial]

Runs ``distfit run`` on the multi-level spec (synthetic people, so the truth is known: each
level's tabulated data store holds the true marginals; the benchmark reads them, the run's
stores never do), then prints, per level, next to each other:

* ``neg raw``: the share of negative raw answers (``queries/answers`` of the release);
* ``neg top``: the share of negative top-down estimates (``queries/estimates``; 0 by
  construction: below -1e-9, as a query summed over residual blocks may come out at -1e-13
  where it is 0) and ``neg ind``: the reference's (below; 0 too);
* ``rmse raw``, ``rmse top``, ``rmse ind``: the root mean squared error against the true answers
  ``W x`` of the raw answers, the top-down estimates and the reference, and ``top/raw`` their ratio;
* ``gap top``, ``gap ind``: the largest ``|sum of the children's answer - the parent's answer|``
  over the level's queries and units (0 up to rounding for top-down, exactly 0 with
  ``--integer``; the reference's children do not add up);

then the seconds of the top-down estimate stage (all levels) next to the reference's.
Reference: every level projected on its own (``project_nonnegative``: nonnegative, consistent
within a unit, but each level's children free of their parent), the single-level estimate.
"""
from __future__ import annotations

import argparse
import io
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from distfit.estimate.measurements import measurement_model, recover_measurements, workload_estimates  # noqa: E402
from distfit.estimate.projection import project_nonnegative  # noqa: E402
from distfit.pipeline.run import run_levels  # noqa: E402
from distfit.spec.parse import load_spec  # noqa: E402
from distfit.stores.data import open_data  # noqa: E402
from distfit.stores.estimate import read_estimate  # noqa: E402
from distfit.stores.plan import read_plan  # noqa: E402
from distfit.stores.release import read_release  # noqa: E402
from distfit.runtime.placement import Placement


def true_answers(model, data) -> np.ndarray:
    """``W x`` of every unit from the data store's true marginals (block by block, as the release)."""
    out = np.zeros((data.units, model.num_queries))
    for block in model.blocks:
        rows = data.block_counts(block.attributes, 0, data.units) @ block.query_rows.T
        np.add.at(out, (slice(None), block.query_index), rows)
    return out


def parent_rows(release, above_ids) -> np.ndarray:
    if release.parent_ids is None:
        return np.zeros(release.answers.shape[0], dtype=np.int64)
    position = {unit: i for i, unit in enumerate(np.asarray(above_ids).tolist())}
    return np.array([position[p] for p in np.asarray(release.parent_ids[...]).tolist()], dtype=np.int64)


def sum_gap(children: np.ndarray, rows: np.ndarray, parent: np.ndarray) -> float:
    """Largest gap between the children's sums and their parent (the same queries' columns)."""
    if not children.shape[1]:
        return float("nan")
    sums = np.zeros((parent.shape[0], children.shape[1]))
    np.add.at(sums, rows, children)
    return float(np.abs(sums - parent).max())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "pipelines" / "census.yaml"))
    parser.add_argument("--units", type=int, default=1000)
    parser.add_argument("--out", default=None, help="run directory (default: a temporary one)")
    parser.add_argument("--integer", action="store_true")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--serial", action="store_true")
    args = parser.parse_args(argv)
    spec = load_spec(args.spec)
    with tempfile.TemporaryDirectory(prefix="bench-geography-") as scratch:
        out = Path(args.out) if args.out else Path(scratch) / "run"
        started = time.perf_counter()
        run = run_levels(spec, out, units=args.units, placement=Placement(workers=args.workers, serial=args.serial),
                         fsync=False,
                         integer=args.integer, log=io.StringIO())
        print(f"spec {spec.name}: {args.units} finest units, run in {time.perf_counter() - started:.1f} s "
              f"({'integer' if args.integer else 'real'} estimates)")
        print(f"{'level':<8} {'units':>6} {'queries':>7} {'neg raw':>8} {'neg top':>8} {'neg ind':>8} "
              f"{'rmse raw':>9} {'rmse top':>9} {'rmse ind':>9} {'top/raw':>8} {'gap top':>9} {'gap ind':>9}")
        reference_seconds = 0.0
        above = None
        for level in spec.levels:
            directory = out / "levels" / level.name
            plan, release = read_plan(directory / "plan.zarr"), read_release(directory / "release.zarr")
            estimate = read_estimate(directory / "estimate.zarr")
            model = measurement_model(plan)
            truth = true_answers(model, open_data(directory / "data.zarr"))
            raw = np.asarray(release.answers[...])
            top = np.asarray(estimate.estimates[...], dtype=np.float64)
            t = time.perf_counter()
            answers = {b.block_id: np.asarray(release.block_answers(b.block_id)[...]) for b in model.blocks}
            independent = workload_estimates(model, project_nonnegative(model, recover_measurements(model, answers)).x)
            reference_seconds += time.perf_counter() - t
            labels = list(release.labels or [])
            gap_top = gap_ind = float("nan")
            if above is not None:
                above_labels, above_ids, above_top, above_ind = above
                shared = [j for j, label in enumerate(labels) if label in above_labels]
                rows = parent_rows(release, above_ids)
                parent_columns = [above_labels.index(labels[j]) for j in shared]
                gap_top = sum_gap(top[:, shared], rows, above_top[:, parent_columns])
                gap_ind = sum_gap(independent[:, shared], rows, above_ind[:, parent_columns])
            rmse = [float(np.sqrt(np.mean((a - truth) ** 2))) for a in (raw, top, independent)]
            print(f"{level.name:<8} {raw.shape[0]:>6} {raw.shape[1]:>7} {np.mean(raw < 0):>8.4f} "
                  f"{np.mean(top < -1e-9):>8.4f} {np.mean(independent < -1e-9):>8.4f} {rmse[0]:>9.3f} {rmse[1]:>9.3f} {rmse[2]:>9.3f} "
                  f"{rmse[1] / rmse[0]:>8.3f} {gap_top:>9.2e} {gap_ind:>9.2e}", flush=True)
            above = (labels, np.asarray(release.unit_ids[...]), top, independent)
        print(f"estimate seconds: top-down (all levels, coupled) {run.timings['estimate']:.2f} s, "
              f"reference (each level alone) {reference_seconds:.2f} s, "
              f"ratio {run.timings['estimate'] / max(reference_seconds, 1e-9):.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
