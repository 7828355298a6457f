"""distfit/export/job.py: ``distfit export`` of a real seeded release and its estimates, read back
with pandas and pyarrow, the standard errors checked by Monte Carlo over identical units."""
from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
import scipy.stats
import zarr

from distfit.cli import main as cli
from distfit.export import job
from distfit.export.job import MARKER, run_export
from distfit.mathematics.margins import MOE90_Z
from distfit.stores.data import write_synthetic
from distfit.stores.estimate import read_estimate
from distfit.stores.plan import read_plan
from distfit.stores.release import read_release
from tests.clitools import assert_one_line_error, run
from tests.storetools import reseal
from tests.storetools import planned

#: Units with the same large counts (their noise independent: a Monte Carlo sample of the
#: release per query), then units of sparse synthetic counts (nonnegativity active).
SAME, SPARSE, CHUNK = 6144, 1024, 1024
#: The large counts of every SAME unit, one per cell (36 cells): far from 0 in sds, so no
#: nonnegativity constraint is ever active for them.
TRUTH = 200 + 7 * np.arange(36)
TABLES = {"age": (0, 6), "age_sex": (6, 18), "sex_edu": (18, 24)}


def _cli(*argv: str) -> None:
    code = cli.main(list(argv))
    assert code == 0, argv


@pytest.fixture(scope="module")
def stores(small_plan, tmp_path_factory):
    """The small plan, its data (string unit ids), a seeded release, its estimate and integer
    estimate, and the export of each (through the command line)."""
    root = tmp_path_factory.mktemp("export")
    data = root / "data.zarr"
    write_synthetic(small_plan.spec, SAME + SPARSE, data, seed=3, chunk_units=CHUNK, fsync=False)
    group = zarr.open_group(str(data), mode="r+")
    counts = group["counts"][...]
    counts[:SAME] = TRUTH
    group["counts"][...] = counts
    ids = np.array([f"unit-{i:05d}-é" for i in range(SAME + SPARSE)], dtype=object)
    for name in ("unit_ids", "unit"):
        del group[name]
        group.create_array(name, shape=ids.shape, dtype=str, chunks=(CHUNK,), dimension_names=("unit",))[...] = ids
    reseal(data)
    paths = {"plan": small_plan.plan, "data": str(data)}
    for name in ("release", "estimate", "integer"):
        paths[name] = str(root / f"{name}.zarr")
    _cli("release", small_plan.plan, "--data", str(data), "--out", paths["release"], "--seed", "5", "--serial")
    _cli("estimate", small_plan.plan, paths["release"], "--out", paths["estimate"], "--serial")
    _cli("estimate", small_plan.plan, paths["release"], "--out", paths["integer"], "--serial", "--integer")
    for name in ("release", "estimate", "integer"):
        paths[f"{name}_out"] = str(root / f"{name}-tables")
        _cli("export", paths[name], "--out", paths[f"{name}_out"])
    paths["ids"] = ids
    return paths


