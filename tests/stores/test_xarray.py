"""Every store opens whole in xarray (issue 13): Zarr v3 ``dimension_names`` on every array,
coordinates where a dimension has labels, and stores written without them still read by distfit.

The expected dimension names below are written out literally: they are the documented contract
(README "Store formats"), not a copy of the writers' tables.
"""
from __future__ import annotations

import io
import itertools
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import xarray as xr
import yaml
import zarr

from distfit.audit.plan import audit_plan
from distfit.data.microdata import tabulate_microdata
from distfit.plan.job import run_plan
from distfit.release.job import run_release
from distfit.spec.parse import load_spec
from distfit.stores.data import cell_labels, open_data, read_histograms, read_marginals, value_labels, write_synthetic
from distfit.stores.plan import read_plan, verify_checksum
from distfit.stores.release import read_release, verify_release
from distfit.runtime.placement import Placement
from tests.reference import SMALL_SPEC
from tests.storetools import relist_digests, reseal

ROOT = Path(__file__).resolve().parents[2]
UNITS, CHUNK, SEED = 30, 10, 11
STRING_IDS = ["b10", "b2", "a-1", "z", "blk 7", "é9", "007", "7"]

PLAN_DIMS = {
    "queries/targets": ("query",), "queries/variances": ("query",),
    "blocks/*/basis": ("basis_row", "cell"), "blocks/*/recon": ("block_query", "basis_row"),
    "blocks/*/query_index": ("block_query",), "blocks/*/sigma": ("basis_row", "basis_col"),
    "blocks/*/targets": ("block_query",), "blocks/*/variances": ("block_query",),
    "blocks/*/profile": ("cell",),
    "blocks/*/cell_weights": ("cell",), "blocks/*/query_weights": ("block_query",),  # the dual certificate
}
RELEASE_DIMS = {
    "blocks/*/answers": ("unit", "block_query"), "blocks/*/block_query": ("block_query",),
    "queries/answers": ("unit", "query"), "queries/variances": ("query",), "queries/query": ("query",),
    "unit_ids": ("unit",), "unit": ("unit",), "chunks/done": ("chunk",),
    "chunks/digests": ("chunk", "digested", "digest_byte"),  # per-chunk digests (issue 28)
}
HISTOGRAMS_DIMS = {"counts": ("unit", "cell"), "unit_ids": ("unit",), "unit": ("unit",), "cell": ("cell",),
                   "chunks/digests": ("chunk", "digested", "digest_byte")}
MARGINALS_DIMS = {"marginals/0": ("unit", "cell_0"), "marginals/1": ("unit", "cell_1"),
                  "marginals/cell_0": ("cell_0",), "marginals/cell_1": ("cell_1",),
                  "unit_ids": ("unit",), "unit": ("unit",), "chunks/digests": ("chunk", "digested", "digest_byte")}


@pytest.fixture(scope="module")
def stores(small_plan, tmp_path_factory):
    """A run directory laid out like ``distfit run``'s (plan, histograms data, release), plus a
    marginals store with string unit ids tabulated from microdata and its release."""
    root = tmp_path_factory.mktemp("xarray-stores")
    run = root / "run"
    run.mkdir()
    shutil.copytree(small_plan.plan, run / "plan.zarr")
    write_synthetic(small_plan.spec, UNITS, run / "data.zarr", seed=1, chunk_units=CHUNK, fsync=False)
    run_release(run / "plan.zarr", run / "data.zarr", run / "release.zarr", seed=SEED, placement=Placement(serial=True),
                fsync=False)

    # microdata with string unit ids, for the same schema (a spec with a unit column)
    spec_path = root / "people.yaml"
    spec_path.write_text(yaml.safe_dump({**SMALL_SPEC, "units": {"column": "block"}}))
    rng = np.random.default_rng(5)
    n = 300
    pd.DataFrame({"block": rng.choice(STRING_IDS, n), "age": rng.integers(0, 6, n),
                  "sex": rng.choice(["f", "m"], n), "edu": rng.integers(0, 3, n)}).to_csv(root / "people.csv", index=False)
    plan = read_plan(run / "plan.zarr")
    tabulate_microdata(load_spec(spec_path), root / "people.csv", root / "marginals.zarr", fsync=False,
                       cover=[plan.block(b).attributes for b in plan.block_ids], chunk_units=3)
    run_release(run / "plan.zarr", root / "marginals.zarr", root / "release-str.zarr", seed=SEED,
                placement=Placement(serial=True), fsync=False)
    return {"root": root, "run": run, "plan": run / "plan.zarr", "data": run / "data.zarr",
            "release": run / "release.zarr", "marginals": root / "marginals.zarr",
            "release_str": root / "release-str.zarr", "spec": small_plan.spec}


