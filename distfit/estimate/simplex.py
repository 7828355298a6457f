"""The Euclidean projection onto a product of scaled simplices, compiled (numba): every parent's
children summing to its table, cell by cell (:class:`distfit.estimate.geography.SiblingProjection`).

For one parent ``p`` and cell ``j`` the children's values ``v`` (one per child) are projected
onto ``{x >= 0, sum x = s}`` (``s = totals[p, j] >= 0``) by Held, Wolfe and Crowder (1974) /
Duchi et al. (ICML 2008): with ``v_(1) >= v_(2) >= ...`` sorted in decreasing order and
``c_k = sum_{i <= k} v_(i)``,

    ``rho = max{k : v_(k) - (c_k - s) / k > 0}`` (1 if there is none),
    ``tau = (c_rho - s) / rho``,  ``x = max(v - tau, 0)``.

Why compiled: the numpy version sorted every parent and cell at once along a padded axis,
seven whole-array passes (gather, sort, cumulative sums, the test, the threshold's gather, the
clip), each over the level's units x cells array. On a 2-core machine whose memory copies run
at ~0.8 GB/s those passes were the integer top-down's largest cost (20,000 counties x 224
cells: 0.32 s a projection, about half of the step's CPU; 0.14 s compiled). Here each parent's
children are read once, cell by cell, in cache, and written once. Families of up to
:data:`INSERTION_SORT` children are sorted by insertion; a family of more than
:data:`KEEP_ORDER` children (census.yaml's 2,000 states of one nation) keeps each cell's order
from the last call, which the next call's values (a solver's next iterate) nearly follow, so
an insertion pass finishes the sort (0.043 -> 0.012 s a projection of 2,000 x 224).

Exactness: the same floating-point operations in the same order as the numpy version (the
sorted values are the same whatever the sort; the cumulative sum runs in sorted order; the
test, ``tau`` and the clip as written above), so the projection is the same, bit for bit
(tests/estimate/test_simplex.py compares the two on ties, zero totals and many family sizes).
"""
from __future__ import annotations

import numpy as np

from distfit.estimate.compiled import jit, kernel

__all__ = ["INSERTION_SORT", "KEEP_ORDER", "KERNELS", "SegmentProjection"]

#: Families of at most this many children are sorted by insertion (numba's ``sort`` costs
#: ~0.5 us a call on a handful of values, more than the projection's arithmetic).
INSERTION_SORT = 32
#: Families of more children than this keep each cell's sorted order between calls (memory: 8
#: bytes a child and cell, held only for such families; a US-shaped geography has none).
KEEP_ORDER = 256


class SegmentProjection:
    """The projection (module docstring) of ``v`` (rows x cells) where the rows
    ``order[starts[s]:starts[s + 1]]`` are segment ``s``'s, summing to ``totals[s]`` (segments x
    cells, >= 0) cell by cell; every row in exactly one segment. Prepared once and called many
    times: the wide families' orders (:data:`KEEP_ORDER`) are kept from call to call (the same
    results whatever the calls before)."""

    def __init__(self, order: np.ndarray, starts: np.ndarray, totals: np.ndarray) -> None:
        self.order = np.ascontiguousarray(order, dtype=np.int64)
        self.starts = np.ascontiguousarray(starts, dtype=np.int64)
        self.totals = np.ascontiguousarray(totals, dtype=np.float64)
        sizes = np.diff(self.starts)
        wide = sizes > KEEP_ORDER
        self.kept_at = np.where(wide, np.cumsum(np.where(wide, sizes, 0)) - sizes, -1).astype(np.int64)
        self.orders = np.full((self.totals.shape[1], int(sizes[wide].sum())), -1, dtype=np.int64)

    def __call__(self, v: np.ndarray) -> np.ndarray:
        v = np.ascontiguousarray(v, dtype=np.float64)
        out = np.empty_like(v)
        _project(v, self.order, self.starts, self.totals, out, self.orders, self.kept_at)
        return out


@jit
def _insertion_sort(values, count):
    """``values[:count]`` in increasing order, in place."""
    for k in range(1, count):
        key = values[k]
        i = k - 1
        while i >= 0 and values[i] > key:
            values[i + 1] = values[i]
            i -= 1
        values[i + 1] = key


@jit
def _insertion_sort_ranked(values, ranks, count):
    """``values[:count]`` in increasing order, in place, ``ranks[:count]`` moved alongside (fast on
    values nearly in order: one pass and the few moves they need)."""
    for k in range(1, count):
        key, rank = values[k], ranks[k]
        i = k - 1
        while i >= 0 and values[i] > key:
            values[i + 1] = values[i]
            ranks[i + 1] = ranks[i]
            i -= 1
        values[i + 1] = key
        ranks[i + 1] = rank


@kernel("void(float64[:, ::1], int64[::1], int64[::1], float64[:, ::1], float64[:, ::1], int64[:, ::1], int64[::1])")
def _project(v, order, starts, totals, out, orders, kept_at):
    segments = starts.size - 1
    cells = v.shape[1]
    widest = 0
    for s in range(segments):
        widest = max(widest, starts[s + 1] - starts[s])
    values = np.empty(widest)
    for s in range(segments):
        first, count = starts[s], starts[s + 1] - starts[s]
        at = kept_at[s]
        for j in range(cells):
            if at < 0:  # sorted afresh
                for i in range(count):
                    values[i] = v[order[first + i], j]
                if count <= INSERTION_SORT:
                    _insertion_sort(values, count)
                else:
                    values[:count].sort()
            elif orders[j, at] < 0:  # a wide family's first call: sorted, its order kept
                for i in range(count):
                    values[i] = v[order[first + i], j]
                ranked = np.argsort(values[:count])
                for i in range(count):
                    orders[j, at + i] = ranked[i]
                    values[i] = v[order[first + ranked[i]], j]
            else:  # the last call's order, nearly right, finished by insertion
                for i in range(count):
                    values[i] = v[order[first + orders[j, at + i]], j]
                _insertion_sort_ranked(values, orders[j, at:at + count], count)
            # increasing order: read from the end for the decreasing one
            total = totals[s, j]
            cumulative = 0.0
            rho = 1.0
            at_rho = values[count - 1]
            for k in range(count):
                value = values[count - 1 - k]
                cumulative += value
                rank = k + 1.0
                if value - (cumulative - total) / rank > 0:
                    rho = rank
                    at_rho = cumulative
            tau = (at_rho - total) / rho
            for i in range(count):
                row = order[first + i]
                moved = v[row, j] - tau
                # numpy's maximum(moved, 0.0): moved itself unless it is below 0 (-0.0 and nan kept)
                out[row, j] = moved if (moved >= 0.0 or moved != moved) else 0.0


#: The entry point, for :func:`distfit.estimate.compiled.warm` (``python -m distfit.estimate.warm``).
KERNELS = (_project,)
