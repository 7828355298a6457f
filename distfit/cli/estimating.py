"""The estimate command: ``distfit estimate``.

The handler calls one library function where ``args.placement`` says and prints a short
summary; all the work (and every error) is the library's. It sits apart from the other pipeline
commands (``distfit.cli.commands``) so that ``distfit estimate`` imports only the estimate job
and the stores it reads: not the microdata reader (dask.dataframe, pandas, pyarrow), the report
(matplotlib) or ``distfit.pipeline.run``, and no Dask unless a cluster is used
(``distfit.runtime.placement``). Memory matters here: importing dask.dataframe starts pyarrow's
mimalloc pool, which reserves 1 GiB of address space at once, a quarter of the 4 GiB RLIMIT_AS
that Adult's estimate runs under in tests/estimate/test_wide.py (benchmarks/README.md, issue 26);
for the same cap the command's threads share two malloc arenas
(:func:`distfit.runtime.memory.limit_malloc_arenas`).
"""
from __future__ import annotations

import argparse

from distfit.cli.summary import print_summary
from distfit.estimate.job import run_estimate
from distfit.runtime.memory import limit_malloc_arenas


def cmd_estimate(args: argparse.Namespace) -> int:
    """``distfit estimate``: plan + sealed release -> sealed estimate store
    (``distfit.estimate.job.run_estimate``)."""
    limit_malloc_arenas()  # before the store's and the cluster's threads start (distfit.runtime.memory)
    result = run_estimate(args.plan, args.release, args.out, integer=args.integer, resume=args.resume,
                          overwrite=args.overwrite, method=args.method, placement=args.placement)
    rate = result.units_done_now / result.seconds if result.seconds > 0 else float("nan")
    fit = result.fit
    print_summary(f"estimate {result.path}", [
        ("units", f"{result.units}  ({result.chunks} chunks, {result.chunks_done_now} estimated now"
                  f"{', resumed' if result.resumed else ''})"),
        ("queries", f"{result.queries}  (cells {result.cells})"),
        ("method", f"{result.method}, {'integer' if result.integer else 'real'} estimates, nonnegative and consistent"),
        ("fit", f"objective mean {fit['objective_mean']:.6g}, at most {fit['iterations_max']} iterations, "
                f"{fit['unconverged_units']} units unconverged"),
        ("seconds", f"{result.seconds:.1f}  ({rate:.1f} units/s)"),
        ("release checksum", result.release_checksum),
        ("checksum", f"{result.checksum}  (sealed)"),
    ])
    return 0
