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
    ``x_F = D_FF^-1 (g_F - V_F S^-1 V_F^T z)``.

``D_FF^-1`` acts group by group through the inverse of the group's block restricted to its
free cells, tabulated once for every block type and free pattern (2^group cells patterns, zero
outside the pattern), and ``V_F^T D_FF^-1 V_F`` is the sum over groups of tabulated k x k
matrices: a count of (type, pattern) per unit times the table (one product); ``S`` is factored
by a Cholesky loop over its k columns for every unit at once. No system is gathered and every
array has the same shape for every unit: a step costs a few passes over the units x cells
array and products with ``V`` (cells x k). The gradient needs no product with ``H``: with
``w = S^-1 V_F^T z``, ``V^T x = w``, so ``H x - g = D x + V w - g``.

:func:`solve_orthant` runs the primal-dual active-set method of
:mod:`distfit.estimate.projection` with these solves, :data:`BATCH` units at a time (their
arrays stay in cache): a float32 search for the free set (multipliers judged at
:data:`SEARCH_TOL`; in the first steps, free cells below a fraction :data:`DROP` of their
standard deviation leave early), then the solution on the free set found refined twice in
mixed precision (float64 residuals, float32 corrections; the second residual with the dense
``H``) and the KKT conditions checked on the float64 gradient: where they hold the result is
the exact KKT point, as the dense method's (to 1e-13 relative on PL94); the few units where
they fail (a multiplier between the float32 and float64 thresholds) go on by float64 steps.

Measured (benchmarks/bench_projection.py, PL94, one BLAS thread, CPU time, loaded machine):
5.1 float32 steps a unit on average at about 4.5 us each, 7 us for the refinement and check,
1.3% of units on float64 steps; 33 us a unit in all, against 62 us in the same run for the
previous version (one batch, dense gradients, LAPACK's batched solves, float64 steps after
the search).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["BlockLowRank", "MAX_GROUP_CELLS", "MAX_RANK", "SEARCH_TOL", "STRUCTURE_CELLS", "block_low_rank",
           "solve_free", "solve_orthant"]

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
#: Multiplier threshold of the float32 search (relative, as ``tol`` of the float64 steps).
SEARCH_TOL = 1e-7
#: Float32 search steps at most (units still changing their free set, often by float32
#: rounding at a degenerate cell, go on by float64 steps).
SEARCH_STEPS = 12
#: Rows solved together: the arrays of one active-set step (about 5 KiB a row) stay in cache
#: (measured on PL94: 32 us a row in batches of 512, 48 us in one batch of 4096).
BATCH = 512
#: The first free set: cells whose unconstrained estimate ``g H^-1`` exceeds this many of its
#: standard deviations ``sqrt(diag H^-1)`` (measured on PL94 with DROP: 5.1 steps a unit at
#: 0.5, 5.2 at 0.75).
START = 0.5
#: In the first search steps, free cells below these fractions of their standard deviation
#: ``sqrt(diag H^-1)`` leave the free set (most go negative a step later; measured on PL94:
#: 5.1 steps a unit instead of 5.8); later steps, and the float64 check, use 0.
DROP = (0.3, 0.1)
#: Random three-way splits of the groups tried for the completion.
SPLITS = 8


@dataclass(frozen=True, eq=False)
class BlockLowRank:
    """``H = D + V V^T`` in a permuted cell order (:func:`block_low_rank`).

    ``perm`` (cells,): position ``j * groups + r`` holds cell ``perm[j * groups + r]``, the
    ``j``-th cell of group ``r``; ``group_cells``, ``groups``; ``factor`` V (cells x k, permuted
    order); ``types`` (groups,) the block type of each group (groups with equal blocks of ``D``
    and rows of ``V`` share one); ``blocks`` (group_cells^2, groups): entry ``(i * group_cells
    + j, r)`` of group ``r``'s block of ``D``; ``inverses`` (group_cells^2, types * 2^group_cells): entry
    ``(i * group_cells + j, t * 2^group_cells + p)`` of the inverse of type ``t``'s block
    restricted to pattern ``p`` (bit ``i`` of ``p``: cell ``i`` free), zero outside it;
    ``capacitance`` (types * 2^group_cells, k * k): ``V_p^T D_p^-1 V_p`` of each type and
    pattern; ``hessian`` the dense ``H`` in the permuted order; ``inverse`` ``H^-1`` (permuted),
    ``spread`` ``sqrt(diag H^-1)``; ``lipschitz`` ``lambda_max(H)``."""

    perm: np.ndarray
    group_cells: int
    groups: int
    factor: np.ndarray
    types: np.ndarray
    blocks: np.ndarray
    inverses: np.ndarray
    capacitance: np.ndarray
    hessian: np.ndarray
    inverse: np.ndarray
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
        """(groups,) the first column of each group's type in ``inverses``."""
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
        permuted = hessian[np.ix_(perm, perm)]
        full_inverse = np.linalg.inv(permuted)
        return BlockLowRank(
            perm=perm, group_cells=group_cells, groups=groups, factor=np.ascontiguousarray(factor[perm]),
            types=types, blocks=np.ascontiguousarray(blocks.reshape(groups, -1).T), inverses=np.ascontiguousarray(inverse.transpose(2, 3, 0, 1).reshape(group_cells ** 2, -1)),
            capacitance=capacitance.reshape(first.size * (1 << group_cells), -1), hessian=permuted,
            inverse=full_inverse, spread=np.sqrt(np.maximum(np.diag(full_inverse), 0.0)),
            lipschitz=float(values[-1]))
    return None


