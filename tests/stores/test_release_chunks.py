"""distfit.stores.release_chunks: raw chunk files, and the checksum hashed as chunks land.

The end-to-end release (layout, resume, clusters) is tests/release/test_job.py; here the pieces
are checked against zarr itself and against compute_checksum of the finished store."""
from __future__ import annotations

import shutil
import threading
from pathlib import Path

import numpy as np
import pytest
import zarr

import distfit.stores.release_chunks as release_chunks
from distfit.stores.checksum import DIGESTS
from distfit.stores.release import seal
from distfit.stores.release_chunks import ChunkWriter, ReleaseHasher, raw_chunks, read_rows
from distfit.stores.sealing import stated_attrs
from tests.storetools import stated_checksum

ROWS, CHUNK = 23, 5  # the last chunk holds 3 rows: stored padded to 5


def _arrays(group: zarr.Group, compressors) -> None:
    config = {"write_empty_chunks": True}
    group.create_array("answers", shape=(ROWS, 7), dtype=np.float64, chunks=(CHUNK, 7), compressors=compressors,
                       config=config)
    group.create_array("ids", shape=(ROWS,), dtype=np.int64, chunks=(CHUNK,), compressors=compressors, config=config)
    group.create_array("done", shape=(5,), dtype=np.uint8, chunks=(1,), fill_value=0, compressors=compressors,
                       config=config)
    group.create_array("wide", shape=(ROWS, 8), dtype=np.float64, chunks=(CHUNK, 4), compressors=None, config=config)


def _files(path: Path) -> dict[str, bytes]:
    return {f.relative_to(path).as_posix(): f.read_bytes() for f in path.rglob("*")
            if f.is_file() and f.name != "zarr.json"}


@pytest.mark.parametrize("compressors", [None, "auto"])
def test_raw_chunk_files_are_the_files_zarr_writes(tmp_path, compressors):
    """write_rows writes exactly the files zarr writes (raw where raw_chunks says so, through
    zarr otherwise), and read_rows reads back what zarr reads, edge chunk included."""
    ours, theirs = tmp_path / "ours.zarr", tmp_path / "theirs.zarr"
    for path in (ours, theirs):
        _arrays(zarr.open_group(str(path), mode="w", zarr_format=3), compressors)
    rng = np.random.default_rng(1)
    answers, ids, wide = rng.normal(size=(ROWS, 7)), rng.integers(0, 1 << 40, ROWS), rng.normal(size=(ROWS, 8))
    answers[0, 0] = -0.0
    plain = zarr.open_group(str(theirs), mode="r+")
    with ChunkWriter(str(ours)) as writer:
        for chunk, start in enumerate(range(0, ROWS, CHUNK)):
            stop = min(start + CHUNK, ROWS)
            writer.write_rows("answers", start, answers[start:stop])
            writer.write_rows("ids", start, ids[start:stop])
            writer.write_rows("done", chunk, np.ones(1, np.uint8))
            writer.write_rows("wide", start, wide[start:stop])  # chunked over columns: zarr writes it
            plain["answers"][start:stop] = answers[start:stop]
            plain["ids"][start:stop] = ids[start:stop]
            plain["done"][chunk] = 1
            plain["wide"][start:stop] = wide[start:stop]
    assert _files(ours) == _files(theirs)
    assert not list(ours.rglob("*.partial"))
    group = zarr.open_group(str(ours), mode="r")
    assert raw_chunks(group["answers"]) == raw_chunks(group["ids"]) == raw_chunks(group["done"]) == (compressors is None)
    assert not raw_chunks(group["wide"])
    for name, rows in (("answers", slice(0, 10)), ("answers", slice(20, 25)), ("answers", slice(5, 23)),
                       ("ids", slice(15, 30)), ("done", slice(0, 5)), ("wide", slice(0, 10))):
        got = read_rows(ours, name, group[name], rows)
        assert got.tobytes() == np.asarray(group[name][rows]).tobytes(), (name, rows)


@pytest.fixture(scope="module")
def release(small_release):
    """A sealed multi-block release with string-free ids (7 chunks of 8 units, the last short)."""
    return {"path": Path(small_release.path), "checksum": small_release.checksum, "plan": small_release.plan}


