"""Shared helpers of the spec tests: the pipelines folder, a small base spec, and ways to write a
spec, edit the base spec, read the one-line error of a bad spec and make a spec of every 2-way
marginal at any size."""
from __future__ import annotations

import itertools
import textwrap
from pathlib import Path

import pytest
import yaml

from distfit.spec.model import PipelineSpec, SpecError
from distfit.spec.parse import load_spec, parse_spec

ROOT = Path(__file__).resolve().parents[2]
PIPELINES = ROOT / "pipelines"

BASE = """\
name: toy
attributes:
  - {name: age, size: 4, ordinal: true}
  - {name: sex, values: [male, female]}
  - {name: race, values: [white, black, asian]}
queries:
  - name: age
    attributes: {age: identity}
    target: 1
"""


def write(tmp_path: Path, text: str, name: str = "spec.yaml") -> Path:
    """Write the spec ``text`` (dedented) to ``tmp_path/name``."""
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


#: The schema of the spec tests that are about queries and targets: age (4 values, ordinal) x sex.
AGE_SEX = """\
attributes:
  - {name: age, size: 4, ordinal: true}
  - {name: sex, values: [male, female]}
"""


def write_age_sex(tmp_path: Path, name: str, queries: str) -> Path:
    """Write the spec ``name`` on the :data:`AGE_SEX` schema whose ``queries`` list is
    ``queries`` (YAML list items, dedented) to ``tmp_path/spec.yaml``."""
    return write(tmp_path, f"name: {name}\n{AGE_SEX}queries:\n" + textwrap.indent(textwrap.dedent(queries), "  "))


def pairs_text(attributes: int, values: int, shorthand: bool) -> str:
    """The spec of every 2-way marginal of ``attributes`` attributes of ``values`` values as YAML:
    one identity group per pair (``pairs.<a>.<b>``, target 1), or with ``shorthand`` the one group
    ``{name: pairs, marginals: {order: 2}, target: 1}`` that expands to them (the spec tests'
    and ``benchmarks/bench_spec.py``'s specs at scale)."""
    names = [f"a{i:04d}" for i in range(attributes)]
    lines = ["name: scale", "attributes:"] + [f"  - {{name: {name}, size: {values}}}" for name in names] + ["queries:"]
    if shorthand:
        lines.append("  - {name: pairs, marginals: {order: 2}, target: 1}")
    else:
        lines += [f"  - {{name: pairs.{a}.{b}, attributes: {{{a}: identity, {b}: identity}}, target: 1}}"
                  for a, b in itertools.combinations(names, 2)]
    return "\n".join(lines) + "\n"


def base_mapping() -> dict:
    """A fresh copy of the base spec as plain data."""
    return yaml.safe_load(BASE)


def edit(**changes) -> str:
    """The base spec with top-level keys replaced, as YAML text."""
    mapping = base_mapping()
    mapping.update(changes)
    return yaml.safe_dump(mapping, sort_keys=False)


def spec_error(tmp_path: Path, text: str) -> str:
    """The message of the SpecError that loading the spec ``text`` raises (one line, with a field)."""
    with pytest.raises(SpecError) as info:
        load_spec(write(tmp_path, text))
    assert info.value.field
    message = str(info.value)
    assert "\n" not in message
    return message


def reading_spec(**age) -> PipelineSpec:
    """A spec with reading rules: binned ``age`` (``age`` overrides its keys), ``sex`` with values
    to strip, ``work`` with a recode."""
    attribute = {"name": "age", "bins": [17, 25, 45, ".inf"], **age}
    return parse_spec({"name": "t", "attributes": [
        attribute,
        {"name": "sex", "values": ["Female", "Male"]},
        {"name": "work", "values": ["private", "gov", "unknown"],
         "recode": {"?": "unknown", "State-gov": "gov", "Local-gov": "gov", "Private": "private"}}],
        "queries": [{"name": "g", "attributes": {"age": "prefix", "sex": "identity"}, "target": 1}]})
