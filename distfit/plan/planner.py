"""Planning a marginal workload as blocks: decompose, solve each block, allocate, stitch.

docs/design.md section 2. The planner is data-free and pure: it turns query groups on a domain into
block solutions and one privacy account. Where blocks are solved is the executor's business
(``serial_executor`` here, ``distfit.plan.cluster_executor.DaskExecutor`` on a cluster): an executor takes block
tasks and yields ``(index, BlockSolution)`` in any order, so results can stream.

1. ``residual.residual_blocks`` splits every query group over the residual blocks of its
   clique's subsets; ``residual.merge_blocks`` merges them while a block's marginal has at most
   ``max_cells`` cells (the knob that trades time for privacy; with no limit the plan is the
   single global SM-II solve). ``decompose_lazily`` decides the same blocks on attribute sets
   and row counts alone and builds each spec when it is needed (``Decomposition.specs``).
2. Each block is solved with its share of the targets (at first, the queries' own targets).
3. ``allocate.allocate_scales`` picks one scale per block (the convex program of docs/design.md
   section 2). Refinement rounds then re-solve every block with the share of each query's
   target that the allocation gave it (``c_j * s_S v_jS / sum_S' s_S' v_jS'``) and allocate
   again, until a round gains less than 0.01%; the best round is kept (``rounds.refine``: a
   round another follows is solved to a looser gap, later rounds are warm-started from the
   previous one, and every kept block is certified to ``BLOCK_GAP``).
4. When the blocks are small enough for the driver (``CO_OPTIMIZE_WORK``), the joint block
   dual (``solver.dual.maximize_block_dual``) re-optimises all block covariances together:
   it chooses how each query's target is shared among its blocks, which per-block shapes
   followed by one scale per block cannot, and certifies a lower bound for block-diagonal
   plans of these blocks. Its plan replaces the allocation's when it is better. Its evaluations
   are capped by total work (``joint_dual_evaluations``), and it is skipped where that cap is
   under ``JOINT_DUAL_USEFUL_EVALUATIONS`` (Adult's 470 blocks: it would get 27).
5. Sequential composition across blocks (the same people meet every block, ``composition``):
   the stitched profile is ``p(x) = sum_S p_S(x_S) / s_S`` (a block at scale s_S:
   ``distfit.mathematics.scaling``); it is evaluated cell by cell when the domain has at most
   ``composition.EXACT_DOMAIN_LIMIT`` cells (``alpha_exact``), else alpha is the sum bound
   ``sum_S alpha_S / s_S``. Disjoint units (geography) compose in parallel: every unit uses the
   same plan, so units cost nothing extra.

Plans that fit in memory are held there; larger plans stream. ``plan_blocks`` keeps every
block's spec and solutions in the driver (the joint block dual needs them all). A plan whose
held arrays would exceed ``STREAM_BYTES`` (``decomposition.held_bytes``; ``should_stream``)
goes through ``plan_streamed`` instead, which keeps the blocks in a
``BlockSink`` (``job.StoreSink``: the staging plan store): the block specs are spilled
there before the solves and read back one task at a time; each result is written there as it
completes (its basis, recon, sigma before scaling, ...), and the driver keeps only what the
allocation needs, O(m_b) per block (``BlockRef``: query indices and target shares;
``_Shape``: alpha_S, lower bound, v_jS). Refinement rounds work the same way (each round's
solutions are drafts; the rounds that are not the best are discarded), alpha is accumulated
block by block from the stored profiles (``composition.stitched_profile`` fed one block at a
time), and ``write_streamed_blocks`` then scales each block in place, one at a time. Both are
one loop (``plan_blocks``) on two block keepers (``_MemoryBlocks``, ``_SinkBlocks``): the same
arithmetic in the same order, so the same plan (but for the joint dual: in memory only).
"""
from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, Protocol, Sequence

import numpy as np

from distfit.mathematics.domain import Domain
from distfit.mathematics.packing import QueryRuns
from distfit.plan.closed_form import ClosedFormBlocks, ClosedRows
from distfit.plan.composition import EXACT_DOMAIN_LIMIT, alpha_is_exact, stitched_profile, stitched_variances
from distfit.plan.decomposition import block_work, decompose, decompose_lazily, held_bytes  # noqa: F401 (re-exported: step 1)
from distfit.plan.residual import BlockLayout, BlockSpec, GroupLike
from distfit.plan.rounds import BLOCK_GAP, COARSE_SHAPING_GAPS, SHAPING_GAP, Round, refine
from distfit.mathematics.privacy import privacy_account, privacy_profile
from distfit.mathematics.scaling import scale_block, scaled_cost, scaled_noise
from distfit.mathematics.bounds import JOINT_BLOCK_DUAL, SCALE_ALLOCATION, certified_bound
from distfit.solver.dual import BlockDualResult, maximize_block_dual
from distfit.solver.solve import BlockSolution, WarmStart, solve
from distfit.runtime.threads import blas_limit

