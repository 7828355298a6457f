"""The data stores (distfit.stores.data) and ``distfit synth``: the histograms store's format,
determinism, atomic writes, refusals and CLI errors. (The synthetic model itself:
tests/data/test_synthetic.py; the marginals store: tests/data/test_microdata.py.)"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

import distfit.stores.checksum as checksum_module
import distfit.stores.data as data
import distfit.stores.sealing as sealing
from distfit.stores.checksum import DIGESTS, chunk_digest
from distfit.data.synthetic import synthesize_chunk, synthesize_histograms
from distfit.stores.data import DataError, read_histograms, write_synthetic
from distfit.spec.parse import load_spec
from distfit.mathematics.domain import Domain
from tests.clitools import assert_one_line_error, run

ROOT = Path(__file__).resolve().parents[2]
PL94 = ROOT / "pipelines" / "pl94.yaml"

SMALL_SPEC = """\
name: small
attributes:
  - name: age
    values: [child, adult, senior]
    ordinal: true
  - {name: sex, values: [f, m]}
  - {name: race, size: 5}
  - {name: tenure, size: 4}
units: {column: block_id}
queries:
  - name: detailed
    attributes: {age: identity, sex: identity, race: identity, tenure: identity}
    target: 1
"""


@pytest.fixture
def small_spec(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(SMALL_SPEC)
    return path


# ---------------------------------------------------------------------------------------------
# format


def test_store_layout_shape_dtype_chunks(tmp_path, small_spec):
    spec = load_spec(small_spec)
    out = write_synthetic(spec, 250, tmp_path / "data.zarr", seed=7, chunk_units=64)
    assert out == tmp_path / "data.zarr"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.zarr", "small.yaml"]  # no leftovers
    h = read_histograms(out)
    a = h.attrs
    assert a["distfit_format"] == "histograms" and a["format_version"] == 3 and a["complete"] is True
    assert a["schema"] == {"attributes": ["age", "sex", "race", "tenure"], "sizes": [3, 2, 5, 4]}
    assert a["spec_hash"] == spec.spec_hash
    assert (a["units"], a["cells"], a["seed"], a["chunk_units"]) == (250, 120, 7, 64)
    assert h.counts.shape == (250, 120) and h.counts.dtype == np.int64
    assert h.counts.chunks == (64, 120)  # chunked over units, whole rows
    assert h.unit_ids.shape == (250,) and h.unit_ids.dtype == np.int64
    np.testing.assert_array_equal(h.unit_ids[...], np.arange(250))
    counts = h.counts[...]
    assert counts.min() >= 0
    assert a["total_people"] == int(counts.sum())
    assert h.domain == spec.domain
    # iter_chunks reads back the stored chunks
    starts = [start for start, _ in h.iter_chunks()]
    assert starts == [0, 64, 128, 192]
    np.testing.assert_array_equal(np.vstack([c for _, c in h.iter_chunks()]), counts)
    # the root attrs are plain JSON in zarr.json
    doc = json.loads((out / "zarr.json").read_text())
    assert doc["attributes"]["model"]["population_median"] == 100.0


def test_marginals_store_written_chunk_by_chunk(tmp_path):
    """create_marginals + MarginalsWriter + write_marginals_attrs make a store read_marginals and
    open_data read back (the tabulation's writing, without microdata)."""
    domain = Domain(("a", "b", "c"), (2, 3, 2))
    rng = np.random.default_rng(0)
    full = rng.integers(0, 5, size=(5, 12))  # 5 units x cells
    ab = full.reshape(5, 2, 3, 2).sum(axis=3).reshape(5, 6)
    c = full.reshape(5, 2, 3, 2).sum(axis=(1, 2))
    ids = np.array(["u1", "u2", "u3", "u4", "u5"])
    out = tmp_path / "marginals.zarr"
    with data.staged_store(out, data.MARGINALS_FORMAT, fsync=False) as (staging, group):
        data.create_marginals(group, (6, 2), units=5, chunk_units=2, integer_ids=False)
        for start in range(0, 5, 2):  # one writer per chunk, as the tabulation's tasks do
            writer = data.MarginalsWriter(staging)
            writer.write_marginal(0, start, ab[start:start + 2])
            writer.write_marginal(1, start, c[start:start + 2])
            writer.write_unit_ids(start, ids[start:start + 2])
        data.write_marginals_attrs(group, domain=domain, spec_hash="h", units=5, chunk_units=2,
                                   cliques=[("a", "b"), ("c",)], source={"path": "x.csv"}, total_people=7)
    stored = data.open_data(out)
    assert isinstance(stored, data.MarginalsData) and stored.cliques == (("a", "b"), ("c",))
    assert stored.attrs["total_people"] == 7 and stored.attrs["complete"] is True
    assert list(stored.unit_ids[...]) == list(ids) and stored.chunk_units == 2
    np.testing.assert_array_equal(stored.block_counts(["b", "a"], 0, 5), ab)
    np.testing.assert_array_equal(stored.block_counts(["a"], 2, 4), full[2:4].reshape(2, 2, 6).sum(axis=2))
    with pytest.raises(DataError, match="no stored marginal holds"):
        stored.check_blocks([("b", "c")])


def _written_marginals(out: Path, counts: list[np.ndarray], ids: np.ndarray, chunk_units: int, together: bool) -> str:
    """A marginals store of ``counts`` (one (units, cells_i) array for each of the cliques ab, the
    empty one, abc and b of a 2 x 3 x 2 domain) written chunk by
    chunk, every chunk's marginals in one call (``together``: write_marginals) or one call each
    (write_marginal); its checksum."""
    units = len(ids)
    with data.staged_store(out, data.MARGINALS_FORMAT, fsync=False) as (staging, group):
        data.create_marginals(group, [c.shape[1] for c in counts], units=units, chunk_units=chunk_units,
                              integer_ids=True, labels=[np.array([f"c{j}" for j in range(c.shape[1])]) for c in counts])
        for start in range(0, units, chunk_units):
            writer = data.MarginalsWriter(staging)
            rows = {i: c[start:start + chunk_units] for i, c in enumerate(counts)}
            if together:
                writer.write_marginals(start, rows.items())
            else:
                for i, r in rows.items():
                    writer.write_marginal(i, start, r)
            writer.write_unit_ids(start, ids[start:start + chunk_units])
        data.write_marginals_attrs(group, domain=Domain(("a", "b", "c"), (2, 3, 2)), spec_hash="h", units=units,
                                   chunk_units=chunk_units, cliques=[("a", "b"), (), ("a", "b", "c"), ("b",)],
                                   source={"path": "x.csv"},
                                   total_people=int(sum(c.sum() for c in counts)) // len(counts))
    return str(zarr.open_group(str(out), mode="r").attrs["checksum"])


def test_marginals_written_together_and_digested_in_batches_are_the_same_store(tmp_path, monkeypatch):
    """A chunk's marginals written in one zarr call (write_marginals, as the tabulation's merge
    does) make the store write_marginal one at a time makes: the same arrays and checksum. The
    seal's digests, read back a few arrays at a time (write_digests; here READ_BYTES so small
    that each array is its own batch, and the default: all in one), are each chunk's BLAKE3 of
    the rows read back one array at a time (chunk_digest, the contract). And a root check opens
    only the arrays it hashes: none of the digested ones."""
    rng = np.random.default_rng(4)
    counts = [rng.integers(0, 9, size=(5, cells)) for cells in (6, 1, 12, 3)]
    ids = np.arange(10, 15)
    one_each = _written_marginals(tmp_path / "each.zarr", counts, ids, 2, together=False)
    together = _written_marginals(tmp_path / "together.zarr", counts, ids, 2, together=True)
    monkeypatch.setattr(sealing, "READ_BYTES", 1)
    small_batches = _written_marginals(tmp_path / "batches.zarr", counts, ids, 2, together=True)
    assert one_each == together == small_batches
    root = zarr.open_group(str(tmp_path / "together.zarr"), mode="r")
    table = root[DIGESTS][...]
    names = list(root[DIGESTS].attrs["arrays"])
    assert names == sorted([f"marginals/{i}" for i in range(4)] + ["unit", "unit_ids"])
    for i, c in enumerate(counts):
        np.testing.assert_array_equal(root[f"marginals/{i}"][...], c)
    for column, name in enumerate(names):
        for chunk, start in enumerate(range(0, 5, 2)):
            expected = chunk_digest(name, start, root[name][start:start + 2])
            assert table[chunk, column].tobytes() == expected, (name, chunk)
    opened = []
    open_arrays = checksum_module.open_arrays
    monkeypatch.setattr(checksum_module, "open_arrays", lambda group, paths: opened.extend(paths) or open_arrays(group, paths))
    stored = data.open_data(tmp_path / "together.zarr", verify=True)
    assert opened and not set(opened) & set(names) and DIGESTS in opened
    assert stored.units == 5 and list(stored.ids(0, 5)) == list(ids)  # the root held; a chunk read, checked


def test_a_missing_marginal_is_named(tmp_path):
    """The marginals are opened in one zarr call; one missing, or a group in its place, is still
    refused in one line naming it."""
    rng = np.random.default_rng(5)
    counts = [rng.integers(0, 9, size=(3, cells)) for cells in (6, 1, 12, 3)]
    out = tmp_path / "m.zarr"
    _written_marginals(out, counts, np.arange(3), 2, together=True)
    np.testing.assert_array_equal(data.read_marginals(out).marginals[2][...], counts[2])
    shutil.rmtree(out / "marginals" / "2")
    with pytest.raises(DataError, match=r"m.zarr: missing array marginals/2$"):
        data.read_marginals(out)
    zarr.open_group(str(out), mode="r+").create_group("marginals/2")
    with pytest.raises(DataError, match=r"m.zarr: missing array marginals/2$"):
        data.read_marginals(out)


def test_marginals_store_with_parent_ids(tmp_path):
    """Geography: ``parent_ids`` (dimension unit) and the ``parent_column`` attr read back; a
    store holding one without the other is refused; histograms have none."""
    domain = Domain(("a",), (2,))
    out = tmp_path / "marginals.zarr"
    with data.staged_store(out, data.MARGINALS_FORMAT, fsync=False) as (staging, group):
        data.create_marginals(group, (2,), units=3, chunk_units=2, integer_ids=False, integer_parents=True)
        for start in (0, 2):
            writer = data.MarginalsWriter(staging)
            writer.write_marginal(0, start, np.ones((min(2, 3 - start), 2), dtype=np.int64))
            writer.write_unit_ids(start, np.array(["c1", "c2", "c3"])[start:start + 2])
            writer.write_parent_ids(start, np.array([7, 7, 9])[start:start + 2])
        data.write_marginals_attrs(group, domain=domain, spec_hash="h", units=3, chunk_units=2, cliques=[("a",)],
                                   source={"path": "x.csv"}, total_people=6, parent_column="state")
    stored = data.open_data(out)
    assert stored.parent_column == "state" and stored.parent_ids[...].tolist() == [7, 7, 9]
    assert stored.parent_ids.metadata.dimension_names == ("unit",)
    root = zarr.open_group(str(out), mode="r+")
    del root.attrs["parent_column"]
    with pytest.raises(DataError, match="parent_ids without a parent_column attr"):
        data.open_data(out)
    histograms = write_synthetic(domain, 3, tmp_path / "h.zarr", seed=1, fsync=False)
    assert data.open_data(histograms).parent_ids is None and data.open_data(histograms).parent_column is None


def test_default_chunking_bounded(small_spec, tmp_path):
    h = read_histograms(write_synthetic(load_spec(small_spec), 30, tmp_path / "d.zarr", seed=1))
    assert h.counts.chunks == (30, 120)


# ---------------------------------------------------------------------------------------------
# determinism


def test_same_seed_same_data_and_chunks_regenerate_alone(tmp_path, small_spec):
    spec = load_spec(small_spec)
    a = read_histograms(write_synthetic(spec, 200, tmp_path / "a.zarr", seed=11, chunk_units=48))
    b = read_histograms(write_synthetic(spec, 200, tmp_path / "b.zarr", seed=11, chunk_units=48))
    c = read_histograms(write_synthetic(spec, 200, tmp_path / "c.zarr", seed=12, chunk_units=48))
    np.testing.assert_array_equal(a.counts[...], b.counts[...])
    assert not np.array_equal(a.counts[...], c.counts[...])
    stored = a.counts[...]
    for chunk in (4, 2):  # out of order, the last (short) chunk included
        start, counts = synthesize_chunk(spec.domain, 200, 11, chunk, chunk_units=48)
        assert start == 48 * chunk
        np.testing.assert_array_equal(counts, stored[start:start + 48])
    # the generator yields the same chunks
    for start, counts in synthesize_histograms(spec.domain, 200, 11, chunk_units=48):
        np.testing.assert_array_equal(counts, stored[start:start + counts.shape[0]])


# ---------------------------------------------------------------------------------------------
# atomic writes, refusals


def test_exception_mid_write_leaves_nothing(tmp_path, small_spec, monkeypatch):
    def failing(*args, **kwargs):  # the third chunk fails
        for chunk, (start, counts) in enumerate(synthesize_histograms(*args, **kwargs)):
            if chunk == 2:
                raise RuntimeError("boom")
            yield start, counts

    monkeypatch.setattr(data, "synthesize_histograms", failing)
    with pytest.raises(RuntimeError, match="boom"):
        write_synthetic(load_spec(small_spec), 200, tmp_path / "data.zarr", seed=1, chunk_units=50)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["small.yaml"]


def test_existing_path_refused_and_overwrite(tmp_path, small_spec):
    spec = load_spec(small_spec)
    out = tmp_path / "data.zarr"
    write_synthetic(spec, 20, out, seed=1)
    with pytest.raises(FileExistsError, match="overwrite"):
        write_synthetic(spec, 20, out, seed=2)
    assert read_histograms(out).attrs["seed"] == 1
    write_synthetic(spec, 30, out, seed=2, overwrite=True)
    assert read_histograms(out).attrs["seed"] == 2 and read_histograms(out).units == 30
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.zarr", "small.yaml"]
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(FileExistsError, match="not a distfit histograms store"):
        write_synthetic(spec, 20, other, seed=1, overwrite=True)


def test_reader_refusals(tmp_path, small_spec):
    out = write_synthetic(load_spec(small_spec), 20, tmp_path / "data.zarr", seed=1)
    with pytest.raises(DataError, match="no such"):
        read_histograms(tmp_path / "missing.zarr")
    # an incomplete store is refused with a ValueError naming the path
    group = zarr.open_group(store=str(out), mode="r+", zarr_format=3)
    group.attrs["complete"] = False
    with pytest.raises(ValueError, match="not marked complete") as info:
        read_histograms(out)
    assert str(out) in str(info.value)
    staging = tmp_path / "x.zarr.incomplete-abc"
    staging.mkdir()
    with pytest.raises(DataError, match="staging"):
        read_histograms(staging)
    group.attrs.update({"complete": True, "distfit_format": "plan"})
    with pytest.raises(DataError, match="distfit_format"):
        read_histograms(out)


def test_bad_arguments(small_spec, tmp_path):
    domain = load_spec(small_spec).domain
    for kwargs in ({"units": 0}, {"units": 10, "seed": -1}, {"units": 10, "chunk_units": 0}):
        with pytest.raises(ValueError):
            write_synthetic(domain, out=tmp_path / "bad.zarr", **{"seed": 1, **kwargs})
    with pytest.raises(ValueError, match="cells"):
        write_synthetic(Domain(("a", "b"), (4096, 4096)), 10, tmp_path / "bad.zarr", seed=1)
    assert not list(tmp_path.glob("bad.zarr*"))
    # seed None: fresh entropy, stored
    h = read_histograms(write_synthetic(domain, 5, tmp_path / "d.zarr"))
    assert isinstance(h.attrs["seed"], int) and h.attrs["spec_hash"] is None


# ---------------------------------------------------------------------------------------------
# command line


def test_cli_synth(tmp_path, capsys, small_spec):
    out = tmp_path / "data.zarr"
    code, stdout, err = run(capsys, "synth", str(small_spec), "--units", "150", "--out", str(out),
                            "--seed", "4", "--chunk-units", "40")
    assert code == 0, err
    h = read_histograms(out)
    assert h.counts.shape == (150, 120) and h.counts.chunks == (40, 120) and h.attrs["seed"] == 4
    assert str(out) in stdout and "150" in stdout and "120" in stdout
    assert str(h.attrs["total_people"]) in stdout and "seconds" in stdout
    # same seed through the CLI and the library: same data
    start, counts = synthesize_chunk(h.domain, 150, 4, 1, chunk_units=40)
    np.testing.assert_array_equal(h.counts[start:start + 40], counts)

    code, _, err = run(capsys, "synth", str(small_spec), "--units", "10", "--out", str(out))
    assert code == 2
    assert_one_line_error(err, str(out), "--overwrite")
    code, _, err = run(capsys, "synth", str(small_spec), "--units", "10", "--out", str(out), "--overwrite",
                       "--seed", "5")
    assert code == 0, err
    assert read_histograms(out).units == 10


def test_cli_synth_pl94(tmp_path, capsys):
    out = tmp_path / "pl94.zarr"
    code, stdout, err = run(capsys, "synth", str(PL94), "--units", "300", "--out", str(out), "--seed", "1")
    assert code == 0, err
    assert read_histograms(out).counts.shape == (300, 252)


@pytest.mark.parametrize("argv, fragment", [
    (("--units", "0"), "--units"),
    (("--units", "-5"), "--units"),
    (("--units", "10", "--chunk-units", "0"), "--chunk-units"),
    (("--units", "ten"), "expected an integer >= 1"),
    ((), "--units"),
])
def test_cli_synth_bad_input(tmp_path, capsys, small_spec, argv, fragment):
    out = tmp_path / "data.zarr"
    code, _, err = run(capsys, "synth", str(small_spec), "--out", str(out), *argv)
    assert code == 2
    assert_one_line_error(err, fragment)
    assert not out.exists()


def test_cli_synth_bad_spec(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\nattributes: []\n")
    code, _, err = run(capsys, "synth", str(bad), "--units", "5", "--out", str(tmp_path / "d.zarr"))
    assert code == 2
    assert_one_line_error(err)
    code, _, err = run(capsys, "synth", str(tmp_path / "missing.yaml"), "--units", "5",
                       "--out", str(tmp_path / "d.zarr"))
    assert code == 2
    assert_one_line_error(err, "missing.yaml")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.yaml"]
