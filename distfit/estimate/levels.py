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
matrix once per class of same-shaped subtrees, or, when every level's information is diagonal
in one basis, d scalar trees: :mod:`distfit.estimate.shared_basis`): each published query's best linear unbiased
estimate, in every level's own noise metric, and its exact variance (stored once per class of
units sharing a covariance, ``queries/variance_rows`` by ``queries/variance_class``: a block's are
its block group's; given by ``distfit export`` as ``se`` and ``moe90``).

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
variances are stored with them. With ``nonnegative`` (``distfit run --nonnegative``): the same
top-down step, not rounded, against the parents' real-valued tables
(:func:`distfit.estimate.geography.nonnegative_top_down`): nonnegative tables, every unit's the
sum of its children's to float rounding, at least as close to the truth as the top-down
estimate of before issue 29 at every level (benchmarks/bench_geography.py), stored with method
:data:`distfit.estimate.level_stores.NONNEGATIVE_METHOD` and the BLUE's variances: ``se`` and
``moe90`` are then the margins of the unbiased estimate the tables were projected from, which
the export says (decision: a nonnegative table's own error has no closed form; the BLUE's is
exact).

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
(at most :data:`distfit.estimate.projection.DENSE_CELLS` cells: :func:`check_levels`). Given a
cluster (``placement``, as ``distfit run`` does from :data:`CLUSTER_UNITS` units over the levels),
the estimate runs there instead, the tree cut at a level into subtrees that are Dask
tasks, the driver holding only the levels above the cut, each level below written chunk by chunk
and sealed, resumably (:mod:`distfit.estimate.subtree_job`; the same estimate to float
rounding). With ``integer`` the driver makes the levels above the cut's integer tables and each
forest continues the top-down from its roots' (the integer top-down is per parent: the same
integers as the driver's over the whole tree, bit for bit, from the same real-valued estimates).
The estimate of a geography whose levels are not ordered by their parents' rows runs in the
driver (a note says why).
"""
from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from distfit.estimate.geography import GeographyLevel
from distfit.estimate.hierarchy import check_parent_of, estimate_hierarchy
from distfit.estimate.level_stores import (
    ESTIMATE_NAME,
    METHOD,
    OBJECTIVE,
    LevelEstimate,
    information_basis,
    level_terms,
    parent_rows,
    published_tables,
    residuals,
    reusable_estimate,
    unit_keys,
    write_level,
)
from distfit.estimate.measurements import measurement_model
from distfit.estimate.projection import DENSE_CELLS
from distfit.estimate.subtree_job import FOREST_ROWS, Unordered, estimate_on_cluster
from distfit.estimate.subtrees import DRIVER_UNITS, choose_cut
from distfit.runtime.placement import Placement, placement_client
from distfit.runtime.progress import LONG_STAGE_SECONDS, Progress
from distfit.runtime.threads import blas_limit
from distfit.stores.plan import read_verified_plan
from distfit.stores.release import read_sealed_release

#: Units over all levels from which a run's estimate goes to its cluster (below, the driver's
#: passes take a few seconds and the cluster's tasks cost more than they save: benchmarks/README.md).
CLUSTER_UNITS = 100_000

__all__ = ["CLUSTER_UNITS", "ESTIMATE_NAME", "METHOD", "OBJECTIVE", "LevelEstimate", "check_levels", "estimate_levels", "parent_columns"]



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


def _reusable(paths: Mapping[str, Path], releases: Mapping[str, Any], integer: bool,
              nonnegative: bool) -> dict[str, Any] | None:
    """The sealed estimates of every level when all were made by :data:`METHOD` (and
    :data:`OBJECTIVE`) from the current releases with these options, each naming its parent's
    checksum; else None."""
    found: dict[str, Any] = {}
    above = None
    for name, path in paths.items():
        estimate = reusable_estimate(path, releases[name], found[above].checksum if above is not None else None,
                                     integer=integer, nonnegative=nonnegative)
        if estimate is None:
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


def estimate_levels(spec: Any, level_dirs: Mapping[str, os.PathLike | str], *, integer: bool = False,
                    nonnegative: bool = False, log: TextIO | None = None, fsync: bool = True, placement: Placement | None = None,
                    cut: int | None = None, driver_units: int = DRIVER_UNITS, forest_rows: int = FOREST_ROWS,
                    cluster_units: int = CLUSTER_UNITS) -> dict[str, LevelEstimate]:
    """Estimate every level of the multi-level ``spec`` (module docstring) from the plans and
    sealed releases in ``level_dirs`` (``{level: directory}`` holding ``plan.zarr`` and
    ``release.zarr``, spec order) into each directory's ``estimate.zarr``. Returns the level
    estimates by name. ``placement`` (not serial; None: in the driver): with ``cut`` given or at
    least ``cluster_units`` units over the levels, the real-valued estimate runs on that
    cluster, subtrees as tasks (:mod:`distfit.estimate.subtree_job`), cut at level
    ``cut`` (an index; None: :func:`distfit.estimate.subtrees.choose_cut` with ``driver_units`` and
    the spec's cells: the top's matrices within the driver's bound)
    into forests of at most ``forest_rows`` rows (``integer`` and ``nonnegative`` too: the same
    tables); ``nonnegative`` (ignored with ``integer``, whose tables are nonnegative too): the
    BLUE's nonnegative real-valued tables, the BLUE's variances kept beside them; in
    the driver instead (with a note) when the cut is the finest level or none, or when a level
    is not ordered by its parents. Errors: ValueError (a release of another plan, missing or inconsistent
    parent ids, too many cells: :func:`check_levels`), FileExistsError (something else at an
    estimate path)."""
    log = log or sys.stderr
    nonnegative = bool(nonnegative) and not integer
    check_levels(spec)
    cells = int(np.prod(spec.domain.shape, dtype=np.int64))
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
    reused = _reusable(paths, releases, integer, nonnegative)
    if reused is not None:
        print(f"distfit: reusing the estimates of levels {', '.join(names)}", file=log)
        return {name: LevelEstimate(name, str(paths[name]), e.checksum, int(e.attrs["units"]), "reused", parents[name])
                for name, e in reused.items()}

    units = [int(releases[name].attrs["units"]) for name in names]
    with blas_limit():  # once per plan (a pseudo-inverse each), BLAS on one thread as every pass here
        models = {name: measurement_model(plans[name]) for name in names}
    if placement is not None and not placement.serial and (cut is not None or sum(units) >= cluster_units):
        # in a shared basis (every level's J diagonal in it) the passes hold no cells x cells matrices
        with blas_limit():
            basis = information_basis([models[name] for name in names])
        at = choose_cut(units, driver_units, cells if basis is None else 0) if cut is None else int(cut)
        why = None if 0 <= at < len(names) - 1 else f"no level to cut at (cut {at}, {len(names)} levels)"
        if why is None:
            try:
                with placement_client(placement, log) as client:
                    return estimate_on_cluster(client, spec, names=names, cut=at, dirs=dirs, paths=paths, plans=plans,
                                               releases=releases, columns=columns, forest_rows=forest_rows, log=log,
                                               fsync=fsync, integer=integer, nonnegative=nonnegative,
                                               basis=basis, models=models)
            except Unordered as error:
                why = str(error)
        print(f"distfit: note: the estimate over the geography runs in the driver ({why})", file=log)

    started = time.perf_counter()
    hessians, linears, norms, parent_of = [], [], [], []
    with blas_limit():
        for i, name in enumerate(names):
            release = releases[name]
            model = models[name]
            answers = {block.block_id: np.asarray(release.block_answers(block.block_id)[...]) for block in model.blocks}
            hessian, linear, norm = level_terms(model, answers)
            hessians.append(hessian)
            linears.append(linear)
            norms.append(norm)
            rows = None
            if i:
                above = names[i - 1]
                rows = parent_rows(name, release, above, unit_keys(releases[above].unit_ids), columns[name])
                rows = check_parent_of(rows, i, linear.shape[0], linears[i - 1].shape[0])
            parent_of.append(rows)
        units = sum(h.shape[0] for h in linears)
        print(f"distfit: estimate levels {', '.join(names)} ({units:,} units): best linear unbiased over the "
              f"geography{', then integer tables' if integer else ', then nonnegative tables' if nonnegative else ''}",
              file=log)
        result = estimate_hierarchy(hessians, linears, parent_of, split="total", outside=False)
        xs = result.x
        if integer or nonnegative:
            xs = published_tables([GeographyLevel(h, g, up) for h, g, up in zip(hessians, linears, parent_of)], xs,
                                  [models[name] for name in names], integer=integer,
                                  progress=Progress(f"estimate: {'integer' if integer else 'nonnegative'} tables", log,
                                                    unit="units", after=LONG_STAGE_SECONDS))
        variances = [None if integer or models[name].workload is None else result.variances(i, models[name].workload)
                     for i, name in enumerate(names)]
        objectives = [residuals(h, g, n, x) for h, g, n, x in zip(hessians, linears, norms, xs)]
    seconds = time.perf_counter() - started
    out: dict[str, LevelEstimate] = {}
    for i, name in enumerate(names):
        above = parents[name]
        geography = {"level": name, "levels": names, "parent_level": above, "parent_column": columns[name],
                     "parent_estimate": None if above is None else {"path": out[above].path,
                                                                    "checksum": out[above].checksum}}
        checksum = write_level(paths[name], spec=spec, plan=plans[name], plan_path=dirs[name] / "plan.zarr",
                                release=releases[name], model=models[name], x=xs[i], integer=integer,
                                objective=objectives[i], variances=variances[i], geography=geography, fsync=fsync,
                                nonnegative=nonnegative)
        out[name] = LevelEstimate(name, str(paths[name]), checksum, int(linears[i].shape[0]), "done", above)
    print(f"distfit: estimates of {len(names)} levels in {time.perf_counter() - started:.2f} s "
          f"({seconds:.2f} s to estimate, the rest to write and seal)", file=log)
    return out
