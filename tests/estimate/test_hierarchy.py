"""The hierarchy's GLS estimates against a dense GLS solve of the stacked system, and Monte Carlo."""
from __future__ import annotations

import numpy as np
import pytest
import scipy.linalg

from distfit.estimate import hierarchy
from distfit.estimate.hierarchy import Grouping, estimate_hierarchy, psd_pinv
from distfit.estimate.shared_basis import diagonal_in, shared_basis
from distfit.estimate.subtrees import (
    DRIVER_MATRIX_BYTES,
    MATRICES_PER_UNIT,
    basis_forest_upward,
    choose_cut,
    descendant_spans,
    estimate_by_subtrees,
    forest_downward,
    forest_upward,
    group_roots,
    leaf_tables,
    local_parents,
    matrix_units,
    merge_summaries,
    top_estimate,
)

D = 6


def _tree(fanouts: list[list[int]], rng: np.random.Generator) -> list[np.ndarray | None]:
    """``parent_of`` per level: ``fanouts[l][p]`` children of unit ``p`` of level ``l``, listed in a
    shuffled order (children need not be sorted by parent)."""
    parents: list[np.ndarray | None] = [None]
    for counts in fanouts:
        up = np.repeat(np.arange(len(counts)), counts)
        parents.append(up[rng.permutation(up.size)])
    return parents


def _sigma(k: int, rng: np.random.Generator) -> np.ndarray:
    """A correlated covariance (k x k), variances of order 1-4."""
    a = rng.standard_normal((k, k))
    return a @ a.T / k + np.diag(rng.uniform(0.5, 2.0, k))


def _design(rows: list[int], rng: np.random.Generator) -> list[tuple[np.ndarray, np.ndarray]]:
    """``(W_l, Sigma_l)`` per level; ``rows[l] < D``: the level measures part of the table."""
    out = []
    for k in rows:
        w = rng.integers(0, 2, (k, D)).astype(np.float64)
        w[0] = 1.0  # a total
        if k >= D:  # full rank: the total and D - 1 cells
            w[1:D] = np.eye(D)[1:]
        out.append((w, _sigma(k, rng)))
    return out


def _leaf_map(parents: list[np.ndarray | None], sizes: list[int]) -> tuple[list[np.ndarray], int]:
    """Per level, ``A`` (units x leaves) 0/1: which leaves (childless units, any level) each unit sums."""
    has_child = [np.zeros(n, dtype=bool) for n in sizes]
    for level in range(1, len(sizes)):
        has_child[level - 1][parents[level]] = True
    leaf_rows = [np.flatnonzero(~h) for h in has_child]
    leaves = sum(r.size for r in leaf_rows)
    maps: list[np.ndarray] = [None] * len(sizes)
    start = 0
    for level in range(len(sizes) - 1, -1, -1):
        a = np.zeros((sizes[level], leaves))
        a[leaf_rows[level], start + np.arange(leaf_rows[level].size)] = 1.0
        start += leaf_rows[level].size
        if level + 1 < len(sizes):
            np.add.at(a, parents[level + 1], maps[level + 1])
        maps[level] = a
    return maps, leaves


def _problem(fanouts, rows, seed, empty=(2, 5)):
    rng = np.random.default_rng(seed)
    parents = _tree(fanouts, rng)
    sizes = [1] + [int(sum(f)) for f in fanouts]
    maps, leaves = _leaf_map(parents, sizes)
    truth_leaves = rng.poisson(4.0, (leaves, D)).astype(np.float64)
    truth_leaves[list(empty)] = 0.0  # empty units
    truth = [a @ truth_leaves for a in maps]
    design = _design(rows, rng)
    ys = [truth[l] @ w.T + rng.multivariate_normal(np.zeros(w.shape[0]), s, size=sizes[l])
          for l, (w, s) in enumerate(design)]
    return parents, sizes, maps, leaves, truth, design, ys


def _normal(design, ys):
    js = [w.T @ np.linalg.solve(s, w) for w, s in design]
    hs = [y @ np.linalg.solve(s, w) for (w, s), y in zip(design, ys)]  # rows h_u = W^T Sigma^-1 y_u
    return js, hs


def _dense(design, ys, maps, leaves):
    """GLS of the stacked system over the leaves' tables: ``F = X^T Sigma^-1 X`` (Sigma
    block diagonal over units), the minimum-norm solution ``F^+ X^T Sigma^-1 y`` and its
    covariance ``F^+``; per level the estimates ``A beta``, covariances ``A F^+ A^T`` and an
    orthonormal basis of each unit's estimable functions ``{a: A_u^T a in range F}``."""
    xs, sigmas, yy = [], [], []
    for (w, s), y, a in zip(design, ys, maps):
        for u in range(a.shape[0]):
            xs.append(w @ np.kron(a[u][None, :], np.eye(D)))
            sigmas.append(s)
            yy.append(y[u])
    x, sigma, y = np.vstack(xs), scipy.linalg.block_diag(*sigmas), np.concatenate(yy)
    f = x.T @ np.linalg.solve(sigma, x)
    f_pinv = np.linalg.pinv(f, rcond=1e-11, hermitian=True)
    beta = f_pinv @ (x.T @ np.linalg.solve(sigma, y))
    off_range = np.eye(f.shape[0]) - f @ f_pinv
    out = []
    for a in maps:
        level = []
        for u in range(a.shape[0]):
            au = np.kron(a[u][None, :], np.eye(D))  # d x (leaves d)
            est = au @ beta
            cov = au @ f_pinv @ au.T
            _, sv, vt = np.linalg.svd(off_range @ au.T)
            basis = vt[np.r_[sv, np.zeros(D - sv.size)] <= 1e-8 * max(1.0, sv.max(initial=0.0))].T
            level.append((est, cov, basis))
        out.append(level)
    return out


