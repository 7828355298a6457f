"""The solved pack of a plan store (format version 5): every solved block of an in-memory plan
as a fixed number of ragged arrays in one group, ``solved/``, instead of a group of nine arrays
per block (layout: :mod:`distfit.stores.plan`, "Solved pack").

Why: zarr's cost is per array (metadata, a chunk file, a round trip: ~3 ms), not per byte.
Adult's 470 solved blocks were 4,230 arrays and 8,937 files for 30 MB of data: writing them took
9 s and checksumming and fsyncing them back 8 s more. Packed, they are 13 arrays.

Block b of ``n`` has the shape ``(m_b, k_b, d_b)`` (``shape[b]``); its entries of each ragged
array are the slice ``offsets[b]:offsets[b + 1]`` with ``offsets = [0, cumsum(sizes)]`` and the
sizes per block of :data:`RAGGED` (``basis`` k d C order, ``recon`` m k, ``sigma`` k k, the
per-row vectors m, the per-cell vectors d): the offsets follow from ``shape`` and are not
stored, and a ragged array whose length is not the sum of its sizes is refused.

:class:`SolvedBlocks` is the pack's per-block tables (ids, shapes, attributes as schema
positions, alpha, lower bound, solver dicts), small and checked whole when a plan is opened;
:func:`pack_solved` builds tables and ragged arrays from block records;
:meth:`SolvedBlocks.block_arrays` slices one block's arrays back out. Pure numpy: the reader and
the writer (:mod:`distfit.stores.plan_writer`) writes them, :func:`open_solved` opens a stored
pack for :func:`distfit.stores.plan.read_plan` (:class:`SolvedPack`).
"""
from __future__ import annotations

import collections
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zarr

SOLVED_GROUP = "solved"  # the pack's group in a plan store
SOLVED_KIND = "solved"  # its attrs' ``kind``
#: The per-block tables: name -> (dtype, Zarr v3 dimension names).
TABLES: dict[str, tuple[type, tuple[str, ...]]] = {
    "shape": (np.int64, ("solved_block", "block_shape")),  # (m_b, k_b, d_b)
    "attributes": (np.int64, ("solved_block", "block_attribute")),  # schema positions, -1 padded
    "alpha": (np.float64, ("solved_block",)),
    "lower_bound": (np.float64, ("solved_block",)),
}
#: The ragged arrays: name -> (dtype, the block array's shape as axes of ``shape`` (0: m, 1: k,
#: 2: d), Zarr v3 dimension name). Each block contributes ``prod(shape[b][axes])`` entries.
RAGGED: dict[str, tuple[type, tuple[int, ...], str]] = {
    "basis": (np.float64, (1, 2), "solved_basis"),
    "recon": (np.float64, (0, 1), "solved_recon"),
    "sigma": (np.float64, (1, 1), "solved_sigma"),
    "query_index": (np.int64, (0,), "solved_query"),
    "targets": (np.float64, (0,), "solved_query"),
    "variances": (np.float64, (0,), "solved_query"),
    "query_weights": (np.float64, (0,), "solved_query"),
    "profile": (np.float64, (2,), "solved_cell"),
    "cell_weights": (np.float64, (2,), "solved_cell"),
}


