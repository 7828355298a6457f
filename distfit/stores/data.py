"""The data stores: unit histograms (``distfit synth``) and tabulated marginals (``distfit tabulate``).

Both are Zarr v3 groups (docs/design.md section 4), written atomically (:func:`staged_store`) and
read for a release by :func:`open_data`. The data itself is drawn by :mod:`distfit.data.synthetic`
(histograms) or tabulated from microdata by :mod:`distfit.data.microdata` (marginals); this
module holds their layout, writers and readers.

Histograms store (**contract** for ``distfit release --data``, :func:`write_synthetic`)
--------------------------------------------------------------------------------------
N units (e.g. census blocks), each a histogram over the cells of the spec's domain (row-major
in the schema order, as in :class:`distfit.mathematics.domain.Domain`). A Zarr v3 group ``DATA.zarr`` with
attrs ``distfit_format="histograms"``, ``format_version=3``, ``schema`` ({"attributes": [names],
"sizes": [ints]}), ``spec_hash`` (of the spec it was made for; None from a bare domain),
``units``, ``cells``, ``seed``, ``chunk_units``, ``total_people``, ``model`` (the parameters),
``generator`` (``"distfit.data/1"``), ``created``, ``distfit_version`` and, written last,
``complete=True``; arrays

* ``counts``   (units, cells) int64, chunks ``(chunk_units, cells)`` (whole rows);
* ``unit_ids`` (units,) int64, chunks ``(chunk_units,)``: synthetic units are numbered
  ``0 .. units - 1``. (Readers should accept any 1-d ids; real data may carry string ids.)
* ``unit`` (units,) the unit ids again and ``cell`` (cells,) the cell labels
  (:func:`cell_labels`, strings): xarray coordinates (below).

The data is *synthetic*, not private: its seed is stored with it, and it is a function of the
seed, the domain, ``chunk_units`` and the model (:mod:`distfit.data.synthetic`).

Marginals store (**contract**, written by :func:`distfit.data.microdata.tabulate_microdata`)
-------------------------------------------------------------------------------------------
Per-unit counts of person-level microdata: a Zarr v3 group with attrs
``distfit_format="marginals"``, ``format_version=3``, ``schema``, ``spec_hash``, ``units``,
``chunk_units``, ``cliques`` (list of attribute-name lists in schema order: the maximal query
cliques of the spec's groups, plus any attribute sets the tabulation was asked to cover, e.g. a
plan's blocks; a set inside another is dropped), ``source`` ({"path", "format": "csv"|"parquet",
"rows", "size", "mtime"}), ``total_people``, ``created``, ``distfit_version`` and, last,
``complete=True``; arrays ``marginals/<i>`` (units, prod(sizes of clique i)) int64, chunks
``(chunk_units, cells)``, cells row-major in schema order, and ``unit_ids`` (units,) sorted
ascending: int64 when the source's unit column holds integers, otherwise variable-length UTF-8
strings (the Zarr v3 ``string`` data type with the ``vlen-utf8`` codec, which zarr-python 3.1
reads and writes natively; sorted by code point). The tabulation creates the arrays
(:func:`create_marginals`), its tasks fill whole chunks (:class:`MarginalsWriter`) and it
writes the attrs last (:func:`write_marginals_attrs`). Next to them: ``unit`` (the unit ids
again) and ``marginals/cell_<i>`` (the cell labels of clique i), xarray coordinates (below).

Geography (a level of a multi-level run, :func:`distfit.pipeline.run.run_levels`): when the units
lie inside the units of a coarser level, ``parent_ids`` (units,) holds each unit's parent id
(int64 or UTF-8 strings, like ``unit_ids``; dimension ``unit``) and the attr ``parent_column``
names the data column it was read from. Both are absent otherwise, and stores written before
them read as before (:attr:`MarginalsData.parent_ids` is then None).

Dimension names and coordinates (both stores)
---------------------------------------------
Every array carries Zarr v3 ``dimension_names`` (:data:`HISTOGRAMS_DIMS`, :func:`marginal_dims`)
so ``xr.open_datatree(path, engine="zarr")`` opens the store whole: ``unit`` (units), ``cell``
(the cells of ``counts``) and ``cell_<i>`` (the cells of ``marginals/<i>``). xarray makes an
array named like a dimension its coordinate (a root coordinate reaches the ``marginals``
group): ``unit`` repeats ``unit_ids`` (which keeps its name: the layout is a contract) so that
``.sel(unit=some_id)`` works, and the cell labels read ``age[0],sex[f]`` (the spec's value
labels, or the codes for a bare domain; the empty clique's one cell is ``total``). Stores
written before these additions (no dimension names, no coordinates) are read as before.

Writing (:func:`staged_store`)
------------------------------
Atomic like the plan store (:mod:`distfit.stores.files`): everything goes to a staging directory
``<path>.incomplete-<random>`` one chunk at a time (memory is flat in N), then the store is
sealed: ``checksum`` (:func:`distfit.stores.checksum.compute_checksum` over every array and
every stated attr, :func:`distfit.stores.sealing.stated_attrs`: all but the checksum,
``complete``, ``created`` and ``sealed``), ``sealed`` (the time) and ``complete=True`` come last, everything is fsynced and the directory is renamed into place. An
existing path is refused unless ``overwrite=True`` (and then only a store of the same format is
replaced, once the new one is complete); an exception deletes the staging directory.

Reading for a release (:func:`open_data`)
-----------------------------------------
Both stores have a digest per chunk of each array chunked by units but ``parent_ids``
(:func:`digested_names`, written at the seal; the checksum covers the digests, not those arrays:
:mod:`distfit.stores.sealing`). Opened with ``verify=True`` (a driver, before anything is
written or any noise drawn; each task again, with the checksum its driver checked), the root is
recomputed and every chunk read (``block_counts``, ``ids``, ``iter_chunks``, ``check_unit_ids``)
checked against its digest before it is used. Formats 1-2 are refused (the command that writes anew).
``distfit release --data`` takes either store format: :class:`HistogramsData` (full-domain
counts) or :class:`MarginalsData`. Both give ``units``, ``chunk_units``, ``domain``, ``unit_ids``
(a lazy zarr array: index it per chunk) and ``block_counts(attributes, start, stop)``: the
(stop - start, d_b) int64 marginal counts of units ``start .. stop - 1`` on a block's attributes
(columns row-major over the attributes in schema order), validated by
:func:`distfit.release.noise.validate_counts` (a ``ValueError`` naming the unit row and cell).
Histograms sum the full counts down (as :func:`distfit.release.noise.block_marginal`); marginals
sum the smallest stored clique that contains the block's attributes, and a block inside no
stored clique is a :class:`DataError` (``check_blocks`` refuses it up front). The counts of the
last chunk range read are cached, so the blocks of one chunk read the store once.

Unit ids must be distinct: ``check_unit_ids()`` (run once up front by the release driver) reads
the ids chunk by chunk and keeps only the previous chunk's last id, so sorted ids (every
synthetic and every tabulated store) are checked in constant memory; unsorted ids (a
hand-made histograms store) fall back to one ``np.unique`` over all the ids (the ids only,
never the counts). A duplicate is a :class:`DataError` naming the store and the id.
"""
from __future__ import annotations

