"""Tests for distfit.mathematics.workload."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from distfit.mathematics.domain import Domain
from distfit.mathematics.workload import (    Workload,
    age_pyramid_workload,
    all_range_queries,
    all_two_way_marginals,
    custom_queries,
    identity_queries,
    kron_queries,
    marginal_queries,
    pl94_workload,
    prefix_queries,
    prefix_workload,
    random_range_queries,
    random_range_workload,
    random_workload,
    range_queries,
    total_queries,
    workload_from_groups,
)


# ------------------------------------------------------------------ per-attribute matrices

def test_identity_total_prefix():
    np.testing.assert_array_equal(identity_queries(3), np.eye(3))
    np.testing.assert_array_equal(total_queries(4), np.ones((1, 4)))
    np.testing.assert_array_equal(prefix_queries(3), [[1, 0, 0], [1, 1, 0], [1, 1, 1]])
    for f in (identity_queries, total_queries, prefix_queries, all_range_queries):
        assert f(2).dtype == float


def test_all_range_queries_order_and_content():
    n = 4
    q = all_range_queries(n)
    assert q.shape == (n * (n + 1) // 2, n)
    expected = []
    for a in range(n):
        for b in range(a, n):
            row = np.zeros(n)
            row[a:b + 1] = 1
            expected.append(row)
    np.testing.assert_array_equal(q, np.array(expected))


def test_range_queries():
    q = range_queries(5, [(0, 0), (1, 3), (0, 4), (4, 4)])
    np.testing.assert_array_equal(
        q, [[1, 0, 0, 0, 0], [0, 1, 1, 1, 0], [1, 1, 1, 1, 1], [0, 0, 0, 0, 1]])


def test_random_range_queries_reproducible_and_contiguous():
    q1 = random_range_queries(20, 50, seed=3)
    q2 = random_range_queries(20, 50, seed=3)
    np.testing.assert_array_equal(q1, q2)
    assert q1.shape == (50, 20)
    assert not np.array_equal(q1, random_range_queries(20, 50, seed=4))
    for row in q1:
        nz = np.flatnonzero(row)
        assert nz.size >= 1
        assert np.all(np.diff(nz) == 1)  # one contiguous interval
        assert set(np.unique(row)) <= {0.0, 1.0}


def test_custom_queries():
    m = custom_queries([[1, 2], [3, 4]])
    assert m.dtype == float and m.shape == (2, 2)


@pytest.mark.parametrize("bad, match", [
    ([1, 2, 3], "2-D"),
    (np.zeros((0, 3)), "nonempty"),
    ([[1.0, np.nan]], "finite"),
    ([[1.0, np.inf]], "finite"),
    ([["a", "b"]], "numeric"),
])
def test_custom_queries_bad(bad, match):
    with pytest.raises(ValueError, match=match):
        custom_queries(bad)


@pytest.mark.parametrize("f", [identity_queries, total_queries, prefix_queries, all_range_queries])
@pytest.mark.parametrize("n", [0, -1, 2.0, True, "3"])
def test_bad_n(f, n):
    with pytest.raises(ValueError, match=r"^n must"):
        f(n)


@pytest.mark.parametrize("ranges, match", [
    ([], "nonempty"),
    ([(2, 1)], r"ranges\[0\]"),
    ([(0, 1), (0, 5)], r"ranges\[1\]"),
    ([(-1, 2)], "ranges"),
    ([(0, 1, 2)], "ranges"),
    ([(0.5, 1)], "ranges"),
])
def test_range_queries_bad(ranges, match):
    with pytest.raises(ValueError, match=match):
        range_queries(5, ranges)


def test_random_range_queries_bad():
    with pytest.raises(ValueError, match="count"):
        random_range_queries(5, 0, seed=0)
    with pytest.raises(ValueError, match="count"):
        random_range_queries(5, -2, seed=0)
    with pytest.raises(ValueError, match=r"^n must"):
        random_range_queries(0, 3, seed=0)


# ------------------------------------------------------------------ Domain

def test_domain_basics():
    dom = Domain(("a", "b", "c"), (2, 3, 4))
    assert dom.size == 24
    assert dom.shape == (2, 3, 4)
    assert dom.index("b") == 1
    assert len(dom) == 3
    dom2 = Domain(["a", "b", "c"], [2, 3, 4])
    assert dom2 == dom and hash(dom2) == hash(dom)
    with pytest.raises(ValueError, match="unknown attribute 'z'"):
        dom.index("z")


@pytest.mark.parametrize("names, sizes, match", [
    (("a", "a"), (2, 3), "names"),
    (("a", "b"), (2,), "sizes"),
    (("a", "b"), (2, 0), "sizes"),
    (("a", "b"), (2, 1.5), "sizes"),
    ((), (), "names"),
    (("a", 3), (2, 2), "names"),
    ("ab", (2, 2), "names"),
])
def test_domain_bad(names, sizes, match):
    with pytest.raises(ValueError, match=match):
        Domain(names, sizes)


def test_domain_frozen():
    dom = Domain(("a",), (2,))
    with pytest.raises(Exception):
        dom.sizes = (3,)  # type: ignore[misc]


# ------------------------------------------------------------------ kron_queries

def _loop_kron(domain: Domain, per_attribute):
    """Reference: explicit loop over query tuples and cells (row-major, first attribute slowest)."""
    mats = [np.asarray(per_attribute.get(nm, np.ones((1, n))), float)
            for nm, n in zip(domain.names, domain.sizes)]
    rows = []
    for qtuple in itertools.product(*[range(m.shape[0]) for m in mats]):
        row = np.zeros(domain.size)
        for cell in itertools.product(*[range(n) for n in domain.sizes]):
            idx = np.ravel_multi_index(cell, domain.shape)
            row[idx] = np.prod([m[q, v] for m, q, v in zip(mats, qtuple, cell)])
        rows.append(row)
    return np.array(rows)


def test_kron_queries_matches_loop():
    dom = Domain(("a", "b", "c"), (2, 3, 4))
    rng = np.random.default_rng(0)
    cases = [
        {},
        {"a": identity_queries(2)},
        {"b": prefix_queries(3), "c": all_range_queries(4)},
        {"a": rng.normal(size=(2, 2)), "b": rng.normal(size=(4, 3)), "c": rng.normal(size=(3, 4))},
        {"c": range_queries(4, [(1, 2)]), "a": total_queries(2)},
    ]
    for per in cases:
        got = kron_queries(dom, per)
        np.testing.assert_allclose(got, _loop_kron(dom, per), atol=1e-14)


def test_row_major_cell_order():
    dom = Domain(("a", "b", "c"), (2, 3, 4))
    full = kron_queries(dom, {nm: identity_queries(n) for nm, n in zip(dom.names, dom.sizes)})
    np.testing.assert_array_equal(full, np.eye(24))
    # the marginal on "b" counts value 1 of b exactly in the cells np.ravel_multi_index puts there
    marg = marginal_queries(dom, ["b"])
    cells = np.array(list(itertools.product(range(2), range(3), range(4))))
    idx = np.ravel_multi_index(cells.T, dom.shape)
    for v in range(3):
        expected = np.zeros(24)
        expected[idx[cells[:, 1] == v]] = 1
        np.testing.assert_array_equal(marg[v], expected)
    # answering with a count vector == summing the reshaped array
    x = np.arange(24.0)
    np.testing.assert_array_equal(marg @ x, x.reshape(dom.shape).sum(axis=(0, 2)))
    ac = marginal_queries(dom, ["c", "a"])  # clique order does not matter: domain order wins
    np.testing.assert_array_equal(ac @ x, x.reshape(dom.shape).sum(axis=1).ravel())


def test_marginal_sums_to_total():
    dom = Domain(("a", "b", "c", "d"), (3, 2, 4, 2))
    total = kron_queries(dom, {})
    assert total.shape == (1, dom.size)
    np.testing.assert_array_equal(total, np.ones((1, dom.size)))
    for r in range(0, 5):
        for clique in itertools.combinations(dom.names, r):
            m = marginal_queries(dom, clique)
            assert m.shape == (int(np.prod([dom.sizes[dom.index(c)] for c in clique])), dom.size)
            np.testing.assert_array_equal(m.sum(axis=0, keepdims=True), total)
            assert set(np.unique(m)) <= {0.0, 1.0}


def test_kron_queries_bad():
    dom = Domain(("a", "b"), (2, 3))
    with pytest.raises(ValueError, match="'z'"):
        kron_queries(dom, {"z": np.eye(2)})
    with pytest.raises(ValueError, match=r"'b'.*2 columns.*size 3"):
        kron_queries(dom, {"b": np.eye(2)})
    with pytest.raises(ValueError, match=r"'a'.*finite"):
        kron_queries(dom, {"a": np.array([[np.nan, 1.0]])})
    with pytest.raises(ValueError, match=r"'a'.*2-D"):
        kron_queries(dom, {"a": np.ones(2)})
    with pytest.raises(ValueError, match="domain"):
        kron_queries(("a", "b"), {})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="'q'"):
        marginal_queries(dom, ["a", "q"])
    with pytest.raises(ValueError, match="clique"):
        marginal_queries(dom, ["a", "a"])


# ------------------------------------------------------------------ Workload

def test_workload_basics_and_readonly():
    w = Workload(np.eye(3), [1.0, 2.0, 3.0], ("x", "y", "z"))
    assert w.shape == (3, 3) and len(w) == 3
    assert w.labels == ("x", "y", "z")
    with pytest.raises(ValueError):
        w.matrix[0, 0] = 5.0
    with pytest.raises(Exception):
        w.targets = np.ones(3)  # type: ignore[misc]
    w2 = Workload(np.eye(2), 2.0)
    np.testing.assert_array_equal(w2.targets, [2.0, 2.0])
    assert w2.labels == ("q[0]", "q[1]")


def test_workload_copies_input():
    m = np.eye(2)
    w = Workload(m, np.ones(2))
    m[0, 0] = 7.0
    assert w.matrix[0, 0] == 1.0


@pytest.mark.parametrize("kwargs, match", [
    (dict(matrix=np.ones(3), targets=np.ones(3)), "matrix"),
    (dict(matrix=[[np.nan, 1.0]], targets=[1.0]), "matrix"),
    (dict(matrix=np.zeros((0, 2)), targets=np.ones(0)), "matrix"),
    (dict(matrix=np.eye(2), targets=[1.0]), "targets"),
    (dict(matrix=np.eye(2), targets=[1.0, 0.0]), "targets"),
    (dict(matrix=np.eye(2), targets=[1.0, -1.0]), "targets"),
    (dict(matrix=np.eye(2), targets=[1.0, np.inf]), "targets"),
    (dict(matrix=np.eye(2), targets=[1.0, np.nan]), "targets"),
    (dict(matrix=np.eye(2), targets=np.ones((2, 1))), "targets"),
    (dict(matrix=np.eye(2), targets=np.ones(2), labels=("a",)), "labels"),
    (dict(matrix=np.eye(2), targets=np.ones(2), labels="ab"), "labels"),
    (dict(matrix=np.eye(2), targets=np.ones(2), labels=("a", 1)), "labels"),
    (dict(matrix=np.eye(2), targets=np.ones(2), domain=Domain(("a",), (3,))), "domain"),
    (dict(matrix=np.eye(2), targets=np.ones(2), domain=(2,)), "domain"),
])
def test_workload_bad(kwargs, match):
    with pytest.raises(ValueError, match=match):
        Workload(**kwargs)


def test_workload_stack():
    dom = Domain(("a", "b"), (2, 2))
    w1 = Workload(marginal_queries(dom, ["a"]), [1.0, 2.0], ("a0", "a1"), dom)
    w2 = Workload(marginal_queries(dom, ["b"]), 3.0, ("b0", "b1"), dom)
    s = Workload.stack([w1, w2])
    assert s.shape == (4, 4) and s.domain == dom
    np.testing.assert_array_equal(s.targets, [1, 2, 3, 3])
    assert s.labels == ("a0", "a1", "b0", "b1")
    np.testing.assert_array_equal(s.matrix, np.vstack([w1.matrix, w2.matrix]))
    with pytest.raises(ValueError, match="parts"):
        Workload.stack([])
    other = Workload(np.eye(4), 1.0, domain=Domain(("c", "d"), (2, 2)))
    with pytest.raises(ValueError, match="domain"):
        Workload.stack([w1, other])
    with pytest.raises(ValueError, match="parts"):
        Workload.stack([w1, "x"])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="cells"):
        Workload.stack([Workload(np.eye(2), 1.0), Workload(np.eye(3), 1.0)])


def test_workload_from_groups():
    dom = Domain(("a", "b"), (2, 3))
    w = workload_from_groups(dom, [
        ("tot", {}, 5.0),
        ("pb", {"b": prefix_queries(3)}, [1.0, 2.0, 3.0]),
    ])
    assert w.shape == (4, 6) and w.domain == dom
    assert w.labels == ("tot[0]", "pb[0]", "pb[1]", "pb[2]")
    np.testing.assert_array_equal(w.targets, [5, 1, 2, 3])
    np.testing.assert_array_equal(w.matrix[1:], kron_queries(dom, {"b": prefix_queries(3)}))
    with pytest.raises(ValueError, match="'pb'"):
        workload_from_groups(dom, [("pb", {"b": prefix_queries(3)}, [1.0, 2.0])])
    with pytest.raises(ValueError, match="targets"):
        workload_from_groups(dom, [("pb", {"b": prefix_queries(3)}, 0.0)])
    with pytest.raises(ValueError, match="groups"):
        workload_from_groups(dom, [])
    with pytest.raises(ValueError, match=r"groups\[0\]"):
        workload_from_groups(dom, [("x", {})])  # type: ignore[list-item]


# ------------------------------------------------------------------ named workloads

def test_prefix_workload():
    w = prefix_workload(5, target=2.0)
    np.testing.assert_array_equal(w.matrix, np.tril(np.ones((5, 5))))
    np.testing.assert_array_equal(w.targets, np.full(5, 2.0))
    with pytest.raises(ValueError, match=r"^n must"):
        prefix_workload(0)


def test_pl94_workload():
    w = pl94_workload()
    assert w.shape == (319, 252)
    assert w.domain.names == ("voting_age", "hispanic", "race")
    assert w.domain.sizes == (2, 2, 63)
    labels = w.labels
    groups = [lab.split("[")[0] for lab in labels]
    assert groups == (["voting_age"] * 2 + ["hispanic"] * 2 + ["race_single"] * 6
                      + ["race_multi"] * 57 + ["detailed"] * 252)
    t = w.targets
    np.testing.assert_array_equal(t[:10], 1.0)
    np.testing.assert_array_equal(t[10:67], 2.0)
    np.testing.assert_array_equal(t[67:], 4.0)
    M = w.matrix
    assert set(np.unique(M)) == {0.0, 1.0}
    # marginals: each covers half of the 252 cells, the two partition the domain
    np.testing.assert_array_equal(M[0:2].sum(axis=1), [126, 126])
    np.testing.assert_array_equal(M[2:4].sum(axis=1), [126, 126])
    np.testing.assert_array_equal(M[0:2].sum(axis=0), np.ones(252))
    np.testing.assert_array_equal(M[2:4].sum(axis=0), np.ones(252))
    # race rows: each covers 2*2 = 4 cells, all with one race value; together all race values once
    race = M[4:67]
    np.testing.assert_array_equal(race.sum(axis=1), np.full(63, 4.0))
    np.testing.assert_array_equal(race.sum(axis=0), np.ones(252))
    cells = np.array(list(itertools.product(range(2), range(2), range(63))))
    race_value_of_row = [np.unique(cells[np.flatnonzero(r), 2]) for r in race]
    assert all(len(v) == 1 for v in race_value_of_row)
    bitmask = np.array([v[0] for v in race_value_of_row]) + 1
    popcount = np.array([bin(int(b)).count("1") for b in bitmask])
    np.testing.assert_array_equal(bitmask[:6], [1, 2, 4, 8, 16, 32])
    assert np.all(popcount[6:] >= 2)
    assert np.all(np.diff(bitmask[6:]) > 0)
    # detailed cells: identity
    np.testing.assert_array_equal(M[67:], np.eye(252))


def test_pl94_uniform_and_bad():
    w = pl94_workload(uniform_target=1.0)
    np.testing.assert_array_equal(w.targets, np.ones(319))
    np.testing.assert_array_equal(pl94_workload("uniform").targets, np.ones(319))
    np.testing.assert_array_equal(pl94_workload("uniform", uniform_target=3.0).targets, 3.0)
    t = pl94_workload(targets=(1.0, 5.0, 9.0)).targets
    assert t[0] == 1.0 and t[10] == 5.0 and t[-1] == 9.0
    with pytest.raises(ValueError, match="targets"):
        pl94_workload("flat")
    with pytest.raises(ValueError, match="targets"):
        pl94_workload((1.0, 2.0))
    with pytest.raises(ValueError, match="targets"):
        pl94_workload(uniform_target=0.0)


def test_age_pyramid_workload():
    w = age_pyramid_workload()
    assert w.shape == (351, 232)
    assert w.domain.names == ("sex", "age") and w.domain.sizes == (2, 116)
    M = w.matrix.reshape(351, 2, 116)
    for g, sexes in enumerate([(1, 0), (0, 1), (1, 1)]):
        block = M[117 * g:117 * (g + 1)]
        for s in range(2):
            if sexes[s]:
                np.testing.assert_array_equal(block[:116, s], np.tri(116))
                expected = np.zeros(116)
                expected[18:] = 1
                np.testing.assert_array_equal(block[116, s], expected)
            else:
                np.testing.assert_array_equal(block[:, s], 0.0)
        t = w.targets[117 * g:117 * (g + 1)]
        low = np.flatnonzero(t == 1.0)
        np.testing.assert_array_equal(low, [17, 116])  # [0,17] and [18,115]
        assert np.all(np.delete(t, low) == 10.0)
    assert w.labels[116] == "male[116]" and w.labels[117] == "female[0]"
    assert w.labels[-1] == "both[116]"
    # male + female rows == both-sexes rows
    np.testing.assert_array_equal(w.matrix[:117] + w.matrix[117:234], w.matrix[234:])


def test_all_two_way_marginals():
    sizes = (2, 3, 4)
    w = all_two_way_marginals(sizes, target=2.0)
    assert w.shape == (2 * 3 + 2 * 4 + 3 * 4, 24)
    np.testing.assert_array_equal(w.targets, 2.0)
    dom = w.domain
    x = np.arange(24.0)
    ans = w.matrix @ x
    X = x.reshape(sizes)
    expected = np.concatenate([X.sum(axis=2).ravel(), X.sum(axis=1).ravel(), X.sum(axis=0).ravel()])
    np.testing.assert_array_equal(ans, expected)
    assert w.labels[0] == "a0,a1[0]" and w.labels[-1] == "a1,a2[11]"
    assert dom.names == ("a0", "a1", "a2")
    with pytest.raises(ValueError, match="sizes"):
        all_two_way_marginals((3,))
    with pytest.raises(ValueError, match="sizes"):
        all_two_way_marginals((3, 0))


def test_random_workload():
    w = random_workload(50, 400, seed=1)
    assert w.shape == (400, 50)
    assert set(np.unique(w.matrix)) == {-1.0, 1.0}
    frac = np.mean(w.matrix == 1.0)
    assert 0.17 < frac < 0.23
    np.testing.assert_array_equal(w.matrix, random_workload(50, 400, seed=1).matrix)
    np.testing.assert_array_equal(w.targets, 1.0)
    with pytest.raises(ValueError, match=r"^d must"):
        random_workload(0, 3, seed=0)
    with pytest.raises(ValueError, match=r"^m must"):
        random_workload(3, 0, seed=0)


def test_random_range_workload():
    w = random_range_workload(32, 40, seed=5)
    assert w.shape == (40, 32)
    np.testing.assert_array_equal(w.targets, 1.0)
    np.testing.assert_array_equal(w.matrix, random_range_workload(32, 40, seed=5).matrix)
    wr = random_range_workload(32, 40, seed=5, targets="random")
    np.testing.assert_array_equal(wr.matrix, w.matrix)
    assert np.all((wr.targets >= 1.0) & (wr.targets <= 10.0))
    assert np.unique(wr.targets).size == 40
    with pytest.raises(ValueError, match="targets"):
        random_range_workload(8, 4, seed=0, targets="other")
