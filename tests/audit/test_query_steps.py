"""The audit's per-query sums as steps (distfit.audit.query_steps) against the vectors they stand
for, accumulated query by query with numpy on small random plans' rows."""
from __future__ import annotations

import numpy as np
import pytest

from distfit.audit.query_steps import QueryRows, distinct_ranges, merged_steps, range_minima, spec_target_runs
from distfit.mathematics.packing import QueryRuns
from distfit.spec.parse import parse_spec
from tests.packed_plans import marginals_spec


def _dense(m, points, ranges):
    """The per-query variances, shares and answered flags, one query at a time."""
    variances, shares, answered = np.zeros(m), np.zeros(m), np.zeros(m, dtype=bool)
    for query, variance, share in points:
        np.add.at(variances, query, variance)
        np.add.at(shares, query, share)
        answered[query] = True
    for first, stop, variance, share in ranges:
        for a, b, v, s in zip(first, stop, variance, share):
            variances[a:b] += v
            shares[a:b] += s
            answered[a:b] = True
    return variances, shares, answered


def _random_rows(rng, m, overlapping):
    points = []
    for _ in range(3):
        query = rng.choice(m, size=rng.integers(1, 12), replace=False)
        points.append((query, rng.uniform(0.5, 2.0, query.size), rng.uniform(0.5, 2.0, query.size)))
    # ranges as a pack has them: whole marginals (disjoint query ranges), each repeated by several
    # segments; or, overlapping, ranges of any ends
    if overlapping:
        first = rng.integers(0, m - 1, size=20)
        stop = first + rng.integers(1, m - first + 1)
    else:
        ends = np.unique(np.concatenate([[0, m], rng.choice(np.arange(1, m), size=6, replace=False)]))
        pick = rng.choice(ends.size - 1, size=20)
        first, stop = ends[pick], ends[pick + 1]
    ranges = [(first, stop, rng.uniform(0.5, 2.0, first.size), rng.uniform(0.5, 2.0, first.size))]
    return points, ranges


@pytest.mark.parametrize("overlapping", [False, True], ids=["marginals", "overlapping"])
@pytest.mark.parametrize("seed", range(5))
def test_steps_equal_the_per_query_sums(seed, overlapping):
    rng = np.random.default_rng(seed)
    m = 97
    points, ranges = _random_rows(rng, m, overlapping)
    targets = QueryRuns.encode(np.repeat(rng.uniform(1, 4, 5), [10, 30, 7, 40, 10]))
    rows = QueryRows(m)
    for point in points:
        rows.add_block(*point)
    for first, stop, variance, share in ranges:
        rows.add_ranges(first, stop, variance, share)
    sums = rows.steps(targets)
    expanded = {name: np.repeat(getattr(sums, name), sums.steps.lengths) for name in ("variances", "shares", "answered")}
    variances, shares, answered = _dense(m, points, ranges)
    # overlapping ranges are summed by running sums: exact to rounding of the largest value (a
    # query no range covers may keep 1e-15 of one that ended there; module docstring)
    atol = 1e-12 * variances.max() if overlapping else 0.0
    np.testing.assert_allclose(expanded["variances"], variances, rtol=1e-12, atol=atol)
    np.testing.assert_allclose(expanded["shares"], shares, rtol=1e-12, atol=atol)
    np.testing.assert_array_equal(expanded["answered"], answered)
    np.testing.assert_array_equal(np.repeat(sums.steps.of_runs(targets), sums.steps.lengths), targets.expand())
    missing = ~sums.answered
    assert sums.steps.queries(missing) == int((~answered).sum())
    if missing.any():
        assert sums.steps.first_query(missing) == int(np.flatnonzero(~answered)[0])


def test_range_minima_over_runs():
    rng = np.random.default_rng(7)
    vector = np.repeat(rng.uniform(1, 9, 12), rng.integers(1, 6, 12))
    runs = QueryRuns.encode(vector)
    first = rng.integers(0, vector.size - 1, size=200)
    stop = first + rng.integers(1, vector.size - first + 1)
    expected = [vector[a:b].min() for a, b in zip(first, stop)]
    np.testing.assert_array_equal(range_minima(runs, first, stop), expected)


def test_spec_target_runs_are_the_spec_targets():
    spec = parse_spec(marginals_spec([3, 4, 2, 5], targets=[1.0, 2.0, 2.0, 3.0, 1.0, 1.0]))
    runs = spec_target_runs(spec)
    np.testing.assert_array_equal(runs.expand(), spec.targets)
    assert runs.values.size < spec.targets.size  # runs, not the vector


@pytest.mark.parametrize("m", [97, 2**40], ids=["keys", "rows"])  # 2^40: (m + 1)^2 overflows int64
def test_distinct_ranges_are_the_distinct_rows_in_order(m):
    """Both routes of distinct_ranges (one integer key per range, or rows when the key would
    overflow) give np.unique's distinct rows, sorted by first then stop, and each range's row."""
    rng = np.random.default_rng(3)
    first = rng.integers(0, min(m, 50), size=300) * (m // 97)
    stop = first + rng.integers(1, 4, size=300) * (m // 97)
    pairs, which = distinct_ranges(first, stop, m)
    expected = np.unique(np.column_stack([first, stop]), axis=0)
    np.testing.assert_array_equal(pairs, expected)
    np.testing.assert_array_equal(pairs[which], np.column_stack([first, stop]))


def test_merged_steps_hold_every_run_constant():
    a = QueryRuns(np.array([1.0, 2.0]), np.array([0, 4, 10]))
    b = QueryRuns(np.array([5.0, 6.0, 7.0]), np.array([0, 2, 4, 10]))
    steps = merged_steps(a, b)
    np.testing.assert_array_equal(steps.breaks, [0, 2, 4, 10])
    for runs in (a, b):
        np.testing.assert_array_equal(np.repeat(steps.of_runs(runs), steps.lengths), runs.expand())


def test_spec_target_runs_gather_groups_of_several_runs():
    """Groups with targets of their own (lists: several runs each) between groups sharing one."""
    spec = marginals_spec([3, 2, 2], targets=[1.0, 2.0, 2.0])
    spec["queries"][0]["target"] = [1.0, 1.0, 3.0, 3.0, 3.0, 1.0]
    spec["queries"][2]["target"] = [2.0, 5.0, 5.0, 2.0]
    spec = parse_spec(spec)
    np.testing.assert_array_equal(spec_target_runs(spec).expand(), spec.targets)