LOG = logging.getLogger("distfit.plan.planner")
JOINT_DUAL_BUDGET = 3e10  # flops the joint block dual may spend in all: evaluations <= budget / work
JOINT_DUAL_MIN_EVALUATIONS = 20
# Fewer evaluations than this never beat the per-block shapes (Adult, 27 evaluations: 1.66961
# against 1.25316, 30-45 s after the last round); small plans converge in 50-100.
JOINT_DUAL_USEFUL_EVALUATIONS = 100
CO_OPTIMIZE_WORK = JOINT_DUAL_BUDGET / JOINT_DUAL_USEFUL_EVALUATIONS  # flops of one joint dual evaluation above which it is skipped
#: Plans above this work shape their target shares at ``rounds.COARSE_SHAPING_GAPS``
#: (:func:`shaping_gaps`): those whose joint block dual is skipped for its work.
COARSE_SHAPING_WORK = CO_OPTIMIZE_WORK
#: Plans whose blocks would hold more bytes than this in the driver (``decomposition.held_bytes``)
#: are streamed through the plan store. (It was 2e9 flops of joint-dual work: marginals.yaml,
#: 2.4e9 flops in ~0.5 GB, wrote and read every round's drafts through the store, ~80 of its
#: ~300 CPU-s, and represented every block again each round; benchmarks/README.md, session 17.)
STREAM_BYTES = float(1 << 30)


@dataclass(frozen=True, eq=False)
class BlockTask:
    """What a worker needs to solve one block: its spec and the targets it must meet."""

    index: int
    spec: BlockSpec
    targets: np.ndarray
    gap_tolerance: float = BLOCK_GAP
    warm_start: WarmStart | None = None  # the block's solution in the previous round, if any


def solve_block(task: BlockTask) -> BlockSolution:
    """A pure function of the task (picklable): the block's SM-II solve in its own basis, with one
    BLAS thread wherever it runs (``blas_limit``: the workload ``recon @ basis`` is formed here)."""
    with blas_limit():
        return solve(task.spec.workload, task.targets, basis=task.spec.basis, gap_tolerance=task.gap_tolerance,
                     max_gap=max(10.0 * task.gap_tolerance, 1e-3), warm_start=task.warm_start)


Executor = Callable[[Iterable[BlockTask]], Iterator[tuple[int, BlockSolution]]]
"""Takes block tasks (a sequence, or a lazy iterable that a streamed plan fills one spec at a
time: read it once, in order) and yields ``(task.index, solution)`` in any order."""


def serial_executor(tasks: Iterable[BlockTask]) -> Iterator[tuple[int, BlockSolution]]:
    """Solve the blocks one after another in this process."""
    for task in tasks:
        yield task.index, solve_block(task)


@dataclass(frozen=True, eq=False)
class PlannedBlock:
    """A block of the final plan: its (unscaled) solution at noise scale ``scale``; the
    properties are the scaled quantities (``distfit.mathematics.scaling``: ``sigma * scale``, ...)."""

    spec: BlockSpec
    solution: BlockSolution
    scale: float
    targets: np.ndarray  # the share of the query targets this block was solved for

    @property
    def sigma(self) -> np.ndarray:
        return scaled_noise(self.solution.sigma, self.scale)

    @property
    def variances(self) -> np.ndarray:
        return scaled_noise(self.solution.variances, self.scale)

    @property
    def profile(self) -> np.ndarray:
        return scaled_cost(self.solution.profile, self.scale)

    @property
    def alpha(self) -> float:
        return scaled_cost(self.solution.alpha, self.scale)

    @property
    def lower_bound(self) -> float:
        return scaled_cost(self.solution.lower_bound, self.scale)


@dataclass(frozen=True, eq=False)
class BlockRef:
    """What a streamed plan keeps of a block in the driver, O(m_b): its id, attributes, query
    rows and own targets, and its sizes; basis and recon stay in the ``BlockSink``."""

    block_id: str
    attributes: tuple[str, ...]
    query_index: np.ndarray
    targets: np.ndarray
    rows: int  # k: basis rows
    cells: int  # d_b: cells of the block's marginal

    @classmethod
    def of(cls, spec: BlockSpec) -> BlockRef:
        return cls(spec.block_id, tuple(spec.attributes), spec.query_index, spec.targets,
                   int(spec.basis.shape[0]), int(spec.basis.shape[1]))

    @property
    def queries(self) -> int:
        return int(self.query_index.size)


@dataclass(frozen=True)
class _Shape:
    """A block solution as the allocation sees it (unscaled): alpha_S, its lower bound, v_jS."""

    alpha: float
    lower_bound: float
    variances: np.ndarray


