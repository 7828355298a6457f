"""Best linear unbiased estimates over a geography hierarchy, exactly consistent, with their covariances (pure numpy).

docs/design.md section 7 ("Geography: least squares over the hierarchy"), after Cumings-Menon,
"Least Squares Estimation for Hierarchical Data" (arXiv 2404.13164, [P5] in docs/design.md's
references): generalized least squares over a tree in time linear in the number of units, by an
upward and a downward pass (a Kalman filter and Rauch-Tung-Striebel smoother on the tree).

Model. Levels ``0..L`` (0 the coarsest). Unit ``u`` of level ``l`` has a true table ``x_u`` in
``R^d`` (the same ``d`` cells at every level); a unit with children is the sum of its children,
``x_u = sum_{c in children(u)} x_c``; the units without children (every unit of level ``L``, and
any coarser unit without a child) are the tree's leaves, whose tables are the free parameters.
Each unit is measured, ``y_u = W_l x_u + z_u`` with ``z_u ~ N(0, Sigma_l)`` (correlated within a
unit, independent across units), and enters only through its level's information form, the
normal equations of :func:`distfit.estimate.projection.normal_equations`:

    ``J_l = W_l^T Sigma_l^-1 W_l``  (d x d, PSD, singular where the level measures part of the table),
    ``h_u = W_l^T Sigma_l^-1 y_u``  (``E h_u = J_l x_u``, ``Cov h_u = J_l``).

The GLS objective is ``sum_u (x_u^T J_l x_u - 2 h_u^T x_u)`` over the leaves' tables.

Pseudo-inverses. Every ``A^+`` below is of a PSD matrix by its eigendecomposition, eigenvalues
at most ``rtol`` times the largest (per matrix) counted as 0 (:func:`psd_pinv`), which also
gives the projector ``Pi_N(A)`` onto its null space. With no singular matrix they are inverses.

Upward pass (finest level first). Unit ``c``'s *subtree* estimate is the minimiser over its
subtree of the objective of its subtree's measurements; profiled onto ``x_c`` it is
``(x_c - m_c)^T I_c (x_c - m_c)`` plus a constant, ``I_c`` the subtree's information on ``x_c``
(range: the functions of ``x_c`` the subtree identifies) and ``Cov m_c = I_c^+``. For a unit
``p`` with children ``c``, let ``S_p = sum_c I_c^+``, ``N_p = sum_c Pi_N(I_c)``, ``M_p =
sum_c m_c``; the children's subtrees identify ``x_p`` on ``R_p = ∩_c range(I_c) = null(N_p)``
(projector ``Pi_R = I - N_p N_p^+``), where profiling ``min_{sum x_c = x_p} sum_c (x_c - m_c)^T
I_c (x_c - m_c)`` gives ``(x_p - M_p)^T K_p (x_p - M_p)`` with

    ``K_p = (Pi_R S_p Pi_R)^+``                   (the parallel sum of the ``I_c``: ``S_p^-1`` when regular),
    ``I_p = J_l + K_p``,  ``m_p = I_p^+ (h_p + K_p M_p)``    (``K_p = 0``, ``M_p = 0`` for a leaf).

(Lagrange: at the minimum ``I_c (x_c - m_c) = mu`` for one ``mu`` in ``R_p``.) By induction
``Cov m_p = I_p^+ (J_l + K_p S_p K_p) I_p^+ = I_p^+`` since ``K_p S_p K_p = K_p``.

Downward pass (coarsest first). A root's estimate is ``m``. The whole objective depends on a
parent's children only through their subtrees' terms and their sum, so given the parent's final
estimate ``x_p`` the children's are the minimiser of ``sum_c (x_c - m_c)^T I_c (x_c - m_c)``
subject to ``sum_c x_c = x_p``: with ``r = x_p - M_p``,

    ``x_c = m_c + G_c r``,  ``G_c = I_c^+ K_p + Pi_N(I_c) N_p^+ (I - S_p K_p)``,

the first term the smoother's gain (``P_c S_p^-1`` when regular: the parent's correction shared
in proportion to the children's covariances) and the second the part of ``r`` no child's subtree
identifies, ``(I - S_p K_p) r`` (in ``range(N_p)``), split among the children blind to it with
the least sum of squares (equal parts among children blind in the same directions; it is where
the parent's measurements decide the children's sum but nothing decides the split). ``sum_c G_c
= I``, so children sum to their parent to rounding; the rounding (~1e-16 of the table) is then
put on each parent's last child, ``x_last = x_p - sum_{others} x_c``.

Covariances. The returned ``x`` is a linear function of the measurements, and ``P_u = Cov x_u``
exactly. A parent's ``x_p`` depends on its children's subtrees only through ``K_p M_p`` (``m_p``
above), and ``Cov(M_p, m_c - G_c M_p) = I_c^+ - S_p G_c^T`` lies in ``R_p^perp`` (``Pi_R S_p K_p =
Pi_R``), which ``K_p = Pi_R K_p Pi_R`` annihilates: ``x_p`` is uncorrelated with ``m_c - G_c
M_p``, and with ``x_c = (m_c - G_c M_p) + G_c x_p``

    root: ``P = I^+``;    ``P_c = I_c^+ - G_c I_c^+ - I_c^+ G_c^T + G_c (S_p + P_p) G_c^T``

(where everything is regular, ``G_c = I_c^-1 S_p^-1``: the smoother's ``P_c - P_c S^-1 P_c +
P_c S^-1 P_p S^-1 P_c``). So ``var(a^T x_u) = a^T P_u a``: se and moe90 (``1.645 se``) of any
published linear function of a unit's table.

What is estimable, and what is returned. ``a^T x_u`` is estimable when some linear function of
the measurements has expectation ``a^T x_u`` for every leaf table; then ``a^T x_u`` (this
``x_u``) is its BLUE and ``a^T P_u a`` its variance. The estimable ``a`` are exactly the range of
the information of all the measurements on ``x_u``, ``F_u = I_u + O_u``, returned: ``O_c``, the
information from outside ``c``'s subtree, comes down the tree as ``O_root = 0``,

    ``O_c = A_p : K_{-c} = A_p (A_p + K_{-c})^+ K_{-c}``,  ``A_p = J_p + O_p``

(the parallel sum of Anderson and Duffin, 1969: ``x_c = x_p - sum_{siblings} x_c'``; ``K_{-c}``
is ``K_p`` of the siblings alone, from ``S_p - I_c^+`` and ``N_p - Pi_N(I_c)``), and ``O_c =
A_p`` for an only child (it is its parent). For estimable ``a``, ``a^T P_u a = a^T F_u^+ a``.
Every measured query of a unit (``a`` in the row space of ``W_l``, ``range J_l``) is estimable,
and so is every ``a`` in ``range I_u``. Where the measurements leave a direction of the leaves'
tables undetermined, the estimate there is not unbiased and is fixed by the rules above (the
root's minimum-norm ``m = I^+ (...)``, a subtree's ``m_c`` zero in ``null I_c``, the
least-squares split of the unidentified remainder); they keep every table consistent, and
``P_u`` is still the exact covariance of what is returned (no bias counted: publish such a
function only with a note, or not at all). A level that measures part of the table above the
finest level costs nothing (``I`` stays regular when the leaves measure everything); the
finest level measuring part leaves its units unidentified in the rest, except where a parent
has one child.

Cost and memory. Per unit a few ``d x d`` eigendecompositions and products: ``O(units d^3)``
time, linear in the units; loops run over the levels only (within a level every operation is
batched over its units: children summed by parent with a sparse 0/1 matrix). Memory: the
upward pass keeps, for every level at once (the downward pass needs them), ``I``, ``I^+``,
``Pi_N(I)`` and for parents ``S``, ``K`` (and ``N``, ``N^+`` where some child is blind): five to
seven ``units x d x d`` float64 arrays per level, the returned ``P`` and ``F`` two more (about 72
d^2 bytes a unit: 4.5 KiB at d = 8, 3.6 MB at the census's 224 cells), and a few temporaries of
a level's size in the passes.
Eigendecompositions run once per distinct matrix (:func:`_shared_pinv`: all leaves of a level
share one), and where no child is blind in any direction the parallel sum is ``S^+`` (no null
space products). Measured (one BLAS thread, the shared 2-core machine, session of issue 29;
levels of 1, 50, 3,000 and 100,000 random units, the third measuring part of the table): 3.9 s
at d = 8, 63 s at d = 32 (there memory-bound: 0.8 GB per ``units x d x d`` array); the
information ``F`` (the outside pass) is about half of it (1.6 s and 40 s without).

Decision for scale (issue 29 point 5, not done here): chunk by subtree. A subtree hands upward
only its root's ``(I, I^+, Pi_N(I), m)`` and needs from above only its parent's ``(x, P, K, S,
N^+, M)``, so the units below a cut level are independent tasks (upward pass, arrays kept or
spilled, downward pass once the levels above the cut are done), the driver holding only those
levels. Units whose subtrees have the same shape share ``I``, ``K``, ``S`` (every leaf has ``I =
J_L``): keying them by shape is the next saving at 224 cells.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse

__all__ = ["HierarchyEstimate", "PINV_RTOL", "estimate_hierarchy", "psd_pinv"]

#: Eigenvalues of a PSD matrix at most this times its largest count as 0 (:func:`psd_pinv`).
PINV_RTOL = 1e-9


@dataclass(frozen=True, eq=False)
class HierarchyEstimate:
    """Per level (coarsest first): ``x`` (units x d) the estimates, every unit with children
    their sum; ``covariance`` (units x d x d) ``P_u = Cov x_u`` (``var(a^T x_u) = a^T P_u a``);
    ``subtree_information`` (units x d x d) ``I_u``, whose range holds the functions of ``x_u``
    its subtree alone identifies; ``information`` (units x d x d) ``F_u``, the information of
    all the measurements on ``x_u``: ``a^T x_u`` is estimable exactly when ``a`` is in the
    range of ``F_u``, and then ``a^T P_u a = a^T F_u^+ a`` (module docstring)."""

    x: tuple[np.ndarray, ...]
    covariance: tuple[np.ndarray, ...]
    subtree_information: tuple[np.ndarray, ...]
    information: tuple[np.ndarray, ...]


def psd_pinv(a: np.ndarray, rtol: float = PINV_RTOL, floor: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """``(A^+, Pi_N(A))`` of a stack of symmetric PSD matrices ``a`` (..., d, d): the
    pseudo-inverse and the projector onto the null space, eigenvalues at most ``rtol`` times
    the largest of their matrix, or than ``rtol * floor`` (the scale of a sum of projectors,
    whose differences leave rounding, not rank), counted as 0 (all, for a zero matrix)."""
    a = 0.5 * (a + np.swapaxes(a, -1, -2))
    values, vectors = np.linalg.eigh(a)
    top = np.maximum(np.max(np.abs(values), axis=-1, keepdims=True), floor)
    kept = values > rtol * top
    inverse = np.where(kept, 1.0 / np.where(kept, values, 1.0), 0.0)
    transposed = np.swapaxes(vectors, -1, -2)
    pinv = (vectors * inverse[..., None, :]) @ transposed
    null = (vectors * (~kept)[..., None, :]) @ transposed
    return pinv, null


def _shared_pinv(a: np.ndarray, rtol: float, floor: float = 0.0) -> tuple[np.ndarray, np.ndarray]:
    """:func:`psd_pinv` of a stack ``a`` (units x d x d), each distinct matrix decomposed once:
    units whose subtrees have the same shape have bitwise equal matrices (the same sums of the
    same products; every leaf of a level has ``I = J_l``), and an eigendecomposition costs far
    more than finding the duplicates (measured at d = 32: 175 us a matrix). Duplicates are
    found by a random projection of each matrix (1-d keys: ``np.unique`` of whole rows sorts
    byte strings, slower than the eigendecompositions it saves) and then checked exactly."""
    n = a.shape[0]
    flat = np.ascontiguousarray(a).reshape(n, -1)
    if n > 1:
        keys = flat @ np.random.default_rng(0).standard_normal(flat.shape[1])
        _, first, index = np.unique(keys, return_index=True, return_inverse=True)
        index = index.reshape(-1)
        if first.size <= n // 2 and np.array_equal(flat, flat[first][index]):
            pinv, null = psd_pinv(a[first], rtol, floor)
            return pinv[index], null[index]
    return psd_pinv(a, rtol, floor)


def _sym(a: np.ndarray) -> np.ndarray:
    return 0.5 * (a + np.swapaxes(a, -1, -2))


def _mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a, b)  # batched BLAS (einsum's loops are ~50x slower at d = 32)


def _mv(a: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.matmul(a, v[..., None])[..., 0]


@dataclass(frozen=True, eq=False)
class _Grouping:
    """A level's children grouped by parent: ``matrix`` the 0/1 sparse matrix (parents x
    children) summing children into their parent (a sparse product: 10x faster than
    ``np.add.reduceat`` over ``d x d`` rows), ``parents`` the parents with children and ``last``
    each one's last child (a row of the level)."""

    matrix: scipy.sparse.csr_array
    parents: np.ndarray
    last: np.ndarray

    @classmethod
    def of(cls, parent_of: np.ndarray, parents: int) -> "_Grouping":
        n = parent_of.size
        matrix = scipy.sparse.csr_array((np.ones(n), (parent_of, np.arange(n))), shape=(parents, n))
        order = np.argsort(parent_of, kind="stable")
        grouped = parent_of[order]
        ends = np.flatnonzero(np.r_[grouped[1:] != grouped[:-1], True]) if n else np.zeros(0, dtype=np.int64)
        return cls(matrix, grouped[ends], order[ends])

    def sum(self, values: np.ndarray) -> np.ndarray:
        """``sum_{c: parent_of[c] = p} values[c]`` for every parent ``p`` (0 for a childless one)."""
        flat = values.reshape(values.shape[0], -1)
        return np.asarray(self.matrix @ flat).reshape((self.matrix.shape[0],) + values.shape[1:])


