"""The multi-level estimate on the cluster: subtrees as Dask tasks, the driver holding only the top levels.

Issue 29 point 5; the mathematics is :mod:`distfit.estimate.subtrees` (the hierarchy's passes
split at a cut level ``c``, equal to the whole-tree passes). :func:`estimate_on_cluster`, called
by :func:`distfit.estimate.levels.estimate_levels` with a cluster:

1. The geography, in the driver: each level below the cut, its units' parent rows (read a level at
   a time) must be in order (every level ordered by its parent's row, as the synthetic geography
   and any geography whose ids sort with their parents' are; otherwise :class:`Unordered` and the
   estimate runs in the driver); from each unit's number of children, each cut unit's rows at
   every level below (:func:`distfit.estimate.subtrees.descendant_spans`), and forests of
   consecutive cut units of at most ``forest_rows`` rows in all (:func:`~distfit.estimate.subtrees.group_roots`).
2. Up: one task per forest (:func:`upward_task`) reads its rows of each level's release (the
   chunks they lie in, each checked against its digest as it is read; each release opened once
   per worker and job, and the chunks of the levels above the finest kept for the worker's next
   forest: :func:`_release_rows`, :func:`_level_answers`), forms the normal
   equations and runs the upward pass, returning its roots' summary (a few matrices and a vector
   per root). In the levels' shared basis the terms come straight from the answers in the basis
   (:class:`distfit.estimate.level_stores.BasisTerms`), the finest level's only summed by parent.
3. The top, in the driver: levels ``0 .. c`` read and solved with the summaries, written and
   sealed coarsest first (:func:`distfit.estimate.level_stores.write_level`).
4. Down: one task per forest (:func:`downward_task`) reads its rows again and repeats its upward
   pass (recomputing it costs less than keeping every forest's state on the workers: the
   memory of a level; in the shared basis two products a leaf), then the downward pass from its
   roots' estimates, and writes each level's rows (tables, residuals, and the query variances
   per class with each unit's class) as a piece (:mod:`distfit.stores.pieces`, digested per
   chunk of units). In the shared basis with leaves of one ``J`` (PL94's blocks:
   ``Forests.leaf_offsets``, :mod:`distfit.estimate.leaf_pieces`) the upward task keeps its
   terms and the leaves' sums by parent as a piece, and the downward task reads them instead of
   any answers and writes per parent what the leaves' chunk tasks add to their own tables.
5. Each level below the cut, coarsest first: its estimate store laid out (or an incomplete one
   of the same inputs resumed), one task per chunk of units writing the chunk from the pieces it
   overlaps (:func:`chunk_task`: only its rows of each, the query estimates formed from the
   tables), the pieces' query variances per class written by the driver, one after the other
   (``queries/variance_rows``, PL94 blocks: a row per block group; each unit's class in the
   chunks, its piece's plus the piece's offset; the finest level with ``leaf_offsets``: its tables
   formed from the chunk's release rows), the chunks hashed and fsynced as they land and the store sealed
   (:class:`distfit.runtime.chunked_job.ChunkedWrite`), naming its parent level's checksum.

Progress: a line with rate and ETA for each step over the forests and for each level's chunks.
Resumable: a rerun after an interruption keeps the top levels' sealed stores when they are
still the estimate of these releases (the passes are deterministic), the pieces already written
(a forest whose pieces are all there is not run down again; each piece is checked against its
digests as it is read, and one refused is computed again: :mod:`distfit.stores.pieces`), and each level's chunks already
written (an incomplete store of the same inputs is resumed). Memory: a task holds one forest's
rows (at most ``forest_rows`` units over its levels, or one subtree) and its classes' matrices
(at most :data:`distfit.estimate.subtrees.FOREST_MATRIX_BYTES` of them: the forest's units above
the finest level bounded by :func:`distfit.estimate.subtrees.matrix_units`, one subtree at least;
none in the levels' shared basis, :mod:`distfit.estimate.shared_basis`, which the driver finds from
the plans and every task uses);
the job (every level's model and terms: :class:`Forests`) goes to each worker once, held there
as a task's result that the others depend on
(:func:`distfit.runtime.cluster.held_on_every_worker`), not with every task;
the driver, levels ``0 .. c`` and their classes' matrices (the cut chosen so that they fit
:data:`distfit.estimate.subtrees.DRIVER_MATRIX_BYTES`), each unit's number of children, and one
level's parent ids at a time while step 1 reads them.

Integer tables (``integer``, issue 29 point 4): the driver makes levels ``0 .. c``'s by
:func:`distfit.estimate.geography.integer_top_down` from their real-valued estimates (the levels
below the cut given by their informations and each cut unit's descendants: every unit's metric
the whole tree's), and each downward task continues it through its forest from its roots'
integer tables (the cut level's rows, sent beside their :class:`Top`), writing integer tables
and query estimates (int64 where the workload is integral, no variances) in its pieces. The
top-down is per parent, so the integers are the driver's over the whole tree, bit for bit
(docs/design.md section 7, "Integer tables on the cluster"). Nonnegative tables
(``nonnegative``) go the same way, not rounded, variances kept (:mod:`distfit.estimate.levels`).
"""
from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from distfit.estimate.geography import GeographyLevel
from distfit.estimate.hierarchy import PINV_RTOL, Grouping, Summary, Top, check_parent_of
from distfit.estimate.job import ReleaseRows
from distfit.estimate.leaf_pieces import (CARRIED, PARENTS, SUMS, carry_boundaries, leaf_chunk, read_terms,
                                          write_carried, write_parents)
