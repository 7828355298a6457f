"""``distfit estimate``: a plan and its sealed release in, an estimate store out (the I/O edge).

``distfit estimate PLAN.zarr RELEASE.zarr --out ESTIMATE.zarr [--integer] [--resume]
[--overwrite] [--workers N | --cluster ADDR|FILE | --serial]`` (docs/design.md sections 5 and 7).
Post-processing: it reads the plan and the release only, never the data, so it costs no
privacy. Per unit (docs/design.md section 7): the measurements ``y_b = R_b a_b`` are recovered
exactly from the block answers (the projection takes the answers: its linear term
``B_b^T Sigma_b^-1 y_b`` in one product from them),
the data vector is the projection ``x_hat = argmin_{x >= 0} sum_b (y_b - B_b M_b x)^T
Sigma_b^-1 (y_b - B_b M_b x)`` (:func:`distfit.estimate.projection.project_nonnegative`), with
``--integer`` rounded so that each unit's total is kept
(:func:`distfit.estimate.rounding.round_preserving_total`), and every workload query's estimate
is ``W x_hat`` (:func:`distfit.estimate.measurements.workload_estimates`): nonnegative and
consistent (every table a sum of one ``x_hat``'s cells). The store is
:mod:`distfit.stores.estimate` (its layout is a contract, docs/design.md section 4).

Where it runs: per release chunk (the release's chunking), every unit of the chunk solved
together with array operations, a run of chunks per task as the release cuts them
(:func:`estimate_chunks_task`, :func:`distfit.release.tasks.task_chunks`); serially in the
driver (``--serial``) or on Dask through :mod:`distfit.runtime.cluster` (a local multi-process
cluster by default, started on a thread while the driver checks its inputs:
:class:`distfit.runtime.placement.PlacedClient`). The measurement model is built and prepared in the
driver meanwhile (:func:`distfit.estimate.projection.prepare_projection`: ``H``, its structure)
and handed to every worker as the argument of a task of its own
(:func:`distfit.runtime.cluster.held_on_every_worker`: each worker unpickles its copy at once,
none waits for another's; a result lost with its worker is made again from the task, unlike
scattered data); the chunk tasks depend on them in turn. A task reads its chunks'
answers from the release as raw chunk files (:meth:`distfit.stores.sealing.SealedStore.rows_of`)
and writes each chunk's arrays and, last, its done marker (``ChunkWriter.write_arrays``: on a
writer thread while the next chunk is computed); the driver
fsyncs and hashes each chunk as it lands (``ChunkSync``, ``ReleaseHasher``), so the seal finds
the files on disk and the digest computed, as a release's does.

Refused before anything is written (ValueError / FileExistsError, exit 2 on the command line):
a release that is not sealed (or not a release), a plan whose arrays do not match its checksum,
a release whose recorded plan checksum is not the plan's (a release of another plan or spec),
a sealed estimate at ``--out`` without ``--overwrite``, an incomplete one without ``--resume``
or ``--overwrite``, anything else at ``--out``, a second writer (``store_lock``).

Lifecycle as a release's: built at the final path with ``complete=false``; ``--resume``
continues an incomplete estimate of the same plan, release and options, computing only the
chunks not marked done (the estimate is deterministic, so a resumed store equals an
uninterrupted one bit for bit); a chunk fitted by the local polytope (``graphical-local``: one
long fit, Adult's ~30-60 s) saves its ADMM state every ~5 s and a resumed chunk continues from
its last checkpoint instead of from the beginning, to the same bits
(:mod:`distfit.estimate.checkpoints`; kept beside the store, a chunk's removed once its rows are
written, all of them before the seal; an ``--overwrite``, built aside and never resumed, keeps
none); ``--overwrite`` builds aside and moves into place once sealed.
Sealing re-verifies the plan's checksum and that the release still holds the checksum it was
started from.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TextIO

import numpy as np

from distfit.runtime.chunked_job import ChunkedWrite, check_out, claim_out, resume_or_create
from distfit.runtime.placement import PlacedClient, Placement, dask_runtime
from distfit.runtime.progress import Progress
from distfit.estimate import graphical
from distfit.estimate.checkpoints import ChunkCheckpoints
from distfit.estimate.level_stores import cell_columns as stored_cell_columns
from distfit.estimate.measurements import (
    MeasurementModel,
    WorkloadKind,
    measurement_model,
    published_estimates,
    recover_measurements,
    workload_kind,
)
from distfit.estimate.projection import prepare_projection, project_nonnegative, projection_memory_bytes
from distfit.estimate.rounding import round_preserving_total
from distfit.estimate.warm import warm_estimate
from distfit.spec.parse import parse_spec
from distfit.stores.data import cell_labels, value_labels
from distfit.stores.estimate import (
    check_replaceable,
    chunk_arrays,
    chunk_fit,
    combine_fits,
    fit_parts,
    chunk_rows,
    create_estimate,
    estimate_state,
    open_resumable,
    read_estimate,
    read_sealed_estimate,
    seal,
    stored_tables,
)
from distfit.stores.checkpoint import remove_checkpoints
from distfit.stores.files import root_attrs_on_disk
from distfit.stores.plan import read_plan, verify_checksum
from distfit.release.tasks import task_chunks
from distfit.stores.release import DerivedAnswers, read_release, read_sealed_release
from distfit.stores.release_chunks import ChunkWriter, aligned_empty
from distfit.runtime.memory import address_space_left
from distfit.runtime.threads import blas_limit

PathLike = str | os.PathLike

#: The method recorded in the store (``method`` attr) and the objective it minimises per unit.
METHOD = "projection"
OBJECTIVE = "sum_b (y_b - B_b M_b x)^T Sigma_b^-1 (y_b - B_b M_b x) over x >= 0, per unit"
#: The graphical model's (docs/design.md section 7, :mod:`distfit.estimate.graphical`), over clique marginals.
GRAPHICAL_OBJECTIVE = ("sum_b (y_b - B_b M_b mu)^T Sigma_b^-1 (y_b - B_b M_b mu) over nonnegative clique marginals "
                       "mu of total N_hat: the marginal polytope (graphical-exact) or the local polytope of the "
                       "saturated region graph (graphical-region-graph); or ||Q (u - w)||^2, the published queries' "
                       "squared error from the raw release, over nonnegative agreeing clique tables of a residual "
                       "plan (graphical-local); per unit")
#: What ``--method auto`` (``distfit run``) may record: a function of the plan, so any of them is
#: the same choice for the same plan.
AUTO_METHODS = (METHOD, "graphical-exact", "graphical-local", "graphical-region-graph")
#: The ``--method`` choices: auto takes the projection up to graphical.PROJECTION_MAX_CELLS cells,
#: a graphical model above; graphical lets graphical.graphical_problem choose the local polytope
#: (a residual plan), exact inference or the region graph.
METHODS = ("auto", "projection", "graphical", "graphical-exact", "graphical-local", "graphical-region-graph")

__all__ = ["EstimateJob", "EstimateResult", "ReleaseRows", "chunk_answers", "estimate_chunk", "estimate_chunk_task",
           "estimate_chunks_task", "estimate_in_run",
           "manifest_entry", "memory_limit", "run_estimate"]


@dataclass(frozen=True)
class EstimateResult:
    """What :func:`run_estimate` did. ``chunks_done_now`` chunks were estimated in this session
    (all of them for a new estimate, the missing ones on ``--resume``); ``fit`` is the store's
    ``fit`` attr (objective mean and max, iterations max, unconverged units)."""

    path: str
    units: int
    queries: int
    cells: int
    chunks: int
    chunks_done_now: int
    units_done_now: int
    seconds: float
    checksum: str
    plan_checksum: str
    release_checksum: str
    method: str
    integer: bool
    resumed: bool
    fit: dict


@dataclass(frozen=True)
class EstimateJob:
    """Everything a chunk task needs but the model (small; one per session)."""

    estimate_path: str
    release_path: str
    release_checksum: str
    units: int
    chunk_units: int
    integer: bool
    workload: WorkloadKind
    method: str = METHOD  # or "graphical-exact" / "graphical-local" / "graphical-region-graph" (graphical_method)
    tables: str | None = "cells/estimates"  # the per-unit table written (stores.estimate.chunk_arrays)
    check_chunks: bool = True  # each release chunk read checked against its digest (run_estimate's release_checksum)
    fsync: bool = True  # the fit's checkpoints fsynced as the store's files are (run_estimate's fsync)
    checkpoints: bool = True  # the local polytope's fits checkpointed: a store built in place (resumable)


# --------------------------------------------------------------------------------------------
# what a worker runs


class ReleaseRows:
    """A sealed release's rows as chunk tasks read them: every block's answers and the unit ids.
    The arrays and derived views are looked up once (each zarr group lookup costs about a
    millisecond: ten a chunk were 2 us a unit), the rows read as raw chunk files and, for a
    release opened with its digests, each chunk checked before it is used
    (:meth:`distfit.stores.sealing.SealedStore.rows_of`)."""

    def __init__(self, release, model: MeasurementModel) -> None:
        self._release = release
        self._queries = None
        # (block id, where its answers come from: "queries" all the query answers, "columns" some
        # of them (the index), "packed" a packed block's answers (computed whole by the release
        # reader), "stored" its own answers array)
        self._sources: list[tuple[str, str, Any]] = []
        for block in model.blocks:
            view = release.block_answers(block.block_id)
            if isinstance(view, DerivedAnswers):
                self._queries = release.answers
                identity = view.query_index.size == int(release.answers.shape[1]) and \
                    np.array_equal(view.query_index, np.arange(view.query_index.size))
                self._sources.append((block.block_id, "queries", None) if identity else
                                     (block.block_id, "columns", view.query_index))
            else:
                self._sources.append((block.block_id, "packed" if isinstance(view, np.ndarray) else "stored", view))

    def answers(self, start: int, stop: int) -> dict[str, np.ndarray]:
        """Every block's released answers for rows ``start:stop``: stored blocks read as raw
        chunk files, derived blocks (:class:`distfit.stores.release.DerivedAnswers`) taken as
        columns of the query answers, read once (the query answers themselves, not copied, for a
        block whose rows are every query in order: PL94's)."""
        queries = None if self._queries is None else self._release.rows_of("queries/answers", start, stop)
        out = {}
        for block_id, kind, source in self._sources:
            if kind == "queries":
                out[block_id] = queries
            elif kind == "columns":
                out[block_id] = np.take(queries, source, axis=1)
            elif kind == "packed":
                out[block_id] = source[start:stop]
            else:
                out[block_id] = self._release.rows_of(f"blocks/{block_id}/answers", start, stop)
        return out

    def unit_ids(self, start: int, stop: int) -> np.ndarray:
        """The unit ids of rows ``start:stop``."""
        return np.asarray(self._release.rows_of("unit_ids", start, stop))

    def read(self, start: int, stop: int) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """``(answers, unit_ids)`` of rows ``start:stop``."""
        return self.answers(start, stop), self.unit_ids(start, stop)

    def read_ahead(self, spans: list[tuple[int, int]]) -> Iterator[tuple[dict[str, np.ndarray], np.ndarray]]:
        """:meth:`read` of each ``(start, stop)`` in turn, the next one read on a thread while the
        caller works on the current one (the reads are direct I/O, mostly waiting on the
        disk: 2 us a unit of a worker's time on PL94, now overlapped with the projection)."""
        if not spans:
            return
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="distfit-read") as pool:
            ahead = pool.submit(self.read, *spans[0])
            for following in spans[1:]:
                current, ahead = ahead.result(), pool.submit(self.read, *following)
                yield current
            yield ahead.result()


