"""`distfit run` end to end on a real Dask cluster started from the dask command line.

A scheduler and two workers are started as separate processes on loopback (``dask scheduler
--scheduler-file F`` and ``dask worker --scheduler-file F``, over TLS with per-run certificates,
the way cluster/README.md and the batch scripts start them), and ``distfit run ... --cluster F
--tls-ca-file ...`` runs as its own process, so the
whole path is exercised: the console entry point, the scheduler file, task shipping to worker
processes, Zarr stores written by the workers and sealed by the driver.

The fault tests run ``distfit release --seed S`` (``distfit run`` has no seed: its release stays
private, so it cannot be compared with another): one kills a worker process of that cluster
(SIGKILL, from inside the scheduler, right after the first chunk is written, while the worker
holds chunk tasks: ``tests.faults``); another kills the whole process group of a release on
its own local cluster (driver, nannies, workers) half-way and resumes it. Each proves the kill
fell while the work was in progress and compares the sealed release, bit for bit, with an
uninterrupted release of the same seed.
"""
from __future__ import annotations

import collections
import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml
import zarr

from distfit.release.job import run_release
from distfit.stores.data import write_synthetic
from distfit.stores.estimate import read_estimate
from distfit.stores.release import ReleaseError, read_release, verify_release
from distfit.stores.plan import read_plan
from distfit.runtime.placement import Placement
from tests.clitools import interruptible
from tests.faults import assert_killed_while_in_progress, kill_a_worker_after_the_first
from tests.reference import SMALL_SPEC

