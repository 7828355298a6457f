"""The estimate stage of a multi-level run: the best linear unbiased estimate over the geography (docs/design.md section 7).

A multi-level spec (``levels``, :func:`distfit.pipeline.run.run_levels`) nests its levels: every unit
of a level lies inside one unit of the level above. A level's tabulation records each unit's
parent (``parent_ids``, read from the coarser level's unit column: :func:`parent_columns`) and
its release copies it; a level under a one-population level (no unit column) has the one unit
above it as the parent of all its units.

:func:`estimate_levels` reads every level's plan and sealed release (never the data: this is
post-processing, free in privacy), recovers each unit's measurements
(:func:`distfit.estimate.measurements.recover_measurements`), forms each level's normal
equations (:func:`distfit.estimate.projection.normal_equations`: ``J_l = H``, ``h_u = g_u``)
and estimates every unit of every level at once by generalised least squares over the tree
(:func:`distfit.estimate.hierarchy.estimate_hierarchy`: an upward and a downward pass, every
matrix once per class of same-shaped subtrees): each published query's best linear unbiased
estimate, in every level's own noise metric, and its exact variance (stored as
``queries/variances``, given by ``distfit export`` as ``se`` and ``moe90``).

Consistency, and how exact. Real-valued (the default): every unit's table is the sum of its
children's up to float rounding (the hierarchy puts each parent's rounding residual on its last
child, so ``|sum of the children - the parent| <= a few ulps of the tables``); the estimates are
unbiased, so where the release is noisy around 0 some are below 0 (they are not clipped:
clipping would bias them and void the variances). With ``integer``: nonnegative integer tables
from those estimates (:func:`distfit.estimate.geography.integer_top_down`: level by level,
coarsest first, the nonnegative tables nearest the estimates in the metric of the release's
noise, children summing to their parent's integer counts, then a controlled rounding:
:func:`distfit.estimate.rounding.round_controlled`, keeping those sums exactly and every unit's
total, and its sums over the laminar family of its level's queries that
:func:`distfit.estimate.rounding.laminar_family` picks, within 1), every unit's children summing
exactly (bitwise, int64) to it, cell by cell; the integers are not linear in the release, so no
variances are stored with them.

Each level's estimate is then written, coarsest first, to ``levels/<level>/estimate.zarr`` in
the estimate store's layout (:mod:`distfit.stores.estimate`, method :data:`METHOD`), built
aside and moved into place once sealed; its ``geography`` attr records the level, its parent
level and the parent's estimate (path and checksum), so a level's estimate names the exact
estimate its units sum to. ``solve/objective`` holds each unit's own weighted squared residual
``||C_b^-1 (y_b - B_b M_b x)||^2`` summed over its blocks; ``solve/iterations`` 0 and
``solve/converged`` 1 (the passes are direct). A rerun reuses the estimates when every
level's store is sealed from the level's current release with the same method and options
and its recorded parent checksum is the parent's; otherwise every level is estimated and
written again (the levels are coupled).

Verification: every level's plan is verified whole (:func:`distfit.stores.plan.read_verified_plan`)
and its release as it is read (:func:`distfit.stores.release.read_sealed_release`: the root before
anything is computed, then every chunk of the block answers and unit ids hashed as the estimate
reads it, before it is used; a changed chunk is refused in one line naming the release, the array
and the units before any level's estimate is written). Estimates reused by a rerun have their
roots checked (what they state, their digests); their chunks are checked by whoever reads them
(the report, the export).

Where it runs: in the driver (the passes take about a CPU-second at 20,000 counties and 224
cells: benchmarks/README.md); memory holds every level's measurements and tables (a few units x
cells floats per level) and the hierarchy's class matrices. It needs the dense information
(at most :data:`distfit.estimate.projection.DENSE_CELLS` cells: :func:`check_levels`).
"""
from __future__ import annotations

