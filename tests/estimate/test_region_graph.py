"""Vectorised convex GBP (distfit.estimate.region_graph) against mbi's own convex GBP: the same
region graph, the same fixed point; several units propagated at once as one at a time."""
from __future__ import annotations

import itertools

import cvxpy as cp
import jax  # mbi's array library (the graphical extra, part of the test extra)
import mbi  # the graphical extra is part of the test extra: its absence fails here
import numpy as np
import scipy.sparse as sp

from distfit.estimate import region_graph as rg

NAMES = ("a0", "a1", "a2", "a3", "a4")
SIZES = (2, 3, 4, 2, 3)
CLIQUES = list(itertools.combinations(NAMES, 3))[:7]


def potentials(graph, seed, units):
    rng = np.random.default_rng(seed)
    theta = np.zeros((graph.cells, units))
    for i in graph.clique_index:
        theta[graph.region_start[i]:graph.region_start[i + 1]] = rng.normal(size=(graph.region_start[i + 1] - graph.region_start[i], units))
    return theta


def test_graph_is_mbis_saturated_minimal_graph():
    """Same regions; every region keeps one parent per group of parents sharing an ancestor, so
    the numbers of edges agree (the representative of a group may differ)."""
    from mbi.approximate_oracles import build_graph

    graph = rg.region_graph(CLIQUES, NAMES, SIZES)
    regions, _, _, _, parents, _ = build_graph(mbi.Domain(NAMES, SIZES), CLIQUES)
    assert set(graph.regions) == set(regions)
    assert len(graph.edges) == sum(len(parents[r]) for r in regions)
    assert graph.cells == sum(int(np.prod([SIZES[NAMES.index(a)] for a in r])) for r in regions)


def test_fixed_point_equals_mbis_convex_gbp():
    """400 sweeps of each from cold messages: the pseudo-marginals of every clique agree to 1e-8
    of the total, and the regions lie on the local polytope (parents marginalise onto children)."""
    jax.config.update("jax_enable_x64", True)
    from mbi.approximate_oracles import convex_generalized_belief_propagation as cgbp

    graph = rg.region_graph(CLIQUES, NAMES, SIZES)
    theta = potentials(graph, 0, 1)
    domain = mbi.Domain(NAMES, SIZES)
    factors = {graph.regions[i]: mbi.Factor(domain.project(graph.regions[i]), jax.numpy.asarray(graph.table(theta, i)[0]))
               for i in graph.clique_index}
    vector = mbi.CliqueVector(domain, list(factors), factors)
    total = np.array([100.0])
    up, down = rg.zero_messages(graph, 1)
    state = None
    for _ in range(400):
        mu, up, down = rg.sweep(graph, theta, up, down, total)
        reference, state = cgbp(vector, 100.0, state=state)
    for i in graph.clique_index:
        np.testing.assert_allclose(graph.table(mu, i)[0], np.asarray(reference[graph.regions[i]].values), atol=1e-8 * 100)
        assert abs(graph.table(mu, i).sum() - 100.0) < 1e-9
    assert rg.inconsistency(graph, mu)[0] < 1e-8 * 100


def test_units_propagate_independently():
    graph = rg.region_graph(CLIQUES, NAMES, SIZES)
    theta = potentials(graph, 1, 3)
    total = np.array([10.0, 200.0, 3.0])
    up, down = rg.zero_messages(graph, 3)
    for _ in range(5):
        mu, up, down = rg.sweep(graph, theta, up, down, total)
    for u in range(3):
        one_up, one_down = rg.zero_messages(graph, 1)
        for _ in range(5):
            one, one_up, one_down = rg.sweep(graph, theta[:, [u]], one_up, one_down, total[[u]])
        np.testing.assert_allclose(mu[:, [u]], one, rtol=1e-12, atol=1e-12)


def _segment_logsumexp(x, starts, segment):
    top = np.maximum.reduceat(x, starts, axis=0)
    top = np.where(np.isfinite(top), top, 0.0)
    return np.log(np.add.reduceat(np.exp(x - top[segment]), starts, axis=0)) + top


def numpy_sweeper(g):
    """The module docstring's sweep as numpy gathers, scipy sparse scatter-adds and ``reduceat``
    (the implementation before the compiled pass), its sparse matrices built once: the reference."""
    from_children = sp.csr_matrix((np.ones(g.parent_cell.size), (g.parent_cell, np.arange(g.parent_cell.size))),
                                  shape=(g.cells, g.parent_cell.size))
    from_parents = sp.csr_matrix((np.ones(g.messages), (g.message_cell, np.arange(g.messages))), shape=(g.cells, g.messages))
    message_edge = np.repeat(np.arange(len(g.edges)), np.diff(g.edge_start))
    edges = g.edge_start[:-1]

    def sweep(potentials, up, down, total):
        base = potentials + from_children @ up[g.parent_message]
        x = (base - from_parents @ up)[g.parent_cell] - up[g.parent_message]
        new_down = _segment_logsumexp(x, g.message_first, g.parent_message)
        new_down -= _segment_logsumexp(new_down, edges, message_edge)[message_edge]
        inward = base + from_parents @ down
        new_up = g.counting[:, None] * inward[g.message_cell] - down
        new_up -= _segment_logsumexp(new_up, edges, message_edge)[message_edge]
        up = rg.DAMPING * up + (1.0 - rg.DAMPING) * new_up
        down = rg.DAMPING * down + (1.0 - rg.DAMPING) * new_down
        belief = potentials + from_children @ up[g.parent_message] - from_parents @ up
        z = _segment_logsumexp(belief, g.region_start[:-1], g.cell_region)
        return np.exp(belief - z[g.cell_region]) * total[None, :], up, down

    return sweep


