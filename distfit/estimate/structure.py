"""A "block-diagonal plus low-rank" information matrix, and the orthant projection that uses it.

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

Free-cell systems (:func:`solve_free`), for each unit's free set ``F`` (``x_A = 0``):
``H_FF x_F = g_F`` is ``(D_FF + V_F V_F^T) x_F = g_F``, by Woodbury (Golub & Van Loan 2.1.4)

    ``z = D_FF^-1 g_F``,  ``S = I + V_F^T D_FF^-1 V_F`` (k x k, SPD, eigenvalues >= 1),
    ``x_F = D_FF^-1 (g_F - V_F w)``,  ``w = S^-1 V_F^T z``.

``D_FF^-1`` acts group by group through the inverse of the group's block restricted to its
free cells, tabulated once for every block type and free pattern (2^group cells patterns, zero
outside the pattern), and ``V_F^T D_FF^-1 V_F`` is the sum over groups of tabulated k x k
matrices. The gradient needs no product with ``H``: ``V^T x = w`` (``V_F^T x_F = V_F^T z - (S
- I) w``), so ``H x - g = D x + V w - g``.

:func:`solve_orthant` runs the primal-dual active-set method of
:mod:`distfit.estimate.projection` with these solves in float64, unit by unit, in one compiled
loop (numba: per unit the method branches on its own free set, which numpy can only batch
through padded tables, temporary arrays and a float32 search; compiled, a step costs a few
passes over one unit's 252 cells, in cache). From the free set ``g H^-1 > START sqrt(diag
H^-1)`` (``H^-1 g`` by the same Woodbury solve, every cell free), each step solves on ``F``,
frees the cells of ``A`` with a multiplier below ``-tol lambda_max max(1, ||x||_inf)`` and fixes
the cells of ``F`` at or below zero (in the first steps, below a fraction :data:`DROP` of their
standard deviation: most would go negative a step later). Between steps only the groups whose
pattern changed update ``S``, ``z`` and ``V^T z``. When ``F`` settles, the solution is refined
once (float64 residual ``H x - g`` with the dense ``H`` over the free cells; the correction by
the same solve) and the KKT conditions checked on the refined gradient: where they hold the
result is the exact KKT point, as the dense method's (on PL94 the gradient agrees with the
dense ``H x - g`` to 1e-15 of ``max |g|``), else the steps go on from the corrected free set.
Units that do not settle in ``max_steps`` come back unconverged (the caller's dense method
takes them).

Measured (PL94, 4096 units, CPU time, loaded machine): 5.1 steps a unit on average; 15 us a
unit for :func:`solve_orthant` against 31-36 us in the same runs for the previous numpy version
(float32 search on batches of 512 units, mixed-precision refinement); the whole projection
(benchmarks/bench_projection.py) 22 us against 37. The kernels compile once per structure shape
(4.7 s) into numba's on-disk cache (0.2 s to load in a new process).
"""
from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

__all__ = ["BlockLowRank", "MAX_GROUP_CELLS", "MAX_RANK", "STRUCTURE_CELLS", "block_low_rank", "solve_free",
           "solve_orthant"]

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
#: The first free set: cells whose unconstrained estimate ``g H^-1`` exceeds this many of its
#: standard deviations ``sqrt(diag H^-1)`` (measured on PL94 with DROP: 5.1 steps a unit at
#: 0.5, 5.2 at 0.75).
START = 0.5
#: In the first steps, free cells below these fractions of their standard deviation
#: ``sqrt(diag H^-1)`` leave the free set (most go negative a step later; measured on PL94:
#: 5.1 steps a unit instead of 5.7); later steps, and the KKT check, use 0.
DROP = (0.3, 0.1)
#: Random three-way splits of the groups tried for the completion.
SPLITS = 8


