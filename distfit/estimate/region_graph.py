"""Convex generalised belief propagation on a saturated region graph, vectorised (APPGM, issue 15).

paper 004 (McKenna et al., "Relaxed marginal consistency for differentially private query
answering", Algorithm 2, after Hazan and Shashua's convex GBP with counting numbers 1) and its
implementation in mbi (``mbi.approximate_oracles.convex_generalized_belief_propagation``),
computed here on every edge of the graph at once: all region tables live in one flat vector
(``cells`` entries), all messages in another (one child-sized table per edge), and every
operation of a sweep is a gather, a scatter-add or a segmented ``logsumexp``, done entry by entry
in one compiled pass (:func:`sweep`). mbi's version unrolls one program per message (Adult:
2,212 messages, minutes of jax compilation); this one is compiled once for every graph (ahead of
use, with the estimate's other kernels) and costs microseconds a sweep on small graphs. Every array carries a trailing axis of units
(``(cells, n)``), so a chunk of units is propagated together.

The graph is mbi's (``build_graph``; Koller and Friedman, Algorithm 11.3): the regions are the
cliques and every nonempty intersection of regions; an edge joins a region to each region it
covers directly, and of the parents of a region that share an ancestor only one is kept.
With ``U_e`` (child to parent) and ``D_e`` (parent to child) the log messages of edge ``e = (p, r)``
over ``r``'s cells, ``theta_r`` the potentials (zero off the cliques) and
``B_r = theta_r + sum_{c child of r} U_{r c}``, one damped sweep (damping ``rho = 1/2``) is

    ``D_e <- norm( logsumexp_{p -> r} ( B_p - sum_{q parent of p} U_{q p} - U_e ) )``
    ``U_e <- norm( (B_r + sum_{q parent of r} D_{q r}) / (1 + |parents(r)|) - D_e )``
    ``mu_r = N exp(norm(B_r - sum_{q parent of r} U_{q r}))``

(all right-hand sides from the old messages; ``norm`` subtracts the table's logsumexp), and the
messages move half way to the new values. At a fixed point the pseudo-marginals ``mu`` are the
maximiser of the convex free energy over the local polytope (every parent marginalises onto its
children), which is what APPGM's mirror descent needs of its oracle. Away from it (the sweeps
converge linearly, slowly where most cells are ~1e-40), :func:`make_consistent` moves the
cliques' tables to the nearest agreeing ones (an I-projection, by Newton's method).
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import scipy.sparse as sp

from distfit.estimate.compiled import jit, kernel

__all__ = ["KERNELS", "RegionGraph", "make_consistent", "inconsistency", "region_graph", "sweep", "zero_messages"]

#: Damping of the message updates (mbi's default; needed on dense graphs).
DAMPING = 0.5
#: Most Newton steps, and conjugate gradient steps per Newton step, in :func:`make_consistent`.
NEWTON_STEPS = 20
CG_STEPS = 500
#: The conjugate gradients' relative tolerance at a Newton step of :func:`make_consistent`: the
#: unit's largest gap over its first, within [FORCING_MIN, FORCING_MAX] (inexact Newton, Dembo,
#: Eisenstat and Steihaug 1982: a forcing term that falls with the residual keeps the steps'
#: fast convergence). Adult: the same 9 Newton steps with 1,187 products instead of 2,575 at a
#: fixed 1e-6.
FORCING_MIN = 1e-6
FORCING_MAX = 1e-2


@dataclass(frozen=True, eq=False)
class RegionGraph:
    """A region graph laid out flat.

    ``regions`` (attribute tuples, schema order) and their ``shapes``; ``region_start`` (R + 1,)
    offsets of each table in the flat cell vector (``cells``); ``edges`` (E, 2) parent, child
    region numbers; ``edge_start`` (E + 1,) offsets of each edge's message (child-sized) in the
    message vector (``messages``); ``message_cell`` (messages,) the child cell each message entry
    belongs to; ``message_edge`` (messages,); ``counting`` (messages,) ``1 / (1 + |parents(r)|)``;
    ``parent_cell`` (S,) every (edge, parent cell) pair's parent cell, sorted by message entry,
    ``parent_message`` (S,) that entry and ``message_first`` (messages,) where each entry's run
    starts; ``cell_region`` (cells,); ``clique_index`` the regions that are cliques.
    """

    regions: tuple[tuple[str, ...], ...]
    shapes: tuple[tuple[int, ...], ...]
    region_start: np.ndarray
    cells: int
    edges: np.ndarray
    edge_start: np.ndarray
    messages: int
    message_cell: np.ndarray
    message_edge: np.ndarray
    counting: np.ndarray
    parent_cell: np.ndarray
    parent_message: np.ndarray
    message_first: np.ndarray
    cell_region: np.ndarray
    clique_index: tuple[int, ...]

    def table(self, flat: np.ndarray, region: int) -> np.ndarray:
        """Region ``region``'s table of ``flat`` (cells, n) as (n, *shape)."""
        block = flat[self.region_start[region]:self.region_start[region + 1]]
        return np.moveaxis(block, 0, -1).reshape(flat.shape[1:] + self.shapes[region])


