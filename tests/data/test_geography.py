"""The geography as data (distfit.data.geography): the file, its checks, and a tabulation that
keeps every listed unit, the empty ones included."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from distfit.data.geography import read_geography, synthetic_geography_table, write_geography
from distfit.data.microdata import tabulate_microdata, tabulation_mismatch
from distfit.spec.parse import parse_spec
from distfit.stores.data import DataError, open_data

SPEC = parse_spec({
    "name": "geo",
    "attributes": [{"name": "sex", "values": ["f", "m"]}],
    "levels": [
        {"name": "nation", "queries": [{"name": "sex", "attributes": {"sex": "identity"}, "target": 1}]},
        {"name": "state", "units": {"column": "state"},
         "queries": [{"name": "sex", "attributes": {"sex": "identity"}, "target": 1}]},
        {"name": "county", "units": {"column": "county"},
         "queries": [{"name": "sex", "attributes": {"sex": "identity"}, "target": 1}]},
    ],
})
GEOGRAPHY = "level,unit,parent\nstate,s2,\nstate,s1,\ncounty,c3,s2\ncounty,c1,s1\ncounty,c2,s1\ncounty,c9,s2\n"


def _file(tmp_path, text: str = GEOGRAPHY):
    path = tmp_path / "geography.csv"
    path.write_text(text)
    return path


def test_read_sorts_each_level_and_write_reads_back_the_same(tmp_path):
    geography = read_geography(_file(tmp_path), SPEC)
    county = geography.of("county")
    assert list(county.ids) == ["c1", "c2", "c3", "c9"] and list(county.parents) == ["s1", "s1", "s2", "s2"]
    assert list(geography.of("state").ids) == ["s1", "s2"] and geography.of("state").parents is None
    assert geography.of("nation") is None  # no unit column: the one population
    again = read_geography(write_geography(geography, tmp_path / "copy.csv").path, SPEC)
    assert again.digest == geography.digest
    reordered = _file(tmp_path, "level,unit,parent\n" + "\n".join(reversed(GEOGRAPHY.strip().split("\n")[1:])) + "\n")
    assert read_geography(reordered, SPEC).digest == geography.digest  # the order of the rows is not a fact
    moved = _file(tmp_path, GEOGRAPHY.replace("county,c9,s2", "county,c9,s1"))
    assert read_geography(moved, SPEC).digest != geography.digest


def test_synthetic_geography_lists_every_unit_with_its_parent():
    geography = synthetic_geography_table(SPEC, 23)
    county, state = geography.of("county"), geography.of("state")
    assert county.ids.size == 23 and state.ids.size == 3  # ceil(23 / 10) states of 10 counties
    assert set(county.parents) == set(state.ids)
    assert np.array_equal(np.unique(county.parents, return_counts=True)[1], [10, 10, 3])


@pytest.mark.parametrize("text, problem", [
    ("", "empty file"),
    ("level,unit\nstate,s1\n", "line 1: header 'level,unit'"),
    ("level,unit,parent\nstate,s1\n", "line 2: 2 fields, expected 3"),
    ("level,unit,parent\nstate,,\n", "line 2: empty unit id"),
    ("level,unit,parent\nstate,s1,\nstate,s1,\ncounty,c1,s1\n", "line 3: unit 's1' of level 'state' is listed twice"),
    ("level,unit,parent\nstate,s1,\n", "level 'county' (unit column 'county') has no units listed"),
    ("level,unit,parent\nstate,s1,\ncounty,c1,s7\n", "line 3: unit 'c1' of level 'county' has parent 's7', not a unit"),
    ("level,unit,parent\nstate,s1,\ncounty,c1,\n", "line 3: unit 'c1' of level 'county' has no parent"),
    ("level,unit,parent\nstate,s1,x\ncounty,c1,s1\n", "line 2: level 'state' is the coarsest"),
    ("level,unit,parent\nstate,s1,\ncounty,c1,s1\ntract,t1,c1\n", "line 4: level 'tract' is not a level"),
    ("level,unit,parent\nstate,s1,\ncounty," + "c" * 300 + ",s1\n", "line 3: an id of more than 256"),
])
def test_bad_geography_files_are_refused_in_one_line(tmp_path, text, problem):
    with pytest.raises(DataError) as error:
        read_geography(_file(tmp_path, text), SPEC)
    message = str(error.value)
    assert "\n" not in message and problem in message and str(tmp_path / "geography.csv") in message
    with pytest.raises(DataError, match="cannot read the geography file"):
        read_geography(tmp_path / "absent.csv", SPEC)
    (tmp_path / "binary.csv").write_bytes(b"level,unit,parent\n\xff\xfe,1,\n")
    with pytest.raises(DataError, match="not a CSV geography file"):
        read_geography(tmp_path / "binary.csv", SPEC)


def _people(tmp_path, rows):
    source = tmp_path / "people.csv"
    pd.DataFrame(rows, columns=["state", "county", "sex"]).to_csv(source, index=False)
    return source


def test_tabulation_keeps_every_listed_unit_empty_ones_included(tmp_path):
    geography = read_geography(_file(tmp_path), SPEC)
    source = _people(tmp_path, [("s1", "c1", "f"), ("s1", "c1", "m"), ("s2", "c3", "m"), ("s1", "c1", "m")])
    county = SPEC.level_spec("county")
    out = tabulate_microdata(county, source, tmp_path / "county.zarr", fsync=False, parent_column="state",
                             geography=geography.of("county"))
    data = open_data(out)
    assert list(data.unit_ids[...]) == ["c1", "c2", "c3", "c9"]  # c2 and c9 have nobody: kept, empty
    assert list(data.parent_ids[...]) == ["s1", "s1", "s2", "s2"]
    counts = np.asarray(data.marginals[0][...])
    assert counts.tolist() == [[1, 2], [0, 0], [0, 1], [0, 0]]
    assert tabulation_mismatch(out, county, source, parent_column="state", geography=geography.of("county")) is None
    moved = read_geography(_file(tmp_path, GEOGRAPHY.replace("county,c9,s2", "county,c9,s1")), SPEC)
    assert "the units of geography" in tabulation_mismatch(out, county, source, parent_column="state",
                                                           geography=moved.of("county"))
    assert "the units of geography" in tabulation_mismatch(out, county, source, parent_column="state")


def test_tabulation_refuses_units_the_geography_does_not_hold(tmp_path):
    geography = read_geography(_file(tmp_path), SPEC)
    county = SPEC.level_spec("county")
    unlisted = _people(tmp_path, [("s1", "c1", "f"), ("s2", "c4", "m")])
    with pytest.raises(DataError) as error:
        tabulate_microdata(county, unlisted, tmp_path / "a.zarr", fsync=False, parent_column="state",
                           geography=geography.of("county"))
    assert "unit 'c4' of column 'county' has people but is not a unit of level 'county'" in str(error.value)
    assert not (tmp_path / "a.zarr").exists()
    elsewhere = _people(tmp_path, [("s1", "c1", "f"), ("s1", "c3", "m")])
    with pytest.raises(DataError) as error:
        tabulate_microdata(county, elsewhere, tmp_path / "b.zarr", fsync=False, parent_column="state",
                           geography=geography.of("county"))
    assert "unit 'c3' of 'county' has people in 's1', but" in str(error.value) and "puts it in 's2'" in str(error.value)
    assert not (tmp_path / "b.zarr").exists()


def test_blank_lines_are_skipped_and_lines_still_counted_and_quoted_ids_read_back(tmp_path):
    with pytest.raises(DataError, match=r"line 4: unit 's1' of level 'state' is listed twice \(first on line 2\)"):
        read_geography(_file(tmp_path, "level,unit,parent\nstate,s1,\n\nstate,s1,\ncounty,c1,s1\n"), SPEC)
    quoted = read_geography(_file(tmp_path, 'level,unit,parent\nstate," s,1 ",\ncounty,"c""1","s,1"\n'), SPEC)
    assert list(quoted.of("county").ids) == ['c"1'] and list(quoted.of("county").parents) == ["s,1"]
    again = read_geography(write_geography(quoted, tmp_path / "copy.csv").path, SPEC)
    assert again.digest == quoted.digest
