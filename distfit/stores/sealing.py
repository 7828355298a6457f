"""Sealing and verification: the one path by which every sealed store is checksummed, opened and
checked (plans, releases, estimates).

A sealed store is a Zarr v3 group whose root attrs say ``complete=True`` and carry ``checksum``:
:func:`distfit.stores.checksum.compute_checksum` over its arrays and, where the store's
:data:`ClaimRule` says so, over the attrs that state its claims (a plan of format version 2 or
later: :func:`distfit.stores.plan.plan_checksum_claims`; releases, estimates and data stores:
:func:`stated_attrs`, every attr of every group and array but :data:`UNSEALED_ATTRS`). Each
store module names its rule once, and

- writers take the checksum with :func:`seal_checksum` (the plan writer's ``finish``, the seal of
  a store written chunk by chunk, :func:`distfit.stores.release_chunks.seal_chunked`);
- readers open with :func:`open_sealed` (every refusal: missing, an interrupted write's staging
  directory, not this kind of store, a newer format, not complete, no checksum) and check the
  checksum with :func:`verify_opened` / :func:`verify_sealed` under the same rule;
- a store built in place and sealed chunk by chunk (a release, an estimate) is one
  :class:`SealedKind` value: its format, version, error, rule and reader class, with the reader,
  the verifier and the writer's lifecycle as its methods (the state checks, the lay-out of a
  new store, the reopening of an incomplete one for ``--resume``); :func:`lay_out_units` lays
  out the per-unit arrays every such store has (:data:`UNIT_DIMS`).

So a store kind's claims and its refusals are decided in one place. A store of a format
version older than its kind's ``oldest`` (a release of format 1, an estimate of 1-2, a data store
of 1: written when their attrs were outside the checksum, or, for data, with no checksum at all)
is refused with the command that writes it anew: what a checksum does not cover cannot be
trusted, so it is never read as if it were.

Per-chunk digests (data stores of format 3, releases of 3, estimates of 4;
:data:`distfit.stores.checksum.DIGESTS`): the arrays chunked by unit have a digest per chunk of
units (:func:`lay_out_digests`, written as the chunks are:
:func:`distfit.stores.release_chunks.ChunkWriter.write_arrays`, one implementation for releases
and estimates, or at the seal of a data store: :func:`write_digests`), and the root checksum
covers the attrs, the small arrays and the digests instead of those arrays (checksum version 3).
So verifying a store is two parts:

- the root (:func:`check_root`: cheap, the attrs, the small arrays and the digest table), which
  yields the store's :class:`ChunkDigests`, the table as it was hashed;
- each chunk, checked by whoever reads it against that table (:meth:`ChunkDigests.read`: the
  rows read are hashed, exactly the bytes used, and compared before they are used).

Reading and verifying: a command that reads a store it did not write verifies it as it reads,
in one read. It opens the store with :meth:`SealedKind.read_sealed` (or, for data,
:func:`distfit.stores.data.open_data` with ``verify=True``): the root is checked before anything
is written or any noise drawn, and every array the digests cover is a :class:`CheckedArray`
(:meth:`SealedStore.array`; rows by name: :meth:`SealedStore.rows_of`), whose reads read the
whole chunks holding the rows asked for and check them before returning them. So a reader that
reads chunk by chunk in tasks (a release reading its data store, an estimate its release: each
task reopens the store, the root checked again and its checksum the one the driver checked), one
that streams the whole store in the driver (an export, the levels of a multi-level run) and one
that reads a few units (a report) all check exactly what they read, when they read it: no second
pass over the data. A store whose checksum covers every array (no digests: an estimate of
format 3) has every array hashed by that root check: verified whole, first, as before. The one
whole-store pass left, :func:`check_verified` (:meth:`SealedKind.read_verified`), is for stores
without digests that are read whole (plans, masks). Either way a mismatch is one line naming the
store and what differs (a chunk: the array and the units, :class:`ChangedChunk`).

How a kind's stores are read (through zarr, or as raw chunk files) is chosen in one place,
:meth:`SealedKind.reader_at`, for its root check, its whole verification and its reader's rows.
"""
from __future__ import annotations

