"""The masked release of one block of rows: noise, a Haar orthogonal mask, a shuffle (paper 003).

Paper 003 (docs/design.md, References), setting B: release ``Y = A (X + C)`` where ``X`` is the
n x p data scaled to [-1, 1] (:mod:`distfit.mask.scaling`), ``C`` has iid ``N(0, sigma^2)``
entries and ``A`` is a random orthogonal n x n matrix, independent of both; for large n
``A = diag(A_1, ..., A_k)``, one Haar orthogonal block of ``n_i > p`` rows each
(:func:`block_sizes`). Because ``A`` is orthogonal, ``Y^T Y = (X + C)^T (X + C)``: the sufficient
statistics of linear models survive, with noise of known law (:mod:`distfit.mask.ols`).

The constant column. The release appends a column of ones to ``X + C`` before masking (the
last column, :data:`distfit.mask.scaling.INTERCEPT`; no noise on it: it is public), so that
``Y^T Y`` also holds ``n`` and the noisy column sums ``1^T (X + C)``, which a regression with an
intercept needs and which the mask alone would destroy (``A 1 != 1``). A block's matrix is
therefore ``M = [X_b + C_b, 1]``, b x k with ``k = p + 1``.

A Haar orthogonal matrix (Mezzadri 2007, "How to generate random matrices from the classical
compact groups", Notices AMS 54(5)): ``G`` with iid ``N(0, 1)`` entries, ``G = Q R`` its QR
factorisation, ``W = Q diag(sign(diag R))`` (:func:`haar_orthogonal`; without the sign
correction LAPACK's convention biases the law).

Applying it without forming it (the decision, and why it is exact). The release of a block is
``A_b M`` for ``A_b = P W V^T``: ``W`` Haar (b x b), ``V`` the orthogonal factor of the complete QR
``M = V [R_M; 0]`` and ``P`` a uniformly random permutation. ``W`` is independent of ``M``, so
``W V^T`` is Haar and independent of ``M`` (the Haar law is invariant under multiplication by a
fixed orthogonal matrix, here ``V^T`` given ``M``), and so is ``A_b``: this is exactly setting B.
And ``A_b M = P W [R_M; 0] = P W[:, :k] R_M``, where ``W[:, :k]`` is the sign-corrected Q of the
thin QR of the first ``k`` columns of ``G`` (Householder QR's first ``k`` columns depend on
``G``'s first ``k`` only). So a block costs two thin QRs of b x k matrices and a b x k x k
product, ``O(b k^2)``, instead of the ``O(b^3)`` of a b x b QR: rows in the millions per block
are cheap. :func:`masking_matrix` forms ``A_b`` explicitly (small blocks, the tests: it is
orthogonal to rounding and ``A_b M`` equals :func:`mask_rows`). The permutation changes
nothing in law (``P W`` is Haar too); it is drawn so that no row of ``Y`` sits where any
property of the factorisation would put it.

Randomness: one stream per block, ``SeedSequence(entropy, spawn_key=(block,))``
(:func:`block_stream`), drawn in a fixed order - the noise ``C_b`` (b x p, row-major), the
Gaussian ``G`` (b x k), the permutation - so a retried task redraws the same block bit for bit.
"""
from __future__ import annotations

import numpy as np

__all__ = [
    "DEFAULT_BLOCK_ROWS",
    "block_sizes",
    "block_stream",
    "default_block_rows",
    "haar_orthogonal",
    "mask_block",
    "mask_rows",
    "masking_matrix",
]

#: Rows per block at most by default; fewer for wide data (:func:`default_block_rows`).
DEFAULT_BLOCK_ROWS = 65536
#: A block's masked rows (b x (p + 1) float64) stay under this many bytes by default.
BLOCK_BYTES = 8 * 2**20


