"""The graphical-model estimate (distfit.estimate.graphical, issue 15): accuracy against raw
answers, and its cost.

Usage::

    python benchmarks/bench_graphical.py appgm [--k 4 8 16] [--trials 2] [--sd 10] [--tol 1e-12] [--iterations 10000]
    python benchmarks/bench_graphical.py adult --plan PLAN.zarr [--data pipelines/data/adult.csv] [--method local]
        [--iterations N] [--mbi-iterations 2000]

``appgm``: APPGM's setting (paper 004, section 5.1): 8 attributes of 4 values, k random 3-way
marginals measured with Gaussian noise (standard deviation ``--sd``), N = 10,000 records drawn
from a random sparse distribution. Mean L1 error per measured clique, as a fraction of N, of
the raw measurements and of the estimates from exact inference (Private-PGM), the saturated
region graph (APPGM, convex GBP) and Clarabel's optima over the saturated local polytope
(``region*``) and the factor graph's (cliques and singletons, ``factor*``; by the paper's
invariance result, the pseudo-marginals do not depend on the counting numbers). Both iterative
estimates run mirror descent until the loss changes by at most ``--tol`` (relative) per 50
steps; each is printed with ``+- t``, how far its error may be from its model class's optimum:
certified for exact inference (strong convexity and Frank-Wolfe's duality gap), measured against
``region*`` for the region graph. The paper's ordering exact <= region graph <= factor graph <
raw is reported as holding, holding within those tolerances, or differing.

``adult``: pipelines/adult.yaml on the real data: an existing Adult plan store (``distfit plan
pipelines/adult.yaml --out PLAN.zarr``), the CSV tabulated, a seeded release (seed 7), the
graphical estimate of the one unit (``--method``, default ``auto``: what ``distfit estimate``
takes, the local polytope in the published queries' metric for Adult's residual plan; ``local``,
``region-graph``) and Private-PGM (mbi 2, approximate
inference, isotropic Gaussian measurements of the same 364 marginals at the plan's rho,
``--mbi-iterations``, default 2,000; 0 skips it), printed side by side with the raw release:
mean L1 / N over the workload marginals, the published queries' L1 / N, mean absolute error and
root mean squared error against the truth, wall seconds and CPU-seconds; then the query groups
whose MAE the estimate does not raise and the negative cells before and after, the load average
and peak memory (ru_maxrss). Evaluation against the truth happens here only, never in the product.
"""
from __future__ import annotations

import argparse
import io
import itertools
import os
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
from distfit.mathematics.domain import Domain  # noqa: E402
from distfit.estimate import graphical  # noqa: E402
from distfit.estimate.measurements import measurement_model, model_from_blocks, recover_measurements  # noqa: E402
from distfit.release.job import run_release  # noqa: E402
from distfit.spec.parse import load_spec  # noqa: E402
from distfit.stores.data import read_marginals  # noqa: E402
from distfit.stores.plan import read_plan  # noqa: E402
from distfit.stores.release import read_release  # noqa: E402
from distfit.runtime.placement import Placement


def marginal_matrix(region, subset, size):
    """The 0/1 matrix that sums a table over ``region`` (row-major) onto ``subset``."""
    shape = [size[a] for a in region]
    index = np.indices(shape).reshape(len(region), -1)
    keep = [i for i, a in enumerate(region) if a in subset]
    target = np.ravel_multi_index(tuple(index[keep]), tuple(shape[i] for i in keep))
    m = np.zeros((int(np.prod([shape[i] for i in keep])), index.shape[1]))
    m[target, np.arange(index.shape[1])] = 1
    return m


def local_polytope(model, white, total, regions):
    """Clarabel over the local polytope of ``regions`` (each region's table nonnegative, of sum
    ``total``, marginalising onto every smaller region it contains): the optimum of the whitened
    loss, the measured cliques' tables. The factor graph's regions are the cliques and the
    single attributes; the saturated region graph's, the cliques and all their intersections."""
    import cvxpy as cp

    size = dict(zip(model.attributes, model.sizes))
    tau = {r: cp.Variable(int(np.prod([size[a] for a in r])), nonneg=True) for r in regions}
    cons = [cp.sum(t) == 1 for t in tau.values()]
    for r, q in itertools.permutations(regions, 2):
        if set(q) < set(r):
            cons.append(marginal_matrix(r, q, size) @ tau[r] == tau[q])
    terms = [cp.sum_squares(b.whitened_basis @ tau[b.attributes] - white[b.block_id] / total) for b in model.blocks]
    cp.Problem(cp.Minimize(sum(terms)), cons).solve(solver=cp.CLARABEL)
    return {r: total * tau[r].value for r in regions if any(b.attributes == r for b in model.blocks)}


