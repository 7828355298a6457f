"""Planning on a real multi-process Dask cluster, including a worker killed mid-run."""
from __future__ import annotations

import itertools
import os
import signal
import threading

import numpy as np
import pytest

from distfit.plan import plan_groups, serial_executor
from distfit.runtime import ClusterError, DaskExecutor, dask_client
from distfit.workload import Domain


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
