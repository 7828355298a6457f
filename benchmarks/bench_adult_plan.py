"""Planning the real Adult pipeline (``pipelines/adult.yaml``: 470 residual blocks, up to 210 basis
rows and ~42,000 query rows per block, a 1.6e9-cell domain so alpha is the sum bound): where the
time goes, stage by stage.

Usage::

    python benchmarks/bench_adult_plan.py write --plan /tmp/adult_r0.zarr [--repeat 2]
    python benchmarks/bench_adult_plan.py plan [--spec pipelines/adult.yaml] [--workers 2]
                                               [--refine-rounds 1] [--out DIR]
    python benchmarks/bench_adult_plan.py payload [--spec pipelines/adult.yaml]
    python benchmarks/bench_adult_plan.py allocate --plan /tmp/adult_r0.zarr
    python benchmarks/bench_adult_plan.py rounds --plan /tmp/adult_now.zarr [--largest 12] [--every 20]

``write``: reads every block of an existing plan store (realistic BlockRecords without
re-planning) and writes them again into a fresh store, once block by block
(``PlanWriter.write_block``, what ``write_plan`` did before) and once with
``PlanWriter.write_blocks`` (what it does now), then ``finish`` (queries, checksum, fsync,
rename). Prints seconds per stage, ms per block, the CPU seconds of this process, and checks
that both stores carry the source plan's checksum (same arrays, same bytes).

``plan``: the ``distfit plan`` pipeline with its stages timed separately: decomposition, each
refinement round's block solves on a ``--workers`` local cluster (blocks/s per round), the
allocation / joint block dual / stitching after the last round, and ``write_plan``. Prints the
sum bound of every round and the final alpha. (On a loaded 2-core machine this takes 15-30
minutes per round.)

``payload``: pickled size of every block task (``plan.BlockTask``: the spec's basis, recon,
query index and target shares) against the time to pickle them all.

``rounds``: CPU seconds per block of both refinement rounds, before and after session 6's
round scheduling, in one process: before, round 0 (the queries' targets) and round 1 (the
refined shares stored in ``--plan``) each solved cold to a 1e-4 gap with the dual stage run
to its iteration limit; after, round 0 to ``rounds.SHAPING_GAP`` and round 1 warm-started from
it (``solver.solve.WarmStart``) to 1e-4, the dual stage stopping once its bound stalls
(``solve.DUAL_STALL_WINDOW``). A sample: the ``--largest`` slowest blocks and every
``--every``-th of the rest. (Session 6's schedule: since session 7 a plan as large as Adult
shapes at ``rounds.COARSE_SHAPING_GAPS``; benchmarks/README.md, "Session 7".)

``allocate``: the scale allocation of an existing plan (its blocks' alphas and query variances,
as stored; the program is the same at any scales) solved by ``allocate.allocate_scales`` (the
primal barrier method) and, as the baseline in the same run, by Clarabel through cvxpy
(``cp.inv_pos``, an independent interior-point solver). Prints seconds, the sum bound, the
certified lower bound, and both ratios.

Timings are wall clock on a shared machine: the load average is printed with every figure;
compare ratios within one run.
"""
from __future__ import annotations