def saturated(cliques):
    """The cliques and every nonempty intersection of them, repeatedly (the saturated region graph)."""
    regions = set(cliques)
    while True:
        more = {tuple(a for a in r if a in q) for r, q in itertools.combinations(regions, 2)} - {()} - regions
        if not more:
            return sorted(regions, key=lambda r: (-len(r), r))
        regions |= more


def frank_wolfe_gap(model, white, marginals, total, names, sizes):
    """Certified bound on ``loss(mu) - min loss`` over the marginal polytope (Frank-Wolfe's duality
    gap): ``<g, mu> - N min_x sum_b (G_b^T r_b)[x_b]``, ``r_b`` the whitened residuals; the
    minimum over the joint cells is taken on the whole (small) domain."""
    joint = np.zeros(sizes)
    inner = 0.0
    for b in model.blocks:
        mu = marginals[b.attributes].reshape(-1)
        g = b.whitened_basis.T @ (b.whitened_basis @ mu - white[b.block_id])
        inner += float(g @ mu)
        shape = [sizes[names.index(a)] if a in b.attributes else 1 for a in names]
        joint = joint + g.reshape(shape)
    return inner - total * float(joint.min())


def bench_appgm(args: argparse.Namespace) -> None:
    names, sizes, total = tuple(f"a{i}" for i in range(8)), (4,) * 8, 10_000
    domain = Domain(names, sizes)
    triples = list(itertools.combinations(names, 3))
    print(f"APPGM setting: 8 attributes of 4 values, N = {total}, noise sd {args.sd}, {args.trials} trials; "
          f"mirror descent to a relative loss change <= {args.tol:g} per {graphical.CHECK_EVERY} steps, "
          f"at most {args.iterations} steps")
    print("mean L1 error per measured clique / N. +- t: how far (mean L1 per clique / N) the estimate may be from its "
          "model class's optimum:\n  exact: certified, ||mu - mu*||_2^2 <= 2 sd^2 (loss - loss*) with loss - loss* <= "
          "Frank-Wolfe's gap;\n  region: measured against region*, Clarabel's optimum over the saturated local polytope. "
          "factor*: Clarabel over the factor graph's")
    print(f"{'k':>4} {'raw':>9} {'exact':>9} {'+- t':>8} {'region':>9} {'+- t':>8} {'region*':>9} {'factor*':>9}   "
          f"paper: exact <= region <= factor < raw   seconds exact / region")
    for k in args.k:
        errors = {m: [] for m in ("raw", "exact", "region-graph", "region*", "factor")}
        slack = {"exact": [], "region-graph": []}
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
            white = {b.block_id: b.whitener @ y[b.block_id] for b in model.blocks}
            measured = types.SimpleNamespace(attributes=names, sizes=sizes, blocks=model.blocks[1:])
            n_hat = float(y["total"][0])
            errors["raw"].append(np.mean([np.abs(y[b.block_id] - true[b.attributes]).sum() for b in model.blocks[1:]]) / total)
            # strong convexity modulus of the loss in the cliques' tables (identity blocks: 1 / sd^2)
            modulus = min(np.linalg.svd(b.whitened_basis, compute_uv=False).min() ** 2 for b in model.blocks[1:])
            reference = local_polytope(measured, white, n_hat, saturated(cliques))
            for method in ("exact", "region-graph"):
                problem = graphical.graphical_problem(model, method=method)
                t = time.perf_counter()
                est = graphical.estimate_graphical(problem, y, iterations=args.iterations, tol=args.tol)
                seconds[method] += time.perf_counter() - t
                errors[method].append(np.mean([np.abs(est.marginals[c].reshape(-1) - true[c]).sum() for c in cliques]) / total)
                if method == "exact":
                    gap = frank_wolfe_gap(measured, white, est.marginals, est.total, names, sizes)
                    # mean over cliques of ||d_C||_1 <= 8 ||d_C||_2 (64 cells) <= 8 ||d||_2 / sqrt(k)
                    slack[method].append(8 * np.sqrt(2 * gap / modulus / k) / total)
                else:  # the optimum is known: the measured distance
                    slack[method].append(np.mean([np.abs(est.marginals[c] - reference[c].reshape(est.marginals[c].shape)).sum()
                                                  for c in cliques]) / total)
            errors["region*"].append(np.mean([np.abs(reference[c].reshape(-1) - true[c]).sum() for c in cliques]) / total)
            fg = local_polytope(measured, white, n_hat, list(cliques) + sorted({(a,) for c in cliques for a in c}))
            errors["factor"].append(np.mean([np.abs(fg[c] - true[c]).sum() for c in cliques]) / total)
        mean = {m: float(np.mean(v)) for m, v in errors.items()}
        tol = {m: float(np.mean(v)) for m, v in slack.items()}
        strict = mean["exact"] <= mean["region-graph"] <= mean["factor"] < mean["raw"]
        within = (mean["exact"] <= mean["region-graph"] + tol["exact"] + tol["region-graph"]
                  and mean["region-graph"] - tol["region-graph"] <= mean["factor"] < mean["raw"])
        verdict = "holds" if strict else "holds within +- t" if within else "differs"
        print(f"{k:>4} {mean['raw']:9.5f} {mean['exact']:9.5f} {tol['exact']:8.1e} {mean['region-graph']:9.5f} "
              f"{tol['region-graph']:8.1e} {mean['region*']:9.5f} {mean['factor']:9.5f}   {verdict:18s}  "
              f"{seconds['exact'] / args.trials:6.1f} / {seconds['region-graph'] / args.trials:6.1f}", flush=True)


