"""``distfit release``: a plan store and data in, a release store out (the I/O edge).

``distfit release PLAN.zarr --data DATA --out RELEASE.zarr [--resume] [--overwrite]
[--seed S] [--workers N] [--cluster ADDR|FILE] [--serial]`` (docs/design.md sections 3-5). The
mathematics (noise streams, ``L (B x + z)``, query sums) is :mod:`distfit.release.noise`; the
release store (its layout, **contract**, docs/design.md section 4; writing, sealing, reading) is
:mod:`distfit.stores.release`; this module checks the inputs, runs one task per chunk of units
(serially or on Dask through :mod:`distfit.runtime.cluster`) and seals the result.

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
(``check_unit_ids``, once up front); both are refused before anything is written. A data store
with geography (``parent_ids``: a level of a multi-level run) has it copied into the release.

Never stored: the counts, true marginals or true answers, the entropy, the ``--seed`` (a seeded
release records only ``private=False``; resuming it needs the same ``--seed`` again), and no
attr derived from the data beyond ``units`` (e.g. no population total).

Randomness: fresh OS entropy per session (:func:`distfit.release.noise.fresh_entropy`), kept in memory
only and shipped with the tasks; block ``b`` (sorted-id position) of chunk ``c`` draws from
``noise_stream(entropy, b, c)``, so a retried task redraws identical noise.

Audit: the plan must pass :func:`distfit.audit.plan.audit_plan` before anything is written. The
driver audits it itself, unless its caller already did and passes the report (``audit=``;
``distfit run`` does, so a run audits and hashes the plan once before the release): then the
plan read must still hold the audited checksum (a comparison of the stored attr, no rehash).
Workers reading the plan's blocks (:func:`distfit.release.tasks.plan_blocks_task`) compare the
stored checksum the same way.

Lifecycle. A new release is built *at the final path* with ``complete=False``: every reader
(:func:`distfit.stores.release.read_release`) refuses it; only ``--resume`` opens it. A Dask task
releases a run of consecutive chunks (:func:`distfit.release.tasks.task_chunks`: guided sizes,
at most ``TASK_UNITS`` units); for each chunk it writes the answers of the blocks the store holds
(a single-block plan's are its query answers: ``derived_blocks``, docs/design.md section 4), the
query answers and the unit ids, then the chunk's ``chunks/done`` entry. Sealing (driver, after
all chunks; :func:`distfit.stores.release.seal`) re-verifies the plan's checksum against the one
recorded at the start (recomputing it from the plan's arrays: the one rehash of the plan after
the audit, so that a plan altered during the release is caught), takes the store checksum
(hashed while the chunks landed) and sets ``complete=True``. An error (bad counts in a chunk, a
plan changed mid-run, an interruption) leaves the store incomplete and unsealed.

Where the time goes (``benchmarks/bench_release.py``, ``benchmarks/README.md``): the Dask client
is started on a thread as the release starts (:class:`distfit.runtime.placement.PlacedClient`: a local
cluster's worker processes spawn and import while the driver audits the plan and checks the data;
a ``--resume`` starts it only if chunks are missing) and shut down while the driver seals. A
worker prepares the plan's blocks once (``prepare_blocks``: Cholesky factors, the float32 basis
of the exact basis product), then per chunk draws the noise and does the two float64 products
of the mechanism, bit for bit as ever; the chunk's files are written raw, with direct I/O where
the filesystem allows, on a writer thread while the next chunk is computed
(:class:`distfit.stores.release_chunks.ChunkWriter`). The worker-side code is
:mod:`distfit.release.tasks`, so a worker imports none of the driver's modules. Tasks run in
the order submitted (:func:`distfit.runtime.cluster.run_tasks`). As each chunk is reported done, driver
threads fsync its files (:class:`distfit.stores.release_chunks.ChunkSync`) and feed it to the
store checksum (:class:`distfit.stores.release_chunks.ReleaseHasher`), so the seal finds the
files on disk and the digest computed. The driver's linear algebra (the audit) and each chunk
task run under the BLAS thread rule (:func:`distfit.runtime.threads.blas_threads`,
``DISTFIT_BLAS_THREADS``): one thread per worker process; a local cluster's workers start
without Dask's malloc trim setting (``WORKER_ENV``). An unreachable ``--cluster`` is refused
before anything is written.

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
  (:func:`distfit.stores.files.move_into_place`) only once sealed; if that run fails the staging
  directory is deleted and the old store is left as it was (an overwrite is not resumable).
  ``--resume`` and ``--overwrite`` exclude each other.

Refused before anything is written (``ValueError`` / ``FileExistsError``, exit 2 on the command
line): a plan that fails :func:`distfit.audit.plan.audit_plan` (the failures are named), data whose
schema differs from the plan's, a non-release path at ``--out``. Counts are validated per chunk
inside the task (:func:`distfit.release.noise.validate_counts`: ValueError naming the chunk, row, cell).
"""
from __future__ import annotations