def test_the_compiled_sweep_is_the_numpy_formula():
    """Thirty sweeps of three units from cold messages, on a graph with messages and on one region
    alone (no edges): the compiled pass gives the numpy formula's beliefs and messages to a few
    ulps (the same sums in the same order; only ``exp`` and ``log`` are another library's), with
    potentials of -inf (a cell ruled out) among them."""
    for cliques in (CLIQUES, [("a0", "a1")]):
        graph = rg.region_graph(cliques, NAMES, SIZES)
        theta = potentials(graph, 2, 3)
        theta[graph.region_start[graph.clique_index[0]], 1] = -np.inf
        total = np.array([7.0, 120.0, 0.5])
        up, down = rg.zero_messages(graph, 3)
        ref_up, ref_down = up, down
        reference = numpy_sweeper(graph)
        for _ in range(30):
            mu, up, down = rg.sweep(graph, theta, up, down, total)
            ref_mu, ref_up, ref_down = reference(theta, ref_up, ref_down, total)
        np.testing.assert_allclose(mu, ref_mu, rtol=1e-12, atol=1e-12 * total.max())
        np.testing.assert_allclose(up, ref_up, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(down, ref_down, rtol=1e-12, atol=1e-12)
        assert np.isfinite(mu).all() and mu[graph.region_start[graph.clique_index[0]], 1] == 0.0


def cliques_agree(graph, mu, unit):
    """Independent check: the largest gap of two cliques' tables on their shared attributes."""
    worst = 0.0
    for i, j in itertools.combinations(graph.clique_index, 2):
        r, s = graph.regions[i], graph.regions[j]
        shared = [a for a in r if a in s]
        if shared:
            a = graph.table(mu[:, [unit]], i)[0].sum(axis=tuple(k for k, x in enumerate(r) if x not in shared))
            b = graph.table(mu[:, [unit]], j)[0].sum(axis=tuple(k for k, x in enumerate(s) if x not in shared))
            worst = max(worst, np.abs(a - b).max())
    return worst


def test_make_consistent_is_the_i_projection_onto_agreement():
    """Pseudo-marginals from a few sweeps (not yet agreeing), of mild and of near-deterministic
    potentials (cells down to ~1e-12): make_consistent's cliques agree to 1e-9 of the total,
    keep their totals, stay nonnegative, the other regions are their marginals, and the clique
    tables are Clarabel's argmin sum KL(tau || mu) over agreeing tables of the same total (to
    1e-5 of the total). (Far sparser inputs leave Clarabel "optimal_inaccurate" and above
    make_consistent's objective.)"""
    names, sizes = NAMES[:4], SIZES[:4]
    cliques = list(itertools.combinations(names, 3))
    graph = rg.region_graph(cliques, names, sizes)
    theta = potentials(graph, 2, 2)
    theta[:, 1] *= 10.0  # near-deterministic
    total = np.array([50.0, 300.0])
    up, down = rg.zero_messages(graph, 2)
    for _ in range(10):
        mu, up, down = rg.sweep(graph, theta, up, down, total)
    assert (rg.inconsistency(graph, mu) > 1e-5 * total).all()
    tau = rg.make_consistent(graph, mu, 1e-9 * total)
    assert tau.min() >= 0
    assert (rg.inconsistency(graph, tau) <= 2e-9 * total).all()
    for u in range(2):
        assert cliques_agree(graph, tau, u) <= 2e-9 * total[u]
        for i in graph.clique_index:
            assert abs(graph.table(tau[:, [u]], i).sum() - total[u]) <= 1e-9 * total[u]
        variables = {i: cp.Variable(graph.region_start[i + 1] - graph.region_start[i], nonneg=True) for i in graph.clique_index}
        constraints = [cp.sum(v) == total[u] for v in variables.values()]
        for i, j in itertools.combinations(graph.clique_index, 2):
            r, s = graph.regions[i], graph.regions[j]
            shared = [a for a in r if a in s]
            constraints.append(marginal_matrix(graph, i, shared) @ variables[i] == marginal_matrix(graph, j, shared) @ variables[j])
        start = {i: mu[graph.region_start[i]:graph.region_start[i + 1], u] for i in graph.clique_index}
        objective = sum(cp.sum(cp.kl_div(variables[i], start[i])) for i in graph.clique_index)
        cp.Problem(cp.Minimize(objective), constraints).solve(solver=cp.CLARABEL)
        for i in graph.clique_index:
            np.testing.assert_allclose(tau[graph.region_start[i]:graph.region_start[i + 1], u], variables[i].value,
                                       atol=1e-5 * total[u])


def marginal_matrix(graph, region, shared):
    """The 0/1 matrix that sums region ``region``'s cells onto the attributes ``shared``."""
    shape = graph.shapes[region]
    index = np.indices(shape).reshape(len(shape), -1)
    keep = [k for k, a in enumerate(graph.regions[region]) if a in shared]
    target = np.ravel_multi_index(tuple(index[keep]), tuple(shape[k] for k in keep))
    out = np.zeros((target.max() + 1, index.shape[1]))
    out[target, np.arange(index.shape[1])] = 1.0
    return out
