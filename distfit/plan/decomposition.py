"""Which blocks a plan has: residual blocks, closed-form where they can be, the rest merged.

docs/design.md section 2 and ``planner`` step 1. ``decompose_lazily`` decides the blocks on
attribute sets and row counts alone (``residual.ResidualWorkload``, ``residual.merge_layout``)
and keeps the closed-form blocks as arrays (``closed_form.ClosedFormBlocks``); the solved
blocks' specs are built one at a time when needed (``Decomposition.specs``).
"""
from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np

from distfit.mathematics.domain import Domain
from distfit.plan.closed_form import ClosedFormBlocks
from distfit.plan.residual import (LOW_ORDER_SHARED, BlockLayout, BlockSpec, GroupLike, ResidualWorkload, merge_layout,
                                   widely_shared)

MERGE_MAX_ROWS = 1024  # basis rows a merged block may have: an SM-II step costs O(k^3)
MERGE_LOG_LINES = 50  # merge decisions written out one per line; the rest are counted
SMALL_SOLVED_WORK = 1e8  # ``block_work`` of all solved blocks below which mixed blocks are solved too


def block_work(blocks: Iterable[BlockSpec | BlockLayout]) -> float:
    """Flops of one joint block dual evaluation, about ``sum_S k^2 (k + d_b + m_b)``: the
    planner's measure of a block's work (solve order, task sizes, streaming). A block is a
    ``BlockSpec`` (its arrays' shapes) or anything with ``rows``, ``cells`` and ``queries``
    (``BlockLayout``, ``planner.BlockRef``)."""
    total = 0.0
    for block in blocks:
        k, d_b, m_b = _sizes(block)
        total += float(k) ** 2 * (k + d_b + m_b)
    return total


def _sizes(block: BlockSpec | BlockLayout) -> tuple[int, int, int]:
    """``(k, d_b, m_b)``: basis rows, cells and query rows of a spec (its arrays' shapes) or of
    anything with ``rows``, ``cells`` and ``queries``."""
    if isinstance(block, BlockSpec):
        return block.basis.shape[0], block.basis.shape[1], block.recon.shape[0]
    return block.rows, block.cells, block.queries


#: Solved rounds a plan held in memory keeps at once (``rounds.refine``: the best round, the
#: previous one, whose solutions start the next, and the one being solved).
HELD_ROUNDS = 3


def held_bytes(blocks: Iterable[BlockSpec | BlockLayout]) -> float:
    """Bytes of the blocks' arrays in the driver when a plan is held in memory
    (``planner.plan_blocks`` without a sink): each spec (basis k x d_b, recon m_b x k) and
    ``HELD_ROUNDS`` solutions of it (sigma k x k, basis, recon, profile and cell weights d_b,
    variances, targets and query weights m_b), 8 bytes a float:
    ``8 sum_S (k d_b + m_b k + HELD_ROUNDS (k^2 + k d_b + m_b k + 2 d_b + 3 m_b))``.
    What ``planner.should_stream`` compares with ``planner.STREAM_BYTES``."""
    total = 0.0
    for block in blocks:
        k, d_b, m_b = _sizes(block)
        spec = float(k) * d_b + float(m_b) * k
        total += 8.0 * (spec + HELD_ROUNDS * (float(k) ** 2 + spec + 2.0 * d_b + 3.0 * m_b))
    return total


@dataclass(frozen=True, eq=False)
class Decomposition:
    """The blocks a plan will have, as layouts (sizes, no arrays), and the workload their specs
    are built from one at a time (``specs()``), so the driver never holds every spec; the
    closed-form blocks (``closed_form``) are not layouts but arrays (``closed``)."""

    layouts: tuple[BlockLayout, ...]
    decisions: tuple[str, ...]
    workload: ResidualWorkload
    closed: ClosedFormBlocks | None = None

    def specs(self) -> Iterator[BlockSpec]:
        for layout in self.layouts:
            yield self.workload.build(layout)

    def block_attributes(self) -> list[tuple[str, ...]]:
        """The attributes of every block, solved and closed-form (the marginals a release reads)."""
        closed = [] if self.closed is None else self.closed.attribute_names(self.workload.domain.names)
        return [layout.attributes for layout in self.layouts] + closed


