"""Graphical-model estimates for wide schemas: Private-PGM and APPGM through mbi (issue 15).

docs/design.md section 7. When the domain is too large to hold a data vector ``x`` (Adult: 1.6e9
cells), the estimate is a graphical model whose clique marginals ``mu`` fit the measurements in
the noise's own metric (Private-PGM, McKenna et al. 2019; APPGM, paper 004):

    ``mu_hat = argmin_{mu in P} sum_b 1/2 || G_b (M_b mu) - C_b^-1 y_b ||^2,   G_b = C_b^-1 B_b``

with ``y_b = B_b x_b + z_b`` the recovered measurement of block ``b``
(:func:`distfit.estimate.measurements.recover_measurements`), ``C_b`` the Cholesky factor of
``Sigma_b`` (``C_b^-1`` the block's ``whitener``) and ``M_b`` the marginalisation of the clique
table onto the block's attributes. Whitening makes the noise of ``C_b^-1 y_b`` standard normal,
so mbi's one-stddev-per-measurement loss is exactly the generalised least squares objective of
the projection (:func:`distfit.estimate.projection.project_nonnegative`), restricted to
marginals. ``P`` is

- the marginal polytope (``method = "exact"``): mirror descent with junction-tree inference,
  ``mbi.estimation.MirrorDescent`` (Armijo steps). The marginals are those of one nonnegative
  distribution, so they are exactly the marginals of the projection's ``x_hat`` whenever the
  measured cliques determine the objective (the total is fixed, see below);
- the local polytope of the saturated region graph (``method = "region-graph"``, APPGM): mirror
  descent on the potentials with warm-started, damped sweeps of convex generalised belief
  propagation (the paper's Prox-PGM with Convex-GBP; mbi's algorithm, computed on every edge at
  once by :mod:`distfit.estimate.region_graph`, numpy only, several units together). It starts
  at the raw tables: potentials ``log t_r`` on every region, ``t_r`` the raw table clamped at
  1/2 and, for a clique, fitted to its subregions' tables (:func:`_warm_start`), first step ``2 / (L N)``, then mbi's Armijo rule (growing 5% per accepted step at first). With
  one sweep per step the messages lag the potentials and the line search eventually rejects
  every step; it is restarted :data:`RESTARTS` times after settling the messages, each time
  with more sweeps per step (less lag, less bias: on 4 attributes of 3 values the objective
  ends 0.6% above Clarabel's optimum over the local polytope). The potentials are then held
  and the sweeps continue until every edge of the region graph agrees to
  :data:`POLISH_CONSISTENCY` of the total; the pseudo-marginals are then I-projected onto
  agreement (:func:`distfit.estimate.region_graph.make_consistent`, Newton on the dual), so
  that the cliques agree to :data:`CONSISTENCY` of the total even on sparse units, where the
  messages converge slowly (cells of ~1e-40).

- the local polytope in the published queries' metric (``method = "local"``, issue 26): for a
  residual plan (every clique spanned exactly by the blocks within it), the raw release projected
  onto nonnegative, agreeing clique tables minimising the published queries' squared distance
  from the raw answers (not the loss above), by ADMM with one block-elimination factor per plan
  (:mod:`distfit.estimate.local_polytope`; docs/design.md section 7): its squared error on the
  published queries is never above the raw release's. The last cells below 0 (at most 0.05 of
  their noise standard deviation) are published as 0 and the tables I-projected onto agreement
  (:func:`distfit.estimate.region_graph.make_consistent`), as the region graph's. The total is
  the estimate's own (free in the projection).

The rule (:func:`graphical_problem`): the local polytope for a residual plan whose projection
fits ``memory_limit`` (Adult: 364 cliques, 42,301 cells, ~35 CPU-s; the one method whose error on
the published queries is never above the raw release's, and it needs neither mbi nor jax); else
exact when the junction tree of the measured cliques holds at most :data:`EXACT_MAX_CELLS` cells
(message passing then costs milliseconds per step), else the region graph. A model whose
estimated working memory exceeds ``memory_limit`` is refused with one line naming its largest
clique.

The total ``N`` is fixed (mbi's models have a known total): its minimum-variance unbiased
estimate from the blocks that measure it, ``N_hat = sum_b w_b c_b^T y_b / sum_b w_b`` with
``B_b^T c_b = 1`` and ``w_b = 1 / (c_b^T Sigma_b c_b)`` (in a residual plan only the empty
block measures it and the other blocks are orthogonal to it), at least 1.

Every workload query's estimate is read off the clique marginals: block ``b``'s rows
``L_b B_b`` act on its marginal ``M_b mu`` and are summed by ``query_index``, as
:func:`distfit.estimate.measurements.workload_estimates` does on a data vector.

mbi and jax are an optional dependency (``pip install 'distfit[graphical]'``) of exact inference
and the region graph: they are imported on first use, so narrow schemas and the local polytope
never pay jax's import.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Callable, Mapping

import numpy as np
import scipy.sparse as sp

from distfit.estimate import local_polytope, region_graph
from distfit.estimate.measurements import MeasurementModel

__all__ = [
    "CONSISTENCY",
    "EXACT_MAX_CELLS",
    "GraphicalChunk",
    "GraphicalEstimate",
    "GraphicalProblem",
    "GraphicalUnavailable",
    "MEMORY_LIMIT_BYTES",
    "ModelTooLarge",
    "PROJECTION_MAX_CELLS",
    "estimate_graphical",
    "estimate_units",
    "graphical_problem",
    "use_graphical",
]

#: Domains above this many cells are estimated by a graphical model (the projection would hold
#: ``units x cells`` float64 arrays and a cells-long operator per unit: 32 MiB per unit here).
PROJECTION_MAX_CELLS = 1 << 22
#: Exact inference when the junction tree holds at most this many cells (16 MiB per table copy;
#: measured on 2 cores: 8 attributes of 4 values, a 65,536-cell tree, ~3 ms per step).
EXACT_MAX_CELLS = 1 << 21
#: Working memory refused above this (the benchmark's goal for Adult: 8 GiB).
MEMORY_LIMIT_BYTES = 8 << 30
#: float64 copies of every table that an inference step keeps alive (potentials, marginals,
#: gradient, trial point, messages, jax temporaries): the memory estimate's factor.
TABLE_COPIES = 12
#: Pseudo-marginals of two cliques agree on their shared attributes to this fraction of the total
#: (the region graph's final I-projection, :func:`distfit.estimate.region_graph.make_consistent`).
CONSISTENCY = 1e-12
#: Mirror descent steps (at most), the relative loss change per 50 steps that stops them, and
#: the most belief-propagation sweeps of the held potentials afterwards, stopped once the regions
#: agree to :data:`POLISH_CONSISTENCY` of the total (the messages then converge only linearly:
#: the I-projection closes the rest).
ITERATIONS = 3000
TOLERANCE = 1e-10
POLISH_SWEEPS = 2000
POLISH_CONSISTENCY = 1e-6
#: Region graph: sweeps of the warm start's potentials before mirror descent, and the step's
#: growth on an accepted step (mbi's Armijo rule grows 1.01; 1.05 reaches the working step size
#: in ~100 steps on Adult instead of ~400).
WARM_SWEEPS = 100
GROWTH = 1.05
#: Passes of proportional fitting of each clique's clamped raw table to its subregions' tables.
WARM_FITS = 5
#: Line-search restarts after the loss stalls, each after this many sweeps of the held potentials.
RESTARTS = 3
RESTART_SWEEPS = 100
#: Each restart adds this many sweeps per step: the messages lag less, so the bias they leave shrinks.
INNER_GROWTH = 2
#: Convergence is checked every this many steps (mbi's own callback period).
CHECK_EVERY = 50


class GraphicalUnavailable(RuntimeError):
    """mbi (and jax) are not installed."""


class ModelTooLarge(ValueError):
    """The graphical model would not fit in memory (one line: the largest clique, the bytes)."""


@functools.lru_cache(maxsize=1)
def _mbi() -> SimpleNamespace:
    """mbi and jax, imported on first use, with float64 (mbi stalls in float32 on large totals)
    and without jax's persistent cache (mbi compiles many small programs)."""
    try:
        import jax
        import jax.numpy as jnp
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise GraphicalUnavailable(
            "the graphical-model estimate needs mbi and jax: pip install 'distfit[graphical]'") from exc
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_enable_compilation_cache", False)
    try:
        import mbi
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise GraphicalUnavailable(
            "the graphical-model estimate needs mbi: pip install 'distfit[graphical]'") from exc
    from mbi import approximate_oracles, estimation, junction_tree, marginal_loss
    return SimpleNamespace(jax=jax, jnp=jnp, mbi=mbi, approximate=approximate_oracles, estimation=estimation,
                           junction_tree=junction_tree, marginal_loss=marginal_loss)


