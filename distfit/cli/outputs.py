"""Atomic output files of ``distfit solve`` (``--json``, ``--save``).

Each output is written to a temporary file in its own directory, flushed and fsynced, and moved
into place (``os.replace``, atomic within a directory) only once every output has been staged,
so a failure leaves neither a partial file nor a partial set of files. ``check_output_path``
refuses, before any work, a path that cannot possibly be written (``UsageError``, exit code 2);
a write that fails anyway raises ``OutputError`` (exit code 1).
"""
from __future__ import annotations

import os
from typing import Any, Callable, Sequence

from distfit.cli.errors import OutputError, UsageError
from distfit.stores.atomic import remove_quietly, stage_file


def check_output_path(flag: str, path: str | None) -> None:
    """Fail before the solve if an output cannot possibly be written."""
    if path is None:
        return
    if path == "" or path.endswith(os.sep):
        raise UsageError(f"{flag}: {path!r} is not a file name")
    if os.path.isdir(path):
        raise UsageError(f"{flag}: {path!r} is a directory")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UsageError(f"{flag}: directory {directory!r} does not exist")
    if not os.access(directory, os.W_OK):
        raise UsageError(f"{flag}: directory {directory!r} is not writable")


def write_outputs(outputs: Sequence[tuple[str, str, Callable[[Any], None]]]) -> None:
    """Write every ``(flag, path, writer)`` atomically: all are staged to temporary files in
    their target directories first and moved into place (``os.replace``) only when all are
    staged, so a failure leaves neither a partial file nor a partial set of files."""
    staged: list[tuple[str, str]] = []
    try:
        for flag, path, write in outputs:
            try:
                staged.append((str(stage_file(path, write)), path))
            except OSError as error:
                raise OutputError(f"{flag}: cannot write {path!r}: {error.strerror or error}") from None
        for temporary, path in staged:
            os.replace(temporary, path)
    finally:
        for temporary, _ in staged:
            remove_quietly(temporary)
