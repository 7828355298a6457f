"""``distfit mask``'s driver (distfit.mask.job): the store holds ``A [X + C, 1]`` block by block
with orthogonal ``A`` and the right Gram matrix; resumed is byte-identical to uninterrupted; Dask
and serial agree; bad data leaves nothing behind."""
from __future__ import annotations

import io

import numpy as np
import pytest

from distfit.mask.haar import block_stream, masking_matrix
from distfit.mask.job import run_mask
from distfit.mask.orbit import masked_delta
from distfit.mask.scaling import scale_rows
from distfit.runtime.placement import Placement
from distfit.stores.mask import read_verified_mask

BOUNDS = {"a": (0.0, 100.0), "b": (-1.0, 1.0)}
SERIAL = Placement(serial=True)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(7)
    n = 230
    table = np.column_stack([rng.uniform(-5, 105, n), rng.normal(0, 0.5, n), rng.integers(0, 9, n)])
    path = tmp_path_factory.mktemp("mask") / "data.csv"
    lines = ["a,b,other"] + [f"{float(a)!r},{float(b)!r},{int(c)}" for a, b, c in table]
    path.write_text("\n".join(lines) + "\n")
    return path, table[:, :2]


def mask(data_path, out, **options):
    options = {"columns": ["a", "b"], "bounds": BOUNDS, "epsilon": 1.0, "delta": 1e-6, "block_rows": 50,
               "seed": 11, "placement": SERIAL, "log": io.StringIO(), **options}
    return run_mask(data_path, out, **options)


def test_each_block_is_an_orthogonal_mask_of_the_noisy_data(tmp_path, data):
    path, table = data
    result = mask(path, tmp_path / "m.zarr")
    store = read_verified_mask(result.path)
    assert not store.private and result.clipped == {"a": int(((table[:, 0] < 0) | (table[:, 0] > 100)).sum()), "b": int((abs(table[:, 1]) > 1).sum())}
    assert store.columns == ["a", "b", "(intercept)"] and store.masked.shape == (230, 3)
    assert store.block_rows.tolist() == [46] * 5  # 230 rows in ceil(230 / 50) = 5 even blocks
    scaled = scale_rows(table, store.centre[:2], store.scale[:2])
    start = 0
    for block, (size, y) in enumerate(zip(store.block_rows, store.blocks())):
        rng = block_stream(11, block)  # the block's draws, in their documented order
        noise = store.sigma * rng.standard_normal((size, 2))
        m = np.column_stack([scaled[start:start + size] + noise, np.ones(size)])
        np.testing.assert_allclose(y.T @ y, m.T @ m, rtol=1e-12, atol=1e-9)
        gaussian = rng.standard_normal((size, 3))
        order = rng.permutation(size)
        completed = np.column_stack([gaussian, np.random.default_rng(block).standard_normal((size, size - 3))])
        a = masking_matrix(m, completed, order)
        assert np.abs(a.T @ a - np.eye(size)).max() < 1e-12
        np.testing.assert_allclose(y, a @ m, rtol=0, atol=1e-12)
        start += size


def test_one_column_is_noised_by_setting_b_for_its_blocks(tmp_path, data):
    path, _ = data
    result = mask(path, tmp_path / "m.zarr", columns=["b"], bounds={"b": BOUNDS["b"]}, block_rows=100)
    store = read_verified_mask(result.path)
    assert store.block_rows.tolist() == [77, 77, 76]
    account = store.account
    assert account["block_rows"] == [76, 77] and account["sigma_masked"] == store.sigma == result.sigma
    assert store.sigma < account["sigma_gaussian"] / 3
    assert masked_delta(1.0, store.sigma, [76, 77]) <= 1e-6 < masked_delta(1.0, store.sigma * (1 - 1e-6), [76, 77])


class Interrupted(Exception):
    pass


def test_a_resumed_store_equals_an_uninterrupted_one_byte_for_byte(tmp_path, data):
    path, _ = data
    whole = mask(path, tmp_path / "whole.zarr")

    def stop(block):
        if block == 1:
            raise Interrupted

    with pytest.raises(Interrupted):
        mask(path, tmp_path / "part.zarr", after_chunk=stop)
    with pytest.raises(FileExistsError, match="incomplete mask"):
        mask(path, tmp_path / "part.zarr")
    with pytest.raises(ValueError, match="other sigma, account"):
        mask(path, tmp_path / "part.zarr", resume=True, epsilon=2.0)
    resumed = mask(path, tmp_path / "part.zarr", resume=True)
    assert resumed.resumed and resumed.blocks_drawn == 3
    assert resumed.checksum == whole.checksum
    a, b = read_verified_mask(whole.path), read_verified_mask(resumed.path)
    assert np.asarray(a.masked[...]).tobytes() == np.asarray(b.masked[...]).tobytes()
    assert not list(tmp_path.glob("*.input-*"))  # the staged data is gone


def test_dask_workers_write_what_the_serial_run_writes(tmp_path, data):
    path, _ = data
    serial = mask(path, tmp_path / "serial.zarr")
    dask = mask(path, tmp_path / "dask.zarr", placement=Placement(workers=2))
    assert dask.checksum == serial.checksum


def test_fresh_entropy_marks_the_store_private_and_differs(tmp_path, data):
    path, _ = data
    one = mask(path, tmp_path / "one.zarr", seed=None)
    two = mask(path, tmp_path / "two.zarr", seed=None)
    assert one.private and read_verified_mask(one.path).private
    assert one.checksum != two.checksum


def test_bounds_from_data_warn_and_are_not_private(tmp_path, data):
    path, table = data
    log = io.StringIO()
    result = mask(path, tmp_path / "m.zarr", bounds=None, bounds_from_data=True, seed=None, log=log)
    assert "warning: --bounds-from-data" in log.getvalue() and not result.private
    store = read_verified_mask(result.path)
    np.testing.assert_allclose(store.centre[:2] - store.scale[:2], table.min(axis=0))
    assert store.attrs["bounds_from_data"] is True


def test_a_bad_value_leaves_nothing_behind(tmp_path):
    path = tmp_path / "bad.csv"
    path.write_text("a,b\n" + "1,0.5\n" * 300 + "2,\n")
    with pytest.raises(ValueError, match="line 302, column 'b': a missing value"):
        mask(path, tmp_path / "m.zarr")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.csv"]