FULL_LEAVES = dict(fanouts=[[4], [4, 1, 3, 2]], rows=[D + 2, 3, D])          # the middle level measures part
RAGGED = dict(fanouts=[[5], [3, 1, 2, 0, 2]], rows=[2, D, D + 1])            # a childless unit above the leaves
PARTIAL_LEAVES = dict(fanouts=[[4], [4, 1, 3, 2]], rows=[3, D, 4])           # the leaves measure part
RAGGED_PARTIAL = dict(fanouts=[[5], [3, 1, 2, 0, 2]], rows=[D, 3, 4])        # siblings identify different parts
FIVE_LEVELS = dict(fanouts=[[2], [3, 1], [2, 1, 3, 2], [2, 1, 3, 1, 2, 2, 1, 2]], rows=[3, D, 2, D, D + 1])
FIVE_PARTIAL = dict(fanouts=[[2], [3, 1], [2, 1, 3, 2], [2, 1, 3, 1, 2, 2, 1, 2]], rows=[D + 2, 3, D, 2, 4])
RAGGED_DEEP = dict(fanouts=[[2], [3, 1], [2, 0, 3, 2], [2, 1, 3, 1, 2, 2, 1]], rows=[D, D + 1, 3, D, 4])
CASES = [FULL_LEAVES, RAGGED, PARTIAL_LEAVES, RAGGED_PARTIAL, FIVE_LEVELS, FIVE_PARTIAL, RAGGED_DEEP]
IDS = ["full-leaves", "ragged", "partial-leaves", "ragged-partial", "five-levels", "five-partial", "ragged-deep"]
IDENTIFIED = (FULL_LEAVES, RAGGED, FIVE_LEVELS)


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("seed, split", [(0, "equal"), (1, "equal"), (2, "total")])
def test_equals_dense_gls_on_estimable_functions(case, seed, split):
    """Also with the unidentified remainder split by the children's totals: every estimable
    function keeps its BLUE and variance (module docstring)."""
    parents, sizes, maps, leaves, truth, design, ys = _problem(case["fanouts"], case["rows"], seed)
    js, hs = _normal(design, ys)
    result = estimate_hierarchy(js, hs, parents, split=split)
    dense = _dense(design, ys, maps, leaves)
    identified = any(case is c for c in IDENTIFIED)
    for level, units in enumerate(dense):
        scale = max(1.0, float(np.abs(truth[level]).max()))
        for u, (est, cov, basis) in enumerate(units):
            if identified:
                assert basis.shape[1] == D
            w = design[level][0]
            # every measured query of a unit is estimable, and every function its subtree identifies
            assert np.allclose(w - (w @ basis) @ basis.T, 0.0, atol=1e-8)
            inside = result.unit("subtree_information", level, u)
            assert np.allclose(inside - basis @ (basis.T @ inside), 0.0, atol=1e-8 * np.abs(inside).max())
            # the information F_u spans exactly the estimable functions, and gives their variances
            final = result.unit("information", level, u)
            f_pinv, f_null = psd_pinv(final)
            np.testing.assert_allclose(np.eye(D) - f_null, basis @ basis.T, atol=1e-7)
            np.testing.assert_allclose(basis.T @ f_pinv @ basis, basis.T @ cov @ basis, rtol=1e-8,
                                       atol=1e-8 * float(np.abs(cov).max()))
            got, got_cov = result.x[level][u] @ basis, basis.T @ result.unit("covariance", level, u) @ basis
            np.testing.assert_allclose(got, est @ basis, rtol=1e-9, atol=1e-9 * scale)
            np.testing.assert_allclose(got_cov, basis.T @ cov @ basis, rtol=1e-9,
                                       atol=1e-9 * float(np.abs(cov).max()))
    if not identified:  # some leaf direction is not estimable: the test exercises the singular path
        assert any(b.shape[1] < D for _, _, b in dense[-1])


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("split", ["equal", "total"])
def test_children_sum_to_parent(case, split):
    parents, sizes, maps, leaves, truth, design, ys = _problem(case["fanouts"], case["rows"], 3)
    js, hs = _normal(design, ys)
    result = estimate_hierarchy(js, hs, parents, split=split)
    for level in range(1, len(sizes)):
        sums = np.zeros_like(result.x[level - 1])
        np.add.at(sums, parents[level], result.x[level])
        has_child = np.bincount(parents[level], minlength=sizes[level - 1]) > 0
        scale = np.abs(result.x[level - 1]).max()
        assert np.abs(sums[has_child] - result.x[level - 1][has_child]).max() <= 4 * np.finfo(float).eps * scale


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_covariance_is_that_of_the_returned_estimate(case):
    """The estimate is linear in the measurements: its exact covariance ``T Sigma T^T``, with
    the map ``T`` found column by column (a unit vector of measurements at a time), equals
    ``P_u`` in every direction, estimable or not."""
    parents, sizes, maps, leaves, truth, design, ys = _problem(case["fanouts"], case["rows"], 4)
    js, _ = _normal(design, ys)
    columns = [(level, u, i) for level, size in enumerate(sizes) for u in range(size)
               for i in range(design[level][0].shape[0])]
    maps_t = [np.zeros((sizes[level], D, len(columns))) for level in range(len(sizes))]
    for col, (level, u, i) in enumerate(columns):
        unit = [np.zeros((n, design[l][0].shape[0])) for l, n in enumerate(sizes)]
        unit[level][u, i] = 1.0
        _, hs = _normal(design, unit)
        out = estimate_hierarchy(js, hs, parents)
        for l in range(len(sizes)):
            maps_t[l][:, :, col] = out.x[l]
    sigma = scipy.linalg.block_diag(*[design[level][1] for level, size in enumerate(sizes) for _ in range(size)])
    result = estimate_hierarchy(js, _normal(design, ys)[1], parents)
    for level in range(len(sizes)):
        expected = np.einsum("uic,cd,ujd->uij", maps_t[level], sigma, maps_t[level])
        np.testing.assert_allclose(result.unit("covariance", level), expected, rtol=1e-9,
                                   atol=1e-9 * float(np.abs(expected).max()))


