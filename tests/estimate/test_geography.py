"""Top-down estimates of a nested geography (distfit.estimate.geography) against cvxpy."""
from __future__ import annotations

import cvxpy as cp
import numpy as np
import pytest

from distfit.estimate.geography import (FACTOR_RANK_SHARE, FactoredInformation, GeographyLevel, WeightedInformation,
                                        estimate_top_down, integer_top_down, nonnegative_top_down, project_siblings)
from distfit.estimate.rounding import laminar_family
from distfit.estimate.subtrees import descendant_spans
from distfit.estimate.hierarchy import estimate_hierarchy

CELLS = 6


def _tree(rng, sizes):
    """parent_of per level (None for the root), every parent with at least one child."""
    parents = [None]
    for above, size in zip(sizes[:-1], sizes[1:]):
        parent_of = np.concatenate([np.arange(above), rng.integers(0, above, size - above)])
        parents.append(rng.permutation(parent_of))
    return parents


def _levels(rng, sizes, *, rank=None, scale=1.0, truths=None):
    """Random levels: full-rank (or rank-deficient) informations, linear terms of noisy
    nonnegative truths that sum up the tree (appended to ``truths`` when given)."""
    parents = _tree(rng, sizes)
    truth = [None] * len(sizes)
    truth[-1] = rng.poisson(2.0, (sizes[-1], CELLS)).astype(float) * scale
    for i in range(len(sizes) - 1, 0, -1):
        up = np.zeros((sizes[i - 1], CELLS))
        np.add.at(up, parents[i], truth[i])
        truth[i - 1] = up
    if truths is not None:
        truths.extend(truth)
    levels = []
    for i, size in enumerate(sizes):
        a = rng.standard_normal((rank or CELLS + 2, CELLS))  # a whitened basis: H = A^T A, g = A^T y
        whitened = truth[i] @ a.T + rng.normal(0, 2.0, (size, a.shape[0]))
        levels.append(GeographyLevel(hessian=a.T @ a, linear=whitened @ a, parent_of=parents[i], whitened=whitened))
    return levels


def _reference_residual(levels, i, x):
    """Each unit's weighted squared residual: its own measurements and, per finer level, the sum
    of its descendants' (variance n: weight 1/n), by explicit descendant lists."""
    out = np.zeros(levels[i].units)
    for u in range(levels[i].units):
        members = np.array([u])
        value = 0.0
        for j in range(i, len(levels)):
            if j > i:
                members = np.flatnonzero(np.isin(levels[j].parent_of, members))
            if not members.size:
                continue
            # y^T y - 2 g^T x + x^T H x, with the summed whitened y and g of the members
            y = levels[j].whitened[members].sum(axis=0)
            g = levels[j].linear[members].sum(axis=0)
            value += (y @ y - 2 * g @ x[u] + x[u] @ levels[j].hessian @ x[u]) / members.size
        out[u] = value
    return out


def _reference_terms(levels):
    """H_u, g_u of every unit by explicit descendant lists (module docstring of geography)."""
    out = []
    for i, level in enumerate(levels):
        units = []
        for u in range(level.units):
            hessian, linear = level.hessian.copy(), level.linear[u].copy()
            members = np.array([u])
            for j in range(i + 1, len(levels)):
                members = np.flatnonzero(np.isin(levels[j].parent_of, members))
                if members.size:
                    hessian += levels[j].hessian / members.size
                    linear += levels[j].linear[members].sum(axis=0) / members.size
            units.append((hessian, linear))
        out.append(units)
    return out


