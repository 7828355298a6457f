"""Test helpers shared by the plan tests: small marginal workloads and their block plans."""
from __future__ import annotations

import itertools

import numpy as np

import distfit
from distfit.mathematics.domain import Domain
from distfit.plan.allocate import allocate_scales
from distfit.plan.residual import residual_blocks
from distfit.mathematics.workload import kron_queries, workload_from_groups


def two_way(sizes):
    """A domain of the given attribute sizes and every two-way marginal on it (target 1)."""
    domain = Domain(tuple(f"a{i}" for i in range(len(sizes))), tuple(sizes))
    groups = [
        (f"{a},{b}", {a: np.eye(domain.size_of(a)), b: np.eye(domain.size_of(b))}, 1.0)
        for a, b in itertools.combinations(domain.names, 2)
    ]
    return domain, groups


def marginaliser(domain, attributes):
    """Full-domain -> marginal map (cells of the marginal x d)."""
    return kron_queries(domain, {a: np.eye(domain.size_of(a)) for a in attributes})


def plan_residual(domain, groups):
    """Residual blocks, each solved for its own targets, and their scale allocation."""
    blocks = residual_blocks(domain, groups)
    solutions = [distfit.solve(b.workload, b.targets, basis=b.basis) for b in blocks]
    workload = workload_from_groups(domain, groups)
    allocation = allocate_scales(
        [s.alpha for s in solutions], [(b.query_index, s.variances) for b, s in zip(blocks, solutions)], workload.targets
    )
    return blocks, solutions, allocation, workload
