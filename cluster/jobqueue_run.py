#!/usr/bin/env python
"""Run ``distfit run`` on workers started by dask-jobqueue (SLURM or PBS).

Each worker is its own batch job (``SLURMCluster`` / ``PBSCluster``, configured by
``cluster/slurm/jobqueue.yaml`` or ``cluster/pbs/jobqueue.yaml``); this script, the driver, runs
on a login node or in a small batch job of its own. It starts the cluster, asks for ``--jobs``
worker jobs, writes a scheduler file (``client.write_scheduler_file``) into the run directory and
then runs the pipeline against it, either in-process (``distfit.pipeline.run.run_pipeline``) or, with
``--subprocess``, by shelling out to ``distfit run --cluster <file>``.

    pip install dask-jobqueue cryptography   # optional extras, not distfit dependencies
    python cluster/jobqueue_run.py pipelines/marginals.yaml --out /shared/runs/m1 \\
        --system slurm --config cluster/slurm/jobqueue.yaml --jobs 4

The run directory must be on a filesystem every worker job can write.

``--command "release PLAN --data D --out R --resume"`` runs that distfit command (split like a
shell would, ``--cluster`` and the TLS flags added) on the cluster instead of the pipeline.

Workers that never start (jobs the batch system refuses, or that stay pending) end the script
after ``--wait-timeout`` seconds (default 600) with one line naming the jobs and exit code 3;
cluster/slurm/local-test.sh and tests/cluster/test_slurm.py run all of this on a real SLURM.

Network (docs/deployment.md): the cluster speaks TLS with mutual authentication. By default its
certificate is made for this run (Dask's ``Security.temporary()``, which needs ``cryptography``):
the worker jobs read it from ``RUNDIR/.dask-tls`` (readable by you only; dask-jobqueue's
``shared_temp_directory``, files removed when the cluster closes), the driver from a private
temporary directory on this machine. ``--tls-ca-file/--tls-cert/--tls-key`` give a certificate
instead (one for scheduler, workers and driver, signed by that CA); ``--insecure`` runs plain
TCP. The scheduler listens on every interface of this machine (workers on other nodes must
reach it; dask-jobqueue's ``interface`` narrows it), its dashboard on 127.0.0.1:8787 only, and
the workers start no dashboard (their HTTP servers on loopback), unless the dask-jobqueue config
asks otherwise (``scheduler-options``' ``dashboard_address``, a ``--dashboard`` option in
``worker-extra-args``).
"""
from __future__ import annotations

import argparse
import os
import shlex
import subprocess
import sys
import tempfile