def use_graphical(model: MeasurementModel) -> bool:
    """Whether the estimate of ``model`` needs a graphical model (more than
    :data:`PROJECTION_MAX_CELLS` cells); the projection handles the rest."""
    return model.cells > PROJECTION_MAX_CELLS


@dataclass(frozen=True, eq=False)
class GraphicalEstimate:
    """One unit's estimate: nonnegative ``marginals`` (clique -> table shaped by the clique's
    sizes, each summing to ``total``), ``estimates`` (m,) of every workload query, the
    ``method`` ("exact", "local" or "region-graph"), mirror descent (ADMM) ``iterations``, ``objective``
    ``sum_b ||C_b^-1 (y_b - B_b M_b mu)||^2`` (the projection's objective, every block), the
    fixed ``total`` and ``inconsistency``: the largest disagreement of two cliques on their
    shared attributes, as a fraction of the total (0 for exact inference, up to rounding)."""

    marginals: Mapping[tuple[str, ...], np.ndarray]
    estimates: np.ndarray
    method: str
    iterations: int
    objective: float
    total: float
    inconsistency: float


@dataclass(frozen=True, eq=False)
class GraphicalChunk:
    """Several units' estimates (:func:`estimate_units`): ``estimates`` (n, m), ``marginals``
    (n, sum_c |c|: every clique of ``problem.cliques`` row-major, side by side), ``objective``
    (n,), mirror descent ``iterations`` (the most), ``converged`` (n,) and ``inconsistency`` (n,)."""

    estimates: np.ndarray
    marginals: np.ndarray
    objective: np.ndarray
    iterations: int
    converged: np.ndarray
    inconsistency: np.ndarray


