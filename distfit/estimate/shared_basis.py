"""The hierarchy's passes in a basis shared by every level's information: d scalar trees (pure numpy).

docs/design.md section 7 ("Commuting levels: the passes in a shared eigenbasis"); the passes are
:mod:`distfit.estimate.hierarchy`'s (Cumings-Menon, arXiv 2404.13164), whose module docstring
states every formula used here.

When. The levels' information matrices ``J_l`` (every distinct one of every level) commute, i.e.
one orthonormal ``Q`` (d x d) diagonalises them all: ``Q^T J_l Q = diag(lambda_l)``. That is the
case whenever every level measures the same queries with the same plan up to a scale (PL94 at
every geography level, ``pipelines/us_pl94.yaml``: ``J_l = c_l J``), and more generally whenever
the plans are functions of one matrix. :func:`shared_basis` finds ``Q`` (or says there is none);
:func:`diagonal_in` checks one ``J`` against it.

Why it decouples. Every matrix of the passes is built from the ``J_l`` by sums, products,
pseudo-inverses and null-space projectors (``I_c``, ``S_p``, ``N_p``, ``K_p``, ``G_c``, ``P_c``,
``O_c``), and each of these operations maps matrices diagonal in ``Q`` to matrices diagonal in
``Q`` (a pseudo-inverse of ``Q diag(v) Q^T`` is ``Q diag(v^+) Q^T``, its null projector ``Q
diag(1[v = 0]) Q^T``: null spaces are spans of columns of ``Q``). So in the coordinates ``x~ =
Q^T x``, ``h~ = Q^T h`` the tree is d independent scalar trees, one per column ``k`` of ``Q``,
and each formula of the module docstring is its scalar form, vectorised over units x d arrays:
``I_c,k`` per unit and direction, ``S_p,k = sum_c I_c,k^+``, ``N_p,k`` = the number of children
with ``I_c,k = 0``, ``K_p,k = S_p,k^-1`` where no child is blind in direction ``k`` (else 0),
``G_c,k = I_c,k^+ K_p,k + 1[I_c,k = 0] N_p,k^-1 (1 - S_p,k K_p,k)``, and so on. Rank decisions are
:func:`distfit.estimate.hierarchy.psd_pinv`'s on the diagonal: ``v_k`` counts as 0 when at most
``rtol`` times the largest ``|v|`` of its unit (the floor 1 of a sum of projectors likewise), which
are the eigenvalues the general path decomposes, so both paths take the same decisions and agree
to rounding (``tests/estimate/test_shared_basis.py``: against the general path and a dense GLS).

``split="total"``. The weights are the children's estimated totals ``1^T x_c = (Q^T 1)^T x~_c``
of the equal split, one number per child, and the rescaled part is the blind part of ``G_c r``:
the children's blind directions are the same columns of ``Q`` for every sibling (the condition
of the rule, ``N_p,k`` in ``{0, fanout}`` for every ``k``), so the rule is the general path's.

Cost. The basis once (a few d x d eigendecompositions); per unit ``O(d)`` numbers and operations,
no class matrices, plus the changes of basis of ``h`` and of the returned ``x`` (units x d times d
x d, BLAS-3) and the query variances ``var(a^T x_u) = sum_k (Q^T a)_k^2 P_u,k`` (units x d times d
x queries: :func:`diagonal_variances`). The result holds per unit the diagonals of ``P_u``, ``O_u``
and ``I_u`` in ``Q`` (units x d each), and ``x`` in the original basis.

Leaves of one ``J`` (the finest level below the roots, every unit measured alike: the blocks).
Their ``I`` is one row, so ``G_c``, ``P_c`` and ``O_c`` are their parent's (computed per parent;
the leaves' class is their parent), their means are never formed (the parents need only ``M_p =
I^+ Q^T sum_c h_c``) and ``x_c = Q (m~_c + G r) = J^+ h_c + Q (G r)_p``: one d x d product a leaf.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["SHARED_ATOL", "DiagonalUpward", "blind", "diagonal_downward", "diagonal_in", "diagonal_upward",
           "diagonal_variances", "level_diagonals", "shared_basis", "stack_diagonals"]

#: ``J`` is diagonal in ``Q`` when every off-diagonal entry of ``Q^T J Q`` is at most this times
#: ``J``'s largest absolute entry on the diagonal (rounding of exactly commuting matrices is ~1e-15).
SHARED_ATOL = 1e-10
#: :func:`shared_basis`: eigenvalues of one ``J`` this close (relative to its largest) are one
#: eigenspace, refined by the next ``J``.
SAME_EIGENVALUE = 1e-8
#: :func:`shared_basis` tries at most this many distinct matrices (more: the general path).
MAX_DISTINCT = 64
#: ``split="total"``: hierarchy.TOTAL_FLOOR (the same rule).
TOTAL_FLOOR = 1e-9


def _sym(a: np.ndarray) -> np.ndarray:
    return 0.5 * (a + np.swapaxes(a, -1, -2))


def _distinct(j: np.ndarray) -> tuple[np.ndarray, np.ndarray] | None:
    """``(distinct (k x d x d), index (units,))`` of a level's information (d x d, or units x d x
    d), or None when there are more than :data:`MAX_DISTINCT`."""
    if j.ndim == 2:
        return j[None], np.zeros(1, dtype=np.int64)
    flat = np.ascontiguousarray(j).reshape(j.shape[0], -1)
    distinct, index = np.unique(flat, axis=0, return_inverse=True)
    if distinct.shape[0] > MAX_DISTINCT:
        return None
    return distinct.reshape(-1, *j.shape[1:]), index.reshape(-1).astype(np.int64)


def shared_basis(information: Sequence[np.ndarray]) -> np.ndarray | None:
    """An orthonormal ``Q`` (d x d, columns the basis) in which every level's information (each d
    x d or units x d x d) is diagonal to :data:`SHARED_ATOL`, or None when there is none (the
    matrices do not commute, or more than :data:`MAX_DISTINCT` distinct ones). Found by refining:
    the eigenvectors of the first matrix, then within each of its eigenspaces (eigenvalues equal
    to :data:`SAME_EIGENVALUE`) those of the next, and so on (degenerate eigenspaces, as marginal
    workloads have, split by the matrices that separate them), then checked against every matrix."""
    matrices = []
    for j in information:
        found = _distinct(_sym(np.asarray(j, dtype=np.float64)))
        if found is None:
            return None
        matrices.extend(found[0])
    if not matrices:
        return None
    d = matrices[0].shape[0]
    q = np.eye(d)
    clusters = [np.arange(d)]
    for a in matrices:
        scale = np.abs(a).max(initial=0.0)
        if scale == 0.0:
            continue
        if all(cols.size == 1 for cols in clusters):
            break
        rotated = _sym(q.T @ (a / scale) @ q)
        refined = []
        for cols in clusters:
            if cols.size == 1:
                refined.append(cols)
                continue
            block = rotated[np.ix_(cols, cols)]
            values = np.diagonal(block)
            if np.abs(block - np.diag(values)).max() <= SHARED_ATOL:  # already diagonal (e.g. J_l = c_l J)
                order = np.argsort(values, kind="stable")
                cols, values = cols[order], values[order]
            else:
                values, vectors = np.linalg.eigh(block)
                q[:, cols] = q[:, cols] @ vectors
            refined.extend(np.split(cols, np.flatnonzero(np.diff(values) > SAME_EIGENVALUE) + 1))
        clusters = refined
    if any(diagonal_in(a, q) is None for a in matrices):
        return None
    return q


def diagonal_in(j: np.ndarray, basis: np.ndarray) -> np.ndarray | None:
    """The diagonal of ``Q^T J Q`` (d,) when ``J`` (d x d) is diagonal in ``basis`` to
    :data:`SHARED_ATOL`, else None."""
    b = _sym(basis.T @ j @ basis)
    diagonal = np.diagonal(b).copy()
    off = np.abs(b - np.diag(diagonal)).max(initial=0.0)
    return diagonal if off <= SHARED_ATOL * np.abs(diagonal).max(initial=0.0) else None


def stack_diagonals(matrices: np.ndarray, basis: np.ndarray) -> np.ndarray | None:
    """The diagonals of ``Q^T M Q`` (k x d) of a stack of symmetric matrices (k x d x d) when
    every one is diagonal in ``basis`` to :data:`SHARED_ATOL` of its largest, else None."""
    b = _sym(basis.T @ np.asarray(matrices, dtype=np.float64) @ basis)
    diagonals = np.diagonal(b, axis1=-2, axis2=-1).copy()
    off = np.abs(b - diagonals[..., None] * np.eye(b.shape[-1])).max(axis=(-2, -1), initial=0.0)
    return diagonals if np.all(off <= SHARED_ATOL * np.abs(diagonals).max(axis=-1, initial=0.0)) else None


def level_diagonals(j: np.ndarray, basis: np.ndarray) -> np.ndarray | None:
    """A level's information (d x d or units x d x d) in ``basis``: its eigenvalues, (1, d) or
    (units, d), or None when some matrix is not diagonal there."""
    found = _distinct(j)
    if found is None:
        return None
    distinct, index = found
    diagonals = [diagonal_in(a, basis) for a in distinct]
    if any(v is None for v in diagonals):
        return None
    return np.stack(diagonals)[index] if j.ndim == 3 else diagonals[0][None]


def _pinv(values: np.ndarray, rtol: float, floor: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """:func:`distfit.estimate.hierarchy.psd_pinv` of diagonal matrices (rows of ``values``):
    ``(1 / v where kept else 0, kept)``, ``v`` kept when above ``rtol`` times the row's largest
    ``|v|`` (at least ``floor``)."""
    if values.shape[-1] == 0:
        return np.zeros_like(values), np.zeros(values.shape, dtype=bool)
    top = np.maximum(np.maximum(values.max(axis=-1, keepdims=True), -values.min(axis=-1, keepdims=True)), floor)
    kept = values > rtol * top
    return np.divide(1.0, values, out=np.zeros(values.shape), where=kept), kept


def blind(own: np.ndarray, rtol: float) -> bool:
    """Whether a diagonal information ``own`` (d,) counts as 0 in some direction by the passes'
    rank rule (:func:`_pinv`): its units are then blind there (``N_p`` is formed)."""
    return not bool(_pinv(np.asarray(own, dtype=np.float64)[None], rtol)[1].all())


def _rows(a: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``a[rows]``, or ``a`` itself when it is one row for every unit (broadcast)."""
    return a if a.shape[0] == 1 else a[rows]


