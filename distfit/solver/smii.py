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
steps; Hessian products skip the cells and queries whose soft-max weight has underflowed; and
where the active ones span fewer dimensions than Sigma has rows, CG runs in their span
(``newton_direction(span=True)``; ``solve`` asks for it on its certifying solves).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.linalg.blas as blas

from distfit.solver.linalg import (
    inverse_product,
    inverse_transpose_product,
    quadratic_forms,
    weighted_gram,
    whitened_rows,
)


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


#: Newton-CG's products run in float32 while its forcing term ``min(0.5, sqrt|g|)`` (the
#: relative residual CG must reach) is at least this: float32 rounding (~1e-7 relative, larger
#: by the Hessian's conditioning) stays well below it.
SINGLE_PRECISION_FORCING = 1e-3
#: Hessian products leave out the cells and queries whose soft-max weight is below this
#: fraction of the largest: their terms change a product by about that fraction, less than the
#: float32 rounding the products accept while CG's tolerance is loose and far less than CG's
#: forcing tolerance after (Adult's final round: 8-10% less CPU than at 1e-13, the same
#: iterations and block alphas).
ACTIVE_WEIGHT = 1e-8
#: In the span of the active columns (``newton_direction(span=True)``) a CG step costs
#: ``(r / k)^2`` of a full one (r columns, k rows); a direction may then take up to this many
#: times ``max_cg`` steps, as many as the full space's budget of products buys. Deeper
#: directions buy alpha (``max_cg`` 30 in the full space: -9.3e-5 on marginals.yaml's 60
#: hardest kept blocks, at 1.15x the CPU); measured on those blocks (one process, the settings
#: alternating per block, the polish as before): the span alone 0.90x the CPU, block alphas'
#: sum +2.2e-5; with up to 1.5x the steps 1.03x, -6.3e-4; 2x 1.03-1.04x, -7.9e-4; 3x 1.11x,
#: -8.3e-4. 2x, not 1.5x: marginals.yaml's plan, alpha 120.659883 against 120.660575 (and
#: 120.660522 in the full space).
SPAN_CG_SHARE = 2.0


def _softmax(values: np.ndarray, sharpness: float) -> tuple[np.ndarray, float]:
    """Soft-max weights and value ``max + log(sum exp(t (x - max))) / t`` (overflow-free)."""
    top = values.max()
    exponent = np.exp(sharpness * (values - top))
    total = exponent.sum()
    return exponent / total, float(top + np.log(total) / sharpness)


