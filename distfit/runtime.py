"""Where the work runs: a Dask cluster (DESIGN.md section 3).

Planning is data-free: each block solve is a pure function (``plan.solve_block``) submitted as
one task. By default a local multi-process cluster is started (``LocalCluster(processes=True)``,
one single-threaded worker per process, since the solver's BLAS calls are single-threaded for
small blocks); the same code connects to a running scheduler by address
(``tcp://host:8786``) or scheduler file (SLURM/PBS via dask-jobqueue, Kubernetes via the dask
operator). Results are yielded as they complete (``as_completed``) so the driver can stream
them into the plan store; lost workers are covered by task retries.
"""
from __future__ import annotations

import contextlib
import os
import sys
import time
import uuid
from typing import Any, Callable, Iterable, Iterator, Sequence, TextIO

from .plan import BlockTask, solve_block
from .solver import BlockSolution

TASK_RETRIES = 3


class ClusterError(RuntimeError):
    """The cluster named on the command line cannot be reached."""


@contextlib.contextmanager
def dask_client(cluster: str | None = None, workers: int | None = None, timeout: float = 10.0, log: TextIO | None = None):
    """A ``distributed.Client``: a new local multi-process cluster, or an existing scheduler.

    ``cluster`` is ``None`` (start ``LocalCluster(processes=True)`` with ``workers`` processes,
    default: the machine's cores), a scheduler address, or the path of a scheduler file. The
    dashboard address is printed to ``log``.
    """
    from distributed import Client, LocalCluster

    log = log or sys.stderr
    if cluster is None:
        count = workers or os.cpu_count() or 1
        with LocalCluster(
            n_workers=count, threads_per_worker=1, processes=True, dashboard_address=":0", silence_logs=40
        ) as local, Client(local) as client:
            print(f"distfit: local cluster with {count} worker processes; dashboard {client.dashboard_link}", file=log)
            yield client
        return
    try:
        if os.path.exists(cluster):
            client = Client(scheduler_file=cluster, timeout=timeout)
        else:
            client = Client(cluster, timeout=timeout)
    except (OSError, TimeoutError, ValueError) as error:
        raise ClusterError(f"cluster: cannot reach the scheduler at {cluster!r}: {error}") from None
    with client:
        print(f"distfit: connected to {cluster}; dashboard {client.dashboard_link}", file=log)
        yield client


class Progress:
    """One status line: items done (``unit``: blocks, units, ...), rate and ETA (written to a
    terminal or a log)."""

    def __init__(self, label: str, stream: TextIO | None = None, unit: str = "blocks"):
        self.label = label
        self.unit = unit
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.last = 0.0

    def __call__(self, done: int, total: int) -> None:
        now = time.perf_counter()
        if done < total and now - self.last < 0.5:
            return
        self.last = now
        elapsed = now - self.start
        rate = done / elapsed if elapsed > 0 else 0.0
        eta = (total - done) / rate if rate > 0 else float("nan")
        end = "\n" if done == total else "\r"
        print(f"{self.label}: {done}/{total} {self.unit}, {rate:.1f} {self.unit}/s, ETA {eta:.0f} s   ", end=end, file=self.stream, flush=True)


def run_tasks(client, function: Callable, calls: Iterable[tuple[str, tuple]], name: str) -> Iterator[tuple[str, Any]]:
    """Submit ``function(*args)`` for every ``(label, args)``, one impure task each (unique key
    ``name-label-run``, ``TASK_RETRIES`` retries for lost workers); yield ``(label, result)`` as
    tasks complete, releasing each result from the cluster once it is read."""
    from distributed import as_completed

    run = uuid.uuid4().hex[:8]
    futures = {
        client.submit(function, *args, key=f"{name}-{label}-{run}", retries=TASK_RETRIES, pure=False): label
        for label, args in calls
    }
    for future in as_completed(futures):
        label = futures[future]
        result = future.result()
        future.release()
        yield label, result


class DaskExecutor:
    """Plan executor (``plan.Executor``) that runs one Dask task per block."""

    def __init__(self, client) -> None:
        self.client = client

    def __call__(self, tasks: Sequence[BlockTask]) -> Iterator[tuple[int, BlockSolution]]:
        index_of = {task.spec.block_id: task.index for task in tasks}
        calls = ((task.spec.block_id, (task,)) for task in tasks)
        for block_id, result in run_tasks(self.client, solve_block, calls, "solve"):
            yield index_of[block_id], result
