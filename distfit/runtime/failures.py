"""The runtime's failures the command line maps to exit codes: a stage that failed on valid
input (``RunFailure``, exit code 1) and a cluster that cannot be reached (``ClusterError``, 2).

They live apart from ``distfit.pipeline.run`` and ``distfit.runtime.cluster`` (which raise them)
so that the command line can map them to exit codes without importing the pipeline or Dask and,
through them, every stage's dependencies (microdata: dask.dataframe, pandas, pyarrow; report:
matplotlib; estimate: numba): ``distfit --help`` imports none of them, and ``distfit plan`` and
``distfit audit`` only what they run.
"""
from __future__ import annotations

__all__ = ["ClusterError", "RunFailure"]


class RunFailure(RuntimeError):
    """A stage failed on valid input (e.g. the plan fails its audit): exit code 1."""


class ClusterError(RuntimeError):
    """The cluster named on the command line cannot be reached: exit code 2."""
