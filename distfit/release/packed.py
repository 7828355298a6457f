"""Releasing packed blocks in bulk (pure numpy): every block of a pack in a few array operations.

A pack (:class:`distfit.mathematics.packing.PackedBlocks`) holds closed-form residual blocks: block ``b``
with attributes ``S`` (sizes ``n_1 .. n_r``) has basis ``B_S = kron_i D_i`` (``D_i`` the
(n_i - 1) x n_i difference matrix, rows ``e_j - e_{j+1}``) and covariance ``Sigma_b = s_b B_S
B_S^T``. For a chunk of units the release of the pack is, per unit and block (docs/design.md
section 1, packed layout of :mod:`distfit.stores.release`),

    ``y_b = B_S x_S + z_b``,   ``z_b = sqrt(s_b) C_S xi_b``,   ``xi_b ~ N(0, I_k)``,

with ``C_S = kron_i C_i`` and ``C_i`` the lower Cholesky factor of ``D_i D_i^T`` (the
tridiagonal matrix with 2 on the diagonal and -1 beside it). ``C_S`` is lower triangular with a
positive diagonal and ``C_S C_S^T = kron_i D_i D_i^T = B_S B_S^T``, so ``sqrt(s_b) C_S`` *is*
the Cholesky factor of ``Sigma_b`` (docs/design.md section 3's ``z = chol(Sigma) xi``) and
``Cov(z_b) = Sigma_b`` exactly; a block released one group at a time
(:func:`distfit.release.noise.noisy_block_measurements`) computes ``xi_b @ chol(Sigma_b)^T``,
the same matrix up to rounding (1e-15 relative). Nothing forms ``B_S``, ``C_S`` or ``Sigma_b``:
``B_S x`` is a difference along each axis of the block's marginal (``x_j - x_{j+1}``, in int64:
exact), and ``C_S xi`` one small matrix product per axis, both for all blocks of the same sizes
at once.

The query answers: block ``b``'s rows for an identity marginal ``A`` (a segment) are
``kappa * R_S[x|S]`` (``R_S = kron_i D_i^+``, ``kappa = d_S / d_A``; :mod:`distfit.mathematics.packing`),
so it adds ``kappa * (R_S y_b)[x|S]`` to query ``q + x`` for every cell ``x`` of ``A``: one
product with ``D_i^+`` per axis, broadcast over the axes of ``A`` not in ``S``, added into the
columns of the marginal's queries, for all segments of the same shapes at once.

Noise streams (docs/design.md section 3): pack ``p`` (its position in the plan's sorted pack ids)
draws every block's ``xi`` for chunk ``c`` from one stream, :func:`pack_stream` ``=
default_rng(SeedSequence(entropy, spawn_key=(PACK_STREAM, p, c)))``, ``PACK_STREAM = 2**32 -
1``: a three-word key, where a block's key ``(b, c)`` has two words, so no pack stream is a
block's stream. The draw is ``standard_normal((units, K))``, block ``b``'s ``xi`` the columns
``offsets[b]:offsets[b + 1]`` (the pack's measurement columns, :func:`pack_offsets`). A retried
task redraws the same noise; every chunk is independent of the others.

Work is cut into batches of blocks (:data:`BATCH_ELEMENTS` numbers per temporary) so that a
chunk of a pack of 500,000 blocks needs memory of the order of its output only. Loops run over
the groups of equal shapes and their batches, never over blocks, units or cells.
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable, Sequence

import numpy as np

from distfit.mathematics.packing import PackedBlocks, block_cells, residual_reconstruction, segment_kappa

__all__ = [
    "AnswerGroup",
    "BATCH_ELEMENTS",
    "MeasureGroup",
    "PACK_STREAM",
    "PreparedPack",
    "block_sources",
    "pack_answers",
    "pack_measurements",
    "pack_offsets",
    "pack_query_rows",
    "pack_stream",
    "prepare_pack",
]

#: The first word of a pack's noise-stream key (module docstring).
PACK_STREAM = 2**32 - 1
#: Numbers per temporary array of a batch (about 32 MiB of float64).
BATCH_ELEMENTS = 1 << 22


def pack_stream(entropy: int, pack_index: int, chunk_index: int) -> np.random.Generator:
    """The noise stream of pack ``pack_index`` and chunk ``chunk_index`` (module docstring):
    ``default_rng(SeedSequence(entropy, spawn_key=(PACK_STREAM, pack_index, chunk_index)))``."""
    for name, value in (("entropy", entropy), ("pack_index", pack_index), ("chunk_index", chunk_index)):
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
            raise ValueError(f"{name}: expected a non-negative integer, got {value!r}")
    return np.random.default_rng(np.random.SeedSequence(int(entropy), spawn_key=(PACK_STREAM, int(pack_index),
                                                                                 int(chunk_index))))


@functools.lru_cache(maxsize=256)
def _axis_factors(n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(C, D^+)`` of one attribute of size ``n``: ``C`` the lower Cholesky factor of ``D D^T``
    ((n - 1) x (n - 1)), ``D^+`` the pseudo-inverse of ``D`` (n x (n - 1), the factor of
    :func:`distfit.mathematics.packing.residual_reconstruction`). Read-only."""
    d = np.eye(n - 1, n) - np.eye(n - 1, n, k=1)
    chol = np.linalg.cholesky(d @ d.T)
    pinv = np.array(residual_reconstruction((n,)))
    for arr in (chol, pinv):
        arr.setflags(write=False)
    return chol, pinv


