"""Tests for distfit.solver.basis.represent: W = L B with B's rows independent and spanning W's rows."""
from __future__ import annotations

import numpy as np
import pytest

from distfit.mathematics import workload as wl
from distfit.solver.basis import BASIS_KINDS, Representation, represent

from tests.reference import orthonormal_row_basis, prefix_matrix


def _full_rank():
    return wl.random_range_workload(9, 14, seed=0).matrix


def _rank_deficient():
    return wl.all_two_way_marginals((2, 3, 2)).matrix


def _low_rank(seed=1):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((7, 3)) @ rng.standard_normal((3, 10))


WORKLOADS = {
    "full-rank-ranges": _full_rank,
    "prefix": lambda: prefix_matrix(6),
    "two-way-2x3x2": _rank_deficient,
    "gaussian-rank3": _low_rank,
    "wide-ranges": lambda: wl.random_range_workload(12, 5, seed=3).matrix,
    "pm1": lambda: wl.random_workload(8, 12, seed=5).matrix,
    "pm1-rank7": lambda: wl.random_workload(8, 12, seed=4).matrix,  # columns 1 and 6 coincide
}


def _same_row_space(A, B):
    """True when span(rows A) == span(rows B)."""
    stacked = np.vstack([A, B])
    rank = np.linalg.matrix_rank
    return rank(stacked) == rank(A) == rank(B)


def _custom_for(W, seed=0, extra=0):
    rows = orthonormal_row_basis(W)
    k = rows.shape[0]
    rng = np.random.default_rng(seed)
    mixed = (rng.standard_normal((k, k)) + 2 * np.eye(k)) @ rows
    if extra:
        mixed = np.vstack([mixed, rng.standard_normal((extra, k)) @ rows])
    return mixed


@pytest.mark.parametrize("kind", list(BASIS_KINDS) + ["custom"])
@pytest.mark.parametrize("name", list(WORKLOADS))
def test_represent_reconstructs_workload(name, kind):
    W = WORKLOADS[name]()
    basis = _custom_for(W) if kind == "custom" else kind
    rep = represent(W, basis)
    assert isinstance(rep, Representation)
    assert rep.kind == kind
    rank = np.linalg.matrix_rank(W)
    k = rep.basis.shape[0]
    assert rep.rank == k == rank
    assert np.linalg.matrix_rank(rep.basis) == k  # rows independent
    assert rep.recon.shape == (W.shape[0], k)
    np.testing.assert_allclose(rep.recon @ rep.basis, W, atol=1e-9 * np.abs(W).max())
    assert _same_row_space(rep.basis, W)
    if kind == "auto":
        np.testing.assert_allclose(rep.basis @ rep.basis.T, np.eye(k), atol=1e-12)
        assert not rep.reduced


@pytest.mark.parametrize("name", ["full-rank-ranges", "prefix", "pm1"])
def test_identity_and_prefix_unreduced_for_full_column_rank(name):
    W = WORKLOADS[name]()
    d = W.shape[1]
    assert np.linalg.matrix_rank(W) == d
    identity = represent(W, "identity")
    assert not identity.reduced
    np.testing.assert_array_equal(identity.basis, np.eye(d))
    np.testing.assert_allclose(identity.recon, W, atol=1e-12)
    prefix = represent(W, "prefix")
    assert not prefix.reduced
    np.testing.assert_array_equal(prefix.basis, np.triu(np.ones((d, d))))
    # W = L U  <=>  L = W U^-1 (U^-1 is the difference operator)
    np.testing.assert_allclose(prefix.recon, W @ np.linalg.inv(np.triu(np.ones((d, d)))), atol=1e-10)


def test_prefix_workload_in_prefix_basis_is_identity_recon():
    """The paper's prefix workload: W = lower-triangular ones. In the prefix basis ... W = L U."""
    d = 6
    rep = represent(prefix_matrix(d), "prefix")
    np.testing.assert_allclose(rep.recon @ np.triu(np.ones((d, d))), prefix_matrix(d), atol=1e-12)


