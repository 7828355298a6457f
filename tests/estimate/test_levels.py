"""A multi-level run's estimates over the geography (distfit.estimate.levels): pipelines/census.yaml end to end.

Nation, state and county on a few synthetic units: every level's estimate store holds tables
whose children sum to their parent's (to float rounding; exactly, as nonnegative integers, with
``integer``), query estimates that are those tables' workload sums and, real-valued, the
generalised least-squares optimum of all the levels' measurements together (its gradient,
recomputed from the releases, vanishes) with each query's variance, never above the raw
answer's. Serial, and once on a local Dask cluster (the tabulation of parent ids and the
release run on its workers).
"""
from __future__ import annotations

import io
import json
import shutil
import types
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from distfit.data import synthetic
from distfit.estimate import levels, subtree_job
from distfit.estimate.hierarchy import Grouping
from distfit.estimate.level_stores import basis_terms, information_basis
from distfit.estimate.levels import estimate_levels, parent_columns
from distfit.estimate.measurements import (
    measurement_model,
    model_from_blocks,
    recover_measurements,
    workload_estimates,
)
from distfit.estimate.projection import normal_equations
from distfit.export.job import run_export
from distfit.mathematics.domain import Domain
from distfit.mathematics.margins import MOE90_Z
from distfit.pipeline.run import run_levels
from distfit.spec.parse import load_spec
from distfit.stores.estimate import QueryColumns, read_estimate, read_sealed_estimate, verify_estimate
from distfit.stores.lock import StoreLockedError, store_lock
from distfit.stores.plan import read_plan
from distfit.stores import sealing as release_store
from distfit.stores.release import read_release, read_sealed_release
from distfit.runtime.placement import Placement, dask_runtime
from tests.storetools import reseal

CENSUS = Path(__file__).resolve().parents[2] / "pipelines" / "census.yaml"
LEVELS = ("nation", "state", "county")
#: census.yaml's people with the same queries at every level: the levels' plans one plan up to
#: the common scale, so their informations commute (as pipelines/us_pl94.yaml's: the shared basis),
#: every cell among them (as PL94's blocks: the counties' tables formed as their chunks are written)
SHARED = CENSUS.read_text().split("levels:")[0] + """levels:
  - name: nation
    queries: &same
      - {name: total, total: true, target: 2}
      - {name: age_sex, attributes: {age: prefix, sex: identity}, target: 2}
      - {name: race_hispanic, attributes: {race: identity, hispanic: identity}, target: 2}
      - {name: cells, attributes: {age: identity, sex: identity, race: identity, hispanic: identity}, target: 4}
  - name: state
    units: {column: state}
    queries: *same
  - name: county
    units: {column: county}
    queries: *same
privacy:
  rho: 2.5
"""


@pytest.fixture(scope="module")
def serial_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("census") / "run"
    return run_levels(CENSUS, out, units=24, placement=Placement(serial=True), fsync=False, log=io.StringIO())


@pytest.fixture(scope="module")
def cluster():
    """One real local cluster of 2 worker processes for this file's cluster tests (as one run's
    stages share theirs): the placement that names it."""
    with dask_runtime().dask_client(None, 2, log=io.StringIO()) as client:
        yield Placement(workers=2).at(client.scheduler.address)


def _tables(run, name):
    directory = Path(run.rundir) / "levels" / name
    estimate = read_estimate(directory / "estimate.zarr")
    release = read_release(directory / "release.zarr")
    return estimate, release, read_plan(directory / "plan.zarr")


def _gradient(run) -> tuple[np.ndarray, float]:
    """The gradient of the GLS objective of every level's measurements (from the releases) at
    the stored tables, with respect to each county's table (the leaves, the free parameters):
    ``sum over the county and its ancestors u of (H_l x_u - g_u)``, per county (units x cells),
    and the scale of its terms."""
    terms, rows, scale = [], [], 0.0
    for name in LEVELS:
        estimate, release, plan = _tables(run, name)
        model = measurement_model(plan)
        answers = {b.block_id: np.asarray(release.block_answers(b.block_id)[...]) for b in model.blocks}
        hessian, linear = normal_equations(model, recover_measurements(model, answers))
        terms.append(np.asarray(estimate.cells[...], dtype=float) @ hessian - linear)
        scale = max(scale, float(np.abs(linear).max()))
        if release.parent_ids is None:
            rows.append(np.zeros(linear.shape[0], dtype=np.int64))
        else:
            ids = np.asarray(_tables(run, LEVELS[LEVELS.index(name) - 1])[1].unit_ids[...]).tolist()
            rows.append(np.array([ids.index(p) for p in np.asarray(release.parent_ids[...]).tolist()]))
    state = terms[1] + terms[0][rows[1]]
    return terms[2] + state[rows[2]], scale


