"""Planning on a real multi-process Dask cluster, including a worker killed mid-run."""
from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import yaml
import zarr
from distributed import Client

import distfit.plan.cluster_executor as executor_module
import distfit.plan.planner as plan_module
from distfit.plan.cluster_executor import DaskExecutor
from distfit.audit.plan import audit_plan
from distfit.runtime.cluster import (
    WORKER_ENV,
    ClusterError,
    dask_client,
    held_on_every_worker,
    local_cluster,
    on_every_worker,
)
from distfit.mathematics.domain import Domain
from distfit.plan.job import run_plan
from distfit.plan.planner import BlockTask, plan_groups, serial_executor
from distfit.plan.residual import residual_blocks
from distfit.spec.parse import load_spec
from distfit.stores.plan import read_plan
from distfit.runtime.placement import Placement
from distfit.runtime.security import Transport
from tests.faults import assert_killed_while_in_progress, kill_a_worker_after_the_first
from tests.reference import SMALL_SPEC
from tests.spec.helpers import PIPELINES
from tests.test_cluster_files import OPENSSL_CERTIFICATE  # the batch scripts' certificate


def _groups():
    domain = Domain(tuple(f"a{i}" for i in range(5)), (3, 3, 3, 4, 2))
    rng = np.random.default_rng(5)
    groups = [
        (f"{a},{b}", {a: np.eye(domain.size_of(a)), b: np.eye(domain.size_of(b))}, rng.uniform(1, 3, domain.size_of(a) * domain.size_of(b)))
        for a, b in itertools.combinations(domain.names, 2)
    ]
    return domain, groups


#: How closely a plan made with a worker killed must equal the uninterrupted plan. Not bit for
#: bit: a block solve on a Dask worker is reproducible only to its last bits (the same pickled
#: BlockTask solved in different worker processes, or first and later in one, gave Sigma
#: differing by up to 4e-16 relative, and whole plans by up to 1e-15), whatever is killed. 1e-12
#: is a thousand times that, and far below what a real fault would do (a block lost, doubled or
#: solved for other targets moves alpha and the variances by far more).
PLAN_RTOL = 1e-12
#: How these tests reach a local cluster they started: plain TCP on loopback (runtime.security).
LOCAL = Transport(insecure=True)


def assert_same_numbers(got, expected, name: str) -> None:
    """Equal shapes and types; integers, strings and booleans exactly, floats to ``PLAN_RTOL``
    of the array's largest magnitude."""
    got, expected = np.asarray(got), np.asarray(expected)
    assert got.shape == expected.shape and got.dtype == expected.dtype, name
    if expected.dtype.kind != "f":
        assert np.array_equal(got, expected), name
        return
    scale = np.abs(expected).max(initial=0.0)
    assert np.array_equal(np.isnan(got), np.isnan(expected)), name
    assert np.all(np.abs(np.nan_to_num(got) - np.nan_to_num(expected)) <= PLAN_RTOL * scale), name


def assert_same_plan_store(path, reference) -> None:
    """Every array of the plan store at ``path`` equals the one at ``reference``
    (:func:`assert_same_numbers`)."""
    def arrays(store):
        group = zarr.open_group(store=str(store), mode="r")
        return {name: array[...] for name, array in group.members(max_depth=None) if isinstance(array, zarr.Array)}

    got, expected = arrays(path), arrays(reference)
    assert sorted(got) == sorted(expected) and len(got) > 10
    for name, array in expected.items():
        assert_same_numbers(got[name], array, name)


@pytest.fixture(scope="module")
def client():
    with dask_client(None, workers=2) as client:
        yield client


def test_dask_plan_equals_serial_plan(client):
    """Bit for bit: a block solved on a worker from its unpickled task (arrays at any byte offset)
    is the block solved in this process (solve aligns its inputs; benchmarks/README.md, "Session 24")."""
    domain, groups = _groups()
    serial = plan_groups(domain, groups, max_cells=0, refine_rounds=1, executor=serial_executor)
    distributed = plan_groups(domain, groups, max_cells=0, refine_rounds=1, executor=DaskExecutor(client))
    assert distributed.alpha == serial.alpha
    np.testing.assert_array_equal(distributed.variances, serial.variances)
    assert [b.solution.sigma.tobytes() for b in distributed.blocks] == [b.solution.sigma.tobytes() for b in serial.blocks]


def test_adults_draft_plan_on_a_cluster_is_the_serial_plan_to_the_bit(client, tmp_path):
    """A plan whose bits hang on where a worker unpickles its arrays: Adult's draft plan (470
    blocks, no refinement rounds, a 0.5 gap) on two worker processes has the serial plan's
    checksum, so every array and fact it stores. With neither the tasks' arrays realigned
    (``runtime.cluster``) nor the solver's inputs (``workload.aligned``), three such runs gave
    three checksums, none the serial plan's (benchmarks/README.md, "Session 25")."""
    spec = load_spec(PIPELINES / "adult.yaml")
    draft = dict(refine_rounds=0, gap_tolerance=0.5)
    serial, serial_checksum = run_plan(spec, str(tmp_path / "serial.zarr"), placement=Placement(serial=True), **draft)
    cluster = Placement(cluster=client.scheduler.address, transport=LOCAL)
    distributed, distributed_checksum = run_plan(spec, str(tmp_path / "cluster.zarr"), placement=cluster, **draft)
    assert len(serial.blocks) == 470
    assert distributed_checksum == serial_checksum


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


