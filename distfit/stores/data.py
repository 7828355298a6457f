"""Synthetic unit histograms: realistic test, demo and benchmark data for a spec's schema.

``distfit synth SPEC.yaml --units N --out DATA.zarr`` (DESIGN.md section 5) writes N units
(e.g. census blocks), each a histogram over the cells of the spec's domain (row-major in the
schema order, as in :class:`distfit.workload.Domain`). The data is *synthetic*, not private:
its seed is stored with it.

Model (:class:`CellModel`, built from the seed alone)
-----------------------------------------------------
* cell probabilities ``p`` from a log-linear model over the attributes:
  ``log p(x) = sum_i theta_i[x_i] + sum_{(i, j) in pairs} phi_ij[x_i, x_j] + const`` with
  skewed main effects ``theta_i = log Dirichlet(marginal_concentration * 1)`` (small
  concentration: a few values hold most people) and rank-1 interactions
  ``phi_ij = interaction_strength * u v^T`` (``u, v`` standard normal vectors, centred and
  scaled to unit standard deviation, so every interacting pair is clearly dependent) for ``pairs``
  (default: consecutive attributes ``(0, 1), (1, 2), ...``, at most :data:`MAX_DEFAULT_PAIRS`);
* unit populations lognormal (median ``population_median``, log-sd ``population_sigma``: a
  heavy tail), with a share ``empty_share`` of empty units (population 0);
* each unit's probabilities ``p_u ~ Dirichlet(unit_concentration * p)`` (units differ in
  composition around the global ``p``), counts ``~ Multinomial(population_u, p_u)``; a unit's
  counts therefore sum to its population exactly.

Determinism: the model comes from ``SeedSequence(seed, spawn_key=(0,))``; the units of chunk
``c`` (units ``c * chunk_units`` to ``(c + 1) * chunk_units - 1``) from
``SeedSequence(seed, spawn_key=(1, c))``. So the data is a function of
``(domain, seed, chunk_units, model parameters)`` (and, for the last chunk, of how many units
it holds), and any chunk can be regenerated alone (:func:`synthesize_chunk`). Changing
``chunk_units`` changes the data.

Store (**contract** for ``distfit release --data``): a Zarr v3 group ``DATA.zarr`` with attrs
``distfit_format="histograms"``, ``format_version=1``, ``schema`` ({"attributes": [names],
"sizes": [ints]}), ``spec_hash`` (of the spec it was made for; None from a bare domain),
``units``, ``cells``, ``seed``, ``chunk_units``, ``total_people``, ``model`` (the parameters),
``generator`` (``"distfit.data/1"``), ``created``, ``distfit_version`` and, written last,
``complete=True``; arrays

* ``counts``   (units, cells) int64, chunks ``(chunk_units, cells)`` (whole rows);
* ``unit_ids`` (units,) int64, chunks ``(chunk_units,)``: synthetic units are numbered
  ``0 .. units - 1``. (Readers should accept any 1-d ids; real data may carry string ids.)

Writing is atomic like the plan store (:mod:`distfit.stores.plan`): everything goes to a staging
directory ``<path>.incomplete-<random>`` one chunk at a time (memory is flat in N), the root
attrs with ``complete=True`` come last, everything is fsynced and the directory is renamed
into place. An existing path is refused unless ``overwrite=True`` (and then only a histograms
store is replaced, once the new one is complete); an exception deletes the staging directory.
(:func:`staged_store` does this for every data-store writer: the histograms written here and
the marginals tabulated from microdata by :mod:`distfit.data.microdata`.)

Reading for a release (:func:`open_data`)
----------------------------------------
``distfit release --data`` takes either store format:

* ``"histograms"`` (above): full-domain counts, :class:`HistogramsData`;
* ``"marginals"`` (**contract**, written by :func:`distfit.data.microdata.tabulate_microdata` from
  person-level microdata): a Zarr v3 group with attrs ``distfit_format="marginals"``,
  ``format_version=1``, ``schema``, ``spec_hash``, ``units``, ``chunk_units``, ``cliques``
  (list of attribute-name lists in schema order: the maximal query cliques of the spec's
  groups, plus any attribute sets the tabulation was asked to cover, e.g. a plan's blocks; a
  set inside another is dropped), ``source`` ({"path", "format": "csv"|"parquet", "rows",
  "size", "mtime"}), ``total_people``, ``created``, ``distfit_version`` and, last,
  ``complete=True``; arrays ``marginals/<i>`` (units, prod(sizes of clique i)) int64, chunks
  ``(chunk_units, cells)``, cells row-major in schema order, and ``unit_ids`` (units,) sorted
  ascending: int64 when the source's unit column holds integers, otherwise variable-length
  UTF-8 strings (the Zarr v3 ``string`` data type with the ``vlen-utf8`` codec, which
  zarr-python 3.1 reads and writes natively; sorted by code point). :class:`MarginalsData`.

Both give ``units``, ``chunk_units``, ``domain``, ``unit_ids`` (a lazy zarr array: index it per
chunk) and ``block_counts(attributes, start, stop)``: the (stop - start, d_b) int64 marginal
counts of units ``start .. stop - 1`` on a block's attributes (columns row-major over the
attributes in schema order), validated by :func:`distfit.release.noise.validate_counts` (a
``ValueError`` naming the unit row and cell). Histograms sum the full counts down
(:func:`distfit.release.noise.block_marginal`); marginals sum the smallest stored clique that contains
the block's attributes, and a block inside no stored clique is a :class:`DataError`
(``check_blocks`` refuses it up front). The counts of the last chunk range read are cached, so
the blocks of one chunk read the store once.

Unit ids must be distinct: ``check_unit_ids()`` (run once up front by the release driver) reads
the ids chunk by chunk and keeps only the previous chunk's last id, so sorted ids (every
synthetic and every tabulated store) are checked in constant memory; unsorted ids (a
hand-made histograms store) fall back to one ``np.unique`` over all the ids (the ids only,
never the counts). A duplicate is a :class:`DataError` naming the store and the id.
"""
from __future__ import annotations

