"""Bases for a block: ``W = L B`` with B's rows independent and spanning W's row space.

docs/design.md section 1 and the paper's section 3: the mechanism ``L (B x + z)`` can be written in
any basis whose rows are linearly independent and span the same row space as W; the privacy
profile does not depend on the choice. Marginal workloads are usually rank-deficient (rank W <
number of cells), so the identity and prefix bases, whose row space is all of R^d, must be
*reduced* to W's row space: we project their rows onto it (``B0 P`` with P the orthogonal
projector) and keep a well-conditioned independent subset of the projected rows, chosen by
QR with column pivoting. Cells that no query touches have zero columns in B: they get profile
0 and cost nothing.

``"auto"`` picks the orthonormal basis of W's row space from its SVD (condition number 1), which
is what the optimiser's conjugate-gradient steps like best; the dual certificate does not depend
on the basis at all.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg

BASIS_KINDS = ("auto", "identity", "prefix")


@dataclass(frozen=True)
class Representation:
    """A block's workload in a basis: ``matrix = recon @ basis``.

    ``basis`` is (k, d) with k = rank W; ``recon`` is (m, k); ``kind`` says how B was chosen and
    ``reduced`` whether it had to be projected onto W's row space.
    """

    basis: np.ndarray
    recon: np.ndarray
    kind: str
    reduced: bool

    @property
    def rank(self) -> int:
        return int(self.basis.shape[0])


def _row_space(matrix: np.ndarray) -> np.ndarray:
    """Orthonormal rows (r, d) spanning the row space of ``matrix`` (SVD, numerical rank).

    Columns of cells no query touches are set to exactly 0 (the SVD leaves round-off there),
    so those cells get a profile of exactly 0, as they should.
    """
    _, singular, right = np.linalg.svd(matrix, full_matrices=False)
    tolerance = max(matrix.shape) * np.finfo(float).eps * singular[0]
    rows = right[: int((singular > tolerance).sum())].copy()
    rows[:, ~np.any(matrix != 0.0, axis=0)] = 0.0
    return rows


def _independent_rows(rows: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` best-conditioned independent rows, chosen by QR with column pivoting."""
    _, _, pivots = scipy.linalg.qr(rows.T, mode="economic", pivoting=True)
    return rows[np.sort(pivots[:count])]


def _prefix_matrix(d: int) -> np.ndarray:
    """U with U[i, j] = 1 for i <= j: column j of U counts the cells 0..j (the paper's prefix basis)."""
    return np.triu(np.ones((d, d)))


def represent(matrix: np.ndarray, basis: str | np.ndarray = "auto") -> Representation:
    """Choose B (k x d) for workload ``matrix`` (m x d) and solve ``W = L B`` for L.

    ``basis``: ``"auto"`` (orthonormal row basis of W), ``"identity"``, ``"prefix"`` (upper-
    triangular ones, for ordered domains), or an explicit (k0, d) array. Identity, prefix and
    explicit bases whose row space is larger than W's are reduced to W's row space (module
    docstring). Raises ValueError (naming ``basis``) for an unknown name, a wrong shape, non-
    finite entries, or an explicit basis that does not span the rows of W.
    """
    workload = np.asarray(matrix, dtype=float)
    d = workload.shape[1]
    row_space = _row_space(workload)
    rank = row_space.shape[0]
    if isinstance(basis, str):
        if basis not in BASIS_KINDS:
            raise ValueError(f"basis: unknown basis {basis!r}; use one of {', '.join(BASIS_KINDS)} or an array")
        kind = basis
        if basis == "auto":
            return Representation(row_space.copy(), workload @ row_space.T, "auto", reduced=False)
        touched = np.flatnonzero(np.any(workload != 0.0, axis=0))
        full = np.zeros((touched.size, d))
        if basis == "identity":
            full[np.arange(touched.size), touched] = 1.0
        else:
            full[:, touched] = _prefix_matrix(touched.size)
        candidate = full
    else:
        kind = "custom"
        candidate = np.asarray(basis, dtype=float)
        if candidate.ndim != 2 or candidate.shape[1] != d:
            raise ValueError(f"basis: expected a 2-D array with {d} columns (one per cell), got shape {candidate.shape}")
        if not np.all(np.isfinite(candidate)):
            raise ValueError("basis: contains non-finite entries")
        span_residual = workload - (workload @ np.linalg.pinv(candidate)) @ candidate
        if np.linalg.norm(span_residual) > 1e-8 * max(np.linalg.norm(workload), 1.0):
            raise ValueError(
                "basis: its rows do not span the rows of W (W = L B has no solution); "
                f"residual {np.linalg.norm(span_residual):.3g}"
            )
    reduced = candidate.shape[0] != rank
    if reduced:
        projected = (candidate @ row_space.T) @ row_space
        candidate = _independent_rows(projected, rank)
    recon = np.linalg.lstsq(candidate.T, workload.T, rcond=None)[0].T
    error = np.linalg.norm(recon @ candidate - workload)
    if error > 1e-8 * max(np.linalg.norm(workload), 1.0):
        raise ValueError(f"basis: W = L B cannot be represented in this basis (residual {error:.3g})")
    return Representation(candidate, recon, kind, reduced)
