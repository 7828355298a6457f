"""Plan stores (docs/design.md section 4): layout, round trip, checksum, atomic writes, refusals."""
from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import zarr

import distfit.stores.checksum as checksums
import distfit.stores.files as files
from distfit.stores.checksum import compute_checksum
from distfit.stores.files import chunk_shape, jsonable
from distfit.stores.plan import (
    BLOCK_ARRAYS,
    CERTIFICATE_ARRAYS,
    FORMAT_VERSION,
    UNPACKED_VERSION,
    BlockRecord,
    StoreError,
    checksum_covers_attrs,
    plan_claims,
    read_plan,
    verify_checksum,
)
from distfit.stores.plan_writer import PlanWriter

SCHEMA = {"attributes": ["age", "sex", "race"], "sizes": [3, 2, 4]}
SPEC = {"name": "toy", "groups": [{"clique": ["age", "sex"], "target": 1.0}]}
M = 10  # workload queries


def make_block(block_id: str, attributes, k: int, d_b: int, m_b: int, seed: int, certificate: bool = True) -> BlockRecord:
    """A block with random arrays; ``certificate``: with dual weights (as every plan written
    since they are kept), else without (as a plan written before)."""
    rng = np.random.default_rng(seed)
    basis = rng.standard_normal((k, d_b))
    recon = rng.standard_normal((m_b, k))
    a = rng.standard_normal((k, k))
    sigma = a @ a.T + k * np.eye(k)
    profile = np.einsum("ij,ij->j", basis, np.linalg.solve(sigma, basis))
    profile[0] = -0.0  # signed zero must survive bit for bit
    return BlockRecord(
        block_id=block_id,
        attributes=tuple(attributes),
        basis=basis,
        recon=recon,
        query_index=rng.choice(M, size=m_b, replace=False),
        sigma=sigma,
        targets=rng.uniform(0.5, 2.0, m_b),
        variances=np.einsum("ij,jk,ik->i", recon, sigma, recon),
        profile=profile,
        alpha=np.float64(profile.max()),  # numpy scalars must be stored as plain JSON
        lower_bound=float(profile.max()) * 0.999,
        solver={"dual_evaluations": np.int64(12), "stage": "dual", "final_t": 1e3},
        cell_weights=rng.dirichlet(np.ones(d_b)) if certificate else None,
        query_weights=rng.dirichlet(np.ones(m_b)) if certificate else None,
    )


def blocks3() -> list[BlockRecord]:
    return [
        make_block("age.sex", ["age", "sex"], k=5, d_b=6, m_b=4, seed=1),
        make_block("race", ["race"], k=3, d_b=4, m_b=3, seed=2),
        make_block("empty_", [], k=1, d_b=1, m_b=2, seed=3, certificate=False),  # as written before certificates
    ]


def finish_kwargs(seed: int = 0, **over):
    rng = np.random.default_rng(100 + seed)
    kw = dict(
        spec=SPEC,
        schema=SCHEMA,
        queries_targets=rng.uniform(0.5, 2.0, M),
        queries_variances=rng.uniform(0.1, 0.5, M),
        alpha=np.float64(4.9253),
        alpha_exact=True,
        rho=4.9253 / 2,
        composition="sequential",
        extra_attrs={"account": {"rho": 2.46, "epsilon_delta": [(1e-6, 3.1)]},
                     "planner": {"decisions": ["split residual blocks"], "seconds": np.float32(0.5)}},
    )
    kw.update(over)
    return kw


def write_plan(path, blocks=None, seed: int = 0, fsync: bool = False, **kw) -> tuple[str, dict]:
    fk = finish_kwargs(seed)
    with PlanWriter(path, fsync=fsync, **kw) as w:
        for rec in blocks if blocks is not None else blocks3():
            w.write_block(rec)
        checksum = w.finish(**fk)
    return checksum, fk


@pytest.fixture(scope="module")
def template(tmp_path_factory):
    """One 3-block plan written once; ``plan_copy`` hands each test its own copy."""
    path = tmp_path_factory.mktemp("template") / "plan.zarr"
    checksum, _ = write_plan(path)
    return path, checksum


@pytest.fixture
def plan_copy(template, tmp_path):
    src, checksum = template
    dst = tmp_path / "plan.zarr"
    shutil.copytree(src, dst)
    return dst, checksum