import contextlib
import os
import secrets
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TextIO

import numpy as np

from distfit.audit.checks import AuditReport
from distfit.audit.plan import audit_plan
from distfit.runtime.chunked_job import ChunkedWrite, check_out, claim_out, resume_or_create
from distfit.runtime.placement import PlacedClient, Placement, dask_runtime
from distfit.runtime.progress import LONG_STAGE_SECONDS, Progress
from distfit.data.microdata import ensure_tabulated, microdata_format
from distfit.release.noise import fresh_entropy, load_blocks, prepare_blocks
from distfit.release.tasks import (
    ChunkJob,
    PlanView,
    open_job_data,
    plan_blocks_task,
    release_chunk_task,
    release_chunks_task,
    task_chunks,
)
from distfit.spec.parse import parse_spec
from distfit.stores.data import open_data
from distfit.stores.plan import read_plan
from distfit.stores.ledger import ledger_path, private_releases_of, record_release
from distfit.stores.release import (
    check_replaceable,
    create_release,
    open_resumable,
    release_state,
    seal,
)
from distfit.stores.release_chunks import ChunkWriter, stored_blocks
from distfit.runtime.threads import blas_limit

PathLike = str | os.PathLike

__all__ = [
    "ReleaseResult",
    "run_release",
    "tabulated_data_path",
]


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


def _run_serial(job: ChunkJob, blocks, pending: Iterable[int]) -> Iterator[tuple[int, int]]:
    data = open_job_data(job)
    with ChunkWriter(job.release_path) as writer:
        for chunk in pending:
            units = release_chunk_task(job, blocks, chunk, data=data, writer=writer)
            writer.flush()  # written before the chunk is reported (fsync, checksum, after_chunk)
            yield chunk, units


def _run_dask(client, job: ChunkJob, plan_path: str, plan_checksum: str,
              pending: list[int]) -> Iterator[tuple[int, int]]:
    """One impure task per run of chunks (``task_chunks``; unique keys, retries). The blocks
    are one task's result that every chunk task depends on, read from the plan store by a
    worker, not scattered: scattered data cannot be recomputed, so losing the worker that held
    it would fail the release, while a task result is recomputed on another worker (and
    re-checked against the plan's checksum)."""
    blocks_future = client.submit(plan_blocks_task, os.path.abspath(plan_path), plan_checksum,
                                  key=f"release-blocks-{secrets.token_hex(6)}", pure=False,
                                  retries=dask_runtime().TASK_RETRIES)
    threads = max(1, sum(client.nthreads().values()))
    calls = ((str(chunks[0]), (job, blocks_future, chunks))
             for chunks in task_chunks(list(pending), job.chunk_units, threads))
    for _label, done in dask_runtime().run_tasks(client, release_chunks_task, calls, "release-chunks"):
        yield from done


# --------------------------------------------------------------------------------------------
# the driver


def _query_labels(plan) -> list[str] | None:
    """The workload query labels from the plan's stored spec, or None if they cannot be had."""
    try:
        labels = list(parse_spec(plan.attrs["spec"]).query_labels)
    except Exception:  # noqa: BLE001 - labels are a convenience; a spec we cannot parse has none
        return None
    return labels if len(labels) == len(plan.queries_targets) else None


