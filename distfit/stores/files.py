"""Files under every store: atomic staging and replacement, fsync, JSON attrs, chunking.

Every distfit store (plan, data, release) is written the same way: built in a *staging*
directory next to its final path (``<path>.incomplete-<random>``), fsynced, then renamed into
place by :func:`move_into_place`; a store being replaced is first renamed aside
(``<path>.replaced-<random>``) and deleted only once the new one is in place. An interrupted
writer leaves only such siblings (:func:`leftovers`), which every reader refuses. Attrs are JSON
(:func:`jsonable`); arrays of up to :data:`CHUNK_BYTES` are one chunk, larger ones row slabs
(:func:`chunk_shape`), and every array carries Zarr v3 ``dimension_names`` (:func:`check_dims`,
:func:`write_array`) so that xarray opens each store whole. Readers check
``distfit_format``/``format_version`` with :func:`check_format`.
"""
from __future__ import annotations

import asyncio
import dataclasses
import datetime as _dt
import json
import math
import os
import secrets
import shutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import zarr
import zarr.api.asynchronous
import zarr.storage
from zarr.core.buffer import default_buffer_prototype
from zarr.core.group import GroupMetadata
from zarr.core.metadata.v3 import ArrayV3Metadata
from zarr.core.sync import sync

from distfit.stores.atomic import fsync_dir

STAGING_MARKER = ".incomplete-"
REPLACED_MARKER = ".replaced-"
CHUNK_BYTES = 16 * 2**20
#: Most bytes of rows :func:`write_rows` writes in one zarr call (the rows a task holds at once:
#: a tabulation's merge keeps a chunk's marginals up to this many bytes before writing them).
WRITE_BYTES = 64 * 2**20


