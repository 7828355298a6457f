"""The cluster/ recipes: YAML parses, batch scripts pass ``bash -n`` and wire scheduler file,
workers and ``distfit run --cluster`` together, the DaskJob runs distfit against the operator's
scheduler, and cluster/jobqueue_run.py fails clearly without dask-jobqueue. Every recipe
speaks TLS and keeps dashboards on loopback (docs/deployment.md): the scripts' dask and distfit
commands carry the certificate flags, the DaskJob's commands do once its shell has run them,
and jobqueue_run.py's certificate gets the driver into a real TLS cluster."""
from __future__ import annotations

import importlib.util
import os
import py_compile
import shlex
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "cluster"
SCRIPTS = [CLUSTER / "slurm" / "distfit-run.sbatch", CLUSTER / "pbs" / "distfit-run.pbs"]
#: The batch scripts' per-job certificate: one self-signed certificate, the cluster's CA and every
#: member's certificate at once, as Dask's Security.temporary() makes it. tests/runtime/test_cluster.py
#: starts a TLS cluster with it (test_plan_through_a_scheduler_file).
OPENSSL_CERTIFICATE = ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "30",
                       "-subj", "/CN=distfit-dask"]


def yaml_files():
    return sorted(p for p in CLUSTER.rglob("*") if p.suffix in (".yaml", ".yml"))


def test_cluster_layout():
    for name in ("README.md", "jobqueue_run.py", "slurm/jobqueue.yaml", "pbs/jobqueue.yaml",
                 "kubernetes/daskjob.yaml", "slurm/distfit-run.sbatch", "pbs/distfit-run.pbs"):
        assert (CLUSTER / name).is_file(), name


@pytest.mark.parametrize("path", yaml_files(), ids=lambda p: str(p.relative_to(CLUSTER)))
def test_yaml_parses(path):
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs


@pytest.mark.parametrize("system,cls_key", [("slurm", "slurm"), ("pbs", "pbs")])
def test_jobqueue_config(system, cls_key):
    config = yaml.safe_load((CLUSTER / system / "jobqueue.yaml").read_text())
    section = config["jobqueue"][cls_key]
    for key in ("cores", "memory", "processes", "walltime", "job-extra-directives"):
        assert key in section, key
    assert section["cores"] == section["processes"]      # one thread per worker process


def _command_text(container):
    return " ".join(str(part) for part in (container.get("command") or []) + (container.get("args") or []))


