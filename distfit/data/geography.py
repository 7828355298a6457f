"""The geography of a multi-level run as data: every unit of every level, with its parent, empty units included.

A census publishes a table for every unit of every level, the ones nobody lives in too. The
microdata cannot say which units exist (a unit without people has no row), so a multi-level run
takes the list of units beside it (``distfit run SPEC --data PEOPLE --geography FILE``,
docs/geography.md), or makes it with its synthetic people (every synthesised unit, empty or
not: :func:`synthetic_geography_table`).

The file (CSV, UTF-8, a header line): one row per unit of every level of the spec that has a
unit column, with the columns :data:`COLUMNS`:

* ``level``: the level's name (``state``, ``county``);
* ``unit``: the unit's id as it appears in the level's unit column of the microdata;
* ``parent``: the id of the unit of the nearest coarser level with a unit column that the
  unit lies in; empty for the coarsest such level (its parent is the one population above).

Every level with a unit column is listed, each unit once; every parent is a unit of the parent
level; every unit of the microdata is listed (:func:`distfit.data.microdata.tabulate_microdata`
refuses a unit that is not, naming it), and a unit's people name the parent the file gives it.
Bad input is a :class:`distfit.stores.data.DataError` naming the file, the line and the problem,
raised before any work.

``digest`` (BLAKE3 of the canonical table: the levels in spec order, each level's ids sorted
with their parents; :func:`_digest`) identifies the geography in a tabulation's recorded source, so a run
tabulates again when the geography changes.
"""
from __future__ import annotations

import csv
import dataclasses
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from distfit.data.synthetic import synthetic_geography
from distfit.stores.checksum import chunk_digest
from distfit.stores.data import DataError
from distfit.stores.atomic import write_text_atomic

__all__ = ["COLUMNS", "Geography", "LevelUnits", "nested_geography", "read_geography", "synthetic_geography_file", "synthetic_geography_table",
           "write_geography"]

#: The columns of a geography file, in order.
COLUMNS = ("level", "unit", "parent")
#: Characters of an id at most (longer is not an id: a file of something else).
MAX_ID_LENGTH = 256


@dataclass(frozen=True, eq=False)
class LevelUnits:
    """The units of one level: ``ids`` (str, sorted, distinct) and each unit's ``parents`` (str,
    aligned with ``ids``; None for the coarsest level with a unit column); ``column`` is the
    level's unit column, ``parent_column`` the parent level's (None with ``parents``); ``path``
    and ``digest`` are the whole geography's (:class:`Geography`)."""

    level: str
    column: str
    ids: np.ndarray
    parent_column: str | None
    parents: np.ndarray | None
    path: str | None = None
    digest: str = ""

    @property
    def named(self) -> str:
        """How messages name the geography: its file, or "the synthetic geography"."""
        return self.path or "the synthetic geography"

    def typed(self, integer_ids: bool, integer_parents: bool) -> tuple[np.ndarray, np.ndarray | None]:
        """The ids (sorted) and parents in the dtypes of a tabulation's ids: int64 where the
        microdata's column is integer (``integer_ids``, ``integer_parents``), else UTF-8 bytes
        (sorted as the scan's ids sort). DataError naming the file when an id is not an integer
        there, or when two ids read as the same integer (``007`` and ``7``)."""
        ids = _typed(self.ids, integer_ids, f"unit of level {self.level!r}", self.named)
        parents = (None if self.parents is None else
                   _typed(self.parents, integer_parents, f"parent in level {self.level!r}", self.named))
        order = np.argsort(ids, kind="stable")
        ids = ids[order]
        same = np.flatnonzero(ids[1:] == ids[:-1])
        if same.size:
            raise DataError(f"{self.named}: level {self.level!r}: two units read as the same id {ids[same[0]]!r}")
        return ids, None if parents is None else parents[order]

    def record(self) -> dict[str, Any]:
        """What a tabulation of the level records of its geography (the source's ``geography``)."""
        return {"path": self.path, "digest": self.digest, "level": self.level, "units": int(self.ids.size)}


@dataclass(frozen=True, eq=False)
class Geography:
    """Every level with a unit column (spec order) and its units; ``path`` the file it was read
    from or written to; ``digest`` that of the canonical table (module docstring)."""

    levels: tuple[LevelUnits, ...]
    digest: str
    path: str | None = None

    def of(self, level: str) -> LevelUnits | None:
        """The units of ``level``; None for a level without a unit column."""
        return next((units for units in self.levels if units.level == level), None)



