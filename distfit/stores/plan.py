"""Plan stores: writing and reading a plan as a Zarr v3 group, atomically, with a checksum.

Layout (**contract**, DESIGN.md section 4)::

    plan.zarr/                 attrs: distfit_format="plan", format_version, spec, schema
                                      ({"attributes": [names], "sizes": [ints]}), alpha,
                                      alpha_exact, rho, composition, created (ISO 8601 UTC),
                                      distfit_version, complete=True, checksum, and any extra
                                      attrs the caller passes (e.g. "account", "planner")
      queries/targets          (m,)       float64
      queries/variances        (m,)       float64
      blocks/<block_id>/basis        (k, d_b)   float64
                       recon        (m_b, k)   float64
                       query_index  (m_b,)     int64
                       sigma        (k, k)     float64
                       targets      (m_b,)     float64
                       variances    (m_b,)     float64
                       profile      (d_b,)     float64
                       attrs: attributes (list of names), alpha, lower_bound, solver (dict)

Writing is atomic. :class:`PlanWriter` builds the store in a *staging* directory next to the
final path (``<path>.incomplete-<random>``), one block at a time (``write_block``: results
stream in as blocks complete; the driver never holds all of them), then ``finish`` computes
the checksum, writes the root attrs with ``complete=True`` and renames the staging directory
into place. A writer killed mid-write leaves only the ``*.incomplete-*`` directory, which
:func:`read_plan` refuses; an exception inside ``with PlanWriter(...)`` deletes it. With
``overwrite=True`` the old plan is renamed aside (``<path>.replaced-<random>``) only once the new
one is complete, the new one is renamed into place, and only then is the old one deleted.
(Directories cannot be swapped in one system call portably, so between those two renames -
microseconds - nothing is at the path; a crash exactly there leaves the old plan in the
``.replaced-`` directory and the new one in the ``.incomplete-`` one, and ``read_plan`` of the
missing path names both.)

Checksum (:func:`compute_checksum`; the writer and :func:`verify_checksum` share it): SHA-256,
fed first with ``b"distfit-plan-checksum-v1\\n"``, then, for every array of the store in sorted
order of its path relative to the root (``"blocks/b0/basis"``; Python string order), the header
``f"{path}\\n{dtype}\\n{shape}\\n{nbytes}\\n"`` encoded as UTF-8 - ``dtype`` the little-endian
NumPy type string (``"<f8"``, ``"<i8"``), ``shape`` the sizes joined by commas (``"3,4"``;
``""`` for a scalar), ``nbytes`` the byte count of the data - followed by the array's bytes in
C order, little-endian. A 1-d variable-length string array (the ``string`` data type, e.g. a
release's unit ids) has the header ``f"{path}\\nstring\\n{n}\\n"`` and then, slab by slab, the
UTF-8 byte lengths of its elements (little-endian uint64) and their UTF-8 bytes. The stored
value is ``"sha256:" + hexdigest``. It covers every array,
not the attrs (the root attrs hold the checksum itself; ``distfit audit`` recomputes alpha,
profiles and variances from the arrays).

Arrays are float64 (``query_index`` int64) with zarr's default codecs; an array of up to
:data:`CHUNK_BYTES` (16 MiB) is one chunk, a larger one is cut into row slabs (whole trailing
axes) of at most that size. Attrs are JSON: :func:`jsonable` converts NumPy scalars and arrays,
tuples, dataclasses and objects with ``to_dict()``; tuples come back as lists.

Streamed planning (``distfit.plan.job``, large plans) also uses the staging store as scratch
space, under ``scratch/`` (not part of the layout above): :meth:`PlanWriter.write_scratch` /
:meth:`~PlanWriter.read_scratch` keep arrays out of the driver's memory (spilled block specs),
:meth:`~PlanWriter.write_draft` stores a block in the block layout before its final scale
(e.g. ``scratch/round-1/<block_id>``), :meth:`~PlanWriter.promote_draft` moves a draft to
``blocks/<block_id>`` (a directory rename; the large arrays are written once) and rewrites the
arrays the scale changes, and :meth:`~PlanWriter.discard_scratch` drops what is no longer
needed. ``finish`` refuses to seal a plan while a draft is still unpromoted, deletes
``scratch/`` and only then computes the checksum, so a finished plan is the same store the
in-memory path writes. The root attrs say ``complete=False`` until ``finish``, so an
interrupted streamed write (a staging directory with some blocks) is refused like any other.

A writer is not thread-safe: write from the driver only (DESIGN.md section 4); its
:meth:`PlanWriter.write_blocks` writes many blocks' files concurrently on zarr's event loop.
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import hashlib
import json
import math
import os
import re
import secrets
import shutil
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import zarr
from zarr.core.sync import sync as zarr_sync

from distfit.stores.files import (
    CHUNK_BYTES,
    REPLACED_MARKER,
    STAGING_MARKER,
    check_format,
    chunk_shape,
    fsync_dir,
    fsync_file,
    fsync_tree,
    is_staging,
    jsonable,
    leftovers,
    move_into_place,
    root_attrs_on_disk,
    utc_now,
    write_array,
)

FORMAT = "plan"
FORMAT_VERSION = 1
CHECKSUM_PREFIX = "sha256:"
_CHECKSUM_DOMAIN = b"distfit-plan-checksum-v1\n"
_READ_BYTES = 64 * 2**20  # how much of an array compute_checksum reads at a time
WRITE_BATCH = 16  # blocks written per round trip to zarr's event loop (PlanWriter.write_blocks)
READ_THREADS = 8  # threads reading arrays ahead of the checksum (compute_checksum)

BLOCK_ARRAYS = ("basis", "recon", "query_index", "sigma", "targets", "variances", "profile")
ROOT_KEYS = (
    "distfit_format", "format_version", "spec", "schema", "alpha", "alpha_exact", "rho",
    "composition", "created", "distfit_version", "complete", "checksum",
)
_BLOCK_ID = re.compile(r"[A-Za-z0-9_.-]+")
SCRATCH = "scratch"  # the staging store's scratch group (streamed planning); never in a finished plan
RESCALED_ARRAYS = ("sigma", "targets", "variances", "profile")  # what promote_draft may rewrite

PathLike = str | os.PathLike


class StoreError(ValueError):
    """A store that is not a readable, complete plan (the message names the path and why)."""


# --------------------------------------------------------------------------------------------
# helpers


def _is_plan_store(path: Path) -> bool:
    attrs = root_attrs_on_disk(path)
    return attrs is not None and attrs.get("distfit_format") == FORMAT


# --------------------------------------------------------------------------------------------
# block records


def _float_array(name: str, value: Any, ndim: int) -> np.ndarray:
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: not convertible to a float64 array ({exc})") from None
    if arr.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d array, got shape {arr.shape}")
    return arr


@dataclass(frozen=True, eq=False)
class BlockRecord:
    """One block of a plan, as stored under ``blocks/<block_id>/`` (DESIGN.md section 4).

    ``basis`` (k, d_b), ``recon`` (m_b, k), ``query_index`` (m_b,) int64 (the workload query
    each row of ``recon`` belongs to), ``sigma`` (k, k), ``targets`` / ``variances`` (m_b,),
    ``profile`` (d_b,); ``attributes`` the block's attribute names, ``alpha`` its privacy cost,
    ``lower_bound`` its certified lower bound, ``solver`` a dict of solver statistics.
    Arrays are converted to float64 / int64; inconsistent shapes raise ``ValueError`` naming
    the field. ``block_id`` must match ``[A-Za-z0-9_.-]+`` (not ``.``/``..``, not ``__...``,
    which zarr reserves).
    """

    block_id: str
    attributes: tuple[str, ...]
    basis: np.ndarray
    recon: np.ndarray
    query_index: np.ndarray
    sigma: np.ndarray
    targets: np.ndarray
    variances: np.ndarray
    profile: np.ndarray
    alpha: float
    lower_bound: float
    solver: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        bid = self.block_id
        if (not isinstance(bid, str) or not _BLOCK_ID.fullmatch(bid) or set(bid) == {"."}
                or bid.startswith("__")):
            raise ValueError(
                f"block_id: {bid!r} is not path-safe (use letters, digits, '_', '.', '-'; "
                "not only dots, not starting with '__')")
        if isinstance(self.attributes, str):
            raise ValueError(f"attributes: expected a sequence of names, got the string {self.attributes!r}")
        try:
            attributes = tuple(str(a) if isinstance(a, np.str_) else a for a in self.attributes)
        except TypeError:
            raise ValueError(f"attributes: expected a sequence of names, got {self.attributes!r}") from None
        if not all(isinstance(a, str) for a in attributes):
            raise ValueError(f"attributes: names must be strings, got {self.attributes!r}")
        set_ = object.__setattr__
        set_(self, "attributes", attributes)

        basis = _float_array("basis", self.basis, 2)
        recon = _float_array("recon", self.recon, 2)
        sigma = _float_array("sigma", self.sigma, 2)
        targets = _float_array("targets", self.targets, 1)
        variances = _float_array("variances", self.variances, 1)
        profile = _float_array("profile", self.profile, 1)
        qi = np.asarray(self.query_index)
        if qi.ndim != 1:
            raise ValueError(f"query_index: expected a 1-d array, got shape {qi.shape}")
        if qi.size and not np.issubdtype(qi.dtype, np.integer):
            raise ValueError(f"query_index: expected integers, got dtype {qi.dtype}")
        qi = qi.astype(np.int64, copy=False)
        if qi.size and qi.min() < 0:
            raise ValueError("query_index: negative query index")

        k, d_b = basis.shape
        m_b = recon.shape[0]
        if recon.shape[1] != k:
            raise ValueError(f"recon: shape {recon.shape} does not match basis rows k={k}")
        if sigma.shape != (k, k):
            raise ValueError(f"sigma: shape {sigma.shape}, expected ({k}, {k}) from basis")
        for name, arr in (("query_index", qi), ("targets", targets), ("variances", variances)):
            if arr.shape != (m_b,):
                raise ValueError(f"{name}: shape {arr.shape}, expected ({m_b},) from recon")
        if profile.shape != (d_b,):
            raise ValueError(f"profile: shape {profile.shape}, expected ({d_b},) from basis columns")
        for name, arr in (("basis", basis), ("recon", recon), ("query_index", qi), ("sigma", sigma),
                          ("targets", targets), ("variances", variances), ("profile", profile)):
            set_(self, name, arr)
        try:
            set_(self, "alpha", float(self.alpha))
            set_(self, "lower_bound", float(self.lower_bound))
        except (TypeError, ValueError):
            raise ValueError(
                f"alpha/lower_bound: expected numbers, got {self.alpha!r}, {self.lower_bound!r}") from None
        solver = self.solver
        if dataclasses.is_dataclass(solver) and not isinstance(solver, type):
            solver = dataclasses.asdict(solver)
        if not isinstance(solver, Mapping):
            raise ValueError(f"solver: expected a dict of statistics, got {type(solver).__name__}")
        set_(self, "solver", dict(solver))

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(m_b, k, d_b)``."""
        return self.recon.shape[0], self.basis.shape[0], self.basis.shape[1]


