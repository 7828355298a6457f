"""`distfit run` end to end on a real Dask cluster started from the dask command line.

A scheduler and two workers are started as separate processes on loopback (``dask scheduler
--scheduler-file F`` and ``dask worker --scheduler-file F``, the way cluster/README.md and the
batch scripts start them), and ``distfit run ... --cluster F`` runs as its own process, so the
whole path is exercised: the console entry point, the scheduler file, task shipping to worker
processes, Zarr stores written by the workers and sealed by the driver. The second test kills a
worker process (SIGKILL) while the release is running; its nanny restarts it and the run must
still finish with a plan that passes audit and a sealed release in which every chunk is written.
"""
from __future__ import annotations

import collections
import contextlib
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
import yaml
import zarr

from distfit.stores.data import write_synthetic
from distfit.stores.release import read_release, verify_release
from distfit.spec.parse import load_spec
from distfit.stores.plan import read_plan
from tests.reference import SMALL_SPEC

#: The cluster's processes: a long scheduler/worker transition log (the tests read it back to
#: see where the tasks ran), one BLAS thread per process on this small machine.
ENV = dict(os.environ, DASK_DISTRIBUTED__ADMIN__LOW_LEVEL_LOG_LENGTH="100000",
           OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")

#: The fault test's data: KILL_CHUNKS chunks (release tasks) of KILL_CHUNK_UNITS units.
KILL_CHUNK_UNITS, KILL_CHUNKS = 200, 40
KILL_UNITS = KILL_CHUNK_UNITS * KILL_CHUNKS


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

    def log_tails(self) -> str:
        return "\n".join(f"--- {p.name}\n{_tail(p)}" for p in sorted(self.logs.glob("*.log")))


@contextlib.contextmanager
def dask_cluster(tmp_path: Path, workers: int = 2):
    """A scheduler and ``workers`` single-threaded workers (each behind a nanny) on loopback,
    found through a scheduler file; yields a :class:`Cluster` with a connected client and tears
    every process down afterwards, whatever happened."""
    from distributed import Client

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
            "--scheduler-file", str(scheduler_file), "--host", "127.0.0.1", "--port", "0",
            "--dashboard-address", ":0"], "scheduler")
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
                "--nanny", "--no-dashboard", "--name", f"worker-{i}"], f"worker-{i}")
        with Client(scheduler_file=str(scheduler_file), timeout=30) as client:
            cluster = Cluster(scheduler_file, client, logs)
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


def scheduler_transitions(client, prefix: str) -> list[tuple[str, str, str]]:
    """``(key, start, finish)`` of every scheduler transition of a key starting with ``prefix``."""
    def transitions(dask_scheduler):
        return [(str(entry[0]), entry[1], entry[2]) for entry in dask_scheduler.transition_log
                if str(entry[0]).startswith(prefix)]
    return client.run_on_scheduler(transitions)


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


def test_run_through_a_scheduler_file(tmp_path):
    """`distfit run --cluster SCHEDULER_FILE`: every block solve and every release chunk runs on
    the two workers of that cluster, once each; the manifest names the cluster."""
    spec = _write_spec(tmp_path)
    rundir = tmp_path / "run"
    with dask_cluster(tmp_path) as cluster:
        client = cluster.client
        scheduler_address = client.scheduler.address
        pids = worker_pids(client)
        assert len(pids) == 2
        result = subprocess.run(
            _distfit("run", spec, "--out", rundir, "--cluster", cluster.scheduler_file, "--units", "9000"),
            capture_output=True, text=True, timeout=180, env=ENV)
        assert result.returncode == 0, f"{result.stdout}\n{result.stderr}\n{cluster.log_tails()}"
        assert f"connected to {cluster.scheduler_file}" in result.stderr
        assert "local cluster" not in result.stderr
        executed = executed_keys(client)
        assert worker_pids(client) == pids  # the same two worker processes throughout

    manifest = _check_run(rundir, cluster, scheduler_address)
    assert manifest["stages"] == {"plan": "done", "audit": "passed", "data": "synthesised",
                                  "release": "done", "report": "done"}
    plan = read_plan(rundir / "plan.zarr")
    release = read_release(rundir / "release.zarr")
    assert release.attrs["n_chunks"] == 3  # 9000 units in chunks of 4096

    assert set(executed) == set(pids)
    assert all(executed.values()), f"a worker ran nothing: {executed}"
    keys = [key for worker_keys in executed.values() for key in worker_keys]
    solved = {_label(k, "solve-") for k in keys if k.startswith("solve-")}
    assert solved == set(plan.block_ids)
    chunks = collections.Counter(_label(k, "release-chunk-") for k in keys if k.startswith("release-chunk-"))
    assert chunks == {str(c): 1 for c in range(3)}  # each chunk released once, on these workers


