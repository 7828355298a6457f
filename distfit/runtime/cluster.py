"""Where the work runs: a Dask cluster (docs/design.md section 3).

Planning is data-free: each block solve is a pure function (``plan.solve_block``), submitted
in tasks sized by work (:class:`distfit.plan.cluster_executor.DaskExecutor`: small blocks batched, large ones alone). By default
a local multi-process cluster is started (``LocalCluster(processes=True)``, one
single-threaded worker per process, since the solver's BLAS calls are single-threaded for
small blocks); the same code connects to a running scheduler by address
(``tls://host:8786``) or scheduler file (SLURM/PBS via dask-jobqueue, Kubernetes via the dask
operator), over TLS unless plain TCP is allowed (:mod:`distfit.runtime.security`,
docs/deployment.md). The local cluster listens on 127.0.0.1 only (``local_cluster``). Results
are yielded as they complete (``as_completed``) so the driver can stream them into the plan
store; lost workers are covered by task retries. A job's
:class:`distfit.runtime.placement.Placement` (where it runs) becomes a client through
``distfit.runtime.placement.placement_client`` (a context) or ``PlacedClient`` (started on a
thread when first needed: the chunked jobs).

This is the module that imports Dask. Nothing outside the runtime imports it: the jobs reach
it through :func:`distfit.runtime.placement.dask_runtime` only when they have a cluster, so a
serial job never imports Dask (``distfit.runtime.placement``'s docstring).
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import sys
import threading
import uuid
import warnings
from typing import Any, Callable, Iterable, Iterator, TextIO

import dask
from distributed import Client, LocalCluster, as_completed
from distributed.diagnostics.plugin import WorkerPlugin
from distributed.security import Security

from distfit.runtime.alignment import realigned
from distfit.runtime.failures import ClusterError
from distfit.runtime.memory import raise_mmap_threshold
from distfit.runtime.security import ENCRYPTED_SCHEMES, Transport, refusal, scheduler_address, scheme_of

TASK_RETRIES = 3

#: Environment of the worker processes of every local cluster distfit starts (``dask_client``'s
#: default ``worker_env``): leave out Dask's MALLOC_TRIM_THRESHOLD_=65536. Setting it also pins
#: glibc's mmap threshold at 128 KiB, so every array above that is mapped and page-faulted
#: afresh: block solves (k x k and m x k temporaries of 0.1-90 MB, thousands per block) ran
#: 45-55% slower with it (three marginals.yaml blocks: 5.7 -> 8.3 s, 5.9 -> 9.2 s), and a
#: release's chunk tasks made 2.3x the page faults. glibc's default reuses freed arrays. A
#: worker's memory stays flat either way (one task's arrays at a time).
WORKER_ENV: dict[str, str | None] = {"MALLOC_TRIM_THRESHOLD_": None}
LOW_LEVEL_LOG_LENGTH = 10  # Dask's developer message logs, while dask_client is open (see there)
#: The one interface every listener of a local cluster binds (scheduler, nannies, workers and
#: their HTTP servers): nothing distfit starts by itself is reachable from another machine.
LOCAL_HOST = "127.0.0.1"


@contextlib.contextmanager
def dask_client(cluster: str | None = None, workers: int | None = None, timeout: float = 10.0, log: TextIO | None = None,
                worker_env: dict[str, str | None] | None = WORKER_ENV, transport: Transport = Transport()):
    """A ``distributed.Client``: a new local multi-process cluster, or an existing scheduler.

    ``cluster`` is ``None`` (start ``local_cluster`` with ``workers`` processes, default: the
    machine's cores), a scheduler address, or the path of a scheduler file, reached as
    ``transport`` says (``connection_security``: TLS, or plain TCP only if allowed; a refusal
    is a :class:`ClusterError`). What was started or reached is printed to ``log``.
    ``worker_env`` (a local cluster only): environment
    variables to set (a string) or not to set (``None``) in the worker processes before they
    start (default ``WORKER_ENV``), over Dask's ``distributed.nanny.pre-spawn-environ`` (a variable already in this
    process's environment is inherited regardless: Dask lets the environment win).

    While the client is open, Dask's developer message logs are cut to ``LOW_LEVEL_LOG_LENGTH``
    entries (``distributed.admin.low-level-log-length``, default 1000, or less if set lower):
    every batched stream keeps its recent messages under 1 MB, and those hold the submitted
    tasks' arguments - the client's stream to the scheduler and, with a local cluster (whose
    scheduler runs in this process), the scheduler's stream to each worker. At 1000 messages
    the driver would keep the block specs of a plan's first ~1000 tasks alive, so its memory
    would grow with the number of blocks even when results are streamed into the store.
    """
    log = log or sys.stderr
    configured = dask.config.get("distributed.admin.low-level-log-length", None)
    length = LOW_LEVEL_LOG_LENGTH if configured is None else min(int(configured), LOW_LEVEL_LOG_LENGTH)
    with dask.config.set({"distributed.admin.low-level-log-length": length}):
        yield from _dask_client(cluster, workers, timeout, log, worker_env, transport)


def local_cluster(workers: int | None = None, worker_env: dict[str, str | None] | None = WORKER_ENV,
                  log: TextIO | None = None):
    """``LocalCluster(processes=True)`` with ``workers`` one-thread worker processes (default:
    the machine's cores) whose environment follows ``worker_env`` (``dask_client``): the one
    way distfit starts a local cluster. Returns the cluster (a context manager); says so on
    ``log`` if given.

    Every listener binds ``LOCAL_HOST`` (127.0.0.1): the scheduler, the nannies and the workers
    (``host``: Dask gives the workers and nannies the scheduler's host) and the HTTP servers
    Dask always runs beside the scheduler and each worker (health, metrics), which follow it.
    Decision: no dashboard. Nothing in distfit shows it (bokeh, which draws it, is not a
    dependency; the progress lines on stderr say how a job goes), so the scheduler's HTTP
    server serves no dashboard pages (``dashboard=False``) and sits on a free loopback port
    (``127.0.0.1:0``) rather than Dask's 8787, and workers start none. Plain TCP on loopback:
    see docs/deployment.md for what that leaves open on a machine shared with other users.
    Dask's own logs are silenced below CRITICAL: a task that fails would otherwise print its
    worker's "Compute Failed" record with the Python traceback; the driver reports the error
    in its one line instead."""
    count = workers or os.cpu_count() or 1
    settings = {f"distributed.nanny.pre-spawn-environ.{name}": value for name, value in (worker_env or {}).items()}
    with dask.config.set(settings):  # read by each Nanny when it is created (restarts included)
        cluster = LocalCluster(n_workers=count, threads_per_worker=1, processes=True, host=LOCAL_HOST,
                               dashboard_address=f"{LOCAL_HOST}:0", scheduler_kwargs={"dashboard": False},
                               worker_dashboard_address=None, silence_logs=logging.CRITICAL, preload=[__name__])
    if log is not None:
        print(f"distfit: local cluster with {count} worker processes on {LOCAL_HOST}", file=log)
    return cluster


def connection_security(cluster: str, transport: Transport = Transport()) -> Security:
    """The ``distributed.security.Security`` of a connection to the existing scheduler
    ``cluster`` (an address or a scheduler file) made as ``transport`` says: its TLS files, else
    Dask's configuration (``distributed.comm.tls``); encryption required unless
    ``transport.insecure``. Raises :class:`ClusterError` (one line) where
    :func:`distfit.runtime.security.refusal` refuses: a ``tls://`` scheduler without
    certificates, a plain one without ``insecure``."""
    files = ({"tls_ca_file": transport.ca_file, "tls_client_cert": transport.cert, "tls_client_key": transport.key}
             if transport.files else {})
    security = Security(require_encryption=not transport.insecure, **files)
    address = scheduler_address(cluster)
    if address is not None:  # an unreadable scheduler file: Dask says why when it is read
        problem = refusal(cluster, address, transport.insecure,
                          certificates=bool(security.tls_ca_file and security.tls_client_cert))
        if problem is not None:
            raise ClusterError(problem)
    return security


def _dask_client(cluster, workers, timeout, log, worker_env, transport):
    if cluster is None:
        count = workers or os.cpu_count() or 1
        with local_cluster(count, worker_env, log=log) as local, Client(local) as client:
            # WORKER_ENV leaves MALLOC_TRIM_THRESHOLD_ out, but a Dask nanny started earlier in
            # this process without it has already put it in os.environ, which workers inherit.
            _register_malloc_tuning(client, log)
            yield client
        return
    security = connection_security(cluster, transport)
    try:
        if os.path.exists(cluster):
            client = Client(scheduler_file=cluster, timeout=timeout, security=security)
        else:
            client = Client(cluster, timeout=timeout, security=security)
    except (OSError, TimeoutError, ValueError) as error:
        raise ClusterError(f"cluster: cannot reach the scheduler at {cluster!r}: {error}") from None
    with client:
        if transport.own:  # the job's own local cluster: on loopback, no dashboard (local_cluster)
            print(f"distfit: connected to this job's local cluster at {cluster}", file=log)
        else:
            how = "over TLS" if scheme_of(client.scheduler.address) in ENCRYPTED_SCHEMES else "over plain TCP (--insecure)"
            print(f"distfit: connected to {cluster} {how}; dashboard {client.dashboard_link}", file=log)
        # Workers started by someone else (dask worker, dask-jobqueue, Kubernetes) keep Dask's
        # MALLOC_TRIM_THRESHOLD_; raise their mmap threshold instead (WORKER_ENV).
        _register_malloc_tuning(client, log)
        yield client


def _register_malloc_tuning(client, log: TextIO) -> None:
    """Register ``malloc_tuning_plugin`` with the scheduler (it runs in every worker, present and
    future). It only buys speed, so a failure (a worker dying during the broadcast: the
    scheduler keeps the plugin for the workers that replace it) is reported, not raised."""
    try:
        client.register_plugin(malloc_tuning_plugin(), name="distfit-malloc-tuning")
    except Exception as error:  # noqa: BLE001 - see the docstring
        print(f"distfit: malloc tuning not registered on every worker ({type(error).__name__}: {error}); "
              "continuing", file=log)


class MallocTuning(WorkerPlugin):
    """A Dask worker plugin that runs ``raise_mmap_threshold`` in every worker of a cluster,
    present and future (``Client.register_plugin``)."""

    idempotent = True

    def setup(self, worker) -> None:
        raise_mmap_threshold()


def dask_setup(worker) -> None:
    """Dask preload hook (``LocalCluster(preload=["distfit.runtime.cluster"])``): the worker processes of a
    *local* cluster ignore SIGINT. Ctrl-C in a terminal reaches every process of its process
    group, and a local cluster's workers are in the driver's; the driver alone handles the
    interrupt (it stops the workers and says what was kept), so the workers must not die
    printing their own tracebacks. Workers of an existing cluster are left alone (their owner
    may stop them with Ctrl-C)."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGINT, signal.SIG_IGN)


def malloc_tuning_plugin() -> MallocTuning:
    """The worker plugin that raises the mmap threshold (:class:`MallocTuning`)."""
    return MallocTuning()


class BackgroundClient:
    """:func:`dask_client` run on a thread of its own, so the driver can do other work while a
    local cluster starts (its worker processes spawn and import for seconds) or a scheduler is
    reached, and while the cluster shuts down.

    The thread enters the context, hands the client over and holds the context open until
    ``close()``; it also leaves it (a client's context must be left by the thread that entered
    it). ``get()`` waits for the client and returns it, or raises what starting it raised (e.g.
    :class:`ClusterError`). ``close()`` asks the thread to leave the context and waits until it
    has (the workers are gone), raising what closing raised; ``close(wait=False)`` only asks, so
    the shutdown overlaps the driver's last work (a later ``close()`` waits for it). Use it as a
    context manager or call ``close()``. The client is not made the thread-local "current"
    client of the caller: pass it explicitly (``run_tasks`` does)."""

    def __init__(self, cluster: str | None = None, workers: int | None = None, timeout: float = 10.0,
                 log: TextIO | None = None, worker_env: dict[str, str | None] | None = WORKER_ENV,
                 transport: Transport = Transport()) -> None:
        self._client = None
        self._error: BaseException | None = None        # from starting
        self._close_error: BaseException | None = None  # from closing
        self._ready = threading.Event()
        self._leave = threading.Event()

        def hold() -> None:
            try:
                with dask_client(cluster, workers, timeout=timeout, log=log, worker_env=worker_env,
                                 transport=transport) as client:
                    self._client = client
                    self._ready.set()
                    self._leave.wait()
            except BaseException as error:  # noqa: BLE001 - handed to get() or close()
                if self._ready.is_set():
                    self._close_error = error
                else:
                    self._error = error
            finally:
                self._ready.set()

        self._thread = threading.Thread(target=hold, name="distfit-dask-client", daemon=True)
        self._thread.start()

    def get(self):
        """The client, once started (waits); raises what starting it raised."""
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self._client

    def close(self, wait: bool = True) -> None:
        self._leave.set()
        if wait:
            self._thread.join()
            error, self._close_error = self._close_error, None
            if error is not None:
                raise error

    def __enter__(self) -> "BackgroundClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def run_tasks(
    client,
    function: Callable,
    calls: Iterable[tuple[str, tuple]],
    name: str,
    max_in_flight: int | Callable[[], int] | None = None,
) -> Iterator[tuple[str, Any]]:
    """Submit ``function(*args)`` for every ``(label, args)``, one impure task each (unique key
    ``name-label-run``, ``TASK_RETRIES`` retries for lost workers); yield ``(label, result)`` as
    tasks complete, releasing each result from the cluster once it is read. A task's arguments
    are realigned where it runs (:func:`_realigned_call`).

    ``max_in_flight`` (a number, or a function asked before every submission) bounds how many
    tasks are submitted and not yet read: ``calls`` is then consumed lazily, one call per
    completed task (the next is submitted before a result is handed on, so the workers stay
    busy while the caller handles it), and neither the driver nor the scheduler ever holds
    more than that many calls' arguments. ``None``: submit everything at once.

    Tasks run in the order of ``calls`` (Dask priority ``-n`` for the n-th call): without it
    Dask orders submissions that reach the scheduler together by key name, as strings
    (``release-chunks-100`` before ``release-chunks-16``), and a release's checksum, hashed in
    chunk order as the chunks land, waited for the stragglers (1M PL94 units: chunk 40 done
    at 7.3 s, chunk 100 at 2.2 s; the hash then ran 1.3 s after the last chunk)."""
    # A task's arguments are its data (a block spec: the recon of a block holding the total has
    # a row for every query, 87 MiB on marginals.yaml), each sent once, to one task. Dask's
    # "Sending large graph" advice (load the data with Dask, or scatter it) does not apply:
    # scattered data dies with its worker, a task argument is resent on retry.
    warnings.filterwarnings("ignore", message="Sending large graph of size", category=UserWarning)
    run = uuid.uuid4().hex[:8]
    calls = iter(calls)
    futures: dict = {}
    pending = as_completed(loop=client.loop)  # not default_client(): the caller's client may be another thread's
    submitted = 0

    def limit() -> float:
        if max_in_flight is None:
            return float("inf")
        return max(1, max_in_flight() if callable(max_in_flight) else max_in_flight)

    def submit_more() -> None:
        nonlocal submitted
        cap = limit()
        while len(futures) < cap:
            try:
                label, args = next(calls)
            except StopIteration:
                return
            future = client.submit(_realigned_call, function, *args, key=f"{name}-{label}-{run}",
                                   retries=TASK_RETRIES, pure=False, priority=-submitted)
            submitted += 1
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


def _realigned_call(function: Callable, *args: Any) -> Any:
    """``function(*args)`` with the arrays in ``args`` aligned (:func:`distfit.runtime.alignment.realigned`):
    a worker unpickles them at any byte offset, and numpy rounds an unaligned array's sums otherwise."""
    return function(*realigned(args))


def on_every_worker(client, function: Callable, *args, name: str) -> list:
    """``function(*args)`` as one impure task per worker of ``client`` (at least one; keys
    ``name-i-run``, ``TASK_RETRIES`` retries): the futures of a value every task of a job
    depends on (the estimate's measurement model), made on every worker at once rather than on
    one and then copied to the others while they wait. Each task asks for its own worker
    loosely (``allow_other_workers``: the scheduler alone would put two quick tasks on one idle
    worker; a task whose worker is gone runs elsewhere). A task's arguments are its data
    (run_tasks): a result lost with its worker is made again from them."""
    warnings.filterwarnings("ignore", message="Sending large graph of size", category=UserWarning)
    run = uuid.uuid4().hex[:8]
    addresses: list = sorted(client.nthreads()) or [None]
    return [client.submit(function, *args, key=f"{name}-{i}-{run}", retries=TASK_RETRIES, pure=False,
                          workers=None if address is None else [address], allow_other_workers=True)
            for i, address in enumerate(addresses)]


def held_on_every_worker(client, value: Any, *, name: str) -> list:
    """``value`` held on every worker of ``client`` as a task's result (:func:`on_every_worker`
    of a task that returns its argument): the futures a job's tasks depend on, in turn
    (``futures[i % len(futures)]`` for the i-th), instead of carrying ``value`` as their
    argument. A submitted task's arguments stay in the driver until the task ends, so a large
    value (an estimate's measurement model; the multi-level estimate's job, 25 MB pickled for
    us_pl94) given to every task was pickled again for each and held once per task in flight:
    8.4 GiB of the driver at 1M blocks. Held this way it is pickled once per worker, and a copy
    lost with its worker is made again from its task. Each worker's copy is realigned where it
    lands (:func:`distfit.runtime.alignment.realigned`), so its tasks compute the driver's bits."""
    return on_every_worker(client, _held, value, name=name)


def _held(value: Any) -> Any:
    return realigned(value)


def compute_partitions(
    client,
    function: Callable,
    partitions: Iterable,
    args: tuple,
    *,
    errors: tuple[type[BaseException], ...],
    failure: Callable[[Any], Any],
    on_done: Callable[[], None] | None = None,
) -> tuple[dict[int, Any], tuple[int, Any] | None]:
    """Run ``function(partition, k, *args)`` on every partition ``k`` of a dask collection
    (``partitions``: its ``to_delayed()``), one task each, up to the first failure in partition
    order (the tabulation's pass over microdata, :mod:`distfit.data.microdata`).

    A task fails by raising one of ``errors`` (anything else propagates) or by returning a
    result for which ``failure(result)`` is not None. Returns ``(results by partition, first
    failure)``: every result read (a failing result included) and ``None`` or ``(k, exception
    or failure(result))`` for the lowest failing partition; ``on_done()`` is called after each
    task that did not fail. ``client`` None: in this process, one partition at a time in order
    (synchronous scheduler), stopping at the first failure. With a ``distributed.Client``: all
    tasks at once; once a failure at ``k`` is known the tasks of later partitions are cancelled
    and their outcomes ignored (an earlier partition's failure, found later, replaces it).
    """
    tasks = [dask.delayed(function, pure=False)(part, k, *args) for k, part in enumerate(partitions)]
    results: dict[int, Any] = {}
    found: tuple[int, Any] | None = None
    if client is None:
        for k, task in enumerate(tasks):
            try:
                (result,) = dask.compute(task, scheduler="synchronous")
            except errors as error:
                return results, (k, error)
            results[k] = result
            if failure(result) is not None:
                return results, (k, failure(result))
            if on_done is not None:
                on_done()
        return results, None
    futures = client.compute(tasks)
    where = {future.key: k for k, future in enumerate(futures)}
    for future in as_completed(futures):
        k = where[future.key]
        if found is not None and k > found[0]:
            continue
        if future.status == "error":
            error = future.exception()
            if not isinstance(error, errors):
                raise error
            found = (k, error)
        elif future.status == "finished":
            result = future.result()
            results[k] = result
            if failure(result) is not None:
                found = (k, failure(result))
            elif on_done is not None:
                on_done()
        if found is not None and found[0] == k:
            client.cancel([f for f in futures if where[f.key] > k and not f.done()])
    return results, found


def worker_threads(client) -> int:
    """The worker threads of ``client``'s cluster at this moment (it may grow or shrink)."""
    return sum(client.nthreads().values())
