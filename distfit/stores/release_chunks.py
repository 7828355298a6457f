"""Writing a release's chunks: the task's writer, fsync and checksum as the chunks land.

What runs while the chunks of a release are written (the store's layout, lifecycle and reader
are :mod:`distfit.stores.release`; the orchestration :func:`distfit.release.job.run_release`):

* in each task, :class:`ChunkWriter` (:func:`write_chunk`) writes a chunk's arrays: whole
  chunks of uncompressed arrays as raw chunk files (:func:`raw_chunks`), the rest by zarr, and
  last the chunk's ``chunks/done`` entry;
* in the driver, as each chunk is reported done, :class:`ChunkSync` fsyncs its files and
  :class:`ReleaseHasher` feeds its rows to the store checksum (read back with
  :func:`read_rows`), so that the seal finds the files on disk and the digest computed.

Where the time went before (1M PL94 units, 2 workers; benchmarks/README.md): zarr's write
pipeline cost 8.4 ms of CPU per 10 MB answer chunk against 1.5 ms for the file write itself,
and ~4 ms per call for the ids and the done marker; the seal read and hashed the whole store
after the last chunk.
"""
from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import numpy as np
import zarr
from zarr.codecs import BytesCodec
from zarr.core.sync import sync

from distfit.stores.checksum import DIGESTS, Reader, chunk_digest, compute_checksum, digested_arrays
from distfit.stores.atomic import fsync_dir
from distfit.stores.files import fsync_file, fsync_tree, jsonable, open_arrays, utc_now
from distfit.stores.sealing import seal_checksum, stated_attrs

#: How the seal reads the store for its checksum (:func:`distfit.stores.checksum.compute_checksum`,
#: the same digest as every reader's): whole zarr chunks of answers, at least this many bytes a
#: read, on one thread, the next slab read while this one is hashed. A release is a few large
#: arrays, so the plan's default (8 threads, 64 MiB slabs) only adds memory: 0.5-0.6 s this way
#: for a 100k-unit PL94 release here (benchmarks/README.md).
SEAL_READ_BYTES = 8 * 2**20
SEAL_READ_THREADS = 1
#: The arrays hashed after the first one the chunks write (an estimate's ``solve/*``, ``unit``
#: and ``unit_ids``; a release's ``unit`` and ``unit_ids``), in hash order while their whole
#: size fits in this many bytes, are read by :class:`ReleaseHasher` as their chunks land and
#: kept until hashed: the seal then hashes them from memory instead of reading five files a
#: chunk after the last one (1M PL94 units: 29 MB, 0.13 s of an estimate's seal).
PREFETCH_BYTES = 64 * 2**20


#: Chunk files are written and read with ``O_DIRECT`` (Linux) where the file is a whole number
#: of :data:`DIRECT_ALIGN` blocks (a 4096-unit chunk always is) and the filesystem takes it,
#: else through the page cache. Copying into the page cache cost more CPU than anything but the
#: noise's own arithmetic: 4.5 of 27 CPU-s of a 1M-unit PL94 release here (perf: the kernel's
#: copy_folio_from_iter_atomic, ~0.6 GB/s), against 0.3 CPU-s written direct (1.8 GB/s); the
#: seal's checksum reads the files back direct too (2.4 GB/s, no copy into the cache).
DIRECT_IO = hasattr(os, "O_DIRECT")
DIRECT_ALIGN = 4096  # bytes: the buffer address, file offsets and sizes of a direct transfer
_NOT_DIRECT = (errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP)  # refused by the filesystem


def aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 array of ``nbytes`` whose address is a multiple of
    :data:`DIRECT_ALIGN` (what ``O_DIRECT`` transfers need)."""
    raw = np.empty(nbytes + DIRECT_ALIGN, dtype=np.uint8)
    start = (-raw.ctypes.data) % DIRECT_ALIGN
    return raw[start:start + nbytes]


def write_file(path: Path, data: np.ndarray, direct: bool | None = None) -> bool:
    """Write the bytes of ``data`` (C-contiguous) to a new file at ``path``: with ``O_DIRECT``
    when ``direct`` (default :data:`DIRECT_IO`) and the size is a whole number of
    :data:`DIRECT_ALIGN` blocks (copied into an aligned buffer if need be), else, or if the
    filesystem refuses it, through the page cache. Returns whether direct I/O is still worth
    trying (False once refused)."""
    direct = DIRECT_IO if direct is None else direct
    view = memoryview(data).cast("B")
    if direct and view.nbytes and view.nbytes % DIRECT_ALIGN == 0:
        if data.ctypes.data % DIRECT_ALIGN:
            aligned = aligned_empty(view.nbytes)
            aligned[...] = np.frombuffer(view, dtype=np.uint8)
            view = memoryview(aligned)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o666)
        except OSError as error:
            if error.errno not in _NOT_DIRECT:
                raise
            direct = False
        else:
            try:
                written = os.write(fd, view)
            except OSError as error:
                if error.errno not in _NOT_DIRECT:
                    raise
                written, direct = -1, False
            finally:
                os.close(fd)
            if written == view.nbytes:
                return True
    with open(path, "wb") as f:  # truncates whatever a refused or short direct write left
        f.write(view)
    return direct


def read_file(path: Path, out: np.ndarray) -> bool:
    """Fill ``out`` (C-contiguous) with the first ``out.nbytes`` bytes of the file at ``path``,
    with ``O_DIRECT`` where :func:`write_file` would write it; False if the file is shorter."""
    view = memoryview(out).cast("B")
    if DIRECT_IO and view.nbytes % DIRECT_ALIGN == 0 and out.ctypes.data % DIRECT_ALIGN == 0:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
        except OSError as error:
            if error.errno not in _NOT_DIRECT:
                raise
        else:
            try:
                got = os.readv(fd, [view])
            except OSError as error:
                if error.errno not in _NOT_DIRECT:
                    raise
                got = -1
            finally:
                os.close(fd)
            if got == view.nbytes:
                return True
    with open(path, "rb", buffering=0) as f:
        filled = 0
        while filled < view.nbytes:
            got = f.readinto(view[filled:])
            if not got:
                return False
            filled += got
    return True


def write_chunk(release: "str | ChunkWriter", chunk: int, start: int, block_answers: Mapping[str, np.ndarray],
                query_answers: np.ndarray, unit_ids: np.ndarray,
                pack_measurements: Mapping[str, np.ndarray] | None = None) -> None:
    """Write release chunk ``chunk`` (rows ``start:start + len(unit_ids)``): the answers of the
    blocks in ``block_answers`` (exactly those the store holds, :func:`stored_blocks`), the
    query answers and the unit ids (``unit_ids`` and its coordinate twin ``unit``, absent from
    a release laid out before it, resumed), then, last, ``chunks/done[chunk] = 1``.
    ``release`` is the store's path (written before this returns) or an open
    :class:`ChunkWriter` (queued: written by the time it is flushed). Runs in a task, on any
    worker; the rows are whole zarr chunks that no other chunk touches. ``pack_measurements``:
    ``{pack_id: rows}`` of ``packs/<pack_id>/measurements`` (a packed plan's release)."""
    if isinstance(release, ChunkWriter):
        release.write(chunk, start, block_answers, query_answers, unit_ids, pack_measurements)
        return
    with ChunkWriter(release) as writer:
        writer.write(chunk, start, block_answers, query_answers, unit_ids, pack_measurements)


class ChunkWriter:
    """The release store at ``release_path`` opened by a task to write its chunks
    (:func:`write_chunk`); arrays are looked up once, on first use. Use it as a context
    manager (or :meth:`close` it): leaving it waits until everything is written.

    Answer arrays, numeric unit ids and the done markers are laid out uncompressed
    (:func:`distfit.stores.release.create_release`): a chunk's file is the rows' little-endian
    bytes in C order, padded to the chunk's shape with the fill value at the array's end
    (:func:`raw_chunks`). Whole chunks of such an array are written as exactly those bytes
    (:meth:`write_rows`, :func:`write_file`: direct I/O where it applies), atomically as zarr
    does (a temporary file renamed over the chunk's key), without zarr's encoding pipeline:
    1.5 instead of 8.4 ms of CPU per 10 MB chunk here through the page cache, 0.1 ms direct,
    and ~0.3 instead of ~4 ms per id or done-marker write. Anything else (string ids, the zstd
    ids of a store laid out before, resumed; a part of a chunk) is written by zarr.

    A chunk's writes run in order on a thread of their own, the done marker last, while the
    task computes the next chunk; :meth:`write` returns once the previous chunk's writes are
    done, so at most one chunk is in flight (memory stays flat however slow the disk) and a
    direct write's wait on the device overlaps the arithmetic. A failed write is raised by the
    next :meth:`write`, :meth:`flush` or :meth:`close`; the chunk it belonged to is not marked
    done."""

    def __init__(self, release_path: str) -> None:
        self._path = Path(release_path)
        self._root = zarr.open_group(store=str(release_path), mode="r+", zarr_format=3)
        self._arrays: dict[str, Any] = {}
        self._direct = DIRECT_IO
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="distfit-chunk-writer")
        self._in_flight: Any = None  # the Future of the last chunk queued

    def _array(self, name: str):
        if name not in self._arrays:
            self._arrays[name] = self._root[name] if name != "unit" or "unit" in self._root else None
        return self._arrays[name]

    def write(self, chunk: int, start: int, block_answers: Mapping[str, np.ndarray], query_answers: np.ndarray,
              unit_ids: np.ndarray, pack_measurements: Mapping[str, np.ndarray] | None = None) -> None:
        """Queue the chunk's writes (:func:`write_chunk`); returns once the previous chunk is
        written (raising its error, if any)."""
        rows = {f"blocks/{block_id}/answers": answers for block_id, answers in block_answers.items()}
        rows.update({f"packs/{pack_id}/measurements": m for pack_id, m in (pack_measurements or {}).items()})
        rows["queries/answers"] = query_answers
        rows.update({name: unit_ids for name in ("unit_ids", "unit") if self._array(name) is not None})
        self.write_arrays(chunk, start, rows)

    def write_arrays(self, chunk: int, start: int, rows: Mapping[str, np.ndarray]) -> None:
        """Queue ``store[name][start:start + len(r)] = r`` for every ``name: r`` of ``rows``, in
        order, then, last, ``chunks/done[chunk] = 1``; returns once the previous chunk is written
        (raising its error, if any). What any chunked store of this lifecycle writes per chunk
        (the release's :meth:`write`, the estimate's chunks: :mod:`distfit.stores.estimate`)."""
        jobs = [(name, start, r) for name, r in rows.items()]
        jobs.append(("chunks/done", chunk, np.ones(1, dtype=np.uint8)))  # last: the chunk is complete
        unopened = [name for name, _, _ in jobs if name not in self._arrays]
        if len(unopened) > 1:  # a release's blocks: opened in one zarr call, not one each
            self._arrays.update(open_arrays(self._root, unopened))
        previous, self._in_flight = self._in_flight, self._pool.submit(self._write_all, chunk, jobs)
        if previous is not None:
            previous.result()

    def _write_all(self, chunk: int, jobs: list[tuple[str, int, np.ndarray]]) -> None:
        digested = self._digested()
        table = np.zeros((1, len(digested), 32), dtype=np.uint8) if digested else None
        for name, start, rows in jobs:
            if table is not None and name in digested:  # hashed from the very buffer written
                table[0, digested.index(name)] = np.frombuffer(chunk_digest(name, start, rows), dtype=np.uint8)
            if name == "chunks/done" and table is not None:  # the chunk's digests, then its done marker
                # (an array the chunk did not write keeps a zero digest, which no rows hash to)
                self.write_rows(DIGESTS, chunk, table)
            self.write_rows(name, start, rows)

    def _digested(self) -> list[str]:
        """The arrays whose chunk digests the store holds (:data:`DIGESTS`), in its order, or []."""
        if "_digested" not in self._arrays:
            arr = self._root[DIGESTS] if DIGESTS in self._root else None
            self._arrays["_digested"] = list(arr.attrs["arrays"]) if arr is not None else []
        return self._arrays["_digested"]

    def flush(self) -> None:
        """Wait until every queued write is done; raise the first error."""
        previous, self._in_flight = self._in_flight, None
        if previous is not None:
            previous.result()

    def close(self) -> None:
        try:
            self.flush()
        finally:
            self._pool.shutdown(wait=True)

    def __enter__(self) -> "ChunkWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None:
            self.close()
            return
        with contextlib.suppress(Exception):  # the task's own error is the one to report
            self.close()

    def write_rows(self, name: str, start: int, rows: np.ndarray) -> None:
        """``array[start:start + len(rows)] = rows``: as raw chunk files where that is exact
        (:func:`raw_chunks`: whole chunks of rows, or the rows up to the array's end), else
        through zarr."""
        arr = self._array(name)
        rows = np.asarray(rows)
        stop = start + rows.shape[0]
        chunks = tuple(int(c) for c in arr.chunks)
        if not (raw_chunks(arr) and rows.shape[1:] == tuple(arr.shape[1:]) and start % chunks[0] == 0
                and (stop % chunks[0] == 0 or stop == arr.shape[0])):
            arr[start:stop] = rows
            return
        dtype = np.dtype(arr.dtype).newbyteorder("<")
        for r0 in range(start, stop, chunks[0]):
            piece = rows[r0 - start:min(r0 + chunks[0], stop) - start]
            if piece.shape[0] < chunks[0]:  # the array's edge: stored at the chunk's shape, padded
                padded = np.full(chunks, arr.metadata.fill_value, dtype=dtype)
                padded[:piece.shape[0]] = piece
                piece = padded
            data = np.ascontiguousarray(piece, dtype=dtype)
            key = _chunk_file(self._path, name, arr, r0 // chunks[0])
            key.parent.mkdir(parents=True, exist_ok=True)
            partial = key.with_name(f"{key.name}.{uuid.uuid4().hex}.partial")
            try:
                self._direct = write_file(partial, data, self._direct)
                os.replace(partial, key)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(partial)
                raise


def raw_chunks(arr: zarr.Array) -> bool:
    """Whether each chunk file of ``arr`` is its rows' raw bytes: a numeric array stored
    uncompressed (the one ``bytes`` codec, little-endian) and chunked over its first axis only;
    a chunk at the array's end is stored at the full chunk shape, padded with the fill value."""
    codecs = arr.metadata.codecs
    dtype = np.dtype(arr.dtype)
    endian = getattr(codecs[0], "endian", None) if codecs else None
    return (len(codecs) == 1 and isinstance(codecs[0], BytesCodec)
            and (str(getattr(endian, "value", endian)) == "little" or (endian is None and dtype.itemsize == 1))
            and dtype.kind in "fiub" and len(arr.shape) >= 1
            and tuple(int(c) for c in arr.chunks[1:]) == tuple(int(n) for n in arr.shape[1:]))


def _chunk_file(root: Path, name: str, arr: zarr.Array, index: int) -> Path:
    return root / name / arr.metadata.encode_chunk_key((index,) + (0,) * (len(arr.shape) - 1))


def read_rows(root: Path, name: str, arr: zarr.Array, where: slice) -> np.ndarray:
    """``arr[where]`` (a slice of rows starting on a chunk boundary) read from the raw chunk
    files where :func:`raw_chunks` allows, each file read straight into the result
    (:func:`read_file`: direct I/O where it applies); else, or if a file is missing or short,
    through zarr."""
    start, stop = where.start or 0, min(int(arr.shape[0]), where.stop if where.stop is not None else arr.shape[0])
    rows = int(arr.chunks[0])
    if not raw_chunks(arr) or start % rows or stop <= start:
        return arr[where]
    first, last = start // rows, (stop - 1) // rows
    dtype = np.dtype(arr.dtype).newbyteorder("<")
    shape = ((last - first + 1) * rows,) + tuple(int(n) for n in arr.shape[1:])
    out = aligned_empty(int(np.prod(shape)) * dtype.itemsize).view(dtype).reshape(shape)
    for k, index in enumerate(range(first, last + 1)):
        try:
            if not read_file(_chunk_file(root, name, arr, index), out[k * rows:(k + 1) * rows]):
                return arr[where]
        except FileNotFoundError:
            return arr[where]
    return out[:stop - start]


def raw_reader(root: Path) -> Reader:
    """How a root check (:func:`distfit.stores.sealing.check_root`) reads the store at ``root``:
    each slab through :func:`read_rows` (the raw chunk files, where the array has them), a 0-d
    array through zarr. The root's large arrays are its small arrays of one zarr chunk per chunk
    of units (``chunks/digests``, ``chunks/done``: 245 files each at 1M PL94 units), which zarr
    reads at about 0.25 ms of CPU a chunk (0.06 CPU-s an array; raw: 0.006); the digest is the
    same whoever reads (:func:`distfit.stores.checksum.compute_checksum`)."""
    return lambda name, arr, where: read_rows(root, name, arr, where) if isinstance(where, slice) else arr[where]


def chunk_arrays(root: zarr.Group) -> list[str]:
    """The arrays the chunks write (:func:`write_chunk`), sorted: the stored blocks' answers,
    the packs' measurements, ``chunks/done``, ``queries/answers``, ``unit`` (when laid out),
    ``unit_ids`` and ``chunks/digests`` (when laid out)."""
    names = [f"blocks/{b}/answers" for b in stored_blocks(root)] + [
        "queries/answers", "unit_ids", *(["unit"] if "unit" in root else []), "chunks/done",
        *([DIGESTS] if DIGESTS in root else [])]
    if "packs" in root:  # a packed plan's release: each pack's measurements
        names += [f"packs/{p}/measurements" for p in root["packs"].group_keys()]
    return sorted(names)


def pending_chunks(root: zarr.Group) -> list[int]:
    """The chunks of a store written chunk by chunk not yet marked done in ``chunks/done``, in
    order (what ``--resume`` computes)."""
    return np.flatnonzero(np.asarray(root["chunks/done"][...]) == 0).tolist()


def stored_blocks(root: zarr.Group) -> tuple[str, ...]:
    """The blocks whose ``answers`` array the store holds (all but the derived ones; all of them
    in a release laid out before derived blocks), sorted."""
    # the store's keys, listed and checked in one zarr call, not two zarr calls a block opening
    # every group (Adult's 470 blocks: 0.7-1.4 s each time, 4 times a release)
    return tuple(sorted(b for b, held in zip(*sync(_answer_keys(root))) if held))


async def _answer_keys(root: zarr.Group) -> tuple[list[str], list[bool]]:
    """The block groups of ``root`` (the ``blocks`` group's child keys) and whether each holds an
    ``answers`` array (its ``zarr.json`` exists), read concurrently."""
    prefix = f"{root.path}/blocks".lstrip("/")
    names = [name async for name in root.store.list_dir(prefix)]
    names = [name for name in names if name != "zarr.json"]
    held = await asyncio.gather(*(root.store.exists(f"{prefix}/{name}/answers/zarr.json") for name in names))
    return names, list(held)


class ChunkSync:
    """fsync each finished chunk's files on a driver thread while later chunks are computed.

    Without it the seal's fsync (``fsync_tree``) waits for every written byte to reach the
    disk at the very end (about a second per 500 MB here); with it the writeback overlaps the
    chunk tasks and the seal finds the files clean. An optimisation only: errors are ignored
    here (a file not there yet, a path this code cannot guess), because the seal still fsyncs
    every file and directory of the store and raises on failure. ``arrays``: the arrays the
    chunks write (default: a release's, :func:`chunk_arrays`; an estimate store names its own)."""

    def __init__(self, root: zarr.Group, path: Path, units: int, chunk_units: int,
                 arrays: Sequence[str] | None = None) -> None:
        self._path = path
        self._units, self._chunk_units = units, chunk_units
        self._arrays = []
        names = chunk_arrays(root) if arrays is None else sorted(arrays)
        for name, arr in open_arrays(root, names).items():
            self._arrays.append((name, arr.metadata, tuple(int(c) for c in arr.chunks), tuple(arr.shape)))
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="distfit-fsync")
        #: Every file fsynced here, with its signature then (``fsync_tree`` skips the unchanged).
        self.synced: dict[str, tuple[int, ...]] = {}

    def _files(self, chunk: int) -> Iterator[Path]:
        start = chunk * self._chunk_units
        stop = min(start + self._chunk_units, self._units)
        for name, metadata, chunks, shape in self._arrays:
            if name in ("chunks/done", DIGESTS):  # one zarr chunk per chunk of units
                rows = range(chunk, chunk + 1)
            else:
                rows = range(start // chunks[0], -(-stop // chunks[0]))
            cols = range(-(-shape[1] // chunks[1])) if len(shape) == 2 else [None]
            for i in rows:
                for j in cols:
                    key = metadata.encode_chunk_key((i,) + (0,) * (len(shape) - 1) if j is None else (i, j))
                    yield self._path / name / key

    def _sync(self, chunk: int) -> None:
        for file in self._files(chunk):
            with contextlib.suppress(OSError):
                self.synced[str(file)] = fsync_file(str(file))

    def __call__(self, chunk: int) -> None:
        self._pool.submit(self._sync, chunk)

    def close(self, cancel: bool = False) -> dict[str, tuple[int, ...]]:
        """Wait for the queued fsyncs (call before the seal's own fsync); ``cancel``: drop the
        ones not started (the release failed). Returns :attr:`synced` (what the seal's
        ``fsync_tree`` may skip)."""
        self._pool.shutdown(wait=True, cancel_futures=cancel)
        return self.synced


class ReleaseHasher:
    """The seal's checksum computed while the chunks are written, on a driver thread.

    :func:`distfit.stores.checksum.compute_checksum` over the store, in its documented order,
    with a reader that waits until the rows of a slab of an array the chunks write
    (:func:`chunk_arrays`) belong to chunks reported done (:meth:`chunk_done`; the ones done
    when it starts, on ``--resume``, count) and then reads them back, hot in the page cache.
    ``chunks/done`` is hashed as the all-ones it must hold when sealed, which :func:`seal`
    checks before taking the digest. The first answer array in hash order (for a single-block
    plan the only one, ``queries/answers``) is hashed as its chunks land, so the seal no
    longer reads and hashes the whole store after the last chunk (2.6 GB at 1M PL94 units);
    later arrays are hashed once their chunks are all in, read as their chunks land up to
    :data:`PREFETCH_BYTES` and kept until hashed (on another thread), the rest read then; raw
    chunk files are read straight into the slab (:func:`read_rows`). Memory: one slab
    (:data:`SEAL_READ_BYTES`) read ahead, and at most :data:`PREFETCH_BYTES` kept.
    The digest is the one a reading of the finished store gives (``compute_checksum``, what
    every ``verify_release`` recomputes). ``arrays``: the arrays the chunks write (default: a
    release's, :func:`chunk_arrays`; an estimate store, :mod:`distfit.stores.estimate`, names
    its own: any store laid out with whole-chunk rows and ``chunks/done``)."""

    def __init__(self, root: zarr.Group, path: Path, units: int, chunk_units: int,
                 arrays: Sequence[str] | None = None) -> None:
        self._path = Path(path)
        self._done = np.asarray(root["chunks/done"][...]) == 1
        self._chunk_units = chunk_units
        self._written = set(chunk_arrays(root) if arrays is None else arrays)
        # the arrays after the first in hash order, read ahead as their chunks land (PREFETCH_BYTES)
        self._prefetch: dict[str, zarr.Array] = {}
        budget = PREFETCH_BYTES
        digested = digested_arrays(root[DIGESTS].attrs if DIGESTS in root else None)  # hashed as digests, not read
        for name in sorted(self._written - {"chunks/done"} - digested)[1:]:
            arr = root[name]
            size = int(np.prod(arr.shape)) * np.dtype(arr.dtype).itemsize
            if size > budget or not raw_chunks(arr) or int(arr.chunks[0]) != chunk_units:
                break
            self._prefetch[name] = arr
            budget -= size
        self._kept: dict[tuple[str, int], np.ndarray] = {}
        self._fetches: dict[int, Any] = {}
        self._reader = (ThreadPoolExecutor(max_workers=1, thread_name_prefix="distfit-release-prefetch")
                        if self._prefetch else None)
        self._condition = threading.Condition()
        self._cancelled = False
        self._digest: str | None = None
        self._error: BaseException | None = None
        self._claims: Mapping[str, Any] | None = None  # the stated attrs, given by the seal (result)
        self._thread = threading.Thread(target=self._run, args=(root,), name="distfit-release-checksum", daemon=True)
        self._thread.start()

    def _run(self, root: zarr.Group) -> None:
        try:
            self._digest = compute_checksum(root, attrs=self._sealed_claims, threads=SEAL_READ_THREADS,
                                            read_bytes=SEAL_READ_BYTES, read=self._read)
        except BaseException as error:  # noqa: BLE001 - result() reports it (the seal then rereads)
            self._error = error

    def _read(self, name: str, arr: zarr.Array, where: Any) -> np.ndarray:
        if name == "chunks/done":
            return np.ones(arr.shape, dtype=arr.dtype)  # as sealed (seal checks it)
        if name in self._written and isinstance(where, slice):
            per_chunk = 1 if name == DIGESTS else self._chunk_units  # the digests: a row per chunk
            first = where.start // per_chunk
            last = (min(where.stop, arr.shape[0]) - 1) // per_chunk
            with self._condition:
                self._condition.wait_for(lambda: self._cancelled or self._done[first:last + 1].all())
                if self._cancelled:
                    raise RuntimeError("release checksum cancelled")
                fetches = [self._fetches.get(chunk) for chunk in range(first, last + 1)]
            kept = self._take(name, first, fetches)
            return read_rows(self._path, name, arr, where) if kept is None else kept
        return arr[where]

    def _fetch(self, chunk: int) -> None:
        start = chunk * self._chunk_units
        for name, arr in self._prefetch.items():
            self._kept[(name, chunk)] = read_rows(self._path, name, arr, slice(start, start + self._chunk_units))

    def _take(self, name: str, first: int, fetches: list) -> np.ndarray | None:
        """The rows of chunks ``first, first + 1, ...`` (one per fetch) of ``name`` as read
        ahead, removed from the kept ones; None where any is missing (not read ahead: done
        before this session, or its read failed)."""
        if name not in self._prefetch or any(f is None for f in fetches):
            return None
        for fetch in fetches:
            if fetch.exception() is not None:  # waits for it
                return None
        pieces = [self._kept.pop((name, first + k), None) for k in range(len(fetches))]
        return None if any(p is None for p in pieces) else np.concatenate(pieces)

    def chunk_done(self, chunk: int) -> None:
        """Chunk ``chunk`` is written (its task returned): its rows may be hashed (and the
        arrays hashed later read ahead)."""
        with self._condition:
            if self._reader is not None and not self._cancelled:
                self._fetches[chunk] = self._reader.submit(self._fetch, chunk)
            self._done[chunk] = True
            self._condition.notify_all()

    def _stop_reading(self) -> None:
        if self._reader is not None:
            self._reader.shutdown(wait=True, cancel_futures=True)
        self._kept.clear()

    def _sealed_claims(self) -> Mapping[str, Any]:
        """The stated attrs the digest ends with (:func:`distfit.stores.sealing.stated_attrs` of
        the attrs the store is sealed with): known only at the seal, so the thread waits here
        once the arrays are hashed."""
        with self._condition:
            self._condition.wait_for(lambda: self._cancelled or self._claims is not None)
            if self._cancelled:
                raise RuntimeError("release checksum cancelled")
            return self._claims

    def result(self, claims: Mapping[str, Any]) -> str | None:
        """The digest over the arrays and ``claims`` (the stated attrs the store is sealed
        with), once every chunk is done (waits); None if hashing failed."""
        with self._condition:
            self._claims = claims
            self._condition.notify_all()
        self._thread.join()
        self._stop_reading()
        return self._digest if self._error is None else None

    def cancel(self) -> None:
        """Stop hashing (the release failed) and wait for the thread to end."""
        with self._condition:
            self._cancelled = True
            self._condition.notify_all()
        self._thread.join()
        self._stop_reading()


def seal_chunked(root: zarr.Group, path: Path, *, fsync: bool, hasher: ReleaseHasher | None = None,
                 attrs: Mapping[str, Any] | None = None, synced: Mapping[str, tuple[int, ...]] | None = None,
                 check: Callable[[], None] | None = None) -> str:
    """Seal a store whose chunks are all written (a release, an estimate): check every
    ``chunks/done`` entry is 1 (read as raw files: through zarr, 245 of them took 0.05-0.08 s;
    else RuntimeError naming the missing chunks), take the store checksum (the ``hasher``'s,
    or, without one or if it failed, :func:`distfit.stores.checksum.compute_checksum` read as
    :data:`SEAL_READ_BYTES`), fsync the store (but the files ``synced`` as they landed and not
    written since: :class:`ChunkSync`, ``fsync_tree``), then write ``attrs`` (JSON) with
    ``checksum``, ``sealed`` and ``complete=True`` last, and fsync what that wrote (the root's
    ``zarr.json``, replaced atomically, and the root directory: the rest of the tree was
    fsynced just before; a second ``fsync_tree`` took 0.17 s of an estimate's seal at 1M PL94
    units). ``check()``: the caller's check that its inputs are unchanged (it raises to refuse
    the seal), run on a thread meanwhile (the plan's checksum: 0.07 s, no longer after the
    rest); its error is the one raised, the ``hasher`` cancelled and nothing marked. Returns
    the checksum."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="distfit-seal-check") as pool:
        checking = pool.submit(check) if check is not None else None
        try:
            done = read_rows(Path(path), "chunks/done", root["chunks/done"], slice(None))
            if not (done == 1).all():
                missing = np.flatnonzero(done != 1)
                raise RuntimeError(f"{path}: chunks {missing[:5].tolist()} not written; cannot seal")
            sealed_attrs = {**dict(root.attrs), **jsonable(dict(attrs or {}))}
            checksum = hasher.result(stated_attrs(sealed_attrs, root)) if hasher is not None else None
            if checksum is None:
                checksum = seal_checksum(root, sealed_attrs, stated_attrs, threads=SEAL_READ_THREADS,
                                         read_bytes=SEAL_READ_BYTES)
            if fsync:
                fsync_tree(path, synced)
            if checking is not None:
                checking.result()
        except BaseException:
            if hasher is not None:
                hasher.cancel()
            refused = checking.exception() if checking is not None else None  # waits for it
            if refused is not None:
                raise refused from None
            raise
    root.attrs.update({**jsonable(dict(attrs or {})), "checksum": checksum, "sealed": utc_now(), "complete": True})
    if fsync:
        fsync_file(str(Path(path) / "zarr.json"))
        fsync_dir(Path(path))
    return checksum


__all__ = [
    "ChunkSync",
    "ChunkWriter",
    "ReleaseHasher",
    "DIRECT_ALIGN",
    "DIRECT_IO",
    "PREFETCH_BYTES",
    "SEAL_READ_BYTES",
    "SEAL_READ_THREADS",
    "aligned_empty",
    "chunk_arrays",
    "pending_chunks",
    "raw_chunks",
    "raw_reader",
    "read_file",
    "read_rows",
    "seal_chunked",
    "stored_blocks",
    "write_chunk",
    "write_file",
]
