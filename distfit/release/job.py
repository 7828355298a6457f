"""``distfit release``: a plan store and data in, a release store out (the I/O edge).

``distfit release PLAN.zarr --data DATA --out RELEASE.zarr [--resume] [--overwrite]
[--seed S] [--workers N] [--cluster ADDR|FILE] [--serial]`` (DESIGN.md sections 3-5). The
mathematics (noise streams, ``L (B x + z)``, query sums) is :mod:`distfit.release.noise`; this module
checks the inputs, lays out the store, runs one task per chunk of units and seals the result.

Data (``--data``): a data store (:func:`distfit.stores.data.open_data`: unit histograms from ``distfit
synth``, or marginals from ``distfit tabulate``), or person-level microdata (``.csv``,
``.csv.gz``, ``.parquet``, ``.pq`` or a directory of Parquet files;
:func:`distfit.data.microdata.microdata_format`). Microdata is first tabulated for the plan's spec
(``parse_spec(plan.attrs["spec"])``) into a marginals store next to the release,
``<RELEASE>.data.zarr``, holding a clique for every block of the plan
(:func:`distfit.data.microdata.ensure_tabulated`; it holds the confidential counts: keep it like
the microdata), then released from it like any store. That store is reused when it was
tabulated from the same source (path, size, mtime) for the same spec; otherwise it is
tabulated again, except under ``--resume``, which needs the data the release started from.
Every block must be answerable from the data (``check_blocks``: a marginals store must hold a
clique containing each block's attributes) and unit ids must be distinct
(``check_unit_ids``, once up front); both are refused before anything is written.

Release store (**contract**, DESIGN.md section 4), a Zarr v3 group::

    release.zarr/        attrs: distfit_format="release", format_version=1, plan_checksum,
                                plan_path, schema ({"attributes", "sizes"} of the plan), private
                                (False with --seed), created, distfit_version, units,
                                chunk_units, n_chunks, data ({"path", "created"} of the data
                                store: for --resume only), complete (False until sealed), and
                                at seal: checksum, sealed (time)
      blocks/<block_id>/answers  (units, m_b) float64   the block's noisy L (B x + z)
                                 attrs: attributes, block_index (its noise-stream position)
      queries/answers            (units, m)   float64   each query's answer (sum of its rows)
      queries/variances          (m,)         float64   copied from the plan
                                 group attrs: labels (list of m strings ``GROUP:LABEL``, or
                                 None when the plan's spec cannot be parsed into m labels)
      unit_ids                   (units,)     the data's unit ids (numeric, or variable-length
                                              UTF-8 strings: the Zarr v3 ``string`` data type)
      chunks/done                (n_chunks,)  uint8, one zarr chunk per release chunk: 1 once
                                              every array of that chunk is written

Answer arrays are chunked over units only, ``(r, m_b)`` with ``r`` the largest divisor of
``chunk_units`` (the data's chunk size) that keeps a chunk under 16 MiB (``store._chunk_shape``),
so each release chunk (one task) owns whole zarr chunks and no two tasks touch the same file.
Answer arrays are stored uncompressed (``ANSWER_COMPRESSORS``: noisy float64 does not compress).
Query labels are a JSON attr, not an array: fixed-width UTF-32 has no Zarr v3 specification.
The checksum is :func:`distfit.stores.plan.compute_checksum` over every array of the store (the same
format as the plan's), written when the release is sealed.

Never stored: the counts, true marginals or true answers, the entropy, the ``--seed`` (a seeded
release records only ``private=False``; resuming it needs the same ``--seed`` again), and no
attr derived from the data beyond ``units`` (e.g. no population total).

Randomness: fresh OS entropy per session (:func:`distfit.release.noise.fresh_entropy`), kept in memory
only and shipped with the tasks; block ``b`` (sorted-id position) of chunk ``c`` draws from
``noise_stream(entropy, b, c)``, so a retried task redraws identical noise.

Lifecycle. A new release is built *at the final path* with ``complete=False``: every reader
(:func:`read_release`) refuses it; only ``--resume`` opens it. Each task writes its chunk's block
answers, query answers and unit ids, then its ``chunks/done`` entry. Sealing (driver, after all
chunks) re-verifies the plan's checksum against the one recorded at the start, recomputes the
store checksum, and sets ``complete=True``. An error (bad counts in a chunk, a plan changed
mid-run, an interruption) leaves the store incomplete and unsealed.

Where the time goes (``benchmarks/bench_release.py``, ``benchmarks/README.md``): the Dask client
is started on a thread as the release starts (:class:`distfit.cluster.BackgroundClient`: a local
cluster's worker processes spawn and import while the driver audits the plan and checks the data;
a ``--resume`` starts it only if chunks are missing) and shut down while the driver seals; with
``fsync`` the files of each finished chunk are fsynced on a driver thread while later chunks run,
so the seal's fsync of the whole store finds them clean; the seal's checksum reads the store one
zarr chunk ahead of the hash (:func:`_store_checksum`, the digest of
:func:`distfit.stores.plan.compute_checksum`). The driver's linear algebra (the audit) and each chunk
task run under the BLAS thread rule (:func:`distfit.threads.blas_threads`,
``DISTFIT_BLAS_THREADS``); a local cluster's workers start without Dask's malloc trim setting
(``WORKER_ENV``). An unreachable ``--cluster`` is refused before anything is written.

* ``--resume`` on an incomplete release: the recorded plan checksum must equal the plan's
  current one, the data's schema, units, chunking and ``created`` must match, and ``--seed``
  must be given iff the release was seeded. Chunks marked done are never drawn or written again;
  the missing ones are drawn with *fresh* entropy (the first session's entropy is gone by
  design; those chunks were never released, so fresh independent noise is correct - a chunk
  whose arrays were half written before the interruption is overwritten whole). With the same
  ``--seed`` a resumed release equals an uninterrupted one bit for bit. ``--resume`` with
  nothing at ``--out`` starts a new release; on a sealed release it is refused.
* A sealed release at ``--out`` is refused unless ``--overwrite``; an incomplete one is refused
  unless ``--resume`` or ``--overwrite``. With ``--overwrite`` the new release is built in a
  staging directory (``<out>.incomplete-<random>``) and moved into place
  (:func:`distfit.stores.plan.move_into_place`) only once sealed; if that run fails the staging
  directory is deleted and the old store is left as it was (an overwrite is not resumable).
  ``--resume`` and ``--overwrite`` exclude each other.

Refused before anything is written (``ValueError`` / ``FileExistsError``, exit 2 on the command
line): a plan that fails :func:`distfit.audit.audit_plan` (the failures are named), data whose
schema differs from the plan's, a non-release path at ``--out``. Counts are validated per chunk
inside the task (:func:`distfit.release.noise.validate_counts`: ValueError naming the chunk, row, cell).
"""
from __future__ import annotations

