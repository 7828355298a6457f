"""The local polytope in the published queries' own metric: the wide-schema estimate of a residual plan.

docs/design.md section 7 (issue 26). In a residual plan every measured clique ``C`` is spanned
exactly by the blocks within it: stacking their whitened bases on ``C``'s cells,
``S_C = [G_b M_{C->b}]_{b <= C}``, gives a square invertible matrix. The blocks' whitened
coordinates ``u = [u_b]_b`` (``u_b = G_b M_b mu``, ``G_b = C_b^-1 B_b``) then parametrise every
family of clique tables that agree on their shared attributes: ``mu_C = S_C^-1 u_{b <= C}``
(the marginal of ``mu_C`` on a subset ``s`` is ``S_s^-1 u_{b <= s}``, the same from every clique
that contains ``s``). The raw release is ``u = w``, ``w_b = C_b^-1 y_b``; its tables agree but have
negative cells. The estimate is the projection of the release onto the local polytope (clique
tables that agree and are nonnegative), measured in the metric of the published queries:

    ``u_hat = argmin_u 1/2 || Q (u - w) ||^2   s.t.   A u >= 0``

``Q`` (m x sum_b k_b) the published queries' answers from ``u`` (block ``b``'s rows
``L_b C_b u_b``, summed by ``query_index``: ``Q w`` is the raw release's answers), ``A`` every
clique's ``S_C^-1``, each row scaled to unit norm (a row's norm is its cell's noise standard
deviation, so ``A u`` is every cell in units of its own noise). The total is free (the published
total is one of the queries).

Why this metric (docs/design.md section 7): the local polytope contains the true tables, and the
projection onto a closed convex set containing the truth is never farther from it than the point
projected, in the projection's metric (Pythagoras: ``||P(w) - t|| <= ||w - t||``). In the
published queries' metric that distance is their Euclidean error, so the estimate's root mean
squared error on the published queries is never above the raw release's, for every draw of the
noise (up to the solver's tolerance). In the plan's noise metric (``||u - w||``, generalised
least squares) the same holds for the whitened error instead, and measured on Adult it is worse
on the queries (mean absolute error 14.4 against raw 10.8): the 364 cliques' negative cells all
push on the shared low-order coordinates, which are cheap in the noise metric and dominate every
prefix sum (benchmarks/README.md, session 13).

Solver: ADMM (Boyd et al. 2011, section 5, with over-relaxation ``alpha``) on ``A u = z, z >= 0``
with the scaled dual ``lam``: ``u <- (Q^T Q + rho A^T A)^-1 (Q^T Q w + rho A^T (z - lam))`` (factored
once per plan by block elimination, :class:`SchurFactor`; every unit's right-hand side at once), ``v = alpha A u + (1 - alpha) z``,
``z <- max(v + lam, 0)``, ``lam <- lam + v - z``; ``rho = RHO_SCALE tr(Q^T Q) / tr(A^T A)`` fixed, so that
a unit's iterates do not depend on the other units of its chunk. Stopping rule, per unit,
checked every :data:`CHECK_EVERY` iterations: no cell of the tables ``A u`` below
``-NEGATIVITY`` of its noise standard deviation and the objective changed by at most
:data:`TOLERANCE` (relative) since the last check; a unit that meets it is frozen. The
published tables are ``max(A u, 0)`` (cells above ``-NEGATIVITY`` noise standard deviations
set to 0), then I-projected onto agreement by the caller
(:func:`distfit.estimate.graphical.estimate_units`).

Resumable (issue 26): the iterations between two checks read nothing but :class:`AdmmState`
(``u``, ``z``, ``lam``, each unit's last objective and whether it is still active, the
iterations done; ``rho`` and ``alpha`` are fixed and the factor a function of the plan), so a
fit started again from a state saved after a check (``checkpoints``, :class:`Checkpoints`)
runs the very same floating-point operations as one never interrupted, and ends bit for bit
where it would have. A state is continued only from the same :func:`state_inputs`: everything
else the iterations depend on.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

import numpy as np
import scipy.linalg
import scipy.sparse as sp

from distfit.estimate.measurements import MeasurementModel

__all__ = ["AdmmState", "CHECK_EVERY", "Checkpoints", "ITERATIONS", "LocalPolytope", "NEGATIVITY", "TOLERANCE",
           "StateInputs", "is_residual", "local_polytope", "local_polytope_bytes", "solve", "state_inputs", "tables"]

#: ADMM iterations at most, and the period of the convergence check and of ``progress``.
ITERATIONS = 1000
CHECK_EVERY = 25
#: Converged: no cell below -NEGATIVITY of its noise standard deviation, and the objective's
#: relative change over CHECK_EVERY iterations at most TOLERANCE.
NEGATIVITY = 0.05
TOLERANCE = 1e-4
#: ADMM over-relaxation (Boyd et al. 2011, section 3.4.3: 1.5-1.8 typically faster).
ALPHA = 1.6
#: ADMM's penalty ``rho`` as a multiple of ``tr(Q^T Q) / tr(A^T A)``. Measured on Adult's one
#: unit and two more noise draws of it (the same stopping rule): at 1x the fit stopped after 250,
#: 300 and 250 iterations, 5.3, 7.9 and 2.1 from the optimum (the distance in the published
#: queries' metric, the raw release ~1,200 away); at 3x after 150, 150 and 125, 1.7, 4.5 and 1.0
#: away; at 5x after 100 iterations, 4.4 and 5.1 away. Small plans stop at the second check
#: (50 iterations) at every scale from 1x to 10x.
RHO_SCALE = 3.0
#: float64 copies of the constraint matrix's nonzeros held while the problem is built and solved
#: (A and A^T, A^T A and the dense pieces it is summed from, Q^T Q, their sum, the block-diagonal
#: inverse: Adult has 6.8e6 nonzeros in A).
NONZERO_COPIES = 7


@dataclass(frozen=True, eq=False)
class SchurFactor:
    """``H^-1`` for ``H = Q^T Q + rho A^T A`` by block elimination. Two blocks are coupled in
    ``H`` only when some clique contains both; the blocks that are cliques themselves ("top":
    no clique contains two of them) are coupled only to lower blocks, so ``H_tt`` is block
    diagonal (one dense ``k_b x k_b`` block each, inverted) and ``H^-1`` needs only the dense
    Schur complement ``S = H_ll - H_lt H_tt^-1 H_tl`` of the lower coordinates (Adult: 1,439 of
    22,490; its Cholesky factor). A general sparse LU (SuperLU) reserves ~4.4 GiB of address
    space on Adult, over a 4 GiB cap, for 0.4 GiB used."""

    top: np.ndarray
    low: np.ndarray
    top_inverse: sp.csr_matrix
    eliminated: sp.csr_matrix
    eliminated_transpose: sp.csr_matrix
    schur: tuple[np.ndarray, bool]

    @classmethod
    def of(cls, h: sp.csr_matrix, top: np.ndarray, offsets: np.ndarray) -> "SchurFactor":
        t, low = np.flatnonzero(top), np.flatnonzero(~top)
        position = np.full(top.size, -1, dtype=np.int64)
        position[t] = np.arange(t.size)
        inverses = []
        for b in range(len(offsets) - 1):
            if top[offsets[b]]:
                idx = np.arange(offsets[b], offsets[b + 1])
                inverses.append((position[idx], np.linalg.inv(h[idx][:, idx].toarray())))
        top_inverse = _sum_of_dense_blocks(inverses, t.size)
        eliminated = (top_inverse @ h[t][:, low]).tocsr()
        schur = h[low][:, low].toarray() - (h[low][:, t] @ eliminated).toarray()
        return cls(top=t, low=low, top_inverse=top_inverse, eliminated=eliminated,
                   eliminated_transpose=eliminated.T.tocsr(), schur=scipy.linalg.cho_factor(schur))

    def solve(self, r: np.ndarray) -> np.ndarray:
        """``H^-1 r`` for ``r`` (coordinates, n): with ``E = H_tt^-1 H_tl`` (``eliminated``; ``E^T =
        H_lt H_tt^-1``, ``H`` symmetric), ``x_l = S^-1 (r_l - E^T r_t)`` and ``x_t = H_tt^-1 r_t - E
        x_l``: three sparse products an iteration instead of four."""
        top = r[self.top]
        out = np.empty_like(r)
        # finite by construction (the factor of a finite plan, ADMM's iterates of finite
        # measurements): the check read the whole 1,439^2 factor every call, ~1 ms of Adult's ~19
        # CPU-ms an iteration
        low = scipy.linalg.cho_solve(self.schur, r[self.low] - self.eliminated_transpose @ top, check_finite=False)
        out[self.low] = low
        out[self.top] = self.top_inverse @ top - self.eliminated @ low
        return out


@dataclass(frozen=True, eq=False)
class LocalPolytope:
    """The projection's data (module docstring), built once per plan (:func:`local_polytope`).

    ``cliques`` (schema order), ``clique_start`` (cliques + 1,) each clique's first row of
    ``constraint``; ``offsets`` (blocks + 1,) block ``b``'s coordinates ``u[offsets[b]:offsets[b
    + 1]]`` in ``model.blocks`` order; ``constraint`` ``A`` (sum_C |C| x sum_b k_b, rows of unit
    norm) and ``constraint_transpose`` ``A^T`` (CSR too: a product with the transpose of a CSR
    matrix is a scatter, 2.9x the time of this one on Adult), ``scale`` the rows' norms before
    scaling (a cell's noise standard deviation): ``mu = scale * (A u)``; ``metric`` ``Q^T Q`` (``Q`` itself is not kept), ``rho`` and
    ``factor`` the solve with ``Q^T Q + rho A^T A`` (:class:`SchurFactor`).
    """

    cliques: tuple[tuple[str, ...], ...]
    clique_start: np.ndarray
    offsets: np.ndarray
    constraint: sp.csr_matrix
    constraint_transpose: sp.csr_matrix
    scale: np.ndarray
    metric: sp.csr_matrix
    rho: float
    factor: SchurFactor


def _clique_stack(model: MeasurementModel, clique: tuple[str, ...],
                  offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``S_C`` (rows: the coordinates of the blocks within ``clique``; columns: its cells,
    row-major) and those coordinates' indices into ``u``."""
    size_of = dict(zip(model.attributes, model.sizes))
    shape = [size_of[a] for a in clique]
    index = np.indices(shape).reshape(len(clique), -1)
    rows, coordinates = [], []
    for b, block in enumerate(model.blocks):
        if set(block.attributes) <= set(clique):
            keep = [j for j, a in enumerate(clique) if a in block.attributes]
            cell = (np.ravel_multi_index(tuple(index[keep]), tuple(shape[j] for j in keep)) if keep
                    else np.zeros(index.shape[1], dtype=np.int64))
            rows.append(block.whitened_basis[:, cell])
            coordinates.append(np.arange(offsets[b], offsets[b + 1]))
    return np.vstack(rows), np.concatenate(coordinates)


def is_residual(model: MeasurementModel, cliques: Sequence[tuple[str, ...]]) -> bool:
    """Whether every clique is spanned exactly by the blocks within it (as many basis rows as
    cells: a residual plan), without building anything."""
    size_of = dict(zip(model.attributes, model.sizes))
    for clique in cliques:
        rows = sum(b.rows for b in model.blocks if set(b.attributes) <= set(clique))
        if rows != math.prod(size_of[a] for a in clique):
            return False
    return bool(cliques)


def local_polytope_bytes(model: MeasurementModel, cliques: Sequence[tuple[str, ...]]) -> int:
    """The working memory of :func:`local_polytope` and :func:`solve`, estimated before anything
    is built: :data:`NONZERO_COPIES` copies (12 bytes a nonzero) of ``A``'s ``sum_C |C|^2``
    nonzeros, two of ``Q``'s ``sum_b m_b k_b`` and three dense copies of the Schur complement
    (:class:`SchurFactor`: the coordinates of the blocks that are not cliques, squared)."""
    size_of = dict(zip(model.attributes, model.sizes))
    a = sum(math.prod(size_of[x] for x in c) ** 2 for c in cliques)
    q = sum(b.recon.shape[0] * b.rows for b in model.blocks)
    low = sum(b.rows for b in model.blocks if b.attributes not in set(cliques))
    return 12 * (NONZERO_COPIES * a + 2 * q) + 3 * 8 * low ** 2


def local_polytope(model: MeasurementModel, cliques: Sequence[tuple[str, ...]]) -> LocalPolytope:
    """The projection's data for ``model``'s measured ``cliques`` (module docstring). ValueError
    when a clique is not spanned exactly by the blocks within it (not a residual plan:
    :func:`is_residual`)."""
    offsets = np.concatenate([[0], np.cumsum([b.rows for b in model.blocks])]).astype(np.int64)
    rows, cols, vals, scales, starts, gram_blocks = [], [], [], [], [0], []
    for clique in cliques:
        stack, coordinates = _clique_stack(model, clique, offsets)
        if stack.shape[0] != stack.shape[1]:
            raise ValueError(f"plan: the blocks within ({', '.join(clique)}) have {stack.shape[0]} rows for "
                             f"{stack.shape[1]} cells; the local polytope needs a residual plan")
        inverse = np.linalg.inv(stack)
        norms = np.linalg.norm(inverse, axis=1)
        scaled = inverse / norms[:, None]
        n = inverse.shape[0]
        rows.append(np.repeat(np.arange(starts[-1], starts[-1] + n, dtype=np.int32), n))
        cols.append(np.tile(coordinates.astype(np.int32), n))
        vals.append(scaled.reshape(-1))
        # A's rows of this clique touch only its coordinates: A^T A = sum_C A_C^T A_C, each dense
        gram_blocks.append((coordinates, scaled.T @ scaled))
        scales.append(norms)
        starts.append(starts[-1] + n)
    coordinates_total = int(offsets[-1])
    # int32 indices and no copy kept of the pieces: Adult's estimate runs under a 4 GiB
    # address-space cap, of which the command's imports take 3.3 GiB
    a = sp.csr_matrix((np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))),
                      shape=(starts[-1], coordinates_total))
    del rows, cols, vals
    scale = np.concatenate(scales)
    gram = _sum_of_dense_blocks(gram_blocks, coordinates_total)
    del gram_blocks
    metric = _metric(model, offsets)
    rho = RHO_SCALE * float(metric.diagonal().sum() / gram.diagonal().sum())
    h = metric + rho * gram
    del gram
    top = np.zeros(coordinates_total, dtype=bool)
    for b, block in enumerate(model.blocks):
        top[offsets[b]:offsets[b + 1]] = block.attributes in set(cliques)
    factor = SchurFactor.of(sp.csr_matrix(h), top, offsets)
    del h
    return LocalPolytope(cliques=tuple(cliques), clique_start=np.asarray(starts, dtype=np.int64), offsets=offsets,
                         constraint=a, constraint_transpose=a.T.tocsr(), scale=scale, metric=metric, rho=rho,
                         factor=factor)