from distfit.estimate.level_stores import (
    BasisTerms,
    LevelEstimate,
    basis_terms,
    cell_columns,
    level_method,
    level_queries,
    published_tables,
    level_terms,
    parent_rows,
    query_dtype,
    residuals,
    reusable_estimate,
    unit_keys,
    write_level,
)
from distfit.estimate.measurements import MeasurementModel, measurement_model, workload_estimates
from distfit.estimate.shared_basis import blind
from distfit.estimate.subtrees import (
    FOREST_MATRIX_BYTES,
    basis_forest_upward,
    descendant_spans,
    forest_downward,
    forest_upward,
    group_roots,
    matrix_units,
    merge_summaries,
    top_estimate,
)
from distfit.runtime.chunked_job import ChunkedWrite, resume_or_create
from distfit.runtime.placement import dask_runtime
from distfit.runtime.progress import Progress
from distfit.runtime.threads import blas_limit
from distfit.stores.data import cell_labels, value_labels
from distfit.stores.estimate import (
    chunk_arrays,
    chunk_rows,
    create_estimate,
    estimate_state,
    open_resumable,
    seal,
    check_replaceable,
    stated_geography,
    stored_tables,
    variance_pieces,
    write_variance_rows,
)
from distfit.stores.lock import store_lock
from distfit.stores.pieces import (
    PieceMismatch,
    open_pieces,
    piece_done,
    piece_rows,
    read_piece,
    remove_piece,
    remove_pieces,
    write_piece,
)
from distfit.stores.release import read_sealed_release
from distfit.stores.release_chunks import ChunkWriter

__all__ = ["FOREST_ROWS", "PIECES_NAME", "Forests", "Unordered", "chunk_task", "downward_task", "estimate_on_cluster",
           "upward_task"]

#: A forest's rows over all its levels at most (one subtree may have more): a task holds about ten
#: rows x cells float64 arrays, ~0.9 GB at 250 cells (issue 29: a worker within 2 GiB).
FOREST_ROWS = 50_000
#: Forests are also cut to about 1 / (this x the cluster's threads) of the rows (so that every
#: worker has forests to run, the last ones small), but not below :data:`MIN_FOREST_ROWS`.
FORESTS_PER_THREAD = 2
MIN_FOREST_ROWS = 2_000
#: The pieces directory, next to the cut level's estimate.
PIECES_NAME = "estimate.subtrees"
#: A piece's arrays of a row per unit (digested per chunk of units); ``variance_rows`` is per class.
PIECE_SLICED = ("cells", "objective", "variance_class")
#: What a piece holds (in its directory's key: pieces of another content are not reused).
PIECE_ROWS = ("pieces: cells, objective, variance_rows by class and variance_class (queries formed by the chunk); "
              "leaves from their rows: up .sums (with the levels above's terms) and .carried, down .parents")


class Unordered(ValueError):
    """A level's units are not ordered by their parent's row (the estimate then runs in the driver)."""


@dataclass(frozen=True, eq=False)
class Forests:
    """What every task of a job needs, sent with each: the levels from the cut down (``names``,
    ``models``, the sealed releases' ``release_paths`` and ``release_checksums``), each forest's
    rows per level (``spans[k][i]``: cut unit ``i``'s first row at level ``c + k``), each unit's
    number of children (``counts[k]``, levels ``c .. L - 1``), the pieces directory,
    ``split`` (:func:`distfit.estimate.hierarchy.estimate_hierarchy`'s), ``integer`` (integer
    tables: module docstring), the levels' shared ``basis``
    (:func:`distfit.estimate.level_stores.information_basis`; None: the general path) and
    ``terms``, each level's :class:`distfit.estimate.level_stores.BasisTerms` in it when the
    tasks work in the basis from the answers (real-valued tables; None: through ``h``, as the
    integer top-down needs it); ``chunk_units`` each level's chunk of units (its pieces' rows are
    digested per chunk: :mod:`distfit.stores.pieces`); ``leaf_offsets``: the finest level's
    tables formed by its chunk tasks from the release rows they read, not by the downward
    tasks, which then read none of its rows (:mod:`distfit.estimate.leaf_pieces`);
    ``nonnegative``: the BLUE's nonnegative tables, through ``h`` as the integer ones."""

    names: tuple[str, ...]
    models: tuple[MeasurementModel, ...]
    release_paths: tuple[str, ...]
    release_checksums: tuple[str, ...]
    spans: tuple[np.ndarray, ...]
    counts: tuple[np.ndarray, ...]
    pieces: str
    split: str
    fsync: bool
    integer: bool = False
    basis: np.ndarray | None = None
    terms: tuple[BasisTerms, ...] | None = None
    chunk_units: tuple[int, ...] = ()
    leaf_offsets: bool = False
    nonnegative: bool = False

    def rows(self, first: int, stop: int) -> list[tuple[int, int]]:
        """Forest ``[first, stop)``'s rows ``(start, stop)`` at each level from the cut."""
        return [(int(s[first]), int(s[stop])) for s in self.spans]


#: The releases this worker's tasks read: ``[key, {level: ReleaseRows}, {level: (first, stop,
#: answers)}]``, each opened (its root checked against the job's checksum,
#: :func:`distfit.stores.release.read_sealed_release`) by the first task of a job that reads it and
#: kept for the others (:func:`_release_rows`), and the last whole chunks read of each level above
#: the finest (:func:`_level_answers`).
_OPENED: list = []


