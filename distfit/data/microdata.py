"""Person-level microdata (CSV or Parquet) tabulated into a marginals store for a release.

``distfit tabulate SPEC.yaml --data people.csv --out DATA.zarr`` (and ``distfit release`` /
``distfit run`` given ``--data people.csv``) read one row per person: the spec's attribute
columns and, when the spec has ``units: {column: NAME}``, the unit column. Domains can be far
too large for full-domain histograms (14 Adult attributes: ~1e10 cells), and a release only
needs each plan block's marginal, so the tabulation stores, for every unit, the marginal counts
of each maximal query clique (:func:`query_cliques`) - the ``"marginals"`` store of
:mod:`distfit.stores.data` (the layout is documented there), written atomically like every data store
(:func:`distfit.stores.data.staged_store`).

Reading (never the whole file in memory)
----------------------------------------
* the source is recognised by its name (:func:`microdata_format`): ``.csv`` and ``.csv.gz``
  (read with ``dask.dataframe.read_csv``, blocks of :data:`BLOCKSIZE` bytes - one partition for
  gzip, which cannot be split - every column as text, no NA parsing: an empty field is the
  empty string), ``.parquet`` / ``.pq`` or a directory of Parquet files
  (``dask.dataframe.read_parquet`` with the same blocksize);
* attribute ``a`` reads the data column ``a.column`` (default its name) and maps the raw values
  to value codes with ``a.encode`` (:mod:`distfit.spec.model`: labels matched after stripping blanks,
  numeric ``bins``, ``recode``); encode runs once per distinct value of a partition, not per
  row. Unit ids are the unit column's values: an integer column gives int64 ids, anything else
  text ids stripped of surrounding blanks (UTF-8; an integral float is written without ``.0``).
  With no unit column every person is in one unit, id 0. A unit without people has no row in
  the microdata, so it is tabulated only when a geography lists it (``geography``,
  docs/geography.md: then with zero counts). With ``parent_column`` (a level of a multi-level
  run) each unit's parent id is read and stored too; two parents for one unit is bad input.

Two passes, one Dask task per partition or per chunk of units (on the given
``distributed.Client``, or in this process one task at a time with the synchronous scheduler):

1. per partition (the only pass over the source): validate every row, find the partition's
   distinct unit ids (sorted) and, for each clique, count people per (local unit, marginal
   cell) with numpy (``np.ravel_multi_index`` and ``bincount`` or ``np.unique`` on the key
   ``local_unit * cells + cell``); the sorted keys and counts and the local ids go to ``.npy``
   files under ``<staging>/_parts/``. The driver then merges the ids into the global sorted
   list (``np.unique`` over batches: memory O(units)) and maps each partition's local units to
   global indices (monotone, so each partition's keys stay sorted by global unit);
2. per chunk of ``chunk_units`` units: for each clique, sum the triples of the partitions that
   hold units of the chunk (``np.load(mmap_mode="r")`` and ``searchsorted`` on the sorted keys)
   into a dense (n, cells) int64 array and write whole zarr chunks, and the chunk's unit ids.

The source is read once (validation happens while counting; nothing is kept when a row is
bad). Memory per task: one partition - dask makes CSV partitions of one to two blocksizes, and
pandas needs a few times the partition's bytes to parse it - in pass 1, one chunk's (n, cells)
counts plus memory-mapped slices in pass 2; the driver holds the unit ids. The ``_parts``
directory is deleted before the store is sealed. On a cluster the workers read the source and
write into the staging directory, so both must be on a file system they share (as for the
release store).

Before a CSV file is read in full its start is checked (:func:`_sniff_csv`: at most
:data:`SNIFF_BYTES` bytes and :data:`SNIFF_ROWS` rows, with the row checks of pass 1,
:mod:`distfit.data.rows`), so a file that is not microdata of the spec (binary, not UTF-8, other
columns, junk rows) is refused in a moment, whatever its size.

Bad input (each a :class:`distfit.stores.data.DataError`, exit 2 on the command line; the staging
directory is removed, nothing is left at ``out``): a missing file, an empty file, a file that
cannot be read or parsed (``adult.csv: line 7: malformed CSV: expected 14 fields, saw 15``), a
missing attribute or unit column (the columns found are listed), a value not in an
attribute's domain (``adult.csv: line 17, column 'sex': value 'Mle' is not a value of sex
(values: Female, Male)``), a missing value, an empty or missing unit id, no data rows. The
first bad row in file order is reported: ``line N`` for CSV (the physical line, the header
being line 1; a quoted field spanning lines is not accounted for), ``row N`` (1-based data
row, files in dataset order) for Parquet. Line numbers are only computed on the error path,
from the row counts of the partitions before the bad one and, for CSV, one scan of the file
up to that point (blank lines are skipped like pandas does).
"""
from __future__ import annotations

