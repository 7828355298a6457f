"""The pieces of a multi-level estimate shared by the driver's passes and the cluster's (:mod:`distfit.estimate.levels`, :mod:`distfit.estimate.subtree_job`).

A level's estimate store (``levels/<level>/estimate.zarr``, method :data:`METHOD`, objective
:data:`OBJECTIVE`): :func:`write_level` writes one built aside and moved into place once sealed;
each unit's parent row (:func:`parent_rows`), its level's normal equations and whitened norms
(:func:`level_terms`) and its own weighted squared residual (:func:`residuals`); in the levels'
shared basis (:func:`information_basis`) the same terms and residuals straight from the answers
with a few matrices formed once per plan (:class:`BasisTerms`).
"""
from __future__ import annotations

import secrets
import shutil
from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any

import numpy as np

from distfit.estimate.geography import GeographyLevel, integer_top_down, nonnegative_top_down
from distfit.estimate.hierarchy import PINV_RTOL
from distfit.estimate.measurements import published_estimates, recover_measurements, workload_estimates, workload_kind
from distfit.estimate.projection import normal_equations, quadratic_objective
from distfit.estimate.rounding import laminar_family
from distfit.estimate.shared_basis import diagonal_in, shared_basis
from distfit.stores.data import cell_labels, value_labels
from distfit.stores.estimate import (
    check_replaceable,
    chunk_rows,
    create_estimate,
    estimate_state,
    read_sealed_estimate,
    seal,
    stored_tables,
    write_variance_rows,
)
from distfit.stores.files import STAGING_MARKER, move_into_place
from distfit.stores.lock import store_lock
from distfit.stores.release_chunks import ChunkWriter

__all__ = ["ESTIMATE_NAME", "METHOD", "NONNEGATIVE_METHOD", "NONNEGATIVE_OBJECTIVE", "OBJECTIVE", "BasisTerms",
           "LevelEstimate", "basis_terms", "cell_columns", "information_basis", "level_method", "level_queries", "published_tables",
           "level_terms", "parent_rows", "query_dtype", "residuals", "reusable_estimate", "unit_keys", "write_level"]

ESTIMATE_NAME = "estimate.zarr"
#: A leaf's product ``a_S K_b`` is skipped where ``K_b`` is within this of the identity,
#: entrywise (:class:`BasisTerms`: it is the identity in exact arithmetic; PL94's differs by
#: 5.9e-13, the rounding of the ``L_S^-1`` of condition number 159 and of ``Q``).
IDENTITY_ATOL = 1e-10
#: The ``method`` attr of a level's estimate store, and the objective its estimates minimise.
METHOD = "hierarchy-gls"
_BLUE_OBJECTIVE = ("over every unit u of every level l at once: sum_u sum_b (y_bu - B_b M_b x_u)^T Sigma_b^-1 "
                   "(y_bu - B_b M_b x_u), every unit's table x_u the sum of its children's (generalised least "
                   "squares over the geography tree: each query's best linear unbiased estimate)")
OBJECTIVE = (_BLUE_OBJECTIVE + "; with integer, then nonnegative integer tables, each level's nearest to it in the "
             "metric of its own and its descendants' measurements, summing to its parents' counts, rounded keeping "
             "the sums exactly and each unit's total and laminar query sums within 1 (controlled rounding)")
#: The ``method`` and objective of a level's nonnegative real-valued estimate (``distfit run
#: --nonnegative``): the BLUE's nonnegative tables (:func:`distfit.estimate.geography.nonnegative_top_down`).
NONNEGATIVE_METHOD = "hierarchy-gls-nonnegative"
NONNEGATIVE_OBJECTIVE = (_BLUE_OBJECTIVE + "; then nonnegative real-valued tables, each "
                         "level's nearest to it in the metric of its own and its descendants' measurements, "
                         "summing to their parents' tables")


