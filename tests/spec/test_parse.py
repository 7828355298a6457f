"""Tests for distfit.spec.parse: the example specs, query kinds and labels, defaults, the YAML
dialect, and the one-line errors that name the field."""
from __future__ import annotations

import importlib.util
import itertools
import json
import math

import numpy as np
import pytest

from distfit.plan.residual import residual_blocks
from distfit.mathematics.privacy import Budget
from distfit.spec.model import AttributeSpec, BlockLimits, PipelineSpec, PrivacySpec, SpecError
from distfit.spec.parse import load_spec, parse_spec
from distfit.mathematics.workload import age_pyramid_workload, pl94_workload, workload_from_groups

from tests.spec.helpers import BASE, PIPELINES, base_mapping, edit, reading_spec, spec_error, write, write_age_sex


def rows_and_targets(workload) -> list[tuple[tuple[float, ...], float]]:
    return sorted((tuple(row), float(t)) for row, t in zip(workload.matrix, workload.targets))


# ------------------------------------------------------------------ example specs


def test_pl94_spec_loads():
    spec = load_spec(PIPELINES / "pl94.yaml")
    assert isinstance(spec, PipelineSpec)
    assert spec.name == "pl94"
    assert spec.domain.names == ("voting_age", "hispanic", "race")
    assert spec.domain.sizes == (2, 2, 63)
    assert spec.units is not None and spec.units.column == "block_id"
    assert [g.name for g in spec.groups] == ["voting_age", "hispanic", "race_single", "race_multi", "detailed"]
    assert [g.num_queries for g in spec.groups] == [2, 2, 6, 57, 252]
    race = spec.attribute("race")
    races = ("white", "black", "aian", "asian", "nhpi", "sor")
    for r in range(1, 64):  # value r-1 is the combination with bitmask r
        assert race.values[r - 1] == "+".join(x for k, x in enumerate(races) if r >> k & 1)
    assert spec.group("race_single").labels[1] == "race[black]"
    assert spec.privacy == PrivacySpec("accuracy", None)
    assert spec.blocks == BlockLimits(4096, True)
    assert spec.source_path == str((PIPELINES / "pl94.yaml").resolve())


def test_pl94_spec_workload_matches_builtin():
    spec = load_spec(PIPELINES / "pl94.yaml")
    mine, reference = spec.workload(), pl94_workload()
    assert mine.shape == reference.shape == (319, 252)
    assert mine.domain == reference.domain
    assert rows_and_targets(mine) == rows_and_targets(reference)
    assert len(set(mine.labels)) == 319
    assert mine.labels[0] == "voting_age:voting_age[under_18]"


def test_age_pyramid_spec_workload_matches_builtin():
    spec = load_spec(PIPELINES / "age_pyramid.yaml")
    assert spec.domain.sizes == (2, 116)
    assert spec.attribute("age").ordinal and spec.attribute("age").values[17] == "17"
    mine, reference = spec.workload(), age_pyramid_workload()
    assert mine.shape == reference.shape == (351, 232)
    assert rows_and_targets(mine) == rows_and_targets(reference)
    assert spec.group("male").labels[17] == "sex[male],age[<=17]"
    assert spec.group("both_adults").labels == ("age[18..115]",)


def test_group_triples_feed_workload_and_blocks():
    spec = load_spec(PIPELINES / "pl94.yaml")
    triples = spec.group_triples()
    assert [t[0] for t in triples] == [g.name for g in spec.groups]
    from_groups = workload_from_groups(spec.domain, triples)
    np.testing.assert_array_equal(from_groups.matrix, spec.workload().matrix)
    np.testing.assert_array_equal(from_groups.targets, spec.targets)
    blocks = residual_blocks(spec.domain, triples)
    assert {b.block_id for b in blocks} >= {"total", "r-race", "r-voting_age.hispanic.race"}
    group = spec.group("detailed")
    assert list(group.matrices) == ["voting_age", "hispanic", "race"]
    assert not group.targets.flags.writeable
    assert not group.matrices["race"].flags.writeable


