"""Integer tables from nonnegative estimates: controlled rounding that keeps totals (pure numpy and scipy).

docs/design.md section 7 (the rounding step of the Census TopDown algorithm, done here by largest
remainder and by a network flow). The functions round a nonnegative data vector cell by cell, each cell to the
floor or the ceiling of its value, and choose which cells go up so that a sum is kept exactly:

* :func:`round_preserving_total`: each unit's total, ``sum_c n_uc = round(sum_c x_uc)``;
* :func:`round_children`: for every parent and every cell, the children's counts sum to the
  parent's (integer) count in that cell;
* :func:`round_controlled`: both at once, and more: the children's cells sum to the parent's
  counts exactly while every child's total and its sums over a laminar family of sets of cells
  stay within 1 of its real-valued ones (below, "Controlled rounding").

Largest remainder. With ``f = floor(x)`` and the remainders ``r = x - f`` (``0 <= r < 1``), a
group of entries whose integer sum must be ``N`` needs ``D = N - sum f`` of its entries raised
by one; the ``D`` entries with the largest remainders are raised (ties: the lower index first,
a stable sort), the others stay at their floor.

Proof that every entry is its floor or ceiling. An entry is raised only if its remainder is
positive: let ``c`` be the number of entries of the group with ``r > 0``; then ``sum r < c``
when ``c > 0`` and ``sum r = 0`` when ``c = 0``.
(a) Unit totals: ``D = floor(sum r + 1/2)`` (so ``sum f + D = round(sum x)``, halves up), hence
``0 <= D <= c`` (``D <= sum r + 1/2 < c + 1/2`` and D is an integer; ``D = 0`` when ``c = 0``):
the ``D`` largest remainders are all positive, and a raised entry ``f + 1 = ceil(x)``.
(b) Children: the children's values sum to the parent's count up to rounding error ``e``
(``|e| < 1/2`` is checked), ``sum r = N - sum f + e = D + e``; ``D`` is an integer with ``D >=
-e > -1/2`` so ``D >= 0``, and ``c > sum r = D + e > D - 1/2`` so ``c >= D``.
Either way the group's sum is ``sum f + D = N`` exactly.

Consistency. The counts are one integer vector ``n`` per unit, and every table is ``W n`` for
0/1 query rows (:func:`distfit.estimate.measurements.workload_estimates`): integers, each
table's total the unit's total, every marginal the sum of the finer tables, all exactly (each
is a sum of the same integers). Children rounded by :func:`round_children` sum to their parent
cell by cell, so every table of the children sums to the parent's table.

Vectorised: one stable ``argsort`` / ``lexsort`` over all entries; no loop over units, parents
or cells.

Controlled rounding (:func:`round_controlled`; Cox, "A constructive procedure for unbiased
controlled rounding", JASA 82, 1987, here as a network flow). :func:`round_children` rounds each
cell among its siblings alone, so a child's total over ``d`` cells gathers ``d`` independent
rounding errors (at 224 cells, ~3 on a total: benchmarks/README.md). Instead, let the children
of one parent be a table ``x`` (children x cells), ``r = x - floor(x)``, and a *laminar family*
``F`` of sets of cells (any two disjoint or nested; :func:`laminar_family` picks one from a
level's queries), with the set of every cell added as its root. A 0/1 table ``b`` (``b = 0``
where ``r = 0``) gives the integers ``n = floor(x) + b``; we ask that

* every column (a cell of the parent) sums to the parent's count: ``sum_i b_ic = C_c``, the
  parent's count less the children's floors;
* every child's sum over each set ``S`` of ``F`` (the total included) is ``floor(sigma)`` or
  ``ceil(sigma)``, ``sigma = sum_{c in S} r_ic``; so within 1 of ``x``'s.

These are the flows of a network: a source per parent; under it each child's tree of sets
(source -> the child's total -> its sets, each set under the smallest set containing it; arc
bounds ``[floor sigma, ceil sigma]``); an arc of capacity 1 from the smallest set holding cell
``c`` to the parent's column node ``c`` for every fractional entry; each column node to a sink
with bounds ``[C_c, C_c]``. Its constraint matrix is a network matrix (two laminar families,
the children's sets and the columns), totally unimodular, so it has an integral feasible flow
whenever it has a fractional one (Hoffman's circulation theorem); and ``r`` is one (its column
sums are ``C_c`` exactly when the children sum to the parent, its set sums ``sigma``
themselves). So the rounding always exists: a 2-D controlled rounding of each parent's table
that keeps the columns and every child's total and set sums within 1, at once.

Which one. The children's totals are first rounded among siblings by largest remainder (as
:func:`round_children` with one cell, so they sum to the parent's total; what the nearest
rounding of each total would be, kept where the sum allows) and pinned there; where the cells
forbid that (e.g. two children with half a unit each in a cell holding one unit, and two with
half a unit in another cell: the tie puts both units in the first cell) the component is solved
again with each total only ``floor`` or ``ceil``. Without a parent (the root level) every row is
its own component with one node for all its cells and the total pinned to ``round(sum x)``
(halves up, as :func:`round_preserving_total`): always feasible, since the flows of a tree
projected onto its total form an interval with integer ends around ``sum r``. The cells start
from :func:`round_children` (:func:`round_preserving_total` at the root), nearest cell by cell
under the exact column sums, and the flow is a *correction* of that start: an arc raises an
entry at its floor, a reverse arc lowers one at its ceiling, the set arcs carry the change of
the set sums (bounds ``[floor sigma - start's sum, ceil sigma - start's sum]``) and the columns
must not change. Lower bounds are taken out as usual (flow ``= low + f``, ``0 <= f <= high -
low``, each node's forced surplus fed from a super-source and its deficit drained to a
super-sink), one ``scipy.sparse.csgraph.maximum_flow`` (Dinic) runs every parent at once, and a
component is feasible exactly when its super-source arcs are saturated (components meet only at
the super-source and -sink, so the maximum flow saturates every feasible one). Dinic's
augmenting paths are shortest paths, so the correction moves few entries; where a flow of ``k``
units runs between one set node and one column node (several entries: the root's one column
node) the ``k`` entries of largest remainder are raised (smallest, lowered). Deterministic: no
randomness; the flow's choice depends only on the input.

Float rounding. A sum within :data:`NEAR_INTEGER` of an integer ``k`` gets the bounds ``[k - 1,
k + 1]`` (so within 1 of ``x``'s up to that tolerance), which keeps ``r`` strictly inside every
bound after the small change that makes its column sums exact (the children's sum to the parent
up to float rounding, far below :data:`NEAR_INTEGER`). A component still infeasible (inputs that
break that) keeps the start: the columns exact, the totals unconstrained.

Cost: one maximum flow over ``O(units x sets + parents x cells)`` nodes and an arc per
fractional entry; at 20,000 counties x 224 cells (4.5M entries) a few CPU-s
(benchmarks/README.md, "Issue 29 point 4: `--integer` by controlled rounding").
"""
from __future__ import annotations