def chunk_answers(release, model: MeasurementModel, start: int, stop: int) -> dict[str, np.ndarray]:
    """Every block's released answers for rows ``start:stop`` (:meth:`ReleaseRows.answers`)."""
    return ReleaseRows(release, model).answers(start, stop)


def estimate_chunk(model: MeasurementModel, answers: dict[str, np.ndarray], *, integer: bool,
                   workload: WorkloadKind) -> tuple[np.ndarray, np.ndarray, Any]:
    """The estimates of one chunk of units (pure): ``(queries (n, m), cells (n, cells), fit)``
    from the block answers (module docstring); ``fit`` is the projection's result (objective,
    iterations, converged). The query estimates are
    :func:`distfit.estimate.measurements.published_estimates` (``workload``: the model's
    :func:`~distfit.estimate.measurements.workload_kind`): never below 0 for a nonnegative
    workload; with ``integer`` the cells are int64 and so are the queries of an integral one.
    Where the queries hold the cells as columns (``model.cell_queries``) the projection writes
    ``x`` straight into them (no copy, no separate array: ``cells`` is that view)."""
    queries = None
    if not integer and model.workload is not None and model.cell_queries is not None:
        units = next(iter(answers.values())).shape[0] if answers else 0
        # page-aligned: the writer writes it with direct I/O as it is, without an aligned copy
        queries = aligned_empty(units * model.num_queries * 8).view(np.float64).reshape(units, model.num_queries)
    columns = None if queries is None else queries[:, model.cell_queries:model.cell_queries + model.cells]
    fit = project_nonnegative(model, answers, answers=True, out=columns)
    cells = round_preserving_total(fit.x) if integer else np.asarray(fit.x, dtype=np.float64)
    return published_estimates(model, cells, workload, integer=integer, out=queries), cells, fit


