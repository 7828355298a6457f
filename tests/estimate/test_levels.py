"""A multi-level run's estimates, top-down (distfit.estimate.levels): pipelines/census.yaml end to end.

Nation, state and county on a few synthetic units: every level's estimate store holds
nonnegative tables whose children sum to their parent's (exactly, as integers, with
``integer``), and query estimates that are those tables' workload sums. Serial, and once on a
local Dask cluster (the tabulation of parent ids and the release run on its workers).
"""
from __future__ import annotations

import io
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from distfit.estimate.levels import estimate_levels, parent_columns
from distfit.estimate.measurements import measurement_model, workload_estimates
from distfit.pipeline.run import run_levels
from distfit.spec.parse import load_spec
from distfit.stores.estimate import read_estimate, verify_estimate
from distfit.stores.plan import read_plan
from distfit.stores.release import read_release
from distfit.runtime.placement import Placement
from tests.storetools import reseal

CENSUS = Path(__file__).resolve().parents[2] / "pipelines" / "census.yaml"
LEVELS = ("nation", "state", "county")


@pytest.fixture(scope="module")
def serial_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("census") / "run"
    return run_levels(CENSUS, out, units=24, placement=Placement(serial=True), fsync=False, log=io.StringIO())


def _tables(run, name):
    directory = Path(run.rundir) / "levels" / name
    estimate = read_estimate(directory / "estimate.zarr")
    release = read_release(directory / "release.zarr")
    return estimate, release, read_plan(directory / "plan.zarr")


def _check_top_down(run, *, integer: bool) -> None:
    above = None
    for name in LEVELS:
        estimate, release, plan = _tables(run, name)
        cells = np.asarray(estimate.cells[...])
        assert estimate.method == "top-down" and estimate.integer is integer
        assert verify_estimate(estimate.path)[0]
        assert cells.min() >= 0 and (cells.dtype == np.int64) is integer
        assert estimate.attrs["fit"]["unconverged_units"] == 0
        assert list(np.asarray(estimate.unit_ids[...])) == list(np.asarray(release.unit_ids[...]))
        # the geography is the release's, copied whole and covered by the estimate's checksum
        assert (estimate.parent_ids is None) is (release.parent_ids is None)
        if release.parent_ids is not None:
            assert np.asarray(estimate.parent_ids[...]).tolist() == np.asarray(release.parent_ids[...]).tolist()
            assert estimate.parent_column == release.parent_column
        # published estimates are never negative (no -1e-13 from summing over residual blocks)
        assert np.asarray(estimate.estimates[...]).min() >= 0
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
            else:
                np.testing.assert_allclose(sums, parent_cells, rtol=1e-9, atol=1e-7)
        above = (estimate, cells, np.asarray(estimate.unit_ids[...]).tolist())


def test_children_sum_to_their_parent_at_every_level(serial_run):
    _check_top_down(serial_run, integer=False)
    raw = np.asarray(_tables(serial_run, "county")[1].answers[...])
    assert (raw < 0).any()  # a few people per county: the raw answers had negatives to remove
    manifest = serial_run.estimates
    assert [manifest[name].status for name in LEVELS] == ["done"] * 3


def test_each_levels_report_shows_its_top_down_estimate(serial_run):
    """The levels are released without the single-level projection and reported once their
    top-down estimates exist: each report has the estimate section (raw against estimated
    answers, the geography, the error of each against the synthetic people's truth) and each
    level's manifest records the estimate and the report."""
    for name in LEVELS:
        directory = Path(serial_run.rundir) / "levels" / name
        estimate = read_estimate(directory / "estimate.zarr")
        page = (directory / "report" / "index.html").read_text()
        assert "Estimates: nonnegative and consistent" in page and "top-down" in page
        assert ("the coarsest of nation, state, county" in page) is (name == "nation")
        assert ("sums exactly, cell by cell, to its parent" in page) is (name != "nation")
        truth = (directory / "report" / "validation.html").read_text()  # the confidential page
        assert "error against the truth" in truth and "estimate_error" in truth
        assert "error against the truth" not in page and "estimate_error" not in page
        level = json.loads((directory / "manifest.json").read_text())
        assert level["stages"]["estimate"] == "done" and level["stages"]["report"] == "done"
        assert level["estimate"]["checksum"] == estimate.checksum and level["estimate"]["method"] == "top-down"
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


def test_integer_estimates_on_a_local_cluster(serial_run, tmp_path):
    out = tmp_path / "run"
    for name in LEVELS:  # the plans are the serial run's (planning is not what is tested here)
        for store in ("accuracy-plan.zarr", "plan.zarr"):
            shutil.copytree(Path(serial_run.rundir) / "levels" / name / store, out / "levels" / name / store)
    run = run_levels(CENSUS, out, units=16, placement=Placement(workers=2), fsync=False, integer=True,
                     log=io.StringIO())
    _check_top_down(run, integer=True)
    nation = np.asarray(_tables(run, "nation")[0].cells[...])
    county = np.asarray(_tables(run, "county")[0].cells[...])
    np.testing.assert_array_equal(county.sum(axis=0), nation[0])
