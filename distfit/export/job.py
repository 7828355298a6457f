"""``distfit export``: a sealed release or estimate in, CSV and Parquet tables with their error statements out.

``distfit export RELEASE_OR_ESTIMATE.zarr --out DIR [--plan PLAN.zarr] [--overwrite]``
(docs/export.md). For every query group of the plan's spec (a *table*) it writes
``DIR/<table>.csv`` and ``DIR/<table>.parquet``, one row per unit and query with the columns of
:data:`COLUMNS` (the query in words, the figure, its standard error and 90% margin of error
where exactly known, the integer published value, the note saying where the standard error
comes from: :mod:`distfit.export.tables`), and the data dictionary: ``DIR/README.txt`` (the
sources and their checksums, the privacy guarantee the plan states, every column, every
``se_note``, the tables and their rows) and ``DIR/dictionary.csv`` (one row per column).

Inputs, each verified: the plan it names (its ``plan_path`` attr, or ``plan_path`` given:
``--plan``), its whole checksum recomputed before anything is written
(:func:`distfit.stores.plan.read_verified_plan`), which must be the plan the store was made
from (its ``plan_checksum``); the store as it is read (:func:`distfit.stores.release.read_sealed_release`,
:func:`distfit.stores.estimate.read_sealed_estimate`: its root, every attr, small array and
chunk digest, checked first; then every chunk hashed as it is read and compared with its digest
before its rows are used, one read of each chunk, no separate pass). Refused with ValueError
(exit 2, one line): a missing path, anything but a sealed release or estimate, a changed store
(a changed chunk: :class:`distfit.stores.sealing.ChangedChunk`, naming the store, the array and
the units, found when the export reaches it: the staging directory is deleted, ``DIR`` is as it
was), another plan, a spec whose queries are not the store's.

Streaming: the store is read one chunk of units at a time (its own chunking) and each table's
rows are built as Arrow record batches of at most :data:`ROWS_PER_WRITE` rows: appended to its
Parquet file (``pyarrow.parquet.ParquetWriter``, row groups of :data:`PARQUET_ROWS`), and formatted as CSV
text on a pool of :data:`CSV_THREADS` threads (the CSV's number formatting is most of the
export's work), appended to its CSV file in order. At most ``threads + 1`` batches are in
flight, so memory does not grow with the units. At most :data:`OPEN_TABLES` tables are written
at once (two open files each); a spec of more groups is exported in passes over the store, each
pass reading only its tables' columns. Text columns are dictionary-encoded (each table's query
words, its name, the notes), so a row costs its numbers, not its words, until the CSV spells
them out.

Atomic: everything is written into ``<DIR>.incomplete-<random>`` next to ``DIR``, fsynced, and
renamed into place (:func:`distfit.stores.files.move_into_place`); on any error the staging
directory is deleted and ``DIR`` is as it was. An existing ``DIR`` is refused
(FileExistsError, exit 2) unless ``overwrite``, and even then only an earlier export (its
:data:`MARKER` file) or an empty directory is replaced. One writer per ``DIR``
(:func:`distfit.stores.lock.store_lock`).
"""
from __future__ import annotations

import collections
import csv
import os
import secrets
import shutil
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np
import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq

from distfit import __version__
from distfit.estimate.level_stores import NONNEGATIVE_METHOD
from distfit.estimate.measurements import measurement_model
from distfit.estimate.projection import DENSE_CELLS, PINV_CUTOFF, normal_equations
from distfit.mathematics.margins import MOE90_Z
from distfit.export.tables import (
    NOTE_TEXT,
    NOTES,
    TableLayout,
    gls_standard_errors,
    linear_units,
    privacy_statement,
    raw_standard_errors,
    table_layouts,
    table_rows,
)
from distfit.spec.parse import parse_spec
from distfit.stores.estimate import read_sealed_estimate
from distfit.stores.files import STAGING_MARKER, check_marked_dir, fsync_tree, move_into_place, root_attrs_on_disk, utc_now
from distfit.stores.lock import store_lock
from distfit.stores.plan import read_verified_plan
from distfit.stores.release import read_sealed_release

__all__ = ["COLUMNS", "CSV_THREADS", "MARKER", "OPEN_TABLES", "PARQUET_ROWS", "ROWS_PER_WRITE", "ErrorSource",
           "ExportResult", "open_source", "error_source", "run_export"]

