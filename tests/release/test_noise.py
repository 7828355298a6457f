"""distfit.release.noise: marginals, noise streams, noisy block answers and query answers of a chunk."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from distfit.release import noise as rel
from distfit.stores.plan import read_plan
from distfit.mathematics.domain import Domain

DOMAIN = Domain(("age", "sex", "edu"), (6, 2, 3))


@pytest.fixture(scope="module")
def planned(small_plan):
    """(plan store, spec): a real multi-block plan written by ``run_plan`` (``conftest.small_plan``)."""
    plan = read_plan(small_plan.plan)
    assert len(plan.block_ids) >= 2
    return plan, small_plan.spec


def _counts(units, seed=0, domain=DOMAIN):
    return np.random.default_rng(seed).poisson(3.0, size=(units, domain.size)).astype(np.int64)


def _reference_marginal(counts, domain, attributes):
    """Explicit loop over cells: add each cell's count into its marginal cell."""
    keep = [domain.index(a) for a in domain.names if a in attributes]
    shape = [domain.sizes[i] for i in keep]
    out = np.zeros((counts.shape[0], int(np.prod(shape))), dtype=np.int64)
    for cell, values in enumerate(itertools.product(*[range(n) for n in domain.sizes])):
        target = np.ravel_multi_index([values[i] for i in keep], shape) if keep else 0
        out[:, target] += counts[:, cell]
    return out


# --------------------------------------------------------------------------------------------
# block_marginal


@pytest.mark.parametrize("attributes", [(), ("age",), ("sex",), ("edu",), ("age", "edu"),
                                        ("sex", "edu"), ("edu", "age"), ("age", "sex", "edu")])
def test_block_marginal_matches_an_explicit_reference(attributes):
    counts = _counts(7, seed=1)
    got = rel.block_marginal(counts, DOMAIN, attributes)
    assert got.dtype == np.int64
    np.testing.assert_array_equal(got, _reference_marginal(counts, DOMAIN, attributes))
    # float counts holding integers are accepted
    np.testing.assert_array_equal(rel.block_marginal(counts.astype(float), DOMAIN, attributes), got)


def test_block_marginal_rejects_bad_counts_naming_row_and_cell():
    counts = _counts(5, seed=2)
    negative = counts.copy()
    negative[3, 17] = -1
    negative[4, 2] = -5
    with pytest.raises(ValueError, match=r"row 3, cell 17.*negative"):
        rel.block_marginal(negative, DOMAIN, ("age",))
    fractional = counts.astype(float)
    fractional[2, 30] = 1.5
    with pytest.raises(ValueError, match=r"row 2, cell 30.*not an integer"):
        rel.block_marginal(fractional, DOMAIN, ("age",))
    nan = counts.astype(float)
    nan[0, 5] = np.nan
    with pytest.raises(ValueError, match=r"row 0, cell 5"):
        rel.block_marginal(nan, DOMAIN, ("age",))
    with pytest.raises(ValueError, match=r"35 columns.*36 cells"):
        rel.block_marginal(counts[:, :35], DOMAIN, ("age",))
    with pytest.raises(ValueError, match=r"2-d"):
        rel.block_marginal(counts[0], DOMAIN, ("age",))
    with pytest.raises(ValueError, match=r"dtype"):
        rel.block_marginal(counts > 2, DOMAIN, ("age",))
    with pytest.raises(ValueError, match=r"unknown attribute"):
        rel.block_marginal(counts, DOMAIN, ("income",))
    with pytest.raises(ValueError, match=r"duplicated"):
        rel.block_marginal(counts, DOMAIN, ("age", "age"))


# --------------------------------------------------------------------------------------------
# noise streams and block noise


