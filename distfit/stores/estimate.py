"""Estimate stores: the layout, its lifecycle and the reader (post-processing of a sealed release).

Layout (**contract**, docs/design.md section 4), a Zarr v3 group::

    estimate.zarr/       attrs: distfit_format="estimate", format_version=4, plan_checksum,
                                release_checksum, plan_path, release_path, schema
                                ({"attributes", "sizes"} of the plan), method, objective (the
                                formula minimised), integer (bool), units, chunk_units, n_chunks,
                                queries, cells, created, distfit_version, parent_column (with
                                parent_ids only), geography (a top-down level's estimate only:
                                level, levels, parent_level, parent_column, parent_estimate
                                {path, checksum} of the estimate its units sum to;
                                :mod:`distfit.estimate.levels`), complete (False until
                                sealed), and at seal: checksum, sealed (time), fit (a summary of
                                solve/*: objective mean and max, iterations max, unconverged units)
      queries/estimates  (units, m)      float64 (int64 with integer, when every workload
                                         coefficient is an integer): every workload query's
                                         estimate W x_hat, in the release's unit order
                         group attrs: labels (m strings GROUP:LABEL, or None), groups
                         ({group: [start, stop]}: each query group's columns, spec order)
      queries/query      (m,)            coordinate: the query labels (absent when labels is None)
      queries/variance_rows (classes, m) float64, only where the estimate is linear in the release
                                         with an exactly known covariance (a multi-level run's
                                         real-valued estimate, method ``hierarchy-gls``:
                                         :mod:`distfit.estimate.levels`): each query estimate's
                                         exact variance ``w_q^T P_u w_q``, once per class of
                                         units sharing ``P_u`` (a block's is its block group's:
                                         every block under one parent shares it), written whole
                                         by the driver before the seal and covered by the
                                         checksum as a small array (format 5)
      queries/variance_class (units,)    int64, with variance_rows: each unit's row of it; a
                                         unit's variances are ``variance_rows[variance_class[u]]``
                                         (:attr:`Estimate.variances`; format 4 stored that
                                         product, ``queries/variances`` (units, m), still read)
      cells/estimates    (units, cells)  float64 (int64 with integer): the data vector estimate
                                         x_hat of every unit (the detailed table every query
                                         estimate is a sum of); cells row-major in schema order.
                                         Absent when the workload holds every cell as a query
                                         (a detailed table, as PL94's): then group attr
                                         in_queries [start, stop] names the columns of
                                         queries/estimates that are x_hat, cell by cell
      cells/cell         (cells,)        coordinate: cell labels ``age[0-17],sex[female]``
      marginals/estimates (units, sum_c |c|) instead of cells/ when the method is a graphical model
                         (``graphical-exact``, ``graphical-local``, ``graphical-region-graph``: the domain is too
                         large for x): every clique's nonnegative marginal, row-major, the
                         cliques' tables side by side; group attrs cliques ([[attribute, ...]])
                         and offsets (each clique's first column)
      solve/objective    (units,)        float64  the unit's minimised objective (module of the
                                                  method: the Sigma^-1-weighted squared residual)
      solve/iterations   (units,)        int32    iterations of the solve of the unit's chunk
      solve/converged    (units,)        uint8    1 if the solve met its tolerance for the unit
      unit_ids, unit     (units,)        the release's unit ids (and their coordinate twin)
      parent_ids         (units,)        geography, when the release has it: each unit's parent
                                         id, copied whole from the release (root attr
                                         ``parent_column`` names its data column; covered by the
                                         checksum like every array)
      chunks/done        (n_chunks,)     uint8, one zarr chunk per release chunk: 1 once every
                                         array of that chunk is written
      chunks/digests     (n_chunks, arrays, 32) uint8: a BLAKE3 digest per chunk of every array
                                         the chunks write (attr ``arrays``), written by the chunk
                                         before its done marker (format 4)

Dimension names (:data:`DIMS`): ``unit``, ``query``, ``cell``, ``chunk``; xarray opens the
store whole (``xr.open_datatree(path, engine="zarr")``), ``unit`` at the root labelling every
per-unit array.

The per-unit data vector (``cells/estimates``) is stored because the projection computes it
anyway and it is the one table every other estimate derives from (a published table for any
other query is a sum of its cells); it costs ``cells`` numbers per unit next to the ``m`` of the
queries. Where the workload's queries include every cell in cell order (PL94: its ``detailed``
group, columns 67..318), those columns of ``queries/estimates`` are ``x_hat`` exactly (a 0/1 row
with one 1), so the store does not write it twice: ``cells/estimates`` is left out and the
``cells`` group's ``in_queries`` attr points at the columns (:func:`create_estimate`'s
``cell_columns``); :attr:`Estimate.cells` reads the data vector either way. On PL94 the store
is 2.6 KB per unit instead of 4.6 KB, and as many fewer bytes to write, fsync and hash. A
domain too large to hold x per unit is not estimated by projection at all (a graphical model
instead, docs/design.md section 7).

Never stored: the data, true answers or anything derived from them (the estimate reads the
plan and the release only); the release's privacy is unchanged (post-processing).

Hash order. The checksum feeds the arrays sorted by name
(:func:`distfit.stores.checksum.compute_checksum`) and the driver hashes them while the
chunks are written (``ReleaseHasher``): an array is hashed as its chunks land only when every
array before it is complete. The per-unit fit arrays are therefore named ``solve/*`` (after
``queries/``), so that ``queries/estimates`` (2.5 GB at 1M PL94 units) is hashed chunk by
chunk during the estimate instead of all at once after its last chunk (named ``fit/*`` they
sorted first and held it back: format 1).

Lifecycle, as a release's (:mod:`distfit.stores.release`; the orchestration is
:func:`distfit.estimate.job.run_estimate`): :func:`create_estimate` lays out the store with
``complete=False`` (every reader refuses it); each task (a run of release chunks) writes its chunks'
arrays and, last, its ``chunks/done`` entry (:meth:`distfit.stores.release_chunks.ChunkWriter.write_arrays`);
the driver fsyncs and hashes chunks as they land (``ChunkSync``, ``ReleaseHasher`` over
:func:`chunk_arrays`); :func:`seal` checks the plan and release are unchanged, then writes the
checksum (:func:`distfit.stores.checksum.compute_checksum` over every stated attr,
:func:`distfit.stores.sealing.stated_attrs`, like a release's: ``method``, ``integer``, ``fit``
and the rest, the small arrays and the per-chunk digests standing for the arrays they cover:
format 4; estimates of 1-2 are refused) and ``complete=True``. Every command
that reads an estimate (the report, the export) reads it with :func:`read_sealed_estimate`: the
root checked before anything is written, each chunk checked as it is read (the reader's arrays
are :class:`distfit.stores.sealing.CheckedArray`); one of format 3 (no digests) is verified
whole by that root check, first. :func:`open_resumable` reopens an incomplete store made from the same plan,
release and options.
"""
from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import zarr

