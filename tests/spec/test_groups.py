"""Tests for distfit.spec.groups: the ``marginals`` shorthand is the written-out groups (names,
queries, targets, labels, canonical form, hash), its errors name the field, and parsing,
hashing and planning input do work linear in the size of the spec (counted in executed Python
bytecodes, never timed)."""
from __future__ import annotations

import itertools
import json
import sys

import numpy as np
import pytest
import yaml

from distfit.spec.groups import MAX_MARGINAL_GROUPS
from distfit.spec.model import SpecError
from distfit.spec.parse import load_spec, parse_spec

from tests.spec.helpers import pairs_text, write

ATTRIBUTES = [
    {"name": "age", "size": 5, "ordinal": True},
    {"name": "sex", "values": ["female", "male"]},
    {"name": "race", "values": ["white", "black", "asian"]},
    {"name": "hisp", "size": 2},
    {"name": "edu", "size": 4, "ordinal": True},
]
RULE = {"base": 1.5, "width_power": 0.5, "jitter": 1, "seed": 7}


def spec_mapping(queries, attributes=ATTRIBUTES, **top) -> dict:
    return {"name": "m", "attributes": [dict(a) for a in attributes], "queries": queries, **top}


def written_out(name, order, over, kinds, default, overrides=None) -> list[dict]:
    """The groups of a marginals entry written out by hand: every combination of ``over`` (given
    here in schema order), named NAME.a.b, attributes listed in reverse (order must not matter)."""
    groups = []
    for clique in itertools.combinations(over, order):
        target = (overrides or {}).get(clique, default)
        groups.append({"name": ".".join((name,) + clique),
                       "attributes": {a: kinds.get(a, "identity") for a in reversed(clique)},
                       "target": target})
    return groups


def assert_same_groups(mine, reference):
    assert [g.name for g in mine.groups] == [g.name for g in reference.groups]
    for a, b in zip(mine.groups, reference.groups):
        assert a.attributes == b.attributes
        for (_, qa), (_, qb) in zip(a.queries, b.queries):
            assert qa.kind == qb.kind and qa.labels == qb.labels
            np.testing.assert_array_equal(qa.matrix, qb.matrix)
        np.testing.assert_array_equal(a.targets, b.targets)
        assert not a.targets.flags.writeable
    assert mine.query_labels == reference.query_labels
    np.testing.assert_array_equal(mine.targets, reference.targets)
    assert mine.to_dict() == reference.to_dict()
    assert mine.spec_hash == reference.spec_hash


# ------------------------------------------------------------------ shorthand = written out


def test_pairs_over_every_attribute_equal_the_written_out_groups(tmp_path):
    names = tuple(a["name"] for a in ATTRIBUTES)
    short = load_spec(write(tmp_path, yaml.safe_dump(spec_mapping([
        {"name": "one", "attributes": {"age": "identity"}, "target": 3},
        {"name": "pairs", "marginals": {"order": 2}, "target": 1},
        {"name": "all", "total": True, "target": 2}])), "short.yaml"))
    long = load_spec(write(tmp_path, yaml.safe_dump(spec_mapping(
        [{"name": "one", "attributes": {"age": "identity"}, "target": 3}]
        + written_out("pairs", 2, names, {}, 1)
        + [{"name": "all", "total": True, "target": 2}])), "long.yaml"))
    assert len(short.groups) == 1 + 10 + 1
    assert short.groups[1].name == "pairs.age.sex" and short.groups[10].name == "pairs.hisp.edu"
    assert_same_groups(short, long)
    assert "pairs.race.edu:race[asian],edu[3]" in short.query_labels


