"""The driver of a store written chunk by chunk and sealed: a release, an estimate (one way to do it).

``distfit release`` (:mod:`distfit.release.job`) and ``distfit estimate``
(:mod:`distfit.estimate.job`) write a store the same way (docs/design.md sections 4 and 5): one
writer per store (:func:`distfit.stores.lock.store_lock`), a sealed store refused unless
``--overwrite``, an incomplete one unless ``--resume`` or ``--overwrite``; a new store built at
the final path with ``complete=false``, an overwrite built aside (``<out>.incomplete-<random>``)
and moved into place once sealed; one task per chunk of units whose results the driver consumes
as they come, fsyncing each chunk's files (:class:`distfit.stores.release_chunks.ChunkSync`) and
feeding them to the store checksum (:class:`distfit.stores.release_chunks.ReleaseHasher`) so that
the seal finds the files on disk and the digest computed; on any failure the progress line is
ended, the threads stopped and a staging directory deleted, an in-place store left incomplete
(resumable). This module is that driver side: :func:`check_out`, :func:`claim_out`,
:func:`new_target` and :class:`ChunkedWrite`; what a chunk computes, how a store is laid out,
resumed and sealed stay with each job and its store module. :func:`resume_or_create` is the
one choice between the two: the incomplete store reopened with its chunks not yet done, or a new
store laid out at :func:`new_target`'s path with all of them.
"""
from __future__ import annotations

import contextlib
import secrets
import shutil
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence, TextIO

from distfit.runtime.progress import Progress
from distfit.stores.files import STAGING_MARKER, is_staging, leftovers, move_into_place
from distfit.stores.lock import store_lock
from distfit.stores.release_chunks import ChunkSync, ReleaseHasher, pending_chunks
from distfit.stores.sealing import ChangedChunk

__all__ = ["ChunkedWrite", "Layout", "check_out", "claim_out", "new_target", "resume_or_create"]


def _article(kind: str) -> str:
    return "an" if kind[:1] in "aeiou" else "a"


def check_out(out_path: Path, kind: str, *, resume: bool, overwrite: bool) -> None:
    """The options and ``--out`` path of a chunked write of a ``kind`` store (``"release"``,
    ``"estimate"``), before anything else: ValueError for ``--resume`` with ``--overwrite`` and
    for a path that names a staging directory."""
    if resume and overwrite:
        raise ValueError("--resume and --overwrite exclude each other")
    if is_staging(out_path):
        raise ValueError(f"{out_path}: {_article(kind)} {kind} path may not contain {STAGING_MARKER!r}")


def claim_out(stack: contextlib.ExitStack, out_path: Path, kind: str, state_of: Callable[[Path], str], *,
              resume: bool, overwrite: bool, log: TextIO) -> tuple[str, bool]:
    """Take the store's lock for the rest of ``stack`` (a second writer is refused before it
    looks at, or cleans up, anything at ``out_path``), then ``(state, resumed)``: the store's
    ``state_of(out_path)`` (``"absent"``, ``"sealed"``, ``"incomplete"``) and whether this
    write resumes it. FileExistsError for a sealed store without ``overwrite`` and an
    incomplete one without ``resume`` or ``overwrite``; a note on ``log`` about leftovers of an
    earlier write next to an absent store."""
    stack.enter_context(store_lock(out_path, kind))
    state = state_of(out_path)
    if state == "sealed" and not overwrite:
        raise FileExistsError(f"{out_path}: already holds a sealed {kind}; pass --overwrite to replace it")
    if state == "incomplete" and not (resume or overwrite):
        raise FileExistsError(f"{out_path}: holds an incomplete {kind}; pass --resume to finish it or "
                              "--overwrite to start over")
    if state == "absent" and leftovers(out_path):
        print(f"distfit: note: leftovers of an earlier write next to {out_path}: "
              f"{', '.join(p.name for p in leftovers(out_path))}", file=log)
    return state, resume and state == "incomplete"


def new_target(out_path: Path, state: str, kind: str, *, resume: bool, log: TextIO) -> tuple[Path, Path | None]:
    """Where a new (not resumed) store is laid out: ``(target, staging)``. Nothing at
    ``out_path``: the final path itself (its parent made), staging None; otherwise (an
    overwrite) a staging directory next to it, moved into place once sealed."""
    if resume:
        print(f"distfit: nothing to resume at {out_path}; starting a new {kind}", file=log)
    if state == "absent":
        out_path.parent.mkdir(parents=True, exist_ok=True)
        return out_path, None
    staging = out_path.with_name(f"{out_path.name}{STAGING_MARKER}{secrets.token_hex(6)}")
    return staging, staging


class Layout(NamedTuple):
    """The store a chunked write fills: its zarr group ``root`` at ``target``, the ``staging``
    directory to move into place once sealed (None: ``target`` is the final path) and the
    ``pending`` chunks, in order."""

    root: Any
    target: Path
    staging: Path | None
    pending: list[int]


