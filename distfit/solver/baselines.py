"""Baseline mechanisms that SM-II is compared against, run at the same privacy cost.

Every baseline here is a *strategy mechanism* (the matrix mechanism of Li et al., 2010/2015):
for a strategy matrix ``A`` (p x d) it releases ``y = A x + z`` with ``z ~ N(0, s^2 I_p)`` and
answers the workload by least squares, ``W A^+ y``. Neighbouring count vectors differ by one
person (``x' = x +- e_i``), so the output moves by column ``a_i`` of ``A`` and

- privacy cost (docs/design.md section 1, ``alpha = Delta^2``): ``alpha = max_i ||a_i||^2 / s^2``;
  at a prescribed ``alpha`` the noise scale is therefore ``s^2 = max_i ||a_i||^2 / alpha``;
- query variances: ``var_j = s^2 * (W (A^T A)^+ W^T)_jj``, valid when the row space of ``W`` lies
  inside the row space of ``A`` (otherwise ``W x`` is not estimable and a ``ValueError`` is raised).

This is exactly the correlated Gaussian mechanism of docs/design.md section 1 with basis ``B = A``,
``L = W A^+`` and ``Sigma = s^2 I``, so ``alpha`` is the same privacy cost that SM-II minimises
(zCDP ``rho = alpha / 2``; the exact (eps, delta) curve is a function of ``alpha`` alone).

The experiments of the SM-II paper (section 7, tables 4-9) fix ``alpha`` to SM-II's optimum and
report, for each baseline, ``max_j var_j / c_j``; SM-II itself scores exactly 1.0 and, because
SM-II's ``alpha`` is the minimum over *all* linear Gaussian mechanisms, every baseline scores
``>= 1`` at that ``alpha``. The baselines are:

- ``gaussian_mechanism`` ("GM"): ``A = W``, every query answered with iid noise;
- ``hierarchical_mechanism`` ("HM", Hay et al. 2010; Qardaji et al. 2013): a b-ary tree of
  range counts over the ordered, flattened domain;
- ``optimal_matrix_mechanism`` ("CA", Yuan et al. 2016): the strategy minimising the *total*
  squared error under an L2 (Gaussian, (eps, delta)) sensitivity constraint, solved through its
  nuclear-norm dual (Li and Miklau 2012/2013).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

import numpy as np
import scipy.linalg
import scipy.optimize
import scipy.special

from distfit.mathematics.workload import validate_workload

__all__ = [
    "BaselineResult",
    "strategy_mechanism",
    "gaussian_mechanism",
    "hierarchical_matrix",
    "hierarchical_mechanism",
    "optimal_matrix_mechanism",
    "compare_baselines",
]

# Strategies whose triangular factor has reciprocal condition number above this are treated as
# full column rank (fast, exact triangular route); below it we switch to a truncated SVD.
_RCOND_FULL_RANK = 1e-10
# Warn when the recovered matrix-mechanism strategy is this far above its dual bound.
_GAP_WARN = 1e-3
# Relative tolerance for "the rows of W lie in the row space of A".
_ROWSPACE_RTOL = 1e-7


@dataclass(frozen=True, eq=False)
class BaselineResult:
    """Outcome of one baseline mechanism at a fixed privacy cost.

    Attributes
    ----------
    name:
        Mechanism name (``"gaussian"``, ``"hierarchical"``, ``"matrix_mechanism"`` or custom).
    alpha:
        Privacy cost ``alpha = Delta^2 = max_i ||a_i||^2 / s^2`` the mechanism was run at.
    variances:
        ``(m,)`` read-only array, variance of each workload query's answer.
    max_ratio:
        ``max_j variances_j / targets_j`` (SM-II scores exactly 1.0 at its own ``alpha``).
    strategy_shape:
        Shape ``(p, d)`` of the strategy matrix that was measured.
    info:
        Read-only extras (e.g. the chosen branching factor, the matrix mechanism's dual bound
        and duality gap); empty when there is nothing to add.
    """

    name: str
    alpha: float
    variances: np.ndarray
    max_ratio: float
    strategy_shape: tuple[int, int]
    info: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))

    @property
    def total_variance(self) -> float:
        """Sum of the query variances (the objective the matrix mechanism minimises)."""
        return float(self.variances.sum())


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------
def _check_alpha(alpha: float) -> float:
    try:
        a = float(alpha)
    except (TypeError, ValueError):
        raise ValueError(f"alpha must be a positive finite number, got {alpha!r}") from None
    if not np.isfinite(a) or a <= 0:
        raise ValueError(f"alpha must be a positive finite number, got {alpha!r}")
    return a


def _check_inputs(W, targets, alpha) -> tuple[np.ndarray, np.ndarray, float]:
    W, c = validate_workload(W, targets)
    return W, c, _check_alpha(alpha)


def _readonly(x: np.ndarray) -> np.ndarray:
    x = np.array(x, dtype=float, copy=True)
    x.setflags(write=False)
    return x


# --------------------------------------------------------------------------------------------
# the generic strategy mechanism
# --------------------------------------------------------------------------------------------
def _unit_variances(W: np.ndarray, A: np.ndarray) -> np.ndarray:
    """``diag(W (A^T A)^+ W^T)`` computed without forming ``A^T A``.

    Route: ``A = Q R`` (economic QR, when ``p >= d``); if ``R`` is well conditioned (LAPACK
    ``trcon`` estimate), ``diag(W R^-1 R^-T W^T) = ||R^-T w_j||^2`` by one triangular solve.
    Otherwise (rank-deficient or wide ``A``) use the SVD ``A = U S V^T`` truncated at numerical
    rank r: ``diag = ||S_r^-1 V_r^T w_j||^2``, after checking ``w_j = V_r V_r^T w_j``.
    """
    p, d = A.shape
    M = A
    if p >= d:
        R = scipy.linalg.qr(A, mode="r", check_finite=False)[0][:d]
        rcond, info = scipy.linalg.lapack.dtrcon(R, norm="1", uplo="U", diag="N")
        if info == 0 and rcond > _RCOND_FULL_RANK:
            Y = scipy.linalg.solve_triangular(R, W.T, trans="T", lower=False, check_finite=False)
            return np.einsum("ij,ij->j", Y, Y)
        M = R  # same right singular vectors and singular values as A
    _, s, vt = np.linalg.svd(M, full_matrices=False)
    tol = s[0] * max(A.shape) * np.finfo(float).eps if s.size else 0.0
    r = int(np.count_nonzero(s > tol))
    vr = vt[:r]
    coef = W @ vr.T  # (m, r)
    resid = np.linalg.norm(W - coef @ vr, axis=1)
    scale = np.linalg.norm(W, axis=1)
    if np.any(resid > _ROWSPACE_RTOL * scale + 1e-12 * scale.max()):
        bad = int(np.argmax(resid - _ROWSPACE_RTOL * scale))
        raise ValueError("strategy does not support W: the row space of W is not contained in "
                         f"the row space of the strategy (query {bad} is not estimable)")
    z = coef / s[:r]
    return np.einsum("ij,ij->i", z, z)


def _strategy_mechanism(W: np.ndarray, c: np.ndarray, alpha: float, A: np.ndarray, name: str,
                        info: Mapping[str, float] | None = None) -> BaselineResult:
    col_sq = np.einsum("ij,ij->j", A, A)
    max_col = float(col_sq.max())
    if not max_col > 0:
        raise ValueError("strategy must have at least one non-zero column")
    noise = max_col / alpha  # s^2
    variances = noise * _unit_variances(W, A)
    return BaselineResult(
        name=name,
        alpha=alpha,
        variances=_readonly(variances),
        max_ratio=float(np.max(variances / c)),
        strategy_shape=(int(A.shape[0]), int(A.shape[1])),
        info=MappingProxyType(dict(info or {})),
    )


def strategy_mechanism(W: np.ndarray, targets: np.ndarray, alpha: float, strategy: np.ndarray,
                       name: str = "strategy") -> BaselineResult:
    """Run the strategy mechanism ``W A^+ (A x + z)``, ``z ~ N(0, s^2 I)``, at privacy cost alpha.

    Formulas (matrix mechanism, Li et al. 2010/2015, with Gaussian noise):
    ``s^2 = max_i ||A[:, i]||^2 / alpha`` and ``var_j = s^2 (W (A^T A)^+ W^T)_jj``.
    The pseudo-inverse is evaluated through a QR / truncated-SVD route (never ``inv(A^T A)``),
    which is sound for rank-deficient ``W`` and ``A``.

    Parameters
    ----------
    W: (m, d) workload. targets: (m,) variance targets ``c_j > 0``. alpha: privacy cost ``> 0``.
    strategy: (p, d) strategy matrix ``A`` whose row space must contain that of ``W``.
    name: label stored in the result.

    Raises
    ------
    ValueError: bad ``W``, ``targets``, ``alpha`` or ``strategy`` (the message names it),
    including a strategy that cannot estimate ``W``.
    """
    W, c, alpha = _check_inputs(W, targets, alpha)
    A = np.asarray(strategy, dtype=float)
    if A.ndim != 2 or A.shape[0] == 0 or A.shape[1] != W.shape[1]:
        raise ValueError(f"strategy must be a 2-D matrix with {W.shape[1]} columns (as W), "
                         f"got shape {A.shape}")
    if not np.all(np.isfinite(A)):
        raise ValueError("strategy must contain only finite values")
    return _strategy_mechanism(W, c, alpha, A, str(name))


# --------------------------------------------------------------------------------------------
# Gaussian mechanism
# --------------------------------------------------------------------------------------------
def gaussian_mechanism(W: np.ndarray, targets: np.ndarray, alpha: float, *,
                       least_squares: bool = True) -> BaselineResult:
    """Gaussian mechanism ("GM"): strategy ``A = W``, iid ``N(0, s^2)`` noise on every query.

    ``s^2 = max_i ||W[:, i]||^2 / alpha`` (the L2 sensitivity of ``W`` squared over alpha).
    With ``least_squares=True`` (default) the noisy answers are post-processed by least squares,
    ``W W^+ (W x + z)``, giving ``var_j = s^2 (W W^+)_jj <= s^2`` (free post-processing, so fair
    to the baseline; it changes nothing when ``W`` has full row rank). With
    ``least_squares=False`` every query keeps ``var_j = s^2``, the plain mechanism of the
    SM-II paper's tables (section 7).
    """
    W, c, alpha = _check_inputs(W, targets, alpha)
    if least_squares:
        return _strategy_mechanism(W, c, alpha, W, "gaussian")
    noise = float(np.einsum("ij,ij->j", W, W).max()) / alpha
    variances = np.full(W.shape[0], noise)
    return BaselineResult("gaussian", alpha, _readonly(variances), float(np.max(variances / c)),
                          (int(W.shape[0]), int(W.shape[1])))


# --------------------------------------------------------------------------------------------
# hierarchical mechanism
# --------------------------------------------------------------------------------------------
def hierarchical_matrix(d: int, branching: int) -> np.ndarray:
    """Strategy matrix of the b-ary hierarchical mechanism over an ordered domain of d cells.

    Levels ``l = h, ..., 1, 0`` (root first, leaves last) with ``h = ceil(log_b d)``; level l has
    ``ceil(d / b^l)`` nodes and node k counts cells ``[k b^l, min((k+1) b^l, d))``, i.e.
    ``H_l[floor(i / b^l), i] = 1``. Every cell lies in exactly one node per level, so every
    column has squared norm ``h + 1``. For d = 4, b = 2 the rows are
    ``[1111], [1100], [0011], [1000], [0100], [0010], [0001]``.
    (Hay et al., VLDB 2010; Qardaji, Yang and Li, VLDB 2013.)
    """
    d = int(d)
    b = int(branching)
    if d < 1:
        raise ValueError(f"d must be a positive integer, got {d}")
    if b < 2:
        raise ValueError(f"branching must be an integer >= 2, got {branching!r}")
    widths = [1]
    while widths[-1] < d:
        widths.append(widths[-1] * b)
    widths.reverse()  # root level first
    counts = [-(-d // w) for w in widths]
    H = np.zeros((sum(counts), d))
    cells = np.arange(d)
    offset = 0
    for w, n in zip(widths, counts):
        H[offset + cells // w, cells] = 1.0
        offset += n
    return H


def hierarchical_mechanism(W: np.ndarray, targets: np.ndarray, alpha: float,
                           branching: int | None = None) -> BaselineResult:
    """Hierarchical mechanism ("HM"): the tree strategy of :func:`hierarchical_matrix`.

    The d cells are taken in their flattened order (the workload's column order). Every column
    of the tree has squared norm ``h + 1`` so ``s^2 = (h + 1) / alpha`` and
    ``var_j = s^2 (W (H^T H)^-1 W^T)_jj`` (least squares = the constrained inference of Hay et al.).

    ``branching=None`` tries every b in ``2..min(16, d)`` and keeps the one with the smallest
    max ratio (ties: smallest b). The SM-II paper takes b from the formula of Qardaji et al.
    (2013), which targets the average error of random range queries; choosing the best b on
    the actual workload and targets can only lower HM's score, so it is a strictly fair-to-the-
    baseline substitute. The chosen b is reported in ``info["branching"]``.
    """
    W, c, alpha = _check_inputs(W, targets, alpha)
    d = W.shape[1]
    if branching is not None:
        if isinstance(branching, bool) or int(branching) != branching or branching < 2:
            raise ValueError(f"branching must be an integer >= 2, got {branching!r}")
        b = int(branching)
        return _strategy_mechanism(W, c, alpha, hierarchical_matrix(d, b), "hierarchical",
                                   {"branching": float(b)})
    best: BaselineResult | None = None
    for b in range(2, max(2, min(16, d)) + 1):
        res = _strategy_mechanism(W, c, alpha, hierarchical_matrix(d, b), "hierarchical",
                                  {"branching": float(b)})
        if best is None or res.max_ratio < best.max_ratio:
            best = res
    assert best is not None
    return best


# --------------------------------------------------------------------------------------------
# optimal (total-error) matrix mechanism
# --------------------------------------------------------------------------------------------
def _nuclear_log_and_grad(theta: np.ndarray, Wc: np.ndarray) -> tuple[float, np.ndarray]:
    """``-log ||Wc diag(sqrt(u))||_*`` and its gradient in theta, ``u = softmax(theta)``.

    With ``M = Wc D^{1/2} = U S V^T`` and ``N = tr S``: ``u_i dN/du_i = (1/2) (V S V^T)_ii`` and
    ``d log N / d theta_i = (V S V^T)_ii / (2 N) - u_i / 2`` (the softmax Jacobian; finite even
    as ``u_i -> 0``). U and S come from ``eigh(M M^T)`` (r x r, about 2x cheaper than an SVD of
    M); ``(V S V^T)_ii = sum_k (U^T M)_ki^2 / s_k``. Components with ``s_k^2`` at rounding level
    are dropped (they change N by at most ``sqrt(eps) s_max`` each).
    """
    u = scipy.special.softmax(theta)
    M = Wc * np.sqrt(u)
    lam, U = np.linalg.eigh(M @ M.T)
    keep = lam > lam[-1] * max(M.shape) * np.finfo(float).eps
    s = np.sqrt(lam[keep])
    P = U[:, keep].T @ M
    N = s.sum()
    h = np.einsum("k,ki,ki->i", 1.0 / s, P, P)
    return -np.log(N), -(0.5 * h / N - 0.5 * u)


def _nuclear(Wc: np.ndarray, u: np.ndarray) -> float:
    return float(np.linalg.svd(Wc * np.sqrt(u), compute_uv=False).sum())


def _maximise_dual(Wc: np.ndarray, *, maxiter: int = 3000) -> np.ndarray:
    """Maximise ``||Wc diag(sqrt(u))||_*`` over the simplex (L-BFGS on softmax parameters)."""
    d = Wc.shape[1]
    # start: weights proportional to the column norms (the optimum for orthogonal columns)
    u0 = np.linalg.norm(Wc, axis=0)
    u0 = u0 / u0.sum()
    theta0 = np.log(u0)
    res = scipy.optimize.minimize(
        _nuclear_log_and_grad, theta0, args=(Wc,), jac=True, method="L-BFGS-B",
        options={"maxiter": maxiter, "maxcor": 30, "ftol": 1e-15, "gtol": 1e-11},
    )
    u = scipy.special.softmax(res.x)
    return u if np.isfinite(u).all() else np.full(d, 1.0 / d)


def optimal_matrix_mechanism(W: np.ndarray, targets: np.ndarray, alpha: float, *,
                             smoothing: float = 1e-9) -> BaselineResult:
    """Total-error-optimal matrix mechanism ("CA", Yuan et al. 2016) under L2 sensitivity.

    Primal (targets play no role: this mechanism ignores them, which is the point of the
    comparison)::

        minimise tr(W X^+ W^T)  over  X = A^T A  PSD, range(X) = row space of W, diag(X) <= 1

    (unit max column norm, so at privacy cost alpha ``s^2 = 1 / alpha`` and the total variance
    is ``tr(W X^+ W^T) / alpha``). Its dual (Li and Miklau's SVD bound, tight for L2)::

        max_{u in simplex} ||W diag(sqrt(u))||_*^2

    is maximised with L-BFGS over softmax parameters of u (gradient of the nuclear norm of M is
    ``U V^T`` from its SVD; see ``_nuclear_log_and_grad``). A primal is recovered from u:
    with ``D = diag(u)`` (smoothed by ``smoothing`` so no weight vanishes) and ``G = W^T W``,
    ``X = D^-1/2 (D^1/2 G D^1/2)^1/2 D^-1/2``, i.e. the strategy ``A = S^1/2 V^T D^-1/2`` from the
    SVD ``W_c D^1/2 = U S V^T`` of the row-compressed workload. At the dual optimum
    ``diag(X) = ||.||_*`` is constant and ``tr(W X^+ W^T) = ||.||_*^2 / max diag X`` equals the
    bound. The reported variances are those of this recovered (real) mechanism; ``info`` holds
    ``total_variance_lower_bound`` (= dual value / alpha, a proof that no strategy mechanism at
    this alpha has smaller total variance) and ``duality_gap`` (achieved / bound - 1).

    Cells whose column of W is zero are left out (their weight and strategy column are 0).
    """
    W, c, alpha = _check_inputs(W, targets, alpha)
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"smoothing must lie in [0, 1), got {smoothing!r}")
    d = W.shape[1]
    active = np.flatnonzero(np.any(W != 0, axis=0))
    Wa = W[:, active]
    # compress rows: ||W D^1/2||_* = ||Wc D^1/2||_* with Wc = S_W V_W^T (rank x d_active)
    _, sw, vwt = np.linalg.svd(Wa, full_matrices=False)
    rank = int(np.count_nonzero(sw > sw[0] * max(Wa.shape) * np.finfo(float).eps))
    Wc = sw[:rank, None] * vwt[:rank]
    u = _maximise_dual(Wc)
    bound = _nuclear(Wc, u) ** 2
    u_s = (1.0 - smoothing) * u + smoothing / u.size
    sq = np.sqrt(u_s)
    _, s, vt = np.linalg.svd(Wc * sq, full_matrices=False)
    r = int(np.count_nonzero(s > s[0] * max(Wc.shape) * np.finfo(float).eps))
    A_active = (np.sqrt(s[:r])[:, None] * vt[:r]) / sq
    A_active /= np.sqrt(np.einsum("ij,ij->j", A_active, A_active).max())  # max diag X = 1
    A = np.zeros((r, d))
    A[:, active] = A_active
    res = _strategy_mechanism(W, c, alpha, A, "matrix_mechanism")
    lower = bound / alpha
    gap = res.total_variance / lower - 1.0
    if gap > _GAP_WARN:
        warnings.warn(f"matrix mechanism: duality gap {gap:.2e} after L-BFGS; the reported "
                      "variances are those of a valid but sub-optimal strategy",
                      RuntimeWarning, stacklevel=2)
    info = {"total_variance_lower_bound": lower, "duality_gap": gap}
    return BaselineResult(res.name, res.alpha, res.variances, res.max_ratio, res.strategy_shape,
                          MappingProxyType(info))


# --------------------------------------------------------------------------------------------
def compare_baselines(W: np.ndarray, targets: np.ndarray,
                      alpha: float) -> dict[str, BaselineResult]:
    """Run every baseline at privacy cost ``alpha`` (SM-II's optimum, as in the paper's section 7).

    Returns ``{"gaussian": ..., "hierarchical": ..., "matrix_mechanism": ...}``; compare their
    ``max_ratio`` with SM-II's 1.0.
    """
    W, c, alpha = _check_inputs(W, targets, alpha)
    return {
        "gaussian": gaussian_mechanism(W, c, alpha),
        "hierarchical": hierarchical_mechanism(W, c, alpha),
        "matrix_mechanism": optimal_matrix_mechanism(W, c, alpha),
    }
