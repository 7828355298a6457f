"""A multi-level run's estimates against the truth, per level: raw, top-down, the hierarchy's BLUE and its integer tables side by side.

Usage::

    python benchmarks/bench_geography.py [--spec pipelines/census.yaml] [--units 1000] [--run DIR]
                                         [--no-top-down] [--no-old-integer] [--top-integer] [--tol T]
                                         [--workers N | --serial]

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
  checked equal to the run's stores when they hold it);
* ``nonneg``: what ``distfit run --nonnegative`` writes
  (:func:`distfit.estimate.geography.nonnegative_top_down`: the BLUE's nearest nonnegative
  tables in the noise's metric, children summing to their parent's real-valued tables; issue
  29 point 7's new estimate, never worse than ``raw`` or ``top``: the line after the table
  gives ``nonneg`` minus each per level, which must be <= 0 up to the solvers' tolerance);
* ``step`` and ``int``: what ``distfit run --integer`` writes
  (:func:`distfit.estimate.geography.integer_top_down`), ``step`` the real-valued tables of its
  nonnegative top-down step (in the noise's metric, close to the BLUE, against the parents'
  integer counts) and ``int`` their controlled rounding
  (:func:`distfit.estimate.rounding.round_controlled`: each unit's total and the sums over the
  laminar family of its level's queries within 1);
* ``old step`` and ``old int`` (``--no-old-integer`` skips them): the same top-down step with the
  rounding of before issue 29 point 4, each cell among its siblings alone
  (``rounding="cells"``);
* ``top int`` (``--top-integer``, ~500 CPU-s at 20,000 counties): the integer tables that
  ``--integer`` wrote before issue 29 (``estimate_top_down(..., integer=True, rounding="cells")``:
  top-down against the parents' integer counts, close to the release).

Per level it prints the RMSE of every published query against the truth, the share of ``blue``
estimates below 0, how many ``blue`` estimates lie within their 90% margin of error
(``cover90``: ``|blue - truth| <= 1.645 se``, se from the hierarchy's exact variances; 0.90
expected; ``cover nn``: the same margins around the ``nonneg`` tables, as ``--nonnegative``
publishes them) and the largest gap between a parent's table and the sum of its children's (``gap``);
then the mean absolute error of the units' totals (where the level publishes a total), the
ratios ``int / blue`` and ``old int / blue`` (issue 29's goal: at most 1.1) and the mean change
of the unit totals the integer step makes (``|int - blue|``). Then the CPU and wall seconds of
each estimate (the passes only, no reading or writing) and the load average.
"""
from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from distfit.estimate.geography import GeographyLevel, estimate_top_down  # noqa: E402
from distfit.estimate.hierarchy import estimate_hierarchy  # noqa: E402
from distfit.estimate.measurements import measurement_model, recover_measurements, workload_estimates  # noqa: E402
from distfit.estimate.projection import normal_equations  # noqa: E402
from distfit.estimate.rounding import laminar_family  # noqa: E402
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
    parser.add_argument("--tol", type=float, default=1e-6, help="the top-down step's tolerance (integer_top_down's)")
    parser.add_argument("--no-old-integer", action="store_true",
                        help="skip the integer tables rounded cell by cell (before issue 29 point 4)")
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
        families = [laminar_family(model.workload) for model in models]
        print(f"spec {spec.name}: levels {', '.join(f'{n} {u:,}' for n, u in zip(names, units))} units "
              f"({out}); one BLAS thread; load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}")
        seconds = {}
        with blas_limit():
            blue, *seconds["blue"] = timed(lambda: estimate_hierarchy(hs, gs, parents, split="total"))
            new, *seconds["int"] = timed(lambda: estimate_top_down(levels, integer=True, tol=args.tol, centre=blue.x,
                                                                     families=families))
            nonneg, *seconds["nonneg"] = timed(lambda: estimate_top_down(levels, tol=1e-9, centre=blue.x))
            old = top = top_int = None
            if not args.no_old_integer:
                old, *seconds["old int"] = timed(lambda: estimate_top_down(levels, integer=True, tol=args.tol,
                                                                             centre=blue.x, rounding="cells"))
            if not args.no_top_down:
                top, *seconds["top"] = timed(lambda: estimate_top_down(levels))
            if args.top_integer:
                top_int, *seconds["top int"] = timed(lambda: estimate_top_down(levels, integer=True, rounding="cells"))
        rows = []
        for i, name in enumerate(names):
            model, truth = models[i], truths[i]
            estimates = {"raw": raws[i], "blue": workload_estimates(model, blue.x[i]),
                         "step": workload_estimates(model, new.x[i]),
                         "nonneg": workload_estimates(model, nonneg.x[i]),
                         "int": workload_estimates(model, new.counts[i].astype(np.float64))}
            if old is not None:
                estimates["old step"] = workload_estimates(model, old.x[i])
                estimates["old int"] = workload_estimates(model, old.counts[i].astype(np.float64))
            stored_path = out / "levels" / name / "estimate.zarr"
            stored = read_estimate(stored_path) if stored_path.exists() else None  # a run with --no-estimate: none
            if top is not None:
                estimates["top"] = workload_estimates(model, top.x[i])
            elif stored is not None and stored.method == "top-down" and not stored.integer:  # the run's own, from this release
                estimates["top"] = np.asarray(stored.estimates[...], dtype=np.float64)
            if top_int is not None:
                estimates["top int"] = workload_estimates(model, top_int.counts[i].astype(np.float64))
            class_rows, classes = blue.variances(i, model.workload)
            variances = class_rows[classes]
            cover = float(np.mean(np.abs(estimates["blue"] - truth) <= 1.645 * np.sqrt(variances)))
            # --nonnegative publishes the BLUE's margins beside its tables: how often they cover
            cover_nonneg = float(np.mean(np.abs(estimates["nonneg"] - truth) <= 1.645 * np.sqrt(variances)))
            if stored is not None and stored.method == "hierarchy-gls" and not stored.integer:  # the run wrote this very estimate
                scale = float(np.abs(estimates["blue"]).max(initial=1.0))
                assert np.allclose(np.asarray(stored.estimates[...]), estimates["blue"], rtol=0.0, atol=1e-12 * scale)
            total = np.flatnonzero((model.workload == 1.0).all(axis=1))
            mae = {key: (float(np.mean(np.abs(value[:, total[0]] - truth[:, total[0]]))) if total.size else float("nan"))
                   for key, value in estimates.items()}
            # what the integer step adds to the real-valued estimate, per unit total (not against the truth)
            moved = {key: float(np.mean(np.abs(new_or_old.counts[i].sum(axis=1) - blue.x[i].sum(axis=1))))
                     for key, new_or_old in (("int", new), ("old int", old)) if new_or_old is not None}
            gaps = {"blue": float("nan"), "int": float("nan")}
            if i:
                for key, tables, above in (("blue", blue.x[i], blue.x[i - 1]), ("int", new.counts[i], new.counts[i - 1])):
                    sums = np.zeros_like(above)
                    np.add.at(sums, parents[i], tables)
                    gaps[key] = float(np.abs(sums - above)[np.unique(parents[i])].max())
            rows.append((name, units[i], {key: rmse(value, truth) for key, value in estimates.items()}, mae, moved,
                         float(np.mean(estimates["blue"] < 0)), (cover, cover_nonneg), gaps))
        columns = [key for key in ("raw", "top", "blue", "nonneg", "step", "int", "old step", "old int", "top int")
                   if key in rows[0][2]]
        print("RMSE per published query against the truth")
        print(f"{'level':<8} {'units':>7} " + " ".join(f"{key:>9}" for key in columns)
              + f" {'blue < 0':>8} {'cover90':>7} {'cover nn':>8} {'gap blue':>9} {'gap int':>7}")
        for name, count, errors, _mae, _moved, negative, (cover, cover_nonneg), gaps in rows:
            print(f"{name:<8} {count:>7,} " + " ".join(f"{errors[key]:>9.4f}" for key in columns)
                  + f" {negative:>8.4f} {cover:>7.4f} {cover_nonneg:>8.4f} {gaps['blue']:>9.1e} {gaps['int']:>7.0f}")
        if "top" in columns:
            print("nonneg minus raw, minus top (RMSE; point 7: <= 0, up to the solvers' tolerance): " + ", ".join(
                f"{name} {errors['nonneg'] - errors['raw']:+.6f} {errors['nonneg'] - errors['top']:+.6f}"
                for name, _count, errors, *_rest in rows))
        print("mean absolute error of the unit totals against the truth (int / blue: the goal is <= 1.1); "
              "|int - blue|: the integer step's own change of the totals")
        print(f"{'level':<8} {'units':>7} " + " ".join(f"{key:>9}" for key in columns)
              + f" {'int/blue':>8} {'old/blue':>8} {'|int-blue|':>10} {'|old-blue|':>10}")
        for name, count, _errors, mae, moved, *_rest in rows:
            print(f"{name:<8} {count:>7,} " + " ".join(f"{mae[key]:>9.3f}" for key in columns)
                  + f" {mae['int'] / mae['blue']:>8.3f} {mae.get('old int', np.nan) / mae['blue']:>8.3f}"
                  + f" {moved['int']:>10.3f} {moved.get('old int', np.nan):>10.3f}")
        print("estimate (passes only, CPU / wall s): " + ", ".join(
            f"{key} {cpu:.2f} / {wall:.2f}" for key, (cpu, wall) in seconds.items())
            + f"; load average {' '.join(f'{v:.1f}' for v in os.getloadavg())}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