def _group_sum(group, values: np.ndarray) -> np.ndarray:
    """``group.sum(values)``; ``values`` one row shared by every child: ``fanout x`` that row."""
    return group.fanout[:, None] * values if values.shape[0] == 1 else group.sum(values)


@dataclass(frozen=True, eq=False)
class DiagonalUpward:
    """The upward pass in ``basis`` (:func:`diagonal_upward`), per level coarsest first: the
    ``parents`` and ``groupings`` (:class:`distfit.estimate.hierarchy.Grouping`), ``own`` the
    ``J`` eigenvalues ((1, d) or (units, d)), ``inside`` the ``I`` (units x d, or (1, d) shared by
    a level of leaves with one ``J``: :meth:`unit_inside` gives the units' rows), ``means`` ``m~``
    (units x d; None for leaves of one ``J`` below level 0, whose ``h`` is ``leaf_linear``); per
    unit with children ``s_sum``, ``k_par``, ``n_sum`` (None where no child of the level is blind
    in any direction) and ``m_sum`` ``M~``; all in ``basis``. ``in_basis``: ``leaf_linear`` is
    ``Q^T h`` (:func:`diagonal_upward`'s ``in_basis``), else ``h``; None with ``leaf_sums``,
    where ``leaf_tables`` may give the leaves' ``J^+ h_c`` instead (else no downward pass)."""

    basis: np.ndarray
    parents: list
    groupings: list
    own: list
    inside: list
    means: list
    s_sum: list
    k_par: list
    n_sum: list
    m_sum: list
    rtol: float
    leaf_linear: np.ndarray | None = None
    in_basis: bool = False
    leaf_tables: np.ndarray | None = None

    def unit_inside(self, level: int) -> np.ndarray:
        """``I`` of every unit of ``level`` (units x d; a read-only broadcast of a shared row)."""
        i, m = self.inside[level], self.means[level]
        units = self.leaf_linear.shape[0] if m is None else m.shape[0]
        return np.broadcast_to(i, (units, i.shape[1])) if i.shape[0] == 1 else i

    def summary_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """The roots' ``I`` (roots x d, in the basis) and ``m`` (roots x d, the original basis)."""
        return np.ascontiguousarray(self.unit_inside(0)), self.means[0] @ self.basis.T


