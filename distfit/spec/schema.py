"""The spec's vocabulary: the keys each section of a pipeline spec accepts and the query kinds.

The schema reference, ``pipelines/README.md`` ("Schema reference"), documents every one of them;
``tests/spec/test_schema.py`` fails when the reference and these tuples disagree. The parser
(:mod:`distfit.spec.parse`, :mod:`distfit.spec.targets`) refuses any other key.
"""
from __future__ import annotations

__all__ = [
    "QUERY_KINDS",
    "ORDINAL_KINDS",
    "PLAIN_KINDS",
    "MAPPING_KINDS",
    "TOP_KEYS",
    "LEVEL_KEYS",
    "ATTRIBUTE_KEYS",
    "GROUP_KEYS",
    "MARGINAL_KEYS",
    "PRIVACY_KEYS",
    "BUDGET_KEYS",
    "BLOCK_KEYS",
    "MASK_KEYS",
    "UNIT_KEYS",
    "TARGET_FILE_KEYS",
    "TARGET_RULE_KEYS",
    "TARGET_MARGIN_KEYS",
]

#: Query kinds a group may use on one attribute.
QUERY_KINDS: tuple[str, ...] = (
    "identity", "total", "prefix", "all_ranges", "ranges", "select", "matrix")
#: ... those that need an ordinal attribute,
ORDINAL_KINDS = ("prefix", "all_ranges", "ranges")
#: ... those written as a bare word (``identity``),
PLAIN_KINDS = ("identity", "total", "prefix", "all_ranges")
#: ... and those written as a one-key mapping (``{select: [...]}``).
MAPPING_KINDS = ("ranges", "select", "matrix")

#: Keys of the spec's top-level mapping.
TOP_KEYS = ("name", "description", "attributes", "units", "queries", "levels", "privacy", "blocks", "mask")
#: Keys of one item of ``levels``.
LEVEL_KEYS = ("name", "units", "queries")
#: Keys of one item of ``attributes``.
ATTRIBUTE_KEYS = ("name", "values", "size", "ordinal", "column", "bins", "recode")
#: Keys of one query group (an item of ``queries``).
GROUP_KEYS = ("name", "attributes", "total", "marginals", "target")
#: Keys of a group's ``marginals`` (the shorthand for every k-way marginal of some attributes).
MARGINAL_KEYS = ("order", "over", "kinds", "targets")
#: Keys of ``privacy`` ...
PRIVACY_KEYS = ("mode", "rho", "epsilon", "delta", "alpha")
#: ... of which these give a budget (:class:`distfit.mathematics.privacy.Budget`).
BUDGET_KEYS = ("rho", "epsilon", "delta", "alpha")
#: Keys of ``blocks``.
BLOCK_KEYS = ("max_cells", "merge")
#: Keys of ``mask`` (masked pseudo-data of numeric columns, docs/mask.md).
MASK_KEYS = ("columns", "bounds", "epsilon", "delta", "block_rows")
#: Keys of ``units`` (top level or a level's).
UNIT_KEYS = ("column",)
#: Keys of a target read from a file, ``{file: PATH}`` ...
TARGET_FILE_KEYS = ("file",)
#: ... and of a target rule, ``{base: B, width_power: P, jitter: J, seed: S}`` ...
TARGET_RULE_KEYS = ("base", "width_power", "jitter", "seed")
#: ... and of a target in users' terms: ``{moe: M}`` (90% margin of error) or ``{cv: C, at: N}``.
TARGET_MARGIN_KEYS = ("moe", "cv", "at")