import contextlib
import math
import os
import secrets
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import zarr

from distfit import __version__
from distfit.data.synthetic import GENERATOR, ModelParams, resolve_synthesis, synthesize_histograms
from distfit.mathematics.domain import Domain
from distfit.release.noise import marginal_counts, validate_counts, validate_marginal
from distfit.spec.model import PipelineSpec
from distfit.spec.parse import load_spec
from distfit.stores.lock import store_lock
from distfit.stores.files import (PARENT_IDS, STAGING_MARKER, create_nodes, filled_array, fsync_tree, is_staging,
                                  jsonable, leftovers, move_into_place, node_documents, open_arrays, root_attrs_on_disk,
                                  utc_now, write_array, write_rows)
from distfit.stores.checksum import DIGESTS
from distfit.stores.release_chunks import raw_reader
from distfit.stores.sealing import (DIGEST_DIMS, ChunkDigests, check_root, lay_out_digests, open_sealed,
                                    seal_checksum, stated_attrs, write_digests)

FORMAT = "histograms"
MARGINALS_FORMAT = "marginals"
#: 3: per-chunk digests (``chunks/digests``: every array chunked by units but the geography's
#: ``parent_ids``, :func:`digested_names`) and the checksum over the attrs, the other arrays and
#: those digests (checksum version 3, :mod:`distfit.stores.checksum`), so a release checks each
#: chunk as it reads it; 2: the checksum over every array and stated attr; 1: no checksum. A
#: data store older than 3 is refused with the command that writes it anew (:data:`WRITERS`).
FORMAT_VERSION = 3
#: The command that writes each data format (named when an old store is refused).
WRITERS = {FORMAT: "distfit synth", MARGINALS_FORMAT: "distfit tabulate"}
#: Zarr v3 ``dimension_names`` of a histograms store's arrays (module docstring).
HISTOGRAMS_DIMS: dict[str, tuple[str, ...]] = {
    "counts": ("unit", "cell"),
    "unit_ids": ("unit",),
    "unit": ("unit",),
    "cell": ("cell",),
    DIGESTS: DIGEST_DIMS,
}

PathLike = str | os.PathLike

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MARGINALS_FORMAT",
    "DataError",
    "HISTOGRAMS_DIMS",
    "HistogramsData",
    "MarginalsData",
    "MarginalsWriter",
    "PARENT_IDS",
    "cell_labels",
    "create_marginals",
    "marginal_dims",
    "open_data",
    "read_histograms",
    "read_marginals",
    "staged_store",
    "value_labels",
    "write_marginals_attrs",
    "write_synthetic",
]