import contextlib
import hashlib
import math
import os
import shutil
import secrets
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping, TextIO

import numpy as np
import zarr

from distfit.release.noise import block_positions, fresh_entropy, load_blocks, release_chunk
from distfit.cluster import WORKER_ENV, BackgroundClient, Progress, run_tasks
from distfit.threads import blas_limit
from distfit.stores.files import (
    STAGING_MARKER,
    check_format,
    chunk_shape,
    fsync_file,
    fsync_tree,
    is_staging,
    jsonable,
    leftovers,
    move_into_place,
    root_attrs_on_disk,
    utc_now,
)
from distfit.stores.plan import (
    _CHECKSUM_DOMAIN,
    CHECKSUM_PREFIX,
    _hash_strings,
    compute_checksum,
    read_plan,
    verify_checksum,
)
from distfit.domain import Domain

FORMAT = "release"
FORMAT_VERSION = 1

PathLike = str | os.PathLike

__all__ = [
    "FORMAT_VERSION",
    "Release",
    "ReleaseError",
    "ReleaseResult",
    "read_release",
    "release_chunk_task",
    "run_release",
    "tabulated_data_path",
    "verify_release",
]


class ReleaseError(ValueError):
    """A path that is not a readable, complete (sealed) release store; the message says why."""


@dataclass(frozen=True)
class ReleaseResult:
    """What :func:`run_release` did. ``chunks_drawn`` chunks got noise in this session (all of
    them for a new release, the missing ones on ``--resume``)."""

    path: str
    units: int
    queries: int
    blocks: int
    chunks: int
    chunks_drawn: int
    units_drawn: int
    seconds: float
    checksum: str
    plan_checksum: str
    private: bool
    resumed: bool
    data: str = ""                  # the data store released (the tabulated one for microdata)
    tabulated: str | None = None    # microdata: "tabulated" or "reused"; None for a data store


# --------------------------------------------------------------------------------------------
# the task


@dataclass(frozen=True, eq=False)
class _PlanView:
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
    plan: _PlanView
    units: int
    chunk_units: int
    entropy: int = field(repr=False)