@pytest.mark.parametrize("order", [1, 2, 3])
def test_kinds_rules_and_per_clique_targets_equal_the_written_out_groups(tmp_path, order):
    (tmp_path / "t.csv").write_text("\n".join(str(1 + j) for j in range(10)) + "\n")
    over_given = ["edu", "race", "age", "sex"]  # any order; the cliques follow the schema
    over = ("age", "sex", "race", "edu")
    kinds = {"age": "prefix", "edu": {"ranges": [[0, 1], [1, 3]]}, "race": {"select": ["black", 0]}}
    cliques = list(itertools.combinations(over, order))
    overrides = {cliques[0]: 4.5, cliques[-1]: {"base": 2, "width_power": 1}}
    spelled = {".".join(reversed(c)): t for c, t in overrides.items()}  # any order of the clique
    if order == 2:  # a file and a list for two more cliques: age.race has 5 x 2 queries
        overrides[("age", "race")] = {"file": "t.csv"}
        spelled["race.age"] = {"file": "t.csv"}
        overrides[("sex", "race")] = [1, 2, 3, 4]
        spelled["race.sex"] = [1, 2, 3, 4]
    entry = {"name": "m", "marginals": {"order": order, "over": over_given, "kinds": kinds,
                                        "targets": spelled}, "target": RULE}
    short = load_spec(write(tmp_path, yaml.safe_dump(spec_mapping([entry])), "short.yaml"))
    long = load_spec(write(tmp_path, yaml.safe_dump(spec_mapping(
        written_out("m", order, over, kinds, RULE, overrides))), "long.yaml"))
    assert len(short.groups) == len(cliques)
    assert_same_groups(short, long)
    # the rule's jitter hashes the generated name, so equal rules still give per-group targets
    jittered = [g for g in short.groups if tuple(g.attributes) not in overrides]
    assert len({tuple(g.targets[:1]) for g in jittered}) == len(jittered)


def test_shorthand_round_trips_through_its_canonical_form():
    spec = parse_spec(spec_mapping([{"name": "p", "marginals": {"order": 2, "kinds": {"age": "prefix"}},
                                     "target": RULE}]))
    canonical = json.loads(json.dumps(spec.to_dict()))
    assert all("marginals" not in group for group in canonical["queries"])
    again = parse_spec(canonical)
    assert again.spec_hash == spec.spec_hash
    assert [g.name for g in again.groups] == [g.name for g in spec.groups]


def test_each_level_takes_the_shorthand():
    spec = parse_spec({"name": "lv", "attributes": ATTRIBUTES[:3], "levels": [
        {"name": "a", "queries": [{"name": "p", "marginals": {"order": 2}, "target": 1}]},
        {"name": "b", "queries": [{"name": "p", "marginals": {"order": 1, "over": ["race"]}, "target": 2}]}]})
    assert [g.name for g in spec.levels[0].groups] == ["p.age.sex", "p.age.race", "p.sex.race"]
    assert [g.name for g in spec.levels[1].groups] == ["p.race"]
    assert spec.levels[1].groups[0].targets.tolist() == [2.0, 2.0, 2.0]


def test_written_group_names_may_hold_dots_and_equal_number_targets_share_one_array():
    spec = parse_spec(spec_mapping([
        {"name": "x.y", "attributes": {"age": "identity"}, "target": 1},
        {"name": "z", "attributes": {"edu": "prefix"}, "target": 1.0},
        {"name": "w", "attributes": {"age": "total"}, "target": 1}]))
    assert spec.group("x.y").targets.size == 5 and spec.group("z").targets.size == 4  # not shared
    assert spec.group("w").targets.size == 1
    same = parse_spec(spec_mapping([
        {"name": "x.y", "attributes": {"age": "identity"}, "target": 1},
        {"name": "z", "attributes": {"age": "prefix"}, "target": 1.0},
        {"name": "w", "attributes": {"age": "prefix"}, "target": 2}]))
    assert same.group("x.y").targets is same.group("z").targets  # 1 and 1.0, 5 queries each
    assert same.group("w").targets.tolist() == [2.0] * 5
    assert not same.group("z").targets.flags.writeable


# ------------------------------------------------------------------ errors


def _entry(**marginals):
    return {"name": "p", "marginals": marginals, "target": 1}


