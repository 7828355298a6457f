"""The masked release of one block (distfit.mask.haar): block sizes, Haar matrices, exactness of
the implicit mask against the explicit orthogonal matrix, and the Gram identity."""
from __future__ import annotations

import numpy as np
import pytest

from distfit.mask.haar import (
    block_sizes,
    block_stream,
    default_block_rows,
    haar_orthogonal,
    mask_block,
    mask_rows,
    masking_matrix,
)


@pytest.mark.parametrize("rows,p,block_rows", [(10, 3, 4), (100, 3, 10), (103, 3, 10), (101, 3, 10),
                                               (1_000_003, 10, 65536), (50, 2, 100), (7, 6, 7), (65_540, 1, 65536)])
def test_block_sizes_cover_the_rows_with_blocks_of_more_than_p_rows(rows, p, block_rows):
    sizes = block_sizes(rows, p, block_rows)
    assert sizes.sum() == rows
    assert (sizes > p).all()
    assert (sizes[:-1] == sizes[0]).all()  # one zarr chunk per block
    count = -(-rows // block_rows)
    assert sizes[0] >= -(-rows // count)  # never below the even split into as few blocks as block_rows allows


@pytest.mark.parametrize("rows,block_rows", [(65_540, 65536), (1_000_003, 65536), (100_000, 65536), (999, 100)])
def test_block_sizes_are_even_so_that_the_smallest_block_is_large(rows, block_rows):
    """The last block is not a remainder of a few rows (it would set the account of one column,
    distfit.mask.orbit): at most the number of blocks short of the others, none over block_rows."""
    sizes = block_sizes(rows, 1, block_rows)
    assert sizes.max() <= block_rows and sizes.max() - sizes.min() < len(sizes)
    assert len(sizes) == -(-rows // block_rows)


def test_block_sizes_refuse_too_few_rows():
    with pytest.raises(ValueError, match="--block-rows must be > p = 3"):
        block_sizes(100, 3, 3)
    with pytest.raises(ValueError, match="more rows than columns"):
        block_sizes(3, 3, 10)
    assert default_block_rows(10) == 65536 and default_block_rows(10_000) > 10_001


def test_haar_orthogonal_is_orthogonal_and_its_thin_form_is_its_first_columns():
    rng = np.random.default_rng(1)
    g = rng.standard_normal((40, 40))
    w = haar_orthogonal(g)
    assert np.abs(w.T @ w - np.eye(40)).max() < 1e-12
    np.testing.assert_allclose(haar_orthogonal(g[:, :5]), w[:, :5], rtol=0, atol=1e-12)


def test_the_sign_correction_makes_the_law_haar():
    """E[trace W] = 0 for Haar W on O(3) (and Var = 1); LAPACK's unsigned Q is biased."""
    rng = np.random.default_rng(2)
    draws = rng.standard_normal((4000, 3, 3))
    traces = np.array([np.trace(haar_orthogonal(g)) for g in draws])
    assert abs(traces.mean()) < 4 / np.sqrt(len(traces))
    assert traces.var() == pytest.approx(1.0, abs=0.1)
    unsigned = np.array([np.trace(np.linalg.qr(g)[0]) for g in draws])
    assert abs(unsigned.mean()) > 10 / np.sqrt(len(traces))


def test_the_implicit_mask_is_an_explicit_orthogonal_matrix():
    rng = np.random.default_rng(3)
    b, k = 30, 4
    m = rng.standard_normal((b, k))
    square = rng.standard_normal((b, b))
    order = rng.permutation(b)
    a = masking_matrix(m, square, order)
    assert np.abs(a.T @ a - np.eye(b)).max() < 1e-12
    np.testing.assert_allclose(mask_rows(m, square[:, :k], order), a @ m, rtol=0, atol=1e-12)


def test_a_block_keeps_the_gram_matrix_of_noisy_data_and_redraws_identically():
    rng = np.random.default_rng(4)
    scaled = rng.uniform(-1, 1, size=(500, 3))
    sigma = 0.7
    y = mask_block(scaled, sigma, block_stream(12345, 7))
    again = mask_block(scaled, sigma, block_stream(12345, 7))
    assert y.tobytes() == again.tobytes()  # a retried task redraws the same block
    noise = sigma * block_stream(12345, 7).standard_normal(scaled.shape)  # drawn first (haar module docstring)
    m = np.column_stack([scaled + noise, np.ones(len(scaled))])
    np.testing.assert_allclose(y.T @ y, m.T @ m, rtol=1e-12, atol=1e-9)
    other = mask_block(scaled, sigma, block_stream(12345, 8))
    assert not np.allclose(other.T @ other, y.T @ y)  # another block, other noise


def test_the_masked_rows_carry_no_row_of_the_data():
    """Haar masking spreads every row: the masked rows are uncorrelated with the data's rows."""
    rng = np.random.default_rng(5)
    scaled = np.zeros((2000, 1))
    scaled[:1000] = 1.0  # a step the rows would show
    y = mask_block(scaled, 0.01, block_stream(9, 0))
    assert abs(np.corrcoef(y[:, 0], scaled[:, 0])[0, 1]) < 0.1
    assert rng is not None