def siblings(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


def tree_snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


def set_root_attr(path: Path, key, value=None, delete=False) -> None:
    meta = path / "zarr.json"
    doc = json.loads(meta.read_text())
    if delete:
        doc["attributes"].pop(key)
    else:
        doc["attributes"][key] = value
    meta.write_text(json.dumps(doc))


# ---------------------------------------------------------------------------- round trip


def test_round_trip_three_blocks(tmp_path):
    path = tmp_path / "plan.zarr"
    blocks = blocks3()
    checksum, fk = write_plan(path, blocks, fsync=True)
    assert siblings(path) == ["plan.zarr"]  # no staging or set-aside directory left

    plan = read_plan(path)
    assert plan.block_ids == tuple(sorted(b.block_id for b in blocks))
    a = plan.attrs
    assert a["distfit_format"] == "plan"
    assert a["format_version"] == UNPACKED_VERSION
    assert a["complete"] is True
    assert a["checksum"] == checksum == plan.checksum
    assert checksum.startswith("sha256:") and len(checksum) == 7 + 64
    assert a["spec"] == SPEC
    assert a["schema"] == SCHEMA
    assert a["alpha"] == 4.9253 and type(a["alpha"]) is float
    assert a["alpha_exact"] is True
    assert a["rho"] == 4.9253 / 2
    assert a["composition"] == "sequential"
    assert a["created"].endswith("Z") and "T" in a["created"]
    assert isinstance(a["distfit_version"], str)
    assert a["account"] == {"rho": 2.46, "epsilon_delta": [[1e-6, 3.1]]}
    assert a["planner"] == {"decisions": ["split residual blocks"], "seconds": 0.5}
    np.testing.assert_array_equal(plan.queries_targets, fk["queries_targets"])
    np.testing.assert_array_equal(plan.queries_variances, fk["queries_variances"])

    by_id = {b.block_id: b for b in blocks}
    seen = []
    for rec in plan.iter_blocks():
        seen.append(rec.block_id)
        orig = by_id[rec.block_id]
        for name in BLOCK_ARRAYS + CERTIFICATE_ARRAYS:
            got, want = getattr(rec, name), getattr(orig, name)
            if want is None:  # a block without a certificate reads back without one
                assert got is None and rec.block_id == "empty_", name
                continue
            assert got.dtype == (np.int64 if name == "query_index" else np.float64), name
            assert got.shape == want.shape, name
            assert got.tobytes() == want.tobytes(), name  # bit for bit (incl. -0.0)
        assert rec.attributes == orig.attributes
        assert rec.alpha == orig.alpha and rec.lower_bound == orig.lower_bound
        assert rec.solver == {"dual_evaluations": 12, "stage": "dual", "final_t": 1e3}
    assert seen == list(plan.block_ids)
    with pytest.raises(KeyError):
        plan.block("nope")

    # the on-disk layout is the contract
    g = zarr.open_group(str(path), mode="r")
    assert g["queries/targets"].shape == (M,)
    b = g["blocks/age.sex"]
    assert b["basis"].shape == (5, 6) and b["recon"].shape == (4, 5) and b["sigma"].shape == (5, 5)
    assert b["query_index"].dtype == np.int64 and b["profile"].shape == (6,)
    assert b["cell_weights"].shape == (6,) and b["query_weights"].shape == (4,)
    assert b["cell_weights"].metadata.dimension_names == ("cell",)
    assert b["query_weights"].metadata.dimension_names == ("block_query",)
    assert "cell_weights" not in g["blocks/empty_"]  # no certificate: no arrays
    assert dict(b.attrs)["attributes"] == ["age", "sex"]

    ok, stored, recomputed = verify_checksum(path)
    assert ok and stored == recomputed == checksum


def test_checksum_detects_one_changed_byte(plan_copy, tmp_path):
    path, checksum = plan_copy
    assert verify_checksum(path)[0]
    arr = zarr.open_group(str(path), mode="r+")["blocks/race/sigma"]
    data = arr[...]
    data.reshape(-1).view(np.uint8)[3] ^= 1  # flip one bit of one float
    arr[...] = data
    ok, stored, recomputed = verify_checksum(path)
    assert not ok and stored == checksum and recomputed != checksum
    # read_plan does not recompute the checksum (it would read every array)
    assert read_plan(path).checksum == checksum


def test_checksum_is_deterministic_and_covers_paths(template, tmp_path):
    p1, c1 = template
    c2, _ = write_plan(tmp_path / "b.zarr")  # same arrays, another time and place: same checksum
    assert c1 == c2
    renamed = blocks3()
    r = renamed[1]
    renamed[1] = BlockRecord(**{**r.__dict__, "block_id": "race2"})
    c3, _ = write_plan(tmp_path / "c.zarr", renamed)
    assert c3 != c1  # the same bytes under another path change the checksum
    group = zarr.open_group(str(p1), mode="r")
    assert compute_checksum(group, attrs=plan_claims(dict(group.attrs), group)) == c1
    assert compute_checksum(group) != c1  # the version-1 rule (arrays only) is not a version-2 plan's


# ---------------------------------------------------------------------------- what the checksum covers

#: Every claim a plan states, as (node, dotted attr path, a changed value): the version-2
#: checksum must change when any of them does (issue 12).
CLAIMS = [
    ("", "alpha", 4.0), ("", "alpha_exact", False), ("", "rho", 2.0), ("", "composition", "parallel"),
    ("", "spec.name", "other"), ("", "schema.sizes", [3, 2, 5]), ("", "account.rho", 0.1),
    ("", "account.epsilon_delta", [[1e-6, 0.31]]), ("", "planner.decisions", []),
    ("", "format_version", 1), ("", "distfit_format", "plan2"),
    ("blocks/race", "alpha", 9.0), ("blocks/race", "lower_bound", 0.5), ("blocks/race", "attributes", ["age"]),
    ("blocks/race", "solver.stage", "smii"), ("blocks/race", "solver.final_t", 1.0),
]
#: Provenance the checksum leaves out, so that two writes of one plan hash alike.
PROVENANCE = [("", "created", "1999-01-01T00:00:00Z"), ("", "distfit_version", "0.0.0"),
              ("", "planner.seconds", 99.0), ("blocks/race", "solver.seconds", 99.0)]


def _set(path: Path, node: str, key: str, value) -> None:
    group = zarr.open_group(str(path), mode="r+")
    target = group[node] if node else group
    attrs = json.loads(json.dumps(dict(target.attrs)))
    where = attrs
    *parents, last = key.split(".")
    for part in parents:
        where = where.setdefault(part, {})
    where[last] = value
    target.attrs.update(attrs)


@pytest.mark.parametrize("node, key, value", CLAIMS, ids=[f"{n or 'root'}:{k}" for n, k, _ in CLAIMS])
def test_the_checksum_covers_every_claim(plan_copy, node, key, value):
    path, checksum = plan_copy
    _set(path, node, key, value)
    if key == "format_version":  # read as a version-1 plan: the arrays-only rule gives another digest
        assert verify_checksum(path) == (False, checksum, compute_checksum(zarr.open_group(str(path), mode="r")))
        return
    if key == "distfit_format":
        with pytest.raises(StoreError, match="not 'plan'"):
            verify_checksum(path)
        return
    ok, stored, recomputed = verify_checksum(path)
    assert not ok and stored == checksum and recomputed != checksum


@pytest.mark.parametrize("node, key, value", PROVENANCE, ids=[f"{n or 'root'}:{k}" for n, k, _ in PROVENANCE])
def test_the_checksum_leaves_out_provenance(plan_copy, node, key, value):
    path, checksum = plan_copy
    _set(path, node, key, value)
    assert verify_checksum(path) == (True, checksum, checksum)


def test_plan_claims_are_what_a_reader_sees(plan_copy):
    """The writer hashes the claims it is about to store; they must be, byte for byte (canonical
    JSON), what plan_claims reads back: tuples become lists, numpy scalars plain numbers."""
    path, checksum = plan_copy
    group = zarr.open_group(str(path), mode="r")
    claims = plan_claims(dict(group.attrs), group)
    assert sorted(claims) == ["", "blocks/age.sex", "blocks/empty_", "blocks/race"]
    assert set(claims[""]) == {"distfit_format", "format_version", "spec", "schema", "alpha", "alpha_exact", "rho",
                               "composition", "account", "planner"}
    assert claims[""]["planner"] == {"decisions": ["split residual blocks"]}  # its seconds are provenance
    assert claims["blocks/race"]["solver"] == {"dual_evaluations": 12, "stage": "dual", "final_t": 1e3}
    assert compute_checksum(group, attrs=claims) == checksum


def test_a_version_1_plan_is_read_and_verified_by_its_own_rule(tmp_path):
    """A plan written before issue 12 (tests/stores/plan_v1.zip: the issue's merged 2 x 3 x 4
    plan, written by distfit at commit 73383e7) keeps its checksum: arrays only."""
    with zipfile.ZipFile(Path(__file__).parent / "plan_v1.zip") as archive:
        archive.extractall(tmp_path)
    path = tmp_path / "plan.zarr"
    plan = read_plan(path)
    v1 = "sha256:f00e2d65d9a11aaa3e910671bff0505b73c161558beece90cd2a8de763b36dab"
    assert plan.attrs["format_version"] == 1 and not checksum_covers_attrs(plan.attrs)
    assert verify_checksum(path) == (True, v1, v1)
    _set(path, "", "alpha", 1.0)  # not covered by a version-1 checksum (the audit recomputes it)
    assert verify_checksum(path) == (True, v1, v1)
    arr = zarr.open_array(str(path / "blocks/r-a.b.c/sigma"), mode="r+")
    arr[0, 0] = arr[0, 0] * 2
    assert not verify_checksum(path)[0]


# ---------------------------------------------------------------------------- refusals


def test_existing_plan_is_not_replaced_without_overwrite(plan_copy, tmp_path):
    path, checksum = plan_copy
    before = tree_snapshot(path)
    with pytest.raises(FileExistsError, match="already holds a plan; pass overwrite=True"):
        PlanWriter(path)
    assert tree_snapshot(path) == before
    assert siblings(path) == ["plan.zarr"]
    assert verify_checksum(path) == (True, checksum, checksum)


def test_overwrite_never_replaces_a_non_plan(tmp_path):
    path = tmp_path / "results"
    path.mkdir()
    (path / "precious.txt").write_text("keep me")
    with pytest.raises(FileExistsError, match="not a distfit plan store"):
        PlanWriter(path, overwrite=True)
    assert (path / "precious.txt").read_text() == "keep me"
    assert siblings(path) == ["results"]


def test_reading_a_staging_directory_is_refused(tmp_path):
    path = tmp_path / "plan.zarr"
    w = PlanWriter(path)
    for rec in blocks3():
        w.write_block(rec)
    with pytest.raises(StoreError, match="staging directory"):
        read_plan(w.staging_path)
    with pytest.raises(StoreError, match="no such plan store .*interrupted write left"):
        read_plan(path)
    w.abort()
    assert siblings(path) == []


def test_staging_with_complete_flag_is_still_refused(plan_copy, tmp_path):
    # even a staging dir whose attrs look complete (killed between attrs and rename) is refused
    path, _ = plan_copy
    staged = tmp_path / "plan.zarr.incomplete-deadbeef"
    os.rename(path, staged)
    with pytest.raises(StoreError, match="staging directory"):
        read_plan(staged)
    with pytest.raises(StoreError, match="staging directory"):
        verify_checksum(staged)


def test_missing_complete_checksum_format_version(plan_copy, tmp_path):
    path, _ = plan_copy
    set_root_attr(path, "complete", delete=True)
    with pytest.raises(StoreError, match="not marked complete"):
        read_plan(path)
    set_root_attr(path, "complete", False)
    with pytest.raises(StoreError, match="not marked complete"):
        read_plan(path)
    set_root_attr(path, "complete", True)
    read_plan(path)

    set_root_attr(path, "checksum", delete=True)
    with pytest.raises(StoreError, match="no checksum"):
        read_plan(path)
    set_root_attr(path, "checksum", "sha256:00")

    set_root_attr(path, "format_version", FORMAT_VERSION + 1)
    with pytest.raises(StoreError, match="newer than this distfit supports"):
        read_plan(path)
    set_root_attr(path, "format_version", FORMAT_VERSION)
    read_plan(path)


def test_wrong_format_and_missing_path_are_refused(tmp_path):
    path = tmp_path / "release.zarr"
    write_plan(path)
    set_root_attr(path, "distfit_format", "release")
    with pytest.raises(StoreError, match="distfit_format is 'release', not 'plan'") as info:
        read_plan(path)
    msg = str(info.value)
    assert str(path) in msg and "\n" not in msg
    assert isinstance(info.value, ValueError)

    with pytest.raises(StoreError, match="no such plan store"):
        read_plan(tmp_path / "nothing.zarr")
    other = tmp_path / "other"
    other.mkdir()
    with pytest.raises(StoreError, match="not a Zarr v3 group"):
        read_plan(other)
    plain = zarr.open_group(str(tmp_path / "plain.zarr"), mode="w", zarr_format=3)
    plain.attrs["x"] = 1
    with pytest.raises(StoreError, match="distfit_format is None"):
        read_plan(tmp_path / "plain.zarr")


# ---------------------------------------------------------------------------- atomicity


def test_exception_inside_with_leaves_nothing(tmp_path):
    path = tmp_path / "plan.zarr"
    with pytest.raises(RuntimeError, match="boom"):
        with PlanWriter(path) as w:
            w.write_block(blocks3()[0])
            assert w.staging_path.is_dir()
            raise RuntimeError("boom")
    assert not path.exists()
    assert siblings(path) == []


def test_leaving_with_without_finish_writes_nothing(tmp_path):
    path = tmp_path / "plan.zarr"
    with pytest.raises(RuntimeError, match="without finish"):
        with PlanWriter(path) as w:
            w.write_block(blocks3()[0])
    assert siblings(path) == []


def test_failed_finish_cleans_up_and_keeps_old_plan(plan_copy, tmp_path):
    path, old = plan_copy
    with pytest.raises(ValueError, match="reserved"):
        with PlanWriter(path, overwrite=True) as w:
            w.write_block(blocks3()[0])
            w.finish(**finish_kwargs(extra_attrs={"checksum": "mine"}))
    assert siblings(path) == ["plan.zarr"]
    assert verify_checksum(path) == (True, old, old)


def test_overwrite_replaces_only_when_new_plan_is_complete(plan_copy, tmp_path):
    path, old = plan_copy
    new_blocks = [make_block("solo", ["age"], k=2, d_b=3, m_b=2, seed=9)]
    fk = finish_kwargs(seed=1)
    with PlanWriter(path, overwrite=True, fsync=True) as w:
        w.write_block(new_blocks[0])
        # mid-write, the old plan is still there and intact
        plan = read_plan(path)
        assert plan.checksum == old and len(plan.block_ids) == 3
        assert verify_checksum(path)[0]
        new = w.finish(**fk)
    assert new != old
    plan = read_plan(path)
    assert plan.block_ids == ("solo",) and plan.checksum == new
    np.testing.assert_array_equal(plan.queries_targets, fk["queries_targets"])
    assert siblings(path) == ["plan.zarr"]  # old plan deleted, no staging left


def _killed_writer(path: str) -> None:
    w = PlanWriter(path)
    for rec in blocks3()[:2]:
        w.write_block(rec)
    os._exit(1)  # killed before finish: no cleanup runs


def test_killed_writer_leaves_no_readable_plan(tmp_path):
    path = tmp_path / "plan.zarr"
    ctx = multiprocessing.get_context("spawn")  # zarr runs an event-loop thread: never fork
    proc = ctx.Process(target=_killed_writer, args=(str(path),))
    proc.start()
    proc.join(60)
    assert proc.exitcode == 1
    assert not path.exists()
    left = [p for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].name.startswith("plan.zarr.incomplete-")
    assert (left[0] / "blocks" / "age.sex" / "sigma").is_dir()  # it did write blocks
    with pytest.raises(StoreError, match="interrupted write left plan.zarr.incomplete-"):
        read_plan(path)
    with pytest.raises(StoreError, match="staging directory"):
        read_plan(left[0])
    # a fresh writer is not blocked by the debris
    w = PlanWriter(path)
    w.abort()


# ---------------------------------------------------------------------------- validation


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "..", ".", "a b", "é", "__meta", "x\n"])
def test_unsafe_block_ids_are_refused(bad):
    rec = make_block("ok", ["age"], k=2, d_b=3, m_b=2, seed=0)
    with pytest.raises(ValueError, match="block_id"):
        BlockRecord(**{**rec.__dict__, "block_id": bad})


