"""What a worker runs for ``distfit release``: the chunk tasks and the blocks task.

The driver (:mod:`distfit.release.job`) submits :func:`plan_blocks_task` once and
:func:`release_chunks_task` per run of chunks (:func:`task_chunks`); ``--serial`` runs
:func:`release_chunk_task` in the driver. Kept apart from the driver so that a worker imports
only what a task needs (the noise mathematics and the stores), not the driver's imports
(microdata tabulation, the spec parser, the audit): 0.45 s of CPU less per worker process at
start-up, when it unpickles its first task.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

import numpy as np

from distfit.mathematics.domain import Domain
from distfit.release.noise import load_blocks, prepare_blocks, release_chunk
from distfit.stores.data import open_data
from distfit.stores.plan import read_plan
from distfit.stores.release_chunks import ChunkWriter, write_chunk
from distfit.stores.sealing import ChangedChunk
from distfit.runtime.threads import blas_limit

__all__ = [
    "ChunkJob",
    "PlanView",
    "open_job_data",
    "TASK_UNITS",
    "TASKS_PER_THREAD",
    "plan_blocks_task",
    "release_chunk_task",
    "release_chunks_task",
    "task_chunks",
]


@dataclass(frozen=True, eq=False)
class PlanView:
    """What :func:`distfit.release.noise.release_chunk` reads of a plan (no zarr handle: picklable)."""

    attrs: dict
    block_ids: tuple[str, ...]
    queries_targets: np.ndarray


@dataclass(frozen=True, eq=False)
class ChunkJob:
    """Everything a chunk task needs but the blocks (small; one per session). ``entropy`` is
    kept out of ``repr`` so it never reaches a log or an error message."""

    release_path: str
    data_path: str
    plan: PlanView
    units: int
    chunk_units: int
    stored: tuple[str, ...]         # the blocks whose answers the store holds (stored_blocks)
    entropy: int = field(repr=False)
    packs: tuple[tuple[str, tuple[str, ...]], ...] = ()  # (pack id, its block ids in pack order): measurements
    # (only the pack ids are read: a pack's measurements come whole, distfit.release.packed)
    #: The data store's checksum as the driver verified it, when the tasks check each chunk they
    #: read against its digest (:func:`open_job_data`); None: data this process has just written.
    data_checksum: str | None = None


#: The data store as the last job's first task on this worker opened and checked it: ``[(path,
#: checksum), reader]`` (:func:`open_job_data`).
_DATA: list = []


def open_job_data(job: ChunkJob) -> Any:
    """The job's data store as its tasks read it (:func:`distfit.stores.data.open_data`): with
    ``job.data_checksum``, its root checked again (it must still state that checksum, and hash
    to it) and every chunk a task reads checked against its digest before it is used (a
    mismatch: :class:`distfit.stores.sealing.ChangedChunk` naming the store; the release fails, nothing sealed).
    The root is checked once per worker and data store (36 ms of CPU at 1M PL94 units, 60 tasks:
    2 CPU-s, 7 % of the release): each task gets a copy of that checked reader (its attrs and
    digests as checked, its own cache of the chunk it reads)."""
    if job.data_checksum is None:
        return open_data(job.data_path)
    key = (job.data_path, job.data_checksum)
    if not _DATA or _DATA[0] != key:
        _DATA[:] = [key, open_data(job.data_path, verify=True, checksum=job.data_checksum)]
    return dataclasses.replace(_DATA[1], _cache={})


def release_chunk_task(job: ChunkJob, blocks: Mapping[str, Any], chunk: int, *, data: Any = None,
                       writer: ChunkWriter | None = None) -> int:
    """Release chunk ``chunk`` through every block and write its whole chunks.

    Reads the chunk's unit ids and, block by block, its marginal counts from the data store
    (:func:`distfit.stores.data.open_data`, ``block_counts``; ``data``: the store already
    open), computes :func:`distfit.release.noise.release_chunk` with ``blocks``
    (``{block_id: PreparedBlock}``, :func:`distfit.release.noise.prepare_blocks`; counts
    validated as read: a ValueError naming the chunk and the bad row/cell, with nothing
    written) and writes the answers of the blocks that store them (``job.stored``),
    ``queries/answers``, the packs' measurements (``job.packs``) and ``unit_ids`` for its rows and, last, ``chunks/done[chunk] = 1``
    (:func:`distfit.stores.release_chunks.write_chunk`: written before this returns, or, through
    ``writer``, queued: written once the writer is flushed).
    Deterministic in its arguments, so a retry rewrites identical bytes. Returns the number of
    units written (never the answers).
    """
    start = chunk * job.chunk_units
    stop = min(start + job.chunk_units, job.units)
    data = data if data is not None else open_job_data(job)
    ids = data.ids(start, stop)
    schema = job.plan.attrs["schema"]
    domain = Domain.from_schema(schema)
    try:
        with blas_limit():
            released = release_chunk(job.plan, lambda attributes: data.block_counts(attributes, start, stop),
                                     job.entropy, chunk, domain, blocks=blocks)
    except ChangedChunk:
        raise  # the store refused (a chunk changed since it was sealed): its own line names it
    except ValueError as error:
        raise ValueError(
            f"{job.data_path}: chunk {chunk} (units {start}..{stop - 1}): {error}") from None
    measured = {pack_id: released.measurements[pack_id] for pack_id, _ids in job.packs}  # packs/<id>/measurements
    write_chunk(writer or job.release_path, chunk, start, {b: released.blocks[b] for b in job.stored},
                released.queries, ids, measured)
    return stop - start


def release_chunks_task(job: ChunkJob, blocks: Mapping[str, Any], chunks: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """One Dask task: :func:`release_chunk_task` for each of ``chunks`` in turn, with the data
    store and the release store opened once. Returns ``(chunk, units)`` per chunk. Each chunk
    is marked done as it is written, so an interrupted task leaves its finished chunks done;
    a retry redraws and rewrites the task's chunks with identical bytes."""
    data = open_job_data(job)
    with ChunkWriter(job.release_path) as writer:  # leaving it waits for the last chunk's writes
        return tuple((chunk, release_chunk_task(job, blocks, chunk, data=data, writer=writer)) for chunk in chunks)