def _check(information: Sequence[np.ndarray], linear: Sequence[np.ndarray], parent_of: Sequence[np.ndarray | None]
           ) -> tuple[list[np.ndarray], list[np.ndarray], list[np.ndarray | None]]:
    """Arrays as float64 / int64, shapes checked; ValueError naming the level and the problem."""
    if not linear or len(information) != len(linear) or len(parent_of) != len(linear):
        raise ValueError("information, linear and parent_of: one entry per level, at least one level")
    h0 = np.asarray(linear[0])
    if h0.ndim != 2:
        raise ValueError(f"level 0: linear must be (units, cells), got shape {h0.shape}")
    d = h0.shape[1]
    js, hs, parents = [], [], []
    for level, (j, h, up) in enumerate(zip(information, linear, parent_of)):
        h = np.asarray(h, dtype=np.float64)
        j = np.asarray(j, dtype=np.float64)
        if h.ndim != 2 or h.shape[1] != d:
            raise ValueError(f"level {level}: linear must be (units, {d}), got shape {h.shape}")
        if j.shape not in ((d, d), (h.shape[0], d, d)):
            raise ValueError(f"level {level}: information must be ({d}, {d}) or ({h.shape[0]}, {d}, {d}), "
                             f"got shape {j.shape}")
        if not np.all(np.isfinite(j)) or not np.all(np.isfinite(h)):
            raise ValueError(f"level {level}: information and linear must be finite")
        if level == 0:
            if up is not None:
                raise ValueError("level 0: the coarsest level has no parents (parent_of must be None)")
            parents.append(None)
        else:
            up = np.asarray(up)
            above = hs[-1].shape[0]
            if up.shape != (h.shape[0],) or not np.issubdtype(up.dtype, np.integer):
                raise ValueError(f"level {level}: parent_of must be {h.shape[0]} integers, got shape {up.shape}")
            if up.size and (up.min() < 0 or up.max() >= above):
                raise ValueError(f"level {level}: parent_of outside 0..{above - 1}")
            parents.append(up.astype(np.int64))
        js.append(np.broadcast_to(_sym(j), (h.shape[0], d, d)))
        hs.append(h)
    return js, hs, parents