class DataError(ValueError):
    """Data that cannot be used: a path that is not a readable, complete data store, or bad
    microdata (:mod:`distfit.data.microdata`); the one-line message names the path and why."""


# --------------------------------------------------------------------------------------------
# writing


def _check_target(path: Path, overwrite: bool, fmt: str = FORMAT) -> None:
    """Refuse ``path`` unless it is absent, or holds a ``fmt`` data store and ``overwrite``."""
    if not (path.exists() or path.is_symlink()):
        return
    attrs = root_attrs_on_disk(path) if path.is_dir() else None
    if attrs is None or attrs.get("distfit_format") != fmt:
        raise FileExistsError(f"{path}: already exists and is not a distfit {fmt} store; refusing to replace it")
    if not overwrite:
        raise FileExistsError(f"{path}: already holds data; pass overwrite=True (--overwrite) to replace it")


@contextlib.contextmanager
def staged_store(out: PathLike, fmt: str, *, overwrite: bool = False, fsync: bool = True):
    """Write a data store of format ``fmt`` at ``out`` atomically (module docstring).

    Yields ``(staging_path, group)``: an empty Zarr v3 group in ``<out>.incomplete-<random>``
    with ``complete=False``; the caller writes its arrays and attrs. When the block ends
    normally ``complete=True`` is written last, the tree is fsynced and moved into place
    (replacing only a ``fmt`` store, and only with ``overwrite``); an exception deletes the
    staging directory and leaves ``out`` as it was. Shared by every data-store writer.
    """
    path = Path(os.fspath(out))
    if is_staging(path):
        raise ValueError(f"{path}: a data path may not contain {STAGING_MARKER!r}")
    with store_lock(path, fmt):  # one writer per store (stores/lock.py)
        _check_target(path, overwrite, fmt)
        path.parent.mkdir(parents=True, exist_ok=True)
        yield from _staged_write(path, fmt, overwrite, fsync)


def _staged_write(path: Path, fmt: str, overwrite: bool, fsync: bool):
    staging = path.with_name(f"{path.name}{STAGING_MARKER}{secrets.token_hex(6)}")
    try:
        group = zarr.open_group(store=str(staging), mode="w-", zarr_format=3)
        group.attrs.update({"distfit_format": fmt, "format_version": FORMAT_VERSION, "complete": False})
        yield staging, group
        sealed = zarr.open_group(store=str(staging), mode="r+", zarr_format=3)
        lay_out_digests(sealed, digested_names(sealed), units=int(sealed.attrs["units"]),
                        chunk_units=int(sealed.attrs["chunk_units"]))
        write_digests(sealed)  # the chunks read back once, as the checksum of every seal did
        checksum = seal_checksum(sealed, sealed.attrs, stated_attrs)
        sealed.attrs.update({"checksum": checksum, "sealed": utc_now(), "complete": True})
        if fsync:
            fsync_tree(staging)
        move_into_place(staging, path, lambda existing: _check_target(existing, overwrite, fmt))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def digested_names(group: zarr.Group) -> list[str]:
    """The arrays of a data store with a digest per chunk (:func:`distfit.stores.sealing.lay_out_digests`):
    those of ``units`` rows chunked by ``chunk_units``, but ``parent_ids`` (a release copies it whole)."""
    units, chunk_units = int(group.attrs["units"]), int(group.attrs["chunk_units"])
    # from the zarr.json documents (regular grid, unsharded), not group.members (0.5 s for Adult's 732 arrays)
    return sorted(name for name, doc in node_documents(group).items()
                  if doc.get("node_type") == "array" and name != PARENT_IDS and doc["shape"][:1] == [units]
                  and doc["chunk_grid"]["configuration"]["chunk_shape"][0] == chunk_units)