def test_single_child_is_its_parent():
    """A parent with one child: the child's estimate is the parent's, in every cell (also the
    cells the leaves do not measure)."""
    parents, sizes, maps, leaves, truth, design, ys = _problem(PARTIAL_LEAVES["fanouts"], PARTIAL_LEAVES["rows"], 5)
    js, hs = _normal(design, ys)
    result = estimate_hierarchy(js, hs, parents)
    only = np.flatnonzero(np.bincount(parents[2], minlength=sizes[1]) == 1)
    assert only.size == 1
    child = np.flatnonzero(parents[2] == only[0])
    np.testing.assert_array_equal(result.x[2][child[0]], result.x[1][only[0]])


def test_monte_carlo_variances_and_coverage():
    """Repeated releases of a small tree (the tree repeated as independent roots of one call):
    empirical variances of published linear functions within 10% of ``a^T P a``, 90% intervals
    ``+- 1.645 se`` covering 88-92%, means unbiased. 8000 draws: the relative standard error of
    an empirical variance is sqrt(2/8000) = 1.6% (10% is 6 se); of a coverage 0.34% (2% is 6 se)."""
    draws = 8000
    rng = np.random.default_rng(20261203)
    fanouts = FULL_LEAVES["fanouts"]
    parents0 = _tree(fanouts, rng)
    sizes0 = [1] + [int(sum(f)) for f in fanouts]
    maps, leaves = _leaf_map(parents0, sizes0)
    truth_leaves = rng.poisson(3.0, (leaves, D)).astype(np.float64)
    truth_leaves[[1, 6]] = 0.0
    design = _design(FULL_LEAVES["rows"], rng)
    parents, truth, ys = [None], [], []
    for level, a in enumerate(maps):
        n = sizes0[level]
        if level:  # copy r of the tree: its units at rows r n .. r n + n - 1
            parents.append((np.arange(draws)[:, None] * sizes0[level - 1] + parents0[level][None, :]).ravel())
        truth.append(np.tile(a @ truth_leaves, (draws, 1)))
        w, s = design[level]
        ys.append(truth[-1] @ w.T + rng.multivariate_normal(np.zeros(w.shape[0]), s, size=n * draws))
    js, hs = _normal(design, ys)
    result = estimate_hierarchy(js, hs, parents)
    ones, cell = np.ones(D), np.eye(D)[2]
    functions = [(0, 0, ones), (1, 1, cell), (1, 2, np.eye(D)[0] - np.eye(D)[5]), (2, 0, ones), (2, 1, cell),
                 (2, 6, np.arange(D, dtype=float))]
    for level, u, a in functions:
        rows = np.arange(draws) * sizes0[level] + u
        error = (result.x[level][rows] - truth[level][rows]) @ a
        stated = np.einsum("i,rij,j->r", a, result.unit("covariance", level, rows), a)
        assert np.allclose(stated, stated[0], rtol=1e-9)  # the same tree, the same variance
        assert abs(error.var() / stated[0] - 1.0) < 0.10, (level, u, error.var(), stated[0])
        assert abs(error.mean()) < 4.0 * np.sqrt(stated[0] / draws)
        covered = np.mean(np.abs(error) <= 1.645 * np.sqrt(stated[0]))
        assert 0.88 <= covered <= 0.92, (level, u, covered)


def test_psd_pinv_null_space():
    a = np.diag([4.0, 1.0, 0.0])
    pinv, null = psd_pinv(a)
    np.testing.assert_allclose(pinv, np.diag([0.25, 1.0, 0.0]))
    np.testing.assert_allclose(null, np.diag([0.0, 0.0, 1.0]))


@pytest.mark.parametrize("bad, message", [
    (dict(parent_of=[None, np.array([0, 0, 1])]), "level 1: parent_of outside 0..0"),
    (dict(parent_of=[None, np.array([0.0, 0.0, 0.0])]), "level 1: parent_of must be 3 integers"),
    (dict(information=[np.eye(D), np.eye(D + 1)]), "level 1: information must be"),
    (dict(parent_of=[np.array([0]), np.array([0, 0, 0])]), "level 0: the coarsest level has no parents"),
])
def test_bad_input_names_the_level(bad, message):
    args = dict(information=[np.eye(D), np.eye(D)], linear=[np.ones((1, D)), np.ones((3, D))],
                parent_of=[None, np.array([0, 0, 0])])
    args.update(bad)
    with pytest.raises(ValueError, match=message):
        estimate_hierarchy(**args)


def test_units_measured_differently_are_classes_of_their_own():
    """A level whose units have different ``J`` (here every other county measured with a
    second, noisier design): the classes follow ``J``, and the estimates and covariances are
    still the dense GLS's."""
    rng = np.random.default_rng(11)
    fanouts = [[3], [2, 3, 1]]
    parents = _tree(fanouts, rng)
    sizes = [1, 3, 6]
    maps, leaves = _leaf_map(parents, sizes)
    truth = rng.poisson(4.0, (leaves, D)).astype(np.float64)
    base = _design([D + 1, 3, D], rng)
    other = (base[2][0], 4.0 * base[2][1])
    designs = [[base[0]], [base[1]] * 3, [base[2] if u % 2 else other for u in range(6)]]
    ys = [np.stack([w @ (maps[level][u] @ truth) + rng.multivariate_normal(np.zeros(w.shape[0]), s)
                    for u, (w, s) in enumerate(designs[level])]) for level in range(3)]
    js = [np.stack([w.T @ np.linalg.solve(s, w) for w, s in units]) for units in designs]
    hs = [np.stack([np.linalg.solve(s, w).T @ y for (w, s), y in zip(units, y_level)])
          for units, y_level in zip(designs, ys)]
    result = estimate_hierarchy(js, hs, parents)
    assert np.unique(result.unit_class[2]).size > np.unique(estimate_hierarchy(
        [j[0] for j in js], hs, parents).unit_class[2]).size  # J splits the counties' classes
    # the dense GLS of the stacked system, unit by unit
    xs = [w @ np.kron(maps[level][u][None, :], np.eye(D)) for level in range(3) for u, (w, _) in enumerate(designs[level])]
    sigma = scipy.linalg.block_diag(*[s for level in range(3) for _, s in designs[level]])
    x, y = np.vstack(xs), np.concatenate([row for level in range(3) for row in ys[level]])
    f = x.T @ np.linalg.solve(sigma, x)
    assert np.linalg.matrix_rank(f) == f.shape[0]  # every direction identified: compare every cell
    f_inv = np.linalg.inv(f)
    beta = f_inv @ (x.T @ np.linalg.solve(sigma, y))
    for level in range(3):
        for u in range(sizes[level]):
            au = np.kron(maps[level][u][None, :], np.eye(D))
            np.testing.assert_allclose(result.x[level][u], au @ beta, rtol=1e-9, atol=1e-9 * np.abs(beta).max())
            np.testing.assert_allclose(result.unit("covariance", level, u), au @ f_inv @ au.T, rtol=1e-9,
                                       atol=1e-9 * np.abs(f_inv).max())