@pytest.mark.parametrize("good", ["a", "age.sex", "S-0_1", "...x"])
def test_safe_block_ids(good):
    rec = make_block("ok", ["age"], k=2, d_b=3, m_b=2, seed=0)
    assert BlockRecord(**{**rec.__dict__, "block_id": good}).block_id == good


@pytest.mark.parametrize("value_field, value, named", [
    ("basis", np.zeros((2, 4)), "profile"),     # d_b changes: the profile no longer matches
    ("basis", np.zeros(3), "basis"),
    ("recon", np.zeros((2, 3)), "recon"),
    ("sigma", np.zeros((3, 3)), "sigma"),
    ("query_index", np.array([0, 1, 2]), "query_index"),
    ("query_index", np.array([0.0, 1.0]), "query_index"),
    ("query_index", np.array([-1, 0]), "query_index"),
    ("targets", np.zeros(3), "targets"),
    ("variances", np.zeros((2, 1)), "variances"),
    ("profile", np.zeros(2), "profile"),
    ("attributes", "age", "attributes"),
    ("solver", [1, 2], "solver"),
    ("cell_weights", np.full(2, 0.5), "cell_weights"),  # d_b is 3
    ("query_weights", np.ones((2, 1)), "query_weights"),
    ("query_weights", None, "cell_weights/query_weights"),  # the certificate is both or neither
])
def test_inconsistent_fields_are_named(value_field, value, named):
    rec = make_block("ok", ["age"], k=2, d_b=3, m_b=2, seed=0)
    with pytest.raises(ValueError, match=f"^{named}: "):
        BlockRecord(**{**rec.__dict__, value_field: value})


