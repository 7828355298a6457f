"""Packed blocks: many closed-form residual blocks of identity marginals as a few arrays.

A plan of all the 2-way marginals of 1,000 attributes has about 500,000 residual blocks; one
store group per block (seven arrays each) would be millions of files, and their explicit bases,
covariances and reconstructions gigabytes. Most of those blocks are the symmetric ones of
docs/design.md section 2, whose arrays all follow from the schema sizes and a few numbers per block,
so a :class:`PackedBlocks` keeps only those numbers (the plan store writes them as one group of
arrays per pack: :mod:`distfit.stores.plan`).

Block ``b`` of a pack has attributes ``S`` (schema positions, ascending) and

* basis ``B_S = kron_{i in S} D_i`` (``D_i`` the (n_i - 1) x n_i difference matrix,
  :func:`distfit.plan.residual.difference_matrix`; ``B_empty = [[1]]``, the total), k x d_S;
* covariance ``Sigma_S = scale_b * B_S B_S^T``;
* rows in *segments*, one per identity marginal A (a superset of S) whose queries reach the
  block: query row ``e_x`` (x a cell of A) splits into block S as ``kappa * kron_{i in S}
  e_{x_i}^T D_i^+`` with ``kappa = prod_{i in A minus S} 1 / n_i`` (docs/design.md section 2), so
  the segment's rows are ``kappa * R_S[x|S]`` for x over A's cells (row-major in schema order),
  ``R_S = kron_{i in S} D_i^+`` (d_S x k), for the queries ``q, q + 1, ..`` of the marginal.

Closed forms (:meth:`PackedBlocks.closed_form`): with ``P_i = D_i^+ D_i = I - 1 1^T / n_i``
(a projection) every row's variance is ``scale * kappa^2 * c_S``, ``c_S = prod_{i in S} (1 -
1 / n_i) = k / d_S``, and every cell's profile ``b_x^T Sigma^-1 b_x = c_S / scale`` (the diagonal
of the projection ``B^T (B B^T)^-1 B = kron P_i``): the profile is flat and ``alpha = c_S /
scale``. For target shares t, the symmetric covariance is optimal for its block (the binding
segment is the one of largest variance/target), and the dual point u uniform on the cells, v
uniform on the rows of the binding segment proves it: ``||diag(sqrt(v/t)) L B diag(sqrt(u))||_*^2
= kappa^2 k^2 / (d_S^2 t) = alpha`` at ``t`` = that segment's variance (the audit's
``block_bound_targets``).

Nothing here reads or writes a store; :func:`block_arrays` materialises one block as the arrays
of :class:`distfit.stores.plan.BlockRecord` (what ``distfit.read_plan`` yields).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from distfit.mathematics.bounds import certified_bound

__all__ = [
    "PackedBlocks",
    "QueryRuns",
    "block_arrays",
    "block_cells",
    "block_sizes",
    "certified_unit_bound",
    "gram_factor",
    "marginal_pack",
    "residual_basis",
    "residual_reconstruction",
    "segment_cells",
    "segment_kappa",
    "segment_rows",
]

SEGMENT_FIELDS = ("segment_clique", "segment_query", "segment_target", "segment_variance")
BLOCK_FIELDS = ("attributes", "scale", "alpha", "lower_bound", "certificate", "segment_offsets")


def _difference(n: int) -> np.ndarray:
    """``D_n`` ((n - 1) x n, rows ``e_j - e_{j+1}``): :func:`distfit.plan.residual.difference_matrix`,
    which imports this module (so it cannot be imported here)."""
    return np.eye(n - 1, n) - np.eye(n - 1, n, k=1)


def _int_matrix(name: str, value: Any) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim == 1 and arr.size == 0:
        arr = arr.reshape(0, 0)
    if arr.ndim != 2 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise ValueError(f"{name}: expected a 2-d integer array, got shape {arr.shape} dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < -1:
        raise ValueError(f"{name}: schema positions must be >= 0 (-1 pads)")
    valid = arr >= 0
    # ascending positions, then only padding: every valid entry follows a valid one and increases
    if arr.shape[1] > 1:
        after_pad = valid[:, 1:] & ~valid[:, :-1]
        not_ascending = valid[:, 1:] & valid[:, :-1] & (arr[:, 1:] <= arr[:, :-1])
        bad = after_pad | not_ascending
        if bad.any():
            row = int(np.flatnonzero(bad.any(axis=1))[0])
            raise ValueError(f"{name}: row {row} ({arr[row].tolist()}) is not ascending schema positions "
                             "padded with -1 at the end")
    return arr


def _vector(name: str, value: Any, size: int, kind: str) -> np.ndarray:
    arr = np.asarray(value)
    if arr.shape != (size,):
        raise ValueError(f"{name}: shape {arr.shape}, expected ({size},)")
    if kind == "int":
        if arr.size and not np.issubdtype(arr.dtype, np.integer):
            raise ValueError(f"{name}: expected integers, got dtype {arr.dtype}")
        return arr.astype(np.int64, copy=False)
    try:
        return arr.astype(np.float64, copy=False)
    except (TypeError, ValueError):
        raise ValueError(f"{name}: not convertible to float64") from None


@dataclass(frozen=True, eq=False)
class PackedBlocks:
    """Closed-form residual blocks of identity marginals, many at once (module docstring).

    ``attributes`` (n, r) int64 schema positions ascending, -1 padded (the total: all -1);
    ``scale``, ``alpha``, ``lower_bound`` (n,) float64; ``certificate`` (n,) int64, the segment
    whose rows carry the dual query weights (uniform; the cell weights are uniform), -1 for none
    (then ``lower_bound`` must be 0); ``segment_offsets`` (n + 1,) int64, block b's segments
    ``offsets[b]:offsets[b + 1]``; ``segment_clique`` (s, a) int64 the marginal's schema
    positions (ascending, -1 padded, a superset of its block's), ``segment_query`` (s,) int64
    its first query, ``segment_target`` and ``segment_variance`` (s,) float64 every row's target
    share and variance; ``solver`` statistics shared by the pack's blocks. Shapes, dtypes,
    padding, offsets, certificates and clique coverage are checked here (ValueError naming the
    field); what needs the schema (positions in range, sizes) is checked by the plan writer.
    Build it with :meth:`closed_form` so the stated values are the closed forms.
    """

    attributes: np.ndarray
    scale: np.ndarray
    alpha: np.ndarray
    lower_bound: np.ndarray
    certificate: np.ndarray
    segment_offsets: np.ndarray
    segment_clique: np.ndarray
    segment_query: np.ndarray
    segment_target: np.ndarray
    segment_variance: np.ndarray
    solver: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        attributes = _int_matrix("attributes", self.attributes)
        n = attributes.shape[0]
        set_(self, "attributes", attributes)
        for name in ("scale", "alpha", "lower_bound"):
            set_(self, name, _vector(name, getattr(self, name), n, "float"))
        set_(self, "certificate", _vector("certificate", self.certificate, n, "int"))
        offsets = _vector("segment_offsets", self.segment_offsets, n + 1, "int")
        if offsets[0] != 0 or np.any(np.diff(offsets) < 1):
            raise ValueError("segment_offsets: must start at 0 and increase (every block has a segment)")
        set_(self, "segment_offsets", offsets)
        s = int(offsets[-1])
        clique = _int_matrix("segment_clique", self.segment_clique)
        if clique.shape[0] != s:
            raise ValueError(f"segment_clique: {clique.shape[0]} rows, expected {s} from segment_offsets")
        set_(self, "segment_clique", clique)
        set_(self, "segment_query", _vector("segment_query", self.segment_query, s, "int"))
        if s and self.segment_query.min() < 0:
            raise ValueError("segment_query: negative query index")
        for name in ("segment_target", "segment_variance"):
            set_(self, name, _vector(name, getattr(self, name), s, "float"))
        if not np.all(self.scale > 0) or not np.all(np.isfinite(self.scale)):
            raise ValueError("scale: every block's scale must be finite and > 0")
        cert = self.certificate
        owner = np.repeat(np.arange(n), np.diff(offsets))
        has = cert >= 0
        inside = (cert < s) & (cert >= -1)
        if not inside.all() or np.any(owner[cert[has]] != np.flatnonzero(has)):
            raise ValueError("certificate: each must be -1 or one of its own block's segments")
        if np.any(~has & (self.lower_bound > 0)):
            raise ValueError("lower_bound: a block without a certificate (-1) may claim no bound")
        # every block attribute appears in each of its segments' cliques
        block_attrs = attributes[owner]  # (s, r)
        covered = (block_attrs[:, :, None] == clique[:, None, :]).any(axis=2) | (block_attrs < 0)
        if not covered.all():
            seg = int(np.flatnonzero(~covered.all(axis=1))[0])
            raise ValueError(f"segment_clique: segment {seg} ({clique[seg].tolist()}) does not contain its block's "
                             f"attributes {attributes[owner[seg]].tolist()}")
        set_(self, "solver", dict(self.solver or {}))

    def __len__(self) -> int:
        return int(self.attributes.shape[0])

    @property
    def segments(self) -> int:
        return int(self.segment_offsets[-1])

    @property
    def segment_block(self) -> np.ndarray:
        """(s,) the block (position in the pack) of every segment."""
        return np.repeat(np.arange(len(self)), np.diff(self.segment_offsets))

    @classmethod
    def closed_form(cls, sizes: Sequence[int], attributes: Any, scale: Any, segment_offsets: Any,
                    segment_clique: Any, segment_query: Any, segment_target: Any,
                    solver: dict | None = None) -> "PackedBlocks":
        """A pack whose stated values are the closed forms (module docstring) for the schema
        ``sizes``: ``alpha = c_S / scale``, every row's variance ``scale * kappa^2 * c_S``, the
        certificate the segment of largest variance/target, ``lower_bound`` alpha up to
        rounding (the symmetric covariance is optimal for its shares; below). The shares ``segment_target`` are the
        caller's (e.g. each marginal's target).

        ``lower_bound`` is what the certificate proves in floating point, the audit's number:
        ``certified_bound`` (:mod:`distfit.solver.dual`) of the block's problem at u, v uniform
        is homogeneous (``kappa^2 / t`` times its value at unit kappa and target), so it is
        ``alpha * f_S / c_S^2`` with ``f_S = certified_unit_bound(sizes of S)``, whose exact
        value ``c_S^2`` the rounding allowance lowers by up to ~2e-8 relative on 3-way blocks of
        10-valued attributes (one SVD per attribute-size signature)."""
        sizes = np.asarray(sizes, dtype=np.int64)
        attributes = _int_matrix("attributes", attributes)
        offsets = np.asarray(segment_offsets, dtype=np.int64)
        clique = _int_matrix("segment_clique", segment_clique)
        target = np.asarray(segment_target, dtype=np.float64)
        scale = np.asarray(scale, dtype=np.float64)
        c = np.prod(np.where(attributes >= 0, 1.0 - 1.0 / sizes[np.maximum(attributes, 0)], 1.0), axis=1)
        counts = np.diff(offsets)
        owner = np.repeat(np.arange(attributes.shape[0]), counts)
        kappa = segment_kappa(sizes, attributes, offsets, clique)
        variance = scale[owner] * kappa**2 * c[owner]
        ratio = variance / target
        # the binding segment of each block: the first of largest variance/target
        order = np.lexsort((np.arange(ratio.size), -ratio, owner))
        first = order[offsets[:-1]]
        alpha = c / scale
        own = np.where(attributes >= 0, sizes[np.maximum(attributes, 0)], 0)
        signatures, which = np.unique(own, axis=0, return_inverse=True)
        proved = np.array([certified_unit_bound(tuple(int(n) for n in row if n > 0)) for row in signatures])
        lower_bound = alpha * proved[which.ravel()] / c**2 if len(c) else alpha.copy()
        return cls(attributes=attributes, scale=scale, alpha=alpha, lower_bound=lower_bound, certificate=first,
                   segment_offsets=offsets, segment_clique=clique, segment_query=segment_query,
                   segment_target=target, segment_variance=variance, solver=dict(solver or {"method": "closed form"}))


def _changes(values: np.ndarray) -> np.ndarray:
    """Whether each value starts a new run: the first, and every one whose bits differ from the
    previous (so NaN and -0.0 survive encoding: :meth:`QueryRuns.expand` gives the same bytes)."""
    bits = np.ascontiguousarray(values, dtype=np.float64).view(np.int64)
    return np.concatenate([[bits.size > 0], bits[1:] != bits[:-1]])


@dataclass(frozen=True, eq=False)
class QueryRuns:
    """A per-query vector (targets, variances) as runs of equal values: query q of run r
    (``offsets[r] <= q < offsets[r + 1]``) has ``values[r]``.

    Identity marginals with one target each give one target and one variance per marginal, at
    most: at 100 attributes of 10 values, every marginal up to 3-way, a few runs stand for 162.2M
    queries (two float64 vectors of 1.3 GB each, most of ``distfit plan``'s peak memory before). ``values`` (r,)
    float64, ``offsets`` (r + 1,) int64 from 0, strictly increasing (no empty run); ValueError
    naming the field otherwise. Adjacent runs may hold equal values; :meth:`canonical` merges
    them (the form :meth:`encode` gives and the plan store writes; equal means the same bits)."""

    values: np.ndarray
    offsets: np.ndarray

    def __post_init__(self) -> None:
        offsets = np.asarray(self.offsets)
        if offsets.ndim != 1 or offsets.size < 1 or (offsets.size and not np.issubdtype(offsets.dtype, np.integer)):
            raise ValueError(f"offsets: expected a 1-d integer array of at least one entry, got shape {offsets.shape} "
                             f"dtype {offsets.dtype}")
        offsets = offsets.astype(np.int64, copy=False)
        if offsets[0] != 0 or np.any(np.diff(offsets) < 1):
            raise ValueError("offsets: must start at 0 and increase (no empty run)")
        object.__setattr__(self, "offsets", offsets)
        object.__setattr__(self, "values", _vector("values", self.values, offsets.size - 1, "float"))

    @classmethod
    def encode(cls, array: Any) -> "QueryRuns":
        """The runs of a per-query vector: one per maximal stretch of equal values."""
        array = np.ascontiguousarray(array, dtype=np.float64)
        if array.ndim != 1:
            raise ValueError(f"values: expected a 1-d array, got shape {array.shape}")
        starts = np.flatnonzero(_changes(array))
        return cls(array[starts], np.append(starts, array.size))

    @classmethod
    def of(cls, vector: "QueryRuns | Any") -> "QueryRuns":
        """``vector`` itself if it is runs, else :meth:`encode` of it."""
        return vector if isinstance(vector, QueryRuns) else cls.encode(vector)

    @property
    def size(self) -> int:
        """m, the number of queries."""
        return int(self.offsets[-1])

    @property
    def lengths(self) -> np.ndarray:
        """(r,) the queries of each run."""
        return np.diff(self.offsets)

    def canonical(self) -> "QueryRuns":
        """The same vector with equal adjacent runs merged (itself if none are)."""
        keep = _changes(self.values)
        if keep.all():
            return self
        return QueryRuns(self.values[keep], np.append(self.offsets[:-1][keep], self.size))

    def expand(self) -> np.ndarray:
        """The (m,) per-query vector."""
        return np.repeat(self.values, self.lengths)

    @property
    def shape(self) -> tuple[int]:
        return (self.size,)

    def __len__(self) -> int:
        return self.size

    def __array__(self, dtype: Any = None, copy: Any = None) -> np.ndarray:
        """``np.asarray(runs)``: the expanded vector (:meth:`expand`), not a sequence of runs."""
        out = self.expand()
        return out if dtype is None else out.astype(dtype, copy=False)

    def __getitem__(self, queries: Any) -> np.ndarray:
        """The values of the queries ``queries`` (integer indices in ``[0, m)``, any shape): runs
        index like the vector they stand for, so an allocation or a refinement round that reads
        the targets of some queries reads them from the runs."""
        queries = np.asarray(queries)
        if queries.size and not np.issubdtype(queries.dtype, np.integer):
            raise TypeError(f"runs are indexed by query numbers (integers), not {queries.dtype}")
        if queries.size and (queries.min() < 0 or queries.max() >= self.size):
            raise IndexError(f"query numbers must lie in [0, {self.size})")
        return self.values[np.searchsorted(self.offsets, queries, side="right") - 1]

    def with_values(self, values: Any) -> "QueryRuns":
        """These runs holding ``values`` (e.g. the variances scaled by a budget)."""
        return QueryRuns(values, self.offsets)

    def aligned(self, other: "QueryRuns") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(offsets, mine, theirs)``: both vectors on the runs of their common refinement
        (every boundary of either), e.g. to compare or divide them run by run."""
        if other.size != self.size:
            raise ValueError(f"runs: {other.size} queries, expected {self.size}")
        offsets = np.union1d(self.offsets, other.offsets)
        return offsets, self[offsets[:-1]], other[offsets[:-1]]


# --------------------------------------------------------------------------------------------
# the implied arrays


def block_sizes(sizes: Sequence[int], positions: np.ndarray) -> tuple[int, ...]:
    """The sizes of a block's attributes (its row of ``attributes``, -1 padded)."""
    return tuple(int(sizes[p]) for p in np.asarray(positions) if p >= 0)


def block_cells(sizes: np.ndarray, attributes: np.ndarray) -> np.ndarray:
    """(n,) cells d_S of each block's (or segment's) marginal: the product of its sizes."""
    sizes = np.asarray(sizes, dtype=np.int64)
    attributes = np.asarray(attributes, dtype=np.int64)
    return np.prod(np.where(attributes >= 0, sizes[np.maximum(attributes, 0)], 1), axis=1, dtype=np.int64)


segment_cells = block_cells  # a segment's marginal is a row of positions like a block's


def segment_kappa(sizes: Sequence[int], attributes: np.ndarray, offsets: np.ndarray, clique: np.ndarray) -> np.ndarray:
    """(s,) ``kappa = prod_{i in A minus S} 1 / n_i = d_S / d_A`` of every segment."""
    sizes = np.asarray(sizes, dtype=np.int64)
    owner = np.repeat(np.arange(np.asarray(attributes).shape[0]), np.diff(offsets))
    return block_cells(sizes, attributes)[owner] / block_cells(sizes, clique).astype(np.float64)


@functools.lru_cache(maxsize=256)
def residual_basis(sizes: tuple[int, ...]) -> np.ndarray:
    """``B_S = kron_i D_{n_i}`` for the attribute sizes of S (k x d_S; ``[[1.0]]`` for none).
    Cached; read-only."""
    out = np.ones((1, 1))
    for n in sizes:
        out = np.kron(out, _difference(int(n)))
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=256)
def residual_reconstruction(sizes: tuple[int, ...]) -> np.ndarray:
    """``R_S = kron_i D_{n_i}^+`` (d_S x k): the block row of cell x is ``R_S[x]``. Cached; read-only."""
    out = np.ones((1, 1))
    for n in sizes:
        out = np.kron(out, np.linalg.pinv(_difference(int(n))))
    out.setflags(write=False)
    return out