@dataclass(frozen=True, eq=False)
class StreamedBlock:
    """A block of a streamed plan: its solution is a draft in the sink (refinement round
    ``round``), not in memory; ``scale`` is applied when the draft becomes the stored block."""

    ref: BlockRef
    round: int
    solution_alpha: float
    solution_lower_bound: float
    scale: float
    targets: np.ndarray  # the share of the query targets this block was solved for

    @property
    def block_id(self) -> str:
        return self.ref.block_id

    @property
    def attributes(self) -> tuple[str, ...]:
        return self.ref.attributes

    @property
    def alpha(self) -> float:
        return scaled_cost(self.solution_alpha, self.scale)

    @property
    def lower_bound(self) -> float:
        return scaled_cost(self.solution_lower_bound, self.scale)


class BlockSink(Protocol):
    """Where a streamed plan keeps its blocks (``job.StoreSink``: the staging plan store)."""

    def save_spec(self, spec: BlockSpec) -> BlockRef:
        """Keep the spec's arrays; the returned ref is all the driver holds of it."""

    def load_spec(self, ref: BlockRef) -> BlockSpec:
        """The spec saved for ``ref``."""

    def save_solution(self, round_number: int, ref: BlockRef, solution: BlockSolution, targets: np.ndarray) -> None:
        """Keep a block's (unscaled) solution of refinement round ``round_number`` as a draft."""

    def drop_round(self, round_number: int) -> None:
        """Forget every draft of a round that will not be used."""

    def load_arrays(self, round_number: int, ref: BlockRef, names: Sequence[str]) -> dict[str, np.ndarray]:
        """Arrays (``sigma``, ``variances``, ``profile``, ...) of a draft."""

    def promote(self, round_number: int, ref: BlockRef, replace: dict[str, np.ndarray], alpha: float, lower_bound: float) -> None:
        """Make a draft the plan's block, with the arrays in ``replace`` and the scaled attrs."""


@dataclass(frozen=True, eq=False)
class PlanResult:
    """A stitched plan: blocks, per-query targets and variances (as runs, ``distfit.mathematics.packing.QueryRuns``:
    161.7M queries of identity marginals are 166,751 runs) and the combined privacy account."""

    domain: Domain
    blocks: tuple[PlannedBlock | StreamedBlock, ...]  # StreamedBlock when ``streamed``
    target_runs: QueryRuns  # every query's target, as runs (one per marginal of identity marginals)
    variance_runs: QueryRuns  # every query's variance, as runs
    alpha: float
    alpha_exact: bool
    alpha_sum_bound: float
    allocation_lower_bound: float
    composition: str
    decisions: tuple[str, ...]
    seconds: float
    rounds: int = field(default=1)
    variance_scale: float = field(default=1.0)  # k > 1 when a budget forces variances k * c
    streamed: bool = field(default=False)  # blocks are drafts in a BlockSink (write_streamed_blocks)
    lower_bound_method: str = field(default=SCALE_ALLOCATION)  # or JOINT_BLOCK_DUAL: what allocation_lower_bound bounds
    closed: ClosedFormBlocks | None = field(default=None)  # closed-form blocks (not in ``blocks``)
    closed_scales: np.ndarray | None = field(default=None)  # their scales s_S (Sigma = s_S sigma_S B B^T)
    #: The dual point that proves ``allocation_lower_bound`` (JSON: stored with the plan, re-evaluated
    #: by ``distfit audit``; scale-free): the constraint ``queries`` and their ``weights`` on the
    #: simplex, and for the joint block dual each block's ``cell_weights`` (block id -> weights).
    bound_certificate: dict | None = field(default=None)

    @property
    def targets(self) -> np.ndarray:
        """(m,) every query's target (``target_runs`` expanded: a new array on every call)."""
        return self.target_runs.expand()

    @property
    def variances(self) -> np.ndarray:
        """(m,) every query's variance (``variance_runs`` expanded: a new array on every call)."""
        return self.variance_runs.expand()

    @property
    def max_variance_ratio(self) -> float:
        """The largest variance/target over the queries, run by run (0 for no queries)."""
        _, variances, targets = self.variance_runs.aligned(self.target_runs)
        return float(np.max(variances / targets, initial=0.0))

    @property
    def num_blocks(self) -> int:
        """Blocks of the plan: ``blocks`` (solved) and the closed-form ones."""
        return len(self.blocks) + (0 if self.closed is None else len(self.closed))

    @property
    def rho(self) -> float:
        return self.alpha / 2.0

    @property
    def alpha_kind(self) -> str:
        """How alpha was found, in words (``_composed_plan``): exact cell by cell, exact as the
        sum of flat closed-form profiles, or the sum bound."""
        if self.alpha_exact and self.domain.size <= EXACT_DOMAIN_LIMIT:
            return "exact (evaluated cell by cell)"
        if self.alpha_exact:
            return "exact (closed-form blocks: flat profiles, so the sum over blocks)"
        return "sum bound over blocks"

    def account(self) -> dict:
        return privacy_account(self.alpha).to_dict()


