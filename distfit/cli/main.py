"""The ``distfit`` command line.

Subcommands: ``distfit solve`` plans one block with ``distfit.solve`` and prints its privacy
cost, certificate, privacy account and solver statistics (optionally the baselines at the same
privacy cost), as text, JSON (``--json``) and arrays (``--save``); ``distfit plan`` turns a
pipeline spec into a plan store (``distfit.plan.job``); ``distfit audit`` recomputes a plan
store's account (``distfit.audit``); ``distfit synth`` writes synthetic unit histograms for a
spec's schema (``distfit.stores.data``); ``distfit tabulate`` turns person-level microdata (CSV,
Parquet) into the marginal counts a release needs (``distfit.data.microdata``); ``distfit release``
adds noise to unit histograms, tabulated marginals or microdata through a plan and writes a
sealed, resumable release store (``distfit.release.job``); ``distfit report`` writes plots and an HTML page for a plan and optionally a release
(``distfit.report``); ``distfit run`` does plan, audit, data, release and report into one run
directory with a manifest (``distfit.pipeline``).

Exit codes: 0 success; 1 the solver could not certify its plan (``ConvergenceError``), an
output could not be written, or an audit found a mismatch; 2 bad input (unknown workload,
unreadable or malformed ``.npz`` or spec, conflicting budget flags, a ``ValueError`` from the
library, a block too large for memory, a plan or release already at ``--out``, an unreachable
scheduler, a plan that fails audit, data that does not fit the plan, bad microdata: a missing
column, a value outside its attribute's domain, an empty unit id, an unreadable file).
Every error is one line ``distfit: error: <message>`` on stderr. Output files are written to a
temporary file in the same directory and moved into place only once everything succeeded, so
no partial output file is ever left behind.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import re
import sys
import tempfile
import warnings
import zipfile
from dataclasses import asdict, dataclass
from typing import Any, Callable, Sequence

import numpy as np

from distfit import __version__
from distfit.privacy import Budget
from distfit.cluster import ClusterError
from distfit.solver.solve import ConvergenceError, default_memory_limit, estimated_memory, solve
from distfit.threads import blas_limit
from distfit.workload import (
    age_pyramid_workload,
    all_two_way_marginals,
    pl94_workload,
    prefix_workload,
    random_range_workload,
)

PROG = "distfit"

#: ``distfit.solve`` refuses a plan whose certified gap is above this (its ``max_gap``); a
#: looser ``--gap-tolerance`` raises it to match.
DEFAULT_MAX_GAP = 1e-3

WORKLOAD_HELP = (
    "a built-in workload: pl94 (PL94-171 style, targets 1/2/4), pl94-uniform (all targets 1), "
    "age-pyramid, prefix:N, ranges:D:M:SEED[:random] (M random ranges on D cells; targets 1, or "
    "uniform(1, 10) with :random), marginals:3x3x3 (all 2-way marginals of attributes of these "
    "sizes, targets 1); or a path to a .npz file with arrays W (m x d) and targets (m,)"
)


class UsageError(Exception):
    """Bad input: reported as one line on stderr, exit code 2."""


class OutputError(Exception):
    """An output file could not be written: one line on stderr, exit code 1."""


class _Parser(argparse.ArgumentParser):
    """An ArgumentParser whose errors become ``UsageError`` (one line, exit 2, no usage dump)."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(message)


# ---------------------------------------------------------------------------------------------
# workloads
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class LoadedWorkload:
    name: str
    source: str  # "builtin" or "npz"
    matrix: np.ndarray
    targets: np.ndarray


def _int_field(text: str, what: str, spec: str) -> int:
    if not re.fullmatch(r"[+-]?\d+", text.strip()):
        raise UsageError(f"workload {spec!r}: {what} must be an integer, got {text!r}")
    return int(text)


def _check_block_memory(spec: str, num_queries: int, num_cells: int) -> None:
    """Refuse a built-in workload too large to solve before building its matrix."""
    if num_queries < 1 or num_cells < 1:
        return  # the builder raises the precise ValueError
    needed = estimated_memory(num_queries, num_cells)
    limit = default_memory_limit()
    if needed > limit:
        raise MemoryError(
            f"workload {spec!r}: a {num_queries} x {num_cells} block needs about "
            f"{needed / 2**30:.1f} GiB of dense matrices, over the limit of {limit / 2**30:.1f} GiB; "
            "cut the workload into blocks (distfit plan, DESIGN.md section 2)"
        )


