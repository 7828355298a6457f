"""Pieces: the rows a task computed for a store it does not write whole, kept until the store's chunks are written.

The estimate on the cluster (:mod:`distfit.estimate.subtree_job`) computes each level's rows a
forest of subtrees at a time; a forest's rows do not fall on the store's chunks of units, so each
task writes its rows as a *piece* (a directory of ``.npy`` files, one per array, and a
``manifest.json``, written aside and renamed into place: a piece is there whole or not at all) and
the store's chunks are then written from the pieces they overlap. The pieces of a job live in one
directory with a ``key`` file naming the piece format and the inputs they were computed from
(:func:`open_pieces`: a directory of other inputs or of another format is emptied); they are
deleted once every store is sealed (:func:`remove_pieces`).

Trust. A piece is not sealed, but what is sealed from it is, so a piece is verified as it is
read: its manifest records, per array, the shape, the dtype and the 32-byte BLAKE3 digest of its
rows (:func:`distfit.stores.checksum.chunk_digest` of the array's name, the piece's first row and
the rows: the digest a store's chunk of the same rows would have), written before the rename;
or, for the arrays of a row per unit written with a ``slab`` (the store's chunk of units), one
digest per slab of rows, the slabs at multiples of ``slab`` in the level's rows (the digests a
store's chunks of those rows would have), so that a reader of some rows (:func:`read_piece`'s
``rows``: one chunk of the store) reads and hashes only the slabs it needs: every row of a
piece hashed once over all the chunks written from it, not once per chunk it overlaps (a piece
of a 50,000-row forest overlaps a dozen chunks of 4,096 units).
:func:`read_piece` raises :class:`PieceMismatch` (naming the piece,
the array and what differs) when an array is missing, extra, of another shape or dtype, or does
not hash to its digest. :func:`piece_done` (the driver's cheap test, on a rerun, of which pieces
need not be computed again) checks the manifest and each file's size against it without reading
the rows; a piece that fails either test counts as not written (the driver deletes one
:func:`read_piece` refused, :func:`remove_piece`, and the task that wrote it runs again).
"""
from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from distfit.stores.atomic import fsync_dir, write_text_atomic
from distfit.stores.checksum import chunk_digest

__all__ = ["FORMAT", "PieceMismatch", "open_pieces", "piece_done", "piece_path", "piece_rows", "read_piece", "remove_piece",
           "remove_pieces", "write_piece"]

KEY = "key"
MANIFEST = "manifest.json"
#: The pieces' format, the first line of the directory's ``key`` (pieces without a manifest, of
#: an earlier format, are emptied with their directory).
FORMAT = "distfit-pieces-v3"
#: The ``.npy`` header readers by format version (``np.save`` writes 1.0, or 2.0 for a header
#: over 64 KiB): ``(shape, fortran_order, dtype)``.
HEADERS = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}


class PieceMismatch(ValueError):
    """The piece at ``piece`` is not what its writer wrote (``problem``: a file missing, changed or
    of another shape); the message is ``"<piece>: <problem>"``."""

    def __init__(self, piece: str | os.PathLike, problem: str):
        super().__init__(f"{piece}: {problem}")
        self.piece, self.problem = Path(piece), problem

    def __reduce__(self):  # raised in a task, re-raised in the driver
        return (PieceMismatch, (self.piece, self.problem))


def open_pieces(directory: Path, key: str) -> Path:
    """The pieces directory for inputs named by ``key`` (text): made if absent, emptied if it
    holds pieces of another key or format."""
    key_file, text = directory / KEY, f"{FORMAT}\n{key}"
    if directory.exists() and (not key_file.exists() or key_file.read_text() != text):
        shutil.rmtree(directory)
    if not directory.exists():
        directory.mkdir(parents=True)
        write_text_atomic(key_file, text)
    return directory


def piece_path(directory: Path, level: str, first: int) -> Path:
    """The directory of level ``level``'s piece starting at row ``first``."""
    return directory / level / f"{int(first):012d}"


