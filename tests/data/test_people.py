"""Synthetic people as Parquet microdata (distfit.data.people): the rows, atomic writing, refusals."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from distfit.data.people import write_synthetic_people
from distfit.data.synthetic import synthesize_people
from distfit.spec.parse import parse_spec

SPEC = {
    "name": "people",
    "attributes": [
        {"name": "sex", "values": ["F", "M"]},
        {"name": "edu", "values": ["hs", "ba", "phd"], "column": "education"},
    ],
    "units": {"column": "block"},
    "queries": [{"name": "all", "attributes": {"sex": "identity", "edu": "identity"}, "target": 1}],
}


def test_people_files_hold_the_synthetic_people(tmp_path):
    spec = parse_spec(SPEC)
    out = write_synthetic_people(spec, 40, tmp_path / "people", seed=3, fsync=False)
    assert out == tmp_path / "people" and sorted(p.name for p in tmp_path.iterdir()) == ["people"]
    assert [p.name for p in out.iterdir()] == ["part-00000.parquet"]
    frame = pd.read_parquet(out)
    (table,) = list(synthesize_people(spec, 40, 3))
    assert list(frame.columns) == ["block", "sex", "education"]
    for column, values in table.items():
        np.testing.assert_array_equal(frame[column].to_numpy().astype(str), values)


def test_existing_people_refused_unless_overwrite(tmp_path):
    spec = parse_spec(SPEC)
    out = write_synthetic_people(spec, 5, tmp_path / "people", seed=1, fsync=False)
    with pytest.raises(FileExistsError, match="--overwrite"):
        write_synthetic_people(spec, 5, out, seed=2, fsync=False)
    write_synthetic_people(spec, 7, out, seed=2, overwrite=True, fsync=False)
    assert pd.read_parquet(out)["block"].nunique() <= 7
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(FileExistsError, match="not a directory of Parquet files"):
        write_synthetic_people(spec, 5, other, seed=1, overwrite=True, fsync=False)
    with pytest.raises(ValueError, match="units"):
        write_synthetic_people(spec, 0, tmp_path / "none", seed=1, fsync=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "people"]
