"""The estimate stage of a multi-level run: every level's estimate, top-down (docs/design.md section 7).

A multi-level spec (``levels``, :func:`distfit.pipeline.run.run_levels`) nests its levels: every unit
of a level lies inside one unit of the level above. A level's tabulation records each unit's
parent (``parent_ids``, read from the coarser level's unit column: :func:`parent_columns`) and
its release copies it; a level under a one-population level (no unit column) has the one unit
above it as the parent of all its units.

:func:`estimate_levels` reads every level's plan and sealed release (never the data: this is
post-processing, free in privacy), recovers each unit's measurements
(:func:`distfit.estimate.measurements.recover_measurements`), forms each level's normal
equations (:func:`distfit.estimate.projection.normal_equations`) and estimates the levels
top-down (:func:`distfit.estimate.geography.estimate_top_down`): nonnegative tables, every
unit's children summing exactly to it, cell by cell (with ``integer``: integer counts, exactly).
Each level's estimate is then written, coarsest first, to ``levels/<level>/estimate.zarr`` in
the estimate store's layout (:mod:`distfit.stores.estimate`, method ``"top-down"``), built
aside and moved into place once sealed; its ``geography`` attr records the level, its parent
level and the parent's estimate (path and checksum), so a level's estimate names the exact
estimate its units sum to. A rerun reuses the estimates when every level's store is sealed
from the level's current release with the same options and its recorded parent checksum is
the parent's; otherwise every level is estimated and written again (the levels are coupled).

Where it runs: in the driver, one level at a time (the children of a level are one coupled
problem); memory holds every unit's measurements and table of the level being solved
(units x cells floats per level).
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

from distfit.estimate.geography import GeographyLevel, estimate_top_down
from distfit.estimate.measurements import measurement_model, published_estimates, recover_measurements, workload_kind
from distfit.estimate.projection import normal_equations
from distfit.stores.data import cell_labels, value_labels
from distfit.stores.estimate import (
    check_replaceable,
    chunk_rows,
    create_estimate,
    estimate_state,
    read_verified_estimate,
    seal,
)
from distfit.stores.files import STAGING_MARKER, move_into_place
from distfit.stores.lock import store_lock
from distfit.stores.plan import read_verified_plan
from distfit.stores.release import read_verified_release
from distfit.stores.release_chunks import ChunkWriter
from distfit.runtime.threads import blas_limit

__all__ = ["ESTIMATE_NAME", "METHOD", "OBJECTIVE", "LevelEstimate", "estimate_levels", "parent_columns"]

ESTIMATE_NAME = "estimate.zarr"
#: The ``method`` attr of a level's estimate store, and the objective its units minimise.
METHOD = "top-down"
OBJECTIVE = ("per level, coarsest first, per unit: sum over its own blocks and, per finer level, over the sums of "
             "its n descendants' measurements (covariance n Sigma_b) of (y_b - B_b M_b x)^T Sigma_b^-1 "
             "(y_b - B_b M_b x), over x >= 0 with the children of each parent summing to the parent's estimate "
             "cell by cell")


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
    """The sealed estimates of every level when all were made top-down from the current
    releases with these options, each naming its parent's checksum; else None."""
    found: dict[str, Any] = {}
    above = None
    for name, path in paths.items():
        if estimate_state(path) != "sealed":
            return None
        estimate = read_verified_estimate(path)  # reused only if still as sealed
        recorded = (estimate.attrs.get("geography") or {}).get("parent_estimate") or {}
        if (estimate.attrs.get("release_checksum") != releases[name].checksum or estimate.method != METHOD
                or estimate.integer != bool(integer)
                or recorded.get("checksum") != (found[above].checksum if above is not None else None)):
            return None
        found[name], above = estimate, name
    return found


def _write_level(path: Path, *, spec, plan, plan_path: Path, release, model, x: np.ndarray, integer: bool,
                 residual: np.ndarray, iterations: int, converged: np.ndarray, geography: dict, fsync: bool) -> str:
    """One level's estimate store (module docstring), built aside and moved into place; returns
    its checksum."""
    workload = workload_kind(model)
    integral = integer and workload.integral
    queries = published_estimates(model, x, workload, integer=integer)
    with store_lock(path, "estimate"):
        estimate_state(path)  # anything but an estimate store at path is refused
        staging = path.with_name(f"{path.name}{STAGING_MARKER}{secrets.token_hex(6)}")
        try:
            root = create_estimate(staging, plan=plan, plan_path=str(plan_path), release=release, method=METHOD,
                                   objective=OBJECTIVE, integer=integer, cells=model.cells,
                                   query_dtype=np.int64 if integral else np.float64,
                                   cell_labels=cell_labels(model.attributes, value_labels(spec)))
            root.attrs["geography"] = geography
            units, chunk_units = int(release.attrs["units"]), int(release.attrs["chunk_units"])
            ids = np.asarray(release.unit_ids[...])
            with ChunkWriter(str(staging)) as writer:
                for chunk, start in enumerate(range(0, units, chunk_units)):
                    rows = slice(start, min(start + chunk_units, units))
                    writer.write_arrays(chunk, start, chunk_rows(queries[rows], x[rows], residual[rows], iterations,
                                                                 converged[rows], ids[rows]))
            checksum = seal(root, staging, plan_path=str(plan_path), plan_checksum=plan.checksum,
                            release_path=release.path, release_checksum=release.checksum, fsync=fsync)
            move_into_place(staging, path, check_replaceable, fsync=fsync)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return checksum


