"""Controlled rounding (distfit.estimate.rounding): floor or ceiling everywhere, totals and
parent sums kept exactly, on random inputs."""
from __future__ import annotations

import numpy as np
import pytest

from distfit.estimate.rounding import round_children, round_preserving_total


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


def test_rounded_tables_are_consistent():
    """Tables W n of one integer n (0/1 rows) are integers and sum into each other exactly."""
    rng = np.random.default_rng(4)
    x = rng.exponential(2.0, (50, 2 * 3 * 4))
    n = round_preserving_total(x).reshape(50, 2, 3, 4)
    total = n.sum(axis=(1, 2, 3))
    for axes in [(2, 3), (1, 3), (1, 2), (3,), (1,)]:
        table = n.sum(axis=axes)
        assert np.array_equal(table.reshape(50, -1).sum(axis=1), total)
    assert np.array_equal(n.sum(axis=3).sum(axis=2), n.sum(axis=(2, 3)))


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
