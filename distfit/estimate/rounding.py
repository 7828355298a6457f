"""Integer tables from nonnegative estimates: controlled rounding that keeps totals (pure numpy).

docs/design.md section 7 (the rounding step of the Census TopDown algorithm, done here by largest
remainder). Both functions round a nonnegative data vector cell by cell, each cell to the
floor or the ceiling of its value, and choose which cells go up so that a sum is kept exactly:

* :func:`round_preserving_total`: each unit's total, ``sum_c n_uc = round(sum_c x_uc)``;
* :func:`round_children`: for every parent and every cell, the children's counts sum to the
  parent's (integer) count in that cell.

Largest remainder. With ``f = floor(x)`` and the remainders ``r = x - f`` (``0 <= r < 1``), a
group of entries whose integer sum must be ``N`` needs ``D = N - sum f`` of its entries raised
by one; the ``D`` entries with the largest remainders are raised (ties: the lower index first,
a stable sort), the others stay at their floor.

Proof that every entry is its floor or ceiling. An entry is raised only if its remainder is
positive: let ``c`` be the number of entries of the group with ``r > 0``; then ``sum r < c``
when ``c > 0`` and ``sum r = 0`` when ``c = 0``.
(a) Unit totals: ``D = floor(sum r + 1/2)`` (so ``sum f + D = round(sum x)``, halves up), hence
``0 <= D <= c`` (``D <= sum r + 1/2 < c + 1/2`` and D is an integer; ``D = 0`` when ``c = 0``):
the ``D`` largest remainders are all positive, and a raised entry ``f + 1 = ceil(x)``.
(b) Children: the children's values sum to the parent's count up to rounding error ``e``
(``|e| < 1/2`` is checked), ``sum r = N - sum f + e = D + e``; ``D`` is an integer with ``D >=
-e > -1/2`` so ``D >= 0``, and ``c > sum r = D + e > D - 1/2`` so ``c >= D``.
Either way the group's sum is ``sum f + D = N`` exactly.

Consistency. The counts are one integer vector ``n`` per unit, and every table is ``W n`` for
0/1 query rows (:func:`distfit.estimate.measurements.workload_estimates`): integers, each
table's total the unit's total, every marginal the sum of the finer tables, all exactly (each
is a sum of the same integers). Children rounded by :func:`round_children` sum to their parent
cell by cell, so every table of the children sums to the parent's table.

Vectorised: one stable ``argsort`` / ``lexsort`` over all entries; no loop over units, parents
or cells.
"""
from __future__ import annotations

import numpy as np

__all__ = ["NEGATIVE_TOLERANCE", "round_children", "round_preserving_total"]

#: Values down to this much below zero are rounding errors of a nonnegative solution (clipped).
NEGATIVE_TOLERANCE = 1e-6