def test_classes_of_a_census_shaped_tree_and_the_gathered_products(monkeypatch):
    """Nation > states > counties: the counties are one subtree class, a state's class is its
    fanout and a county's (downward) class its state's; with the classes' matrices gathered
    per unit (many classes) instead of one product per class, the same estimates."""
    rng = np.random.default_rng(12)
    fanouts = [[7], [3, 1, 3, 2, 3, 1, 5]]
    parents = _tree(fanouts, rng)
    sizes = [1, 7, 18]
    maps, leaves = _leaf_map(parents, sizes)
    truth = [a @ rng.poisson(3.0, (leaves, D)).astype(np.float64) for a in maps]
    design = _design([D + 2, D, 3], rng)
    ys = [truth[l] @ w.T + rng.multivariate_normal(np.zeros(w.shape[0]), s, size=sizes[l])
          for l, (w, s) in enumerate(design)]
    js, hs = _normal(design, ys)
    result = estimate_hierarchy(js, hs, parents)
    states = np.bincount(parents[2], minlength=7)
    assert result.unit_class[0].tolist() == [0]
    _, state_class = np.unique(states, return_inverse=True)
    assert result.covariance[1].shape[0] == np.unique(states).size == 4
    assert np.array_equal(result.unit_class[1], state_class.reshape(-1))
    assert np.array_equal(result.unit_class[2], result.unit_class[1][parents[2]])
    monkeypatch.setattr(hierarchy, "CLASS_LOOP", 0)
    gathered = estimate_hierarchy(js, hs, parents)
    for level in range(3):
        np.testing.assert_allclose(gathered.x[level], result.x[level], rtol=1e-12, atol=1e-12 * np.abs(truth[0]).max())


def test_the_unidentified_remainder_split_by_the_childrens_totals():
    """Leaves measuring part of the table (all blind in the same directions): with
    ``split="total"`` each leaf's part in the blind directions (``Pi x_c``) is its parent's
    remainder times its share of the siblings' totals, where the equal split gives every
    sibling the same part; the measured functions do not move."""
    rng = np.random.default_rng(13)
    fanouts = [[3], [4, 2, 3]]
    parents = _tree(fanouts, rng)
    sizes = [1, 3, 9]
    maps, leaves = _leaf_map(parents, sizes)
    truth = [a @ (rng.poisson(3.0, (leaves, D)) * (5 + 4 * np.arange(leaves))[:, None]).astype(float) for a in maps]
    design = _design([D + 2, D, 3], rng)
    ys = [truth[l] @ w.T + rng.multivariate_normal(np.zeros(w.shape[0]), s, size=sizes[l])
          for l, (w, s) in enumerate(design)]
    js, hs = _normal(design, ys)
    equal, total = estimate_hierarchy(js, hs, parents), estimate_hierarchy(js, hs, parents, split="total")
    _, blind = psd_pinv(js[2])
    for parent in range(3):
        children = np.flatnonzero(parents[2] == parent)
        weight = np.maximum(equal.x[2][children].sum(axis=1), 0.0)  # the estimated totals (at least 0)
        share = weight / weight.sum()
        assert np.ptp(share) > 0.05  # units of different sizes
        parts = total.x[2][children] @ blind
        np.testing.assert_allclose(parts, share[:, None] * parts.sum(axis=0), rtol=1e-8, atol=1e-8 * np.abs(parts).max())
        np.testing.assert_allclose(equal.x[2][children] @ blind, np.tile(parts.mean(axis=0), (children.size, 1)),
                                   rtol=1e-8, atol=1e-8 * np.abs(parts).max())
    w = design[2][0]
    np.testing.assert_allclose(total.x[2] @ w.T, equal.x[2] @ w.T, rtol=1e-9, atol=1e-9 * np.abs(truth[2]).max())


# the passes split into subtrees (distfit.estimate.subtrees): equal to the whole-tree passes