@dataclass(frozen=True, eq=False)
class GraphicalProblem:
    """What :func:`estimate_graphical` needs from a plan, built once (:func:`graphical_problem`).

    ``cliques``: the maximal attribute sets of the plan's blocks (schema order; every workload
    query is a function of their marginals); ``method``; ``junction_cells`` (cells of the
    junction tree of the cliques; None for method "local", which builds none) and the
    ``largest_clique`` (of the junction tree; of the cliques for "local"); ``memory_bytes`` the working
    memory estimate; ``parent`` block_id -> the clique its marginal is read from; ``lipschitz``
    the gradient's Lipschitz constant of the whitened loss (None for "local", which has no step
    to size); ``total_weights`` block_id -> ``c_b / var_b`` for the blocks that measure the
    total, ``total_information`` ``sum_b 1 / var_b``.
    """

    model: MeasurementModel
    cliques: tuple[tuple[str, ...], ...]
    method: str
    junction_cells: int | None
    largest_clique: tuple[str, ...]
    memory_bytes: int
    parent: Mapping[str, tuple[str, ...]]
    lipschitz: float | None
    total_weights: Mapping[str, np.ndarray]
    total_information: float
    solver: Any  # the jitted pieces (mbi domain, loss function, step): built once, reused per unit

    @functools.cached_property
    def local(self) -> local_polytope.LocalPolytope | None:
        """Method "local": the projection's data, built on first use (a driver that only
        states the method and its memory never builds it; a worker builds it once)."""
        return local_polytope.local_polytope(self.model, self.cliques) if self.method == "local" else None


