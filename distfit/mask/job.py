"""``distfit mask``: a CSV in, a sealed store of masked pseudo-data out (paper 003; the I/O edge).

``distfit mask DATA.csv --columns a,b --bounds a=LO:HI,b=LO:HI --epsilon E --delta D --out
MASKED.zarr [--block-rows N] [--resume] [--overwrite] [--seed S] [--workers N] [--cluster
ADDR|FILE] [--serial]`` (docs/mask.md). The mathematics is :mod:`distfit.mask.scaling`,
:mod:`distfit.mask.haar` and :mod:`distfit.mask.account`; the store :mod:`distfit.stores.mask`;
the worker's side :mod:`distfit.mask.tasks`. This module checks the inputs, stages the data,
runs one task per run of blocks (serially or on Dask through :mod:`distfit.runtime.placement`)
and seals the result, as :mod:`distfit.release.job` does for a release
(:mod:`distfit.runtime.chunked_job`: one writer per store, ``--resume``, ``--overwrite`` built
aside and moved into place).

Order of work. Refused before anything is read or written (``ValueError``, exit 2): bad
columns, bounds missing or ``LO >= HI``, epsilon or delta out of range, ``--block-rows <= p``,
a missing file or column. The driver then reads the chosen columns once, chunk by chunk
(:func:`distfit.mask.source.read_columns`), checking every value, into an input store next to
``--out`` (``<out>.input-<random>``: the data, deleted when the session ends, whatever its
outcome); a bad value (text, empty, NaN, infinite) is refused there, before the store is laid
out, and nothing is left at ``--out``. With ``--bounds-from-data`` the bounds are the columns'
range, computed in the same pass; a warning says that they leak and the store is marked not
private. Clipped values (outside ``--bounds``) are counted per column for the summary only.
The account (:func:`distfit.mask.account.mask_account`) is computed once the rows are counted:
for one column its sigma depends on the block sizes (setting B, docs/privacy.md).

Randomness: fresh OS entropy per session (:func:`distfit.release.noise.fresh_entropy`), in memory
only and shipped with the tasks; block ``i`` draws from ``block_stream(entropy, i)``. ``--seed``
(tests only) replaces it and marks the store not private. ``--resume`` finishes an incomplete
store started from the same file (path and modification time), columns, bounds and budget:
blocks marked done are kept, the others drawn with fresh entropy (the blocks are independent:
each has its own noise and its own mask); with the same ``--seed`` a resumed store equals an
uninterrupted one byte for byte.
"""
from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from distfit.audit.mask import audit_mask
from distfit.mask.account import check_budget, mask_account
from distfit.mask.haar import block_sizes, default_block_rows
from distfit.mask.scaling import INTERCEPT, check_columns, check_scaling, clip_counts, scaling_from_range
from distfit.mask.source import SUFFIXES, check_header, read_columns
from distfit.mask.tasks import MaskJob, mask_block_task, mask_blocks_task
from distfit.release.noise import fresh_entropy
from distfit.release.tasks import task_chunks
from distfit.runtime.chunked_job import ChunkedWrite, check_out, claim_out, resume_or_create
from distfit.runtime.placement import PlacedClient, dask_runtime
from distfit.runtime.failures import RunFailure
from distfit.runtime.placement import Placement
from distfit.stores.mask import (
    CHUNK_ARRAYS,
    Masked,
    check_replaceable,
    create_input,
    create_mask,
    mask_state,
    open_input,
    open_resumable,
    read_mask,
    seal,
)
from distfit.stores.release_chunks import ChunkWriter

__all__ = ["MaskResult", "check_run_data", "mask_in_run", "run_mask"]

#: Rows read from the CSV at a time (and the input store's chunk rows).
READ_ROWS = 1 << 17


