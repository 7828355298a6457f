"""Writing a plan store (:mod:`distfit.stores.plan`: layout and reader), atomically.

:class:`PlanWriter` builds the store in a *staging* directory next to the final path
(``<path>.incomplete-<random>``), one block at a time (``write_block``: results stream in as
blocks complete; the driver never holds all of them), then ``finish`` computes the checksum
(:func:`distfit.stores.checksum.compute_checksum`, version 2: the arrays and the claims' attrs,
:func:`distfit.stores.plan.plan_claims`), writes the root attrs with ``complete=True`` and the
checksum, and renames the staging directory into place. A writer killed mid-write leaves only the
``*.incomplete-*`` directory, which :func:`distfit.stores.plan.read_plan` refuses; an exception
inside ``with PlanWriter(...)`` deletes it. With ``overwrite=True`` the old plan is renamed aside
(``<path>.replaced-<random>``) only once the new one is complete, the new one is renamed into
place, and only then is the old one deleted. (Directories cannot be swapped in one system call
portably, so between those two renames - microseconds - nothing is at the path; a crash exactly
there leaves the old plan in the ``.replaced-`` directory and the new one in the
``.incomplete-`` one, and ``read_plan`` of the missing path names both.)

Streamed planning (``distfit.plan.job``, large plans) also uses the staging store as scratch
space, under ``scratch/`` (not part of the layout): :meth:`PlanWriter.write_scratch` /
:meth:`~PlanWriter.read_scratch` keep arrays out of the driver's memory (spilled block specs),
:meth:`~PlanWriter.write_draft` stores a block in the block layout before its final scale
(e.g. ``scratch/round-1/<block_id>``), :meth:`~PlanWriter.promote_draft` moves a draft to
``blocks/<block_id>`` (a directory rename; the large arrays are written once) and rewrites the
arrays the scale changes, and :meth:`~PlanWriter.discard_scratch` drops what is no longer
needed. ``finish`` refuses to seal a plan while a draft is still unpromoted, deletes
``scratch/`` and only then computes the checksum, so a finished plan is the same store the
in-memory path writes. The root attrs say ``complete=False`` until ``finish``, so an
interrupted streamed write (a staging directory with some blocks) is refused like any other.

An in-memory plan's many solved blocks go into one solved pack instead
(:meth:`PlanWriter.write_solved`, format version 5: 13 arrays in all, not nine per block;
:mod:`distfit.stores.solved_pack`); streamed plans keep one group per block.

A writer is not thread-safe: write from the driver only (docs/design.md section 4); its
:meth:`PlanWriter.write_blocks` writes many blocks' files concurrently on zarr's event loop.
"""
from __future__ import annotations

import asyncio
import os
import secrets
import shutil
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import zarr
from zarr.core.sync import sync as zarr_sync

from distfit import __version__
from distfit.stores.files import (
    STAGING_MARKER,
    chunk_shape,
    fsync_tree,
    is_staging,
    jsonable,
    move_into_place,
    utc_now,
    write_array,
)
from distfit.mathematics.packing import PackedBlocks, QueryRuns, block_cells
from distfit.stores.plan import (
    FORMAT,
    PACK_ARRAYS,
    PACK_KIND,
    PACKED_VERSION,
    QUERY_VECTORS,
    ROOT_KEYS,
    RUNS_VERSION,
    SOLVED_VERSION,
    UNPACKED_VERSION,
    BlockRecord,
    PathLike,
    float_array,
    is_path_safe,
    is_plan_store,
    packed_ids,
    plan_checksum_claims,
    stored_form,
)
from distfit.stores.sealing import seal_checksum
from distfit.stores.solved_pack import RAGGED, SOLVED_GROUP, SOLVED_KIND, TABLES, pack_solved

WRITE_BATCH = 16  # blocks written per round trip to zarr's event loop (PlanWriter.write_blocks)