def test_dask_executor_asks_the_thread_count_once_a_refresh(monkeypatch):
    """The in-flight limit is asked before every submission; the scheduler is asked for the
    cluster's threads at most once every THREADS_REFRESH_SECONDS, and a grown cluster is seen
    once the count is asked again."""
    class Scheduler:  # what DaskExecutor reads of a client: nthreads(), one round trip each
        def __init__(self) -> None:
            self.asked, self.workers = 0, {"w0": 1, "w1": 1}

        def nthreads(self) -> dict:
            self.asked += 1
            return dict(self.workers)

    fake = Scheduler()
    executor = DaskExecutor(fake)
    limits = {executor._limit() for _ in range(100)}
    assert fake.asked == 1 and limits == {max(executor_module.MIN_IN_FLIGHT, 2 * executor_module.IN_FLIGHT_PER_THREAD)}
    fake.workers.update({f"w{i}": 1 for i in range(2, 6)})
    monkeypatch.setattr(executor_module, "THREADS_REFRESH_SECONDS", 0.0)
    assert executor._limit() == 6 * executor_module.IN_FLIGHT_PER_THREAD and fake.asked == 2


def test_streamed_plan_on_a_cluster_equals_the_serial_plan(client, tmp_path, monkeypatch):
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(dict(SMALL_SPEC, blocks={"merge": False})))
    streamed, _ = run_plan(load_spec(path), str(tmp_path / "streamed.zarr"),
                           placement=Placement(cluster=client.scheduler.address, transport=LOCAL), stream=True)
    monkeypatch.setattr(plan_module, "CO_OPTIMIZE_WORK", 0.0)  # the streamed plan has no joint dual
    serial, _ = run_plan(load_spec(path), str(tmp_path / "serial.zarr"), placement=Placement(serial=True), stream=False)
    assert streamed.streamed and not serial.streamed
    assert streamed.alpha == pytest.approx(serial.alpha, rel=1e-9)
    np.testing.assert_allclose(read_plan(str(tmp_path / "streamed.zarr")).queries_variances, serial.variances, rtol=1e-9)


def test_plan_survives_a_killed_worker(client):
    """A worker SIGKILLed right after the first block is solved, while it holds block tasks: they
    are solved again elsewhere and the plan equals the same plan made on the same cluster
    without the kill (to ``PLAN_RTOL``: results are kept in block order, so only the solves'
    last bits may differ)."""
    domain, groups = _groups()
    reference = plan_groups(domain, groups, max_cells=0, refine_rounds=1, executor=DaskExecutor(client))
    pids = set(client.run(os.getpid).values())
    with kill_a_worker_after_the_first(client, "solve-") as record:
        plan = plan_groups(domain, groups, max_cells=0, refine_rounds=1, executor=DaskExecutor(client))
    assert_killed_while_in_progress(record)  # solve tasks of every round: a refinement round adds its own
    assert record["killed"]["pid"] in pids
    client.wait_for_workers(2, timeout=60)  # the nanny restarts the killed worker
    assert record["killed"]["pid"] not in set(client.run(os.getpid).values())
    assert_same_numbers([plan.alpha, plan.alpha_sum_bound], [reference.alpha, reference.alpha_sum_bound], "alpha")
    assert_same_numbers(plan.variances, reference.variances, "variances")
    assert len(plan.blocks) == len(reference.blocks) == 16
    for block, expected in zip(plan.blocks, reference.blocks):
        assert block.spec.block_id == expected.spec.block_id
        assert_same_numbers(block.scale, expected.scale, f"{block.spec.block_id} scale")
        assert_same_numbers(block.solution.sigma, expected.solution.sigma, f"{block.spec.block_id} sigma")
        assert_same_numbers(block.variances, expected.variances, f"{block.spec.block_id} variances")


def test_unreachable_scheduler_is_a_clear_error():
    with pytest.raises(ClusterError, match="cannot reach the scheduler"):
        with dask_client("tcp://127.0.0.1:1", timeout=2, transport=Transport(insecure=True)):
            pass