@dataclass(frozen=True)
class MaskResult:
    """What :func:`run_mask` did: ``blocks_drawn`` blocks were drawn in this session (all for a
    new store, the missing ones on ``--resume``); ``clipped`` counts the values clipped per
    column (for the curator: not stored)."""

    path: str
    rows: int
    columns: tuple[str, ...]
    blocks: int
    block_rows: int
    blocks_drawn: int
    rows_drawn: int
    seconds: float
    checksum: str
    sigma: float
    sigma_gaussian: float
    sigma_masked: float | None
    account: dict
    private: bool
    resumed: bool
    clipped: dict
    bounds_from_data: bool


def _check_seed(seed: int | None) -> None:
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0):
        raise ValueError(f"--seed must be an integer >= 0, got {seed!r}")


def _check_block_rows(block_rows: int | None, p: int) -> int:
    if block_rows is None:
        return default_block_rows(p)
    if isinstance(block_rows, bool) or not isinstance(block_rows, (int, np.integer)) or block_rows <= p:
        raise ValueError(f"--block-rows must be an integer > p = {p} (the number of columns), got {block_rows!r}")
    return int(block_rows)


def _run_serial(job: MaskJob, pending: Iterable[int]) -> Iterator[tuple[int, int]]:
    values = open_input(job.input_path)
    with ChunkWriter(job.out_path) as writer:
        for block in pending:
            rows = mask_block_task(job, block, values, writer)
            writer.flush()  # written before the block is reported (fsync, checksum, after_chunk)
            yield block, rows


def _run_dask(client, job: MaskJob, pending: list[int]) -> Iterator[tuple[int, int]]:
    threads = max(1, sum(client.nthreads().values()))
    calls = ((str(blocks[0]), (job, blocks)) for blocks in task_chunks(list(pending), job.chunk_units, threads))
    for _label, done in dask_runtime().run_tasks(client, mask_blocks_task, calls, "mask-blocks"):
        yield from done


def _stage(data: str, columns: Sequence[str], input_path: Path, scaling, log: TextIO):
    """Read the chosen columns into the input store; returns ``(rows, scaling, clipped)``
    (``scaling`` None: computed from the data's range, with the warning)."""
    p = len(columns)
    values = create_input(input_path, p, READ_ROWS)
    minima, maxima = np.full(p, np.inf), np.full(p, -np.inf)
    clipped = np.zeros(p, dtype=np.int64)
    for block in read_columns(data, columns, READ_ROWS):
        values.append(block, axis=0)
        if scaling is None:
            minima, maxima = np.minimum(minima, block.min(axis=0)), np.maximum(maxima, block.max(axis=0))
        else:
            clipped += clip_counts(block, scaling)
    if scaling is None:
        scaling = scaling_from_range(columns, minima, maxima)
        print("distfit: warning: --bounds-from-data: the bounds are each column's minimum and maximum in the "
              "data, published through the store's centre and scale outside the privacy guarantee; "
              "the store is marked not private", file=log)
    return int(values.shape[0]), scaling, dict(zip(columns, clipped.tolist()))