def _cvxpy_level(terms, parent_of, above):
    x = cp.Variable((len(terms), CELLS))
    objective = sum(0.5 * cp.quad_form(x[u], cp.psd_wrap(h)) - g @ x[u] for u, (h, g) in enumerate(terms))
    constraints = [x >= 0]
    if parent_of is not None:
        grouping = np.zeros((above.shape[0], len(terms)))
        grouping[parent_of, np.arange(len(terms))] = 1
        constraints.append(grouping @ x == above)
    problem = cp.Problem(cp.Minimize(objective), constraints)
    problem.solve(solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    return x.value, problem.value


def _close(a, b, rel=1e-6):
    return np.max(np.abs(a - b)) <= rel * max(1.0, np.max(np.abs(b)))


# --------------------------------------------------------------------------------------------
# the projection


def test_project_siblings_matches_cvxpy():
    rng = np.random.default_rng(0)
    parent_of = np.array([2, 0, 0, 1, 2, 2, 0, 3, 2])
    v = rng.normal(0, 3, (9, 5))
    v[1, 0] = v[2, 0] = v[6, 0] = 1.5  # ties
    totals = np.abs(rng.normal(0, 4, (4, 5)))
    totals[1, :] = 0.0  # a parent with nothing to share
    got = project_siblings(v, parent_of, totals)
    x = cp.Variable(v.shape)
    grouping = np.zeros((4, 9))
    grouping[parent_of, np.arange(9)] = 1
    cp.Problem(cp.Minimize(cp.sum_squares(x - v)), [x >= 0, grouping @ x == totals]).solve(
        solver=cp.CLARABEL, tol_gap_abs=1e-12, tol_gap_rel=1e-12, tol_feas=1e-12)
    assert _close(got, x.value)
    assert np.all(got >= 0) and _close(grouping @ got, totals, 1e-12)


@pytest.mark.parametrize("skewed", [False, True], ids=["few-sizes", "many-sizes"])
def test_project_siblings_kkt_at_scale(skewed):
    """Optimality of the simplex projection, per parent and cell: the kept children all moved
    by the same tau, the zeroed ones were at most tau (Held-Wolfe-Crowder). Many distinct
    family sizes pad the segments to powers of two."""
    rng = np.random.default_rng(1)
    n, parents, cells = 3000, 400, 7
    extra = ((rng.pareto(1.0, n - parents) * 20).astype(np.int64) % parents if skewed
             else rng.integers(0, parents, n - parents))
    parent_of = rng.permutation(np.concatenate([np.arange(parents), extra]))
    assert (np.unique(np.bincount(parent_of)).size > 32) is skewed
    v = rng.normal(0, 5, (n, cells))
    totals = rng.exponential(10, (parents, cells))
    x = project_siblings(v, parent_of, totals)
    sums = np.zeros((parents, cells))
    np.add.at(sums, parent_of, x)
    np.testing.assert_allclose(sums, totals, rtol=1e-12, atol=1e-10)
    assert x.min() >= 0
    shift = v - x  # tau where x > 0
    kept = x > 0
    tau_max = np.full((parents, cells), -np.inf)
    tau_min = np.full((parents, cells), np.inf)
    np.maximum.at(tau_max, parent_of, np.where(kept, shift, -np.inf))
    np.minimum.at(tau_min, parent_of, np.where(kept, shift, np.inf))
    assert np.max(tau_max - tau_min) < 1e-9  # one tau per parent and cell
    assert np.all(np.where(kept, True, v <= tau_max[parent_of] + 1e-9))


# --------------------------------------------------------------------------------------------
# top-down


@pytest.mark.parametrize("sizes", [(1, 3, 8), (2, 5, 11)], ids=["one-root", "two-roots"])
def test_top_down_matches_cvxpy_level_by_level(sizes):
    rng = np.random.default_rng(sum(sizes))
    levels = _levels(rng, sizes)
    result = estimate_top_down(levels, tol=1e-12, max_iter=200000)
    terms = _reference_terms(levels)
    for i, level in enumerate(levels):
        above = result.x[i - 1] if i else None
        x_ref, value = _cvxpy_level(terms[i], level.parent_of, above)
        assert _close(result.x[i], x_ref), (i, np.max(np.abs(result.x[i] - x_ref)))
        assert abs(result.objective[i].sum() - value) <= 1e-6 * max(1.0, abs(value))
        np.testing.assert_allclose(result.residual[i], _reference_residual(levels, i, result.x[i]), rtol=1e-9)
        assert result.converged[i].all()
        assert result.x[i].min() >= 0
        if i:
            sums = np.zeros_like(above)
            np.add.at(sums, level.parent_of, result.x[i])
            np.testing.assert_allclose(sums, above, rtol=1e-10, atol=1e-9)
    # the root's units are solved with nonnegativity only: some raw answers were negative
    assert (levels[-1].linear @ np.linalg.inv(levels[-1].hessian)).min() < 0


def test_under_one_population_and_integer_counts():
    rng = np.random.default_rng(7)
    levels = _levels(rng, (1, 4, 13, 30), rank=3)  # singular informations: non-unique, still feasible
    levels = [levels[0], GeographyLevel(levels[1].hessian, levels[1].linear, None),  # under the one root unit
              *levels[2:]]
    result = estimate_top_down(levels, integer=True, tol=1e-10)
    counts = result.counts
    assert counts[0].sum() == round(result.x[0].sum())
    parents = [None, np.zeros(4, dtype=np.int64), levels[2].parent_of, levels[3].parent_of]
    for i in range(1, 4):
        sums = np.zeros_like(counts[i - 1])
        np.add.at(sums, parents[i], counts[i])
        np.testing.assert_array_equal(sums, counts[i - 1])  # exactly, cell by cell
    for i in range(4):
        assert counts[i].dtype == np.int64 and counts[i].min() >= 0
        assert np.all((counts[i] == np.floor(result.x[i] + 1e-9)) | (counts[i] == np.ceil(result.x[i] - 1e-9)))


def test_bad_geography_is_refused():
    rng = np.random.default_rng(3)
    levels = _levels(rng, (2, 4))
    root = levels[0]
    with pytest.raises(ValueError, match="level 0: the coarsest level has no parents"):
        estimate_top_down([GeographyLevel(root.hessian, root.linear, np.array([0, 0])), levels[1]])
    with pytest.raises(ValueError, match=r"level 1: parent_of outside 0..1"):
        estimate_top_down([root, GeographyLevel(levels[1].hessian, levels[1].linear, np.array([0, 1, 2, 0]))])
    with pytest.raises(ValueError, match="level 1: no parent_of, and level 0 has 2 units"):
        estimate_top_down([root, GeographyLevel(levels[1].hessian, levels[1].linear, None)])


def _blue(levels):
    """The hierarchy's best linear unbiased estimates of the levels (what --integer starts from)."""
    parents = [level.parent_of for level in levels]
    return estimate_hierarchy([lv.hessian for lv in levels], [lv.linear for lv in levels], parents, split="total").x


def _check_counts(counts, parents):
    """Nonnegative int64, every unit's children summing exactly to it, cell by cell."""
    assert all(c.dtype == np.int64 and c.min() >= 0 for c in counts)
    for level in range(1, len(counts)):
        sums = np.zeros_like(counts[level - 1])
        np.add.at(sums, parents[level], counts[level])
        np.testing.assert_array_equal(sums, counts[level - 1])  # exactly


@pytest.mark.parametrize("rank", [None, 3, 1], ids=["full-rank", "singular", "factored"])
def test_integer_top_down_is_the_metric_projection_of_the_estimates_rounded(rank):
    """From the BLUE (below 0 in places): each level's integers within 1 of cvxpy's minimiser of
    ``sum_u (x_u - c_u)^T H_u (x_u - c_u)`` (H_u by explicit descendant lists) over ``x >= 0``
    summing to the parents' integer counts; exact sums."""
    rng = np.random.default_rng(11)
    levels = _levels(rng, (1, 4, 13), rank=rank)
    blue = _blue(levels)
    assert min(x.min() for x in blue) < 0
    counts = integer_top_down(levels, blue, tol=1e-12, max_iter=200000)
    _check_counts(counts, [level.parent_of for level in levels])
    terms = _reference_terms(levels)
    for i, level in enumerate(levels):
        centred = [(h, h @ c) for (h, _g), c in zip(terms[i], blue[i])]
        x_ref, _value = _cvxpy_level(centred, level.parent_of, counts[i - 1].astype(float) if i else None)
        # where H_u is singular the minimiser is not unique: compare what the metric sees
        gap = counts[i] - x_ref
        seen = np.array([np.sqrt(d @ h @ d) / np.sqrt(np.linalg.eigvalsh(h)[-1]) for d, (h, _g) in zip(gap, terms[i])])
        assert seen.max() <= np.sqrt(CELLS) + 1e-6, (i, seen.max())
        if rank is None:
            assert np.abs(gap).max() < 1.0 + 1e-6, (i, np.abs(gap).max())


def test_integer_tables_are_about_as_accurate_as_the_estimates():
    """Seeded sparse counts (Poisson 2 per cell, noise sd 2): the integer tables' RMSE against
    the truth at most 1.25x the BLUE's at every level (here 0.91, 1.10, 0.66; over seeds 0-7 the
    8 states 0.94-1.10x, the 80 leaves 0.2-0.94x, the one root of 6 cells 0.91-1.32x)."""
    rng = np.random.default_rng(5)
    truth = []
    levels = _levels(rng, (1, 8, 80), truths=truth)
    blue = _blue(levels)
    counts = integer_top_down(levels, blue)
    _check_counts(counts, [level.parent_of for level in levels])
    for i in range(3):
        error_blue = np.sqrt(np.mean((blue[i] - truth[i]) ** 2))
        error_int = np.sqrt(np.mean((counts[i] - truth[i]) ** 2))
        assert error_int <= 1.25 * error_blue, (i, error_int, error_blue)


def test_integer_unit_totals_and_family_sums_stay_within_one_of_the_step():
    """Controlled rounding (the default): every unit's total and its sums over a laminar
    family within 1 of the real-valued tables of the top-down step it rounds, parents' cells
    exact; the cell-by-cell rounding of before (``rounding="cells"``) keeps the sums exact
    but not the totals."""
    rng = np.random.default_rng(8)
    levels = _levels(rng, (1, 8, 80))
    blue = _blue(levels)
    family = np.array([[1, 1, 1, 1, 0, 0], [1, 1, 0, 0, 0, 0]], dtype=bool)
    sets = np.vstack([np.ones((1, CELLS)), family]).T
    result = estimate_top_down(levels, integer=True, tol=1e-6, centre=blue, families=[family] * 3)
    _check_counts(result.counts, [level.parent_of for level in levels])
    for x, counts in zip(result.x, result.counts):
        assert np.abs(counts @ sets - x @ sets).max() < 1.0
    assert all(np.array_equal(a, b) for a, b in zip(integer_top_down(levels, blue, families=[family] * 3),
                                                     result.counts))
    cells = estimate_top_down(levels, integer=True, tol=1e-6, centre=blue, rounding="cells")
    _check_counts(cells.counts, [level.parent_of for level in levels])
    assert max(np.abs(c.sum(axis=1) - x.sum(axis=1)).max() for x, c in zip(cells.x, cells.counts)) >= 1.0
    with pytest.raises(ValueError, match="rounding: one of controlled, cells"):
        estimate_top_down(levels, integer=True, rounding="nearest")


def _ordered_levels(rng, sizes, cells, rank=None):
    """Random levels whose units are ordered by their parent's row (as a release's), some
    parents with one child, dense informations of ``cells`` (odd and even batches below), of
    ``rank`` where given (low enough to be applied through a factor: FactoredInformation)."""
    parents = [None]
    for above, size in zip(sizes[:-1], sizes[1:]):
        parents.append(np.sort(np.concatenate([np.arange(above), rng.integers(0, above, size - above)])))
    levels = []
    for i, size in enumerate(sizes):
        a = rng.standard_normal((rank or cells + 3, cells)) * rng.uniform(0.3, 3.0)
        levels.append(GeographyLevel(hessian=a.T @ a, linear=np.zeros((size, cells)), parent_of=parents[i]))
    return levels


def _forests(levels, cut, spans):
    """Forests of consecutive cut units (one alone, odd and even sizes): per forest ``(first,
    stop, rows, levels)``, its rows per level from the cut and its levels with parents renumbered."""
    roots = levels[cut].units
    bounds = [0, 1, 2, 5, roots] if roots > 5 else [0, 1, roots]
    for first, stop in zip(bounds[:-1], bounds[1:]):
        rows = [slice(int(s[first]), int(s[stop])) for s in spans]
        yield first, stop, rows, [GeographyLevel(lv.hessian, lv.linear[r],
                                                 None if k == 0 else lv.parent_of[r] - rows[k - 1].start)
                                  for k, (lv, r) in enumerate(zip(levels[cut:], rows))]


@pytest.mark.parametrize("rank", [None, 2], ids=["dense", "factored"])
@pytest.mark.parametrize("cut", [0, 1])
def test_integer_tables_of_forests_of_subtrees_are_the_whole_trees_bit_for_bit(cut, rank):
    """The cluster's split (distfit.estimate.subtree_job): levels 0 .. cut solved alone (the
    levels below given by their informations and each cut unit's descendants: ``below``), then
    each forest of consecutive cut units (odd and even sizes, one subtree alone) from its roots'
    integer counts (``roots``): every level's integers equal the whole tree's, bit for bit, and
    so do the real-valued tables they round (each row's products independent of the batch)."""
    rng = np.random.default_rng(3 + cut)
    cells = 9
    levels = _ordered_levels(rng, (2, 7, 23, 61), cells, rank)
    assert isinstance(WeightedInformation([levels[0].hessian], np.ones((1, 1))).hessians[0],
                      FactoredInformation if rank else np.ndarray)
    centre = [rng.normal(0.5, 3.0, (lv.units, cells)) * rng.uniform(1, 40, (lv.units, 1)) for lv in levels]
    family = [laminar_family(np.vstack([np.eye(cells)[:3].sum(axis=0), np.eye(cells)[:5].sum(axis=0)]))] * 4
    solved = estimate_top_down(levels, integer=True, tol=1e-6, centre=centre, families=family)
    whole = solved.counts
    assert all(
        np.array_equal(a, b) for a, b in zip(whole, integer_top_down(levels, centre, families=family)))
    _check_counts(whole, [level.parent_of for level in levels])
    counts = [np.bincount(levels[k + 1].parent_of, minlength=levels[k].units) for k in range(cut, len(levels) - 1)]
    spans = descendant_spans(counts)
    below = [(levels[cut + k].hessian, np.diff(spans[k])) for k in range(1, len(spans))]
    top = integer_top_down(levels[:cut + 1], centre[:cut + 1], families=family[:cut + 1], below=below)
    parts: list[list[np.ndarray]] = [[] for _ in spans[1:]]
    tables: list[list[np.ndarray]] = [[] for _ in spans[1:]]
    for first, stop, rows, forest in _forests(levels, cut, spans):
        got = estimate_top_down(forest, integer=True, tol=1e-6, centre=[c[r] for c, r in zip(centre[cut:], rows)],
                                families=family[cut:], roots=top[cut][first:stop])
        np.testing.assert_array_equal(got.counts[0], top[cut][first:stop])
        for k in range(1, len(rows)):
            parts[k - 1].append(got.counts[k])
            tables[k - 1].append(got.x[k])
    for level in range(cut + 1):
        np.testing.assert_array_equal(top[level], whole[level])
    for k, pieces in enumerate(parts, start=cut + 1):
        np.testing.assert_array_equal(np.concatenate(pieces), whole[k])
        np.testing.assert_array_equal(np.concatenate(tables[k - cut - 1]), solved.x[k])
    with pytest.raises(ValueError, match=r"^roots: expected nonnegative integer counts of shape"):
        integer_top_down(levels[:1], centre[:1], roots=-np.ones((levels[0].units, cells)))


def test_stopped_parents_leave_the_iteration_with_every_table_unchanged_bit_for_bit():
    """A level's per-parent solve (minimise_quadratic's ``groups``) goes on over the live
    parents' children alone once the stopped ones are half (``rows`` of the projection and of
    the operator): it did so here, more than once, and every child's table, the iteration count
    and the converged flags equal those of the same solve that keeps every row, bit for bit."""
    from distfit.estimate.geography import SiblingProjection, WeightedInformation
    from distfit.estimate.projection import minimise_quadratic

    class Counted(SiblingProjection):
        restricted: list[int] = []

        def rows(self, index):
            Counted.restricted.append(len(index))
            return Counted(self.parent_of[index], self.totals)

    rng = np.random.default_rng(7)
    cells, parents = 9, 40
    parent_of = np.sort(np.concatenate([np.arange(parents), rng.integers(0, parents, 160)]))
    a = rng.standard_normal((cells + 3, cells))
    scale = rng.uniform(0.05, 20.0, (parent_of.size, 1))  # conditioning per parent: steps differ widely
    hessian = WeightedInformation([a.T @ a], scale[:, 0][:, None])
    centre = rng.normal(0.5, 3.0, (parent_of.size, cells)) * rng.uniform(1, 40, (parent_of.size, 1))
    totals = np.maximum(np.round(np.add.reduceat(centre, np.flatnonzero(np.r_[True, np.diff(parent_of) > 0]))), 0)
    linear = hessian(centre)
    lipschitz = hessian.group_lipschitz(parent_of)
    project = Counted(parent_of, totals)
    compacted = minimise_quadratic(hessian, linear, project, project(centre), tol=1e-9, lipschitz=lipschitz,
                                   groups=parent_of)
    kept = minimise_quadratic(hessian, linear, lambda v: project(v), project(centre), tol=1e-9,
                              lipschitz=lipschitz, groups=parent_of)  # a plain function: no rows, no compaction
    assert len(Counted.restricted) >= 2 and Counted.restricted[-1] < parent_of.size // 4, Counted.restricted
    assert compacted.converged.all() and compacted.iterations == kept.iterations
    np.testing.assert_array_equal(compacted.x, kept.x)
    np.testing.assert_array_equal(compacted.converged, kept.converged)


def test_integer_top_down_reports_the_units_solved():
    """integer_top_down's ``progress(done, units)``: over every level's units, never falling,
    each level's ending at its last unit, the last call ``(units, units)``; the tables are those
    made without it."""
    rng = np.random.default_rng(5)
    levels = _ordered_levels(rng, (2, 7, 23, 61), 9)
    centre = [rng.normal(0.5, 3.0, (lv.units, 9)) * rng.uniform(1, 40, (lv.units, 1)) for lv in levels]
    calls = []
    counts = integer_top_down(levels, centre, progress=lambda done, total: calls.append((done, total)))
    units = sum(lv.units for lv in levels)
    assert {total for _, total in calls} == {units} and calls[-1] == (units, units)
    done = [d for d, _ in calls]
    assert done == sorted(done) and {2, 9, 32, 93} <= set(done)
    assert len(calls) > 4  # within a level too, as its parents stop
    for mine, plain in zip(counts, integer_top_down(levels, centre)):
        np.testing.assert_array_equal(mine, plain)


def test_a_low_rank_information_is_applied_through_its_factor():
    """``FactoredInformation.of``: a dense information of rank at most FACTOR_RANK_SHARE of its
    cells becomes ``(V F) F^T``, equal to ``V H`` to rounding, each row's product the same bits
    alone as in any batch (odd or even, within one BLAS call's
    rows or across several), as a dense information's; one of higher rank stays the dense matrix."""
    rng = np.random.default_rng(5)
    cells = 40
    rank = int(FACTOR_RANK_SHARE * cells)
    a = rng.standard_normal((rank, cells))
    hessian = a.T @ a
    factored = FactoredInformation.of(hessian)
    assert isinstance(factored, FactoredInformation) and factored.factor.shape == (cells, rank)
    assert np.isclose(factored.lipschitz, np.linalg.eigvalsh(hessian)[-1], rtol=1e-12)
    v = rng.normal(0.0, 10.0, (150, cells))  # more rows than one BLAS call takes (PRODUCT_ROWS)
    np.testing.assert_allclose(factored(v), v @ hessian, rtol=0, atol=1e-11 * np.abs(v @ hessian).max())
    full = rng.standard_normal((cells, cells))
    dense = WeightedInformation([full.T @ full], np.ones((v.shape[0], 1)))  # full rank: applied as the matrix
    for apply in (factored, dense):
        alone = np.vstack([apply(row[None, :]) for row in v])
        for batch in (slice(None), slice(0, 64), slice(1, 130), slice(2, 5), slice(3, 4), slice(5, 70)):
            assert apply(v[batch]).tobytes() == alone[batch].tobytes()
    b = rng.standard_normal((rank + 1, cells))
    assert isinstance(FactoredInformation.of(b.T @ b), np.ndarray)


# --------------------------------------------------------------------------------------------
# nonnegative tables from the BLUE (--nonnegative)


def test_an_ill_conditioned_root_is_solved_to_its_minimum():
    """The root level's tables reach the KKT point of ``0.5 x^T H_u x - g_u^T x`` over ``x >= 0``
    (geography._exact_roots), where H_u's eigenvalues spread over 8 decades (the gradient's
    stopping rule alone left ~1e-4 of the objective): the objective equals cvxpy's to 1e-9,
    started from the measurements or from the BLUE."""
    rng = np.random.default_rng(25)
    levels = _levels(rng, (1, 4, 13))
    skew = np.diag(10.0 ** np.linspace(-4, 4, CELLS))
    levels[0] = GeographyLevel(skew @ levels[0].hessian @ skew, levels[0].linear @ skew, None)
    (hessian, linear), = _reference_terms(levels)[0]
    x_ref, value = _cvxpy_level([(hessian, linear)], None, None)
    assert (linear @ np.linalg.inv(hessian)).min() < 0  # nonnegativity binds
    # centred (nonnegative_top_down): 0.5 (x - c)^T H_u (x - c), the same minimiser for c = H_u^-1 g_u
    centre = [np.linalg.solve(hessian, linear)[None, :]] + list(_blue(levels)[1:])
    # max_iter: the gradient stops far from the minimum (here it never meets its rule); the root is exact anyway
    for x in (estimate_top_down(levels, max_iter=300).x[0], nonnegative_top_down(levels, centre, max_iter=300)[0]):
        got = 0.5 * x[0] @ hessian @ x[0] - linear @ x[0]
        assert abs(got - value) <= 1e-9 * abs(value), (got, value)
        assert x.min() >= 0 and _close(x, x_ref, rel=1e-5)


@pytest.mark.parametrize("rank", [None, 3], ids=["full-rank", "singular"])
def test_nonnegative_tables_from_the_blue_are_the_top_down_below_the_root(rank):
    """nonnegative_top_down from the BLUE: nonnegative, children summing to their parent; the
    root is cvxpy's nearest nonnegative table to the BLUE in the metric H_u; below the root,
    from the same root, every level equals the top-down estimate from the measurements (module
    docstring of geography: the BLUE's children differ from the own-subtree estimates by
    ``H_c^-1 mu_p``, a constant on the feasible set), to the solvers' tolerance, where ``H_u``
    is nonsingular, and where it is singular in what the metric sees."""
    rng = np.random.default_rng(13)
    levels = _levels(rng, (1, 4, 13), rank=rank)
    blue = _blue(levels)
    assert min(x.min() for x in blue) < 0
    tables = nonnegative_top_down(levels, blue, tol=1e-12, max_iter=200000)
    terms = _reference_terms(levels)
    (h0, _g0), = terms[0]
    x_ref, _value = _cvxpy_level([(h0, h0 @ blue[0][0])], None, None)
    d = tables[0][0] - x_ref[0]
    assert np.sqrt(d @ h0 @ d) <= 1e-5 * max(1.0, np.sqrt(x_ref[0] @ h0 @ x_ref[0]))
    top = estimate_top_down(levels, tol=1e-12, max_iter=200000, centre=None)
    same_root = nonnegative_top_down(levels, blue, tol=1e-12, max_iter=200000, roots=top.x[0])
    for i, level in enumerate(levels):
        assert tables[i].min() >= 0 and tables[i].dtype == np.float64
        if i:
            sums = np.zeros_like(tables[i - 1])
            np.add.at(sums, level.parent_of, tables[i])
            np.testing.assert_allclose(sums, tables[i - 1], rtol=1e-10, atol=1e-9)
            gap = same_root[i] - top.x[i]
            seen = np.array([np.sqrt(max(e @ h @ e, 0.0)) for e, (h, _g) in zip(gap, terms[i])])
            scale = max(1.0, max(np.sqrt(x @ h @ x) for x, (h, _g) in zip(top.x[i], terms[i])))
            assert seen.max() <= 1e-5 * scale, (i, seen.max() / scale)
    np.testing.assert_array_equal(same_root[0], top.x[0])


@pytest.mark.parametrize("cut", [0, 1])
def test_nonnegative_tables_of_forests_of_subtrees_are_the_whole_trees_bit_for_bit(cut):
    """As the integer tables (above): levels 0 .. cut solved alone with the levels below given
    by their informations, each forest from its roots' real-valued tables: every level's tables
    equal the whole tree's bit for bit. Negative or non-finite roots are refused in one line."""
    rng = np.random.default_rng(30 + cut)
    cells = 9
    levels = _ordered_levels(rng, (2, 7, 23, 61), cells)
    centre = [rng.normal(0.5, 3.0, (lv.units, cells)) * rng.uniform(1, 40, (lv.units, 1)) for lv in levels]
    whole = nonnegative_top_down(levels, centre, tol=1e-8)
    counts = [np.bincount(levels[k + 1].parent_of, minlength=levels[k].units) for k in range(cut, len(levels) - 1)]
    spans = descendant_spans(counts)
    below = [(levels[cut + k].hessian, np.diff(spans[k])) for k in range(1, len(spans))]
    top = nonnegative_top_down(levels[:cut + 1], centre[:cut + 1], tol=1e-8, below=below)
    for level in range(cut + 1):
        np.testing.assert_array_equal(top[level], whole[level])
    parts: list[list[np.ndarray]] = [[] for _ in spans[1:]]
    for first, stop, rows, forest in _forests(levels, cut, spans):
        got = nonnegative_top_down(forest, [c[r] for c, r in zip(centre[cut:], rows)], tol=1e-8,
                                   roots=top[cut][first:stop])
        np.testing.assert_array_equal(got[0], top[cut][first:stop])
        for k in range(1, len(rows)):
            parts[k - 1].append(got[k])
    for k, pieces in enumerate(parts, start=cut + 1):
        np.testing.assert_array_equal(np.concatenate(pieces), whole[k])
    for bad in (-np.ones((levels[0].units, cells)), np.full((levels[0].units, cells), np.nan)):
        with pytest.raises(ValueError, match=r"^roots: expected nonnegative tables of shape"):
            nonnegative_top_down(levels[:1], centre[:1], roots=bad)