def test_plan_without_queries_is_refused(plan_copy):
    path, _ = plan_copy
    shutil.rmtree(path / "queries" / "variances")
    with pytest.raises(StoreError, match="missing array queries/variances"):
        read_plan(path)


def test_a_block_with_half_a_certificate_is_refused(plan_copy):
    """The weight arrays are optional together (a plan written before they were kept has
    neither), not one at a time; the other block arrays are never optional."""
    path, _ = plan_copy
    shutil.rmtree(path / "blocks" / "race" / "query_weights")
    plan = read_plan(path)
    with pytest.raises(StoreError, match=r"blocks/race: cell_weights/query_weights: give both"):
        plan.block("race")
    assert plan.block("empty_").cell_weights is None  # neither: read as a block without a certificate
    shutil.rmtree(path / "blocks" / "empty_" / "profile")
    with pytest.raises(StoreError, match="blocks/empty_: missing array profile"):
        plan.block("empty_")


def test_bad_schema_is_refused(tmp_path):
    path = tmp_path / "plan.zarr"
    with pytest.raises(ValueError, match="schema"):
        with PlanWriter(path, fsync=False) as w:
            w.finish(**finish_kwargs(schema={"attributes": ["a", "b"], "sizes": [2]}))
    assert siblings(path) == []


