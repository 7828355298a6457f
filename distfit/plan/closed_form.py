"""Closed-form residual blocks of identity marginals: optimal without SM-II (docs/design.md section 2).

A residual block S (basis ``B_S = kron_{i in S} D_i``, k = prod (n_i - 1) rows, d_S = prod n_i
cells) whose rows all come from identity marginals A (every attribute of A queried by
``identity``, one target c_A per marginal) has rows ``kappa_A e_x^T B_S^+`` (x a cell of A
restricted to S, ``kappa_A = prod_{i in A minus S} 1 / n_i``), one *segment* per marginal
(:mod:`distfit.mathematics.packing`). Its optimal covariance is ``Sigma_S = sigma B_S B_S^T``:

**Proof (symmetry and Schur's lemma).** Let G = prod_{i in S} Sym(n_i) permute the values of
S's attributes; g acts on the cells of the S-marginal by a permutation matrix Pi_g. The block's
constraint set {(row, target)} is G-invariant: a segment's rows are all the ``kappa_A e_x^T
B^+`` (each x repeated d_A / d_S times), and ``e_x^T B^+ B Pi_g = e_{gx}^T B^+ B`` since
``B^+ B = P_S = kron_i (I - 1 1^T / n_i)`` commutes with Pi_g. Write a covariance as
``Sigma = B M B^T`` with M symmetric on ``range(P_S)`` (``M = B^+ Sigma B^+T``); the row
variance is ``kappa^2 e_x^T P_S M P_S e_x`` and the profile ``e_x^T P_S M^+ P_S e_x``, so
``M -> Pi_g M Pi_g^T`` permutes the constraints and the profile. Problem 1 is convex in
``X = M^+`` on ``range(P_S)`` (profile linear, variances ``l^T X^+ l`` convex), so the average
of an optimal X over G is feasible and optimal, and it commutes with every Pi_g on
``range(P_S) = kron_i 1^perp``. That space is the tensor product of the standard
representations of the Sym(n_i), each absolutely irreducible, so it is an irreducible
representation of the product group, and by Schur's lemma the commuting X is a multiple of
P_S: ``M = sigma P_S``, ``Sigma = sigma B P_S B^T = sigma B B^T``.

**The closed forms** (``c_S = k / d_S = prod_{i in S} (1 - 1/n_i)``, the diagonal of P_S):
row variance ``sigma kappa^2 c_S``, profile ``c_S / sigma`` on every cell (flat), so
``alpha_S = c_S / sigma``. Meeting every segment's target: ``sigma = min_A c_A / (kappa_A^2
c_S)``. The dual point u uniform on the cells and v uniform on the rows of the binding segment
(largest ``kappa^2 / c``) proves it optimal: ``|| diag(sqrt(v / c)) L B diag(sqrt(u)) ||_*^2 =
kappa^2 k^2 / (d_S^2 c) = alpha_S`` (the stacked rows are ``P_S`` up to a scalar, whose k
singular values are equal). ``distfit.mathematics.packing.PackedBlocks.closed_form`` states the same numbers
for the stored blocks.

So these blocks need no SM-II, no dual iterations and no task: ``ClosedFormBlocks.of``
computes every block's shape at once from arrays over the blocks and segments, and only the
scale allocation (``allocate``) couples them to the rest of the plan (their rows in it:
``ClosedRows``). Their shapes do not
depend on how a query's target is shared, so refinement rounds never re-solve them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np

from distfit.mathematics.packing import PackedBlocks, QueryRuns, segment_cells, segment_kappa


@dataclass(frozen=True, eq=False)
class ClosedFormBlocks:
    """Closed-form blocks at their unscaled shapes (module docstring), as arrays.

    ``attributes`` (n, r) schema positions (ascending, -1 padded); block b's segments are
    ``segment_offsets[b]:segment_offsets[b + 1]`` with the marginal ``segment_clique`` (schema
    positions), its first query ``segment_query`` (its cells are the queries ``q .. q + cells -
    1``) and its target ``segment_target``. ``scale`` is sigma (``Sigma = sigma B B^T`` meets every
    target, the binding segment exactly), ``alpha = c_S / sigma`` and ``segment_variance`` every
    row's variance at that scale; ``lower_bound`` is alpha (the closed form is optimal).
    """

    sizes: np.ndarray
    attributes: np.ndarray
    segment_offsets: np.ndarray
    segment_clique: np.ndarray
    segment_query: np.ndarray
    segment_target: np.ndarray
    scale: np.ndarray
    alpha: np.ndarray
    segment_variance: np.ndarray

    @classmethod
    def of(cls, sizes: Sequence[int], attributes: np.ndarray, segment_offsets: np.ndarray,
           segment_clique: np.ndarray, segment_query: np.ndarray, segment_target: np.ndarray) -> ClosedFormBlocks:
        """Every block's shape at once: ``sigma_S = 1 / max_A kappa_A^2 c_S / c_A`` (module docstring)."""
        sizes = np.asarray(sizes, dtype=np.int64)
        attributes = np.asarray(attributes, dtype=np.int64).reshape(len(segment_offsets) - 1, -1)
        offsets = np.asarray(segment_offsets, dtype=np.int64)
        clique = np.asarray(segment_clique, dtype=np.int64).reshape(int(offsets[-1]), -1)
        target = np.asarray(segment_target, dtype=float)
        fraction = _fraction(sizes, attributes)
        owner = np.repeat(np.arange(attributes.shape[0]), np.diff(offsets))
        kappa = segment_kappa(sizes, attributes, offsets, clique)
        ratio = kappa**2 * fraction[owner] / target  # variance / target at sigma = 1
        worst = np.maximum.reduceat(ratio, offsets[:-1]) if ratio.size else np.zeros(0)
        scale = 1.0 / worst
        return cls(sizes, attributes, offsets, clique, np.asarray(segment_query, dtype=np.int64), target,
                   scale, fraction / scale, ratio / worst[owner] * target)

    def __len__(self) -> int:
        return int(self.attributes.shape[0])

    @property
    def lower_bound(self) -> np.ndarray:
        return self.alpha

    @property
    def segment_block(self) -> np.ndarray:
        """(s,) the block of every segment."""
        return np.repeat(np.arange(len(self)), np.diff(self.segment_offsets))

    @property
    def segment_cells(self) -> np.ndarray:
        """(s,) rows of every segment: the cells of its marginal."""
        return segment_cells(self.sizes, self.segment_clique)

    @property
    def rows(self) -> np.ndarray:
        """(n,) basis rows k of every block."""
        return np.prod(np.where(self.attributes >= 0, self.sizes[np.maximum(self.attributes, 0)] - 1, 1), axis=1)

    def block_ids(self, names: Sequence[str]) -> list[str]:
        """``residual.block_id_for`` of every block's attribute names."""
        return ["total" if not (row >= 0).any() else "r-" + ".".join(names[p] for p in row if p >= 0)
                for row in self.attributes]

    def attribute_names(self, names: Sequence[str]) -> list[tuple[str, ...]]:
        return [tuple(names[p] for p in row if p >= 0) for row in self.attributes]

    def allocation_rows(self, expand: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows the scale allocation sees, as ``(query, block, variance)`` arrays: every
        row of a segment with ``expand`` true, and only the first query of any other segment
        (all rows of a segment have the same variance, so a marginal whose every row lies in
        closed-form blocks needs one constraint, not one per cell)."""
        cells = np.where(expand, self.segment_cells, 1)
        first = np.repeat(self.segment_query, cells)
        starts = np.repeat(np.cumsum(cells) - cells, cells)
        query = first + np.arange(first.size) - starts
        return query, np.repeat(self.segment_block, cells), np.repeat(self.segment_variance, cells)

    def pack(self, scales: np.ndarray) -> PackedBlocks:
        """The blocks at scales ``s`` (``Sigma = s sigma B B^T``) as a ``PackedBlocks`` to store."""
        return PackedBlocks.closed_form(self.sizes, self.attributes, self.scale * np.asarray(scales, dtype=float),
                                        self.segment_offsets, self.segment_clique, self.segment_query,
                                        self.segment_target)


@dataclass(frozen=True, eq=False)
class ClosedRows:
    """The closed-form blocks as the allocation sees them: ``(query, block, variance)`` rows at
    their unscaled shapes, one per segment whose marginal has no row in a solved block (then all
    of its queries have the same constraint: a *run* of queries sharing the variance of its
    first) and one per row otherwise (a run of one query, like every query no such marginal
    covers). ``run_start``/``run_length`` cover the queries in order; ``run_of_row`` is the run
    of every allocation row. The per-query variances are runs, formed once at the end (``variances``)."""

    closed: ClosedFormBlocks
    query: np.ndarray
    block: np.ndarray
    variance: np.ndarray
    run_start: np.ndarray
    run_length: np.ndarray
    run_of_row: np.ndarray

    @classmethod
    def of(cls, closed: ClosedFormBlocks, solved: np.ndarray, num_queries: int) -> ClosedRows:
        """The table of ``closed`` in a plan whose solved blocks hold rows of the queries ``solved`` (sorted)."""
        expand = np.isin(closed.segment_query, solved)
        query, block, variance = closed.allocation_rows(expand)
        starts, first = np.unique(closed.segment_query[~expand], return_index=True)
        cells = closed.segment_cells[~expand][first]
        # queries outside every shared run are runs of one: the gaps between the shared runs, which
        # are disjoint marginals in query order (no vector the size of the workload)
        gap_start = np.concatenate([[0], starts + cells])
        gap_length = np.concatenate([starts, [num_queries]]) - gap_start
        single = np.arange(int(gap_length.sum()), dtype=np.int64) + np.repeat(
            gap_start - (np.cumsum(gap_length) - gap_length), gap_length)
        run_start = np.concatenate([starts, single])
        run_length = np.concatenate([cells, np.ones(single.size, dtype=np.int64)])
        order = np.argsort(run_start, kind="stable")
        run_start, run_length = run_start[order], run_length[order]
        return cls(closed, query, block, variance, run_start, run_length, np.searchsorted(run_start, query))

    def totals(self, scales: np.ndarray, num_queries: int) -> np.ndarray:
        """Per query, the variance of its closed-form rows at ``scales`` (runs' first queries only)."""
        return np.bincount(self.query, self.variance * scales[self.block], minlength=num_queries)

    def variances(self, solved: Iterable[tuple[np.ndarray, np.ndarray]], scales: np.ndarray) -> QueryRuns:
        """Per-query variances as runs: the solved blocks' ``(query_index, variances)`` plus the
        closed-form rows at ``scales``, accumulated per run (never spread over its queries)."""
        per_run = np.bincount(self.run_of_row, self.variance * scales[self.block], minlength=self.run_start.size)
        for query_index, values in solved:
            np.add.at(per_run, np.searchsorted(self.run_start, query_index), values)
        return QueryRuns(per_run, np.append(self.run_start, self.run_start[-1] + self.run_length[-1]))


def _fraction(sizes: np.ndarray, attributes: np.ndarray) -> np.ndarray:
    """(n,) ``c_S = prod_{i in S} (1 - 1 / n_i) = k / d_S``."""
    return np.prod(np.where(attributes >= 0, 1.0 - 1.0 / sizes[np.maximum(attributes, 0)], 1.0), axis=1)


def is_identity(matrix: np.ndarray) -> bool:
    """True when a per-attribute query matrix is the identity (the attribute's marginal)."""
    matrix = np.asarray(matrix)
    return matrix.ndim == 2 and matrix.shape[0] == matrix.shape[1] and np.array_equal(matrix, np.eye(matrix.shape[0]))
