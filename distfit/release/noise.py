"""The mathematics of a release: noisy block answers for one chunk of units (pure numpy).

docs/design.md sections 1, 3 and 4. For every unit (a geographic unit: one row of the data, a
count vector ``x`` over the ``d`` cells of the schema, row-major in the schema's attribute
order) and every block ``b`` of a plan, with ``x_b`` the unit's marginal on the block's
attributes (``d_b`` cells, row-major in schema order), the block releases

    ``y_b = L_b (B_b x_b + z_b)``,   ``z_b ~ N(0, Sigma_b)``  (independent over blocks and units),

stored as ``blocks/<block_id>/answers`` (units x m_b). For a whole chunk of units at once, with
``X_b`` (units x d_b) holding the marginals as rows, that is ``Y_b = (X_b B_b^T + Z_b) L_b^T``
with ``Z_b = Xi C_b^T``, ``Xi`` standard normal (units x k_b) and ``C_b`` the lower Cholesky
factor of ``Sigma_b`` (so every row of ``Z_b`` has covariance ``C_b C_b^T = Sigma_b``). For
integer counts and an integer basis ``X_b B_b^T`` is an exact integer matrix, computed in
float32 where that is exact (:func:`basis_product`); the noise and the product with ``L_b^T``
are float64, the same operations on the same operands as ever, so a seed gives the same bits.
Workload query j's answer is the sum of its rows over the blocks (``query_index``): it has mean
``(W x)_j`` and variance ``plan queries/variances[j]`` (``sum_b (L_b Sigma_b L_b^T)_jj``).

Noise streams (docs/design.md section 3): block ``b`` (its position in the sorted block ids) and
chunk ``c`` draw from ``default_rng(SeedSequence(entropy, spawn_key=(b, c)))``, with
``entropy`` 128 bits of fresh OS entropy per release (:func:`fresh_entropy`). A retried task
therefore redraws exactly the same noise, and no (block, chunk) is ever released with two
different draws; each chunk is independent of every other (processing chunk 3 alone gives the
same answers as in a full run). The blocks of a pack (a packed plan, :class:`PackedBlock`) are
released together by :mod:`distfit.release.packed`, from one stream per (pack, chunk),
``spawn_key=(PACK_STREAM, pack, chunk)`` (three words, so never a block's stream), with
``z_b = chol(Sigma_b) xi_b`` as here (that module's docstring derives it).

Privacy invariants (every function here keeps them; the release store relies on them):

* the noise added to block ``b`` has covariance exactly the plan's ``Sigma_b`` (the stored
  matrix, through its Cholesky factor; nothing rescales, truncates or rounds it), and the
  answers are exactly ``L_b (B_b x_b + z_b)``, nothing else derived from the data;
* the same ``(entropy, block, chunk)`` always gives the same noise, bit for bit; different
  blocks or chunks get independent streams;
* nothing returned contains the true counts, true marginals, true answers or the entropy.
  The entropy must never be stored in a release (a fixed one is for tests only and makes the
  release not private).

Nothing loops over units or cells; loops run over the blocks of a plan only.
"""
from __future__ import annotations

import bisect
import secrets
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numpy as np
import scipy.linalg

from distfit.mathematics.domain import Domain
from distfit.release.packed import PreparedPack, pack_answers, pack_measurements, pack_stream, prepare_pack

__all__ = [
    "ChunkRelease",
    "EXACT_FLOAT32_BOUND",
    "PackedBlock",
    "PreparedBlock",
    "PreparedBlocks",
    "basis_product",
    "block_chunk_answers",
    "block_marginal",
    "block_noise",
    "block_positions",
    "calibration",
    "derived_blocks",
    "fresh_entropy",
    "load_blocks",
    "marginal_counts",
    "noise_stream",
    "noisy_block_answers",
    "noisy_block_measurements",
    "plan_domain",
    "prepare_block",
    "prepare_blocks",
    "query_answers",
    "release_chunk",
    "true_block_answers",
    "validate_counts",
    "validate_marginal",
]

ENTROPY_BITS = 128


# --------------------------------------------------------------------------------------------
# data


def validate_counts(counts: Any, domain: Domain) -> np.ndarray:
    """``counts`` (units x d, d = ``domain.size``) checked and returned as int64.

    Raises ``ValueError`` naming the problem: not 2-D, the wrong number of columns, a
    non-numeric dtype, or a value that is not a finite non-negative integer (naming the first
    offending unit row and cell in row-major order, and its value).
    """
    return _validated(counts, domain.size,
                      f"the schema {list(domain.names)} with sizes {list(domain.sizes)}")


