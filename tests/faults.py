"""Fault injection for the cluster tests: kill a worker while it holds tasks, and prove it.

:class:`KillAfterFirstResult` runs inside the scheduler (a local cluster's, in the test's
process, or an external one's: it is pickled by value), so the kill and the record of what the
killed worker held are taken from one consistent state of the scheduler, with no polling race.
"""
from __future__ import annotations

import contextlib
import os
import signal
import sys

import cloudpickle
from distributed.diagnostics.plugin import SchedulerPlugin


class KillAfterFirstResult(SchedulerPlugin):
    """Scheduler plugin: as soon as the first task whose key starts with ``prefix`` has finished
    (processing -> memory), SIGKILL the process (its ``pid`` as the scheduler knows it) of a
    worker that is processing tasks with that prefix at that moment; once. So the kill falls
    while the work is in progress, by construction, and ``killed`` records the proof: the
    worker, its pid, the keys it held and how many tasks had finished. ``log`` keeps every
    transition of those keys as ``(key, start, finish, worker)``, ``worker`` being the one a
    task went to when it entered ``processing``."""

    name = "distfit-test-kill-after-first-result"

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
        self.log: list[tuple[str, str, str, str | None]] = []
        self.killed: dict | None = None

    async def start(self, scheduler) -> None:
        self.scheduler = scheduler

    def transition(self, key, start, finish, *args, **kwargs) -> None:
        key = str(key)
        if not key.startswith(self.prefix):
            return
        task = self.scheduler.tasks.get(key)
        worker = task.processing_on.address if finish == "processing" and task is not None and task.processing_on else None
        self.log.append((key, start, finish, worker))
        if self.killed is not None or finish not in ("memory", "processing"):
            return
        if finish == "processing":
            # tasks of microseconds may leave no worker holding one at any result; a task sent
            # to a worker after the first result is held by it now
            if worker is not None and any(entry[2] == "memory" for entry in self.log):
                state = self.scheduler.workers[worker]
                self._kill(state, sorted(str(t.key) for t in state.processing if str(t.key).startswith(self.prefix)))
            return
        for state in self.scheduler.workers.values():
            held = sorted(str(t.key) for t in state.processing if str(t.key).startswith(self.prefix))
            if held:
                self._kill(state, held)
                return

    def _kill(self, state, held: list[str]) -> None:
        done = sum(1 for entry in self.log if entry[2] == "memory")
        os.kill(state.pid, signal.SIGKILL)
        self.killed = {"address": state.address, "pid": state.pid, "held": held, "done": done}


def _kill_record(dask_scheduler) -> tuple[list, dict | None]:
    plugin = dask_scheduler.plugins[KillAfterFirstResult.name]
    return list(plugin.log), plugin.killed


@contextlib.contextmanager
def kill_a_worker_after_the_first(client, prefix: str):
    """Install :class:`KillAfterFirstResult` on the client's scheduler for the block; yields a
    dict that gets ``log`` and ``killed`` when the block ends. The plugin and the function that
    reads it back travel by value, so a scheduler that cannot import ``tests`` runs them too."""
    cloudpickle.register_pickle_by_value(sys.modules[__name__])
    record: dict = {}
    client.register_plugin(KillAfterFirstResult(prefix))
    try:
        yield record
    finally:
        record["log"], record["killed"] = client.run_on_scheduler(_kill_record)
        client.unregister_scheduler_plugin(KillAfterFirstResult.name)


def assert_killed_while_in_progress(record: dict, total: int | None = None) -> None:
    """The kill fell while the work was in progress, on a worker holding tasks: fewer than
    ``total`` tasks (default: every task the log saw) had finished, and every task the killed
    worker held was lost with it and
    run again on another worker: the scheduler released it (from processing, or from memory
    when its result had left the worker just before the kill but lived only there) and sent it
    to processing a second time, to a surviving worker, where it finished."""
    killed, log = record["killed"], record["log"]
    assert killed is not None, "no worker was ever seen holding a task: nothing was killed"
    total = len({entry[0] for entry in log}) if total is None else total
    assert 1 <= killed["done"] < total, f"{killed['done']} of {total} tasks had finished at the kill"
    assert killed["held"], "the killed worker held no task"
    for key in killed["held"]:
        went = [(start, finish, worker) for k, start, finish, worker in log if k == key]
        sent = [i for i, (start, finish, worker) in enumerate(went) if finish == "processing"]
        assert len(sent) >= 2, f"{key}, held by the killed worker, never ran again: {went}"
        lost = went[sent[-2] + 1:sent[-1]]
        assert any(finish == "released" and start in ("processing", "memory") for start, finish, _ in lost), (key, went)
        assert went[sent[-1]][2] != killed["address"], (key, went)
        assert ("processing", "memory", None) in went[sent[-1] + 1:sent[-1] + 2], (key, went)