def solve_order(blocks: Sequence[BlockSpec | BlockRef | BlockLayout]) -> list[int]:
    """Block indices, most work first (``block_work`` of each block; ties in block order).

    Largest-first is the classic longest-processing-time rule: on N workers the last block to
    finish starts early, so the round's tail is short (a big block submitted last would leave
    the other workers idle while it runs). Results are collected by index, so the plan does
    not depend on the order."""
    work = [block_work([block]) for block in blocks]
    return sorted(range(len(blocks)), key=lambda i: -work[i])


#: A block solve's time as ``SOLVE_OVERHEAD_S + SECONDS_PER_WORK * block_work`` (Adult, one
#: core: the 3-way blocks with k = 210 take ~3 s at work 3.5e7; a 1 x 4 block ~3 ms).
SOLVE_OVERHEAD_S = 3e-3
SECONDS_PER_WORK = 1e-7
BATCH_SECONDS = 0.1  # the least estimated work of one cluster task (issue 10: Dask costs 10-15 ms per task)


def estimated_seconds(block: BlockSpec | BlockRef | BlockLayout) -> float:
    """Rough single-core seconds of one block solve (``SOLVE_OVERHEAD_S``, ``SECONDS_PER_WORK``)."""
    return SOLVE_OVERHEAD_S + SECONDS_PER_WORK * block_work([block])


def batched(tasks: Iterable[BlockTask], min_seconds: float = BATCH_SECONDS) -> Iterator[list[BlockTask]]:
    """Tasks in the order given, grouped into runs of at least ``min_seconds`` of estimated
    work (``estimated_seconds``); a task that alone reaches it is a batch of its own. In
    ``solve_order`` (most work first) the large SM-II blocks go out one per task, longest
    first, and the small ones share tasks at the end. Reads ``tasks`` lazily, one batch ahead."""
    batch: list[BlockTask] = []
    seconds = 0.0
    for task in tasks:
        batch.append(task)
        seconds += estimated_seconds(task.spec)
        if seconds >= min_seconds:
            yield batch
            batch, seconds = [], 0.0
    if batch:
        yield batch


def solve_blocks(tasks: Sequence[BlockTask]) -> list[tuple[int, BlockSolution]]:
    """``solve_block`` for each task of a batch (``batched``): one cluster task, many blocks."""
    return [(task.index, solve_block(task)) for task in tasks]


def shaping_gaps(work: float) -> tuple[float, ...]:
    """The certified gaps of the shaping rounds (``rounds.refine``) of a plan of ``work``
    (``block_work``): ``rounds.COARSE_SHAPING_GAPS`` above ``COARSE_SHAPING_WORK``, where the
    joint block dual is skipped for its work (no joint dual starts from the shapes, and the
    shaping solves were most of the plan's time), else ``rounds.SHAPING_GAP``."""
    return (SHAPING_GAP,) if work <= COARSE_SHAPING_WORK else COARSE_SHAPING_GAPS


def should_stream(blocks: Sequence[BlockSpec | BlockRef | BlockLayout]) -> bool:
    """Stream the plan through the store (``plan_streamed``) rather than hold it in memory:
    when its blocks' arrays would take more than ``STREAM_BYTES`` in the driver (``held_bytes``)."""
    return held_bytes(blocks) > STREAM_BYTES


def _solved_queries(blocks: Sequence[BlockSpec | BlockRef]) -> tuple[np.ndarray, np.ndarray]:
    """The queries with a row in a solved block (sorted) and how many rows each has: arrays
    the size of the solved rows, never of the workload (162M queries at 100 attributes, 3-way)."""
    return np.unique(np.concatenate([b.query_index for b in blocks] + [np.zeros(0, np.int64)]), return_counts=True)


def _collect(results: Iterable[tuple[int, BlockSolution]], total: int, keep: Callable[[int, BlockSolution], object],
             progress: Callable[[int, int], None] | None) -> list:
    """``keep(index, solution)`` for every result as it arrives, in block order. ``progress``
    hears ``(0, total)`` when a round starts (so a meter can restart its clock: a refinement
    round's rate must not count the rounds before it), then ``(done, total)``."""
    kept: list = [None] * total
    done = 0
    if progress is not None:
        progress(0, total)
    for index, solution in results:
        kept[index] = keep(index, solution)
        done += 1
        if progress is not None:
            progress(done, total)
    return kept