def test_noise_streams_are_deterministic_and_distinct():
    sigma = np.array([[2.0, 0.5, 0.1], [0.5, 1.0, 0.2], [0.1, 0.2, 0.5]])
    entropy = 0x1234_5678_9ABC_DEF0_1122_3344_5566_7788
    a = rel.block_noise(sigma, 100, rel.noise_stream(entropy, 1, 3))
    b = rel.block_noise(sigma, 100, rel.noise_stream(entropy, 1, 3))
    assert a.tobytes() == b.tobytes()
    for other in (rel.noise_stream(entropy, 1, 4), rel.noise_stream(entropy, 0, 3),
                  rel.noise_stream(entropy, 3, 1), rel.noise_stream(entropy + 1, 1, 3)):
        assert not np.any(rel.block_noise(sigma, 100, other) == a)
    with pytest.raises(ValueError, match="chunk_index"):
        rel.noise_stream(entropy, 0, -1)
    with pytest.raises(ValueError, match="entropy"):
        rel.noise_stream(-5, 0, 0)


def test_fresh_entropy_is_128_bits_and_fresh():
    values = {rel.fresh_entropy() for _ in range(8)}
    assert len(values) == 8
    assert all(isinstance(v, int) and 0 <= v < 2**128 for v in values)
    assert max(values) >= 2**100  # 8 draws all below 2^100 has probability 2^-224


def test_block_noise_has_covariance_sigma():
    sigma = 3.0 * np.array([[1.0, 0.5], [0.5, 1.0]])  # the optimal 2x2 Sigma of docs/design.md section 1
    z = rel.block_noise(sigma, 40_000, rel.noise_stream(7, 0, 0))
    assert z.shape == (40_000, 2)
    np.testing.assert_allclose(z.mean(axis=0), 0.0, atol=5 * np.sqrt(3.0 / 40_000))
    np.testing.assert_allclose(np.cov(z.T), sigma, atol=0.04 * 3.0)


def test_block_noise_rejects_a_non_spd_sigma():
    rng = rel.noise_stream(1, 0, 0)
    with pytest.raises(ValueError, match="positive definite"):
        rel.block_noise(np.array([[1.0, 2.0], [2.0, 1.0]]), 5, rng)
    with pytest.raises(ValueError, match="symmetric"):
        rel.block_noise(np.array([[1.0, 0.5], [0.0, 1.0]]), 5, rng)


def test_noisy_block_answers_is_the_formula(planned):
    plan, _spec = planned
    block = plan.block(plan.block_ids[0])
    counts = _counts(11, seed=3)
    marginal = rel.block_marginal(counts, DOMAIN, block.attributes)
    got = rel.noisy_block_answers(block, marginal, rel.noise_stream(5, 0, 2))
    z = rel.block_noise(block.sigma, 11, rel.noise_stream(5, 0, 2))
    np.testing.assert_allclose(got, (block.basis @ marginal.T + z.T).T @ block.recon.T, rtol=1e-12, atol=1e-9)
    with pytest.raises(ValueError, match="marginal_counts"):
        rel.noisy_block_answers(block, marginal[:, :-1], rel.noise_stream(5, 0, 2))


def test_query_answers_sums_block_rows_with_repeats():
    rng = np.random.default_rng(0)
    parts = [(np.array([0, 2, 2, 4]), rng.normal(size=(3, 4))), (np.array([2, 1]), rng.normal(size=(3, 2)))]
    got = rel.query_answers(parts, 6)
    want = np.zeros((3, 6))
    for qi, ans in parts:
        for col, q in enumerate(qi):
            want[:, q] += ans[:, col]
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-15)
    assert np.all(got[:, [3, 5]] == 0)
    with pytest.raises(ValueError, match="outside"):
        rel.query_answers(parts, 4)
    with pytest.raises(ValueError, match="units"):
        rel.query_answers([parts[0], (parts[1][0], parts[1][1][:2])], 6)


# --------------------------------------------------------------------------------------------
# release_chunk on a real plan


