"""How blocks' privacy and variances add up (docs/design.md section 2).

Two ways blocks combine:

* **parallel** (disjoint cells or disjoint people): profile = concatenation, alpha = max_b alpha_b.
  ``residual.connected_blocks`` cuts a workload into the connected components of its query-cell
  graph, which loses nothing; units of one geographic level hold disjoint people.
* **sequential** (the same people seen through several blocks): a person in full-domain cell x
  meets one column of every block, so ``p(x) = sum_b p_b(x_b)`` and
  ``alpha = max_x p(x) <= sum_b alpha_b`` (equal when the block profiles are flat).

Sequential composition is what a plan's blocks (``planner``), the levels of a multi-level run
(``levels``) and the auditor (``distfit.audit.plan``) evaluate: ``stitched_profile`` over the full
domain when it has at most ``EXACT_DOMAIN_LIMIT`` cells, else the sum bound. A query's variance
is the sum of its rows' variances over the blocks that hold it (``stitched_variances``): the
blocks' noises are independent.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

from distfit.mathematics.domain import Domain

EXACT_DOMAIN_LIMIT = 5_000_000  # cells: above it alpha is the sum bound (one float per cell is too much)


def alpha_is_exact(domain_size: int, flat_profiles: bool) -> bool:
    """Whether a plan's alpha is exact: its domain is evaluated cell by cell (at most
    ``EXACT_DOMAIN_LIMIT`` cells), or every block's profile is flat (closed-form blocks), so
    the stitched profile is flat and its maximum is the sum bound ``sum_b alpha_b`` itself."""
    return domain_size <= EXACT_DOMAIN_LIMIT or flat_profiles


class StitchedProfile:
    """``p(x) = sum_b p_b(x restricted to A_b)`` accumulated one block at a time, holding one
    float per full-domain cell whatever the number of blocks, never a list of block profiles
    (a streamed plan reads its blocks' profiles from the store one by one)."""

    def __init__(self, domain: Domain) -> None:
        self.domain = domain
        self.total = np.zeros(domain.shape)

    def add(self, attributes: Sequence[str], profile: np.ndarray) -> None:
        """Add a block's profile over the cells of the ``attributes`` marginal (row-major in
        domain order), broadcast over the other attributes."""
        shape = [self.domain.size_of(a) if a in attributes else 1 for a in self.domain.names]
        self.total += np.asarray(profile, dtype=float).reshape(shape)

    def values(self) -> np.ndarray:
        """The (d,) full-domain profile."""
        return self.total.ravel()

    def max(self) -> float:
        return float(self.total.max())


def stitched_profile(domain: Domain, blocks: Iterable[tuple[Sequence[str], np.ndarray]]) -> np.ndarray:
    """Sequential composition over the full domain: ``p(x) = sum_b p_b(x restricted to A_b)``.

    ``blocks`` holds ``(attributes, profile)`` with the profile over the cells of that
    attribute set's marginal (row-major in domain order). Returns the (d,) full-domain profile,
    by broadcasting (memory: one float per full-domain cell; ``StitchedProfile``).
    """
    total = StitchedProfile(domain)
    for attributes, profile in blocks:
        total.add(attributes, profile)
    return total.values()


def stitched_variances(num_queries: int, blocks: Iterable[tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """Per-query variances from ``(query_index, block_variances)`` pairs, added in order."""
    variances = np.zeros(num_queries)
    for query_index, block_variances in blocks:
        np.add.at(variances, query_index, block_variances)
    return variances