def run_mask(
    data: str | os.PathLike,
    out: str | os.PathLike,
    *,
    columns: Sequence[str],
    epsilon: float,
    delta: float,
    bounds: Mapping[str, tuple[float, float]] | None = None,
    bounds_from_data: bool = False,
    block_rows: int | None = None,
    seed: int | None = None,
    resume: bool = False,
    overwrite: bool = False,
    placement: Placement = Placement(),
    log: TextIO | None = None,
    fsync: bool = True,
    after_chunk: Callable[[int], None] | None = None,
) -> MaskResult:
    """Release the ``columns`` of the CSV ``data`` masked into the store ``out`` (module
    docstring), with noise for (``epsilon``, ``delta``) and public ``bounds``
    (``{column: (lo, hi)}``), or ``bounds_from_data`` (not private). ``after_chunk(block)`` is
    called in the driver after each block is written (a test hook). Errors: ValueError (bad
    input, a resume that does not match), FileExistsError (something at ``out`` that may not
    be replaced), cluster.ClusterError."""
    started = time.perf_counter()
    log = log or sys.stderr
    data = os.fspath(data)
    out_path = Path(os.fspath(out))
    check_out(out_path, "mask", resume=resume, overwrite=overwrite)
    _check_seed(seed)
    columns = check_columns(columns)
    if bounds_from_data and bounds:
        raise ValueError("--bounds and --bounds-from-data exclude each other")
    scaling = None if bounds_from_data else check_scaling(columns, bounds or {})
    p = len(columns)
    check_budget(epsilon, delta)
    block_rows = _check_block_rows(block_rows, p)
    check_header(data, columns)
    private = seed is None and not bounds_from_data

    with contextlib.ExitStack() as stack:
        state, resumed = claim_out(stack, out_path, "mask", mask_state, resume=resume, overwrite=overwrite, log=log)
        client = PlacedClient(placement, stack, log)
        if not resumed:
            client.start()  # the workers spawn while the driver reads the data
        input_path = out_path.with_name(f"{out_path.name}.input-{secrets.token_hex(6)}")
        stack.callback(shutil.rmtree, input_path, ignore_errors=True)  # the data: never left behind
        rows, scaling, clipped = _stage(data, columns, input_path, scaling, log)
        sizes = block_sizes(rows, p, block_rows)
        account = mask_account(epsilon, delta, p, sizes)  # p = 1: setting B's, set by the block sizes
        names = [*columns, INTERCEPT]
        centre, scale = np.append(scaling.centre, 0.0), np.append(scaling.scale, 1.0)
        attrs = {"bounds": scaling.bounds(), "bounds_from_data": bool(bounds_from_data), "sigma": account.sigma,
                 "account": account.to_dict(), "private": private, "columns": names, "rows": rows,
                 "chunk_units": int(sizes[0]), "n_chunks": len(sizes),
                 "source": {"path": os.path.abspath(data), "modified": os.stat(data).st_mtime_ns}}
        if not resumed:
            client.get()  # an unreachable cluster is refused before anything is written
        root, target, staging, pending = resume_or_create(
            out_path, state, "mask", len(sizes), resumed=resumed, resume=resume,
            reopen=lambda path: open_resumable(path, attrs),
            create=lambda path: create_mask(path, columns=names, centre=centre, scale=scale, sizes=sizes, attrs=attrs),
            kept="blocks already written (kept as they are)",
            rest=f"to draw {'from the test seed' if seed is not None else 'with fresh entropy'}", log=log)

        with ChunkedWrite(root, target, units=rows, chunk_units=int(sizes[0]), pending=pending, stage="mask",
                          log=log, fsync=fsync, staging=staging, arrays=CHUNK_ARRAYS, after_chunk=after_chunk) as write:
            job = MaskJob(out_path=str(target), input_path=str(input_path), sizes=tuple(int(s) for s in sizes),
                          chunk_units=int(sizes[0]), centre=scaling.centre, scale=scaling.scale, sigma=account.sigma,
                          entropy=int(seed) if seed is not None else fresh_entropy())
            if pending and placement.serial:
                write.consume(_run_serial(job, pending))
            elif pending:
                write.consume(_run_dask(client.get(), job, pending))
            del job
            client.close(wait=False)  # the workers are done: shut them down while sealing
            checksum = write.seal(lambda hasher, synced: seal(root, target, fsync=fsync, hasher=hasher, synced=synced),
                                  out_path, check_replaceable)
    return MaskResult(
        path=str(out_path), rows=rows, columns=tuple(columns), blocks=len(sizes), block_rows=int(sizes[0]),
        blocks_drawn=len(pending), rows_drawn=write.done_units, seconds=time.perf_counter() - started,
        checksum=checksum, sigma=account.sigma, sigma_gaussian=account.sigma_gaussian,
        sigma_masked=account.sigma_masked, account=account.to_dict(), private=private, resumed=resumed,
        clipped=clipped, bounds_from_data=bool(bounds_from_data),
    )


# --------------------------------------------------------------------------------------------
# the mask stage of distfit run (a spec's mask section)