def test_release_chunk_shapes_and_validation(planned):
    plan, _spec = planned
    counts = _counts(9, seed=4)
    out = rel.release_chunk(plan, counts, 42, 0)
    assert sorted(out.blocks) == sorted(plan.block_ids)
    for block in plan.iter_blocks():
        assert out.blocks[block.block_id].shape == (9, block.recon.shape[0])
    assert out.queries.shape == (9, plan.queries_targets.size) and out.units == 9
    assert set(vars(out)) == {"blocks", "queries", "measurements"}  # no counts, no entropy
    with pytest.raises(ValueError, match="schema"):
        rel.release_chunk(plan, counts, 42, 0, Domain(("age", "sex", "edu"), (6, 2, 4)))
    with pytest.raises(ValueError, match="columns"):
        rel.release_chunk(plan, counts[:, 1:], 42, 0)
    with pytest.raises(ValueError, match="block ids"):
        rel.release_chunk(plan, counts, 42, 0, blocks={plan.block_ids[0]: plan.block(plan.block_ids[0])})


def test_chunks_are_independent_and_reproducible(planned):
    plan, _spec = planned
    blocks = rel.load_blocks(plan)
    entropy, chunk_units = rel.fresh_entropy(), 25
    data = _counts(5 * chunk_units, seed=5)
    full = [rel.release_chunk(plan, data[c * chunk_units:(c + 1) * chunk_units], entropy, c, DOMAIN, blocks=blocks)
            for c in range(5)]
    # chunk 3 alone (a retry on another worker, re-reading the store) gives identical answers
    alone = rel.release_chunk(plan, data[3 * chunk_units:4 * chunk_units], entropy, 3)
    assert alone.queries.tobytes() == full[3].queries.tobytes()
    for block_id in plan.block_ids:
        assert alone.blocks[block_id].tobytes() == full[3].blocks[block_id].tobytes()
    # one (block, chunk) task equals the block's slice of the chunk
    position = rel.block_positions(plan)[plan.block_ids[1]]
    task = rel.block_chunk_answers(blocks[plan.block_ids[1]], position, data[3 * chunk_units:4 * chunk_units],
                                   entropy, 3, DOMAIN)
    assert task.tobytes() == full[3].blocks[plan.block_ids[1]].tobytes()
    # the same data as another chunk index gets different noise
    moved = rel.release_chunk(plan, data[3 * chunk_units:4 * chunk_units], entropy, 2, blocks=blocks)
    assert not np.any(moved.queries == full[3].queries)


def test_difference_of_two_releases_has_covariance_2_L_sigma_LT(planned):
    plan, _spec = planned
    blocks = rel.load_blocks(plan)
    units = 40_000
    counts = _counts(units, seed=6)
    first = rel.release_chunk(plan, counts, 111, 0, blocks=blocks)
    second = rel.release_chunk(plan, counts, 222, 0, blocks=blocks)
    diffs, covs = [], []
    for block_id, block in blocks.items():
        diffs.append(first.blocks[block_id] - second.blocks[block_id])
        covs.append(2.0 * block.recon @ block.sigma @ block.recon.T)
    diff = np.hstack(diffs)
    expected = np.zeros((diff.shape[1],) * 2)
    offset = 0
    for cov in covs:  # independent blocks: block-diagonal covariance
        expected[offset:offset + cov.shape[0], offset:offset + cov.shape[0]] = cov
        offset += cov.shape[0]
    variance = np.diag(expected)
    # mean ~ 0 within 5 standard errors
    assert np.all(np.abs(diff.mean(axis=0)) < 5 * np.sqrt(variance / units))
    # diagonal within 4% (the relative standard error is sqrt(2 / 40000) = 0.7%)
    np.testing.assert_allclose(diff.var(axis=0), variance, rtol=0.04)
    # random directions, including across blocks (cross-block covariance must be 0)
    rng = np.random.default_rng(8)
    for a in rng.normal(size=(6, diff.shape[1])):
        assert np.var(diff @ a) == pytest.approx(a @ expected @ a, rel=0.04)
    # the stored per-block variances are diag(L Sigma L^T)
    for block_id, block in blocks.items():
        np.testing.assert_allclose(np.diag(block.recon @ block.sigma @ block.recon.T), block.variances, rtol=1e-9)