#: Zarr v3 ``dimension_names`` of the plan's arrays (README "Store formats"; what xarray shows).
#: Within one block group each name has one size: ``basis_row`` and ``basis_col`` k (the rows of
#: B; sigma is k x k, and xarray wants two names for its two axes), ``cell`` d_b (the cells of
#: the block's marginal), ``block_query`` m_b (the rows of L, one per workload query the block
#: serves; ``query_index`` says which). ``query`` is the workload query (m) of ``queries/``.
#: A plan has no coordinate arrays: adding arrays would change every plan's checksum (it covers
#: every array), and a block's rows and cells are labelled by ``query_index`` and the plan's
#: ``spec``/``schema`` attrs already. Metadata only: the checksum does not see these names.
BLOCK_DIMS: dict[str, tuple[str, ...]] = {
    "basis": ("basis_row", "cell"),
    "recon": ("block_query", "basis_row"),
    "query_index": ("block_query",),
    "sigma": ("basis_row", "basis_col"),
    "targets": ("block_query",),
    "variances": ("block_query",),
    "profile": ("cell",),
    "cell_weights": ("cell",),  # the dual certificate (stores.plan.CERTIFICATE_ARRAYS)
    "query_weights": ("block_query",),
}
QUERY_DIMS = ("query",)  # queries/targets and queries/variances
#: Dimension names of the run form of a query vector (stores.plan: queries/<prefix>_values, _offsets).
RUN_DIMS = {"values": "{prefix}_run", "offsets": "{prefix}_run_edge"}
SCRATCH = "scratch"  # the staging store's scratch group (streamed planning); never in a finished plan
RESCALED_ARRAYS = ("sigma", "targets", "variances", "profile")  # what promote_draft may rewrite