def level_method(nonnegative: bool) -> tuple[str, str]:
    """The ``method`` and ``objective`` attrs of a level's estimate store: :data:`METHOD` and
    :data:`OBJECTIVE` (the BLUE, or integer tables from it), or with ``nonnegative``
    :data:`NONNEGATIVE_METHOD` and :data:`NONNEGATIVE_OBJECTIVE`."""
    return (NONNEGATIVE_METHOD, NONNEGATIVE_OBJECTIVE) if nonnegative else (METHOD, OBJECTIVE)


@dataclass(frozen=True)
class LevelEstimate:
    """A level's estimate store: ``path``, ``checksum``, ``units``, ``status`` (``"done"`` or
    ``"reused"``), ``parent`` (the parent level, None for the root)."""

    level: str
    path: str
    checksum: str
    units: int
    status: str
    parent: str | None


def unit_keys(ids: Any) -> np.ndarray:
    """Unit ids as comparable numpy keys: int64, or text."""
    ids = np.asarray(ids[...])
    return ids.astype(np.int64) if ids.dtype.kind in "iu" else np.asarray(ids.tolist(), dtype=str)


def parent_rows(name: str, release, above_name: str, above_ids: np.ndarray, column: str | None) -> np.ndarray | None:
    """Each unit's parent row in the level above (None under a one-population level), from the
    release's ``parent_ids``; ValueError naming the level and the problem."""
    if column is None:
        if above_ids.size != 1:
            raise ValueError(f"level {name}: no unit column above it but level {above_name} has {above_ids.size} units")
        return None
    if release.parent_ids is None or release.parent_column != column:
        raise ValueError(f"{release.path}: level {name}'s release has no parent ids of column {column!r} "
                         f"(recorded: {release.parent_column!r}); tabulate and release it again (a new --out)")
    parents, keys = unit_keys(release.parent_ids), above_ids
    if parents.dtype.kind != keys.dtype.kind:
        parents, keys = parents.astype(str), keys.astype(str)
    order = np.argsort(keys, kind="stable")
    found = np.minimum(np.searchsorted(keys, parents, sorter=order), max(keys.size - 1, 0))
    rows = order[found] if keys.size else np.zeros(parents.size, dtype=np.int64)
    missing = np.flatnonzero(keys[rows] != parents) if keys.size else np.arange(parents.size)
    if missing.size:
        raise ValueError(f"level {name}: unit {unit_keys(release.unit_ids)[missing[0]]!r} has parent "
                         f"{parents[missing[0]]!r} ({column}), which is not a unit of level {above_name}")
    return rows.astype(np.int64)


def published_tables(levels: Sequence[GeographyLevel], xs: Sequence[np.ndarray], models: Sequence[Any], *,
                     integer: bool, roots: np.ndarray | None = None, below: Sequence[tuple[Any, np.ndarray]] = (),
                     progress: Any = None) -> list[np.ndarray]:
    """The tables a run publishes from the BLUE ``xs`` (per level, coarsest first) other than the
    BLUE itself: integer (:func:`distfit.estimate.geography.integer_top_down`, each level's
    rounding keeping the laminar family of its model's queries) or nonnegative real-valued
    (:func:`distfit.estimate.geography.nonnegative_top_down`); ``roots``, ``below``,
    ``progress`` as theirs (the driver's levels, or a forest's from its roots)."""
    if integer:
        return list(integer_top_down(levels, xs, families=[laminar_family(m.workload) for m in models], roots=roots,
                                     below=below, progress=progress))
    return list(nonnegative_top_down(levels, xs, roots=roots, below=below, progress=progress))


def reusable_estimate(path: Path, release, parent_checksum: str | None, *, integer: bool,
                      nonnegative: bool = False) -> Any:
    """The sealed estimate at ``path`` (verified as it opens) when it is still this method's
    estimate of ``release`` with these options: :func:`level_method`'s method and objective of
    ``nonnegative`` (integer tables made another way are not), ``integer`` as asked, and naming
    ``parent_checksum`` as its parent level's estimate (None for the coarsest); else None (it is
    then written again)."""
    method, objective = level_method(nonnegative)
    if estimate_state(path) != "sealed":
        return None
    estimate = read_sealed_estimate(path)  # its root must still hash as sealed (chunks: as read)
    recorded = (estimate.attrs.get("geography") or {}).get("parent_estimate") or {}
    if (estimate.attrs.get("release_checksum") != release.checksum or estimate.method != method
            or estimate.attrs.get("objective") != objective or estimate.integer != bool(integer)
            or recorded.get("checksum") != parent_checksum):
        return None
    return estimate


