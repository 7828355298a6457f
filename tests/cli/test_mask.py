"""``distfit mask`` on the command line (distfit.cli.mask): a summary and a sealed store; every
bad input one line ``distfit: error: ...``, exit 2, nothing written."""
from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest

from distfit.mask import regression
from distfit.mask.job import run_mask
from distfit.runtime.placement import Placement
from distfit.stores.mask import read_verified_mask
from tests.cli.test_main import imported_packages
from tests.clitools import assert_one_line_error, run


@pytest.fixture
def csv(tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,b,name\n" + "".join(f"{i % 50},{(i * 7) % 13 - 6},n{i}\n" for i in range(200)))
    return path


def base(csv, tmp_path, *extra):
    return ["mask", str(csv), "--columns", "a,b", "--bounds", "a=0:50,b=-6:6", "--epsilon", "1",
            "--delta", "1e-6", "--out", str(tmp_path / "m.zarr"), "--serial", "--block-rows", "60", *extra]


def test_mask_writes_a_sealed_store_and_says_what_it_did(capsys, csv, tmp_path):
    code, out, err = run(capsys, *base(csv, tmp_path, "--seed", "3"))
    assert code == 0, err
    assert "sigma" in out and "not claimed" in out and "NOT PRIVATE" in out and "(sealed)" in out
    store = read_verified_mask(tmp_path / "m.zarr")
    assert store.rows == 200 and store.block_rows.tolist() == [50] * 4  # ceil(200 / 60) = 4 even blocks
    fit = regression(tmp_path / "m.zarr", y="b", x=["a"])
    assert fit.names == ("(intercept)", "a") and (fit.standard_errors > 0).all()
    code, _out, err = run(capsys, *base(csv, tmp_path, "--seed", "3"))
    assert code == 2
    assert_one_line_error(err, "already holds a sealed mask", "--overwrite")


def test_one_column_prints_the_sigma_of_both_settings(capsys, csv, tmp_path):
    argv = base(csv, tmp_path, "--seed", "3")
    argv[argv.index("--columns") + 1], argv[argv.index("--bounds") + 1] = "a", "a=0:50"
    code, out, err = run(capsys, *argv)
    assert code == 0, err
    account = read_verified_mask(tmp_path / "m.zarr").account
    line = next(row for row in out.splitlines() if "sigma" in row)
    assert f"{account['sigma']:.6g} used" in line and f"A, noise alone: {account['sigma_gaussian']:.6g}" in line
    assert f"B, with the mask: {account['sigma_masked']:.6g}" in line and account["sigma_masked"] < account["sigma_gaussian"]
    code, out, err = run(capsys, "audit", str(tmp_path / "m.zarr"))  # distfit audit recomputes the account
    assert code == 0, out + err
    assert "audit passed" in out and "sigma" in out and "mismatch" not in out


@pytest.mark.parametrize("change,fragments", [
    ({"--columns": "a,name", "--bounds": "a=0:50,name=0:1"}, ["line 2, column 'name': value 'n0' is not a number"]),
    ({"--columns": "a,zz", "--bounds": "a=0:50,zz=0:1"}, ["no column 'zz'"]),
    ({"--columns": "a,b", "--bounds": "a=0:50,b=-6:6,c=0:1"}, ["--bounds: 'c' is not one of --columns"]),
    ({"--bounds": "a=0:50"}, ["--bounds: no bounds for column 'b'"]),
    ({"--bounds": "a=50:0,b=-6:6"}, ["--bounds: a: LO must be < HI"]),
    ({"--bounds": "a=0:50,b=x:6"}, ["--bounds: b: LO and HI must be numbers"]),
    ({"--bounds": "a=0:50,b"}, ["--bounds: 'b' is not NAME=LO:HI"]),
    ({"--epsilon": "0"}, ["--epsilon must be finite and > 0"]),
    ({"--epsilon": "inf"}, ["--epsilon must be finite and > 0"]),
    ({"--delta": "1"}, ["--delta must be in (0, 1)"]),
    ({"--delta": "0"}, ["--delta must be in (0, 1)"]),
    ({"--block-rows": "2"}, ["--block-rows must be an integer > p = 2"]),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(capsys, csv, tmp_path, change, fragments):
    argv = base(csv, tmp_path)
    for flag, value in change.items():
        argv[argv.index(flag) + 1] = value
    code, _out, err = run(capsys, *argv)
    assert code == 2
    assert_one_line_error(err, *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv"]


@pytest.mark.parametrize("body,fragments", [
    ("1,2\n" * 5 + "3,inf\n", ["line 7, column 'b': value inf is not finite"]),
    ("1,2\n3,4\n", ["the data has 2 rows; a masked release needs more rows than columns (2)"]),
])
def test_infinite_values_and_too_few_rows_are_refused_after_the_read_with_nothing_left(capsys, tmp_path, body,
                                                                                         fragments):
    """Found only once the file is read (staged next to --out): still one line, exit 2, and
    neither --out nor the staged data left behind."""
    path = tmp_path / "d.csv"
    path.write_text("a,b\n" + body)
    code, out, err = run(capsys, "mask", str(path), "--columns", "a,b", "--bounds", "a=0:5,b=0:5", "--epsilon",
                         "1", "--delta", "1e-6", "--out", str(tmp_path / "m.zarr"), "--serial")
    assert code == 2 and out == ""
    assert_one_line_error(err, *fragments)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv"]


def test_missing_values_and_missing_bounds(capsys, tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,b\n" + "1,2\n" * 10 + "1,NaN\n")
    code, _out, err = run(capsys, "mask", str(path), "--columns", "a,b", "--bounds", "a=0:5,b=0:5", "--epsilon",
                          "1", "--delta", "1e-6", "--out", str(tmp_path / "m.zarr"), "--serial")
    assert code == 2
    assert_one_line_error(err, "line 12, column 'b': a missing value")
    code, _out, err = run(capsys, "mask", str(path), "--columns", "a,b", "--epsilon", "1", "--delta", "1e-6",
                          "--out", str(tmp_path / "m.zarr"), "--serial")
    assert code == 2
    assert_one_line_error(err, "--bounds is required")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d.csv"]


def _naive_reference(store, y, x):
    """The naive OLS of ``y`` on ``x`` from the masked rows by numpy's least squares (scaled
    units, mapped back to the data's), and its classical standard errors: an independent
    reference for ``distfit regress --naive``."""
    rows, columns = np.asarray(store.masked[...]), store.columns
    design = rows[:, [columns.index("(intercept)")] + [columns.index(c) for c in x]]
    target = rows[:, columns.index(y)]
    b, rss, *_ = np.linalg.lstsq(design, target, rcond=None)
    cov = rss[0] / (len(target) - design.shape[1]) * np.linalg.inv(design.T @ design)
    iy, ix = columns.index(y), [columns.index(c) for c in x]
    t = np.zeros((len(b), len(b)))  # scaled -> data units: beta = t b + (m_y, 0, ...)
    t[0, 0] = store.scale[iy]
    t[0, 1:] = -store.scale[iy] * store.centre[ix] / store.scale[ix]
    t[range(1, len(b)), range(1, len(b))] = store.scale[iy] / store.scale[ix]
    beta = t @ b
    beta[0] += store.centre[iy]
    return beta, np.sqrt(np.diag(t @ cov @ t.T))


def _table(out):
    """``{term: (coefficient, standard error)}`` from ``distfit regress``'s table."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.split()[:1] == ["term"])
    return {parts[0]: (float(parts[1]), float(parts[2])) for parts in (line.split() for line in lines[start + 1:])}


def test_regress_prints_the_fit_of_a_verified_store(capsys, sealed):
    _csv, store_path = sealed
    store = read_verified_mask(store_path)
    code, out, err = run(capsys, "regress", str(store_path), "--y", "b", "--naive")  # --x: every other column
    assert code == 0 and err == "", err
    assert "b on a" in out and f"n {store.rows}" in out and f"{store.sigma:.6g}" in out and "--naive" in out
    beta, se = _naive_reference(store, "b", ["a"])
    table = _table(out)
    assert list(table) == ["(intercept)", "a"]
    np.testing.assert_allclose([table["(intercept)"][0], table["a"][0]], beta, rtol=1e-5)
    np.testing.assert_allclose([table["(intercept)"][1], table["a"][1]], se, rtol=1e-5)
    code, out, err = run(capsys, "regress", str(store_path), "--y", "a", "--x", "b")
    assert code == 0, err
    fit = regression(store_path, y="a", x=["b"])
    assert "errors in variables" in out and "b" in out
    assert _table(out) == {n: (float(f"{c:.6g}"), float(f"{s:.6g}")) for n, (c, s) in fit.as_dict().items()}
    code, out, err = run(capsys, "regress", str(store_path), "--y", "a", "--x", "")  # the mean alone
    assert code == 0 and list(_table(out)) == ["(intercept)"] and "a on the intercept alone" in out


@pytest.fixture(scope="module")
def sealed(tmp_path_factory):
    """A CSV of columns a and b and a sealed mask store of them (seeded)."""
    place = tmp_path_factory.mktemp("regress")
    csv = place / "d.csv"
    csv.write_text("a,b\n" + "".join(f"{i % 50},{(i * 7) % 13 - 6}\n" for i in range(200)))
    run_mask(csv, place / "m.zarr", columns=["a", "b"], bounds={"a": (0, 50), "b": (-6, 6)}, epsilon=1.0,
             delta=1e-6, block_rows=60, seed=3, placement=Placement(serial=True), log=io.StringIO())
    return csv, place / "m.zarr"


def _tampered(path):
    meta = path / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["sigma"] = 0.0  # a store claiming less noise than it has
    meta.write_text(json.dumps(doc))


@pytest.mark.parametrize("argv,fragments", [
    (["--y", "zz"], ["regression: y: no data column 'zz' (columns: a, b)"]),
    (["--y", "a", "--x", "b,zz"], ["regression: x: no data column 'zz'"]),
    (["--y", "a", "--x", "(intercept)"], ["regression: x: no data column '(intercept)'"]),
    (["--y", "a", "--x", "a,b"], ["'a' is both the response (y) and a regressor (x)"]),
    (["--y", "a", "--x", "b,b"], ["x: the regressor 'b' is named twice"]),
    (["--y", "a", "--x", "b,,"], ["--x: an empty column name"]),
    (["--x", "b"], ["--y"]),
    (["--y", "a", "STORE=csv"], ["d.csv", "mask store"]),
    (["--y", "a", "STORE=missing"], ["no such mask store"]),
    (["--y", "a", "STORE=tampered"], ["changed after it was sealed"]),
])
def test_regress_refuses_bad_input_in_one_line(capsys, sealed, tmp_path, argv, fragments):
    csv, store = sealed
    if "STORE=tampered" in argv:
        store = shutil.copytree(store, tmp_path / "tampered.zarr")
        _tampered(store)
    target = {"STORE=csv": csv, "STORE=missing": tmp_path / "none.zarr", "STORE=tampered": store}
    path = next((target[a] for a in argv if a in target), store)
    places = (tmp_path, csv.parent)
    before = [sorted(p.relative_to(place) for p in place.rglob("*")) for place in places]
    code, out, err = run(capsys, "regress", str(path), *(a for a in argv if a not in target))
    assert code == 2 and out == ""
    assert_one_line_error(err, *fragments)
    assert [sorted(p.relative_to(place) for p in place.rglob("*")) for place in places] == before  # nothing written


def test_regress_imports_neither_pandas_nor_dask(sealed):
    """``distfit regress`` reads one store: its module (distfit.cli.regressing) keeps the CSV
    reader and the cluster of ``distfit mask`` out (checked on ``python -X importtime``)."""
    _csv, store = sealed
    code, packages = imported_packages(["regress", str(store), "--y", "a"])
    assert code == 0 and "distfit" in packages
    assert sorted(packages & {"pandas", "pyarrow", "dask", "distributed"}) == []