class PlanWriter:
    """Write a plan store atomically; see the module docstring.

    >>> with PlanWriter("plan.zarr") as w:                      # doctest: +SKIP
    ...     for rec in finished_blocks():                       # stream blocks as they complete
    ...         w.write_block(rec)
    ...     w.finish(spec=..., schema=..., queries_targets=c, queries_variances=v,
    ...              alpha=a, alpha_exact=True, rho=a / 2, composition="sequential")

    ``queries_targets`` and ``queries_variances`` may be per-query arrays or
    :class:`distfit.mathematics.packing.QueryRuns`; the store holds each in the form
    :func:`distfit.stores.plan.stored_form` chooses for the vector, whichever was given.

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
                {"distfit_format": FORMAT, "format_version": UNPACKED_VERSION, "complete": False})
            self._blocks = self._group.create_group("blocks")
            self._group.create_group("queries")
        except BaseException:
            self.abort()
            raise
        self._block_ids: set[str] = set()
        self._max_query_index = -1
        self._drafts: dict[str, tuple[str, int]] = {}  # scratch key -> (block_id, max query index)
        self._packs: list[PackedBlocks] = []  # written packs, checked against the schema in finish
        self._solved: list[str] | None = None  # the schema names a solved pack was written on

    # -- lifecycle

    def _check_target(self) -> None:
        p = self.path
        if not (p.exists() or p.is_symlink()):
            return
        if not p.is_dir() or not is_plan_store(p):
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
        self._write_block_files(record, self._admit(record, "write_block expects a BlockRecord"))

    def _admit(self, record: BlockRecord, expects: str) -> dict:
        """Check a block about to be written, register its id and query range; returns its attrs."""
        if not isinstance(record, BlockRecord):
            raise TypeError(f"{expects}, got {type(record).__name__}")
        if record.block_id in self._block_ids:
            raise ValueError(f"block_id: {record.block_id!r} was already written")
        attrs = jsonable(
            {"attributes": list(record.attributes), "alpha": record.alpha,
             "lower_bound": record.lower_bound, "solver": record.solver},
            f"blocks/{record.block_id} attrs")
        self._block_ids.add(record.block_id)  # a failed write must not be retried under the same id
        if record.query_index.size:
            self._max_query_index = max(self._max_query_index, int(record.query_index.max()))
        return attrs

    def _write_block_files(self, record: BlockRecord, attrs: dict) -> None:
        g = self._blocks.create_group(record.block_id)
        for name, data in record.arrays.items():
            write_array(g, name, data, dims=BLOCK_DIMS[name])
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
            pending.append((record, self._admit(record, "write_blocks expects BlockRecords")))
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

            async def write_array(name: str, data: np.ndarray) -> None:
                arr = await group.create_array(
                    name, shape=data.shape, dtype=data.dtype,
                    chunks=chunk_shape(data.shape, data.dtype.itemsize),
                    dimension_names=BLOCK_DIMS[name],
                    config={"write_empty_chunks": True},
                )
                if data.size:
                    await arr.setitem(Ellipsis, data)

            await asyncio.gather(*(write_array(name, data) for name, data in record.arrays.items()))
            await group.update_attributes(attrs)

        async def write_all() -> None:
            await asyncio.gather(*(write_one(record, attrs) for record, attrs in pending))

        zarr_sync(write_all())

    def write_solved(self, records: Iterable[BlockRecord], schema_attributes: Sequence[str]) -> int:
        """Write many solved blocks as the plan's one solved pack, ``solved/`` (format version 5;
        layout: :mod:`distfit.stores.plan`, :mod:`distfit.stores.solved_pack`): 13 arrays whatever
        the number of blocks, where :meth:`write_blocks` writes nine per block. Each record is
        checked as :meth:`write_block` checks it (ids unique across every block written, its
        attrs JSON); each must have its certificate arrays (NaN allowed) and attributes among
        ``schema_attributes``, the schema's attribute names, which ``finish`` must be given.
        Blocks are read back in ``block_ids`` order whatever the order here. Returns the number
        of blocks written."""
        self._require_open()
        if self._solved is not None:
            raise ValueError("write_solved: a plan has one solved pack, and it was already written")
        names = [str(a) for a in schema_attributes]
        records = list(records)
        solvers = [self._admit(record, "write_solved expects BlockRecords")["solver"] for record in records]
        tables, ragged = pack_solved(records, names)
        attrs = jsonable({"kind": SOLVED_KIND, "block_ids": list(tables.block_ids), "solvers": solvers},
                         f"{SOLVED_GROUP} attrs")
        self._solved = names
        group = self._group.create_group(SOLVED_GROUP)
        for name, (_, dims) in TABLES.items():
            write_array(group, name, np.ascontiguousarray(getattr(tables, name)), dims=dims)
        for name, (_, _, dim) in RAGGED.items():
            write_array(group, name, ragged[name], dims=(dim,))
        group.attrs.update(attrs)
        return len(records)

    def write_packed(self, blocks: PackedBlocks) -> None:
        """Write a pack of closed-form residual blocks (:class:`distfit.mathematics.packing.PackedBlocks`)
        as ``packs/p<i>`` (``i`` counts the packs written; layout: :mod:`distfit.stores.plan`):
        ten arrays whatever the number of blocks. Any number of packs, in any order with
        :meth:`write_block`. What needs the schema (positions in range, attribute sizes > 1,
        queries in range, ids distinct from every other block's) is checked by :meth:`finish`.
        A plan with a pack is written as format version 3 (4 if it also stores runs of queries,
        5 if it has a solved pack)."""
        self._require_open()
        if not isinstance(blocks, PackedBlocks):
            raise TypeError(f"write_packed expects PackedBlocks, got {type(blocks).__name__}")
        pack_id = f"p{len(self._packs)}"
        attrs = jsonable({"kind": PACK_KIND, "solver": blocks.solver}, f"packs/{pack_id} attrs")
        self._packs.append(blocks)  # a failed write is not retried under the same id
        group = self._group.require_group("packs").create_group(pack_id)
        for name, dims in PACK_ARRAYS.items():
            write_array(group, name, np.ascontiguousarray(getattr(blocks, name)), dims=dims)
        group.attrs.update(attrs)

    def _check_packs(self, schema: dict, m: int) -> None:
        """The packs against the schema and the m queries (ValueError naming the pack)."""
        sizes = np.asarray(schema["sizes"], dtype=np.int64)
        seen = set(self._block_ids)
        for i, pack in enumerate(self._packs):
            where = f"packs/p{i}"
            for name in ("attributes", "segment_clique"):
                arr = getattr(pack, name)
                if arr.size and arr.max() >= sizes.size:
                    raise ValueError(f"{where}/{name}: schema position {int(arr.max())}, but the schema has "
                                     f"{sizes.size} attributes")
            own = pack.attributes
            if own.size and np.any((own >= 0) & (sizes[np.maximum(own, 0)] < 2)):
                raise ValueError(f"{where}/attributes: a residual block cannot hold an attribute of size 1")
            if pack.segments:
                last = pack.segment_query + block_cells(sizes, pack.segment_clique) - 1
                if int(last.max()) >= m:
                    raise ValueError(f"queries_targets: {where} refers to query {int(last.max())}, but there "
                                     f"are only {m}")
            ids = packed_ids(schema, pack)
            clash = seen.intersection(ids)
            if clash or len(set(ids)) != len(ids):
                first = sorted(clash)[0] if clash else next(b for b in ids if ids.count(b) > 1)
                raise ValueError(f"{where}: block id {first!r} is written twice")
            seen.update(ids)

    @property
    def block_ids(self) -> tuple[str, ...]:
        """Blocks written so far (sorted)."""
        return tuple(sorted(self._block_ids))

    # -- scratch space (streamed planning; module docstring)

    def _scratch_parts(self, key: str) -> list[str]:
        parts = key.split("/") if isinstance(key, str) else []
        if not parts or not all(is_path_safe(p) for p in parts):
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
            data = np.ascontiguousarray(data)
            # A block array (a draft, a spilled basis) gets its block dimension names, so a
            # promoted draft is the same store write_block makes; anything else generic ones.
            dims = BLOCK_DIMS.get(name) or tuple(f"{name}_dim{axis}" for axis in range(data.ndim))
            write_array(group, name, data, dims=dims)
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
            key, record.arrays,
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
            arr = float_array(name, data, len(draft[name].shape))
            if arr.shape != tuple(draft[name].shape):
                raise ValueError(f"{name}: shape {arr.shape}, but the draft's is {tuple(draft[name].shape)}")
            arrays[name] = np.ascontiguousarray(arr)
        attrs = jsonable(dict(attrs), f"blocks/{block_id} attrs")
        del self._drafts[key]
        self._block_ids.add(block_id)  # as in write_block: a failed promotion is not retried under this id
        os.rename(self.staging_path / SCRATCH / key, self.staging_path / "blocks" / block_id)
        group = self._blocks[block_id]
        for name, data in arrays.items():
            write_array(group, name, data, dims=BLOCK_DIMS[name], overwrite=True)
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
        targets = _query_runs("queries_targets", queries_targets)
        variances = _query_runs("queries_variances", queries_variances)
        if variances.size != targets.size:
            raise ValueError(
                f"queries_variances: shape ({variances.size},) does not match queries_targets ({targets.size},)")
        m = targets.size
        if self._max_query_index >= m:
            raise ValueError(
                f"queries_targets: a block refers to query {self._max_query_index}, but there are only {m}")
        if not isinstance(spec, Mapping):
            raise ValueError(f"spec: expected a dict, got {type(spec).__name__}")
        schema = _check_schema(schema)
        if self._solved is not None and schema["attributes"] != self._solved:
            raise ValueError(f"schema: attributes {schema['attributes']} are not those the solved pack was "
                             f"written on ({self._solved})")
        self._check_packs(schema, m)
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
        as_runs = False
        for name, runs, given in (("targets", targets, queries_targets), ("variances", variances, queries_variances)):
            as_runs |= _write_vector(queries, name, runs, given)
        attrs = jsonable({
            **extra,
            "distfit_format": FORMAT,
            "format_version": (SOLVED_VERSION if self._solved is not None else RUNS_VERSION if as_runs
                               else PACKED_VERSION if self._packs else UNPACKED_VERSION),
            "spec": spec,
            "schema": schema,
            "alpha": float(alpha),
            "alpha_exact": bool(alpha_exact),
            "rho": float(rho),
            "composition": composition,
            "created": utc_now(),
            "distfit_version": __version__,
            "complete": True,
        })
        # The version-2 checksum: the arrays and the attrs that state the plan's claims, read
        # back as a reader will see them (the blocks' attrs from the store).
        checksum = seal_checksum(self._group, attrs, plan_checksum_claims)
        attrs["checksum"] = checksum
        # One write of zarr.json: attrs.update would rewrite it once per key (a 100,000-group
        # spec is megabytes of JSON: 8 of 9.8 s of writing a 20,000-block packed plan).
        self._group.update_attributes(attrs)
        if self.fsync:
            fsync_tree(self.staging_path)
        self._move_into_place()
        self._state = "finished"
        return checksum

    def _move_into_place(self) -> None:
        move_into_place(self.staging_path, self.path, lambda _: self._check_target(), fsync=self.fsync)


def _query_runs(name: str, vector: Any) -> QueryRuns:
    """A per-query vector (array or runs) as merged runs; ValueError naming ``name``."""
    if isinstance(vector, QueryRuns):
        return vector.canonical()
    return QueryRuns.encode(float_array(name, vector, 1))


def _write_vector(queries: zarr.Group, name: str, runs: QueryRuns, given: Any) -> bool:
    """Write ``queries/<name>``, the vector ``runs`` (``given`` as the caller gave it), in its
    stored form (:func:`distfit.stores.plan.stored_form`); whether as runs."""
    if not stored_form(runs):
        per_query = runs.expand() if isinstance(given, QueryRuns) else float_array(name, given, 1)
        write_array(queries, name, np.ascontiguousarray(per_query), dims=QUERY_DIMS)
        return False
    prefix = QUERY_VECTORS[name]
    for part, data in (("values", runs.values), ("offsets", runs.offsets)):
        write_array(queries, f"{prefix}_{part}", data, dims=(RUN_DIMS[part].format(prefix=prefix),))
    return True


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


__all__ = ["BLOCK_DIMS", "PlanWriter", "QUERY_DIMS", "RESCALED_ARRAYS", "RUN_DIMS", "WRITE_BATCH"]
