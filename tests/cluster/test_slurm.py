"""The SLURM path for real: a one-node SLURM (cluster/slurm/local-slurm.sh: munge, MariaDB,
slurmdbd, slurmctld, slurmd on this machine, the node's real CPUs and memory) runs distfit
through both ways docs/deployment.md documents, and every result is compared bit for bit with
a run outside SLURM of the same spec, data and seed.

* The batch script (cluster/slurm/distfit-run.sbatch, scheduler and workers inside the
  allocation): ``distfit plan`` and ``distfit release --seed`` each as a job; plan and release
  checksums equal a local cluster's.
* dask-jobqueue (cluster/jobqueue_run.py, ``SLURMCluster``: each worker its own SLURM job): a
  release whose worker job is cancelled with ``scancel`` mid-release finishes on the other
  worker job, equal to an uninterrupted release; over TLS with the run's certificates beside
  the scheduler file (mode 0600), the dashboard on loopback.
* A batch job that loses its worker step and then runs out of time (TIMEOUT), and a second
  submission with ``--resume`` that finishes the release, equal to an uninterrupted one.
* Worker jobs that never start: one line after ``--wait-timeout``, exit code 3, no hang.

Job states come from ``sacct`` (the accounting database). Without SLURM the tests fail, saying
how to get it, unless ``DISTFIT_SKIP_SLURM=1`` opts out (README, "Set-up"). With
``DISTFIT_SLURM_CONF`` naming a running cluster's slurm.conf (cluster/slurm/local-test.sh) they
use that cluster; otherwise they start one for the module and stop it afterwards, whatever
happened.

Time: a job's time limit is checked about every 30 s, so the out-of-time job needs a minute and
a half; it is submitted first and waits, idle, beside the other tests (the partition lets two
jobs share a core), and its ``--resume`` successor starts by itself when it ends. About 2.5
minutes on 2 quiet cores, daemons included.
"""
from __future__ import annotations

import contextlib
import io
import ipaddress
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import yaml
import zarr

from distfit.release.job import run_release
from distfit.runtime.placement import Placement
from distfit.stores.data import write_synthetic
from distfit.stores.plan import read_plan
from tests.pipeline.test_run_cluster import assert_same_release

ROOT = Path(__file__).resolve().parents[2]
LOCAL_SLURM = ROOT / "cluster" / "slurm" / "local-slurm.sh"
SBATCH_SCRIPT = ROOT / "cluster" / "slurm" / "distfit-run.sbatch"
JOBQUEUE_RUN = ROOT / "cluster" / "jobqueue_run.py"
#: Set to 1 to run the suite without SLURM (its tests then skip, saying so).
SKIP_VARIABLE = "DISTFIT_SKIP_SLURM"
#: The slurm.conf of a cluster that is already running (cluster/slurm/local-test.sh sets it).
CONF_VARIABLE = "DISTFIT_SLURM_CONF"
#: The noise seed of every compared release (``distfit release --seed``: tests only).
SEED = 20240611
#: The fault tests' data: many small chunks (release tasks), so the release stays part-way long
#: enough for a poll to catch it and act (one chunk takes tens of ms: it is written and fsynced).
CHUNK_UNITS = 100
#: States sacct reports for a job that is over.
FINAL = {"COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED"}