def _check_levels(run, *, integer: bool, nonnegative: bool = False) -> None:
    above = None
    for name in LEVELS:
        estimate, release, plan = _tables(run, name)
        cells = np.asarray(estimate.cells[...])
        assert estimate.method == ("hierarchy-gls-nonnegative" if nonnegative else "hierarchy-gls")
        assert estimate.integer is integer
        assert verify_estimate(estimate.path)[0]
        assert (cells.dtype == np.int64) is integer
        assert estimate.attrs["fit"]["unconverged_units"] == 0
        # the tables written once: as the query columns that are the cells, where the workload has
        # them (the nation's detailed group), else as cells/estimates
        columns = measurement_model(plan).cell_queries
        assert isinstance(estimate.cells, QueryColumns) is (columns is not None), name
        assert (name == "nation") is (columns is not None)
        if integer:
            assert cells.min() >= 0 and estimate.variances is None
        else:
            assert not nonnegative or cells.min() >= 0  # each query's variance: the best linear unbiased estimate's, at most the raw answer's
            variances = np.asarray(estimate.variances[...])
            assert variances.shape == estimate.estimates.shape and variances.min() > 0
            assert np.all(variances <= np.asarray(plan.queries_variances)[None, :] * (1 + 1e-9))
            assert np.any(variances < 0.9 * np.asarray(plan.queries_variances)[None, :])
        assert list(np.asarray(estimate.unit_ids[...])) == list(np.asarray(release.unit_ids[...]))
        # the geography is the release's, copied whole and covered by the estimate's checksum
        assert (estimate.parent_ids is None) is (release.parent_ids is None)
        if release.parent_ids is not None:
            assert np.asarray(estimate.parent_ids[...]).tolist() == np.asarray(release.parent_ids[...]).tolist()
            assert estimate.parent_column == release.parent_column
        # every query estimate is the workload sum of the unit's table (consistent)
        np.testing.assert_allclose(np.asarray(estimate.estimates[...], dtype=float),
                                   workload_estimates(measurement_model(plan), cells), rtol=1e-9, atol=1e-9)
        geography = estimate.attrs["geography"]
        if above is None:
            assert geography["parent_estimate"] is None and release.parent_ids is None
        else:
            parent_estimate, parent_cells, parent_ids = above
            assert geography["parent_estimate"]["checksum"] == parent_estimate.checksum
            if release.parent_ids is None:  # under the one nation unit
                rows = np.zeros(cells.shape[0], dtype=np.int64)
            else:
                assert release.parent_column == parent_columns(load_spec(CENSUS))[name] == "state"
                position = {unit: i for i, unit in enumerate(parent_ids)}
                rows = np.array([position[p] for p in np.asarray(release.parent_ids[...]).tolist()])
            sums = np.zeros_like(parent_cells)
            np.add.at(sums, rows, cells)
            if integer:
                np.testing.assert_array_equal(sums, parent_cells)  # exactly, cell by cell
            elif nonnegative:  # the siblings' projection sums them to the parent to float rounding
                assert np.abs(sums - parent_cells).max() <= 1e-12 * np.abs(parent_cells).max(initial=1.0)
            else:  # to float rounding: a few ulps of the tables
                assert np.abs(sums - parent_cells).max() <= 16 * np.finfo(float).eps * np.abs(cells).max(initial=1.0)
        above = (estimate, cells, np.asarray(estimate.unit_ids[...]).tolist())


def test_children_sum_to_their_parent_at_every_level(serial_run):
    _check_levels(serial_run, integer=False)
    raw = np.asarray(_tables(serial_run, "county")[1].answers[...])
    assert (raw < 0).any()  # a few people per county: the raw answers are noisy around 0
    # the stored tables are the GLS optimum of all the levels' measurements: the gradient vanishes
    gradient, scale = _gradient(serial_run)
    assert np.abs(gradient).max() <= 1e-8 * scale
    manifest = serial_run.estimates
    assert [manifest[name].status for name in LEVELS] == ["done"] * 3


def test_each_levels_report_shows_its_estimate(serial_run):
    """The levels are released without the single-level projection and reported once their
    estimates exist: each report has the estimate section (raw against estimated
    answers, the geography, the error of each against the synthetic people's truth) and each
    level's manifest records the estimate and the report."""
    for name in LEVELS:
        directory = Path(serial_run.rundir) / "levels" / name
        estimate = read_estimate(directory / "estimate.zarr")
        page = (directory / "report" / "index.html").read_text()
        assert "Estimates: best linear unbiased, consistent across the geography" in page and "hierarchy-gls" in page
        assert ("the coarsest of nation, state, county" in page) is (name == "nation")
        assert ("sums exactly, cell by cell, to its parent" in page) is (name != "nation")
        truth = (directory / "report" / "validation.html").read_text()  # the confidential page
        assert "error against the truth" in truth and "estimate_error" in truth
        assert "error against the truth" not in page and "estimate_error" not in page
        level = json.loads((directory / "manifest.json").read_text())
        assert level["stages"]["estimate"] == "done" and level["stages"]["report"] == "done"
        assert level["estimate"]["checksum"] == estimate.checksum and level["estimate"]["method"] == "hierarchy-gls"
        assert "estimate_error" in level["report"]["validation_plots"]
        assert serial_run.levels[name].estimate_checksum == estimate.checksum


def test_a_rerun_reuses_the_estimates_and_a_release_without_parents_is_refused(serial_run, tmp_path):
    spec, dirs = load_spec(CENSUS), {name: Path(serial_run.rundir) / "levels" / name for name in LEVELS}
    again = estimate_levels(spec, dirs, fsync=False, log=io.StringIO())
    assert [again[name].status for name in LEVELS] == ["reused"] * 3
    assert {n: e.checksum for n, e in again.items()} == {n: e.checksum for n, e in serial_run.estimates.items()}
    # a county release without parent ids (made before geography was recorded) is refused
    copy = tmp_path / "levels"
    shutil.copytree(Path(serial_run.rundir) / "levels", copy,
                    ignore=lambda _dir, names: [n for n in names if n in ("estimate.zarr", "data.zarr", "report")])
    shutil.rmtree(copy / "county" / "release.zarr" / "parent_ids")
    reseal(copy / "county" / "release.zarr")  # as such a release was sealed
    with pytest.raises(ValueError, match=r"level county's release has no parent ids of column 'state'"):
        estimate_levels(load_spec(CENSUS), {name: copy / name for name in LEVELS}, log=io.StringIO())