import argparse
import os
import pickle
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def bench_write(args: argparse.Namespace) -> None:
    from distfit.stores import plan as store
    from distfit.stores.plan_writer import PlanWriter

    t = time.perf_counter()
    plan = store.read_plan(args.plan)
    records = list(plan.iter_blocks())
    print(f"read {len(records)} blocks from {args.plan}: {time.perf_counter() - t:.1f} s ({load()})")
    schema = plan.attrs["schema"]
    with tempfile.TemporaryDirectory(prefix="bench-adult-write-") as tmp:
        for repeat in range(args.repeat):
            for mode in ("write_block", "write_blocks"):
                out = Path(tmp) / f"{mode}-{repeat}.zarr"
                wall, cpu = time.perf_counter(), time.process_time()
                with PlanWriter(out) as writer:
                    if mode == "write_block":
                        for record in records:
                            writer.write_block(record)
                    else:
                        writer.write_blocks(records)
                    blocks_s, blocks_cpu = time.perf_counter() - wall, time.process_time() - cpu
                    checksum = writer.finish(
                        spec=plan.attrs["spec"], schema={"attributes": schema["attributes"], "sizes": schema["sizes"]},
                        queries_targets=plan.queries_targets, queries_variances=plan.queries_variances,
                        alpha=plan.attrs["alpha"], alpha_exact=plan.attrs["alpha_exact"], rho=plan.attrs["rho"],
                        composition=plan.attrs["composition"],
                        # the version-2 checksum covers these claims too (issue 12)
                        extra_attrs={key: plan.attrs[key] for key in ("account", "planner") if key in plan.attrs},
                    )
                total = time.perf_counter() - wall
                print(f"{mode:13s} {len(records)} blocks: blocks {blocks_s:6.1f} s ({blocks_s / len(records) * 1e3:5.1f} ms/block, "
                      f"cpu {blocks_cpu:5.1f} s), finish {total - blocks_s:5.1f} s, total {total:6.1f} s, "
                      f"checksum {'= source' if checksum == plan.checksum else 'DIFFERS from source'} ({load()})", flush=True)
                shutil.rmtree(out, ignore_errors=True)


def bench_plan(args: argparse.Namespace) -> None:
    from distfit.plan.residual import group_targets  # noqa: F401  (import cost outside the timings)
    from distfit.plan.planner import BATCH_SECONDS, decompose, plan_blocks, plan_streamed, should_stream
    from distfit.plan.job import StoreSink, apply_budget, finish_plan, write_plan
    from distfit.plan.cluster_executor import DaskExecutor
    from distfit.runtime.cluster import dask_client
    from distfit.spec.parse import load_spec
    from distfit.stores.plan_writer import PlanWriter

    print(load())
    spec = load_spec(args.spec)
    t = time.perf_counter()
    blocks, decisions = decompose(spec.domain, spec.group_triples(), spec.blocks.max_cells if spec.blocks.merge else 0)
    print(f"decompose: {len(blocks)} blocks in {time.perf_counter() - t:.1f} s; {decisions[-1]}", flush=True)
    rounds: list[dict] = []

    def progress(done: int, total: int) -> None:
        now = time.perf_counter()
        if done == 0:
            rounds.append({"start": now, "end": now, "total": total})
            return
        rounds[-1]["end"] = now
        if done == total:
            r = rounds[-1]
            print(f"round {len(rounds) - 1}: {total} blocks in {now - r['start']:.1f} s, "
                  f"{total / (now - r['start']):.3f} blocks/s ({load()})", flush=True)

    out = Path(args.out or tempfile.mkdtemp(prefix="bench-adult-plan-")) / "adult.zarr"
    streamed = should_stream(blocks)
    with dask_client(None, args.workers, log=sys.stderr) as client:
        executor = DaskExecutor(client, batch_seconds=BATCH_SECONDS)
        start = time.perf_counter()
        if not streamed:
            plan = plan_blocks(spec.domain, blocks, spec.targets, executor, args.refine_rounds, decisions, progress)
        else:
            writer = PlanWriter(out, overwrite=True)
            sink = StoreSink(writer)
            refs = [sink.save_spec(block) for block in blocks]
            plan = plan_streamed(spec.domain, refs, spec.targets, sink, executor, args.refine_rounds, decisions, progress)
        planned = time.perf_counter()
    after_rounds = planned - rounds[-1]["end"]
    if spec.privacy.budget is not None:
        plan = apply_budget(plan, spec.privacy.budget.to_alpha())
    t = time.perf_counter()
    if not streamed:
        write_plan(spec, plan, str(out), overwrite=True)
    else:
        from distfit.plan.planner import write_streamed_blocks

        write_streamed_blocks(plan, sink)
        finish_plan(writer, spec, plan)
    written = time.perf_counter() - t
    for line in plan.decisions:
        if line.startswith(("round", "joint", "domain", "alpha")):
            print("  " + line)
    print(f"blocks {len(blocks)}, rounds {len(rounds)} (best kept: {plan.rounds}), streamed {streamed}")
    for number, r in enumerate(rounds):
        print(f"  round {number}: {r['end'] - r['start']:.1f} s, {r['total'] / max(r['end'] - r['start'], 1e-9):.3f} blocks/s")
    print(f"  after the last round (allocation, joint block dual, stitching): {after_rounds:.1f} s")
    print(f"  write plan store: {written:.1f} s")
    print(f"  planning total {planned - start:.1f} s; alpha {plan.alpha:.6g} (exact: {plan.alpha_exact}), "
          f"sum bound {plan.alpha_sum_bound:.6g}, allocation lower bound {plan.allocation_lower_bound:.6g} ({load()})")
    print(f"plan store: {out}")