def _closed_parts(closed: ClosedFormBlocks | None, blocks: Sequence[BlockSpec | BlockRef],
                  targets: QueryRuns) -> tuple[ClosedRows | None, int, bool]:
    """The closed-form blocks' allocation rows; the most rows (solved and closed-form) of a query
    with a solved row; whether such a query also has a closed-form row."""
    solved, counts = _solved_queries(blocks)
    if closed is None or not len(closed):
        return None, int(counts.max(initial=0)), False
    rows = ClosedRows.of(closed, solved, targets.size)
    at = np.minimum(np.searchsorted(solved, rows.query), max(solved.size - 1, 0))
    hit = (solved[at] == rows.query) if solved.size else np.zeros(rows.query.size, dtype=bool)
    counts = counts + np.bincount(at[hit], minlength=solved.size)
    return rows, int(counts.max(initial=0)), bool(hit.any())


def _with_closed(solved: Iterable[tuple[np.ndarray, np.ndarray]], closed: ClosedRows | None, scales: np.ndarray,
                 num_queries: int) -> QueryRuns:
    """Per-query variances as runs: the solved blocks' ``(query_index, variances)`` plus the
    closed-form rows at ``scales`` (``ClosedRows.variances``)."""
    if closed is None:
        return QueryRuns.encode(stitched_variances(num_queries, solved))
    return closed.variances(solved, scales)


class _MemoryBlocks:
    """How ``plan_blocks`` keeps the blocks of a plan small enough to hold: specs and solutions in
    the driver, so the final blocks are ``PlannedBlock`` and the joint block dual can re-optimise
    them. One of the two block keepers the planner's single loop runs on (``_SinkBlocks``)."""

    streamed = False
    evaluated_from = ""
    drop_round = None  # every round's solutions are plain objects: nothing to discard

    def __init__(self, specs: Sequence[BlockSpec]) -> None:
        self.specs = specs

    def task(self, index: int, share: np.ndarray, gap: float, previous: Round | None) -> BlockTask:
        """Block ``index``'s task, warm-started from its solution in the ``previous`` round."""
        warm = None if previous is None else WarmStart.of(previous.results[index])
        return BlockTask(index, self.specs[index], share, gap, warm)

    def keep(self, number: int, index: int, solution: BlockSolution, share: np.ndarray) -> BlockSolution:
        """What a round keeps of a solution: all of it."""
        return solution

    def planned(self, best: Round) -> tuple[PlannedBlock, ...]:
        """The plan's blocks: the best round's solutions at the allocation's scales."""
        return tuple(PlannedBlock(spec, solution, float(scale), share)
                     for spec, solution, scale, share in zip(self.specs, best.results, best.allocation.scales, best.targets))

    @staticmethod
    def variances(planned: Sequence[PlannedBlock], best: Round) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(query_index, scaled variances)`` of every block (of ``planned``: the joint dual may have replaced them)."""
        return ((b.spec.query_index, b.variances) for b in planned)

    @staticmethod
    def profiles(planned: Sequence[PlannedBlock]) -> Iterator[tuple[Sequence[str], np.ndarray]]:
        """``(attributes, scaled profile)`` of every block, one at a time."""
        return ((b.spec.attributes, b.profile) for b in planned)


class _SinkBlocks:
    """How a streamed plan keeps its blocks (module docstring): specs and solutions live in the
    ``sink``, the driver keeps a ``BlockRef`` and a ``_Shape`` per block (O(m_b)) and reads a
    block's arrays back one block at a time when it needs them; the final blocks are ``StreamedBlock`` drafts."""

    streamed = True
    evaluated_from = ", block by block from the store"

    def __init__(self, refs: Sequence[BlockRef], sink: BlockSink) -> None:
        self.refs = refs
        self.sink = sink
        self.drop_round = sink.drop_round

    def task(self, index: int, share: np.ndarray, gap: float, previous: Round | None) -> BlockTask:
        """Block ``index``'s task: its spec read back from the sink, warm-started from its draft of the ``previous`` round."""
        spec = self.sink.load_spec(self.refs[index])
        warm = None
        if previous is not None:
            arrays = self.sink.load_arrays(previous.number, self.refs[index], ("sigma", "cell_weights", "query_weights"))
            warm = WarmStart(arrays["sigma"], arrays["cell_weights"], arrays["query_weights"])
        return BlockTask(index, spec, share, gap, warm)

    def keep(self, number: int, index: int, solution: BlockSolution, share: np.ndarray) -> _Shape:
        """Save the solution as round ``number``'s draft; keep what the allocation needs."""
        self.sink.save_solution(number, self.refs[index], solution, share)
        # a copy: a result from a worker can be a view into its whole message (basis, recon, sigma)
        return _Shape(float(solution.alpha), float(solution.lower_bound), np.array(solution.variances, dtype=float))

    def planned(self, best: Round) -> tuple[StreamedBlock, ...]:
        """The plan's blocks: the best round's drafts, with the allocation's scales to apply."""
        return tuple(StreamedBlock(ref, best.number, shape.alpha, shape.lower_bound, float(scale), share)
                     for ref, shape, scale, share in zip(self.refs, best.results, best.allocation.scales, best.targets))

    @staticmethod
    def variances(planned: Sequence[StreamedBlock], best: Round) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """``(query_index, scaled variances)`` of every block, from the shapes the driver kept."""
        return ((b.ref.query_index, scaled_noise(shape.variances, b.scale)) for b, shape in zip(planned, best.results))

    def profiles(self, planned: Sequence[StreamedBlock]) -> Iterator[tuple[Sequence[str], np.ndarray]]:
        """``(attributes, scaled profile)`` of every block, each read from its draft when it is reached."""
        for block in planned:
            yield block.attributes, scaled_cost(self.sink.load_arrays(block.round, block.ref, ("profile",))["profile"], block.scale)


