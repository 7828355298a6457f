"""The measurement model of a plan: what each release block measures, recovered exactly (pure numpy).

docs/design.md sections 1 and 7. Block ``b`` of a plan releases, for every unit,
``a_b = L_b (B_b x_b + z_b)`` with ``x_b = M_b x`` the unit's marginal on the block's attributes
(``M_b`` sums the full domain's cells onto the marginal's ``d_b`` cells, row-major in schema
order), ``z_b ~ N(0, Sigma_b)``. ``L_b`` (m_b x k_b) has full column rank, so any left inverse
recovers the measurement exactly: with ``R_b = L_b^+ = (L_b^T L_b)^-1 L_b^T`` (``R_b L_b = I``),

    ``y_b = R_b a_b = B_b x_b + z_b``                         (:func:`recover_measurements`)

and the estimates of every workload query from a data vector ``x`` (units x cells) are

    ``(W x)_j = sum over the rows r of the blocks with query_index[r] = j of (L_b B_b M_b x)_r``
                                                              (:func:`workload_estimates`),

the same sum by query the release forms (:func:`distfit.release.noise.query_answers`), without
the noise. Every estimate derived from one ``x`` is therefore consistent with every other.

Published estimates (:func:`published_estimates`). When every coefficient of ``W`` is
nonnegative (:func:`workload_kind`; every query kind of the spec), ``W x >= 0`` for ``x >= 0``
exactly, but a query summed from the rows of several residual blocks (coefficients of both
signs that cancel) comes out as ``-1e-13`` where it is 0 in exact arithmetic. Such a value,
negative by at most :data:`NONNEGATIVE_TOLERANCE` times ``1 + sum_c |x_c|`` (the unit's total;
the cancellation error is of order 1e-16 of it), is published as 0; nothing else is changed.

The noise metric of a block is ``Sigma_b^-1 = C_b^-T C_b^-1`` (``C_b`` the lower Cholesky
factor, the one the release draws with, :func:`distfit.release.noise.prepare_block`); the
*whitener* ``C_b^-1`` makes ``C_b^-1 (y_b - B_b x_b)`` standard normal at the true ``x``. The
model keeps per block the *whitened basis* ``G_b = C_b^-1 B_b`` and, for ``d_b <=``
:data:`DENSE_BLOCK_CELLS`, the block's *information* ``G_b^T G_b = B_b^T Sigma_b^-1 B_b``
(d_b x d_b); the projection (:mod:`distfit.estimate.projection`) builds everything from them.

Marginals are array operations on the whole chunk of units: ``M_b x`` reshapes ``x`` (units x
cells) to ``(units, n_1, ..., n_a)`` and sums the axes of the attributes not in the block
(:meth:`MeasurementModel.marginal`); ``M_b^T v`` broadcasts ``v`` (units x d_b) back over those
axes (:meth:`MeasurementModel.add_expanded`). No loop runs over units or cells; loops run over
the blocks of a plan only.
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import scipy.linalg

from distfit.mathematics.domain import Domain
from distfit.estimate.query_sums import QuerySums, add_query_sums, query_sums
from distfit.release.noise import prepare_block

__all__ = [
    "BlockMeasurement",
    "DENSE_BLOCK_CELLS",
    "cell_query_columns",
    "MeasurementModel",
    "block_measurement",
    "measurement_model",
    "model_from_blocks",
    "NONNEGATIVE_TOLERANCE",
    "WorkloadKind",
    "published_estimates",
    "query_marginal_rows",
    "recover_measurements",
    "whitened_measurements",
    "workload_estimates",
    "workload_kind",
]

#: Blocks of at most this many cells keep their information matrix ``B^T Sigma^-1 B`` dense.
DENSE_BLOCK_CELLS = 4096
#: ``R L`` may differ from the identity by this much (relative to ``||L|| ||R||``) before
#: ``L`` counts as rank deficient (measurements would not be recoverable).
RECOVERY_TOLERANCE = 1e-8
#: The model keeps the dense workload matrix ``W`` (m x cells) up to this many entries.
DENSE_WORKLOAD_ENTRIES = 1 << 22
#: Rows of ``L B`` within this distance of integers are snapped to them (0/1 query rows), so
#: the estimates of an integer ``x`` are exact integers.
INTEGER_ROW_TOLERANCE = 1e-9
#: A nonnegative workload's query estimate this far below 0, relative to ``1 + sum_c |x_c|``, is
#: rounding (module docstring) and published as 0.
NONNEGATIVE_TOLERANCE = 1e-9
#: A square subset of a block's answers recovers its measurement (``y = L_S^-1 a_S``) where
#: ``L_S`` is this well conditioned (rounding amplified at most this much: 1e-12 relative).
SUBSET_CONDITION = 1e4
#: Entries of a slab of ``W``'s rows on their own marginals (:func:`query_marginal_rows`).
WORKLOAD_SLAB = 2**22


@dataclass(frozen=True, eq=False)
class BlockMeasurement:
    """One block of a plan as a measurement of the marginal on ``attributes`` (schema order).

    ``basis`` B (k x d_b), ``recon`` L (m_b x k), ``recovery`` R = L^+ (k x m_b, ``R L = I``),
    ``sigma`` (k x k), ``whitener`` ``C^-1`` (k x k, lower triangular, ``C^-T C^-1 =
    Sigma^-1``), ``whitened_basis`` ``G = C^-1 B`` (k x d_b), ``information`` ``G^T G`` (d_b x
    d_b; None above :data:`DENSE_BLOCK_CELLS`), ``query_rows`` ``L B`` (m_b x d_b; rows within
    1e-9 of integers snapped to them), ``query_index`` (m_b,), ``drop_axes`` the schema axes the
    marginal sums out and ``expand_shape`` the marginal's shape with 1 on those axes;
    ``whitened_recovery`` ``C^-1 R`` (k x m_b): the whitened measurement ``C^-1 y = C^-1 R a``
    of the answers in one product (:func:`whitened_measurements`).
    """

    block_id: str
    attributes: tuple[str, ...]
    basis: np.ndarray
    recon: np.ndarray
    recovery: np.ndarray
    sigma: np.ndarray
    whitener: np.ndarray
    whitened_basis: np.ndarray
    information: np.ndarray | None
    query_rows: np.ndarray
    query_index: np.ndarray
    drop_axes: tuple[int, ...]
    expand_shape: tuple[int, ...]
    whitened_recovery: np.ndarray

    @property
    def cells(self) -> int:
        """``d_b``, the number of cells of the block's marginal."""
        return int(self.basis.shape[1])

    @functools.cached_property
    def answer_linear(self) -> tuple[slice, np.ndarray]:
        """``(rows, K)``: ``B^T Sigma^-1 y = a[rows] K`` from the answers ``a`` in one product
        (the projection's linear term, :func:`distfit.estimate.projection.project_nonnegative`
        with ``answers=True``). ``y = R a`` with any left inverse ``R`` of ``L``: the last (or
        first) ``k`` rows ``S`` of ``L`` where they are invertible with condition number at
        most :data:`SUBSET_CONDITION` (``R = L_S^-1`` on them: a product ``k / m_b`` the size,
        rounding amplified at most that much; PL94: the 252 cell queries of 319, 159), else
        every row (``R = L^+``); ``K = (C^-1 R)^T G``. Formed on first use."""
        k, m = self.rows, self.recon.shape[0]
        for rows in (slice(m - k, m), slice(0, k)):
            square = self.recon[rows]
            if m > k and np.linalg.cond(square) <= SUBSET_CONDITION:
                left = np.linalg.inv(square)
                return rows, (self.whitener @ left).T @ self.whitened_basis
        return slice(0, m), self.whitened_recovery.T @ self.whitened_basis

    @property
    def rows(self) -> int:
        """``k_b``, the number of basis rows (the length of the measurement ``y_b``)."""
        return int(self.basis.shape[0])


