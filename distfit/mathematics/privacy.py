"""Privacy profile and privacy accounting of the correlated Gaussian mechanism.

Mechanism (docs/design.md section 1): ``M(x) = L (B x + z)`` with ``z ~ N(0, Sigma)``.
Neighbouring count vectors differ by one person, ``x' = x +- e_i``, so the output moves by the
column ``b_i`` of the basis and the privacy loss is governed by its Mahalanobis length.
"""
from __future__ import annotations

import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Sequence, Union

import numpy as np
import scipy.linalg
import scipy.optimize
import scipy.special


def privacy_profile(sigma: np.ndarray, basis: np.ndarray) -> np.ndarray:
    """Per-cell privacy profile ``p_i = b_i^T Sigma^-1 b_i`` (docs/design.md section 1).

    ``sigma`` is the (k, k) SPD noise covariance and ``basis`` the (k, d) basis B. The profile
    is invariant to the choice of basis that represents the same mechanism. Computed through
    the Cholesky factor: ``p_i = || R^-T b_i ||^2`` with ``Sigma = R^T R``.
    """
    sigma = np.asarray(sigma, dtype=float)
    basis = np.asarray(basis, dtype=float)
    upper = scipy.linalg.cholesky(sigma, lower=False)
    whitened = scipy.linalg.solve_triangular(upper, basis, trans="T", lower=False)
    return np.einsum("ij,ij->j", whitened, whitened)


def privacy_cost(sigma: np.ndarray, basis: np.ndarray) -> float:
    """Privacy cost ``alpha = Delta^2 = max_i p_i`` (docs/design.md section 1)."""
    return float(privacy_profile(sigma, basis).max())


# ---------------------------------------------------------------------------------------------
# Privacy accounting of the correlated Gaussian mechanism
# ---------------------------------------------------------------------------------------------
#
# Everything below is a function of the privacy cost ``alpha = Delta^2`` alone: whitening the
# noise by ``Sigma^-1/2`` turns the correlated mechanism into a spherical Gaussian mechanism with
# unit noise whose worst-case shift has Euclidean length ``Delta = max_i sqrt(b_i^T Sigma^-1 b_i)``,
# i.e. a scalar Gaussian mechanism with sensitivity / standard deviation ``= Delta``.

ArrayLike = Union[float, Sequence[float], np.ndarray]

#: Default deltas of the (epsilon, delta) table in a :class:`PrivacyAccount`.
DEFAULT_DELTAS: tuple[float, ...] = (1e-5, 1e-6, 1e-7, 1e-8, 1e-9, 1e-10)

#: Default Renyi orders of the RDP curve in a :class:`PrivacyAccount`.
DEFAULT_RDP_ORDERS: tuple[float, ...] = (
    1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 4.0, 5.0, 6.0, 8.0, 10.0, 12.0, 16.0, 20.0, 24.0, 32.0,
    48.0, 64.0, 128.0, 256.0,
)

_SQRT1_2 = math.sqrt(0.5)


# --- input validation --------------------------------------------------------------------------

def _as_float_array(value: Any, name: str) -> np.ndarray:
    if isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} must be a real number, got {value!r}")
    try:
        arr = np.asarray(value, dtype=float)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a real number or array of them, got {value!r}") from None
    return arr


def _first_bad(arr: np.ndarray, bad: np.ndarray) -> float:
    return float(np.ravel(arr)[np.flatnonzero(np.ravel(bad))[0]])


def _check_nonneg(value: Any, name: str) -> np.ndarray:
    """Finite and ``>= 0`` (privacy costs, rho, epsilon where 0 is meaningful)."""
    arr = _as_float_array(value, name)
    bad = ~np.isfinite(arr) | (arr < 0)
    if np.any(bad):
        raise ValueError(f"{name} must be finite and >= 0, got {_first_bad(arr, bad)!r}")
    return arr


def _check_positive(value: Any, name: str) -> np.ndarray:
    """Finite and ``> 0``."""
    arr = _as_float_array(value, name)
    bad = ~np.isfinite(arr) | (arr <= 0)
    if np.any(bad):
        raise ValueError(f"{name} must be finite and > 0, got {_first_bad(arr, bad)!r}")
    return arr