def write_synthetic(spec, units: int, out: PathLike, seed: int | None = None,
                    chunk_units: int | None = None, overwrite: bool = False, *,
                    params: ModelParams | None = None, fsync: bool = True) -> Path:
    """Synthesise ``units`` unit histograms for ``spec`` (:mod:`distfit.data.synthetic`) and
    write them to ``out`` as a histograms store, atomically, one chunk at a time.

    ``spec``: a :class:`distfit.spec.model.PipelineSpec`, a path to a spec file, or a bare
    :class:`Domain` (then ``spec_hash`` is None). ``seed`` None draws fresh entropy (stored).
    Returns the path written. Raises ``FileExistsError`` for an existing path (unless
    ``overwrite`` and it holds histograms), ``ValueError`` for bad arguments.
    """
    if isinstance(spec, (str, os.PathLike)):
        spec = load_spec(spec)
    if isinstance(spec, PipelineSpec):
        domain, spec_hash = spec.domain, spec.spec_hash
    elif isinstance(spec, Domain):
        domain, spec_hash = spec, None
    else:
        raise TypeError(f"spec: expected a PipelineSpec, a spec path or a Domain, got {type(spec).__name__}")
    if seed is None:
        seed = secrets.randbits(63)
    domain, units, seed, chunk_units = resolve_synthesis(domain, units, seed, chunk_units)
    params = params or ModelParams()
    cells = domain.size
    labels = cell_labels(domain.names, value_labels(spec))
    with staged_store(out, FORMAT, overwrite=overwrite, fsync=fsync) as (_staging, group):
        config = {"write_empty_chunks": True}
        counts_arr = group.create_array("counts", shape=(units, cells), dtype=np.int64,
                                        chunks=(chunk_units, cells), dimension_names=HISTOGRAMS_DIMS["counts"],
                                        config=config)
        id_arrays = [group.create_array(name, shape=(units,), dtype=np.int64, chunks=(chunk_units,),
                                        dimension_names=HISTOGRAMS_DIMS[name], config=config)
                     for name in ("unit_ids", "unit")]
        write_array(group, "cell", labels, dims=HISTOGRAMS_DIMS["cell"])
        total = 0
        for start, counts in synthesize_histograms(domain, units, seed, chunk_units, params=params):
            stop = start + counts.shape[0]
            counts_arr[start:stop] = counts
            for ids_arr in id_arrays:
                ids_arr[start:stop] = np.arange(start, stop, dtype=np.int64)
            total += int(counts.sum())
        group.attrs.update(jsonable({
            "distfit_format": FORMAT,
            "format_version": FORMAT_VERSION,
            "schema": domain.schema(),
            "spec_hash": spec_hash,
            "units": units,
            "cells": cells,
            "seed": seed,
            "chunk_units": chunk_units,
            "total_people": total,
            "model": params.to_dict(),
            "generator": GENERATOR,
            "created": utc_now(),
            "distfit_version": __version__,
        }))
    return Path(os.fspath(out))


def marginal_dims(index: int) -> tuple[str, str]:
    """Dimension names of ``marginals/<index>``: ``("unit", "cell_<index>")`` (module docstring;
    one cell dimension per clique, as the cliques differ in size)."""
    return ("unit", f"cell_{index}")


def value_labels(source: PipelineSpec | Domain) -> dict[str, tuple[str, ...]]:
    """The value labels of every attribute: the spec's (``AttributeSpec.values``), or the codes
    ``"0" .. "n-1"`` of a bare :class:`Domain`."""
    if isinstance(source, Domain):
        return {name: tuple(str(v) for v in range(size)) for name, size in zip(source.names, source.sizes)}
    return {attribute.name: tuple(attribute.values) for attribute in source.attributes}


def cell_labels(attributes: Sequence[str], values: Mapping[str, Sequence[str]]) -> np.ndarray:
    """The label of every cell of the marginal on ``attributes`` (in schema order; cells
    row-major, the first attribute slowest, as :class:`Domain`): ``name[value]`` per attribute
    joined by ``,`` - ``age[0],sex[f]``, the style of the spec's query labels; value labels
    hold no ``[``, ``]`` or ``,`` (the spec refuses them), so a label splits back unambiguously.
    The empty marginal's one cell (the grand total) is ``total``. A 1-d object array of str."""
    labels = np.array(["total"], dtype=object)
    for position, name in enumerate(attributes):
        part = np.array([f"{name}[{value}]" for value in values[name]], dtype=object)
        # outer concatenation, row-major: each earlier label followed by every value of this attribute
        labels = part if position == 0 else (labels[:, None] + ("," + part)[None, :]).ravel()
    return labels


