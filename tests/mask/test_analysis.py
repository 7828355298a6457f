"""The regression read from a mask store (distfit.mask.analysis): the store's Gram matrix, summed
block by block, and a tampered store refused."""
from __future__ import annotations

import io
import json

import numpy as np
import pytest

from distfit.mask import regression
from distfit.mask.analysis import gram
from distfit.mask.job import run_mask
from distfit.runtime.placement import Placement
from distfit.stores.mask import MaskError, read_verified_mask


def test_the_regression_of_a_store_is_its_corrected_gram_regression(tmp_path):
    rng = np.random.default_rng(8)
    x = rng.uniform(0, 10, 5000)
    y = 1.0 + 2.0 * x + rng.normal(0, 1, 5000)
    data = tmp_path / "d.csv"
    data.write_text("x,y\n" + "".join(f"{float(a)!r},{float(b)!r}\n" for a, b in zip(x, y)))
    out = tmp_path / "m.zarr"
    run_mask(data, out, columns=["x", "y"], bounds={"x": (0, 10), "y": (-10, 30)}, epsilon=8.0, delta=1e-5,
             block_rows=1000, seed=1, placement=Placement(serial=True), log=io.StringIO())
    store = read_verified_mask(out)
    whole = np.asarray(store.masked[...])
    np.testing.assert_allclose(gram(store), whole.T @ whole, rtol=1e-12)
    fit = regression(out, y="y", x=["x"])
    slope, se = fit.coefficients[1], fit.standard_errors[1]
    assert abs(slope - 2.0) < 5 * se  # the one draw lands where its standard error says
    naive = regression(out, y="y", x="x", corrected=False)
    assert abs(naive.coefficients[1]) < abs(slope)
    meta = out / "zarr.json"
    doc = json.loads(meta.read_text())
    doc["attributes"]["sigma"] = 0.0  # a store claiming less noise than it has
    meta.write_text(json.dumps(doc))
    with pytest.raises(MaskError, match="changed after it was sealed"):
        regression(out, y="y", x=["x"])
