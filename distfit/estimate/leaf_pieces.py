"""The finest level's tables formed by its chunk tasks, on the cluster: the pieces that carry what they need.

Issue 29 point 6; the job is :mod:`distfit.estimate.subtree_job` (``Forests.leaf_offsets``). In
the levels' shared basis the leaves of one ``J`` (the blocks) get ``x_c = J^+ h_c + Q (G r)_p``
and their parent's last child the rounding of ``sum_c G_c = I``
(:func:`distfit.estimate.subtrees.leaf_tables`): everything the downward pass adds to a leaf's
own ``J^+ h_c`` is its parent's. So the leaves' rows are read twice, not three times: by the
upward task (their sums by parent, and the tables of the few leaves a chunk needs from the chunk
before) and by the chunk task that writes them (their tables, formed from its release rows, which
it reads and checks anyway), while the downward task reads none of them and writes per parent
what the chunk tasks add (benchmarks/README.md, session 22: at 1M PL94 blocks their rows were
2.5 KB a block read and hashed by three tasks, and 2 KB a block of tables written, hashed, read and
hashed again as pieces).

The pieces (:mod:`distfit.stores.pieces`, each checked against its digests as it is read), beside
the finest level's, named ``<level><suffix>``:

* ``.sums`` at the forest's first row of the finest level (upward task, read by the downward
  task): its leaves' ``h~`` summed by parent, all the upward pass needs of them, and the
  levels above's ``(h~, n)`` (the downward task then reads no answers at all);
* ``.carried`` at each chunk boundary ``s`` within a forest whose parent's children straddle it
  (upward task, read by the chunk task from ``s``): the tables ``J^+ h_c`` of that parent's
  children before ``s``, so that the chunk holding its last child sums all its children;
* ``.parents`` at the forest's first row of the level above (downward task, read by the chunk
  tasks, per slab of :data:`PARENT_SLAB` parents): each parent's offsets ``Q (G r)_p``, table
  ``x_p`` and residual part ``g_p^T Lambda g_p``.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from distfit.estimate.subtrees import leaf_tables
from distfit.stores.pieces import PieceMismatch, piece_path, read_piece, write_piece

__all__ = ["CARRIED", "PARENTS", "PARENT_SLAB", "SUMS", "carry_boundaries", "child_starts", "leaf_chunk",
           "read_terms", "write_carried", "write_parents"]

#: The pieces' suffixes (module docstring).
SUMS, CARRIED, PARENTS = ".sums", ".carried", ".parents"
#: The parents' arrays are digested per this many parents (a chunk task reads and hashes the slabs
#: holding its parents: a chunk of 4,096 blocks has ~120 block groups).
PARENT_SLAB = 256


def child_starts(job: Any) -> np.ndarray:
    """Each unit of the level above the finest's first child's row (units + 1, the last the
    finest level's size) of ``job`` (a :class:`distfit.estimate.subtree_job.Forests`): the
    parent of row ``r`` is the last ``p`` with ``starts[p] <= r``."""
    return np.concatenate([[0], np.cumsum(job.counts[-1], dtype=np.int64)])


def carry_boundaries(job: Any, first: int, stop: int) -> list[int]:
    """The chunk boundaries within forest ``[first, stop)``'s finest rows whose parent's first
    child lies before them (a ``.carried`` piece at each)."""
    (a, b), size = job.rows(first, stop)[-1], job.chunk_units[-1]
    starts = child_starts(job)
    return [s for s in range(-(-(a + 1) // size) * size, b, size)
            if starts[np.searchsorted(starts, s, side="right") - 1] < s]


def write_carried(job: Any, first: int, stop: int, answers: dict[str, np.ndarray], sums: np.ndarray,
                  linear: Sequence[tuple[np.ndarray, np.ndarray]]) -> None:
    """The upward task's pieces (module docstring) of forest ``[first, stop)``: ``sums`` (its
    finest level's ``h~`` summed by parent) with the levels above's ``linear`` (``(h~, n)``
    each, :meth:`distfit.estimate.level_stores.BasisTerms.linear`) and, from its finest level's
    ``answers``, the ``.carried`` tables at each of :func:`carry_boundaries`."""
    directory, name, k = Path(job.pieces), job.names[-1], len(job.names) - 1
    a = job.rows(first, stop)[-1][0]
    terms = {f"{part}{level}": array for level, pair in enumerate(linear) for part, array in zip(("linear", "norms"), pair)}
    write_piece(directory, name + SUMS, a, {"sums": sums, **terms}, fsync=job.fsync)
    starts = child_starts(job)
    for boundary in carry_boundaries(job, first, stop):
        head = int(starts[np.searchsorted(starts, boundary, side="right") - 1])  # its parent's first child
        rows = {block: values[head - a:boundary - a] for block, values in answers.items()}
        write_piece(directory, name + CARRIED, boundary, {"tables": job.terms[k].tables(rows)[0]}, fsync=job.fsync)


def read_terms(job: Any, first: int, stop: int) -> tuple[list[tuple[np.ndarray, np.ndarray]], np.ndarray]:
    """Forest ``[first, stop)``'s ``.sums`` (checked as read): ``(linear, sums)`` as
    :func:`write_carried` was given them."""
    a = job.rows(first, stop)[-1][0]
    piece = read_piece(Path(job.pieces), job.names[-1] + SUMS, a)
    levels = len(job.names) - 1
    return [(piece[f"linear{k}"], piece[f"norms{k}"]) for k in range(levels)], piece["sums"]


def write_parents(job: Any, first: int, stop: int, offsets: np.ndarray, tables: np.ndarray) -> None:
    """The downward task's ``.parents`` piece of forest ``[first, stop)``: from its leaves'
    parents' ``(G r)_p`` (``offsets``, in the basis) and tables ``x_p``, the offsets ``Q (G
    r)_p``, the tables and ``g_p^T Lambda g_p`` (the same products as the downward pass's)."""
    k = len(job.names) - 1
    write_piece(Path(job.pieces), job.names[k] + PARENTS, job.rows(first, stop)[k - 1][0],
                {"offsets": offsets @ job.basis.T, "tables": tables, "quadratic": job.terms[k].leaf_quadratic(offsets)},
                fsync=job.fsync, slab=PARENT_SLAB, sliced=("offsets", "tables", "quadratic"))


def leaf_chunk(job: Any, answers: dict[str, np.ndarray], start: int, stop: int, firsts: Sequence[int],
               parent_firsts: Sequence[int]) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The finest level's rows ``start:stop`` from their release ``answers`` (read and checked by
    the caller, once), per forest overlapping them (its first row ``firsts[i]`` there,
    ``parent_firsts[i]`` at the level above): ``(tables, residuals)``, with each forest's
    ``.parents`` (only the slabs of these rows' parents read and checked) and, where the first
    parent began before ``start``, its earlier children's ``.carried`` tables:
    :func:`distfit.estimate.subtrees.leaf_tables` and
    :meth:`distfit.estimate.level_stores.BasisTerms.leaf_objective`, the downward pass's
    numbers bit for bit."""
    k = len(job.names) - 1
    directory, name, terms = Path(job.pieces), job.names[k], job.terms[k]
    own_tables, own = terms.tables(answers)
    starts = child_starts(job)
    bounds = [max(start, int(f)) for f in firsts] + [stop]
    xs, objectives = [], []
    for i, first in enumerate(parent_firsts):
        a, b = bounds[i], bounds[i + 1]
        parent = np.searchsorted(starts, np.arange(a, b), side="right") - 1
        low, high = int(parent[0]), int(parent[-1]) + 1
        kept = read_piece(directory, name + PARENTS, int(first), rows=(low, high))
        before, carried = int(a - starts[low]), None
        if before:  # the first parent's earlier children: in the chunk before
            carried = read_piece(directory, name + CARRIED, a, names=("tables",))["tables"]
            if carried.shape[0] != before:
                raise PieceMismatch(piece_path(directory, name + CARRIED, a),
                                    f"{carried.shape[0]} rows carried to row {a}, {before} expected")
        local = np.concatenate([np.zeros(before, dtype=np.int64), parent - low])
        complete = starts[low + 1:high + 1] <= b  # every child among the rows: its last one gets the rounding
        xs.append(leaf_tables(kept["offsets"], kept["tables"], own_tables[a - start:b - start], local, complete,
                              before=carried)[before:])
        objectives.append(terms.leaf_objective(own[a - start:b - start], kept["quadratic"], parent - low))
    return xs, objectives
