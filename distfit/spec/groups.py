"""The query groups of a spec (its ``queries``, or one level's): groups written out one by one and
the ``marginals`` shorthand, which stands for every k-way marginal of some attributes
(pipelines/README.md, "Marginals (shorthand)").

Parsing is linear in the size of the spec: each entry is checked against per-spec lookup tables
(attribute name -> position, group name -> the entry that gave it) instead of scanning the
attributes or the groups seen so far, a plain query kind of an attribute is parsed once
(:class:`distfit.spec.queries.QueryCache`), and groups with the same number target and query
count share one read-only target array. A shorthand entry expands into the very groups its
cliques would be written out as (names ``NAME.a.b``, targets by the same rules), so the planner,
the canonical form and the spec hash see written-out groups, whichever way the spec said them.
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from distfit.spec.fields import (
    check_bool,
    check_count,
    check_mapping,
    check_name,
    check_section,
    is_number,
    is_sequence,
    listing,
    show,
    type_name,
)
from distfit.spec.limits import (
    BLOCK_ID_MAX_LENGTH,
    USED_ATTRIBUTE_MAX_SIZE,
    WORKLOAD_CELLS_LIMIT,
    block_id_length,
)
from distfit.spec.model import AttributeQuery, AttributeSpec, QueryGroupSpec, SpecError
from distfit.spec.queries import QueryCache, read_only
from distfit.spec.schema import GROUP_KEYS, MARGINAL_KEYS
from distfit.spec.targets import parse_target, stated_target

__all__ = ["GroupParser", "MAX_MARGINAL_GROUPS"]

#: The most groups one ``marginals`` entry may generate: a guard against a mistyped ``order``
#: (order 5 over 100 attributes is 75 million groups), far above the specs the planner handles.
MAX_MARGINAL_GROUPS = 2_000_000

Queries = tuple[tuple[str, AttributeQuery], ...]


class GroupParser:
    """Parses the query groups of one spec over ``attributes`` (schema order): cliques of at
    most ``max_cells`` cells, target files relative to ``base_dir``. One parser serves every
    level of a spec (they share the attributes, so the caches carry over)."""

    def __init__(self, attributes: Sequence[AttributeSpec], max_cells: int, base_dir: Path):
        self._by_name = {attribute.name: attribute for attribute in attributes}
        self._position = {attribute.name: i for i, attribute in enumerate(attributes)}
        self._max_cells = max_cells
        self._base_dir = base_dir
        self._queries = QueryCache()
        self._uniform: dict[tuple[float, int], np.ndarray] = {}

    def parse(self, given: Any, path: str) -> tuple[QueryGroupSpec, ...]:
        """The groups of the list ``given`` at field ``path`` (``queries``, ``levels[1].queries``)
        in order, each shorthand entry replaced by the groups it generates."""
        if not is_sequence(given):
            raise SpecError(path, f"expected a list of query groups, got {type_name(given)}")
        if len(given) == 0:
            raise SpecError(path, "must hold at least one query group")
        groups: list[QueryGroupSpec] = []
        origin: dict[str, str] = {}  # group name -> the field that gave it (for the duplicate error)
        for k, item in enumerate(given):
            entry = f"{path}[{k}]"
            item = check_section(item, entry, "a query group mapping (name, attributes, total or marginals, target)",
                                 GROUP_KEYS, required=("name",))
            if "marginals" in item:
                made = self._marginals(item, entry)
                for group in made:
                    if group.name in origin:
                        raise SpecError(f"{entry}.marginals", f"generates the group {group.name!r}, "
                                                              f"a name {origin[group.name]} already gives")
                    origin[group.name] = f"{entry}.marginals"
                groups.extend(made)
            else:
                group = self._group(item, entry)
                if group.name in origin:
                    earlier = origin[group.name]
                    hint = f" ({earlier} generates it)" if earlier.endswith(".marginals") else ""
                    raise SpecError(f"{entry}.name", f"duplicated group name {group.name!r}{hint}")
                origin[group.name] = f"{entry}.name"
                groups.append(group)
        self._check_workload_cells(groups, path)
        return tuple(groups)

    def _check_workload_cells(self, groups: Sequence[QueryGroupSpec], path: str) -> None:
        """The cells the workload works on, the sum over its distinct query cliques of their
        marginal's cells (the planner, the tabulation and the release hold these marginals, never
        the product of every attribute: an attribute no group uses costs nothing), at most
        :data:`distfit.spec.limits.WORKLOAD_CELLS_LIMIT`."""
        cliques = {group.attributes for group in groups}
        cells = sum(math.prod(self._by_name[a].size for a in clique) for clique in cliques)
        if cells > WORKLOAD_CELLS_LIMIT:
            raise SpecError(path, f"the query cliques' marginals hold {cells} cells in all, more than "
                                  f"{WORKLOAD_CELLS_LIMIT} (docs/spec.md, Ranges)")

    def _check_clique(self, clique: Sequence[str], path: str, label: str = "clique") -> None:
        """A clique a group may use, checked before any of its query matrices is made: every
        attribute at most :data:`USED_ATTRIBUTE_MAX_SIZE` values, at most ``blocks.max_cells``
        cells and a block id (a directory name in the stores) of at most
        :data:`BLOCK_ID_MAX_LENGTH` characters (docs/spec.md, "Ranges")."""
        for attribute in clique:
            size = self._by_name[attribute].size
            if size > USED_ATTRIBUTE_MAX_SIZE:
                raise SpecError(path, f"attribute {attribute} has {size} values; a query group may use "
                                      f"attributes of at most {USED_ATTRIBUTE_MAX_SIZE} (docs/spec.md, Ranges)")
        cells = math.prod(self._by_name[a].size for a in clique)
        if cells > self._max_cells:
            raise SpecError(path, f"{label} of {cells} cells exceeds blocks.max_cells = {self._max_cells}")
        length = block_id_length(tuple(clique))
        if length > BLOCK_ID_MAX_LENGTH:
            raise SpecError(path, f"{label} {'.'.join(clique)[:40]}...: its block id (r- and the attribute names "
                                  f"joined by '.') would be {length} characters, more than {BLOCK_ID_MAX_LENGTH} "
                                  "(a file name in the stores); use shorter attribute names")

    # -----------------------------------------------------------------------------------------
    # One group, written out
    # -----------------------------------------------------------------------------------------

    def _group(self, raw: Mapping, path: str) -> QueryGroupSpec:
        name = check_name(raw["name"], f"{path}.name", "a group name", dots=True)
        total = check_bool(raw["total"], f"{path}.total") if raw.get("total") is not None else False
        given = raw.get("attributes")
        queries: list[tuple[str, AttributeQuery]] = []
        if total:
            if given is not None:
                raise SpecError(path, "give attributes or total: true, not both")
        else:
            if given is None:
                raise SpecError(path, "missing required key 'attributes' (or total: true for the "
                                      "grand total, or marginals for every k-way marginal)")
            given = check_mapping(given, f"{path}.attributes", "a mapping of attribute: query kind")
            if not given:
                raise SpecError(f"{path}.attributes", "empty; name at least one attribute, or write "
                                                      "total: true for the grand total")
            for attribute_name in given:
                if attribute_name not in self._position:
                    raise SpecError(f"{path}.attributes.{attribute_name}",
                                    f"unknown attribute {attribute_name!r} "
                                    f"(attributes: {listing(list(self._position))})")
            clique = sorted(given, key=self._position.__getitem__)  # schema order
            self._check_clique(clique, f"{path}.attributes")
            for attribute_name in clique:
                queries.append((attribute_name, self._queries.query(
                    given[attribute_name], self._by_name[attribute_name],
                    f"{path}.attributes.{attribute_name}")))
        if "target" not in raw:
            raise SpecError(path, "missing required key 'target'")
        clique = tuple(queries)
        return QueryGroupSpec(name=name, queries=clique,
                              targets=self._targets(raw["target"], f"{path}.target", name, clique),
                              stated=stated_target(raw["target"]))

    def _targets(self, raw: Any, path: str, group: str, queries: Queries) -> np.ndarray:
        """The group's read-only targets; one shared array per (number, query count)."""
        expected = math.prod(query.num_queries for _, query in queries)
        value = _finite(raw)
        if value is not None:
            key = (value, expected)
            targets = self._uniform.get(key)
            if targets is None:  # errors (a number <= 0) are raised here and never cached
                targets = self._uniform[key] = read_only(
                    parse_target(raw, path, self._base_dir, expected, group, queries))
            return targets
        return read_only(parse_target(raw, path, self._base_dir, expected, group, queries))

    # -----------------------------------------------------------------------------------------
    # The marginals shorthand
    # -----------------------------------------------------------------------------------------

    def _marginals(self, raw: Mapping, path: str) -> list[QueryGroupSpec]:
        """Every ``order``-way clique of ``over`` (schema order, cliques in lexicographic order of
        the schema positions), as the group ``NAME.a.b`` with the ``kinds`` queries (default
        identity) and the clique's target (``targets``) or the group's ``target``."""
        name = check_name(raw["name"], f"{path}.name", "a group name", dots=True)
        for key in ("attributes", "total"):
            if key in raw:
                raise SpecError(path, f"give marginals or {key}, not both")
        where = f"{path}.marginals"
        spec = check_section(raw["marginals"], where, "a mapping {order: K, over: [attributes], kinds: {...}, "
                             "targets: {...}}", MARGINAL_KEYS, required=("order",))
        over = self._over(spec.get("over"), f"{where}.over")
        order = check_count(spec["order"], f"{where}.order")
        if order > len(over):
            raise SpecError(f"{where}.order", f"must be at most {len(over)} (the attributes in "
                                              f"over), got {order}")
        count = math.comb(len(over), order)
        if count > MAX_MARGINAL_GROUPS:
            raise SpecError(f"{where}.order", f"order {order} over {len(over)} attributes makes "
                                              f"{count:,} groups, more than {MAX_MARGINAL_GROUPS:,}")
        for attribute in over:  # each is in some clique: checked before its queries are made
            size = self._by_name[attribute].size
            if size > USED_ATTRIBUTE_MAX_SIZE:
                raise SpecError(f"{where}.over", f"attribute {attribute} has {size} values; a query group may use "
                                                 f"attributes of at most {USED_ATTRIBUTE_MAX_SIZE} (docs/spec.md, Ranges)")
        kinds = self._kinds(spec.get("kinds"), f"{where}.kinds", over)
        if "target" not in raw:
            raise SpecError(path, "missing required key 'target'")
        default = raw["target"]
        if not (is_number(default) or (isinstance(default, Mapping) and "file" not in default)):
            raise SpecError(f"{path}.target", f"a marginals group's target is a number or a rule "
                                              f"{{base: B, ...}} for every clique, got {type_name(default)} "
                                              f"{show(default)} (give lists or files per clique in "
                                              "marginals.targets)")
        overrides = self._clique_targets(spec.get("targets"), f"{where}.targets", over, order)
        sizes = {attribute: self._by_name[attribute].size for attribute in over}
        groups = []
        for clique in itertools.combinations(over, order):
            cells = math.prod(sizes[attribute] for attribute in clique)
            if cells > self._max_cells:
                raise SpecError(where, f"clique {'.'.join(clique)} of {cells} cells exceeds "
                                       f"blocks.max_cells = {self._max_cells}")
            if block_id_length(clique) > BLOCK_ID_MAX_LENGTH:
                self._check_clique(clique, where)
            group = f"{name}.{'.'.join(clique)}"
            queries = tuple((attribute, kinds[attribute]) for attribute in clique)
            target, target_path = overrides.get(clique, (default, f"{path}.target"))
            try:
                targets = self._targets(target, target_path, group, queries)
            except SpecError as error:  # say which of the generated groups
                raise SpecError(error.field, f"{error.problem} (group {group})") from None
            groups.append(QueryGroupSpec(name=group, queries=queries, targets=targets, stated=stated_target(target)))
        return groups

    def _over(self, raw: Any, path: str) -> tuple[str, ...]:
        """``over``: attribute names, no repeats, in schema order; default every attribute."""
        if raw is None:
            return tuple(self._position)
        if not is_sequence(raw) or len(raw) == 0:
            raise SpecError(path, f"expected a non-empty list of attribute names, got "
                                  f"{type_name(raw)} {show(raw)}")
        seen: set[str] = set()
        for i, item in enumerate(raw):
            if not isinstance(item, str) or item not in self._position:
                raise SpecError(f"{path}[{i}]", f"unknown attribute {show(item)} "
                                                f"(attributes: {listing(list(self._position))})")
            if item in seen:
                raise SpecError(f"{path}[{i}]", f"attribute {item!r} listed twice")
            seen.add(item)
        return tuple(sorted(seen, key=self._position.__getitem__))

    def _kinds(self, raw: Any, path: str, over: tuple[str, ...]) -> dict[str, AttributeQuery]:
        """``kinds``: the query kind of each attribute of ``over`` in every clique it is in."""
        given: Mapping = {}
        if raw is not None:
            given = check_mapping(raw, path, "a mapping of attribute: query kind")
            inside = set(over)
            for attribute in given:
                if attribute not in inside:
                    self._refuse_outside(attribute, f"{path}.{attribute}", over)
        return {attribute: self._queries.query(given.get(attribute, "identity"),
                                               self._by_name[attribute], f"{path}.{attribute}")
                for attribute in over}

    def _clique_targets(self, raw: Any, path: str, over: tuple[str, ...], order: int
                        ) -> dict[tuple[str, ...], tuple[Any, str]]:
        """``targets``: ``{clique: (target, its field)}``, a clique written ``a.b`` (any order)."""
        if raw is None:
            return {}
        raw = check_mapping(raw, path, "a mapping {CLIQUE: target}, a clique written as its "
                                       "attributes joined by '.' (a.b)")
        inside = set(over)
        out: dict[tuple[str, ...], tuple[Any, str]] = {}
        for key, target in raw.items():
            where = f"{path}.{key}"
            parts = key.split(".")
            for part in parts:
                if part not in inside:
                    self._refuse_outside(part, where, over)
            if len(set(parts)) != len(parts):
                raise SpecError(where, f"names an attribute twice in {key!r}")
            if len(parts) != order:
                raise SpecError(where, f"a clique of order {order} names {order} attributes "
                                       f"joined by '.', got {len(parts)} in {key!r}")
            clique = tuple(sorted(parts, key=self._position.__getitem__))
            if clique in out:
                raise SpecError(where, f"clique {'.'.join(clique)} given twice (also {out[clique][1]})")
            out[clique] = (target, where)
        return out

    def _refuse_outside(self, name: str, path: str, over: tuple[str, ...]) -> None:
        if name in self._position:
            raise SpecError(path, f"attribute {name!r} is not in over ({listing(over)})")
        raise SpecError(path, f"unknown attribute {name!r} (attributes: {listing(list(self._position))})")


def _finite(raw: Any) -> float | None:
    """``raw`` as a float when it is a finite number (an integer too large for a float is not)."""
    if not is_number(raw):
        return None
    try:
        value = float(raw)
    except OverflowError:
        return None
    return value if math.isfinite(value) else None
