"""Refinement rounds (``distfit.plan.rounds``): shaping gaps, warm starts, the kept round's gap."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from distfit.plan.planner import COARSE_SHAPING_WORK, decompose_lazily, plan_blocks, shaping_gaps
from distfit.plan.rounds import BLOCK_GAP, COARSE_SHAPING_GAPS, SHAPING_GAP, refine
from tests.reference import mixed_marginal_workload


def _blocks():
    """Two blocks sharing query 1 (queries 0, 1 and 1, 2), targets 1."""
    return [SimpleNamespace(query_index=np.array([0, 1]), targets=np.ones(2)),
            SimpleNamespace(query_index=np.array([1, 2]), targets=np.ones(2))]


def _stub(alphas_by_round, calls):
    """A ``run_round`` that records (number, gap, warm-started from) and returns fixed shapes;
    a result is certified to exactly the gap it was asked for."""
    def run_round(number, shares, gap, previous):
        calls.append((number, gap, None if previous is None else previous.number))
        alpha = alphas_by_round[min(number, len(alphas_by_round) - 1)]
        return [SimpleNamespace(alpha=alpha, lower_bound=alpha / (1 + gap), variances=np.ones(2)) for _ in shares]
    return run_round


def test_rounds_that_another_follows_are_shaping_rounds_and_warm_start_the_next():
    calls, log = [], []
    best, rounds = refine(_blocks(), np.ones(3), _stub([2.0, 1.0, 0.5], calls), 2, 2, log)
    assert calls == [(0, SHAPING_GAP, None), (1, SHAPING_GAP, 0), (2, BLOCK_GAP, 1)]
    assert (best.number, best.gap, rounds) == (2, BLOCK_GAP, 3)
    assert any("warm-started" in line for line in log)


def test_a_large_plan_shapes_at_falling_coarse_gaps():
    """Round r is solved to ``shaping_gaps[min(r, len - 1)]``; the kept round to BLOCK_GAP. A
    plan whose joint block dual is skipped for its work gets the coarse schedule, a smaller
    one SHAPING_GAP in every shaping round."""
    calls = []
    best, rounds = refine(_blocks(), np.ones(3), _stub([4.0, 3.0, 2.0, 1.5, 1.0], calls), 4, 2, [],
                          shaping_gaps=(0.5, 0.1, 0.01))
    assert [gap for _, gap, _ in calls] == [0.5, 0.1, 0.01, 0.01, BLOCK_GAP]
    assert (best.number, best.gap, rounds) == (4, BLOCK_GAP, 5)
    assert shaping_gaps(COARSE_SHAPING_WORK) == (SHAPING_GAP,)
    assert shaping_gaps(2 * COARSE_SHAPING_WORK) == COARSE_SHAPING_GAPS
    assert COARSE_SHAPING_GAPS[0] > COARSE_SHAPING_GAPS[-1] >= SHAPING_GAP


def test_a_shaping_round_that_stays_best_is_solved_again_to_the_block_gap():
    """Round 1 does not help: round 0's shares are kept, re-solved to BLOCK_GAP from round 0
    (a draft number of its own, not counted as a round); round 1's drafts are dropped."""
    calls, log, dropped = [], [], []
    best, rounds = refine(_blocks(), np.ones(3), _stub([1.0, 1.5], calls), 1, 2, log, dropped.append)
    assert calls == [(0, SHAPING_GAP, None), (1, BLOCK_GAP, 0), (2, BLOCK_GAP, 0)]
    assert (best.number, best.gap, rounds) == (2, BLOCK_GAP, 2)
    assert dropped == [1, 0]
    assert all(r.alpha <= r.lower_bound * (1 + BLOCK_GAP) for r in best.results)


def test_without_refinement_the_only_round_is_solved_to_the_block_gap():
    calls = []
    best, rounds = refine(_blocks(), np.ones(3), _stub([1.0], calls), 0, 2, [])
    assert calls == [(0, BLOCK_GAP, None)] and rounds == 1


def test_a_draft_gap_looser_than_the_shaping_gaps_solves_every_round_to_it():
    """``block_gap`` (``distfit plan --gap-tolerance``) is the kept round's gap, and no shaping
    round is solved tighter than the plan it shapes."""
    calls = []
    best, rounds = refine(_blocks(), np.ones(3), _stub([4.0, 3.0, 2.0], calls), 2, 2, [],
                          shaping_gaps=(0.5, 0.1, 0.01), block_gap=0.2)
    assert [gap for _, gap, _ in calls] == [0.5, 0.2, 0.2]
    assert (best.number, best.gap, rounds) == (2, 0.2, 3)


def test_a_draft_plan_keeps_every_block_within_its_gap_and_meets_every_target():
    """A draft plan of the mixed workload at a 0.3 gap: every kept block certified to 0.3 (and
    not to the default 1e-4: the draft stops early) and every target met. Without refinement
    both plans solve each block for the same shares, so each draft block costs at least the
    default's certified lower bound and at most 1.3 times the default block's alpha."""
    domain, groups = mixed_marginal_workload()
    decomposition = decompose_lazily(domain, groups, 0)

    def planned(block_gap):
        return plan_blocks(domain, list(decomposition.specs()), decomposition.workload.targets(), refine_rounds=0,
                           co_optimize=False, closed=decomposition.closed, block_gap=block_gap)

    draft, default = planned(0.3), planned(BLOCK_GAP)
    gaps = np.array([b.solution.gap for b in draft.blocks])
    assert gaps.size and np.all(gaps <= 0.3) and gaps.max() > BLOCK_GAP
    assert np.all(draft.variances <= draft.targets * (1 + 1e-9))
    drafted = np.array([b.solution.alpha for b in draft.blocks])
    best = np.array([b.solution.alpha for b in default.blocks])
    bound = np.array([b.solution.lower_bound for b in default.blocks])
    assert np.all(drafted >= bound * (1 - 1e-9)) and np.all(drafted <= 1.3 * best * (1 + 1e-9))
    assert drafted.sum() > best.sum()


def test_every_kept_block_of_a_refined_plan_is_certified_to_the_block_gap():
    """Without the joint block dual (whose blocks carry no certificate of their own)."""
    domain, groups = mixed_marginal_workload()
    decomposition = decompose_lazily(domain, groups, 0)
    plan = plan_blocks(domain, list(decomposition.specs()), decomposition.workload.targets(), refine_rounds=2,
                       co_optimize=False, closed=decomposition.closed)
    assert plan.blocks and all(b.solution.gap <= BLOCK_GAP for b in plan.blocks)
    assert np.all(plan.variances <= plan.targets * (1 + 1e-9))