def _check_delta(value: Any, name: str = "delta") -> np.ndarray:
    """In the open interval (0, 1)."""
    arr = _as_float_array(value, name)
    bad = ~((arr > 0) & (arr < 1))  # also catches NaN
    if np.any(bad):
        raise ValueError(f"{name} must be in (0, 1), got {_first_bad(arr, bad)!r}")
    return arr


def _scalar(value: Any, arr: np.ndarray, name: str) -> float:
    if arr.ndim != 0:
        raise ValueError(f"{name} must be a scalar, got an array of shape {arr.shape}")
    return float(arr)


def _out(result: np.ndarray, *inputs: np.ndarray) -> Union[float, np.ndarray]:
    """A Python float when every input was a scalar, otherwise the array."""
    if all(np.ndim(x) == 0 for x in inputs):
        return float(result)
    return result


# --- zCDP and Renyi DP ----------------------------------------------------------------------------

def zcdp_rho(alpha: ArrayLike) -> Union[float, np.ndarray]:
    """zCDP parameter of the correlated Gaussian mechanism: ``rho = alpha / 2``.

    The Gaussian mechanism with (Mahalanobis) sensitivity ``Delta`` is ``Delta^2 / 2``-zCDP
    (Bun & Steinke 2016, "Concentrated Differential Privacy", Proposition 1.6), and
    ``alpha = Delta^2`` (docs/design.md section 1).
    """
    a = _check_nonneg(alpha, "alpha")
    return _out(a / 2.0, a)


def alpha_from_rho(rho: ArrayLike) -> Union[float, np.ndarray]:
    """The privacy cost a zCDP budget allows: ``alpha = 2 rho`` (inverse of :func:`zcdp_rho`)."""
    r = _check_nonneg(rho, "rho")
    return _out(2.0 * r, r)


def rdp_epsilon(alpha: ArrayLike, order: ArrayLike) -> Union[float, np.ndarray]:
    """Renyi DP of the correlated Gaussian mechanism: ``eps(a) = a * alpha / 2``.

    The Renyi divergence of order ``a`` between ``N(0, Sigma)`` and ``N(b, Sigma)`` is
    ``a * b^T Sigma^-1 b / 2`` (Mironov 2017, "Renyi Differential Privacy", Proposition 7),
    maximised over neighbours at ``alpha``. ``order`` (``>= 1``; order 1 is the KL divergence)
    and ``alpha`` broadcast against each other.
    """
    a = _check_nonneg(alpha, "alpha")
    o = _as_float_array(order, "order")
    bad = ~(np.isfinite(o) & (o >= 1))
    if np.any(bad):
        raise ValueError(f"order must be finite and >= 1, got {_first_bad(o, bad)!r}")
    return _out(o * a / 2.0, a, o)


def _rdp_conversion(rdp: np.ndarray, order: np.ndarray, log_delta: float) -> np.ndarray:
    """``eps = rdp + log(1 - 1/a) - (log(delta) + log(a)) / (a - 1)`` for orders ``a > 1``."""
    return rdp + np.log1p(-1.0 / order) - (log_delta + np.log(order)) / (order - 1.0)


def rdp_to_dp_epsilon(alpha: float, delta: float) -> float:
    """(epsilon, delta)-DP from the RDP curve, optimised over all real orders ``a > 1``.

    Uses the conversion of Canonne, Kamath & Steinke 2020 ("The Discrete Gaussian for
    Differential Privacy", Proposition 12; also Asoodeh et al. 2020, eq. 20), the one used by
    Google's dp-accounting ``RdpAccountant``:
    ``eps = min_a [ a alpha / 2 + log(1 - 1/a) - (log(delta) + log(a)) / (a - 1) ]``, clipped at 0,
    and 0 when the KL bound ``sqrt(1 - exp(-alpha/2)) <= delta`` already gives (0, delta)-DP.
    It is never smaller than the exact value :func:`epsilon_for_delta` and is reported only for
    comparison tables.
    """
    a = _scalar(alpha, _check_nonneg(alpha, "alpha"), "alpha")
    d = _scalar(delta, _check_delta(delta), "delta")
    if a == 0.0 or d * d + math.expm1(-a / 2.0) > 0.0:
        return 0.0
    log_d = math.log(d)

    # Coarse grid over a = 1 + exp(t), then a bounded refinement around the best point.
    t = np.linspace(-12.0, 16.0, 2801)
    orders = 1.0 + np.exp(t)
    vals = _rdp_conversion(orders * a / 2.0, orders, log_d)
    i = int(np.argmin(vals))
    lo, hi = t[max(i - 1, 0)], t[min(i + 1, t.size - 1)]

    def f(s: float) -> float:
        o = 1.0 + math.exp(s)
        return float(_rdp_conversion(np.asarray(o * a / 2.0), np.asarray(o), log_d))

    best = float(vals[i])
    if hi > lo:
        res = scipy.optimize.minimize_scalar(f, bounds=(lo, hi), method="bounded",
                                             options={"xatol": 1e-12})
        best = min(best, float(res.fun))
    return max(0.0, best)


