"""The workload's estimates ``W x`` as compiled sums over each cell's queries (sparse rows).

A workload's query rows are mostly zeros: PL94's 67 queries that are not cells (voting age,
Hispanic origin, the 63 race counts) hold 756 nonzeros in their 67 x 252 entries (4.5 %), each
cell in three of them. A dense product multiplies every zero (BLAS: 0.8-0.9 us a unit of a
4096-unit chunk, with the copy into the query estimates' columns, one thread). Here the rows
are kept by cell (:class:`QuerySums`: each cell's rows and coefficients) and every unit's sums
are formed in one compiled pass over its cells, four units at a time, written straight into
the caller's array (0.56-0.60 us a unit from memory, 4096-unit chunks; one unit at a time
1.03-1.13).

Exactness: each sum adds its terms ``coefficient * x_c`` in cell order, starting from 0. With
integer ``x`` and integer coefficients every partial sum is an integer below 2**53, so the
estimates are exact integers, as the dense product's are; otherwise the two agree to rounding
(the order of the additions may differ; on PL94 they are equal).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distfit.estimate.compiled import kernel

__all__ = ["KERNELS", "MAX_DENSITY", "QuerySums", "add_query_sums", "query_sums"]

#: Rows with more than this share of nonzero entries are left to a dense product (BLAS does a
#: multiply-add in a fraction of a cycle; the compiled pass about one a nonzero).
MAX_DENSITY = 0.1


@dataclass(frozen=True, eq=False)
class QuerySums:
    """The rows ``rows`` of a workload (m x cells) by cell: ``columns`` (r,) the query (output
    column) of each row; cell ``c``'s nonzeros are ``owners[starts[c]:starts[c + 1]]`` (positions
    in ``columns``) with ``coefficients`` alike."""

    columns: np.ndarray
    starts: np.ndarray
    owners: np.ndarray
    coefficients: np.ndarray


def query_sums(workload: np.ndarray, rows: np.ndarray) -> QuerySums | None:
    """The rows ``rows`` (query indices) of the dense ``workload`` as :class:`QuerySums`, or None
    where they hold more than :data:`MAX_DENSITY` nonzeros (a dense product is then faster)."""
    rows = np.asarray(rows, dtype=np.int64)
    part = np.asarray(workload, dtype=np.float64)[rows]
    if part.size == 0 or np.count_nonzero(part) > MAX_DENSITY * part.size:
        return None
    cells, owners = np.nonzero(part.T)  # by cell, then row: each cell's rows in order
    starts = np.searchsorted(cells, np.arange(part.shape[1] + 1)).astype(np.int64)
    return QuerySums(columns=np.ascontiguousarray(rows), starts=starts, owners=owners.astype(np.int64),
                     coefficients=np.ascontiguousarray(part.T[cells, owners]))


def add_query_sums(sums: QuerySums, x: np.ndarray, out: np.ndarray) -> None:
    """``out[:, sums.columns] = x W[rows]^T`` (module docstring) in place, for every row of
    ``x`` (units x cells float64) and ``out`` (units x m float64); either may be a view with
    rows of any stride (the query estimates' cell columns, say)."""
    if x.ndim != 2 or out.ndim != 2 or x.shape[0] != out.shape[0] or x.shape[1] + 1 != sums.starts.size:
        raise ValueError(f"x {x.shape} and out {out.shape}: expected (units, {sums.starts.size - 1}) and (units, m)")
    _sums(x, sums.starts, sums.owners, sums.coefficients, sums.columns, out)


@kernel("void(float64[:, :], int64[::1], int64[::1], float64[::1], int64[::1], float64[:, :])")
def _sums(x, starts, owners, coefficients, columns, out):
    # Four units at a time: each cell's nonzeros update four units' totals per load of their
    # row and column (the totals of a query are a chain of dependent additions; four chains
    # side by side: 0.56-0.60 us a unit against 1.03-1.13 one unit at a time). Each unit's sums
    # are added in cell order either way.
    rows = columns.size
    totals = np.empty((rows, 4))
    units = x.shape[0]
    body = units - units % 4
    for unit in range(0, body, 4):
        totals[:, :] = 0.0
        for cell in range(x.shape[1]):
            v0, v1, v2, v3 = x[unit, cell], x[unit + 1, cell], x[unit + 2, cell], x[unit + 3, cell]
            for k in range(starts[cell], starts[cell + 1]):
                q, c = owners[k], coefficients[k]
                totals[q, 0] += c * v0
                totals[q, 1] += c * v1
                totals[q, 2] += c * v2
                totals[q, 3] += c * v3
        for r in range(rows):
            for j in range(4):
                out[unit + j, columns[r]] = totals[r, j]
    for unit in range(body, units):
        totals[:, 0] = 0.0
        for cell in range(x.shape[1]):
            value = x[unit, cell]
            for k in range(starts[cell], starts[cell + 1]):
                totals[owners[k], 0] += coefficients[k] * value
        for r in range(rows):
            out[unit, columns[r]] = totals[r, 0]


#: The entry point, for :func:`distfit.estimate.compiled.warm` (``python -m distfit.estimate.warm``).
KERNELS = (_sums,)
