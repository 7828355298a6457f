"""Pipeline specs: read a YAML file (``load_spec``) or plain data (``parse_spec``) into a validated
:class:`distfit.spec.model.PipelineSpec`.

The schema reference, ``pipelines/README.md`` ("Schema reference"), describes every key, the YAML
dialect (YAML 1.2 core-schema scalars, no duplicate keys: ``_SpecLoader``) and the errors: every
problem is a :class:`distfit.spec.model.SpecError` whose one-line message starts with the field
at fault. Section parsers live here; targets in :mod:`distfit.spec.targets`, the accepted keys
in :mod:`distfit.spec.schema`.
"""
from __future__ import annotations

import difflib
import math
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Union

import numpy as np
import yaml

from distfit.privacy import Budget
from distfit.spec.fields import (
    check_bool,
    check_count,
    check_keys,
    check_mapping,
    check_name,
    is_int,
    is_number,
    is_sequence,
    listing,
    show,
    type_name,
)
from distfit.spec.model import (
    DEFAULT_MAX_CELLS,
    AttributeQuery,
    AttributeSpec,
    BlockLimits,
    LevelSpec,
    PipelineSpec,
    PrivacySpec,
    QueryGroupSpec,
    SpecError,
    UnitsSpec,
)
from distfit.spec.schema import (
    ATTRIBUTE_KEYS,
    BLOCK_KEYS,
    BUDGET_KEYS,
    GROUP_KEYS,
    LEVEL_KEYS,
    MAPPING_KINDS,
    ORDINAL_KINDS,
    PLAIN_KINDS,
    PRIVACY_KEYS,
    QUERY_KINDS,
    TOP_KEYS,
    UNIT_KEYS,
)
from distfit.spec.targets import parse_target
from distfit.workload import (
    all_range_queries,
    custom_queries,
    identity_queries,
    prefix_queries,
    range_queries,
    total_queries,
)

__all__ = ["load_spec", "parse_spec"]

_BAD_LABEL_RE = re.compile(r"[\[\],\x00-\x1f\x7f]")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


def _readonly(array: np.ndarray) -> np.ndarray:
    """A read-only float copy: a spec is frozen, its query matrices and targets too."""
    array = np.array(array, dtype=float, copy=True)
    array.setflags(write=False)
    return array


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
# Sections
# ---------------------------------------------------------------------------------------------


def _parse_attribute(raw: Any, path: str) -> AttributeSpec:
    raw = check_mapping(raw, path, "an attribute mapping (name, values or size, ordinal)")
    check_keys(raw, path, ATTRIBUTE_KEYS, required=("name",))
    name = check_name(raw["name"], f"{path}.name", "an attribute name")
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
        size = check_count(raw["size"], f"{path}.size")
        values = tuple(str(i) for i in range(size))
    else:
        given = raw["values"]
        if not is_sequence(given):
            raise SpecError(f"{path}.values", f"expected a list of value labels, got {type_name(given)}")
        if len(given) == 0:
            raise SpecError(f"{path}.values", "must hold at least one value label")
        labels = []
        seen: set[str] = set()
        for i, label in enumerate(given):
            where = f"{path}.values[{i}]"
            if is_int(label):
                label = str(int(label))
            if not isinstance(label, str):
                raise SpecError(where, f"expected a string label, got {type_name(label)} {show(label)}")
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
    ordinal = (check_bool(raw["ordinal"], f"{path}.ordinal") if raw.get("ordinal") is not None
               else bins is not None)
    column = None
    if raw.get("column") is not None:
        column = raw["column"]
        if not isinstance(column, str) or not column.strip() or _CONTROL_RE.search(column):
            raise SpecError(f"{path}.column", f"expected a data column name, got {type_name(column)} "
                                              f"{show(column)}")
        column = None if column == name else column
    recode: tuple[tuple[str, str], ...] = ()
    if raw.get("recode") is not None:
        if bins is not None:
            raise SpecError(f"{path}.recode", "give recode or bins, not both")
        recode = _parse_recode(raw["recode"], f"{path}.recode", values)
    return AttributeSpec(name=name, values=values, ordinal=ordinal, column=column, bins=bins,
                         recode=recode)