def graphical_method(model: MeasurementModel, method: str, integer: bool, chunk_units: int = 1, *,
                     memory_limit: int = graphical.MEMORY_LIMIT_BYTES) -> tuple[str, Any, int]:
    """The store's ``method`` for ``--method`` (:data:`METHODS`), the graphical problem (None
    for the projection) and the method's working memory in bytes (per task: one chunk of
    ``chunk_units`` units for the projection, :func:`~distfit.estimate.projection.projection_memory_bytes`;
    the graphical model's tables, :attr:`~distfit.estimate.graphical.GraphicalProblem.memory_bytes`).
    Auto takes the projection when the domain has at most
    :data:`distfit.estimate.graphical.PROJECTION_MAX_CELLS` cells and its memory is within
    ``memory_limit``, else a graphical model; nothing proportional to the domain's cells is
    allocated to decide. ValueError (one line): an unknown method, ``--integer`` with a graphical
    model (overlapping clique marginals cannot in general be rounded to integers that still
    agree on their shared attributes, so integer tables are refused rather than made
    inconsistent), a method whose memory exceeds ``memory_limit`` (the projection's or the
    graphical model's, :class:`~distfit.estimate.graphical.ModelTooLarge`), mbi not installed."""
    if method not in METHODS:
        raise ValueError(f"--method: {method!r}, expected one of {', '.join(METHODS)}")
    projection_bytes = projection_memory_bytes(model, chunk_units)
    fits = projection_bytes <= memory_limit
    if method == "projection" or (method == "auto" and fits and not graphical.use_graphical(model)):
        if not fits:
            raise ValueError(
                f"--method projection: the projection of {model.cells:,} cells needs {projection_bytes / 2**30:,.1f} GiB "
                f"for a chunk of {chunk_units:,} units, over the limit of {memory_limit / 2**30:.1f} GiB; "
                f"use --method auto (a graphical model)")
        return METHOD, None, projection_bytes
    if integer:
        raise ValueError(f"--integer: not available with a graphical-model estimate ({model.cells:,} cells); "
                         "clique marginals cannot in general be rounded consistently, leave out --integer")
    try:
        problem = graphical.graphical_problem(model, method=method.removeprefix("graphical-").replace("graphical", "auto"),
                                              memory_limit=memory_limit)
    except graphical.GraphicalUnavailable as exc:
        raise ValueError(str(exc)) from None
    return f"graphical-{problem.method}", problem, problem.memory_bytes