def _release_rows(job: Forests, k: int) -> ReleaseRows:
    """Level ``c + k``'s release as :class:`distfit.estimate.job.ReleaseRows`, opened once per
    worker and job: every up, down and chunk task opened it and checked its root again, ~30 ms
    of zarr and hashing each (us_pl94: 3.8 CPU-s of 29 at 300k blocks, ~250 chunk tasks at 1M;
    benchmarks/README.md, session 20). Kept by what a reader depends on (the paths, the checksums
    the driver found, each level's block ids), not by the job object: a worker holds two equal
    jobs, its own and the other worker's copy, whose tasks it also runs. Each chunk read is
    still checked against the digests the root check read (:meth:`~distfit.stores.sealing.SealedStore.rows_of`)."""
    key = (job.release_paths, job.release_checksums, tuple(tuple(b.block_id for b in m.blocks) for m in job.models))
    if not _OPENED or _OPENED[0] != key:
        _OPENED[:] = [key, {}, {}]
    opened = _OPENED[1]
    if k not in opened:
        opened[k] = ReleaseRows(read_sealed_release(job.release_paths[k], job.release_checksums[k]), job.models[k])
    return opened[k]


def _level_answers(job: Forests, k: int, a: int, b: int) -> dict[str, np.ndarray]:
    """Rows ``a:b`` of level ``c + k``'s released answers (``{block_id: rows x m_b}``, each
    chunk checked as read). A level above the finest is read as the whole chunks holding the
    rows and those kept for the next task on this worker: a forest holds a few hundred of its
    tracts but the reader hashes whole chunks of 4,096, so every forest read and hashed the same
    chunks again, up and down (us_pl94 at 1M blocks: ~1.2 GB, a fifth of what the forests read).
    Returns views of the chunks read (read only)."""
    rows = _release_rows(job, k)
    if k == len(job.names) - 1 or not job.chunk_units:  # the leaves: their own chunks, read once a pass
        return rows.answers(a, b)
    kept = _OPENED[2].get(k)
    if kept is None or not kept[0] <= a <= b <= kept[1]:
        size, units = job.chunk_units[k], int(job.spans[k][-1])
        first, stop = a // size * size, min(units, -(-b // size) * size)
        kept = _OPENED[2][k] = (first, stop, rows.answers(first, stop))
    return {block: values[a - kept[0]:b - kept[0]] for block, values in kept[2].items()}


def _forest_answers(job: Forests, first: int, stop: int, *, read: bool = True) -> tuple[list, list]:
    """A forest's released answers per level (``{block_id: rows x m_b}``, chunks checked as
    read) and local parent rows; the levels from the first without rows are left out; with
    ``read`` False no answers are read (None)."""
    answers, parents = [], [None]
    rows = job.rows(first, stop)
    for k, (a, b) in enumerate(rows):
        if b == a:  # no units here, nor below
            break
        answers.append(_level_answers(job, k, a, b) if read else None)
        if k:
            above = job.counts[k - 1][rows[k - 1][0]:rows[k - 1][1]]
            parents.append(np.repeat(np.arange(above.size, dtype=np.int64), above))
    return answers, parents


def _read_forest(job: Forests, first: int, stop: int):
    """A forest's terms per level (J, h, norms) and local parent rows (the general path)."""
    answers, parents = _forest_answers(job, first, stop)
    return [level_terms(model, a) for model, a in zip(job.models, answers)], parents


def upward_task(job: Forests, first: int, stop: int) -> tuple[int, Summary, tuple[np.ndarray, ...]]:
    """Step 2 (module docstring): forest ``[first, stop)``'s roots' summary, and their level's
    terms ``(J, h, norms)`` (:func:`distfit.estimate.level_stores.level_terms`: the top's
    residuals): ``(first, summary, terms)``. With ``job.terms`` (the shared basis) each level's
    ``h~`` straight from its answers, and the finest level's only summed by parent (its answers
    summed first: no product per leaf; the downward task forms the leaves' rows)."""
    with blas_limit():
        if job.terms is None:
            terms, parents = _read_forest(job, first, stop)
            _, summary = forest_upward([t[0] for t in terms], [t[1] for t in terms], parents, basis=job.basis)
            return first, summary, terms[0]
        linear, _, _, summary = _basis_upward(job, first, stop, tables=False, carry=job.leaf_offsets)
        h, norms = linear[0]
        return first, summary, (job.terms[0].information, h @ job.basis.T, norms)


def _basis_upward(job: Forests, first: int, stop: int, *, tables: bool, carry: bool = False,
                  read_answers: bool = True):
    """In the shared basis: ``(terms, parents, state, summary)``, ``terms`` each level's ``(h~,
    n)`` but the finest's (:class:`distfit.estimate.level_stores.BasisTerms`: leaves of one
    ``J``, their answers only summed by parent; with ``tables`` their ``(J^+ h, own residuals)``
    last), ``state`` the forest's upward pass (the leaves given by their tables with ``tables``).
    ``carry`` (the upward task, ``job.leaf_offsets``): the terms and the job's finest level's
    sums and carried tables written as pieces (:mod:`distfit.estimate.leaf_pieces`); ``read_answers``
    False: the terms and sums read from there, no answers (the downward task with
    ``job.leaf_offsets``: the same numbers, not formed again)."""
    answers, parents = _forest_answers(job, first, stop, read=read_answers)
    depth = len(answers)
    sums = leaves = None
    if answers[0] is None:  # the forest's terms as its upward task wrote them
        linear, sums = read_terms(job, first, stop)
    else:
        linear = [job.terms[k].linear(answers[k]) for k in range(depth if depth == 1 else depth - 1)]
    if depth > 1 and answers[-1] is not None:  # leaves of one J (every level's J is one matrix: level_terms)
        sums = job.terms[depth - 1].summed(answers[-1], Grouping.of(parents[-1], linear[-1][0].shape[0]))
        leaves = job.terms[depth - 1].tables(answers[-1]) if tables else None
        if carry and depth == len(job.names):
            write_carried(job, first, stop, answers[-1], sums, linear)
    del answers
    state, summary = basis_forest_upward([t.own for t in job.terms[:depth]],
                                         [h for h, _ in linear] + ([None] if depth > 1 else []), parents,
                                         job.basis, leaf_sums=sums, leaf_tables=None if leaves is None else leaves[0])
    return linear + ([leaves] if leaves is not None else []), parents, state, summary