# --- exact (epsilon, delta): the analytic Gaussian mechanism -----------------------------------

def _log_delta(sens: np.ndarray, eps: np.ndarray) -> np.ndarray:
    """``log delta(eps)`` for sensitivity/std ``sens = Delta > 0``, ``eps >= 0`` (arrays broadcast).

    With ``u = eps/Delta - Delta/2`` the exact delta is ``Q(u) - e^eps Q(u + Delta)`` where
    ``Q = 1 - Phi``. Because ``(u + Delta)^2 / 2 = u^2 / 2 + eps`` the two terms share the factor
    ``exp(-u^2/2)``, so for ``u >= 0`` (the small-delta regime)
    ``delta = exp(-u^2/2) / 2 * (erfcx(u/sqrt2) - erfcx((u + Delta)/sqrt2))``:
    both scaled complementary error functions are relatively accurate and of moderate size,
    so nothing underflows and the subtraction loses only ``log10((u + Delta)/Delta)`` digits.
    For ``u < 0`` (delta of order one) the direct form ``Phi(-u) - exp(eps + log Phi(-u - Delta))``
    has no harmful cancellation.
    """
    sens, eps = np.broadcast_arrays(np.asarray(sens, dtype=float), np.asarray(eps, dtype=float))
    u = eps / sens - sens / 2.0
    out = np.empty(u.shape, dtype=float)
    pos = u >= 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        up, dp = u[pos], sens[pos]
        diff = scipy.special.erfcx(up * _SQRT1_2) - scipy.special.erfcx((up + dp) * _SQRT1_2)
        out[pos] = -0.5 * up * up + np.log(0.5 * np.maximum(diff, 0.0))
        neg = ~pos
        un, dn, en = u[neg], sens[neg], eps[neg]
        first = scipy.special.ndtr(-un)
        second = np.exp(en + scipy.special.log_ndtr(-un - dn))
        out[neg] = np.log(np.maximum(first - second, 0.0))
    return out


def delta_for_epsilon(alpha: ArrayLike, epsilon: ArrayLike) -> Union[float, np.ndarray]:
    """Exact delta of the correlated Gaussian mechanism at privacy level ``epsilon``.

    ``delta(eps) = Phi(Delta/2 - eps/Delta) - e^eps * Phi(-Delta/2 - eps/Delta)`` with
    ``Delta = sqrt(alpha)`` (Balle & Wang 2018, "Improving the Gaussian Mechanism for Differential
    Privacy: Analytical Calibration and Optimal Denoising", Theorem 8; docs/design.md section 1).
    It is the smallest delta for which the mechanism is (eps, delta)-DP; increasing in alpha,
    decreasing in epsilon. Evaluated without catastrophic cancellation (see ``_log_delta``): about
    1e-13 relative accuracy down to the smallest representable deltas. ``alpha`` (finite, >= 0)
    and ``epsilon`` (finite, >= 0) broadcast; ``alpha = 0`` gives 0.
    """
    a = _check_nonneg(alpha, "alpha")
    e = _check_nonneg(epsilon, "epsilon")
    a_b, e_b = np.broadcast_arrays(a, e)
    result = np.zeros(a_b.shape, dtype=float)
    live = a_b > 0
    if np.any(live):
        result[live] = np.exp(_log_delta(np.sqrt(a_b[live]), e_b[live]))
    return _out(np.clip(result, 0.0, 1.0), a, e)


