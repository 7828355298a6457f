"""Refinement rounds of a plan: solve every block for its share of the targets, allocate one
scale per block, share each query's target anew, and solve again (docs/design.md section 2; the
planner's step 3, ``planner`` module docstring).

How the rounds are scheduled is what makes a large plan fast or slow (Adult: 470 SM-II
blocks, ~250 solver-seconds per round at a 1e-4 gap): a round that another follows only sets
the next round's target shares, so its blocks are solved to ``SHAPING_GAP``; every later
round starts each block from its previous solution (``solver.solve.WarmStart``: the same
block, new shares); the kept round is always certified to ``BLOCK_GAP`` per block.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import numpy as np

from distfit.plan.allocate import ScaleAllocation, allocate_rows
from distfit.plan.closed_form import ClosedRows
from distfit.plan.composition import stitched_variances
from distfit.plan.residual import BlockSpec
from distfit.mathematics.scaling import scaled_noise
from distfit.runtime.threads import blas_limit

#: Certified gap of each block in a round that another round follows: its shapes only set the
#: next round's target shares (the kept plan is always solved to ``BLOCK_GAP``). Not looser:
#: the shares follow the block plans' variances, which are far from unique at a given alpha
#: (on Adult's blocks two plans 5e-4 apart in alpha differ by up to 25% of a target on some
#: queries), and at 1e-2 the refined plan of a 16-block test workload (tests/runtime/test_cluster.py's
#: faults spec) ended 1.4% higher in its sum bound than with 1e-4 shapes (1e-3: 0.05% lower).
SHAPING_GAP = 1e-3
#: The shaping gaps of a large plan (the planner's: one whose joint block dual is skipped for
#: its work, ``planner.COARSE_SHAPING_WORK``), where the shaping rounds' solves were most of its
#: time: round 0, round 1, and every later shaping round. Round 0 only has to say roughly how
#: each query's target splits between its blocks: at a 0.5 gap most blocks stop at the dual's
#: first recovered plans (Adult: 3.3 s instead of 46 s at 1e-3); each later round starts from
#: the last one's plans (warm) and its better shares. The 1.4% above concerns the joint dual's
#: start on a small plan; on Adult (470 SM-II blocks, no joint dual, two refinement rounds,
#: ``distfit plan`` wall time and alpha on 2 cores) the shaping gaps (1e-3, 1e-3) gave 107 s,
#: alpha 1.25224; (1e-2, 1e-2) 89.5 s, 1.25048; (0.5, 1e-2) 73.0 s, 1.24971; (0.5, 0.1)
#: 61-79 s over five runs (the final round's cost varies with the shares it is handed),
#: 1.2538-1.2540; (0.5, 0.2) 62.0 s, 1.26286; three rounds (0.5, 0.1, 3e-2) 75.6 s, 1.24647.
COARSE_SHAPING_GAPS = (0.5, 1e-1, 1e-2)
BLOCK_GAP = 1e-4  # certified gap of every block of the kept plan (``solve``'s default)


class BlockLike(Protocol):
    """A solved block as the rounds see it (``residual.BlockSpec`` or ``planner.BlockRef``)."""

    query_index: np.ndarray
    targets: np.ndarray


@dataclass(frozen=True, eq=False)
class Round:
    number: int
    allocation: ScaleAllocation
    results: list  # per block: BlockSolution (in memory) or _Shape (streamed); .alpha, .variances
    targets: list[np.ndarray]  # the target shares this round solved for
    gap: float = BLOCK_GAP  # the certified gap its blocks were solved to


def refine(
    blocks: Sequence[BlockSpec | BlockLike],
    targets: np.ndarray,
    run_round: Callable[[int, list[np.ndarray], float, Round | None], list],
    refine_rounds: int,
    max_rows: int,
    log: list[str],
    drop_round: Callable[[int], None] | None = None,
    closed: ClosedRows | None = None,
    shaping_gaps: Sequence[float] = (SHAPING_GAP,),
    block_gap: float = BLOCK_GAP,
) -> tuple[Round, int]:
    """Solve, allocate, and refine the target shares (module docstring, steps 2-3).

    ``run_round(number, block_targets, gap, previous)`` solves every block for its share to the
    certified ``gap`` (warm-started from the ``previous`` round's solutions when given: same
    blocks, new shares) and returns, in block order, objects with ``alpha`` and ``variances``.
    Every round that another follows is solved to its shaping gap (round r to
    ``shaping_gaps[min(r, len - 1)]``: ``SHAPING_GAP``, or ``COARSE_SHAPING_GAPS`` for a large
    plan; its shapes only set the next shares), the last to ``block_gap`` (``BLOCK_GAP`` unless
    a draft plan asks for a looser one, ``distfit plan --gap-tolerance``; no shaping round is
    then solved tighter than it); should a shaping round end up the best (refinement
    stopped early) with a block above ``block_gap``, its shares are solved once more to
    ``block_gap`` (warm-started; not counted as a round), so every kept block is certified to it. Returns the best round and how many rounds ran; ``drop_round`` is told
    about every round that is not (or no longer) the best.
    The closed-form blocks (``closed``) join every allocation (their scales follow the solved
    blocks' in ``allocation.scales``); their shapes do not depend on the shares, so no round
    re-solves them. ``max_rows``: the most rows (closed-form ones included) of a query with a solved row.
    """
    if refine_rounds and (not blocks or max_rows <= 1):
        log.append("no query spans two blocks: target shares are fixed, no refinement rounds" if blocks else
                   "every block has a closed form: target shares are fixed, no refinement rounds")
        refine_rounds = 0
    block_targets = [block.targets.copy() for block in blocks]
    previous_bound = np.inf
    best: Round | None = None
    previous: Round | None = None
    n = len(blocks)
    fixed_alphas = closed.closed.alpha if closed is not None else np.zeros(0)

    def solved_round(number: int, shares: list[np.ndarray], gap: float, start: Round | None) -> Round:
        results = run_round(number, shares, gap, start)
        rows = [b.query_index for b in blocks]
        cols = [np.full(b.query_index.size, i) for i, b in enumerate(blocks)]
        values = [np.asarray(r.variances, dtype=float) for r in results]
        if closed is not None:
            rows, cols, values = rows + [closed.query], cols + [closed.block + n], values + [closed.variance]
        with blas_limit():
            allocation = allocate_rows(
                np.concatenate([[r.alpha for r in results], fixed_alphas]), np.concatenate(rows + [np.zeros(0, np.int64)]),
                np.concatenate(cols + [np.zeros(0, np.int64)]), np.concatenate(values + [np.zeros(0)]), targets)
        log.append(
            f"round {number}: sum bound {allocation.alpha_bound:.6g} (allocation lower bound {allocation.lower_bound:.6g}; "
            f"blocks solved to a {gap:.0e} gap{', warm-started' if start is not None else ''})"
        )
        return Round(number, allocation, results, [t.copy() for t in shares], gap)

    for round_number in range(refine_rounds + 1):
        gap = block_gap if round_number == refine_rounds else max(shaping_gaps[min(round_number, len(shaping_gaps) - 1)],
                                                                  block_gap)
        this = solved_round(round_number, block_targets, gap, previous)
        allocation, results = this.allocation, this.results
        if best is None or allocation.alpha_bound < best.allocation.alpha_bound:
            if best is not None and drop_round is not None:
                drop_round(best.number)
            best = this
        elif drop_round is not None:
            drop_round(round_number)
        previous = this
        if allocation.alpha_bound > previous_bound * (1.0 - 1e-4):
            log.append(f"round {round_number}: less than 0.01% better; refinement stops")
            break
        previous_bound = allocation.alpha_bound
        if round_number == refine_rounds:
            break
        scaled = [scaled_noise(r.variances, k) for r, k in zip(results, allocation.scales)]
        totals = stitched_variances(targets.size, ((b.query_index, v) for b, v in zip(blocks, scaled)))
        if closed is not None:
            totals += closed.totals(allocation.scales[n:], targets.size)
        block_targets = [targets[b.query_index] * v / totals[b.query_index] for b, v in zip(blocks, scaled)]
    if best.gap > block_gap and any(r.alpha > r.lower_bound * (1.0 + block_gap) for r in best.results):
        number = round_number + 1  # a draft key of its own; the same shares, so not counted as a round
        log.append(f"round {number}: round {best.number}'s shares solved again to the {block_gap:.0e} block gap")
        tight = solved_round(number, best.targets, block_gap, best)
        if drop_round is not None:
            drop_round(best.number)
        best = tight
    return best, round_number + 1