def _joint_dual_skipped(work: float, shared: bool, streamed: bool) -> str | None:
    """Why the joint block dual is not run on a plan with a query in two or more solved blocks
    (``None``: it runs). In memory: a query of a solved block also has closed-form rows, whose
    shares it cannot move, or one evaluation is over ``CO_OPTIMIZE_WORK``; a streamed plan never
    runs it (its blocks are not in memory), and says which of its work or the streaming stops it."""
    if shared and not streamed:
        return "queries of solved blocks also have closed-form rows, whose shares it cannot move"
    if work > CO_OPTIMIZE_WORK:
        return (f"about {work:.3g} flops per evaluation, over {CO_OPTIMIZE_WORK:.3g} "
                f"(under {JOINT_DUAL_USEFUL_EVALUATIONS} evaluations in its budget)")
    if streamed:
        return "the plan is streamed, and the joint dual needs every block in memory"
    return None


def plan_blocks(
    domain: Domain,
    blocks: Sequence[BlockSpec] | Sequence[BlockRef],
    targets: np.ndarray | QueryRuns,
    executor: Executor = serial_executor,
    refine_rounds: int = 1,
    decisions: Sequence[str] = (),
    progress: Callable[[int, int], None] | None = None,
    co_optimize: bool = True,
    closed: ClosedFormBlocks | None = None,
    sink: BlockSink | None = None,
    block_gap: float = BLOCK_GAP,
) -> PlanResult:
    """Solve, allocate and stitch ``blocks`` (module docstring, steps 2-5); the closed-form blocks
    ``closed`` join the allocation and the composition without a solve. ``block_gap``: the
    certified gap of every kept block (``rounds.refine``; looser for a draft plan). Without ``sink`` the
    blocks are specs, held in memory with their solutions (``_MemoryBlocks``); with one they are
    refs of specs saved there and the plan streams through it (``plan_streamed``, ``_SinkBlocks``).
    Both run this one loop: same tasks, allocation and composition, in the same order."""
    start = time.perf_counter()
    targets = QueryRuns.of(targets)  # runs: never a vector the size of the workload
    log = list(decisions)
    keeper = _MemoryBlocks(blocks) if sink is None else _SinkBlocks(blocks, sink)
    solved_rows = _solved_queries(blocks)[1]
    closed_rows, max_rows, shared = _closed_parts(closed, blocks, targets)
    work = block_work(blocks)
    spans = co_optimize and bool(blocks) and solved_rows.max(initial=0) > 1
    skipped = _joint_dual_skipped(work, shared, keeper.streamed) if spans else None
    joint_dual = spans and skipped is None
    if keeper.streamed:
        log.append(
            f"streamed: {len(blocks)} blocks go to the plan store as they complete and are scaled there one at a time "
            f"(about {held_bytes(blocks):.3g} bytes held in memory otherwise, stream limit {STREAM_BYTES:.3g})"
        )

    def run_round(number: int, block_targets: list[np.ndarray], gap: float, previous: Round | None) -> list:
        # a lazy iterable: a streamed plan reads each spec back only when its task is submitted
        tasks = (keeper.task(i, block_targets[i], gap, previous) for i in solve_order(blocks))
        return _collect(executor(tasks), len(blocks),
                        lambda index, solution: keeper.keep(number, index, solution, block_targets[index]), progress)

    best, rounds = refine(blocks, targets, run_round, refine_rounds, max_rows, log, keeper.drop_round,
                          closed=closed_rows, shaping_gaps=shaping_gaps(work), block_gap=block_gap)
    allocation = best.allocation
    planned = keeper.planned(best)
    closed_scales = allocation.scales[len(blocks):]
    lower_bound, sum_bound = allocation.lower_bound, allocation.alpha_bound
    certificate = {"queries": allocation.certificate_queries.tolist(), "weights": allocation.certificate_weights.tolist()}
    if joint_dual:
        joint = _co_optimize(planned, targets)
        joint_bound, certificate = _joint_certificate(planned, joint, targets)
        joint = dataclasses.replace(joint, lower_bound=joint_bound)
        log.append(
            f"joint block dual: sum bound {joint.alpha_sum_bound:.6g} (certified >= {joint.lower_bound:.6g}) "
            f"after {joint.evaluations} evaluations, against {sum_bound:.6g} from per-block shapes"
        )
        if joint.alpha_sum_bound < sum_bound:
            planned = _replace_sigmas(planned, joint.sigmas, targets)
            sum_bound = joint.alpha_sum_bound + _closed_sum(closed, closed_scales)
        lower_bound = joint.lower_bound + _closed_sum(closed, closed_scales)
    elif skipped is not None:
        log.append(f"joint block dual skipped: {skipped}")
    variances = _with_closed(keeper.variances(planned, best), closed_rows, closed_scales, targets.size)
    plan = _composed_plan(domain, keeper, planned, targets, variances, sum_bound, lower_bound,
                          JOINT_BLOCK_DUAL if joint_dual else SCALE_ALLOCATION, log, start, rounds, closed, closed_scales)
    return dataclasses.replace(plan, bound_certificate=certificate)


