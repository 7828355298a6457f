"""Multi-level runs: the same people measured at several geographic levels (docs/design.md section 2).

A multi-level spec (``levels:`` in the spec, pipelines/README.md) lists levels such as nation,
state and county, each with its own unit column and workload. Within a level, every unit is
answered with the same plan and units hold disjoint people: parallel composition, no extra cost.
Across levels the same person is seen once per level (in the one unit of that level that holds
them), so composition is sequential: with ``p_l`` the stitched privacy profile of level ``l``'s
plan over the full domain, a person in cell ``x`` has the combined profile

    p(x) = sum_l p_l(x),      alpha = max_x p(x) <= sum_l alpha_l,

exact when the domain is small enough to hold one float per cell
(:data:`distfit.plan.composition.EXACT_DOMAIN_LIMIT`), else the sum bound (stated in the account).

Accuracy first (each level meets its own targets with its smallest alpha_l) is the default.
With a budget ``alpha*`` for the whole run, every level's plan is scaled by the same factor
``k = alpha / alpha*`` (Problem 2, docs/design.md section 1: the profiles add, so the combined alpha
scales by exactly 1/k and every variance becomes k times its target), i.e. level ``l`` gets the
budget ``alpha_l / k`` (:func:`budget_shares`). One common factor is the optimum for fixed
per-level targets: it minimises the largest variance-to-target ratio ``k`` over all queries of
all levels.

This module is the mathematics of combining levels (pure functions over the levels' block
profiles); reading the profiles from a stored plan (:func:`distfit.plan.job.level_profiles`)
and scaling a stored plan to its share (:func:`distfit.plan.job.scale_plan_to_budget`) are
plan-store work, and the run itself (``distfit run`` on a multi-level spec) is
:func:`distfit.pipeline.run.run_levels`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from distfit.mathematics.domain import Domain
from distfit.plan.composition import EXACT_DOMAIN_LIMIT, stitched_profile
from distfit.mathematics.privacy import privacy_account

__all__ = ["LevelAccount", "budget_shares", "combine_levels"]


@dataclass(frozen=True)
class LevelAccount:
    """The privacy account of a multi-level run.

    ``levels``: level names in spec order; ``level_alphas``: each level plan's alpha;
    ``alpha``: the combined privacy cost (max over cells of the summed profiles when
    ``alpha_exact``, else the sum of the level alphas, an upper bound); ``rho = alpha / 2``;
    ``account``: :func:`distfit.mathematics.privacy.privacy_account` of ``alpha`` (JSON form).
    """

    levels: tuple[str, ...]
    level_alphas: tuple[float, ...]
    alpha: float
    alpha_exact: bool
    rho: float
    account: dict[str, Any]

    def to_dict(self) -> dict[str, Any]:
        return {
            "composition": "sequential across levels, parallel within a level",
            "levels": {name: alpha for name, alpha in zip(self.levels, self.level_alphas)},
            "alpha": self.alpha,
            "alpha_exact": self.alpha_exact,
            "alpha_sum_bound": float(sum(self.level_alphas)),
            "rho": self.rho,
            "account": self.account,
        }


def combine_levels(domain: Domain, levels: Sequence[tuple[str, float, Sequence[tuple[Sequence[str], np.ndarray]]]],
                   exact_limit: int | None = None) -> LevelAccount:
    """Sequential composition of level plans (module docstring).

    ``levels`` holds ``(name, alpha_l, blocks_l)`` with ``blocks_l`` the level plan's
    ``(attributes, profile)`` pairs (profiles over the block's marginal cells, as stored in a
    plan). When the domain has at most ``exact_limit`` cells (default
    :data:`distfit.plan.composition.EXACT_DOMAIN_LIMIT`) the summed full-domain profile is formed and
    its maximum is the exact alpha; otherwise alpha is the sum bound ``sum_l alpha_l``.
    """
    if not levels:
        raise ValueError("combine_levels: no levels")
    limit = EXACT_DOMAIN_LIMIT if exact_limit is None else exact_limit
    names = tuple(name for name, _, _ in levels)
    alphas = tuple(float(alpha) for _, alpha, _ in levels)
    if domain.size <= limit:
        profile = stitched_profile(domain, [pair for _, _, blocks in levels for pair in blocks])
        alpha, exact = float(profile.max()), True
    else:
        alpha, exact = float(sum(alphas)), False
    if not (math.isfinite(alpha) and alpha > 0):
        raise ValueError(f"combine_levels: combined alpha {alpha!r} is not finite and > 0")
    return LevelAccount(names, alphas, alpha, exact, alpha / 2.0, privacy_account(alpha).to_dict())


def budget_shares(level_alphas: Sequence[float], combined_alpha: float, budget_alpha: float) -> list[float]:
    """Per-level budgets ``alpha_l * budget_alpha / combined_alpha``: every level scaled by the
    same factor ``k = combined_alpha / budget_alpha``, so the combined cost is ``budget_alpha``
    (the summed profile scales by ``1/k``; a sum bound scales the same way)."""
    if not (math.isfinite(budget_alpha) and budget_alpha > 0):
        raise ValueError(f"budget alpha must be finite and > 0, got {budget_alpha!r}")
    factor = budget_alpha / combined_alpha
    return [float(alpha) * factor for alpha in level_alphas]

