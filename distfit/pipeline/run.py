"""``distfit run``: the main job, spec to plan, audit, data and release in one run directory.

``distfit run [SPEC.yaml] --out RUNDIR [--data DATA] [--units N] [--cluster ADDR|FILE]
[--workers N] [--serial]`` (docs/design.md section 5). SPEC defaults to the embedded default
pipeline (``distfit/pipelines/default.yaml``, a copy of ``pipelines/pl94.yaml``). Stages:

1. plan     -> ``RUNDIR/plan.zarr``    (:func:`distfit.plan.job.run_plan`)
2. audit    of that plan               (:func:`distfit.audit.plan.audit_plan`; a mismatch is a failure)
3. data     -> ``RUNDIR/data.zarr``    synthetic histograms (:func:`distfit.stores.data.write_synthetic`)
             when ``--data`` is not given: ``--units`` units (default 10000), seeded from the
             spec hash, so a rerun would synthesise the same data (and in fact reuses it);
             with ``--data`` microdata (``.csv``, ``.csv.gz``, ``.parquet``, ``.pq``, a
             directory of Parquet files) the marginals the plan's blocks need are tabulated
             into ``RUNDIR/data.zarr`` (:func:`distfit.data.microdata.ensure_tabulated`; reused on a
             rerun when the source's path, size and mtime and the spec hash match, and
             refused - :class:`RunDirError` - when they do not); with ``--data`` a data store
             (histograms or marginals) it is released as it is
4. release  -> ``RUNDIR/release.zarr`` (:func:`distfit.release.job.run_release`)
4b. estimate -> ``RUNDIR/estimate.zarr`` (:func:`distfit.estimate.job.run_estimate`, on by default:
             nonnegative, consistent estimates of every query from the sealed release; reads no
             data, costs no privacy; ``integer=True`` rounds them; ``estimate=False`` skips it)
4c. mask    -> ``RUNDIR/mask.zarr``    with a ``mask`` section: masked pseudo-data (:mod:`distfit.pipeline.masking`)
5. manifest -> ``RUNDIR/manifest.json`` written atomically (temporary file + ``os.replace``):
   spec path and hash, plan and release checksums, privacy account (from the plan attrs),
   per-stage timings and status, package versions, the cluster used (``{"kind": "serial"}``,
   ``{"kind": "local", "workers", "started"}``, or ``{"kind": "external", "address"}`` with, for
   a scheduler file, its absolute ``scheduler_file`` and the ``scheduler_address`` it held) and
   the report's path and plots. The report (``distfit.report.page``, RUNDIR/report/index.html) is
   rebuilt on every run.

Rerunning into the same RUNDIR picks up where the earlier run stopped: a complete plan whose
spec hash matches is reused, complete data is reused, a partial release is resumed
(``resume=True``: written chunks kept, missing ones drawn with fresh entropy) and a sealed one
is skipped (no new noise is drawn). A RUNDIR that belongs to another spec (a manifest, plan or
synthesised or tabulated data with a different spec hash or source) is refused before anything is written
(:class:`RunDirError`, a ``ValueError``: exit 2), and so is a sealed release that was made from
another plan or other data. The local Dask cluster (no ``--cluster``, no ``--serial``) is
started once, only if a stage has work to do, and shared by the plan and the release.
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata, resources
from pathlib import Path
from typing import Any, Callable, TextIO, Union

import yaml

from distfit import __version__
from distfit.audit.plan import audit_plan
from distfit.data.geography import LevelUnits, read_geography, synthetic_geography_file
from distfit.data.level_synth import synthesised_levels
from distfit.data.microdata import check_source, ensure_tabulated, microdata_format, tabulation_mismatch
from distfit.data.people import write_synthetic_people
from distfit.data.synthetic import describe_geography, unit_columns
from distfit.estimate.job import estimate_in_run, manifest_entry
from distfit.estimate.levels import check_levels, estimate_levels, parent_columns
from distfit.pipeline.masking import check_mask_data, mask_stage
from distfit.pipeline.stage_cluster import StageCluster
from distfit.runtime.failures import RunFailure
from distfit.runtime.placement import Placement, dask_runtime, placement_client
from distfit.runtime.progress import LONG_STAGE_SECONDS, Progress
from distfit.plan.job import level_profiles, planned_decomposition, run_plan, scale_plan_to_budget
from distfit.plan.levels import budget_shares, combine_levels
from distfit.mathematics.privacy import Budget
from distfit.release.job import run_release
from distfit.report.page import remove_report, write_report
from distfit.spec.model import PipelineSpec, PrivacySpec
from distfit.spec.parse import load_spec
from distfit.stores.data import MARGINALS_FORMAT, open_data, read_histograms, write_synthetic
from distfit.stores.lock import store_lock
from distfit.stores.atomic import write_text_atomic
from distfit.stores.files import root_attrs_on_disk, utc_now
from distfit.stores.plan import read_plan, read_verified_plan
from distfit.stores.release import read_sealed_release

MANIFEST_FORMAT, MANIFEST_VERSION, DEFAULT_UNITS = "run-manifest", 1, 10_000
PACKAGES = ("distfit", "numpy", "scipy", "dask", "distributed", "zarr")

PLAN_NAME, DATA_NAME, RELEASE_NAME, MANIFEST_NAME = "plan.zarr", "data.zarr", "release.zarr", "manifest.json"
ESTIMATE_NAME, MASK_NAME, REPORT_NAME = "estimate.zarr", "mask.zarr", "report"
#: What a run writes in RUNDIR (``check_rundir``); a level's directory also holds its spec record
#: and, under a budget, its accuracy-first plan.
RUN_NAMES = (PLAN_NAME, DATA_NAME, RELEASE_NAME, ESTIMATE_NAME, MASK_NAME, MANIFEST_NAME, REPORT_NAME, "spec.yaml",
             "accuracy-plan.zarr")

__all__ = ["LevelsRunResult", "RunDirError", "RunFailure", "RunResult", "default_spec_path", "report_level", "run_levels",
           "run_pipeline", "data_seed"]


class RunDirError(ValueError):
    """RUNDIR holds something this run may not touch (another spec's run, a foreign file)."""


@dataclass(frozen=True)
class RunResult:
    rundir: str
    plan: str
    data: str
    release: str
    report: str
    manifest: str
    spec_hash: str
    plan_checksum: str
    release_checksum: str
    stages: dict[str, str] = field(default_factory=dict)   # stage -> "done" | "reused" | ...
    timings: dict[str, float] = field(default_factory=dict)
    manifest_data: dict[str, Any] = field(default_factory=dict)
    estimate: str | None = None              # RUNDIR/estimate.zarr, None when not estimated
    estimate_checksum: str | None = None


SpecLike = Union[PipelineSpec, str, os.PathLike, None]


def default_spec_path() -> str:
    """Path of the embedded default pipeline spec (package data)."""
    return str(resources.files("distfit") / "pipelines" / "default.yaml")


def _spec_and_path(spec: SpecLike) -> tuple[PipelineSpec, str | None]:
    """The run's spec, read here once when given as a path (None: the embedded default), and
    the path its manifest records (a spec object's ``source_path``)."""
    if isinstance(spec, PipelineSpec):
        return spec, spec.source_path
    path = os.fspath(spec) if spec is not None else default_spec_path()
    return load_spec(path), path


def _recorded_spec(spec: PipelineSpec, path: str | None) -> dict[str, Any]:
    return {"path": os.path.abspath(path) if path is not None else None, "hash": spec.spec_hash, "name": spec.name}


def data_seed(spec_hash: str) -> int:
    """The synthetic-data seed of a spec: the first 63 bits of its hash."""
    return int(spec_hash[:16], 16) >> 1


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = getattr(sys.modules.get(name), "__version__", None)
    return {**versions, "distfit": versions.get("distfit") or __version__}


# --------------------------------------------------------------------------------------------
# what is already in RUNDIR


def _read_manifest(path: Path) -> dict | None:
    if not path.exists():
        return None
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise RunDirError(f"{path}: cannot read the manifest of an earlier run ({error}); "
                          "use another --out") from None
    if not isinstance(manifest, dict):
        raise RunDirError(f"{path}: not a distfit run manifest; use another --out")
    return manifest


def _plan_spec_hash(path: Path) -> str | None:
    plan = read_plan(path)  # StoreError (a ValueError) for anything but a complete plan
    return (plan.attrs.get("planner") or {}).get("spec_hash")


def check_rundir(rundir: Path, names: tuple[str, ...]) -> None:
    """The one rule for an output directory (as for ``distfit report --out``): it may be missing,
    empty, or hold only what a distfit run writes there (``names``, and their staging, lock and
    temporary siblings); anything else is refused, so a run never writes beside a user's files."""
    if rundir.is_symlink() or (rundir.exists() and not rundir.is_dir()):
        raise RunDirError(f"{rundir}: exists and is not a directory")
    if not rundir.is_dir():
        return
    foreign = sorted(entry.name for entry in rundir.iterdir()
                     if not (entry.name in names or entry.name.startswith(tuple(f"{n}." for n in names))
                             or entry.name.startswith(tuple(f".{n}." for n in names))))
    if foreign:
        shown = ", ".join(foreign[:3]) + (f" and {len(foreign) - 3} more" if len(foreign) > 3 else "")
        raise RunDirError(f"{rundir}: a non-empty directory that is not a distfit run directory (it holds {shown}); "
                          "use an empty or new --out")


def _inspect(rundir: Path, spec_hash: str, synthesise: bool, units: int | None,
             spec: Any = None, source: str | None = None, parent_column: str | None = None,
             geography: LevelUnits | None = None) -> None:
    """Refuse a RUNDIR that is not a run directory (:func:`check_rundir`) or holds another
    spec's run (or data tabulated from another ``source`` for microdata); touches nothing."""
    check_rundir(rundir, RUN_NAMES)
    manifest = _read_manifest(rundir / MANIFEST_NAME)
    if manifest is not None:
        theirs = (manifest.get("spec") or {}).get("hash") if isinstance(manifest.get("spec"), dict) else None
        if theirs != spec_hash:
            raise RunDirError(
                f"{rundir}: holds the run of another spec (manifest spec hash {theirs}, this spec "
                f"{spec_hash}); use another --out")
    plan_path = rundir / PLAN_NAME
    if plan_path.exists():
        theirs = _plan_spec_hash(plan_path)
        if theirs != spec_hash:
            raise RunDirError(
                f"{plan_path}: is the plan of another spec (spec hash {theirs}, this spec "
                f"{spec_hash}); use another --out")
    data_path = rundir / DATA_NAME
    if source is not None and (data_path.exists() or data_path.is_symlink()):
        reason = tabulation_mismatch(data_path, spec, source, parent_column=parent_column, geography=geography)
        if reason is not None:
            raise RunDirError(f"{data_path}: holds data from an earlier run that does not match --data "
                              f"{source} ({reason}); use another --out")
    if synthesise and data_path.exists():
        if (root_attrs_on_disk(data_path) or {}).get("distfit_format") == MARGINALS_FORMAT:
            theirs = ((root_attrs_on_disk(data_path) or {}).get("source") or {}).get("path")
            raise RunDirError(f"{data_path}: holds data tabulated from {theirs} by an earlier run; pass "
                              "that --data again, or use another --out")
        existing = read_histograms(data_path)
        theirs = existing.attrs.get("spec_hash")
        if theirs != spec_hash:
            raise RunDirError(
                f"{data_path}: holds data synthesised for another spec (spec hash {theirs}); "
                "use another --out")
        if units is not None and units != existing.units:
            raise RunDirError(f"{data_path}: holds {existing.units} units from an earlier run, but --units is "
                              f"{units}; use another --out (or omit --units to reuse the data)")


# --------------------------------------------------------------------------------------------
# the job


def run_pipeline(
    spec: SpecLike,
    out: str | os.PathLike,
    *,
    data: str | os.PathLike | None = None,
    units: int | None = None,
    placement: Placement = Placement(),
    log: TextIO | None = None,
    fsync: bool = True,
    after_chunk: Callable[[int], None] | None = None,
    plan_written: str | None = None,
    parent_column: str | None = None,
    geography: LevelUnits | None = None,
    estimate: bool = True,
    integer: bool = False,
    report: bool = True,
) -> RunResult:
    """Run (or finish) the pipeline of ``spec`` into ``out`` (module docstring). ``spec``: a
    ``PipelineSpec``, or the path of its YAML file (None: the embedded default pipeline), read
    once for the whole run. ``placement``: where the stages run
    (:class:`distfit.runtime.placement.Placement`; default a local cluster, started once, only
    if a stage has work). ``plan_written``: the caller has just written RUNDIR/plan.zarr, and
    how (``run_levels``: a level's plan scaled to its budget share); it is reported as done by
    this run, not reused. ``parent_column`` (``run_levels``): microdata is tabulated with each
    unit's parent id from that column (the coarser level's unit column); ``geography``: the
    level's units, empty ones included (:mod:`distfit.data.geography`). ``estimate``: run the
    estimate stage (``integer``: integer estimates; :func:`distfit.estimate.job.estimate_in_run`).
    ``report=False`` (``run_levels``): written later, with the levels' estimate (:func:`report_level`).

    Errors: SpecError / ValueError / RunDirError / FileExistsError (bad input, exit 2),
    RunFailure (the plan fails its audit, exit 1), ClusterError.
    """
    with store_lock(out, "run directory"):  # one run per RUNDIR at a time (stores/lock.py)
        started = time.perf_counter()
        log = log or sys.stderr
        if units is not None and (isinstance(units, bool) or units < 1):
            raise ValueError(f"--units must be >= 1, got {units}")
        spec, spec_path = _spec_and_path(spec)
        spec_hash = spec.spec_hash
        rundir = Path(os.fspath(out))
        synthesise = data is None
        source = os.fspath(data) if data is not None and microdata_format(data) is not None else None
        if source is not None:
            check_source(spec, source)  # refuse a missing source or a missing column before any work
            if units is not None:
                raise ValueError(f"--units is for synthetic data; --data {source} is microdata (its units are "
                                 "the values of the spec's unit column)")
        check_mask_data(spec.mask, source)  # a mask section needs a CSV with its columns
        _inspect(rundir, spec_hash, synthesise, units, spec=spec, source=source, parent_column=parent_column,
                 geography=geography)

        plan_path, release_path, estimate_path = rundir / PLAN_NAME, rundir / RELEASE_NAME, rundir / ESTIMATE_NAME
        data_path = rundir / DATA_NAME if synthesise or source is not None else Path(os.fspath(data))
        manifest_path = rundir / MANIFEST_NAME
        report_path = rundir / REPORT_NAME
        if not synthesise and source is None:
            given = open_data(data_path)  # refuse unreadable data before any work
            if units is not None and units != given.units:
                raise ValueError(f"--units {units} but --data {data_path} holds {given.units} units; "
                                 "give one or the other")
        rundir.mkdir(parents=True, exist_ok=True)
        stages: dict[str, str] = {}
        timings: dict[str, float] = {}

        with contextlib.ExitStack() as stack:
            where = StageCluster(placement, log, stack)

            def tabulate(cover: list[tuple[str, ...]]) -> str:
                with contextlib.ExitStack() as connected:  # the cluster only for a pass of many tasks
                    def client():
                        return connected.enter_context(placement_client(where.placement(), log))
                    return ensure_tabulated(spec, source, data_path, cover=cover, client=client, fsync=fsync,
                                            parent_column=parent_column, geography=geography, log=log)[1]

            # 0. microdata first when there is no plan yet: a value outside its attribute's domain
            # is refused before any planning (the decomposition, and so the marginals the blocks
            # need, is known without solving a block).
            tabulated: str | None = None
            decomposition = None  # computed once: for the tabulation, then the plan
            if source is not None and not plan_path.exists():
                t = time.perf_counter()
                where.start()  # the plan needs it: its workers spawn while the driver tabulates (stage_cluster)
                decomposition = planned_decomposition(spec)
                tabulated = tabulate(decomposition.block_attributes())
                timings["data"] = time.perf_counter() - t

            # 1. plan
            t = time.perf_counter()
            if plan_path.exists() and plan_written is not None:
                stages["plan"] = "done"
                print(f"distfit: plan at {plan_path} ({plan_written})", file=log)
            elif plan_path.exists():
                stages["plan"] = "reused"
                print(f"distfit: reusing the plan at {plan_path} (spec hash matches)", file=log)
            else:
                run_plan(spec, str(plan_path), placement=where.placement(), log=log, decomposition=decomposition)
                stages["plan"] = "done"
            plan = read_plan(plan_path)
            timings["plan"] = time.perf_counter() - t

            # 2. audit
            t = time.perf_counter()
            audited = audit_plan(str(plan_path), log=log)  # not ``report``: that is the parameter (write the report)
            timings["audit"] = time.perf_counter() - t
            if not audited.ok:
                raise RunFailure(f"{plan_path}: the plan fails audit ({len(audited.failures)} failures): "
                                 + "; ".join(audited.failures[:3]))
            stages["audit"] = "passed"

            # 3. data
            t = time.perf_counter()
            if source is not None and tabulated is not None:
                stages["data"] = tabulated
            elif source is not None:
                stages["data"] = tabulate([plan.block(b).attributes for b in plan.block_ids])
            elif not synthesise:
                stages["data"] = "given"
            elif data_path.exists():
                existing = read_histograms(data_path)
                stages["data"] = "reused"
                print(f"distfit: reusing the data at {data_path} ({existing.units} units)", file=log)
            else:
                write_synthetic(spec, units or DEFAULT_UNITS, data_path, seed=data_seed(spec_hash), fsync=fsync)
                stages["data"] = "synthesised"
            data_store = open_data(data_path)
            timings["data"] = timings.get("data", 0.0) + time.perf_counter() - t

            # 4. release
            t = time.perf_counter()
            attrs = root_attrs_on_disk(release_path) if release_path.is_dir() else None
            if attrs is not None and attrs.get("complete") is True:
                recorded = attrs.get("data") or {}
                if attrs.get("plan_checksum") != plan.checksum:
                    raise RunDirError(f"{release_path}: a sealed release of another plan "
                                      f"({attrs.get('plan_checksum')}, the plan has {plan.checksum})")
                if recorded.get("created") != data_store.attrs.get("created"):
                    raise RunDirError(f"{release_path}: a sealed release of other data than {data_path}; "
                                      "use another --out")
                release_checksum = read_sealed_release(release_path).checksum  # reused: root now, chunks as read
                stages["release"] = "reused"
                print(f"distfit: the release at {release_path} is sealed; no new noise drawn", file=log)
            else:
                resume = attrs is not None
                written = stages["data"] in ("synthesised", "tabulated")  # by this run: sealed, not hashed again
                result = run_release(
                    str(plan_path), str(data_path), str(release_path), resume=resume,
                    placement=where.placement(), log=log, fsync=fsync,
                    after_chunk=after_chunk, audit=audited,  # audited above: not audited (hashed) again
                    data_checksum=data_store.attrs.get("checksum") if written else None,
                )
                release_checksum = result.checksum
                stages["release"] = "resumed" if result.resumed else "done"
            timings["release"] = time.perf_counter() - t

            # 4b. estimate: post-processing of the sealed release (reads no data; no privacy cost)
            t = time.perf_counter()
            estimated, stages["estimate"] = None, "skipped"
            if estimate:
                estimated, stages["estimate"] = estimate_in_run(
                    str(plan_path), str(release_path), str(estimate_path), integer=integer,
                    placement=where.placement, log=log, fsync=fsync,
                    # written by this run: not hashed again; a reused one's chunks are checked as read
                    release_checksum=release_checksum if stages["release"] != "reused" else None)
                timings["estimate"] = time.perf_counter() - t
            masked = mask_stage(spec.mask, source, rundir / MASK_NAME, where.placement, log, fsync, stages, timings)
            cluster_used = where.describe()

        # 5. report (rebuilt on every run: it is cheap and replaces only an earlier distfit report)
        t, written = time.perf_counter(), None
        if report:
            written = write_report(str(plan_path), str(report_path), str(release_path), str(data_path),
                                   estimate_path=str(estimate_path) if estimate else None, verified=True,
                                   progress=Progress("report", log, unit="figures", after=LONG_STAGE_SECONDS))  # verified: by this run, above
            timings["report"] = time.perf_counter() - t
        else:  # an earlier run's report would describe other stores (a level run's: report_level writes it)
            remove_report(report_path)
        stages["report"] = "done" if report else "skipped"

        # 6. manifest
        timings["total"] = time.perf_counter() - started
        plan_attrs = plan.attrs
        manifest = {
            "distfit_format": MANIFEST_FORMAT,
            "format_version": MANIFEST_VERSION,
            "created": utc_now(),
            "spec": _recorded_spec(spec, spec_path),
            "plan": {"path": os.path.abspath(plan_path), "checksum": plan.checksum},
            "data": {"path": os.path.abspath(data_path), "synthetic": synthesise,
                     "format": data_store.format,
                     "units": data_store.units, "seed": data_store.attrs.get("seed") if synthesise else None,
                     "created": data_store.attrs.get("created"),
                     "source": ({key: (data_store.attrs.get("source") or {}).get(key)
                                 for key in ("path", "format", "size", "mtime")} if source is not None else None)},
            "release": {"path": os.path.abspath(release_path), "checksum": release_checksum},
            "estimate": estimated, "mask": masked,  # the mask: its own (epsilon, delta), on top of the plan's
            "privacy": {
                "alpha": plan_attrs.get("alpha"),
                "rho": plan_attrs.get("rho"),
                "alpha_exact": plan_attrs.get("alpha_exact"),
                "composition": plan_attrs.get("composition"),
                "account": plan_attrs.get("account"),
            },
            "stages": stages,
            "timings_seconds": timings,
            "versions": package_versions(),
            "cluster": cluster_used,
            "report": written.manifest_entry() if written is not None else None,
        }
        write_text_atomic(manifest_path, json.dumps(manifest, indent=2) + "\n")
        return RunResult(
            rundir=str(rundir), plan=str(plan_path), data=str(data_path), release=str(release_path),
            report=str(report_path),
            manifest=str(manifest_path), spec_hash=spec_hash, plan_checksum=plan.checksum,
            release_checksum=release_checksum, stages=stages, timings=timings, manifest_data=manifest,
            estimate=str(estimate_path) if estimated else None, estimate_checksum=(estimated or {}).get("checksum"),
        )


def report_level(result: RunResult, estimate: Any | None, report: bool = True) -> RunResult:
    """Write the report of a level run with ``report=False`` with the section of its
    ``estimate`` (a :class:`distfit.estimate.levels.LevelEstimate`, or None) and complete the
    level's manifest (``report``, ``estimate``, their stages and timing); the result, completed.
    ``report=False``: the manifest completed without a report (stage "skipped", entry None)."""
    t = time.perf_counter()
    written = write_report(result.plan, result.report, result.release, result.data,
                           estimate_path=estimate and estimate.path, verified=True) if report else None  # by the level's run
    stages = dict(result.stages, estimate=estimate.status if estimate else "skipped",
                  report="done" if report else "skipped")
    manifest = dict(result.manifest_data, stages=stages, report=written and written.manifest_entry(),
                    estimate=manifest_entry(estimate.path, estimate.checksum) if estimate else None,
                    timings_seconds=dict(result.timings, report=time.perf_counter() - t))
    write_text_atomic(result.manifest, json.dumps(manifest, indent=2) + "\n")
    return dataclasses.replace(result, stages=stages, manifest_data=manifest, estimate=estimate and estimate.path,
                               estimate_checksum=estimate and estimate.checksum)


# --------------------------------------------------------------------------------------------
# multi-level runs

LEVELS_DIR, PEOPLE_NAME, GEOGRAPHY_NAME = "levels", "people", "geography.csv"
ACCURACY_PLAN_NAME, LEVEL_SPEC_NAME = "accuracy-plan.zarr", "spec.yaml"
#: What a multi-level run writes in RUNDIR (``check_rundir``).
LEVELS_RUN_NAMES = (LEVELS_DIR, PEOPLE_NAME, GEOGRAPHY_NAME, MANIFEST_NAME)


@dataclass(frozen=True)
class LevelsRunResult:
    """What ``distfit run`` did for a multi-level spec: one :class:`RunResult` per level (spec
    order), the people data used ("" for the level data of ``distfit synth``), the combined privacy account and the top manifest."""

    rundir: str
    spec_hash: str
    people: str
    levels: dict[str, RunResult]
    account: dict[str, Any]
    manifest: str
    timings: dict[str, float] = field(default_factory=dict)
    estimates: dict[str, Any] = field(default_factory=dict)  # level -> estimate.levels.LevelEstimate


def _write_spec(path: Path, spec: PipelineSpec) -> None:
    """A level's spec as YAML (canonical form), rewritten only when its content changes: the
    record of what the level's run planned and released (the run uses the spec object)."""
    text = yaml.safe_dump(spec.to_dict(), sort_keys=False, allow_unicode=True, width=100)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text_atomic(path, text, fsync=False)


def run_levels(
    spec: PipelineSpec | str | os.PathLike,
    out: str | os.PathLike,
    *,
    placement: Placement = Placement(),
    data: str | os.PathLike | None = None,
    units: int | None = None,
    geography: str | os.PathLike | None = None,
    estimate: bool = True,
    integer: bool = False,
    nonnegative: bool = False,
    report: bool = True,
    log: TextIO | None = None,
    fsync: bool = True,
) -> LevelsRunResult:
    """Run a multi-level spec (a ``PipelineSpec`` or the path of its YAML file, read once) into
    ``out``: levels one after another (sequential composition), each level's blocks and chunks
    in parallel on one Dask cluster (:mod:`distfit.plan.levels`): ``placement``'s (default a
    local cluster, started once for every level).

    Layout: ``RUNDIR/people/`` (synthetic microdata, a directory of Parquet files, when no
    ``--data``: ``--units`` finest-level units, default 10000, nested geography,
    :func:`distfit.data.people.write_synthetic_people`, seeded from the spec hash),
    ``RUNDIR/geography.csv`` (every synthetic unit, empty ones too; with ``data``, ``geography``
    lists the units: docs/geography.md; none of these when ``distfit synth`` wrote every level's
    data store there: :func:`distfit.data.level_synth.synthesised_levels`, released as they are), ``RUNDIR/levels/<level>/`` (a complete single-level run of the level's spec, recorded in
    ``spec.yaml``: plan, data tabulated for the level's unit column, release, report, manifest;
    see :func:`run_pipeline`) and ``RUNDIR/manifest.json`` (the levels, their checksums and the
    combined privacy account). With a budget every level is first planned accuracy-first
    (``levels/<level>/accuracy-plan.zarr``), the budget is shared by one common scale
    (:func:`distfit.plan.levels.budget_shares`) and each level's plan is that plan scaled to its
    share (:func:`distfit.plan.job.scale_plan_to_budget`); its ``spec.yaml`` records the share
    as the level's ``privacy.alpha``. A rerun reuses and resumes level by level like
    :func:`run_pipeline`; a RUNDIR of another spec is refused (RunDirError). Then (``estimate``)
    every level's ``estimate.zarr``, the best linear unbiased estimate over the geography with
    each estimate's variance: children sum to their parent, to float rounding, and exactly as
    nonnegative integers with ``integer``, as nonnegative real-valued tables with
    ``nonnegative`` (:func:`distfit.estimate.levels.estimate_levels`; each
    level's tabulation records its units' parents, ``parent_column``). ``report=False``: no
    level's report (its manifest's ``report`` None; tests whose subject is not the report).
    """
    with store_lock(out, "run directory"):  # one run per RUNDIR at a time (stores/lock.py)
        started = time.perf_counter()
        log = log or sys.stderr
        spec, spec_path = _spec_and_path(spec)
        if not spec.multilevel:
            raise ValueError(f"{spec_path}: not a multi-level spec (no levels); use run_pipeline")
        if units is not None and (isinstance(units, bool) or units < 1):
            raise ValueError(f"--units must be >= 1, got {units}")
        if estimate:
            check_levels(spec)  # before anything is planned or released
        spec_hash = spec.spec_hash
        rundir = Path(os.fspath(out))
        if rundir.exists() and rundir.is_dir() and any(
                (rundir / name).exists() for name in (PLAN_NAME, RELEASE_NAME, DATA_NAME)):
            raise RunDirError(f"{rundir}: holds a single-level run; use another --out")
        check_rundir(rundir, LEVELS_RUN_NAMES)
        manifest_path = rundir / MANIFEST_NAME
        earlier = _read_manifest(manifest_path)
        if earlier is not None and (earlier.get("spec") or {}).get("hash") != spec_hash:
            raise RunDirError(f"{rundir}: holds the run of another spec (spec hash "
                              f"{(earlier.get('spec') or {}).get('hash')}); use another --out")
        synthesised = None if data is not None else synthesised_levels(spec, rundir, units, LEVELS_DIR, DATA_NAME)  # distfit synth's
        if data is not None:
            if microdata_format(data) is None:
                raise ValueError(f"--data {data}: a multi-level run reads person-level microdata (.csv, .csv.gz, "
                                 ".parquet, .pq or a directory of Parquet files) with every level's unit column")
            if units is not None:
                raise ValueError("--units is for synthetic data; --data is given")
            for level in spec.levels:  # every level's columns, before any work
                check_source(spec.level_spec(level.name), data)
            people = Path(os.fspath(data))
            units_of = read_geography(geography, spec) if geography is not None else None
        else:
            if geography is not None:
                raise ValueError(f"--geography {os.fspath(geography)}: is for --data (synthetic people come with "
                                 f"their own geography, RUNDIR/{GEOGRAPHY_NAME})")
            units_of = None
            people = rundir / PEOPLE_NAME
            recorded = ((earlier or {}).get("people") or {}).get("units")
            if people.exists() and units is not None and recorded is not None and recorded != units:
                raise RunDirError(f"{people}: holds {recorded} units from an earlier run, but --units is {units}; "
                                  "use another --out")
        rundir.mkdir(parents=True, exist_ok=True)
        timings: dict[str, float] = {}
        budget = spec.privacy.budget
        level_dirs = {level.name: rundir / LEVELS_DIR / level.name for level in spec.levels}

        with contextlib.ExitStack() as stack:
            here = placement  # every level's stages on one cluster: a local one started now
            if placement.local:
                client = stack.enter_context(dask_runtime().dask_client(None, placement.workers, log=log))
                here = placement.at(client.scheduler.address)
            cluster_used = placement.describe()

            t = time.perf_counter()
            people_units = synthesised["units"] if synthesised else units or DEFAULT_UNITS
            if synthesised:  # `distfit synth` wrote every level's data: released as it is
                print(f"distfit: releasing the data distfit synth wrote for every level ({people_units:,} units)", file=log)
            elif data is None and not people.exists():
                print(f"distfit: synthesising people for {people_units} units at {people}, with "
                      f"{describe_geography(unit_columns(spec), people_units)}", file=log)
                write_synthetic_people(spec, people_units, people, seed=data_seed(spec_hash), fsync=fsync)
            elif data is None:
                people_units = ((earlier or {}).get("people") or {}).get("units", people_units)
                print(f"distfit: reusing the people at {people}", file=log)
            if data is None and not synthesised:  # every synthesised unit is published, the empty ones too
                units_of = synthetic_geography_file(spec, people_units, rundir / GEOGRAPHY_NAME, fsync=fsync)
            timings["people"] = time.perf_counter() - t

            level_specs = {level.name: spec.level_spec(level.name) for level in spec.levels}
            scaled_now: dict[str, str] = {}
            if budget is not None:
                t = time.perf_counter()
                accuracy = []
                for name, level_spec in level_specs.items():
                    accuracy_plan = level_dirs[name] / ACCURACY_PLAN_NAME
                    reused = accuracy_plan.exists()
                    if not reused:
                        print(f"distfit: level {name}: accuracy-first plan (the budget is shared after)", file=log)
                        run_plan(level_spec, str(accuracy_plan), placement=here, log=log)
                    # a reused one is verified: its alpha shares the budget among the levels
                    plan = (read_verified_plan if reused else read_plan)(accuracy_plan)
                    accuracy.append((name, float(plan.attrs["alpha"]), level_profiles(plan)))
                combined = combine_levels(spec.domain, accuracy)
                shares = budget_shares(combined.level_alphas, combined.alpha, budget.to_alpha())
                print(f"distfit: accuracy-first levels cost alpha {combined.alpha:.6g} together; budget alpha "
                      f"{budget.to_alpha():.6g}: every level scaled by k = {combined.alpha / budget.to_alpha():.6g}",
                      file=log)
                for (name, level_spec), share in zip(level_specs.items(), shares):
                    level_specs[name] = dataclasses.replace(level_spec, privacy=PrivacySpec("budget", Budget(alpha=share)))
                    plan_path = level_dirs[name] / PLAN_NAME
                    if not plan_path.exists():
                        scale_plan_to_budget(str(level_dirs[name] / ACCURACY_PLAN_NAME), str(plan_path),
                                             level_specs[name], share, fsync=fsync)
                        scaled_now[name] = f"the accuracy-first plan scaled to the level's budget share alpha {share:.6g}"
                timings["budget"] = time.perf_counter() - t

            results: dict[str, RunResult] = {}
            parents = parent_columns(spec)
            if data is not None:  # every level's units checked (and tabulated) before any level is released
                with placement_client(here, log) as client:
                    for name, level_spec in level_specs.items():
                        if not (level_dirs[name] / PLAN_NAME).exists():
                            level_dirs[name].mkdir(parents=True, exist_ok=True)
                            ensure_tabulated(level_spec, people, level_dirs[name] / DATA_NAME, client=client, log=log,
                                             cover=planned_decomposition(level_spec).block_attributes(), fsync=fsync,
                                             parent_column=parents[name], geography=units_of and units_of.of(name))
            for name, level_spec in level_specs.items():
                t = time.perf_counter()
                print(f"distfit: level {name} ({level_spec.num_queries} queries, units "
                      f"{level_spec.units.column if level_spec.units else 'none: one population'})", file=log)
                record = level_dirs[name] / LEVEL_SPEC_NAME
                _write_spec(record, level_spec)
                # the level's run records its spec file; the spec itself is passed, not read back
                results[name] = run_pipeline(
                    dataclasses.replace(level_spec, source_path=os.path.abspath(record)), level_dirs[name],
                    data=str(level_dirs[name] / DATA_NAME if synthesised else people), placement=here, log=log,
                    fsync=fsync, plan_written=scaled_now.get(name), parent_column=parents[name],
                    geography=None if units_of is None else units_of.of(name), estimate=False, report=False)
                timings[f"level {name}"] = time.perf_counter() - t

            t = time.perf_counter()  # over the geography (a large one: subtrees on this cluster); children sum to parents
            estimates = (estimate_levels(spec, level_dirs, integer=integer, nonnegative=nonnegative, log=log,
                                         fsync=fsync, placement=here) if estimate else {})
            timings["estimate"] = time.perf_counter() - t
        # each level's report, with its estimate (estimated once, above; timed in the level's manifest)
        results = {name: report_level(result, estimates.get(name), report) for name, result in results.items()}
        plans = {name: read_plan(result.plan) for name, result in results.items()}
        account = combine_levels(spec.domain, [(name, float(plan.attrs["alpha"]), level_profiles(plan))
                                               for name, plan in plans.items()]).to_dict()
        timings["total"] = time.perf_counter() - started
        manifest = {
            "distfit_format": MANIFEST_FORMAT,
            "format_version": MANIFEST_VERSION,
            "created": utc_now(),
            "spec": _recorded_spec(spec, spec_path),
            "people": {"path": None if synthesised else os.path.abspath(people), "synthetic": data is None,
                       "units": people_units if data is None else None, "levels_synthesised": bool(synthesised)},
            "geography": synthesised["geography"] if synthesised else None if units_of is None else {
                "path": units_of.path, "digest": units_of.digest, "units": {u.level: int(u.ids.size) for u in units_of.levels}},
            "levels": {name: {"dir": os.path.abspath(level_dirs[name]), "manifest": result.manifest,
                              "alpha": plans[name].attrs.get("alpha"), "plan_checksum": result.plan_checksum,
                              "release_checksum": result.release_checksum,
                              "report": os.path.join(result.report, "index.html") if report else None,
                              "estimate": result.manifest_data["estimate"]}
                       for name, result in results.items()},
            "privacy": account,
            "timings_seconds": timings,
            "versions": package_versions(),
            "cluster": cluster_used,
        }
        write_text_atomic(manifest_path, json.dumps(manifest, indent=2) + "\n")
        return LevelsRunResult(rundir=str(rundir), spec_hash=spec_hash, people="" if synthesised else str(people), levels=results,
                               account=account, manifest=str(manifest_path), timings=timings, estimates=estimates)
