"""The summary a command prints on stdout when it is done: one title line, then one aligned row
per fact (``  label          value``), the one layout every command's summary has.

Rows are ``(label, value)``; a label is padded to :data:`LABEL_WIDTH` and followed by one space,
a longer one by two (``max variance/target  1.000000``), so the values of the short labels line
up in one column. README transcripts and ``tests/test_readme.py`` compare these lines exactly.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from distfit.cli.errors import PROG

__all__ = ["LABEL_WIDTH", "format_number", "print_summary", "summary_lines"]

#: Labels up to this many characters are padded to it (``units``, ``plan checksum``).
LABEL_WIDTH = 14


def format_number(value: float) -> str:
    """A number in a command's summary: 6 significant digits."""
    return f"{value:.6g}"


def summary_lines(title: str, rows: Iterable[tuple[str, Any]]) -> list[str]:
    """``distfit: <title>`` and one ``  <label> <value>`` line per row (module docstring)."""
    lines = [f"{PROG}: {title}"]
    for label, value in rows:
        gap = " " if len(label) < LABEL_WIDTH else "  "
        lines.append(f"  {label:<{LABEL_WIDTH}}{gap}{value}")
    return lines


def print_summary(title: str, rows: Iterable[tuple[str, Any]]) -> None:
    """Print :func:`summary_lines` to stdout."""
    print("\n".join(summary_lines(title, rows)))
