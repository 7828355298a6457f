"""Pipeline specs: a YAML file describing one run, validated into frozen dataclasses.

Schema reference (this text is copied into ``pipelines/README.md``)
==================================================================

A pipeline spec is a YAML mapping (one document) with these keys:

    name: pl94                      # required; letters, digits, "_" and "-" only
    description: free text          # optional string (not part of the spec hash)
    attributes:                     # required, non-empty, ordered list: the schema order
      - name: voting_age            #   required; letters, digits, "_" and "-"; unique
        values: [under_18, 18_plus] #   the value labels, in value order ...
        ordinal: false              #   optional, default false
      - {name: race, size: 63}      #   ... or `size: N` (labels "0", "1", ..., "N-1")
      - name: age                   #   ... or bins of a numeric data column (ordinal)
        column: age_years           #   optional: the data column (default: the name)
        bins: [0, 18, 65, .inf]     #   values 0-17, 18-64, 65+
      - name: sex
        values: [female, male]
        recode: {F: female, M: male}  # optional: data value -> label
    units: {column: block_id}       # optional; default null (one population)
    queries:                        # required, non-empty list of query groups
      - name: detailed              #   required; letters, digits, "_" and "-"; unique
        attributes:                 #   the clique: one query kind per attribute
          voting_age: identity
          race: {select: [white, black]}
        target: 4                   #   required: scalar, list, {file: targets.csv} or a rule
      - name: everyone
        total: true                 #   the grand total (one query, no attributes)
        target: 1
    privacy:                        # optional; default {mode: accuracy}
      mode: budget                  #   accuracy | budget
      rho: 0.5                      #   budget: exactly one of rho | epsilon and delta | alpha
    blocks:                         # optional
      max_cells: 4096               #   default 4096
      merge: true                   #   default true

Unknown keys are errors at every level (``spec: unknown key 'querys' (did you mean 'queries'?)``).

Attributes
----------
Cells of the domain are the combinations of attribute values, ordered row-major in the schema
order (the first attribute varies slowest), as in ``distfit.workload.Domain``.

* ``values``: a non-empty list of unique labels. A label is a string (integers are accepted and
  turned into strings) with no leading/trailing blanks, no control characters and none of
  ``[`` ``]`` ``,``. ``size: N`` (an integer >= 1) instead gives the labels ``"0"`` .. ``"N-1"``.
  Give exactly one of ``values`` and ``size``.
* ``ordinal``: ``true`` when the value order means something (ages, incomes); only ordinal
  attributes take ``prefix``, ``all_ranges`` and ``ranges`` queries.

Reading data
------------
Microdata (one row per person, CSV or Parquet) is mapped onto the schema attribute by attribute:

* ``column``: the data column the attribute is read from (default: its ``name``), e.g.
  ``{name: hours, column: hours-per-week, ...}``.
* ``bins: [e_0, e_1, ..., e_n]`` (numbers, strictly increasing; ``.inf``/``-.inf`` allowed as
  the first/last edge) for a numeric column: value v falls in bin i when ``e_i <= v < e_(i+1)``;
  values outside ``[e_0, e_n)`` are not in the domain. The attribute gets n values, labelled by
  default ``17-24`` (integral edges: the integers the bin holds; ``90`` for a one-integer bin),
  ``90+`` (open top), ``<17`` (open bottom) or ``0.5-1.5`` (other edges: half-open); ``values``
  may name them instead (n labels). Binned attributes are ordinal unless ``ordinal: false``.
  Give ``bins`` or ``size``, not both.
* Otherwise a data value is read as text (an integral number as its digits, ``3`` not ``3.0``),
  stripped of surrounding blanks (``" Male"`` is ``Male``), looked up in ``recode`` (a mapping
  ``{data value: label}``, several data values may share a label, e.g. ``{"?": unknown}`` or
  countries to regions) when it is a key there, and must then equal one of the labels.

A value that is missing or maps to no label is an error naming the file, line, column and
value (``distfit.data.microdata``). ``AttributeSpec.encode`` does the mapping.

Units
-----
``units: {column: NAME}`` names the data column of the unit of disjoint people (a geography such
as a census block). Every unit is answered with the same plan and units compose in parallel
(DESIGN.md section 2), so they cost no privacy. ``units: null`` (the default) means one
population.

Levels (multi-level runs)
-------------------------
A census-style run measures the same people at several geographic levels (nation, state,
county, ...), each level with its own workload and targets. Write ``levels`` instead of the
top-level ``queries`` and ``units``:

    levels:
      - name: nation                #   letters, digits, "_" and "-"; unique
        queries: [...]              #   query groups, exactly as the top-level queries
      - name: state
        units: {column: state}      #   optional: the level's unit column (default: one population)
        queries: [...]

Each level is planned and released on its own as the single-level spec
``PipelineSpec.level_spec(level)`` (named ``SPEC-LEVEL``): within a level, units compose in
parallel; across levels, composition is sequential (a person is in one unit of every level),
so the privacy profiles add up cell by cell (``distfit.plan.levels``). ``privacy`` and ``blocks``
apply to the whole run: a budget is the total over all levels.

Query groups
------------
A group is a clique of attributes with one query kind per attribute; its queries over the full
domain are the Kronecker product of the per-attribute query matrices (all-ones rows, i.e. totals,
over the attributes it does not name). ``attributes`` must name at least one attribute; write
``total: true`` instead (and no ``attributes``) for the grand total. The order in which a group
lists its attributes does not matter: the group always follows the schema order.

Query kinds (rows = queries, columns = the attribute's values):

| kind | queries | query label |
|------|---------|-------------|
| ``identity`` | one per value (the marginal) | ``race[white]`` |
| ``total`` | one: the sum over all values | ``race[*]`` |
| ``prefix`` (ordinal) | value <= v, one per value v | ``age[<=17]`` |
| ``all_ranges`` (ordinal) | lo <= value <= hi for every lo <= hi, by lo then hi: n(n+1)/2 | ``age[3..7]`` |
| ``{ranges: [[lo, hi], ...]}`` (ordinal) | lo <= value <= hi (inclusive), in the order given | ``age[18..115]`` |
| ``{select: [v, ...]}`` | rows of the identity: one count per listed value, in the order given, no repeats | ``race[white+black]`` |
| ``{matrix: [[...], ...]}`` | custom rows: one column per value, finite numbers, no all-zero row | ``race[#0]`` (row 0) |

In ``select`` and ``ranges`` an **integer is a value index** (0-based) and a **string is a value
label** (quote a label that looks like a number: ``'5'``). For ``size: N`` attributes the two
coincide.

A group's queries are ordered row-major over its attributes' query rows in schema order (first
attribute slowest); a query's label joins its attributes' labels with ``,``, e.g.
``voting_age[18_plus],race[white]`` (the grand total is labelled ``total``). Across the whole
spec the workload's queries are the groups' queries in the order of ``queries``, and a query's
workload label is ``GROUP:LABEL`` (``detailed:voting_age[18_plus],race[white]``).

``target`` (the variance target of each query, every one finite and > 0) is

* a number: the same target for every query of the group;
* a list of numbers, one per query in the group's query order;
* ``{file: PATH}``: the same list read from a file, PATH relative to the spec file's directory
  (``parse_spec``: relative to ``base_dir``, default the current directory). ``.csv``: numbers
  only, separated by commas, blanks or newlines, read in order; ``#`` starts a comment; no
  header. ``.npy``: a numeric array, 1-D or a single row or column;
* a rule ``{base: B, width_power: P, jitter: J, seed: S}`` (for groups with many queries, e.g.
  ``target: {base: 1.5, width_power: 0.25, jitter: 1}``): query j (0-based, in the group's
  query order) gets the target ``B * w_j**P * (1 + J * u_j)``. ``w_j`` is the number of cells of
  the group's marginal that query j reads: the product over its attributes of the values its row
  covers (1 for ``identity`` and ``select``, v + 1 for the prefix up to value index v, hi - lo + 1
  for a range, n for ``total``, the nonzero entries of a ``matrix`` row; 1 for the grand total).
  ``u_j`` in [0, 1) is a fixed pseudo-random number: the first 8 bytes of the SHA-256 of the
  UTF-8 text ``S:GROUP:j`` (``0:age-sex:3`` for query 3 of group ``age-sex``, seed 0), read as a
  big-endian integer and divided by 2**64. ``base`` is required (finite, > 0); ``width_power``
  (finite, default 0) makes queries that read more cells looser (P > 0) or tighter (P < 0);
  ``jitter`` (finite, >= 0, default 0) multiplies the targets by factors spread over
  [1, 1 + J); ``seed`` (an integer >= 0, default 0) draws other factors. Give a rule or
  ``file``, not both; the resulting targets must be finite and > 0.

Block limits: the marginal of a group's clique (the product of its attributes' sizes) must not
exceed ``blocks.max_cells``; otherwise ``queries[k].attributes: clique of N cells exceeds
blocks.max_cells = M``.

Privacy
-------
``mode: accuracy`` (accuracy first, DESIGN.md Problem 1): meet every target with the smallest
privacy cost; no budget keys allowed. ``mode: budget`` (privacy first, Problem 2): exactly one of
``rho`` (zCDP), ``epsilon`` and ``delta`` together (exact (epsilon, delta)-DP of the Gaussian
mechanism), or ``alpha`` (the privacy cost); every variance is then at most ``k`` times its target
with ``k`` as small as the budget allows. When ``mode`` is omitted it is ``budget`` if a budget
key is present and ``accuracy`` otherwise. Validated by ``distfit.privacy.Budget``.

Blocks
------
``max_cells`` (integer >= 1): the largest block (cells of the marginal it lives on) the planner
may form or merge into. ``merge`` (boolean): merge the residual blocks of one clique while the
result stays within ``max_cells``.

YAML dialect
------------
Specs are read with YAML 1.2 core-schema scalars: only ``true``/``false`` are booleans (``yes``,
``no``, ``on``, ``off`` stay strings); integers are decimal digits with an optional sign (``017``
is 17, while ``18_64`` and ``1:30`` stay strings), or ``0x``/``0o`` hexadecimal and octal;
``1e3`` and ``.inf`` are numbers; dates stay strings. A key repeated in one mapping is an error.

Errors
------
Every problem raises ``SpecError`` (a ``ValueError``) with a one-line message that starts
with the field path, e.g. ``queries[2].attributes.agee: unknown attribute 'agee' (attributes:
age, sex)``, ``attributes[3].name: duplicated attribute 'sex'``, ``queries[0].target: must be
> 0, got -1``, ``privacy: budget given two ways (rho and epsilon/delta); give exactly one``.
Problems with the file itself start with the file's path (``pl94.yaml: malformed YAML at line 7:
...``).

Canonical form and hash
-----------------------
``PipelineSpec.to_dict()`` is the validated spec as plain JSON data, itself a valid spec: every
attribute with its ``values`` list and ``ordinal``; every group's attributes in schema order with
canonical kinds (``"identity"``, ``"total"``, ``"prefix"``, ``"all_ranges"``, ``{"ranges": [[lo,
hi], ...]}`` and ``{"select": [i, ...]}`` with integer indices, ``{"matrix": [[...]]}`` with
floats); each target a single number when all of the group's targets are equal, else the list
(file and rule targets are inlined); privacy with ``mode`` and the budget keys; blocks in full.
``spec_hash`` is the SHA-256 of the canonical JSON (sorted keys, no blanks) of ``to_dict()``
without ``description``; the source path is never part of it. Two specs that differ only in key
order, in how a value is named (label or index) or in how a target is written have the same hash.
"""
from __future__ import annotations

