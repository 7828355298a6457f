"""Profile one ``distfit.solve`` call with pyinstrument and print the call tree.

Usage::

    python benchmarks/profile_solve.py [--workload pl94|pl94-uniform|age|prefix1024|ranges128]
                                       [--method auto|smii|dual] [--interval S] [--show-all]
                                       [--html FILE]

The workloads are those of ``benchmarks/bench_solver.py`` (same matrices, targets and bases).
pyinstrument is a sampling profiler: it adds little overhead, and the tree shows wall time per
call path (e.g. how much goes to ``certificate.evaluate_dual``'s eigendecomposition, to
``smii._hessian_operator`` products, or to ``basis.represent``).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_solver import get_case  # noqa: E402

WORKLOADS = {"pl94": "pl94", "pl94-uniform": "pl94-uniform", "age": "age", "prefix1024": "prefix1024", "ranges128": "ranges128"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Profile distfit.solve with pyinstrument.")
    parser.add_argument("--workload", choices=sorted(WORKLOADS), default="pl94",
                        help="pl94 = PL94 with the paper's targets 1/2/4 (default)")
    parser.add_argument("--method", choices=("auto", "smii", "dual"), default="auto")
    parser.add_argument("--interval", type=float, default=0.001, help="sampling interval in seconds (default 0.001)")
    parser.add_argument("--show-all", action="store_true", help="also show library frames (numpy, scipy)")
    parser.add_argument("--html", metavar="FILE", help="also write pyinstrument's interactive HTML report here")
    args = parser.parse_args(argv)

    try:
        from pyinstrument import Profiler
    except ImportError:
        print("profile_solve.py needs pyinstrument: pip install pyinstrument", file=sys.stderr)
        return 2

    from distfit.solver.solve import solve

    case = get_case(WORKLOADS[args.workload])
    W, c = case.build()
    print(f"profiling distfit.solve on {case.name} ({case.description}): m={W.shape[0]} d={W.shape[1]}, "
          f"basis={case.basis}, method={args.method}", flush=True)
    profiler = Profiler(interval=args.interval)
    profiler.start()
    try:
        solution = solve(W, c, basis=case.basis, method=args.method)
    finally:
        profiler.stop()
    s = solution.stats
    print(f"alpha {solution.alpha:.6f}, lower bound {solution.lower_bound:.6f}, gap {100 * solution.gap:.4f} %, "
          f"stage {s.stage}; {s.dual_evaluations} dual evaluations, {s.newton_iterations} Newton, "
          f"{s.cg_iterations} CG, {s.seconds:.2f} s")
    print(profiler.output_text(unicode=True, color=False, show_all=args.show_all))
    if args.html:
        with open(args.html, "w", encoding="utf-8") as handle:
            handle.write(profiler.output_html())
        print(f"HTML report: {args.html}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