def _maximal(sets: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    unique = sorted(set(sets), key=lambda s: (-len(s), s))
    return [s for s in unique if not any(set(s) < set(t) for t in unique)]


def _cells(clique: tuple[str, ...], size_of: Mapping[str, int]) -> int:
    return math.prod(size_of[a] for a in clique)


def _total_weights(model: MeasurementModel) -> tuple[dict[str, np.ndarray], float]:
    """``c_b / var_b`` for every block whose basis has the all-ones row in its row space
    (``B_b^T c_b = 1``), ``var_b = c_b^T Sigma_b c_b``; and ``sum_b 1 / var_b``."""
    weights, information = {}, 0.0
    for block in model.blocks:
        ones = np.ones(block.cells)
        c, *_ = np.linalg.lstsq(block.basis.T, ones, rcond=None)
        if np.abs(block.basis.T @ c - ones).max() > 1e-9 * max(1.0, np.abs(c).max()):
            continue
        var = float(c @ block.sigma @ c)
        weights[block.block_id] = c / var
        information += 1.0 / var
    return weights, information


def graphical_problem(model: MeasurementModel, *, method: str = "auto",
                      memory_limit: int = MEMORY_LIMIT_BYTES) -> GraphicalProblem:
    """The graphical model of ``model`` and the method that estimates it (module docstring).

    ``method``: "auto" ("local" for a residual plan whose local polytope fits ``memory_limit``,
    else exact when the junction tree holds at most :data:`EXACT_MAX_CELLS` cells, else the
    region graph), "exact", "local" (the local polytope in the published queries' metric, a
    residual plan only: :mod:`distfit.estimate.local_polytope`) or "region-graph".
    :class:`ModelTooLarge` (one line) when the chosen model needs more than ``memory_limit``
    bytes; ValueError when no block measures the total; :class:`GraphicalUnavailable` without
    mbi (exact and region graph only).
    """
    if method not in ("auto", "exact", "local", "region-graph"):
        raise ValueError(f"method: {method!r}, expected 'auto', 'exact', 'local' or 'region-graph'")
    size_of = dict(zip(model.attributes, model.sizes))
    order = {a: i for i, a in enumerate(model.attributes)}
    cliques = _maximal([b.attributes for b in model.blocks if b.attributes])
    cliques.sort(key=lambda c: tuple(order[a] for a in c))
    residual = bool(cliques) and local_polytope.is_residual(model, cliques)
    if method == "local" and not residual:
        raise ValueError("method 'local': the blocks within some clique do not span it exactly (not a residual "
                         "plan); use 'region-graph'")
    local_memory = _local_memory(model, cliques) if residual and method in ("auto", "local") else None
    if method == "auto" and local_memory is not None and local_memory[0] <= memory_limit:
        method = "local"
    if method == "local":
        # numpy and scipy only: neither mbi nor jax is imported (jax's import and backend take
        # ~0.3 GiB of address space, its threads their arenas), so the default estimate of a
        # wide residual plan needs no graphical extra and fits Adult under a 4 GiB RLIMIT_AS
        memory, graph = local_memory
        largest = max(cliques, key=lambda c: _cells(c, size_of))
        junction_cells, solver = None, SimpleNamespace(graph=graph)
    else:
        ns = _mbi()
        domain = ns.mbi.Domain(model.attributes, model.sizes)
        if cliques:
            tree, _ = ns.junction_tree.make_junction_tree(domain, cliques)
            tree_cliques = [tuple(sorted(c, key=order.__getitem__)) for c in ns.junction_tree.maximal_cliques(tree)]
        else:
            tree_cliques = [()]
        junction_cells = sum(_cells(c, size_of) for c in tree_cliques)
        if method == "auto":
            method = "exact" if junction_cells <= EXACT_MAX_CELLS else "region-graph"
        graph = None
        if method == "exact":
            largest, cells = max(tree_cliques, key=lambda c: _cells(c, size_of)), junction_cells
        else:
            # the local polytope's, when auto refused it for its memory: the same graph
            graph = local_memory[1] if local_memory is not None else \
                region_graph.region_graph(cliques, model.attributes, model.sizes)
            largest = max(cliques, key=lambda c: _cells(c, size_of)) if cliques else ()
            # every region's table and two messages per edge (child-sized), plus the
            # (edge, parent cell) gathers of a sweep, held in a few copies each
            cells = graph.cells + 2 * graph.messages + graph.parent_cell.size
        memory = 8 * TABLE_COPIES * cells
    if memory > memory_limit:
        raise ModelTooLarge(
            f"graphical model too large for memory: the {method} model's largest clique "
            f"({', '.join(largest)}) has {_cells(largest, size_of):,} cells; the model needs "
            f"{memory / 2**30:.1f} GiB, over the limit of {memory_limit / 2**30:.1f} GiB")
    weights, information = _total_weights(model)
    if not weights:
        raise ValueError("plan: no block measures the total, which the graphical model needs")
    parent = {}
    for block in model.blocks:
        containing = [c for c in cliques if set(block.attributes) <= set(c)] or [()]
        parent[block.block_id] = min(containing, key=lambda c: _cells(c, size_of))
    lipschitz = None if method == "local" else _lipschitz(model, parent, size_of)
    if method != "local":
        solver = _solver(ns, model, domain, cliques, parent, method, graph)
    return GraphicalProblem(model=model, cliques=tuple(cliques), method=method, junction_cells=junction_cells,
                            largest_clique=largest, memory_bytes=memory, parent=parent, lipschitz=lipschitz,
                            total_weights=weights, total_information=information, solver=solver)


def _lipschitz(model: MeasurementModel, parent: Mapping[str, tuple[str, ...]], size_of: Mapping[str, int]) -> float:
    """The whitened loss's gradient Lipschitz constant (mirror descent's first step; the local
    polytope has none to take). The loss's Hessian is block diagonal by clique (each block reads
    one clique's table): ``L <= max_C sum_{b -> C} ||G_b||_2^2 |C| / |S_b|``, exact for identity
    queries (mbi's bound)."""
    per_clique: dict[tuple[str, ...], float] = {}
    for block in model.blocks:
        if not block.attributes:
            continue
        c = parent[block.block_id]
        norm = np.linalg.norm(block.whitened_basis, 2) ** 2
        per_clique[c] = per_clique.get(c, 0.0) + norm * _cells(c, size_of) / block.cells
    return max(per_clique.values(), default=1.0)


def _local_memory(model: MeasurementModel, cliques: list[tuple[str, ...]]) -> tuple[int, region_graph.RegionGraph]:
    """The local polytope's working memory (:func:`distfit.estimate.local_polytope.local_polytope_bytes`
    and :data:`TABLE_COPIES` of the region graph's tables, which the final I-projection onto
    agreement works on) and that region graph."""
    graph = region_graph.region_graph(cliques, model.attributes, model.sizes)
    return local_polytope.local_polytope_bytes(model, cliques) + 8 * TABLE_COPIES * graph.cells, graph


def _solver(ns: SimpleNamespace, model: MeasurementModel, domain, cliques, parent, method,
            graph) -> SimpleNamespace:
    """The loss function and the jitted step, built once per problem so that every unit reuses
    the compiled programs (the measurements are traced data, never constants)."""
    jnp = ns.jnp
    measured = [b for b in model.blocks if b.attributes]
    attributes = [b.attributes for b in measured]

    def loss(mu, data):
        total = 0.0
        for attrs, y, g in zip(attributes, data[0], data[1]):
            r = g @ mu.project(attrs).datavector() - y
            total += 0.5 * jnp.vdot(r, r)
        return total

    bases = tuple(jnp.asarray(b.whitened_basis) for b in measured)
    step = _region_operator(model, graph, parent) if graph is not None and cliques else None
    warm = _warm_operators(model, graph) if step is not None else None
    return SimpleNamespace(ns=ns, domain=domain, measured=tuple(b.block_id for b in measured), bases=bases,
                           loss=loss, step=step, graph=graph, warm=warm)


def _warm_operators(model: MeasurementModel, graph: region_graph.RegionGraph) -> tuple[list, list]:
    """Per clique ``C``: the block ids ``b`` with attributes within ``C`` and ``P_C`` with
    ``P_C [C_b^-1 y_b]_b`` the generalised least squares table of ``C`` from those blocks alone
    (the raw marginal: the residual blocks of ``C``'s subsets span its cells). Per other region
    ``r``: the cliques that contain it, each with the axes its table sums over onto ``r``. Per
    clique: its largest proper subregions, each with the axes the clique sums over onto it."""
    cliques = []
    for i in graph.clique_index:
        clique, shape = graph.regions[i], graph.shapes[i]
        index = np.indices(shape).reshape(len(shape), -1)
        ids, rows = [], []
        for block in model.blocks:
            if set(block.attributes) <= set(clique):
                keep = [j for j, a in enumerate(clique) if a in block.attributes]
                cell = (np.ravel_multi_index(tuple(index[keep]), tuple(shape[j] for j in keep)) if keep
                        else np.zeros(index.shape[1], dtype=np.int64))
                ids.append(block.block_id)
                rows.append(block.whitened_basis[:, cell])
        cliques.append((i, tuple(ids), np.linalg.pinv(np.vstack(rows))))
    regions = []
    for r, attributes in enumerate(graph.regions):
        if r not in graph.clique_index:
            members = [(c, tuple(1 + j for j, a in enumerate(graph.regions[c]) if a not in attributes))
                       for c in graph.clique_index if set(attributes) <= set(graph.regions[c])]
            regions.append((r, members))
    fits = []
    for c in graph.clique_index:
        below = [r for r, _ in regions if set(graph.regions[r]) < set(graph.regions[c])]
        top = [r for r in below if not any(set(graph.regions[r]) < set(graph.regions[q]) for q in below)]
        fits.append((c, [(r, tuple(1 + j for j, a in enumerate(graph.regions[c]) if a not in graph.regions[r])) for r in top]))
    return cliques, regions, fits


def _warm_start(problem: GraphicalProblem, white: list[Mapping[str, np.ndarray]]) -> np.ndarray:
    """Potentials ``theta_r = log t_r`` on every region ``r``, (cells, n): ``t_r = max(x_r, 1/2)``
    for an intersection, ``x_r`` the mean of its cliques' marginals (all equal in a residual
    plan); for a clique ``C``, ``max(x_C, 1/2)`` (``x_C`` its raw table,
    :func:`_warm_operators`) fitted to the tables of its largest subregions by
    :data:`WARM_FITS` passes of iterative proportional fitting. With every counting number 1,
    convex GBP's fixed point maximises ``sum_r <theta_r, mu_r> + H(mu_r)`` over the local
    polytope, so it is ``mu_r = t_r`` whenever the tables agree (they do, but for the clamped
    cells of the subregions and the fitting's tolerance): mirror descent starts at the
    measurements. Potentials on the cliques alone
    (the earlier start) leave the intersections' entropies pulling towards uniform (4% of the
    total off on 5 attributes, with the cliques' tables agreeing exactly). Mirror descent moves
    only the cliques' potentials; on the local polytope a potential of ``r`` is the same as its
    expansion onto a clique that contains ``r``, so the model class is unchanged."""
    graph = problem.solver.graph
    cliques, regions, fits = problem.solver.warm
    n = len(white)
    raw = np.zeros((graph.cells, n))
    for i, ids, inverse in cliques:
        stacked = np.stack([np.concatenate([w[b] for b in ids]) for w in white], axis=1)
        raw[graph.region_start[i]:graph.region_start[i + 1]] = inverse @ stacked
    for r, members in regions:
        mean = sum(graph.table(raw, c).sum(axis=axes) for c, axes in members) / len(members)
        raw[graph.region_start[r]:graph.region_start[r + 1]] = mean.reshape(n, -1).T
    table = np.maximum(raw, 0.5)
    # Clamping a clique's negative cells adds mass that its normalisation would take from the
    # large cells (Adult: 7,266 of 42,301 raw cells negative; the full-population prefix queries
    # fell 100 below the truth). Proportional fitting to the subregions' tables (precise, and
    # rarely clamped) puts it back where the lower-order measurements say: on Adult, the queries
    # of these tables have a mean absolute error of 9.45 against the raw answers' 10.75 (clamping
    # alone: 16.0).
    for c, subregions in fits:
        fitted = graph.table(table, c)
        for _ in range(WARM_FITS):
            for r, axes in subregions:
                target = np.expand_dims(graph.table(table, r), axes)
                fitted = fitted * target / fitted.sum(axis=axes, keepdims=True)
        table[graph.region_start[c]:graph.region_start[c + 1]] = fitted.reshape(n, -1).T
    return np.log(table)


def _check(problem: GraphicalProblem, measurements: Mapping[str, Any]) -> dict[str, np.ndarray]:
    out = {}
    for block in problem.model.blocks:
        if block.block_id not in measurements:
            raise ValueError(f"measurements: no measurement for block {block.block_id!r}")
        y = np.asarray(measurements[block.block_id], dtype=np.float64).reshape(-1)
        if y.shape != (block.rows,) or not np.isfinite(y).all():
            raise ValueError(f"measurements[{block.block_id!r}]: expected {block.rows} finite values, "
                             f"got shape {np.shape(measurements[block.block_id])}")
        out[block.block_id] = y
    return out


def estimate_graphical(problem: GraphicalProblem, measurements: Mapping[str, Any], *,
                       iterations: int | None = None, tol: float = TOLERANCE) -> GraphicalEstimate:
    """One unit's graphical-model estimate from its recovered measurements ``{block_id: y_b}``
    (``(k_b,)`` or ``(1, k_b)``, :func:`distfit.estimate.measurements.recover_measurements`).

    Mirror descent runs at most ``iterations`` steps (None: :data:`ITERATIONS`) and stops once
    the loss changes by at most ``tol`` (relative) over :data:`CHECK_EVERY` steps, twice in a
    row; the local polytope (method "local") runs at most ``iterations`` ADMM iterations (None:
    :data:`distfit.estimate.local_polytope.ITERATIONS`) to its own stopping rule.
    """
    if problem.method == "local" and problem.cliques:
        units, _ = _local_units(problem, {b: np.reshape(v, (1, -1)) for b, v in measurements.items()}, iterations)
        return units[0]
    iterations = ITERATIONS if iterations is None else iterations
    ys = _check(problem, measurements)
    solver, ns = problem.solver, problem.solver.ns
    jnp = ns.jnp
    total = sum(float(w @ ys[b]) for b, w in problem.total_weights.items()) / problem.total_information
    total = max(total, 1.0)  # mbi normalises in log space: a total of 0 has no model
    model = problem.model
    white = {b.block_id: b.whitener @ ys[b.block_id] for b in model.blocks}
    if not problem.cliques:
        tables, steps = {}, 0
    elif problem.method == "exact":
        data = (tuple(jnp.asarray(white[b]) for b in solver.measured), solver.bases)
        loss_fn = ns.marginal_loss.MarginalLossFn(problem.cliques, solver.loss, data, problem.lipschitz)
        counted = [0]
        fitted = ns.estimation.MirrorDescent().estimate(
            solver.domain, loss_fn, known_total=total, iters=iterations, tol=tol,
            callback_fn=lambda _: counted.__setitem__(0, counted[0] + CHECK_EVERY))
        tables = {c: np.asarray(fitted.project(c).datavector(flatten=False)) for c in problem.cliques}
        steps = counted[0]
    else:
        target = np.concatenate([white[b][:, None] for b in solver.measured])
        mu, steps, _ = _region_graph(problem, target, np.array([total]), iterations, tol, _warm_start(problem, [white]))
        graph = solver.graph
        tables = {graph.regions[i]: graph.table(mu, i)[0] for i in graph.clique_index}
    tables = {c: np.maximum(t, 0.0) for c, t in tables.items()}
    return _finish(problem, tables, white, total, steps)


def _region_operator(model: MeasurementModel, graph: region_graph.RegionGraph,
                     parent: Mapping[str, tuple[str, ...]]) -> sp.csr_matrix:
    """``K`` (sum_b k_b x cells): the whitened bases of the measured blocks applied to their
    parent cliques' tables in the flat region vector, ``K mu = [G_b M_b mu_C(b)]_b``; the loss
    is ``1/2 ||K mu - w||^2`` and its gradient ``K^T (K mu - w)`` (block diagonal by clique)."""
    number = {r: i for i, r in enumerate(graph.regions)}
    rows, cols, vals, first = [], [], [], 0
    for block in model.blocks:
        if not block.attributes:
            continue
        i = number[parent[block.block_id]]
        clique, shape = graph.regions[i], graph.shapes[i]
        keep = [j for j, a in enumerate(clique) if a in block.attributes]
        index = np.indices(shape).reshape(len(shape), -1)
        marginal_cell = np.ravel_multi_index(tuple(index[keep]), tuple(shape[j] for j in keep))
        k, cells = block.whitened_basis.shape[0], index.shape[1]
        rows.append(np.repeat(np.arange(first, first + k), cells))
        cols.append(np.tile(graph.region_start[i] + np.arange(cells), k))
        vals.append(block.whitened_basis[:, marginal_cell].reshape(-1))
        first += k
    return sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                         shape=(first, graph.cells))