import os
import secrets
import shutil
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from distfit.estimate.geography import GeographyLevel, integer_top_down
from distfit.estimate.hierarchy import estimate_hierarchy, query_variances
from distfit.estimate.measurements import (
    measurement_model,
    published_estimates,
    recover_measurements,
    workload_estimates,
    workload_kind,
)
from distfit.estimate.projection import DENSE_CELLS, normal_equations, quadratic_objective
from distfit.estimate.rounding import laminar_family
from distfit.stores.data import cell_labels, value_labels
from distfit.stores.estimate import (
    check_replaceable,
    chunk_rows,
    create_estimate,
    estimate_state,
    read_sealed_estimate,
    seal,
)
from distfit.stores.files import STAGING_MARKER, move_into_place
from distfit.stores.lock import store_lock
from distfit.stores.plan import read_verified_plan
from distfit.stores.release import read_sealed_release
from distfit.stores.release_chunks import ChunkWriter
from distfit.runtime.threads import blas_limit

__all__ = ["ESTIMATE_NAME", "METHOD", "OBJECTIVE", "LevelEstimate", "check_levels", "estimate_levels", "parent_columns"]

ESTIMATE_NAME = "estimate.zarr"
#: The ``method`` attr of a level's estimate store, and the objective its estimates minimise.
METHOD = "hierarchy-gls"
OBJECTIVE = ("over every unit u of every level l at once: sum_u sum_b (y_bu - B_b M_b x_u)^T Sigma_b^-1 "
             "(y_bu - B_b M_b x_u), every unit's table x_u the sum of its children's (generalised least squares "
             "over the geography tree: each query's best linear unbiased estimate); with integer, then "
             "nonnegative integer tables, each level's nearest to it in the metric of its own and its descendants' "
             "measurements, summing to its parents' counts, rounded keeping the sums exactly and each unit's total "
             "and laminar query sums within 1 (controlled rounding)")


def parent_columns(spec: Any) -> dict[str, str | None]:
    """Each level's parent column, by level name (spec order): the unit column of the nearest
    coarser level (earlier in ``spec.levels``) that has one; None for a level with no unit
    column, or with no coarser level that has one (its parent, if any, is one population)."""
    out: dict[str, str | None] = {}
    above: str | None = None
    for level in spec.levels:
        column = level.units.column if level.units is not None else None
        out[level.name] = above if column is not None else None
        above = column or above
    return out


@dataclass(frozen=True)
class LevelEstimate:
    """A level's estimate store: ``path``, ``checksum``, ``units``, ``status`` (``"done"`` or
    ``"reused"``), ``parent`` (the parent level, None for the root)."""

    level: str
    path: str
    checksum: str
    units: int
    status: str
    parent: str | None


def _keys(ids: Any) -> np.ndarray:
    """Unit ids as comparable numpy keys: int64, or text."""
    ids = np.asarray(ids[...])
    return ids.astype(np.int64) if ids.dtype.kind in "iu" else np.asarray(ids.tolist(), dtype=str)


def _parent_rows(name: str, release, above_name: str, above_ids: np.ndarray, column: str | None) -> np.ndarray | None:
    """Each unit's parent row in the level above (None under a one-population level), from the
    release's ``parent_ids``; ValueError naming the level and the problem."""
    if column is None:
        if above_ids.size != 1:
            raise ValueError(f"level {name}: no unit column above it but level {above_name} has {above_ids.size} units")
        return None
    if release.parent_ids is None or release.parent_column != column:
        raise ValueError(f"{release.path}: level {name}'s release has no parent ids of column {column!r} "
                         f"(recorded: {release.parent_column!r}); tabulate and release it again (a new --out)")
    parents, keys = _keys(release.parent_ids), above_ids
    if parents.dtype.kind != keys.dtype.kind:
        parents, keys = parents.astype(str), keys.astype(str)
    order = np.argsort(keys, kind="stable")
    found = np.minimum(np.searchsorted(keys, parents, sorter=order), max(keys.size - 1, 0))
    rows = order[found] if keys.size else np.zeros(parents.size, dtype=np.int64)
    missing = np.flatnonzero(keys[rows] != parents) if keys.size else np.arange(parents.size)
    if missing.size:
        raise ValueError(f"level {name}: unit {_keys(release.unit_ids)[missing[0]]!r} has parent "
                         f"{parents[missing[0]]!r} ({column}), which is not a unit of level {above_name}")
    return rows.astype(np.int64)