import numpy as np
import scipy.sparse
from scipy.sparse.csgraph import maximum_flow

__all__ = ["NEAR_INTEGER", "NEGATIVE_TOLERANCE", "laminar_family", "round_children", "round_controlled",
           "round_preserving_total"]

#: Values down to this much below zero are rounding errors of a nonnegative solution (clipped).
NEGATIVE_TOLERANCE = 1e-6
#: :func:`round_controlled`: a sum this close to an integer ``k`` may round to ``k - 1``, ``k`` or
#: ``k + 1`` (the slack that makes the rounding exist whatever the float rounding of its input).
NEAR_INTEGER = 1e-6


def _nonnegative_matrix(x, name: str) -> np.ndarray:
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected a 2-d array (rows x cells), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}: values must be finite")
    if arr.size and arr.min() < -NEGATIVE_TOLERANCE:
        row, cell = np.argwhere(arr < -NEGATIVE_TOLERANCE)[0]
        raise ValueError(f"{name}: row {row}, cell {cell} holds {float(arr[row, cell])!r}, a negative value")
    return np.maximum(arr, 0.0)


def _raise_largest(floor: np.ndarray, order: np.ndarray, group_start: np.ndarray,
                   group_of: np.ndarray, deficit: np.ndarray) -> np.ndarray:
    """``floor + 1`` on the first ``deficit[group]`` entries of each group in ``order`` (flat
    indices sorted by group, then by remainder descending, then by index)."""
    position = np.arange(order.size) - group_start[group_of[order]]
    raise_sorted = position < deficit[group_of[order]]
    out = floor.ravel().copy()
    out[order[raise_sorted]] += 1
    return out.reshape(floor.shape)