import codecs
import functools
import gzip
import io
import math
import os
import shutil
import sys
import threading
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence, TextIO

import numpy as np
import pandas as pd
import pyarrow

from distfit.checks import check_integer
from distfit.runtime.placement import dask_dataframe, dask_runtime
from distfit.runtime.progress import LONG_STAGE_SECONDS, Progress
from distfit.data.geography import LevelUnits
from distfit.data.rows import RowCheck, check_rows, two_parents
from distfit.data.source_errors import failure_message, line_of_record, parser_problem
from distfit.data.synthetic import default_chunk_units
from distfit.spec.model import PipelineSpec
from distfit.spec.parse import load_spec
from distfit.stores.data import (
    MARGINALS_FORMAT,
    DataError,
    MarginalsWriter,
    cell_labels,
    create_marginals,
    read_marginals,
    staged_store,
    value_labels,
    write_marginals_attrs,
)

#: Bytes per CSV partition (and the target partition size for Parquet).
BLOCKSIZE = 64 * 2**20
CSV_SUFFIXES = (".csv", ".csv.gz")
PARQUET_SUFFIXES = (".parquet", ".pq")
PARTS = "_parts"
#: Largest clique marginal (cells) the tabulation accepts.
MAX_CLIQUE_CELLS = 1 << 22
#: Columns listed in a "missing column" message.
SHOW_COLUMNS = 40
#: The start of a CSV file checked before it is read in full (:func:`_sniff_csv`): at most this
#: many bytes (1 MiB: a header of thousands of columns fits) and data rows.
SNIFF_BYTES = 1 << 20
SNIFF_ROWS = 1000
#: Exceptions that mean the source itself cannot be read or parsed.
READ_ERRORS = (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeError, OSError, EOFError,
               zlib.error, pyarrow.ArrowException)

PathLike = str | os.PathLike

__all__ = [
    "BLOCKSIZE",
    "READ_ERRORS",
    "as_pipeline_spec",
    "check_source",
    "ensure_tabulated",
    "microdata_format",
    "query_cliques",
    "source_info",
    "tabulate_microdata",
    "tabulation_mismatch",
]


# --------------------------------------------------------------------------------------------
# the source


def microdata_format(path: PathLike) -> str | None:
    """``"csv"`` (``.csv``, ``.csv.gz``), ``"parquet"`` (``.parquet``, ``.pq``, or a directory
    holding Parquet files and no ``zarr.json``) or None (not microdata: a data store)."""
    name = os.fspath(path).lower().rstrip("/")
    if name.endswith(CSV_SUFFIXES):
        return "csv"
    if name.endswith(PARQUET_SUFFIXES):
        return "parquet"
    p = Path(os.fspath(path))
    if p.is_dir() and not (p / "zarr.json").exists():
        if any(f.is_file() and f.name.lower().endswith(PARQUET_SUFFIXES) for f in p.rglob("*")):
            return "parquet"
    return None


def source_info(path: PathLike) -> dict[str, Any]:
    """``{"path" (absolute), "format", "size" (bytes; a directory: all its files), "mtime"
    (seconds; a directory: its newest file)}`` of a microdata source; DataError if missing."""
    fmt = microdata_format(path)
    name = os.fspath(path)
    if fmt is None:
        raise DataError(f"{name}: not microdata (expected .csv, .csv.gz, .parquet, .pq or a directory "
                        "of Parquet files)")
    p = Path(name)
    try:
        if p.is_dir():
            stats = [p.stat()] + [f.stat() for f in sorted(p.rglob("*")) if f.is_file()]
            size = sum(st.st_size for st in stats[1:])
            mtime = max(st.st_mtime for st in stats)
        else:
            st = p.stat()
            size, mtime = st.st_size, st.st_mtime
    except FileNotFoundError:
        raise DataError(f"{name}: no such file") from None
    except OSError as error:
        raise DataError(f"{name}: cannot read ({error.strerror or error})") from None
    return {"path": os.path.abspath(name), "format": fmt, "size": int(size), "mtime": float(mtime)}


def check_source(spec: Any, source: PathLike) -> dict[str, Any]:
    """Refuse, before any work, a microdata source that cannot serve ``spec``: missing, empty,
    unreadable, or without one of the attribute or unit columns (:class:`DataError`). Reads
    only the header (CSV) or the schema (Parquet); values are checked by the tabulation.
    Returns :func:`source_info`."""
    info = source_info(source)
    _open_source(os.fspath(source), info["format"], as_pipeline_spec(spec), BLOCKSIZE)
    return info