ERRORS = [
    ("order zero", [_entry(order=0)], "queries[0].marginals.order: must be >= 1, got 0"),
    ("order string", [_entry(order="2")], "queries[0].marginals.order: expected an integer >= 1, got a string '2'"),
    ("order above over", [_entry(order=3, over=["age", "sex"])],
     "queries[0].marginals.order: must be at most 2 (the attributes in over), got 3"),
    ("order missing", [_entry(over=["age"])], "queries[0].marginals: missing required key 'order'"),
    ("unknown marginals key", [_entry(order=2, ovr=["age"])],
     "queries[0].marginals: unknown key 'ovr' (did you mean 'over'?)"),
    ("marginals not a mapping", [{"name": "p", "marginals": 2, "target": 1}],
     "queries[0].marginals: expected a mapping {order: K"),
    ("over unknown", [_entry(order=1, over=["age", "sexx"])],
     "queries[0].marginals.over[1]: unknown attribute 'sexx' (attributes: age, sex, race, hisp, edu)"),
    ("over repeated", [_entry(order=1, over=["age", "sex", "age"])],
     "queries[0].marginals.over[2]: attribute 'age' listed twice"),
    ("over empty", [_entry(order=1, over=[])], "queries[0].marginals.over: expected a non-empty list"),
    ("kinds outside over", [_entry(order=1, over=["age"], kinds={"sex": "identity"})],
     "queries[0].marginals.kinds.sex: attribute 'sex' is not in over (age)"),
    ("kinds unknown", [_entry(order=1, kinds={"agee": "prefix"})],
     "queries[0].marginals.kinds.agee: unknown attribute 'agee'"),
    ("kinds ordinal", [_entry(order=2, kinds={"sex": "prefix"})],
     "queries[0].marginals.kinds.sex: prefix queries need an ordinal attribute"),
    ("kinds bad select", [_entry(order=1, kinds={"race": {"select": ["red"]}})],
     "queries[0].marginals.kinds.race.select[0]: unknown value 'red' of race"),
    ("targets wrong order", [_entry(order=2, targets={"age.sex.race": 1})],
     "queries[0].marginals.targets.age.sex.race: a clique of order 2 names 2 attributes joined by '.', got 3"),
    ("targets outside over", [_entry(order=2, over=["age", "sex"], targets={"age.race": 1})],
     "queries[0].marginals.targets.age.race: attribute 'race' is not in over (age, sex)"),
    ("targets twice", [_entry(order=2, targets={"age.sex": 1, "sex.age": 2})],
     "queries[0].marginals.targets.sex.age: clique age.sex given twice (also queries[0].marginals.targets.age.sex)"),
    ("targets repeat attribute", [_entry(order=2, targets={"age.age": 1})],
     "queries[0].marginals.targets.age.age: names an attribute twice"),
    ("clique target length", [_entry(order=2, targets={"age.sex": [1, 2]})],
     "queries[0].marginals.targets.age.sex: expected 10 values (one per query), got 2 (group p.age.sex)"),
    ("default target list", [{"name": "p", "marginals": {"order": 1}, "target": [1, 2]}],
     "queries[0].target: a marginals group's target is a number or a rule {base: B, ...} for every clique"),
    ("default target file", [{"name": "p", "marginals": {"order": 1}, "target": {"file": "t.csv"}}],
     "queries[0].target: a marginals group's target is a number or a rule"),
    ("default target negative", [{"name": "p", "marginals": {"order": 1}, "target": -1}],
     "queries[0].target: must be in [1e-06, 1e+12], got -1 (group p.age)"),
    ("rule error names the group", [{"name": "p", "marginals": {"order": 2, "over": ["sex", "age"],
                                                                "kinds": {"age": "prefix"}},
                                     "target": {"base": 1e11, "width_power": 1000}}],
     "queries[0].target: the rule gives query [2] the target inf; targets must be in [1e-06, 1e+12] (group p.age.sex)"),
    ("missing target", [{"name": "p", "marginals": {"order": 1}}], "queries[0]: missing required key 'target'"),
    ("with attributes", [{"name": "p", "marginals": {"order": 1}, "attributes": {"age": "identity"}, "target": 1}],
     "queries[0]: give marginals or attributes, not both"),
    ("with total", [{"name": "p", "marginals": {"order": 1}, "total": True, "target": 1}],
     "queries[0]: give marginals or total, not both"),
    ("bad name", [{"name": "p q", "marginals": {"order": 1}, "target": 1}],
     "queries[0].name: a group name 'p q' may hold only letters, digits, '_', '-' and '.'"),
    ("generated name taken before", [{"name": "p.age", "attributes": {"age": "identity"}, "target": 1},
                                     _entry(order=1)],
     "queries[1].marginals: generates the group 'p.age', a name queries[0].name already gives"),
    ("generated name taken after", [_entry(order=1), {"name": "p.sex", "attributes": {"sex": "identity"}, "target": 1}],
     "queries[1].name: duplicated group name 'p.sex' (queries[0].marginals generates it)"),
    ("two shorthands collide", [_entry(order=1, over=["age"]), _entry(order=1, over=["sex", "age"])],
     "queries[1].marginals: generates the group 'p.age', a name queries[0].marginals already gives"),
]


