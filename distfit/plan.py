"""Planning a marginal workload as blocks: decompose, solve each block, allocate, stitch.

DESIGN.md section 2. The planner is data-free and pure: it turns query groups on a domain into
block solutions and one privacy account. Where blocks are solved is the executor's business
(``serial_executor`` here, ``runtime.DaskExecutor`` on a cluster): an executor takes block
tasks and yields ``(index, BlockSolution)`` in any order, so results can stream.

1. ``blocks.residual_blocks`` splits every query group over the residual blocks of its
   clique's subsets; ``blocks.merge_blocks`` merges them while a block's marginal has at most
   ``max_cells`` cells (the knob that trades time for privacy; with no limit the plan is the
   single global SM-II solve).
2. Each block is solved with its share of the targets (at first, the queries' own targets).
3. ``blocks.allocate_scales`` picks one scale per block (the convex program of DESIGN.md
   section 2). Refinement rounds then re-solve every block with the share of each query's
   target that the allocation gave it (``c_j * s_S v_jS / sum_S' s_S' v_jS'``) and allocate
   again, until a round gains less than 0.01%; the best round is kept.
4. When the blocks are small enough for the driver (``CO_OPTIMIZE_WORK``), the joint block
   dual (``certificate.maximize_block_dual``) re-optimises all block covariances together:
   it chooses how each query's target is shared among its blocks, which per-block shapes
   followed by one scale per block cannot, and certifies a lower bound for block-diagonal
   plans of these blocks. Its plan replaces the allocation's when it is better.
5. Sequential composition across blocks (the same people meet every block): the stitched
   profile is ``p(x) = sum_S p_S(x_S) / s_S``; it is evaluated cell by cell when the domain has
   at most ``EXACT_DOMAIN_LIMIT`` cells (``alpha_exact``), else alpha is the sum bound
   ``sum_S alpha_S / s_S``. Disjoint units (geography) compose in parallel: every unit uses the
   same plan, so units cost nothing extra.
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Sequence

import numpy as np
from threadpoolctl import threadpool_limits

from .blocks import BlockSpec, GroupLike, allocate_scales, group_targets, merge_blocks, residual_blocks, stitched_profile
from .certificate import BlockDualResult, maximize_block_dual
from .privacy import privacy_account, privacy_profile
from .solver import BlockSolution, blas_threads, solve
from .workload import Domain

LOG = logging.getLogger("distfit.plan")
EXACT_DOMAIN_LIMIT = 5_000_000
CO_OPTIMIZE_WORK = 2e9  # flops of one joint dual evaluation above which the driver skips it


@dataclass(frozen=True, eq=False)
class BlockTask:
    """What a worker needs to solve one block: its spec and the targets it must meet."""

    index: int
    spec: BlockSpec
    targets: np.ndarray


def solve_block(task: BlockTask) -> BlockSolution:
    """A pure function of the task (picklable): the block's SM-II solve in its own basis."""
    return solve(task.spec.workload, task.targets, basis=task.spec.basis)


Executor = Callable[[Sequence[BlockTask]], Iterator[tuple[int, BlockSolution]]]


def serial_executor(tasks: Sequence[BlockTask]) -> Iterator[tuple[int, BlockSolution]]:
    """Solve the blocks one after another in this process."""
    for task in tasks:
        yield task.index, solve_block(task)


@dataclass(frozen=True, eq=False)
class PlannedBlock:
    """A block of the final plan: its solution is already scaled (``sigma * scale``)."""

    spec: BlockSpec
    solution: BlockSolution
    scale: float
    targets: np.ndarray  # the share of the query targets this block was solved for

    @property
    def sigma(self) -> np.ndarray:
        return self.solution.sigma * self.scale

    @property
    def variances(self) -> np.ndarray:
        return self.solution.variances * self.scale

    @property
    def profile(self) -> np.ndarray:
        return self.solution.profile / self.scale

    @property
    def alpha(self) -> float:
        return self.solution.alpha / self.scale


