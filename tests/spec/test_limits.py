"""The valid ranges of a spec's numbers, sizes and names (distfit.spec.limits, docs/spec.md "Ranges"):
each end accepted, just past it refused naming the field, and a spec at the corners of the ranges
planned and audited in floating point."""
from __future__ import annotations

import numpy as np
import pytest

from distfit.audit.plan import audit_plan
from distfit.plan.job import run_plan
from distfit.plan.residual import block_id_for
from distfit.runtime.placement import Placement
from distfit.spec.limits import (
    ALPHA,
    ATTRIBUTE_MAX_SIZE,
    BLOCK_ID_MAX_LENGTH,
    DELTA,
    EPSILON,
    MATRIX_ENTRY,
    MAX_CELLS_LIMIT,
    NAME_MAX_LENGTH,
    RHO,
    TARGET,
    USED_ATTRIBUTE_MAX_SIZE,
    WORKLOAD_CELLS_LIMIT,
    block_id_length,
)
from distfit.spec.model import SpecError
from distfit.spec.parse import parse_spec


def spec(**changes) -> dict:
    """A small spec with a solved (not closed-form) block: prefixes of an ordinal attribute."""
    mapping = {
        "name": "limits",
        "attributes": [{"name": "age", "size": 4, "ordinal": True}, {"name": "sex", "size": 2}],
        "queries": [{"name": "pre", "attributes": {"age": "prefix", "sex": "identity"}, "target": 1},
                    {"name": "total", "total": True, "target": 1}],
    }
    mapping.update(changes)
    return mapping


def refused(mapping: dict) -> str:
    with pytest.raises(SpecError) as error:
        parse_spec(mapping)
    return str(error.value)


def below(x: float) -> float:
    return float(np.nextafter(x, 0.0))


def above(x: float) -> float:
    return float(np.nextafter(x, np.inf))


def with_target(target) -> dict:
    return spec(queries=[{"name": "pre", "attributes": {"age": "prefix"}, "target": target}])


# ------------------------------------------------------------------ numbers: each end of each range


@pytest.mark.parametrize("field, make, allowed", [
    ("queries[0].target", with_target, TARGET),
    ("privacy.rho", lambda v: spec(privacy={"rho": v}), RHO),
    ("privacy.alpha", lambda v: spec(privacy={"alpha": v}), ALPHA),
    ("privacy.epsilon", lambda v: spec(privacy={"epsilon": v, "delta": 1e-6}), EPSILON),
    ("privacy.delta", lambda v: spec(privacy={"epsilon": 1.0, "delta": v}), DELTA),
])
def test_each_number_is_accepted_at_its_ends_and_refused_past_them(field, make, allowed):
    parse_spec(make(allowed.low))
    parse_spec(make(allowed.high))
    for outside in (below(allowed.low), above(allowed.high), 1e308, 1e-308, 0, -1):
        message = refused(make(outside))
        assert message == f"{field}: must be {allowed.text}, got {outside!r}", message


def test_the_adversarys_numbers_are_refused_at_load_naming_the_field():
    assert refused(spec(privacy={"rho": 1.0e308})) == "privacy.rho: must be in [1e-08, 1e+08], got 1e+308"
    assert refused(with_target(1e300)) == "queries[0].target: must be in [1e-06, 1e+12], got 1e+300"
    assert refused(with_target(1e-308)) == "queries[0].target: must be in [1e-06, 1e+12], got 1e-308"
    assert refused(with_target([1, 2, 3, 1e13])) == ("queries[0].target[3]: must be in [1e-06, 1e+12], "
                                                    "got 10000000000000.0")


def test_matrix_entries_are_zero_or_within_their_range():
    def matrix(entry):
        return spec(queries=[{"name": "m", "attributes": {"sex": {"matrix": [[1, 0], [entry, 1]]}}, "target": 1}])
    for entry in (0, MATRIX_ENTRY.low, -MATRIX_ENTRY.high):
        parse_spec(matrix(entry))
    for entry in (below(MATRIX_ENTRY.low), -above(MATRIX_ENTRY.high), 1e300):
        assert refused(matrix(entry)).startswith("queries[0].attributes.sex.matrix[1][0]: must be 0 or of absolute "
                                                 "value in [1e-06, 1e+06]")


# ------------------------------------------------------------------ names