def test_workload_refuses_huge_domains(tmp_path):
    path = write(tmp_path, """\
        name: big
        attributes:
          - {name: a, size: 3000}
          - {name: b, size: 3000}
        queries:
          - {name: a, attributes: {a: identity}, target: 1}
        """)
    spec = load_spec(path)
    assert spec.domain.size == 9_000_000
    with pytest.raises(ValueError, match="9000000 cells"):
        spec.workload()


def _generator():
    location = importlib.util.spec_from_file_location("generate_marginals", PIPELINES / "generate_marginals.py")
    module = importlib.util.module_from_spec(location)
    location.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def marginals() -> PipelineSpec:
    return load_spec(PIPELINES / "marginals.yaml")


def test_marginals_spec_loads(marginals):
    spec = marginals
    assert spec.name == "marginals"
    assert len(spec.attributes) >= 30
    assert all(2 <= a.size <= 20 for a in spec.attributes)
    assert {2, 20} <= {a.size for a in spec.attributes}
    ordinal = {a.name for a in spec.attributes if a.ordinal}
    assert len(ordinal) >= 8
    n = len(spec.attributes)
    assert len(spec.groups) == n * (n - 1) // 2 == 435
    pairs = [g.attributes for g in spec.groups]
    assert sorted(pairs) == sorted(itertools.combinations(spec.domain.names, 2))
    kinds = {}
    for group in spec.groups:
        assert len(group.attributes) == 2
        assert math.prod(spec.attribute(a).size for a in group.attributes) <= 400
        for attribute, query in group.queries:
            kinds.setdefault(attribute, set()).add(query.kind)
        assert np.ptp(group.targets) > 0  # per-query targets within every group
    for name, used in kinds.items():  # one kind per attribute, in all of its groups
        assert len(used) == 1
        assert used <= ({"prefix", "ranges"} if name in ordinal else {"identity"})
    assert {"prefix", "ranges"} <= set().union(*kinds.values())
    # targets follow the priorities: group base 1 + (10 - p_a - p_b) / 4 (generator), and query j
    # gets base * w_j ** 0.25 * [1, 2)
    generator = _generator()
    priority = {a[0]: a[4] for a in generator.ATTRIBUTES}
    assert list(priority) == list(spec.domain.names)
    for group in spec.groups:
        a, b = group.attributes
        base = 1 + (10 - priority[a] - priority[b]) / 4
        widths = np.kron(*(np.count_nonzero(q.matrix, axis=1) for _, q in group.queries))
        ratio = group.targets / (base * widths ** 0.25)
        assert ratio.min() >= 1 and ratio.max() < 2
    assert spec.group("age_band-sex").targets.max() > spec.group("vehicles-internet_access").targets.min()
    assert spec.blocks == BlockLimits(400, True)


def test_marginals_yaml_is_generated():
    assert (PIPELINES / "marginals.yaml").read_text() == _generator().render()


def test_marginals_residual_blocks_are_many_and_small(marginals, monkeypatch):
    """The blocks are built from the cliques' marginals (at most 400 cells), never over the domain
    (about 1.6e25 cells); the one dense factorisation per attribute, the pseudo-inverse of its
    difference matrix, is made once for each of the 30 attributes, not once per group or block."""
    spec = marginals
    pinv, shapes = np.linalg.pinv, []
    monkeypatch.setattr(np.linalg, "pinv", lambda a, *args, **kw: shapes.append(np.shape(a)) or pinv(a, *args, **kw))
    blocks = residual_blocks(spec.domain, spec.group_triples())
    assert spec.domain.size > 10**25
    assert sorted(shapes) == sorted((n - 1, n) for n in spec.domain.sizes if n > 1)
    assert len(blocks) >= 300
    assert max(b.basis.shape[1] for b in blocks) <= 400
    assert sum(1 for b in blocks if np.ptp(b.targets) > 0) >= 300