def _by_parent(parents: list, sizes: list[int]) -> tuple[list[np.ndarray], list]:
    """Each level's units reordered by their parent's (new) row, as a release orders them:
    ``(order per level, parent_of per level in the new order)``."""
    order, out = [np.arange(sizes[0])], [None]
    for level in range(1, len(sizes)):
        renamed = np.empty_like(order[-1])
        renamed[order[-1]] = np.arange(order[-1].size)
        rows = renamed[parents[level]]
        o = np.argsort(rows, kind="stable")
        order.append(o)
        out.append(rows[o])
    return order, out


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("split", ["equal", "total"])
def test_subtrees_equal_the_whole_tree(case, split):
    """Every cut level and forest size (one subtree per forest, a few, all): the same estimates and
    covariances as the whole-tree passes to 1e-9; where every unit is identified, the dense GLS."""
    parents, sizes, maps, leaves, truth, design, ys = _problem(case["fanouts"], case["rows"], 3)
    js, hs = _normal(design, ys)
    order, up = _by_parent(parents, sizes)
    whole = estimate_hierarchy(js, [h[o] for h, o in zip(hs, order)], up, split=split)
    for cut in range(len(sizes) - 1):
        for max_rows in (1, 4, 1000):
            xs, covs = estimate_by_subtrees(js, [h[o] for h, o in zip(hs, order)], up, cut, max_rows, split=split)
            for level, (x, cov) in enumerate(zip(xs, covs)):
                scale = max(1.0, float(np.abs(whole.x[level]).max()))
                assert np.allclose(x, whole.x[level], rtol=0, atol=1e-9 * scale)
                assert np.allclose(cov, whole.unit("covariance", level), rtol=0, atol=1e-9 * scale)
    if split == "equal":  # the dense GLS's estimates, where each unit's table is estimable
        dense = _dense(design, ys, maps, leaves)
        xs, _ = estimate_by_subtrees(js, [h[o] for h, o in zip(hs, order)], up, 1, 3)
        for level, units in enumerate(dense):
            for u, (est, _, basis) in enumerate(units):
                if basis.shape[1] == est.size:
                    row = int(np.flatnonzero(order[level] == u)[0])
                    assert np.allclose(xs[level][row], est, atol=1e-8)


def test_forests_are_consecutive_subtrees_within_the_row_budget():
    counts = [np.array([2, 0, 3]), np.array([1, 4, 2, 2, 1])]  # 3 roots, 5 children, 10 grandchildren
    spans = descendant_spans(counts)
    assert [s.tolist() for s in spans] == [[0, 1, 2, 3], [0, 2, 2, 5], [0, 5, 5, 10]]
    assert group_roots(spans, 9) == [(0, 2), (2, 3)]  # rows per root (all levels): 8, 1, 9
    assert group_roots(spans, 5) == [(0, 1), (1, 2), (2, 3)]  # a subtree over the budget: alone
    assert group_roots(spans, 100) == [(0, 3)]
    assert choose_cut([1, 50, 5000, 10**6], driver_units=4096) == 1
    assert choose_cut([5000, 10**6], driver_units=4096) == -1
    # the top's matrices: levels 0 .. c together (a unit each, nearly one class per unit) within the driver's bytes
    assert matrix_units(252, DRIVER_MATRIX_BYTES) == DRIVER_MATRIX_BYTES // (MATRICES_PER_UNIT * 8 * 252 * 252)
    us_100k = [1, 51, 51, 1038, 2948, 100_000]  # the US-shaped geography of 100,000 blocks
    assert choose_cut(us_100k) == 4 and choose_cut(us_100k, cells=252) == 2  # 103 units above the cut's subtrees
    assert choose_cut(us_100k, cells=252, driver_bytes=1) == 0  # at least one unit: the nation alone
    # and a forest's units above the finest level: 1 + 2 for root 0, 1 + 0 for root 1, 1 + 3 for root 2
    assert group_roots(spans, 100, max_inner=8) == [(0, 3)]
    assert group_roots(spans, 100, max_inner=4) == [(0, 2), (2, 3)]
    assert group_roots(spans, 100, max_inner=3) == [(0, 1), (1, 2), (2, 3)]  # root 2 over the budget: alone


# the passes in a basis shared by every level's information (distfit.estimate.shared_basis)


def _kron_family(coefficients: tuple[float, float, float, float]) -> np.ndarray:
    """``a I + b (1 1^T x I) + c (I x 1 1^T) + e (1 1^T x 1 1^T)`` on the 2 x 3 table (D = 6):
    matrices of one commuting family, with eigenspaces of dimensions 1, 1, 2 and 2 (degenerate)."""
    one2, one3, i2, i3 = np.ones((2, 2)), np.ones((3, 3)), np.eye(2), np.eye(3)
    a, b, c, e = coefficients
    return a * np.kron(i2, i3) + b * np.kron(one2, i3) + c * np.kron(i2, one3) + e * np.kron(one2, one3)


#: Per family, each level's ``J`` (coarsest first; cycled for deeper trees): one ``J`` at every
#: level up to a scale (PL94's levels), and marginal workloads with degenerate eigenspaces, some
#: levels measuring part of the table (singular: the total, one attribute's marginal).
FAMILIES = {
    "scaled": lambda design: [c * design[-1] for c in (1.0, 2.5, 0.5, 4.0, 1.5)],
    "marginals": lambda design: [_kron_family(c) for c in ((0, 0, 0, 2.0), (1.0, 0.5, 0, 0), (0, 0, 1.5, 0.5),
                                                           (0.8, 0, 0.3, 0), (0, 1.0, 0, 0))],
    "marginals-full-leaves": lambda design: [_kron_family(c) for c in ((0, 0, 0, 2.0), (0, 1.0, 0.5, 0),
                                                                       (1.0, 0.2, 0.3, 0.1), (0, 0, 1.0, 0),
                                                                       (2.0, 0, 0, 0.5))],
}


def _commuting(case, family, seed):
    """A problem of ``case``'s tree whose levels' ``J`` are of ``family``, ``h_u = J x_u + e_u``
    with ``Cov e_u = J``; with each unit's leaf map and table."""
    rng = np.random.default_rng(seed)
    parents = _tree(case["fanouts"], rng)
    sizes = [1] + [int(sum(f)) for f in case["fanouts"]]
    maps, leaves = _leaf_map(parents, sizes)
    truth = [a @ rng.poisson(4.0, (leaves, D)).astype(np.float64) for a in maps]
    full = _normal(_design([D], rng), [np.zeros((1, D))])[0]
    js = FAMILIES[family](full)
    js = [js[level % len(js)] for level in range(len(sizes))]
    hs = []
    for j, x in zip(js, truth):
        values, vectors = np.linalg.eigh(j)
        root = vectors * np.sqrt(np.maximum(values, 0.0))
        hs.append(x @ j + rng.standard_normal(x.shape) @ root.T)
    return parents, sizes, maps, leaves, js, hs