def memory_limit() -> int:
    """The working memory a method may take (:func:`graphical_method`'s ``memory_limit``):
    :data:`distfit.estimate.graphical.MEMORY_LIMIT_BYTES`, or less when this process runs under
    an address-space cap (RLIMIT_AS) with less left
    (:func:`distfit.runtime.memory.address_space_left`): a method that would not fit is refused
    in one line before it starts rather than failing part way. A Dask worker inherits the
    driver's cap and imports about as much, so the driver's margin stands for the workers'."""
    left = address_space_left()
    return graphical.MEMORY_LIMIT_BYTES if left is None else min(graphical.MEMORY_LIMIT_BYTES, left)


#: The graphical problem of the last model a worker saw (its key, problem): built once per worker.
_PROBLEM: list = []


def _problem_key(model: MeasurementModel, method: str) -> tuple:
    """What :data:`_PROBLEM` keeps a problem by: the store's method, the model's block ids and
    each block's covariance sum (two plans of one spec share their block ids, not their noise)."""
    return method, tuple((block.block_id, float(block.sigma.sum())) for block in model.blocks)


def _problem_for(model: MeasurementModel, method: str):
    """The graphical problem of ``model`` by ``method``, kept by :func:`_problem_key` (on the
    serial path, the driver's own) as :func:`_release_rows` keeps its reader (a worker holds two
    equal models; keyed by the object, it rebuilt the problem, the local polytope's factor
    included, whenever they alternated)."""
    key = _problem_key(model, method)
    if not _PROBLEM or _PROBLEM[0] != key:
        _PROBLEM[:] = [key, graphical.graphical_problem(model, method=method.removeprefix("graphical-"))]
    return _PROBLEM[1]


def estimate_chunk_graphical(problem, answers: dict[str, np.ndarray], *, workload: WorkloadKind,
                             progress: Callable[[int, int], None] | None = None,
                             checkpoints: ChunkCheckpoints | None = None) -> tuple[np.ndarray, np.ndarray, Any]:
    """One chunk through a graphical model (pure but for jax inside mbi, ``progress`` and
    ``checkpoints``): ``(queries (n, m), marginals (n, sum_c |c|), fit)``
    (:func:`distfit.estimate.graphical.estimate_units`, ``progress(steps, at most)`` after every
    batch of mirror descent steps or ADMM iterations; ``checkpoints``: the local polytope's
    saved state, :mod:`distfit.estimate.checkpoints`); a nonnegative workload's estimates are
    sums of nonnegative marginals, rounding below 0 set to 0."""
    fit = graphical.estimate_units(problem, recover_measurements(problem.model, answers), progress=progress,
                                   checkpoints=checkpoints)
    queries = np.maximum(fit.estimates, 0.0) if workload.nonnegative else fit.estimates
    return queries, fit.marginals, fit