@dataclass(frozen=True, eq=False)
class MeasurementModel:
    """Every block of a plan as a measurement of the schema's domain (:func:`measurement_model`).

    ``attributes``/``sizes`` the schema, ``cells`` = prod(sizes), ``blocks`` in the plan's
    block order, ``num_queries`` m (the workload's queries, in spec order); ``workload`` the
    dense ``W = sum_b (L_b B_b M_b by query_index)`` (m x cells, entries within 1e-9 of an
    integer snapped to it) when it has at most :data:`DENSE_WORKLOAD_ENTRIES` entries, else None;
    ``cell_queries`` the first of the queries that are the cells themselves, in cell order
    (:func:`cell_query_columns`; PL94's detailed group), else None. ``derived``: what other
    modules compute from the model once and keep with it, by name (the projection's ``H``, its
    structure and the unconstrained columns: :func:`distfit.estimate.projection.prepare_projection`);
    kept on the model, not beside it, so that they travel with it when it is pickled to a worker.
    """

    attributes: tuple[str, ...]
    sizes: tuple[int, ...]
    cells: int
    blocks: tuple[BlockMeasurement, ...]
    num_queries: int
    workload: np.ndarray | None = None
    cell_queries: int | None = None
    derived: dict[str, Any] = field(default_factory=dict, init=False, repr=False)  # a copy (replace) starts empty

    @functools.cached_property
    def query_sums(self) -> QuerySums | None:
        """The rows of ``workload`` other than the cell queries (all of them without) as
        compiled sums by cell (:mod:`distfit.estimate.query_sums`) where they are sparse; None
        where a dense product is faster, or there is no dense ``workload``."""
        if self.workload is None:
            return None
        rows = np.arange(self.num_queries)
        if self.cell_queries is not None:
            rows = np.concatenate([rows[:self.cell_queries], rows[self.cell_queries + self.cells:]])
        return query_sums(self.workload, rows)

    def block(self, block_id: str) -> BlockMeasurement:
        """The block ``block_id`` (KeyError if the plan has none)."""
        for block in self.blocks:
            if block.block_id == block_id:
                return block
        raise KeyError(f"no block {block_id!r}")

    def marginal(self, x: np.ndarray, block: BlockMeasurement) -> np.ndarray:
        """``M_b x``: the block's marginal of every row of ``x`` (units x cells) -> (units x d_b).
        ``x`` itself (no copy) when the block holds every attribute."""
        if not block.drop_axes:
            return x
        units = x.shape[0]
        cube = x.reshape((units,) + self.sizes)
        return cube.sum(axis=tuple(1 + axis for axis in block.drop_axes)).reshape(units, block.cells)

    def add_expanded(self, out: np.ndarray, values: np.ndarray, block: BlockMeasurement) -> None:
        """``out += M_b^T values`` in place: ``values`` (units x d_b) copied onto every cell of
        the full domain that the marginal sums into it (``out`` units x cells, C-contiguous)."""
        units = out.shape[0]
        cube = out.reshape((units,) + self.sizes)
        cube += values.reshape((units,) + block.expand_shape)

    def domain(self) -> Domain:
        """The schema as a :class:`distfit.mathematics.domain.Domain`."""
        return Domain(self.attributes, self.sizes)