def diagonal_upward(own: Sequence[np.ndarray], linear: Sequence[np.ndarray | None],
                    parents: Sequence[np.ndarray | None], groupings: Sequence, basis: np.ndarray, rtol: float,
                    leaves: tuple[np.ndarray, np.ndarray] | None = None, *, in_basis: bool = False,
                    leaf_sums: np.ndarray | None = None, leaf_tables: np.ndarray | None = None) -> DiagonalUpward:
    """The upward pass (hierarchy's module docstring) in ``basis``: ``own[l]`` the level's ``J``
    eigenvalues ((1, d) or (units, d)), ``linear[l]`` its ``h`` (units x d, original basis; with
    ``in_basis``, ``h~ = Q^T h`` already, as :class:`distfit.estimate.level_stores.BasisTerms`
    forms it from the answers, and no change of basis is made); ``leaves``: the finest level's
    ``(I in the basis, m in the original basis)`` per unit, given (a summary of subtrees below
    it) instead of computed. ``leaf_sums`` (with ``in_basis``, finest level leaves of one ``J``):
    their ``h~`` summed by parent (parents x d), all the upward pass needs of them (``M_p =
    I^+ sum_c h~_c``), ``linear[-1]`` then ignored (None): a summary without the leaves' rows,
    which the downward pass needs, or ``leaf_tables``: each leaf's ``J^+ h_c`` (units x d, the
    original basis; :meth:`distfit.estimate.level_stores.BasisTerms.tables` forms it from the
    answers in one product), all the downward pass needs of them (:func:`_shared_leaves`)."""
    levels = len(linear)
    if leaf_sums is not None and not (in_basis and levels > 1 and own[-1].shape[0] == 1 and leaves is None):
        raise ValueError("leaf_sums: only in the basis, for a finest level of leaves of one J")
    if leaf_tables is not None and leaf_sums is None:
        raise ValueError("leaf_tables: only with leaf_sums")
    leaf_linear = None
    inside, means = [None] * levels, [None] * levels
    s_sum, k_par, n_sum, m_sum = [None] * levels, [None] * levels, [None] * levels, [None] * levels
    for level in range(levels - 1, -1, -1):
        if leaves is not None and level == levels - 1:
            inside[level] = np.asarray(leaves[0], dtype=np.float64)
            means[level] = np.asarray(leaves[1], dtype=np.float64) @ basis
            continue
        if level == levels - 1 and level > 0 and own[level].shape[0] == 1:
            # leaves of one J: m_c = Q diag(I^+) Q^T h_c, never formed; the parents need only their
            # sum (below), the downward pass x_c = J^+ h_c + Q (G r)_p (:func:`diagonal_downward`)
            inside[level], means[level] = np.asarray(own[level], dtype=np.float64), None
            leaf_linear = None if leaf_sums is not None else linear[level]
            continue
        # a copy either way: eta is updated in place below
        eta = np.array(linear[level], dtype=np.float64) if in_basis else linear[level] @ basis
        if level + 1 < levels:
            group = groupings[level + 1]
            child_pinv, child_kept = _pinv(inside[level + 1], rtol)
            s = _group_sum(group, child_pinv)
            within = s
            if not child_kept.all():  # some child blind somewhere: R_p = null N_p
                n = _group_sum(group, (~child_kept).astype(np.float64))
                _, blind = _pinv(n, rtol, 1.0)
                within = np.where(blind, 0.0, s)
                n_sum[level] = n
            del child_pinv, child_kept
            k, _ = _pinv(within, rtol)
            s_sum[level], k_par[level] = s, k
            if means[level + 1] is None:  # M_p = I^+ Q^T sum_c h_c (leaves of one J)
                sums = leaf_sums if leaf_sums is not None else group.sum(leaf_linear)
                m_sum[level] = (sums if in_basis else sums @ basis) * _pinv(inside[level + 1], rtol)[0]
            else:
                m_sum[level] = group.sum(means[level + 1])
            inside[level] = own[level] + k
            eta += k * m_sum[level]
        else:  # leaves: their own J (one row for the level, or one per unit)
            inside[level] = np.asarray(own[level], dtype=np.float64)
        pinv, _ = _pinv(inside[level], rtol)
        eta *= pinv
        means[level] = eta
    return DiagonalUpward(basis, list(parents), list(groupings), list(own), inside, means, s_sum, k_par, n_sum,
                          m_sum, rtol, leaf_linear, in_basis,
                          None if leaf_tables is None else np.asarray(leaf_tables, dtype=np.float64))