def _parse_bins(raw: Any, path: str) -> tuple[float, ...]:
    if not is_sequence(raw):
        raise SpecError(path, f"expected a list of bin edges, got {type_name(raw)} {show(raw)}")
    edges = []
    for i, edge in enumerate(raw):
        if isinstance(edge, str) and edge.strip().lower() in _INFINITE_EDGES:
            edge = _INFINITE_EDGES[edge.strip().lower()]  # the canonical JSON form of +-inf
        if not is_number(edge) or math.isnan(float(edge)):
            raise SpecError(f"{path}[{i}]", f"expected a number, got {type_name(edge)} {show(edge)}")
        edges.append(float(edge))
    if len(edges) < 2:
        raise SpecError(path, f"needs at least 2 edges (one bin), got {len(edges)}")
    for i in range(1, len(edges)):
        if not edges[i] > edges[i - 1]:
            raise SpecError(f"{path}[{i}]", f"edges must increase strictly, got {show(raw[i - 1])} "
                                            f"then {show(raw[i])}")
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
    raw = check_mapping(raw, path, "a mapping {data value: label}")
    pairs = []
    for key, label in raw.items():
        if is_int(label):
            label = str(int(label))
        if not isinstance(label, str) or label not in values:
            raise SpecError(f"{path}.{key}", f"{show(label)} is not a value label "
                                             f"(values: {listing(values)})")
        pairs.append((key.strip(), label))
    return tuple(sorted(pairs))


def _value_index(value: Any, attribute: AttributeSpec, path: str) -> int:
    """A value named by index (int) or by label (str)."""
    if is_int(value):
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
                                  f"(values: {listing(attribute.values)})") from None
    raise SpecError(path, f"expected a value label or index, got {type_name(value)} {show(value)}")


