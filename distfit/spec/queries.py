"""The queries a group asks of one attribute: a query kind as written in a spec (``identity``,
``{select: [...]}``, ...) -> :class:`distfit.spec.model.AttributeQuery`.

The kinds, their query matrices and labels are described in the schema reference,
``pipelines/README.md`` ("Query groups"). :class:`QueryCache` parses each plain kind
(``identity``, ``total``, ``prefix``, ``all_ranges``) of an attribute once per spec: a spec with
half a million groups over a thousand attributes asks for the same few thousand
``AttributeQuery`` objects over and over, and they are frozen (read-only matrices), so groups
share them.
"""
from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from distfit.spec.fields import is_int, is_number, is_sequence, listing, show, type_name
from distfit.spec.limits import MATRIX_ENTRY, QUERY_MAX_ENTRIES
from distfit.spec.model import AttributeQuery, AttributeSpec, SpecError
from distfit.spec.schema import MAPPING_KINDS, ORDINAL_KINDS, PLAIN_KINDS, QUERY_KINDS
from distfit.mathematics.workload import (
    all_range_queries,
    custom_queries,
    identity_queries,
    prefix_queries,
    range_queries,
    total_queries,
)

__all__ = ["read_only", "value_index", "parse_query", "QueryCache"]

_EXPECTED = ("expected identity, total, prefix, all_ranges, {ranges: [[lo, hi], ...]}, "
             "{select: [values]} or {matrix: [[...]]}")


def read_only(array: Any) -> np.ndarray:
    """A read-only float copy: a spec is frozen, its query matrices and targets too."""
    array = np.array(array, dtype=float, copy=True)
    array.setflags(write=False)
    return array


def value_index(value: Any, attribute: AttributeSpec, path: str) -> int:
    """A value of ``attribute`` named by index (an int) or by label (a string)."""
    if is_int(value):
        index = int(value)
        if not 0 <= index < attribute.size:
            hint = ""
            if str(index) in attribute.label_index:
                hint = f" (quote it, '{index}', to name the value by its label)"
            raise SpecError(path, f"value index {index} out of range 0..{attribute.size - 1} "
                                  f"of {attribute.name}{hint}")
        return index
    if isinstance(value, str):
        index = attribute.label_index.get(value)
        if index is None:
            raise SpecError(path, f"unknown value {value!r} of {attribute.name} "
                                  f"(values: {listing(attribute.values)})")
        return index
    raise SpecError(path, f"expected a value label or index, got {type_name(value)} {show(value)}")