def diagonal_downward(state: DiagonalUpward, split: str, top: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None,
                      outside: Sequence[bool] | None = None, *, leaf_offsets: bool = False
                      ) -> tuple[list[np.ndarray | None], list[np.ndarray | None], list[np.ndarray],
                                 list[np.ndarray | None], list[np.ndarray | None]]:
    """The downward pass (hierarchy's module docstring) after :func:`diagonal_upward`: per level
    ``(x (units x d, original basis), x~ = Q^T x (units x d, in the basis: formed by the pass
    itself, no product; for leaves of one J only when the state is ``in_basis``, else None, and
    there before the last child's rounding, which goes to ``x`` alone), P diagonals, O
    diagonals (classes x d, in the basis), each unit's class (None: each unit its own; leaves
    of one J: their parent))``.
    ``top``: the roots' ``(x, P, O)`` so given (subtree roots), else the tree's roots.
    ``outside``: per level, whether its ``O`` is wanted (None: every level's; a level's is
    needed for the next one's, so O is computed down to the finest level wanted).
    ``leaf_offsets``: the finest level's leaves of one J given by their sums alone
    (``leaf_sums``, no rows): their ``x`` is not formed (None) and their ``x~`` is ``(G r)_p``
    per parent, from which a reader of the leaves' rows forms their tables
    (:func:`distfit.estimate.subtrees.leaf_tables`); ValueError where ``split="total"`` moves
    a blind part by the siblings' totals (that needs every leaf's row here)."""
    q, rtol = state.basis, state.rtol
    levels = len(state.means)
    if leaf_offsets and not (levels > 1 and state.means[-1] is None and state.leaf_tables is None
                             and state.leaf_linear is None):
        raise ValueError("leaf_offsets: only for leaves of one J given by their sums (leaf_sums)")
    if levels > 1 and state.means[-1] is None and state.leaf_linear is None and state.leaf_tables is None \
            and not leaf_offsets:
        raise ValueError("downward pass: the upward pass was given the leaves' sums only (leaf_sums), not their rows")
    wanted = [True] * levels if outside is None else list(outside)
    deepest = max((level for level in range(levels) if wanted[level]), default=-1)
    ones = q.sum(axis=0)  # Q^T 1: a unit's total is x~ . (Q^T 1)
    if top is None:
        tilde = state.means[0]
        xs, tildes = [tilde @ q.T], [tilde]
        covs = [np.ascontiguousarray(np.broadcast_to(_pinv(state.inside[0], rtol)[0], tilde.shape))]
        outs = [np.zeros_like(covs[0])]
    else:
        xs = [np.asarray(top[0], dtype=np.float64)]
        tilde = xs[0] @ q
        tildes = [tilde]
        covs, outs = [np.asarray(top[1], dtype=np.float64)], [np.asarray(top[2], dtype=np.float64)]
    classes = [None] * levels
    for level in range(1, levels):
        p, below, group = level - 1, state.parents[level], state.groupings[level]
        if state.means[level] is None:
            x, in_q, cov, out = _shared_leaves(state, level, tilde, xs[p], covs[p],
                                               outs[p] if level <= deepest else None, split, ones,
                                               leaf_offsets=leaf_offsets)
            xs.append(x)
            tildes.append(in_q)
            covs.append(cov)
            outs.append(out)
            classes[level] = below
            continue
        own_pinv, kept = _pinv(state.inside[level], rtol)
        s, k, n = state.s_sum[p][below], state.k_par[p][below], state.n_sum[p]
        gain = own_pinv * k
        remainder = tilde[below]
        remainder -= state.m_sum[p][below]
        blind_gain = None
        if n is not None:
            n_pinv, _ = _pinv(n, rtol, 1.0)
            blind_gain = k * s
            np.subtract(1.0, blind_gain, out=blind_gain)
            blind_gain *= n_pinv[below]
            blind_gain[np.broadcast_to(kept, blind_gain.shape)] = 0.0
            gain += blind_gain
        x = gain * remainder
        x += state.means[level]
        if split == "total" and blind_gain is not None:
            weight = np.maximum(x @ ones, 0.0)
            weight += TOTAL_FLOOR * (1.0 + weight.max(initial=0.0))  # all zero: equal parts
            same = ((n == 0.0) | (n == group.fanout[:, None])).all(axis=1)  # siblings blind in the same directions
            factor = group.fanout[below] * weight / group.sum(weight)[below]
            factor = np.where(same[below], factor, 1.0)
            blind_gain *= remainder
            blind_gain *= (factor - 1.0)[:, None]
            x += blind_gain
        del remainder, blind_gain
        # the rounding of sum_c G_c = I goes to each parent's last child (here, and in the tables)
        group.to_last_child(x, tilde)
        table = x @ q.T
        group.to_last_child(table, xs[p])
        xs.append(table)
        tildes.append(x)
        # P_c = I_c^+ (1 - 2 G_c) + G_c^2 (S_p + P_p)
        cov = covs[p][below]
        cov += s
        cov *= gain
        cov *= gain
        gain *= -2.0
        gain += 1.0
        gain *= own_pinv
        cov += gain
        del gain
        covs.append(cov)
        outs.append(_outside(_rows(state.own[p], below) + outs[p][below], s, None if n is None else n[below],
                             own_pinv, kept, group.fanout[below] == 1, rtol) if level <= deepest else None)
        tilde = x
    return xs, tildes, covs, outs, classes


