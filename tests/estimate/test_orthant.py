"""The compiled active-set method on H = D + V V^T + E (distfit.estimate.orthant): its free-cell
solves against dense ones, its KKT points, rows solved together or apart, values and outputs."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

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
    np.testing.assert_allclose(start[1], gradient, rtol=0, atol=1e-8 * np.abs(g).max())
    assert np.isnan(given[:, 0]).all()  # g . x is not formed from x_u
    np.testing.assert_allclose(given[:, 1], values[:, 1], rtol=1e-8, atol=1e-10 * scale)
    with pytest.raises(ValueError, match="g or unconstrained, not both"):
        solve_orthant(found, g, unconstrained=g, tol=1e-10, max_steps=25)
    # without the gradient: the same x, bit for bit, and None for the gradient
    bare = solve_orthant(found, g, tol=1e-10, max_steps=25, gradient=False)
    assert bare[1] is None and np.array_equal(bare[0], x) and np.array_equal(bare[2], converged)


@pytest.mark.parametrize("size", [1e-6, 1e-8])
def test_from_the_unconstrained_solutions_the_defect_is_exact(size):
    """From x_u = H^-1 g the steps run on (D + V V^T) x_u and E (x - x_u) enters the refinement
    on the free cells only, the fixed cells' multipliers by a bound (formed where it leaves the
    KKT decision open), E x_u only for a unit whose KKT check fails. With a defect E far larger
    than a plan's (PL94: 3.6e-12 of max |H|): at 1e-6 every unit ends at H's KKT point, gradient
    and objective, as from g itself; at 1e-8, units with cells just above 0 (1e-6) and x_u far
    below 0 elsewhere have another free set under the form alone, which the KKT check catches
    and the steps correct."""
    model, hessian = structured_hessian(11)
    found = block_low_rank(hessian, model.sizes)
    rng = np.random.default_rng(12)
    positions = found.spread.size
    s, groups = found.group_cells, found.groups
    group = np.tile(np.arange(groups), s)
    noise = rng.standard_normal((positions, positions))
    defect = np.where(group[:, None] == group[None, :], 0.0, noise + noise.T)
    defect[found.perm < 0] = 0.0
    defect[:, found.perm < 0] = 0.0
    defect = (defect * size * np.abs(hessian).max() / np.abs(defect).max()).astype(np.float32)
    lying = dataclasses.replace(found, defect=defect)
    exact_h = hessian + defect.astype(np.float64)[np.ix_(found.place, found.place)]
    truth = rng.poisson(rng.choice([0.0, 0.5, 4.0], size=(400, model.cells))).astype(float)
    g = truth @ exact_h + rng.standard_normal((400, model.cells)) * 3
    start = np.linalg.solve(exact_h, g.T).T
    values, plain = np.empty((400, 2)), np.empty((400, 2))
    x, gradient, converged, _ = solve_orthant(lying, None, unconstrained=start, tol=1e-10, max_steps=25,
                                              values=values)
    scale = np.abs(g).max()
    tolerance = 1e-9
    assert converged.all() and (x >= 0).all()
    np.testing.assert_allclose(gradient, x @ exact_h - g, rtol=0, atol=1e-8 * scale)
    assert (x @ exact_h - g).min() >= -tolerance * scale
    assert np.abs(np.where(x > 0, x @ exact_h - g, 0.0)).max() <= tolerance * scale
    shift = x - start
    np.testing.assert_allclose(values[:, 1], np.einsum("ij,ij->i", shift, shift @ exact_h), rtol=1e-6)
    bare = dataclasses.replace(found, defect=np.zeros_like(defect))  # the form alone, E dropped
    if size > 1e-7:  # the same as from g (E x_u in g)
        reference = solve_orthant(lying, g, tol=1e-10, max_steps=25, values=plain)
        assert reference[2].all() and np.abs(x - reference[0]).max() <= 1e-9 * max(1.0, np.abs(x).max())
    else:  # units whose solution has cells just above 0 (1e-6)
        target = np.where(truth > 0, truth, 0.0)
        target[:, :6] = 1e-6  # free, just above 0
        multipliers = np.where(target > 0, 0.0, rng.uniform(500.0, 2000.0, target.shape))  # x_u far from x
        near = target @ exact_h - multipliers  # KKT at target: H target - g = multipliers >= 0
        x_u = np.linalg.solve(exact_h, near.T).T
        got = solve_orthant(lying, None, unconstrained=x_u, tol=1e-10, max_steps=25)
        own = solve_orthant(bare, None, unconstrained=x_u, tol=1e-10, max_steps=25)[0]
        bound = max(1.0, np.abs(target).max())
        # with x_u far below 0 on the fixed cells, the form's steps on g' = (D + V V^T) x_u miss
        # by E (x - x_u), which fixes some of those cells: the KKT check after the refinement
        # catches it and the unit goes on with g itself (E x_u formed), to H's solution, as from g
        moved = (own[:, :6] == 0).any(axis=1)
        from_g = solve_orthant(lying, near, tol=1e-10, max_steps=25)
        assert moved.sum() >= 300 and got[2].all() and from_g[2].all()
        assert (got[0][:, :6] > 0).all() and ((got[0] > 0) == (target > 0)).all()
        assert np.abs(got[0] - target).max() <= 1e-10 * bound
        assert np.abs(got[0] - from_g[0]).max() <= 1e-10 * bound
