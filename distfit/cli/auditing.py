"""The audit command: ``distfit audit``.

A module of its own, apart from ``distfit plan`` (``distfit.cli.planning``), because the audit
reads a plan store and recomputes its claims with the audit's own code: it starts no cluster,
so it imports no Dask (checked by ``tests/cli/test_main.py`` on ``python -X importtime``). Given
a mask store (``distfit mask``) it recomputes that store's privacy account instead
(``distfit.audit.mask.audit_mask``).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from distfit.audit.mask import audit_mask
from distfit.audit.plan import audit_plan
from distfit.cli.errors import PROG
from distfit.cli.summary import format_number
from distfit.stores.files import root_attrs_on_disk
from distfit.stores.plan import StoreError


def cmd_audit(args: argparse.Namespace) -> int:
    """``distfit audit``: recompute a plan store's account (``distfit.audit.plan.audit_plan``); exit 1
    on a mismatch. A mask store's account is audited by ``distfit.audit.mask.audit_mask``."""
    try:
        report = audit_plan(args.plan)
    except StoreError:
        # Asked only once the store is refused as a plan (at its format, before any other
        # read): a plan's root attrs are parsed once (44 MB at 166,751 blocks: ~1 CPU-s).
        if (root_attrs_on_disk(Path(args.plan)) or {}).get("distfit_format") != "mask":
            raise
        report = audit_mask(args.plan)
    status = "passed" if report.ok else "FAILED"
    print(f"{PROG}: audit {status}: {report.path}: {report.checks} checks, {report.claim} {format_number(report.value)}")
    for failure in report.failures:
        print(f"  mismatch: {failure}")
    return 0 if report.ok else 1