def _tree(path) -> xr.DataTree:
    return xr.open_datatree(path, engine="zarr", consolidated=False)


def _dims_on_disk(path) -> dict[str, tuple[str, ...] | None]:
    """Every array of the store (its path) -> the ``dimension_names`` in its zarr.json."""
    out = {}
    for meta in Path(path).rglob("zarr.json"):
        doc = json.loads(meta.read_text())
        if doc["node_type"] == "array":
            names = doc.get("dimension_names")
            out[str(meta.parent.relative_to(path))] = None if names is None else tuple(names)
    return out


def _pattern(name: str) -> str:
    return re.sub(r"^blocks/[^/]+/", "blocks/*/", name)


@pytest.mark.parametrize("store, expected", [
    ("plan", PLAN_DIMS), ("release", RELEASE_DIMS), ("data", HISTOGRAMS_DIMS),
    ("marginals", MARGINALS_DIMS), ("release_str", RELEASE_DIMS)])
def test_every_array_has_the_documented_dimension_names(stores, store, expected):
    found = _dims_on_disk(stores[store])
    assert found, store
    by_pattern: dict[str, set] = {}
    for name, dims in found.items():
        assert dims is not None, f"{store}: {name} has no dimension_names"
        by_pattern.setdefault(_pattern(name), set()).add(dims)
    assert all(len(v) == 1 for v in by_pattern.values()), by_pattern  # the same names in every block
    assert {k: next(iter(v)) for k, v in by_pattern.items()} == expected


def test_plan_opens_whole_and_matches_read_plan(stores):
    tree = _tree(stores["plan"])
    plan = read_plan(stores["plan"])
    assert set(tree.children) == {"queries", "blocks"}
    np.testing.assert_array_equal(tree["queries"]["targets"].values, plan.queries_targets)
    assert tree["queries"]["variances"].dims == ("query",)
    assert set(tree["blocks"].children) == set(plan.block_ids)
    for block in plan.iter_blocks():
        node = tree[f"blocks/{block.block_id}"]
        m_b, k, d_b = block.shape
        assert dict(node.sizes) == {"block_query": m_b, "basis_row": k, "basis_col": k, "cell": d_b}
        for name in ("basis", "recon", "query_index", "sigma", "targets", "variances", "profile",
                     "cell_weights", "query_weights"):
            np.testing.assert_array_equal(node[name].values, getattr(block, name), err_msg=name)
        assert node.attrs["attributes"] == list(block.attributes)
    # a plan has no coordinate arrays: its checksum is the one the same plan had before (the
    # session plan and this copy are the same bytes) and dimension names alone do not move it
    assert verify_checksum(stores["plan"])[0]


