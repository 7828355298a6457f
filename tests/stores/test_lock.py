"""One writer per store (distfit.stores.lock): refusal naming the holder, stale locks, and real
concurrent writers of one release."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from distfit.stores import lock as lock_module
from distfit.stores.data import write_synthetic
from distfit.stores.lock import StoreLockedError, lock_path, read_holder, store_lock
from distfit.stores.release import read_release, verify_release
from tests.clitools import assert_one_line_error, run


def _write_lock(path: Path, host: str, pid: int, age: float = 0.0) -> Path:
    lock = lock_path(path)
    lock.write_text(json.dumps({"host": host, "pid": pid, "user": "someone", "command": "distfit release",
                                "since": "2026-01-01T00:00:00Z"}))
    if age:
        then = time.time() - age
        os.utime(lock, (then, then))
    return lock


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_second_writer_is_refused_naming_the_holder(tmp_path):
    store = tmp_path / "x.zarr"
    with store_lock(store, "release") as lock:
        assert lock == tmp_path / "x.zarr.lock" and lock.is_file()
        holder = read_holder(lock)
        assert holder.pid == os.getpid() and holder.host == socket.gethostname()
        with pytest.raises(StoreLockedError) as info:
            with store_lock(store, "release"):
                pass
        message = str(info.value)
        assert f"pid {os.getpid()} on {socket.gethostname()}" in message and "since" in message
        assert "\n" not in message
    assert not lock.exists()  # released


def test_lock_is_released_when_the_write_fails(tmp_path):
    store = tmp_path / "x.zarr"
    with pytest.raises(RuntimeError, match="boom"):
        with store_lock(store, "plan"):
            raise RuntimeError("boom")
    with store_lock(store, "plan"):
        pass


def test_dead_holder_on_this_host_is_broken(tmp_path):
    store = tmp_path / "x.zarr"
    _write_lock(store, socket.gethostname(), _dead_pid())
    with store_lock(store, "release") as lock:
        assert read_holder(lock).pid == os.getpid()


def test_holder_on_another_host_is_stale_only_without_heartbeat(tmp_path):
    store = tmp_path / "x.zarr"
    _write_lock(store, "node-17", 4242)
    with pytest.raises(StoreLockedError, match="pid 4242 on node-17"):
        with store_lock(store, "release"):
            pass
    _write_lock(store, "node-17", 4242, age=lock_module.STALE_SECONDS + 5)
    with store_lock(store, "release") as lock:
        assert read_holder(lock).host == socket.gethostname()


def test_heartbeat_keeps_a_long_write_fresh(tmp_path, monkeypatch):
    monkeypatch.setattr(lock_module, "HEARTBEAT_SECONDS", 0.05)
    store = tmp_path / "x.zarr"
    with store_lock(store, "release") as lock:
        old = time.time() - 1000
        os.utime(lock, (old, old))
        time.sleep(0.3)
        assert time.time() - lock.stat().st_mtime < 10


def test_racing_writers_one_wins(tmp_path):
    """Eight processes try to take one lock at once: exactly one gets it (and holds it until the
    other seven have been refused, however slowly they start)."""
    store = tmp_path / "x.zarr"
    release = tmp_path / "release-now"
    script = (
        "import os, sys, time\n"
        "from distfit.stores.lock import store_lock, StoreLockedError\n"
        "try:\n"
        f"    with store_lock({str(store)!r}, 'release'):\n"
        "        deadline = time.time() + 120\n"
        f"        while not os.path.exists({str(release)!r}) and time.time() < deadline:\n"
        "            time.sleep(0.05)\n"
        "    print('won')\n"
        "except StoreLockedError:\n"
        "    print('refused')\n"
    )
    processes = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True) for _ in range(8)]
    deadline = time.time() + 120
    while sum(p.poll() is not None for p in processes) < 7 and time.time() < deadline:
        time.sleep(0.05)
    release.touch()
    outcomes = sorted(p.communicate(timeout=120)[0].strip() for p in processes)
    assert outcomes == ["refused"] * 7 + ["won"]


def test_concurrent_releases_into_one_store(small_plan, tmp_path, capsys):
    """While one `distfit release` writes X, a second release, a second --resume and an --overwrite
    of X are each refused with one line naming the writer; the first seals X, whose checksum is
    the one it printed."""
    data = tmp_path / "data.zarr"
    write_synthetic(small_plan.spec, 40, data, seed=1, chunk_units=5)
    out = tmp_path / "x.zarr"
    script = (
        "import time\n"
        "from distfit.release.job import run_release\n"
        "from distfit.runtime.placement import Placement\n"
        f"result = run_release({small_plan.plan!r}, {str(data)!r}, {str(out)!r}, seed=3,\n"
        "                     placement=Placement(serial=True), after_chunk=lambda chunk: time.sleep(0.3))\n"
        "print(result.checksum)\n"
    )
    first = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 60
        while not (out.is_dir() and lock_path(out).exists()) and time.time() < deadline:
            time.sleep(0.05)
        assert lock_path(out).exists(), "the first release never started"
        for flags in ((), ("--resume",), ("--overwrite",)):
            code, _, err = run(capsys, "release", small_plan.plan, "--data", str(data), "--out", str(out),
                               "--serial", "--seed", "4", *flags)
            assert code == 2, (flags, err)
            assert_one_line_error(err, f"being written by pid {first.pid}")
        assert first.poll() is None, "the first release finished before the others tried: the test proved nothing"
    finally:
        stdout, stderr = first.communicate(timeout=120)
    assert first.returncode == 0, stderr
    ok, stored, _ = verify_release(out)
    assert ok and stdout.strip() == stored
    assert read_release(out).private is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.zarr", "x.zarr"]
