"""Synthetic data (distfit.data.synthetic): chunking, determinism, realism (skew, correlation),
argument checks and synthetic people."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import distfit.data.synthetic as synthetic
from distfit.data.synthetic import (
    ModelParams,
    cell_model,
    raw_values,
    synthesize_chunk,
    synthesize_histograms,
    synthesize_people,
    synthetic_geography,
    describe_geography,
    geography_counts,
    unit_columns,
)
from distfit.mathematics.domain import Domain
from distfit.spec.parse import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
PL94 = ROOT / "pipelines" / "pl94.yaml"
#: The domain of tests/stores/test_data.py's small spec (age, sex, race, tenure).
SMALL = Domain(("age", "sex", "race", "tenure"), (3, 2, 5, 4))


def chi2(table: np.ndarray) -> tuple[float, int]:
    """Pearson chi-square statistic of independence of a 2-d table, and its degrees of freedom."""
    table = table[table.sum(1) > 0][:, table.sum(0) > 0]
    expected = table.sum(1, keepdims=True) * table.sum(0, keepdims=True) / table.sum()
    return float(((table - expected) ** 2 / expected).sum()), (table.shape[0] - 1) * (table.shape[1] - 1)


def pair_table(aggregate: np.ndarray, domain: Domain, i: int, j: int) -> np.ndarray:
    others = tuple(a for a in range(len(domain)) if a not in (i, j))
    return aggregate.reshape(domain.shape).sum(axis=others)


# ---------------------------------------------------------------------------------------------
# chunking and determinism


def test_default_chunking_bounded():
    assert synthetic.default_chunk_units(252) == synthetic.MAX_CHUNK_UNITS
    assert synthetic.default_chunk_units(252, units=10) == 10
    assert synthetic.default_chunk_units(1 << 21) * 8 * (1 << 21) <= synthetic.MAX_CHUNK_BYTES


def test_chunks_regenerate_alone():
    chunks = dict(synthesize_histograms(SMALL, 200, 11, chunk_units=48))
    assert sorted(chunks) == [0, 48, 96, 144, 192]
    for chunk in (4, 2):  # out of order, the last (short) chunk included
        start, counts = synthesize_chunk(SMALL, 200, 11, chunk, chunk_units=48)
        assert start == 48 * chunk
        np.testing.assert_array_equal(counts, chunks[start])
    other = dict(synthesize_histograms(SMALL, 200, 12, chunk_units=48))
    assert not np.array_equal(other[0], chunks[0])


def test_unit_totals_equal_populations_nonnegative_integers():
    model = cell_model(SMALL, 5)
    assert model.probabilities.shape == (120,) and model.probabilities.sum() == pytest.approx(1.0)
    for chunk in range(3):
        start, counts, pops = synthesize_chunk(SMALL, 300, 5, chunk, chunk_units=100,
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


def test_bad_arguments():
    for kwargs in ({"units": 0}, {"units": 10, "seed": -1}, {"units": 10, "chunk_units": 0}):
        with pytest.raises(ValueError):
            next(synthesize_histograms(SMALL, **{"seed": 1, **kwargs}))
    with pytest.raises(ValueError, match="cells"):
        next(synthesize_histograms(Domain(("a", "b"), (4096, 4096)), 10, 1))


# ---------------------------------------------------------------------------------------------
# synthetic people

PEOPLE_SPEC = {
    "name": "people",
    "attributes": [
        {"name": "sex", "values": ["F", "M"], "recode": {"female": "F", "male": "M"}},
        {"name": "age", "values": ["young", "old"], "ordinal": True, "bins": [float("-inf"), 40, 120]},
        {"name": "edu", "values": ["hs", "ba"], "column": "education"},
    ],
    "units": {"column": "block"},
    "queries": [{"name": "all", "attributes": {"sex": "identity", "age": "identity", "edu": "identity"},
                 "target": 1}],
}


def test_people_expand_the_histograms():
    spec = parse_spec(PEOPLE_SPEC)
    assert unit_columns(spec) == ["block"]
    assert [list(raw_values(a)) for a in spec.attributes] == [["female", "male"], [39.0, 40.0], ["hs", "ba"]]
    for attribute in spec.attributes:  # every raw value maps back to its value
        np.testing.assert_array_equal(attribute.encode(raw_values(attribute)), np.arange(attribute.size))
    (table,) = list(synthesize_people(spec, 30, 8))
    assert sorted(table) == ["age", "block", "education", "sex"]
    ((start, counts),) = list(synthesize_histograms(spec.domain, 30, 8))
    assert len(table["block"]) == counts.sum()
    units = np.searchsorted(synthetic_geography(["block"], 0, 30)["block"], table["block"])
    cells = np.ravel_multi_index(tuple(a.encode(table[a.data_column]) for a in spec.attributes), spec.domain.shape)
    rebuilt = np.zeros_like(counts)
    np.add.at(rebuilt, (units, cells), 1)
    np.testing.assert_array_equal(rebuilt, counts)


def test_geography_is_nested():
    ids = synthetic_geography(["state", "county", "block"], 95, 105, fanout=10)
    assert list(ids) == ["state", "county", "block"]
    assert ids["block"][0] == "block-000095" and ids["county"][0] == "county-000009"
    assert ids["state"][0] == "state-000000" and ids["county"][-1] == "county-000010"


@pytest.mark.parametrize("units", [1, 10, 1899, 2000, 20001])
def test_the_stated_geography_is_the_one_made(units):
    """What the run prints about its synthetic geography (describe_geography) counts the units
    synthetic_geography really gives each level."""
    columns = ["state", "county", "block"]
    made = synthetic_geography(columns, 0, units)
    counts = geography_counts(columns, units)
    assert counts == {column: len(np.unique(made[column])) for column in columns}
    assert list(counts) == columns
    said = describe_geography(columns, units)
    assert all(f"{count:,} {column}" in said for column, count in counts.items())