from distfit import __version__
from distfit.stores.checkpoint import remove_checkpoints
from distfit.stores.files import jsonable, root_attrs_on_disk, utc_now, write_array
from distfit.stores.release import ANSWER_COMPRESSORS, answer_chunks, plan_change
from distfit.stores.checksum import DIGESTS
from distfit.stores.release_chunks import ReleaseHasher, raw_reader, seal_chunked
from distfit.stores.sealing import (
    DIGEST_DIMS,
    UNIT_DIMS,
    SealedKind,
    SealedStore,
    lay_out_digests,
    lay_out_units,
    root_attr,
    store_array,
)

FORMAT = "estimate"
#: 2: the per-unit fit arrays are ``solve/*`` (``fit/*`` in 1; module docstring, "Hash order").
#: 3: the checksum covers every stated attr (:func:`distfit.stores.sealing.stated_attrs`:
#: ``method``, ``integer``, ``fit``, ...). 4: per-chunk digests (``chunks/digests``, as a
#: release's: :func:`distfit.stores.sealing.lay_out_digests`) of every array the chunks write,
#: and the checksum over the attrs, the small arrays and those digests (checksum version 3), so
#: each chunk is checked as it is read. Estimates of 1-2 are refused with the command that
#: writes them anew (:data:`OLDEST_VERSION`). 5: a multi-level estimate's query variances once
#: per class (``queries/variance_rows``, ``queries/variance_class``) instead of per unit
#: (``queries/variances``: 2.5 KB a PL94 block, the same row for every block of a block group;
#: issue 29 point 6, benchmarks/README.md session 21); format 4's are read as they are.
FORMAT_VERSION = 5
#: The oldest format read: 3, whose checksum covers every array and stated attr but which has
#: no per-chunk digests, is read and verified whole first, as it always was (its root check
#: hashes every array: :meth:`distfit.stores.sealing.SealedKind.read_sealed`); 1-2 are refused.
OLDEST_VERSION = 3