#: Widths up to which :func:`_along` adds scaled slices rather than calling a matrix product
#: (numpy's products are slow on an inner dimension of 1 or 2, the attributes of size 2 or 3).
SLICE_WIDTH = 8


def _along(values: np.ndarray, matrix: np.ndarray, axis: int) -> np.ndarray:
    """``matrix`` applied along ``axis`` of ``values`` (``out[.., i, ..] = sum_j M[i, j] v[.., j, ..]``)."""
    if matrix.shape[1] > SLICE_WIDTH:
        return np.moveaxis(np.tensordot(values, matrix, axes=([axis], [1])), -1, axis)
    shape = [1] * values.ndim
    shape[axis] = matrix.shape[0]
    out = None
    for j in range(matrix.shape[1]):
        term = matrix[:, j].reshape(shape) * values[(slice(None),) * axis + (slice(j, j + 1),)]
        out = term if out is None else out.__iadd__(term)
    return out


def pack_offsets(pack: PackedBlocks, sizes: Sequence[int]) -> np.ndarray:
    """(n + 1,) int64: block ``b``'s ``k_b = prod_{i in S}(n_i - 1)`` measurement columns are
    ``offsets[b]:offsets[b + 1]`` (pack order)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    attributes = np.asarray(pack.attributes, dtype=np.int64).reshape(len(pack), -1)
    k = np.prod(np.where(attributes >= 0, sizes[np.maximum(attributes, 0)] - 1, 1), axis=1, dtype=np.int64)
    return np.concatenate([[0], np.cumsum(k)]).astype(np.int64)


def pack_query_rows(pack: PackedBlocks, sizes: Sequence[int]) -> np.ndarray:
    """(R,) int64: the query of every row of the pack's blocks (segment ``j``'s rows are its
    marginal's queries ``q_j .. q_j + d_A - 1``), in pack and segment order."""
    cells = block_cells(np.asarray(sizes, dtype=np.int64), pack.segment_clique)
    starts = np.repeat(pack.segment_query - (np.cumsum(cells) - cells), cells)
    return (starts + np.arange(int(cells.sum()), dtype=np.int64)).astype(np.int64)


def _rows(positions: np.ndarray) -> list[tuple[int, ...]]:
    """Each row of a -1 padded position matrix as a tuple of its positions."""
    return [tuple(p for p in row if p >= 0) for row in np.asarray(positions).tolist()]


