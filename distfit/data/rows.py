"""The row checks of microdata (:mod:`distfit.data.microdata`): every row of a partition, or of
the start of a CSV file, against a spec's attributes and unit columns.

:func:`check_rows` maps each attribute's raw values to value codes (``AttributeSpec.encode``,
once per distinct value) and reads the unit ids (and parent ids, for a level of a multi-level
run); the first bad row (in row order) is reported as ``(row, column, problem)``, in the words
of the module docstring of :mod:`distfit.data.microdata` ("Bad input").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["CheckedRows", "RowCheck", "check_rows", "two_parents"]

#: Values listed in a "not a value of" message.
SHOW_VALUES = 12


@dataclass(frozen=True)
class RowCheck:
    """What the rows are checked against (small, picklable)."""

    attributes: tuple[Any, ...] = ()       # AttributeSpec, schema order
    columns: tuple[str, ...] = ()          # the data column of each attribute
    unit_column: str | None = None
    integer_ids: bool = True
    parent_column: str | None = None       # the coarser level's unit column (geography)
    integer_parents: bool = False


@dataclass(frozen=True, eq=False)
class CheckedRows:
    """The result of :func:`check_rows`: ``codes`` (attributes x rows), the local unit of each
    row (``units``) and the sorted distinct local ids (``local_ids``); with a parent column,
    ``parent_ids``, each row's local parent (``parents``) and each unit's first row
    (``first_rows``); ``first`` None, or ``(row, column, problem)`` of the first bad row (then
    the arrays are not to be used)."""

    codes: np.ndarray
    units: np.ndarray
    local_ids: np.ndarray
    parent_ids: np.ndarray | None
    parents: np.ndarray | None
    first_rows: np.ndarray | None
    first: tuple[int, str, str] | None


def _show(value: Any) -> str:
    value = value.item() if isinstance(value, np.generic) else value
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    if isinstance(value, str):
        return repr(value.strip())
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _not_in_domain(attribute: Any, value: Any) -> str:
    bins = getattr(attribute, "bins", None)
    if bins is not None:
        edges = ", ".join(f"{float(e):g}" for e in bins)
        return f"value {_show(value)} is not in the bins of {attribute.name} (edges: {edges})"
    values = list(attribute.values)
    shown = ", ".join(values[:SHOW_VALUES]) + (f", ... ({len(values)} values)" if len(values) > SHOW_VALUES else "")
    return f"value {_show(value)} is not a value of {attribute.name} (values: {shown})"


def _id_text(value: Any) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace").strip()
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value).strip()


def _unit_codes(series, integer: bool) -> tuple[np.ndarray, np.ndarray, tuple[int, str] | None]:
    """``(local unit of each row, sorted distinct local ids, bad)``; ``bad`` is ``(row,
    problem)`` for the first row with a missing or empty id. Ids: int64 or UTF-8 bytes."""
    missing = np.asarray(series.isna().to_numpy(), dtype=bool)
    if integer:
        if missing.any():
            return np.zeros(0, np.int64), np.zeros(0, np.int64), (int(np.argmax(missing)), "the unit id is missing")
        local, inverse = np.unique(series.to_numpy(dtype=np.int64), return_inverse=True)
        return inverse.reshape(-1).astype(np.int64), local, None
    inverse, uniques = pd.factorize(series, use_na_sentinel=True)
    texts = [_id_text(u) for u in uniques.tolist()]
    empty = np.array([not t for t in texts] + [False], dtype=bool)  # index -1: the NA sentinel
    bad = (inverse < 0) | empty[inverse]
    if bad.any():
        row = int(np.argmax(bad))
        return (np.zeros(0, np.int64), np.zeros(0, "S1"),
                (row, "the unit id is missing" if inverse[row] < 0 else "the unit id is empty"))
    encoded = np.array([t.encode("utf-8") for t in texts], dtype="S")
    local, remap = np.unique(encoded, return_inverse=True)  # sorted; merges ids equal once stripped
    return remap.reshape(-1)[inverse].astype(np.int64), local, None


def check_rows(frame, job: RowCheck) -> CheckedRows:
    """Every row of ``frame`` (a pandas DataFrame of microdata) checked against ``job``
    (:class:`CheckedRows`: the first bad row, or the codes and unit ids of all)."""
    rows = int(len(frame))
    parent_ids = parents = first_rows = None
    first: tuple[int, str, str] | None = None
    codes = np.empty((len(job.attributes), rows), dtype=np.int64)
    for j, (attribute, column) in enumerate(zip(job.attributes, job.columns)):
        inverse, uniques = pd.factorize(frame[column], use_na_sentinel=True)
        raw = uniques.to_numpy()
        mapped = np.append(np.asarray(attribute.encode(raw), dtype=np.int64).reshape(-1), -1)
        coded = mapped[inverse]  # the NA sentinel -1 picks the appended -1
        bad = np.flatnonzero(coded < 0)
        if bad.size and (first is None or bad[0] < first[0]):
            row = int(bad[0])
            problem = ("the value is missing" if inverse[row] < 0
                       else _not_in_domain(attribute, raw[inverse[row]]))
            first = (row, column, problem)
        codes[j] = coded
    if job.unit_column is not None:
        units, local_ids, bad_unit = _unit_codes(frame[job.unit_column], job.integer_ids)
        if bad_unit is not None and (first is None or bad_unit[0] < first[0]):
            first = (bad_unit[0], job.unit_column, bad_unit[1])
    else:
        units, local_ids = np.zeros(rows, np.int64), np.zeros(1, np.int64)
    if job.parent_column is not None:
        parents, parent_ids, bad_parent = _unit_codes(frame[job.parent_column], job.integer_parents)
        if bad_parent is not None and (first is None or bad_parent[0] < first[0]):
            first = (bad_parent[0], job.parent_column, bad_parent[1].replace("unit id", "parent unit id"))
        if first is None:
            # every unit's first row says its parent; a row saying another is bad input
            first_rows = np.unique(units, return_index=True)[1]  # local units are 0 .. U-1
            clash = np.flatnonzero(parents != parents[first_rows][units])
            if clash.size:
                row = int(clash[0])
                first = (row, job.parent_column, two_parents(
                    local_ids[units[row]], job.unit_column, parent_ids[parents[first_rows[units[row]]]],
                    parent_ids[parents[row]]))
    return CheckedRows(codes, units, local_ids, parent_ids, parents, first_rows, first)


def two_parents(unit: Any, unit_column: str | None, one: Any, other: Any) -> str:
    """The problem of a unit whose people name two parents (one line)."""
    return (f"unit {_show(unit)} of {unit_column!r} has people in two parents, {_show(one)} and "
            f"{_show(other)} (each unit must lie inside one unit of the coarser level)")