def adult_inputs(plan_path: str, data_path: str, spec_path: str | Path = ROOT / "pipelines" / "adult.yaml"):
    """The Adult model, one seeded release's recovered measurements, its raw answers, the true
    answers, the query labels and the true clique tables: ``(model, y, raw, true, labels, tables)``."""
    spec = load_spec(spec_path)
    model = measurement_model(read_plan(plan_path))
    with tempfile.TemporaryDirectory(prefix="bench-graphical-") as tmp:
        data = tabulate_microdata(spec, data_path, Path(tmp) / "data.zarr",
                                  cover=query_cliques(spec, [b.attributes for b in model.blocks]), log=io.StringIO())
        run_release(plan_path, data, Path(tmp) / "release.zarr", seed=7, placement=Placement(serial=True),
                    log=io.StringIO(), fsync=False)
        release = read_release(Path(tmp) / "release.zarr")
        answers = {b.block_id: np.asarray(release.block_answers(b.block_id)[:1]) for b in model.blocks}
        raw = np.asarray(release.answers[0])
        labels = [str(s) for s in release.labels]
        truth_store = read_marginals(data)
        true = np.zeros(model.num_queries)
        tables = {tuple(c): np.asarray(truth_store.marginals[i][0], dtype=float).reshape(
            [model.sizes[model.attributes.index(a)] for a in c]) for i, c in enumerate(truth_store.cliques)}
        for b in model.blocks:
            i = truth_store.clique_for(b.attributes)
            clique = truth_store.cliques[i]
            table = np.asarray(truth_store.marginals[i][0], dtype=float).reshape([model.sizes[model.attributes.index(a)] for a in clique])
            marginal = table.sum(axis=tuple(j for j, a in enumerate(clique) if a not in b.attributes)).reshape(-1)
            np.add.at(true, b.query_index, b.query_rows @ marginal)
    y = {key: v[0] for key, v in recover_measurements(model, answers).items()}
    return model, y, raw, true, labels, tables