def create_marginals(group: zarr.Group, widths: Sequence[int], units: int, chunk_units: int, integer_ids: bool, *,
                     labels: Sequence[np.ndarray] | None = None, integer_parents: bool | None = None,
                     progress: Callable[[int, int], None] | None = None) -> None:
    """Create the empty arrays of a marginals store in the staging ``group`` of :func:`staged_store`:
    ``marginals/<i>`` (units, widths[i]) int64, ``unit_ids`` and its coordinate twin ``unit`` (int64, or
    strings unless ``integer_ids``), chunked by ``chunk_units`` units, and, given ``labels`` (the
    :func:`cell_labels` of each clique), the coordinates ``marginals/cell_<i>`` (module docstring);
    ``integer_parents``: ``parent_ids`` too (int64 if True, else strings); ``progress(i, n)`` as laid out."""
    if labels is not None and [len(x) for x in labels] != [int(w) for w in widths]:
        raise ValueError(f"labels: {[len(x) for x in labels]} cell labels per clique, widths are {list(widths)}")
    def unit_array(integer: bool) -> dict[str, Any]:
        return dict(shape=(units,), dtype=np.int64 if integer else str, chunks=(chunk_units,),
                    dimension_names=("unit",), config={"write_empty_chunks": True})
    arrays: dict[str, dict[str, Any]] = {name: unit_array(integer_ids) for name in ("unit_ids", "unit")}
    if integer_parents is not None:  # filled by MarginalsWriter.write_parent_ids, the ids by write_unit_ids
        arrays[PARENT_IDS] = unit_array(integer_parents)
    for i, width in enumerate(widths):
        arrays[f"marginals/{i}"] = dict(unit_array(True), shape=(units, width), chunks=(chunk_units, width),
                                        dimension_names=marginal_dims(i))
    for i, cells in enumerate(() if labels is None else labels):
        arrays[f"marginals/cell_{i}"] = filled_array(np.asarray(cells, dtype=object), dims=marginal_dims(i)[1:],
                                                     where=f"marginals/cell_{i}")
    create_nodes(group, {"marginals": {}}, arrays,  # one zarr call (Adult: 731 arrays, 7.5 s one at a time)
                 progress=None if progress is None else lambda done, total: progress(len(widths) * done // total,
                                                                                     len(widths)))


class MarginalsWriter:
    """Writes rows of the arrays :func:`create_marginals` made in the staging store at
    ``store``; each task of a tabulation opens its own (on any worker of a shared file system)
    and writes whole chunks of units, so tasks never write the same chunk."""

    def __init__(self, store: PathLike) -> None:
        self._root = zarr.open_group(store=os.fspath(store), mode="r+", zarr_format=3)
        self._id_arrays = ("unit_ids", "unit") if "unit" in self._root else ("unit_ids",)

    def write_marginal(self, index: int, start: int, counts: np.ndarray) -> None:
        """Rows ``start ..`` of ``marginals/<index>``: ``counts`` (n, cells) int64."""
        self._root[f"marginals/{index}"][start:start + counts.shape[0]] = counts

    def write_marginals(self, start: int, counts: Iterable[tuple[int, np.ndarray]]) -> int:
        """:meth:`write_marginal` of every ``(i, counts)``, a few zarr calls in all (returned): :func:`write_rows`."""
        return write_rows(self._root, ((f"marginals/{i}", start, c) for i, c in counts))

    def write_unit_ids(self, start: int, ids: np.ndarray) -> None:
        """Entries ``start ..`` of ``unit_ids`` (and of its coordinate twin ``unit``): int64 or
        str ids."""
        for name in self._id_arrays:
            self._root[name][start:start + ids.shape[0]] = ids

    def write_parent_ids(self, start: int, ids: np.ndarray) -> None:
        """Entries ``start ..`` of ``parent_ids``: int64 or str ids."""
        self._root[PARENT_IDS][start:start + ids.shape[0]] = ids


def write_marginals_attrs(group: zarr.Group, *, domain: Domain, spec_hash: str, units: int, chunk_units: int,
                          cliques: Sequence[Sequence[str]], source: dict[str, Any], total_people: int,
                          parent_column: str | None = None) -> None:
    """The root attrs of a marginals store (module docstring), written once its arrays are
    filled; :func:`staged_store` then marks it complete. ``parent_column``: the column the
    ``parent_ids`` were read from (the attr is written only then)."""
    if parent_column is not None:
        group.attrs["parent_column"] = parent_column
    group.attrs.update(jsonable({
        "distfit_format": MARGINALS_FORMAT,
        "format_version": FORMAT_VERSION,
        "schema": domain.schema(),
        "spec_hash": spec_hash,
        "units": units,
        "chunk_units": chunk_units,
        "cliques": [list(c) for c in cliques],
        "source": source,
        "total_people": total_people,
        "created": utc_now(),
        "distfit_version": __version__,
    }))


# --------------------------------------------------------------------------------------------
# reading


def _show_id(value: Any) -> str:
    value = value.item() if isinstance(value, np.generic) else value
    return repr(value) if isinstance(value, str) else str(value)


def _check_unit_ids(path: str, read: Any, n: int, step: int) -> None:
    """DataError naming ``path`` and the id if the ``n`` ids ``read(a, b)`` gives (ids ``a`` to
    ``b - 1``) hold a duplicate.

    Read ``step`` ids at a time keeping only the previous chunk's last id: while the ids are
    non-decreasing a duplicate is two equal neighbours (constant memory); ids out of order are
    checked with one ``np.unique`` over all of them instead.
    """
    previous = None
    for start in range(0, n, max(1, int(step))):
        part = np.asarray(read(start, min(n, start + step)))
        if previous is not None:
            part = np.concatenate([previous, part])
        if part.size > 1:
            if np.any(part[1:] < part[:-1]):
                break  # not sorted: check all ids at once below
            equal = np.flatnonzero(part[1:] == part[:-1])
            if equal.size:
                raise DataError(f"{path}: unit id {_show_id(part[equal[0]])} appears more than once "
                                "in unit_ids (every unit must be distinct)")
        previous = part[-1:]
    else:
        return
    uniques, counts = np.unique(np.asarray(read(0, n)), return_counts=True)
    if np.any(counts > 1):
        raise DataError(f"{path}: unit id {_show_id(uniques[np.argmax(counts > 1)])} appears more than "
                        "once in unit_ids (every unit must be distinct)")


