"""Planning on a real multi-process Dask cluster, including a worker killed mid-run."""
from __future__ import annotations

import itertools
import os
import platform
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import yaml
from distributed import Client

import distfit.plan.planner as plan_module
from distfit.audit import audit_plan
from distfit.cluster import WORKER_ENV, ClusterError, DaskExecutor, dask_client, local_cluster, raise_mmap_threshold
from distfit.domain import Domain
from distfit.plan.job import run_plan
from distfit.plan.planner import BlockTask, plan_groups, serial_executor
from distfit.plan.residual import residual_blocks
from distfit.spec.parse import load_spec
from distfit.stores.plan import read_plan
from tests.reference import SMALL_SPEC


def _groups():
    domain = Domain(tuple(f"a{i}" for i in range(5)), (3, 3, 3, 4, 2))
    rng = np.random.default_rng(5)
    groups = [
        (f"{a},{b}", {a: np.eye(domain.size_of(a)), b: np.eye(domain.size_of(b))}, rng.uniform(1, 3, domain.size_of(a) * domain.size_of(b)))
        for a, b in itertools.combinations(domain.names, 2)
    ]
    return domain, groups


@pytest.fixture(scope="module")
def client():
    with dask_client(None, workers=2) as client:
        yield client


def test_dask_plan_equals_serial_plan(client):
    domain, groups = _groups()
    serial = plan_groups(domain, groups, max_cells=0, refine_rounds=0, executor=serial_executor)
    distributed = plan_groups(domain, groups, max_cells=0, refine_rounds=0, executor=DaskExecutor(client))
    assert distributed.alpha == pytest.approx(serial.alpha, rel=1e-9)
    np.testing.assert_allclose(distributed.variances, serial.variances, rtol=1e-9)


def test_dask_executor_takes_tasks_lazily(client):
    """At most max_in_flight tasks are submitted and unread: a streamed plan reads each spec
    from the store only when its task goes out."""
    domain, groups = _groups()
    blocks = residual_blocks(domain, groups)
    pulled = []

    def tasks():
        for i, spec in enumerate(blocks):
            pulled.append(i)
            yield BlockTask(i, spec, spec.targets)

    seen = []
    for index, solution in DaskExecutor(client, max_in_flight=2)(tasks()):
        seen.append(index)
        assert len(pulled) - len(seen) <= 2
    assert sorted(seen) == list(range(len(blocks))) == pulled


def test_streamed_plan_on_a_cluster_equals_the_serial_plan(client, tmp_path, monkeypatch):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(dict(SMALL_SPEC, blocks={"merge": False})))
    streamed, _ = run_plan(load_spec(path), str(tmp_path / "streamed.zarr"), cluster=client.scheduler.address, stream=True)
    monkeypatch.setattr(plan_module, "CO_OPTIMIZE_WORK", 0.0)  # the streamed plan has no joint dual
    serial, _ = run_plan(load_spec(path), str(tmp_path / "serial.zarr"), serial=True, stream=False)
    assert streamed.streamed and not serial.streamed
    assert streamed.alpha == pytest.approx(serial.alpha, rel=1e-9)
    np.testing.assert_allclose(read_plan(str(tmp_path / "streamed.zarr")).queries_variances, serial.variances, rtol=1e-9)


def test_plan_survives_a_killed_worker(client):
    domain, groups = _groups()
    reference = plan_groups(domain, groups, max_cells=0, refine_rounds=0)
    pids = list(client.run(os.getpid).values())

    def kill_one():
        os.kill(pids[0], signal.SIGKILL)

    timer = threading.Timer(0.3, kill_one)
    timer.start()
    plan = plan_groups(domain, groups, max_cells=0, refine_rounds=1, executor=DaskExecutor(client))
    timer.join()
    assert plan.alpha <= reference.alpha * (1 + 1e-6)
    assert np.all(plan.variances <= plan.targets * (1 + 1e-9))


def test_unreachable_scheduler_is_a_clear_error():
    with pytest.raises(ClusterError, match="cannot reach the scheduler"):
        with dask_client("tcp://127.0.0.1:1", timeout=2):
            pass


