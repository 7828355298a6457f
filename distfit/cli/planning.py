"""The planning commands: ``distfit plan`` and ``distfit audit``.

Each handler calls one library function and prints a short summary; all the work (and every
error) is the library's. They sit apart from the other pipeline commands
(``distfit.cli.commands``) so that planning and auditing import only the solver, the planner
and the plan store: not the microdata reader (dask.dataframe, pandas, pyarrow), the estimate
stage (numba, jax), the report (matplotlib) or ``distfit.pipeline.run``.
"""
from __future__ import annotations

import argparse

from distfit.audit.plan import audit_plan
from distfit.cli.errors import PROG
from distfit.cli.solve import format_number
from distfit.cli.summary import print_summary
from distfit.plan.job import run_plan
from distfit.spec.parse import load_spec


def cmd_plan(args: argparse.Namespace) -> int:
    """``distfit plan``: spec -> plan store (``distfit.plan.job.run_plan``) where ``args.placement``
    says; print its account."""
    plan, checksum = run_plan(load_spec(args.spec), args.out, placement=args.placement, overwrite=args.overwrite,
                              refine_rounds=args.refine_rounds)
    kind = plan.alpha_kind
    print_summary(f"plan {args.out}", [
        ("blocks", f"{plan.num_blocks}  ({plan.composition})"),
        ("privacy cost", f"alpha = {format_number(plan.alpha)}  [{kind}]   rho = {format_number(plan.rho)}"),
        ("max variance/target", f"{plan.max_variance_ratio:.6f}"),
        ("checksum", checksum),
        ("seconds", f"{plan.seconds:.1f}"),
    ])
    return 0


def cmd_audit(args: argparse.Namespace) -> int:
    """``distfit audit``: recompute a plan store's account (``distfit.audit.plan.audit_plan``); exit 1
    on a mismatch."""
    report = audit_plan(args.plan)
    status = "passed" if report.ok else "FAILED"
    print(f"{PROG}: audit {status}: {report.path}: {report.checks} checks, alpha {format_number(report.alpha)}")
    for failure in report.failures:
        print(f"  mismatch: {failure}")
    return 0 if report.ok else 1