def write_level(path: Path, *, spec, plan, plan_path: Path, release, model, x: np.ndarray, integer: bool,
                 objective: np.ndarray, variances: tuple[np.ndarray, np.ndarray] | None, geography: dict,
                 fsync: bool, nonnegative: bool = False) -> str:
    """One level's estimate store (module docstring), built aside and moved into place; returns
    its checksum. ``variances``: ``(rows, unit_class)``, the query variances per class and each
    unit's class (:meth:`distfit.estimate.hierarchy.HierarchyEstimate.variances`), or None;
    ``nonnegative``: the store states :func:`level_method`'s nonnegative method."""
    method, stated = level_method(nonnegative)
    queries = level_queries(model, x, integer)
    converged = np.ones(x.shape[0], dtype=np.uint8)
    with store_lock(path, "estimate"):
        estimate_state(path)  # anything but an estimate store at path is refused
        staging = path.with_name(f"{path.name}{STAGING_MARKER}{secrets.token_hex(6)}")
        try:
            root = create_estimate(staging, plan=plan, plan_path=str(plan_path), release=release, method=method,
                                   objective=stated, integer=integer, cells=model.cells,
                                   query_dtype=query_dtype(model, integer),
                                   cell_labels=cell_labels(model.attributes, value_labels(spec)),
                                   cell_columns=cell_columns(model, integer),
                                   variance_classes=None if variances is None else variances[0].shape[0],
                                   geography=geography)
            if variances is not None:
                write_variance_rows(root, 0, variances[0])
            units, chunk_units = int(release.attrs["units"]), int(release.attrs["chunk_units"])
            ids = np.asarray(release.unit_ids[...])
            with ChunkWriter(str(staging)) as writer:
                for chunk, start in enumerate(range(0, units, chunk_units)):
                    rows = slice(start, min(start + chunk_units, units))
                    writer.write_arrays(chunk, start, chunk_rows(
                        queries[rows], x[rows], objective[rows], 0, converged[rows], ids[rows], stored_tables(root),
                        variance_class=None if variances is None else variances[1][rows]))
            checksum = seal(root, staging, plan_path=str(plan_path), plan_checksum=plan.checksum,
                            release_path=release.path, release_checksum=release.checksum, fsync=fsync)
            move_into_place(staging, path, check_replaceable, fsync=fsync)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return checksum


def level_queries(model, x: np.ndarray, integer: bool) -> np.ndarray:
    """A level's query estimates from its tables ``x``: the workload's sums, unbiased (nothing
    clipped); with ``integer`` (integer tables) as published (int64 where the workload is
    integral: :func:`distfit.estimate.measurements.published_estimates`)."""
    if integer:
        return published_estimates(model, x, workload_kind(model), integer=True)
    return workload_estimates(model, x)


def cell_columns(model, integer: bool) -> int | None:
    """Where a level's tables are columns of its query estimates, the first of them
    (:func:`distfit.stores.estimate.create_estimate`'s ``cell_columns``: the store then does not
    write them twice, ``cells/estimates`` left out), else None: the workload holds every cell as a
    query (``model.cell_queries``, PL94's detailed group) and the query estimates are the tables'
    own numbers (real-valued; integer tables with an integral workload, both int64)."""
    return model.cell_queries if not integer or workload_kind(model).integral else None


def query_dtype(model, integer: bool) -> type:
    """The dtype of a level's stored query estimates (:func:`level_queries`)."""
    return np.int64 if integer and workload_kind(model).integral else np.float64