#: ``queries/variance_rows``' attr while the store is incomplete: how the cluster's pieces number
#: the variance classes (:func:`create_estimate`'s ``variance_pieces``), dropped at the seal.
PIECES_ATTR = "pieces"

#: What each chunk writes, besides ``chunks/done`` (:func:`chunk_arrays`), with its dtype when fixed.
FIT_DTYPES = {"solve/objective": np.float64, "solve/iterations": np.int32, "solve/converged": np.uint8}

#: Dimension names (Zarr v3 ``dimension_names``) of every estimate array (module docstring).
DIMS: dict[str, tuple[str, ...]] = {
    "queries/estimates": ("unit", "query"),
    "queries/query": ("query",),
    "queries/variances": ("unit", "query"),
    "queries/variance_rows": ("variance_class", "query"),
    "queries/variance_class": ("unit",),
    "cells/estimates": ("unit", "cell"),
    "cells/cell": ("cell",),
    "marginals/estimates": ("unit", "marginal_cell"),
    **{name: ("unit",) for name in FIT_DTYPES},  # the per-unit fit arrays, solve/*
    **UNIT_DIMS,
    DIGESTS: DIGEST_DIMS,
}


class EstimateError(ValueError):
    """A path that is not a readable, complete (sealed) estimate store; the message says why."""


def chunk_arrays(tables: str | None = "cells/estimates") -> list[str]:
    """The arrays every chunk writes, sorted (``chunks/done`` included, written last, and the
    chunk's digests, ``chunks/digests``, just before it); ``tables``: ``cells/estimates`` (the
    projection), ``marginals/estimates`` (a graphical model) or None (the projection of a
    workload that holds every cell: ``in_queries``). ``queries/variance_class``, written by the
    chunks of a multi-level run's estimate only (:mod:`distfit.estimate.levels`), is not listed."""
    tables_ = [] if tables is None else [tables]
    return sorted(["queries/estimates", *tables_, *FIT_DTYPES, "unit_ids", "unit", "chunks/done", DIGESTS])


def stored_tables(root: zarr.Group) -> str | None:
    """The per-unit table array a store's chunks write (:func:`chunk_arrays`' ``tables``)."""
    if "marginals" in root:
        return "marginals/estimates"
    return "cells/estimates" if "cells" in root and "estimates" in root["cells"] else None


def query_groups(labels: Sequence[str] | None) -> dict[str, list[int]] | None:
    """``{group: [start, stop]}`` of labels ``GROUP:LABEL`` whose groups are contiguous (spec
    order); None when there are no labels or a group is split."""
    if labels is None:
        return None
    groups: dict[str, list[int]] = {}
    for j, label in enumerate(labels):
        name = str(label).split(":", 1)[0]
        if name in groups and groups[name][1] != j:
            return None
        groups.setdefault(name, [j, j])[1] = j + 1
    return groups