def _sum_of_dense_blocks(blocks: Sequence[tuple[np.ndarray, np.ndarray]], n: int) -> sp.csr_matrix:
    """``sum_i E_i D_i E_i^T`` (n x n, CSR): each dense ``D_i`` (k_i x k_i) placed on the rows
    and columns ``index_i`` (k_i distinct indices), overlapping entries added."""
    if not blocks:
        return sp.csr_matrix((n, n))
    rows = np.concatenate([np.repeat(index.astype(np.int32), index.size) for index, _ in blocks])
    cols = np.concatenate([np.tile(index.astype(np.int32), index.size) for index, _ in blocks])
    vals = np.concatenate([dense.reshape(-1) for _, dense in blocks])
    return sp.csr_matrix((vals, (rows, cols)), shape=(n, n))


def _metric(model: MeasurementModel, offsets: np.ndarray) -> sp.csr_matrix:
    """``Q^T Q`` (coordinates x coordinates, CSR), ``Q`` block ``b``'s rows ``L_b C_b`` summed by
    ``query_index``: the sum over groups of queries of ``Q_G^T Q_G``, ``Q_G`` the group's rows
    dense on the coordinates they touch. Any partition of the queries gives the same sum; queries
    are grouped by the blocks that answer them (a hash of that set), so each ``Q_G`` is dense: a
    sparse ``Q^T Q`` took 5.4 s of Adult's estimate, these products 1 s."""
    q_rows, q_cols, q_vals = [], [], []
    for b, block in enumerate(model.blocks):
        # L_b C_b: the answers of block b from its whitened coordinates (y_b = C_b u_b)
        answers = block.recon @ np.linalg.inv(block.whitener)
        q_rows.append(np.repeat(block.query_index.astype(np.int32), answers.shape[1]))
        q_cols.append(np.tile(np.arange(offsets[b], offsets[b + 1], dtype=np.int32), answers.shape[0]))
        q_vals.append(answers.reshape(-1))
    q = sp.csr_matrix((np.concatenate(q_vals), (np.concatenate(q_rows), np.concatenate(q_cols))),
                      shape=(model.num_queries, int(offsets[-1])))
    del q_rows, q_cols, q_vals
    # a query's answering blocks as a sum of fixed random 64-bit words (wrapping): equal sets,
    # equal sums; a collision only puts two sets in one group (still exact, a little less sparse)
    words = np.random.default_rng(0).integers(0, 2**63, size=len(model.blocks), dtype=np.uint64)
    signature = np.zeros(model.num_queries, dtype=np.uint64)
    np.add.at(signature, np.concatenate([b.query_index for b in model.blocks]),
              np.repeat(words, [b.query_index.size for b in model.blocks]))
    _, group = np.unique(signature, return_inverse=True)
    order = np.argsort(group, kind="stable")
    products = []
    for queries in np.split(order, np.flatnonzero(np.diff(group[order])) + 1):
        rows = q[queries]
        touched = np.unique(rows.indices)
        dense = rows[:, touched].toarray()
        products.append((touched, dense.T @ dense))
    return _sum_of_dense_blocks(products, int(offsets[-1]))


