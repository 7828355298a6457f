"""Controlled rounding (distfit.estimate.rounding): floor or ceiling everywhere, totals and
parent sums kept exactly, on random inputs; the rounding equal to the nearest floor/ceiling
table found by exhaustion; the published tables of rounded cells their exact integer sums;
round_controlled's parents kept exactly and unit totals and a laminar family's sums within 1,
against exhaustion on tiny tables."""
from __future__ import annotations

import dataclasses
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

from distfit.estimate.measurements import measurement_model, published_estimates, workload_estimates, workload_kind
from distfit.estimate.rounding import laminar_family, round_children, round_controlled, round_preserving_total
from distfit.stores.plan import read_plan
from tests.reference import SMALL_SPEC
from tests.storetools import planned


def _floor_or_ceil(counts, x):
    return np.all((counts == np.floor(x)) | (counts == np.ceil(x)))


@pytest.mark.parametrize("seed", range(5))
def test_total_is_kept_and_each_cell_is_floor_or_ceil(seed):
    rng = np.random.default_rng(seed)
    x = rng.exponential(rng.choice([0.1, 1.0, 30.0]), (200, 17)) * (rng.random((200, 17)) < 0.6)
    counts = round_preserving_total(x)
    assert counts.dtype == np.int64 and counts.shape == x.shape
    assert _floor_or_ceil(counts, x)
    assert np.array_equal(counts.sum(axis=1), np.floor(x.sum(axis=1) + 0.5).astype(np.int64))
    # largest remainder: a cell raised never has a smaller remainder than one left at its floor
    remainder = x - np.floor(x)
    raised = counts > np.floor(x)
    lowest_raised = np.where(raised, remainder, np.inf).min(axis=1)
    highest_kept = np.where(~raised & (remainder > 0), remainder, -np.inf).max(axis=1)
    assert np.all(lowest_raised >= highest_kept)


def test_integers_stay_and_ties_go_to_the_lower_cell():
    assert np.array_equal(round_preserving_total(np.array([[2.0, 0.0, 5.0]])), [[2, 0, 5]])
    assert np.array_equal(round_preserving_total(np.array([[0.5, 0.5, 0.5, 0.5]])), [[1, 1, 0, 0]])
    assert np.array_equal(round_preserving_total(np.array([[0.25, 0.25]])), [[1, 0]])  # 0.5 rounds up
    assert np.array_equal(round_preserving_total(np.zeros((3, 4))), np.zeros((3, 4), dtype=np.int64))
    assert round_preserving_total(np.zeros((0, 4))).shape == (0, 4)
    assert np.array_equal(round_preserving_total(np.array([[-1e-12, 1.0]])), [[0, 1]])


def _nearest_floor_or_ceil(row: np.ndarray) -> np.ndarray:
    """The controlled rounding of one row by exhaustion, in exact rationals: of every vector whose
    cells are each floor(x) or ceil(x) and which sums to round(sum x) (halves up), the nearest to
    x in squared distance; of several, the one raising the lower cells (the lower cell first).
    Largest remainder must be it: raising cell c moves the squared distance by (1 - r_c)^2 - r_c^2
    = 1 - 2 r_c, so the nearest raises the cells of largest remainder."""
    x = [Fraction(float(v)) for v in row]
    floor = [math.floor(v) for v in x]
    total = math.floor(sum(x) + Fraction(1, 2))
    can_rise = [c for c, v in enumerate(x) if v != floor[c]]
    best = None
    for k in range(len(can_rise) + 1):
        for raised in itertools.combinations(can_rise, k):
            n = list(floor)
            for c in raised:
                n[c] += 1
            if sum(n) != total:
                continue
            key = (sum((a - b) ** 2 for a, b in zip(n, x)), [-a for a in n])  # then: lower cells up first
            if best is None or key < best[0]:
                best = (key, n)
    assert best is not None, row  # the module's proof: some floor/ceil vector has the rounded total
    return np.array(best[1], dtype=np.int64)