def _joint_certificate(planned: Sequence[PlannedBlock], joint: BlockDualResult, targets: QueryRuns) -> tuple[float, dict]:
    """The joint block dual's bound evaluated at its dual point as ``distfit audit`` evaluates it,
    ``(sum_S sqrt(|v_S| certified_bound(B_S, L_S / sqrt(c), u_S, v_S)))^2`` (``v_S``: the query
    weights of block S's rows; ``certified_bound`` keeps every singular value, where the
    ascent's eigenvalues lose the small ones' digits), and that point as stored (JSON)."""
    weights = joint.query_weights
    total = 0.0
    for block, cells in zip(planned, joint.cell_weights):
        rows = weights[block.spec.query_index]
        if rows.sum() > 0:
            scaled_recon = block.solution.recon / np.sqrt(targets[block.spec.query_index])[:, None]
            total += float(np.sqrt(rows.sum() * certified_bound(block.solution.basis, scaled_recon, cells, rows)))
    queries = np.flatnonzero(weights > 0)
    return total**2, {"queries": queries.tolist(), "weights": weights[queries].tolist(),
                      "cell_weights": {b.spec.block_id: u.tolist() for b, u in zip(planned, joint.cell_weights)}}


def _closed_sum(closed: ClosedFormBlocks | None, scales: np.ndarray) -> float:
    """``sum_S alpha_S / s_S`` of the closed-form blocks: their profiles are flat, so this is
    exactly what they add to every cell of the stitched profile."""
    return 0.0 if closed is None else float(np.sum(scaled_cost(closed.alpha, scales)))


def plan_streamed(domain: Domain, blocks: Sequence[BlockRef], targets: np.ndarray | QueryRuns, sink: BlockSink,
                  *args: object, **kwargs: object) -> PlanResult:
    """``plan_blocks`` for plans too big to hold: the blocks live in ``sink`` (module docstring).

    ``blocks`` are refs of specs already saved in the sink (``sink.save_spec``); the other
    parameters are ``plan_blocks``' (``executor``, ``refine_rounds``, ... in its order). Every
    solution goes to the sink as it completes; the driver keeps alpha_S, the lower bound and
    v_jS per block. The returned plan's blocks are ``StreamedBlock`` drafts: scale them into
    the store with ``write_streamed_blocks`` (after any budget scaling). The joint block dual
    is not run (it needs every block in memory)."""
    return plan_blocks(domain, blocks, targets, *args, sink=sink, **kwargs)


def _composed_plan(domain: Domain, keeper: _MemoryBlocks | _SinkBlocks, blocks: tuple, targets: QueryRuns,
                   variances: QueryRuns, sum_bound: float, lower_bound: float, lower_bound_method: str, log: list[str],
                   start: float, rounds: int, closed: ClosedFormBlocks | None, closed_scales: np.ndarray) -> PlanResult:
    """The stitched plan of scaled blocks under sequential composition (docs/design.md section 2):
    alpha is the maximum of the stitched profile ``sum_S p_S(x_S)`` on a domain of at most
    ``EXACT_DOMAIN_LIMIT`` cells (``composition.stitched_profile`` fed the solved blocks' scaled
    profiles one at a time by ``keeper.profiles``, plus the closed-form blocks' flat profiles),
    else the sum bound ``sum_S alpha_S``."""
    alpha_exact = alpha_is_exact(domain.size, flat_profiles=not blocks)
    if domain.size <= EXACT_DOMAIN_LIMIT:
        alpha = float(stitched_profile(domain, keeper.profiles(blocks)).max()) + _closed_sum(closed, closed_scales)
        log.append(f"alpha {alpha:.6g} evaluated cell by cell over {domain.size} cells{keeper.evaluated_from} "
                   f"(sum bound {sum_bound:.6g})")
    elif alpha_exact:
        alpha = sum_bound
        log.append(f"alpha {alpha:.6g} exact: every block has a closed form, whose profile is flat, so the stitched "
                   f"profile is flat and its maximum is the sum bound")
    else:
        alpha = sum_bound
        log.append(f"domain of {domain.size:.3g} cells is too large to evaluate; alpha is the sum bound {alpha:.6g}")
    for line in log:
        LOG.info(line)
    return PlanResult(
        domain=domain,
        blocks=blocks,
        target_runs=targets,
        variance_runs=variances,
        alpha=alpha,
        alpha_exact=alpha_exact,
        alpha_sum_bound=sum_bound,
        allocation_lower_bound=lower_bound,
        composition="sequential across blocks, parallel across units",
        decisions=tuple(log),
        seconds=time.perf_counter() - start,
        rounds=rounds,
        streamed=keeper.streamed,
        lower_bound_method=lower_bound_method,
        closed=closed,
        closed_scales=closed_scales,
    )


