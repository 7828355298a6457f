"""The projection mechanism's post-processing: the nonnegative data vector closest to the release.

docs/design.md section 7, paper 002. Per unit, with the recovered measurements ``y_b = B_b M_b x
+ z_b`` of every block (:func:`distfit.estimate.measurements.recover_measurements`),

    ``x_hat = argmin_{x >= 0} sum_b (y_b - B_b M_b x)^T Sigma_b^-1 (y_b - B_b M_b x)``.

Expanding the square, that is ``argmin_{x >= 0} 0.5 x^T H x - g^T x`` (the objective is
``2 (0.5 x^T H x - g^T x) + sum_b y_b^T Sigma_b^-1 y_b``) with

    ``H   = sum_b M_b^T B_b^T Sigma_b^-1 B_b M_b``   (cells x cells, the same for every unit),
    ``g_u = sum_b M_b^T B_b^T Sigma_b^-1 y_bu``     (one row per unit)  (:func:`normal_equations`).

Only ``g`` varies between units, so a chunk of units is one matrix problem (units x cells):
every iteration multiplies the whole chunk by ``H`` at once. ``H`` is dense up to
:data:`DENSE_CELLS` cells; above that it is an operator (:class:`InformationOperator`:
marginalise, multiply by each block's ``d_b x d_b`` information, expand; never cells x cells).

``H`` may be singular (the blocks need not determine every cell): ``x_hat`` is then not
unique, but ``B_b M_b x_hat`` (the objective is strictly convex in them) and so the estimates
``W x_hat = L B M x_hat`` are. Because the true ``x`` is feasible and the feasible set convex,
the ``H``-norm error of ``x_hat`` (the Sigma^-1 error of ``B x_hat``) is never larger than
that of the measurements (a projection onto a convex set is non-expansive), draw by draw.

Solver (:func:`minimise_quadratic`, any convex set given by its Euclidean projection):
accelerated projected gradient (FISTA, step ``1/lambda_max(H)``) with O'Donoghue-Candes
gradient restart, per unit; a unit stops when its projected-gradient step
``r = x - P(x - grad/lambda_max)`` has ``||r||_inf <= tol * max(1, ||x||_inf)`` (``r = 0``
exactly at the optimum), and converged units leave the active set. :func:`project_nonnegative`
(dense ``H``) solves the orthant exactly by primal-dual active-set steps (Hintermueller-Ito-
Kunisch; a semismooth Newton method on the KKT system): from the free set ``F`` it solves
``H_FF x_F = g_F`` with ``x_A = 0`` for every unit at once (systems stacked by free-set size),
then frees the cells of ``A`` with a negative multiplier ``(H x - g)_i`` and fixes the cells of
``F`` that went negative; a unit stops when ``F`` no longer changes, which is exactly the KKT
point (``x_F > 0``, ``grad_F = 0``, ``grad_A >= 0``). The first ``F`` is the cells whose
unconstrained estimate ``g H^+`` exceeds its own standard deviation ``sqrt(diag H^+)``
(measured on PL94: 8 steps, 5x less time than starting from ``g H^+ > 0``). Units that do not
settle in :data:`NEWTON_STEPS` (the method may cycle where ``H`` is not an M-matrix) run
:data:`FISTA_ROUND` FISTA iterations and try again. An operator ``H`` uses FISTA alone.

Where ``H`` is block diagonal plus low rank (PL94: 4 x 4 blocks per race plus rank 6;
:func:`projection_structure`, found once per model and kept with it), the same active-set steps solve
the free-cell systems by Woodbury without gathering them (:mod:`distfit.estimate.orthant`:
float64 steps unit by unit in a compiled loop, one refinement with the dense ``H`` and the KKT
check), :data:`STRUCTURE_BATCH` units at a time (``g`` computed per batch). The objective
comes from the solver: ``2 (0.5 x^T H x - g^T x)`` plus the constant ``sum_b |C_b^-1 y_b|^2``;
where the whitened measurements span the cells (``sum_b k_b = cells``, ``H`` nonsingular: the
stacked ``G_b M_b`` is square and invertible, PL94), the constant is ``g^T H^-1 g`` and the
objective ``(x - H^-1 g)^T H (x - H^-1 g)``, from ``H^-1 g`` (the solver's first solve)
without a constant, and without its cancellation. ``distfit estimate`` passes the released
answers (``answers=True``): then ``g = sum_b M_b^T (a_b[S] K_b)`` in one product from the
answers (:attr:`distfit.estimate.measurements.BlockMeasurement.answer_linear`: ``K_b = (C_b^-1
R_b)^T G_b`` with the left inverse ``R_b`` of a square subset ``S`` of the rows of ``L_b``: PL94,
252 of 319), no whitened measurement formed. Before it took the whitened measurements
(``whitened=True``: ``C^-1 y = (C^-1 R) a``,
:func:`distfit.estimate.measurements.whitened_measurements`).

Where the answers to the cell queries are ``H^-1 g`` itself (one square block on every cell,
the workload holding every cell: PL94; :func:`unconstrained_answers`), the structured path
starts from them: no ``g`` product and no first solve (the steps run on the structure's
``(D + V V^T) x_u``, the defect entering the refinement: :func:`distfit.estimate.orthant.solve_orthant`),
and ``x`` may be written straight into the caller's array (``out``: the query estimates' cell
columns).

Measured (PL94, chunks of 4096 units, one BLAS thread, a worker's task loop of 196,608 units
under cProfile, session 9): 16.5 us a unit in all, the kernel 11.5, a float32 product ``E x_u``
2.0 (conversion and product; since dropped: the kernel forms it only for a unit whose KKT
check fails), ``W x`` 1.7. Session 8 (CPU time, machine shared with load 2-4): the
estimate's projection from the answers (``answers=True``) 16.9-18.5 us a unit, of which ``g``
3.1, against 32 before that session (whitening 4.4 plus the projection 27.6);
benchmarks/bench_projection.py (from recovered measurements): 18.3 us per unit with the
structure (31.4 in the same conditions before; 37 for the numpy version of
:mod:`distfit.estimate.structure`, 74 before its batching), 275 us on the dense path (gathered
systems, stacked LAPACK solves), 1550 us for a loop of ``scipy.optimize.nnls`` on the whitened
system; the solutions agree to 7e-11. Once per process the compiled loop is loaded from
numba's cache (0.2 s; compiled on a cache miss: 7 s).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import scipy.linalg.blas

from distfit.estimate.measurements import MeasurementModel
from distfit.estimate.orthant import solve_orthant
from distfit.estimate.structure import BlockLowRank, block_low_rank

__all__ = [
    "DENSE_CELLS",
    "InformationOperator",
    "ProjectionResult",
    "QPResult",
    "minimise_quadratic",
    "normal_equations",
    "hessian_structure",
    "prepare_projection",
    "project_nonnegative",
    "projection_memory_bytes",
    "projection_structure",
    "quadratic_objective",
    "solve_nonnegative",
    "unconstrained_answers",
]

#: Domains of at most this many cells get a dense ``H`` (cells x cells float64: 128 MiB at 4096).
DENSE_CELLS = 4096
#: float64 arrays of ``units x cells`` a chunk's projection keeps alive at once (``g``, ``x``,
#: FISTA's momentum, gradient, previous and trial points, the active-set solve's gathers, the
#: published estimates' cells): the memory estimate's factor (:func:`projection_memory_bytes`).
PROJECTION_COPIES = 10
#: Power iterations for ``lambda_max(H)`` of an operator, and the safety factor on the result.
POWER_ITERATIONS = 60
POWER_SAFETY = 1.05
#: Active-set systems are grouped by free-set size rounded up to a multiple of this.
FREE_BUCKET = 8
#: Relative eigenvalue cutoff of the pseudo-inverse of a singular free-set system.
PINV_CUTOFF = 1e-10
#: Active-set (Newton) steps per round, and FISTA iterations between rounds.
NEWTON_STEPS = 25
FISTA_ROUND = 200
#: ``K`` and ``H`` equal to this (relative to ``max |H|``): the cell queries' answers are
#: ``H^-1 g`` (:func:`unconstrained_answers`).
UNCONSTRAINED_TOLERANCE = 1e-12
#: Units solved together on the structured path (:mod:`distfit.estimate.structure`): their
#: ``g``, ``x`` and gradient stay in cache (PL94, 4096 units: 256 to 512 measured best, 1024
#: 5-8 % slower).
STRUCTURE_BATCH = 256
#: Structures of ``H`` found (:func:`distfit.estimate.structure.block_low_rank`), with their
#: ``H``: every chunk of a plan shares one ``H``; the search runs once per process and plan.
STRUCTURE_CACHE = 8
_structures: list[tuple[np.ndarray, tuple[int, ...], BlockLowRank | None]] = []


@dataclass(frozen=True, eq=False)
class QPResult:
    """``x`` (units x cells), ``objective`` (units,) ``0.5 x^T H x - g^T x``, ``iterations`` (the
    most any unit ran), ``converged`` (units,) bool (the stopping rule held)."""

    x: np.ndarray
    objective: np.ndarray
    iterations: int
    converged: np.ndarray


@dataclass(frozen=True, eq=False)
class ProjectionResult:
    """``x`` (units x cells, >= 0), ``objective`` (units,) ``sum_b (y_b - B_b M_b x)^T
    Sigma_b^-1 (y_b - B_b M_b x)``, ``iterations`` (the most any unit ran), ``converged``."""

    x: np.ndarray
    objective: np.ndarray
    iterations: int
    converged: np.ndarray


class InformationOperator:
    """``H`` as an operator on chunks: ``op(V) = V H`` for ``V`` (units x cells), computed as
    ``sum_b M_b^T (M_b V) H_b`` with the block informations ``H_b = G_b^T G_b`` (or the two
    products with ``G_b`` where ``H_b`` is not kept); never cells x cells.
    ``lipschitz``: an upper estimate of ``lambda_max(H)`` (power iteration, times 1.05, capped
    by the bound ``sum_b lambda_max(H_b) cells / d_b``)."""

    def __init__(self, model: MeasurementModel) -> None:
        self.model = model
        self.cells = model.cells
        self._lipschitz: float | None = None

    def __call__(self, v: np.ndarray) -> np.ndarray:
        model = self.model
        out = np.zeros((v.shape[0], model.cells))
        for block in model.blocks:
            marg = model.marginal(v, block)
            if block.information is not None:
                prod = marg @ block.information
            else:
                prod = (marg @ block.whitened_basis.T) @ block.whitened_basis
            model.add_expanded(out, prod, block)
        return out

    @property
    def lipschitz(self) -> float:
        if self._lipschitz is None:
            bound = 0.0
            for block in self.model.blocks:
                top = np.linalg.norm(block.whitened_basis, 2) ** 2
                bound += top * self.model.cells / block.cells
            v = np.random.default_rng(0).standard_normal((1, self.cells))
            estimate = 0.0
            for _ in range(POWER_ITERATIONS):
                w = self(v)
                estimate = float(np.linalg.norm(w))
                if estimate == 0.0:
                    break
                v = w / estimate
            self._lipschitz = max(min(bound, POWER_SAFETY * estimate), np.finfo(float).tiny)
        return self._lipschitz


def normal_equations(model: MeasurementModel, measurements: Mapping[str, np.ndarray]
                     ) -> tuple[np.ndarray | InformationOperator, np.ndarray]:
    """``(H, g)`` of the projection (module docstring): ``H`` dense (cells x cells) for at most
    :data:`DENSE_CELLS` cells, else an :class:`InformationOperator`; ``g`` (units x cells),
    ``g_u = sum_b M_b^T B_b^T Sigma_b^-1 y_bu`` (computed as ``y_b (C_b^-T G_b)``)."""
    units = _units(model, measurements)
    return _information(model), _linear(model, measurements, units)[0]


def _linear(model: MeasurementModel, measurements: Mapping[str, np.ndarray], units: int,
            rows: slice = slice(None), whitened: bool = False, answers: bool = False,
            constant: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """``g`` of the rows ``rows`` of ``measurements`` (:func:`normal_equations`; ``whitened``:
    they are ``C_b^-1 y_b`` already; ``answers``: they are the released answers ``a_b``) and
    the constant ``sum_b y_b^T Sigma_b^-1 y_b`` of the objective, per unit (zeros unless
    ``constant``: answers then give ``g`` in one product, ``a_b K_b``)."""
    count = len(range(units)[rows])
    g, total = None, np.zeros(count)
    for block in model.blocks:
        y = np.asarray(measurements[block.block_id][rows], dtype=np.float64)
        if answers and not constant:
            subset, linear = block.answer_linear
            g = _add_expanded(model, g, y[:, subset] @ linear, block)
            continue
        if answers:
            white = y @ block.whitened_recovery.T
        else:  # C^-1 y by a triangular product (half the flops of a dense one; C^-1 is lower triangular)
            white = y if whitened else scipy.linalg.blas.dtrmm(1.0, block.whitener, y.T, side=0, lower=1).T
        if constant:
            total += np.einsum("ij,ij->i", white, white)
        g = _add_expanded(model, g, white @ block.whitened_basis, block)  # G^T C^-1 y = B^T Sigma^-1 y
    return (np.zeros((count, model.cells)) if g is None else g), total


def _add_expanded(model: MeasurementModel, g: np.ndarray | None, values: np.ndarray,
                  block) -> np.ndarray:
    """``g + M_b^T values`` (``g`` None: zeros), in place; a first block on every cell in the
    domain's order is ``values`` itself (PL94: no zero-filled array and no pass adding into it,
    1.4 us a unit)."""
    if g is None and tuple(block.expand_shape) == tuple(model.sizes) and values.flags.c_contiguous:
        return values
    if g is None:
        g = np.zeros((values.shape[0], model.cells))
    model.add_expanded(g, values, block)
    return g


def _derived(model: MeasurementModel, name: str, build: Callable[[], object]):
    """``model.derived[name]``, built by ``build()`` on first use (the model's own cache: it
    travels with the model to the workers, :func:`prepare_projection`); the name carries
    whether ``H`` is dense (:data:`DENSE_CELLS`), what the values depend on besides the model."""
    key = f"{name} ({'dense' if model.cells <= DENSE_CELLS else 'operator'})"
    if key not in model.derived:
        model.derived[key] = build()
    return model.derived[key]


def _information(model: MeasurementModel) -> np.ndarray | InformationOperator:
    """``H`` (:func:`normal_equations`): dense, or an operator above :data:`DENSE_CELLS` cells;
    built once per model (a worker projects every chunk of a session with one model: 0.3 us a
    unit to rebuild it a chunk). Read-only where dense (shared by every caller; a model
    unpickled on a worker brings it back writeable)."""
    hessian = _derived(model, "information", lambda: _build_information(model, model.cells > DENSE_CELLS))
    if isinstance(hessian, np.ndarray):
        hessian.flags.writeable = False
    return hessian


def _build_information(model: MeasurementModel, operator: bool) -> np.ndarray | InformationOperator:
    if operator:
        return InformationOperator(model)
    hessian = np.zeros((model.cells, model.cells))
    for block in model.blocks:
        if block.information is None:  # pragma: no cover - a block larger than a dense domain
            info = block.whitened_basis.T @ block.whitened_basis
        else:
            info = block.information
        # M_b^T H_b M_b: expand the rows, then the columns
        rows = np.zeros((block.cells, model.cells))
        model.add_expanded(rows, info, block)
        cols = np.zeros((model.cells, model.cells))
        model.add_expanded(cols, np.ascontiguousarray(rows.T), block)
        hessian += cols
    return (hessian + hessian.T) / 2


def projection_memory_bytes(model: MeasurementModel, units: int) -> int:
    """The projection's working memory for a chunk of ``units`` units, in bytes, stated before it
    starts: :data:`PROJECTION_COPIES` arrays of ``units x cells`` float64, the query estimates
    (``units x m``), and where ``H`` is dense (:data:`DENSE_CELLS`) three ``cells x cells``
    float64 arrays (``H`` and the two expansions that build it). Computed from the sizes alone."""
    cells, units = int(model.cells), max(1, int(units))
    dense = 3 * cells * cells if cells <= DENSE_CELLS else 0
    return 8 * (PROJECTION_COPIES * units * cells + units * int(model.num_queries) + dense)


def _units(model: MeasurementModel, measurements: Mapping[str, np.ndarray], answers: bool = False) -> int:
    units = None
    for block in model.blocks:
        if block.block_id not in measurements:
            raise ValueError(f"measurements: no measurement for block {block.block_id!r}")
        y = measurements[block.block_id]
        width = block.recon.shape[0] if answers else block.rows
        if y.ndim != 2 or y.shape[1] != width:
            raise ValueError(f"measurements[{block.block_id!r}]: shape {y.shape}, expected (units, {width})")
        if units is not None and y.shape[0] != units:
            raise ValueError(f"measurements[{block.block_id!r}]: {y.shape[0]} units, other blocks have {units}")
        units = y.shape[0]
    return int(units)


def _apply(hessian: np.ndarray | Callable[[np.ndarray], np.ndarray], v: np.ndarray) -> np.ndarray:
    """``v H`` (rows are units; ``H`` symmetric)."""
    if isinstance(hessian, np.ndarray):
        return v @ hessian
    return hessian(v)


def _lipschitz(hessian) -> float:
    if isinstance(hessian, np.ndarray):
        top = float(np.linalg.eigvalsh(hessian)[-1]) if hessian.size else 0.0
        return max(top, np.finfo(float).tiny)
    return float(hessian.lipschitz)


def quadratic_objective(hessian, linear: np.ndarray, x: np.ndarray) -> np.ndarray:
    """``0.5 x^T H x - g^T x`` for every row (units,)."""
    return np.einsum("ij,ij->i", x, 0.5 * _apply(hessian, x) - linear)


def _residual_norm(x: np.ndarray, grad: np.ndarray, project, step: float) -> np.ndarray:
    """``||x - P(x - step grad)||_inf / max(1, ||x||_inf)`` per row: 0 exactly at the optimum."""
    moved = project(x - step * grad)
    return np.abs(x - moved).max(axis=1, initial=0.0) / np.maximum(1.0, np.abs(x).max(axis=1, initial=0.0))


def minimise_quadratic(hessian, linear: np.ndarray, project: Callable[[np.ndarray], np.ndarray],
                       x0: np.ndarray, *, tol: float = 1e-9, max_iter: int = 20000,
                       lipschitz: float | np.ndarray | None = None, check_every: int = 10,
                       coupled: bool = False, groups: np.ndarray | None = None,
                       progress: Callable[[int, int], None] | None = None) -> QPResult:
    """``argmin_{x in C} 0.5 x^T H x - g^T x`` for every row of ``linear`` (units x cells) at once.

    ``hessian``: ``H`` (cells x cells, symmetric positive semidefinite) or a callable ``V ->
    V H`` on chunks (e.g. :class:`InformationOperator`, whose ``lipschitz`` is used);
    ``project``: the Euclidean projection onto the convex set ``C``, on (units x cells) arrays;
    ``x0``: the start (projected first). FISTA (Beck-Teboulle) with step ``1/lambda_max(H)``
    and the gradient restart of O'Donoghue-Candes (momentum reset when ``(y - x_new) . (x_new -
    x) > 0``). Separable rows (``coupled=False``: ``C`` a product of one set per row, ``H`` the
    same for every row) each keep their own momentum, and every ``check_every`` iterations the
    rows whose projected-gradient step (module docstring) is at most ``tol`` stop and leave
    the active set. ``coupled=True`` (a projection or operator that ties rows together, e.g.
    children summing to their parent) runs all rows as one problem: one momentum, one restart
    test, and it stops when every row meets the rule. Rows still above ``tol`` after
    ``max_iter`` come back with ``converged`` False.

    ``groups`` (rows,): independent coupled problems, e.g. the children of each parent
    (:func:`_minimise_groups`); ``lipschitz`` then per row (the bound of its group's);
    ``progress(stopped, rows)`` is then called at every check with the rows of stopped groups.
    """
    g = np.asarray(linear, dtype=np.float64)
    x = project(np.array(x0, dtype=np.float64, copy=True))
    if g.shape != x.shape or g.ndim != 2:
        raise ValueError(f"linear: shape {g.shape} does not match x0 {x.shape}")
    if groups is not None:
        return _minimise_groups(hessian, g, project, x, np.asarray(groups), lipschitz, tol=tol,
                                max_iter=max_iter, check_every=check_every, progress=progress)
    step = 1.0 / (lipschitz if lipschitz is not None else _lipschitz(hessian))
    converged = np.zeros(x.shape[0], dtype=bool)
    active = np.arange(x.shape[0])
    xa, ga = x, g
    ya, ta = xa.copy(), np.ones(1 if coupled else xa.shape[0])
    iterations = 0
    while active.size and iterations < max_iter:
        for _ in range(min(check_every, max_iter - iterations)):
            grad = _apply(hessian, ya) - ga
            x_new = project(ya - step * grad)
            if coupled:
                restart = np.atleast_1d(np.vdot(ya - x_new, x_new - xa) > 0)
            else:
                restart = np.einsum("ij,ij->i", ya - x_new, x_new - xa) > 0
            t_new = np.where(restart, 1.0, 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * ta * ta)))
            beta = np.where(restart, 0.0, (ta - 1.0) / t_new)
            ya = x_new + beta[:, None] * (x_new - xa)
            xa, ta = x_new, t_new
            iterations += 1
        done = _residual_norm(xa, _apply(hessian, xa) - ga, project, step) <= tol
        if coupled:
            x = xa
            converged = done
            if done.all():
                break
            continue
        x[active] = xa
        if done.any():
            converged[active[done]] = True
            keep = ~done
            active, xa, ga, ya, ta = active[keep], xa[keep], ga[keep], ya[keep], ta[keep]
    return QPResult(x=x, objective=quadratic_objective(hessian, g, x), iterations=iterations, converged=converged)


def _minimise_groups(hessian, g: np.ndarray, project: Callable[[np.ndarray], np.ndarray], x: np.ndarray,
                     groups: np.ndarray, lipschitz, *, tol: float, max_iter: int, check_every: int,
                     progress: Callable[[int, int], None] | None = None) -> QPResult:
    """:func:`minimise_quadratic` with ``groups``: the rows of each group are one problem (FISTA
    with its own step ``1 / lipschitz`` (given per row), momentum and restart test, the sum over
    its rows of ``(y - x_new) . (x_new - x)``), and a group stops, keeping its rows as they are,
    at the first check where every one of its rows meets the stopping rule. ``project`` and
    ``hessian`` must act on each group's rows alone (a projection per group, ``H`` row by row):
    then a group's iterates are those it would have alone, bit for bit, when the products of
    ``hessian`` and ``project`` are (the groups' rows may be solved in any batches, e.g. one
    forest of subtrees at a time: docs/design.md section 7, "Integer tables on the cluster").
    The restart sums run in row order within each group (``np.bincount``), whatever the other
    groups.

    Stopped groups leave the iteration: when the rows of live groups are at most half of those
    iterated, the iteration goes on over those rows alone, if ``project`` and an operator
    ``hessian`` can be restricted to them (``project.rows(index)``, ``hessian.rows(index)``: the
    same maps on rows ``index``, in order; a dense ``H`` acts row by row as it is). Why: a
    level's groups stop after very different numbers of steps (a few parents' children need
    thousands, most far fewer), and every step cost the whole level's product before. Each
    group's path is unchanged, bit for bit (its rows' products do not depend on the rows beside
    them)."""
    n = x.shape[0]
    _, group = np.unique(groups, return_inverse=True)
    group = group.reshape(-1)
    count = int(group.max(initial=-1)) + 1
    step = 1.0 / np.broadcast_to(np.asarray(lipschitz if lipschitz is not None else _lipschitz(hessian),
                                            dtype=np.float64), (n,))[:, None]
    restrictable = hasattr(project, "rows") and (isinstance(hessian, np.ndarray) or hasattr(hessian, "rows"))
    live = np.ones(count, dtype=bool)
    t = np.ones(count)
    out = x.copy()
    rows = np.arange(n)  # the rows iterated (of live groups, and of groups stopped since the last compaction)
    xa, ya, ga, gr, op, proj = x, x.copy(), g, group, hessian, project
    iterations = 0
    while live.any() and iterations < max_iter:
        held = ~live[gr]  # stopped groups keep their rows (a group's path is its own)
        for _ in range(min(check_every, max_iter - iterations)):
            x_new = proj(ya - step * (_apply(op, ya) - ga))
            x_new[held] = xa[held]
            restart = np.bincount(gr, weights=np.einsum("ij,ij->i", ya - x_new, x_new - xa), minlength=count) > 0
            t_new = np.where(restart, 1.0, 0.5 * (1.0 + np.sqrt(1.0 + 4.0 * t * t)))
            beta = np.where(restart, 0.0, (t - 1.0) / t_new)
            ya = x_new + beta[gr][:, None] * (x_new - xa)
            xa, t = x_new, t_new
            iterations += 1
        ya[held] = xa[held]
        done = _residual_norm(xa, _apply(op, xa) - ga, proj, step) <= tol
        live &= np.bincount(gr, weights=~done, minlength=count) > 0
        keep = live[gr]
        if progress is not None:
            progress(n - int(keep.sum()), n)
        if restrictable and 2 * int(keep.sum()) <= rows.size:
            out[rows] = xa
            rows, xa, ya, ga, gr, step = rows[keep], xa[keep], ya[keep], ga[keep], gr[keep], step[keep]
            op = op if isinstance(op, np.ndarray) else hessian.rows(rows)
            proj = project.rows(rows)
    out[rows] = xa
    converged = ~live[group]
    return QPResult(x=out, objective=quadratic_objective(hessian, g, out), iterations=iterations, converged=converged)


def _nonnegative(v: np.ndarray) -> np.ndarray:
    return np.maximum(v, 0.0)


def _unconstrained_start(hessian, g: np.ndarray) -> tuple[np.ndarray, np.ndarray | float]:
    """The unconstrained least-squares solution ``g H^+`` and its standard deviations
    ``sqrt(diag(H^+))`` (dense ``H``), else ``(g / lambda_max, 0)``."""
    if isinstance(hessian, np.ndarray):
        inverse = np.linalg.pinv(hessian, hermitian=True)
        return g @ inverse, np.sqrt(np.maximum(np.diag(inverse), 0.0))
    return g / _lipschitz(hessian), 0.0


def _is_singular(hessian: np.ndarray) -> bool:
    """Whether ``H`` has an eigenvalue below :data:`PINV_CUTOFF` times its largest."""
    values = np.linalg.eigvalsh(hessian)
    return bool(values[0] <= PINV_CUTOFF * max(values[-1], np.finfo(float).tiny))


def _free_solve(hessian: np.ndarray, g: np.ndarray, free: np.ndarray, singular: bool) -> np.ndarray:
    """For every row: ``x_F`` solving ``H_FF x_F = g_F`` on its free cells ``F`` (``free``), 0
    elsewhere. Rows are grouped by ``|F|`` rounded up to :data:`FREE_BUCKET`; each group's
    systems are gathered into one stacked array (padding: identity rows, zero right-hand side)
    and solved at once (LU); where ``H`` is singular, by the pseudo-inverse (eigenvalues below
    :data:`PINV_CUTOFF` times the largest count as zero): the minimum-norm solution, which
    exists where ``g_F`` lies in the range of ``H_FF`` (as it does at the optimum)."""
    n, d = g.shape
    counts = free.sum(axis=1)
    sizes = np.minimum(-(-np.maximum(counts, 1) // FREE_BUCKET) * FREE_BUCKET, d)
    out = np.zeros_like(g)
    for size in np.unique(sizes):
        rows = np.flatnonzero(sizes == size)
        cells = np.argsort(~free[rows], axis=1, kind="stable")[:, :size]  # free cells first
        valid = np.arange(size)[None, :] < counts[rows][:, None]
        system = hessian[cells[:, :, None], cells[:, None, :]]
        system *= valid[:, :, None] & valid[:, None, :]
        diagonal = np.arange(size)
        system[:, diagonal, diagonal] += ~valid
        rhs = np.take_along_axis(g[rows], cells, axis=1) * valid
        if singular:
            values, vectors = np.linalg.eigh(system)
            cutoff = PINV_CUTOFF * np.abs(values).max(axis=1, keepdims=True)
            inverse_values = np.where(np.abs(values) > cutoff, 1.0 / np.where(values == 0, 1.0, values), 0.0)
            coords = np.einsum("nji,nj->ni", vectors, rhs) * inverse_values
            solution = np.einsum("nij,nj->ni", vectors, coords)
        else:
            solution = np.linalg.solve(system, rhs[:, :, None])[:, :, 0]
        solution *= valid
        block = np.zeros((rows.size, d))
        np.put_along_axis(block, cells, solution, axis=1)
        out[rows] = block
    return out


def _active_set_newton(hessian: np.ndarray, g: np.ndarray, x: np.ndarray, lipschitz: float, tol: float,
                       max_steps: int, threshold: np.ndarray | float = 0.0, singular: bool = False) -> tuple[np.ndarray, np.ndarray, int]:
    """Primal-dual active set steps (Hintermueller-Ito-Kunisch, a semismooth Newton method on
    the KKT system) for every row at once: from the free set ``F = {x > 0}``, solve the KKT
    system with ``x_A = 0`` exactly (:func:`_free_solve`), then let ``F`` be the cells with
    ``x_F > 0`` and the cells of ``A`` whose multiplier ``(H x - g)_i`` is below
    ``-tol lambda_max max(1, ||x||_inf)``; a row stops when ``F`` no longer changes (then the
    KKT conditions hold: the stopping rule of the module docstring) or after ``max_steps``.
    Returns ``(x, converged, steps)``; rows not converged keep their input ``x``."""
    out = x.copy()
    converged = np.zeros(x.shape[0], dtype=bool)
    active = np.arange(x.shape[0])
    free = x > threshold
    steps = 0
    while active.size and steps < max_steps:
        steps += 1
        solution = _free_solve(hessian, g[active], free, singular)
        multiplier = solution @ hessian - g[active]
        scale = tol * lipschitz * np.maximum(1.0, np.abs(solution).max(axis=1))
        new_free = (solution > 0) | (~free & (multiplier < -scale[:, None]))
        settled = (new_free == free).all(axis=1) & (solution >= 0).all(axis=1)
        out[active[settled]] = solution[settled]
        converged[active[settled]] = True
        active, free = active[~settled], new_free[~settled]
    return out, converged, steps


def solve_nonnegative(hessian, g: np.ndarray, x: np.ndarray, *, tol: float = 1e-10, max_iter: int = 20000,
                      threshold: np.ndarray | float = 0.0) -> tuple[np.ndarray, np.ndarray, int]:
    """``argmin_{x >= 0} 0.5 x^T H x - g^T x`` for every row of ``g`` (units x cells), from
    ``x``: with a dense ``H``, the primal-dual active-set steps from the free set ``x >
    threshold`` (exact at the KKT point: module docstring, "Solver"), rows they do not settle in
    :data:`NEWTON_STEPS` then :data:`FISTA_ROUND` FISTA iterations and again; an operator ``H``
    FISTA alone, at most ``max_iter`` iterations in all. Returns ``(x, converged, iterations)``
    (``x`` may hold rounding-size negatives where not converged)."""
    x = np.array(x, dtype=np.float64, copy=True)
    dense = isinstance(hessian, np.ndarray)
    converged = np.zeros(x.shape[0], dtype=bool)
    active = np.arange(x.shape[0])
    lipschitz = _lipschitz(hessian)
    singular = dense and _is_singular(hessian)
    iterations, budget = 0, max_iter
    while active.size and budget > 0:
        if dense:
            newton, done, steps = _active_set_newton(hessian, g[active], x[active], lipschitz, tol, NEWTON_STEPS,
                                                     threshold, singular)
            threshold = 0.0
            iterations += steps
            x[active[done]] = newton[done]
            converged[active[done]] = True
            active = active[~done]
            if not active.size:
                break
        # rows the active set method did not settle (it may cycle where H is no M-matrix): FISTA
        chunk = min(budget, FISTA_ROUND if dense else budget)
        result = minimise_quadratic(hessian, g[active], _nonnegative, x[active], tol=tol,
                                    max_iter=chunk, lipschitz=lipschitz)
        budget -= max(result.iterations, 1)
        iterations += result.iterations
        x[active] = result.x
        converged[active[result.converged]] = True
        active = active[~result.converged]
    return x, converged, iterations


def _model_unconstrained_answers(model: MeasurementModel) -> slice | None:
    """:func:`unconstrained_answers` of ``model`` with its own ``H``, once per model."""
    def build() -> slice | None:
        hessian = _information(model)
        return unconstrained_answers(model, hessian) if isinstance(hessian, np.ndarray) else None
    return _derived(model, "unconstrained", build)


def projection_structure(model: MeasurementModel) -> BlockLowRank | None:
    """The structure of the model's ``H`` that :func:`project_nonnegative` solves with
    (:func:`hessian_structure`), once per model; None: ``H`` has none, or is an operator (the
    dense and operator paths)."""
    def build() -> BlockLowRank | None:
        hessian = _information(model)
        return hessian_structure(hessian, model.sizes) if isinstance(hessian, np.ndarray) else None
    return _derived(model, "structure", build)


def prepare_projection(model: MeasurementModel) -> MeasurementModel:
    """``model`` with everything :func:`project_nonnegative` derives from it computed and kept
    on it (``model.derived``: ``H``, its structure, the unconstrained columns, each block's
    :attr:`~distfit.estimate.measurements.BlockMeasurement.answer_linear`), so that a model
    pickled to the workers arrives ready: ``distfit estimate`` prepares it in the driver while
    the cluster starts (PL94: 0.1 s a worker no longer spends before its first chunk).
    Returns ``model`` itself."""
    projection_structure(model)
    _model_unconstrained_answers(model)
    for block in model.blocks:
        block.answer_linear  # noqa: B018 - a cached property: computed here, pickled with the block
    return model


def unconstrained_answers(model: MeasurementModel, hessian: np.ndarray) -> slice | None:
    """The columns ``S`` of the released answers that are the unconstrained estimate ``x_u =
    H^-1 g`` itself, where there are such, else None: a plan of one block on every cell, in
    the domain's order, whose answers' linear map ``K`` (``g = a[S] K``,
    :attr:`distfit.estimate.measurements.BlockMeasurement.answer_linear`) is ``H`` to
    :data:`UNCONSTRAINED_TOLERANCE` of ``max |H|``. That is so when the block's basis is square
    and the workload holds every cell (PL94: the 252 cell queries, ``K`` = ``H`` to 3.5e-14):
    the answers to the cell queries are ``x_u = B^-1 y`` and ``g = H x_u``, formed from the
    structure of ``H`` (:func:`distfit.estimate.orthant.solve_orthant` with
    ``unconstrained``), the rounding-level difference between ``a[S] K`` and ``a[S] H`` aside."""
    if len(model.blocks) != 1 or tuple(model.blocks[0].expand_shape) != tuple(model.sizes):
        return None
    subset, linear = model.blocks[0].answer_linear
    if linear.shape != hessian.shape or not isinstance(subset, slice):
        return None
    scale = np.abs(hessian).max(initial=0.0)
    return subset if np.abs(linear - hessian).max(initial=0.0) <= UNCONSTRAINED_TOLERANCE * scale else None


def hessian_structure(hessian: np.ndarray, sizes: tuple[int, ...]) -> BlockLowRank | None:
    """:func:`distfit.estimate.structure.block_low_rank` of a dense ``H``, remembered with ``H``
    (the last :data:`STRUCTURE_CACHE`; an equal ``H`` and ``sizes`` find it again, the very
    array at once: a read-only ``H``, as the model's own is, is kept without a copy)."""
    sizes = tuple(sizes)
    for known, known_sizes, structure in _structures:
        if known_sizes == sizes and (known is hessian or (known.shape == hessian.shape
                                                           and np.array_equal(known, hessian))):
            return structure
    structure = block_low_rank(hessian, sizes)
    if len(_structures) >= STRUCTURE_CACHE:
        _structures.pop(0)
    _structures.append((hessian if not hessian.flags.writeable else hessian.copy(), sizes, structure))
    return structure


def project_nonnegative(model: MeasurementModel, measurements: Mapping[str, np.ndarray], *,
                        tol: float = 1e-10, max_iter: int = 20000, whitened: bool = False,
                        answers: bool = False, out: np.ndarray | None = None) -> ProjectionResult:
    """``x_hat = argmin_{x >= 0} sum_b (y_b - B_b M_b x)^T Sigma_b^-1 (y_b - B_b M_b x)`` for
    every unit of ``measurements`` (``{block_id: y_b}``, units x k_b) at once (module docstring);
    ``whitened``: the measurements are ``C_b^-1 y_b``
    (:func:`distfit.estimate.measurements.whitened_measurements`: one product from the answers);
    ``answers``: they are the released block answers ``a_b`` (units x m_b), the measurements
    ``y_b = R_b a_b`` (module docstring: ``g`` in one product from them). ``out``: a float64
    array (units x cells, rows of unit stride: the cell columns of the query estimates, say)
    that receives ``x`` and is returned as the result's ``x``.
    """
    units = _units(model, measurements, answers)
    hessian = _information(model)
    structure = projection_structure(model)
    if out is not None and (out.shape != (units, model.cells) or out.dtype != np.float64 or out.strides[1] != 8):
        raise ValueError(f"out: {out.dtype} {out.shape}, expected float64 ({units}, {model.cells}) with unit-stride rows")
    if structure is None:  # the dense and operator paths write x whole, copied into out at the end
        x = np.zeros((units, model.cells))
    else:  # the kernel writes every row
        x = np.empty((units, model.cells)) if out is None else out
    converged = np.zeros(units, dtype=bool)
    iterations = 0
    objective, constant = np.zeros(units), np.zeros(units)
    if structure is not None:  # H = D + V V^T: Woodbury active-set steps (structure module)
        # square (sum_b k_b = cells, H nonsingular): the whitened measurements span the cells, so
        # the objective is (x - H^-1 g)^T H (x - H^-1 g) and needs no constant (module docstring)
        square = sum(block.rows for block in model.blocks) == model.cells
        values = np.empty((min(units, STRUCTURE_BATCH), 2))
        cells = _model_unconstrained_answers(model) if answers else None
        if cells is not None:  # the answers to the cell queries are H^-1 g: no g product, no first solve
            start = np.asarray(measurements[model.blocks[0].block_id], dtype=np.float64)[:, cells]
        for lo in range(0, units, STRUCTURE_BATCH):  # cache blocking: g, x of a batch stay in cache
            rows = slice(lo, lo + STRUCTURE_BATCH)
            batch = values[:len(range(units)[rows])]
            if cells is not None:
                _x, _none, converged[rows], steps = solve_orthant(
                    structure, None, unconstrained=start[rows], tol=tol,
                    max_steps=NEWTON_STEPS, values=batch, out=x[rows], gradient=False)
            else:
                g, constant[rows] = _linear(model, measurements, units, rows, whitened, answers, not square)
                _x, _none, converged[rows], steps = solve_orthant(structure, g, tol=tol, max_steps=NEWTON_STEPS,
                                                                  values=batch, out=x[rows], gradient=False)
            iterations = max(iterations, steps)
            objective[rows] = batch[:, 1] if square else batch[:, 0]
        if converged.all():  # x: every row written, its free cells > 0 (the KKT check), the others 0
            return ProjectionResult(x=x, objective=np.maximum(objective + constant, 0.0),
                                    iterations=iterations, converged=converged)
        g, full = _linear(model, measurements, units, whitened=whitened, answers=answers)
        constant = np.where(converged, constant, full)  # square: the converged rows' objective is whole
    else:
        g, constant = _linear(model, measurements, units, whitened=whitened, answers=answers)
    active = np.flatnonzero(~converged)
    rest = active
    start, spread = _unconstrained_start(hessian, g[active])
    x[active] = start
    # the first free set: cells clearly positive (measured: fewer, cheaper steps)
    x[active], converged[active], steps = solve_nonnegative(hessian, g[active], x[active], tol=tol,
                                                            max_iter=max_iter, threshold=spread)
    iterations += steps
    x = np.maximum(x, 0.0)
    objective[rest] = 2.0 * quadratic_objective(hessian, g[rest], x[rest])
    objective += constant
    if out is not None and x is not out:
        out[...] = x
        x = out
    return ProjectionResult(x=x, objective=np.maximum(objective, 0.0), iterations=iterations, converged=converged)
