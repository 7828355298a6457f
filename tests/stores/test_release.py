"""Release stores (distfit.stores.release): chunk fsync, codecs, the seal's checksum, refusals.

The end-to-end behaviour of ``distfit release`` (layout, contents, resume, clusters) is tested in
tests/release/test_job.py; these tests look at the store pieces."""
from __future__ import annotations

import io
import shutil
from pathlib import Path

import numpy as np
import pytest
import zarr

import distfit.stores.release_chunks as release_chunks
from distfit.release.job import run_release
from distfit.spec.parse import parse_spec
from distfit.stores.plan import read_plan
from distfit.stores.checksum import compute_checksum
from distfit.stores.data import write_synthetic
from distfit.stores.release import (
    ANSWER_COMPRESSORS,
    ReleaseError,
    answer_chunks,
    read_release,
    release_state,
    verify_release,
)
from distfit.stores.release_chunks import ChunkSync
from distfit.stores.sealing import stated_attrs
from distfit.runtime.placement import Placement
from tests.packed_plans import marginals_spec, reference_release, write_packed_plan
from tests.reference import SMALL_CHUNK as CHUNK, SMALL_UNITS as UNITS
from tests.storetools import reseal

SEED = 987654321


@pytest.fixture(scope="module")
def inputs(small_plan, small_data):
    return {"plan": small_plan.plan, "data": small_data}


def test_chunk_sync_names_every_chunk_file_of_the_store(inputs, tmp_path):
    """The driver fsyncs each finished chunk's files while later chunks run (ChunkSync);
    the files it names are exactly the chunk files zarr wrote, so the seal's fsync finds them clean."""
    out = tmp_path / "synced.zarr"
    result = run_release(inputs["plan"], inputs["data"], out, seed=SEED, placement=Placement(serial=True), fsync=False)
    root = zarr.open_group(store=str(out), mode="r+")
    sync = ChunkSync(root, out, UNITS, CHUNK)
    try:
        named = [set(sync._files(chunk)) for chunk in range(result.chunks)]
        for chunk in range(result.chunks):
            sync(chunk)
    finally:
        sync.close()
    assert all(named) and not any(a & b for i, a in enumerate(named) for b in named[i + 1:])
    arrays = [f"blocks/{b}/answers" for b in root["blocks"].group_keys()] + [
        "queries/answers", "unit_ids", "unit", "chunks/done", "chunks/digests"]  # what the chunks write
    written = {p for name in arrays for p in (out / name).rglob("*") if p.is_file() and p.name != "zarr.json"}
    assert set().union(*named) == written


def test_answer_arrays_codecs_and_chunks(inputs, tmp_path):
    """Answer arrays use ANSWER_COMPRESSORS (the benchmark's baseline writes the same) and
    answer_chunks: rows dividing the data's chunk, so each release chunk owns whole zarr chunks."""
    out = tmp_path / "codecs.zarr"
    run_release(inputs["plan"], inputs["data"], out, seed=SEED, placement=Placement(serial=True), fsync=False)
    release = read_release(out)
    expected = zarr.create_array({}, shape=(4, 4), dtype="f8", compressors=ANSWER_COMPRESSORS).compressors
    for arr in [release.answers] + [release.block_answers(b) for b in release.block_ids]:
        assert arr.compressors == expected
        assert tuple(arr.chunks) == answer_chunks(CHUNK, arr.shape[1])
        assert CHUNK % arr.chunks[0] == 0
    assert answer_chunks(4096, 2**20)[0] == 2  # 16 MiB rows cap: 2 rows of 8 MiB, dividing 4096


