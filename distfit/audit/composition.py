"""Sequential composition of a plan's blocks, recomputed by the audit's own code (docs/privacy.md,
"Many blocks: sequential composition").

Every person is seen by every block through the block's marginal cell of the person's full
cell, so the stitched privacy profile is ``p(x) = sum_S p_S(x_S)`` and ``alpha = max_x p(x)``,
evaluated cell by cell on a domain of at most :data:`EXACT_DOMAIN_LIMIT` cells; above it alpha
is the sum bound ``sum_S alpha_S`` (exact when every block profile is flat). The planner
broadcasts each block profile over the domain's shape; here every full-domain cell's marginal
cell is computed by mixed-radix arithmetic (``numpy.ravel_multi_index`` of the cell's
coordinates on the block's attributes) and the profiles are gathered there, a slab of cells at a
time, the blocks of one attribute set summed first.
"""
from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

#: Domains of at most this many cells have their alpha evaluated cell by cell (docs/privacy.md).
EXACT_DOMAIN_LIMIT = 5_000_000
SLAB_CELLS = 1 << 18  # full-domain cells gathered at a time (memory: a few int64 arrays of this length)


def stitched_maximum(sizes: Sequence[int], blocks: Iterable[tuple[Sequence[int], np.ndarray]]) -> float:
    """``max_x sum_S p_S(x_S)`` over the full domain of attribute ``sizes``. ``blocks`` holds
    ``(positions, profile)``: the block's attributes as ascending schema positions and its
    profile over the cells of their marginal, row-major in schema order."""
    sizes = tuple(int(n) for n in sizes)
    summed: dict[tuple[int, ...], np.ndarray] = {}
    for positions, profile in blocks:
        key = tuple(int(p) for p in positions)
        cells = int(np.prod([sizes[p] for p in key], dtype=np.int64))
        profile = np.asarray(profile, dtype=float).reshape(cells)
        summed[key] = summed[key] + profile if key in summed else profile.copy()
    total_cells = int(np.prod(sizes, dtype=np.int64))
    best = -np.inf
    for start in range(0, total_cells, SLAB_CELLS):
        coordinates = np.unravel_index(np.arange(start, min(start + SLAB_CELLS, total_cells)), sizes)
        total = np.zeros(coordinates[0].size)
        for key, profile in summed.items():
            if key:
                total += profile[np.ravel_multi_index([coordinates[p] for p in key], [sizes[p] for p in key])]
            else:
                total += profile[0]
        best = max(best, float(total.max()))
    return best


def is_flat(profile: np.ndarray, tolerance: float) -> bool:
    """A profile constant over its cells to the relative ``tolerance``: then its block adds the
    same to every cell of the stitched profile, and the sum bound is exact."""
    return bool(np.ptp(profile) <= tolerance * np.max(profile)) if profile.size else True