def parse_query(raw: Any, attribute: AttributeSpec, path: str) -> AttributeQuery:
    """The queries of the kind ``raw`` (as written in the spec at field ``path``) on
    ``attribute``; SpecError naming the field (or a sub-field: ``PATH.select[2]``)."""
    if isinstance(raw, str):
        kind, argument = raw, None
        if kind not in PLAIN_KINDS:
            close = difflib.get_close_matches(kind, QUERY_KINDS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise SpecError(path, f"unknown query kind {kind!r} ({hint}{_EXPECTED})")
    elif isinstance(raw, Mapping):
        if len(raw) != 1 or next(iter(raw)) not in MAPPING_KINDS:
            keys = ", ".join(repr(k) for k in raw) or "no key"
            raise SpecError(path, f"a query-kind mapping has exactly one key, ranges, select or "
                                  f"matrix; got {keys}")
        kind, argument = next(iter(raw.items()))
    else:
        raise SpecError(path, f"{_EXPECTED}; got {type_name(raw)} {show(raw)}")
    if kind in ORDINAL_KINDS and not attribute.ordinal:
        raise SpecError(path, f"{kind} queries need an ordinal attribute ({attribute.name} is not; "
                              "set ordinal: true on it)")
    if kind == "all_ranges":
        entries = attribute.size * (attribute.size + 1) // 2 * attribute.size
        if entries > QUERY_MAX_ENTRIES:
            raise SpecError(path, f"all_ranges of {attribute.name} ({attribute.size} values) is a matrix of "
                                  f"{entries} entries, more than {QUERY_MAX_ENTRIES} (docs/spec.md, Ranges); "
                                  "use {ranges: [...]} or prefix")
    if kind in PLAIN_KINDS:
        return _plain_query(kind, attribute)
    where = f"{path}.{kind}"
    if kind == "ranges":
        return _ranges(argument, attribute, where)
    if kind == "select":
        return _select(argument, attribute, where)
    return _matrix(argument, attribute, where)


class QueryCache:
    """:func:`parse_query` with the plain kinds parsed once per (attribute, kind) (module
    docstring); the kinds that take arguments are parsed every time they are written."""

    def __init__(self) -> None:
        self._plain: dict[tuple[str, str], AttributeQuery] = {}

    def query(self, raw: Any, attribute: AttributeSpec, path: str) -> AttributeQuery:
        """``parse_query(raw, attribute, path)``, shared when ``raw`` is a plain kind."""
        if isinstance(raw, str):
            key = (attribute.name, raw)
            query = self._plain.get(key)
            if query is None:  # errors are raised here and never cached
                query = self._plain[key] = parse_query(raw, attribute, path)
            return query
        return parse_query(raw, attribute, path)


def _plain_query(kind: str, attribute: AttributeSpec) -> AttributeQuery:
    name, n, values = attribute.name, attribute.size, attribute.values
    if kind == "identity":
        return AttributeQuery("identity", (), read_only(identity_queries(n)),
                              tuple(f"{name}[{v}]" for v in values))
    if kind == "total":
        return AttributeQuery("total", (), read_only(total_queries(n)), (f"{name}[*]",))
    if kind == "prefix":
        return AttributeQuery("prefix", (), read_only(prefix_queries(n)),
                              tuple(f"{name}[<={v}]" for v in values))
    lo, hi = np.triu_indices(n)
    return AttributeQuery("all_ranges", (), read_only(all_range_queries(n)),
                          tuple(f"{name}[{values[a]}..{values[b]}]" for a, b in zip(lo, hi)))


def _ranges(argument: Any, attribute: AttributeSpec, where: str) -> AttributeQuery:
    values = attribute.values
    if not is_sequence(argument) or len(argument) == 0:
        raise SpecError(where, f"expected a non-empty list of [lo, hi] pairs, got {type_name(argument)}")
    pairs = []
    for r, pair in enumerate(argument):
        if not is_sequence(pair) or len(pair) != 2:
            raise SpecError(f"{where}[{r}]", f"expected a [lo, hi] pair, got {show(pair)}")
        lo = value_index(pair[0], attribute, f"{where}[{r}]")
        hi = value_index(pair[1], attribute, f"{where}[{r}]")
        if lo > hi:
            raise SpecError(f"{where}[{r}]", f"empty range: lo {values[lo]!r} comes after "
                                             f"hi {values[hi]!r}")
        pairs.append((lo, hi))
    return AttributeQuery("ranges", tuple(pairs), read_only(range_queries(attribute.size, pairs)),
                          tuple(f"{attribute.name}[{values[lo]}..{values[hi]}]" for lo, hi in pairs))


def _select(argument: Any, attribute: AttributeSpec, where: str) -> AttributeQuery:
    values = attribute.values
    if not is_sequence(argument) or len(argument) == 0:
        raise SpecError(where, f"expected a non-empty list of values, got {type_name(argument)}")
    indices: list[int] = []
    seen: set[int] = set()
    for i, value in enumerate(argument):
        index = value_index(value, attribute, f"{where}[{i}]")
        if index in seen:
            raise SpecError(f"{where}[{i}]", f"value {values[index]!r} selected twice")
        seen.add(index)
        indices.append(index)
    return AttributeQuery("select", tuple(indices), read_only(np.eye(attribute.size)[indices]),
                          tuple(f"{attribute.name}[{values[i]}]" for i in indices))


def _matrix(argument: Any, attribute: AttributeSpec, where: str) -> AttributeQuery:
    name, n = attribute.name, attribute.size
    if not is_sequence(argument) or not all(is_sequence(row) for row in argument):
        raise SpecError(where, "expected a list of rows (lists of numbers)")
    for r, row in enumerate(argument):
        for c, entry in enumerate(row):
            if not is_number(entry):
                raise SpecError(f"{where}[{r}][{c}]", f"expected a number, got {type_name(entry)} {show(entry)}")
    lengths = {len(row) for row in argument}
    if len(lengths) > 1:
        raise SpecError(where, f"rows have different lengths {sorted(lengths)}")
    for r, row in enumerate(argument):
        for c, entry in enumerate(row):
            try:
                size = abs(float(entry))
            except OverflowError:  # an integer beyond the floats: custom_queries says so
                continue
            if size != 0 and math.isfinite(size) and MATRIX_ENTRY.excludes(size):
                raise SpecError(f"{where}[{r}][{c}]", f"must be 0 or of absolute value {MATRIX_ENTRY.text} "
                                                      f"(docs/spec.md, Ranges), got {show(entry)}")
    try:
        matrix = custom_queries([list(row) for row in argument])
    except ValueError as error:
        raise SpecError(where, str(error).removeprefix("matrix ")) from None
    if matrix.shape[1] != n:
        raise SpecError(where, f"expected {n} columns (one per value of {name}), got {matrix.shape[1]}")
    zero = np.flatnonzero(~np.any(matrix != 0, axis=1))
    if zero.size:
        raise SpecError(f"{where}[{int(zero[0])}]", "row is all zeros (a query that reads nothing)")
    params = tuple(tuple(float(v) + 0.0 for v in row) for row in matrix)
    return AttributeQuery("matrix", params, read_only(matrix),
                          tuple(f"{name}[#{r}]" for r in range(matrix.shape[0])))