class _Watched(ReleaseHasher):
    """A ReleaseHasher that says when it asks for the rows of a chunk not reported done
    (``asks``: set then, before it waits for them) and records every read of rows of the
    arrays the chunks write that returned while a chunk it covers was not reported done
    (``early``: must stay empty). ``reported`` (chunks reported done, or done at the start)
    is the test's to keep: it adds a chunk before reporting it."""

    def __init__(self, *args, reported: set[int], chunk_units: int, **kwargs) -> None:
        self.asks, self.early, self.reported, self.units_a_chunk = threading.Event(), [], reported, chunk_units
        super().__init__(*args, **kwargs)

    def _read(self, name, arr, where):
        covered = set()
        if isinstance(where, slice) and name in self._written and name != "chunks/done":
            stop = min(where.stop, arr.shape[0])
            per_row = 1 if name == DIGESTS else self.units_a_chunk  # the digests: a row per chunk
            covered = set(range(where.start // per_row, (stop - 1) // per_row + 1))
            if not covered <= self.reported:
                self.asks.set()
        out = super()._read(name, arr, where)
        if not covered <= self.reported:
            self.early.append((name, where.start, where.stop, sorted(covered - self.reported)))
        return out


def test_hasher_waits_for_chunks_and_gives_the_store_checksum(release, tmp_path):
    """Chunks reported done in any order (some done already, as on --resume): the digest is
    compute_checksum's of the finished store; rows of chunks not yet done are never read (no
    read returns before its chunks are reported; the hasher is seen asking for them first)."""
    group = zarr.open_group(str(release["path"]), mode="r")
    assert stated_checksum(release["path"]) == release["checksum"]
    group = zarr.open_group(str(release["path"]), mode="r+")
    done = group["chunks/done"]
    done[[1, 4, 6]] = 0  # as if those chunks were still to come
    reported = {0, 2, 3, 5}
    try:
        hasher = _Watched(group, release["path"], 50, 8, reported=reported, chunk_units=8)
        assert hasher.asks.wait(timeout=60), "the hasher never asked for the rows of chunk 1"
        assert hasher._thread.is_alive()  # waiting for chunk 1's digests
        for chunk in (6, 1, 4):
            reported.add(chunk)
            hasher.chunk_done(chunk)
        assert hasher.result(stated_attrs(dict(group.attrs), group)) == release["checksum"]
        assert hasher.early == []
    finally:
        done[...] = 1


def test_cancelled_hasher_stops_and_a_failed_one_leaves_the_seal_to_hash(release, tmp_path, monkeypatch):
    group = zarr.open_group(str(release["path"]), mode="r+")
    group["chunks/done"][3] = 0
    try:
        hasher = _Watched(group, release["path"], 50, 8, reported={0, 1, 2, 4, 5, 6}, chunk_units=8)
        assert hasher.asks.wait(timeout=60), "the hasher never asked for the rows of chunk 3"
        hasher.cancel()  # while it waits for chunk 3 (or about to: it then sees the cancel)
        assert hasher.result(stated_attrs(dict(group.attrs), group)) is None
        assert not hasher._thread.is_alive() and hasher.early == []
    finally:
        group["chunks/done"][3] = 1

    calls = []
    real = release_chunks.compute_checksum

    def failing(group, **kwargs):
        calls.append(kwargs.get("read"))
        if kwargs.get("read") is not None:
            raise OSError("read failed")
        return real(group, **kwargs)

    monkeypatch.setattr(release_chunks, "compute_checksum", failing)
    hasher = ReleaseHasher(group, release["path"], 50, 8)
    assert hasher.result(stated_attrs(dict(group.attrs), group)) is None
    # the seal then hashes the store itself (stores.release.compute_checksum): the same digest
    assert seal(group, release["path"], plan_path=release["plan"], plan_checksum=zarr.open_group(
        release["plan"], mode="r").attrs["checksum"], fsync=False, hasher=hasher) == release["checksum"]
    assert calls and calls[0] is not None


@pytest.mark.parametrize("direct", [True, False])
def test_direct_io_writes_and_reads_the_same_bytes(tmp_path, monkeypatch, direct):
    """Whole 4096-byte blocks go through O_DIRECT where the filesystem takes it (from an
    unaligned array too: copied into an aligned buffer), anything else through the page cache;
    either way the files are zarr's bytes, and read_rows reads them back."""
    monkeypatch.setattr(release_chunks, "DIRECT_IO", direct and release_chunks.DIRECT_IO)
    rows, width, units = 512, 8, 1300  # 32 KiB chunks; the last one (276 rows) padded
    ours, theirs = tmp_path / "ours.zarr", tmp_path / "theirs.zarr"
    for path in (ours, theirs):
        zarr.open_group(str(path), mode="w", zarr_format=3).create_array(
            "answers", shape=(units, width), dtype=np.float64, chunks=(rows, width), compressors=None,
            config={"write_empty_chunks": True})
    data = np.random.default_rng(4).normal(size=(units + 1, width))[1:]  # a view 64 bytes in: unaligned
    with ChunkWriter(str(ours)) as writer:
        for start in range(0, units, rows):
            writer.write_rows("answers", start, data[start:start + rows])
            zarr.open_group(str(theirs), mode="r+")["answers"][start:start + rows] = data[start:start + rows]
    assert _files(ours) == _files(theirs)
    arr = zarr.open_group(str(ours), mode="r")["answers"]
    np.testing.assert_array_equal(read_rows(ours, "answers", arr, slice(0, 2 * rows)), data[:2 * rows])
    np.testing.assert_array_equal(read_rows(ours, "answers", arr, slice(1024, 1536)), data[1024:])
    # the primitives: an aligned file size is written direct when the filesystem allows it
    block = np.arange(4096, dtype=np.uint8)
    went_direct = release_chunks.write_file(tmp_path / "f", block)
    assert went_direct is False if not direct else isinstance(went_direct, bool)
    out = release_chunks.aligned_empty(4096)
    assert out.ctypes.data % release_chunks.DIRECT_ALIGN == 0
    assert release_chunks.read_file(tmp_path / "f", out) and out.tobytes() == block.tobytes()
    assert not release_chunks.read_file(tmp_path / "f", release_chunks.aligned_empty(8192))  # short file


def test_queued_writes_are_ordered_and_a_failure_leaves_its_chunk_not_done(release, tmp_path, monkeypatch):
    """A ChunkWriter writes each chunk's files on its thread, the done marker last, one chunk in
    flight; a write that fails is raised by the next call, and its chunk is not marked done."""
    path = tmp_path / "copy.zarr"
    shutil.copytree(release["path"], path)
    group = zarr.open_group(str(path), mode="r+")
    group["chunks/done"][...] = 0
    answers = group["queries/answers"][...]
    ids = group["unit_ids"][...]
    real = release_chunks.write_file

    def failing(where, data, direct=None):
        if "queries/answers/c/2/" in where.as_posix():
            raise OSError(28, "No space left on device", "queries/answers/c/2/0")
        return real(where, data, direct)

    monkeypatch.setattr(release_chunks, "write_file", failing)
    writer = ChunkWriter(str(path))
    writer.write(0, 0, {}, answers[0:8], ids[0:8])
    writer.write(1, 8, {}, answers[8:16], ids[8:16])
    writer.write(2, 16, {}, answers[16:24], ids[16:24])  # queued; fails on the writer's thread
    with pytest.raises(OSError, match="No space left"):
        writer.write(3, 24, {}, answers[24:32], ids[24:32])  # returns once chunk 2 is done: raises
    writer.close()  # chunk 3 was queued after the failure: written in order, done last
    assert group["chunks/done"][...].tolist() == [1, 1, 0, 1, 0, 0, 0]


def test_hasher_hashes_the_digests_not_the_digested_arrays(release):
    """A release has per-chunk digests (chunks/digests): the arrays they cover are hashed by the
    chunks as they are written, so the hasher reads none of them (none is read ahead either) and
    its digest, over the digests, is the finished store's."""
    group = zarr.open_group(str(release["path"]), mode="r+")
    done = group["chunks/done"]
    read: list[str] = []

    class Spy(ReleaseHasher):
        def _read(self, name, arr, where):
            read.append(name)
            return super()._read(name, arr, where)

    try:
        done[...] = 0  # every chunk reported in this session, in any order
        hasher = Spy(group, release["path"], 50, 8)
        assert hasher._prefetch == {}
        for chunk in (3, 0, 6, 1, 5, 2, 4):
            hasher.chunk_done(chunk)
        assert hasher.result(stated_attrs(dict(group.attrs), group)) == release["checksum"]
        digested = set(group[DIGESTS].attrs["arrays"])
        assert {"queries/answers", "unit_ids"} <= digested and DIGESTS in read
        assert not digested & set(read)
    finally:
        done[...] = 1
