"""``planner.chosen_blocks_lower_bound``, evaluated at the dual point stored with it
(:mod:`distfit.audit.bounds`): the scale allocation's or the joint block dual's. The blocks'
terms of its dual are collected while :mod:`distfit.audit.plan` audits the blocks (explicit ones
there, packed ones in :mod:`distfit.audit.packs`), and the stored value is compared at the end.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distfit.audit import labels
from distfit.mathematics import bounds as bound_labels
from distfit.audit.bounds import allocation_bound, joint_bound, not_a_distribution, range_sums
from distfit.audit.checks import REPLAN, Checks, closed_keys, label
from distfit.mathematics.packing import QueryRuns
from distfit.stores.plan import BlockRecord


@dataclass
class Certificate:
    """``planner.chosen_blocks_lower_bound``'s dual point, validated: ``queries`` (sorted, in
    range) and their ``weights`` (a distribution), and ``per_target``, each weight over its
    query's target (``omega_j / c_j``, formed once: the scale allocation's ``g_S`` weighs every
    block's rows by it); for the joint block dual each block's cell weights. The per-block terms
    of its dual are accumulated as the blocks are audited."""

    method: str
    queries: np.ndarray
    weights: np.ndarray
    per_target: np.ndarray
    cell_weights: dict[str, np.ndarray] = field(default_factory=dict)
    alphas: list[float] = field(default_factory=list)  # scale allocation: a_S per block
    sums: list[float] = field(default_factory=list)  # scale allocation: sum_j omega_j v_jS / c_j per block
    joint: list[tuple] = field(default_factory=list)  # joint block dual: (basis, L_c, u_S, v_S) per block

    def weights_over(self, first: np.ndarray, count: np.ndarray, per_target: bool = False) -> np.ndarray:
        """Per query range, the certificate's weight on it (each over its query's target when
        ``per_target``)."""
        return range_sums(self.queries, self.per_target if per_target else self.weights, first, count)

    def add_block(self, block: BlockRecord, targets: QueryRuns, alpha: float, variances: np.ndarray) -> bool:
        """Add a solved block's term of the dual at its recomputed ``alpha`` and ``variances``
        (``targets``: every query's); False when the certificate holds no weights of its cells."""
        rows = np.ones(block.query_index.size, dtype=np.int64)
        if self.method == bound_labels.SCALE_ALLOCATION:
            self.alphas.append(alpha)
            self.sums.append(float(self.weights_over(block.query_index, rows, per_target=True) @ variances))
            return True
        cells = self.cell_weights.get(block.block_id)
        if cells is None or cells.size != block.basis.shape[1]:
            return False
        self.joint.append((block.basis, block.recon / np.sqrt(targets[block.query_index])[:, None], cells,
                           self.weights_over(block.query_index, rows)))
        return True


def read_certificate(check: Checks, bound: Any, targets: QueryRuns, explicit: tuple[str, ...]) -> Certificate | None:
    """The certificate stored with ``planner.chosen_blocks_lower_bound`` (``targets``: every
    query's), or None (a failure naming why) when it is missing or is not a dual point of the
    plan's program."""
    m = targets.size
    name = "planner.chosen_blocks_lower_bound"
    if not isinstance(bound, dict) or bound.get("method") not in bound_labels.CHOSEN_BLOCKS_BOUNDS:
        return None  # failed where the bound is checked
    stored = bound.get("certificate")
    if stored is None:
        check(False, f"{name}: cannot be re-certified: the plan stores no certificate (the dual point of the "
                     f"{bound['method']}; a plan written before the planner kept it); {REPLAN}")
        return None
    joint = bound["method"] == bound_labels.JOINT_BLOCK_DUAL
    known = frozenset({"queries", "weights"} | ({"cell_weights"} if joint else set()))
    if not closed_keys(check, f"{name}.certificate", stored, known):
        return None
    try:
        queries = np.asarray(stored.get("queries"), dtype=np.int64)
        weights = np.asarray(stored.get("weights"), dtype=float)
    except (TypeError, ValueError, OverflowError):
        check(False, f"{name}.certificate: queries and weights are not arrays of numbers")
        return None
    if not check(queries.ndim == 1 and queries.shape == weights.shape and np.all(np.diff(queries) > 0)
                 and (not queries.size or (queries[0] >= 0 and queries[-1] < m)),
                 f"{name}.certificate: queries must be increasing query numbers below {m}, one weight each"):
        return None
    problem = not_a_distribution(weights)
    if not check(not problem, f"{name}.certificate.weights: not a distribution of weights ({problem})"):
        return None
    certificate = Certificate(bound["method"], queries, weights, weights / targets[queries])
    if joint:
        cells = stored.get("cell_weights")
        if not check(isinstance(cells, dict) and sorted(cells) == sorted(explicit),
                     f"{name}.certificate.cell_weights: expected the cell weights of the blocks {list(explicit)}, "
                     f"got those of {sorted(cells) if isinstance(cells, dict) else cells!r}"):
            return None
        for block_id, u in cells.items():
            try:
                u = np.asarray(u, dtype=float)
            except (TypeError, ValueError):
                u = np.full(1, np.nan)
            problem = not_a_distribution(u) if u.ndim == 1 else "not a list"
            if not check(not problem, f"{name}.certificate.cell_weights.{block_id}: not a distribution of weights "
                                      f"({problem})"):
                return None
            certificate.cell_weights[block_id] = u
    return certificate


def check_chosen_bound(check: Checks, bound: Any, certificate: Certificate | None, scale: float,
                        packed: bool, tolerance: float) -> None:
    """``planner.chosen_blocks_lower_bound``: its keys and labels, and its value evaluated at its
    certificate over every block, at the targets times the variance scale ``scale``, to
    ``tolerance`` (relative: :func:`distfit.audit.checks.bound_tolerance`)."""
    name = "planner.chosen_blocks_lower_bound"
    if not closed_keys(check, name, bound, labels.CHOSEN_BOUND_KEYS):
        return
    method = bound.get("method")
    if not check(method in bound_labels.CHOSEN_BLOCKS_BOUNDS,
                 f"{name}: unknown method {method!r} (expected one of {sorted(bound_labels.CHOSEN_BLOCKS_BOUNDS)})"):
        return
    label(check, f"{name}.bounds", bound.get("bounds"), bound_labels.CHOSEN_BLOCKS_BOUNDS[method])
    value = bound.get("value")
    if not check(labels.is_number(value), f"{name}.value: expected a number, got {value!r}") or certificate is None:
        return
    if method == bound_labels.JOINT_BLOCK_DUAL:
        if not check(not packed, f"{name}: cannot be re-certified: the joint block dual's certificate covers the "
                                 f"plan's solved blocks, not its packed (closed-form) ones; {REPLAN}"):
            return
        proved = joint_bound(certificate.joint) / scale  # N_S^2 scales as 1 / k when every target does
    else:
        proved = allocation_bound(np.asarray(certificate.alphas), np.asarray(certificate.sums) / scale)
    check(abs(float(value) - proved) <= tolerance * proved,
          f"{name}: stored {value!r}, but its certificate (the {method}'s dual point) proves {proved!r}")