def test_mix_spec_loads():
    spec = load_spec(PIPELINES / "mix.yaml")
    assert 3 <= len(spec.attributes) <= 4
    assert spec.domain.size <= 400
    assert spec.attribute("age").ordinal and 10 <= spec.attribute("age").size <= 16
    assert spec.attribute("education").ordinal
    sizes = {len(g.attributes) for g in spec.groups}
    assert {1, 2} <= sizes
    kinds = {q.kind for g in spec.groups for _, q in g.queries}
    assert {"prefix", "ranges", "identity"} <= kinds
    assert sum(1 for g in spec.groups if np.ptp(g.targets) > 0) >= 5
    workload = spec.workload()
    assert workload.matrix.shape == (spec.num_queries, spec.domain.size)
    assert spec.group("age_policy").labels[0] == "age[18-19..85_plus]"


def test_the_mask_section_is_parsed_kept_and_hashed():
    plain = parse_spec(base_mapping())
    spec = parse_spec({**base_mapping(), "mask": {**MASK, "block_rows": 1000}})
    assert plain.mask is None and "mask" not in plain.to_dict()
    assert spec.mask.arguments() == {"columns": ["age", "hours"], "bounds": {"age": (17.0, 90.0), "hours": (1.0, 99.0)},
                                     "epsilon": 1.0, "delta": 1e-6, "block_rows": 1000}
    assert parse_spec(json.loads(json.dumps(spec.to_dict()))).spec_hash == spec.spec_hash != plain.spec_hash
    levels = base_mapping()
    levels["levels"] = [{"name": "all", "queries": levels.pop("queries")}]
    with pytest.raises(SpecError, match="^mask: a spec with levels takes no mask section"):
        parse_spec({**levels, "mask": MASK})


def test_new_specs_round_trip_through_to_dict(marginals):
    for spec in (marginals, load_spec(PIPELINES / "mix.yaml")):
        data = json.loads(json.dumps(spec.to_dict()))
        assert parse_spec(data).spec_hash == spec.spec_hash


# ------------------------------------------------------------------ kinds, labels, defaults


def test_query_kinds_labels_and_matrices(tmp_path):
    path = write_age_sex(tmp_path, "kinds", """\
        - name: pre
          attributes: {age: prefix, sex: total}
          target: 1
        - name: rng
          attributes: {age: {ranges: [[1, 2], ['0', 3]]}}
          target: [1, 2]
        - name: all
          attributes: {age: all_ranges}
          target: 1
        - name: sel
          attributes: {sex: {select: [female, 0]}, age: identity}
          target: 3
        - name: mat
          attributes: {sex: {matrix: [[1, -1]]}}
          target: 1
        - name: everyone
          total: true
          target: 5
        """)
    spec = load_spec(path)
    pre = spec.group("pre")
    assert pre.attributes == ("age", "sex")  # schema order
    assert pre.labels[:2] == ("age[<=0],sex[*]", "age[<=1],sex[*]")
    np.testing.assert_array_equal(pre.matrices["age"], np.tri(4))
    rng = spec.group("rng")
    assert rng.labels == ("age[1..2]", "age[0..3]")
    np.testing.assert_array_equal(rng.matrices["age"], [[0, 1, 1, 0], [1, 1, 1, 1]])
    np.testing.assert_array_equal(rng.targets, [1, 2])
    assert spec.group("all").num_queries == 10
    assert spec.group("all").labels[:2] == ("age[0..0]", "age[0..1]")
    sel = spec.group("sel")
    assert sel.attributes == ("age", "sex")
    assert sel.num_queries == 8 and sel.labels[:2] == ("age[0],sex[female]", "age[0],sex[male]")
    np.testing.assert_array_equal(sel.matrices["sex"], [[0, 1], [1, 0]])
    assert spec.group("mat").labels == ("sex[#0]",)
    everyone = spec.group("everyone")
    assert everyone.queries == () and everyone.num_queries == 1 and everyone.labels == ("total",)
    w = spec.workload()
    assert w.num_queries == 4 + 2 + 10 + 8 + 1 + 1
    np.testing.assert_array_equal(w.matrix[-1], np.ones(8))
    assert w.labels[-1] == "everyone:total"