def _root_log_delta(func, lo: float, hi: float) -> float:
    """brentq on a monotone log-delta residual; -inf (delta underflow) is made finite."""

    def g(x: float) -> float:
        v = func(x)
        return -1e300 if v == -math.inf else v

    return scipy.optimize.brentq(g, lo, hi, xtol=1e-300, rtol=4 * np.finfo(float).eps,
                                 maxiter=500)


def epsilon_for_delta(alpha: float, delta: float) -> float:
    """Exact epsilon of the correlated Gaussian mechanism at level ``delta``.

    The smallest ``eps >= 0`` with ``delta_for_epsilon(alpha, eps) <= delta`` (Balle & Wang 2018,
    Theorem 8, inverted numerically): 0.0 if ``delta(0) = 2 Phi(Delta/2) - 1 <= delta``, otherwise
    the root of ``log delta(eps) = log delta`` found by ``scipy.optimize.brentq`` on a bracket
    ``[0, hi]`` with ``hi`` started at ``Delta^2/2 + Delta sqrt(2 log(1/delta))`` (an upper bound
    from ``Q(u) <= exp(-u^2/2)/2``) and doubled if needed. The root is nudged up by a few ulps if
    rounding left it on the wrong side, so the answer is always conservative.
    """
    a = _scalar(alpha, _check_nonneg(alpha, "alpha"), "alpha")
    d = _scalar(delta, _check_delta(delta), "delta")
    if a == 0.0:
        return 0.0
    sens = math.sqrt(a)
    target = math.log(d)

    def resid(eps: float) -> float:
        return float(_log_delta(np.asarray(sens), np.asarray(eps))) - target

    if resid(0.0) <= 0.0:
        return 0.0
    hi = max(1.0, sens * sens / 2.0 + sens * math.sqrt(2.0 * math.log(1.0 / d)))
    for _ in range(2000):
        if resid(hi) <= 0.0:
            break
        hi *= 2.0
    else:  # pragma: no cover - unreachable for finite alpha
        raise RuntimeError("epsilon_for_delta: could not bracket the root")
    eps = _root_log_delta(resid, 0.0, hi)
    # the public delta_for_epsilon (exp of the log) must itself meet the target
    step = max(eps, 1e-300) * np.finfo(float).eps
    while resid(eps) > 0.0 or delta_for_epsilon(a, eps) > d:
        eps += step
        step *= 2.0
    return float(eps)


def alpha_for_budget(epsilon: float, delta: float) -> float:
    """The largest privacy cost ``alpha`` an (epsilon, delta) budget allows.

    The largest ``alpha = Delta^2`` with ``delta_for_epsilon(alpha, epsilon) <= delta`` (the
    analytic Gaussian calibration of Balle & Wang 2018, Theorem 8/Algorithm 1, expressed in
    ``Delta = sensitivity / std``). ``delta(eps)`` increases in ``Delta`` from 0 to 1, so the root
    of ``log delta_Delta(eps) = log delta`` is unique; it is found with ``scipy.optimize.brentq`` in
    ``Delta`` on a bracket expanded by doubling/halving, then nudged down by a few ulps if
    rounding left it on the wrong side (conservative). ``epsilon`` must be finite and > 0.
    """
    e = _scalar(epsilon, _check_positive(epsilon, "epsilon"), "epsilon")
    d = _scalar(delta, _check_delta(delta), "delta")
    target = math.log(d)

    def resid(sens: float) -> float:
        return float(_log_delta(np.asarray(sens), np.asarray(e))) - target

    hi = 1.0
    while resid(hi) < 0.0:
        hi *= 2.0
    lo = hi / 2.0
    while resid(lo) >= 0.0:
        lo /= 2.0
        if lo < 1e-300:  # pragma: no cover - delta(eps) -> 0 as Delta -> 0
            raise RuntimeError("alpha_for_budget: could not bracket the root")
    sens = _root_log_delta(resid, lo, hi)
    # rounding (the square, the exp of the log) can leave the root an ulp on the wrong side:
    # step down until the public delta_for_epsilon at the returned alpha meets the budget
    alpha = sens * sens
    step = alpha * np.finfo(float).eps
    while delta_for_epsilon(alpha, e) > d:
        alpha -= step
        step *= 2.0
    return float(alpha)


