"""Packed plan stores (issue 10): a pack round-trips through ``distfit.read_plan`` block for
block, is ten arrays whatever its number of blocks, is covered by the checksum (arrays and the
pack's attrs), makes the plan format version 3 (a plan without packs stays version 2), and a
pack that does not fit the schema or the queries is refused before anything is moved into place;
long runs of equal targets or variances are stored as runs (format version 4), whichever form
the writer is given, and read back per query."""
from __future__ import annotations

import os

import numpy as np
import pytest
import zarr

import distfit.stores.plan as plan_store
from distfit import read_plan
from distfit.mathematics.packing import QueryRuns, block_arrays, marginal_pack
from distfit.stores.plan import (
    PACK_ARRAYS, PACKED_VERSION, RUNS_VERSION, UNPACKED_VERSION, StoreError, verify_checksum,
)
from distfit.stores.plan_writer import PlanWriter
from tests.packed_plans import marginals_spec, packed_plan_parts, write_packed_plan

SPEC = marginals_spec([3, 4, 2, 3], 2, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0])


def files_under(path) -> int:
    return sum(len(names) for _, _, names in os.walk(path))


def test_a_packed_plan_round_trips_block_for_block(tmp_path):
    path = tmp_path / "plan.zarr"
    write_packed_plan(path, SPEC)
    pack, targets, variances = packed_plan_parts(SPEC)
    plan = read_plan(path)
    assert plan.attrs["format_version"] == PACKED_VERSION == 3 and plan.pack_ids == ("p0",)
    (stored,) = plan.packs()
    for name in PACK_ARRAYS:
        np.testing.assert_array_equal(getattr(stored, name), getattr(pack, name))
    assert stored.solver == pack.solver
    np.testing.assert_array_equal(plan.queries_targets, targets)
    np.testing.assert_array_equal(plan.queries_variances, variances)
    assert plan.block_ids == tuple(sorted(plan.packed_block_ids(0))) and len(plan.block_ids) == 11
    sizes = plan.attrs["schema"]["sizes"]
    for b, block_id in enumerate(plan.packed_block_ids(0)):
        block = plan.block(block_id)
        expected = block_arrays(pack, sizes, b)
        for name, value in expected.items():
            np.testing.assert_array_equal(getattr(block, name), value, err_msg=f"{block_id}/{name}")
        assert block.attributes == tuple(f"x{i}" for i in pack.attributes[b] if i >= 0)
        assert (block.alpha, block.lower_bound) == (pack.alpha[b], pack.lower_bound[b])
    assert [b.block_id for b in plan.iter_blocks()] == list(plan.block_ids)
    assert verify_checksum(path)[0]


def test_a_pack_is_a_few_files_and_a_plan_without_packs_keeps_version_2(tmp_path):
    write_packed_plan(tmp_path / "packed.zarr", SPEC)
    write_packed_plan(tmp_path / "groups.zarr", SPEC, explicit=11)
    packed, groups = files_under(tmp_path / "packed.zarr"), files_under(tmp_path / "groups.zarr")
    assert packed == 2 * len(PACK_ARRAYS) + 9 < groups  # ten arrays (metadata + one chunk each), groups, queries
    assert read_plan(tmp_path / "groups.zarr").attrs["format_version"] == UNPACKED_VERSION == 2
    big = marginals_spec([2, 3] * 20, 2)  # 821 blocks: still the same files
    write_packed_plan(tmp_path / "big.zarr", big)
    assert files_under(tmp_path / "big.zarr") == packed


@pytest.mark.parametrize("array", ["scale", "segment_query"])
def test_the_checksum_covers_the_packs_arrays_and_attrs(tmp_path, array):
    path = tmp_path / "plan.zarr"
    write_packed_plan(path, SPEC)
    arr = zarr.open_array(str(path / "packs/p0" / array), mode="r+")
    arr[0] = arr[0] + 1
    assert not verify_checksum(path)[0]
    arr[0] = arr[0] - 1
    assert verify_checksum(path)[0]
    group = zarr.open_group(str(path / "packs/p0"), mode="r+")
    group.attrs["solver"] = {"method": "other"}
    assert not verify_checksum(path)[0]