def estimate_hierarchy(information: Sequence[np.ndarray], linear: Sequence[np.ndarray],
                       parent_of: Sequence[np.ndarray | None], *, rtol: float = PINV_RTOL) -> HierarchyEstimate:
    """The GLS (BLUE) estimates of every unit of every level and their exact covariances
    (module docstring), coarsest level first. ``information[l]``: ``J_l`` (d x d, one for the
    level, or units x d x d); ``linear[l]``: ``h_u`` (units x d), e.g. the ``(H, g)`` of
    :func:`distfit.estimate.projection.normal_equations` of the level's plan and measurements;
    ``parent_of[l]``: each unit's parent, a row of level ``l - 1`` (None for level 0, whose
    units are the roots). ``rtol``: :func:`psd_pinv`'s. ValueError on inconsistent shapes."""
    js, hs, parents = _check(information, linear, parent_of)
    levels = len(hs)
    d = hs[0].shape[1]
    eye = np.eye(d)
    groupings = [None] + [_Grouping.of(up, hs[level].shape[0]) for level, up in enumerate(parents[1:])]

    # upward: every unit's (I, I^+, Pi_N(I), m); every parent's (S, N^+, K, M)
    inside, inside_pinv, inside_null, means = [None] * levels, [None] * levels, [None] * levels, [None] * levels
    s_sum, n_pinv, k_par, m_sum = [None] * levels, [None] * levels, [None] * levels, [None] * levels
    n_sum = [None] * levels
    for level in range(levels - 1, -1, -1):
        if level + 1 < levels:
            group = groupings[level + 1]
            s = _sym(group.sum(inside_pinv[level + 1]))
            if inside_null[level + 1].any():
                blind = group.sum(inside_null[level + 1])
                n_pinv[level], _ = _shared_pinv(blind, rtol, 1.0)
                n_sum[level] = blind
                within = eye - _mm(n_pinv[level], blind)  # Pi_R = I - N^+ N
                k, _ = _shared_pinv(_sym(_mm(_mm(within, s), within)), rtol)
            else:  # every child's subtree identifies its table: R = R^d, K = S^+ (N^+ None: no blind split)
                k, _ = _shared_pinv(s, rtol)
            m_sum[level] = group.sum(means[level + 1])
            s_sum[level], k_par[level] = s, _sym(k)
            info = js[level] + k_par[level]
            eta = hs[level] + _mv(k_par[level], m_sum[level])
        else:
            info, eta = np.array(js[level]), hs[level]
        inside[level] = info
        inside_pinv[level], inside_null[level] = _shared_pinv(info, rtol)
        means[level] = _mv(inside_pinv[level], eta)

    # downward: estimates and covariances, coarsest first
    xs, covs = [means[0]], [_sym(inside_pinv[0])]
    outside = [np.zeros_like(inside[0])]
    for level in range(1, levels):
        up, group = parents[level], groupings[level]
        p = level - 1
        s, k = s_sum[p][up], k_par[p][up]
        gain = _mm(inside_pinv[level], k)
        if n_pinv[p] is not None:
            gain += _mm(_mm(inside_null[level], n_pinv[p][up]), eye - _mm(s, k))
        x = means[level] + _mv(gain, xs[p][up] - m_sum[p][up])
        # the rounding of sum_c G_c = I goes to each parent's last child
        x[group.last] += xs[p][group.parents] - group.sum(x)[group.parents]
        own = _mm(gain, inside_pinv[level])
        cov = inside_pinv[level] - own - np.swapaxes(own, -1, -2) + _mm(_mm(gain, s + covs[p][up]),
                                                                         np.swapaxes(gain, -1, -2))
        xs.append(x)
        covs.append(_sym(cov))
        outside.append(_outside(js[p] + outside[p], level, up, s_sum[p], n_sum[p], inside_pinv[level],
                                inside_null[level], rtol))
    final = tuple(i + o for i, o in zip(inside, outside))
    return HierarchyEstimate(x=tuple(xs), covariance=tuple(covs), subtree_information=tuple(inside),
                             information=final)