# --- budgets ---------------------------------------------------------------------------------------

def _budget_field(name: str, value: Any) -> float:
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (numbers.Real, np.floating,
                                                                      np.integer)):
        raise ValueError(f"budget.{name} must be a real number, got {value!r}")
    return float(value)


_BUDGET_KEYS = ("rho", "epsilon", "delta", "alpha")


@dataclass(frozen=True)
class Budget:
    """A privacy budget, given exactly one way: ``rho`` (zCDP) alone, ``epsilon`` and ``delta``
    together (exact (eps, delta)-DP of the Gaussian mechanism), or ``alpha`` (the privacy cost
    ``Delta^2``) alone. :meth:`to_alpha` converts it to the privacy cost it allows (docs/design.md
    section 1, Problem 2)."""

    rho: float | None = None
    epsilon: float | None = None
    delta: float | None = None
    alpha: float | None = None

    @staticmethod
    def ways_given(rho: Any = None, epsilon: Any = None, delta: Any = None, alpha: Any = None) -> list[str]:
        """Which of the three ways (``"rho"``, ``"epsilon/delta"``, ``"alpha"``) a budget's fields give."""
        return [way for way, given in (("rho", rho is not None),
                                       ("epsilon/delta", epsilon is not None or delta is not None),
                                       ("alpha", alpha is not None)) if given]

    def __post_init__(self) -> None:
        ways = self.ways_given(self.rho, self.epsilon, self.delta, self.alpha)
        if not ways:
            raise ValueError("budget: no budget given; give rho, alpha, or epsilon and delta")
        if len(ways) > 1:
            count = {2: "two", 3: "three"}[len(ways)]
            listed = " and ".join(ways) if len(ways) == 2 else ", ".join(ways[:-1]) + " and " + ways[-1]
            raise ValueError(f"budget: given {count} ways ({listed}); give exactly one")
        if self.rho is not None:
            rho = _budget_field("rho", self.rho)
            if not (math.isfinite(rho) and rho > 0):
                raise ValueError(f"budget.rho must be finite and > 0, got {self.rho!r}")
            object.__setattr__(self, "rho", rho)
        if self.alpha is not None:
            alpha = _budget_field("alpha", self.alpha)
            if not (math.isfinite(alpha) and alpha > 0):
                raise ValueError(f"budget.alpha must be finite and > 0, got {self.alpha!r}")
            object.__setattr__(self, "alpha", alpha)
        if ways == ["epsilon/delta"]:
            if self.delta is None:
                raise ValueError("budget.delta: epsilon given without delta")
            if self.epsilon is None:
                raise ValueError("budget.epsilon: delta given without epsilon")
            eps = _budget_field("epsilon", self.epsilon)
            delta = _budget_field("delta", self.delta)
            if not math.isfinite(eps):
                raise ValueError(f"budget.epsilon must be finite, got {self.epsilon!r}")
            if not eps > 0:
                raise ValueError(f"budget.epsilon must be > 0, got {self.epsilon!r}")
            if not (0.0 < delta < 1.0):
                raise ValueError(f"budget.delta must be in (0, 1), got {self.delta!r}")
            object.__setattr__(self, "epsilon", eps)
            object.__setattr__(self, "delta", delta)

    @property
    def kind(self) -> str:
        """``"rho"``, ``"epsilon_delta"`` or ``"alpha"``: how the budget was given."""
        if self.rho is not None:
            return "rho"
        if self.alpha is not None:
            return "alpha"
        return "epsilon_delta"

    def to_alpha(self) -> float:
        """The privacy cost the budget allows: ``2 rho``, ``alpha``, or
        :func:`alpha_for_budget` ``(epsilon, delta)`` (exact, Balle & Wang 2018)."""
        if self.rho is not None:
            return 2.0 * self.rho
        if self.alpha is not None:
            return float(self.alpha)
        return alpha_for_budget(self.epsilon, self.delta)

    def to_dict(self) -> dict[str, float]:
        """The fields that are set, for JSON / YAML."""
        return {k: getattr(self, k) for k in _BUDGET_KEYS if getattr(self, k) is not None}

    @classmethod
    def parse(cls, obj: Any) -> "Budget":
        """A :class:`Budget` from a Budget, a mapping with keys among ``rho``, ``epsilon``,
        ``delta``, ``alpha``, or a 2-tuple/list ``(epsilon, delta)``. A bare number is refused
        (it would be ambiguous between rho, alpha and epsilon)."""
        if isinstance(obj, Budget):
            return obj
        if isinstance(obj, Mapping):
            unknown = [k for k in obj if k not in _BUDGET_KEYS]
            if unknown:
                raise ValueError(f"budget: unknown key {unknown[0]!r}; "
                                 f"expected rho, epsilon, delta or alpha")
            return cls(**{str(k): v for k, v in obj.items()})
        if isinstance(obj, (bool, np.bool_, numbers.Number, np.number)) or (
                isinstance(obj, np.ndarray) and obj.ndim == 0):
            raise ValueError("budget: a bare number is ambiguous; pass {'rho': x}, {'alpha': x} "
                             "or (epsilon, delta)")
        if isinstance(obj, (tuple, list, np.ndarray)):
            if len(obj) != 2:
                raise ValueError(f"budget: a sequence must be (epsilon, delta), "
                                 f"got {len(obj)} items")
            return cls(epsilon=obj[0], delta=obj[1])
        raise ValueError(f"budget: cannot read a budget from {type(obj).__name__} {obj!r}; "
                         f"pass {{'rho': x}}, {{'alpha': x}} or (epsilon, delta)")


