"""Release stores: the layout, writing one chunk at a time, sealing, and the reader.

Layout (**contract**, DESIGN.md section 4), a Zarr v3 group::

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
      unit                       (units,)     coordinate: the unit ids again (same dtype)
      queries/query              (m,)         coordinate: the query labels (strings), when
                                              ``labels`` is not None
      blocks/<block_id>/block_query (m_b,)    coordinate: the label of each block row's query
                                              (when ``labels`` is not None)

Dimension names (Zarr v3 ``dimension_names``, :data:`DIMS`, so that ``xr.open_datatree(path,
engine="zarr")`` opens the store whole): ``unit`` (units), ``query`` (m), ``block_query`` (m_b,
per block group), ``chunk`` (n_chunks). xarray makes an array named like a dimension its
coordinate, and a group's coordinates reach its subgroups: the root ``unit`` labels every
answer array (``tree["queries"].dataset.sel(unit=some_id)``). ``unit`` repeats ``unit_ids``
(which keeps its name: the layout is a contract) and is written by each chunk next to it.
Releases written before the coordinates (no ``unit``, ``queries/query``, ``block_query``, no
dimension names) read and verify as before; a resumed one is finished in its own layout.

Answer arrays are chunked over units only, ``(r, m_b)`` with ``r`` the largest divisor of
``chunk_units`` (the data's chunk size) that keeps a chunk under 16 MiB (:func:`answer_chunks`),
so each release chunk (one task) owns whole zarr chunks and no two tasks touch the same file.
Answer arrays are stored uncompressed (:data:`ANSWER_COMPRESSORS`: noisy float64 does not
compress). Query labels are a JSON attr, not an array: fixed-width UTF-32 has no Zarr v3
specification. The checksum is :func:`distfit.stores.checksum.compute_checksum` over every array
of the store (the same format as the plan's), written when the release is sealed.

Never stored: the counts, true marginals or true answers, the entropy, the ``--seed`` (a seeded
release records only ``private=False``), and no attr derived from the data beyond ``units``.

Store lifecycle (the orchestration is :func:`distfit.release.job.run_release`):
:func:`create_release` lays out an empty store with ``complete=False`` (every reader refuses
it); :func:`write_chunk` writes one chunk's arrays and, last, its ``chunks/done`` entry;
:class:`ChunkSync` fsyncs finished chunks' files while later chunks run; :func:`seal` checks
the plan is unchanged and every chunk done, then writes the checksum and ``complete=True``.
:func:`open_resumable` reopens an incomplete store for ``--resume`` after checking it belongs
to the same plan and data; :func:`release_state` says what is at a path. :func:`read_release`
and :func:`verify_release` read a sealed store.
"""
from __future__ import annotations

import contextlib
import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import zarr

from distfit import __version__
from distfit.release.noise import block_positions
from distfit.stores.checksum import compute_checksum
from distfit.stores.files import (
    open_store,
    check_format,
    chunk_shape,
    fsync_file,
    fsync_tree,
    jsonable,
    root_attrs_on_disk,
    utc_now,
    write_array,
)
from distfit.stores.plan import verify_checksum

FORMAT = "release"
FORMAT_VERSION = 1

#: Compressors of the answer arrays: none (raw little-endian float64). Noisy answers do not
#: compress: zarr's default zstd saved 3 % of the bytes of a PL94 release, for ~0.08 s of encoding
#: per 4096 x 319 chunk in the tasks (about 135 MB/s here) and ~0.02-0.04 s of decoding it again in
#: the seal's checksum read. The checksum is over the decoded values, so it does not depend on this
#: choice, and readers decode whatever codecs a store records (older zstd stores read as before).
ANSWER_COMPRESSORS: Any = None

#: Dimension names (Zarr v3 ``dimension_names``) of every release array, by path pattern
#: (module docstring); ``<block_id>`` stands for every block.
DIMS: dict[str, tuple[str, ...]] = {
    "blocks/<block_id>/answers": ("unit", "block_query"),
    "blocks/<block_id>/block_query": ("block_query",),
    "queries/answers": ("unit", "query"),
    "queries/variances": ("query",),
    "queries/query": ("query",),
    "unit_ids": ("unit",),
    "unit": ("unit",),
    "chunks/done": ("chunk",),
}