@dataclass(frozen=True, eq=False)
class BlockLowRank:
    """``H = D + V V^T`` in a permuted cell order (:func:`block_low_rank`).

    ``perm`` (cells,): position ``j * groups + r`` holds cell ``perm[j * groups + r]``, the
    ``j``-th cell of group ``r``; ``group_cells`` (s), ``groups``; ``factor`` V (cells x k,
    permuted order) and ``factor_t`` its transpose (contiguous); ``types`` (groups,) the block
    type of each group (groups with equal blocks of ``D`` and rows of ``V`` share one);
    ``blocks`` (groups, s^2): entry ``(r, i * s + j)`` of group ``r``'s block of ``D``;
    ``inverses`` (types * 2^s, s^2): row ``t * 2^s + p`` the inverse of type ``t``'s block
    restricted to pattern ``p`` (bit ``i`` of ``p``: cell ``i`` free), zero outside it;
    ``capacitance`` (types * 2^s, k^2): ``V_p^T D_p^-1 V_p`` of each type and pattern;
    ``hessian`` the dense ``H`` in the permuted order; ``spread`` ``sqrt(diag H^-1)``;
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
    hessian: np.ndarray
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
    pattern ``p``: ``(D_t)_pp^-1`` padded with zeros (types x 2^s x s x s) and ``V_p^T
    D_pp^-1 V_p`` (types x 2^s x k x k); the empty pattern gives zeros."""
    size = blocks.shape[1]
    free = ((np.arange(1 << size)[:, None] >> np.arange(size)) & 1).astype(bool)  # 2^s x s
    mask = free[:, :, None] & free[:, None, :]
    system = np.where(mask[None], blocks[:, None], 0.0) + np.eye(size) * ~free[None, :, None, :]
    inverse = np.linalg.inv(system) * mask[None]
    masked = rows[:, None] * free[None, :, :, None]
    return inverse, np.einsum("tpik,tpij,tpjl->tpkl", masked, inverse, masked)


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
        perm = members.T.ravel()
        rows = factor[members]  # groups x s x k
        types = _types(np.concatenate([blocks.reshape(groups, -1), rows.reshape(groups, -1)], axis=1))
        first = np.array([np.flatnonzero(types == t)[0] for t in range(types.max() + 1)])
        inverse, capacitance = _pattern_tables(blocks[first], rows[first])
        permuted = np.ascontiguousarray(hessian[np.ix_(perm, perm)])
        spread = np.sqrt(np.maximum(np.diag(np.linalg.inv(permuted)), 0.0))
        return BlockLowRank(
            perm=perm, group_cells=group_cells, groups=groups, factor=np.ascontiguousarray(factor[perm]),
            factor_t=np.ascontiguousarray(factor[perm].T), types=types,
            blocks=np.ascontiguousarray(blocks.reshape(groups, -1)),
            inverses=np.ascontiguousarray(inverse.reshape(first.size * (1 << group_cells), -1)),
            capacitance=np.ascontiguousarray(capacitance.reshape(first.size * (1 << group_cells), -1)),
            hessian=permuted, spread=spread, lipschitz=float(values[-1]))
    return None


def _jit(function):
    """``numba.njit`` without the GIL, fastmath off (the float64 steps are the exact method's),
    cached on disk where numba finds a writable cache directory (beside the package, else
    the user's cache), else compiled once per process."""
    try:
        return numba.njit(nogil=True, cache=True)(function)
    except RuntimeError:  # pragma: no cover - no writable cache directory
        return numba.njit(nogil=True)(function)


@_jit
def _cholesky(a, lower, kz):
    """Lower Cholesky factor of the SPD ``a`` (its lower triangle), the diagonal stored inverted."""
    k = len(kz)
    for j in range(k):
        p = a[j, j]
        for m in range(j):
            p -= lower[j, m] * lower[j, m]
        lower[j, j] = 1.0 / np.sqrt(p)  # S = I + PSD: pivots >= 1
        for i in range(j + 1, k):
            v = a[i, j]
            for m in range(j):
                v -= lower[i, m] * lower[j, m]
            lower[i, j] = v * lower[j, j]


@_jit
def _cholesky_solve(lower, t, kz):
    """``t <- S^-1 t`` from :func:`_cholesky`'s factor (forward, then back substitution)."""
    k = len(kz)
    for i in range(k):
        v = t[i]
        for m in range(i):
            v -= lower[i, m] * t[m]
        t[i] = v * lower[i, i]
    for i in range(k - 1, -1, -1):
        v = t[i]
        for m in range(i + 1, k):
            v -= lower[m, i] * t[m]
        t[i] = v * lower[i, i]