@dataclass(frozen=True, eq=False)
class AdmmState:
    """Everything the next batch of :func:`solve`'s iterations reads, after ``done`` iterations:
    ``u`` (sum_b k_b, n) the primal coordinates, ``z`` (sum_C |C|, n) the nonnegative split
    variable and ``lam`` (sum_C |C|, n) the scaled dual, ``previous`` (n,) each unit's objective
    at the last check (``inf`` before the first), ``active`` (n,) the units not yet frozen.
    Nothing adapts besides: ``rho`` and :data:`ALPHA` are fixed, the factor a function of the
    plan. All of it is a function of the release (the whitened measurements), never of the
    data."""

    done: int
    u: np.ndarray
    z: np.ndarray
    lam: np.ndarray
    previous: np.ndarray
    active: np.ndarray


@dataclass(frozen=True, eq=False)
class StateInputs:
    """What the iterations depend on besides :class:`AdmmState` (:func:`state_inputs`):
    ``claims`` the scalars (JSON), ``arrays`` the arrays, by name."""

    claims: Mapping[str, Any]
    arrays: Mapping[str, np.ndarray]


class Checkpoints(Protocol):
    """Where :func:`solve` finds and saves its state (:class:`AdmmState`). ``load(inputs)`` is
    called once, first: the state saved from the same ``inputs`` (:class:`StateInputs`), or
    None to start from the beginning. ``save(state)`` is called after every check (the last
    one's state, every unit frozen or the iterations spent, resumes to the result at once), with
    the solver's live arrays: it must copy or write them before it returns
    (they change in place with the next iteration), and may skip any call (its cadence is its
    own)."""

    def load(self, inputs: StateInputs) -> AdmmState | None: ...

    def save(self, state: AdmmState) -> None: ...