def block_sources(pack: PackedBlocks) -> tuple[tuple[tuple[int, ...], ...], np.ndarray]:
    """Where each block's marginal is read from: ``(sources, source_of)``, ``sources`` the
    distinct marginals (schema positions) read, ``source_of`` (n,) the index of block ``b``'s.
    A block reads the largest of its segments' marginals (the first of them on a tie): a
    workload marginal, which a data store tabulated for the plan holds as it is (a stored clique
    is never inside another, so the largest is the likeliest to be stored), and which the
    pack's other blocks of that marginal share."""
    clique = np.asarray(pack.segment_clique)
    width = (clique >= 0).sum(axis=1)
    offsets = pack.segment_offsets
    owner = pack.segment_block
    # per block, the first segment of largest width (lexsort: block, then -width, then position)
    order = np.lexsort((np.arange(width.size), -width, owner))
    chosen = order[offsets[:-1]]
    keys = _rows(clique[chosen])
    index: dict[tuple[int, ...], int] = {}
    source_of = np.fromiter((index.setdefault(key, len(index)) for key in keys), dtype=np.int64, count=len(keys))
    return tuple(index), source_of


@dataclass(frozen=True, eq=False)
class MeasureGroup:
    """Blocks measured alike: the same source shape and the same kept axes of it.
    ``blocks`` (g,) positions in the pack, ``sources`` (g,) their source indices,
    ``columns`` (g,) their first measurement column, ``root_scale`` (g,) ``sqrt(s_b)``."""

    source_shape: tuple[int, ...]
    keep: tuple[int, ...]
    blocks: np.ndarray
    sources: np.ndarray
    columns: np.ndarray
    root_scale: np.ndarray

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.source_shape[a] for a in self.keep)


@dataclass(frozen=True, eq=False)
class AnswerGroup:
    """Segments answered alike: blocks of sizes ``shape`` into marginals of sizes
    ``clique_shape``, the block's axes at ``keep`` of the marginal's. ``columns`` (g,) the
    block's first measurement column, ``kappa`` (g,), ``slots`` (g,) the marginal's position
    among the pack's marginals of that shape (``PreparedPack.marginals``); ``distinct``: no
    marginal appears twice in the group (then a plain scatter adds)."""

    shape: tuple[int, ...]
    clique_shape: tuple[int, ...]
    keep: tuple[int, ...]
    columns: np.ndarray
    kappa: np.ndarray
    slots: np.ndarray
    distinct: bool


@dataclass(frozen=True, eq=False)
class PreparedPack:
    """A pack made ready to release chunks (:func:`prepare_pack`), once per worker:
    ``pack_id`` and ``pack_index`` (its stream), ``offsets`` (n + 1,) its measurement columns,
    ``sources`` the marginals read (schema positions; :func:`block_sources`) and their
    ``source_shapes`` (sizes), the groups, and ``marginals``: per marginal shape, the first
    query of each of the pack's marginals of that shape (sorted), whose rows
    :func:`pack_answers` sums in a buffer before adding them to the answers."""

    pack_id: str
    pack_index: int
    offsets: np.ndarray
    sources: tuple[tuple[int, ...], ...]
    source_shapes: tuple[tuple[int, ...], ...]
    measure: tuple[MeasureGroup, ...]
    answer: tuple[AnswerGroup, ...]
    marginals: dict = field(default_factory=dict)  # clique shape -> (C,) sorted first queries

    @property
    def width(self) -> int:
        """K: the measurement columns of the whole pack."""
        return int(self.offsets[-1])

    def __len__(self) -> int:
        return int(self.offsets.size - 1)


def _group_by(keys: list) -> list[tuple]:
    """``(key, indices)`` per distinct key, in order of first appearance."""
    groups: dict = {}
    for i, key in enumerate(keys):
        groups.setdefault(key, []).append(i)
    return [(key, np.asarray(idx, dtype=np.int64)) for key, idx in groups.items()]


