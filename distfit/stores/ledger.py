"""The machine's ledger of private releases: which data each one spent privacy budget on.

Every private release (not a test ``--seed`` one) that is sealed appends one JSON line to
``~/.local/share/distfit/releases.jsonl`` (the user's data directory; :func:`ledger_path`):
the data store's checksum (which names the data without holding it), the data and release
paths, the plan's rho and checksum, and the time. Before a release draws noise,
:func:`private_releases_of` reads the lines of the same data, so the release can say that it
spends the budget again and what the releases of that data now cost together: zCDP composes by
adding, so k releases of one plan cost k times its rho (docs/privacy.md, "Releasing the same
data again"). The ledger knows only what ran on this machine under this user; it is a warning,
not an enforcement, and never part of any store or release.

Lines are appended with one ``write`` of an ``O_APPEND`` file (whole lines, atomic on a local
filesystem); an unreadable line is skipped. A ledger that cannot be read or written (no
permission, a read-only home) raises OSError here; the release job turns that into one warning
line and releases all the same: the ledger warns, it never stops a release.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping

from distfit.stores.files import utc_now


def ledger_path() -> Path:
    """The ledger of this user on this machine."""
    return Path.home() / ".local" / "share" / "distfit" / "releases.jsonl"


def private_releases_of(data_checksum: str) -> list[dict[str, Any]]:
    """The recorded private releases of the data sealed with ``data_checksum`` (oldest first)."""
    path = ledger_path()
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (FileNotFoundError, NotADirectoryError):
        return []
    found = []
    for line in lines:
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("data_checksum") == data_checksum:
            found.append(entry)
    return found


def record_release(entry: Mapping[str, Any]) -> None:
    """Append ``entry`` (``data_checksum``, ``data``, ``release``, ``release_checksum``,
    ``plan_checksum``, ``rho``) with the time, as one line."""
    path = ledger_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    line = (json.dumps({**dict(entry), "recorded": utc_now()}, sort_keys=True) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


__all__ = ["ledger_path", "private_releases_of", "record_release"]
