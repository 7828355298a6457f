"""Plan stores: the layout, the block record and the reader of a plan (a Zarr v3 group).

Layout (**contract**, docs/design.md section 4)::

    plan.zarr/                 attrs: distfit_format="plan", format_version (2; 3 with packs; 4 with
                                      runs; 5 with a solved pack), spec, schema
                                      ({"attributes": [names], "sizes": [ints]}), alpha,
                                      alpha_exact, rho, composition, created (ISO 8601 UTC),
                                      distfit_version, complete=True, checksum, and any extra
                                      attrs the caller passes (e.g. "account", "planner")
      queries/targets          (m,)       float64   (or as runs, below)
      queries/variances        (m,)       float64   (or as runs, below)
      blocks/<block_id>/basis        (k, d_b)   float64
                       recon        (m_b, k)   float64
                       query_index  (m_b,)     int64
                       sigma        (k, k)     float64
                       targets      (m_b,)     float64
                       variances    (m_b,)     float64
                       profile      (d_b,)     float64
                       cell_weights (d_b,)     float64   the dual certificate of lower_bound:
                       query_weights (m_b,)    float64   u on the cells, v on the query rows
                       attrs: attributes (list of names), alpha, lower_bound, solver (dict)

Packs (format version 3; docs/design.md section 4, "Packed blocks"): closed-form residual blocks of
identity marginals (:class:`distfit.mathematics.packing.PackedBlocks`) may be stored many at once, one group
of ten arrays per pack, instead of one group per block::

      packs/<pack_id>/attributes      (n, r) int64   each block's attributes: schema positions,
                                                     ascending, -1 padded (the total: all -1)
                      scale           (n,)  float64  Sigma_b = scale_b * B_b B_b^T,
                                                     B_b = kron_{i in S_b} D_{n_i}
                      alpha           (n,)  float64  the block's alpha (its profile is flat)
                      lower_bound     (n,)  float64
                      certificate     (n,)  int64    the segment whose rows carry the dual query
                                                     weights (uniform; cell weights uniform); -1 none
                      segment_offsets (n+1,) int64   block b's segments: offsets[b]:offsets[b+1]
                      segment_clique  (s, a) int64   the segment's identity marginal (positions)
                      segment_query   (s,)  int64    its first query (its cells: q, q+1, ..)
                      segment_target  (s,)  float64  each of its rows' target share
                      segment_variance (s,) float64  each of its rows' variance
                      attrs: kind="residual-identity", solver (shared by the pack's blocks)

Runs (format version 4): a plan of many queries whose targets or variances come in long runs of
equal values (identity marginals with one target each: one run per marginal) stores that vector
as runs (:class:`distfit.mathematics.packing.QueryRuns`) instead of per query::

      queries/target_values     (r,)   float64  the value of each run
      queries/target_offsets    (r+1,) int64    run i is queries offsets[i]:offsets[i+1] (from 0 to m)
      queries/variance_values   (r',)  float64
      queries/variance_offsets  (r'+1,) int64

each vector independently, in its merged form (adjacent runs differ), when it has at least
:data:`RUN_LENGTH_MIN_QUERIES` queries and at most one run per :data:`RUN_LENGTH_RATIO` queries
(:func:`stored_form`: the store's bytes follow from the vector alone, whichever form the
writer was given). At 100 attributes of 10 values, every marginal up to 3-way (162.2M queries,
all targets 1), the targets are one run and the variances three (one per order), where the
per-query vectors were 1.3 GB each, held by ``distfit plan`` and read back by every reader.
:func:`read_plan` reads either form: :attr:`Plan.target_runs` / :attr:`Plan.variance_runs` give
the runs (per-query arrays of older plans encoded), :attr:`Plan.queries_targets` /
:attr:`Plan.queries_variances` the per-query vectors (expanded on first use). The checksum covers
these arrays like any other. A plan with neither runs nor packs is written as version 2, with
packs but no runs as version 3, byte for byte as before.

A packed block's id is :func:`distfit.plan.residual.block_id_for` of its attribute names; its
arrays (basis, recon, query_index, sigma, targets, variances, profile, certificate weights) are
implied by the schema sizes and these numbers (:mod:`distfit.mathematics.packing`) and materialised by
:meth:`Plan.block`, so :func:`read_plan` yields every block as before; :meth:`Plan.packs` gives
the packs whole (the audit and the release work on them in bulk). The checksum covers the pack
arrays like any array, and each pack's attrs (its kind: the implicit forms' declaration) as
claims (:func:`plan_claims`). A plan without packs is written as format version 2, byte for
byte as before; version 2 and 1 plans read, verify and audit as ever.

Solved pack (format version 5): an in-memory plan of at least :data:`SOLVED_PACK_MIN_BLOCKS`
solved blocks, each with its certificate arrays, stores them all in one group of 13 ragged
arrays (:mod:`distfit.stores.solved_pack`) instead of one group of nine arrays per block::

      solved/shape          (n, 3) int64   block b's (m_b, k_b, d_b), b in pack order
             attributes     (n, r) int64   its schema positions in its own attribute order, -1 padded
             alpha          (n,)  float64
             lower_bound    (n,)  float64
             basis          (sum k_b d_b,) float64   each block's (k_b, d_b) basis in C order,
             recon          (sum m_b k_b,) float64   concatenated in pack order; block b's
             sigma          (sum k_b^2,)   float64   entries are offsets[b]:offsets[b+1],
             query_index    (sum m_b,)     int64     offsets = [0, cumsum(its sizes)] from
             targets, variances, query_weights (sum m_b,) float64   the shape table (not stored)
             profile, cell_weights          (sum d_b,) float64
             attrs: kind="solved", block_ids (list, pack order), solvers (list: each block's
                    solver dict)

Adult's 470 solved blocks were 4,230 arrays and 8,937 files (30 MB: zarr's cost is per array,
~3 ms each): 17 s to write, checksum and fsync; packed, 13 arrays and 2 s. :meth:`Plan.block`
materialises a packed block's :class:`BlockRecord` by slicing (the same values, dtypes,
attributes and solver dict as the one-group layout; each ragged array is read once, on first
use, and kept); :attr:`Plan.explicit_block_ids` includes them (their arrays are explicit). The
checksum covers the arrays like any array and the attrs as claims (:func:`plan_claims`, each
solver without :data:`UNCLAIMED_SOLVER`). A plan with fewer solved blocks (or a block without
certificate arrays) keeps one group per block and its version 2, 3 or 4, byte for byte as
before; so do streamed plans (their blocks are written one at a time as drafts).

``cell_weights`` and ``query_weights`` (:data:`CERTIFICATE_ARRAYS`, an addition to docs/design.md
section 4) are the dual point that proves the block's ``lower_bound``: each on the simplex,
``lower_bound = || diag(sqrt(v / t)) recon basis diag(sqrt(u)) ||_*^2``
(:func:`distfit.mathematics.bounds.certified_bound`) at the block's target shares scaled to its
variances, ``t = targets * max(variances / targets)``: no covariance of the block whose
variances are at most t has a smaller alpha. A block without a certificate of its own (one the
planner's joint block dual re-optimised) has NaN weights and ``lower_bound`` 0. Plans written
before the certificate was kept have neither array: they are read (``BlockRecord``'s weights
are then None) and ``distfit audit`` fails them: their block bounds cannot be re-certified
(docs/audit.md; re-plan with this distfit).

Plans are written atomically by :class:`distfit.stores.plan_writer.PlanWriter` (built in a
``<path>.incomplete-<random>`` staging directory, renamed into place once complete).
:func:`read_plan` refuses anything but a complete plan (a staging directory, a missing path -
naming any leftovers of an interrupted write -, another format, a newer format version, no
``complete=True``, no checksum).

Checksum: :func:`distfit.stores.checksum.compute_checksum` (the format is documented there; the
release store uses the same). A plan of ``format_version`` 2 has the version-2 checksum: every
array and every attr that states a claim (:func:`plan_claims`: the root attrs but the checksum
itself, ``complete``, ``created`` and ``distfit_version``, the planner's record but its
``seconds`` and ``distfit_version``, and every block's attrs but the solver's ``seconds``;
what is left out is provenance, which would make two writes of one plan hash differently).
A plan of ``format_version`` 1 (written before issue 12) has the version-1 checksum,
the arrays only: it is still read and verified by that rule, and ``distfit audit`` fails it, its
attrs not being covered (:func:`checksum_covers_attrs`; re-plan with this distfit). Either way the checksum only detects
changes: ``distfit audit`` recomputes every claim it can from the arrays and the stored spec.
:func:`verify_checksum` recomputes it; :func:`read_plan` does not (that reads every array).

Arrays are float64 (``query_index`` int64) with zarr's default codecs; an array of up to
:data:`CHUNK_BYTES` (16 MiB) is one chunk, a larger one is cut into row slabs (whole trailing
axes) of at most that size (:func:`distfit.stores.files.chunk_shape`). Attrs are JSON
(:func:`distfit.stores.files.jsonable`); tuples come back as lists. Every array carries Zarr v3
``dimension_names`` (:data:`distfit.stores.plan_writer.BLOCK_DIMS`, ``QUERY_DIMS``; metadata,
not covered by the checksum) so xarray opens a plan whole; readers do not need them.
"""
from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from distfit.mathematics.packing import PackedBlocks, QueryRuns, block_arrays
from distfit.plan.residual import block_id_for
from distfit.stores.files import (
    CHUNK_BYTES,
    root_attrs_on_disk,
)
from distfit.stores.sealing import check_verified, open_sealed, verify_opened
from distfit.stores.solved_pack import SOLVED_GROUP, open_solved