def test_largest_remainder_is_the_nearest_rounding_by_exhaustion():
    """Every row against :func:`_nearest_floor_or_ceil`: eighths (exact in binary, full of tied
    remainders and half-integer totals, so the tie rule and the halves-up total are exercised),
    random reals, and rows with integer cells (which never move)."""
    rng = np.random.default_rng(11)
    eighths = rng.integers(0, 24, (300, 6)) / 8.0
    reals = rng.exponential(rng.choice([0.3, 3.0], (150, 1)), (150, 7)) * (rng.random((150, 7)) < 0.8)
    whole = np.where(rng.random((50, 6)) < 0.5, rng.integers(0, 5, (50, 6)), rng.integers(0, 40, (50, 6)) / 8.0)
    for x in (eighths, reals, whole):
        counts = round_preserving_total(x)
        expected = np.array([_nearest_floor_or_ceil(row) for row in x])
        assert counts.dtype == np.int64
        wrong = np.flatnonzero((counts != expected).any(axis=1))
        assert wrong.size == 0, (x[wrong[:3]], counts[wrong[:3]], expected[wrong[:3]])


#: The tables of one integer table n, one group each, in spec (workload) order: the total and
#: SMALL_SPEC's groups, planned as SMALL_SPEC is (residual blocks of at most 12 cells, so a query
#: is split over blocks whose rows are not integers); "detailed" adds every cell as a query (one
#: block: the estimate writes n into those columns).
SPLIT_SPEC = dict(SMALL_SPEC, name="split", queries=[{"name": "everyone", "total": True, "target": 1},
                                                     *SMALL_SPEC["queries"]])
DETAILED_SPEC = dict(SPLIT_SPEC, name="detailed", blocks={"max_cells": 36}, queries=[
    *SPLIT_SPEC["queries"],
    {"name": "detailed", "attributes": {"age": "identity", "sex": "identity", "edu": "identity"}, "target": 4},
])


def _tables(n: np.ndarray) -> np.ndarray:
    """DETAILED_SPEC's queries of integer tables n (units x 6*2*3, row-major age, sex, edu) by
    integer sums of n itself: the total, age <= v, age x sex, edu <= v within each sex, the cells."""
    cube = n.reshape(-1, 6, 2, 3)
    units = cube.shape[0]
    return np.hstack([
        cube.sum(axis=(1, 2, 3))[:, None],
        cube.sum(axis=(2, 3)).cumsum(axis=1),
        cube.sum(axis=3).reshape(units, 12),
        cube.sum(axis=1).cumsum(axis=2).reshape(units, 6),
        n,
    ])


@pytest.fixture(scope="module")
def table_models(tmp_path_factory):
    """The measurement models of SPLIT_SPEC's and DETAILED_SPEC's plans."""
    models = {}
    for spec in (SPLIT_SPEC, DETAILED_SPEC):
        plan = planned(tmp_path_factory.mktemp(spec["name"]), spec).plan
        models[spec["name"]] = measurement_model(read_plan(plan))
    return models


