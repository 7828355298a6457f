"""The orthant projection ``argmin_{x >= 0} 0.5 x^T H x - g^T x`` by compiled active-set steps on
``H = D + V V^T (+ E)`` (:mod:`distfit.estimate.structure`, :class:`~distfit.estimate.structure.BlockLowRank`).

Free-cell systems (:func:`solve_free`), for each unit's free set ``F`` (``x_A = 0``):
``H_FF x_F = g_F`` is ``(D_FF + V_F V_F^T) x_F = g_F``, by Woodbury (Golub & Van Loan 2.1.4)

    ``z = D_FF^-1 g_F``,  ``S = I + V_F^T D_FF^-1 V_F`` (k x k, SPD, eigenvalues >= 1),
    ``x_F = D_FF^-1 (g_F - V_F w)``,  ``w = S^-1 V_F^T z``.

``D_FF^-1`` acts group by group through the inverse of the group's block restricted to its
free cells, tabulated once for every block type and free pattern (2^group cells patterns, zero
outside the pattern), and ``V_F^T D_FF^-1 V_F`` is the sum over groups of tabulated k x k
matrices. The gradient needs no product with ``H``: ``V^T x = w`` (``V_F^T x_F = V_F^T z - (S
- I) w``), so ``H x - g = D x + V w - g``.
``S`` is summed from the tabulated matrices' lower triangles packed into rows of
:data:`~distfit.estimate.structure.PACK`-aligned width (a group's term is whole vector adds: 0.26 us for PL94's 63 groups,
0.6 us summed entry by entry across the groups).

:func:`solve_orthant` runs the primal-dual active-set method of
:mod:`distfit.estimate.projection` with these solves in float64, unit by unit, in one compiled
loop (numba: per unit the method branches on its own free set, which numpy can only batch
through padded tables, temporary arrays and a float32 search; compiled, a step costs a few
passes over one unit's 252 cells, in cache). From the free set ``g H^-1 > START sqrt(diag
H^-1)`` (``H^-1 g`` by the same Woodbury solve, every cell free; or given by the caller, who
then gives ``x_u = H^-1 g`` in place of ``g``, :func:`solve_orthant`: PL94's cell queries are
``x_u``, :func:`distfit.estimate.projection.unconstrained_answers`), each
step solves on ``F``, frees the cells of ``A`` with a multiplier below ``-tol lambda_max max(1, ||x||_inf)`` and fixes
the cells of ``F`` at or below zero (in the first steps, below a fraction :data:`DROP` of their
standard deviation: most would go negative a step later). Between steps the groups whose
pattern changed update ``S``, ``z`` and ``V^T z`` one by one where at most :data:`SWAPS` did,
else the three are recomputed in full (measured on PL94: 70 pattern changes a unit, most in
the first two steps). When ``F`` settles, the solution is refined once (the residual ``H x -
g``; the correction by the same solve) and the KKT conditions checked on the refined gradient:
where they hold the result is the exact KKT point, as the dense method's, else the steps go on
from the corrected free set. The refinement is needed: PL94's ``H`` is ``D + V V^T`` off the
blocks only to 3.6e-12 of ``max |H|`` (a floor of singular values near 5e-13 beyond rank 6,
the plan's own rounding), which moves the structured solution by up to 5e-7. The residual is
``(D x + V V^T x - g) + E x`` with the defect ``E = H - D - V V^T`` kept in float32 (zero on
the blocks): the structured part in float64, ``E x`` over the rows of the nonzero cells in
float32, whose relative 6e-8 of a term ~1e-12 of ``H x`` lies far below float64's rounding of
``H x`` itself (the solutions agree with a dense float64 residual's to 1.4e-11 on PL94), at
half the memory traffic of the dense float64 rows (PL94: 1.1 us a unit instead of 1.9).
Units that do not settle in ``max_steps`` come back unconverged (the caller's dense method
takes them).

Layout for the compiler: the cells are held as ``i * groups + r`` (cell ``i`` of group ``r``),
the groups padded to a multiple of :data:`~distfit.estimate.structure.GROUP_ALIGN` (groups of no cell), and every
per-group s x s matrix (``D_r``, the full pattern's inverse, the current pattern's, updated as
patterns change) column-wise (``table[i * s + j, r]``), so every pass over the cells is a loop
over the groups that LLVM vectorises in whole vectors; no pass writes into one of its inputs
(the overlap check would fall back to scalar code: 18 us -> 14 us a unit when removed). The
sums over cells (``V^T z``, ``S``, dot products) are reassociated into vectorised partial sums
and the group products use fused multiply-adds: rounding-level differences, nothing else.
Each unit's row of ``g`` is read and its ``x`` written in their own (original) order through
the inverse permutation, the scattered side landing in the unit's cached vectors (in the
structure's order the two were 40% of the time), and with the solution come ``2 (0.5 x^T H x
- g^T x)`` and ``(x - H^-1 g)^T H (x - H^-1 g)`` (the projection's objective, see
:func:`solve_orthant`).

Measured (PL94, 4096 units; cycles counted in the kernel, 2.55 GHz): 4.9 steps, 2.1 full
recomputations and 6.1 single-group updates a unit; 29.0k cycles (11.4 us) a unit from the
unconstrained answers (measured with ``E x_u`` a float32 product for every unit, 2 us a unit
outside the kernel; now formed in it only where a KKT check fails): starting ``g`` 2.2k, the
first free set 3.1k, the steps 15k (Cholesky of ``S`` to ``x`` 4.8k, gradient 1.8k, next free
set 2.3k, pattern updates 6.4k), the refinement 6.4k (its ``E x`` 3.5k), ``x`` written 1.0k. From ``g``, against session 8's
kernel in the same process (alternating, CPU time, best of 6): 11.3 against 13.5 us a unit
(session 8 measured 12.4-14.0; session 7's scalar kernel 16.7-19.8, the numpy version before
it 31-36). The entry points have one signature each, the sizes ``s`` and ``k`` run-time
arguments (docs/compiled.md): compiled once for every structure into numba's on-disk cache
(``python -m distfit.estimate.warm``; 0.2-0.5 s to load in a new process); the passes over the
groups keep one version a group size (:func:`_blocks`, :func:`_next`), the same floating-point
operations in the same order as the kernels specialised on ``(s, k)`` before (bit for bit on PL94
and four synthetic structures).
"""
from __future__ import annotations

