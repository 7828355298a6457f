"""Dense kernels (distfit.solver.linalg) against plain numpy, and the row reduction the solver uses."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

import distfit
from distfit.solver.linalg import dominant_rows, factored_quadratic_forms, quadratic_forms, weighted_gram


@pytest.mark.parametrize("order", ["C", "F"])
def test_kernels_match_plain_products(order):
    rng = np.random.default_rng(0)
    rows = np.asarray(rng.normal(size=(300, 11)), order=order)
    weights = rng.random(300)
    factor = rng.normal(size=(11, 11))
    sigma = factor @ factor.T + np.eye(11)
    gram = weighted_gram(rows, weights)
    np.testing.assert_allclose(gram, (rows.T * weights) @ rows, rtol=1e-12, atol=1e-12)
    assert np.array_equal(gram, gram.T)
    upper = scipy.linalg.cho_factor(sigma, lower=False)[0]  # garbage below the diagonal is ignored
    plain = np.einsum("ij,ij->i", rows @ sigma, rows)
    np.testing.assert_allclose(quadratic_forms(rows, upper), plain, rtol=1e-12)
    # both branches of factored_quadratic_forms (many rows: QR + trmm; few: plain product)
    for count in (300, 15):
        np.testing.assert_allclose(factored_quadratic_forms(rows[:count], factor),
                                   np.einsum("ij,ij->i", rows[:count] @ factor @ factor.T, rows[:count]), rtol=1e-11)


def test_dominant_rows_keep_the_longest_of_each_direction():
    rng = np.random.default_rng(1)
    directions = rng.normal(size=(40, 9))
    owner = rng.integers(0, 40, size=500)
    scales = rng.uniform(-3, 3, size=500)
    rows = np.vstack([directions[owner] * scales[:, None], np.zeros((3, 9))])
    keep = dominant_rows(rows)
    assert np.all(np.diff(keep) > 0)
    # one row per direction present, the longest (sign does not matter)
    assert sorted(owner[keep]) == sorted(set(owner))
    for index in keep:
        assert abs(scales[index]) == np.abs(scales[owner == owner[index]]).max()
    # every dropped constraint is implied: for any Sigma its form is at most a kept row's
    factor = rng.normal(size=(9, 9))
    forms = np.einsum("ij,ij->i", rows @ factor @ factor.T, rows)
    for group in set(owner):
        assert forms[:500][owner == group].max() <= forms[keep][owner[keep] == group][0] * (1 + 1e-12)
    assert dominant_rows(np.zeros((4, 3))).size == 0


def test_solve_with_parallel_rows_is_the_solve_without_them():
    # A workload padded with scaled copies of its rows (looser or equal targets after scaling)
    # has the same optimum; every row's target still holds.
    rng = np.random.default_rng(2)
    W = np.vstack([np.eye(6), np.tril(np.ones((6, 6)))])
    targets = rng.uniform(1, 3, size=W.shape[0])
    copies = rng.integers(0, W.shape[0], size=40)
    factors = rng.uniform(0.2, 1.0, size=40) * rng.choice([-1, 1], size=40)
    padded = np.vstack([W, W[copies] * factors[:, None]])
    padded_targets = np.concatenate([targets, targets[copies] * rng.uniform(1.0, 2.0, size=40)])
    plain = distfit.solve(W, targets)
    padded_solution = distfit.solve(padded, padded_targets)
    assert padded_solution.alpha == pytest.approx(plain.alpha, rel=2e-4)
    assert np.all(padded_solution.variances <= padded_targets * (1 + 1e-9))
    assert padded_solution.lower_bound <= plain.alpha * (1 + 1e-9)