def _region_graph(problem: GraphicalProblem, target: np.ndarray, total: np.ndarray, iterations: int,
                  tol: float, theta: np.ndarray,
                  progress: Callable[[int, int], None] | None = None) -> tuple[np.ndarray, int, np.ndarray]:
    """APPGM for ``n`` units at once (``target`` (sum_b k_b, n) the whitened measurements,
    ``total`` (n,)): mirror descent on the clique potentials, each step from a warm-started damped
    sweep of convex GBP (:mod:`distfit.estimate.region_graph`), first step ``2 / (L N)``, then
    mbi's Armijo rule per unit (accept and grow by 1% when the loss falls by at least half the
    linear prediction, else halve); then sweeps with the potentials held until every edge of the
    region graph agrees to :data:`POLISH_CONSISTENCY` of the total, and the I-projection onto
    agreement (to :data:`CONSISTENCY`). Returns ``mu`` (cells, n), the steps
    and whether each unit converged (its loss stalled and its regions agree). ``progress(steps,
    iterations)`` is called after every batch of :data:`CHECK_EVERY` steps."""
    graph, k = problem.solver.graph, problem.solver.step
    n = target.shape[1]
    up, down = region_graph.zero_messages(graph, n)
    for _ in range(WARM_SWEEPS):  # messages of the warm start's potentials first, so Armijo compares like with like
        mu, up, down = region_graph.sweep(graph, theta, up, down, total)
    stepsize = 2.0 / (problem.lipschitz * total)

    def loss(mu):
        r = k @ mu - target
        return 0.5 * np.einsum("ij,ij->j", r, r), r

    previous, stalls, steps, restarts = np.full(n, np.inf), np.zeros(n, int), 0, 0
    while steps < iterations:
        if (stalls >= 2).all() and restarts < RESTARTS:
            # the step sizes collapse once the lagging messages make every trial look worse: settle
            # the messages of the held potentials, then start the line search afresh
            for _ in range(RESTART_SWEEPS):
                mu, up, down = region_graph.sweep(graph, theta, up, down, total)
            stalls, previous, restarts = np.zeros(n, int), np.full(n, np.inf), restarts + 1
            stepsize = 2.0 / (problem.lipschitz * total)
        active = stalls < 2  # a converged unit is frozen, so a unit's estimate does not depend on its chunk
        for _ in range(CHECK_EVERY):
            for _ in range(1 + INNER_GROWTH * restarts):
                mu, up, down = region_graph.sweep(graph, theta, up, down, total)
            value, r = loss(mu)
            grad = k.T @ r
            trial = theta - stepsize * grad
            mu2, up2, down2 = mu, up, down
            for _ in range(1 + INNER_GROWTH * restarts):
                mu2, up2, down2 = region_graph.sweep(graph, trial, up2, down2, total)
            value2, _ = loss(mu2)
            accept = active & (value - value2 >= 0.5 * stepsize * np.einsum("ij,ij->j", grad, mu - mu2))
            theta = np.where(accept, trial, theta)
            up, down = np.where(accept, up2, up), np.where(accept, down2, down)
            grow = GROWTH if restarts == 0 else 1.01  # mbi's rule once near the optimum: less lag bias
            stepsize = np.where(accept, grow * stepsize, np.where(active, 0.5 * stepsize, stepsize))
            value = np.where(accept, value2, value)
        steps += CHECK_EVERY
        if progress is not None:
            progress(steps, iterations)
        stalls = np.where(active, np.where(previous - value <= tol * np.maximum(np.abs(value), 1.0), stalls + 1, 0), stalls)
        previous = value
        if (stalls >= 2).all() and restarts >= RESTARTS:
            break
    for sweep in range(POLISH_SWEEPS):
        mu, up, down = region_graph.sweep(graph, theta, up, down, total)
        if sweep % CHECK_EVERY == CHECK_EVERY - 1 and (region_graph.inconsistency(graph, mu) <= POLISH_CONSISTENCY * total).all():
            break
    mu = region_graph.make_consistent(graph, mu, CONSISTENCY * total)
    agree = region_graph.inconsistency(graph, mu) <= CONSISTENCY * total
    return mu, steps, (stalls >= 2) & agree


