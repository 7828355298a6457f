"""Field checks of the spec parser: each takes a value and its field path (``queries[2].target``)
and returns the value or raises :class:`distfit.spec.model.SpecError` naming that field, in the
message style of the schema reference (``pipelines/README.md``, "Errors"); plus the value
descriptions (``type_name``, ``show``, ``listing``) those messages use.
"""
from __future__ import annotations

import difflib
import math
import numbers
import re
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from distfit.checks import check_integer
from distfit.spec.limits import NAME_MAX_LENGTH, Range
from distfit.spec.model import SpecError

__all__ = [
    "type_name",
    "show",
    "listing",
    "is_int",
    "is_number",
    "is_sequence",
    "check_mapping",
    "check_keys",
    "check_section",
    "check_name",
    "check_bool",
    "check_count",
    "check_range",
]

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_DOTTED_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]+$")


def type_name(value: Any) -> str:
    """How a message names the YAML type of ``value`` (``a string``, ``an integer``, ``null``)."""
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


def show(value: Any) -> str:
    """Short one-line rendering of a value for messages."""
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (np.integer, np.floating)):
        value = value.item()
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def listing(names: Sequence[str], limit: int = 10) -> str:
    """The first ``limit`` names, comma-separated (``, ...`` when there are more)."""
    names = list(names)
    shown = ", ".join(names[:limit])
    return shown + (", ..." if len(names) > limit else "")


def is_int(value: Any) -> bool:
    """An integer, not a bool."""
    return isinstance(value, (numbers.Integral, np.integer)) and not isinstance(value, (bool, np.bool_))


def is_number(value: Any) -> bool:
    """A real number (integers included), not a bool."""
    return isinstance(value, (numbers.Real, np.integer, np.floating)) and not isinstance(
        value, (bool, np.bool_))


def is_sequence(value: Any) -> bool:
    """A list, tuple or array of at least one dimension."""
    return isinstance(value, (list, tuple)) or (isinstance(value, np.ndarray) and value.ndim >= 1)


def check_mapping(value: Any, path: str, what: str) -> Mapping:
    """A mapping with string keys (``what`` describes the expected mapping)."""
    if not isinstance(value, Mapping):
        raise SpecError(path, f"expected {what}, got {type_name(value)}")
    for key in value:
        if not isinstance(key, str):
            raise SpecError(path, f"keys must be strings, got {type_name(key)} {show(key)}")
    return value


def check_keys(value: Mapping, path: str, allowed: Sequence[str], required: Sequence[str] = ()
               ) -> None:
    """Refuse a key not in ``allowed`` (suggesting the closest) and a missing ``required`` key."""
    for key in value:
        if key not in allowed:
            close = difflib.get_close_matches(key, allowed, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else f" (expected {', '.join(allowed)})"
            raise SpecError(path, f"unknown key {key!r}{hint}")
    for key in required:
        if key not in value:
            raise SpecError(path, f"missing required key {key!r}")


def check_section(value: Any, path: str, what: str, allowed: Sequence[str], required: Sequence[str] = ()
                  ) -> Mapping:
    """A mapping of the spec and its keys, the check every mapping of known keys starts with
    (the spec itself, an attribute, a level, a query group, the privacy, blocks and units
    sections, a marginals shorthand, a target rule): :func:`check_mapping` (``what`` describes
    the expected mapping), then :func:`check_keys` (``allowed``, ``required``). Returns it."""
    value = check_mapping(value, path, what)
    check_keys(value, path, allowed, required)
    return value


def check_name(value: Any, path: str, what: str, dots: bool = False) -> str:
    """A name of at most :data:`distfit.spec.limits.NAME_MAX_LENGTH` (64) letters, digits, ``_``
    and ``-`` (spec, attribute and level names: attribute names make block ids and level names
    directories, so they are path-safe and short); with ``dots``, ``.`` too (group names: the
    marginals shorthand names the group of clique (a, b) ``NAME.a.b``, and a spec's canonical
    form writes those groups out, so a generated name may be longer)."""
    if not isinstance(value, str):
        raise SpecError(path, f"expected {what} (a string), got {type_name(value)} {show(value)}")
    if not (_DOTTED_NAME_RE if dots else _NAME_RE).match(value):
        allowed = "letters, digits, '_', '-' and '.'" if dots else "letters, digits, '_' and '-'"
        raise SpecError(path, f"{what} {show(value)} may hold only {allowed}")
    if len(value) > NAME_MAX_LENGTH:
        raise SpecError(path, f"{what} of {len(value)} characters {show(value)}: at most {NAME_MAX_LENGTH}")
    return value


def check_bool(value: Any, path: str) -> bool:
    """``true`` or ``false``."""
    if not isinstance(value, (bool, np.bool_)):
        raise SpecError(path, f"expected true or false, got {type_name(value)} {show(value)}")
    return bool(value)


def check_count(value: Any, path: str) -> int:
    """An integer >= 1 (a size, ``blocks.max_cells``).

    The rule is :func:`distfit.checks.check_integer` (the one integer validator: bools and floats
    are refused even when integral). Its ValueError (``PATH must be an integer >= 1, got 'four'``)
    becomes a SpecError in the spec's own words, which tests pin and the schema reference shows:
    the field path first, then the YAML type of a non-integer (``size: expected an integer >= 1,
    got a string 'four'``) or the number out of range (``max_cells: must be >= 1, got 0``).
    """
    try:
        return check_integer(value, path, 1)
    except ValueError:
        if is_int(value):
            raise SpecError(path, f"must be >= 1, got {int(value)}") from None
        raise SpecError(path, f"expected an integer >= 1, got {type_name(value)} {show(value)}") from None


def check_range(value: Any, path: str, allowed: Range) -> Any:
    """A number within ``allowed`` (:mod:`distfit.spec.limits`, docs/spec.md "Ranges"), else
    ``PATH: must be in [LOW, HIGH], got V``. Returns ``value``."""
    try:
        number = float(value)
    except OverflowError:  # an integer beyond the floats
        number = math.inf
    if allowed.excludes(number):
        raise SpecError(path, f"must be {allowed.text}, got {show(value)}")
    return value