@pytest.mark.parametrize("release_key, data_key", [("release", "data"), ("release_str", "marginals")])
def test_release_sel_by_unit_equals_read_release(stores, release_key, data_key):
    tree = _tree(stores[release_key])
    release = read_release(stores[release_key])
    data = open_data(stores[data_key])
    ids = np.asarray(release.unit_ids[...])
    np.testing.assert_array_equal(ids, np.asarray(data.unit_ids[...]))
    np.testing.assert_array_equal(tree["unit"].values, ids)
    queries = tree["queries"].dataset
    assert queries["answers"].dims == ("unit", "query")
    assert list(queries["query"].values) == release.labels
    answers = np.asarray(release.answers[...])
    for row in (0, len(ids) // 2, len(ids) - 1):
        unit = ids[row].item() if isinstance(ids[row], np.generic) else ids[row]
        got = queries["answers"].sel(unit=unit)
        np.testing.assert_array_equal(got.values, answers[row])
        label = release.labels[-1]
        assert got.sel(query=label).item() == answers[row, -1]
    # block answers carry the unit coordinate (inherited from the root) and their rows' labels
    plan = read_plan(stores["plan"])
    for block in plan.iter_blocks():
        node = tree[f"blocks/{block.block_id}"].dataset
        assert list(node["block_query"].values) == [release.labels[j] for j in block.query_index]
        np.testing.assert_array_equal(node["answers"].sel(unit=ids[1]).values,
                                      np.asarray(release.block_answers(block.block_id)[1]))
    # pandas: a units x queries table labelled both ways
    frame = queries["answers"].to_pandas()
    assert list(frame.index) == list(ids) and list(frame.columns) == release.labels


def test_string_unit_ids_select(stores):
    tree = _tree(stores["release_str"])
    ids = list(tree["unit"].values)
    assert sorted(ids) == ids and set(ids) <= set(STRING_IDS) and "é9" in ids
    row = ids.index("é9")
    np.testing.assert_array_equal(tree["queries"]["answers"].sel(unit="é9").values,
                                  read_release(stores["release_str"]).answers[row])


def test_histograms_open_whole_with_cell_labels(stores):
    tree = _tree(stores["data"])
    data = read_histograms(stores["data"])
    counts = tree["counts"]
    assert counts.dims == ("unit", "cell") and counts.shape == (UNITS, data.cells)
    np.testing.assert_array_equal(tree["unit"].values, np.arange(UNITS))
    # cell labels: an independent row-major enumeration of the spec's values
    spec = stores["spec"]
    expected = [",".join(f"{a.name}[{v}]" for a, v in zip(spec.attributes, combo))
                for combo in itertools.product(*(a.values for a in spec.attributes))]
    assert list(tree["cell"].values) == expected
    np.testing.assert_array_equal(counts.sel(unit=17).values, data.counts[17])
    assert counts.sel(unit=17, cell="age[2],sex[m],edu[1]").item() == data.counts[17][np.ravel_multi_index(
        (2, 1, 1), data.domain.shape)]


def test_marginals_open_whole_with_cell_labels(stores):
    tree = _tree(stores["marginals"])
    data = read_marginals(stores["marginals"])
    node = tree["marginals"].dataset
    values = value_labels(stores["spec"])
    ids = list(np.asarray(data.unit_ids[...]))
    for i, clique in enumerate(data.cliques):
        arr = node[str(i)]
        assert arr.dims == ("unit", f"cell_{i}")
        labels = [",".join(f"{n}[{v}]" for n, v in zip(clique, combo))
                  for combo in itertools.product(*(values[n] for n in clique))]
        assert list(node[f"cell_{i}"].values) == labels
        np.testing.assert_array_equal(arr.sel(unit=ids[2]).values, data.marginals[i][2])


def test_cell_labels():
    values = {"a": ("x", "y"), "b": ("0", "1", "2")}
    assert list(cell_labels(("a", "b"), values)) == ["a[x],b[0]", "a[x],b[1]", "a[x],b[2]",
                                                      "a[y],b[0]", "a[y],b[1]", "a[y],b[2]"]
    assert list(cell_labels(("b",), values)) == ["b[0]", "b[1]", "b[2]"]
    assert list(cell_labels((), values)) == ["total"]  # the grand total's one cell


# --------------------------------------------------------------------------------------------
# stores written before dimension names and coordinates


COORDINATES = re.compile(r"^(unit|cell|queries/query|blocks/[^/]+/block_query|marginals/cell_\d+)$")


def _as_written_before(src: Path, dst: Path) -> Path:
    """A copy of the store at ``src`` in the layout written before issue 13: no coordinate
    arrays, no ``dimension_names`` (the key absent from every array's zarr.json, as zarr wrote
    it then), and a release's checksum over the arrays it then held (the seal's digest)."""
    shutil.copytree(src, dst)
    for name in list(_dims_on_disk(dst)):
        if COORDINATES.match(name):
            shutil.rmtree(dst / name)
    relist_digests(dst)  # the chunk digests of the arrays it still holds
    for meta in dst.rglob("zarr.json"):
        doc = json.loads(meta.read_text())
        if doc.pop("dimension_names", None) is not None:
            meta.write_text(json.dumps(doc, indent=2))
    return dst


def test_stores_without_dimension_names_are_still_read(stores, tmp_path):
    # dimension names are metadata: stripped, the plan and the release still verify (same digest)
    plan = _as_written_before(stores["plan"], tmp_path / "plan.zarr")
    assert set(_dims_on_disk(plan).values()) == {None}
    ok, stored, recomputed = verify_checksum(plan)
    assert ok and stored == read_plan(stores["plan"]).checksum
    assert audit_plan(str(plan)).ok
    with pytest.raises(KeyError, match="dimension_names"):  # what the issue saw
        _tree(plan)

    bare = tmp_path / "dims-only.zarr"
    shutil.copytree(stores["release"], bare)
    for meta in bare.rglob("zarr.json"):
        doc = json.loads(meta.read_text())
        doc.pop("dimension_names", None)
        meta.write_text(json.dumps(doc))
    assert verify_release(bare) == verify_release(stores["release"])

    for key in ("release", "release_str"):
        old = _as_written_before(stores[key], tmp_path / f"old-{key}.zarr")
        assert not (old / "unit").exists() and not (old / "queries/query").exists()
        reseal(old)
        assert verify_release(old)[0]
        new, before = read_release(stores[key]), read_release(old)
        np.testing.assert_array_equal(before.answers[...], new.answers[...])
        np.testing.assert_array_equal(before.unit_ids[...], new.unit_ids[...])
        assert before.labels == new.labels
    old_data = {}
    for key, reader in (("data", read_histograms), ("marginals", read_marginals)):
        old_data[key] = old = _as_written_before(stores[key], tmp_path / f"old-{key}.zarr")
        reseal(old)  # the layout before coordinates, sealed as this distfit seals data
        assert not (old / "unit").exists() and set(_dims_on_disk(old).values()) == {None}
        np.testing.assert_array_equal(np.asarray(reader(old).unit_ids[...]), np.asarray(reader(stores[key]).unit_ids[...]))

    # an old plan and old data make a new release, which opens in xarray
    out = tmp_path / "new-from-old.zarr"
    run_release(plan, old_data["data"], out, seed=SEED, placement=Placement(serial=True), fsync=False)
    np.testing.assert_array_equal(read_release(out).answers[...], read_release(stores["release"]).answers[...])
    np.testing.assert_array_equal(_tree(out)["queries"]["answers"].sel(unit=3).values, read_release(out).answers[3])


class _Stop(Exception):
    pass


def test_an_old_incomplete_release_resumes_in_its_own_layout(stores, tmp_path):
    started = tmp_path / "started.zarr"
    seen = []

    def stop_after_one(chunk):
        seen.append(chunk)
        raise _Stop

    with pytest.raises(_Stop):
        run_release(stores["plan"], stores["data"], started, seed=SEED, placement=Placement(serial=True), fsync=False,
                    after_chunk=stop_after_one)
    old = _as_written_before(started, tmp_path / "old.zarr")
    result = run_release(stores["plan"], stores["data"], old, seed=SEED, placement=Placement(serial=True), fsync=False,
                         resume=True)
    assert result.chunks == -(-UNITS // CHUNK)
    assert verify_release(old)[0] and not (old / "unit").exists()
    np.testing.assert_array_equal(read_release(old).answers[...], read_release(stores["release"]).answers[...])


# --------------------------------------------------------------------------------------------
# the README example


def _readme_example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text[text.index("\n## Opening stores with xarray\n"):]
    section = section[:section.index("\n## ", 1)]
    return section[section.index("```python\n") + len("```python\n"):section.index("\n```\n")]


def test_readme_example_runs(tmp_path, capsys):
    """The README's example, run as written on a small pl94 run (its query label is pl94's)."""
    run = tmp_path / "run"
    spec = load_spec(ROOT / "pipelines" / "pl94.yaml")
    run_plan(spec, str(run / "plan.zarr"), placement=Placement(serial=True), log=io.StringIO())
    write_synthetic(spec, 60, run / "data.zarr", seed=3, chunk_units=25, fsync=False)
    run_release(run / "plan.zarr", run / "data.zarr", run / "release.zarr", seed=SEED, placement=Placement(serial=True),
                fsync=False)
    code = _readme_example()
    assert 'run = "runs/default"' in code
    exec(compile(code.replace('run = "runs/default"', f"run = {str(run)!r}"), "README.md", "exec"), {})
    out = capsys.readouterr().out
    assert "{'unit': 60, 'query': 319}" in out and "voting_age:voting_age[18_plus]" in out
    assert "r-voting_age.hispanic.race" in out and "race[white]" in out