def _validated(counts: Any, cells: int, described: str) -> np.ndarray:
    """:func:`validate_counts` against ``cells`` columns (``described``: what they are)."""
    arr = np.asarray(counts)
    if arr.ndim != 2:
        raise ValueError(f"counts: expected a 2-d array (units x cells), got shape {arr.shape}")
    if arr.shape[1] != cells:
        raise ValueError(f"counts: {arr.shape[1]} columns, but {described} has {cells} cells")
    if arr.dtype == np.bool_ or not (np.issubdtype(arr.dtype, np.integer)
                                     or np.issubdtype(arr.dtype, np.floating)):
        raise ValueError(f"counts: expected integer counts, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            row, cell = np.argwhere(bad)[0]
            raise ValueError(
                f"counts: unit row {row}, cell {cell} holds {arr[row, cell].item()!r}, not an integer count")
    if arr.size and arr.min() < 0:  # one pass, no temporary; the rare failure looks again
        row, cell = np.argwhere(arr < 0)[0]
        raise ValueError(f"counts: unit row {row}, cell {cell} holds {arr[row, cell].item()!r}, a negative count")
    if (np.issubdtype(arr.dtype, np.floating) or arr.dtype.kind == "u") and arr.size and arr.max() >= 2**63:
        row, cell = np.unravel_index(np.argmax(arr), arr.shape)
        raise ValueError(f"counts: unit row {row}, cell {cell} holds {arr[row, cell].item()!r}, too large for int64")
    return arr.astype(np.int64, copy=False)


def validate_marginal(counts: Any, domain: Domain, attributes: Sequence[str]) -> np.ndarray:
    """Marginal counts on ``attributes`` (units x d_b, d_b the product of their sizes; units x 1
    for ``()``) checked like :func:`validate_counts` and returned as int64."""
    if isinstance(attributes, str):
        raise ValueError(f"attributes: expected a sequence of names, got the string {attributes!r}")
    positions = sorted(domain.index(name) for name in attributes)  # ValueError for an unknown name
    if len(set(positions)) != len(positions):
        raise ValueError(f"attributes: duplicated names in {list(attributes)}")
    cells = int(np.prod([domain.sizes[p] for p in positions], dtype=np.int64))
    names = [domain.names[p] for p in positions]
    return _validated(counts, cells, f"the marginal on {names}" if names else "the total")


def _marginal_axes(domain: Domain, attributes: Sequence[str]) -> tuple[int, ...]:
    """Axes of ``domain.shape`` to sum out for the marginal on ``attributes``."""
    if isinstance(attributes, str):
        raise ValueError(f"attributes: expected a sequence of names, got the string {attributes!r}")
    names = list(attributes)
    if len(set(names)) != len(names):
        raise ValueError(f"attributes: duplicated names in {names}")
    keep = {domain.index(name) for name in names}  # ValueError for an unknown name
    return tuple(axis for axis in range(len(domain)) if axis not in keep)


def marginal_counts(counts: np.ndarray, domain: Domain, attributes: Sequence[str]) -> np.ndarray:
    """The marginal on ``attributes`` of counts already validated (:func:`validate_counts`):
    ``counts`` (units x d) summed over the other attributes' axes to (units x d_b), columns
    row-major over ``attributes`` in domain order (``counts`` itself, not a copy, when
    ``attributes`` are all of the schema's: nothing to sum). No validation of the counts (that
    is :func:`block_marginal`); an unknown or duplicated attribute is a ValueError."""
    drop = _marginal_axes(domain, attributes)
    if not drop:
        return counts
    units = counts.shape[0]
    cube = counts.reshape((units,) + tuple(domain.shape))
    return cube.sum(axis=tuple(1 + axis for axis in drop)).reshape(units, -1)


def block_marginal(counts: Any, domain: Domain, attributes: Sequence[str]) -> np.ndarray:
    """The block's marginal of every unit: ``counts`` (units x d) to (units x d_b), int64.

    Column order is row-major over ``attributes`` taken in *domain* order (the order of a
    block's basis columns, docs/design.md section 4), whatever order they are given in;
    ``attributes=()`` gives the total (units x 1); all of the schema's attributes give the
    validated counts themselves (:func:`marginal_counts`). ``counts`` is validated by
    :func:`validate_counts` (ValueError naming the first bad unit row and cell); an unknown or
    duplicated attribute is a ValueError too.
    """
    arr = validate_counts(counts, domain)
    return marginal_counts(arr, domain, attributes)


# --------------------------------------------------------------------------------------------
# noise


def _nonnegative_int(value: Any, name: str) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name}: expected a non-negative integer, got {value!r}")
    if int(value) < 0:
        raise ValueError(f"{name}: expected a non-negative integer, got {int(value)}")
    return int(value)