def _builtin(spec: str) -> Callable[[], Any] | None:
    """A zero-argument builder of the named built-in workload, or None if ``spec`` names none."""
    if spec == "pl94":
        return pl94_workload
    if spec == "pl94-uniform":
        return lambda: pl94_workload(uniform_target=1.0)
    if spec == "age-pyramid":
        return age_pyramid_workload
    kind, sep, rest = spec.partition(":")
    if not sep:
        return None
    if kind == "prefix":
        n = _int_field(rest, "N", spec)
        _check_block_memory(spec, n, n)
        return lambda: prefix_workload(n)
    if kind == "ranges":
        fields = rest.split(":")
        if len(fields) not in (3, 4):
            raise UsageError(f"workload {spec!r}: expected ranges:D:M:SEED or ranges:D:M:SEED:random")
        d = _int_field(fields[0], "D", spec)
        m = _int_field(fields[1], "M", spec)
        seed = _int_field(fields[2], "SEED", spec)
        if seed < 0:
            raise UsageError(f"workload {spec!r}: SEED must be >= 0, got {seed}")
        targets = fields[3] if len(fields) == 4 else "uniform"
        if targets not in ("uniform", "random"):
            raise UsageError(f"workload {spec!r}: the targets field must be 'uniform' or 'random', got {targets!r}")
        _check_block_memory(spec, m, d)
        return lambda: random_range_workload(d, m, seed, targets)
    if kind == "marginals":
        sizes = [_int_field(s, "every attribute size", spec) for s in rest.lower().split("x")]
        if any(s < 1 for s in sizes):
            raise UsageError(f"workload {spec!r}: attribute sizes must be >= 1, got {sizes}")
        num_cells = math.prod(sizes)
        num_queries = sum(a * b for i, a in enumerate(sizes) for b in sizes[i + 1:])
        _check_block_memory(spec, num_queries, num_cells)
        return lambda: all_two_way_marginals(sizes)
    return None