def _outside(above: np.ndarray, level: int, up: np.ndarray, s: np.ndarray, n: np.ndarray | None,
             own_pinv: np.ndarray, own_null: np.ndarray, rtol: float) -> np.ndarray:
    """``O_c`` (children x d x d), the information on each child's table from outside its
    subtree (module docstring): ``A_p : K_{-c}`` with ``A_p = J_p + O_p`` (``above``, per
    parent) and ``K_{-c}`` the parallel sum of its siblings' ``I`` (from ``S_p - I_c^+`` and
    ``N_p - Pi_N(I_c)``); ``A_p`` itself for an only child."""
    a = above[up]
    s_rest = _sym(s[up] - own_pinv)
    if n is not None:
        n_rest = n[up] - own_null
        rest_pinv, _ = _shared_pinv(n_rest, rtol, 1.0)
        within = np.eye(a.shape[-1]) - _mm(rest_pinv, n_rest)
        s_rest = _sym(_mm(_mm(within, s_rest), within))
    k_rest, _ = _shared_pinv(s_rest, rtol)
    total_pinv, _ = _shared_pinv(a + k_rest, rtol)
    out = _sym(_mm(_mm(a, total_pinv), k_rest))
    only = np.bincount(up, minlength=above.shape[0])[up] == 1
    out[only] = a[only]
    return out