def _minimal_graph(cliques: Sequence[tuple[str, ...]], order: Mapping[str, int]):
    """mbi's ``build_graph``: saturated regions, covering edges, one parent per group of parents
    that share an ancestor."""
    key = lambda s: tuple(order[a] for a in s)  # noqa: E731
    regions = set(cliques)
    size = 0
    while len(regions) > size:
        size = len(regions)
        for r1, r2 in itertools.combinations(list(regions), 2):
            z = tuple(sorted(set(r1) & set(r2), key=order.__getitem__))
            if z:
                regions.add(z)
    regions = sorted(regions, key=lambda s: (-len(s), key(s)))
    sets = {r: frozenset(r) for r in regions}
    below = {r: [s for s in regions if sets[s] < sets[r]] for r in regions}
    covers = {r: [s for s in below[r] if not any(sets[s] < sets[t] for t in below[r])] for r in regions}
    parents = {r: [p for p in regions if r in covers[p]] for r in regions}
    ancestors = {r: {p for p in regions if sets[r] < sets[p]} for r in regions}
    edges = []
    for r in regions:
        groups: list[set] = []  # parents joined when they share an ancestor (a disjoint set)
        for u in parents[r]:
            joined = [g for g in groups if any(ancestors[u] & ancestors[v] for v in g)]
            merged = {u}.union(*joined)
            groups = [g for g in groups if g not in joined] + [merged]
        edges.extend((min(g, key=parents[r].index), r) for g in groups)
    return regions, edges


