"""Argument checks shared by every stage, so that each rule is written once.

``check_integer`` is the one integer validator (sizes, counts, units, chunk sizes): bools and
floats are refused even when integral, so ``True`` or ``2.0`` never passes for a count.
"""
from __future__ import annotations

from typing import Any

import numpy as np


def check_integer(value: Any, name: str, minimum: int = 0) -> int:
    """Return ``value`` as an ``int >= minimum`` or raise ``ValueError`` naming ``name``."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)