def test_run_survives_a_worker_killed_during_the_release(tmp_path):
    """SIGKILL one worker process while it holds release tasks: its tasks are rescheduled (the
    nanny restarts the worker), the run exits 0, and the plan and the sealed release verify with
    every chunk written."""
    spec = _write_spec(tmp_path)
    data = tmp_path / "data.zarr"
    # 40 chunks of 200 units: one task per chunk, so the release takes a few seconds and the
    # worker is killed with most of it still to do
    write_synthetic(load_spec(spec), KILL_UNITS, data, seed=7, chunk_units=KILL_CHUNK_UNITS, fsync=False)
    rundir = tmp_path / "run"
    out, err = tmp_path / "run.out", tmp_path / "run.err"
    with dask_cluster(tmp_path) as cluster:
        client = cluster.client
        scheduler_address = client.scheduler.address
        pids = worker_pids(client)
        with open(out, "wb") as stdout, open(err, "wb") as stderr:
            run = subprocess.Popen(
                _distfit("run", spec, "--out", rundir, "--cluster", cluster.scheduler_file, "--data", data),
                stdout=stdout, stderr=stderr, env=ENV, start_new_session=True)
        try:
            victim = None
            deadline = time.monotonic() + 120
            while victim is None and run.poll() is None and time.monotonic() < deadline:
                for worker, keys in client.processing().items():
                    if any(str(key).startswith("release-chunk-") for key in keys) and worker in pids:
                        victim = worker
                        break
                else:
                    time.sleep(0.02)
            assert victim is not None, (
                f"no release task was seen on a worker (run exit {run.poll()}):\n{_tail(err)}")
            os.kill(pids[victim], signal.SIGKILL)
            done_at_kill = int(np.asarray(
                zarr.open_group(str(rundir / "release.zarr"), mode="r")["chunks/done"][...]).sum())
            code = run.wait(timeout=180)
        finally:
            _stop(run)
        assert code == 0, f"{_tail(out)}\n{_tail(err)}\n{cluster.log_tails()}"
        client.wait_for_workers(2, timeout=60)
        restarted = worker_pids(client)
        transitions = scheduler_transitions(client, "release-chunk-")

    assert done_at_kill < KILL_CHUNKS, "the release had finished before the worker was killed"
    assert pids[victim] not in restarted.values() and len(restarted) == 2  # the nanny restarted it
    # the tasks the killed worker held were released by the scheduler and then run elsewhere
    lost = {key for key, start, finish in transitions if (start, finish) == ("processing", "released")}
    assert lost, "no release task was lost with the killed worker"
    finished = {key for key, start, finish in transitions if (start, finish) == ("processing", "memory")}
    assert lost <= finished
    assert {_label(k, "release-chunk-") for k in finished} == {str(c) for c in range(KILL_CHUNKS)}

    manifest = _check_run(rundir, cluster, scheduler_address)
    assert manifest["stages"]["release"] == "done" and manifest["stages"]["data"] == "given"
    assert manifest["data"]["units"] == KILL_UNITS
    assert read_release(rundir / "release.zarr").attrs["n_chunks"] == KILL_CHUNKS


def test_ctrl_c_during_a_local_cluster_run_is_one_line_then_resumes(tmp_path):
    """Ctrl-C (SIGINT to the whole process group, as a terminal sends it) while `distfit run`
    releases on its local cluster: no traceback from the driver or the workers, one line saying
    what was kept, exit 130; the same command then resumes the release and seals it."""
    out = tmp_path / "run"
    argv = _distfit("run", "--out", out, "--units", 200_000, "--workers", 2)
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV,
                               start_new_session=True)
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