def region_graph(cliques: Sequence[tuple[str, ...]], attributes: Sequence[str],
                 sizes: Sequence[int]) -> RegionGraph:
    """The flat saturated region graph of ``cliques`` over the schema (``attributes``, ``sizes``)."""
    order = {a: i for i, a in enumerate(attributes)}
    size_of = dict(zip(attributes, sizes))
    regions, edges = _minimal_graph(list(cliques), order)
    number = {r: i for i, r in enumerate(regions)}
    shapes = tuple(tuple(size_of[a] for a in r) for r in regions)
    region_start = np.concatenate([[0], np.cumsum([math.prod(s) for s in shapes])]).astype(np.int64)
    cells = int(region_start[-1])
    edge_array = np.array([(number[p], number[r]) for p, r in edges], dtype=np.int64).reshape(-1, 2)
    parent_count = np.bincount(edge_array[:, 1], minlength=len(regions)) if len(edges) else np.zeros(len(regions), int)
    child_sizes = np.array([math.prod(shapes[r]) for _, r in edge_array], dtype=np.int64)
    edge_start = np.concatenate([[0], np.cumsum(child_sizes)]).astype(np.int64)
    pc, pm = [], []
    for e, (p, r) in enumerate(edge_array):
        shape = shapes[p]
        keep = [i for i, a in enumerate(regions[p]) if a in regions[r]]
        # each parent cell's child cell: ravel the kept axes of its multi-index
        index = np.indices(shape).reshape(len(shape), -1)
        child = np.ravel_multi_index(tuple(index[keep]), shapes[r]) if keep else np.zeros(index.shape[1], np.int64)
        sort = np.argsort(child, kind="stable")
        pc.append(region_start[p] + sort)
        pm.append(edge_start[e] + child[sort])
    parent_cell = np.concatenate(pc) if pc else np.zeros(0, np.int64)
    parent_message = np.concatenate(pm) if pm else np.zeros(0, np.int64)
    messages = int(edge_start[-1])
    message_edge = np.repeat(np.arange(len(edge_array)), child_sizes)
    message_cell = (region_start[edge_array[message_edge, 1]] + np.arange(messages)
                    - edge_start[message_edge]) if messages else np.zeros(0, np.int64)
    message_first = np.searchsorted(parent_message, np.arange(messages))
    counting = 1.0 / (1.0 + parent_count[edge_array[message_edge, 1]]) if messages else np.zeros(0)
    cell_region = np.repeat(np.arange(len(regions)), np.diff(region_start))
    clique_set = set(cliques)
    return RegionGraph(regions=tuple(regions), shapes=shapes, region_start=region_start, cells=cells,
                       edges=edge_array, edge_start=edge_start, messages=messages, message_cell=message_cell,
                       message_edge=message_edge, counting=counting, parent_cell=parent_cell,
                       parent_message=parent_message, message_first=message_first, cell_region=cell_region,
                       clique_index=tuple(i for i, r in enumerate(regions) if r in clique_set))


def zero_messages(graph: RegionGraph, units: int) -> tuple[np.ndarray, np.ndarray]:
    """Cold-start messages ``(up, down)``, each (messages, units)."""
    return np.zeros((graph.messages, units)), np.zeros((graph.messages, units))


def sweep(graph: RegionGraph, potentials: np.ndarray, up: np.ndarray, down: np.ndarray,
          total: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One damped sweep (module docstring) from ``potentials`` (cells, n) and the messages
    ``up``, ``down`` (messages, n); returns the pseudo-marginals ``mu`` (cells, n; every region's
    table sums to ``total`` (n,)) from the new messages, as mbi does, and the new messages.

    One compiled pass (:func:`_sweep`): the gathers, scatter-adds and segmented ``logsumexp`` of
    the formulas entry by entry, in the order numpy and scipy's sparse products take them (each
    sum from zero in increasing entry order), so a sweep costs microseconds on small graphs
    instead of the ~0.5 ms of some twenty numpy and sparse calls."""
    g = graph
    n = potentials.shape[1]
    mu, new_up, new_down = np.empty((g.cells, n)), np.empty((g.messages, n)), np.empty((g.messages, n))
    _sweep(np.ascontiguousarray(potentials, dtype=np.float64), np.ascontiguousarray(up, dtype=np.float64),
           np.ascontiguousarray(down, dtype=np.float64), np.array(total, dtype=np.float64, ndmin=1),
           g.region_start, g.edge_start, g.message_cell, g.parent_cell, g.parent_message, g.message_first,
           g.counting, DAMPING, mu, new_up, new_down)
    return mu, new_up, new_down


@jit
def _logsumexp_rows(x, first, end, out):
    """``out[j] = log sum_{i in [first, end)} exp(x[i, j])``, stabilised by the run's maximum (zero
    where that is not finite), summed in increasing ``i``: numpy's ``reduceat`` of
    the module docstring's ``norm``."""
    for j in range(x.shape[1]):
        top = x[first, j]
        for i in range(first + 1, end):
            top = max(top, x[i, j])
        if not np.isfinite(top):
            top = 0.0
        acc = np.exp(x[first, j] - top)
        for i in range(first + 1, end):
            acc += np.exp(x[i, j] - top)
        out[j] = np.log(acc) + top


