"""``distfit plan``: a pipeline spec in, a plan store out (the I/O edge around ``plan``).

Loads and validates the spec, refuses an output path that already holds a plan (unless
``overwrite``), decomposes the workload, solves the blocks on a Dask cluster (or serially),
allocates a budget when the spec gives one, and writes the plan store atomically
(``store.PlanWriter``). The mathematics stays in ``plan``, ``blocks`` and ``solver``.

Privacy-first specs: the accuracy-first plan is scaled as a whole (the blocks are sequential:
they see the same people), ``Sigma_S * k`` with ``k = alpha / alpha_budget``, so every
variance becomes ``k`` times its target and alpha equals the budget's.
"""
from __future__ import annotations

import dataclasses
import math
import sys
from typing import TextIO

from . import __version__
from .plan import PlanResult, decompose, plan_blocks, serial_executor
from .privacy import privacy_account
from .runtime import DaskExecutor, Progress, dask_client
from .spec import PipelineSpec, load_spec
from .store import BlockRecord, PlanWriter


def apply_budget(plan: PlanResult, budget_alpha: float) -> PlanResult:
    """Scale every block by ``k = alpha / budget_alpha`` (module docstring)."""
    factor = plan.alpha / budget_alpha
    blocks = tuple(dataclasses.replace(block, scale=block.scale * factor) for block in plan.blocks)
    return dataclasses.replace(
        plan,
        blocks=blocks,
        variances=plan.variances * factor,
        alpha=plan.alpha / factor,
        alpha_sum_bound=plan.alpha_sum_bound / factor,
        allocation_lower_bound=plan.allocation_lower_bound / factor,
        variance_scale=plan.variance_scale * factor,
        decisions=plan.decisions + (f"budget alpha {budget_alpha:.6g}: variances scaled by k = {factor:.6g}",),
    )


def write_plan(spec: PipelineSpec, plan: PlanResult, out: str, overwrite: bool = False) -> str:
    """Write ``plan`` to a plan store at ``out`` (DESIGN.md section 4); returns the checksum."""
    with PlanWriter(out, overwrite=overwrite) as writer:
        for block in plan.blocks:
            writer.write_block(
                BlockRecord(
                    block_id=block.spec.block_id,
                    attributes=block.spec.attributes,
                    basis=block.solution.basis,
                    recon=block.solution.recon,
                    query_index=block.spec.query_index,
                    sigma=block.sigma,
                    targets=block.targets,
                    variances=block.variances,
                    profile=block.profile,
                    alpha=block.alpha,
                    lower_bound=block.solution.lower_bound / block.scale,
                    # A block re-optimised by the joint block dual has no certificate of its own.
                    solver=dataclasses.asdict(block.solution.stats)
                    | {"gap": block.solution.gap if math.isfinite(block.solution.gap) else None},
                )
            )
        return writer.finish(
            spec=spec.to_dict(),
            schema={"attributes": list(spec.domain.names), "sizes": list(spec.domain.sizes)},
            queries_targets=plan.targets,
            queries_variances=plan.variances,
            alpha=plan.alpha,
            alpha_exact=plan.alpha_exact,
            rho=plan.rho,
            composition=plan.composition,
            extra_attrs={
                "account": privacy_account(plan.alpha).to_dict(),
                "planner": {
                    "decisions": list(plan.decisions),
                    "alpha_sum_bound": plan.alpha_sum_bound,
                    "allocation_lower_bound": plan.allocation_lower_bound,
                    "rounds": plan.rounds,
                    "variance_scale": plan.variance_scale,
                    "seconds": plan.seconds,
                    "spec_hash": spec.spec_hash,
                    "distfit_version": __version__,
                },
            },
        )


def run_plan(
    spec_path: str,
    out: str,
    *,
    cluster: str | None = None,
    workers: int | None = None,
    overwrite: bool = False,
    serial: bool = False,
    refine_rounds: int = 1,
    log: TextIO | None = None,
) -> tuple[PlanResult, str]:
    """Spec file to plan store. Errors: SpecError/ValueError (bad input), FileExistsError
    (a plan is already there), runtime.ClusterError (unreachable scheduler)."""
    log = log or sys.stderr
    spec = load_spec(spec_path)
    PlanWriter(out, overwrite=overwrite).abort()  # refuse an existing plan before any work
    blocks, decisions = decompose(spec.domain, spec.group_triples(), spec.blocks.max_cells if spec.blocks.merge else 0)
    for line in decisions:
        print(f"distfit: {line}", file=log)
    if serial:
        plan = plan_blocks(spec.domain, blocks, spec.targets, serial_executor, refine_rounds, decisions, Progress("plan", log))
    else:
        with dask_client(cluster, workers, log=log) as client:
            plan = plan_blocks(spec.domain, blocks, spec.targets, DaskExecutor(client), refine_rounds, decisions, Progress("plan", log))
    if spec.privacy.budget is not None:
        plan = apply_budget(plan, spec.privacy.budget.to_alpha())
    checksum = write_plan(spec, plan, out, overwrite=overwrite)
    return plan, checksum
