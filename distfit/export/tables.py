"""What an export table holds: query labels in words, standard errors, margins of error, rows (pure numpy).

docs/export.md is the reference (the columns, where each standard error comes from and why it
is exact). In short, one row per unit and query of a query group (a *table*):

- ``query``: the query in words, from the spec the plan stores (:func:`table_layouts`): each
  attribute's part (:func:`attribute_words`) joined by ``", "`` - ``age 18 to 64, sex female``;
  value labels hold no ``,`` (the spec refuses them), so the parts split back unambiguously.
- ``se``: the standard error of the figure, where it is exactly known, else empty with the
  reason in ``se_note`` (:data:`NOTES`):

  * a raw answer of a release (``raw-answer``): the released answer of query ``j`` is its true
    answer plus Gaussian noise of variance ``v_j``, the plan's ``queries/variances`` (the sum of
    query ``j``'s rows of ``L_b (B_b x_b + z_b)``, ``z_b ~ N(0, Sigma_b)``,
    docs/design.md section 1), so ``se_j = sqrt(v_j)`` (:func:`raw_standard_errors`);
  * an estimate of the projection for a unit whose nonnegativity constraint is inactive
    (``linear-gls``: every cell of its ``x_hat`` positive and its solve converged): the KKT
    conditions with no active cell are ``H x_hat = g``, so ``W x_hat = W H^+ g``, the
    generalised least-squares estimate, linear in the answers with ``Var(g) = H`` and so
    ``Var(W x_hat) = W H^+ W^T`` (:func:`gls_standard_errors`; docs/export.md, "Standard errors");
  * a multi-level run's real-valued estimate (``linear-hierarchy``): the best linear unbiased
    estimate over the geography, linear in the release with the exact covariance ``P_u`` of
    each unit's table (:mod:`distfit.estimate.hierarchy`), so ``se = sqrt(w_q^T P_u w_q)``, per
    unit and query, stored with the estimate (``queries/variance_rows``, a row per class of units
    sharing it, by ``queries/variance_class``) and read from it;
  * a multi-level run's nonnegative tables (``--nonnegative``, ``unbiased-hierarchy``): the
    same stored ``se``, the unbiased estimate's that the tables were projected from
    (:func:`distfit.estimate.geography.nonnegative_top_down`);
  * anything else is not a linear function of the release, and no standard error is stated:
    a unit with an active constraint (``nonnegativity-active``), an unconverged solve
    (``not-converged``), integer tables (``integer-rounded``), a graphical model or top-down
    estimate (``nonlinear-method``), a workload too large for the dense covariance
    (``covariance-too-large``).
- ``moe90 = 1.645 se`` (:data:`MOE90_Z`), the 90% margin of error as the American Community
  Survey prints it: the Gaussian noise makes ``estimate +- moe90`` a 90% interval for the
  linear figures.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from distfit.mathematics.margins import MOE90_Z
from distfit.spec.model import AttributeQuery, AttributeSpec, PipelineSpec

__all__ = [
    "NOTES",
    "NOTE_TEXT",
    "TableLayout",
    "attribute_words",
    "gls_standard_errors",
    "group_words",
    "linear_units",
    "privacy_statement",
    "raw_standard_errors",
    "table_layouts",
    "table_rows",
]


#: The ``se_note`` codes, in the order of their dictionary indices (docs/export.md, "se_note").
NOTES = ("raw-answer", "linear-gls", "nonnegativity-active", "not-converged", "integer-rounded",
         "nonlinear-method", "covariance-too-large", "linear-hierarchy", "unbiased-hierarchy")

#: What each ``se_note`` code says (the data dictionary's words).
NOTE_TEXT = {
    "raw-answer": "a raw noisy answer of the release: se = sqrt(the plan's variance of the query), exact",
    "linear-gls": "the estimate equals the generalised least-squares estimate W H^+ g for this unit (no "
                  "nonnegativity constraint active, solve converged): se = sqrt(diag(W H^+ W^T)), exact for "
                  "that linear estimator",
    "nonnegativity-active": "a cell of this unit's table was held at 0 by the nonnegativity constraint: the "
                            "estimate is not a linear function of the release; no se stated",
    "not-converged": "this unit's solve did not meet its tolerance; no se stated",
    "integer-rounded": "integer estimates (--integer): rounding is not linear; no se stated",
    "nonlinear-method": "the estimate's method (a graphical model, or top-down geography) is not linear; no se stated",
    "covariance-too-large": "the workload is too large for the dense covariance W H^+ W^T; no se stated",
    "linear-hierarchy": "the best linear unbiased estimate over the geography (generalised least squares over "
                        "every level of a multi-level run): se = sqrt(w^T P w), P the exact covariance of the "
                        "unit's table, stored with the estimate; exact",
    "unbiased-hierarchy": "a nonnegative table (--nonnegative) projected from the best linear unbiased estimate over "
                          "the geography: se = sqrt(w^T P w) of that unbiased estimate, stored with the estimate, "
                          "exact for it; the nonnegative table is not linear in the release",
}


def attribute_words(name: str, query: AttributeQuery, values: Sequence[str]) -> tuple[str, ...]:
    """Each of ``query``'s rows on attribute ``name`` (value labels ``values``) in words, by kind
    (pipelines/README.md, "Query groups"): ``identity``/``select`` ``sex female``; ``total``
    ``sex all``; ``prefix`` row ``i`` ``age 0 to 3`` (values ``0 .. i``); ``ranges`` and
    ``all_ranges`` ``age 18 to 64`` (``age 18`` for a range of one value); ``matrix`` row ``r``
    ``race white or black`` where its weights are 0 or 1, else ``race 0.5*white + 2*black``."""
    n = len(values)

    def span(lo: int, hi: int) -> str:
        return f"{name} {values[lo]}" if lo == hi else f"{name} {values[lo]} to {values[hi]}"

    if query.kind == "identity":
        return tuple(f"{name} {value}" for value in values)
    if query.kind == "select":
        return tuple(f"{name} {values[i]}" for i in query.params)
    if query.kind == "total":
        return (f"{name} all",)
    if query.kind == "prefix":
        return tuple(span(0, i) for i in range(n))
    if query.kind == "all_ranges":
        lo, hi = np.triu_indices(n)
        return tuple(span(int(a), int(b)) for a, b in zip(lo, hi))
    if query.kind == "ranges":
        return tuple(span(int(a), int(b)) for a, b in query.params)
    words = []
    for row in np.asarray(query.matrix):
        used = np.flatnonzero(row)
        if np.all(row[used] == 1.0):
            words.append(f"{name} " + " or ".join(values[i] for i in used))
        else:
            words.append(f"{name} " + " + ".join(f"{row[i]:g}*{values[i]}" for i in used))
    return tuple(words)


def group_words(queries: Sequence[tuple[str, AttributeQuery]], attributes: Mapping[str, AttributeSpec]
                ) -> tuple[str, ...]:
    """Every query of a group (its per-attribute ``queries``, schema order) in words, in the
    group's row-major order (:attr:`distfit.spec.model.QueryGroupSpec.labels`' order): the
    attributes' words joined by ``", "``; ``total`` for the grand total."""
    if not queries:
        return ("total",)
    parts = [attribute_words(name, query, attributes[name].values) for name, query in queries]
    return tuple(", ".join(words) for words in itertools.product(*parts))


