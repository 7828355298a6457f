"""``distfit solve``: plan one block and report it.

Solves the workload (``distfit.cli.workloads``) with ``distfit.solver.solve.solve`` and reports
its privacy cost alpha and rho = alpha / 2 (zCDP), the certified lower bound and gap, the exact
(epsilon, delta) account of the correlated Gaussian mechanism, the solver statistics and,
with ``--baselines``, the Gaussian, hierarchical and matrix mechanisms at the same alpha
(``distfit.solver.baselines``). The report is printed as text (``format_solve_report``),
written as JSON (``--json``) and the plan's arrays as ``.npz`` (``--save``), both atomically
(``distfit.cli.outputs``).
"""
from __future__ import annotations

import argparse
import json
import os
import warnings
from dataclasses import asdict
from typing import Any

import numpy as np

from distfit import __version__
from distfit.cli.errors import UsageError
from distfit.cli.main import DEFAULT_MAX_GAP
from distfit.cli.outputs import check_output_path, write_outputs
from distfit.cli.summary import format_number
from distfit.cli.workloads import load_workload
from distfit.mathematics.privacy import Budget
from distfit.solver.baselines import compare_baselines
from distfit.solver.solve import solve


def budget_from_args(args: argparse.Namespace) -> Budget | None:
    """The one budget given by ``--rho``, ``--epsilon --delta`` or ``--alpha``, or None (accuracy
    first: every variance equal to its target); ``UsageError`` for conflicting or half budgets."""
    flags = {"rho": "--rho", "epsilon/delta": "--epsilon/--delta", "alpha": "--alpha"}
    given = [flags[way] for way in Budget.ways_given(args.rho, args.epsilon, args.delta, args.alpha)]
    if len(given) > 1:
        raise UsageError(
            f"conflicting budget flags {' and '.join(given)}: give one budget "
            "(--rho R, --epsilon E --delta D, or --alpha A)"
        )
    if args.epsilon is not None and args.delta is None:
        raise UsageError("--epsilon needs --delta: an (epsilon, delta) budget gives both")
    if args.delta is not None and args.epsilon is None:
        raise UsageError("--delta needs --epsilon: an (epsilon, delta) budget gives both")
    if not given:
        return None
    return Budget(rho=args.rho, epsilon=args.epsilon, delta=args.delta, alpha=args.alpha)


#: what each basis kind is, for the summary's ``basis`` line
BASIS_DESCRIPTIONS = {
    "auto": "orthonormal basis of W's row space",
    "identity": "unit rows, one per cell",
    "prefix": "upper-triangular ones",
    "custom": "given basis",
}


def solve_report(args: argparse.Namespace) -> dict[str, Any]:
    """Solve the block named by ``args.workload`` (``distfit.solve``) and return the report that
    ``--json`` writes; ``--json`` and ``--save`` are written atomically, only after the solve (and
    the baselines) succeeded."""
    budget = budget_from_args(args)
    check_output_path("--json", args.json)
    check_output_path("--save", args.save)
    if args.json is not None and args.save is not None and os.path.abspath(args.json) == os.path.abspath(args.save):
        raise UsageError("--json and --save name the same file")
    workload = load_workload(args.workload)
    gap_tolerance = args.gap_tolerance  # finite and > 0 (distfit.cli.main.positive_number)
    max_gap = max(DEFAULT_MAX_GAP, gap_tolerance)
    solution = solve(
        workload.matrix, workload.targets, basis=args.basis, budget=budget,
        gap_tolerance=gap_tolerance, max_gap=max_gap,
    )
    m, d = workload.matrix.shape
    rank = int(solution.basis.shape[0])
    ratios = solution.variances / solution.targets
    account = solution.privacy_account()
    report: dict[str, Any] = {
        "distfit_version": __version__,
        "command": "solve",
        "workload": {"name": workload.name, "source": workload.source, "queries": m, "cells": d, "rank": rank},
        "basis": {"requested": args.basis, "kind": solution.basis_kind, "reduced": bool(solution.basis_reduced),
                  "rows": rank},
        "budget": None if budget is None else {**budget.to_dict(), "kind": budget.kind, "alpha": budget.to_alpha()},
        "alpha": float(solution.alpha),
        "rho": float(solution.rho),
        # Problem 1 (accuracy first): alpha with every variance <= its target
        "alpha_accuracy_first": float(solution.alpha * solution.variance_scale),
        "lower_bound": float(solution.lower_bound),
        "gap": float(solution.gap),
        "gap_percent": float(100.0 * solution.gap),
        "gap_tolerance": float(gap_tolerance),
        "variance_scale": float(solution.variance_scale),
        "max_variance_ratio": float(ratios.max()),
        "privacy_account": account.to_dict(),
        "solver": asdict(solution.stats),
        "baselines": None,
        "warnings": [],
    }
    if args.baselines:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results = compare_baselines(workload.matrix, workload.targets, solution.alpha)
        report["warnings"].extend(f"{w.category.__name__}: {w.message}" for w in caught)
        report["baselines"] = {
            name: {"max_variance_ratio": float(result.max_ratio), "alpha": float(result.alpha),
                   "strategy_shape": list(result.strategy_shape),
                   "info": {k: float(v) for k, v in result.info.items()}}
            for name, result in results.items()
        }
    outputs = []
    if args.json is not None:
        text = json.dumps(report, indent=2) + "\n"
        outputs.append(("--json", args.json, lambda handle: handle.write(text.encode("utf-8"))))
    if args.save is not None:
        arrays = {
            "sigma": solution.sigma, "basis": solution.basis, "recon": solution.recon,
            "targets": solution.targets, "profile": solution.profile, "variances": solution.variances,
        }
        outputs.append(("--save", args.save, lambda handle: np.savez(handle, **arrays)))
    write_outputs(outputs)
    return report


