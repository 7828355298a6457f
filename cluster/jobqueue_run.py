#!/usr/bin/env python
"""Run ``distfit run`` on workers started by dask-jobqueue (SLURM or PBS).

Each worker is its own batch job (``SLURMCluster`` / ``PBSCluster``, configured by
``cluster/slurm/jobqueue.yaml`` or ``cluster/pbs/jobqueue.yaml``); this script, the driver, runs
on a login node or in a small batch job of its own. It starts the cluster, asks for ``--jobs``
worker jobs, writes a scheduler file (``client.write_scheduler_file``) into the run directory and
then runs the pipeline against it, either in-process (``distfit.pipeline.run.run_pipeline``) or, with
``--subprocess``, by shelling out to ``distfit run --cluster <file>``.

    pip install dask-jobqueue          # optional extra, not a distfit dependency
    python cluster/jobqueue_run.py pipelines/marginals.yaml --out /shared/runs/m1 \\
        --system slurm --config cluster/slurm/jobqueue.yaml --jobs 4

The run directory must be on a filesystem every worker job can write.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

MISSING_JOBQUEUE = (
    "jobqueue_run.py: dask-jobqueue is not installed; it is an optional extra, not a distfit "
    "dependency. Install it with `pip install dask-jobqueue`, or use the batch scripts "
    "cluster/slurm/distfit-run.sbatch / cluster/pbs/distfit-run.pbs instead."
)


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
    parser.add_argument("--subprocess", action="store_true",
                        help="shell out to `distfit run --cluster FILE` instead of calling run_pipeline")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error(f"--jobs must be >= 1, got {args.jobs}")
    return args


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


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    cluster_cls = load_jobqueue(args.system)
    load_config(args.config)
    from distributed import Client

    os.makedirs(args.out, exist_ok=True)
    sched_file = os.path.join(args.out, "scheduler.json")
    with cluster_cls() as cluster, Client(cluster) as client:
        print(cluster.job_script(), file=sys.stderr)
        cluster.scale(jobs=args.jobs)
        client.write_scheduler_file(sched_file)
        print(f"jobqueue_run: scheduler file {sched_file}; dashboard {client.dashboard_link}", file=sys.stderr)
        client.wait_for_workers(args.wait_workers)
        try:
            if args.subprocess:
                command = ["distfit", "run"] + ([args.spec] if args.spec else [])
                command += ["--out", args.out, "--cluster", sched_file]
                if args.data:
                    command += ["--data", args.data]
                return subprocess.call(command)
            from distfit.pipeline.run import run_pipeline
            from distfit.runtime.placement import Placement

            result = run_pipeline(args.spec, args.out, data=args.data, placement=Placement(cluster=sched_file))
            print(f"jobqueue_run: done; manifest {result.manifest}", file=sys.stderr)
            return 0
        finally:
            if os.path.exists(sched_file):
                os.remove(sched_file)


if __name__ == "__main__":
    sys.exit(main())