def create_estimate(path: Path, *, plan, plan_path: str, release, method: str, objective: str, integer: bool,
                    cells: int, query_dtype: Any, cell_labels: np.ndarray | None,
                    cliques: Sequence[Sequence[str]] | None = None, cell_columns: int | None = None,
                    variance_classes: int | None = None, geography: Mapping[str, Any] | None = None,
                    variance_pieces: list | None = None) -> zarr.Group:
    """Lay out an empty, incomplete estimate store at ``path`` (driver only) and return its root
    group, open for writing. ``release``: the sealed release (:func:`distfit.stores.release.read_release`)
    whose units, chunking, unit ids dtype and labels the store follows. ``cliques`` (a graphical
    model's, each a tuple of attributes in schema order): ``marginals/estimates`` (units x the
    cliques' cells, each clique's table row-major, group attrs ``cliques`` and ``offsets``)
    instead of ``cells/estimates``. ``cell_columns`` (``start``: the queries ``start ..
    start + cells - 1`` are the cells, :func:`distfit.estimate.measurements.cell_query_columns`):
    no ``cells/estimates``, the ``cells`` group's attr ``in_queries`` ``[start, start + cells]``
    instead (module docstring). ``variance_classes``: lay out ``queries/variance_rows``
    (variance_classes x m float64, for :func:`write_variance_rows`) and ``queries/variance_class``
    (units,) for the chunks to fill. ``geography``: the root attr ``geography`` (a level of a
    multi-level run: docs/stores.md). ``variance_pieces``: how the cluster's pieces number the
    variance classes (``[first unit, classes]`` per piece), kept while the store is incomplete
    for a resume to compare (:func:`variance_pieces`) and dropped by :func:`seal`: bookkeeping,
    not a fact of the estimate (a sealed store states only what its checksum covers). On any
    error nothing is left at ``path`` (:meth:`distfit.stores.sealing.SealedKind.create`)."""
    root = ESTIMATE.create(path, _lay_out, plan=plan, plan_path=plan_path, release=release, method=method,
                           objective=objective, integer=integer, cells=cells, query_dtype=query_dtype,
                           cell_labels=cell_labels, cliques=cliques, cell_columns=cell_columns,
                           variance_classes=variance_classes)
    if geography is not None:
        root.attrs["geography"] = dict(geography)
    if variance_pieces is not None:
        root["queries/variance_rows"].attrs[PIECES_ATTR] = variance_pieces
    return root


def variance_pieces(root: zarr.Group) -> list | None:
    """An incomplete store's ``variance_pieces`` (:func:`create_estimate`; None: none recorded)."""
    return root["queries/variance_rows"].attrs.get(PIECES_ATTR) if "queries/variance_rows" in root else None


def stated_geography(root: zarr.Group) -> dict:
    """A store's root attr ``geography`` (``{}`` when it has none)."""
    return dict(root.attrs.get("geography") or {})


