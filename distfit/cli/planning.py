"""The planning command: ``distfit plan``.

The handler calls one library function and prints a short summary; all the work (and every
error) is the library's. It sits apart from the other pipeline commands
(``distfit.cli.commands``) and from ``distfit audit`` (``distfit.cli.auditing``) so that planning
imports only the solver, the planner, the plan store and (for a cluster) Dask: not the microdata
reader (dask.dataframe, pandas, pyarrow), the estimate stage (numba, jax), the report
(matplotlib) or ``distfit.pipeline.run``.
"""
from __future__ import annotations

import argparse

from distfit.cli.summary import format_number, print_summary
from distfit.plan.job import run_plan
from distfit.plan.rounds import BLOCK_GAP as DEFAULT_GAP_TOLERANCE
from distfit.spec.parse import load_spec


def cmd_plan(args: argparse.Namespace) -> int:
    """``distfit plan``: spec -> plan store (``distfit.plan.job.run_plan``) where ``args.placement``
    says; print its account."""
    gap = DEFAULT_GAP_TOLERANCE if args.gap_tolerance is None else args.gap_tolerance
    plan, checksum = run_plan(load_spec(args.spec), args.out, placement=args.placement, overwrite=args.overwrite,
                              refine_rounds=args.refine_rounds, gap_tolerance=gap)
    kind = plan.alpha_kind
    draft = [] if gap == DEFAULT_GAP_TOLERANCE else [
        ("draft" if gap > DEFAULT_GAP_TOLERANCE else "gap",
         f"every solved block within 1 + {gap:g} times the least privacy cost of its target shares "
         f"(--gap-tolerance; default {DEFAULT_GAP_TOLERANCE:g})")]
    print_summary(f"plan {args.out}", draft + [
        ("blocks", f"{plan.num_blocks}  ({plan.composition})"),
        ("privacy cost", f"alpha = {format_number(plan.alpha)}  [{kind}]   rho = {format_number(plan.rho)}"),
        ("max variance/target", f"{plan.max_variance_ratio:.6f}"),
        ("checksum", checksum),
        ("seconds", f"{plan.seconds:.1f}"),
    ])
    return 0