@dataclass(frozen=True)
class TableLayout:
    """One query group as an export table: its ``name``, its columns ``start:stop`` of the
    store's (units x m) answers or estimates, and its queries in ``words``."""

    name: str
    start: int
    stop: int
    words: tuple[str, ...]

    @property
    def width(self) -> int:
        return self.stop - self.start


def table_layouts(spec: PipelineSpec, queries: int, labels: Sequence[str] | None = None) -> tuple[TableLayout, ...]:
    """The tables of ``spec`` (its groups, in order: the columns of every store are the groups'
    queries in spec order) over a store of ``queries`` columns. ValueError when the spec's
    queries are not the store's: another count, or, given the store's ``labels``
    (``GROUP:LABEL``), another label at some column."""
    if spec.num_queries != queries:
        raise ValueError(f"the plan's spec has {spec.num_queries} queries, but the store has {queries}")
    if labels is not None and tuple(labels) != spec.query_labels:
        column = next(j for j, (a, b) in enumerate(zip(labels, spec.query_labels)) if a != b)
        raise ValueError(f"query {column}: the store's label {labels[column]!r} is not the plan's spec's "
                         f"{spec.query_labels[column]!r}")
    attributes = {attribute.name: attribute for attribute in spec.attributes}
    out, start = [], 0
    for group in spec.groups:
        stop = start + group.num_queries
        out.append(TableLayout(group.name, start, stop, group_words(group.queries, attributes)))
        start = stop
    return tuple(out)


def raw_standard_errors(variances: np.ndarray) -> np.ndarray:
    """The standard error of every raw answer of a release: ``sqrt(v_j)``, ``v_j`` the plan's
    variance of query ``j`` (module docstring)."""
    variances = np.asarray(variances, dtype=np.float64)
    if variances.ndim != 1 or not np.all(np.isfinite(variances)) or np.any(variances < 0):
        raise ValueError("queries/variances: expected finite variances >= 0")
    return np.sqrt(variances)