import difflib
import functools
import hashlib
import itertools
import json
import math
import numbers
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Union

import numpy as np
import yaml

from distfit.privacy import Budget
from distfit.domain import Domain
from distfit.workload import (    Workload,
    all_range_queries,
    custom_queries,
    identity_queries,
    kron_queries,
    prefix_queries,
    range_queries,
    total_queries,
)

__all__ = [
    "SpecError",
    "AttributeSpec",
    "AttributeQuery",
    "QueryGroupSpec",
    "UnitsSpec",
    "PrivacySpec",
    "BlockLimits",
    "PipelineSpec",
    "QUERY_KINDS",
    "DEFAULT_MAX_CELLS",
    "WORKLOAD_MAX_CELLS",
    "load_spec",
    "parse_spec",
]

#: Query kinds a group may use on one attribute.
QUERY_KINDS: tuple[str, ...] = (
    "identity", "total", "prefix", "all_ranges", "ranges", "select", "matrix")
_ORDINAL_KINDS = ("prefix", "all_ranges", "ranges")
_PLAIN_KINDS = ("identity", "total", "prefix", "all_ranges")
_MAPPING_KINDS = ("ranges", "select", "matrix")

#: Default ``blocks.max_cells``.
DEFAULT_MAX_CELLS = 4096
#: ``PipelineSpec.workload()`` refuses domains with more cells than this (dense matrices).
WORKLOAD_MAX_CELLS = 5_000_000
#: ... and workload matrices with more entries than this (800 MB of float64).
WORKLOAD_MAX_ENTRIES = 100_000_000

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_BAD_LABEL_RE = re.compile(r"[\[\],\x00-\x1f\x7f]")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")

_TOP_KEYS = ("name", "description", "attributes", "units", "queries", "levels", "privacy", "blocks")
_LEVEL_KEYS = ("name", "units", "queries")
_ATTRIBUTE_KEYS = ("name", "values", "size", "ordinal", "column", "bins", "recode")
_GROUP_KEYS = ("name", "attributes", "total", "target")
_PRIVACY_KEYS = ("mode", "rho", "epsilon", "delta", "alpha")
_BUDGET_KEYS = ("rho", "epsilon", "delta", "alpha")
_BLOCK_KEYS = ("max_cells", "merge")
_UNIT_KEYS = ("column",)


class SpecError(ValueError):
    """A pipeline spec is invalid. ``str(error)`` is one line starting with the field path
    (``field``), or with the spec file's path for problems with the file itself."""

    def __init__(self, field: str, message: str):
        self.field = field
        self.problem = " ".join(str(message).split())
        super().__init__(f"{field}: {self.problem}")


# ---------------------------------------------------------------------------------------------
# Dataclasses
# ---------------------------------------------------------------------------------------------


def _readonly(array: np.ndarray) -> np.ndarray:
    array = np.array(array, dtype=float, copy=True)
    array.setflags(write=False)
    return array