def _snap_integer_rows(rows: np.ndarray) -> np.ndarray:
    """Entries of ``L B`` within :data:`INTEGER_ROW_TOLERANCE` of an integer, as that integer
    (a 0/1 query row computed through ``L B`` carries rounding errors of order 1e-16)."""
    nearest = np.round(rows)
    close = np.abs(rows - nearest) <= INTEGER_ROW_TOLERANCE
    return np.where(close, nearest, rows)


def block_measurement(block: Any, domain: Domain) -> BlockMeasurement:
    """``block`` (anything with ``block_id, attributes, basis, recon, query_index, sigma``, e.g. a
    :class:`distfit.stores.plan.BlockRecord`) as a :class:`BlockMeasurement` of ``domain``.

    ValueError naming the field: unknown or duplicated attributes, a basis whose columns are not
    the marginal's cells, ``sigma`` not symmetric positive definite, ``recon`` without full
    column rank (the measurement could not be recovered).
    """
    block_id = str(getattr(block, "block_id", ""))
    where = f"blocks/{block_id}"
    try:
        prepared = prepare_block(block)  # validates shapes and factors Sigma (the release's C)
    except ValueError as exc:
        raise ValueError(f"{where}/{exc}") from None
    names = tuple(block.attributes)
    if len(set(names)) != len(names):
        raise ValueError(f"{where}/attributes: duplicated names in {list(names)}")
    for name in names:
        if name not in domain.names:
            raise ValueError(f"{where}/attributes: unknown attribute {name!r}; the schema has {list(domain.names)}")
    keep = [axis for axis, name in enumerate(domain.names) if name in names]
    ordered = tuple(domain.names[axis] for axis in keep)
    d_b = int(np.prod([domain.sizes[axis] for axis in keep], dtype=np.int64))
    basis, recon = prepared.basis, prepared.recon
    if basis.shape[1] != d_b:
        raise ValueError(f"{where}/basis: {basis.shape[1]} columns, but the marginal on {list(ordered)} has {d_b} cells")
    k = basis.shape[0]
    if recon.shape[0] < k:
        raise ValueError(f"{where}/recon: {recon.shape[0]} rows < {k} columns, not of full column rank")
    recovery = np.linalg.pinv(recon)
    defect = np.abs(recovery @ recon - np.eye(k)).max(initial=0.0)
    scale = np.linalg.norm(recon) * np.linalg.norm(recovery)  # Frobenius: bounds the spectral norms
    if not np.isfinite(defect) or defect > RECOVERY_TOLERANCE * max(1.0, scale):
        raise ValueError(f"{where}/recon: not of full column rank (the measurement cannot be recovered)")
    whitener = scipy.linalg.solve_triangular(prepared.factor, np.eye(k), lower=True)
    whitened = whitener @ basis
    information = whitened.T @ whitened if d_b <= DENSE_BLOCK_CELLS else None
    drop = tuple(axis for axis in range(len(domain)) if axis not in keep)
    expand = tuple(1 if axis in drop else domain.sizes[axis] for axis in range(len(domain)))
    return BlockMeasurement(
        block_id=block_id, attributes=ordered, basis=basis, recon=recon, recovery=recovery,
        sigma=np.asarray(block.sigma, dtype=np.float64), whitener=whitener, whitened_basis=whitened,
        information=information, query_rows=_snap_integer_rows(recon @ basis),
        query_index=prepared.query_index, drop_axes=drop, expand_shape=expand,
        whitened_recovery=whitener @ recovery)