def _apply_planes(planes: np.ndarray, v: np.ndarray, size: int) -> np.ndarray:
    """Per unit and group, the tabulated s x s inverse times the group's values: ``planes``
    (s^2, units, groups), ``v`` (units, s, groups) -> (units, s, groups)."""
    out = np.empty(v.shape, dtype=np.result_type(planes, v))  # C order: reshapes stay views
    return np.einsum("ijug,ujg->uig", planes.reshape(size, size, *planes.shape[1:]), v, out=out)


def _factor(structure: BlockLowRank, free: np.ndarray, dtype) -> tuple[np.ndarray, np.ndarray]:
    """The parts of the Woodbury solve (module docstring) that depend on the free sets only:
    the tabulated ``D_FF^-1`` of every group (planes, s^2 x units x groups) and the Cholesky
    factor of ``S`` (units x k x k, :func:`_cholesky`); ``free`` (units x cells, permuted order)."""
    units, size, groups = free.shape[0], structure.group_cells, structure.groups
    cube = free.reshape(units, size, groups).view(np.uint8)
    bits = cube[:, 0].copy()
    for j in range(1, size):  # the pattern of each group, bit j: cell j free (one byte a group)
        bits |= cube[:, j] << j
    pattern = bits + structure.offsets
    planes = np.take(structure.inverses.astype(dtype, copy=False), pattern, axis=1)
    kinds = structure.capacitance.shape[0]
    counts = np.bincount((pattern + np.arange(units)[:, None] * kinds).ravel(), minlength=units * kinds)
    k = structure.rank
    system = (counts.reshape(units, kinds).astype(dtype) @ structure.capacitance.astype(dtype, copy=False))
    system = system.reshape(units, k, k)
    system[:, np.arange(k), np.arange(k)] += 1.0
    return planes, _cholesky(system)


def _cholesky(system: np.ndarray) -> np.ndarray:
    """Lower Cholesky factors of SPD ``system`` (units x k x k), every unit at once (a loop
    over the k columns: LAPACK's batched calls cost more than the arithmetic at k = 6), the
    diagonal stored inverted for :func:`_cholesky_solve`."""
    k = system.shape[1]
    lower = np.zeros_like(system)
    for j in range(k):
        pivot = system[:, j, j] - np.einsum("nk,nk->n", lower[:, j, :j], lower[:, j, :j])
        lower[:, j, j] = 1.0 / np.sqrt(pivot)  # S = I + PSD: pivots >= 1
        lower[:, j + 1:, j] = ((system[:, j + 1:, j] - np.einsum("nik,nk->ni", lower[:, j + 1:, :j], lower[:, j, :j]))
                               * lower[:, j, j][:, None])
    return lower