def estimate_units(problem: GraphicalProblem, measurements: Mapping[str, np.ndarray], *,
                   iterations: int | None = None, tol: float = TOLERANCE,
                   progress: Callable[[int, int], None] | None = None,
                   checkpoints: local_polytope.Checkpoints | None = None) -> GraphicalChunk:
    """The estimates of ``n`` units from their recovered measurements ``{block_id: (n, k_b)}``:
    the region graph propagates every unit at once (one mirror descent per unit, with its own
    step sizes); exact inference runs :func:`estimate_graphical` unit by unit. ``progress(steps,
    iterations)``: called after every batch of :data:`CHECK_EVERY` mirror descent steps of the
    region graph, of :data:`distfit.estimate.local_polytope.CHECK_EVERY` ADMM iterations of the
    local polytope (the exact path reports nothing: its steps take milliseconds).
    ``checkpoints``: where the local polytope's ADMM saves its state and resumes from it
    (:func:`distfit.estimate.local_polytope.solve`; the other methods keep none)."""
    model = problem.model
    n = next(iter(measurements.values())).shape[0] if measurements else 0
    if problem.method == "local" and problem.cliques:
        units, converged = _local_units(problem, measurements, iterations, progress, checkpoints)
    elif problem.method == "exact" or not problem.cliques:
        iterations = ITERATIONS if iterations is None else iterations
        units = [estimate_graphical(problem, {b: v[u] for b, v in measurements.items()}, iterations=iterations, tol=tol)
                 for u in range(n)]
        converged = np.array([e.iterations < iterations for e in units], dtype=bool)
    else:
        iterations = ITERATIONS if iterations is None else iterations
        ys, white = _whitened(problem, measurements)
        total = np.array([max(sum(float(w @ y[b]) for b, w in problem.total_weights.items())
                              / problem.total_information, 1.0) for y in ys])
        target = np.stack([np.concatenate([w[b] for b in problem.solver.measured]) for w in white], axis=1)
        mu, steps, converged = _region_graph(problem, target, total, iterations, tol, _warm_start(problem, white),
                                             progress)
        units = _region_units(problem, mu, white, total, steps)
    flat = np.zeros((n, sum(t.size for t in units[0].marginals.values()))) if units else np.zeros((0, 0))
    for u, e in enumerate(units):
        flat[u] = np.concatenate([e.marginals[c].reshape(-1) for c in problem.cliques]) if problem.cliques else []
    return GraphicalChunk(estimates=np.stack([e.estimates for e in units]) if units else np.zeros((0, model.num_queries)),
                          marginals=flat, objective=np.array([e.objective for e in units]),
                          iterations=max((e.iterations for e in units), default=0), converged=np.asarray(converged, bool),
                          inconsistency=np.array([e.inconsistency for e in units]))