FORMAT = "plan"
FORMAT_VERSION = 5  # the newest this distfit reads and writes (a plan with a solved pack)
SOLVED_VERSION = 5  # what a plan with a solved pack is written as (module docstring)
RUNS_VERSION = 4  # what a plan with runs and without a solved pack is written as
PACKED_VERSION = 3  # what a plan with packs and without runs is written as (byte for byte as before runs)
UNPACKED_VERSION = 2  # what a plan without packs or runs is written as (byte for byte as before packs)
#: A per-query vector is stored as runs when it has at least this many queries (smaller plans
#: keep their bytes and checksums) and at most one run per ``RUN_LENGTH_RATIO`` queries.
RUN_LENGTH_MIN_QUERIES = 1 << 16
RUN_LENGTH_RATIO = 4
#: An in-memory plan stores its solved blocks as one solved pack (format 5) from this many on.
#: Below it one group per block costs little (16 blocks: ~0.1 s), and small plans - every test
#: and documented example that pins a plan's bytes, checksum or format version - keep theirs.
SOLVED_PACK_MIN_BLOCKS = 16
#: The two per-query vectors of a plan (``queries/<name>``) and the prefix of their run arrays.
QUERY_VECTORS = {"targets": "target", "variances": "variance"}
CHECKSUM_ATTRS_VERSION = 2  # the first format_version whose checksum covers the claims' attrs
#: What the version-2 checksum leaves out (:func:`plan_claims`): provenance and store state.
UNCLAIMED_ROOT = ("checksum", "complete", "created", "distfit_version")
UNCLAIMED_PLANNER = ("seconds", "distfit_version")
UNCLAIMED_SOLVER = ("seconds",)

