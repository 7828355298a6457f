"""distfit.release.packed: a pack's measurements and query rows in bulk, against the blocks one
at a time (materialised, literal formulas), the noise's distribution, its streams, and a packed
release of ~4,000 blocks on a real local cluster."""
from __future__ import annotations

import dataclasses
import io
import itertools

import numpy as np
import pytest

from distfit.mathematics.domain import Domain
from distfit.mathematics.packing import block_arrays, marginal_pack
from distfit.release.job import run_release
from distfit.release.noise import marginal_counts
from distfit.release.packed import (
    PACK_STREAM,
    pack_answers,
    pack_measurements,
    pack_offsets,
    pack_query_rows,
    pack_stream,
    prepare_pack,
)
from distfit.spec.parse import parse_spec
from distfit.stores.data import open_data, write_synthetic
from distfit.stores.plan import read_plan
from distfit.stores.release import read_release, verify_release
from distfit.runtime.placement import Placement
from tests.packed_plans import marginals_spec, write_packed_plan

SIZES = [3, 4, 2, 3, 5]
CLIQUES = list(itertools.combinations(range(5), 2)) + [(0, 1, 2), (1, 3, 4)]
DOMAIN = Domain(tuple(f"x{i}" for i in range(5)), tuple(SIZES))


def _pack():
    pack, _ = marginal_pack(SIZES, CLIQUES, np.arange(1.0, len(CLIQUES) + 1))
    return marginal_pack(SIZES, CLIQUES, np.arange(1.0, len(CLIQUES) + 1), scale=np.linspace(0.5, 2.0, len(pack)))


def _reader(prepared, counts):
    return lambda i: marginal_counts(counts, DOMAIN, [DOMAIN.names[p] for p in prepared.sources[i]])


def _reference(pack, counts, xi):
    """Block by block: ``y_b = B x + xi_b chol(Sigma_b)^T``, rows ``recon y_b`` added per query."""
    offsets = pack_offsets(pack, SIZES)
    m = int(pack_query_rows(pack, SIZES).max()) + 1
    measured, answers = np.zeros_like(xi), np.zeros((counts.shape[0], m))
    for b in range(len(pack)):
        arrays = block_arrays(pack, SIZES, b)
        x = marginal_counts(counts, DOMAIN, [DOMAIN.names[p] for p in pack.attributes[b] if p >= 0])
        y = xi[:, offsets[b]:offsets[b + 1]] @ np.linalg.cholesky(arrays["sigma"]).T + x @ arrays["basis"].T
        measured[:, offsets[b]:offsets[b + 1]] = y
        np.add.at(answers.T, arrays["query_index"], (y @ arrays["recon"].T).T)
    return measured, answers


def test_pack_measurements_and_rows_equal_the_blocks_one_at_a_time():
    pack, targets = _pack()
    counts = np.random.default_rng(0).poisson(2.0, (9, DOMAIN.size))
    prepared = prepare_pack(pack, SIZES)
    xi = np.random.default_rng(1).standard_normal((9, prepared.width))
    want_y, want = _reference(pack, counts, xi)
    got_y = pack_measurements(prepared, _reader(prepared, counts), 9, xi.copy())
    got = pack_answers(prepared, got_y, np.zeros((9, targets.size)))
    scale = np.abs(want).max()
    np.testing.assert_allclose(got_y, want_y, rtol=0, atol=1e-13 * scale)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-13 * scale)
    # the scatter with repeated queries (np.add.at) adds the same
    slow = dataclasses.replace(prepared, answer=tuple(dataclasses.replace(g, distinct=False) for g in prepared.answer))
    np.testing.assert_allclose(pack_answers(slow, got_y, np.zeros_like(got)), got, rtol=0, atol=1e-13 * scale)
    # noiseless: B x exactly (integers), and the rows of every marginal add up to its counts
    true_y = pack_measurements(prepared, _reader(prepared, counts), 9)
    assert np.array_equal(true_y, np.round(true_y))
    true = pack_answers(prepared, true_y, np.zeros_like(got))
    marginals = np.concatenate([marginal_counts(counts, DOMAIN, [DOMAIN.names[p] for p in c]) for c in CLIQUES], axis=1)
    np.testing.assert_allclose(true, marginals, rtol=0, atol=1e-9)


