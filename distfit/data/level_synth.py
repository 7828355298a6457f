"""Synthetic data for every level of a multi-level spec at census scale, without people.

``distfit synth SPEC --units N --out RUNDIR`` on a spec with levels (:func:`write_level_data`):
the US-shaped geography of the spec's unit levels (:func:`distfit.data.us_geography.us_geography`,
finest level ``N`` units) written as ``RUNDIR/geography.csv`` (docs/geography.md), the finest
level's unit histograms drawn chunk by chunk (:func:`distfit.data.synthetic.synthesize_histograms`
with :data:`BLOCK_MODEL`: heavy-tailed populations, ~30% empty) and each level's data store
``RUNDIR/levels/<level>/data.zarr``: a marginals store (:mod:`distfit.stores.data`) with one
clique, every attribute (the full histogram), ``unit_ids`` (the level's int64 ids),
``parent_ids`` (the parent's, for a level under another unit level) and ``source.format =
"synthetic"``. A coarser level's histogram is the exact sum of its children's, so children sum to
their parent in every store, and a level without a unit column (the nation) is one unit (id 0)
holding the total.

Why not people: synthesising ~40 people per block and tabulating every level from them costs
one row per person per level (8M blocks: ~330M rows, six scans); summing the block histograms
up the tree costs a few array reductions per chunk of blocks. ``distfit run SPEC --out RUNDIR``
then releases these stores as they are (:func:`distfit.pipeline.run.run_levels`).

Streaming: one chunk of blocks at a time; since each level's ids sorted are in tree order, the
rows a chunk of blocks touches at a coarser level are ascending, so each level keeps one output
chunk in memory (:class:`_LevelSink`) and writes it once the blocks have moved past it: memory
is a few chunks per level plus the geography's int64 arrays, whatever ``N``.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from distfit.checks import check_integer
from distfit.data.geography import nested_geography, write_geography
from distfit.data.synthetic import GENERATOR, ModelParams, default_chunk_units, synthesize_histograms
from distfit.data.us_geography import UsGeography, us_geography
from distfit.stores.files import root_attrs_on_disk
from distfit.stores.data import (MARGINALS_FORMAT, DataError, MarginalsWriter, cell_labels, create_marginals, staged_store,
                                 value_labels, write_marginals_attrs)

__all__ = ["BLOCK_MODEL", "SOURCE_FORMAT", "LevelData", "geography_arrays", "level_data_paths", "synthesised_levels", "unit_levels", "write_level_data"]

#: The ``source.format`` of a synthesised level's data store.
SOURCE_FORMAT = "synthetic"
#: Block populations: lognormal, median 25, log-sd 1.3 (mean of an inhabited block ~58, the
#: 2020 Census's 331M people over ~5.7M inhabited blocks), 30% of blocks empty.
BLOCK_MODEL = ModelParams(population_median=25.0, population_sigma=1.3, empty_share=0.30)


@dataclass(frozen=True)
class LevelData:
    """What :func:`write_level_data` wrote: each level's store and unit count, the geography."""

    rundir: str
    geography: str
    stores: dict[str, str]
    units: dict[str, int]
    total_people: int
    empty_share: float


def unit_levels(spec: Any) -> tuple[list[str], list[tuple[str, str]]]:
    """``(levels without a unit column, [(level, unit column) ...])`` of a multi-level ``spec``,
    spec order; ValueError when a level without a unit column comes under one with one."""
    top, below = [], []
    for level in spec.levels:
        if level.units is None:
            if below:
                raise ValueError(f"spec {spec.name!r}: level {level.name!r} has no unit column but lies under "
                                 f"{below[-1][0]!r}; synthetic level data needs the one-population levels on top")
            top.append(level.name)
        else:
            below.append((level.name, level.units.column))
    return top, below


def level_data_paths(spec: Any, rundir: str | os.PathLike, levels_dir: str, data_name: str) -> dict[str, Path]:
    """Where each level's data store goes: ``RUNDIR/<levels_dir>/<level>/<data_name>``."""
    return {level.name: Path(os.fspath(rundir)) / levels_dir / level.name / data_name for level in spec.levels}