import dataclasses
import math
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from distfit.stores.checksum import DIGESTS, READ_BYTES, Reader, chunk_digest, compute_checksum
from distfit.stores.files import (
    PARENT_IDS,
    byte_batches,
    check_format,
    check_store_kind,
    node_attrs,
    open_arrays,
    open_store,
    read_rows,
    store_state,
    write_array,
)

__all__ = [
    "ChangedChunk",
    "CheckedArray",
    "ChunkDigests",
    "ClaimRule",
    "SealedKind",
    "SealedStore",
    "DIGEST_DIMS",
    "UNIT_DIMS",
    "UNSEALED_ATTRS",
    "arrays_only",
    "check_root",
    "check_verified",
    "lay_out_digests",
    "write_digests",
    "stated_attrs",
    "lay_out_units",
    "root_attr",
    "store_array",
    "open_sealed",
    "seal_checksum",
    "verify_opened",
    "verify_sealed",
    "zarr_reader",
]

#: Dimension names (Zarr v3 ``dimension_names``) of the per-unit arrays every store built chunk
#: by chunk has (:func:`lay_out_units`): the unit ids, their coordinate twin, the parent ids and
#: the done markers. Each store's own table (its ``DIMS``) ends with these.
UNIT_DIMS: dict[str, tuple[str, ...]] = {
    "unit_ids": ("unit",),
    "unit": ("unit",),
    PARENT_IDS: ("unit",),
    "chunks/done": ("chunk",),
}

#: Dimension names of :data:`distfit.stores.checksum.DIGESTS` (:func:`lay_out_digests`).
DIGEST_DIMS = ("chunk", "digested", "digest_byte")

#: A store kind's rule: from its root attrs and group, the attrs its checksum covers (the
#: version-2 digest), or None for the arrays only (version 1).
ClaimRule = Callable[[Mapping[str, Any], zarr.Group], "Mapping[str, Any] | None"]

#: The root attrs outside the checksum of every store sealed by :func:`stated_attrs`: the
#: checksum itself, the seal's mark and its two timestamps (when the store was started and
#: sealed: a store written twice from the same inputs states the same facts and has one
#: checksum). Everything else a store states is covered.
UNSEALED_ATTRS = ("checksum", "complete", "created", "sealed")


def arrays_only(_attrs: Mapping[str, Any], _group: zarr.Group) -> None:
    """The arrays-only rule (version 1; plans of format 1 only, still read and audited)."""
    return None


def stated_attrs(root_attrs: Mapping[str, Any], group: zarr.Group) -> dict[str, Any]:
    """The sealing rule of releases, estimates and data stores: ``{"": root_attrs without
    UNSEALED_ATTRS, "<path>": the attrs of every other group and array under ``group`` that has
    any}`` (paths relative to the root, e.g. ``"queries"``: its ``labels``). So a flipped
    ``private`` flag, an edited ``units`` or a changed query label changes the digest."""
    claims: dict[str, Any] = {"": {k: v for k, v in root_attrs.items() if k not in UNSEALED_ATTRS}}
    for name, attrs in sorted(node_attrs(group).items()):  # every node's zarr.json, read at once
        if attrs:
            claims[name] = attrs
    return claims


def seal_checksum(group: zarr.Group, attrs: Mapping[str, Any], claims: ClaimRule = arrays_only, *,
                  threads: int | None = None, read_bytes: int | None = None, read: Reader | None = None) -> str:
    """The checksum a store of root ``attrs`` is sealed with under its rule ``claims`` (how it
    reads: :func:`distfit.stores.checksum.compute_checksum`'s ``threads``, ``read_bytes``,
    ``read``; the digest never depends on them)."""
    return compute_checksum(group, attrs=claims(attrs, group), threads=threads, read_bytes=read_bytes, read=read)


def open_sealed(path: str | os.PathLike, kind: str, version: int, error: type[Exception], *,
                unfinished: str | None = None, oldest: int = 1, rewrite: str = "") -> tuple[Path, zarr.Group, dict]:
    """Open the sealed store of ``kind`` (its ``distfit_format``, and its command) at ``path``
    read-only: :func:`distfit.stores.files.open_store` and
    :func:`distfit.stores.files.check_format` (``oldest``, ``rewrite``: a format too old to
    trust and the command that writes it anew), then refuse one not complete (``unfinished``: the
    reason given, by default ``the <kind> is incomplete (interrupted or still running); finish it
    with distfit <kind> --resume``) or without a checksum. Raises ``error``; returns
    ``(path, group, root attrs)``."""
    p, group, attrs = open_store(path, kind, error)
    check_format(p, attrs, kind, version, error, oldest, rewrite)
    if attrs.get("complete") is not True:
        raise error(f"{p}: " + (unfinished or f"the {kind} is incomplete (interrupted or still running); "
                                              f"finish it with distfit {kind} --resume"))
    checksum = attrs.get("checksum")
    if not isinstance(checksum, str) or not checksum:
        raise error(f"{p}: the {kind} has no checksum")
    return p, group, attrs