def _open_release(job: EstimateJob):
    """The release of ``job`` (its root checked again, :meth:`distfit.stores.sealing.SealedKind.read_sealed`),
    refused if its checksum is no longer the one the estimate started from; each chunk a task
    reads is then checked against its digest (:class:`ReleaseRows`)."""
    if not job.check_chunks:  # a release the caller has just written (run_estimate's release_checksum)
        release = read_release(job.release_path)
        if release.checksum != job.release_checksum:
            raise ValueError(f"{job.release_path}: the release changed during the estimate (checksum "
                             f"{release.checksum}, {job.release_checksum} at the start)")
        return release
    return read_sealed_release(job.release_path, job.release_checksum)


#: The release reader of the last job a worker ran: ``[job, block ids, ReleaseRows]``.
_ROWS: list = []


def _release_rows(job: EstimateJob, model: MeasurementModel) -> ReleaseRows:
    """The job's :class:`ReleaseRows`, opened (and the release's root checked,
    :func:`_open_release`) by the first of its tasks on this worker and kept for the others:
    opening looks up the release's arrays (6 ms of zarr a task, 50 tasks at 1M PL94 units) and
    checks the root (0.1-0.2 CPU-s at 1M: the digest table and the done markers, one zarr chunk
    per chunk of units). An equal job (the same paths, release checksum and options) reads the
    same release; the seal checks it is still the one the estimate started from. Kept by the
    model's block ids, all a reader depends on, not by the model object: a worker holds two
    equal models, its own and the other worker's copy, whose tasks it also runs
    (:func:`_run_dask`), and keyed by the object every other task reopened and re-checked the
    release (1M PL94 units: 2.5 CPU-s, 12 % of the estimate; benchmarks/README.md, session 14)."""
    blocks = tuple(block.block_id for block in model.blocks)
    if not _ROWS or _ROWS[0] != job or _ROWS[1] != blocks:
        _ROWS[:] = [job, blocks, ReleaseRows(_open_release(job), model)]
    return _ROWS[2]


def _span(job: EstimateJob, chunk: int) -> tuple[int, int]:
    start = chunk * job.chunk_units
    return start, min(start + job.chunk_units, job.units)


def estimate_chunk_task(job: EstimateJob, model: MeasurementModel, chunk: int,
                        writer: ChunkWriter | None = None,
                        read: tuple[dict[str, np.ndarray], np.ndarray] | None = None) -> tuple[int, int]:
    """Estimate release chunk ``chunk`` and write its rows and, last, its done marker (written
    before this returns, or through ``writer``: queued, written while the next chunk is
    computed). ``read``: the chunk's answers and unit ids, already read
    (:meth:`ReleaseRows.read`; else the release is opened, checked and read here). Deterministic in its arguments, so a retry rewrites identical
    bytes. Returns ``(chunk, units, part)``, ``part`` the chunk's share of the store's ``fit``
    attr (:func:`distfit.stores.estimate.chunk_fit` of the rows written)."""
    start, stop = _span(job, chunk)
    if read is None:
        read = ReleaseRows(_open_release(job), model).read(start, stop)
    answers, unit_ids = read
    with blas_limit():
        if job.method == METHOD:
            queries, cells, fit = estimate_chunk(model, answers, integer=job.integer, workload=job.workload)
        else:
            # a graphical chunk runs for up to a minute (Adult: ~500 ADMM iterations, ~15 s): its
            # steps, rate and ETA (an upper bound: it may converge sooner) on the process's stderr
            local = job.method == "graphical-local"
            problem = _problem_for(model, job.method)
            _ = problem.local  # the local polytope built (once) before the clock starts: the rate is the steps'
            label = f"estimate units {start}-{stop - 1}"
            steps = Progress(f"{label}: {'ADMM' if local else 'mirror descent'}", unit="steps")
            # the ADMM state saved now and then, and a killed fit resumed from it (estimate.checkpoints)
            checkpoints = ChunkCheckpoints(job.estimate_path, chunk, label, fsync=job.fsync,
                                           on_resume=steps.resumed) if local and job.checkpoints else None
            queries, cells, fit = estimate_chunk_graphical(problem, answers, workload=job.workload, progress=steps,
                                                           checkpoints=checkpoints)
            if fit.iterations:
                steps(fit.iterations, fit.iterations)  # the line ends: the steps it took
    arrays = chunk_rows(queries, cells, fit.objective, fit.iterations, fit.converged, unit_ids, tables=job.tables)
    part = chunk_fit(arrays["solve/objective"], arrays["solve/iterations"], arrays["solve/converged"])
    if writer is not None:
        writer.write_arrays(chunk, start, arrays)
    else:
        with ChunkWriter(job.estimate_path) as own:
            own.write_arrays(chunk, start, arrays)
    return chunk, stop - start, part