BLOCK_ARRAYS = ("basis", "recon", "query_index", "sigma", "targets", "variances", "profile")
#: A block's dual certificate (module docstring): in every plan written since they were kept,
#: absent from older ones (both or neither).
CERTIFICATE_ARRAYS = ("cell_weights", "query_weights")
#: The arrays of a pack (``packs/<pack_id>/``, module docstring), the fields of
#: :class:`distfit.mathematics.packing.PackedBlocks` of the same names; and its dimension names.
PACK_ARRAYS: dict[str, tuple[str, ...]] = {
    "attributes": ("block", "block_attribute"),
    "scale": ("block",),
    "alpha": ("block",),
    "lower_bound": ("block",),
    "certificate": ("block",),
    "segment_offsets": ("block_edge",),
    "segment_clique": ("segment", "segment_attribute"),
    "segment_query": ("segment",),
    "segment_target": ("segment",),
    "segment_variance": ("segment",),
}
PACK_KIND = "residual-identity"  # the one kind of pack: closed-form residual blocks of identity marginals
ROOT_KEYS = (
    "distfit_format", "format_version", "spec", "schema", "alpha", "alpha_exact", "rho",
    "composition", "created", "distfit_version", "complete", "checksum",
)
_BLOCK_ID = re.compile(r"[A-Za-z0-9_.-]+")

PathLike = str | os.PathLike


class StoreError(ValueError):
    """A store that is not a readable, complete plan (the message names the path and why)."""


def is_plan_store(path: Path) -> bool:
    """Whether ``path`` holds a Zarr v3 group with ``distfit_format="plan"`` (complete or not)."""
    attrs = root_attrs_on_disk(path)
    return attrs is not None and attrs.get("distfit_format") == FORMAT


def is_path_safe(name: Any) -> bool:
    """Whether ``name`` may name a block or a scratch entry: ``[A-Za-z0-9_.-]+``, not only dots
    (``.``, ``..``), not starting with ``__`` (zarr reserves those)."""
    return (isinstance(name, str) and _BLOCK_ID.fullmatch(name) is not None and set(name) != {"."}
            and not name.startswith("__"))


# --------------------------------------------------------------------------------------------
# block records