def test_query_answers_are_unbiased_with_the_plans_variances(planned):
    plan, spec = planned
    workload = spec.workload()
    units = 40_000
    x = _counts(1, seed=9)[0]
    truth = workload.matrix @ x
    out = rel.release_chunk(plan, np.tile(x, (units, 1)), 2024, 0)
    variances = plan.queries_variances
    assert np.all(np.abs(out.queries.mean(axis=0) - truth) < 5 * np.sqrt(variances / units))
    np.testing.assert_allclose(out.queries.var(axis=0), variances, rtol=0.04)
    assert np.all(variances <= plan.queries_targets * (1 + 1e-9))
    # no returned row equals the true answers
    assert not np.any(np.all(np.isclose(out.queries, truth), axis=1))


# --------------------------------------------------------------------------------------------
# the same bits as the arithmetic always did (issue 16): references written out literally


def _reference_block_answers(block, marginal, rng):
    """The mechanism as distfit always computed it, operation for operation: ``z = xi C^T``
    with C = scipy's lower Cholesky factor, then ``(X_b B^T + z) L^T``, all float64."""
    import scipy.linalg

    factor = scipy.linalg.cholesky(np.asarray(block.sigma, dtype=np.float64), lower=True)
    z = rng.standard_normal((marginal.shape[0], factor.shape[0])) @ factor.T
    return (np.asarray(marginal, dtype=np.float64) @ np.asarray(block.basis, dtype=np.float64).T + z) @ \
        np.asarray(block.recon, dtype=np.float64).T


def _reference_query_answers(parts, m):
    """Each query's answer as distfit always summed it: zeros, then block by block
    ``out[:, qi] += answers`` (``np.add.at`` for repeated rows)."""
    out = np.zeros((parts[0][1].shape[0], m))
    for qi, ans in parts:
        if np.unique(qi).size == qi.size:
            out[:, qi] += ans
        else:
            np.add.at(out, (slice(None), qi), ans)
    return out


class _Block:
    def __init__(self, basis, recon, sigma, query_index=None, attributes=("age",), block_id="b"):
        self.basis, self.recon, self.sigma = basis, recon, sigma
        self.query_index = np.arange(recon.shape[0]) if query_index is None else query_index
        self.attributes, self.block_id = attributes, block_id


def _spd(k, seed):
    a = np.random.default_rng(seed).normal(size=(k, k))
    return a @ a.T + k * np.eye(k)


@pytest.mark.parametrize("kind", ["identity", "prefix", "residual", "real"])
def test_noisy_block_answers_have_the_bits_of_the_reference(kind):
    """Integer bases take the float32 basis product (exact: the same integers); a real-valued
    basis the float64 one; either way the answers are the reference's bytes."""
    rng = np.random.default_rng(3)
    d, k = 30, 30
    basis = {"identity": np.eye(d), "prefix": np.tril(np.ones((d, d))),
             "residual": rng.choice([-1.0, 0.0, 1.0], size=(k, d), p=[0.1, 0.8, 0.1]),
             "real": rng.normal(size=(k, d))}[kind]
    block = _Block(basis, rng.normal(size=(40, k)), _spd(k, 4))
    prepared = rel.prepare_block(block)
    assert (prepared.basis32 is not None) == (kind != "real")
    for units in (1, 7, 513):
        counts = rng.poisson(4.0, size=(units, d)).astype(np.int64)
        got = rel.noisy_block_answers(prepared, counts, rel.noise_stream(11, 2, units))
        want = _reference_block_answers(block, counts, rel.noise_stream(11, 2, units))
        assert got.tobytes() == want.tobytes(), (kind, units)
        assert rel.noisy_block_answers(block, counts, rel.noise_stream(11, 2, units)).tobytes() == want.tobytes()


