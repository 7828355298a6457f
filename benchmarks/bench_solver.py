"""Benchmark ``distfit.solve`` against the published SM-II algorithm (paper 000, sections 6-7).

Usage::

    python benchmarks/bench_solver.py [--quick] [--paper-baseline-seconds S] [--only NAME]

For each workload it runs, in one process and one after the other:

1. ``distfit.solve(W, c, basis, method="auto")``: the default path (dual certificate, SM-II only
   when the dual has not closed the gap);
2. ``distfit.solve(..., method="smii")``: distfit's own SM-II polish, always run;
3. the published SM-II, reproduced with ``distfit.solver.smii.smii_optimize`` from the paper's initial
   point (identity covariance in the prefix basis, i.e. Q = I in the paper's section 6.3) with
   the paper's settings (unpreconditioned CG, 5 CG steps, TOL2 = 1e-10, t starting at 1 and
   multiplied by MU = 5 up to 2e5), capped by a wall-clock limit.

Then, for PL94 (paper targets) and the age pyramid, the baselines of the paper's tables 4 and 9
(Gaussian, hierarchical, total-error matrix mechanism) are run at distfit's alpha and their
maximum variance-to-target ratios are printed beside the paper's figures.

Timings are wall-clock on whatever else the machine is doing; nothing here asserts on them.
"""
from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
import warnings
from dataclasses import dataclass
from typing import Callable

import numpy as np
import scipy
import threadpoolctl

import distfit
from distfit.solver import dual as certificate
from distfit.solver import smii
from distfit.solver.baselines import compare_baselines, gaussian_mechanism
from distfit.solver.basis import represent
from distfit.solver.convergence import ConvergenceError
from distfit.solver.solve import BlockSolution, SolverStats, solve

from distfit.runtime.threads import blas_threads


def solver_threads(rank: int) -> int | None:
    """The BLAS thread count distfit.solve uses (DISTFIT_BLAS_THREADS, default 1)."""
    return blas_threads()


THREAD_RULE = "BLAS threads = distfit.runtime.threads.blas_threads() (DISTFIT_BLAS_THREADS, default 1)"
from distfit.mathematics.workload import (
    age_pyramid_workload,
    pl94_workload,
    prefix_workload,
    random_range_workload,
)

# The paper's SM-II settings (section 6.2, Algorithms 1-2 and the text after them).
PAPER_SETTINGS = dict(
    initial_sharpness=1.0,  # t1 = t2 = 1 at the start (relative to the balanced level)
    final_sharpness=2e5,
    growth=5.0,  # MU
    max_cg=5,  # MAXCG
    preconditioned=False,
    forcing=False,  # CG stops on TOL2 = 1e-10 or after MAXCG steps
)

# The paper's tables 4 and 9: max variance / target at SM-II's alpha.
PAPER_RATIOS = {
    "pl94": {"gaussian": 42.41, "hierarchical": 8.91, "matrix_mechanism": 4.64},
    "age": {"gaussian": 22.02, "hierarchical": 18.55, "matrix_mechanism": 5.30},
}
BASELINE_LABELS = {"gaussian": "GM", "hierarchical": "HM", "matrix_mechanism": "CA"}


@dataclass(frozen=True)
class Case:
    name: str
    description: str
    build: Callable[[], tuple[np.ndarray, np.ndarray]]
    basis: str
    quick: bool  # included with --quick


def _pl94_uniform():
    w = pl94_workload(uniform_target=1.0)
    return np.asarray(w.matrix), np.asarray(w.targets)


def _pl94_paper():
    w = pl94_workload()  # targets 1 / 2 / 4 (the paper's section 7.2)
    return np.asarray(w.matrix), np.asarray(w.targets)


def _age():
    w = age_pyramid_workload()  # targets 1 / 10 (the paper's section 7.5)
    return np.asarray(w.matrix), np.asarray(w.targets)


def _prefix1024():
    w = prefix_workload(1024)
    return np.asarray(w.matrix), np.asarray(w.targets)


def _ranges128():
    # the paper's section 7.3: 2 d random ranges, targets uniform(1, 10), basis U
    w = random_range_workload(128, 256, seed=0, targets="random")
    return np.asarray(w.matrix), np.asarray(w.targets)


