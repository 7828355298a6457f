"""Sequential composition of block profiles over the full domain (docs/design.md section 2)."""
from __future__ import annotations

import numpy as np

import distfit
from distfit.mathematics.domain import Domain
from distfit.plan.composition import StitchedProfile, stitched_profile, stitched_variances
from distfit.mathematics.workload import prefix_queries
from tests.plan.blocks import marginaliser, plan_residual


def test_stitched_profile_equals_the_whole_mechanism():
    """Profile of the block-diagonal mechanism built directly over the full domain."""
    domain = Domain(("a", "b", "c"), (3, 2, 2))
    rng = np.random.default_rng(0)
    groups = [("a,b", {"a": prefix_queries(3), "b": np.eye(2)}, rng.uniform(1, 3, 6)), ("c", {"c": np.eye(2)}, 1.0)]
    blocks, solutions, allocation, _ = plan_residual(domain, groups)
    lifted = [b.basis @ marginaliser(domain, b.attributes) for b in blocks]
    whole_basis = np.vstack(lifted)
    sizes = [b.basis.shape[0] for b in blocks]
    whole_sigma = np.zeros((sum(sizes), sum(sizes)))
    offset = 0
    for size, solution, scale in zip(sizes, solutions, allocation.scales):
        whole_sigma[offset : offset + size, offset : offset + size] = solution.sigma * scale
        offset += size
    direct = distfit.privacy_profile(whole_sigma, whole_basis)
    stitched = stitched_profile(domain, [(b.attributes, s.profile / k) for b, s, k in zip(blocks, solutions, allocation.scales)])
    np.testing.assert_allclose(stitched, direct, rtol=1e-8)


def test_stitched_profile_accumulates_like_the_list_form():
    domain = Domain(("a", "b", "c"), (3, 2, 4))
    rng = np.random.default_rng(0)
    parts = [(("a",), rng.random(3)), (("a", "c"), rng.random(12)), ((), rng.random(1)), (("b", "c"), rng.random(8))]
    accumulated = StitchedProfile(domain)
    for attributes, profile in parts:
        accumulated.add(attributes, profile)
    assert accumulated.values().tobytes() == stitched_profile(domain, parts).tobytes()
    # the sums of the broadcast profiles, in order (the list form before StitchedProfile)
    total = np.zeros(domain.shape)
    for attributes, profile in parts:
        total = total + profile.reshape([domain.size_of(a) if a in attributes else 1 for a in domain.names])
    assert stitched_profile(domain, parts).tobytes() == total.ravel().tobytes()
    assert accumulated.max() == float(total.max())


def test_stitched_variances_add_every_row_of_a_query():
    variances = stitched_variances(4, [(np.array([0, 2, 2]), np.array([1.0, 2.0, 3.0])), (np.array([2, 3]), np.array([0.5, 4.0]))])
    np.testing.assert_array_equal(variances, [1.0, 0.0, 5.5, 4.0])