def downward_task(job: Forests, first: int, stop: int, top: Top, roots: np.ndarray | None = None) -> tuple[int, int]:
    """Step 4 (module docstring): forest ``[first, stop)`` down from its roots' ``top`` (and,
    with ``job.integer``, their integer tables ``roots``), each level's rows below the cut
    written as a piece. Returns ``(first, units below the cut)``."""
    directory = Path(job.pieces)
    rows = job.rows(first, stop)
    # the finest level's tables formed by its chunk tasks (module docstring) when this forest has its rows
    offsets = job.leaf_offsets and rows[-1][1] > rows[-1][0]
    with blas_limit():
        if job.terms is None:
            terms, parents = _read_forest(job, first, stop)
            state, _ = forest_upward([t[0] for t in terms], [t[1] for t in terms], parents, basis=job.basis)
        else:  # in the basis: (h~, n) per level, the leaves' (J^+ h, own residual), from the answers
            terms, parents, state, _ = _basis_upward(job, first, stop, tables=not offsets, read_answers=not offsets)
        result = forest_downward(state, top, split=job.split, outside=False,  # O: published nowhere
                                 leaf_offsets=offsets)
        tables = result.x
        if job.integer or job.nonnegative:  # the driver's top-down, continued from the roots' tables
            depth = len(result.x)
            tables = published_tables([GeographyLevel(t[0], t[1], up) for t, up in zip(terms[:depth], parents)],
                                      result.x, job.models[:depth], integer=job.integer, roots=roots)
    units = 0
    # the levels with rows: those _read_forest read (a level below one without rows has none);
    # the others get no piece (another forest's piece may start at their row)
    for k in range(1, len(result.x)):
        start, end = rows[k]
        x, model = tables[k], job.models[k]
        arrays = {}
        if x is None:  # the leaves' tables and residuals formed by their chunk tasks: per parent what they need
            write_parents(job, first, stop, result.x_basis[k], tables[k - 1])
        elif job.terms is None:
            objective = residuals(terms[k][0], terms[k][1], terms[k][2], x)
        elif k == len(result.x) - 1:  # leaves given by their tables: x_basis their parents' (G r)_p
            objective = job.terms[k].leaf_residuals(terms[k][1], result.x_basis[k], result.unit_class[k])
        else:
            objective = job.terms[k].residuals(terms[k][0], terms[k][1], result.x_basis[k])
        if x is not None:
            arrays = {"cells": x, "objective": objective}
        if not job.integer and model.workload is not None:  # integer tables publish no variances
            # per downward class (the leaves of one J in the shared basis share their parent's P:
            # a row per parent) and each unit's class, as the store keeps them
            arrays["variance_rows"], arrays["variance_class"] = result.variances(k, model.workload)
        write_piece(directory, job.names[k], start, arrays, fsync=job.fsync,
                    slab=job.chunk_units[k] if job.chunk_units else None, sliced=PIECE_SLICED)
        units += end - start
    return first, units


