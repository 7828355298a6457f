"""The release command: ``distfit release``.

The handler calls one library function where ``args.placement`` says and prints a short
summary; all the work (and every error) is the library's. It sits apart from the other pipeline
commands (``distfit.cli.commands``) so that ``distfit release`` imports only the release job,
the plan audit and the data stores (and the microdata reader): not the estimate stage (numba,
jax), the report (matplotlib) or ``distfit.pipeline.run``, and no Dask unless a cluster is used
or microdata is read (``distfit.runtime.placement``).
"""
from __future__ import annotations

import argparse

from distfit.cli.summary import print_summary
from distfit.release.job import run_release


def cmd_release(args: argparse.Namespace) -> int:
    """``distfit release``: plan + data -> sealed release store (``distfit.release.job.run_release``)."""
    result = run_release(
        args.plan, args.data, args.out, resume=args.resume, overwrite=args.overwrite, seed=args.seed,
        placement=args.placement,
    )
    rate = result.units_drawn / result.seconds if result.seconds > 0 else float("nan")
    tabulated = [] if result.tabulated is None else [("data", f"{result.data}  (microdata {args.data}, {result.tabulated})")]
    print_summary(f"release {result.path}", tabulated + [
        ("units", f"{result.units}  ({result.chunks} chunks, {result.chunks_drawn} drawn now"
                  f"{', resumed' if result.resumed else ''})"),
        ("queries", f"{result.queries}  ({result.blocks} blocks)"),
        ("seconds", f"{result.seconds:.1f}  ({rate:.1f} units/s)"),
        ("plan checksum", result.plan_checksum),
        ("checksum", f"{result.checksum}  (sealed)"),
    ] + ([] if result.private else [("NOT PRIVATE", "released with a fixed --seed (tests only)")]))
    return 0