@_jit
def _couple(vt, t, c, kz):
    """``c = V t`` on every cell."""
    c[:] = 0.0
    for b in range(len(kz)):
        tb = t[b]
        for cell in range(c.size):
            c[cell] += tb * vt[b, cell]


@_jit
def _project(vt, z, t, lanes, kz):
    """``t = V^T z`` in 8 interleaved partial sums (independent chains: vectorised without
    reassociating the sum)."""
    cells = z.size
    body = cells - cells % 8
    for b in range(len(kz)):
        lanes[:] = 0.0
        for cell in range(0, body, 8):
            for lane in range(8):
                lanes[lane] += vt[b, cell + lane] * z[cell + lane]
        v = 0.0
        for cell in range(body, cells):
            v += vt[b, cell] * z[cell]
        for lane in range(8):
            v += lanes[lane]
        t[b] = v


@_jit
def _apply(table, q, rhs, r, groups, out, sz):
    """``out_r = table[q] rhs_r`` on group ``r``'s cells (one tabulated s x s matrix)."""
    s = len(sz)
    for i in range(s):
        v = 0.0
        for j in range(s):
            v += table[q, i * s + j] * rhs[j * groups + r]
        out[i * groups + r] = v


@_jit
def _capacitance(pattern, offsets, capacitance, acc, kz):
    """``acc = I + sum_r (V_p^T D_p^-1 V_p)`` over the groups with free cells (lower triangle)."""
    k = len(kz)
    acc[:, :] = 0.0
    for a in range(k):
        acc[a, a] = 1.0
    for r in range(pattern.size):
        if pattern[r]:
            q = offsets[r] + pattern[r]
            for a in range(k):
                for b in range(a + 1):
                    acc[a, b] += capacitance[q, a * k + b]


@_jit
def _next(pattern, new, x, gradient, spread, floor, threshold, groups, scratch, sz):
    """The next free set's patterns (cells of ``F`` with ``x`` above ``floor`` of their spread
    stay, cells of ``A`` with a multiplier below ``-threshold`` join), branch-free over the
    cells; whether any group changed."""
    s = len(sz)
    for i in range(s):
        for r in range(groups):
            cell = i * groups + r
            fixed = 1 - ((pattern[r] >> i) & 1)
            scratch[cell] = np.int64(x[cell] > floor * spread[cell]) | (fixed & np.int64(gradient[cell] < -threshold))
    for r in range(groups):
        new[r] = scratch[r]
    for i in range(1, s):
        for r in range(groups):
            new[r] |= scratch[i * groups + r] << i
    changed = 0
    for r in range(groups):
        changed |= np.int64(new[r] != pattern[r])
    return changed != 0


@_jit
def _swap(r, old, new, offsets, inverses, capacitance, factor, gu, z, acc, tacc, groups, sz, kz):
    """Group ``r`` goes from pattern ``old`` to ``new``: ``S`` and ``t = V^T z`` updated by its
    terms, ``z_r = D_p^-1 g_r`` recomputed."""
    s, k = len(sz), len(kz)
    q0, q1 = offsets[r] + old, offsets[r] + new
    for a in range(k):
        for b in range(a + 1):
            acc[a, b] += capacitance[q1, a * k + b] - capacitance[q0, a * k + b]
    for i in range(s):
        cell = i * groups + r
        for b in range(k):
            tacc[b] -= z[cell] * factor[cell, b]
    _apply(inverses, q1, gu, r, groups, z, sz)
    for i in range(s):
        cell = i * groups + r
        for b in range(k):
            tacc[b] += z[cell] * factor[cell, b]