def chunk_task(job: Forests, k: int, estimate_path: str, chunk: int, start: int, stop: int,
               firsts: tuple[int, ...], tables: str | None = "cells/estimates",
               offsets: tuple[int, ...] | None = None, parent_firsts: tuple[int, ...] = ()) -> tuple[int, int]:
    """Step 5 (module docstring): chunk ``chunk`` (rows ``start:stop``) of level ``c + k``'s
    estimate written from the pieces starting at rows ``firsts`` (those it overlaps, in order),
    its unit ids from the release; ``tables``: the store's table array
    (:func:`distfit.stores.estimate.stored_tables`; None: the tables are query columns);
    ``offsets``: each piece's first row of the store's ``queries/variance_rows`` (None: the
    store has none). A piece holds each unit's table and residual and the query
    variances per class with each unit's class; the query estimates are the tables' workload sums
    (:func:`distfit.estimate.level_stores.level_queries`, as :func:`write_level` makes them),
    formed here, and each unit's class in the store its piece's plus the piece's offset (the
    driver writes the pieces' rows: :func:`_variance_rows`): the pieces carry a third of the
    bytes (PL94: 253 numbers a unit instead of 891), each written, hashed and read once. The
    finest level with ``job.leaf_offsets``: its tables and residuals formed here from the
    chunk's release rows (:func:`distfit.estimate.leaf_pieces.leaf_chunk`; ``parent_firsts``:
    each forest's first row at the level above). Returns ``(chunk, units)``."""
    model, n = job.models[k], stop - start
    # real-valued tables whose cells are query columns: each piece's rows copied once, straight
    # into those columns of the query estimates (workload_estimates then copies nothing)
    into = None if job.integer or model.workload is None else model.cell_queries
    queries = None if into is None else np.empty((n, model.num_queries))
    cells, objective, classes, row = [], [], [], 0
    names = ("cells", "objective") + (() if offsets is None else ("variance_class",))
    leaves = (leaf_chunk(job, _release_rows(job, k).answers(start, stop), start, stop, firsts, parent_firsts)
              if parent_firsts else None)
    for i, first in enumerate(firsts):  # each piece's rows of the chunk, only those read and checked
        if leaves is not None:
            piece = {"cells": leaves[0][i], "objective": leaves[1][i]}
            if offsets is not None:
                piece.update(read_piece(Path(job.pieces), job.names[k], first, rows=(start, stop),
                                        names=("variance_class",)))
        else:
            piece = read_piece(Path(job.pieces), job.names[k], first, rows=(start, stop), names=names)
        if queries is None:
            cells.append(np.asarray(piece["cells"]))
        else:
            queries[row:row + piece["cells"].shape[0], into:into + model.cells] = piece["cells"]
        row += piece["cells"].shape[0]
        objective.append(np.asarray(piece["objective"]))
        if offsets is not None:
            classes.append(np.asarray(piece["variance_class"]) + offsets[i])
    if queries is None:
        x = np.concatenate(cells)
        queries = level_queries(model, x, job.integer)
    else:
        x = queries[:, into:into + model.cells]
        workload_estimates(model, x, out=queries)
    ids = _release_rows(job, k).unit_ids(start, stop)
    with ChunkWriter(estimate_path) as writer:
        writer.write_arrays(chunk, start, chunk_rows(
            queries, x, np.concatenate(objective), 0,
            np.ones(n, dtype=np.uint8), ids, tables, variance_class=np.concatenate(classes) if classes else None))
    return chunk, n


