"""Synthetic data for a spec's schema: unit histograms and people (test, demo and benchmark data).

Pure numpy: this module draws the data; :func:`distfit.stores.data.write_synthetic` writes the
histograms as a Zarr store (``distfit synth``) and :func:`distfit.data.people.write_synthetic_people`
writes the people as Parquet microdata. Each unit (e.g. a census block) is a histogram over the
cells of the spec's domain (row-major in the schema order, as in :class:`distfit.mathematics.domain.Domain`).
The data is *synthetic*, not private: its seed is stored with it.

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
``chunk_units`` changes the data, which is why the default chunking (:func:`default_chunk_units`)
is defined here, with its own byte bound, and not by the stores' chunk size.

People (:func:`synthesize_people`): the counts of each chunk expanded to one row per person,
one column per attribute (its data column, holding :func:`raw_values`, so the attribute's
``encode`` maps every row back to its cell) and one per unit column of the spec
(:func:`unit_columns`; nested ids, :func:`synthetic_geography`).
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from distfit.checks import check_integer
from distfit.mathematics.domain import Domain

#: Names the model in the stored attrs (``generator``); change it when the data would change.
GENERATOR = "distfit.data/1"
#: Largest domain (cells) for which full-cell histograms are synthesised.
MAX_CELLS = 1 << 22
#: Most pairs the default model gives an interaction term.
MAX_DEFAULT_PAIRS = 4
#: Most units in one default chunk.
MAX_CHUNK_UNITS = 4096
#: Most bytes of int64 counts in one default chunk (16 MiB, the stores' chunk size; fixed here
#: because the synthetic data depends on the chunking).
MAX_CHUNK_BYTES = 16 * 2**20
#: Each level of a synthetic geography holds this many units of the level below it.
GEOGRAPHY_FANOUT = 10

__all__ = [
    "GENERATOR",
    "MAX_CELLS",
    "MAX_CHUNK_BYTES",
    "MAX_CHUNK_UNITS",
    "CellModel",
    "ModelParams",
    "cell_model",
    "default_chunk_units",
    "raw_values",
    "resolve_synthesis",
    "synthesize_chunk",
    "synthesize_histograms",
    "synthesize_people",
    "synthetic_geography",
    "geography_counts",
    "describe_geography",
    "unit_columns",
]


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
        raise TypeError(f"domain: expected a distfit.mathematics.workload.Domain, got {type(domain).__name__}")
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
    """Units per chunk of a data store (synthetic histograms, tabulated marginals): at most
    :data:`MAX_CHUNK_UNITS` and :data:`MAX_CHUNK_BYTES` of int64 counts over ``cells``."""
    n = max(1, min(MAX_CHUNK_UNITS, MAX_CHUNK_BYTES // (8 * max(1, int(cells)))))
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


def resolve_synthesis(domain: Domain, units: int, seed: int,
                      chunk_units: int | None) -> tuple[Domain, int, int, int]:
    """The checked ``(domain, units, seed, chunk_units)`` of a synthesis (``chunk_units`` None:
    :func:`default_chunk_units`); ValueError (or TypeError) naming the bad argument."""
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
    domain, units, seed, chunk_units = resolve_synthesis(domain, units, seed, chunk_units)
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
    domain, units, seed, chunk_units = resolve_synthesis(domain, units, seed, chunk_units)
    model = cell_model(domain, seed, params)
    for chunk, start in enumerate(range(0, units, chunk_units)):
        _pops, counts = _sample_chunk(model, seed, chunk, min(chunk_units, units - start))
        yield start, counts


# --------------------------------------------------------------------------------------------
# synthetic people (microdata for demos, tests and multi-level runs)


def raw_values(attribute: Any) -> np.ndarray:
    """One data value per value of ``attribute`` that ``attribute.encode`` maps back to it: for
    ``bins`` a number in the bin (its lower edge, or the upper edge minus 1 for an open bottom),
    else a data value that ``recode`` maps to the label, else the label itself."""
    if attribute.bins is not None:
        edges = attribute.bins
        return np.array([lo if math.isfinite(lo) else hi - 1.0 for lo, hi in zip(edges[:-1], edges[1:])])
    source: dict[str, str] = {}
    for raw, label in attribute.recode:
        source.setdefault(label, raw)
    return np.array([source.get(label, label) for label in attribute.values], dtype=object)


def unit_columns(spec: Any) -> list[str]:
    """A spec's unit columns, coarsest first: its levels' (in spec order) or its own."""
    if spec.levels:
        columns = [level.units.column for level in spec.levels if level.units is not None]
    else:
        columns = [spec.units.column] if spec.units is not None else []
    if len(set(columns)) != len(columns):
        raise ValueError(f"spec {spec.name!r}: levels share a unit column ({', '.join(columns)}); a "
                         "synthetic geography needs one column per level")
    return columns


def synthetic_geography(columns: Sequence[str], start: int, stop: int,
                        fanout: int = GEOGRAPHY_FANOUT) -> dict[str, np.ndarray]:
    """Nested unit ids of finest-level units ``start .. stop-1``: the last column has one unit
    per finest unit, the column before it one unit per ``fanout`` of those, and so on, so every
    unit lies inside one unit of each coarser level. Ids read ``COLUMN-000042``."""
    out = {}
    index = np.arange(start, stop)
    for depth, column in enumerate(reversed(columns)):
        level_index = index // fanout ** depth
        out[column] = np.char.add(f"{column}-", np.char.zfill(level_index.astype(str), 6))
    return {column: out[column] for column in columns}


def geography_counts(columns: Sequence[str], units: int, fanout: int = GEOGRAPHY_FANOUT) -> dict[str, int]:
    """How many units each level of :func:`synthetic_geography` has for ``units`` finest units:
    ``ceil(units / fanout**depth)``, coarsest first."""
    finest = len(columns) - 1
    return {column: -(-units // fanout ** (finest - level)) for level, column in enumerate(columns)}


def describe_geography(columns: Sequence[str], units: int, fanout: int = GEOGRAPHY_FANOUT) -> str:
    """One sentence saying what synthetic geography ``units`` finest units get (printed by the
    commands that make one, so nobody wonders where 200 states came from)."""
    counts = geography_counts(columns, units, fanout)
    shown = ", ".join(f"{count:,} {column}" for column, count in counts.items())
    return (f"a synthetic geography ({shown}): every {fanout} units of a level lie in one unit of the level "
            "above, ids COLUMN-000000 in order; it is made up, as the data is")


def synthesize_people(spec: Any, units: int, seed: int) -> Iterator[dict[str, np.ndarray]]:
    """The people of ``units`` finest-level units of ``spec`` (a
    :class:`distfit.spec.model.PipelineSpec`), one table per chunk of
    :func:`synthesize_histograms` (default chunking): ``{column: values}``, one row per person
    (module docstring). The spec's unit columns are checked before the first chunk is drawn."""
    domain = spec.domain
    columns = unit_columns(spec)
    values = [raw_values(attribute) for attribute in spec.attributes]

    def tables() -> Iterator[dict[str, np.ndarray]]:
        for start, counts in synthesize_histograms(domain, units, seed):
            n = counts.shape[0]
            flat = counts.ravel()
            keys = np.repeat(np.arange(flat.size, dtype=np.int64), flat)
            unit = keys // domain.size + start
            codes = np.unravel_index(keys % domain.size, domain.shape)
            table = {}
            for column, ids in synthetic_geography(columns, start, start + n).items():
                table[column] = ids[unit - start]
            for attribute, raw, code in zip(spec.attributes, values, codes):
                table[attribute.data_column] = raw[code] if raw.dtype != object else raw[code].astype(str)
            yield table

    return tables()