def test_defaults_and_budget_modes():
    spec = parse_spec(base_mapping())
    assert spec.description == "" and spec.units is None
    assert spec.privacy.mode == "accuracy" and spec.privacy.budget is None
    assert spec.blocks == BlockLimits(4096, True)
    assert spec.attributes[0] == AttributeSpec("age", ("0", "1", "2", "3"), True)
    assert spec.attributes[1].size == 2
    mapping = base_mapping()
    mapping["privacy"] = {"rho": 0.5}  # mode inferred
    assert parse_spec(mapping).privacy == PrivacySpec("budget", Budget(rho=0.5))
    mapping["privacy"] = {"mode": "budget", "epsilon": 1.0, "delta": 1e-6}
    assert parse_spec(mapping).privacy.budget == Budget(epsilon=1.0, delta=1e-6)


def test_yaml_dialect(tmp_path):
    path = write(tmp_path, """\
        name: dialect
        attributes:
          - {name: answer, values: [yes, no, on, 18_64, 2020-01-01]}
        queries:
          - {name: a, attributes: {answer: identity}, target: 1e3}
        """)
    spec = load_spec(path)
    assert spec.attributes[0].values == ("yes", "no", "on", "18_64", "2020-01-01")
    assert spec.groups[0].targets[0] == 1000.0


DIALECT_EDGES = """\
name: edges
description: "quoted: text, with 'quotes' and unicode \\u00e9"
attributes:
  - {name: answer, values: [yes, no, on, 18_64, 2020-01-01, '5', 0x1F, 0o17, "017", ~a]}
  - name: hours
    bins: [-.inf, 0, 1.5e1, .inf]
queries:
  - {name: a, attributes: {answer: {select: [0x3, '5', "017"]}}, target: [1e3, .5, +2]}
  - name: b
    attributes:
      hours: prefix
    target: !!float 3
"""


@pytest.mark.parametrize("text", ["pipelines", DIALECT_EDGES])
def test_libyaml_and_python_readers_agree(tmp_path, monkeypatch, text):
    """load_spec reads with libyaml's parser when PyYAML has it; the pure-Python reader (used
    without libyaml, and for the message of a malformed file) must give the same specs."""
    paths = sorted(PIPELINES.glob("*.yaml")) if text == "pipelines" else [write(tmp_path, text)]
    fast = [load_spec(path) for path in paths]
    monkeypatch.setattr("distfit.spec.parse._FastSpecLoader", None)
    slow = [load_spec(path) for path in paths]
    for a, b in zip(fast, slow):
        assert a.to_dict() == b.to_dict() and a.spec_hash == b.spec_hash
    if text != "pipelines":
        assert fast[0].attribute("answer").values[5:9] == ("5", "31", "15", "017")
        assert fast[0].group("a").targets.tolist() == [1000.0, 0.5, 2.0]
        assert fast[0].group("a").queries[0][1].params == (3, 5, 8)


# ------------------------------------------------------------------ errors

#: A valid ``mask`` section (masked pseudo-data of two numeric columns, docs/mask.md).
MASK = {"columns": ["age", "hours"], "bounds": {"age": [17, 90], "hours": [1, 99]}, "epsilon": 1, "delta": 1e-6}


