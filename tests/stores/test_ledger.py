"""The machine's ledger of private releases (distfit.stores.ledger): a release of data released
before says it spends the budget again, with the total; test-seed releases are not recorded."""
from __future__ import annotations

import io
import json

import pytest

from distfit.release.job import run_release
from distfit.runtime.placement import Placement
from distfit.stores.data import write_synthetic
from distfit.stores.ledger import ledger_path, private_releases_of, record_release
from distfit.stores.plan import read_plan
from distfit.stores.release import read_release


@pytest.fixture
def own_home(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path / "home"


def test_a_second_private_release_of_the_same_data_says_the_budget_is_spent_again(small_plan, tmp_path, own_home):
    data = tmp_path / "data.zarr"
    write_synthetic(small_plan.spec, 12, data, seed=2, chunk_units=4, fsync=False)
    rho = float(read_plan(small_plan.plan).attrs["rho"])
    first_log, seeded_log, again_log = io.StringIO(), io.StringIO(), io.StringIO()
    first = run_release(small_plan.plan, data, tmp_path / "a.zarr", placement=Placement(serial=True), log=first_log,
                        fsync=False)
    assert "spends the privacy budget again" not in first_log.getvalue()
    run_release(small_plan.plan, data, tmp_path / "b.zarr", placement=Placement(serial=True), log=seeded_log,
                fsync=False, seed=1)  # a test-seed release: not private, not recorded, no warning
    assert "spends the privacy budget again" not in seeded_log.getvalue()
    again = run_release(small_plan.plan, data, tmp_path / "a.zarr", placement=Placement(serial=True), log=again_log,
                        fsync=False, overwrite=True)
    lines = [line for line in again_log.getvalue().splitlines() if "spends the privacy budget again" in line]
    assert len(lines) == 1
    assert "released 1 time(s) before" in lines[0] and f"{2 * rho:.6g} in all" in lines[0]
    entries = [json.loads(line) for line in ledger_path().read_text().splitlines()]
    assert [e["release_checksum"] for e in entries] == [first.checksum, again.checksum]
    assert ledger_path().is_relative_to(own_home)
    assert len(private_releases_of(entries[0]["data_checksum"])) == 2 and private_releases_of("sha256:" + "0" * 64) == []


def test_unreadable_lines_are_skipped_and_entries_append(own_home):
    record_release({"data_checksum": "sha256:a", "rho": 0.5})
    with ledger_path().open("a") as stream:
        stream.write("not json\n")
    record_release({"data_checksum": "sha256:a", "rho": 0.25})
    assert [e["rho"] for e in private_releases_of("sha256:a")] == [0.5, 0.25]
    assert oct(ledger_path().stat().st_mode & 0o777) == "0o600"


def test_a_ledger_that_cannot_be_read_or_written_warns_and_the_release_stands(small_plan, tmp_path, own_home):
    """The ledger is a warning: a ledger path that can be neither read nor appended to (here a
    folder stands where the file should be: refused even to root, unlike a file mode) gives one
    warning line before the noise and one after the seal, and the release is sealed."""
    data = tmp_path / "data.zarr"
    write_synthetic(small_plan.spec, 12, data, seed=2, chunk_units=4, fsync=False)
    ledger_path().mkdir(parents=True)
    log = io.StringIO()
    result = run_release(small_plan.plan, data, tmp_path / "a.zarr", placement=Placement(serial=True), log=log,
                         fsync=False)
    warnings = [line for line in log.getvalue().splitlines() if line.startswith("distfit: warning: ")]
    assert len(warnings) == 2, log.getvalue()
    assert "cannot be read" in warnings[0] and "not recorded" in warnings[1]
    assert result.checksum.startswith("sha256:") and read_release(tmp_path / "a.zarr").attrs["complete"]
