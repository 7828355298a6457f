"""``distfit export``: a sealed release or estimate -> CSV and Parquet tables with a data dictionary.

The handler of ``distfit export STORE --out DIR [--plan PLAN.zarr] [--overwrite]``
(``distfit.export.job.run_export``, docs/export.md); a module of its own so that only this
command imports pyarrow's writers (``distfit.cli.main``'s dispatch table).
"""
from __future__ import annotations

import argparse

from distfit.cli.summary import print_summary
from distfit.export.job import run_export


def cmd_export(args: argparse.Namespace) -> int:
    """``distfit export``: every table of the store as CSV and Parquet, and the data dictionary."""
    result = run_export(args.store, args.out, plan_path=args.plan, overwrite=args.overwrite)
    rate = result.rows / result.seconds if result.seconds > 0 else float("nan")
    print_summary(f"export {result.path}", [
        ("source", f"{result.kind}  ({result.units} units, checksum {result.checksum})"),
        ("tables", f"{len(result.tables)}  ({', '.join(name for name, _ in result.tables)})"),
        ("rows", f"{result.rows}  ({result.stated} with se and moe90)"),
        ("se", result.rule),
        ("bytes", f"{result.bytes:,}"),
        ("seconds", f"{result.seconds:.1f}  ({rate:,.0f} rows/s)"),
    ])
    return 0
