"""Pipeline specs: read a YAML file (``load_spec``) or plain data (``parse_spec``) into a validated
:class:`distfit.spec.model.PipelineSpec`.

The schema reference, ``pipelines/README.md`` ("Schema reference"), describes every key, the YAML
dialect (YAML 1.2 core-schema scalars, no duplicate keys: ``_SpecLoader``) and the errors: every
problem is a :class:`distfit.spec.model.SpecError` whose one-line message starts with the field
at fault. Section parsers live here; targets in :mod:`distfit.spec.targets`, the accepted keys
in :mod:`distfit.spec.schema`.
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Union

import yaml

from distfit.mathematics.privacy import Budget
from distfit.spec.fields import (
    check_bool,
    check_count,
    check_mapping,
    check_name,
    check_range,
    check_section,
    is_int,
    is_number,
    is_sequence,
    listing,
    show,
    type_name,
)
from distfit.spec.groups import GroupParser
from distfit.spec.limits import (
    ALPHA,
    ATTRIBUTE_MAX_SIZE,
    DELTA,
    EPSILON,
    MAX_CELLS_LIMIT,
    RHO,
)
from distfit.spec.model import (
    DEFAULT_MAX_CELLS,
    AttributeSpec,
    BlockLimits,
    LevelSpec,
    MaskSpec,
    PipelineSpec,
    PrivacySpec,
    QueryGroupSpec,
    SpecError,
    UnitsSpec,
    collector_paused,
)
from distfit.spec.schema import (
    ATTRIBUTE_KEYS,
    BLOCK_KEYS,
    BUDGET_KEYS,
    LEVEL_KEYS,
    MASK_KEYS,
    PRIVACY_KEYS,
    TOP_KEYS,
    UNIT_KEYS,
)

__all__ = ["load_spec", "parse_spec"]

_BAD_LABEL_RE = re.compile(r"[\[\],\x00-\x1f\x7f]")
_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


# ---------------------------------------------------------------------------------------------
# YAML loading
# ---------------------------------------------------------------------------------------------


class _NoDuplicateKeys:
    """Mixin of the spec loaders: a key repeated in one mapping is an error."""

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


class _SpecLoader(_NoDuplicateKeys, yaml.SafeLoader):
    """SafeLoader with YAML 1.2 core-schema scalars and duplicate-key detection: the reference
    reader, and the one whose messages a malformed spec gets."""


if getattr(yaml, "__with_libyaml__", False):
    class _FastSpecLoader(_NoDuplicateKeys, yaml.CSafeLoader):
        """``_SpecLoader`` on libyaml's parser, which reads a large spec several times faster
        (4,950 groups: 2.3 s -> 0.7 s). Scalars are still resolved and constructed by the same
        Python rules (the tables are shared below), so both loaders give the same data."""
else:  # PyYAML without libyaml: the Python parser reads every spec
    _FastSpecLoader = None

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
if _FastSpecLoader is not None:
    _FastSpecLoader.yaml_implicit_resolvers = _SpecLoader.yaml_implicit_resolvers
    _FastSpecLoader.yaml_constructors = _SpecLoader.yaml_constructors


def _load_documents(text: str) -> list[Any]:
    """The YAML documents of ``text``, read with libyaml's parser when there is one; a
    malformed text is read again by the Python parser, whose message (and verdict) counts."""
    with collector_paused():
        if _FastSpecLoader is not None:
            try:
                return list(yaml.load_all(text, Loader=_FastSpecLoader))
            except yaml.YAMLError:
                pass
        return list(yaml.load_all(text, Loader=_SpecLoader))


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
        documents = _load_documents(text)
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
    raw = check_section(raw, path, "an attribute mapping (name, values or size, ordinal)", ATTRIBUTE_KEYS,
                        required=("name",))
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
        if size > ATTRIBUTE_MAX_SIZE:
            raise SpecError(f"{path}.size", f"must be at most {ATTRIBUTE_MAX_SIZE} (docs/spec.md, Ranges), got {size}")
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
        if len(labels) > ATTRIBUTE_MAX_SIZE:
            raise SpecError(f"{path}.values", f"{len(labels)} values, more than {ATTRIBUTE_MAX_SIZE} (docs/spec.md, Ranges)")
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
    if len(edges) - 1 > ATTRIBUTE_MAX_SIZE:
        raise SpecError(path, f"{len(edges) - 1} bins, more than {ATTRIBUTE_MAX_SIZE} (docs/spec.md, Ranges)")
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
    raw = check_section(raw, "privacy", "a mapping (mode and budget)", PRIVACY_KEYS)
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
    for key, value in fields.items():  # a number out of its range; Budget words every other problem
        if is_number(value):
            check_range(value, f"privacy.{key}", _BUDGET_RANGES[key])
    try:
        budget = Budget(**fields)
    except ValueError as error:
        raise _budget_error(error) from None
    return PrivacySpec("budget", budget)


#: The range of each budget field (docs/spec.md, "Ranges").
_BUDGET_RANGES = {"rho": RHO, "epsilon": EPSILON, "delta": DELTA, "alpha": ALPHA}


def _parse_blocks(raw: Any) -> BlockLimits:
    if raw is None:
        return BlockLimits()
    raw = check_section(raw, "blocks", "a mapping (max_cells, merge)", BLOCK_KEYS)
    max_cells = (check_count(raw["max_cells"], "blocks.max_cells")
                 if raw.get("max_cells") is not None else DEFAULT_MAX_CELLS)
    if max_cells > MAX_CELLS_LIMIT:
        raise SpecError("blocks.max_cells", f"must be at most {MAX_CELLS_LIMIT} (docs/spec.md, Ranges), got {max_cells}")
    merge = check_bool(raw["merge"], "blocks.merge") if raw.get("merge") is not None else True
    return BlockLimits(max_cells=max_cells, merge=merge)


#: The name of the constant column a masked release appends (``distfit.mask.scaling.INTERCEPT``).
_INTERCEPT = "(intercept)"


def _parse_mask(raw: Any) -> MaskSpec | None:
    """The ``mask`` section (pipelines/README.md, "Masked pseudo-data"); every problem a
    SpecError naming the field (``mask.bounds.age``)."""
    if raw is None:
        return None
    raw = check_section(raw, "mask", "a mapping (columns, bounds, epsilon, delta, block_rows)", MASK_KEYS,
                        required=("columns", "bounds", "epsilon", "delta"))
    given = raw["columns"]
    if not is_sequence(given) or len(given) == 0:
        raise SpecError("mask.columns", f"expected a non-empty list of numeric data columns, got {type_name(given)}")
    columns: list[str] = []
    for i, column in enumerate(given):
        where = f"mask.columns[{i}]"
        if not isinstance(column, str) or not column.strip() or _CONTROL_RE.search(column):
            raise SpecError(where, f"expected a data column name, got {type_name(column)} {show(column)}")
        if column == _INTERCEPT:
            raise SpecError(where, f"{_INTERCEPT!r} is the name of the constant column the release adds")
        if column in columns:
            raise SpecError(where, f"column {column!r} is named twice")
        columns.append(column)
    bounds = check_mapping(raw["bounds"], "mask.bounds", "a mapping {column: [LO, HI]}")
    extra = [key for key in bounds if key not in columns]
    if extra:
        raise SpecError(f"mask.bounds.{extra[0]}", f"not one of mask.columns ({listing(columns)})")
    pairs = []
    for column in columns:
        where = f"mask.bounds.{column}"
        if column not in bounds:
            raise SpecError("mask.bounds", f"no bounds for column {column!r} (public bounds [LO, HI] of every column)")
        pair = bounds[column]
        if not (is_sequence(pair) and len(pair) == 2 and all(is_number(v) and math.isfinite(float(v)) for v in pair)):
            raise SpecError(where, f"expected [LO, HI], two finite numbers, got {type_name(pair)} {show(pair)}")
        if not float(pair[0]) < float(pair[1]):
            raise SpecError(where, f"LO must be < HI, got {show(pair)}")
        pairs.append((float(pair[0]), float(pair[1])))
    for key, allowed in (("epsilon", EPSILON), ("delta", DELTA)):
        if not is_number(raw[key]):
            raise SpecError(f"mask.{key}", f"expected a number, got {type_name(raw[key])} {show(raw[key])}")
        check_range(raw[key], f"mask.{key}", allowed)
    block_rows = None
    if raw.get("block_rows") is not None:
        block_rows = check_count(raw["block_rows"], "mask.block_rows")
        if block_rows <= len(columns):
            raise SpecError("mask.block_rows", f"must be > {len(columns)} (the number of columns), got {block_rows}")
    return MaskSpec(columns=tuple(columns), bounds=tuple(pairs), epsilon=float(raw["epsilon"]),
                    delta=float(raw["delta"]), block_rows=block_rows)


def _parse_units(raw: Any, path: str = "units") -> UnitsSpec | None:
    if raw is None:
        return None
    raw = check_section(raw, path, "a mapping {column: NAME} or null", UNIT_KEYS, required=("column",))
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
    with collector_paused():
        return _parse_spec(mapping, Path(base_dir) if base_dir is not None else Path.cwd(),
                           source_path)


def _parse_spec(mapping: Any, base: Path, source_path: str | None) -> PipelineSpec:
    raw = check_section(mapping, "spec", "a mapping with name, attributes and queries at the top level", TOP_KEYS,
                        required=("name", "attributes"))
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
    seen: set[str] = set()
    for i, item in enumerate(given_attributes):
        attribute = _parse_attribute(item, f"attributes[{i}]")
        if attribute.name in seen:
            raise SpecError(f"attributes[{i}].name", f"duplicated attribute {attribute.name!r}")
        seen.add(attribute.name)
        attributes.append(attribute)

    units = _parse_units(raw.get("units"))
    privacy = _parse_privacy(raw.get("privacy"))
    blocks = _parse_blocks(raw.get("blocks"))
    mask = _parse_mask(raw.get("mask"))
    if mask is not None and "levels" in raw:
        raise SpecError("mask", "a spec with levels takes no mask section (run distfit mask on the data instead)")

    parser = GroupParser(attributes, blocks.max_cells, base)
    levels: list[LevelSpec] = []
    if "levels" in raw:
        given_levels = raw["levels"]
        if not is_sequence(given_levels) or len(given_levels) == 0:
            raise SpecError("levels", f"expected a non-empty list of levels, got {type_name(given_levels)}")
        for i, item in enumerate(given_levels):
            path = f"levels[{i}]"
            item = check_section(item, path, "a level mapping (name, units, queries)", LEVEL_KEYS,
                                 required=("name", "queries"))
            level_name = check_name(item["name"], f"{path}.name", "a level name")
            if any(level.name == level_name for level in levels):
                raise SpecError(f"{path}.name", f"duplicated level {level_name!r}")
            level_units = _parse_units(item.get("units"), f"{path}.units")
            if level_units is not None and any(
                    level_units.column == a.data_column for a in attributes):
                raise SpecError(f"{path}.units.column", f"{level_units.column!r} is an attribute's column")
            levels.append(LevelSpec(level_name, level_units,
                                    parser.parse(item["queries"], f"{path}.queries")))
        groups: tuple[QueryGroupSpec, ...] = ()
    else:
        groups = parser.parse(raw["queries"], "queries")

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
        mask=mask,
    )