ERROR_CASES = [
    # (description, YAML text, expected message start)
    ("unknown attribute", edit(queries=[
        {"name": "a", "attributes": {"age": "identity"}, "target": 1},
        {"name": "b", "attributes": {"sex": "identity"}, "target": 1},
        {"name": "c", "attributes": {"agee": "identity"}, "target": 1}]),
     "queries[2].attributes.agee: unknown attribute 'agee' (attributes: age, sex, race)"),
    ("duplicated attribute", edit(attributes=[
        {"name": "age", "size": 4}, {"name": "sex", "size": 2}, {"name": "race", "size": 3},
        {"name": "sex", "size": 2}]),
     "attributes[3].name: duplicated attribute 'sex'"),
    ("negative target", edit(queries=[{"name": "a", "attributes": {"age": "identity"}, "target": -1}]),
     "queries[0].target: must be in [1e-06, 1e+12], got -1"),
    ("prefix on nominal", edit(queries=[
        {"name": "a", "attributes": {"age": "identity"}, "target": 1},
        {"name": "b", "attributes": {"sex": "prefix"}, "target": 1}]),
     "queries[1].attributes.sex: prefix queries need an ordinal attribute"),
    ("ranges on nominal", edit(queries=[
        {"name": "b", "attributes": {"race": {"ranges": [[0, 1]]}}, "target": 1}]),
     "queries[0].attributes.race: ranges queries need an ordinal attribute"),
    ("budget two ways", edit(privacy={"mode": "budget", "rho": 0.5, "epsilon": 1.0, "delta": 1e-6}),
     "privacy: budget given two ways (rho and epsilon/delta)"),
    ("budget missing", edit(privacy={"mode": "budget"}), "privacy: no budget given"),
    ("budget negative rho", edit(privacy={"rho": -1}), "privacy.rho: must be in [1e-08, 1e+08], got -1"),
    ("budget in accuracy mode", edit(privacy={"mode": "accuracy", "alpha": 1}),
     "privacy: mode accuracy takes no budget"),
    ("bad privacy mode", edit(privacy={"mode": "fast"}), "privacy.mode: expected accuracy or budget"),
    ("malformed yaml", "name: toy\nattributes: [\n  {name: a, size: 2}\nqueries: x\n", "{file}: malformed YAML at line 4:"),
    ("duplicate yaml key", "name: toy\nname: again\n", "{file}: malformed YAML at line 2: duplicate key 'name'"),
    ("target length", edit(queries=[
        {"name": f"g{k}", "attributes": {"age": "identity"}, "target": 1} for k in range(4)] + [
        {"name": "g4", "attributes": {"age": "identity", "race": "identity"}, "target": [1] * 10}]),
     "queries[4].target: expected 12 values (one per query), got 10"),
    ("target missing file", edit(queries=[
        {"name": "a", "attributes": {"age": "identity"}, "target": {"file": "x.csv"}}]),
     "queries[0].target.file: cannot read 'x.csv': "),
    ("unknown top-level key", BASE + "querys: []\n", "spec: unknown key 'querys' (did you mean 'queries'?)"),
    ("missing top-level key", "name: toy\nattributes: [{name: a, size: 2}]\n", "spec: missing required key 'queries'"),
    ("top level not a mapping", "- 1\n- 2\n", "spec: expected a mapping"),
    ("empty file", "# nothing\n", "{file}: empty spec"),
    ("bad name", edit(name="my spec"), "name: a spec name 'my spec' may hold only"),
    ("attributes not a list", edit(attributes={"age": 4}), "attributes: expected a list of attributes, got a mapping"),
    ("values and size", edit(attributes=[{"name": "a", "size": 2, "values": ["x", "y"]}]),
     "attributes[0]: give values or size, not both"),
    ("size not int", edit(attributes=[{"name": "a", "size": "four"}]),
     "attributes[0].size: expected an integer >= 1, got a string 'four'"),
    ("ordinal not bool", edit(attributes=[{"name": "a", "size": 2, "ordinal": "yes"}]),
     "attributes[0].ordinal: expected true or false, got a string 'yes'"),
    ("duplicated label", edit(attributes=[{"name": "a", "values": ["x", "y", "x"]}]),
     "attributes[0].values[2]: duplicated value label 'x'"),
    ("bad label", edit(attributes=[{"name": "a", "values": ["x", "y[1]"]}]), "attributes[0].values[1]: bad label"),
    ("unknown attribute key", edit(attributes=[{"name": "a", "size": 2, "ordinl": True}]),
     "attributes[0]: unknown key 'ordinl' (did you mean 'ordinal'?)"),
    ("queries not a list", edit(queries={"a": 1}), "queries: expected a list of query groups, got a mapping"),
    ("empty queries", edit(queries=[]), "queries: must hold at least one query group"),
    ("duplicated group", edit(queries=[
        {"name": "a", "attributes": {"age": "identity"}, "target": 1},
        {"name": "a", "attributes": {"sex": "identity"}, "target": 1}]),
     "queries[1].name: duplicated group name 'a'"),
    ("unknown kind", edit(queries=[{"name": "a", "attributes": {"age": "prefx"}, "target": 1}]),
     "queries[0].attributes.age: unknown query kind 'prefx' (did you mean 'prefix'?"),
    ("unknown select value", edit(queries=[{"name": "a", "attributes": {"race": {"select": ["whte"]}}, "target": 1}]),
     "queries[0].attributes.race.select[0]: unknown value 'whte' of race (values: white, black, asian)"),
    ("select index out of range", edit(queries=[{"name": "a", "attributes": {"race": {"select": [0, 3]}}, "target": 1}]),
     "queries[0].attributes.race.select[1]: value index 3 out of range 0..2"),
    ("select repeated", edit(queries=[{"name": "a", "attributes": {"race": {"select": [0, "white"]}}, "target": 1}]),
     "queries[0].attributes.race.select[1]: value 'white' selected twice"),
    ("empty range", edit(queries=[{"name": "a", "attributes": {"age": {"ranges": [[0, 1], [3, 2]]}}, "target": 1}]),
     "queries[0].attributes.age.ranges[1]: empty range"),
    ("matrix columns", edit(queries=[{"name": "a", "attributes": {"race": {"matrix": [[1, 0]]}}, "target": 1}]),
     "queries[0].attributes.race.matrix: expected 3 columns"),
    ("matrix zero row", edit(queries=[{"name": "a", "attributes": {"race": {"matrix": [[1, 0, 0], [0, 0, 0]]}}, "target": 1}]),
     "queries[0].attributes.race.matrix[1]: row is all zeros"),
    ("two kinds", edit(queries=[{"name": "a", "attributes": {"race": {"select": [0], "matrix": [[1, 1, 1]]}}, "target": 1}]),
     "queries[0].attributes.race: a query-kind mapping has exactly one key"),
    ("empty clique", edit(queries=[{"name": "a", "attributes": {}, "target": 1}]),
     "queries[0].attributes: empty"),
    ("total and attributes", edit(queries=[{"name": "a", "total": True, "attributes": {"age": "identity"}, "target": 1}]),
     "queries[0]: give attributes or total: true, not both"),
    ("missing target", edit(queries=[{"name": "a", "attributes": {"age": "identity"}}]),
     "queries[0]: missing required key 'target'"),
    ("target not a number", edit(queries=[{"name": "a", "attributes": {"age": "identity"}, "target": "one"}]),
     "queries[0].target: expected a number, a list of numbers or {file: PATH}"),
    ("target list entry", edit(queries=[{"name": "a", "attributes": {"age": "identity"}, "target": [1, 2, 0, 1]}]),
     "queries[0].target[2]: must be in [1e-06, 1e+12], got 0"),
    ("target list type", edit(queries=[{"name": "a", "attributes": {"age": "identity"}, "target": [1, 2, "x", 1]}]),
     "queries[0].target[2]: expected a number, got a string 'x'"),
    ("target bad extension", edit(queries=[{"name": "a", "attributes": {"age": "identity"}, "target": {"file": "t.txt"}}]),
     "queries[0].target.file: unsupported target file 't.txt'"),
    ("clique too large", edit(blocks={"max_cells": 10}, queries=[
        {"name": "a", "attributes": {"age": "identity"}, "target": 1},
        {"name": "b", "attributes": {"age": "identity", "race": "identity"}, "target": 1}]),
     "queries[1].attributes: clique of 12 cells exceeds blocks.max_cells = 10"),
    ("blocks max_cells", edit(blocks={"max_cells": 0}), "blocks.max_cells: must be >= 1, got 0"),
    ("blocks merge", edit(blocks={"merge": "no"}), "blocks.merge: expected true or false"),
    ("blocks unknown key", edit(blocks={"max_cell": 5}), "blocks: unknown key 'max_cell' (did you mean 'max_cells'?)"),
    ("units column", edit(units={"column": 3}), "units.column: expected a column name"),
    ("units not mapping", edit(units="block_id"), "units: expected a mapping {column: NAME} or null"),
    ("description type", edit(description=[1]), "description: expected a string"),
    # target rules
    ("rule without base", edit(queries=[{"name": "a", "attributes": {"age": "prefix"}, "target": {"jitter": 1}}]),
     "queries[0].target: missing required key 'base'"),
    ("rule base type", edit(queries=[{"name": "a", "attributes": {"age": "prefix"}, "target": {"base": "x"}}]),
     "queries[0].target.base: expected a number, got a string 'x'"),
    ("rule base zero", edit(queries=[{"name": "a", "attributes": {"age": "prefix"}, "target": {"base": 0}}]),
     "queries[0].target.base: must be finite and > 0, got 0"),
    ("rule base infinite", edit(queries=[{"name": "a", "attributes": {"age": "prefix"}, "target": {"base": float("inf")}}]),
     "queries[0].target.base: must be finite, got inf"),
    ("rule width_power type", edit(queries=[
        {"name": "a", "attributes": {"age": "prefix"}, "target": {"base": 1, "width_power": [1]}}]),
     "queries[0].target.width_power: expected a number, got a list"),
    ("rule negative jitter", edit(queries=[
        {"name": "a", "attributes": {"age": "prefix"}, "target": {"base": 1, "jitter": -1}}]),
     "queries[0].target.jitter: must be finite and >= 0, got -1"),
    ("rule seed float", edit(queries=[
        {"name": "a", "attributes": {"age": "prefix"}, "target": {"base": 1, "jitter": 1, "seed": 1.5}}]),
     "queries[0].target.seed: expected an integer >= 0, got a number 1.5"),
    ("rule seed negative", edit(queries=[
        {"name": "a", "attributes": {"age": "prefix"}, "target": {"base": 1, "seed": -3}}]),
     "queries[0].target.seed: expected an integer >= 0, got an integer -3"),
    ("rule unknown key", edit(queries=[
        {"name": "a", "attributes": {"age": "prefix"}, "target": {"base": 1, "jiter": 1}}]),
     "queries[0].target: unknown key 'jiter' (did you mean 'jitter'?)"),
    ("rule and file", edit(queries=[
        {"name": "a", "attributes": {"age": "prefix"}, "target": {"file": "t.csv", "base": 1}}]),
     "queries[0].target: give {file: PATH} or a rule (base), not both"),
    ("rule overflows", edit(queries=[
        {"name": "a", "attributes": {"age": "prefix"}, "target": {"base": 1e11, "width_power": 1000}}]),
     "queries[0].target: the rule gives query [1] the target inf; targets must be in [1e-06, 1e+12]"),
    ("rule in a later group", edit(queries=[
        {"name": "a", "attributes": {"age": "prefix"}, "target": {"base": 1}},
        {"name": "b", "attributes": {"sex": "identity"}, "target": {"base": 1, "jitter": "big"}}]),
     "queries[1].target.jitter: expected a number, got a string 'big'"),
    ("mask bounds reversed", edit(mask={**MASK, "bounds": {"age": [90, 17], "hours": [1, 99]}}),
     "mask.bounds.age: LO must be < HI, got [90, 17]"),
    ("mask bounds not a pair", edit(mask={**MASK, "bounds": {"age": "17:90", "hours": [1, 99]}}),
     "mask.bounds.age: expected [LO, HI], two finite numbers, got a string '17:90'"),
    ("mask bounds of another column", edit(mask={**MASK, "bounds": {**MASK["bounds"], "wage": [0, 1]}}),
     "mask.bounds.wage: not one of mask.columns (age, hours)"),
    ("mask bounds missing", edit(mask={**MASK, "bounds": {"age": [17, 90]}}),
     "mask.bounds: no bounds for column 'hours'"),
    ("mask column twice", edit(mask={**MASK, "columns": ["age", "age"]}),
     "mask.columns[1]: column 'age' is named twice"),
    ("mask epsilon", edit(mask={**MASK, "epsilon": 0}), "mask.epsilon: must be in [0.0001, 10000], got 0"),
    ("mask delta", edit(mask={**MASK, "delta": "small"}), "mask.delta: expected a number, got a string 'small'"),
    ("mask block rows", edit(mask={**MASK, "block_rows": 2}),
     "mask.block_rows: must be > 2 (the number of columns), got 2"),
    ("mask unknown key", edit(mask={**MASK, "rows": 5}), "mask: unknown key 'rows'"),
]


