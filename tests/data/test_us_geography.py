"""The US-shaped synthetic geography (distfit.data.us_geography) and the level data synthesised on
it (distfit.data.level_synth): sizes and fanouts as documented, ids that nest, children whose
histograms sum exactly to their parent's, ~30% empty blocks, determinism, bad input; and a
multi-level run that releases and estimates that data as it is (distfit.pipeline.run.run_levels)."""
from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
import yaml

from distfit.data.geography import read_geography
from distfit.data.level_synth import synthesised_levels, write_level_data
from distfit.data.us_geography import (FULL_COUNTS, ID_FIELD, STATE_COUNTIES, US_LEVELS, spread, us_geography,
                                       us_level_counts)
from distfit.pipeline.run import run_levels
from distfit.runtime.placement import Placement
from distfit.spec.parse import parse_spec
from distfit.stores.data import DataError, open_data
from tests.clitools import assert_one_line_error, run

QUERY = [{"name": "sex_age", "attributes": {"sex": "identity", "age": "identity"}, "target": 1}]
SPEC = parse_spec({
    "name": "us_small",
    "attributes": [{"name": "sex", "values": ["f", "m"]}, {"name": "age", "values": ["child", "adult", "old"]}],
    "levels": [{"name": "nation", "queries": QUERY}]
              + [{"name": level, "units": {"column": level}, "queries": QUERY} for level in US_LEVELS],
})


def test_full_size_has_the_2020_counts_and_each_states_counties():
    counts = us_level_counts(5, FULL_COUNTS["block"])
    assert counts == FULL_COUNTS
    geography = us_geography(2, FULL_COUNTS["county"], seed=3)  # states and counties only: cheap
    per_state = np.bincount(geography.parents["county"])
    assert per_state.tolist() == [count for _, count in STATE_COUNTIES]
    assert per_state.max() == 254 and per_state.min() == 1  # Texas, DC


def test_smaller_sizes_shrink_every_level_below_the_states_in_proportion():
    for units in (1_000_000, 100_000):
        counts = us_level_counts(5, units)
        assert counts["state"] == 51 and counts["block"] == units
        for level in ("tract", "block_group"):
            assert counts[level] == round(FULL_COUNTS[level] * units / FULL_COUNTS["block"])
    assert us_level_counts(5, 1_000_000)["county"] == round(3143 * 1_000_000 / FULL_COUNTS["block"])
    assert us_level_counts(5, 100_000)["county"] == 51  # floored: one per state
    assert us_level_counts(5, 51) == dict.fromkeys(US_LEVELS, 51)


@pytest.mark.parametrize("levels, units, problem", [
    (5, 50, "at least 51 finest units"), (6, 1000, "at most 5 levels"), (5, 0, "units")])
def test_bad_sizes_are_refused(levels, units, problem):
    with pytest.raises(ValueError, match=problem):
        us_level_counts(levels, units)


def test_spread_gives_each_parent_at_least_one_and_its_share():
    weights = np.array([1.0, 1.0, 8.0, 0.001, 90.0])
    counts = spread(1000, weights)
    assert counts.sum() == 1000 and counts.min() >= 1
    assert np.all(np.abs(counts - 1000 * weights / weights.sum()) <= 1.5)
    tight = spread(6, weights)  # the floor of one takes more than the quotas give
    assert tight.sum() == 6 and tight.min() == 1


