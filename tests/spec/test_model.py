"""Tests for distfit.spec.model: the canonical form and spec hash, and reading data values
(``AttributeSpec.encode``: bins, stripped and recoded labels)."""
from __future__ import annotations

import json

import numpy as np

from distfit.spec.parse import load_spec, parse_spec

from tests.spec.helpers import PIPELINES, base_mapping, reading_spec


# ------------------------------------------------------------------ hash and canonical form


def test_spec_hash_stable_across_key_order_and_spelling():
    a = base_mapping()
    b = {key: a[key] for key in reversed(list(a))}
    b["attributes"] = [dict(reversed(list(attr.items()))) for attr in a["attributes"]]
    assert parse_spec(a).spec_hash == parse_spec(b).spec_hash
    c = base_mapping()
    c["description"] = "words do not count"
    c["queries"][0]["target"] = [1, 1.0, 1, 1]  # same content, spelled as a list
    c["blocks"] = {"max_cells": 4096}
    assert parse_spec(c).spec_hash == parse_spec(a).spec_hash
    d = base_mapping()
    d["queries"][0]["target"] = 2
    assert parse_spec(d).spec_hash != parse_spec(a).spec_hash
    e = base_mapping()
    e["queries"][0]["target"] = [1, 1, 1, 1.5]
    assert parse_spec(e).spec_hash != parse_spec(a).spec_hash


def test_to_dict_is_canonical_json_and_round_trips(tmp_path):
    for name in ("pl94.yaml", "age_pyramid.yaml"):
        spec = load_spec(PIPELINES / name)
        data = spec.to_dict()
        assert json.loads(json.dumps(data)) == data
        again = parse_spec(json.loads(json.dumps(data)))
        assert again.spec_hash == spec.spec_hash
        assert again.description == spec.description
    spec = load_spec(PIPELINES / "pl94.yaml")
    single = spec.to_dict()["queries"][2]
    assert single == {"name": "race_single", "attributes": {"race": {"select": [0, 1, 3, 7, 15, 31]}},
                      "target": 1.0}
    assert len(spec.spec_hash) == 64


# --------------------------------------------------------------------------------------------
# reading data: column, bins, recode, encode


def test_bins_make_ordinal_labelled_values_and_encode_half_open():
    age = reading_spec().attribute("age")
    assert age.values == ("17-24", "25-44", "45+") and age.ordinal and age.data_column == "age"
    raw = np.array(["39.5", " 17", "16", "90", "x", None, "24.999", "25"], dtype=object)
    assert age.encode(raw).tolist() == [1, 0, -1, 2, -1, -1, 0, 1]
    assert age.encode(np.array([39.5, 17, 16, np.nan, 1e9])).tolist() == [1, 0, -1, -1, 2]


def test_categorical_values_are_stripped_and_recoded():
    spec = reading_spec()
    assert spec.attribute("sex").encode([" Male", "Female", "Mle", None, float("nan")]).tolist() == [1, 0, -1, -1, -1]
    work = spec.attribute("work")
    assert work.encode(np.array([" ?", " State-gov", "Private", "gov", "Federal-gov"], dtype=object)).tolist() == [2, 1, 0, 1, -1]


def test_numeric_labels_match_integral_numbers_only():
    spec = parse_spec({"name": "t", "attributes": [{"name": "n", "size": 3}],
                       "queries": [{"name": "g", "attributes": {"n": "identity"}, "target": 1}]})
    n = spec.attribute("n")
    assert n.encode(np.array([0, 1, 2, 3])).tolist() == [0, 1, 2, -1]
    assert n.encode(np.array([0.0, 1.0, 2.5])).tolist() == [0, 1, -1]
    assert n.encode(np.array(["0", "2", "02"])).tolist() == [0, 2, -1]


def test_reading_rules_are_canonical_and_hashed():
    spec = reading_spec(column="age_years")
    canonical = spec.to_dict()
    assert canonical["attributes"][0]["bins"] == [17, 25, 45, ".inf"]
    assert canonical["attributes"][0]["column"] == "age_years"
    again = parse_spec(json.loads(json.dumps(canonical)))
    assert again.spec_hash == spec.spec_hash and again.attribute("age").bins == spec.attribute("age").bins
    assert reading_spec().spec_hash != spec.spec_hash
    # a column equal to the name is the default and does not change the hash
    assert reading_spec(column="age").spec_hash == reading_spec().spec_hash
