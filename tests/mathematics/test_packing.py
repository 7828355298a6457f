"""Packed blocks (distfit/mathematics/packing.py): the implied arrays are the residual decomposition of the
identity marginals, and the closed forms are what the materialised arrays give."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from distfit.mathematics.packing import PackedBlocks, QueryRuns, block_arrays, marginal_pack
from distfit.mathematics.bounds import certified_bound

SIZES = [3, 4, 2]
CLIQUES = [(0, 1), (0, 2), (1, 2), (0, 1, 2)]


def lifted(sizes, positions):
    """The full-domain column of each cell: its index among the cells of the marginal on ``positions``."""
    grid = np.indices(sizes).reshape(len(sizes), -1)
    if not positions:
        return np.zeros(grid.shape[1], dtype=int)
    return np.ravel_multi_index(tuple(grid[p] for p in positions), tuple(sizes[p] for p in positions))


def test_the_blocks_rebuild_the_identity_marginals_and_state_their_closed_forms():
    rng = np.random.default_rng(3)
    pack, targets = marginal_pack(SIZES, CLIQUES, [1.0, 2.0, 0.5, 4.0])
    pack, _ = marginal_pack(SIZES, CLIQUES, [1.0, 2.0, 0.5, 4.0], scale=rng.uniform(0.5, 2.0, len(pack)))
    assert len(pack) == 1 + 3 + 3 + 1 and targets.size == 12 + 6 + 8 + 24
    d = int(np.prod(SIZES))
    workload = np.zeros((targets.size, d))
    for b in range(len(pack)):
        arrays = block_arrays(pack, SIZES, b)
        positions = [int(p) for p in pack.attributes[b] if p >= 0]
        np.add.at(workload, arrays["query_index"], arrays["recon"] @ arrays["basis"][:, lifted(SIZES, positions)])
        recon, sigma, basis = arrays["recon"], arrays["sigma"], arrays["basis"]
        np.testing.assert_allclose(np.einsum("ij,jk,ik->i", recon, sigma, recon), arrays["variances"], rtol=1e-12)
        profile = np.einsum("ij,ij->j", basis, np.linalg.solve(sigma, basis))
        np.testing.assert_allclose(profile, arrays["profile"], rtol=1e-12)
        assert pack.alpha[b] == pytest.approx(profile.max(), rel=1e-12)
        t = arrays["targets"] * np.max(arrays["variances"] / arrays["targets"])
        bound = certified_bound(basis, recon / np.sqrt(t)[:, None], arrays["cell_weights"], arrays["query_weights"])
        assert pack.lower_bound[b] == pytest.approx(bound, rel=1e-9)  # the closed form is optimal for its shares
    expected = []
    for clique in CLIQUES:
        rows = np.zeros((int(np.prod([SIZES[p] for p in clique])), d))
        rows[lifted(SIZES, list(clique)), np.arange(d)] = 1.0
        expected.append(rows)
    np.testing.assert_allclose(workload, np.vstack(expected), atol=1e-12)


def test_bad_packs_are_refused_naming_the_field():
    pack, _ = marginal_pack(SIZES, CLIQUES[:3], 1.0)
    fields = {name: getattr(pack, name) for name in (
        "attributes", "scale", "alpha", "lower_bound", "certificate", "segment_offsets", "segment_clique",
        "segment_query", "segment_target", "segment_variance")}
    cases = {
        "attributes": np.where(pack.attributes == 0, 5, pack.attributes)[:, ::-1],  # descending
        "scale": -pack.scale,
        "segment_offsets": pack.segment_offsets[::-1],
        "certificate": np.roll(pack.certificate, 1),
        "segment_clique": np.where(pack.segment_clique == 0, 2, pack.segment_clique),
    }
    for name, value in cases.items():
        with pytest.raises(ValueError, match=name):
            PackedBlocks(**{**fields, name: value})
    with pytest.raises(ValueError, match="lower_bound"):
        PackedBlocks(**{**fields, "certificate": np.full(len(pack), -1)})


@pytest.mark.parametrize("sizes", [(2, 2, 2, 2), (5, 3, 4)])
def test_a_pack_of_every_subset_has_the_closed_form_alpha(sizes):
    cliques = list(itertools.combinations(range(len(sizes)), 2))
    pack, _ = marginal_pack(sizes, cliques, 1.0)
    c = [np.prod([1 - 1 / sizes[p] for p in row if p >= 0]) for row in pack.attributes]
    np.testing.assert_allclose(pack.alpha, c, rtol=1e-15)  # scale 1


def test_query_runs_encode_expand_and_index_like_the_vector():
    vector = np.array([1.0, 1.0, 2.0, np.nan, np.nan, -0.0, 0.0, 0.0, 3.0])
    runs = QueryRuns.encode(vector)
    assert runs.offsets.tolist() == [0, 2, 3, 5, 6, 8, 9] and runs.size == len(runs) == 9
    assert runs.expand().tobytes() == vector.tobytes() == np.asarray(runs).tobytes()  # NaN and -0.0 kept bit for bit
    queries = np.array([[8, 0], [5, 6]])
    np.testing.assert_array_equal(runs[queries], vector[queries])
    with pytest.raises(IndexError):
        runs[np.array([9])]
    split = QueryRuns(np.array([1.0, 1.0, 2.0]), np.array([0, 1, 4, 6]))
    merged = split.canonical()
    assert merged.offsets.tolist() == [0, 4, 6] and merged.canonical() is merged
    np.testing.assert_array_equal(merged.expand(), split.expand())
    offsets, mine, theirs = merged.aligned(QueryRuns.encode(np.arange(6.0)))
    assert offsets.tolist() == list(range(7))
    np.testing.assert_array_equal(mine, split.expand())
    np.testing.assert_array_equal(theirs, np.arange(6.0))
    assert QueryRuns.encode(np.zeros(0)).size == 0
    for values, offsets, field in (([1.0], [1, 2], "offsets"), ([1.0, 2.0], [0, 2, 2], "offsets"),
                                   ([1.0], [0, 1, 2], "values")):
        with pytest.raises(ValueError, match=field):
            QueryRuns(np.array(values), np.array(offsets))