def estimate_levels(spec: Any, level_dirs: Mapping[str, os.PathLike | str], *, integer: bool = False,
                    log: TextIO | None = None, fsync: bool = True, tol: float = 1e-9,
                    max_iter: int = 20000) -> dict[str, LevelEstimate]:
    """Estimate every level of the multi-level ``spec`` top-down (module docstring) from the
    plans and sealed releases in ``level_dirs`` (``{level: directory}`` holding ``plan.zarr``
    and ``release.zarr``, spec order) into each directory's ``estimate.zarr``. Returns the
    level estimates by name. Errors: ValueError (a release of another plan, missing or
    inconsistent parent ids), FileExistsError (something else at an estimate path)."""
    log = log or sys.stderr
    names = [level.name for level in spec.levels]
    dirs = {name: Path(os.fspath(level_dirs[name])) for name in names}
    paths = {name: dirs[name] / ESTIMATE_NAME for name in names}
    columns = parent_columns(spec)
    plans, releases = {}, {}
    for name in names:
        plans[name] = read_verified_plan(dirs[name] / "plan.zarr")
        releases[name] = read_verified_release(dirs[name] / "release.zarr")
        if releases[name].attrs.get("plan_checksum") != plans[name].checksum:
            raise ValueError(f"{releases[name].path}: was released from another plan than {dirs[name] / 'plan.zarr'}")
    parents = {name: (names[i - 1] if i else None) for i, name in enumerate(names)}
    reused = _reusable(paths, releases, integer)
    if reused is not None:
        print(f"distfit: reusing the top-down estimates of levels {', '.join(names)}", file=log)
        return {name: LevelEstimate(name, str(paths[name]), e.checksum, int(e.attrs["units"]), "reused", parents[name])
                for name, e in reused.items()}

    started = time.perf_counter()
    levels, models = [], {}
    with blas_limit():
        for i, name in enumerate(names):
            release = releases[name]
            model = models[name] = measurement_model(plans[name])
            answers = {block.block_id: np.asarray(release.block_answers(block.block_id)[...]) for block in model.blocks}
            measured = recover_measurements(model, answers)
            hessian, linear = normal_equations(model, measured)
            whitened = np.concatenate([measured[b.block_id] @ b.whitener.T for b in model.blocks], axis=1)
            parent_of = None
            if i:
                above = names[i - 1]
                parent_of = _parent_rows(name, release, above, _keys(releases[above].unit_ids), columns[name])
            levels.append(GeographyLevel(hessian, linear, parent_of, whitened))

        def progress(i: int) -> None:
            print(f"distfit: estimate level {names[i]} ({levels[i].units} units, "
                  f"{'nonnegative' if i == 0 else f'summing to level {names[i - 1]}'})", file=log)

        result = estimate_top_down(levels, integer=integer, tol=tol, max_iter=max_iter, on_level=progress)
    out: dict[str, LevelEstimate] = {}
    for i, name in enumerate(names):
        above = parents[name]
        geography = {"level": name, "levels": names, "parent_level": above, "parent_column": columns[name],
                     "parent_estimate": None if above is None else {"path": out[above].path,
                                                                    "checksum": out[above].checksum}}
        x = result.counts[i] if integer else result.x[i]
        checksum = _write_level(paths[name], spec=spec, plan=plans[name], plan_path=dirs[name] / "plan.zarr",
                                release=releases[name], model=models[name], x=x, integer=integer,
                                residual=result.residual[i], iterations=result.iterations[i],
                                converged=result.converged[i], geography=geography, fsync=fsync)
        out[name] = LevelEstimate(name, str(paths[name]), checksum, levels[i].units, "done", above)
        if not result.converged[i].all():
            print(f"distfit: note: level {name}: the solve stopped at {result.iterations[i]} iterations before its "
                  "tolerance (solve/converged)", file=log)
    print(f"distfit: top-down estimates of {len(names)} levels in {time.perf_counter() - started:.2f} s", file=log)
    return out