def _shared_leaves(state: DiagonalUpward, level: int, tilde: np.ndarray, above_x: np.ndarray, above_cov: np.ndarray,
                   above_outside: np.ndarray | None, split: str, ones: np.ndarray, *, leaf_offsets: bool = False
                   ) -> tuple[np.ndarray | None, np.ndarray | None, np.ndarray, np.ndarray | None]:
    """The downward step to leaves of one ``J`` (every child's ``I`` the same row): ``G_c``, and so
    ``P_c`` and ``O_c``, are their parent's, computed per parent (the leaves' class is their
    parent); ``x_c = Q (m~_c + G r) = J^+ h_c + Q (G r)_p`` (``J^+ = Q diag(I^+) Q^T``): one product
    per leaf, in the original basis (weights of ``split="total"`` likewise: ``1^T x_c``). With the
    leaves' ``h~`` (``state.in_basis``) ``x~_c = I^+ h~_c + (G r)_p`` first (O(d) a leaf, returned
    for the residuals) and ``x_c = Q x~_c``, the same one product a leaf. With their tables
    ``J^+ h_c`` given (``state.leaf_tables``) ``x_c = J^+ h_c + Q (G r)_p``, no product a leaf,
    and the ``x~`` returned is ``(G r)_p`` per parent (the leaves' class): ``Q^T (x_c - J^+
    h_c)`` before the blind split and the last child's rounding. With ``leaf_offsets`` that
    ``x~`` alone, no ``x`` (:func:`diagonal_downward`).
    Returns ``(x or None, x~ or None, P, O)``."""
    q, rtol, p = state.basis, state.rtol, level - 1
    below, group = state.parents[level], state.groupings[level]
    own_pinv, kept = _pinv(state.inside[level], rtol)
    s, k, n = state.s_sum[p], state.k_par[p], state.n_sum[p]
    gain = own_pinv * k
    remainder = tilde - state.m_sum[p]
    blind_gain = None
    if n is not None:
        n_pinv, _ = _pinv(n, rtol, 1.0)
        blind_gain = np.where(kept, 0.0, n_pinv * (1.0 - s * k))
        gain += blind_gain
    rows_in_q = state.in_basis and state.leaf_tables is None
    if leaf_offsets:
        if split == "total" and blind_gain is not None:
            raise ValueError("leaf_offsets: split='total' with leaves blind in some direction needs their rows")
        in_q, x = gain * remainder, None  # (G r)_p, per parent: the leaves' tables are formed by their reader
    elif state.leaf_tables is not None:
        in_q = gain * remainder  # (G r)_p, per parent
        # the parents' offsets gathered, then the tables added in place: the same sums, one
        # leaves x d array written instead of two (the gather's and the sum's)
        x = (in_q @ q.T)[below]
        x += state.leaf_tables
    elif state.in_basis:
        in_q = state.leaf_linear * own_pinv
        in_q += (gain * remainder)[below]
        x = in_q @ q.T
    else:
        in_q = None
        x = state.leaf_linear @ ((q * own_pinv) @ q.T)
        x += ((gain * remainder) @ q.T)[below]
    if split == "total" and blind_gain is not None and x is not None:
        weight = np.maximum(x.sum(axis=1), 0.0)
        weight += TOTAL_FLOOR * (1.0 + weight.max(initial=0.0))  # all zero: equal parts
        same = ((n == 0.0) | (n == group.fanout[:, None])).all(axis=1)  # siblings blind in the same directions
        factor = np.where(same[below], group.fanout[below] * weight / group.sum(weight)[below], 1.0)
        x += (factor - 1.0)[:, None] * ((blind_gain * remainder) @ q.T)[below]
        if rows_in_q:
            in_q += (factor - 1.0)[:, None] * (blind_gain * remainder)[below]
    if x is not None:
        group.to_last_child(x, above_x)
    cov = own_pinv * (1.0 - 2.0 * gain) + gain * gain * (s + above_cov)
    out = None if above_outside is None else _outside(
        state.own[p] + above_outside, s, n, own_pinv, kept, group.fanout == 1, rtol)
    return x, in_q, cov, out