def test_published_tables_of_rounded_cells_are_their_integer_sums(table_models):
    """The module docstring's consistency: the tables a store publishes from integer cells
    (:func:`~distfit.estimate.measurements.published_estimates` with ``integer``) are each the
    exact integer sum of the rounded cells, so every table totals the unit's rounded total and
    every marginal is the sum of the finer tables. Through each way the estimates are summed:
    the dense W with the cells as queries, the dense W without them, and the blocks' own rows (a
    domain too large for a dense W), whose coefficients are not integers (their sums are
    integers only up to rounding: published to the integer, not truncated)."""
    split, detailed = table_models["split"], table_models["detailed"]
    assert detailed.cells == split.cells == 36 and detailed.num_queries == split.num_queries + 36 == 61
    assert detailed.cell_queries == 25 and split.cell_queries is None
    assert any(not np.array_equal(b.query_rows, np.round(b.query_rows)) for b in split.blocks)
    rng = np.random.default_rng(5)
    x = rng.exponential(rng.choice([0.2, 2.0, 40.0], (60, 1)), (60, 36)) * (rng.random((60, 36)) < 0.7)
    n = round_preserving_total(x)
    want = _tables(n)
    assert np.array_equal(want[:, 0], np.floor(x.sum(axis=1) + 0.5))
    blocks_only = dataclasses.replace(split, workload=None)
    for name, way, expected in (("cells as queries", detailed, want), ("dense W", split, want[:, :-36]),
                                ("block rows", blocks_only, want[:, :-36])):
        kind = workload_kind(way)
        assert kind.integral and kind.nonnegative, name
        published = published_estimates(way, n, kind, integer=True)
        assert published.dtype == np.int64 and np.array_equal(published, expected), name
        sums = workload_estimates(way, n)
        if way.workload is not None:  # 0/1 rows of integers: every partial sum exact
            assert np.array_equal(sums, expected), name
        else:
            np.testing.assert_allclose(sums, expected, rtol=0, atol=1e-9, err_msg=name)


def _children(rng, parents, cells, per_parent):
    parent_counts = rng.poisson(5.0, (parents, cells)).astype(np.int64)
    parent_of = rng.permutation(np.repeat(np.arange(parents), per_parent))
    shares = rng.exponential(1.0, (parent_of.size, cells)) * (rng.random((parent_of.size, cells)) < 0.7)
    shares += 1e-3  # every child can hold something
    sums = np.zeros((parents, cells))
    np.add.at(sums, parent_of, shares)
    x = shares / sums[parent_of] * parent_counts[parent_of]
    return x, parent_of, parent_counts


@pytest.mark.parametrize("seed", range(5))
def test_children_sum_exactly_to_their_parent(seed):
    rng = np.random.default_rng(seed)
    x, parent_of, parent_counts = _children(rng, parents=7, cells=9, per_parent=rng.integers(1, 6))
    counts = round_children(x, parent_of, parent_counts)
    assert counts.dtype == np.int64 and _floor_or_ceil(counts, x)
    sums = np.zeros_like(parent_counts)
    np.add.at(sums, parent_of, counts)
    assert np.array_equal(sums, parent_counts)
    assert np.array_equal(round_children(x, parent_of, parent_counts), counts)  # deterministic


def test_children_ties_go_to_the_lower_row():
    x = np.array([[0.5], [0.5], [1.0]])
    assert np.array_equal(round_children(x, np.array([0, 0, 1]), np.array([[1], [1]])), [[1], [0], [1]])


def test_bad_input_is_refused_naming_the_field():
    with pytest.raises(ValueError, match="x: row 0, cell 1"):
        round_preserving_total(np.array([[1.0, -0.5]]))
    with pytest.raises(ValueError, match="x: expected a 2-d array"):
        round_preserving_total(np.ones(3))
    x = np.array([[0.5, 1.0], [0.5, 2.0]])
    with pytest.raises(ValueError, match="children of parent 0 sum to 3.0 in cell 1"):
        round_children(x, np.array([0, 0]), np.array([[1, 2]]))
    with pytest.raises(ValueError, match="parent_of: parent index"):
        round_children(x, np.array([0, 3]), np.array([[1, 3]]))
    with pytest.raises(ValueError, match="parent_counts: shape"):
        round_children(x, np.array([0, 0]), np.array([1, 3]))


# --------------------------------------------------------------------------------------------
# controlled rounding: totals and a laminar family of sums within 1, parents' cells exact


def _sums_within_one(counts, x, family):
    """Every row's total and sum over each set of ``family`` strictly within 1 of ``x``'s."""
    sets = np.vstack([np.ones((1, x.shape[1]), dtype=bool), family]).astype(float)
    return np.abs(counts @ sets.T - x @ sets.T).max(initial=0.0) < 1.0