def test_writer_refuses_duplicates_and_out_of_range_queries(tmp_path):
    path = tmp_path / "plan.zarr"
    with PlanWriter(path) as w:
        rec = blocks3()[0]
        w.write_block(rec)
        with pytest.raises(ValueError, match="already written"):
            w.write_block(rec)
        with pytest.raises(ValueError, match="refers to query"):
            w.finish(**finish_kwargs(queries_targets=np.ones(2), queries_variances=np.ones(2)))
    assert siblings(path) == []


def test_chunk_shape():
    assert chunk_shape((5, 6), 8) == (5, 6)
    assert chunk_shape((0,), 8) == (1,)
    assert chunk_shape((), 8) == ()
    assert chunk_shape((100, 10), 8, cap=800) == (10, 10)
    assert chunk_shape((100, 1000), 8, cap=800) == (1, 100)
    assert chunk_shape((4096, 4096), 8) == (512, 4096)  # 16 MiB slabs


def test_large_array_is_chunked_and_checksummed(tmp_path, monkeypatch):
    monkeypatch.setattr(files, "CHUNK_BYTES", 1024)  # chunk_shape reads it at call time
    monkeypatch.setattr(checksums, "READ_BYTES", 2048)
    k, d = 40, 50
    rng = np.random.default_rng(5)
    basis = rng.standard_normal((k, d))
    rec = BlockRecord(block_id="big", attributes=("age",), basis=basis, recon=np.eye(k),
                      query_index=np.arange(k), sigma=np.eye(k), targets=np.ones(k),
                      variances=np.ones(k), profile=rng.random(d), alpha=1.0, lower_bound=1.0,
                      solver={})
    path = tmp_path / "plan.zarr"
    fk = finish_kwargs(queries_targets=np.ones(k), queries_variances=np.ones(k))
    with PlanWriter(path) as w:
        w.write_block(rec)
        checksum = w.finish(**fk)
    g = zarr.open_group(str(path), mode="r")
    assert g["blocks/big/basis"].chunks == (2, 50)
    assert verify_checksum(path) == (True, checksum, checksum)
    assert read_plan(path).block("big").basis.tobytes() == basis.tobytes()