@pytest.mark.parametrize("text,start", [case[1:] for case in ERROR_CASES],
                         ids=[case[0] for case in ERROR_CASES])
def test_errors_start_with_field_path(tmp_path, text, start):
    message = spec_error(tmp_path, text)
    start = start.replace("{file}", str(tmp_path / "spec.yaml"))
    assert message.startswith(start), message


def test_error_is_value_error_with_field(tmp_path):
    with pytest.raises(ValueError) as info:
        parse_spec({"name": "x"})
    assert isinstance(info.value, SpecError)
    assert info.value.field == "spec"
    missing = tmp_path / "absent.yaml"
    with pytest.raises(SpecError, match=r"absent\.yaml: cannot read the spec"):
        load_spec(missing)


# ------------------------------------------------------------------ reading rules


@pytest.mark.parametrize("age, fragment", [
    ({"bins": [17]}, "attributes[0].bins: needs at least 2 edges"),
    ({"bins": [17, 17, 20]}, "attributes[0].bins[1]: edges must increase strictly"),
    ({"bins": [17, "x"]}, "attributes[0].bins[1]: expected a number"),
    ({"bins": [0, ".inf", 5]}, "attributes[0].bins[2]: edges must increase strictly"),
    ({"bins": [0, 5, 9], "size": 2}, "give bins or size, not both"),
    ({"bins": [0, 5, 9], "values": ["a"]}, "attributes[0].values: 2 bins need 2 value labels, got 1"),
    ({"bins": [0, 5, 9], "recode": {"a": "b"}}, "attributes[0].recode: give recode or bins"),
    ({"bins": [0, 5, 9], "column": ""}, "attributes[0].column: expected a data column name"),
])
def test_bad_reading_rules(age, fragment):
    with pytest.raises(SpecError) as error:
        reading_spec(**age) if "bins" not in age else parse_spec({"name": "t", "attributes": [
            {"name": "age", **age}], "queries": [{"name": "g", "attributes": {"age": "identity"}, "target": 1}]})
    assert fragment in str(error.value)