# --- the account -------------------------------------------------------------------------------

@dataclass(frozen=True)
class PrivacyAccount:
    """The privacy guarantees of a plan with privacy cost ``alpha``.

    ``rho = alpha / 2`` (zCDP); ``epsilon_delta``: ``(delta, epsilon)`` pairs, epsilon exact
    (:func:`epsilon_for_delta`); ``rdp``: ``(order, epsilon)`` pairs of the Renyi DP curve.
    """

    alpha: float
    rho: float
    epsilon_delta: tuple[tuple[float, float], ...] = field(default=())
    rdp: tuple[tuple[float, float], ...] = field(default=())

    def epsilon(self, delta: float) -> float:
        """Exact epsilon at ``delta`` (from the table when present, else computed)."""
        for d, e in self.epsilon_delta:
            if d == delta:
                return e
        return epsilon_for_delta(self.alpha, delta)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dictionary."""
        return {
            "alpha": float(self.alpha),
            "rho": float(self.rho),
            "epsilon_delta": [{"delta": float(d), "epsilon": float(e)}
                              for d, e in self.epsilon_delta],
            "rdp": [{"order": float(o), "epsilon": float(e)} for o, e in self.rdp],
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "PrivacyAccount":
        """Inverse of :meth:`to_dict`."""
        return cls(
            alpha=float(data["alpha"]),
            rho=float(data["rho"]),
            epsilon_delta=tuple((float(r["delta"]), float(r["epsilon"]))
                                for r in data.get("epsilon_delta", ())),
            rdp=tuple((float(r["order"]), float(r["epsilon"])) for r in data.get("rdp", ())),
        )


def privacy_account(alpha: float, deltas: Sequence[float] = DEFAULT_DELTAS,
                    orders: Sequence[float] = DEFAULT_RDP_ORDERS) -> PrivacyAccount:
    """The :class:`PrivacyAccount` of privacy cost ``alpha``: ``rho = alpha/2`` (Bun & Steinke
    2016), exact epsilon at each of ``deltas`` (Balle & Wang 2018) and the RDP curve
    ``a * alpha / 2`` at each of ``orders`` (Mironov 2017)."""
    a = _scalar(alpha, _check_nonneg(alpha, "alpha"), "alpha")
    ds = _check_delta(np.asarray(deltas, dtype=float).ravel(), "deltas")
    os_ = np.asarray(orders, dtype=float).ravel()
    rdp = np.atleast_1d(rdp_epsilon(a, os_)) if os_.size else np.empty(0)
    return PrivacyAccount(
        alpha=a,
        rho=a / 2.0,
        epsilon_delta=tuple((float(d), epsilon_for_delta(a, float(d))) for d in ds),
        rdp=tuple((float(o), float(e)) for o, e in zip(os_, rdp)),
    )
