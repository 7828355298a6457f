"""Cutting a workload into blocks: residual blocks, merged under ``max_cells`` (docs/design.md section 2).

Marginal workloads use **residual blocks**. For attribute i of size n_i let ``D_i`` be the
(n_i - 1) x n_i difference matrix (rows e_j - e_{j+1}); then ``I = (1/n_i) 1 1^T + D_i^+ D_i``.
For every attribute subset S the residual block has basis ``B_S = kron_{i in S} D_i`` on the
S-marginal (``B_empty`` = the total). A query row ``(q_i)_{i in A}`` of a group on clique A
splits exactly over the blocks S subset of A with block row
``kron_{i in S} q_i^T D_i^+`` times ``kappa = prod_{i in A minus S} (q_i . 1) / n_i``. Residual
spaces of different S are orthogonal, a query's variance is the sum of its blocks' shares, and
the profile adds over blocks (sequential composition: ``composition``).

``merge_blocks`` merges residual blocks while a block's marginal has at most ``max_cells``
cells (exactly: ``combine_blocks``); ``ResidualWorkload.layout`` decides the same merges on
attribute sets and row counts alone, before any block's arrays exist. ``connected_blocks`` is
the other exact cut: the connected components of a dense workload's query-cell graph (they
compose in parallel). How the blocks' scales are chosen is ``allocate``.
"""
from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
import scipy.sparse
import scipy.sparse.csgraph

from distfit.mathematics.domain import Domain
from distfit.mathematics.packing import QueryRuns
from distfit.plan.closed_form import ClosedFormBlocks, is_identity
from distfit.mathematics.workload import validate_targets

GroupLike = tuple  # (name, {attribute: Q_i}, target scalar or per-query array)


@dataclass(frozen=True, eq=False)
class BlockSpec:
    """One block: a sub-workload ``recon @ basis`` on the marginal of ``attributes``.

    ``basis`` columns are the cells of that marginal, row-major in the schema's order (docs/design.md
    section 4); ``query_index[r]`` is the workload query that row r of ``recon`` belongs to and
    ``targets[r]`` that query's target.
    """

    block_id: str
    attributes: tuple[str, ...]
    basis: np.ndarray
    recon: np.ndarray
    query_index: np.ndarray
    targets: np.ndarray

    @property
    def workload(self) -> np.ndarray:
        return self.recon @ self.basis


def block_id_for(attributes: Sequence[str]) -> str:
    """Stable, path-safe block id: ``"total"`` or ``"r-" + attribute names joined by "."``."""
    return "total" if not attributes else "r-" + ".".join(attributes)


def difference_matrix(n: int) -> np.ndarray:
    """``D`` ((n - 1) x n) with rows ``e_j - e_{j+1}``; ``I = (1/n) 1 1^T + D^+ D``."""
    return np.eye(n - 1, n) - np.eye(n - 1, n, k=1)


def group_targets(domain: Domain, groups: Sequence[GroupLike]) -> np.ndarray:
    """Every query's target, in workload order (the groups' rows one after another)."""
    return ResidualWorkload(domain, groups).targets()


@dataclass(frozen=True)
class BlockLayout:
    """A block as the decomposition decides it, before its arrays exist.

    ``members``: the residual subsets it combines, in basis-row order (one member: the residual
    block itself); ``rows`` k, ``cells`` d_b and ``queries`` m_b are the sizes its spec will
    have. ``ResidualWorkload.build`` makes the ``BlockSpec``.
    """

    block_id: str
    attributes: tuple[str, ...]
    members: tuple[tuple[str, ...], ...]
    rows: int
    cells: int
    queries: int