PathLike = str | os.PathLike

#: The file that marks a directory as an export (``--overwrite`` replaces only such a directory).
MARKER = ".distfit-export"
#: Most rows built and formatted at once (a table's rows for a run of units): memory is flat in the units.
ROWS_PER_WRITE = 1 << 16
#: Rows of a Parquet row group (runs of rows gathered until there are this many; a table's last
#: row group may have fewer).
PARQUET_ROWS = 1 << 20
#: Most tables written in one pass over the store (two open files each).
OPEN_TABLES = 64
#: Most threads formatting CSV text (the export's bottleneck: ~0.5 us of CPU a row, the float
#: columns most of it; Parquet ~0.1). The runs in flight are this many plus one.
CSV_THREADS = 8

#: Every column of a table file: ``(name, type, unit, description)``, the data dictionary's rows.
COLUMNS = (
    ("unit", "integer or text", "-", "the unit's id (the data's unit column; the release's unit_ids)"),
    ("level", "text", "-", "the unit's geographic level: a multi-level run's level for its estimates, else the "
                           "unit column the ids come from; empty for one population (no unit column)"),
    ("parent", "text, may be empty", "-", "the id of the unit of the next coarser level the unit lies in (the "
                                          "store's parent_ids); empty where the store records none"),
    ("table", "text", "-", "the table: the query group of the spec (one file pair per table)"),
    ("query", "text", "-", "the query in words: each attribute's values or range, joined by ', ' "
                           "('age 18 to 64, sex female'); 'total' for the grand total"),
    ("estimate", "float64", "count", "the published figure (a count of the data's records, e.g. persons, or a "
                                     "weighted count for a matrix query): a release's raw noisy answer (it may "
                                     "be negative), or an estimate's post-processed value"),
    ("se", "float64, may be empty", "count", "its standard error where it is exactly known (see se_note), else empty"),
    ("moe90", "float64, may be empty", "count", f"90% margin of error = {MOE90_Z} * se (as the ACS prints it): "
                                                "estimate +- moe90 is a 90% interval"),
    ("published", "int64, may be empty", "count", "the integer value published, for an estimate made with "
                                                  "--integer; empty otherwise"),
    ("se_note", "text", "-", "where se comes from, or why it is empty (the codes below)"),
)


@dataclass(frozen=True)
class ErrorSource:
    """Where a store's standard errors come from: ``se`` (m,) of the linear figures (None:
    none), ``per_unit`` (the units' notes and which of them state ``se`` come from each unit's
    solve: :func:`distfit.export.tables.linear_units`), else every unit has ``note`` (a
    :data:`distfit.export.tables.NOTES` code); ``stored``: each unit's ``se`` is the square root
    of the store's query variances (:attr:`distfit.stores.estimate.Estimate.variances`, read with
    the estimates); ``rule`` says it in one sentence."""

    se: np.ndarray | None
    per_unit: bool
    note: str
    rule: str
    stored: bool = False


@dataclass(frozen=True)
class ExportResult:
    """What :func:`run_export` wrote: ``path`` (DIR), the source's ``kind`` (release or
    estimate), ``units``, ``tables`` (``(name, rows)`` each), ``rows`` in all, ``bytes`` of the
    files, ``seconds``, the source's and the plan's checksums, ``rule`` (where se comes from) and
    ``stated`` (rows with a standard error)."""

    path: str
    kind: str
    units: int
    tables: tuple[tuple[str, int], ...]
    rows: int
    bytes: int
    seconds: float
    checksum: str
    plan_checksum: str
    rule: str
    stated: int


def _check_out(path: Path) -> None:
    """Raise unless ``path`` may be replaced by an export (:func:`distfit.stores.files.check_marked_dir`)."""
    check_marked_dir(path, MARKER, "export")