def _whitened(problem: GraphicalProblem,
              measurements: Mapping[str, np.ndarray]) -> tuple[list[dict[str, np.ndarray]], list[dict[str, np.ndarray]]]:
    """Per unit of ``measurements`` ``{block_id: (n, k_b)}``: its checked measurements ``y_b``
    and their whitened ``C_b^-1 y_b``, each ``{block_id: (k_b,)}``."""
    n = next(iter(measurements.values())).shape[0]
    ys = [_check(problem, {b: v[u] for b, v in measurements.items()}) for u in range(n)]
    return ys, [{b.block_id: b.whitener @ y[b.block_id] for b in problem.model.blocks} for y in ys]


def _region_units(problem: GraphicalProblem, mu: np.ndarray, white: list[Mapping[str, np.ndarray]],
                  total: np.ndarray, steps: int) -> list[GraphicalEstimate]:
    """Each unit's estimate from the region graph's flat tables ``mu`` (cells, n), its cliques'
    tables with the cells below 0 (rounding) set to 0 (:func:`_finish`)."""
    graph = problem.solver.graph
    return [_finish(problem, {graph.regions[i]: np.maximum(graph.table(mu[:, [u]], i)[0], 0.0)
                              for i in graph.clique_index}, white[u], float(total[u]), steps)
            for u in range(mu.shape[1])]


