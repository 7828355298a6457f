"""The block-diagonal plus low-rank form of H (distfit.estimate.structure): found where the
workload has it, refused where it does not, and its free-cell solves against dense ones."""
from __future__ import annotations

import types

import numpy as np

from distfit.mathematics.domain import Domain
from distfit.estimate.measurements import model_from_blocks
from distfit.estimate.projection import normal_equations
from distfit.estimate.structure import block_low_rank


def structured_blocks(rng, sizes=(2, 2, 9)):
    """PL94 in small: a detailed block acting on (a, b) alike for every c (block diagonal over
    c), the c marginal measured cell by cell, the (a, b) marginal and two sums over c (low rank)."""
    ab, c = sizes[0] * sizes[1], sizes[2]
    detail = rng.standard_normal((ab, ab)) + 3 * np.eye(ab)
    halves = np.zeros((2, c))
    halves[0, : c // 2], halves[1, c // 2:] = 1.0, 1.0
    spec = [
        (("a", "b", "c"), np.kron(detail, np.eye(c)), np.eye(ab * c)),
        (("c",), np.diag(rng.uniform(0.5, 2.0, c)), np.diag(rng.uniform(0.5, 2.0, c))),
        (("a", "b"), rng.standard_normal((ab, ab)), np.eye(ab) + 0.2),
        (("c",), halves, np.diag([2.0, 3.0])),
    ]
    blocks, start = [], 0
    for i, (attributes, basis, sigma) in enumerate(spec):
        k = basis.shape[0]
        blocks.append(types.SimpleNamespace(block_id=f"b{i}", attributes=attributes, basis=basis,
                                            recon=np.eye(k), sigma=sigma, query_index=np.arange(start, start + k)))
        start += k
    return Domain(("a", "b", "c"), sizes), blocks


def structured_hessian(seed=0):
    rng = np.random.default_rng(seed)
    domain, blocks = structured_blocks(rng)
    model = model_from_blocks(domain, blocks)
    y = {b.block_id: rng.standard_normal((1, b.rows)) for b in model.blocks}
    return model, normal_equations(model, y)[0]


def test_the_form_is_found_and_exact():
    model, hessian = structured_hessian()
    structure = block_low_rank(hessian, model.sizes)
    assert structure is not None
    assert structure.group_cells == 4 and structure.groups == 16 and structure.rank <= 6  # 9 groups, padded
    # H = D + V V^T + E in the structure's order (cell c at position place[c], i * groups + r for
    # cell i of group r; padding groups with D = I, V = 0, E = 0): D block diagonal over the
    # groups, E (float32) zero on the blocks and at rounding level off them
    s, groups, place = structure.group_cells, structure.groups, structure.place
    assert groups % 16 == 0 and np.array_equal(structure.perm[place], np.arange(model.cells))
    assert (structure.perm >= 0).sum() == model.cells
    group = np.tile(np.arange(groups), s)
    same = group[:, None] == group[None, :]
    diagonal = np.zeros((s * groups, s * groups))
    for r in range(groups):
        cells = np.arange(s) * groups + r
        diagonal[np.ix_(cells, cells)] = structure.blocks[r].reshape(s, s)
    assert structure.defect.dtype == np.float32 and not structure.defect[same].any()
    assert np.abs(structure.defect).max() <= 1e-10 * np.abs(hessian).max()
    rebuilt = diagonal + structure.factor @ structure.factor.T + structure.defect.astype(np.float64)
    assert np.abs(rebuilt[np.ix_(place, place)] - hessian).max() <= 1e-14 * np.abs(hessian).max()
    padding = np.setdiff1d(np.arange(s * groups), place)
    assert np.array_equal(rebuilt[np.ix_(padding, padding)], np.eye(padding.size))
    assert not rebuilt[np.ix_(padding, place)].any()


def test_no_form_for_a_generic_hessian():
    rng = np.random.default_rng(2)
    a = rng.standard_normal((36, 36))
    assert block_low_rank(a @ a.T + np.eye(36), (6, 2, 3)) is None
    singular = np.zeros((36, 36))
    assert block_low_rank(singular, (6, 2, 3)) is None