def open_source(path: PathLike) -> tuple[str, Any]:
    """``(kind, store)``: the sealed release or estimate at ``path``, its root verified and each
    chunk checked as it is read (:meth:`distfit.stores.sealing.SealedKind.read_sealed`);
    ValueError in one line for anything else."""
    p = Path(os.fspath(path))
    if not p.exists():
        raise ValueError(f"{p}: no such store")
    attrs = root_attrs_on_disk(p) if p.is_dir() else None
    kind = (attrs or {}).get("distfit_format")
    if kind == "release":
        return kind, read_sealed_release(p)
    if kind == "estimate":
        return kind, read_sealed_estimate(p)
    found = f"a {kind} store" if isinstance(kind, str) else "not a distfit store"
    raise ValueError(f"{p}: not a release or estimate store ({found}); export takes what distfit release or "
                     "distfit estimate wrote")


def error_source(kind: str, store: Any, plan: Any) -> ErrorSource:
    """The standard errors of a store's figures (:mod:`distfit.export.tables`, docs/export.md)."""
    if kind == "release":
        return ErrorSource(raw_standard_errors(plan.queries_variances), False, "raw-answer",
                           "se = sqrt(the plan's variance of each query's noisy answer), exact for every row")
    if store.integer:
        return ErrorSource(None, False, "integer-rounded", "integer estimates: rounding is not linear, no se stated")
    if store.variances is not None and store.method == NONNEGATIVE_METHOD:
        return ErrorSource(None, False, "unbiased-hierarchy",
                           "se = sqrt(the estimate's stored variance, queries/variance_rows by unit): the exact variance of "
                           "the best linear unbiased estimate over the geography that each nonnegative table was "
                           "projected from (the table itself is not linear in the release)", stored=True)
    if store.variances is not None:
        return ErrorSource(None, False, "linear-hierarchy",
                           "se = sqrt(the estimate's stored variance, queries/variance_rows by unit): the exact variance of "
                           "each query's best linear unbiased estimate over the geography, unit by unit", stored=True)
    if store.method != "projection":
        return ErrorSource(None, False, "nonlinear-method",
                           f"method {store.method}: not a linear function of the release, no se stated")
    model = measurement_model(plan)
    if model.workload is None or model.cells > DENSE_CELLS:
        return ErrorSource(None, False, "covariance-too-large",
                           "the workload is too large for the dense covariance W H^+ W^T, no se stated")
    zeros = {block.block_id: np.zeros((1, block.rows)) for block in model.blocks}
    hessian, _ = normal_equations(model, zeros)
    return ErrorSource(gls_standard_errors(model.workload, hessian, PINV_CUTOFF), True, "linear-gls",
                       "se = sqrt(diag(W H^+ W^T)) for the units whose estimate is the generalised least-squares "
                       "estimate (no nonnegativity constraint active, solve converged); empty for the others")


def _schema(ids: np.ndarray) -> pa.Schema:
    unit = pa.int64() if ids.dtype.kind in "iub" else pa.float64() if ids.dtype.kind == "f" else pa.string()
    text = pa.dictionary(pa.int32(), pa.string())
    return pa.schema([("unit", unit), ("level", text), ("parent", pa.string()), ("table", text), ("query", text),
                      ("estimate", pa.float64()), ("se", pa.float64()), ("moe90", pa.float64()),
                      ("published", pa.int64()), ("se_note", text)])


def _arrow_ids(ids: np.ndarray, schema: pa.Schema) -> pa.Array:
    ids = np.asarray(ids)
    if pa.types.is_string(schema.field("unit").type):
        return pa.array([str(i) for i in ids.tolist()], type=pa.string())
    return pa.array(ids, type=schema.field("unit").type)


def _arrow_parents(parents: np.ndarray | None, units: int) -> pa.Array:
    """The units' parent ids as text (an integer id written as its digits); nulls without any."""
    if parents is None:
        return pa.nulls(units, pa.string())
    return pa.array([str(i) for i in np.asarray(parents).tolist()], type=pa.string())


def level_of(kind: str, store: Any, spec: Any) -> str:
    """The geographic level a store's units belong to (the ``level`` column): a multi-level run's
    level for its estimates (their ``geography`` attr), else the spec's unit column, else ""
    (one population: the column is then empty, null in Parquet)."""
    geography = store.attrs.get("geography") if kind == "estimate" else None
    if isinstance(geography, dict) and isinstance(geography.get("level"), str):
        return geography["level"]
    return spec.units.column if spec.units is not None else ""