def _cached(cache: dict, key: tuple, start: int, stop: int, read):
    """``read()`` once per ``key`` while the chunk range ``(start, stop)`` stays the same."""
    if cache.get("range") != (start, stop):
        cache.clear()
        cache["range"] = (start, stop)
    if key not in cache:
        cache[key] = read()
    return cache[key]


class UnitStoreView:
    """What both data stores' readers share: the domain of their ``schema`` attr, the number
    of ``units`` (the length of the lazy ``unit_ids``; the readers check it against the
    counts), the duplicate-id check (by the store's own ``chunk_units``), and the geography
    (``parent_ids``, a lazy array, and ``parent_column``; None when not stored)."""

    path: str
    attrs: dict
    unit_ids: Any
    parent_ids: Any = None
    digests: ChunkDigests | None = None

    @property
    def units(self) -> int:
        return int(self.unit_ids.shape[0])

    def rows(self, name: str, arr: Any, start: int, stop: int) -> np.ndarray:
        """Rows ``start:stop`` of the array ``name`` (``arr``), checked against the store's digests
        when opened with them (:meth:`distfit.stores.sealing.ChunkDigests.read`)."""
        if self.digests is None:
            return np.asarray(arr[start:stop])
        return self.digests.read(name, lambda a, b: arr[a:b], start, stop, int(arr.shape[0]))

    def ids(self, start: int, stop: int) -> np.ndarray:
        """The unit ids of units ``start .. stop - 1`` (checked: :meth:`rows`)."""
        return self.rows("unit_ids", self.unit_ids, start, stop)

    @property
    def parent_column(self) -> str | None:
        return self.attrs.get("parent_column") if self.parent_ids is not None else None

    @property
    def domain(self) -> Domain:
        return Domain.from_schema(self.attrs["schema"])

    def check_unit_ids(self) -> None:
        """DataError if a unit id appears twice (module docstring)."""
        _check_unit_ids(self.path, self.ids, self.units, self.chunk_units)


@dataclass(frozen=True, eq=False)
class HistogramsData(UnitStoreView):
    """A complete histograms store opened for reading; ``counts`` and ``unit_ids`` are lazy
    zarr arrays (index them to read: ``counts[a:b]``)."""

    path: str
    attrs: dict
    counts: Any = field(repr=False)
    unit_ids: Any = field(repr=False)
    digests: ChunkDigests | None = field(default=None, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)

    format = FORMAT

    @property
    def cells(self) -> int:
        return int(self.counts.shape[1])

    @property
    def chunk_units(self) -> int:
        return int(self.counts.chunks[0])

    def iter_chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, counts)`` per stored chunk, one at a time."""
        step = self.chunk_units
        for start in range(0, self.units, step):
            yield start, self.rows("counts", self.counts, start, min(self.units, start + step))

    def check_blocks(self, attribute_sets: Sequence[Sequence[str]]) -> None:
        """Every block's marginal can be had from full counts (unknown names: ValueError)."""
        domain = self.domain
        for attributes in attribute_sets:
            for name in attributes:
                domain.index(name)

    def block_counts(self, attributes: Sequence[str], start: int, stop: int) -> np.ndarray:
        """Units ``start .. stop - 1`` summed to the block's attributes: (n, d_b) int64.

        The chunk's counts are read and validated once (:func:`distfit.release.noise.validate_counts`,
        a ValueError naming the unit row within the range and the cell) and kept for the next
        block of the same range.
        """
        domain = self.domain
        counts = _cached(self._cache, ("counts",), start, stop,
                         lambda: validate_counts(self.rows("counts", self.counts, start, stop), domain))
        return marginal_counts(counts, domain, attributes)


