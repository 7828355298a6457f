"""Where in a microdata source a failure is, in one line (:mod:`distfit.data.microdata`'s "Bad input").

The tabulation reads a source in partitions; a bad row is known by its partition and its row in
it, a parse error by the reader's own words. These turn that into what a user can find: ``line
N`` of a CSV file (the physical line, the header being line 1; blank lines skipped as pandas
does; a quoted field spanning lines is not accounted for), ``row N`` of Parquet data (1-based, files
in dataset order). Line numbers are computed on the error path only, from the row counts of the
partitions before the bad one and one scan of the file up to that point.
"""
from __future__ import annotations

import gzip
import re
from typing import Any, Iterable

__all__ = ["csv_line_of_record", "failure_message", "line_of_record", "parser_problem"]


def csv_line_of_record(path: str, record: int) -> int | None:
    """Physical line (1-based) of data record ``record`` (0-based) of a CSV file: the first
    non-blank line is the header; blank lines are skipped, as pandas does. Error path only."""
    opener = gzip.open if path.lower().endswith(".gz") else open
    with opener(path, "rb") as handle:
        return line_of_record(handle, record)


def line_of_record(lines: Iterable[bytes], record: int) -> int | None:
    """:func:`csv_line_of_record` over the physical ``lines`` of a CSV file (or of its start)."""
    seen = -2  # the header is record -1
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        seen += 1
        if seen == record:
            return number
    return None


def parser_problem(error: BaseException) -> tuple[int | None, str]:
    """``(local line or None, problem)`` from a pandas/pyarrow read error."""
    text = " ".join(str(error).split())
    text = text.split("Original Message: ", 1)[-1]
    match = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", text)
    if match:
        return int(match.group(2)), f"malformed CSV: expected {match.group(1)} fields, saw {match.group(3)}"
    match = re.search(r"\bline (\d+)", text)
    if match:
        return int(match.group(1)), f"malformed CSV: {text}"
    if isinstance(error, UnicodeError):
        return None, "cannot read: not UTF-8 text"
    return None, f"cannot read ({type(error).__name__}: {text})"


def failure_message(name: str, fmt: str, results: dict[int, dict], failure: tuple[int, Any]) -> str:
    """The one-line DataError message of the first failure (module docstring)."""
    k, payload = failure
    before = sum(results[j]["rows"] for j in range(k))
    if isinstance(payload, dict):
        record = before + payload["row"]
        if fmt == "csv":
            line = csv_line_of_record(name, record)
            where = f"line {line}" if line is not None else f"data row {record + 1}"
        else:
            where = f"row {record + 1}"
        return f"{name}: {where}, column {payload['column']!r}: {payload['problem']}"
    local, problem = parser_problem(payload)
    if fmt == "csv" and local is not None:
        if k == 0:
            return f"{name}: line {local}: {problem}"
        start = csv_line_of_record(name, before)  # the partition's first record; its header is line 1
        if start is not None:
            return f"{name}: line {start + local - 2}: {problem}"
    if fmt == "csv" and k > 0:
        start = csv_line_of_record(name, before)
        if start is not None:
            return f"{name}: {problem} (in the part from line {start})"
    if fmt == "parquet" and k > 0:
        return f"{name}: {problem} (in the part from row {before + 1})"
    return f"{name}: {problem}"
