"""Checkpoints of a fit within one chunk of an estimate: written atomically, verified when read back.

A long fit (the local polytope's ADMM on Adult: one unit, 30-60 s) saves its iteration state
now and then (:mod:`distfit.estimate.checkpoints` says what and when), so that ``distfit
estimate --resume`` after a kill continues it instead of starting the chunk over. Layout (not a
contract: a checkpoint is read only by the distfit that wrote it, and only while its estimate is
incomplete)::

    estimate.zarr.checkpoints/            beside the store, as its lock (<store>.lock) is
      chunk-000000-step-000000250/        a Zarr v3 group: the newest checkpoint of chunk 0
          attrs: distfit_format="estimate-checkpoint", format_version=1, chunk, step,
                 key (what the fit's inputs hash to: the caller's), checksum
          <name>  one array per piece of state (float64, int, bool), one zarr chunk each
      .chunk-000000-<random>.tmp/         a checkpoint being written (ignored, removed)

Atomic: a checkpoint is written whole in a temporary directory, its checksum computed from the
files written (the one sealing path: :func:`distfit.stores.sealing.seal_checksum` under the
:func:`distfit.stores.sealing.stated_attrs` rule, over its arrays and every attr but the checksum),
stored, every file fsynced, then the directory renamed to its final name,
which no earlier checkpoint has (the step is in it; a rename never replaces a non-empty
directory), and the parent directory fsynced; only then are the chunk's older checkpoints
deleted. A kill at any moment leaves the previous checkpoint whole, or the new one whole, or
both (the newest is read).

Verified: :func:`read_checkpoint` recomputes the checksum from the files and refuses
(:class:`CheckpointError`, one line naming the checkpoint) one whose contents do not hash to the
checksum it was written with, or that cannot be read at all; the caller decides what a refusal
means (:mod:`distfit.estimate.checkpoints`: said on stderr, then the fit starts afresh).

Beside the store, not in it: every reader of a store lists its members (the checksum, while
the chunks are written, too), and zarr warns of any directory in a group that is not a node;
a node would be hashed into the store's checksum. Under the store's lock, as the store.

Removed: a chunk's checkpoints once its rows are written (:func:`remove_checkpoints`, the
driver), the whole directory before the store is sealed (:func:`distfit.stores.estimate.seal`)
and when a new store is laid out at the path (the leftovers of a store deleted by hand): a
sealed estimate has none.

What a checkpoint holds is the caller's; the estimate's is the model's state (functions of the
release and the plan only: post-processing, as the store itself), never the data.
"""
from __future__ import annotations

import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import zarr

from distfit.stores.atomic import fsync_dir
from distfit.stores.files import fsync_tree, jsonable, write_array
from distfit.stores.sealing import seal_checksum, stated_attrs

__all__ = ["CHECKPOINTS", "CheckpointError", "checkpoints_dir", "read_checkpoint", "remove_checkpoints",
           "write_checkpoint"]

#: The suffix of the directory beside an estimate store that holds its checkpoints.
CHECKPOINTS = ".checkpoints"
FORMAT = "estimate-checkpoint"
FORMAT_VERSION = 1
_NAME = re.compile(r"chunk-(\d+)-step-(\d+)")


class CheckpointError(ValueError):
    """A checkpoint that cannot be trusted (one line: which, and why)."""


def checkpoints_dir(store: str | os.PathLike) -> Path:
    """The directory of the checkpoints of the estimate store at ``store``: ``<store>.checkpoints``."""
    store = Path(store)
    return store.with_name(store.name + CHECKPOINTS)


def _found(store: str | os.PathLike, chunk: int) -> list[tuple[int, Path]]:
    """``(step, path)`` of the chunk's finished checkpoints, oldest first."""
    where = checkpoints_dir(store)
    if not where.is_dir():
        return []
    found = []
    for path in where.iterdir():
        match = _NAME.fullmatch(path.name)
        if match and int(match[1]) == chunk:
            found.append((int(match[2]), path))
    return sorted(found)