def _outside(above: np.ndarray, s: np.ndarray, n: np.ndarray | None, own_pinv: np.ndarray, kept: np.ndarray,
             only: np.ndarray, rtol: float) -> np.ndarray:
    """``O_c`` diagonals (hierarchy's ``_outside``): ``A_p : K_{-c}``, ``A_p`` for an only child."""
    s_rest = s - own_pinv
    if n is not None:
        _, rest_blind = _pinv(n - ~kept, rtol, 1.0)
        s_rest[rest_blind] = 0.0
    k_rest, _ = _pinv(s_rest, rtol)
    del s_rest
    total = above + k_rest
    total_pinv, _ = _pinv(total, rtol)
    del total
    total_pinv *= above
    total_pinv *= k_rest
    total_pinv[only] = above[only]
    return total_pinv


def diagonal_variances(workload: np.ndarray, basis: np.ndarray, covariance: np.ndarray) -> np.ndarray:
    """``var(w_q^T x_u) = sum_k (Q^T w_q)_k^2 P_u,k`` (units x m) of every query (row of
    ``workload``, m x d) of every unit, from the diagonals of ``P_u`` in ``basis`` (units x d)."""
    rotated = np.asarray(workload, dtype=np.float64) @ basis
    return np.maximum(covariance @ (rotated * rotated).T, 0.0)
