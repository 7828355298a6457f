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

Splitting what nothing identifies (``split="total"``). The second term of ``G_c`` splits the
unidentified remainder ``(I - S_p K_p) r`` equally among children blind to it; any other split
of it (with the same sum) is another minimiser of the whole objective, because the objective
is flat along it, so every estimable function keeps its BLUE and ``a^T P_u a`` its variance.
Where a parent's children are all blind in the same directions (one projector ``Pi``: the
census's counties, which measure part of the table, and its states), ``"total"`` splits it in
proportion to weights ``w_c``, the children's estimated totals (``1^T x_c`` of the equal split,
at least 0; ``x_c`` += ``(n_p w_c / sum w - 1) Pi (I - S_p K_p) r / n_p``): a small unit gets
a small share of the parent's unmeasured detail (e.g. the nation's age x race interaction)
instead of ``1/n_p`` of it, which keeps its cells near the range of counts (measured at 20,000
counties: the state cells' equal split reaches -62 where the totals are a few hundred). No
estimable function moves: with one ``Pi`` for all siblings, the estimable ``a`` of a child
lie in ``range I_c + range O_c``, both orthogonal to ``range Pi`` (``range O_c`` lies in
``R_p = null N_p = range(Pi)^perp``). The split is then not linear in the measurements, and
``P_u`` is the covariance of the returned estimate along the estimable functions only.

Classes of units. Every matrix above depends on the tree's shape and the levels' ``J``, never
on the measurements: ``I_u``, ``K_u``, ``S_u``, ``N_u`` are the same for two units whose
subtrees have the same shape (the same ``J`` and the same multiset of children's classes,
found finest level first), and ``G_c``, ``P_c``, ``O_c`` are the same for two units of the same
subtree class whose parents are of the same (downward) class. So the passes compute every
matrix once per *class* (batched over the classes of a level) and apply it to the vectors of
all the units of that class at once (:func:`classwise`). Upward class of a unit: its ``J``
(distinct matrices, found by a random projection and checked exactly), its fanout and a
64-bit sum of random keys of its children's classes (wrapping integer sums: order-free and
exact), checked child by child against the class's first unit (a collision would split the
class, never merge two). Downward class of a unit: the pair (its parent's downward class, its
upward class); a root's is its upward class. The result gives each unit its downward class
(``unit_class``) and the matrices per class.

