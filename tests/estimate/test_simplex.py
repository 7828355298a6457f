"""The compiled projection onto children summing to their parent (distfit.estimate.simplex):
the same numbers, bit for bit, as the vectorised sort-and-threshold formula it replaced (kept
here as the reference), and optimal by its KKT conditions (tests/estimate/test_geography.py
checks it against a convex solver)."""
import numpy as np
import pytest

from distfit.estimate.geography import SiblingProjection
from distfit.estimate.simplex import INSERTION_SORT, KEEP_ORDER, SegmentProjection


def sorted_threshold(v: np.ndarray, parent_of: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """Held-Wolfe-Crowder by numpy, every parent and cell at once (the implementation before the
    kernel): each family padded to the widest, sorted decreasing along the family axis,
    cumulative sums, ``rho`` the last rank whose test holds, ``tau = (c_rho - s) / rho``."""
    totals = np.maximum(totals, 0.0)
    parents = totals.shape[0]
    width = int(np.bincount(parent_of, minlength=parents).max())
    order = np.argsort(parent_of, kind="stable")
    grouped = parent_of[order]
    first = np.searchsorted(grouped, np.arange(parents))
    slot = np.arange(parent_of.size) - first[grouped]
    padded = np.full((parents, width, v.shape[1]), -np.inf)
    padded[grouped, slot] = v[order]
    valid = np.zeros((parents, width, 1), dtype=bool)
    valid[grouped, slot] = True
    s = -np.sort(-padded, axis=1)
    cum = np.cumsum(np.where(np.isfinite(s), s, 0.0), axis=1)
    rank = np.arange(1, width + 1, dtype=np.float64)[None, :, None]
    positive = (s - (cum - totals[:, None, :]) / rank > 0) & valid
    rho = np.maximum(np.max(np.where(positive, rank, 0.0), axis=1), 1.0)
    at_rho = np.take_along_axis(cum, (rho - 1).astype(np.int64)[:, None, :], axis=1)[:, 0, :]
    tau = (at_rho - totals) / rho
    return np.maximum(v - tau[parent_of], 0.0)


def families(rng, parents: int, sizes: np.ndarray) -> np.ndarray:
    return rng.permutation(np.repeat(np.arange(parents), sizes))


@pytest.mark.parametrize("case", ["small families", "mixed sizes", "one large family"])
def test_the_kernel_equals_the_numpy_formula_bit_for_bit(case):
    rng = np.random.default_rng(11)
    if case == "small families":
        sizes = rng.integers(1, 12, 300)
    elif case == "mixed sizes":
        sizes = np.concatenate([rng.integers(1, 6, 200), rng.integers(INSERTION_SORT + 1, 90, 6), [KEEP_ORDER + 1]])
    else:
        sizes = np.array([2000])
    parent_of = families(rng, sizes.size, sizes)
    cells = 13
    v = rng.normal(0.2, 2.0, (parent_of.size, cells)) * rng.uniform(0.1, 30.0, (parent_of.size, 1))
    v[rng.random(v.shape) < 0.2] = 0.0                     # ties at 0, as counts near 0 have
    v[:, 3] = np.round(v[:, 3])                            # integer ties
    totals = np.round(rng.exponential(20.0, (sizes.size, cells)))
    totals[:, 5] = 0.0                                     # nothing to share
    totals[0, :] = -3.0                                    # clipped at 0
    project = SiblingProjection(parent_of, totals)
    assert project(v).tobytes() == sorted_threshold(v, parent_of, totals).tobytes()
    # again, as a solver's iterates come: near the last values (a wide family's kept order nearly
    # right), then far from them; each the same as from scratch
    for w in (v + rng.normal(0.0, 0.01, v.shape), rng.normal(0.0, 5.0, v.shape)):
        assert project(w).tobytes() == sorted_threshold(w, parent_of, totals).tobytes()


def test_every_row_in_its_segment_and_the_sums_exact_to_rounding():
    """``SegmentProjection`` on its own: rows given in any order by ``order``/``starts``."""
    rng = np.random.default_rng(3)
    sizes = rng.integers(1, INSERTION_SORT * 2, 40)
    parent_of = families(rng, sizes.size, sizes)
    order = np.argsort(parent_of, kind="stable")
    starts = np.r_[0, np.cumsum(sizes)]
    v = rng.normal(0.0, 5.0, (parent_of.size, 7))
    totals = rng.exponential(10.0, (sizes.size, 7))
    x = SegmentProjection(order, starts, totals)(v)
    sums = np.zeros_like(totals)
    np.add.at(sums, parent_of, x)
    np.testing.assert_allclose(sums, totals, rtol=1e-12, atol=1e-10)
    assert x.min() >= 0.0
    # the kept children moved by one tau per parent and cell; the zeroed ones were at most tau
    shift = np.where(x > 0, v - x, np.nan)
    for p in range(sizes.size):
        rows = parent_of == p
        for j in range(7):
            kept = shift[rows, j][~np.isnan(shift[rows, j])]
            if kept.size:
                assert np.ptp(kept) <= 1e-9 * max(1.0, np.abs(v[rows, j]).max())
                assert np.all(v[rows, j][x[rows, j] == 0] <= kept[0] + 1e-9)