def run_release(
    plan_path: PathLike,
    data_path: PathLike,
    out: PathLike,
    *,
    resume: bool = False,
    overwrite: bool = False,
    seed: int | None = None,
    placement: Placement = Placement(),
    log: TextIO | None = None,
    fsync: bool = True,
    after_chunk: Callable[[int], None] | None = None,
    audit: AuditReport | None = None,
    data_checksum: str | None = None,
) -> ReleaseResult:
    """Release ``data_path`` through the plan at ``plan_path`` into ``out`` (module docstring).

    ``placement``: where the chunk tasks run (:class:`distfit.runtime.placement.Placement`;
    default a local cluster). ``seed`` (tests only) replaces the fresh entropy and marks the
    release not private.
    ``after_chunk(chunk)`` is called in the driver after each chunk is written (a test hook,
    e.g. to simulate an interruption). ``audit``: the report of ``audit_plan(plan_path)`` when
    the caller has just audited the plan (``distfit run``); the plan is then not audited again,
    only checked to still hold the audited checksum. ``data_checksum``: the checksum of the data
    store at ``data_path`` when the caller has just written it (``distfit run``'s synthetic
    data); it is then not hashed again, only checked to still state that checksum; otherwise
    the data store is verified once (its whole checksum recomputed) before anything is laid
    out. Errors: ValueError (bad input: audit failures, data changed since it was sealed,
    schema mismatch, bad counts, a resume that does not match, a plan changed since
    its audit), FileExistsError (something at ``out`` that may not be replaced),
    cluster.ClusterError.
    """
    started = time.perf_counter()
    log = log or sys.stderr
    plan_path, data_path = os.fspath(plan_path), os.fspath(data_path)
    out_path = Path(os.fspath(out))
    check_out(out_path, "release", resume=resume, overwrite=overwrite)
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ValueError(f"--seed must be an integer >= 0, got {seed!r}")
    private = seed is None

    with contextlib.ExitStack() as stack:
        # One writer per store: a second release into out (or a second --resume) is refused here,
        # before it looks at, or cleans up, anything at out.
        state, resumed = claim_out(stack, out_path, "release", release_state, resume=resume, overwrite=overwrite,
                                   log=log)
        # The driver's linear algebra (the audit) under the BLAS thread rule, as on the command line.
        stack.enter_context(blas_limit())
        client = PlacedClient(placement, stack, log)  # started below (a resume: when chunks are missing)

        if audit is None:
            audit = audit_plan(plan_path, log=log)
        elif os.path.abspath(audit.path) != os.path.abspath(plan_path):
            raise ValueError(f"audit: a report of {audit.path}, not of the plan {plan_path}")
        if not audit.ok:
            more = len(audit.failures) - 3
            raise ValueError(f"{plan_path}: the plan fails audit ({len(audit.failures)} failures): "
                             + "; ".join(audit.failures[:3])
                             + (f"; and {more} more (see distfit audit)" if more > 0 else ""))
        if not resumed:
            # A plan that fails audit is refused before any cluster starts; the cluster's worker
            # processes then spawn and import while the driver checks the data. (A resume starts
            # it only if chunks are missing.)
            client.start()
        plan = read_plan(plan_path)
        plan_checksum = plan.checksum
        if plan_checksum != audit.checksum:
            raise ValueError(f"{plan_path}: the plan changed since its audit (checksum {plan_checksum}, "
                             f"{audit.checksum} audited)")
        blocks = load_blocks(plan)

        tabulated = None
        if microdata_format(data_path) is not None:
            data_path, tabulated = _tabulate_for_release(
                plan, data_path, out_path, blocks, client=client.get, replace=not resumed, log=log, fsync=fsync)
        # its root verified here, before the store is laid out or any noise drawn, and each chunk
        # by the task that reads it (data this release tabulated, or its caller wrote, was sealed
        # a moment ago by this process: not hashed again)
        fresh = tabulated == "tabulated" or data_checksum is not None
        data = open_data(data_path, verify=not fresh)
        if data_checksum is not None and data.attrs.get("checksum") != data_checksum:
            raise ValueError(f"{data_path}: the data changed since it was written (checksum "
                             f"{data.attrs.get('checksum')}, written with {data_checksum})")
        plan_schema = (list(plan.attrs["schema"]["attributes"]), list(plan.attrs["schema"]["sizes"]))
        data_schema = (list(data.domain.names), list(data.domain.sizes))
        if data_schema != plan_schema:
            raise ValueError(
                f"{data_path}: the data's schema {data_schema[0]} sizes {data_schema[1]} differs from the "
                f"plan's {plan_schema[0]} sizes {plan_schema[1]}")
        data.check_blocks([block.attributes for block in blocks.values()])
        data.check_unit_ids()
        n_chunks = -(-data.units // data.chunk_units)
        if private and not resumed:
            _say_budget_spent_again(data, data_path, float(plan.attrs["rho"]), log)

        if not resumed:
            client.get()  # an unreachable cluster is refused before anything is written
        root, target, staging, pending = resume_or_create(
            out_path, state, "release", n_chunks, resumed=resumed, resume=resume,
            reopen=lambda path: open_resumable(path, plan=plan, data=data, private=private, blocks=blocks),
            create=lambda path: create_release(path, plan=plan, plan_path=plan_path, data=data, blocks=blocks,
                                               private=private, labels=_query_labels(plan),
                                               progress=Progress("release layout", log, after=LONG_STAGE_SECONDS)),
            kept="chunks already written (kept as they are)",
            rest=f"to draw {'with fresh entropy' if private else 'from the test seed'}", log=log)

        with ChunkedWrite(root, target, units=data.units, chunk_units=data.chunk_units, pending=pending,
                          stage="release", log=log, fsync=fsync, staging=staging, after_chunk=after_chunk) as write:
            job = ChunkJob(
                release_path=str(target), data_path=os.path.abspath(data_path),
                plan=PlanView(attrs={"schema": dict(plan.attrs["schema"])}, block_ids=tuple(sorted(blocks)),
                               queries_targets=np.asarray(plan.queries_targets)),
                units=data.units, chunk_units=data.chunk_units, stored=stored_blocks(root),
                entropy=int(seed) if seed is not None else fresh_entropy(),
                packs=tuple(zip(plan.pack_ids, map(plan.packed_block_ids, range(len(plan.pack_ids))))),
                data_checksum=None if fresh else data.attrs.get("checksum"),  # each chunk checked as read
            )
            if not pending:
                pass
            elif placement.serial:
                write.consume(_run_serial(job, prepare_blocks(blocks), pending))
            else:
                write.consume(_run_dask(client.get(), job, plan_path, plan_checksum, pending))
            del job
            client.close(wait=False)  # the workers are done: shut them down while sealing
            checksum = write.seal(lambda hasher, synced: seal(root, target, plan_path=plan_path, plan_checksum=plan_checksum,
                                                              fsync=fsync, hasher=hasher, synced=synced),
                                  out_path, check_replaceable)
            if private:  # the machine's ledger of what this data has cost (stores.ledger)
                try:
                    record_release({"data_checksum": data.attrs.get("checksum"), "data": os.path.abspath(data_path),
                                    "release": os.path.abspath(out_path), "release_checksum": checksum,
                                    "plan_checksum": plan_checksum, "rho": float(plan.attrs["rho"])})
                except OSError as error:  # the release is sealed and stands; the ledger only warns
                    print(f"distfit: warning: this release is not recorded in the ledger {ledger_path()} "
                          f"({error.strerror or error}); a later release of this data will not know of it", file=log)
    return ReleaseResult(
        path=str(out_path), units=data.units, queries=len(plan.queries_targets), blocks=len(blocks),
        chunks=n_chunks, chunks_drawn=len(pending), units_drawn=write.done_units,
        seconds=time.perf_counter() - started, checksum=checksum, plan_checksum=plan_checksum,
        private=private, resumed=resumed, data=str(data_path), tabulated=tabulated,
    )


def _say_budget_spent_again(data, data_path: str, rho: float, log: TextIO) -> None:
    """One line when this machine's ledger knows earlier private releases of the same data: this
    one spends the budget again, and zCDP adds (docs/privacy.md, "Releasing the same data again")."""
    try:
        earlier = private_releases_of(str(data.attrs.get("checksum")))
    except OSError as error:  # the ledger is a warning, never a reason not to release
        print(f"distfit: warning: the ledger {ledger_path()} cannot be read ({error.strerror or error}); "
              "earlier releases of this data on this machine are not known", file=log)
        return
    if earlier:
        total = sum(float(entry.get("rho", 0.0)) for entry in earlier) + rho
        print(f"distfit: {data_path} was released {len(earlier)} time(s) before on this machine; this release "
              f"spends the privacy budget again: rho {rho:.6g} more, {total:.6g} in all for this data "
              "(zCDP adds up)", file=log)


def tabulated_data_path(out: PathLike) -> Path:
    """Where ``distfit release --data MICRODATA --out RELEASE`` tabulates: ``<RELEASE>.data.zarr``."""
    out = Path(os.fspath(out))
    return out.with_name(f"{out.name}.data.zarr")


def _tabulate_for_release(plan, source: str, out_path: Path, blocks, *, client: Callable[[], Any],
                          replace: bool, log: TextIO, fsync: bool) -> tuple[str, str]:
    """Tabulate microdata for ``plan`` next to the release (module docstring)."""
    try:
        spec = parse_spec(plan.attrs["spec"])
    except (KeyError, ValueError) as error:
        raise ValueError(f"{plan.path}: cannot read the plan's spec to tabulate {source} ({error})") from None
    path, status = ensure_tabulated(
        spec, source, tabulated_data_path(out_path), cover=[block.attributes for block in blocks.values()],
        client=client, replace=replace, fsync=fsync, log=log)  # called only for a pass of many tasks
    if status == "tabulated":
        print(f"distfit: tabulated {source} into {path}", file=log)
    return str(path), status