import contextlib
import math
import os
import secrets
import shutil
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from distfit.stores.files import (
    CHUNK_BYTES,
    STAGING_MARKER,
    check_format,
    fsync_tree,
    is_staging,
    jsonable,
    leftovers,
    move_into_place,
    root_attrs_on_disk,
    utc_now,
)
from distfit.checks import check_integer
from distfit.domain import Domain

FORMAT = "histograms"
MARGINALS_FORMAT = "marginals"
FORMAT_VERSION = 1
GENERATOR = "distfit.data/1"
#: Largest domain (cells) for which full-cell histograms are synthesised.
MAX_CELLS = 1 << 22
#: Most pairs the default model gives an interaction term.
MAX_DEFAULT_PAIRS = 4
#: Most units in one default chunk (a chunk is also kept under ``CHUNK_BYTES`` of counts).
MAX_CHUNK_UNITS = 4096

PathLike = str | os.PathLike


class DataError(ValueError):
    """Data that cannot be used: a path that is not a readable, complete data store, or bad
    microdata (:mod:`distfit.data.microdata`); the one-line message names the path and why."""


# --------------------------------------------------------------------------------------------
# model


@dataclass(frozen=True)
class ModelParams:
    """Parameters of the synthetic-data model (module docstring); all stored in the attrs."""

    population_median: float = 100.0
    population_sigma: float = 1.2
    empty_share: float = 0.05
    marginal_concentration: float = 0.5
    interaction_strength: float = 1.0
    unit_concentration: float = 50.0
    pairs: tuple[tuple[int, int], ...] | None = None  # None: the default chain

    def __post_init__(self) -> None:
        for name in ("population_median", "population_sigma", "marginal_concentration",
                     "unit_concentration"):
            value = getattr(self, name)
            if not (np.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be finite and > 0, got {value!r}")
        if not (0.0 <= self.empty_share < 1.0):
            raise ValueError(f"empty_share must be in [0, 1), got {self.empty_share!r}")
        if not (np.isfinite(self.interaction_strength) and self.interaction_strength >= 0):
            raise ValueError(f"interaction_strength must be finite and >= 0, got {self.interaction_strength!r}")
        if self.pairs is not None:
            object.__setattr__(self, "pairs", tuple(tuple(int(a) for a in p) for p in self.pairs))

    def to_dict(self) -> dict[str, Any]:
        return {"population_median": self.population_median, "population_sigma": self.population_sigma,
                "empty_share": self.empty_share, "marginal_concentration": self.marginal_concentration,
                "interaction_strength": self.interaction_strength,
                "unit_concentration": self.unit_concentration,
                "pairs": None if self.pairs is None else [list(p) for p in self.pairs]}


@dataclass(frozen=True, eq=False)
class CellModel:
    """The global cell distribution of the synthetic data (built by :func:`cell_model`)."""

    domain: Domain
    params: ModelParams
    marginals: tuple[np.ndarray, ...]                   # main effects as probabilities, per attribute
    interactions: dict[tuple[int, int], np.ndarray]    # phi_ij (s_i x s_j)
    probabilities: np.ndarray = field(repr=False)      # (cells,), sums to 1

    @property
    def pairs(self) -> tuple[tuple[int, int], ...]:
        return tuple(self.interactions)


def _check_domain(domain: Domain) -> Domain:
    if not isinstance(domain, Domain):
        raise TypeError(f"domain: expected a distfit.workload.Domain, got {type(domain).__name__}")
    if domain.size > MAX_CELLS:
        raise ValueError(
            f"the domain has {domain.size} cells, more than {MAX_CELLS} for full-cell unit "
            "histograms; synthesise data for a smaller schema")
    return domain


def _default_pairs(k: int) -> tuple[tuple[int, int], ...]:
    return tuple((i, i + 1) for i in range(min(k - 1, MAX_DEFAULT_PAIRS)))


def _standardised(x: np.ndarray) -> np.ndarray:
    """``x`` centred and scaled to unit standard deviation (zeros for a single value)."""
    x = x - x.mean()
    sd = x.std()
    return x / sd if sd > 0 else x


def cell_model(domain: Domain, seed: int, params: ModelParams | None = None) -> CellModel:
    """The model's global cell probabilities for ``domain`` (a function of ``seed`` only)."""
    domain = _check_domain(domain)
    params = params or ModelParams()
    k = len(domain)
    pairs = _default_pairs(k) if params.pairs is None else params.pairs
    for pair in pairs:
        if len(pair) != 2 or pair[0] == pair[1] or not all(0 <= a < k for a in pair):
            raise ValueError(f"pairs: {pair!r} is not a pair of distinct attribute positions < {k}")
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(0,)))
    logp = np.zeros(domain.shape)
    marginals = []
    for i, size in enumerate(domain.sizes):
        theta = rng.dirichlet(np.full(size, params.marginal_concentration))
        theta = np.maximum(theta, 1e-12)
        theta /= theta.sum()
        marginals.append(theta)
        shape = [1] * k
        shape[i] = size
        logp = logp + np.log(theta).reshape(shape)
    interactions = {}
    for i, j in pairs:
        u = _standardised(rng.standard_normal(domain.sizes[i]))
        v = _standardised(rng.standard_normal(domain.sizes[j]))
        phi = params.interaction_strength * np.outer(u, v)
        interactions[(i, j)] = phi
        shape = [1] * k
        shape[i], shape[j] = domain.sizes[i], domain.sizes[j]
        logp = logp + (phi if i < j else phi.T).reshape(shape)
    logp = logp.reshape(-1)
    p = np.exp(logp - logp.max())
    p /= p.sum()
    return CellModel(domain, params, tuple(marginals), interactions, p)