def fresh_entropy() -> int:
    """128 bits of fresh OS entropy (``secrets.randbits(128)``) for one release.

    It seeds every noise stream of the release (:func:`noise_stream`) and must never be stored
    in a release, logged or returned to a user: anyone holding it can subtract the noise.
    Keep it in the driver's memory only, for retries within the run (docs/design.md section 3).
    """
    return secrets.randbits(ENTROPY_BITS)


def noise_stream(entropy: int, block_index: int, chunk_index: int) -> np.random.Generator:
    """The noise stream of block ``block_index`` and chunk ``chunk_index`` (docs/design.md section 3).

    ``np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(block_index,
    chunk_index)))``: the same triple always gives the same stream (a retried task redraws
    identical noise); different triples give independent streams. ``block_index`` is the
    block's position in the plan's sorted block ids (:func:`block_positions`).
    """
    entropy = _nonnegative_int(entropy, "entropy")
    block_index = _nonnegative_int(block_index, "block_index")
    chunk_index = _nonnegative_int(chunk_index, "chunk_index")
    return np.random.default_rng(np.random.SeedSequence(entropy, spawn_key=(block_index, chunk_index)))


def _cholesky(sigma: Any) -> np.ndarray:
    """Lower Cholesky factor of ``sigma`` (ValueError if it is not symmetric positive definite)."""
    sigma = np.asarray(sigma, dtype=np.float64)
    if sigma.ndim != 2 or sigma.shape[0] != sigma.shape[1]:
        raise ValueError(f"sigma: expected a square matrix, got shape {sigma.shape}")
    if not np.all(np.isfinite(sigma)):
        raise ValueError("sigma: not finite")
    scale = np.abs(sigma).max(initial=0.0)
    if not np.allclose(sigma, sigma.T, rtol=0.0, atol=1e-12 * max(scale, 1e-300)):
        raise ValueError("sigma: not symmetric")
    try:
        return scipy.linalg.cholesky(sigma, lower=True)
    except np.linalg.LinAlgError:
        raise ValueError("sigma: not positive definite (Cholesky failed)") from None


def block_noise(sigma: Any, units: int, rng: np.random.Generator) -> np.ndarray:
    """``units`` independent rows ``z ~ N(0, Sigma)`` (units x k), float64.

    ``z = xi C^T`` with ``xi`` standard normal (``rng.standard_normal((units, k))``) and ``C``
    the lower Cholesky factor of ``Sigma`` (``scipy.linalg.cholesky(sigma, lower=True)``), so
    ``Cov(z) = C C^T = Sigma`` exactly. Deterministic given the generator's state.
    ValueError if ``sigma`` is not symmetric positive definite.
    """
    units = _nonnegative_int(units, "units")
    return _noise(_cholesky(sigma), units, rng)


def _noise(factor: np.ndarray, units: int, rng: np.random.Generator) -> np.ndarray:
    """``xi C^T`` for the lower Cholesky factor ``C`` (:func:`block_noise`): the one place the
    noise is drawn, so every path draws the same bits."""
    xi = rng.standard_normal((units, factor.shape[0]))
    return xi @ factor.T


#: Integers of magnitude below 2**24 are exact in float32: the bound of :func:`basis_product`.
EXACT_FLOAT32_BOUND = 2.0**24