import numpy as np

from distfit.estimate.compiled import jit, kernel
from distfit.estimate.structure import MAX_GROUP_CELLS, BlockLowRank

__all__ = ["DROP", "KERNELS", "START", "SWAPS", "solve_free", "solve_orthant"]

#: The first free set: cells whose unconstrained estimate ``g H^-1`` exceeds this many of its
#: standard deviations ``sqrt(diag H^-1)`` (measured on PL94 with DROP: 5.1 steps a unit at
#: 0.5, 5.2 at 0.75; session 9, again best of 0.3-1.0).
START = 0.5
#: In the first steps, free cells below these fractions of their standard deviation
#: ``sqrt(diag H^-1)`` leave the free set (most go negative a step later; measured on PL94:
#: 5.1 steps a unit instead of 5.7); later steps, and the KKT check, use 0.
DROP = (0.3, 0.1)
#: At most this many groups changing pattern in a step are updated one by one (measured on
#: PL94: 70 changes a unit in 5 steps, most in the first two; more are recomputed in full;
#: session 9: 4-32 all within noise).
SWAPS = 8


@jit
def _cholesky(packed, lower, k):
    """Lower Cholesky factor of ``S = I + P``, ``P`` given by its packed lower triangle (entry
    ``(a, b)``, ``b <= a``, at ``a (a + 1) / 2 + b``), the diagonal stored inverted."""
    for j in range(k):
        p = 1.0 + packed[j * (j + 1) // 2 + j]
        for m in range(j):
            p -= lower[j, m] * lower[j, m]
        lower[j, j] = 1.0 / np.sqrt(p)  # S = I + PSD: pivots >= 1
        for i in range(j + 1, k):
            v = packed[i * (i + 1) // 2 + j]
            for m in range(j):
                v -= lower[i, m] * lower[j, m]
            lower[i, j] = v * lower[j, j]


@jit
def _cholesky_solve(lower, t, k):
    """``t <- S^-1 t`` from :func:`_cholesky`'s factor (forward, then back substitution)."""
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


@jit
def _couple(vt, t, c, k):
    """``c = V t`` on every cell: each cell's sum ``((0 + t_0 v_0) + t_1 v_1) + ...`` in the
    rank's order, term ``b`` added to every cell in one vectorised pass."""
    for cell in range(c.size):
        c[cell] = 0.0
    for b in range(k):
        tb = t[b]
        for cell in range(c.size):
            c[cell] += tb * vt[b, cell]


@jit(fastmath=("reassoc", "contract"))
def _dots(vt, z, t, k):
    """``t = V^T z``, each sum reassociated into vectorised partial sums (rounding only)."""
    for b in range(k):
        v = 0.0
        for cell in range(z.size):
            v += vt[b, cell] * z[cell]
        t[b] = v


@jit(fastmath=("reassoc", "contract"))
def _dot(a, b):
    """``a . b``, reassociated as :func:`_dots`."""
    v = 0.0
    for i in range(a.size):
        v += a[i] * b[i]
    return v


def _blocks_of(s):
    """:func:`_blocks` for groups of ``s`` cells, ``s`` a compile-time constant (the loop over a
    group's cells unrolls; the groups' loop vectorises with the sums in registers)."""
    @jit(fastmath=("contract",))
    def blocks(table, base, shift, rhs, sign, out, groups):
        for i in range(s):
            for r in range(groups):
                v = 0.0
                for j in range(s):
                    v += table[i * s + j, r] * rhs[j * groups + r]
                out[i * groups + r] = (base[i * groups + r] - shift[i * groups + r]) + sign * v
    return blocks


_BLOCKS_1, _BLOCKS_2, _BLOCKS_3, _BLOCKS_4, _BLOCKS_5, _BLOCKS_6 = (_blocks_of(s) for s in range(1, MAX_GROUP_CELLS + 1))


@jit(fastmath=("contract",))
def _blocks(table, base, shift, rhs, sign, out, groups, s):
    """``out = (base - shift) + sign T rhs`` group by group, with group ``r``'s s x s matrix
    ``T_r`` held in column ``r`` of ``table`` (``table[i * s + j, r]``): every loop runs over
    the groups, vectorised, with fused multiply-adds, each cell's sum ``(0 + T_i0 rhs_0) +
    T_i1 rhs_1 + ...`` in ``j``'s order (``out`` must be none of the inputs: an overlap check
    would fall back to the scalar loop). One version a group size."""
    if s == 4:
        _BLOCKS_4(table, base, shift, rhs, sign, out, groups)
    elif s == 1:
        _BLOCKS_1(table, base, shift, rhs, sign, out, groups)
    elif s == 2:
        _BLOCKS_2(table, base, shift, rhs, sign, out, groups)
    elif s == 3:
        _BLOCKS_3(table, base, shift, rhs, sign, out, groups)
    elif s == 5:
        _BLOCKS_5(table, base, shift, rhs, sign, out, groups)
    else:
        _BLOCKS_6(table, base, shift, rhs, sign, out, groups)


@jit
def _absmax(x):
    """``max(1, ||x||_inf)`` in four independent chains (max is associative: exact)."""
    cells = x.size
    body = cells - cells % 4
    a0 = a1 = a2 = a3 = 1.0
    for cell in range(0, body, 4):
        a0 = max(a0, abs(x[cell]))
        a1 = max(a1, abs(x[cell + 1]))
        a2 = max(a2, abs(x[cell + 2]))
        a3 = max(a3, abs(x[cell + 3]))
    for cell in range(body, cells):
        a0 = max(a0, abs(x[cell]))
    return max(max(a0, a1), max(a2, a3))


@jit
def _load(current, inverses, q, r, s):
    """Column ``r`` of ``current`` <- row ``q`` of ``inverses`` (group ``r``'s new pattern)."""
    for e in range(s * s):
        current[e, r] = inverses[q, e]


@jit
def _apply(table, q, rhs, r, groups, out, s):
    """``out_r = table[q] rhs_r`` on group ``r``'s cells (one tabulated s x s matrix)."""
    for i in range(s):
        v = 0.0
        for j in range(s):
            v += table[q, i * s + j] * rhs[j * groups + r]
        out[i * groups + r] = v


@jit
def _capacitance(pattern, offsets, capacitance, packed):
    """``packed = sum_r (V_p^T D_p^-1 V_p)`` over the groups, packed lower triangles (the empty
    pattern's rows are zeros): one contiguous row added a group, a vectorised add."""
    packed[:] = 0.0
    for r in range(pattern.size):
        q = offsets[r] + pattern[r]
        for e in range(packed.size):
            packed[e] += capacitance[q, e]


def _next_of(s):
    """:func:`_next`'s patterns for groups of ``s`` cells, ``s`` a compile-time constant (the
    loop over a group's cells unrolls, the groups' loop vectorises)."""
    @jit
    def next_patterns(pattern, new, x, gradient, spread, floor, threshold, groups):
        for r in range(groups):
            bits = 0
            for i in range(s):
                cell = i * groups + r
                fixed = 1 - ((pattern[r] >> i) & 1)
                bits |= (np.int64(x[cell] > floor * spread[cell])
                         | (fixed & np.int64(gradient[cell] < -threshold))) << i
            new[r] = bits
    return next_patterns


_NEXT_1, _NEXT_2, _NEXT_3, _NEXT_4, _NEXT_5, _NEXT_6 = (_next_of(s) for s in range(1, MAX_GROUP_CELLS + 1))


@jit
def _next(pattern, new, x, gradient, spread, floor, threshold, groups, s):
    """The next free set's patterns (cells of ``F`` with ``x`` above ``floor`` of their spread
    stay, cells of ``A`` with a multiplier below ``-threshold`` join), branch-free over the
    cells, by the version for groups of ``s`` cells; how many groups changed."""
    if s == 4:
        _NEXT_4(pattern, new, x, gradient, spread, floor, threshold, groups)
    elif s == 1:
        _NEXT_1(pattern, new, x, gradient, spread, floor, threshold, groups)
    elif s == 2:
        _NEXT_2(pattern, new, x, gradient, spread, floor, threshold, groups)
    elif s == 3:
        _NEXT_3(pattern, new, x, gradient, spread, floor, threshold, groups)
    elif s == 5:
        _NEXT_5(pattern, new, x, gradient, spread, floor, threshold, groups)
    else:
        _NEXT_6(pattern, new, x, gradient, spread, floor, threshold, groups)
    changed = 0
    for r in range(groups):
        changed += np.int64(new[r] != pattern[r])
    return changed


@jit
def _swap(r, old, new, offsets, inverses, capacitance, factor, gu, z, current, acc, tacc, groups, s, k):
    """Group ``r`` goes from pattern ``old`` to ``new``: ``S`` and ``t = V^T z`` updated by its
    terms, its inverse loaded and ``z_r = D_p^-1 g_r`` recomputed."""
    q0, q1 = offsets[r] + old, offsets[r] + new
    for e in range(acc.size):
        acc[e] += capacitance[q1, e] - capacitance[q0, e]
    for i in range(s):
        cell = i * groups + r
        for b in range(k):
            tacc[b] -= z[cell] * factor[cell, b]
    _load(current, inverses, q1, r, s)
    _apply(inverses, q1, gu, r, groups, z, s)
    for i in range(s):
        cell = i * groups + r
        for b in range(k):
            tacc[b] += z[cell] * factor[cell, b]


@jit
def _reload(pattern, new, offsets, inverses, capacitance, vt, gu, z, current, zero, acc, tacc, groups, s, k):
    """Every group takes its ``new`` pattern: inverses loaded where it changed, then ``z =
    D_FF^-1 g``, ``t = V^T z`` and ``S`` recomputed in full (cheaper than :func:`_swap` once
    more than :data:`SWAPS` groups change)."""
    for r in range(groups):
        if new[r] != pattern[r]:
            pattern[r] = new[r]
            _load(current, inverses, offsets[r] + pattern[r], r, s)
    _blocks(current, zero, zero, gu, 1.0, z, groups, s)
    _dots(vt, z, tacc, k)
    _capacitance(pattern, offsets, capacitance, acc)


@jit(fastmath=("contract",))
def _defect(defect, x, residual, rows, small):
    """``residual += E x`` from the rows of ``E`` (float32, symmetric: rows are columns) of the
    cells with ``x != 0``, four rows a pass, summed in float32: ``E`` is ~1e-12 of ``H``
    (PL94: 3.6e-12), so float32's relative 6e-8 of ``E x`` lies far below the float64
    rounding of ``H x``, and the rows cost half the memory traffic of float64 ones."""
    count = 0
    for i in range(x.size):
        if x[i] != 0.0:
            rows[count] = i
            count += 1
    for cell in range(x.size):
        small[cell] = 0.0
    body = count - count % 4
    for m in range(0, body, 4):
        a, b, c, d = rows[m], rows[m + 1], rows[m + 2], rows[m + 3]
        xa, xb, xc, xd = np.float32(x[a]), np.float32(x[b]), np.float32(x[c]), np.float32(x[d])
        for cell in range(x.size):
            small[cell] += (xa * defect[a, cell] + xb * defect[b, cell]) + (xc * defect[c, cell]
                                                                            + xd * defect[d, cell])
    for m in range(body, count):
        a = rows[m]
        xa = np.float32(x[a])
        for cell in range(x.size):
            small[cell] += xa * defect[a, cell]
    for cell in range(x.size):
        residual[cell] += small[cell]


@jit(fastmath=("reassoc", "contract"))
def _row_dot(defect, i, deviation):
    """``E_i . deviation`` (``E`` row ``i`` and ``deviation`` float32, summed reassociated)."""
    v = np.float32(0.0)
    for j in range(deviation.size):
        v += defect[i, j] * deviation[j]
    return np.float64(v)


@jit
def _defect_rows(defect, x, deviation, residual):
    """``residual_i += E_i . deviation`` on the cells with ``x_i != 0`` (the free ones)."""
    for i in range(x.size):
        if x[i] != 0.0:
            residual[i] += _row_dot(defect, i, deviation)


@kernel("int64(float64[:, :], boolean, int64[::1], float64[:, ::1], float64[:, ::1], float64[:, ::1], "
        "float64[:, ::1], int64[::1], float64[:, ::1], float64[:, ::1], float32[:, ::1], float64[::1], float64[::1], "
        "float64, int64, float64, float64[::1], int64, float64[:, :], float64[:, ::1], boolean[::1], float64[:, :], "
        "int64, int64)")
def _orthant(g, given, place, inverses, capacitance, blocks_t, full_t, offsets, factor, vt, defect, rowmax, spread,
             tol_scale, max_steps, start, drop, swaps, x_out, gradient_out, converged, values, s, k):
    """The active-set method of the module docstring on every row of ``g``; ``s``, ``k``: the
    cells of a group and the rank (run-time sizes: one compilation serves every structure).
    Group ``r``'s s x s matrices are held in column ``r`` of ``blocks_t`` (``D_r``), ``full_t``
    (``D_r^-1``) and a working table of the current patterns' inverses, so that every pass
    over the cells is vectorised over the groups. Writes ``x``, the gradient, whether each row
    converged and ``values`` (:func:`solve_orthant`; the gradient only where ``gradient_out``
    has rows); returns the most steps. Rows of ``g``, ``x`` and the gradient are in the
    original order, cell ``c`` at position ``place[c]`` of the structure's: permuted here, each
    row read and written in its own order (the scattered accesses land in the unit's cached
    vectors: in the structure's order, the gather and the scatter were 40% of the time).
    Where ``given``, the rows of ``g`` are the unconstrained solutions ``x_u = H^-1 g``: no first
    solve, and the steps run on ``g' = (D + V V^T) x_u``, the refinement's residual on the free
    cells made exact with ``E (x - x_u)`` (:func:`solve_orthant`); ``E x_u`` itself is formed only
    for a unit whose KKT check then fails (the steps go on with the exact ``g``)."""
    n, real = g.shape
    cells = spread.size  # the positions, padding included
    keep = gradient_out.shape[0] > 0
    groups = cells // s
    full = (1 << s) - 1
    pattern = np.empty(groups, np.int64)
    new = np.empty(groups, np.int64)
    rows = np.empty(cells, np.int64)
    small = np.empty(cells, np.float32)
    current = np.empty((s * s, groups))
    zero = np.zeros(cells)
    acc, lower, lower_full = np.empty(capacitance.shape[1]), np.empty((k, k)), np.empty((k, k))
    # zeros: the padding's entries are never written from a row, and stay 0
    z, x, c, gradient = np.zeros(cells), np.zeros(cells), np.zeros(cells), np.zeros(cells)
    residual, z2, d, unconstrained = np.zeros(cells), np.zeros(cells), np.zeros(cells), np.zeros(cells)
    t, tacc = np.empty(k), np.empty(k)
    deviation = np.zeros(cells, np.float32)  # x - x_u, for E (x - x_u)
    start32 = np.zeros(cells, np.float32)  # x_u, for E x_u where it is needed
    resolved = np.zeros(cells, np.bool_)
    new[:] = full
    _capacitance(new, offsets, capacitance, acc)
    _cholesky(acc, lower_full, k)
    pattern[:] = 0
    current[:, :] = 0.0  # the empty pattern's inverses
    most = 0
    gu = np.zeros(cells)
    for u in range(n):
        exact = not given  # whether gu is H x_u itself, E x_u included
        if given:  # g' = (D + V V^T) x_u: H x_u but for E x_u
            for cell in range(real):  # in the rows' order: they stream in, the scattered writes hit the cache
                unconstrained[place[cell]] = g[u, cell]
            _dots(vt, unconstrained, t, k)
            _couple(vt, t, c, k)
            _blocks(blocks_t, c, zero, unconstrained, 1.0, gu, groups, s)
        else:  # the first solve: x_u = H^-1 g (every cell free)
            for cell in range(real):
                gu[place[cell]] = g[u, cell]
            _blocks(full_t, zero, zero, gu, 1.0, z, groups, s)
            _dots(vt, z, t, k)
            _cholesky_solve(lower_full, t, k)
            _couple(vt, t, c, k)
            _blocks(full_t, z, zero, c, -1.0, unconstrained, groups, s)
        # the first free set: x_u above START of its spread
        x[:] = unconstrained
        new[:] = 0
        for i in range(s):
            for r in range(groups):
                new[r] |= np.int64(x[i * groups + r] > start * spread[i * groups + r]) << i
        for r in range(groups):
            if new[r] != pattern[r]:  # the table holds the previous row's patterns
                pattern[r] = new[r]
                _load(current, inverses, offsets[r] + pattern[r], r, s)
        _blocks(current, zero, zero, gu, 1.0, z, groups, s)
        _dots(vt, z, tacc, k)
        _capacitance(pattern, offsets, capacitance, acc)
        steps = 0
        done = False
        while steps < max_steps:
            steps += 1
            _cholesky(acc, lower, k)
            t[:] = tacc
            _cholesky_solve(lower, t, k)
            _couple(vt, t, c, k)
            _blocks(current, z, zero, c, -1.0, x, groups, s)  # x_F = D_FF^-1 (g_F - c_F)
            _blocks(blocks_t, c, gu, x, 1.0, gradient, groups, s)  # c - g + D x
            floor = drop[steps - 1] if steps <= drop.size else 0.0
            changed = _next(pattern, new, x, gradient, spread, floor, tol_scale * _absmax(x), groups, s)
            if changed > swaps:
                _reload(pattern, new, offsets, inverses, capacitance, vt, gu, z, current, zero, acc, tacc,
                        groups, s, k)
            elif changed:
                for r in range(groups):
                    if new[r] != pattern[r]:
                        _swap(r, pattern[r], new[r], offsets, inverses, capacitance, factor, gu, z, current, acc,
                              tacc, groups, s, k)
                        pattern[r] = new[r]
            if changed:
                continue
            # settled: one refinement step, then the KKT check. H x - g = (D x + V V^T x - g) + E x
            # (exact g), = (D + V V^T)(x - x_u) + E (x - x_u) (g' from x_u): the structured part in
            # float64, E's in float32, on the free cells' rows (the fixed cells' below)
            _dots(vt, x, t, k)
            _couple(vt, t, c, k)
            _blocks(blocks_t, c, gu, x, 1.0, residual, groups, s)
            norm = 0.0
            if exact:
                _defect(defect, x, residual, rows, small)
            else:
                for cell in range(cells):
                    deviation[cell] = np.float32(x[cell] - unconstrained[cell])
                    norm += abs(x[cell] - unconstrained[cell])
                _defect_rows(defect, x, deviation, residual)
            _blocks(current, zero, zero, residual, 1.0, z2, groups, s)
            _dots(vt, z2, t, k)
            _cholesky_solve(lower, t, k)
            _couple(vt, t, c, k)
            _blocks(current, z2, zero, c, -1.0, d, groups, s)  # the correction d
            for cell in range(cells):
                x[cell] -= d[cell]
            _blocks(blocks_t, residual, c, d, -1.0, gradient, groups, s)  # residual - H d = residual - c - D d
            threshold = tol_scale * _absmax(x)
            if not exact:  # a fixed cell's multiplier lacks (E (x - x_u))_i, at most rowmax_i |x - x_u|_1:
                for cell in range(cells):  # formed where that leaves its side of -threshold open
                    resolved[cell] = False
                    if x[cell] == 0.0 and gradient[cell] - rowmax[cell] * norm < -threshold <= \
                            gradient[cell] + rowmax[cell] * norm:
                        gradient[cell] += _row_dot(defect, cell, deviation)
                        resolved[cell] = True
            if not _next(pattern, new, x, gradient, spread, 0.0, threshold, groups, s):
                done = True
                break
            if not exact:  # the steps go on with g itself: g' + E x_u
                for cell in range(cells):
                    start32[cell] = np.float32(unconstrained[cell])
                for cell in range(cells):
                    gu[cell] += _row_dot(defect, cell, start32)
                exact = True
            _reload(pattern, new, offsets, inverses, capacitance, vt, gu, z, current, zero, acc, tacc, groups,
                    s, k)
        converged[u] = done
        most = max(most, steps)
        for cell in range(real):  # written in the output's order, gathered from the cache
            x_out[u, cell] = x[place[cell]] if done else 0.0
        if keep and done and not exact:  # the fixed cells' multipliers in full
            for cell in range(cells):
                if x[cell] == 0.0 and not resolved[cell]:
                    gradient[cell] += _row_dot(defect, cell, deviation)
        if keep:
            for cell in range(real):
                gradient_out[u, cell] = gradient[place[cell]] if done else 0.0
        for cell in range(cells):
            residual[cell] = gradient[cell] - gu[cell]
            z2[cell] = x[cell] - unconstrained[cell]
        values[u, 0] = (_dot(x, residual) if exact else np.nan) if done else 0.0
        values[u, 1] = _dot(z2, gradient) if done else 0.0
    return most


@kernel("void(float64[:, ::1], boolean[:, ::1], float64[:, ::1], float64[:, ::1], int64[::1], float64[:, ::1], "
        "float64[:, ::1], int64, int64)")
def _free_solve(g, free, inverses, capacitance, offsets, vt, x_out, s, k):
    """:func:`solve_free` on every row (the structure's order, padding included)."""
    n, cells = g.shape
    groups = cells // s
    pattern = np.empty(groups, np.int64)
    acc, lower = np.empty(capacitance.shape[1]), np.empty((k, k))
    z, c, t = np.empty(cells), np.empty(cells), np.empty(k)
    for u in range(n):
        for r in range(groups):
            bits = 0
            for i in range(s):
                bits |= np.int64(free[u, i * groups + r]) << i
            pattern[r] = bits
            _apply(inverses, offsets[r] + bits, g[u], r, groups, z, s)
        _capacitance(pattern, offsets, capacitance, acc)
        _cholesky(acc, lower, k)
        _dots(vt, z, t, k)
        _cholesky_solve(lower, t, k)
        _couple(vt, t, c, k)
        for r in range(groups):
            q = offsets[r] + pattern[r]
            for i in range(s):
                v = z[i * groups + r]
                for j in range(s):
                    v -= inverses[q, i * s + j] * c[j * groups + r]
                x_out[u, i * groups + r] = v


#: The entry points, for :func:`distfit.estimate.compiled.warm` (``python -m distfit.estimate.warm``).
KERNELS = (_orthant, _free_solve)


def solve_free(structure: BlockLowRank, g: np.ndarray, free: np.ndarray, dtype=np.float64) -> np.ndarray:
    """``x`` with ``H_FF x_F = g_F``, ``x_A = 0`` for every row (module docstring, Woodbury;
    ``E`` left out); ``g``, ``free`` (units x cells) in the original cell order; solved in
    float64, returned in ``dtype``."""
    place, positions = structure.place, structure.spread.size
    padded = np.zeros((g.shape[0], positions))
    padded[:, place] = g
    free_padded = np.zeros((g.shape[0], positions), dtype=bool)
    free_padded[:, place] = free
    x = np.empty_like(padded)
    _free_solve(padded, free_padded, structure.inverses, structure.capacitance,
                structure.offsets, structure.factor_t, x, structure.group_cells, structure.rank)
    return x[:, place].astype(dtype, copy=False)


def solve_orthant(structure: BlockLowRank, g: np.ndarray | None, *, tol: float, max_steps: int,
                  values: np.ndarray | None = None, out: np.ndarray | None = None,
                  gradient: bool = True, unconstrained: np.ndarray | None = None
                  ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray, int]:
    """``argmin_{x >= 0} 0.5 x^T H x - g^T x`` for every row of ``g`` (units x cells, the
    original cell order) by the compiled active-set
    method of the module docstring. Returns ``(x, gradient H x - g, converged, steps)`` in the
    order of ``g`` (``steps``: the most any row took); rows not converged come back as zeros.
    ``values`` (units x 2), if given, receives per row (0 where not converged) ``2 (0.5 x^T H x
    - g^T x) = x . (H x - g) - g . x`` and ``(x - x_u)^T H (x - x_u) = (x - x_u) . (H x - g)``
    with ``x_u = H^-1 g`` (the first solve's): twice the objective's rise above its
    unconstrained minimum, without the cancellation of the first form plus ``g . x_u``.
    ``out``: a float64 array (units x cells, rows of unit stride) to write ``x`` into; ``gradient``:
    False to skip the gradient (returned as None). ``unconstrained`` (in place of ``g``, which
    is then None): the rows ``x_u = H^-1 g`` (rows of unit stride), known to the caller
    (:func:`distfit.estimate.projection.project_nonnegative`: the answers to the cell queries
    of a plan whose only block measures every cell). No first solve, and ``E x_u`` (a dense
    product, 2 us a unit) is not formed: the steps run on ``g' = (D + V V^T) x_u``; at the
    settled free set the refinement's residual ``H x - g = (D + V V^T)(x - x_u) + E (x - x_u)``
    is exact on the free cells (``E``'s rows of the free cells, as for an exact ``g``), so ``x``
    is the exact solution on that set; a fixed cell's multiplier lacks ``(E (x - x_u))_i``, at
    most ``max_j |E_ij| ||x - x_u||_1`` (:attr:`~distfit.estimate.structure.BlockLowRank.defect_rowmax`),
    and is formed where that bound leaves open which side of ``-tol lambda_max max(1,
    ||x||_inf)`` it lies on, so the KKT decision is the exact one; a unit whose check fails goes
    on with ``g`` itself (``E x_u`` formed in the kernel). The gradient returned is then exact;
    ``values``: column 0 is NaN (it needs ``g . x``), column 1 lacks the fixed cells' share of
    ``(x - x_u)^T E (x - x_u)``, at most ``sum_{i fixed} |x_u,i| max_j |E_ij| ||x - x_u||_1``
    (PL94: ~1e-9 of the objective; the plan's ``H`` itself is ``D + V V^T`` to 3.6e-12)."""
    if unconstrained is not None:
        if g is not None:
            raise ValueError("solve_orthant: g or unconstrained, not both")
        g = np.asarray(unconstrained, dtype=np.float64)
        if g.strides[1] != 8:
            g = np.ascontiguousarray(g)
    else:
        g = np.ascontiguousarray(g, dtype=np.float64)
    x = np.empty(g.shape) if out is None else out
    gradients = np.empty(g.shape if gradient else (0, g.shape[1]))
    converged = np.empty(g.shape[0], dtype=bool)
    if values is None:
        values = np.empty((g.shape[0], 2))
    steps = _orthant(g, unconstrained is not None, structure.place, structure.inverses, structure.capacitance, structure.blocks_t, structure.full_t,
                     structure.offsets, structure.factor, structure.factor_t, structure.defect, structure.defect_rowmax, structure.spread,
                     float(tol * structure.lipschitz), int(max_steps), START, np.array(DROP, dtype=np.float64), SWAPS,
                     x, gradients, converged, values, structure.group_cells, structure.rank)
    return x, gradients if gradient else None, converged, int(steps)
