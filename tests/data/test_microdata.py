"""Person-level microdata (CSV, Parquet) -> marginals store -> release (distfit.data.microdata)."""
from __future__ import annotations

import json
import os

import dask.dataframe
import numpy as np
import pandas as pd
import pytest
import yaml
import zarr

from tests.clitools import assert_one_line_error, run
from tests.storetools import reseal
import distfit.stores.data as data_module
import distfit.stores.files as files_module
from distfit.stores.data import DataError, open_data, read_marginals, staged_store
from distfit.data import microdata
from distfit.data.microdata import microdata_format, query_cliques, tabulate_microdata
from distfit.plan.job import run_plan
from distfit.stores.release import read_release, verify_release
from distfit.spec.parse import load_spec
from distfit.stores.plan import read_plan
from distfit.runtime.placement import Placement

SEX = ["Female", "Male"]
AGE_EDGES = [0, 30, 60, 200]
EDU = ["hs", "ba", "phd"]
SPEC = {
    "name": "people",
    "attributes": [
        {"name": "sex", "values": SEX},
        {"name": "age", "values": ["young", "mid", "old"], "ordinal": True, "bins": AGE_EDGES},
        {"name": "edu", "values": EDU, "column": "education"},
    ],
    "units": {"column": "block"},
    "queries": [
        {"name": "sex_age", "attributes": {"sex": "identity", "age": "prefix"}, "target": 2},
        {"name": "age_edu", "attributes": {"age": "identity", "edu": "identity"}, "target": 3},
        {"name": "edu", "attributes": {"edu": "identity"}, "target": 1},
        {"name": "all", "total": True, "target": 1},
    ],
    "blocks": {"max_cells": 9},
}
CLIQUES = [("sex", "age"), ("age", "edu")]
IDS = ["b10", "b2", "a-1", "z", "blk 7", "é9", "007", "7"]


def _people(n: int, seed: int, *, integer_ids: bool = False) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    units = rng.integers(0, len(IDS), n)
    return pd.DataFrame({
        "block": units * 10 + 3 if integer_ids else np.array([f" {IDS[u]} " if u % 2 else IDS[u] for u in units]),
        "sex": rng.choice([" Male", "Female", "Male "], n),
        "age": rng.integers(0, 100, n),
        "education": rng.choice(EDU, n),
        "income": rng.normal(size=n),
    })


def _codes(people: pd.DataFrame) -> dict[str, np.ndarray]:
    """Value codes computed independently of AttributeSpec.encode."""
    return {
        "sex": np.array([SEX.index(str(s).strip()) for s in people["sex"]]),
        "age": np.digitize(people["age"].astype(float), AGE_EDGES[1:-1]),
        "edu": np.array([EDU.index(str(e).strip()) for e in people["education"]]),
    }


def _unit_keys(people: pd.DataFrame):
    if pd.api.types.is_integer_dtype(people["block"]):
        return people["block"].to_numpy()
    return np.array([str(b).strip() for b in people["block"]])


