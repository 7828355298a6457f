"""Mask stores (distfit.stores.mask): the layout, and every change after the seal refused by the
verifying reader (tamper, then read)."""
from __future__ import annotations

import io
import json
import shutil

import numpy as np
import pytest
import zarr

from distfit.mask.job import run_mask
from distfit.runtime.placement import Placement
from distfit.stores.mask import DIMS, MaskError, read_mask, read_verified_mask, verify_mask


@pytest.fixture(scope="module")
def sealed(tmp_path_factory):
    root = tmp_path_factory.mktemp("maskstore")
    data = root / "d.csv"
    rng = np.random.default_rng(3)
    data.write_text("x,y\n" + "".join(f"{float(a)!r},{float(b)!r}\n" for a, b in rng.uniform(0, 1, (120, 2))))
    result = run_mask(data, root / "m.zarr", columns=["x", "y"], bounds={"x": (0, 1), "y": (0, 1)}, epsilon=1.0,
                      delta=1e-6, block_rows=40, seed=5, placement=Placement(serial=True), log=io.StringIO())
    return root / "m.zarr", result


@pytest.fixture
def copy(sealed, tmp_path):
    path = tmp_path / "m.zarr"
    shutil.copytree(sealed[0], path)
    return path


def test_the_layout(sealed):
    path, result = sealed
    store = read_verified_mask(path)
    group = zarr.open_group(str(path), mode="r")
    for name, dims in DIMS.items():
        assert tuple(group[name].metadata.dimension_names) == dims, name
    assert store.masked.dtype == np.float64 and store.masked.chunks == (40, 3)
    assert np.asarray(group["column"][...]).tolist() == ["x", "y", "(intercept)"]
    np.testing.assert_array_equal(store.centre, [0.5, 0.5, 0.0])
    np.testing.assert_array_equal(store.scale, [0.5, 0.5, 1.0])
    assert store.attrs["bounds"] == {"x": [0.0, 1.0], "y": [0.0, 1.0]}
    assert store.account["sigma"] == store.sigma == result.sigma
    assert store.checksum == result.checksum and verify_mask(path)[0]
    assert not any("clip" in key for key in store.attrs)  # counts of the data are never stored


def edit_attrs(path, **changes):
    meta = path / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"].update(changes)
    meta.write_text(json.dumps(doc))


@pytest.mark.parametrize("change", [
    lambda p: edit_attrs(p, sigma=0.001),
    lambda p: edit_attrs(p, private=True),
    lambda p: edit_attrs(p, account={"epsilon": 100.0}),
    lambda p: zarr.open_group(str(p), mode="r+")["masked"].__setitem__((0, 0), 0.0),
    lambda p: zarr.open_group(str(p), mode="r+")["scale"].__setitem__(0, 2.0),
    lambda p: (p / "masked" / "c" / "1" / "0").unlink(),
], ids=["sigma", "private", "account", "a-masked-value", "a-scale", "a-deleted-chunk"])
def test_a_tampered_store_is_refused_by_the_verifying_reader(copy, change):
    read_verified_mask(copy)
    change(copy)
    with pytest.raises(MaskError, match="changed after it was sealed"):
        read_verified_mask(copy)


def test_an_incomplete_or_foreign_store_is_refused(copy, tmp_path):
    edit_attrs(copy, complete=False)
    with pytest.raises(MaskError, match="incomplete"):
        read_mask(copy)
    with pytest.raises(MaskError):
        read_mask(tmp_path / "nothing.zarr")