def test_basis_product_is_exact_or_float64():
    """float32 only while every partial sum is an integer below 2**24; beyond, float64 (the
    bytes never differ from the float64 product)."""
    rng = np.random.default_rng(5)
    basis = rng.choice([-1.0, 0.0, 1.0, 2.0], size=(12, 20))
    block = rel.prepare_block(_Block(basis, np.eye(12), np.eye(12)))
    small = rng.poisson(50.0, size=(64, 20)).astype(np.int64)
    out = rel.basis_product(block, small)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out.astype(np.float64), small.astype(np.float64) @ basis.T)
    big = small.copy()
    big[17, 3] = 2**23  # row sum * max|B| = 2 * (2**23 + ...) > 2**24
    out = rel.basis_product(block, big)
    assert out.dtype == np.float64
    assert out.tobytes() == (big.astype(np.float64) @ basis.T).tobytes()
    # float counts (a caller's own marginals) and a real basis: the float64 product
    assert rel.basis_product(block, small.astype(float)).dtype == np.float64
    real = rel.prepare_block(_Block(basis + 0.5, np.eye(12), np.eye(12)))
    assert real.basis32 is None and rel.basis_product(real, small).dtype == np.float64


def test_release_chunk_has_the_bits_of_the_reference(planned):
    """release_chunk (prepared blocks or records) against the literal reference, block by block
    and for the query sums, on the real multi-block plan."""
    plan, _spec = planned
    counts = _counts(37, seed=12)
    positions = rel.block_positions(plan)
    parts, blocks = [], rel.load_blocks(plan)
    for block_id, block in blocks.items():
        marginal = rel.block_marginal(counts, DOMAIN, block.attributes)
        parts.append((block.query_index, _reference_block_answers(
            block, marginal, rel.noise_stream(99, positions[block_id], 4))))
    want = _reference_query_answers(parts, plan.queries_targets.size)
    for given in (None, blocks, rel.prepare_blocks(blocks)):
        got = rel.release_chunk(plan, counts, 99, 4, blocks=given)
        assert got.queries.tobytes() == want.tobytes()
        assert got.queries.flags.c_contiguous
        for (qi, ans), block_id in zip(parts, sorted(blocks)):
            assert got.blocks[block_id].tobytes() == ans.tobytes()


@pytest.mark.parametrize("case", ["arange", "permutation", "overlapping", "repeats", "partial"])
def test_query_answers_have_the_bits_of_the_column_scatter(case):
    rng = np.random.default_rng(6)
    m, units = 9, 11
    perm = rng.permutation(m)
    parts = {
        "arange": [(np.arange(m), rng.normal(size=(units, m)))],
        "permutation": [(perm, rng.normal(size=(units, m)))],
        "overlapping": [(perm[:6], rng.normal(size=(units, 6))), (np.arange(m), rng.normal(size=(units, m))),
                        (np.array([3, 1]), rng.normal(size=(units, 2)))],
        "repeats": [(np.array([0, 4, 4, 8, 4]), rng.normal(size=(units, 5))), (perm, rng.normal(size=(units, m)))],
        "partial": [(np.array([2, 5]), rng.normal(size=(units, 2)))],
    }[case]
    parts[0][1][3, 0] = -0.0  # the sum starts at +0.0: a -0.0 row is +0.0 in the query answers
    got = rel.query_answers(parts, m)
    want = _reference_query_answers(parts, m)
    assert got.tobytes() == want.tobytes() and got.flags.c_contiguous
    if case in ("arange", "permutation", "partial"):  # that query has this one row
        assert got[3, parts[0][0][0]] == 0.0 and not np.signbit(got[3, parts[0][0][0]])


def test_derived_blocks_are_the_sole_rows_of_their_queries():
    assert rel.derived_blocks({"a": np.arange(5)}, 5) == ("a",)
    assert rel.derived_blocks({"a": np.array([4, 0, 2])}, 5) == ("a",)  # uncovered queries are 0
    assert rel.derived_blocks({"a": np.array([0, 1]), "b": np.array([2, 3])}, 4) == ("a", "b")
    assert rel.derived_blocks({"a": np.array([0, 1]), "b": np.array([1, 2]), "c": np.array([3])}, 4) == ("c",)
    assert rel.derived_blocks({"a": np.array([0, 0, 1])}, 2) == ()  # a repeated row sums
    assert rel.derived_blocks({"a": np.zeros(0, np.int64), "b": np.array([0])}, 1) == ("b",)
