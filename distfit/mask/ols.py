"""Least squares from a masked release, corrected for its noise (errors in variables).

A masked release ``Y = A [Z + C, 1]`` (:mod:`distfit.mask.haar`: ``Z`` the scaled columns, ``C``
iid ``N(0, sigma^2)``, ``A`` orthogonal) keeps the Gram matrix: ``G = Y^T Y = W^T W`` with
``W = [Z + C, 1]``, and ``E[G] = [Z, 1]^T [Z, 1] + n sigma^2 D``, ``D = diag(1, ..., 1, 0)`` (no
noise on the constant column). So the method-of-moments estimator of the regression of column
``y`` on the columns ``x`` with an intercept, in the scaled units, is

    b = M^-1 m,    M = G_xx - n sigma^2 D_xx,    m = G_xy

(indices ``x`` = the constant and the chosen columns; ``y`` is not among them, so ``G_xy`` needs
no correction: the noises of different columns are independent). Its covariance (Fuller 1987,
"Measurement Error Models", section 2.2, Theorem 2.2.1, for normal errors of known covariance
``S = sigma^2 D_xx`` on the regressors and ``sigma^2`` on ``y``):

    V = M^-1 [s_vv M + n (s_vv S + S b b^T S)] M^-1,
    s_vv = (G_yy - 2 b^T G_xy + b^T G_xx b) / (n - k),

``s_vv`` the variance of ``v = y_obs - W b`` (the model's error plus the noise of ``y`` and of the
regressors through ``b``), ``k`` the number of coefficients. The coefficients and ``V`` are then
mapped back to the data's units (column ``j`` = ``centre_j + scale_j z_j``): ``beta_j = s_y b_j /
s_j`` and ``beta_0 = m_y + s_y (b_0 - sum_j b_j m_j / s_j)``, a linear map ``T`` (``cov = T V
T^T``). Values the scaling clipped (:mod:`distfit.mask.scaling`) enter clipped: the estimator
is unbiased for the regression of the clipped data. The naive OLS on ``Y`` (no correction) is
biased towards zero (attenuation); ``corrected=False`` gives it, for comparison.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Regression", "corrected_ols"]


@dataclass(frozen=True)
class Regression:
    """The regression of ``y`` on ``x`` with an intercept: ``names`` (``"(intercept)"`` then
    ``x``), ``coefficients`` and ``standard_errors`` in the data's units, ``covariance``, ``n``
    rows, ``sigma`` (the release's noise) and ``error_variance`` (the model's error variance
    in ``y``'s units, the noise removed)."""

    y: str
    names: tuple[str, ...]
    coefficients: np.ndarray
    standard_errors: np.ndarray
    covariance: np.ndarray
    n: int
    sigma: float
    error_variance: float

    def as_dict(self) -> dict[str, tuple[float, float]]:
        """``{name: (coefficient, standard error)}``."""
        return {n: (float(c), float(s)) for n, c, s in zip(self.names, self.coefficients, self.standard_errors)}


def corrected_ols(gram: np.ndarray, n: int, sigma: float, columns: Sequence[str], centre: np.ndarray,
                  scale: np.ndarray, y: str, x: Sequence[str], *, constant: str,
                  corrected: bool = True) -> Regression:
    """The regression of column ``y`` on columns ``x`` (module docstring) from the release's
    Gram matrix ``gram`` ((p + 1) x (p + 1), over ``columns``, the constant one named
    ``constant``), ``n`` rows, noise ``sigma`` and the columns' ``centre`` and ``scale``.
    ValueError naming an unknown column, ``y`` among ``x``, a repeated ``x``, or too few rows."""
    columns = list(columns)
    for role, name in [("y", y), *(("x", c) for c in x)]:
        if name not in columns or name == constant:
            raise ValueError(f"regression: {role}: no data column {name!r} "
                             f"(columns: {', '.join(c for c in columns if c != constant)})")
    if y in x:
        raise ValueError(f"regression: {y!r} is both the response (y) and a regressor (x)")
    if len(set(x)) != len(x):
        repeated = next(c for c in x if x.count(c) > 1)
        raise ValueError(f"regression: x: the regressor {repeated!r} is named twice")
    k = len(x) + 1
    if n <= k:
        raise ValueError(f"regression: {n} rows for {k} coefficients")
    gram = np.asarray(gram, dtype=np.float64)
    idx = [columns.index(constant)] + [columns.index(c) for c in x]
    iy = columns.index(y)
    noisy = np.array([0.0] + [1.0] * len(x))  # D_xx: the constant column carries no noise
    s_uu = sigma ** 2 * np.diag(noisy) if corrected else np.zeros((k, k))
    g_xx, g_xy, g_yy = gram[np.ix_(idx, idx)], gram[idx, iy], gram[iy, iy]
    m = g_xx - n * s_uu
    b = np.linalg.solve(m, g_xy)
    s_vv = (g_yy - 2.0 * b @ g_xy + b @ g_xx @ b) / (n - k)
    m_inv = np.linalg.inv(m)
    middle = s_vv * m + n * (s_vv * s_uu + s_uu @ np.outer(b, b) @ s_uu)
    v = m_inv @ middle @ m_inv
    centre, scale = np.asarray(centre, dtype=np.float64), np.asarray(scale, dtype=np.float64)
    m_y, s_y = centre[iy], scale[iy]
    m_x, s_x = centre[idx[1:]], scale[idx[1:]]
    t = np.zeros((k, k))
    t[0, 0] = s_y
    t[0, 1:] = -s_y * m_x / s_x
    t[np.arange(1, k), np.arange(1, k)] = s_y / s_x
    beta = t @ b
    beta[0] += m_y
    cov = t @ v @ t.T
    error_variance = s_y ** 2 * (s_vv - (sigma ** 2 * (1.0 + b[1:] @ b[1:]) if corrected else 0.0))
    return Regression(y=y, names=(constant, *x), coefficients=beta, standard_errors=np.sqrt(np.diag(cov)),
                      covariance=cov, n=int(n), sigma=float(sigma), error_variance=float(error_variance))
