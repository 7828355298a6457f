"""What a validated pipeline spec is: frozen dataclasses, the canonical form and the spec hash.

``PipelineSpec`` holds the attributes (``AttributeSpec``, with ``encode`` for data values), the
query groups (``QueryGroupSpec`` of ``AttributeQuery``), units, privacy, block limits and levels;
``to_dict`` is the canonical form and ``spec_hash`` its SHA-256. The schema reference, the one
description of every field, is ``pipelines/README.md`` ("Schema reference"); the YAML reader is
:mod:`distfit.spec.parse`.
"""
from __future__ import annotations

import contextlib
import functools
import gc
import hashlib
import itertools
import json
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Union

import numpy as np

from distfit.mathematics.domain import Domain
from distfit.mathematics.privacy import Budget
from distfit.spec.schema import PLAIN_KINDS
from distfit.mathematics.workload import Workload, kron_queries

__all__ = [
    "SpecError",
    "collector_paused",
    "AttributeSpec",
    "AttributeQuery",
    "QueryGroupSpec",
    "UnitsSpec",
    "PrivacySpec",
    "BlockLimits",
    "LevelSpec",
    "MaskSpec",
    "PipelineSpec",
    "DEFAULT_MAX_CELLS",
    "WORKLOAD_MAX_CELLS",
    "WORKLOAD_MAX_ENTRIES",
]

#: Default ``blocks.max_cells``.
DEFAULT_MAX_CELLS = 4096
#: ``PipelineSpec.workload()`` refuses domains with more cells than this (dense matrices).
WORKLOAD_MAX_CELLS = 5_000_000
#: ... and workload matrices with more entries than this (800 MB of float64).
WORKLOAD_MAX_ENTRIES = 100_000_000


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a spec is read, parsed or written in
    canonical form. These make millions of small objects that live on (YAML nodes, mappings,
    groups) and no cycles worth collecting, and every collection walks them all again: reading
    44,850 groups took 4.6 s of CPU instead of 1.4 s. The collector's state is restored."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


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


@dataclass(frozen=True)
class AttributeSpec:
    """One attribute of the schema: its ``name``, value labels (``values``, in value order),
    whether the value order is meaningful (``ordinal``) and how data values map onto it
    (``column``, ``bins``, ``recode``; pipelines/README.md, "Reading data")."""

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

    @functools.cached_property
    def label_index(self) -> dict[str, int]:
        """``{label: value index}``: names a value by its label in O(1) (a ``select`` of every
        value of a large attribute would otherwise be quadratic)."""
        return {label: i for i, label in enumerate(self.values)}

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
        lookup = self.label_index
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

    ``kind`` is one of :data:`distfit.spec.schema.QUERY_KINDS`; ``params`` holds the kind's
    arguments in canonical form (``ranges``: ``((lo, hi), ...)`` value indices; ``select``: value
    indices; ``matrix``: the rows as tuples of floats; otherwise ``()``); ``matrix`` is the
    (queries x values) read-only query matrix and ``labels`` one label per row (``age[<=17]``;
    pipelines/README.md).
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
        if self.kind in PLAIN_KINDS:
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
    (``targets``, read-only, in the group's row-major query order); ``stated`` the target as
    the spec wrote it when that was a margin of error or a CV (``{"moe": M}`` or ``{"cv": C,
    "at": N}``, :func:`distfit.spec.targets.stated_target`), else None."""

    name: str
    queries: tuple[tuple[str, AttributeQuery], ...]
    targets: np.ndarray
    stated: dict[str, float] | None = None

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

    def to_dict(self, memo: dict[int, Any] | None = None, stated: bool = True) -> dict[str, Any]:
        """The group in canonical form. ``memo`` (``{id(targets): canonical target}``) lets the
        groups of one spec that share a target array (equal number targets,
        :mod:`distfit.spec.groups`) write it once; valid while those arrays are alive. A target
        the spec stated as a margin of error or a CV keeps that form (``stated``; it parses back
        to the same variances), so a plan's stored spec says it in the user's terms; with
        ``stated=False`` (the spec hash) it is the variance, like any other."""
        out: dict[str, Any] = {"name": self.name}
        if self.queries:
            out["attributes"] = {attribute: query.to_canonical() for attribute, query in self.queries}
        else:
            out["total"] = True
        if stated and self.stated is not None:
            out["target"] = dict(self.stated)
            return out
        key = id(self.targets)
        if memo is not None and key in memo:
            out["target"] = memo[key]
            return out
        # One number when the targets are all equal, else the list.
        targets = self.targets
        target = float(targets[0]) if (targets == targets[0]).all() else targets.tolist()
        if memo is not None and isinstance(target, float):  # lists are never shared between groups
            memo[key] = target
        out["target"] = target
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
    :class:`distfit.mathematics.privacy.Budget`)."""

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

    def to_dict(self, memo: dict[int, Any] | None = None, stated: bool = True) -> dict[str, Any]:
        """The level in canonical form (``memo``, ``stated``: :meth:`QueryGroupSpec.to_dict`)."""
        return {"name": self.name, "units": None if self.units is None else self.units.to_dict(),
                "queries": [group.to_dict(memo, stated) for group in self.groups]}


@dataclass(frozen=True)
class MaskSpec:
    """The spec's ``mask`` section: ``distfit run`` also releases these numeric columns of its
    microdata (``--data``, a CSV) as masked pseudo-data (docs/mask.md), with public ``bounds``
    (``(lo, hi)`` per column, in order) and its own (``epsilon``, ``delta``) budget;
    ``block_rows`` None: the default."""

    columns: tuple[str, ...]
    bounds: tuple[tuple[float, float], ...]
    epsilon: float
    delta: float
    block_rows: int | None = None

    def arguments(self) -> dict[str, Any]:
        """The keyword arguments of ``distfit.mask.job.run_mask`` this section gives."""
        return {"columns": list(self.columns), "bounds": dict(zip(self.columns, self.bounds)),
                "epsilon": self.epsilon, "delta": self.delta, "block_rows": self.block_rows}

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"columns": list(self.columns),
                               "bounds": {c: list(b) for c, b in zip(self.columns, self.bounds)},
                               "epsilon": self.epsilon, "delta": self.delta}
        if self.block_rows is not None:
            out["block_rows"] = self.block_rows
        return out


