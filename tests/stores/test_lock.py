"""One writer per store (distfit.stores.lock): refusal naming the holder, stale locks, and real
concurrent writers of one release."""
from __future__ import annotations

import dataclasses
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
from tests.holding import held_job, let_go, wait_held


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


def _until(condition, seconds: float = 60.0) -> bool:
    """Poll ``condition()`` until it holds (True) or ``seconds`` have passed (False): a deadline
    for a state another thread brings about, not a guess of how long it takes."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_heartbeat_keeps_a_long_write_fresh(tmp_path, monkeypatch):
    """A lock aged past STALE_SECONDS under a live writer is touched again by its heartbeat, so a
    writer on another host would not break it."""
    monkeypatch.setattr(lock_module, "HEARTBEAT_SECONDS", 0.05)
    store = tmp_path / "x.zarr"
    with store_lock(store, "release") as lock:
        old = time.time() - 1000
        os.utime(lock, (old, old))
        elsewhere = dataclasses.replace(read_holder(lock), host="node-17")
        assert lock_module.is_stale(lock, elsewhere)  # as aged: another host's writer would break it
        assert _until(lambda: lock.stat().st_mtime > old + 500), "the heartbeat never touched the lock"
        assert not lock_module.is_stale(lock, elsewhere)


def test_racing_writers_one_wins(tmp_path):
    """Eight processes try to take one lock at once: exactly one gets it (and holds it until the
    other seven have been refused, however slowly they start). The holder says so on stdout and
    waits for a line on stdin; the refused ones say so and exit: every wait is on a pipe."""
    store = tmp_path / "x.zarr"
    script = (
        "import sys\n"
        "from distfit.stores.lock import store_lock, StoreLockedError\n"
        "try:\n"
        f"    with store_lock({str(store)!r}, 'release'):\n"
        "        print('holding', flush=True)\n"
        "        sys.stdin.readline()\n"
        "    print('won')\n"
        "except StoreLockedError:\n"
        "    print('refused')\n"
    )
    processes = [subprocess.Popen([sys.executable, "-c", script], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  text=True) for _ in range(8)]
    try:
        first = [p.stdout.readline().strip() for p in processes]  # the holder holds while the others try
        assert sorted(first) == ["holding"] + ["refused"] * 7, first
        holder = processes[first.index("holding")]
        assert holder.communicate(input="\n", timeout=120)[0].strip() == "won"
        assert [p.wait(timeout=120) for p in processes] == [0] * 8
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=60)
            p.stdin.close()
            p.stdout.close()


def test_concurrent_releases_into_one_store(small_plan, tmp_path, capsys):
    """While one `distfit release` writes X, a second release, a second --resume and an --overwrite
    of X are each refused with one line naming the writer; the first seals X, whose checksum is
    the one it printed. The first holds after its first chunk (tests.holding) until the others
    have tried."""
    data = tmp_path / "data.zarr"
    write_synthetic(small_plan.spec, 40, data, seed=1, chunk_units=5)
    out = tmp_path / "x.zarr"
    script = (
        "from distfit.release.job import run_release\n"
        "from distfit.runtime.placement import Placement\n"
        f"result = run_release({small_plan.plan!r}, {str(data)!r}, {str(out)!r}, seed=3,\n"
        "                     placement=Placement(serial=True), after_chunk=hold_after(1))\n"
        "print(result.checksum)\n"
    )
    with held_job(script) as first:
        wait_held(first)
        assert lock_path(out).exists()
        for flags in ((), ("--resume",), ("--overwrite",)):
            code, _, err = run(capsys, "release", small_plan.plan, "--data", str(data), "--out", str(out),
                               "--serial", "--seed", "4", *flags)
            assert code == 2, (flags, err)
            assert_one_line_error(err, f"being written by pid {first.pid}")
        assert first.poll() is None  # held: the others tried while it wrote
        stdout, stderr = let_go(first)
    assert first.returncode == 0, stderr
    ok, stored, _ = verify_release(out)
    assert ok and stdout.strip() == stored
    assert read_release(out).private is False
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.zarr", "x.zarr"]