def release_chunk_task(job: ChunkJob, blocks: Mapping[str, Any], chunk: int) -> int:
    """One task: release chunk ``chunk`` through every block and write its whole chunks.

    Reads the chunk's unit ids and, block by block, its marginal counts from the data store
    (:func:`distfit.stores.data.open_data`, ``block_counts``), computes
    :func:`distfit.release.noise.release_chunk` (counts validated as read: a ValueError naming the
    chunk and the bad row/cell, with nothing written), writes ``blocks/*/answers``,
    ``queries/answers`` and ``unit_ids`` for its rows and, last, ``chunks/done[chunk] = 1``.
    Deterministic in its arguments, so a retry rewrites identical bytes. Returns the number of
    units written (never the answers).
    """
    from distfit.stores.data import open_data

    start = chunk * job.chunk_units
    stop = min(start + job.chunk_units, job.units)
    data = open_data(job.data_path)
    ids = np.asarray(data.unit_ids[start:stop])
    schema = job.plan.attrs["schema"]
    domain = Domain.from_schema(schema)
    try:
        with blas_limit():
            released = release_chunk(job.plan, lambda attributes: data.block_counts(attributes, start, stop),
                                     job.entropy, chunk, domain, blocks=blocks)
    except ValueError as error:
        raise ValueError(
            f"{job.data_path}: chunk {chunk} (units {start}..{stop - 1}): {error}") from None
    root = zarr.open_group(store=job.release_path, mode="r+", zarr_format=3)
    for block_id, answers in released.blocks.items():
        root[f"blocks/{block_id}/answers"][start:stop] = answers
    root["queries/answers"][start:stop] = released.queries
    root["unit_ids"][start:stop] = ids
    root["chunks/done"][chunk] = 1
    return stop - start


def _run_serial(job: ChunkJob, blocks, pending: Iterable[int]) -> Iterator[tuple[int, int]]:
    for chunk in pending:
        yield chunk, release_chunk_task(job, blocks, chunk)


def plan_blocks_task(plan_path: str, plan_checksum: str) -> dict[str, Any]:
    """The plan's blocks, read on a worker; refuses a plan whose checksum changed."""
    plan = read_plan(plan_path)
    if plan.checksum != plan_checksum:
        raise ValueError(f"{plan_path}: the plan changed during the release (checksum "
                         f"{plan.checksum}, {plan_checksum} at the start)")
    return load_blocks(plan)


def _run_dask(client, job: ChunkJob, plan_path: str, plan_checksum: str,
              pending: Iterable[int]) -> Iterator[tuple[int, int]]:
    """One impure task per chunk (unique keys, retries). The blocks are one task's result that
    every chunk task depends on, read from the plan store by a worker, not scattered: scattered
    data cannot be recomputed, so losing the worker that held it would fail the release,
    while a task result is recomputed on another worker (and re-checked against the plan's
    checksum)."""
    from distfit.cluster import TASK_RETRIES

    blocks_future = client.submit(plan_blocks_task, os.path.abspath(plan_path), plan_checksum,
                                  key=f"release-blocks-{secrets.token_hex(6)}", pure=False,
                                  retries=TASK_RETRIES)
    calls = ((str(chunk), (job, blocks_future, chunk)) for chunk in pending)
    for label, units in run_tasks(client, release_chunk_task, calls, "release-chunk"):
        yield int(label), units


# --------------------------------------------------------------------------------------------
# the store




#: Compressors of the answer arrays: none (raw little-endian float64). Noisy answers do not
#: compress: zarr's default zstd saved 3 % of the bytes of a PL94 release, for ~0.08 s of encoding
#: per 4096 x 319 chunk in the tasks (about 135 MB/s here) and ~0.02-0.04 s of decoding it again in
#: the seal's checksum read. The checksum is over the decoded values, so it does not depend on this
#: choice, and readers decode whatever codecs a store records (older zstd stores read as before).
ANSWER_COMPRESSORS: Any = None


def _answer_chunks(chunk_units: int, width: int) -> tuple[int, int]:
    """Chunks of a (units, width) float64 answer array: rows dividing ``chunk_units``."""
    rows, cols = chunk_shape((chunk_units, width), 8)
    rows = next(r for r in range(min(rows, chunk_units), 0, -1) if chunk_units % r == 0)
    return rows, cols


def _query_labels(plan) -> list[str] | None:
    """The workload query labels from the plan's stored spec, or None if they cannot be had."""
    from distfit.spec.parse import parse_spec

    try:
        labels = list(parse_spec(plan.attrs["spec"]).query_labels)
    except Exception:  # noqa: BLE001 - labels are a convenience; a spec we cannot parse has none
        return None
    return labels if len(labels) == len(plan.queries_targets) else None