def test_the_geography_nests_with_heavy_tailed_fanouts_and_is_determined_by_its_seed():
    geography = us_geography(5, 40_000, seed=11)
    assert geography.counts() == us_level_counts(5, 40_000)
    for above, level in zip(US_LEVELS, US_LEVELS[1:]):
        ids, parents = geography.ids[level], geography.parents[level]
        assert np.all(np.diff(ids) > 0) and np.all(np.diff(parents) >= 0)  # tree order
        assert np.array_equal(ids // ID_FIELD[level], geography.ids[above][parents])
        fanout = np.bincount(parents, minlength=geography.ids[above].size)
        assert fanout.min() >= 1
    blocks = np.bincount(geography.parents["block"])
    assert 30 < blocks.mean() < 37 and blocks.max() > 6 * blocks.mean()  # 2020's ~34, a heavy tail
    tracts = np.bincount(geography.parents["tract"])
    assert tracts.max() > 4 * np.median(tracts)
    again, other = us_geography(5, 40_000, seed=11), us_geography(5, 40_000, seed=12)
    assert all(np.array_equal(again.ids[level], geography.ids[level]) for level in US_LEVELS)
    assert not np.array_equal(other.ids["block"], geography.ids["block"])
    text = geography.text_ids("county")
    assert np.all(text[1:] > text[:-1]) and {len(t) for t in text} == {5}  # text order is tree order


@pytest.fixture(scope="module")
def synthesised(tmp_path_factory):
    out = tmp_path_factory.mktemp("us") / "run"
    return write_level_data(SPEC, 2500, out, seed=5, fsync=False)


def test_each_level_is_the_exact_sum_of_its_children_with_every_unit_listed(synthesised):
    stores = {name: open_data(path, verify=True) for name, path in synthesised.stores.items()}
    geography = read_geography(synthesised.geography, SPEC)
    counts = {name: np.asarray(store.marginals[0][...]) for name, store in stores.items()}
    for above, level in zip(("nation",) + US_LEVELS, US_LEVELS):
        store = stores[level]
        assert np.array_equal(np.asarray(store.unit_ids[...]), geography.of(level).ids.astype(np.int64))
        rows = (np.zeros(store.units, dtype=np.int64) if store.parent_ids is None else
                np.searchsorted(np.asarray(stores[above].unit_ids[...]), np.asarray(store.parent_ids[...])))
        sums = np.zeros_like(counts[above])
        np.add.at(sums, rows, counts[level])
        assert np.array_equal(sums, counts[above])
    blocks = counts["block"].sum(axis=1)
    assert blocks.sum() == synthesised.total_people == counts["nation"].sum()
    assert 0.26 < np.mean(blocks == 0) < 0.34 and synthesised.empty_share == np.mean(blocks == 0)  # ~30% empty
    assert np.percentile(blocks[blocks > 0], 99) > 5 * np.median(blocks[blocks > 0])  # heavy-tailed populations


def test_the_same_seed_gives_the_same_data_and_an_existing_store_is_refused(synthesised, tmp_path):
    again = write_level_data(SPEC, 2500, tmp_path / "again", seed=5, fsync=False)
    assert read_geography(again.geography, SPEC).digest == read_geography(synthesised.geography, SPEC).digest
    first, second = open_data(synthesised.stores["block"]), open_data(again.stores["block"])
    assert np.array_equal(first.marginals[0][...], second.marginals[0][...])
    with pytest.raises(FileExistsError, match="already exists"):
        write_level_data(SPEC, 2500, tmp_path / "again", seed=5, fsync=False)
    with pytest.raises(DataError, match="--units is 99"):
        synthesised_levels(SPEC, synthesised.rundir, 99)
    assert synthesised_levels(SPEC, tmp_path / "nothing", None) is None


def test_a_partial_or_foreign_set_of_level_stores_is_refused_in_one_line(synthesised, tmp_path):
    """What ``distfit run`` finds in RUNDIR: every level's store of this spec, or a one-line
    DataError naming what is wrong (a level's store missing; stores of another spec)."""
    copy = tmp_path / "run"
    shutil.copytree(synthesised.rundir, copy)
    other = parse_spec({**SPEC.to_dict(), "levels": [
        {**level.to_dict(), "queries": [{**QUERY[0], "target": 2}]} for level in SPEC.levels]})
    with pytest.raises(DataError) as foreign:
        synthesised_levels(other, copy, None)
    assert "\n" not in str(foreign.value) and "holds data synthesised for another spec" in str(foreign.value)
    shutil.rmtree(copy / Path(synthesised.stores["tract"]).relative_to(synthesised.rundir))  # one level's store
    with pytest.raises(DataError) as partial:
        synthesised_levels(SPEC, copy, None)
    assert "\n" not in str(partial.value) and str(partial.value).endswith(
        "holds data for some levels but not for tract; use another --out")


def test_a_run_releases_and_estimates_every_synthesised_unit(tmp_path):
    spec = parse_spec({**SPEC.to_dict(), "levels": [level.to_dict() for level in SPEC.levels[1:3]]})  # state, county
    made = write_level_data(spec, 60, tmp_path / "run", seed=2, fsync=False)
    run = run_levels(spec, tmp_path / "run", placement=Placement(serial=True), fsync=False, log=io.StringIO(),
                     report=False)
    assert run.people == "" and {name: r.manifest_data["data"]["units"] for name, r in run.levels.items()} == made.units
    assert {name: e.units for name, e in run.estimates.items()} == made.units  # empty counties too
    with pytest.raises(ValueError, match="synthesised for 60 units, but --units is 61"):
        run_levels(spec, tmp_path / "run", units=61, placement=Placement(serial=True), fsync=False, log=io.StringIO())


def test_distfit_synth_of_a_multilevel_spec_writes_a_run_directory(tmp_path, capsys):
    spec_path = tmp_path / "us_small.yaml"
    spec_path.write_text(yaml.safe_dump(SPEC.to_dict(), sort_keys=False))
    code, out, _ = run(capsys, "synth", str(spec_path), "--units", "80", "--out", str(tmp_path / "run"), "--seed", "4")
    assert code == 0 and "block 80" in out and "distfit run" in out
    assert synthesised_levels(SPEC, tmp_path / "run", 80)["units"] == 80
    code, _, err = run(capsys, "synth", str(spec_path), "--units", "80", "--out", str(tmp_path / "run"))
    assert code == 2
    assert_one_line_error(err, "already exists")  # nothing replaced
    code, _, err = run(capsys, "synth", str(spec_path), "--units", "20", "--out", str(tmp_path / "other"))
    assert code == 2 and not (tmp_path / "other" / "levels").exists()
    assert_one_line_error(err, "at least 51 finest units")