# --------------------------------------------------------------------------------------------
# sampling


def default_chunk_units(cells: int, units: int | None = None) -> int:
    """Units per chunk: at most :data:`MAX_CHUNK_UNITS` and ``CHUNK_BYTES`` of int64 counts."""
    n = max(1, min(MAX_CHUNK_UNITS, CHUNK_BYTES // (8 * max(1, int(cells)))))
    return n if units is None else max(1, min(n, int(units)))


def _sample_chunk(model: CellModel, seed: int, chunk: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``(populations (n,), counts (n, cells))`` of chunk ``chunk`` holding ``n`` units."""
    params = model.params
    rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(1, chunk)))
    pops = np.floor(rng.lognormal(np.log(params.population_median), params.population_sigma, n))
    pops[rng.random(n) < params.empty_share] = 0
    pops = pops.astype(np.int64)
    alpha = params.unit_concentration * model.probabilities + 1e-9
    probs = rng.dirichlet(alpha, size=n)
    probs /= probs.sum(axis=1, keepdims=True)
    counts = rng.multinomial(pops, probs).astype(np.int64, copy=False)
    return pops, counts


def _resolve(domain: Domain, units: int, seed: int, chunk_units: int | None):
    domain = _check_domain(domain)
    units = check_integer(units, "units", 1)
    seed = check_integer(seed, "seed", 0)
    chunk_units = default_chunk_units(domain.size, units) if chunk_units is None \
        else check_integer(chunk_units, "chunk_units", 1)
    return domain, units, seed, chunk_units


def synthesize_chunk(domain: Domain, units: int, seed: int, chunk: int, chunk_units: int | None = None,
                     *, params: ModelParams | None = None, model: CellModel | None = None,
                     return_populations: bool = False):
    """Chunk ``chunk`` alone: ``(start, counts)`` (``(start, counts, populations)`` with
    ``return_populations``), identical to what :func:`synthesize_histograms` yields for it."""
    domain, units, seed, chunk_units = _resolve(domain, units, seed, chunk_units)
    n_chunks = -(-units // chunk_units)
    chunk = check_integer(chunk, "chunk", 0)
    if chunk >= n_chunks:
        raise ValueError(f"chunk {chunk} out of range: {units} units in chunks of {chunk_units} make {n_chunks}")
    model = model or cell_model(domain, seed, params)
    start = chunk * chunk_units
    pops, counts = _sample_chunk(model, seed, chunk, min(chunk_units, units - start))
    return (start, counts, pops) if return_populations else (start, counts)


def synthesize_histograms(domain: Domain, units: int, seed: int, chunk_units: int | None = None,
                          *, params: ModelParams | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """Yield ``(start, counts)`` chunk by chunk: ``counts`` int64 (rows ``start ..
    start + len(counts) - 1``, one column per cell); only one chunk is held at a time."""
    domain, units, seed, chunk_units = _resolve(domain, units, seed, chunk_units)
    model = cell_model(domain, seed, params)
    for chunk, start in enumerate(range(0, units, chunk_units)):
        _pops, counts = _sample_chunk(model, seed, chunk, min(chunk_units, units - start))
        yield start, counts


# --------------------------------------------------------------------------------------------
# writing


def _check_target(path: Path, overwrite: bool, fmt: str = FORMAT) -> None:
    """Refuse ``path`` unless it is absent, or holds a ``fmt`` data store and ``overwrite``."""
    if not (path.exists() or path.is_symlink()):
        return
    attrs = root_attrs_on_disk(path) if path.is_dir() else None
    if attrs is None or attrs.get("distfit_format") != fmt:
        raise FileExistsError(f"{path}: already exists and is not a distfit {fmt} store; refusing to replace it")
    if not overwrite:
        raise FileExistsError(f"{path}: already holds data; pass overwrite=True (--overwrite) to replace it")


@contextlib.contextmanager
def staged_store(out: PathLike, fmt: str, *, overwrite: bool = False, fsync: bool = True):
    """Write a data store of format ``fmt`` at ``out`` atomically (module docstring).

    Yields ``(staging_path, group)``: an empty Zarr v3 group in ``<out>.incomplete-<random>``
    with ``complete=False``; the caller writes its arrays and attrs. When the block ends
    normally ``complete=True`` is written last, the tree is fsynced and moved into place
    (replacing only a ``fmt`` store, and only with ``overwrite``); an exception deletes the
    staging directory and leaves ``out`` as it was. Shared by every data-store writer.
    """
    path = Path(os.fspath(out))
    if is_staging(path):
        raise ValueError(f"{path}: a data path may not contain {STAGING_MARKER!r}")
    _check_target(path, overwrite, fmt)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f"{path.name}{STAGING_MARKER}{secrets.token_hex(6)}")
    try:
        group = zarr.open_group(store=str(staging), mode="w-", zarr_format=3)
        group.attrs.update({"distfit_format": fmt, "format_version": FORMAT_VERSION, "complete": False})
        yield staging, group
        group.attrs["complete"] = True
        if fsync:
            fsync_tree(staging)
        move_into_place(staging, path, lambda existing: _check_target(existing, overwrite, fmt))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def write_synthetic(spec, units: int, out: PathLike, seed: int | None = None,
                    chunk_units: int | None = None, overwrite: bool = False, *,
                    params: ModelParams | None = None, fsync: bool = True) -> Path:
    """Synthesise ``units`` unit histograms for ``spec`` and write them to ``out`` atomically.

    ``spec``: a :class:`distfit.spec.parse.PipelineSpec`, a path to a spec file, or a bare
    :class:`Domain` (then ``spec_hash`` is None). ``seed`` None draws fresh entropy (stored).
    Returns the path written. Raises ``FileExistsError`` for an existing path (unless
    ``overwrite`` and it holds histograms), ``ValueError`` for bad arguments.
    """
    from distfit import __version__
    from distfit.spec.parse import PipelineSpec, load_spec

    if isinstance(spec, (str, os.PathLike)):
        spec = load_spec(spec)
    if isinstance(spec, PipelineSpec):
        domain, spec_hash = spec.domain, spec.spec_hash
    elif isinstance(spec, Domain):
        domain, spec_hash = spec, None
    else:
        raise TypeError(f"spec: expected a PipelineSpec, a spec path or a Domain, got {type(spec).__name__}")
    if seed is None:
        seed = secrets.randbits(63)
    domain, units, seed, chunk_units = _resolve(domain, units, seed, chunk_units)
    params = params or ModelParams()
    cells = domain.size
    with staged_store(out, FORMAT, overwrite=overwrite, fsync=fsync) as (_staging, group):
        config = {"write_empty_chunks": True}
        counts_arr = group.create_array("counts", shape=(units, cells), dtype=np.int64,
                                        chunks=(chunk_units, cells), config=config)
        ids_arr = group.create_array("unit_ids", shape=(units,), dtype=np.int64,
                                     chunks=(chunk_units,), config=config)
        total = 0
        for start, counts in synthesize_histograms(domain, units, seed, chunk_units, params=params):
            stop = start + counts.shape[0]
            counts_arr[start:stop] = counts
            ids_arr[start:stop] = np.arange(start, stop, dtype=np.int64)
            total += int(counts.sum())
        group.attrs.update(jsonable({
            "distfit_format": FORMAT,
            "format_version": FORMAT_VERSION,
            "schema": domain.schema(),
            "spec_hash": spec_hash,
            "units": units,
            "cells": cells,
            "seed": seed,
            "chunk_units": chunk_units,
            "total_people": total,
            "model": params.to_dict(),
            "generator": GENERATOR,
            "created": utc_now(),
            "distfit_version": __version__,
        }))
    return Path(os.fspath(out))


# --------------------------------------------------------------------------------------------
# reading


def _show_id(value: Any) -> str:
    value = value.item() if isinstance(value, np.generic) else value
    return repr(value) if isinstance(value, str) else str(value)


def _check_unit_ids(path: str, ids: Any, step: int) -> None:
    """DataError naming ``path`` and the id if ``ids`` (a 1-d lazy array) holds a duplicate.

    Read ``step`` ids at a time keeping only the previous chunk's last id: while the ids are
    non-decreasing a duplicate is two equal neighbours (constant memory); ids out of order are
    checked with one ``np.unique`` over all of them instead.
    """
    n = int(ids.shape[0])
    previous = None
    for start in range(0, n, max(1, int(step))):
        part = np.asarray(ids[start:start + step])
        if previous is not None:
            part = np.concatenate([previous, part])
        if part.size > 1:
            if np.any(part[1:] < part[:-1]):
                break  # not sorted: check all ids at once below
            equal = np.flatnonzero(part[1:] == part[:-1])
            if equal.size:
                raise DataError(f"{path}: unit id {_show_id(part[equal[0]])} appears more than once "
                                "in unit_ids (every unit must be distinct)")
        previous = part[-1:]
    else:
        return
    uniques, counts = np.unique(np.asarray(ids[...]), return_counts=True)
    if np.any(counts > 1):
        raise DataError(f"{path}: unit id {_show_id(uniques[np.argmax(counts > 1)])} appears more than "
                        "once in unit_ids (every unit must be distinct)")


def _cached(cache: dict, key: tuple, start: int, stop: int, read):
    """``read()`` once per ``key`` while the chunk range ``(start, stop)`` stays the same."""
    if cache.get("range") != (start, stop):
        cache.clear()
        cache["range"] = (start, stop)
    if key not in cache:
        cache[key] = read()
    return cache[key]


@dataclass(frozen=True, eq=False)
class HistogramsData:
    """A complete histograms store opened for reading; ``counts`` and ``unit_ids`` are lazy
    zarr arrays (index them to read: ``counts[a:b]``)."""

    path: str
    attrs: dict
    counts: Any = field(repr=False)
    unit_ids: Any = field(repr=False)
    _cache: dict = field(default_factory=dict, repr=False)

    format = FORMAT

    @property
    def units(self) -> int:
        return int(self.counts.shape[0])

    @property
    def cells(self) -> int:
        return int(self.counts.shape[1])

    @property
    def domain(self) -> Domain:
        schema = self.attrs["schema"]
        return Domain.from_schema(schema)

    @property
    def chunk_units(self) -> int:
        return int(self.counts.chunks[0])

    def iter_chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, counts)`` per stored chunk, one at a time."""
        step = self.chunk_units
        for start in range(0, self.units, step):
            yield start, np.asarray(self.counts[start:start + step])

    def check_blocks(self, attribute_sets: Sequence[Sequence[str]]) -> None:
        """Every block's marginal can be had from full counts (unknown names: ValueError)."""
        domain = self.domain
        for attributes in attribute_sets:
            for name in attributes:
                domain.index(name)

    def check_unit_ids(self) -> None:
        """DataError if a unit id appears twice (module docstring)."""
        _check_unit_ids(self.path, self.unit_ids, self.chunk_units)

    def block_counts(self, attributes: Sequence[str], start: int, stop: int) -> np.ndarray:
        """Units ``start .. stop - 1`` summed to the block's attributes: (n, d_b) int64.

        The chunk's counts are read and validated once (:func:`distfit.release.noise.validate_counts`,
        a ValueError naming the unit row within the range and the cell) and kept for the next
        block of the same range.
        """
        from distfit.release.noise import _marginal, validate_counts

        domain = self.domain
        counts = _cached(self._cache, ("counts",), start, stop,
                         lambda: validate_counts(self.counts[start:stop], domain))
        return _marginal(counts, domain, attributes)


#: The name this class had before the marginals store existed.
Histograms = HistogramsData


@dataclass(frozen=True, eq=False)
class MarginalsData:
    """A complete marginals store opened for reading (module docstring): ``marginals[i]`` is
    the lazy zarr array of clique ``cliques[i]``, ``unit_ids`` the lazy ids."""

    path: str
    attrs: dict
    cliques: tuple[tuple[str, ...], ...]
    marginals: tuple[Any, ...] = field(repr=False)
    unit_ids: Any = field(repr=False)
    _cache: dict = field(default_factory=dict, repr=False)

    format = MARGINALS_FORMAT

    @property
    def units(self) -> int:
        return int(self.unit_ids.shape[0])

    @property
    def domain(self) -> Domain:
        schema = self.attrs["schema"]
        return Domain.from_schema(schema)

    @property
    def chunk_units(self) -> int:
        return int(self.attrs["chunk_units"])

    def clique_cells(self, index: int) -> int:
        """Cells of clique ``index``'s marginal (1 for the empty clique, the grand total)."""
        domain = self.domain
        return math.prod(domain.sizes[domain.index(n)] for n in self.cliques[index])

    def clique_for(self, attributes: Sequence[str]) -> int:
        """Index of the smallest stored clique holding every attribute of ``attributes``;
        DataError if none does."""
        domain = self.domain
        want = set(attributes)
        for name in want:
            domain.index(name)  # ValueError for an unknown name
        fits = [i for i, clique in enumerate(self.cliques) if want <= set(clique)]
        if not fits:
            shown = [n for n in domain.names if n in want]
            raise DataError(
                f"{self.path}: no stored marginal holds the block attributes {shown} (stored cliques: "
                f"{[list(c) for c in self.cliques]}); tabulate the microdata for this plan (distfit release "
                "and distfit run do so for the plan's blocks; distfit tabulate --plan)")
        return min(fits, key=lambda i: (self.clique_cells(i), i))

    def check_blocks(self, attribute_sets: Sequence[Sequence[str]]) -> None:
        """DataError unless every attribute set lies in a stored clique."""
        for attributes in attribute_sets:
            self.clique_for(attributes)

    def check_unit_ids(self) -> None:
        """DataError if a unit id appears twice (module docstring)."""
        _check_unit_ids(self.path, self.unit_ids, self.chunk_units)

    def block_counts(self, attributes: Sequence[str], start: int, stop: int) -> np.ndarray:
        """Units ``start .. stop - 1`` summed to the block's attributes: (n, d_b) int64, from the
        smallest stored clique holding them (read and validated once per chunk range)."""
        from distfit.release.noise import _marginal, validate_marginal

        index = self.clique_for(attributes)
        clique = self.cliques[index]

        def read() -> np.ndarray:
            try:
                return validate_marginal(self.marginals[index][start:stop], self.domain, clique)
            except ValueError as error:
                raise ValueError(f"marginals/{index} {list(clique)}: {error}") from None

        counts = _cached(self._cache, ("clique", index), start, stop, read)
        if set(attributes) == set(clique):
            return counts
        domain = self.domain
        sub = Domain(clique, tuple(domain.sizes[domain.index(n)] for n in clique))
        return _marginal(counts, sub, attributes)


def _open_store(path: PathLike, fmt: str) -> tuple[Path, dict, Domain, Any]:
    """Every refusal check shared by the data readers; returns ``(path, attrs, domain, group)``."""
    p = Path(os.fspath(path))
    if is_staging(p):
        raise DataError(f"{p}: is the staging directory of an unfinished write, not data")
    if not p.exists():
        left = leftovers(p)
        hint = f" (an interrupted write left {', '.join(x.name for x in left)})" if left else ""
        raise DataError(f"{p}: no such {fmt} store{hint}")
    attrs = root_attrs_on_disk(p) if p.is_dir() else None
    if attrs is None:
        raise DataError(f"{p}: not a Zarr v3 group (no readable zarr.json)")
    check_format(p, attrs, fmt, FORMAT_VERSION, DataError)
    if attrs.get("complete") is not True:
        raise DataError(f"{p}: the data is not marked complete (an unfinished or damaged write)")
    schema = attrs.get("schema")
    try:
        domain = Domain.from_schema(schema)
    except (TypeError, KeyError, ValueError) as exc:
        raise DataError(f"{p}: invalid schema {schema!r} ({exc})") from None
    try:
        group = zarr.open_group(store=str(p), mode="r", zarr_format=3)
    except Exception as exc:  # noqa: BLE001 - any failure to open is a refusal
        raise DataError(f"{p}: cannot open as a Zarr v3 group ({type(exc).__name__}: {exc})") from None
    return p, dict(attrs), domain, group


def _array(p: Path, group: Any, name: str) -> Any:
    try:
        node = group[name]
    except KeyError:
        node = None
    if not isinstance(node, zarr.Array):
        raise DataError(f"{p}: missing array {name}")
    return node


def read_histograms(path: PathLike) -> HistogramsData:
    """Open a complete histograms store, or raise :class:`DataError` (a ValueError) naming the
    path and why: missing, staging directory, not a Zarr v3 group, another format, a newer
    ``format_version``, not marked complete, missing or misshapen arrays."""
    p, attrs, domain, group = _open_store(path, FORMAT)
    counts, ids = _array(p, group, "counts"), _array(p, group, "unit_ids")
    if counts.ndim != 2 or counts.shape[1] != domain.size:
        raise DataError(f"{p}: counts has shape {counts.shape}, expected (units, {domain.size})")
    if np.dtype(counts.dtype) != np.int64:
        raise DataError(f"{p}: counts has dtype {counts.dtype}, expected int64")
    if ids.shape != (counts.shape[0],):
        raise DataError(f"{p}: unit_ids has shape {ids.shape}, expected ({counts.shape[0]},)")
    if attrs.get("units", counts.shape[0]) != counts.shape[0]:
        raise DataError(f"{p}: attrs say {attrs.get('units')} units, counts has {counts.shape[0]}")
    return HistogramsData(path=str(p), attrs=attrs, counts=counts, unit_ids=ids)


def read_marginals(path: PathLike) -> MarginalsData:
    """Open a complete marginals store (module docstring), or raise :class:`DataError` naming
    the path and why (as :func:`read_histograms`, plus bad ``cliques`` or ``chunk_units``)."""
    p, attrs, domain, group = _open_store(path, MARGINALS_FORMAT)
    cliques = attrs.get("cliques")
    try:
        cliques = tuple(tuple(str(name) for name in clique) for clique in cliques)
        for clique in cliques:
            if list(clique) != sorted(clique, key=domain.index) or len(set(clique)) != len(clique):
                raise ValueError(f"{list(clique)} is not in schema order")
    except (TypeError, ValueError) as exc:
        raise DataError(f"{p}: invalid cliques {attrs.get('cliques')!r} ({exc})") from None
    if not cliques:
        raise DataError(f"{p}: no cliques")
    ids = _array(p, group, "unit_ids")
    units = attrs.get("units")
    if ids.ndim != 1 or ids.shape[0] != units:
        raise DataError(f"{p}: unit_ids has shape {ids.shape}, but attrs say {units!r} units")
    chunk_units = attrs.get("chunk_units")
    if isinstance(chunk_units, bool) or not isinstance(chunk_units, int) or chunk_units < 1:
        raise DataError(f"{p}: invalid chunk_units {chunk_units!r}")
    arrays = []
    for i, clique in enumerate(cliques):
        arr = _array(p, group, f"marginals/{i}")
        cells = math.prod(domain.sizes[domain.index(n)] for n in clique)
        if arr.shape != (units, cells):
            raise DataError(f"{p}: marginals/{i} has shape {arr.shape}, expected ({units}, {cells}) "
                            f"for {list(clique)}")
        if np.dtype(arr.dtype) != np.int64:
            raise DataError(f"{p}: marginals/{i} has dtype {arr.dtype}, expected int64")
        if arr.chunks[0] != chunk_units:
            raise DataError(f"{p}: marginals/{i} is chunked by {arr.chunks[0]} units, attrs say {chunk_units}")
        arrays.append(arr)
    return MarginalsData(path=str(p), attrs=attrs, cliques=cliques, marginals=tuple(arrays), unit_ids=ids)


def open_data(path: PathLike) -> HistogramsData | MarginalsData:
    """Open a complete data store of either format (module docstring) for a release, or raise
    :class:`DataError` naming the path and why."""
    p = Path(os.fspath(path))
    if not p.exists() and not is_staging(p):
        left = leftovers(p)
        hint = f" (an interrupted write left {', '.join(x.name for x in left)})" if left else ""
        raise DataError(f"{p}: no such data store{hint} (data is a Zarr store made by distfit synth or "
                        "distfit tabulate, or microdata: .csv, .csv.gz, .parquet, .pq)")
    attrs = root_attrs_on_disk(p) if p.is_dir() else None
    if attrs is not None and attrs.get("distfit_format") == MARGINALS_FORMAT:
        return read_marginals(p)
    return read_histograms(p)


__all__ = [
    "FORMAT_VERSION",
    "CellModel",
    "DataError",
    "Histograms",
    "HistogramsData",
    "MarginalsData",
    "ModelParams",
    "cell_model",
    "default_chunk_units",
    "open_data",
    "read_histograms",
    "read_marginals",
    "staged_store",
    "synthesize_chunk",
    "synthesize_histograms",
    "write_synthetic",
]