def _typed(values: np.ndarray, integer: bool, what: str, name: str) -> np.ndarray:
    """``values`` (str) as int64 (``integer``) or UTF-8 bytes; DataError for a non-integer."""
    if not integer:
        return np.char.encode(values, "utf-8")
    try:
        return values.astype(np.int64)
    except (ValueError, OverflowError):
        bad = next(v for v in values.tolist() if not v.lstrip("+-").isdigit())
        raise DataError(f"{name}: {what} {bad!r} is not an integer id, as the microdata's column is") from None


def _unit_levels(spec: Any) -> list[tuple[str, str, str | None]]:
    """``(level, unit column, parent column)`` of every level with a unit column, spec order."""
    out, above = [], None
    for level in spec.levels:
        if level.units is not None:
            out.append((level.name, level.units.column, above))
            above = level.units.column
    return out


def _utf8(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each string's UTF-8 length (uint64) and the strings' UTF-8 bytes end to end (uint8): Arrow's
    layout of ``values`` (str), made without a Python loop."""
    if not values.size:
        return np.zeros(0, np.uint64), np.zeros(0, np.uint8)
    array = pa.array(values, pa.large_string())
    array = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
    _, offsets, data = array.buffers()
    offsets = np.frombuffer(offsets, dtype=np.int64)[array.offset:array.offset + len(array) + 1]
    content = np.frombuffer(data, dtype=np.uint8)[offsets[0]:offsets[-1]] if data is not None else np.zeros(0, np.uint8)
    return np.diff(offsets).astype(np.uint64), content


def _digest(levels: tuple[LevelUnits, ...]) -> str:
    """The geography's digest: the stores' chunk digest (:func:`distfit.stores.checksum.chunk_digest`,
    BLAKE3) of the chunk digests of each level's sorted ids and parents, in spec order (hex),
    each given as its strings' UTF-8 lengths and bytes (:func:`_utf8`: 8M ids in a second)."""
    parts = [chunk_digest(f"{units.level}/{what}/{part}", 0, array)
             for units in levels
             for what, values in (("ids", units.ids),
                                  ("parents", units.parents if units.parents is not None else np.zeros(0, str)))
             for part, array in zip(("lengths", "utf8"), _utf8(values))]
    return chunk_digest("geography", 0, np.frombuffer(b"".join(parts), dtype=np.uint8)).hex()


def _strings(array: pa.ChunkedArray) -> np.ndarray:
    """A string column as numpy str; ids of one width in ASCII (GEOIDs, the synthetic ids) go
    through their bytes, without a Python object per id."""
    array = array.combine_chunks().cast(pa.large_string())
    lengths = pc.utf8_length(array)
    width = pc.min_max(lengths).as_py()
    if len(array) and width["min"] == width["max"] and width["min"] > 0 and pc.all(pc.string_is_ascii(array)).as_py():
        _, offsets, data = array.buffers()
        first = int(np.frombuffer(offsets, dtype=np.int64)[array.offset])
        raw = np.frombuffer(data, dtype=np.uint8)[first:first + len(array) * width["min"]]
        return raw.view(f"S{width['min']}").astype(f"U{width['min']}")
    return array.to_numpy(zero_copy_only=False).astype(str)


def _built(spec: Any, table: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], name: str,
           path: str | None) -> Geography:
    """Check ``table`` (``{level: (ids, parents, line numbers)}``) against the spec's levels and
    build the geography; DataError naming ``name`` and the first problem."""
    levels = []
    for level, column, parent_column in _unit_levels(spec):
        if level not in table:
            raise DataError(f"{name}: level {level!r} (unit column {column!r}) has no units listed; every level "
                            "with a unit column is listed, each unit once")
        ids, parents, lines = table[level]
        if not np.all(ids[1:] >= ids[:-1]):  # a file written by distfit is sorted already
            order = np.argsort(ids, kind="stable")
            ids, parents, lines = ids[order], parents[order], lines[order]
        repeated = np.flatnonzero(ids[1:] == ids[:-1])
        if repeated.size:
            raise DataError(f"{name}: line {int(lines[repeated[0] + 1])}: unit {str(ids[repeated[0]])!r} of level "
                            f"{level!r} is listed twice (first on line {int(lines[repeated[0]])})")
        if parent_column is None:
            given = np.flatnonzero(parents != "")
            if given.size:
                raise DataError(f"{name}: line {int(lines[given[0]])}: level {level!r} is the coarsest with a unit "
                                f"column; its units have no parent (the parent column is empty)")
            levels.append(LevelUnits(level, column, ids, None, None))
            continue
        above = levels[-1]
        at = np.minimum(np.searchsorted(above.ids, parents), max(above.ids.size - 1, 0))
        unknown = np.flatnonzero((above.ids.size == 0) | (above.ids[at] != parents))
        if unknown.size:
            first = unknown[0]
            problem = "no parent" if parents[first] == "" else f"parent {str(parents[first])!r}, not a unit of level {above.level!r}"
            raise DataError(f"{name}: line {int(lines[first])}: unit {str(ids[first])!r} of level {level!r} has {problem}")
        levels.append(LevelUnits(level, column, ids, parent_column, parents))
    unknown_levels = sorted(set(table) - {units.level for units in levels})
    if unknown_levels:
        level = unknown_levels[0]
        raise DataError(f"{name}: line {int(table[level][2][0])}: level {level!r} is not a level of spec "
                        f"{spec.name!r} with a unit column ({', '.join(u.level for u in levels) or 'none'})")
    return _located(tuple(levels), _digest(tuple(levels)), path)


