"""The compiled active-set method on H = D + V V^T + E (distfit.estimate.orthant): its free-cell
solves against dense ones, its KKT points, rows solved together or apart, values and outputs."""
from __future__ import annotations

import numpy as np

from distfit.estimate.orthant import solve_free, solve_orthant
from distfit.estimate.projection import hessian_structure
from distfit.estimate.structure import block_low_rank
from tests.estimate.test_structure import structured_hessian


def test_solve_free_against_dense_solves():
    model, hessian = structured_hessian()
    structure = block_low_rank(hessian, model.sizes)
    # solve_free against dense solves of H_FF x_F = g_F (E left out: H = D + V V^T here to
    # rounding), for random free sets
    rng = np.random.default_rng(1)
    g = rng.standard_normal((50, model.cells))
    free = rng.random((50, model.cells)) < rng.uniform(0.1, 0.9, (50, 1))
    for dtype, tolerance in ((np.float64, 1e-10), (np.float32, 1e-3)):
        x = solve_free(structure, g, free, dtype)
        for unit in range(g.shape[0]):
            cells = np.flatnonzero(free[unit])
            expected = np.zeros(model.cells)
            expected[cells] = np.linalg.solve(hessian[np.ix_(cells, cells)], g[unit, cells])
            assert np.abs(x[unit] - expected).max() <= tolerance * max(1.0, np.abs(expected).max())


def test_solve_orthant_meets_the_kkt_conditions():
    model, hessian = structured_hessian(3)
    structure = hessian_structure(hessian, model.sizes)
    assert structure is not None and hessian_structure(hessian, model.sizes) is structure  # remembered
    rng = np.random.default_rng(4)
    truth = rng.poisson(rng.choice([0.0, 0.5, 4.0], size=(300, model.cells))).astype(float)
    g = truth @ hessian + rng.standard_normal((300, model.cells)) * 3
    x, gradient, converged, steps = solve_orthant(structure, g, tol=1e-10, max_steps=25)
    assert converged.all() and steps >= 1
    scale = np.abs(g).max()
    assert np.allclose(gradient, x @ hessian - g, atol=1e-8 * scale)
    assert (x >= 0).all()
    assert np.abs(np.where(x > 0, x @ hessian - g, 0.0)).max() <= 1e-9 * scale  # stationary on F
    assert (x @ hessian - g).min() >= -1e-8 * scale  # no negative multiplier on A


def test_solve_orthant_rows_orders_and_unconverged_rows():
    """The same KKT point whatever rows are solved together; rows that
    do not settle within max_steps come back as zeros, not converged."""
    model, hessian = structured_hessian(5)
    found = block_low_rank(hessian, model.sizes)
    rng = np.random.default_rng(6)
    truth = rng.poisson(rng.choice([0.0, 0.5, 4.0], size=(200, model.cells))).astype(float)
    g = truth @ hessian + rng.standard_normal((200, model.cells)) * 3
    x, gradient, converged, steps = solve_orthant(found, g, tol=1e-10, max_steps=25)
    assert converged.all()
    scale = np.abs(g).max()
    assert (x >= 0).all() and (x @ hessian - g).min() >= -1e-8 * scale
    assert np.abs(np.where(x > 0, x @ hessian - g, 0.0)).max() <= 1e-9 * scale
    rows = solve_orthant(found, g[::7], tol=1e-10, max_steps=25)
    assert rows[2].all() and np.array_equal(rows[0], x[::7])  # row by row: the same arithmetic
    short = solve_orthant(found, g, tol=1e-10, max_steps=1)
    assert steps > 1 and not short[2].all() and short[3] == 1
    assert not short[0][~short[2]].any() and not short[1][~short[2]].any()
    assert np.array_equal(short[0][short[2]], x[short[2]])


def test_solve_orthant_values_and_out():
    """``values``: ``x . (H x - g) - g . x`` and ``(x - H^-1 g)^T H (x - H^-1 g)`` at the solution
    (the projection's objective without and with the constant); ``out`` receives ``x``."""
    model, hessian = structured_hessian(7)
    found = block_low_rank(hessian, model.sizes)
    rng = np.random.default_rng(8)
    truth = rng.poisson(rng.choice([0.0, 0.5, 4.0], size=(40, model.cells))).astype(float)
    g = truth @ hessian + rng.standard_normal((40, model.cells)) * 3
    values, out = np.full((40, 2), np.nan), np.full((40, model.cells), np.nan)
    x, gradient, converged, _steps = solve_orthant(found, g, tol=1e-10, max_steps=25, values=values, out=out)
    assert converged.all() and x is out and np.isfinite(out).all()
    quadratic = np.einsum("ij,ij->i", x, x @ hessian - 2 * g)
    shift = x - np.linalg.solve(hessian, g.T).T
    rise = np.einsum("ij,ij->i", shift, shift @ hessian)
    scale = np.abs(quadratic).max()
    np.testing.assert_allclose(values[:, 0], quadratic, rtol=0, atol=1e-10 * scale)
    np.testing.assert_allclose(values[:, 1], rise, rtol=1e-9, atol=1e-10 * scale)
    # from the unconstrained solutions H^-1 g in place of g: the same KKT point and values
    start = solve_orthant(found, None, unconstrained=np.linalg.solve(hessian, g.T).T, tol=1e-10, max_steps=25,
                          values=(given := np.empty((40, 2))))
    assert start[2].all() and np.abs(start[0] - x).max() <= 1e-9 * max(1.0, np.abs(x).max())
    np.testing.assert_allclose(given, values, rtol=1e-8, atol=1e-10 * scale)
    # without the gradient: the same x, bit for bit, and None for the gradient
    bare = solve_orthant(found, g, tol=1e-10, max_steps=25, gradient=False)
    assert bare[1] is None and np.array_equal(bare[0], x) and np.array_equal(bare[2], converged)