def residuals(hessian: np.ndarray, linear: np.ndarray, norms: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Each unit's own weighted squared residual ``||C^-1 (y - B M x)||^2 = x^T H x - 2 g^T x +
    ||C^-1 y||^2`` (summed over its blocks; at least 0: the expansion cancels)."""
    return np.maximum(2.0 * quadratic_objective(hessian, linear, np.asarray(x, dtype=np.float64)) + norms, 0.0)


def information_basis(models) -> np.ndarray | None:
    """The basis in which every level's information ``J`` (from its plan alone: the ``J`` of
    :func:`level_terms`) is diagonal, or None (:func:`distfit.estimate.shared_basis.shared_basis`):
    the hierarchy's passes are then d scalar trees, with no class matrices to hold."""
    return shared_basis([np.asarray(normal_equations(m, {b.block_id: np.zeros((0, b.rows)) for b in m.blocks})[0])
                         for m in models])


def level_terms(model, answers: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A level's normal equations and norms from its units' released block answers: ``(J, h,
    n)``, ``J`` the level's information (d x d), ``h`` (units x d) the linear terms
    (:func:`distfit.estimate.projection.normal_equations`) and ``n_u = ||C^-1 y_u||^2`` summed
    over the blocks (:func:`residuals`' constant)."""
    measured = recover_measurements(model, answers)
    hessian, linear = normal_equations(model, measured)
    norms = sum(np.einsum("ij,ij->i", w, w) for w in (measured[b.block_id] @ b.whitener.T for b in model.blocks))
    return np.asarray(hessian), linear, np.asarray(norms, dtype=np.float64) * np.ones(linear.shape[0])


@dataclass(frozen=True, eq=False)
class BasisTerms:
    """A level's normal equations and residuals in the levels' shared basis ``Q`` (``J = Q
    diag(lambda) Q^T``: :func:`information_basis`), from the released answers by one product per
    block and per unit (:func:`basis_terms` forms the matrices once per plan).

    ``y_b = R_b a_b`` (:func:`distfit.estimate.measurements.recover_measurements`), so the whitened
    measurement is ``w_b = C_b^-1 R_b a_b = F_b^T a_b`` (``F_b = (C_b^-1 R_b)^T``, m_b x k_b: the
    block's ``whitened_recovery``) and

        ``h~ = Q^T h = sum_b E_b^T w_b``,  ``E_b = G_b M_b Q`` (k_b x d; ``G_b = C_b^-1 B_b``),
        ``n = sum_b ||w_b||^2``,

    the same ``(J, h, n)`` as :func:`level_terms` (``h = Q h~``) without recovering ``y_b`` or
    forming ``h``: per unit ``m_b k_b + k_b d`` multiply-adds instead of ``m_b k_b + 2 k_b^2 +
    k_b d + d^2`` (PL94, one block: 143k against 238k, and the passes' ``h Q`` saved). ``h~`` is
    linear in the answers, so a parent's children's sum is ``sum_b E_b^T F_b^T (sum_c a_bc)``
    (:meth:`summed`: the leaves' upward pass, no product per leaf). The residual
    ``||C^-1 (y - B M x)||^2 = x^T J x - 2 h^T x + n = sum_k lambda_k x~_k^2 - 2 h~ . x~ + n``
    (:meth:`residuals`, ``x~ = Q^T x``: O(d) a unit, as the passes form ``x~``).
    ``information`` is ``J`` itself (d x d) and ``own`` its diagonal in ``Q`` (``lambda``, d).

    Leaves of one ``J`` (:meth:`tables`): the downward pass gives ``x_c = J^+ h_c + Q g_p`` with
    ``g_p = (G r)_p`` their parent's, so each leaf needs only ``J^+ h_c = sum_b a_bc K_b``, ``K_b =
    F_b E_b Lambda^+ Q^T`` (m_b x d: one product a leaf, ``Lambda^+`` by the passes' rank rule,
    :data:`distfit.estimate.hierarchy.PINV_RTOL`), and, with ``lambda_k lambda_k^+ = 1`` where
    kept, its residual is ``(n_c - h~_c^T Lambda^+ h~_c) + g_p^T Lambda g_p``
    (:meth:`leaf_residuals`): the first term the leaf's own least-squares residual ``||Pi w_c||^2``,
    ``Pi = I - E Lambda^+ E^T`` the projector off the measured directions, ``= ||sum_b a_bc T_b||^2``
    with ``T = F U`` (``Pi = U U^T``, ``U`` k x r, ``r = k - rank J``: 0 for PL94, whose blocks
    measure every cell: a leaf's own residual is 0 and its stored residual ``g_p^T Lambda g_p``,
    one number per parent, free of the expansion's cancellation).

    The leaves' products read only the answers ``a_S`` of the rows ``answer_rows`` of each block
    (:attr:`distfit.estimate.measurements.BlockMeasurement.answer_linear`'s choice: ``k_b`` rows
    ``S`` of ``L_b`` invertible with a bounded condition number, else every row): a released
    ``a_b = L_b y_b`` gives ``y_b = L_S^-1 a_S`` as ``R a`` does (any left inverse of ``L``), so
    ``K_b`` and ``T_b`` are formed with ``F_S = (C_b^-1 L_S^-1)^T`` (k_b x k_b), a product ``k_b /
    m_b`` the size (PL94: 252 of 319 answers). Where that ``K_b`` is the identity (``solve``
    None: the block measures every cell, ``J`` regular, and ``S`` are the cell queries, as PL94's
    are), ``J^+ h = a_S``: the released cells are the leaf's own least-squares table, and the
    product is skipped. "The identity" is to :data:`IDENTITY_ATOL` entrywise; in exact arithmetic
    it is exactly the identity, and the product would only add rounding (PL94: its entries
    differ from the identity's by 5.9e-13, the rounding of ``L_S^-1`` and of ``Q``; the tables
    differ from the product's by 1e-10 in counts up to ~500: benchmarks/README.md, session 20)."""

    basis: np.ndarray
    information: np.ndarray
    own: np.ndarray
    whiten: tuple[np.ndarray, ...]
    rotate: tuple[np.ndarray, ...]
    block_ids: tuple[str, ...]
    solve: tuple[np.ndarray | None, ...]
    unmeasured: tuple[np.ndarray, ...]
    answer_rows: tuple[slice, ...]

    def linear(self, answers: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """``(h~ (units x d), n (units,))`` of the units' answers (``{block_id: units x m_b}``)."""
        linear, norms = None, None
        for block_id, whiten, rotate in zip(self.block_ids, self.whiten, self.rotate):
            white = np.asarray(answers[block_id], dtype=np.float64) @ whiten
            part, norm = white @ rotate, np.einsum("ij,ij->i", white, white)
            linear, norms = (part, norm) if linear is None else (linear + part, norms + norm)
        return linear, norms

    def summed(self, answers: dict[str, np.ndarray], group) -> np.ndarray:
        """``sum_c h~_c`` by parent (parents x d) of the units' answers, ``group`` a
        :class:`distfit.estimate.hierarchy.Grouping` of them: the answers summed first."""
        return self.linear({b: group.sum(np.asarray(answers[b], dtype=np.float64)) for b in self.block_ids})[0]

    def tables(self, answers: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """``(J^+ h (units x d, original basis), the units' own residuals n - h~^T Lambda^+ h~
        (units,))`` of the units' answers (class docstring, leaves of one ``J``); where ``J^+ h``
        is the answers' columns ``a_S`` it is a view of them (read only)."""
        tables, own = None, None
        for block_id, rows, solve, unmeasured in zip(self.block_ids, self.answer_rows, self.solve, self.unmeasured):
            a = np.asarray(answers[block_id], dtype=np.float64)[:, rows]
            # None: K_b = I (class docstring): the answers' columns themselves, a view (the downward
            # pass adds its offsets into a new array; a copy cost 7 % of the 1M-block estimate)
            part = a if solve is None else a @ solve
            rest = a @ unmeasured
            tables, own = (part, rest) if tables is None else (tables + part, own + rest)
        return tables, np.einsum("ij,ij->i", own, own)

    def leaf_residuals(self, own: np.ndarray, offsets: np.ndarray, parent: np.ndarray) -> np.ndarray:
        """The leaves' residuals from their own (:meth:`tables`) and their parents' ``g_p``
        (``offsets``, parents x d: the downward pass's ``x_basis`` of leaves given by their tables)."""
        return self.leaf_objective(own, self.leaf_quadratic(offsets), parent)

    def leaf_quadratic(self, offsets: np.ndarray) -> np.ndarray:
        """Each parent's ``g_p^T Lambda g_p`` (parents,), the part of its leaves' residuals that is
        theirs in common (:meth:`leaf_residuals`)."""
        return np.einsum("ij,ij->i", offsets * self.own, offsets)

    @staticmethod
    def leaf_objective(own: np.ndarray, quadratic: np.ndarray, parent: np.ndarray) -> np.ndarray:
        """:meth:`leaf_residuals` from the parents' :meth:`leaf_quadratic`, at least 0."""
        return np.maximum(own + quadratic[parent], 0.0)

    def residuals(self, linear: np.ndarray, norms: np.ndarray, x_basis: np.ndarray) -> np.ndarray:
        """Each unit's own weighted squared residual (:func:`residuals`) from ``h~``, ``n`` and
        ``x~ = Q^T x`` (units x d), at least 0."""
        quadratic = np.einsum("ij,ij->i", x_basis * self.own - 2.0 * linear, x_basis)
        return np.maximum(quadratic + norms, 0.0)


def basis_terms(model, basis: np.ndarray) -> BasisTerms:
    """:class:`BasisTerms` of ``model``'s plan in ``basis`` (ValueError when its ``J`` is not
    diagonal there: the basis of other levels' plans)."""
    information = np.asarray(normal_equations(model, {b.block_id: np.zeros((0, b.rows)) for b in model.blocks})[0])
    own = diagonal_in(information, basis)
    if own is None:
        raise ValueError("basis_terms: the plan's information is not diagonal in the given basis")
    # M_b Q: the block's marginal of each column of Q (rows of Q^T), d_b x d
    rotate = tuple(b.whitened_basis @ model.marginal(np.ascontiguousarray(basis.T), b).T for b in model.blocks)
    whiten = tuple(np.ascontiguousarray(b.whitened_recovery.T) for b in model.blocks)
    kept = own > PINV_RTOL * np.abs(own).max(initial=0.0)  # the passes' rule (shared_basis._pinv)
    inverse = np.divide(1.0, own, out=np.zeros_like(own), where=kept)
    rows, subset = zip(*(_answer_recovery(b) for b in model.blocks))  # F_S: the leaves' products (class docstring)
    solve = tuple(_unless_identity(np.ascontiguousarray((w @ e * inverse) @ basis.T)) for w, e in zip(subset, rotate))
    stacked = np.concatenate(rotate)  # every block's E: the projector off the measured directions
    values, vectors = np.linalg.eigh(np.eye(stacked.shape[0]) - (stacked * inverse) @ stacked.T)
    off = np.split(vectors[:, values > 0.5], np.cumsum([e.shape[0] for e in rotate])[:-1])
    unmeasured = tuple(np.ascontiguousarray(w @ u) for w, u in zip(subset, off))
    return BasisTerms(basis, information, own, whiten, rotate, tuple(b.block_id for b in model.blocks), solve,
                      unmeasured, rows)


def _answer_recovery(block) -> tuple[slice, np.ndarray]:
    """``(S, F_S)``: the rows ``S`` of the block's answers its measurement is recovered from
    (:attr:`distfit.estimate.measurements.BlockMeasurement.answer_linear`'s choice) and ``F_S =
    (C^-1 L_S^-1)^T`` (``(C^-1 R)^T``, the ``whitened_recovery``, when ``S`` is every row)."""
    rows, _ = block.answer_linear
    if rows == slice(0, block.recon.shape[0]):
        return rows, np.ascontiguousarray(block.whitened_recovery.T)
    return rows, np.ascontiguousarray((block.whitener @ np.linalg.inv(block.recon[rows])).T)


def _unless_identity(solve: np.ndarray) -> np.ndarray | None:
    """None where ``solve`` is the identity to :data:`IDENTITY_ATOL` (:class:`BasisTerms`)."""
    square = solve.shape[0] == solve.shape[1]
    return None if square and np.abs(solve - np.eye(solve.shape[0])).max(initial=0.0) <= IDENTITY_ATOL else solve