def _dense_information(js, hs, maps, leaves):
    """The GLS over the leaves' tables from the information form: ``F = sum_u A_u^T J A_u``,
    ``beta = F^+ sum_u A_u^T h_u``, ``Cov beta = F^+``; per level and unit ``(estimate,
    covariance, orthonormal basis of the estimable functions)``."""
    f, g = np.zeros((leaves * D, leaves * D)), np.zeros(leaves * D)
    for j, h, a in zip(js, hs, maps):
        for u in range(a.shape[0]):
            au = np.kron(a[u][None, :], np.eye(D))
            f += au.T @ j @ au
            g += au.T @ h[u]
    f_pinv = np.linalg.pinv(f, rcond=1e-11, hermitian=True)
    beta, off_range = f_pinv @ g, np.eye(f.shape[0]) - f @ f_pinv
    out = []
    for a in maps:
        level = []
        for u in range(a.shape[0]):
            au = np.kron(a[u][None, :], np.eye(D))
            _, sv, vt = np.linalg.svd(off_range @ au.T)
            level.append((au @ beta, au @ f_pinv @ au.T,
                          vt[np.r_[sv, np.zeros(D - sv.size)] <= 1e-8 * max(1.0, sv.max(initial=0.0))].T))
        out.append(level)
    return out


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("split", ["equal", "total"])
def test_shared_basis_equals_the_general_path_and_the_dense_gls(case, family, split):
    """Commuting levels: the passes as d scalar trees give the general path's estimates,
    covariances, outside and subtree information and query variances to 1e-9, and on every
    estimable function the dense GLS's estimate and variance."""
    parents, sizes, maps, leaves, js, hs = _commuting(case, family, 21)
    diagonal = estimate_hierarchy(js, hs, parents, split=split)
    general = estimate_hierarchy(js, hs, parents, split=split, basis=None)
    assert diagonal.basis is not None and general.basis is None
    dense = _dense_information(js, hs, maps, leaves)
    workload = np.random.default_rng(3).integers(0, 2, (5, D)).astype(np.float64)
    for level, units in enumerate(dense):
        scale = max(1.0, float(np.abs(general.x[level]).max()))
        np.testing.assert_allclose(diagonal.x[level], general.x[level], rtol=0, atol=1e-9 * scale)
        for name in ("covariance", "outside", "subtree_information", "information"):
            want = general.unit(name, level)
            np.testing.assert_allclose(diagonal.unit(name, level), want, rtol=0,
                                       atol=1e-9 * max(1.0, float(np.abs(want).max())), err_msg=name)
        (rows, classes), (general_rows, general_classes) = (diagonal.variances(level, workload),
                                                           general.variances(level, workload))
        np.testing.assert_allclose(rows[classes], general_rows[general_classes], rtol=1e-9, atol=1e-9 * scale)
        for u, (est, cov, basis) in enumerate(units):
            np.testing.assert_allclose(diagonal.x[level][u] @ basis, est @ basis, rtol=1e-9, atol=1e-8 * scale)
            np.testing.assert_allclose(basis.T @ diagonal.unit("covariance", level, u) @ basis, basis.T @ cov @ basis,
                                       rtol=1e-8, atol=1e-9 * max(1.0, float(np.abs(cov).max())))
    for level in range(1, len(sizes)):  # children sum to their parent to rounding, in the original basis
        sums = np.zeros_like(diagonal.x[level - 1])
        np.add.at(sums, parents[level], diagonal.x[level])
        has_child = np.bincount(parents[level], minlength=sizes[level - 1]) > 0
        assert np.abs(sums[has_child] - diagonal.x[level - 1][has_child]).max() <= 8 * np.finfo(float).eps * np.abs(
            diagonal.x[level - 1]).max()


def test_shared_basis_refines_degenerate_eigenspaces_and_refuses_non_commuting_levels():
    """The basis diagonalises matrices whose eigenspaces only together split (each has a
    degenerate one); levels that do not commute have none, and the general path runs."""
    js = [_kron_family((0, 0, 0, 1.0)), _kron_family((0, 1.0, 0, 0)), _kron_family((0, 0, 1.0, 0)),
          _kron_family((1.0, 0, 0, 0))]
    q = shared_basis(js)
    assert q is not None
    np.testing.assert_allclose(q.T @ q, np.eye(D), atol=1e-12)
    for j in js:
        b = q.T @ j @ q
        assert np.abs(b - np.diag(np.diagonal(b))).max() < 1e-12
    rng = np.random.default_rng(5)
    design = _design([D + 1, 4, D], rng)
    others = _normal(design, [np.zeros((1, w.shape[0])) for w, _ in design])[0]
    assert shared_basis(others) is None
    parents = _tree([[2], [1, 2]], rng)
    hs = [rng.standard_normal((n, D)) for n in (1, 2, 3)]
    assert estimate_hierarchy(others, hs, parents).basis is None
    assert estimate_hierarchy([others[2] * c for c in (1, 2, 3)], hs, parents).basis is not None


@pytest.mark.parametrize("case", CASES, ids=IDS)
@pytest.mark.parametrize("split", ["equal", "total"])
def test_subtrees_in_the_shared_basis_equal_the_whole_tree(case, split):
    """The cluster's split passes in the shared basis (summaries and tops of d-vectors) give the
    general whole-tree passes' estimates and covariances, every cut and forest size."""
    parents, sizes, maps, leaves, js, hs = _commuting(case, "marginals", 22)
    order, up = _by_parent(parents, sizes)
    hs = [h[o] for h, o in zip(hs, order)]
    whole = estimate_hierarchy(js, hs, up, split=split, basis=None)
    for cut in range(len(sizes) - 1):
        for max_rows in (1, 4, 1000):
            xs, covs = estimate_by_subtrees(js, hs, up, cut, max_rows, split=split)
            for level, (x, cov) in enumerate(zip(xs, covs)):
                scale = max(1.0, float(np.abs(whole.x[level]).max()))
                assert np.allclose(x, whole.x[level], rtol=0, atol=1e-9 * scale)
                assert np.allclose(cov, whole.unit("covariance", level), rtol=0, atol=1e-9 * scale)