def jsonable(value: Any, where: str = "attrs") -> Any:
    """``value`` as plain JSON types (dict with str keys, list, str, int, float, bool, None).

    NumPy scalars and arrays, tuples (to lists), dataclasses (``asdict``), objects with a
    ``to_dict()`` method, paths and datetimes are converted; anything else (sets, arbitrary
    objects, non-string keys) raises ``TypeError`` naming where in the attrs it sits, and
    non-finite floats (not JSON) raise ``ValueError``.
    """
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{where}: {value} is not valid JSON; store None for 'not available'")
    if isinstance(value, (int, float)):
        return value
    if isinstance(value, np.generic):
        return jsonable(value.item(), where)
    if isinstance(value, np.ndarray):
        return jsonable(value.tolist(), where)
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if isinstance(k, np.str_):
                k = str(k)
            if not isinstance(k, str):
                raise TypeError(f"{where}: key {k!r} is not a string; JSON attrs need string keys")
            out[k] = jsonable(v, f"{where}[{k!r}]")
        return out
    if isinstance(value, (list, tuple)):
        return [jsonable(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return jsonable(dataclasses.asdict(value), where)
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return jsonable(to_dict(), where)
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    if isinstance(value, (_dt.datetime, _dt.date)):
        return value.isoformat()
    raise TypeError(f"{where}: cannot store a {type(value).__name__} in JSON attrs")


def chunk_shape(shape: tuple[int, ...], itemsize: int, cap: int | None = None) -> tuple[int, ...]:
    """Whole array as one chunk if it fits in ``cap`` bytes, else row slabs of at most ``cap``.

    Leading axes are cut first (trailing axes kept whole while one row still fits), so chunks
    are contiguous in C order. Zero-length axes get chunk size 1 (zarr needs positive sizes).
    ``cap`` defaults to :data:`CHUNK_BYTES`, read at call time.
    """
    cap = CHUNK_BYTES if cap is None else cap
    chunks = [max(1, int(n)) for n in shape]
    for axis in range(len(chunks)):
        inner = itemsize * math.prod(chunks[axis + 1:])
        if inner * chunks[axis] <= cap:
            break
        if inner <= cap:
            chunks[axis] = max(1, cap // inner)
            break
        chunks[axis] = 1
    return tuple(chunks)


def check_dims(shape: tuple[int, ...], dims: Sequence[str], where: str) -> tuple[str, ...]:
    """``dims`` as the tuple of an array's Zarr v3 ``dimension_names``: one non-empty, distinct
    string per axis of ``shape``; ValueError naming ``where`` otherwise.

    Every array of every distfit store carries them (docs/design.md section 4): xarray takes an
    array's dimensions from this metadata (``xr.open_datatree(path, engine="zarr")``), and a
    coordinate from the array of a group (or an ancestor group) named like a dimension. They are
    metadata in ``zarr.json``, not array bytes: the checksum
    (:mod:`distfit.stores.checksum`) does not see them.
    """
    dims = tuple(dims) if not isinstance(dims, str) else (dims,)
    if (len(dims) != len(shape) or not all(isinstance(d, str) and d for d in dims)
            or len(set(dims)) != len(dims)):
        raise ValueError(f"{where}: dimension names {dims!r} do not name the {len(shape)} axes of shape {shape} "
                         "once each")
    return dims


def filled_array(data: np.ndarray, *, dims: Sequence[str], where: str) -> dict[str, Any]:
    """The arguments of ``create_array`` (and ``data``) of an array holding ``data``, as
    :func:`write_array` writes it: dimension names ``dims`` (:func:`check_dims`, ``where``
    names the array in its error), chunks :func:`chunk_shape`, every chunk written.

    Text (NumPy ``U``/``T``/object strings) is stored as the Zarr v3 variable-length UTF-8
    ``string`` data type (fixed-width UTF-32 has no Zarr v3 specification), chunked as if each
    element took its NumPy item size (at least 16 bytes).
    """
    dims = check_dims(data.shape, dims, where)
    text = data.dtype.kind in "TUO"
    return {"shape": data.shape, "dtype": str if text else data.dtype,
            "chunks": chunk_shape(data.shape, max(16, data.dtype.itemsize) if text else data.dtype.itemsize),
            "dimension_names": dims,
            "config": {"write_empty_chunks": True},  # every chunk on disk: bit-exact, no fill-value games
            "data": data}


def write_array(group: zarr.Group, name: str, data: np.ndarray, *, dims: Sequence[str],
                overwrite: bool = False) -> None:
    """Create ``group[name]`` holding ``data`` (:func:`filled_array`: dimension names ``dims``,
    chunks :func:`chunk_shape`, every chunk written, text as variable-length UTF-8)."""
    spec = filled_array(data, dims=dims, where=f"{group.path}/{name}".lstrip("/"))
    data = spec.pop("data")
    arr = group.create_array(name, overwrite=overwrite, **spec)
    if data.size:
        arr[...] = data


def create_nodes(group: zarr.Group, groups: Mapping[str, Mapping[str, Any]],
                 arrays: Mapping[str, Mapping[str, Any]], progress: Callable[[int, int], None] | None = None) -> None:
    """Create under ``group`` the ``groups`` (``{path: attrs}``) and the ``arrays`` (``{path:
    arguments of create_array}``: ``shape``, ``dtype``, ``chunks``, ``dimension_names`` and
    optionally ``compressors``, ``fill_value``, ``attributes``, ``config``, and ``data`` for
    one created full: :func:`filled_array`), in one zarr call: ``zarr.create_hierarchy``
    writes every node's metadata concurrently (a node already there is an error; a missing
    parent group is created), then the full arrays' chunks are written concurrently. Paths are
    relative to ``group``.

    What it writes is what ``create_group(path, attributes=attrs)`` and ``create_array(path,
    **arguments)`` then ``arr[...] = data`` write one call at a time: each array's metadata is
    that of an array zarr creates with the same arguments (one made in memory per data type,
    codecs, fill value and rank, its shape, chunks, dimension names and attributes replaced;
    tests/stores/test_files.py compares the two node by node). Why: one call at a time, zarr
    checks each node's absence and its parents' (about 8 file-system round trips a node, each
    through zarr's event-loop thread): a release of Adult's plan (470 block groups, 942 arrays)
    took 7.4 CPU-s and 13-15 s of wall at load 9 to lay out that way. ``progress(done, total)``
    is called as the nodes' metadata is written (on zarr's event-loop thread).
    """
    sync(_create_nodes(group, groups, arrays, progress))


async def _create_nodes(group: zarr.Group, groups: Mapping[str, Mapping[str, Any]],
                        arrays: Mapping[str, Mapping[str, Any]],
                        progress: Callable[[int, int], None] | None = None) -> None:
    prefix = f"{group.path}/" if group.path else ""
    templates: dict[tuple, dict[str, Any]] = {}
    nodes: dict[str, Any] = {prefix + path: GroupMetadata(attributes=jsonable(dict(attrs), f"{path} attrs"))
                             for path, attrs in groups.items()}
    full: dict[str, tuple[np.ndarray, Any]] = {}
    for path, spec in arrays.items():
        nodes[prefix + path] = await _array_metadata(spec, templates, path)
        data = spec.get("data")
        if data is not None and data.size:
            full[prefix + path] = (data, spec.get("config"))
    writes, created = [], 0
    async for key, node in zarr.api.asynchronous.create_hierarchy(store=group.store, nodes=nodes):
        created += 1  # (a missing parent group it adds counts too: hence the min)
        if progress is not None:
            progress(min(created, len(nodes)), len(nodes))
        if key in full:
            data, config = full[key]
            writes.append((node.with_config(config) if config else node).setitem(Ellipsis, data))
    await asyncio.gather(*writes)


async def _array_metadata(spec: Mapping[str, Any], templates: dict[tuple, dict[str, Any]], path: str) -> Any:
    """The metadata of an array ``create_array(**spec)`` would create (:func:`create_nodes`):
    a template made in memory once per data type, codecs, fill value and rank, with this
    array's shape, chunks, dimension names and attributes."""
    shape, chunks = tuple(int(n) for n in spec["shape"]), tuple(int(c) for c in spec["chunks"])
    dtype = spec["dtype"]
    options = {name: spec[name] for name in ("compressors", "fill_value") if name in spec}
    key = ("str" if dtype is str else np.dtype(dtype).str, repr(options), len(shape))
    if key not in templates:
        made = await zarr.api.asynchronous.create_array(
            zarr.storage.MemoryStore(), shape=(1,) * len(shape), chunks=(1,) * len(shape), dtype=dtype,
            dimension_names=spec.get("dimension_names"), **options)
        templates[key] = made.metadata.to_dict()
    dims = spec.get("dimension_names")
    return ArrayV3Metadata.from_dict({
        **templates[key], "shape": shape,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": chunks}},
        "dimension_names": None if dims is None else tuple(dims),
        "attributes": jsonable(dict(spec.get("attributes") or {}), f"{path} attrs")})


def open_arrays(group: zarr.Group, names: Sequence[str]) -> dict[str, zarr.Array]:
    """``{name: group[name]}`` for every path in ``names``, opened in one zarr call
    (concurrently) rather than one round trip to zarr's event loop each: a release of Adult's
    plan writes 470 block arrays a chunk, and the driver's fsync thread opens them too."""
    return dict(zip(names, sync(_open_arrays(group, names))))


async def _open_arrays(group: zarr.Group, names: Sequence[str]) -> list[zarr.Array]:
    prefix = f"{group.path}/" if group.path else ""
    mode = "r" if group.store.read_only else "r+"
    opened = await asyncio.gather(*(zarr.api.asynchronous.open_array(store=group.store, path=prefix + name, mode=mode,
                                                                     zarr_format=3) for name in names))
    return [zarr.Array(arr) for arr in opened]


def byte_batches(items: Iterable[Any], nbytes: Callable[[Any], int], budget: int) -> Iterator[list[Any]]:
    """``items`` in consecutive batches of at most ``budget`` bytes (``nbytes(item)`` each; at
    least one item a batch, so one larger item is a batch alone), consumed as they are yielded."""
    batch: list[Any] = []
    held = 0
    for item in items:
        size = nbytes(item)
        if batch and held + size > budget:
            yield batch
            batch, held = [], 0
        batch.append(item)
        held += size
    if batch:
        yield batch


def write_rows(group: zarr.Group, rows: Iterable[tuple[str, int, np.ndarray]], budget: int | None = None) -> int:
    """``group[name][start:start + len(r)] = r`` for every ``(name, start, r)`` of ``rows`` (consumed
    as it is written), in few zarr calls: the rows gathered up to ``budget`` bytes (default
    :data:`WRITE_BYTES`, read at call time; at least one array a call) have their arrays opened
    and written concurrently in one call, rather than one round trip to zarr's event loop to
    open each and one to write it (a tabulation of Adult writes 364 marginals of one unit a
    chunk: 4.5 ms each one at a time). The arrays are opened as ``group[name]`` opens them
    (their stored metadata, zarr's default configuration), so what is written is what those
    assignments write. Returns the zarr calls made."""
    calls = 0
    for batch in byte_batches(rows, lambda row: row[2].nbytes, WRITE_BYTES if budget is None else budget):
        sync(_write_rows(group, batch))
        calls += 1
    return calls


async def _write_rows(group: zarr.Group, rows: list[tuple[str, int, np.ndarray]]) -> None:
    prefix = f"{group.path}/" if group.path else ""

    async def write_one(name: str, start: int, values: np.ndarray) -> None:
        arr = await zarr.api.asynchronous.open_array(store=group.store, path=prefix + name, mode="r+", zarr_format=3)
        await arr.setitem(slice(start, start + values.shape[0]), values)

    await asyncio.gather(*(write_one(name, start, values) for name, start, values in rows))


def read_rows(arrays: Mapping[str, zarr.Array], where: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``{name: arrays[name][where[name]]}`` for every ``name`` of ``where``, read in one zarr
    call (concurrently) rather than one round trip to zarr's event loop each: the seal of a data
    store reads its chunks back to digest them (Adult's tabulation: 366 small arrays)."""
    async def read_all() -> list[Any]:
        return await asyncio.gather(*(arrays[name].async_array.getitem(selection) for name, selection in where.items()))

    return {name: np.asarray(values) for name, values in zip(where, sync(read_all()))} if where else {}


def node_attrs(group: zarr.Group) -> dict[str, dict[str, Any]]:
    """``{path: attrs}`` of every group and array under ``group`` (paths relative to it, as
    ``group.members(max_depth=None)`` names them; ``group`` itself not included), as each
    node's ``zarr.json`` states them (:func:`node_documents`)."""
    return {path: dict(doc.get("attributes") or {}) for path, doc in node_documents(group).items()}


def member_arrays(group: zarr.Group) -> list[tuple[str, zarr.Array]]:
    """``(path, array)`` of every array under ``group``, sorted by path: the arrays of
    ``group.members(max_depth=None)``, found from the ``zarr.json`` documents
    (:func:`node_documents`) and opened in one call (:func:`open_arrays`)."""
    paths = sorted(path for path, doc in node_documents(group).items() if doc.get("node_type") == "array")
    return list(open_arrays(group, paths).items())  # open_arrays keeps the order asked


def node_documents(group: zarr.Group) -> dict[str, dict[str, Any]]:
    """``{path: the parsed zarr.json}`` of every node under ``group`` (not ``group`` itself):
    a local store's files read straight (no round trips through zarr's event loop), another
    store's keys listed and read in one zarr call. ``group.members`` opens every node, parsing
    every array's metadata, one level at a time: ~1 s a call for a release of Adult's plan
    (1,400 nodes) under load, and a seal or a checked read walks the store twice. The walk does
    not enter an array's folder (its chunks' directories, one per chunk: a store of N units
    would cost every task that opens it O(N), the whole job O(N^2))."""
    store = group.store
    if isinstance(store, zarr.storage.LocalStore):
        top = Path(store.root) / group.path
        out = {}
        for folder, dirs, files in os.walk(top):
            if "zarr.json" in files and folder != str(top):
                with open(os.path.join(folder, "zarr.json"), "rb") as f:
                    doc = out[Path(folder).relative_to(top).as_posix()] = json.loads(f.read())
                if doc.get("node_type") == "array":
                    dirs.clear()  # an array has no nodes below it, only its chunks: not walked
        return out
    return sync(_node_documents(group))


async def _node_documents(group: zarr.Group) -> dict[str, dict[str, Any]]:
    prefix = f"{group.path}/" if group.path else ""
    keys = [key async for key in group.store.list_prefix(prefix)
            if key.endswith("/zarr.json") and key != f"{prefix}zarr.json"]
    docs = await asyncio.gather(*(group.store.get(key, prototype=default_buffer_prototype()) for key in keys))
    return {key[len(prefix):-len("/zarr.json")]: json.loads(doc.to_bytes()) for key, doc in zip(keys, docs)
            if doc is not None}


def is_staging(path: Path) -> bool:
    return STAGING_MARKER in path.name


def leftovers(path: Path) -> list[Path]:
    """Staging / set-aside siblings of ``path`` left by an interrupted writer."""
    parent = path.parent
    if not parent.is_dir():
        return []
    prefixes = (path.name + STAGING_MARKER, path.name + REPLACED_MARKER)
    return sorted(p for p in parent.iterdir() if p.name.startswith(prefixes))


def root_attrs_on_disk(path: Path) -> dict | None:
    """The root group's attrs read straight from ``zarr.json`` (None if not a zarr v3 group)."""
    meta = path / "zarr.json"
    try:
        doc = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("node_type") != "group" or doc.get("zarr_format") != 3:
        return None
    attrs = doc.get("attributes", {})
    return attrs if isinstance(attrs, dict) else None


def store_state(path: Path, fmt: str, kind: str) -> str:
    """What is at ``path`` for a writer of a store built in place and sealed (a release, an
    estimate; ``fmt`` its ``distfit_format``, ``kind`` its name in messages): ``"absent"``,
    ``"sealed"`` (``complete=true``) or ``"incomplete"``; FileExistsError for anything else."""
    if not (path.exists() or path.is_symlink()):
        return "absent"
    attrs = root_attrs_on_disk(path) if path.is_dir() else None
    if attrs is None or attrs.get("distfit_format") != fmt:
        raise FileExistsError(f"{path}: already exists and is not a distfit {kind} store; refusing to replace it")
    return "sealed" if attrs.get("complete") is True else "incomplete"


def check_store_kind(path: Path, fmt: str, kind: str) -> None:
    """Refuse (FileExistsError) to replace anything at ``path`` but a store of format ``fmt``
    (``move_into_place``'s ``check_target`` of a release or an estimate)."""
    if path.exists() and not (path.is_dir() and (root_attrs_on_disk(path) or {}).get("distfit_format") == fmt):
        raise FileExistsError(f"{path}: is not a distfit {kind} store; refusing to replace it")


def fsync_tree(root: Path, synced: Mapping[str, tuple[int, ...]] | None = None) -> None:
    """fsync every file and directory under ``root`` (directories best effort), but the files
    of ``synced`` (a path as ``os.path.join`` of ``root`` and its parts gives it: its
    :func:`file_signature` when it was fsynced) whose signature is unchanged: not written
    since (:class:`distfit.stores.release_chunks.ChunkSync`, a chunk's files fsynced as it
    lands: 1,715 of an estimate's 1,731 files at 1M PL94 units).

    The fsyncs run on a thread pool: one at a time costs milliseconds each (a journal commit),
    and a plan holds ~16 files per block.
    """
    files, dirs = [], []
    for dirpath, _dirnames, filenames in os.walk(root):
        dirs.append(Path(dirpath))
        files.extend(os.path.join(dirpath, fn) for fn in filenames)
    if synced:
        files = [file for file in files if file not in synced or synced[file] != file_signature(file)]
    with ThreadPoolExecutor(max_workers=min(32, max(1, len(files)))) as pool:
        list(pool.map(fsync_file, files))
        list(pool.map(fsync_dir, dirs))


def fsync_file(path: str) -> tuple[int, ...]:
    """fsync the file at ``path``; returns its :func:`file_signature` as fsynced."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        return _signature(os.fstat(fd))
    finally:
        os.close(fd)


def file_signature(path: str) -> tuple[int, ...] | None:
    """``(inode, size, mtime_ns, ctime_ns)`` of the file at ``path`` (None if it is not there):
    a replacement (a new inode), a change of size or a write a clock tick later changes it. A
    chunk's files are written once before its task reports it (a retried task rewrites the
    same bytes), so an fsynced chunk file with its signature unchanged is still on disk."""
    try:
        return _signature(os.stat(path))
    except OSError:
        return None


def _signature(stat: os.stat_result) -> tuple[int, ...]:
    return (stat.st_ino, stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns)


def utc_now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def move_into_place(staging: Path, final: Path, check_target: Callable[[Path], None], fsync: bool = True) -> None:
    """Rename a finished staging directory to ``final``, atomically for readers.

    A store already at ``final`` must pass ``check_target`` (which raises to refuse it); it is
    renamed aside first, the new store renamed in, and only then is the old one deleted (if the
    second rename fails the old store is put back). Shared by every store writer.
    """
    if final.exists() or final.is_symlink():
        check_target(final)
        aside = final.with_name(f"{final.name}{REPLACED_MARKER}{secrets.token_hex(6)}")
        os.rename(final, aside)
        try:
            os.rename(staging, final)
        except BaseException:
            os.rename(aside, final)
            raise
        if fsync:
            fsync_dir(final.parent)
        if aside.is_symlink():
            aside.unlink()
        else:
            shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(staging, final)
        if fsync:
            fsync_dir(final.parent)


def check_marked_dir(path: Path, marker: str, kind: str) -> None:
    """Raise FileExistsError unless the directory at ``path`` may be replaced by a ``kind``
    (``"report"``, ``"export"``): one holding ``marker`` (an earlier one, which wrote that file)
    or an empty one. Anything else - a file, a symlink, a directory of someone else's files - is
    refused, so an output directory never replaces what distfit did not write."""
    if path.is_symlink() or not path.is_dir():
        raise FileExistsError(f"{path}: exists and is not a directory; refusing to replace it")
    if (path / marker).is_file():
        return
    if any(path.iterdir()):
        raise FileExistsError(f"{path}: a non-empty directory that is not a distfit {kind} (no {marker} file); "
                              "refusing to replace it")


def check_format(path: Path, attrs: Mapping, expected: str, supported_version: int, error: type[Exception],
                 oldest: int = 1, rewrite: str = "") -> None:
    """Refuse a store whose ``distfit_format`` is not ``expected`` or whose ``format_version`` is
    invalid, newer than ``supported_version`` or older than ``oldest`` (``rewrite``: the command
    that writes it anew, named in the refusal); raises ``error`` naming ``path``. Shared by every
    store reader (plans, data stores, releases, estimates)."""
    fmt = attrs.get("distfit_format")
    if fmt != expected:
        raise error(f"{path}: distfit_format is {fmt!r}, not {expected!r}")
    version = attrs.get("format_version")
    if isinstance(version, bool) or not isinstance(version, int) or version < 1:
        raise error(f"{path}: invalid format_version {version!r}")
    if version > supported_version:
        raise error(
            f"{path}: format_version {version} is newer than this distfit supports ({supported_version}); upgrade distfit")
    if version < oldest:
        raise error(f"{path}: format_version {version} was written by an earlier distfit and is not fully covered by "
                    f"its checksum, so it is not read; write it anew with this distfit ({rewrite or 'distfit ' + expected})")


def open_store(path: str | os.PathLike, kind: str, error: type[Exception]) -> tuple[Path, zarr.Group, dict]:
    """Open the ``kind`` store (``"plan"``, ``"histograms"``, ``"release"``, ...) at ``path``
    read-only after the refusal checks every reader shares: not a staging directory, present
    (naming what an interrupted write left), a directory with a readable Zarr v3 ``zarr.json``,
    of format ``kind`` (:func:`check_format` is the caller's, which knows its version). Raises
    ``error`` naming the path; returns ``(path, group, root attrs)``."""
    p = Path(os.fspath(path))
    if is_staging(p):
        raise error(f"{p}: is the staging directory of an unfinished write, not a {kind} store")
    if not p.exists():
        left = leftovers(p)
        hint = f" (an interrupted write left {', '.join(x.name for x in left)})" if left else ""
        raise error(f"{p}: no such {kind} store{hint}")
    if not p.is_dir():
        raise error(f"{p}: not a directory (a {kind} store is a Zarr v3 group directory)")
    # zarr.json is parsed once, by zarr (a plan's holds its spec and certificate: 44 MB at 100
    # attributes of 10, every marginal up to 3-way, ~1 CPU-s a parse); read by hand only to
    # say why zarr refused it.
    try:
        group = zarr.open_group(store=str(p), mode="r", zarr_format=3)
    except Exception as exc:  # noqa: BLE001 - any failure to open is a refusal
        if root_attrs_on_disk(p) is None:
            raise error(f"{p}: not a Zarr v3 group (no readable zarr.json)") from None
        raise error(f"{p}: cannot open as a Zarr v3 group ({type(exc).__name__}: {exc})") from None
    return p, group, group.attrs.asdict()


#: The array of each unit's parent id (geography: a level of a multi-level run) in the data,
#: release and estimate stores, with the root attr ``parent_column`` naming its data column.
PARENT_IDS = "parent_ids"