def estimate_chunks_task(job: EstimateJob, model: MeasurementModel,
                         chunks: tuple[int, ...]) -> tuple[tuple[int, int, tuple], ...]:
    """One Dask task: :func:`estimate_chunk_task` for each of ``chunks`` in turn (a run of
    chunks cut by :func:`distfit.release.tasks.task_chunks`, as the release's tasks are), the
    release opened, checked and its arrays looked up once per worker and job (:class:`ReleaseRows`,
    :func:`_release_rows`), each chunk read
    while the one before is computed (:meth:`ReleaseRows.read_ahead`) and written by one writer's
    thread while the next is computed. Each chunk is marked done as it is written. Returns
    ``(chunk, units, part)`` per chunk (:func:`estimate_chunk_task`)."""
    rows = _release_rows(job, model)
    reads = rows.read_ahead([_span(job, chunk) for chunk in chunks])
    with ChunkWriter(job.estimate_path) as writer:  # leaving it waits for the last chunk's writes
        return tuple(estimate_chunk_task(job, model, chunk, writer=writer, read=read)
                     for chunk, read in zip(chunks, reads))


# --------------------------------------------------------------------------------------------
# the driver


def _cell_labels(plan, model: MeasurementModel) -> np.ndarray | None:
    """The cell labels of the schema (the spec's value labels; codes when the spec cannot be read)."""
    try:
        values = value_labels(parse_spec(plan.attrs["spec"]))
    except Exception:  # noqa: BLE001 - labels are a convenience; a spec we cannot parse gives codes
        values = value_labels(model.domain())
    if any(len(values.get(a, ())) != n for a, n in zip(model.attributes, model.sizes)):
        values = value_labels(model.domain())
    return cell_labels(model.attributes, values)


def _check_inputs(plan_path: str, release_path: str, release_checksum: str | None = None):
    """The sealed release and the plan it was made from (module docstring), or ValueError;
    ``release_checksum``: the release's, its caller having just written it (not hashed again)."""
    # ReleaseError (ValueError): missing, unsealed, not a release, or its root (attrs, small arrays,
    # chunk digests) changed since it was sealed; each chunk is checked by the task that reads it
    release = read_sealed_release(release_path) if release_checksum is None else read_release(release_path)
    if release_checksum is not None and release.checksum != release_checksum:
        raise ValueError(f"{release_path}: the release changed since it was written (checksum {release.checksum}, "
                         f"written with {release_checksum})")
    ok, stored, recomputed = verify_checksum(plan_path)  # StoreError (ValueError): not a plan
    if not ok:
        raise ValueError(f"{plan_path}: the plan's arrays do not match its checksum ({recomputed}, stored "
                         f"{stored}); it has been altered")
    if release.attrs.get("plan_checksum") != stored:
        raise ValueError(f"{release.path}: was released from another plan (plan checksum "
                         f"{release.attrs.get('plan_checksum')}), not from {plan_path} ({stored})")
    return read_plan(plan_path), release