@jit
def _normalise_edges(messages, edge_start, scratch):
    """Subtract each edge's ``logsumexp`` from its message entries, in place (``norm``)."""
    for e in range(edge_start.size - 1):
        _logsumexp_rows(messages, edge_start[e], edge_start[e + 1], scratch)
        for m in range(edge_start[e], edge_start[e + 1]):
            for j in range(messages.shape[1]):
                messages[m, j] -= scratch[j]


@jit
def _from_children(up, parent_cell, parent_message, cells):
    """``from_children @ up[parent_message]``: each parent cell's sum of its entries' messages."""
    out = np.zeros((cells, up.shape[1]))
    for s in range(parent_cell.size):
        for j in range(up.shape[1]):
            out[parent_cell[s], j] += up[parent_message[s], j]
    return out


@jit
def _from_parents(messages, message_cell, cells):
    """``from_parents @ messages``: each child cell's sum of the messages its parents send it."""
    out = np.zeros((cells, messages.shape[1]))
    for m in range(message_cell.size):
        for j in range(messages.shape[1]):
            out[message_cell[m], j] += messages[m, j]
    return out


@kernel("void(float64[:, ::1], float64[:, ::1], float64[:, ::1], float64[::1], int64[::1], int64[::1], int64[::1], "
        "int64[::1], int64[::1], int64[::1], float64[::1], float64, float64[:, ::1], float64[:, ::1], float64[:, ::1])")
def _sweep(potentials, up, down, total, region_start, edge_start, message_cell, parent_cell, parent_message,
           message_first, counting, damping, mu, new_up, new_down):
    cells, n = potentials.shape
    messages = message_cell.size
    scratch = np.empty(n)
    base = _from_children(up, parent_cell, parent_message, cells)
    for c in range(cells):
        for j in range(n):
            base[c, j] = potentials[c, j] + base[c, j]
    if messages > 0:
        # down: each message entry the logsumexp over its parent cells of B_p - sum U_{q p} - U_e
        towards = _from_parents(up, message_cell, cells)
        x = np.empty((parent_cell.size, n))
        for s in range(parent_cell.size):
            for j in range(n):
                x[s, j] = (base[parent_cell[s], j] - towards[parent_cell[s], j]) - up[parent_message[s], j]
        for m in range(messages):
            _logsumexp_rows(x, message_first[m], message_first[m + 1] if m + 1 < messages else parent_cell.size,
                            new_down[m])
        _normalise_edges(new_down, edge_start, scratch)
        # up: the counted inward belief of the child less the message down
        inward = _from_parents(down, message_cell, cells)
        for m in range(messages):
            for j in range(n):
                new_up[m, j] = counting[m] * (base[message_cell[m], j] + inward[message_cell[m], j]) - down[m, j]
        _normalise_edges(new_up, edge_start, scratch)
        for m in range(messages):
            for j in range(n):
                new_up[m, j] = damping * up[m, j] + (1.0 - damping) * new_up[m, j]
                new_down[m, j] = damping * down[m, j] + (1.0 - damping) * new_down[m, j]
        children = _from_children(new_up, parent_cell, parent_message, cells)
        parents = _from_parents(new_up, message_cell, cells)
        for c in range(cells):
            for j in range(n):
                mu[c, j] = (potentials[c, j] + children[c, j]) - parents[c, j]
    else:
        for c in range(cells):
            for j in range(n):
                mu[c, j] = potentials[c, j]
    # the beliefs: N exp(norm(.)) region by region
    for r in range(region_start.size - 1):
        _logsumexp_rows(mu, region_start[r], region_start[r + 1], scratch)
        for c in range(region_start[r], region_start[r + 1]):
            for j in range(n):
                mu[c, j] = np.exp(mu[c, j] - scratch[j]) * total[j]


#: The entry point, for :func:`distfit.estimate.compiled.warm` (``python -m distfit.estimate.warm``).
KERNELS = (_sweep,)


