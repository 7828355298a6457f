"""The pipeline commands: ``distfit synth``, ``tabulate``, ``report`` and ``run``.

Each handler checks the flags the library cannot check (``UsageError``, exit code 2), calls one
library function where ``args.placement`` says (``--cluster``, ``--workers`` and ``--serial``,
read and checked once by ``distfit.cli.main.placement_of``) and prints a short summary; all the
work (and every other error) is the library's. ``distfit solve`` is ``distfit.cli.solve``;
``distfit plan`` and ``distfit audit`` are ``distfit.cli.planning`` and ``distfit.cli.auditing``,
``distfit release`` and ``distfit estimate`` ``distfit.cli.releasing`` and ``distfit.cli.estimating``
(they need none of these commands' heavy dependencies: ``distfit.cli.main``'s dispatch table).
"""
from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from distfit.cli.errors import NOTHING_KEPT, Interrupted, UsageError
from distfit.cli.summary import print_summary
from distfit.runtime.placement import placement_client
from distfit.data.microdata import tabulate_microdata
from distfit.data.level_synth import write_level_data
from distfit.pipeline.run import (DATA_NAME, GEOGRAPHY_NAME, LEVELS_DIR, LEVELS_RUN_NAMES, PEOPLE_NAME, RUN_NAMES,
                                  check_rundir, data_seed, run_levels, run_pipeline)
from distfit.report.page import write_report
from distfit.spec.parse import load_spec
from distfit.stores.data import read_histograms, read_marginals, write_synthetic
from distfit.stores.lock import store_lock
from distfit.stores.plan import read_verified_plan


def cmd_synth(args: argparse.Namespace) -> int:
    """``distfit synth``: synthetic unit histograms for the spec's schema
    (``distfit.stores.data.write_synthetic``)."""
    started = time.perf_counter()
    spec = load_spec(args.spec)
    if spec.multilevel:
        return _synth_levels(args, spec, started)
    path = write_synthetic(spec, args.units, args.out, seed=args.seed, chunk_units=args.chunk_units,
                           overwrite=args.overwrite)
    seconds = time.perf_counter() - started
    data = read_histograms(path)
    attrs = data.attrs
    print_summary(f"synth {path}", [
        ("units", f"{data.units}  (chunks of {data.chunk_units})"),
        ("cells", f"{data.cells}  ({' x '.join(map(str, attrs['schema']['sizes']))})"),
        ("total people", attrs["total_people"]),
        ("seed", f"{attrs['seed']}  (synthetic data, not private)"),
        ("seconds", f"{seconds:.1f}"),
    ])
    return 0


def _synth_levels(args: argparse.Namespace, spec, started: float) -> int:
    """``distfit synth`` of a multi-level spec: the US-shaped geography and every level's data
    store in the run directory ``--out`` (``distfit.data.level_synth.write_level_data``; seed:
    ``--seed``, else the spec's, as ``distfit run`` seeds its people)."""
    if args.chunk_units is not None or args.overwrite:
        raise UsageError("--chunk-units and --overwrite: not for a multi-level spec (its data goes into a new --out)")
    out = Path(args.out)
    with store_lock(out, "run directory"):
        check_rundir(out, LEVELS_RUN_NAMES)
        made = write_level_data(spec, args.units, out, seed=data_seed(spec.spec_hash) if args.seed is None else args.seed,
                                levels_dir=LEVELS_DIR, data_name=DATA_NAME, geography_name=GEOGRAPHY_NAME)
    print_summary(f"synth {out} ({len(made.units)} levels)", [
        ("units", ", ".join(f"{name} {count:,}" for name, count in made.units.items())),
        ("empty", f"{made.empty_share:.1%} of the {spec.levels[-1].name} units (no people)"),
        ("total people", f"{made.total_people:,}"),
        ("geography", made.geography),
        ("next", f"distfit run {args.spec} --out {out}"),
        ("seconds", f"{time.perf_counter() - started:.1f}"),
    ])
    return 0


def cmd_tabulate(args: argparse.Namespace) -> int:
    """``distfit tabulate``: microdata -> marginals store (``distfit.data.microdata.tabulate_microdata``),
    on a Dask cluster unless ``--serial``; ``--plan`` adds a marginal per block of that plan."""
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
        plan = read_verified_plan(args.plan)  # a plan read is a plan verified
        cover = [plan.block(block_id).attributes for block_id in plan.block_ids]
    with placement_client(args.placement) as client:
        path = tabulate_microdata(spec, args.data, args.out, client=client, chunk_units=args.chunk_units,
                                  overwrite=args.overwrite, cover=cover)
    seconds = time.perf_counter() - started
    data = read_marginals(path)
    attrs = data.attrs
    largest = max(data.clique_cells(i) for i in range(len(data.cliques)))
    shown = "; ".join(" x ".join(c) or "total" for c in data.cliques[:4])
    print_summary(f"tabulate {path}", [
        ("source", f"{args.data}  ({attrs['source']['format']}, {attrs['source']['rows']} rows)"),
        ("units", f"{data.units}  (chunks of {data.chunk_units})"),
        ("cliques", f"{len(data.cliques)}  (largest {largest} cells): {shown}" + ("; ..." if len(data.cliques) > 4 else "")),
        ("seconds", f"{seconds:.1f}"),
    ])
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """``distfit report``: the publishable page of a plan and optionally a release, and with
    ``--data`` the confidential validation page (``distfit.report.page.write_report``)."""
    result = write_report(args.plan, args.out, release_path=args.release, data_path=args.data,
                          estimate_path=args.estimate)
    rows = [("plots", f"{len(result.plots)}  ({', '.join(result.plots)})")]
    if result.calibration is not None:
        c = result.calibration
        rows.append(("calibration", f"{c['within_1.96sd']:.2%} of {c['count']} answers within 1.96 sd "
                                    f"(95% expected), {c['within_1sd']:.2%} within 1 sd (68.3%)"))
    if result.baselines:
        shown = ", ".join(f"{k} {v:.4g}" for k, v in sorted(result.baselines.items()))
        rows.append(("baselines", f"max variance/target: {shown}"))
    else:
        rows.append(("baselines", result.baseline_note))
    if result.validation is not None:
        rows.append(("validation", f"{result.validation}  (CONFIDENTIAL: against the data; do not publish)"))
    print_summary(f"report {result.path}/index.html", rows)
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    """``distfit run``: the whole pipeline into one run directory (``distfit.pipeline.run.run_pipeline``,
    or ``run_levels`` for a multi-level spec); a failed stage raises ``RunFailure`` (exit code 1).
    Interrupted, it says what RUNDIR keeps (:func:`kept_outputs`), or that nothing was kept."""
    try:
        return _run_command(args)
    except KeyboardInterrupt:
        kept = kept_outputs(Path(args.out))
        if not kept:
            raise Interrupted(NOTHING_KEPT) from None
        raise Interrupted(f"what was finished is kept in {args.out} ({', '.join(kept)}); run the same command again "
                          "to resume (the plan and data are reused and a release continues with its missing chunks)"
                          ) from None