def _floats(values: np.ndarray | None, rows: int) -> pa.Array:
    if values is None:
        return pa.nulls(rows, pa.float64())
    missing = np.isnan(values)
    return pa.array(values, mask=missing) if missing.any() else pa.array(values)


def _record(ids: pa.Array, parents: pa.Array, columns: dict, schema: pa.Schema, dictionaries: dict) -> pa.Table:
    rows = columns["estimate"].size
    published = columns["published"]
    units = pa.array(columns["unit_index"])
    level = dictionaries["level"][0].as_py()
    return pa.Table.from_arrays([
        ids.take(units),
        pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, dtype=np.int32), mask=np.full(rows, not level)),
                                       dictionaries["level"]),
        parents.take(units),
        pa.DictionaryArray.from_arrays(pa.array(np.zeros(rows, dtype=np.int32)), dictionaries["table"]),
        pa.DictionaryArray.from_arrays(pa.array(columns["query_index"]), dictionaries["query"]),
        pa.array(columns["estimate"]),
        _floats(columns["se"], rows),
        _floats(columns["moe90"], rows),
        pa.nulls(rows, pa.int64()) if published is None else pa.array(published),
        pa.DictionaryArray.from_arrays(pa.array(columns["note_index"]), dictionaries["note"]),
    ], schema=schema)


def _csv_text(table: pa.Table, header: bool = False) -> pa.Buffer:
    """``table`` as CSV text (RFC 4180; text quoted, numbers in their shortest round-trip form,
    nulls empty): formatted on a pool thread (pyarrow releases the GIL), appended to the file in
    order by the driver."""
    sink = pa.BufferOutputStream()
    pa_csv.write_csv(table, sink, write_options=pa_csv.WriteOptions(include_header=header, quoting_style="needed",
                                                                       batch_size=8192))
    return sink.getvalue()


class _TableWriter:
    """One table's two files, appended to run by run: the Parquet row group written at once,
    the CSV text formatted on the pool and written when its turn comes (:class:`_Writers`)."""

    def __init__(self, staging: Path, layout: TableLayout, schema: pa.Schema, level: str) -> None:
        self.layout, self.rows, self.stated = layout, 0, 0
        self.dictionaries = {"level": pa.array([level]), "table": pa.array([layout.name]),
                             "query": pa.array(list(layout.words)),
                             "note": pa.array(list(NOTES))}
        self.csv = open(staging / f"{layout.name}.csv", "wb")
        self.csv.write(_csv_text(schema.empty_table(), header=True))
        self.parquet = pq.ParquetWriter(str(staging / f"{layout.name}.parquet"), schema, compression="zstd",
                                        use_dictionary=[name for name in schema.names if name != "estimate"])
        self.gathered: list[pa.Table] = []

    def gather(self, table: pa.Table | None) -> None:
        """Add ``table`` to the next Parquet row group, written once it has :data:`PARQUET_ROWS`
        rows (None: the last, written now)."""
        if table is not None:
            self.gathered.append(table)
        if self.gathered and (table is None or sum(t.num_rows for t in self.gathered) >= PARQUET_ROWS):
            self.parquet.write_table(pa.concat_tables(self.gathered), row_group_size=PARQUET_ROWS)
            self.gathered = []

    def close(self) -> None:
        self.csv.close()
        self.parquet.close()


class _Writers:
    """Every open table's writer and the CSV formatting pool: at most ``threads + 1`` runs of
    rows in flight (memory flat), their text appended to each file in the order written."""

    def __init__(self, writers: list[_TableWriter], threads: int) -> None:
        self.writers, self.threads = writers, threads
        self.pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="distfit-export-csv")
        self.pending: collections.deque = collections.deque()

    def write(self, writer: _TableWriter, table: pa.Table) -> None:
        self.pending.append((writer, self.pool.submit(_csv_text, table)))
        writer.gather(table)
        writer.rows += table.num_rows
        writer.stated += table.num_rows - table.column("se").null_count
        while len(self.pending) > self.threads:
            self._land()

    def _land(self) -> None:
        writer, text = self.pending.popleft()
        writer.csv.write(text.result())

    def finish(self) -> None:
        while self.pending:
            self._land()
        for writer in self.writers:
            writer.gather(None)

    def close(self) -> None:
        for _writer, text in self.pending:
            text.cancel()
        self.pool.shutdown(wait=True)
        for writer in self.writers:
            writer.close()