def _forests(names: Sequence[str], cut: int, releases: Mapping[str, Any], columns: Mapping[str, str | None],
             forest_rows: int, threads: int, cells: int) -> tuple[list[np.ndarray], list[np.ndarray], list[tuple[int, int]], int]:
    """Step 1 (module docstring): ``(counts, spans, groups, rows)``, ``rows`` the forests' rows
    at most (``forest_rows``, or fewer to give each of ``threads`` :data:`FORESTS_PER_THREAD`
    forests, at least :data:`MIN_FOREST_ROWS`), and at most the units above the finest level whose
    ``cells x cells`` matrices fit :data:`distfit.estimate.subtrees.FOREST_MATRIX_BYTES`
    (:func:`distfit.estimate.subtrees.matrix_units`; ``cells`` 0, the shared-basis path: no such
    bound); :class:`Unordered` when a level's units are not ordered by their parent's row."""
    counts = []
    for level in range(cut + 1, len(names)):
        name, above = names[level], names[level - 1]
        up = parent_rows(name, releases[name], above, unit_keys(releases[above].unit_ids), columns[name])
        units_above = int(releases[above].attrs["units"])
        up = check_parent_of(up, level, int(releases[name].attrs["units"]), units_above)
        if up.size and np.any(up[1:] < up[:-1]):
            raise Unordered(f"level {name}: its units are not ordered by their parents' rows in level {above}")
        counts.append(np.bincount(up, minlength=units_above))
    spans = descendant_spans(counts)
    total = sum(int(s[-1]) for s in spans)
    rows = min(forest_rows, max(MIN_FOREST_ROWS, -(-total // (FORESTS_PER_THREAD * max(threads, 1)))))
    return counts, spans, group_roots(spans, rows, matrix_units(cells, FOREST_MATRIX_BYTES) if cells else None), rows


def _key(names: Sequence[str], releases: Mapping[str, Any], cut: int, forest_rows: int, split: str,
         integer: bool, shared: bool, nonnegative: bool = False) -> str:
    """The inputs the pieces are computed from (their directory's key; the forests' bounds)."""
    bound = "shared basis" if shared else f"matrices {FOREST_MATRIX_BYTES}"
    return "\n".join([*level_method(nonnegative), PIECE_ROWS, split, str(cut), str(forest_rows), bound,
                      f"integer {bool(integer)}",
                      *(f"{n} {releases[n].checksum}" for n in names)]) + "\n"


def _top_down(names: Sequence[str], cut: int, terms: Sequence[tuple], parent_of: Sequence[np.ndarray | None],
              xs: Sequence[np.ndarray], models: Mapping[str, MeasurementModel], releases: Mapping[str, Any],
              spans: Sequence[np.ndarray], integer: bool) -> list[np.ndarray]:
    """Step 3 with ``integer`` or ``nonnegative``: levels ``0 .. c``'s tables from their BLUE ``xs``, the levels
    below the cut given by their informations (a release's, no rows) and descendants (``spans``)."""
    below = [(level_terms(models[name], ReleaseRows(releases[name], models[name]).answers(0, 0))[0], np.diff(span))
             for name, span in zip(names[cut + 1:], spans[1:])]
    levels = [GeographyLevel(t[0], x, check_parent_of(up, i, x.shape[0], xs[i - 1].shape[0] if i else 0))
              for i, (t, x, up) in enumerate(zip(terms, xs, parent_of))]
    return published_tables(levels, xs, [models[n] for n in names[:cut + 1]], integer=integer, below=below)


def _run(client, function, calls: list[tuple[str, tuple]], name: str, progress: Progress):
    """The tasks' results as they complete, the progress line updated."""
    out = []
    for _label, result in dask_runtime().run_tasks(client, function, calls, name):
        out.append(result)
        progress(len(out), len(calls))
    return out


def estimate_on_cluster(client, spec: Any, *, names: Sequence[str], cut: int, dirs: Mapping[str, Path],
                        paths: Mapping[str, Path], plans: Mapping[str, Any], releases: Mapping[str, Any],
                        columns: Mapping[str, str | None], forest_rows: int = FOREST_ROWS, split: str = "total",
                        log: TextIO, fsync: bool = True, integer: bool = False,
                        nonnegative: bool = False, basis: np.ndarray | None = None,
                        models: Mapping[str, MeasurementModel] | None = None) -> dict[str, LevelEstimate]:
    """The estimate of every level (module docstring) on ``client``'s cluster, cut at level
    ``cut`` (0 <= cut < the finest level), forests of at most ``forest_rows`` rows (fewer on a
    large cluster: :func:`_forests`); with ``integer`` (``nonnegative``), integer (nonnegative)
    tables; the arguments as
    :func:`distfit.estimate.levels.estimate_levels` has them; ``basis``: the levels' shared basis
    (:func:`distfit.estimate.level_stores.information_basis`; None: the general path); ``models``:
    each level's :func:`distfit.estimate.measurements.measurement_model` (None: built here, BLAS
    on one thread: a pseudo-inverse per plan, which many threads on a busy machine made 8x
    dearer). Returns the
    level estimates by name. :class:`Unordered` (before anything is
    written) when a level below the cut is not ordered by its parents."""
    started = time.perf_counter()
    cells = int(np.prod(spec.domain.shape, dtype=np.int64))
    counts, spans, groups, forest_rows = _forests(names, cut, releases, columns, forest_rows,
                                                  dask_runtime().worker_threads(client), cells if basis is None else 0)
    below = names[cut:]
    if models is None:
        with blas_limit():
            models = {name: measurement_model(plans[name]) for name in names}
    with blas_limit():  # the tasks' matrices in the basis, once (real-valued: module docstring)
        terms = (None if basis is None or integer or nonnegative
                 else tuple(basis_terms(models[n], basis) for n in below))
    pieces = dirs[names[cut]] / PIECES_NAME  # made at step 4 (a refused input leaves nothing behind)
    # the leaves' tables formed by their chunk tasks (Forests.leaf_offsets): in the basis, unless
    # split="total" moves their blind part by their siblings' totals (the downward pass needs them)
    offsets = terms is not None and len(below) > 1 and models[below[-1]].workload is not None \
        and not (split == "total" and blind(terms[-1].own, PINV_RTOL))
    job = Forests(tuple(below), tuple(models[n] for n in below), tuple(releases[n].path for n in below),
                  tuple(releases[n].checksum for n in below), tuple(spans), tuple(counts), str(pieces), split, fsync,
                  integer, basis, terms, tuple(int(releases[n].attrs["chunk_units"]) for n in below), offsets, nonnegative)
    pieces_key = _key(names, releases, cut, forest_rows, split, integer, basis is not None, nonnegative)
    if job.leaf_offsets:  # the upward tasks write pieces (a refused input has left nothing behind by now)
        open_pieces(pieces, pieces_key)
    jobs = dask_runtime().held_on_every_worker(client, job, name="estimate-forests")  # task i takes jobs[i % n]
    units = sum(int(releases[n].attrs["units"]) for n in names)
    print(f"distfit: estimate levels {', '.join(names)} ({units:,} units) on the cluster: best linear unbiased "
          f"over the geography{', then integer tables' if integer else ', then nonnegative tables' if nonnegative else ''}"
          f", {len(groups)} forests of subtrees of "
          f"level {names[cut]}" + (f"; {below[-1]}'s tables formed as its chunks are written" if offsets else ""),
          file=log)

    # 2. up
    calls = [(str(first), (jobs[i % len(jobs)], first, stop)) for i, (first, stop) in enumerate(groups)]
    ups = sorted(_run(client, upward_task, calls, "estimate-up",
                      Progress(f"estimate {', '.join(below)}: up", log, unit="forests")), key=lambda r: r[0])
    summary = merge_summaries([r[1] for r in ups])

    # 3. the top
    with blas_limit():
        terms, parent_of = [], []
        for i, name in enumerate(names[:cut + 1]):
            if i < cut:
                release = releases[name]
                rows = ReleaseRows(release, models[name])
                terms.append(level_terms(models[name], rows.answers(0, int(release.attrs["units"]))))
            else:  # the cut level's: from the forests
                terms.append((ups[0][2][0], *(np.concatenate([r[2][j] for r in ups]) for j in (1, 2))))
            parent_of.append(None if i == 0 else (
                parent_rows(name, releases[name], names[i - 1], unit_keys(releases[names[i - 1]].unit_ids),
                            columns[name])))
        top = top_estimate([t[0] for t in terms[:cut]], [t[1] for t in terms[:cut]], parent_of, summary, split=split)
        xs = list(top.x)
        if integer or nonnegative:
            xs = _top_down(names, cut, terms, parent_of, xs, models, releases, spans, integer)
        variances = [None if integer or models[name].workload is None else top.variances(i, models[name].workload)
                     for i, name in enumerate(names[:cut + 1])]
        objectives = [residuals(t[0], t[1], t[2], x) for t, x in zip(terms, xs)]
    out: dict[str, LevelEstimate] = {}
    options = {"integer": integer, "nonnegative": nonnegative}  # the stores' kind
    parent_checksum: str | None = None
    rewritten = False
    for i, name in enumerate(names[:cut + 1]):
        above = names[i - 1] if i else None
        kept = None if rewritten else reusable_estimate(paths[name], releases[name], parent_checksum, **options)
        if kept is not None:
            checksum, status = kept.checksum, "reused"
        else:
            rewritten = True
            geography = {"level": name, "levels": list(names), "parent_level": above, "parent_column": columns[name],
                         "parent_estimate": None if above is None else {"path": out[above].path,
                                                                        "checksum": parent_checksum}}
            checksum = write_level(paths[name], spec=spec, plan=plans[name], plan_path=dirs[name] / "plan.zarr",
                                   release=releases[name], model=models[name], x=xs[i], objective=objectives[i],
                                   variances=variances[i], geography=geography, fsync=fsync, **options)
            status = "done"
        out[name] = LevelEstimate(name, str(paths[name]), checksum, int(xs[i].shape[0]), status, above)
        parent_checksum = checksum
    print(f"distfit: levels {', '.join(names[:cut + 1])} estimated in the driver and written "
          f"({time.perf_counter() - started:.1f} s so far)", file=log)

    # 4 and 5 (with leaf_offsets the upward tasks opened the pieces); a piece refused as read (changed on disk:
    # stores/pieces.py) is deleted, not written: its forest runs down again and the level's store resumes, once
    if not job.leaf_offsets:
        open_pieces(pieces, pieces_key)
    for attempt in (1, 2):
        try:
            if attempt == 2 and job.leaf_offsets:  # an upward task's piece refused: written again
                _up_again(client, job, jobs, groups, log)
            _down(client, job, jobs, groups, top, cut, log, roots=xs[cut] if integer or nonnegative else None)
            for k in range(1, len(below)):
                name, above = below[k], below[k - 1]
                out[name] = _write_from_pieces(
                    client, job, jobs, k, groups, spec=spec, plan=plans[name], model=models[name],
                    plan_path=dirs[name] / "plan.zarr", release=releases[name], path=paths[name],
                    geography={"level": name, "levels": list(names), "parent_level": above,
                               "parent_column": columns[name],
                               "parent_estimate": {"path": out[above].path, "checksum": out[above].checksum}},
                    log=log, fsync=fsync)
            break
        except PieceMismatch as error:
            if attempt == 2:
                raise
            remove_piece(pieces, error)  # not written: its forest runs down again
            print(f"distfit: note: {error}: it is computed again", file=log)
    remove_pieces(pieces)
    print(f"distfit: estimates of {len(names)} levels in {time.perf_counter() - started:.2f} s (on the cluster)",
          file=log)
    return out


def _up_again(client, job: Forests, jobs: Sequence[Any], groups: Sequence[tuple[int, int]], log: TextIO) -> None:
    """The upward tasks of the forests whose ``.sums`` or ``.carried`` pieces are not all there
    (one was refused as read, and deleted), run again to write them."""
    directory, name = Path(job.pieces), job.names[-1]
    missing = [(first, stop) for first, stop in groups if job.spans[-1][first] < job.spans[-1][stop] and not (
        piece_done(directory, name + SUMS, int(job.spans[-1][first]))
        and all(piece_done(directory, name + CARRIED, s) for s in carry_boundaries(job, first, stop)))]
    calls = [(str(first), (jobs[i % len(jobs)], first, stop)) for i, (first, stop) in enumerate(missing)]
    if calls:
        _run(client, upward_task, calls, "estimate-up-again",
             Progress(f"estimate {', '.join(job.names)}: up again", log, unit="forests"))


def _down(client, job: Forests, jobs: Sequence[Any], groups: Sequence[tuple[int, int]], top: Top, cut: int,
          log: TextIO, *, roots: np.ndarray | None) -> None:
    """Step 4 (module docstring) for the forests whose pieces are not all written (``roots``: the
    cut level's integer or nonnegative tables with either option, else None; ``jobs``: the workers' copies of
    ``job``, :func:`distfit.runtime.cluster.held_on_every_worker`)."""
    below = job.names[1:]
    pending = [(first, stop) for first, stop in groups
               if not all(sp[first] == sp[stop] or piece_done(Path(job.pieces), name, int(sp[first]))
                          for name, sp in zip(below, job.spans[1:]))
               or (job.leaf_offsets and job.spans[-1][first] < job.spans[-1][stop]
                   and not piece_done(Path(job.pieces), job.names[-1] + PARENTS, int(job.spans[-2][first])))]
    calls = [(str(first), (jobs[i % len(jobs)], first, stop, top.top(cut, slice(first, stop)),
                           None if roots is None else roots[first:stop])) for i, (first, stop) in enumerate(pending)]
    if calls:
        _run(client, downward_task, calls, "estimate-down",
             Progress(f"estimate {', '.join(below)}: down", log, unit="forests"))


def _write_from_pieces(client, job: Forests, jobs: Sequence[Any], k: int, groups: Sequence[tuple[int, int]], *,
                       spec, plan, model, plan_path: Path, release, path: Path, geography: dict, log: TextIO,
                       fsync: bool) -> LevelEstimate:
    """Step 5 for level ``c + k`` (module docstring): its store laid out or resumed, its pending
    chunks written by tasks from the pieces, sealed; kept as it is when sealed from these inputs."""
    with store_lock(path, "estimate"):  # one writer per store, as every chunked job's
        return _locked_write(client, job, jobs, k, groups, spec=spec, plan=plan, model=model, plan_path=plan_path,
                             release=release, path=path, geography=geography, log=log, fsync=fsync)


def _locked_write(client, job: Forests, jobs: Sequence[Any], k: int, groups: Sequence[tuple[int, int]], *, spec,
                  plan, model, plan_path: Path, release, path: Path, geography: dict, log: TextIO,
                  fsync: bool) -> LevelEstimate:
    name = job.names[k]
    units, chunk_units = int(release.attrs["units"]), int(release.attrs["chunk_units"])
    parent = geography["parent_estimate"]["checksum"]
    kept = reusable_estimate(path, release, parent, integer=job.integer, nonnegative=job.nonnegative)
    method, stated = level_method(job.nonnegative)
    if kept is not None:
        return LevelEstimate(name, str(path), kept.checksum, units, "reused", geography["parent_level"])
    state = estimate_state(path)
    resumed = False
    if state == "incomplete":
        try:
            root = open_resumable(path, plan_checksum=plan.checksum, release_checksum=release.checksum,
                                  integer=job.integer, method=method)
            resumed = (stated_geography(root).get("parent_estimate") or {}).get("checksum") == parent
        except ValueError:
            resumed = False
    present = [first for first, stop in groups if job.spans[k][first] < job.spans[k][stop]]
    firsts = np.array([job.spans[k][first] for first in present], dtype=np.int64)
    # the leaves formed by the chunk tasks: each forest's first row at the level above (its .parents piece)
    above = (np.array([job.spans[k - 1][first] for first in present], dtype=np.int64)
             if job.leaf_offsets and k == len(job.names) - 1 else None)
    # the query variances: each piece's rows, one after the other (a unit's class is its
    # piece's plus the piece's offset); a store resumed must have numbered them the same way
    pieces = ([[int(f), piece_rows(Path(job.pieces), name, int(f), "variance_rows")] for f in firsts]
              if model.workload is not None and not job.integer else None)
    offsets = None if pieces is None else np.concatenate([[0], np.cumsum([c for _, c in pieces])]).astype(np.int64)
    if resumed and pieces is not None:
        resumed = variance_pieces(root) == pieces

    def create(target: Path):
        root = create_estimate(target, plan=plan, plan_path=str(plan_path), release=release, method=method,
                               objective=stated, integer=job.integer, cells=model.cells,
                               query_dtype=query_dtype(model, job.integer),
                               cell_labels=cell_labels(model.attributes, value_labels(spec)),
                               cell_columns=cell_columns(model, job.integer),
                               variance_classes=None if offsets is None else int(offsets[-1]), geography=geography,
                               variance_pieces=pieces)
        return root

    n_chunks = -(-units // chunk_units)
    layout = resume_or_create(path, state, "estimate", n_chunks, resumed=resumed, resume=resumed,
                              reopen=lambda p: open_resumable(p, plan_checksum=plan.checksum,
                                                              release_checksum=release.checksum,
                                                              integer=job.integer, method=method),
                              create=create, kept="chunks already written (kept as they are)", rest="to write",
                              log=log)
    tables = stored_tables(layout.root)  # None: the tables are query columns (a store resumed keeps its own)
    arrays = chunk_arrays(tables) + (["queries/variance_class"] if pieces is not None else [])
    if pieces is not None:
        _variance_rows(job, k, layout.root, firsts, offsets)
    calls = []
    for chunk in layout.pending:
        start, stop = chunk * chunk_units, min((chunk + 1) * chunk_units, units)
        lo = max(int(np.searchsorted(firsts, start, side="right")) - 1, 0)
        hi = int(np.searchsorted(firsts, stop, side="left"))
        calls.append((str(chunk), (jobs[len(calls) % len(jobs)], k, str(layout.target), chunk, start, stop,
                                   tuple(int(f) for f in firsts[lo:hi]), tables,
                                   None if offsets is None else tuple(int(o) for o in offsets[lo:hi]),
                                   () if above is None else tuple(int(f) for f in above[lo:hi]))))
    with ChunkedWrite(layout.root, layout.target, units=units, chunk_units=chunk_units, pending=layout.pending,
                      stage=f"estimate {name}", log=log, fsync=fsync, staging=layout.staging, arrays=arrays) as write:
        if calls:
            write.consume(result for _label, result in dask_runtime().run_tasks(client, chunk_task, calls,
                                                                                  f"estimate-{name}"))
        checksum = write.seal(lambda hasher, synced: seal(
            layout.root, layout.target, plan_path=str(plan_path), plan_checksum=plan.checksum,
            release_path=release.path, release_checksum=release.checksum, fsync=fsync, hasher=hasher,
            synced=synced), path, check_replaceable)
    return LevelEstimate(name, str(path), checksum, units, "done", geography["parent_level"])


def _variance_rows(job: Forests, k: int, root, firsts: np.ndarray, offsets: np.ndarray) -> None:
    """Level ``c + k``'s ``queries/variance_rows``: each piece's rows (checked as read) at its
    offset, a piece at a time (PL94 blocks: a row per block group), written again on a resume
    (the same rows: the passes are deterministic, and the pieces' numbering was checked)."""
    for first, offset in zip(firsts, offsets):
        rows = read_piece(Path(job.pieces), job.names[k], int(first), rows=(int(first), int(first)),
                          names=("variance_rows",))["variance_rows"]
        write_variance_rows(root, int(offset), rows)
