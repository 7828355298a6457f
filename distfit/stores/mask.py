"""Mask stores: the masked pseudo-data release of ``distfit mask`` (paper 003), and its input.

Layout (**contract**), a Zarr v3 group::

    mask.zarr/        attrs: distfit_format="mask", format_version=1, columns (the p data
                             columns, then "(intercept)"), bounds ({column: [lo, hi]}),
                             bounds_from_data (True: the bounds are the data's range, not
                             private), sigma, account (distfit.mask.account.MaskAccount),
                             private (False with --seed or --bounds-from-data), rows (n),
                             chunk_units (rows of every block but the last), n_chunks (blocks),
                             source ({"path", "modified"} of the CSV: for --resume only),
                             created, distfit_version, complete (False until sealed), and at
                             seal: checksum, sealed (time)
      masked          (n, p + 1)  float64  Y = A [X + C, 1], one zarr chunk per block
                                           (dimension_names ``row``, ``column``); uncompressed
      column          (p + 1,)    str      coordinate: the column names
      centre          (p + 1,)    float64  (lo + hi) / 2 per column (0 for the constant)
      scale           (p + 1,)    float64  (hi - lo) / 2 per column (1 for the constant):
                                           a column's data value is centre + scale * z
      blocks/rows     (k,)        int64    the rows of each block of the mask (block ``i``
                                           is the zarr chunk ``i`` of ``masked``)
      chunks/done     (k,)        uint8    1 once block ``i`` is written

Never stored: the data, anything computed from it but through the mask (no clip counts, no
row order: the rows of ``masked`` are not the data's rows), the entropy, the ``--seed``.
The rows of ``masked`` are not individuals; the row dimension is only their count.

Sealing: the one path of every chunked store (:mod:`distfit.stores.sealing`): the checksum
covers every array and every attr but ``checksum``, ``complete``, ``created`` and ``sealed``
(:func:`distfit.stores.sealing.stated_attrs`), so an edited sigma, account or bound is
refused like a changed number. Lifecycle as a release's (:mod:`distfit.stores.release`):
:func:`create_mask` lays the store out incomplete, each task writes its blocks and marks them
done (:meth:`distfit.stores.release_chunks.ChunkWriter.write_arrays`), the driver fsyncs and
hashes them as they land and :func:`seal` marks the store complete; :func:`open_resumable`
reopens an incomplete one for ``--resume``. Readers: :func:`read_mask`, and
:func:`read_verified_mask` (the checksum recomputed) for every command that takes the store as
input, e.g. :func:`distfit.mask.regression`.

The input (:func:`create_input`, :func:`open_input`): the chosen columns of the CSV as float64,
staged by the driver in a directory next to the store for the tasks to read (a worker cannot
seek to row ``i`` of a CSV), deleted when the session ends; it holds the confidential data
and is never part of the release.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import zarr

from distfit import __version__
from distfit.stores.files import jsonable, utc_now, write_array
from distfit.stores.release_chunks import ReleaseHasher, pending_chunks, seal_chunked
from distfit.stores.sealing import UNIT_DIMS, SealedKind, SealedStore, root_attr, store_array

__all__ = [
    "CHUNK_ARRAYS",
    "DIMS",
    "FORMAT_VERSION",
    "MASK",
    "Masked",
    "MaskError",
    "check_replaceable",
    "create_input",
    "create_mask",
    "mask_state",
    "open_input",
    "open_resumable",
    "pending_chunks",
    "read_mask",
    "read_verified_mask",
    "seal",
    "verify_mask",
]

FORMAT = "mask"
FORMAT_VERSION = 1

#: Dimension names (Zarr v3 ``dimension_names``) of every array (module docstring).
DIMS: dict[str, tuple[str, ...]] = {
    "masked": ("row", "column"),
    "column": ("column",),
    "centre": ("column",),
    "scale": ("column",),
    "blocks/rows": ("block",),
    "chunks/done": UNIT_DIMS["chunks/done"],
}
#: The arrays each block's task writes (``chunks/done`` last).
CHUNK_ARRAYS = ("chunks/done", "masked")
#: The attrs a resumed store must have been started with (:func:`open_resumable`).
RESUME_KEYS = ("columns", "bounds", "bounds_from_data", "sigma", "account", "private", "rows", "chunk_units",
               "n_chunks", "source")


class MaskError(ValueError):
    """A path that is not a readable, complete (sealed) mask store; the message says why."""


def create_mask(path: Path, *, columns: list[str], centre: np.ndarray, scale: np.ndarray, sizes: np.ndarray,
                attrs: Mapping[str, Any]) -> zarr.Group:
    """Lay out an empty, incomplete mask store at ``path`` (driver only): ``columns``,
    ``centre`` and ``scale`` of the p + 1 columns, the block ``sizes`` and the stated ``attrs``
    (module docstring: bounds, sigma, account, private, source ...). Returns the root group,
    open for writing; on any error nothing is left at ``path``."""
    return MASK.create(path, _lay_out, columns=columns, centre=centre, scale=scale, sizes=sizes, attrs=attrs)


def _lay_out(root: zarr.Group, *, columns, centre, scale, sizes, attrs) -> None:
    sizes = np.asarray(sizes, dtype=np.int64)
    rows, width = int(sizes.sum()), len(columns)
    config = {"write_empty_chunks": True}
    root.create_array("masked", shape=(rows, width), dtype=np.float64, chunks=(int(sizes[0]), width),
                      compressors=None, dimension_names=DIMS["masked"], config=config)
    write_array(root, "column", np.array(list(columns), dtype=object), dims=DIMS["column"])
    write_array(root, "centre", np.asarray(centre, dtype=np.float64), dims=DIMS["centre"])
    write_array(root, "scale", np.asarray(scale, dtype=np.float64), dims=DIMS["scale"])
    write_array(root.create_group("blocks"), "rows", sizes, dims=DIMS["blocks/rows"])
    root.create_group("chunks").create_array(
        "done", shape=(len(sizes),), dtype=np.uint8, chunks=(1,), fill_value=0, compressors=None,
        dimension_names=DIMS["chunks/done"], config=config)
    root.attrs.update(jsonable({
        **dict(attrs), "columns": list(columns), "rows": rows, "chunk_units": int(sizes[0]),
        "n_chunks": len(sizes), "created": utc_now(), "distfit_version": __version__,
    }))


def open_resumable(path: Path, expected: Mapping[str, Any]) -> zarr.Group:
    """Reopen the incomplete mask store at ``path`` for ``--resume`` after checking it was
    started with the same :data:`RESUME_KEYS` as ``expected`` (the attrs this session would
    lay out: the same columns, bounds, budget and sigma, seeded or not, the same source and
    rows); ValueError naming what differs."""
    root = MASK.open_incomplete(path)
    stated = dict(root.attrs)
    wanted = jsonable({k: expected[k] for k in RESUME_KEYS if k in expected})
    differ = [k for k, v in wanted.items() if stated.get(k) != v]
    if differ:
        raise ValueError(f"{path}: was started with other {', '.join(differ)}; resume with the same data and "
                         "options (or use --overwrite)")
    MASK.check_laid_out(root, path, ("masked", "column", "centre", "scale", "blocks/rows", "chunks/done"))
    return root


def seal(root: zarr.Group, path: Path, *, fsync: bool, hasher: ReleaseHasher | None = None,
         synced: Mapping[str, tuple[int, ...]] | None = None) -> str:
    """Check every block is written, take the checksum (the ``hasher``'s, hashed as the blocks
    landed) and mark the store complete (:func:`distfit.stores.release_chunks.seal_chunked`)."""
    return seal_chunked(root, path, fsync=fsync, hasher=hasher, synced=synced)


class Masked(SealedStore):
    """A sealed mask store opened for reading (module docstring); ``masked`` is the lazy zarr array."""

    private = root_attr("private", bool)
    sigma = root_attr("sigma", float)
    masked = store_array("masked", "``masked`` (n x (p + 1)): the masked rows, the constant column last.")

    @property
    def columns(self) -> list[str]:
        return list(self.attrs["columns"])

    @property
    def account(self) -> dict:
        return dict(self.attrs["account"])

    @property
    def rows(self) -> int:
        return int(self.attrs["rows"])

    @property
    def centre(self) -> np.ndarray:
        return np.asarray(self._group["centre"][...])

    @property
    def scale(self) -> np.ndarray:
        return np.asarray(self._group["scale"][...])

    @property
    def block_rows(self) -> np.ndarray:
        """The rows of each block (``blocks/rows``)."""
        return np.asarray(self._group["blocks/rows"][...])

    def blocks(self) -> Iterator[np.ndarray]:
        """The masked rows block by block (one zarr chunk at a time: memory of one block)."""
        masked, start = self._group["masked"], 0
        for size in self.block_rows.tolist():
            yield np.asarray(masked[start:start + size])
            start += size


#: The mask store as a kind of sealed store (:class:`distfit.stores.sealing.SealedKind`).
MASK = SealedKind(FORMAT, FORMAT_VERSION, MaskError, Masked)
read_mask, read_verified_mask, verify_mask = MASK.read, MASK.read_verified, MASK.verify
mask_state, check_replaceable = MASK.state, MASK.check_replaceable


def create_input(path: Path, p: int, chunk_rows: int) -> zarr.Array:
    """A new input store at ``path`` (module docstring): an empty (0, p) float64 array
    ``values``, grown by ``append`` as the driver reads the CSV."""
    root = zarr.open_group(store=os.fspath(path), mode="w-", zarr_format=3)
    return root.create_array("values", shape=(0, p), dtype=np.float64, chunks=(chunk_rows, p), compressors=None)


def open_input(path: str | os.PathLike) -> zarr.Array:
    """The ``values`` array of the input store at ``path``, read-only (a task's rows)."""
    return zarr.open_group(store=os.fspath(path), mode="r", zarr_format=3)["values"]