def bench_payload(args: argparse.Namespace) -> None:
    from distfit.plan.planner import BlockTask, decompose
    from distfit.spec.parse import load_spec

    spec = load_spec(args.spec)
    blocks, _ = decompose(spec.domain, spec.group_triples(), spec.blocks.max_cells if spec.blocks.merge else 0)
    targets = np.asarray(spec.targets, dtype=float)
    t = time.perf_counter()
    sizes = np.array([len(pickle.dumps(BlockTask(i, b, targets[b.query_index]), protocol=5)) for i, b in enumerate(blocks)])
    seconds = time.perf_counter() - t
    print(f"{len(blocks)} block tasks: total {sizes.sum() / 2**20:.1f} MiB, largest {sizes.max() / 2**20:.2f} MiB, "
          f"median {np.median(sizes) / 2**10:.0f} KiB; pickling all of them {seconds:.2f} s; "
          f"the spec's query groups pickled: {len(pickle.dumps(spec.group_triples())) / 2**20:.2f} MiB ({load()})")


def bench_allocate(args: argparse.Namespace) -> None:
    import cvxpy as cp
    import scipy.sparse
    from threadpoolctl import threadpool_limits

    from distfit.stores import plan as store
    from distfit.plan.allocate import allocate_scales

    plan = store.read_plan(args.plan)
    records = list(plan.iter_blocks())
    targets = np.asarray(plan.queries_targets, dtype=float)
    alphas = np.array([r.alpha for r in records])
    block_queries = [(r.query_index, r.variances) for r in records]
    print(f"{len(records)} blocks, {targets.size} queries, "
          f"{sum(len(q) for q, _ in block_queries)} (query, block) variances ({load()})")
    with threadpool_limits(limits=1, user_api="blas"):
        t = time.perf_counter()
        allocation = allocate_scales(alphas, block_queries, targets)
        barrier_seconds = time.perf_counter() - t
        rows = np.concatenate([q for q, _ in block_queries])
        cols = np.concatenate([np.full(len(q), b) for b, (q, _) in enumerate(block_queries)])
        variance = scipy.sparse.csr_matrix((np.concatenate([v for _, v in block_queries]), (rows, cols)),
                                           shape=(targets.size, len(records)))
        scales = cp.Variable(len(records), pos=True)
        problem = cp.Problem(cp.Minimize(cp.sum(cp.multiply(alphas, cp.inv_pos(scales)))), [variance @ scales <= targets])
        t = time.perf_counter()
        problem.solve(solver=cp.CLARABEL)
        clarabel_seconds = time.perf_counter() - t
    print(f"allocate_scales (barrier): {barrier_seconds:8.2f} s  sum bound {allocation.alpha_bound:.9g}  "
          f"certified lower bound {allocation.lower_bound:.9g}")
    print(f"Clarabel via cvxpy:        {clarabel_seconds:8.2f} s  optimum   {problem.value:.9g}  ({problem.status})")
    print(f"time ratio barrier / Clarabel = {barrier_seconds / clarabel_seconds:.3f}; "
          f"sum bound / Clarabel optimum - 1 = {allocation.alpha_bound / problem.value - 1:.2e} ({load()})")


