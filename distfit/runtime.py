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
from typing import Any, Callable, Iterable, Iterator, TextIO

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


def run_tasks(
    client,
    function: Callable,
    calls: Iterable[tuple[str, tuple]],
    name: str,
    max_in_flight: int | Callable[[], int] | None = None,
) -> Iterator[tuple[str, Any]]:
    """Submit ``function(*args)`` for every ``(label, args)``, one impure task each (unique key
    ``name-label-run``, ``TASK_RETRIES`` retries for lost workers); yield ``(label, result)`` as
    tasks complete, releasing each result from the cluster once it is read.

    ``max_in_flight`` (a number, or a function asked before every submission) bounds how many
    tasks are submitted and not yet read: ``calls`` is then consumed lazily, one call per
    completed task (the next is submitted before a result is handed on, so the workers stay
    busy while the caller handles it), and neither the driver nor the scheduler ever holds
    more than that many calls' arguments. ``None``: submit everything at once."""
    from distributed import as_completed

    run = uuid.uuid4().hex[:8]
    calls = iter(calls)
    futures: dict = {}
    pending = as_completed()

    def limit() -> float:
        if max_in_flight is None:
            return float("inf")
        return max(1, max_in_flight() if callable(max_in_flight) else max_in_flight)

    def submit_more() -> None:
        cap = limit()
        while len(futures) < cap:
            try:
                label, args = next(calls)
            except StopIteration:
                return
            future = client.submit(function, *args, key=f"{name}-{label}-{run}", retries=TASK_RETRIES, pure=False)
            futures[future] = label
            pending.add(future)

    submit_more()
    for future in pending:
        label = futures.pop(future)
        result = future.result()
        future.release()
        del future
        submit_more()
        yield label, result


IN_FLIGHT_PER_THREAD = 4  # block tasks submitted ahead per worker thread (DaskExecutor)
MIN_IN_FLIGHT = 8


class DaskExecutor:
    """Plan executor (``plan.Executor``) that runs one Dask task per block.

    Tasks are taken from ``tasks`` lazily and at most ``max_in_flight`` are submitted and not
    yet read (default: ``IN_FLIGHT_PER_THREAD`` per worker thread of the cluster at that
    moment, at least ``MIN_IN_FLIGHT``, so a growing cluster gets more): a streamed plan reads
    each block's spec from the store only when its task is submitted, and with a local cluster
    the scheduler (in the driver's process) holds only those tasks' specs. ``max_in_flight=0``
    submits every task at once."""

    def __init__(self, client, max_in_flight: int | None = None) -> None:
        self.client = client
        self.max_in_flight = max_in_flight

    def _limit(self) -> int:
        if self.max_in_flight is not None:
            return self.max_in_flight
        threads = sum(self.client.nthreads().values())
        return max(MIN_IN_FLIGHT, IN_FLIGHT_PER_THREAD * threads)

    def __call__(self, tasks: Iterable[BlockTask]) -> Iterator[tuple[int, BlockSolution]]:
        index_of: dict[str, int] = {}

        def calls() -> Iterator[tuple[str, tuple]]:
            for task in tasks:
                index_of[task.spec.block_id] = task.index
                yield task.spec.block_id, (task,)

        limit = None if self.max_in_flight == 0 else self._limit
        for block_id, result in run_tasks(self.client, solve_block, calls(), "solve", limit):
            yield index_of.pop(block_id), result