def float_array(name: str, value: Any, ndim: int) -> np.ndarray:
    """``value`` as a float64 array of ``ndim`` dimensions; ValueError naming ``name`` if not."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name}: not convertible to a float64 array ({exc})") from None
    if arr.ndim != ndim:
        raise ValueError(f"{name}: expected a {ndim}-d array, got shape {arr.shape}")
    return arr


@dataclass(frozen=True, eq=False)
class BlockRecord:
    """One block of a plan, as stored under ``blocks/<block_id>/`` (docs/design.md section 4).

    ``basis`` (k, d_b), ``recon`` (m_b, k), ``query_index`` (m_b,) int64 (the workload query
    each row of ``recon`` belongs to), ``sigma`` (k, k), ``targets`` / ``variances`` (m_b,),
    ``profile`` (d_b,); ``attributes`` the block's attribute names, ``alpha`` its privacy cost,
    ``lower_bound`` its certified lower bound, ``solver`` a dict of solver statistics;
    ``cell_weights`` (d_b,) and ``query_weights`` (m_b,) the dual certificate of ``lower_bound``
    (module docstring; NaN: none of its own; both None: a plan written before they were kept).
    Arrays are converted to float64 / int64; inconsistent shapes raise ``ValueError`` naming
    the field. ``block_id`` must match ``[A-Za-z0-9_.-]+`` (not ``.``/``..``, not ``__...``,
    which zarr reserves).
    """

    block_id: str
    attributes: tuple[str, ...]
    basis: np.ndarray
    recon: np.ndarray
    query_index: np.ndarray
    sigma: np.ndarray
    targets: np.ndarray
    variances: np.ndarray
    profile: np.ndarray
    alpha: float
    lower_bound: float
    solver: dict = field(default_factory=dict)
    cell_weights: np.ndarray | None = None
    query_weights: np.ndarray | None = None

    def __post_init__(self) -> None:
        bid = self.block_id
        if not is_path_safe(bid):
            raise ValueError(
                f"block_id: {bid!r} is not path-safe (use letters, digits, '_', '.', '-'; "
                "not only dots, not starting with '__')")
        if isinstance(self.attributes, str):
            raise ValueError(f"attributes: expected a sequence of names, got the string {self.attributes!r}")
        try:
            attributes = tuple(str(a) if isinstance(a, np.str_) else a for a in self.attributes)
        except TypeError:
            raise ValueError(f"attributes: expected a sequence of names, got {self.attributes!r}") from None
        if not all(isinstance(a, str) for a in attributes):
            raise ValueError(f"attributes: names must be strings, got {self.attributes!r}")
        set_ = object.__setattr__
        set_(self, "attributes", attributes)

        basis = float_array("basis", self.basis, 2)
        recon = float_array("recon", self.recon, 2)
        sigma = float_array("sigma", self.sigma, 2)
        targets = float_array("targets", self.targets, 1)
        variances = float_array("variances", self.variances, 1)
        profile = float_array("profile", self.profile, 1)
        qi = np.asarray(self.query_index)
        if qi.ndim != 1:
            raise ValueError(f"query_index: expected a 1-d array, got shape {qi.shape}")
        if qi.size and not np.issubdtype(qi.dtype, np.integer):
            raise ValueError(f"query_index: expected integers, got dtype {qi.dtype}")
        qi = qi.astype(np.int64, copy=False)
        if qi.size and qi.min() < 0:
            raise ValueError("query_index: negative query index")

        k, d_b = basis.shape
        m_b = recon.shape[0]
        if recon.shape[1] != k:
            raise ValueError(f"recon: shape {recon.shape} does not match basis rows k={k}")
        if sigma.shape != (k, k):
            raise ValueError(f"sigma: shape {sigma.shape}, expected ({k}, {k}) from basis")
        for name, arr in (("query_index", qi), ("targets", targets), ("variances", variances)):
            if arr.shape != (m_b,):
                raise ValueError(f"{name}: shape {arr.shape}, expected ({m_b},) from recon")
        if profile.shape != (d_b,):
            raise ValueError(f"profile: shape {profile.shape}, expected ({d_b},) from basis columns")
        for name, arr in (("basis", basis), ("recon", recon), ("query_index", qi), ("sigma", sigma),
                          ("targets", targets), ("variances", variances), ("profile", profile)):
            set_(self, name, arr)
        if (self.cell_weights is None) != (self.query_weights is None):
            raise ValueError("cell_weights/query_weights: give both (the certificate) or neither")
        if self.cell_weights is not None:
            for name, size in (("cell_weights", d_b), ("query_weights", m_b)):
                arr = float_array(name, getattr(self, name), 1)
                if arr.shape != (size,):
                    raise ValueError(f"{name}: shape {arr.shape}, expected ({size},) from "
                                     f"{'basis columns' if name == 'cell_weights' else 'recon'}")
                set_(self, name, arr)
        try:
            set_(self, "alpha", float(self.alpha))
            set_(self, "lower_bound", float(self.lower_bound))
        except (TypeError, ValueError):
            raise ValueError(
                f"alpha/lower_bound: expected numbers, got {self.alpha!r}, {self.lower_bound!r}") from None
        solver = self.solver
        if dataclasses.is_dataclass(solver) and not isinstance(solver, type):
            solver = dataclasses.asdict(solver)
        if not isinstance(solver, Mapping):
            raise ValueError(f"solver: expected a dict of statistics, got {type(solver).__name__}")
        set_(self, "solver", dict(solver))

    @property
    def shape(self) -> tuple[int, int, int]:
        """``(m_b, k, d_b)``."""
        return self.recon.shape[0], self.basis.shape[0], self.basis.shape[1]

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The arrays a store holds for this block: :data:`BLOCK_ARRAYS`, then the
        :data:`CERTIFICATE_ARRAYS` when the record has them."""
        names = BLOCK_ARRAYS + (CERTIFICATE_ARRAYS if self.cell_weights is not None else ())
        return {name: getattr(self, name) for name in names}


