"""The audit's own sequential composition (``distfit.audit.composition``) against a Python loop
over every cell and the planner's broadcast ``distfit.plan.composition.stitched_profile``."""
from __future__ import annotations

import itertools

import numpy as np
import pytest

from distfit.audit import composition
from distfit.mathematics.domain import Domain
from distfit.plan.composition import stitched_profile



def _brute_force_maximum(sizes, blocks) -> float:
    """``max_x sum_S p_S(x_S)`` by a Python loop over every full-domain cell."""
    best = -np.inf
    for cell in itertools.product(*(range(n) for n in sizes)):
        total = 0.0
        for positions, profile in blocks:
            index = 0
            for p in positions:  # row-major over the block's attributes in schema order
                index = index * sizes[p] + cell[p]
            total += profile[index]
        best = max(best, total)
    return best


def test_the_stitched_maximum_agrees_with_a_loop_over_cells_and_the_planners_profile(monkeypatch):
    rng = np.random.default_rng(7)
    sizes = (3, 2, 4, 5)
    names = tuple(f"a{i}" for i in range(len(sizes)))
    blocks = []
    for positions in [(), (0,), (1, 3), (0, 2, 3), (1, 3), (2,)]:  # (1, 3) twice: summed first
        blocks.append((positions, rng.uniform(0.1, 2.0, int(np.prod([sizes[p] for p in positions])))))
    monkeypatch.setattr(composition, "SLAB_CELLS", 7)  # several slabs, the last one short
    mine = composition.stitched_maximum(sizes, blocks)
    assert mine == pytest.approx(_brute_force_maximum(sizes, blocks), rel=1e-14)
    domain = Domain(names, sizes)
    theirs = stitched_profile(domain, [(tuple(names[p] for p in positions), profile) for positions, profile in blocks])
    assert mine == pytest.approx(float(theirs.max()), rel=1e-14)