def inconsistency(graph: RegionGraph, mu: np.ndarray) -> np.ndarray:
    """Per unit, the largest gap between a parent's table marginalised onto a child and the
    child's table, over every edge (messages, n) -> (n,): zero exactly on the local polytope."""
    if graph.messages == 0:
        return np.zeros(mu.shape[1])
    projected = np.add.reduceat(mu[graph.parent_cell], graph.message_first, axis=0)
    return np.abs(projected - mu[graph.message_cell]).max(axis=0)


def _slices(graph: RegionGraph, clique: int, region: int) -> tuple[np.ndarray, np.ndarray]:
    """The cells of ``clique`` sorted by the cell of ``region`` (a subset) they add to, and that cell."""
    shape = graph.shapes[clique]
    index = np.indices(shape).reshape(len(shape), -1)
    keep = [i for i, a in enumerate(graph.regions[clique]) if a in graph.regions[region]]
    child = np.ravel_multi_index(tuple(index[keep]), graph.shapes[region])
    sort = np.argsort(child, kind="stable")
    return graph.region_start[clique] + sort, child[sort]


@functools.lru_cache(maxsize=4)
def _agreement(graph: RegionGraph) -> tuple[sp.csr_matrix, sp.csr_matrix, np.ndarray, np.ndarray, np.ndarray]:
    """``(D, D^T, cells, first, destination)``, built once per graph (``D^T`` its own CSR
    matrix: the conjugate gradients' products with it cost half those with the view ``D.T``,
    to the same bits). ``D`` (constraints x cells,
    sparse): for every region ``r`` that is not a clique and every clique ``C`` containing it but
    the first, ``C0``, the rows ``M_{C,r} mu_C - M_{C0,r} mu_C0`` (zero exactly when the cliques
    agree), then one row per clique, its total (the last ``len(graph.clique_index)`` rows); ``D``
    has no column outside the cliques. ``mu[destination] = reduceat(mu[cells],
    first)`` refills every such region from ``C0``."""
    cliques = list(graph.clique_index)
    rows, cols, vals, fill, destination, count = [], [], [], [], [], 0
    for r in range(len(graph.regions)):
        if r in cliques:
            continue
        members = [c for c in cliques if set(graph.regions[r]) <= set(graph.regions[c])]
        size = int(graph.region_start[r + 1] - graph.region_start[r])
        base = _slices(graph, members[0], r)
        fill.append(base)
        destination.append(graph.region_start[r] + np.arange(size))
        for c in members[1:]:
            for (cells, child), sign in ((_slices(graph, c, r), 1.0), (base, -1.0)):
                rows.append(count + child)
                cols.append(cells)
                vals.append(np.full(cells.size, sign))
            count += size
    if not rows:
        return sp.csr_matrix((0, graph.cells)), sp.csr_matrix((graph.cells, 0)), *(np.zeros(0, np.int64),) * 3
    for c in cliques:  # and every clique's total (redundant where the cliques are connected)
        rows.append(np.full(graph.region_start[c + 1] - graph.region_start[c], count))
        cols.append(np.arange(graph.region_start[c], graph.region_start[c + 1]))
        vals.append(np.ones(rows[-1].size))
        count += 1
    d = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(count, graph.cells))
    cells = np.concatenate([c for c, _ in fill])
    child = np.concatenate([o + c for o, (_, c) in zip(np.cumsum([0] + [int(c.max()) + 1 for _, c in fill]), fill)])
    return d, d.T.tocsr(), cells, np.flatnonzero(np.diff(child, prepend=-1)), np.concatenate(destination)