def as_pipeline_spec(spec: Any) -> PipelineSpec:
    """``spec`` (a :class:`distfit.spec.model.PipelineSpec`), or the spec at that path."""
    if isinstance(spec, (str, os.PathLike)):
        spec = load_spec(spec)
    if not isinstance(spec, PipelineSpec):
        raise TypeError(f"spec: expected a PipelineSpec or a spec path, got {type(spec).__name__}")
    return spec


def query_cliques(spec: Any, cover: Iterable[Sequence[str]] = ()) -> list[tuple[str, ...]]:
    """The cliques a tabulation stores: the maximal sets among the spec's query cliques (its
    groups' attributes) and the attribute sets in ``cover`` (e.g. a plan's blocks), each in
    schema order, a set inside another dropped; ordered by their schema positions. A spec
    whose only group is the grand total gives ``[()]``."""
    spec = as_pipeline_spec(spec)
    spec.group_triples()  # a multi-level spec has no groups of its own: SpecError naming its levels
    order = {name: i for i, name in enumerate(spec.domain.names)}
    sets: list[frozenset[str]] = []
    for attributes in [group.attributes for group in spec.groups] + [tuple(c) for c in cover]:
        for name in attributes:
            if name not in order:
                raise ValueError(f"cliques: unknown attribute {name!r} (attributes: {', '.join(order)})")
        found = frozenset(attributes)
        if found not in sets:
            sets.append(found)
    maximal = [s for s in sets if not any(s < t for t in sets)]
    keyed = sorted((sorted(order[name] for name in s), s) for s in maximal)
    return [tuple(sorted(s, key=order.__getitem__)) for _, s in keyed]


# --------------------------------------------------------------------------------------------
# pass 1: one task per partition


@dataclass(frozen=True)
class _ScanJob(RowCheck):
    """What a partition task needs (small, picklable): the row checks and where the counts go."""

    parts_dir: str = ""
    cliques: tuple[tuple[int, ...], ...] = ()   # attribute positions per clique
    sizes: tuple[int, ...] = ()


