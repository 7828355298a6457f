"""distfit.estimate.query_sums: W x as compiled sums by cell, against the dense product."""
from __future__ import annotations

import numpy as np
import pytest

from distfit.estimate.query_sums import MAX_DENSITY, add_query_sums, query_sums
from distfit.mathematics.workload import pl94_workload


def sparse_workload(rng, m=40, cells=90, density=0.05):
    """m x cells with about ``density`` nonzeros: 0/1 mostly, some 2, -1 and 0.5."""
    mask = rng.random((m, cells)) < density
    values = rng.choice([1.0, 1.0, 1.0, 2.0, -1.0, 0.5], size=(m, cells))
    return np.where(mask, values, 0.0)


def test_sums_equal_the_dense_product_into_strided_views():
    rng = np.random.default_rng(1)
    workload = sparse_workload(rng)
    rows = np.r_[0:10, 25:40]  # the rows summed; the others are the caller's
    sums = query_sums(workload, rows)
    assert sums is not None and np.array_equal(sums.columns, rows)
    queries = np.full((33, 40 + 90), np.nan)  # x as columns of a wider array, as the estimate has it
    x = queries[:, 40:]
    x[...] = rng.random((33, 90)) * 10
    add_query_sums(sums, x, queries)
    np.testing.assert_allclose(queries[:, rows], x @ workload[rows].T, rtol=1e-13, atol=1e-12)
    assert np.isnan(queries[:, 10:25]).all()  # the other rows untouched
    counts = rng.poisson(4.0, (33, 90)).astype(float)  # integers: exact, as the dense product
    out = np.empty((33, 40))
    add_query_sums(query_sums(workload, np.arange(40)), counts, out)
    assert np.array_equal(out, counts @ workload.T)


def test_dense_or_empty_rows_are_left_to_a_product_and_bad_shapes_refused():
    rng = np.random.default_rng(2)
    assert query_sums(sparse_workload(rng, density=3 * MAX_DENSITY), np.arange(40)) is None
    assert query_sums(sparse_workload(rng), np.arange(0)) is None
    sums = query_sums(sparse_workload(rng), np.arange(40))
    with pytest.raises(ValueError, match="expected \\(units, 90\\)"):
        add_query_sums(sums, np.zeros((3, 89)), np.zeros((3, 40)))
    with pytest.raises(ValueError, match="x \\(3, 90\\) and out \\(4, 40\\)"):
        add_query_sums(sums, np.zeros((3, 90)), np.zeros((4, 40)))


def test_pl94_aggregate_queries_take_the_sums():
    """PL94's 67 queries that are not cells (4.5 % nonzero) are summed by cell: equal to the
    dense product, exactly for counts."""
    workload = np.asarray(pl94_workload().matrix, dtype=np.float64)
    assert workload.shape == (319, 252)
    aggregate = np.arange(67)
    sums = query_sums(workload, aggregate)
    assert sums is not None and sums.owners.size == 756
    counts = np.random.default_rng(3).poisson(0.7, (50, workload.shape[1])).astype(float)
    out = np.empty((50, workload.shape[0]))
    add_query_sums(sums, counts, out)
    assert np.array_equal(out[:, aggregate], counts @ workload[aggregate].T)
