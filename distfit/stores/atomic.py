"""Plain files written atomically, without zarr (so that commands that write no store, such as
``distfit solve``, import none): a file is staged next to its final path and moved onto it with
``os.replace``, atomic within a directory, so a reader sees the old file or the new one, never a
part; a failed write leaves nothing behind. The stores' own staging of whole directories is
:mod:`distfit.stores.files`.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable


def fsync_dir(path: str | os.PathLike) -> None:
    """fsync a directory (so a rename or a new file in it survives a crash); best effort: a file
    system that cannot fsync a directory is not an error."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def current_umask() -> int:
    """The process's umask (read by setting it and restoring it: there is no other way)."""
    mask = os.umask(0)
    os.umask(mask)
    return mask


def remove_quietly(path: str | os.PathLike) -> None:
    """Remove a file we created, if it is there: the cleanup of a failed write, which must not
    hide the error that made it."""
    try:
        os.unlink(path)
    except OSError:
        pass


def stage_file(path: str | os.PathLike, write: Callable[[Any], None], *, mode: int | None = None,
               fsync: bool = True) -> Path:
    """Write via ``write(binary_file)`` to a temporary file next to ``path`` (same directory, so
    an ``os.replace`` onto ``path`` is atomic), flush and fsync it (``fsync``), give it ``mode``
    (default: what a new file gets under the umask, ``0o666 & ~umask``; a temporary file's 0600
    would hide a run's record from its group) and return its name. The caller replaces ``path``
    with it (so several files can be staged first and all replaced at the end); on any failure
    the temporary is removed and nothing is left behind."""
    path = Path(os.fspath(path))
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(path.parent))
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            if fsync:
                os.fsync(handle.fileno())
        os.chmod(temporary, (0o666 & ~current_umask()) if mode is None else mode)
    except BaseException:
        remove_quietly(temporary)
        raise
    return Path(temporary)


def write_text_atomic(path: str | os.PathLike, text: str, *, fsync: bool = True) -> None:
    """Write ``text`` (UTF-8) atomically (:func:`stage_file`, then ``os.replace`` onto ``path``):
    a reader sees the old file or the new one, never a part. The file gets mode 0644."""
    path = Path(os.fspath(path))
    temporary = stage_file(path, lambda handle: handle.write(text.encode("utf-8")), mode=0o644, fsync=fsync)
    try:
        os.replace(temporary, path)
    except BaseException:
        remove_quietly(temporary)
        raise
    if fsync:
        fsync_dir(path.parent)