def test_forests_in_and_out_of_the_shared_basis_meet_as_matrices():
    """Forests summarised in the shared basis and forests summarised as matrices merge as
    matrices, the top runs the general path, and a forest in the basis takes its roots' top back
    as diagonals: the whole tree's estimates and covariances all the same."""
    parents, sizes, maps, leaves, js, hs = _commuting(FIVE_LEVELS, "marginals", 24)
    order, up = _by_parent(parents, sizes)
    hs = [h[o] for h, o in zip(hs, order)]
    whole = estimate_hierarchy(js, hs, up, basis=None)
    q, cut = shared_basis(js), 2
    spans = descendant_spans([np.bincount(up[level + 1], minlength=sizes[level]) for level in range(cut, len(sizes) - 1)])
    groups = group_roots(spans, 4)
    forests = []
    for i, (first, stop) in enumerate(groups):
        rows = [slice(int(s[first]), int(s[stop])) for s in spans]
        ups = [None] + [local_parents(up[cut + k][rows[k]], rows[k - 1].start) for k in range(1, len(rows))]
        forests.append((rows, *forest_upward(js[cut:], [h[r] for h, r in zip(hs[cut:], rows)], ups,
                                             basis=q if i % 2 == 0 else None)))
    assert len(forests) > 1
    summary = merge_summaries([f[2] for f in forests])
    assert summary.basis is None
    top = top_estimate(js[:cut], hs[:cut], up[:cut + 1], summary, split="equal")
    assert top.basis is None
    for (rows, state, _), (first, stop) in zip(forests, groups):
        result = forest_downward(state, top.top(cut, slice(first, stop)), split="equal")
        assert (result.basis is not None) == (forests.index((rows, state, _)) % 2 == 0)
        for k in range(1, len(result.x)):
            scale = max(1.0, float(np.abs(whole.x[cut + k]).max()))
            np.testing.assert_allclose(result.x[k], whole.x[cut + k][rows[k]], rtol=0, atol=1e-9 * scale)
            np.testing.assert_allclose(result.unit("covariance", k), whole.unit("covariance", cut + k)[rows[k]],
                                       rtol=0, atol=1e-9 * scale)


@pytest.mark.parametrize("case", [FIVE_LEVELS, RAGGED_DEEP, RAGGED_PARTIAL], ids=["five-levels", "ragged-deep",
                                                                              "ragged-partial"])
@pytest.mark.parametrize("family", ["scaled", "marginals"])
def test_forests_from_h_in_the_basis_equal_the_general_path(case, family):
    """The cluster's forests given ``h~ = Q^T h`` (as BasisTerms forms it from the answers), the
    finest level's only summed by parent for the summary: the same summaries as from its rows,
    and the downward pass from the rows gives the general whole-tree passes' estimates and
    covariances, with ``x_basis`` = ``Q^T x`` (before the last child's rounding); from the
    leaves' ``J^+ h_c`` alone (with their sums) the same, ``x_c = J^+ h_c + Q (G r)_p``."""
    parents, sizes, maps, leaves, js, hs = _commuting(case, family, 31)
    order, up = _by_parent(parents, sizes)
    hs = [h[o] for h, o in zip(hs, order)]
    whole = estimate_hierarchy(js, hs, up, split="total", basis=None)
    q = shared_basis(js)
    own = [diagonal_in(j, q) for j in js]
    for cut in range(len(sizes) - 1):
        spans = descendant_spans([np.bincount(up[level + 1], minlength=sizes[level])
                                  for level in range(cut, len(sizes) - 1)])
        groups = group_roots(spans, 4)
        forests = []
        for first, stop in groups:
            rows = [slice(int(s[first]), int(s[stop])) for s in spans]
            depth = next((k for k, r in enumerate(rows) if r.stop == r.start), len(rows))
            sums = None
            rows = rows[:depth]
            ups = [None] + [local_parents(up[cut + k][rows[k]], rows[k - 1].start) for k in range(1, depth)]
            linear = [hs[cut + k][r] @ q for k, r in enumerate(rows)]
            state, summary = basis_forest_upward(own[cut:cut + depth], linear, ups, q)
            if depth > 1:
                sums = Grouping.of(ups[-1], rows[-2].stop - rows[-2].start).sum(linear[-1])
                _, summed = basis_forest_upward(own[cut:cut + depth], linear[:-1] + [None], ups, q, leaf_sums=sums)
                np.testing.assert_allclose(summed.mean, summary.mean, rtol=1e-12,
                                           atol=1e-12 * np.abs(summary.mean).max())
                np.testing.assert_array_equal(summed.information, summary.information)
                with pytest.raises(ValueError, match="leaf_sums"):
                    forest_downward(_only_sums(own[cut:cut + depth], linear, ups, q, sums), None, split="total")
            tables = None
            if depth > 1:  # the leaves given by J^+ h_c alone (a dense pseudo-inverse, the passes' rank rule)
                tables = hs[cut + depth - 1][rows[-1]] @ np.linalg.pinv(js[cut + depth - 1], rcond=1e-9, hermitian=True)
                tables = (tables, basis_forest_upward(own[cut:cut + depth], linear[:-1] + [None], ups, q,
                                                      leaf_sums=sums, leaf_tables=tables)[0])
            forests.append((rows, state, summary, tables))
        top = top_estimate(js[:cut], hs[:cut], up[:cut + 1], merge_summaries([f[2] for f in forests]), split="total")
        for (rows, state, _, tables), (first, stop) in zip(forests, groups):
            result = forest_downward(state, top.top(cut, slice(first, stop)), split="total", outside=False)
            by_tables = None if tables is None else forest_downward(tables[1], top.top(cut, slice(first, stop)),
                                                                      split="total", outside=False)
            for k in range(1, len(result.x)):
                scale = max(1.0, float(np.abs(whole.x[cut + k]).max()))
                np.testing.assert_allclose(result.x[k], whole.x[cut + k][rows[k]], rtol=0, atol=1e-9 * scale)
                np.testing.assert_allclose(result.unit("covariance", k),
                                           whole.unit("covariance", cut + k)[rows[k]], rtol=0, atol=1e-9 * scale)
                np.testing.assert_allclose(result.x_basis[k], result.x[k] @ q, rtol=0, atol=1e-12 * scale)
                if by_tables is not None:
                    np.testing.assert_allclose(by_tables.x[k], result.x[k], rtol=0, atol=1e-9 * scale)
                    np.testing.assert_allclose(by_tables.unit("covariance", k), result.unit("covariance", k),
                                               rtol=0, atol=1e-12 * scale)
            if by_tables is not None and family == "scaled":  # no blind split: x_c = J^+ h_c + Q (G r)_p
                k, leaf = len(by_tables.x) - 1, by_tables.x_basis[-1] @ q.T
                np.testing.assert_allclose(by_tables.x[k] - tables[0], leaf[by_tables.unit_class[k]], rtol=0,
                                           atol=1e-9 * max(1.0, float(np.abs(whole.x[cut + k]).max())))