CASES = [
    Case("pl94-uniform", "PL94 block, all targets 1", _pl94_uniform, "prefix", True),
    Case("pl94", "PL94, paper targets 1/2/4", _pl94_paper, "prefix", True),
    Case("age", "age pyramid, targets 1/10", _age, "prefix", True),
    Case("prefix1024", "prefix d=1024, targets 1", _prefix1024, "prefix", False),
    Case("ranges128", "256 random ranges d=128, targets U(1,10), seed 0", _ranges128, "prefix", True),
]
CASE_NAMES = [case.name for case in CASES]


def get_case(name: str) -> Case:
    for case in CASES:
        if case.name == name:
            return case
    raise SystemExit(f"unknown workload {name!r}; choose from {', '.join(CASE_NAMES)}")


# ---------------------------------------------------------------------------------------------


@dataclass
class DistfitRun:
    """One ``distfit.solve`` run: its wall seconds and either its solution or the error it failed with."""

    seconds: float
    solution: BlockSolution | None = None
    error: str = ""

    @property
    def stats(self) -> SolverStats:
        """The solver's statistics (all zero, stage empty, for a failed run)."""
        return self.solution.stats if self.solution is not None else SolverStats(0, 0, 0, float("nan"), self.seconds, "")

    @property
    def alpha(self) -> float:
        return self.solution.alpha if self.solution is not None else float("nan")

    @property
    def lower_bound(self) -> float:
        return self.solution.lower_bound if self.solution is not None else float("nan")

    @property
    def gap(self) -> float:
        return self.solution.gap if self.solution is not None else float("nan")


@dataclass
class PaperRun:
    seconds: float
    newton: int
    cg: int
    alpha: float
    converged: bool
    capped: bool


def run_distfit(W: np.ndarray, c: np.ndarray, basis: str, method: str) -> DistfitRun:
    start = time.perf_counter()
    try:
        solution = solve(W, c, basis=basis, method=method)
    except ConvergenceError as error:
        return DistfitRun(time.perf_counter() - start, error=str(error))
    return DistfitRun(solution.stats.seconds, solution)


def run_paper_smii(W: np.ndarray, c: np.ndarray, basis: str, seconds_cap: float) -> PaperRun:
    """The published SM-II: identity covariance in the basis, the paper's settings, a time cap.

    Timed like ``solve`` (representation included). BLAS threads follow ``solve``'s rule
    (``solver_threads``) so both run under the same conditions.
    """
    start = time.perf_counter()
    rank_bound = min(W.shape)
    with threadpoolctl.threadpool_limits(limits=solver_threads(rank_bound), user_api="blas"):
        representation = represent(W, basis)
    threads = solver_threads(representation.rank)
    scaled_recon = representation.recon / np.sqrt(c)[:, None]
    sigma0 = np.eye(representation.rank)  # Q = I; smii_optimize rescales it (balance)
    with threadpoolctl.threadpool_limits(limits=threads, user_api="blas"):
        remaining = seconds_cap - (time.perf_counter() - start)
        run = smii.smii_optimize(
            representation.basis,
            scaled_recon,
            sigma0,
            max_newton=10**9,  # the paper's MAXITER is not the limit here; the clock is
            time_limit=max(remaining, 0.0),
            **PAPER_SETTINGS,
        )
        alpha = certificate.plan_cost(representation.basis, scaled_recon, run.sigma)
    seconds = time.perf_counter() - start
    return PaperRun(seconds, run.newton_iterations, run.cg_iterations, alpha, run.converged, not run.converged)


# ---------------------------------------------------------------------------------------------


def fmt_seconds(x: float) -> str:
    return "-" if not np.isfinite(x) else (f"{x:.2f}" if x < 100 else f"{x:.0f}")


def fmt_pct(x: float, digits: int = 4) -> str:
    return "-" if not np.isfinite(x) else f"{100 * x:.{digits}f}"


def print_table(headers: list[str], rows: list[list[str]], right: set[int] | None = None) -> None:
    right = set(range(1, len(headers))) if right is None else right
    widths = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(cell.rjust(w) if i in right else cell.ljust(w) for i, (cell, w) in enumerate(zip(cells, widths)))

    print(line(headers))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    sys.stdout.flush()