def _parse_query(raw: Any, attribute: AttributeSpec, path: str) -> AttributeQuery:
    name, n, values = attribute.name, attribute.size, attribute.values
    expected = ("expected identity, total, prefix, all_ranges, {ranges: [[lo, hi], ...]}, "
                "{select: [values]} or {matrix: [[...]]}")
    if isinstance(raw, str):
        kind, argument = raw, None
        if kind not in PLAIN_KINDS:
            close = difflib.get_close_matches(kind, QUERY_KINDS, n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise SpecError(path, f"unknown query kind {kind!r} ({hint}{expected})")
    elif isinstance(raw, Mapping):
        if len(raw) != 1 or next(iter(raw)) not in MAPPING_KINDS:
            keys = ", ".join(repr(k) for k in raw) or "no key"
            raise SpecError(path, f"a query-kind mapping has exactly one key, ranges, select or "
                                  f"matrix; got {keys}")
        kind, argument = next(iter(raw.items()))
    else:
        raise SpecError(path, f"{expected}; got {type_name(raw)} {show(raw)}")
    if kind in ORDINAL_KINDS and not attribute.ordinal:
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
        if not is_sequence(argument) or len(argument) == 0:
            raise SpecError(where, f"expected a non-empty list of [lo, hi] pairs, got {type_name(argument)}")
        pairs = []
        for r, pair in enumerate(argument):
            if not is_sequence(pair) or len(pair) != 2:
                raise SpecError(f"{where}[{r}]", f"expected a [lo, hi] pair, got {show(pair)}")
            lo = _value_index(pair[0], attribute, f"{where}[{r}]")
            hi = _value_index(pair[1], attribute, f"{where}[{r}]")
            if lo > hi:
                raise SpecError(f"{where}[{r}]", f"empty range: lo {values[lo]!r} comes after "
                                                 f"hi {values[hi]!r}")
            pairs.append((lo, hi))
        return AttributeQuery("ranges", tuple(pairs), _readonly(range_queries(n, pairs)),
                              tuple(f"{name}[{values[lo]}..{values[hi]}]" for lo, hi in pairs))
    if kind == "select":
        if not is_sequence(argument) or len(argument) == 0:
            raise SpecError(where, f"expected a non-empty list of values, got {type_name(argument)}")
        indices: list[int] = []
        for i, value in enumerate(argument):
            index = _value_index(value, attribute, f"{where}[{i}]")
            if index in indices:
                raise SpecError(f"{where}[{i}]", f"value {values[index]!r} selected twice")
            indices.append(index)
        return AttributeQuery("select", tuple(indices), _readonly(np.eye(n)[indices]),
                              tuple(f"{name}[{values[i]}]" for i in indices))
    # matrix
    if not is_sequence(argument) or not all(is_sequence(row) for row in argument):
        raise SpecError(where, "expected a list of rows (lists of numbers)")
    for r, row in enumerate(argument):
        for c, entry in enumerate(row):
            if not is_number(entry):
                raise SpecError(f"{where}[{r}][{c}]", f"expected a number, got {type_name(entry)} {show(entry)}")
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


def _parse_group(raw: Any, path: str, attributes: Sequence[AttributeSpec], max_cells: int,
                 base_dir: Path) -> QueryGroupSpec:
    raw = check_mapping(raw, path, "a query group mapping (name, attributes or total, target)")
    check_keys(raw, path, GROUP_KEYS, required=("name",))
    name = check_name(raw["name"], f"{path}.name", "a group name")
    total = check_bool(raw["total"], f"{path}.total") if raw.get("total") is not None else False
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
        given = check_mapping(given, f"{path}.attributes",
                         "a mapping of attribute: query kind")
        if not given:
            raise SpecError(f"{path}.attributes", "empty; name at least one attribute, or write "
                                                  "total: true for the grand total")
        for attribute_name in given:
            if attribute_name not in by_name:
                raise SpecError(f"{path}.attributes.{attribute_name}",
                                f"unknown attribute {attribute_name!r} "
                                f"(attributes: {listing(list(by_name))})")
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
    targets = parse_target(raw["target"], f"{path}.target", base_dir, expected, name, queries)
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
    raw = check_mapping(raw, "privacy", "a mapping (mode and budget)")
    check_keys(raw, "privacy", PRIVACY_KEYS)
    fields = {key: raw[key] for key in BUDGET_KEYS if raw.get(key) is not None}
    mode = raw.get("mode")
    if mode is None:
        mode = "budget" if fields else "accuracy"
    if mode not in ("accuracy", "budget"):
        raise SpecError("privacy.mode", f"expected accuracy or budget, got {show(mode)}")
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
    raw = check_mapping(raw, "blocks", "a mapping (max_cells, merge)")
    check_keys(raw, "blocks", BLOCK_KEYS)
    max_cells = (check_count(raw["max_cells"], "blocks.max_cells")
                 if raw.get("max_cells") is not None else DEFAULT_MAX_CELLS)
    merge = check_bool(raw["merge"], "blocks.merge") if raw.get("merge") is not None else True
    return BlockLimits(max_cells=max_cells, merge=merge)


def _parse_units(raw: Any, path: str = "units") -> UnitsSpec | None:
    if raw is None:
        return None
    raw = check_mapping(raw, path, "a mapping {column: NAME} or null")
    check_keys(raw, path, UNIT_KEYS, required=("column",))
    column = raw["column"]
    if not isinstance(column, str) or not column.strip():
        raise SpecError(f"{path}.column", f"expected a column name, got {type_name(column)} {show(column)}")
    return UnitsSpec(column=column)


def parse_spec(mapping: Any, base_dir: Union[str, os.PathLike, None] = None, *,
               source_path: str | None = None) -> PipelineSpec:
    """Validate a spec given as plain data (the parsed YAML) into a :class:`PipelineSpec`.

    ``base_dir`` is where relative target files are read from (default: the current
    directory); ``source_path`` is recorded on the spec (``load_spec`` passes the file).
    Raises :class:`SpecError` on the first problem.
    """
    base = Path(base_dir) if base_dir is not None else Path.cwd()
    raw = check_mapping(mapping, "spec", "a mapping with name, attributes and queries at the top level")
    check_keys(raw, "spec", TOP_KEYS, required=("name", "attributes"))
    if "levels" in raw:
        for key in ("queries", "units"):
            if key in raw:
                raise SpecError(key, "a spec with levels has its queries and units in each level")
    elif "queries" not in raw:
        raise SpecError("spec", "missing required key 'queries' (or 'levels')")
    name = check_name(raw["name"], "name", "a spec name")
    description = raw.get("description")
    if description is None:
        description = ""
    elif not isinstance(description, str):
        raise SpecError("description", f"expected a string, got {type_name(description)}")

    given_attributes = raw["attributes"]
    if not is_sequence(given_attributes):
        raise SpecError("attributes", f"expected a list of attributes, got {type_name(given_attributes)}")
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
        if not is_sequence(given_levels) or len(given_levels) == 0:
            raise SpecError("levels", f"expected a non-empty list of levels, got {type_name(given_levels)}")
        for i, item in enumerate(given_levels):
            path = f"levels[{i}]"
            item = check_mapping(item, path, "a level mapping (name, units, queries)")
            check_keys(item, path, LEVEL_KEYS, required=("name", "queries"))
            level_name = check_name(item["name"], f"{path}.name", "a level name")
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
    if not is_sequence(given_groups):
        raise SpecError(path, f"expected a list of query groups, got {type_name(given_groups)}")
    if len(given_groups) == 0:
        raise SpecError(path, "must hold at least one query group")
    groups: list[QueryGroupSpec] = []
    for k, item in enumerate(given_groups):
        group = _parse_group(item, f"{path}[{k}]", attributes, max_cells, base)
        if any(g.name == group.name for g in groups):
            raise SpecError(f"{path}[{k}].name", f"duplicated group name {group.name!r}")
        groups.append(group)
    return tuple(groups)
