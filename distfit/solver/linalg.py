"""Dense kernels the solver stages share, at half the flops of the plain products.

A block with m queries and k basis rows spends most of its time in two m x k x k products
per dual evaluation and per SM-II iterate (m reaches 28,000 against k = 400 on marginals.yaml):
the query Gram matrix ``L^T diag(w) L`` and the quadratic forms ``l_j^T Sigma l_j``. Both are
symmetric in a way a general matrix product ignores: BLAS ``syrk`` forms only one triangle of
a Gram matrix, and with ``Sigma = U^T U`` the forms are the squared row norms of ``L U^T``, a
triangular product (``trmm``). Each is about half the flops of ``np.dot``. Arrays are handed
to BLAS in the layout they have (a row-major (m, k) array as its column-major transpose), so
the m x k operand is not copied.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.linalg.blas as blas


def weighted_gram(rows: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """``rows^T diag(weights) rows`` (k x k, exactly symmetric) for ``weights >= 0``, by ``syrk``."""
    scaled = np.multiply(rows, np.sqrt(weights)[:, None], order="C")
    k = scaled.shape[1]
    # scaled^T scaled (scaled.T is Fortran-contiguous) into the upper triangle of zeros: the
    # strict lower triangle stays 0, so upper + upper.T with the diagonal halved is the full
    # matrix with the same bits as np.triu(upper) + np.triu(upper, 1).T, without its two masked copies
    gram = blas.dsyrk(1.0, scaled.T, beta=0.0, c=np.zeros((k, k), order="F"), overwrite_c=True)
    gram += gram.T
    gram[np.diag_indices(k)] *= 0.5
    return gram.T  # exactly symmetric: the same matrix, C-contiguous as the products downstream expect


def quadratic_forms(rows: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """``diag(rows Sigma rows^T)`` for ``Sigma = upper^T upper`` (``upper`` upper triangular;
    what lies below its diagonal is ignored, as after ``scipy.linalg.cho_factor``), by ``trmm``."""
    rows = np.asarray(rows, dtype=float)
    if rows.flags.f_contiguous:
        image = blas.dtrmm(1.0, upper, rows, side=1, trans_a=1)  # rows @ upper^T, (m, k)
        return np.einsum("ij,ij->i", image, image)
    image = whitened_rows(rows, upper)
    return np.einsum("ij,ij->j", image, image)


def whitened_rows(rows: np.ndarray, upper: np.ndarray) -> np.ndarray:
    """``upper @ rows^T`` (k x m) for ``upper`` upper triangular (below its diagonal ignored), by
    ``trmm``: the rows ``l_j`` of a workload in the coordinates where ``Sigma = upper^T upper``
    is the identity (``l_j^T Sigma l_j = |upper l_j|^2``)."""
    return blas.dtrmm(1.0, upper, np.asarray(rows, dtype=float).T)


def inverse_transpose_product(upper: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """``upper^-T @ matrix`` (k x n) for ``upper`` upper triangular (below its diagonal ignored),
    by ``trsm`` on the transposed layout (a row-major ``matrix`` is not copied): with ``Sigma =
    upper^T upper``, ``Sigma^-1 = upper^-1 upper^-T``, so ``b^T Sigma^-1 b = |upper^-T b|^2`` at
    half the flops of a Cholesky solve."""
    return blas.dtrsm(1.0, upper, np.asarray(matrix, dtype=float).T, side=1).T


def inverse_product(upper: np.ndarray, matrix: np.ndarray) -> np.ndarray:
    """``upper^-1 @ matrix`` (k x n) for ``upper`` upper triangular (below its diagonal ignored),
    by ``trsm``; with :func:`inverse_transpose_product`, ``Sigma^-1 B = upper^-1 (upper^-T B)``."""
    return blas.dtrsm(1.0, upper, np.asarray(matrix, dtype=float).T, side=1, trans_a=1).T


def factored_quadratic_forms(rows: np.ndarray, factor: np.ndarray) -> np.ndarray:
    """``diag(rows Sigma rows^T)`` for ``Sigma = factor factor^T`` (``factor`` any k x k matrix).

    With many more rows than k, the triangular factor of ``factor^T = Q R`` (so that
    ``Sigma = R^T R``; 4/3 k^3 flops, and no squared condition number as a Cholesky of Sigma
    would have) pays for itself in ``quadratic_forms``; otherwise the plain product is cheaper.
    """
    rows = np.asarray(rows, dtype=float)
    if rows.shape[0] > 2 * factor.shape[0]:
        upper = scipy.linalg.qr(factor.T, mode="r", check_finite=False)[0]
        return quadratic_forms(rows, upper)
    image = rows @ factor
    return np.einsum("ij,ij->i", image, image)


def dominant_rows(rows: np.ndarray) -> np.ndarray:
    """Indices of the rows whose constraints ``l_j^T Sigma l_j <= 1`` are not implied by others:
    of the rows along one direction (up to sign), the longest; zero rows are left out.

    Rows ``l`` and ``kappa l`` with ``|kappa| <= 1`` give ``kappa^2 l^T Sigma l <= l^T Sigma l``,
    so keeping the longest leaves the feasible set of Problem 1 unchanged. Marginal workloads
    are full of such rows: a block holding the total has a row for every query of the workload,
    and every query outside the block's own attributes meets it along the same few directions
    (on marginals.yaml, 27,898 rows along 420 directions). Directions are compared on a grid of
    2^-36 after normalising to unit length and a positive first entry; rows that round
    differently are kept apart, which only costs time. Should two nearly parallel rows share a
    grid point, dropping the shorter only relaxes the problem: a lower bound found for it still
    bounds the full problem, and ``solve`` scales its plan against every row.
    """
    rows = np.asarray(rows, dtype=float)
    norms = np.sqrt(np.einsum("ij,ij->i", rows, rows))
    candidates = np.flatnonzero(norms > 0)
    if candidates.size == 0:
        return candidates
    unit = rows[candidates] / norms[candidates, None]
    pivot = np.argmax(np.abs(unit) > 1e-9, axis=1)  # a unit row has an entry >= k^-1/2
    unit *= np.sign(unit[np.arange(candidates.size), pivot])[:, None]
    grid = np.ascontiguousarray(np.rint(unit * 2.0**36).astype(np.int64))
    keys = grid.view(np.dtype((np.void, grid.dtype.itemsize * grid.shape[1]))).ravel()
    # longest first, so the first row of each direction in sorted order is the one to keep
    order = np.argsort(-norms[candidates], kind="stable")
    _, first = np.unique(keys[order], return_index=True)
    return np.sort(candidates[order[first]])