def _load_npz(path: str) -> LoadedWorkload:
    try:
        with open(path, "rb") as handle:
            magic = handle.read(6)
    except FileNotFoundError:
        raise UsageError(f"workload {path!r}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"workload {path!r}: is a directory, not a .npz file") from None
    except OSError as error:
        raise UsageError(f"workload {path!r}: cannot read it ({error.strerror or error})") from None
    if magic.startswith(b"\x93NUMPY"):
        raise UsageError(f"workload {path!r}: holds a single .npy array, not a .npz archive with W and targets")
    if not magic.startswith(b"PK"):
        raise UsageError(f"workload {path!r}: not a .npz archive (a zip of arrays W and targets)")
    try:
        archive = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise UsageError(f"workload {path!r}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"workload {path!r}: is a directory, not a .npz file") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
        raise UsageError(f"workload {path!r}: cannot read it as a .npz file ({error})") from None
    if not isinstance(archive, np.lib.npyio.NpzFile):
        raise UsageError(f"workload {path!r}: holds a single .npy array, not a .npz archive with W and targets")
    with archive:
        missing = [key for key in ("W", "targets") if key not in archive.files]
        if missing:
            found = ", ".join(archive.files) or "none"
            raise UsageError(f"workload {path!r}: missing array {' and '.join(missing)} (found: {found})")
        arrays = {}
        for key in ("W", "targets"):
            try:
                arrays[key] = np.asarray(archive[key])
            except (OSError, ValueError, EOFError, zipfile.BadZipFile) as error:
                raise UsageError(f"workload {path!r}: cannot read array {key} ({error})") from None
            if not (np.issubdtype(arrays[key].dtype, np.number) or arrays[key].dtype == bool):
                raise UsageError(f"workload {path!r}: array {key} is not numeric (dtype {arrays[key].dtype})")
    matrix, targets = arrays["W"], arrays["targets"]
    if matrix.ndim != 2:
        raise UsageError(f"workload {path!r}: W must be a 2-D (m x d) matrix, got shape {matrix.shape}")
    if targets.ndim != 1 or targets.shape[0] != matrix.shape[0]:
        raise UsageError(
            f"workload {path!r}: targets must have shape ({matrix.shape[0]},) (one per row of W), got {targets.shape}"
        )
    return LoadedWorkload(path, "npz", matrix.astype(float), targets.astype(float))


def load_workload(spec: str) -> LoadedWorkload:
    """Resolve WORKLOAD: a built-in name (see ``WORKLOAD_HELP``) or a path to a ``.npz`` file.

    Built-in names win over files of the same name; anything ending in ``.npz`` or naming an
    existing file is read as a ``.npz`` archive. Raises ``UsageError`` for anything else.
    """
    builder = _builtin(spec)
    if builder is not None:
        try:
            workload = builder()
        except ValueError as error:
            raise UsageError(f"workload {spec!r}: {error}") from None
        return LoadedWorkload(spec, "builtin", np.asarray(workload.matrix), np.asarray(workload.targets))
    if spec.endswith(".npz") or os.path.exists(spec):
        return _load_npz(spec)
    raise UsageError(
        f"unknown workload {spec!r}: use pl94, pl94-uniform, age-pyramid, prefix:N, ranges:D:M:SEED, "
        "marginals:AxBxC, or a path to a .npz file with arrays W and targets"
    )


# ---------------------------------------------------------------------------------------------
# budgets and outputs
# ---------------------------------------------------------------------------------------------

def _budget(args: argparse.Namespace) -> Budget | None:
    given = []
    if args.rho is not None:
        given.append("--rho")
    if args.epsilon is not None or args.delta is not None:
        given.append("--epsilon/--delta")
    if args.alpha is not None:
        given.append("--alpha")
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


def _check_output_path(flag: str, path: str | None) -> None:
    """Fail before the solve if an output cannot possibly be written."""
    if path is None:
        return
    if path == "" or path.endswith(os.sep):
        raise UsageError(f"{flag}: {path!r} is not a file name")
    if os.path.isdir(path):
        raise UsageError(f"{flag}: {path!r} is a directory")
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise UsageError(f"{flag}: directory {directory!r} does not exist")
    if not os.access(directory, os.W_OK):
        raise UsageError(f"{flag}: directory {directory!r} is not writable")


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _stage(path: str, write: Callable[[Any], None]) -> str:
    """Write via ``write(file)`` to a temporary file next to ``path``; return the temporary name."""
    directory = os.path.dirname(os.path.abspath(path))
    fd, temporary = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o666 & ~_current_umask())
    except BaseException:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        raise
    return temporary


def write_outputs(outputs: Sequence[tuple[str, str, Callable[[Any], None]]]) -> None:
    """Write every ``(flag, path, writer)`` atomically: all are staged to temporary files in
    their target directories first and moved into place (``os.replace``) only when all are
    staged, so a failure leaves neither a partial file nor a partial set of files."""
    staged: list[tuple[str, str]] = []
    try:
        for flag, path, write in outputs:
            try:
                staged.append((_stage(path, write), path))
            except OSError as error:
                raise OutputError(f"{flag}: cannot write {path!r}: {error.strerror or error}") from None
        for temporary, path in staged:
            os.replace(temporary, path)
    finally:
        for temporary, _ in staged:
            if os.path.exists(temporary):
                try:
                    os.unlink(temporary)
                except OSError:
                    pass


# ---------------------------------------------------------------------------------------------
# distfit solve
# ---------------------------------------------------------------------------------------------

BASIS_DESCRIPTIONS = {
    "auto": "orthonormal basis of W's row space",
    "identity": "unit rows, one per cell",
    "prefix": "upper-triangular ones",
    "custom": "given basis",
}


def _solve_report(args: argparse.Namespace) -> dict[str, Any]:
    budget = _budget(args)
    _check_output_path("--json", args.json)
    _check_output_path("--save", args.save)
    if args.json is not None and args.save is not None and os.path.abspath(args.json) == os.path.abspath(args.save):
        raise UsageError("--json and --save name the same file")
    workload = load_workload(args.workload)
    gap_tolerance = args.gap_tolerance
    if not (math.isfinite(gap_tolerance) and gap_tolerance > 0):
        raise UsageError(f"--gap-tolerance must be finite and > 0, got {gap_tolerance!r}")
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
        from distfit.solver.baselines import compare_baselines

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


def _fmt(value: float) -> str:
    return f"{value:.6g}"


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
        given = ", ".join(f"{k} = {_fmt(budget[k])}" for k in ("rho", "epsilon", "delta") if k in budget)
        allows = f" -> alpha {_fmt(budget['alpha'])}" if budget["kind"] != "alpha" else ""
        if budget["kind"] == "alpha":
            given = f"alpha = {_fmt(budget['alpha'])}"
        lines.append(f"  budget         {given}{allows}; every variance <= "
                     f"{_fmt(report['variance_scale'])} x its target")
        lines.append(f"  accuracy-first alpha {_fmt(report['alpha_accuracy_first'])} (variances = targets)")
    lines.append(f"  privacy cost   alpha = {_fmt(report['alpha'])}   rho = {_fmt(report['rho'])} (zCDP)")
    lines.append(f"  certificate    lower bound {_fmt(report['lower_bound'])} on the optimal alpha, "
                 f"gap {report['gap_percent']:.2g} %")
    lines.append(f"  max variance/target  {report['max_variance_ratio']:.6f}")
    lines.append("  (epsilon, delta)-DP, exact for the correlated Gaussian mechanism:")
    for row in report["privacy_account"]["epsilon_delta"]:
        lines.append(f"    delta = {row['delta']:<8.0e} epsilon = {row['epsilon']:.4f}")
    lines.append(f"    Renyi DP: epsilon(a) = {_fmt(report['rho'])} * a for every order a")
    lines.append(f"  solver         stage {s['stage']}, {s['seconds']:.2f} s, {s['dual_evaluations']} dual evaluations, "
                 f"{s['newton_iterations']} Newton iterations, {s['cg_iterations']} CG iterations")
    if report["baselines"] is not None:
        lines.append(f"  baselines at alpha = {_fmt(report['alpha'])}: max variance/target "
                     f"(distfit: {report['max_variance_ratio']:.4f})")
        for name, result in report["baselines"].items():
            extra = ""
            if "branching" in result["info"]:
                extra = f"  (branching {int(result['info']['branching'])})"
            lines.append(f"    {name:<18} {result['max_variance_ratio']:.4f}{extra}")
    for warning in report["warnings"]:
        lines.append(f"  note: {warning}")
    return "\n".join(lines)


def _cmd_solve(args: argparse.Namespace) -> int:
    report = _solve_report(args)
    print(format_solve_report(report))
    if args.json is not None:
        print(f"  wrote {args.json}")
    if args.save is not None:
        print(f"  wrote {args.save}")
    return 0


def _cmd_plan(args: argparse.Namespace) -> int:
    from distfit.plan.job import run_plan

    plan, checksum = run_plan(
        args.spec, args.out, cluster=args.cluster, workers=args.workers, overwrite=args.overwrite,
        serial=args.serial, refine_rounds=args.refine_rounds,
    )
    kind = "exact (evaluated cell by cell)" if plan.alpha_exact else "sum bound over blocks"
    print(f"{PROG}: plan {args.out}")
    print(f"  blocks         {len(plan.blocks)}  ({plan.composition})")
    print(f"  privacy cost   alpha = {_fmt(plan.alpha)}  [{kind}]   rho = {_fmt(plan.rho)}")
    print(f"  max variance/target  {float((plan.variances / plan.targets).max()):.6f}")
    print(f"  checksum       {checksum}")
    print(f"  seconds        {plan.seconds:.1f}")
    return 0


def _cmd_audit(args: argparse.Namespace) -> int:
    from distfit.audit import audit_plan

    report = audit_plan(args.plan)
    status = "passed" if report.ok else "FAILED"
    print(f"{PROG}: audit {status}: {report.path}: {report.checks} checks, alpha {_fmt(report.alpha)}")
    for failure in report.failures:
        print(f"  mismatch: {failure}")
    return 0 if report.ok else 1


def _cmd_synth(args: argparse.Namespace) -> int:
    import time

    from distfit.stores.data import read_histograms, write_synthetic
    from distfit.spec.parse import load_spec

    if args.units <= 0:
        raise UsageError(f"--units must be >= 1, got {args.units}")
    if args.chunk_units is not None and args.chunk_units <= 0:
        raise UsageError(f"--chunk-units must be >= 1, got {args.chunk_units}")
    if args.seed is not None and args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    started = time.perf_counter()
    spec = load_spec(args.spec)
    path = write_synthetic(spec, args.units, args.out, seed=args.seed, chunk_units=args.chunk_units,
                           overwrite=args.overwrite)
    seconds = time.perf_counter() - started
    data = read_histograms(path)
    attrs = data.attrs
    print(f"{PROG}: synth {path}")
    print(f"  units          {data.units}  (chunks of {data.chunk_units})")
    print(f"  cells          {data.cells}  ({' x '.join(map(str, attrs['schema']['sizes']))})")
    print(f"  total people   {attrs['total_people']}")
    print(f"  seed           {attrs['seed']}  (synthetic data, not private)")
    print(f"  seconds        {seconds:.1f}")
    return 0


def _cmd_release(args: argparse.Namespace) -> int:
    from distfit.release.job import run_release

    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if args.seed is not None and args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    result = run_release(
        args.plan, args.data, args.out, resume=args.resume, overwrite=args.overwrite, seed=args.seed,
        cluster=args.cluster, workers=args.workers, serial=args.serial,
    )
    rate = result.units_drawn / result.seconds if result.seconds > 0 else float("nan")
    print(f"{PROG}: release {result.path}")
    if result.tabulated is not None:
        print(f"  data           {result.data}  (microdata {args.data}, {result.tabulated})")
    print(f"  units          {result.units}  ({result.chunks} chunks, {result.chunks_drawn} drawn now"
          f"{', resumed' if result.resumed else ''})")
    print(f"  queries        {result.queries}  ({result.blocks} blocks)")
    print(f"  seconds        {result.seconds:.1f}  ({rate:.1f} units/s)")
    print(f"  plan checksum  {result.plan_checksum}")
    print(f"  checksum       {result.checksum}  (sealed)")
    if not result.private:
        print("  NOT PRIVATE    released with a fixed --seed (tests only)")
    return 0


def _cmd_tabulate(args: argparse.Namespace) -> int:
    import time

    from distfit.stores.data import read_marginals
    from distfit.data.microdata import tabulate_microdata
    from distfit.cluster import dask_client
    from distfit.spec.parse import load_spec

    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if args.chunk_units is not None and args.chunk_units <= 0:
        raise UsageError(f"--chunk-units must be >= 1, got {args.chunk_units}")
    if args.serial and (args.cluster is not None or args.workers is not None):
        raise UsageError("--serial excludes --cluster and --workers")
    started = time.perf_counter()
    spec = load_spec(args.spec)
    if args.level is not None:
        try:
            spec = spec.level_spec(args.level)
        except KeyError:
            names = ", ".join(level.name for level in spec.levels) or "none: not a multi-level spec"
            raise UsageError(f"--level: no level {args.level!r} (levels: {names})") from None
    cover = []
    if args.plan is not None:
        from distfit.stores.plan import read_plan

        plan = read_plan(args.plan)
        cover = [plan.block(block_id).attributes for block_id in plan.block_ids]
    with (contextlib.nullcontext() if args.serial else dask_client(args.cluster, args.workers)) as client:
        path = tabulate_microdata(spec, args.data, args.out, client=client, chunk_units=args.chunk_units,
                                  overwrite=args.overwrite, cover=cover)
    seconds = time.perf_counter() - started
    data = read_marginals(path)
    attrs = data.attrs
    largest = max(data.clique_cells(i) for i in range(len(data.cliques)))
    print(f"{PROG}: tabulate {path}")
    print(f"  source         {args.data}  ({attrs['source']['format']}, {attrs['source']['rows']} rows)")
    print(f"  units          {data.units}  (chunks of {data.chunk_units})")
    shown = "; ".join(" x ".join(c) or "total" for c in data.cliques[:4])
    print(f"  cliques        {len(data.cliques)}  (largest {largest} cells): {shown}"
          + ("; ..." if len(data.cliques) > 4 else ""))
    print(f"  seconds        {seconds:.1f}")
    return 0


def _cmd_report(args: argparse.Namespace) -> int:
    from distfit.report import write_report

    result = write_report(args.plan, args.out, release_path=args.release, data_path=args.data)
    print(f"{PROG}: report {result.path}/index.html")
    print(f"  plots          {len(result.plots)}  ({', '.join(result.plots)})")
    if result.calibration is not None:
        c = result.calibration
        print(f"  calibration    {c['within_1.96sd']:.2%} of {c['count']} answers within 1.96 sd "
              f"(95% expected), {c['within_1sd']:.2%} within 1 sd (68.3%)")
    if result.baselines:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(result.baselines.items()))
        print(f"  baselines      max variance/target: {shown}")
    else:
        print(f"  baselines      {result.baseline_note}")
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from distfit.pipeline import RunFailure, run_levels, run_pipeline
    from distfit.spec.parse import load_spec

    if args.units is not None and args.units <= 0:
        raise UsageError(f"--units must be >= 1, got {args.units}")
    if args.workers is not None and args.workers < 1:
        raise UsageError(f"--workers must be >= 1, got {args.workers}")
    if args.serial and (args.cluster is not None or args.workers is not None):
        raise UsageError("--serial excludes --cluster and --workers")
    multilevel = args.spec is not None and load_spec(args.spec).multilevel
    try:
        run = run_levels if multilevel else run_pipeline
        result = run(args.spec, args.out, data=args.data, units=args.units, cluster=args.cluster,
                     workers=args.workers, serial=args.serial)
    except RunFailure as error:
        _error(error)
        return 1
    if multilevel:
        account = result.account
        print(f"{PROG}: run {result.rundir} ({len(result.levels)} levels, sequential composition)")
        print(f"  spec hash      {result.spec_hash}")
        print(f"  people         {result.people}")
        for name, level in result.levels.items():
            print(f"  level {name:<9s} alpha {account['levels'][name]:.6g}  {level.rundir}  "
                  f"(plan {level.stages.get('plan')}, release {level.stages.get('release')})")
            print(f"                 report {os.path.join(level.report, 'index.html')}")
        print(f"  privacy        alpha {account['alpha']:.6g} ({'exact' if account['alpha_exact'] else 'sum bound'}), "
              f"rho {account['rho']:.6g}")
        print(f"  manifest       {result.manifest}")
        print(f"  seconds        {result.timings.get('total', 0.0):.1f}")
        return 0
    stages = result.stages
    print(f"{PROG}: run {result.rundir}")
    print(f"  spec hash      {result.spec_hash}")
    print(f"  plan           {result.plan}  ({stages.get('plan')}, audit {stages.get('audit')})")
    print(f"  data           {result.data}  ({stages.get('data')})")
    print(f"  release        {result.release}  ({stages.get('release')})")
    print(f"  manifest       {result.manifest}")
    print(f"  plan checksum  {result.plan_checksum}")
    print(f"  release checksum  {result.release_checksum}")
    print(f"  seconds        {result.timings.get('total', 0.0):.1f}")
    print(f"  report         {os.path.join(result.report, 'index.html')}")
    return 0


