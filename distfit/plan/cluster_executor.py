"""The plan's cluster executor: block solves run as Dask tasks sized by work.

The planner takes any :data:`distfit.plan.planner.Executor`; this one hands the block tasks to
a cluster through :func:`distfit.runtime.cluster.run_tasks` (the runtime knows how to run
tasks, not what a block is), reached through ``distfit.runtime.placement.dask_runtime``: only
made with a client, so a serial plan never imports Dask.
"""
from __future__ import annotations

import time
from typing import Iterable, Iterator

from distfit.plan.planner import BlockTask, batched, solve_blocks
from distfit.runtime.placement import dask_runtime
from distfit.solver.solve import BlockSolution

IN_FLIGHT_PER_THREAD = 4  # block tasks submitted ahead per worker thread (DaskExecutor)
MIN_IN_FLIGHT = 8
#: How long the cluster's thread count is trusted before it is asked again: each ask is a round
#: trip to the scheduler (``client.nthreads()``), and the limit is asked before every submission
#: (Adult's plan: 636 asks, 11 s of the driver's wall under load 8-10, where a second's delay in
#: seeing a new worker costs nothing).
THREADS_REFRESH_SECONDS = 1.0


class DaskExecutor:
    """Plan executor (:data:`distfit.plan.planner.Executor`) that runs the block solves as Dask tasks sized by work.

    Blocks go out in batches of at least ``batch_seconds`` of estimated work
    (``planner.batched``; default 0: one task per block; ``distfit plan`` passes
    ``planner.BATCH_SECONDS``): in the planner's largest-first order a large SM-II block is a
    task of its own, longest first, and small blocks share tasks, so Dask's 10-15 ms per task
    stays small against the work. A batch's results are yielded block by block; a batch lost
    with its worker is retried whole.

    Tasks are taken from ``tasks`` lazily and at most ``max_in_flight`` are submitted and not
    yet read (default: ``IN_FLIGHT_PER_THREAD`` per worker thread of the cluster at that
    moment, at least ``MIN_IN_FLIGHT``, so a growing cluster gets more): a streamed plan reads
    each block's spec from the store only when its task is submitted, and with a local cluster
    the scheduler (in the driver's process) holds only those tasks' specs. ``max_in_flight=0``
    submits every task at once. The thread count is asked of the scheduler at most once every
    ``THREADS_REFRESH_SECONDS``."""

    def __init__(self, client, max_in_flight: int | None = None, batch_seconds: float = 0.0) -> None:
        self.client = client
        self.max_in_flight = max_in_flight
        self.batch_seconds = batch_seconds
        self._threads: tuple[float, int] | None = None  # (when asked, worker threads then)

    def _limit(self) -> int:
        if self.max_in_flight is not None:
            return self.max_in_flight
        now = time.monotonic()
        if self._threads is None or now - self._threads[0] >= THREADS_REFRESH_SECONDS:
            self._threads = (now, dask_runtime().worker_threads(self.client))
        return max(MIN_IN_FLIGHT, IN_FLIGHT_PER_THREAD * self._threads[1])

    def __call__(self, tasks: Iterable[BlockTask]) -> Iterator[tuple[int, BlockSolution]]:
        def calls() -> Iterator[tuple[str, tuple]]:
            for batch in batched(tasks, self.batch_seconds):
                label = batch[0].spec.block_id + (f"+{len(batch) - 1}" if len(batch) > 1 else "")
                yield label, (batch,)

        limit = None if self.max_in_flight == 0 else self._limit
        for _, results in dask_runtime().run_tasks(self.client, solve_blocks, calls(), "solve", limit):
            yield from results
