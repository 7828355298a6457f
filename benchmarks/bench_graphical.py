"""The graphical-model estimate (distfit.estimate.graphical, issue 15): accuracy against raw
answers, and its cost.

Usage::

    python benchmarks/bench_graphical.py appgm [--k 4 8 16] [--trials 2] [--sd 10]
    python benchmarks/bench_graphical.py adult --plan PLAN.zarr [--data ../shared/data/adult.csv]

``appgm``: APPGM's setting (papers/004, section 5.1): 8 attributes of 4 values, k random 3-way
marginals measured with Gaussian noise (standard deviation ``--sd``), N = 10,000 records drawn
from a random sparse distribution. Mean L1 error per measured clique, as a fraction of N, of
the raw measurements and of the estimates from exact inference (Private-PGM), the saturated
region graph (APPGM via mbi's convex GBP) and the factor graph (cliques and singletons; solved
by Clarabel over its local polytope: by the paper's invariance result, the pseudo-marginals do
not depend on the counting numbers). The paper's ordering: exact <= region graph <= factor
graph < raw.

``adult``: pipelines/adult.yaml on the real data: an existing Adult plan store (planning takes
6-15 minutes: ``distfit plan pipelines/adult.yaml --out PLAN.zarr``), the CSV tabulated, a
seeded release, the graphical estimate of the one unit; mean absolute error of raw and
estimated answers against the true answers by query group, negative answers before and after,
the estimate's wall time and peak memory (ru_maxrss). Goal: <= 5 minutes, <= 8 GiB.
"""
from __future__ import annotations

import argparse
import io
import itertools
import resource
import sys
import tempfile
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from distfit.data.microdata import query_cliques, tabulate_microdata  # noqa: E402
from distfit.domain import Domain  # noqa: E402
from distfit.estimate import graphical  # noqa: E402
from distfit.estimate.measurements import measurement_model, model_from_blocks, recover_measurements  # noqa: E402
from distfit.release.job import run_release  # noqa: E402
from distfit.spec.parse import load_spec  # noqa: E402
from distfit.stores.data import read_marginals  # noqa: E402
from distfit.stores.plan import read_plan  # noqa: E402
from distfit.stores.release import read_release  # noqa: E402


def factor_graph(model, white, total, cliques):
    """Clarabel on the factor graph's local polytope: cliques agree only on single attributes."""
    import cvxpy as cp

    size = dict(zip(model.attributes, model.sizes))
    singles = sorted({(a,) for c in cliques for a in c})
    tau = {r: cp.Variable(int(np.prod([size[a] for a in r])), nonneg=True) for r in list(cliques) + singles}
    cons = [cp.sum(t) == 1 for t in tau.values()]
    for c in cliques:
        for i, a in enumerate(c):
            shape = [size[b] for b in c]
            m = np.zeros((size[a], int(np.prod(shape))))
            m[np.indices(shape).reshape(len(c), -1)[i], np.arange(m.shape[1])] = 1
            cons.append(m @ tau[c] == tau[(a,)])
    terms = [cp.sum_squares(b.whitened_basis @ tau[b.attributes] - white[b.block_id] / total) for b in model.blocks]
    cp.Problem(cp.Minimize(sum(terms)), cons).solve(solver=cp.CLARABEL)
    return {c: total * tau[c].value for c in cliques}


def bench_appgm(args: argparse.Namespace) -> None:
    names, sizes, total = tuple(f"a{i}" for i in range(8)), (4,) * 8, 10_000
    domain = Domain(names, sizes)
    triples = list(itertools.combinations(names, 3))
    print(f"APPGM setting: 8 attributes of 4 values, N = {total}, noise sd {args.sd}, {args.trials} trials")
    print(f"{'k':>4} {'raw':>9} {'exact':>9} {'region':>9} {'factor':>9}   ordering exact <= region <= factor < raw   seconds exact / region")
    for k in args.k:
        errors = {m: [] for m in ("raw", "exact", "region-graph", "factor")}
        seconds = {"exact": 0.0, "region-graph": 0.0}
        for trial in range(args.trials):
            rng = np.random.default_rng(1000 * k + trial)
            x = rng.multinomial(total, rng.dirichlet(np.full(domain.size, 0.1))).astype(float)[None, :]
            cliques = [triples[i] for i in sorted(rng.choice(len(triples), k, replace=False))]
            blocks = [types.SimpleNamespace(block_id="total", attributes=(), basis=np.ones((1, 1)), recon=np.ones((1, 1)),
                                            sigma=np.full((1, 1), args.sd ** 2), query_index=np.array([0]))]
            start = 1
            for i, c in enumerate(cliques):
                blocks.append(types.SimpleNamespace(block_id=f"c{i}", attributes=c, basis=np.eye(64), recon=np.eye(64),
                                                    sigma=args.sd ** 2 * np.eye(64), query_index=np.arange(start, start + 64)))
                start += 64
            model = model_from_blocks(domain, blocks)
            answers = {b.block_id: (model.marginal(x, b) @ b.basis.T + args.sd * rng.standard_normal((1, b.rows)))
                       for b in model.blocks}
            y = {key: v[0] for key, v in recover_measurements(model, answers).items()}
            true = {b.attributes: model.marginal(x, b)[0] for b in model.blocks if b.attributes}
            errors["raw"].append(np.mean([np.abs(y[b.block_id] - true[b.attributes]).sum() for b in model.blocks[1:]]) / total)
            for method in ("exact", "region-graph"):
                problem = graphical.graphical_problem(model, method=method)
                t = time.perf_counter()
                est = graphical.estimate_graphical(problem, y)
                seconds[method] += time.perf_counter() - t
                errors[method].append(np.mean([np.abs(est.marginals[c].reshape(-1) - true[c]).sum() for c in cliques]) / total)
            white = {b.block_id: b.whitener @ y[b.block_id] for b in model.blocks}
            fg = factor_graph(types.SimpleNamespace(attributes=names, sizes=sizes, blocks=model.blocks[1:]), white,
                              float(y["total"][0]), cliques)
            errors["factor"].append(np.mean([np.abs(fg[c] - true[c]).sum() for c in cliques]) / total)
        mean = {m: float(np.mean(v)) for m, v in errors.items()}
        holds = mean["exact"] <= mean["region-graph"] <= mean["factor"] < mean["raw"]
        print(f"{k:>4} {mean['raw']:9.5f} {mean['exact']:9.5f} {mean['region-graph']:9.5f} {mean['factor']:9.5f}   "
              f"{'holds' if holds else 'differs':8s}  {seconds['exact'] / args.trials:6.1f} / {seconds['region-graph'] / args.trials:6.1f}",
              flush=True)