def _located(levels: tuple[LevelUnits, ...], digest: str, path: str | None) -> Geography:
    return Geography(tuple(dataclasses.replace(units, path=path, digest=digest) for units in levels), digest, path)


def _header(name: str) -> None:
    """Check the first line of the geography file ``name``; DataError naming the problem."""
    try:
        with open(name, "rb") as handle:
            first = handle.readline()
    except OSError as error:
        raise DataError(f"{name}: cannot read the geography file ({error.strerror or error})") from None
    try:
        header = next(csv.reader([first.decode("utf-8-sig")]), None)
    except (UnicodeError, csv.Error) as error:
        raise DataError(f"{name}: line 1: not a CSV geography file ({error})") from None
    if not header:
        raise DataError(f"{name}: empty file; a geography file has the header {','.join(COLUMNS)}")
    if tuple(h.strip() for h in header) != COLUMNS:
        raise DataError(f"{name}: line 1: header {','.join(header)!r}; a geography file has the header "
                        f"{','.join(COLUMNS)}")


def _read_rows(name: str) -> pa.Table:
    """The rows under the header (three string columns), read by pyarrow's CSV reader in one
    thread (so an invalid row is the first one in the file); DataError naming the line of a row
    of another width or of bytes that are not UTF-8."""
    invalid: list[Any] = []

    def refuse(row: Any) -> str:
        invalid.append(row)
        return "error"

    try:
        return pacsv.read_csv(
            name, read_options=pacsv.ReadOptions(column_names=list(COLUMNS), skip_rows=1, use_threads=False,
                                                 block_size=1 << 24),
            parse_options=pacsv.ParseOptions(invalid_row_handler=refuse, ignore_empty_lines=False),
            convert_options=pacsv.ConvertOptions(column_types={c: pa.string() for c in COLUMNS},
                                                 strings_can_be_null=False, quoted_strings_can_be_null=False))
    except (pa.ArrowInvalid, OSError, UnicodeError) as error:
        if invalid:
            row = invalid[0]
            raise DataError(f"{name}: line {row.number}: {row.actual_columns} fields, expected {len(COLUMNS)} "
                            f"({','.join(COLUMNS)})") from None
        found = re.search(r"Row #(\d+)", str(error))
        where = f" line {found.group(1)}:" if found else ""
        reason = "bytes that are not UTF-8" if "UTF8" in str(error) else str(error).splitlines()[0]
        raise DataError(f"{name}:{where} not a CSV geography file ({reason})") from None