def _only_sums(own, linear, ups, q, sums):
    """An upward state given the leaves' sums only (no downward pass from it)."""
    return basis_forest_upward(own, linear[:-1] + [None], ups, q, leaf_sums=sums)[0]


@pytest.mark.parametrize("case", [FIVE_LEVELS, RAGGED_DEEP], ids=["five-levels", "ragged-deep"])
def test_leaves_formed_by_their_reader_equal_the_downward_pass_bit_for_bit(case):
    """The leaves' tables formed by their reader a chunk of rows at a time (subtree_job's chunk
    tasks) from their ``J^+ h_c``, their parents' offsets ``Q (G r)_p`` and tables
    (``leaf_offsets``: the downward pass given the leaves' sums only) and, for a parent whose
    children straddle the chunk's first row, its children before it: equal bit for bit to the
    downward pass given every leaf's ``J^+ h_c`` (its last child's rounding included), for every
    chunk size; the levels above equal bit for bit too. Leaves blind in some direction with
    ``split="total"`` (their blind part moved by their siblings' totals) are refused."""
    parents, sizes, maps, leaves, js, hs = _commuting(case, "scaled", 29)
    order, up = _by_parent(parents, sizes)
    hs = [h[o] for h, o in zip(hs, order)]
    q = shared_basis(js)
    own = [diagonal_in(j, q) for j in js]
    cut = 1
    spans = descendant_spans([np.bincount(up[level + 1], minlength=sizes[level]) for level in range(cut, len(sizes) - 1)])
    linear = [h @ q for h in hs]
    summaries, states = [], []
    for first, stop in group_roots(spans, 6):
        rows = [slice(int(s[first]), int(s[stop])) for s in spans]
        ups = [None] + [local_parents(up[cut + k][rows[k]], rows[k - 1].start) for k in range(1, len(rows))]
        sums = Grouping.of(ups[-1], rows[-2].stop - rows[-2].start).sum(linear[-1][rows[-1]])
        tables = hs[-1][rows[-1]] @ np.linalg.pinv(js[-1], rcond=1e-9, hermitian=True)
        args = (own[cut:], [linear[cut + k][r] for k, r in enumerate(rows[:-1])] + [None], ups, q)
        by_tables, summary = basis_forest_upward(*args, leaf_sums=sums, leaf_tables=tables)
        summaries.append(summary)
        states.append(((first, stop), ups[-1], tables, by_tables, basis_forest_upward(*args, leaf_sums=sums)[0]))
    top = top_estimate(js[:cut], hs[:cut], up[:cut + 1], merge_summaries(summaries), split="total")
    for (first, stop), parent, tables, by_tables, by_sums in states:
        whole = forest_downward(by_tables, top.top(cut, slice(first, stop)), split="total", outside=False)
        ours = forest_downward(by_sums, top.top(cut, slice(first, stop)), split="total", outside=False,
                               leaf_offsets=True)
        assert ours.x[-1] is None
        for k in range(len(whole.x) - 1):
            np.testing.assert_array_equal(ours.x[k], whole.x[k])
        offsets, above = ours.x_basis[-1] @ q.T, ours.x[-2]
        starts = np.concatenate([[0], np.cumsum(np.bincount(parent, minlength=above.shape[0]))])
        for size in (1, 2, 3, parent.size):
            parts = []
            for a in range(0, parent.size, size):
                b = min(a + size, parent.size)
                rows_parent = np.searchsorted(starts, np.arange(a, b), side="right") - 1
                low, high = int(rows_parent[0]), int(rows_parent[-1]) + 1
                before = a - int(starts[low])  # the first parent's children in the chunks before
                x = leaf_tables(offsets[low:high], above[low:high], tables[a:b],
                                np.concatenate([np.zeros(before, dtype=np.int64), rows_parent - low]),
                                starts[low + 1:high + 1] <= b, before=tables[a - before:a] if before else None)
                parts.append(x[before:])
            np.testing.assert_array_equal(np.concatenate(parts), whole.x[-1])
    parents, sizes, maps, leaves, js, hs = _commuting(FIVE_LEVELS, "marginals", 29)  # leaves blind: (0, 1, 0, 0)
    order, up = _by_parent(parents, sizes)
    q = shared_basis(js)
    state, _ = basis_forest_upward([diagonal_in(j, q) for j in js], [h[o] @ q for h, o in zip(hs[:-1], order)] + [None],
                                   up, q, leaf_sums=Grouping.of(up[-1], sizes[-2]).sum(hs[-1][order[-1]] @ q))
    with pytest.raises(ValueError, match="split='total' with leaves blind"):
        forest_downward(state, None, split="total", leaf_offsets=True)
