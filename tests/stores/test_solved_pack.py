"""The solved pack (plan format version 5): a plan's solved blocks as 13 ragged arrays in
``solved/`` read back block for block as the one-group-per-block layout gives them, covered by
the checksum (arrays and claims) and by the audit, refused in one line when malformed; small
plans keep their layout."""
from __future__ import annotations

import dataclasses
import io
import os
import shutil

import numpy as np
import pytest
import xarray as xr
import zarr

import distfit.plan.job as job
from distfit.audit.plan import audit_plan
from distfit.mathematics.packing import block_arrays
from distfit.plan.composition import stitched_profile
from distfit.plan.residual import block_id_for
from distfit.mathematics.privacy import privacy_account
from distfit.spec.parse import parse_spec
from distfit.stores.checksum import compute_checksum
from distfit.stores.plan import (
    BLOCK_ARRAYS, CERTIFICATE_ARRAYS, SOLVED_PACK_MIN_BLOCKS, SOLVED_VERSION, UNPACKED_VERSION, BlockRecord,
    StoreError, plan_claims, read_plan, verify_checksum,
)
from distfit.stores.plan_writer import PlanWriter
from distfit.stores.solved_pack import RAGGED, TABLES, SolvedBlocks, pack_solved
from distfit.runtime.placement import Placement
from tests.clitools import run
from tests.packed_plans import marginals_spec, packed_plan_parts, select
from tests.reference import SMALL_SPEC