MISSING_JOBQUEUE = (
    "jobqueue_run.py: dask-jobqueue is not installed; it is an optional extra, not a distfit "
    "dependency. Install it with `pip install dask-jobqueue`, or use the batch scripts "
    "cluster/slurm/distfit-run.sbatch / cluster/pbs/distfit-run.pbs instead."
)
MISSING_CRYPTOGRAPHY = (
    "jobqueue_run.py: the run's TLS certificate is made with `cryptography`, which is not installed: "
    "`pip install cryptography`, or give --tls-ca-file, --tls-cert and --tls-key (or --insecure)"
)
#: Exit code when no worker joined within --wait-timeout (the jobs never started).
EXIT_NO_WORKERS = 3
#: Where the scheduler's dashboard listens unless the dask-jobqueue config says otherwise.
DASHBOARD_ADDRESS = "127.0.0.1:8787"
#: What every worker gets unless the config's worker-extra-args names a dashboard option: no
#: dashboard, and the HTTP server Dask starts anyway (health, metrics) on loopback.
WORKER_LOOPBACK_ARGS = ["--no-dashboard", "--dashboard-address", "127.0.0.1:0"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="jobqueue_run.py", description="distfit run on dask-jobqueue workers (SLURM or PBS)."
    )
    parser.add_argument("spec", metavar="SPEC.yaml", nargs="?", default=None,
                        help="pipeline spec (default: distfit's embedded spec)")
    parser.add_argument("--out", required=True, metavar="RUNDIR", help="run directory on a shared filesystem")
    parser.add_argument("--data", metavar="DATA.zarr", help="unit histograms (default: synthesise)")
    parser.add_argument("--system", choices=("slurm", "pbs"), default="slurm", help="batch system (default slurm)")
    parser.add_argument("--config", metavar="JOBQUEUE.yaml",
                        help="dask-jobqueue config file (e.g. cluster/slurm/jobqueue.yaml); "
                             "default: the user's dask config")
    parser.add_argument("--jobs", type=int, default=2, metavar="J", help="worker batch jobs to request (default 2)")
    parser.add_argument("--wait-workers", type=int, default=1, metavar="W",
                        help="wait until this many workers have joined before running (default 1)")
    parser.add_argument("--wait-timeout", type=float, default=600, metavar="SECONDS",
                        help="give up (exit 3) when fewer than --wait-workers joined after this long (default 600)")
    parser.add_argument("--command", metavar="'DISTFIT ARGS'",
                        help="run this distfit command on the cluster instead of the pipeline, e.g. "
                             "'release PLAN.zarr --data DATA.zarr --out RELEASE.zarr --resume'")
    parser.add_argument("--subprocess", action="store_true",
                        help="shell out to `distfit run --cluster FILE` instead of calling run_pipeline")
    parser.add_argument("--tls-ca-file", metavar="PEM", help="the cluster's CA certificate (default: one made for this run)")
    parser.add_argument("--tls-cert", metavar="PEM", help="the certificate scheduler, workers and driver show")
    parser.add_argument("--tls-key", metavar="PEM", help="its private key")
    parser.add_argument("--insecure", action="store_true",
                        help="plain TCP: unencrypted, and whoever reaches the scheduler can run code on the workers")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    if not args.wait_timeout > 0:
        parser.error(f"--wait-timeout must be > 0 seconds, got {args.wait_timeout}")
    if args.command is not None and (args.spec or args.data):
        parser.error("--command names its own inputs: leave out SPEC.yaml and --data")
    given = [args.tls_ca_file, args.tls_cert, args.tls_key]
    if any(given) and not all(given):
        parser.error("--tls-ca-file, --tls-cert and --tls-key go together")
    if args.insecure and any(given):
        parser.error("--insecure excludes --tls-ca-file, --tls-cert and --tls-key")
    return args


def cluster_security(args: argparse.Namespace):
    """The cluster's ``distributed.security.Security``: the certificate given (one for every
    role), else one made for this run; None with ``--insecure``."""
    from distributed.security import Security

    if args.insecure:
        return None
    if args.tls_cert:
        roles = {f"tls_{role}_{part}": path for role in ("client", "scheduler", "worker")
                 for part, path in (("cert", args.tls_cert), ("key", args.tls_key))}
        return Security(require_encryption=True, tls_ca_file=args.tls_ca_file, **roles)
    try:
        return Security.temporary()
    except ImportError:
        raise SystemExit(MISSING_CRYPTOGRAPHY) from None


def driver_transport(security, directory: str):
    """How the driver reaches the cluster (``distfit.runtime.security.Transport``): the files of
    ``security``, its in-memory certificate and key (``Security.temporary()``) written into
    ``directory`` (which only this user can read) first; plain TCP without security."""
    from distfit.runtime.security import Transport

    if security is None:
        return Transport(insecure=True)
    paths = []
    for value, name in ((security.tls_ca_file, "ca.pem"), (security.tls_client_cert, "cert.pem"),
                        (security.tls_client_key, "key.pem")):
        if "\n" in value:  # PEM contents, not a path
            path = os.path.join(directory, name)
            with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
                handle.write(value)
            value = path
        paths.append(value)
    return Transport(*paths)


def cluster_options(system: str, security, rundir: str) -> dict:
    """The keywords of dask-jobqueue's cluster class: ``security`` (and, for an in-memory
    certificate, ``shared_temp_directory`` ``RUNDIR/.dask-tls``, made readable by you only, where
    dask-jobqueue writes it for the worker jobs), the dashboard on loopback and no worker
    dashboards unless the config asks otherwise (module docstring)."""
    import dask.config

    scheduler_options = dict(dask.config.get(f"jobqueue.{system}.scheduler-options", None) or {})
    scheduler_options.setdefault("dashboard_address", DASHBOARD_ADDRESS)
    worker_args = list(dask.config.get(f"jobqueue.{system}.worker-extra-args", None) or [])
    if not any(str(arg).startswith(("--dashboard", "--no-dashboard")) for arg in worker_args):
        worker_args += WORKER_LOOPBACK_ARGS
    options = {"scheduler_options": scheduler_options, "worker_extra_args": worker_args}
    if security is not None:
        options["security"] = security
        shared = os.path.join(rundir, ".dask-tls")
        os.makedirs(shared, mode=0o700, exist_ok=True)
        os.chmod(shared, 0o700)
        options["shared_temp_directory"] = shared
    return options


