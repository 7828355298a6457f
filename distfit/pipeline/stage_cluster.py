"""The cluster a ``distfit run`` shares between its stages (:class:`StageCluster`).

Decision (issue 31 point 3, Adult's data stage): a run that tabulates microdata and then plans
starts its local cluster on a thread of its own (:meth:`StageCluster.start`) before the data
stage, so that the workers spawn and import (about 4 s on 2 cores) while the driver decomposes
the spec and reads the source; the plan, which needs the cluster, waits for it only if it is not
up yet. The tabulation asks for the cluster only for a pass of more than one task
(:func:`distfit.data.microdata.tabulate_microdata`): a one-partition source is read in the
driver. Nothing else starts early: a stage that may not need the cluster (a reused plan, a
one-chunk estimate) still starts it on first need, so a run that needs none starts none.
"""
from __future__ import annotations

import contextlib
import json
import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TextIO

from distfit.runtime.placement import Placement, dask_runtime

__all__ = ["StageCluster"]


class StageCluster:
    """Where the stages run: the run's placement, its local cluster (if it asks for one) started
    once - on first need (:meth:`placement`) or ahead (:meth:`start`) - and shared by the
    stages; closed with ``stack``."""

    def __init__(self, placement: Placement, log: TextIO, stack: contextlib.ExitStack) -> None:
        self.given, self.log, self.stack = placement, log, stack
        self.address: str | None = placement.cluster
        self.started = False
        self._starting: Future | None = None

    def start(self) -> None:
        """Start the local cluster on a thread (module docstring), if the run asks for one and
        it is neither started nor starting; :meth:`placement` waits for it."""
        if not self.given.local or self.started or self._starting is not None:
            return
        runtime = dask_runtime()  # imported here, not on the thread
        pool = ThreadPoolExecutor(1, thread_name_prefix="distfit-cluster-start")
        # without Dask's malloc trim (WORKER_ENV); the pool's thread ends with the start
        self._starting = pool.submit(runtime.local_cluster, self.given.local_workers, log=self.log)
        pool.shutdown(wait=False)
        self.stack.callback(self._abandon)

    def _abandon(self) -> None:
        """Close a cluster started ahead that no stage took (the run failed before it)."""
        if not self.started and self._starting is not None:
            with contextlib.suppress(Exception):
                self._starting.result().close()

    def placement(self) -> Placement:
        """Where a stage runs: the run's placement, on its local cluster (started now if need be)."""
        if self.given.local and not self.started:
            self.start()
            local = self.stack.enter_context(self._starting.result())
            self.address, self.started = local.scheduler_address, True
        return self.given.at(self.address)

    def describe(self) -> dict[str, Any]:
        """The manifest's ``cluster`` entry (:mod:`distfit.pipeline.run`'s docstring)."""
        described = self.given.describe()
        if described["kind"] == "local":
            described["started"] = self.started or self._starting is not None
        elif described["kind"] == "external" and os.path.exists(self.given.cluster):
            # a scheduler file (runtime.dask_client's rule)
            described["scheduler_file"] = os.path.abspath(self.given.cluster)
            with contextlib.suppress(OSError, ValueError, AttributeError):
                with open(self.given.cluster, encoding="utf-8") as handle:
                    described["scheduler_address"] = json.load(handle).get("address")
        return described