def test_jsonable():
    @dataclass
    class Stats:
        n: int
        t: float

    class Account:
        def to_dict(self):
            return {"rho": np.float64(0.5)}

    out = jsonable({"a": np.int32(3), "b": np.arange(3), "c": (1, 2.5), "d": Stats(1, 2.0),
                     "e": Account(), "f": [np.bool_(True)], "g": None, np.str_("h"): "x"})
    assert out == {"a": 3, "b": [0, 1, 2], "c": [1, 2.5], "d": {"n": 1, "t": 2.0},
                   "e": {"rho": 0.5}, "f": [True], "g": None, "h": "x"}
    json.dumps(out)
    assert type(out["a"]) is int and type(out["f"][0]) is bool
    with pytest.raises(TypeError, match=r"attrs\['x'\]"):
        jsonable({"x": {1, 2}})
    with pytest.raises(TypeError, match="string keys"):
        jsonable({1: 2})


# ---------------------------------------------------------------------------- scratch and drafts (streamed planning)


def _unscaled(rec: BlockRecord, scale: float) -> BlockRecord:
    """The draft a streamed planner writes: the block before its final scale."""
    return BlockRecord(block_id=rec.block_id, attributes=rec.attributes, basis=rec.basis, recon=rec.recon,
                       query_index=rec.query_index, sigma=rec.sigma / scale, targets=rec.targets,
                       variances=rec.variances / scale, profile=rec.profile * scale, alpha=rec.alpha * scale,
                       lower_bound=rec.lower_bound * scale, solver=rec.solver,
                       cell_weights=rec.cell_weights, query_weights=rec.query_weights)  # scale-free


