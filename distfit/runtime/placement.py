"""Where a job's tasks run: one value, :class:`Placement`, passed to every job entry point.

``run_plan``, ``run_release``, ``run_estimate``, ``run_pipeline`` and ``run_levels`` each take
``placement: Placement = Placement()`` instead of repeating ``cluster``, ``workers`` and
``serial`` keywords, and the command line builds one ``Placement`` from ``--cluster``,
``--workers`` and ``--serial`` in one place (``distfit.cli.main.placement_of``). The options
are checked once, here, when the value is made (``ValueError``, one line naming the option, as
the command line reports it): a job never sees ``workers=0`` or ``--serial`` with a cluster.

The three ways (docs/design.md section 3): ``Placement(serial=True)`` runs every task in the driver,
without Dask; ``Placement(cluster=ADDRESS_OR_FILE)`` connects to a running scheduler, by
address (``tcp://host:8786``) or scheduler file (``distfit.runtime.cluster.dask_client``'s
rule: a path that exists is a scheduler file); ``Placement()`` or ``Placement(workers=N)``
starts a local multi-process cluster of ``N`` workers (default: the machine's cores).
How an existing scheduler is reached is the placement's ``transport``
(:class:`distfit.runtime.security.Transport`: TLS files, or plain TCP allowed with
``--insecure``; the rule is checked when the connection is made, ``runtime.cluster``).

Decision: ``log`` (where progress and notes are printed) and ``fsync`` (whether written files
are forced to disk) are *not* part of a placement, nor of a second value. They do not say where
the work runs but how a job reports and how durably it writes, and they reach far more
functions than the job entry points (``scale_plan_to_budget``, ``estimate_levels``,
``write_synthetic``, ``write_synthetic_people``, ``ensure_tabulated``, the chunked-job driver), none of
which has a cluster; bundling them would make those take a value they half ignore, or split
one concern over two values. So they stay plain keywords, each with the one default it has
everywhere (``log=None``: stderr; ``fsync=True``).

This module is light (no Dask): the command line imports it for every command.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from distfit.runtime.security import Transport, is_loopback

__all__ = ["Placement"]


@dataclass(frozen=True)
class Placement:
    """Where a job's tasks run (module docstring): ``cluster`` (a scheduler address or the
    path of a scheduler file; None: a local cluster), ``workers`` (the local cluster's worker
    processes; None: the machine's cores), ``serial`` (in the driver, without Dask; excludes
    the other two) and ``transport`` (how ``cluster`` is reached: TLS files or ``--insecure``;
    only with ``cluster``). Made valid or not at all: ValueError naming the option."""

    cluster: str | None = None
    workers: int | None = None
    serial: bool = False
    transport: Transport = Transport()

    def __post_init__(self) -> None:
        if self.cluster is not None:
            object.__setattr__(self, "cluster", os.fspath(self.cluster))  # a scheduler file given as a Path
        if self.workers is not None and (isinstance(self.workers, bool) or self.workers < 1):
            raise ValueError(f"--workers must be >= 1, got {self.workers}")
        if self.serial and (self.cluster is not None or self.workers is not None):
            raise ValueError("--serial excludes --cluster and --workers")
        if self.cluster is None and not self.transport.default:
            raise ValueError("--tls-ca-file, --tls-cert, --tls-key and --insecure are for --cluster "
                             "(a scheduler distfit does not start)")

    @property
    def local(self) -> bool:
        """Whether this placement starts a local cluster of its own (neither serial nor a cluster given)."""
        return not self.serial and self.cluster is None

    @property
    def local_workers(self) -> int:
        """The worker processes of the local cluster this placement starts: ``workers``, else the cores."""
        return self.workers or os.cpu_count() or 1

    def at(self, address: str | None) -> "Placement":
        """This placement on the scheduler at ``address`` (a local cluster a job has started, so
        that its stages share it); itself when ``address`` is None (serial, or not started) or
        its own ``cluster``. A local cluster listens on loopback only and speaks plain TCP there
        (``runtime.cluster.local_cluster``): the job chose that, so the placement at a loopback
        address allows it (``Transport(insecure=True)``); at any other address it keeps the
        transport it has."""
        if address is None or address == self.cluster:
            return self
        transport = Transport(insecure=True, own=True) if is_loopback(address) else self.transport
        return Placement(cluster=address, workers=self.workers, transport=transport)

    def describe(self) -> dict[str, Any]:
        """What a run manifest records of it: ``{"kind": "serial"}``, ``{"kind": "local",
        "workers": N}`` or ``{"kind": "external", "address": ...}`` (``distfit.pipeline.run``
        adds what it learns while running: whether the local cluster was started, the scheduler
        file's contents)."""
        if self.serial:
            return {"kind": "serial"}
        if self.cluster is not None:
            return {"kind": "external", "address": self.cluster}
        return {"kind": "local", "workers": self.local_workers}
