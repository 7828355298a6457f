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

Reading and verifying: a command that reads a store it did not write verifies it first
(:meth:`SealedKind.read_verified`, :func:`distfit.stores.data.open_data` with ``verify=True``):
the whole checksum is recomputed once, by the driver, before anything is written or any noise
drawn, and a mismatch is one line naming the store. The tasks that then read the store's chunks
trust that verification (the window between the two is a documented limit, docs/stores.md).
"""
from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from distfit.stores.checksum import Reader, compute_checksum
from distfit.stores.files import (
    PARENT_IDS,
    check_format,
    check_store_kind,
    open_store,
    store_state,
    write_array,
)

__all__ = [
    "ClaimRule",
    "SealedKind",
    "SealedStore",
    "UNIT_DIMS",
    "UNSEALED_ATTRS",
    "arrays_only",
    "check_verified",
    "stated_attrs",
    "lay_out_units",
    "root_attr",
    "store_array",
    "open_sealed",
    "seal_checksum",
    "verify_opened",
    "verify_sealed",
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
    for name, member in group.members(max_depth=None):
        attrs = dict(member.attrs)
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


def verify_opened(group: zarr.Group, attrs: Mapping[str, Any], claims: ClaimRule = arrays_only
                  ) -> tuple[bool, str, str]:
    """``(ok, stored, recomputed)``: the checksum of an opened sealed store (:func:`open_sealed`)
    recomputed under its rule and compared with the one its attrs state."""
    stored = str(attrs["checksum"])
    recomputed = seal_checksum(group, attrs, claims)
    return stored == recomputed, stored, recomputed


def verify_sealed(path: str | os.PathLike, kind: str, version: int, error: type[Exception],
                  claims: ClaimRule = arrays_only, *, oldest: int = 1, rewrite: str = "") -> tuple[bool, str, str]:
    """:func:`open_sealed` (its refusals), then :func:`verify_opened` under ``claims``."""
    _p, group, attrs = open_sealed(path, kind, version, error, oldest=oldest, rewrite=rewrite)
    return verify_opened(group, attrs, claims)


def check_verified(path: str | os.PathLike, kind: str, group: zarr.Group, attrs: Mapping[str, Any],
                   claims: ClaimRule, error: type[Exception]) -> None:
    """Recompute the checksum of the opened sealed store at ``path`` (:func:`verify_opened`) and
    raise ``error`` in one line naming the store when it differs from the one it states: it was
    changed after it was sealed (an array, a chunk deleted, an attr edited) or a chunk no longer
    decodes (a flipped byte in a compressed chunk); an OSError (no permission, a disk error)
    passes as it is."""
    try:
        ok, stored, recomputed = verify_opened(group, attrs, claims)
    except OSError:
        raise
    except Exception as failure:  # noqa: BLE001 - a chunk that no longer decodes (codec errors vary)
        raise error(f"{os.fspath(path)}: the {kind} was changed after it was sealed: a chunk no longer "
                    f"reads ({type(failure).__name__}: {str(failure).splitlines()[0] if str(failure) else ''}); "
                    "it cannot be trusted") from None
    if not ok:
        raise error(f"{os.fspath(path)}: the {kind} was changed after it was sealed: its contents hash to "
                    f"{recomputed[:19]}..., not to the {stored[:19]}... it was sealed with; it cannot be trusted")


def root_attr(name: str, kind: Callable[[Any], Any]) -> property:
    """A sealed store reader's property (:class:`SealedStore`): its root attr ``name`` as ``kind``
    (``bool``, ``str``)."""
    return property(lambda store: kind(store.attrs[name]), doc=f"The root attr ``{name}``.")


def store_array(path: str, doc: str) -> property:
    """A sealed store reader's property (:class:`SealedStore`): the lazy zarr array at ``path``
    (``doc``: what it holds)."""
    return property(lambda store: store._group[path], doc=doc)


@dataclasses.dataclass(frozen=True, eq=False)
class SealedStore:
    """What every sealed store built chunk by chunk (a release, an estimate) gives its reader:
    its path, root attrs, checksum, query labels and lazy arrays by unit (``unit_ids``, and
    ``parent_ids`` where the units have geography). Opened by :func:`open_sealed`; a kind's
    reader adds its own attrs and arrays (:func:`root_attr`, :func:`store_array`)."""

    path: str
    attrs: dict
    _group: Any = dataclasses.field(repr=False)

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

    def open(self, path: str | os.PathLike) -> tuple[Path, zarr.Group, dict]:
        """:func:`open_sealed` for this kind."""
        return open_sealed(path, self.name, self.version, self.error, oldest=self.oldest,
                           rewrite=f"distfit {self.name}")

    def read(self, path: str | os.PathLike) -> SealedStore:
        """The sealed store at ``path`` opened for reading, or ``error`` saying why it is refused
        (missing, staging directory, another kind, a format too new or too old, incomplete, no
        checksum). Its checksum is not recomputed: :meth:`read_verified` does that."""
        p, group, attrs = self.open(path)
        return self.reader(path=str(p), attrs=attrs, _group=group)

    def read_verified(self, path: str | os.PathLike) -> SealedStore:
        """:meth:`read`, then the whole checksum recomputed (:func:`check_verified`): what every
        command that takes this store as input calls once, before it writes anything."""
        p, group, attrs = self.open(path)
        check_verified(p, self.name, group, attrs, self.claims, self.error)
        return self.reader(path=str(p), attrs=attrs, _group=group)

    def verify(self, path: str | os.PathLike) -> tuple[bool, str, str]:
        """``(ok, stored, recomputed)`` checksum of the sealed store at ``path`` under ``claims``."""
        return verify_sealed(path, self.name, self.version, self.error, self.claims, oldest=self.oldest,
                             rewrite=f"distfit {self.name}")

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