def decompose_lazily(domain: Domain, groups: Sequence[GroupLike], max_cells: int,
                     max_rows: int | None = MERGE_MAX_ROWS, closed_forms: bool = True) -> Decomposition:
    """Residual blocks, closed-form where they can be, the rest merged under ``max_cells`` and
    ``max_rows`` (``residual.merge_layout``), decided on attribute sets and row counts; a log of
    what was decided and why.

    A residual block whose rows all come from identity marginals with one target each has a
    closed-form optimum (``closed_form``). Such a block is never merged when every query group
    with rows in it has only closed-form blocks: on identity marginals the residual plan is
    already optimal (ResidualPlanner's theorem, docs/design.md section 2), while merging fixes each
    lower-order residual in one merged block and loses the free share of the targets (5.6-10.2%
    above the optimum measured). Blocks of a group with any other block (ranges, prefixes,
    per-query targets) merge as before, where correlating the noise can pay (the age pyramid:
    2.28x); a merge whose blocks would all be closed-form is undone.

    Closed-form blocks that share a query group with solved blocks are solved instead when the
    plan is small: when the work of every block outside the free set (``block_work``) is at
    most ``SMALL_SOLVED_WORK``. There the queries' target
    shares move with the solved blocks', so the symmetric shape is not the optimum, and the
    joint block dual (which cannot move the shares of closed-form rows) runs. PL94 at
    ``max_cells: 64`` (``bench_price_of_blocks.py``): 3.15001 with its six mixed blocks in closed
    form, 2.37988 solved, against the global optimum 2.36339. On large plans the closed forms
    keep SM-II off thousands of blocks."""
    workload = ResidualWorkload(domain, groups)
    closed = workload.closed_form_mask() if closed_forms else np.zeros(len(workload.subset_positions), dtype=bool)
    free_mask = workload.free_of_mixed(closed)
    rest = workload.names_of(np.flatnonzero(~free_mask))
    cliques = [tuple(group[1]) for group in groups] if rest else []
    if closed_forms and np.any(closed & ~free_mask):
        all_solved = workload.layouts(merge_layout(domain, rest, cliques, max_cells, max_rows))
        if block_work(all_solved) <= SMALL_SOLVED_WORK:
            closed = free_mask  # the mixed closed-form blocks are solved (docstring)
    free = np.flatnonzero(free_mask)
    undone: list[tuple[str, ...]] = []
    merged, unmerged = [], 0
    if rest:
        closed_rest = {subset for subset, c in zip(rest, closed[~free_mask]) if c}
        for attributes, members in merge_layout(domain, rest, cliques, max_cells, max_rows):
            if len(members) > 1 and all(member in closed_rest for member in members):
                undone.extend(members)  # every block closed-form: the residual plan is optimal
                unmerged += 1
            elif len(members) == 1 and members[0] in closed_rest:
                undone.append(members[0])
            else:
                merged.append((attributes, members))
    if undone:  # subset ids are in the blocks' order (size, then schema positions)
        free = np.sort(np.concatenate([free, workload.subset_ids(undone)]))
    layouts = workload.layouts(merged)
    decisions = [f"residual decomposition: {len(workload.subset_positions)} blocks from {len(groups)} query groups"]
    if free.size:
        decisions.append(
            f"closed form: {len(free)} blocks of identity marginals with one target each (Sigma_S proportional to "
            f"B_S B_S^T, optimal by symmetry): no SM-II, never merged (the residual plan is optimal there)"
            + (f"; {unmerged} merges of closed-form blocks only undone" if unmerged else ""))
    if layouts:
        # (worded as before closed forms existed: a plan with no closed-form block keeps its
        # decisions, hence its checksum, when its blocks are the same)
        decisions.append(f"merged under max_cells={max_cells}: {len(layouts)} blocks "
                         f"(largest {max(b.cells for b in layouts)} cells, {max(b.rows for b in layouts)} basis rows)")
        if free.size:
            joined = [b for b in layouts if len(b.members) > 1]
            for block in joined[:MERGE_LOG_LINES]:
                decisions.append(
                    f"merge {block.block_id}: {len(block.members)} residual blocks, {block.rows} basis rows: a query "
                    f"group with rows in it is not an identity marginal with one target (ranges, prefixes or "
                    f"per-query targets), where one SM-II block can correlate the noise; about "
                    f"{float(block.rows) ** 3:.3g} flops per Newton step")
            if len(joined) > MERGE_LOG_LINES:
                decisions.append(f"... and {len(joined) - MERGE_LOG_LINES} more merged blocks")
    moved = _moved_low_order(domain, rest, cliques, max_cells) if layouts else 0
    if moved:
        decisions.append(f"{moved} residual blocks of the total or one attribute, each in more than {LOW_ORDER_SHARED} "
                         f"query cliques, joined the smallest clique holding them, not the largest (their rows come "
                         f"from every query of those cliques' groups; in the largest they enlarge the largest block)")
    if max_rows is not None and rest:
        capped = _row_capped(domain, rest, cliques, max_cells, max_rows)
        if capped:
            decisions.append(f"max_rows={max_rows}: {capped} query cliques not merged, their residual blocks adding up to "
                             f"more basis rows (an SM-II step costs O(k^3))")
    return Decomposition(tuple(layouts), tuple(decisions), workload,
                         workload.closed_form_blocks(free) if free.size else None)