def state_inputs(problem: LocalPolytope, white: np.ndarray, iterations: int, negativity: float,
                 tolerance: float) -> StateInputs:
    """What a saved :class:`AdmmState` must have been computed from to be continued: the
    whitened measurements ``white``, the constraint ``A`` and the metric ``Q^T Q`` (their
    nonzeros and structure), ``rho``, :data:`ALPHA`, :data:`CHECK_EVERY` and the stopping rule
    (``iterations``, ``negativity``, ``tolerance``). A state saved from other inputs is of
    other measurements, another plan or another solver."""
    arrays = {"white": np.asarray(white, dtype=np.float64)}
    for name, matrix in (("constraint", problem.constraint), ("metric", problem.metric)):
        arrays.update({f"{name}/data": matrix.data, f"{name}/indices": matrix.indices, f"{name}/indptr": matrix.indptr})
    claims = {"solver": "local-polytope-admm", "rho": float(problem.rho), "alpha": ALPHA, "check_every": CHECK_EVERY,
              "iterations": int(iterations), "negativity": float(negativity), "tolerance": float(tolerance),
              "shapes": {"white": list(white.shape), "constraint": list(problem.constraint.shape),
                         "metric": list(problem.metric.shape)}}
    return StateInputs(claims=claims, arrays=arrays)