def test_recode_to_unknown_label_is_refused():
    with pytest.raises(SpecError, match=r"attributes\[0\].recode.F: 'woman' is not a value label"):
        parse_spec({"name": "t", "attributes": [{"name": "sex", "values": ["f", "m"], "recode": {"F": "woman"}}],
                    "queries": [{"name": "g", "attributes": {"sex": "identity"}, "target": 1}]})


# --------------------------------------------------------------------------------------------
# the Adult and census pipelines


def test_adult_spec_is_current_and_covers_every_row(tmp_path):
    """adult.yaml is what generate_adult.py writes; all 364 3-way marginals of 14 attributes,
    prefix on the ordinal ones; and every one of the 32,561 rows of adult.csv maps into the
    domain (bins and recodes cover every value), counted once in every clique."""
    import subprocess
    import sys

    check = subprocess.run([sys.executable, str(PIPELINES / "generate_adult.py"), "--check"],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    spec = load_spec(PIPELINES / "adult.yaml")
    assert len(spec.attributes) == 14 and len(spec.groups) == 364
    assert sorted(g.attributes for g in spec.groups) == sorted(itertools.combinations(spec.domain.names, 3))
    for group in spec.groups:
        for attribute, query in group.queries:
            assert query.kind == ("prefix" if spec.attribute(attribute).ordinal else "identity")
    assert {a.name for a in spec.attributes if a.bins is not None} == {
        "age", "fnlwgt", "capital_gain", "capital_loss", "hours_per_week"}

    from distfit.stores.data import open_data
    from distfit.data.microdata import tabulate_microdata

    out = tabulate_microdata(spec, PIPELINES / "data" / "adult.csv", tmp_path / "adult.zarr", fsync=False)
    data = open_data(out)
    assert data.units == 1 and data.attrs["total_people"] == 32_561
    first = data.attrs["cliques"][0]
    assert int(data.block_counts(first, 0, 1).sum()) == 32_561


def test_census_spec_has_three_nested_levels():
    spec = load_spec(PIPELINES / "census.yaml")
    assert [level.name for level in spec.levels] == ["nation", "state", "county"]
    assert [level.units.column if level.units else None for level in spec.levels] == [None, "state", "county"]
    assert spec.privacy.budget is not None and spec.domain.size == 224
    for level in spec.levels:
        assert spec.level_spec(level.name).num_queries > 0