# --------------------------------------------------------------------------------------------
# reader


def _open_plan_group(path: PathLike) -> tuple[Path, zarr.Group, dict]:
    """Open ``path`` read-only after every refusal check; returns (path, group, attrs)."""
    p, group, attrs = open_sealed(path, FORMAT, FORMAT_VERSION, StoreError,
                                  unfinished="the plan is not marked complete (an unfinished or damaged write)")
    for name, prefix in QUERY_VECTORS.items():
        stored = [n for n in (name, f"{prefix}_values", f"{prefix}_offsets") if _array(group, f"queries/{n}") is not None]
        if not stored:
            raise StoreError(f"{p}: missing array queries/{name} (or its runs queries/{prefix}_values, _offsets)")
        if stored not in ([name], [f"{prefix}_values", f"{prefix}_offsets"]):
            raise StoreError(f"{p}: queries/{name}: expected the array queries/{name} or the runs "
                             f"queries/{prefix}_values and queries/{prefix}_offsets, found {stored}")
    try:
        blocks = group["blocks"]
    except KeyError:
        blocks = None
    if not isinstance(blocks, zarr.Group):
        raise StoreError(f"{p}: missing group blocks/")
    return p, group, attrs


def _array(group: zarr.Group, name: str) -> zarr.Array | None:
    try:
        node = group[name]
    except KeyError:
        return None
    return node if isinstance(node, zarr.Array) else None


def stored_form(runs: QueryRuns) -> bool:
    """Whether a plan stores the per-query vector ``runs`` (merged: :meth:`QueryRuns.canonical`)
    as runs (module docstring) rather than per query."""
    return runs.size >= RUN_LENGTH_MIN_QUERIES and len(runs.values) * RUN_LENGTH_RATIO <= runs.size


def _read_vector(p: Path, group: zarr.Group, name: str) -> QueryRuns:
    """``queries/<name>`` of a plan as runs (a per-query array is encoded)."""
    prefix = QUERY_VECTORS[name]
    array = _array(group, f"queries/{name}")
    if array is not None:
        return QueryRuns.encode(np.asarray(array[...], dtype=np.float64))
    values, offsets = group[f"queries/{prefix}_values"][...], group[f"queries/{prefix}_offsets"][...]
    try:
        return QueryRuns(values, offsets)
    except ValueError as exc:
        raise StoreError(f"{p}: queries/{prefix}_{exc}") from None