@_jit
def _orthant(g, inverses, capacitance, blocks, offsets, factor, vt, hessian, spread, tol_scale, max_steps,
             start, drop, x_out, gradient_out, converged, sz, kz):
    """The active-set method of the module docstring on every row of ``g`` (permuted order);
    ``sz``, ``kz``: tuples of length s and k (compile-time sizes: the small loops unroll).
    Writes ``x``, the gradient and whether each row converged; returns the most steps."""
    n, cells = g.shape
    s, k = len(sz), len(kz)
    groups = cells // s
    full = (1 << s) - 1
    pattern = np.empty(groups, np.int64)
    new = np.empty(groups, np.int64)
    scratch = np.empty(cells, np.int64)
    acc, lower, lower_full = np.empty((k, k)), np.empty((k, k)), np.empty((k, k))
    z, x, c, gradient = np.empty(cells), np.empty(cells), np.empty(cells), np.empty(cells)
    residual, z2 = np.empty(cells), np.empty(cells)
    t, tacc, lanes = np.empty(k), np.empty(k), np.empty(8)
    new[:] = full
    _capacitance(new, offsets, capacitance, acc, kz)
    _cholesky(acc, lower_full, kz)
    most = 0
    for u in range(n):
        gu = g[u]
        # the first free set: H^-1 g (every cell free) above START of its spread
        for r in range(groups):
            _apply(inverses, offsets[r] + full, gu, r, groups, z, sz)
        _project(vt, z, t, lanes, kz)
        _cholesky_solve(lower_full, t, kz)
        _couple(vt, t, c, kz)
        for r in range(groups):
            q = offsets[r] + full
            bits = 0
            for i in range(s):
                cell = i * groups + r
                v = z[cell]
                for j in range(s):
                    v -= inverses[q, i * s + j] * c[j * groups + r]
                bits |= np.int64(v > start * spread[cell]) << i
            pattern[r] = bits
        for r in range(groups):
            _apply(inverses, offsets[r] + pattern[r], gu, r, groups, z, sz)
        _project(vt, z, tacc, lanes, kz)
        _capacitance(pattern, offsets, capacitance, acc, kz)
        steps = 0
        done = False
        while steps < max_steps:
            steps += 1
            _cholesky(acc, lower, kz)
            t[:] = tacc
            _cholesky_solve(lower, t, kz)
            _couple(vt, t, c, kz)
            big = 1.0
            for r in range(groups):  # x_F = D_FF^-1 (g_F - c_F), gradient D x + c - g
                if pattern[r]:
                    q = offsets[r] + pattern[r]
                    for i in range(s):
                        cell = i * groups + r
                        v = z[cell]
                        for j in range(s):
                            v -= inverses[q, i * s + j] * c[j * groups + r]
                        x[cell] = v
                        big = max(big, abs(v))
                    for i in range(s):
                        cell = i * groups + r
                        v = c[cell] - gu[cell]
                        for j in range(s):
                            v += blocks[r, i * s + j] * x[j * groups + r]
                        gradient[cell] = v
                else:
                    for i in range(s):
                        cell = i * groups + r
                        x[cell] = 0.0
                        gradient[cell] = c[cell] - gu[cell]
            floor = drop[steps - 1] if steps <= drop.size else 0.0
            if _next(pattern, new, x, gradient, spread, floor, tol_scale * big, groups, scratch, sz):
                for r in range(groups):
                    if new[r] != pattern[r]:
                        _swap(r, pattern[r], new[r], offsets, inverses, capacitance, factor, gu, z, acc, tacc,
                              groups, sz, kz)
                        pattern[r] = new[r]
                continue
            # settled: one refinement step (float64 residual with the dense H), then the KKT check
            residual[:] = -gu
            for i in range(cells):
                xi = x[i]
                if xi != 0.0:  # rows of the free cells (H symmetric: rows are columns)
                    for cell in range(cells):
                        residual[cell] += xi * hessian[i, cell]
            for r in range(groups):
                _apply(inverses, offsets[r] + pattern[r], residual, r, groups, z2, sz)
            _project(vt, z2, t, lanes, kz)
            _cholesky_solve(lower, t, kz)
            _couple(vt, t, c, kz)
            big = 1.0
            for r in range(groups):  # x -= d, gradient = residual - H d = residual - D d - c
                if pattern[r]:
                    q = offsets[r] + pattern[r]
                    for i in range(s):
                        cell = i * groups + r
                        v = z2[cell]
                        for j in range(s):
                            v -= inverses[q, i * s + j] * c[j * groups + r]
                        z2[cell] = v
                    for i in range(s):
                        cell = i * groups + r
                        v = residual[cell] - c[cell]
                        for j in range(s):
                            v -= blocks[r, i * s + j] * z2[j * groups + r]
                        gradient[cell] = v
                        x[cell] -= z2[cell]
                        big = max(big, abs(x[cell]))
                else:
                    for i in range(s):
                        cell = i * groups + r
                        gradient[cell] = residual[cell] - c[cell]
            if not _next(pattern, new, x, gradient, spread, 0.0, tol_scale * big, groups, scratch, sz):
                done = True
                break
            for r in range(groups):  # on from the corrected free set
                pattern[r] = new[r]
                _apply(inverses, offsets[r] + pattern[r], gu, r, groups, z, sz)
            _project(vt, z, tacc, lanes, kz)
            _capacitance(pattern, offsets, capacitance, acc, kz)
        converged[u] = done
        most = max(most, steps)
        for cell in range(cells):
            x_out[u, cell] = x[cell] if done else 0.0
            gradient_out[u, cell] = gradient[cell] if done else 0.0
    return most


