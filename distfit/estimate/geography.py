"""Top-down estimates of a nested geography: nonnegative, children summing to their parent (pure numpy).

docs/design.md section 7 ("Geography: top-down"), after the TopDown algorithm of the 2020 US Census
(Abowd et al., "The 2020 Census Disclosure Avoidance System TopDown Algorithm", HDSR 2022):
levels are estimated from the coarsest down, each unit's children constrained to sum exactly
to the parent's estimate, cell by cell.

Measurements. Level ``l`` releases for every unit ``u`` the measurements of its plan, ``y_bu =
B_b M_b x_u + z_bu`` with ``z_bu ~ N(0, Sigma_b)`` independent across units, blocks and levels.
Their GLS objective (the projection's, :mod:`distfit.estimate.projection`) is ``0.5 x^T H_l x
- g_lu^T x`` plus a constant, ``H_l`` the level's information and ``g_lu`` its linear term
(:func:`distfit.estimate.projection.normal_equations`). A unit of level ``l`` is also measured
by its descendants: the sum of the measurements of its ``n`` descendants at a finer level
``l'`` is ``B_b M_b x_u + sum z``, noise ``N(0, n Sigma_b)`` (the descendants partition its
people), whose GLS term is ``(0.5 x^T H_l' x - G_l'u^T x) / n`` with ``G_l'u`` the sum of the
descendants' ``g``. So unit ``u`` of level ``l`` minimises

    ``0.5 x^T H_u x - g_u^T x``,  ``H_u = H_l + sum_{l' > l} H_l' / n_ul'``,
                                  ``g_u = g_lu + sum_{l' > l} G_l'u / n_ul'``

(a level ``l'`` where ``u`` has no descendant contributes nothing), every level's measurements
used once per level above it.

Constraints. The root level (one unit, or units without a parent) only has ``x_u >= 0``. The
children of a parent ``p`` (already estimated, ``X_p``) are solved together:
``x_c >= 0`` and ``sum_{c in children(p)} x_c = X_p`` cell by cell; their objective is the sum
of theirs. That set is a product, over parents and cells, of scaled simplices, so its
Euclidean projection (:func:`project_siblings`) is the simplex projection of Held, Wolfe and
Crowder (1974) / Duchi et al. (ICML 2008): sort the children's values ``v`` of one parent and
cell in decreasing order, ``rho = max{k : v_(k) - (sum_{i <= k} v_(i) - s) / k > 0}``,
``tau = (sum_{i <= rho} v_(i) - s) / rho``, ``x = max(v - tau, 0)``, in one compiled pass over
every parent and cell (:mod:`distfit.estimate.simplex`). The problem is solved by
:func:`distfit.estimate.projection.minimise_quadratic` (accelerated projected gradient) with
that projection, every parent's children in one array but each parent's a problem of its own
(``groups``: its own step from the bound of its children's ``H_u``, momentum, restart and stop;
the root level's units each alone) and the per-unit ``H_u`` applied as an operator
(:class:`WeightedInformation`, each row's product independent of the batch; a level that
measures few directions of its cells, as census.yaml's state and county levels measure 28-29 of
224, through the factor of its ``H``, :class:`FactoredInformation`: the step's products 4x
cheaper, its tables equal to the dense products' to rounding). Decision (issue 29
point 4 on the cluster): per parent, not one problem per level as before, so that a subtree's
tables depend only on its root's and its own units and a forest of subtrees solved alone gets
the whole tree's bits (docs/design.md section 7, "Integer tables on the cluster").

Where ``H_u`` is singular the minimiser is not unique; the solver starts from the parent's
table split by the children's estimated totals (:func:`sibling_start`), so a cell detail no
level measures follows the parent's.

Integer counts (``integer=True``): every finer level is solved against its parents' *integer*
counts and every level's solution rounded by :func:`distfit.estimate.rounding.round_controlled`
(the root's totals to the nearest integer, children summing exactly to their parent, cell by
cell, at every level, and every unit's total, and its sums over the sets of a laminar family of
its level's queries, within 1 of the solved table's: a controlled rounding, one maximum flow per
level). ``rounding="cells"`` is the rounding of before (each cell among its siblings alone,
:func:`distfit.estimate.rounding.round_children`; the root by
:func:`distfit.estimate.rounding.round_preserving_total`), whose unit totals gather one
rounding error per cell (2-4x the real-valued estimate's error at 224 cells), kept only to
measure against (benchmarks/bench_geography.py). With ``centre`` (:func:`integer_top_down`, what
a multi-level run's ``--integer`` uses) the same solves stay close to given tables (the
hierarchy's best linear unbiased estimates) instead of the measurements, in the same metric
``H_u``.

Nonnegative tables from the BLUE (:func:`nonnegative_top_down`, ``distfit run --nonnegative``).
The same per-parent solves with ``centre`` the hierarchy's best linear unbiased estimates ``b``
and real-valued parents: ``min sum_c (x_c - b_c)^T H_c (x_c - b_c)`` over ``x_c >= 0``, ``sum_c
x_c = X_p``. Below the root it is the top-down estimate above, from another centre but with the
same minimiser: the BLUE's children are the own-subtree estimates ``a_c = H_c^-1 g_c`` moved to
sum to their parent's BLUE, ``b_c = a_c + H_c^-1 mu_p`` with one ``mu_p`` for the siblings
(the downward pass's Lagrange condition, nonsingular ``H_c``), so ``sum_c ||x_c - b_c||^2_{H_c}
= sum_c ||x_c - a_c||^2_{H_c} - 2 mu_p^T sum_c x_c + const``, and ``sum_c x_c = X_p`` makes the
middle term a constant on the feasible set. At the root the centre is the BLUE itself, which
uses every level's measurements exactly (top-down's ``H_u`` sums a level's descendants as if
their information added up). Where ``H_c`` is singular (a level measuring few directions) the
two differ in what nothing measures, the solver's start deciding. Measured
(benchmarks/bench_geography.py: ``nonneg`` against ``top``, five releases at 2,000 counties):
the same RMSE per query to the fourth digit at every level, at 0.78-1.04x top-down's CPU.

Where the integer tables' error comes from (measured at 2,000 and 20,000 units on
pipelines/census.yaml: benchmarks/README.md, "Issue 29 point 4: `--integer` by controlled
rounding"): the top-down step changes the BLUE's unit totals little (its metric ``H_u`` weighs
the precisely measured totals heavily), and its nonnegativity lowers the RMSE near 0; the
rounding cell by cell was what cost, and the controlled rounding moves a unit's total by less
than 1 (0.23-0.26 on average).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from distfit.estimate.hierarchy import Grouping, check_parent_of
from distfit.estimate.projection import minimise_quadratic, quadratic_objective, solve_nonnegative
from distfit.estimate.rounding import round_children, round_controlled, round_preserving_total
from distfit.estimate.simplex import SegmentProjection

__all__ = [
    "NONNEGATIVE_TOL",
    "GeographyLevel",
    "ROUNDINGS",
    "SiblingProjection",
    "TopDownResult",
    "WeightedInformation",
    "descendant_terms",
    "descendant_weights",
    "estimate_top_down",
    "integer_top_down",
    "nonnegative_top_down",
    "project_siblings",
    "sibling_start",
]

@dataclass(frozen=True, eq=False)
class GeographyLevel:
    """One level of a nested geography (coarsest first): ``hessian`` ``H_l`` (cells x cells,
    or a callable ``V -> V H_l`` with a ``lipschitz`` attribute, e.g.
    :class:`distfit.estimate.projection.InformationOperator`), ``linear`` ``g_l`` (units x cells)
    and ``parent_of`` (units,) the row of each unit's parent in the level above (None: a root
    level, nonnegativity only). ``whitened`` (units x k, optional): the unit's whitened
    measurements ``C_b^-1 y_b`` of every block side by side, for the residual's constant."""

    hessian: Any
    linear: np.ndarray
    parent_of: np.ndarray | None = None
    whitened: np.ndarray | None = None

    @property
    def units(self) -> int:
        return int(self.linear.shape[0])