@dataclass(frozen=True)
class AttributeSpec:
    """One attribute of the schema: its ``name``, value labels (``values``, in value order),
    whether the value order is meaningful (``ordinal``) and how data values map onto it
    (``column``, ``bins``, ``recode``; module docstring, "Reading data")."""

    name: str
    values: tuple[str, ...]
    ordinal: bool = False
    column: str | None = None
    bins: tuple[float, ...] | None = None
    recode: tuple[tuple[str, str], ...] = ()

    @property
    def size(self) -> int:
        """Number of values."""
        return len(self.values)

    @property
    def data_column(self) -> str:
        """The data column this attribute is read from (``column``, default the name)."""
        return self.column if self.column is not None else self.name

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "values": list(self.values), "ordinal": self.ordinal}
        # Only non-default reading rules are emitted, so specs without them keep their hash.
        if self.column is not None:
            out["column"] = self.column
        if self.bins is not None:
            out["bins"] = [_edge_json(edge) for edge in self.bins]
        if self.recode:
            out["recode"] = dict(self.recode)
        return out

    def encode(self, raw: Any) -> np.ndarray:
        """Value codes (int64, 0 .. size-1) of the raw data values ``raw`` (any 1-d array-like:
        strings as read from CSV, numbers or None/NaN from Parquet); -1 where a value is
        missing or not in the domain.

        With ``bins`` (edges e_0 < ... < e_n): a number v (or a string that parses as one) gets
        code i when e_i <= v < e_(i+1). Otherwise a value is turned into text (integral numbers
        without a decimal point), stripped of surrounding blanks, passed through ``recode`` when
        it is a key there, and matched against the labels.
        """
        array = np.asarray(raw, dtype=object) if not isinstance(raw, np.ndarray) else raw
        array = array.reshape(-1)
        if self.bins is not None:
            numbers_ = _as_floats(array)
            edges = np.asarray(self.bins, dtype=float)
            codes = np.searchsorted(edges, numbers_, side="right") - 1
            valid = np.isfinite(numbers_) & (codes >= 0) & (codes < self.size)
            return np.where(valid, codes, -1).astype(np.int64)
        uniques, inverse = np.unique(_as_labels(array), return_inverse=True)
        lookup = {label: i for i, label in enumerate(self.values)}
        recode = dict(self.recode)
        mapped = np.array([lookup.get(recode.get(u, u), -1) if u is not None else -1
                           for u in uniques.tolist()], dtype=np.int64)
        return mapped[inverse.reshape(-1)] if len(uniques) else np.zeros(0, dtype=np.int64)


_MISSING_TEXT = "\x00missing"  # stands for None/NaN in _as_labels; no valid label can equal it


def _edge_json(edge: float) -> Union[float, int, str]:
    if math.isinf(edge):
        return ".inf" if edge > 0 else "-.inf"
    return int(edge) if float(edge).is_integer() and abs(edge) < 2 ** 53 else float(edge)


def _as_floats(array: np.ndarray) -> np.ndarray:
    """Numbers of a raw column; NaN where a value is missing or does not parse."""
    if array.dtype.kind in "iufb":
        return array.astype(np.float64)
    uniques, inverse = np.unique(_as_labels(array), return_inverse=True)
    parsed = np.empty(len(uniques), dtype=np.float64)
    for i, text in enumerate(uniques.tolist()):
        try:
            parsed[i] = float(text)
        except (TypeError, ValueError):
            parsed[i] = np.nan
    return parsed[inverse.reshape(-1)] if len(uniques) else np.zeros(0)


def _as_labels(array: np.ndarray) -> np.ndarray:
    """Raw values as stripped text (an array of str); missing values (None, NaN) become a
    sentinel no label can equal. Python work is per distinct value, not per row."""
    if array.dtype.kind in "iu":
        return array.astype(str)
    if array.dtype.kind == "U":
        return np.char.strip(array)
    if array.dtype.kind == "f":
        missing = np.isnan(array)
        values = np.where(missing, 0.0, array)
    else:
        values = array.astype(object, copy=False)
        missing = np.equal(values, None) | np.not_equal(values, values)  # None, or NaN != NaN
    out = np.full(len(array), _MISSING_TEXT, dtype=object)
    present = ~missing
    if present.any():
        try:
            uniques, inverse = np.unique(values[present], return_inverse=True)
        except TypeError:  # mixed types do not sort: fall back to text first
            uniques, inverse = np.unique(values[present].astype(str), return_inverse=True)
        out[present] = np.array([_label_text(u) for u in uniques.tolist()], dtype=object)[inverse.reshape(-1)]
    return out.astype(str)


def _label_text(value: Any) -> str:
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value)).lower()
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value).strip()


@dataclass(frozen=True, eq=False)
class AttributeQuery:
    """The queries a group asks of one attribute.

    ``kind`` is one of :data:`QUERY_KINDS`; ``params`` holds the kind's arguments in canonical
    form (``ranges``: ``((lo, hi), ...)`` value indices; ``select``: value indices; ``matrix``:
    the rows as tuples of floats; otherwise ``()``); ``matrix`` is the (queries x values)
    read-only query matrix and ``labels`` one label per row (``age[<=17]``; module docstring).
    """

    kind: str
    params: tuple
    matrix: np.ndarray
    labels: tuple[str, ...]

    @property
    def num_queries(self) -> int:
        return int(self.matrix.shape[0])

    def to_canonical(self) -> Union[str, dict[str, Any]]:
        """The kind as it appears in :meth:`PipelineSpec.to_dict`."""
        if self.kind in _PLAIN_KINDS:
            return self.kind
        if self.kind == "ranges":
            return {"ranges": [[int(lo), int(hi)] for lo, hi in self.params]}
        if self.kind == "select":
            return {"select": [int(i) for i in self.params]}
        return {"matrix": [[float(v) + 0.0 for v in row] for row in self.params]}


@dataclass(frozen=True, eq=False)
class QueryGroupSpec:
    """A query group: its ``name``, the per-attribute queries ``((attribute, AttributeQuery),
    ...)`` in schema order (empty for the grand total) and one variance target per query
    (``targets``, read-only, in the group's row-major query order)."""

    name: str
    queries: tuple[tuple[str, AttributeQuery], ...]
    targets: np.ndarray

    @property
    def attributes(self) -> tuple[str, ...]:
        """The clique (schema order); ``()`` for the grand total."""
        return tuple(attribute for attribute, _ in self.queries)

    @property
    def matrices(self) -> dict[str, np.ndarray]:
        """``{attribute: Q_i}``, the per-attribute query matrices (read-only), schema order."""
        return {attribute: query.matrix for attribute, query in self.queries}

    @property
    def num_queries(self) -> int:
        """Product of the per-attribute query counts (1 for the grand total)."""
        return math.prod(query.num_queries for _, query in self.queries)

    @property
    def labels(self) -> tuple[str, ...]:
        """One label per query, e.g. ``voting_age[18_plus],race[white]``; ``total`` for the
        grand total."""
        if not self.queries:
            return ("total",)
        return tuple(",".join(parts) for parts in itertools.product(
            *(query.labels for _, query in self.queries)))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.queries:
            out["attributes"] = {attribute: query.to_canonical() for attribute, query in self.queries}
        else:
            out["total"] = True
        targets = [float(t) for t in self.targets]
        out["target"] = targets[0] if all(t == targets[0] for t in targets) else targets
        return out


@dataclass(frozen=True)
class UnitsSpec:
    """The unit of disjoint people: the data column that identifies it."""

    column: str

    def to_dict(self) -> dict[str, Any]:
        return {"column": self.column}


@dataclass(frozen=True)
class PrivacySpec:
    """``mode`` is ``"accuracy"`` (``budget`` None) or ``"budget"`` (``budget`` a
    :class:`distfit.privacy.Budget`)."""

    mode: str = "accuracy"
    budget: Budget | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"mode": self.mode}
        if self.budget is not None:
            out.update(self.budget.to_dict())
        return out


@dataclass(frozen=True)
class BlockLimits:
    """``max_cells``: largest block (cells of its marginal) the planner may form or merge into;
    ``merge``: merge residual blocks of one clique while within ``max_cells``."""

    max_cells: int = DEFAULT_MAX_CELLS
    merge: bool = True

    def to_dict(self) -> dict[str, Any]:
        return {"max_cells": self.max_cells, "merge": self.merge}


@dataclass(frozen=True, eq=False)
class LevelSpec:
    """One geographic level of a multi-level spec: its ``name``, its unit (``units``, None for
    the whole population) and its query groups."""

    name: str
    units: UnitsSpec | None
    groups: tuple[QueryGroupSpec, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "units": None if self.units is None else self.units.to_dict(),
                "queries": [group.to_dict() for group in self.groups]}


