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

Writing is atomic like the plan store (:mod:`distfit.store`): everything goes to a staging
directory ``<path>.incomplete-<random>`` one chunk at a time (memory is flat in N), the root
attrs with ``complete=True`` come last, everything is fsynced and the directory is renamed
into place. An existing path is refused unless ``overwrite=True`` (and then only a histograms
store is replaced, once the new one is complete); an exception deletes the staging directory.
"""
from __future__ import annotations

import os
import secrets
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import zarr

from .store import (
    CHUNK_BYTES,
    STAGING_MARKER,
    _fsync_tree,
    _is_staging,
    _jsonable,
    _leftovers,
    _root_attrs_on_disk,
    _utc_now,
    check_format,
    move_into_place,
)
from .workload import Domain

FORMAT = "histograms"
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
    """A path that is not a readable, complete histograms store (the message names it)."""


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


def _check_int(name: str, value: Any, minimum: int) -> int:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


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
    units = _check_int("units", units, 1)
    seed = _check_int("seed", seed, 0)
    chunk_units = default_chunk_units(domain.size, units) if chunk_units is None \
        else _check_int("chunk_units", chunk_units, 1)
    return domain, units, seed, chunk_units


def synthesize_chunk(domain: Domain, units: int, seed: int, chunk: int, chunk_units: int | None = None,
                     *, params: ModelParams | None = None, model: CellModel | None = None,
                     return_populations: bool = False):
    """Chunk ``chunk`` alone: ``(start, counts)`` (``(start, counts, populations)`` with
    ``return_populations``), identical to what :func:`synthesize_histograms` yields for it."""
    domain, units, seed, chunk_units = _resolve(domain, units, seed, chunk_units)
    n_chunks = -(-units // chunk_units)
    chunk = _check_int("chunk", chunk, 0)
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


def _is_histograms_store(path: Path) -> bool:
    attrs = _root_attrs_on_disk(path)
    return attrs is not None and attrs.get("distfit_format") == FORMAT


def _check_target(path: Path, overwrite: bool) -> None:
    if not (path.exists() or path.is_symlink()):
        return
    if not path.is_dir() or not _is_histograms_store(path):
        raise FileExistsError(f"{path}: already exists and is not a distfit histograms store; refusing to replace it")
    if not overwrite:
        raise FileExistsError(f"{path}: already holds data; pass overwrite=True (--overwrite) to replace it")


def write_synthetic(spec, units: int, out: PathLike, seed: int | None = None,
                    chunk_units: int | None = None, overwrite: bool = False, *,
                    params: ModelParams | None = None, fsync: bool = True) -> Path:
    """Synthesise ``units`` unit histograms for ``spec`` and write them to ``out`` atomically.

    ``spec``: a :class:`distfit.spec.PipelineSpec`, a path to a spec file, or a bare
    :class:`Domain` (then ``spec_hash`` is None). ``seed`` None draws fresh entropy (stored).
    Returns the path written. Raises ``FileExistsError`` for an existing path (unless
    ``overwrite`` and it holds histograms), ``ValueError`` for bad arguments.
    """
    from . import __version__
    from .spec import PipelineSpec, load_spec

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
    path = Path(os.fspath(out))
    if _is_staging(path):
        raise ValueError(f"{path}: a data path may not contain {STAGING_MARKER!r}")
    _check_target(path, overwrite)
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_name(f"{path.name}{STAGING_MARKER}{secrets.token_hex(6)}")
    cells = domain.size
    try:
        group = zarr.open_group(store=str(staging), mode="w-", zarr_format=3)
        group.attrs.update({"distfit_format": FORMAT, "format_version": FORMAT_VERSION, "complete": False})
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
        group.attrs.update(_jsonable({
            "distfit_format": FORMAT,
            "format_version": FORMAT_VERSION,
            "schema": {"attributes": list(domain.names), "sizes": list(domain.sizes)},
            "spec_hash": spec_hash,
            "units": units,
            "cells": cells,
            "seed": seed,
            "chunk_units": chunk_units,
            "total_people": total,
            "model": params.to_dict(),
            "generator": GENERATOR,
            "created": _utc_now(),
            "distfit_version": __version__,
        }))
        group.attrs["complete"] = True
        if fsync:
            _fsync_tree(staging)
        move_into_place(staging, path, lambda existing: _check_target(existing, overwrite))
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return path


# --------------------------------------------------------------------------------------------
# reading


@dataclass(frozen=True, eq=False)
class Histograms:
    """A complete histograms store opened for reading; ``counts`` and ``unit_ids`` are lazy
    zarr arrays (index them to read: ``counts[a:b]``)."""

    path: str
    attrs: dict
    counts: Any = field(repr=False)
    unit_ids: Any = field(repr=False)

    @property
    def units(self) -> int:
        return int(self.counts.shape[0])

    @property
    def cells(self) -> int:
        return int(self.counts.shape[1])

    @property
    def domain(self) -> Domain:
        schema = self.attrs["schema"]
        return Domain(tuple(schema["attributes"]), tuple(schema["sizes"]))

    @property
    def chunk_units(self) -> int:
        return int(self.counts.chunks[0])

    def iter_chunks(self) -> Iterator[tuple[int, np.ndarray]]:
        """``(start, counts)`` per stored chunk, one at a time."""
        step = self.chunk_units
        for start in range(0, self.units, step):
            yield start, np.asarray(self.counts[start:start + step])


def read_histograms(path: PathLike) -> Histograms:
    """Open a complete histograms store, or raise :class:`DataError` (a ValueError) naming the
    path and why: missing, staging directory, not a Zarr v3 group, another format, a newer
    ``format_version``, not marked complete, missing or misshapen arrays."""
    p = Path(os.fspath(path))
    if _is_staging(p):
        raise DataError(f"{p}: is the staging directory of an unfinished write, not data")
    if not p.exists():
        left = _leftovers(p)
        hint = f" (an interrupted write left {', '.join(x.name for x in left)})" if left else ""
        raise DataError(f"{p}: no such histograms store{hint}")
    attrs = _root_attrs_on_disk(p) if p.is_dir() else None
    if attrs is None:
        raise DataError(f"{p}: not a Zarr v3 group (no readable zarr.json)")
    check_format(p, attrs, FORMAT, FORMAT_VERSION, DataError)
    if attrs.get("complete") is not True:
        raise DataError(f"{p}: the data is not marked complete (an unfinished or damaged write)")
    schema = attrs.get("schema")
    try:
        domain = Domain(tuple(schema["attributes"]), tuple(schema["sizes"]))
    except (TypeError, KeyError, ValueError) as exc:
        raise DataError(f"{p}: invalid schema {schema!r} ({exc})") from None
    try:
        group = zarr.open_group(store=str(p), mode="r", zarr_format=3)
    except Exception as exc:  # noqa: BLE001 - any failure to open is a refusal
        raise DataError(f"{p}: cannot open as a Zarr v3 group ({type(exc).__name__}: {exc})") from None
    arrays = {}
    for name in ("counts", "unit_ids"):
        try:
            node = group[name]
        except KeyError:
            node = None
        if not isinstance(node, zarr.Array):
            raise DataError(f"{p}: missing array {name}")
        arrays[name] = node
    counts, ids = arrays["counts"], arrays["unit_ids"]
    if counts.ndim != 2 or counts.shape[1] != domain.size:
        raise DataError(f"{p}: counts has shape {counts.shape}, expected (units, {domain.size})")
    if np.dtype(counts.dtype) != np.int64:
        raise DataError(f"{p}: counts has dtype {counts.dtype}, expected int64")
    if ids.shape != (counts.shape[0],):
        raise DataError(f"{p}: unit_ids has shape {ids.shape}, expected ({counts.shape[0]},)")
    if attrs.get("units", counts.shape[0]) != counts.shape[0]:
        raise DataError(f"{p}: attrs say {attrs.get('units')} units, counts has {counts.shape[0]}")
    return Histograms(path=str(p), attrs=dict(attrs), counts=counts, unit_ids=ids)


__all__ = [
    "FORMAT_VERSION",
    "CellModel",
    "DataError",
    "Histograms",
    "ModelParams",
    "cell_model",
    "default_chunk_units",
    "read_histograms",
    "synthesize_chunk",
    "synthesize_histograms",
    "write_synthetic",
]