def solve(problem: LocalPolytope, white: np.ndarray, *, iterations: int = ITERATIONS,
          negativity: float = NEGATIVITY, tolerance: float = TOLERANCE,
          progress: Callable[[int, int], None] | None = None,
          checkpoints: Checkpoints | None = None) -> tuple[np.ndarray, int, np.ndarray]:
    """``(u, iterations, converged)`` for ``white`` (sum_b k_b, n), every unit's whitened
    measurements in ``problem.offsets`` order: ADMM (module docstring), every unit at once,
    each frozen once it meets the stopping rule (``negativity``, ``tolerance``: the module's
    :data:`NEGATIVITY` and :data:`TOLERANCE` by default). ``progress(iterations, at most)`` after
    every :data:`CHECK_EVERY` iterations. ``checkpoints`` (:class:`Checkpoints`): the fit starts
    from the state it holds (continued bit for bit as the run that saved it would have) and
    offers it the state after every check (:func:`state_inputs` say which fits may continue it)."""
    a, a_t, rho = problem.constraint, problem.constraint_transpose, problem.rho
    white = np.asarray(white, dtype=np.float64)
    target = problem.metric @ white
    n = white.shape[1]
    state = None if checkpoints is None else checkpoints.load(
        state_inputs(problem, white, iterations, negativity, tolerance))
    if state is None:
        u = white.copy()
        z = np.maximum(a @ u, 0.0)
        lam = np.zeros_like(z)
        active = np.ones(n, dtype=bool)
        previous = np.full(n, np.inf)
        done = 0
    else:
        u, z, lam, previous = (np.array(x, dtype=np.float64) for x in (state.u, state.z, state.lam, state.previous))
        active, done = np.array(state.active, dtype=bool), int(state.done)
        if u.shape != white.shape or z.shape != (a.shape[0], n) or lam.shape != z.shape or \
                previous.shape != (n,) or active.shape != (n,):
            raise ValueError("checkpoints: a saved ADMM state of other shapes than the problem's")
    while done < iterations and active.any():
        cols = np.flatnonzero(active)
        uu, zz, ll, target_cols = u[:, cols], z[:, cols], lam[:, cols], target[:, cols]
        for _ in range(CHECK_EVERY):
            uu = problem.factor.solve(target_cols + rho * (a_t @ (zz - ll)))
            au = a @ uu
            relaxed = ALPHA * au + (1.0 - ALPHA) * zz
            zz = np.maximum(relaxed + ll, 0.0)
            ll += relaxed - zz
        u[:, cols], z[:, cols], lam[:, cols] = uu, zz, ll
        done += CHECK_EVERY
        residual = uu - white[:, cols]
        value = 0.5 * np.einsum("ij,ij->j", residual, problem.metric @ residual)
        settled = (np.abs(previous[cols] - value) <= tolerance * np.maximum(value, 1.0)) & \
                  (au.min(axis=0) >= -negativity)  # au = a @ uu of the last step
        previous[cols] = value
        active[cols[settled]] = False
        if progress is not None:
            progress(done, iterations)
        if checkpoints is not None:  # the last state too: a kill in the post-processing keeps the fit
            checkpoints.save(AdmmState(done=done, u=u, z=z, lam=lam, previous=previous, active=active))
    return u, done, ~active


def tables(problem: LocalPolytope, u: np.ndarray) -> np.ndarray:
    """The published clique tables ``max(scale * (A u), 0)`` (sum_C |C|, n), cliques in
    ``problem.cliques`` order, each row-major."""
    return np.maximum(problem.scale[:, None] * (problem.constraint @ u), 0.0)