Cost and memory. Per class a few ``d x d`` eigendecompositions and products, ``O(classes
d^3)``; per unit a few ``d x d`` matrix-vector products, ``O(units d^2)``: linear in the units.
On a census-shaped tree the classes are few (nation > 51 states > counties: the leaves one
class, a state one per distinct fanout, a county one per its state's class) and the units'
products dominate (pipelines/census.yaml, 224 cells, 20,000 counties: benchmarks/README.md).
Memory: per level a few ``units x d`` arrays (``h``, ``m``, ``M``, ``x``) and ``classes x d
x d`` matrices (``I``, ``I^+``, ``Pi_N(I)``, ``S``, ``K``, ``N``, ``N^+``; ``P`` and ``O``
returned per downward class, ``I`` per upward class, ``F = I + O`` formed on request). Deep irregular trees have more classes (every distinct path of
shapes), up to one per unit; then the cost is ``O(units d^3)`` and the memory ``units d^2``
floats per matrix kind, as without classes.

Commuting levels (:mod:`distfit.estimate.shared_basis`): when one orthonormal ``Q`` diagonalises
every level's ``J`` (the same plan at every level up to a scale: PL94 at every geography level),
every matrix above is diagonal in ``Q`` and the tree is d scalar trees on ``Q^T h``: ``O(d)`` per
unit and no classes (``basis="auto"`` finds ``Q``; the result then holds diagonals in it).

Scale (issue 29 point 5): chunk by subtree. A subtree hands upward only its root's class
matrices and ``m`` (:class:`Summary`), and needs from above only its root's ``x``, ``P`` and
``O`` (:class:`Top`), so the units below a cut level are independent tasks: :func:`upward_pass`
and :func:`downward_pass` run apart (:mod:`distfit.estimate.subtrees`, on the cluster
:mod:`distfit.estimate.subtree_job`), the driver holding only the levels above the cut. On a
deep irregular tree (the US-shaped geography: random fanouts below the counties) nearly every
unit above the leaves is its own class, and the passes hold about a dozen ``d x d`` matrices per
such unit at their peak (``benchmarks/bench_tree_memory.py``): the cut and the forests are
chosen by that count (:func:`distfit.estimate.subtrees.choose_cut`,
:func:`~distfit.estimate.subtrees.group_roots`), not by rows alone.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import scipy.sparse

from distfit.estimate.shared_basis import (DiagonalUpward, diagonal_downward, diagonal_upward, diagonal_variances,
                                           level_diagonals, shared_basis, stack_diagonals)

__all__ = ["Grouping", "HierarchyEstimate", "PINV_RTOL", "Summary", "Top", "Upward", "check_parent_of", "classwise",
           "downward_pass", "estimate_hierarchy", "psd_pinv", "query_variances", "summarise", "upward_pass"]

#: Eigenvalues of a PSD matrix at most this times its largest count as 0 (:func:`psd_pinv`).
PINV_RTOL = 1e-9
#: :func:`classwise` gathers a matrix per unit (in runs of at most this many bytes) instead of
#: looping over the classes when there are more than this many classes.
CLASS_LOOP = 64
GATHER_BYTES = 1 << 26
#: ``split="total"``: each child's weight is its estimated total (at least 0) plus this times
#: (1 + the largest), so that children whose totals are all 0 split equally.
TOTAL_FLOOR = 1e-9
#: Two null projectors this close (entrywise) are the same subspace's (rounding of the eigh).
SAME_NULL_ATOL = 1e-8


@dataclass(frozen=True, eq=False)
class HierarchyEstimate:
    """Per level (coarsest first): ``x`` (units x d) the estimates, every unit with children
    their sum; ``unit_class`` (units,) each unit's class (module docstring: units of one class
    share every matrix below); per class: ``covariance`` (classes x d x d) ``P = Cov x_u``
    (``var(a^T x_u) = a^T P a``), ``outside`` (classes x d x d) ``O_u``, the information from
    outside the unit's subtree, and ``upward_class`` (classes,) its upward class, a row of
    ``inside`` (upward classes x d x d), the subtree information ``I_u``, whose range holds the
    functions of ``x_u`` its subtree alone identifies. Derived on request (not held: the
    memory, issue 29 point 6): ``subtree_information`` ``I_u`` and ``information`` ``F_u = I_u
    + O_u`` per class, the information of all the measurements on ``x_u``: ``a^T x_u`` is
    estimable exactly when ``a`` is in the range of ``F_u``, and then ``a^T P a = a^T F_u^+
    a``. :meth:`unit` gives a per-class array's matrices of some units. With a ``basis`` ``Q``
    (the shared-basis path, :mod:`distfit.estimate.shared_basis`) every unit is its own class,
    each per-class array holds the diagonals in ``Q`` (units x d): the matrix is ``Q diag(v) Q^T``,
    and ``x_basis`` per level ``Q^T x`` as the passes formed it (None where they did not)."""

    x: tuple[np.ndarray, ...]
    unit_class: tuple[np.ndarray, ...]
    covariance: tuple[np.ndarray, ...]
    outside: tuple[np.ndarray, ...]
    inside: tuple[np.ndarray, ...]
    upward_class: tuple[np.ndarray, ...]
    basis: np.ndarray | None = None
    x_basis: tuple[np.ndarray | None, ...] | None = None

    @property
    def subtree_information(self) -> tuple[np.ndarray, ...]:
        """``I_u`` per class, per level."""
        return tuple(i[c] for i, c in zip(self.inside, self.upward_class))

    @property
    def information(self) -> tuple[np.ndarray, ...]:
        """``F_u = I_u + O_u`` per class, per level."""
        return tuple(i[c] + o for i, c, o in zip(self.inside, self.upward_class, self.outside))

    def top(self, level: int, rows: np.ndarray | slice = slice(None)) -> "Top":
        """What level ``level``'s units ``rows`` (subtree roots) need from the levels above for
        their subtrees' downward pass (:func:`downward_pass`'s ``top``): the classes renumbered
        to those present."""
        present, index = np.unique(self.unit_class[level][rows], return_inverse=True)
        return Top(self.x[level][rows], index.reshape(-1).astype(np.int64), self.covariance[level][present],
                   self.outside[level][present], self.basis)

    def unit(self, name: str, level: int, units: np.ndarray | slice | int = slice(None)) -> np.ndarray:
        """The matrices of ``units`` of ``level`` in the per-class array ``name``
        (``"covariance"``, ``"outside"``, ``"subtree_information"`` or ``"information"``),
        gathered for those units only."""
        classes = self.unit_class[level][units]
        if name in ("subtree_information", "information"):
            own = self.inside[level][self.upward_class[level][classes]]
            found = own + self.outside[level][classes] if name == "information" else own
        else:
            found = getattr(self, name)[level][classes]
        return found if self.basis is None else _from_diagonals(found, self.basis)

    def variances(self, level: int, workload: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(rows, unit_class)``: ``var(w_q^T x_u)`` of every query (row of ``workload``) per class of
        ``level`` (classes x m: :func:`query_variances`, in the shared basis :func:`distfit.estimate.
        shared_basis.diagonal_variances`), each unit's class: unit ``u``'s are ``rows[unit_class[u]]``."""
        cov = self.covariance[level]
        rows = (query_variances(workload, cov, np.arange(cov.shape[0])) if self.basis is None
                else diagonal_variances(workload, self.basis, cov))
        return rows, np.asarray(self.unit_class[level], dtype=np.int64)


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


def classwise(matrices: np.ndarray, unit_class: np.ndarray, v: np.ndarray) -> np.ndarray:
    """``out[u] = matrices[unit_class[u]] @ v[u]`` (``matrices`` classes x d x d, ``v`` units
    x d): one matrix product per class over all its units (a loop over the classes, each of
    which already cost an eigendecomposition), or, with more than :data:`CLASS_LOOP` classes,
    the units' matrices gathered in runs of :data:`GATHER_BYTES` (no loop over units)."""
    classes, d = matrices.shape[0], v.shape[1]
    if classes == 1:
        return v @ matrices[0].T
    out = np.empty_like(v, dtype=np.float64)
    if classes > CLASS_LOOP:
        step = max(1, GATHER_BYTES // max(8 * d * d, 1))
        for start in range(0, v.shape[0], step):
            rows = slice(start, start + step)
            out[rows] = _mv(matrices[unit_class[rows]], v[rows])
        return out
    order = np.argsort(unit_class, kind="stable")
    bounds = np.searchsorted(unit_class[order], np.arange(classes + 1))
    for k in range(classes):
        rows = order[bounds[k]:bounds[k + 1]]
        if rows.size:
            out[rows] = v[rows] @ matrices[k].T
    return out


def query_variances(workload: np.ndarray, covariance: np.ndarray, unit_class: np.ndarray) -> np.ndarray:
    """``var(w_q^T x_u) = w_q^T P_u w_q`` (units x m) of every query (row of ``workload``, m x
    d) of every unit, from the per-class covariances (classes x d x d) and each unit's class."""
    w = np.asarray(workload, dtype=np.float64)
    per_class = np.einsum("kqd,qd->kq", np.matmul(w[None], covariance), w)  # (0, m) for no class
    return np.maximum(per_class, 0.0)[unit_class]


def _sym(a: np.ndarray) -> np.ndarray:
    return 0.5 * (a + np.swapaxes(a, -1, -2))


def _from_diagonals(values: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """``Q diag(v) Q^T`` for each row ``v`` of ``values`` (..., d x d)."""
    return (basis * np.asarray(values)[..., None, :]) @ basis.T


def _mm(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.matmul(a, b)  # batched BLAS (einsum's loops are ~50x slower at d = 32)


def _mv(a: np.ndarray, v: np.ndarray) -> np.ndarray:
    return np.matmul(a, v[..., None])[..., 0]


@dataclass(frozen=True, eq=False)
class Grouping:
    """A level's children grouped by parent: ``matrix`` the 0/1 sparse matrix (parents x children) summing children
    into their parent (10x faster than ``np.add.reduceat`` over rows), ``parents`` the parents with children,
    ``last`` each one's last child (a row of the level), ``fanout`` (parents,) every parent's number of children."""

    matrix: scipy.sparse.csr_array
    parents: np.ndarray
    last: np.ndarray
    fanout: np.ndarray

    @classmethod
    def of(cls, parent_of: np.ndarray, parents: int) -> "Grouping":
        n = parent_of.size
        matrix = scipy.sparse.csr_array((np.ones(n), (parent_of, np.arange(n))), shape=(parents, n))
        order = np.argsort(parent_of, kind="stable")
        grouped = parent_of[order]
        ends = np.flatnonzero(np.r_[grouped[1:] != grouped[:-1], True]) if n else np.zeros(0, dtype=np.int64)
        return cls(matrix, grouped[ends], order[ends], np.bincount(parent_of, minlength=parents))

    def sum(self, values: np.ndarray) -> np.ndarray:
        """``sum_{c: parent_of[c] = p} values[c]`` for every parent ``p`` (0 for a childless one)."""
        flat = values.reshape(values.shape[0], -1)
        return np.asarray(self.matrix @ flat).reshape((self.matrix.shape[0],) + values.shape[1:])

    def to_last_child(self, x: np.ndarray, above: np.ndarray, complete: np.ndarray | None = None) -> None:
        """In place: each parent's last child takes ``above_p - sum_c x_c`` (parents in mask ``complete``)."""
        keep = slice(None) if complete is None else complete[self.parents]
        x[self.last[keep]] += above[self.parents[keep]] - self.sum(x)[self.parents[keep]]


def _matrix_classes(j: np.ndarray, units: int) -> tuple[np.ndarray, np.ndarray]:
    """``(distinct, index)``: the distinct matrices of ``j`` (one d x d for the level, or units
    x d x d) and each unit's, found by a random projection of each matrix and checked exactly
    (else every unit its own)."""
    if j.ndim == 2:
        return j[None], np.zeros(units, dtype=np.int64)
    flat = np.ascontiguousarray(j).reshape(units, -1)
    keys = flat @ np.random.default_rng(0).standard_normal(flat.shape[1])
    _, first, index = np.unique(keys, return_index=True, return_inverse=True)
    index = index.reshape(-1)
    if np.array_equal(flat, flat[first][index]):
        return j[first], index.astype(np.int64)
    return j, np.arange(units, dtype=np.int64)


def _subtree_classes(own: np.ndarray, parent_of: np.ndarray, child_class: np.ndarray, parents: int,
                     child_classes: int) -> tuple[np.ndarray, np.ndarray, scipy.sparse.csr_array]:
    """The upward classes of a level's units (module docstring, "Classes of units"):
    ``(unit_class (parents,), first (classes,) a unit of each class, counts (classes x
    child_classes, sparse) how many children of each class a unit of the class has)``, from
    the units' own matrix classes ``own``, their children's ``parent_of`` and classes."""
    fanout = np.bincount(parent_of, minlength=parents)
    weights = np.random.default_rng(1).integers(0, np.iinfo(np.int64).max, child_classes, dtype=np.int64)
    digest = np.zeros(parents, dtype=np.uint64)
    np.add.at(digest, parent_of, weights.astype(np.uint64)[child_class])  # wraps: exact and order-free
    keys = np.stack([own.astype(np.uint64), fanout.astype(np.uint64), digest], axis=1)
    _, first, unit_class = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    unit_class = unit_class.reshape(-1)
    # exact check: each unit's children's classes, sorted, equal its class's first unit's
    order = np.lexsort((child_class, parent_of))
    grouped, classes_sorted = parent_of[order], child_class[order]
    start = np.concatenate([[0], np.cumsum(fanout)[:-1]])
    position = np.arange(order.size) - start[grouped]
    twin = start[first[unit_class[grouped]]] + position
    if not np.array_equal(classes_sorted, classes_sorted[twin]):
        unit_class, first = np.arange(parents), np.arange(parents)
    representative = np.zeros(parents, dtype=bool)
    representative[first] = True
    taken = representative[parent_of]
    counts = scipy.sparse.csr_array((np.ones(int(taken.sum())), (unit_class[parent_of[taken]], child_class[taken])),
                                    shape=(first.size, child_classes))
    return unit_class.astype(np.int64), first.astype(np.int64), counts


def _class_sum(counts: scipy.sparse.csr_array, matrices: np.ndarray) -> np.ndarray:
    """``sum_j counts[k, j] matrices[j]`` for every class ``k``."""
    flat = matrices.reshape(matrices.shape[0], -1)
    return np.asarray(counts @ flat).reshape((counts.shape[0],) + matrices.shape[1:])


def check_parent_of(parent_of: np.ndarray | None, level: int, units: int, above: int) -> np.ndarray | None:
    """Level ``level``'s parent rows as int64 (units,), each a row of the level above (``above``
    units): None for level 0 (the roots; anything else refused); None under a level of one unit
    means that unit is every unit's parent (zeros). ValueError naming the level and the problem."""
    if level == 0:
        if parent_of is not None:
            raise ValueError("level 0: the coarsest level has no parents (parent_of must be None)")
        return None
    if parent_of is None:
        if above != 1:
            raise ValueError(f"level {level}: no parent_of, and level {level - 1} has {above} units")
        return np.zeros(units, dtype=np.int64)
    up = np.asarray(parent_of)
    if up.shape != (units,) or not np.issubdtype(up.dtype, np.integer):
        raise ValueError(f"level {level}: parent_of must be {units} integers, got shape {up.shape}")
    if up.size and (up.min() < 0 or up.max() >= above):
        raise ValueError(f"level {level}: parent_of outside 0..{above - 1}")
    return up.astype(np.int64)


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
        parents.append(check_parent_of(up, level, h.shape[0], hs[-1].shape[0] if hs else 0))
        js.append(_sym(j))
        hs.append(h)
    return js, hs, parents


def estimate_hierarchy(information: Sequence[np.ndarray], linear: Sequence[np.ndarray],
                       parent_of: Sequence[np.ndarray | None], *, rtol: float = PINV_RTOL,
                       split: str = "equal", basis: np.ndarray | str | None = "auto",
                       outside: bool = True) -> HierarchyEstimate:
    """The GLS (BLUE) estimates of every unit of every level and their exact covariances
    (module docstring), coarsest level first. ``information[l]``: ``J_l`` (d x d, one for the
    level, or units x d x d); ``linear[l]``: ``h_u`` (units x d), e.g. the ``(H, g)`` of
    :func:`distfit.estimate.projection.normal_equations` of the level's plan and measurements;
    ``parent_of[l]``: each unit's parent, a row of level ``l - 1`` (None for level 0, whose
    units are the roots, and under a level of one unit: :func:`check_parent_of`). ``rtol``:
    :func:`psd_pinv`'s. ``split``: how the part of a parent's table no child's subtree
    identifies is split among its children, ``"equal"`` (the linear
    least-squares rule) or ``"total"`` (in proportion to the children's estimated totals, where
    they are all blind in the same directions: module docstring, "Splitting what nothing
    identifies"). ValueError on inconsistent shapes or another ``split``.
    ``basis``: :func:`upward_pass`'s; ``outside``: :func:`downward_pass`'s. The two passes are :func:`upward_pass` and
    :func:`downward_pass` (run apart on subtrees: :mod:`distfit.estimate.subtrees`)."""
    if split not in ("equal", "total"):
        raise ValueError(f"split: 'equal' or 'total', got {split!r}")
    return downward_pass(upward_pass(information, linear, parent_of, rtol=rtol, basis=basis), split=split,
                         outside=outside)


@dataclass(frozen=True, eq=False)
class Summary:
    """What a forest of subtrees hands upward (:func:`upward_pass`'s :meth:`Upward.summary`):
    per root, its class (``unit_class``) and ``mean`` (roots x d) ``m_u``; per class, the
    subtree information ``information`` (classes x d x d) ``I_u``. Given as ``leaves`` to the
    pass over the levels above, its roots are leaves whose subtree terms are these. With a
    ``basis`` (the shared-basis path) ``information`` holds each class's diagonal in it
    (classes x d); ``mean`` is in the original basis."""

    information: np.ndarray
    unit_class: np.ndarray
    mean: np.ndarray
    basis: np.ndarray | None = None

    def as_matrices(self) -> "Summary":
        """The same summary with ``d x d`` matrices (``Q diag(v) Q^T``), no basis."""
        return self if self.basis is None else Summary(_from_diagonals(self.information, self.basis),
                                                       self.unit_class, self.mean)


@dataclass(frozen=True, eq=False)
class Top:
    """What the levels above hand down to a forest's roots (:meth:`HierarchyEstimate.top`): per
    root, its estimate ``x`` (roots x d) and downward class ``unit_class``; per class, the
    covariance ``covariance`` and the information from outside the subtree ``outside``
    (classes x d x d; with a ``basis``, their diagonals in it, classes x d)."""

    x: np.ndarray
    unit_class: np.ndarray
    covariance: np.ndarray
    outside: np.ndarray
    basis: np.ndarray | None = None

    def as_matrices(self) -> "Top":
        """The same top with ``d x d`` matrices, no basis."""
        if self.basis is None:
            return self
        return Top(self.x, self.unit_class, _from_diagonals(self.covariance, self.basis),
                   _from_diagonals(self.outside, self.basis))

    def in_basis(self, basis: np.ndarray) -> "Top":
        """The same top with diagonals in ``basis`` (ValueError when its matrices are not
        diagonal there: the levels above were estimated in a basis that does not fit)."""
        if self.basis is not None and np.array_equal(self.basis, basis):
            return self
        found = self.as_matrices()
        diagonals = [stack_diagonals(m, basis) for m in (found.covariance, found.outside)]
        if any(v is None for v in diagonals):
            raise ValueError("top: the roots' covariances are not diagonal in the forest's shared basis")
        return Top(self.x, self.unit_class, *diagonals, basis=basis)


@dataclass(frozen=True, eq=False)
class Upward:
    """The upward pass's state (:func:`upward_pass`), per level coarsest first: ``parents``,
    ``groupings``; per class ``j_of``, ``inside`` (``I``), its pseudo-inverse and null projector,
    ``fanout``, and for parents ``s_sum``, ``k_par``, ``n_sum``, ``n_pinv``, ``same_blind``;
    per unit ``up`` (class), ``means`` (``m``) and ``m_sum`` (``M``)."""

    parents: list
    groupings: list
    up: list
    j_of: list
    fanout: list
    inside: list
    inside_pinv: list
    inside_null: list
    s_sum: list
    k_par: list
    n_sum: list
    n_pinv: list
    same_blind: list
    means: list
    m_sum: list
    rtol: float

    def summary(self) -> Summary:
        """The roots' (level 0's) summary, the classes renumbered to those present."""
        present, index = np.unique(self.up[0], return_inverse=True)
        return Summary(self.inside[0][present], index.reshape(-1).astype(np.int64), self.means[0])


def upward_pass(information: Sequence[np.ndarray], linear: Sequence[np.ndarray],
                parent_of: Sequence[np.ndarray | None], *, rtol: float = PINV_RTOL,
                leaves: Summary | None = None, basis: np.ndarray | str | None = "auto") -> Upward | DiagonalUpward:
    """The upward pass (module docstring) of :func:`estimate_hierarchy` (same arguments).
    ``leaves``: the finest level's units are the roots of subtrees summarised by their own
    upward passes (:func:`summarise`): that level's ``information`` and ``linear`` are then
    ignored (any arrays of the right shapes) and its units' ``I`` and ``m`` are the summary's.
    ``basis``: ``Q`` in which every level's ``J`` is diagonal (:func:`distfit.estimate.shared_basis.shared_basis`),
    the passes then d scalar trees (:mod:`distfit.estimate.shared_basis`: a
    :class:`~distfit.estimate.shared_basis.DiagonalUpward`); ``"auto"``: found from the levels'
    ``J`` (with ``leaves``: the summary's basis); None, or a ``J`` not diagonal in it: the general path."""
    js, hs, parents = _check(information, linear, parent_of)
    levels = len(hs)
    eye = np.eye(hs[0].shape[1])
    groupings = [None] + [Grouping.of(up, hs[level].shape[0]) for level, up in enumerate(parents[1:])]
    if isinstance(basis, str):
        basis = shared_basis(js) if leaves is None else leaves.basis
    if leaves is not None and (leaves.basis is None or basis is None or not np.array_equal(leaves.basis, basis)):
        leaves, basis = leaves.as_matrices(), None  # a summary in another basis (or none): the general path
    if basis is not None:
        diagonals = [level_diagonals(j, basis) for j in (js if leaves is None else js[:-1])]
        if all(v is not None for v in diagonals):
            given = None if leaves is None else (leaves.information[leaves.unit_class], leaves.mean)
            return diagonal_upward(diagonals, hs, parents, groupings, basis, rtol, given)
        leaves = None if leaves is None else leaves.as_matrices()
    own = [_matrix_classes(j, h.shape[0]) for j, h in zip(js[:-1], hs)] + [
        _matrix_classes(js[-1], hs[-1].shape[0]) if leaves is None else (leaves.information, leaves.unit_class)]
    up, j_of, fanout = [None] * levels, [None] * levels, [None] * levels
    inside, inside_pinv, inside_null = [None] * levels, [None] * levels, [None] * levels
    s_sum, k_par, n_sum, n_pinv = [None] * levels, [None] * levels, [None] * levels, [None] * levels
    same_blind = [None] * levels  # per parent class: its children are all blind in the same directions
    means, m_sum = [None] * levels, [None] * levels
    for level in range(levels - 1, -1, -1):
        distinct, index = own[level]
        if level + 1 < levels:
            group = groupings[level + 1]
            up[level], first, counts = _subtree_classes(index, parents[level + 1], up[level + 1], hs[level].shape[0],
                                                        inside[level + 1].shape[0])
            fanout[level] = group.fanout[first]
            s = _sym(_class_sum(counts, inside_pinv[level + 1]))
            if inside_null[level + 1].any():
                blind = _class_sum(counts, inside_null[level + 1])
                n_pinv[level], _ = psd_pinv(blind, rtol, 1.0)
                same_blind[level] = _same_null(counts, inside_null[level + 1])
                n_sum[level] = blind
                within = eye - _mm(n_pinv[level], blind)  # Pi_R = I - N^+ N
                k, _ = psd_pinv(_sym(_mm(_mm(within, s), within)), rtol)
            else:  # every child's subtree identifies its table: R = R^d, K = S^+ (N^+ None: no blind split)
                k, _ = psd_pinv(s, rtol)
            s_sum[level], k_par[level] = s, _sym(k)
            j_of[level] = distinct[index[first]]
            m_sum[level] = group.sum(means[level + 1])
            eta = hs[level] + classwise(k_par[level], up[level], m_sum[level])
        else:
            up[level], j_of[level], eta = index, distinct, hs[level]
            fanout[level] = np.zeros(distinct.shape[0], dtype=np.int64)
        inside[level] = j_of[level] + (k_par[level] if k_par[level] is not None else 0.0)
        inside_pinv[level], inside_null[level] = psd_pinv(inside[level], rtol)
        given = leaves is not None and level == levels - 1
        means[level] = np.asarray(leaves.mean, dtype=np.float64) if given else \
            classwise(inside_pinv[level], up[level], eta)
    return Upward(parents, groupings, up, j_of, fanout, inside, inside_pinv, inside_null, s_sum, k_par, n_sum,
                  n_pinv, same_blind, means, m_sum, rtol)


def summarise(state: Upward | DiagonalUpward) -> Summary:
    """What the upward pass of a forest hands the levels above: its roots' :class:`Summary`."""
    if isinstance(state, DiagonalUpward):
        information, mean = state.summary_arrays()
        return Summary(information, np.arange(mean.shape[0], dtype=np.int64), mean, state.basis)
    return state.summary()


def downward_pass(state: Upward | DiagonalUpward, *, split: str = "equal", top: Top | None = None,
                  outside: bool = True, leaf_offsets: bool = False) -> HierarchyEstimate:
    """The downward pass (module docstring) after :func:`upward_pass`; ``split`` as
    :func:`estimate_hierarchy`'s. ``top``: level 0's units are subtree roots whose estimates,
    covariances and outside information the levels above have given (:meth:`HierarchyEstimate.top`);
    otherwise they are the tree's roots. ``outside`` False: in the shared basis, no ``O`` below
    level 0 (``outside`` None there: nothing published needs it; the general path computes it).
    ``leaf_offsets``: :func:`distfit.estimate.shared_basis.diagonal_downward`'s (in the basis only)."""
    if split not in ("equal", "total"):
        raise ValueError(f"split: 'equal' or 'total', got {split!r}")
    if isinstance(state, DiagonalUpward):
        given = None
        if top is not None:
            top = top.in_basis(state.basis)
            given = (top.x, top.covariance[top.unit_class], top.outside[top.unit_class])
        xs, tildes, covs, outs, classes = diagonal_downward(state, split, given,
                                                            None if outside else [False] * len(state.inside),
                                                            leaf_offsets=leaf_offsets)
        units = [np.arange(x.shape[0]) if c is None else c for x, c in zip(xs, classes)]
        shared = [c is not None for c in classes]  # leaves of one J: one I for all, P and O per parent
        return HierarchyEstimate(x=tuple(xs), unit_class=tuple(units), covariance=tuple(covs), outside=tuple(outs),
                                 inside=tuple(state.inside[level] if shared[level] else state.unit_inside(level)
                                              for level in range(len(xs))),
                                 upward_class=tuple(np.zeros(c.shape[0], dtype=np.int64) if shared[level]
                                                    else np.arange(c.shape[0]) for level, c in enumerate(covs)),
                                 basis=state.basis, x_basis=tuple(tildes))
    if leaf_offsets:
        raise ValueError("leaf_offsets: only in the levels' shared basis")
    top = None if top is None else top.as_matrices()
    parents, groupings, up, j_of, fanout = state.parents, state.groupings, state.up, state.j_of, state.fanout
    inside, inside_pinv, inside_null = state.inside, state.inside_pinv, state.inside_null
    s_sum, k_par, n_sum, n_pinv, same_blind = state.s_sum, state.k_par, state.n_sum, state.n_pinv, state.same_blind
    means, m_sum, rtol = state.means, state.m_sum, state.rtol
    levels = len(means)
    eye = np.eye(means[0].shape[1])
    if top is None:
        xs, kinds = [means[0]], [up[0]]
        up_of = [np.arange(inside[0].shape[0])]  # each downward class's upward class
        covs, outside = [_sym(inside_pinv[0])], [np.zeros_like(inside[0])]
    else:  # the roots' downward class: (the class above gives, their own upward class)
        pairs = np.stack([np.asarray(top.unit_class, dtype=np.int64), up[0]], axis=1)
        distinct_pairs, kind = np.unique(pairs, axis=0, return_inverse=True)
        xs, kinds = [np.asarray(top.x, dtype=np.float64)], [kind.reshape(-1)]
        up_of = [distinct_pairs[:, 1]]
        covs, outside = [top.covariance[distinct_pairs[:, 0]]], [top.outside[distinct_pairs[:, 0]]]
    for level in range(1, levels):
        p, below, group = level - 1, parents[level], groupings[level]
        pairs = np.stack([kinds[p][below], up[level]], axis=1)
        distinct_pairs, kind = np.unique(pairs, axis=0, return_inverse=True)
        kind = kind.reshape(-1)
        a, b = distinct_pairs[:, 0], distinct_pairs[:, 1]
        kp = up_of[p][a]
        s, k = s_sum[p][kp], k_par[p][kp]
        own_pinv, own_null = inside_pinv[level][b], inside_null[level][b]
        gain = _mm(own_pinv, k)
        # the part of the parent's table no child measures, handed down through the null spaces
        blind_gain = None if n_pinv[p] is None else _mm(_mm(own_null, n_pinv[p][kp]), eye - _mm(s, k))
        if blind_gain is not None:
            gain += blind_gain
        remainder = xs[p][below] - m_sum[p][below]
        x = means[level] + classwise(gain, kind, remainder)
        if split == "total" and blind_gain is not None:
            weight = np.maximum(x.sum(axis=1), 0.0)
            weight += TOTAL_FLOOR * (1.0 + weight.max(initial=0.0))  # all zero: equal parts
            factor = group.fanout[below] * weight / group.sum(weight)[below]
            factor = np.where(same_blind[p][kp][kind], factor, 1.0)
            x += (factor - 1.0)[:, None] * classwise(blind_gain, kind, remainder)
        group.to_last_child(x, xs[p])  # the rounding of sum_c G_c = I
        shared = _mm(gain, own_pinv)
        cov = own_pinv - shared - np.swapaxes(shared, -1, -2) + _mm(_mm(gain, s + covs[p][a]),
                                                                     np.swapaxes(gain, -1, -2))
        del shared, gain, blind_gain, k  # per downward class each: freed before _outside's temporaries
        xs.append(x)
        kinds.append(kind)
        up_of.append(b)
        covs.append(_sym(cov))
        del cov
        outside.append(_outside(j_of[p][kp] + outside[p][a], s, None if n_sum[p] is None else n_sum[p][kp],
                                own_pinv, own_null, fanout[p][kp] == 1, rtol))
    return HierarchyEstimate(x=tuple(xs), unit_class=tuple(kinds), covariance=tuple(covs), outside=tuple(outside),
                             inside=tuple(inside), upward_class=tuple(up_of))


def _same_null(counts: scipy.sparse.csr_array, null: np.ndarray) -> np.ndarray:
    """Per parent class (a row of ``counts``): whether every child class it has (the row's
    nonzero columns) has the same null projector ``null`` (to :data:`SAME_NULL_ATOL`)."""
    coo = counts.tocoo()
    first = np.full(counts.shape[0], -1, dtype=np.int64)
    np.maximum.at(first, coo.row, coo.col)  # any one child class of each parent class
    differ = np.abs(null[coo.col] - null[first[coo.row]]).max(axis=(1, 2), initial=0.0) > SAME_NULL_ATOL
    out = np.ones(counts.shape[0], dtype=bool)
    out[coo.row[differ]] = False
    return out


def _outside(above: np.ndarray, s: np.ndarray, n: np.ndarray | None, own_pinv: np.ndarray, own_null: np.ndarray,
             only: np.ndarray, rtol: float) -> np.ndarray:
    """``O_c`` (downward classes x d x d), the information on a child's table from outside its
    subtree (module docstring): ``A_p : K_{-c}`` with ``A_p = J_p + O_p`` (``above``) and
    ``K_{-c}`` the parallel sum of its siblings' ``I`` (from ``S_p - I_c^+`` and ``N_p -
    Pi_N(I_c)``); ``A_p`` itself for an only child (``only``)."""
    s_rest = _sym(s - own_pinv)
    if n is not None:
        n_rest = n - own_null
        rest_pinv, _ = psd_pinv(n_rest, rtol, 1.0)
        within = np.eye(above.shape[-1]) - _mm(rest_pinv, n_rest)
        s_rest = _sym(_mm(_mm(within, s_rest), within))
    k_rest, _ = psd_pinv(s_rest, rtol)
    total_pinv, _ = psd_pinv(above + k_rest, rtol)
    out = _sym(_mm(_mm(above, total_pinv), k_rest))
    out[only] = above[only]
    return out