@pytest.mark.skipif(shutil.which("openssl") is None, reason="the batch scripts' certificates are made with openssl")
def test_plan_through_a_scheduler_file(tmp_path):
    """A scheduler and two workers started from the dask command line as the batch scripts start
    them (TLS with the scripts' openssl certificate, no worker dashboards), found by scheduler file."""
    scheduler_file = tmp_path / "scheduler.json"
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(OPENSSL_CERTIFICATE + ["-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    tls = ["--tls-ca-file", str(cert), "--tls-cert", str(cert), "--tls-key", str(key)]
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    scheduler = subprocess.Popen(
        dask + ["--scheduler-file", str(scheduler_file), "--protocol", "tls", "--host", "127.0.0.1", "--port", "0",
                "--dashboard-address", "127.0.0.1:0", *tls],
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
                 "--nthreads", "1", "--nworkers", "1", "--host", "127.0.0.1", "--no-dashboard",
                 "--dashboard-address", "127.0.0.1:0", *tls],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            ))
        domain, groups = _groups()
        with dask_client(str(scheduler_file), transport=Transport(str(cert), str(cert), str(key))) as client:
            assert client.scheduler.address.startswith("tls://")
            client.wait_for_workers(2, timeout=30)
            plan = plan_groups(domain, groups, max_cells=0, refine_rounds=0, executor=DaskExecutor(client))
            # workers someone else started keep Dask's malloc trim setting; distfit's plugin
            # raises their mmap threshold (runtime.WORKER_ENV, runtime.memory.raise_mmap_threshold)
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
    """`distfit plan` (``run_plan``) against a running cluster; a worker process is SIGKILLed
    right after the first block is solved, while it holds block tasks. The plan store passes
    audit and equals, array for array (to ``PLAN_RTOL``), the store of an uninterrupted plan
    made on the same cluster."""
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
        address = client.scheduler.address
        # one task per block (batch_seconds=0): batched, this plan's 16 small blocks are one or two tasks a round
        here = Placement(cluster=address, transport=LOCAL)
        reference, _ = run_plan(load_spec(path), str(tmp_path / "reference.zarr"), placement=here,
                                stream=stream,
                                batch_seconds=0)
        with kill_a_worker_after_the_first(client, "solve-") as record:
            plan, _ = run_plan(load_spec(path), str(tmp_path / "plan.zarr"), placement=here,
                               stream=stream, batch_seconds=0)
    assert_killed_while_in_progress(record)  # solve tasks of every round: a refinement round adds its own
    report = audit_plan(str(tmp_path / "plan.zarr"))
    assert report.ok, report.failures
    assert len(plan.blocks) == 16 and plan.streamed == stream
    assert_same_numbers(plan.alpha, reference.alpha, "alpha")
    assert_same_plan_store(tmp_path / "plan.zarr", tmp_path / "reference.zarr")


def test_local_workers_start_without_dask_malloc_trim(client):
    """MALLOC_TRIM_THRESHOLD_ pins glibc's mmap threshold at 128 KiB and slowed block solves by
    half; distfit's local clusters leave it out (runtime.WORKER_ENV) and register the plugin that
    raises the threshold anyway (a nanny started earlier in the process may have set it)."""
    registered = client.run(lambda dask_worker: "distfit-malloc-tuning" in dask_worker.plugins)
    assert len(registered) == 2 and all(registered.values())


def test_local_cluster_workers_follow_worker_env(monkeypatch):
    """runtime.local_cluster is how `distfit run` starts its shared cluster: its workers get the
    environment WORKER_ENV says (a variable set; Dask's malloc trim left out). A nanny started
    earlier in this process leaves MALLOC_TRIM_THRESHOLD_ in its environment, which workers would
    inherit: removed here, as in a fresh ``distfit`` process."""
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_", raising=False)
    with local_cluster(1, worker_env=dict(WORKER_ENV, DISTFIT_TEST_LOCAL_CLUSTER="yes")) as cluster, Client(cluster) as client:
        seen = list(client.run(lambda: (os.environ.get("DISTFIT_TEST_LOCAL_CLUSTER"), os.environ.get("MALLOC_TRIM_THRESHOLD_"))).values())
    assert seen == [("yes", None)]


def test_on_every_worker_makes_the_value_on_each_worker(client):
    """A value every task depends on (the estimate's model) is made by one task per worker, one
    on each: no worker waits for another's copy."""
    for _ in range(10):  # quick tasks: left to itself the scheduler may put both on one idle worker
        futures = on_every_worker(client, os.getpid, name="pid")
        assert len(futures) == len(client.nthreads()) == 2
        assert len(set(client.gather(futures))) == 2
    held = held_on_every_worker(client, {"model": [1.5, 2.5]}, name="held")  # a value, one copy a worker
    assert client.gather(held) == [{"model": [1.5, 2.5]}] * 2
    assert {w for ws in client.who_has(held).values() for w in ws} == set(client.nthreads())


FAILING_TASK = """
import sys
from distributed import Client
from distfit.runtime.cluster import local_cluster

def fails():
    raise ValueError("the task failed on purpose")

with local_cluster(workers=1) as cluster, Client(cluster) as client:
    try:
        client.submit(fails).result()
    except ValueError as error:
        print(f"driver saw: {error}")
"""


def test_a_failing_task_prints_no_worker_traceback():
    """A task that raises on a local cluster's worker reaches the driver as its exception; the
    worker process prints nothing of it (Dask logs "Compute Failed" with the traceback at
    ERROR, which the local cluster silences): the user sees the driver's one line alone."""
    done = subprocess.run([sys.executable, "-c", FAILING_TASK], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "driver saw: the task failed on purpose" in done.stdout
    assert "Traceback" not in done.stderr and "Compute Failed" not in done.stderr, done.stderr
