"""Reading the chosen numeric columns of a CSV for ``distfit mask``, chunk by chunk, checked.

``DATA.csv`` (or ``.csv.gz``) has a header line naming its columns; ``--columns`` chooses
which are released. :func:`check_header` refuses a missing file, a file that is not CSV and a
missing column before anything is read; :func:`read_columns` then yields the chosen columns as
float64 blocks of at most ``chunk_rows`` rows (pandas' C parser, only those columns parsed,
so memory is one block whatever the file's size) and refuses, naming the line and column, the
first value that is not a finite number: text (a non-numeric column), an empty field or NA, NaN,
infinity. Lines are counted as physical lines with the header as line 1 (a quoted field
spanning lines, or a blank line, is not accounted for), as in :mod:`distfit.data.microdata`.
"""
from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

__all__ = ["SUFFIXES", "check_header", "read_columns"]

SUFFIXES = (".csv", ".csv.gz")


def check_header(path: str | os.PathLike, columns: Sequence[str]) -> None:
    """Refuse (ValueError, one line naming the file) a ``path`` that is missing, not a
    ``.csv``/``.csv.gz`` file, unreadable, or whose header lacks one of ``columns``."""
    p = Path(os.fspath(path))
    if not p.name.lower().endswith(SUFFIXES):
        raise ValueError(f"{p}: the data must be a .csv or .csv.gz file with a header line")
    if not p.is_file():
        raise ValueError(f"{p}: no such file")
    try:
        header = list(pd.read_csv(p, nrows=0).columns)
    except pd.errors.EmptyDataError:
        raise ValueError(f"{p}: empty file (no header line)") from None
    except (pd.errors.ParserError, UnicodeDecodeError, OSError) as error:
        raise ValueError(f"{p}: cannot read the CSV header ({str(error).splitlines()[0]})") from None
    for name in columns:
        if name not in header:
            shown = ", ".join(map(str, header[:20])) + (", ..." if len(header) > 20 else "")
            raise ValueError(f"{p}: no column {name!r} (columns: {shown})")


def _column(path: Path, frame: pd.DataFrame, name: str, first_line: int) -> np.ndarray:
    """Column ``name`` of ``frame`` as float64, or ValueError naming the line of its first value
    that is not a finite number."""
    series = frame[name]
    numeric = series.dtype.kind in "iuf"
    values = (series.to_numpy(dtype=np.float64) if numeric
              else pd.to_numeric(series, errors="coerce").to_numpy(dtype=np.float64))
    bad = np.flatnonzero(~np.isfinite(values))
    if series.dtype.kind == "b":
        bad = np.arange(len(values))
    if not bad.size:
        return values
    i = int(bad[0])
    raw = series.iloc[i]
    where = f"{path}: line {first_line + i}, column {name!r}"
    if raw is None or (isinstance(raw, float) and np.isnan(raw)):
        raise ValueError(f"{where}: a missing value (empty, NA or NaN)")
    if numeric:
        raise ValueError(f"{where}: value {float(raw)!r} is not finite")
    raise ValueError(f"{where}: value {str(raw)!r} is not a number (the column is not numeric)")


def read_columns(path: str | os.PathLike, columns: Sequence[str], chunk_rows: int) -> Iterator[np.ndarray]:
    """The ``columns`` of the CSV at ``path`` (checked by :func:`check_header`), in that order,
    as float64 arrays of at most ``chunk_rows`` rows (module docstring); ValueError naming the
    line and column of the first value that is not a finite number, or for a file without data
    rows."""
    p = Path(os.fspath(path))
    columns = list(columns)
    line, rows = 2, 0  # the header is line 1
    try:
        reader = pd.read_csv(p, usecols=columns, chunksize=chunk_rows, engine="c", low_memory=False)
        for frame in reader:
            yield np.column_stack([_column(p, frame, name, line) for name in columns])
            line += len(frame)
            rows += len(frame)
    except (pd.errors.ParserError, UnicodeDecodeError) as error:
        raise ValueError(f"{p}: malformed CSV ({str(error).splitlines()[0]})") from None
    if rows == 0:
        raise ValueError(f"{p}: no data rows")