def _moved_low_order(domain: Domain, blocks: Sequence[tuple[str, ...]], cliques: Sequence[Sequence[str]],
                     max_cells: int) -> int:
    """How many ``blocks`` ``merge_layout`` sends to the smallest clique that holds them and fits
    (``residual.widely_shared``) where the largest would have been another."""
    distinct = {frozenset(c) for c in cliques}
    fitting = {c for c in distinct if math.prod(domain.size_of(a) for a in c) <= max_cells}
    count = 0
    for block in blocks:
        if widely_shared(block, distinct):
            sizes = {math.prod(domain.size_of(a) for a in c) for c in fitting if set(block) <= c}
            count += len(sizes) > 1
    return count


def _row_capped(domain: Domain, blocks: Sequence[tuple[str, ...]], cliques: Sequence[Sequence[str]],
                max_cells: int, max_rows: int) -> int:
    """How many query cliques within ``max_cells`` hold residual blocks of more than ``max_rows``
    rows in all (the cliques the row cap keeps from merging). Each clique looks up its own
    subsets (2^|clique|) among the blocks, or scans the blocks when they are fewer: linear in
    the cliques, not cliques x blocks."""
    rows = {frozenset(b): math.prod(domain.size_of(a) - 1 for a in b) for b in blocks}
    count = 0
    for clique in {frozenset(c) for c in cliques}:
        if math.prod(domain.size_of(a) for a in clique) > max_cells:
            continue
        if 1 << len(clique) <= len(rows):
            total = sum(rows.get(frozenset(subset), 0) for size in range(len(clique) + 1)
                        for subset in itertools.combinations(sorted(clique), size))
        else:
            total = sum(r for b, r in rows.items() if b <= clique)
        count += total > max_rows
    return count


def decompose(domain: Domain, groups: Sequence[GroupLike], max_cells: int) -> tuple[list[BlockSpec], list[str]]:
    """Residual blocks merged under ``max_cells``, every spec built (none closed-form: every
    block is solved), and a log of what was decided and why (``decompose_lazily`` builds them
    one at a time and keeps the closed-form blocks as arrays)."""
    decomposition = decompose_lazily(domain, groups, max_cells, closed_forms=False)
    return list(decomposition.specs()), list(decomposition.decisions)