def kept_outputs(rundir: Path) -> list[str]:
    """The outputs of a run (``RUN_NAMES``) in ``rundir``, its synthetic people and each level's
    outputs (``levels/NAME/plan.zarr``): what a rerun reuses. Stores appear only once complete,
    or resumable (a release's chunks), so each one listed is kept."""
    places = [rundir] + (sorted(p for p in (rundir / LEVELS_DIR).iterdir() if p.is_dir())
                         if (rundir / LEVELS_DIR).is_dir() else [])
    kept = [str(place.relative_to(rundir) / name) for place in places for name in RUN_NAMES
            if (place / name).exists()]
    return kept + ([PEOPLE_NAME] if (rundir / PEOPLE_NAME).exists() else [])


def _run_command(args: argparse.Namespace) -> int:
    spec = load_spec(args.spec) if args.spec is not None else None  # None: the embedded default pipeline
    multilevel = spec is not None and spec.multilevel
    if args.geography is not None and not multilevel:
        raise UsageError("--geography: lists the units of a multi-level spec's levels; this spec has no levels")
    if args.nonnegative and not multilevel:
        raise UsageError("--nonnegative: for a multi-level spec's estimate over the geography; a single-level "
                         "run's estimates are nonnegative already")
    extra = {"geography": args.geography, "nonnegative": args.nonnegative} if multilevel else {}
    run = run_levels if multilevel else run_pipeline
    result = run(spec, args.out, data=args.data, units=args.units, placement=args.placement, estimate=args.estimate,
                 integer=args.integer, report=args.report, **extra)
    if multilevel:
        account = result.account
        rows = [("spec hash", result.spec_hash), ("people", result.people or "none: the level data distfit synth wrote")]
        for name, level in result.levels.items():
            rows.append((f"level {name}", f"alpha {account['levels'][name]:.6g}  {level.rundir}  "
                                              f"(plan {level.stages.get('plan')}, release {level.stages.get('release')})"))
            if args.report:
                rows.append(("", f"report {os.path.join(level.report, 'index.html')}"))
        if result.estimates:  # what the estimate stage published, and whether it was written or reused
            kind = ("integer tables" if args.integer else "nonnegative tables from the best linear unbiased estimate"
                    if args.nonnegative else "best linear unbiased estimate (se, moe90)")
            rows.append(("estimate", f"{kind}: " + ", ".join(f"{name} {level.status}"
                                                           for name, level in result.estimates.items())))
        print_summary(f"run {result.rundir} ({len(result.levels)} levels, sequential composition)", rows + [
            ("privacy", f"alpha {account['alpha']:.6g} ({'exact' if account['alpha_exact'] else 'sum bound'}), "
                        f"rho {account['rho']:.6g}"),
            ("manifest", result.manifest),
            ("seconds", f"{result.timings.get('total', 0.0):.1f}"),
        ])
        return 0
    stages = result.stages
    rows = [
        ("spec hash", result.spec_hash),
        ("plan", f"{result.plan}  ({stages.get('plan')}, audit {stages.get('audit')})"),
        ("data", f"{result.data}  ({stages.get('data')})"),
        ("release", f"{result.release}  ({stages.get('release')})"),
    ]
    if result.estimate is not None:
        integer = result.manifest_data["estimate"]["integer"]
        rows.append(("estimate", f"{result.estimate}  ({stages.get('estimate')}, {'integer' if integer else 'real'})"))
    if result.manifest_data.get("mask") is not None:
        masked = result.manifest_data["mask"]
        rows.append(("mask", f"{masked['path']}  ({stages.get('mask')}, audit passed, sigma {masked['sigma']:.6g})"))
    print_summary(f"run {result.rundir}", rows + [
        ("manifest", result.manifest),
        ("plan checksum", result.plan_checksum),
        ("release checksum", result.release_checksum),
        ("seconds", f"{result.timings.get('total', 0.0):.1f}"),
    ] + ([
        ("report", os.path.join(result.report, "index.html")),
        ("validation", f"{os.path.join(result.report, 'validation.html')}  (CONFIDENTIAL: against the data)"),
    ] if args.report else [("report", "skipped (--no-report)")]))
    return 0