def _batched_cg(apply, rhs: np.ndarray, diagonal: np.ndarray, steps: int, rtol: float | np.ndarray) -> np.ndarray:
    """Jacobi-preconditioned conjugate gradients on ``n`` symmetric positive semidefinite systems
    at once (``apply`` maps (k, n) to (k, n), one column per system; ``rhs`` in the range;
    ``rtol`` one tolerance, or one per system (n,))."""
    x = np.zeros_like(rhs)
    r = rhs.copy()
    z = r / diagonal
    p = z.copy()
    rz = np.einsum("ij,ij->j", r, z)
    stop = rtol ** 2 * rz
    for _ in range(steps):
        if (rz <= stop).all():
            break
        q = apply(p)
        pq = np.einsum("ij,ij->j", p, q)
        alpha = np.divide(rz, pq, out=np.zeros_like(rz), where=(pq > 0) & (rz > stop))
        x += alpha * p
        r -= alpha * q
        z = r / diagonal
        rz, previous = np.einsum("ij,ij->j", r, z), rz
        p = z + np.divide(rz, previous, out=np.zeros_like(rz), where=previous > 0) * p
    return x


def make_consistent(graph: RegionGraph, mu: np.ndarray, tol: np.ndarray) -> np.ndarray:
    """Pseudo-marginals ``mu`` (cells, n) moved to the nearest clique tables (in KL divergence)
    that agree on every shared region and keep their totals ``N`` (n,), then every other region
    refilled from its cliques: the I-projection ``tau = argmin KL(tau || mu) s.t. D tau = b``
    (:func:`_agreement`, ``b`` zero but for the totals; Csiszar 1975), ``tau = mu exp(D^T
    lambda)``, by Newton's method on the dual: each step solves ``D diag(tau) D^T dlambda = b - D
    tau`` (Jacobi-preconditioned CG, every unit at once, to the relative tolerance ``clip(gap /
    first gap, FORCING_MIN, FORCING_MAX)``: inexact Newton) and halves the step until the largest
    gap ``max |D tau - b|`` falls. It stops once every gap is at most ``tol`` (n,), absolute, or
    after :data:`NEWTON_STEPS`.

    Nothing turns negative (``tau`` is ``mu`` times a positive factor). Convex GBP's messages,
    and cyclic proportional fitting alike, converge linearly and slowly where most cells are
    ~1e-40 (sparse units): near the boundary, agreement needs mass moved around a cycle of cliques
    through cells of ~1 record, a badly conditioned direction that Newton's step takes at once.
    """
    d, dt, cells, first, destination = _agreement(graph)
    mu = np.array(mu, dtype=np.float64)
    if d.shape[0] == 0:
        return mu
    tol = np.asarray(tol, dtype=np.float64)
    c0 = graph.clique_index[0]
    b = np.zeros((d.shape[0], mu.shape[1]))
    b[d.shape[0] - len(graph.clique_index):] = mu[graph.region_start[c0]:graph.region_start[c0 + 1]].sum(axis=0)
    squared = d.multiply(d).tocsr()
    tau, gap = mu, d @ mu - b
    initial = None
    for _ in range(NEWTON_STEPS):
        worst = np.abs(gap).max(axis=0)
        if (worst <= tol).all():
            break
        initial = worst if initial is None else initial
        forcing = np.clip(np.divide(worst, initial, out=np.zeros_like(worst), where=initial > 0),
                          FORCING_MIN, FORCING_MAX)
        diagonal = np.maximum(squared @ tau, 1e-300)
        direction = dt @ _batched_cg(lambda v: d @ (tau * (dt @ v)), -gap, diagonal, CG_STEPS, forcing)
        step = np.where(worst > tol, 1.0, 0.0)
        for _ in range(30):
            with np.errstate(over="ignore", invalid="ignore"):  # an overflowing trial is not better: halved
                trial = tau * np.exp(step * direction)
                trial_gap = d @ trial - b
                better = np.abs(trial_gap).max(axis=0) < worst
            if (better | (step == 0)).all():
                break
            step = np.where(better, step, 0.5 * step)
        step = np.where(better, step, 0.0)
        tau = np.where(step > 0, trial, tau)
        gap = np.where(step > 0, trial_gap, gap)
        if (step == 0).all():
            break
    tau[destination] = np.add.reduceat(tau[cells], first, axis=0)
    return tau
