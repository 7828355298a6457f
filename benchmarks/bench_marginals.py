"""Marginal workloads at census scale: ``distfit plan`` against the residual program (issue 10).

Each workload is written as a spec with the ``marginals`` shorthand (docs/spec.md), planned by
``distfit plan`` as a subprocess (the whole process: spec loading, planning, the plan store;
``--audit`` adds ``distfit audit``: its seconds, peak memory and CPU-seconds, each with its ratio
to the plan's measured in the same run, the goal being at most 1x) and solved by the reference,
ResidualPlanner's selection program (Xiao, Kifer et al., NeurIPS 2023) written out with cvxpy +
Clarabel and sparse constraints: block S at noise level x_S costs ``c_S / x_S``
(``c_S = prod_{i in S} (1 - 1/n_i)``) and gives each cell of marginal A the variance
``(d_S / d_A)^2 c_S x_S``; minimise ``sum_S c_S / x_S`` subject to every marginal's variance at
most its target. Its optimum is the
certified optimal alpha of an identity-marginal workload. Printed side by side: seconds, peak
memory and alpha of each, and their ratios.

    python benchmarks/bench_marginals.py                 # the quick set
    python benchmarks/bench_marginals.py --workloads w100 w300 w1000 adult
    python benchmarks/bench_marginals.py --list
"""
from __future__ import annotations

import argparse
import itertools
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
DISTFIT = str(Path(sys.executable).with_name("distfit"))  # the console script next to this Python


def _spec(name: str, sizes, orders, target_rule=None) -> dict:
    """A spec of every k-way marginal (k in ``orders``) of attributes of ``sizes``; targets 1 or
    ``target_rule(i, j)`` per 2-way clique."""
    attributes = [{"name": f"a{i}", "size": int(n)} for i, n in enumerate(sizes)]
    queries = []
    for order in orders:
        marginals: dict = {"order": order}
        if target_rule is not None and order == 2:
            marginals["targets"] = {f"a{i}.a{j}": float(target_rule(i, j))
                                    for i, j in itertools.combinations(range(len(sizes)), 2)}
        queries.append({"name": f"m{order}", "marginals": marginals, "target": 1})
    return {"name": name, "attributes": attributes, "queries": queries}