#: The cluster's processes: a long scheduler/worker transition log (the tests read it back to
#: see where the tasks ran), one BLAS thread per process on this small machine.
ENV = dict(os.environ, DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH="100000",
           OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")

#: The worker-kill test's data: KILL_CHUNKS chunks (release tasks) of KILL_CHUNK_UNITS units.
KILL_CHUNK_UNITS, KILL_CHUNKS = 200, 40
KILL_UNITS = KILL_CHUNK_UNITS * KILL_CHUNKS
#: The driver-kill test's data: many small chunks, so that the release stays part-way for a
#: couple of seconds (about 150 chunks/s on 2 workers) and the test's poll catches it there.
DRIVER_CHUNK_UNITS, DRIVER_CHUNKS = 100, 300
#: The fault tests' noise seed (``distfit release --seed``: tests only, the release is not private).
SEED = 20240611


def _dask(command: str) -> list[str]:
    """The ``dask`` console script of this interpreter's environment, else the modules behind it.

    Only the script next to ``sys.executable`` is used: a ``dask`` of another environment on
    PATH would start workers that cannot import distfit.
    """
    script = shutil.which("dask", path=os.path.dirname(sys.executable))
    if script:
        return [script, command]
    return [sys.executable, "-m", f"distributed.cli.dask_{command}"]


def _distfit(*argv) -> list[str]:
    return [sys.executable, "-m", "distfit.cli", *map(str, argv)]


def _tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _stop(process: subprocess.Popen, timeout: float = 20) -> None:
    """SIGTERM, wait, then SIGKILL the process group (a nanny's worker child included)."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            process.terminate()
        try:
            process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pass
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # the group is this test's: start_new_session
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=timeout)


@dataclass
class Cluster:
    scheduler_file: Path
    client: object
    logs: Path
    tls: list  # the cluster's certificate flags (--tls-ca-file CA --tls-cert CERT --tls-key KEY)

    def log_tails(self) -> str:
        return "\n".join(f"--- {p.name}\n{_tail(p)}" for p in sorted(self.logs.glob("*.log")))


@contextlib.contextmanager
def dask_cluster(tmp_path: Path, workers: int = 2):
    """A scheduler and ``workers`` single-threaded workers (each behind a nanny) on loopback,
    over TLS (``Security.temporary()``'s certificate as files), found through a scheduler file;
    yields a :class:`Cluster` with a connected client and tears every process down afterwards,
    whatever happened."""
    from distributed import Client
    from distributed.security import Security

    security = Security.temporary()
    pem = {"ca": security.tls_ca_file, "cert": security.tls_client_cert, "key": security.tls_client_key}
    for name, contents in pem.items():
        (tmp_path / f"{name}.pem").write_text(contents)
    tls = ["--tls-ca-file", tmp_path / "ca.pem", "--tls-cert", tmp_path / "cert.pem", "--tls-key", tmp_path / "key.pem"]

    scheduler_file = tmp_path / "scheduler.json"
    logs = tmp_path / "cluster-logs"
    logs.mkdir()
    processes: list[subprocess.Popen] = []
    handles = []

    def start(argv: list[str], name: str) -> subprocess.Popen:
        handle = open(logs / f"{name}.log", "wb")
        handles.append(handle)
        process = subprocess.Popen(argv, stdout=handle, stderr=subprocess.STDOUT, env=ENV,
                                   start_new_session=True)
        processes.append(process)
        return process

    try:
        scheduler = start(_dask("scheduler") + [
            "--scheduler-file", str(scheduler_file), "--protocol", "tls", "--host", "127.0.0.1", "--port", "0",
            "--dashboard-address", "127.0.0.1:0", *map(str, tls)], "scheduler")
        deadline = time.monotonic() + 30
        address = None
        while address is None and time.monotonic() < deadline and scheduler.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                address = json.loads(scheduler_file.read_text()).get("address")
            time.sleep(0.1)
        assert address, f"the scheduler wrote no scheduler file:\n{_tail(logs / 'scheduler.log')}"
        for i in range(workers):
            start(_dask("worker") + [
                "--scheduler-file", str(scheduler_file), "--nworkers", "1", "--nthreads", "1",
                "--nanny", "--no-dashboard", "--name", f"worker-{i}", *map(str, tls)], f"worker-{i}")
        with Client(scheduler_file=str(scheduler_file), timeout=30, security=security) as client:
            cluster = Cluster(scheduler_file, client, logs, tls)
            try:
                client.wait_for_workers(workers, timeout=60)
            except TimeoutError:
                raise AssertionError(f"the workers did not join:\n{cluster.log_tails()}") from None
            yield cluster
    finally:
        for process in reversed(processes):  # workers first, the scheduler last
            _stop(process)
        for handle in handles:
            handle.close()


@pytest.fixture(scope="module")
def started_cluster(tmp_path_factory):
    """One scheduler-file cluster (:func:`dask_cluster`) for the file's two tests that use one: a
    cluster's five processes (scheduler, two nannies, two workers) start once. Nothing of a test
    depends on a fresh cluster: see :func:`scheduler_cluster`."""
    with dask_cluster(tmp_path_factory.mktemp("cluster")) as cluster:
        yield cluster


@pytest.fixture()
def scheduler_cluster(started_cluster):
    """The shared cluster as a test starts on it: both workers connected (a worker killed by an
    earlier test is back, restarted by its nanny) and their transition logs emptied, so that
    :func:`executed_keys` sees this test's tasks only."""
    client = started_cluster.client
    client.wait_for_workers(2, timeout=60)

    def forget(dask_worker):
        dask_worker.state.log.clear()
    client.run(forget)
    return started_cluster


def worker_pids(client) -> dict[str, int]:
    """Worker address -> pid of its process, as the scheduler knows it."""
    def pids(dask_scheduler):
        return {address: ws.pid for address, ws in dask_scheduler.workers.items()}
    return client.run_on_scheduler(pids)


def executed_keys(client) -> dict[str, list[str]]:
    """Worker address -> keys of the tasks it ran to completion (its transition log)."""
    def executed(dask_worker):
        return [str(entry[0]) for entry in dask_worker.state.log
                if len(entry) >= 3 and entry[1] == "executing" and entry[2] == "memory"]
    return client.run(executed)


def _label(key: str, prefix: str) -> str:
    """``release-chunk-7-0a1b2c3d`` -> ``7`` (runtime.run_tasks keys: ``name-label-run``)."""
    return key[len(prefix):].rsplit("-", 1)[0]


def _write_spec(tmp_path: Path) -> Path:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(SMALL_SPEC))
    return spec


def _check_run(rundir: Path, cluster: Cluster, scheduler_address: str) -> dict:
    """What both tests require of a finished run on the cluster."""
    manifest = json.loads((rundir / "manifest.json").read_text())
    assert manifest["cluster"] == {
        "kind": "external", "address": str(cluster.scheduler_file),
        "scheduler_file": str(cluster.scheduler_file.resolve()), "scheduler_address": scheduler_address,
    }
    audit = subprocess.run(_distfit("audit", rundir / "plan.zarr"), capture_output=True, text=True,
                           timeout=120, env=ENV)
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "audit passed" in audit.stdout
    plan = read_plan(rundir / "plan.zarr")
    assert manifest["plan"]["checksum"] == plan.checksum
    ok, stored, recomputed = verify_release(rundir / "release.zarr")
    assert ok, (stored, recomputed)
    release = read_release(rundir / "release.zarr")
    assert manifest["release"]["checksum"] == stored
    assert release.attrs["complete"] is True and release.private
    assert release.attrs["plan_checksum"] == plan.checksum
    done = np.asarray(zarr.open_group(str(rundir / "release.zarr"), mode="r")["chunks/done"][...])
    assert done.shape == (release.attrs["n_chunks"],) and np.all(done == 1)
    assert release.answers.shape == (release.attrs["units"], len(plan.queries_targets))
    return manifest


def _release_arrays(path: Path) -> dict[str, np.ndarray]:
    """Every array of a release store, by its path in the store."""
    group = zarr.open_group(store=str(path), mode="r")
    return {name: array[...] for name, array in group.members(max_depth=None) if isinstance(array, zarr.Array)}


def _chunks_done(path: Path) -> np.ndarray:
    """``chunks/done`` of a release store (empty while the store does not exist yet)."""
    try:
        return np.asarray(zarr.open_group(store=str(path), mode="r")["chunks/done"][...])
    except Exception:  # noqa: BLE001 - not created yet, or being created
        return np.zeros(0, np.uint8)


def assert_same_release(path: Path, reference: Path) -> None:
    """Both releases sealed and verified, and equal bit for bit: every array and the checksum."""
    for store in (path, reference):
        ok, stored, recomputed = verify_release(store)
        assert ok, (store, stored, recomputed)
        release = read_release(store)
        assert release.attrs["complete"] is True and release.private is False  # a --seed release
        assert np.all(_chunks_done(store) == 1)
    got, expected = _release_arrays(path), _release_arrays(reference)
    assert sorted(got) == sorted(expected)
    for name, array in expected.items():
        assert got[name].dtype == array.dtype and got[name].tobytes() == array.tobytes(), name
    assert read_release(path).checksum == read_release(reference).checksum


def test_release_driver_killed_then_resumed_equals_an_uninterrupted_release(tmp_path, small_plan):
    """`distfit release PLAN --data D --out R --seed S --workers 2` on its own local cluster;
    once some but not all chunks are written the whole process group (the driver, its nannies
    and workers) is SIGKILLed. The store is left unsealed with those chunks; `--resume` with
    the same seed keeps them, draws the rest and seals a release equal, bit for bit, to an
    uninterrupted release with the same seed."""
    data, out = tmp_path / "data.zarr", tmp_path / "release.zarr"
    write_synthetic(small_plan.spec, DRIVER_CHUNK_UNITS * DRIVER_CHUNKS, data, seed=8,
                    chunk_units=DRIVER_CHUNK_UNITS, fsync=False)
    argv = _distfit("release", small_plan.plan, "--data", data, "--out", out, "--seed", SEED, "--workers", 2)
    err = tmp_path / "release.err"
    with open(err, "wb") as stderr:
        process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=stderr, env=ENV, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        done = _chunks_done(out)
        while process.poll() is None and time.monotonic() < deadline and not 0 < done.sum() < DRIVER_CHUNKS:
            time.sleep(0.02)
            done = _chunks_done(out)
        os.killpg(process.pid, signal.SIGKILL)  # the group is the release's: start_new_session
        process.wait(timeout=30)
        # every process of the group is gone before the store is read: nothing writes after this
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("processes of the killed release's group are still running")
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL, _tail(err)
    at_kill = _chunks_done(out)
    assert at_kill.shape == (DRIVER_CHUNKS,) and 0 < at_kill.sum() < DRIVER_CHUNKS, (
        f"the release was not caught part-way: {at_kill.sum()} of {DRIVER_CHUNKS} chunks\n{_tail(err)}")
    try:
        read_release(out)
    except ReleaseError:
        pass
    else:
        raise AssertionError("the killed release reads as sealed")
    written = np.flatnonzero(at_kill)
    before = _release_arrays(out)

    resumed = subprocess.run(argv + ["--resume"], capture_output=True, text=True, timeout=180, env=ENV)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{written.size} of {DRIVER_CHUNKS} chunks already written" in resumed.stderr, resumed.stderr
    assert "resumed" in resumed.stdout
    after = _release_arrays(out)
    rows = (written[:, None] * DRIVER_CHUNK_UNITS + np.arange(DRIVER_CHUNK_UNITS)).ravel()
    for name in ("queries/answers", "unit_ids"):
        assert after[name][rows].tobytes() == before[name][rows].tobytes(), name  # kept as written

    reference = tmp_path / "reference.zarr"
    run_release(small_plan.plan, data, reference, seed=SEED, placement=Placement(serial=True), fsync=False,
                log=io.StringIO())
    assert_same_release(out, reference)


def test_ctrl_c_during_a_local_cluster_run_is_one_line_then_resumes(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while `distfit run`
    releases on its local cluster: no traceback from the driver or the workers, one line saying
    what was kept, exit 130; the same command then resumes the release and seals it (without
    the estimate and report stages: 100,000 units' estimate and report are not what is under
    test, and other tests run them).
    100,000 units are 25 chunks of 4096: their release took ~5 s on 2 workers (200,000: 10.7 s
    of a 29 s run, load 4), so the poll (every 0.2 s) has seconds to see 2 to 19 chunks written."""
    out = tmp_path / "run"
    argv = _distfit("run", "--out", out, "--units", 100_000, "--workers", 2, "--no-estimate", "--no-report")
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                               start_new_session=True, preexec_fn=interruptible)
    done = np.zeros(0)
    try:
        deadline = time.time() + 240
        while time.time() < deadline and process.poll() is None:
            time.sleep(0.2)
            with contextlib.suppress(Exception):
                done = zarr.open_group(store=str(out / "release.zarr"), mode="r")["chunks/done"][...]
            if 2 <= done.sum() < done.size - 5:
                break
        os.killpg(process.pid, signal.SIGINT)
        _, err = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
    assert 2 <= done.sum() < done.size, f"the run was not caught mid-release ({done.sum()} of {done.size} chunks): {err}"
    assert process.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("distfit: error: interrupted; what was finished is kept in") and "run the same command" in last
    resumed = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "(resumed)" in resumed.stdout
    assert verify_release(out / "release.zarr")[0]
    assert read_release(out / "release.zarr").attrs["complete"] is True


# the two tests on the shared scheduler-file cluster last: it starts at the first and is torn
# down at the end of the module, right after the second


def test_run_through_a_scheduler_file(tmp_path, scheduler_cluster):
    """`distfit run --cluster SCHEDULER_FILE`: every block solve and every release chunk runs on
    the two workers of that cluster, once each; the manifest names the cluster."""
    spec = _write_spec(tmp_path)
    rundir = tmp_path / "run"
    cluster = scheduler_cluster
    client = cluster.client
    scheduler_address = client.scheduler.address
    pids = worker_pids(client)
    assert len(pids) == 2
    result = subprocess.run(
        _distfit("run", spec, "--out", rundir, "--cluster", cluster.scheduler_file, *cluster.tls, "--units", "9000"),
        capture_output=True, text=True, timeout=180, env=ENV)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.log_tails()}"
    assert f"connected to {cluster.scheduler_file} over TLS" in result.stderr
    assert "local cluster" not in result.stderr
    executed = executed_keys(client)
    assert worker_pids(client) == pids  # the same two worker processes throughout

    manifest = _check_run(rundir, cluster, scheduler_address)
    assert manifest["stages"] == {"plan": "done", "audit": "passed", "data": "synthesised",
                                  "release": "done", "estimate": "done", "report": "done"}
    plan = read_plan(rundir / "plan.zarr")
    release = read_release(rundir / "release.zarr")
    assert release.attrs["n_chunks"] == 3  # 9000 units in chunks of 4096

    assert set(executed) == set(pids)
    assert all(executed.values()), f"a worker ran nothing: {executed}"
    keys = [key for worker_keys in executed.values() for key in worker_keys]
    # a solve task is one block (label: its id) or a batch of small ones (``first+n``: n more)
    labels = [_label(k, "solve-").rsplit("+", 1) for k in keys if k.startswith("solve-")]
    assert labels and {label[0] for label in labels} <= set(plan.block_ids)
    assert sum(1 + (int(label[1]) if len(label) == 2 else 0) for label in labels) % len(plan.block_ids) == 0
    # release tasks (keys release-chunks-FIRST-RUN, a run of chunks each, or release-chunk-C-RUN,
    # one chunk each): every task ran once, on these workers, starting at chunk 0; that every
    # chunk was written is _check_run's chunks/done
    prefix = "release-chunks-" if any(k.startswith("release-chunks-") for k in keys) else "release-chunk-"
    tasks = collections.Counter(_label(k, prefix) for k in keys if k.startswith(prefix))
    assert "0" in tasks and set(tasks) <= {"0", "1", "2"} and set(tasks.values()) == {1}, tasks
    # the estimate: runs of chunks cut like the release's (estimate-chunks-FIRST-RUN), each task
    # once, on these workers, starting at chunk 0
    estimated = collections.Counter(_label(k, "estimate-chunks-") for k in keys if k.startswith("estimate-chunks-"))
    assert "0" in estimated and set(estimated) <= {"0", "1", "2"} and set(estimated.values()) == {1}, estimated
    assert read_estimate(rundir / "estimate.zarr").attrs["release_checksum"] == release.checksum


def test_seeded_release_survives_a_worker_killed_mid_release(tmp_path, small_plan, scheduler_cluster):
    """`distfit release --seed S --cluster SCHEDULER_FILE`; one worker process of that cluster is
    SIGKILLed right after the first chunk is written, while it holds chunk tasks (the scheduler
    kills it and records what it held: ``tests.faults``). Its tasks run again on the other worker
    with the same (block, chunk) noise streams, its nanny restarts it, the command exits 0, and
    the sealed release equals, bit for bit, an uninterrupted `distfit release --seed S` on the
    same cluster."""
    data = tmp_path / "data.zarr"
    # 40 chunks of 200 units: one task per chunk, most of them still to do at the kill
    write_synthetic(small_plan.spec, KILL_UNITS, data, seed=7, chunk_units=KILL_CHUNK_UNITS, fsync=False)
    reference, killed = tmp_path / "reference.zarr", tmp_path / "killed.zarr"
    cluster = scheduler_cluster
    client = cluster.client
    pids = worker_pids(client)

    def release(out: Path) -> subprocess.CompletedProcess:
        argv = _distfit("release", small_plan.plan, "--data", data, "--out", out, "--seed", SEED,
                        "--cluster", cluster.scheduler_file, *cluster.tls)
        return subprocess.run(argv, capture_output=True, text=True, timeout=180, env=ENV)

    uninterrupted = release(reference)
    assert uninterrupted.returncode == 0, f"{uninterrupted.stderr}\n{cluster.log_tails()}"
    with kill_a_worker_after_the_first(client, "release-chunk") as record:
        result = release(killed)
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.log_tails()}"
    client.wait_for_workers(2, timeout=60)
    restarted = worker_pids(client)

    assert_killed_while_in_progress(record)  # fewer chunk tasks done than the release had
    victim = record["killed"]
    assert pids[victim["address"]] == victim["pid"]  # one of the cluster's two worker processes
    assert victim["pid"] not in restarted.values() and len(restarted) == 2  # the nanny restarted it
    assert "NOT PRIVATE" in result.stdout and read_release(killed).attrs["n_chunks"] == KILL_CHUNKS
    assert_same_release(killed, reference)