def raw_cells(model, y, cliques):
    """Each clique's raw table: generalised least squares from the blocks within it alone (the
    residual blocks of its subsets span its cells), as the region graph's warm start reads it."""
    size = dict(zip(model.attributes, model.sizes))
    out = {}
    for c in cliques:
        shape = [size[a] for a in c]
        index = np.indices(shape).reshape(len(c), -1)
        rows, white = [], []
        for b in model.blocks:
            if set(b.attributes) <= set(c):
                keep = [j for j, a in enumerate(c) if a in b.attributes]
                cell = np.ravel_multi_index(tuple(index[keep]), tuple(shape[j] for j in keep)) if keep else np.zeros(index.shape[1], int)
                rows.append(b.whitened_basis[:, cell])
                white.append(b.whitener @ y[b.block_id])
        out[c] = np.linalg.lstsq(np.vstack(rows), np.concatenate(white), rcond=None)[0]
    return out


def published(model, marginals):
    """The published queries read off clique tables ``{clique: table}`` (schema-ordered cliques):
    each block's rows on its marginal of the smallest clique that contains it."""
    out = np.zeros(model.num_queries)
    for b in model.blocks:
        clique = min((c for c in marginals if set(b.attributes) <= set(c)), key=lambda c: marginals[c].size)
        table = marginals[clique]
        marginal = table.sum(axis=tuple(i for i, a in enumerate(clique) if a not in b.attributes)).reshape(-1)
        np.add.at(out, b.query_index, b.query_rows @ marginal)
    return out


def mbi_estimate(model, tables, rho, iterations, seed=7):
    """Private-PGM (mbi 2, approximate inference: mirror descent with convex GBP, mbi's fixed step
    ``2 / (L N_hat)``) from isotropic Gaussian measurements of every workload clique at the same
    rho (zCDP: ``k`` measurements of sensitivity 1 at ``sigma^2 = k / (2 rho)``), total
    estimated by mbi (minimum-variance unbiased); returns ``{clique: table}``."""
    import jax

    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_compilation_cache", False)
    import mbi
    from mbi import approximate_oracles, estimation, marginal_loss

    cliques = list(tables)
    sigma = float(np.sqrt(len(cliques) / (2.0 * rho)))
    rng = np.random.default_rng(seed)
    domain = mbi.Domain(model.attributes, model.sizes)
    measurements = [mbi.LinearMeasurement(tables[c].reshape(-1) + rng.normal(0.0, sigma, tables[c].size), c, stddev=sigma)
                    for c in cliques]
    loss = marginal_loss.from_linear_measurements(measurements, domain)
    total = float(max(estimation.minimum_variance_unbiased_total(measurements), 1.0))
    fitted = approximate_oracles.mirror_descent(domain, loss, known_total=total, iters=iterations,
                                                stepsize=2.0 / (loss.lipschitz * total))
    return {c: np.asarray(fitted.project(c).datavector(flatten=False)) for c in cliques}, sigma


def errors(model, tables, true, marginals, queries):
    """``(marginal L1/N, published L1/N, MAE, RMSE)``: the mean over the workload cliques of
    ``sum |mu_C - t_C| / N``, and the published queries' mean absolute error over N, mean
    absolute error and root mean squared error against the truth."""
    n = next(iter(tables.values())).sum()
    l1 = np.mean([np.abs(marginals[c] - t).sum() / n for c, t in tables.items()])
    e = queries - true
    return l1, np.abs(e).mean() / n, np.abs(e).mean(), float(np.sqrt((e ** 2).mean()))


