"""Tests for distfit.spec.schema: the schema reference (pipelines/README.md, "Schema reference")
and the parser agree.

Every key the parser accepts (the tuples of distfit.spec.schema) and every query kind is
documented in the reference; every key the reference's examples use is accepted, the first
example is a valid spec, and the parser refuses unknown keys with exactly those tuples.
"""
from __future__ import annotations

import re
import textwrap

import pytest
import yaml

from distfit.spec import schema
from distfit.spec.model import SpecError
from distfit.spec.parse import load_spec, parse_spec

from tests.spec.helpers import PIPELINES, base_mapping, write

README = (PIPELINES / "README.md").read_text(encoding="utf-8")
REFERENCE = README[README.index("\n## Schema reference\n"):]
REFERENCE = REFERENCE[:REFERENCE.find("\n## ", 1)] if "\n## " in REFERENCE[1:] else REFERENCE

#: The parser's accepted keys, by section.
ACCEPTED = {
    "top": schema.TOP_KEYS,
    "attribute": schema.ATTRIBUTE_KEYS,
    "group": schema.GROUP_KEYS,
    "marginals": schema.MARGINAL_KEYS,
    "level": schema.LEVEL_KEYS,
    "units": schema.UNIT_KEYS,
    "privacy": schema.PRIVACY_KEYS,
    "blocks": schema.BLOCK_KEYS,
    "mask": schema.MASK_KEYS,
    "target": schema.TARGET_FILE_KEYS + schema.TARGET_RULE_KEYS + schema.TARGET_MARGIN_KEYS,
}


def _code_blocks(text: str) -> list[str]:
    """The indented (4-space) code blocks of a Markdown text, dedented."""
    blocks, current = [], []
    for line in text.splitlines():
        if line.startswith("    "):
            current.append(line)
        elif current:
            blocks.append(textwrap.dedent("\n".join(current)))
            current = []
    if current:
        blocks.append(textwrap.dedent("\n".join(current)))
    return blocks


def _examples() -> tuple[dict, dict]:
    """The reference's two YAML examples: the whole spec and the ``levels`` excerpt."""
    blocks = _code_blocks(REFERENCE)
    assert len(blocks) == 2, "expected two YAML examples: the spec and the levels excerpt"
    example, levels = (yaml.safe_load(block) for block in blocks)
    assert "levels" in levels
    return example, levels


def _inline_targets() -> list[dict]:
    """The target mappings written inline in the text: ``{file: PATH}`` and the rule."""
    spans = re.findall(r"``([^`]*\{(?:file|base|moe|cv):[^`]*)``", REFERENCE)
    mappings = [yaml.safe_load(span[span.index("{"):]) for span in spans]
    assert mappings, "the reference shows no {file: PATH} or target rule"
    return mappings


def _documented_keys() -> dict[str, set[str]]:
    """The keys the reference's examples use, by section."""
    example, levels = _examples()
    units = [example["units"]] + [level["units"] for level in levels["levels"] if "units" in level]
    return {
        "top": set(example) | set(levels),
        "attribute": set().union(*(attribute.keys() for attribute in example["attributes"])),
        "group": set().union(*(group.keys() for group in example["queries"])),
        "marginals": set().union(*(group["marginals"].keys() for group in example["queries"]
                                   if "marginals" in group)),
        "level": set().union(*(level.keys() for level in levels["levels"])),
        "units": set().union(*(u.keys() for u in units)),
        "privacy": set(example["privacy"]),
        "blocks": set(example["blocks"]),
        "mask": set(example.get("mask", {})),
        "target": set().union(*(m.keys() for m in _inline_targets())),
    }


def test_every_documented_key_is_accepted():
    for section, keys in _documented_keys().items():
        unknown = keys - set(ACCEPTED[section])
        assert not unknown, f"the reference's {section} examples use keys the parser refuses: {unknown}"


def test_every_accepted_key_is_documented():
    documented = _documented_keys()
    for section, keys in ACCEPTED.items():
        missing = [key for key in keys if key not in documented[section] and f"``{key}``" not in REFERENCE]
        assert not missing, f"{section} keys the parser accepts but the reference does not document: {missing}"


def test_the_query_kinds_table_lists_every_kind():
    rows = re.findall(r"^\| ``(\{?)(\w+)[^|]*?``( \(ordinal\))? \|", REFERENCE, flags=re.MULTILINE)
    assert tuple(kind for _, kind, _ in rows) == schema.QUERY_KINDS
    assert tuple(kind for _, kind, ordinal in rows if ordinal) == schema.ORDINAL_KINDS
    assert tuple(kind for brace, kind, _ in rows if brace) == schema.MAPPING_KINDS
    assert tuple(kind for brace, kind, _ in rows if not brace) == schema.PLAIN_KINDS
    example, _ = _examples()
    for group in example["queries"]:
        for kind in (group.get("attributes") or {}).values():
            assert (kind in schema.PLAIN_KINDS if isinstance(kind, str)
                    else list(kind) in ([k] for k in schema.MAPPING_KINDS)), kind


def test_the_first_example_is_a_valid_spec(tmp_path):
    blocks = _code_blocks(REFERENCE)
    spec = load_spec(write(tmp_path, blocks[0]))
    assert spec.name == "pl94"
    assert [a.name for a in spec.attributes] == ["voting_age", "race", "age", "sex"]
    assert spec.attribute("age").values == ("0-17", "18-64", "65+")
    assert [g.name for g in spec.groups] == [
        "detailed", "everyone", "pairs.voting_age.age", "pairs.voting_age.sex", "pairs.age.sex"]
    assert [q.kind for _, q in spec.group("pairs.age.sex").queries] == ["prefix", "identity"]
    assert spec.group("pairs.age.sex").targets.tolist() == [2.0] * 6
    assert spec.group("pairs.voting_age.sex").targets.tolist() == [1.0] * 4
    assert spec.privacy.mode == "budget" and spec.blocks.max_cells == 4096


def _with_unknown_key(section: str) -> tuple[dict, str]:
    """The base spec with an unknown key ``zzzz`` in ``section``, and the field the error names."""
    mapping = base_mapping()
    group = mapping["queries"][0]
    if section == "top":
        mapping["zzzz"] = 1
        return mapping, "spec"
    if section == "attribute":
        mapping["attributes"][0]["zzzz"] = 1
        return mapping, "attributes[0]"
    if section == "group":
        group["zzzz"] = 1
        return mapping, "queries[0]"
    if section == "marginals":
        mapping["queries"] = [{"name": "p", "marginals": {"order": 2, "zzzz": 1}, "target": 1}]
        return mapping, "queries[0].marginals"
    if section == "level":
        del mapping["queries"]
        mapping["levels"] = [{"name": "n", "queries": [group], "zzzz": 1}]
        return mapping, "levels[0]"
    if section == "units":
        mapping["units"] = {"column": "u", "zzzz": 1}
        return mapping, "units"
    if section in ("privacy", "blocks", "mask"):
        mapping[section] = {"zzzz": 1}
        return mapping, section
    group["target"] = {"zzzz": 1}
    return mapping, "queries[0].target"


@pytest.mark.parametrize("section", list(ACCEPTED))
def test_the_parser_accepts_exactly_the_schema_keys(section):
    mapping, field = _with_unknown_key(section)
    with pytest.raises(SpecError) as error:
        parse_spec(mapping)
    assert str(error.value) == f"{field}: unknown key 'zzzz' (expected {', '.join(ACCEPTED[section])})"