def _cholesky_solve(lower: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``S^-1 b`` for every row from :func:`_cholesky`'s factors (forward, then back substitution)."""
    k = b.shape[1]
    y = np.empty_like(b)
    for i in range(k):
        y[:, i] = (b[:, i] - np.einsum("nk,nk->n", lower[:, i, :i], y[:, :i])) * lower[:, i, i]
    x = np.empty_like(b)
    for i in range(k - 1, -1, -1):
        x[:, i] = (y[:, i] - np.einsum("nk,nk->n", lower[:, i + 1:, i], x[:, i + 1:])) * lower[:, i, i]
    return x


def _solve_factored(structure: BlockLowRank, planes: np.ndarray, lower: np.ndarray, g: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``x_F = D_FF^-1 (g_F - V_F w)``, 0 off ``F``, with ``w = S^-1 V_F^T D_FF^-1 g_F``, from
    :func:`_factor`; returns ``(x, V w)``. ``V^T x = w`` (``V_F^T x_F = V_F^T z - (S - I) w``),
    so ``H x = D x + V w``: the gradient costs one pass over the blocks (:func:`_gradient`)."""
    units, size, groups = g.shape[0], structure.group_cells, structure.groups
    dtype = planes.dtype
    z = _apply_planes(planes, g.astype(dtype, copy=False).reshape(units, size, groups), size).reshape(units, -1)
    factor = structure.factor.astype(dtype, copy=False)
    coupling = _cholesky_solve(lower, z @ factor) @ factor.T
    correction = _apply_planes(planes, coupling.reshape(units, size, groups), size)
    return z - correction.reshape(units, -1), coupling


def _gradient(structure: BlockLowRank, x: np.ndarray, coupling: np.ndarray, g: np.ndarray) -> np.ndarray:
    """``H x - g = D x + V (V^T x) - g`` with ``V (V^T x)`` given (``coupling``), in x's dtype."""
    units, size, groups = x.shape[0], structure.group_cells, structure.groups
    blocks = structure.blocks.astype(x.dtype, copy=False).reshape(size, size, groups)
    out = np.empty_like(x)
    np.einsum("ijg,ujg->uig", blocks, x.reshape(units, size, groups), out=out.reshape(units, size, groups))
    out += coupling
    out -= g
    return out


def solve_free(structure: BlockLowRank, g: np.ndarray, free: np.ndarray, dtype=np.float64) -> np.ndarray:
    """``x`` with ``H_FF x_F = g_F``, ``x_A = 0`` for every row (module docstring, Woodbury);
    ``g``, ``free`` (units x cells) in the permuted order of ``structure``; in ``dtype``."""
    planes, lower = _factor(structure, free, dtype)
    return _solve_factored(structure, planes, lower, g)[0]


def _changed(x: np.ndarray, gradient: np.ndarray, free: np.ndarray, threshold: np.ndarray, floor=0.0
             ) -> tuple[np.ndarray, np.ndarray]:
    """The next free set of the active-set method, ``{x > floor}`` and the cells of ``A`` whose
    multiplier is below ``-threshold``, and whether it equals ``free`` (per row)."""
    new_free = (x > floor) | (~free & (gradient < -threshold[:, None]))
    return new_free, (new_free == free).all(axis=1)


def _search(structure: BlockLowRank, g: np.ndarray, free: np.ndarray, max_steps: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """Float32 active-set steps from ``free`` (multipliers judged at :data:`SEARCH_TOL`).
    Returns ``(free, settled, x, steps)``: the last free set of every row, whether it settled,
    and where it did, the float32 solution on it (zeros elsewhere)."""
    n, cells = g.shape
    final_free, settled = np.empty_like(free), np.zeros(n, dtype=bool)
    x_out = np.zeros((n, cells), dtype=np.float32)
    active, ga = np.arange(n), g.astype(np.float32, copy=False)
    spread = structure.spread.astype(np.float32)
    steps = 0
    while active.size and steps < max_steps:
        steps += 1
        planes, lower = _factor(structure, free, np.float32)
        x, coupling = _solve_factored(structure, planes, lower, ga)
        # the largest entry is positive unless x <= 0: a cheaper scale than max |x|
        scale = np.float32(SEARCH_TOL * structure.lipschitz) * np.maximum(np.float32(1.0), x.max(axis=1))
        floor = spread * DROP[steps - 1] if steps <= len(DROP) else 0.0
        free, done = _changed(x, _gradient(structure, x, coupling, ga), free, scale, floor)
        if done.any():
            where, keep = active[done], np.flatnonzero(~done)
            x_out[where], final_free[where], settled[where] = x[done], free[done], True
            active, free, ga = active[keep], np.take(free, keep, axis=0), np.take(ga, keep, axis=0)
    final_free[active] = free
    return final_free, settled, x_out, steps


def _refine(structure: BlockLowRank, g: np.ndarray, free: np.ndarray, x: np.ndarray, tol: float
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mixed-precision iterative refinement (Wilkinson; Higham, *Accuracy and Stability*, 12.1)
    of the float32 solution ``x`` on ``free``: twice the float64 residual ``r = H x - g`` and
    the correction ``H_FF^-1 r_F`` solved with float32 factors. The first residual uses the
    form ``D x + V (V^T x)`` (exact to ~1e-11 relative, half the cost), the second the dense
    ``H``; the gradient after the last correction ``d`` is ``r - H d`` (``d`` is ~1e-9 of
    ``x``: ``H d`` in float32 through the form suffices). Then the KKT check of the module
    docstring on that gradient (stationarity on ``free`` is what the refinement achieves).
    Returns ``(x, gradient, next free set, kkt)``: rows failing the check go on from
    the next free set."""
    planes, lower = _factor(structure, free, np.float32)  # recomputed: cheaper than kept
    x = x.astype(np.float64)
    residual = _gradient(structure, x, (x @ structure.factor) @ structure.factor.T, g)
    x -= _solve_factored(structure, planes, lower, residual.astype(np.float32))[0]
    residual = x @ structure.hessian - g
    correction, coupling = _solve_factored(structure, planes, lower, residual.astype(np.float32))
    x -= correction
    gradient = residual - _gradient(structure, correction, coupling, 0.0)  # H d = D d + V w
    scale = tol * structure.lipschitz * np.maximum(1.0, np.abs(x).max(axis=1))
    new_free, kkt = _changed(x, gradient, free, scale)
    return x, gradient, new_free, kkt


def _steps(structure: BlockLowRank, g: np.ndarray, free: np.ndarray, dtype, tol: float, max_steps: int,
           ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    """Active-set steps (:func:`distfit.estimate.projection` docstring) on the rows of ``g``
    from ``free`` in ``dtype`` (float64: the solution of the settled free set refined once,
    the correction in float32). Returns ``(x, gradient, free, converged, steps)``."""
    hessian = structure.hessian.astype(dtype, copy=False)
    out, gradient = np.zeros(g.shape), np.zeros(g.shape)
    converged = np.zeros(g.shape[0], dtype=bool)
    final_free = free.copy()
    active = np.arange(g.shape[0])
    ga = g.astype(dtype)
    steps = 0
    while active.size and steps < max_steps:
        steps += 1
        x = solve_free(structure, ga, free, dtype)
        grad = x @ hessian - ga
        scale = tol * structure.lipschitz * np.maximum(1.0, np.abs(x).max(axis=1))
        new_free, settled = _changed(x, grad, free, scale)
        if dtype == np.float64 and settled.any():
            # one step of mixed-precision refinement: removes the rounding of the form
            # D + V V^T (H's own, ~1e-12 relative) from x_F
            x[settled] -= solve_free(structure, grad[settled], free[settled], np.float32)
        where = active[settled]
        out[where], gradient[where], converged[where] = x[settled], grad[settled], True
        final_free[active] = new_free
        keep = ~settled
        active, free, ga = active[keep], new_free[keep], ga[keep]
    return out, gradient, final_free, converged, steps


def solve_orthant(structure: BlockLowRank, g: np.ndarray, *, tol: float, max_steps: int, permuted: bool = False
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``argmin_{x >= 0} 0.5 x^T H x - g^T x`` for every row of ``g`` (units x cells, the
    original cell order, or the structure's where ``permuted``): float32 search from the free
    set ``g H^-1 > START sqrt(diag H^-1)``, refined in float64 and checked against the dense
    ``H``; the rows the search did not settle, and any that fail the check, go on by float64
    steps (module docstring). Rows go :data:`BATCH` at a time. Returns ``(x, gradient H x - g,
    converged, steps)`` in the order of ``g``; rows not converged come back as zeros."""
    gp = g if permuted else np.take(g, structure.perm, axis=1)
    x, gradient = np.empty(gp.shape), np.empty(gp.shape)
    converged = np.empty(gp.shape[0], dtype=bool)
    steps = 0
    for lo in range(0, gp.shape[0], BATCH):  # cache blocking: a batch's arrays stay in cache
        rows = slice(lo, lo + BATCH)
        x[rows], gradient[rows], converged[rows], batch_steps = _solve_batch(structure, gp[rows], tol, max_steps)
        steps = max(steps, batch_steps)
    if not permuted:
        order = np.argsort(structure.perm)
        x, gradient = np.take(x, order, axis=1), np.take(gradient, order, axis=1)
    return x, gradient, converged, steps


def _solve_batch(structure: BlockLowRank, g: np.ndarray, tol: float, max_steps: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """:func:`solve_orthant` on one batch of rows, in the structure's order."""
    g32 = g.astype(np.float32)
    start = g32 @ structure.inverse.astype(np.float32) > START * structure.spread
    free, settled, x32, searched = _search(structure, g32, start, min(max_steps, SEARCH_STEPS))
    # every row at once (the few the search did not settle, from zero: discarded below)
    x, gradient, refined, kkt = _refine(structure, g, free, x32, tol)
    converged = settled & kkt
    refined[~settled] = free[~settled]
    rest = np.flatnonzero(~converged)
    steps = 0
    if rest.size:
        x[rest], gradient[rest], _free, converged[rest], steps = _steps(
            structure, g[rest], refined[rest], np.float64, tol, max_steps)
    return x, gradient, converged, searched + steps