def bench_adult(args: argparse.Namespace) -> None:
    model, y, raw, true, labels, truth = adult_inputs(args.plan, args.data)
    rho = float(read_plan(args.plan).attrs["rho"])
    load = os.getloadavg()
    t, cpu = time.perf_counter(), time.process_time()
    problem = graphical.graphical_problem(model, method=args.method)
    built = time.perf_counter() - t
    est = graphical.estimate_graphical(problem, y, iterations=args.iterations)
    seconds, cpu_seconds = time.perf_counter() - t, time.process_time() - cpu
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    print(f"Adult: {len(model.blocks)} blocks, {len(problem.cliques)} cliques, {model.num_queries:,} queries, "
          f"rho {rho:.5f}; method {problem.method}, memory estimate {problem.memory_bytes / 2**30:.2f} GiB; "
          f"load average {load[0]:.1f} at the start (2 cores)")
    print(f"distfit: {seconds:.1f} s wall, {cpu_seconds:.1f} CPU-s ({built:.1f} s building the problem), "
          f"{est.iterations} iterations, peak RSS {peak:.2f} GiB; cliques agree to {est.inconsistency:.1e} of the total")
    raw_tables = raw_cells(model, y, problem.cliques)
    shape = {c: truth[c].shape for c in problem.cliques}
    rows = [("raw release", errors(model, {c: truth[c] for c in problem.cliques}, true,
                                   {c: raw_tables[c].reshape(shape[c]) for c in problem.cliques}, raw), "", ""),
            (f"distfit ({problem.method})", errors(model, {c: truth[c] for c in problem.cliques}, true,
                                                   est.marginals, est.estimates),
             f"{seconds:.1f}", f"{cpu_seconds:.1f}")]
    if args.mbi_iterations:
        t, cpu = time.perf_counter(), time.process_time()
        fitted, sigma = mbi_estimate(model, {c: truth[c] for c in problem.cliques}, rho, args.mbi_iterations)
        wall, used = time.perf_counter() - t, time.process_time() - cpu
        rows.append((f"mbi {args.mbi_iterations} iterations (sigma {sigma:.1f})",
                     errors(model, {c: truth[c] for c in problem.cliques}, true, fitted, published(model, fitted)),
                     f"{wall:.1f}", f"{used:.1f}"))
    print(f"{'estimate':38s} {'marg L1/N':>9} {'query L1/N':>10} {'MAE':>7} {'RMSE':>7} {'wall s':>7} {'CPU-s':>7}")
    for name, (l1, ql1, mae, rmse), wall, used in rows:
        print(f"{name:38s} {l1:9.5f} {ql1:10.6f} {mae:7.3f} {rmse:7.3f} {wall:>7} {used:>7}")
    print("(raw release: marginal L1 of each clique's raw table, negative cells included; the published "
          "queries are the release's own answers)")
    raw_rmse, est_rmse = rows[0][1][3], rows[1][1][3]
    print(f"published queries: estimate RMSE / raw RMSE {est_rmse / raw_rmse:.3f} "
          f"({'never above raw: holds' if est_rmse <= raw_rmse else 'ABOVE RAW: the guarantee fails'})")
    groups = np.array([label.split("[")[0].split(":")[0] for label in labels])
    ratios = []
    for g in dict.fromkeys(groups):
        sel = groups == g
        ratios.append(np.abs(est.estimates[sel] - true[sel]).mean() / np.abs(raw[sel] - true[sel]).mean())
    ratios = np.array(ratios)
    print(f"query groups with MAE est <= raw: {(ratios <= 1).sum()} of {len(ratios)} (median ratio "
          f"{np.median(ratios):.2f}, worst {ratios.max():.2f}); negative clique cells: raw "
          f"{sum((c < 0).sum() for c in raw_tables.values()):,}, estimate "
          f"{sum((m < 0).sum() for m in est.marginals.values()):,} of {sum(c.size for c in raw_tables.values()):,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    appgm = sub.add_parser("appgm")
    appgm.add_argument("--k", type=int, nargs="+", default=[4, 8, 16])
    appgm.add_argument("--trials", type=int, default=2)
    appgm.add_argument("--sd", type=float, default=10.0)
    appgm.add_argument("--tol", type=float, default=1e-12)
    appgm.add_argument("--iterations", type=int, default=10_000)
    adult = sub.add_parser("adult")
    adult.add_argument("--plan", required=True)
    adult.add_argument("--data", default=str(ROOT / "pipelines" / "data" / "adult.csv"))
    adult.add_argument("--iterations", type=int, default=None,
                       help="the estimate's iteration cap (default: the method's own)")
    adult.add_argument("--method", default="auto", choices=("auto", "local", "region-graph"))
    adult.add_argument("--mbi-iterations", type=int, default=2000,
                       help="Private-PGM's mirror descent iterations (0: skip mbi; 2,000 took 1,482 s)")
    args = parser.parse_args()
    bench_appgm(args) if args.command == "appgm" else bench_adult(args)


if __name__ == "__main__":
    main()
