"""The hierarchy's passes split into subtrees (pure numpy): the mathematics of the estimate on the cluster.

docs/design.md section 7; issue 29 point 5. :func:`distfit.estimate.hierarchy.estimate_hierarchy`
is an upward pass (finest level first) and a downward pass (coarsest first) over the whole tree.
Cut the tree at level ``c``: every unit of level ``c`` roots a subtree (itself and its descendants
at levels ``c+1 .. L``), and the passes split exactly:

1. upward, per group of subtrees (a *forest*, independent of the others): the upward pass of its
   levels ``c .. L`` (:func:`forest_upward`), handing up its roots' :class:`Summary` (``I_u`` per
   class, ``m_u`` per root): everything the levels above need of it (hierarchy's module
   docstring: a parent sees its children only through ``I_c`` and ``m_c``);
2. the top, in one place: the summaries merged (:func:`merge_summaries`) and both passes over
   levels ``0 .. c`` with level ``c``'s units as leaves given by their summaries
   (:func:`top_estimate`): the estimates, covariances and outside information of levels ``0 .. c``;
3. downward, per forest: its roots' :class:`Top` (their ``x``, ``P`` and ``O``) and the upward
   state of step 1 give the downward pass of its levels ``c+1 .. L`` (:func:`forest_downward`).

The result is the same estimate (the same formulas on the same numbers; the classes are found per
forest, and a class two forests share is computed twice, in the same way, so the estimates agree
to float rounding: ``tests/estimate/test_hierarchy.py`` against the whole-tree passes and the dense
GLS). Each forest's memory is its own units' arrays and its classes' matrices, whatever the size
of a level; the top holds levels ``0 .. c`` and one matrix per distinct class of level ``c``'s
subtrees (cost: :func:`choose_cut`).

In the shared basis (:mod:`distfit.estimate.shared_basis`: every level's ``J`` diagonal in one
``Q``, found once from all the levels and given to every forest and to the top) a summary and a
top are ``d``-vectors per root and the passes hold no ``cells x cells`` matrix per unit: the cut
and the forests are then bounded by units and rows alone (``cells`` 0 in :func:`choose_cut`
and :func:`matrix_units`'s callers).

A forest's rows. A forest is a set of consecutive units of level ``c`` whose descendants are
consecutive at every level (the release orders each level's units by their parent's row:
:func:`descendant_spans` checks it); its parents are its rows at the level above, shifted to
start at 0 (:func:`local_parents`).
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from distfit.estimate.hierarchy import (
    PINV_RTOL,
    Grouping,
    HierarchyEstimate,
    Summary,
    Top,
    Upward,
    downward_pass,
    summarise,
    upward_pass,
)
from distfit.estimate.shared_basis import DiagonalUpward, diagonal_upward, shared_basis

__all__ = ["DRIVER_MATRIX_BYTES", "DRIVER_UNITS", "FOREST_MATRIX_BYTES", "MATRICES_PER_UNIT", "basis_forest_upward",
           "choose_cut",
           "descendant_spans", "estimate_by_subtrees", "forest_downward", "forest_upward", "group_roots",
           "leaf_tables", "local_parents", "matrix_units", "merge_summaries", "top_estimate"]

#: :func:`choose_cut`: the top (levels ``0 .. c``) holds at most this many units of level ``c``.
DRIVER_UNITS = 4096
#: The passes' memory per unit above the leaves, in ``cells x cells`` float64 matrices: the
#: units of a deep irregular tree are each their own class (every unit of the top, and the
#: finest level's downward classes, one per parent), and the passes hold about this many
#: matrices per class at their peak (measured, ``benchmarks/bench_tree_memory.py`` at 30,000
#: blocks and 252 cells: 13 per unit in the top, 18 in a forest, whose finest level has a
#: downward class per parent: benchmarks/README.md).
MATRICES_PER_UNIT = 18
#: :func:`choose_cut`: the top's matrices at most this many bytes (the driver's memory).
DRIVER_MATRIX_BYTES = 1 << 30
#: :func:`group_roots`: a forest's matrices at most this many bytes (a worker within 2 GiB with
#: its rows' arrays, ``subtree_job.FOREST_ROWS``).
FOREST_MATRIX_BYTES = 1 << 30


def matrix_units(cells: int, budget: int) -> int:
    """How many units above the leaves the passes can hold in ``budget`` bytes of ``cells x
    cells`` matrices (:data:`MATRICES_PER_UNIT` per unit), at least 1 (the general path's
    bound: in the shared basis there is no such matrix, and callers pass no bound)."""
    return max(1, int(budget) // (MATRICES_PER_UNIT * 8 * max(int(cells), 1) ** 2))


def choose_cut(units: Sequence[int], driver_units: int = DRIVER_UNITS, cells: int = 0,
               driver_bytes: int = DRIVER_MATRIX_BYTES) -> int:
    """The level to cut at: the finest level, above the finest, with at most ``driver_units``
    units and whose levels ``0 .. c`` together fit the top's matrices of ``cells x cells`` in
    ``driver_bytes`` (:func:`matrix_units`; ``cells`` 0: no such bound) (``units``: each
    level's, coarsest first); -1 when level 0 already does not (then nothing is cut).
    Decision: the top holds every unit of levels ``0 .. c`` with up to one class each (deep
    irregular trees: the US-shaped geography has nearly one per unit) and the matrices of each,
    so the number of those units, not of the cut level's alone, bounds the driver's memory; the
    finer the cut, the smaller each subtree (a worker's memory, :func:`group_roots`)."""
    cut = -1
    held = 0
    bound = matrix_units(cells, driver_bytes) if cells else None
    for level, n in enumerate(units[:-1]):
        held += n
        if n > driver_units or (bound is not None and held > bound):
            break
        cut = level
    return cut


def descendant_spans(counts: Sequence[np.ndarray]) -> list[np.ndarray]:
    """``spans[k][i]``: the first row at level ``c + k`` of the descendants of level ``c``'s unit
    ``i`` (``spans[k]`` has ``units_c + 1`` entries, the last the level's size), from
    ``counts[k]``: each unit of level ``c + k``'s number of children (k = 0 .. L - c - 1), when
    every level orders its units by their parent's row."""
    spans = [np.arange(counts[0].size + 1, dtype=np.int64)]
    for count in counts:
        offsets = np.concatenate([[0], np.cumsum(count, dtype=np.int64)])
        spans.append(offsets[spans[-1]])
    return spans


def group_roots(spans: Sequence[np.ndarray], max_rows: int, max_inner: int | None = None) -> list[tuple[int, int]]:
    """Consecutive units of the cut level in groups ``(first, stop)`` whose rows at every level
    from the cut down total at most ``max_rows``, and whose rows above the finest level (the
    units whose matrices the passes hold: :func:`matrix_units`) at most ``max_inner`` (None: no
    such bound); a group of one unit may have more (a worker holds one subtree at least)."""
    rows = sum(np.diff(s) for s in spans)  # each root's rows over all its levels
    total = np.concatenate([[0], np.cumsum(rows)])
    inner = np.concatenate([[0], np.cumsum(sum(np.diff(s) for s in spans[:-1]))]) if max_inner is not None else None
    groups, first = [], 0
    roots = rows.size
    while first < roots:
        stop = int(np.searchsorted(total, total[first] + max_rows, side="right")) - 1
        if inner is not None:
            stop = min(stop, int(np.searchsorted(inner, inner[first] + max_inner, side="right")) - 1)
        stop = min(max(stop, first + 1), roots)
        groups.append((first, stop))
        first = stop
    return groups


def local_parents(parent_rows: np.ndarray, above_start: int) -> np.ndarray:
    """A forest's parent rows at a level: the rows of the level above, shifted to the forest's
    first row there."""
    return np.asarray(parent_rows, dtype=np.int64) - int(above_start)


def forest_upward(information: Sequence[np.ndarray], linear: Sequence[np.ndarray],
                  parent_of: Sequence[np.ndarray | None], *, rtol: float = PINV_RTOL,
                  basis: np.ndarray | None = None) -> tuple[Upward | DiagonalUpward, Summary]:
    """Step 1 (module docstring): a forest's levels ``c .. L`` (its roots at level 0, their
    ``parent_of`` None) through the upward pass; returns its state and its roots' summary.
    Levels from the first one where the forest has no unit are left out (the state then has
    fewer levels: :func:`forest_downward` gives those levels no rows). ``basis``: the shared
    basis of every level's ``J``, the whole tree's (:func:`distfit.estimate.shared_basis.shared_basis`
    of all the levels, found once: every forest and the top must use the same one), or None
    (the general path)."""
    depth = next((k for k, h in enumerate(linear) if np.shape(h)[0] == 0), len(linear))
    state = upward_pass(information[:depth], linear[:depth], [None, *parent_of[1:depth]], rtol=rtol, basis=basis)
    return state, summarise(state)


def basis_forest_upward(own: Sequence[np.ndarray], linear: Sequence[np.ndarray | None],
                        parent_of: Sequence[np.ndarray | None], basis: np.ndarray, *,
                        leaf_sums: np.ndarray | None = None, leaf_tables: np.ndarray | None = None,
                        rtol: float = PINV_RTOL) -> tuple[DiagonalUpward, Summary]:
    """:func:`forest_upward` in the levels' shared ``basis`` with each level's ``h~ = Q^T h``
    given (``linear[k]``, units x d: :class:`distfit.estimate.level_stores.BasisTerms` forms it
    from the answers) and its ``J``'s eigenvalues ``own[k]`` (d,): no change of basis, the same
    passes (:func:`distfit.estimate.shared_basis.diagonal_upward`). ``leaf_sums``: the finest
    level's ``h~`` summed by parent (``linear[-1]`` None), enough for the summary (step 1), and
    for the downward pass (step 3) with ``leaf_tables``, the leaves' ``J^+ h_c``
    (:func:`distfit.estimate.shared_basis.diagonal_upward`). Every level must have units."""
    units = [h.shape[0] for h in linear[:-1]] + [parent_of[-1].size if linear[-1] is None else linear[-1].shape[0]]
    parents = [None] + [np.asarray(up, dtype=np.int64) for up in parent_of[1:]]
    groupings = [None] + [Grouping.of(up, units[k]) for k, up in enumerate(parents[1:])]
    state = diagonal_upward([np.asarray(v, dtype=np.float64).reshape(1, -1) for v in own], linear, parents,
                            groupings, basis, rtol, in_basis=True, leaf_sums=leaf_sums, leaf_tables=leaf_tables)
    return state, summarise(state)


def merge_summaries(summaries: Sequence[Summary]) -> Summary:
    """The summaries of consecutive forests as one (their roots in order, the classes numbered
    across them; classes equal in every bit are kept once); in their shared basis when they all
    have the same one (each root its own class, its diagonal), else as matrices."""
    basis = summaries[0].basis if summaries else None
    if basis is not None and all(s.basis is not None and np.array_equal(s.basis, basis) for s in summaries):
        information = np.concatenate([s.information[s.unit_class] for s in summaries])
        return Summary(information, np.arange(information.shape[0], dtype=np.int64),
                       np.concatenate([s.mean for s in summaries]), basis)
    summaries = [s.as_matrices() for s in summaries]
    stacked = np.concatenate([s.information for s in summaries])
    offsets = np.cumsum([0] + [s.information.shape[0] for s in summaries[:-1]])
    index = np.concatenate([s.unit_class + o for s, o in zip(summaries, offsets)])
    flat = np.ascontiguousarray(stacked).reshape(stacked.shape[0], -1)
    _, first, inverse = np.unique(flat, axis=0, return_index=True, return_inverse=True)
    return Summary(stacked[first], inverse.reshape(-1)[index].astype(np.int64),
                   np.concatenate([s.mean for s in summaries]))


def top_estimate(information: Sequence[np.ndarray], linear: Sequence[np.ndarray],
                 parent_of: Sequence[np.ndarray | None], leaves: Summary, *, split: str,
                 rtol: float = PINV_RTOL) -> HierarchyEstimate:
    """Step 2 (module docstring): levels ``0 .. c`` (``information`` and ``linear`` of levels
    ``0 .. c - 1``; level ``c``'s units given by ``leaves``) through both passes."""
    d = leaves.mean.shape[1]
    state = upward_pass([*information, np.zeros((d, d))], [*linear, leaves.mean], parent_of, rtol=rtol,
                        leaves=leaves)
    return downward_pass(state, split=split)


def forest_downward(state: Upward | DiagonalUpward, top: Top, *, split: str, outside: bool = True,
                    leaf_offsets: bool = False) -> HierarchyEstimate:
    """Step 3 (module docstring): a forest's levels ``c .. L`` down from its roots' ``top``
    (level 0 of the result is the roots, as given; levels :func:`forest_upward` left out are
    not in it). ``outside`` and ``leaf_offsets``: :func:`distfit.estimate.hierarchy.downward_pass`'s
    (with ``leaf_offsets`` the leaves' tables are :func:`leaf_tables`, formed by their reader)."""
    return downward_pass(state, split=split, top=top, outside=outside, leaf_offsets=leaf_offsets)


def leaf_tables(offsets: np.ndarray, parent_tables: np.ndarray, tables: np.ndarray, parent: np.ndarray,
                complete: np.ndarray, before: np.ndarray | None = None) -> np.ndarray:
    """Leaves' tables (rows x d) in the shared basis from their own ``J^+ h_c`` (``tables``, rows x
    d) and their parents' offsets ``Q (G r)_p`` (``offsets``, parents x d; ``parent`` each row's
    parent there): ``x_c = J^+ h_c + Q (G r)_p``
    (:func:`distfit.estimate.shared_basis.diagonal_downward`), and for each parent in
    ``complete`` (those whose every child is among the rows, in order) the rounding of ``sum_c
    G_c = I`` given to its last child, ``x_last += x_p - sum_c x_c`` (``parent_tables``: the
    parents' own tables ``x_p``), so that the children sum to their parent. The same operations
    on the same numbers as the downward pass over the whole forest (each parent's sum runs over
    its children in order from 0, whatever other rows are there): equal to it bit for bit. The
    leaves' reader forms them so, from the release rows it reads anyway (docs/design.md section
    7): the downward pass needs only their parents' sums. ``before``: more rows' ``J^+ h_c``
    before ``tables`` (``parent`` and the result then cover both; not copied together first)."""
    x = offsets[parent]
    if before is None:
        x += tables
    else:
        x[:before.shape[0]] += before
        x[before.shape[0]:] += tables
    if parent.size:
        Grouping.of(parent, offsets.shape[0]).to_last_child(x, parent_tables, complete)
    return x


def estimate_by_subtrees(information: Sequence[np.ndarray], linear: Sequence[np.ndarray],
                         parent_of: Sequence[np.ndarray | None], cut: int, max_rows: int, *,
                         split: str = "equal", basis: np.ndarray | str | None = "auto"
                         ) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The three steps in one process, over forests of at most ``max_rows`` rows (each level's
    units ordered by their parent's row): per level, every unit's estimate (units x d) and
    covariance (units x d x d). ``basis``: :func:`forest_upward`'s (``"auto"``: the shared basis
    of every level's information, if any). What the cluster's job does with tasks
    (:mod:`distfit.estimate.subtree_job`), for the tests."""
    if isinstance(basis, str):
        basis = shared_basis(information)
    levels = len(linear)
    counts = [np.bincount(parent_of[level + 1], minlength=linear[level].shape[0]) for level in range(cut, levels - 1)]
    spans = descendant_spans(counts)
    groups = group_roots(spans, max_rows)
    forests = []
    for first, stop in groups:
        rows = [slice(int(s[first]), int(s[stop])) for s in spans]
        js = [j if np.ndim(j) == 2 else j[r] for j, r in zip(information[cut:], rows)]
        hs = [h[r] for h, r in zip(linear[cut:], rows)]
        ups = [None] + [local_parents(parent_of[cut + k][rows[k]], rows[k - 1].start) for k in range(1, len(rows))]
        forests.append((rows, *forest_upward(js, hs, ups, basis=basis)))
    top = top_estimate(information[:cut], linear[:cut], parent_of[:cut + 1],
                       merge_summaries([f[2] for f in forests]), split=split)
    xs = [top.x[level] for level in range(cut + 1)]
    covs = [top.unit("covariance", level) for level in range(cut + 1)]
    below_x: list[list[np.ndarray]] = [[] for _ in range(levels - cut - 1)]
    below_cov: list[list[np.ndarray]] = [[] for _ in range(levels - cut - 1)]
    for (rows, state, _), (first, stop) in zip(forests, groups):
        result = forest_downward(state, top.top(cut, slice(first, stop)), split=split)
        for k in range(1, len(result.x)):
            below_x[k - 1].append(result.x[k])
            below_cov[k - 1].append(result.unit("covariance", k))
    d = linear[0].shape[1]
    xs += [np.concatenate([np.zeros((0, d)), *parts]) for parts in below_x]
    covs += [np.concatenate([np.zeros((0, d, d)), *parts]) for parts in below_cov]
    return xs, covs