#: Eight solved blocks, each with its own certificate (no merging, no closed forms).
CERTIFIED_SPEC = {
    "name": "solved-pack",
    "attributes": [
        {"name": "x0", "size": 3}, {"name": "x1", "size": 4},
        {"name": "age", "size": 5, "ordinal": True}, {"name": "edu", "size": 3, "ordinal": True},
    ],
    "queries": [
        {"name": "x0x1", "attributes": {"x0": "identity", "x1": "identity"}, "target": 1},
        {"name": "age", "attributes": {"age": "prefix"}, "target": 1},
        {"name": "age_edu", "attributes": {"age": "prefix", "edu": "prefix"}, "target": 2},
        {"name": "edu_x0", "attributes": {"edu": "prefix", "x0": "identity"}, "target": 1.5},
    ],
    "blocks": {"merge": False},
}
#: Six blocks re-optimised by the joint block dual: NaN certificates.
JOINT_SPEC = dict(SMALL_SPEC, name="solved-pack-joint", blocks={"merge": False})


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Each spec planned once and written both ways: ``packed.zarr`` through the solved pack
    (``write_plan`` with the threshold lowered), ``groups.zarr`` one group per block."""
    root = tmp_path_factory.mktemp("solved")
    out = {}
    for name, content in (("certified", CERTIFIED_SPEC), ("joint", JOINT_SPEC)):
        spec = parse_spec(content)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(job, "SOLVED_PACK_MIN_BLOCKS", 2)
            plan, _ = job.run_plan(spec, str(root / f"{name}-packed.zarr"), placement=Placement(serial=True),
                                   log=io.StringIO())
        assert 2 <= len(plan.blocks) < SOLVED_PACK_MIN_BLOCKS
        job.write_plan(spec, plan, str(root / f"{name}-groups.zarr"))
        out[name] = (root / f"{name}-packed.zarr", root / f"{name}-groups.zarr", spec, plan)
    return out


def assert_same_blocks(first, second) -> None:
    """Two plans hold the same blocks: ids, attributes, alpha, bound, solver dict, and every
    array with its dtype, shape and bits."""
    a, b = read_plan(first), read_plan(second)
    assert a.block_ids == b.block_ids and a.explicit_block_ids == b.explicit_block_ids
    for x, y in zip(a.iter_blocks(), b.iter_blocks()):
        assert (x.block_id, x.attributes, x.solver) == (y.block_id, y.attributes, y.solver)
        assert (x.alpha, x.lower_bound) == (y.alpha, y.lower_bound)
        for name in BLOCK_ARRAYS + CERTIFICATE_ARRAYS:
            u, v = getattr(x, name), getattr(y, name)
            assert (u.dtype, u.shape) == (v.dtype, v.shape), (x.block_id, name)
            assert np.array_equal(u, v, equal_nan=True), (x.block_id, name)


def arrays_under(path) -> list[str]:
    return sorted(os.path.relpath(d, path) for d, _, files in os.walk(path) if "zarr.json" in files and
                  '"node_type":"array"' in open(os.path.join(d, "zarr.json")).read().replace(" ", ""))


@pytest.mark.parametrize("name", ["certified", "joint"])
def test_a_solved_pack_reads_back_as_the_block_layout(plans, name):
    packed, groups, _, plan = plans[name]
    assert read_plan(packed).attrs["format_version"] == SOLVED_VERSION == 5
    assert read_plan(groups).attrs["format_version"] == UNPACKED_VERSION  # under the threshold: as before
    assert_same_blocks(packed, groups)
    ids = [block.spec.block_id for block in plan.blocks]
    assert read_plan(packed).explicit_block_ids == tuple(sorted(ids))
    assert arrays_under(packed) == sorted([f"solved/{n}" for n in (*TABLES, *RAGGED)] + ["queries/targets",
                                                                                        "queries/variances"])
    assert not os.listdir(packed / "blocks") or os.listdir(packed / "blocks") == ["zarr.json"]
    assert verify_checksum(packed)[0] and verify_checksum(groups)[0]
    report, reference = audit_plan(str(packed)), audit_plan(str(groups))
    assert report.ok and reference.ok, report.failures


def test_pack_order_and_attribute_order_are_kept(tmp_path):
    """Blocks written in any order read back by id; each block's attributes in its own order."""
    names = ["a", "b", "c"]
    rng = np.random.default_rng(0)
    records = []
    for i, attributes in enumerate([("c", "a"), ("b",), (), ("a", "b", "c")]):
        k, d, m = 2 + i, 3 + i, 1 + i
        records.append(BlockRecord(
            block_id=f"z{9 - i}", attributes=attributes, basis=rng.standard_normal((k, d)),
            recon=rng.standard_normal((m, k)), query_index=np.arange(m) * 2, sigma=np.eye(k) * (i + 1),
            targets=np.ones(m), variances=np.full(m, 0.5), profile=rng.random(d), alpha=1.0 + i, lower_bound=0.5,
            solver={"stage": "dual", "seconds": 0.1 * i}, cell_weights=np.full(d, np.nan), query_weights=np.ones(m) / m))
    tables, ragged = pack_solved(records, names)
    assert tables.attributes.tolist() == [[2, 0, -1], [1, -1, -1], [-1, -1, -1], [0, 1, 2]]
    assert tables.offsets("basis").tolist() == [0, 6, 18, 38, 68]  # k d: 2x3, 3x4, 4x5, 5x6
    path = tmp_path / "plan.zarr"
    with PlanWriter(path, fsync=False) as writer:
        assert writer.write_solved(records, names) == 4
        writer.finish(spec={}, schema={"attributes": names, "sizes": [2, 2, 2]}, queries_targets=np.ones(9),
                      queries_variances=np.ones(9), alpha=4.0, alpha_exact=False, rho=2.0, composition="sequential")
    plan = read_plan(path)
    assert plan.block_ids == ("z6", "z7", "z8", "z9")
    for rec in records:
        got = plan.block(rec.block_id)
        assert got.attributes == rec.attributes and got.solver == rec.solver and got.alpha == rec.alpha
        for name in BLOCK_ARRAYS + CERTIFICATE_ARRAYS:
            assert np.array_equal(getattr(got, name), getattr(rec, name), equal_nan=True), name
    got = plan.block("z7")
    got.sigma[...] = 0  # a caller's copy: the pack read once is not changed
    assert plan.block("z7").sigma[0, 0] == 3.0
    assert plan_claims(plan.attrs, zarr.open_group(str(path), mode="r"))["solved"]["solvers"][1] == {"stage": "dual"}


