"""A "block-diagonal plus low-rank (plus a tiny defect)" form of the projection's information matrix.

The projection's ``H`` (:func:`distfit.estimate.projection.normal_equations`) inherits the
symmetry of the workload: on PL94 (252 cells, voting age x Hispanic x 63 races) the cells of
one race interact through a 4 x 4 block, and different races only through a rank-6 term (the
marginals over race), ``H = D + V V^T`` with ``D`` block diagonal over groups of 4 cells and
``V`` 252 x 6. :func:`block_low_rank` finds such a form (:class:`BlockLowRank`) for a dense
``H``; the groups tried are the cells sharing the value of one attribute (small enough groups)
and the single cells (``D`` diagonal). ``L = H - D`` is known off the diagonal blocks only; it
is completed to rank ``k`` blockwise (Nystroem / CUR: for three disjoint sets of groups ``R, P,
Q`` and ``L = V V^T`` of rank ``k`` whose rows on ``P`` and on ``Q`` span ``k`` dimensions,
``L_RR = L_RQ L_PQ^+ L_PR``), then ``D = H - V V^T`` on the diagonal blocks, and the form is
accepted only where ``H - D - V V^T`` vanishes to rounding off the blocks, ``L`` is positive
semidefinite and every block of ``D`` positive definite (so every ``H_FF`` is).

What the form does not hold is the defect ``E = H - D - V V^T`` (zero on the blocks; PL94: up
to 3.6e-12 of ``max |H|`` off them, the plan's own rounding), kept in float32 for the exact
residuals of the method that uses the form (:func:`distfit.estimate.orthant.solve_orthant`,
with the free-cell solves :func:`distfit.estimate.orthant.solve_free`). The tables are laid
out for that method's compiled passes: the groups padded to a multiple of :data:`GROUP_ALIGN`
(groups of no cell), the per-pattern tables for every block type, the ``V_p^T D_p^-1 V_p``
terms' lower triangles packed to :data:`PACK`-aligned rows.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

__all__ = ["BlockLowRank", "GROUP_ALIGN", "MAX_GROUP_CELLS", "MAX_RANK", "PACK", "STRUCTURE_CELLS",
           "block_low_rank"]

#: Groups of at most this many cells (2^6 = 64 free patterns per block type).
MAX_GROUP_CELLS = 6
#: The low-rank term may have at most this rank (and at most a quarter of the cells).
MAX_RANK = 32
#: Domains of at most this many cells are searched for the structure (an eigendecomposition).
STRUCTURE_CELLS = 1024
#: Relative cutoffs: numerical rank, residual off the blocks (rounding of ``H``), smallest
#: eigenvalue of a block of ``D`` (relative to ``lambda_max(H)``).
RANK_CUTOFF = 1e-9
RESIDUAL_CUTOFF = 1e-10
BLOCK_CUTOFF = 1e-6
#: Random three-way splits of the groups tried for the completion.
SPLITS = 8
#: The groups are padded to a multiple of this many (two 512-bit vectors of float64, as LLVM
#: unrolls the passes over the groups): PL94's 63 groups, 64.
GROUP_ALIGN = 16
#: The packed capacitance rows are padded to a multiple of this many float64 (one 512-bit
#: vector): adding a group's row is whole vector adds, no scalar tail (k = 6: 21 -> 24).
PACK = 8


@dataclass(frozen=True, eq=False)
class BlockLowRank:
    """``H = D + V V^T (+ E)`` in a permuted cell order (:func:`block_low_rank`).

    ``perm`` (positions,): position ``j * groups + r`` holds cell ``perm[j * groups + r]``, the
    ``j``-th cell of group ``r``, or -1 in a padding group (the groups are padded to a multiple
    of :data:`GROUP_ALIGN`: every pass over them is whole vectors, no scalar remainder; PL94:
    63 -> 64); ``group_cells`` (s), ``groups`` (padding included); ``factor`` V (positions x k,
    zero rows at the padding) and ``factor_t`` its transpose (contiguous); ``types`` (groups,) the block
    type of each group (groups with equal blocks of ``D`` and rows of ``V`` share one);
    ``blocks`` (groups, s^2): entry ``(r, i * s + j)`` of group ``r``'s block of ``D``;
    ``inverses`` (types * 2^s, s^2): row ``t * 2^s + p`` the inverse of type ``t``'s block
    restricted to pattern ``p`` (bit ``i`` of ``p``: cell ``i`` free), zero outside it;
    ``capacitance`` (types * 2^s, k (k + 1) / 2 rounded up to a multiple of :data:`PACK`):
    ``V_p^T D_p^-1 V_p`` of each type and pattern, its lower triangle packed row by row (entry
    ``(a, b)``, ``b <= a``, at ``a (a + 1) / 2 + b``; zeros after it);
    ``defect`` (positions x positions, float32) ``E = H - D - V V^T`` in the permuted order (zero
    on the blocks and the padding, at most :data:`RESIDUAL_CUTOFF` of ``max |H|`` off them);
    ``spread`` ``sqrt(diag H^-1)`` (1 at the padding);
    ``lipschitz`` ``lambda_max(H)``."""

    perm: np.ndarray
    group_cells: int
    groups: int
    factor: np.ndarray
    factor_t: np.ndarray
    types: np.ndarray
    blocks: np.ndarray
    inverses: np.ndarray
    capacitance: np.ndarray
    defect: np.ndarray
    spread: np.ndarray
    lipschitz: float

    @property
    def rank(self) -> int:
        """``k``, the rank of the coupling term."""
        return int(self.factor.shape[1])

    @property
    def patterns(self) -> int:
        """``2^group_cells``, the free patterns of one group."""
        return 1 << self.group_cells

    @property
    def offsets(self) -> np.ndarray:
        """(groups,) the first row of each group's type in ``inverses`` and ``capacitance``."""
        return self.types * self.patterns

    @functools.cached_property
    def place(self) -> np.ndarray:
        """(cells,) the inverse of ``perm``: cell ``c`` sits at position ``place[c]``."""
        cells = self.perm >= 0
        place = np.empty(int(cells.sum()), dtype=np.int64)
        place[self.perm[cells]] = np.flatnonzero(cells)
        return place

    @functools.cached_property
    def defect_rowmax(self) -> np.ndarray:
        """(positions,) ``max_j |E_ij|`` of each row of ``defect`` (float64): ``|(E v)_i| <=
        defect_rowmax[i] ||v||_1``."""
        return np.abs(self.defect).max(axis=1).astype(np.float64)

    @functools.cached_property
    def blocks_t(self) -> np.ndarray:
        """(s^2, groups) ``blocks`` transposed: group ``r``'s block of ``D`` in column ``r``."""
        return np.ascontiguousarray(self.blocks.T)

    @functools.cached_property
    def full_t(self) -> np.ndarray:
        """(s^2, groups) group ``r``'s ``D_r^-1`` (every cell free) in column ``r``."""
        return np.ascontiguousarray(self.inverses[self.offsets + self.patterns - 1].T)