def read_both(directory: str, table: str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A table's CSV (pandas) and Parquet (pyarrow) files, as frames of plain columns."""
    from_csv = pd.read_csv(Path(directory) / f"{table}.csv", keep_default_na=False, na_values=[""])
    from_parquet = pq.read_table(Path(directory) / f"{table}.parquet").to_pandas()
    for frame in (from_csv, from_parquet):
        for column in ("unit", "table", "query", "se_note"):
            frame[column] = frame[column].astype(str)
        for column in ("level", "parent"):  # empty (null) for a store of one level without parents
            frame[column] = frame[column].astype("string")
        for column in ("estimate", "published"):  # an integral float is written "6": read as int by pandas
            frame[column] = frame[column].astype("float64")
    return from_csv, from_parquet


def test_release_rows_are_the_store_values_with_the_plan_variances(stores, small_plan):
    release, plan = read_release(stores["release"]), read_plan(stores["plan"])
    answers = np.asarray(release.answers[...])
    for table, (start, stop) in TABLES.items():
        from_csv, from_parquet = read_both(stores["release_out"], table)
        pd.testing.assert_frame_equal(from_csv, from_parquet)  # CSV and Parquet: the same rows, bit for bit
        width = stop - start
        assert len(from_csv) == (SAME + SPARSE) * width
        np.testing.assert_array_equal(from_csv["estimate"].to_numpy(), answers[:, start:stop].ravel())
        assert from_csv["unit"].tolist() == np.repeat(stores["ids"], width).tolist()
        assert set(from_csv["table"]) == {table} and set(from_csv["se_note"]) == {"raw-answer"}
        se = from_csv["se"].to_numpy().reshape(-1, width)
        np.testing.assert_allclose(se ** 2, np.broadcast_to(plan.queries_variances[start:stop], se.shape), rtol=1e-15)
        np.testing.assert_array_equal(from_csv["moe90"].to_numpy(), MOE90_Z * from_csv["se"].to_numpy())
        assert from_csv["published"].isna().all()
    words = read_both(stores["release_out"], "sex_edu")[0]["query"][:6].tolist()
    assert words == ["sex f, edu 0", "sex f, edu 0 to 1", "sex f, edu 0 to 2",
                     "sex m, edu 0", "sex m, edu 0 to 1", "sex m, edu 0 to 2"]
    ages = read_both(stores["release_out"], "age")[0]["query"][:6].tolist()
    assert ages == ["age 0", "age 0 to 1", "age 0 to 2", "age 0 to 3", "age 0 to 4", "age 0 to 5"]


def _check_gaussian(sample: np.ndarray, truth: np.ndarray, se: np.ndarray, tests: int) -> None:
    """Each column of ``sample`` (n independent draws) has mean ``truth`` and sd ``se``: a
    two-sided z test of the mean and chi-square test of the variance at 1e-6 overall."""
    n = sample.shape[0]
    level = 1e-6 / (2 * tests)
    z = (sample.mean(axis=0) - truth) / (se / np.sqrt(n))
    assert np.all(np.abs(z) < scipy.stats.norm.isf(level / 2)), z
    ratio = (n - 1) * sample.var(axis=0, ddof=1) / se ** 2
    low, high = scipy.stats.chi2.ppf(level / 2, n - 1), scipy.stats.chi2.isf(level / 2, n - 1)
    assert np.all((ratio > low) & (ratio < high)), ratio / (n - 1)


def test_stated_se_of_raw_answers_is_their_real_standard_deviation(stores, small_plan):
    """The SAME units hold the same counts and independent noise: each query's answers over
    them are a Monte Carlo sample of its released answer (6144 draws: the sd within 3.5 %)."""
    truth = small_plan.spec.workload().matrix @ TRUTH
    for table, (start, stop) in TABLES.items():
        rows = read_both(stores["release_out"], table)[1]
        values = rows["estimate"].to_numpy().reshape(-1, stop - start)[:SAME]
        se = rows["se"].to_numpy().reshape(-1, stop - start)[0]
        _check_gaussian(values, truth[start:stop], se, tests=24)


def test_estimate_se_is_stated_exactly_where_linear_and_is_the_real_standard_deviation(stores, small_plan):
    estimate = read_estimate(stores["estimate"])
    values, cells = np.asarray(estimate.estimates[...]), np.asarray(estimate.cells[...])
    answers = np.asarray(read_release(stores["release"]).answers[...])
    raw_se = {table: read_both(stores["release_out"], table)[1]["se"].to_numpy()[:stop - start]
              for table, (start, stop) in TABLES.items()}
    truth = small_plan.spec.workload().matrix @ TRUTH
    active = (cells == 0).any(axis=1)
    assert not active[:SAME].any() and active[SAME:].mean() > 0.5  # both kinds of unit are exported
    for table, (start, stop) in TABLES.items():
        from_csv, from_parquet = read_both(stores["estimate_out"], table)
        pd.testing.assert_frame_equal(from_csv, from_parquet)
        width = stop - start
        np.testing.assert_array_equal(from_csv["estimate"].to_numpy(), values[:, start:stop].ravel())
        notes = from_csv["se_note"].to_numpy().reshape(-1, width)
        se = from_csv["se"].to_numpy().reshape(-1, width)
        assert (notes[~active] == "linear-gls").all() and (notes[active] == "nonnegativity-active").all()
        assert np.isnan(se[active]).all() and np.isfinite(se[~active]).all()
        assert np.isnan(from_csv["moe90"].to_numpy().reshape(-1, width)[active]).all()
        # the plan's blocks measure independent subspaces (residual blocks), so the unconstrained
        # fit is exact: the GLS estimate is the raw answer itself, and W H^+ W^T its variance
        np.testing.assert_allclose(se[0], raw_se[table], rtol=1e-9)
        np.testing.assert_allclose(values[~active, start:stop], answers[~active, start:stop], rtol=0, atol=1e-8)
        _check_gaussian(values[:SAME, start:stop], truth[start:stop], se[0], tests=24)
        assert from_csv["published"].isna().all()


def test_integer_estimate_rows_publish_the_integers_without_se(stores):
    estimate = read_estimate(stores["integer"])
    values = np.asarray(estimate.estimates[...])
    assert values.dtype == np.int64
    for table, (start, stop) in TABLES.items():
        from_csv, from_parquet = read_both(stores["integer_out"], table)
        pd.testing.assert_frame_equal(from_csv, from_parquet)
        np.testing.assert_array_equal(from_parquet["published"].to_numpy(), values[:, start:stop].ravel())
        np.testing.assert_array_equal(from_parquet["estimate"].to_numpy(), values[:, start:stop].ravel())
        assert from_csv["se"].isna().all() and from_csv["moe90"].isna().all()
        assert set(from_csv["se_note"]) == {"integer-rounded"}
    assert pq.read_schema(Path(stores["integer_out"]) / "age.parquet").field("published").type == "int64"


def test_data_dictionary_states_columns_sources_and_privacy(stores):
    out = Path(stores["release_out"])
    text = (out / "README.txt").read_text(encoding="utf-8")
    plan = read_plan(stores["plan"])
    assert read_release(stores["release"]).checksum in text and plan.checksum in text
    assert f"rho = {plan.attrs['rho']:.6g}" in text
    first = plan.attrs["account"]["epsilon_delta"][0]
    assert f"epsilon = {first['epsilon']:.6g} at delta = {first['delta']:.0e}" in text
    assert "NOT PRIVATE" in text  # a seeded release
    assert "age.csv, age.parquet: 43008 rows" in text
    dictionary = pd.read_csv(out / "dictionary.csv")
    columns = pd.read_csv(out / "age.csv", nrows=1).columns.tolist()
    assert dictionary["column"].tolist()[:len(columns)] == columns
    assert {"se_note=linear-gls", "se_note=nonnegativity-active"} <= set(dictionary["column"])
    assert sorted(p.name for p in out.iterdir()) == sorted(
        [MARKER, "README.txt", "dictionary.csv"] + [f"{t}.{x}" for t in TABLES for x in ("csv", "parquet")])


def test_an_existing_out_is_refused_unless_overwrite_and_only_an_export_is_replaced(stores, tmp_path, capsys):
    out = tmp_path / "tables"
    assert run(capsys, "export", stores["release"], "--out", str(out))[0] == 0
    before = (out / "age.csv").read_bytes()
    code, _out, err = run(capsys, "export", stores["estimate"], "--out", str(out))
    assert code == 2
    assert_one_line_error(err, str(out), "--overwrite")
    assert (out / "age.csv").read_bytes() == before
    assert run(capsys, "export", stores["estimate"], "--out", str(out), "--overwrite")[0] == 0
    assert (out / "age.csv").read_bytes() != before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("keep me")
    code, _out, err = run(capsys, "export", stores["release"], "--out", str(mine), "--overwrite")
    assert code == 2
    assert_one_line_error(err, "not a distfit export")
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine", "tables"]  # no staging left


def test_bad_inputs_are_one_line_errors_and_write_nothing(stores, tmp_path, capsys):
    out = tmp_path / "out"
    for source, fragment in ((tmp_path / "absent.zarr", "no such store"),
                             (stores["plan"], "not a release or estimate store (a plan store)"),
                             (stores["data"], "not a release or estimate store (a histograms store)")):
        code, _out, err = run(capsys, "export", str(source), "--out", str(out))
        assert code == 2
        assert_one_line_error(err, fragment)
    assert list(tmp_path.iterdir()) == []


def test_a_changed_store_or_another_plan_is_refused(stores, tmp_path, capsys):
    release = tmp_path / "release.zarr"
    shutil.copytree(stores["release"], release)
    chunk = next(p for p in sorted((release / "queries" / "answers").rglob("*")) if p.is_file() and p.name != "zarr.json")
    raw = bytearray(chunk.read_bytes())
    raw[100] ^= 0x01  # one bit of one noisy answer (uncompressed float64)
    chunk.write_bytes(bytes(raw))
    code, _out, err = run(capsys, "export", str(release), "--out", str(tmp_path / "out"))
    assert code == 2
    assert_one_line_error(err, str(release), "changed after it was sealed")

    plan = tmp_path / "plan.zarr"
    shutil.copytree(stores["plan"], plan)
    group = zarr.open_group(str(plan), mode="r+")
    group.attrs["rho"] = float(group.attrs["rho"]) / 2  # a better privacy claim, edited in
    code, _out, err = run(capsys, "export", stores["release"], "--out", str(tmp_path / "out"), "--plan", str(plan))
    assert code == 2
    assert_one_line_error(err, str(plan), "changed after it was sealed")

    other = planned(tmp_path, {"name": "other", "attributes": [{"name": "a", "size": 2}],
                               "queries": [{"name": "a", "attributes": {"a": "identity"}, "target": 1}]},
                    "other.yaml", "other.zarr").plan
    code, _out, err = run(capsys, "export", stores["release"], "--out", str(tmp_path / "out"), "--plan", str(other))
    assert code == 2
    assert_one_line_error(err, "made from another plan")
    assert not (tmp_path / "out").exists()


def test_a_plan_no_longer_where_the_store_says_is_named_and_plan_overrides(stores, tmp_path, capsys):
    release = tmp_path / "release.zarr"
    shutil.copytree(stores["release"], release)
    zarr.open_group(str(release), mode="r+").attrs["plan_path"] = str(tmp_path / "moved" / "plan.zarr")
    reseal(release)  # as if the plan had been moved after the release
    code, _out, err = run(capsys, "export", str(release), "--out", str(tmp_path / "out"))
    assert code == 2
    assert_one_line_error(err, "moved/plan.zarr", "--plan")
    assert run(capsys, "export", str(release), "--out", str(tmp_path / "out"), "--plan", stores["plan"])[0] == 0
    first = read_both(str(tmp_path / "out"), "age")[1]
    pd.testing.assert_frame_equal(first, read_both(stores["release_out"], "age")[1])


def test_passes_runs_and_row_groups_do_not_change_the_files(stores, tmp_path, monkeypatch):
    """Tables in passes of 2 (two passes over the store), runs of 50 rows formatted on 3 threads,
    row groups of 1000 rows: the CSV is the same bytes and the Parquet the same table as the
    export in one pass with the defaults."""
    monkeypatch.setattr(job, "OPEN_TABLES", 2)
    monkeypatch.setattr(job, "ROWS_PER_WRITE", 50)
    monkeypatch.setattr(job, "PARQUET_ROWS", 1000)
    out = tmp_path / "small-runs"
    result = run_export(stores["estimate"], out, fsync=False, threads=3)
    assert [name for name, _ in result.tables] == list(TABLES)
    for table in TABLES:
        mine, theirs = out / f"{table}.parquet", Path(stores["estimate_out"]) / f"{table}.parquet"
        assert (out / f"{table}.csv").read_bytes() == (theirs.with_suffix(".csv")).read_bytes()
        assert pq.read_table(mine).equals(pq.read_table(theirs))
        assert pq.ParquetFile(mine).metadata.num_row_groups > 1


def test_no_se_is_stated_for_nonlinear_methods_or_a_covariance_too_large(stores, monkeypatch):
    plan, estimate = read_plan(stores["plan"]), read_estimate(stores["estimate"])
    for method in ("graphical-exact", "graphical-region-graph", "top-down"):
        source = job.error_source("estimate", SimpleNamespace(integer=False, method=method, variances=None), plan)
        assert (source.se, source.per_unit, source.note) == (None, False, "nonlinear-method")
    assert job.error_source("estimate", estimate, plan).note == "linear-gls"
    monkeypatch.setattr(job, "DENSE_CELLS", 35)  # the small plan has 36 cells
    source = job.error_source("estimate", estimate, plan)
    assert (source.se, source.note) == (None, "covariance-too-large")