def _manifest(piece: Path) -> dict:
    """The piece's manifest; :class:`PieceMismatch` when it is missing or unreadable."""
    try:
        manifest = json.loads((piece / MANIFEST).read_text())
        arrays = manifest["arrays"]
        if manifest.get("format") != FORMAT or not isinstance(arrays, dict):
            raise ValueError("another format")
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise PieceMismatch(piece, f"no readable {MANIFEST} ({error})") from None
    return manifest


def _sizes_match(piece: Path, arrays: Mapping[str, dict]) -> bool:
    """Each recorded array's file present, its ``.npy`` header of the recorded shape and dtype and
    its size the header's plus the rows' bytes, and no other ``.npy`` file (the rows unread)."""
    files = {path.stem: path for path in piece.glob("*.npy")}
    if set(files) != set(arrays):
        return False
    for name, entry in arrays.items():
        with open(files[name], "rb") as f:
            version = np.lib.format.read_magic(f)
            if version not in HEADERS:
                return False
            shape, _, dtype = HEADERS[version](f)
            if list(shape) != list(entry["shape"]) or dtype.str != entry["dtype"]:
                return False
            payload = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if files[name].stat().st_size != f.tell() + payload:
                return False
    return True


def piece_done(directory: Path, level: str, first: int) -> bool:
    """Whether level ``level``'s piece starting at row ``first`` is written whole: its manifest
    readable and each array's file of the size it records (the rows are not read: :func:`read_piece`
    checks their digests)."""
    piece = piece_path(directory, level, first)
    if not piece.is_dir():
        return False
    try:
        return _sizes_match(piece, _manifest(piece)["arrays"])
    except (PieceMismatch, OSError, KeyError, TypeError, ValueError):
        return False