def synthesised_levels(spec: Any, rundir: str | os.PathLike, units: int | None, levels_dir: str = "levels",
                       data_name: str = "data.zarr") -> dict[str, Any] | None:
    """What ``distfit synth`` wrote in RUNDIR for this spec (:func:`distfit.data.level_synth.write_level_data`):
    None when RUNDIR holds no level's data store; else ``{"units": finest units, "geography": the
    manifest's record}`` once every level's store is there, a synthesised marginals store of the
    level's spec (``distfit run`` releases them as they are). DataError for a partial or
    foreign set, or a ``--units`` other than its."""
    paths = level_data_paths(spec, rundir, levels_dir, data_name)
    present = {name: path for name, path in paths.items() if path.exists() or path.is_symlink()}
    if not any(((root_attrs_on_disk(path) or {}).get("source") or {}).get("format") == SOURCE_FORMAT
               for path in present.values()):
        return None  # nothing, or a run's own tabulations
    missing = sorted(set(paths) - set(present))
    if missing:
        raise DataError(f"{os.fspath(rundir)}: holds data for some levels but not for {', '.join(missing)}; use another --out")
    stores = {name: root_attrs_on_disk(path) or {} for name, path in paths.items()}
    for name, attrs in stores.items():
        if attrs.get("distfit_format") != MARGINALS_FORMAT or (attrs.get("source") or {}).get("format") != SOURCE_FORMAT:
            raise DataError(f"{paths[name]}: is not data synthesised by distfit synth for a multi-level spec; "
                              "use another --out")
        if attrs.get("spec_hash") != spec.level_spec(name).spec_hash:
            raise DataError(f"{paths[name]}: holds data synthesised for another spec (spec hash "
                              f"{attrs.get('spec_hash')}); use another --out")
    finest = stores[spec.levels[-1].name]
    if units is not None and units != finest.get("units"):
        raise DataError(f"{os.fspath(rundir)}: holds data synthesised for {finest.get('units')} units, but --units is {units}; "
                          "use another --out (or omit --units)")
    geographies = {name: (attrs.get("source") or {}).get("geography") for name, attrs in stores.items()}
    recorded = next(g for g in geographies.values() if g is not None)
    return {"units": int(finest["units"]),
            "geography": {"path": recorded["path"], "digest": recorded["digest"],
                          "units": {name: g["units"] for name, g in geographies.items() if g is not None}}}


class _LevelSink:
    """One level's store filled in row order: rows arrive ascending (tree order), so one output
    chunk is held and written once the rows have moved past it."""

    def __init__(self, writer: MarginalsWriter, units: int, chunk_units: int, cells: int,
                 ids: np.ndarray, parent_ids: np.ndarray | None) -> None:
        self.writer, self.units, self.chunk_units = writer, units, chunk_units
        self.ids, self.parent_ids = ids, parent_ids
        self.buffer = np.zeros((chunk_units, cells), dtype=np.int64)
        self.chunk = 0

    def add(self, rows: np.ndarray, sums: np.ndarray) -> None:
        """Add ``sums`` (distinct ascending ``rows``) to the level's counts."""
        chunks = rows // self.chunk_units
        for chunk in np.unique(chunks):  # one or two
            while chunk > self.chunk:
                self.flush()
            here = chunks == chunk
            self.buffer[rows[here] - chunk * self.chunk_units] += sums[here]

    def flush(self) -> None:
        start = self.chunk * self.chunk_units
        stop = min(start + self.chunk_units, self.units)
        self.writer.write_marginal(0, start, self.buffer[:stop - start])
        self.writer.write_unit_ids(start, self.ids[start:stop])
        if self.parent_ids is not None:
            self.writer.write_parent_ids(start, self.parent_ids[start:stop])
        self.buffer[:] = 0
        self.chunk += 1

    def close(self) -> None:
        while self.chunk * self.chunk_units < self.units:
            self.flush()


