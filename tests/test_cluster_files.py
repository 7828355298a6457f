"""The cluster/ recipes: YAML parses, batch scripts pass ``bash -n`` and wire scheduler file,
workers and ``distfit run --cluster`` together, the DaskJob runs distfit against the operator's
scheduler, and cluster/jobqueue_run.py fails clearly without dask-jobqueue."""
from __future__ import annotations

import os
import py_compile
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
CLUSTER = ROOT / "cluster"
SCRIPTS = [CLUSTER / "slurm" / "distfit-run.sbatch", CLUSTER / "pbs" / "distfit-run.pbs"]


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


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: p.name)
def test_batch_script_wiring(path):
    text = path.read_text()
    header = "#SBATCH" if path.suffix == ".sbatch" else "#PBS"
    assert header in text
    assert 'dask scheduler --scheduler-file "$SCHED_FILE"' in text
    assert "dask worker" in text and "--nthreads 1" in text
    assert 'SCHED_FILE="$RUNDIR/scheduler.json"' in text
    assert "distfit run" in text and '--cluster "$SCHED_FILE"' in text
    assert "trap cleanup EXIT" in text


def test_jobqueue_run_compiles(tmp_path):
    py_compile.compile(str(CLUSTER / "jobqueue_run.py"), cfile=str(tmp_path / "j.pyc"), doraise=True)


def test_jobqueue_run_help_without_jobqueue():
    result = subprocess.run([sys.executable, str(CLUSTER / "jobqueue_run.py"), "--help"],
                            capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and "--system" in result.stdout


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