@dataclass(frozen=True, eq=False)
class MarginalsData(UnitStoreView):
    """A complete marginals store opened for reading (module docstring): ``marginals[i]`` is
    the lazy zarr array of clique ``cliques[i]``, ``unit_ids`` the lazy ids."""

    path: str
    attrs: dict
    cliques: tuple[tuple[str, ...], ...]
    marginals: tuple[Any, ...] = field(repr=False)
    unit_ids: Any = field(repr=False)
    parent_ids: Any = field(default=None, repr=False)
    digests: ChunkDigests | None = field(default=None, repr=False)
    _cache: dict = field(default_factory=dict, repr=False)
    _index: dict = field(default_factory=dict, repr=False)  # frozenset(clique) -> index (clique_for)

    format = MARGINALS_FORMAT

    @property
    def chunk_units(self) -> int:
        return int(self.attrs["chunk_units"])

    def clique_cells(self, index: int) -> int:
        """Cells of clique ``index``'s marginal (1 for the empty clique, the grand total)."""
        domain = self.domain
        return math.prod(domain.sizes[domain.index(n)] for n in self.cliques[index])

    def clique_for(self, attributes: Sequence[str]) -> int:
        """Index of the smallest stored clique holding every attribute of ``attributes``;
        DataError if none does."""
        if not self._index:  # stored cliques are maximal: a stored set is its own smallest holder
            self._index.update((frozenset(c), i) for i, c in reversed(list(enumerate(self.cliques))))
        exact = self._index.get(frozenset(attributes))
        if exact is not None and len(set(attributes)) == len(attributes):
            return exact
        domain = self.domain
        want = set(attributes)
        for name in want:
            domain.index(name)  # ValueError for an unknown name
        fits = [i for i, clique in enumerate(self.cliques) if want <= set(clique)]
        if not fits:
            shown = [n for n in domain.names if n in want]
            raise DataError(
                f"{self.path}: no stored marginal holds the block attributes {shown} (stored cliques: "
                f"{[list(c) for c in self.cliques]}); tabulate the microdata for this plan (distfit release "
                "and distfit run do so for the plan's blocks; distfit tabulate --plan)")
        return min(fits, key=lambda i: (self.clique_cells(i), i))

    def check_blocks(self, attribute_sets: Sequence[Sequence[str]]) -> None:
        """DataError unless every attribute set lies in a stored clique."""
        for attributes in attribute_sets:
            self.clique_for(attributes)

    def block_counts(self, attributes: Sequence[str], start: int, stop: int) -> np.ndarray:
        """Units ``start .. stop - 1`` summed to the block's attributes: (n, d_b) int64, from the
        smallest stored clique holding them (read and validated once per chunk range)."""
        index = self.clique_for(attributes)
        clique = self.cliques[index]

        def read() -> np.ndarray:
            try:
                return validate_marginal(self.rows(f"marginals/{index}", self.marginals[index], start, stop),
                                         self.domain, clique)
            except ValueError as error:
                raise ValueError(f"marginals/{index} {list(clique)}: {error}") from None

        counts = _cached(self._cache, ("clique", index), start, stop, read)
        if set(attributes) == set(clique):
            return counts
        domain = self.domain
        sub = Domain(clique, tuple(domain.sizes[domain.index(n)] for n in clique))
        return marginal_counts(counts, sub, attributes)


def _open_store(path: PathLike, fmt: str, verify: bool, checksum: str | None
                ) -> tuple[Path, dict, Domain, Any, ChunkDigests | None]:
    """The data readers' refusals (:func:`distfit.stores.sealing.open_sealed`), the root checked when
    ``verify`` (:func:`distfit.stores.sealing.check_root`, ``checksum``: the one it must state);
    ``(path, attrs, domain, group, digests)``, digests None unless ``verify``."""
    p, group, attrs = open_sealed(path, fmt, FORMAT_VERSION, DataError, oldest=FORMAT_VERSION, rewrite=WRITERS[fmt],
                                  unfinished="the data is not marked complete (an unfinished or damaged write)")
    digests = (check_root(p, f"{fmt} store", group, attrs, stated_attrs, DataError, checksum, read=raw_reader(p))
               if verify else None)
    schema = attrs.get("schema")
    try:
        domain = Domain.from_schema(schema)
    except (TypeError, KeyError, ValueError) as exc:
        raise DataError(f"{p}: invalid schema {schema!r} ({exc})") from None
    return p, attrs, domain, group, digests


def _array(p: Path, group: Any, name: str) -> Any:
    try:
        node = group[name]
    except KeyError:
        node = None
    if not isinstance(node, zarr.Array):
        raise DataError(f"{p}: missing array {name}")
    return node


def read_histograms(path: PathLike, verify: bool = False, checksum: str | None = None) -> HistogramsData:
    """Open a complete histograms store, or raise :class:`DataError` (a ValueError) naming the
    path and why: missing, staging directory, not a Zarr v3 group, another format, a
    ``format_version`` newer or older than :data:`FORMAT_VERSION`, not marked complete, no
    checksum, missing or misshapen arrays; with ``verify``, a root (attrs, small arrays, chunk
    digests) that no longer hashes to the checksum it was sealed with (or, given ``checksum``,
    states another), and then every chunk read checked against its digest as it is read."""
    p, attrs, domain, group, digests = _open_store(path, FORMAT, verify, checksum)
    counts, ids = _array(p, group, "counts"), _array(p, group, "unit_ids")
    if counts.ndim != 2 or counts.shape[1] != domain.size:
        raise DataError(f"{p}: counts has shape {counts.shape}, expected (units, {domain.size})")
    if np.dtype(counts.dtype) != np.int64:
        raise DataError(f"{p}: counts has dtype {counts.dtype}, expected int64")
    if ids.shape != (counts.shape[0],):
        raise DataError(f"{p}: unit_ids has shape {ids.shape}, expected ({counts.shape[0]},)")
    if attrs.get("units", counts.shape[0]) != counts.shape[0]:
        raise DataError(f"{p}: attrs say {attrs.get('units')} units, counts has {counts.shape[0]}")
    return HistogramsData(path=str(p), attrs=attrs, counts=counts, unit_ids=ids, digests=digests)


