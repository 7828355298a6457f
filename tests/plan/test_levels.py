"""Multi-level specs and the sequential composition of level plans (distfit.plan.levels)."""
from __future__ import annotations

import copy

import numpy as np
import pytest

from distfit.plan.levels import budget_shares, combine_levels
from distfit.plan.planner import decompose, plan_blocks, serial_executor
from distfit.spec.model import SpecError
from distfit.spec.parse import parse_spec

from tests.reference import SMALL_SPEC

LEVELS_SPEC = {
    "name": "census",
    "attributes": SMALL_SPEC["attributes"],
    "levels": [
        {"name": "nation", "queries": [
            {"name": "age", "attributes": {"age": "prefix"}, "target": 1},
            {"name": "age_sex", "attributes": {"age": "identity", "sex": "identity"}, "target": 2}]},
        {"name": "county", "units": {"column": "county"}, "queries": [
            {"name": "sex_edu", "attributes": {"sex": "identity", "edu": "prefix"}, "target": 3},
            {"name": "age", "attributes": {"age": "identity"}, "target": [1, 2, 3, 4, 5, 6]}]},
    ],
    "blocks": {"max_cells": 12},
}


def _lifted_profile(domain, blocks) -> np.ndarray:
    """Independent reference: the full-domain mechanism of all blocks built directly
    (each basis lifted to the full domain by Kronecker products with all-ones rows, Sigma
    block-diagonal), profile = diag(B^T Sigma^-1 B)."""
    rows, inverse_blocks = [], []
    for attributes, basis, sigma in blocks:
        # the block basis acts on its marginal (row-major in domain order): a full-domain cell
        # meets the column of its marginal cell, so broadcasting over the other attributes lifts it
        shape = [domain.size_of(a) if a in attributes else 1 for a in domain.names]
        full = np.broadcast_to(basis.reshape((basis.shape[0],) + tuple(shape)), (basis.shape[0],) + domain.shape)
        rows.append(full.reshape(basis.shape[0], -1))
        inverse_blocks.append(np.linalg.inv(sigma))
    B = np.vstack(rows)
    size = sum(block.shape[0] for block in inverse_blocks)
    inverse = np.zeros((size, size))
    at = 0
    for block in inverse_blocks:
        inverse[at:at + len(block), at:at + len(block)] = block
        at += len(block)
    return np.einsum("ix,ij,jx->x", B, inverse, B)


def _plan_level(spec, name):
    level = spec.level_spec(name)
    blocks, decisions = decompose(level.domain, level.group_triples(), level.blocks.max_cells)
    return plan_blocks(level.domain, blocks, level.targets, serial_executor, 1, decisions, None)


def test_levels_parse_into_single_level_specs():
    spec = parse_spec(LEVELS_SPEC)
    assert spec.multilevel and spec.groups == () and [level.name for level in spec.levels] == ["nation", "county"]
    county = spec.level_spec("county")
    assert county.name == "census-county" and county.units.column == "county"
    assert [g.name for g in county.groups] == ["sex_edu", "age"] and county.privacy.mode == "accuracy"
    assert county.num_queries == 2 * 3 + 6
    again = parse_spec(spec.to_dict())
    assert again.spec_hash == spec.spec_hash and again.multilevel
    with pytest.raises(KeyError):
        spec.level_spec("state")


@pytest.mark.parametrize("edit, fragment", [
    (lambda s: s.update(queries=[]), "queries: a spec with levels has its queries and units in each level"),
    (lambda s: s["levels"].append(copy.deepcopy(s["levels"][0])), "levels[2].name: duplicated level 'nation'"),
    (lambda s: s["levels"][1]["units"].update(column="age"), "levels[1].units.column: 'age' is an attribute's column"),
    (lambda s: s["levels"][0]["queries"][0]["attributes"].update(agee="prefix"), "levels[0].queries[0].attributes"),
    (lambda s: s["levels"][0].update(target=1), "levels[0]: unknown key 'target'"),
    (lambda s: s.update(levels=[]), "levels: expected a non-empty list of levels"),
])
def test_bad_levels(edit, fragment):
    raw = copy.deepcopy(LEVELS_SPEC)
    edit(raw)
    with pytest.raises(SpecError) as error:
        parse_spec(raw)
    assert fragment in str(error.value)


def test_combined_alpha_is_the_whole_mechanism_profile_and_budget_scales_it():
    spec = parse_spec(LEVELS_SPEC)
    domain = spec.domain
    plans = {level.name: _plan_level(spec, level.name) for level in spec.levels}
    levels = [(name, plan.alpha, [(b.spec.attributes, b.profile) for b in plan.blocks])
              for name, plan in plans.items()]
    account = combine_levels(domain, levels)
    reference = _lifted_profile(domain, [(b.spec.attributes, b.solution.basis, b.sigma)
                                         for plan in plans.values() for b in plan.blocks])
    assert account.alpha_exact
    assert account.alpha == pytest.approx(reference.max(), rel=1e-9)
    # sequential composition: at least the largest level, at most their sum
    assert max(account.level_alphas) < account.alpha <= sum(account.level_alphas) + 1e-12
    assert account.rho == pytest.approx(account.alpha / 2)
    bound = combine_levels(domain, levels, exact_limit=1)
    assert not bound.alpha_exact and bound.alpha == pytest.approx(sum(account.level_alphas))

    budget = 0.5 * account.alpha
    shares = budget_shares(account.level_alphas, account.alpha, budget)
    scaled = [(name, share, [(attrs, profile * share / alpha) for attrs, profile in blocks])
              for (name, alpha, blocks), share in zip(levels, shares)]
    assert combine_levels(domain, scaled).alpha == pytest.approx(budget, rel=1e-12)
    with pytest.raises(ValueError, match="budget alpha must be finite and > 0"):
        budget_shares(account.level_alphas, account.alpha, 0.0)


def test_tabulate_a_level_of_a_multilevel_spec(tmp_path, capsys):
    import yaml

    from tests.clitools import run
    from distfit.stores.data import open_data
    from distfit.data.people import write_synthetic_people

    path = tmp_path / "levels.yaml"
    path.write_text(yaml.safe_dump(LEVELS_SPEC))
    people = write_synthetic_people(parse_spec(LEVELS_SPEC), 12, tmp_path / "people", seed=1, fsync=False)
    code, _, err = run(capsys, "tabulate", str(path), "--data", str(people), "--out", str(tmp_path / "a.zarr"), "--serial")
    assert code == 2 and "has levels (nation, county)" in err and "--level NAME" in err
    code, _, err = run(capsys, "tabulate", str(path), "--data", str(people), "--out", str(tmp_path / "a.zarr"),
                       "--serial", "--level", "state")
    assert code == 2 and "--level: no level 'state' (levels: nation, county)" in err
    code, _, err = run(capsys, "tabulate", str(path), "--data", str(people), "--out", str(tmp_path / "a.zarr"),
                       "--serial", "--level", "county")
    assert code == 0, err
    import pandas as pd

    data = open_data(tmp_path / "a.zarr")
    # microdata holds no row for an empty unit, so the tabulation has the units with people
    assert data.units == pd.read_parquet(people)["county"].nunique() <= 12
    assert str(data.unit_ids[0]) == "county-000000"