def _nonnegative_matrix(x, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected a 2-d array (rows x cells), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: values must be finite")
    if arr.size and arr.min() < -NEGATIVE_TOLERANCE:
        row, cell = np.argwhere(arr < -NEGATIVE_TOLERANCE)[0]
        raise ValueError(f"{name}: row {row}, cell {cell} holds {float(arr[row, cell])!r}, a negative value")
    return np.maximum(arr, 0.0)


def _raise_largest(floor: np.ndarray, order: np.ndarray, group_start: np.ndarray,
                   group_of: np.ndarray, deficit: np.ndarray) -> np.ndarray:
    """``floor + 1`` on the first ``deficit[group]`` entries of each group in ``order`` (flat
    indices sorted by group, then by remainder descending, then by index)."""
    position = np.arange(order.size) - group_start[group_of[order]]
    raise_sorted = position < deficit[group_of[order]]
    out = floor.ravel().copy()
    out[order[raise_sorted]] += 1
    return out.reshape(floor.shape)


def round_preserving_total(x) -> np.ndarray:
    """Integer counts (units x cells, int64): each cell ``floor(x)`` or ``ceil(x)``, each row
    summing to ``round(sum x)`` (halves up), by largest remainder (module docstring; ties: the
    lower cell first). ``x`` (units x cells) must be nonnegative (down to -1e-6, clipped)."""
    arr = _nonnegative_matrix(x, "x")
    units, cells = arr.shape
    floor = np.floor(arr)
    remainder = arr - floor
    deficit = np.floor(remainder.sum(axis=1) + 0.5).astype(np.int64)
    order_in_row = np.argsort(-remainder, axis=1, kind="stable")
    order = (order_in_row + (np.arange(units) * cells)[:, None]).ravel()
    group_of = np.repeat(np.arange(units), cells)
    group_start = np.arange(units) * cells
    return _raise_largest(floor.astype(np.int64), order, group_start, group_of, deficit)


def round_children(x_children, parent_of, parent_counts) -> np.ndarray:
    """Integer counts of the children (n x cells, int64): each cell ``floor`` or ``ceil`` of
    ``x_children``, and for every parent ``j`` and cell ``c``, ``sum_{i: parent_of[i] = j}
    n[i, c] = parent_counts[j, c]`` exactly (largest remainder across the parent's children,
    module docstring; ties: the lower child row first).

    ``x_children`` (n x cells) nonnegative; ``parent_of`` (n,) integers in ``0..p-1``;
    ``parent_counts`` (p x cells) nonnegative integers. The children of each parent must sum to
    its counts up to rounding error (less than 1/2 per cell, e.g. the output of a projection
    whose children sum to the parent): ValueError naming the parent and cell otherwise.
    """
    arr = _nonnegative_matrix(x_children, "x_children")
    n, cells = arr.shape
    parents = np.asarray(parent_of)
    if parents.shape != (n,) or (parents.size and not np.issubdtype(parents.dtype, np.integer)):
        raise ValueError(f"parent_of: expected {n} integers, got shape {parents.shape} dtype {parents.dtype}")
    counts = np.asarray(parent_counts)
    if counts.ndim != 2 or counts.shape[1] != cells:
        raise ValueError(f"parent_counts: shape {counts.shape}, expected (parents, {cells})")
    if counts.size and not (np.issubdtype(counts.dtype, np.integer)
                            or np.all(counts == np.round(counts))):
        raise ValueError("parent_counts: expected integer counts")
    counts = counts.astype(np.int64)
    if counts.size and counts.min() < 0:
        raise ValueError("parent_counts: negative count")
    p = counts.shape[0]
    if parents.size and (parents.min() < 0 or parents.max() >= p):
        raise ValueError(f"parent_of: parent index outside 0..{p - 1}")
    sums = np.zeros((p, cells))
    np.add.at(sums, parents, arr)
    gap = np.abs(sums - counts)
    if gap.size and gap.max() >= 0.5:
        parent, cell = np.unravel_index(np.argmax(gap), gap.shape)
        raise ValueError(f"x_children: the children of parent {parent} sum to {float(sums[parent, cell])!r} in cell {cell}, "
                         f"not to its count {counts[parent, cell]}")
    floor = np.floor(arr).astype(np.int64)
    remainder = arr - floor
    floor_sums = np.zeros((p, cells), dtype=np.int64)
    np.add.at(floor_sums, parents, floor)
    deficit = (counts - floor_sums).ravel()
    # one group per (parent, cell): flat entry (i, c) belongs to group parent_of[i] * cells + c
    group_of = (parents[:, None] * cells + np.arange(cells)[None, :]).ravel()
    rows = np.repeat(np.arange(n), cells)
    order = np.lexsort((rows, -remainder.ravel(), group_of))
    group_start = np.zeros(p * cells + 1, dtype=np.int64)
    np.cumsum(np.bincount(group_of, minlength=p * cells), out=group_start[1:])
    return _raise_largest(floor, order, group_start[:-1], group_of, deficit)
