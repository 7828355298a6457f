"""The closed lists of what a plan may state that the audit does not recompute as a number: the
keys of each attr, the values of its labels, and the texts of the labels it derives.

A plan states nothing else (docs/audit.md, "What the audit trusts"): a key outside these lists,
or a label other than the one the audit derives from the arrays and the spec, is a failure
naming it. The texts of what each bound bounds are the contract in
:mod:`distfit.mathematics.bounds` (``CHOSEN_BLOCKS_BOUNDS``, ``GLOBAL_BOUNDS``), which the plan job
writes; the audit derives which one applies from the stored certificate, so a plan whose label
was edited, or a planner that writes another method's text, fails.
"""
from __future__ import annotations

from typing import Any

#: Root attrs: provenance and store state (the reader checks ``distfit_format`` and ``complete``)
#: and the claims, each recomputed or checked by the audit.
ROOT_KEYS = frozenset({
    "distfit_format", "format_version", "complete", "checksum", "created", "distfit_version",
    "spec", "schema", "alpha", "alpha_exact", "rho", "composition", "account", "planner",
})
#: Format versions whose claims the audit can re-certify: 2 and later (their checksum covers the
#: claims, and their blocks keep their certificates).
FORMAT_VERSIONS = frozenset({2, 3, 4, 5})
ACCOUNT_KEYS = frozenset({"alpha", "rho", "epsilon_delta", "rdp"})
PLANNER_KEYS = frozenset({
    "decisions", "alpha_sum_bound", "chosen_blocks_lower_bound", "global_lower_bound", "rounds",
    "variance_scale", "seconds", "spec_hash", "distfit_version",
})
CHOSEN_BOUND_KEYS = frozenset({"value", "method", "bounds", "certificate"})
GLOBAL_BOUND_KEYS = frozenset({"value", "method", "bounds"})
BLOCK_ATTR_KEYS = frozenset({"attributes", "alpha", "lower_bound", "solver"})
PACK_ATTR_KEYS = frozenset({"kind", "solver"})
SOLVED_PACK_KEYS = frozenset({"kind", "block_ids", "solvers"})

#: Blocks compose sequentially (every person meets every block), units in parallel (disjoint people).
COMPOSITION = "sequential across blocks, parallel across units"



def global_bound_method(blocks: int, certified: bool) -> str:
    """How ``planner.global_lower_bound`` is known: the one block's certificate (``certified``:
    a one-block plan whose block proves a bound of its own), else why it is not."""
    if blocks == 1 and certified:
        return "the dual certificate of the plan's one block, which holds every query"
    if blocks > 1:
        return (f"not known: the plan has {blocks} blocks, and no certificate covers plans with noise "
                "correlated across blocks")
    return "not known: the plan's one block has no certificate of its own"


#: A solved block's ``solver`` record: how the solve went (counts), not a claim about the plan;
#: ``gap`` is one (``alpha / lower_bound - 1``, recomputed). A block of the joint block dual has
#: stage "block-dual" and gap None (no certificate of its own).
SOLVER_COUNTS = ("dual_evaluations", "newton_iterations", "cg_iterations")
SOLVER_KEYS = frozenset(SOLVER_COUNTS + ("final_t", "seconds", "stage", "gap"))
SOLVER_STAGES = frozenset({"dual", "warm start", "smii", "block-dual"})
JOINT_STAGE = "block-dual"
CLOSED_FORM_SOLVER = {"method": "closed form"}  # a closed-form block (sigma = scale * B B^T)


def is_number(value: Any) -> bool:
    """A real number stored as JSON (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def unknown(keys: Any, known: frozenset) -> list[str]:
    """The keys of a mapping that are not in ``known``, sorted (all of them for a non-mapping)."""
    return sorted(str(k) for k in keys if k not in known)


def solver_problem(solver: Any) -> str:
    """Why a stored ``solver`` record is not one the planner writes (empty when it is): the
    closed-form record, or the solve statistics with their closed list of keys and stages."""
    if solver == CLOSED_FORM_SOLVER:
        return ""
    if not isinstance(solver, dict):
        return f"expected a dict, got {solver!r}"
    extra = unknown(solver, SOLVER_KEYS)
    if extra:
        return f"unknown keys {extra}"
    missing = sorted(SOLVER_KEYS - set(solver))
    if missing:
        return f"missing keys {missing}"
    bad = [k for k in SOLVER_COUNTS if not (isinstance(solver[k], int) and not isinstance(solver[k], bool) and solver[k] >= 0)]
    if bad:
        return f"{bad[0]} is {solver[bad[0]]!r}, not a count"
    for key in ("final_t", "seconds"):
        if not (is_number(solver[key]) and solver[key] >= 0):
            return f"{key} is {solver[key]!r}, not a number >= 0"
    if solver["stage"] not in SOLVER_STAGES:
        return f"unknown stage {solver['stage']!r} (expected one of {sorted(SOLVER_STAGES)})"
    if solver["stage"] == JOINT_STAGE and solver["gap"] is not None:
        return f"gap {solver['gap']!r} stated for a block of the joint block dual (it has no certificate of its own)"
    if solver["stage"] != JOINT_STAGE and not is_number(solver["gap"]):
        return f"gap is {solver['gap']!r}, not a number"
    return ""