class SoftmaxState:
    """Everything F, its gradient and its Hessian need at one SPD Sigma = U^T U.

    The profile comes from ``whitened_basis = U^-T B`` (one triangular solve: ``p_i = |U^-T
    b_i|^2``), which is also the whitened ``Y~`` of the Hessian (``whitened_hessian_operator``);
    ``inverse_basis = Sigma^-1 B = U^-1 (U^-T B)`` is formed only where the unwhitened
    gradient asks for it (line-search trials never do)."""

    __slots__ = ("sigma", "factor", "whitened_basis", "profile", "ratios", "value", "cell_weights", "query_weights",
                 "_inverse_basis")

    def __init__(self, sigma: np.ndarray, basis: np.ndarray, scaled_recon: np.ndarray, t_cells: float, t_queries: float):
        self.sigma = sigma
        self.factor = scipy.linalg.cho_factor(sigma, lower=False, check_finite=False)
        self.whitened_basis = inverse_transpose_product(self.factor[0], basis)
        self.profile = np.einsum("ij,ij->j", self.whitened_basis, self.whitened_basis)
        self.ratios = quadratic_forms(scaled_recon, self.factor[0])  # Sigma = U^T U
        self.cell_weights, cell_value = _softmax(self.profile, t_cells)
        self.query_weights, query_value = _softmax(self.ratios, t_queries)
        self.value = cell_value + query_value
        self._inverse_basis = None

    @property
    def inverse_basis(self) -> np.ndarray:
        """``Y = Sigma^-1 B`` (k x d)."""
        if self._inverse_basis is None:
            self._inverse_basis = inverse_product(self.factor[0], self.whitened_basis)
        return self._inverse_basis


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
    max_cg: int = 20,
    time_limit: float = np.inf,
    preconditioned: bool = True,
    forcing: bool = True,
    target_cost: float = 0.0,
    span: bool = True,
) -> SmiiResult:
    """Minimise F_t by Newton-CG with continuation in t (paper's Algorithms 1-3, improved).

    Sharpness values are relative to the balanced level ``a = max p = max h`` of the start
    (about sqrt(alpha*)): ``t1 = t2 = sharpness / a``, so the soft-max overshoot
    ``log(n) / t`` is ``log(n) / sharpness`` relative to ``a``. A stage ends when the Newton
    decrement is below 1e-3 of the soft-max slack ``(log d + log m) / t``; the run ends after the
    stage at ``final_sharpness``.

    ``max_cg``: CG steps per Newton direction. 20 (was 60): in the first stage of a warm start
    every cell and query is active and CG took 46 steps a direction; a truncated direction is
    still a descent direction, and the cheaper steps win (Adult's final round, 30 largest
    blocks: 24.9 -> 18.1 CPU s, Newton 1,414 -> 1,460, the same block alphas to 1e-5; the whole
    serial plan 86.8 -> 55.2 CPU s, alpha 1.25370 -> 1.25425).

    ``preconditioned=False, forcing=False, max_cg=5, initial_sharpness=1, growth=2..10`` from a
    scaled identity reproduces the published algorithm (benchmarks compare against it).

    ``target_cost``: stop as soon as an iterate's plan, scaled to the targets, costs at most this
    (``max p * max h``, free from the iterate's own profile and ratios); ``solve`` passes the
    certified lower bound times (1 + gap tolerance), so SM-II stops once the gap is closed.
    The returned ``sigma`` is the cheapest iterate seen, not merely the last.

    ``span``: Newton directions in the span of the active columns, with deeper CG
    (``newton_direction``, :data:`SPAN_CG_SHARE`).
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
        step, slope, cg_steps = newton_direction(state, basis, scaled_recon, t, max_cg, preconditioned, forcing, span)
        cg_total += cg_steps
        decrement = -slope
        if decrement <= 0.0:  # CG broke down: steepest descent
            gradient = objective_gradient(state, basis, scaled_recon)
            step, decrement = -gradient, float(np.vdot(gradient, gradient))
        trial = None
        if decrement / 2 >= 1e-3 * log_size / t:
            trial = _line_search(state, basis, scaled_recon, step, -decrement, t)
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
    """Indices whose soft-max weight still matters in a Hessian product (``ACTIVE_WEIGHT``)."""
    return np.flatnonzero(weights > ACTIVE_WEIGHT * weights.max())


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


def _whitened_frame(state: SoftmaxState, scaled_recon: np.ndarray, select=np.flatnonzero
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(G, w, omega)`` for the cells and queries ``select`` keeps of their soft-max weights
    (default: every nonzero one; ``_active``: those a Hessian product needs): ``G = [Y~_cells |
    L~^T_queries]`` (k x (a + b)), the whitened basis columns ``y~_i = U^-T b_i`` and query rows
    ``l~_j = U l_j`` (``Sigma = U^T U``) side by side, so that the cell and the query terms of a
    whitened gradient or Hessian product are one matrix product each, and their weights."""
    cells, queries = select(state.cell_weights), select(state.query_weights)
    columns = np.empty((state.sigma.shape[0], cells.size + queries.size))
    columns[:, :cells.size] = state.whitened_basis[:, cells]
    columns[:, cells.size:] = whitened_rows(scaled_recon[queries], state.factor[0])
    return columns, state.cell_weights[cells], state.query_weights[queries]