#: How the seal reads the store for its checksum (:func:`distfit.stores.checksum.compute_checksum`,
#: the same digest as every reader's): whole zarr chunks of answers, at least this many bytes a
#: read, on one thread, the next slab read while this one is hashed. A release is a few large
#: arrays, so the plan's default (8 threads, 64 MiB slabs) only adds memory: 0.5-0.6 s this way
#: for a 100k-unit PL94 release here (benchmarks/README.md).
SEAL_READ_BYTES = 8 * 2**20
SEAL_READ_THREADS = 1

PathLike = str | os.PathLike


class ReleaseError(ValueError):
    """A path that is not a readable, complete (sealed) release store; the message says why."""


# --------------------------------------------------------------------------------------------
# writing


def answer_chunks(chunk_units: int, width: int) -> tuple[int, int]:
    """Chunks of a (units, width) float64 answer array: rows dividing ``chunk_units``."""
    rows, cols = chunk_shape((chunk_units, width), 8)
    rows = next(r for r in range(min(rows, chunk_units), 0, -1) if chunk_units % r == 0)
    return rows, cols


def create_release(path: Path, *, plan, plan_path: str, data, blocks: Mapping[str, Any], private: bool,
                   labels: list[str] | None) -> zarr.Group:
    """Lay out an empty, incomplete release store at ``path`` (driver only) and return its root
    group, open for writing. ``labels`` are the query labels (module docstring). On any error
    nothing is left at ``path``."""
    try:
        _lay_out(path, plan=plan, plan_path=plan_path, data=data, blocks=blocks, private=private, labels=labels)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    return zarr.open_group(store=str(path), mode="r+", zarr_format=3)


def _lay_out(path: Path, *, plan, plan_path: str, data, blocks, private: bool, labels) -> None:
    units, chunk_units = data.units, data.chunk_units
    n_chunks = -(-units // chunk_units)
    m = len(plan.queries_targets)
    positions = block_positions(plan)
    config = {"write_empty_chunks": True}
    root = zarr.open_group(store=str(path), mode="w-", zarr_format=3)
    root.attrs.update({"distfit_format": FORMAT, "format_version": FORMAT_VERSION, "complete": False})
    label_array = None if labels is None else np.array(list(labels), dtype=object)  # text coordinates
    block_group = root.create_group("blocks")
    for block_id, block in blocks.items():
        m_b = block.recon.shape[0]
        g = block_group.create_group(block_id)
        g.create_array("answers", shape=(units, m_b), dtype=np.float64,
                       chunks=answer_chunks(chunk_units, m_b), compressors=ANSWER_COMPRESSORS,
                       dimension_names=DIMS["blocks/<block_id>/answers"], config=config)
        if label_array is not None:
            write_array(g, "block_query", label_array[np.asarray(block.query_index, dtype=np.int64)],
                        dims=DIMS["blocks/<block_id>/block_query"])
        g.attrs.update(jsonable({"attributes": list(block.attributes),
                                  "block_index": positions[block_id]}))
    queries = root.create_group("queries")
    queries.create_array("answers", shape=(units, m), dtype=np.float64,
                         chunks=answer_chunks(chunk_units, m), compressors=ANSWER_COMPRESSORS,
                         dimension_names=DIMS["queries/answers"], config=config)
    write_array(queries, "variances", np.asarray(plan.queries_variances, dtype=np.float64),
                dims=DIMS["queries/variances"])
    if label_array is not None:
        write_array(queries, "query", label_array, dims=DIMS["queries/query"])
    queries.attrs["labels"] = labels
    ids_dtype = np.dtype(data.unit_ids.dtype)
    if ids_dtype.kind in "TUO":
        ids_dtype = str  # variable-length UTF-8 (the Zarr v3 "string" data type)
    elif ids_dtype.kind not in "iuf":
        raise ValueError(f"{data.path}: unit_ids of dtype {ids_dtype} are not supported (numbers or strings)")
    for name in ("unit_ids", "unit"):  # written by the chunks (write_chunk)
        root.create_array(name, shape=(units,), dtype=ids_dtype, chunks=(chunk_units,),
                          dimension_names=DIMS[name], config=config)
    root.create_group("chunks").create_array(
        "done", shape=(n_chunks,), dtype=np.uint8, chunks=(1,), fill_value=0,
        dimension_names=DIMS["chunks/done"], config=config)
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


def write_chunk(release_path: str, chunk: int, start: int, block_answers: Mapping[str, np.ndarray],
                query_answers: np.ndarray, unit_ids: np.ndarray) -> None:
    """Write release chunk ``chunk`` (rows ``start:start + len(unit_ids)``): every block's
    answers, the query answers and the unit ids (``unit_ids`` and its coordinate twin ``unit``,
    absent from a release laid out before it, resumed), then, last, ``chunks/done[chunk] = 1``.
    Runs in a task, on any worker; the rows are whole zarr chunks that no other chunk touches."""
    stop = start + len(unit_ids)
    root = zarr.open_group(store=release_path, mode="r+", zarr_format=3)
    for block_id, answers in block_answers.items():
        root[f"blocks/{block_id}/answers"][start:stop] = answers
    root["queries/answers"][start:stop] = query_answers
    root["unit_ids"][start:stop] = unit_ids
    if "unit" in root:
        root["unit"][start:stop] = unit_ids
    root["chunks/done"][chunk] = 1


def pending_chunks(root: zarr.Group) -> list[int]:
    """The chunks not yet marked done in ``chunks/done``, in order."""
    return np.flatnonzero(np.asarray(root["chunks/done"][...]) == 0).tolist()


def _is_release_store(path: Path) -> bool:
    attrs = root_attrs_on_disk(path)
    return attrs is not None and attrs.get("distfit_format") == FORMAT


def release_state(path: Path) -> str:
    """``"absent"``, ``"sealed"`` or ``"incomplete"``; FileExistsError for anything else."""
    if not (path.exists() or path.is_symlink()):
        return "absent"
    if not path.is_dir() or not _is_release_store(path):
        raise FileExistsError(
            f"{path}: already exists and is not a distfit release store; refusing to replace it")
    return "sealed" if root_attrs_on_disk(path).get("complete") is True else "incomplete"


def check_replaceable(path: Path) -> None:
    """Refuse (FileExistsError) to replace anything at ``path`` but a release store."""
    if path.exists() and not (path.is_dir() and _is_release_store(path)):
        raise FileExistsError(f"{path}: is not a distfit release store; refusing to replace it")


def open_resumable(path: Path, *, plan, data, private: bool, blocks: Mapping[str, Any]) -> zarr.Group:
    """Open an incomplete release for ``--resume`` after checking it belongs to these inputs
    (the plan's checksum, seeded or not, the data's schema, units, chunking and ``created``,
    the blocks); ValueError naming what differs."""
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


class ChunkSync:
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
                "queries/answers", "unit_ids", *(["unit"] if "unit" in root else []), "chunks/done"]:
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