CHAIN = np.array([[1, 1, 1, 1, 1, 0, 0, 0, 0],   # a laminar family of 9 cells: a chain, a disjoint set
                  [1, 1, 1, 0, 0, 0, 0, 0, 0],
                  [1, 0, 0, 0, 0, 0, 0, 0, 0],
                  [0, 0, 0, 0, 0, 1, 1, 1, 0]], dtype=bool)[[0, 1, 3]]


@pytest.mark.parametrize("seed", range(4))
def test_controlled_children_keep_parents_exactly_and_their_sums_within_one(seed):
    rng = np.random.default_rng(seed)
    x, parent_of, parent_counts = _children(rng, parents=40, cells=9, per_parent=rng.integers(2, 12))
    counts = round_controlled(x, CHAIN, parent_of, parent_counts)
    assert counts.dtype == np.int64 and counts.min() >= 0 and _floor_or_ceil(counts, x)
    sums = np.zeros_like(parent_counts)
    np.add.at(sums, parent_of, counts)
    assert np.array_equal(sums, parent_counts)
    assert _sums_within_one(counts, x, CHAIN)
    assert np.array_equal(round_controlled(x, CHAIN, parent_of, parent_counts), counts)  # deterministic
    # against the rounding of each cell among its siblings alone: the totals are close
    old = round_children(x, parent_of, parent_counts)
    total_error = np.abs(counts.sum(axis=1) - x.sum(axis=1)).mean()
    assert total_error < np.abs(old.sum(axis=1) - x.sum(axis=1)).mean()
    assert total_error < 0.4  # the largest-remainder rounding of the totals, where the cells allow it


@pytest.mark.parametrize("seed", range(3))
def test_controlled_roots_round_their_totals_to_nearest(seed):
    rng = np.random.default_rng(seed)
    x = rng.exponential(2.0, (300, 9)) * (rng.random((300, 9)) < 0.8)
    counts = round_controlled(x, CHAIN)
    assert _floor_or_ceil(counts, x) and _sums_within_one(counts, x, CHAIN)
    assert np.array_equal(counts.sum(axis=1), round_preserving_total(x).sum(axis=1))  # round(sum x), halves up


def _feasible_by_exhaustion(x, parent_of, parent_counts, family):
    """Every floor/ceiling table of ``x`` (one parent's children, rows x cells), by exhaustion:
    the choices whose cells sum to ``parent_counts``; each row's totals; and whether each row's
    sums over ``family`` are within 1 of ``x``'s."""
    floor = np.floor(x)
    free = np.flatnonzero(x.ravel() > floor.ravel())
    choices = np.array(list(itertools.product([0, 1], repeat=free.size)), dtype=np.int64).reshape(-1, free.size)
    tables = np.repeat(floor.ravel()[None].astype(np.int64), choices.shape[0], axis=0)
    tables[:, free] += choices
    tables = tables.reshape(-1, *x.shape)
    sums = np.zeros((choices.shape[0], parent_counts.shape[0], x.shape[1]), dtype=np.int64)
    for row, parent in enumerate(parent_of):
        sums[:, parent] += tables[:, row]
    exact = np.all(sums == parent_counts, axis=(1, 2))
    sets = np.vstack([np.ones((1, x.shape[1]), dtype=bool), family]).astype(float)
    within = np.all(np.abs(tables @ sets.T - x @ sets.T) < 1.0, axis=(1, 2))
    return tables, exact, within