@dataclass(frozen=True, eq=False)
class Plan:
    """A complete plan store opened for reading. Blocks are read lazily by :meth:`block`.

    ``target_runs`` and ``variance_runs`` are every query's target and variance as runs
    (:class:`distfit.mathematics.packing.QueryRuns`, whichever form the store holds: module docstring);
    ``queries_targets`` and ``queries_variances`` the same as (m,) vectors, expanded on first use.

    ``block_ids`` are every block's, sorted (a packed block's id is
    :func:`distfit.plan.residual.block_id_for` of its attribute names); ``explicit_block_ids``
    those with explicit arrays (one group per block, or in the solved pack); :meth:`packs` the
    packs as written (bulk access: audit and release read them whole instead of block by block)."""

    path: str
    attrs: dict
    target_runs: QueryRuns
    variance_runs: QueryRuns
    block_ids: tuple[str, ...]
    _group: Any = field(repr=False)
    explicit_block_ids: tuple[str, ...] = ()
    pack_ids: tuple[str, ...] = ()
    _packs: tuple = field(default=(), repr=False)  # PackedBlocks per pack id
    _packed_ids: tuple = field(default=(), repr=False)  # per pack: its blocks' ids, in pack order
    _where: dict = field(default_factory=dict, repr=False)  # packed block id -> (pack, position), built lazily
    _solved: Any = field(default=None, repr=False)  # solved_pack.SolvedPack (format 5) or None

    @property
    def checksum(self) -> str:
        return self.attrs["checksum"]

    @functools.cached_property
    def claims(self) -> dict[str, Any]:
        """:func:`plan_claims` of this plan, read once (the checksum and the audit share them)."""
        return plan_claims(self.attrs, self._group)

    @functools.cached_property
    def queries_targets(self) -> np.ndarray:
        """(m,) every query's target."""
        return self.target_runs.expand()

    @functools.cached_property
    def queries_variances(self) -> np.ndarray:
        """(m,) every query's variance."""
        return self.variance_runs.expand()

    def packs(self) -> tuple[PackedBlocks, ...]:
        """The plan's packs (``packs/<pack_id>``, in ``pack_ids`` order)."""
        return self._packs

    def packed_block_ids(self, pack: int) -> tuple[str, ...]:
        """The ids of pack ``pack``'s blocks, in pack order."""
        return self._packed_ids[pack]

    def _locate(self, block_id: str) -> tuple[int, int] | None:
        if not self._packs:
            return None
        if not self._where:
            for p, ids in enumerate(self._packed_ids):
                self._where.update((bid, (p, b)) for b, bid in enumerate(ids))
        return self._where.get(block_id)

    def block(self, block_id: str) -> BlockRecord:
        """Read one block's arrays and attrs from the store (a packed block: materialised from
        its pack, :func:`distfit.mathematics.packing.block_arrays`; a block of the solved pack: sliced from it)."""
        if self._solved is not None and block_id in self._solved.position:
            try:
                return BlockRecord(**self._solved.record(block_id, self.attrs["schema"]["attributes"]))
            except ValueError as exc:
                raise StoreError(f"{self.path}: {SOLVED_GROUP}/ block {block_id}: {exc}") from None
        where = self._locate(block_id)
        if where is not None:
            p, b = where
            pack = self._packs[p]
            names = tuple(self.attrs["schema"]["attributes"][i] for i in pack.attributes[b] if i >= 0)
            try:
                return BlockRecord(block_id=block_id, attributes=names, alpha=pack.alpha[b],
                                   lower_bound=pack.lower_bound[b], solver=pack.solver,
                                   **block_arrays(pack, self.attrs["schema"]["sizes"], b))
            except ValueError as exc:
                raise StoreError(f"{self.path}: packs/{self.pack_ids[p]} block {b} ({block_id}): {exc}") from None
        if block_id not in self.explicit_block_ids:
            raise KeyError(f"{self.path}: no block {block_id!r}")
        where = f"{self.path}: blocks/{block_id}"
        g = self._group["blocks"][block_id]
        arrays = {}
        for name in BLOCK_ARRAYS + CERTIFICATE_ARRAYS:
            try:
                node = g[name]
            except KeyError:
                node = None
            if isinstance(node, zarr.Array):
                arrays[name] = node[...]
            elif name in BLOCK_ARRAYS:
                raise StoreError(f"{where}: missing array {name}")
        a = dict(g.attrs)
        missing = [k for k in ("attributes", "alpha", "lower_bound") if k not in a]
        if missing:
            raise StoreError(f"{where}: missing attrs {missing}")
        try:
            return BlockRecord(block_id=block_id, attributes=tuple(a["attributes"]),
                               alpha=a["alpha"], lower_bound=a["lower_bound"],
                               solver=a.get("solver", {}), **arrays)
        except ValueError as exc:
            raise StoreError(f"{where}: {exc}") from None

    def iter_blocks(self) -> Iterator[BlockRecord]:
        """Blocks in ``block_ids`` order, one at a time."""
        for bid in self.block_ids:
            yield self.block(bid)


def packed_ids(schema: Mapping, pack: PackedBlocks) -> tuple[str, ...]:
    """The block ids of ``pack``'s blocks (``block_id_for`` of their attribute names), in pack order."""
    names = list(schema["attributes"])
    return tuple(block_id_for([names[i] for i in row if i >= 0]) for row in pack.attributes.tolist())