def _groupby_counts(people: pd.DataFrame, clique, sizes=None) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unit ids, units x cells counts) of the marginal on ``clique`` via pandas groupby."""
    sizes = sizes or {"sex": 2, "age": 3, "edu": 3}
    codes = _codes(people)
    frame = pd.DataFrame({"unit": _unit_keys(people), **{a: codes[a] for a in clique}})
    counts = frame.groupby(["unit", *clique]).size()
    units = np.array(sorted(set(frame["unit"])))
    shape = tuple(sizes[a] for a in clique)
    out = np.zeros((len(units), int(np.prod(shape))), dtype=np.int64)
    position = {u: i for i, u in enumerate(units)}
    for key, value in counts.items():
        unit, *cell = key
        out[position[unit], np.ravel_multi_index(tuple(cell), shape)] += value
    return units, out


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("microdata")
    spec = root / "spec.yaml"
    spec.write_text(yaml.safe_dump(SPEC, allow_unicode=True))
    people = _people(600, seed=1)
    csv = root / "people.csv"
    people.to_csv(csv, index=False)
    parquet = root / "people.parquet"
    int_people = _people(500, seed=2, integer_ids=True)
    int_people.to_parquet(parquet, row_group_size=60)
    plan = root / "plan.zarr"
    run_plan(load_spec(spec), str(plan), placement=Placement(serial=True))
    return {"root": root, "spec": spec, "people": people, "csv": csv, "parquet": parquet,
            "int_people": int_people, "plan": plan}


def _arrays(path) -> dict[str, np.ndarray]:
    group = zarr.open_group(store=str(path), mode="r")
    return {name: arr[...] for name, arr in group.members(max_depth=None) if isinstance(arr, zarr.Array)}


def _check_against_groupby(store, people):
    data = read_marginals(store)
    assert data.cliques == tuple(CLIQUES)
    for i, clique in enumerate(CLIQUES):
        units, expected = _groupby_counts(people, clique)
        np.testing.assert_array_equal(np.asarray(data.unit_ids[...]), units)
        np.testing.assert_array_equal(data.marginals[i][...], expected)
    return data


# --------------------------------------------------------------------------------------------
# tabulation


def test_csv_tabulation_equals_a_groupby_count(inputs, tmp_path):
    out = tmp_path / "data.zarr"
    path = tabulate_microdata(load_spec(inputs["spec"]), inputs["csv"], out, chunk_units=3, fsync=False)
    assert path == out and sorted(p.name for p in tmp_path.iterdir()) == ["data.zarr"]
    data = _check_against_groupby(out, inputs["people"])
    a = data.attrs
    assert a["distfit_format"] == "marginals" and a["format_version"] == 3 and a["complete"] is True
    assert a["schema"] == {"attributes": ["sex", "age", "edu"], "sizes": [2, 3, 3]}
    assert a["spec_hash"] == load_spec(inputs["spec"]).spec_hash
    assert a["cliques"] == [list(c) for c in CLIQUES]
    assert a["units"] == len(IDS) and a["chunk_units"] == 3 and a["total_people"] == 600
    stat = os.stat(inputs["csv"])
    assert a["source"] == {"path": str(inputs["csv"]), "format": "csv", "size": stat.st_size,
                           "mtime": stat.st_mtime, "rows": 600}
    # string ids: the Zarr v3 variable-length string type, sorted, blanks stripped
    meta = json.loads((out / "unit_ids" / "zarr.json").read_text())
    assert meta["data_type"] == "string"
    assert list(data.unit_ids[...]) == sorted(IDS)
    assert zarr.open_array(str(out / "marginals/0"), mode="r").chunks == (3, 6)
    assert not (out / "_parts").exists()
    # the data-source interface a release uses
    opened = open_data(out)
    assert opened.format == "marginals" and opened.units == len(IDS) and opened.chunk_units == 3
    _, full = _groupby_counts(inputs["people"], ("sex", "age", "edu"))
    np.testing.assert_array_equal(opened.block_counts(("age",), 2, 5),
                                  full.reshape(-1, 2, 3, 3).sum(axis=(1, 3))[2:5])
    np.testing.assert_array_equal(opened.block_counts(("edu", "age"), 0, 3),
                                  full.reshape(-1, 2, 3, 3).sum(axis=1).reshape(-1, 9)[0:3])
    np.testing.assert_array_equal(opened.block_counts((), 0, 8), full.sum(axis=1, keepdims=True))
    with pytest.raises(DataError, match=r"no stored marginal holds the block attributes \['sex', 'edu'\]"):
        opened.block_counts(("sex", "edu"), 0, 3)


def test_parquet_with_integer_unit_ids(inputs, tmp_path):
    out = tmp_path / "data.zarr"
    tabulate_microdata(inputs["spec"], inputs["parquet"], out, fsync=False)
    data = _check_against_groupby(out, inputs["int_people"])
    assert np.dtype(data.unit_ids.dtype) == np.int64
    assert data.attrs["source"]["format"] == "parquet" and data.attrs["source"]["rows"] == 500


def test_partitions_and_chunks_do_not_change_the_store(inputs, tmp_path):
    spec = load_spec(inputs["spec"])
    one = tabulate_microdata(spec, inputs["csv"], tmp_path / "one.zarr", chunk_units=4, fsync=False)
    many = tabulate_microdata(spec, inputs["csv"], tmp_path / "many.zarr", chunk_units=4, fsync=False,
                              blocksize=1500)
    import dask.dataframe as dd

    assert dd.read_csv(inputs["csv"], blocksize=1500).npartitions > 5
    a, b = _arrays(one), _arrays(many)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    # a directory of Parquet files, split into row groups
    directory = tmp_path / "people-dir"
    directory.mkdir()
    people = inputs["int_people"]
    for i, start in enumerate(range(0, len(people), 200)):
        people.iloc[start:start + 200].to_parquet(directory / f"part-{i}.parquet", row_group_size=50)
    assert microdata_format(directory) == "parquet"
    split = tabulate_microdata(spec, directory, tmp_path / "dir.zarr", fsync=False, blocksize=2000)
    whole = tabulate_microdata(spec, inputs["parquet"], tmp_path / "whole.zarr", fsync=False)
    a, b = _arrays(split), _arrays(whole)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])


def test_the_merge_writes_the_same_store_whatever_it_holds_at_once(inputs, tmp_path, monkeypatch):
    """A merge task writes a chunk's marginals a few in one zarr call, up to WRITE_BYTES of
    counts at a time: at one byte (every marginal its own call) the store is the one written by
    default (all of a chunk's marginals in one call), array for array and checksum for checksum."""
    spec = load_spec(inputs["spec"])
    calls = []
    write_rows = data_module.write_rows
    monkeypatch.setattr(data_module, "write_rows", lambda *args: calls.append(write_rows(*args)) or calls[-1])
    together = tabulate_microdata(spec, inputs["csv"], tmp_path / "together.zarr", chunk_units=3, fsync=False)
    chunks = -(-read_marginals(together).units // 3)
    assert calls == [1] * chunks
    calls.clear()
    monkeypatch.setattr(files_module, "WRITE_BYTES", 1)
    apart = tabulate_microdata(spec, inputs["csv"], tmp_path / "apart.zarr", chunk_units=3, fsync=False)
    assert calls == [len(CLIQUES)] * chunks  # each marginal alone
    a, b = _arrays(together), _arrays(apart)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert read_marginals(together).attrs["checksum"] == read_marginals(apart).attrs["checksum"]


def test_no_unit_column_is_one_unit_and_gzip(inputs, tmp_path):
    spec = dict(SPEC, units=None)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    gz = tmp_path / "people.csv.gz"
    inputs["people"].drop(columns=["block"]).to_csv(gz, index=False, compression="gzip")
    data = read_marginals(tabulate_microdata(path, gz, tmp_path / "d.zarr", fsync=False))
    assert data.units == 1 and data.unit_ids[...].tolist() == [0]
    _, expected = _groupby_counts(inputs["people"].assign(block="x"), ("age", "edu"))
    np.testing.assert_array_equal(data.marginals[1][...], expected)


def test_query_cliques():
    spec = load_spec_dict(SPEC)
    assert query_cliques(spec) == CLIQUES
    assert query_cliques(spec, cover=[("sex", "age", "edu")]) == [("sex", "age", "edu")]
    assert query_cliques(spec, cover=[("edu", "sex")]) == [("sex", "age"), ("sex", "edu"), ("age", "edu")]
    total_only = load_spec_dict(dict(SPEC, queries=[{"name": "all", "total": True, "target": 1}]))
    assert query_cliques(total_only) == [()]


def load_spec_dict(content):
    from distfit.spec.parse import parse_spec

    return parse_spec(content)


# --------------------------------------------------------------------------------------------
# release


def _write_histograms(path, people, chunk_units):
    """The equivalent full-domain histograms store, made by hand (same unit ids and chunks)."""
    units, counts = _groupby_counts(people, ("sex", "age", "edu"))
    with staged_store(path, "histograms", fsync=False) as (_staging, group):
        group.create_array("counts", shape=counts.shape, dtype=np.int64, chunks=(chunk_units, counts.shape[1]))
        group["counts"][...] = counts
        group.create_array("unit_ids", shape=(len(units),), dtype=str, chunks=(chunk_units,))
        group["unit_ids"][...] = units
        group.attrs.update({"schema": {"attributes": ["sex", "age", "edu"], "sizes": [2, 3, 3]},
                            "units": len(units), "cells": 18, "chunk_units": chunk_units,
                            "created": "2026-01-01T00:00:00Z"})
    return path


def test_release_from_microdata_equals_release_from_histograms(inputs, tmp_path, capsys):
    out = tmp_path / "release.zarr"
    code, stdout, err = run(capsys, "release", str(inputs["plan"]), "--data", str(inputs["csv"]),
                            "--out", str(out), "--serial", "--seed", "5")
    assert code == 0, err
    assert "tabulated" in stdout and "release.zarr.data.zarr" in stdout
    tabulated = tmp_path / "release.zarr.data.zarr"
    data = read_marginals(tabulated)
    plan = read_plan(inputs["plan"])
    for block_id in plan.block_ids:  # every block is answered from a stored clique
        data.clique_for(plan.block(block_id).attributes)
    hist = _write_histograms(tmp_path / "hist.zarr", inputs["people"], data.chunk_units)
    reference = tmp_path / "reference.zarr"
    code, _, err = run(capsys, "release", str(inputs["plan"]), "--data", str(hist), "--out", str(reference),
                       "--serial", "--seed", "5")
    assert code == 0, err
    a, b = _arrays(out), _arrays(reference)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    assert list(a["unit_ids"]) == sorted(IDS)
    # the same noise on the same answers; the checksums differ only by the data each states it was made from
    assert verify_release(out)[0] and verify_release(reference)[0]
    assert read_release(out).attrs["data"]["path"] != read_release(reference).attrs["data"]["path"]
    # a rerun reuses the tabulated data; --resume on a sealed release is still refused
    created = data.attrs["created"]
    code, _, err = run(capsys, "release", str(inputs["plan"]), "--data", str(inputs["csv"]),
                       "--out", str(out), "--serial", "--seed", "6", "--overwrite")
    assert code == 0, err
    assert "reusing the data tabulated" in err
    assert read_marginals(tabulated).attrs["created"] == created


def test_duplicate_unit_ids_are_refused(inputs, tmp_path, capsys):
    people = inputs["people"]
    hist = _write_histograms(tmp_path / "hist.zarr", people, 3)
    ids = zarr.open_array(str(hist / "unit_ids"), mode="r+")
    ids[4] = ids[5][()]  # sorted ids with two equal neighbours, across a chunk boundary
    reseal(hist)  # sealed so (another tool's store): the readers' own check must catch it
    out = tmp_path / "r.zarr"
    code, _, err = run(capsys, "release", str(inputs["plan"]), "--data", str(hist), "--out", str(out), "--serial")
    assert code == 2
    assert_one_line_error(err, str(hist), f"unit id {str(ids[5][()])!r} appears more than once")
    assert not out.exists()
    ids[...] = np.array(["z", "b", "a", "c", "d", "e", "b", "f"])  # unsorted: checked with np.unique
    reseal(hist)
    code, _, err = run(capsys, "release", str(inputs["plan"]), "--data", str(hist), "--out", str(out), "--serial")
    assert code == 2
    assert_one_line_error(err, str(hist), "unit id 'b' appears more than once")
    marginals = tabulate_microdata(inputs["spec"], inputs["parquet"], tmp_path / "m.zarr", chunk_units=2,
                                   fsync=False, cover=[plan_block.attributes for plan_block in
                                                       read_plan(inputs["plan"]).iter_blocks()])
    capsys.readouterr()
    ids = zarr.open_array(str(marginals / "unit_ids"), mode="r+")
    ids[2] = ids[1]
    reseal(marginals)
    code, _, err = run(capsys, "release", str(inputs["plan"]), "--data", str(marginals), "--out", str(out),
                       "--serial")
    assert code == 2
    assert_one_line_error(err, str(marginals), f"unit id {int(ids[1])} appears more than once")
    assert not out.exists()


def test_merged_blocks_need_a_covering_clique(inputs, tmp_path, capsys):
    spec = tmp_path / "merged.yaml"
    spec.write_text(yaml.safe_dump(dict(SPEC, blocks={"max_cells": 18})))
    plan = tmp_path / "plan.zarr"
    run_plan(load_spec(spec), str(plan), placement=Placement(serial=True))
    attributes = {read_plan(plan).block(b).attributes for b in read_plan(plan).block_ids}
    assert ("sex", "age", "edu") in attributes  # merged across the two cliques
    bare = tmp_path / "bare.zarr"
    code, stdout, err = run(capsys, "tabulate", str(spec), "--data", str(inputs["csv"]), "--out", str(bare),
                            "--serial")
    assert code == 0, err
    assert "cliques        2" in stdout
    out = tmp_path / "r.zarr"
    code, _, err = run(capsys, "release", str(plan), "--data", str(bare), "--out", str(out), "--serial")
    assert code == 2
    assert_one_line_error(err, "no stored marginal holds the block attributes ['sex', 'age', 'edu']")
    assert not out.exists()
    covered = tmp_path / "covered.zarr"
    code, stdout, err = run(capsys, "tabulate", str(spec), "--data", str(inputs["csv"]), "--out", str(covered),
                            "--plan", str(plan), "--serial")
    assert code == 0, err
    assert read_marginals(covered).cliques == (("sex", "age", "edu"),)
    code, _, err = run(capsys, "release", str(plan), "--data", str(covered), "--out", str(out), "--serial")
    assert code == 0, err


# --------------------------------------------------------------------------------------------
# bad input


HEADER = "block,sex,age,education\n"
GOOD = "b1,Male,31,hs\nb2,Female,5,ba\n"

BAD_CSV = [
    ("missing-column.csv", "block,sex,age\nb1,Male,3\n",
     ["missing column 'education' (attribute edu)", "columns found: block, sex, age"]),
    ("missing-unit.csv", "sex,age,education\nMale,3,hs\n",
     ["missing column 'block' (the unit column)", "columns found: sex, age, education"]),
    ("bad-value.csv", HEADER + GOOD + "b3,Mle,40,hs\n",
     ["bad-value.csv: line 4, column 'sex': value 'Mle' is not a value of sex (values: Female, Male)"]),
    ("bad-bin.csv", HEADER + GOOD + "b3,Male,forty,hs\n",
     ["line 4, column 'age': value 'forty' is not in the bins of age (edges: 0, 30, 60, 200)"]),
    ("out-of-bins.csv", HEADER + "b3,Male,250,hs\n",
     ["line 2, column 'age': value '250' is not in the bins of age"]),
    ("empty-unit.csv", HEADER + GOOD + " ,Male,40,hs\n", ["line 4, column 'block': the unit id is empty"]),
    ("empty-value.csv", HEADER + "b1,Male,40,\n", ["line 2, column 'education': value '' is not a value of edu"]),
    ("empty.csv", "", ["empty.csv: empty file"]),
    ("header-only.csv", HEADER, ["header-only.csv: no data rows"]),
    ("malformed.csv", HEADER + GOOD + "\n" + "b3,Male,40,hs,extra\n",
     ["malformed.csv: line 5: malformed CSV: expected 4 fields, saw 5"]),
    ("latin1.csv", HEADER.encode() + "b1,Mäle,3,hs\n".encode("latin-1"), ["latin1.csv", "not UTF-8"]),
    ("garbage.parquet", b"this is not parquet", ["garbage.parquet: cannot read"]),
]


@pytest.mark.parametrize("name, content, fragments", BAD_CSV, ids=[c[0] for c in BAD_CSV])
def test_bad_microdata_exit_2_and_leave_nothing(inputs, tmp_path, capsys, name, content, fragments):
    source = tmp_path / name
    source.write_bytes(content if isinstance(content, bytes) else content.encode())
    out = tmp_path / "data.zarr"
    code, _, err = run(capsys, "tabulate", str(inputs["spec"]), "--data", str(source), "--out", str(out),
                       "--serial")
    assert code == 2
    assert_one_line_error(err, *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]


def test_bad_rows_in_later_partitions_are_located(inputs, tmp_path):
    spec = load_spec(inputs["spec"])
    lines = [HEADER.strip()] + [f"b{i % 5},{'Male' if i % 3 else 'Female'},{i % 90},hs" for i in range(300)]
    lines.insert(120, "")        # a blank line (skipped) before the bad row
    lines.insert(121, "   ")
    lines[250] = "b1,Male,40,college"  # physical line 251
    source = tmp_path / "late.csv"
    source.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"late.csv: line 251, column 'education': value 'college' is not a value"):
        tabulate_microdata(spec, source, tmp_path / "d.zarr", blocksize=1000, fsync=False)
    lines[250] = "b1,Male,40,hs,extra"
    source.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"late.csv: line 251: malformed CSV: expected 4 fields, saw 5"):
        tabulate_microdata(spec, source, tmp_path / "d.zarr", blocksize=1000, fsync=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["late.csv"]
    # Parquet: 1-based data row, a missing unit id
    people = inputs["int_people"].astype({"block": "Int64"})
    people.loc[333, "block"] = pd.NA
    parquet = tmp_path / "nulls.parquet"
    people.to_parquet(parquet, row_group_size=50)
    with pytest.raises(DataError, match=r"nulls.parquet: row 334, column 'block': the unit id is missing"):
        tabulate_microdata(spec, parquet, tmp_path / "d.zarr", blocksize=2000, fsync=False)
    with pytest.raises(DataError, match="no such file"):
        tabulate_microdata(spec, tmp_path / "absent.csv", tmp_path / "d.zarr")


def test_bad_microdata_through_release_and_run(inputs, tmp_path, capsys):
    source = tmp_path / "bad.csv"
    source.write_text(HEADER + GOOD + "b3,Mle,40,hs\n")
    out = tmp_path / "r.zarr"
    code, _, err = run(capsys, "release", str(inputs["plan"]), "--data", str(source), "--out", str(out), "--serial")
    assert code == 2
    assert_one_line_error(err, "bad.csv: line 4, column 'sex': value 'Mle'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]
    rundir = tmp_path / "run"
    code, _, err = run(capsys, "run", str(inputs["spec"]), "--data", str(source), "--out", str(rundir), "--serial")
    assert code == 2  # the plan is made first (its blocks decide the cliques), then the data refused
    assert_one_line_error(err.strip().splitlines()[-1], "line 4, column 'sex'")
    assert not (rundir / "data.zarr").exists() and not list(rundir.glob("data.zarr*"))
    code, _, err = run(capsys, "run", str(inputs["spec"]), "--data", str(tmp_path / "nope.csv"),
                       "--out", str(tmp_path / "run2"), "--serial")
    assert code == 2
    assert_one_line_error(err, "nope.csv: no such file")
    code, _, err = run(capsys, "run", str(inputs["spec"]), "--data", str(inputs["csv"]), "--units", "5",
                       "--out", str(tmp_path / "run3"), "--serial")
    assert code == 2
    assert_one_line_error(err, "--units is for synthetic data")
    # a missing column is refused before any work: nothing at all is written into RUNDIR
    columns = tmp_path / "columns.csv"
    columns.write_text(HEADER.replace("sex", "gender") + GOOD)
    code, _, err = run(capsys, "run", str(inputs["spec"]), "--data", str(columns),
                       "--out", str(tmp_path / "run4"), "--serial")
    assert code == 2 and "missing column 'sex'" in err and "columns found:" in err
    assert not (tmp_path / "run4").exists()


# --------------------------------------------------------------------------------------------
# run, cluster


def test_run_tabulates_then_reuses_and_refuses_a_changed_source(inputs, tmp_path, capsys):
    source = tmp_path / "people.csv"
    inputs["people"].to_csv(source, index=False)
    rundir = tmp_path / "run"
    code, stdout, err = run(capsys, "run", str(inputs["spec"]), "--data", str(source), "--out", str(rundir),
                            "--serial", "--no-report")  # the subject is the data store
    assert code == 0, err
    assert "(tabulated)" in stdout
    manifest = json.loads((rundir / "manifest.json").read_text())
    assert manifest["data"]["format"] == "marginals" and manifest["data"]["synthetic"] is False
    assert manifest["data"]["source"]["path"] == str(source) and manifest["data"]["units"] == len(IDS)
    assert "rows" not in manifest["data"]["source"]
    _check_against_groupby(rundir / "data.zarr", inputs["people"])
    checksum = read_release(rundir / "release.zarr").checksum
    code, stdout, err = run(capsys, "run", str(inputs["spec"]), "--data", str(source), "--out", str(rundir),
                            "--serial", "--no-report")
    assert code == 0, err
    assert "(reused)" in stdout and read_release(rundir / "release.zarr").checksum == checksum
    os.utime(source, (1_000_000, 1_000_000))
    code, _, err = run(capsys, "run", str(inputs["spec"]), "--data", str(source), "--out", str(rundir),
                       "--serial")
    assert code == 2
    assert_one_line_error(err, "data.zarr", "mtime differs", "use another --out")
    code, _, err = run(capsys, "run", str(inputs["spec"]), "--out", str(rundir), "--serial")
    assert code == 2
    assert_one_line_error(err, "tabulated from", "pass that --data again")


def test_local_cluster_equals_serial(inputs, tmp_path):
    from distributed import Client

    from distfit.runtime.cluster import local_cluster

    spec = load_spec(inputs["spec"])
    serial = tabulate_microdata(spec, inputs["csv"], tmp_path / "serial.zarr", chunk_units=3, fsync=False)
    bad = tmp_path / "bad.csv"
    lines = inputs["csv"].read_text().splitlines()
    lines[500] = "b1,Male,40,college"
    bad.write_text("\n".join(lines) + "\n")
    with local_cluster(2) as cluster, Client(cluster) as client:
        dask_store = tabulate_microdata(spec, inputs["csv"], tmp_path / "dask.zarr", chunk_units=3, fsync=False,
                                        client=client, blocksize=4000)
        with pytest.raises(DataError, match=r"bad.csv: line 501, column 'education': value 'college'"):
            tabulate_microdata(spec, bad, tmp_path / "bad.zarr", client=client, blocksize=4000, fsync=False)
        # a pass of one task runs in this process: a lazy client is asked for only by the merge
        # of several chunks (one partition: the scan never), once, and the store is the same
        asked = []
        lazy = {units: tabulate_microdata(spec, inputs["csv"], tmp_path / f"lazy{units}.zarr", chunk_units=units,
                                          fsync=False, client=lambda: asked.append(1) or client)
                for units in (3, 4096)}
    assert asked == [1]
    whole = tabulate_microdata(spec, inputs["csv"], tmp_path / "whole.zarr", chunk_units=4096, fsync=False)
    a, b, c = _arrays(serial), _arrays(dask_store), _arrays(lazy[3])
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
        np.testing.assert_array_equal(a[name], c[name])
    one = _arrays(lazy[4096])
    for name, array in _arrays(whole).items():
        np.testing.assert_array_equal(array, one[name])
    assert not list(tmp_path.glob("bad.zarr*"))


def test_resume_a_release_from_microdata(inputs, tmp_path, capsys):
    from distfit.release.job import run_release, tabulated_data_path

    class Interrupt(Exception):
        pass

    def stop_after_one(chunk):
        raise Interrupt(chunk)

    out, full = tmp_path / "r.zarr", tmp_path / "full.zarr"
    plan = read_plan(inputs["plan"])
    blocks = [plan.block(b).attributes for b in plan.block_ids]
    for release in (out, full):  # tabulated beforehand in chunks of 3 units: 3 release chunks
        tabulate_microdata(inputs["spec"], inputs["csv"], tabulated_data_path(release), chunk_units=3,
                           cover=blocks, fsync=False)
    with pytest.raises(Interrupt):
        run_release(inputs["plan"], inputs["csv"], out, seed=9, placement=Placement(serial=True),
                    after_chunk=stop_after_one)
    capsys.readouterr()
    code, stdout, err = run(capsys, "release", str(inputs["plan"]), "--data", str(inputs["csv"]), "--out", str(out),
                            "--serial", "--seed", "9", "--resume")
    assert code == 0, err
    assert "resumed" in stdout and "2 drawn now" in stdout and "reused" in stdout
    run_release(inputs["plan"], inputs["csv"], full, seed=9, placement=Placement(serial=True))
    a, b = _arrays(out), _arrays(full)
    for name in a:
        np.testing.assert_array_equal(a[name], b[name])
    # a negative count in a marginals store is refused by the chunk's task, naming the array
    bad = tabulated_data_path(tmp_path / "bad.zarr")
    tabulate_microdata(inputs["spec"], inputs["csv"], bad, chunk_units=3, cover=blocks, fsync=False)
    zarr.open_array(str(bad / "marginals/1"), mode="r+")[1, 2] = -1
    reseal(bad)  # sealed with it: the task's own check must catch it
    capsys.readouterr()
    code, _, err = run(capsys, "release", str(inputs["plan"]), "--data", str(bad), "--out",
                       str(tmp_path / "bad.zarr"), "--serial")
    assert code == 2
    assert_one_line_error(err, "chunk 0 (units 0..2)", "marginals/1 ['age', 'edu']",
                          "row 1, cell 2 holds -1, a negative count")


# --------------------------------------------------------------------------------------------
# geography: each unit's parent (a level of a multi-level run)

REGION = {unit: f"r{i % 3}" for i, unit in enumerate(sorted(IDS))}


def test_parent_ids_are_tabulated_and_released(inputs, tmp_path):
    from distfit.data.microdata import tabulation_mismatch
    from distfit.release.job import run_release

    people = inputs["people"].assign(region=[f" {REGION[str(b).strip()]}" for b in inputs["people"]["block"]])
    source = tmp_path / "people.csv"
    people.to_csv(source, index=False)
    spec = load_spec(inputs["spec"])
    out = tabulate_microdata(spec, source, tmp_path / "d.zarr", chunk_units=3, blocksize=2000, fsync=False,
                             parent_column="region")
    data = open_data(out)
    assert data.parent_column == "region" and data.attrs["parent_column"] == "region"
    assert data.parent_ids.metadata.dimension_names == ("unit",)
    assert list(data.parent_ids[...]) == [REGION[u] for u in data.unit_ids[...]]
    _check_against_groupby(out, people)  # the counts are what they were
    assert tabulation_mismatch(out, spec, source, parent_column="region") is None
    assert "parent ids of column 'region' stored, None wanted" in tabulation_mismatch(out, spec, source)
    # a store without parent ids reads as before
    plain = open_data(tabulate_microdata(spec, source, tmp_path / "plain.zarr", fsync=False))
    assert plain.parent_ids is None and plain.parent_column is None
    assert "None stored, 'region' wanted" in tabulation_mismatch(plain.path, spec, source, parent_column="region")
    # the release copies them (geography, not data) and its checksum covers them
    release = tmp_path / "r.zarr"
    run_release(inputs["plan"], out, release, seed=3, placement=Placement(serial=True))
    opened = read_release(release)
    assert opened.parent_column == "region"
    assert list(opened.parent_ids[...]) == list(data.parent_ids[...])
    assert verify_release(release)[0]
    zarr.open_array(str(release / "parent_ids"), mode="r+")[0] = "r2" if data.parent_ids[0] != "r2" else "r1"
    assert not verify_release(release)[0]
    run_release(inputs["plan"], plain.path, tmp_path / "r2.zarr", seed=3, placement=Placement(serial=True))
    assert read_release(tmp_path / "r2.zarr").parent_ids is None
    assert verify_release(tmp_path / "r2.zarr")[0]


def test_integer_parent_ids(inputs, tmp_path):
    people = inputs["int_people"].assign(state=lambda f: f["block"] // 20)
    source = tmp_path / "people.parquet"
    people.to_parquet(source, row_group_size=60)
    data = read_marginals(tabulate_microdata(inputs["spec"], source, tmp_path / "d.zarr", fsync=False,
                                             blocksize=2000, parent_column="state"))
    assert np.dtype(data.parent_ids.dtype) == np.int64
    np.testing.assert_array_equal(data.parent_ids[...], np.asarray(data.unit_ids[...]) // 20)


def test_a_unit_in_two_parents_is_refused(inputs, tmp_path, monkeypatch):
    spec = load_spec(inputs["spec"])
    people = inputs["people"].assign(region=[REGION[str(b).strip()] for b in inputs["people"]["block"]])
    rows = np.flatnonzero([str(b).strip() == "b2" for b in people["block"]])
    # within one partition: the row that names a second parent is located
    one = people.copy()
    one.loc[rows[1], "region"] = "elsewhere"
    source = tmp_path / "one.csv"
    one.to_csv(source, index=False)
    with pytest.raises(DataError) as raised:
        tabulate_microdata(spec, source, tmp_path / "d.zarr", fsync=False, parent_column="region")
    message = str(raised.value)
    assert "\n" not in message
    assert (f"one.csv: line {rows[1] + 2}, column 'region': unit 'b2' of 'block' has people in two parents, "
            f"'{REGION['b2']}' and 'elsewhere'") in message
    # across partitions: b2's people first, then everybody else, then b2's again with another parent
    # (after the rows the reader checks first: microdata.SNIFF_ROWS)
    monkeypatch.setattr(microdata, "SNIFF_ROWS", 10)
    b2 = people.iloc[rows]
    many = pd.concat([b2, people.drop(index=people.index[rows]), b2.assign(region="late")])
    source = tmp_path / "many.csv"
    many.to_csv(source, index=False)
    with pytest.raises(DataError, match=r"many.csv: column 'region': unit 'b2' of 'block' has people in two "
                                        rf"parents, '{REGION['b2']}' and 'late'"):
        tabulate_microdata(spec, source, tmp_path / "d.zarr", fsync=False, blocksize=2000, parent_column="region")
    # a missing parent id, and a missing parent column
    gap = people.copy()
    gap.loc[5, "region"] = ""
    gap.to_csv(tmp_path / "gap.csv", index=False)
    with pytest.raises(DataError, match=r"gap.csv: line 7, column 'region': the parent unit id is empty"):
        tabulate_microdata(spec, tmp_path / "gap.csv", tmp_path / "d.zarr", fsync=False, parent_column="region")
    with pytest.raises(DataError, match=r"missing column 'state' \(the parent unit column\)"):
        tabulate_microdata(spec, inputs["csv"], tmp_path / "d.zarr", fsync=False, parent_column="state")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gap.csv", "many.csv", "one.csv"]


# ------------------------------------------------------------------ junk refused from the file's start

JUNK_MB = 32
JUNK = {  # kind -> (the file's bytes, a fragment of the one error line)
    "binary": (lambda n: os.urandom(n), "not a CSV text file (a NUL byte at byte"),
    "no line break": (lambda n: b"x" * n, f"no line break in its first {microdata.SNIFF_BYTES} bytes"),
    "not UTF-8": (lambda n: b"x\n" + bytes(range(0x80, 0x100)) * (n // 128), "cannot read: not UTF-8 text (byte 3)"),
    "other columns": (lambda n: b"foo,bar\n" + b"1,2\n" * (n // 4), "missing column 'x' (attribute x); columns found: foo, bar"),
    "junk rows": (lambda n: b"x\n" + b"zzzz\n" * (n // 5), "line 2, column 'x': value 'zzzz' is not a value of x"),
    "one long row": (lambda n: b"x\n" + b"a" * n, f"no complete data row in its first {microdata.SNIFF_BYTES} bytes"),
}


@pytest.fixture()
def counted_reads(monkeypatch):
    """Bytes the microdata reader reads through ``open`` (the start of a CSV file), and a dask
    ``read_csv`` that fails the test: a refusal must come before the file is read in full."""
    read: list[int] = []

    class Counted:
        def __init__(self, handle):
            self._handle = handle

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._handle.close()

        def read(self, size=-1):
            data = self._handle.read(size)
            read.append(len(data))
            return data

        def __iter__(self):
            for line in self._handle:
                read.append(len(line))
                yield line

    monkeypatch.setattr(microdata, "open", lambda path, mode="r": Counted(open(path, mode)), raising=False)

    def whole_file(*args, **kwargs):
        raise AssertionError("the whole file was opened for reading")

    monkeypatch.setattr(dask.dataframe, "read_csv", whole_file)  # what runtime.placement.dask_dataframe() returns
    return read


@pytest.mark.parametrize("kind", list(JUNK))
def test_a_csv_that_is_not_microdata_of_the_spec_is_refused_from_its_start(tmp_path, capsys, counted_reads, kind):
    """A junk file of 32 MB (a stand-in for gigabytes) is refused from its first SNIFF_BYTES
    bytes: exit 2, one line naming the file and the problem, nothing at --out, at most
    SNIFF_BYTES + 1 bytes read and the whole-file reader never started."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: sx\nattributes:\n  - {name: x, values: [a, b, c]}\n"
                    "queries:\n  - {name: g, attributes: {x: identity}, target: 1}\n")
    make, fragment = JUNK[kind]
    source = tmp_path / "junk.csv"
    source.write_bytes(make(JUNK_MB << 20))
    assert source.stat().st_size > 30 * microdata.SNIFF_BYTES
    out = tmp_path / "d.zarr"
    code, _, err = run(capsys, "tabulate", str(spec), "--data", str(source), "--out", str(out), "--serial")
    assert code == 2
    assert_one_line_error(err, f"{source}: ", fragment)
    assert not out.exists()
    assert 0 < sum(counted_reads) <= microdata.SNIFF_BYTES + 1


def test_a_csv_whose_start_is_good_is_read_in_full(tmp_path, monkeypatch):
    """The check of the start refuses nothing valid: a bad row after the first SNIFF_ROWS rows is
    found by the whole pass, at its line; a good file is tabulated."""
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: sx\nattributes:\n  - {name: x, values: [a, b, c]}\n"
                    "queries:\n  - {name: g, attributes: {x: identity}, target: 1}\n")
    rows = ["a", "b", "c"] * (microdata.SNIFF_ROWS // 3 + 10)
    good = tmp_path / "good.csv"
    good.write_text("x\n" + "\n".join(rows) + "\n")
    marginals = read_marginals(tabulate_microdata(load_spec(spec), good, tmp_path / "good.zarr", fsync=False))
    assert marginals.block_counts(("x",), 0, marginals.units).sum() == len(rows)
    bad = tmp_path / "bad.csv"
    bad.write_text("x\n" + "\n".join(rows + ["zzzz"] + rows) + "\n")
    with pytest.raises(DataError, match=rf"bad.csv: line {len(rows) + 2}, column 'x': value 'zzzz'"):
        tabulate_microdata(load_spec(spec), bad, tmp_path / "bad.zarr", fsync=False)