def check_run_data(data: str | os.PathLike | None, columns: Sequence[str]) -> None:
    """Refuse (ValueError naming ``mask``), before a run does any work, a spec's mask section
    without a CSV to mask (``--data``) or a column missing from it."""
    if data is None or not os.fspath(data).lower().endswith(SUFFIXES):
        given = "no --data" if data is None else f"--data {os.fspath(data)}"
        raise ValueError(f"mask: the spec's mask section masks columns of the run's microdata: give --data a "
                         f".csv or .csv.gz file ({given})")
    check_header(data, columns)


def _sealed_differs(store: Masked, data: str, columns: Sequence[str], bounds: Mapping[str, tuple[float, float]],
                    epsilon: float, delta: float, block_rows: int | None) -> str | None:
    """What the sealed mask ``store`` was made with that this run would not make it with (None:
    the same data, columns, bounds, budget and blocks); its stated attrs, not yet verified (the
    audit that follows recomputes its checksum)."""
    attrs, p = store.attrs, len(columns)
    made = {"columns": attrs.get("columns"), "bounds": attrs.get("bounds"),
            "budget": [store.account.get("epsilon"), store.account.get("delta")],
            "source": attrs.get("source"), "blocks": attrs.get("chunk_units")}
    wanted = {"columns": [*columns, INTERCEPT], "bounds": check_scaling(columns, bounds).bounds(),
              "budget": [float(epsilon), float(delta)],
              "source": {"path": os.path.abspath(data), "modified": os.stat(data).st_mtime_ns},
              "blocks": int(block_sizes(store.rows, p, _check_block_rows(block_rows, p))[0])}
    differ = [key for key in wanted if made[key] != wanted[key]]
    return ", ".join(differ) if differ else None


def mask_in_run(data: str | os.PathLike, out: str | os.PathLike, *, columns: Sequence[str],
                bounds: Mapping[str, tuple[float, float]], epsilon: float, delta: float, block_rows: int | None,
                placement: Callable[[], Placement], log: TextIO, fsync: bool = True) -> tuple[dict, str]:
    """The mask stage of ``distfit run`` (pipelines/README.md, "Masked pseudo-data"): a sealed
    store at ``out`` made from the same data and settings is reused (verified), an incomplete one
    resumed, anything else written by :func:`run_mask`; then the store is audited
    (:func:`distfit.audit.mask.audit_mask`; a failure is a :class:`RunFailure`). ``placement`` is
    called only when there are blocks to draw. Returns the manifest's ``mask`` entry and the
    stage's status (``done``, ``resumed`` or ``reused``). ValueError: a sealed store of other
    data or settings."""
    data, out_path = os.fspath(data), Path(os.fspath(out))
    state = mask_state(out_path)
    if state == "sealed":
        differs = _sealed_differs(read_mask(out_path), data, columns, bounds, epsilon, delta, block_rows)
        if differs:
            raise ValueError(f"{out_path}: a sealed mask store made with other {differs}; use another --out")
        status = "reused"
        print(f"distfit: the mask store at {out_path} is sealed; no new noise drawn", file=log)
    else:
        result = run_mask(data, out_path, columns=columns, bounds=bounds, epsilon=epsilon, delta=delta,
                          block_rows=block_rows, resume=state == "incomplete", placement=placement(),
                          log=log, fsync=fsync)
        status = "resumed" if result.resumed else "done"
    # the one hash of the store: the audit recomputes its checksum (a reused store changed after
    # its seal fails here) and its account
    report = audit_mask(str(out_path))
    if not report.ok:
        raise RunFailure(f"{out_path}: the mask store fails audit ({len(report.failures)} failures): "
                         + "; ".join(report.failures[:3]))
    store = read_mask(out_path)  # its attrs only: hashed by the audit, whose checksum is report.checksum
    return {"path": os.path.abspath(out_path), "checksum": report.checksum, "sigma": store.sigma,
            "private": store.private, "account": store.account}, status