def bench_rounds(args: argparse.Namespace) -> None:
    """Per-block CPU seconds of both rounds, before and after the round scheduling of session 6,
    side by side in one process (module docstring, ``rounds``)."""
    from distfit.solver import solve as solve_module
    from distfit.solver.solve import WarmStart, solve
    from distfit.stores import plan as store
    from distfit.plan.rounds import BLOCK_GAP, SHAPING_GAP
    from distfit.runtime.threads import blas_limit

    plan = store.read_plan(args.plan)
    records = list(plan.iter_blocks())
    targets = np.asarray(plan.queries_targets, dtype=float)
    # the heaviest blocks by stored solver time, then every n-th of the rest (most blocks are tiny)
    records.sort(key=lambda r: -float(r.solver["seconds"]))
    sample = records[:args.largest] + records[args.largest::args.every]
    stall = solve_module.DUAL_STALL_WINDOW
    totals = np.zeros(4)
    print(f"{len(sample)} of {len(records)} blocks of {args.plan} ({load()})")
    print(f"{'block':48s} {'k':>4s} {'m':>6s} | before: r0 1e-4  r1 1e-4 | after: r0 {SHAPING_GAP:.0e}  r1 warm | gaps after r1")
    with blas_limit():
        for record in sample:
            basis, recon = np.asarray(record.basis), np.asarray(record.recon)
            W = recon @ basis
            first, shares = targets[np.asarray(record.query_index)], np.asarray(record.targets)
            row = []
            solve_module.DUAL_STALL_WINDOW = 0  # before: the dual stage runs to its iteration limit
            for t in (first, shares):
                cpu = time.process_time()
                solve(W, t, basis=basis, gap_tolerance=BLOCK_GAP)
                row.append(time.process_time() - cpu)
            solve_module.DUAL_STALL_WINDOW = stall
            cpu = time.process_time()
            shaped = solve(W, first, basis=basis, gap_tolerance=SHAPING_GAP, max_gap=10 * SHAPING_GAP)
            row.append(time.process_time() - cpu)
            cpu = time.process_time()
            final = solve(W, shares, basis=basis, gap_tolerance=BLOCK_GAP, warm_start=WarmStart.of(shaped))
            row.append(time.process_time() - cpu)
            totals += row
            print(f"{record.block_id:48s} {basis.shape[0]:4d} {recon.shape[0]:6d} | {row[0]:13.2f} {row[1]:8.2f} | "
                  f"{row[2]:12.2f} {row[3]:8.2f} | {final.gap:.1e}", flush=True)
    print(f"{'total CPU s':61s} | {totals[0]:13.2f} {totals[1]:8.2f} | {totals[2]:12.2f} {totals[3]:8.2f} |")
    print(f"after / before: round 0 {totals[2] / totals[0]:.3f}, round 1 {totals[3] / totals[1]:.3f}, "
          f"both {totals[2:].sum() / totals[:2].sum():.3f} ({load()})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    w = sub.add_parser("write")
    w.add_argument("--plan", default="/tmp/adult_r0.zarr")
    w.add_argument("--repeat", type=int, default=1)
    p = sub.add_parser("plan")
    p.add_argument("--spec", default=str(ROOT / "pipelines" / "adult.yaml"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--refine-rounds", type=int, default=1)
    p.add_argument("--out")
    q = sub.add_parser("payload")
    q.add_argument("--spec", default=str(ROOT / "pipelines" / "adult.yaml"))
    a = sub.add_parser("allocate")
    a.add_argument("--plan", default="/tmp/adult_r0.zarr")
    r = sub.add_parser("rounds")
    r.add_argument("--plan", default="/tmp/adult_r0.zarr", help="a refined Adult plan store: its blocks' round-1 shares")
    r.add_argument("--largest", type=int, default=12, help="the blocks with the longest stored solves")
    r.add_argument("--every", type=int, default=20, help="then every n-th of the rest")
    args = parser.parse_args()
    {"write": bench_write, "plan": bench_plan, "payload": bench_payload, "allocate": bench_allocate,
     "rounds": bench_rounds}[args.command](args)


if __name__ == "__main__":
    main()