def resume_or_create(out_path: Path, state: str, kind: str, n_chunks: int, *, resumed: bool, resume: bool,
                     reopen: Callable[[Path], Any], create: Callable[[Path], Any], kept: str, rest: str,
                     log: TextIO) -> Layout:
    """The store of a chunked write of ``n_chunks`` chunks (``state``, ``resumed``: from
    :func:`claim_out`). Resumed: ``reopen(out_path)`` (the store module's ``open_resumable``,
    which checks the store was started from the same inputs), its chunks not marked done, and
    the line ``distfit: resuming OUT: D of N <kept>, P <rest>`` on ``log`` (``kept``, ``rest``:
    the job's words, e.g. "chunks already written (kept as they are)", "to draw with fresh
    entropy"). Otherwise ``create(target)`` at :func:`new_target`'s target, every chunk pending."""
    if resumed:
        root = reopen(out_path)
        pending = pending_chunks(root)
        print(f"distfit: resuming {out_path}: {n_chunks - len(pending)} of {n_chunks} {kept}, {len(pending)} {rest}",
              file=log)
        return Layout(root, out_path, None, pending)
    target, staging = new_target(out_path, state, kind, resume=resume, log=log)
    return Layout(create(target), target, staging, list(range(n_chunks)))


class ChunkedWrite:
    """The driver's side of writing the ``pending`` chunks of the store ``root`` (its zarr group) at ``target``
    (module docstring); a context manager whose exit on an error (an interruption included)
    ends the progress line, cancels the fsync and checksum threads and deletes ``staging``, and,
    when a task found an input chunk changed since it was sealed
    (:class:`distfit.stores.sealing.ChangedChunk`), the new store too (unless it holds chunks
    written before this session: a resumed store stays incomplete).

    ``arrays``: the arrays the chunks write (None: a release's, as ``ChunkSync`` and
    ``ReleaseHasher`` default); ``stage``: the progress line's label; ``after_chunk(chunk)``:
    called after each chunk is consumed (a test hook). ``done_units`` counts the units of the
    chunks consumed."""

    def __init__(self, root: Any, target: Path, *, units: int, chunk_units: int, pending: Sequence[int],
                 stage: str, log: TextIO, fsync: bool, staging: Path | None,
                 arrays: Sequence[str] | None = None, after_chunk: Callable[[int], None] | None = None) -> None:
        self.root, self.target, self.staging = root, target, staging
        # nothing of the store was written before this session (a new store, or a resumed one
        # with every chunk to go): a failure on a changed input leaves nothing behind (__exit__)
        self._from_scratch = len(pending) == -(-units // chunk_units)
        self.total = sum(min(chunk_units, units - c * chunk_units) for c in pending)
        self.done_units = 0
        self.log = log
        self._fsync = fsync
        self._after_chunk = after_chunk
        self._progress = Progress(stage, log, unit="units")
        self._syncer = ChunkSync(root, target, units, chunk_units, arrays) if fsync and pending else None
        self._hasher = ReleaseHasher(root, target, units, chunk_units, arrays) if pending else None

    def __enter__(self) -> "ChunkedWrite":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if kind is None:
            return
        if 0 < self.done_units < self.total:
            print(file=self.log)  # end the progress line before the error
        if self._syncer is not None:
            self._syncer.close(cancel=True)
        if self._hasher is not None:
            self._hasher.cancel()
        if self.staging is not None:
            shutil.rmtree(self.staging, ignore_errors=True)
        elif kind is not None and issubclass(kind, ChangedChunk) and self._from_scratch:
            # an input chunk changed since it was sealed (a task's check): the chunks drawn before
            # it are not kept for --resume; nothing is left at all (docs/privacy.md)
            shutil.rmtree(self.target, ignore_errors=True)

    def consume(self, results: Iterable[tuple[int, int]]) -> None:
        """Take ``(chunk, units)`` results as the tasks report them: fsync and hash the chunk,
        update the progress line, call ``after_chunk``."""
        for chunk, units in results:
            self.done_units += units
            if self._syncer is not None:
                self._syncer(chunk)
            if self._hasher is not None:
                self._hasher.chunk_done(chunk)
            self._progress(self.done_units, self.total)
            if self._after_chunk is not None:
                self._after_chunk(chunk)

    def seal(self, seal: Callable[[ReleaseHasher | None, Mapping[str, tuple[int, ...]]], str], out_path: Path,
             check_target: Callable[[Path], None]) -> str:
        """Wait for the queued fsyncs, seal through the store's ``seal(hasher, synced)`` (it
        checks its inputs are unchanged, takes the hasher's digest and fsyncs the store but the
        files ``synced`` as they landed) and move a staging directory into place at
        ``out_path`` (``check_target``: what may be replaced there). Returns the checksum."""
        synced = self._syncer.close() if self._syncer is not None else {}
        checksum = seal(self._hasher, synced)
        if self.staging is not None:
            move_into_place(self.staging, out_path, check_target, fsync=self._fsync)
        return checksum
