"""The measurement model (distfit.estimate.measurements): exact recovery of B x + z from a
release, marginals, and workload estimates that equal the release's own sums."""
from __future__ import annotations

import dataclasses
import types

import numpy as np
import pytest

import distfit
from distfit.estimate.measurements import (
    cell_query_columns,
    measurement_model,
    model_from_blocks,
    query_marginal_rows,
    recover_measurements,
    workload_estimates,
    workload_kind,
)
from distfit.mathematics.domain import Domain
from distfit.release.noise import (
    block_marginal,
    noise_stream,
    noisy_block_answers,
    prepare_block,
    query_answers,
    true_block_answers,
)

ENTROPY = 77


@pytest.fixture(scope="module")
def model_and_plan(small_plan):
    plan = distfit.read_plan(small_plan.plan)
    return measurement_model(plan), plan


def test_model_matches_the_plan(model_and_plan):
    model, plan = model_and_plan
    assert model.attributes == tuple(plan.attrs["schema"]["attributes"])
    assert model.cells == int(np.prod(plan.attrs["schema"]["sizes"]))
    assert model.num_queries == len(plan.queries_targets)
    assert [b.block_id for b in model.blocks] == list(plan.block_ids)
    for block in model.blocks:
        assert np.allclose(block.recovery @ block.recon, np.eye(block.rows), atol=1e-10)
        precision = np.linalg.inv(block.sigma)
        assert np.allclose(block.whitener.T @ block.whitener, precision, rtol=1e-9, atol=1e-9)
        if block.information is not None:
            assert np.allclose(block.information, block.basis.T @ precision @ block.basis, rtol=1e-8, atol=1e-8)


def test_recovery_is_exact(model_and_plan):
    model, plan = model_and_plan
    rng = np.random.default_rng(0)
    x = rng.poisson(2.0, (30, model.cells))
    answers, expected = {}, {}
    for position, block_id in enumerate(plan.block_ids):
        record = prepare_block(plan.block(block_id))
        marginal = block_marginal(x, model.domain(), record.attributes)
        answers[block_id] = noisy_block_answers(record, marginal, noise_stream(ENTROPY, position, 0))
        # the same stream again: the noise z the release drew, so y = B x_b + z is known
        z = noise_stream(ENTROPY, position, 0).standard_normal((x.shape[0], record.factor.shape[0])) @ record.factor.T
        expected[block_id] = marginal @ record.basis.T + z
    recovered = recover_measurements(model, answers)
    for block_id in plan.block_ids:
        assert np.allclose(recovered[block_id], expected[block_id], rtol=1e-9, atol=1e-8)


def test_workload_estimates_are_the_releases_noiseless_sums(model_and_plan):
    model, plan = model_and_plan
    rng = np.random.default_rng(1)
    x = rng.poisson(3.0, (25, model.cells))
    pieces = [(b.query_index, true_block_answers(b, block_marginal(x, model.domain(), b.attributes)))
              for b in plan.iter_blocks()]
    expected = query_answers(pieces, model.num_queries)
    got = workload_estimates(model, x)
    assert np.allclose(got, expected, rtol=1e-12, atol=1e-9)
    assert np.array_equal(got, np.round(got))  # integer x, 0/1 queries: exact integers


def test_cell_query_columns_finds_a_detailed_query_group(model_and_plan):
    """The queries that are the cells themselves, in cell order, are found where they are (their
    estimates are then x exactly); a workload without them, or with them out of order, has none."""
    model, _ = model_and_plan
    assert cell_query_columns(model) is None  # the small spec has no detailed group
    m, cells = model.workload.shape
    detailed = dataclasses.replace(model, workload=np.vstack([model.workload[:5], np.eye(cells), model.workload[5:]]))
    assert cell_query_columns(detailed) == 5
    # W x with the cell queries copied and the other rows multiplied: the full product's values
    split = dataclasses.replace(detailed, cell_queries=5, num_queries=m + cells)
    x = np.random.default_rng(2).random((7, cells))
    got = workload_estimates(split, x)
    assert np.array_equal(got[:, 5:5 + cells], x) and got.flags["C_CONTIGUOUS"]
    np.testing.assert_allclose(got, x @ detailed.workload.T, rtol=1e-14, atol=1e-13)
    counts = np.random.default_rng(3).poisson(5.0, (7, cells))
    assert np.array_equal(workload_estimates(split, counts), counts @ detailed.workload.T)
    # into a given array, x already its cell columns (not copied) or not: the same values
    out = np.full((7, m + cells), np.nan)
    out[:, 5:5 + cells] = x
    assert workload_estimates(split, out[:, 5:5 + cells], out) is out and np.array_equal(out, got)
    other = np.full((7, m + cells), np.nan)
    assert np.array_equal(workload_estimates(split, x, other), got)
    with pytest.raises(ValueError, match="out: float64 \\(6, "):
        workload_estimates(split, x, np.empty((6, m + cells)))
    with pytest.raises(ValueError, match="out: only a workload with cell queries"):
        workload_estimates(model, x[:, :model.cells], np.empty((7, m)))
    shuffled = dataclasses.replace(model, workload=np.vstack([model.workload, np.eye(cells)[::-1]]))
    assert cell_query_columns(shuffled) is None
    twice = dataclasses.replace(model, workload=np.vstack([model.workload, 2 * np.eye(cells)]))
    assert cell_query_columns(twice) is None