def _local_units(problem: GraphicalProblem, measurements: Mapping[str, np.ndarray], iterations: int | None,
                 progress: Callable[[int, int], None] | None = None,
                 checkpoints: local_polytope.Checkpoints | None = None) -> tuple[list[GraphicalEstimate], np.ndarray]:
    """The units of ``measurements`` ``{block_id: (n, k_b)}`` projected onto the local polytope
    in the published queries' metric (:mod:`distfit.estimate.local_polytope`), every unit at
    once; the total is the estimate's own (free in that projection)."""
    _, white = _whitened(problem, measurements)
    stacked = np.stack([np.concatenate([w[b.block_id] for b in problem.model.blocks]) for w in white], axis=1)
    u, steps, converged = local_polytope.solve(
        problem.local, stacked, progress=progress, checkpoints=checkpoints,
        iterations=local_polytope.ITERATIONS if iterations is None else iterations)
    flat = local_polytope.tables(problem.local, u)
    # ADMM leaves cells down to -NEGATIVITY noise sd, published as 0: the I-projection onto
    # agreement (as the region graph's, CONSISTENCY of the total) makes the cliques agree again
    graph = problem.solver.graph
    mu = np.zeros((graph.cells, len(white)))
    number = {r: i for i, r in enumerate(graph.regions)}
    for i, c in enumerate(problem.local.cliques):
        r = number[c]
        mu[graph.region_start[r]:graph.region_start[r + 1]] = flat[problem.local.clique_start[i]:problem.local.clique_start[i + 1]]
    total = flat[problem.local.clique_start[0]:problem.local.clique_start[1]].sum(axis=0)
    return _region_units(problem, region_graph.make_consistent(graph, mu, CONSISTENCY * total), white, total,
                         steps), converged


def _project(table: np.ndarray, clique: tuple[str, ...], attributes: tuple[str, ...]) -> np.ndarray:
    """The marginal of ``table`` (over ``clique``) on ``attributes`` (a subset, same order)."""
    drop = tuple(i for i, a in enumerate(clique) if a not in attributes)
    return table.sum(axis=drop) if drop else table


def _inconsistency(problem: GraphicalProblem, tables: Mapping, total: float) -> float:
    """The largest disagreement of two cliques on their shared attributes, over the total: for
    every intersection of cliques (the region graph's regions, else the pairwise intersections),
    the spread of the marginals of the cliques that contain it."""
    graph = problem.solver.graph
    if graph is not None:
        shared = [r for r in graph.regions if r not in tables]
    else:
        shared = {tuple(a for a in r if a in s) for r, s in itertools.combinations(problem.cliques, 2)} - {()}
    worst = 0.0
    for s in shared:
        marginals = np.stack([_project(tables[c], c, s) for c in problem.cliques if set(s) <= set(c)])
        worst = max(worst, float((marginals.max(axis=0) - marginals.min(axis=0)).max()))
    return worst / total


def _finish(problem: GraphicalProblem, tables: dict, white: Mapping[str, np.ndarray], total: float,
            steps: int) -> GraphicalEstimate:
    """Workload estimates, objective and consistency from the clique tables."""
    model = problem.model
    estimates = np.zeros(model.num_queries)
    objective = 0.0
    for block in model.blocks:
        c = problem.parent[block.block_id]
        marginal = _project(tables[c], c, block.attributes).reshape(-1) if c else np.array([total])
        np.add.at(estimates, block.query_index, block.query_rows @ marginal)
        r = block.whitened_basis @ marginal - white[block.block_id]
        objective += float(r @ r)
    return GraphicalEstimate(marginals=tables, estimates=estimates, method=problem.method, iterations=steps,
                             objective=objective, total=total, inconsistency=_inconsistency(problem, tables, total))