def _count(keys: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted distinct ``keys`` (< ``size``) and how often each occurs (both int64)."""
    if size <= max(4 * keys.size, 1 << 16):
        counts = np.bincount(keys, minlength=size)
        present = np.flatnonzero(counts)
        return present.astype(np.int64), counts[present].astype(np.int64)
    found, counts = np.unique(keys, return_counts=True)
    return found.astype(np.int64), counts.astype(np.int64)


def _scan_partition(frame, index: int, job: _ScanJob) -> dict[str, Any]:
    """Pass 1 for partition ``index``: validate (:func:`distfit.data.rows.check_rows`), then
    write its ids and clique counts.

    Returns ``{"index", "rows", "units", "error"}``; ``error`` is None or ``{"row" (0-based in
    the partition), "column", "problem"}`` for the first bad row (and then nothing is written).
    """
    rows = int(len(frame))
    result: dict[str, Any] = {"index": index, "rows": rows, "units": 0, "error": None}
    if rows == 0:
        return result
    checked = check_rows(frame, job)
    if checked.first is not None:
        result["error"] = {"row": checked.first[0], "column": checked.first[1], "problem": checked.first[2]}
        return result
    codes, units, local_ids = checked.codes, checked.units, checked.local_ids
    parts = Path(job.parts_dir)
    np.save(parts / f"p{index}.ids.npy", local_ids)
    if job.parent_column is not None:
        np.save(parts / f"p{index}.parents.npy", checked.parent_ids[checked.parents[checked.first_rows]])
    for i, positions in enumerate(job.cliques):
        sizes = tuple(job.sizes[p] for p in positions)
        cells = math.prod(sizes)
        cell = (np.ravel_multi_index(tuple(codes[p] for p in positions), sizes).astype(np.int64)
                if positions else np.zeros(rows, np.int64))
        keys, counts = _count(units * cells + cell, len(local_ids) * cells)
        np.save(parts / f"p{index}.c{i}.keys.npy", keys)
        np.save(parts / f"p{index}.c{i}.counts.npy", counts)
    result["units"] = int(len(local_ids))
    return result


def _run_scans(ddf, job: _ScanJob, client, log: TextIO) -> tuple[dict[int, dict], tuple[int, Any] | None]:
    """Pass 1 over every partition: ``(results by partition, first failure)``; a failure is
    ``(partition, error dict or exception)``, the one of the lowest partition (later partitions
    are cancelled once a failure is known: :func:`distfit.runtime.cluster.compute_partitions`)."""
    parts = ddf.to_delayed()
    shown = Progress("tabulate", log, unit="partitions")
    done = 0
    # one partition has no progress line: say what the wait is, if it is long
    notice = threading.Timer(LONG_STAGE_SECONDS, print, ("distfit: tabulate: reading the data in one partition",),
                             {"file": log, "flush": True}) if len(parts) == 1 else None
    if notice is not None:
        notice.daemon = True
        notice.start()

    def progress() -> None:  # a line for more than one partition; ended if a failure cuts it short
        nonlocal done
        done += 1
        if len(parts) > 1:
            shown(done, len(parts))

    try:
        results, failure = dask_runtime().compute_partitions(client, _scan_partition, parts, (job,), errors=READ_ERRORS,
                                                             failure=lambda result: result["error"], on_done=progress)
    finally:
        if notice is not None:
            notice.cancel()
    if failure is not None and len(parts) > 1 and 0 < done < len(parts):
        print(file=log)
    return results, failure


# --------------------------------------------------------------------------------------------
# the start of a CSV file


def _sniff_csv(name: str, spec, parent_column: str | None) -> None:
    """Refuse, from its first :data:`SNIFF_BYTES` bytes alone, a CSV file that is not microdata
    of ``spec``: binary (a NUL byte), not UTF-8, no line break, a malformed header, a missing
    column, or a bad row among the first :data:`SNIFF_ROWS` (the message the whole pass would
    give for it). A junk file of gigabytes is refused in a moment instead of after a pass over
    all of it; a file whose start is good is left to the tabulation (a later bad row is found
    there). Never refuses a valid file: a record cut at the end of the sample is dropped, and a
    parse error the cut may have caused (an open quote) is left to the full reader."""
    opener = gzip.open if name.lower().endswith(".gz") else open
    try:
        with opener(name, "rb") as handle:
            head = handle.read(SNIFF_BYTES + 1)
    except READ_ERRORS as error:
        raise DataError(f"{name}: {parser_problem(error)[1]}") from None
    truncated = len(head) > SNIFF_BYTES
    head = head[:SNIFF_BYTES]
    if not head.strip():
        return  # empty: the reader's own message
    nul = head.find(b"\0")
    if nul >= 0:
        raise DataError(f"{name}: not a CSV text file (a NUL byte at byte {nul + 1}: binary data)")
    try:  # a character the sample cuts in two is no error (final=False)
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError as error:
        raise DataError(f"{name}: cannot read: not UTF-8 text (byte {error.start + 1})") from None
    if truncated:
        end = head.rfind(b"\n")
        if end < 0:
            raise DataError(f"{name}: not a CSV file of this spec: no line break in its first {SNIFF_BYTES} bytes")
        head = head[:end + 1]
    text = head.decode("utf-8")
    try:
        frame = pd.read_csv(io.StringIO(text), dtype=str, na_filter=False, keep_default_na=False,
                            nrows=SNIFF_ROWS)
    except pd.errors.EmptyDataError:
        return
    except pd.errors.ParserError as error:
        if truncated and '"' in text:
            return  # perhaps a quoted field the sample cut: the full reader decides
        local, problem = parser_problem(error)
        raise DataError(f"{name}: line {local}: {problem}" if local is not None else f"{name}: {problem}") from None
    _check_columns(name, [str(c) for c in frame.columns], spec, parent_column)
    if truncated and not len(frame):
        raise DataError(f"{name}: not a CSV file of this spec: no complete data row in its first {SNIFF_BYTES} bytes")
    check = RowCheck(attributes=tuple(spec.attributes), columns=tuple(a.data_column for a in spec.attributes),
                     unit_column=spec.units.column if spec.units is not None else None,
                     integer_ids=spec.units is None, parent_column=parent_column)
    first = check_rows(frame, check).first if len(frame) else None
    if first is not None:
        line = line_of_record(head.splitlines(keepends=True), first[0])
        where = f"line {line}" if line is not None else f"data row {first[0] + 1}"
        raise DataError(f"{name}: {where}, column {first[1]!r}: {first[2]}")


# --------------------------------------------------------------------------------------------
# reading


def _open_source(name: str, fmt: str, spec, blocksize: int | str, parent_column: str | None = None):
    """A lazy dask DataFrame of the needed columns, whether unit ids are integers and whether
    parent ids (``parent_column``'s) are; DataError for an unreadable source or missing columns."""
    if fmt == "csv":
        _sniff_csv(name, spec, parent_column)
    try:
        if fmt == "csv":
            gz = name.lower().endswith(".gz")
            ddf = dask_dataframe().read_csv(name, dtype=str, na_filter=False, keep_default_na=False, encoding="utf-8",
                                            blocksize=None if gz else blocksize, compression="gzip" if gz else None)
        else:
            ddf = dask_dataframe().read_parquet(name, blocksize=blocksize)
    except READ_ERRORS as error:
        if isinstance(error, pd.errors.EmptyDataError):
            raise DataError(f"{name}: empty file (no header, no rows)") from None
        local, problem = parser_problem(error)
        if fmt == "parquet":
            problem = problem.replace("cannot read (", "cannot read as Parquet (", 1)
        raise DataError(f"{name}: line {local}: {problem}" if local is not None and fmt == "csv"
                        else f"{name}: {problem}") from None
    ddf = ddf[_check_columns(name, [str(c) for c in ddf.columns], spec, parent_column)]

    def integer(column: str | None) -> bool:
        if column is None:
            return False
        dtype = ddf.dtypes[column]
        return bool(pd.api.types.is_integer_dtype(dtype) and not pd.api.types.is_bool_dtype(dtype))

    return ddf, integer(spec.units.column if spec.units is not None else None), integer(parent_column)


def _check_columns(name: str, found: Sequence[str], spec, parent_column: str | None) -> list[str]:
    """The columns the tabulation reads (unit, parent, attributes' data columns), each in
    ``found``; DataError listing the missing ones and the columns found."""
    wanted: list[tuple[str, str]] = [(a.data_column, f"attribute {a.name}") for a in spec.attributes]
    if spec.units is not None:
        wanted.insert(0, (spec.units.column, "the unit column"))
    if parent_column is not None:
        wanted.insert(1, (parent_column, "the parent unit column"))
    missing = [f"{column!r} ({role})" for column, role in wanted if column not in found]
    if missing:
        shown = ", ".join(found[:SHOW_COLUMNS]) + (f", ... ({len(found)} columns)" if len(found) > SHOW_COLUMNS else "")
        raise DataError(f"{name}: missing column{'s' if len(missing) > 1 else ''} {', '.join(missing)}; "
                        f"columns found: {shown or 'none'}")
    return list(dict.fromkeys(column for column, _ in wanted))


# --------------------------------------------------------------------------------------------
# pass 2: one task per chunk of units


def _unit_index(parts: Path, results: dict[int, dict], integer: bool,
                universe: np.ndarray | None = None) -> tuple[np.ndarray, list[tuple[int, int, int]]]:
    """The sorted global unit ids, and ``(partition, first, last global unit)`` per partition
    with people (each partition's local-to-global map saved as ``p<k>.units.npy``). With
    ``universe`` (a geography's units, sorted, in the ids' dtype) the global ids are those, and
    a unit with people that it does not list is refused (:class:`_NotListed`)."""
    empty = np.zeros(0, np.int64 if integer else "S1")
    ids, pending, pending_size = empty, [], 0
    with_people = [k for k in sorted(results) if results[k]["units"]]
    if universe is not None:
        ids = universe
    else:
        for k in with_people:
            local = np.load(parts / f"p{k}.ids.npy")
            pending.append(local)
            pending_size += local.size
            if pending_size > 2 * ids.size + (1 << 20):
                ids, pending, pending_size = np.unique(np.concatenate([ids] + pending)), [], 0
        if pending:
            ids = np.unique(np.concatenate([ids] + pending))
    ranges = []
    for k in with_people:
        local = np.load(parts / f"p{k}.ids.npy")
        index = np.searchsorted(ids, local).astype(np.int64)
        if universe is not None:
            missing = np.flatnonzero((index >= ids.size) | (ids[np.minimum(index, ids.size - 1)] != local))
            if missing.size:
                raise _NotListed(local[missing[0]])
        np.save(parts / f"p{k}.units.npy", index)
        ranges.append((k, int(index[0]), int(index[-1])))
    return ids, ranges


class _NotListed(Exception):
    """A unit with people that the geography does not list (its id)."""

    def __init__(self, unit: Any) -> None:
        super().__init__(unit)
        self.unit = unit


def _parent_index(parts: Path, partitions: Sequence[int], ids: np.ndarray, job: _ScanJob, name: str,
                  listed: np.ndarray | None = None, geography_file: str | None = None) -> np.ndarray:
    """Each global unit's parent id (the partitions' ``p<k>.parents.npy`` by ``p<k>.units.npy``);
    DataError naming the unit, the parent column and both parents when two partitions disagree.
    With ``listed`` (the geography's parents) those are the parents, and a unit whose people
    name another is a DataError naming the unit, both parents and ``geography_file``."""
    parents = np.zeros(ids.size, np.int64 if job.integer_parents else "S1") if listed is None else listed
    seen = np.zeros(ids.size, dtype=bool)
    for k in partitions:
        index = np.load(parts / f"p{k}.units.npy")
        local = np.load(parts / f"p{k}.parents.npy")
        if listed is not None:
            clash = np.flatnonzero(listed[index] != local)
            if clash.size:
                unit = index[clash[0]]
                raise DataError(f"{name}: column {job.parent_column!r}: unit {_shown(ids[unit])} of "
                                f"{job.unit_column!r} has people in {_shown(local[clash[0]])}, but "
                                f"{geography_file} puts it in {_shown(listed[unit])}")
            continue
        if local.dtype.itemsize > parents.dtype.itemsize:
            parents = parents.astype(local.dtype)
        clash = np.flatnonzero(seen[index] & (parents[index] != local))
        if clash.size:
            unit = index[clash[0]]
            raise DataError(f"{name}: column {job.parent_column!r}: "
                            + two_parents(ids[unit], job.unit_column, parents[unit], local[clash[0]]))
        parents[index] = local
        seen[index] = True
    return parents


def _shown(value: Any) -> str:
    value = value.item() if isinstance(value, np.generic) else value
    return repr(value.decode("utf-8", "replace")) if isinstance(value, bytes) else repr(value)


@dataclass(frozen=True)
class _MergeJob:
    """What every pass-2 task of one tabulation shares (:func:`_merge_chunk`): the staging
    ``store`` and the ``parts_dir`` of pass 1's partitions, each marginal's ``cells``, the
    ``units`` in ``chunk_units`` chunks, whether ids (``integer_ids``) and parents
    (``parents``, ``integer_parents``) are integers or present."""

    store: str
    parts_dir: str
    cells: tuple[int, ...]
    units: int
    chunk_units: int
    integer_ids: bool
    parents: bool = False              # write parent_ids (parents.npy)
    integer_parents: bool = False


def _merge_chunk(job: _MergeJob, chunk: int, partitions: tuple[int, ...]) -> int:
    """Pass 2 for chunk ``chunk``: sum the partitions' counts of its units into whole chunks
    of every ``marginals/<i>`` and write its unit ids (:class:`distfit.stores.data.MarginalsWriter`).
    Returns the units written."""
    parts = Path(job.parts_dir)
    start = chunk * job.chunk_units
    stop = min(start + job.chunk_units, job.units)
    n = stop - start
    writer = MarginalsWriter(job.store)
    maps = {k: np.load(parts / f"p{k}.units.npy", mmap_mode="r") for k in partitions}
    def counted():  # clique by clique, as write_marginals writes them (a few in one zarr call)
        for i, cells in enumerate(job.cells):
            dense = np.zeros(n * cells, dtype=np.int64)
            for k in partitions:
                index = maps[k]
                lo, hi = np.searchsorted(index, [start, stop])
                if lo == hi:
                    continue
                keys = np.load(parts / f"p{k}.c{i}.keys.npy", mmap_mode="r")
                a, b = np.searchsorted(keys, [lo * cells, hi * cells])
                found = np.asarray(keys[a:b])
                local = found // cells
                rows = np.asarray(index[local]) - start
                counts = np.load(parts / f"p{k}.c{i}.counts.npy", mmap_mode="r")
                dense[rows * cells + (found - local * cells)] += np.asarray(counts[a:b])
            yield i, dense.reshape(n, cells)

    writer.write_marginals(start, counted())
    ids = np.asarray(np.load(parts / "ids.npy", mmap_mode="r")[start:stop])
    writer.write_unit_ids(start, ids if job.integer_ids else np.char.decode(ids, "utf-8"))
    if job.parents:
        parents = np.asarray(np.load(parts / "parents.npy", mmap_mode="r")[start:stop])
        writer.write_parent_ids(start, parents if job.integer_parents else np.char.decode(parents, "utf-8"))
    return n


# --------------------------------------------------------------------------------------------
# the driver


def tabulate_microdata(spec: Any, source: PathLike, out: PathLike, *, client=None,
                       chunk_units: int | None = None, overwrite: bool = False, fsync: bool = True,
                       cover: Iterable[Sequence[str]] = (), blocksize: int | str = BLOCKSIZE,
                       parent_column: str | None = None, geography: LevelUnits | None = None,
                       log: TextIO | None = None) -> Path:
    """Tabulate the microdata at ``source`` for ``spec`` into a marginals store at ``out``.

    ``spec``: a :class:`distfit.spec.model.PipelineSpec` or a spec path. ``client``: a
    ``distributed.Client`` to run the tasks on, or a function of no arguments that returns one
    (or None), called once at most, when a pass has tasks for it (a caller's cluster then starts while
    the source is read); None: in this process. Decision: a pass of one task (a one-partition
    scan, the merge of one chunk) runs here even with a client: no cluster can share one task
    (Adult: benchmarks/README.md, "Issue 31 point 3: Adult's data stage"); the same store.
    Its four steps (scan, layout, merge, seal) show on a progress line once past 2 s.
    ``chunk_units``: units per chunk (default: up to 4096, at most 16 MiB of the largest
    clique's counts). ``cover``: attribute sets that must each lie in a stored clique (a plan's
    blocks; :func:`query_cliques`). ``blocksize``: bytes per partition (tests use small ones).
    ``parent_column``: the unit column of the coarser level the units lie in (a multi-level run):
    each unit's parent id is stored as ``parent_ids`` (:mod:`distfit.stores.data`); a unit whose
    people name two parents is a DataError naming both. ``geography``: the level's units
    (:class:`distfit.data.geography.LevelUnits`), each a unit of the store, empty ones included,
    with its parent; a unit with people it does not list, or another parent, is a DataError.
    Returns the path. Raises DataError (bad input), FileExistsError, ValueError (bad arguments)."""
    log = log or sys.stderr
    spec = as_pipeline_spec(spec)
    name = os.fspath(source)
    info = source_info(source)
    fmt = info["format"]
    if chunk_units is not None:
        chunk_units = check_integer(chunk_units, "chunk_units", 1)
    domain = spec.domain
    cliques = query_cliques(spec, cover)
    positions = tuple(tuple(domain.index(a) for a in clique) for clique in cliques)
    cells = tuple(math.prod(domain.sizes[p] for p in pos) for pos in positions)
    if max(cells) > MAX_CLIQUE_CELLS:
        raise ValueError(f"a clique of {max(cells)} cells is more than {MAX_CLIQUE_CELLS} to tabulate")
    if microdata_format(name) == "csv" and Path(name).is_dir():
        raise DataError(f"{name}: is a directory, not a CSV file")
    if parent_column is not None and (spec.units is None or parent_column == spec.units.column):
        raise ValueError(f"parent_column {parent_column!r}: needs a unit column other than it "
                         f"(the spec's is {spec.units.column if spec.units is not None else None!r})")
    steps = Progress("tabulate steps", log, unit="steps", after=LONG_STAGE_SECONDS)  # of 4 (docstring)
    ddf, integer_ids, integer_parents = _open_source(name, fmt, spec, blocksize, parent_column)

    with staged_store(out, MARGINALS_FORMAT, overwrite=overwrite, fsync=fsync) as (staging, group):
        parts = staging / PARTS
        parts.mkdir()
        job = _ScanJob(parts_dir=str(parts), attributes=tuple(spec.attributes),
                       columns=tuple(a.data_column for a in spec.attributes),
                       unit_column=spec.units.column if spec.units is not None else None,
                       integer_ids=integer_ids or spec.units is None, cliques=positions,
                       sizes=tuple(domain.sizes), parent_column=parent_column, integer_parents=integer_parents)
        connect = functools.cache(client) if callable(client) and not hasattr(client, "submit") else lambda: client
        # a pass of one task runs here: no cluster can share it, a round trip would only add to it
        results, failure = _run_scans(ddf, job, connect() if ddf.npartitions > 1 else None, log)
        steps(1, 4)
        if failure is not None:
            raise DataError(failure_message(name, fmt, results, failure))
        rows = sum(r["rows"] for r in results.values())
        if rows == 0:
            raise DataError(f"{name}: no data rows (a header only)" if fmt == "csv" else f"{name}: no data rows")
        universe, listed = (None, None) if geography is None else geography.typed(job.integer_ids, integer_parents)
        try:
            ids, ranges = _unit_index(parts, results, job.integer_ids, universe)
        except _NotListed as missing:
            raise DataError(f"{name}: unit {_shown(missing.unit)} of column {job.unit_column!r} has people but is "
                            f"not a unit of level {geography.level!r} in {geography.named}") from None
        if parent_column is not None:
            np.save(parts / "parents.npy", _parent_index(parts, [k for k, _, _ in ranges], ids, job, name,
                                                         listed, None if geography is None else geography.named))
        units = int(ids.size)
        chunk_units = chunk_units or default_chunk_units(max(cells), units)
        values = value_labels(spec)
        create_marginals(group, cells, units, chunk_units, job.integer_ids,
                         labels=[cell_labels(clique, values) for clique in cliques],
                         integer_parents=None if parent_column is None else integer_parents,
                         progress=Progress("tabulate layout", log, unit="marginals", after=LONG_STAGE_SECONDS))
        steps(2, 4)
        np.save(parts / "ids.npy", ids)
        del ids
        merge = _MergeJob(store=str(staging), parts_dir=str(parts), cells=cells, units=units,
                          chunk_units=chunk_units, integer_ids=job.integer_ids,
                          parents=parent_column is not None, integer_parents=integer_parents)
        calls = []
        for chunk, start in enumerate(range(0, units, chunk_units)):
            stop = start + chunk_units
            chunk_parts = tuple(k for k, first, last in ranges if first < stop and last >= start)
            calls.append((str(chunk), (merge, chunk, chunk_parts)))
        merger = connect() if len(calls) > 1 else None
        if merger is None:
            for _label, args in calls:
                _merge_chunk(*args)
        else:
            for _label, _units in dask_runtime().run_tasks(merger, _merge_chunk, calls, "tabulate-chunk"):
                pass
        steps(3, 4)
        shutil.rmtree(parts)
        write_marginals_attrs(group, domain=domain, spec_hash=spec.spec_hash, units=units,
                              chunk_units=chunk_units, cliques=cliques,
                              source={**info, "rows": rows, **({} if geography is None else {"geography": geography.record()})},
                              total_people=rows, parent_column=parent_column)
    steps(4, 4)  # sealed
    return Path(os.fspath(out))


def tabulation_mismatch(store: PathLike, spec: Any, source: PathLike,
                        cover: Iterable[Sequence[str]] = (), parent_column: str | None = None,
                        geography: LevelUnits | None = None) -> str | None:
    """None when the marginals store at ``store`` was tabulated for ``spec`` (same spec hash)
    from ``source`` as it is now (same absolute path, format, size and mtime), with the parent
    ids of ``parent_column`` (or none, for None) and the units of ``geography`` (the same
    record, or none), and holds a clique for every set in ``cover``; otherwise why not (one
    phrase)."""
    spec = as_pipeline_spec(spec)
    try:
        data = read_marginals(store)
    except DataError as error:
        return str(error)
    if data.attrs.get("spec_hash") != spec.spec_hash:
        return f"spec hash {data.attrs.get('spec_hash')} recorded, this spec has {spec.spec_hash}"
    recorded, now = data.attrs.get("source") or {}, source_info(source)
    for key in ("path", "format", "size", "mtime"):
        if recorded.get(key) != now[key]:
            return f"the source's {key} differs ({recorded.get(key)!r} recorded, {now[key]!r} now)"
    if data.parent_column != parent_column:
        return f"parent ids of column {data.parent_column!r} stored, {parent_column!r} wanted"
    wanted = None if geography is None else geography.record()
    if recorded.get("geography") != wanted:
        return (f"the units of geography {(recorded.get('geography') or {}).get('digest')} recorded, "
                f"{None if wanted is None else wanted['digest']} wanted")
    for attributes in cover:
        try:
            data.clique_for(attributes)
        except DataError:
            return f"no stored marginal holds {list(attributes)}"
    return None


def ensure_tabulated(spec: Any, source: PathLike, out: PathLike, *, cover: Iterable[Sequence[str]] = (),
                     client=None, replace: bool = False, fsync: bool = True,
                     blocksize: int | str = BLOCKSIZE, parent_column: str | None = None,
                     geography: LevelUnits | None = None, log: TextIO | None = None) -> tuple[Path, str]:
    """Reuse the marginals store at ``out`` if it matches (:func:`tabulation_mismatch`, with
    ``parent_column`` and ``geography``), else tabulate ``source`` into it (:func:`tabulate_microdata`). Returns
    ``(path, "reused" | "tabulated")``. A store that does not match is replaced only with
    ``replace`` (and only if it is a marginals store); otherwise DataError."""
    log = log or sys.stderr
    cover = [tuple(c) for c in cover]
    path = Path(os.fspath(out))
    replacing = False
    if path.exists() or path.is_symlink():
        reason = tabulation_mismatch(path, spec, source, cover, parent_column, geography)
        if reason is None:
            print(f"distfit: reusing the data tabulated at {path} (same source and spec)", file=log)
            return path, "reused"
        if not replace:
            raise DataError(f"{path}: holds other tabulated data than {os.fspath(source)} for this spec "
                            f"({reason})")
        print(f"distfit: tabulating again into {path} ({reason})", file=log)
        replacing = True
    tabulate_microdata(spec, source, path, client=client, overwrite=replacing, fsync=fsync, cover=cover,
                       blocksize=blocksize, parent_column=parent_column, geography=geography, log=log)
    return path, "tabulated"