def _sizes(count: int, low: int, high: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(low, high + 1, count)


WORKLOADS = {
    "w10x10": ("10 attributes of 10, all 2-way", lambda: _spec("w10x10", [10] * 10, [2])),
    "w8x10_3": ("8 attributes of 10, all 3-way", lambda: _spec("w8x10_3", [10] * 8, [3])),
    "w30x10": ("30 attributes of 10, all 2-way", lambda: _spec("w30x10", [10] * 30, [2])),
    "w30x10_t": ("30 attributes of 10, all 2-way, targets 1 + (i+j) mod 4",
                 lambda: _spec("w30x10_t", [10] * 30, [2], lambda i, j: 1 + (i + j) % 4)),
    "w100": ("100 attributes of 2-10, all 2-way, targets 1-4 per marginal",
             lambda: _spec("w100", _sizes(100, 2, 10), [2], lambda i, j: 1 + (i * 7 + j * 3) % 4)),
    "w100x10_3": ("100 attributes of 10, all marginals up to 3-way",
                  lambda: _spec("w100x10_3", [10] * 100, [1, 2, 3])),
    "w300": ("300 attributes of 2-5, all 2-way, targets 1-4 per marginal",
             lambda: _spec("w300", _sizes(300, 2, 5), [2], lambda i, j: 1 + (i * 7 + j * 3) % 4)),
    "w1000": ("1,000 attributes of 2-5, all 2-way", lambda: _spec("w1000", _sizes(1000, 2, 5), [2])),
    "adult": ("Adult, all 3-way (pipelines/adult.yaml; no reference)", None),
}
QUICK = ("w10x10", "w8x10_3", "w30x10", "w30x10_t")


def residual_program(spec: dict) -> tuple[float, float]:
    """The reference (module docstring) for a spec of identity marginals: (alpha, seconds)."""
    import cvxpy as cp
    import scipy.sparse

    start = time.perf_counter()
    sizes = np.array([a["size"] for a in spec["attributes"]], dtype=float)
    cliques, targets = [], []
    for group in spec["queries"]:
        marginal = group["marginals"]
        named = marginal.get("targets", {})
        for clique in itertools.combinations(range(sizes.size), marginal["order"]):
            cliques.append(clique)
            targets.append(named.get(".".join(f"a{i}" for i in clique), group["target"]))
    index: dict[tuple, int] = {}
    rows, cols, vals = [], [], []
    for j, clique in enumerate(cliques):
        cells = np.prod(sizes[list(clique)])
        for r in range(len(clique) + 1):
            for subset in itertools.combinations(clique, r):
                column = index.setdefault(subset, len(index))
                fraction = np.prod(1 - 1 / sizes[list(subset)])
                rows.append(j)
                cols.append(column)
                vals.append((np.prod(sizes[list(subset)]) / cells) ** 2 * fraction)
    cost = np.empty(len(index))
    for subset, column in index.items():
        cost[column] = np.prod(1 - 1 / sizes[list(subset)])
    matrix = scipy.sparse.csr_matrix((vals, (rows, cols)), shape=(len(cliques), len(index)))
    x = cp.Variable(len(index), pos=True)
    problem = cp.Problem(cp.Minimize(cost @ cp.inv_pos(x)), [matrix @ x <= np.asarray(targets)])
    problem.solve(solver=cp.CLARABEL)
    return float(problem.value), time.perf_counter() - start


def _run(command: list[str]) -> tuple[str, float, float, float]:
    """Run a command; (stdout + stderr, wall seconds, peak memory of the child in GiB, its
    CPU-seconds: user + system of the command and every child it waited for)."""
    start = time.perf_counter()
    result = subprocess.run(["/usr/bin/time", "-f", "MAXRSS %M CPU %U %S"] + command, capture_output=True, text=True,
                            cwd=ROOT)
    seconds = time.perf_counter() - start
    rss = re.search(r"MAXRSS (\d+) CPU ([0-9.]+) ([0-9.]+)", result.stderr)
    if result.returncode != 0:
        print(result.stdout[-2000:], result.stderr[-2000:], file=sys.stderr)
    cpu = float(rss.group(2)) + float(rss.group(3)) if rss else float("nan")
    return result.stdout + result.stderr, seconds, (int(rss.group(1)) / 2**20 if rss else float("nan")), cpu


def bench(name: str, workdir: Path, audit: bool, serial: bool) -> None:
    label, build = WORKLOADS[name]
    if build is None:
        spec_path, spec = ROOT / "pipelines" / "adult.yaml", None
    else:
        spec = build()
        spec_path = workdir / f"{name}.yaml"
        spec_path.write_text(yaml.safe_dump(spec, sort_keys=False))
    plan_path = workdir / f"{name}.zarr"
    out, seconds, memory, cpu = _run([DISTFIT, "plan", str(spec_path), "--out", str(plan_path),
                                      "--overwrite"] + (["--serial"] if serial else []))
    alpha = re.search(r"alpha = ([0-9.e+-]+)\s+\[([^\]]*)\]", out)
    blocks = re.search(r"blocks\s+(\d+)", out)
    audit_text = ""
    if audit:
        audit_out, audit_seconds, audit_memory, audit_cpu = _run([DISTFIT, "audit", str(plan_path)])
        audit_text = (f"\n  distfit audit  {audit_seconds:8.2f} s  {audit_memory:5.2f} GiB  {audit_cpu:.1f} CPU-s  "
                      f"{'passed' if 'audit passed' in audit_out else 'FAILED'}\n"
                      f"  audit / plan   wall {audit_seconds / seconds:.2f}x  peak {audit_memory / memory:.2f}x  "
                      f"CPU {audit_cpu / cpu:.2f}x  (load {os.getloadavg()[0]:.1f})")
    print(f"{name}: {label}")
    found = float(alpha.group(1)) if alpha else float("nan")
    print(f"  distfit plan   {seconds:8.2f} s  {memory:5.2f} GiB  {cpu:.1f} CPU-s  alpha {found:.6g} "
          f"[{alpha.group(2) if alpha else 'no alpha: failed'}]  blocks {blocks.group(1) if blocks else '?'}{audit_text}")
    if spec is not None:
        reference, reference_seconds = residual_program(spec)
        print(f"  residual prog. {reference_seconds:8.2f} s                alpha {reference:.6g}")
        print(f"  ratio          time {seconds / reference_seconds:6.2f}x  alpha {found / reference - 1:+.2e}")
    sys.stdout.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workloads", nargs="+", default=list(QUICK), choices=sorted(WORKLOADS))
    parser.add_argument("--list", action="store_true", help="list the workloads and exit")
    parser.add_argument("--audit", action="store_true", help="also time distfit audit of each plan")
    parser.add_argument("--serial", action="store_true", help="distfit plan --serial (no Dask)")
    args = parser.parse_args()
    if args.list:
        for name, (label, _) in WORKLOADS.items():
            print(f"{name:10s} {label}{'  (quick)' if name in QUICK else ''}")
        return
    with tempfile.TemporaryDirectory(prefix="bench-marginals-") as workdir:
        for name in args.workloads:
            bench(name, Path(workdir), args.audit, args.serial)
    print(f"(bench driver peak {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20:.2f} GiB)")


if __name__ == "__main__":
    main()