@dataclass(frozen=True, eq=False)
class PreparedBlock:
    """A plan block made ready to release chunks (:func:`prepare_block`), computed once per
    worker instead of once per chunk: ``basis`` B (k x d_b), ``recon`` L (m_b x k), ``factor``
    the lower Cholesky factor C of ``Sigma`` (checked symmetric positive definite),
    ``query_index`` (m_b,), ``attributes``; for an integer-valued basis (every basis distfit
    builds: identity, prefix, residual bases, entries in {-1, 0, 1}) ``basis32``, B^T in
    float32 (C order), and ``basis_max``, the largest ``|B_ij|`` (both None otherwise)."""

    block_id: str
    attributes: tuple[str, ...]
    basis: np.ndarray
    recon: np.ndarray
    factor: np.ndarray
    query_index: np.ndarray
    basis32: np.ndarray | None = None
    basis_max: float | None = None

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(m_b, k, d_b)``."""
        return (self.recon.shape[0],) + self.basis.shape


def prepare_block(block: Any) -> PreparedBlock:
    """``block`` (a :class:`distfit.stores.plan.BlockRecord` or anything with ``block_id``,
    ``attributes``, ``basis``, ``recon``, ``sigma`` and ``query_index``; a
    :class:`PreparedBlock` is returned as it is) with its Cholesky factor computed once
    (:func:`block_noise`'s, ValueError if ``sigma`` is not symmetric positive definite) and,
    for an integer-valued basis, what :func:`basis_product` needs for its float32 product."""
    if isinstance(block, PreparedBlock):
        return block
    basis = np.asarray(block.basis, dtype=np.float64)
    recon = np.asarray(block.recon, dtype=np.float64)
    if basis.ndim != 2 or recon.ndim != 2 or recon.shape[1] != basis.shape[0]:
        raise ValueError(f"recon: shape {recon.shape} does not match basis rows k={basis.shape[0]}")
    factor = _cholesky(block.sigma)
    if factor.shape[0] != basis.shape[0]:
        raise ValueError(f"sigma: shape {np.shape(block.sigma)}, expected ({basis.shape[0]}, {basis.shape[0]}) from basis")
    basis32 = basis_max = None
    if basis.size and np.all(basis == np.round(basis)):
        basis_max = float(np.abs(basis).max())
        if basis_max < EXACT_FLOAT32_BOUND:
            basis32 = np.ascontiguousarray(basis.T, dtype=np.float32)
    return PreparedBlock(block_id=str(getattr(block, "block_id", "")), attributes=tuple(block.attributes),
                         basis=basis, recon=recon, factor=factor,
                         query_index=np.asarray(block.query_index, dtype=np.int64),
                         basis32=basis32, basis_max=basis_max if basis32 is not None else None)


def basis_product(block: PreparedBlock, marginal_counts: np.ndarray) -> np.ndarray:
    """``X_b B^T`` (units x k) for marginal counts ``X_b`` (units x d_b).

    When ``X_b`` holds integers and ``B`` is integer-valued, every product and every partial
    sum of the product is an integer of magnitude at most ``max_ij |B_ij| * max_u sum_j
    X_uj``; while that is below 2**24 all of them are exact in float32 (and below 2**53,
    exact in float64), so the product is the exact integer matrix whatever the precision or
    order of summation: a float32 product (half the work and memory traffic of float64)
    gives the same bits as the float64 ``X_b @ B.T`` always computed here (checked in the
    tests against the float64 product). Otherwise (a real-valued basis, float counts, a unit
    too large) it is the float64 product, as always. Returns float32 or float64: adding it to
    float64 noise converts it exactly.
    """
    marg = np.asarray(marginal_counts)
    if (block.basis32 is not None and np.issubdtype(marg.dtype, np.integer) and marg.size
            and float(marg.sum(axis=1).max()) * block.basis_max < EXACT_FLOAT32_BOUND):
        return marg.astype(np.float32) @ block.basis32
    return np.asarray(marg, dtype=np.float64) @ block.basis.T


def noisy_block_answers(block: Any, marginal_counts: Any, rng: np.random.Generator) -> np.ndarray:
    """One block's noisy answers for a chunk of units: ``(X_b B^T + Z) L^T`` (units x m_b).

    ``block`` has ``basis`` B (k x d_b), ``recon`` L (m_b x k) and ``sigma`` (k x k) (a
    :class:`distfit.stores.plan.BlockRecord` or anything alike, or a :class:`PreparedBlock`);
    ``marginal_counts`` X_b (units x d_b) the units' marginals on the block's attributes
    (:func:`block_marginal`); ``Z`` = :func:`block_noise` ``(sigma, units, rng)``. Row u is the
    mechanism ``L (B x_u + z_u)`` of docs/design.md section 1 (what ``blocks/<block_id>/answers``
    holds). ``X_b B^T`` is :func:`basis_product` (exact for integer counts and bases); the
    sum with ``Z`` is formed in ``Z``'s C-ordered buffer, so the product with ``L^T`` is the
    same BLAS call on the same operands as ever (the same bits).
    """
    block = prepare_block(block)
    return noisy_block_measurements(block, marginal_counts, rng) @ block.recon.T


def noisy_block_measurements(block: Any, marginal_counts: Any, rng: np.random.Generator) -> np.ndarray:
    """One block's noisy basis measurements for a chunk of units: ``X_b B^T + Z`` (units x k),
    what :func:`noisy_block_answers` multiplies by ``L^T`` (the same draw, the same bits). The
    mechanism releases exactly this (``L`` is post-processing, and a residual block's ``L`` has
    full column rank, so its answers determine it): a release stores it for packed blocks, k
    numbers per unit instead of m_b (:mod:`distfit.stores.release`)."""
    block = prepare_block(block)
    marg = np.asarray(marginal_counts)
    k, d_b = block.basis.shape
    if marg.ndim != 2 or marg.shape[1] != d_b:
        raise ValueError(f"marginal_counts: shape {marg.shape}, expected (units, {d_b}) from the basis")
    total = _noise(block.factor, marg.shape[0], rng)
    total += basis_product(block, marg)  # X_b B^T + Z: addition is commutative, bit for bit
    return total


def true_block_answers(block: Any, marginal_counts: Any) -> np.ndarray:
    """One block's noiseless answers ``X_b B^T L^T`` (units x m_b): what
    :func:`noisy_block_answers` returns without ``Z``. For validation only (calibration in
    :mod:`distfit.report.page`); never written to a release."""
    basis = np.asarray(block.basis, dtype=np.float64)
    recon = np.asarray(block.recon, dtype=np.float64)
    marg = np.asarray(marginal_counts, dtype=np.float64)
    if marg.ndim != 2 or marg.shape[1] != basis.shape[1]:
        raise ValueError(f"marginal_counts: shape {marg.shape}, expected (units, {basis.shape[1]}) from the basis")
    return (marg @ basis.T) @ recon.T


def calibration(noisy: Any, true: Any, variances: Any) -> dict[str, Any]:
    """How the released answers' actual errors compare with the promised standard deviations.

    ``noisy`` and ``true`` (units x m) are the released and the true answers, ``variances``
    (m,) the plan's variance of each query. Returns the standardised errors
    ``z = (noisy - true) / sqrt(variance)`` (units x m; each is N(0, 1) when the noise follows
    the plan) and the share of answers within 1 and 1.96 standard deviations (68.3% and 95%
    expected), the mean and standard deviation of ``z``, and the count.
    """
    noisy = np.asarray(noisy, dtype=np.float64)
    true = np.asarray(true, dtype=np.float64)
    sd = np.sqrt(np.asarray(variances, dtype=np.float64))
    if noisy.shape != true.shape or noisy.ndim != 2 or sd.shape != (noisy.shape[1],):
        raise ValueError(f"calibration: shapes {noisy.shape}, {true.shape}, {sd.shape} do not match")
    if not np.all(sd > 0):
        raise ValueError("calibration: every variance must be > 0")
    z = (noisy - true) / sd
    return {"z": z, "count": int(z.size), "within_1sd": float(np.mean(np.abs(z) <= 1.0)),
            "within_1.96sd": float(np.mean(np.abs(z) <= 1.959963984540054)),
            "mean_z": float(z.mean()), "sd_z": float(z.std())}


def query_answers(block_answers: Sequence[tuple[Any, Any]], num_queries: int) -> np.ndarray:
    """Each workload query's answer (units x m): the sum of its rows over the blocks.

    ``block_answers`` holds ``(query_index, answers)`` per block, ``answers`` (units x m_b)
    and ``query_index`` (m_b,) naming the query of each column (docs/design.md section 4: "each
    workload query's answer, the sum of its block rows"); repeated indices within a block
    add up too. A query no block holds a row for gets 0. All blocks must have the same units.

    The sum is ``0.0 + row + row + ...`` in block order (row order within a block), the
    same additions in the same order for every way of computing it, so the bits never depend
    on it: one block whose rows are each of the m queries once is a column gather
    (``0.0 + row``), anything else accumulates query-major (rows of a (m x units) array:
    contiguous, unlike scattering into columns) and is transposed back (C order).
    """
    num_queries = _nonnegative_int(num_queries, "num_queries")
    checked = []
    for position, (query_index, answers) in enumerate(block_answers):
        qi = np.asarray(query_index)
        ans = np.asarray(answers, dtype=np.float64)
        if qi.ndim != 1 or (qi.size and not np.issubdtype(qi.dtype, np.integer)):
            raise ValueError(f"block_answers[{position}]: query_index must be a 1-d integer array")
        if ans.ndim != 2 or ans.shape[1] != qi.size:
            raise ValueError(
                f"block_answers[{position}]: answers shape {ans.shape}, expected (units, {qi.size})")
        if qi.size and (qi.min() < 0 or qi.max() >= num_queries):
            raise ValueError(
                f"block_answers[{position}]: query_index outside 0..{num_queries - 1}")
        if checked and ans.shape[0] != checked[0][1].shape[0]:
            raise ValueError(
                f"block_answers[{position}]: {ans.shape[0]} units, but earlier blocks have {checked[0][1].shape[0]}")
        checked.append((qi, ans))
    if not checked:
        raise ValueError("block_answers: no blocks")
    units = checked[0][1].shape[0]
    if len(checked) == 1 and checked[0][0].size == num_queries:
        qi, ans = checked[0]
        order = np.empty(num_queries, dtype=np.int64)
        order[qi] = np.arange(num_queries)
        if np.array_equal(qi[order], np.arange(num_queries)):  # a permutation: query j is row order[j]
            if np.array_equal(order, np.arange(num_queries)):
                return ans + 0.0  # 0.0 + row, as the sum is defined (a -0.0 row becomes +0.0)
            out = np.take(ans, order, axis=1)
            out += 0.0
            return out
    out_t = np.zeros((num_queries, units))
    for qi, ans in checked:
        if np.unique(qi).size == qi.size:
            out_t[qi] += ans.T
        else:
            np.add.at(out_t, qi, ans.T)
    return np.ascontiguousarray(out_t.T)


def derived_blocks(query_indices: Mapping[str, Any], num_queries: int) -> tuple[str, ...]:
    """The blocks whose answers are columns of the query answers, in sorted id order.

    ``query_indices``: ``{block_id: query_index}`` of every block of a plan. A block is
    derived when each of its rows is the only row, in the whole plan, of its query: then query
    ``j``'s answer is ``0.0 + that row`` (:func:`query_answers`), so the block's answers are
    ``queries/answers[:, query_index]`` bit for bit (a row of exactly -0.0, probability 0 for
    noisy answers, reads back as +0.0). A single-block plan (PL94) is derived whole; in the
    plans of merged residual blocks a query usually has rows in several blocks, and those
    blocks are not derived. The release stores derived blocks' answers once
    (:mod:`distfit.stores.release`).
    """
    num_queries = _nonnegative_int(num_queries, "num_queries")
    indices = {block_id: np.asarray(qi, dtype=np.int64) for block_id, qi in query_indices.items()}
    rows = np.bincount(np.concatenate([qi for qi in indices.values()] + [np.zeros(0, np.int64)]),
                       minlength=num_queries)
    return tuple(block_id for block_id in sorted(indices)
                 if indices[block_id].size and np.all(rows[indices[block_id]] == 1))


# --------------------------------------------------------------------------------------------
# plans and chunks


def plan_domain(plan: Any) -> Domain:
    """The plan's schema (root attr ``schema``) as a :class:`Domain`."""
    schema = plan.attrs["schema"]
    return Domain.from_schema(schema)


def block_positions(plan: Any) -> dict[str, int]:
    """``{block_id: block_index}``: each block's position in the plan's *sorted* block ids,
    the ``block_index`` of its noise stream (fixed by the stored plan, not by reading order)."""
    return {block_id: position for position, block_id in enumerate(sorted(plan.block_ids))}


@dataclass(frozen=True, eq=False)
class PackedBlock:
    """A block of a pack as :func:`load_blocks` gives it: its id and attributes (names) and its
    pack, shared by all the pack's blocks (``pack``: the :class:`distfit.mathematics.packing.PackedBlocks`,
    or once :func:`prepare_blocks` has run, the :class:`distfit.release.packed.PreparedPack`),
    ``sizes`` the schema's. Nothing per block is materialised: the pack releases its blocks
    together (:mod:`distfit.release.packed`)."""

    block_id: str
    attributes: tuple[str, ...]
    pack: Any = field(repr=False)
    pack_id: str = ""
    pack_index: int = 0
    sizes: tuple[int, ...] = ()


def load_blocks(plan: Any) -> dict[str, Any]:
    """Every block of ``plan`` read once, ``{block_id: BlockRecord}`` in sorted id order (pass it
    to :func:`release_chunk` as ``blocks=`` so chunks do not re-read the store); a packed
    block is a :class:`PackedBlock` (its arrays are never materialised)."""
    explicit = getattr(plan, "explicit_block_ids", None)
    pack_ids = tuple(getattr(plan, "pack_ids", ()))
    if not pack_ids:
        return {block_id: plan.block(block_id) for block_id in sorted(plan.block_ids)}
    names = list(plan.attrs["schema"]["attributes"])
    sizes = tuple(int(n) for n in plan.attrs["schema"]["sizes"])
    out: dict[str, Any] = {block_id: plan.block(block_id) for block_id in explicit}
    for p, (pack_id, pack) in enumerate(zip(pack_ids, plan.packs())):
        rows = pack.attributes.tolist()
        for block_id, row in zip(plan.packed_block_ids(p), rows):
            out[block_id] = PackedBlock(block_id=block_id, attributes=tuple(names[i] for i in row if i >= 0),
                                        pack=pack, pack_id=pack_id, pack_index=p, sizes=sizes)
    return {block_id: out[block_id] for block_id in sorted(out)}


class PreparedBlocks(dict):
    """``{block_id: PreparedBlock | PackedBlock}`` (:func:`prepare_blocks`): a dict, of its own
    type so that Dask ships it as one pickle. Dask serialises a plain dict's values one by one
    (``iterate_collection``), which would copy a pack shared by 100,000 :class:`PackedBlock`
    values 100,000 times; one pickle keeps it shared."""


def prepare_blocks(blocks: Mapping[str, Any]) -> dict[str, Any]:
    """``{block_id: PreparedBlock}`` (:func:`prepare_block`) in sorted id order, e.g. of
    :func:`load_blocks`: pass it to :func:`release_chunk` as ``blocks=`` so that no chunk
    factors ``Sigma`` again; packed blocks stay :class:`PackedBlock`, their pack prepared once
    (:func:`distfit.release.packed.prepare_pack`). Run it under the BLAS thread rule of the
    chunks (:func:`distfit.runtime.threads.blas_limit`), as the factor was always computed there."""
    packs = _prepared_packs(blocks.values())
    out = PreparedBlocks()
    for block_id in sorted(blocks):
        block = blocks[block_id]
        if isinstance(block, PackedBlock):
            out[block_id] = block if isinstance(block.pack, PreparedPack) else PackedBlock(
                block_id=block.block_id, attributes=block.attributes, pack=packs[block.pack_index],
                pack_id=block.pack_id, pack_index=block.pack_index, sizes=block.sizes)
        else:
            out[block_id] = prepare_block(block)
    return out


def _prepared_packs(blocks: Any) -> dict[int, PreparedPack]:
    """``{pack_index: PreparedPack}`` of the packs of ``blocks`` (each prepared once)."""
    found: dict[int, Any] = {}
    for block in blocks:
        if isinstance(block, PackedBlock) and block.pack_index not in found:
            found[block.pack_index] = block
    return {p: b.pack if isinstance(b.pack, PreparedPack) else prepare_pack(b.pack, b.sizes, b.pack_id, p)
            for p, b in sorted(found.items())}


def _check_domain(plan: Any, domain: Domain | None) -> Domain:
    stored = plan_domain(plan)
    if domain is None:
        return stored
    if (tuple(domain.names), tuple(domain.sizes)) != (stored.names, stored.sizes):
        raise ValueError(
            f"domain: {list(domain.names)} sizes {list(domain.sizes)} does not match the plan's schema "
            f"{list(stored.names)} sizes {list(stored.sizes)}")
    return domain


def block_chunk_answers(block: Any, block_index: int, counts_chunk: Any, entropy: int,
                        chunk_index: int, domain: Domain) -> np.ndarray:
    """One (block, chunk) task: the block's noisy answers (units x m_b) for a chunk of units.

    ``noisy_block_answers(block, block_marginal(counts_chunk, domain, block.attributes),
    noise_stream(entropy, block_index, chunk_index))``; ``block_index`` is the block's entry in
    :func:`block_positions`. Deterministic in its arguments (a retry gives the same array).
    """
    marginal = block_marginal(counts_chunk, domain, block.attributes)
    return noisy_block_answers(block, marginal, noise_stream(entropy, block_index, chunk_index))


@dataclass(frozen=True, eq=False)
class ChunkRelease:
    """The released arrays of one chunk of units: ``blocks[block_id]`` (units x m_b, what goes
    to ``blocks/<block_id>/answers``; the blocks not in a pack), ``queries`` (units x m,
    ``queries/answers``) and ``measurements[pack_id]`` (units x K, every block's ``B x + z`` of
    the pack: ``packs/<pack_id>/measurements``, :mod:`distfit.release.packed`).
    Holds no true counts and no entropy."""

    blocks: dict[str, np.ndarray]
    queries: np.ndarray
    measurements: dict[str, np.ndarray] = field(default_factory=dict)  # per pack id (units x K)

    @property
    def units(self) -> int:
        return int(self.queries.shape[0])


def release_chunk(plan: Any, counts_chunk: Any, entropy: int, chunk_index: int,
                  domain: Domain | None = None, *,
                  blocks: Mapping[str, Any] | None = None) -> ChunkRelease:
    """One chunk of units through every block of ``plan`` (a :class:`distfit.stores.plan.Plan`).

    Block ``b`` (``block_positions(plan)[b]``) draws from ``noise_stream(entropy, position,
    chunk_index)``; its answers are ``(X_b B_b^T + Z_b) L_b^T`` and each query's answer is the
    sum of its block rows (:func:`query_answers`, ``m = len(plan.queries_targets)``). The blocks
    of a pack (:class:`PackedBlock`) are released together, pack ``p`` drawing from
    :func:`distfit.release.packed.pack_stream` ``(entropy, p, chunk_index)``: their measurements
    ``B x + z`` (:func:`distfit.release.packed.pack_measurements`) and their rows added to the
    query answers after the other blocks' (:func:`distfit.release.packed.pack_answers`); no
    packed block's answers are formed.
    ``counts_chunk`` is either the chunk's full counts (units x d; validated once by
    :func:`validate_counts`) or a function ``attributes -> X_b`` giving the chunk's marginal
    counts on a block's attributes (units x d_b, columns row-major in schema order; e.g. a data
    store's ``block_counts`` bound to the chunk's units, :func:`distfit.stores.data.open_data`), whose
    results are validated the same way against the block's marginal. ``domain`` defaults to the
    plan's schema and must match it when given. ``blocks`` (``{block_id: BlockRecord}`` from
    :func:`load_blocks`, or better ``{block_id: PreparedBlock}`` from :func:`prepare_blocks`)
    avoids re-reading the store and re-factoring ``Sigma`` per chunk; it must hold exactly the
    plan's block ids. Chunk ``c`` depends only on ``(plan, the chunk's counts, entropy, c)``:
    chunks can run in any order, on any worker, and be retried.
    """
    domain = _check_domain(plan, domain)
    if callable(counts_chunk):
        def marginal(attributes: Sequence[str]) -> np.ndarray:
            return validate_marginal(counts_chunk(tuple(attributes)), domain, attributes)
    else:
        counts = validate_counts(counts_chunk, domain)

        def marginal(attributes: Sequence[str]) -> np.ndarray:
            return marginal_counts(counts, domain, attributes)
    if blocks is None:
        blocks = load_blocks(plan)
    elif len(blocks) != len(plan.block_ids) or set(blocks) != set(plan.block_ids):
        raise ValueError(
            f"blocks: ids {sorted(blocks)} do not match the plan's block ids {sorted(plan.block_ids)}")
    chunk_index = _nonnegative_int(chunk_index, "chunk_index")
    packs = _prepared_packs(blocks.values())
    explicit = [b for b in sorted(blocks) if not isinstance(blocks[b], PackedBlock)] if packs else sorted(blocks)
    positions = _positions(plan, explicit)
    answers: dict[str, np.ndarray] = {}
    pieces = []
    for block_id in explicit:
        block = prepare_block(blocks[block_id])
        rng = noise_stream(entropy, positions[block_id], chunk_index)
        ans = noisy_block_answers(block, marginal(block.attributes), rng)
        answers[block_id] = ans
        pieces.append((block.query_index, ans))
    num_queries = int(np.asarray(plan.queries_targets).shape[0])
    units = pieces[0][1].shape[0] if pieces else None
    measurements: dict[str, np.ndarray] = {}
    for prepared in packs.values():
        def read(i: int, prepared: PreparedPack = prepared) -> np.ndarray:
            return marginal([domain.names[p] for p in prepared.sources[i]])

        if units is None:
            units = read(0).shape[0]  # every pack has a block, so a source
        noise = pack_stream(entropy, prepared.pack_index, chunk_index).standard_normal((units, prepared.width))
        measurements[prepared.pack_id] = pack_measurements(prepared, read, units, noise)
    queries = query_answers(pieces, num_queries) if pieces else np.zeros((units or 0, num_queries))
    for prepared in packs.values():
        pack_answers(prepared, measurements[prepared.pack_id], queries)
    return ChunkRelease(blocks=answers, queries=queries, measurements=measurements)


def _positions(plan: Any, block_ids: Sequence[str]) -> dict[str, int]:
    """:func:`block_positions` of ``block_ids`` only (a bisection of the plan's sorted ids, not a
    sort of them all: a packed plan has many)."""
    ordered = sorted(plan.block_ids)  # linear on the sorted ids a plan holds
    return {block_id: bisect.bisect_left(ordered, block_id) for block_id in block_ids}
