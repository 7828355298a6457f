"""One writer per store: a lock file beside the store, safe on a shared filesystem.

Every job that writes a store (plan, data, release, report, estimate) holds
``<store path>.lock`` for as long as it writes: a sibling of the store, because the store itself
is built in a staging directory and renamed into place, and may not exist yet. The lock is
taken by creating the file with ``O_CREAT | O_EXCL``, which is atomic on local filesystems and
on NFS v3 and later, the shared filesystems clusters use; ``fcntl`` locks are not, across hosts.

The file holds who holds it (host, process id, user, command) and since when. While the lock
is held a heartbeat thread refreshes the file's modification time every
:data:`HEARTBEAT_SECONDS`; a second writer that finds the lock refuses with
:class:`StoreLockedError` naming the holder and its age. A writer killed before it could
release the lock does not block the store for ever: a lock is *stale*, and is broken, when its
holder ran on this host and its process is gone, or when its heartbeat is older than
:data:`STALE_SECONDS` (a holder on another host that died). Breaking renames the stale file
to a unique name first, so of two writers that both found it stale only one breaks it and
takes the lock; the other then finds the new holder's lock.
"""
from __future__ import annotations

import contextlib
import getpass
import json
import os
import secrets
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from distfit.stores.files import utc_now

LOCK_SUFFIX = ".lock"
HEARTBEAT_SECONDS = 30.0
STALE_SECONDS = 300.0  # ten missed heartbeats: the holder's host or process is gone


class StoreLockedError(FileExistsError):
    """Another writer holds the store's lock (the message names it and since when). A
    ``FileExistsError``: like a store that may not be replaced, it is refused (exit 2)."""


@dataclass(frozen=True)
class LockHolder:
    """What a lock file says about its holder."""

    host: str
    pid: int
    user: str
    command: str
    since: str

    def describe(self) -> str:
        return f"pid {self.pid} on {self.host} (user {self.user}, since {self.since}: {self.command})"


def lock_path(store: str | os.PathLike) -> Path:
    """The lock file of the store at ``store``: ``<store>.lock`` beside it."""
    path = Path(os.fspath(store))
    return path.with_name(path.name + LOCK_SUFFIX)


def read_holder(lock: Path) -> LockHolder | None:
    """The holder a lock file names, or None when it is unreadable (being written, or garbage)."""
    try:
        doc = json.loads(lock.read_bytes())
        return LockHolder(str(doc["host"]), int(doc["pid"]), str(doc["user"]), str(doc["command"]), str(doc["since"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


def is_stale(lock: Path, holder: LockHolder | None, now: float | None = None) -> bool:
    """True when the lock's holder is gone: a dead process on this host, or no heartbeat for
    :data:`STALE_SECONDS` (module docstring)."""
    try:
        age = (time.time() if now is None else now) - lock.stat().st_mtime
    except FileNotFoundError:
        return False  # released meanwhile: not stale, just gone
    if holder is not None and holder.host == socket.gethostname() and not _process_alive(holder.pid):
        return True
    return age > STALE_SECONDS


def _user() -> str:
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name (a container without one): not a reason to fail
        return str(os.getuid())


def _try_create(lock: Path, content: bytes) -> bool:
    try:
        fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
    except FileExistsError:
        return False
    try:
        os.write(fd, content)
        os.fsync(fd)
    finally:
        os.close(fd)
    return True


def _break(lock: Path) -> None:
    aside = lock.with_name(f"{lock.name}.stale-{secrets.token_hex(6)}")
    with contextlib.suppress(FileNotFoundError):
        os.rename(lock, aside)  # only one of several breakers wins the rename
        aside.unlink()


@contextlib.contextmanager
def store_lock(store: str | os.PathLike, kind: str) -> Iterator[Path]:
    """Hold the lock of the ``kind`` store at ``store`` for the enclosed write (module
    docstring); raises :class:`StoreLockedError` when another live writer holds it. Yields the
    lock file's path; the lock is released (the file deleted) on exit, also on errors."""
    lock = lock_path(store)
    lock.parent.mkdir(parents=True, exist_ok=True)
    content = json.dumps({
        "host": socket.gethostname(), "pid": os.getpid(), "user": _user(),
        "command": " ".join(sys.argv)[:500] or "python", "since": utc_now(),
    }).encode("utf-8")
    for _ in range(3):
        if _try_create(lock, content):
            break
        holder = read_holder(lock)
        if holder is None and lock.exists():
            time.sleep(0.2)  # a writer between create and write: read it again
            holder = read_holder(lock)
        if is_stale(lock, holder):
            _break(lock)
            continue
        if not lock.exists():
            continue  # released between our create and our look
        who = holder.describe() if holder is not None else "an unreadable lock file"
        raise StoreLockedError(
            f"{store}: the {kind} store is being written by {who}; wait for it to finish "
            f"(a lock left by a writer that died is broken after {STALE_SECONDS:.0f} s, or at once on its host)")
    else:
        raise StoreLockedError(f"{store}: could not take the lock {lock} (other writers keep taking it)")
    stop = threading.Event()

    def heartbeat() -> None:
        while not stop.wait(HEARTBEAT_SECONDS):
            with contextlib.suppress(OSError):
                os.utime(lock)

    beat = threading.Thread(target=heartbeat, name=f"distfit-lock-{lock.name}", daemon=True)
    beat.start()
    try:
        yield lock
    finally:
        stop.set()
        beat.join()
        with contextlib.suppress(OSError):
            if lock.read_bytes() == content:  # still ours (not broken as stale and retaken)
                lock.unlink()
