"""Release stores: the layout, writing one chunk at a time, sealing, and the reader.

Layout (**contract**, docs/design.md section 4), a Zarr v3 group::

    release.zarr/        attrs: distfit_format="release", format_version=3, plan_checksum,
                                plan_path, schema ({"attributes", "sizes"} of the plan), private
                                (False with --seed), created, distfit_version, units,
                                chunk_units, n_chunks, data ({"path", "created"} of the data
                                store: for --resume only), complete (False until sealed), and
                                at seal: checksum, sealed (time)
      blocks/<block_id>/answers  (units, m_b) float64   the block's noisy L (B x + z); not
                                 stored for a *derived* block (below)
                                 attrs: attributes, block_index (its noise-stream position),
                                 and answers_in="queries/answers" for a derived block
      blocks/<block_id>/query_index (m_b,) int64  a derived block only: the query of each row
      packs/<pack_id>/measurements (units, K) float64   a packed plan's blocks (no group each):
                                 their noisy basis measurements B x + z, k_b columns per block in
                                 the plan's pack order (:func:`packed_columns`)
      packs/<pack_id>/offsets    (n + 1,)     int64     block i's columns offsets[i]:offsets[i + 1]
      queries/answers            (units, m)   float64   each query's answer (sum of its rows)
      queries/variances          (m,)         float64   copied from the plan
                                 group attrs: labels (list of m strings ``GROUP:LABEL``, or
                                 None when the plan's spec cannot be parsed into m labels)
      unit_ids                   (units,)     the data's unit ids (numeric, or variable-length
                                              UTF-8 strings: the Zarr v3 ``string`` data type)
      parent_ids                 (units,)     geography, when the data has it: each unit's parent
                                              id (root attr ``parent_column`` names its column;
                                              :mod:`distfit.stores.data`), written at lay-out
      chunks/done                (n_chunks,)  uint8, one zarr chunk per release chunk: 1 once
                                              every array of that chunk is written
      chunks/digests             (n_chunks, arrays, 32) uint8: a BLAKE3 digest per chunk of every array
                                              the chunks write (attr ``arrays``), written by the
                                              chunk before its done marker
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

Derived blocks (:func:`distfit.release.noise.derived_blocks`): a block each of whose rows is the
only row, in the whole plan, of its query (every block of a single-block plan, e.g. PL94) has
answers equal, bit for bit, to columns of the query answers (query ``j``'s answer is ``0.0 +``
its one row; a row of exactly -0.0, probability 0, reads back as +0.0). Writing them twice
would double the bytes written, fsynced and hashed (PL94: 5,120 -> 2,568 bytes per unit), so
such a block stores ``query_index`` instead of ``answers`` and the attr ``answers_in``;
:meth:`Release.block_answers` returns ``queries/answers[:, query_index]`` for it, read lazily
(:class:`DerivedAnswers`), and in xarray it is ``tree["queries"]["answers"].isel(query=
tree["blocks/<id>"]["query_index"])``. A plan none of whose blocks is derived (plans of
merged residual blocks, where a query has rows in several blocks) gets the layout and the
checksum it always had. A release laid out with every block's answers (before derived blocks)
reads, verifies and resumes in its own layout: what a chunk writes is what the store holds.

Packed blocks (a plan with packs, :mod:`distfit.stores.plan`): the release stores what the
mechanism releases, each block's ``B x + z`` (k_b numbers per unit, fewer than its m_b rows),
in one array per pack, and no group per block (half a million blocks would be a million
files); :meth:`Release.block_answers` gives a packed block's answers ``measurements @ recon^T``
with ``recon`` from the plan (still holding ``plan_checksum``). A pack's blocks draw their noise
from one stream per (pack, chunk) (:mod:`distfit.release.packed`, which computes the whole
pack in a few array operations), so the same seed gives other noise than the same blocks
stored one group each; for the same draws the answers agree to rounding (1e-15 relative).

Laid out in one zarr call (:func:`distfit.stores.files.create_nodes`), not one per node: a plan
of many small blocks (Adult's 470: ~1,400 nodes) cost 7-9 CPU-s to lay out one call at a time.
The layout, and so the format, is unchanged by that (the decision, docs/stores.md "Release
store": packing every block's answers would change the noise streams of a plan that is not
packed).

Answer arrays are chunked over units only, ``(r, m_b)`` with ``r`` the largest divisor of
``chunk_units`` (the data's chunk size) that keeps a chunk under 16 MiB (:func:`answer_chunks`),
so each release chunk (one task) owns whole zarr chunks and no two tasks touch the same file.
Answer arrays are stored uncompressed (:data:`ANSWER_COMPRESSORS`: noisy float64 does not
compress), and so are numeric unit ids and the done markers (a chunk writes them as raw chunk
files, :mod:`distfit.stores.release_chunks`; stores laid out before with zstd ids read and
resume as before). Query labels are a JSON attr, not an array: fixed-width UTF-32 has no Zarr
v3 specification. The checksum is :func:`distfit.stores.checksum.compute_checksum` over every
array of the store and every attr it states (:func:`distfit.stores.sealing.stated_attrs`: all
but the checksum, ``complete`` and the two timestamps; the same format as the plan's; codecs are
not hashed), written when the release is sealed. A release of format 1 (arrays only: its
``private`` flag and ``units`` were outside the checksum) is refused by every reader with the
command that writes it anew, and so is one of format 2 (no per-chunk digests). The checksum
(version 3) covers the chunk digests instead of the arrays they stand for
(:mod:`distfit.stores.sealing`). Every command that reads a release reads it with
:func:`read_sealed_release`: the root recomputed before anything is written, then every chunk
it reads checked as it reads it (the reader's arrays are
:class:`distfit.stores.sealing.CheckedArray`; a task of ``estimate`` reads its rows with
:meth:`~distfit.stores.sealing.SealedStore.rows_of`), whether it reads a few units (``report``)
or all of them (``export``, the levels of a multi-level run): no separate pass.

Never stored: the counts, true marginals or true answers, the entropy, the ``--seed`` (a seeded
release records only ``private=False``), and no attr derived from the data beyond ``units``.

Store lifecycle (the orchestration is :func:`distfit.release.job.run_release`):
:func:`create_release` lays out an empty store with ``complete=False`` (every reader refuses
it); each task writes its chunks' arrays and, last, their ``chunks/done`` entries, while the
driver fsyncs and hashes the chunks reported done (:mod:`distfit.stores.release_chunks`:
``write_chunk``, ``ChunkSync``, ``ReleaseHasher``); :func:`seal` checks the plan is unchanged
and every chunk done, then writes the checksum and ``complete=True``.
:func:`open_resumable` reopens an incomplete store for ``--resume`` after checking it belongs
to the same plan and data; :func:`release_state` says what is at a path. :func:`read_release`
(unchecked), :func:`read_sealed_release` (checked as read) and :func:`verify_release` (the whole
checksum) read a sealed store.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np
import zarr

from distfit import __version__
from distfit.release.noise import block_positions, derived_blocks
from distfit.release.packed import pack_offsets, pack_query_rows
from distfit.stores.files import chunk_shape, create_nodes, filled_array, jsonable, utc_now
from distfit.stores.plan import read_plan, verify_checksum
from distfit.stores.release_chunks import ReleaseHasher, chunk_arrays, raw_reader, seal_chunked
from distfit.stores.checksum import DIGESTS
from distfit.stores.sealing import (
    DIGEST_DIMS,
    UNIT_DIMS,
    SealedKind,
    SealedStore,
    lay_out_digests,
    lay_out_units,
    root_attr,
    store_array,
)

FORMAT = "release"
#: 3: per-chunk digests (``chunks/digests``, :func:`distfit.stores.sealing.lay_out_digests`) of
#: the arrays the chunks write, and the checksum over the attrs, the small arrays and those
#: digests (checksum version 3); 2: the checksum over every array and stated attr
#: (:func:`distfit.stores.sealing.stated_attrs`); 1: the arrays only. A release older than 3 is
#: refused with the command that writes it anew: its chunks cannot be checked as they are read.
FORMAT_VERSION = 3

#: Compressors of the answer arrays: none (raw little-endian float64). Noisy answers do not
#: compress: zarr's default zstd saved 3 % of the bytes of a PL94 release, for ~0.08 s of encoding
#: per 4096 x 319 chunk in the tasks (about 135 MB/s here) and ~0.02-0.04 s of decoding it again in
#: the seal's checksum read. The checksum is over the decoded values, so it does not depend on this
#: choice, and readers decode whatever codecs a store records (older zstd stores read as before).
ANSWER_COMPRESSORS: Any = None

#: The ``answers_in`` attr of a derived block's group: where its answers are (module docstring).
DERIVED_FROM = "queries/answers"

#: Dimension names (Zarr v3 ``dimension_names``) of every release array, by path pattern
#: (module docstring); ``<block_id>`` stands for every block.
DIMS: dict[str, tuple[str, ...]] = {
    "blocks/<block_id>/answers": ("unit", "block_query"),
    "blocks/<block_id>/block_query": ("block_query",),
    "blocks/<block_id>/query_index": ("block_query",),
    "packs/<pack_id>/measurements": ("unit", "measurement"),
    "packs/<pack_id>/offsets": ("block_edge",),
    "queries/answers": ("unit", "query"),
    "queries/variances": ("query",),
    "queries/query": ("query",),
    **UNIT_DIMS,
    DIGESTS: DIGEST_DIMS,
}


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
                   labels: list[str] | None, progress: Callable[[int, int], None] | None = None) -> zarr.Group:
    """Lay out an empty, incomplete release store at ``path`` (driver only) and return its root
    group, open for writing. ``labels`` are the query labels (module docstring). On any error
    nothing is left at ``path`` (:meth:`distfit.stores.sealing.SealedKind.create`).
    ``progress(done, total)`` is called as the blocks are laid out (a group and one to two
    arrays each, every node in one zarr call: :func:`distfit.stores.files.create_nodes`)."""
    return RELEASE.create(path, _lay_out, plan=plan, plan_path=plan_path, data=data, blocks=blocks, private=private,
                          labels=labels, progress=progress)


def _lay_out(root: zarr.Group, *, plan, plan_path: str, data, blocks, private: bool, labels,
             progress: Callable[[int, int], None] | None = None) -> None:
    units, chunk_units = data.units, data.chunk_units
    n_chunks = -(-units // chunk_units)
    m = len(plan.queries_targets)
    positions = block_positions(plan)
    config = {"write_empty_chunks": True}
    label_array = None if labels is None else np.array(list(labels), dtype=object)  # text coordinates
    packed = packed_columns(plan, blocks)
    in_packs = {b for ids, _ in packed.values() for b in ids}
    rows = {b: block.query_index for b, block in blocks.items() if b not in in_packs}
    if packed:  # a query with a row in a pack has two rows once an explicit block holds one too
        sizes = list(plan.attrs["schema"]["sizes"])
        rows[""] = np.concatenate([pack_query_rows(pack, sizes) for pack in plan.packs()])
    derived = set(derived_blocks(rows, m)) - in_packs - {""}
    groups: dict[str, dict] = {"blocks": {}}
    arrays: dict[str, dict] = {}
    for pack_id, (ids, offsets) in packed.items():  # one measurements array per pack, not a group per block
        groups[f"packs/{pack_id}"] = {}
        arrays[f"packs/{pack_id}/measurements"] = dict(
            shape=(units, int(offsets[-1])), dtype=np.float64, chunks=answer_chunks(chunk_units, int(offsets[-1])),
            compressors=ANSWER_COMPRESSORS, dimension_names=DIMS["packs/<pack_id>/measurements"], config=config)
        arrays[f"packs/{pack_id}/offsets"] = filled_array(offsets, dims=DIMS["packs/<pack_id>/offsets"],
                                                          where=f"packs/{pack_id}/offsets")
    if packed:
        groups["packs"] = {}
    for block_id, block in blocks.items():
        if block_id in in_packs:
            continue
        m_b = block.recon.shape[0]
        query_index = np.asarray(block.query_index, dtype=np.int64)
        attrs = {"attributes": list(block.attributes), "block_index": positions[block_id]}
        path = f"blocks/{block_id}"
        if block_id in derived:  # its answers are queries/answers[:, query_index] (module docstring)
            arrays[f"{path}/query_index"] = filled_array(query_index, dims=DIMS["blocks/<block_id>/query_index"],
                                                         where=f"{path}/query_index")
            attrs["answers_in"] = DERIVED_FROM
        else:
            arrays[f"{path}/answers"] = dict(
                shape=(units, m_b), dtype=np.float64, chunks=answer_chunks(chunk_units, m_b),
                compressors=ANSWER_COMPRESSORS, dimension_names=DIMS["blocks/<block_id>/answers"], config=config)
        if label_array is not None:
            arrays[f"{path}/block_query"] = filled_array(label_array[query_index],
                                                         dims=DIMS["blocks/<block_id>/block_query"],
                                                         where=f"{path}/block_query")
        groups[path] = attrs
    groups["queries"] = {"labels": labels}
    arrays["queries/answers"] = dict(shape=(units, m), dtype=np.float64, chunks=answer_chunks(chunk_units, m),
                                     compressors=ANSWER_COMPRESSORS, dimension_names=DIMS["queries/answers"],
                                     config=config)
    arrays["queries/variances"] = filled_array(np.asarray(plan.queries_variances, dtype=np.float64),
                                               dims=DIMS["queries/variances"], where="queries/variances")
    if label_array is not None:
        arrays["queries/query"] = filled_array(label_array, dims=DIMS["queries/query"], where="queries/query")
    # every node in one concurrent write each (files.create_nodes): one zarr call at a time, a
    # group, its attrs and an array or two per block cost 15 calls a block (Adult: 470 blocks)
    def nodes_done(done: int, total: int) -> None:  # reported as blocks, the unit of the line
        if progress is not None and blocks:
            progress(len(blocks) * done // total, len(blocks))

    create_nodes(root, groups, arrays, progress=nodes_done)
    ids_dtype = np.dtype(data.unit_ids.dtype)
    if ids_dtype.kind in "TUO":
        ids_dtype = str  # variable-length UTF-8 (the Zarr v3 "string" data type)
    elif ids_dtype.kind not in "iuf":
        raise ValueError(f"{data.path}: unit_ids of dtype {ids_dtype} are not supported (numbers or strings)")
    # Written by the chunks (write_chunk). Numeric ids and the done markers are uncompressed, like
    # the answers, so a chunk writes them as raw chunk files (ChunkWriter.write_rows): zarr's
    # pipeline cost ~4 ms of CPU per call here, 3 calls per chunk, for 16 bytes a unit. The
    # parent ids (geography, not data) the driver copies whole.
    parents = getattr(data, "parent_ids", None)
    lay_out_units(root, units=units, chunk_units=chunk_units, ids_dtype=ids_dtype, parents=parents,
                  parent_column=data.parent_column if parents is not None else None)
    # a digest per chunk of every array the chunks write (ChunkWriter.write_arrays hashes each
    # chunk's rows as it writes them): what an estimate checks each chunk it reads against
    lay_out_digests(root, [name for name in chunk_arrays(root) if name != "chunks/done"], units=units,
                    chunk_units=chunk_units)
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


def packed_columns(plan, blocks: Mapping[str, Any]) -> dict[str, tuple[tuple[str, ...], np.ndarray]]:
    """``{pack_id: (block ids in pack order, offsets)}`` of a packed plan (empty for another):
    block ``ids[i]``'s measurements ``X_b B^T + Z`` (k_b of them) are the columns
    ``offsets[i]:offsets[i + 1]`` of ``packs/<pack_id>/measurements`` (module docstring)."""
    out = {}
    packs = plan.packs() if getattr(plan, "pack_ids", ()) else ()
    for p, (pack_id, pack) in enumerate(zip(getattr(plan, "pack_ids", ()), packs)):
        out[pack_id] = (plan.packed_block_ids(p), pack_offsets(pack, plan.attrs["schema"]["sizes"]))
    return out


def open_resumable(path: Path, *, plan, data, private: bool, blocks: Mapping[str, Any]) -> zarr.Group:
    """Open an incomplete release for ``--resume`` after checking it belongs to these inputs
    (the plan's checksum, seeded or not, the data's schema, units, chunking and ``created``,
    the blocks); ValueError naming what differs."""
    root = RELEASE.open_incomplete(path)
    attrs = dict(root.attrs)
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
    RELEASE.check_laid_out(root, path, ("blocks", "queries/answers", "unit_ids", "chunks/done"))
    laid_out = set(root["blocks"].group_keys())
    in_packs = {b for ids, _ in packed_columns(plan, blocks).values() for b in ids}
    if laid_out != set(blocks) - in_packs:
        raise ValueError(f"{path}: its blocks do not match the plan's; use --overwrite")
    return root


def plan_change(plan_path: str, plan_checksum: str, during: str) -> str | None:
    """What the seal of a release and of an estimate (``during``: which) checks first: None
    while the plan at ``plan_path`` still holds ``plan_checksum`` (recomputed from its arrays,
    :func:`distfit.stores.plan.verify_checksum`), else the message saying it changed."""
    ok, stored, recomputed = verify_checksum(plan_path)
    if ok and stored == plan_checksum:
        return None
    return f"{plan_path}: the plan changed during the {during} (checksum {recomputed}, started from {plan_checksum})"


def seal(root: zarr.Group, path: Path, *, plan_path: str, plan_checksum: str, fsync: bool,
         hasher: ReleaseHasher | None = None, synced: Mapping[str, tuple[int, ...]] | None = None) -> str:
    """Verify the plan is unchanged and every chunk done, then checksum and mark complete.

    The plan's checksum is recomputed from its arrays (:func:`distfit.stores.plan.verify_checksum`)
    and must equal ``plan_checksum``, the one audited at the start: a plan rewritten or altered
    in place during the release leaves the release incomplete (ValueError). That check runs
    while :func:`distfit.stores.release_chunks.seal_chunked` checks the chunks, takes the
    release checksum (the ``hasher``'s, :class:`ReleaseHasher`, hashed while the chunks were
    written, or, without one or if it failed, computed from the store) and fsyncs (``synced``:
    the files fsynced as they landed). Returns the release checksum."""
    def check() -> None:
        changed = plan_change(plan_path, plan_checksum, "release")
        if changed is not None:
            raise ValueError(f"{changed}; the release at {path} is left incomplete")

    return seal_chunked(root, path, fsync=fsync, hasher=hasher, synced=synced, check=check)


# --------------------------------------------------------------------------------------------
# reading


class Release(SealedStore):
    """A sealed release store opened for reading; arrays are lazy zarr arrays (the shared
    readers of :class:`distfit.stores.sealing.SealedStore`: checksum, labels, unit ids, parent ids)."""

    private = root_attr("private", bool)
    answers = store_array("queries/answers", "``queries/answers`` (units x m).")

    @property
    def variances(self) -> np.ndarray:
        return np.asarray(self._group["queries/variances"][...])

    @property
    def block_ids(self) -> tuple[str, ...]:
        return tuple(sorted(self._group["blocks"].group_keys()))

    def block_answers(self, block_id: str):
        """``blocks/<block_id>/answers`` (units x m_b): the zarr array, or for a derived block
        (module docstring) a :class:`DerivedAnswers` view of ``queries/answers[:, query_index]``
        (index it like the array: ``[a:b]``, ``[i]``, ``[...]``)."""
        if block_id not in self._group["blocks"] and "packs" in self._group:
            return self._packed_answers(block_id)
        group = self._group[f"blocks/{block_id}"]
        if "answers" in group:
            return self.array(f"blocks/{block_id}/answers")
        if group.attrs.get("answers_in") != DERIVED_FROM or "query_index" not in group:
            raise ReleaseError(f"{self.path}: block {block_id} has neither answers nor a query_index")
        return DerivedAnswers(self.array(DERIVED_FROM), np.asarray(group["query_index"][...], dtype=np.int64))


    def _packed_answers(self, block_id: str) -> np.ndarray:
        """A packed block's answers (module docstring): its measurements times its ``recon^T``
        from the plan (which must still hold the release's ``plan_checksum``)."""
        plan = read_plan(self.attrs["plan_path"])
        if plan.checksum != self.attrs.get("plan_checksum"):
            raise ReleaseError(f"{self.path}: the plan at {plan.path} is not the one released (checksum "
                               f"{plan.checksum}, released {self.attrs.get('plan_checksum')})")
        for p, pack_id in enumerate(plan.pack_ids):
            ids = plan.packed_block_ids(p)
            if block_id in ids:
                offsets = np.asarray(self._group[f"packs/{pack_id}/offsets"][...])
                i = ids.index(block_id)
                measurements = self.array(f"packs/{pack_id}/measurements")  # read whole: every chunk checked
                return np.asarray(measurements[:, offsets[i]:offsets[i + 1]]) @ plan.block(block_id).recon.T
        raise KeyError(f"{self.path}: no block {block_id!r}")


class DerivedAnswers:
    """A derived block's answers (module docstring): ``queries/answers[:, query_index]``, read
    lazily: indexing reads only the rows asked for. ``shape``, ``dtype``, ``ndim``,
    ``query_index``; ``np.asarray(view)`` reads it whole."""

    def __init__(self, answers: Any, query_index: np.ndarray) -> None:
        self._answers = answers
        self.query_index = query_index
        self.shape = (int(answers.shape[0]), int(query_index.size))
        self.dtype = np.dtype(answers.dtype)
        self.ndim = 2

    def __getitem__(self, key: Any) -> np.ndarray:
        key = key if isinstance(key, tuple) else (key,)
        if key and key[0] is Ellipsis:
            key = (slice(None),) + key[1:] if len(key) > 1 else ()
        rows, cols = (key[0], key[1:]) if key else (slice(None), ())
        block = np.take(np.asarray(self._answers[rows]), self.query_index, axis=-1)
        one_row = not isinstance(rows, slice) and np.ndim(rows) == 0  # an integer row: a 1-d result
        return block[(() if one_row else (slice(None),)) + cols] if cols else block

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = self[...]
        return out if dtype is None else out.astype(dtype)

    def __len__(self) -> int:
        return self.shape[0]


#: The release as a kind of sealed store (:class:`distfit.stores.sealing.SealedKind`), read as
#: raw chunk files. Its methods are the module's entry points:
#: ``read_release(path)`` (a :class:`Release`, or :class:`ReleaseError` saying why the store is
#: refused: missing, staging directory, not a release, newer format, incomplete, no checksum),
#: ``read_sealed_release(path)`` (the same, its root checked and each chunk checked as read),
#: ``verify_release(path)`` (``(ok, stored, recomputed)`` checksum), ``release_state(path)``
#: (``"absent"``, ``"sealed"`` or ``"incomplete"``; FileExistsError for anything else) and
#: ``check_replaceable(path)`` (FileExistsError unless a release store).
RELEASE = SealedKind(FORMAT, FORMAT_VERSION, ReleaseError, Release, oldest=FORMAT_VERSION, slabs=raw_reader)
read_release, read_sealed_release, verify_release = RELEASE.read, RELEASE.read_sealed, RELEASE.verify
release_state, check_replaceable = RELEASE.state, RELEASE.check_replaceable


__all__ = [
    "ANSWER_COMPRESSORS",
    "DERIVED_FROM",
    "FORMAT_VERSION",
    "DIMS",
    "DerivedAnswers",
    "RELEASE",
    "Release",
    "ReleaseError",
    "answer_chunks",
    "check_replaceable",
    "create_release",
    "open_resumable",
    "packed_columns",
    "plan_change",
    "read_release",
    "read_sealed_release",
    "release_state",
    "seal",
    "verify_release",
]