def read_marginals(path: PathLike, verify: bool = False, checksum: str | None = None) -> MarginalsData:
    """Open a complete marginals store (module docstring), or raise :class:`DataError` naming
    the path and why (as :func:`read_histograms`, plus bad ``cliques`` or ``chunk_units``)."""
    p, attrs, domain, group, digests = _open_store(path, MARGINALS_FORMAT, verify, checksum)
    cliques = attrs.get("cliques")
    try:
        cliques = tuple(tuple(str(name) for name in clique) for clique in cliques)
        for clique in cliques:
            if list(clique) != sorted(clique, key=domain.index) or len(set(clique)) != len(clique):
                raise ValueError(f"{list(clique)} is not in schema order")
    except (TypeError, ValueError) as exc:
        raise DataError(f"{p}: invalid cliques {attrs.get('cliques')!r} ({exc})") from None
    if not cliques:
        raise DataError(f"{p}: no cliques")
    ids = _array(p, group, "unit_ids")
    units = attrs.get("units")
    if ids.ndim != 1 or ids.shape[0] != units:
        raise DataError(f"{p}: unit_ids has shape {ids.shape}, but attrs say {units!r} units")
    chunk_units = attrs.get("chunk_units")
    if isinstance(chunk_units, bool) or not isinstance(chunk_units, int) or chunk_units < 1:
        raise DataError(f"{p}: invalid chunk_units {chunk_units!r}")
    try:  # in one zarr call (Adult: 364, 0.5 s one at a time; every release task opens them)
        opened = list(open_arrays(group, [f"marginals/{i}" for i in range(len(cliques))]).values())
    except ValueError:  # zarr's missing node or a group in its place: found one at a time, named
        opened = [_array(p, group, f"marginals/{i}") for i in range(len(cliques))]
    arrays = []
    for i, (clique, arr) in enumerate(zip(cliques, opened)):
        cells = math.prod(domain.sizes[domain.index(n)] for n in clique)
        if arr.shape != (units, cells):
            raise DataError(f"{p}: marginals/{i} has shape {arr.shape}, expected ({units}, {cells}) "
                            f"for {list(clique)}")
        if np.dtype(arr.dtype) != np.int64:
            raise DataError(f"{p}: marginals/{i} has dtype {arr.dtype}, expected int64")
        if arr.chunks[0] != chunk_units:
            raise DataError(f"{p}: marginals/{i} is chunked by {arr.chunks[0]} units, attrs say {chunk_units}")
        arrays.append(arr)
    parents = None
    if PARENT_IDS in group:
        parents = _array(p, group, PARENT_IDS)
        if parents.shape != (units,):
            raise DataError(f"{p}: {PARENT_IDS} has shape {parents.shape}, expected ({units},)")
        if not isinstance(attrs.get("parent_column"), str):
            raise DataError(f"{p}: {PARENT_IDS} without a parent_column attr naming their column")
    return MarginalsData(path=str(p), attrs=attrs, cliques=cliques, marginals=tuple(arrays), unit_ids=ids,
                         parent_ids=parents, digests=digests)


def open_data(path: PathLike, verify: bool = False, checksum: str | None = None) -> HistogramsData | MarginalsData:
    """Open a complete data store of either format (module docstring) for a release, or raise
    :class:`DataError` naming the path and why; ``verify``: its root checked first and every
    chunk then checked as it is read (module docstring; ``checksum``: the one its driver checked)."""
    p = Path(os.fspath(path))
    if not p.exists() and not is_staging(p):
        left = leftovers(p)
        hint = f" (an interrupted write left {', '.join(x.name for x in left)})" if left else ""
        raise DataError(f"{p}: no such data store{hint} (data is a Zarr store made by distfit synth or "
                        "distfit tabulate, or microdata: .csv, .csv.gz, .parquet, .pq)")
    attrs = root_attrs_on_disk(p) if p.is_dir() else None
    if attrs is not None and attrs.get("distfit_format") == MARGINALS_FORMAT:
        return read_marginals(p, verify, checksum)
    return read_histograms(p, verify, checksum)