@functools.lru_cache(maxsize=256)
def certified_unit_bound(sizes: tuple[int, ...]) -> float:
    """``certified_bound(B_S, B_S^+, u, v)`` with u, v uniform on the d_S cells and rows: the
    bound the closed-form certificate proves at unit kappa and target, ``c_S^2`` exactly, less
    ``certified_bound``'s rounding allowance. Cached (one k x k SVD per signature)."""
    basis = residual_basis(sizes)
    d = basis.shape[1]
    uniform = np.full(d, 1.0 / d)
    return float(certified_bound(basis, residual_reconstruction(sizes), uniform, uniform))


@functools.lru_cache(maxsize=256)
def gram_factor(sizes: tuple[int, ...]) -> np.ndarray:
    """``B_S B_S^T`` (k x k). Cached; read-only."""
    basis = residual_basis(sizes)
    out = basis @ basis.T
    out.setflags(write=False)
    return out


def segment_rows(sizes: Sequence[int], block: np.ndarray, clique: np.ndarray) -> np.ndarray:
    """For each cell x of the marginal ``clique`` (row-major in schema order) the index of
    ``x|S`` among the cells of the block's marginal S (row-major): the row of ``R_S`` it uses."""
    clique_pos = [int(p) for p in clique if p >= 0]
    block_pos = [int(p) for p in block if p >= 0]
    shape = tuple(int(sizes[p]) for p in clique_pos)
    if not block_pos:
        return np.zeros(math.prod(shape), dtype=np.int64)
    grid = np.indices(shape).reshape(len(shape), -1)
    axes = [clique_pos.index(p) for p in block_pos]
    return np.ravel_multi_index(tuple(grid[a] for a in axes), tuple(shape[a] for a in axes)).astype(np.int64)