@dataclass(frozen=True, eq=False)
class PipelineSpec:
    """A validated pipeline spec (module docstring). Compare specs by :attr:`spec_hash`.

    A multi-level spec has ``levels`` (and no ``groups`` or ``units`` of its own); each level is
    planned and released as the single-level spec :meth:`level_spec` gives.
    """

    name: str
    description: str
    attributes: tuple[AttributeSpec, ...]
    units: UnitsSpec | None
    groups: tuple[QueryGroupSpec, ...]
    privacy: PrivacySpec
    blocks: BlockLimits
    source_path: str | None = None
    levels: tuple[LevelSpec, ...] = ()

    @property
    def multilevel(self) -> bool:
        """True when the spec has ``levels``."""
        return bool(self.levels)

    def level_spec(self, name: str) -> "PipelineSpec":
        """The single-level spec of level ``name``: named ``SPEC-LEVEL``, the spec's attributes
        and blocks, the level's units and groups, and accuracy-first privacy (a budget is shared
        across levels by the run, :mod:`distfit.plan.levels`). KeyError if there is no such level."""
        for level in self.levels:
            if level.name == name:
                return PipelineSpec(
                    name=f"{self.name}-{level.name}", description=self.description,
                    attributes=self.attributes, units=level.units, groups=level.groups,
                    privacy=PrivacySpec(), blocks=self.blocks, source_path=self.source_path)
        raise KeyError(name)

    @property
    def domain(self) -> Domain:
        """The schema as a :class:`distfit.workload.Domain` (names and sizes, schema order)."""
        return Domain(tuple(a.name for a in self.attributes), tuple(a.size for a in self.attributes))

    def attribute(self, name: str) -> AttributeSpec:
        """The attribute called ``name`` (KeyError if none)."""
        for attribute in self.attributes:
            if attribute.name == name:
                return attribute
        raise KeyError(name)

    def group(self, name: str) -> QueryGroupSpec:
        """The query group called ``name`` (KeyError if none)."""
        for group in self.groups:
            if group.name == name:
                return group
        raise KeyError(name)

    @property
    def num_queries(self) -> int:
        """m, the number of workload queries (all groups)."""
        return sum(group.num_queries for group in self.groups)

    @property
    def targets(self) -> np.ndarray:
        """All targets, groups in order (m,)."""
        return np.concatenate([group.targets for group in self.groups])

    @property
    def query_labels(self) -> tuple[str, ...]:
        """All workload query labels ``GROUP:LABEL``, groups in order."""
        return tuple(f"{group.name}:{label}" for group in self.groups for label in group.labels)

    def group_triples(self) -> list[tuple[str, dict[str, np.ndarray], np.ndarray]]:
        """``(name, {attribute: Q_i}, targets)`` per group, in order: the input of
        ``blocks.residual_blocks`` and ``workload.workload_from_groups``. A multi-level spec
        has none of its own: SpecError (plan it level by level, :meth:`level_spec`)."""
        if self.levels:
            raise SpecError("levels", f"spec {self.name!r} has levels "
                                      f"({', '.join(level.name for level in self.levels)}); each level is "
                                      "planned, tabulated and released on its own: use distfit run "
                                      "(distfit tabulate: --level NAME)")
        return [(group.name, group.matrices, group.targets) for group in self.groups]

    def workload(self) -> Workload:
        """The whole workload as one dense :class:`Workload` (labels ``GROUP:LABEL``).

        Only for small domains: ValueError when the domain has more than
        :data:`WORKLOAD_MAX_CELLS` cells or the matrix more than :data:`WORKLOAD_MAX_ENTRIES`
        entries (plan such specs block by block with ``group_triples``).
        """
        domain = self.domain
        if domain.size > WORKLOAD_MAX_CELLS:
            raise ValueError(
                f"spec {self.name!r}: the domain has {domain.size} cells, more than "
                f"{WORKLOAD_MAX_CELLS} for a dense workload matrix; use group_triples() and "
                f"blocks.residual_blocks instead")
        entries = self.num_queries * domain.size
        if entries > WORKLOAD_MAX_ENTRIES:
            raise ValueError(
                f"spec {self.name!r}: the workload matrix would have {self.num_queries} x "
                f"{domain.size} = {entries} entries, more than {WORKLOAD_MAX_ENTRIES}; use "
                f"group_triples() and blocks.residual_blocks instead")
        matrix = np.vstack([kron_queries(domain, group.matrices) for group in self.groups])
        return Workload(matrix, self.targets, self.query_labels, domain)

    def to_dict(self) -> dict[str, Any]:
        """The canonical, JSON-serialisable form (module docstring); a valid spec itself."""
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "attributes": [attribute.to_dict() for attribute in self.attributes],
        }
        if self.levels:
            out["levels"] = [level.to_dict() for level in self.levels]
        else:
            out["units"] = None if self.units is None else self.units.to_dict()
            out["queries"] = [group.to_dict() for group in self.groups]
        out["privacy"] = self.privacy.to_dict()
        out["blocks"] = self.blocks.to_dict()
        return out

    @functools.cached_property
    def spec_hash(self) -> str:
        """SHA-256 (hex) of the canonical JSON of :meth:`to_dict` without ``description``."""
        content = self.to_dict()
        del content["description"]
        text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                          allow_nan=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()


# ---------------------------------------------------------------------------------------------
# YAML loading
# ---------------------------------------------------------------------------------------------


