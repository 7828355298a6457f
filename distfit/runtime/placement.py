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

The boundary to Dask
--------------------
Decision (issue 31: every command imports only what it uses): this module is where a job's
placement becomes Dask, and the only place in the package where Dask is imported inside a
function. :func:`dask_runtime` imports :mod:`distfit.runtime.cluster` (dask, distributed: about
a second) when first called, and :func:`dask_dataframe` imports ``dask.dataframe`` (with
pandas and pyarrow) when microdata is first read. The jobs reach the cluster only through them,
and only on the paths that have a cluster: :func:`placement_client` and :class:`PlacedClient`
start or reach one unless the placement is serial (None then, without importing Dask), and a
job's Dask path calls ``dask_runtime().run_tasks(client, ...)`` with the client it was given.
So ``distfit plan --serial``, ``release --serial`` and ``estimate --serial`` import no Dask
(``tests/cli/test_main.py`` checks the module list ``python -X importtime`` prints). Everything
else still imports at the top of its module (the house rule), ``distfit.runtime.cluster``
included; ``tests/test_layout.py`` allows these two imports here and nowhere else.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Iterator, TextIO

from distfit.runtime.security import Transport, is_loopback

__all__ = ["PlacedClient", "Placement", "dask_dataframe", "dask_runtime", "placement_client"]


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


def dask_runtime() -> ModuleType:
    """:mod:`distfit.runtime.cluster`, the runtime's Dask side, imported on first call (module
    docstring: the boundary to Dask). Call it where a cluster is used, never at import time."""
    from distfit.runtime import cluster  # the boundary to Dask (module docstring)

    return cluster


def dask_dataframe() -> ModuleType:
    """``dask.dataframe``, imported on first call: the partitioned reading of microdata
    (:mod:`distfit.data.microdata`), also in a serial job (module docstring)."""
    import dask.dataframe  # the boundary to Dask (module docstring)

    return dask.dataframe


@contextlib.contextmanager
def placement_client(placement: Placement, log: TextIO | None = None) -> Iterator[Any]:
    """The Dask client of ``placement`` (``distfit.runtime.cluster.dask_client`` of its cluster
    and workers) while the context is open, or None for a serial placement (the caller then
    works in-process, and Dask is not imported)."""
    if placement.serial:
        yield None
        return
    with dask_runtime().dask_client(placement.cluster, placement.workers, log=log,
                                    transport=placement.transport) as client:
        yield client


class PlacedClient:
    """The Dask client of a chunked job's ``placement``, started on first need on a thread of its
    own (``distfit.runtime.cluster.BackgroundClient``, with its default ``WORKER_ENV``) and held
    open until ``stack`` closes; None for a serial placement (Dask is then never imported).
    ``start()`` only starts it (the workers spawn while the driver goes on), ``get()`` waits for
    it (raising what starting raised, e.g. ``ClusterError``), ``close(wait=False)`` shuts it down
    while the driver seals. One way for the chunked jobs (release, estimate, mask) to start
    their cluster only when they have chunks to compute."""

    def __init__(self, placement: Placement, stack: contextlib.ExitStack, log: TextIO | None = None) -> None:
        self.placement, self.stack, self.log = placement, stack, log
        self._background: Any = None

    def start(self) -> None:
        """Start the client (not for a serial placement), unless it is started already."""
        if not self.placement.serial and self._background is None:
            self._background = self.stack.enter_context(dask_runtime().BackgroundClient(
                self.placement.cluster, self.placement.workers, log=self.log, transport=self.placement.transport))

    def get(self):
        """The client (None for a serial placement), started now if need be; waits for it."""
        if self.placement.serial:
            return None
        self.start()
        return self._background.get()

    def close(self, wait: bool = True) -> None:
        """Shut the client down if it was started (``wait=False``: only ask, see ``BackgroundClient``)."""
        if self._background is not None:
            self._background.close(wait=wait)
