"""The estimate store: layout and dimension names (xarray opens it whole), the reader's refusals,
the seal's checks (distfit.stores.estimate)."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
import zarr

from distfit.estimate.job import METHOD, OBJECTIVE, run_estimate
from distfit.release.job import run_release
from distfit.stores.data import write_synthetic
from distfit.stores.estimate import (
    EstimateError,
    chunk_fit,
    chunk_rows,
    combine_fits,
    create_estimate,
    estimate_state,
    query_groups,
    read_estimate,
    read_sealed_estimate,
    seal,
    stated_geography,
    variance_pieces,
    verify_estimate,
    write_variance_rows,
)
from distfit.stores.plan import read_plan
from distfit.stores.release import read_release
from distfit.stores.release_chunks import ChunkWriter
from distfit.stores.sealing import ChangedChunk
from distfit.runtime.placement import Placement
from tests.storetools import stated_checksum

UNITS, CHUNK = 23, 10
#: The documented dimension names (docs/stores.md), written out: the contract, not the writer's table.
ESTIMATE_DIMS = {
    "queries/estimates": ("unit", "query"), "queries/query": ("query",),
    "cells/estimates": ("unit", "cell"), "cells/cell": ("cell",),
    "solve/objective": ("unit",), "solve/iterations": ("unit",), "solve/converged": ("unit",),
    "unit_ids": ("unit",), "unit": ("unit",), "chunks/done": ("chunk",),
    "chunks/digests": ("chunk", "digested", "digest_byte"),
}


@pytest.fixture(scope="module")
def stores(small_plan, tmp_path_factory):
    root = tmp_path_factory.mktemp("estimate-store")
    write_synthetic(small_plan.spec, UNITS, root / "data.zarr", seed=3, chunk_units=CHUNK, fsync=False)
    run_release(small_plan.plan, root / "data.zarr", root / "release.zarr", seed=5, placement=Placement(serial=True),
                fsync=False)
    run_estimate(small_plan.plan, root / "release.zarr", root / "estimate.zarr", placement=Placement(serial=True),
                 fsync=False)
    return {"root": root, "plan": small_plan.plan, "release": root / "release.zarr",
            "estimate": root / "estimate.zarr"}


def test_every_array_has_the_documented_dimension_names(stores):
    found = {}
    for meta in Path(stores["estimate"]).rglob("zarr.json"):
        doc = json.loads(meta.read_text())
        if doc["node_type"] == "array":
            found[meta.parent.relative_to(stores["estimate"]).as_posix()] = tuple(doc.get("dimension_names") or ())
    assert found == ESTIMATE_DIMS


def test_xarray_opens_the_store_whole(stores):
    tree = xr.open_datatree(stores["estimate"], engine="zarr", consolidated=False)
    est, release = read_estimate(stores["estimate"]), read_release(stores["release"])
    ids = np.asarray(release.unit_ids[...])
    np.testing.assert_array_equal(tree["unit"].values, ids)
    queries = tree["queries"].dataset["estimates"]
    assert queries.dims == ("unit", "query") and list(queries["query"].values) == release.labels
    cells = tree["cells"].dataset["estimates"]
    assert cells.dims == ("unit", "cell") and dict(cells.sizes) == {"unit": UNITS, "cell": 36}
    assert cells["cell"].values[0] == "age[0],sex[f],edu[0]" and cells["cell"].values[-1] == "age[5],sex[m],edu[2]"
    unit = int(ids[7])
    np.testing.assert_array_equal(queries.sel(unit=unit).values, np.asarray(est.estimates[7]))
    np.testing.assert_array_equal(cells.sel(unit=unit).values, np.asarray(est.cells[7]))
    assert tree["solve"].dataset["objective"].dims == ("unit",)
    # one query group's table, by its columns
    start, stop = est.groups["age_sex"]
    table = queries.isel(query=slice(start, stop))
    assert all(str(q).startswith("age_sex:") for q in table["query"].values)


def test_checksum_and_reader_refusals(stores, tmp_path):
    ok, stored, recomputed = verify_estimate(stores["estimate"])
    assert ok and stored == recomputed
    group = zarr.open_group(store=str(stores["estimate"]), mode="r")
    assert stated_checksum(stores["estimate"]) == stored
    assert estimate_state(Path(stores["estimate"])) == "sealed"
    assert estimate_state(tmp_path / "none") == "absent"
    copy = tmp_path / "copy.zarr"
    shutil.copytree(stores["estimate"], copy)
    zarr.open_array(str(copy / "cells/estimates"), mode="r+")[0, 0] += 1.0
    assert not verify_estimate(copy)[0]
    meta = json.loads((copy / "zarr.json").read_text())
    meta["attributes"]["complete"] = False
    (copy / "zarr.json").write_text(json.dumps(meta))
    assert estimate_state(copy) == "incomplete"
    with pytest.raises(EstimateError, match="incomplete"):
        read_estimate(copy)
    with pytest.raises(EstimateError, match="not 'estimate'"):
        read_estimate(stores["release"])
    with pytest.raises(EstimateError, match="no such estimate store"):
        read_estimate(tmp_path / "missing.zarr")
    with pytest.raises(FileExistsError, match="not a distfit estimate store"):
        estimate_state(Path(stores["release"]))


def _lay_out(stores, path):
    plan, release = read_plan(stores["plan"]), read_release(stores["release"])
    return create_estimate(path, plan=plan, plan_path=stores["plan"], release=release, method=METHOD,
                           objective=OBJECTIVE, integer=False, cells=36, query_dtype=np.float64,
                           cell_labels=None), plan, release


def _write_chunk(path, chunk, release, m):
    start, stop = chunk * CHUNK, min((chunk + 1) * CHUNK, UNITS)
    n = stop - start
    with ChunkWriter(str(path)) as writer:
        writer.write_arrays(chunk, start, chunk_rows(np.full((n, m), 1.5), np.full((n, 36), 0.25), np.arange(n),
                                                     7, np.ones(n, bool), np.asarray(release.unit_ids[start:stop])))


def test_seal_checks_every_chunk_and_the_inputs(stores, tmp_path):
    path = tmp_path / "e.zarr"
    root, plan, release = _lay_out(stores, path)
    m = len(plan.queries_targets)
    for chunk in (0, 2):
        _write_chunk(path, chunk, release, m)
    kwargs = dict(plan_path=stores["plan"], plan_checksum=plan.checksum, release_path=str(stores["release"]),
                  release_checksum=release.checksum, fsync=False)
    with pytest.raises(RuntimeError, match=r"chunks \[1\] not written"):
        seal(root, path, **kwargs)
    _write_chunk(path, 1, release, m)
    with pytest.raises(ValueError, match="the release changed during the estimate"):
        seal(root, path, **dict(kwargs, release_checksum="sha256:" + "1" * 64))
    with pytest.raises(ValueError, match="the plan changed during the estimate"):
        seal(root, path, **dict(kwargs, plan_checksum="sha256:" + "1" * 64))
    assert estimate_state(path) == "incomplete"
    checksum = seal(root, path, **kwargs)
    est = read_estimate(path)
    assert est.checksum == checksum == stated_checksum(path)
    assert est.attrs["fit"] == {"objective_mean": float(np.mean(np.r_[np.arange(10), np.arange(10), np.arange(3)])),
                                "objective_max": 9.0, "iterations_max": 7, "unconverged_units": 0}
    np.testing.assert_array_equal(np.asarray(est.estimates[...]), np.full((UNITS, m), 1.5))
    np.testing.assert_array_equal(np.asarray(est.unit_ids[...]), np.asarray(release.unit_ids[...]))
    assert est.labels == release.labels and "cell" not in zarr.open_group(str(path / "cells"), mode="r")


def test_fit_parts_combine_in_any_order():
    """The fit attr from chunk parts (chunk_fit, combine_fits) is the same in any order of the
    chunks, and what one pass over all rows gives (mean, max, non-finite objectives left out)."""
    rng = np.random.default_rng(3)
    objective = rng.uniform(0, 400, 1000)
    objective[[5, 700]] = [np.inf, np.nan]
    iterations = rng.integers(1, 9, 1000)
    converged = (rng.random(1000) > 0.01).astype(np.uint8)
    parts = [chunk_fit(objective[i:i + 128], iterations[i:i + 128], converged[i:i + 128]) for i in range(0, 1000, 128)]
    forward, backward = combine_fits(parts), combine_fits(parts[::-1])
    assert forward == backward
    finite = objective[np.isfinite(objective)]
    assert forward["objective_mean"] == pytest.approx(finite.mean(), rel=1e-14)
    assert forward["objective_max"] == finite.max() and forward["iterations_max"] == iterations.max()
    assert forward["unconverged_units"] == int((converged == 0).sum())
    assert combine_fits([chunk_fit(np.full(3, np.nan), np.zeros(3), np.ones(3))])["objective_mean"] is None


def test_query_groups():
    assert query_groups(["a:1", "a:2", "b:x", "c:total"]) == {"a": [0, 2], "b": [2, 3], "c": [3, 4]}
    assert query_groups(["a:1", "b:1", "a:2"]) is None  # a split group has no one slice
    assert query_groups(None) is None


def test_variances_per_class_read_per_unit_and_covered_by_the_checksum(stores, tmp_path):
    """A multi-level estimate's query variances once per class (``queries/variance_rows``) and each
    unit's class (``queries/variance_class``, per chunk): read per unit as ``rows[class]``, any
    rows and columns; the rows are a small array under the root checksum (a tampered row: the
    store refused as it is opened), the classes digested per chunk (a tampered class: the chunk
    refused as it is read). The pieces' numbering of the classes (resume bookkeeping, not under
    the checksum) is stated while the store is incomplete and gone once it is sealed."""
    plan, release = read_plan(stores["plan"]), read_release(stores["release"])
    m = len(plan.queries_targets)
    rng = np.random.default_rng(7)
    rows, classes = rng.uniform(0.5, 3.0, (4, m)), rng.integers(0, 4, UNITS)
    path = tmp_path / "v.zarr"
    geography = {"level": "county", "parent_estimate": {"path": "p", "checksum": "sha256:" + "2" * 64}}
    root = create_estimate(path, plan=plan, plan_path=stores["plan"], release=release, method=METHOD,
                           objective=OBJECTIVE, integer=False, cells=36, query_dtype=np.float64, cell_labels=None,
                           variance_classes=4, geography=geography, variance_pieces=[[0, 3], [20, 1]])
    assert variance_pieces(root) == [[0, 3], [20, 1]] and stated_geography(root) == geography
    write_variance_rows(root, 0, rows[:3])
    write_variance_rows(root, 3, rows[3:])
    for chunk, start in enumerate(range(0, UNITS, CHUNK)):
        stop = min(start + CHUNK, UNITS)
        n = stop - start
        with ChunkWriter(str(path)) as writer:
            writer.write_arrays(chunk, start, chunk_rows(np.full((n, m), 1.5), np.full((n, 36), 0.25), np.zeros(n), 1,
                                                         np.ones(n, bool), np.asarray(release.unit_ids[start:stop]),
                                                         variance_class=classes[start:stop]))
    seal(root, path, plan_path=stores["plan"], plan_checksum=plan.checksum, release_path=str(stores["release"]),
         release_checksum=release.checksum, fsync=False)
    est = read_sealed_estimate(path)
    meta = json.loads((path / "queries/variance_rows/zarr.json").read_text())
    assert "pieces" not in meta["attributes"] and est.attrs["geography"] == geography
    per_unit = rows[classes]  # the reference: every unit's row, as format 4 stored it
    assert est.variances.shape == (UNITS, m) and est.attrs["format_version"] == 5
    np.testing.assert_array_equal(np.asarray(est.variances), per_unit)
    np.testing.assert_array_equal(est.variances[3:17, 2:5], per_unit[3:17, 2:5])
    np.testing.assert_array_equal(est.variances[11], per_unit[11])
    dims = {n: tuple(json.loads((path / n / "zarr.json").read_text())["dimension_names"])
            for n in ("queries/variance_rows", "queries/variance_class")}
    assert dims == {"queries/variance_rows": ("variance_class", "query"), "queries/variance_class": ("unit",)}
    tree = xr.open_datatree(path, engine="zarr", consolidated=False)
    assert tree["queries"].dataset["variance_rows"].dims == ("variance_class", "query")

    tampered = tmp_path / "rows.zarr"
    shutil.copytree(path, tampered)
    zarr.open_array(str(tampered / "queries/variance_rows"), mode="r+")[2, 0] *= 0.5
    assert not verify_estimate(tampered)[0]
    with pytest.raises(EstimateError, match="hash to"):
        read_sealed_estimate(tampered)

    tampered = tmp_path / "class.zarr"
    shutil.copytree(path, tampered)
    zarr.open_array(str(tampered / "queries/variance_class"), mode="r+")[12] = (classes[12] + 1) % 4
    store = read_sealed_estimate(tampered)  # the root holds: the digests are the sealed ones
    np.testing.assert_array_equal(store.variances[0:10], per_unit[0:10])  # another chunk: unchanged
    with pytest.raises(ChangedChunk, match="variance_class"):
        store.variances[12]
