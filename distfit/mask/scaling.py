"""Scaling the chosen columns of the microdata to [-1, 1] with public bounds (``distfit mask``).

Paper 003 (docs/design.md, References) assumes every entry of the n x p data ``X`` lies in
[-1, 1]; the privacy account (:mod:`distfit.mask.account`) rests on it: a row of ``[-1, 1]^p``
moves by at most ``2 sqrt(p)`` in L2 norm when it is replaced. Column ``j`` with public bounds
``[lo_j, hi_j]`` is mapped by

    z = (x - centre_j) / scale_j,   centre_j = (lo_j + hi_j) / 2,   scale_j = (hi_j - lo_j) / 2,

and values outside the bounds are clipped to them (``z`` to [-1, 1]); how many were clipped is
counted for the curator's log, never stored (the count is a statistic of the data, without
noise). The bounds are public inputs: computing them from the data (``bounds_from_range``,
``--bounds-from-data``) publishes each column's minimum and maximum through the stored centre
and scale, outside any privacy guarantee, and the store says so (docs/mask.md).
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["INTERCEPT", "Scaling", "check_columns", "check_scaling", "clip_counts", "scale_rows", "scaling_from_range"]

#: The name of the constant column the release appends (:mod:`distfit.mask.haar`); no data column may take it.
INTERCEPT = "(intercept)"


@dataclass(frozen=True)
class Scaling:
    """The public bounds of the chosen columns, in their order: ``lower[j] < upper[j]``, finite."""

    columns: tuple[str, ...]
    lower: np.ndarray
    upper: np.ndarray

    @property
    def centre(self) -> np.ndarray:
        """``(lower + upper) / 2`` per column."""
        return (self.lower + self.upper) / 2.0

    @property
    def scale(self) -> np.ndarray:
        """``(upper - lower) / 2`` per column (> 0)."""
        return (self.upper - self.lower) / 2.0

    def bounds(self) -> dict[str, list[float]]:
        """``{column: [lower, upper]}`` (JSON), as stored."""
        return {c: [float(lo), float(hi)] for c, lo, hi in zip(self.columns, self.lower, self.upper)}


def check_columns(columns: Sequence[str]) -> tuple[str, ...]:
    """The chosen column names, checked: at least one, none empty or repeated, none named
    :data:`INTERCEPT`. ValueError naming the problem (``--columns``)."""
    names = tuple(str(c) for c in columns)
    if not names:
        raise ValueError("--columns: name at least one numeric column")
    for name in names:
        if not name.strip():
            raise ValueError("--columns: an empty column name")
        if name == INTERCEPT:
            raise ValueError(f"--columns: {INTERCEPT!r} is the name of the constant column the release adds")
    repeated = sorted({c for c in names if names.count(c) > 1})
    if repeated:
        raise ValueError(f"--columns: {repeated[0]!r} is named twice")
    return names


def check_scaling(columns: Sequence[str], bounds: Mapping[str, tuple[float, float]]) -> Scaling:
    """The :class:`Scaling` of ``columns`` from ``bounds`` (``{column: (lo, hi)}``): every
    column has bounds, no bounds name another column, each ``lo < hi`` and finite. ValueError
    naming the column (``--bounds``)."""
    columns = check_columns(columns)
    extra = sorted(set(bounds) - set(columns))
    if extra:
        raise ValueError(f"--bounds: {extra[0]!r} is not one of --columns ({', '.join(columns)})")
    lower, upper = [], []
    for name in columns:
        if name not in bounds:
            raise ValueError(f"--bounds: no bounds for column {name!r} (give {name}=LO:HI, or --bounds-from-data)")
        lo, hi = bounds[name]
        try:
            lo, hi = float(lo), float(hi)
        except (TypeError, ValueError):
            raise ValueError(f"--bounds: {name}: LO and HI must be numbers, got {lo!r}:{hi!r}") from None
        if not (math.isfinite(lo) and math.isfinite(hi)):
            raise ValueError(f"--bounds: {name}: LO and HI must be finite, got {lo!r}:{hi!r}")
        if lo >= hi:
            raise ValueError(f"--bounds: {name}: LO must be < HI, got {lo!r}:{hi!r}")
        lower.append(lo)
        upper.append(hi)
    return Scaling(columns, np.asarray(lower, dtype=np.float64), np.asarray(upper, dtype=np.float64))


def scaling_from_range(columns: Sequence[str], minima: np.ndarray, maxima: np.ndarray) -> Scaling:
    """The bounds ``[min, max]`` of each column as seen in the data (``--bounds-from-data``:
    not private, module docstring). A constant column (min = max) has no such bounds:
    ValueError naming it."""
    for name, lo, hi in zip(columns, minima, maxima):
        if not lo < hi:
            raise ValueError(f"--bounds-from-data: column {name!r} is constant ({lo!r}); give --bounds for it")
    return check_scaling(columns, {c: (lo, hi) for c, lo, hi in zip(columns, minima, maxima)})


def scale_rows(values: np.ndarray, centre: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """``clip((values - centre) / scale, -1, 1)`` column by column (module docstring): an
    (r, p) float64 array of entries in [-1, 1]."""
    values = np.asarray(values, dtype=np.float64)
    return np.clip((values - centre) / scale, -1.0, 1.0)


def clip_counts(values: np.ndarray, scaling: Scaling) -> np.ndarray:
    """How many values of each column of the (r, p) ``values`` lie outside its bounds (and
    are clipped by :func:`scale_rows`)."""
    values = np.asarray(values, dtype=np.float64)
    return ((values < scaling.lower) | (values > scaling.upper)).sum(axis=0)
