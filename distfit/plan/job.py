"""``distfit plan``: a pipeline spec in, a plan store out (the I/O edge around the planner).

``run_plan`` takes a validated spec (``distfit.spec.model.PipelineSpec``), refuses an output
path that already holds a plan (unless ``overwrite``), decomposes the workload, solves the
blocks on a Dask cluster (or serially), allocates a budget when the spec gives one, and writes
the plan store atomically (``distfit.stores.plan_writer.PlanWriter``). The mathematics stays in
``planner``, ``residual``, ``allocate``, ``composition`` and ``distfit.solver``.

Privacy-first specs: the accuracy-first plan is scaled as a whole (the blocks are sequential:
they see the same people), ``Sigma_S * k`` with ``k = alpha / alpha_budget``
(``distfit.mathematics.scaling``), so every variance becomes ``k`` times its target and alpha equals the
budget's: ``apply_budget`` in memory, ``scale_plan_to_budget`` on a stored plan (a level's share
of a multi-level run's budget, ``distfit.plan.levels``).

Plans that fit in memory are held there; larger plans stream. A plan whose blocks' arrays would
take more than ``planner.STREAM_BYTES`` in the driver (``planner.should_stream``,
``decomposition.held_bytes``), or any plan with ``stream=True``,
is built inside the open ``PlanWriter``: the block specs are spilled to the staging store's
scratch space, each block task reads its spec back when it is submitted, each result is
written there as a draft as it completes (``StoreSink``), the scales are allocated from the
O(m_b) per-block vectors the driver keeps, and a second pass scales each draft into
``blocks/<block_id>`` one at a time (``planner.write_streamed_blocks``) before ``finish_plan``
checksums and moves the store into place. Peak driver memory is then about one block plus the
O(sum m_b) vectors (plus, for an exact alpha, one float per cell of the domain). The staging
store is marked incomplete throughout, so an interrupted run leaves nothing a reader accepts.
Smaller plans keep every block in memory (``planner.plan_blocks``) so the joint block dual can
co-optimise them, then are written in one go (``write_plan``).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
import sys
from typing import Iterator, Sequence, TextIO

import numpy as np

from distfit import __version__
from distfit.plan.cluster_executor import DaskExecutor
from distfit.runtime.placement import Placement, placement_client
from distfit.runtime.progress import Progress
from distfit.runtime.threads import blas_limit
from distfit.mathematics.bounds import CHOSEN_BLOCKS_BOUNDS, GLOBAL_BOUNDS
from distfit.mathematics.packing import PackedBlocks
from distfit.plan.decomposition import Decomposition
from distfit.plan.planner import (
    BATCH_SECONDS, BlockRef, Executor, PlannedBlock, PlanResult, decompose_lazily, plan_blocks,
    plan_streamed, serial_executor, should_stream, write_streamed_blocks,
)
from distfit.plan.residual import BlockSpec
from distfit.plan.rounds import BLOCK_GAP
from distfit.mathematics.privacy import privacy_account
from distfit.mathematics.scaling import scale_block, scaled_cost, scaled_noise
from distfit.solver.solve import BlockSolution
from distfit.spec.limits import BLOCK_GAP as BLOCK_GAP_RANGE
from distfit.spec.model import PipelineSpec
from distfit.stores.lock import store_lock
from distfit.stores.plan import SOLVED_PACK_MIN_BLOCKS, BlockRecord, Plan, read_plan
from distfit.stores.plan_writer import PlanWriter


def apply_budget(plan: PlanResult, budget_alpha: float) -> PlanResult:
    """Scale every block by ``k = alpha / budget_alpha`` (module docstring)."""
    factor = plan.alpha / budget_alpha
    # a block at scale s scaled by k is at scale s * k (its arrays are scaled when written)
    blocks = tuple(dataclasses.replace(block, scale=block.scale * factor) for block in plan.blocks)
    return dataclasses.replace(
        plan,
        blocks=blocks,
        closed_scales=None if plan.closed_scales is None else plan.closed_scales * factor,
        variance_runs=plan.variance_runs.with_values(scaled_noise(plan.variance_runs.values, factor)),
        alpha=scaled_cost(plan.alpha, factor),
        alpha_sum_bound=scaled_cost(plan.alpha_sum_bound, factor),
        allocation_lower_bound=scaled_cost(plan.allocation_lower_bound, factor),
        variance_scale=scaled_noise(plan.variance_scale, factor),
        decisions=plan.decisions + (f"budget alpha {budget_alpha:.6g}: variances scaled by k = {factor:.6g}",),
    )


def _solver_attrs(solution: BlockSolution) -> dict:
    # A block re-optimised by the joint block dual has no certificate of its own.
    return dataclasses.asdict(solution.stats) | {"gap": solution.gap if math.isfinite(solution.gap) else None}


def block_record(block: BlockSpec | BlockRef, solution: BlockSolution, targets: np.ndarray,
                 scaled: PlannedBlock | BlockSolution) -> BlockRecord:
    """The stored form of a solved block (``BlockRecord``), for ``write_plan`` and for a streamed
    plan's drafts (``StoreSink.save_solution``) alike: its id, attributes and query rows from
    ``block`` (spec or ref), basis, recon, solver statistics and dual certificate from
    ``solution``, the ``targets`` it was solved for, and sigma, variances, profile, alpha and
    lower bound from ``scaled``: the ``PlannedBlock`` (at its scale) of an in-memory plan, the
    solution itself for a draft (scaled when promoted: ``planner.write_streamed_blocks``). The
    certificate is scale-free: at scale s the bound is lower_bound / s on variances s * targets."""
    return BlockRecord(
        block_id=block.block_id,
        attributes=block.attributes,
        basis=solution.basis,
        recon=solution.recon,
        query_index=block.query_index,
        sigma=scaled.sigma,
        targets=targets,
        variances=scaled.variances,
        profile=scaled.profile,
        alpha=scaled.alpha,
        lower_bound=scaled.lower_bound,
        solver=_solver_attrs(solution),
        cell_weights=solution.cell_weights,
        query_weights=solution.query_weights,
    )


def write_plan(spec: PipelineSpec, plan: PlanResult, out: str, overwrite: bool = False) -> str:
    """Write an in-memory ``plan`` to a plan store at ``out`` (docs/design.md section 4); returns the
    checksum. (A streamed plan is already in its writer: ``run_plan``.)"""
    if plan.streamed:
        raise ValueError("write_plan: a streamed plan is written by run_plan through its open PlanWriter")
    with PlanWriter(out, overwrite=overwrite) as writer:
        records = [block_record(block.spec, block.solution, block.targets, block) for block in plan.blocks]
        write_solved_blocks(writer, records, spec.domain.schema()["attributes"])
        write_closed_blocks(writer, plan)
        return finish_plan(writer, spec, plan)


def write_solved_blocks(writer: PlanWriter, records: Sequence[BlockRecord], schema_attributes: Sequence[str]) -> None:
    """A plan's solved (explicit) blocks: :data:`SOLVED_PACK_MIN_BLOCKS` or more, every one with
    its certificate, as the one solved pack (format 5: 13 arrays, where a group per block was
    9 arrays each: Adult's 470 blocks were 4,230 arrays, 17 s to write, checksum and fsync);
    fewer keep one group per block, their layout and bytes (written concurrently:
    ``PlanWriter.write_blocks``)."""
    if len(records) >= SOLVED_PACK_MIN_BLOCKS and all(r.cell_weights is not None for r in records):
        writer.write_solved(records, schema_attributes)
    else:
        writer.write_blocks(records)


def write_closed_blocks(writer: PlanWriter, plan: PlanResult) -> None:
    """The plan's closed-form blocks as one pack (``distfit.mathematics.packing.PackedBlocks``): a few arrays
    for all of them, not a store group each."""
    if plan.closed is not None and len(plan.closed):
        writer.write_packed(plan.closed.pack(plan.closed_scales))


class StoreSink:
    """``planner.BlockSink`` on an open ``PlanWriter``: a streamed plan's blocks live in the staging
    store. Specs go to ``scratch/specs/<block_id>`` (basis, recon), round r's solutions to the
    draft ``scratch/round-<r>/<block_id>`` (the block layout, sigma/variances/profile/alpha
    before the final scale), and ``promote`` moves a draft to ``blocks/<block_id>``."""

    def __init__(self, writer: PlanWriter) -> None:
        self.writer = writer

    def save_spec(self, spec: BlockSpec) -> BlockRef:
        self.writer.write_scratch(f"specs/{spec.block_id}", {"basis": spec.basis, "recon": spec.recon})
        return BlockRef.of(spec)

    def load_spec(self, ref: BlockRef) -> BlockSpec:
        arrays, _ = self.writer.read_scratch(f"specs/{ref.block_id}", ("basis", "recon"))
        return BlockSpec(ref.block_id, ref.attributes, arrays["basis"], arrays["recon"], ref.query_index, ref.targets)

    def save_solution(self, round_number: int, ref: BlockRef, solution: BlockSolution, targets: np.ndarray) -> None:
        # the draft is the solution before the final scale; promote keeps its weights (scale-free)
        self.writer.write_draft(f"round-{round_number}/{ref.block_id}", block_record(ref, solution, targets, solution))

    def drop_round(self, round_number: int) -> None:
        self.writer.discard_scratch(f"round-{round_number}")

    def load_arrays(self, round_number: int, ref: BlockRef, names: Sequence[str]) -> dict[str, np.ndarray]:
        return self.writer.read_scratch(f"round-{round_number}/{ref.block_id}", names)[0]

    def promote(self, round_number: int, ref: BlockRef, replace: dict[str, np.ndarray], alpha: float, lower_bound: float) -> None:
        self.writer.promote_draft(f"round-{round_number}/{ref.block_id}", replace, {"alpha": alpha, "lower_bound": lower_bound})


class RoundProgress:
    """``cluster.Progress`` restarted for every refinement round: the planner reports ``(0, total)``
    when a round starts. (One meter for all rounds counted round 1's blocks against the time
    since round 0 began, so on Adult round 1 looked 6x slower than it was.)"""

    def __init__(self, label: str, log: TextIO) -> None:
        self.label = label
        self.log = log
        self.round = -1
        self.meter: Progress | None = None

    def __call__(self, done: int, total: int) -> None:
        if done == 0 or self.meter is None:
            self.round += 1
            self.meter = Progress(f"{self.label} round {self.round}" if self.round else self.label, self.log)
        if done:
            self.meter(done, total)




def planner_bounds(plan: PlanResult) -> dict:
    """The planner's lower bounds, each with what it bounds (issue 12): ``chosen_blocks_lower_bound``
    (the allocation's or the joint block dual's certificate: plans with the chosen blocks only;
    ``PlanResult.allocation_lower_bound``, with the dual point that proves it as ``certificate``,
    ``PlanResult.bound_certificate``, which ``distfit audit`` evaluates) and ``global_lower_bound``
    (every plan of the form; known when the plan is one block, whose own dual certificate is then
    global, else ``None``)."""
    blocks = plan.num_blocks
    known = blocks == 1 and len(plan.blocks) == 1 and plan.blocks[0].lower_bound > 0
    return {
        "chosen_blocks_lower_bound": {
            "value": plan.allocation_lower_bound,
            "method": plan.lower_bound_method,
            "bounds": CHOSEN_BLOCKS_BOUNDS[plan.lower_bound_method],
            **({"certificate": plan.bound_certificate} if plan.bound_certificate is not None else {}),
        },
        "global_lower_bound": {
            "value": float(plan.blocks[0].lower_bound) if known else None,
            "method": ("the dual certificate of the plan's one block, which holds every query" if known else
                       f"not known: the plan has {blocks} blocks, and no certificate covers plans with noise "
                       "correlated across blocks" if blocks > 1 else
                       "not known: the plan's one block has no certificate of its own"),
            "bounds": GLOBAL_BOUNDS,
        },
    }


def finish_plan(writer: PlanWriter, spec: PipelineSpec, plan: PlanResult) -> str:
    """Seal the plan in ``writer`` (its blocks already written): the queries' targets and
    variances, alpha, the privacy account and the planner's record (``planner`` attrs);
    returns the checksum."""
    return writer.finish(
        spec=spec.to_dict(),
        schema=spec.domain.schema(),
        queries_targets=plan.target_runs,
        queries_variances=plan.variance_runs,
        alpha=plan.alpha,
        alpha_exact=plan.alpha_exact,
        rho=plan.rho,
        composition=plan.composition,
        extra_attrs={
            "account": privacy_account(plan.alpha).to_dict(),
            "planner": {
                "decisions": list(plan.decisions),
                "alpha_sum_bound": plan.alpha_sum_bound,
                **planner_bounds(plan),
                "rounds": plan.rounds,
                "variance_scale": plan.variance_scale,
                "seconds": plan.seconds,
                "spec_hash": spec.spec_hash,
                "distfit_version": __version__,
            },
        },
    )


@contextlib.contextmanager
def _executor(placement: Placement, log: TextIO, batch_seconds: float = BATCH_SECONDS) -> Iterator[Executor]:
    with placement_client(placement, log) as client:
        yield serial_executor if client is None else DaskExecutor(client, batch_seconds=batch_seconds)


def run_plan(
    spec: PipelineSpec,
    out: str,
    *,
    placement: Placement = Placement(),
    overwrite: bool = False,
    refine_rounds: int = 2,
    stream: bool | None = None,
    log: TextIO | None = None,
    closed_forms: bool = True,
    batch_seconds: float = BATCH_SECONDS,
    decomposition: Decomposition | None = None,
    gap_tolerance: float = BLOCK_GAP,
) -> tuple[PlanResult, str]:
    """Spec (``distfit.spec.parse.load_spec``) to plan store at ``out``; returns the plan and its
    checksum. ``placement``: where the block solves run (:class:`distfit.runtime.placement.Placement`;
    default a local cluster). ``stream``: build the plan through the store (module docstring); ``None``
    (default) streams exactly the plans too big to co-optimise (``planner.should_stream``).
    ``closed_forms=False`` solves every block with SM-II and merges as before closed forms
    (``decomposition.decompose_lazily``): for comparisons and tests of solved blocks.
    ``refine_rounds``: 2 by default (``plan.rounds``: warm-started rounds cost about half a
    cold one; on Adult the second lowered alpha from 1.280 to 1.254). ``batch_seconds``: the least estimated work of one cluster task (``planner.batched``: small
    blocks share tasks; 0 = one task per block). ``gap_tolerance``: the certified gap of every
    solved block (``rounds.BLOCK_GAP``, 1e-4, by default); a draft plan asks for a looser one
    (``distfit plan --gap-tolerance``, range ``spec.limits.BLOCK_GAP``; docs/planning.md, step
    5: Adult at 0.5 without refinement rounds, 21 CPU-s against 244 for alpha 1.557 against
    1.254). ``decomposition``: the spec's
    (:func:`planned_decomposition`) when the caller has it already (a microdata run tabulates the
    blocks' marginals before planning): the spec is decomposed once per run. Errors: SpecError/ValueError (bad input), FileExistsError (a plan is already there),
    cluster.ClusterError (unreachable scheduler)."""
    log = log or sys.stderr
    if BLOCK_GAP_RANGE.excludes(gap_tolerance):
        raise ValueError(f"gap_tolerance: must be {BLOCK_GAP_RANGE.text}, got {gap_tolerance!r}")
    # one writer per store (a second plan job into out is refused); the driver's linear algebra
    # with one BLAS thread, as the CLI's and the workers': a plan has the same bits however made
    with store_lock(out, "plan"), blas_limit():
        return _run_plan(spec, out, placement=placement, overwrite=overwrite, refine_rounds=refine_rounds,
                         stream=stream, log=log, batch_seconds=batch_seconds, closed_forms=closed_forms,
                         decomposition=decomposition, gap_tolerance=gap_tolerance)


def planned_decomposition(spec: PipelineSpec, *, closed_forms: bool = True) -> Decomposition:
    """The spec's workload cut into blocks as :func:`run_plan` plans them
    (``planner.decompose_lazily`` under the spec's ``blocks`` options): what a microdata run
    tabulates before planning, handed to :func:`run_plan` so that it is computed once."""
    return decompose_lazily(spec.domain, spec.group_triples(), spec.blocks.max_cells if spec.blocks.merge else 0,
                            closed_forms=closed_forms)


def _run_plan(spec: PipelineSpec, out: str, *, placement: Placement, overwrite: bool, refine_rounds: int,
              stream: bool | None, log: TextIO, closed_forms: bool, batch_seconds: float,
              decomposition: Decomposition | None, gap_tolerance: float) -> tuple[PlanResult, str]:
    PlanWriter(out, overwrite=overwrite).abort()  # refuse an existing plan before any work
    if decomposition is None:
        decomposition = planned_decomposition(spec, closed_forms=closed_forms)
    decisions = list(decomposition.decisions)
    for line in decisions:
        print(f"distfit: {line}", file=log)
    budget = spec.privacy.budget
    # only closed-form blocks: nothing to solve, so no cluster is started for them
    where = placement if decomposition.layouts else Placement(serial=True)
    if not (should_stream(decomposition.layouts) if stream is None else stream):
        blocks = list(decomposition.specs())
        with _executor(where, log, batch_seconds) as executor:
            plan = plan_blocks(spec.domain, blocks, decomposition.workload.target_runs(), executor, refine_rounds, decisions, RoundProgress("plan", log),
                               closed=decomposition.closed, block_gap=gap_tolerance)
        if budget is not None:
            plan = apply_budget(plan, budget.to_alpha())
        return plan, write_plan(spec, plan, out, overwrite=overwrite)
    with PlanWriter(out, overwrite=overwrite) as writer:
        sink = StoreSink(writer)
        # built one at a time and spilled at once: the specs live in the staging store only
        refs = []
        for block in decomposition.specs():
            refs.append(sink.save_spec(block))
            del block  # before the next one is built
        with _executor(where, log, batch_seconds) as executor:
            plan = plan_streamed(spec.domain, refs, decomposition.workload.target_runs(), sink, executor, refine_rounds, decisions, RoundProgress("plan", log),
                                 closed=decomposition.closed, block_gap=gap_tolerance)
        if budget is not None:
            plan = apply_budget(plan, budget.to_alpha())
        write_streamed_blocks(plan, sink)
        write_closed_blocks(writer, plan)
        return plan, finish_plan(writer, spec, plan)


def scale_plan_to_budget(source: str, out: str, spec: PipelineSpec, budget_alpha: float, *, fsync: bool = True) -> str:
    """Write at ``out`` the plan that planning ``spec`` (a level spec whose privacy is the budget
    ``alpha = budget_alpha``) would give, from the accuracy-first plan at ``source``: every block
    scaled by ``k = alpha / budget_alpha`` (``distfit.mathematics.scaling.scale_block``, as ``apply_budget``;
    Problem 2: sigma and variances times k, profile, alpha and bounds divided by k; a block's
    dual certificate, its weights, is scale-free and copied as it is), through a ``PlanWriter``
    (atomic), in the layout ``write_plan`` gives (solved blocks packed where it packs them;
    each closed-form pack rewritten as a pack, ``PackedBlocks.closed_form`` at its scales times
    k, not unpacked into a group per block). Returns the new plan's checksum; the plan passes
    ``distfit.audit.plan.audit_plan`` like any other."""
    plan = read_plan(source)
    attrs = plan.attrs
    alpha = float(attrs["alpha"])
    factor = alpha / float(budget_alpha)
    if not (math.isfinite(factor) and factor > 0):
        raise ValueError(f"budget alpha {budget_alpha!r} gives no finite scale for alpha {alpha!r}")
    planner = dict(attrs.get("planner") or {})
    for key in ("alpha_sum_bound", "allocation_lower_bound"):  # allocation_lower_bound: a version-1 plan's
        if planner.get(key) is not None:
            planner[key] = scaled_cost(float(planner[key]), factor)
    for key in ("chosen_blocks_lower_bound", "global_lower_bound"):
        if isinstance(planner.get(key), dict) and planner[key].get("value") is not None:
            planner[key] = {**planner[key], "value": scaled_cost(float(planner[key]["value"]), factor)}
    planner["variance_scale"] = scaled_noise(float(planner.get("variance_scale", 1.0)), factor)
    planner["decisions"] = list(planner.get("decisions", [])) + [
        f"budget alpha {budget_alpha:.6g} (this level's share of the run's budget): variances scaled by k = {factor:.6g}"]
    planner["spec_hash"] = spec.spec_hash
    new_alpha = scaled_cost(alpha, factor)
    schema = attrs["schema"]
    with store_lock(out, "plan"), PlanWriter(out, fsync=fsync) as writer:
        records = []
        for block_id in plan.explicit_block_ids:
            block = plan.block(block_id)
            scaled = scale_block(factor, np.asarray(block.sigma), np.asarray(block.variances), np.asarray(block.profile),
                                 float(block.alpha), float(block.lower_bound))
            records.append(dataclasses.replace(block, **scaled._asdict()))
        write_solved_blocks(writer, records, schema["attributes"])
        for pack in plan.packs():  # closed-form packs stay packs: their closed forms at scale * k
            writer.write_packed(PackedBlocks.closed_form(
                schema["sizes"], pack.attributes, scaled_noise(pack.scale, factor), pack.segment_offsets,
                pack.segment_clique, pack.segment_query, pack.segment_target, solver=pack.solver))
        return writer.finish(
            spec=spec.to_dict(), schema=attrs["schema"], queries_targets=plan.target_runs,
            queries_variances=plan.variance_runs.with_values(scaled_noise(plan.variance_runs.values, factor)),
            alpha=new_alpha,
            alpha_exact=bool(attrs.get("alpha_exact")), rho=new_alpha / 2.0,
            composition=attrs.get("composition"),
            extra_attrs={"account": privacy_account(new_alpha).to_dict(), "planner": planner})


def level_profiles(plan: Plan) -> list[tuple[tuple[str, ...], np.ndarray]]:
    """``(attributes, profile)`` of every block of a stored plan (``distfit.stores.plan.read_plan``):
    the input ``distfit.plan.levels.combine_levels`` takes per level (profiles are small: one
    float per cell of each block's marginal)."""
    out = []
    for block_id in plan.block_ids:
        block = plan.block(block_id)
        out.append((tuple(block.attributes), np.asarray(block.profile, dtype=float)))
    return out