@dataclass(frozen=True, eq=False)
class PlanResult:
    """A stitched plan: blocks, per-query variances and the combined privacy account."""

    domain: Domain
    blocks: tuple[PlannedBlock, ...]
    targets: np.ndarray
    variances: np.ndarray
    alpha: float
    alpha_exact: bool
    alpha_sum_bound: float
    allocation_lower_bound: float
    composition: str
    decisions: tuple[str, ...]
    seconds: float
    rounds: int = field(default=1)
    variance_scale: float = field(default=1.0)  # k > 1 when a budget forces variances k * c

    @property
    def rho(self) -> float:
        return self.alpha / 2.0

    def account(self) -> dict:
        return privacy_account(self.alpha).to_dict()


def decompose(domain: Domain, groups: Sequence[GroupLike], max_cells: int) -> tuple[list[BlockSpec], list[str]]:
    """Residual blocks merged under ``max_cells``, and a log of what was decided and why."""
    residual = residual_blocks(domain, groups)
    cliques = [tuple(group[1]) for group in groups]
    merged = merge_blocks(domain, residual, cliques, max_cells)
    decisions = [
        f"residual decomposition: {len(residual)} blocks from {len(groups)} query groups",
        f"merged under max_cells={max_cells}: {len(merged)} blocks "
        f"(largest {max(b.basis.shape[1] for b in merged)} cells, {max(b.basis.shape[0] for b in merged)} basis rows)",
    ]
    return merged, decisions


def _stitched_variances(num_queries: int, blocks: Iterable[tuple[BlockSpec, np.ndarray]]) -> np.ndarray:
    variances = np.zeros(num_queries)
    for spec, block_variances in blocks:
        np.add.at(variances, spec.query_index, block_variances)
    return variances


def plan_blocks(
    domain: Domain,
    blocks: Sequence[BlockSpec],
    targets: np.ndarray,
    executor: Executor = serial_executor,
    refine_rounds: int = 1,
    decisions: Sequence[str] = (),
    progress: Callable[[int, int], None] | None = None,
    co_optimize: bool = True,
) -> PlanResult:
    """Solve, allocate and stitch ``blocks`` (module docstring, steps 2-5)."""
    start = time.perf_counter()
    targets = np.asarray(targets, dtype=float)
    log = list(decisions)
    block_targets = [spec.targets.copy() for spec in blocks]
    solutions: list[BlockSolution | None] = [None] * len(blocks)
    previous_bound = np.inf
    best = None
    rows_per_query = np.bincount(np.concatenate([spec.query_index for spec in blocks]), minlength=targets.size)
    if refine_rounds and rows_per_query.max() <= 1:
        log.append("no query spans two blocks: target shares are fixed, no refinement rounds")
        refine_rounds = 0
    work = sum(s.basis.shape[0] ** 2 * (s.basis.shape[0] + s.basis.shape[1] + s.recon.shape[0]) for s in blocks)
    joint_dual = co_optimize and rows_per_query.max() > 1 and work <= CO_OPTIMIZE_WORK
    for round_number in range(refine_rounds + 1):
        tasks = [BlockTask(i, spec, block_targets[i]) for i, spec in enumerate(blocks)]
        done = 0
        for index, solution in executor(tasks):
            solutions[index] = solution
            done += 1
            if progress is not None:
                progress(done, len(tasks))
        allocation = allocate_scales(
            [s.alpha for s in solutions], [(spec.query_index, s.variances) for spec, s in zip(blocks, solutions)], targets
        )
        log.append(
            f"round {round_number}: sum bound {allocation.alpha_bound:.6g} (allocation lower bound {allocation.lower_bound:.6g})"
        )
        if best is None or allocation.alpha_bound < best[0].alpha_bound:
            best = (allocation, list(solutions), [t.copy() for t in block_targets])
        if allocation.alpha_bound > previous_bound * (1.0 - 1e-4):
            log.append(f"round {round_number}: less than 0.01% better; refinement stops")
            break
        previous_bound = allocation.alpha_bound
        scaled = [s.variances * k for s, k in zip(solutions, allocation.scales)]
        totals = _stitched_variances(targets.size, zip(blocks, scaled))
        block_targets = [targets[spec.query_index] * v / totals[spec.query_index] for spec, v in zip(blocks, scaled)]
    allocation, solutions, block_targets = best
    planned = tuple(
        PlannedBlock(spec, solution, float(scale), share)
        for spec, solution, scale, share in zip(blocks, solutions, allocation.scales, block_targets)
    )
    lower_bound, sum_bound = allocation.lower_bound, allocation.alpha_bound
    if joint_dual:
        joint = _co_optimize(planned, targets)
        log.append(
            f"joint block dual: sum bound {joint.alpha_sum_bound:.6g} (certified >= {joint.lower_bound:.6g}) "
            f"after {joint.evaluations} evaluations, against {sum_bound:.6g} from per-block shapes"
        )
        if joint.alpha_sum_bound < sum_bound:
            planned = _replace_sigmas(planned, joint.sigmas, targets)
            sum_bound = joint.alpha_sum_bound
        lower_bound = joint.lower_bound
    elif co_optimize and rows_per_query.max() > 1:
        log.append(f"joint block dual skipped: about {work:.3g} flops per evaluation, over {CO_OPTIMIZE_WORK:.3g}")
    variances = _stitched_variances(targets.size, ((b.spec, b.variances) for b in planned))
    alpha_exact = domain.size <= EXACT_DOMAIN_LIMIT
    if alpha_exact:
        profile = stitched_profile(domain, [(b.spec.attributes, b.profile) for b in planned])
        alpha = float(profile.max())
        log.append(f"alpha {alpha:.6g} evaluated cell by cell over {domain.size} cells (sum bound {sum_bound:.6g})")
    else:
        alpha = sum_bound
        log.append(f"domain of {domain.size:.3g} cells is too large to evaluate; alpha is the sum bound {alpha:.6g}")
    for line in log:
        LOG.info(line)
    return PlanResult(
        domain=domain,
        blocks=planned,
        targets=targets,
        variances=variances,
        alpha=alpha,
        alpha_exact=alpha_exact,
        alpha_sum_bound=sum_bound,
        allocation_lower_bound=lower_bound,
        composition="sequential across blocks, parallel across units",
        decisions=tuple(log),
        seconds=time.perf_counter() - start,
        rounds=round_number + 1,
    )