def run_estimate(
    plan_path: PathLike,
    release_path: PathLike,
    out: PathLike,
    *,
    integer: bool = False,
    resume: bool = False,
    overwrite: bool = False,
    method: str = "auto",
    placement: Placement = Placement(),
    log: TextIO | None = None,
    fsync: bool = True,
    after_chunk: Callable[[int], None] | None = None,
    release_checksum: str | None = None,
) -> EstimateResult:
    """Estimate every unit of the sealed release at ``release_path`` (made through the plan at
    ``plan_path``) into ``out`` (module docstring). ``placement``: where the chunk tasks run
    (:class:`distfit.runtime.placement.Placement`; default a local cluster, or this process
    when the release is one chunk of units: one task, which no cluster can share; the same on
    the local cluster a ``distfit run`` started by default). ``after_chunk(chunk)``
    is called in the driver after each chunk is written (a test hook). ``release_checksum``: the
    release's checksum when the caller has just written it (``distfit run``'s
    :func:`estimate_in_run`; a benchmark's baseline); it is then
    not hashed again, only checked to still state it, as ``run_release``'s ``data_checksum``;
    otherwise its root is verified here and each chunk by the task that reads it. Errors: ValueError (bad input),
    FileExistsError (something at ``out`` that may not be replaced, or a second writer),
    cluster.ClusterError."""
    started = time.perf_counter()
    log = log or sys.stderr
    plan_path, release_path = os.fspath(plan_path), os.fspath(release_path)
    out_path = Path(os.fspath(out))
    check_out(out_path, "estimate", resume=resume, overwrite=overwrite)

    with contextlib.ExitStack() as stack:
        state, resumed = claim_out(stack, out_path, "estimate", estimate_state, resume=resume, overwrite=overwrite,
                                   log=log)
        stack.enter_context(blas_limit())
        # the cheap refusals (missing, unsealed, another kind) before any cluster
        attrs = read_release(release_path).attrs
        default = placement == Placement() or (placement.transport.own and placement.workers is None)
        if default and int(attrs["units"]) <= int(attrs["chunk_units"]):
            # one chunk is one task: a local cluster could not share it, only add its start-up and
            # the model's copy to a worker (Adult's one unit: 106 s wall, 45 CPU-s against 29 in
            # the driver; benchmarks/README.md, issue 26)
            print("distfit: one chunk of units: estimated in this process, without a cluster", file=log)
            placement = Placement(serial=True)
        client = PlacedClient(placement, stack, log)
        if not resumed:
            client.start()  # the workers spawn while the inputs are verified and the model is built
        plan, release = _check_inputs(plan_path, release_path, release_checksum)
        if not resumed:
            client.get()  # an unreachable cluster is refused here
        model = measurement_model(plan)
        limit = memory_limit()
        store_method, problem, memory = graphical_method(model, method, integer, int(release.attrs["chunk_units"]),
                                                         memory_limit=limit)
        if problem is not None:
            _PROBLEM[:] = [_problem_key(model, store_method), problem]  # the serial path reuses the driver's
        else:
            prepare_projection(model)  # here, while the workers start: they receive it ready
            if not placement.serial:  # compiled here once (or loaded): the workers load it from numba's cache
                warm_estimate()
        workload = workload_kind(model)
        # the data vector is written once: as query columns where the workload holds every cell
        cell_columns = stored_cell_columns(model, integer) if problem is None else None
        units, chunk_units = int(release.attrs["units"]), int(release.attrs["chunk_units"])
        n_chunks = -(-units // chunk_units)
        root, target, staging, pending = resume_or_create(
            out_path, state, "estimate", n_chunks, resumed=resumed, resume=resume,
            reopen=lambda path: open_resumable(path, plan_checksum=plan.checksum, release_checksum=release.checksum,
                                               integer=integer, method=store_method),
            create=lambda path: create_estimate(
                path, plan=plan, plan_path=plan_path, release=release, method=store_method,
                objective=OBJECTIVE if problem is None else GRAPHICAL_OBJECTIVE, integer=integer, cells=model.cells,
                query_dtype=np.int64 if integer and workload.integral else np.float64,
                cell_labels=_cell_labels(plan, model) if problem is None else None,
                cliques=None if problem is None else problem.cliques, cell_columns=cell_columns),
            kept="chunks already estimated (kept)", rest="to go", log=log)
        if not resumed:
            remove_checkpoints(out_path)  # of a store deleted or replaced: never continued into this one

        job = EstimateJob(estimate_path=str(target), release_path=os.path.abspath(release.path),
                          release_checksum=release.checksum, units=units, chunk_units=chunk_units,
                          integer=integer, workload=workload, method=store_method, tables=stored_tables(root),
                          check_chunks=release_checksum is None, fsync=fsync, checkpoints=staging is None)
        print(f"distfit: estimate by {store_method}: working memory about {memory / 2**20:,.1f} MiB a task "
              f"(limit {limit / 2**30:.1f} GiB)", file=log)
        parts: dict[int, tuple] = {}  # each chunk's share of the fit attr, as the tasks report it

        def recorded(results: Iterable[tuple[int, int, tuple]]) -> Iterator[tuple[int, int]]:
            for chunk, count, part in results:
                parts[chunk] = part
                remove_checkpoints(target, chunk)  # its rows are written: its fit's checkpoint is done with
                yield chunk, count

        with ChunkedWrite(root, target, units=units, chunk_units=chunk_units, pending=pending, stage="estimate",
                          log=log, fsync=fsync, staging=staging, arrays=chunk_arrays(job.tables),
                          after_chunk=after_chunk) as write:
            if pending and placement.serial:
                write.consume(recorded(_run_serial(job, model, pending)))
            elif pending:
                write.consume(recorded(_run_dask(client.get(), job, model, pending)))
            client.close(wait=False)  # the workers are done: shut them down while sealing
            # chunks estimated in an earlier session (--resume): their parts read from the store
            parts.update(fit_parts(root, chunk_units, [c for c in range(n_chunks) if c not in parts]))
            fit = combine_fits(parts[c] for c in range(n_chunks))
            checksum = write.seal(lambda hasher, synced: seal(
                root, target, plan_path=plan_path, plan_checksum=plan.checksum, release_path=release_path,
                release_checksum=release.checksum, fsync=fsync, hasher=hasher, fit=fit, synced=synced),
                out_path, check_replaceable)
            fit = dict(root.attrs["fit"])
    return EstimateResult(
        path=str(out_path), units=units, queries=model.num_queries, cells=model.cells, chunks=n_chunks,
        chunks_done_now=len(pending), units_done_now=write.done_units, seconds=time.perf_counter() - started,
        checksum=checksum, plan_checksum=plan.checksum, release_checksum=release.checksum, method=store_method,
        integer=bool(integer), resumed=resumed, fit=fit)


def _run_serial(job: EstimateJob, model: MeasurementModel, pending: Iterable[int]) -> Iterator[tuple[int, int, tuple]]:
    rows = ReleaseRows(_open_release(job), model)
    pending = list(pending)
    with ChunkWriter(job.estimate_path) as writer:
        for chunk, read in zip(pending, rows.read_ahead([_span(job, chunk) for chunk in pending])):
            result = estimate_chunk_task(job, model, chunk, writer=writer, read=read)
            writer.flush()  # written before the chunk is reported (fsync, checksum, after_chunk)
            yield result


def _run_dask(client, job: EstimateJob, model: MeasurementModel,
              pending: list[int]) -> Iterator[tuple[int, int, tuple]]:
    """One impure task per run of chunks (:func:`distfit.release.tasks.task_chunks`: a task's
    fixed cost paid per ~32k units, not per chunk; unique keys, retries, run in submission
    order), each depending on one of the model tasks, in turn (module docstring)."""
    models = dask_runtime().held_on_every_worker(client, model, name="estimate-model")
    threads = max(1, sum(client.nthreads().values()))
    calls = ((str(chunks[0]), (job, models[i % len(models)], chunks))
             for i, chunks in enumerate(task_chunks(list(pending), job.chunk_units, threads)))
    for _label, done in dask_runtime().run_tasks(client, estimate_chunks_task, calls, "estimate-chunks"):
        yield from done


def manifest_entry(path: PathLike, checksum: str) -> dict[str, Any]:
    """The run manifest's ``estimate`` entry of the sealed estimate at ``path`` (path,
    checksum, method, integer, fit)."""
    attrs = read_estimate(path).attrs
    return {"path": os.path.abspath(path), "checksum": checksum, "method": attrs["method"],
            "integer": attrs["integer"], "fit": attrs["fit"]}


def estimate_in_run(plan_path: PathLike, release_path: PathLike, out: PathLike, *, integer: bool,
                    placement: Callable[[], Placement], log: TextIO, fsync: bool = True,
                    release_checksum: str | None = None) -> tuple[dict[str, Any], str]:
    """The estimate stage of ``distfit run`` (:func:`distfit.pipeline.run.run_pipeline`):
    ``(entry, status)``, ``entry`` the manifest's (:func:`manifest_entry`). An estimate at ``out`` of the same plan and release with the same
    options is reused when sealed (``"reused"``) and resumed when not (``"resumed"``); one of
    other inputs or options is replaced (``"done"``): an estimate is a function of the plan and
    the release, so recomputing it loses nothing (unlike a release's noise). ``placement()`` gives
    where it runs (the run's, on the cluster the run started), asked only when there is work to do.
    ``release_checksum``: the release's, when the run wrote it a stage before (:func:`run_estimate`'s:
    neither its root nor its chunks are hashed again, only its root checked to state it; Adult's
    one-unit estimate hashed the root twice, ~3.5 s of its ~20). None for a reused release: its
    root and each chunk as read are verified."""
    out_path = Path(os.fspath(out))
    attrs = root_attrs_on_disk(out_path) if out_path.is_dir() else None
    release = read_release(release_path)
    same = attrs is not None and (attrs.get("release_checksum"), attrs.get("plan_checksum"), attrs.get("integer"),
                                  attrs.get("method") in AUTO_METHODS) == (release.checksum,
                                                                          release.attrs.get("plan_checksum"),
                                                                          bool(integer), True)
    if same and attrs.get("complete") is True:
        reused = read_sealed_estimate(out_path)  # reused only while its root hashes as sealed (chunks: as read)
        print(f"distfit: the estimate at {out_path} is sealed and of this release; reused", file=log)
        return manifest_entry(out_path, reused.checksum), "reused"
    if attrs is not None and not same:
        print(f"distfit: the estimate at {out_path} is of other inputs or options; replacing it", file=log)
    result = run_estimate(plan_path, release_path, out_path, integer=integer, resume=same,
                          overwrite=attrs is not None and not same, placement=placement(), log=log, fsync=fsync,
                          release_checksum=release_checksum)
    return manifest_entry(out_path, result.checksum), "resumed" if result.resumed else "done"