@pytest.mark.parametrize("seed", [200, 203, 206, 208])
def test_controlled_rounding_against_exhaustion(seed):
    """Tiny tables (2 parents of 2 children, 4 cells, a family of 2 nested sets), every
    floor/ceiling table enumerated: one keeping the parents' cells and every child's total and
    family sums within 1 exists (Cox's theorem, as a network flow: the module docstring), the
    rounding is one (seed 208: rounding each cell among its siblings alone is not); and where
    one also gives every child the largest-remainder rounding of its total among its siblings,
    the rounding gives it too."""
    rng = np.random.default_rng(seed)
    family = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], dtype=bool)
    parent_of = np.array([0, 0, 1, 1])
    parent_counts = rng.integers(0, 5, (2, 4))
    shares = rng.exponential(1.0, (parent_of.size, 4)) + 1e-3
    sums = np.zeros((2, 4))
    np.add.at(sums, parent_of, shares)
    x = shares / sums[parent_of] * parent_counts[parent_of]
    tables, exact, within = _feasible_by_exhaustion(x, parent_of, parent_counts, family)
    assert np.any(exact & within)
    counts = round_controlled(x, family, parent_of, parent_counts)
    assert np.any(np.all(tables == counts, axis=(1, 2)) & exact & within)
    cell_by_cell = np.all(tables == round_children(x, parent_of, parent_counts), axis=(1, 2))
    assert bool(np.any(cell_by_cell & within)) is (seed != 208)
    floor_total = np.floor(x).sum(axis=1)
    demand = parent_counts.sum(axis=1) - np.bincount(parent_of, weights=floor_total, minlength=2)
    pinned = floor_total + round_children((x.sum(axis=1) - floor_total)[:, None], parent_of,
                                          np.rint(demand)[:, None].astype(np.int64))[:, 0]
    if np.any(exact & within & np.all(tables.sum(axis=2) == pinned, axis=1)):
        assert np.array_equal(counts.sum(axis=1), pinned)


def test_controlled_totals_fall_back_when_the_cells_forbid_the_nearest():
    """Two cells, four children of one parent each holding half a unit in one cell: the
    largest-remainder rounding of the totals (ties: the lower rows, [1, 1, 0, 0]) puts both
    units in cell 0, which holds only one, so each total is floor or ceil instead (by
    exhaustion: exactly the tables with one raised child per cell)."""
    x = np.array([[0.5, 0.0], [0.5, 0.0], [0.0, 0.5], [0.0, 0.5]])
    parent_of, parent_counts = np.zeros(4, dtype=np.int64), np.array([[1, 1]])
    counts = round_controlled(x, None, parent_of, parent_counts)
    tables, exact, _within = _feasible_by_exhaustion(x, parent_of, parent_counts, np.zeros((0, 2), dtype=bool))
    assert exact.sum() == 4 and np.any(np.all(tables[exact] == counts, axis=(1, 2)))


def test_laminar_family_of_a_workload():
    """The largest sets first; a set crossing a kept one, a repeat, a single cell and the total
    are left out; only 0/1 rows count."""
    workload = np.array([[1, 1, 1, 1, 1, 1],      # the total
                         [1, 1, 1, 0, 0, 0],      # kept (largest)
                         [0, 0, 1, 1, 0, 0],      # crosses the one above
                         [1, 1, 0, 0, 0, 0],      # nested: kept
                         [0, 0, 0, 1, 1, 0],      # disjoint from the kept ones: kept
                         [1, 1, 0, 0, 0, 0],      # a repeat
                         [0, 0, 0, 0, 0, 1],      # one cell
                         [2, 2, 0, 0, 0, 0]])     # not a 0/1 row
    family = laminar_family(workload)
    assert family.tolist() == [[True, True, True, False, False, False], [True, True, False, False, False, False],
                               [False, False, False, True, True, False]]
    assert laminar_family(None).shape == (0, 0)


def test_controlled_rounding_refuses_a_crossing_family():
    with pytest.raises(ValueError, match="family: sets 0 and 1 cross"):
        round_controlled(np.full((2, 3), 0.5), np.array([[1, 1, 0], [0, 1, 1]]))
    with pytest.raises(ValueError, match="family: a set appears twice"):
        round_controlled(np.full((2, 3), 0.5), np.array([[1, 1, 0], [1, 1, 0]]))