def block_arrays(pack: PackedBlocks, sizes: Sequence[int], b: int) -> dict[str, np.ndarray]:
    """Block ``b`` of ``pack`` as the arrays of a stored block (basis, recon, query_index,
    sigma, targets, variances, profile, cell_weights, query_weights; module docstring), for the
    schema ``sizes``. The profile is the stated alpha on every cell (the closed form's flat
    profile); a block without a certificate gets NaN weights."""
    own = block_sizes(sizes, pack.attributes[b])
    basis = np.array(residual_basis(own))
    recon_s = residual_reconstruction(own)
    start, stop = int(pack.segment_offsets[b]), int(pack.segment_offsets[b + 1])
    kappa = segment_kappa(sizes, pack.attributes[b:b + 1], np.array([0, stop - start]),
                          pack.segment_clique[start:stop])
    recon, query, targets, variances, weights = [], [], [], [], []
    for j in range(start, stop):
        rows = segment_rows(sizes, pack.attributes[b], pack.segment_clique[j])
        recon.append(kappa[j - start] * recon_s[rows])
        query.append(pack.segment_query[j] + np.arange(rows.size, dtype=np.int64))
        targets.append(np.full(rows.size, pack.segment_target[j]))
        variances.append(np.full(rows.size, pack.segment_variance[j]))
        weights.append(np.full(rows.size, 1.0 / rows.size if j == pack.certificate[b] else 0.0))
    d = basis.shape[1]
    certified = pack.certificate[b] >= 0
    return {
        "basis": basis,
        "recon": np.concatenate(recon),
        "query_index": np.concatenate(query),
        "sigma": pack.scale[b] * np.array(gram_factor(own)),
        "targets": np.concatenate(targets),
        "variances": np.concatenate(variances),
        "profile": np.full(d, pack.alpha[b]),
        "cell_weights": np.full(d, 1.0 / d) if certified else np.full(d, np.nan),
        "query_weights": np.concatenate(weights) if certified else np.full(sum(w.size for w in weights), np.nan),
    }