# ---------------------------------------------------------------------------------------------
# entry point
# ---------------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Differentially private linear-query release with per-query variance targets.",
    )
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    solve_parser = commands.add_parser(
        "solve",
        help="plan one block: optimal noise covariance, certificate and privacy account",
        description="Solve one block (distfit.solve) and report its privacy cost alpha, the certified "
                    "lower bound and gap, the exact privacy account and the solver statistics.",
    )
    solve_parser.add_argument("workload", metavar="WORKLOAD", help=WORKLOAD_HELP)
    solve_parser.add_argument("--basis", choices=("auto", "identity", "prefix"), default="auto",
                              help="basis B of the mechanism L (B x + z) (default: auto)")
    solve_parser.add_argument("--rho", type=float, help="zCDP budget: alpha = 2 rho, variances scaled to fit")
    solve_parser.add_argument("--epsilon", type=float, help="(epsilon, delta) budget, with --delta (exact)")
    solve_parser.add_argument("--delta", type=float, help="(epsilon, delta) budget, with --epsilon")
    solve_parser.add_argument("--alpha", type=float, help="privacy-cost budget alpha = Delta^2")
    solve_parser.add_argument("--gap-tolerance", type=float, default=1e-4, metavar="G",
                              help="stop once the certified relative gap is <= G (default 1e-4); "
                                   f"a plan above max(G, {DEFAULT_MAX_GAP:g}) is an error")
    solve_parser.add_argument("--json", metavar="OUT.json", help="write the report as JSON")
    solve_parser.add_argument("--save", metavar="OUT.npz",
                              help="write sigma, basis, recon, targets, profile, variances")
    solve_parser.add_argument("--baselines", action="store_true",
                              help="also run the Gaussian, hierarchical and matrix mechanisms at the same alpha")
    solve_parser.set_defaults(handler=_cmd_solve)

    plan_parser = commands.add_parser(
        "plan", help="plan a pipeline spec: blocks on a Dask cluster, stitched account, Zarr plan store",
        description="Decompose the spec's workload into blocks, solve them on a Dask cluster and write the plan store.",
    )
    plan_parser.add_argument("spec", metavar="SPEC.yaml")
    plan_parser.add_argument("--out", required=True, metavar="PLAN.zarr")
    plan_parser.add_argument("--cluster", metavar="ADDRESS|FILE", help="scheduler address or scheduler file (default: a local multi-process cluster)")
    plan_parser.add_argument("--workers", type=int, metavar="N", help="worker processes of the local cluster (default: cores)")
    plan_parser.add_argument("--overwrite", action="store_true", help="replace a plan already at --out")
    plan_parser.add_argument("--serial", action="store_true", help="solve the blocks in this process, without Dask")
    plan_parser.add_argument("--refine-rounds", type=int, default=1, metavar="R", help="target-share refinement rounds (default 1)")
    plan_parser.set_defaults(handler=_cmd_plan)

    audit_parser = commands.add_parser(
        "audit", help="recompute a plan's profiles, alpha and variances from its stored arrays; exit 1 on mismatch",
    )
    audit_parser.add_argument("plan", metavar="PLAN.zarr")
    audit_parser.set_defaults(handler=_cmd_audit)

    synth_parser = commands.add_parser(
        "synth", help="write synthetic unit histograms with the spec's schema (not private data)",
        description="Synthesise N units (skewed populations and categories, correlated attributes) as a "
                    "Zarr histograms store (units x cells), chunk by chunk, atomically.",
    )
    synth_parser.add_argument("spec", metavar="SPEC.yaml")
    synth_parser.add_argument("--units", required=True, type=int, metavar="N", help="number of units (>= 1)")
    synth_parser.add_argument("--out", required=True, metavar="DATA.zarr")
    synth_parser.add_argument("--seed", type=int, metavar="S", help="seed (default: fresh, stored in the data)")
    synth_parser.add_argument("--chunk-units", type=int, metavar="C",
                              help="units per chunk (default: up to 4096, at most 16 MiB of counts)")
    synth_parser.add_argument("--overwrite", action="store_true", help="replace data already at --out")
    synth_parser.set_defaults(handler=_cmd_synth)

    release_parser = commands.add_parser(
        "release", help="release noisy answers for every unit: plan + data -> sealed Zarr release store",
        description="Per block and chunk of units draw z = chol(Sigma) xi and write L (B x + z) and each "
                    "query's answer to a release store (one Dask task per chunk); resumable, sealed with a checksum.",
    )
    release_parser.add_argument("plan", metavar="PLAN.zarr")
    release_parser.add_argument("--data", required=True, metavar="DATA",
                                help="a data store (distfit synth or distfit tabulate), or microdata: .csv, .csv.gz, "
                                     ".parquet, .pq or a directory of Parquet files (tabulated into RELEASE.zarr.data.zarr)")
    release_parser.add_argument("--out", required=True, metavar="RELEASE.zarr")
    release_parser.add_argument("--resume", action="store_true",
                                help="finish an interrupted release at --out (written chunks are kept, missing ones drawn)")
    release_parser.add_argument("--overwrite", action="store_true", help="replace a release already at --out")
    release_parser.add_argument("--seed", type=int, metavar="S",
                                help="fixed noise seed, FOR TESTS ONLY: the release is marked not private")
    release_parser.add_argument("--cluster", metavar="ADDRESS|FILE", help="scheduler address or scheduler file (default: a local multi-process cluster)")
    release_parser.add_argument("--workers", type=int, metavar="N", help="worker processes of the local cluster (default: cores)")
    release_parser.add_argument("--serial", action="store_true", help="release the chunks in this process, without Dask")
    release_parser.set_defaults(handler=_cmd_release)

    tabulate_parser = commands.add_parser(
        "tabulate", help="tabulate person-level microdata (CSV, Parquet) into per-unit marginal counts",
        description="Read microdata (one row per person: the spec's attribute columns and unit column) in "
                    "partitions and write, per unit, the counts of each maximal query clique as a Zarr "
                    "marginals store (atomically); bad rows are reported by line.",
    )
    tabulate_parser.add_argument("spec", metavar="SPEC.yaml")
    tabulate_parser.add_argument("--data", required=True, metavar="PEOPLE",
                                 help="microdata: .csv, .csv.gz, .parquet, .pq or a directory of Parquet files")
    tabulate_parser.add_argument("--out", required=True, metavar="DATA.zarr")
    tabulate_parser.add_argument("--plan", metavar="PLAN.zarr",
                                 help="also hold a marginal for every block of this plan (merged blocks)")
    tabulate_parser.add_argument("--chunk-units", type=int, metavar="C",
                                 help="units per chunk (default: up to 4096, at most 16 MiB per chunk)")
    tabulate_parser.add_argument("--overwrite", action="store_true", help="replace marginals already at --out")
    tabulate_parser.add_argument("--level", metavar="NAME",
                                 help="for a multi-level spec: the level to tabulate (its unit column and tables)")
    tabulate_parser.add_argument("--cluster", metavar="ADDRESS|FILE", help="scheduler address or scheduler file (default: a local multi-process cluster)")
    tabulate_parser.add_argument("--workers", type=int, metavar="N", help="worker processes of the local cluster (default: cores)")
    tabulate_parser.add_argument("--serial", action="store_true", help="tabulate in this process, without a cluster")
    tabulate_parser.set_defaults(handler=_cmd_tabulate)

    report_parser = commands.add_parser(
        "report", help="plots + HTML report of a plan (and optionally a release)",
        description="Write DIR/index.html and PNG plots: the privacy curve and account, alpha per block, "
                    "variance/target (with baselines for small workloads), solver statistics and, with a "
                    "release, noisy answers with 95% intervals. Written atomically; DIR may be missing, "
                    "empty or an earlier report (replaced); any other non-empty DIR is refused.",
    )
    report_parser.add_argument("plan", metavar="PLAN.zarr")
    report_parser.add_argument("release", metavar="RELEASE.zarr", nargs="?", default=None)
    report_parser.add_argument("--out", required=True, metavar="DIR")
    report_parser.add_argument("--data", metavar="DATA.zarr",
                               help="the release's data store: adds the calibration section (actual error of "
                                    "each answer against its promised sd; CONFIDENTIAL, for validation only)")
    report_parser.set_defaults(handler=_cmd_report)

    run_parser = commands.add_parser(
        "run", help="the main job: plan + audit + (synthetic) data + release into RUNDIR, with a manifest",
        description="Plan the spec (default: the embedded PL94 pipeline), audit the plan, synthesise data "
                    "unless --data is given, release, and write RUNDIR/manifest.json. A rerun into the same "
                    "RUNDIR reuses the plan and data, resumes a partial release and skips a sealed one.",
    )
    run_parser.add_argument("spec", metavar="SPEC.yaml", nargs="?", default=None,
                            help="pipeline spec (default: the embedded default pipeline, PL94)")
    run_parser.add_argument("--out", required=True, metavar="RUNDIR")
    run_parser.add_argument("--data", metavar="DATA",
                            help="a data store, or microdata (.csv, .csv.gz, .parquet, .pq, a directory of Parquet "
                                 "files) tabulated into RUNDIR/data.zarr (default: synthesise RUNDIR/data.zarr)")
    run_parser.add_argument("--units", type=int, metavar="N",
                            help="units of synthetic data (default 10000; a rerun reuses the earlier data)")
    run_parser.add_argument("--cluster", metavar="ADDRESS|FILE", help="scheduler address or scheduler file (default: a local multi-process cluster)")
    run_parser.add_argument("--workers", type=int, metavar="N", help="worker processes of the local cluster (default: cores)")
    run_parser.add_argument("--serial", action="store_true", help="plan and release in this process, without Dask")
    run_parser.set_defaults(handler=_cmd_run)
    return parser


def _error(message: str) -> None:
    text = " ".join(str(message).split()) or "unknown error"
    print(f"{PROG}: error: {text}", file=sys.stderr)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (0 ok, 1 solver/output failure, 2 bad input)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except UsageError as error:
        _error(error)
        return 2
    except SystemExit as exit_:  # --help, --version
        return exit_.code if isinstance(exit_.code, int) else 0
    if getattr(args, "handler", None) is None:
        _error("a command is required: solve, plan, audit, synth, tabulate, release, report or run (see distfit --help)")
        return 2
    try:
        with blas_limit():
            return args.handler(args)
    except UsageError as error:
        _error(error)
        return 2
    except ConvergenceError as error:
        _error(error)
        return 1
    except (FileExistsError, ClusterError) as error:
        _error(error)
        return 2
    except MemoryError as error:
        _error(str(error) or "out of memory: the block is too large; cut the workload into blocks")
        return 2
    except ValueError as error:
        _error(error)
        return 2
    except (OutputError, np.linalg.LinAlgError) as error:
        _error(error)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())