def verify_opened(group: zarr.Group, attrs: Mapping[str, Any], claims: ClaimRule = arrays_only,
                  read: Reader | None = None) -> tuple[bool, str, str]:
    """``(ok, stored, recomputed)``: the checksum of an opened sealed store (:func:`open_sealed`)
    recomputed under its rule and compared with the one its attrs state, and, for a store with
    per-chunk digests whose root holds, every chunk checked against its digest (``recomputed``
    then says which chunk differs, if one does). ``read``: how the arrays are read
    (:func:`check_root`'s)."""
    stored = str(attrs["checksum"])
    recomputed = seal_checksum(group, attrs, claims, read=read)
    if recomputed != stored or DIGESTS not in group:
        return stored == recomputed, stored, recomputed
    try:
        digests = check_root("", "store", group, attrs, claims, ValueError, read=read)
        if digests is not None:
            digests.check_all(group, read)
    except ValueError as failure:  # recomputed: which chunk differs
        return False, stored, str(failure).split("was changed after it was sealed: ")[-1]
    return True, stored, recomputed


def verify_sealed(path: str | os.PathLike, kind: str, version: int, error: type[Exception],
                  claims: ClaimRule = arrays_only, *, oldest: int = 1, rewrite: str = "",
                  read: Reader | None = None) -> tuple[bool, str, str]:
    """:func:`open_sealed` (its refusals), then :func:`verify_opened` under ``claims`` (``read``:
    how the arrays are read)."""
    _p, group, attrs = open_sealed(path, kind, version, error, oldest=oldest, rewrite=rewrite)
    return verify_opened(group, attrs, claims, read)


def _changed(path: str | os.PathLike, kind: str, what: str) -> str:
    """The one line of every refusal of a store changed after it was sealed."""
    return f"{os.fspath(path)}: the {kind} was changed after it was sealed: {what}; it cannot be trusted"


def _unreadable(failure: Exception) -> str:
    first = str(failure).splitlines()[0] if str(failure) else ""
    return f"a chunk no longer reads ({type(failure).__name__}: {first})"


class ChangedChunk(ValueError):
    """A chunk read from a sealed store no longer hashes to the digest the store was sealed
    with, or no longer decodes: the store was changed after it was sealed. The one-line message
    names the store, the array and the units. Raised by the task that read the chunk, before it
    uses the rows; a job whose new output store holds nothing from before deletes it
    (:class:`distfit.runtime.chunked_job.ChunkedWrite`)."""