class ResidualWorkload:
    """A marginal workload's query groups, parsed once, from which residual blocks (module
    docstring) are built one at a time, so a decomposition never holds every block's arrays.

    ``groups`` are ``(name, {attribute: Q_i}, target)`` triples as in
    ``workload.workload_from_groups``; the workload's queries are the groups' rows in order
    (each group's rows row-major over its attributes' query rows in domain order). Residual
    subsets with no nonzero row are dropped, as are subsets containing an attribute of size 1.
    Which rows are nonzero is decided without forming the Kronecker products: the largest
    entry of a row of ``kron(F_1, F_2, ...)`` is the product of its factors' rows' largest
    entries (exactly, in floating point: rounding is monotone).

    At scale (500,000 groups of identity marginals) the groups are held as arrays: a group of
    identity matrices with one target (*simple*: the closed-form case) has every row in every
    residual subset of its clique (``kappa = prod 1/n_i`` times a row of ``kron D_i^+``, whose
    rows are all nonzero), so its subsets are enumerated for all such groups at once by numpy,
    and only the other groups go through the per-row test. Matrices and target arrays a spec
    shares between groups are validated once. The residual subsets are rows of
    ``subset_positions`` (schema positions, -1 padded), sorted by size then positions; the
    groups with rows in subset ``s`` are ``pair_group[pair_offsets[s]:pair_offsets[s + 1]]``,
    in group order.
    """

    def __init__(self, domain: Domain, groups: Sequence[GroupLike]) -> None:
        self.domain = domain
        self._source = groups
        # Only the attributes some group uses: an attribute of the schema no query reads is
        # never materialised (its n x n pseudo-inverse would be the largest array of the plan).
        used = {name for _, per_attribute, _ in groups for name in per_attribute}
        self._pseudo_inverse = {name: np.linalg.pinv(difference_matrix(n))
                                for name, n in zip(domain.names, domain.sizes) if n > 1 and name in used}
        position = {name: i for i, name in enumerate(domain.names)}
        sizes = domain.sizes
        matrices: dict[tuple[int, str], tuple[np.ndarray, bool]] = {}  # (id, attribute) -> (array, identity)
        target_memo: dict[tuple[int, int], tuple[float, bool]] = {}  # (id, rows) -> (first target, uniform)
        count = len(groups)
        first = np.zeros(count + 1, dtype=np.int64)
        self._simple = np.zeros(count, dtype=bool)  # identity marginal, one target (closed_form module)
        self._target = np.zeros(count)
        flat: list[int] = []  # every group's clique positions, one after another
        lengths = np.zeros(count, dtype=np.int64)
        by_width: dict[int, list[tuple[int, list[int]]]] = {}  # simple groups by usable clique width
        other: list[int] = []
        for number, (name, per_attribute, target) in enumerate(groups):
            try:
                positions = [position[a] for a in per_attribute]
            except KeyError:
                unknown = next(a for a in per_attribute if a not in position)
                raise ValueError(f"groups[{name!r}]: unknown attribute {unknown!r}") from None
            if positions != sorted(positions):
                positions.sort()
            rows, identity = 1, True
            for p in positions:
                attribute = domain.names[p]
                matrix = per_attribute[attribute]
                known = matrices.get((id(matrix), attribute))
                if known is None:
                    known = matrices[(id(matrix), attribute)] = self._checked(name, attribute, matrix)
                rows *= known[0].shape[0]
                identity = identity and known[1]
            known_target = target_memo.get((id(target), rows))
            if known_target is None:
                try:
                    targets = validate_targets(target, rows)
                except ValueError as error:
                    raise ValueError(f"groups[{name!r}].{error}") from None
                known_target = target_memo[(id(target), rows)] = (
                    float(targets[0]) if rows else 0.0, bool(rows) and bool((targets == targets[0]).all()))
            first[number + 1] = first[number] + rows
            flat.extend(positions)
            lengths[number] = len(positions)
            self._target[number] = known_target[0]
            if identity and known_target[1]:
                self._simple[number] = True
                usable = [p for p in positions if sizes[p] > 1]
                by_width.setdefault(len(usable), []).append((number, usable))
            else:
                other.append(number)
        self._first = first
        # (groups, a) clique positions, -1 padded
        self._clique_positions = np.full((count, int(lengths.max(initial=0))), -1, dtype=np.int64)
        column = np.arange(len(flat)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        self._clique_positions[np.repeat(np.arange(count), lengths), column] = flat
        self._matrices = {key: array for key, (array, _) in matrices.items()}
        self._identity_of = {key: identity for key, (_, identity) in matrices.items()}
        self._parts_memo: dict[int, tuple] = {}
        self._kept_rows: dict[tuple[int, tuple[str, ...]], np.ndarray] = {}  # rows of a non-simple group
        rows, pairs = self._simple_pairs(by_width)
        rows, pairs = self._other_pairs(other, rows, pairs, position)
        self._index_pairs(rows, pairs)

    def _checked(self, name: str, attribute: str, matrix) -> tuple[np.ndarray, bool]:
        """A group's query matrix for ``attribute`` as floats, shape-checked; whether it is the identity."""
        array = np.asarray(matrix, dtype=float)
        if array.ndim != 2 or array.shape[1] != self.domain.size_of(attribute):
            raise ValueError(
                f"groups[{name!r}]: query matrix for {attribute!r} must have {self.domain.size_of(attribute)} columns, "
                f"got shape {array.shape}"
            )
        return array, is_identity(array)

    @staticmethod
    def _simple_pairs(by_width: dict[int, list[tuple[int, list[int]]]]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """(subset position rows, their groups) for every subset of every simple group's usable
        clique, by numpy per clique width: subset ``mask`` of a width-w clique keeps the
        positions of its set bits."""
        width = max(by_width, default=0)
        rows, pairs = [], []
        for w, members in by_width.items():
            numbers = np.array([number for number, _ in members], dtype=np.int64)
            cliques = np.array([usable for _, usable in members], dtype=np.int64).reshape(len(members), w)
            for mask in range(1 << w):
                bits = [i for i in range(w) if mask >> i & 1]
                subset = np.full((len(members), width), -1, dtype=np.int64)
                subset[:, :len(bits)] = cliques[:, bits]
                rows.append(subset)
                pairs.append(numbers)
        return rows, pairs

    def _other_pairs(self, other: list[int], rows: list[np.ndarray], pairs: list[np.ndarray],
                     position: dict[str, int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Add the subsets of the other groups, each kept when one of its rows is nonzero
        (class docstring), keeping the nonzero rows' queries."""
        found: list[tuple[tuple[int, ...], int]] = []
        for number in other:
            clique, averages, residuals, _, query_index = self._parts(number)
            largest = {a: np.abs(f).max(axis=1) for a, f in averages.items()}
            largest_residual = {a: np.abs(f).max(axis=1) for a, f in residuals.items()}
            for subset in self._group_subsets(clique, residuals):
                row_max = functools.reduce(
                    np.kron, [largest_residual[a] if a in subset else largest[a] for a in clique], np.ones(1))
                keep = self._kept(row_max)
                if keep is not None:
                    self._kept_rows[(number, subset)] = query_index[keep]
                    found.append((tuple(position[a] for a in subset), number))
        if found:
            width = max([len(s) for s, _ in found] + [r.shape[1] for r in rows])
            rows = [np.pad(r, ((0, 0), (0, width - r.shape[1])), constant_values=-1) for r in rows]
            subset = np.full((len(found), width), -1, dtype=np.int64)
            for j, (positions, _) in enumerate(found):
                subset[j, :len(positions)] = positions
            rows.append(subset)
            pairs.append(np.array([number for _, number in found], dtype=np.int64))
        return rows, pairs

    def _index_pairs(self, rows: list[np.ndarray], pairs: list[np.ndarray]) -> None:
        """Sort the (subset, group) pairs by subset (size, then positions), then group, and
        number the distinct subsets."""
        width = max((r.shape[1] for r in rows), default=0)
        subsets = np.concatenate(rows) if rows else np.zeros((0, width), dtype=np.int64)
        group = np.concatenate(pairs) if pairs else np.zeros(0, dtype=np.int64)
        size = (subsets >= 0).sum(axis=1)
        order = np.lexsort((group,) + tuple(subsets[:, i] for i in reversed(range(width))) + (size,))
        subsets, group = subsets[order], group[order]
        new = np.ones(group.size, dtype=bool)
        new[1:] = (subsets[1:] != subsets[:-1]).any(axis=1)
        starts = np.flatnonzero(new)
        self.subset_positions = subsets[starts]
        self.pair_offsets = np.append(starts, group.size).astype(np.int64)
        self.pair_group = group

    @functools.cached_property
    def subsets(self) -> tuple[tuple[str, ...], ...]:
        """Every residual subset (attribute names), sorted by size, then schema positions."""
        return tuple(self.names_of(np.arange(len(self.subset_positions))))

    def names_of(self, ids: np.ndarray) -> list[tuple[str, ...]]:
        """The attribute names of the subsets ``ids``."""
        names = self.domain.names
        return [tuple(names[p] for p in row if p >= 0) for row in self.subset_positions[ids].tolist()]

    @functools.cached_property
    def _subset_index(self) -> dict[tuple[str, ...], int]:
        return {subset: s for s, subset in enumerate(self.subsets)}

    def subset_ids(self, subsets: Sequence[tuple[str, ...]]) -> np.ndarray:
        """Positions in ``subsets`` (and rows of ``subset_positions``) of attribute-name subsets."""
        index = self._subset_index
        return np.array([index[tuple(s)] for s in subsets], dtype=np.int64)

    def targets(self) -> np.ndarray:
        """Every query's target, in workload order (``group_targets``): :meth:`target_runs` expanded."""
        return self.target_runs().expand()

    def target_runs(self) -> QueryRuns:
        """Every query's target as runs (:class:`distfit.mathematics.packing.QueryRuns`, merged): one run per
        group with one target (identity marginals: one per marginal, never a vector the size of
        the workload), the other groups' targets encoded group by group."""
        rows = np.diff(self._first)
        values, offsets = [self._target[self._simple]], [self._first[:-1][self._simple]]
        for number in np.flatnonzero(~self._simple & (rows > 0)).tolist():
            name, _, target = self._source[number]
            runs = QueryRuns.encode(validate_targets(target, int(rows[number])))
            values.append(runs.values)
            offsets.append(runs.offsets[:-1] + self._first[number])
        starts = np.concatenate(offsets)
        order = np.argsort(starts, kind="stable")
        return QueryRuns(np.concatenate(values)[order], np.append(starts[order], self._first[-1])).canonical()

    def _parts(self, number: int) -> tuple:
        """Group ``number`` as ``(clique, averages, residuals, targets, query_index)``: per
        attribute the row averages ``Q_i 1 / n_i`` and the residual rows ``Q_i D_i^+``."""
        parts = self._parts_memo.get(number)
        if parts is None:
            name, per_attribute, target = self._source[number]
            clique = tuple(self.domain.names[p] for p in self._clique_positions[number] if p >= 0)
            matrices = {a: self._matrices[(id(per_attribute[a]), a)] for a in clique}
            query_index = np.arange(self._first[number], self._first[number + 1])
            averages = {a: matrices[a].sum(axis=1, keepdims=True) / self.domain.size_of(a) for a in clique}
            residuals = {a: matrices[a] @ self._pseudo_inverse[a] for a in clique if a in self._pseudo_inverse}
            parts = (clique, averages, residuals, validate_targets(target, query_index.size), query_index)
            if len(self._parts_memo) < 4096:
                self._parts_memo[number] = parts
        return parts

    @staticmethod
    def _group_subsets(clique, residuals):
        for size in range(len(clique) + 1):
            for subset in itertools.combinations(clique, size):
                if all(attribute in residuals for attribute in subset):
                    yield subset

    @staticmethod
    def _kept(row_max: np.ndarray) -> np.ndarray | None:
        scale = row_max.max(initial=0.0)
        keep = row_max > 1e-12 * max(scale, 1e-300)
        return None if scale == 0.0 or not keep.any() else keep

    def _pairs_of(self, subset: tuple[str, ...]) -> np.ndarray:
        s = self._subset_index[tuple(subset)]
        return self.pair_group[self.pair_offsets[s]:self.pair_offsets[s + 1]]

    def groups_of(self, subset: tuple[str, ...]) -> list[int]:
        """The groups (positions in ``groups``) with rows in the block of ``subset``."""
        return self._pairs_of(subset).tolist()

    def closed_form(self, subset: tuple[str, ...]) -> bool:
        """True when every group with rows in the block of ``subset`` is an identity marginal with
        one target: the block has a closed-form optimum (``closed_form`` module)."""
        return bool(self._simple[self._pairs_of(subset)].all())

    def closed_form_mask(self) -> np.ndarray:
        """(subsets,) ``closed_form`` of every subset at once."""
        return np.logical_and.reduceat(self._simple[self.pair_group], self.pair_offsets[:-1]) \
            if self.pair_group.size else np.zeros(0, dtype=bool)

    def free_of_mixed(self, closed: np.ndarray) -> np.ndarray:
        """(subsets,) the ``closed`` subsets none of whose groups has rows in a subset that is not:
        the blocks ``decomposition`` never merges."""
        mixed = np.zeros(len(self._simple), dtype=bool)
        mixed[self.pair_group[~np.repeat(closed, np.diff(self.pair_offsets))]] = True
        touched = np.logical_or.reduceat(mixed[self.pair_group], self.pair_offsets[:-1]) \
            if self.pair_group.size else np.zeros(0, dtype=bool)
        return closed & ~touched

    def closed_form_blocks(self, subsets: Sequence[tuple[str, ...]] | np.ndarray) -> ClosedFormBlocks:
        """The closed-form blocks of ``subsets`` (each ``closed_form``; attribute names or
        ``subset_ids``), in that order, with one segment per group that has rows in it, in
        group order (``ClosedFormBlocks.of``)."""
        ids = subsets if isinstance(subsets, np.ndarray) else self.subset_ids(subsets)
        counts = self.pair_offsets[ids + 1] - self.pair_offsets[ids]
        starts = np.repeat(self.pair_offsets[ids] - np.cumsum(counts) + counts, counts)
        groups = self.pair_group[starts + np.arange(int(counts.sum()))]
        clique = self._clique_positions[groups]
        clique = clique[:, :int((clique >= 0).sum(axis=1).max(initial=0))]
        attributes = self.subset_positions[ids]
        attributes = attributes[:, :int((attributes >= 0).sum(axis=1).max(initial=0))]
        return ClosedFormBlocks.of(
            np.asarray(self.domain.sizes), attributes,
            np.concatenate([[0], np.cumsum(counts)]).astype(np.int64), clique, self._first[groups],
            self._target[groups])

    def query_index(self, subset: tuple[str, ...]) -> np.ndarray:
        """The workload queries with a row in the residual block of ``subset``, in row order."""
        return np.concatenate([self._group_rows(number, tuple(subset)) for number in self.groups_of(subset)])

    def _group_rows(self, number: int, subset: tuple[str, ...]) -> np.ndarray:
        if self._simple[number]:
            return np.arange(self._first[number], self._first[number + 1])
        return self._kept_rows[(number, subset)]

    def residual_block(self, subset: tuple[str, ...]) -> BlockSpec:
        """The residual block of one attribute subset (basis ``kron D_i``, rows from every group
        whose clique contains it)."""
        pieces = []
        for number in self.groups_of(subset):
            clique, averages, residuals, targets, query_index = self._parts(number)
            recon = _kron_all([residuals[a] if a in subset else averages[a] for a in clique])
            keep = self._kept(np.abs(recon).max(axis=1))  # the rule the layout applied to row_max
            pieces.append((recon[keep], query_index[keep], targets[keep]))
        return BlockSpec(
            block_id=block_id_for(subset),
            attributes=tuple(subset),
            basis=_kron_all([difference_matrix(self.domain.size_of(a)) for a in subset]),
            recon=np.vstack([piece[0] for piece in pieces]),
            query_index=np.concatenate([piece[1] for piece in pieces]),
            targets=np.concatenate([piece[2] for piece in pieces]),
        )

    def layout(self, cliques: Sequence[Sequence[str]], max_cells: int,
               max_rows: int | None = None) -> list[BlockLayout]:
        """The blocks ``merge_blocks`` would make of the residual blocks, as layouts."""
        return self.layouts(merge_layout(self.domain, self.subsets, cliques, max_cells, max_rows))

    def layouts(self, merged: Sequence[tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]]) -> list[BlockLayout]:
        """Layouts of ``(attributes, members)`` blocks (``merge_layout``'s output)."""
        layouts = []
        for attributes, members in merged:
            rows = sum(math.prod(self.domain.size_of(a) - 1 for a in member) for member in members)
            queries = np.unique(np.concatenate([self.query_index(member) for member in members])).size
            layouts.append(BlockLayout(block_id_for(attributes), attributes, members, rows,
                                       _cells(self.domain, attributes), int(queries)))
        return layouts

    def build(self, layout: BlockLayout) -> BlockSpec:
        """The block's spec: its residual block, or its members combined (``combine_blocks``)."""
        members = [self.residual_block(member) for member in layout.members]
        return members[0] if len(members) == 1 else combine_blocks(self.domain, members, layout.attributes)


def residual_blocks(domain: Domain, groups: Sequence[GroupLike]) -> list[BlockSpec]:
    """Every residual block of a marginal workload (``ResidualWorkload``; module docstring;
    docs/design.md section 2), smallest subsets first."""
    workload = ResidualWorkload(domain, groups)
    return [workload.residual_block(subset) for subset in workload.subsets]


def _kron_all(factors: Sequence[np.ndarray]) -> np.ndarray:
    """Kronecker product of the factors in order (the empty product is [[1]])."""
    return functools.reduce(np.kron, factors, np.ones((1, 1)))


def connected_blocks(matrix: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Exact cut: connected components of the bipartite query-cell graph of W.

    Returns ``(query_indices, cell_indices)`` per component (components are disjoint in cells,
    so they compose in parallel and cutting loses nothing). Cells no query touches are left out.
    """
    workload = scipy.sparse.csr_matrix(np.asarray(matrix) != 0)
    m, d = workload.shape
    graph = scipy.sparse.bmat([[None, workload], [workload.T, None]], format="csr")
    count, labels = scipy.sparse.csgraph.connected_components(graph, directed=False)
    query_labels, cell_labels = labels[:m], labels[m:]
    components = []
    for label in np.unique(query_labels):
        components.append((np.flatnonzero(query_labels == label), np.flatnonzero(cell_labels == label)))
    return components


def _lift(domain: Domain, basis: np.ndarray, attributes: Sequence[str], target: Sequence[str]) -> np.ndarray:
    """A basis on the ``attributes``-marginal lifted to the ``target``-marginal (a superset).

    ``kron`` with all-ones rows appends the extra attributes after the block's own; a
    transpose then restores the target marginal's row-major order (domain order).
    """
    own = [name for name in target if name in attributes]
    extra = [name for name in target if name not in attributes]
    lifted = _kron_all([basis] + [np.ones((1, domain.size_of(name))) for name in extra])
    shape = [domain.size_of(name) for name in own + extra]
    axes = [(own + extra).index(name) for name in target]
    rows = lifted.shape[0]
    return lifted.reshape([rows] + shape).transpose([0] + [1 + axis for axis in axes]).reshape(rows, -1)


def _cells(domain: Domain, attributes: Sequence[str]) -> int:
    return math.prod(domain.size_of(a) for a in attributes)


def _in_domain_order(domain: Domain, attributes) -> tuple[str, ...]:
    return tuple(a for a in domain.names if a in set(attributes))


def combine_blocks(domain: Domain, members: Sequence[BlockSpec], attributes: Sequence[str] | None = None) -> BlockSpec:
    """One block equivalent to ``members`` jointly: bases lifted to the union marginal and
    stacked; a query's rows in several members become one row with the coefficients side by
    side (so the block's workload is exactly the members' workloads summed)."""
    if attributes is None:
        attributes = _in_domain_order(domain, set().union(*(m.attributes for m in members)))
    basis = np.vstack([_lift(domain, m.basis, m.attributes, attributes) for m in members])
    queries = np.unique(np.concatenate([m.query_index for m in members]))
    recon = np.zeros((queries.size, basis.shape[0]))
    targets = np.zeros(queries.size)
    offset = 0
    for member in members:
        rows = np.searchsorted(queries, member.query_index)
        recon[rows, offset : offset + member.basis.shape[0]] += member.recon
        targets[rows] = member.targets
        offset += member.basis.shape[0]
    return BlockSpec(block_id_for(attributes), tuple(attributes), basis, recon, queries, targets)


#: Residual blocks of at most ``LOW_ORDER`` attributes (the total, a single attribute's) that
#: more than ``LOW_ORDER_SHARED`` query cliques contain join the *smallest* clique that contains
#: them and fits ``max_cells`` (``merge_layout``); every other block the largest. Such a block
#: has a row for every query of every group whose clique contains it (the total: every query of
#: the workload) along few directions, and few basis rows (1 or n - 1): in the largest clique
#: it made the plan's largest block larger still and gave it every query. marginals.yaml (all
#: 2-way marginals of 30 attributes, max_cells 400; the total in 435 cliques, each attribute in
#: 29): the total and industry's and personal_income's blocks had joined industry x
#: personal_income (k = 400, 27,898 queries; 10.6 / 38.1 / 28.7 CPU-s in rounds 0 / 1 / 2 of a
#: serial plan, its largest block by far and the critical path of every round); in the
#: smallest cliques the largest block has 361 rows and 380 queries, a serial plan's solves take
#: 234.7 -> 146.7 CPU-s, its largest per round 38.1 -> 8.5, and its alpha goes 121.980 ->
#: 120.624 (benchmarks/README.md, issue 31 point 2).
#: Not on workloads of few cliques: there one clique's queries can weigh most on the total,
#: and the largest clique is where they are (tests/reference.py's mixed workload, 4 cliques,
#: at max_cells 16: the total in the smallest clique gave one round's sum bound 5.634 against
#: 3.767; pl94, mix and the age pyramid, at most 8 cliques, keep their plans bit for bit).
LOW_ORDER = 1
LOW_ORDER_SHARED = 16


def widely_shared(block: Sequence[str], cliques: Sequence[Sequence[str]]) -> bool:
    """Whether ``block`` is a low-order block that joins the smallest clique (``LOW_ORDER``): of
    at most ``LOW_ORDER`` attributes and held by more than ``LOW_ORDER_SHARED`` of the distinct
    ``cliques``."""
    return len(block) <= LOW_ORDER and sum(set(block) <= set(c) for c in cliques) > LOW_ORDER_SHARED


def _member_rows(domain: Domain, members: Sequence[Sequence[str]]) -> int:
    """Basis rows of a block combining residual blocks: ``sum_S prod_{i in S} (n_i - 1)``."""
    return sum(math.prod(domain.size_of(a) - 1 for a in member) for member in members)


def merge_layout(
    domain: Domain, blocks: Sequence[Sequence[str]], cliques: Sequence[Sequence[str]], max_cells: int,
    max_rows: int | None = None,
) -> list[tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]]:
    """Which blocks to merge, decided on attribute sets alone (``merge_blocks``' rules).

    ``blocks`` are the blocks' attribute sets (distinct). A block joins the largest query
    clique that contains it and fits ``max_cells``, except the blocks of at most ``LOW_ORDER``
    attributes (the total, one attribute's) in more than ``LOW_ORDER_SHARED`` cliques, which
    join the smallest (``LOW_ORDER``'s comment).
    Returns ``(attributes, members)`` per merged block, ``members`` indexing the input attribute sets in basis-row order, sorted
    smallest block first. ``max_rows`` also caps a merged block's basis rows (an SM-II step
    costs O(k^3) in its k rows): a clique whose residual blocks add up to more stays unmerged,
    and two blocks merge only while their rows add up to at most it.
    """
    row_limit = math.inf if max_rows is None else max_rows
    order = sorted({_in_domain_order(domain, clique) for clique in cliques},
                   key=lambda c: (-_cells(domain, c), [domain.index(a) for a in c]))
    smallest_first = sorted(order, key=lambda c: (_cells(domain, c), [domain.index(a) for a in c]))
    groups: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
    current: list[tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]] = []
    for block in blocks:
        block = tuple(block)
        homes = smallest_first if widely_shared(block, order) else order
        home = next((c for c in homes if set(block) <= set(c) and _cells(domain, c) <= max_cells), None)
        if home is None:
            current.append((block, (block,)))
        else:
            groups.setdefault(home, []).append(block)
    for clique, members in groups.items():
        if len(members) == 1:
            current.append((members[0], (members[0],)))
        elif _member_rows(domain, members) > row_limit:
            current.extend((member, (member,)) for member in members)
        else:
            current.append((clique, tuple(members)))
    while True:
        candidates = []
        for i, j in itertools.combinations(range(len(current)), 2):
            first, second = set(current[i][0]), set(current[j][0])
            if first & second or not first or not second:
                union = _in_domain_order(domain, first | second)
                cells = _cells(domain, union)
                if cells <= max_cells and _member_rows(domain, current[i][1] + current[j][1]) <= row_limit:
                    candidates.append((cells, i, j))
        if not candidates:
            break
        merged_now: set[int] = set()
        replacements = []
        for cells, i, j in sorted(candidates):
            if i in merged_now or j in merged_now:
                continue
            merged_now.update((i, j))
            union = _in_domain_order(domain, set(current[i][0]) | set(current[j][0]))
            replacements.append((union, current[i][1] + current[j][1]))
        current = [b for k, b in enumerate(current) if k not in merged_now] + replacements
    return sorted(current, key=lambda b: (len(b[0]), [domain.index(a) for a in b[0]]))


def merge_blocks(domain: Domain, blocks: Sequence[BlockSpec], cliques: Sequence[Sequence[str]], max_cells: int) -> list[BlockSpec]:
    """Merge blocks while the merged block's marginal has at most ``max_cells`` cells.

    Two phases, both exact (``combine_blocks``), decided by ``merge_layout``: (1) each residual
    block joins the largest query clique that contains it and fits the limit (the total and
    one attribute's blocks when many cliques share them: the smallest, ``LOW_ORDER``), and the residual
    blocks of one clique become one block; (2) blocks that share attributes are merged
    pairwise, smallest union first, while the union fits. With no limit this ends in one block
    over every queried attribute, i.e. the single global SM-II solve; with ``max_cells = 0``
    nothing is merged. Merging trades solve time (a block of k rows costs O(k^3) per step) for
    privacy: one block can correlate the noise of its parts, which a block-diagonal plan cannot.
    """
    by_attributes = {tuple(block.attributes): block for block in blocks}
    merged = []
    for attributes, members in merge_layout(domain, list(by_attributes), cliques, max_cells):
        parts = [by_attributes[member] for member in members]
        merged.append(parts[0] if len(parts) == 1 else combine_blocks(domain, parts, attributes))
    return merged