def _passes(layouts: tuple[TableLayout, ...]) -> list[tuple[TableLayout, ...]]:
    return [layouts[i:i + OPEN_TABLES] for i in range(0, len(layouts), OPEN_TABLES)]


def _export_pass(staging: Path, layouts: tuple[TableLayout, ...], values: Any, store: Any, errors: ErrorSource,
                 schema: pa.Schema, level: str, threads: int, log: TextIO | None) -> list[_TableWriter]:
    """Write ``layouts``' files reading the store chunk by chunk (module docstring)."""
    units, chunk = int(store.attrs["units"]), int(store.attrs["chunk_units"])
    first, last = layouts[0].start, layouts[-1].stop
    constant = np.int32(NOTES.index(errors.note))
    # each array looked up once (a lookup is a zarr group open); every chunk of them is checked as read
    variances = store.variances if errors.stored else None
    cells, converged = (store.cells, store.converged) if errors.per_unit else (None, None)
    unit_ids, parent_ids = store.unit_ids, store.parent_ids
    writers = _Writers([], threads)
    try:
        for layout in layouts:
            writers.writers.append(_TableWriter(staging, layout, schema, level))
        for start in range(0, units, chunk):
            stop = min(start + chunk, units)
            block = np.asarray(values[start:stop, first:last])
            stored = np.sqrt(np.asarray(variances[start:stop, first:last])) if variances is not None else None
            ids = _arrow_ids(unit_ids[start:stop], schema)
            parents = _arrow_parents(None if parent_ids is None else parent_ids[start:stop], stop - start)
            linear, notes = None, np.full(stop - start, constant, dtype=np.int32)
            if errors.per_unit:
                linear, notes = linear_units(cells[start:stop], converged[start:stop])
            for writer in writers.writers:
                layout = writer.layout
                step = max(1, ROWS_PER_WRITE // max(layout.width, 1))
                for a in range(0, stop - start, step):
                    b = min(a + step, stop - start)
                    columns = table_rows(block[a:b, layout.start - first:layout.stop - first],
                                         stored[a:b, layout.start - first:layout.stop - first] if stored is not None
                                         else None if errors.se is None else errors.se[layout.start:layout.stop],
                                         None if linear is None else linear[a:b], notes[a:b])
                    writers.write(writer, _record(ids.slice(a, b - a), parents.slice(a, b - a), columns, schema,
                                                  writer.dictionaries))
            if log is not None:
                print(f"export: {stop}/{units} units, tables {layouts[0].name}..{layouts[-1].name}", file=log)
        writers.finish()
    finally:
        writers.close()
    return writers.writers


def _dictionary_text(kind: str, store: Any, plan: Any, errors: ErrorSource, tables: list[tuple[str, int]]) -> str:
    """DIR/README.txt: the data dictionary (module docstring)."""
    lines = [f"distfit export of a {kind} ({utc_now()}, distfit {__version__})", "",
             "Sources (each verified against its checksum: the plan before export, the store chunk by chunk as it "
             "was read):",
             f"  {kind}: {os.path.abspath(store.path)}", f"    checksum {store.checksum}",
             f"  plan: {os.path.abspath(plan.path)}", f"    checksum {plan.checksum}"]
    if kind == "estimate":
        lines += [f"  method: {store.method}{' (integer)' if store.integer else ''}",
                  f"  of the release {store.attrs.get('release_path')} (checksum {store.attrs.get('release_checksum')})"]
    lines += ["", "Privacy guarantee stated by the plan (per unit; post-processing such as an estimate or this "
                  "export does not change it):"]
    lines += [f"  {line}" for line in privacy_statement(plan.attrs, getattr(store, "private", None))]
    lines += ["", "Tables: one CSV and one Parquet file each, the same rows; one row per unit and query "
                  "(the units in store order, each unit's queries in spec order):"]
    lines += [f"  {name}.csv, {name}.parquet: {rows} rows" for name, rows in tables]
    lines += ["", "Columns:"]
    for name, type_, unit, text in COLUMNS:
        lines.append(f"  {name} ({type_}; unit: {unit}): {text}")
    lines += ["", f"Standard errors here: {errors.rule}.",
              "The noise of every released answer is Gaussian with a variance the plan states, the same for every "
              "unit; a figure that is a linear function of the release (a raw answer; a projection estimate whose "
              "nonnegativity constraint is inactive; a multi-level run's real-valued estimate) is Gaussian around its true value with the stated se. No se "
              "is stated where the figure is not linear in the release; se_note says why.", "",
              "se_note codes:"]
    lines += [f"  {code}: {NOTE_TEXT[code]}" for code in NOTES]
    lines += ["", "Empty cells in the CSV are missing values (null in Parquet). Numbers are written with the "
                  "shortest text that reads back to the same float64.", ""]
    return "\n".join(lines)


def _write_dictionary_csv(path: Path) -> None:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        out = csv.writer(handle)
        out.writerow(("column", "type", "unit", "description"))
        out.writerows(COLUMNS)
        out.writerows((f"se_note={code}", "code", "-", NOTE_TEXT[code]) for code in NOTES)


def run_export(source: PathLike, out: PathLike, *, plan_path: PathLike | None = None, overwrite: bool = False,
               fsync: bool = True, threads: int | None = None, log: TextIO | None = None) -> ExportResult:
    """Export the sealed release or estimate at ``source`` to the directory ``out`` (module
    docstring); ``plan_path`` overrides the plan the store names; ``threads`` format the CSV
    text (default: this process's CPUs, at most :data:`CSV_THREADS`)."""
    threads = threads or min(CSV_THREADS, os.cpu_count() or 1)
    started = time.perf_counter()
    out_path = Path(os.fspath(out))
    if STAGING_MARKER in out_path.name:
        raise ValueError(f"{out_path}: an export path may not contain {STAGING_MARKER!r}")
    if (out_path.exists() or out_path.is_symlink()) and not overwrite:
        raise FileExistsError(f"{out_path}: already exists; pass --overwrite to replace an earlier export")
    if out_path.exists() or out_path.is_symlink():
        _check_out(out_path)  # refuse early, before any work
    with store_lock(out_path, "export"):
        kind, store = open_source(source)
        named = plan_path if plan_path is not None else store.attrs["plan_path"]
        if plan_path is None and not Path(named).exists():
            raise ValueError(f"{named}: no plan store there (the plan {store.path} names); give it with --plan")
        plan = read_verified_plan(named)
        if store.attrs.get("plan_checksum") != plan.checksum:
            raise ValueError(f"{store.path}: the {kind} was made from another plan (plan checksum "
                             f"{store.attrs.get('plan_checksum')}, {plan.path} has {plan.checksum})")
        try:
            spec = parse_spec(plan.attrs["spec"])
        except ValueError as error:
            raise ValueError(f"{plan.path}: its spec does not parse: {error}") from None
        values = store.answers if kind == "release" else store.estimates
        layouts = table_layouts(spec, int(values.shape[1]), store.labels)
        errors = error_source(kind, store, plan)
        schema = _schema(np.asarray(store.unit_ids[:1]))
        level = level_of(kind, store, spec)

        out_path.parent.mkdir(parents=True, exist_ok=True)
        staging = out_path.with_name(f"{out_path.name}{STAGING_MARKER}{secrets.token_hex(6)}")
        staging.mkdir()
        try:
            writers = [w for tables in _passes(layouts)
                       for w in _export_pass(staging, tables, values, store, errors, schema, level, threads, log)]
            tables = [(w.layout.name, w.rows) for w in writers]
            (staging / "README.txt").write_text(_dictionary_text(kind, store, plan, errors, tables), encoding="utf-8")
            _write_dictionary_csv(staging / "dictionary.csv")
            (staging / MARKER).write_text("distfit export directory; `distfit export --overwrite` may replace it\n",
                                          encoding="utf-8")
            size = sum(f.stat().st_size for f in staging.iterdir())
            if fsync:
                fsync_tree(staging)
            move_into_place(staging, out_path, _check_out, fsync=fsync)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return ExportResult(path=str(out_path), kind=kind, units=int(store.attrs["units"]), tables=tuple(tables),
                        rows=sum(rows for _, rows in tables), bytes=size, seconds=time.perf_counter() - started,
                        checksum=store.checksum, plan_checksum=plan.checksum, rule=errors.rule,
                        stated=sum(w.stated for w in writers))
