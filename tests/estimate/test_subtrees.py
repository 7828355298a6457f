"""The hierarchy's passes split into subtrees equal the whole-tree passes (and so the dense GLS)."""
from __future__ import annotations

import numpy as np
import pytest

from distfit.estimate.hierarchy import estimate_hierarchy
from distfit.estimate.subtrees import choose_cut, descendant_spans, estimate_by_subtrees, group_roots
from tests.estimate.test_hierarchy import CASES, IDS, _dense, _normal, _problem


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