@pytest.mark.parametrize("field, make", [
    ("name", lambda n: spec(name=n)),
    ("attributes[1].name", lambda n: spec(attributes=[{"name": "age", "size": 4, "ordinal": True},
                                                      {"name": n, "size": 2}],
                                          queries=[{"name": "g", "attributes": {n: "identity"}, "target": 1}])),
    ("queries[0].name", lambda n: spec(queries=[{"name": n, "attributes": {"sex": "identity"}, "target": 1}])),
    ("levels[0].name", lambda n: {**spec(), "queries": None, "levels": [
        {"name": n, "queries": [{"name": "g", "attributes": {"sex": "identity"}, "target": 1}]}]}),
])
def test_names_are_at_most_64_characters(field, make):
    mapping = make("n" * NAME_MAX_LENGTH)
    mapping = {k: v for k, v in mapping.items() if v is not None}
    parse_spec(mapping)
    mapping = {k: v for k, v in make("n" * (NAME_MAX_LENGTH + 1)).items() if v is not None}
    assert refused(mapping).startswith(f"{field}: ") and "65 characters" in refused(mapping)


def test_names_hold_only_path_safe_characters():
    for bad in ("a/b", "..", "a b", "é"):
        assert refused(spec(name=bad)).startswith("name: a spec name")


def test_a_clique_whose_block_id_is_no_file_name_is_refused_before_planning():
    names = [c * NAME_MAX_LENGTH for c in "abcd"]
    attributes = [{"name": n, "size": 2} for n in names]
    three = spec(attributes=attributes, queries=[{"name": "g", "attributes": {n: "identity" for n in names[:3]},
                                                  "target": 1}])
    assert len(block_id_for(names[:3])) == block_id_length(tuple(names[:3])) <= BLOCK_ID_MAX_LENGTH
    parse_spec(three)
    four = spec(attributes=attributes, queries=[{"name": "g", "attributes": {n: "identity" for n in names},
                                                 "target": 1}])
    assert len(block_id_for(names)) == block_id_length(tuple(names)) > BLOCK_ID_MAX_LENGTH
    assert refused(four).startswith("queries[0].attributes: clique aaaa")
    assert "261 characters, more than 255" in refused(four)
    shorthand = spec(attributes=attributes, queries=[{"name": "g", "marginals": {"order": 4}, "target": 1}])
    assert refused(shorthand).startswith("queries[0].marginals: clique aaaa")


# ------------------------------------------------------------------ sizes


def test_attribute_sizes_are_bounded():
    parse_spec(spec(attributes=[{"name": "age", "size": 4, "ordinal": True}, {"name": "sex", "size": 2},
                                {"name": "unused", "size": ATTRIBUTE_MAX_SIZE}]))
    message = refused(spec(attributes=[{"name": "age", "size": 4, "ordinal": True}, {"name": "sex", "size": 2},
                                       {"name": "unused", "size": ATTRIBUTE_MAX_SIZE + 1}]))
    assert message.startswith(f"attributes[2].size: must be at most {ATTRIBUTE_MAX_SIZE}")
    assert refused(spec(attributes=[{"name": "a", "bins": list(range(ATTRIBUTE_MAX_SIZE + 2))}])).startswith(
        "attributes[0].bins: 1048577 bins, more than 1048576")


def test_an_attribute_a_group_uses_is_bounded_before_its_matrices_are_made(monkeypatch):
    import distfit.spec.queries as queries
    made = []
    monkeypatch.setattr(queries, "identity_queries", lambda n: made.append(n) or np.eye(n))
    big = USED_ATTRIBUTE_MAX_SIZE + 1
    mapping = spec(attributes=[{"name": "big", "size": big}],
                   queries=[{"name": "g", "attributes": {"big": "identity"}, "target": 1}],
                   blocks={"max_cells": MAX_CELLS_LIMIT})
    assert refused(mapping) == (f"queries[0].attributes: attribute big has {big} values; a query group may use "
                                f"attributes of at most {USED_ATTRIBUTE_MAX_SIZE} (docs/spec.md, Ranges)")
    shorthand = dict(mapping, queries=[{"name": "g", "marginals": {"order": 1}, "target": 1}])
    assert refused(shorthand).startswith("queries[0].marginals.over: attribute big has")
    assert made == []  # refused before the 4097 x 4097 identity was made