def _sizes(structure: BlockLowRank) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Tuples of length s and k: numba compiles the kernels for these lengths (the loops over a
    group's cells and the coupling's rank unroll), once per shape of structure."""
    return (0,) * structure.group_cells, (0,) * structure.rank


@_jit
def _free_solve(g, free, inverses, capacitance, offsets, vt, x_out, sz, kz):
    """:func:`solve_free` on every row (permuted order)."""
    n, cells = g.shape
    s, k = len(sz), len(kz)
    groups = cells // s
    pattern = np.empty(groups, np.int64)
    acc, lower = np.empty((k, k)), np.empty((k, k))
    z, c, t, lanes = np.empty(cells), np.empty(cells), np.empty(k), np.empty(8)
    for u in range(n):
        for r in range(groups):
            bits = 0
            for i in range(s):
                bits |= np.int64(free[u, i * groups + r]) << i
            pattern[r] = bits
            _apply(inverses, offsets[r] + bits, g[u], r, groups, z, sz)
        _capacitance(pattern, offsets, capacitance, acc, kz)
        _cholesky(acc, lower, kz)
        _project(vt, z, t, lanes, kz)
        _cholesky_solve(lower, t, kz)
        _couple(vt, t, c, kz)
        for r in range(groups):
            q = offsets[r] + pattern[r]
            for i in range(s):
                v = z[i * groups + r]
                for j in range(s):
                    v -= inverses[q, i * s + j] * c[j * groups + r]
                x_out[u, i * groups + r] = v


def solve_free(structure: BlockLowRank, g: np.ndarray, free: np.ndarray, dtype=np.float64) -> np.ndarray:
    """``x`` with ``H_FF x_F = g_F``, ``x_A = 0`` for every row (module docstring, Woodbury);
    ``g``, ``free`` (units x cells) in the permuted order of ``structure``; solved in float64,
    returned in ``dtype``."""
    g = np.ascontiguousarray(g, dtype=np.float64)
    x = np.empty_like(g)
    _free_solve(g, np.ascontiguousarray(free, dtype=bool), structure.inverses, structure.capacitance,
                structure.offsets, structure.factor_t, x, *_sizes(structure))
    return x.astype(dtype, copy=False)


def solve_orthant(structure: BlockLowRank, g: np.ndarray, *, tol: float, max_steps: int, permuted: bool = False
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``argmin_{x >= 0} 0.5 x^T H x - g^T x`` for every row of ``g`` (units x cells, the
    original cell order, or the structure's where ``permuted``) by the compiled active-set
    method of the module docstring. Returns ``(x, gradient H x - g, converged, steps)`` in the
    order of ``g`` (``steps``: the most any row took); rows not converged come back as zeros."""
    gp = np.ascontiguousarray(g if permuted else np.take(g, structure.perm, axis=1), dtype=np.float64)
    x, gradient = np.empty(gp.shape), np.empty(gp.shape)
    converged = np.empty(gp.shape[0], dtype=bool)
    steps = _orthant(gp, structure.inverses, structure.capacitance, structure.blocks, structure.offsets,
                     structure.factor, structure.factor_t, structure.hessian, structure.spread,
                     tol * structure.lipschitz, max_steps, START, np.array(DROP, dtype=np.float64),
                     x, gradient, converged, *_sizes(structure))
    if not permuted:
        order = np.argsort(structure.perm)
        x, gradient = np.take(x, order, axis=1), np.take(gradient, order, axis=1)
    return x, gradient, converged, int(steps)