def test_promoted_drafts_make_the_same_store_as_write_block(template, tmp_path):
    """Drafts promoted and rescaled in place give the very store (same files, same checksum)
    that write_block gives; scratch space (spilled arrays, a discarded round) is gone."""
    src, checksum = template
    path = tmp_path / "plan.zarr"
    scale = 4.0  # a power of two: unscaling and rescaling are exact
    with PlanWriter(path, fsync=False) as w:
        w.write_scratch("specs/race", {"basis": np.ones((3, 4))}, {"note": np.int64(1)})
        arrays, attrs = w.read_scratch("specs/race")
        assert arrays["basis"].shape == (3, 4) and attrs == {"note": 1}
        for rec in blocks3():
            w.write_draft(f"round-0/{rec.block_id}", _unscaled(rec, scale))
            w.write_draft(f"round-1/{rec.block_id}", _unscaled(rec, 2 * scale))
        w.discard_scratch("round-1")
        for rec in reversed(blocks3()):  # any order
            draft = w.read_scratch(f"round-0/{rec.block_id}", ("sigma", "variances", "profile"))[0]
            w.promote_draft(f"round-0/{rec.block_id}",
                            {"sigma": draft["sigma"] * scale, "variances": draft["variances"] * scale,
                             "profile": draft["profile"] / scale},
                            {"alpha": rec.alpha, "lower_bound": rec.lower_bound})
        assert w.block_ids == ("age.sex", "empty_", "race")
        assert w.finish(**finish_kwargs()) == checksum
    assert siblings(path) == ["plan.zarr"]
    assert not (path / "scratch").exists()
    direct, streamed = tree_snapshot(src), tree_snapshot(path)
    assert sorted(direct) == sorted(streamed)
    assert all(direct[name] == streamed[name] for name in direct if name != "zarr.json")  # root attrs hold `created`
    for a, b in zip(read_plan(src).iter_blocks(), read_plan(path).iter_blocks()):
        assert a.alpha == b.alpha and a.lower_bound == b.lower_bound and a.solver == b.solver