def test_marginal_and_expansion_are_adjoint(model_and_plan):
    model, _ = model_and_plan
    rng = np.random.default_rng(2)
    v = rng.standard_normal((4, model.cells))
    for block in model.blocks:
        w = rng.standard_normal((4, block.cells))
        expanded = np.zeros_like(v)
        model.add_expanded(expanded, w, block)
        assert np.allclose(np.sum(model.marginal(v, block) * w), np.sum(v * expanded))
        assert np.array_equal(model.marginal(v, block), block_marginal(np.zeros((4, model.cells), int), model.domain(),
                                                                       block.attributes) + model.marginal(v, block))


def test_block_attributes_in_any_order_mean_schema_order():
    domain = Domain(("a", "b"), (2, 3))
    block = types.SimpleNamespace(block_id="x", attributes=("b", "a"), basis=np.eye(6), recon=np.eye(6),
                                  sigma=np.eye(6), query_index=np.arange(6))
    model = model_from_blocks(domain, [block])
    assert model.blocks[0].attributes == ("a", "b")
    x = np.arange(6.0)[None, :]
    assert np.array_equal(workload_estimates(model, x), x)


def test_bad_blocks_are_refused_naming_the_field():
    domain = Domain(("a", "b"), (2, 3))
    good = dict(block_id="x", attributes=("a",), basis=np.eye(2), recon=np.eye(2), sigma=np.eye(2),
                query_index=np.arange(2))
    with pytest.raises(ValueError, match="blocks/x/recon: not of full column rank"):
        model_from_blocks(domain, [types.SimpleNamespace(**dict(good, recon=np.ones((3, 2))))])
    with pytest.raises(ValueError, match="blocks/x/attributes: unknown attribute 'c'"):
        model_from_blocks(domain, [types.SimpleNamespace(**dict(good, attributes=("c",)))])
    with pytest.raises(ValueError, match="blocks/x/basis: 2 columns"):
        model_from_blocks(domain, [types.SimpleNamespace(**dict(good, attributes=("b",)))])
    with pytest.raises(ValueError, match="blocks/x/sigma"):
        model_from_blocks(domain, [types.SimpleNamespace(**dict(good, sigma=-np.eye(2)))])
    model = model_from_blocks(domain, [types.SimpleNamespace(**good)])
    with pytest.raises(ValueError, match="no answers for block 'x'"):
        recover_measurements(model, {})
    with pytest.raises(ValueError, match=r"block_answers\['x'\]: shape \(4, 3\)"):
        recover_measurements(model, {"x": np.zeros((4, 3))})
    with pytest.raises(ValueError, match="x: shape"):
        workload_estimates(model, np.zeros((2, 5)))


def test_answer_linear_is_the_linear_term_of_the_answers():
    """``a[rows] K = B^T Sigma^-1 y`` for answers ``a = L y``: a well-conditioned square subset of
    the rows of ``L`` (the last k) where there is one, else every row (``L`` square)."""
    rng = np.random.default_rng(3)
    domain = Domain(("a", "b"), (3, 4))
    for extra in (3, 0):
        k = domain.size
        recon = rng.standard_normal((k + extra, k)) + 4 * np.eye(k + extra, k, -extra)
        a = rng.standard_normal((k, k))
        block = types.SimpleNamespace(block_id="b0", attributes=("a", "b"), basis=rng.standard_normal((k, k)),
                                      recon=recon, sigma=a @ a.T + 0.5 * np.eye(k), query_index=np.arange(k + extra))
        measured = model_from_blocks(domain, [block]).blocks[0]
        rows, linear = measured.answer_linear
        assert rows == slice(extra, k + extra)
        y = rng.standard_normal((5, k))
        answers = y @ recon.T
        expected = y @ np.linalg.inv(block.sigma) @ block.basis
        np.testing.assert_allclose(answers[:, rows] @ linear, expected, rtol=1e-9, atol=1e-9 * np.abs(expected).max())


def test_query_rows_on_their_own_marginals_equal_the_dense_workload(model_and_plan):
    """query_marginal_rows (what workload_kind reads on wide domains, never forming a row over
    the domain's cells) gives every measured query's row of W exactly once, on the union of its
    blocks' attributes: expanded over the other attributes it equals the dense W, to 1e-12."""
    model, _ = model_and_plan
    assert model.workload is not None
    seen = np.zeros(model.num_queries, dtype=int)
    for queries, axes, table in query_marginal_rows(model):
        seen[queries] += 1
        shape = tuple(model.sizes[a] if a in axes else 1 for a in range(len(model.sizes)))
        lifted = np.broadcast_to(table.reshape((len(queries),) + shape), (len(queries),) + model.sizes)
        np.testing.assert_allclose(lifted.reshape(len(queries), model.cells), model.workload[queries], atol=1e-12)
    assert (seen == 1).all()
    assert workload_kind(dataclasses.replace(model, workload=None)) == workload_kind(model)