def _slabs(first: int, rows: int, slab: int) -> list[tuple[int, int]]:
    """The slabs ``(start, stop)`` (level rows) of a piece's rows ``first .. first + rows``: cut at
    the multiples of ``slab``."""
    cuts = list(range((first // slab + 1) * slab, first + rows, slab))
    bounds = [first, *cuts, first + rows]
    return [(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a] or [(first, first)]


def write_piece(directory: Path, level: str, first: int, arrays: Mapping[str, np.ndarray], *, fsync: bool,
                slab: int | None = None, sliced: tuple[str, ...] = ()) -> None:
    """Write level ``level``'s rows from row ``first`` (``arrays``: name -> rows, names without
    ``/``) as one piece with its manifest, atomically (aside, then renamed; an existing piece that
    :func:`piece_done` accepts is kept: a retry computes the same rows; one it does not is replaced).
    ``sliced``: the arrays of a row per unit (row ``i`` is the level's row ``first + i``), digested
    per ``slab`` of rows (module docstring) when ``slab`` is given; the others whole."""
    final = piece_path(directory, level, first)
    final.parent.mkdir(parents=True, exist_ok=True)
    aside = final.with_name(f".{final.name}.{uuid.uuid4().hex}")
    aside.mkdir()
    try:
        entries = {}
        for name, rows in arrays.items():
            rows = np.ascontiguousarray(rows)
            entries[name] = {"shape": list(rows.shape), "dtype": rows.dtype.str}
            if slab and name in sliced:
                entries[name]["slab"] = int(slab)
                entries[name]["blake3"] = [chunk_digest(name, a, rows[a - first:b - first]).hex()
                                           for a, b in _slabs(int(first), rows.shape[0], int(slab))]
            else:
                entries[name]["blake3"] = chunk_digest(name, int(first), rows).hex()
            with open(aside / f"{name}.npy", "wb") as f:
                np.save(f, rows)
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())
        write_text_atomic(aside / MANIFEST, json.dumps({"format": FORMAT, "level": level, "first": int(first),
                                                        "arrays": entries}, sort_keys=True), fsync=fsync)
        try:
            os.rename(aside, final)
        except OSError:
            if piece_done(directory, level, first):
                return
            shutil.rmtree(final, ignore_errors=True)  # a partial or changed piece: replaced
            os.rename(aside, final)
        if fsync:
            fsync_dir(final.parent)
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def read_piece(directory: Path, level: str, first: int, rows: tuple[int, int] | None = None,
               names: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Level ``level``'s piece starting at row ``first``: name -> rows (memory-mapped: a reader
    copies the rows it needs), each checked against its manifest (shape, dtype, BLAKE3 digest:
    every row is read once); :class:`PieceMismatch` naming the piece and the array otherwise.
    ``rows`` ``(start, stop)`` (level rows): an array digested per slab is given as its rows
    within them only (the piece's ``max(start, first) .. min(stop, first + rows)``), and only the
    slabs holding them are read and checked; the other arrays whole, as without ``rows``.
    ``names``: only those arrays read and checked (None: every array)."""
    piece = piece_path(directory, level, first)
    arrays = _manifest(piece)["arrays"]
    rows_of = rows
    files = {path.stem for path in piece.glob("*.npy")}
    if files != set(arrays):
        raise PieceMismatch(piece, f"arrays {sorted(files)} on disk, {sorted(arrays)} written")
    out = {}
    for name, entry in sorted(arrays.items()):
        if names is not None and name not in names:
            continue
        try:
            rows = np.load(piece / f"{name}.npy", mmap_mode="r", allow_pickle=False)
        except (OSError, ValueError) as error:
            raise PieceMismatch(piece, f"array {name} unreadable ({error})") from None
        if list(rows.shape) != list(entry["shape"]) or rows.dtype.str != entry["dtype"]:
            raise PieceMismatch(piece, f"array {name} is {rows.dtype.str} {list(rows.shape)}, "
                                       f"written {entry['dtype']} {entry['shape']}")
        if "slab" in entry:
            rows = _checked_slabs(piece, name, entry, int(first), rows, requested=rows_of)
        elif chunk_digest(name, int(first), rows).hex() != entry["blake3"]:
            raise PieceMismatch(piece, f"array {name} does not hash to the digest it was written with")
        out[name] = rows
    return out


def piece_rows(directory: Path, level: str, first: int, name: str) -> int:
    """The rows of array ``name`` of level ``level``'s piece starting at row ``first``, as its
    manifest states them (not checked here: :func:`read_piece` checks the array against them);
    :class:`PieceMismatch` when the manifest is unreadable or has no such array."""
    piece = piece_path(directory, level, first)
    entry = _manifest(piece)["arrays"].get(name)
    if not isinstance(entry, dict) or not entry.get("shape"):
        raise PieceMismatch(piece, f"no array {name} in its manifest")
    return int(entry["shape"][0])


def _checked_slabs(piece: Path, name: str, entry: dict, first: int, rows: np.ndarray,
                   requested: tuple[int, int] | None) -> np.ndarray:
    """``rows``' part within ``requested`` (all: None), every slab it overlaps hashed against its
    digest; :class:`PieceMismatch` naming the piece and the array otherwise."""
    slabs = _slabs(first, rows.shape[0], int(entry["slab"]))
    digests = entry["blake3"]
    if not isinstance(digests, list) or len(digests) != len(slabs):
        raise PieceMismatch(piece, f"array {name}: {len(digests)} slab digests for {len(slabs)} slabs")
    start, stop = (first, first + rows.shape[0]) if requested is None else requested
    start, stop = max(int(start), first), min(int(stop), first + rows.shape[0])
    for (a, b), digest in zip(slabs, digests):
        if a < stop and b > start and chunk_digest(name, a, rows[a - first:b - first]).hex() != digest:
            raise PieceMismatch(piece, f"array {name} does not hash to the digest it was written with")
    return rows[max(start - first, 0):max(stop - first, 0)]


def remove_piece(directory: Path, error: PieceMismatch) -> None:
    """Delete the piece ``error`` refused (it is then computed again), if it lies in ``directory``."""
    if error.piece.parent.parent == Path(directory):
        shutil.rmtree(error.piece, ignore_errors=True)


def remove_pieces(directory: Path) -> None:
    """Delete the pieces directory (every store written from it is sealed)."""
    shutil.rmtree(directory, ignore_errors=True)