def _reusable(paths: Mapping[str, Path], releases: Mapping[str, Any], integer: bool) -> dict[str, Any] | None:
    """The sealed estimates of every level when all were made by :data:`METHOD` (and
    :data:`OBJECTIVE`) from the current releases with these options, each naming its parent's
    checksum; else None."""
    found: dict[str, Any] = {}
    above = None
    for name, path in paths.items():
        if estimate_state(path) != "sealed":
            return None
        estimate = read_sealed_estimate(path)  # reused only if its root still hashes as sealed (chunks: as read)
        recorded = (estimate.attrs.get("geography") or {}).get("parent_estimate") or {}
        if (estimate.attrs.get("release_checksum") != releases[name].checksum or estimate.method != METHOD
                or estimate.attrs.get("objective") != OBJECTIVE  # e.g. integer tables made another way
                or estimate.integer != bool(integer)
                or recorded.get("checksum") != (found[above].checksum if above is not None else None)):
            return None
        found[name], above = estimate, name
    return found


def check_levels(spec: Any) -> None:
    """Raise ValueError (one line naming the spec's cells) unless the levels of ``spec`` can be
    estimated: the hierarchy holds cells x cells matrices (at most :data:`DENSE_CELLS` cells).
    Called before a run plans or releases anything."""
    cells = int(np.prod(spec.domain.shape, dtype=np.int64))
    if cells > DENSE_CELLS:
        raise ValueError(f"{spec.name}: {cells} cells; a multi-level estimate holds cells x cells matrices, "
                         f"at most {DENSE_CELLS} cells (fewer attribute values, or run without the estimate)")


def _write_level(path: Path, *, spec, plan, plan_path: Path, release, model, x: np.ndarray, integer: bool,
                 objective: np.ndarray, variances: np.ndarray | None, geography: dict, fsync: bool) -> str:
    """One level's estimate store (module docstring), built aside and moved into place; returns
    its checksum."""
    workload = workload_kind(model)
    integral = integer and workload.integral
    queries = (published_estimates(model, x, workload, integer=True) if integer
               else workload_estimates(model, x))  # unbiased: nothing clipped
    converged = np.ones(x.shape[0], dtype=np.uint8)
    with store_lock(path, "estimate"):
        estimate_state(path)  # anything but an estimate store at path is refused
        staging = path.with_name(f"{path.name}{STAGING_MARKER}{secrets.token_hex(6)}")
        try:
            root = create_estimate(staging, plan=plan, plan_path=str(plan_path), release=release, method=METHOD,
                                   objective=OBJECTIVE, integer=integer, cells=model.cells,
                                   query_dtype=np.int64 if integral else np.float64,
                                   cell_labels=cell_labels(model.attributes, value_labels(spec)),
                                   variances=variances is not None)
            root.attrs["geography"] = geography
            units, chunk_units = int(release.attrs["units"]), int(release.attrs["chunk_units"])
            ids = np.asarray(release.unit_ids[...])
            with ChunkWriter(str(staging)) as writer:
                for chunk, start in enumerate(range(0, units, chunk_units)):
                    rows = slice(start, min(start + chunk_units, units))
                    writer.write_arrays(chunk, start, chunk_rows(
                        queries[rows], x[rows], objective[rows], 0, converged[rows], ids[rows],
                        variances=None if variances is None else variances[rows]))
            checksum = seal(root, staging, plan_path=str(plan_path), plan_checksum=plan.checksum,
                            release_path=release.path, release_checksum=release.checksum, fsync=fsync)
            move_into_place(staging, path, check_replaceable, fsync=fsync)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return checksum


