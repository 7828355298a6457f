"""The one store checksum (distfit.stores.checksum): the documented format, whatever the reads."""
from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest
import zarr

import distfit.stores.checksum as checksums
from distfit.stores.checksum import canonical_json, compute_checksum


def reference_checksum(group: zarr.Group, claims: bytes | None = None, digested: frozenset[str] = frozenset()) -> str:
    """The format as the module docstring states it, one array at a time, no slabs, no threads;
    with ``claims`` (canonical JSON bytes) version 2, and with ``digested`` (the arrays the
    store's digests stand for, left out) version 3."""
    h = hashlib.sha256(b"distfit-plan-checksum-v1\n" if claims is None else
                       b"distfit-plan-checksum-v3\n" if digested else b"distfit-plan-checksum-v2\n")
    arrays = sorted((name, arr) for name, arr in group.members(max_depth=None)
                    if isinstance(arr, zarr.Array) and name not in digested)
    for name, arr in arrays:
        data = arr[...]
        if np.dtype(arr.dtype).kind in "TUO":
            h.update(f"{name}\nstring\n{len(data)}\n".encode())
            rows = arr.chunks[0]  # string slabs are the zarr chunks: lengths, then bytes, per slab
            for start in range(0, len(data), rows):
                encoded = [str(x).encode("utf-8") for x in np.asarray(data[start:start + rows]).tolist()]
                h.update(np.array([len(b) for b in encoded], dtype="<u8").tobytes())
                h.update(b"".join(encoded))
            continue
        data = np.asarray(data, dtype=np.dtype(arr.dtype).newbyteorder("<"))
        shape = ",".join(str(n) for n in arr.shape)
        h.update(f"{name}\n{data.dtype.str}\n{shape}\n{data.nbytes}\n".encode())
        h.update(np.ascontiguousarray(data).tobytes())
    if claims is not None:
        h.update(f"attrs\n{len(claims)}\n".encode() + claims)
    return "sha256:" + h.hexdigest()


@pytest.fixture()
def group(tmp_path):
    rng = np.random.default_rng(3)
    root = zarr.open_group(store=str(tmp_path / "g.zarr"), mode="w", zarr_format=3)
    root.create_array("a/big", shape=(37, 5), dtype="f8", chunks=(4, 5))[...] = rng.standard_normal((37, 5))
    root.create_array("a/ints", shape=(11,), dtype="i8", chunks=(3,))[...] = rng.integers(-9, 9, 11)
    root.create_array("b/done", shape=(6,), dtype="u1", chunks=(1,), fill_value=0)[...] = [1, 0, 1, 1, 0, 1]
    root.create_array("b/empty", shape=(0, 4), dtype="f8", chunks=(1, 4))
    root.create_array("b/scalar", shape=(), dtype="f8")[...] = np.pi
    root.create_array("ids", shape=(9,), dtype=str, chunks=(4,))[...] = np.array(
        [f"unit-{i}-é" * (i % 3) for i in range(9)], dtype=object)
    root.attrs["checksum"] = "not hashed"  # attrs are not part of the checksum
    return root


def test_the_format_whatever_the_reads(group, monkeypatch):
    expected = reference_checksum(group)
    assert compute_checksum(group) == expected
    for threads, read_bytes in [(1, 1), (3, 64), (1, 8 * 2**20), (8, 100)]:
        assert compute_checksum(group, threads=threads, read_bytes=read_bytes) == expected
    monkeypatch.setattr(checksums, "READ_BYTES", 16)  # the defaults are read at call time
    monkeypatch.setattr(checksums, "READ_THREADS", 2)
    assert compute_checksum(group) == expected


def test_every_array_counts_not_the_attrs(group):
    before = compute_checksum(group)
    group.attrs["checksum"] = "changed"
    assert compute_checksum(group) == before
    group["b/done"][1] = 1
    assert compute_checksum(group) != before


def test_string_arrays_must_be_one_dimensional(tmp_path):
    root = zarr.open_group(store=str(tmp_path / "s.zarr"), mode="w", zarr_format=3)
    root.create_array("names", shape=(2, 2), dtype=str)
    with pytest.raises(ValueError, match="string arrays must be 1-d"):
        compute_checksum(root)


CLAIMS = {"": {"alpha": 2.0396915828449145, "alpha_exact": True, "note": "naïve", "pair": (1, 2)},
          "blocks/b0": {"lower_bound": -0.0, "tiny": 1e-300, "attributes": ["a", "b"]}}


def test_version_2_covers_the_claims_after_the_arrays(group):
    """The version-2 digest: the v2 domain line, the arrays as in version 1, then the canonical
    JSON of the claims (sorted keys, no spaces, UTF-8, shortest float text)."""
    text = canonical_json(CLAIMS)
    assert text.startswith(b'{"":{"alpha":2.0396915828449145,"alpha_exact":true,"note":"na\xc3\xafve","pair":[1,2]}')
    expected = reference_checksum(group, text)
    assert compute_checksum(group, attrs=CLAIMS) == expected
    assert compute_checksum(group, attrs=CLAIMS, threads=1, read_bytes=1) == expected
    assert expected not in (reference_checksum(group), compute_checksum(group, attrs={}))
    # key order does not matter, values do; a JSON round trip (tuples to lists) changes nothing
    assert compute_checksum(group, attrs=dict(reversed(list(CLAIMS.items())))) == expected
    assert compute_checksum(group, attrs=json.loads(json.dumps(CLAIMS))) == expected
    changed = {**CLAIMS, "blocks/b0": {**CLAIMS["blocks/b0"], "lower_bound": 0.0}}  # -0.0 and 0.0 differ
    assert compute_checksum(group, attrs=changed) != expected


def test_version_3_leaves_the_digested_arrays_out_unopened(group, monkeypatch):
    """A store with per-chunk digests (version 3): the arrays its digests stand for (the
    ``arrays`` attr of ``chunks/digests``) are left out of the hash, and not even opened (a
    data store of Adult: 366 of its 732 arrays, at every reader's root check)."""
    table = group.create_array(checksums.DIGESTS, shape=(10, 2, 32), dtype="u1", chunks=(1, 2, 32), fill_value=0)
    table[...] = np.arange(640, dtype=np.uint8).reshape(10, 2, 32)
    table.attrs.update({"arrays": ["a/big", "ids"], "chunk_units": 4})
    opened = []
    open_arrays = checksums.open_arrays
    monkeypatch.setattr(checksums, "open_arrays", lambda g, paths: opened.extend(paths) or open_arrays(g, paths))
    expected = reference_checksum(group, canonical_json(CLAIMS), frozenset({"a/big", "ids"}))
    assert compute_checksum(group, attrs=CLAIMS) == expected
    assert sorted(opened) == ["a/ints", "b/done", "b/empty", "b/scalar", checksums.DIGESTS]
    group["a/big"][0, 0] = 7.0  # a digested array is the digests' to check, not the root's
    assert compute_checksum(group, attrs=CLAIMS) == expected
    table[0, 0, 0] = 255
    assert compute_checksum(group, attrs=CLAIMS) != expected


def test_canonical_json_refuses_what_json_cannot_hold():
    with pytest.raises(ValueError):
        canonical_json({"alpha": float("nan")})
    with pytest.raises(TypeError):
        canonical_json({"alpha": {1, 2}})
