"""A multi-level run's estimates against the truth, per level: raw, top-down and the hierarchy's BLUE side by side.

Usage::

    python benchmarks/bench_geography.py [--spec pipelines/census.yaml] [--units 1000] [--run DIR]
                                         [--no-top-down] [--top-integer] [--workers N | --serial]

Reads a multi-level run (``--run DIR``: the RUNDIR of ``distfit run SPEC --out DIR --units N``
on synthetic people; else runs one into a temporary directory), whose levels' data stores hold
the true marginals (the benchmark reads them; the estimates never do), and estimates every
level again from the same releases, in this process, one BLAS thread:

* ``raw``: the release's answers;
* ``top``: the top-down estimate that multi-level runs wrote before issue 29
  (:func:`distfit.estimate.geography.estimate_top_down`: nonnegative, each level's children
  solved to sum to their parent's estimate; ``--no-top-down`` skips it, ~500 CPU-s at 20,000
  counties, and takes the run's stored estimates instead when it wrote top-down ones: a run
  of distfit before issue 29);
* ``blue``: the best linear unbiased estimate over the geography
  (:func:`distfit.estimate.hierarchy.estimate_hierarchy`, what ``distfit run`` now writes;
  checked equal to the run's stores when they hold it) and ``int``: its integer tables, what
  ``distfit run --integer`` writes (:func:`distfit.estimate.geography.integer_top_down`: top-down
  in the noise's metric, close to the BLUE, against the parents' integer counts);
* ``top int`` (``--top-integer``, ~500 CPU-s at 20,000 counties): the integer tables that
  ``--integer`` wrote before issue 29 (``estimate_top_down(..., integer=True)``: top-down
  against the parents' integer counts, close to the release).

Per level it prints the RMSE of every published query against the truth (``rmse``), the mean
absolute error of the units' totals (``mae tot``, where the level publishes a total), the share
of ``blue`` estimates below 0, how many ``blue`` estimates lie within their 90% margin of error
(``cover90``: ``|blue - truth| <= 1.645 se``, se from the hierarchy's exact variances; 0.90
expected) and the largest gap between a parent's table and the sum of its children's (``gap``).
Then the CPU and wall seconds of each estimate (the passes only, no reading or writing).
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

from distfit.estimate.geography import GeographyLevel, estimate_top_down, integer_top_down  # noqa: E402
from distfit.estimate.hierarchy import estimate_hierarchy, query_variances  # noqa: E402
from distfit.estimate.measurements import measurement_model, recover_measurements, workload_estimates  # noqa: E402
from distfit.estimate.projection import normal_equations  # noqa: E402
from distfit.pipeline.run import run_levels  # noqa: E402
from distfit.runtime.placement import Placement  # noqa: E402
from distfit.runtime.threads import blas_limit  # noqa: E402
from distfit.spec.parse import load_spec  # noqa: E402
from distfit.stores.data import open_data  # noqa: E402
from distfit.stores.estimate import read_estimate  # noqa: E402
from distfit.stores.plan import read_plan  # noqa: E402
from distfit.stores.release import read_release  # noqa: E402


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


def timed(function):
    cpu, wall = time.process_time(), time.perf_counter()
    out = function()
    return out, time.process_time() - cpu, time.perf_counter() - wall


def rmse(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.sqrt(np.mean((np.asarray(a, dtype=float) - b) ** 2)))


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spec", default=str(ROOT / "pipelines" / "census.yaml"))
    parser.add_argument("--units", type=int, default=1000)
    parser.add_argument("--run", default=None, help="an existing RUNDIR of the spec (default: run one)")
    parser.add_argument("--no-top-down", action="store_true")
    parser.add_argument("--top-integer", action="store_true", help="also the integer tables of before issue 29")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--serial", action="store_true")
    args = parser.parse_args(argv)
    spec = load_spec(args.spec)
    with tempfile.TemporaryDirectory(prefix="bench-geography-") as scratch:
        out = Path(args.run) if args.run else Path(scratch) / "run"
        if not args.run:
            run_levels(spec, out, units=args.units, placement=Placement(workers=args.workers, serial=args.serial),
                       fsync=False, log=io.StringIO())
        names = [level.name for level in spec.levels]
        models, releases, truths, raws, levels, parents, hs, gs = [], [], [], [], [], [], [], []
        above_ids = None
        for name in names:
            directory = out / "levels" / name
            plan, release = read_plan(directory / "plan.zarr"), read_release(directory / "release.zarr")
            model = measurement_model(plan)
            answers = {b.block_id: np.asarray(release.block_answers(b.block_id)[...]) for b in model.blocks}
            measured = recover_measurements(model, answers)
            hessian, linear = normal_equations(model, measured)
            whitened = np.concatenate([measured[b.block_id] @ b.whitener.T for b in model.blocks], axis=1)
            rows = None if above_ids is None else parent_rows(release, above_ids)
            models.append(model)
            releases.append(release)
            truths.append(true_answers(model, open_data(directory / "data.zarr")))
            raws.append(np.asarray(release.answers[...]))
            levels.append(GeographyLevel(hessian, linear, None if rows is None or release.parent_ids is None else rows,
                                         whitened))
            parents.append(rows)
            hs.append(hessian)
            gs.append(linear)
            above_ids = np.asarray(release.unit_ids[...])
        units = [g.shape[0] for g in gs]
        print(f"spec {spec.name}: levels {', '.join(f'{n} {u:,}' for n, u in zip(names, units))} units "
              f"({out}); one BLAS thread")
        with blas_limit():
            blue, blue_cpu, blue_wall = timed(lambda: estimate_hierarchy(hs, gs, parents, split="total"))
            counts, int_cpu, int_wall = timed(lambda: integer_top_down(levels, blue.x))
            top = top_int = None
            if not args.no_top_down:
                top, top_cpu, top_wall = timed(lambda: estimate_top_down(levels))
            if args.top_integer:
                top_int, top_int_cpu, top_int_wall = timed(lambda: estimate_top_down(levels, integer=True))
        header = (f"{'level':<8} {'units':>7} {'rmse raw':>9} {'rmse top':>9} {'rmse blue':>9} {'rmse int':>9} "
                  f"{'rmse top int':>12} {'mae tot raw':>11} {'top':>6} {'blue':>6} {'int':>6} {'top int':>7} "
                  f"{'neg blue':>8} {'cover90':>7} "
                  f"{'gap blue':>9} {'gap int':>7}")
        print(header)
        for i, name in enumerate(names):
            model, truth, raw = models[i], truths[i], raws[i]
            estimates = {"blue": workload_estimates(model, blue.x[i]),
                         "int": workload_estimates(model, counts[i].astype(np.float64))}
            stored = read_estimate(out / "levels" / name / "estimate.zarr")
            if top is not None:
                estimates["top"] = workload_estimates(model, top.x[i])
            if top_int is not None:
                estimates["top int"] = workload_estimates(model, top_int.counts[i].astype(np.float64))
            elif stored.method == "top-down" and not stored.integer:  # the run's own, from this release
                estimates["top"] = np.asarray(stored.estimates[...], dtype=np.float64)
            variances = query_variances(model.workload, blue.covariance[i], blue.unit_class[i])
            cover = float(np.mean(np.abs(estimates["blue"] - truth) <= 1.645 * np.sqrt(variances)))
            if stored.method == "hierarchy-gls" and not stored.integer:  # the run wrote this very estimate
                scale = float(np.abs(estimates["blue"]).max(initial=1.0))
                assert np.allclose(np.asarray(stored.estimates[...]), estimates["blue"], rtol=0.0, atol=1e-12 * scale)
            total = np.flatnonzero((model.workload == 1.0).all(axis=1))
            mae = {key: (float(np.mean(np.abs(value[:, total[0]] - truth[:, total[0]]))) if total.size else float("nan"))
                   for key, value in [("raw", raw), *estimates.items()]}
            gaps = {"blue": float("nan"), "int": float("nan")}
            if i:
                for key, tables, above in (("blue", blue.x[i], blue.x[i - 1]), ("int", counts[i], counts[i - 1])):
                    sums = np.zeros_like(above)
                    np.add.at(sums, parents[i], tables)
                    gaps[key] = float(np.abs(sums - above)[np.unique(parents[i])].max())
            top_rmse = rmse(estimates["top"], truth) if "top" in estimates else float("nan")
            top_mae = mae.get("top", float("nan"))
            top_int_rmse = rmse(estimates["top int"], truth) if "top int" in estimates else float("nan")
            print(f"{name:<8} {units[i]:>7,} {rmse(raw, truth):>9.3f} {top_rmse:>9.3f} "
                  f"{rmse(estimates['blue'], truth):>9.3f} {rmse(estimates['int'], truth):>9.3f} {top_int_rmse:>12.3f} "
                  f"{mae['raw']:>11.3f} {top_mae:>6.3f} {mae['blue']:>6.3f} {mae['int']:>6.3f} "
                  f"{mae.get('top int', float('nan')):>7.3f} "
                  f"{np.mean(estimates['blue'] < 0):>8.4f} {cover:>7.4f} {gaps['blue']:>9.1e} {gaps['int']:>7.0f}",
                  flush=True)
        print(f"estimate (passes only, CPU / wall s): blue {blue_cpu:.2f} / {blue_wall:.2f}, its integer tables "
              f"{int_cpu:.2f} / {int_wall:.2f}" + ("" if top is None else f", top-down {top_cpu:.2f} / {top_wall:.2f}")
              + ("" if top_int is None else f", top-down integer {top_int_cpu:.2f} / {top_int_wall:.2f}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