def test_all_ranges_is_bounded_by_its_entries():
    def all_ranges(n):
        return spec(attributes=[{"name": "a", "size": n, "ordinal": True}],
                    queries=[{"name": "g", "attributes": {"a": "all_ranges"}, "target": 1}])
    parse_spec(all_ranges(64))
    assert refused(all_ranges(400)).startswith("queries[0].attributes.a: all_ranges of a (400 values) is a matrix "
                                               "of 32080000 entries, more than 16777216")


def test_max_cells_is_bounded():
    parse_spec(spec(blocks={"max_cells": MAX_CELLS_LIMIT}))
    assert refused(spec(blocks={"max_cells": MAX_CELLS_LIMIT + 1})) == (
        f"blocks.max_cells: must be at most {MAX_CELLS_LIMIT} (docs/spec.md, Ranges), got {MAX_CELLS_LIMIT + 1}")


def test_the_workload_cells_are_its_cliques_not_the_product_of_its_attributes():
    # 24 attributes of 1024 values: a domain of 2^240 cells, but pairs of them hold 276 * 2^20 cells
    attributes = [{"name": f"a{i}", "size": 1024} for i in range(24)]
    kinds = {f"a{i}": "total" for i in range(24)}  # 1 x 1024 query matrices: nothing large is made
    pairs = spec(attributes=attributes, blocks={"max_cells": 1 << 20},
                 queries=[{"name": "g", "marginals": {"order": 2, "kinds": kinds}, "target": 1}])
    assert 276 * (1 << 20) > WORKLOAD_CELLS_LIMIT
    assert refused(pairs) == (f"queries: the query cliques' marginals hold {276 << 20} cells in all, more than "
                              f"{WORKLOAD_CELLS_LIMIT} (docs/spec.md, Ranges)")
    over = [f"a{i}" for i in range(22)]  # 231 pairs fit
    parse_spec(dict(pairs, queries=[{"name": "g", "marginals": {
        "order": 2, "over": over, "kinds": {a: "total" for a in over}}, "target": 1}]))


def test_an_unused_attribute_is_never_materialised_by_the_planner(tmp_path, monkeypatch):
    """An attribute of 2^20 values that no group uses: the plan and its audit pass, and no
    pseudo-inverse (the planner's per-attribute n x n array) is made for it."""
    mapping = spec(attributes=[{"name": "age", "size": 4, "ordinal": True}, {"name": "sex", "size": 2},
                               {"name": "unused", "size": ATTRIBUTE_MAX_SIZE}])
    loaded = parse_spec(mapping)
    assert loaded.domain.size == 8 * ATTRIBUTE_MAX_SIZE
    widths = []
    pinv = np.linalg.pinv
    monkeypatch.setattr(np.linalg, "pinv", lambda a, *args, **kw: widths.append(np.shape(a)) or pinv(a, *args, **kw))
    run_plan(loaded, tmp_path / "plan.zarr", placement=Placement(serial=True))
    assert (1, 2) in widths and (3, 4) in widths  # the difference matrices of sex and age
    assert max(max(shape) for shape in widths) <= 8  # nothing wider than the used cells
    assert audit_plan(tmp_path / "plan.zarr").ok


# ------------------------------------------------------------------ the corners plan and audit


@pytest.mark.parametrize("target, privacy", [
    (TARGET.low, None),
    (TARGET.high, None),
    (TARGET.low, {"rho": RHO.high}),
    (TARGET.low, {"rho": RHO.low}),
    (TARGET.high, {"rho": RHO.low}),
    (TARGET.high, {"alpha": ALPHA.high}),
    (TARGET.low, {"epsilon": EPSILON.low, "delta": DELTA.low}),
    (TARGET.high, {"epsilon": EPSILON.high, "delta": DELTA.high}),
], ids=lambda value: repr(value))
def test_a_spec_at_the_corners_of_the_ranges_plans_and_audits(tmp_path, target, privacy):
    mapping = spec(queries=[{"name": "pre", "attributes": {"age": "prefix", "sex": "identity"}, "target": target},
                            {"name": "total", "total": True, "target": target}])
    if privacy is not None:
        mapping["privacy"] = privacy
    loaded = parse_spec(mapping)
    plan, _ = run_plan(loaded, tmp_path / "plan.zarr", placement=Placement(serial=True))
    assert np.isfinite(plan.alpha) and plan.alpha > 0
    if privacy is not None:  # the budget is spent exactly
        np.testing.assert_allclose(plan.alpha, loaded.privacy.budget.to_alpha(), rtol=1e-9)
    report = audit_plan(tmp_path / "plan.zarr")
    assert report.ok, report.failures