def test_plan_through_a_scheduler_file(tmp_path):
    """A scheduler and two workers started from the dask command line, found by scheduler file."""
    scheduler_file = tmp_path / "scheduler.json"
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    scheduler = subprocess.Popen(
        dask + ["--scheduler-file", str(scheduler_file), "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    workers = []
    try:
        deadline = time.time() + 30
        while not scheduler_file.exists() and time.time() < deadline:
            time.sleep(0.2)
        assert scheduler_file.exists(), "the scheduler did not write its scheduler file"
        for _ in range(2):
            workers.append(subprocess.Popen(
                [sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", str(scheduler_file),
                 "--nthreads", "1", "--nworkers", "1", "--no-dashboard"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
        domain, groups = _groups()
        with dask_client(str(scheduler_file)) as client:
            client.wait_for_workers(2, timeout=30)
            plan = plan_groups(domain, groups, max_cells=0, refine_rounds=0, executor=DaskExecutor(client))
            # workers someone else started keep Dask's malloc trim setting; distfit's plugin
            # raises their mmap threshold (runtime.WORKER_ENV, runtime.raise_mmap_threshold)
            registered = client.run(lambda dask_worker: "distfit-malloc-tuning" in dask_worker.plugins)
            assert len(registered) == 2 and all(registered.values())
        reference = plan_groups(domain, groups, max_cells=0, refine_rounds=0)
        assert plan.alpha == pytest.approx(reference.alpha, rel=1e-9)
    finally:
        for process in workers + [scheduler]:
            process.terminate()
        for process in workers + [scheduler]:
            process.wait(timeout=30)


@pytest.mark.parametrize("stream", [False, True])
def test_killed_worker_plan_completes_and_passes_audit(tmp_path, stream):
    """`distfit plan` against a running cluster; one worker process is killed mid-plan."""
    spec = {
        "name": "faults",
        "attributes": [{"name": f"a{i}", "size": size} for i, size in enumerate((3, 3, 3, 4, 2))],
        "queries": [
            {"name": f"a{i}a{j}", "attributes": {f"a{i}": "identity", f"a{j}": "identity"}, "target": [1.0 + ((i + j + k) % 3) for k in range(n)]}
            for (i, j), n in (((i, j), (3, 3, 3, 4, 2)[i] * (3, 3, 3, 4, 2)[j]) for i, j in itertools.combinations(range(5), 2))
        ],
        "blocks": {"merge": False},
    }
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    with dask_client(None, workers=2) as client:
        pids = list(client.run(os.getpid).values())
        killed_at = []

        def kill():
            os.kill(pids[0], signal.SIGKILL)
            killed_at.append(time.perf_counter())

        timer = threading.Timer(0.3, kill)
        timer.start()
        plan, _ = run_plan(load_spec(path), str(tmp_path / "plan.zarr"), cluster=client.scheduler.address, stream=stream)
        finished_at = time.perf_counter()
        timer.join()
        assert killed_at and killed_at[0] < finished_at, "the worker was not killed while the plan ran"
    report = audit_plan(str(tmp_path / "plan.zarr"))
    assert report.ok, report.failures
    assert len(plan.blocks) == 16 and plan.streamed == stream


def test_local_workers_start_without_dask_malloc_trim(client):
    """MALLOC_TRIM_THRESHOLD_ pins glibc's mmap threshold at 128 KiB and slowed block solves by
    half; distfit's local clusters leave it out (runtime.WORKER_ENV) and register the plugin that
    raises the threshold anyway (a nanny started earlier in the process may have set it)."""
    registered = client.run(lambda dask_worker: "distfit-malloc-tuning" in dask_worker.plugins)
    assert len(registered) == 2 and all(registered.values())
    if "MALLOC_TRIM_THRESHOLD_" in os.environ:
        pytest.skip("set in this process's environment (an earlier test's nanny), which workers inherit")
    assert set(client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_")).values()) == {None}


def test_raise_mmap_threshold_works_on_glibc():
    if platform.libc_ver()[0] != "glibc":
        pytest.skip("mallopt is glibc's")
    assert raise_mmap_threshold() is True


def test_local_cluster_workers_follow_worker_env():
    """runtime.local_cluster is how `distfit run` starts its shared cluster: its workers get the
    environment WORKER_ENV says (a variable set; Dask's malloc trim left out unless inherited)."""
    with local_cluster(1, worker_env=dict(WORKER_ENV, DISTFIT_TEST_LOCAL_CLUSTER="yes")) as cluster, Client(cluster) as client:
        seen = list(client.run(lambda: (os.environ.get("DISTFIT_TEST_LOCAL_CLUSTER"), os.environ.get("MALLOC_TRIM_THRESHOLD_"))).values())
    assert seen[0][0] == "yes"
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        assert seen[0][1] is None