def _residuals(hessian: np.ndarray, linear: np.ndarray, norms: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Each unit's own weighted squared residual ``||C^-1 (y - B M x)||^2 = x^T H x - 2 g^T x +
    ||C^-1 y||^2`` (summed over its blocks; at least 0: the expansion cancels)."""
    return np.maximum(2.0 * quadratic_objective(hessian, linear, np.asarray(x, dtype=np.float64)) + norms, 0.0)


def estimate_levels(spec: Any, level_dirs: Mapping[str, os.PathLike | str], *, integer: bool = False,
                    log: TextIO | None = None, fsync: bool = True) -> dict[str, LevelEstimate]:
    """Estimate every level of the multi-level ``spec`` (module docstring) from the plans and
    sealed releases in ``level_dirs`` (``{level: directory}`` holding ``plan.zarr`` and
    ``release.zarr``, spec order) into each directory's ``estimate.zarr``. Returns the level
    estimates by name. Errors: ValueError (a release of another plan, missing or inconsistent
    parent ids, too many cells: :func:`check_levels`), FileExistsError (something else at an
    estimate path)."""
    log = log or sys.stderr
    check_levels(spec)
    names = [level.name for level in spec.levels]
    dirs = {name: Path(os.fspath(level_dirs[name])) for name in names}
    paths = {name: dirs[name] / ESTIMATE_NAME for name in names}
    columns = parent_columns(spec)
    plans, releases = {}, {}
    for name in names:
        plans[name] = read_verified_plan(dirs[name] / "plan.zarr")
        # the root checked now, each chunk as the estimate reads it (one read, no separate pass)
        releases[name] = read_sealed_release(dirs[name] / "release.zarr")
        if releases[name].attrs.get("plan_checksum") != plans[name].checksum:
            raise ValueError(f"{releases[name].path}: was released from another plan than {dirs[name] / 'plan.zarr'}")
    parents = {name: (names[i - 1] if i else None) for i, name in enumerate(names)}
    reused = _reusable(paths, releases, integer)
    if reused is not None:
        print(f"distfit: reusing the estimates of levels {', '.join(names)}", file=log)
        return {name: LevelEstimate(name, str(paths[name]), e.checksum, int(e.attrs["units"]), "reused", parents[name])
                for name, e in reused.items()}

    started = time.perf_counter()
    models, hessians, linears, norms, parent_of = {}, [], [], [], []
    with blas_limit():
        for i, name in enumerate(names):
            release = releases[name]
            model = models[name] = measurement_model(plans[name])
            answers = {block.block_id: np.asarray(release.block_answers(block.block_id)[...]) for block in model.blocks}
            measured = recover_measurements(model, answers)
            hessian, linear = normal_equations(model, measured)
            hessians.append(np.asarray(hessian))
            linears.append(linear)
            norms.append(sum(np.einsum("ij,ij->i", w, w) for w in (measured[b.block_id] @ b.whitener.T
                                                                  for b in model.blocks)))
            rows = None
            if i:
                above = names[i - 1]
                rows = _parent_rows(name, release, above, _keys(releases[above].unit_ids), columns[name])
                rows = np.zeros(linear.shape[0], dtype=np.int64) if rows is None else rows
            parent_of.append(rows)
        units = sum(h.shape[0] for h in linears)
        print(f"distfit: estimate levels {', '.join(names)} ({units:,} units): best linear unbiased over the "
              f"geography{', then integer tables' if integer else ''}", file=log)
        result = estimate_hierarchy(hessians, linears, parent_of, split="total")
        xs = (integer_top_down([GeographyLevel(h, g, up) for h, g, up in zip(hessians, linears, parent_of)], result.x,
                               families=[laminar_family(models[name].workload) for name in names])
              if integer else result.x)
        variances = [None if integer or models[name].workload is None
                     else query_variances(models[name].workload, result.covariance[i], result.unit_class[i])
                     for i, name in enumerate(names)]
        objectives = [_residuals(h, g, n, x) for h, g, n, x in zip(hessians, linears, norms, xs)]
    seconds = time.perf_counter() - started
    out: dict[str, LevelEstimate] = {}
    for i, name in enumerate(names):
        above = parents[name]
        geography = {"level": name, "levels": names, "parent_level": above, "parent_column": columns[name],
                     "parent_estimate": None if above is None else {"path": out[above].path,
                                                                    "checksum": out[above].checksum}}
        checksum = _write_level(paths[name], spec=spec, plan=plans[name], plan_path=dirs[name] / "plan.zarr",
                                release=releases[name], model=models[name], x=xs[i], integer=integer,
                                objective=objectives[i], variances=variances[i], geography=geography, fsync=fsync)
        out[name] = LevelEstimate(name, str(paths[name]), checksum, int(linears[i].shape[0]), "done", above)
    print(f"distfit: estimates of {len(names)} levels in {time.perf_counter() - started:.2f} s "
          f"({seconds:.2f} s to estimate, the rest to write and seal)", file=log)
    return out
