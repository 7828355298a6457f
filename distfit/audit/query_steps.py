"""Per-query sums without a vector the size of the workload: the audit's own.

A plan states, for every query, its target, its variance (the sum of its block rows') and that
some block answers it. At 100 attributes of 10 values, every marginal up to 3-way, that is
162.2M queries: every per-query vector is 1.3 GB, and the audit used to hold five of them and
their temporaries (5.9 GiB, against the plan's 1.1). But the rows come in two forms, and
neither needs one:

* an explicit block's rows are points: query ``q`` gets the row's variance and share;
* a pack's segment is a range: every query of ``[first, first + cells)`` (the cells of the
  segment's marginal, consecutive queries) gets the same variance and share.

So every per-query quantity is constant between consecutive *breaks*: the ends of every range,
every point and the point after it, and the offsets of the runs the plan stores
(:class:`distfit.mathematics.packing.QueryRuns`). :class:`QueryRows` collects the rows;
:meth:`QueryRows.steps` forms the breaks and each quantity's value between them
(:class:`Steps`), and every per-query check of the audit runs on those values, weighting a
count by the queries of each step. Memory: a few arrays of the number of steps (2 per range and
point, plus the runs), not of queries.

Sums are exact in the same sense as a per-query accumulation: ranges that coincide (every
segment of one marginal) are added per distinct range first; distinct ranges that do not
overlap (the planner's: marginals are disjoint query ranges) then take their sums as they are.
Overlapping distinct ranges (no plan the planner writes has them) are summed as differences at
their ends and a running sum, which can lose digits where large values cancel: an audit of such
a plan may then fail where a query-by-query sum would not, never the reverse silently (a
mismatch is reported, not hidden).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from distfit.mathematics.packing import QueryRuns
from distfit.spec.model import PipelineSpec

__all__ = ["QueryRows", "QuerySteps", "Steps", "distinct_ranges", "merged_steps", "range_minima", "spec_target_runs"]


def spec_target_runs(spec: PipelineSpec) -> QueryRuns:
    """The spec's targets, groups in order, as runs: each group's target vector encoded once
    (groups of one spec share an array when their targets are equal), never the whole vector."""
    if not spec.groups:
        return QueryRuns(np.zeros(0), np.zeros(1, dtype=np.int64))
    encoded: dict[int, int] = {}  # id of a group's target array -> its position in ``distinct``
    distinct: list[QueryRuns] = []
    which = np.empty(len(spec.groups), dtype=np.int64)
    for g, group in enumerate(spec.groups):
        k = encoded.get(id(group.targets))
        if k is None:
            k = encoded[id(group.targets)] = len(distinct)
            distinct.append(QueryRuns.encode(group.targets))
        which[g] = k
    # every group's runs gathered from the distinct encodings at once (499,500 groups of 1,000
    # attributes: one gather, not an array per group)
    counts = np.array([len(runs.values) for runs in distinct])[which]
    starts = np.cumsum([0] + [len(runs.values) for runs in distinct])[which]
    position = np.arange(int(counts.sum())) + np.repeat(starts - (np.cumsum(counts) - counts), counts)
    values = np.concatenate([runs.values for runs in distinct])[position]
    lengths = np.concatenate([runs.lengths for runs in distinct])[position]
    return QueryRuns(values, np.concatenate([[0], np.cumsum(lengths)])).canonical()


def range_minima(runs: QueryRuns, first: np.ndarray, stop: np.ndarray) -> np.ndarray:
    """``min`` of the per-query vector ``runs`` over each query range ``[first, stop)`` (not empty)."""
    if not first.size:
        return np.zeros(0)
    low = np.searchsorted(runs.offsets, first, side="right") - 1  # the run of the first query
    high = np.searchsorted(runs.offsets, stop - 1, side="right")  # one past the run of the last
    # reduceat over the pairs (low, high) interleaved: the even results are the ranges' minima
    # (high can be the number of runs, one past the last: pad one value)
    return np.minimum.reduceat(np.append(runs.values, np.inf), np.column_stack([low, high]).ravel())[::2]


@dataclass(frozen=True)
class Steps:
    """The intervals ``[breaks[i], breaks[i + 1])`` of the queries ``[0, m)``, on each of which
    every per-query quantity of the audit is constant."""

    breaks: np.ndarray  # (K + 1,) int64, 0 first, m last, strictly increasing

    @property
    def starts(self) -> np.ndarray:
        return self.breaks[:-1]

    @property
    def lengths(self) -> np.ndarray:
        """(K,) the queries of each step."""
        return np.diff(self.breaks)

    def of_runs(self, runs: QueryRuns) -> np.ndarray:
        """The value of ``runs`` on every step (its offsets are among the breaks)."""
        return runs.values[np.searchsorted(runs.offsets, self.starts, side="right") - 1]

    def queries(self, mask: np.ndarray) -> int:
        """How many queries the steps where ``mask`` holds cover."""
        return int(self.lengths[mask].sum())

    def first_query(self, mask: np.ndarray) -> int:
        """The first query of the first step where ``mask`` holds."""
        return int(self.starts[np.flatnonzero(mask)[0]])


@dataclass(frozen=True)
class QuerySteps:
    """Every query's summed variance and target share and whether a block answers it, per step."""

    steps: Steps
    variances: np.ndarray
    shares: np.ndarray
    answered: np.ndarray