def test_a_pack_that_does_not_fit_the_schema_or_the_queries_is_refused(tmp_path):
    pack, targets, variances = packed_plan_parts(SPEC)
    schema = {"attributes": ["x0", "x1", "x2", "x3"], "sizes": [3, 4, 2, 3]}
    common = dict(spec=SPEC, queries_targets=targets, queries_variances=variances, alpha=1.0, alpha_exact=True,
                  rho=0.5, composition="sequential")
    cases = [
        ({"attributes": ["x0", "x1", "x2"], "sizes": [3, 4, 2]}, targets, "schema position 3"),
        ({**schema, "sizes": [3, 4, 1, 3]}, targets, "size 1"),
        (schema, targets[:-1], "refers to query"),
    ]
    for case_schema, case_targets, message in cases:
        path = tmp_path / "plan.zarr"
        with pytest.raises(ValueError, match=message):
            with PlanWriter(path) as writer:
                writer.write_packed(pack)
                writer.finish(**{**common, "schema": case_schema, "queries_targets": case_targets,
                                 "queries_variances": case_targets})
        assert not path.exists() and not list(tmp_path.iterdir())
    with pytest.raises(ValueError, match="written twice"):
        with PlanWriter(tmp_path / "plan.zarr") as writer:
            writer.write_packed(pack)
            writer.write_packed(marginal_pack([3, 4, 2, 3], [(0, 1)], 1.0)[0])
            writer.finish(**common, schema=schema)
    with pytest.raises(TypeError, match="PackedBlocks"):
        with PlanWriter(tmp_path / "plan.zarr") as writer:
            writer.write_packed({"attributes": []})


@pytest.fixture
def runs_from_one_query(monkeypatch):
    """Store long runs as runs from one query on (the default keeps plans under 65,536 queries
    per query, so their bytes and checksums are as before)."""
    monkeypatch.setattr(plan_store, "RUN_LENGTH_MIN_QUERIES", 1)


def test_long_runs_are_stored_as_runs_and_read_back_per_query(tmp_path, runs_from_one_query):
    path = tmp_path / "plan.zarr"
    write_packed_plan(path, SPEC)
    _, targets, variances = packed_plan_parts(SPEC)
    plan = read_plan(path)
    assert plan.attrs["format_version"] == RUNS_VERSION == 4 and verify_checksum(path)[0]
    queries = zarr.open_group(str(path / "queries"), mode="r")
    assert sorted(queries.array_keys()) == ["target_offsets", "target_values", "variance_offsets", "variance_values"]
    assert queries["target_values"].shape == (6,) and queries["target_offsets"][-1] == targets.size == 53
    np.testing.assert_array_equal(plan.queries_targets, targets)
    np.testing.assert_array_equal(plan.queries_variances, variances)
    np.testing.assert_array_equal(plan.variance_runs.expand(), variances)
    arr = zarr.open_array(str(path / "queries/variance_values"), mode="r+")
    arr[0] = arr[0] * 1.01  # every claim is covered: the run arrays too
    assert not verify_checksum(path)[0]
    arr = zarr.open_array(str(path / "queries/target_offsets"), mode="r+")
    arr[1] = arr[2]
    with pytest.raises(StoreError, match="queries/target_offsets"):
        read_plan(path)


def test_the_store_follows_the_vector_not_the_form_it_was_given_in(tmp_path, runs_from_one_query):
    _, targets, variances = packed_plan_parts(SPEC)
    common = dict(spec=SPEC, schema={"attributes": ["x0", "x1", "x2", "x3"], "sizes": [3, 4, 2, 3]}, alpha=1.0,
                  alpha_exact=True, rho=0.5, composition="sequential")
    scattered = np.arange(targets.size, dtype=float)  # one run per query: stored per query
    checksums = []
    for name, given in (("arrays", lambda v: v), ("runs", QueryRuns.encode)):
        with PlanWriter(tmp_path / f"{name}.zarr") as writer:
            checksums.append(writer.finish(**common, queries_targets=given(targets), queries_variances=given(scattered)))
        plan = read_plan(tmp_path / f"{name}.zarr")
        assert plan.attrs["format_version"] == 4 and "variances" in zarr.open_group(str(tmp_path / f"{name}.zarr/queries"))
        np.testing.assert_array_equal(plan.queries_variances, scattered)
    assert checksums[0] == checksums[1]