@dataclasses.dataclass(frozen=True, eq=False)
class ChunkDigests:
    """The per-chunk digests of a sealed store as its root checksum covered them
    (:func:`check_root`): ``table[c, i]`` the BLAKE3 digest of chunk ``c`` (rows ``c * chunk_units``
    on) of array ``names[i]`` (:func:`distfit.stores.checksum.chunk_digest`). Picklable: a
    task carries it. ``store`` and ``kind`` name the store in a refusal (:class:`ChangedChunk`)."""

    store: str
    kind: str
    names: tuple[str, ...]
    chunk_units: int
    table: np.ndarray = dataclasses.field(repr=False)

    def check(self, name: str, start: int, values: Any) -> None:
        """Raise :class:`ChangedChunk` unless ``values``, the rows ``start:start + len(values)``
        of array ``name`` (whole chunks: ``start`` on a chunk boundary, the rows to a chunk's end
        or the array's), hash to the digests the store was sealed with."""
        index = self.names.index(name)
        n = int(np.shape(values)[0])
        if start % self.chunk_units:
            raise ValueError(f"{name}: rows from {start} are not whole chunks of {self.chunk_units}")
        for offset in range(0, max(n, 1), self.chunk_units):
            chunk = (start + offset) // self.chunk_units
            rows = values[offset:offset + self.chunk_units]
            if chunk >= self.table.shape[0] or chunk_digest(name, start + offset, rows) != self.table[chunk, index].tobytes():
                raise ChangedChunk(_changed(self.store, self.kind, (
                    f"{name} units {start + offset}..{start + offset + int(np.shape(rows)[0]) - 1} (chunk {chunk}) "
                    "do not hash to the digest they were sealed with")))

    def read(self, name: str, read: Callable[[int, int], Any], start: int, stop: int, units: int) -> np.ndarray:
        """Rows ``start:stop`` of array ``name`` (of ``units`` rows), checked: ``read(a, b)``
        reads the whole chunks that hold them (rows ``a:b``), which are hashed and compared
        (:meth:`check`) before the rows asked for are returned (a view, no copy). A chunk that
        no longer decodes is refused the same way. No rows (``stop <= start``): nothing read."""
        if stop <= start:
            return np.asarray(read(start, start))
        first = (start // self.chunk_units) * self.chunk_units
        last = min(units, -(-stop // self.chunk_units) * self.chunk_units)
        try:
            values = np.asarray(read(first, last))
        except OSError:
            raise
        except Exception as failure:  # noqa: BLE001 - a chunk that no longer decodes (codec errors vary)
            raise ChangedChunk(_changed(self.store, self.kind, f"{name}: {_unreadable(failure)}")) from None
        self.check(name, first, values)
        return values[start - first:stop - first]

    def check_all(self, group: zarr.Group, read: Reader | None = None) -> None:
        """Read and check every chunk of every digested array of ``group`` (the whole-store pass
        of a reader that reads the store whole: :func:`check_verified`; ``read``: how, as
        :func:`check_root`'s)."""
        for name in self.names:
            try:
                arr = group[name]
            except KeyError:
                raise ChangedChunk(_changed(self.store, self.kind, f"{name} is missing")) from None
            units = int(arr.shape[0])
            rows = (lambda a, b: arr[a:b]) if read is None else (lambda a, b: read(name, arr, slice(a, b)))
            for start in range(0, units, self.chunk_units):
                self.read(name, rows, start, min(units, start + self.chunk_units), units)


def check_root(path: str | os.PathLike, kind: str, group: zarr.Group, attrs: Mapping[str, Any],
               claims: ClaimRule, error: type[Exception], checksum: str | None = None, *,
               read: Reader | None = None) -> ChunkDigests | None:
    """Recompute the root checksum of the opened sealed store at ``path`` (:func:`seal_checksum`:
    for a store with per-chunk digests the attrs, the small arrays and the digest table, not the
    digested arrays) and raise ``error`` in one line naming the store when it differs from the
    one it states (an attr edited, a small array or a digest changed or deleted), or, with
    ``checksum``, when the store states another (a task reopening what its driver checked).
    Returns the store's :class:`ChunkDigests` as they were hashed (no second read), or None for
    a store without (its checksum covers every array: nothing is left to check). An OSError (no
    permission, a disk error) passes as it is. ``read``: how the arrays are read (a
    :data:`distfit.stores.checksum.Reader`; default through zarr), e.g. a store's raw chunk
    files (:func:`distfit.stores.release_chunks.raw_reader`); the checksum never depends on it."""
    stored = str(attrs["checksum"])
    if checksum is not None and stored != checksum:
        raise error(_changed(path, kind, f"it states the checksum {stored[:19]}..., not the {checksum[:19]}... "
                                         "it had when this command started"))
    kept: list[np.ndarray] = []

    def kept_read(name: str, arr: zarr.Array, where: Any) -> Any:
        values = arr[where] if read is None else read(name, arr, where)
        if name == DIGESTS:
            kept.append(np.asarray(values))
        return values

    try:
        recomputed = seal_checksum(group, attrs, claims, read=kept_read)
    except OSError:
        raise
    except Exception as failure:  # noqa: BLE001 - a chunk that no longer decodes (codec errors vary)
        raise error(_changed(path, kind, _unreadable(failure))) from None
    if recomputed != stored:
        raise error(_changed(path, kind, f"its contents hash to {recomputed[:19]}..., not to the {stored[:19]}... "
                                         "it was sealed with"))
    if DIGESTS not in group:
        return None
    digests = group[DIGESTS]
    table = np.concatenate(kept) if kept else np.zeros((0, len(digests.attrs["arrays"]), 32), dtype=np.uint8)
    return ChunkDigests(store=os.fspath(path), kind=kind, names=tuple(str(n) for n in digests.attrs["arrays"]),
                        chunk_units=int(digests.attrs["chunk_units"]), table=table)


def check_verified(path: str | os.PathLike, kind: str, group: zarr.Group, attrs: Mapping[str, Any],
                   claims: ClaimRule, error: type[Exception], *, read: Reader | None = None) -> ChunkDigests | None:
    """The whole verification of the opened sealed store at ``path``: the root
    (:func:`check_root`), then every chunk of every digested array
    (:meth:`ChunkDigests.check_all`); ``error`` in one line naming the store and what differs:
    it was changed after it was sealed (an array, a chunk deleted, an attr edited) or a chunk
    no longer decodes (a flipped byte in a compressed chunk). What a reader that reads the
    store whole does first; returns the digests (:func:`check_root`). ``read``: how the arrays
    are read (:func:`check_root`)."""
    digests = check_root(path, kind, group, attrs, claims, error, read=read)
    if digests is not None:
        digests.check_all(group, read)
    return digests


def lay_out_digests(root: zarr.Group, names: Sequence[str], *, units: int, chunk_units: int) -> None:
    """Lay out :data:`distfit.stores.checksum.DIGESTS` of a store whose arrays ``names`` are
    chunked by ``chunk_units`` units: (chunks, len(names), 32) uint8, one zarr chunk per chunk
    of units (written with the chunk's rows, before its done marker), uncompressed, attrs
    ``arrays`` (the names, sorted), ``chunk_units`` and ``hash`` (``"blake3"``: the digest,
    :func:`distfit.stores.checksum.chunk_digest`). A chunk never written reads as zeros,
    which no digest is: a deleted digest is a changed store."""
    names = sorted(names)
    arr = root.require_group("chunks").create_array(
        "digests", shape=(-(-units // chunk_units), len(names), 32), dtype=np.uint8,
        chunks=(1, len(names), 32), fill_value=0, compressors=None,
        dimension_names=DIGEST_DIMS, config={"write_empty_chunks": True})
    arr.attrs.update({"arrays": names, "chunk_units": int(chunk_units), "hash": "blake3"})


def write_digests(root: zarr.Group) -> None:
    """Compute and write every digest of the store ``root`` laid out with
    :func:`lay_out_digests` from the arrays as they are stored (a data store's seal, which
    reads its chunks back once as every seal did; a test resealing a store it edited)."""
    digests = root[DIGESTS]
    names = list(digests.attrs["arrays"])
    chunk_units = int(digests.attrs["chunk_units"])
    table = np.zeros(digests.shape, dtype=np.uint8)
    column = {name: i for i, name in enumerate(names)}
    arrays = open_arrays(root, names)  # one zarr call; each chunk of units read in a few (read_rows)
    row_bytes = {name: max(16, arr.dtype.itemsize) * math.prod(arr.shape[1:]) for name, arr in arrays.items()}
    for c in range(table.shape[0]):
        start = c * chunk_units
        present = [name for name in names if start < int(arrays[name].shape[0])]
        # batches of at most READ_BYTES (at least one array each) read together
        for batch in byte_batches(present, lambda name: chunk_units * row_bytes[name], READ_BYTES):
            for name, values in read_rows(arrays, {name: slice(start, start + chunk_units) for name in batch}).items():
                table[c, column[name]] = np.frombuffer(chunk_digest(name, start, values), dtype=np.uint8)
    digests[...] = table


def root_attr(name: str, kind: Callable[[Any], Any]) -> property:
    """A sealed store reader's property (:class:`SealedStore`): its root attr ``name`` as ``kind``
    (``bool``, ``str``)."""
    return property(lambda store: kind(store.attrs[name]), doc=f"The root attr ``{name}``.")


def store_array(path: str, doc: str) -> property:
    """A sealed store reader's property (:class:`SealedStore`): the lazy array at ``path``
    (``doc``: what it holds), checked as it is read where the store has its digests
    (:meth:`SealedStore.array`)."""
    return property(lambda store: store.array(path), doc=doc)


def zarr_reader(_name: str, arr: zarr.Array, where: Any) -> Any:
    """The :data:`distfit.stores.checksum.Reader` of a store kind without one of its own:
    ``arr[where]`` through zarr."""
    return arr[where]


@dataclasses.dataclass(frozen=True, eq=False)
class SealedStore:
    """What every sealed store built chunk by chunk (a release, an estimate) gives its reader:
    its path, root attrs, checksum, query labels and lazy arrays by unit (``unit_ids``, and
    ``parent_ids`` where the units have geography). Opened by :func:`open_sealed`; a kind's
    reader adds its own attrs and arrays (:func:`root_attr`, :func:`store_array`).

    Opened with its digests (:meth:`SealedKind.read_sealed`: the root checked), every array they
    cover is a :class:`CheckedArray` (:meth:`array`): whatever rows a caller reads are read as
    whole chunks, hashed and compared with their digests before they are returned, so a command
    that reads such a store, a few rows or all of it, verifies it as it reads, in one read
    (:meth:`rows_of`). ``read_slab`` is how rows are read (the kind's :attr:`SealedKind.slabs`:
    :meth:`SealedKind.reader_at`, the one place it is chosen)."""

    path: str
    attrs: dict
    _group: Any = dataclasses.field(repr=False)
    #: The per-chunk digests each chunk read is checked against (:meth:`SealedKind.read_sealed`),
    #: or None (read unchecked, or a store whose checksum covers every array, verified whole
    #: when its root was checked).
    digests: ChunkDigests | None = dataclasses.field(default=None, repr=False)
    read_slab: Reader = dataclasses.field(default=zarr_reader, repr=False)
    _arrays: dict = dataclasses.field(default_factory=dict, repr=False)  # looked up once (~1 ms of zarr each)

    @property
    def checksum(self) -> str:
        return self.attrs["checksum"]

    @property
    def labels(self) -> list[str] | None:
        return self._group["queries"].attrs.get("labels")

    unit_ids = store_array("unit_ids", "``unit_ids`` (units,): the units' ids.")

    @property
    def parent_ids(self):
        """Each unit's parent id (a lazy array), or None when the units have no geography."""
        return self._group[PARENT_IDS] if PARENT_IDS in self._group else None

    @property
    def parent_column(self) -> str | None:
        """The data column the parent ids were read from (None without parent ids)."""
        return self.attrs.get("parent_column") if PARENT_IDS in self._group else None

    def _zarr(self, name: str) -> zarr.Array:
        if name not in self._arrays:
            self._arrays[name] = self._group[name]
        return self._arrays[name]

    def array(self, name: str) -> "zarr.Array | CheckedArray":
        """The lazy array ``name``: a :class:`CheckedArray` where the store's digests cover it,
        else the zarr array (read unchecked, or covered by the root checksum: small arrays, the
        geography's ``parent_ids``)."""
        arr = self._zarr(name)
        if self.digests is None or name not in self.digests.names:
            return arr
        return CheckedArray(self, name, arr)

    def rows_of(self, name: str, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of the array ``name``, read by :attr:`read_slab` and, where the
        store's digests cover it, read as whole chunks and checked before they are returned
        (:meth:`ChunkDigests.read`: the bytes hashed are the bytes returned; a changed chunk is
        :class:`ChangedChunk`, one line naming the store, the array and the units)."""
        arr = self._zarr(name)

        def read(a: int, b: int) -> Any:
            return self.read_slab(name, arr, slice(a, b))

        if self.digests is None or name not in self.digests.names:
            return np.asarray(read(start, stop))
        return self.digests.read(name, read, start, stop, int(arr.shape[0]))


class CheckedArray:
    """An array of a sealed store opened with its digests (:meth:`SealedStore.array`), read
    like the zarr array (``shape``, ``dtype``, ``ndim``, ``len``, numpy-style ``[rows]`` /
    ``[rows, columns]`` indexing, ``np.asarray``): the rows asked for are read as the whole
    chunks holding them and checked (:meth:`SealedStore.rows_of`) before the index is applied."""

    def __init__(self, store: SealedStore, name: str, arr: zarr.Array) -> None:
        self._store, self.name = store, name
        self.shape = tuple(int(n) for n in arr.shape)
        self.dtype = np.dtype(arr.dtype)
        self.ndim = len(self.shape)
        self.chunks = tuple(int(c) for c in arr.chunks)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, key: Any) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        rows, rest = (key[0], key[1:]) if key else (slice(None), ())
        n = self.shape[0]
        if rows is Ellipsis:  # every row, the key applied as given
            return self._store.rows_of(self.name, 0, n)[key]
        if isinstance(rows, slice) and rows.step in (None, 1):
            start, stop, _ = rows.indices(n)
            stop = max(start, stop)
            return self._store.rows_of(self.name, start, stop)[(slice(None),) + rest]
        index = np.arange(n)[rows]  # an integer, a stepped slice, an index or mask array
        if index.size == 0:
            return np.asarray(self._store._zarr(self.name)[key])  # nothing read, nothing to check
        low, high = int(index.min()), int(index.max()) + 1
        values = self._store.rows_of(self.name, low, high)
        return values[(int(index) - low if index.ndim == 0 else index - low,) + rest]

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        out = self[...]
        return out if dtype is None else out.astype(dtype, copy=False)


@dataclasses.dataclass(frozen=True)
class SealedKind:
    """One kind of store built in place and sealed (a release, an estimate): its
    ``distfit_format`` ``name``, the format ``version`` this distfit reads and writes, the
    ``error`` its readers raise, its sealing rule ``claims`` and its ``reader`` class (a
    :class:`SealedStore`). The store module declares it once and reads, verifies and checks its
    stores through it."""

    name: str
    version: int
    error: type[Exception]
    reader: type[SealedStore]
    claims: ClaimRule = stated_attrs
    oldest: int = 1  # the oldest format version read (older ones: not covered enough to trust)
    #: How a store of this kind at a path is read (a :data:`distfit.stores.checksum.Reader`,
    #: e.g. its raw chunk files: :func:`distfit.stores.release_chunks.raw_reader`; None: through
    #: zarr): by its root check, its whole verification and its reader's rows (:meth:`reader`).
    slabs: Callable[[Path], Reader] | None = None

    def reader_at(self, path: Path) -> Reader:
        """How the store at ``path`` is read (:attr:`slabs`): the one choice, for every check
        and every read of this kind."""
        return zarr_reader if self.slabs is None else self.slabs(path)

    def open(self, path: str | os.PathLike) -> tuple[Path, zarr.Group, dict]:
        """:func:`open_sealed` for this kind."""
        return open_sealed(path, self.name, self.version, self.error, oldest=self.oldest,
                           rewrite=f"distfit {self.name}")

    def read(self, path: str | os.PathLike) -> SealedStore:
        """The sealed store at ``path`` opened for reading, or ``error`` saying why it is refused
        (missing, staging directory, another kind, a format too new or too old, incomplete, no
        checksum). Nothing is checked: :meth:`read_sealed` checks as it reads."""
        p, group, attrs = self.open(path)
        return self.reader(path=str(p), attrs=attrs, _group=group, read_slab=self.reader_at(p))

    def read_verified(self, path: str | os.PathLike) -> SealedStore:
        """:meth:`read`, then the whole store verified (:func:`check_verified`: the root and
        every chunk) before anything is read: for a store that is not read through its digests
        (one without: a mask store)."""
        p, group, attrs = self.open(path)
        read = self.reader_at(p)
        check_verified(p, self.name, group, attrs, self.claims, self.error, read=read)
        return self.reader(path=str(p), attrs=attrs, _group=group, read_slab=read)

    def read_sealed(self, path: str | os.PathLike, checksum: str | None = None) -> SealedStore:
        """:meth:`read`, then the root verified (:func:`check_root`; ``checksum``: the one the
        store must state, a task reopening what its driver checked); each chunk is then checked
        as it is read (the reader's ``digests``, :meth:`SealedStore.array`, :meth:`SealedStore.rows_of`).
        What every command that reads a store of this kind calls, before it writes anything. A
        store of an older format whose checksum covers every array (no digests) has them all
        hashed by the root check: verified whole, first, as it always was."""
        p, group, attrs = self.open(path)
        read = self.reader_at(p)
        digests = check_root(p, self.name, group, attrs, self.claims, self.error, checksum, read=read)
        return self.reader(path=str(p), attrs=attrs, _group=group, digests=digests, read_slab=read)

    def verify(self, path: str | os.PathLike) -> tuple[bool, str, str]:
        """``(ok, stored, recomputed)`` checksum of the sealed store at ``path`` under ``claims``:
        the root and every chunk."""
        p = Path(os.fspath(path))
        return verify_sealed(p, self.name, self.version, self.error, self.claims, oldest=self.oldest,
                             rewrite=f"distfit {self.name}", read=self.reader_at(p))

    def state(self, path: Path) -> str:
        """``"absent"``, ``"sealed"`` or ``"incomplete"`` at ``path``; FileExistsError for anything
        else (:func:`distfit.stores.files.store_state`)."""
        return store_state(path, self.name, self.name)

    def check_replaceable(self, path: Path) -> None:
        """Refuse (FileExistsError) to replace anything at ``path`` but a store of this kind."""
        check_store_kind(path, self.name, self.name)

    def create(self, path: Path, lay_out: Callable[..., None], **inputs: Any) -> zarr.Group:
        """Lay out an empty, incomplete store of this kind at ``path`` (driver only) and return
        its root group, open for writing: the root is created with ``distfit_format``,
        ``format_version`` and ``complete=False`` (every reader refuses it), then
        ``lay_out(root, **inputs)`` adds the store's arrays and attrs. On any error nothing is
        left at ``path``."""
        try:
            root = zarr.open_group(store=str(path), mode="w-", zarr_format=3)
            root.attrs.update({"distfit_format": self.name, "format_version": self.version, "complete": False})
            lay_out(root, **inputs)
        except BaseException:
            shutil.rmtree(path, ignore_errors=True)
            raise
        return zarr.open_group(store=str(path), mode="r+", zarr_format=3)

    def open_incomplete(self, path: Path) -> zarr.Group:
        """Reopen the incomplete store at ``path`` for ``--resume`` (its root group, open for
        writing) if it is of the format version this distfit writes; ValueError otherwise. The
        caller then checks it was started from the same inputs, and :meth:`check_laid_out`."""
        root = zarr.open_group(store=str(path), mode="r+", zarr_format=3)
        version = root.attrs.get("format_version")
        if version != self.version:
            raise ValueError(f"{path}: format_version {version!r} cannot be resumed by this distfit")
        return root

    def check_laid_out(self, root: zarr.Group, path: Path, nodes: Sequence[str]) -> None:
        """ValueError naming the first of ``nodes`` (arrays, groups) the incomplete store at
        ``path`` lacks: a damaged store, not resumed."""
        try:
            for name in nodes:
                root[name]
        except KeyError as error:
            raise ValueError(f"{path}: damaged incomplete {self.name} (missing {error}); use --overwrite") from None


def lay_out_units(root: zarr.Group, *, units: int, chunk_units: int, ids_dtype: Any, parents: Any = None,
                  parent_column: str | None = None) -> None:
    """Lay out the per-unit arrays of a store built chunk by chunk (:data:`UNIT_DIMS`): the empty
    ``unit_ids`` and ``unit`` (``ids_dtype``; ``str``: variable-length UTF-8, compressed, else
    uncompressed so a chunk writes them as raw chunk files) and ``chunks/done`` (one uint8 zarr
    chunk per chunk of ``chunk_units`` units), all filled by the chunks, and, when the units have
    geography, ``parent_ids`` written whole from ``parents`` (a lazy array) with the root attr
    ``parent_column``."""
    config = {"write_empty_chunks": True}
    for name in ("unit_ids", "unit"):
        root.create_array(name, shape=(units,), dtype=ids_dtype, chunks=(chunk_units,),
                          compressors=None if ids_dtype is not str else "auto",
                          dimension_names=UNIT_DIMS[name], config=config)
    root.create_group("chunks").create_array(
        "done", shape=(-(-units // chunk_units),), dtype=np.uint8, chunks=(1,), fill_value=0, compressors=None,
        dimension_names=UNIT_DIMS["chunks/done"], config=config)
    if parents is not None:  # geography, not data: written whole (the checksum covers it)
        parents = np.asarray(parents[...])
        write_array(root, PARENT_IDS, parents.astype(object) if parents.dtype.kind in "TUO" else parents,
                    dims=UNIT_DIMS[PARENT_IDS])
        root.attrs["parent_column"] = parent_column