def _active_part(columns: np.ndarray, cell_weights: np.ndarray, query_weights: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The ``_active`` columns of a frame of every nonzero weight (``_whitened_frame``): the
    frame a Hessian product needs, without whitening the query rows a second time."""
    cells, queries = _active(cell_weights), _active(query_weights)
    if cells.size == cell_weights.size and queries.size == query_weights.size:
        return columns, cell_weights, query_weights
    kept = np.concatenate([cells, cell_weights.size + queries])
    return columns[:, kept], cell_weights[cells], query_weights[queries]


def _gradient(columns: np.ndarray, cell_weights: np.ndarray, query_weights: np.ndarray) -> np.ndarray:
    """``L~^T diag(omega) L~ - Y~ diag(w) Y~^T`` of a frame (``whitened_gradient``), by two ``syrk``."""
    split = cell_weights.size
    return weighted_gram(columns[:, split:].T, query_weights) - weighted_gram(columns[:, :split].T, cell_weights)


def whitened_gradient(state: SoftmaxState, scaled_recon: np.ndarray) -> np.ndarray:
    """``grad F`` in whitened coordinates, ``U grad F U^T = -Y~ diag(w) Y~^T + L~^T diag(omega)
    L~`` (``objective_gradient`` mapped by ``Sigma = U^T U``; weights that underflowed to 0 left
    out), by two ``syrk``."""
    return _gradient(*_whitened_frame(state, scaled_recon))


def whitened_hessian_operator(state: SoftmaxState, scaled_recon: np.ndarray, t: float, single: bool = False):
    """The Hessian in whitened coordinates ``S = U^T S~ U`` (``Sigma = U^T U``), where the
    log-det preconditioner ``S -> Sigma S Sigma`` becomes the identity.

    With ``E[S~] = U^T S~ U`` (so ``E E^T`` is the preconditioner), preconditioned CG on
    ``H s = -g`` is plain CG on ``H~ = E^T H E``: ``H~[S~] = U H[U^T S~ U] U^T``. Term by term,
    with ``Y~ = U Y = U^-T B`` and ``L~ = L_c U^T``:

        H~[S~] = S~ M~ + M~ S~ + t1 Y~ diag(w (q - <w, q>)) Y~^T + t2 L~^T diag(omega (r - <omega, r>)) L~,
        M~ = Y~ diag(w) Y~^T,  q_i = y~_i^T S~ y~_i,  r_j = l~_j^T S~ l~_j

    (``Sigma^-1 S M`` maps to ``S~ M~``). With the active cells and queries side by side in
    ``G = [Y~ | L~^T]`` (k x n, n = a + b) and ``P = S~ G`` (which gives q and r), every term
    is half of ``A G^T + G A^T`` for one ``A = P diag(w, 0) + (t/2) G diag(w q', omega r')``
    (``q' = q - <w, q>``, ``r' = r - <omega, r>``; ``t1 = t2 = t``): a product costs two
    k x k x n multiplications, ``2 k^2 (a + b)`` flops (the separate terms cost ``k^2 (3 a +
    2 b)``, or ``k^3`` more with a >= k). On Adult's k = 210 blocks most cells are active in the
    first stage; later stages keep a handful of cells and the queries near the maximum.
    ``single``: the products in float32 (``newton_direction`` asks for it while CG's forcing
    tolerance is loose). Returns the operator and ``U``.
    """
    return _fused_hessian(*_whitened_frame(state, scaled_recon, _active), t, single), np.triu(state.factor[0])


def _fused_hessian(columns: np.ndarray, cell_weights: np.ndarray, query_weights: np.ndarray, t: float,
                   single: bool):
    """``S~ -> A G^T + G A^T`` (``whitened_hessian_operator``) for ``G = columns``; ``single``:
    the two k x k x n products in float32 (the forms ``q``, ``r`` are summed and centred in
    float64, where the centring's cancellation happens)."""
    split = cell_weights.size
    half_t_weights = 0.5 * t * np.concatenate([cell_weights, query_weights])
    dtype = np.float32 if single else np.float64
    narrow = columns.astype(dtype, copy=False)
    narrow_cell_weights = cell_weights.astype(dtype, copy=False)

    def apply(direction: np.ndarray) -> np.ndarray:
        image = direction.astype(dtype, copy=False) @ narrow
        forms = np.einsum("ij,ij->j", columns, image)
        forms[:split] -= cell_weights @ forms[:split]
        forms[split:] -= query_weights @ forms[split:]
        forms *= half_t_weights
        half = narrow * forms.astype(dtype, copy=False)
        half[:, :split] += image[:, :split] * narrow_cell_weights
        product = (half @ narrow.T).astype(np.float64, copy=False)
        product += product.T
        return product

    return apply


def newton_direction(state, basis, scaled_recon, t, max_cg, use_preconditioner=True, use_forcing=True, span=False):
    """The Newton step ``s`` of F_t at ``state`` and its slope ``<grad F, s>``: CG on ``H s =
    -g``, preconditioned by ``S -> Sigma S Sigma`` (inverse log-det metric). Returns ``(s,
    slope, CG steps)``.

    With the preconditioner, CG runs in whitened coordinates (``whitened_gradient``,
    ``whitened_hessian_operator``: the same iterates, cheaper products), the step is mapped
    back (``s = U^T s~ U``) and the slope is ``<g~, s~>``. Stops when the
    preconditioned residual falls below the Eisenstat-Walker forcing term
    ``min(0.5, sqrt|g|) |g|`` (superlinear Newton near the optimum, cheap steps far from it), or
    below the paper's TOL2 = 1e-10 when forcing is off.

    While the forcing term asks for a relative residual of at least
    :data:`SINGLE_PRECISION_FORCING`, the Hessian products run in float32 (their rounding,
    ~1e-7 relative, is far below what CG is asked to reach; the gradient, the step, CG's
    vectors and every value the line search compares stay float64, so only the direction's
    inexactness changes, never what is accepted). Measured on Adult (470 blocks, serial, CPU):
    86.8 s against 107.9 s in float64 and 118.0 s before the fused product, alpha 1.2537 in all.
    The query rows are whitened once for both the gradient and the products.

    ``span``: where the active cells and queries (``ACTIVE_WEIGHT``) are fewer than Sigma's
    k rows, CG runs in their span. Every term of the whitened Hessian is made of those columns
    ``G = [Y~ | L~^T]`` (``whitened_hessian_operator``): with ``G = Q R`` (economic QR, Q k x r
    orthonormal), ``H~[Q s Q^T] = Q H_R[s] Q^T`` where ``H_R`` is the same operator on the
    columns R, and so is the gradient up to its inactive columns (weights below
    ``ACTIVE_WEIGHT`` of the largest, which the products already leave out). CG from 0 on
    ``H_R s = -Q^T g~ Q`` takes the iterates full-space CG would take on the projected
    gradient, at ``(r / k)^2`` of the cost per product (marginals.yaml's prefix x identity
    blocks: r = 18 of k = 323 from the third stage on), and may take up to
    :data:`SPAN_CG_SHARE` times ``max_cg`` steps. The step is ``U^T Q s Q^T U``.
    """
    if use_preconditioner:
        frame = _whitened_frame(state, scaled_recon)
        gradient = _gradient(*frame)
        relative = min(0.5, float(np.linalg.norm(gradient)) ** 0.5)
        single = use_forcing and relative >= SINGLE_PRECISION_FORCING
        columns, cell_weights, query_weights = _active_part(*frame)
        back = np.triu(state.factor[0]).T  # s = U^T s~ U
        if span and columns.shape[1] < columns.shape[0]:
            # the active columns G = Q R span fewer than k dimensions: solve in Q's coordinates
            # (s~ = Q s' Q^T, G -> R, g~ -> Q^T g~ Q), where a product costs (r / k)^2 as much
            basis_of_span, columns = scipy.linalg.qr(columns, mode="economic", check_finite=False)
            projected = basis_of_span.T @ gradient @ basis_of_span
            gradient = 0.5 * (projected + projected.T)
            back = back @ basis_of_span
            rows, width = basis_of_span.shape  # width: the active columns (their span's dimension at most)
            max_cg = int(min(SPAN_CG_SHARE * max_cg, max_cg * (rows / width) ** 2))
        hessian = _fused_hessian(columns, cell_weights, query_weights, t, single)
        steps, whitened = _conjugate_gradients(hessian, gradient, max_cg, use_forcing)
        return back @ whitened @ back.T, float(np.vdot(gradient, whitened)), steps
    gradient = objective_gradient(state, basis, scaled_recon)
    steps, step = _conjugate_gradients(hessian_operator(state, basis, scaled_recon, t), gradient, max_cg, use_forcing)
    return step, float(np.vdot(gradient, step)), steps


def _conjugate_gradients(hessian, gradient, max_cg, use_forcing):
    """CG on ``hessian(s) = -gradient`` (symmetric matrices, Frobenius inner product); returns
    ``(steps, s)``. The vector updates run in place through BLAS (``axpy``, ``dot`` on the
    flattened matrices): a temporary per update cost as much as the update on k = 200 blocks."""
    step = np.zeros_like(gradient)
    residual = -gradient
    direction = residual.copy()
    step_flat, residual_flat, direction_flat = step.ravel(), residual.ravel(), direction.ravel()
    rho = float(blas.ddot(residual_flat, residual_flat))
    forcing = min(0.5, np.sqrt(np.sqrt(rho))) * np.sqrt(rho) if use_forcing else 1e-5
    steps = 0
    for steps in range(1, max_cg + 1):
        curvature_direction = hessian(direction).ravel()
        curvature = float(blas.ddot(direction_flat, curvature_direction))
        if curvature <= 0.0:
            if steps == 1:
                step = direction
            break
        alpha = rho / curvature
        blas.daxpy(direction_flat, step_flat, a=alpha)
        blas.daxpy(curvature_direction, residual_flat, a=-alpha)
        rho_new = float(blas.ddot(residual_flat, residual_flat))
        if np.sqrt(max(rho_new, 0.0)) <= forcing:
            break
        direction_flat *= rho_new / rho
        direction_flat += residual_flat
        rho = rho_new
    return steps, step


def _line_search(state, basis, scaled_recon, step, slope, t, armijo=1e-4, shrink=0.5):
    """Backtracking (paper's Algorithm 3): largest 0.5^j step that stays SPD and decreases F
    (``slope = <grad F, step>``)."""
    length = 1.0
    for _ in range(60):
        trial = softmax_state(state.sigma + length * step, basis, scaled_recon, t, t)
        if trial is not None and trial.value <= state.value + armijo * length * slope:
            return trial
        length *= shrink
    return None