class _SpecLoader(yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars and duplicate-key detection."""

    def construct_mapping(self, node, deep=False):  # noqa: D401 - PyYAML hook
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, Any] = {}
            for key_node, _ in node.value:
                if isinstance(key_node, yaml.ScalarNode):
                    key = self.construct_object(key_node, deep=True)
                    try:
                        if key in seen:
                            raise yaml.constructor.ConstructorError(
                                "while constructing a mapping", node.start_mark,
                                f"duplicate key {key!r}", key_node.start_mark)
                        seen[key] = True
                    except TypeError:
                        pass
        return super().construct_mapping(node, deep=deep)


_SpecLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers
            if tag not in ("tag:yaml.org,2002:bool", "tag:yaml.org,2002:int",
                           "tag:yaml.org,2002:float", "tag:yaml.org,2002:timestamp",
                           "tag:yaml.org,2002:value")]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:bool", re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF"))
_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:int", re.compile(r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$"),
    list("-+0123456789"))
_SpecLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
               r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$"),
    list("-+0123456789."))


def _construct_bool(loader, node):
    return loader.construct_scalar(node).lower() == "true"


def _construct_int(loader, node):
    text = loader.construct_scalar(node)
    if text.startswith("0o"):
        return int(text[2:], 8)
    if text.startswith("0x"):
        return int(text[2:], 16)
    return int(text, 10)


def _construct_float(loader, node):
    text = loader.construct_scalar(node).lower()
    if text.endswith(".inf"):
        return -math.inf if text.startswith("-") else math.inf
    if text == ".nan":
        return math.nan
    return float(text)


_SpecLoader.add_constructor("tag:yaml.org,2002:bool", _construct_bool)
_SpecLoader.add_constructor("tag:yaml.org,2002:int", _construct_int)
_SpecLoader.add_constructor("tag:yaml.org,2002:float", _construct_float)


def _yaml_error(source: str, error: yaml.YAMLError) -> SpecError:
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    problem = getattr(error, "problem", None) or str(error)
    context = getattr(error, "context", None)
    text = f"{problem} ({context})" if context else str(problem)
    where = f" at line {mark.line + 1}" if mark is not None else ""
    return SpecError(source, f"malformed YAML{where}: {text}")


def load_spec(path: Union[str, os.PathLike]) -> PipelineSpec:
    """Read and validate the spec file ``path`` (target files are relative to its directory)."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as handle:
            raw = handle.read()
    except OSError as error:
        raise SpecError(source, f"cannot read the spec: {error.strerror or error}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise SpecError(source, f"not UTF-8 text (byte {error.start})") from None
    try:
        documents = list(yaml.load_all(text, Loader=_SpecLoader))
    except yaml.YAMLError as error:
        raise _yaml_error(source, error) from None
    documents = [doc for doc in documents if doc is not None]
    if not documents:
        raise SpecError(source, "empty spec (expected a mapping with name, attributes, queries)")
    if len(documents) > 1:
        raise SpecError(source, f"holds {len(documents)} YAML documents; expected one")
    return parse_spec(documents[0], base_dir=Path(source).resolve().parent,
                      source_path=str(Path(source).resolve()))


# ---------------------------------------------------------------------------------------------
# Validation helpers
# ---------------------------------------------------------------------------------------------


def _type_name(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, (bool, np.bool_)):
        return "a boolean"
    if isinstance(value, (numbers.Integral, np.integer)):
        return "an integer"
    if isinstance(value, (numbers.Real, np.floating)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, Mapping):
        return "a mapping"
    if isinstance(value, (list, tuple, np.ndarray)):
        return "a list"
    return type(value).__name__


def _show(value: Any) -> str:
    """Short one-line rendering of a value for messages."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (np.integer, np.floating)):
        value = value.item()
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _listing(names: Sequence[str], limit: int = 10) -> str:
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (", ..." if len(names) > limit else "")


def _is_int(value: Any) -> bool:
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))


def _is_number(value: Any) -> bool:
    return isinstance(value, (numbers.Real, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_))


def _is_sequence(value: Any) -> bool:
    return isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim >= 1)


def _mapping(value: Any, path: str, what: str) -> Mapping:
    if not isinstance(value, Mapping):
        raise SpecError(path, f"expected {what}, got {_type_name(value)}")
    for key in value:
        if not isinstance(key, str):
            raise SpecError(path, f"keys must be strings, got {_type_name(key)} {_show(key)}")
    return value


def _check_keys(value: Mapping, path: str, allowed: Sequence[str], required: Sequence[str] = ()
                ) -> None:
    for key in value:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (expected {', '.join(allowed)})"
            raise SpecError(path, f"unknown key {key!r}{hint}")
    for key in required:
        if key not in value:
            raise SpecError(path, f"missing required key {key!r}")


def _name(value: Any, path: str, what: str) -> str:
    if not isinstance(value, str):
        raise SpecError(path, f"expected {what} (a string), got {_type_name(value)} {_show(value)}")
    if not _NAME_RE.match(value):
        raise SpecError(path, f"{what} {value!r} may hold only letters, digits, '_' and '-'")
    return value


def _bool(value: Any, path: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise SpecError(path, f"expected true or false, got {_type_name(value)} {_show(value)}")
    return bool(value)


def _positive_int(value: Any, path: str) -> int:
    if not _is_int(value):
        raise SpecError(path, f"expected an integer >= 1, got {_type_name(value)} {_show(value)}")
    if int(value) < 1:
        raise SpecError(path, f"must be >= 1, got {int(value)}")
    return int(value)


# ---------------------------------------------------------------------------------------------
# Sections
# ---------------------------------------------------------------------------------------------


def _parse_attribute(raw: Any, path: str) -> AttributeSpec:
    raw = _mapping(raw, path, "an attribute mapping (name, values or size, ordinal)")
    _check_keys(raw, path, _ATTRIBUTE_KEYS, required=("name",))
    name = _name(raw["name"], f"{path}.name", "an attribute name")
    has_values = raw.get("values") is not None
    has_size = raw.get("size") is not None
    bins = _parse_bins(raw["bins"], f"{path}.bins") if raw.get("bins") is not None else None
    if has_values and has_size:
        raise SpecError(path, "give values or size, not both")
    if bins is not None and has_size:
        raise SpecError(path, "give bins or size, not both (bins make len(bins) - 1 values)")
    if not has_values and not has_size and bins is None:
        raise SpecError(path, f"attribute {name!r} needs values (a list of labels), size or bins")
    if bins is not None and not has_values:
        values = _bin_labels(bins)
    elif has_size:
        size = _positive_int(raw["size"], f"{path}.size")
        values = tuple(str(i) for i in range(size))
    else:
        given = raw["values"]
        if not _is_sequence(given):
            raise SpecError(f"{path}.values", f"expected a list of value labels, got {_type_name(given)}")
        if len(given) == 0:
            raise SpecError(f"{path}.values", "must hold at least one value label")
        labels = []
        seen: set[str] = set()
        for i, label in enumerate(given):
            where = f"{path}.values[{i}]"
            if _is_int(label):
                label = str(int(label))
            if not isinstance(label, str):
                raise SpecError(where, f"expected a string label, got {_type_name(label)} {_show(label)}")
            if not label or label != label.strip() or _BAD_LABEL_RE.search(label):
                raise SpecError(where, f"bad label {label!r}: labels are non-empty, without "
                                       "leading/trailing blanks, control characters, '[', ']' or ','")
            if label in seen:
                raise SpecError(where, f"duplicated value label {label!r}")
            seen.add(label)
            labels.append(label)
        values = tuple(labels)
    if bins is not None and len(values) != len(bins) - 1:
        raise SpecError(f"{path}.values", f"{len(bins) - 1} bins need {len(bins) - 1} value labels, "
                                          f"got {len(values)}")
    # Bins are ordered by construction, so they are ordinal unless the spec says otherwise.
    ordinal = (_bool(raw["ordinal"], f"{path}.ordinal") if raw.get("ordinal") is not None
               else bins is not None)
    column = None
    if raw.get("column") is not None:
        column = raw["column"]
        if not isinstance(column, str) or not column.strip() or _CONTROL_RE.search(column):
            raise SpecError(f"{path}.column", f"expected a data column name, got {_type_name(column)} "
                                              f"{_show(column)}")
        column = None if column == name else column
    recode: tuple[tuple[str, str], ...] = ()
    if raw.get("recode") is not None:
        if bins is not None:
            raise SpecError(f"{path}.recode", "give recode or bins, not both")
        recode = _parse_recode(raw["recode"], f"{path}.recode", values)
    return AttributeSpec(name=name, values=values, ordinal=ordinal, column=column, bins=bins,
                         recode=recode)


def _parse_bins(raw: Any, path: str) -> tuple[float, ...]:
    if not _is_sequence(raw):
        raise SpecError(path, f"expected a list of bin edges, got {_type_name(raw)} {_show(raw)}")
    edges = []
    for i, edge in enumerate(raw):
        if isinstance(edge, str) and edge.strip().lower() in _INFINITE_EDGES:
            edge = _INFINITE_EDGES[edge.strip().lower()]  # the canonical JSON form of +-inf
        if not _is_number(edge) or math.isnan(float(edge)):
            raise SpecError(f"{path}[{i}]", f"expected a number, got {_type_name(edge)} {_show(edge)}")
        edges.append(float(edge))
    if len(edges) < 2:
        raise SpecError(path, f"needs at least 2 edges (one bin), got {len(edges)}")
    for i in range(1, len(edges)):
        if not edges[i] > edges[i - 1]:
            raise SpecError(f"{path}[{i}]", f"edges must increase strictly, got {_show(raw[i - 1])} "
                                            f"then {_show(raw[i])}")
    return tuple(edges)


_INFINITE_EDGES = {".inf": math.inf, "inf": math.inf, "+.inf": math.inf, "+inf": math.inf,
                   "-.inf": -math.inf, "-inf": -math.inf}


def _bin_labels(edges: Sequence[float]) -> tuple[str, ...]:
    """Default labels of the bins [e_i, e_(i+1)): ``17-24`` (integral edges: the integers the
    bin holds), ``90+`` (open top), ``<17`` (open bottom), ``0.5-1.5`` (else: half-open)."""
    integral = all(math.isinf(e) or float(e).is_integer() for e in edges)
    labels = []
    for lo, hi in zip(edges[:-1], edges[1:]):
        if math.isinf(hi):
            labels.append(f"{_edge_text(lo)}+")
        elif math.isinf(lo):
            labels.append(f"<{_edge_text(hi)}")
        elif integral and hi - lo == 1:
            labels.append(_edge_text(lo))
        elif integral:
            labels.append(f"{_edge_text(lo)}-{_edge_text(hi - 1)}")
        else:
            labels.append(f"{_edge_text(lo)}-{_edge_text(hi)}")
    return tuple(labels)


def _edge_text(edge: float) -> str:
    return str(int(edge)) if float(edge).is_integer() else f"{edge:g}"


def _parse_recode(raw: Any, path: str, values: Sequence[str]) -> tuple[tuple[str, str], ...]:
    raw = _mapping(raw, path, "a mapping {data value: label}")
    pairs = []
    for key, label in raw.items():
        if _is_int(label):
            label = str(int(label))
        if not isinstance(label, str) or label not in values:
            raise SpecError(f"{path}.{key}", f"{_show(label)} is not a value label "
                                             f"(values: {_listing(values)})")
        pairs.append((key.strip(), label))
    return tuple(sorted(pairs))


def _value_index(value: Any, attribute: AttributeSpec, path: str) -> int:
    """A value named by index (int) or by label (str)."""
    if _is_int(value):
        index = int(value)
        if not 0 <= index < attribute.size:
            hint = ""
            if str(index) in attribute.values:
                hint = f" (quote it, '{index}', to name the value by its label)"
            raise SpecError(path, f"value index {index} out of range 0..{attribute.size - 1} "
                                  f"of {attribute.name}{hint}")
        return index
    if isinstance(value, str):
        try:
            return attribute.values.index(value)
        except ValueError:
            raise SpecError(path, f"unknown value {value!r} of {attribute.name} "
                                  f"(values: {_listing(attribute.values)})") from None
    raise SpecError(path, f"expected a value label or index, got {_type_name(value)} {_show(value)}")


def _parse_query(raw: Any, attribute: AttributeSpec, path: str) -> AttributeQuery:
    name, n, values = attribute.name, attribute.size, attribute.values
    expected = ("expected identity, total, prefix, all_ranges, {ranges: [[lo, hi], ...]}, "
                "{select: [values]} or {matrix: [[...]]}")
    if isinstance(raw, str):
        kind, argument = raw, None
        if kind not in _PLAIN_KINDS:
            close = difflib.get_close_matches(kind, QUERY_KINDS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise SpecError(path, f"unknown query kind {kind!r} ({hint}{expected})")
    elif isinstance(raw, Mapping):
        if len(raw) != 1 or next(iter(raw)) not in _MAPPING_KINDS:
            keys = ", ".join(repr(k) for k in raw) or "no key"
            raise SpecError(path, f"a query-kind mapping has exactly one key, ranges, select or "
                                  f"matrix; got {keys}")
        kind, argument = next(iter(raw.items()))
    else:
        raise SpecError(path, f"{expected}; got {_type_name(raw)} {_show(raw)}")
    if kind in _ORDINAL_KINDS and not attribute.ordinal:
        raise SpecError(path, f"{kind} queries need an ordinal attribute ({name} is not; "
                              "set ordinal: true on it)")
    if kind == "identity":
        return AttributeQuery("identity", (), _readonly(identity_queries(n)),
                              tuple(f"{name}[{v}]" for v in values))
    if kind == "total":
        return AttributeQuery("total", (), _readonly(total_queries(n)), (f"{name}[*]",))
    if kind == "prefix":
        return AttributeQuery("prefix", (), _readonly(prefix_queries(n)),
                              tuple(f"{name}[<={v}]" for v in values))
    if kind == "all_ranges":
        lo, hi = np.triu_indices(n)
        return AttributeQuery("all_ranges", (), _readonly(all_range_queries(n)),
                              tuple(f"{name}[{values[a]}..{values[b]}]" for a, b in zip(lo, hi)))
    where = f"{path}.{kind}"
    if kind == "ranges":
        if not _is_sequence(argument) or len(argument) == 0:
            raise SpecError(where, f"expected a non-empty list of [lo, hi] pairs, got {_type_name(argument)}")
        pairs = []
        for r, pair in enumerate(argument):
            if not _is_sequence(pair) or len(pair) != 2:
                raise SpecError(f"{where}[{r}]", f"expected a [lo, hi] pair, got {_show(pair)}")
            lo = _value_index(pair[0], attribute, f"{where}[{r}]")
            hi = _value_index(pair[1], attribute, f"{where}[{r}]")
            if lo > hi:
                raise SpecError(f"{where}[{r}]", f"empty range: lo {values[lo]!r} comes after "
                                                 f"hi {values[hi]!r}")
            pairs.append((lo, hi))
        return AttributeQuery("ranges", tuple(pairs), _readonly(range_queries(n, pairs)),
                              tuple(f"{name}[{values[lo]}..{values[hi]}]" for lo, hi in pairs))
    if kind == "select":
        if not _is_sequence(argument) or len(argument) == 0:
            raise SpecError(where, f"expected a non-empty list of values, got {_type_name(argument)}")
        indices: list[int] = []
        for i, value in enumerate(argument):
            index = _value_index(value, attribute, f"{where}[{i}]")
            if index in indices:
                raise SpecError(f"{where}[{i}]", f"value {values[index]!r} selected twice")
            indices.append(index)
        return AttributeQuery("select", tuple(indices), _readonly(np.eye(n)[indices]),
                              tuple(f"{name}[{values[i]}]" for i in indices))
    # matrix
    if not _is_sequence(argument) or not all(_is_sequence(row) for row in argument):
        raise SpecError(where, "expected a list of rows (lists of numbers)")
    for r, row in enumerate(argument):
        for c, entry in enumerate(row):
            if not _is_number(entry):
                raise SpecError(f"{where}[{r}][{c}]", f"expected a number, got {_type_name(entry)} {_show(entry)}")
    lengths = {len(row) for row in argument}
    if len(lengths) > 1:
        raise SpecError(where, f"rows have different lengths {sorted(lengths)}")
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
    return AttributeQuery("matrix", params, _readonly(matrix),
                          tuple(f"{name}[#{r}]" for r in range(matrix.shape[0])))


def _check_targets(targets: np.ndarray, path: str, source: str = "") -> np.ndarray:
    bad = ~np.isfinite(targets) | (targets <= 0)
    if np.any(bad):
        j = int(np.flatnonzero(bad)[0])
        value = targets[j]
        shown = int(value) if np.isfinite(value) and value == int(value) else float(value)
        raise SpecError(path, f"value [{j}]{source} must be finite and > 0, got {shown}")
    return targets


def _read_target_file(raw: Any, path: str, base_dir: Path, expected: int) -> np.ndarray:
    if not isinstance(raw, str) or not raw:
        raise SpecError(path, f"expected a file path (a string), got {_type_name(raw)} {_show(raw)}")
    file_path = Path(raw)
    if not file_path.is_absolute():
        file_path = base_dir / file_path
    suffix = file_path.suffix.lower()
    if suffix not in (".csv", ".npy"):
        raise SpecError(path, f"unsupported target file {raw!r}: use .csv or .npy")
    if suffix == ".npy":
        try:
            array = np.load(file_path, allow_pickle=False)
        except (OSError, ValueError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise SpecError(path, f"cannot read {raw!r}: {reason}") from None
        if not isinstance(array, np.ndarray) or not (
                np.issubdtype(array.dtype, np.integer) or np.issubdtype(array.dtype, np.floating)):
            raise SpecError(path, f"{raw!r} must hold a numeric array, got dtype {getattr(array, 'dtype', '?')}")
        if array.ndim == 2 and 1 in array.shape:
            array = array.ravel()
        if array.ndim != 1:
            raise SpecError(path, f"{raw!r} must hold a 1-D array (or one row or column), "
                                  f"got shape {array.shape}")
        values = array.astype(float)
    else:
        try:
            text = file_path.read_text(encoding="utf-8")
        except OSError as error:
            raise SpecError(path, f"cannot read {raw!r}: {error.strerror or error}") from None
        except UnicodeDecodeError:
            raise SpecError(path, f"cannot read {raw!r}: not UTF-8 text") from None
        numbers_read: list[float] = []
        for line_number, line in enumerate(text.splitlines(), start=1):
            for token in re.split(r"[,\s]+", line.split("#", 1)[0].strip()):
                if not token:
                    continue
                try:
                    numbers_read.append(float(token))
                except ValueError:
                    raise SpecError(path, f"{raw!r} line {line_number}: {token!r} is not a number "
                                          "(a target .csv holds numbers only, no header)") from None
        values = np.array(numbers_read, dtype=float)
    if values.size != expected:
        raise SpecError(path, f"expected {expected} values (one per query), got {values.size} "
                              f"in {raw!r}")
    return _check_targets(values, path, f" of {raw!r}")


_TARGET_FILE_KEYS = ("file",)
_TARGET_RULE_KEYS = ("base", "width_power", "jitter", "seed")


def _rule_number(raw: Mapping, key: str, path: str, default: float, minimum: float | None,
                 strict: bool) -> float:
    """A finite number of a target rule (``minimum``: > it when ``strict``, else >= it)."""
    if key not in raw:
        return default
    value = raw[key]
    where = f"{path}.{key}"
    if not _is_number(value):
        raise SpecError(where, f"expected a number, got {_type_name(value)} {_show(value)}")
    number = float(value)
    if not math.isfinite(number):
        raise SpecError(where, f"must be finite, got {_show(value)}")
    if minimum is not None and (number <= minimum if strict else number < minimum):
        bound = f"> {minimum:g}" if strict else f">= {minimum:g}"
        raise SpecError(where, f"must be finite and {bound}, got {_show(value)}")
    return number


def _rule_jitter(seed: int, group: str, count: int) -> np.ndarray:
    """The pseudo-random numbers ``u_j`` in [0, 1) of a target rule (module docstring): the first
    8 bytes of SHA-256 of ``"{seed}:{group}:{j}"``, big-endian, divided by 2**64."""
    return np.array([
        int.from_bytes(hashlib.sha256(f"{seed}:{group}:{j}".encode("utf-8")).digest()[:8], "big")
        / 2.0**64 for j in range(count)], dtype=float)


def _query_widths(queries: Sequence[tuple[str, AttributeQuery]]) -> np.ndarray:
    """Cells of the group's marginal that each query reads (row-major query order): the
    product of the per-attribute counts of nonzero entries; ``[1.]`` for the grand total."""
    widths = np.ones(1)
    for _, query in queries:
        widths = np.kron(widths, np.count_nonzero(query.matrix, axis=1).astype(float))
    return widths


def _rule_targets(raw: Mapping, path: str, group: str,
                  queries: Sequence[tuple[str, AttributeQuery]]) -> np.ndarray:
    if "base" not in raw:
        raise SpecError(path, "missing required key 'base' (a target rule is {base: B, "
                              "width_power: P, jitter: J, seed: S}; or give {file: PATH})")
    base = _rule_number(raw, "base", path, 1.0, 0.0, strict=True)
    power = _rule_number(raw, "width_power", path, 0.0, None, strict=False)
    jitter = _rule_number(raw, "jitter", path, 0.0, 0.0, strict=False)
    seed = 0
    if "seed" in raw:
        seed = raw["seed"]
        if not _is_int(seed) or int(seed) < 0:
            raise SpecError(f"{path}.seed", f"expected an integer >= 0, got {_type_name(seed)} "
                                            f"{_show(seed)}")
        seed = int(seed)
    widths = _query_widths(queries)
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):
        targets = base * widths ** power
        if jitter:
            targets = targets * (1.0 + jitter * _rule_jitter(seed, group, widths.size))
    bad = ~np.isfinite(targets) | (targets <= 0)
    if np.any(bad):
        j = int(np.flatnonzero(bad)[0])
        raise SpecError(path, f"the rule gives query [{j}] the target {float(targets[j])!r}; "
                              "targets must be finite and > 0")
    return targets


def _parse_target(raw: Any, path: str, base_dir: Path, expected: int, group: str = "",
                  queries: Sequence[tuple[str, AttributeQuery]] = ()) -> np.ndarray:
    if _is_number(raw):
        value = float(raw)
        if not (math.isfinite(value) and value > 0):
            raise SpecError(path, f"must be > 0, got {_show(raw)}" if math.isfinite(value)
                            else f"must be finite and > 0, got {_show(raw)}")
        return np.full(expected, value)
    if isinstance(raw, Mapping):
        _mapping(raw, path, "a target")
        _check_keys(raw, path, _TARGET_FILE_KEYS + _TARGET_RULE_KEYS)
        if "file" in raw:
            rule_keys = [key for key in _TARGET_RULE_KEYS if key in raw]
            if rule_keys:
                raise SpecError(path, f"give {{file: PATH}} or a rule ({', '.join(rule_keys)}), "
                                      "not both")
            return _read_target_file(raw["file"], f"{path}.file", base_dir, expected)
        return _rule_targets(raw, path, group, queries)
    if _is_sequence(raw):
        items = list(np.asarray(raw).ravel()) if isinstance(raw, np.ndarray) else list(raw)
        for j, item in enumerate(items):
            if not _is_number(item):
                raise SpecError(f"{path}[{j}]", f"expected a number, got {_type_name(item)} {_show(item)}")
        if len(items) != expected:
            raise SpecError(path, f"expected {expected} values (one per query), got {len(items)}")
        values = np.array([float(item) for item in items], dtype=float)
        bad = ~np.isfinite(values) | (values <= 0)
        if np.any(bad):
            j = int(np.flatnonzero(bad)[0])
            raise SpecError(f"{path}[{j}]", f"must be finite and > 0, got {_show(items[j])}")
        return values
    raise SpecError(path, f"expected a number, a list of numbers or {{file: PATH}} (or a rule "
                          f"{{base: B, ...}}), got {_type_name(raw)} {_show(raw)}")


def _parse_group(raw: Any, path: str, attributes: Sequence[AttributeSpec], max_cells: int,
                 base_dir: Path) -> QueryGroupSpec:
    raw = _mapping(raw, path, "a query group mapping (name, attributes or total, target)")
    _check_keys(raw, path, _GROUP_KEYS, required=("name",))
    name = _name(raw["name"], f"{path}.name", "a group name")
    total = _bool(raw["total"], f"{path}.total") if raw.get("total") is not None else False
    given = raw.get("attributes")
    by_name = {attribute.name: attribute for attribute in attributes}
    queries: list[tuple[str, AttributeQuery]] = []
    if total:
        if given is not None:
            raise SpecError(path, "give attributes or total: true, not both")
    else:
        if given is None:
            raise SpecError(path, "missing required key 'attributes' (or total: true for the "
                                  "grand total)")
        given = _mapping(given, f"{path}.attributes",
                         "a mapping of attribute: query kind")
        if not given:
            raise SpecError(f"{path}.attributes", "empty; name at least one attribute, or write "
                                                  "total: true for the grand total")
        for attribute_name in given:
            if attribute_name not in by_name:
                raise SpecError(f"{path}.attributes.{attribute_name}",
                                f"unknown attribute {attribute_name!r} "
                                f"(attributes: {_listing(list(by_name))})")
        for attribute in attributes:
            if attribute.name in given:
                queries.append((attribute.name, _parse_query(
                    given[attribute.name], attribute, f"{path}.attributes.{attribute.name}")))
        cells = math.prod(by_name[a].size for a, _ in queries)
        if cells > max_cells:
            raise SpecError(f"{path}.attributes",
                            f"clique of {cells} cells exceeds blocks.max_cells = {max_cells}")
    if "target" not in raw:
        raise SpecError(path, "missing required key 'target'")
    expected = math.prod(query.num_queries for _, query in queries)
    targets = _parse_target(raw["target"], f"{path}.target", base_dir, expected, name, queries)
    return QueryGroupSpec(name=name, queries=tuple(queries), targets=_readonly(targets))


def _budget_error(error: ValueError) -> SpecError:
    message = " ".join(str(error).split())
    match = re.match(r"^budget\.(\w+):?\s+(.*)$", message)
    if match:
        return SpecError(f"privacy.{match.group(1)}", match.group(2))
    if message.startswith("budget: "):
        rest = message[len("budget: "):]
        return SpecError("privacy", f"budget {rest}" if rest.startswith("given") else rest)
    return SpecError("privacy", message)


def _parse_privacy(raw: Any) -> PrivacySpec:
    if raw is None:
        return PrivacySpec()
    raw = _mapping(raw, "privacy", "a mapping (mode and budget)")
    _check_keys(raw, "privacy", _PRIVACY_KEYS)
    fields = {key: raw[key] for key in _BUDGET_KEYS if raw.get(key) is not None}
    mode = raw.get("mode")
    if mode is None:
        mode = "budget" if fields else "accuracy"
    if mode not in ("accuracy", "budget"):
        raise SpecError("privacy.mode", f"expected accuracy or budget, got {_show(mode)}")
    if mode == "accuracy":
        if fields:
            raise SpecError("privacy", f"mode accuracy takes no budget (got {', '.join(fields)}); "
                                       "use mode: budget")
        return PrivacySpec("accuracy", None)
    try:
        budget = Budget(**fields)
    except ValueError as error:
        raise _budget_error(error) from None
    return PrivacySpec("budget", budget)


def _parse_blocks(raw: Any) -> BlockLimits:
    if raw is None:
        return BlockLimits()
    raw = _mapping(raw, "blocks", "a mapping (max_cells, merge)")
    _check_keys(raw, "blocks", _BLOCK_KEYS)
    max_cells = (_positive_int(raw["max_cells"], "blocks.max_cells")
                 if raw.get("max_cells") is not None else DEFAULT_MAX_CELLS)
    merge = _bool(raw["merge"], "blocks.merge") if raw.get("merge") is not None else True
    return BlockLimits(max_cells=max_cells, merge=merge)


def _parse_units(raw: Any, path: str = "units") -> UnitsSpec | None:
    if raw is None:
        return None
    raw = _mapping(raw, path, "a mapping {column: NAME} or null")
    _check_keys(raw, path, _UNIT_KEYS, required=("column",))
    column = raw["column"]
    if not isinstance(column, str) or not column.strip():
        raise SpecError(f"{path}.column", f"expected a column name, got {_type_name(column)} {_show(column)}")
    return UnitsSpec(column=column)


def parse_spec(mapping: Any, base_dir: Union[str, os.PathLike, None] = None, *,
               source_path: str | None = None) -> PipelineSpec:
    """Validate a spec given as plain data (the parsed YAML) into a :class:`PipelineSpec`.

    ``base_dir`` is where relative target files are read from (default: the current
    directory); ``source_path`` is recorded on the spec (``load_spec`` passes the file).
    Raises :class:`SpecError` on the first problem.
    """
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    raw = _mapping(mapping, "spec", "a mapping with name, attributes and queries at the top level")
    _check_keys(raw, "spec", _TOP_KEYS, required=("name", "attributes"))
    if "levels" in raw:
        for key in ("queries", "units"):
            if key in raw:
                raise SpecError(key, "a spec with levels has its queries and units in each level")
    elif "queries" not in raw:
        raise SpecError("spec", "missing required key 'queries' (or 'levels')")
    name = _name(raw["name"], "name", "a spec name")
    description = raw.get("description")
    if description is None:
        description = ""
    elif not isinstance(description, str):
        raise SpecError("description", f"expected a string, got {_type_name(description)}")

    given_attributes = raw["attributes"]
    if not _is_sequence(given_attributes):
        raise SpecError("attributes", f"expected a list of attributes, got {_type_name(given_attributes)}")
    if len(given_attributes) == 0:
        raise SpecError("attributes", "must hold at least one attribute")
    attributes: list[AttributeSpec] = []
    for i, item in enumerate(given_attributes):
        attribute = _parse_attribute(item, f"attributes[{i}]")
        if any(a.name == attribute.name for a in attributes):
            raise SpecError(f"attributes[{i}].name", f"duplicated attribute {attribute.name!r}")
        attributes.append(attribute)

    units = _parse_units(raw.get("units"))
    privacy = _parse_privacy(raw.get("privacy"))
    blocks = _parse_blocks(raw.get("blocks"))

    levels: list[LevelSpec] = []
    if "levels" in raw:
        given_levels = raw["levels"]
        if not _is_sequence(given_levels) or len(given_levels) == 0:
            raise SpecError("levels", f"expected a non-empty list of levels, got {_type_name(given_levels)}")
        for i, item in enumerate(given_levels):
            path = f"levels[{i}]"
            item = _mapping(item, path, "a level mapping (name, units, queries)")
            _check_keys(item, path, _LEVEL_KEYS, required=("name", "queries"))
            level_name = _name(item["name"], f"{path}.name", "a level name")
            if any(level.name == level_name for level in levels):
                raise SpecError(f"{path}.name", f"duplicated level {level_name!r}")
            level_units = _parse_units(item.get("units"), f"{path}.units")
            if level_units is not None and any(
                    level_units.column == a.data_column for a in attributes):
                raise SpecError(f"{path}.units.column", f"{level_units.column!r} is an attribute's column")
            levels.append(LevelSpec(level_name, level_units, _parse_groups(
                item["queries"], f"{path}.queries", attributes, blocks.max_cells, base)))
        groups: tuple[QueryGroupSpec, ...] = ()
    else:
        groups = _parse_groups(raw["queries"], "queries", attributes, blocks.max_cells, base)

    return PipelineSpec(
        name=name,
        description=description,
        attributes=tuple(attributes),
        units=units,
        groups=groups,
        privacy=privacy,
        blocks=blocks,
        source_path=source_path,
        levels=tuple(levels),
    )


def _parse_groups(given_groups: Any, path: str, attributes: Sequence[AttributeSpec], max_cells: int,
                  base: Path) -> tuple[QueryGroupSpec, ...]:
    if not _is_sequence(given_groups):
        raise SpecError(path, f"expected a list of query groups, got {_type_name(given_groups)}")
    if len(given_groups) == 0:
        raise SpecError(path, "must hold at least one query group")
    groups: list[QueryGroupSpec] = []
    for k, item in enumerate(given_groups):
        group = _parse_group(item, f"{path}[{k}]", attributes, max_cells, base)
        if any(g.name == group.name for g in groups):
            raise SpecError(f"{path}[{k}].name", f"duplicated group name {group.name!r}")
        groups.append(group)
    return tuple(groups)
