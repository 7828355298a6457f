"""Synthetic unit histograms (distfit.stores.data) and ``distfit synth``: format, determinism, realism,
atomic writes and CLI errors."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import zarr

import distfit.stores.data as data
from distfit.stores.data import (
    DataError,
    ModelParams,
    cell_model,
    read_histograms,
    synthesize_chunk,
    synthesize_histograms,
    write_synthetic,
)
from distfit.spec.parse import load_spec
from distfit.domain import Domain
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


def chi2(table: np.ndarray) -> tuple[float, int]:
    """Pearson chi-square statistic of independence of a 2-d table, and its degrees of freedom."""
    table = table[table.sum(1) > 0][:, table.sum(0) > 0]
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    return float(((table - expected) ** 2 / expected).sum()), (table.shape[0] - 1) * (table.shape[1] - 1)


def pair_table(aggregate: np.ndarray, domain: Domain, i: int, j: int) -> np.ndarray:
    others = tuple(a for a in range(len(domain)) if a not in (i, j))
    return aggregate.reshape(domain.shape).sum(axis=others)




# ---------------------------------------------------------------------------------------------
# format


def test_store_layout_shape_dtype_chunks(tmp_path, small_spec):
    spec = load_spec(small_spec)
    out = write_synthetic(spec, 250, tmp_path / "data.zarr", seed=7, chunk_units=64)
    assert out == tmp_path / "data.zarr"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data.zarr", "small.yaml"]  # no leftovers
    h = read_histograms(out)
    a = h.attrs
    assert a["distfit_format"] == "histograms" and a["format_version"] == 1 and a["complete"] is True
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


def test_default_chunking_bounded(small_spec, tmp_path):
    assert data.default_chunk_units(252) == data.MAX_CHUNK_UNITS
    assert data.default_chunk_units(252, units=10) == 10
    assert data.default_chunk_units(1 << 21) * 8 * (1 << 21) <= data.CHUNK_BYTES
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


def test_unit_totals_equal_populations_nonnegative_integers(small_spec):
    domain = load_spec(small_spec).domain
    model = cell_model(domain, 5)
    assert model.probabilities.shape == (120,) and model.probabilities.sum() == pytest.approx(1.0)
    for chunk in range(3):
        start, counts, pops = synthesize_chunk(domain, 300, 5, chunk, chunk_units=100,
                                               model=model, return_populations=True)
        assert counts.dtype == np.int64 and counts.shape == (100, 120)
        assert counts.min() >= 0 and pops.min() >= 0
        np.testing.assert_array_equal(counts.sum(axis=1), pops)


# ---------------------------------------------------------------------------------------------
# realism: skew and correlation (pl94, a few hundred units)


@pytest.fixture(scope="module")
def pl94_sample():
    domain = load_spec(PL94).domain
    chunks = list(synthesize_histograms(domain, 400, 2024, chunk_units=128))
    counts = np.vstack([c for _, c in chunks])
    return domain, counts


def test_skewed_populations_and_categories(pl94_sample):
    domain, counts = pl94_sample
    pops = counts.sum(axis=1)
    assert counts.shape == (400, 252)
    assert 60 <= np.median(pops) <= 160  # median about 100 people
    assert pops.max() / np.median(pops) > 8  # a heavy tail
    assert (pops == 0).any()  # some empty units
    share = counts.sum(axis=0) / counts.sum()
    assert share.max() > 8 / domain.size  # the top cell far above uniform
    assert np.sort(share)[-25:].sum() > 0.5  # ten percent of cells hold most people
    # units differ in composition: shares of the top cell vary between large units
    big = pops > 200
    top = np.argmax(share)
    unit_share = counts[big, top] / pops[big]
    assert unit_share.std() > 0.01


def test_interacting_pair_is_dependent(pl94_sample):
    domain, counts = pl94_sample
    model = cell_model(domain, 2024)
    assert model.pairs == ((0, 1), (1, 2))
    aggregate = counts.sum(axis=0)
    for i, j in model.pairs:
        stat, df = chi2(pair_table(aggregate, domain, i, j))
        assert stat > 100 * df, (i, j, stat, df)


def test_non_interacting_pair_is_much_weaker():
    domain = Domain(("a", "b", "c"), (4, 5, 6))
    params = ModelParams(pairs=((0, 1),))
    aggregate = sum(c.sum(axis=0) for _, c in synthesize_histograms(domain, 300, 3, params=params))
    dependent, df_dep = chi2(pair_table(aggregate, domain, 0, 1))
    null, df_null = chi2(pair_table(aggregate, domain, 0, 2))
    # per-unit variation overdisperses the null statistic, but the interaction dominates it
    assert dependent / df_dep > 10 * null / df_null


# ---------------------------------------------------------------------------------------------
# atomic writes, refusals


def test_exception_mid_write_leaves_nothing(tmp_path, small_spec, monkeypatch):
    real = data._sample_chunk

    def failing(model, seed, chunk, n):
        if chunk == 2:
            raise RuntimeError("boom")
        return real(model, seed, chunk, n)

    monkeypatch.setattr(data, "_sample_chunk", failing)
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
            next(synthesize_histograms(domain, **{"seed": 1, **kwargs}))
    with pytest.raises(ValueError, match="cells"):
        next(synthesize_histograms(Domain(("a", "b"), (4096, 4096)), 10, 1))
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
    (("--units", "ten"), "invalid int"),
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