def write_streamed_blocks(plan: PlanResult, sink: BlockSink) -> None:
    """Second pass of a streamed plan: one block at a time, read its draft's sigma, variances
    and profile, apply the block's final scale (``distfit.mathematics.scaling.scale_block``, the arithmetic
    of ``PlannedBlock``) and make it the plan's block."""
    if not plan.streamed:
        raise ValueError("write_streamed_blocks: the plan was planned in memory; write its blocks directly")
    for block in plan.blocks:
        arrays = sink.load_arrays(block.round, block.ref, ("sigma", "variances", "profile"))
        scaled = scale_block(block.scale, arrays["sigma"], arrays["variances"], arrays["profile"],
                             block.solution_alpha, block.solution_lower_bound)
        del arrays
        replace = {"sigma": scaled.sigma, "variances": scaled.variances, "profile": scaled.profile}
        sink.promote(block.round, block.ref, replace, alpha=scaled.alpha, lower_bound=scaled.lower_bound)


def joint_dual_evaluations(work: float) -> int:
    """How many joint block dual evaluations a plan of ``work`` flops per evaluation may spend:
    ``JOINT_DUAL_BUDGET / work``, at least ``JOINT_DUAL_MIN_EVALUATIONS``. Small plans are not
    limited in practice (work 1e7: 3000); on Adult (470 blocks, 1.1e9 flops, ~1.6 s per
    evaluation on a loaded 2-core machine) 96 evaluations took minutes after the last block
    had finished, for a plan 13% worse than the per-block shapes'."""
    return max(JOINT_DUAL_MIN_EVALUATIONS, int(JOINT_DUAL_BUDGET / max(work, 1.0)))


def _co_optimize(planned: Sequence[PlannedBlock], targets: QueryRuns) -> BlockDualResult:
    work = block_work([b.spec for b in planned])
    with blas_limit():
        return maximize_block_dual(
            [b.solution.basis for b in planned],
            [b.solution.recon / np.sqrt(targets[b.spec.query_index])[:, None] for b in planned],
            [b.spec.query_index for b in planned],
            targets.size,
            max_evaluations=joint_dual_evaluations(work),
        )


def _replace_sigmas(planned: Sequence[PlannedBlock], sigmas: Sequence[np.ndarray], targets: QueryRuns) -> tuple[PlannedBlock, ...]:
    """Blocks carrying the jointly optimised covariances (scale 1); target shares follow them.

    Such a block has no certificate of its own: its solve's dual weights bound the block's
    problem at the shares it was solved for, not at the shares that now follow the joint
    covariance. So its ``lower_bound`` is 0 (no block claim), its weights NaN, and its gap
    unknown; the plan's bound is the joint block dual's (``chosen_blocks_lower_bound``)."""
    solutions = []
    for block, sigma in zip(planned, sigmas):
        profile = privacy_profile(sigma, block.solution.basis)
        variances = np.einsum("ij,jk,ik->i", block.solution.recon, sigma, block.solution.recon)
        stats = dataclasses.replace(block.solution.stats, stage="block-dual")
        solutions.append(dataclasses.replace(
            block.solution, sigma=sigma, profile=profile, variances=variances, alpha=float(profile.max()),
            lower_bound=0.0, gap=float("inf"), stats=stats,
            cell_weights=np.full(block.solution.cell_weights.shape, np.nan),
            query_weights=np.full(block.solution.query_weights.shape, np.nan),
        ))
    totals = stitched_variances(targets.size, ((b.spec.query_index, s.variances) for b, s in zip(planned, solutions)))
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
    closed_forms: bool = True,
) -> PlanResult:
    """Decompose ``groups`` on ``domain`` and plan the blocks (accuracy first); ``closed_forms=False``
    solves every block with SM-II (no closed forms)."""
    decomposition = decompose_lazily(domain, groups, max_cells, closed_forms=closed_forms)
    return plan_blocks(domain, list(decomposition.specs()), decomposition.workload.target_runs(), executor, refine_rounds,
                       decomposition.decisions, closed=decomposition.closed)
