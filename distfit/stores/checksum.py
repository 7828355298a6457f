"""The store checksum: one SHA-256 over every array of a Zarr group (every kind of store alike)
and over the attrs that state its claims (plans of format version 2 and later, releases of 2,
estimates of 3, data stores of 2; older stores: the arrays only).

Format (**contract**: stored plans and releases must keep verifying). SHA-256, fed first with
the domain line ``b"distfit-plan-checksum-v1\\n"`` (the same for every kind of store) - or
``b"distfit-plan-checksum-v2\\n"`` when attrs are covered (below) - then, for every array of
the group in sorted order of its path relative to the root (``"blocks/b0/basis"``; Python
string order), the header ``f"{path}\\n{dtype}\\n{shape}\\n{nbytes}\\n"`` encoded as UTF-8 -
``dtype`` the little-endian NumPy type string (``"<f8"``, ``"<i8"``), ``shape`` the sizes joined
by commas (``"3,4"``; ``""`` for a scalar), ``nbytes`` the byte count of the data - followed by
the array's bytes in C order, little-endian. A 1-d variable-length string array (the Zarr v3
``string`` data type, e.g. a release's unit ids) has the header ``f"{path}\\nstring\\n{n}\\n"``
and then, slab by slab, the UTF-8 byte lengths of its elements (little-endian uint64) and their
UTF-8 bytes. The value is ``"sha256:" + hexdigest``.

**Version 1** (plans of ``format_version`` 1, releases of 1, estimates of 1-2: no longer
read): the arrays only, not the attrs.
**Version 2** (``compute_checksum(group, attrs=claims)``; every store this distfit writes): the
arrays as above, then ``f"attrs\\n{n}\\n"`` and the ``n`` bytes of :func:`canonical_json` of
``claims``, the mapping of the attrs the store's claims are stated in (which ones is the store's
rule: :func:`distfit.stores.plan.plan_claims` for plans,
:func:`distfit.stores.sealing.stated_attrs` for the rest). Array metadata (chunking, codecs, Zarr v3
``dimension_names``) is never hashed: only what the data and the claims are.
**Version 3** (a store with per-chunk digests, :data:`DIGESTS`: data stores of format 3, estimates of 4,
releases of 3): as version 2 with the domain line ``b"distfit-plan-checksum-v3\\n"``, but the
arrays its digests cover (the ``arrays`` attr of :data:`DIGESTS`, itself a stated attr) are left
out of the array part: the digests array stands for them (each entry a BLAKE3 of one chunk's
rows, :func:`chunk_digest`), so the root checksum is cheap to recompute (the attrs, the small
arrays and the digests) and each chunk is checked by whoever reads it.

Chunk digest (**contract**, :func:`chunk_digest`): BLAKE3 (32 bytes) of the header
``f"{path}\\n{dtype}\\n{start}:{stop}\\n{trailing shape}\\n"`` (``dtype`` as above, the trailing
shape the sizes after the first joined by commas) and then the rows ``start:stop`` of the array
in C order, little-endian, as decoded (not as compressed: the digest does not depend on the
codecs); a string array's header is ``f"{path}\\nstring\\n{start}:{stop}\\n"`` followed by the
byte lengths and the UTF-8 bytes as above. The 32 raw bytes are stored.

:func:`compute_checksum` is the one implementation: the plan writer (``PlanWriter.finish``)
and :func:`distfit.stores.plan.verify_checksum`, the release seal and
:func:`distfit.stores.release.verify_release` all call it. Only how it reads differs by caller
(``threads``, ``read_bytes``); the digest never does.
"""
from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import blake3
import numpy as np
import zarr

from distfit.stores.files import node_documents, open_arrays

CHECKSUM_PREFIX = "sha256:"
_DOMAIN = b"distfit-plan-checksum-v1\n"  # the hash's first bytes (the format's name and version)
_DOMAIN_WITH_ATTRS = b"distfit-plan-checksum-v2\n"  # version 2: the claims' attrs follow the arrays
_DOMAIN_WITH_DIGESTS = b"distfit-plan-checksum-v3\n"  # version 3: the digested arrays stand as their digests
#: The array of per-chunk digests of a store that has them (version 3): (chunks, arrays, 32) uint8,
#: its attr ``arrays`` naming the arrays, in order, whose chunks it holds the digests of.
DIGESTS = "chunks/digests"
READ_THREADS = 8  # default threads reading arrays ahead of the hash
READ_BYTES = 64 * 2**20  # default slab size and read-ahead budget


