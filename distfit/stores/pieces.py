"""Pieces: the rows a task computed for a store it does not write whole, kept until the store's chunks are written.

The estimate on the cluster (:mod:`distfit.estimate.subtree_job`) computes each level's rows a
forest of subtrees at a time; a forest's rows do not fall on the store's chunks of units, so each
task writes its rows as a *piece* (a directory of ``.npy`` files, one per array, written aside and
renamed into place: a piece is there whole or not at all) and the store's chunks are then written
from the pieces they overlap (read memory-mapped: a chunk reads its rows only). The pieces of a
job live in one directory with a ``key`` file naming the inputs they were computed from
(:func:`open_pieces`: a directory of other inputs is emptied); they are deleted once every store
is sealed (:func:`remove_pieces`). Never sealed, never hashed: the stores written from them are.
"""
from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from distfit.stores.atomic import fsync_dir, write_text_atomic

__all__ = ["open_pieces", "piece_done", "read_piece", "remove_pieces", "write_piece"]

KEY = "key"


def open_pieces(directory: Path, key: str) -> Path:
    """The pieces directory for inputs named by ``key`` (text): made if absent, emptied if it
    holds pieces of another key."""
    key_file = directory / KEY
    if directory.exists() and (not key_file.exists() or key_file.read_text() != key):
        shutil.rmtree(directory)
    if not directory.exists():
        directory.mkdir(parents=True)
        write_text_atomic(key_file, key)
    return directory


def _piece(directory: Path, level: str, first: int) -> Path:
    return directory / level / f"{int(first):012d}"


def piece_done(directory: Path, level: str, first: int) -> bool:
    """Whether level ``level``'s piece starting at row ``first`` is written."""
    return _piece(directory, level, first).is_dir()


def write_piece(directory: Path, level: str, first: int, arrays: Mapping[str, np.ndarray], *, fsync: bool) -> None:
    """Write level ``level``'s rows from row ``first`` (``arrays``: name -> rows, names without
    ``/``) as one piece, atomically (aside, then renamed; an existing piece is kept: a retry
    computes the same rows)."""
    final = _piece(directory, level, first)
    final.parent.mkdir(parents=True, exist_ok=True)
    aside = final.with_name(f".{final.name}.{uuid.uuid4().hex}")
    aside.mkdir()
    try:
        for name, rows in arrays.items():
            with open(aside / f"{name}.npy", "wb") as f:
                np.save(f, np.ascontiguousarray(rows))
                if fsync:
                    f.flush()
                    os.fsync(f.fileno())
        try:
            os.rename(aside, final)
        except OSError:
            if not final.is_dir():
                raise
        if fsync:
            fsync_dir(final.parent)
    finally:
        shutil.rmtree(aside, ignore_errors=True)


def read_piece(directory: Path, level: str, first: int) -> dict[str, np.ndarray]:
    """Level ``level``'s piece starting at row ``first``: name -> rows, memory-mapped."""
    piece = _piece(directory, level, first)
    return {path.stem: np.load(path, mmap_mode="r") for path in sorted(piece.glob("*.npy"))}


def remove_pieces(directory: Path) -> None:
    """Delete the pieces directory (every store written from it is sealed)."""
    shutil.rmtree(directory, ignore_errors=True)