@dataclass
class QueryRows:
    """The block rows of a plan as the audit meets them: points (explicit blocks) and ranges
    (packs' segments), summed per query by :meth:`steps` (module docstring)."""

    m: int
    points: list = field(default_factory=list)  # (query_index, variances, shares) per explicit block
    ranges: list = field(default_factory=list)  # (first, stop, variance, share) per pack

    def add_block(self, query_index: np.ndarray, variances: np.ndarray, shares: np.ndarray) -> None:
        self.points.append((np.asarray(query_index, dtype=np.int64), variances, shares))

    def add_ranges(self, first: np.ndarray, stop: np.ndarray, variance: np.ndarray, share: np.ndarray) -> None:
        self.ranges.append((np.asarray(first, dtype=np.int64), np.asarray(stop, dtype=np.int64), variance, share))

    def steps(self, *runs: QueryRuns) -> QuerySteps:
        """The steps of these rows and of ``runs`` (targets, stored variances), and the sums on them."""
        point_query, point_variance, point_share = _joined(self.points, (np.int64, float, float))
        first, stop, range_variance, range_share = _joined(self.ranges, (np.int64, np.int64, float, float))
        pairs, which = distinct_ranges(first, stop, self.m)  # the breaks of the distinct ranges only
        breaks = np.unique(np.concatenate([
            np.array([0, self.m], dtype=np.int64), point_query, point_query + 1, pairs[:, 0], pairs[:, 1],
            *(run.offsets for run in runs)]))
        steps = Steps(breaks)
        k = breaks.size - 1
        variances, shares, answered = np.zeros(k), np.zeros(k), np.zeros(k, dtype=bool)
        where = np.searchsorted(breaks, point_query)  # a point's step is [q, q + 1)
        np.add.at(variances, where, point_variance)
        np.add.at(shares, where, point_share)
        answered[where] = True
        if first.size:
            _add_ranges(steps, pairs, which, range_variance, range_share, variances, shares, answered)
        return QuerySteps(steps, variances, shares, answered)


def merged_steps(*runs: QueryRuns) -> Steps:
    """The steps on which every one of ``runs`` (vectors of the same queries) is constant: their
    offsets merged (each holds 0 and the number of queries)."""
    return Steps(np.unique(np.concatenate([run.offsets for run in runs])))


def distinct_ranges(first: np.ndarray, stop: np.ndarray, m: int) -> tuple[np.ndarray, np.ndarray]:
    """``(pairs, which)``: the distinct query ranges ``[first, stop)`` of queries in ``[0, m]``
    as rows ``(first, stop)`` sorted by first, then stop, and each range's row. One integer key
    per range, ``first (m + 1) + stop``, when it fits in int64 (every plan up to 3e9 queries):
    sorting keys is 20x faster than sorting rows (``np.unique(axis=0)``: 1.0 CPU-s for the 1.3M
    segments of 100 attributes of 10, every marginal up to 3-way)."""
    if not first.size:
        return np.zeros((0, 2), dtype=np.int64), np.zeros(0, dtype=np.int64)
    if (m + 1) ** 2 <= np.iinfo(np.int64).max:
        keys, which = np.unique(first * (m + 1) + stop, return_inverse=True)
        return np.column_stack([keys // (m + 1), keys % (m + 1)]), which.ravel()
    pairs, which = np.unique(np.column_stack([first, stop]), axis=0, return_inverse=True)
    return pairs, which.ravel()


def _joined(parts: list, dtypes: tuple) -> tuple[np.ndarray, ...]:
    """The parts' columns, each concatenated (empty of its dtype when there are no parts)."""
    return tuple(np.concatenate([part[i] for part in parts]) if parts else np.zeros(0, dtype=dtype)
                 for i, dtype in enumerate(dtypes))


def _add_ranges(steps: Steps, pairs: np.ndarray, which: np.ndarray, variance: np.ndarray, share: np.ndarray,
                variances: np.ndarray, shares: np.ndarray, answered: np.ndarray) -> None:
    """Add each range's variance and share to the steps it covers (module docstring: coinciding
    ranges summed first; disjoint distinct ranges assigned, overlapping ones by running sums);
    ``pairs`` and ``which``: :func:`distinct_ranges` of the ranges."""
    pair_variance = np.bincount(which, variance, minlength=len(pairs))
    pair_share = np.bincount(which, share, minlength=len(pairs))
    low = np.searchsorted(steps.breaks, pairs[:, 0])
    high = np.searchsorted(steps.breaks, pairs[:, 1])
    if np.all(pairs[1:, 0] >= pairs[:-1, 1]):  # sorted by start (np.unique) and disjoint
        covered = high - low
        step = np.arange(int(covered.sum())) + np.repeat(low - (np.cumsum(covered) - covered), covered)
        variances[step] += np.repeat(pair_variance, covered)
        shares[step] += np.repeat(pair_share, covered)
        answered[step] = True
        return
    k = variances.size
    for total, value in ((variances, pair_variance), (shares, pair_share), (None, np.ones(len(pairs)))):
        difference = np.zeros(k + 1)
        np.add.at(difference, low, value)
        np.add.at(difference, high, -value)
        running = np.cumsum(difference)[:k]
        if total is None:
            answered |= running > 0.5
        else:
            total += running