def canonical_json(value: Any) -> bytes:
    """The canonical JSON text of ``value`` as UTF-8: keys sorted, no spaces, no NaN/Infinity,
    non-ASCII kept; floats as Python writes them (the shortest text that reads back to the same
    float), so a value and its JSON round trip (tuples read back as lists) give the same bytes."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


#: How :func:`compute_checksum` reads a slab: ``read(path, array, where)`` returns ``array[where]``.
Reader = Callable[[str, zarr.Array, Any], Any]


def compute_checksum(group: zarr.Group, *, attrs: "Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None" = None,
                     threads: int | None = None, read_bytes: int | None = None, read: Reader | None = None) -> str:
    """``"sha256:<hex>"`` over every array under ``group`` (format: the module docstring);
    with ``attrs`` (a JSON mapping: the claims the store states) the version-2 digest, which
    also covers :func:`canonical_json` of ``attrs``. ``attrs`` may be a function giving that
    mapping: it is called once the arrays are hashed (a store hashed while its chunks are
    written learns its last attrs only when it is sealed).

    The arrays are fed to the hash one after another in the documented order, but read ahead
    on ``threads`` threads (default :data:`READ_THREADS`), in slabs of whole zarr chunks of rows
    of about ``read_bytes`` (default :data:`READ_BYTES`; at least one chunk), with at most
    ``read_bytes`` read ahead beyond the slab being hashed (at least the next slab). Each slab
    is hashed from the array's own buffer, no copy. The defaults suit a plan (thousands of small
    arrays: reading them one at a time is latency-bound); the release seal reads one zarr
    chunk of answers at a time on one thread (:data:`distfit.stores.release_chunks.SEAL_READ_BYTES`).
    The defaults are read at call time. ``read(path, array, where)`` (default ``array[where]``)
    reads each slab, ``where`` a slice of rows (``Ellipsis`` for a 0-d array), in hash order:
    the release hashes its store while the chunks are being written with a reader that waits
    for a slab's rows to be written (:class:`distfit.stores.release_chunks.ReleaseHasher`); the
    digest is the same whoever reads.
    """
    threads = max(1, int(READ_THREADS if threads is None else threads))
    reader: Reader = read or (lambda _name, arr, where: arr[where])
    read_bytes = max(1, int(READ_BYTES if read_bytes is None else read_bytes))
    # only the arrays hashed are opened (~1 ms of zarr each): the digested ones are named by the
    # digests' zarr.json (a data store of Adult: 366 of its 732 arrays, each reader's root check)
    documents = node_documents(group)
    held = documents.get(DIGESTS)
    digested = digested_arrays(held.get("attributes") or {} if held and held.get("node_type") == "array" else None)
    arrays = list(open_arrays(group, sorted(path for path, doc in documents.items()
                                            if doc.get("node_type") == "array" and path not in digested)).items())
    h = hashlib.sha256(_DOMAIN if attrs is None else _DOMAIN_WITH_DIGESTS if digested else _DOMAIN_WITH_ATTRS)
    # One step per header or slab, in hash order: ("bytes", b) feeds b; ("read", arr, where,
    # dtype, nbytes, name) feeds the slab's bytes, dtype None: a slab of strings (_string_steps),
    # read ahead like the others (a store of many small label arrays, e.g. Adult's data store
    # with 728, is latency-bound read one at a time).
    steps: list[tuple] = []
    for name, arr in arrays:
        if np.dtype(arr.dtype).kind in "TUO":  # variable-length strings (e.g. a release's unit ids)
            steps.extend(_string_steps(name, arr))
            continue
        dtype = np.dtype(arr.dtype).newbyteorder("<")
        shape = tuple(int(n) for n in arr.shape)
        nbytes = math.prod(shape) * dtype.itemsize
        steps.append(("bytes", f"{name}\n{dtype.str}\n{','.join(map(str, shape))}\n{nbytes}\n".encode("utf-8")))
        if nbytes == 0:
            continue
        if not shape:  # 0-d
            steps.append(("read", arr, Ellipsis, dtype, nbytes, name))
            continue
        row_bytes = max(1, nbytes // shape[0])
        rows = max(1, int(arr.chunks[0]) if arr.chunks else shape[0])  # whole zarr chunks per read
        step = rows * max(1, read_bytes // (row_bytes * rows))
        for start in range(0, shape[0], step):
            stop = min(shape[0], start + step)
            steps.append(("read", arr, slice(start, stop), dtype, (stop - start) * row_bytes, name))

    def read_slab(name: str, arr: zarr.Array, where, dtype: np.dtype | None) -> np.ndarray:
        if dtype is None:
            return np.asarray(reader(name, arr, where))
        return np.ascontiguousarray(reader(name, arr, where), dtype=dtype)

    reads = [i for i, step in enumerate(steps) if step[0] == "read"]
    with ThreadPoolExecutor(max_workers=threads, thread_name_prefix="distfit-checksum") as pool:
        futures: dict[int, Any] = {}
        ahead_bytes = 0
        next_read = 0  # position in ``reads`` of the next slab to submit

        def fill() -> None:
            nonlocal next_read, ahead_bytes
            while next_read < len(reads) and (not futures or (
                    len(futures) < 4 * threads and ahead_bytes + steps[reads[next_read]][4] <= read_bytes)):
                i = reads[next_read]
                _, arr, where, dtype, size, name = steps[i]
                futures[i] = pool.submit(read_slab, name, arr, where, dtype)
                ahead_bytes += size
                next_read += 1

        try:
            for i, step in enumerate(steps):
                kind = step[0]
                if kind == "bytes":
                    h.update(step[1])
                else:
                    fill()
                    part = futures.pop(i).result()
                    ahead_bytes -= step[4]
                    fill()  # the next slabs are read while this one is hashed
                    if step[3] is None:
                        _hash_strings(h, part)
                    else:
                        h.update(memoryview(part).cast("B"))
        finally:
            for future in futures.values():
                future.cancel()
    if attrs is not None:
        claims = canonical_json(dict(attrs() if callable(attrs) else attrs))
        h.update(f"attrs\n{len(claims)}\n".encode("utf-8"))
        h.update(claims)
    return CHECKSUM_PREFIX + h.hexdigest()


def digested_arrays(attrs: "Mapping[str, Any] | None") -> frozenset[str]:
    """The arrays a store's :data:`DIGESTS` array holds the chunk digests of: the ``arrays`` attr
    of its ``attrs`` (None: the store has none)."""
    if attrs is None:
        return frozenset()
    return frozenset(str(name) for name in attrs.get("arrays", ()))


def chunk_digest(name: str, start: int, values: Any) -> bytes:
    """The 32-byte BLAKE3 digest of rows ``start:start + len(values)`` of the array ``name``
    holding ``values`` (format: the module docstring). A numeric array is hashed from its own
    buffer (no copy when it is C-contiguous and little-endian, as read), on the calling thread
    (a task's). BLAKE3, a cryptographic hash (as SHA-256, 256-bit), because every chunk a task
    reads is hashed: here it ran at 4-5 GB/s on one thread against SHA-256's 1.2-1.6 (SHA-NI)
    and BLAKE2b's 0.45, and with SHA-256 the check cost a 1M-unit release more than the 5 % it
    may (benchmarks/README.md, session 13)."""
    values = np.asarray(values)
    stop = start + int(values.shape[0])
    h = blake3.blake3(max_threads=1)
    if values.dtype.kind in "TUO":
        if values.ndim != 1:
            raise ValueError(f"{name}: string arrays must be 1-d for the checksum, got shape {values.shape}")
        h.update(f"{name}\nstring\n{start}:{stop}\n".encode("utf-8"))
        encoded = [str(item).encode("utf-8") for item in values.tolist()]
        h.update(np.array([len(b) for b in encoded], dtype="<u8").tobytes())
        h.update(b"".join(encoded))
        return h.digest()
    dtype = values.dtype.newbyteorder("<")
    values = np.ascontiguousarray(values, dtype=dtype)
    h.update(f"{name}\n{dtype.str}\n{start}:{stop}\n{','.join(map(str, values.shape[1:]))}\n".encode("utf-8"))
    if values.size:
        h.update(memoryview(values).cast("B"))
    return h.digest()


def fingerprint(claims: Mapping[str, Any], arrays: Mapping[str, Any]) -> str:
    """``"blake3:<hex>"`` over the domain line ``b"distfit-fingerprint-v1\\n"``,
    :func:`canonical_json` of ``claims`` and the :func:`chunk_digest` of each of ``arrays``
    (name -> array, all its rows), in sorted order of name: what a computation's inputs hash to
    (the key of a fit's checkpoint, :mod:`distfit.stores.checkpoint`). Not a store's checksum."""
    h = blake3.blake3(max_threads=1)
    h.update(b"distfit-fingerprint-v1\n")
    claims_json = canonical_json(dict(claims))
    h.update(f"{len(claims_json)}\n".encode("utf-8") + claims_json)
    for name in sorted(arrays):
        h.update(chunk_digest(name, 0, np.atleast_1d(np.asarray(arrays[name]))))
    return "blake3:" + h.hexdigest()


def _string_steps(name: str, arr: zarr.Array) -> list[tuple]:
    """The steps of :func:`compute_checksum` that feed a 1-d string array: the header
    ``f"{name}\nstring\n{n}\n"``, then a read per zarr chunk of rows (:func:`_hash_strings`;
    the slabs are part of the format: each one's lengths precede its bytes)."""
    shape = tuple(int(n) for n in arr.shape)
    if len(shape) != 1:
        raise ValueError(f"{name}: string arrays must be 1-d for the checksum, got shape {shape}")
    steps: list[tuple] = [("bytes", f"{name}\nstring\n{shape[0]}\n".encode("utf-8"))]
    step = max(1, int(arr.chunks[0]) if arr.chunks else shape[0])
    for start in range(0, shape[0], step):
        stop = min(shape[0], start + step)
        steps.append(("read", arr, slice(start, stop), None, 16 * (stop - start), name))
    return steps


def _hash_strings(h, values: np.ndarray) -> None:
    """Feed a slab of a string array to the checksum: the UTF-8 byte length of every element
    (little-endian uint64) followed by the elements' UTF-8 bytes, concatenated."""
    encoded = [str(item).encode("utf-8") for item in values.tolist()]
    h.update(np.array([len(b) for b in encoded], dtype="<u8").tobytes())
    h.update(b"".join(encoded))


__all__ = ["CHECKSUM_PREFIX", "DIGESTS", "READ_BYTES", "READ_THREADS", "Reader", "canonical_json", "chunk_digest",
           "compute_checksum", "digested_arrays", "fingerprint"]
