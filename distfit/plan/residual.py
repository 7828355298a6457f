"""Cutting a workload into blocks: residual blocks, merged under ``max_cells`` (DESIGN.md section 2).

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

from distfit.domain import Domain
from distfit.workload import validate_targets

GroupLike = tuple  # (name, {attribute: Q_i}, target scalar or per-query array)


@dataclass(frozen=True, eq=False)
class BlockSpec:
    """One block: a sub-workload ``recon @ basis`` on the marginal of ``attributes``.

    ``basis`` columns are the cells of that marginal, row-major in the schema's order (DESIGN.md
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


def _group_parts(domain: Domain, group: GroupLike, first_query: int):
    name, per_attribute, target = group
    clique = tuple(attribute for attribute in domain.names if attribute in per_attribute)
    unknown = [attribute for attribute in per_attribute if attribute not in domain.names]
    if unknown:
        raise ValueError(f"groups[{name!r}]: unknown attribute {unknown[0]!r}")
    matrices = {attribute: np.asarray(per_attribute[attribute], dtype=float) for attribute in clique}
    for attribute in clique:
        if matrices[attribute].ndim != 2 or matrices[attribute].shape[1] != domain.size_of(attribute):
            raise ValueError(
                f"groups[{name!r}]: query matrix for {attribute!r} must have {domain.size_of(attribute)} columns, "
                f"got shape {matrices[attribute].shape}"
            )
    rows = math.prod(matrices[attribute].shape[0] for attribute in clique)
    try:
        targets = validate_targets(target, rows)
    except ValueError as error:
        raise ValueError(f"groups[{name!r}].{error}") from None
    return clique, matrices, targets, np.arange(first_query, first_query + rows)


def group_targets(domain: Domain, groups: Sequence[GroupLike]) -> np.ndarray:
    """Every query's target, in workload order (the groups' rows one after another)."""
    parts, first = [], 0
    for group in groups:
        targets = _group_parts(domain, group, first)[2]
        parts.append(targets)
        first += targets.size
    return np.concatenate(parts)


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
    """

    def __init__(self, domain: Domain, groups: Sequence[GroupLike]) -> None:
        self.domain = domain
        pseudo_inverse = {name: np.linalg.pinv(difference_matrix(n)) for name, n in zip(domain.names, domain.sizes) if n > 1}
        self._groups = []
        first = 0
        for group in groups:
            clique, matrices, targets, query_index = _group_parts(domain, group, first)
            first += targets.size
            averages = {a: matrices[a].sum(axis=1, keepdims=True) / domain.size_of(a) for a in clique}
            residuals = {a: matrices[a] @ pseudo_inverse[a] for a in clique if a in pseudo_inverse}
            self._groups.append((clique, averages, residuals, targets, query_index))
        self._rows: dict[tuple[str, ...], list[tuple[int, np.ndarray]]] = {}
        for number, (clique, averages, residuals, _, query_index) in enumerate(self._groups):
            largest = {a: np.abs(f).max(axis=1) for a, f in averages.items()}
            largest_residual = {a: np.abs(f).max(axis=1) for a, f in residuals.items()}
            for subset in self._group_subsets(clique, residuals):
                row_max = functools.reduce(
                    np.kron, [largest_residual[a] if a in subset else largest[a] for a in clique], np.ones(1))
                keep = self._kept(row_max)
                if keep is not None:
                    self._rows.setdefault(subset, []).append((number, query_index[keep]))
        self.subsets: tuple[tuple[str, ...], ...] = tuple(
            sorted(self._rows, key=lambda s: (len(s), [domain.index(a) for a in s])))

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

    def query_index(self, subset: tuple[str, ...]) -> np.ndarray:
        """The workload queries with a row in the residual block of ``subset``, in row order."""
        return np.concatenate([query_index for _, query_index in self._rows[subset]])

    def residual_block(self, subset: tuple[str, ...]) -> BlockSpec:
        """The residual block of one attribute subset (basis ``kron D_i``, rows from every group
        whose clique contains it)."""
        pieces = []
        for number, _ in self._rows[subset]:
            clique, averages, residuals, targets, query_index = self._groups[number]
            recon = _kron_all([residuals[a] if a in subset else averages[a] for a in clique])
            keep = self._kept(np.abs(recon).max(axis=1))  # the rule the layout applied to row_max
            pieces.append((recon[keep], query_index[keep], targets[keep]))
        return BlockSpec(
            block_id=block_id_for(subset),
            attributes=subset,
            basis=_kron_all([difference_matrix(self.domain.size_of(a)) for a in subset]),
            recon=np.vstack([piece[0] for piece in pieces]),
            query_index=np.concatenate([piece[1] for piece in pieces]),
            targets=np.concatenate([piece[2] for piece in pieces]),
        )

    def layout(self, cliques: Sequence[Sequence[str]], max_cells: int) -> list[BlockLayout]:
        """The blocks ``merge_blocks`` would make of the residual blocks, as layouts."""
        layouts = []
        for attributes, members in merge_layout(self.domain, self.subsets, cliques, max_cells):
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
    DESIGN.md section 2), smallest subsets first."""
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


def merge_layout(
    domain: Domain, blocks: Sequence[Sequence[str]], cliques: Sequence[Sequence[str]], max_cells: int
) -> list[tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]]:
    """Which blocks to merge, decided on attribute sets alone (``merge_blocks``' rules).

    ``blocks`` are the blocks' attribute sets (distinct). Returns ``(attributes, members)`` per
    merged block, ``members`` indexing the input attribute sets in basis-row order, sorted
    smallest block first.
    """
    order = sorted({_in_domain_order(domain, clique) for clique in cliques},
                   key=lambda c: (-_cells(domain, c), [domain.index(a) for a in c]))
    groups: dict[tuple[str, ...], list[tuple[str, ...]]] = {}
    current: list[tuple[tuple[str, ...], tuple[tuple[str, ...], ...]]] = []
    for block in blocks:
        block = tuple(block)
        home = next((c for c in order if set(block) <= set(c) and _cells(domain, c) <= max_cells), None)
        if home is None:
            current.append((block, (block,)))
        else:
            groups.setdefault(home, []).append(block)
    for clique, members in groups.items():
        current.append((members[0], (members[0],)) if len(members) == 1 else (clique, tuple(members)))
    while True:
        candidates = []
        for i, j in itertools.combinations(range(len(current)), 2):
            first, second = set(current[i][0]), set(current[j][0])
            if first & second or not first or not second:
                union = _in_domain_order(domain, first | second)
                cells = _cells(domain, union)
                if cells <= max_cells:
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
    block joins the largest query clique that contains it and fits the limit, and the residual
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