def marginal_pack(sizes: Sequence[int], cliques: Sequence[Sequence[int]], targets: Any,
                  scale: Any = None, solver: dict | None = None) -> tuple[PackedBlocks, np.ndarray]:
    """The closed-form pack of the identity marginals ``cliques`` (schema positions, ascending;
    the workload's queries are their cells one clique after another, row-major) with one target
    per clique: one residual block per subset S of a clique (none holding an attribute of size
    1), sorted by ``(len(S), S)``, each block's segments in clique order, every row's share the
    whole target of its query. ``scale`` (one per block in that order, default 1) scales the
    covariances. Returns the pack and the (m,) targets of the workload's queries.

    A reference builder (tests, benchmarks): a loop over cliques and subsets, not the planner."""
    sizes = np.asarray(sizes, dtype=np.int64)
    cliques = [tuple(int(p) for p in c) for c in cliques]
    targets = np.broadcast_to(np.asarray(targets, dtype=np.float64), (len(cliques),))
    cells = [int(np.prod([sizes[p] for p in c], dtype=np.int64)) for c in cliques]
    first = np.concatenate([[0], np.cumsum(cells)]).astype(np.int64)
    members: dict[tuple[int, ...], list[int]] = {}
    for g, clique in enumerate(cliques):
        usable = [p for p in clique if sizes[p] > 1]
        for mask in range(1 << len(usable)):
            subset = tuple(p for i, p in enumerate(usable) if mask >> i & 1)
            members.setdefault(subset, []).append(g)
    order = sorted(members, key=lambda s: (len(s), s))
    r = max((len(s) for s in order), default=0)
    a = max((len(c) for c in cliques), default=0)
    attributes = np.full((len(order), r), -1, dtype=np.int64)
    for b, subset in enumerate(order):
        attributes[b, :len(subset)] = subset
    groups = [g for subset in order for g in members[subset]]
    offsets = np.concatenate([[0], np.cumsum([len(members[s]) for s in order])]).astype(np.int64)
    clique = np.full((len(groups), a), -1, dtype=np.int64)
    for j, g in enumerate(groups):
        clique[j, :len(cliques[g])] = cliques[g]
    scale = np.ones(len(order)) if scale is None else np.asarray(scale, dtype=np.float64)
    pack = PackedBlocks.closed_form(sizes, attributes, scale, offsets, clique, first[groups], targets[groups],
                                    solver=solver)
    return pack, np.repeat(targets, cells)