def _co_optimize(planned: Sequence[PlannedBlock], targets: np.ndarray) -> BlockDualResult:
    with threadpool_limits(limits=blas_threads(), user_api="blas"):
        return maximize_block_dual(
            [b.solution.basis for b in planned],
            [b.solution.recon / np.sqrt(targets[b.spec.query_index])[:, None] for b in planned],
            [b.spec.query_index for b in planned],
            targets.size,
        )


def _replace_sigmas(planned: Sequence[PlannedBlock], sigmas: Sequence[np.ndarray], targets: np.ndarray) -> tuple[PlannedBlock, ...]:
    """Blocks carrying the jointly optimised covariances (scale 1); target shares follow them."""
    solutions = []
    for block, sigma in zip(planned, sigmas):
        profile = privacy_profile(sigma, block.solution.basis)
        variances = np.einsum("ij,jk,ik->i", block.solution.recon, sigma, block.solution.recon)
        stats = dataclasses.replace(block.solution.stats, stage="block-dual")
        solutions.append(dataclasses.replace(
            block.solution, sigma=sigma, profile=profile, variances=variances, alpha=float(profile.max()),
            lower_bound=0.0, gap=float("inf"), stats=stats,
        ))
    totals = _stitched_variances(targets.size, ((b.spec, s.variances) for b, s in zip(planned, solutions)))
    return tuple(
        PlannedBlock(b.spec, s, 1.0, targets[b.spec.query_index] * s.variances / totals[b.spec.query_index])
        for b, s in zip(planned, solutions)
    )


def plan_groups(
    domain: Domain,
    groups: Sequence[GroupLike],
    max_cells: int = 1024,
    executor: Executor = serial_executor,
    refine_rounds: int = 1,
) -> PlanResult:
    """Decompose ``groups`` on ``domain`` and plan the blocks (accuracy first)."""
    blocks, decisions = decompose(domain, groups, max_cells)
    return plan_blocks(domain, blocks, group_targets(domain, groups), executor, refine_rounds, decisions)