def gls_standard_errors(workload: np.ndarray, hessian: np.ndarray, cutoff: float = 1e-10) -> np.ndarray:
    """``sqrt(diag(W H^+ W^T))``: the standard error of each query's generalised least-squares
    estimate ``W H^+ g`` (module docstring), ``W`` (m x cells) the workload, ``H`` (cells x cells)
    the projection's information ``sum_b M_b^T B_b^T Sigma_b^-1 B_b M_b``. ``H^+`` by its
    eigendecomposition, eigenvalues below ``cutoff`` times the largest dropped (a singular ``H``:
    the blocks do not determine every cell; ``W``'s rows lie in ``H``'s row space, so ``W H^+ g``
    is the unique estimate all the same). Computed as ``sum_k (W V)_jk^2 / lambda_k``: no m x m
    matrix."""
    w = np.asarray(workload, dtype=np.float64)
    eigenvalues, vectors = np.linalg.eigh(np.asarray(hessian, dtype=np.float64))
    keep = eigenvalues > cutoff * max(float(eigenvalues.max(initial=0.0)), np.finfo(float).tiny)
    projected = w @ vectors[:, keep]
    return np.sqrt(np.einsum("jk,jk,k->j", projected, projected, 1.0 / eigenvalues[keep]))


def linear_units(cells: np.ndarray, converged: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(linear, notes)`` of a run of units of a projection estimate: (units,) bool, the units
    whose estimate is the GLS estimate (module docstring: every cell of ``x_hat``, units x cells,
    above 0 and the solve converged), and (units,) int32 each unit's :data:`NOTES` index
    (``linear-gls``, ``not-converged`` or ``nonnegativity-active``). A cell of exactly 0 is one
    the constraint holds (an active cell); a free cell at exactly 0 has probability 0."""
    positive = (np.asarray(cells) > 0).all(axis=1)
    converged = np.asarray(converged) != 0
    notes = np.where(~converged, NOTES.index("not-converged"),
                     np.where(positive, NOTES.index("linear-gls"), NOTES.index("nonnegativity-active")))
    return positive & converged, notes.astype(np.int32)


def table_rows(values: np.ndarray, se: np.ndarray | None, linear: np.ndarray | None,
               notes: np.ndarray) -> dict[str, np.ndarray | None]:
    """The columns of one table's rows for a run of units (unit-major: each unit's queries in
    order), as numpy arrays: ``unit_index`` (the unit of each row, 0-based in the run),
    ``query_index`` (int32, the query of each row within the table: an index into its
    :attr:`TableLayout.words`), ``estimate`` (float64), ``se`` and ``moe90`` (float64, NaN where
    empty; None when no row states one), ``published`` (int64, or None: ``values`` not integer),
    ``note_index`` (int32, into :data:`NOTES`). ``values`` (units x the table's width), ``se``
    (its width,) the standard errors of the linear figures, the same for every unit, or (units
    x its width) each unit's (None: none), ``linear`` (units,) bool which units state them
    (None: all), ``notes`` (units,) each unit's note index."""
    units, width = values.shape
    estimate = values.astype(np.float64, copy=False).reshape(-1)
    errors = None
    if se is not None:
        errors = np.broadcast_to(np.asarray(se, dtype=np.float64), (units, width))
        if linear is not None:
            errors = np.where(linear[:, None], errors, np.nan)
        errors = np.ascontiguousarray(errors).reshape(-1)
    published = values.reshape(-1) if values.dtype.kind in "iu" else None
    return {
        "unit_index": np.repeat(np.arange(units, dtype=np.int64), width),
        "query_index": np.tile(np.arange(width, dtype=np.int32), units),
        "estimate": estimate,
        "se": errors,
        "moe90": None if errors is None else MOE90_Z * errors,
        "published": None if published is None else published.astype(np.int64, copy=False),
        "note_index": np.repeat(np.asarray(notes, dtype=np.int32), width),
    }


def privacy_statement(plan_attrs: Mapping[str, Any], private: bool | None = None) -> list[str]:
    """The privacy guarantee a plan states, as lines of text: zCDP ``rho`` (and ``alpha``), its
    composition, and the exact ``(epsilon, delta)`` of its account
    (:mod:`distfit.mathematics.privacy`, docs/privacy.md); ``private`` False (a release drawn
    with a fixed ``--seed``): the figures are NOT private."""
    lines = []
    rho, alpha = plan_attrs.get("rho"), plan_attrs.get("alpha")
    if rho is not None:
        lines.append(f"rho-zCDP with rho = {float(rho):.6g} (alpha = 2 rho = {float(alpha):.6g}), "
                     f"per unit: {plan_attrs.get('composition', 'see the plan')}")
    for entry in (plan_attrs.get("account") or {}).get("epsilon_delta", []):
        lines.append(f"(epsilon, delta)-DP with epsilon = {float(entry['epsilon']):.6g} at delta = "
                     f"{float(entry['delta']):.0e} (exact, from the plan's privacy profile)")
    if private is False:
        lines.append("NOT PRIVATE: the release was drawn with a fixed --seed (for tests only); the guarantee "
                     "above holds only for a release drawn with fresh entropy")
    return lines