def prepare_pack(pack: PackedBlocks, sizes: Sequence[int], pack_id: str = "", pack_index: int = 0) -> PreparedPack:
    """Group ``pack``'s blocks and segments by shape for :func:`pack_measurements` and
    :func:`pack_answers` (``sizes``: the schema's attribute sizes)."""
    sizes = np.asarray(sizes, dtype=np.int64)
    offsets = pack_offsets(pack, sizes)
    sources, source_of = block_sources(pack)
    blocks = _rows(pack.attributes)
    root = np.sqrt(np.asarray(pack.scale, dtype=np.float64))
    measure_keys = []
    for block, src in zip(blocks, source_of.tolist()):
        source = sources[src]
        measure_keys.append((tuple(int(sizes[p]) for p in source), tuple(source.index(p) for p in block)))
    measure = tuple(
        MeasureGroup(source_shape=key[0], keep=key[1], blocks=idx, sources=source_of[idx], columns=offsets[idx],
                     root_scale=root[idx])
        for key, idx in _group_by(measure_keys))
    owner = pack.segment_block
    cliques = _rows(pack.segment_clique)
    kappa = segment_kappa(sizes, pack.attributes, pack.segment_offsets, pack.segment_clique)
    answer_keys = []
    for clique, b in zip(cliques, owner.tolist()):
        block = blocks[b]
        answer_keys.append((tuple(int(sizes[p]) for p in block), tuple(int(sizes[p]) for p in clique),
                            tuple(clique.index(p) for p in block)))
    grouped = _group_by(answer_keys)
    marginals: dict[tuple[int, ...], np.ndarray] = {}
    for key, idx in grouped:
        marginals[key[1]] = np.concatenate([marginals.get(key[1], np.zeros(0, np.int64)), pack.segment_query[idx]])
    marginals = {shape: np.unique(first) for shape, first in marginals.items()}
    answer = []
    for key, idx in grouped:
        slots = np.searchsorted(marginals[key[1]], pack.segment_query[idx])
        order = np.argsort(slots, kind="stable")  # in slot order: a group holding every marginal once adds by slices
        idx, slots = idx[order], slots[order]
        answer.append(AnswerGroup(shape=key[0], clique_shape=key[1], keep=key[2], columns=offsets[owner[idx]],
                                  kappa=kappa[idx], slots=slots, distinct=bool(np.bincount(slots).max(initial=0) <= 1)))
    return PreparedPack(pack_id=pack_id, pack_index=int(pack_index), offsets=offsets, sources=sources,
                        source_shapes=tuple(tuple(int(sizes[p]) for p in src) for src in sources), measure=measure,
                        answer=tuple(answer), marginals=marginals)