def model_from_blocks(domain: Domain, blocks: Iterable[Any], num_queries: int | None = None) -> MeasurementModel:
    """A :class:`MeasurementModel` of ``blocks`` (each as :func:`block_measurement` takes it)
    over ``domain``; ``num_queries`` defaults to one past the largest query index."""
    measured = tuple(block_measurement(block, domain) for block in blocks)
    if not measured:
        raise ValueError("blocks: the plan has no blocks")
    largest = max(int(b.query_index.max(initial=-1)) for b in measured)
    m = largest + 1 if num_queries is None else int(num_queries)
    if largest >= m:
        raise ValueError(f"query_index: query {largest} outside the workload's {m} queries")
    model = MeasurementModel(attributes=tuple(domain.names), sizes=tuple(domain.sizes), cells=domain.size,
                             blocks=measured, num_queries=m)
    if m * domain.size > DENSE_WORKLOAD_ENTRIES:
        return model
    workload = np.zeros((m, domain.size))
    for block in measured:
        rows = np.zeros((block.query_rows.shape[0], domain.size))
        model.add_expanded(rows, block.query_rows, block)
        np.add.at(workload, block.query_index, rows)
    model = MeasurementModel(attributes=model.attributes, sizes=model.sizes, cells=model.cells, blocks=measured,
                             num_queries=m, workload=_snap_integer_rows(workload))
    return dataclasses.replace(model, cell_queries=cell_query_columns(model))


def measurement_model(plan: Any) -> MeasurementModel:
    """The measurement model of ``plan`` (:func:`distfit.read_plan`'s result, or anything with
    ``attrs["schema"]`` and ``iter_blocks()``; ``queries_targets`` gives m when present).
    Built once per plan; every chunk of units shares it."""
    domain = Domain.from_schema(plan.attrs["schema"])
    targets = getattr(plan, "queries_targets", None)
    return model_from_blocks(domain, plan.iter_blocks(), None if targets is None else len(targets))