def _read_packs(p: Path, group: zarr.Group, attrs: Mapping) -> tuple[tuple[str, ...], tuple, tuple]:
    """``(pack ids, PackedBlocks per pack, block ids per pack)``; StoreError naming a bad pack."""
    try:
        packs = group["packs"]
    except KeyError:
        return (), (), ()
    ids, out, block_ids = [], [], []
    sizes = list(attrs.get("schema", {}).get("sizes", []))
    for pack_id in sorted(packs.group_keys()):
        g = packs[pack_id]
        where = f"{p}: packs/{pack_id}"
        a = dict(g.attrs)
        if a.get("kind") != PACK_KIND:
            raise StoreError(f"{where}: kind {a.get('kind')!r}, expected {PACK_KIND!r}")
        try:
            arrays = {name: g[name][...] for name in PACK_ARRAYS}
        except KeyError as exc:
            raise StoreError(f"{where}: missing array {exc}") from None
        try:
            pack = PackedBlocks(**arrays, solver=a.get("solver", {}))
        except ValueError as exc:
            raise StoreError(f"{where}: {exc}") from None
        for name in ("attributes", "segment_clique"):
            arr = arrays[name]
            if arr.size and arr.max() >= len(sizes):
                raise StoreError(f"{where}/{name}: schema position {int(arr.max())}, but the schema has "
                                 f"{len(sizes)} attributes")
        ids.append(pack_id)
        out.append(pack)
        block_ids.append(packed_ids(attrs["schema"], pack))
    return tuple(ids), tuple(out), tuple(block_ids)


def read_plan(path: PathLike, verify: bool = False) -> Plan:
    """Open a complete plan store, or raise :class:`StoreError` saying why it is refused.

    Refused: a missing path, a staging (``.incomplete-``) directory, anything that is not a
    Zarr v3 group with ``distfit_format="plan"``, a ``format_version`` newer than
    :data:`FORMAT_VERSION`, a store without ``complete=True`` or without a checksum, a pack
    that is not a valid :class:`distfit.mathematics.packing.PackedBlocks`. The checksum itself is not
    recomputed here (that reads every array) unless ``verify``
    (:func:`distfit.stores.sealing.check_verified`: :class:`StoreError` in one line if the plan
    changed since it was sealed); see also :func:`verify_checksum`.
    """
    p, group, attrs = _open_plan_group(path)
    if verify:
        check_verified(p, "plan", group, attrs, plan_checksum_claims, StoreError)
    targets, variances = _read_vector(p, group, "targets"), _read_vector(p, group, "variances")
    if targets.size != variances.size:
        raise StoreError(f"{p}: queries: {targets.size} targets but {variances.size} variances")
    explicit = tuple(sorted(group["blocks"].group_keys()))
    try:
        solved = open_solved(group, list(attrs.get("schema", {}).get("attributes", [])))
    except ValueError as exc:
        raise StoreError(f"{p}: {exc}") from None
    if solved is not None:
        explicit = tuple(sorted(explicit + solved.tables.block_ids))
    pack_ids, packs, ids = _read_packs(p, group, attrs)
    block_ids = tuple(sorted(explicit + tuple(b for per_pack in ids for b in per_pack))) if packs else explicit
    if solved is not None or packs:  # one id, one block, whichever part of the plan holds it
        repeated = next((a for a, b in zip(block_ids, block_ids[1:]) if a == b), None)
        if repeated is not None:
            raise StoreError(f"{p}: block id {repeated!r} is stored twice (blocks/, {SOLVED_GROUP}/ or packs/)")
    return Plan(path=str(p), attrs=attrs, target_runs=targets, variance_runs=variances,
                block_ids=block_ids, _group=group, explicit_block_ids=explicit, pack_ids=pack_ids,
                _packs=packs, _packed_ids=ids, _solved=solved)


def checksum_covers_attrs(attrs: Mapping) -> bool:
    """Whether the checksum of a plan with root ``attrs`` covers its claims' attrs
    (``format_version`` >= :data:`CHECKSUM_ATTRS_VERSION`) or only its arrays (version 1)."""
    version = attrs.get("format_version")
    return isinstance(version, int) and not isinstance(version, bool) and version >= CHECKSUM_ATTRS_VERSION


def _without(value: Any, keys: tuple[str, ...]) -> Any:
    if not isinstance(value, Mapping):
        return value
    return {k: v for k, v in value.items() if k not in keys}


