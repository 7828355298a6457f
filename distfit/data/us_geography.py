"""A US-shaped synthetic geography of any size: states, counties, tracts, block groups, blocks.

Pure numpy, seeded, deterministic: :func:`us_geography` gives every unit of every level with
its parent (rows, ids) for ``units`` finest units (blocks); :mod:`distfit.data.level_synth`
draws the blocks' people on it and writes each level's data. Documented in docs/geography.md
("A US-shaped synthetic geography").

Levels and sizes
----------------
:data:`US_LEVELS` below the nation, with the unit counts of the 2020 Census for the 50 states and
the District of Columbia, rounded (:data:`FULL_COUNTS`): 51 states, 3,143 counties, 84,400
tracts, 239,800 block groups, 8,132,968 blocks. A spec with ``k`` unit levels gets the first
``k`` of them (``pipelines/census.yaml``: state, county; ``pipelines/us_pl94.yaml``: all five),
and its finest level has exactly ``units`` units.

Size rule (at any ``units``): the finest level has ``units`` units; every other level below the
states has ``round(FULL_COUNTS[level] * units / FULL_COUNTS[finest])`` units, but at least one
per unit of the level above (and at most the level below's count); states are always 51. So
the lower levels shrink in proportion (at 1M blocks: 386 counties, 10,378 tracts, 29,485 block
groups), their mean fanouts stay the 2020 ones (about 27 tracts per county, 2.8 block groups per
tract, 34 blocks per block group) and below ~130,000 blocks the counties are floored to one
per state. ``units`` >= 51.

Fanouts (heavy-tailed, :func:`spread`): counties go to states in proportion to each state's
2020 county count (:data:`STATE_COUNTIES`: Texas 254, ..., DC 1), exactly those counts at full
size; the units of every lower level go to their parents in proportion to lognormal weights
(log-sd :data:`FANOUT_SIGMA`: tracts per county 1.2, as from 1 to thousands; block groups per
tract 0.45; blocks per block group 0.8), each parent getting at least one: the largest-remainder
rounding of ``n * w / sum(w)`` with a floor of one (:func:`spread`).

Ids (int64, GEOID-like, nested so that each level's ids sorted are its units in tree order):
state = its FIPS code (1 .. 56), county = state * 1000 + k, tract = county * 10**6 + k, block
group = tract * 100 + k, block = block group * 10**4 + k, ``k`` the unit's 1-based position in
its parent. Written as text zero-padded to the level's width (:data:`ID_WIDTHS`), so text order
is tree order too. A fanout that would not fit its field is a ValueError.

Determinism: the weights of level ``i`` come from ``SeedSequence(seed, spawn_key=(2, i))``; the
geography is a function of ``(units, seed, levels)`` alone.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from distfit.checks import check_integer

__all__ = ["FULL_COUNTS", "US_LEVELS", "UsGeography", "us_geography", "us_level_counts", "spread"]

#: The levels below the nation, coarsest first.
US_LEVELS = ("state", "county", "tract", "block_group", "block")
#: Units of each level in the 2020 Census, 50 states and DC (rounded).
FULL_COUNTS = {"state": 51, "county": 3143, "tract": 84_400, "block_group": 239_800, "block": 8_132_968}
#: Log-sd of the lognormal weights that share a level's units among their parents.
FANOUT_SIGMA = {"tract": 1.2, "block_group": 0.45, "block": 0.8}
#: Each level's id is its parent's times this, plus the unit's position in the parent.
ID_FIELD = {"county": 1000, "tract": 10**6, "block_group": 100, "block": 10**4}
#: Digits of each level's ids as text (zero-padded).
ID_WIDTHS = {"state": 2, "county": 5, "tract": 11, "block_group": 13, "block": 17}
#: FIPS code and 2020 county count (county equivalents) of the 50 states and DC.
STATE_COUNTIES = (
    (1, 67), (2, 30), (4, 15), (5, 75), (6, 58), (8, 64), (9, 8), (10, 3), (11, 1), (12, 67), (13, 159),
    (15, 5), (16, 44), (17, 102), (18, 92), (19, 99), (20, 105), (21, 120), (22, 64), (23, 16), (24, 24),
    (25, 14), (26, 83), (27, 87), (28, 82), (29, 115), (30, 56), (31, 93), (32, 17), (33, 10), (34, 21),
    (35, 33), (36, 62), (37, 100), (38, 53), (39, 88), (40, 77), (41, 36), (42, 67), (44, 5), (45, 46),
    (46, 66), (47, 95), (48, 254), (49, 29), (50, 14), (51, 133), (53, 39), (54, 55), (55, 72), (56, 23),
)


@dataclass(frozen=True, eq=False)
class UsGeography:
    """Every unit of every level (``levels``, coarsest first): ``ids[level]`` (int64, ascending)
    and ``parents[level]`` (each unit's row in the level above; None for the states)."""

    levels: tuple[str, ...]
    ids: dict[str, np.ndarray]
    parents: dict[str, np.ndarray | None]

    def counts(self) -> dict[str, int]:
        return {level: int(self.ids[level].size) for level in self.levels}

    def text_ids(self, level: str) -> np.ndarray:
        """The ids of ``level`` as zero-padded text (str), in the same (tree and text) order."""
        return np.char.zfill(self.ids[level].astype(str), ID_WIDTHS[level])


def us_level_counts(levels: int, units: int) -> dict[str, int]:
    """How many units each of the first ``levels`` US levels has when the finest has ``units``
    (module docstring: the size rule)."""
    levels = check_integer(levels, "levels", 1)
    if levels > len(US_LEVELS):
        raise ValueError(f"a US-shaped geography has at most {len(US_LEVELS)} levels below the nation "
                         f"({', '.join(US_LEVELS)}); the spec has {levels}")
    units = check_integer(units, "units", 1)
    names = US_LEVELS[:levels]
    if units < FULL_COUNTS["state"]:
        raise ValueError(f"units: a US-shaped geography has 51 states, so at least 51 finest units; got {units}")
    counts, above = {}, None
    for name in names:
        if name == names[-1]:
            n = units
        elif name == "state":
            n = FULL_COUNTS["state"]
        else:
            n = min(max(above, round(FULL_COUNTS[name] * units / FULL_COUNTS[names[-1]])), units)
        counts[name] = n
        above = n
    return counts


def spread(n: int, weights: np.ndarray) -> np.ndarray:
    """``n`` children shared among ``weights.size`` parents in proportion to ``weights``, at least
    one each: the largest-remainder rounding of ``n * w / sum(w)`` floored at one, then trimmed
    from the largest counts (ties by position) until the counts sum to ``n`` (``n >= parents``)."""
    quota = n * weights / weights.sum()
    counts = np.maximum(np.floor(quota).astype(np.int64), 1)
    short = n - int(counts.sum())
    if short > 0:
        counts[np.argsort(-(quota - np.floor(quota)), kind="stable")[:short]] += 1
    while short < 0:  # the floor of one took more than the quotas gave: the largest give it back
        order = np.argsort(-counts, kind="stable")[:min(-short, counts.size)]
        order = order[counts[order] > 1]
        counts[order] -= 1
        short += order.size
    return counts


def us_geography(levels: int, units: int, seed: int) -> UsGeography:
    """The US-shaped geography of the first ``levels`` US levels with ``units`` finest units,
    from ``seed`` (module docstring)."""
    seed = check_integer(seed, "seed", 0)
    counts = us_level_counts(levels, units)
    names = tuple(counts)
    fips = np.array([code for code, _ in STATE_COUNTIES], dtype=np.int64)
    ids: dict[str, np.ndarray] = {"state": fips}
    parents: dict[str, np.ndarray | None] = {"state": None}
    for i, name in enumerate(names[1:], start=1):
        above = names[i - 1]
        if name == "county":
            weights = np.array([c for _, c in STATE_COUNTIES], dtype=float)
        else:
            rng = np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(2, i)))
            weights = rng.lognormal(0.0, FANOUT_SIGMA[name], ids[above].size)
        fanout = spread(counts[name], weights)
        if int(fanout.max()) >= ID_FIELD[name]:
            raise ValueError(f"units: {units} gives a {above} of {int(fanout.max())} {name}s, more than the ids "
                             f"hold ({ID_FIELD[name] - 1})")
        rows = np.repeat(np.arange(fanout.size, dtype=np.int64), fanout)
        first = np.cumsum(fanout) - fanout
        position = np.arange(rows.size, dtype=np.int64) - first[rows] + 1
        ids[name] = ids[above][rows] * ID_FIELD[name] + position
        parents[name] = rows
    return UsGeography(names, {n: ids[n] for n in names}, {n: parents[n] for n in names})