def test_daskjob_manifest():
    docs = [d for d in yaml.safe_load_all((CLUSTER / "kubernetes" / "daskjob.yaml").read_text()) if d]
    jobs = [d for d in docs if d.get("kind") == "DaskJob"]
    assert len(jobs) == 1
    job = jobs[0]
    assert job["apiVersion"] == "kubernetes.dask.org/v1"

    job_pod = job["spec"]["job"]["spec"]
    (container,) = job_pod["containers"]
    text = _command_text(container)
    assert "distfit run" in text and "--cluster" in text and "DASK_SCHEDULER_ADDRESS" in text
    assert "--out /data/runs/" in text and "/specs/pipeline.yaml" in text

    worker = job["spec"]["cluster"]["spec"]["worker"]
    assert worker["replicas"] >= 1
    (wcontainer,) = worker["spec"]["containers"]
    wtext = _command_text(wcontainer)
    assert "dask worker" in wtext and "--nthreads 1" in wtext

    # /data is the same PVC on the scheduler, the workers and the job.
    claims = {d["metadata"]["name"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    pods = [job_pod, worker["spec"], job["spec"]["cluster"]["spec"]["scheduler"]["spec"]]
    for pod in pods:
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for c in pod["containers"] for m in c.get("volumeMounts", [])}
        assert volumes[mounts["/data"]]["persistentVolumeClaim"]["claimName"] in claims

    # The spec ConfigMap is mounted at /specs and holds a valid distfit spec.
    (configmap,) = [d for d in docs if d["kind"] == "ConfigMap"]
    spec_volume = {v["name"]: v for v in job_pod["volumes"]}[
        {m["mountPath"]: m["name"] for m in container["volumeMounts"]}["/specs"]]
    assert spec_volume["configMap"]["name"] == configmap["metadata"]["name"]
    spec = yaml.safe_load(configmap["data"]["pipeline.yaml"])
    assert spec["name"] and spec["queries"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_batch_script_syntax(path):
    result = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash not available")
@pytest.mark.parametrize("name", ["local-slurm.sh", "local-test.sh"])
def test_local_slurm_scripts_syntax(name):
    """The one-node SLURM's scripts parse (tests/cluster/test_slurm.py runs them)."""
    result = subprocess.run(["bash", "-n", str(CLUSTER / "slurm" / name)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_batch_script_wiring(path):
    text = path.read_text()
    header = "#SBATCH" if path.suffix == ".sbatch" else "#PBS"
    assert header in text
    assert 'dask scheduler --protocol tls "${tls_args[@]}" --scheduler-file "$SCHED_FILE"' in text
    # two jobs sharing a node: SCHEDULER_PORT=0 lets the second take a free port, and a
    # scheduler that fails to start ends the wait at once instead of after two minutes
    assert '--port "${SCHEDULER_PORT:-8786}"' in text and "SCHEDULER_PORT  the scheduler's port" in text
    assert 'kill -0 "${pids[0]}" 2>/dev/null || break' in text
    assert "dask worker" in text and "--nthreads 1" in text
    assert 'SCHED_FILE="$RUNDIR/scheduler.json"' in text
    assert "distfit run" in text and '--cluster "$SCHED_FILE"' in text
    assert "trap cleanup EXIT" in text


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_batch_scripts_speak_tls_and_keep_dashboards_on_loopback(path):
    """The scheduler listens over TLS with the job's certificate (made with OPENSSL_CERTIFICATE
    unless given), its dashboard on loopback; workers and the driver show the same certificate;
    workers start no dashboard and keep their HTTP servers on loopback; nothing speaks tcp://."""
    text = path.read_text()
    assert " ".join(OPENSSL_CERTIFICATE[:-2]) + ' -subj "/CN=distfit-dask"' in text
    assert "umask 077" in text and 'rm -rf "$TLS_DIR"' in text  # readable by you only, removed at the end
    scheduler = text[text.index("dask scheduler"):text.index(">\"$RUNDIR/scheduler.log\"")]
    assert '--protocol tls "${tls_args[@]}"' in scheduler and "--dashboard-address 127.0.0.1:8787" in scheduler
    assert 'tls_args=(--tls-ca-file "${TLS_CA_FILE' in text and '--tls-cert "$TLS_CERT"' in text
    assert '--tls-key "${TLS_KEY' in text
    worker = "--no-dashboard --dashboard-address 127.0.0.1:0"
    if path.suffix == ".sbatch":
        assert 'worker_args=(--scheduler-file "$SCHED_FILE" "${tls_args[@]}" ' + worker in text
    else:
        assert "--tls-ca-file '$TLS_CA_FILE' --tls-cert '$TLS_CERT' --tls-key '$TLS_KEY' " + worker in text
        assert "dask worker --scheduler-file '$SCHED_FILE' $WORKER_TLS" in text
    assert 'run_args+=(--out "$RUNDIR" --cluster "$SCHED_FILE" "${tls_args[@]}")' in text
    assert "tcp://" not in text and "--insecure" not in text and "--dashboard-address :" not in text


def _daskjob():
    docs = [d for d in yaml.safe_load_all((CLUSTER / "kubernetes" / "daskjob.yaml").read_text()) if d]
    (job,) = [d for d in docs if d.get("kind") == "DaskJob"]
    return job


def _shell_words(container, env: dict[str, str]) -> list[str]:
    """The argv a ``sh -c`` container runs, its first two words (the command) kept, the shell's
    expansions done (``printf`` in place of the command)."""
    assert container["command"] == ["sh", "-c"]
    (script,) = container["args"]
    words = shlex.split(script)
    skip = 3 if words[0] == "exec" else 2
    command = " ".join(words[:skip])
    printed = subprocess.run(["sh", "-c", "printf '%s\\n' " + script.split(command, 1)[1]], capture_output=True,
                             text=True, check=True, env=dict(os.environ, **env))
    return words[:skip] + printed.stdout.splitlines()


@pytest.mark.skipif(shutil.which("sh") is None, reason="sh not available")
def test_daskjob_speaks_tls_and_keeps_dashboards_in_the_pods():
    job = _daskjob()
    operator = {"DASK_SCHEDULER_ADDRESS": "tcp://distfit-run-scheduler.ns.svc.cluster.local:8786",
                "DASK_WORKER_NAME": "distfit-run-default-worker-0"}
    tls_address = "tls://distfit-run-scheduler.ns.svc.cluster.local:8786"
    flags = ["--tls-ca-file", "/tls/ca.pem", "--tls-cert", "/tls/cert.pem", "--tls-key", "/tls/key.pem"]

    def contains(argv, part):
        return any(argv[i:i + len(part)] == part for i in range(len(argv)))

    (runner,) = job["spec"]["job"]["spec"]["containers"]
    argv = _shell_words(runner, operator)
    assert argv[:2] == ["distfit", "run"] and contains(argv, ["--cluster", tls_address]) and contains(argv, flags)
    worker_spec = job["spec"]["cluster"]["spec"]["worker"]["spec"]
    (worker,) = worker_spec["containers"]
    argv = _shell_words(worker, operator)
    assert argv[:3] == ["exec", "dask", "worker"] and argv[3] == tls_address and contains(argv, flags)
    assert contains(argv, ["--no-dashboard", "--dashboard-address", "127.0.0.1:0"])
    assert contains(argv, ["--name", operator["DASK_WORKER_NAME"]]) and "ports" not in worker

    scheduler_spec = job["spec"]["cluster"]["spec"]["scheduler"]
    (scheduler,) = scheduler_spec["spec"]["containers"]
    args = [str(a) for a in scheduler["args"]]
    assert args[:2] == ["dask", "scheduler"] and contains(args, ["--protocol", "tls"]) and contains(args, flags)
    assert contains(args, ["--dashboard-address", "127.0.0.1:8787"])
    assert [p["containerPort"] for p in scheduler["ports"]] == [8786]
    assert [p["port"] for p in scheduler_spec["service"]["ports"]] == [8786]
    for probe in ("readinessProbe", "livenessProbe"):
        assert "127.0.0.1:8787/health" in " ".join(scheduler[probe]["exec"]["command"])
    # the certificate: one Secret, mounted read-only at /tls in the job, the workers and the scheduler
    for pod in (job["spec"]["job"]["spec"], worker_spec, scheduler_spec["spec"]):
        volumes = {v["name"]: v for v in pod["volumes"]}
        (mount,) = [m for c in pod["containers"] for m in c["volumeMounts"] if m["mountPath"] == "/tls"]
        assert mount["readOnly"] and volumes[mount["name"]]["secret"]["secretName"] == "distfit-tls"


def test_jobqueue_run_compiles(tmp_path):
    py_compile.compile(str(CLUSTER / "jobqueue_run.py"), cfile=str(tmp_path / "j.pyc"), doraise=True)


def test_jobqueue_run_help_without_jobqueue():
    result = subprocess.run([sys.executable, str(CLUSTER / "jobqueue_run.py"), "--help"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and "--system" in result.stdout
    assert all(flag in result.stdout for flag in ("--tls-ca-file", "--tls-cert", "--tls-key", "--insecure"))


def _jobqueue_run():
    spec = importlib.util.spec_from_file_location("jobqueue_run", CLUSTER / "jobqueue_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("flags, message", [
    (["--tls-cert", "c.pem"], "--tls-ca-file, --tls-cert and --tls-key go together"),
    (["--insecure", "--tls-ca-file", "a", "--tls-cert", "b", "--tls-key", "c"], "--insecure excludes"),
])
def test_jobqueue_run_refuses_half_a_certificate(flags, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        _jobqueue_run().parse_args(["--out", "x", *flags])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_jobqueue_run_cluster_keywords(tmp_path, monkeypatch):
    """What jobqueue_run.py hands dask-jobqueue: TLS (a per-run certificate, shared with the worker
    jobs through RUNDIR/.dask-tls, readable by you only), the dashboard on loopback and workers
    without one, unless the config asks otherwise; plain TCP only with --insecure."""
    import dask.config

    jobqueue_run = _jobqueue_run()
    rundir = tmp_path / "run"
    security = jobqueue_run.cluster_security(jobqueue_run.parse_args(["--out", str(rundir)]))
    assert security.require_encryption and "BEGIN CERTIFICATE" in security.tls_ca_file
    with dask.config.set({"jobqueue.slurm.scheduler-options": {}, "jobqueue.slurm.worker-extra-args": []}):
        options = jobqueue_run.cluster_options("slurm", security, str(rundir))
    assert options["security"] is security
    assert options["scheduler_options"] == {"dashboard_address": "127.0.0.1:8787"}
    assert options["worker_extra_args"] == ["--no-dashboard", "--dashboard-address", "127.0.0.1:0"]
    shared = Path(options["shared_temp_directory"])
    assert shared == rundir / ".dask-tls" and stat.S_IMODE(shared.stat().st_mode) == 0o700
    with dask.config.set({"jobqueue.pbs.scheduler-options": {"dashboard_address": ":8787"},
                          "jobqueue.pbs.worker-extra-args": ["--dashboard"]}):
        asked = jobqueue_run.cluster_options("pbs", None, str(rundir))
    assert asked == {"scheduler_options": {"dashboard_address": ":8787"}, "worker_extra_args": ["--dashboard"]}
    assert jobqueue_run.cluster_security(jobqueue_run.parse_args(["--out", "x", "--insecure"])) is None
    assert jobqueue_run.driver_transport(None, str(tmp_path)).flags() == ["--insecure"]


def test_jobqueue_run_s_certificate_gets_the_driver_into_its_tls_cluster(tmp_path):
    """The driver's transport (the per-run certificate written to a private directory) reaches a
    real TLS cluster made with that certificate, which a client without it cannot."""
    from distributed import LocalCluster

    from distfit.runtime.cluster import dask_client
    from distfit.runtime.failures import ClusterError
    from distfit.runtime.security import Transport

    jobqueue_run = _jobqueue_run()
    security = jobqueue_run.cluster_security(jobqueue_run.parse_args(["--out", str(tmp_path / "run")]))
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    transport = jobqueue_run.driver_transport(security, str(private))
    assert transport.flags() == ["--tls-ca-file", str(private / "ca.pem"), "--tls-cert", str(private / "cert.pem"),
                                 "--tls-key", str(private / "key.pem")]
    assert {stat.S_IMODE(p.stat().st_mode) for p in private.iterdir()} == {0o600}
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tls://", host="127.0.0.1",
                      security=security, dashboard_address=None, silence_logs=40) as cluster:
        with dask_client(cluster.scheduler_address, transport=transport) as client:
            assert client.submit(sum, [1, 2, 3]).result() == 6
        with pytest.raises(ClusterError, match="needs the cluster's certificates"):
            with dask_client(cluster.scheduler_address, transport=Transport(insecure=True)):
                pass


def test_jobqueue_run_missing_jobqueue(tmp_path):
    # Hide dask_jobqueue whether or not it is installed: a module on PYTHONPATH that fails to import.
    shadow = tmp_path / "shadow"
    shadow.mkdir()
    (shadow / "dask_jobqueue.py").write_text("raise ImportError('No module named dask_jobqueue')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(shadow), os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run(
        [sys.executable, str(CLUSTER / "jobqueue_run.py"), "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=30, env=env, cwd=tmp_path,
    )
    assert result.returncode != 0
    assert "dask-jobqueue is not installed" in result.stderr
    assert "pip install dask-jobqueue" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()
