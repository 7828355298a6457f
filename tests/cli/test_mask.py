"""``distfit mask`` on the command line (distfit.cli.mask): a summary and a sealed store; every
bad input one line ``distfit: error: ...``, exit 2, nothing written."""
from __future__ import annotations

import pytest

from distfit.mask import regression
from distfit.stores.mask import read_verified_mask
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