#: Units per Dask task, at most (:func:`task_chunks`): a few release chunks per task, so that
#: the fixed cost of a task (the scheduler's bookkeeping, opening both stores, looking up the
#: arrays: a few ms) is paid per ~32k units rather than per chunk.
TASK_UNITS = 32768
#: Tasks per worker thread still to come, at least, while there are chunks enough (guided
#: sizes): the tasks shrink towards the end, so the workers finish together, and the seal's
#: checksum follows the chunks as they land.
TASKS_PER_THREAD = 4


def task_chunks(pending: list[int], chunk_units: int, threads: int) -> list[tuple[int, ...]]:
    """``pending`` chunks in order, cut into runs of chunks, one per task: each run takes
    ``1 / (TASKS_PER_THREAD * threads)`` of the chunks still to come, at most ``TASK_UNITS``
    units and at least one chunk (guided scheduling: large tasks first, single chunks last)."""
    cap = max(1, TASK_UNITS // max(1, chunk_units))
    share = max(1, TASKS_PER_THREAD * threads)
    tasks, i = [], 0
    while i < len(pending):
        size = max(1, min(cap, (len(pending) - i) // share))
        tasks.append(tuple(pending[i:i + size]))
        i += size
    return tasks


def plan_blocks_task(plan_path: str, plan_checksum: str) -> dict[str, Any]:
    """The plan's blocks, read and prepared on a worker (``{block_id: PreparedBlock}``, each
    ``Sigma`` factored once, under the BLAS thread rule of the chunk tasks; a packed block a
    ``PackedBlock`` sharing its pack, prepared once: :func:`distfit.release.noise.prepare_blocks`); refuses a plan whose
    stored checksum is not ``plan_checksum`` (the audited one: a comparison of the attr, no
    rehash)."""
    plan = read_plan(plan_path)
    if plan.checksum != plan_checksum:
        raise ValueError(f"{plan_path}: the plan changed during the release (checksum "
                         f"{plan.checksum}, {plan_checksum} at the start)")
    with blas_limit():
        return prepare_blocks(load_blocks(plan))