def load_jobqueue(system: str):
    """The cluster class, imported lazily (dask-jobqueue is optional)."""
    try:
        import dask_jobqueue
    except ImportError:
        raise SystemExit(MISSING_JOBQUEUE) from None
    return dask_jobqueue.SLURMCluster if system == "slurm" else dask_jobqueue.PBSCluster


def load_config(path: str | None) -> None:
    if path is None:
        return
    import dask.config
    import yaml

    with open(path) as handle:
        dask.config.update(dask.config.config, yaml.safe_load(handle), priority="new")


def job_states(cluster, system: str) -> str:
    """``JOBID STATE REASON`` of each worker job the cluster submitted, as the batch system
    tells it (``squeue``; ``qstat`` on PBS); "none submitted" when it refused every submission."""
    ids = [job.job_id for job in cluster.workers.values() if getattr(job, "job_id", None)]
    if not ids:
        return "none submitted (the batch system refused them; its message is above)"
    command = ["squeue", "-h", "-o", "%i %T %r", "-j", ",".join(ids)] if system == "slurm" else ["qstat", *ids]
    try:
        out = subprocess.run(command, capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    return "; ".join(line.strip() for line in out.splitlines() if line.strip()) or ", ".join(ids)


def wait_for_workers(client, cluster, args: argparse.Namespace) -> None:
    """Wait until ``--wait-workers`` workers joined; after ``--wait-timeout`` seconds one line
    naming the jobs and their states, exit code 3 (:data:`EXIT_NO_WORKERS`), not a hang."""
    try:
        client.wait_for_workers(args.wait_workers, timeout=args.wait_timeout)
    except TimeoutError:
        joined = len(client.scheduler_info(n_workers=-1)["workers"])
        print(f"jobqueue_run.py: error: {joined} of {args.wait_workers} workers joined within "
              f"{args.wait_timeout:g} s (--wait-timeout); worker jobs: {job_states(cluster, args.system)}", file=sys.stderr)
        raise SystemExit(EXIT_NO_WORKERS) from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cluster_cls = load_jobqueue(args.system)
    load_config(args.config)
    from distributed import Client

    security = cluster_security(args)
    os.makedirs(args.out, exist_ok=True)
    sched_file = os.path.join(args.out, "scheduler.json")
    with tempfile.TemporaryDirectory(prefix="distfit-tls-") as private, \
            cluster_cls(**cluster_options(args.system, security, args.out)) as cluster, \
            Client(cluster, security=security) as client:
        print(cluster.job_script(), file=sys.stderr)
        cluster.scale(jobs=args.jobs)
        client.write_scheduler_file(sched_file)
        print(f"jobqueue_run: scheduler file {sched_file}; dashboard {client.dashboard_link}", file=sys.stderr)
        try:
            wait_for_workers(client, cluster, args)
            transport = driver_transport(security, private)
            if args.subprocess or args.command is not None:
                if args.command is not None:
                    command = ["distfit", *shlex.split(args.command)]
                else:
                    command = ["distfit", "run"] + ([args.spec] if args.spec else []) + ["--out", args.out]
                    command += ["--data", args.data] if args.data else []
                return subprocess.call(command + ["--cluster", sched_file, *transport.flags()])
            from distfit.pipeline.run import run_pipeline
            from distfit.runtime.placement import Placement

            result = run_pipeline(args.spec, args.out, data=args.data,
                                  placement=Placement(cluster=sched_file, transport=transport))
            print(f"jobqueue_run: done; manifest {result.manifest}", file=sys.stderr)
            return 0
        finally:
            if os.path.exists(sched_file):
                os.remove(sched_file)


if __name__ == "__main__":
    sys.exit(main())
