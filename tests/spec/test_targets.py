"""Tests for distfit.spec.targets: target files, target rules and the one parse-time target
check."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import yaml

from distfit.spec.model import SpecError
from distfit.spec.parse import load_spec, parse_spec
from distfit.spec.limits import TARGET
from distfit.spec.targets import check_targets

from tests.spec.helpers import edit, spec_error, write, write_age_sex


# ------------------------------------------------------------------ target files


def test_target_files_relative_to_spec(tmp_path):
    sub = tmp_path / "specs"
    sub.mkdir()
    (sub / "data").mkdir()
    (sub / "data" / "age.csv").write_text("# targets\n1, 2\n3\n4,\n")
    np.save(sub / "data" / "sex.npy", np.array([[5.0], [6.0]]))
    path = write_age_sex(sub, "files", """\
        - {name: a, attributes: {age: identity}, target: {file: data/age.csv}}
        - {name: s, attributes: {sex: identity}, target: {file: data/sex.npy}}
        """)
    spec = load_spec(path)
    np.testing.assert_array_equal(spec.group("a").targets, [1, 2, 3, 4])
    np.testing.assert_array_equal(spec.group("s").targets, [5, 6])
    assert spec.to_dict()["queries"][0]["target"] == [1.0, 2.0, 3.0, 4.0]
    inline = parse_spec({**yaml.safe_load(path.read_text()), "queries": [
        {"name": "a", "attributes": {"age": "identity"}, "target": [1, 2, 3, 4]},
        {"name": "s", "attributes": {"sex": "identity"}, "target": [5, 6]}]})
    assert inline.spec_hash == spec.spec_hash
    # parse_spec reads relative files from base_dir
    mapping = yaml.safe_load(path.read_text())
    assert parse_spec(mapping, base_dir=sub).group("a").targets[3] == 4


def _rule_u(seed: int, group: str, j: int) -> float:
    digest = hashlib.sha256(f"{seed}:{group}:{j}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def test_target_rule(tmp_path):
    path = write_age_sex(tmp_path, "rule", """\
        - {name: flat, attributes: {age: identity}, target: {base: 2}}
        - {name: wide, attributes: {age: prefix, sex: identity}, target: {base: 1.5, width_power: 0.5}}
        - name: age-sex
          attributes: {age: {ranges: [[0, 3], [1, 2]]}, sex: total}
          target: {base: 3, width_power: 0.25, jitter: 1, seed: 7}
        - {name: all, total: true, target: {base: 4, jitter: 0.5}}
        """)
    spec = load_spec(path)
    np.testing.assert_array_equal(spec.group("flat").targets, [2, 2, 2, 2])
    # prefix x identity: query (age <= v, sex s) reads v + 1 cells
    np.testing.assert_allclose(spec.group("wide").targets, 1.5 * np.sqrt([1, 1, 2, 2, 3, 3, 4, 4]))
    widths = [4 * 2, 2 * 2]  # ranges 0..3 and 1..2, times the sex total
    expected = [3 * w ** 0.25 * (1 + _rule_u(7, "age-sex", j)) for j, w in enumerate(widths)]
    np.testing.assert_allclose(spec.group("age-sex").targets, expected, rtol=1e-15)
    np.testing.assert_allclose(spec.group("all").targets, [4 * (1 + 0.5 * _rule_u(0, "all", 0))])
    # rule targets are inlined in the canonical form: same hash as the list
    data = spec.to_dict()
    assert data["queries"][0]["target"] == 2.0
    assert data["queries"][2]["target"] == list(spec.group("age-sex").targets)
    assert parse_spec(json.loads(json.dumps(data))).spec_hash == spec.spec_hash
    # another seed draws other factors; jitter stays within [1, 1 + J)
    mapping = yaml.safe_load(path.read_text())
    mapping["queries"][2]["target"]["seed"] = 8
    other = parse_spec(mapping).group("age-sex").targets
    assert not np.allclose(other, spec.group("age-sex").targets)
    ratio = other / (3 * np.array(widths) ** 0.25)
    assert np.all((ratio >= 1) & (ratio < 2))


def test_target_file_errors(tmp_path):
    (tmp_path / "short.csv").write_text("1, 2, 3\n")
    (tmp_path / "neg.npy").write_bytes(b"")
    np.save(tmp_path / "neg.npy", np.array([1.0, -1.0, 1.0, 1.0]))
    (tmp_path / "header.csv").write_text("target\n1\n2\n3\n4\n")
    np.save(tmp_path / "matrix.npy", np.ones((2, 2)))
    cases = {
        "short.csv": "queries[0].target.file: expected 4 values (one per query), got 3 in 'short.csv'",
        "neg.npy": "queries[0].target.file: value [1] of 'neg.npy' must be in [1e-06, 1e+12], got -1",
        "header.csv": "queries[0].target.file: 'header.csv' line 1: 'target' is not a number",
        "matrix.npy": "queries[0].target.file: 'matrix.npy' must hold a 1-D array",
    }
    for name, start in cases.items():
        text = edit(queries=[{"name": "a", "attributes": {"age": "identity"}, "target": {"file": name}}])
        message = spec_error(tmp_path, text)
        assert message.startswith(start), message


# ------------------------------------------------------------------ the one target check


def _problem(j: int) -> SpecError:
    return SpecError("t", f"bad query {j}")


def test_check_targets_refuses_the_first_target_outside_its_range():
    good = np.array([1.0, 0.5, TARGET.low, TARGET.high])
    assert check_targets(good, _problem) is good
    below, above = np.nextafter(TARGET.low, 0), np.nextafter(TARGET.high, np.inf)
    for bad, first in (([1, 0, -1], 1), ([np.inf, 1], 0), ([1, np.nan], 1), ([1, 2, -np.inf], 2),
                       ([1, below], 1), ([above, 1], 0), ([1, 1e300], 1), ([1e-308], 0)):
        with pytest.raises(SpecError, match=rf"^t: bad query {first}$"):
            check_targets(np.array(bad, dtype=float), _problem)


@pytest.mark.parametrize("target, message", [
    (float("inf"), "queries[0].target: must be in [1e-06, 1e+12], got inf"),
    (0, "queries[0].target: must be in [1e-06, 1e+12], got 0"),
    ([1, 2, 3, float("nan")], "queries[0].target[3]: must be in [1e-06, 1e+12], got nan"),
    ({"base": 1e11, "width_power": 1000}, "queries[0].target: the rule gives query [1] the target inf; "
                                          "targets must be in [1e-06, 1e+12]"),
])
def test_each_way_of_writing_targets_names_its_bad_target(tmp_path, target, message):
    text = edit(queries=[{"name": "a", "attributes": {"age": "prefix"}, "target": target}])
    assert spec_error(tmp_path, text) == message


# ------------------------------------------------------------------ margins of error and CVs


def test_margin_of_error_and_cv_targets_are_the_variances_they_state(tmp_path):
    """{moe: M} is (M / 1.645)^2 (the ACS's 90% factor) and {cv: C, at: N} is (C N)^2; a plan of
    such a group then states answers whose 90% margin of error is at most M."""
    path = write_age_sex(tmp_path, "margins", """\
        - {name: a, attributes: {age: identity}, target: {moe: 50}}
        - {name: s, attributes: {sex: identity}, target: {cv: 0.05, at: 1000}}
        """)
    spec = load_spec(path)
    np.testing.assert_allclose(spec.group("a").targets, np.full(4, (50 / 1.645) ** 2), rtol=1e-15)
    np.testing.assert_allclose(spec.group("s").targets, [2500.0, 2500.0], rtol=1e-15)
    # as the worked example in docs/spec.md says: within +-50 at 90% is the variance 923.9
    assert round(float(spec.group("a").targets[0]), 1) == 923.9
    # the same spec written with the variances is the same spec
    inline = parse_spec({**yaml.safe_load(path.read_text()), "queries": [
        {"name": "a", "attributes": {"age": "identity"}, "target": float((50 / 1.645) ** 2)},
        {"name": "s", "attributes": {"sex": "identity"}, "target": 2500.0}]})
    assert inline.spec_hash == spec.spec_hash
    # the canonical form (what a plan stores) keeps the user's terms and parses back to the same
    # targets; the variances' spec states none
    canonical = spec.to_dict()
    assert [g["target"] for g in canonical["queries"]] == [{"moe": 50.0}, {"cv": 0.05, "at": 1000.0}]
    again = parse_spec(canonical)
    assert again.group("a").stated == {"moe": 50.0} and again.group("s").stated == {"cv": 0.05, "at": 1000.0}
    np.testing.assert_array_equal(again.targets, spec.targets)
    assert again.spec_hash == spec.spec_hash and again.to_dict() == canonical
    assert inline.group("a").stated is None and inline.to_dict()["queries"][0]["target"] == spec.group("a").targets[0]


@pytest.mark.parametrize("target, field, message", [
    ({"moe": 0}, "queries[0].target.moe", "expected a finite number > 0, got 0"),
    ({"moe": "x"}, "queries[0].target.moe", "expected a finite number > 0"),
    ({"moe": 5, "cv": 0.1}, "queries[0].target", "{moe: M} stands alone, not with cv"),
    ({"cv": 0.1}, "queries[0].target", "{cv: C, at: N} (both, nothing else)"),
    ({"cv": 0.1, "at": 10, "base": 1}, "queries[0].target", "{cv: C, at: N} (both, nothing else)"),
    ({"cv": -0.1, "at": 10}, "queries[0].target.cv", "expected a finite number > 0"),
    ({"moe": 1e-9}, "queries[0].target", "must be in"),
])
def test_margin_targets_refuse_what_they_cannot_mean(tmp_path, target, field, message):
    mapping = {"name": "bad", "attributes": [{"name": "sex", "values": ["m", "f"]}],
               "queries": [{"name": "s", "attributes": {"sex": "identity"}, "target": target}]}
    with pytest.raises(SpecError) as error:
        parse_spec(mapping)
    assert str(error.value).startswith(field) and message in str(error.value), str(error.value)