@pytest.mark.parametrize("string_ids", [False, True])
def test_seal_checksum_is_the_store_checksum(inputs, tmp_path, string_ids):
    """The seal hashes with its own read settings (one thread, SEAL_READ_BYTES slabs of whole
    zarr chunks); the digest is the one compute_checksum gives with any settings, which
    verify_release and every reader use."""
    data = inputs["data"]
    if string_ids:
        data = tmp_path / "string-ids.zarr"
        shutil.copytree(inputs["data"], data)
        ids = zarr.open_array(str(data / "unit_ids"), mode="r")[...]
        shutil.rmtree(data / "unit_ids")
        group = zarr.open_group(str(data), mode="r+")
        strings = group.create_array("unit_ids", shape=ids.shape, dtype=str, chunks=(CHUNK,))
        strings[...] = np.array([f"unit-{i:04d}-é" for i in ids], dtype=object)
        reseal(data)  # a data store with string ids, sealed as its writer would
    out = tmp_path / "sealed.zarr"
    result = run_release(inputs["plan"], str(data), out, seed=SEED, placement=Placement(serial=True), fsync=False)
    group = zarr.open_group(store=str(out), mode="r")
    assert (np.dtype(group["unit_ids"].dtype).kind in "TUO") == string_ids
    claims = stated_attrs(dict(group.attrs), group)
    seal_read = compute_checksum(group, attrs=claims, threads=release_chunks.SEAL_READ_THREADS,
                                 read_bytes=release_chunks.SEAL_READ_BYTES)
    assert seal_read == compute_checksum(group, attrs=claims) == result.checksum
    # one zarr chunk per read: many slabs per array
    assert compute_checksum(group, attrs=claims, threads=1, read_bytes=1) == result.checksum
    assert verify_release(out)[0]


def test_reader_refusals_and_state(inputs, tmp_path):
    assert release_state(tmp_path / "absent.zarr") == "absent"
    with pytest.raises(ReleaseError, match="no such release store"):
        read_release(tmp_path / "absent.zarr")
    with pytest.raises(ReleaseError, match="staging directory"):
        read_release(tmp_path / "r.zarr.incomplete-abc")
    with pytest.raises(ReleaseError, match="distfit_format is 'plan', not 'release'"):
        read_release(inputs["plan"])
    with pytest.raises(FileExistsError, match="not a distfit release store"):
        release_state(Path(inputs["plan"]))
    out = tmp_path / "sealed.zarr"
    run_release(inputs["plan"], inputs["data"], out, seed=SEED, placement=Placement(serial=True), fsync=False)
    assert release_state(out) == "sealed"
    answers = zarr.open_array(str(out / "queries/answers"), mode="r+")
    answers[0, 0] = answers[0, 0] + 1.0
    ok, stored, recomputed = verify_release(out)
    assert not ok and stored == read_release(out).checksum and recomputed != stored


# --------------------------------------------------------------------------------------------
# a packed plan's release (issue 10): one measurements array per pack, not a group per block


@pytest.mark.parametrize("explicit", [0, 4])
def test_a_packed_plan_releases_what_the_blocks_give_for_the_same_draws(tmp_path, explicit):
    """A packed (or mixed) plan's release equals, to rounding, the block-by-block reference on the
    same draws (each pack's stream per chunk, each explicit block's own), with one measurements
    array per pack and no group per packed block."""
    spec = marginals_spec([3, 4, 2, 3], 2, [1.0, 2.0, 3.0, 1.0, 2.0, 3.0], name="packed-release")
    write_packed_plan(tmp_path / "packed.zarr", spec, explicit=explicit)
    data = write_synthetic(parse_spec(spec), 20, tmp_path / "data.zarr", seed=1, chunk_units=8, fsync=False)
    run_release(tmp_path / "packed.zarr", data, tmp_path / "packed-release.zarr", seed=7,
                placement=Placement(serial=True), log=io.StringIO(), fsync=False)
    release = read_release(tmp_path / "packed-release.zarr")
    assert verify_release(tmp_path / "packed-release.zarr")[0]
    plan = read_plan(tmp_path / "packed.zarr")
    counts = np.asarray(zarr.open_group(str(data), mode="r")["counts"][...])
    want, measured = reference_release(plan, counts, 7, 8)
    scale = np.abs(want).max()
    np.testing.assert_allclose(release.answers[...], want, rtol=0, atol=1e-12 * scale)
    assert len(release.block_ids) == explicit
    group = zarr.open_group(str(tmp_path / "packed-release.zarr"), mode="r")
    np.testing.assert_allclose(group["packs/p0/measurements"][...], measured["p0"], rtol=0, atol=1e-12 * scale)
    total = np.zeros_like(want)  # every block's answers (packed: measurements @ recon^T) sum to the queries'
    for block_id in plan.block_ids:
        np.add.at(total.T, plan.block(block_id).query_index, np.asarray(release.block_answers(block_id)[...]).T)
    np.testing.assert_allclose(total, want, rtol=0, atol=1e-12 * scale)