@dataclass(frozen=True, eq=False)
class TopDownResult:
    """Per level (coarsest first): ``x`` (units x cells, >= 0; children sum to their parent),
    ``counts`` (units x cells int64, or None without ``integer``), ``objective`` (units,)
    ``0.5 x^T H_u x - g_u^T x``, ``residual`` (units,) the GLS residual ``2 objective +
    sum_l' w_ul' ||C^-1 Y_ul'||^2`` (the weighted squared residual of the unit's own and summed
    descendants' measurements; the constant from the levels' ``whitened``, 0 where not given),
    ``iterations`` and ``converged`` (units,) bool."""

    x: tuple[np.ndarray, ...]
    counts: tuple[np.ndarray, ...] | None
    objective: tuple[np.ndarray, ...]
    residual: tuple[np.ndarray, ...]
    iterations: tuple[int, ...]
    converged: tuple[np.ndarray, ...]


#: Rows a dense product is taken in at a time (:func:`_row_blocks`): every product is one BLAS
#: call of this many rows, whatever the batch, so a row's bits cannot depend on the rows beside
#: it; a multiple of every x86-64 dgemm kernel's row unroll (Haswell 4, SkylakeX 16).
PRODUCT_ROWS = 64


def _row_blocks(v: np.ndarray, product: Callable[[np.ndarray], np.ndarray]) -> np.ndarray:
    """``product(v)`` row by row with the same bits whatever the rows beside each: OpenBLAS picks
    its kernel (and, with AVX-512, a small-matrix kernel) and sums a row in the tail of its
    unroll by the call's shape, so a row's rounding depends on how many rows share its call.
    Here every call has the shape ``(PRODUCT_ROWS, cells)``: ``v`` is padded with zero rows to
    a multiple of :data:`PRODUCT_ROWS` and multiplied as a stack of such blocks (one BLAS call a
    block, from numpy's matmul loop). With one BLAS thread (distfit's rule: runtime/threads.py) a
    forest of subtrees gets the bits the whole level gets (docs/design.md section 7). On
    OpenBLAS's Haswell kernels these are the bits one call of the whole batch gives."""
    rows, cells = v.shape
    padded = -(-rows // PRODUCT_ROWS) * PRODUCT_ROWS
    if padded != rows:
        v = np.concatenate([v, np.zeros((padded - rows, cells))])
    stacked = product(np.ascontiguousarray(v).reshape(-1, PRODUCT_ROWS, cells))
    return stacked.reshape(padded, stacked.shape[-1])[:rows]


def _apply(hessian: Any, v: np.ndarray) -> np.ndarray:
    """``v H`` for a dense ``H`` (each row's product the same bits whatever the other rows) or an
    operator."""
    if not isinstance(hessian, np.ndarray):
        return hessian(v)
    return _row_blocks(v, lambda rows: rows @ hessian)


#: A dense level information of numerical rank at most this share of its cells is applied through
#: its factor (:class:`FactoredInformation`): two products of ``2 cells r`` flops a row instead
#: of one of ``cells^2``. The levels of pipelines/census.yaml below the nation measure 28-29
#: directions of 224 cells (a product 4x cheaper); the nation's is of full rank and stays dense.
FACTOR_RANK_SHARE = 0.25
#: Eigenvalues at most this fraction of the largest count as zero in the factor: the information
#: is a sum of products of the plan's whitened rows, whose null space shows as eigenvalues of
#: rounding size (4e-16 of the largest on census.yaml's county level).
FACTOR_CUTOFF = 1e-12


class FactoredInformation:
    """A level's information ``H`` (cells x cells, PSD) as ``F F^T`` (``F`` cells x r, from its
    eigenvectors of eigenvalue above :data:`FACTOR_CUTOFF` of the largest, scaled by their
    square roots: ``H`` to rounding): ``op(V) = (V F) F^T``, each row's product independent of the
    rows beside it (:func:`_row_blocks`). ``lipschitz``: the largest eigenvalue."""

    def __init__(self, factor: np.ndarray, lipschitz: float) -> None:
        self.factor = np.ascontiguousarray(factor)
        self.transpose = np.ascontiguousarray(factor.T)
        self.lipschitz = float(lipschitz)

    @classmethod
    def of(cls, hessian: Any) -> Any:
        """``hessian`` as a :class:`FactoredInformation` where it is a dense matrix of rank at most
        :data:`FACTOR_RANK_SHARE` of its cells, else as given."""
        if not isinstance(hessian, np.ndarray) or not hessian.size:
            return hessian
        values, vectors = np.linalg.eigh(hessian)
        top = max(float(values[-1]), np.finfo(float).tiny)
        kept = values > FACTOR_CUTOFF * top
        if kept.sum() > FACTOR_RANK_SHARE * hessian.shape[0]:
            return hessian
        return cls(vectors[:, kept] * np.sqrt(values[kept]), top)

    def __call__(self, v: np.ndarray) -> np.ndarray:
        return _row_blocks(v, lambda rows: (rows @ self.factor) @ self.transpose)


def _top_eigenvalue(hessian: Any) -> float:
    if isinstance(hessian, np.ndarray):
        return float(np.linalg.eigvalsh(hessian)[-1]) if hessian.size else 0.0
    return float(hessian.lipschitz)


class WeightedInformation:
    """The per-unit information ``H_u = sum_j w_uj H_j`` as an operator on all units at once:
    ``op(V)[u] = sum_j w_uj (V H_j)[u]`` (``V`` units x cells, rows in the units' order, or in
    the order of :meth:`rows`' index on the operator it returns). ``lipschitz``:
    ``sum_j max_u w_uj lambda_max(H_j)``, an upper bound of every ``lambda_max(H_u)``
    (:meth:`group_lipschitz`: of each group's)."""

    def __init__(self, hessians: Sequence[Any], weights: np.ndarray) -> None:
        self.hessians = tuple(FactoredInformation.of(h) for h in hessians)
        self.weights = np.asarray(weights, dtype=np.float64)  # (units, len(hessians))
        self._lipschitz: float | None = None

    def __call__(self, v: np.ndarray) -> np.ndarray:
        out = None
        for j, hessian in enumerate(self.hessians):
            w = self.weights[:, j]
            if np.any(w):
                term = _apply(hessian, v)
                if not np.all(w == 1.0):  # a leaf level's own information comes with weight 1: no pass
                    term *= w[:, None]
                if out is None:
                    out = term
                else:
                    out += term
        return np.zeros_like(v, dtype=np.float64) if out is None else out

    def dense(self, weights: np.ndarray) -> np.ndarray | None:
        """``sum_j w_j H_j`` (cells x cells) for one row of weights; None where a level's ``H``
        is an operator with no matrix."""
        out = None
        for w, hessian in zip(np.asarray(weights, dtype=np.float64), self.hessians):
            if isinstance(hessian, FactoredInformation):
                matrix = hessian.factor @ hessian.transpose
            elif isinstance(hessian, np.ndarray):
                matrix = hessian
            else:
                return None
            out = w * matrix if out is None else out + w * matrix
        return out

    def rows(self, index: np.ndarray) -> "WeightedInformation":
        """The same operator on the units ``index`` alone, in that order (their weights)."""
        return WeightedInformation(self.hessians, self.weights[np.asarray(index, dtype=np.int64)])

    def group_lipschitz(self, groups: np.ndarray) -> np.ndarray:
        """Per row: ``sum_j max_{u in its group} w_uj lambda_max(H_j)``, an upper bound of
        ``lambda_max(H_u)`` over the rows of its group (``groups`` (units,)), so a group's step
        is its own (:func:`distfit.estimate.projection.minimise_quadratic`'s ``groups``)."""
        _, group = np.unique(np.asarray(groups), return_inverse=True)
        group = group.reshape(-1)
        top = np.zeros(int(group.max(initial=-1)) + 1)
        for j, hessian in enumerate(self.hessians):
            most = np.zeros_like(top)
            np.maximum.at(most, group, self.weights[:, j])
            top += most * _top_eigenvalue(hessian)
        return np.maximum(top, np.finfo(float).tiny)[group]

    @property
    def lipschitz(self) -> float:
        if self._lipschitz is None:
            top = sum(float(self.weights[:, j].max(initial=0.0)) * _top_eigenvalue(h)
                      for j, h in enumerate(self.hessians))
            self._lipschitz = max(top, np.finfo(float).tiny)
        return self._lipschitz


def _check_parents(levels: Sequence[GeographyLevel]) -> list[np.ndarray | None]:
    """Every level's parent rows (:func:`distfit.estimate.hierarchy.check_parent_of`)."""
    return [check_parent_of(level.parent_of, i, level.units, levels[i - 1].units if i else 0)
            for i, level in enumerate(levels)]


def _squared_norms(whitened: np.ndarray | None, units: int) -> np.ndarray:
    if whitened is None:
        return np.zeros(units)
    return np.einsum("ij,ij->i", whitened, whitened)


def _sum_up(groupings: Sequence[Grouping | None], i: int, j: int, values: np.ndarray) -> np.ndarray:
    """The sums of level ``j``'s ``values`` (units x ...) over the descendants of level ``i``'s
    units (``j >= i``), carried up level by level (sparse products, no loop over units)."""
    for k in range(j, i, -1):
        values = groupings[k].sum(values)
    return values


def _groupings(levels: Sequence[GeographyLevel]) -> list[Grouping | None]:
    parents = _check_parents(levels)
    return [None] + [Grouping.of(parents[i], levels[i - 1].units) for i in range(1, len(levels))]


def descendant_weights(levels: Sequence[GeographyLevel],
                       below: Sequence[tuple[Any, np.ndarray]] = ()) -> list[np.ndarray]:
    """Per level ``l``: ``weights`` (units, K - l), the coefficient of ``H_l, H_l+1, ...`` in
    its units' ``H_u`` (module docstring): 1 for ``H_l``, ``1 / n_ul'`` for a finer level where
    the unit has ``n_ul' > 0`` descendants, else 0. ``below``: levels under the last one not
    given whole, each as ``(H, n)``, ``n`` (last level's units,) each unit's number of
    descendants there (columns after the levels')."""
    groupings = _groupings(levels)
    last = len(levels) - 1
    out = []
    for i, level in enumerate(levels):
        counts = np.stack([_sum_up(groupings, i, j, np.ones(levels[j].units)) for j in range(i, len(levels))]
                          + [_sum_up(groupings, i, last, np.asarray(n, dtype=np.float64)) for _, n in below], axis=1)
        out.append(np.where(counts > 0, 1.0 / np.where(counts > 0, counts, 1.0), 0.0))
    return out


def descendant_terms(levels: Sequence[GeographyLevel]) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """Per level ``l``: ``(weights, linear, constant)`` of its units' objective (module
    docstring): ``weights`` those of :func:`descendant_weights`, ``linear`` (units x cells)
    ``g_u`` and ``constant`` (units,) ``sum_l' w_ul' ||sum of the descendants' whitened
    measurements||^2`` (0 for levels without ``whitened``)."""
    groupings = _groupings(levels)
    out = []
    for i, (level, weights) in enumerate(zip(levels, descendant_weights(levels))):
        linear = np.zeros(np.shape(level.linear))
        constant = np.zeros(level.units)
        for j in range(i, len(levels)):
            w = weights[:, j - i]
            linear += w[:, None] * _sum_up(groupings, i, j, np.asarray(levels[j].linear, dtype=np.float64))
            white = levels[j].whitened
            constant += w * _squared_norms(None if white is None else _sum_up(groupings, i, j, white), level.units)
        out.append((weights, linear, constant))
    return out


class SiblingProjection:
    """The Euclidean projection onto ``{x >= 0, sum_{c: parent_of[c] = p} x_c = totals[p]}``
    (``x`` children x cells, ``totals`` parents x cells, clipped at 0): every parent and cell a
    scaled simplex (module docstring: sort, threshold, clip), by the compiled pass of
    :class:`distfit.estimate.simplex.SegmentProjection`, prepared once (a level's solve projects
    hundreds of times): the children's rows in parent order, where each parent's start, and its
    table."""

    def __init__(self, parent_of: np.ndarray, totals: np.ndarray) -> None:
        parent_of = np.asarray(parent_of, dtype=np.int64)
        n = parent_of.size
        self.parent_of = parent_of
        self.totals = np.maximum(np.asarray(totals, dtype=np.float64), 0.0)
        order = np.argsort(parent_of, kind="stable")  # children grouped by parent
        grouped = parent_of[order]
        first = np.flatnonzero(np.r_[True, grouped[1:] != grouped[:-1]]) if n else np.zeros(0, dtype=np.int64)
        self.segments = SegmentProjection(order, np.r_[first, n], self.totals[grouped[first]])

    def rows(self, index: np.ndarray) -> "SiblingProjection":
        """The projection of the children ``index`` alone, in that order (whole families: a
        parent's children all in ``index`` or none, as a stopped group leaves them)."""
        return SiblingProjection(self.parent_of[np.asarray(index, dtype=np.int64)], self.totals)

    def __call__(self, v: np.ndarray) -> np.ndarray:
        v = np.asarray(v, dtype=np.float64)
        if not v.size:
            return v.copy()
        return self.segments(v)


def project_siblings(v: np.ndarray, parent_of: np.ndarray, totals: np.ndarray) -> np.ndarray:
    """The Euclidean projection of ``v`` (children x cells) onto ``{x >= 0, sum_{c: parent_of[c]
    = p} x_c = totals[p]}`` (:class:`SiblingProjection`, prepared and applied once)."""
    return SiblingProjection(parent_of, totals)(v)


def sibling_start(parent_totals: np.ndarray, parent_of: np.ndarray, share: np.ndarray) -> np.ndarray:
    """The start of a level's solve: each parent's table split among its children in proportion
    to ``share`` (children,) (clipped at 0; equal parts where a parent's shares are all 0)."""
    parent_of = np.asarray(parent_of, dtype=np.int64)
    share = np.maximum(np.asarray(share, dtype=np.float64), 0.0)
    parents = parent_totals.shape[0]
    norm = np.bincount(parent_of, weights=share, minlength=parents)
    size = np.bincount(parent_of, minlength=parents).astype(np.float64)
    fraction = np.where(norm[parent_of] > 0, share / np.where(norm > 0, norm, 1.0)[parent_of],
                        1.0 / np.maximum(size, 1.0)[parent_of])
    return fraction[:, None] * parent_totals[parent_of]


def _estimated_totals(hessian: Any, linear: np.ndarray) -> np.ndarray:
    """Each unit's total from its own level's least-squares solution ``g H^+`` (dense ``H``);
    equal shares (ones) for an operator."""
    if isinstance(hessian, np.ndarray):
        return (linear @ np.linalg.pinv(hessian, hermitian=True)).sum(axis=1)
    return np.ones(linear.shape[0])


def _nonnegative(v: np.ndarray) -> np.ndarray:
    return np.maximum(v, 0.0)


#: How :func:`estimate_top_down` rounds a level's tables (module docstring, "Integer counts").
ROUNDINGS = ("controlled", "cells")


def estimate_top_down(levels: Sequence[GeographyLevel], *, integer: bool = False, tol: float = 1e-9,
                      max_iter: int = 20000,
                      centre: Sequence[np.ndarray] | None = None,
                      families: Sequence[np.ndarray | None] | None = None,
                      rounding: str = "controlled", roots: np.ndarray | None = None,
                      below: Sequence[tuple[Any, np.ndarray]] = (),
                      progress: Callable[[int, int], None] | None = None) -> TopDownResult:
    """Every level's estimates, coarsest first (module docstring): the root level by
    nonnegative GLS, each finer level by GLS with its children summing to their parent's
    estimate (``integer``: to the parent's integer counts, then rounded so they sum exactly).
    ``tol``/``max_iter``: :func:`distfit.estimate.projection.minimise_quadratic`'s.
    ``progress(done, units)`` is called as the units of every level are solved (a parent's
    children count as it stops), ending with ``(units, units)``.

    ``centre`` (per level, units x cells; e.g. the hierarchy's best linear unbiased estimates):
    tables to stay close to instead of the measurements, in the same metric: unit ``u``
    minimises ``0.5 (x - c_u)^T H_u (x - c_u)`` (linear term ``g_u = H_u c_u``) under the same
    constraints, each level's solve starting from ``c`` projected onto them
    (:func:`integer_top_down`).

    ``rounding`` (with ``integer``): ``"controlled"``
    (:func:`distfit.estimate.rounding.round_controlled`: every unit's total, and its sums over
    each set of its level's ``families[i]`` (sets x cells, laminar; None: the total only), within
    1 of the solved table's) or ``"cells"`` (each cell rounded among its siblings alone, the
    rounding before issue 29 point 4, kept to measure against: benchmarks/bench_geography.py).

    Each level's solve is one problem per parent (its children; the root level's units each
    alone), solved as if alone (:func:`distfit.estimate.projection.minimise_quadratic`'s
    ``groups``: its own step, momentum and stop), so a parent's children get the same tables, bit
    for bit, whatever else is solved beside them (a forest of subtrees at a time on the cluster:
    docs/design.md section 7). ``roots`` (with ``centre``): level 0's tables, given (integer
    counts with ``integer``; made above, e.g. the cut level's for a forest of subtrees): level 0
    is not solved. ``below`` (with ``centre``): :func:`descendant_weights`' levels under the last, so
    that the units' ``H_u`` are the whole tree's when its top levels are solved alone."""
    if not levels:
        raise ValueError("levels: at least one level")
    if rounding not in ROUNDINGS:
        raise ValueError(f"rounding: one of {', '.join(ROUNDINGS)}, got {rounding!r}")
    if (roots is not None or below) and centre is None:
        raise ValueError("roots, below: only with centre")
    cells = int(np.asarray(levels[0].linear).shape[1])
    for i, level in enumerate(levels):
        if np.asarray(level.linear).ndim != 2 or np.asarray(level.linear).shape[1] != cells:
            raise ValueError(f"level {i}: linear must be (units, {cells}), got {np.asarray(level.linear).shape}")
        if centre is not None and np.shape(centre[i]) != np.shape(level.linear):
            raise ValueError(f"level {i}: centre must be {np.shape(level.linear)}, got {np.shape(centre[i])}")
    if families is not None and len(families) != len(levels):
        raise ValueError(f"families: one per level ({len(levels)}), got {len(families)}")
    parents = _check_parents(levels)
    # centred, the objective's linear term and constant come from the centre, not the measurements
    terms = (descendant_terms(levels) if centre is None
             else [(w, None, None) for w in descendant_weights(levels, below)])
    # each level's H (and those below) factored once, not once for every level above it
    informations = [FactoredInformation.of(h) for h in [lv.hessian for lv in levels] + [h for h, _ in below]]
    xs, counts, objectives, residuals, iterations, converged = [], [], [], [], [], []
    units = sum(level.units for level in levels)
    for i, level in enumerate(levels):
        before = sum(lv.units for lv in levels[:i])
        solved = None if progress is None else (lambda done, _rows, before=before: progress(before + done, units))
        weights, linear, constant = terms[i]
        hessian = WeightedInformation(informations[i:], weights)
        if centre is not None:
            point = np.asarray(centre[i], dtype=np.float64)
            linear = hessian(point)
            constant = np.einsum("ij,ij->i", linear, point)  # ||c_u||^2 in H_u: the residual's 0 at c
        parent_of = parents[i]
        if parent_of is None:
            project = _nonnegative
            start = (point if centre is not None
                     else linear @ np.linalg.pinv(level.hessian, hermitian=True)
                     if isinstance(level.hessian, np.ndarray) else linear / hessian.lipschitz)
            start = _nonnegative(start)
        else:
            above = counts[i - 1].astype(np.float64) if integer else xs[i - 1]
            project = SiblingProjection(parent_of, above)
            start = (project(point) if centre is not None
                     else sibling_start(above, parent_of, _estimated_totals(level.hessian, level.linear)))
        if i == 0 and roots is not None:  # given
            given = _check_roots(roots, np.shape(level.linear), integer)
            x = given.astype(np.float64)
            iterations.append(0)
            converged.append(np.ones(level.units, dtype=bool))
        else:
            groups = np.arange(level.units) if parent_of is None else parent_of  # one problem per parent
            result = minimise_quadratic(hessian, linear, project, start, tol=tol, max_iter=max_iter,
                                        lipschitz=hessian.group_lipschitz(groups), groups=groups, progress=solved)
            x, settled = ((result.x, result.converged) if parent_of is not None
                          else _exact_roots(hessian, linear, result.x, result.converged, tol))
            iterations.append(int(result.iterations))
            converged.append(settled)
        xs.append(x)
        objectives.append(quadratic_objective(hessian, linear, x))
        residuals.append(np.maximum(2.0 * objectives[-1] + constant, 0.0))
        if integer:
            family = None if families is None else families[i]
            counts.append(given if i == 0 and roots is not None else
                          _round_level(x, parent_of, counts[i - 1] if i else None, family, rounding))
        if progress is not None:
            progress(before + level.units, units)
    return TopDownResult(x=tuple(xs), counts=tuple(counts) if integer else None, objective=tuple(objectives),
                         residual=tuple(residuals), iterations=tuple(iterations), converged=tuple(converged))


#: :func:`_exact_roots` solves the root level exactly when its units' ``H_u`` are at most this
#: many different matrices (one per set of descendant weights; census.yaml's nation: one).
ROOT_CLASSES = 16


def _exact_roots(hessian: WeightedInformation, linear: np.ndarray, x: np.ndarray, converged: np.ndarray,
                 tol: float) -> tuple[np.ndarray, np.ndarray]:
    """The root level's tables ``argmin_{x >= 0} 0.5 x^T H_u x - g_u^T x`` to the KKT point:
    from the accelerated gradient's ``x``, the active-set steps of
    :func:`distfit.estimate.projection.solve_nonnegative` on each class of units sharing one
    ``H_u`` (dense, formed once a class). Why: the gradient's stopping rule leaves a root's
    objective ~1e-4 (relative) above its minimum where ``H_u`` is ill-conditioned (census.yaml's
    nation, targets 1 and 4 over 224 cells), which moved the nation's RMSE in the third digit
    between two starts of the same problem (benchmarks/bench_geography.py); the exact solution
    depends on the problem alone. Rows the steps do not settle keep the gradient's; with more
    than :data:`ROOT_CLASSES` classes or an operator ``H``, ``x`` as given. Returns ``(x,
    converged)``, ``converged`` the gradient's or the steps'."""
    classes, inverse = np.unique(hessian.weights, axis=0, return_inverse=True)
    if classes.shape[0] > ROOT_CLASSES:
        return x, converged
    out, settled = x.copy(), converged.copy()
    for k, weights in enumerate(classes):  # a loop over the root level's classes of H_u (few)
        dense = hessian.dense(weights)
        if dense is None:
            return x, converged
        rows = np.flatnonzero(inverse.reshape(-1) == k)
        solved, done, _ = solve_nonnegative(dense, linear[rows], x[rows], tol=tol)
        out[rows[done]] = np.maximum(solved[done], 0.0)
        settled[rows[done]] = True
    return out, settled


def _check_roots(roots: np.ndarray, shape: tuple[int, ...], integer: bool) -> np.ndarray:
    """``roots`` as int64 counts (``integer``) or float64 tables of ``shape``; ValueError (one
    line) unless nonnegative (and finite) numbers, integers with ``integer``."""
    tables = np.asarray(roots)
    kind = "integer counts" if integer else "tables"
    if tables.shape != shape or (tables.size and not np.all(np.isfinite(tables))) or \
            (integer and tables.size and not np.all(tables == np.round(tables))) or \
            (tables.size and tables.min() < 0):
        raise ValueError(f"roots: expected nonnegative {kind} of shape {shape}, got shape {tables.shape}")
    return tables.astype(np.int64 if integer else np.float64)


def _round_level(x: np.ndarray, parent_of: np.ndarray | None, above: np.ndarray | None, family: np.ndarray | None,
                 rounding: str) -> np.ndarray:
    """A level's integer counts (``estimate_top_down``'s ``rounding``): the roots' keeping their
    totals, the children of each parent (summing to its integer counts ``above`` up to
    rounding) summing to them exactly; parents without children left out (nothing to split)."""
    if parent_of is None:
        return round_controlled(x, family) if rounding == "controlled" else round_preserving_total(x)
    present, up = np.unique(np.asarray(parent_of, dtype=np.int64), return_inverse=True)
    if rounding == "controlled":
        return round_controlled(x, family, up.reshape(-1), above[present])
    return round_children(x, up.reshape(-1), above[present])


def integer_top_down(levels: Sequence[GeographyLevel], centre: Sequence[np.ndarray], *,
                     families: Sequence[np.ndarray | None] | None = None, tol: float = 1e-6,
                     max_iter: int = 20000, roots: np.ndarray | None = None,
                     below: Sequence[tuple[Any, np.ndarray]] = (),
                     progress: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, ...]:
    """Nonnegative integer tables (int64, per level, coarsest first) close to real-valued ones
    ``centre`` (e.g. the hierarchy's best linear unbiased estimates, which may be below 0), every
    unit's children summing exactly to it, cell by cell: :func:`estimate_top_down` with
    ``integer`` and ``centre``. Level by level, coarsest first, each unit's table minimises
    ``(n - c_u)^T H_u (n - c_u)`` over ``n >= 0`` with the children of a parent summing to the
    parent's integer counts, then is rounded keeping those sums and, within 1, every unit's
    total and its sums over the sets of ``families[l]`` (e.g.
    :func:`distfit.estimate.rounding.laminar_family` of the level's queries):
    :func:`distfit.estimate.rounding.round_controlled`. ``H_u`` is the information of
    the unit's own and its descendants' measurements (module docstring), the metric of the
    release's noise: a deviation along a direction the queries measure precisely costs much,
    one along a direction nothing measures costs nothing (docs/design.md section 7, "Integer
    tables"). ``levels``: each level's ``hessian`` and ``parent_of`` (their ``linear`` only
    gives the shape); ``tol``/``max_iter``: the solver's (a few units' worth of precision is
    enough before rounding).

    Per parent: each parent's children are solved and rounded as if alone (:func:`estimate_top_down`,
    :func:`distfit.estimate.rounding.round_controlled`: one maximum flow whose parents do not
    meet), so the tables of a subtree depend only on its root's counts and its own units: the
    cluster runs the levels below a cut a forest of subtrees at a time and gets the same
    integers, bit for bit (:mod:`distfit.estimate.subtree_job`). ``roots``: level 0's counts,
    given (a forest's roots, from the cut level's tables); ``below``: the levels under the last,
    ``(H, descendants of each last-level unit)`` each, so the top levels alone get the whole
    tree's ``H_u`` (the driver's part of the same). ``progress(done, units)``: as
    :func:`estimate_top_down`'s."""
    return estimate_top_down(levels, integer=True, tol=tol, max_iter=max_iter, centre=centre,
                             families=families, roots=roots, below=below, progress=progress).counts


#: :func:`nonnegative_top_down`'s tolerance (:func:`distfit.estimate.projection.minimise_quadratic`'s
#: ``tol``): published real-valued tables, so tighter than the integer step's 1e-6, which rounding follows.
NONNEGATIVE_TOL = 1e-9


def nonnegative_top_down(levels: Sequence[GeographyLevel], centre: Sequence[np.ndarray], *,
                         tol: float = NONNEGATIVE_TOL, max_iter: int = 20000, roots: np.ndarray | None = None,
                         below: Sequence[tuple[Any, np.ndarray]] = (),
                         progress: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, ...]:
    """Nonnegative real-valued tables (float64, per level, coarsest first) nearest real-valued
    ones ``centre`` (the hierarchy's best linear unbiased estimates, which may be below 0), every
    unit's children summing to it cell by cell (to float rounding): :func:`estimate_top_down`
    with ``centre``, not rounded. Level by level, coarsest first, each unit's table minimises
    ``(x - c_u)^T H_u (x - c_u)`` over ``x >= 0`` with the children of a parent summing to the
    parent's table (module docstring, "Nonnegative tables from the BLUE"): the nonnegativity
    step of the Census Bureau's TopDown applied to the BLUE, as BlueDown (arXiv 2603.10099) does
    before it rounds. ``roots``, ``below``, ``progress``: as :func:`integer_top_down`'s
    (``roots``: level 0's real-valued tables); per parent, so a forest of subtrees solved alone
    gets the whole tree's tables bit for bit from the same ``centre`` and roots."""
    return estimate_top_down(levels, tol=tol, max_iter=max_iter, centre=centre, roots=roots, below=below,
                             progress=progress).x