def bench_adult(args: argparse.Namespace) -> None:
    spec = load_spec(ROOT / "pipelines" / "adult.yaml")
    plan = read_plan(args.plan)
    model = measurement_model(plan)
    with tempfile.TemporaryDirectory(prefix="bench-graphical-") as tmp:
        data = tabulate_microdata(spec, args.data, Path(tmp) / "data.zarr",
                                  cover=query_cliques(spec, [b.attributes for b in model.blocks]), log=io.StringIO())
        run_release(args.plan, data, Path(tmp) / "release.zarr", seed=7, serial=True, log=io.StringIO(), fsync=False)
        release = read_release(Path(tmp) / "release.zarr")
        answers = {b.block_id: np.asarray(release.block_answers(b.block_id)[:1]) for b in model.blocks}
        raw = np.asarray(release.answers[0])
        labels = [str(s) for s in release.labels]
        truth_store = read_marginals(data)
        true = np.zeros(model.num_queries)
        for b in model.blocks:
            i = truth_store.clique_for(b.attributes)
            clique = truth_store.cliques[i]
            table = np.asarray(truth_store.marginals[i][0], dtype=float).reshape([model.sizes[model.attributes.index(a)] for a in clique])
            marginal = table.sum(axis=tuple(j for j, a in enumerate(clique) if a not in b.attributes)).reshape(-1)
            np.add.at(true, b.query_index, b.query_rows @ marginal)
    y = {key: v[0] for key, v in recover_measurements(model, answers).items()}
    t = time.perf_counter()
    problem = graphical.graphical_problem(model)
    built = time.perf_counter() - t
    est = graphical.estimate_graphical(problem, y, iterations=args.iterations)
    seconds = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"Adult: {len(model.blocks)} blocks, {len(problem.cliques)} cliques, method {problem.method}, "
          f"junction tree {problem.junction_cells:.3g} cells, memory estimate {problem.memory_bytes / 2**30:.2f} GiB")
    print(f"estimate: {seconds:.1f} s ({built:.1f} s building the problem), {est.iterations} iterations, "
          f"peak RSS {peak:.2f} GiB; goal <= 300 s, <= 8 GiB; inconsistency {est.inconsistency:.1e} of the total")
    groups = np.array([label.split("[")[0].split(":")[0] for label in labels])
    print(f"{'group':40s} {'queries':>7} {'MAE raw':>9} {'MAE est':>9} {'neg raw':>8} {'neg est':>8}")
    for g in dict.fromkeys(groups):
        sel = groups == g
        print(f"{g[:40]:40s} {sel.sum():7d} {np.abs(raw[sel] - true[sel]).mean():9.2f} "
              f"{np.abs(est.estimates[sel] - true[sel]).mean():9.2f} {(raw[sel] < 0).sum():8d} {(est.estimates[sel] < -1e-9).sum():8d}")
    print(f"{'all':40s} {len(true):7d} {np.abs(raw - true).mean():9.2f} {np.abs(est.estimates - true).mean():9.2f} "
          f"{(raw < 0).sum():8d} {(est.estimates < -1e-9).sum():8d}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    appgm = sub.add_parser("appgm")
    appgm.add_argument("--k", type=int, nargs="+", default=[4, 8, 16])
    appgm.add_argument("--trials", type=int, default=2)
    appgm.add_argument("--sd", type=float, default=10.0)
    adult = sub.add_parser("adult")
    adult.add_argument("--plan", required=True)
    adult.add_argument("--data", default=str(ROOT.parent / "shared" / "data" / "adult.csv"))
    adult.add_argument("--iterations", type=int, default=graphical.ITERATIONS)
    args = parser.parse_args()
    bench_appgm(args) if args.command == "appgm" else bench_adult(args)


if __name__ == "__main__":
    main()