def round_preserving_total(x) -> np.ndarray:
    """Integer counts (units x cells, int64): each cell ``floor(x)`` or ``ceil(x)``, each row
    summing to ``round(sum x)`` (halves up), by largest remainder (module docstring; ties: the
    lower cell first). ``x`` (units x cells) must be nonnegative (down to -1e-6, clipped)."""
    arr = _nonnegative_matrix(x, "x")
    units, cells = arr.shape
    floor = np.floor(arr)
    remainder = arr - floor
    deficit = np.floor(remainder.sum(axis=1) + 0.5).astype(np.int64)
    order_in_row = np.argsort(-remainder, axis=1, kind="stable")
    order = (order_in_row + (np.arange(units) * cells)[:, None]).ravel()
    group_of = np.repeat(np.arange(units), cells)
    group_start = np.arange(units) * cells
    return _raise_largest(floor.astype(np.int64), order, group_start, group_of, deficit)


def round_children(x_children, parent_of, parent_counts) -> np.ndarray:
    """Integer counts of the children (n x cells, int64): each cell ``floor`` or ``ceil`` of
    ``x_children``, and for every parent ``j`` and cell ``c``, ``sum_{i: parent_of[i] = j}
    n[i, c] = parent_counts[j, c]`` exactly (largest remainder across the parent's children,
    module docstring; ties: the lower child row first).

    ``x_children`` (n x cells) nonnegative; ``parent_of`` (n,) integers in ``0..p-1``;
    ``parent_counts`` (p x cells) nonnegative integers. The children of each parent must sum to
    its counts up to rounding error (less than 1/2 per cell, e.g. the output of a projection
    whose children sum to the parent): ValueError naming the parent and cell otherwise.
    """
    arr = _nonnegative_matrix(x_children, "x_children")
    n, cells = arr.shape
    parents = np.asarray(parent_of)
    if parents.shape != (n,) or (parents.size and not np.issubdtype(parents.dtype, np.integer)):
        raise ValueError(f"parent_of: expected {n} integers, got shape {parents.shape} dtype {parents.dtype}")
    counts = np.asarray(parent_counts)
    if counts.ndim != 2 or counts.shape[1] != cells:
        raise ValueError(f"parent_counts: shape {counts.shape}, expected (parents, {cells})")
    if counts.size and not (np.issubdtype(counts.dtype, np.integer)
                            or np.all(counts == np.round(counts))):
        raise ValueError("parent_counts: expected integer counts")
    counts = counts.astype(np.int64)
    if counts.size and counts.min() < 0:
        raise ValueError("parent_counts: negative count")
    p = counts.shape[0]
    if parents.size and (parents.min() < 0 or parents.max() >= p):
        raise ValueError(f"parent_of: parent index outside 0..{p - 1}")
    sums = np.zeros((p, cells))
    np.add.at(sums, parents, arr)
    gap = np.abs(sums - counts)
    if gap.size and gap.max() >= 0.5:
        parent, cell = np.unravel_index(np.argmax(gap), gap.shape)
        raise ValueError(f"x_children: the children of parent {parent} sum to {float(sums[parent, cell])!r} in cell {cell}, "
                         f"not to its count {counts[parent, cell]}")
    floor = np.floor(arr).astype(np.int64)
    remainder = arr - floor
    floor_sums = np.zeros((p, cells), dtype=np.int64)
    np.add.at(floor_sums, parents, floor)
    deficit = (counts - floor_sums).ravel()
    # one group per (parent, cell): flat entry (i, c) belongs to group parent_of[i] * cells + c
    group_of = (parents[:, None] * cells + np.arange(cells)[None, :]).ravel()
    # entries are in row order: a stable sort by remainder, then by group, leaves ties by row
    order = np.lexsort((-remainder.ravel(), group_of))
    group_start = np.zeros(p * cells + 1, dtype=np.int64)
    np.cumsum(np.bincount(group_of, minlength=p * cells), out=group_start[1:])
    return _raise_largest(floor, order, group_start[:-1], group_of, deficit)