def plan_claims(root_attrs: Mapping, group: zarr.Group) -> dict[str, Any]:
    """The attrs the version-2 plan checksum covers, ``{"": root, "blocks/<block_id>": block
    attrs, ..., "packs/<pack_id>": pack attrs, ..., "solved": the solved pack's attrs}`` (packs:
    their ``kind`` and ``solver``, the solver without :data:`UNCLAIMED_SOLVER`; the solved pack:
    its ``kind``, ``block_ids`` and ``solvers``, each without :data:`UNCLAIMED_SOLVER`):
    ``root_attrs`` without :data:`UNCLAIMED_ROOT`, its ``planner`` without
    :data:`UNCLAIMED_PLANNER`; every block's attrs (read from ``group``) with its ``solver``
    without :data:`UNCLAIMED_SOLVER`. Everything else a plan states is covered: alpha,
    alpha_exact, rho, composition, the account, the spec and schema, the planner's bounds,
    variance scale and decisions, and each block's attributes, alpha and lower bound."""
    root = dict(_without(root_attrs, UNCLAIMED_ROOT))
    if "planner" in root:
        root["planner"] = _without(root["planner"], UNCLAIMED_PLANNER)
    claims: dict[str, Any] = {"": root}
    for kind in ("blocks", "packs"):  # one group per block; packs of closed-form blocks
        if kind not in group:
            continue
        members = group[kind]
        for name in sorted(members.group_keys()):
            member = dict(members[name].attrs)
            if "solver" in member:
                member["solver"] = _without(member["solver"], UNCLAIMED_SOLVER)
            claims[f"{kind}/{name}"] = member
    if SOLVED_GROUP in group:  # the solved pack (format 5): its ids, kind and solvers
        solved = dict(group[SOLVED_GROUP].attrs)
        if isinstance(solved.get("solvers"), list):
            solved["solvers"] = [_without(s, UNCLAIMED_SOLVER) for s in solved["solvers"]]
        claims[SOLVED_GROUP] = solved
    return claims


def plan_checksum_claims(attrs: Mapping, group: zarr.Group, claims: dict[str, Any] | None = None
                         ) -> dict[str, Any] | None:
    """The plan's sealing rule (:data:`distfit.stores.sealing.ClaimRule`): :func:`plan_claims`
    (or ``claims``, when already made from these attrs) for a plan of format version 2 or later,
    the arrays only (None) for one of version 1."""
    if not checksum_covers_attrs(attrs):
        return None
    return plan_claims(attrs, group) if claims is None else claims


def read_verified_plan(path: PathLike) -> Plan:
    """:func:`read_plan`, then its checksum recomputed under the plan's rule
    (:func:`distfit.stores.sealing.check_verified`): what a command that reads a plan it does not
    audit (the report) calls once; :class:`StoreError` in one line if the plan changed."""
    return read_plan(path, verify=True)


def verify_checksum(path: PathLike | Plan) -> tuple[bool, str, str]:
    """``(ok, stored, recomputed)`` for a plan store (refused like :func:`read_plan`), under the
    plan's rule :func:`plan_checksum_claims` (:func:`distfit.stores.sealing.verify_opened`).
    Given a :class:`Plan` already read, its store is not opened again and its claims
    (:attr:`Plan.claims`) are the ones hashed (the audit: one parse of a plan's root attrs)."""
    if not isinstance(path, Plan):
        _p, group, attrs = _open_plan_group(path)
        return verify_opened(group, attrs, plan_checksum_claims)
    plan = path
    return verify_opened(plan._group, plan.attrs, functools.partial(plan_checksum_claims, claims=plan.claims))


__all__ = [
    "BLOCK_ARRAYS",
    "CERTIFICATE_ARRAYS",
    "PACK_ARRAYS",
    "PACK_KIND",
    "PACKED_VERSION",
    "QUERY_VECTORS",
    "RUN_LENGTH_MIN_QUERIES",
    "RUN_LENGTH_RATIO",
    "RUNS_VERSION",
    "SOLVED_PACK_MIN_BLOCKS",
    "SOLVED_VERSION",
    "UNPACKED_VERSION",
    "packed_ids",
    "CHECKSUM_ATTRS_VERSION",
    "CHUNK_BYTES",
    "FORMAT_VERSION",
    "BlockRecord",
    "Plan",
    "StoreError",
    "checksum_covers_attrs",
    "plan_checksum_claims",
    "plan_claims",
    "read_plan",
    "read_verified_plan",
    "stored_form",
    "verify_checksum",
]