def read_geography(path: str | os.PathLike, spec: Any) -> Geography:
    """The geography file at ``path`` (module docstring) for the multi-level ``spec``; DataError
    (one line: the file, the line, the problem) for a missing or unreadable file, a header
    other than :data:`COLUMNS`, a row of another width, an empty or overlong id, a level the
    spec has not, a level missing, a unit listed twice, a parent that is not a unit of the
    parent level, or a parent given to the coarsest level.

    Read by pyarrow's CSV reader (8M rows in seconds) and checked with array operations; a row
    of three empty fields reads as the blank line it looks like (skipped), and line numbers
    count physical lines (an id may not hold a line break)."""
    name = os.fspath(path)
    _header(name)
    rows = _read_rows(name)
    lines = np.arange(rows.num_rows, dtype=np.int64) + 2
    level, unit, parent = (pc.utf8_trim_whitespace(rows.column(c)) for c in COLUMNS)
    blank = np.asarray(pc.and_(pc.and_(pc.equal(level, ""), pc.equal(unit, "")), pc.equal(parent, "")))
    if blank.any():
        keep = pa.array(~blank)
        level, unit, parent, lines = level.filter(keep), unit.filter(keep), parent.filter(keep), lines[~blank]
    empty = np.flatnonzero(np.asarray(pc.equal(unit, "")))
    if empty.size:
        raise DataError(f"{name}: line {int(lines[empty[0]])}: empty unit id")
    long = np.flatnonzero(np.asarray(pc.or_(pc.greater(pc.utf8_length(unit), MAX_ID_LENGTH),
                                            pc.greater(pc.utf8_length(parent), MAX_ID_LENGTH))))
    if long.size:
        raise DataError(f"{name}: line {int(lines[long[0]])}: an id of more than {MAX_ID_LENGTH} characters")
    encoded = pc.dictionary_encode(level).combine_chunks()
    codes, names = np.asarray(encoded.indices), encoded.dictionary.to_pylist()
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(names) + 1))
    table = {}
    for k, level_name in enumerate(names):
        at = pa.array(order[bounds[k]:bounds[k + 1]])
        table[level_name] = (_strings(unit.take(at)), _strings(parent.take(at)), lines[np.asarray(at)])
    return _built(spec, table, name, os.path.abspath(name))


def nested_geography(spec: Any, ids: dict[str, np.ndarray], parents: dict[str, np.ndarray | None]) -> Geography:
    """The geography of ``spec``'s unit levels from each level's ids (str) and parent ids (str,
    None for the coarsest level), by level name; checked as a file is (:func:`read_geography`)."""
    table = {level: (ids[level], parents[level] if parents[level] is not None else np.full(ids[level].size, ""),
                     np.arange(ids[level].size, dtype=np.int64) + 2) for level in ids}
    return _built(spec, table, "synthetic geography", None)


def synthetic_geography_table(spec: Any, units: int) -> Geography:
    """The geography of ``units`` synthetic finest-level units of ``spec``
    (:func:`distfit.data.synthetic.synthetic_geography`: every unit of every level, those the
    synthetic people leave empty included)."""
    levels = _unit_levels(spec)
    nested = synthetic_geography([column for _, column, _ in levels], 0, units)
    table = {}
    for level, column, parent_column in levels:
        ids, first = np.unique(nested[column], return_index=True)
        parents = nested[parent_column][first] if parent_column is not None else np.full(ids.size, "")
        table[level] = (ids.astype(str), parents.astype(str), np.arange(ids.size, dtype=np.int64) + 2)
    return _built(spec, table, "synthetic geography", None)


def _text(geography: Geography) -> str:
    """The geography file's text: the header, then every level's units with their parents
    (pyarrow's CSV writer; a level's fields are quoted only when one of them holds a comma, a
    quote or a line break)."""
    out = pa.BufferOutputStream()
    out.write((",".join(COLUMNS) + "\n").encode())
    for units in geography.levels:
        parents = units.parents if units.parents is not None else np.full(units.ids.size, "")
        level = pa.DictionaryArray.from_arrays(np.zeros(units.ids.size, dtype=np.int32), [units.level])
        table = pa.table({"level": level.cast(pa.string()), "unit": pa.array(units.ids, pa.string()),
                          "parent": pa.array(parents, pa.string())})
        special = any(pc.any(pc.match_substring_regex(table.column(c), '[,"\\r\\n]')).as_py() for c in COLUMNS)
        pacsv.write_csv(table, out, pacsv.WriteOptions(include_header=False,
                                                       quoting_style="needed" if special else "none"))
    return out.getvalue().to_pybytes().decode("utf-8")


def write_geography(geography: Geography, path: str | os.PathLike, *, fsync: bool = True) -> Geography:
    """Write ``geography`` as a geography file at ``path`` (atomically); returns it with ``path``."""
    target = Path(os.fspath(path))
    write_text_atomic(target, _text(geography), fsync=fsync)
    return _located(geography.levels, geography.digest, os.path.abspath(target))


def synthetic_geography_file(spec: Any, units: int, path: str | os.PathLike, *, fsync: bool = True) -> Geography:
    """:func:`synthetic_geography_table` of ``units`` written at ``path``, or read from there when
    an earlier run wrote the same one (a multi-level run's ``RUNDIR/geography.csv``)."""
    made = synthetic_geography_table(spec, units)
    written = read_geography(path, spec) if os.path.exists(path) else None
    return written if written is not None and written.digest == made.digest else write_geography(made, path, fsync=fsync)