def _lay_out(root: zarr.Group, *, plan, plan_path, release, method, objective, integer, cells, query_dtype,
             cell_labels, cliques=None, cell_columns=None, variance_classes=None) -> None:
    attrs = release.attrs
    units, chunk_units = int(attrs["units"]), int(attrs["chunk_units"])
    n_chunks = -(-units // chunk_units)
    m = int(release.answers.shape[1])
    config = {"write_empty_chunks": True}
    labels = release.labels
    queries = root.create_group("queries")
    queries.create_array("estimates", shape=(units, m), dtype=query_dtype, chunks=answer_chunks(chunk_units, m),
                         compressors=ANSWER_COMPRESSORS, dimension_names=DIMS["queries/estimates"], config=config)
    if variance_classes is not None:
        classes = int(variance_classes)
        queries.create_array("variance_rows", shape=(classes, m), dtype=np.float64,
                             chunks=answer_chunks(max(min(chunk_units, classes), 1), m), compressors=ANSWER_COMPRESSORS,
                             dimension_names=DIMS["queries/variance_rows"], config=config)
        queries.create_array("variance_class", shape=(units,), dtype=np.int64, chunks=(chunk_units,), compressors=None,
                             dimension_names=DIMS["queries/variance_class"], config=config)
    if labels is not None:
        write_array(queries, "query", np.array(list(labels), dtype=object), dims=DIMS["queries/query"])
    queries.attrs.update(jsonable({"labels": labels, "groups": query_groups(labels)}))
    if cliques is not None:
        size = dict(zip(plan.attrs["schema"]["attributes"], plan.attrs["schema"]["sizes"]))
        offsets = np.concatenate([[0], np.cumsum([int(np.prod([size[a] for a in c])) for c in cliques])])
        group = root.create_group("marginals")
        group.create_array("estimates", shape=(units, int(offsets[-1])), dtype=np.int64 if integer else np.float64,
                           chunks=answer_chunks(chunk_units, int(offsets[-1])), compressors=ANSWER_COMPRESSORS,
                           dimension_names=DIMS["marginals/estimates"], config=config)
        group.attrs.update(jsonable({"cliques": [list(c) for c in cliques], "offsets": offsets.tolist()}))
    cell_group = root.create_group("cells") if cliques is None else None
    if cell_group is not None and cell_columns is not None:
        cell_group.attrs["in_queries"] = [int(cell_columns), int(cell_columns) + int(cells)]
    elif cell_group is not None:
        cell_group.create_array("estimates", shape=(units, cells), dtype=np.int64 if integer else np.float64,
                                chunks=answer_chunks(chunk_units, cells), compressors=ANSWER_COMPRESSORS,
                                dimension_names=DIMS["cells/estimates"], config=config)
    if cell_labels is not None and cell_group is not None:
        write_array(cell_group, "cell", np.asarray(cell_labels, dtype=object), dims=DIMS["cells/cell"])
    fit = root.create_group("solve")
    for name, dtype in FIT_DTYPES.items():
        fit.create_array(name.split("/")[1], shape=(units,), dtype=dtype, chunks=(chunk_units,), compressors=None,
                         dimension_names=DIMS[name], config=config)
    ids_dtype = np.dtype(release.unit_ids.dtype)
    ids_dtype = str if ids_dtype.kind in "TUO" else ids_dtype  # variable-length UTF-8, as in the release
    # the parent ids (geography, not data) copied whole from the release
    lay_out_units(root, units=units, chunk_units=chunk_units, ids_dtype=ids_dtype, parents=release.parent_ids,
                  parent_column=release.parent_column)
    # a digest per chunk of every array the chunks write (ChunkWriter.write_arrays hashes each
    # chunk's rows as it writes them): what a reader checks each chunk it reads against
    digested = [name for name in chunk_arrays(stored_tables(root)) if name not in ("chunks/done", DIGESTS)]
    lay_out_digests(root, digested + (["queries/variance_class"] if variance_classes is not None else []),
                    units=units, chunk_units=chunk_units)
    root.attrs.update(jsonable({
        "distfit_format": FORMAT,
        "format_version": FORMAT_VERSION,
        "plan_checksum": plan.checksum,
        "release_checksum": release.checksum,
        "plan_path": os.path.abspath(plan_path),
        "release_path": os.path.abspath(release.path),
        "schema": {"attributes": list(plan.attrs["schema"]["attributes"]),
                   "sizes": list(plan.attrs["schema"]["sizes"])},
        "method": method,
        "objective": objective,
        "integer": bool(integer),
        "units": units,
        "chunk_units": chunk_units,
        "n_chunks": n_chunks,
        "queries": m,
        "cells": int(cells),
        "created": utc_now(),
        "distfit_version": __version__,
        "complete": False,
    }))


def write_variance_rows(root: zarr.Group, start: int, rows: np.ndarray) -> None:
    """Rows ``start ..`` of a store's ``queries/variance_rows`` (laid out by :func:`create_estimate`'s
    ``variance_classes``; written by the driver before :func:`seal`, which hashes them whole)."""
    rows = np.asarray(rows, dtype=np.float64)
    if rows.shape[0]:
        root["queries/variance_rows"][start:start + rows.shape[0]] = rows


def open_resumable(path: Path, *, plan_checksum: str, release_checksum: str, integer: bool,
                   method: str) -> zarr.Group:
    """Open an incomplete estimate to finish it, after checking it was started from the same
    plan and release with the same options; ValueError naming what differs."""
    root = ESTIMATE.open_incomplete(path)
    attrs = dict(root.attrs)
    differ = [f"{name} ({attrs.get(key)!r} recorded, {now!r} now)" for name, key, now in (
        ("plan checksum", "plan_checksum", plan_checksum), ("release checksum", "release_checksum", release_checksum),
        ("integer", "integer", bool(integer)), ("method", "method", method)) if attrs.get(key) != now]
    if differ:
        raise ValueError(f"{path}: an incomplete estimate of other inputs ({'; '.join(differ)}); "
                         "use --overwrite to start over")
    ESTIMATE.check_laid_out(root, path, chunk_arrays(stored_tables(root)))
    return root


def chunk_fit(objective: np.ndarray, iterations: np.ndarray, converged: np.ndarray) -> tuple[int, float, float, int, int]:
    """One chunk's part of the ``fit`` attr, from its ``solve/*`` rows: ``(finite objectives,
    their sum, their max (-inf: none), the most iterations, units not converged)``."""
    objective = np.asarray(objective, dtype=np.float64)
    finite = objective[np.isfinite(objective)]
    return (int(finite.size), float(finite.sum()), float(finite.max(initial=-np.inf)),
            int(np.asarray(iterations).max(initial=0)), int((np.asarray(converged) == 0).sum()))


def combine_fits(parts: Iterable[tuple[int, float, float, int, int]]) -> dict[str, Any]:
    """The ``fit`` attr (the objective's mean and max, the most iterations, how many units did
    not converge) from the chunks' parts (:func:`chunk_fit`), in any order: the sums are added
    by ``math.fsum`` (correctly rounded, so the same whatever the order)."""
    parts = list(parts)
    count = sum(part[0] for part in parts)
    return {"objective_mean": math.fsum(part[1] for part in parts) / count if count else None,
            "objective_max": max(part[2] for part in parts) if count else None,
            "iterations_max": max((part[3] for part in parts), default=0),
            "unconverged_units": sum(part[4] for part in parts)}


def fit_parts(root: zarr.Group, chunk_units: int, chunks: Iterable[int]) -> dict[int, tuple[int, float, float, int, int]]:
    """:func:`chunk_fit` of each of ``chunks`` (of ``chunk_units`` rows) read from the store."""
    out = {}
    for chunk in chunks:
        rows = slice(chunk * chunk_units, (chunk + 1) * chunk_units)
        out[chunk] = chunk_fit(root["solve/objective"][rows], root["solve/iterations"][rows],
                               root["solve/converged"][rows])
    return out


def fit_summary(root: zarr.Group, chunk_units: int | None = None) -> dict[str, Any]:
    """The ``fit`` attr of a store whose chunks are all written (:func:`combine_fits` of its
    chunks of ``chunk_units`` rows, default all rows as one), read from ``solve/*``."""
    units = int(root["solve/objective"].shape[0])
    chunk_units = chunk_units or max(units, 1)
    return combine_fits(fit_parts(root, chunk_units, range(-(-units // chunk_units))).values())


def seal(root: zarr.Group, path: Path, *, plan_path: str, plan_checksum: str, release_path: str,
         release_checksum: str, fsync: bool, hasher: ReleaseHasher | None = None,
         fit: Mapping[str, Any] | None = None, synced: Mapping[str, tuple[int, ...]] | None = None) -> str:
    """Verify the plan and the release are unchanged, then checksum and mark complete.

    The plan's checksum is recomputed from its arrays (cheap next to the release) and must be
    ``plan_checksum``; the release at ``release_path`` must still be sealed with
    ``release_checksum`` (its stored attr: a release replaced during the estimate is caught; its
    arrays are not hashed again): ValueError otherwise, the estimate left incomplete. That
    check runs while :func:`distfit.stores.release_chunks.seal_chunked` checks the chunks,
    takes the digest and fsyncs (``synced``: the files fsynced as they landed), which then
    writes the ``fit`` summary (given, as :func:`combine_fits` of the chunks' parts, or read
    from the store: 0.7 s at the seal of 1M units). The fits' checkpoints
    (:mod:`distfit.stores.checkpoint`) are deleted first: never sealed, never hashed, and so is
    ``queries/variance_rows``' attr ``pieces`` (:func:`create_estimate`). Returns the estimate's
    checksum."""
    remove_checkpoints(path)  # a sealed estimate holds no fit's checkpoint (distfit.stores.checkpoint)
    if variance_pieces(root) is not None:  # resume bookkeeping: never in a sealed store (create_estimate)
        del root["queries/variance_rows"].attrs[PIECES_ATTR]

    def check() -> None:
        changed = plan_change(plan_path, plan_checksum, "estimate")
        release_attrs = root_attrs_on_disk(Path(release_path)) or {}
        if changed is None and (release_attrs.get("complete") is not True
                                or release_attrs.get("checksum") != release_checksum):
            changed = (f"{release_path}: the release changed during the estimate (checksum "
                       f"{release_attrs.get('checksum')}, started from {release_checksum})")
        if changed is not None:
            raise ValueError(f"{changed}; the estimate at {path} is left incomplete")

    return seal_chunked(root, path, fsync=fsync, hasher=hasher, synced=synced, check=check,
                        attrs={"fit": dict(fit) if fit is not None else fit_summary(root)})


# --------------------------------------------------------------------------------------------
# reading


class LazyArray:
    """What the lazy (units x m) arrays of an estimate store share: ``ndim`` 2, ``len`` (units)
    and ``np.asarray`` (every row read); a subclass gives ``shape``, ``dtype`` and ``[rows]`` /
    ``[rows, columns]`` indexing."""

    @property
    def ndim(self) -> int:
        return 2

    def __len__(self) -> int:
        return self.shape[0]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[...]
        return out if dtype is None else out.astype(dtype, copy=False)


@dataclass(frozen=True)
class QueryColumns(LazyArray):
    """The columns ``start:stop`` of a (units x m) zarr array as a lazy (units x stop - start)
    array: ``shape``, ``dtype``, ``ndim`` and numpy-style ``[rows]`` / ``[rows, columns]``
    indexing (rows read from the store, then the columns taken), ``np.asarray``."""

    array: Any
    start: int
    stop: int

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.array.shape[0]), self.stop - self.start)

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.array.dtype)

    def __getitem__(self, key: Any) -> np.ndarray:
        rows, columns = key if isinstance(key, tuple) else (key, slice(None))
        rows = slice(None) if rows is Ellipsis else rows
        return np.asarray(self.array[rows, self.start:self.stop])[..., columns]


class ClassRows(LazyArray):
    """A (units x m) array stored as a row per class and each unit's class (``rows``, classes x m,
    read whole on first use; ``classes``, units): ``shape``, ``dtype``, ``ndim``, ``len``,
    numpy-style ``[rows]`` / ``[rows, columns]`` indexing (the units' classes read, then their
    rows taken), ``np.asarray``."""

    def __init__(self, rows: Any, classes: Any) -> None:
        self._stored, self.classes, self._rows = rows, classes, None

    @property
    def shape(self) -> tuple[int, int]:
        return (int(self.classes.shape[0]), int(self._stored.shape[1]))

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self._stored.dtype)

    def __getitem__(self, key: Any) -> np.ndarray:
        units, columns = key if isinstance(key, tuple) else (key, slice(None))
        if self._rows is None:
            self._rows = np.asarray(self._stored[...])
        classes = np.asarray(self.classes[slice(None) if units is Ellipsis else units])
        return self._rows[:, columns][classes]


class Estimate(SealedStore):
    """A sealed estimate store opened for reading; arrays are lazy zarr arrays (the shared
    readers of :class:`distfit.stores.sealing.SealedStore`: checksum, labels, unit ids, parent ids)."""

    integer = root_attr("integer", bool)
    method = root_attr("method", str)
    estimates = store_array("queries/estimates", "``queries/estimates`` (units x m).")

    @property
    def variances(self):
        """Each query estimate's exact variance (units x m, lazy: :class:`ClassRows` of
        ``queries/variance_rows`` by ``queries/variance_class``; format 4's ``queries/variances``
        as it is), or None where the store has none (module docstring)."""
        group = self._group["queries"]
        if "variance_rows" in group:
            return ClassRows(self.array("queries/variance_rows"), self.array("queries/variance_class"))
        return self.array("queries/variances") if "variances" in group else None

    converged = store_array("solve/converged", "``solve/converged`` (units,): 1 where the unit's solve met its tolerance.")

    @property
    def cells(self):
        """``cells/estimates`` (units x cells): each unit's data vector estimate; where the store
        keeps it in ``queries/estimates`` (``in_queries``), those columns, read lazily
        (:class:`QueryColumns`)."""
        group = self._group["cells"]
        if "estimates" in group:
            return self.array("cells/estimates")
        start, stop = group.attrs["in_queries"]
        return QueryColumns(self.estimates, int(start), int(stop))

    @property
    def marginals(self) -> dict[tuple[str, ...], np.ndarray] | None:
        """A graphical model's clique marginals ``{clique: (units, *sizes)}`` (read whole), or
        None for the projection (its ``cells`` hold the data vector instead)."""
        if "marginals" not in self._group:
            return None
        group = self._group["marginals"]
        table, offsets = np.asarray(self.array("marginals/estimates")[...]), group.attrs["offsets"]
        size = dict(zip(self.attrs["schema"]["attributes"], self.attrs["schema"]["sizes"]))
        return {tuple(c): table[:, offsets[i]:offsets[i + 1]].reshape((-1, *[size[a] for a in c]))
                for i, c in enumerate(group.attrs["cliques"])}

    objective = store_array("solve/objective", "``solve/objective`` (units,): each unit's minimised objective.")

    @property
    def groups(self) -> dict[str, list[int]] | None:
        return self._group["queries"].attrs.get("groups")


#: The estimate as a kind of sealed store (:class:`distfit.stores.sealing.SealedKind`), read as
#: raw chunk files like a release. Its methods are the module's entry points:
#: ``read_estimate(path)`` (an :class:`Estimate`, or :class:`EstimateError` saying why the store
#: is refused: missing, staging directory, not an estimate, newer format, incomplete, no
#: checksum), ``read_sealed_estimate(path)`` (the same, its root checked and each chunk checked
#: as it is read: what every command that reads an estimate calls),
#: ``verify_estimate(path)`` (``(ok, stored, recomputed)`` checksum),
#: ``estimate_state(path)`` (``"absent"``, ``"sealed"`` or ``"incomplete"``; FileExistsError for
#: anything else) and ``check_replaceable(path)`` (FileExistsError unless an estimate store).
ESTIMATE = SealedKind(FORMAT, FORMAT_VERSION, EstimateError, Estimate, oldest=OLDEST_VERSION, slabs=raw_reader)
read_estimate, read_sealed_estimate, verify_estimate = ESTIMATE.read, ESTIMATE.read_sealed, ESTIMATE.verify
estimate_state, check_replaceable = ESTIMATE.state, ESTIMATE.check_replaceable


def chunk_rows(estimates: np.ndarray, cells: np.ndarray, objective: np.ndarray, iterations: Any,
               converged: np.ndarray, unit_ids: np.ndarray,
               tables: str | None = "cells/estimates", variance_class: np.ndarray | None = None
               ) -> Mapping[str, np.ndarray]:
    """One chunk's rows by array name, for ``ChunkWriter.write_arrays`` (every array of
    :func:`chunk_arrays` but ``chunks/done``, which the writer marks last); ``cells`` goes to
    ``tables`` (``marginals/estimates`` for a graphical model's clique marginals; None: not
    written, the cells are columns of ``estimates``); ``variance_class`` (given: the store has
    ``queries/variance_rows``, :func:`create_estimate`'s ``variance_classes``): the units' rows of it."""
    n = len(unit_ids)
    tables_ = {} if tables is None else {tables: cells}
    return {
        "queries/estimates": estimates,
        **({} if variance_class is None else {"queries/variance_class": np.asarray(variance_class, dtype=np.int64)}),
        **tables_,
        "solve/objective": np.asarray(objective, dtype=np.float64).reshape(n),
        "solve/iterations": np.broadcast_to(np.asarray(iterations, dtype=np.int32), (n,)),
        "solve/converged": np.broadcast_to(np.asarray(converged, dtype=np.uint8), (n,)),
        "unit_ids": unit_ids,
        "unit": unit_ids,
    }


__all__ = [
    "DIMS",
    "ESTIMATE",
    "FORMAT_VERSION",
    "OLDEST_VERSION",
    "ClassRows",
    "Estimate",
    "EstimateError",
    "QueryColumns",
    "check_replaceable",
    "chunk_arrays",
    "chunk_rows",
    "create_estimate",
    "estimate_state",
    "chunk_fit",
    "combine_fits",
    "fit_parts",
    "fit_summary",
    "open_resumable",
    "query_groups",
    "read_estimate",
    "read_sealed_estimate",
    "seal",
    "stated_geography",
    "stored_tables",
    "variance_pieces",
    "verify_estimate",
    "write_variance_rows",
]
