"""Vectorised convex GBP (distfit.estimate.region_graph) against mbi's own convex GBP: the same
region graph, the same fixed point; several units propagated at once as one at a time."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from distfit.estimate import region_graph as rg

mbi = pytest.importorskip("mbi", reason="the graphical extra (mbi, jax) is not installed")
jax = pytest.importorskip("jax")

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