def format_solve_report(report: dict[str, Any]) -> str:
    """The human-readable summary printed by ``distfit solve``."""
    w, b, s = report["workload"], report["basis"], report["solver"]
    lines = [f"distfit {report['distfit_version']}: solve {w['name']}"]
    lines.append(f"  workload       {w['queries']} queries x {w['cells']} cells, rank {w['rank']}")
    basis = f"{b['kind']} ({BASIS_DESCRIPTIONS.get(b['kind'], b['kind'])}), {b['rows']} rows"
    if b["reduced"]:
        basis += ", reduced to W's row space"
    lines.append(f"  basis          {basis}")
    budget = report["budget"]
    if budget is not None:
        given = ", ".join(f"{k} = {format_number(budget[k])}" for k in ("rho", "epsilon", "delta") if k in budget)
        allows = f" -> alpha {format_number(budget['alpha'])}" if budget["kind"] != "alpha" else ""
        if budget["kind"] == "alpha":
            given = f"alpha = {format_number(budget['alpha'])}"
        lines.append(f"  budget         {given}{allows}; every variance <= "
                     f"{format_number(report['variance_scale'])} x its target")
        lines.append(f"  accuracy-first alpha {format_number(report['alpha_accuracy_first'])} (variances = targets)")
    lines.append(f"  privacy cost   alpha = {format_number(report['alpha'])}   rho = {format_number(report['rho'])} (zCDP)")
    lines.append(f"  certificate    lower bound {format_number(report['lower_bound'])} on the optimal alpha, "
                 f"gap {report['gap_percent']:.2g} %")
    lines.append(f"  max variance/target  {report['max_variance_ratio']:.6f}")
    lines.append("  (epsilon, delta)-DP, exact for the correlated Gaussian mechanism:")
    for row in report["privacy_account"]["epsilon_delta"]:
        lines.append(f"    delta = {row['delta']:<8.0e} epsilon = {row['epsilon']:.4f}")
    lines.append(f"    Renyi DP: epsilon(a) = {format_number(report['rho'])} * a for every order a")
    lines.append(f"  solver         stage {s['stage']}, {s['seconds']:.2f} s, {s['dual_evaluations']} dual evaluations, "
                 f"{s['newton_iterations']} Newton iterations, {s['cg_iterations']} CG iterations")
    if report["baselines"] is not None:
        lines.append(f"  baselines at alpha = {format_number(report['alpha'])}: max variance/target "
                     f"(distfit: {report['max_variance_ratio']:.4f})")
        for name, result in report["baselines"].items():
            extra = ""
            if "branching" in result["info"]:
                extra = f"  (branching {int(result['info']['branching'])})"
            lines.append(f"    {name:<18} {result['max_variance_ratio']:.4f}{extra}")
    for warning in report["warnings"]:
        lines.append(f"  note: {warning}")
    return "\n".join(lines)


def cmd_solve(args: argparse.Namespace) -> int:
    """``distfit solve``: solve, print the summary and name the files written."""
    report = solve_report(args)
    print(format_solve_report(report))
    if args.json is not None:
        print(f"  wrote {args.json}")
    if args.save is not None:
        print(f"  wrote {args.save}")
    return 0