def _batches(count: int, per_item: int) -> list[slice]:
    """Slices of ``range(count)`` with at most :data:`BATCH_ELEMENTS` numbers each (one item at least)."""
    step = max(1, BATCH_ELEMENTS // max(1, per_item))
    return [slice(i, min(i + step, count)) for i in range(0, count, step)]


def pack_measurements(prepared: PreparedPack, read: Callable[[int], np.ndarray], units: int,
                      noise: np.ndarray | None = None) -> np.ndarray:
    """The pack's measurements for a chunk of units: ``B_S x_S + sqrt(s_b) C_S xi_b`` of every
    block, (units, K) float64, block ``b`` in columns ``offsets[b]:offsets[b + 1]``.

    ``read(i)`` gives the chunk's counts on ``prepared.sources[i]`` (units x cells, int64,
    row-major in schema order; called once per source). ``noise``: the draw ``xi`` (units, K),
    e.g. ``pack_stream(...).standard_normal((units, K))``; it is overwritten with the result
    (no second array of that size). ``noise=None`` gives the noiseless ``B_S x_S`` (for
    validation only: the true measurements never go into a release)."""
    width = prepared.width
    if noise is None:
        out = np.zeros((units, width))
    else:
        out = noise
        if out.shape != (units, width) or out.dtype != np.float64:
            raise ValueError(f"noise: shape {out.shape} dtype {out.dtype}, expected ({units}, {width}) float64")
    counts: dict[int, np.ndarray] = {}

    def source(i: int) -> np.ndarray:
        if i not in counts:
            arr = np.asarray(read(i))
            cells = math.prod(prepared.source_shapes[i])
            if arr.shape != (units, cells):
                raise ValueError(f"counts of the marginal {list(prepared.sources[i])}: shape {arr.shape}, "
                                 f"expected ({units}, {cells})")
            counts[i] = arr.astype(np.int64, copy=False)
        return counts[i]

    for group in prepared.measure:
        shape = group.shape
        k = math.prod(n - 1 for n in shape)
        drop = tuple(2 + a for a in range(len(group.source_shape)) if a not in group.keep)
        for batch in _batches(group.blocks.size, units * math.prod(group.source_shape)):
            g = batch.stop - batch.start
            x = np.stack([source(i) for i in group.sources[batch].tolist()], axis=1)
            x = x.reshape((units, g) + group.source_shape)
            if drop:
                x = x.sum(axis=drop)
            for axis in range(2, 2 + len(shape)):  # D x along each axis: x_j - x_{j+1}, exact in int64
                head = (slice(None),) * axis
                x = x[head + (slice(None, -1),)] - x[head + (slice(1, None),)]
            cols = group.columns[batch][:, None] + np.arange(k)
            if noise is None:
                out[:, cols] = x.reshape(units, g, k)
                continue
            z = out[:, cols].reshape((units, g) + tuple(n - 1 for n in shape))
            for a, n in enumerate(shape):
                z = _along(z, _axis_factors(n)[0], 2 + a)
            z = z.reshape(units, g, k)
            z *= group.root_scale[batch][None, :, None]
            z += x.reshape(units, g, k)
            out[:, cols] = z
    return out


def pack_answers(prepared: PreparedPack, measurements: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Add every row of the pack's blocks into ``out`` (units x m, the query answers): query
    ``q + x`` of a segment gets ``kappa * (R_S y_b)[x|S]`` (module docstring). Returns ``out``."""
    units = measurements.shape[0]
    if measurements.shape != (units, prepared.width) or out.ndim != 2 or out.shape[0] != units:
        raise ValueError(f"measurements {measurements.shape} / answers {out.shape}: expected "
                         f"({units}, {prepared.width}) / ({units}, m)")
    # per marginal shape, (marginals, units, *shape): a segment adds a contiguous block of units x cells
    sums = {shape: np.zeros((first.size, units) + shape) for shape, first in prepared.marginals.items()}
    for group in prepared.answer:
        shape, clique = group.shape, group.clique_shape
        k = math.prod(n - 1 for n in shape)
        spread = tuple(clique[a] if a in group.keep else 1 for a in range(len(clique)))
        for batch in _batches(group.columns.size, units * max(math.prod(clique), k)):
            g = batch.stop - batch.start
            cols = group.columns[batch][:, None] + np.arange(k)
            w = measurements[:, cols].reshape((units, g) + tuple(n - 1 for n in shape))
            for a, n in enumerate(shape):
                w = _along(w, _axis_factors(n)[1], 2 + a)
            w *= group.kappa[batch].reshape((1, g) + (1,) * len(shape))
            w = np.moveaxis(w.reshape((units, g) + spread), 1, 0)  # broadcast over the marginal's other axes
            slots = group.slots[batch]
            if group.distinct and slots[-1] - slots[0] == g - 1:  # consecutive marginals: a slice, no gather
                sums[clique][slots[0]:slots[-1] + 1] += w
            elif group.distinct:
                sums[clique][slots] += w
            else:
                np.add.at(sums[clique], slots, np.broadcast_to(w, (g, units) + clique))
    for shape, first in prepared.marginals.items():  # each marginal's cells are its queries q .. q + d_A - 1
        d_a = math.prod(shape)
        rows = (first[:, None] + np.arange(d_a)).ravel()
        flat = np.moveaxis(sums.pop(shape).reshape(first.size, units, d_a), 1, 0).reshape(units, -1)
        if np.bincount(rows).max(initial=0) <= 1:
            out[:, rows] += flat
        else:
            np.add.at(out, (slice(None), rows), flat)
    return out