# --------------------------------------------------------------------------------------------
# checksum


def compute_checksum(group: zarr.Group) -> str:
    """``"sha256:<hex>"`` over every array under ``group`` (format: see the module docstring).

    The arrays are fed to the hash one after another in the documented order, but read ahead
    by ``READ_THREADS`` threads (a plan holds thousands of small arrays, and reading them one at
    a time is latency-bound), at most ``_READ_BYTES`` of read-ahead beyond the one being hashed.
    """
    arrays = [(name, obj) for name, obj in group.members(max_depth=None) if isinstance(obj, zarr.Array)]
    arrays.sort(key=lambda item: item[0])
    h = hashlib.sha256(_CHECKSUM_DOMAIN)
    # One step per header or slab, in hash order: ("bytes", b) feeds b; ("read", arr, sl, dtype,
    # nbytes) feeds the slab's bytes; ("strings", name, arr) hashes a string array in place.
    steps: list[tuple] = []
    for name, arr in arrays:
        if np.dtype(arr.dtype).kind in "TUO":  # variable-length strings (e.g. a release's unit ids)
            steps.append(("strings", name, arr))
            continue
        dtype = np.dtype(arr.dtype).newbyteorder("<")
        shape = tuple(int(n) for n in arr.shape)
        nbytes = math.prod(shape) * dtype.itemsize
        steps.append(("bytes", f"{name}\n{dtype.str}\n{','.join(map(str, shape))}\n{nbytes}\n".encode("utf-8")))
        if nbytes == 0:
            continue
        if not shape:  # 0-d
            steps.append(("read", arr, Ellipsis, dtype, nbytes))
            continue
        row_bytes = max(1, nbytes // shape[0])
        step0 = int(arr.chunks[0]) if arr.chunks else shape[0]
        step = max(step0, step0 * (_READ_BYTES // max(1, row_bytes * step0)))
        for start in range(0, shape[0], step):
            stop = min(shape[0], start + step)
            steps.append(("read", arr, slice(start, start + step), dtype, (stop - start) * row_bytes))

    def read(arr: zarr.Array, where, dtype: np.dtype) -> bytes:
        return np.ascontiguousarray(arr[where], dtype=dtype).tobytes()

    reads = [i for i, step in enumerate(steps) if step[0] == "read"]
    with ThreadPoolExecutor(max_workers=READ_THREADS, thread_name_prefix="plan-checksum") as pool:
        futures: dict[int, Any] = {}
        ahead_bytes = 0
        next_read = 0  # position in ``reads`` of the next slab to submit

        def fill() -> None:
            nonlocal next_read, ahead_bytes
            while next_read < len(reads) and (not futures or (
                    len(futures) < 4 * READ_THREADS and ahead_bytes + steps[reads[next_read]][4] <= _READ_BYTES)):
                i = reads[next_read]
                _, arr, where, dtype, size = steps[i]
                futures[i] = pool.submit(read, arr, where, dtype)
                ahead_bytes += size
                next_read += 1

        try:
            for i, step in enumerate(steps):
                kind = step[0]
                if kind == "bytes":
                    h.update(step[1])
                elif kind == "strings":
                    _hash_strings(h, step[1], step[2])
                else:
                    fill()
                    h.update(futures.pop(i).result())
                    ahead_bytes -= step[4]
                    fill()
        finally:
            for future in futures.values():
                future.cancel()
    return CHECKSUM_PREFIX + h.hexdigest()


def _hash_strings(h, name: str, arr: zarr.Array) -> None:
    """Feed a 1-d string array to the checksum: the header ``f"{name}\\nstring\\n{n}\\n"``, then
    per slab of rows the UTF-8 byte length of every element (little-endian uint64) followed by
    the elements' UTF-8 bytes, concatenated."""
    shape = tuple(int(n) for n in arr.shape)
    if len(shape) != 1:
        raise ValueError(f"{name}: string arrays must be 1-d for the checksum, got shape {shape}")
    h.update(f"{name}\nstring\n{shape[0]}\n".encode("utf-8"))
    step = max(1, int(arr.chunks[0]) if arr.chunks else shape[0])
    for start in range(0, shape[0], step):
        encoded = [str(item).encode("utf-8") for item in np.asarray(arr[start:start + step]).tolist()]
        h.update(np.array([len(b) for b in encoded], dtype="<u8").tobytes())
        h.update(b"".join(encoded))


# --------------------------------------------------------------------------------------------
# writer


class PlanWriter:
    """Write a plan store atomically; see the module docstring.

    >>> with PlanWriter("plan.zarr") as w:                      # doctest: +SKIP
    ...     for rec in finished_blocks():                       # stream blocks as they complete
    ...         w.write_block(rec)
    ...     w.finish(spec=..., schema=..., queries_targets=c, queries_variances=v,
    ...              alpha=a, alpha_exact=True, rho=a / 2, composition="sequential")

    ``path`` must not exist unless ``overwrite=True`` (and then it must hold a plan store:
    other directories are never replaced). ``fsync`` (default on) flushes every file before
    the rename so a power loss cannot leave a renamed but torn store.
    """

    def __init__(self, path: PathLike, *, overwrite: bool = False, fsync: bool = True) -> None:
        self.path = Path(os.fspath(path))
        self.overwrite = bool(overwrite)
        self.fsync = bool(fsync)
        if is_staging(self.path):
            raise ValueError(f"{self.path}: a plan path may not contain {STAGING_MARKER!r}")
        self._check_target()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.staging_path = self.path.with_name(
            f"{self.path.name}{STAGING_MARKER}{secrets.token_hex(6)}")
        self._state = "open"
        try:
            self._group = zarr.open_group(store=str(self.staging_path), mode="w-", zarr_format=3)
            self._group.attrs.update(
                {"distfit_format": FORMAT, "format_version": FORMAT_VERSION, "complete": False})
            self._blocks = self._group.create_group("blocks")
            self._group.create_group("queries")
        except BaseException:
            self.abort()
            raise
        self._block_ids: set[str] = set()
        self._max_query_index = -1
        self._drafts: dict[str, tuple[str, int]] = {}  # scratch key -> (block_id, max query index)

    # -- lifecycle

    def _check_target(self) -> None:
        p = self.path
        if not (p.exists() or p.is_symlink()):
            return
        if not p.is_dir() or not _is_plan_store(p):
            raise FileExistsError(
                f"{p}: already exists and is not a distfit plan store; refusing to replace it")
        if not self.overwrite:
            raise FileExistsError(
                f"{p}: already holds a plan; pass overwrite=True (--overwrite) to replace it")

    def __enter__(self) -> PlanWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is not None:
            self.abort()
            return False
        if self._state == "open":
            self.abort()
            raise RuntimeError(f"{self.path}: PlanWriter closed without finish(); nothing was written")
        return False

    def abort(self) -> None:
        """Delete the staging store (idempotent; a no-op after ``finish``)."""
        if self._state == "finished":
            return
        self._state = "aborted"
        shutil.rmtree(self.staging_path, ignore_errors=True)

    def _require_open(self) -> None:
        if self._state != "open":
            raise RuntimeError(f"{self.path}: writer is {self._state}")

    # -- writing

    def write_block(self, record: BlockRecord) -> None:
        """Write one block's arrays and attrs (blocks are independent; any order)."""
        self._require_open()
        if not isinstance(record, BlockRecord):
            raise TypeError(f"write_block expects a BlockRecord, got {type(record).__name__}")
        if record.block_id in self._block_ids:
            raise ValueError(f"block_id: {record.block_id!r} was already written")
        attrs = jsonable(
            {"attributes": list(record.attributes), "alpha": record.alpha,
             "lower_bound": record.lower_bound, "solver": record.solver},
            f"blocks/{record.block_id} attrs")
        self._block_ids.add(record.block_id)  # a failed write must not be retried under the same id
        self._write_block_files(record, attrs)
        if record.query_index.size:
            self._max_query_index = max(self._max_query_index, int(record.query_index.max()))

    def _write_block_files(self, record: BlockRecord, attrs: dict) -> None:
        g = self._blocks.create_group(record.block_id)
        for name in BLOCK_ARRAYS:
            write_array(g, name, getattr(record, name))
        g.attrs.update(attrs)

    def write_blocks(self, records: Iterable[BlockRecord], batch: int = WRITE_BATCH) -> int:
        """``write_block`` for many blocks: the same files, byte for byte, written ``batch``
        blocks at a time in one round trip to zarr's event loop.

        One block is a dozen small files and about 19 synchronous zarr calls; each call is a
        round trip between this thread, zarr's event-loop thread and its I/O threads, and on a
        loaded 2-core machine the per-call overhead, not the bytes, dominated (~130 ms per
        block: a 470-block plan took a minute or more). Here every block of a batch is written
        by zarr's asynchronous API under one ``asyncio.gather`` (blocks are independent and
        each coroutine writes only its own ``blocks/<block_id>``), which halves the CPU time
        per block and overlaps the file I/O. The bookkeeping (ids, validation, the largest
        query index) stays in the calling thread, and at most ``batch`` records are held at a
        time, so ``records`` may be a lazy iterable. Returns the number of blocks written.
        """
        self._require_open()
        batch = max(1, int(batch))
        written = 0
        pending: list[tuple[BlockRecord, dict]] = []
        for record in records:
            self._require_open()
            if not isinstance(record, BlockRecord):
                raise TypeError(f"write_blocks expects BlockRecords, got {type(record).__name__}")
            if record.block_id in self._block_ids:
                raise ValueError(f"block_id: {record.block_id!r} was already written")
            attrs = jsonable(
                {"attributes": list(record.attributes), "alpha": record.alpha,
                 "lower_bound": record.lower_bound, "solver": record.solver},
                f"blocks/{record.block_id} attrs")
            self._block_ids.add(record.block_id)  # as in write_block: never retried under this id
            pending.append((record, attrs))
            if record.query_index.size:
                self._max_query_index = max(self._max_query_index, int(record.query_index.max()))
            written += 1
            if len(pending) >= batch:
                self._write_batch(pending)
                pending = []
        if pending:
            self._write_batch(pending)
        return written

    def _write_batch(self, pending: list[tuple[BlockRecord, dict]]) -> None:
        blocks = getattr(self._blocks, "_async_group", None)  # zarr 3's async twin of the group
        if blocks is None:  # another zarr: one call at a time, the same files
            for record, attrs in pending:
                self._write_block_files(record, attrs)
            return

        async def write_one(record: BlockRecord, attrs: dict) -> None:
            group = await blocks.create_group(record.block_id)

            async def write_array(name: str) -> None:
                data = getattr(record, name)
                arr = await group.create_array(
                    name, shape=data.shape, dtype=data.dtype,
                    chunks=chunk_shape(data.shape, data.dtype.itemsize),
                    config={"write_empty_chunks": True},
                )
                if data.size:
                    await arr.setitem(Ellipsis, data)

            await asyncio.gather(*(write_array(name) for name in BLOCK_ARRAYS))
            await group.update_attributes(attrs)

        async def write_all() -> None:
            await asyncio.gather(*(write_one(record, attrs) for record, attrs in pending))

        zarr_sync(write_all())

    @property
    def block_ids(self) -> tuple[str, ...]:
        """Blocks written so far (sorted)."""
        return tuple(sorted(self._block_ids))

    # -- scratch space (streamed planning; module docstring)

    def _scratch_parts(self, key: str) -> list[str]:
        parts = key.split("/") if isinstance(key, str) else []
        if not parts or any(not _BLOCK_ID.fullmatch(p) or set(p) == {"."} or p.startswith("__") for p in parts):
            raise ValueError(f"scratch key: {key!r} is not a '/'-separated path of path-safe names")
        return parts

    def _scratch_group(self, key: str, create: bool) -> zarr.Group:
        parts = self._scratch_parts(key)
        if not create:
            try:
                node = self._group[f"{SCRATCH}/{key}"]
            except KeyError:
                node = None
            if not isinstance(node, zarr.Group):
                raise KeyError(f"{self.staging_path}: no scratch entry {key!r}")
            return node
        group = self._group.require_group(SCRATCH)
        for part in parts[:-1]:
            group = group.require_group(part)
        if (self.staging_path / SCRATCH / key).exists():
            raise ValueError(f"scratch key: {key!r} was already written")
        return group.create_group(parts[-1])

    def write_scratch(self, key: str, arrays: Mapping[str, np.ndarray], attrs: Mapping | None = None) -> None:
        """Write ``arrays`` (and JSON ``attrs``) to ``scratch/<key>`` of the staging store.

        Not part of the plan: ``finish`` deletes ``scratch/``. ``key`` is ``/``-separated
        path-safe names and may be written once (until discarded)."""
        self._require_open()
        attrs = jsonable(dict(attrs or {}), f"scratch/{key} attrs")
        group = self._scratch_group(key, create=True)
        for name, data in arrays.items():
            write_array(group, name, np.ascontiguousarray(data))
        if attrs:
            group.attrs.update(attrs)

    def read_scratch(self, key: str, names=None) -> tuple[dict[str, np.ndarray], dict]:
        """``(arrays, attrs)`` of ``scratch/<key>`` (only the arrays in ``names`` if given)."""
        self._require_open()
        group = self._scratch_group(key, create=False)
        names = sorted(group.array_keys()) if names is None else list(names)
        return {name: group[name][...] for name in names}, dict(group.attrs)

    def discard_scratch(self, key: str) -> None:
        """Delete ``scratch/<key>`` and everything under it (drafts included; no-op if absent)."""
        self._require_open()
        self._scratch_parts(key)
        prefix = key + "/"
        for draft in [k for k in self._drafts if k == key or k.startswith(prefix)]:
            del self._drafts[draft]
        shutil.rmtree(self.staging_path / SCRATCH / key, ignore_errors=True)

    def write_draft(self, key: str, record: BlockRecord) -> None:
        """Store a block in the block layout under ``scratch/<key>``, to be promoted (or
        discarded) later; the record is validated now, so a promoted draft is a valid block."""
        if not isinstance(record, BlockRecord):
            raise TypeError(f"write_draft expects a BlockRecord, got {type(record).__name__}")
        self.write_scratch(
            key, {name: getattr(record, name) for name in BLOCK_ARRAYS},
            {"attributes": list(record.attributes), "alpha": record.alpha,
             "lower_bound": record.lower_bound, "solver": record.solver})
        top = int(record.query_index.max()) if record.query_index.size else -1
        self._drafts[key] = (record.block_id, top)

    def promote_draft(self, key: str, replace: Mapping[str, np.ndarray], attrs: Mapping) -> None:
        """Move the draft at ``scratch/<key>`` to ``blocks/<block_id>`` (a rename: its basis,
        recon and query_index are not rewritten), then rewrite the arrays in ``replace`` (some
        of ``RESCALED_ARRAYS``; each keeps its shape) and update the block attrs with ``attrs``
        (e.g. the scaled ``alpha`` and ``lower_bound``)."""
        self._require_open()
        if key not in self._drafts:
            raise KeyError(f"{self.staging_path}: no draft {key!r} to promote")
        block_id, top = self._drafts[key]
        if block_id in self._block_ids:
            raise ValueError(f"block_id: {block_id!r} was already written")
        unknown = sorted(set(replace) - set(RESCALED_ARRAYS))
        if unknown:
            raise ValueError(f"promote_draft may only rewrite {RESCALED_ARRAYS}, not {unknown}")
        draft = self._scratch_group(key, create=False)
        arrays = {}
        for name, data in replace.items():
            arr = _float_array(name, data, len(draft[name].shape))
            if arr.shape != tuple(draft[name].shape):
                raise ValueError(f"{name}: shape {arr.shape}, but the draft's is {tuple(draft[name].shape)}")
            arrays[name] = np.ascontiguousarray(arr)
        attrs = jsonable(dict(attrs), f"blocks/{block_id} attrs")
        del self._drafts[key]
        self._block_ids.add(block_id)  # as in write_block: a failed promotion is not retried under this id
        os.rename(self.staging_path / SCRATCH / key, self.staging_path / "blocks" / block_id)
        group = self._blocks[block_id]
        for name, data in arrays.items():
            write_array(group, name, data, overwrite=True)
        if attrs:
            group.attrs.update(attrs)
        self._max_query_index = max(self._max_query_index, top)

    def finish(self, *, spec: Mapping, schema: Mapping, queries_targets, queries_variances,
               alpha: float, alpha_exact: bool, rho: float, composition: str,
               extra_attrs: Mapping | None = None) -> str:
        """Write the queries and root attrs, checksum, and move the store into place.

        Returns the checksum. On any error the staging store is deleted (the old plan, if
        any, is left in place) and the error is re-raised.
        """
        self._require_open()
        try:
            return self._finish(spec=spec, schema=schema, queries_targets=queries_targets,
                                queries_variances=queries_variances, alpha=alpha,
                                alpha_exact=alpha_exact, rho=rho, composition=composition,
                                extra_attrs=extra_attrs)
        except BaseException:
            self.abort()
            raise

    def _finish(self, *, spec, schema, queries_targets, queries_variances, alpha, alpha_exact,
                rho, composition, extra_attrs) -> str:
        from distfit import __version__

        targets = _float_array("queries_targets", queries_targets, 1)
        variances = _float_array("queries_variances", queries_variances, 1)
        if variances.shape != targets.shape:
            raise ValueError(
                f"queries_variances: shape {variances.shape} does not match queries_targets {targets.shape}")
        m = targets.shape[0]
        if self._max_query_index >= m:
            raise ValueError(
                f"queries_targets: a block refers to query {self._max_query_index}, but there are only {m}")
        if not isinstance(spec, Mapping):
            raise ValueError(f"spec: expected a dict, got {type(spec).__name__}")
        schema = _check_schema(schema)
        if not isinstance(alpha_exact, (bool, np.bool_)):
            raise ValueError(f"alpha_exact: expected a bool, got {alpha_exact!r}")
        if not isinstance(composition, str):
            raise ValueError(f"composition: expected a string, got {composition!r}")
        extra = dict(extra_attrs or {})
        clash = sorted(set(extra) & set(ROOT_KEYS))
        if clash:
            raise ValueError(f"extra_attrs: keys {clash} are reserved for the plan store itself")
        if self._drafts:
            raise ValueError(
                f"{len(self._drafts)} block drafts were never promoted (first: {sorted(self._drafts)[0]!r}); "
                "promote or discard them before finish")
        shutil.rmtree(self.staging_path / SCRATCH, ignore_errors=True)  # scratch is never part of a plan

        queries = self._group["queries"]
        write_array(queries, "targets", targets)
        write_array(queries, "variances", variances)
        checksum = compute_checksum(self._group)
        attrs = jsonable({
            **extra,
            "distfit_format": FORMAT,
            "format_version": FORMAT_VERSION,
            "spec": spec,
            "schema": schema,
            "alpha": float(alpha),
            "alpha_exact": bool(alpha_exact),
            "rho": float(rho),
            "composition": composition,
            "created": utc_now(),
            "distfit_version": __version__,
            "complete": True,
            "checksum": checksum,
        })
        self._group.attrs.update(attrs)
        if self.fsync:
            fsync_tree(self.staging_path)
        self._move_into_place()
        self._state = "finished"
        return checksum

    def _move_into_place(self) -> None:
        move_into_place(self.staging_path, self.path, lambda _: self._check_target(), fsync=self.fsync)


def _check_schema(schema: Any) -> dict:
    if (not isinstance(schema, Mapping) or not {"attributes", "sizes"} <= set(schema)
            or isinstance(schema["attributes"], str)):
        raise ValueError('schema: expected {"attributes": [names], "sizes": [ints]}')
    names = [str(a) if isinstance(a, np.str_) else a for a in schema["attributes"]]
    sizes = list(schema["sizes"])
    if not all(isinstance(a, str) for a in names):
        raise ValueError(f"schema: attribute names must be strings, got {names!r}")
    if len(set(names)) != len(names):
        raise ValueError(f"schema: duplicate attribute names in {names!r}")
    if len(sizes) != len(names):
        raise ValueError(f"schema: {len(names)} attributes but {len(sizes)} sizes")
    out_sizes = []
    for s in sizes:
        if isinstance(s, (bool, np.bool_)) or not isinstance(s, (int, np.integer)) or s < 1:
            raise ValueError(f"schema: sizes must be positive integers, got {sizes!r}")
        out_sizes.append(int(s))
    return {**{k: v for k, v in schema.items()}, "attributes": names, "sizes": out_sizes}


# --------------------------------------------------------------------------------------------
# reader


def _open_plan_group(path: PathLike) -> tuple[Path, zarr.Group, dict]:
    """Open ``path`` read-only after every refusal check; returns (path, group, attrs)."""
    p = Path(os.fspath(path))
    if is_staging(p):
        raise StoreError(f"{p}: is the staging directory of an unfinished write, not a plan")
    if not p.exists():
        left = leftovers(p)
        hint = f" (an interrupted write left {', '.join(x.name for x in left)})" if left else ""
        raise StoreError(f"{p}: no such plan store{hint}")
    if not p.is_dir():
        raise StoreError(f"{p}: not a directory (a plan store is a Zarr v3 group directory)")
    if root_attrs_on_disk(p) is None:
        raise StoreError(f"{p}: not a Zarr v3 group (no readable zarr.json)")
    try:
        group = zarr.open_group(store=str(p), mode="r", zarr_format=3)
    except Exception as exc:  # noqa: BLE001 - any failure to open is a refusal
        raise StoreError(f"{p}: cannot open as a Zarr v3 group ({type(exc).__name__}: {exc})") from None
    attrs = dict(group.attrs)
    check_format(p, attrs, FORMAT, FORMAT_VERSION, StoreError)
    if attrs.get("complete") is not True:
        raise StoreError(f"{p}: the plan is not marked complete (an unfinished or damaged write)")
    checksum = attrs.get("checksum")
    if not isinstance(checksum, str) or not checksum:
        raise StoreError(f"{p}: the plan has no checksum")
    for name in ("queries/targets", "queries/variances"):
        try:
            node = group[name]
        except KeyError:
            node = None
        if not isinstance(node, zarr.Array):
            raise StoreError(f"{p}: missing array {name}")
    try:
        blocks = group["blocks"]
    except KeyError:
        blocks = None
    if not isinstance(blocks, zarr.Group):
        raise StoreError(f"{p}: missing group blocks/")
    return p, group, attrs


@dataclass(frozen=True, eq=False)
class Plan:
    """A complete plan store opened for reading. Blocks are read lazily by :meth:`block`."""

    path: str
    attrs: dict
    queries_targets: np.ndarray
    queries_variances: np.ndarray
    block_ids: tuple[str, ...]
    _group: Any = field(repr=False)

    @property
    def checksum(self) -> str:
        return self.attrs["checksum"]

    def block(self, block_id: str) -> BlockRecord:
        """Read one block's arrays and attrs from the store."""
        if block_id not in self.block_ids:
            raise KeyError(f"{self.path}: no block {block_id!r}")
        where = f"{self.path}: blocks/{block_id}"
        g = self._group["blocks"][block_id]
        arrays = {}
        for name in BLOCK_ARRAYS:
            try:
                node = g[name]
            except KeyError:
                node = None
            if not isinstance(node, zarr.Array):
                raise StoreError(f"{where}: missing array {name}")
            arrays[name] = node[...]
        a = dict(g.attrs)
        missing = [k for k in ("attributes", "alpha", "lower_bound") if k not in a]
        if missing:
            raise StoreError(f"{where}: missing attrs {missing}")
        try:
            return BlockRecord(block_id=block_id, attributes=tuple(a["attributes"]),
                               alpha=a["alpha"], lower_bound=a["lower_bound"],
                               solver=a.get("solver", {}), **arrays)
        except ValueError as exc:
            raise StoreError(f"{where}: {exc}") from None

    def iter_blocks(self) -> Iterator[BlockRecord]:
        """Blocks in ``block_ids`` order, one at a time."""
        for bid in self.block_ids:
            yield self.block(bid)


def read_plan(path: PathLike) -> Plan:
    """Open a complete plan store, or raise :class:`StoreError` saying why it is refused.

    Refused: a missing path, a staging (``.incomplete-``) directory, anything that is not a
    Zarr v3 group with ``distfit_format="plan"``, a ``format_version`` newer than
    :data:`FORMAT_VERSION`, a store without ``complete=True`` or without a checksum. The
    checksum itself is not recomputed here (that reads every array): see :func:`verify_checksum`.
    """
    p, group, attrs = _open_plan_group(path)
    targets = np.asarray(group["queries/targets"][...], dtype=np.float64)
    variances = np.asarray(group["queries/variances"][...], dtype=np.float64)
    block_ids = tuple(sorted(group["blocks"].group_keys()))
    return Plan(path=str(p), attrs=attrs, queries_targets=targets, queries_variances=variances,
                block_ids=block_ids, _group=group)


def verify_checksum(path: PathLike) -> tuple[bool, str, str]:
    """``(ok, stored, recomputed)`` for a plan store (refused like :func:`read_plan`)."""
    _p, group, attrs = _open_plan_group(path)
    stored = attrs["checksum"]
    recomputed = compute_checksum(group)
    return stored == recomputed, stored, recomputed


__all__ = [
    "BLOCK_ARRAYS",
    "CHUNK_BYTES",
    "FORMAT_VERSION",
    "BlockRecord",
    "Plan",
    "PlanWriter",
    "StoreError",
    "compute_checksum",
    "read_plan",
    "verify_checksum",
]