def copy(plans, tmp_path, name="certified"):
    path = tmp_path / "plan.zarr"
    shutil.copytree(plans[name][0], path)
    return path


def test_a_tampered_sigma_inside_the_pack_fails_the_checksum_and_the_audit(plans, tmp_path, capsys):
    path = copy(plans, tmp_path)
    plan = read_plan(path)
    block_id = plan.block_ids[3]
    b = list(zarr.open_group(str(path / "solved")).attrs["block_ids"]).index(block_id)
    k = zarr.open_array(str(path / "solved" / "shape"))[:, 1]
    start = int((k[:b] ** 2).sum())  # the block's first sigma entry: the blocks before it hold k^2 each
    sigma = zarr.open_array(str(path / "solved" / "sigma"), mode="r+")
    sigma[start] = sigma[start] * 0.5  # less noise on one coordinate than the plan claims
    assert not verify_checksum(path)[0]
    code, out, _ = run(capsys, "audit", str(path))
    assert code == 1 and "checksum" in out and "mismatch" in out and block_id in out
    group = zarr.open_group(str(path), mode="r+")  # re-sealed: only the recomputation can tell
    group.attrs["checksum"] = compute_checksum(group, attrs=plan_claims(dict(group.attrs), group))
    report = audit_plan(str(path))
    assert not report.ok and not any(f.startswith("checksum") for f in report.failures)
    named = [f for f in report.failures if f"blocks/{block_id}" in f]
    assert named and all(block_id in f for f in report.failures if f.startswith("blocks/")), report.failures
    assert any("alpha" in f or "variances" in f for f in named), named


@pytest.mark.parametrize("edit", ["solver", "block_ids", "kind"])
def test_every_claim_of_the_pack_is_covered_by_the_checksum(plans, tmp_path, edit):
    path = copy(plans, tmp_path)
    group = zarr.open_group(str(path / "solved"), mode="r+")
    attrs = dict(group.attrs)
    if edit == "solver":
        attrs["solvers"] = [dict(s) for s in attrs["solvers"]]
        attrs["solvers"][2]["dual_evaluations"] += 1
    elif edit == "block_ids":
        attrs["block_ids"] = [attrs["block_ids"][1], attrs["block_ids"][0], *attrs["block_ids"][2:]]
    else:
        attrs["kind"] = "solved "
    group.attrs.update(attrs)
    if edit == "kind":
        with pytest.raises(StoreError, match="kind"):
            read_plan(path)
    assert not verify_checksum(path)[0]
    seconds = copy(plans, tmp_path / "seconds")  # the solve's time is provenance, not a claim
    group = zarr.open_group(str(seconds / "solved"), mode="r+")
    group.attrs["solvers"] = [dict(s, seconds=123.0) for s in group.attrs["solvers"]]
    assert verify_checksum(seconds)[0]


def _rewrite(path, name, data) -> None:
    group = zarr.open_group(str(path / "solved"), mode="r+")
    old = group[name]
    dims = old.metadata.dimension_names
    del group[name]
    group.create_array(name, shape=data.shape, dtype=data.dtype, dimension_names=dims)[...] = data