def laminar_family(workload) -> np.ndarray:
    """The sets of cells (k x cells, bool) whose sums :func:`round_controlled` keeps within 1:
    the 0/1 rows of ``workload`` (m x cells; e.g. a level's queries) that form a laminar family
    (any two disjoint or nested), chosen greedily, largest first (ties: workload order), a row
    kept when it is laminar with every row kept before it. Rows of one cell or of every cell,
    repeats and rows with other coefficients are left out (a cell and the total are kept anyway).
    The greedy choice is a decision, not an optimum: of crossing queries (e.g. age x sex and race
    x Hispanic origin, each over all cells) the larger sets win. Empty (0 x cells) for None."""
    if workload is None:
        return np.zeros((0, 0), dtype=bool)
    w = np.asarray(workload)
    if w.ndim != 2:
        raise ValueError(f"workload: expected a 2-d array (queries x cells), got shape {w.shape}")
    cells = w.shape[1]
    rows = w[np.all((w == 0) | (w == 1), axis=1)].astype(bool)
    size = rows.sum(axis=1)
    rows, size = rows[(size > 1) & (size < cells)], size[(size > 1) & (size < cells)]
    _, first = np.unique(rows, axis=0, return_index=True)
    first = np.sort(first)
    rows, size = rows[first], size[first]
    kept: list[int] = []
    # a loop over the level's queries (tens to hundreds), once per level: not over units or cells
    for q in np.argsort(-size, kind="stable"):
        if kept:
            overlap = rows[kept].astype(np.int64) @ rows[q].astype(np.int64)
            if not np.all((overlap == 0) | (overlap == size[q]) | (overlap == size[kept])):
                continue
        kept.append(int(q))
    return rows[np.sort(np.asarray(kept, dtype=np.int64))]