def _numerical_rank(matrix: np.ndarray) -> int:
    if not matrix.size:
        return 0
    values = np.linalg.svd(matrix, compute_uv=False)
    return int((values > RANK_CUTOFF * values[0]).sum()) if values[0] > 0 else 0


def _completion(hessian: np.ndarray, group: np.ndarray, groups: int) -> np.ndarray | None:
    """``V`` (cells x k) with ``V V^T = H`` off the diagonal blocks, or None (module docstring)."""
    same = group[:, None] == group[None, :]
    off = np.where(same, 0.0, hessian)
    best, best_rank = None, -1
    for seed in range(SPLITS):
        part = (np.random.default_rng(seed).permutation(groups) % 3)[group]
        rank = min(_numerical_rank(off[np.ix_(part == (i + 1) % 3, part == (i + 2) % 3)]) for i in range(3))
        if rank > best_rank:
            best, best_rank = part, rank
    if best_rank > min(MAX_RANK, hessian.shape[0] // 4):
        return None
    low = off.copy()
    for i in range(3):
        rows, left, right = best == i, best == (i + 1) % 3, best == (i + 2) % 3
        between = np.linalg.pinv(off[np.ix_(left, right)], rcond=RANK_CUTOFF)
        full = off[np.ix_(rows, right)] @ between @ off[np.ix_(left, rows)]
        inside = np.ix_(rows, rows)
        low[inside] = np.where(same[inside], full, off[inside])
    values, vectors = np.linalg.eigh((low + low.T) / 2)
    top = max(np.abs(values).max(initial=0.0), np.finfo(float).tiny)
    keep = values > RANK_CUTOFF * top
    if (values < -RANK_CUTOFF * top).any() or keep.sum() > best_rank:
        return None  # not semidefinite, or not of the rank the blocks showed
    return vectors[:, keep] * np.sqrt(values[keep])


def _pattern_tables(blocks: np.ndarray, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each block ``D_t`` (types x s x s) with rows ``V_t`` (types x s x k) and every free
    pattern ``p``: ``(D_t)_pp^-1`` padded with zeros (types x 2^s x s x s) and the lower
    triangle of ``V_p^T D_pp^-1 V_p`` packed row by row, zeros to a multiple of :data:`PACK`
    (types x 2^s x that width); the empty pattern gives zeros."""
    size = blocks.shape[1]
    free = ((np.arange(1 << size)[:, None] >> np.arange(size)) & 1).astype(bool)  # 2^s x s
    mask = free[:, :, None] & free[:, None, :]
    system = np.where(mask[None], blocks[:, None], 0.0) + np.eye(size) * ~free[None, :, None, :]
    inverse = np.linalg.inv(system) * mask[None]
    masked = rows[:, None] * free[None, :, :, None]
    capacitance = np.einsum("tpik,tpij,tpjl->tpkl", masked, inverse, masked)
    lower = np.tril_indices(rows.shape[2])
    packed = np.zeros(capacitance.shape[:2] + (-(-lower[0].size // PACK) * PACK,))
    packed[:, :, :lower[0].size] = capacitance[:, :, lower[0], lower[1]]
    return inverse, packed


def _types(keys: np.ndarray) -> np.ndarray:
    """Group index -> type index: groups whose key rows agree to 1e-9 (relative) share one."""
    scale = max(np.abs(keys).max(initial=0.0), np.finfo(float).tiny)
    types = np.full(keys.shape[0], -1)
    count = 0
    for r in range(keys.shape[0]):  # setup only: once per H
        if types[r] < 0:
            types[(types < 0) & (np.abs(keys - keys[r]).max(axis=1) <= 1e-9 * scale)] = count
            count += 1
    return types


def block_low_rank(hessian: np.ndarray, sizes: tuple[int, ...]) -> BlockLowRank | None:
    """``H = D + V V^T`` (module docstring) for the dense ``H`` of a domain of ``sizes``, or None
    where no grouping tried gives one (or ``H`` is singular, or too large to search)."""
    cells = hessian.shape[0]
    if cells > STRUCTURE_CELLS or cells < 8:
        return None
    coordinates = np.unravel_index(np.arange(cells), sizes)
    candidates = [(cells // size, coordinate) for size, coordinate in zip(sizes, coordinates)
                  if cells // size <= MAX_GROUP_CELLS and size >= 6]
    candidates.append((1, np.arange(cells)))
    values = np.linalg.eigvalsh(hessian)
    if values[0] <= BLOCK_CUTOFF * values[-1]:
        return None
    for group_cells, group in sorted(candidates, key=lambda c: c[0]):
        groups = cells // group_cells
        factor = _completion(hessian, group, groups)
        if factor is None:
            continue
        residual = hessian - factor @ factor.T
        same = group[:, None] == group[None, :]
        if np.abs(np.where(same, 0.0, residual)).max() > RESIDUAL_CUTOFF * np.abs(hessian).max():
            continue
        members = np.stack([np.flatnonzero(group == r) for r in range(groups)])  # groups x s
        blocks = residual[members[:, :, None], members[:, None, :]]
        if np.linalg.eigvalsh(blocks)[:, 0].min() <= BLOCK_CUTOFF * values[-1]:
            continue
        return _padded(members, factor, blocks, np.where(same, 0.0, residual), hessian, float(values[-1]))
    return None


def _padded(members: np.ndarray, factor: np.ndarray, blocks: np.ndarray, defect: np.ndarray, hessian: np.ndarray,
            lipschitz: float) -> BlockLowRank:
    """The :class:`BlockLowRank` of groups ``members`` (groups x s cells), ``V`` = ``factor``,
    ``D``'s blocks, the defect (zero on the blocks) and ``H``, its groups padded to a multiple of
    :data:`GROUP_ALIGN` with groups of no cell (``D`` = I, ``V`` = 0, ``E`` = 0: a zero ``g``
    leaves their ``x`` at 0 and their cells fixed, so they change nothing)."""
    real, s = members.shape
    groups = -(-real // GROUP_ALIGN) * GROUP_ALIGN
    positions = (np.arange(s)[None, :] * groups + np.arange(real)[:, None])  # groups x s: cell (r, i) at i G + r
    place = np.empty(hessian.shape[0], dtype=np.int64)
    place[members.ravel()] = positions.ravel()
    perm = np.full(s * groups, -1, dtype=np.int64)
    perm[place] = np.arange(hessian.shape[0])
    blocks = np.concatenate([blocks, np.broadcast_to(np.eye(s), (groups - real, s, s))])
    rows = np.zeros((groups, s, factor.shape[1]))
    rows[:real] = factor[members]
    types = _types(np.concatenate([blocks.reshape(groups, -1), rows.reshape(groups, -1)], axis=1))
    first = np.array([np.flatnonzero(types == t)[0] for t in range(types.max() + 1)])
    inverse, capacitance = _pattern_tables(blocks[first], rows[first])
    padded_factor = np.zeros((s * groups, factor.shape[1]))
    padded_factor[place] = factor
    spread = np.ones(s * groups)
    spread[place] = np.sqrt(np.maximum(np.diag(np.linalg.inv(hessian)), 0.0))
    padded_defect = np.zeros((s * groups, s * groups), dtype=np.float32)
    padded_defect[np.ix_(place, place)] = defect
    return BlockLowRank(
        perm=perm, group_cells=s, groups=groups, factor=padded_factor, factor_t=np.ascontiguousarray(padded_factor.T),
        types=types, blocks=np.ascontiguousarray(blocks.reshape(groups, -1)),
        inverses=np.ascontiguousarray(inverse.reshape(first.size * (1 << s), -1)),
        capacitance=np.ascontiguousarray(capacitance.reshape(first.size * (1 << s), -1)),
        defect=padded_defect, spread=spread, lipschitz=lipschitz)