@pytest.mark.parametrize("damage, named", [
    (lambda p: _rewrite(p, "basis", zarr.open_array(str(p / "solved/basis"))[:-1]), "solved/basis: "),
    (lambda p: _rewrite(p, "shape", zarr.open_array(str(p / "solved/shape"))[...] + [0, 0, 1]), "solved/basis: "),
    (lambda p: _rewrite(p, "alpha", zarr.open_array(str(p / "solved/alpha"))[1:]), "solved/alpha: "),
    (lambda p: _rewrite(p, "attributes", zarr.open_array(str(p / "solved/attributes"))[...] + 4),
     "solved/attributes: schema position"),
    (lambda p: shutil.rmtree(p / "solved" / "recon"), "missing array solved/recon"),
    (lambda p: zarr.open_group(str(p / "solved"), mode="r+").attrs.update(
        block_ids=["same"] * len(zarr.open_group(str(p / "solved")).attrs["block_ids"])), "solved/block_ids (attrs)"),
    (lambda p: zarr.open_group(str(p / "solved"), mode="r+").attrs.update(solvers=[{}]), "solved/solvers"),
    (lambda p: zarr.open_group(str(p / "blocks"), mode="r+").create_group(
        zarr.open_group(str(p / "solved")).attrs["block_ids"][0]), "stored twice"),
])
def test_a_malformed_pack_is_refused_in_one_line_naming_the_array(plans, tmp_path, damage, named):
    path = copy(plans, tmp_path)
    damage(path)
    with pytest.raises(StoreError) as info:
        read_plan(path)
    message = str(info.value)
    assert named in message and "\n" not in message and str(path) in message, message


def test_tables_that_do_not_fit_are_named():
    good = dict(block_ids=("a", "b"), shape=np.array([[1, 2, 3], [2, 1, 1]]), attributes=np.array([[0], [-1]]),
                alpha=np.ones(2), lower_bound=np.zeros(2), solvers=({}, {}))
    tables = SolvedBlocks(**good)
    assert tables.sizes("sigma").tolist() == [4, 1] and tables.offsets("recon").tolist() == [0, 2, 4]
    with pytest.raises(ValueError, match="recon: 5 entries, but the shape table gives 4"):
        tables.check_length("recon", 5)
    for change, named in ((dict(shape=np.array([[1, 2, 3]])), "shape"),
                          (dict(shape=np.array([[1, 2, -3], [1, 1, 1]])), "shape"),
                          (dict(alpha=np.ones(2, dtype=np.float32)), "alpha"),
                          (dict(attributes=np.array([[-2], [0]])), "attributes"),
                          (dict(solvers=({},)), "solvers"), (dict(block_ids=("a", "a")), "block_ids")):
        with pytest.raises(ValueError, match=named):
            SolvedBlocks(**{**good, **change})


def test_writer_refusals(plans, tmp_path):
    records = list(read_plan(plans["certified"][0]).iter_blocks())
    names = plans["certified"][2].domain.schema()["attributes"]
    with PlanWriter(tmp_path / "a.zarr", fsync=False) as writer:
        writer.write_block(records[0])
        with pytest.raises(ValueError, match="already written"):  # ids unique across the layouts
            writer.write_solved(records, names)
        writer.abort()
    with PlanWriter(tmp_path / "b.zarr", fsync=False) as writer:
        writer.write_solved(records[:2], names)
        with pytest.raises(ValueError, match="one solved pack"):
            writer.write_solved(records[2:], names)
        with pytest.raises(ValueError, match="schema: attributes"):
            writer.finish(spec={}, schema={"attributes": names[::-1], "sizes": [3, 4, 5, 3]}, queries_targets=np.ones(99),
                          queries_variances=np.ones(99), alpha=1.0, alpha_exact=False, rho=0.5, composition="sequential")
    assert not (tmp_path / "b.zarr").exists()
    uncertified = dataclasses.replace(records[0], cell_weights=None, query_weights=None)
    with PlanWriter(tmp_path / "c.zarr", fsync=False) as writer:
        with pytest.raises(ValueError, match=f"blocks/{records[0].block_id}: no certificate"):
            writer.write_solved([uncertified], names)
        with pytest.raises(ValueError, match="not schema attributes"):
            writer.write_solved([records[1]], ["x0"])
        writer.abort()