def _family_tree(family, cells: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(sets, parent, leaf)``: the sets (G x cells, bool), set 0 every cell and then
    ``family``; each set's parent, the smallest set strictly containing it (-1 for set 0); each
    cell's leaf, the smallest set containing it. ValueError unless ``family`` is laminar, of
    distinct sets, none empty or of every cell."""
    family = np.zeros((0, cells), dtype=bool) if family is None or np.size(family) == 0 else np.asarray(family)
    if family.ndim != 2 or family.shape[1] != cells or not np.all((family == 0) | (family == 1)):
        raise ValueError(f"family: expected a 0/1 array (sets, {cells}), got shape {family.shape}")
    sets = np.vstack([np.ones((1, cells), dtype=bool), family.astype(bool)])
    size = sets.sum(axis=1)
    if np.any(size[1:] == 0) or np.any(size[1:] == cells):
        raise ValueError("family: a set is empty or holds every cell")
    overlap = sets.astype(np.int64) @ sets.T.astype(np.int64)
    inside = overlap == size[:, None]  # inside[g, h]: set g is a subset of set h
    if np.any(inside & inside.T & ~np.eye(size.size, dtype=bool)):
        raise ValueError("family: a set appears twice")
    if not np.all((overlap == 0) | inside | inside.T):
        g, h = np.argwhere(~((overlap == 0) | inside | inside.T))[0]
        raise ValueError(f"family: sets {g - 1} and {h - 1} cross (neither disjoint nor nested)")
    np.fill_diagonal(inside, False)
    parent = np.argmin(np.where(inside, size[None, :], cells + 1), axis=1)
    parent[0] = -1
    leaf = np.argmin(np.where(sets, size[:, None], cells + 1), axis=0)
    return sets, parent, leaf


def _bounds(sums: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(floor, ceil)`` of sums of remainders, ``(k - 1, k + 1)`` (at least 0) within
    :data:`NEAR_INTEGER` of an integer ``k`` (module docstring, "Controlled rounding")."""
    k = np.rint(sums)
    near = np.abs(sums - k) <= NEAR_INTEGER
    return (np.where(near, np.maximum(k - 1.0, 0.0), np.floor(sums)).astype(np.int64),
            np.where(near, k + 1.0, np.ceil(sums)).astype(np.int64))


def _correct(remainder: np.ndarray, start: np.ndarray, component: np.ndarray, column: np.ndarray,
             sets: np.ndarray, parent: np.ndarray, leaf: np.ndarray, low: np.ndarray, high: np.ndarray
             ) -> tuple[np.ndarray, np.ndarray]:
    """``(raised, feasible)``: 0/1 raises (rows x cells) and, per component, whether its rows'
    set sums lie in ``[low, high]`` (rows x sets, in raises); where not, the component keeps
    ``start``. One maximum flow over every component at once (module docstring)."""
    n, cells = remainder.shape
    groups = sets.shape[0]
    components = int(component.max(initial=-1)) + 1
    columns = int(column.max(initial=-1)) + 1
    tree = 2 + components + np.arange(n)[:, None] * groups + np.arange(groups)[None, :]  # node (row, set)
    column_node = 2 + components + n * groups + column  # (rows x cells)
    nodes = 2 + components + n * groups + columns
    have = start @ sets.T.astype(np.int64)  # the sets' sums of ``start``
    lower, upper = low - have, high - have  # a correction d: low <= have + d <= high
    rows, cols = np.nonzero(remainder > 0)  # an entry at an integer has nothing to choose
    entry_tree = tree[rows, leaf[cols]]
    entry_column = column_node[rows, cols]
    rising = start[rows, cols] == 0
    # arcs (tail, head, lower, upper): component -> total, set parent -> set, entries (raise:
    # tree -> column, lower: column -> tree), every flow the change of a sum
    tail = np.concatenate([2 + component, tree[:, parent[1:]].ravel(), np.where(rising, entry_tree, entry_column)])
    head = np.concatenate([tree[:, 0], tree[:, 1:].ravel(), np.where(rising, entry_column, entry_tree)])
    low_arc = np.concatenate([lower[:, 0], lower[:, 1:].ravel(), np.zeros(rows.size, dtype=np.int64)])
    high_arc = np.concatenate([upper[:, 0], upper[:, 1:].ravel(), np.ones(rows.size, dtype=np.int64)])
    # lower bounds out (flow = low + f, 0 <= f <= high - low): a source S (node 0) feeds each
    # node's surplus of forced inflow, a sink T (node 1) drains its deficit
    excess = np.bincount(head, weights=low_arc, minlength=nodes) - np.bincount(tail, weights=low_arc, minlength=nodes)
    excess = np.rint(excess).astype(np.int64)
    feed, drain = np.flatnonzero(excess > 0), np.flatnonzero(excess < 0)
    tails = np.concatenate([tail, np.zeros(feed.size, dtype=np.int64), drain])
    heads = np.concatenate([head, feed, np.ones(drain.size, dtype=np.int64)])
    caps = np.concatenate([high_arc - low_arc, excess[feed], -excess[drain]])
    keep = caps > 0
    graph = scipy.sparse.csr_array((caps[keep].astype(np.int32), (tails[keep], heads[keep])), shape=(nodes, nodes))
    graph.sum_duplicates()
    flow = maximum_flow(graph, 0, 1, method="dinic").flow.tocoo()  # antisymmetric: the net flow
    moving = flow.data > 0
    flow_key = flow.row[moving].astype(np.int64) * nodes + flow.col[moving]
    order = np.argsort(flow_key)
    flow_key, flow_value = flow_key[order], flow.data[moving][order].astype(np.int64)

    def carried(tails: np.ndarray, heads: np.ndarray) -> np.ndarray:
        """The net flow on arcs ``tails -> heads`` where positive, else 0."""
        key = tails.astype(np.int64) * nodes + heads
        if not flow_key.size:
            return np.zeros(key.size, dtype=np.int64)
        at = np.minimum(np.searchsorted(flow_key, key), flow_key.size - 1)
        return np.where(flow_key[at] == key, flow_value[at], 0)

    short = np.zeros(nodes, dtype=bool)
    short[feed] = carried(np.zeros(feed.size, dtype=np.int64), feed) < excess[feed]
    node_component = np.full(nodes, -1, dtype=np.int64)
    node_component[2:2 + components] = np.arange(components)
    node_component[tree.ravel()] = np.repeat(component, groups)
    node_component[column_node.ravel()] = np.repeat(component, cells)
    feasible = np.ones(components, dtype=bool)
    feasible[node_component[short]] = False
    # the flow of each (tree leaf, column) pair: raise that many of its raisable entries, those
    # of largest remainder (or lower that many of its lowerable ones, those of smallest)
    net = np.where(rising, carried(entry_tree, entry_column), carried(entry_column, entry_tree))
    candidates = np.flatnonzero(net > 0)
    key = np.where(rising, entry_tree, entry_column)[candidates].astype(np.int64) * nodes \
        + np.where(rising, entry_column, entry_tree)[candidates]
    value = remainder[rows[candidates], cols[candidates]]
    order = np.lexsort((np.where(rising[candidates], -value, value), key))
    sorted_key = key[order]
    starts = np.flatnonzero(np.r_[True, sorted_key[1:] != sorted_key[:-1]]) if order.size else np.zeros(0, np.int64)
    rank = np.arange(order.size) - np.repeat(starts, np.diff(np.r_[starts, order.size]))
    moved = candidates[order[rank < net[candidates][order]]]
    out = start.copy()
    out[rows[moved], cols[moved]] += np.where(rising[moved], 1, -1)
    keep_start = ~feasible[component]
    out[keep_start] = start[keep_start]
    return out, feasible


def round_controlled(x, family=None, parent_of=None, parent_counts=None) -> np.ndarray:
    """Integer counts (rows x cells, int64), each cell ``floor(x)`` or ``ceil(x)``, keeping
    every row's total and its sums over each set of ``family`` (sets x cells, 0/1, laminar:
    :func:`laminar_family`) within 1 of ``x``'s (module docstring, "Controlled rounding").
    Without ``parent_of`` each row's total is ``round(sum x)`` (halves up), as
    :func:`round_preserving_total`; with ``parent_of`` (rows,) and ``parent_counts`` (parents x
    cells, nonnegative integers; :func:`round_children`'s arguments) the children of each parent
    sum exactly to its counts, cell by cell, and their totals are first rounded among siblings by
    largest remainder (kept where the cells allow, else each child's total floor or ceil).
    Deterministic (no randomness: one maximum flow, and ties by remainder then position)."""
    arr = _nonnegative_matrix(x, "x")
    n, cells = arr.shape
    sets, parent, leaf = _family_tree(family, cells)
    floor = np.floor(arr)
    remainder = arr - floor
    floor = floor.astype(np.int64)
    totals = remainder.sum(axis=1, keepdims=True)
    if parent_of is None:
        start = round_preserving_total(arr) - floor
        target = round_preserving_total(totals)[:, 0]
        component = np.arange(n)
        column = np.broadcast_to(component[:, None], (n, cells))  # one node per row: its total stays
    else:
        start = round_children(arr, parent_of, parent_counts) - floor  # checks the arguments
        component = np.asarray(parent_of, dtype=np.int64)
        demand = _child_demand(floor, component, np.asarray(parent_counts))
        target = round_children(totals, component, demand.sum(axis=1, keepdims=True))[:, 0]
        column = component[:, None] * cells + np.arange(cells)[None, :]
    low, high = _bounds(remainder @ sets.T.astype(np.float64))
    low[:, 0] = high[:, 0] = target
    raised, feasible = _correct(remainder, start, component, column, sets, parent, leaf, low, high)
    if not feasible.all():  # totals kept within 1 instead of at the largest-remainder rounding
        rows = np.flatnonzero(~feasible[component])
        _, comp = np.unique(component[rows], return_inverse=True)
        _, col = np.unique(column[rows], return_inverse=True)
        low2, high2 = _bounds(remainder[rows] @ sets.T.astype(np.float64))
        raised[rows], _ = _correct(remainder[rows], start[rows], comp.reshape(-1), col.reshape(rows.size, cells),
                                   sets, parent, leaf, low2, high2)
    return floor + raised


def _child_demand(floor: np.ndarray, parent_of: np.ndarray, parent_counts: np.ndarray) -> np.ndarray:
    """``parent_counts - sum of the children's floors`` (parents x cells): the raises each
    parent's cells need."""
    sums = np.zeros(parent_counts.shape, dtype=np.int64)
    np.add.at(sums, parent_of, floor)
    return parent_counts.astype(np.int64) - sums