def recover_measurements(model: MeasurementModel, block_answers: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``{block_id: y_b}``, ``y_b = a_b R_b^T`` (units x k_b) for the released answers ``a_b``
    (units x m_b) of every block of ``model`` (exact up to rounding: ``R_b L_b = I``).
    ValueError naming the block: missing, or answers of the wrong shape, or different unit counts."""
    return {block.block_id: answers @ block.recovery.T for block, answers in _block_answers(model, block_answers)}


def whitened_measurements(model: MeasurementModel, block_answers: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """``{block_id: C_b^-1 y_b}`` (units x k_b): the measurements of :func:`recover_measurements`
    already whitened (``C_b^-1 y_b = C_b^-1 R_b a_b``, one product with ``whitened_recovery``
    instead of two), as :func:`distfit.estimate.projection.project_nonnegative` takes them with
    ``whitened=True``; the same refusals."""
    out = {}
    for block, answers in _block_answers(model, block_answers):
        out[block.block_id] = answers @ block.whitened_recovery.T
    return out


def _block_answers(model: MeasurementModel,
                   block_answers: Mapping[str, Any]) -> list[tuple[BlockMeasurement, np.ndarray]]:
    """``(block, answers as float64)`` for every block of ``model``, checked (recover_measurements)."""
    out = []
    units = None
    for block in model.blocks:
        if block.block_id not in block_answers:
            raise ValueError(f"block_answers: no answers for block {block.block_id!r}")
        answers = np.asarray(block_answers[block.block_id], dtype=np.float64)
        if answers.ndim != 2 or answers.shape[1] != block.recon.shape[0]:
            raise ValueError(f"block_answers[{block.block_id!r}]: shape {answers.shape}, expected (units, {block.recon.shape[0]})")
        if units is not None and answers.shape[0] != units:
            raise ValueError(f"block_answers[{block.block_id!r}]: {answers.shape[0]} units, other blocks have {units}")
        units = answers.shape[0]
        out.append((block, answers))
    return out


def workload_estimates(model: MeasurementModel, x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``W x`` (units x m): every workload query's estimate from the data vectors ``x`` (units x
    cells), the sum by ``query_index`` of the rows ``L_b B_b M_b x`` of every block.

    With the model's dense ``workload`` this is ``x W^T``: for integer ``x`` and 0/1 (integer)
    queries every product and partial sum is an integer below 2**53, so the estimates are exact
    integers, and consistent with each other (one ``x``). The queries that are the cells
    themselves (``cell_queries``) are ``x`` copied, exactly, and only the other rows of ``W``
    multiplied (PL94: 67 of 319 rows; published estimates of 4096 units in 2.0 us a unit instead
    of 3.6, CPU, one thread), as compiled sums by cell where they are sparse
    (:attr:`MeasurementModel.query_sums`; PL94's 4.5 % nonzero: 0.63 us a unit in a chunk task
    against 1.45 for the dense product). Without it (a domain too large), the block rows are
    summed, whose coefficients need not be integers (a query split over residual blocks):
    integers up to rounding then.

    ``out`` (units x m float64, with cell queries only): written and returned; where ``x`` is
    already its cell columns (``out[:, cell_queries:cell_queries + cells]``, as
    :func:`distfit.estimate.job.estimate_chunk` has the projection write it) they are not copied.
    """
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[1] != model.cells:
        raise ValueError(f"x: shape {x.shape}, expected (units, {model.cells})")
    if model.workload is not None and model.cell_queries is not None:
        start, stop = model.cell_queries, model.cell_queries + model.cells
        if out is None:
            out = np.empty((x.shape[0], model.num_queries))
        elif out.shape != (x.shape[0], model.num_queries) or out.dtype != np.float64:
            raise ValueError(f"out: {out.dtype} {out.shape}, expected float64 {(x.shape[0], model.num_queries)}")
        columns = out[:, start:stop]
        if not (columns.__array_interface__["data"][0] == x.__array_interface__["data"][0]
                and columns.strides == x.strides):
            columns[...] = x
        if model.query_sums is not None:
            add_query_sums(model.query_sums, x, out)
        else:
            out[:, :start] = x @ model.workload[:start].T
            out[:, stop:] = x @ model.workload[stop:].T
        return out
    if out is not None:
        raise ValueError("out: only a workload with cell queries writes into a given array")
    if model.workload is not None and model.query_sums is not None:
        out = np.empty((x.shape[0], model.num_queries))
        add_query_sums(model.query_sums, x, out)
        return out
    if model.workload is not None:
        return x @ model.workload.T
    out = np.zeros((x.shape[0], model.num_queries))
    for block in model.blocks:
        rows = model.marginal(x, block) @ block.query_rows.T
        qi = block.query_index
        if np.unique(qi).size == qi.size:
            out[:, qi] += rows
        else:
            np.add.at(out, (slice(None), qi), rows)
    return out


def cell_query_columns(model: MeasurementModel) -> int | None:
    """``start`` where the workload's queries ``start .. start + cells - 1`` are the cells
    themselves, in cell order (row ``start + c`` of ``W`` is the unit vector of cell ``c``: a
    "detailed" query group, as PL94's), so that ``(W x)[start + c] = x_c`` exactly (one
    coefficient 1, the others 0); None where the workload has no such run of rows (or no dense ``W``)."""
    w = model.workload
    if w is None or w.shape[0] < model.cells:
        return None
    unit = (np.count_nonzero(w, axis=1) == 1) & (w.max(axis=1) == 1.0)
    cell = np.argmax(w, axis=1)
    expected = np.arange(model.cells)
    for start in np.flatnonzero(unit & (cell == 0)):
        if start + model.cells <= w.shape[0] and unit[start:start + model.cells].all() \
                and np.array_equal(cell[start:start + model.cells], expected):
            return int(start)
    return None


@dataclass(frozen=True)
class WorkloadKind:
    """``integral``: every coefficient of ``W`` is an integer (to :data:`INTEGER_ROW_TOLERANCE`),
    so the estimates of an integer ``x`` are integers; ``nonnegative``: every coefficient is
    ``>= -INTEGER_ROW_TOLERANCE``, so ``W x >= 0`` for ``x >= 0``."""

    integral: bool
    nonnegative: bool


def _kind_of(w: np.ndarray) -> WorkloadKind:
    return WorkloadKind(integral=bool(np.allclose(w, np.rint(w), rtol=0.0, atol=INTEGER_ROW_TOLERANCE)),
                        nonnegative=bool(w.min(initial=0.0) >= -INTEGER_ROW_TOLERANCE))


def workload_kind(model: MeasurementModel) -> WorkloadKind:
    """What the workload's coefficients are (:class:`WorkloadKind`). Read off the model's dense
    ``workload`` when it keeps one; at once when every block's query rows ``L_b B_b`` are
    nonnegative integers (sums of such rows); else from each query's row of ``W`` on its own
    marginal (:func:`query_marginal_rows`), never over the domain's cells: the coefficient of
    ``W_j`` at a cell is the entry of that row at the cell's restriction, so the two rows have
    the same set of values."""
    if model.workload is not None:
        return _kind_of(model.workload)
    rows = [_kind_of(block.query_rows) for block in model.blocks]
    if all(kind.integral and kind.nonnegative for kind in rows):
        return WorkloadKind(integral=True, nonnegative=True)
    integral = nonnegative = True
    for _queries, _axes, table in query_marginal_rows(model):
        slab = _kind_of(table)
        integral, nonnegative = integral and slab.integral, nonnegative and slab.nonnegative
        if not (integral or nonnegative):
            break
    return WorkloadKind(integral=integral, nonnegative=nonnegative)


def query_marginal_rows(model: MeasurementModel) -> Iterator[tuple[np.ndarray, tuple[int, ...], np.ndarray]]:
    """``(queries, axes, table)`` slabs covering every workload query once: ``table`` (len(queries)
    x prod(sizes[axes])) holds rows ``queries`` of ``W = sum_b (L_b B_b M_b by query_index)``
    restricted to the marginal on ``axes`` (schema axes, ascending), the union ``U_j`` of the
    attributes of the blocks that sum into query ``j``: ``W_j = T_j M_U``, since every block's
    rows ``L_b B_b M_b = (L_b B_b M_{b|U}) M_U`` for ``b``'s attributes within ``U``.

    Queries of one union are taken together, at most :data:`WORKLOAD_SLAB` entries a table
    (a single query's row on ``U`` may exceed it: it is then taken alone; it is no larger than
    the blocks that measure ``U``). Nothing proportional to the domain's cells is formed.
    Loops run over the blocks and the distinct unions, not over queries or cells."""
    naxes = len(model.sizes)
    words = max(1, -(-naxes // 64))
    union = np.zeros((model.num_queries, words), dtype=np.uint64)  # bit a of U_j: attribute a
    measured = np.zeros(model.num_queries, dtype=bool)
    for block in model.blocks:
        bits = np.zeros(words, dtype=np.uint64)
        for axis in range(naxes):
            if axis not in block.drop_axes:
                bits[axis // 64] |= np.uint64(1) << np.uint64(axis % 64)
        np.bitwise_or.at(union, block.query_index, bits)
        measured[block.query_index] = True
    distinct, group = np.unique(union, axis=0, return_inverse=True)
    group = group.reshape(-1)
    order = np.argsort(group, kind="stable")
    starts = np.searchsorted(group[order], np.arange(len(distinct) + 1))
    contributors: list[list[int]] = [[] for _ in range(len(distinct))]
    for b, block in enumerate(model.blocks):
        for g in np.unique(group[block.query_index]):
            contributors[int(g)].append(b)
    for g, bits in enumerate(distinct):
        queries = order[starts[g]:starts[g + 1]]
        queries = queries[measured[queries]]
        if not queries.size:
            continue
        axes = tuple(axis for axis in range(naxes) if int(bits[axis // 64]) >> (axis % 64) & 1)
        shape = tuple(model.sizes[axis] for axis in axes)
        cells = int(np.prod(shape, dtype=np.int64))
        step = max(1, WORKLOAD_SLAB // max(cells, 1))
        position = np.full(model.num_queries, -1, dtype=np.int64)
        for first in range(0, queries.size, step):
            slab = queries[first:first + step]
            position[slab] = np.arange(slab.size)
            table = np.zeros((slab.size,) + shape)
            for b in contributors[g]:
                block = model.blocks[b]
                where = position[block.query_index]
                take = np.flatnonzero(where >= 0)
                if not take.size:
                    continue
                lifted = tuple(1 if axis in block.drop_axes else model.sizes[axis] for axis in axes)
                rows = block.query_rows[take].reshape((take.size,) + lifted)
                np.add.at(table, where[take], np.broadcast_to(rows, (take.size,) + shape))
            position[slab] = -1
            yield slab, axes, _snap_integer_rows(table.reshape(slab.size, cells))


def published_estimates(model: MeasurementModel, x: np.ndarray, kind: WorkloadKind, *,
                        integer: bool = False, out: np.ndarray | None = None) -> np.ndarray:
    """The query estimates a store publishes from the tables ``x >= 0`` (units x cells):
    :func:`workload_estimates`, with a nonnegative workload's rounding below 0 (at most
    :data:`NONNEGATIVE_TOLERANCE` ``(1 + sum_c |x_c|)``) set to 0 (module docstring); with
    ``integer`` (integer ``x``) and an integral workload, as int64. ``out``: as
    :func:`workload_estimates`'s."""
    queries = workload_estimates(model, x, out)
    # with a dense W >= 0 every estimate of x >= 0 is a sum of nonnegative terms, never below 0
    # (nothing to look at: 0.13 us a unit on PL94); the blocks' rows can cancel to -1e-13
    check = kind.nonnegative and model.workload is None
    negative = np.flatnonzero((queries < 0).any(axis=1)) if check else ()
    if len(negative):  # only the units with a negative estimate need their totals (most have none)
        rows = queries[negative]
        slack = NONNEGATIVE_TOLERANCE * (1.0 + np.abs(np.asarray(x[negative], dtype=np.float64)).sum(axis=1,
                                                                                                      keepdims=True))
        queries[negative] = np.where((rows < 0) & (rows >= -slack), 0.0, rows)
    if integer and kind.integral:
        queries = np.rint(queries).astype(np.int64)
    return queries
