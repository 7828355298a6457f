"""SM-II: the soft-max Newton-CG optimiser of the noise covariance (paper 000, section 6).

Problem 4 of the paper, for one block in a basis (``W = L B``, targets folded into
``L_c = diag(c^-1/2) L`` so every target is 1):

    F_t(Sigma) = smax_t1(p(Sigma)) + smax_t2(h(Sigma)),
    p_i = b_i^T Sigma^-1 b_i   (privacy profile),   h_j = l_j^T Sigma l_j   (variance / target),
    smax_t(x) = (1/t) log sum_i exp(t x_i).

F_t is convex on SPD matrices (the paper's Theorem 2) and, as t grows, its minimiser tends to the
solution of Problem 3 (= Problem 1 after scaling by max_j h_j). Newton directions come from
conjugate gradients on Hessian-vector products; the d^2 x d^2 Hessian is never formed. With
``Y = Sigma^-1 B``, softmax weights w (cells) and omega (queries), and a symmetric direction S:

    grad F = -Y diag(w) Y^T + L_c^T diag(omega) L_c
    H[S]   = Sigma^-1 S M + M S Sigma^-1              (M = Y diag(w) Y^T; curvature of each p_i)
             + t1 Y diag(w (q - <w, q>)) Y^T          (q_i = y_i^T S y_i; soft-max curvature)
             + t2 L_c^T diag(omega (r - <omega, r>)) L_c   (r_j = l_j^T S l_j)

Improvements over the published algorithm (which takes 5,000-10,000 Newton iterations on the
census workloads): the start is the dual's recovered plan (``distfit.solver.dual``) instead of a
scaled identity; Sigma is first balanced so max p = max h (the optimal scale of its shape), and
t is expressed relative to that level so one schedule fits every block; CG is preconditioned by
the inverse of the log-det metric (``S -> Sigma S Sigma``), which makes the method invariant to
the choice of basis (and is applied by running CG in whitened coordinates ``S = U^T S~ U``,
``Sigma = U^T U``, where it is the identity and a Hessian product is cheaper); CG stops on an Eisenstat-Walker forcing tolerance instead of a fixed 5
steps; and Hessian products skip the cells and queries whose soft-max weight has underflowed.
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.linalg

from distfit.solver.linalg import quadratic_forms, weighted_gram


@dataclass(frozen=True)
class SmiiResult:
    """Outcome of an SM-II run. ``sigma`` is balanced (max p = max h), not yet scaled to targets."""

    sigma: np.ndarray
    cell_weights: np.ndarray
    query_weights: np.ndarray
    newton_iterations: int
    cg_iterations: int
    final_t: float
    seconds: float
    converged: bool


def _softmax(values: np.ndarray, sharpness: float) -> tuple[np.ndarray, float]:
    """Soft-max weights and value ``max + log(sum exp(t (x - max))) / t`` (overflow-free)."""
    top = values.max()
    exponent = np.exp(sharpness * (values - top))
    total = exponent.sum()
    return exponent / total, float(top + np.log(total) / sharpness)


class SoftmaxState:
    """Everything F, its gradient and its Hessian need at one SPD Sigma."""

    __slots__ = ("sigma", "factor", "inverse_basis", "profile", "ratios", "value", "cell_weights", "query_weights")

    def __init__(self, sigma: np.ndarray, basis: np.ndarray, scaled_recon: np.ndarray, t_cells: float, t_queries: float):
        self.sigma = sigma
        self.factor = scipy.linalg.cho_factor(sigma, lower=False, check_finite=False)
        self.inverse_basis = scipy.linalg.cho_solve(self.factor, basis, check_finite=False)
        self.profile = np.einsum("ij,ij->j", basis, self.inverse_basis)
        self.ratios = quadratic_forms(scaled_recon, self.factor[0])  # Sigma = U^T U
        self.cell_weights, cell_value = _softmax(self.profile, t_cells)
        self.query_weights, query_value = _softmax(self.ratios, t_queries)
        self.value = cell_value + query_value


def softmax_state(sigma, basis, scaled_recon, t_cells, t_queries) -> SoftmaxState | None:
    try:
        return SoftmaxState(sigma, basis, scaled_recon, t_cells, t_queries)
    except (np.linalg.LinAlgError, ValueError):
        return None  # not SPD: the line search shortens the step


def balance(sigma: np.ndarray, basis: np.ndarray, scaled_recon: np.ndarray) -> np.ndarray:
    """Scale Sigma so that max_i p_i = max_j h_j: the best scale for its shape (paper's Problem 3)."""
    state = SoftmaxState(sigma, basis, scaled_recon, 1.0, 1.0)
    return sigma * np.sqrt(state.profile.max() / state.ratios.max())


def smii_optimize(
    basis: np.ndarray,
    scaled_recon: np.ndarray,
    sigma0: np.ndarray,
    initial_sharpness: float = 50.0,
    final_sharpness: float = 2e5,
    growth: float = 4.0,
    max_newton: int = 500,
    max_cg: int = 60,
    time_limit: float = np.inf,
    preconditioned: bool = True,
    forcing: bool = True,
    target_cost: float = 0.0,
) -> SmiiResult:
    """Minimise F_t by Newton-CG with continuation in t (paper's Algorithms 1-3, improved).

    Sharpness values are relative to the balanced level ``a = max p = max h`` of the start
    (about sqrt(alpha*)): ``t1 = t2 = sharpness / a``, so the soft-max overshoot
    ``log(n) / t`` is ``log(n) / sharpness`` relative to ``a``. A stage ends when the Newton
    decrement is below 1e-3 of the soft-max slack ``(log d + log m) / t``; the run ends after the
    stage at ``final_sharpness``.

    ``preconditioned=False, forcing=False, max_cg=5, initial_sharpness=1, growth=2..10`` from a
    scaled identity reproduces the published algorithm (benchmarks compare against it).

    ``target_cost``: stop as soon as an iterate's plan, scaled to the targets, costs at most this
    (``max p * max h``, free from the iterate's own profile and ratios); ``solve`` passes the
    certified lower bound times (1 + gap tolerance), so SM-II stops once the gap is closed.
    The returned ``sigma`` is the cheapest iterate seen, not merely the last.
    """
    start = time.perf_counter()
    basis = np.asarray(basis, dtype=float)
    scaled_recon = np.asarray(scaled_recon, dtype=float)
    sigma = balance(np.asarray(sigma0, dtype=float), basis, scaled_recon)
    level = float(SoftmaxState(sigma, basis, scaled_recon, 1.0, 1.0).profile.max())
    d, m = basis.shape[1], scaled_recon.shape[0]
    log_size = np.log(d) + np.log(m)
    sharpness = initial_sharpness
    t = sharpness / level
    state = SoftmaxState(sigma, basis, scaled_recon, t, t)
    cheapest = state
    newton = cg_total = 0
    converged = False
    while newton < max_newton and time.perf_counter() - start < time_limit:
        gradient = objective_gradient(state, basis, scaled_recon)
        step, cg_steps = newton_direction(state, basis, scaled_recon, gradient, t, max_cg, preconditioned, forcing)
        cg_total += cg_steps
        decrement = -float(np.vdot(gradient, step))
        if decrement <= 0.0:
            step, decrement = -gradient, float(np.vdot(gradient, gradient))  # CG broke down
        trial = None
        if decrement / 2 >= 1e-3 * log_size / t:
            trial = _line_search(state, basis, scaled_recon, step, gradient, t)
            newton += 1
        if trial is not None:
            state = trial
            if _cost(state) < _cost(cheapest):
                cheapest = state
            if _cost(state) <= target_cost:
                converged = True
                break
            continue
        # Stage over: the decrement is small, or no step decreases F_t within round-off.
        if sharpness >= final_sharpness:
            converged = True
            break
        sharpness = min(sharpness * growth, final_sharpness)
        t = sharpness / level
        state = SoftmaxState(state.sigma, basis, scaled_recon, t, t)
    final = cheapest
    return SmiiResult(
        sigma=final.sigma,
        cell_weights=final.cell_weights,
        query_weights=final.query_weights,
        newton_iterations=newton,
        cg_iterations=cg_total,
        final_t=float(t),
        seconds=time.perf_counter() - start,
        converged=converged,
    )


def _cost(state: SoftmaxState) -> float:
    """alpha of the iterate once scaled to meet every target."""
    return float(state.profile.max() * state.ratios.max())


def objective_gradient(state: SoftmaxState, basis: np.ndarray, scaled_recon: np.ndarray) -> np.ndarray:
    cells = state.inverse_basis * state.cell_weights
    queries = np.flatnonzero(state.query_weights)  # at large t most weights underflow to exactly 0
    gradient = weighted_gram(scaled_recon[queries], state.query_weights[queries]) - cells @ state.inverse_basis.T
    return 0.5 * (gradient + gradient.T)


def _active(weights: np.ndarray) -> np.ndarray:
    """Indices whose soft-max weight still matters in a Hessian product."""
    return np.flatnonzero(weights > 1e-13 * weights.max())


def hessian_operator(state: SoftmaxState, basis: np.ndarray, scaled_recon: np.ndarray, t: float):
    cells = _active(state.cell_weights)
    queries = _active(state.query_weights)
    inverse_basis = state.inverse_basis[:, cells]
    cell_weights = state.cell_weights[cells]
    recon = scaled_recon[queries]
    query_weights = state.query_weights[queries]
    weighted_cells = (inverse_basis * cell_weights) @ inverse_basis.T  # M = Y diag(w) Y^T
    sigma_inverse = scipy.linalg.cho_solve(state.factor, np.eye(state.sigma.shape[0]), check_finite=False)

    def apply(direction: np.ndarray) -> np.ndarray:
        left = sigma_inverse @ direction @ weighted_cells
        q = np.einsum("ij,ij->j", inverse_basis, direction @ inverse_basis)
        q -= cell_weights @ q
        r = np.einsum("ij,ij->i", recon @ direction, recon)
        r -= query_weights @ r
        product = left + left.T
        product += t * ((inverse_basis * (cell_weights * q)) @ inverse_basis.T)
        product += t * ((recon.T * (query_weights * r)) @ recon)
        return 0.5 * (product + product.T)

    return apply


def whitened_hessian_operator(state: SoftmaxState, scaled_recon: np.ndarray, t: float):
    """The Hessian in whitened coordinates ``S = U^T S~ U`` (``Sigma = U^T U``), where the
    log-det preconditioner ``S -> Sigma S Sigma`` becomes the identity.

    With ``E[S~] = U^T S~ U`` (so ``E E^T`` is the preconditioner), preconditioned CG on
    ``H s = -g`` is plain CG on ``H~ = E^T H E``: ``H~[S~] = U H[U^T S~ U] U^T``. Term by term,
    with ``Y~ = U Y = U^-T B`` and ``L~ = L_c U^T``:

        H~[S~] = S~ M~ + M~ S~ + t1 Y~ diag(w (q - <w, q>)) Y~^T + t2 L~^T diag(omega (r - <omega, r>)) L~,
        M~ = Y~ diag(w) Y~^T,  q_i = y~_i^T S~ y~_i,  r_j = l~_j^T S~ l~_j

    (``Sigma^-1 S M`` maps to ``S~ M~``). The CG iterates are those of the preconditioned
    method, but a product costs one k x k x k multiplication instead of four (``Sigma^-1 S M``
    and the preconditioner's ``Sigma R Sigma``): about half the CG time on large blocks; and
    none once fewer than k cells are active (``S~ M~ = (S~ Y~) diag(w) Y~^T``, k^2 per cell).
    The cost of a product is then about ``k^2 (3 a + 2 b)`` for a active cells and b active
    queries: on Adult's k = 210 blocks 3.3 ms with most of them active (the first stage),
    0.4 ms with a handful (the later stages).
    Returns the operator and ``U``.
    """
    cells = _active(state.cell_weights)
    queries = _active(state.query_weights)
    upper = np.triu(state.factor[0])
    inverse_basis = upper @ state.inverse_basis[:, cells]
    cell_weights = state.cell_weights[cells]
    recon = scaled_recon[queries] @ upper.T
    query_weights = state.query_weights[queries]
    weighted_basis = inverse_basis * cell_weights
    # M~ has rank <= the active cells a: with a < k, S~ M~ = (S~ Y~) diag(w) Y~^T costs k^2 a
    # instead of k^3, and S~ Y~ is needed for q anyway. Past the first stages of the
    # continuation only a handful of cells stay active (Adult's k = 210 blocks: 6-20 of 336),
    # and the k^3 product was then most of a Hessian product's cost.
    low_rank = cells.size < upper.shape[0]
    weighted_cells = None if low_rank else weighted_basis @ inverse_basis.T

    def apply(direction: np.ndarray) -> np.ndarray:
        image = direction @ inverse_basis
        product = image @ weighted_basis.T if low_rank else direction @ weighted_cells
        product += product.T
        q = np.einsum("ij,ij->j", inverse_basis, image)
        q -= cell_weights @ q
        r = np.einsum("ij,ij->i", recon @ direction, recon)
        r -= query_weights @ r
        product += t * ((inverse_basis * (cell_weights * q)) @ inverse_basis.T)
        product += t * ((recon.T * (query_weights * r)) @ recon)
        return 0.5 * (product + product.T)

    return apply, upper


def newton_direction(state, basis, scaled_recon, gradient, t, max_cg, use_preconditioner=True, use_forcing=True):
    """Preconditioned CG on H s = -g, preconditioner S -> Sigma S Sigma (inverse log-det metric).

    With the preconditioner, CG runs in whitened coordinates (``whitened_hessian_operator``:
    the same iterates, cheaper products) and the step is mapped back. Stops when the
    preconditioned residual falls below the Eisenstat-Walker forcing term
    ``min(0.5, sqrt|g|) |g|`` (superlinear Newton near the optimum, cheap steps far from it), or
    below the paper's TOL2 = 1e-10 when forcing is off.
    """
    if use_preconditioner:
        hessian, upper = whitened_hessian_operator(state, scaled_recon, t)
        steps, whitened = _conjugate_gradients(hessian, upper @ gradient @ upper.T, max_cg, use_forcing)
        return upper.T @ whitened @ upper, steps
    steps, step = _conjugate_gradients(hessian_operator(state, basis, scaled_recon, t), gradient, max_cg, use_forcing)
    return step, steps


def _conjugate_gradients(hessian, gradient, max_cg, use_forcing):
    """CG on ``hessian(s) = -gradient`` (symmetric matrices, Frobenius inner product); returns
    ``(steps, s)``."""
    step = np.zeros_like(gradient)
    residual = -gradient
    direction = residual.copy()
    rho = float(np.vdot(residual, residual))
    forcing = min(0.5, np.sqrt(np.sqrt(rho))) * np.sqrt(rho) if use_forcing else 1e-5
    steps = 0
    for steps in range(1, max_cg + 1):
        curvature_direction = hessian(direction)
        curvature = float(np.vdot(direction, curvature_direction))
        if curvature <= 0.0:
            if steps == 1:
                step = direction
            break
        alpha = rho / curvature
        step += alpha * direction
        residual -= alpha * curvature_direction
        rho_new = float(np.vdot(residual, residual))
        if np.sqrt(max(rho_new, 0.0)) <= forcing:
            break
        direction = residual + (rho_new / rho) * direction
        rho = rho_new
    return steps, step


def _line_search(state, basis, scaled_recon, step, gradient, t, armijo=1e-4, shrink=0.5):
    """Backtracking (paper's Algorithm 3): largest 0.5^j step that stays SPD and decreases F."""
    slope = float(np.vdot(gradient, step))
    length = 1.0
    for _ in range(60):
        trial = softmax_state(state.sigma + length * step, basis, scaled_recon, t, t)
        if trial is not None and trial.value <= state.value + armijo * length * slope:
            return trial
        length *= shrink
    return None
