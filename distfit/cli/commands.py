"""The pipeline commands: ``distfit synth``, ``release``, ``estimate``, ``tabulate``, ``report``
and ``run``.

Each handler checks the flags the library cannot check (``UsageError``, exit code 2), calls one
library function where ``args.placement`` says (``--cluster``, ``--workers`` and ``--serial``,
read and checked once by ``distfit.cli.main.placement_of``) and prints a short summary; all the
work (and every other error) is the library's. ``distfit solve`` is ``distfit.cli.solve``;
``distfit plan`` and ``distfit audit`` are ``distfit.cli.planning`` (they need none of these
commands' heavy dependencies).
"""
from __future__ import annotations

import argparse
import os
import time

from distfit.cli.errors import PROG, UsageError
from distfit.runtime.cluster import placement_client
from distfit.data.microdata import tabulate_microdata
from distfit.estimate.job import run_estimate
from distfit.pipeline.run import run_levels, run_pipeline
from distfit.release.job import run_release
from distfit.report.page import write_report
from distfit.spec.parse import load_spec
from distfit.stores.data import read_histograms, read_marginals, write_synthetic
from distfit.stores.plan import read_plan


def cmd_synth(args: argparse.Namespace) -> int:
    """``distfit synth``: synthetic unit histograms for the spec's schema
    (``distfit.stores.data.write_synthetic``)."""
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


def cmd_release(args: argparse.Namespace) -> int:
    """``distfit release``: plan + data -> sealed release store (``distfit.release.job.run_release``)."""
    if args.seed is not None and args.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {args.seed}")
    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    result = run_release(
        args.plan, args.data, args.out, resume=args.resume, overwrite=args.overwrite, seed=args.seed,
        placement=args.placement,
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


def cmd_estimate(args: argparse.Namespace) -> int:
    """``distfit estimate``: plan + sealed release -> sealed estimate store
    (``distfit.estimate.job.run_estimate``)."""
    if args.resume and args.overwrite:
        raise UsageError("--resume and --overwrite exclude each other")
    result = run_estimate(args.plan, args.release, args.out, integer=args.integer, resume=args.resume,
                          overwrite=args.overwrite, method=args.method, placement=args.placement)
    rate = result.units_done_now / result.seconds if result.seconds > 0 else float("nan")
    fit = result.fit
    print(f"{PROG}: estimate {result.path}")
    print(f"  units          {result.units}  ({result.chunks} chunks, {result.chunks_done_now} estimated now"
          f"{', resumed' if result.resumed else ''})")
    print(f"  queries        {result.queries}  (cells {result.cells})")
    print(f"  method         {result.method}, {'integer' if result.integer else 'real'} estimates, nonnegative "
          f"and consistent")
    print(f"  fit            objective mean {fit['objective_mean']:.6g}, at most {fit['iterations_max']} iterations, "
          f"{fit['unconverged_units']} units unconverged")
    print(f"  seconds        {result.seconds:.1f}  ({rate:.1f} units/s)")
    print(f"  release checksum  {result.release_checksum}")
    print(f"  checksum       {result.checksum}  (sealed)")
    return 0


def cmd_tabulate(args: argparse.Namespace) -> int:
    """``distfit tabulate``: microdata -> marginals store (``distfit.data.microdata.tabulate_microdata``),
    on a Dask cluster unless ``--serial``; ``--plan`` adds a marginal per block of that plan."""
    if args.chunk_units is not None and args.chunk_units <= 0:
        raise UsageError(f"--chunk-units must be >= 1, got {args.chunk_units}")
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
        plan = read_plan(args.plan)
        cover = [plan.block(block_id).attributes for block_id in plan.block_ids]
    with placement_client(args.placement) as client:
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


def cmd_report(args: argparse.Namespace) -> int:
    """``distfit report``: plots and HTML page of a plan and optionally a release
    (``distfit.report.page.write_report``)."""
    result = write_report(args.plan, args.out, release_path=args.release, data_path=args.data,
                          estimate_path=args.estimate)
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


def cmd_run(args: argparse.Namespace) -> int:
    """``distfit run``: the whole pipeline into one run directory (``distfit.pipeline.run.run_pipeline``,
    or ``run_levels`` for a multi-level spec); a failed stage raises ``RunFailure`` (exit code 1)."""
    if args.units is not None and args.units <= 0:
        raise UsageError(f"--units must be >= 1, got {args.units}")
    spec = load_spec(args.spec) if args.spec is not None else None  # None: the embedded default pipeline
    multilevel = spec is not None and spec.multilevel
    run = run_levels if multilevel else run_pipeline
    result = run(spec, args.out, data=args.data, units=args.units, placement=args.placement, estimate=args.estimate,
                 integer=args.integer)
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
    if result.estimate is not None:
        integer = result.manifest_data["estimate"]["integer"]
        print(f"  estimate       {result.estimate}  ({stages.get('estimate')}, {'integer' if integer else 'real'})")
    print(f"  manifest       {result.manifest}")
    print(f"  plan checksum  {result.plan_checksum}")
    print(f"  release checksum  {result.release_checksum}")
    print(f"  seconds        {result.timings.get('total', 0.0):.1f}")
    print(f"  report         {os.path.join(result.report, 'index.html')}")
    return 0