def test_pack_noise_has_the_plans_covariance_and_calibrated_answers():
    """z = y - B x over many units: each block's sample covariance is scale * B B^T (entries
    within 5 standard errors), and the query errors over the plan's variances are N(0, 1)."""
    pack, targets = _pack()
    units = 20000
    counts = np.zeros((units, DOMAIN.size), dtype=np.int64)
    prepared = prepare_pack(pack, SIZES)
    z = pack_measurements(prepared, _reader(prepared, counts), units,
                          pack_stream(5, 0, 0).standard_normal((units, prepared.width)))
    offsets = prepared.offsets
    for b in range(len(pack)):
        sigma = block_arrays(pack, SIZES, b)["sigma"]
        zb = z[:, offsets[b]:offsets[b + 1]]
        sample = zb.T @ zb / units
        se = np.sqrt((np.outer(np.diag(sigma), np.diag(sigma)) + sigma**2) / units)
        assert np.all(np.abs(sample - sigma) < 5 * se), b
    variances = np.zeros(targets.size)
    for b in range(len(pack)):
        arrays = block_arrays(pack, SIZES, b)
        np.add.at(variances, arrays["query_index"], arrays["variances"])
    errors = pack_answers(prepared, z, np.zeros((units, targets.size))) / np.sqrt(variances)
    assert abs(errors.mean()) < 0.02
    assert abs(errors.std() - 1.0) < 0.02
    assert abs(np.mean(np.abs(errors) <= 1.959963984540054) - 0.95) < 0.01


def test_pack_streams_are_their_own():
    a = pack_stream(123, 0, 4).standard_normal(5)
    assert np.array_equal(a, pack_stream(123, 0, 4).standard_normal(5))  # a retry redraws the same
    for other in (pack_stream(123, 1, 4), pack_stream(123, 0, 5), pack_stream(124, 0, 4),
                  np.random.default_rng(np.random.SeedSequence(123, spawn_key=(0, 4)))):  # block 0's stream
        assert not np.array_equal(a, other.standard_normal(5))
    assert PACK_STREAM == 2**32 - 1
    with pytest.raises(ValueError, match="pack_index"):
        pack_stream(1, -1, 0)


def test_a_packed_release_of_thousands_of_blocks_on_a_local_cluster(tmp_path):
    """All 6-way marginals of 13 binary attributes: 4,096 residual blocks in one pack, released on
    a real two-worker LocalCluster: sealed, verified, no group per block, and errors calibrated
    against the plan's variances (the equality with the blocks one at a time is the tests above
    and tests/stores/test_release.py, on plans small enough to materialise)."""
    spec = marginals_spec([2] * 13, 6, name="wide")
    write_packed_plan(tmp_path / "plan.zarr", spec)
    plan = read_plan(tmp_path / "plan.zarr")
    assert len(plan.block_ids) == 4096 and plan.explicit_block_ids == ()
    data = write_synthetic(parse_spec(spec), 12, tmp_path / "data.zarr", seed=3, chunk_units=6, fsync=False)
    result = run_release(tmp_path / "plan.zarr", data, tmp_path / "release.zarr", seed=11,
                         placement=Placement(workers=2), log=io.StringIO(), fsync=False)
    assert result.blocks == 4096 and result.chunks == 2
    assert verify_release(tmp_path / "release.zarr")[0]
    release = read_release(tmp_path / "release.zarr")
    assert release.block_ids == ()
    counts = np.asarray(open_data(data).counts[...])
    got = np.asarray(release.answers[...])
    true = np.concatenate([marginal_counts(counts, Domain.from_schema(plan.attrs["schema"]), [f"x{i}" for i in c])
                           for c in itertools.combinations(range(13), 6)], axis=1)
    z = (got - true) / np.sqrt(plan.queries_variances)
    assert abs(z.mean()) < 0.1 and abs(z.std() - 1.0) < 0.1