def _segment_sums(rows: np.ndarray, counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values of ascending ``rows`` and the sums of ``counts`` over each."""
    starts = np.flatnonzero(np.r_[True, rows[1:] != rows[:-1]])
    return rows[starts], np.add.reduceat(counts, starts, axis=0)


def geography_arrays(geo: UsGeography, columns: list[tuple[str, str]]) -> tuple[dict, dict]:
    """``(ids, parents)`` by the spec's level name (``columns``: :func:`unit_levels`), as text,
    for :func:`distfit.data.geography.nested_geography`."""
    ids = {name: geo.text_ids(us) for (name, _), us in zip(columns, geo.levels)}
    parents = {name: (None if i == 0 else ids[columns[i - 1][0]][geo.parents[us]])
               for i, ((name, _), us) in enumerate(zip(columns, geo.levels))}
    return ids, parents


def write_level_data(spec: Any, units: int, rundir: str | os.PathLike, *, seed: int, levels_dir: str = "levels",
                     data_name: str = "data.zarr", geography_name: str = "geography.csv", fsync: bool = True,
                     log: TextIO | None = None) -> LevelData:
    """Write the geography and every level's data store of the multi-level ``spec`` for
    ``units`` finest units into ``rundir`` (module docstring), from ``seed``. A store that
    exists is refused (FileExistsError, before anything is written); ValueError for a spec whose
    levels do not fit (:func:`unit_levels`, :func:`distfit.data.us_geography.us_level_counts`)."""
    units, seed = check_integer(units, "units", 1), check_integer(seed, "seed", 0)
    top, columns = unit_levels(spec)
    if not columns:
        raise ValueError(f"spec {spec.name!r}: no level has a unit column; synthesise its data with a one-level spec")
    paths = level_data_paths(spec, rundir, levels_dir, data_name)
    for path in paths.values():
        if path.exists() or path.is_symlink():
            raise FileExistsError(f"{path}: already exists; synthesise into a new --out")
    geo = us_geography(len(columns), units, seed)
    table = nested_geography(spec, *geography_arrays(geo, columns))
    Path(os.fspath(rundir)).mkdir(parents=True, exist_ok=True)
    geography = write_geography(table, Path(os.fspath(rundir)) / geography_name, fsync=fsync)
    domain = spec.domain
    cells = domain.size
    labels = [cell_labels(tuple(domain.names), value_labels(spec))]
    cliques = [list(domain.names)]
    names = [name for name, _ in columns]
    counts = {**{name: 1 for name in top}, **{name: int(geo.ids[us].size) for name, us in zip(names, geo.levels)}}
    chunking = {name: default_chunk_units(cells, n) for name, n in counts.items()}
    total = 0
    with contextlib.ExitStack() as stack:
        sinks, stagings = {}, {}
        for name in top + names:
            staging, group = stack.enter_context(staged_store(paths[name], MARGINALS_FORMAT, fsync=fsync))
            at = names.index(name) if name in names else None
            has_parent = at is not None and at > 0
            create_marginals(group, [cells], counts[name], chunking[name], True, labels=labels,
                             integer_parents=True if has_parent else None)
            ids = geo.ids[geo.levels[at]] if at is not None else np.zeros(1, dtype=np.int64)
            parent_ids = geo.ids[geo.levels[at - 1]][geo.parents[geo.levels[at]]] if has_parent else None
            sinks[name] = _LevelSink(MarginalsWriter(staging), counts[name], chunking[name], cells, ids, parent_ids)
            stagings[name] = group
        populations = np.zeros(2, dtype=np.int64)  # empty, all
        for start, block_counts in synthesize_histograms(domain, units, seed, params=BLOCK_MODEL):
            rows = np.arange(start, start + block_counts.shape[0], dtype=np.int64)
            sinks[names[-1]].add(rows, block_counts)
            sizes = block_counts.sum(axis=1)
            populations += (int((sizes == 0).sum()), sizes.size)
            total += int(sizes.sum())
            sums = block_counts
            for at in range(len(names) - 1, 0, -1):  # each level's rows from its children's
                rows, sums = _segment_sums(geo.parents[geo.levels[at]][rows], sums)
                sinks[names[at - 1]].add(rows, sums)
            for name in top:
                sinks[name].add(np.zeros(1, dtype=np.int64), sums.sum(axis=0, keepdims=True))
        for name in top + names:
            sinks[name].close()
            at = names.index(name) if name in names else None
            level_spec = spec.level_spec(name)
            source = {"format": SOURCE_FORMAT, "generator": GENERATOR, "geography_generator": "distfit.us_geography/1",
                      "seed": seed, "units": units, "model": BLOCK_MODEL.to_dict(),
                      "geography": None if at is None else geography.of(name).record()}
            write_marginals_attrs(stagings[name], domain=domain, spec_hash=level_spec.spec_hash, units=counts[name],
                                  chunk_units=chunking[name], cliques=cliques, source=source, total_people=total,
                                  parent_column=columns[at - 1][1] if at else None)
    if log is not None:
        print(f"distfit: synthesised {units:,} {names[-1]} units ({int(populations[0]):,} empty) and every level "
              f"above them into {os.fspath(rundir)}", file=log)
    return LevelData(rundir=os.fspath(rundir), geography=str(geography.path), stores={k: str(v) for k, v in paths.items()},
                     units=counts, total_people=total, empty_share=float(populations[0] / max(populations[1], 1)))