@dataclass(frozen=True)
class Slurm:
    """A running one-node SLURM: its slurm.conf and the environment its commands and jobs get
    (this interpreter's environment first on PATH: the jobs run its ``dask`` and ``distfit``)."""

    conf: Path
    env: dict

    def command(self, *argv, timeout: float = 60) -> str:
        result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=self.env,
                                timeout=timeout)
        assert result.returncode == 0, f"{argv}: {result.stdout}{result.stderr}"
        return result.stdout

    def sbatch(self, rundir: Path, command: str, *options: str, wait: bool = False, timeout: float = 180) -> str:
        """Submit cluster/slurm/distfit-run.sbatch (one node, 2 GB) running ``distfit COMMAND`` on
        the allocation's cluster; returns the job id (after the job ended when ``wait``)."""
        rundir.mkdir(parents=True, exist_ok=True)
        # a free scheduler port: jobs share the node (the job of out_of_time waits beside the others)
        env = dict(self.env, RUNDIR=str(rundir), COMMAND=command, SCHEDULER_PORT="0")
        argv = ["sbatch", "--parsable", "--nodes=1", "--ntasks-per-node=1", "--mem=2G",
                f"--output={rundir}/slurm-%j.out", *options] + (["--wait"] if wait else []) + [str(SBATCH_SCRIPT)]
        result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
        job = result.stdout.strip().split(";")[0]
        assert job.isdigit(), f"sbatch: {result.stdout}{result.stderr}"
        return job

    def sacct(self, *jobs: str) -> dict[str, tuple[str, str]]:
        """Job or step id -> (name, state) for the jobs and their steps, from the accounting
        database ("CANCELLED by 0" read as CANCELLED)."""
        out = self.command("sacct", "-n", "-P", "-o", "JobID,JobName,State", "-j", ",".join(jobs))
        rows = (line.split("|") for line in out.splitlines() if line.strip())
        return {job: (name, state.split()[0]) for job, name, state in rows}

    def wait_final(self, *jobs: str, timeout: float = 180) -> dict[str, tuple[str, str]]:
        """sacct's record once every job in ``jobs`` is over (the controller sends it to
        slurmdbd as the job ends: polled until it arrives)."""
        deadline = time.monotonic() + timeout
        while True:
            states = self.sacct(*jobs)
            if all(states.get(job, ("", ""))[1] in FINAL for job in jobs) or time.monotonic() > deadline:
                return states
            time.sleep(0.5)


@pytest.fixture(scope="module")
def slurm():
    """The SLURM of the tests: the running one named by DISTFIT_SLURM_CONF, else one started
    now with cluster/slurm/local-slurm.sh and stopped after this module's tests, whatever
    happened."""
    if os.environ.get(SKIP_VARIABLE) == "1":
        pytest.skip(f"{SKIP_VARIABLE}=1: the SLURM tests are opted out")
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""),
               OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    given = os.environ.get(CONF_VARIABLE)
    if given:
        env["SLURM_CONF"] = given
        yield Slurm(Path(given), env)
        return
    missing = [tool for tool in ("slurmctld", "slurmd", "slurmdbd", "sbatch", "sacct", "munged", "mariadbd")
               if shutil.which(tool, path=env["PATH"] + os.pathsep + "/usr/sbin:/sbin") is None]
    if missing:
        pytest.fail(f"SLURM is not installed ({', '.join(missing)} missing): install it with "
                    f"`bash {LOCAL_SLURM.relative_to(ROOT)} install` (root; .ci/run does), or set "
                    f"{SKIP_VARIABLE}=1 to run the suite without the SLURM tests", pytrace=False)
    if os.geteuid() != 0:
        pytest.fail(f"the SLURM tests start slurmd and need root; run them as root or set {SKIP_VARIABLE}=1",
                    pytrace=False)
    # a short path of its own (the socket paths live in it), private to root
    directory = Path(tempfile.mkdtemp(prefix="distfit-slurm-"))
    try:
        started = subprocess.run(["bash", str(LOCAL_SLURM), "start", str(directory)], capture_output=True,
                                 text=True, env=env, timeout=300)
        if started.returncode != 0:
            logs = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}"
                             for p in sorted((directory / "log").glob("*.log")))
            pytest.fail(f"local-slurm.sh start failed:\n{started.stdout}{started.stderr}\n{logs}", pytrace=False)
        env["SLURM_CONF"] = str(directory / "slurm.conf")
        yield Slurm(directory / "slurm.conf", env)
    finally:
        subprocess.run(["bash", str(LOCAL_SLURM), "stop", str(directory)], env=env, timeout=300)
        shutil.rmtree(directory, ignore_errors=True)


def distfit(*argv) -> list[str]:
    return [sys.executable, "-m", "distfit.cli", *map(str, argv)]


def run_ok(argv: list[str], env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    result = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=timeout)
    assert result.returncode == 0, f"{argv}\n{result.stdout}\n{result.stderr}"
    return result


def chunks_done(path: Path) -> np.ndarray:
    """``chunks/done`` of a release store (empty while the store does not exist yet)."""
    try:
        return np.asarray(zarr.open_group(store=str(path), mode="r")["chunks/done"][...])
    except Exception:  # noqa: BLE001 - not created yet, or being created
        return np.zeros(0, np.uint8)