@dataclass(frozen=True, eq=False)
class PipelineSpec:
    """A validated pipeline spec (pipelines/README.md). Compare specs by :attr:`spec_hash`.

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
    mask: MaskSpec | None = None

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
        """The schema as a :class:`distfit.mathematics.domain.Domain` (names and sizes, schema order)."""
        return Domain(tuple(a.name for a in self.attributes), tuple(a.size for a in self.attributes))

    def attribute(self, name: str) -> AttributeSpec:
        """The attribute called ``name`` (KeyError if none)."""
        return self._index[0][name]

    def group(self, name: str) -> QueryGroupSpec:
        """The query group called ``name`` (KeyError if none)."""
        return self._index[1][name]

    @functools.cached_property
    def _index(self) -> tuple[dict[str, AttributeSpec], dict[str, QueryGroupSpec]]:
        """Attributes and groups by name, built once: looking every group up by name must not
        scan all of them each time (quadratic with half a million groups)."""
        return ({attribute.name: attribute for attribute in self.attributes},
                {group.name: group for group in self.groups})

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
        ``plan.residual.residual_blocks`` and ``workload.workload_from_groups``. A multi-level spec
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

    def to_dict(self, stated: bool = True) -> dict[str, Any]:
        """The canonical, JSON-serialisable form (pipelines/README.md, "Canonical form and
        hash"); a valid spec itself. Targets stated as margins of error or CVs keep that form
        unless ``stated`` is False (:meth:`QueryGroupSpec.to_dict`)."""
        with collector_paused():
            return self._canonical(stated)

    def _canonical(self, stated: bool) -> dict[str, Any]:
        memo: dict[int, Any] = {}
        out: dict[str, Any] = {
            "name": self.name,
            "description": self.description,
            "attributes": [attribute.to_dict() for attribute in self.attributes],
        }
        if self.levels:
            out["levels"] = [level.to_dict(memo, stated) for level in self.levels]
        else:
            out["units"] = None if self.units is None else self.units.to_dict()
            out["queries"] = [group.to_dict(memo, stated) for group in self.groups]
        out["privacy"] = self.privacy.to_dict()
        out["blocks"] = self.blocks.to_dict()
        if self.mask is not None:  # absent from specs without one: their hashes are unchanged
            out["mask"] = self.mask.to_dict()
        return out

    @functools.cached_property
    def spec_hash(self) -> str:
        """SHA-256 (hex) of the canonical JSON of :meth:`to_dict` without ``description``, every
        target as its variances (``stated=False``): a spec that states ``{moe: 50}`` and one
        that writes its variance are the same spec."""
        content = self.to_dict(stated=False)
        del content["description"]
        with collector_paused():
            text = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                              allow_nan=False)
        return hashlib.sha256(text.encode("utf-8")).hexdigest()