@pytest.mark.parametrize("queries,start", [case[1:] for case in ERRORS], ids=[case[0] for case in ERRORS])
def test_errors_name_the_field(queries, start):
    with pytest.raises(SpecError) as error:
        parse_spec(spec_mapping(queries))
    assert str(error.value).startswith(start), str(error.value)
    assert "\n" not in str(error.value)


def test_a_clique_over_max_cells_is_named():
    with pytest.raises(SpecError) as error:
        parse_spec(spec_mapping([_entry(order=2)], blocks={"max_cells": 12}))
    assert str(error.value) == "queries[0].marginals: clique age.race of 15 cells exceeds blocks.max_cells = 12"


def test_an_entry_generating_too_many_groups_is_refused_before_generating_them():
    attributes = [{"name": f"a{i}", "size": 1} for i in range(40)]
    with pytest.raises(SpecError) as error:
        parse_spec(spec_mapping([_entry(order=20)], attributes=attributes))
    assert str(error.value) == (f"queries[0].marginals.order: order 20 over 40 attributes makes "
                                f"137,846,528,820 groups, more than {MAX_MARGINAL_GROUPS:,}")


# ------------------------------------------------------------------ linear work, counted


def bytecodes(function) -> int:
    """Python bytecode instructions executed by ``function()`` (sys.settrace opcode events): a
    measure of work that does not depend on the machine or its load."""
    count = 0

    def tracer(frame, event, arg):
        nonlocal count
        frame.f_trace_opcodes = True
        if event == "opcode":
            count += 1
        return tracer

    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        function()
    finally:
        sys.settrace(previous)
    return count


@pytest.mark.parametrize("shorthand", [False, True], ids=["written", "shorthand"])
def test_loading_hashing_and_planning_input_are_linear_in_the_spec_size(tmp_path, shorthand):
    """10 -> 32 attributes: 45 -> 496 groups (11x), and the spec (attributes + groups) 9.6x.
    The work per group must stay flat. The quadratic steps this replaced (each group compared
    with every earlier one; each group scanning every attribute; ``spec.group`` scanning every
    group) made ``parse`` 27.7x and ``plan`` 50.6x the work here (counted on the code before)."""
    small, large = (write(tmp_path, pairs_text(n, 3, shorthand), f"s{n}.yaml") for n in (10, 32))
    size_ratio = (32 + 496) / (10 + 45)
    for step in ("load", "parse", "hash", "plan"):
        work = []
        for path in (small, large):
            spec = load_spec(path)
            data = yaml.safe_load(path.read_text())
            if step == "load":  # YAML included
                work.append(bytecodes(lambda: load_spec(path)))
            elif step == "parse":
                work.append(bytecodes(lambda: parse_spec(data)))
            elif step == "hash":
                work.append(bytecodes(lambda: spec.to_dict() and spec.spec_hash))
            else:
                work.append(bytecodes(lambda: (spec.group_triples(), spec.targets, spec.query_labels,
                                               [spec.group(g.name) for g in spec.groups])))
        ratio = work[1] / work[0]
        assert 3 <= ratio <= 1.25 * size_ratio, (step, work, ratio)  # >= 3: the counter sees the work