def seal(root: zarr.Group, path: Path, *, plan_path: str, plan_checksum: str, fsync: bool) -> str:
    """Verify the plan is unchanged and every chunk done, then checksum and mark complete.

    The plan's checksum is recomputed from its arrays (:func:`distfit.stores.plan.verify_checksum`)
    and must equal ``plan_checksum``, the one audited at the start: a plan rewritten or altered
    in place during the release leaves the release incomplete. Returns the release checksum."""
    ok, stored, recomputed = verify_checksum(plan_path)
    if not ok or stored != plan_checksum:
        raise ValueError(
            f"{plan_path}: the plan changed during the release (checksum {recomputed}, started "
            f"from {plan_checksum}); the release at {path} is left incomplete")
    done = np.asarray(root["chunks/done"][...])
    if not done.all():
        missing = np.flatnonzero(done == 0)
        raise RuntimeError(f"{path}: chunks {missing[:5].tolist()} not written; cannot seal")
    checksum = compute_checksum(root, threads=SEAL_READ_THREADS, read_bytes=SEAL_READ_BYTES)
    if fsync:
        fsync_tree(path)
    root.attrs.update({"checksum": checksum, "sealed": utc_now(), "complete": True})
    if fsync:
        fsync_tree(path)
    return checksum


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
    p, group, attrs = open_store(path, FORMAT, ReleaseError)
    check_format(p, attrs, FORMAT, FORMAT_VERSION, ReleaseError)
    if attrs.get("complete") is not True:
        raise ReleaseError(
            f"{p}: the release is incomplete (interrupted or still running); finish it with "
            "distfit release --resume")
    if not isinstance(attrs.get("checksum"), str):
        raise ReleaseError(f"{p}: the release has no checksum")
    return p, group, attrs


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


__all__ = [
    "ANSWER_COMPRESSORS",
    "FORMAT_VERSION",
    "ChunkSync",
    "DIMS",
    "Release",
    "ReleaseError",
    "answer_chunks",
    "check_replaceable",
    "create_release",
    "open_resumable",
    "pending_chunks",
    "read_release",
    "release_state",
    "seal",
    "verify_release",
    "write_chunk",
]