def _create_store(path: Path, *, plan, plan_path: str, data, blocks, private: bool) -> None:
    """Lay out an empty, incomplete release store at ``path`` (driver only)."""
    from distfit import __version__

    units, chunk_units = data.units, data.chunk_units
    n_chunks = -(-units // chunk_units)
    m = len(plan.queries_targets)
    positions = block_positions(plan)
    config = {"write_empty_chunks": True}
    root = zarr.open_group(store=str(path), mode="w-", zarr_format=3)
    root.attrs.update({"distfit_format": FORMAT, "format_version": FORMAT_VERSION, "complete": False})
    block_group = root.create_group("blocks")
    for block_id, block in blocks.items():
        m_b = block.recon.shape[0]
        g = block_group.create_group(block_id)
        g.create_array("answers", shape=(units, m_b), dtype=np.float64,
                       chunks=_answer_chunks(chunk_units, m_b), compressors=ANSWER_COMPRESSORS, config=config)
        g.attrs.update(jsonable({"attributes": list(block.attributes),
                                  "block_index": positions[block_id]}))
    queries = root.create_group("queries")
    queries.create_array("answers", shape=(units, m), dtype=np.float64,
                         chunks=_answer_chunks(chunk_units, m), compressors=ANSWER_COMPRESSORS, config=config)
    variances = queries.create_array("variances", shape=(m,), dtype=np.float64,
                                     chunks=chunk_shape((m,), 8), config=config)
    if m:
        variances[...] = np.asarray(plan.queries_variances, dtype=np.float64)
    queries.attrs["labels"] = _query_labels(plan)
    ids_dtype = np.dtype(data.unit_ids.dtype)
    if ids_dtype.kind in "TUO":
        ids_dtype = str  # variable-length UTF-8 (the Zarr v3 "string" data type)
    elif ids_dtype.kind not in "iuf":
        raise ValueError(f"{data.path}: unit_ids of dtype {ids_dtype} are not supported (numbers or strings)")
    root.create_array("unit_ids", shape=(units,), dtype=ids_dtype, chunks=(chunk_units,), config=config)
    root.create_group("chunks").create_array(
        "done", shape=(n_chunks,), dtype=np.uint8, chunks=(1,), fill_value=0, config=config)
    root.attrs.update(jsonable({
        "distfit_format": FORMAT,
        "format_version": FORMAT_VERSION,
        "plan_checksum": plan.checksum,
        "plan_path": os.path.abspath(plan_path),
        "schema": {"attributes": list(plan.attrs["schema"]["attributes"]),
                   "sizes": list(plan.attrs["schema"]["sizes"])},
        "private": bool(private),
        "created": utc_now(),
        "distfit_version": __version__,
        "units": units,
        "chunk_units": chunk_units,
        "n_chunks": n_chunks,
        "data": {"path": os.path.abspath(data.path), "created": data.attrs.get("created")},
        "complete": False,
    }))


def _is_release_store(path: Path) -> bool:
    attrs = root_attrs_on_disk(path)
    return attrs is not None and attrs.get("distfit_format") == FORMAT


def _target_state(path: Path) -> str:
    """``"absent"``, ``"sealed"`` or ``"incomplete"``; FileExistsError for anything else."""
    if not (path.exists() or path.is_symlink()):
        return "absent"
    if not path.is_dir() or not _is_release_store(path):
        raise FileExistsError(
            f"{path}: already exists and is not a distfit release store; refusing to replace it")
    return "sealed" if root_attrs_on_disk(path).get("complete") is True else "incomplete"


def _check_replaceable(path: Path) -> None:
    if path.exists() and not (path.is_dir() and _is_release_store(path)):
        raise FileExistsError(f"{path}: is not a distfit release store; refusing to replace it")


def _check_resumable(path: Path, *, plan, data, private: bool, blocks) -> zarr.Group:
    """Open an incomplete release for ``--resume`` after checking it belongs to these inputs."""
    root = zarr.open_group(store=str(path), mode="r+", zarr_format=3)
    attrs = dict(root.attrs)
    if attrs.get("format_version") != FORMAT_VERSION:
        raise ValueError(f"{path}: format_version {attrs.get('format_version')!r} cannot be resumed by this distfit")
    if attrs.get("plan_checksum") != plan.checksum:
        raise ValueError(
            f"{path}: was started from a plan with checksum {attrs.get('plan_checksum')}, but "
            f"{plan.path} has {plan.checksum}; resume with the same plan or use --overwrite")
    if attrs.get("private") is not private:
        raise ValueError(
            f"{path}: was started {'without' if attrs.get('private') else 'with'} --seed; resume it the same way "
            "(or use --overwrite)")
    recorded = attrs.get("data") or {}
    schema = attrs.get("schema") or {}
    mismatch = []
    if (list(schema.get("attributes", [])), list(schema.get("sizes", []))) != (
            list(data.domain.names), list(data.domain.sizes)):
        mismatch.append("schema")
    if attrs.get("units") != data.units:
        mismatch.append(f"units ({attrs.get('units')} recorded, {data.units} now)")
    if attrs.get("chunk_units") != data.chunk_units:
        mismatch.append(f"chunk_units ({attrs.get('chunk_units')} recorded, {data.chunk_units} now)")
    if recorded.get("created") != data.attrs.get("created"):
        mismatch.append("created")
    if mismatch:
        raise ValueError(
            f"{path}: the data at {data.path} is not the data this release started from "
            f"({', '.join(mismatch)} differ); use --overwrite to start over")
    try:
        stored_blocks = set(root["blocks"].group_keys())
        root["queries/answers"], root["unit_ids"], root["chunks/done"]
    except KeyError as error:
        raise ValueError(f"{path}: damaged incomplete release (missing {error}); use --overwrite") from None
    if stored_blocks != set(blocks):
        raise ValueError(f"{path}: its blocks do not match the plan's; use --overwrite")
    return root


class _ChunkSync:
    """fsync each finished chunk's files on a driver thread while later chunks are computed.

    Without it the seal's fsync (``fsync_tree``) waits for every written byte to reach the
    disk at the very end (about a second per 500 MB here); with it the writeback overlaps the
    chunk tasks and the seal finds the files clean. An optimisation only: errors are ignored
    here (a file not there yet, a path this code cannot guess), because the seal still fsyncs
    every file and directory of the store and raises on failure."""

    def __init__(self, root: zarr.Group, path: Path, units: int, chunk_units: int) -> None:
        self._path = path
        self._units, self._chunk_units = units, chunk_units
        self._arrays = []
        for name in [f"blocks/{b}/answers" for b in root["blocks"].group_keys()] + [
                "queries/answers", "unit_ids", "chunks/done"]:
            arr = root[name]
            self._arrays.append((name, arr.metadata, tuple(int(c) for c in arr.chunks), tuple(arr.shape)))
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="distfit-fsync")

    def _files(self, chunk: int) -> Iterator[Path]:
        start = chunk * self._chunk_units
        stop = min(start + self._chunk_units, self._units)
        for name, metadata, chunks, shape in self._arrays:
            if name == "chunks/done":
                rows = range(chunk, chunk + 1)
            else:
                rows = range(start // chunks[0], -(-stop // chunks[0]))
            cols = range(-(-shape[1] // chunks[1])) if len(shape) == 2 else [None]
            for i in rows:
                for j in cols:
                    key = metadata.encode_chunk_key((i,) if j is None else (i, j))
                    yield self._path / name / key

    def _sync(self, chunk: int) -> None:
        for file in self._files(chunk):
            with contextlib.suppress(OSError):
                fsync_file(str(file))

    def __call__(self, chunk: int) -> None:
        self._pool.submit(self._sync, chunk)

    def close(self, cancel: bool = False) -> None:
        """Wait for the queued fsyncs (call before the seal's own fsync); ``cancel``: drop the
        ones not started (the release failed)."""
        self._pool.shutdown(wait=True, cancel_futures=cancel)


_SLAB_BYTES = 8 * 2**20  # _store_checksum reads whole zarr chunks of rows, at least this much at a time


def _store_checksum(group: zarr.Group) -> str:
    """:func:`distfit.stores.plan.compute_checksum` of ``group``, the same digest (the format is the
    store's contract, see :mod:`distfit.stores.plan`), read faster for the seal: a release's answer
    arrays one zarr chunk of rows at a time (small chunks, e.g. ``chunks/done``, ``_SLAB_BYTES``
    at a time), the next slab read on a thread while this one is hashed, hashed from the array's
    own buffer (no ``tobytes`` copy). ``compute_checksum`` reads 64 MiB slabs into new arrays and
    copies each before hashing: 1.0-1.1 s against 0.5-0.6 s for a 100k-unit PL94 release here."""
    arrays = sorted(((name, obj) for name, obj in group.members(max_depth=None) if isinstance(obj, zarr.Array)),
                    key=lambda item: item[0])
    h = hashlib.sha256(_CHECKSUM_DOMAIN)
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="distfit-checksum") as pool:
        for name, arr in arrays:
            if np.dtype(arr.dtype).kind in "TUO":
                _hash_strings(h, name, arr)
                continue
            dtype = np.dtype(arr.dtype).newbyteorder("<")
            shape = tuple(int(n) for n in arr.shape)
            nbytes = math.prod(shape) * dtype.itemsize
            h.update(f"{name}\n{dtype.str}\n{','.join(map(str, shape))}\n{nbytes}\n".encode("utf-8"))
            if nbytes == 0:
                continue
            if not shape:
                h.update(np.ascontiguousarray(arr[...], dtype=dtype).tobytes())
                continue
            rows = max(1, int(arr.chunks[0]))  # whole zarr chunks, at least _SLAB_BYTES a read
            step = rows * max(1, _SLAB_BYTES // max(1, (nbytes // shape[0]) * rows))

            def read(start: int, arr=arr, dtype=dtype, step=step) -> np.ndarray:
                return np.ascontiguousarray(arr[start:start + step], dtype=dtype)

            ahead = pool.submit(read, 0)
            for start in range(0, shape[0], step):
                part = ahead.result()
                if start + step < shape[0]:
                    ahead = pool.submit(read, start + step)
                h.update(memoryview(part).cast("B"))
    return CHECKSUM_PREFIX + h.hexdigest()


def _seal(root: zarr.Group, path: Path, *, plan_path: str, plan_checksum: str, fsync: bool) -> str:
    """Verify the plan is unchanged and every chunk done, then checksum and mark complete."""
    ok, stored, recomputed = verify_checksum(plan_path)
    if not ok or stored != plan_checksum:
        raise ValueError(
            f"{plan_path}: the plan changed during the release (checksum {recomputed}, started "
            f"from {plan_checksum}); the release at {path} is left incomplete")
    done = np.asarray(root["chunks/done"][...])
    if not done.all():
        missing = np.flatnonzero(done == 0)
        raise RuntimeError(f"{path}: chunks {missing[:5].tolist()} not written; cannot seal")
    checksum = _store_checksum(root)
    if fsync:
        fsync_tree(path)
    root.attrs.update({"checksum": checksum, "sealed": utc_now(), "complete": True})
    if fsync:
        fsync_tree(path)
    return checksum


# --------------------------------------------------------------------------------------------
# the driver


def run_release(
    plan_path: PathLike,
    data_path: PathLike,
    out: PathLike,
    *,
    resume: bool = False,
    overwrite: bool = False,
    seed: int | None = None,
    cluster: str | None = None,
    workers: int | None = None,
    serial: bool = False,
    log: TextIO | None = None,
    fsync: bool = True,
    after_chunk: Callable[[int], None] | None = None,
) -> ReleaseResult:
    """Release ``data_path`` through the plan at ``plan_path`` into ``out`` (module docstring).

    ``seed`` (tests only) replaces the fresh entropy and marks the release not private.
    ``after_chunk(chunk)`` is called in the driver after each chunk is written (a test hook,
    e.g. to simulate an interruption). Errors: ValueError (bad input: audit failures, schema
    mismatch, bad counts, a resume that does not match), FileExistsError (something at ``out``
    that may not be replaced), runtime.ClusterError.
    """
    from distfit.audit import audit_plan
    from distfit.stores.data import open_data
    from distfit.data.microdata import microdata_format

    started = time.perf_counter()
    log = log or sys.stderr
    plan_path, data_path = os.fspath(plan_path), os.fspath(data_path)
    out_path = Path(os.fspath(out))
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ValueError(f"--seed must be an integer >= 0, got {seed!r}")
    if is_staging(out_path):
        raise ValueError(f"{out_path}: a release path may not contain {STAGING_MARKER!r}")
    private = seed is None

    state = _target_state(out_path)
    if state == "sealed" and not overwrite:
        raise FileExistsError(
            f"{out_path}: already holds a sealed release; pass --overwrite to replace it")
    if state == "incomplete" and not (resume or overwrite):
        raise FileExistsError(
            f"{out_path}: holds an incomplete release; pass --resume to finish it or --overwrite to start over")
    if state == "absent" and leftovers(out_path):
        print(f"distfit: note: leftovers of an earlier write next to {out_path}: "
              f"{', '.join(p.name for p in leftovers(out_path))}", file=log)

    resumed = resume and state == "incomplete"
    with contextlib.ExitStack() as stack:
        # The driver's linear algebra (the audit) under the BLAS thread rule, as on the command line.
        stack.enter_context(blas_limit())
        clients: list[BackgroundClient] = []

        def start_cluster() -> None:
            if not serial and not clients:
                clients.append(stack.enter_context(BackgroundClient(cluster, workers, log=log, worker_env=WORKER_ENV)))

        def client():
            """The Dask client (None with ``serial``), waiting for it to start if need be."""
            if serial:
                return None
            start_cluster()
            return clients[0].get()

        if not resumed:
            # Start the cluster now: its worker processes spawn and import while the driver audits
            # the plan and checks the data. (A resume starts it only if chunks are missing.)
            start_cluster()
        report = audit_plan(plan_path)
        if not report.ok:
            more = len(report.failures) - 3
            raise ValueError(f"{plan_path}: the plan fails audit ({len(report.failures)} failures): "
                             + "; ".join(report.failures[:3])
                             + (f"; and {more} more (see distfit audit)" if more > 0 else ""))
        plan = read_plan(plan_path)
        plan_checksum = plan.checksum
        blocks = load_blocks(plan)

        tabulated = None
        if microdata_format(data_path) is not None:
            data_path, tabulated = _tabulate_for_release(
                plan, data_path, out_path, blocks, client=client, replace=not resumed, log=log, fsync=fsync)
        data = open_data(data_path)
        plan_schema = (list(plan.attrs["schema"]["attributes"]), list(plan.attrs["schema"]["sizes"]))
        data_schema = (list(data.domain.names), list(data.domain.sizes))
        if data_schema != plan_schema:
            raise ValueError(
                f"{data_path}: the data's schema {data_schema[0]} sizes {data_schema[1]} differs from the "
                f"plan's {plan_schema[0]} sizes {plan_schema[1]}")
        data.check_blocks([block.attributes for block in blocks.values()])
        data.check_unit_ids()
        n_chunks = -(-data.units // data.chunk_units)

        staging: Path | None = None
        if resumed:
            root = _check_resumable(out_path, plan=plan, data=data, private=private, blocks=blocks)
            target = out_path
            pending = np.flatnonzero(np.asarray(root["chunks/done"][...]) == 0).tolist()
            print(f"distfit: resuming {out_path}: {n_chunks - len(pending)} of {n_chunks} chunks already "
                  f"written (kept as they are), {len(pending)} to draw with fresh entropy", file=log)
        else:
            if resume:
                print(f"distfit: nothing to resume at {out_path}; starting a new release", file=log)
            client()  # an unreachable cluster is refused before anything is written
            if state == "absent":
                target = out_path
                target.parent.mkdir(parents=True, exist_ok=True)
            else:  # --overwrite: build aside, move into place once sealed
                target = staging = out_path.with_name(f"{out_path.name}{STAGING_MARKER}{secrets.token_hex(6)}")
            try:
                _create_store(target, plan=plan, plan_path=plan_path, data=data, blocks=blocks, private=private)
            except BaseException:
                shutil.rmtree(target, ignore_errors=True)
                raise
            root = zarr.open_group(store=str(target), mode="r+", zarr_format=3)
            pending = list(range(n_chunks))

        drawn = total = 0
        syncer: _ChunkSync | None = None
        try:
            job = ChunkJob(
                release_path=str(target), data_path=os.path.abspath(data_path),
                plan=_PlanView(attrs={"schema": dict(plan.attrs["schema"])}, block_ids=tuple(sorted(blocks)),
                               queries_targets=np.asarray(plan.queries_targets)),
                units=data.units, chunk_units=data.chunk_units,
                entropy=int(seed) if seed is not None else fresh_entropy(),
            )
            total = sum(min(data.chunk_units, data.units - c * data.chunk_units) for c in pending)
            progress = Progress("release", log, unit="units")
            drawn = 0
            if fsync and pending:
                syncer = _ChunkSync(root, target, data.units, data.chunk_units)

            def consume(results: Iterator[tuple[int, int]]) -> None:
                nonlocal drawn
                for chunk, units in results:
                    drawn += units
                    if syncer is not None:
                        syncer(chunk)
                    progress(drawn, total)
                    if after_chunk is not None:
                        after_chunk(chunk)

            if not pending:
                pass
            elif serial:
                consume(_run_serial(job, blocks, pending))
            else:
                consume(_run_dask(client(), job, plan_path, plan_checksum, pending))
            del job
            if clients:
                clients[0].close(wait=False)  # the workers are done: shut them down while sealing
            if syncer is not None:
                syncer.close()
            checksum = _seal(root, target, plan_path=plan_path, plan_checksum=plan_checksum, fsync=fsync)
            if staging is not None:
                move_into_place(staging, out_path, _check_replaceable, fsync=fsync)
        except BaseException:
            if 0 < drawn < total:
                print(file=log)  # end the progress line before the error
            if syncer is not None:
                syncer.close(cancel=True)
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)
            raise
    return ReleaseResult(
        path=str(out_path), units=data.units, queries=len(plan.queries_targets), blocks=len(blocks),
        chunks=n_chunks, chunks_drawn=len(pending), units_drawn=drawn,
        seconds=time.perf_counter() - started, checksum=checksum, plan_checksum=plan_checksum,
        private=private, resumed=resumed, data=str(data_path), tabulated=tabulated,
    )


def tabulated_data_path(out: PathLike) -> Path:
    """Where ``distfit release --data MICRODATA --out RELEASE`` tabulates: ``<RELEASE>.data.zarr``."""
    out = Path(os.fspath(out))
    return out.with_name(f"{out.name}.data.zarr")


def _tabulate_for_release(plan, source: str, out_path: Path, blocks, *, client: Callable[[], Any],
                          replace: bool, log: TextIO, fsync: bool) -> tuple[str, str]:
    """Tabulate microdata for ``plan`` next to the release (module docstring)."""
    from distfit.data.microdata import ensure_tabulated
    from distfit.spec.parse import parse_spec

    try:
        spec = parse_spec(plan.attrs["spec"])
    except (KeyError, ValueError) as error:
        raise ValueError(f"{plan.path}: cannot read the plan's spec to tabulate {source} ({error})") from None
    path, status = ensure_tabulated(
        spec, source, tabulated_data_path(out_path), cover=[block.attributes for block in blocks.values()],
        client=client(), replace=replace, fsync=fsync, log=log)
    if status == "tabulated":
        print(f"distfit: tabulated {source} into {path}", file=log)
    return str(path), status


# --------------------------------------------------------------------------------------------
# reading


@dataclass(frozen=True, eq=False)
class Release:
    """A sealed release store opened for reading; arrays are lazy zarr arrays."""

    path: str
    attrs: dict
    _group: Any = field(repr=False)

    @property
    def checksum(self) -> str:
        return self.attrs["checksum"]

    @property
    def private(self) -> bool:
        return bool(self.attrs["private"])

    @property
    def answers(self):
        """``queries/answers`` (units x m)."""
        return self._group["queries/answers"]

    @property
    def variances(self) -> np.ndarray:
        return np.asarray(self._group["queries/variances"][...])

    @property
    def labels(self) -> list[str] | None:
        return self._group["queries"].attrs.get("labels")

    @property
    def unit_ids(self):
        return self._group["unit_ids"]

    @property
    def block_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._group["blocks"].group_keys()))

    def block_answers(self, block_id: str):
        """``blocks/<block_id>/answers`` (units x m_b)."""
        return self._group[f"blocks/{block_id}/answers"]


def _open_release(path: PathLike) -> tuple[Path, zarr.Group, dict]:
    p = Path(os.fspath(path))
    if is_staging(p):
        raise ReleaseError(f"{p}: is the staging directory of an unfinished write, not a release")
    if not p.exists():
        raise ReleaseError(f"{p}: no such release store")
    attrs = root_attrs_on_disk(p) if p.is_dir() else None
    if attrs is None:
        raise ReleaseError(f"{p}: not a Zarr v3 group (no readable zarr.json)")
    check_format(p, attrs, FORMAT, FORMAT_VERSION, ReleaseError)
    if attrs.get("complete") is not True:
        raise ReleaseError(
            f"{p}: the release is incomplete (interrupted or still running); finish it with "
            "distfit release --resume")
    if not isinstance(attrs.get("checksum"), str):
        raise ReleaseError(f"{p}: the release has no checksum")
    group = zarr.open_group(store=str(p), mode="r", zarr_format=3)
    return p, group, dict(group.attrs)


def read_release(path: PathLike) -> Release:
    """Open a sealed release store, or raise :class:`ReleaseError` saying why it is refused
    (missing, staging directory, not a release, newer format, incomplete, no checksum)."""
    p, group, attrs = _open_release(path)
    return Release(path=str(p), attrs=attrs, _group=group)


def verify_release(path: PathLike) -> tuple[bool, str, str]:
    """``(ok, stored, recomputed)`` checksum of a sealed release store."""
    _p, group, attrs = _open_release(path)
    recomputed = compute_checksum(group)
    return attrs["checksum"] == recomputed, attrs["checksum"], recomputed