def default_block_rows(p: int) -> int:
    """The default rows per block for ``p`` data columns: :data:`DEFAULT_BLOCK_ROWS`, fewer when
    a block of ``p + 1`` float64 columns would exceed :data:`BLOCK_BYTES`, and always more than
    ``p + 1``."""
    return max(p + 2, min(DEFAULT_BLOCK_ROWS, BLOCK_BYTES // (8 * (p + 1))))


def block_sizes(rows: int, p: int, block_rows: int) -> np.ndarray:
    """The rows of each block for ``rows`` rows of ``p`` data columns: as even as one zarr
    chunk per block allows. With ``k = ceil(rows / block_rows)`` blocks, every block but the
    last has ``b = ceil(rows / k) <= block_rows`` rows and the last the rest, ``rows - (k - 1) b``
    (more than ``b - k``); when that leaves it ``p`` rows or fewer (only for ``rows`` near
    ``block_rows^2``), ``b`` is raised by the least amount that leaves the last block, ``rows mod
    b``, more than ``p`` rows (paper 003's condition ``n_i > p``). Even blocks matter: the
    account of one column is set by the smallest block (:mod:`distfit.mask.orbit`). One block
    when ``rows <= block_rows``. ValueError for ``block_rows <= p`` or ``rows <= p``."""
    if block_rows <= p:
        raise ValueError(f"--block-rows must be > p = {p} (the number of columns), got {block_rows}")
    if rows <= p:
        raise ValueError(f"the data has {rows} rows; a masked release needs more rows than columns ({p})")
    if rows <= block_rows:
        return np.array([rows], dtype=np.int64)
    count = -(-rows // block_rows)
    b = -(-rows // count)
    while 0 < rows % b <= p:
        b += 1
    sizes = [b] * (rows // b) + ([rows % b] if rows % b else [])
    return np.asarray(sizes, dtype=np.int64)


def block_stream(entropy: int, block: int) -> np.random.Generator:
    """The random stream of block ``block``: ``default_rng(SeedSequence(entropy, spawn_key=(block,)))``."""
    if isinstance(block, bool) or int(block) < 0 or isinstance(entropy, bool) or int(entropy) < 0:
        raise ValueError(f"block stream: entropy and block must be integers >= 0, got block {block!r}")
    return np.random.default_rng(np.random.SeedSequence(int(entropy), spawn_key=(int(block),)))


def haar_orthogonal(gaussian: np.ndarray) -> np.ndarray:
    """The Haar-distributed orthonormal columns made from ``gaussian`` (b x k, iid ``N(0, 1)``,
    ``k <= b``): ``Q diag(sign(diag R))`` of its thin QR (Mezzadri 2007, module docstring). For a
    square ``gaussian`` a Haar orthogonal matrix; for b x k the first k columns of the one made
    from any square completion of ``gaussian``."""
    q, r = np.linalg.qr(np.asarray(gaussian, dtype=np.float64))
    return q * np.where(np.diagonal(r) < 0, -1.0, 1.0)


def mask_rows(matrix: np.ndarray, gaussian: np.ndarray, order: np.ndarray) -> np.ndarray:
    """``A M`` for the block matrix ``M`` (b x k) and the orthogonal ``A = P W V^T`` that
    ``gaussian`` (b x k) and the permutation ``order`` define, without forming ``A``:
    ``(haar_orthogonal(gaussian) @ R_M)[order]`` with ``R_M`` the R of ``M``'s thin QR (module
    docstring)."""
    r = np.linalg.qr(np.asarray(matrix, dtype=np.float64), mode="r")
    return (haar_orthogonal(gaussian) @ r)[order]


def masking_matrix(matrix: np.ndarray, gaussian: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The b x b orthogonal ``A = P W V^T`` that :func:`mask_rows` applies to ``matrix`` (b x k)
    when given the first ``k`` columns of ``gaussian`` (b x b): ``W = haar_orthogonal(gaussian)``,
    ``V`` from the complete QR of ``matrix``, ``P`` the permutation ``order``. For small blocks
    and the tests (``O(b^3)``)."""
    v, _ = np.linalg.qr(np.asarray(matrix, dtype=np.float64), mode="complete")
    return (haar_orthogonal(gaussian) @ v.T)[order]


def mask_block(scaled: np.ndarray, sigma: float, rng: np.random.Generator) -> np.ndarray:
    """One block's release (module docstring): ``scaled`` (b x p, entries in [-1, 1]) plus
    ``N(0, sigma^2)`` noise, the constant column appended, masked by a Haar orthogonal b x b
    matrix with its rows shuffled; draws from ``rng`` in the documented order. Returns the
    b x (p + 1) float64 rows of ``Y``."""
    scaled = np.asarray(scaled, dtype=np.float64)
    b, p = scaled.shape
    matrix = np.empty((b, p + 1), dtype=np.float64)
    matrix[:, :p] = rng.standard_normal((b, p))
    matrix[:, :p] *= sigma
    matrix[:, :p] += scaled
    matrix[:, p] = 1.0
    gaussian = rng.standard_normal((b, p + 1))
    order = rng.permutation(b)
    return mask_rows(matrix, gaussian, order)