def reference_release(plan: str, data: Path, out: Path) -> Path:
    """An uninterrupted release of the same plan, data and seed, outside SLURM (in-process)."""
    run_release(plan, str(data), str(out), seed=SEED, placement=Placement(serial=True), fsync=False,
                log=io.StringIO())
    return out


def jobqueue_config(path: Path, rundir: Path, cores: int = 1) -> Path:
    """cluster/slurm/jobqueue.yaml made to fit this one node: ``cores`` single-threaded worker
    processes a job, the partition ``local``, the environment of the submitting process (sbatch
    exports it) rather than a virtualenv prologue."""
    config = yaml.safe_load((ROOT / "cluster" / "slurm" / "jobqueue.yaml").read_text())
    section = config["jobqueue"]["slurm"]
    section.update({"cores": cores, "processes": cores, "memory": "1GB", "walltime": "00:10:00", "queue": "local",
                    "local-directory": str(rundir / "worker-space"), "log-directory": str(rundir / "dask-logs"),
                    "job-script-prologue": [], "job-extra-directives": []})
    path.write_text(yaml.safe_dump(config))
    return path


def listening(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on, IPv4 and IPv6 (from /proc:
    the kernel's table, addresses in host byte order per 32-bit word)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                    address, port = fields[1].split(":")
                    raw = b"".join(bytes.fromhex(address[i:i + 8])[::-1] for i in range(0, len(address), 8))
                    found.add((str(ipaddress.ip_address(raw)), int(port, 16)))
    return found


def cmdline(pid: int) -> list[bytes]:
    """The argv of process ``pid`` (empty once it is gone)."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


def processes_naming(word: str) -> list[int]:
    """The processes with ``word`` among their arguments."""
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and word.encode() in cmdline(int(p.name))]


@dataclass(frozen=True)
class OutOfTime:
    """The batch release job of :func:`out_of_time`, caught mid-release."""

    job: str
    resumed: str
    rundir: Path
    release: Path
    chunks: int
    done_at_cancel: int
    tls_modes: dict
    scheduler_sockets: set  # (address, port) the job's scheduler listened on
    scheduler_log: str  # what it had logged by then
    reference: Path


@pytest.fixture(scope="module", autouse=True)
def out_of_time(slurm, tmp_path_factory, small_plan) -> OutOfTime:
    """A batch release job (one core, a 1-minute limit) submitted before the module's tests:
    once some chunks are written its worker step is cancelled (``scancel JOB.0``: a worker node
    lost), and the job waits, idle, for its time limit while the other tests run (a time limit
    is checked about every 30 s: a minute and a half of waiting that would otherwise add to
    the module's time). A second job, ``--resume``, is submitted to start when the first has
    ended (``--dependency=afterany``); the last test checks both."""
    chunks = 300
    tmp = tmp_path_factory.mktemp("out-of-time")
    data, rundir = tmp / "data.zarr", tmp / "batch"
    write_synthetic(small_plan.spec, chunks * CHUNK_UNITS, data, seed=9, chunk_units=CHUNK_UNITS, fsync=False)
    release = rundir / "release.zarr"
    command = f"release {small_plan.plan} --data {data} --out {release} --seed {SEED}"
    job = slurm.sbatch(rundir, command, "--cpus-per-task=1", "--time=1")
    reference = reference_release(small_plan.plan, data, tmp / "reference.zarr")
    deadline = time.monotonic() + 120
    done = chunks_done(release)
    while time.monotonic() < deadline and not 0 < done.sum() < chunks:
        time.sleep(0.05)
        done = chunks_done(release)
    tls = rundir / f".tls-{job}"
    modes = {p.name: p.stat().st_mode & 0o777 for p in [tls, *tls.iterdir()]} if tls.is_dir() else {}
    schedulers = [pid for pid in processes_naming(str(rundir / "scheduler.json")) if b"scheduler" in cmdline(pid)[:3]]
    sockets = listening(schedulers[0]) if len(schedulers) == 1 else set()
    log = (rundir / "scheduler.log").read_text()
    slurm.command("scancel", f"{job}.0")
    resumed = slurm.sbatch(rundir, command + " --resume", "--cpus-per-task=2", f"--dependency=afterany:{job}")
    return OutOfTime(job, resumed, rundir, release, chunks, int(done.sum()), modes, sockets, log, reference)


def test_batch_script_plans_and_releases_like_a_local_cluster(slurm, tmp_path):
    """The PL94 pipeline through cluster/slurm/distfit-run.sbatch: a plan job, then a release job
    (--seed) on its plan; both COMPLETED in sacct with their worker step (``srun dask worker``),
    connected over TLS to the scheduler of their own allocation; plan and release checksums, and
    every array of the release, equal to `distfit plan`/`distfit release` on a local cluster."""
    spec = ROOT / "pipelines" / "pl94.yaml"
    data, local, batch = tmp_path / "data.zarr", tmp_path / "local", tmp_path / "batch"
    run_ok(distfit("synth", spec, "--units", 6000, "--seed", 7, "--out", data), slurm.env)
    plan_job = slurm.sbatch(batch / "plan", f"plan {spec} --out {batch}/plan.zarr", "--cpus-per-task=2")
    # a release records its plan's path (its checksum covers it): both releases use the job's plan
    release_job = slurm.sbatch(batch / "release", f"release {batch}/plan.zarr --data {data} --out "
                               f"{batch}/release.zarr --seed {SEED}", "--cpus-per-task=2",
                               f"--dependency=afterok:{plan_job}")
    # meanwhile, outside SLURM: the reference plan on a local cluster, then the reference release
    run_ok(distfit("plan", spec, "--out", local / "plan.zarr", "--workers", 2), slurm.env)
    assert slurm.wait_final(plan_job)[plan_job][1] == "COMPLETED"
    assert read_plan(batch / "plan.zarr").checksum == read_plan(local / "plan.zarr").checksum
    run_ok(distfit("release", batch / "plan.zarr", "--data", data, "--out", local / "release.zarr",
                   "--seed", SEED, "--workers", 2), slurm.env)

    states = slurm.wait_final(plan_job, release_job)
    logs = "\n".join(p.read_text() for p in sorted(batch.rglob("slurm-*.out")))
    for job in (plan_job, release_job):
        assert states[job][1] == "COMPLETED", f"{states}\n{logs}"
        assert states[f"{job}.0"][0] == "dask", states  # srun's worker step ran inside the job
        out = (batch / ("plan" if job == plan_job else "release") / f"slurm-{job}.out").read_text()
        assert "over TLS" in out and "/scheduler.json" in out, out
    for part in ("plan", "release"):
        log = (batch / part / "scheduler.log").read_text()
        assert re.search(r"Scheduler at: +tls://", log), log
        assert not list((batch / part).glob(".tls-*")), "the job's certificate outlived the job"
    assert_same_release(batch / "release.zarr", local / "release.zarr")


class HeldChunk:
    """One chunk of a histograms store held back by construction: its ``counts`` chunk file is
    replaced by a FIFO (named pipe) after the reference release has read the real file, so the
    worker task that reads it blocks in ``open`` until :meth:`let_go` writes the file's bytes
    into the pipe. Until then that chunk cannot be released, whichever worker runs it: the
    release is mid-way by construction, not by timing. The bytes are the file's own, so the
    store's per-chunk digest still holds."""

    def __init__(self, data: Path, chunk: int) -> None:
        self.path = data / "counts" / "c" / str(chunk) / "0"
        self.content = self.path.read_bytes()
        self.path.unlink()
        os.mkfifo(self.path)
        self.given = threading.Event()

    def let_go(self) -> threading.Thread:
        """Give the bytes to the next reader (in a thread: opening a FIFO to write blocks until a
        reader opens it, i.e. until a worker runs the chunk's task again)."""
        def give() -> None:
            with open(self.path, "wb") as pipe:
                pipe.write(self.content)
            self.given.set()
        thread = threading.Thread(target=give, daemon=True)
        thread.start()
        return thread

    def unblock(self) -> None:
        """If :meth:`let_go`'s writer still waits for a reader (the run failed), open the pipe to
        read once so the thread ends."""
        if not self.given.is_set():
            with contextlib.suppress(OSError):
                os.close(os.open(self.path, os.O_RDONLY | os.O_NONBLOCK))


def test_release_survives_a_worker_job_cancelled_mid_release(slurm, tmp_path, small_plan):
    """cluster/jobqueue_run.py with two SLURMCluster worker jobs runs `distfit release --seed`
    while one data chunk is held back (:class:`HeldChunk`): once other chunks are written one
    worker job is cancelled (``scancel``); after SLURM records it over, the held chunk is let go.
    The release finishes on the other job and equals, bit for bit, an uninterrupted release;
    sacct shows the cancelled job CANCELLED. Meanwhile the cluster speaks TLS with the run's
    certificates beside the scheduler file (directory 0700, files 0600) and the scheduler's
    dashboard listens on loopback only."""
    chunks = 60
    data, out = tmp_path / "data.zarr", tmp_path / "run"
    write_synthetic(small_plan.spec, chunks * CHUNK_UNITS, data, seed=8, chunk_units=CHUNK_UNITS, fsync=False)
    reference = reference_release(small_plan.plan, data, tmp_path / "reference.zarr")
    held = HeldChunk(data, chunk=3)
    config = jobqueue_config(tmp_path / "jobqueue.yaml", out)
    release = out / "release.zarr"
    argv = [sys.executable, JOBQUEUE_RUN, "--out", out, "--system", "slurm", "--config", config, "--jobs", 2,
            "--wait-workers", 2, "--wait-timeout", 120,
            "--command", f"release {small_plan.plan} --data {data} --out {release} --seed {SEED}"]
    err = tmp_path / "jobqueue_run.err"
    with open(err, "w") as stderr:
        driver = subprocess.Popen([str(a) for a in argv], stdout=subprocess.PIPE, stderr=stderr, text=True,
                                  env=slurm.env, start_new_session=True)
    try:
        deadline = time.monotonic() + 150  # a bound for a broken run, not a window to hit
        done, sockets, tls_modes = chunks_done(release), set(), {}
        while driver.poll() is None and time.monotonic() < deadline and not done.sum():
            if not sockets:  # the scheduler (in the driver's process) is up once its file is there
                if (out / "scheduler.json").exists():
                    sockets = listening(driver.pid)
                    tls = out / ".dask-tls"
                    tls_modes = {p.name: p.stat().st_mode & 0o777 for p in [tls, *tls.iterdir()]}
            time.sleep(0.05)
            done = chunks_done(release)
        jobs = slurm.command("squeue", "-h", "-n", "distfit-worker", "-t", "RUNNING", "-o", "%i").split()
        assert 0 < done.sum() and not done[3], f"chunks written before the cancel: {done}\n{err.read_text()}"
        assert len(jobs) == 2, jobs
        victim, survivor = jobs
        slurm.command("scancel", victim)
        # the held bytes go to a live worker only: a reader killed after taking them would lose them
        assert slurm.wait_final(victim)[victim][1] in FINAL
        held.let_go()
        stdout, _ = driver.communicate(timeout=240)
    finally:
        held.unblock()
        if driver.poll() is None:
            os.killpg(driver.pid, 9)
            driver.wait(timeout=30)
    assert driver.returncode == 0, f"{stdout}\n{err.read_text()}"
    assert held.given.is_set()  # the held chunk was read through the pipe, after the cancel
    states = slurm.wait_final(victim, survivor)
    assert states[victim] == ("distfit-worker", "CANCELLED"), states
    # the other job ran to the end of the release; the cluster's close then cancels it too
    assert states[survivor][1] in ("CANCELLED", "COMPLETED"), states
    worker_log = (out / "dask-logs" / f"distfit-worker-{survivor}.err").read_text()
    assert "Registered to:" in worker_log and "tls://" in worker_log, worker_log
    assert_same_release(release, reference)

    # TLS and loopback
    assert tls_modes.pop(".dask-tls") == 0o700 and tls_modes, tls_modes
    assert set(tls_modes.values()) == {0o600}, tls_modes
    # the dashboard on loopback (8787, or a free port when another job's scheduler holds 8787)
    dashboard = int(err.read_text().split("; dashboard http://", 1)[1].split("/", 1)[0].rsplit(":", 1)[1])
    assert ("127.0.0.1", dashboard) in sockets, (dashboard, sockets)
    assert all(address in ("127.0.0.1", "::1", "0.0.0.0", "::") for address, _ in sockets), sockets
    assert not any(port == dashboard and address != "127.0.0.1" for address, port in sockets), sockets


def test_worker_jobs_that_never_start_end_in_one_line(slurm, tmp_path, small_plan):
    """Worker jobs asking for more cores than the partition has stay pending; jobqueue_run.py
    gives up after --wait-timeout with one line naming the jobs and their state, exit code 3,
    and the pending job is cancelled as the cluster closes."""
    out = tmp_path / "run"
    config = jobqueue_config(tmp_path / "jobqueue.yaml", out, cores=(os.cpu_count() or 1) * 32)
    argv = [sys.executable, JOBQUEUE_RUN, "--out", out, "--system", "slurm", "--config", config, "--jobs", 1,
            "--wait-timeout", 8, "--command", f"release {small_plan.plan} --data x --out {out}/r.zarr"]
    result = subprocess.run([str(a) for a in argv], capture_output=True, text=True, env=slurm.env, timeout=120)
    assert result.returncode == 3, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower()]
    assert len(errors) == 1, result.stderr
    line = result.stderr.strip().splitlines()[-1]
    assert line == errors[0] and line.startswith("jobqueue_run.py: error: 0 of 1 workers joined within 8 s"), line
    job, state = line.rsplit("worker jobs: ", 1)[1].split()[:2]
    assert state == "PENDING", line
    assert slurm.wait_final(job)[job][1] == "CANCELLED"
    assert not (out / "r.zarr").exists()


def test_job_out_of_time_then_resumed_equals_an_uninterrupted_release(slurm, out_of_time):
    """The jobs of :func:`out_of_time`: the first, caught mid-release, its worker step cancelled,
    ran out of time (sacct: TIMEOUT, the step CANCELLED) and left the chunks written so far; the
    second, ``--resume``, found the release unsealed with those chunks, kept them, drew the rest
    and sealed a release equal, bit for bit, to an uninterrupted one. While the first job ran
    its certificate sat beside the scheduler file, readable by the user only (it is gone after
    the job), and its scheduler listened over TLS on every interface, its dashboard on loopback
    only."""
    job, resumed, rundir, chunks = out_of_time.job, out_of_time.resumed, out_of_time.rundir, out_of_time.chunks
    assert 0 < out_of_time.done_at_cancel < chunks, f"not caught mid-release: {out_of_time.done_at_cancel} of {chunks}"
    states = slurm.wait_final(job, resumed, timeout=240)
    first, second = ((rundir / f"slurm-{j}.out").read_text() for j in (job, resumed))
    assert states[job][1] == "TIMEOUT", f"{states}\n{first}"
    assert states[f"{job}.0"] == ("dask", "CANCELLED"), states
    assert states[resumed][1] == "COMPLETED", f"{states}\n{second}"
    # what the first job left: more chunks than at the cancel (those in flight may land), not all
    written = int(second.split(f" of {chunks} chunks already written")[0].rsplit(None, 1)[-1])
    assert out_of_time.done_at_cancel <= written < chunks, second
    assert "resumed" in second, second
    tls = rundir / f".tls-{job}"
    assert out_of_time.tls_modes == {tls.name: 0o700, "cert.pem": 0o600, "key.pem": 0o600}, out_of_time.tls_modes
    assert not tls.exists() and not (rundir / f".tls-{resumed}").exists()
    # the job's scheduler (`dask scheduler` in the batch step): TLS on every interface, its
    # dashboard (8787, or a free port when another job's scheduler holds it) on loopback only
    sockets, log = out_of_time.scheduler_sockets, out_of_time.scheduler_log
    port = int(re.search(r"Scheduler at: +tls://[^:]+:(\d+)", log).group(1))
    dashboard = int(re.search(r"dashboard at: +http://[^:]+:(\d+)/", log).group(1))
    assert {address for address, p in sockets if p == port} & {"0.0.0.0", "::"}, (port, sockets)
    assert {address for address, p in sockets if p == dashboard} == {"127.0.0.1"}, (dashboard, sockets)
    assert_same_release(out_of_time.release, out_of_time.reference)