@pytest.mark.parametrize("tamper", ["delete", "flip", "attr"])
def test_a_changed_release_is_refused_before_any_level_is_written(serial_run, tmp_path, tamper):
    """The levels read every release whole and check each chunk as they read it (no separate
    pass): a deleted or altered answers chunk, or an edited attr, of the county's release is
    refused in one line naming the release (and the chunk), before any estimate is written."""
    copy = tmp_path / "levels"
    shutil.copytree(Path(serial_run.rundir) / "levels", copy,
                    ignore=lambda _dir, names: [n for n in names if n in ("estimate.zarr", "data.zarr", "report")])
    release = copy / "county" / "release.zarr"
    if tamper == "attr":
        meta = release / "zarr.json"
        doc = json.loads(meta.read_text())
        doc["attributes"]["private"] = not doc["attributes"]["private"]
        meta.write_text(json.dumps(doc))
        what = "its contents hash to"
    else:
        chunk = release / "queries" / "answers" / "c" / "0" / "0"  # what the levels read of a derived block
        if tamper == "delete":
            chunk.unlink()
        else:
            raw = bytearray(chunk.read_bytes())
            raw[len(raw) // 2] ^= 0x01
            chunk.write_bytes(bytes(raw))
        last = int(json.loads((release / "zarr.json").read_text())["attributes"]["units"]) - 1  # one chunk: all
        what = f"queries/answers units 0..{last} (chunk 0) do not hash to the digest they were sealed with"
    with pytest.raises(ValueError) as refused:
        estimate_levels(load_spec(CENSUS), {name: copy / name for name in LEVELS}, fsync=False, log=io.StringIO())
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{release}: the release was changed after it was sealed: ")
    assert what in message, message
    assert [p for p in copy.rglob("estimate.zarr*")] == []


def test_integer_estimates_on_a_local_cluster(serial_run, cluster, tmp_path):
    out = tmp_path / "run"
    for name in LEVELS:  # the plans are the serial run's (planning is not what is tested here)
        for store in ("accuracy-plan.zarr", "plan.zarr"):
            shutil.copytree(Path(serial_run.rundir) / "levels" / name / store, out / "levels" / name / store)
    # without the levels' reports: they are not what is tested here (three reports of figures;
    # test_each_levels_report_shows_its_estimate reads the serial run's)
    run = run_levels(CENSUS, out, units=16, placement=cluster, fsync=False, integer=True, report=False,
                     log=io.StringIO())
    _check_levels(run, integer=True)
    assert all(level.stages["report"] == "skipped" and level.manifest_data["report"] is None
               and not (Path(level.report) / "index.html").exists() for level in run.levels.values())
    nation = np.asarray(_tables(run, "nation")[0].cells[...])
    county = np.asarray(_tables(run, "county")[0].cells[...])
    np.testing.assert_array_equal(county.sum(axis=0), nation[0])
    exported = run_export(_tables(run, "county")[0].path, tmp_path / "export", fsync=False, threads=1)
    assert exported.stated == 0 and "integer estimates" in exported.rule  # rounding is not linear: no se


def test_export_gives_each_levels_se_and_moe90(serial_run, tmp_path):
    """``distfit export`` of a level's real-valued estimate: every row's se is the square root
    of the stored variance of its unit and query (the hierarchy's exact one), moe90 1.645 se,
    note ``linear-hierarchy``; the figures are the store's; ``level`` and ``parent`` say where
    each unit lies."""
    for name in ("state", "county"):
        estimate, _, plan = _tables(serial_run, name)
        result = run_export(estimate.path, tmp_path / name, fsync=False, threads=1)
        assert result.stated == result.rows > 0
        variances, estimates = np.asarray(estimate.variances[...]), np.asarray(estimate.estimates[...])
        start = 0
        for table, rows in result.tables:
            frame = pq.read_table(tmp_path / name / f"{table}.parquet").to_pydict()
            width = rows // estimates.shape[0]
            np.testing.assert_array_equal(np.asarray(frame["estimate"]), estimates[:, start:start + width].ravel())
            np.testing.assert_allclose(np.asarray(frame["se"]), np.sqrt(variances[:, start:start + width]).ravel(),
                                       rtol=1e-15)
            np.testing.assert_allclose(np.asarray(frame["moe90"]), MOE90_Z * np.asarray(frame["se"]), rtol=1e-15)
            assert set(frame["se_note"]) == {"linear-hierarchy"}
            # each row names its level and its unit's parent (the estimate's parent_ids: state -> none above it
            # with a unit column, county -> its state)
            assert set(frame["level"]) == {name}
            parents = ([None] * estimates.shape[0] if estimate.parent_ids is None
                       else [str(p) for p in np.asarray(estimate.parent_ids[...]).tolist()])
            assert frame["parent"] == list(np.repeat(np.array(parents, dtype=object), width))
            assert name != "county" or None not in parents
            start += width
        assert start == estimates.shape[1]


def test_too_many_cells_are_refused_before_anything_is_planned(tmp_path, monkeypatch):
    monkeypatch.setattr(levels, "DENSE_CELLS", 200)  # census.yaml has 224 cells
    with pytest.raises(ValueError, match=r"^census: 224 cells; a multi-level estimate holds cells x cells matrices, "
                                         r"at most 200 cells"):
        run_levels(CENSUS, tmp_path / "run", units=24, placement=Placement(serial=True), fsync=False,
                   log=io.StringIO())
    assert not (tmp_path / "run" / "levels").exists()


def _same_estimates(ours, driver) -> None:
    """The estimates of every level equal to 1e-9 (ids, query estimates, variances); each sealed."""
    for name in LEVELS:
        a_store, b_store = read_estimate(ours[name].path), read_estimate(driver[name].path)
        assert verify_estimate(ours[name].path)[0]
        np.testing.assert_array_equal(np.asarray(a_store.unit_ids[...]), np.asarray(b_store.unit_ids[...]))
        for array in ("estimates", "variances"):
            a, b = np.asarray(getattr(a_store, array)[...]), np.asarray(getattr(b_store, array)[...])
            assert np.abs(a - b).max() <= 1e-9 * max(1.0, np.abs(b).max()), (name, array)


def _interrupted(store: Path, pieces: list | None = None) -> None:
    """Make a sealed one-chunk estimate store look interrupted before its chunk was written:
    incomplete, unsealed, its chunk not done, and (``pieces``) the numbering of its variance
    classes it held until its seal dropped it (:func:`_laid_out_pieces`)."""
    doc = json.loads((store / "zarr.json").read_text())
    doc["attributes"]["complete"] = False
    for key in ("checksum", "sealed"):
        doc["attributes"].pop(key, None)
    (store / "zarr.json").write_text(json.dumps(doc))
    (store / "chunks" / "done" / "c" / "0").write_bytes(b"\x00")
    if pieces is not None:
        meta = store / "queries" / "variance_rows" / "zarr.json"
        doc = json.loads(meta.read_text())
        assert "pieces" not in doc["attributes"]  # resume bookkeeping: not in a sealed store
        doc["attributes"]["pieces"] = pieces
        meta.write_text(json.dumps(doc))


def _laid_out_pieces(monkeypatch) -> dict:
    """The numbering of the variance classes each store the cluster lays out holds while
    incomplete (``create_estimate``'s ``variance_pieces``), by level, the last laid out."""
    laid_out, create = {}, subtree_job.create_estimate

    def recording(path, **kwargs):
        laid_out[Path(path).parent.name] = kwargs.get("variance_pieces")  # the level's directory
        return create(path, **kwargs)

    monkeypatch.setattr(subtree_job, "create_estimate", recording)
    return laid_out


def test_a_store_whose_pieces_number_the_variance_classes_otherwise_is_not_resumed(serial_run, cluster, tmp_path,
                                                                                   monkeypatch):
    """An incomplete level store keeps its chunks only when the pieces number the query variances'
    classes as its own (attr ``pieces``: each unit's class is its piece's plus the piece's
    offset, dropped at the seal): a rerun with other forests lays the level out anew (not
    "resuming") and gives the driver's estimates and variances."""
    copy = tmp_path / "levels"
    shutil.copytree(Path(serial_run.rundir) / "levels", copy,
                    ignore=lambda _dir, names: [n for n in names if n in ("estimate.zarr", "data.zarr", "report")])
    spec, dirs = load_spec(CENSUS), {name: copy / name for name in LEVELS}
    laid_out = _laid_out_pieces(monkeypatch)
    estimate_levels(spec, dirs, fsync=False, log=io.StringIO(), placement=cluster, cut=1, forest_rows=6)
    county = copy / "county" / "estimate.zarr"
    before = laid_out["county"]
    _interrupted(county, before)
    log = io.StringIO()
    again = estimate_levels(spec, dirs, fsync=False, log=log, placement=cluster, cut=1, forest_rows=1000)
    after = laid_out["county"]
    assert len(before) > 1 and len(after) == 1  # one forest of every state: one piece
    assert "resuming" not in log.getvalue()
    _same_estimates(again, serial_run.estimates)


def test_subtrees_on_a_local_cluster_equal_the_drivers_estimate(serial_run, cluster, tmp_path, monkeypatch):
    """Cut at the state level into forests of a few states (issue 29 point 5: subtrees as tasks on
    a real local cluster, each level below written chunk by chunk from the forests' pieces): the
    driver's estimates and variances to 1e-9, every store sealed and verified; a rerun after an
    interruption keeps the sealed nation and state and resumes the incomplete county, writing its
    missing chunk: the same bytes; a changed release chunk is refused before anything is written."""
    copy = tmp_path / "levels"
    shutil.copytree(Path(serial_run.rundir) / "levels", copy,
                    ignore=lambda _dir, names: [n for n in names if n in ("estimate.zarr", "data.zarr", "report")])
    spec, dirs = load_spec(CENSUS), {name: copy / name for name in LEVELS}
    log, laid_out = io.StringIO(), _laid_out_pieces(monkeypatch)
    first = estimate_levels(spec, dirs, fsync=False, log=log, placement=cluster, cut=1, forest_rows=6)
    assert "forests of subtrees of level state" in log.getvalue() and "county: down" in log.getvalue()
    _same_estimates(first, serial_run.estimates)
    assert not (copy / "state" / "estimate.subtrees").exists()  # the pieces are gone once all is sealed
    # as if interrupted before the county's chunk was written: incomplete, its chunk not done
    _interrupted(copy / "county" / "estimate.zarr", laid_out["county"])
    log = io.StringIO()
    again = estimate_levels(spec, dirs, fsync=False, log=log, placement=cluster, cut=1, forest_rows=6)
    # stopped after the forests went down (the county's store held by another writer): the
    # pieces stay; one is then changed on disk, and the next run refuses it as it is read,
    # computes it again and writes the same county
    county = copy / "county" / "estimate.zarr"
    shutil.rmtree(county)
    with store_lock(county, "estimate"), pytest.raises(StoreLockedError):
        estimate_levels(spec, dirs, fsync=False, log=io.StringIO(), placement=cluster, cut=1, forest_rows=6)
    pieces = sorted((copy / "state" / "estimate.subtrees" / "county").glob("*/cells.npy"))
    assert len(pieces) > 1 and not county.exists()
    raw = bytearray(pieces[-1].read_bytes())
    raw[-5] ^= 0x01
    pieces[-1].write_bytes(bytes(raw))
    mended_log = io.StringIO()
    mended = estimate_levels(spec, dirs, fsync=False, log=mended_log, placement=cluster, cut=1, forest_rows=6)
    # a county release chunk changed after its seal: refused by the task that reads it, nothing written
    changed = tmp_path / "changed"
    shutil.copytree(Path(serial_run.rundir) / "levels", changed,
                    ignore=lambda _dir, names: [n for n in names if n in ("estimate.zarr", "data.zarr", "report")])
    chunk = changed / "county" / "release.zarr" / "queries" / "answers" / "c" / "0" / "0"
    raw = bytearray(chunk.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    chunk.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="do not hash to the digest they were sealed with"):
        estimate_levels(spec, {name: changed / name for name in LEVELS}, fsync=False, log=io.StringIO(),
                        placement=cluster, cut=1, forest_rows=6)
    assert [p.name for p in changed.rglob("estimate*")] == []
    assert "resuming" in log.getvalue() and "0 of 1 chunks already written" in log.getvalue()
    assert [again[name].status for name in LEVELS] == ["reused", "reused", "done"]
    assert again["county"].checksum == first["county"].checksum  # the same bytes: the passes are deterministic
    note = f"{pieces[-1].parent}: array cells does not hash to the digest it was written with: it is computed again"
    assert note in mended_log.getvalue() and "county: down" in mended_log.getvalue().split(note)[1]
    assert [mended[name].status for name in LEVELS] == ["reused", "reused", "done"]
    assert mended["county"].checksum == first["county"].checksum


def _plans_and_releases(run, tmp_path, *names) -> dict[str, dict[str, Path]]:
    """Copies of ``run``'s levels without their estimates, data and reports, one under each of
    ``tmp_path / name / "levels"``: per name, each level's directory."""
    skip = lambda _dir, found: [n for n in found if n in ("estimate.zarr", "data.zarr", "report")]  # noqa: E731
    for name in names:
        shutil.copytree(Path(run.rundir) / "levels", tmp_path / name / "levels", ignore=skip)
    return {name: {level: tmp_path / name / "levels" / level for level in LEVELS} for name in names}


def test_integer_tables_on_a_local_cluster_equal_the_drivers_bit_for_bit(serial_run, cluster, tmp_path):
    """Issue 29 point 4 on the cluster (cut at the state level, forests of a few states): the
    driver makes nation's and state's integer tables, each forest continues them through its
    counties from its states' tables: every level's integer tables and query estimates equal the
    driver's over the whole tree bit for bit, nonnegative, each parent the exact sum of its
    children; the real-valued stores sealed before are not reused for them (nor the integer
    ones by a real-valued rerun); an interrupted county store is resumed to the same bytes."""
    spec, copies = load_spec(CENSUS), _plans_and_releases(serial_run, tmp_path, "driver", "cluster")
    dirs = copies["cluster"]
    driver = estimate_levels(spec, copies["driver"], integer=True, fsync=False, log=io.StringIO())
    log = io.StringIO()
    real = estimate_levels(spec, dirs, fsync=False, log=log, placement=cluster, cut=1, forest_rows=6)
    log = io.StringIO()
    ours = estimate_levels(spec, dirs, integer=True, fsync=False, log=log, placement=cluster, cut=1, forest_rows=6)
    assert "then integer tables, " in log.getvalue() and "county: down" in log.getvalue()
    assert [ours[name].status for name in LEVELS] == ["done"] * 3
    assert all(ours[name].checksum != real[name].checksum for name in LEVELS)
    _check_levels(type("Run", (), {"rundir": str(tmp_path / "cluster")}), integer=True)
    for name in LEVELS:
        a, b = read_estimate(ours[name].path), read_estimate(driver[name].path)
        for array in ("cells", "queries/estimates"):  # the tables: cells/estimates, or query columns
            mine, theirs = ((np.asarray(e.cells[:]) if array == "cells" else np.asarray(e.array(array)[...]))
                            for e in (a, b))
            assert mine.dtype == theirs.dtype and np.array_equal(mine, theirs), (name, array)
        assert np.asarray(a.array("queries/estimates")).dtype == np.int64  # census.yaml's counts: integral
        np.testing.assert_allclose(np.asarray(a.array("solve/objective")[...]),
                                   np.asarray(b.array("solve/objective")[...]), rtol=1e-9)
    assert not (dirs["state"] / "estimate.subtrees").exists()
    # as if interrupted before the county's chunk was written: incomplete, its chunk not done
    _interrupted(dirs["county"] / "estimate.zarr")
    log = io.StringIO()
    again = estimate_levels(spec, dirs, integer=True, fsync=False, log=log, placement=cluster, cut=1, forest_rows=6)
    assert "resuming" in log.getvalue() and "0 of 1 chunks already written" in log.getvalue()
    assert [again[name].status for name in LEVELS] == ["reused", "reused", "done"]
    assert all(again[name].checksum == ours[name].checksum for name in LEVELS)  # the same bytes


def test_nonnegative_tables_on_a_local_cluster_equal_the_drivers(serial_run, cluster, tmp_path):
    """``--nonnegative`` (issue 29 point 7) on the cluster, cut at the state level: the driver's
    nation and state tables, each forest's counties from its states' tables; every level's tables
    nonnegative, children summing to their parent, equal to the driver's over the whole tree to
    the solver's tolerance (the BLUEs they start from agree to float rounding), with the BLUE's
    variances (equal to the real-valued run's), which the export states as the unbiased
    estimate's (``unbiased-hierarchy``); the BLUE's stores are not reused for them."""
    spec, copies = load_spec(CENSUS), _plans_and_releases(serial_run, tmp_path, "driver", "cluster")
    dirs = copies["cluster"]
    driver = estimate_levels(spec, copies["driver"],
                             nonnegative=True, fsync=False, log=io.StringIO())
    real = estimate_levels(spec, dirs, fsync=False, log=io.StringIO(), placement=cluster, cut=1, forest_rows=6)
    blue = {name: (np.asarray(read_estimate(real[name].path).cells[:]),
                   np.asarray(read_estimate(real[name].path).variances[...])) for name in LEVELS}
    log = io.StringIO()
    ours = estimate_levels(spec, dirs, nonnegative=True, fsync=False, log=log, placement=cluster, cut=1,
                           forest_rows=6)
    assert "then nonnegative tables, " in log.getvalue() and "county: down" in log.getvalue()
    assert [ours[name].status for name in LEVELS] == ["done"] * 3
    _check_levels(type("Run", (), {"rundir": str(tmp_path / "cluster")}), integer=False, nonnegative=True)
    _check_levels(type("Run", (), {"rundir": str(tmp_path / "driver")}), integer=False, nonnegative=True)
    for name in LEVELS:
        a, b = (read_estimate(e[name].path) for e in (ours, driver))
        mine, theirs = (np.asarray(e.cells[:]) for e in (a, b))
        assert np.abs(mine - theirs).max() <= 1e-6 * np.abs(theirs).max(), name
        np.testing.assert_allclose(np.asarray(a.variances[...]), blue[name][1], rtol=1e-9)
    assert min(cells.min() for cells, _ in blue.values()) < 0  # the BLUE is below 0 where the tables are not
    county = read_estimate(ours["county"].path)
    result = run_export(county.path, tmp_path / "export", fsync=False, threads=1)
    assert result.stated == result.rows > 0
    table, _rows = result.tables[0]
    frame = pq.read_table(tmp_path / "export" / f"{table}.parquet").to_pydict()
    assert set(frame["se_note"]) == {"unbiased-hierarchy"} and min(frame["estimate"]) >= 0


def test_forests_read_the_levels_above_the_finest_by_whole_chunks_kept_for_the_next(small_release):
    """A forest's rows of a level above the finest (subtree_job._level_answers) are the release's
    rows, checked as read, from the whole chunks holding them, which the next forest on the
    worker reuses when its rows lie in them (the same chunks are not read and hashed again);
    the finest level's rows are read as they are. Here the small release (50 units in chunks of
    8, several blocks' arrays) as both levels of a job."""
    release = read_sealed_release(small_release.path)
    model = measurement_model(read_plan(small_release.plan))
    units, size = int(release.attrs["units"]), int(release.attrs["chunk_units"])
    job = subtree_job.Forests(("coarse", "fine"), (model, model), (release.path,) * 2, (release.checksum,) * 2,
                              (np.array([0, units]),) * 2, (np.ones(units, dtype=np.int64),), "", "total", False,
                              chunk_units=(size, size))
    whole = {b.block_id: np.asarray(release.block_answers(b.block_id)[...]) for b in model.blocks}
    reads = []
    original = release_store.SealedStore.rows_of

    def counted(store, name, start, stop):
        reads.append((start, stop))
        return original(store, name, start, stop)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(release_store.SealedStore, "rows_of", counted)
        for (a, b), level, expected in (((3, 6), 0, [(0, 8)]), ((6, 11), 0, [(0, 16)]), ((9, 12), 0, []),
                                        ((9, 12), 1, [(9, 12)]), ((44, 50), 0, [(40, 50)])):
            reads.clear()
            got = subtree_job._level_answers(job, level, a, b)  # noqa: SLF001 - the reader's chunk rule
            assert all(np.array_equal(got[block], whole[block][a:b]) for block in whole)
            assert sorted({r for r in reads if r[1] > r[0]}) == expected, (a, b, level, reads)  # each block's array


@pytest.mark.parametrize("cells_last", [True, False])
def test_leaf_tables_from_the_recovering_answers_equal_the_dense_solve(cells_last):
    """BasisTerms.tables, ``J^+ h`` of each leaf, from the k answers its measurement is recovered
    from (``y = L_S^-1 a_S``, a product k / m the size): equal to the dense ``J^+ h`` (``h`` from
    ``y = L^+ a``) for released answers ``a = L y``. Where ``S`` are the cell queries of a block
    measuring every cell (``L = W B^-1``, ``W``'s last rows the identity, as PL94's plan), ``J^+
    h`` is ``a_S`` itself and no product is formed (``solve`` None); otherwise (``L``'s last
    rows another well-conditioned matrix) it is the product."""
    rng = np.random.default_rng(29)
    domain = Domain(("a", "b"), (3, 4))
    k = domain.size
    basis = rng.standard_normal((k, k)) + 4 * np.eye(k)
    rows = np.eye(k) if cells_last else rng.standard_normal((k, k)) + 4 * np.eye(k)
    workload = np.concatenate([np.kron(np.eye(3), np.ones((1, 4))), rows])  # a's margin, then the cells (or not)
    noise = rng.standard_normal((k, k))
    block = types.SimpleNamespace(block_id="b0", attributes=("a", "b"), basis=basis,
                                  recon=workload @ np.linalg.inv(basis), sigma=noise @ noise.T + 0.5 * np.eye(k),
                                  query_index=np.arange(k + 3))
    model = model_from_blocks(domain, [block])
    q = information_basis([model])
    terms = basis_terms(model, q)
    assert (terms.solve[0] is None) == cells_last and terms.answer_rows[0] == slice(3, k + 3)
    y = rng.standard_normal((7, k))
    answers = {"b0": y @ block.recon.T}
    recovered = np.linalg.lstsq(block.recon, answers["b0"].T, rcond=None)[0].T  # y = L^+ a
    j = basis.T @ np.linalg.solve(block.sigma, basis)
    dense = np.linalg.solve(block.sigma, recovered.T).T @ basis @ np.linalg.inv(j)
    tables, own = terms.tables(answers)
    np.testing.assert_allclose(tables, dense, rtol=0, atol=1e-9 * np.abs(dense).max())
    np.testing.assert_allclose(own, 0.0, rtol=0, atol=1e-9 * np.einsum("ij,ij->i", y, y).max())


def test_levels_of_one_plan_on_a_local_cluster_in_the_shared_basis(cluster, tmp_path):
    """Levels measuring the same queries (one information up to a scale: the shared basis, as
    us_pl94.yaml's): the cluster's forests take each level's terms straight from its answers in
    the basis (BasisTerms: the finest level only summed by parent going up) and give the
    driver's estimates and variances to 1e-9 and its residuals to 1e-9 of ``||C^-1 y||^2``; and
    BasisTerms equals the normal equations and residuals formed densely from the plan's matrices."""
    spec_path = tmp_path / "shared.yaml"
    spec_path.write_text(SHARED)
    run = run_levels(spec_path, tmp_path / "run", units=24, placement=Placement(serial=True), fsync=False,
                     report=False, log=io.StringIO())  # the reports are not what is tested here
    spec = load_spec(spec_path)
    models = [measurement_model(read_plan(Path(run.rundir) / "levels" / n / "plan.zarr")) for n in LEVELS]
    q = information_basis(models)
    assert q is not None
    copy = tmp_path / "levels"
    shutil.copytree(Path(run.rundir) / "levels", copy,
                    ignore=lambda _dir, names: [n for n in names if n in ("estimate.zarr", "data.zarr", "report")])
    log = io.StringIO()
    ours = estimate_levels(spec, {name: copy / name for name in LEVELS}, fsync=False, log=log,
                           placement=cluster, cut=1, forest_rows=6)
    assert "forests of subtrees of level state; county's tables formed as its chunks are written" in log.getvalue()
    _same_estimates(ours, run.estimates)
    # the finest level's variances stored once per parent (its leaves share their parent's P),
    # equal per unit to the driver's (above); the store says which row is each unit's
    finest = read_sealed_estimate(ours[LEVELS[-1]].path)
    rows = finest.array("queries/variance_rows").shape[0]
    parents = np.unique(np.asarray(finest.parent_ids[...])).size
    assert rows == parents < finest.variances.shape[0]
    for name, model in zip(LEVELS, models):
        release = read_release(Path(run.rundir) / "levels" / name / "release.zarr")
        answers = {b.block_id: np.asarray(release.block_answers(b.block_id)[...]) for b in model.blocks}
        terms = basis_terms(model, q)
        linear, norms = terms.linear(answers)
        a, b = (np.asarray(read_estimate(e[name].path).array("solve/objective")[...]) for e in (ours, run.estimates))
        assert np.abs(a - b).max() <= 1e-9 * norms.max(), name
        # the dense reference: y_b = L_b^+ a_b, h = sum_b M_b^T B_b^T Sigma_b^-1 y_b, n = sum_b ||y_b||^2_Sigma^-1
        x = np.random.default_rng(3).normal(5.0, 2.0, (norms.size, model.cells))
        h, n, residual, j = 0.0, 0.0, 0.0, 0.0
        for block in model.blocks:
            marginal = model.marginal(np.eye(model.cells), block).T  # M_b: d_b x cells
            j = j + marginal.T @ block.basis.T @ np.linalg.solve(block.sigma, block.basis) @ marginal
            y = np.linalg.lstsq(block.recon, answers[block.block_id].T, rcond=None)[0].T
            h = h + np.linalg.solve(block.sigma, y.T).T @ block.basis @ marginal
            n = n + np.einsum("ij,ij->i", y, np.linalg.solve(block.sigma, y.T).T)
            e = y - x @ marginal.T @ block.basis.T
            residual = residual + np.einsum("ij,ij->i", e, np.linalg.solve(block.sigma, e.T).T)
        np.testing.assert_allclose(linear @ q.T, h, rtol=0, atol=1e-9 * np.abs(h).max())
        np.testing.assert_allclose(norms, n, rtol=1e-9)
        tables, own = terms.tables(answers)  # J^+ h and the leaves' own residual n - h^T J^+ h
        dense = np.linalg.pinv(j, rcond=1e-9, hermitian=True)
        np.testing.assert_allclose(tables, h @ dense, rtol=0, atol=1e-9 * np.abs(h @ dense).max())
        np.testing.assert_allclose(own, n - np.einsum("ij,ij->i", h @ dense, h), rtol=0, atol=1e-9 * n.max())
        offsets, parent = np.random.default_rng(4).normal(size=(3, model.cells)) @ q, np.arange(norms.size) % 3
        np.testing.assert_allclose(terms.leaf_residuals(own, offsets, parent),
                                   terms.residuals(linear, norms, tables @ q + offsets[parent]), rtol=0,
                                   atol=1e-9 * n.max())
        np.testing.assert_allclose(terms.residuals(linear, norms, x @ q), residual, rtol=0, atol=1e-9 * n.max())
        np.testing.assert_allclose(terms.information, j, rtol=0, atol=1e-9 * np.abs(j).max())
        np.testing.assert_allclose(q.T @ j @ q, np.diag(terms.own), rtol=0, atol=1e-9 * np.abs(j).max())
        group = Grouping.of(np.arange(norms.size) % 3, 3)  # any parents: h~ is linear in the answers
        np.testing.assert_allclose(terms.summed(answers, group), group.sum(linear), rtol=0,
                                   atol=1e-12 * np.abs(linear).max() * norms.size)


def test_leaves_over_several_release_chunks_on_a_local_cluster(cluster, tmp_path, monkeypatch):
    """The shared basis's leaves formed by their chunk tasks (leaf_pieces) where the finest
    level's release is several chunks of 5 units, so that some parent's children straddle a
    chunk boundary (the upward task carries the earlier children's tables to the next chunk:
    ``.carried``): the cluster's estimates equal the driver's to 1e-9 at every level."""
    monkeypatch.setattr(synthetic, "MAX_CHUNK_UNITS", 5)  # the serial run's data and releases: chunks of 5
    spec_path = tmp_path / "shared.yaml"
    spec_path.write_text(SHARED)
    run = run_levels(spec_path, tmp_path / "run", units=24, placement=Placement(serial=True), fsync=False,
                     report=False, log=io.StringIO())
    county = read_release(Path(run.rundir) / "levels" / "county" / "release.zarr")
    chunk = int(county.attrs["chunk_units"])
    parents = np.asarray(county.parent_ids[...]).tolist()
    assert chunk == 5 and int(county.attrs["units"]) > 2 * chunk
    # a parent whose first and last child lie in different chunks: its tables are carried
    first, last = {}, {}
    for row, parent in enumerate(parents):
        first.setdefault(parent, row)
        last[parent] = row
    assert any(first[p] // chunk != last[p] // chunk for p in first)
    copy = tmp_path / "levels"
    shutil.copytree(Path(run.rundir) / "levels", copy,
                    ignore=lambda _dir, names: [n for n in names if n in ("estimate.zarr", "data.zarr", "report")])
    log = io.StringIO()
    ours = estimate_levels(load_spec(spec_path), {name: copy / name for name in LEVELS}, fsync=False, log=log,
                           placement=cluster, cut=1, forest_rows=6)
    assert "county's tables formed as its chunks are written" in log.getvalue()
    _same_estimates(ours, run.estimates)


def test_a_changed_sums_piece_is_computed_again_to_the_same_estimates(cluster, tmp_path, monkeypatch):
    """The shared basis's path where the chunk tasks form the finest level's tables
    (estimate/leaf_pieces): the upward task's ``.sums`` piece changed on disk before the downward
    task reads it is refused there (its digest), deleted by the driver, written again by that
    forest's upward task, and the job resumes: one note says so, and every level's estimates,
    variances, tables and residuals equal an undisturbed run's on the same cluster, bit for bit."""
    spec_path = tmp_path / "shared.yaml"
    spec_path.write_text(SHARED)
    run = run_levels(spec_path, tmp_path / "run", units=24, placement=Placement(serial=True), fsync=False,
                     report=False, log=io.StringIO())
    spec = load_spec(spec_path)

    def estimated(name: str, log: io.StringIO) -> dict:
        levels_dir = tmp_path / name
        shutil.copytree(Path(run.rundir) / "levels", levels_dir,
                        ignore=lambda _dir, names: [n for n in names if n in ("estimate.zarr", "data.zarr", "report")])
        return estimate_levels(spec, {level: levels_dir / level for level in LEVELS}, fsync=False, log=log,
                               placement=cluster, cut=1, forest_rows=6)

    clean = estimated("clean", io.StringIO())
    changed = []
    down = subtree_job._down

    def down_after_a_change(*args, **kwargs):
        if not changed:  # the first pass down only: the piece the upward tasks wrote, one byte flipped
            path = sorted((tmp_path / "damaged").glob(f"*/{subtree_job.PIECES_NAME}/county.sums/*/sums.npy"))[0]
            raw = bytearray(path.read_bytes())
            raw[-1] ^= 0x10
            path.write_bytes(bytes(raw))
            changed.append(path)
        return down(*args, **kwargs)

    monkeypatch.setattr(subtree_job, "_down", down_after_a_change)
    log = io.StringIO()
    ours = estimated("damaged", log)
    assert changed, "no .sums piece was written: the path under test did not run"
    notes = [line for line in log.getvalue().splitlines() if line.endswith("it is computed again")]
    assert len(notes) == 1 and "county.sums" in notes[0] and "sums" in notes[0], log.getvalue()
    for name in LEVELS:
        a, b = read_sealed_estimate(ours[name].path), read_sealed_estimate(clean[name].path)
        for array in ("estimates", "variances", "cells"):
            assert np.asarray(getattr(a, array)[...]).tobytes() == np.asarray(getattr(b, array)[...]).tobytes(), (name, array)
        assert np.asarray(a.array("solve/objective")[...]).tobytes() == np.asarray(b.array("solve/objective")[...]).tobytes()