def write_checkpoint(store: str | os.PathLike, chunk: int, step: int, arrays: Mapping[str, np.ndarray],
                     attrs: Mapping[str, Any], *, fsync: bool = True) -> Path:
    """Write chunk ``chunk``'s checkpoint at ``step`` (``arrays``: name -> array, ``attrs``:
    JSON, e.g. the caller's ``key``) under the estimate store at ``store``, atomically (module
    docstring), then delete the chunk's older checkpoints. Returns its path."""
    where = checkpoints_dir(store)
    if not where.is_dir():
        where.mkdir(exist_ok=True)  # exist_ok: another run of the chunk, at the same moment
        if fsync:
            fsync_dir(where.parent)
    final = where / f"chunk-{chunk:06d}-step-{step:09d}"
    temporary = where / f".chunk-{chunk:06d}-{secrets.token_hex(6)}.tmp"
    try:
        group = zarr.open_group(store=str(temporary), mode="w-", zarr_format=3)
        for name, values in arrays.items():
            values = np.ascontiguousarray(values)
            write_array(group, name, values, dims=tuple(f"{name}_{i}" for i in range(values.ndim)))
        stated = {**jsonable(dict(attrs)), "distfit_format": FORMAT, "format_version": FORMAT_VERSION,
                  "chunk": int(chunk), "step": int(step)}
        group.attrs.update(stated)
        group.attrs["checksum"] = seal_checksum(group, stated, stated_attrs, threads=1)
        if fsync:
            fsync_tree(temporary)
        try:
            os.rename(temporary, final)
        except OSError:
            if not final.is_dir():
                raise
            # the same step written by another run of this chunk (a task retried while the first
            # still ran): the fit is deterministic, so it holds these bits; ours is dropped
            shutil.rmtree(temporary, ignore_errors=True)
        if fsync:
            fsync_dir(where)
    except BaseException:
        shutil.rmtree(temporary, ignore_errors=True)
        raise
    for older_step, path in _found(store, chunk):
        if older_step != step:
            shutil.rmtree(path, ignore_errors=True)
    return final


def read_checkpoint(store: str | os.PathLike, chunk: int) -> tuple[dict[str, np.ndarray], dict[str, Any]] | None:
    """The newest checkpoint of chunk ``chunk`` under the estimate store at ``store``, verified:
    ``(arrays, attrs)``, or None when there is none. :class:`CheckpointError` (one line) when
    it cannot be read or its contents do not hash to its checksum. Temporary directories of
    interrupted writes are ignored."""
    found = _found(store, chunk)
    if not found:
        return None
    step, path = found[-1]
    try:
        group = zarr.open_group(store=str(path), mode="r", zarr_format=3)
        attrs = dict(group.attrs)
        if attrs.get("distfit_format") != FORMAT or attrs.get("format_version") != FORMAT_VERSION:
            raise CheckpointError(f"{path}: not a checkpoint this distfit reads (format "
                                  f"{attrs.get('distfit_format')!r}, version {attrs.get('format_version')!r})")
        recomputed = seal_checksum(group, attrs, stated_attrs, threads=1)
        arrays = {name: np.asarray(arr[...]) for name, arr in group.arrays()}
    except CheckpointError:
        raise
    except Exception as failure:  # noqa: BLE001 - any unreadable file is a refused checkpoint
        text = str(failure).splitlines()[0] if str(failure) else type(failure).__name__
        raise CheckpointError(f"{path}: the checkpoint cannot be read ({text})") from None
    if recomputed != attrs.get("checksum") or attrs.get("step") != step or attrs.get("chunk") != chunk:
        raise CheckpointError(f"{path}: the checkpoint fails verification: its contents hash to {recomputed}, "
                              f"not to the {attrs.get('checksum')} it was written with")
    return arrays, attrs


def remove_checkpoints(store: str | os.PathLike, chunk: int | None = None) -> None:
    """Delete chunk ``chunk``'s checkpoints (None: the whole checkpoints directory, temporary
    ones included) under the estimate store at ``store``; nothing there is no error."""
    if chunk is None:
        shutil.rmtree(checkpoints_dir(store), ignore_errors=True)
        return
    for _step, path in _found(store, chunk):
        shutil.rmtree(path, ignore_errors=True)
    where = checkpoints_dir(store)
    if where.is_dir():
        for path in where.glob(f".chunk-{chunk:06d}-*.tmp"):
            shutil.rmtree(path, ignore_errors=True)
