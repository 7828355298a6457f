"""The audit command: ``distfit audit``.

A module of its own, apart from ``distfit plan`` (``distfit.cli.planning``), because the audit
reads a plan store and recomputes its claims with the audit's own code: it starts no cluster,
so it imports no Dask (checked by ``tests/cli/test_main.py`` on ``python -X importtime``).
"""
from __future__ import annotations

import argparse

from distfit.audit.plan import audit_plan
from distfit.cli.errors import PROG
from distfit.cli.solve import format_number


def cmd_audit(args: argparse.Namespace) -> int:
    """``distfit audit``: recompute a plan store's account (``distfit.audit.plan.audit_plan``); exit 1
    on a mismatch."""
    report = audit_plan(args.plan)
    status = "passed" if report.ok else "FAILED"
    print(f"{PROG}: audit {status}: {report.path}: {report.checks} checks, alpha {format_number(report.alpha)}")
    for failure in report.failures:
        print(f"  mismatch: {failure}")
    return 0 if report.ok else 1