def distfit_revision() -> str:
    """The git commit of the distfit checkout (read-only git calls), or '?' outside a checkout."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(distfit.__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--", "distfit"], capture_output=True,
                               text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"
    return head + (" + uncommitted changes in distfit/" if dirty else "")


def print_environment() -> None:
    print(f"distfit {getattr(distfit, '__version__', '?')}  numpy {np.__version__}  scipy {scipy.__version__}  "
          f"python {platform.python_version()}  ({platform.machine()}, {platform.system()})  "
          f"commit {distfit_revision()}")
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:
        usable = os.cpu_count()
    print(f"machine: os.cpu_count() = {os.cpu_count()} cores, {usable} usable by this process; "
          f"date {datetime.date.today().isoformat()}")
    print("BLAS thread pools (threadpoolctl.threadpool_info):")
    for pool in threadpoolctl.threadpool_info():
        print(f"  {pool.get('user_api')}/{pool.get('internal_api')} {pool.get('version')} "
              f"num_threads={pool.get('num_threads')} threading={pool.get('threading_layer', '-')} "
              f"arch={pool.get('architecture', '-')}  {pool.get('filepath')}")
    print(f"DISTFIT_BLAS_THREADS={os.environ.get('DISTFIT_BLAS_THREADS', '(unset)')}; solve() and the "
          f"published-SM-II run both use: {THREAD_RULE}")
    print()
    sys.stdout.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="skip prefix d=1024")
    parser.add_argument("--paper-baseline-seconds", type=float, default=60.0, metavar="S",
                        help="wall-clock cap for each published SM-II run (default 60; 0 skips it)")
    parser.add_argument("--only", choices=CASE_NAMES, metavar="NAME",
                        help=f"run one workload: {', '.join(CASE_NAMES)}")
    parser.add_argument("--repeat", type=int, default=1, metavar="N",
                        help="run distfit's auto solve N times and report the fastest (default 1)")
    parser.add_argument("--no-smii-path", action="store_true", help="skip distfit's method='smii' runs")
    parser.add_argument("--no-baselines", action="store_true", help="skip the GM/HM/CA comparison")
    args = parser.parse_args(argv)

    cases = [get_case(args.only)] if args.only else [c for c in CASES if c.quick or not args.quick]
    cap = args.paper_baseline_seconds
    print("distfit solver benchmark:", " ".join([os.path.basename(sys.argv[0])] + (argv if argv is not None else sys.argv[1:])))
    print_environment()

    results = {}
    for case in cases:
        W, c = case.build()
        rank = represent(W, case.basis).rank
        print(f"[{case.name}] {case.description}: m={W.shape[0]} d={W.shape[1]} rank={rank} basis={case.basis}", flush=True)
        auto = min((run_distfit(W, c, case.basis, "auto") for _ in range(max(args.repeat, 1))), key=lambda r: r.seconds)
        print(f"    distfit auto: {auto.seconds:.2f} s" + (f"  ERROR {auto.error}" if auto.error else ""), flush=True)
        smii_path = None
        if not args.no_smii_path:
            smii_path = run_distfit(W, c, case.basis, "smii")
            print(f"    distfit smii: {smii_path.seconds:.2f} s" + (f"  ERROR {smii_path.error}" if smii_path.error else ""), flush=True)
        paper = None
        if cap > 0:
            paper = run_paper_smii(W, c, case.basis, cap)
            print(f"    published SM-II: {paper.seconds:.2f} s, {paper.newton} Newton"
                  + (" (time cap)" if paper.capped else " (converged)"), flush=True)
        results[case.name] = (case, W, c, rank, auto, smii_path, paper)
    print()

    # Table 1: distfit's default solve.
    print("Table 1. distfit.solve(method='auto'): certified plans")
    rows = []
    for name, (case, W, c, rank, auto, _, _) in results.items():
        rows.append([
            name, f"{W.shape[0]}x{W.shape[1]}", str(rank), fmt_seconds(auto.seconds), str(auto.stats.dual_evaluations),
            str(auto.stats.newton_iterations), str(auto.stats.cg_iterations), f"{auto.alpha:.6f}", f"{auto.lower_bound:.6f}", fmt_pct(auto.gap),
            auto.stats.stage or "FAILED",
        ])
    print_table(["workload", "m x d", "rank", "seconds", "dual ev", "Newton", "CG", "alpha", "lower bound", "gap %", "stage"], rows)
    print()

    # Table 2: timings side by side.
    print("Table 2. Time to a plan: distfit auto | distfit SM-II path (method='smii') | published SM-II "
          f"(paper's start and settings, capped at {cap:g} s)")
    rows = []
    any_capped = False
    for name, (case, W, c, rank, auto, smii_path, paper) in results.items():
        row = [name, fmt_seconds(auto.seconds)]
        if smii_path is not None:
            row += [fmt_seconds(smii_path.seconds), str(smii_path.stats.newton_iterations), str(smii_path.stats.cg_iterations),
                    fmt_pct(smii_path.gap) if not smii_path.error else "FAILED"]
        else:
            row += ["-"] * 4
        if paper is not None:
            gap = paper.alpha / auto.lower_bound - 1.0 if np.isfinite(auto.lower_bound) else float("nan")
            speedup = paper.seconds / auto.seconds
            any_capped |= paper.capped
            row += [fmt_seconds(paper.seconds), str(paper.newton), str(paper.cg), f"{paper.alpha:.6f}", fmt_pct(gap, 3),
                    "time cap" if paper.capped else "finished",
                    (">=" if paper.capped else "") + (f"{speedup:.0f}x" if speedup >= 10 else f"{speedup:.2f}x")]
        else:
            row += ["-"] * 7
        rows.append(row)
    print_table(
        ["workload", "auto s", "smii s", "Newton", "CG", "gap %",
         "paper s", "Newton", "CG", "paper alpha", "gap vs LB %", "paper status", "speed-up"],
        rows,
    )
    print("  auto s / smii s: distfit.solve wall time; Newton, CG, gap % after 'smii s' belong to the SM-II path.")
    print("  paper alpha: privacy cost of the published SM-II's plan scaled to the targets (certificate.plan_cost);")
    print("  gap vs LB %: paper alpha / distfit's certified lower bound - 1; speed-up = paper s / auto s.")
    print("  paper status: 'finished' = it ran its t schedule up to 2e5 and stopped by itself (its plan can still be")
    print("       well above the optimum: see gap vs LB %); 'time cap' = stopped by the wall-clock cap.")
    if any_capped:
        print("  '>=': the published SM-II hit its time cap before converging (and its plan is still above the optimum),")
        print("       so paper s / auto s is only a LOWER BOUND on the speed-up.")
    print()

    # Table 3: baselines at distfit's alpha.
    if not args.no_baselines:
        rows = []
        notes = []
        for name, paper_name in (("pl94", "pl94"), ("age", "age")):
            if name not in results:
                continue
            case, W, c, rank, auto, _, _ = results[name]
            if not np.isfinite(auto.alpha):
                continue
            start = time.perf_counter()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                baselines = compare_baselines(W, c, auto.alpha)
            elapsed = time.perf_counter() - start
            cells = [name, f"{auto.alpha:.4f}"]
            for key in ("gaussian", "hierarchical", "matrix_mechanism"):
                ours = baselines[key].max_ratio
                extra = ""
                if key == "hierarchical":
                    extra = f" (b={int(baselines[key].info['branching'])})"
                cells.append(f"{ours:.2f}{extra}")
                cells.append(f"{PAPER_RATIOS[paper_name][key]:.2f}")
            cells.append(f"{elapsed:.1f}")
            rows.append(cells)
            plain = gaussian_mechanism(W, c, auto.alpha, least_squares=False).max_ratio
            notes.append(f"  {name}: GM without least-squares post-processing (every query keeps s^2) scores {plain:.2f}")
            for w in caught:
                print(f"  warning ({name}): {w.message}")
        if rows:
            print("Table 3. Max variance / target of the baselines at distfit's alpha (distfit scores 1.00)")
            print_table(["workload", "alpha", "GM ours", "GM paper", "HM ours", "HM paper", "CA ours", "CA paper", "seconds"], rows)
            print("  paper: tables 4 (PL94) and 9 (age pyramid) of the SM-II paper. HM: best branching b in 2..16 on this")
            print("  workload (the paper takes b from Qardaji et al.), which can only lower HM's ratio. GM ours: A = W with")
            print("  least-squares post-processing (free, so fair to GM).")
            for note in notes:
                print(note)
            print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
