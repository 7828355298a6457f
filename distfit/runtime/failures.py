"""The failure of a pipeline stage on valid input (exit code 1).

It lives apart from ``distfit.pipeline.run`` (which raises it) so that the command line can map it to
its exit code without importing the pipeline and, through it, every stage's dependencies
(microdata: dask.dataframe, pandas, pyarrow; report: matplotlib; estimate: numba): ``distfit
plan`` and ``distfit audit`` import only what they run.
"""
from __future__ import annotations

__all__ = ["RunFailure"]


class RunFailure(RuntimeError):
    """A stage failed on valid input (e.g. the plan fails its audit): exit code 1."""