def test_finish_refuses_unpromoted_drafts(tmp_path):
    path = tmp_path / "plan.zarr"
    rec = blocks3()[0]
    with pytest.raises(ValueError, match="never promoted"):
        with PlanWriter(path, fsync=False) as w:
            w.write_draft(f"round-0/{rec.block_id}", rec)
            w.finish(**finish_kwargs())
    assert siblings(path) == []


def test_draft_and_scratch_refusals(tmp_path):
    rec = blocks3()[0]
    with PlanWriter(tmp_path / "plan.zarr", fsync=False) as w:
        for key in ("../x", "a//b", "__x", "", ".."):
            with pytest.raises(ValueError, match="scratch key"):
                w.write_scratch(key, {})
        w.write_draft("r/a", rec)
        with pytest.raises(ValueError, match="already written"):
            w.write_draft("r/a", rec)
        with pytest.raises(ValueError, match="may only rewrite"):
            w.promote_draft("r/a", {"basis": rec.basis}, {})
        with pytest.raises(ValueError, match="shape"):
            w.promote_draft("r/a", {"sigma": rec.sigma[:-1, :-1]}, {})
        with pytest.raises(KeyError, match="no draft"):
            w.promote_draft("r/b", {}, {})
        w.write_block(rec)
        with pytest.raises(ValueError, match="already written"):
            w.promote_draft("r/a", {}, {})
        w.discard_scratch("r")
        with pytest.raises(KeyError):
            w.read_scratch("r/a")
        w.abort()


# ---------------------------------------------------------------------------- concurrent writes


def _file_bytes(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` except the root zarr.json (which holds the creation time)."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.relative_to(root) != Path("zarr.json")}


@pytest.mark.parametrize("batch", [1, 2, 16])
def test_write_blocks_writes_the_same_store_as_write_block(tmp_path, batch):
    records = blocks3() + [make_block(f"b{i}", ["age"], k=2, d_b=3, m_b=2, seed=10 + i) for i in range(5)]
    c1, _ = write_plan(tmp_path / "serial.zarr", records)
    fk = finish_kwargs(0)
    with PlanWriter(tmp_path / "batched.zarr", fsync=False) as w:
        assert w.write_blocks(iter(records), batch=batch) == len(records)  # a lazy iterable is fine
        assert w.block_ids == tuple(sorted(r.block_id for r in records))
        c2 = w.finish(**fk)
    assert c1 == c2
    assert _file_bytes(tmp_path / "serial.zarr") == _file_bytes(tmp_path / "batched.zarr")
    assert verify_checksum(tmp_path / "batched.zarr")[0]


def test_write_blocks_refuses_a_repeated_block_id(tmp_path):
    rec = blocks3()[0]
    with pytest.raises(ValueError, match="already written"):
        with PlanWriter(tmp_path / "p.zarr", fsync=False) as w:
            w.write_blocks([rec, rec])
    assert not (tmp_path / "p.zarr").exists()
    assert not list(tmp_path.iterdir())  # the staging store is gone too


def test_checksum_with_slabs_matches_unthreaded_order(tmp_path, monkeypatch):
    """compute_checksum reads ahead on threads; small read sizes (many slabs per array) must
    hash exactly what one slab at a time in order hashes."""
    path = tmp_path / "p.zarr"
    checksum, _ = write_plan(path)
    monkeypatch.setattr(checksums, "READ_BYTES", 64)
    monkeypatch.setattr(checksums, "READ_THREADS", 3)
    group = zarr.open_group(str(path), mode="r")
    assert compute_checksum(group, attrs=plan_claims(dict(group.attrs), group)) == checksum