@dataclass(frozen=True, eq=False)
class SolvedBlocks:
    """The per-block tables of a solved pack (module docstring); ``ValueError`` naming the table
    if they do not fit together.

    ``block_ids`` (n,) in pack order (unique), ``shape`` (n, 3) int64 ``(m_b, k_b, d_b)``,
    ``attributes`` (n, r) int64 each block's schema positions in its own attribute order, -1
    padded, ``alpha`` and ``lower_bound`` (n,), ``solvers`` one solver dict per block."""

    block_ids: tuple[str, ...]
    shape: np.ndarray
    attributes: np.ndarray
    alpha: np.ndarray
    lower_bound: np.ndarray
    solvers: tuple[dict, ...]

    def __post_init__(self) -> None:
        n = len(self.block_ids)
        if len(set(self.block_ids)) != n:
            first = next(b for b, count in collections.Counter(self.block_ids).items() if count > 1)
            raise ValueError(f"block_ids (attrs): {first!r} appears twice")
        for name, (dtype, dims) in TABLES.items():
            arr = np.asarray(getattr(self, name))
            if (arr.dtype != dtype or arr.ndim != len(dims) or arr.shape[0] != n
                    or (name == "shape" and arr.shape[1] != 3)):
                want = {"shape": "(n, 3)", "attributes": "(n, r)"}.get(name, "(n,)")
                raise ValueError(f"{name}: shape {arr.shape} dtype {arr.dtype}, expected {want} "
                                 f"{np.dtype(dtype)} for n={n} blocks")
        if self.shape.size and self.shape.min() < 0:
            raise ValueError("shape: a negative size")
        if self.attributes.size and self.attributes.min() < -1:
            raise ValueError("attributes: a position below -1")
        if len(self.solvers) != n or not all(isinstance(s, Mapping) for s in self.solvers):
            raise ValueError(f"solvers (attrs): expected {n} solver dicts")

    def __len__(self) -> int:
        return len(self.block_ids)

    def sizes(self, name: str) -> np.ndarray:
        """(n,) int64 each block's number of entries of the ragged array ``name``."""
        _, axes, _ = RAGGED[name]
        return np.prod(self.shape[:, list(axes)], axis=1, dtype=np.int64)

    def offsets(self, name: str) -> np.ndarray:
        """(n+1,) int64 block b's entries of ``name`` are ``offsets[b]:offsets[b + 1]``."""
        return np.concatenate([[0], np.cumsum(self.sizes(name))]).astype(np.int64)

    def check_length(self, name: str, length: int) -> None:
        """``ValueError`` naming ``name`` unless it has the entries the shape table gives."""
        want = int(self.sizes(name).sum())
        if int(length) != want:
            raise ValueError(f"{name}: {int(length)} entries, but the shape table gives {want}")

    def block_arrays(self, b: int, ragged: Mapping[str, np.ndarray],
                     offsets: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Block ``b``'s arrays (:data:`RAGGED` names, reshaped, copies) from the whole ragged
        arrays and their :meth:`offsets`."""
        shape = self.shape[b].tolist()
        out = {}
        for name, (_, axes, _) in RAGGED.items():
            lo, hi = offsets[name][b], offsets[name][b + 1]
            out[name] = np.array(ragged[name][lo:hi]).reshape([shape[a] for a in axes])
        return out


class SolvedPack:
    """A stored solved pack opened for reading: its tables (read and checked by
    :func:`open_solved`) and its ragged arrays, each read whole on first use and kept (never one
    zarr read per block)."""

    def __init__(self, group: zarr.Group, tables: SolvedBlocks) -> None:
        self.group, self.tables = group, tables
        self.position = {block_id: b for b, block_id in enumerate(tables.block_ids)}
        self.offsets = {name: tables.offsets(name) for name in RAGGED}

    @functools.cached_property
    def ragged(self) -> dict[str, np.ndarray]:
        """Every ragged array, read once."""
        return {name: self.group[name][...] for name in RAGGED}

    def record(self, block_id: str, names: Sequence[str]) -> dict[str, Any]:
        """The fields of block ``block_id``'s :class:`distfit.stores.plan.BlockRecord` on a
        schema of attribute ``names``: sliced arrays, attributes, alpha, bound, solver dict."""
        b, t = self.position[block_id], self.tables
        return {"block_id": block_id, "attributes": tuple(names[i] for i in t.attributes[b].tolist() if i >= 0),
                "alpha": float(t.alpha[b]), "lower_bound": float(t.lower_bound[b]), "solver": dict(t.solvers[b]),
                **t.block_arrays(b, self.ragged, self.offsets)}


def open_solved(group: zarr.Group, names: Sequence[str]) -> SolvedPack | None:
    """The solved pack of the plan ``group`` (None if it has none) on a schema of attribute
    ``names``; ``ValueError`` in one line naming the array or attr that is malformed (a missing
    array, tables that do not fit together, a ragged length the shape table does not give, a
    position outside the schema, ids not unique)."""
    if SOLVED_GROUP not in group:
        return None
    g = group[SOLVED_GROUP]
    if not isinstance(g, zarr.Group):
        raise ValueError(f"{SOLVED_GROUP}: not a group")
    a = dict(g.attrs)
    if a.get("kind") != SOLVED_KIND:
        raise ValueError(f"{SOLVED_GROUP}: kind {a.get('kind')!r}, expected {SOLVED_KIND!r}")
    ids, solvers = a.get("block_ids"), a.get("solvers")
    if not isinstance(ids, list) or not all(isinstance(b, str) for b in ids):
        raise ValueError(f"{SOLVED_GROUP}/block_ids (attrs): expected a list of block ids")
    if not isinstance(solvers, list):
        raise ValueError(f"{SOLVED_GROUP}/solvers (attrs): expected a list of solver dicts")
    arrays = {}
    for name in (*TABLES, *RAGGED):
        node = g.get(name)
        if not isinstance(node, zarr.Array):
            raise ValueError(f"{SOLVED_GROUP}: missing array {SOLVED_GROUP}/{name}")
        if name in RAGGED and node.ndim != 1:
            raise ValueError(f"{SOLVED_GROUP}/{name}: shape {node.shape}, expected a 1-d ragged array")
        arrays[name] = node
    try:
        tables = SolvedBlocks(block_ids=tuple(ids), solvers=tuple(solvers),
                              **{name: arrays[name][...] for name in TABLES})
        for name in RAGGED:
            tables.check_length(name, arrays[name].shape[0])
    except ValueError as exc:
        raise ValueError(f"{SOLVED_GROUP}/{exc}") from None
    if tables.attributes.size and tables.attributes.max() >= len(names):
        raise ValueError(f"{SOLVED_GROUP}/attributes: schema position {int(tables.attributes.max())}, but the "
                         f"schema has {len(names)} attributes")
    return SolvedPack(g, tables)


def pack_solved(records: Sequence[Any], names: Sequence[str]) -> tuple[SolvedBlocks, dict[str, np.ndarray]]:
    """``(tables, ragged arrays)`` of the solved blocks ``records`` (block records:
    :class:`distfit.stores.plan.BlockRecord`, in pack order) on a schema of attribute ``names``.
    ``ValueError`` naming the block if one has an attribute outside the schema or no certificate
    (``cell_weights`` None: such plans keep one group per block)."""
    position = {name: i for i, name in enumerate(names)}
    width = max((len(r.attributes) for r in records), default=0)
    attributes = np.full((len(records), width), -1, dtype=np.int64)
    for b, rec in enumerate(records):
        unknown = [a for a in rec.attributes if a not in position]
        if unknown:
            raise ValueError(f"blocks/{rec.block_id}: attributes {unknown} are not schema attributes")
        if rec.cell_weights is None:
            raise ValueError(f"blocks/{rec.block_id}: no certificate arrays; a solved pack holds "
                             "only blocks with them (write the others one group per block)")
        attributes[b, :len(rec.attributes)] = [position[a] for a in rec.attributes]
    tables = SolvedBlocks(
        block_ids=tuple(r.block_id for r in records),
        shape=np.array([r.shape for r in records], dtype=np.int64).reshape(len(records), 3),
        attributes=attributes,
        alpha=np.array([r.alpha for r in records], dtype=np.float64),
        lower_bound=np.array([r.lower_bound for r in records], dtype=np.float64),
        solvers=tuple(dict(r.solver) for r in records),
    )
    ragged = {}
    for name, (dtype, _, _) in RAGGED.items():
        parts = [np.asarray(getattr(r, name), dtype=dtype).ravel() for r in records]
        ragged[name] = np.concatenate(parts) if parts else np.zeros(0, dtype=dtype)
    return tables, ragged


__all__ = ["RAGGED", "SOLVED_GROUP", "SOLVED_KIND", "TABLES", "SolvedBlocks", "SolvedPack", "open_solved",
           "pack_solved"]