def test_a_plan_with_a_block_without_certificate_keeps_the_block_layout(plans, tmp_path, monkeypatch):
    _, _, spec, plan = plans["certified"]
    first = plan.blocks[0]
    bare = dataclasses.replace(first, solution=dataclasses.replace(first.solution, cell_weights=None, query_weights=None))
    monkeypatch.setattr(job, "SOLVED_PACK_MIN_BLOCKS", 2)
    job.write_plan(spec, dataclasses.replace(plan, blocks=(bare, *plan.blocks[1:])), str(tmp_path / "plan.zarr"))
    stored = read_plan(tmp_path / "plan.zarr")
    assert stored.attrs["format_version"] == UNPACKED_VERSION and not (tmp_path / "plan.zarr" / "solved").exists()


def test_a_solved_pack_beside_a_closed_form_pack_and_a_block_group(tmp_path):
    """The three ways a plan stores blocks, together: one group, the solved pack, a closed-form
    pack; every block reads back as the closed forms give it, and the plan audits."""
    content = marginals_spec([3, 4, 2, 3], 2, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0])
    spec = parse_spec(content)
    pack, targets, variances = packed_plan_parts(content)
    names, sizes = list(spec.domain.names), list(spec.domain.sizes)
    records = []
    for b in range(4):
        own = tuple(names[i] for i in pack.attributes[b] if i >= 0)
        records.append(BlockRecord(block_id=block_id_for(own), attributes=own, alpha=pack.alpha[b],
                                   lower_bound=pack.lower_bound[b], solver=pack.solver, **block_arrays(pack, sizes, b)))
    path = tmp_path / "plan.zarr"
    profiles = [(tuple(names[i] for i in row if i >= 0), np.full(int(np.prod([sizes[i] for i in row if i >= 0])), a))
                for row, a in zip(pack.attributes.tolist(), pack.alpha.tolist())]
    alpha = float(stitched_profile(spec.domain, profiles).max())
    with PlanWriter(path, fsync=False) as writer:
        writer.write_block(records[0])
        writer.write_solved(records[1:], names)
        writer.write_packed(select(pack, np.arange(4, len(pack))))
        writer.finish(spec=spec.to_dict(), schema=spec.domain.schema(), queries_targets=targets, queries_variances=variances,
                      alpha=alpha, alpha_exact=True, rho=alpha / 2,
                      composition="sequential across blocks, parallel across units",
                      extra_attrs={"account": privacy_account(alpha).to_dict(),
                                   "planner": {"spec_hash": spec.spec_hash, "alpha_sum_bound": float(pack.alpha.sum()),
                                               "variance_scale": float(np.max(variances / targets))}})
    plan = read_plan(path)
    assert plan.attrs["format_version"] == SOLVED_VERSION and len(plan.block_ids) == len(pack)
    assert plan.explicit_block_ids == tuple(sorted(r.block_id for r in records))
    for b, block_id in enumerate([r.block_id for r in records] + list(plan.packed_block_ids(0))):
        block = plan.block(block_id)
        for name, value in block_arrays(pack, sizes, b).items():
            np.testing.assert_array_equal(getattr(block, name), value, err_msg=f"{block_id}/{name}")
    assert verify_checksum(path)[0]
    report = audit_plan(str(path))
    assert report.ok, report.failures


def test_a_solved_pack_opens_in_xarray_with_its_dimension_names(plans):
    packed, _, _, plan = plans["certified"]
    tree = xr.open_datatree(str(packed), engine="zarr", consolidated=False)
    solved = tree["solved"]
    stored = read_plan(packed)
    m = sum(stored.block(b).shape[0] for b in stored.block_ids)
    assert dict(solved.sizes)["solved_block"] == len(plan.blocks) and dict(solved.sizes)["solved_query"] == m
    np.testing.assert_array_equal(solved["alpha"].values, [stored.block(b).alpha for b in solved.attrs["block_ids"]])