@pytest.mark.parametrize("name", ["two-way-2x3x2", "gaussian-rank3", "wide-ranges", "pm1-rank7"])
@pytest.mark.parametrize("kind", ["identity", "prefix"])
def test_reduced_for_rank_deficient(name, kind):
    W = WORKLOADS[name]()
    rank = np.linalg.matrix_rank(W)
    assert rank < W.shape[1]
    rep = represent(W, kind)
    assert rep.reduced
    assert rep.basis.shape == (rank, W.shape[1])
    # reduced rows are projections of the standard basis onto W's row space
    rows = orthonormal_row_basis(W)
    np.testing.assert_allclose(rep.basis @ rows.T @ rows, rep.basis, atol=1e-10)
    # and well-conditioned enough for the solver
    assert np.linalg.cond(rep.basis @ rep.basis.T) < 1e8


def test_untouched_cells_in_identity_basis_have_zero_columns():
    """Full rank on the touched cells: the identity/prefix bases are unreduced, untouched columns exactly 0."""
    rng = np.random.default_rng(5)
    W = np.zeros((7, 9))
    touched = [0, 2, 3, 5, 6, 8]
    W[:, touched] = rng.standard_normal((7, 6))
    for kind in ("identity", "prefix"):
        rep = represent(W, kind)
        assert not rep.reduced and rep.rank == 6
        assert np.all(rep.basis[:, [1, 4, 7]] == 0.0)
        np.testing.assert_allclose(rep.recon @ rep.basis, W, atol=1e-10)
    np.testing.assert_array_equal(represent(W, "identity").basis, np.eye(9)[touched])
    np.testing.assert_array_equal(represent(W, "prefix").basis[:, touched], np.triu(np.ones((6, 6))))


def test_custom_basis_spanning_a_larger_space_is_reduced():
    W = _rank_deficient()
    rep = represent(W, np.eye(W.shape[1]) + 0.1)
    assert rep.kind == "custom" and rep.reduced
    assert rep.rank == np.linalg.matrix_rank(W)
    np.testing.assert_allclose(rep.recon @ rep.basis, W, atol=1e-9)
    redundant = represent(W, _custom_for(W, seed=3, extra=4))
    assert redundant.reduced and redundant.rank == np.linalg.matrix_rank(W)
    np.testing.assert_allclose(redundant.recon @ redundant.basis, W, atol=1e-9)


def test_custom_basis_used_as_given():
    W = _full_rank()
    B = np.random.default_rng(2).standard_normal((9, 9)) + 3 * np.eye(9)
    rep = represent(W, B)
    assert rep.kind == "custom" and not rep.reduced
    np.testing.assert_array_equal(rep.basis, B)
    np.testing.assert_allclose(rep.recon, W @ np.linalg.inv(B), atol=1e-10)


@pytest.mark.parametrize("basis,match", [
    ("fourier", "basis: unknown basis"),
    (np.ones(9), "basis: expected a 2-D array"),
    (np.eye(8), "basis: expected a 2-D array with 9 columns"),
    (np.full((9, 9), np.nan), "basis: contains non-finite"),
    (np.where(np.eye(9) == 1, np.inf, 0.0), "basis: contains non-finite"),
    (np.eye(9)[:8], "basis: its rows do not span"),
    (np.zeros((9, 9)), "basis: its rows do not span"),
], ids=["unknown-name", "1-d", "wrong-width", "nan", "inf", "too-few-rows", "zero"])
def test_custom_basis_validation(basis, match):
    with pytest.raises(ValueError, match=match):
        represent(_full_rank(), basis)


def test_basis_outside_row_space_rejected():
    """A k = rank basis whose span misses part of W's row space is refused."""
    W = _low_rank(7)
    rows = orthonormal_row_basis(W)
    wrong = rows.copy()
    wrong[0] = np.random.default_rng(0).standard_normal(W.shape[1])
    with pytest.raises(ValueError, match="basis"):
        represent(W, wrong)
